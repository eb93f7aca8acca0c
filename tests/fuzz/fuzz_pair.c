/* libFuzzer target: the agreement of a training and a test set (issue 11,
 * class 1), through ampc_dataset_probe and ampc_dataset_check_pair on a
 * folder of IDX files whose headers come from the input.
 *
 * Input layout:
 *   [0..15]  train-images-idx3-ubyte header (magic, N, H, W; big-endian u32)
 *   [16..23] train-labels-idx1-ubyte header (magic, N)
 *   [24..39] t10k-images-idx3-ubyte header
 *   [40..47] t10k-labels-idx1-ubyte header
 *   [48]     bit 0: gzip the test images; bit 1: cut the train images' data
 *            short by one byte; bit 2: the same for the test images; bits 3-7:
 *            the test limit (0: all)
 *   [49]     loader options (see fuzz_dataset.h); bits 0-1 + 1: batch
 *   [50..]   label bytes (cycled) for both labels files; none: 0..9
 * Each file gets its header and then as much data as the header declares
 * (pixels of a fixed pattern), so the fuzzer explores shapes, not padding.
 *
 * Checked: the probe of each split agrees with what ampc_dataset_open reads;
 * when check_pair passes, the two splits' images have the same shape and
 * classes, and the test set is fed through a loader into a batch buffer
 * sized from the *training* set's shape -- which ASan would catch
 * overflowing if a larger test image ever got past the check (the heap
 * overflow of issue 11); when it fails, the shapes differ and the one-line
 * message names both files. Headers that claim more than FUZZ_MAX_CLAIM
 * bytes are skipped (writing the data is the cost, not the reader). */
#include <stddef.h>
#include <stdint.h>
#include <zlib.h>

#include "ampc/data.h"
#include "fuzz_common.h"

#define FUZZ_MAX_CLAIM (4u << 20)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint32_t be32(const uint8_t *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static uint8_t *buf;
static size_t buf_cap;

static uint8_t *scratch(size_t n) {
  if (n > buf_cap) {
    free(buf);
    buf = malloc(n);
    FUZZ_CHECK(buf != NULL);
    buf_cap = n;
  }
  return buf;
}

/* An images file: the 16 header bytes, then N*H*W pixels (less `cut`). */
static void write_images(const char *name, const uint8_t *hdr, size_t cut, int gzip) {
  uint64_t n = be32(hdr + 4), pixels = n * be32(hdr + 8) * be32(hdr + 12);
  if (pixels > FUZZ_MAX_CLAIM) pixels = 0; /* only the header: the reader reports it short */
  if (cut > pixels) cut = pixels;
  size_t len = 16 + (size_t)(pixels - cut);
  uint8_t *p = scratch(len + 64);
  memcpy(p, hdr, 16);
  for (size_t i = 16; i < len; i++) p[i] = (uint8_t)(i * 37 + 11);
  if (!gzip) {
    fuzz_write(name, p, len);
    return;
  }
  char path[512];
  snprintf(path, sizeof path, "%s/%s.gz", fuzz_dir(), name);
  gzFile g = gzopen(path, "wb1");
  FUZZ_CHECK(g != NULL);
  FUZZ_CHECK(len == 0 || gzwrite(g, p, (unsigned)len) == (int)len);
  FUZZ_CHECK(gzclose(g) == Z_OK);
}

/* A labels file: the 8 header bytes, then N labels from the input's tail. */
static void write_labels(const char *name, const uint8_t *hdr, const uint8_t *lab, size_t nlab) {
  uint64_t n = be32(hdr + 4);
  if (n > FUZZ_MAX_CLAIM) n = 0;
  uint8_t *p = scratch((size_t)n + 8);
  memcpy(p, hdr, 8);
  for (size_t i = 0; i < n; i++) p[8 + i] = nlab ? lab[i % nlab] : (uint8_t)(i % 10);
  fuzz_write(name, p, (size_t)n + 8);
}

static void check_probe(const ampc_dataset_info *i, const ampc_dataset *d) {
  FUZZ_CHECK(ampc_dataset_count(d) == i->count);
  FUZZ_CHECK(ampc_dataset_channels(d) == i->channels && ampc_dataset_height(d) == i->height &&
             ampc_dataset_width(d) == i->width && ampc_dataset_classes(d) == i->classes);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 50) return 0;
  const uint8_t *trh = data, *trl = data + 16, *teh = data + 24, *tel = data + 40;
  unsigned flags = data[48], lbits = data[49];
  /* the reader allocates what a sound header claims: keep that small */
  for (int k = 0; k < 2; k++) {
    const uint8_t *h = k ? teh : trh;
    if ((uint64_t)be32(h + 4) * be32(h + 8) * be32(h + 12) > FUZZ_MAX_CLAIM) return 0;
  }
  char path[512];
  snprintf(path, sizeof path, "%s/t10k-images-idx3-ubyte.gz", fuzz_dir());
  unlink(path);
  snprintf(path, sizeof path, "%s/t10k-images-idx3-ubyte", fuzz_dir());
  unlink(path);
  write_images("train-images-idx3-ubyte", trh, (flags >> 1) & 1, 0);
  write_images("t10k-images-idx3-ubyte", teh, (flags >> 2) & 1, flags & 1);
  write_labels("train-labels-idx1-ubyte", trl, data + 50, size - 50);
  write_labels("t10k-labels-idx1-ubyte", tel, data + 50, size - 50);
  size_t test_limit = flags >> 3;

  ampc_dataset_info tr, te;
  ampc_clear_error();
  if (ampc_dataset_probe(&tr, AMPC_DATASET_MNIST, fuzz_dir(), 1, 0) < 0 ||
      ampc_dataset_probe(&te, AMPC_DATASET_MNIST, fuzz_dir(), 0, test_limit) < 0) {
    const char *msg = ampc_last_error();
    FUZZ_CHECK(msg[0] != '\0' && strchr(msg, '\n') == NULL);
    return 0;
  }
  FUZZ_CHECK(tr.train == 1 && te.train == 0 && tr.count >= 1 && te.count >= 1);
  FUZZ_CHECK(te.count == (test_limit && test_limit < te.count ? test_limit : te.count));
  int same = tr.channels == te.channels && tr.height == te.height && tr.width == te.width &&
             tr.classes == te.classes;
  ampc_clear_error();
  ampc_status pair = ampc_dataset_check_pair(&tr, &te);
  if (pair < 0) {
    const char *msg = ampc_last_error();
    FUZZ_CHECK(!same);
    FUZZ_CHECK(strstr(msg, "train-images-idx3-ubyte") && strstr(msg, "t10k-images-idx3-ubyte"));
    FUZZ_CHECK(strchr(msg, '\n') == NULL);
    return 0;
  }
  FUZZ_CHECK(pair == AMPC_OK && same);

  /* what the CLI then does: read both, and run the test set through buffers of the training shape */
  ampc_dataset *dtr = NULL, *dte = NULL;
  if (ampc_dataset_open(&dtr, AMPC_DATASET_MNIST, fuzz_dir(), 1, 0) < 0 ||
      ampc_dataset_open(&dte, AMPC_DATASET_MNIST, fuzz_dir(), 0, test_limit) < 0) {
    /* the data itself can still be bad (short, labels out of range): not a shape question */
    FUZZ_CHECK(strchr(ampc_last_error(), '\n') == NULL);
    ampc_dataset_free(dtr);
    return 0;
  }
  check_probe(&tr, dtr);
  check_probe(&te, dte);
  int batch = 1 + (int)(lbits & 3);
  size_t elems = (size_t)tr.channels * (size_t)tr.height * (size_t)tr.width;
  ampc_loader_opts o;
  ampc_loader_opts_default(&o);
  o.batch_size = batch;
  o.background = 0;
  o.shuffle = (lbits >> 2) & 1;
  o.hflip = (lbits >> 3) & 1;
  o.random_crop_padding = (int)((lbits >> 4) & 3);
  o.normalize = (lbits >> 6) & 1;
  ampc_loader *ld = NULL;
  FUZZ_CHECK(ampc_loader_create(&ld, dte, &o) == AMPC_OK);
  float *x = malloc((size_t)batch * elems * sizeof *x); /* exactly the model's input (B, C, H, W) */
  int32_t *y = malloc((size_t)batch * sizeof *y);
  FUZZ_CHECK(x && y);
  FUZZ_CHECK(ampc_loader_start_epoch(ld, 0, 0) == AMPC_OK);
  for (int b = 0; b < 3; b++) {
    int got = -1;
    FUZZ_CHECK(ampc_loader_next(ld, x, y, &got) == AMPC_OK);
    if (got == 0) break;
    for (int i = 0; i < got; i++) FUZZ_CHECK(y[i] >= 0 && y[i] < tr.classes);
  }
  free(x);
  free(y);
  ampc_loader_free(ld);
  ampc_dataset_free(dtr);
  ampc_dataset_free(dte);
  return 0;
}
