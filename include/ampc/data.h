/*
 * data.h -- datasets (MNIST, Fashion-MNIST, CIFAR-10, CIFAR-100) and the batch loader.
 *
 * A dataset is read whole into memory once: uint8 images (N, C, H, W) and
 * int32 labels (N). A loader walks it in batches, in an order that is a pure
 * function of (seed, epoch), and writes each batch as x (B, C, H, W) in f32,
 * f16 or bf16 (pixel/255, then optionally (v - mean_c) / std_c) and y (B)
 * int32. Random crop and horizontal flip draw their numbers from (seed,
 * epoch, position in the epoch), so a run is the same bit for bit with or
 * without the background thread, and resuming at a batch index gives the
 * batches a full pass would have given.
 *
 *     ampc_dataset *ds;
 *     if (ampc_dataset_open(&ds, AMPC_DATASET_CIFAR10, NULL, 1, 0) < 0)
 *         fprintf(stderr, "error: %s\n", ampc_last_error());
 *     ampc_loader_opts o;
 *     ampc_loader_opts_default(&o);
 *     o.random_crop_padding = 4; o.hflip = 1;
 *     ampc_loader *ld;
 *     ampc_loader_create(&ld, ds, &o);
 *     float *x = malloc(sizeof(float) * o.batch_size * 3 * 32 * 32);
 *     int32_t *y = malloc(sizeof(int32_t) * o.batch_size);
 *     for (int64_t epoch = 0; epoch < 10; epoch++) {
 *         ampc_loader_start_epoch(ld, epoch, 0);
 *         int n;
 *         while (ampc_loader_next(ld, x, y, &n) == 0 && n > 0) { ... }
 *     }
 *     ampc_loader_free(ld);     // before the dataset it reads
 *     ampc_dataset_free(ds);
 *
 * Files: MNIST / Fashion-MNIST are the IDX files train-images-idx3-ubyte,
 * train-labels-idx1-ubyte, t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte,
 * each either plain or with ".gz". CIFAR-10 is the "binary version":
 * data_batch_1.bin .. data_batch_5.bin and test_batch.bin (records of 1
 * label byte + 3072 pixel bytes, R, G, B planes of 32x32). CIFAR-100 is
 * train.bin / test.bin (coarse label byte, fine label byte, 3072 pixel
 * bytes); the fine label (100 classes) is used.
 */
#ifndef AMPC_DATA_H
#define AMPC_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "ampc/dtype.h"
#include "ampc/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  AMPC_DATASET_MNIST = 0,
  AMPC_DATASET_FASHION_MNIST,
  AMPC_DATASET_CIFAR10,
  AMPC_DATASET_CIFAR100,
  AMPC_DATASET_COUNT
} ampc_dataset_kind;

/* Parses "mnist", "fashion-mnist" (also "fmnist", "fashion_mnist"),
 * "cifar10", "cifar100" (also "cifar-10", "cifar-100"); case-insensitive. */
ampc_status ampc_dataset_kind_parse(const char *name, ampc_dataset_kind *out);
/* The canonical name: "mnist", "fashion-mnist", "cifar10", "cifar100". */
const char *ampc_dataset_kind_name(ampc_dataset_kind k);
/* Where ampc_dataset_open looks when dir is NULL: /usr/share/datasets/mnist,
 * /usr/share/datasets/fashion-mnist, data/cifar-10-batches-bin,
 * data/cifar-100-binary (the last two relative to the working directory). */
const char *ampc_dataset_default_dir(ampc_dataset_kind k);
/* The i-th name (from 0) of the files a split may be read from, in its
 * directory: IDX files with and without ".gz", CIFAR's batches; NULL past the
 * last (and for an unknown kind). For a program that must not write over
 * the data it reads. */
const char *ampc_dataset_file_name(ampc_dataset_kind k, int train, int i);

typedef struct ampc_dataset ampc_dataset;

/* Reads the training (train = 1) or test split from dir (NULL: the default
 * directory). limit > 0 keeps only the first limit samples and reads no more
 * of the files than that needs; 0 keeps all. Files are checked: a missing
 * file is AMPC_ENOTFOUND; a bad header, truncated or over-long data, a corrupt
 * gzip stream, an image/label count mismatch or a label out of range is
 * AMPC_EFORMAT; each with a message naming the file. A CIFAR file may hold
 * fewer whole records than the published one (a subset, or test data made
 * up); a record cut short is truncation. */
ampc_status ampc_dataset_open(ampc_dataset **out, ampc_dataset_kind kind, const char *dir,
                              int train, size_t limit);
void ampc_dataset_free(ampc_dataset *d);

/* What a split holds, from its headers (IDX) or file sizes (CIFAR) alone. */
typedef struct {
  ampc_dataset_kind kind;
  int train;                      /* 1: the training split, 0: the test split */
  size_t count;                   /* samples, after the limit */
  int channels, height, width, classes;
  char images[4096];              /* the file the image shape comes from, for messages */
} ampc_dataset_info;

/* Opens the split's files and checks everything ampc_dataset_open checks
 * before it reads the data (presence, regular files, headers, sizes), without
 * reading or allocating for the data; the same errors. */
ampc_status ampc_dataset_probe(ampc_dataset_info *out, ampc_dataset_kind kind, const char *dir,
                               int train, size_t limit);
/* A model is sized from the training split, so the test split must have the
 * same image shape (C x H x W) and classes: AMPC_EINVAL otherwise, with a
 * message naming both files and both shapes. */
ampc_status ampc_dataset_check_pair(const ampc_dataset_info *train, const ampc_dataset_info *test);

/* The getters below read a NULL d as an empty dataset: kind -1 (named
 * "unknown"), count and sizes 0, NULL arrays, and norm() mean 0, std 1. */
ampc_dataset_kind ampc_dataset_get_kind(const ampc_dataset *d);
size_t ampc_dataset_count(const ampc_dataset *d);
int ampc_dataset_channels(const ampc_dataset *d);
int ampc_dataset_height(const ampc_dataset *d);
int ampc_dataset_width(const ampc_dataset *d);
int ampc_dataset_classes(const ampc_dataset *d);
/* (N, C, H, W) uint8, and (N) int32 in [0, classes). */
const uint8_t *ampc_dataset_images(const ampc_dataset *d);
const int32_t *ampc_dataset_labels(const ampc_dataset *d);
/* Per-channel mean and std of pixel/255 used for normalisation: the
 * standard published values (MNIST 0.1307/0.3081, Fashion-MNIST
 * 0.2860/0.3530, CIFAR-10 (0.4914, 0.4822, 0.4465)/(0.2470, 0.2435, 0.2616),
 * CIFAR-100 (0.5071, 0.4865, 0.4409)/(0.2673, 0.2564, 0.2762)). Entries past
 * the dataset's channels are mean 0, std 1. */
void ampc_dataset_norm(const ampc_dataset *d, float mean[3], float std[3]);

/* What a model's input x is, made from a dataset's images, so that another
 * framework (or a later run) can feed a model the same: per channel c,
 * x = (pixel / 255 - mean[c]) / std[c] when normalize, else pixel / 255,
 * shaped (N, channels, height, width). Checkpoints record it (checkpoint.h)
 * and `ampc export` copies it into the exported file's metadata. */
typedef struct {
  char dataset[32];            /* "fashion-mnist", "cifar10", ...; "" when unknown */
  int normalize;               /* 1: mean/std applied; 0: pixel / 255 only */
  int channels, height, width; /* of one image */
  float mean[3], std[3];       /* per channel; 0 and 1 without normalize and past `channels` */
} ampc_preprocessing;

/* The preprocessing the loader applies to d with ampc_loader_opts.normalize
 * = normalize (augmentation aside: random crops and flips are training-time
 * only). */
void ampc_dataset_preprocessing(const ampc_dataset *d, int normalize, ampc_preprocessing *out);

/* p as the JSON object checkpoints record ({"dataset", "normalize",
 * "shape": [C, H, W], "mean", "std", "formula"}), for a weights file's
 * metadata; a string the caller frees with free(), NULL when out of memory. */
char *ampc_preprocessing_json(const ampc_preprocessing *p);
/* The inverse: a record as ampc_preprocessing_json writes it into *out, every
 * entry checked (1..3 channels, positive sizes, one finite mean and one std
 * in 1e-6..1e6 per channel); AMPC_EFORMAT naming the entry otherwise. */
ampc_status ampc_preprocessing_parse(const char *json, ampc_preprocessing *out);

typedef struct {
  int batch_size;          /* B, 1..65536 */
  int shuffle;             /* 1: a new permutation every epoch; 0: file order */
  uint64_t seed;           /* shuffle and augmentation both derive from it */
  int drop_last;           /* 1: skip the last batch if it has fewer than B samples */
  int normalize;           /* 1: (pixel/255 - mean_c) / std_c; 0: pixel/255 */
  int random_crop_padding; /* P: pad by P with black and crop back at a random offset in
                              [0, 2P] per axis, as torchvision RandomCrop(H, padding=P); 0 off;
                              at most 64 */
  int hflip;               /* 1: mirror left-right with probability 1/2 (after the crop) */
  ampc_dtype dtype;        /* of x: f32, f16 or bf16 */
  int background;          /* 1: prepare the next batches on a thread while the caller works */
  /* Data-parallel training (the distributed sampler): world_size ranks (0
   * or 1: one; at most 2^20) each take batch_size samples of every global batch of
   * world_size * batch_size -- rank r the r-th slice of it, so that the N
   * ranks' batch k together is one process's batch k at batch_size N * B,
   * sample for sample (augmentation included). A last global batch of
   * fewer samples is cut into world_size slices as equal as they can be
   * (some may be empty). */
  int rank, world_size;
} ampc_loader_opts;

/* batch 128, shuffle 1, seed 0, drop_last 0, normalize 1, no augmentation,
 * f32, background 1, rank 0 of 1. A NULL o is a no-op. */
void ampc_loader_opts_default(ampc_loader_opts *o);

typedef struct ampc_loader ampc_loader;

/* The loader reads d (which must outlive it) and copies o. One thread at a
 * time calls a given loader. */
ampc_status ampc_loader_create(ampc_loader **out, const ampc_dataset *d,
                               const ampc_loader_opts *o);
/* Stops the background thread (also mid-epoch) and frees. */
void ampc_loader_free(ampc_loader *l);

/* Begins epoch (>= 0) at batch start_batch (0 .. batches_per_epoch): the
 * order is a pure function of (seed, epoch), so starting at k gives the
 * batches k, k+1, ... that a full pass would have given. May be called at any
 * time; it abandons what was prefetched. */
ampc_status ampc_loader_start_epoch(ampc_loader *l, int64_t epoch, int64_t start_batch);
/* Fills x (batch_size * C * H * W elements of opts.dtype, NCHW) and y
 * (batch_size int32) with the next batch and sets *n to the samples in it
 * (less than batch_size only for the last batch when !drop_last; the rest of
 * x and y is zeroed). At the end of the epoch returns 0 with *n = 0 (with
 * several ranks a rank's slice of the last batch may be empty too: count
 * the batches_per_epoch).
 * AMPC_ESTATE before the first ampc_loader_start_epoch. */
ampc_status ampc_loader_next(ampc_loader *l, void *x, int32_t *y, int *n);

/* The dataset index of every sample of epoch `epoch` in the order the loader
 * yields them (out: as many as the dataset holds), without touching the
 * loader's position: what another framework needs to replay the same batches. */
ampc_status ampc_loader_epoch_order(const ampc_loader *l, int64_t epoch, size_t *out);

/* For a NULL l: 0 batches, position 0, epoch -1, no samples. */
int64_t ampc_loader_batches_per_epoch(const ampc_loader *l);
/* The samples of (global) batch k of an epoch over all the ranks: the
 * divisor of the global mean. */
int64_t ampc_loader_global_samples(const ampc_loader *l, int64_t k);
/* The index of the batch the next ampc_loader_next returns. */
int64_t ampc_loader_position(const ampc_loader *l);
/* The current epoch (-1 before the first ampc_loader_start_epoch). */
int64_t ampc_loader_epoch(const ampc_loader *l);

#ifdef __cplusplus
}
#endif
#endif
