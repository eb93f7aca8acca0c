/*
 * Internal: writing a file atomically.
 *
 * The new contents go to a temporary file in the same folder as the target
 * (".<name>.tmp.<pid>.<n>"), which is flushed to disk and renamed over the
 * target, and then the folder itself is flushed, so that after a crash the
 * target holds either the old contents or the new, never a mix. On any
 * failure the temporary file is removed and the target left unchanged.
 *
 *     static ampc_status fill(void *ctx, ampc__wfile *w) {
 *         AMPC_TRY(ampc__wfile_write(w, hdr, hdr_len));
 *         return ampc__wfile_write(w, data, data_len);
 *     }
 *     ampc__write_file_atomic(path, fill, ctx);
 *
 * A path that is a symbolic link is replaced by a regular file (rename
 * semantics); the new file gets mode 0666 less the umask.
 */
#ifndef AMPC_IO_FSUTIL_INTERNAL_H
#define AMPC_IO_FSUTIL_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "ampc/status.h"

/* The temporary file being written; only valid inside a fill callback. */
typedef struct ampc__wfile ampc__wfile;

/* Appends n bytes. On failure sets a message naming the target, the byte
 * count reached and the system's reason ("No space left on device"), and
 * returns AMPC_EIO; the fill callback should return that status. */
ampc_status ampc__wfile_write(ampc__wfile *w, const void *p, size_t n);

/* Bytes appended so far. */
uint64_t ampc__wfile_tell(const ampc__wfile *w);

/* Writes the file path with the bytes fill appends. A negative status from
 * fill aborts the write (its message is kept). */
/* Whether ampc__write_file_atomic could start at path: creates and removes
 * the temporary file it would (a missing or read-only folder, a virtual file
 * system, a name too long fail here as they would there). */
ampc_status ampc__probe_write(const char *path);

ampc_status ampc__write_file_atomic(const char *path,
                                    ampc_status (*fill)(void *ctx, ampc__wfile *w),
                                    void *ctx);

/* The same for a list of byte ranges written in order (a NULL ptr is allowed
 * when len is 0). */
typedef struct {
  const void *ptr;
  size_t len;
} ampc__chunk;
ampc_status ampc__write_file_atomic_chunks(const char *path, const ampc__chunk *chunks,
                                           size_t n);

/* Opens an input file for reading without ever blocking: O_NONBLOCK (a FIFO
 * or a device would otherwise wait in open() for a writer or a carrier), then
 * fstat, and only a regular file is kept; the descriptor is returned in
 * blocking mode, with *st filled. Returns the descriptor, -1 with errno set
 * when the file cannot be opened or examined, or AMPC__NOT_REGULAR (nothing
 * left open) when it is a folder, FIFO, socket or device. */
#define AMPC__NOT_REGULAR (-2)
struct stat;
int ampc__open_input(const char *path, struct stat *st);

/* Test hook: after `bytes` more bytes have been appended on this thread, the
 * next append writes what fits and then fails with ENOSPC, as a full disk
 * would; the hook then disarms itself (it stays armed until it fires).
 * bytes < 0 disarms it. */
void ampc__fsutil_fail_after(long long bytes);

#endif
