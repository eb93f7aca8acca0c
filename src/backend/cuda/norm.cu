/* Batch normalisation over (N, H, W) for each channel, PyTorch semantics, as
 * the cpu backend's norm.c: training normalises with the biased batch
 * variance and moves the running statistics towards the unbiased one; eval
 * uses the running statistics. A ReLU, and a 2x2 stride-2 max pool after it,
 * may be fused: the pooled output is what is stored, each window's winner
 * (0..3 in reading order) is kept in aux after the statistics, and backward
 * sends the pooled gradient to the winners.
 *
 * Statistics: the channel's elements are cut into P parts; a block per
 * (channel, part) sums them (shifted by the channel's first value, in f32 per
 * thread and f64 across), and one thread per channel adds the parts in order
 * -- the same result every run, whatever the scheduling. */
#include "backend/cuda/cuda_common.cuh"

using namespace ampc_cu;

static const int64_t BN_PER_BLOCK = 4096, BN_MAX_PARTS = 64;

static int64_t bn_parts(int64_t N, int64_t HW) {
  int64_t p = (N * HW + BN_PER_BLOCK - 1) / BN_PER_BLOCK;
  return p < 1 ? 1 : p > BN_MAX_PARTS ? BN_MAX_PARTS : p;
}

/* workspace: the parts' sums (2 doubles each), then 4 floats per channel */
extern "C" size_t ampc__cu_bn_ws(int64_t N, int64_t C, int64_t HW) {
  return (size_t)(C * bn_parts(N, HW)) * 2 * sizeof(double) + (size_t)C * 4 * sizeof(float) + 256;
}

struct bn_geom {
  int64_t N, C, H, W, HW, OH, OW, PHW, P;
  int V, VP; /* elements a thread takes in a row: of x (V divides W), of the pooled output (VP divides OW) */
};

static bn_geom geometry(const ampc__cu_bn *p) {
  bn_geom g;
  g.N = p->N;
  g.C = p->C;
  g.H = p->H;
  g.W = p->W;
  g.HW = p->H * p->W;
  g.OH = p->H / 2;
  g.OW = p->W / 2;
  g.PHW = g.OH * g.OW;
  g.P = bn_parts(p->N, g.HW);
  g.V = run_of(g.W);
  g.VP = g.OW > 0 ? run_of(g.OW) : 1;
  return g;
}

static double *ws_parts(const ampc__cu_bn *p) { return (double *)p->ws; }
static float *ws_channels(const ampc__cu_bn *p, const bn_geom &g) { return (float *)((double *)p->ws + 2 * g.C * g.P); }
AMPC__HD unsigned char *winners(float *aux, int64_t C) { return (unsigned char *)(aux + 2 * C + 1); }

/* part [lo, hi) of m units, for part p of P */
AMPC__D void part_range(int64_t m, int64_t P, int64_t p, int64_t *lo, int64_t *hi) {
  int64_t L = (m + P - 1) / P;
  *lo = p * L < m ? p * L : m;
  *hi = (p + 1) * L < m ? (p + 1) * L : m;
}

/* ---- forward ---- */

/* block (c, part): sums of (x - k) and (x - k)^2, k = the channel's first value;
 * V = g.V elements a load */
template <int V>
__global__ void k_bn_stats(const void *x, int xt, bn_geom g, double *parts) {
  __shared__ double sh[THREADS];
  int64_t c = blockIdx.x / g.P, part = blockIdx.x - c * g.P, lo, hi;
  part_range(g.N * g.HW / V, g.P, part, &lo, &hi); /* in runs of V */
  float k0 = ld(x, xt, c * g.HW), a = 0.0f, b = 0.0f;
  for (int64_t u = lo + threadIdx.x; u < hi; u += blockDim.x) {
    int64_t j = u * V, n = idiv(j, g.HW), base = (n * g.C + c) * g.HW + (j - n * g.HW);
    float xv[V];
    ldv<V>(x, xt, base, xv);
    AMPC_UNROLL
    for (int v = 0; v < V; v++) {
      float d = xv[v] - k0;
      a += d;
      b += d * d;
    }
  }
  double sa = block_sum<double>(a, sh), sb = block_sum<double>(b, sh);
  if (threadIdx.x == 0) {
    parts[2 * blockIdx.x] = sa;
    parts[2 * blockIdx.x + 1] = sb;
  }
}

/* one thread per channel: the statistics (training: from the parts; eval:
 * the running ones) into aux, the running statistics moved, and the scale
 * and shift the output applies into ss (2 floats per channel) */
__global__ void k_bn_finish(const void *x, int xt, const void *gamma, int gt, const void *beta, int bt, float *rm,
                            float *rv, int64_t *nbt, float *aux, bn_geom g, const double *parts, float mom, float eps,
                            int training, float *ss) {
  int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (c == 0) {
    aux[2 * g.C] = training ? 1.0f : 0.0f; /* which statistics backward differentiates */
    if (training && nbt) nbt[0] += 1;
  }
  if (c >= g.C) return;
  float mean, invstd;
  if (training) {
    double sum = 0.0, sq = 0.0, count = (double)(g.N * g.HW);
    for (int64_t p = 0; p < g.P; p++) {
      sum += parts[2 * (c * g.P + p)];
      sq += parts[2 * (c * g.P + p) + 1];
    }
    float k0 = ld(x, xt, c * g.HW);
    double md = sum / count;
    mean = (float)(k0 + md);
    sq -= md * sum; /* sum of squared deviations from the mean */
    if (sq < 0) sq = 0;
    float var = (float)(sq / count);
    invstd = 1.0f / sqrtf(var + eps);
    float unbiased = (float)(sq / (count - 1.0));
    rm[c] = (1.0f - mom) * rm[c] + mom * mean;
    rv[c] = (1.0f - mom) * rv[c] + mom * unbiased;
  } else {
    mean = rm[c];
    invstd = 1.0f / sqrtf(rv[c] + eps);
  }
  aux[c] = mean;
  aux[g.C + c] = invstd;
  float scale = ld(gamma, gt, c) * invstd;
  ss[2 * c] = scale;
  ss[2 * c + 1] = ld(beta, bt, c) - mean * scale;
}

template <int V>
__global__ void k_bn_apply(const void *x, int xt, void *y, int yt, bn_geom g, const float *ss, int relu) {
  AMPC_GRID_STRIDE(u, g.N * g.C * g.HW / V) {
    int64_t e0 = u * V, c = imod(idiv(e0, g.HW), g.C);
    float scale = ss[2 * c], shift = ss[2 * c + 1], v[V];
    ldv<V>(x, xt, e0, v);
    AMPC_UNROLL
    for (int k = 0; k < V; k++) {
      v[k] = v[k] * scale + shift;
      if (relu) v[k] = v[k] <= 0.0f ? 0.0f : v[k]; /* NaN stays */
    }
    stv<V>(y, yt, e0, v);
  }
}

/* one thread per pooled value: the window's four outputs, rounded to the
 * storage type as the unfused graph would store them, and the first maximum
 * (a NaN beating any number) */
__global__ void k_bn_apply_pool(const void *x, int xt, void *y, int yt, bn_geom g, const float *ss, int relu,
                                unsigned char *win) {
  AMPC_GRID_STRIDE(u, g.N * g.C * g.PHW / g.VP) {
    int64_t e0 = u * g.VP, plane = idiv(e0, g.PHW), q = e0 - plane * g.PHW, oy = idiv(q, g.OW), ox0 = q - oy * g.OW;
    int64_t c = imod(plane, g.C);
    float scale = ss[2 * c], shift = ss[2 * c + 1];
    for (int r = 0; r < g.VP; r++) {
      int64_t base = plane * g.HW + 2 * oy * g.W + 2 * (ox0 + r);
      float best = 0.0f;
      int w = 0;
      for (int k = 0; k < 4; k++) {
        float v = ld(x, xt, base + (k >> 1) * g.W + (k & 1)) * scale + shift;
        if (relu) v = v <= 0.0f ? 0.0f : v;
        v = round_to(yt, v);
        if (k == 0 || v > best || (is_nan(v) && !is_nan(best))) {
          best = v;
          w = k;
        }
      }
      st(y, yt, e0 + r, best);
      win[e0 + r] = (unsigned char)w;
    }
  }
}

/* kernel<V> for V = 8, 4, 2 or 1 */
#define LAUNCH_V(V, kernel, grid, ...)                                          \
  do {                                                                         \
    if ((V) == 8) AMPC_LAUNCH(kernel<8>, (grid), THREADS, 0, s, __VA_ARGS__);  \
    else if ((V) == 4) AMPC_LAUNCH(kernel<4>, (grid), THREADS, 0, s, __VA_ARGS__); \
    else if ((V) == 2) AMPC_LAUNCH(kernel<2>, (grid), THREADS, 0, s, __VA_ARGS__); \
    else AMPC_LAUNCH(kernel<1>, (grid), THREADS, 0, s, __VA_ARGS__);            \
  } while (0)

/* runs of g.V elements a load where every tensor starts 16-byte aligned;
 * else one element at a time */
static void align_runs(bn_geom &g, const ampc__cu_bn *p) {
  if (!vec_ok(p->x) || !vec_ok(p->y) || (p->dy && !vec_ok(p->dy)) || (p->dx && !vec_ok(p->dx))) g.V = 1;
}

extern "C" int ampc__cu_bn_fwd(ampc__cu_stream s, const ampc__cu_bn *p) {
  bn_geom g = geometry(p);
  align_runs(g, p);
  double *parts = ws_parts(p);
  float *ss = ws_channels(p, g);
  if (p->training) LAUNCH_V(g.V, k_bn_stats, (unsigned)(g.C * g.P), p->x, p->xt, g, parts);
  AMPC_LAUNCH(k_bn_finish, (unsigned)((g.C + THREADS - 1) / THREADS), THREADS, 0, s, p->x, p->xt, p->gamma, p->gt,
              p->beta, p->bt, p->rm, p->rv, p->nbt, p->aux, g, parts, p->momentum, p->eps, p->training, ss);
  if (p->pool)
    AMPC_LAUNCH(k_bn_apply_pool, grid_for((size_t)(g.N * g.C * g.PHW / g.VP)), THREADS, 0, s, p->x, p->xt, p->y, p->yt, g, ss,
                p->relu, winners(p->aux, g.C));
  else
    LAUNCH_V(g.V, k_bn_apply, grid_for((size_t)(g.N * g.C * g.HW / g.V)), p->x, p->xt, p->y, p->yt, g, ss, p->relu);
  return launch_status();
}

/* ---- backward ---- */

/* The gradient reaching a stored output element (masked by a fused ReLU
 * where that output is not positive). */
AMPC__D float out_grad(const void *y, int yt, const void *dy, int dyt, int64_t i, int relu) {
  float gv = ld(dy, dyt, i);
  return relu && !(ld(y, yt, i) > 0.0f) ? 0.0f : gv;
}

/* (the fused pool's backward kernels, _pool; without a pool, the _plain
 * ones below take runs of V elements a load)
 *
 * block (c, part): sum(dy) and sum(dy * (x - mean)) over the pooled values,
 * each at its window's winner (the other three inputs have no gradient) */
__global__ void k_bn_dsums_pool(const void *x, int xt, const void *y, int yt, const void *dy, int dyt, const float *aux,
                                bn_geom g, int relu, double *parts) {
  __shared__ double sh[THREADS];
  int64_t c = blockIdx.x / g.P, part = blockIdx.x - c * g.P, lo, hi;
  int64_t per = g.PHW;
  int V = g.VP;
  part_range(g.N * per / V, g.P, part, &lo, &hi); /* in runs of V */
  float mean = aux[c], a = 0.0f, b = 0.0f;
  const unsigned char *win = winners((float *)aux, g.C);
  for (int64_t u = lo + threadIdx.x; u < hi; u += blockDim.x) {
    int64_t j = u * V, n = idiv(j, per), i0 = j - n * per, o0 = (n * g.C + c) * per + i0;
    int64_t oy = idiv(i0, g.OW), ox0 = i0 - oy * g.OW;
    for (int r = 0; r < V; r++) {
      int64_t o = o0 + r;
      float gv = out_grad(y, yt, dy, dyt, o, relu);
      int w = win[o];
      int64_t xi = (n * g.C + c) * g.HW + (2 * oy + (w >> 1)) * g.W + 2 * (ox0 + r) + (w & 1);
      a += gv;
      b += gv * (ld(x, xt, xi) - mean);
    }
  }
  double sa = block_sum<double>(a, sh), sb = block_sum<double>(b, sh);
  if (threadIdx.x == 0) {
    parts[2 * blockIdx.x] = sa;
    parts[2 * blockIdx.x + 1] = sb;
  }
}

/* k_bn_dsums without a pool: V = g.V elements a load */
template <int V>
__global__ void k_bn_dsums_plain(const void *x, int xt, const void *y, int yt, const void *dy, int dyt, const float *aux,
                                 bn_geom g, int relu, double *parts) {
  __shared__ double sh[THREADS];
  int64_t c = blockIdx.x / g.P, part = blockIdx.x - c * g.P, lo, hi;
  part_range(g.N * g.HW / V, g.P, part, &lo, &hi);
  float mean = aux[c], a = 0.0f, b = 0.0f;
  for (int64_t u = lo + threadIdx.x; u < hi; u += blockDim.x) {
    int64_t j = u * V, n = idiv(j, g.HW), o0 = (n * g.C + c) * g.HW + (j - n * g.HW);
    float gv[V], xv[V];
    ldv<V>(dy, dyt, o0, gv);
    if (relu) relu_mask<V>(y, yt, o0, gv);
    ldv<V>(x, xt, o0, xv);
    AMPC_UNROLL
    for (int r = 0; r < V; r++) {
      a += gv[r];
      b += gv[r] * (xv[r] - mean);
    }
  }
  double sa = block_sum<double>(a, sh), sb = block_sum<double>(b, sh);
  if (threadIdx.x == 0) {
    parts[2 * blockIdx.x] = sa;
    parts[2 * blockIdx.x + 1] = sb;
  }
}

/* one thread per channel: dgamma and dbeta stored, and kept with dx's
 * factor in ch (3 floats per channel) */
__global__ void k_bn_dfinish(const void *gamma, int gt, const float *aux, bn_geom g, const double *parts, void *dgamma,
                             int dgt, int dg_acc, void *dbeta, int dbt, int db_acc, float *ch, ampc__cu_count *cnt) {
  int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  counts k = {0, 0};
  if (c < g.C) {
    double sdy = 0.0, sdyx = 0.0;
    for (int64_t p = 0; p < g.P; p++) {
      sdy += parts[2 * (c * g.P + p)];
      sdyx += parts[2 * (c * g.P + p) + 1];
    }
    float invstd = aux[g.C + c], dbeta_c = (float)sdy, dgamma_c = (float)(sdyx * invstd);
    ch[3 * c] = dgamma_c;
    ch[3 * c + 1] = dbeta_c;
    ch[3 * c + 2] = ld(gamma, gt, c) * invstd / (float)(g.N * g.HW);
    if (dgamma) store_grad(dgamma, dgt, c, dgamma_c, dg_acc, k, cnt != NULL);
    if (dbeta) store_grad(dbeta, dbt, c, dbeta_c, db_acc, k, cnt != NULL);
  }
  if (cnt) count_flush(k, cnt);
}

/* dx of every input element under a fused pool: with batch statistics
 * k * (count * dy - dbeta - xhat * dgamma), after eval-mode statistics (constants)
 * dy * gamma * invstd */
__global__ void k_bn_dx_pool(const void *x, int xt, const void *gamma, int gt, const void *y, int yt, const void *dy, int dyt,
                             const float *aux, bn_geom g, int relu, const float *ch, void *dx, int dxt, int acc,
                             ampc__cu_count *cnt) {
  counts k = {0, 0};
  int batch_stats = aux[2 * g.C] != 0.0f;
  const unsigned char *win = winners((float *)aux, g.C);
  float count = (float)(g.N * g.HW);
  AMPC_GRID_STRIDE(u, g.N * g.C * g.HW / g.V) {
    int64_t e0 = u * g.V, plane = idiv(e0, g.HW), i0 = e0 - plane * g.HW, c = imod(plane, g.C);
    int64_t iy = idiv(i0, g.W), ix0 = i0 - iy * g.W; /* a run stays in its row */
    float mean = aux[c], invstd = aux[g.C + c], kk = ch[3 * c + 2], dbeta = ch[3 * c + 1], dgamma = ch[3 * c];
    float gi = batch_stats ? 0.0f : ld(gamma, gt, c) * invstd;
    for (int r = 0; r < g.V; r++) {
      int64_t e = e0 + r, ix = ix0 + r;
      float gv = 0.0f; /* (the input at its window's winner gets the pooled gradient) */
      if (iy < 2 * g.OH && ix < 2 * g.OW) {
        int64_t o = plane * g.PHW + (iy >> 1) * g.OW + (ix >> 1);
        if (win[o] == (unsigned char)((iy & 1) * 2 + (ix & 1))) gv = out_grad(y, yt, dy, dyt, o, relu);
      }
      float o;
      if (batch_stats) {
        float xhat = (ld(x, xt, e) - mean) * invstd;
        o = kk * (count * gv - dbeta - xhat * dgamma);
      } else {
        o = gi * gv;
      }
      store_grad(dx, dxt, e, o, acc, k, cnt != NULL);
    }
  }
  if (cnt) count_flush(k, cnt);
}

/* k_bn_dx without a pool: V = g.V elements a load */
template <int V>
__global__ void k_bn_dx_plain(const void *x, int xt, const void *gamma, int gt, const void *y, int yt, const void *dy, int dyt,
                              const float *aux, bn_geom g, int relu, const float *ch, void *dx, int dxt, int acc,
                              ampc__cu_count *cnt) {
  counts k = {0, 0};
  int batch_stats = aux[2 * g.C] != 0.0f;
  float count = (float)(g.N * g.HW);
  AMPC_GRID_STRIDE(u, g.N * g.C * g.HW / V) {
    int64_t e0 = u * V, c = imod(idiv(e0, g.HW), g.C);
    float mean = aux[c], invstd = aux[g.C + c], kk = ch[3 * c + 2], dbeta = ch[3 * c + 1], dgamma = ch[3 * c];
    float gv[V], o[V];
    ldv<V>(dy, dyt, e0, gv);
    if (relu) relu_mask<V>(y, yt, e0, gv);
    if (batch_stats) {
      float xv[V];
      ldv<V>(x, xt, e0, xv);
      AMPC_UNROLL
      for (int r = 0; r < V; r++) {
        float xhat = (xv[r] - mean) * invstd;
        o[r] = kk * (count * gv[r] - dbeta - xhat * dgamma);
      }
    } else {
      float gi = ld(gamma, gt, c) * invstd;
      AMPC_UNROLL
      for (int r = 0; r < V; r++) o[r] = gi * gv[r];
    }
    store_grad_v<V>(dx, dxt, e0, o, acc, k, cnt != NULL);
  }
  if (cnt) count_flush(k, cnt);
}

extern "C" int ampc__cu_bn_bwd(ampc__cu_stream s, const ampc__cu_bn *p) {
  bn_geom g = geometry(p);
  align_runs(g, p);
  double *parts = ws_parts(p);
  float *ch = ws_channels(p, g);
  if (p->pool)
    AMPC_LAUNCH(k_bn_dsums_pool, (unsigned)(g.C * g.P), THREADS, 0, s, p->x, p->xt, p->y, p->yt, p->dy, p->dyt, p->aux, g,
                p->relu, parts);
  else
    LAUNCH_V(g.V, k_bn_dsums_plain, (unsigned)(g.C * g.P), p->x, p->xt, p->y, p->yt, p->dy, p->dyt, p->aux, g, p->relu, parts);
  AMPC_LAUNCH(k_bn_dfinish, (unsigned)((g.C + THREADS - 1) / THREADS), THREADS, 0, s, p->gamma, p->gt, p->aux, g, parts,
              p->dgamma, p->dgt, p->dg_acc, p->dbeta, p->dbt_, p->db_acc, ch, p->cnt);
  if (p->dx && p->pool)
    AMPC_LAUNCH(k_bn_dx_pool, grid_for((size_t)(g.N * g.C * g.HW / g.V)), THREADS, 0, s, p->x, p->xt, p->gamma, p->gt, p->y,
                p->yt, p->dy, p->dyt, p->aux, g, p->relu, ch, p->dx, p->dxt, p->dx_acc, p->cnt);
  else if (p->dx)
    LAUNCH_V(g.V, k_bn_dx_plain, grid_for((size_t)(g.N * g.C * g.HW / g.V)), p->x, p->xt, p->gamma, p->gt, p->y, p->yt, p->dy,
             p->dyt, p->aux, g, p->relu, ch, p->dx, p->dxt, p->dx_acc, p->cnt);
  return launch_status();
}
