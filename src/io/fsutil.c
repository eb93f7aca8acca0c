/* Atomic file writing: temporary file, fsync, rename, fsync of the folder. */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/status_internal.h"
#include "io/fsutil_internal.h"

struct ampc__wfile {
  FILE *fp;
  const char *path; /* the target, for messages */
  uint64_t written;
};

/* Bytes left before the injected failure; -1 when disarmed. Per thread, so a
 * test arming it cannot disturb writes made by other threads. */
static _Thread_local long long fail_budget = -1;

void ampc__fsutil_fail_after(long long bytes) { fail_budget = bytes < 0 ? -1 : bytes; }

uint64_t ampc__wfile_tell(const ampc__wfile *w) { return w->written; }

static ampc_status write_error(ampc__wfile *w, int err) {
  return ampc__error(AMPC_EIO, "%s: write failed after %llu bytes: %s (%s was not changed)",
                     w->path, (unsigned long long)w->written, strerror(err), w->path);
}

ampc_status ampc__wfile_write(ampc__wfile *w, const void *p, size_t n) {
  if (n == 0) return AMPC_OK;
  size_t todo = n;
  int injected = 0;
  if (fail_budget >= 0 && (unsigned long long)fail_budget < n) {
    todo = (size_t)fail_budget;
    injected = 1;
    fail_budget = -1;
  } else if (fail_budget >= 0) {
    fail_budget -= (long long)n;
  }
  size_t done = todo ? fwrite(p, 1, todo, w->fp) : 0;
  w->written += done;
  if (injected) return write_error(w, ENOSPC);
  if (done != todo) return write_error(w, errno ? errno : EIO);
  return AMPC_OK;
}

/* Splits path into its folder ("." when it has none) and its last component. */
static ampc_status split_path(const char *path, char **dir, const char **base) {
  const char *slash = strrchr(path, '/');
  if (!slash) {
    *dir = strdup(".");
    *base = path;
  } else {
    size_t dlen = slash == path ? 1 : (size_t)(slash - path);
    *dir = malloc(dlen + 1);
    if (*dir) {
      memcpy(*dir, path, dlen);
      (*dir)[dlen] = '\0';
    }
    *base = slash + 1;
  }
  if (!*dir) return ampc__error(AMPC_ENOMEM, "%s: out of memory", path);
  return AMPC_OK;
}

/* Creates a fresh temporary file next to the target; O_EXCL with a per-call
 * counter, so concurrent writers (threads or processes) never share one. */
static ampc_status create_temp(const char *path, const char *dir, const char *base,
                               char **tmp_out, int *fd_out) {
  static atomic_ulong counter;
  size_t cap = strlen(dir) + strlen(base) + 64;
  char *tmp = malloc(cap);
  if (!tmp) return ampc__error(AMPC_ENOMEM, "%s: out of memory", path);
  for (int attempt = 0; attempt < 100; attempt++) {
    unsigned long k = atomic_fetch_add(&counter, 1);
    /* the name's first 200 bytes at most: a target name near the 255-byte
     * limit of one name must still leave room for the suffix */
    snprintf(tmp, cap, "%s/.%.200s.tmp.%ld.%lu", dir, base, (long)getpid(), k);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd >= 0) {
      *tmp_out = tmp;
      *fd_out = fd;
      return AMPC_OK;
    }
    if (errno != EEXIST) {
      int e = errno;
      free(tmp);
      return ampc__error(AMPC_EIO, "%s: cannot create a temporary file in %s: %s", path, dir,
                         strerror(e));
    }
  }
  free(tmp);
  return ampc__error(AMPC_EIO, "%s: cannot create a temporary file in %s: too many name clashes",
                     path, dir);
}

ampc_status ampc__probe_write(const char *path) {
  if (!path || !*path) return ampc__error(AMPC_EINVAL, "write: no path");
  char *dir = NULL, *tmp = NULL;
  const char *base;
  int fd = -1;
  AMPC_TRY(split_path(path, &dir, &base));
  ampc_status s = create_temp(path, dir, base, &tmp, &fd);
  if (s == AMPC_OK) {
    close(fd);
    unlink(tmp);
  }
  free(tmp);
  free(dir);
  return s;
}

int ampc__open_input(const char *path, struct stat *st) {
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) return -1;
  if (fstat(fd, st) != 0) {
    int e = errno;
    close(fd);
    errno = e;
    return -1;
  }
  if (!S_ISREG(st->st_mode)) {
    close(fd);
    return AMPC__NOT_REGULAR;
  }
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
    int e = errno;
    close(fd);
    errno = e;
    return -1;
  }
  return fd;
}

static ampc_status sync_dir(const char *path, const char *dir) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    return ampc__error(AMPC_EIO, "%s: written, but cannot open its folder to flush it: %s", path,
                       strerror(errno));
  /* Some file systems cannot fsync a folder (EINVAL); the rename is then as
   * durable as they make it, which is not an error of ours. */
  int rc = fsync(fd), e = errno;
  close(fd);
  if (rc != 0 && e != EINVAL)
    return ampc__error(AMPC_EIO, "%s: written, but flushing its folder failed: %s", path,
                       strerror(e));
  return AMPC_OK;
}

ampc_status ampc__write_file_atomic(const char *path,
                                    ampc_status (*fill)(void *ctx, ampc__wfile *w),
                                    void *ctx) {
  if (!path || !*path || !fill) return ampc__error(AMPC_EINVAL, "write: no path or no contents");
  size_t plen = strlen(path);
  if (path[plen - 1] == '/') return ampc__error(AMPC_EINVAL, "%s: path names a folder", path);
  /* The rename below would replace whatever the path names: a device (as
   * root, /dev/null itself), a FIFO or a socket is refused, not replaced. */
  struct stat ost;
  if (stat(path, &ost) == 0 && !S_ISREG(ost.st_mode))
    return ampc__error(AMPC_EINVAL, "%s: exists and is not a regular file (%s); not replaced", path,
                       S_ISDIR(ost.st_mode) ? "a folder" : S_ISFIFO(ost.st_mode) ? "a FIFO"
                       : S_ISCHR(ost.st_mode) || S_ISBLK(ost.st_mode) ? "a device" : "a socket or other special file");

  char *dir = NULL, *tmp = NULL;
  const char *base;
  int fd = -1, rc;
  ampc_status s = split_path(path, &dir, &base);
  if (s < 0) return s;
  s = create_temp(path, dir, base, &tmp, &fd);
  if (s < 0) {
    free(dir);
    return s;
  }

  ampc__wfile w = {fdopen(fd, "wb"), path, 0};
  if (!w.fp) {
    s = ampc__error(AMPC_EIO, "%s: cannot open the temporary file: %s", path, strerror(errno));
    close(fd);
    goto fail;
  }
  s = fill(ctx, &w);
  if (s < 0) goto fail;
  /* Buffered bytes can still fail (ENOSPC shows up here on many file systems). */
  if (fflush(w.fp) != 0) {
    s = write_error(&w, errno);
    goto fail;
  }
  if (fsync(fileno(w.fp)) != 0) {
    s = write_error(&w, errno);
    goto fail;
  }
  rc = fclose(w.fp); /* closes even when it fails */
  w.fp = NULL;
  if (rc != 0) {
    s = write_error(&w, errno);
    goto fail;
  }
  if (rename(tmp, path) != 0) {
    s = ampc__error(AMPC_EIO, "%s: cannot replace it with the new file: %s (%s was not changed)",
                    path, strerror(errno), path);
    goto fail;
  }
  s = sync_dir(path, dir);
  free(tmp);
  free(dir);
  return s;

fail:
  if (w.fp) fclose(w.fp);
  unlink(tmp);
  free(tmp);
  free(dir);
  return s;
}

typedef struct {
  const ampc__chunk *chunks;
  size_t n;
} chunk_list;

static ampc_status fill_chunks(void *ctx, ampc__wfile *w) {
  const chunk_list *cl = ctx;
  for (size_t i = 0; i < cl->n; i++) AMPC_TRY(ampc__wfile_write(w, cl->chunks[i].ptr, cl->chunks[i].len));
  return AMPC_OK;
}

ampc_status ampc__write_file_atomic_chunks(const char *path, const ampc__chunk *chunks,
                                           size_t n) {
  if (n && !chunks) return ampc__error(AMPC_EINVAL, "write: %s: no chunks", path ? path : "");
  chunk_list cl = {chunks, n};
  return ampc__write_file_atomic(path, fill_chunks, &cl);
}
