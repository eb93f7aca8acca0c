/* Element-wise kernels: conversions, ReLU, add, the gradient pass of relu
 * and cast, bias fill and bias gradient, and f32 products stored as
 * gradients. Grid-stride loops over the elements; each block ends with its
 * underflow counts added once. */
#include "backend/cuda/cuda_common.cuh"

using namespace ampc_cu;

/* Runs of V = 8 elements a load where n is a multiple of 8 and every
 * tensor starts 16-byte aligned (cuda_common.cuh's ldv/stv); else one at a
 * time. The same arithmetic either way. */
static int run_for(size_t n, const void *a, const void *b = NULL, const void *c = NULL, const void *d = NULL) {
  if (n % 8 || !vec_ok(a) || (b && !vec_ok(b)) || (c && !vec_ok(c)) || (d && !vec_ok(d))) return 1;
  return 8;
}
#define LAUNCH_RUN(V, kernel, n, ...)                                                       \
  do {                                                                                      \
    if ((V) == 8) AMPC_LAUNCH(kernel<8>, grid_for((n) / 8), THREADS, 0, s, __VA_ARGS__);    \
    else AMPC_LAUNCH(kernel<1>, grid_for(n), THREADS, 0, s, __VA_ARGS__);                   \
  } while (0)

template <int V>
__global__ void k_convert(void *dst, int dt, const void *src, int st, size_t n) {
  AMPC_GRID_STRIDE(u, n / V) {
    float v[V];
    ldv<V>(src, st, u * V, v);
    stv<V>(dst, dt, u * V, v);
  }
}

extern "C" int ampc__cu_convert(ampc__cu_stream s, void *dst, int dt, const void *src, int st, size_t n) {
  if (!n) return 0;
  LAUNCH_RUN(run_for(n, dst, src), k_convert, n, dst, dt, src, st, n);
  return launch_status();
}

template <int V>
__global__ void k_relu(const void *x, int xt, void *y, int yt, size_t n) {
  AMPC_GRID_STRIDE(u, n / V) {
    float v[V];
    ldv<V>(x, xt, u * V, v);
    AMPC_UNROLL
    for (int k = 0; k < V; k++) v[k] = v[k] <= 0.0f ? 0.0f : v[k]; /* NaN stays */
    stv<V>(y, yt, u * V, v);
  }
}

extern "C" int ampc__cu_relu(ampc__cu_stream s, const void *x, int xt, void *y, int yt, size_t n) {
  if (!n) return 0;
  LAUNCH_RUN(run_for(n, x, y), k_relu, n, x, xt, y, yt, n);
  return launch_status();
}

template <int V>
__global__ void k_grad_pass(const void *y, int yt, const void *dy, int dyt, void *dx, int dxt, int acc, size_t n,
                            ampc__cu_count *cnt) {
  counts c = {0, 0};
  AMPC_GRID_STRIDE(u, n / V) {
    float g[V];
    ldv<V>(dy, dyt, u * V, g);
    if (y) relu_mask<V>(y, yt, u * V, g);
    store_grad_v<V>(dx, dxt, u * V, g, acc, c, cnt != NULL);
  }
  if (cnt) count_flush(c, cnt);
}

extern "C" int ampc__cu_grad_pass(ampc__cu_stream s, const void *y, int yt, const void *dy, int dyt, void *dx, int dxt,
                                  int acc, size_t n, ampc__cu_count *cnt) {
  if (!n) return 0;
  LAUNCH_RUN(run_for(n, y, dy, dx), k_grad_pass, n, y, yt, dy, dyt, dx, dxt, acc, n, cnt);
  return launch_status();
}

template <int V>
__global__ void k_add(const void *a, int at, const void *b, int bt, void *y, int yt, int relu, size_t n) {
  AMPC_GRID_STRIDE(u, n / V) {
    float va[V], vb[V];
    ldv<V>(a, at, u * V, va);
    ldv<V>(b, bt, u * V, vb);
    AMPC_UNROLL
    for (int k = 0; k < V; k++) {
      va[k] += vb[k];
      if (relu) va[k] = va[k] <= 0.0f ? 0.0f : va[k];
    }
    stv<V>(y, yt, u * V, va);
  }
}

extern "C" int ampc__cu_add(ampc__cu_stream s, const void *a, int at, const void *b, int bt, void *y, int yt, int relu,
                            size_t n) {
  if (!n) return 0;
  LAUNCH_RUN(run_for(n, a, b, y), k_add, n, a, at, b, bt, y, yt, relu, n);
  return launch_status();
}

template <int V>
__global__ void k_add_bwd(const void *y, int yt, int relu, const void *dy, int dyt, void *dx0, int dx0t, int acc0,
                          void *dx1, int dx1t, int acc1, size_t n, ampc__cu_count *cnt) {
  counts c = {0, 0};
  AMPC_GRID_STRIDE(u, n / V) {
    float g[V];
    ldv<V>(dy, dyt, u * V, g);
    if (relu) relu_mask<V>(y, yt, u * V, g);
    if (dx0) {
      float g0[V];
      AMPC_UNROLL
      for (int k = 0; k < V; k++) g0[k] = g[k];
      store_grad_v<V>(dx0, dx0t, u * V, g0, acc0, c, cnt != NULL);
    }
    if (dx1) store_grad_v<V>(dx1, dx1t, u * V, g, acc1, c, cnt != NULL);
  }
  if (cnt) count_flush(c, cnt);
}

extern "C" int ampc__cu_add_bwd(ampc__cu_stream s, const void *y, int yt, int relu, const void *dy, int dyt, void *dx0,
                                int dx0t, int acc0, void *dx1, int dx1t, int acc1, size_t n, ampc__cu_count *cnt) {
  if (!n || (!dx0 && !dx1)) return 0;
  LAUNCH_RUN(run_for(n, relu ? y : NULL, dy, dx0, dx1), k_add_bwd, n, y, yt, relu, dy, dyt, dx0, dx0t, acc0, dx1, dx1t, acc1,
             n, cnt);
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
  AMPC_GRID_STRIDE(i, n) count_grad(c, dt, ld(p, dt, i));
  count_flush(c, cnt);
}

extern "C" int ampc__cu_count_half(ampc__cu_stream s, const void *p, int dt, size_t n, ampc__cu_count *cnt) {
  if (!n) return 0;
  AMPC_LAUNCH(k_count_half, grid_for(n), THREADS, 0, s, p, dt, n, cnt);
  return launch_status();
}
