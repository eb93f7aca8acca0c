/* Dataset readers (IDX, CIFAR-10/100) on generated files, and the loader on
 * synthetic datasets. */
#include <dirent.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "ampc/data.h"
#include "ampc/dtype.h"
#include "ampc/rng.h"
#include "data/data_internal.h"
#include "test.h"

/* ---- files ---------------------------------------------------------------- */

typedef struct {
  uint8_t *p;
  size_t n, cap;
} buf;

static void buf_put(buf *b, const void *src, size_t n) {
  if (b->n + n > b->cap) {
    b->cap = (b->n + n) * 2 + 64;
    b->p = realloc(b->p, b->cap);
  }
  memcpy(b->p + b->n, src, n);
  b->n += n;
}
static void buf_be32(buf *b, uint32_t v) {
  uint8_t q[4] = {(uint8_t)(v >> 24), (uint8_t)(v >> 16), (uint8_t)(v >> 8), (uint8_t)v};
  buf_put(b, q, 4);
}
static void buf_byte(buf *b, uint8_t v) { buf_put(b, &v, 1); }
static void buf_free(buf *b) {
  free(b->p);
  memset(b, 0, sizeof *b);
}

/* A fresh, empty directory AMPC_TEST_TMPDIR/test_data_<name>. */
static const char *case_dir(const char *name) {
  static char path[1024];
  snprintf(path, sizeof path, "%s/test_data_%s", AMPC_TEST_TMPDIR, name);
  mkdir(AMPC_TEST_TMPDIR, 0755);
  mkdir(path, 0755);
  DIR *dir = opendir(path);
  if (dir) {
    struct dirent *e;
    char f[1400];
    while ((e = readdir(dir))) {
      if (e->d_name[0] == '.') continue;
      snprintf(f, sizeof f, "%s/%s", path, e->d_name);
      unlink(f);
    }
    closedir(dir);
  }
  return path;
}

static void write_file(const char *dir, const char *name, const void *p, size_t n, int gz) {
  char path[1400];
  snprintf(path, sizeof path, "%s/%s%s", dir, name, gz ? ".gz" : "");
  if (gz) {
    gzFile f = gzopen(path, "wb");
    CHECK(f != NULL);
    if (!f) return;
    if (n) CHECK(gzwrite(f, p, (unsigned)n) == (int)n);
    CHECK(gzclose(f) == Z_OK);
  } else {
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (!f) return;
    CHECK(fwrite(p, 1, n, f) == n);
    fclose(f);
  }
}

static void remove_file(const char *dir, const char *name) {
  char path[1400];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  unlink(path);
}

/* Reads dir/name whole into b. */
static void read_file(const char *dir, const char *name, buf *b) {
  char path[1400], chunk[4096];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "rb");
  CHECK(f != NULL);
  if (!f) return;
  size_t got;
  while ((got = fread(chunk, 1, sizeof chunk, f)) > 0) buf_put(b, chunk, got);
  fclose(f);
}

/* ---- IDX ------------------------------------------------------------------ */

static uint8_t idx_pixel(size_t i, int y, int x) { return (uint8_t)(i * 31 + y * 7 + x * 3 + 5); }
static uint8_t idx_label(size_t i) { return (uint8_t)((i * 3 + 1) % 10); }

/* An images file of n (h, w) images, with magic and dims as given. */
static void idx_images(buf *b, uint32_t magic, uint32_t n, uint32_t h, uint32_t w, size_t data_n) {
  buf_be32(b, magic);
  buf_be32(b, n);
  buf_be32(b, h);
  buf_be32(b, w);
  for (size_t i = 0; i < data_n; i++)
    for (uint32_t y = 0; y < h; y++)
      for (uint32_t x = 0; x < w; x++) buf_byte(b, idx_pixel(i, (int)y, (int)x));
}
static void idx_labels(buf *b, uint32_t magic, uint32_t n, size_t data_n) {
  buf_be32(b, magic);
  buf_be32(b, n);
  for (size_t i = 0; i < data_n; i++) buf_byte(b, idx_label(i));
}

/* Writes a valid split (train or t10k) of n 5x4 images. */
static void idx_write_split(const char *dir, const char *split, uint32_t n, int gz) {
  buf im = {0}, lb = {0};
  char name[64];
  idx_images(&im, 0x803, n, 5, 4, n);
  idx_labels(&lb, 0x801, n, n);
  snprintf(name, sizeof name, "%s-images-idx3-ubyte", split);
  write_file(dir, name, im.p, im.n, gz);
  snprintf(name, sizeof name, "%s-labels-idx1-ubyte", split);
  write_file(dir, name, lb.p, lb.n, gz);
  buf_free(&im);
  buf_free(&lb);
}

static void check_idx_dataset(const ampc_dataset *d, size_t n) {
  CHECK(ampc_dataset_count(d) == n);
  CHECK(ampc_dataset_channels(d) == 1);
  CHECK(ampc_dataset_height(d) == 5);
  CHECK(ampc_dataset_width(d) == 4);
  CHECK(ampc_dataset_classes(d) == 10);
  const uint8_t *im = ampc_dataset_images(d);
  const int32_t *lb = ampc_dataset_labels(d);
  int bad = 0;
  for (size_t i = 0; i < n; i++) {
    if (lb[i] != idx_label(i)) bad++;
    for (int y = 0; y < 5; y++)
      for (int x = 0; x < 4; x++)
        if (im[(i * 5 + (size_t)y) * 4 + (size_t)x] != idx_pixel(i, y, x)) bad++;
  }
  CHECK(bad == 0);
}

TEST(idx_roundtrip) {
  for (int gz = 0; gz < 2; gz++) {
    const char *dir = case_dir(gz ? "idx_gz" : "idx_plain");
    idx_write_split(dir, "train", 7, gz);
    idx_write_split(dir, "t10k", 3, gz);
    ampc_dataset *d = NULL;
    CHECK_OK(ampc_dataset_open(&d, AMPC_DATASET_MNIST, dir, 1, 0));
    if (d) check_idx_dataset(d, 7);
    if (d) CHECK(ampc_dataset_get_kind(d) == AMPC_DATASET_MNIST);
    ampc_dataset_free(d);
    d = NULL;
    CHECK_OK(ampc_dataset_open(&d, AMPC_DATASET_FASHION_MNIST, dir, 0, 0));
    if (d) check_idx_dataset(d, 3);
    ampc_dataset_free(d);
    d = NULL;
    CHECK_OK(ampc_dataset_open(&d, AMPC_DATASET_MNIST, dir, 1, 4));
    if (d) check_idx_dataset(d, 4);
    ampc_dataset_free(d);
    d = NULL;
    CHECK_OK(ampc_dataset_open(&d, AMPC_DATASET_MNIST, dir, 1, 100));
    if (d) check_idx_dataset(d, 7);
    ampc_dataset_free(d);
  }
}

/* Writes train-images/labels from the given bytes (plain) and expects open to
 * fail with code and a message containing msg, leaving *out NULL. */
static void idx_expect(const char *what, const buf *im, const buf *lb, int gz, size_t limit,
                       int code, const char *msg) {
  const char *dir = case_dir("idx_bad");
  if (im) write_file(dir, "train-images-idx3-ubyte", im->p, im->n, gz);
  if (lb) write_file(dir, "train-labels-idx1-ubyte", lb->p, lb->n, gz);
  ampc_dataset *d = (ampc_dataset *)1;
  int s = ampc_dataset_open(&d, AMPC_DATASET_FASHION_MNIST, dir, 1, limit);
  CHECK_MSG(s == code && strstr(ampc_last_error(), msg) && d == NULL,
            "%s: expected %d \"%s\", got %d \"%s\"", what, code, msg, s, ampc_last_error());
  if (s == 0) ampc_dataset_free(d);
  /* Every message is one line and names the dataset. */
  CHECK(!strchr(ampc_last_error(), '\n'));
  CHECK(strncmp(ampc_last_error(), "fashion-mnist: ", 15) == 0);
}

TEST(idx_errors) {
  buf im = {0}, lb = {0};
  idx_images(&im, 0x803, 7, 5, 4, 7);
  idx_labels(&lb, 0x801, 7, 7);

  idx_expect("no files", NULL, NULL, 0, 0, AMPC_ENOTFOUND,
             "cannot find train-images-idx3-ubyte or train-images-idx3-ubyte.gz in");
  idx_expect("no labels", &im, NULL, 0, 0, AMPC_ENOTFOUND, "cannot find train-labels-idx1-ubyte");

  buf b = {0};
  idx_images(&b, 0x802, 7, 5, 4, 7);
  idx_expect("image magic", &b, &lb, 0, 0, AMPC_EFORMAT,
             "train-images-idx3-ubyte: bad magic 0x00000802 (expected 0x00000803)");
  buf_free(&b);
  idx_labels(&b, 0x803, 7, 7);
  idx_expect("label magic", &im, &b, 1, 0, AMPC_EFORMAT,
             "train-labels-idx1-ubyte.gz: bad magic 0x00000803 (expected 0x00000801)");
  buf_free(&b);

  idx_images(&b, 0x803, 0, 5, 4, 0);
  idx_expect("zero count", &b, &lb, 0, 0, AMPC_EFORMAT, "dimension 0 is zero");
  buf_free(&b);
  idx_images(&b, 0x803, 7, 5, 0, 7);
  idx_expect("zero width", &b, &lb, 0, 0, AMPC_EFORMAT, "dimension 2 is zero");
  buf_free(&b);
  idx_images(&b, 0x803, 0xffffffffu, 0xffff, 0xffff, 0);
  idx_expect("overflow", &b, &lb, 0, 0, AMPC_EFORMAT,
             "header claims 4294967295 x 65535 x 65535 images, over the 2 GiB limit");
  buf_free(&b);
  idx_images(&b, 0x803, 1, 0x80000000u, 1, 0);
  idx_expect("height past int", &b, &lb, 0, 0, AMPC_EFORMAT, "over the 2 GiB limit");
  buf_free(&b);
  idx_images(&b, 0x803, 70000, 200, 200, 0);
  idx_expect("absurd", &b, &lb, 0, 0, AMPC_EFORMAT, "over the 2 GiB limit");
  buf_free(&b);
  buf_put(&b, im.p, 10);
  idx_expect("short header", &b, &lb, 0, 0, AMPC_EFORMAT, "truncated header (10 of 16 bytes)");
  buf_free(&b);

  /* Truncated data: 7 images of 20 bytes, 10 missing. */
  buf_put(&b, im.p, im.n - 10);
  idx_expect("truncated images", &b, &lb, 0, 0, AMPC_EFORMAT,
             "train-images-idx3-ubyte: truncated: expected 140 bytes of image data, got 130");
  idx_expect("truncated images gz", &b, &lb, 1, 0, AMPC_EFORMAT,
             "train-images-idx3-ubyte.gz: truncated: expected 140 bytes of image data, got 130");
  buf_free(&b);
  buf_put(&b, lb.p, lb.n - 2);
  idx_expect("truncated labels", &im, &b, 0, 0, AMPC_EFORMAT,
             "train-labels-idx1-ubyte: truncated: expected 7 bytes of label data, got 5");
  buf_free(&b);

  buf_put(&b, im.p, im.n);
  buf_put(&b, "xyz", 3);
  idx_expect("trailing", &b, &lb, 0, 0, AMPC_EFORMAT,
             "train-images-idx3-ubyte: trailing data after the 7 images the header declares");
  buf_free(&b);
  buf_put(&b, lb.p, lb.n);
  buf_byte(&b, 1);
  idx_expect("trailing labels", &im, &b, 1, 0, AMPC_EFORMAT,
             "train-labels-idx1-ubyte.gz: trailing data after the 7 labels");
  buf_free(&b);

  idx_labels(&b, 0x801, 6, 6);
  idx_expect("count mismatch", &im, &b, 0, 0, AMPC_EFORMAT,
             "train-labels-idx1-ubyte has 6 labels but train-images-idx3-ubyte has 7 images");
  buf_free(&b);

  buf_put(&b, lb.p, lb.n);
  b.p[8 + 3] = 10;
  idx_expect("label range", &im, &b, 0, 0, AMPC_EFORMAT,
             "train-labels-idx1-ubyte: label 10 at index 3 out of range [0, 10)");
  buf_free(&b);

  /* Corrupt gzip: a flipped CRC in the trailer, and a stream cut short. */
  {
    const char *dir = case_dir("idx_gzbad");
    write_file(dir, "train-images-idx3-ubyte", im.p, im.n, 1);
    buf gzb = {0};
    read_file(dir, "train-images-idx3-ubyte.gz", &gzb);
    CHECK(gzb.n > 20);
    if (gzb.n > 20) {
      buf crc = {0}, cut = {0};
      buf_put(&crc, gzb.p, gzb.n);
      crc.p[crc.n - 8] ^= 0x5a;
      buf_put(&cut, gzb.p, gzb.n / 2);
      const char *d2 = case_dir("idx_bad");
      for (int k = 0; k < 2; k++) {
        const buf *bad = k ? &cut : &crc;
        write_file(d2, "train-images-idx3-ubyte.gz", bad->p, bad->n, 0);
        write_file(d2, "train-labels-idx1-ubyte", lb.p, lb.n, 0);
        ampc_dataset *d = NULL;
        CHECK_ERR(ampc_dataset_open(&d, AMPC_DATASET_FASHION_MNIST, d2, 1, 0), AMPC_EFORMAT,
                  "fashion-mnist: train-images-idx3-ubyte.gz: corrupt gzip stream (");
        CHECK(d == NULL);
      }
      buf_free(&crc);
      buf_free(&cut);
    }
    buf_free(&gzb);
  }
  /* After the gzip stream: bytes that are not another gzip member are an
   * error (zlib's gzread ignores them); a second member is read on, as
   * gzip -d reads it; a file named .gz that is not a gzip is read as it is. */
  {
    const char *dir = case_dir("idx_gztail");
    write_file(dir, "train-images-idx3-ubyte", im.p, im.n, 1);
    buf gzb = {0}, tail = {0}, two = {0}, half = {0};
    read_file(dir, "train-images-idx3-ubyte.gz", &gzb);
    buf_put(&tail, gzb.p, gzb.n);
    buf_put(&tail, "GARBAGE", 7);
    /* the images in two members: the first 30 bytes, then the rest */
    write_file(dir, "part", im.p, 30, 1);
    read_file(dir, "part.gz", &two);
    write_file(dir, "part", im.p + 30, im.n - 30, 1);
    read_file(dir, "part.gz", &half);
    buf_put(&two, half.p, half.n);
    const char *d2 = case_dir("idx_gztail2");
    for (int k = 0; k < 4; k++) {
      const buf *f = k == 0 ? &tail : k == 1 ? &two : &im;
      write_file(d2, "train-images-idx3-ubyte.gz", f->p, f->n, 0);
      write_file(d2, "train-labels-idx1-ubyte", lb.p, lb.n, 0);
      if (k == 3) { /* a header that claims more than its small gzip file can hold */
        buf big = {0};
        idx_images(&big, 0x803, 60000, 28, 28, 0);
        write_file(d2, "train-images-idx3-ubyte", big.p, big.n, 1);
        buf_free(&big);
        idx_labels(&big, 0x801, 60000, 0);
        write_file(d2, "train-labels-idx1-ubyte", big.p, big.n, 0);
        buf_free(&big);
      }
      ampc_dataset *d = NULL;
      ampc_status st = ampc_dataset_open(&d, AMPC_DATASET_FASHION_MNIST, d2, 1, 0);
      if (k == 0)
        CHECK_ERR(st, AMPC_EFORMAT, "fashion-mnist: train-images-idx3-ubyte.gz: data after the end of the gzip stream (7 bytes");
      else if (k == 3)
        CHECK_ERR(st, AMPC_EFORMAT, "train-images-idx3-ubyte.gz: truncated: expected 47040000 bytes of image data, more than its");
      else
        CHECK_MSG(st == AMPC_OK && ampc_dataset_count(d) == 7, "case %d: %d %s", k, st, ampc_last_error());
      if (d) ampc_dataset_free(d);
    }
    buf_free(&gzb);
    buf_free(&tail);
    buf_free(&two);
    buf_free(&half);
  }

  /* With a limit only the needed prefix is read: a file truncated past it is fine. */
  {
    const char *dir = case_dir("idx_bad");
    write_file(dir, "train-images-idx3-ubyte", im.p, im.n - 30, 0);
    write_file(dir, "train-labels-idx1-ubyte", lb.p, lb.n - 2, 0);
    ampc_dataset *d = NULL;
    CHECK_OK(ampc_dataset_open(&d, AMPC_DATASET_FASHION_MNIST, dir, 1, 3));
    if (d) check_idx_dataset(d, 3);
    ampc_dataset_free(d);
  }
  buf_free(&im);
  buf_free(&lb);
}

/* ---- CIFAR ---------------------------------------------------------------- */

static uint8_t cifar_pixel(size_t i, int c, int y, int x) {
  return (uint8_t)(i * 13 + (size_t)c * 50 + (size_t)y * 5 + (size_t)x);
}

/* Records first .. first+n-1 of a CIFAR-10 (label_bytes 1) or CIFAR-100 (2)
 * file; labels from the functions below. */
static uint8_t c10_label(size_t i) { return (uint8_t)(i % 10); }
static uint8_t c100_coarse(size_t i) { return (uint8_t)(i % 20); }
static uint8_t c100_fine(size_t i) { return (uint8_t)((i * 7 + 3) % 100); }

static void cifar_records(buf *b, int label_bytes, size_t first, size_t n) {
  for (size_t i = first; i < first + n; i++) {
    if (label_bytes == 2) {
      buf_byte(b, c100_coarse(i));
      buf_byte(b, c100_fine(i));
    } else {
      buf_byte(b, c10_label(i));
    }
    for (int c = 0; c < 3; c++)
      for (int y = 0; y < 32; y++)
        for (int x = 0; x < 32; x++) buf_byte(b, cifar_pixel(i, c, y, x));
  }
}

static void write_cifar(const char *dir, const char *name, int label_bytes, size_t first,
                        size_t n) {
  buf b = {0};
  cifar_records(&b, label_bytes, first, n);
  write_file(dir, name, b.p, b.n, 0);
  buf_free(&b);
}

static void check_cifar(const ampc_dataset *d, size_t n, size_t first, int cifar100) {
  CHECK(ampc_dataset_count(d) == n);
  CHECK(ampc_dataset_channels(d) == 3);
  CHECK(ampc_dataset_height(d) == 32 && ampc_dataset_width(d) == 32);
  CHECK(ampc_dataset_classes(d) == (cifar100 ? 100 : 10));
  const uint8_t *im = ampc_dataset_images(d);
  const int32_t *lb = ampc_dataset_labels(d);
  int bad = 0;
  for (size_t i = 0; i < n; i++) {
    size_t g = first + i;
    if (lb[i] != (cifar100 ? c100_fine(g) : c10_label(g))) bad++;
    for (int c = 0; c < 3; c++)
      for (int y = 0; y < 32; y++)
        for (int x = 0; x < 32; x++)
          if (im[((i * 3 + (size_t)c) * 32 + (size_t)y) * 32 + (size_t)x] != cifar_pixel(g, c, y, x))
            bad++;
  }
  CHECK(bad == 0);
}

static const size_t c10_counts[5] = {3, 2, 4, 1, 2};

static void write_cifar10_train(const char *dir) {
  size_t first = 0;
  for (int f = 0; f < 5; f++) {
    char name[32];
    snprintf(name, sizeof name, "data_batch_%d.bin", f + 1);
    write_cifar(dir, name, 1, first, c10_counts[f]);
    first += c10_counts[f];
  }
}

TEST(cifar10_roundtrip) {
  const char *dir = case_dir("cifar10");
  write_cifar10_train(dir);
  write_cifar(dir, "test_batch.bin", 1, 100, 5);
  ampc_dataset *d = NULL;
  CHECK_OK(ampc_dataset_open(&d, AMPC_DATASET_CIFAR10, dir, 1, 0));
  if (d) check_cifar(d, 12, 0, 0);
  ampc_dataset_free(d);
  d = NULL;
  CHECK_OK(ampc_dataset_open(&d, AMPC_DATASET_CIFAR10, dir, 0, 0));
  if (d) check_cifar(d, 5, 100, 0);
  ampc_dataset_free(d);
  d = NULL;
  /* A limit that ends inside the second file. */
  CHECK_OK(ampc_dataset_open(&d, AMPC_DATASET_CIFAR10, dir, 1, 4));
  if (d) check_cifar(d, 4, 0, 0);
  ampc_dataset_free(d);
  d = NULL;

  /* Files past the limit are never opened: a broken 4th and a missing 5th
   * file do not matter for limit 9 (files 1-3), and do without one. */
  write_file(dir, "data_batch_4.bin", "junk", 4, 0);
  remove_file(dir, "data_batch_5.bin");
  CHECK_OK(ampc_dataset_open(&d, AMPC_DATASET_CIFAR10, dir, 1, 9));
  if (d) check_cifar(d, 9, 0, 0);
  ampc_dataset_free(d);
  d = NULL;
  CHECK_ERR(ampc_dataset_open(&d, AMPC_DATASET_CIFAR10, dir, 1, 10), AMPC_EFORMAT,
            "cifar10: data_batch_4.bin: ");
  CHECK(strstr(ampc_last_error(), "is not a whole number of 3073-byte records (0 whole ones and ") != NULL);
  CHECK(d == NULL);
  write_cifar(dir, "data_batch_4.bin", 1, 9, 1);
  CHECK_ERR(ampc_dataset_open(&d, AMPC_DATASET_CIFAR10, dir, 1, 0), AMPC_ENOTFOUND,
            "cifar10: cannot find data_batch_5.bin in ");
  CHECK(d == NULL);
}

TEST(cifar100_roundtrip) {
  const char *dir = case_dir("cifar100");
  write_cifar(dir, "train.bin", 2, 0, 6);
  write_cifar(dir, "test.bin", 2, 50, 2);
  ampc_dataset *d = NULL;
  CHECK_OK(ampc_dataset_open(&d, AMPC_DATASET_CIFAR100, dir, 1, 0));
  if (d) check_cifar(d, 6, 0, 1);
  ampc_dataset_free(d);
  d = NULL;
  CHECK_OK(ampc_dataset_open(&d, AMPC_DATASET_CIFAR100, dir, 0, 0));
  if (d) check_cifar(d, 2, 50, 1);
  ampc_dataset_free(d);
  d = NULL;
  CHECK_OK(ampc_dataset_open(&d, AMPC_DATASET_CIFAR100, dir, 1, 5));
  if (d) check_cifar(d, 5, 0, 1);
  ampc_dataset_free(d);
}

TEST(cifar_errors) {
  const char *dir = case_dir("cifar_bad");
  ampc_dataset *d = NULL;
  CHECK_ERR(ampc_dataset_open(&d, AMPC_DATASET_CIFAR10, dir, 0, 0), AMPC_ENOTFOUND,
            "cifar10: cannot find test_batch.bin in ");
  CHECK_ERR(ampc_dataset_open(&d, AMPC_DATASET_CIFAR100, dir, 1, 0), AMPC_ENOTFOUND,
            "cifar100: cannot find train.bin in ");

  buf b = {0};
  static const uint8_t partial[100];
  cifar_records(&b, 1, 0, 3);
  buf_put(&b, partial, sizeof partial);
  write_file(dir, "test_batch.bin", b.p, b.n, 0);
  CHECK_ERR(ampc_dataset_open(&d, AMPC_DATASET_CIFAR10, dir, 0, 0), AMPC_EFORMAT,
            "cifar10: test_batch.bin: 9319 bytes is not a whole number of 3073-byte records (3 whole ones "
            "and 100 bytes: truncated, or bytes past the last record; the published file has 10000)");
  buf_free(&b);

  cifar_records(&b, 1, 0, 3);
  b.p[3073] = 10; /* record 1's label */
  write_file(dir, "test_batch.bin", b.p, b.n, 0);
  CHECK_ERR(ampc_dataset_open(&d, AMPC_DATASET_CIFAR10, dir, 0, 0), AMPC_EFORMAT,
            "cifar10: test_batch.bin: record 1: label 10 out of range [0, 10)");
  buf_free(&b);

  write_file(dir, "test_batch.bin", "", 0, 0);
  CHECK_ERR(ampc_dataset_open(&d, AMPC_DATASET_CIFAR10, dir, 0, 0), AMPC_EFORMAT,
            "cifar10: test_batch.bin: empty file");

  cifar_records(&b, 2, 0, 4);
  b.p[2 * 3074 + 1] = 100;
  write_file(dir, "test.bin", b.p, b.n, 0);
  CHECK_ERR(ampc_dataset_open(&d, AMPC_DATASET_CIFAR100, dir, 0, 0), AMPC_EFORMAT,
            "cifar100: test.bin: record 2: label 100 out of range [0, 100)");
  b.p[2 * 3074 + 1] = 99;
  b.p[3 * 3074] = 20;
  write_file(dir, "test.bin", b.p, b.n, 0);
  CHECK_ERR(ampc_dataset_open(&d, AMPC_DATASET_CIFAR100, dir, 0, 0), AMPC_EFORMAT,
            "cifar100: test.bin: record 3: coarse label 20 out of range [0, 20)");
  buf_free(&b);
  cifar_records(&b, 2, 0, 2);
  b.n -= 1;
  write_file(dir, "train.bin", b.p, b.n, 0);
  CHECK_ERR(ampc_dataset_open(&d, AMPC_DATASET_CIFAR100, dir, 1, 0), AMPC_EFORMAT,
            "cifar100: train.bin: ");
  CHECK(strstr(ampc_last_error(), "not a whole number of 3074-byte records (1 whole ones and ") != NULL);
  buf_free(&b);

  /* A file past the 2 GiB of image data is refused before allocating (a
   * sparse file: nothing is written). 700000 records = 2.15e9 bytes. */
  char path[1400];
  snprintf(path, sizeof path, "%s/test_batch.bin", dir);
  FILE *big = fopen(path, "wb");
  CHECK(big != NULL);
  if (big) {
    CHECK(ftruncate(fileno(big), (off_t)700000 * 3073) == 0);
    fclose(big);
    CHECK_ERR(ampc_dataset_open(&d, AMPC_DATASET_CIFAR10, dir, 0, 0), AMPC_EFORMAT,
              "cifar10: test_batch.bin: 700000 records (700000 images in all), over the 2 GiB limit");
    /* even when only a few of them are asked for: such a file is not CIFAR */
    CHECK_ERR(ampc_dataset_open(&d, AMPC_DATASET_CIFAR10, dir, 0, 10), AMPC_EFORMAT,
              "cifar10: test_batch.bin: 700000 records");
    ampc_dataset_info info;
    CHECK_ERR(ampc_dataset_probe(&info, AMPC_DATASET_CIFAR10, dir, 0, 0), AMPC_EFORMAT,
              "cifar10: test_batch.bin: 700000 records");
    remove(path);
  }
  CHECK(d == NULL);
}

TEST(dataset_kinds) {
  ampc_dataset_kind k = AMPC_DATASET_COUNT;
  CHECK_OK(ampc_dataset_kind_parse("mnist", &k));
  CHECK(k == AMPC_DATASET_MNIST);
  const char *fm[] = {"fashion-mnist", "fmnist", "fashion_mnist", "Fashion-MNIST"};
  for (int i = 0; i < 4; i++) {
    k = AMPC_DATASET_COUNT;
    CHECK_OK(ampc_dataset_kind_parse(fm[i], &k));
    CHECK(k == AMPC_DATASET_FASHION_MNIST);
  }
  CHECK_OK(ampc_dataset_kind_parse("cifar10", &k));
  CHECK(k == AMPC_DATASET_CIFAR10);
  CHECK_OK(ampc_dataset_kind_parse("cifar100", &k));
  CHECK(k == AMPC_DATASET_CIFAR100);
  CHECK_ERR(ampc_dataset_kind_parse("imagenet", &k), AMPC_EINVAL, "unknown dataset \"imagenet\"");
  CHECK(strcmp(ampc_dataset_kind_name(AMPC_DATASET_FASHION_MNIST), "fashion-mnist") == 0);
  CHECK(strcmp(ampc_dataset_default_dir(AMPC_DATASET_FASHION_MNIST),
               "/usr/share/datasets/fashion-mnist") == 0);
  CHECK(strcmp(ampc_dataset_default_dir(AMPC_DATASET_MNIST), "/usr/share/datasets/mnist") == 0);
  CHECK(strcmp(ampc_dataset_default_dir(AMPC_DATASET_CIFAR10), "data/cifar-10-batches-bin") == 0);
  CHECK(strcmp(ampc_dataset_default_dir(AMPC_DATASET_CIFAR100), "data/cifar-100-binary") == 0);

  ampc_dataset *d = NULL;
  float mean[3], std[3];
  CHECK_OK(ampc__dataset_alloc(&d, AMPC_DATASET_CIFAR10, 1, 3, 2, 2, 10));
  ampc_dataset_norm(d, mean, std);
  CHECK(mean[0] == 0.4914f && mean[1] == 0.4822f && mean[2] == 0.4465f);
  CHECK(std[0] == 0.2470f && std[1] == 0.2435f && std[2] == 0.2616f);
  d->kind = AMPC_DATASET_CIFAR100;
  ampc_dataset_norm(d, mean, std);
  CHECK(mean[0] == 0.5071f && mean[1] == 0.4865f && mean[2] == 0.4409f);
  CHECK(std[0] == 0.2673f && std[1] == 0.2564f && std[2] == 0.2762f);
  d->kind = AMPC_DATASET_FASHION_MNIST;
  ampc_dataset_norm(d, mean, std);
  CHECK(mean[0] == 0.2860f && std[0] == 0.3530f && mean[1] == 0.0f && std[1] == 1.0f);
  d->kind = AMPC_DATASET_MNIST;
  ampc_dataset_norm(d, mean, std);
  CHECK(mean[0] == 0.1307f && std[0] == 0.3081f);
  ampc_dataset_free(d);
  ampc_dataset_free(NULL);
}

/* ---- loader --------------------------------------------------------------- */

/* n images of (c, h, w) whose label is their index, so batches say which
 * samples they hold. Pixels differ between images and within one. */
static ampc_dataset *synthetic(size_t n, int c, int h, int w) {
  ampc_dataset *d = NULL;
  CHECK_OK(ampc__dataset_alloc(&d, AMPC_DATASET_CIFAR10, n, c, h, w, (int)n));
  if (!d) return NULL;
  size_t per = (size_t)c * (size_t)h * (size_t)w;
  for (size_t i = 0; i < n; i++) {
    d->labels[i] = (int32_t)i;
    for (size_t j = 0; j < per; j++) d->images[i * per + j] = (uint8_t)(i * 37 + j * 11 + 1);
  }
  return d;
}

static size_t elems_of(const ampc_dataset *d) {
  return (size_t)ampc_dataset_channels(d) * (size_t)ampc_dataset_height(d) *
         (size_t)ampc_dataset_width(d);
}

/* Every batch of one epoch, from start_batch on; x in the loader's dtype. */
typedef struct {
  int64_t nb;
  size_t xbytes; /* per batch */
  int batch;
  uint8_t *x;
  int32_t *y;
  int *n;
} dump;

static dump run_epoch(ampc_loader *l, const ampc_dataset *d, const ampc_loader_opts *o,
                      int64_t epoch, int64_t start) {
  dump r = {0};
  r.batch = o->batch_size;
  r.nb = ampc_loader_batches_per_epoch(l) - start;
  r.xbytes = (size_t)o->batch_size * elems_of(d) * ampc_dtype_size(o->dtype);
  r.x = calloc((size_t)(r.nb + 1), r.xbytes);
  r.y = calloc((size_t)(r.nb + 1) * (size_t)o->batch_size, sizeof(int32_t));
  r.n = calloc((size_t)(r.nb + 1), sizeof(int));
  /* Garbage, so that a batch the loader leaves partly unwritten shows. */
  memset(r.x, 0xab, (size_t)(r.nb + 1) * r.xbytes);
  memset(r.y, 0xab, (size_t)(r.nb + 1) * (size_t)o->batch_size * sizeof(int32_t));
  CHECK_OK(ampc_loader_start_epoch(l, epoch, start));
  for (int64_t k = 0; k < r.nb; k++) {
    CHECK(ampc_loader_position(l) == start + k);
    CHECK_OK(ampc_loader_next(l, r.x + (size_t)k * r.xbytes, r.y + (size_t)k * (size_t)r.batch,
                              &r.n[k]));
  }
  /* Then the end of the epoch, twice. */
  int n = -1;
  uint8_t *xend = r.x + (size_t)r.nb * r.xbytes;
  int32_t *yend = r.y + (size_t)r.nb * (size_t)r.batch;
  CHECK_OK(ampc_loader_next(l, xend, yend, &n));
  CHECK(n == 0);
  n = -1;
  CHECK_OK(ampc_loader_next(l, xend, yend, &n));
  CHECK(n == 0);
  return r;
}

static dump run(const ampc_dataset *d, const ampc_loader_opts *o, int64_t epoch, int64_t start) {
  ampc_loader *l = NULL;
  CHECK_OK(ampc_loader_create(&l, d, o));
  dump r = {0};
  if (l) r = run_epoch(l, d, o, epoch, start);
  ampc_loader_free(l);
  return r;
}

static void dump_free(dump *r) {
  free(r->x);
  free(r->y);
  free(r->n);
}

/* Batches k0.. of a equal batches 0.. of b. */
static int dump_same(const dump *a, int64_t k0, const dump *b) {
  if (a->nb - k0 != b->nb || a->xbytes != b->xbytes) return 0;
  for (int64_t k = 0; k < b->nb; k++) {
    if (a->n[k0 + k] != b->n[k]) return 0;
    if (memcmp(a->x + (size_t)(k0 + k) * a->xbytes, b->x + (size_t)k * b->xbytes, b->xbytes))
      return 0;
    if (memcmp(a->y + (size_t)(k0 + k) * (size_t)a->batch, b->y + (size_t)k * (size_t)b->batch,
               (size_t)b->batch * sizeof(int32_t)))
      return 0;
  }
  return 1;
}

/* The sample order of an epoch, from the labels. */
static void dump_order(const dump *r, int32_t *order, size_t *count) {
  *count = 0;
  for (int64_t k = 0; k < r->nb; k++)
    for (int i = 0; i < r->n[k]; i++) order[(*count)++] = r->y[(size_t)k * (size_t)r->batch + (size_t)i];
}

static ampc_loader_opts opts_plain(int batch) {
  ampc_loader_opts o;
  ampc_loader_opts_default(&o);
  o.batch_size = batch;
  o.background = 0;
  return o;
}

/* The distributed sampler: W ranks of batch B, each its slice of every
 * global batch, together are one process at batch W * B -- the same
 * samples, pixels (augmentation included) and labels, batch for batch; the
 * last global batch cut into near-equal slices; a start mid-epoch alike. */
TEST(loader_ranks) {
  ampc_dataset *d = synthetic(45, 3, 5, 6);
  if (!d) return;
  size_t es = elems_of(d) * sizeof(float);
  for (int W = 2; W <= 3; W++) {
    for (int start = 0; start < 2; start++) {
      ampc_loader_opts o = opts_plain(4 * W);
      o.random_crop_padding = 2;
      o.hflip = 1;
      o.seed = 9;
      dump one = run(d, &o, 1, start);
      int ok = 1;
      int64_t seen = 0;
      for (int r = 0; r < W; r++) {
        ampc_loader_opts ro = o;
        ro.batch_size = 4;
        ro.rank = r;
        ro.world_size = W;
        ro.background = r % 2; /* both modes */
        ampc_loader *l = NULL;
        CHECK_OK(ampc_loader_create(&l, d, &ro));
        if (!l) continue;
        CHECK(ampc_loader_batches_per_epoch(l) == (45 + 4 * W - 1) / (4 * W));
        dump mine = run_epoch(l, d, &ro, 1, start);
        ok &= mine.nb == one.nb;
        for (int64_t k = 0; ok && k < one.nb; k++) {
          int64_t gn = ampc_loader_global_samples(l, start + k);
          ok &= gn == one.n[k];
          int lo = (int)(r * gn / W), n = (int)((r + 1) * gn / W) - lo;
          ok &= mine.n[k] == n;
          for (int i = 0; ok && i < n; i++) {
            ok &= memcmp(mine.x + (size_t)k * mine.xbytes + (size_t)i * es, one.x + (size_t)k * one.xbytes + (size_t)(lo + i) * es, es) == 0;
            ok &= mine.y[(size_t)k * 4 + (size_t)i] == one.y[(size_t)k * one.batch + (size_t)(lo + i)];
          }
          seen += mine.n[k];
        }
        dump_free(&mine);
        ampc_loader_free(l);
      }
      CHECK_MSG(ok, "%d ranks (start %d): not the single process's batches", W, start);
      int64_t total = 0;
      for (int64_t k = 0; k < one.nb; k++) total += one.n[k];
      CHECK(seen == total);
      dump_free(&one);
    }
  }
  ampc_loader_opts o = opts_plain(4);
  ampc_loader *l = NULL;
  o.world_size = 2;
  o.rank = 2;
  CHECK_ERR(ampc_loader_create(&l, d, &o), AMPC_EINVAL, "rank 2 outside 0..1");
  ampc_dataset_free(d);
}

TEST(loader_defaults) {
  ampc_loader_opts o;
  memset(&o, 0x5a, sizeof o);
  ampc_loader_opts_default(&o);
  CHECK(o.batch_size == 128 && o.shuffle == 1 && o.seed == 0 && o.drop_last == 0);
  CHECK(o.normalize == 1 && o.random_crop_padding == 0 && o.hflip == 0);
  CHECK(o.dtype == AMPC_DTYPE_F32 && o.background == 1);
}

TEST(loader_order) {
  const size_t N = 23;
  ampc_dataset *d = synthetic(N, 3, 4, 5);
  if (!d) return;
  ampc_loader_opts o = opts_plain(5);
  o.seed = 42;
  dump e0 = run(d, &o, 0, 0);
  CHECK(e0.nb == 5);
  CHECK(e0.n[0] == 5 && e0.n[3] == 5 && e0.n[4] == 3);

  /* A permutation, and x holds each sample's normalised pixels. */
  int32_t order[23], order1[23];
  size_t count;
  dump_order(&e0, order, &count);
  CHECK(count == N);
  int seen[23] = {0}, identity = 1, badx = 0;
  const size_t E = elems_of(d);
  float mean[3], std[3];
  ampc_dataset_norm(d, mean, std);
  for (size_t p = 0; p < count; p++) {
    CHECK(order[p] >= 0 && order[p] < 23);
    if (order[p] < 0 || order[p] >= 23) continue;
    seen[order[p]]++;
    if (order[p] != (int32_t)p) identity = 0;
    const float *x = (const float *)(e0.x + (p / 5) * e0.xbytes) + (p % 5) * E;
    for (size_t j = 0; j < E; j++) {
      int c = (int)(j / 20);
      float want = ((float)d->images[(size_t)order[p] * E + j] / 255.0f - mean[c]) / std[c];
      if (x[j] != want) badx++;
    }
  }
  for (size_t i = 0; i < N; i++) CHECK(seen[i] == 1);
  CHECK(!identity);
  CHECK(badx == 0);
  /* The short last batch is zero past its 3 samples. */
  const float *last = (const float *)(e0.x + 4 * e0.xbytes);
  int nonzero = 0;
  for (size_t j = 3 * E; j < 5 * E; j++) nonzero += last[j] != 0.0f;
  CHECK(nonzero == 0);
  CHECK(e0.y[4 * 5 + 3] == 0 && e0.y[4 * 5 + 4] == 0);

  /* Reproducible; another epoch or seed gives another order. */
  dump again = run(d, &o, 0, 0);
  CHECK(dump_same(&e0, 0, &again));
  dump e1 = run(d, &o, 1, 0);
  dump_order(&e1, order1, &count);
  CHECK(count == N && memcmp(order, order1, sizeof order) != 0);
  /* ampc_loader_epoch_order tells the same orders without running an epoch */
  {
    ampc_loader *l = NULL;
    size_t got[23];
    CHECK_OK(ampc_loader_create(&l, d, &o));
    if (l) {
      CHECK_OK(ampc_loader_epoch_order(l, 0, got));
      for (size_t p = 0; p < N; p++) CHECK(got[p] == (size_t)order[p]);
      CHECK_OK(ampc_loader_epoch_order(l, 1, got));
      for (size_t p = 0; p < N; p++) CHECK(got[p] == (size_t)order1[p]);
      CHECK_ERR(ampc_loader_epoch_order(l, -1, got), AMPC_EINVAL, "epoch");
      CHECK(ampc_loader_epoch(l) == -1 && ampc_loader_position(l) == 0);
    }
    ampc_loader_free(l);
  }
  o.seed = 43;
  dump s1 = run(d, &o, 0, 0);
  dump_order(&s1, order1, &count);
  CHECK(count == N && memcmp(order, order1, sizeof order) != 0);

  /* No shuffle: file order, every epoch. */
  o.shuffle = 0;
  dump ns = run(d, &o, 3, 0);
  dump_order(&ns, order1, &count);
  for (size_t p = 0; p < N; p++) CHECK(order1[p] == (int32_t)p);

  /* Without normalisation, pixel / 255. */
  o.normalize = 0;
  dump raw = run(d, &o, 0, 0);
  CHECK(((const float *)raw.x)[7] == (float)d->images[7] / 255.0f);

  dump_free(&e0);
  dump_free(&again);
  dump_free(&e1);
  dump_free(&s1);
  dump_free(&ns);
  dump_free(&raw);
  ampc_dataset_free(d);
}

TEST(loader_batches) {
  ampc_dataset *d = synthetic(23, 1, 2, 3);
  if (!d) return;
  ampc_loader_opts o = opts_plain(5);
  o.drop_last = 1;
  dump r = run(d, &o, 0, 0);
  CHECK(r.nb == 4);
  int32_t order[23];
  size_t count;
  dump_order(&r, order, &count);
  CHECK(count == 20);
  int seen[23] = {0};
  for (size_t p = 0; p < count; p++)
    if (order[p] >= 0 && order[p] < 23) seen[order[p]]++;
  int dup = 0;
  for (int i = 0; i < 23; i++) dup += seen[i] > 1;
  CHECK(dup == 0);
  for (int k = 0; k < 4; k++) CHECK(r.n[k] == 5);
  dump_free(&r);

  /* A batch larger than the dataset: nothing with drop_last, one short batch without. */
  o.batch_size = 30;
  r = run(d, &o, 0, 0);
  CHECK(r.nb == 0);
  dump_free(&r);
  o.drop_last = 0;
  r = run(d, &o, 0, 0);
  CHECK(r.nb == 1 && r.n[0] == 23);
  dump_free(&r);
  o.batch_size = 23;
  r = run(d, &o, 0, 0);
  CHECK(r.nb == 1 && r.n[0] == 23);
  dump_free(&r);
  o.batch_size = 1;
  r = run(d, &o, 0, 0);
  CHECK(r.nb == 23);
  dump_free(&r);
  ampc_dataset_free(d);
}

TEST(loader_resume) {
  ampc_dataset *d = synthetic(37, 3, 6, 6);
  if (!d) return;
  for (int bg = 0; bg < 2; bg++) {
    ampc_loader_opts o = opts_plain(4);
    o.seed = 7;
    o.random_crop_padding = 2;
    o.hflip = 1;
    o.background = bg;
    dump full = run(d, &o, 2, 0);
    CHECK(full.nb == 10);
    for (int64_t k = 0; k <= full.nb; k++) {
      dump part = run(d, &o, 2, k);
      CHECK_MSG(dump_same(&full, k, &part), "bg %d start %lld", bg, (long long)k);
      dump_free(&part);
    }
    dump_free(&full);
  }
  ampc_dataset_free(d);
}

TEST(loader_background) {
  ampc_dataset *d = synthetic(41, 3, 5, 7);
  if (!d) return;
  const ampc_dtype types[3] = {AMPC_DTYPE_F32, AMPC_DTYPE_F16, AMPC_DTYPE_BF16};
  for (int t = 0; t < 3; t++) {
    ampc_loader_opts o = opts_plain(6);
    o.seed = 99;
    o.random_crop_padding = 3;
    o.hflip = 1;
    o.dtype = types[t];
    ampc_loader *fg = NULL, *bg = NULL;
    CHECK_OK(ampc_loader_create(&fg, d, &o));
    o.background = 1;
    CHECK_OK(ampc_loader_create(&bg, d, &o));
    if (!fg || !bg) {
      ampc_loader_free(fg);
      ampc_loader_free(bg);
      continue;
    }
    for (int64_t e = 0; e < 3; e++) {
      dump a = run_epoch(fg, d, &o, e, 0), b = run_epoch(bg, d, &o, e, 0);
      CHECK_MSG(dump_same(&a, 0, &b), "dtype %s epoch %lld", ampc_dtype_name(types[t]),
                (long long)e);
      dump_free(&a);
      dump_free(&b);
    }
    /* Restarting mid-epoch abandons the prefetched batches cleanly. */
    void *x = malloc((size_t)o.batch_size * elems_of(d) * 4);
    int32_t y[6];
    int n;
    CHECK_OK(ampc_loader_start_epoch(bg, 5, 0));
    CHECK_OK(ampc_loader_next(bg, x, y, &n));
    CHECK_OK(ampc_loader_next(bg, x, y, &n));
    CHECK(ampc_loader_position(bg) == 2 && ampc_loader_epoch(bg) == 5);
    dump a = run_epoch(fg, d, &o, 1, 3), b = run_epoch(bg, d, &o, 1, 3);
    CHECK(dump_same(&a, 0, &b));
    dump_free(&a);
    dump_free(&b);
    free(x);
    ampc_loader_free(fg);
    ampc_loader_free(bg);
  }
  ampc_dataset_free(d);
}

TEST(loader_free_midway) {
  /* Free with the worker idle, prefetching, or just started; never hangs. */
  ampc_dataset *d = synthetic(300, 3, 16, 16);
  if (!d) return;
  ampc_loader_opts o = opts_plain(8);
  o.background = 1;
  o.random_crop_padding = 4;
  float *x = malloc(8 * elems_of(d) * sizeof(float));
  int32_t y[8];
  for (int i = 0; i < 30; i++) {
    ampc_loader *l = NULL;
    CHECK_OK(ampc_loader_create(&l, d, &o));
    if (!l) break;
    if (i % 3 >= 1) CHECK_OK(ampc_loader_start_epoch(l, i, 0));
    if (i % 3 == 2) {
      int n;
      CHECK_OK(ampc_loader_next(l, x, y, &n));
      CHECK(n == 8);
    }
    ampc_loader_free(l);
  }
  ampc_loader_free(NULL);
  free(x);
  ampc_dataset_free(d);
}

TEST(loader_half_types) {
  ampc_dataset *d = synthetic(19, 3, 4, 4);
  if (!d) return;
  ampc_loader_opts o = opts_plain(4);
  o.seed = 5;
  o.random_crop_padding = 1;
  o.hflip = 1;
  dump f = run(d, &o, 1, 0);
  o.dtype = AMPC_DTYPE_F16;
  dump h = run(d, &o, 1, 0);
  o.dtype = AMPC_DTYPE_BF16;
  dump b = run(d, &o, 1, 0);
  CHECK(f.nb == h.nb && f.nb == b.nb);
  size_t total = (size_t)f.nb * (size_t)o.batch_size * elems_of(d);
  const float *fx = (const float *)f.x;
  const uint16_t *hx = (const uint16_t *)h.x, *bx = (const uint16_t *)b.x;
  int badh = 0, badb = 0;
  for (size_t i = 0; i < total; i++) {
    badh += hx[i] != ampc_f32_to_f16(fx[i]);
    badb += bx[i] != ampc_f32_to_bf16(fx[i]);
  }
  CHECK(badh == 0 && badb == 0);
  CHECK(memcmp(f.y, h.y, (size_t)f.nb * 4 * sizeof(int32_t)) == 0);
  dump_free(&f);
  dump_free(&h);
  dump_free(&b);
  ampc_dataset_free(d);
}

/* The crop/flip of img (C, H, W) built the slow way: pad into a (H+2P,
 * W+2P) canvas of zeros, take the window at (oy, ox), mirror if flip. */
static void reference_aug(const uint8_t *img, int C, int H, int W, int P, int oy, int ox, int flip,
                          int16_t *out) {
  int PH = H + 2 * P, PW = W + 2 * P;
  int16_t *canvas = calloc((size_t)(C * PH * PW), sizeof *canvas);
  for (int c = 0; c < C; c++)
    for (int y = 0; y < H; y++)
      for (int x = 0; x < W; x++)
        canvas[(c * PH + y + P) * PW + x + P] = img[(c * H + y) * W + x];
  for (int c = 0; c < C; c++)
    for (int y = 0; y < H; y++)
      for (int x = 0; x < W; x++) {
        int cx = flip ? W - 1 - x : x;
        out[(c * H + y) * W + x] = canvas[(c * PH + y + oy) * PW + cx + ox];
      }
  free(canvas);
}

TEST(loader_crop_flip) {
  /* 200 copies of one image with distinct non-zero pixels, so each output
   * identifies the crop offset and flip that made it. */
  const int C = 3, H = 6, W = 7, P = 2, N = 200;
  ampc_dataset *d = NULL;
  CHECK_OK(ampc__dataset_alloc(&d, AMPC_DATASET_CIFAR10, (size_t)N, C, H, W, 10));
  if (!d) return;
  const size_t E = (size_t)(C * H * W);
  for (int i = 0; i < N; i++)
    for (size_t j = 0; j < E; j++) d->images[(size_t)i * E + j] = (uint8_t)(j + 1);
  ampc_loader_opts o = opts_plain(N);
  o.normalize = 0;
  o.random_crop_padding = P;
  o.hflip = 1;
  o.seed = 11;
  int16_t *ref = malloc(E * sizeof *ref);
  int hist_oy[5] = {0}, hist_ox[5] = {0}, flips = 0, bad = 0, unmatched = 0, total = 0;
  for (int64_t e = 0; e < 3; e++) {
    dump r = run(d, &o, e, 0);
    CHECK(r.nb == 1);
    for (int p = 0; p < N; p++) {
      const float *x = (const float *)r.x + (size_t)p * E;
      /* Which candidate is it? Exactly one must match. */
      int matches = 0, moy = -1, mox = -1, mflip = -1;
      for (int oy = 0; oy <= 2 * P; oy++)
        for (int ox = 0; ox <= 2 * P; ox++)
          for (int fl = 0; fl < 2; fl++) {
            reference_aug(d->images, C, H, W, P, oy, ox, fl, ref);
            int same = 1;
            for (size_t j = 0; j < E && same; j++) same = x[j] == (float)ref[j] / 255.0f;
            if (same) {
              matches++;
              moy = oy;
              mox = ox;
              mflip = fl;
            }
          }
      unmatched += matches != 1;
      int oy, ox, fl;
      ampc__loader_aug_params(o.seed, e, (uint64_t)p, P, 1, &oy, &ox, &fl);
      bad += oy != moy || ox != mox || fl != mflip;
      if (oy >= 0 && oy <= 4 && ox >= 0 && ox <= 4) {
        hist_oy[oy]++;
        hist_ox[ox]++;
      }
      flips += fl;
      total++;
    }
    dump_free(&r);
  }
  CHECK(unmatched == 0);
  CHECK(bad == 0);
  for (int i = 0; i <= 2 * P; i++) CHECK(hist_oy[i] > total / 10 && hist_ox[i] > total / 10);
  CHECK(flips > total * 4 / 10 && flips < total * 6 / 10);

  /* With normalisation the padding is black normalised: (0 - mean) / std. A
   * crop with oy = 0 has its top P rows padded. */
  o.normalize = 1;
  dump r = run(d, &o, 0, 0);
  float mean[3], std[3];
  ampc_dataset_norm(d, mean, std);
  int checked = 0, badpad = 0;
  for (int p = 0; p < N; p++) {
    int oy, ox, fl;
    ampc__loader_aug_params(o.seed, 0, (uint64_t)p, P, 1, &oy, &ox, &fl);
    if (oy != 0) continue;
    const float *x = (const float *)r.x + (size_t)p * E;
    for (int c = 0; c < C; c++)
      for (int j = 0; j < P * W; j++) badpad += x[c * H * W + j] != (0.0f - mean[c]) / std[c];
    checked++;
  }
  CHECK(checked > 0 && badpad == 0);
  dump_free(&r);

  /* Neither crop nor flip: the image itself. */
  o.normalize = 0;
  o.random_crop_padding = 0;
  o.hflip = 0;
  r = run(d, &o, 0, 0);
  int differ = 0;
  for (size_t j = 0; j < (size_t)N * E; j++)
    differ += ((const float *)r.x)[j] != (float)d->images[j] / 255.0f;
  CHECK(differ == 0);
  dump_free(&r);
  /* Flip only: every output is the image or its mirror, both occur. */
  o.hflip = 1;
  r = run(d, &o, 0, 0);
  int mirrored = 0, plain = 0;
  for (int p = 0; p < N; p++) {
    const float *x = (const float *)r.x + (size_t)p * E;
    int is_plain = 1, is_mirror = 1;
    for (int c = 0; c < C; c++)
      for (int y = 0; y < H; y++)
        for (int xx = 0; xx < W; xx++) {
          float v = x[(c * H + y) * W + xx];
          is_plain &= v == (float)d->images[(c * H + y) * W + xx] / 255.0f;
          is_mirror &= v == (float)d->images[(c * H + y) * W + (W - 1 - xx)] / 255.0f;
        }
    plain += is_plain;
    mirrored += is_mirror;
  }
  CHECK(plain + mirrored == N && plain > 0 && mirrored > 0);
  dump_free(&r);
  free(ref);
  ampc_dataset_free(d);
}

TEST(loader_errors) {
  ampc_dataset *d = synthetic(10, 1, 3, 3);
  if (!d) return;
  ampc_loader *l = (ampc_loader *)1;
  ampc_loader_opts o = opts_plain(0);
  CHECK_ERR(ampc_loader_create(&l, d, &o), AMPC_EINVAL, "batch_size must be >= 1, got 0");
  CHECK(l == NULL);
  o = opts_plain(4);
  o.random_crop_padding = -1;
  CHECK_ERR(ampc_loader_create(&l, d, &o), AMPC_EINVAL, "random_crop_padding");
  o = opts_plain(4);
  o.dtype = AMPC_DTYPE_I32;
  CHECK_ERR(ampc_loader_create(&l, d, &o), AMPC_EINVAL, "dtype must be f32, f16 or bf16, got i32");
  o = opts_plain(4);
  for (int bg = 0; bg < 2; bg++) {
    o.background = bg;
    l = NULL;
    CHECK_OK(ampc_loader_create(&l, d, &o));
    if (!l) continue;
    CHECK(ampc_loader_batches_per_epoch(l) == 3);
    CHECK(ampc_loader_epoch(l) == -1);
    float x[4 * 9];
    int32_t y[4];
    int n = 5;
    CHECK_ERR(ampc_loader_next(l, x, y, &n), AMPC_ESTATE, "call ampc_loader_start_epoch");
    CHECK(n == 0);
    CHECK_ERR(ampc_loader_start_epoch(l, 0, 4), AMPC_EINVAL, "start_batch 4 out of range [0, 3]");
    CHECK_ERR(ampc_loader_start_epoch(l, 0, -1), AMPC_EINVAL, "start_batch");
    CHECK_ERR(ampc_loader_start_epoch(l, -1, 0), AMPC_EINVAL, "epoch must be >= 0");
    CHECK_OK(ampc_loader_start_epoch(l, 0, 3));
    n = 5;
    CHECK_OK(ampc_loader_next(l, x, y, &n));
    CHECK(n == 0);
    ampc_loader_free(l);
  }
  ampc_dataset_free(d);
}

/* Probing reads headers only, agrees with a full read, and the pair check
 * refuses a test set of another shape naming both files (issue 11). */
TEST(probe_and_pair) {
  const char *dir = case_dir("probe");
  idx_write_split(dir, "train", 6, 0);
  idx_write_split(dir, "t10k", 3, 1);
  ampc_dataset_info tr, te;
  CHECK_OK(ampc_dataset_probe(&tr, AMPC_DATASET_FASHION_MNIST, dir, 1, 0));
  CHECK_OK(ampc_dataset_probe(&te, AMPC_DATASET_FASHION_MNIST, dir, 0, 2));
  CHECK(tr.train == 1 && tr.count == 6 && tr.channels == 1 && tr.height == 5 && tr.width == 4 && tr.classes == 10);
  CHECK(te.train == 0 && te.count == 2 && strstr(te.images, "t10k-images-idx3-ubyte.gz"));
  CHECK_OK(ampc_dataset_check_pair(&tr, &te));
  ampc_dataset *d;
  CHECK_OK(ampc_dataset_open(&d, AMPC_DATASET_FASHION_MNIST, dir, 1, 0));
  CHECK(ampc_dataset_count(d) == tr.count && ampc_dataset_height(d) == tr.height && ampc_dataset_width(d) == tr.width);
  ampc_dataset_free(d);
  /* a test set of 7x4 images: refused, naming both files and shapes */
  buf im = {0};
  idx_images(&im, 0x803, 3, 7, 4, 3);
  write_file(dir, "t10k-images-idx3-ubyte", im.p, im.n, 1);
  buf_free(&im);
  CHECK_OK(ampc_dataset_probe(&te, AMPC_DATASET_FASHION_MNIST, dir, 0, 0));
  CHECK(ampc_dataset_check_pair(&tr, &te) == AMPC_EINVAL);
  const char *msg = ampc_last_error();
  CHECK_MSG(strstr(msg, "t10k-images-idx3-ubyte.gz has 1x7x4 images") && strstr(msg, "train-images-idx3-ubyte has 1x5x4 images"), "%s", msg);
  /* a header that claims more than the file holds fails in the probe, as in the read */
  idx_images(&im, 0x803, 1000, 5, 4, 3);
  write_file(dir, "train-images-idx3-ubyte", im.p, im.n, 0);
  buf_free(&im);
  CHECK(ampc_dataset_probe(&tr, AMPC_DATASET_FASHION_MNIST, dir, 1, 0) == AMPC_EFORMAT);
  /* CIFAR: sizes only */
  const char *cdir = case_dir("probe_cifar");
  write_cifar(cdir, "test_batch.bin", 1, 0, 3);
  CHECK_OK(ampc_dataset_probe(&te, AMPC_DATASET_CIFAR10, cdir, 0, 0));
  CHECK(te.count == 3 && te.channels == 3 && te.height == 32 && te.width == 32 && te.classes == 10);
}

/* A FIFO or a folder where a data file should be is refused at once (it
 * would block in open()); a file that cannot be opened says why. */
TEST(special_files) {
  const char *dir = case_dir("special");
  idx_write_split(dir, "train", 4, 0);
  char p[1400];
  snprintf(p, sizeof p, "%s/train-labels-idx1-ubyte", dir);
  unlink(p);
  CHECK(mkfifo(p, 0644) == 0);
  ampc_dataset *d = NULL;
  CHECK(ampc_dataset_open(&d, AMPC_DATASET_MNIST, dir, 1, 0) == AMPC_EIO && d == NULL);
  CHECK_MSG(strstr(ampc_last_error(), "train-labels-idx1-ubyte is not a regular file"), "%s", ampc_last_error());
  unlink(p);
  CHECK(mkdir(p, 0755) == 0);
  ampc_dataset_info info;
  CHECK(ampc_dataset_probe(&info, AMPC_DATASET_MNIST, dir, 1, 0) == AMPC_EIO);
  CHECK(strstr(ampc_last_error(), "is not a regular file") != NULL);
  rmdir(p);
  const char *cdir = case_dir("special_cifar");
  snprintf(p, sizeof p, "%s/test_batch.bin", cdir);
  unlink(p);
  CHECK(mkfifo(p, 0644) == 0);
  CHECK(ampc_dataset_open(&d, AMPC_DATASET_CIFAR10, cdir, 0, 0) == AMPC_EIO);
  CHECK(strstr(ampc_last_error(), "test_batch.bin is not a regular file") != NULL);
  unlink(p);
  if (geteuid() != 0) { /* root reads anything */
    idx_write_split(dir, "t10k", 2, 0);
    snprintf(p, sizeof p, "%s/t10k-images-idx3-ubyte", dir);
    CHECK(chmod(p, 0) == 0);
    CHECK(ampc_dataset_open(&d, AMPC_DATASET_MNIST, dir, 0, 0) == AMPC_EIO);
    CHECK_MSG(strstr(ampc_last_error(), "Permission denied"), "%s", ampc_last_error());
    chmod(p, 0644);
  }
}

TEST_MAIN(TEST_ENTRY(probe_and_pair), TEST_ENTRY(special_files), TEST_ENTRY(idx_roundtrip), TEST_ENTRY(idx_errors), TEST_ENTRY(cifar10_roundtrip),
          TEST_ENTRY(cifar100_roundtrip), TEST_ENTRY(cifar_errors), TEST_ENTRY(dataset_kinds),
          TEST_ENTRY(loader_defaults), TEST_ENTRY(loader_order), TEST_ENTRY(loader_batches),
          TEST_ENTRY(loader_resume), TEST_ENTRY(loader_background), TEST_ENTRY(loader_free_midway),
          TEST_ENTRY(loader_half_types), TEST_ENTRY(loader_crop_flip), TEST_ENTRY(loader_errors), TEST_ENTRY(loader_ranks))
