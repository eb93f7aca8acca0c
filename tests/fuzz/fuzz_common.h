/* Shared by the file-reader fuzz targets: a private temporary folder made once
 * per process, and writing a fuzz input (or part of it) into a file there.
 *
 * The readers take folders, not buffers, so each input goes through the file
 * system; the folder lives on for the process (libFuzzer calls the target
 * millions of times) and is removed at a normal exit. A crash, an
 * out-of-memory or a timeout ends the process without atexit handlers and
 * leaves $TMPDIR/ampc-fuzz-XXXXXX (a few KB) behind. */
#ifndef AMPC_FUZZ_COMMON_H
#define AMPC_FUZZ_COMMON_H

#include <dirent.h>
#include <stdint.h>
#include <errno.h>
#include <stdio.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char fuzz__dir[256];

static void fuzz__cleanup(void) {
  DIR *d = opendir(fuzz__dir);
  if (d) {
    struct dirent *e;
    char p[512];
    while ((e = readdir(d)) != NULL) {
      if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
      snprintf(p, sizeof p, "%s/%s", fuzz__dir, e->d_name);
      unlink(p);
    }
    closedir(d);
  }
  rmdir(fuzz__dir);
}

/* The per-process folder, made on first use; aborts if none can be made
 * (a broken machine, not a finding). */
static const char *fuzz_dir(void) {
  if (fuzz__dir[0]) return fuzz__dir;
  const char *tmp = getenv("TMPDIR");
  snprintf(fuzz__dir, sizeof fuzz__dir, "%s/ampc-fuzz-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(fuzz__dir)) {
    perror("fuzz: mkdtemp");
    abort();
  }
  atexit(fuzz__cleanup);
  return fuzz__dir;
}

/* Replaces dir/name with the n bytes at p. */
static void fuzz_write(const char *name, const uint8_t *p, size_t n) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", fuzz_dir(), name);
  FILE *f = fopen(path, "wb");
  if (!f && errno == ENOENT && mkdir(fuzz__dir, 0700) == 0) f = fopen(path, "wb"); /* the folder was removed under us */
  if (!f || (n && fwrite(p, 1, n, f) != n) || fclose(f) != 0) {
    perror("fuzz: writing the input file");
    abort();
  }
}

/* Stops the run on a broken invariant of a successful read (the checks
 * below are what the readers promise in data.h / safetensors.h). */
#define FUZZ_CHECK(cond)                                                        \
  do {                                                                          \
    if (!(cond)) {                                                              \
      fprintf(stderr, "fuzz: %s:%d: invariant `%s` broken\n", __FILE__, __LINE__, \
              #cond);                                                           \
      abort();                                                                  \
    }                                                                           \
  } while (0)

#endif
