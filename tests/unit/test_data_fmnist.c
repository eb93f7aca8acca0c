/* The real Fashion-MNIST, where installed: counts, shapes, balance and a
 * few known values (computed once with numpy from the same files). */
#include <math.h>
#include <stdint.h>
#include <sys/stat.h>

#include "ampc/data.h"
#include "test.h"

#ifndef FMNIST_DIR
#define FMNIST_DIR "/usr/share/datasets/fashion-mnist"
#endif

static int have_fmnist(void) {
  struct stat st;
  if (stat(FMNIST_DIR, &st) == 0 && S_ISDIR(st.st_mode)) return 1;
  printf("skipped: %s not found\n", FMNIST_DIR);
  return 0;
}

typedef struct {
  int train;
  size_t n;
  int per_class;
  int32_t first_labels[10];
  uint64_t pixel_sum, image0_sum;
  int img123_center; /* image 123, row 14, column 14 */
  double mean;       /* of pixel / 255 */
  double std;
} split_facts;

static const split_facts facts[2] = {
    {1, 60000, 6000, {9, 0, 0, 3, 0, 2, 7, 2, 5, 5}, 3431114169ull, 76247, 67, 0.2860406, 0.3530242},
    {0, 10000, 1000, {9, 2, 1, 1, 6, 1, 4, 6, 5, 7}, 573469082ull, 33456, 203, 0.2868493, 0.3524442},
};

TEST(fmnist_splits) {
  if (!have_fmnist()) return;
  for (int s = 0; s < 2; s++) {
    const split_facts *f = &facts[s];
    ampc_dataset *d = NULL;
    CHECK_OK(ampc_dataset_open(&d, AMPC_DATASET_FASHION_MNIST, FMNIST_DIR, f->train, 0));
    if (!d) continue;
    CHECK(ampc_dataset_count(d) == f->n);
    CHECK(ampc_dataset_channels(d) == 1 && ampc_dataset_height(d) == 28 &&
          ampc_dataset_width(d) == 28 && ampc_dataset_classes(d) == 10);
    const int32_t *lb = ampc_dataset_labels(d);
    const uint8_t *im = ampc_dataset_images(d);
    int hist[10] = {0}, out_of_range = 0;
    for (size_t i = 0; i < f->n; i++) {
      if (lb[i] < 0 || lb[i] > 9)
        out_of_range++;
      else
        hist[lb[i]]++;
    }
    CHECK(out_of_range == 0);
    for (int c = 0; c < 10; c++) CHECK_MSG(hist[c] == f->per_class, "class %d: %d", c, hist[c]);
    for (int i = 0; i < 10; i++) CHECK(lb[i] == f->first_labels[i]);
    uint64_t sum = 0, sum0 = 0;
    double sq = 0;
    for (size_t j = 0; j < f->n * 784; j++) {
      sum += im[j];
      sq += (double)im[j] * im[j];
    }
    for (size_t j = 0; j < 784; j++) sum0 += im[j];
    CHECK(sum == f->pixel_sum);
    CHECK(sum0 == f->image0_sum);
    CHECK(im[123 * 784 + 14 * 28 + 14] == f->img123_center);
    double cnt = (double)f->n * 784, mean = (double)sum / cnt / 255.0;
    double std = sqrt(sq / cnt / (255.0 * 255.0) - mean * mean);
    CHECK_NEAR(mean, f->mean, 1e-6);
    CHECK_NEAR(std, f->std, 1e-6);
    /* The published normalisation constants are these statistics of train. */
    if (f->train) {
      float m[3], sd[3];
      ampc_dataset_norm(d, m, sd);
      CHECK_NEAR(m[0], mean, 1e-3);
      CHECK_NEAR(sd[0], std, 1e-3);
    }

    /* A limit gives the same first samples. */
    ampc_dataset *p = NULL;
    CHECK_OK(ampc_dataset_open(&p, AMPC_DATASET_FASHION_MNIST, FMNIST_DIR, f->train, 1000));
    if (p) {
      CHECK(ampc_dataset_count(p) == 1000);
      CHECK(memcmp(ampc_dataset_images(p), im, 1000 * 784) == 0);
      CHECK(memcmp(ampc_dataset_labels(p), lb, 1000 * sizeof(int32_t)) == 0);
    }
    ampc_dataset_free(p);
    ampc_dataset_free(d);
  }
  /* dir NULL reads the default directory, which is this one. */
  if (strcmp(ampc_dataset_default_dir(AMPC_DATASET_FASHION_MNIST), FMNIST_DIR) == 0) {
    ampc_dataset *d = NULL;
    CHECK_OK(ampc_dataset_open(&d, AMPC_DATASET_FASHION_MNIST, NULL, 0, 10));
    if (d) CHECK(ampc_dataset_count(d) == 10 && ampc_dataset_labels(d)[0] == 9);
    ampc_dataset_free(d);
  }
}

TEST(fmnist_loader_epoch) {
  /* One shuffled epoch in the reference's form (pixel / 255, no mean/std):
   * every sample once, so the class balance and the pixel total survive. */
  if (!have_fmnist()) return;
  ampc_dataset *d = NULL;
  CHECK_OK(ampc_dataset_open(&d, AMPC_DATASET_FASHION_MNIST, FMNIST_DIR, 1, 0));
  if (!d) return;
  ampc_loader_opts o;
  ampc_loader_opts_default(&o);
  o.batch_size = 256;
  o.normalize = 0;
  o.seed = 1;
  ampc_loader *l = NULL;
  CHECK_OK(ampc_loader_create(&l, d, &o));
  float *x = malloc(256 * 784 * sizeof(float));
  int32_t y[256];
  if (l && x) {
    CHECK(ampc_loader_batches_per_epoch(l) == 235);
    CHECK_OK(ampc_loader_start_epoch(l, 0, 0));
    int n, hist[10] = {0}, batches = 0;
    size_t total = 0;
    uint64_t pixels = 0;
    while (ampc_loader_next(l, x, y, &n) == 0 && n > 0) {
      batches++;
      total += (size_t)n;
      for (int i = 0; i < n; i++)
        if (y[i] >= 0 && y[i] < 10) hist[y[i]]++;
      for (size_t j = 0; j < (size_t)n * 784; j++) pixels += (uint64_t)lrintf(x[j] * 255.0f);
    }
    CHECK(batches == 235 && total == 60000);
    for (int c = 0; c < 10; c++) CHECK(hist[c] == 6000);
    CHECK(pixels == facts[0].pixel_sum);
  }
  free(x);
  ampc_loader_free(l);
  ampc_dataset_free(d);
}

TEST_MAIN(TEST_ENTRY(fmnist_splits), TEST_ENTRY(fmnist_loader_epoch))
