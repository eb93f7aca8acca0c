/* safetensors: reader (load + validate everything up front) and atomic writer. */
#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ampc/safetensors.h"
#include "core/status_internal.h"
#include "io/fsutil_internal.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c assumes a little-endian host (tensor bytes are copied as they are)"
#endif

/* The official implementation's limit; a larger header is corrupt, not big. */
#define ST_MAX_HEADER 100000000u
/* In-memory alignment of every loaded tensor. */
#define ST_ALIGN 64u

/* File dtype names. Known names ampc has no type for map to -1 so that they
 * are reported as unsupported rather than unknown. */
static const struct {
  const char *name;
  int dtype;
} st_dtypes[] = {
    {"F32", AMPC_DTYPE_F32},   {"F16", AMPC_DTYPE_F16}, {"BF16", AMPC_DTYPE_BF16},
    {"F64", AMPC_DTYPE_F64},   {"I64", AMPC_DTYPE_I64}, {"I32", AMPC_DTYPE_I32},
    {"I16", AMPC_DTYPE_I16},   {"I8", AMPC_DTYPE_I8},   {"U8", AMPC_DTYPE_U8},
    {"BOOL", AMPC_DTYPE_BOOL}, {"U16", -1},             {"U32", -1},
    {"U64", -1},               {"F8_E4M3", -1},         {"F8_E5M2", -1},
    {"F8_E8M0", -1},           {"C64", -1},
};

static const char *st_dtype_name(ampc_dtype t) {
  for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++)
    if (st_dtypes[i].dtype == (int)t) return st_dtypes[i].name;
  return "?";
}

typedef struct {
  const char *key, *value;
} st_meta;

struct ampc_st_file {
  char *label;
  json_t *root;                    /* owns the names and metadata strings */
  size_t n;
  ampc_st_tensor *tensors;         /* (n) in data-offset order */
  const ampc_st_tensor **by_name;  /* (n) sorted by name, for ampc_st_find */
  size_t nmeta;
  st_meta *meta;                   /* (nmeta) sorted by key */
  void *arena;                     /* every tensor's data, each slot ST_ALIGN-aligned */
};

/* "safetensors: <label>: <what>" */
static ampc_status st_err(const char *label, ampc_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static ampc_status st_err(const char *label, ampc_status code, const char *fmt, ...) {
  char what[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  return ampc__error(code, "safetensors: %s: %s", label, what);
}

static void fmt_shape(char *buf, size_t cap, int ndim, const int64_t *shape) {
  size_t k = (size_t)snprintf(buf, cap, "[");
  for (int d = 0; d < ndim && k < cap; d++)
    k += (size_t)snprintf(buf + k, cap - k, d ? ", %" PRId64 : "%" PRId64, shape[d]);
  if (k < cap) snprintf(buf + k, cap - k, "]");
}

static const char *json_kind(const json_t *j) {
  switch (json_typeof(j)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
  }
  return "?";
}

/* ---- reading ---------------------------------------------------------- */

/* Where the bytes come from: a file read sequentially, or a caller's buffer. */
typedef struct {
  FILE *fp;
  const unsigned char *mem;
  size_t pos;
} st_source;

static int src_read(st_source *s, void *dst, size_t n) {
  if (n == 0) return 0;
  if (s->mem) {
    memcpy(dst, s->mem + s->pos, n);
    s->pos += n;
    return 0;
  }
  return fread(dst, 1, n, s->fp) == n ? 0 : -1;
}

/* A tensor while parsing: its offsets and its place in the header. */
typedef struct {
  ampc_st_tensor t;
  uint64_t begin, end;
  size_t order;
} st_entry;

static int cmp_entry(const void *a, const void *b) {
  const st_entry *x = a, *y = b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  if (x->end != y->end) return x->end < y->end ? -1 : 1;
  return x->order < y->order ? -1 : x->order > y->order;
}

static int cmp_by_name(const void *a, const void *b) {
  return strcmp((*(const ampc_st_tensor *const *)a)->name, (*(const ampc_st_tensor *const *)b)->name);
}

static int cmp_meta(const void *a, const void *b) {
  return strcmp(((const st_meta *)a)->key, ((const st_meta *)b)->key);
}

/* Fills e from one header entry; data_len bounds the offsets. */
static ampc_status parse_entry(const char *label, const char *name, json_t *v, uint64_t data_len,
                               st_entry *e) {
  if (!json_is_object(v))
    return st_err(label, AMPC_EFORMAT, "tensor '%s': entry is %s, not an object", name, json_kind(v));
  json_t *jd = json_object_get(v, "dtype"), *js = json_object_get(v, "shape"),
         *jo = json_object_get(v, "data_offsets");
  if (!jd) return st_err(label, AMPC_EFORMAT, "tensor '%s': missing \"dtype\"", name);
  if (!js) return st_err(label, AMPC_EFORMAT, "tensor '%s': missing \"shape\"", name);
  if (!jo) return st_err(label, AMPC_EFORMAT, "tensor '%s': missing \"data_offsets\"", name);

  if (!json_is_string(jd))
    return st_err(label, AMPC_EFORMAT, "tensor '%s': \"dtype\" is %s, not a string", name, json_kind(jd));
  const char *ds = json_string_value(jd);
  int dt = -2;
  for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++)
    if (strcmp(ds, st_dtypes[i].name) == 0) dt = st_dtypes[i].dtype;
  if (dt == -2) return st_err(label, AMPC_EFORMAT, "tensor '%s': unknown dtype '%s'", name, ds);
  if (dt == -1)
    return st_err(label, AMPC_EUNSUPPORTED, "tensor '%s': dtype '%s' is not supported by ampc", name, ds);

  if (!json_is_array(js))
    return st_err(label, AMPC_EFORMAT, "tensor '%s': \"shape\" is %s, not an array", name, json_kind(js));
  size_t ndim = json_array_size(js);
  if (ndim > AMPC_ST_MAX_DIMS)
    return st_err(label, AMPC_EUNSUPPORTED, "tensor '%s': %zu dims, at most %d supported", name, ndim,
                  AMPC_ST_MAX_DIMS);
  uint64_t numel = 1;
  int overflow = 0;
  for (size_t d = 0; d < ndim; d++) {
    json_t *x = json_array_get(js, d);
    if (!json_is_integer(x))
      return st_err(label, AMPC_EFORMAT, "tensor '%s': shape[%zu] is %s, not an integer", name, d,
                    json_kind(x));
    json_int_t dim = json_integer_value(x);
    if (dim < 0)
      return st_err(label, AMPC_EFORMAT, "tensor '%s': shape[%zu] = %lld is negative", name, d,
                    (long long)dim);
    e->t.shape[d] = dim;
    /* Checked step by step, as the official reader does: a product that
     * overflows on the way is refused even if a later dim is 0. */
    if (dim && numel > (uint64_t)INT64_MAX / (uint64_t)dim) overflow = 1;
    numel *= (uint64_t)dim;
  }
  size_t esize = ampc_dtype_size((ampc_dtype)dt);
  if (overflow || numel > (uint64_t)INT64_MAX / esize)
    return st_err(label, AMPC_EFORMAT, "tensor '%s': shape product overflows", name);

  if (!json_is_array(jo) || json_array_size(jo) != 2 || !json_is_integer(json_array_get(jo, 0)) ||
      !json_is_integer(json_array_get(jo, 1)))
    return st_err(label, AMPC_EFORMAT, "tensor '%s': \"data_offsets\" is not an array of 2 integers", name);
  json_int_t b = json_integer_value(json_array_get(jo, 0)), en = json_integer_value(json_array_get(jo, 1));
  if (b < 0 || en < 0)
    return st_err(label, AMPC_EFORMAT, "tensor '%s': data_offsets [%lld, %lld] are negative", name,
                  (long long)b, (long long)en);
  if (b > en)
    return st_err(label, AMPC_EFORMAT, "tensor '%s': data_offsets [%lld, %lld]: begin > end", name,
                  (long long)b, (long long)en);
  if ((uint64_t)en > data_len)
    return st_err(label, AMPC_EFORMAT,
                  "tensor '%s': data_offsets end %lld is past the end of the %" PRIu64 "-byte data buffer",
                  name, (long long)en, data_len);
  uint64_t need = numel * esize, have = (uint64_t)(en - b);
  if (have != need) {
    char sh[160];
    fmt_shape(sh, sizeof sh, (int)ndim, e->t.shape);
    return st_err(label, AMPC_EFORMAT,
                  "tensor '%s': data_offsets [%lld, %lld] hold %" PRIu64 " bytes but %s %s needs %" PRIu64,
                  name, (long long)b, (long long)en, have, ds, sh, need);
  }
  e->t.name = name;
  e->t.dtype = (ampc_dtype)dt;
  e->t.ndim = (int)ndim;
  e->t.nbytes = (size_t)have;
  e->begin = (uint64_t)b;
  e->end = (uint64_t)en;
  return AMPC_OK;
}

static ampc_status parse_metadata(const char *label, json_t *md, ampc_st_file *f) {
  if (json_is_null(md)) return AMPC_OK; /* the official format reads null as absent */
  if (!json_is_object(md))
    return st_err(label, AMPC_EFORMAT, "__metadata__ is %s, not a string->string object", json_kind(md));
  size_t n = json_object_size(md);
  f->meta = calloc(n ? n : 1, sizeof *f->meta);
  if (!f->meta) return st_err(label, AMPC_ENOMEM, "out of memory for %zu metadata entries", n);
  const char *k;
  json_t *v;
  json_object_foreach(md, k, v) {
    if (!json_is_string(v))
      return st_err(label, AMPC_EFORMAT, "__metadata__ '%s' is %s, not a string (not a string->string object)",
                    k, json_kind(v));
    f->meta[f->nmeta].key = k;
    f->meta[f->nmeta].value = json_string_value(v);
    f->nmeta++;
  }
  qsort(f->meta, f->nmeta, sizeof *f->meta, cmp_meta);
  return AMPC_OK;
}

/* Parses and validates the header (hdr, hlen) against a data buffer of
 * data_len bytes, then reads the data buffer from src into the arena. */
static ampc_status st_build(ampc_st_file *f, const char *hdr, size_t hlen, uint64_t data_len,
                            st_source *src) {
  const char *label = f->label;
  json_error_t jerr;
  /* JSON_DECODE_ANY so that a scalar is reported as "not an object" below;
   * trailing spaces (the official padding) are whitespace to jansson. */
  f->root = json_loadb(hdr, hlen, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &jerr);
  if (!f->root)
    return st_err(label, AMPC_EFORMAT, "malformed JSON header at line %d, column %d: %s", jerr.line,
                  jerr.column, jerr.text);
  if (!json_is_object(f->root))
    return st_err(label, AMPC_EFORMAT, "header is %s, not a JSON object", json_kind(f->root));

  json_t *md = json_object_get(f->root, "__metadata__");
  AMPC_TRY(md ? parse_metadata(label, md, f) : AMPC_OK);

  size_t n = json_object_size(f->root) - (md ? 1 : 0);
  st_entry *es = calloc(n ? n : 1, sizeof *es);
  if (!es) return st_err(label, AMPC_ENOMEM, "out of memory for %zu tensors", n);
  const char *k;
  json_t *v;
  size_t i = 0;
  ampc_status s = AMPC_OK;
  json_object_foreach(f->root, k, v) {
    if (strcmp(k, "__metadata__") == 0) continue;
    s = parse_entry(label, k, v, data_len, &es[i]);
    if (s < 0) goto done;
    es[i].order = i;
    i++;
  }
  qsort(es, n, sizeof *es, cmp_entry);

  /* The tensors must tile the data buffer: each starts where the previous ended. */
  uint64_t at = 0;
  for (i = 0; i < n; i++) {
    if (es[i].begin < at) {
      s = st_err(label, AMPC_EFORMAT, "tensors '%s' [%" PRIu64 ", %" PRIu64 "] and '%s' [%" PRIu64
                 ", %" PRIu64 "] overlap", es[i - 1].t.name, es[i - 1].begin, es[i - 1].end,
                 es[i].t.name, es[i].begin, es[i].end);
      goto done;
    }
    if (es[i].begin > at) {
      s = st_err(label, AMPC_EFORMAT, "bytes [%" PRIu64 ", %" PRIu64 ") of the data buffer belong to "
                 "no tensor (gaps are not allowed)", at, es[i].begin);
      goto done;
    }
    at = es[i].end;
  }
  if (at != data_len) {
    s = st_err(label, AMPC_EFORMAT, "bytes [%" PRIu64 ", %" PRIu64 ") at the end of the data buffer "
               "belong to no tensor (gaps are not allowed)", at, data_len);
    goto done;
  }

  /* One allocation, one aligned slot per tensor, filled in file order (no
   * source: the header alone, every tensor's data NULL). */
  size_t total = 0;
  for (i = 0; src && i < n; i++) total += (es[i].t.nbytes + ST_ALIGN - 1) / ST_ALIGN * ST_ALIGN;
  f->arena = src ? aligned_alloc(ST_ALIGN, total ? total : ST_ALIGN) : NULL;
  f->tensors = calloc(n ? n : 1, sizeof *f->tensors);
  f->by_name = calloc(n ? n : 1, sizeof *f->by_name);
  if ((src && !f->arena) || !f->tensors || !f->by_name) {
    s = st_err(label, AMPC_ENOMEM, "out of memory for %zu bytes of tensor data", total);
    goto done;
  }
  unsigned char *slot = f->arena;
  for (i = 0; i < n; i++) {
    f->tensors[i] = es[i].t;
    f->tensors[i].values = NULL;
    f->by_name[i] = &f->tensors[i];
    if (!src) continue;
    f->tensors[i].values = slot;
    if (src_read(src, slot, es[i].t.nbytes) != 0) {
      s = st_err(label, AMPC_EIO, "read failed in tensor '%s' (file truncated while reading?)", es[i].t.name);
      goto done;
    }
    slot += (es[i].t.nbytes + ST_ALIGN - 1) / ST_ALIGN * ST_ALIGN;
  }
  f->n = n;
  qsort(f->by_name, n, sizeof *f->by_name, cmp_by_name);
done:
  free(es);
  return s;
}

static ampc_status st_new(ampc_st_file **out, const char *label) {
  ampc_st_file *f = calloc(1, sizeof *f);
  if (f) f->label = strdup(label);
  if (!f || !f->label) {
    free(f);
    return st_err(label, AMPC_ENOMEM, "out of memory");
  }
  *out = f;
  return AMPC_OK;
}

static uint64_t le64(const unsigned char *b) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | b[i];
  return v;
}

/* Checks the 8-byte length against the total size; returns the data length. */
static ampc_status check_header_len(const char *label, uint64_t size, uint64_t hlen, uint64_t *data_len) {
  if (hlen > ST_MAX_HEADER)
    return st_err(label, AMPC_EFORMAT, "header length %" PRIu64 " is absurd (limit %u bytes)", hlen,
                  ST_MAX_HEADER);
  if (hlen > size - 8)
    return st_err(label, AMPC_EFORMAT, "header length %" PRIu64 " runs past the end of the file "
                  "(%" PRIu64 " bytes follow it)", hlen, size - 8);
  if (size - 8 - hlen > (uint64_t)SIZE_MAX / 2)
    return st_err(label, AMPC_ENOMEM, "data buffer of %" PRIu64 " bytes too large for this machine",
                  size - 8 - hlen);
  *data_len = size - 8 - hlen;
  return AMPC_OK;
}

ampc_status ampc_st_open_memory(ampc_st_file **out, const void *buf, size_t len, const char *label) {
  if (!out) return ampc__error(AMPC_EINVAL, "safetensors: open_memory: out is NULL");
  *out = NULL;
  if (!label) label = "<memory>";
  if (!buf && len) return st_err(label, AMPC_EINVAL, "buffer is NULL");
  const unsigned char *b = buf;
  if (len < 8)
    return st_err(label, AMPC_EFORMAT, "file is %zu bytes, shorter than the 8-byte header length", len);
  uint64_t hlen = le64(b), data_len = 0;
  AMPC_TRY(check_header_len(label, len, hlen, &data_len));
  ampc_st_file *f = NULL;
  AMPC_TRY(st_new(&f, label));
  st_source src = {NULL, b + 8 + hlen, 0};
  ampc_status s = st_build(f, (const char *)b + 8, (size_t)hlen, data_len, &src);
  if (s < 0) {
    ampc_st_close(f);
    return s;
  }
  *out = f;
  return AMPC_OK;
}

static ampc_status st_open_file(ampc_st_file **out, const char *path, int with_data) {
  if (!out) return ampc__error(AMPC_EINVAL, "safetensors: open: out is NULL");
  *out = NULL;
  if (!path) return ampc__error(AMPC_EINVAL, "safetensors: open: path is NULL");
  struct stat st;
  int fd = ampc__open_input(path, &st);
  if (fd == AMPC__NOT_REGULAR) return st_err(path, AMPC_EIO, "not a regular file");
  if (fd < 0) {
    int e = errno;
    return st_err(path, e == ENOENT ? AMPC_ENOTFOUND : AMPC_EIO, "cannot open: %s", strerror(e));
  }
  FILE *fp = fdopen(fd, "rb");
  if (!fp) {
    int e = errno;
    close(fd);
    return st_err(path, AMPC_ENOMEM, "cannot open: %s", strerror(e));
  }
  ampc_status s;
  ampc_st_file *f = NULL;
  char *hdr = NULL;
  unsigned char lenb[8];
  uint64_t hlen = 0, data_len = 0;
  if (st.st_size < 8) {
    s = st_err(path, AMPC_EFORMAT, "file is %lld bytes, shorter than the 8-byte header length",
               (long long)st.st_size);
    goto done;
  }
  if (fread(lenb, 1, 8, fp) != 8) {
    s = st_err(path, AMPC_EIO, "read failed in the header length");
    goto done;
  }
  hlen = le64(lenb);
  s = check_header_len(path, (uint64_t)st.st_size, hlen, &data_len);
  if (s < 0) goto done;
  hdr = malloc(hlen ? (size_t)hlen : 1);
  if (!hdr) {
    s = st_err(path, AMPC_ENOMEM, "out of memory for a %" PRIu64 "-byte header", hlen);
    goto done;
  }
  if (fread(hdr, 1, (size_t)hlen, fp) != (size_t)hlen) {
    s = st_err(path, AMPC_EIO, "read failed in the header (file truncated while reading?)");
    goto done;
  }
  s = st_new(&f, path);
  if (s < 0) goto done;
  st_source src = {fp, NULL, 0};
  s = st_build(f, hdr, (size_t)hlen, data_len, with_data ? &src : NULL);
done:
  free(hdr);
  fclose(fp);
  if (s < 0) {
    ampc_st_close(f);
    return s;
  }
  *out = f;
  return AMPC_OK;
}

ampc_status ampc_st_open(ampc_st_file **out, const char *path) { return st_open_file(out, path, 1); }

ampc_status ampc_st_open_header(ampc_st_file **out, const char *path) { return st_open_file(out, path, 0); }

void ampc_st_close(ampc_st_file *f) {
  if (!f) return;
  json_decref(f->root);
  free(f->arena);
  free(f->tensors);
  free(f->by_name);
  free(f->meta);
  free(f->label);
  free(f);
}

const char *ampc_st_label(const ampc_st_file *f) { return f ? f->label : NULL; }
size_t ampc_st_count(const ampc_st_file *f) { return f ? f->n : 0; }

const ampc_st_tensor *ampc_st_get(const ampc_st_file *f, size_t i) {
  return f && i < f->n ? &f->tensors[i] : NULL;
}

static int cmp_name_key(const void *key, const void *elem) {
  return strcmp(key, (*(const ampc_st_tensor *const *)elem)->name);
}

const ampc_st_tensor *ampc_st_find(const ampc_st_file *f, const char *name) {
  if (!f || !name || !f->n) return NULL;
  const ampc_st_tensor *const *p = bsearch(name, f->by_name, f->n, sizeof *f->by_name, cmp_name_key);
  return p ? *p : NULL;
}

static int cmp_meta_key(const void *key, const void *elem) {
  return strcmp(key, ((const st_meta *)elem)->key);
}

const char *ampc_st_metadata(const ampc_st_file *f, const char *key) {
  if (!f || !key || !f->nmeta) return NULL;
  const st_meta *m = bsearch(key, f->meta, f->nmeta, sizeof *f->meta, cmp_meta_key);
  return m ? m->value : NULL;
}

size_t ampc_st_metadata_count(const ampc_st_file *f) { return f ? f->nmeta : 0; }

const char *ampc_st_metadata_key(const ampc_st_file *f, size_t i) {
  return f && i < f->nmeta ? f->meta[i].key : NULL;
}

/* ---- element access --------------------------------------------------- */

int64_t ampc_st_numel(const ampc_st_tensor *t) {
  if (!t || t->ndim < 0 || t->ndim > AMPC_ST_MAX_DIMS) return -1;
  int64_t n = 1;
  for (int d = 0; d < t->ndim; d++) {
    int64_t x = t->shape[d];
    if (x < 0 || (x && n > INT64_MAX / x)) return -1;
    n *= x;
  }
  return n;
}

static const char *tname(const ampc_st_tensor *t) { return t->name ? t->name : "?"; }

/* Checks that t is a consistent description holding exactly n elements. */
static ampc_status check_read(const ampc_st_tensor *t, size_t n, const char *what) {
  if (!t) return ampc__error(AMPC_EINVAL, "safetensors: %s: tensor is NULL", what);
  int64_t numel = ampc_st_numel(t);
  size_t es = ampc_dtype_size(t->dtype);
  if (numel < 0 || es == 0 || (uint64_t)numel > SIZE_MAX / es || t->nbytes != (size_t)numel * es ||
      (!t->values && t->nbytes))
    return ampc__error(AMPC_EINVAL, "safetensors: tensor '%s': inconsistent description (dtype, shape, "
                       "nbytes or data)", tname(t));
  if ((uint64_t)numel != (uint64_t)n) {
    char sh[160];
    fmt_shape(sh, sizeof sh, t->ndim, t->shape);
    return ampc__error(AMPC_EINVAL, "safetensors: tensor '%s': %s %s has %" PRId64 " elements, caller "
                       "expects %zu", tname(t), st_dtype_name(t->dtype), sh, numel, n);
  }
  return AMPC_OK;
}

ampc_status ampc_st_read_f32(const ampc_st_tensor *t, float *dst, size_t n) {
  AMPC_TRY(check_read(t, n, "read_f32"));
  if (!dst && n) return ampc__error(AMPC_EINVAL, "ampc_st_read_f32: dst is NULL");
  const unsigned char *src = t->values;
  switch (t->dtype) {
    case AMPC_DTYPE_F32:
      if (n) memcpy(dst, src, n * 4);
      return AMPC_OK;
    case AMPC_DTYPE_F16:
    case AMPC_DTYPE_BF16: {
      /* Staged through an aligned block: a caller's description may point
       * at unaligned bytes. */
      uint16_t blk[256];
      for (size_t i = 0; i < n; i += 256) {
        size_t m = n - i < 256 ? n - i : 256;
        memcpy(blk, src + 2 * i, 2 * m);
        if (t->dtype == AMPC_DTYPE_F16)
          ampc_f16_to_f32_n(dst + i, blk, m);
        else
          ampc_bf16_to_f32_n(dst + i, blk, m);
      }
      return AMPC_OK;
    }
    case AMPC_DTYPE_F64: {
      /* Finite values at or above FLT_MAX + half an ulp (2^103) round to
       * infinity; refuse them rather than invent an infinity. */
      const double lim = (double)FLT_MAX + 0x1p103;
      for (size_t i = 0; i < n; i++) {
        double d;
        memcpy(&d, src + 8 * i, 8);
        if (isfinite(d) && fabs(d) >= lim)
          return ampc__error(AMPC_ERANGE, "safetensors: tensor '%s': element %zu = %g does not fit in f32",
                             tname(t), i, d);
        dst[i] = (float)d;
      }
      return AMPC_OK;
    }
    default:
      return ampc__error(AMPC_EINVAL, "safetensors: tensor '%s': dtype %s is not a float type",
                         tname(t), st_dtype_name(t->dtype));
  }
}

ampc_status ampc_st_read_i32(const ampc_st_tensor *t, int32_t *dst, size_t n) {
  AMPC_TRY(check_read(t, n, "read_i32"));
  if (!dst && n) return ampc__error(AMPC_EINVAL, "ampc_st_read_i32: dst is NULL");
  const unsigned char *src = t->values;
  switch (t->dtype) {
    case AMPC_DTYPE_I64:
      for (size_t i = 0; i < n; i++) {
        int64_t v;
        memcpy(&v, src + 8 * i, 8);
        if (v < INT32_MIN || v > INT32_MAX)
          return ampc__error(AMPC_ERANGE, "safetensors: tensor '%s': element %zu = %" PRId64
                             " does not fit in int32", tname(t), i, v);
        dst[i] = (int32_t)v;
      }
      return AMPC_OK;
    case AMPC_DTYPE_I32:
      if (n) memcpy(dst, src, n * 4);
      return AMPC_OK;
    case AMPC_DTYPE_I16:
      for (size_t i = 0; i < n; i++) {
        int16_t v;
        memcpy(&v, src + 2 * i, 2);
        dst[i] = v;
      }
      return AMPC_OK;
    case AMPC_DTYPE_I8:
      for (size_t i = 0; i < n; i++) dst[i] = (int8_t)src[i];
      return AMPC_OK;
    case AMPC_DTYPE_U8:
      for (size_t i = 0; i < n; i++) dst[i] = src[i];
      return AMPC_OK;
    case AMPC_DTYPE_BOOL:
      for (size_t i = 0; i < n; i++) dst[i] = src[i] != 0;
      return AMPC_OK;
    default:
      return ampc__error(AMPC_EINVAL, "safetensors: tensor '%s': dtype %s is not an integer type",
                         tname(t), st_dtype_name(t->dtype));
  }
}

/* ---- writing ---------------------------------------------------------- */

/* Builds the header object: "__metadata__" first (as the official writer
 * does), then the tensors in the caller's order, packed back to back. */
static ampc_status build_header(const char *path, const ampc_st_tensor *ts, size_t n,
                                const char *const *meta, int streamed, json_t **out) {
  json_t *root = json_object();
  if (!root) return st_err(path, AMPC_ENOMEM, "out of memory");
  ampc_status s = AMPC_OK;
  if (meta && meta[0]) {
    json_t *md = json_object();
    if (!md || json_object_set_new(root, "__metadata__", md) != 0) {
      s = st_err(path, AMPC_ENOMEM, "out of memory");
      goto fail;
    }
    for (size_t i = 0; meta[i]; i += 2) {
      const char *k = meta[i], *v = meta[i + 1];
      if (!v) {
        s = st_err(path, AMPC_EINVAL, "metadata key '%s' has no value", k);
        goto fail;
      }
      size_t before = json_object_size(md);
      json_t *jv = json_string(v);
      if (!jv) {
        s = st_err(path, AMPC_EINVAL, "metadata '%s': value is not valid UTF-8", k);
        goto fail;
      }
      if (json_object_set_new(md, k, jv) != 0) {
        s = st_err(path, AMPC_EINVAL, "metadata key is not valid UTF-8");
        goto fail;
      }
      if (json_object_size(md) == before) {
        s = st_err(path, AMPC_EINVAL, "metadata key '%s' given twice", k);
        goto fail;
      }
    }
  }
  uint64_t off = 0;
  for (size_t i = 0; i < n; i++) {
    const ampc_st_tensor *t = &ts[i];
    if (!t->name) {
      s = st_err(path, AMPC_EINVAL, "tensor %zu has no name", i);
      goto fail;
    }
    if (strcmp(t->name, "__metadata__") == 0) {
      s = st_err(path, AMPC_EINVAL, "tensor name '__metadata__' is reserved");
      goto fail;
    }
    if ((unsigned)t->dtype >= AMPC_DTYPE_COUNT) {
      s = st_err(path, AMPC_EINVAL, "tensor '%s': invalid dtype %d", t->name, (int)t->dtype);
      goto fail;
    }
    int64_t numel = ampc_st_numel(t);
    size_t es = ampc_dtype_size(t->dtype);
    if (numel < 0 || (uint64_t)numel > (uint64_t)INT64_MAX / es) {
      s = st_err(path, AMPC_EINVAL, "tensor '%s': invalid shape (ndim %d, a negative dim, or overflow)",
                 t->name, t->ndim);
      goto fail;
    }
    if ((uint64_t)t->nbytes != (uint64_t)numel * es) {
      char sh[160];
      fmt_shape(sh, sizeof sh, t->ndim, t->shape);
      s = st_err(path, AMPC_EINVAL, "tensor '%s': nbytes %zu but %s %s needs %" PRIu64, t->name,
                 t->nbytes, st_dtype_name(t->dtype), sh, (uint64_t)numel * es);
      goto fail;
    }
    if (!t->values && t->nbytes && !streamed) {
      s = st_err(path, AMPC_EINVAL, "tensor '%s': data is NULL", t->name);
      goto fail;
    }
    if (off > (uint64_t)INT64_MAX - t->nbytes) {
      s = st_err(path, AMPC_EINVAL, "total data size overflows");
      goto fail;
    }
    json_t *shape = json_array(), *offs = json_array(), *e = json_object();
    int bad = !shape || !offs || !e;
    for (int d = 0; !bad && d < t->ndim; d++) bad |= json_array_append_new(shape, json_integer(t->shape[d]));
    bad = bad || json_array_append_new(offs, json_integer((json_int_t)off)) ||
          json_array_append_new(offs, json_integer((json_int_t)(off + t->nbytes)));
    bad = bad || json_object_set_new(e, "dtype", json_string(st_dtype_name(t->dtype)));
    /* set_new takes the reference whether or not it succeeds. */
    if (!bad) {
      bad = json_object_set_new(e, "shape", shape) != 0;
      shape = NULL;
    }
    if (!bad) {
      bad = json_object_set_new(e, "data_offsets", offs) != 0;
      offs = NULL;
    }
    if (bad) {
      json_decref(shape);
      json_decref(offs);
      json_decref(e);
      s = st_err(path, AMPC_ENOMEM, "out of memory");
      goto fail;
    }
    size_t before = json_object_size(root);
    if (json_object_set_new(root, t->name, e) != 0) {
      s = st_err(path, AMPC_EINVAL, "tensor %zu: name is not valid UTF-8", i);
      goto fail;
    }
    if (json_object_size(root) == before) {
      s = st_err(path, AMPC_EINVAL, "tensor name '%s' given twice", t->name);
      goto fail;
    }
    off += t->nbytes;
  }
  *out = root;
  return AMPC_OK;
fail:
  json_decref(root);
  return s;
}

/* The header as the file starts: its length (8 bytes), the JSON, and spaces
 * so that the data buffer starts at a multiple of 8. */
typedef struct {
  unsigned char len[8];
  char *json;
  size_t jlen, pad;
} st_header;

static ampc_status make_header(const char *path, const ampc_st_tensor *tensors, size_t n, const char *const *meta,
                               int streamed, st_header *h) {
  if (!path) return ampc__error(AMPC_EINVAL, "safetensors: write: path is NULL");
  if (n && !tensors) return st_err(path, AMPC_EINVAL, "tensors is NULL");
  json_t *root = NULL;
  AMPC_TRY(build_header(path, tensors, n, meta, streamed, &root));
  h->json = json_dumps(root, JSON_COMPACT);
  json_decref(root);
  if (!h->json) return st_err(path, AMPC_ENOMEM, "out of memory for the header");
  h->jlen = strlen(h->json);
  h->pad = (8 - (8 + h->jlen) % 8) % 8;
  uint64_t hlen = h->jlen + h->pad;
  for (int i = 0; i < 8; i++) h->len[i] = (unsigned char)(hlen >> (8 * i));
  return AMPC_OK;
}

static const char st_spaces[] = "        ";

ampc_status ampc_st_write(const char *path, const ampc_st_tensor *tensors, size_t n,
                          const char *const *meta) {
  st_header h;
  AMPC_TRY(make_header(path, tensors, n, meta, 0, &h));
  ampc__chunk *ch = malloc((n + 3) * sizeof *ch);
  if (!ch) {
    free(h.json);
    return st_err(path, AMPC_ENOMEM, "out of memory");
  }
  ch[0] = (ampc__chunk){h.len, 8};
  ch[1] = (ampc__chunk){h.json, h.jlen};
  ch[2] = (ampc__chunk){st_spaces, h.pad};
  for (size_t i = 0; i < n; i++) ch[3 + i] = (ampc__chunk){tensors[i].values, tensors[i].nbytes};
  ampc_status s = ampc__write_file_atomic_chunks(path, ch, n + 3);
  free(ch);
  free(h.json);
  if (s < 0) return ampc__error_prefix(s, "safetensors");
  return AMPC_OK;
}

typedef struct {
  const st_header *h;
  const ampc_st_tensor *t;
  size_t n;
  ampc_st_fetch fetch;
  void *ctx;
} st_stream;

static ampc_status fill_stream(void *ctx, ampc__wfile *w) {
  const st_stream *st = ctx;
  AMPC_TRY(ampc__wfile_write(w, st->h->len, 8));
  AMPC_TRY(ampc__wfile_write(w, st->h->json, st->h->jlen));
  AMPC_TRY(ampc__wfile_write(w, st_spaces, st->h->pad));
  size_t most = 0;
  for (size_t i = 0; i < st->n; i++)
    if (!st->t[i].values && st->t[i].nbytes > most) most = st->t[i].nbytes;
  void *buf = most ? malloc(most) : NULL;
  if (most && !buf) return ampc__error(AMPC_ENOMEM, "out of memory for %zu bytes", most);
  ampc_status s = AMPC_OK;
  for (size_t i = 0; i < st->n && s == 0; i++) {
    const void *p = st->t[i].values;
    if (!p && st->t[i].nbytes) {
      /* the callback's own message, or one naming the tensor where it set
       * none (the thread's last message would be another call's) */
      ampc_clear_error();
      s = st->fetch(st->ctx, i, buf);
      if (s < 0 && !ampc_last_error()[0])
        s = ampc__error(s, "tensor '%s': the fetch callback failed (status %d)", st->t[i].name, (int)s);
      if (s > 0) s = AMPC_OK; /* (only a negative status aborts) */
      p = buf;
    }
    if (s == 0) s = ampc__wfile_write(w, p, st->t[i].nbytes);
  }
  free(buf);
  return s;
}

ampc_status ampc_st_write_stream(const char *path, const ampc_st_tensor *tensors, size_t n, const char *const *meta,
                                 ampc_st_fetch fetch, void *ctx) {
  st_header h;
  AMPC_TRY(make_header(path, tensors, n, meta, fetch != NULL, &h));
  st_stream st = {&h, tensors, n, fetch, ctx};
  ampc_status s = ampc__write_file_atomic(path, fill_stream, &st);
  free(h.json);
  if (s < 0) return ampc__error_prefix(s, "safetensors");
  return AMPC_OK;
}
