/* Dataset kinds, the in-memory record and its accessors; the readers live in
 * idx.c and cifar.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/status_internal.h"
#include "data/data_internal.h"

typedef struct {
  const char *name;
  const char *dir;
  int channels;
  float mean[3], std[3];
} dataset_info;

/* Indexed by ampc_dataset_kind. The mean/std are the values published with
 * (and used by every reference recipe for) each dataset. */
static const dataset_info dataset_infos[AMPC_DATASET_COUNT] = {
    {"mnist", "/usr/share/datasets/mnist", 1, {0.1307f, 0.0f, 0.0f}, {0.3081f, 1.0f, 1.0f}},
    {"fashion-mnist", "/usr/share/datasets/fashion-mnist", 1, {0.2860f, 0.0f, 0.0f},
     {0.3530f, 1.0f, 1.0f}},
    {"cifar10", "data/cifar-10-batches-bin", 3, {0.4914f, 0.4822f, 0.4465f},
     {0.2470f, 0.2435f, 0.2616f}},
    {"cifar100", "data/cifar-100-binary", 3, {0.5071f, 0.4865f, 0.4409f},
     {0.2673f, 0.2564f, 0.2762f}},
};

static int kind_valid(ampc_dataset_kind k) { return (unsigned)k < AMPC_DATASET_COUNT; }

ampc_status ampc_dataset_kind_parse(const char *name, ampc_dataset_kind *out) {
  static const struct {
    const char *name;
    ampc_dataset_kind kind;
  } names[] = {
      {"mnist", AMPC_DATASET_MNIST},          {"fashion-mnist", AMPC_DATASET_FASHION_MNIST},
      {"fmnist", AMPC_DATASET_FASHION_MNIST}, {"fashion_mnist", AMPC_DATASET_FASHION_MNIST},
      {"cifar10", AMPC_DATASET_CIFAR10},      {"cifar-10", AMPC_DATASET_CIFAR10},
      {"cifar100", AMPC_DATASET_CIFAR100},    {"cifar-100", AMPC_DATASET_CIFAR100},
  };
  if (!name || !out) return ampc__error(AMPC_EINVAL, "dataset: name and out must not be NULL");
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    if (strcasecmp(name, names[i].name) == 0) {
      *out = names[i].kind;
      return AMPC_OK;
    }
  }
  return ampc__error(AMPC_EINVAL,
                     "dataset: unknown dataset \"%s\" (expected mnist, fashion-mnist, cifar10 "
                     "or cifar100)",
                     name);
}

const char *ampc_dataset_kind_name(ampc_dataset_kind k) {
  return kind_valid(k) ? dataset_infos[k].name : "unknown";
}

const char *ampc_dataset_default_dir(ampc_dataset_kind k) {
  return kind_valid(k) ? dataset_infos[k].dir : NULL;
}

const char *ampc_dataset_file_name(ampc_dataset_kind k, int train, int i) {
  static const char *const idx[2][4] = {
      {"t10k-images-idx3-ubyte", "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte", "t10k-labels-idx1-ubyte.gz"},
      {"train-images-idx3-ubyte", "train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte", "train-labels-idx1-ubyte.gz"}};
  static const char *const c10[2][5] = {
      {"test_batch.bin"}, {"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin", "data_batch_4.bin", "data_batch_5.bin"}};
  static const char *const c100[2][1] = {{"test.bin"}, {"train.bin"}};
  int t = train != 0;
  if (i < 0 || !kind_valid(k)) return NULL;
  if (k == AMPC_DATASET_MNIST || k == AMPC_DATASET_FASHION_MNIST) return i < 4 ? idx[t][i] : NULL;
  if (k == AMPC_DATASET_CIFAR10) return i < 5 ? c10[t][i] : NULL;
  return i < 1 ? c100[t][i] : NULL;
}

ampc_status ampc__dataset_alloc(ampc_dataset **out, ampc_dataset_kind kind, size_t n, int c,
                                int h, int w, int classes) {
  if (!out || !kind_valid(kind) || n < 1 || c < 1 || c > 3 || h < 1 || w < 1)
    return ampc__error(AMPC_EINVAL, "dataset: no dataset of %zu images of %dx%dx%d (kind %d)", n, c, h, w, (int)kind);
  size_t per = (size_t)c * (size_t)h * (size_t)w;
  if (n > SIZE_MAX / per / 2)
    return ampc__error(AMPC_ENOMEM, "%s: %zu images of %zu bytes do not fit in memory",
                       dataset_infos[kind].name, n, per);
  ampc_dataset *d = calloc(1, sizeof *d);
  if (!d) return ampc__error(AMPC_ENOMEM, "%s: out of memory", dataset_infos[kind].name);
  d->kind = kind;
  d->n = n;
  d->c = c;
  d->h = h;
  d->w = w;
  d->classes = classes;
  d->images = calloc(n, per);
  d->labels = calloc(n, sizeof *d->labels);
  if (!d->images || !d->labels) {
    ampc_dataset_free(d);
    return ampc__error(AMPC_ENOMEM, "%s: out of memory for %zu images of %zu bytes",
                       dataset_infos[kind].name, n, per);
  }
  *out = d;
  return AMPC_OK;
}

ampc_status ampc_dataset_open(ampc_dataset **out, ampc_dataset_kind kind, const char *dir,
                              int train, size_t limit) {
  if (!out) return ampc__error(AMPC_EINVAL, "dataset: out must not be NULL");
  *out = NULL;
  if (!kind_valid(kind)) return ampc__error(AMPC_EINVAL, "dataset: unknown kind %d", (int)kind);
  if (!dir) dir = dataset_infos[kind].dir;
  if (kind == AMPC_DATASET_MNIST || kind == AMPC_DATASET_FASHION_MNIST)
    return ampc__idx_read(out, kind, dir, train, limit);
  return ampc__cifar_read(out, kind, dir, train, limit);
}

ampc_status ampc_dataset_probe(ampc_dataset_info *out, ampc_dataset_kind kind, const char *dir,
                               int train, size_t limit) {
  if (!out) return ampc__error(AMPC_EINVAL, "dataset: out must not be NULL");
  memset(out, 0, sizeof *out);
  if (!kind_valid(kind)) return ampc__error(AMPC_EINVAL, "dataset: unknown kind %d", (int)kind);
  if (!dir) dir = dataset_infos[kind].dir;
  out->kind = kind;
  out->train = train ? 1 : 0;
  if (kind == AMPC_DATASET_MNIST || kind == AMPC_DATASET_FASHION_MNIST)
    return ampc__idx_probe(out, kind, dir, train, limit);
  return ampc__cifar_probe(out, kind, dir, train, limit);
}

ampc_status ampc_dataset_check_pair(const ampc_dataset_info *train, const ampc_dataset_info *test) {
  if (!train || !test) return ampc__error(AMPC_EINVAL, "dataset: check_pair: NULL argument");
  if (train->channels == test->channels && train->height == test->height &&
      train->width == test->width && train->classes == test->classes)
    return AMPC_OK;
  return ampc__error(AMPC_EINVAL,
                     "%s: the test set %s has %dx%dx%d images and %d classes, but the training set "
                     "%s has %dx%dx%d images and %d classes (the model is sized from the training set)",
                     ampc_dataset_kind_name(test->kind), test->images, test->channels, test->height,
                     test->width, test->classes, train->images, train->channels, train->height,
                     train->width, train->classes);
}

void ampc_dataset_free(ampc_dataset *d) {
  if (!d) return;
  free(d->images);
  free(d->labels);
  free(d);
}

/* A NULL d reads as an empty dataset of no kind (-1: "unknown"). */
ampc_dataset_kind ampc_dataset_get_kind(const ampc_dataset *d) { return d ? d->kind : (ampc_dataset_kind)-1; }
size_t ampc_dataset_count(const ampc_dataset *d) { return d ? d->n : 0; }
int ampc_dataset_channels(const ampc_dataset *d) { return d ? d->c : 0; }
int ampc_dataset_height(const ampc_dataset *d) { return d ? d->h : 0; }
int ampc_dataset_width(const ampc_dataset *d) { return d ? d->w : 0; }
int ampc_dataset_classes(const ampc_dataset *d) { return d ? d->classes : 0; }
const uint8_t *ampc_dataset_images(const ampc_dataset *d) { return d ? d->images : NULL; }
const int32_t *ampc_dataset_labels(const ampc_dataset *d) { return d ? d->labels : NULL; }

void ampc_dataset_norm(const ampc_dataset *d, float mean[3], float std[3]) {
  if (!mean || !std) return;
  for (int c = 0; c < 3; c++) {
    mean[c] = d ? dataset_infos[d->kind].mean[c] : 0.0f; /* NULL d: the identity, mean 0 and std 1 */
    std[c] = d ? dataset_infos[d->kind].std[c] : 1.0f;
  }
}
