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
 * them as gzip, so the fuzzer reaches the gzip paths by content alone. */
#include <stddef.h>
#include <stdint.h>

#include "fuzz_dataset.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 4) return 0;
  size_t len = size - 4;
  size_t split = ((size_t)data[0] | (size_t)data[1] << 8) % (len + 1);
  int train = data[2] & 1;
  size_t limit = data[2] >> 1;
  const uint8_t *payload = data + 4;
  fuzz_write(train ? "train-images-idx3-ubyte" : "t10k-images-idx3-ubyte", payload, split);
  fuzz_write(train ? "train-labels-idx1-ubyte" : "t10k-labels-idx1-ubyte", payload + split,
             len - split);
  fuzz_open_dataset(AMPC_DATASET_FASHION_MNIST, train, limit, data[3], 1 + (data[3] & 3));
  return 0;
}
