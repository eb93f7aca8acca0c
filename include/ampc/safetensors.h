/*
 * safetensors.h -- reading and writing .safetensors files.
 *
 * The format (the one Hugging Face's `safetensors` package and PyTorch users
 * exchange weights in): an 8-byte little-endian u64 N, then N bytes of UTF-8
 * JSON (possibly padded with trailing spaces), then the data buffer. The JSON
 * object maps each tensor name to {"dtype", "shape", "data_offsets": [begin,
 * end]} (offsets relative to the data buffer), plus an optional
 * "__metadata__" object of string -> string. Tensors are little-endian and
 * C-contiguous, and together cover the data buffer exactly: no gaps, no
 * overlaps.
 *
 * Reading loads and validates the whole file once; the handle is then a
 * read-only view, safe to share between threads:
 *
 *     ampc_st_file *f;
 *     if (ampc_st_open(&f, "model.safetensors") < 0) {
 *         fprintf(stderr, "error: %s\n", ampc_last_error());
 *         return 1;
 *     }
 *     const ampc_st_tensor *w = ampc_st_find(f, "fc.weight");  // NULL if absent
 *     float buf[10 * 784];
 *     if (w && ampc_st_read_f32(w, buf, 10 * 784) == 0) { ... }   // converts f16/bf16/f64
 *     ampc_st_close(f);
 *
 * Writing takes an array of tensor descriptions and replaces the file
 * atomically (a crash or a full disk leaves the old file as it was):
 *
 *     float w[10 * 784], b[10];   // (out, in) and (out,)
 *     ampc_st_tensor t[] = {
 *         {"fc.weight", AMPC_DTYPE_F32, 2, {10, 784}, w, sizeof w},
 *         {"fc.bias",   AMPC_DTYPE_F32, 1, {10},      b, sizeof b},
 *     };
 *     const char *meta[] = {"format", "pt", NULL};
 *     ampc_st_write("model.safetensors", t, 2, meta);
 *
 * Files written here are read by the official implementations and vice
 * versa. In memory, every tensor's `values` from ampc_st_open or
 * ampc_st_open_memory is aligned to 64 bytes (so it can be used as a typed
 * array directly), whatever its offset in the file.
 */
#ifndef AMPC_SAFETENSORS_H
#define AMPC_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "ampc/dtype.h"
#include "ampc/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Most dims a tensor may have. */
#define AMPC_ST_MAX_DIMS 8

/* One tensor: a description for ampc_st_write, or a view into an open file.
 * ndim 0 is a scalar (one element). nbytes == numel * ampc_dtype_size(dtype). */
typedef struct {
  const char *name;
  ampc_dtype dtype;
  int ndim;
  int64_t shape[AMPC_ST_MAX_DIMS];
  const void *values;     /* nbytes of little-endian elements */
  size_t nbytes;
} ampc_st_tensor;

/* An open file: opaque, read-only, owns the tensors' names and data. */
typedef struct ampc_st_file ampc_st_file;

/* Reads the whole file at path and validates it. On failure *out is NULL and
 * the message names the file and what is wrong. AMPC_ENOTFOUND if the file
 * does not exist, AMPC_EIO if it cannot be read, AMPC_EFORMAT if it is
 * malformed, AMPC_EUNSUPPORTED for a valid dtype ampc has no type for
 * (U16, U32, U64, F8_*) or more than AMPC_ST_MAX_DIMS dims. */
ampc_status ampc_st_open(ampc_st_file **out, const char *path);

/* Reads and validates only the header (names, dtypes, shapes, offsets and
 * metadata, checked as ampc_st_open checks them), not the data: every
 * tensor's data is NULL, so reading one fails with AMPC_EINVAL. For looking
 * at a large file's metadata before deciding to load it. */
ampc_status ampc_st_open_header(ampc_st_file **out, const char *path);

/* The same from a buffer in memory (copied; buf may be freed after the call).
 * label names the buffer in error messages (NULL: "<memory>"). */
ampc_status ampc_st_open_memory(ampc_st_file **out, const void *buf, size_t len,
                                const char *label);

/* Frees everything; the tensors and strings it returned become invalid.
 * NULL is a no-op. */
void ampc_st_close(ampc_st_file *f);

/* The accessors below take a NULL f as an empty file (label NULL, count 0,
 * every lookup NULL). */

/* The path or label the file was opened with. */
const char *ampc_st_label(const ampc_st_file *f);

/* Number of tensors. */
size_t ampc_st_count(const ampc_st_file *f);

/* The i-th tensor (i < count), in the order of their data in the file;
 * NULL if i is out of range. */
const ampc_st_tensor *ampc_st_get(const ampc_st_file *f, size_t i);

/* The tensor with this name, or NULL if absent. */
const ampc_st_tensor *ampc_st_find(const ampc_st_file *f, const char *name);

/* Value of a "__metadata__" key, or NULL if absent. */
const char *ampc_st_metadata(const ampc_st_file *f, const char *key);

/* Number of metadata entries, and the i-th key in byte order (NULL if out
 * of range), for listing them. */
size_t ampc_st_metadata_count(const ampc_st_file *f);
const char *ampc_st_metadata_key(const ampc_st_file *f, size_t i);

/* Writes n tensors to path, atomically: a temporary file in the same folder
 * is written, flushed to disk, and renamed over path, then the folder is
 * flushed. On failure path is unchanged and the temporary file removed.
 *
 * meta: NULL-terminated array of key, value, key, value, ..., NULL (or NULL
 * for no metadata). Names and metadata must be valid UTF-8 and unique; the
 * name "__metadata__" is reserved. Tensor data is written in the order
 * given, back to back (the format allows no gaps); the header is padded
 * with spaces so the data buffer starts at a file offset that is a multiple
 * of 8. */
ampc_status ampc_st_write(const char *path, const ampc_st_tensor *tensors, size_t n,
                          const char *const *meta);

/* The same, with the values of tensors whose `values` is NULL fetched one at a
 * time while the file is written: fetch(ctx, i, buf) fills buf with
 * tensors[i].nbytes bytes (a buffer of the largest such tensor, reused), and
 * a negative status from it aborts the write. For data that is not in host
 * memory (a device's), without a copy of all of it at once. */
typedef ampc_status (*ampc_st_fetch)(void *ctx, size_t i, void *buf);
ampc_status ampc_st_write_stream(const char *path, const ampc_st_tensor *tensors, size_t n,
                                 const char *const *meta, ampc_st_fetch fetch, void *ctx);

/* Number of elements (product of the shape; 1 for ndim 0); -1 if the
 * description is invalid (ndim out of range, a negative dim, overflow). */
int64_t ampc_st_numel(const ampc_st_tensor *t);

/* Copies the tensor into dst as f32, converting from F32, F16, BF16 or F64.
 * n must equal the tensor's element count. AMPC_EINVAL for a count mismatch,
 * a NULL t or dst, or a non-float tensor; AMPC_ERANGE for a finite F64 value too large for
 * f32 (NaN and infinities are kept). */
ampc_status ampc_st_read_f32(const ampc_st_tensor *t, float *dst, size_t n);

/* Copies an integer (or BOOL) tensor into dst as int32: from I64, I32, I16,
 * I8, U8, BOOL. n must equal the element count. AMPC_EINVAL for a count
 * mismatch, a NULL t or dst, or a float tensor; AMPC_ERANGE for an I64 value outside int32. */
ampc_status ampc_st_read_i32(const ampc_st_tensor *t, int32_t *dst, size_t n);

#ifdef __cplusplus
}
#endif
#endif
