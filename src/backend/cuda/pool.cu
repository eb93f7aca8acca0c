/* Pooling: max and average pools (one thread per output for forward, per
 * input for backward, which gathers from the windows that hold it: no
 * atomics, the cpu's order of additions), and the global average pool. */
#include "backend/cuda/cuda_common.cuh"

using namespace ampc_cu;

/* The window of output (oy, ox) in reading order: its first maximum, a NaN
 * beating any number (PyTorch's and the cpu backend's choice); -1 when the
 * window holds no element of the plane. */
AMPC__D int64_t window_winner(const void *x, int xt, int64_t base, int64_t H, int64_t W, int64_t oy, int64_t ox, int k,
                              int s, int p, float *val) {
  int64_t best = -1;
  float bv = 0.0f;
  for (int ky = 0; ky < k; ky++) {
    int64_t iy = oy * s - p + ky;
    if (iy < 0 || iy >= H) continue;
    for (int kx = 0; kx < k; kx++) {
      int64_t ix = ox * s - p + kx;
      if (ix < 0 || ix >= W) continue;
      float v = ld(x, xt, base + iy * W + ix);
      if (best < 0 || v > bv || (is_nan(v) && !is_nan(bv))) {
        bv = v;
        best = iy * W + ix;
      }
    }
  }
  *val = bv;
  return best;
}

__global__ void k_pool_fwd(const void *x, int xt, void *y, int yt, int64_t planes, int64_t H, int64_t W, int64_t OH,
                           int64_t OW, int k, int s, int p, int is_max) {
  AMPC_GRID_STRIDE(o, planes * OH * OW) {
    int64_t pl = idiv(o, OH * OW), r = o - pl * OH * OW, oy = idiv(r, OW), ox = r - oy * OW, base = pl * H * W;
    float v;
    if (is_max) {
      if (window_winner(x, xt, base, H, W, oy, ox, k, s, p, &v) < 0) v = -INFINITY;
    } else {
      float acc = 0.0f;
      for (int ky = 0; ky < k; ky++) {
        int64_t iy = oy * s - p + ky;
        if (iy < 0 || iy >= H) continue;
        for (int kx = 0; kx < k; kx++) {
          int64_t ix = ox * s - p + kx;
          if (ix >= 0 && ix < W) acc += ld(x, xt, base + iy * W + ix);
        }
      }
      v = acc / (float)(k * k); /* count_include_pad */
    }
    st(y, yt, o, v);
  }
}

extern "C" int ampc__cu_pool_fwd(ampc__cu_stream s, const void *x, int xt, void *y, int yt, int64_t planes, int64_t H,
                                 int64_t W, int64_t OH, int64_t OW, int k, int stride, int pad, int is_max) {
  size_t n = (size_t)(planes * OH * OW);
  if (!n) return 0;
  AMPC_LAUNCH(k_pool_fwd, grid_for(n), THREADS, 0, s, x, xt, y, yt, planes, H, W, OH, OW, k, stride, pad, is_max);
  return launch_status();
}

/* dx at input (iy, ix): the sum over the windows that hold it of their
 * gradient (average: a k*k-th share; max: all of it where it won), the
 * windows taken in reading order as the cpu adds them */
__global__ void k_pool_bwd(const void *x, int xt, const void *dy, int dyt, void *dx, int dxt, int acc, int64_t planes,
                           int64_t H, int64_t W, int64_t OH, int64_t OW, int k, int s, int p, int is_max,
                           ampc__cu_count *cnt) {
  counts c = {0, 0};
  AMPC_GRID_STRIDE(e, planes * H * W) {
    int64_t pl = idiv(e, H * W), r = e - pl * H * W, iy = idiv(r, W), ix = r - iy * W;
    /* the windows holding (iy, ix): oy * s - p <= iy < oy * s - p + k */
    int64_t oy0 = iy + p - k + 1 > 0 ? (iy + p - k + 1 + s - 1) / s : 0, oy1 = (iy + p) / s;
    int64_t ox0 = ix + p - k + 1 > 0 ? (ix + p - k + 1 + s - 1) / s : 0, ox1 = (ix + p) / s;
    if (oy1 > OH - 1) oy1 = OH - 1;
    if (ox1 > OW - 1) ox1 = OW - 1;
    float g = 0.0f;
    for (int64_t oy = oy0; oy <= oy1; oy++)
      for (int64_t ox = ox0; ox <= ox1; ox++) {
        float gy = ld(dy, dyt, pl * OH * OW + oy * OW + ox), v;
        if (is_max) {
          if (window_winner(x, xt, pl * H * W, H, W, oy, ox, k, s, p, &v) == r) g += gy;
        } else {
          g += gy / (float)(k * k);
        }
      }
    store_grad(dx, dxt, e, g, acc, c, cnt != NULL);
  }
  if (cnt) count_flush(c, cnt);
}

extern "C" int ampc__cu_pool_bwd(ampc__cu_stream s, const void *x, int xt, const void *dy, int dyt, void *dx, int dxt,
                                 int acc, int64_t planes, int64_t H, int64_t W, int64_t OH, int64_t OW, int k, int stride,
                                 int pad, int is_max, ampc__cu_count *cnt) {
  size_t n = (size_t)(planes * H * W);
  if (!n) return 0;
  AMPC_LAUNCH(k_pool_bwd, grid_for(n), THREADS, 0, s, x, xt, dy, dyt, dx, dxt, acc, planes, H, W, OH, OW, k, stride, pad,
              is_max, cnt);
  return launch_status();
}

/* one block per plane */
__global__ void k_gap_fwd(const void *x, int xt, void *y, int yt, int64_t HW) {
  __shared__ float sh[THREADS];
  int64_t pl = blockIdx.x;
  float a = 0.0f;
  for (int64_t i = threadIdx.x; i < HW; i += blockDim.x) a += ld(x, xt, pl * HW + i);
  a = block_sum<float>(a, sh);
  if (threadIdx.x == 0) st(y, yt, pl, a / (float)HW);
}

extern "C" int ampc__cu_gap_fwd(ampc__cu_stream s, const void *x, int xt, void *y, int yt, int64_t planes, int64_t HW) {
  if (!planes) return 0;
  unsigned threads = threads_upto(HW >= THREADS ? THREADS : HW >= 64 ? 64 : 32);
  AMPC_LAUNCH(k_gap_fwd, (unsigned)planes, threads, 0, s, x, xt, y, yt, HW);
  return launch_status();
}

__global__ void k_gap_bwd(const void *dy, int dyt, void *dx, int dxt, int acc, int64_t HW, size_t n, ampc__cu_count *cnt) {
  counts c = {0, 0};
  AMPC_GRID_STRIDE(e, n) {
    float g = ld(dy, dyt, idiv(e, HW)) / (float)HW;
    store_grad(dx, dxt, e, g, acc, c, cnt != NULL);
  }
  if (cnt) count_flush(c, cnt);
}

extern "C" int ampc__cu_gap_bwd(ampc__cu_stream s, const void *dy, int dyt, void *dx, int dxt, int acc, int64_t planes,
                                int64_t HW, ampc__cu_count *cnt) {
  size_t n = (size_t)(planes * HW);
  if (!n) return 0;
  AMPC_LAUNCH(k_gap_bwd, grid_for(n), THREADS, 0, s, dy, dyt, dx, dxt, acc, HW, n, cnt);
  return launch_status();
}
