/* Element-wise kernels: conversions, ReLU, add, the gradient pass of relu
 * and cast, bias fill and bias gradient, and f32 products stored as
 * gradients. Grid-stride loops over the elements; each block ends with its
 * underflow counts added once. */
#include "backend/cuda/cuda_common.cuh"

using namespace ampc_cu;

__global__ void k_convert(void *dst, int dt, const void *src, int st, size_t n) {
  AMPC_GRID_STRIDE(i, n) ampc_cu::st(dst, dt, i, ld(src, st, i));
}

extern "C" int ampc__cu_convert(ampc__cu_stream s, void *dst, int dt, const void *src, int st, size_t n) {
  if (!n) return 0;
  AMPC_LAUNCH(k_convert, grid_for(n), THREADS, 0, s, dst, dt, src, st, n);
  return launch_status();
}

__global__ void k_relu(const void *x, int xt, void *y, int yt, size_t n) {
  AMPC_GRID_STRIDE(i, n) {
    float v = ld(x, xt, i);
    st(y, yt, i, v <= 0.0f ? 0.0f : v); /* NaN stays */
  }
}

extern "C" int ampc__cu_relu(ampc__cu_stream s, const void *x, int xt, void *y, int yt, size_t n) {
  if (!n) return 0;
  AMPC_LAUNCH(k_relu, grid_for(n), THREADS, 0, s, x, xt, y, yt, n);
  return launch_status();
}

__global__ void k_grad_pass(const void *y, int yt, const void *dy, int dyt, void *dx, int dxt, int acc, size_t n,
                            ampc__cu_count *cnt) {
  counts c = {0, 0};
  AMPC_GRID_STRIDE(i, n) {
    float g = ld(dy, dyt, i);
    if (y && !(ld(y, yt, i) > 0.0f)) g = 0.0f;
    store_grad(dx, dxt, i, g, acc, c, cnt != NULL);
  }
  if (cnt) count_flush(c, cnt);
}

extern "C" int ampc__cu_grad_pass(ampc__cu_stream s, const void *y, int yt, const void *dy, int dyt, void *dx, int dxt,
                                  int acc, size_t n, ampc__cu_count *cnt) {
  if (!n) return 0;
  AMPC_LAUNCH(k_grad_pass, grid_for(n), THREADS, 0, s, y, yt, dy, dyt, dx, dxt, acc, n, cnt);
  return launch_status();
}

__global__ void k_add(const void *a, int at, const void *b, int bt, void *y, int yt, int relu, size_t n) {
  AMPC_GRID_STRIDE(i, n) {
    float v = ld(a, at, i) + ld(b, bt, i);
    if (relu) v = v <= 0.0f ? 0.0f : v;
    st(y, yt, i, v);
  }
}

extern "C" int ampc__cu_add(ampc__cu_stream s, const void *a, int at, const void *b, int bt, void *y, int yt, int relu,
                            size_t n) {
  if (!n) return 0;
  AMPC_LAUNCH(k_add, grid_for(n), THREADS, 0, s, a, at, b, bt, y, yt, relu, n);
  return launch_status();
}

__global__ void k_add_bwd(const void *y, int yt, int relu, const void *dy, int dyt, void *dx0, int dx0t, int acc0,
                          void *dx1, int dx1t, int acc1, size_t n, ampc__cu_count *cnt) {
  counts c = {0, 0};
  AMPC_GRID_STRIDE(i, n) {
    float g = ld(dy, dyt, i);
    if (relu && !(ld(y, yt, i) > 0.0f)) g = 0.0f;
    if (dx0) store_grad(dx0, dx0t, i, g, acc0, c, cnt != NULL);
    if (dx1) store_grad(dx1, dx1t, i, g, acc1, c, cnt != NULL);
  }
  if (cnt) count_flush(c, cnt);
}

extern "C" int ampc__cu_add_bwd(ampc__cu_stream s, const void *y, int yt, int relu, const void *dy, int dyt, void *dx0,
                                int dx0t, int acc0, void *dx1, int dx1t, int acc1, size_t n, ampc__cu_count *cnt) {
  if (!n || (!dx0 && !dx1)) return 0;
  AMPC_LAUNCH(k_add_bwd, grid_for(n), THREADS, 0, s, y, yt, relu, dy, dyt, dx0, dx0t, acc0, dx1, dx1t, acc1, n, cnt);
  return launch_status();
}

__global__ void k_fill_channels(void *y, int yt, const void *bias, int bt, int64_t C, int64_t HW, int V, size_t n) {
  AMPC_GRID_STRIDE(u, n / V) {
    float b = ld(bias, bt, imod(idiv(u * V, HW), C));
    for (int k = 0; k < V; k++) st(y, yt, u * V + k, b);
  }
}

extern "C" int ampc__cu_fill_channels(ampc__cu_stream s, void *y, int yt, const void *bias, int bt, int64_t N, int64_t C,
                                      int64_t HW) {
  size_t n = (size_t)(N * C * HW);
  if (!n) return 0;
  int V = run_of(HW);
  AMPC_LAUNCH(k_fill_channels, grid_for(n / V), THREADS, 0, s, y, yt, bias, bt, C, HW, V, n);
  return launch_status();
}

/* one block per channel: its threads take the elements (n, i) of the
 * channel in turn, then the block adds them up in a fixed order */
__global__ void k_channel_sum(const void *dy, int dyt, int64_t N, int64_t C, int64_t HW, void *db, int dbt, int acc,
                              ampc__cu_count *cnt) {
  __shared__ double sh[THREADS];
  int64_t ch = blockIdx.x, m = N * HW;
  double a = 0.0;
  for (int64_t j = threadIdx.x; j < m; j += blockDim.x) {
    int64_t n = idiv(j, HW), i = j - n * HW;
    a += (double)ld(dy, dyt, (n * C + ch) * HW + i);
  }
  a = block_sum<double>(a, sh);
  counts c = {0, 0};
  if (threadIdx.x == 0) store_grad(db, dbt, ch, (float)a, acc, c, cnt != NULL);
  if (cnt) count_flush(c, cnt);
}

extern "C" int ampc__cu_channel_sum(ampc__cu_stream s, const void *dy, int dyt, int64_t N, int64_t C, int64_t HW, void *db,
                                    int dbt, int acc, ampc__cu_count *cnt) {
  if (!C) return 0;
  AMPC_LAUNCH(k_channel_sum, (unsigned)C, THREADS, 0, s, dy, dyt, N, C, HW, db, dbt, acc, cnt);
  return launch_status();
}

__global__ void k_store_grad(const float *src, void *dx, int dxt, int acc, size_t n, ampc__cu_count *cnt) {
  counts c = {0, 0};
  AMPC_GRID_STRIDE(i, n) store_grad(dx, dxt, i, src[i], acc, c, cnt != NULL);
  if (cnt) count_flush(c, cnt);
}

extern "C" int ampc__cu_store_grad(ampc__cu_stream s, const float *src, void *dx, int dxt, int acc, size_t n,
                                   ampc__cu_count *cnt) {
  if (!n) return 0;
  AMPC_LAUNCH(k_store_grad, grid_for(n), THREADS, 0, s, src, dx, dxt, acc, n, cnt);
  return launch_status();
}

/* the underflow statistics of values already stored in 16 bits: the
 * non-zero ones and those subnormal */
__global__ void k_count_half(const void *p, int dt, size_t n, ampc__cu_count *cnt) {
  counts c = {0, 0};
  float tiny = dt == F16 ? 6.103515625e-05f : 1.17549435e-38f;
  AMPC_GRID_STRIDE(i, n) {
    float v = ld(p, dt, i);
    c.nonzero += v != 0.0f;
    c.lost += v != 0.0f && fabsf(v) < tiny;
  }
  count_flush(c, cnt);
}

extern "C" int ampc__cu_count_half(ampc__cu_stream s, const void *p, int dt, size_t n, ampc__cu_count *cnt) {
  if (!n) return 0;
  AMPC_LAUNCH(k_count_half, grid_for(n), THREADS, 0, s, p, dt, n, cnt);
  return launch_status();
}
