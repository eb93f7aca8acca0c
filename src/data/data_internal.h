/* Internal: the dataset record shared by the readers, the loader and tests. */
#ifndef AMPC_DATA_DATA_INTERNAL_H
#define AMPC_DATA_DATA_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "ampc/data.h"

/* Image data this large or larger is taken for a corrupt file, not a
 * dataset: each reader refuses it before allocating. */
#define AMPC_DATASET_MAX_BYTES (1ull << 31)

struct ampc_dataset {
  ampc_dataset_kind kind;
  size_t n;
  int c, h, w, classes;
  uint8_t *images; /* (n, c, h, w) */
  int32_t *labels; /* (n) */
};

/* Allocates a dataset of n samples (images zeroed, labels 0) for a reader to
 * fill; tests use it to build synthetic datasets. n >= 1, c in 1..3. */
ampc_status ampc__dataset_alloc(ampc_dataset **out, ampc_dataset_kind kind, size_t n, int c,
                                int h, int w, int classes);

/* The readers: fill *out from dir; kind picks the file names, the record
 * layout and the message prefix ("cifar10: data_batch_3.bin: ..."). */
ampc_status ampc__idx_read(ampc_dataset **out, ampc_dataset_kind kind, const char *dir,
                           int train, size_t limit);
ampc_status ampc__cifar_read(ampc_dataset **out, ampc_dataset_kind kind, const char *dir,
                             int train, size_t limit);

/* The probes: ampc_dataset_probe for each reader (info's kind and train are
 * set by the caller). */
ampc_status ampc__idx_probe(ampc_dataset_info *info, ampc_dataset_kind kind, const char *dir,
                            int train, size_t limit);
ampc_status ampc__cifar_probe(ampc_dataset_info *info, ampc_dataset_kind kind, const char *dir,
                              int train, size_t limit);

/* The augmentation of the sample at position pos of epoch epoch: crop
 * offsets *oy, *ox in [0, 2 * padding] (0 if padding is 0) and *flip in
 * {0, 1} (0 unless hflip). A pure function of its arguments. */
void ampc__loader_aug_params(uint64_t seed, int64_t epoch, uint64_t pos, int padding,
                             int hflip, int *oy, int *ox, int *flip);

#endif
