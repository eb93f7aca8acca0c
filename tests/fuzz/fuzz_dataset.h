/* Shared by fuzz_idx and fuzz_cifar: opens the dataset the target wrote,
 * checks what ampc_dataset_open promises, and feeds a successful read through
 * a loader (the readers' output sizes the loader's buffers, so odd shapes such
 * as 1 x 4000 images belong to the same attack surface). */
#ifndef AMPC_FUZZ_DATASET_H
#define AMPC_FUZZ_DATASET_H

#include "ampc/data.h"
#include "fuzz_common.h"

/* Most batches one input drives through the loader: enough to reach the
 * last, short batch of a small dataset without making big ones slow. */
#define FUZZ_MAX_BATCHES 3

/* loader_bits: bits 0-1 dtype (f32, f16, bf16, f32), 2 shuffle, 3 hflip,
 * 4-5 random-crop padding 0..3, 6 normalize, 7 drop_last; batch 1..4. */
static void fuzz_open_dataset(ampc_dataset_kind kind, int train, size_t limit,
                              unsigned loader_bits, int batch) {
  ampc_dataset *ds = (ampc_dataset *)1;
  ampc_clear_error();
  ampc_status s = ampc_dataset_open(&ds, kind, fuzz_dir(), train, limit);
  if (s < 0) {
    /* A failure leaves *out NULL and one line of message for the CLI. */
    const char *msg = ampc_last_error();
    FUZZ_CHECK(ds == NULL);
    FUZZ_CHECK(msg[0] != '\0');
    FUZZ_CHECK(strchr(msg, '\n') == NULL);
    return;
  }
  FUZZ_CHECK(s == AMPC_OK && ds != NULL);
  size_t n = ampc_dataset_count(ds);
  int c = ampc_dataset_channels(ds), h = ampc_dataset_height(ds), w = ampc_dataset_width(ds);
  int classes = ampc_dataset_classes(ds);
  FUZZ_CHECK(n >= 1 && (limit == 0 || n <= limit));
  FUZZ_CHECK(c >= 1 && c <= 3 && h >= 1 && w >= 1 && classes >= 2);
  FUZZ_CHECK(ampc_dataset_get_kind(ds) == kind);
  const int32_t *labels = ampc_dataset_labels(ds);
  const uint8_t *images = ampc_dataset_images(ds);
  unsigned sum = 0;
  for (size_t i = 0; i < n; i++) FUZZ_CHECK(labels[i] >= 0 && labels[i] < classes);
  /* Touches every pixel, so ASan sees the whole (N, C, H, W) block. */
  size_t bytes = n * (size_t)c * (size_t)h * (size_t)w;
  for (size_t i = 0; i < bytes; i++) sum += images[i];
  (void)sum;

  static const ampc_dtype dtypes[4] = {AMPC_DTYPE_F32, AMPC_DTYPE_F16, AMPC_DTYPE_BF16,
                                       AMPC_DTYPE_F32};
  ampc_loader_opts o;
  ampc_loader_opts_default(&o);
  o.batch_size = batch;
  o.dtype = dtypes[loader_bits & 3];
  o.shuffle = (loader_bits >> 2) & 1;
  o.hflip = (loader_bits >> 3) & 1;
  o.random_crop_padding = (int)((loader_bits >> 4) & 3);
  o.normalize = (loader_bits >> 6) & 1;
  o.drop_last = (loader_bits >> 7) & 1;
  o.background = 0; /* one thread: a finding must reproduce from the input alone */
  o.seed = loader_bits;
  ampc_loader *ld = NULL;
  FUZZ_CHECK(ampc_loader_create(&ld, ds, &o) == AMPC_OK);
  size_t elems = (size_t)c * (size_t)h * (size_t)w;
  void *x = malloc((size_t)batch * elems * 4);
  int32_t *y = malloc((size_t)batch * sizeof *y);
  FUZZ_CHECK(x && y);
  FUZZ_CHECK(ampc_loader_start_epoch(ld, 1, 0) == AMPC_OK);
  for (int b = 0; b < FUZZ_MAX_BATCHES; b++) {
    int got = -1;
    FUZZ_CHECK(ampc_loader_next(ld, x, y, &got) == AMPC_OK);
    FUZZ_CHECK(got >= 0 && got <= batch);
    if (got == 0) break;
    for (int i = 0; i < got; i++) FUZZ_CHECK(y[i] >= 0 && y[i] < classes);
  }
  free(x);
  free(y);
  ampc_loader_free(ld);
  ampc_dataset_free(ds);
}

#endif
