/* Rows of (N, K): softmax, log-softmax and the cross-entropy loss with label
 * smoothing, forward and backward. One block per row; the row's maximum and
 * its sum of exponentials in f64, as the cpu backend's loss.c computes them. */
#include "backend/cuda/cuda_common.cuh"

using namespace ampc_cu;

/* the threads of a row's block */
static unsigned row_threads(int64_t K) { return threads_upto(K > 128 ? THREADS : K > 32 ? 128 : 32); }

/* log(sum(exp(x - max))) + max of row x (every thread of the block calls it) */
AMPC__D float row_lse(const void *x, int xt, int64_t off, int64_t K, float *shf, double *shd) {
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < K; j += blockDim.x) {
    float v = ld(x, xt, off + j);
    mx = v > mx ? v : mx;
  }
  mx = block_max(mx, shf);
  double s = 0.0;
  for (int64_t j = threadIdx.x; j < K; j += blockDim.x) s += exp((double)(ld(x, xt, off + j) - mx));
  s = block_sum<double>(s, shd);
  return mx + (float)log(s);
}

__global__ void k_softmax_fwd(const void *x, int xt, void *y, int yt, int64_t K, int is_log) {
  __shared__ float shf[THREADS];
  __shared__ double shd[THREADS];
  int64_t off = (int64_t)blockIdx.x * K;
  float lse = row_lse(x, xt, off, K, shf, shd);
  for (int64_t j = threadIdx.x; j < K; j += blockDim.x) {
    float o = ld(x, xt, off + j) - lse;
    st(y, yt, off + j, is_log ? o : expf(o));
  }
}

extern "C" int ampc__cu_softmax_fwd(ampc__cu_stream s, const void *x, int xt, void *y, int yt, int64_t N, int64_t K,
                                    int is_log) {
  if (!N) return 0;
  AMPC_LAUNCH(k_softmax_fwd, (unsigned)N, row_threads(K), 0, s, x, xt, y, yt, K, is_log);
  return launch_status();
}

/* softmax: dx = y * (dy - sum(dy * y)); log-softmax: dx = dy - exp(y) * sum(dy) */
__global__ void k_softmax_bwd(const void *y, int yt, const void *dy, int dyt, void *dx, int dxt, int acc, int64_t K,
                              int is_log, ampc__cu_count *cnt) {
  __shared__ double shd[THREADS];
  int64_t off = (int64_t)blockIdx.x * K;
  double s = 0.0;
  for (int64_t j = threadIdx.x; j < K; j += blockDim.x)
    s += is_log ? (double)ld(dy, dyt, off + j) : (double)ld(dy, dyt, off + j) * ld(y, yt, off + j);
  float sf = (float)block_sum<double>(s, shd);
  counts c = {0, 0};
  for (int64_t j = threadIdx.x; j < K; j += blockDim.x) {
    float yv = ld(y, yt, off + j), g = ld(dy, dyt, off + j);
    float o = is_log ? g - expf(yv) * sf : yv * (g - sf);
    store_grad(dx, dxt, off + j, o, acc, c, cnt != NULL);
  }
  if (cnt) count_flush(c, cnt);
}

extern "C" int ampc__cu_softmax_bwd(ampc__cu_stream s, const void *y, int yt, const void *dy, int dyt, void *dx, int dxt,
                                    int acc, int64_t N, int64_t K, int is_log, ampc__cu_count *cnt) {
  if (!N || !dx) return 0;
  AMPC_LAUNCH(k_softmax_bwd, (unsigned)N, row_threads(K), 0, s, y, yt, dy, dyt, dx, dxt, acc, K, is_log, cnt);
  return launch_status();
}

/* One row's loss: -(1 - sm) * logp[label] - sm / K * sum(logp); 0 for a
 * label out of range (reported by k_ce_final). */
__global__ void k_ce_rows(const void *x, int xt, const int32_t *labels, int64_t K, float sm, float *losses) {
  __shared__ float shf[THREADS];
  __shared__ double shd[THREADS];
  int64_t n = blockIdx.x, off = n * K;
  int32_t lab = labels[n];
  float lse = row_lse(x, xt, off, K, shf, shd);
  double s = 0.0;
  if (sm > 0)
    for (int64_t j = threadIdx.x; j < K; j += blockDim.x) s += (double)(ld(x, xt, off + j) - lse);
  s = block_sum<double>(s, shd);
  if (threadIdx.x == 0) {
    double l = 0.0;
    if (lab >= 0 && lab < K) {
      l = -(double)(1.0f - sm) * (double)(ld(x, xt, off + lab) - lse);
      if (sm > 0) l -= (double)sm / (double)K * s;
    }
    losses[n] = (float)l;
  }
}

/* The mean of the row losses (f64, a fixed order) into out, and the first
 * sample whose label is out of range into *err. One block. */
__global__ void k_ce_final(const float *losses, const int32_t *labels, int64_t N, int64_t K, void *out, int ot,
                           ampc__cu_error *err) {
  __shared__ double shd[THREADS];
  __shared__ unsigned long long shu[THREADS];
  double t = 0.0;
  unsigned long long first = ~0ull;
  for (int64_t n = threadIdx.x; n < N; n += blockDim.x) {
    t += losses[n];
    if ((labels[n] < 0 || labels[n] >= K) && first == ~0ull) first = (unsigned long long)n;
  }
  t = block_sum<double>(t, shd);
  /* the smallest bad index: a min through the shared tree */
  shu[threadIdx.x] = first;
  __syncthreads();
  for (int s = THREADS / 2; s > 0; s >>= 1) {
    if ((int)threadIdx.x < s && threadIdx.x + s < blockDim.x && shu[threadIdx.x + s] < shu[threadIdx.x])
      shu[threadIdx.x] = shu[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    st(out, ot, 0, (float)(t / (double)N));
    if (shu[0] != ~0ull && err->code == 0) {
      err->code = AMPC__CU_ERR_LABEL;
      err->label = labels[shu[0]];
      err->sample = (long long)shu[0];
      err->classes = (long long)K;
    }
  }
}

extern "C" int ampc__cu_ce_fwd(ampc__cu_stream s, const void *x, int xt, const int32_t *labels, void *out, int ot,
                               int64_t N, int64_t K, float smoothing, float *losses, ampc__cu_error *err) {
  if (!N) return 0;
  AMPC_LAUNCH(k_ce_rows, (unsigned)N, row_threads(K), 0, s, x, xt, labels, K, smoothing, losses);
  AMPC_LAUNCH(k_ce_final, 1u, THREADS, 0, s, losses, labels, N, K, out, ot, err);
  return launch_status();
}

/* d logits = seed / N * (softmax - target), target = (1 - sm) one-hot + sm / K */
__global__ void k_ce_bwd(const void *x, int xt, const int32_t *labels, void *dx, int dxt, int acc, int64_t N, int64_t K,
                         float sm, float seed, ampc__cu_count *cnt) {
  __shared__ float shf[THREADS];
  __shared__ double shd[THREADS];
  int64_t n = blockIdx.x, off = n * K;
  int32_t lab = labels[n];
  float lse = row_lse(x, xt, off, K, shf, shd), scale = seed / (float)N;
  counts c = {0, 0};
  for (int64_t j = threadIdx.x; j < K; j += blockDim.x) {
    float t = sm / (float)K + (j == lab ? 1.0f - sm : 0.0f);
    float o = scale * (expf(ld(x, xt, off + j) - lse) - t);
    store_grad(dx, dxt, off + j, o, acc, c, cnt != NULL);
  }
  if (cnt) count_flush(c, cnt);
}

extern "C" int ampc__cu_ce_bwd(ampc__cu_stream s, const void *x, int xt, const int32_t *labels, void *dx, int dxt, int acc,
                               int64_t N, int64_t K, float smoothing, float seed, ampc__cu_count *cnt) {
  if (!N || !dx) return 0;
  AMPC_LAUNCH(k_ce_bwd, (unsigned)N, row_threads(K), 0, s, x, xt, labels, dx, dxt, acc, N, K, smoothing, seed, cnt);
  return launch_status();
}
