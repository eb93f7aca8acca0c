/* libFuzzer target: the IDX reader (MNIST / Fashion-MNIST), through
 * ampc_dataset_open on a folder holding an images file and a labels file.
 *
 * Input layout:
 *   [0..1]  split point S (little-endian u16): the images file gets the first
 *           S % (len + 1) bytes of the payload, the labels file the rest
 *   [2]     bit 0: train (train-*) or test (t10k-*) names;
 *           bits 1-7: limit (0: all samples)
 *   [3]     loader options (see fuzz_dataset.h)
 *   [4..]   payload
 * Files are written under their plain names; zlib reads a gzip stream in
 * them as gzip, so the fuzzer reaches the gzip paths by content alone.
 *
 * The reader allocates what the images header claims (up to 2 GiB of pixels
 * and 8 GiB of labels) before it finds the file short. That is cheap in a
 * normal build (calloc is lazy) but not under ASan, whose shadow makes each
 * such input cost seconds and a GiB; so a plain header claiming more than
 * FUZZ_MAX_CLAIM bytes is read with a limit that keeps the allocation below
 * it (the truncation checks still run), or skipped if even one image is too
 * big. */
#include <stddef.h>
#include <stdint.h>

#include "fuzz_dataset.h"

#define FUZZ_MAX_CLAIM (16u << 20)

static uint32_t be32(const uint8_t *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 4) return 0;
  size_t len = size - 4;
  size_t split = ((size_t)data[0] | (size_t)data[1] << 8) % (len + 1);
  int train = data[2] & 1;
  size_t limit = data[2] >> 1;
  const uint8_t *payload = data + 4;
  if (split >= 16) {
    /* n images of h x w take n * (h * w + 4) bytes with their labels. */
    uint64_t n = be32(payload + 4), hw = (uint64_t)be32(payload + 8) * be32(payload + 12);
    if (hw + 4 > FUZZ_MAX_CLAIM) return 0;
    uint64_t fit = FUZZ_MAX_CLAIM / (hw + 4);
    if (n > fit && (limit == 0 || limit > fit)) limit = (size_t)fit;
  }
  fuzz_write(train ? "train-images-idx3-ubyte" : "t10k-images-idx3-ubyte", payload, split);
  fuzz_write(train ? "train-labels-idx1-ubyte" : "t10k-labels-idx1-ubyte", payload + split,
             len - split);
  fuzz_open_dataset(AMPC_DATASET_FASHION_MNIST, train, limit, data[3], 1 + (data[3] & 3));
  return 0;
}
