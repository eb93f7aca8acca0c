/* The CIFAR-10 / CIFAR-100 "binary version" reader.
 *
 * Each file is a run of fixed-size records with no header: CIFAR-10 has one
 * label byte then 3072 pixel bytes; CIFAR-100 a coarse label byte (20
 * classes), a fine label byte (100 classes), then 3072 pixel bytes. The
 * pixels are three 32x32 planes R, G, B, i.e. already (C, H, W). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/status_internal.h"
#include "data/data_internal.h"
#include "io/fsutil_internal.h"

#define CIFAR_C 3
#define CIFAR_HW 32
#define CIFAR_PIXELS (CIFAR_C * CIFAR_HW * CIFAR_HW)
#define CIFAR_MAX_FILES 5
/* Records read per fread. */
#define CIFAR_CHUNK 512

typedef struct {
  const char *prefix;
  int label_bytes; /* 1 or 2; the last one is the label used */
  int classes;
  int nfiles;
  const char *files[CIFAR_MAX_FILES];
  size_t expected; /* records per file in the published set, for messages */
} cifar_layout;

static void cifar_layout_get(cifar_layout *L, ampc_dataset_kind kind, int train) {
  static const char *const c10_train[] = {"data_batch_1.bin", "data_batch_2.bin",
                                          "data_batch_3.bin", "data_batch_4.bin",
                                          "data_batch_5.bin"};
  memset(L, 0, sizeof *L);
  L->prefix = ampc_dataset_kind_name(kind);
  if (kind == AMPC_DATASET_CIFAR10) {
    L->label_bytes = 1;
    L->classes = 10;
    L->expected = 10000;
    if (train) {
      L->nfiles = 5;
      memcpy(L->files, c10_train, sizeof c10_train);
    } else {
      L->nfiles = 1;
      L->files[0] = "test_batch.bin";
    }
  } else {
    L->label_bytes = 2;
    L->classes = 100;
    L->expected = train ? 50000 : 10000;
    L->nfiles = 1;
    L->files[0] = train ? "train.bin" : "test.bin";
  }
}

static ampc_status cifar_path(char *buf, size_t size, const cifar_layout *L, const char *dir,
                              const char *file) {
  int len = snprintf(buf, size, "%s/%s", dir, file);
  if (len < 0 || (size_t)len >= size)
    return ampc__error(AMPC_EINVAL, "%s: directory name too long: %s", L->prefix, dir);
  return AMPC_OK;
}

static ampc_status cifar_truncated(const cifar_layout *L, const char *file, size_t complete,
                                   unsigned long long bytes, size_t rec) {
  /* (the file's own size says only that a record is cut: whether one is
   * missing its end or the file has bytes past its last one, either way) */
  return ampc__error(AMPC_EFORMAT,
                     "%s: %s: %llu bytes is not a whole number of %zu-byte records (%zu whole ones and %llu bytes: "
                     "truncated, or bytes past the last record; the published file has %zu)",
                     L->prefix, file, bytes, rec, complete, bytes % rec, L->expected);
}

/* Opens path without blocking (a FIFO is refused, not waited on) and only if
 * it is a regular file; *bytes is its size. */
static ampc_status cifar_open(const cifar_layout *L, const char *path, const char *dir,
                              const char *file, int *fd, unsigned long long *bytes) {
  struct stat st;
  *fd = ampc__open_input(path, &st);
  if (*fd == AMPC__NOT_REGULAR)
    return ampc__error(AMPC_EIO, "%s: %s is not a regular file", L->prefix, path);
  if (*fd < 0) {
    if (errno == ENOENT)
      return ampc__error(AMPC_ENOTFOUND, "%s: cannot find %s in %s", L->prefix, file, dir);
    return ampc__error(AMPC_EIO, "%s: cannot open %s: %s", L->prefix, path, strerror(errno));
  }
  *bytes = (unsigned long long)st.st_size;
  return AMPC_OK;
}

/* Reads take records of one file into images/labels (already sized). */
static ampc_status cifar_read_file(const cifar_layout *L, const char *path, const char *dir,
                                   const char *file, size_t take, uint8_t *images,
                                   int32_t *labels, uint8_t *buf) {
  const size_t rec = (size_t)L->label_bytes + CIFAR_PIXELS;
  int fd = -1;
  unsigned long long bytes = 0;
  AMPC_TRY(cifar_open(L, path, dir, file, &fd, &bytes));
  FILE *f = fdopen(fd, "rb");
  if (!f) {
    close(fd);
    return ampc__error(AMPC_ENOMEM, "%s: cannot open %s: %s", L->prefix, path, strerror(errno));
  }
  ampc_status s = AMPC_OK;
  for (size_t done = 0; s == AMPC_OK && done < take;) {
    size_t want = take - done < CIFAR_CHUNK ? take - done : CIFAR_CHUNK;
    size_t got = fread(buf, rec, want, f);
    if (got < want) {
      /* The size was checked, so the file changed or the read failed. */
      if (ferror(f))
        s = ampc__error(AMPC_EIO, "%s: %s: read error: %s", L->prefix, file, strerror(errno));
      else
        s = ampc__error(AMPC_EFORMAT, "%s: %s: truncated at record %zu of %zu", L->prefix, file,
                        done + got, take);
      break;
    }
    for (size_t r = 0; r < want; r++) {
      const uint8_t *p = buf + r * rec;
      size_t idx = done + r;
      if (L->label_bytes == 2 && p[0] >= 20) {
        s = ampc__error(AMPC_EFORMAT, "%s: %s: record %zu: coarse label %u out of range [0, 20)",
                        L->prefix, file, idx, p[0]);
        break;
      }
      unsigned label = p[L->label_bytes - 1];
      if (label >= (unsigned)L->classes) {
        s = ampc__error(AMPC_EFORMAT, "%s: %s: record %zu: label %u out of range [0, %d)",
                        L->prefix, file, idx, label, L->classes);
        break;
      }
      labels[idx] = (int32_t)label;
      memcpy(images + idx * CIFAR_PIXELS, p + L->label_bytes, CIFAR_PIXELS);
    }
    done += want;
  }
  fclose(f);
  return s;
}

/* Pass 1: finds and sizes the files, only as many as limit needs. */
static ampc_status cifar_sizes(const cifar_layout *L, const char *dir, size_t limit,
                               size_t counts[CIFAR_MAX_FILES], int *used_out, size_t *total_out) {
  const size_t rec = (size_t)L->label_bytes + CIFAR_PIXELS;
  char path[4096];
  size_t total = 0;
  int used = 0;
  for (; used < L->nfiles && !(limit && total >= limit); used++) {
    AMPC_TRY(cifar_path(path, sizeof path, L, dir, L->files[used]));
    int fd = -1;
    unsigned long long bytes = 0;
    AMPC_TRY(cifar_open(L, path, dir, L->files[used], &fd, &bytes));
    close(fd);
    if (bytes == 0) return ampc__error(AMPC_EFORMAT, "%s: %s: empty file", L->prefix, L->files[used]);
    if (bytes % rec) return cifar_truncated(L, L->files[used], (size_t)(bytes / rec), bytes, rec);
    counts[used] = (size_t)(bytes / rec);
    total += counts[used];
    /* bounded before anything is allocated: this much is not CIFAR */
    size_t n = limit && limit < total ? limit : total;
    if ((unsigned long long)n * CIFAR_PIXELS >= AMPC_DATASET_MAX_BYTES ||
        (unsigned long long)counts[used] * CIFAR_PIXELS >= AMPC_DATASET_MAX_BYTES)
      return ampc__error(AMPC_EFORMAT, "%s: %s: %zu records (%zu images in all), over the 2 GiB limit",
                         L->prefix, L->files[used], counts[used], total);
  }
  *used_out = used;
  *total_out = total;
  return AMPC_OK;
}

ampc_status ampc__cifar_probe(ampc_dataset_info *info, ampc_dataset_kind kind, const char *dir,
                              int train, size_t limit) {
  cifar_layout L;
  cifar_layout_get(&L, kind, train);
  size_t counts[CIFAR_MAX_FILES] = {0}, total = 0;
  int used = 0;
  AMPC_TRY(cifar_sizes(&L, dir, limit, counts, &used, &total));
  info->count = limit && limit < total ? limit : total;
  info->channels = CIFAR_C;
  info->height = info->width = CIFAR_HW;
  info->classes = L.classes;
  snprintf(info->images, sizeof info->images, "%s/%s", dir, L.files[0]);
  return AMPC_OK;
}

ampc_status ampc__cifar_read(ampc_dataset **out, ampc_dataset_kind kind, const char *dir,
                             int train, size_t limit) {
  cifar_layout L;
  cifar_layout_get(&L, kind, train);
  const size_t rec = (size_t)L.label_bytes + CIFAR_PIXELS;
  char path[4096];
  size_t counts[CIFAR_MAX_FILES] = {0}, total = 0;
  int used = 0;
  AMPC_TRY(cifar_sizes(&L, dir, limit, counts, &used, &total));
  size_t n = limit && limit < total ? limit : total;

  /* Pass 2: read. */
  ampc_dataset *d;
  AMPC_TRY(ampc__dataset_alloc(&d, kind, n, CIFAR_C, CIFAR_HW, CIFAR_HW, L.classes));
  uint8_t *buf = malloc(rec * CIFAR_CHUNK);
  ampc_status s = buf ? AMPC_OK : ampc__error(AMPC_ENOMEM, "%s: out of memory", L.prefix);
  size_t at = 0;
  for (int i = 0; s == AMPC_OK && i < used && at < n; i++) {
    size_t take = counts[i] < n - at ? counts[i] : n - at;
    s = cifar_path(path, sizeof path, &L, dir, L.files[i]);
    if (s == AMPC_OK)
      s = cifar_read_file(&L, path, dir, L.files[i], take, d->images + at * CIFAR_PIXELS,
                          d->labels + at, buf);
    at += take;
  }
  free(buf);
  if (s < 0) {
    ampc_dataset_free(d);
    return s;
  }
  *out = d;
  return AMPC_OK;
}
