/* Element-wise ops (relu, add, cast) and the shared sum and ReLU-mask loops.
 * Each works in blocks of CPU_CHUNK elements staged as f32, in parallel.
 * (Pooling is pool.c's; softmax and the loss are loss.c's.) */
#include <math.h>
#include <omp.h>

#include "backend/cpu/cpu_internal.h"

#define FOR_BLOCKS(c, total, body)                                                 \
  do {                                                                             \
    int64_t nblk_ = ((total) + CPU_CHUNK - 1) / CPU_CHUNK;                         \
    _Pragma("omp parallel for num_threads(cpu_ctx(c)->nthreads) schedule(dynamic, 16) if (nblk_ > 16)") \
    for (int64_t b_ = 0; b_ < nblk_; b_++) {                                       \
      float *t0 = cpu_ws_slice((c), omp_get_thread_num(), 4 * CPU_CHUNK, 0);       \
      float *t1 = t0 + CPU_CHUNK, *t2 = t1 + CPU_CHUNK, *t3 = t2 + CPU_CHUNK;      \
      int64_t i0 = b_ * CPU_CHUNK;                                                 \
      size_t n = (size_t)((total) - i0 < CPU_CHUNK ? (total) - i0 : CPU_CHUNK);    \
      (void)t0; (void)t1; (void)t2; (void)t3;                                      \
      body                                                                         \
    }                                                                              \
  } while (0)

/* The loops of the element-wise ops, built for AVX2 and the baseline and
 * free of branches (in the plain loop a data-dependent ternary became a
 * branch, mispredicted on every other element). */
CPU_VECTOR static void relu_f32(const float *x, size_t n, float *y) {
  for (size_t i = 0; i < n; i++) y[i] = x[i] <= 0.0f ? 0.0f : x[i]; /* NaN stays NaN */
}
CPU_VECTOR static void mask_f32(const float *y, const float *dy, size_t n, float *out) {
  for (size_t i = 0; i < n; i++) out[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}
CPU_VECTOR static void add_f32(const float *a, const float *b, size_t n, int relu, float *y) {
  if (relu)
    for (size_t i = 0; i < n; i++) {
      float v = a[i] + b[i];
      y[i] = v <= 0.0f ? 0.0f : v;
    }
  else
    for (size_t i = 0; i < n; i++) y[i] = a[i] + b[i];
}

ampc_status ampc__cpu_relu_fwd(const ampc__op_call *c) {
  int64_t total = ampc_tensor_numel(&c->out);
  FOR_BLOCKS(c, total, {
    const float *x = cpu_load(&c->in[0], i0, n, t0);
    float *y = cpu_out(&c->out, i0, t1);
    relu_f32(x, n, y);
    cpu_commit(&c->out, i0, y, n);
  });
  return AMPC_OK;
}

/* dx = dy where the output was positive (the output carries the mask, so the
 * input need not be kept). */
ampc_status ampc__cpu_relu_bwd(const ampc__op_call *c) {
  if (!c->din[0].data) return AMPC_OK;
  int64_t total = ampc_tensor_numel(&c->out);
  FOR_BLOCKS(c, total, {
    const float *y = cpu_load(&c->out, i0, n, t0);
    const float *dy = cpu_load(&c->dout, i0, n, t1);
    mask_f32(y, dy, n, t2);
    cpu_store_grad(c, &c->din[0], i0, t2, n, c->din_acc[0], t3);
  });
  return AMPC_OK;
}

ampc_status ampc__cpu_add_fwd(const ampc__op_call *c) {
  int64_t total = ampc_tensor_numel(&c->out);
  FOR_BLOCKS(c, total, {
    const float *a = cpu_load(&c->in[0], i0, n, t0);
    const float *b = cpu_load(&c->in[1], i0, n, t1);
    float *y = cpu_out(&c->out, i0, t2);
    add_f32(a, b, n, c->attr.relu, y);
    cpu_commit(&c->out, i0, y, n);
  });
  return AMPC_OK;
}

ampc_status ampc__cpu_add_bwd(const ampc__op_call *c) {
  int64_t total = ampc_tensor_numel(&c->out);
  FOR_BLOCKS(c, total, {
    const float *dy = cpu_load(&c->dout, i0, n, t0);
    if (c->attr.relu) {
      const float *y = cpu_load(&c->out, i0, n, t3);
      mask_f32(y, dy, n, t0);
      dy = t0;
    }
    for (int j = 0; j < 2; j++) {
      if (!c->din[j].data) continue;
      /* stored as it is (a store without accumulation only reads it), or
       * through a copy the accumulation adds into */
      float *g = (float *)dy;
      if (c->din_acc[j]) {
        memcpy(t1, dy, n * sizeof(float));
        g = t1;
      }
      cpu_store_grad(c, &c->din[j], i0, g, n, c->din_acc[j], t2);
    }
  });
  return AMPC_OK;
}

/* Straight from one storage type to the other, block by block. */
ampc_status ampc__cpu_cast_fwd(const ampc__op_call *c) {
  int64_t total = ampc_tensor_numel(&c->out);
  FOR_BLOCKS(c, total, { ampc_convert(c->out.dtype, cpu_at(&c->out, i0), c->in[0].dtype, cpu_at(&c->in[0], i0), n); });
  return AMPC_OK;
}

ampc_status ampc__cpu_cast_bwd(const ampc__op_call *c) {
  if (!c->din[0].data) return AMPC_OK;
  int64_t total = ampc_tensor_numel(&c->out);
  FOR_BLOCKS(c, total, {
    const float *dy = cpu_load(&c->dout, i0, n, t0);
    for (size_t i = 0; i < n; i++) t1[i] = dy[i];
    cpu_store_grad(c, &c->din[0], i0, t1, n, c->din_acc[0], t2);
  });
  return AMPC_OK;
}

CPU_VECTOR static float sum_f32(const float *x, size_t n) {
  cpu_v8f_al a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
  size_t i = 0;
  for (; i + 32 <= n; i += 32) a0 += cpu_ld8(x + i), a1 += cpu_ld8(x + i + 8), a2 += cpu_ld8(x + i + 16), a3 += cpu_ld8(x + i + 24);
  for (; i + 8 <= n; i += 8) a0 += cpu_ld8(x + i);
  for (; i < n; i++) a0[0] += x[i];
  a0 = (a0 + a1) + (a2 + a3);
  return cpu_hsum8(a0);
}

/* The entry points the other files call: a multiversioned (target_clones)
 * function must be defined before its first use in a file, and stays static
 * here. */
float ampc__cpu_sum(const float *x, size_t n) { return sum_f32(x, n); }
void ampc__cpu_relu_mask(const float *y, const float *dy, size_t n, float *out) { mask_f32(y, dy, n, out); }
