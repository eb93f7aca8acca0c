/*
 * tensor.h -- a tensor is a typed view of memory: storage type + shape.
 *
 * Tensors in ampc do not own memory; the graph, the model and the data
 * loader own the buffers and hand out views. Shapes are row-major (C
 * order), at most 4 dims, images as (N, C, H, W).
 */
#ifndef AMPC_TENSOR_H
#define AMPC_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#include "ampc/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

#define AMPC_MAX_DIMS 4

typedef struct {
  int ndim;
  int64_t d[AMPC_MAX_DIMS];
} ampc_shape;

typedef struct {
  void *data;
  ampc_dtype dtype;
  ampc_shape shape;
} ampc_tensor;

static inline ampc_shape ampc_shape_make(int ndim, const int64_t *d) {
  ampc_shape s = {ndim, {1, 1, 1, 1}};
  for (int i = 0; i < ndim && i < AMPC_MAX_DIMS; i++) s.d[i] = d[i];
  return s;
}
static inline ampc_shape ampc_shape4(int64_t n, int64_t c, int64_t h, int64_t w) {
  ampc_shape s = {4, {n, c, h, w}};
  return s;
}
static inline ampc_shape ampc_shape2(int64_t n, int64_t c) {
  ampc_shape s = {2, {n, c, 1, 1}};
  return s;
}
static inline ampc_shape ampc_shape1(int64_t n) {
  ampc_shape s = {1, {n, 1, 1, 1}};
  return s;
}
static inline int64_t ampc_shape_numel(const ampc_shape *s) {
  int64_t n = 1;
  for (int i = 0; i < s->ndim; i++) n *= s->d[i];
  return n;
}
static inline int64_t ampc_tensor_numel(const ampc_tensor *t) { return ampc_shape_numel(&t->shape); }
static inline size_t ampc_tensor_nbytes(const ampc_tensor *t) {
  return (size_t)ampc_tensor_numel(t) * ampc_dtype_size(t->dtype);
}
/* "(128, 64, 32, 32)" into buf (cut to len); returns buf. A NULL s writes "(?)". */
char *ampc_shape_str(const ampc_shape *s, char *buf, size_t len);

#ifdef __cplusplus
}
#endif
#endif
