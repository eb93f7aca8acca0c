/* The IDX reader for MNIST and Fashion-MNIST.
 *
 * An IDX file is a big-endian header -- a magic number 0x000008DD (0x08:
 * unsigned bytes, DD: the number of dimensions), then one uint32 per
 * dimension -- followed by the data in row-major order. The images file is
 * 3-D (N, H, W), the labels file 1-D (N). Files may be gzipped (one or
 * more gzip members, as gzip writes them; bytes after the last member that
 * are not another member are an error, where zlib's gzread would ignore
 * them); a file that does not start with gzip's magic is read as it is. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "core/status_internal.h"
#include "data/data_internal.h"
#include "io/fsutil_internal.h"

#define IDX_MAGIC_IMAGES 0x00000803u
#define IDX_MAGIC_LABELS 0x00000801u
#define IDX_CLASSES 10

typedef struct {
  int fd;             /* -1 when closed */
  const char *prefix; /* "fashion-mnist" */
  char name[64];      /* the file's name in messages: "train-images-idx3-ubyte.gz" */
  char path[4096];
  uint64_t size;      /* the most data the file can hold: its size, or for a
                       * gzip the most its compressed size can expand to */
  uint64_t bytes;     /* the file's size */
  int gz;             /* named .gz (and, once the first bytes are read, 1 if they are gzip's magic, else 0) */
  int started;        /* the first bytes have been looked at */
  int zinit, member_end, in_eof;
  z_stream zs;
  uint8_t *in;        /* compressed input, IDX_IN bytes */
} idx_file;

#define IDX_IN ((size_t)1 << 18)

/* Opens dir/base or else dir/base.gz: without blocking (a FIFO in the
 * folder is refused, not waited on), and only a regular file. A name that
 * exists but cannot be opened (no permission, ...) is reported as such, not
 * as missing. */
static ampc_status idx_open(idx_file *x, const char *prefix, const char *dir, const char *base) {
  static const char *const suffixes[] = {"", ".gz"};
  memset(x, 0, sizeof *x);
  x->fd = -1;
  x->prefix = prefix;
  for (int i = 0; i < 2; i++) {
    int len = snprintf(x->path, sizeof x->path, "%s/%s%s", dir, base, suffixes[i]);
    if (len < 0 || (size_t)len >= sizeof x->path)
      return ampc__error(AMPC_EINVAL, "%s: directory name too long: %s", prefix, dir);
    struct stat st;
    int fd = ampc__open_input(x->path, &st);
    if (fd == AMPC__NOT_REGULAR)
      return ampc__error(AMPC_EIO, "%s: %s is not a regular file", prefix, x->path);
    if (fd < 0 && errno == ENOENT) continue;
    if (fd < 0)
      return ampc__error(AMPC_EIO, "%s: cannot open %s: %s", prefix, x->path, strerror(errno));
    snprintf(x->name, sizeof x->name, "%s%s", base, suffixes[i]);
    x->fd = fd;
    x->bytes = (uint64_t)st.st_size;
    x->gz = suffixes[i][0] != '\0';
    /* deflate expands at most about 1032:1, which bounds what a gzip can hold */
    x->size = x->gz ? x->bytes * 1032 + 64 : x->bytes;
    if (x->gz && !(x->in = malloc(IDX_IN))) {
      close(fd);
      x->fd = -1;
      return ampc__error(AMPC_ENOMEM, "%s: cannot open %s: out of memory", prefix, x->path);
    }
    return AMPC_OK;
  }
  return ampc__error(AMPC_ENOTFOUND, "%s: cannot find %s or %s.gz in %s", prefix, base, base,
                     dir);
}

static void idx_close(idx_file *x) {
  if (x->zinit) inflateEnd(&x->zs);
  x->zinit = 0;
  free(x->in);
  x->in = NULL;
  if (x->fd >= 0) close(x->fd);
  x->fd = -1;
}

/* Up to n bytes of the file itself into p; *got how many (0 at its end). */
static ampc_status idx_raw(idx_file *x, uint8_t *p, size_t n, size_t *got) {
  *got = 0;
  while (*got < n) {
    ssize_t r = read(x->fd, p + *got, n - *got > ((size_t)1 << 30) ? (size_t)1 << 30 : n - *got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return ampc__error(AMPC_EIO, "%s: %s: read error: %s", x->prefix, x->name, strerror(errno));
    if (r == 0) break;
    *got += (size_t)r;
  }
  return AMPC_OK;
}

/* More compressed input after what is left unread (moved to the front). */
static ampc_status idx_fill(idx_file *x) {
  if (x->in_eof) return AMPC_OK;
  if (x->zs.avail_in && x->zs.next_in != x->in) memmove(x->in, x->zs.next_in, x->zs.avail_in);
  x->zs.next_in = x->in;
  size_t got;
  AMPC_TRY(idx_raw(x, x->in + x->zs.avail_in, IDX_IN - x->zs.avail_in, &got));
  if (got == 0) x->in_eof = 1;
  x->zs.avail_in += (uInt)got;
  return AMPC_OK;
}

static ampc_status idx_corrupt(idx_file *x, const char *why) {
  return ampc__error(AMPC_EFORMAT, "%s: %s: corrupt gzip stream (%s)", x->prefix, x->name, why && *why ? why : "unknown error");
}

/* Reads up to n bytes of data; *got is how many arrived. A short read is an
 * error here only where the file is (corrupt gzip, bytes after the last
 * gzip member, an I/O error); running out of data is left to the caller,
 * which knows what it expected. */
static ampc_status idx_read(idx_file *x, void *buf, size_t n, size_t *got) {
  uint8_t *p = buf;
  *got = 0;
  if (x->gz && !x->started) {
    /* a file of that name that is not a gzip is read as it is */
    AMPC_TRY(idx_fill(x));
    x->started = 1;
    if (x->zs.avail_in >= 2 && x->in[0] == 0x1f && x->in[1] == 0x8b) {
      if (inflateInit2(&x->zs, 16 + MAX_WBITS) != Z_OK)
        return ampc__error(AMPC_ENOMEM, "%s: %s: out of memory", x->prefix, x->name);
      x->zinit = 1;
    } else {
      x->gz = 0;
      x->size = x->bytes; /* what it holds is itself */
      size_t have = x->zs.avail_in < n ? x->zs.avail_in : n;
      memcpy(p, x->zs.next_in, have);
      x->zs.next_in += have;
      x->zs.avail_in -= (uInt)have;
      *got = have;
    }
  }
  if (!x->zinit) {
    /* plain: first what the look at the start took in, then the file */
    if (x->in && x->zs.avail_in && *got < n) {
      size_t have = x->zs.avail_in < n - *got ? x->zs.avail_in : n - *got;
      memcpy(p + *got, x->zs.next_in, have);
      x->zs.next_in += have;
      x->zs.avail_in -= (uInt)have;
      *got += have;
    }
    size_t more = 0;
    if (*got < n) AMPC_TRY(idx_raw(x, p + *got, n - *got, &more));
    *got += more;
    return AMPC_OK;
  }
  while (*got < n) {
    if (x->zs.avail_in < 2 && !x->in_eof) AMPC_TRY(idx_fill(x));
    if (x->member_end) {
      /* after a member: the file's end, or another member */
      if (x->zs.avail_in == 0) break;
      if (x->zs.avail_in < 2 || x->zs.next_in[0] != 0x1f || x->zs.next_in[1] != 0x8b)
        return ampc__error(AMPC_EFORMAT, "%s: %s: data after the end of the gzip stream (%u bytes or more that are not gzip)",
                           x->prefix, x->name, x->zs.avail_in);
      if (inflateReset(&x->zs) != Z_OK) return idx_corrupt(x, x->zs.msg);
      x->member_end = 0;
    }
    size_t want = n - *got > ((size_t)1 << 30) ? (size_t)1 << 30 : n - *got;
    x->zs.next_out = p + *got;
    x->zs.avail_out = (uInt)want;
    int r = inflate(&x->zs, Z_NO_FLUSH);
    *got += want - x->zs.avail_out;
    if (r == Z_STREAM_END) {
      x->member_end = 1;
      continue;
    }
    if (r == Z_MEM_ERROR) return ampc__error(AMPC_ENOMEM, "%s: %s: out of memory", x->prefix, x->name);
    if (r == Z_BUF_ERROR && x->in_eof) return idx_corrupt(x, "unexpected end of file"); /* no progress, and no more input */
    if (r != Z_OK && r != Z_BUF_ERROR) return idx_corrupt(x, x->zs.msg);
  }
  return AMPC_OK;
}

static uint32_t be32(const uint8_t *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

/* Reads the header: magic, then ndim dimensions into dims. */
static ampc_status idx_header(idx_file *x, uint32_t magic, int ndim, uint32_t *dims) {
  uint8_t hdr[16];
  size_t want = 4 + 4 * (size_t)ndim, got;
  AMPC_TRY(idx_read(x, hdr, want, &got));
  if (got >= 4 && be32(hdr) != magic)
    return ampc__error(AMPC_EFORMAT, "%s: %s: bad magic 0x%08x (expected 0x%08x)", x->prefix,
                       x->name, be32(hdr), magic);
  if (got < want)
    return ampc__error(AMPC_EFORMAT, "%s: %s: truncated header (%zu of %zu bytes)", x->prefix,
                       x->name, got, want);
  for (int i = 0; i < ndim; i++) {
    dims[i] = be32(hdr + 4 + 4 * i);
    if (dims[i] == 0)
      return ampc__error(AMPC_EFORMAT, "%s: %s: dimension %d is zero in the header", x->prefix,
                         x->name, i);
  }
  return AMPC_OK;
}

/* Reads exactly n bytes of the named kind of data ("image", "label"). */
static ampc_status idx_data(idx_file *x, void *buf, size_t n, const char *what) {
  size_t got;
  AMPC_TRY(idx_read(x, buf, n, &got));
  if (got < n)
    return ampc__error(AMPC_EFORMAT, "%s: %s: truncated: expected %zu bytes of %s data, got %zu",
                       x->prefix, x->name, n, what, got);
  return AMPC_OK;
}

/* The file must end where its header says (this also makes zlib check the
 * gzip trailer's CRC and length). */
static ampc_status idx_at_end(idx_file *x, uint32_t count, const char *what) {
  uint8_t extra;
  size_t got;
  AMPC_TRY(idx_read(x, &extra, 1, &got));
  if (got)
    return ampc__error(AMPC_EFORMAT, "%s: %s: trailing data after the %u %s the header declares",
                       x->prefix, x->name, count, what);
  return AMPC_OK;
}

/* A header's claim of need bytes (hdr of them the header) against what the
 * file can hold. */
static ampc_status idx_fits(const idx_file *x, uint64_t need, uint64_t hdr, const char *what) {
  if (need <= x->size) return AMPC_OK;
  if (x->gz)
    return ampc__error(AMPC_EFORMAT, "%s: %s: truncated: expected %llu bytes of %s data, more than its %llu compressed bytes can hold",
                       x->prefix, x->name, (unsigned long long)(need - hdr), what, (unsigned long long)x->bytes);
  return ampc__error(AMPC_EFORMAT, "%s: %s: truncated: expected %llu bytes of %s data, got %llu", x->prefix, x->name,
                     (unsigned long long)(need - hdr), what, (unsigned long long)(x->size > hdr ? x->size - hdr : 0));
}

/* Opens both files of a split and checks their headers against each other
 * and against the files' sizes: everything that can be known before the
 * data is read. *n is the sample count after the limit. */
static ampc_status idx_headers(ampc_dataset_kind kind, const char *dir, int train, size_t limit,
                               idx_file *im, idx_file *lb, uint32_t idims[3], size_t *n_out) {
  const char *prefix = ampc_dataset_kind_name(kind);
  const char *split = train ? "train" : "t10k";
  char base[64];
  snprintf(base, sizeof base, "%s-images-idx3-ubyte", split);
  AMPC_TRY(idx_open(im, prefix, dir, base));
  snprintf(base, sizeof base, "%s-labels-idx1-ubyte", split);
  AMPC_TRY(idx_open(lb, prefix, dir, base));

  uint32_t ldims[1];
  AMPC_TRY(idx_header(im, IDX_MAGIC_IMAGES, 3, idims));
  uint64_t hw = (uint64_t)idims[1] * idims[2];
  /* hw < 2^31 keeps n * hw below 2^63, and H and W within an int. */
  if (hw >= AMPC_DATASET_MAX_BYTES || idims[0] * hw >= AMPC_DATASET_MAX_BYTES)
    return ampc__error(AMPC_EFORMAT,
                       "%s: %s: header claims %u x %u x %u images, over the 2 GiB limit",
                       prefix, im->name, idims[0], idims[1], idims[2]);
  AMPC_TRY(idx_header(lb, IDX_MAGIC_LABELS, 1, ldims));
  if (ldims[0] != idims[0])
    return ampc__error(AMPC_EFORMAT, "%s: %s has %u labels but %s has %u images", prefix,
                       lb->name, ldims[0], im->name, idims[0]);

  size_t n = idims[0];
  if (limit && limit < n) n = limit;
  /* refuse a header that claims more than the file holds before allocating for it */
  uint64_t need_im = 16 + (uint64_t)n * hw, need_lb = 8 + (uint64_t)n;
  AMPC_TRY(idx_fits(im, need_im, 16, "image"));
  AMPC_TRY(idx_fits(lb, need_lb, 8, "label"));
  *n_out = n;
  return AMPC_OK;
}

static ampc_status idx_load(ampc_dataset **out, ampc_dataset_kind kind, const char *dir,
                            int train, size_t limit, idx_file *im, idx_file *lb) {
  const char *prefix = ampc_dataset_kind_name(kind);
  uint32_t idims[3];
  size_t n;
  AMPC_TRY(idx_headers(kind, dir, train, limit, im, lb, idims, &n));
  uint64_t hw = (uint64_t)idims[1] * idims[2];
  ampc_dataset *d;
  AMPC_TRY(ampc__dataset_alloc(&d, kind, n, 1, (int)idims[1], (int)idims[2], IDX_CLASSES));
  ampc_status s = idx_data(im, d->images, n * hw, "image");
  if (s == AMPC_OK && n == idims[0]) s = idx_at_end(im, idims[0], "images");
  uint8_t *raw = NULL; /* (n) label bytes, widened into d->labels */
  if (s == AMPC_OK && !(raw = malloc(n)))
    s = ampc__error(AMPC_ENOMEM, "%s: out of memory for %zu labels", prefix, n);
  if (s == AMPC_OK) s = idx_data(lb, raw, n, "label");
  if (s == AMPC_OK && n == idims[0]) s = idx_at_end(lb, idims[0], "labels");
  for (size_t i = 0; s == AMPC_OK && i < n; i++) {
    if (raw[i] >= IDX_CLASSES)
      s = ampc__error(AMPC_EFORMAT, "%s: %s: label %u at index %zu out of range [0, %d)", prefix,
                      lb->name, raw[i], i, IDX_CLASSES);
    else
      d->labels[i] = raw[i];
  }
  free(raw);
  if (s < 0) {
    ampc_dataset_free(d);
    return s;
  }
  *out = d;
  return AMPC_OK;
}

ampc_status ampc__idx_read(ampc_dataset **out, ampc_dataset_kind kind, const char *dir,
                           int train, size_t limit) {
  idx_file im = {.fd = -1}, lb = {.fd = -1};
  ampc_status s = idx_load(out, kind, dir, train, limit, &im, &lb);
  idx_close(&im);
  idx_close(&lb);
  return s;
}

ampc_status ampc__idx_probe(ampc_dataset_info *info, ampc_dataset_kind kind, const char *dir,
                            int train, size_t limit) {
  idx_file im = {.fd = -1}, lb = {.fd = -1};
  uint32_t idims[3];
  size_t n = 0;
  ampc_status s = idx_headers(kind, dir, train, limit, &im, &lb, idims, &n);
  if (s == AMPC_OK) {
    info->count = n;
    info->channels = 1;
    info->height = (int)idims[1];
    info->width = (int)idims[2];
    info->classes = IDX_CLASSES;
    snprintf(info->images, sizeof info->images, "%s", im.path);
  }
  idx_close(&im);
  idx_close(&lb);
  return s;
}
