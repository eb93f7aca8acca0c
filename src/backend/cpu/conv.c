/* Convolution on the CPU as cache-sized matrix products.
 *
 * The batch is cut into chunks of nb samples whose im2col matrix
 * cols (K = C*k*k rows, nb*OH*OW columns) stays small; each thread takes
 * whole chunks and runs single-threaded sgemm on them (the OpenMP build of
 * OpenBLAS runs on the calling thread inside a parallel region), so there is
 * one pool of threads and no oversubscription. Half storage is converted to
 * f32 while a sample is staged for im2col, and the f32 product is rounded to
 * the output type as it is stored, so 16-bit storage adds no separate pass.
 *
 *   forward:          Y (O, cols)  = W (O, K) * cols (K, cols)
 *   backward weights: dW (O, K)   += dY (O, cols) * cols^T
 *   backward data:    dcols (K, cols) = W^T * dY, then col2im into dx
 */
#include <cblas.h>
#include <omp.h>

#include "backend/cpu/cpu_internal.h"

typedef struct {
  int64_t N, C, H, W, O, k, s, p, OH, OW, OHW, K, CHW;
  int64_t nb;       /* samples per chunk */
  int nt;           /* threads the workspace is laid out for */
  size_t per_thread, shared; /* floats */
} conv_geom;

enum { CONV_TARGET_COLS = 3072 };

static conv_geom conv_geometry(const ampc__op_call *c, int nthreads) {
  conv_geom g;
  const ampc_shape *x = &c->in[0].shape, *w = &c->in[1].shape, *y = &c->out.shape;
  g.N = x->d[0]; g.C = x->d[1]; g.H = x->d[2]; g.W = x->d[3];
  g.O = w->d[0]; g.k = w->d[2]; g.s = c->attr.stride; g.p = c->attr.pad;
  g.OH = y->d[2]; g.OW = y->d[3]; g.OHW = g.OH * g.OW;
  g.K = g.C * g.k * g.k; g.CHW = g.C * g.H * g.W;
  g.nt = nthreads < 1 ? 1 : nthreads;
  int64_t nb = (CONV_TARGET_COLS + g.OHW - 1) / g.OHW;
  int64_t per_thread_samples = (g.N + g.nt - 1) / g.nt;
  if (nb > per_thread_samples) nb = per_thread_samples;
  if (nb < 1) nb = 1;
  g.nb = nb;
  size_t ncols = (size_t)(nb * g.OHW);
  g.per_thread = (size_t)g.K * ncols   /* cols */
                 + (size_t)g.O * ncols /* Y or dY */
                 + (size_t)g.K * ncols /* dcols */
                 + (size_t)g.O * g.K   /* dW partial */
                 + (size_t)g.O         /* db partial */
                 + 2 * (size_t)g.CHW   /* staged sample, dx sample */
                 + 16;
  g.shared = (size_t)g.O * g.K + 16; /* f32 copy of the weight */
  return g;
}

size_t ampc__cpu_conv2d_ws(const ampc__op_call *c, int nthreads) {
  conv_geom g = conv_geometry(c, nthreads);
  return (g.shared + g.per_thread * (size_t)g.nt) * sizeof(float);
}

/* cols[row][col0 + oy*OW + ox] for one staged sample x (C, H, W), ld = ncols. */
static void im2col(const conv_geom *g, const float *x, float *cols, int64_t ld, int64_t col0) {
  for (int64_t ch = 0; ch < g->C; ch++)
    for (int64_t ky = 0; ky < g->k; ky++)
      for (int64_t kx = 0; kx < g->k; kx++) {
        float *dst = cols + ((ch * g->k + ky) * g->k + kx) * ld + col0;
        const float *plane = x + ch * g->H * g->W;
        /* output columns whose input column is inside the image */
        int64_t lo = g->p - kx > 0 ? (g->p - kx + g->s - 1) / g->s : 0;
        int64_t hi = (g->W - 1 + g->p - kx) / g->s + 1;
        if (hi > g->OW) hi = g->OW;
        if (lo > hi) lo = hi;
        for (int64_t oy = 0; oy < g->OH; oy++) {
          float *d = dst + oy * g->OW;
          int64_t iy = oy * g->s - g->p + ky;
          if (iy < 0 || iy >= g->H) {
            memset(d, 0, (size_t)g->OW * sizeof(float));
            continue;
          }
          const float *row = plane + iy * g->W - g->p + kx;
          for (int64_t ox = 0; ox < lo; ox++) d[ox] = 0.0f;
          if (g->s == 1) {
            memcpy(d + lo, row + lo, (size_t)(hi - lo) * sizeof(float));
          } else {
            for (int64_t ox = lo; ox < hi; ox++) d[ox] = row[ox * g->s];
          }
          for (int64_t ox = hi; ox < g->OW; ox++) d[ox] = 0.0f;
        }
      }
}

/* dx (C, H, W) += the columns of one sample. */
static void col2im(const conv_geom *g, const float *cols, int64_t ld, int64_t col0, float *dx) {
  for (int64_t ch = 0; ch < g->C; ch++)
    for (int64_t ky = 0; ky < g->k; ky++)
      for (int64_t kx = 0; kx < g->k; kx++) {
        const float *src = cols + ((ch * g->k + ky) * g->k + kx) * ld + col0;
        float *plane = dx + ch * g->H * g->W;
        int64_t lo = g->p - kx > 0 ? (g->p - kx + g->s - 1) / g->s : 0;
        int64_t hi = (g->W - 1 + g->p - kx) / g->s + 1;
        if (hi > g->OW) hi = g->OW;
        for (int64_t oy = 0; oy < g->OH; oy++) {
          int64_t iy = oy * g->s - g->p + ky;
          if (iy < 0 || iy >= g->H) continue;
          float *row = plane + iy * g->W - g->p + kx;
          const float *s = src + oy * g->OW;
          if (g->s == 1)
            for (int64_t ox = lo; ox < hi; ox++) row[ox] += s[ox];
          else
            for (int64_t ox = lo; ox < hi; ox++) row[ox * g->s] += s[ox];
        }
      }
}

/* The weight as f32 (O, K): the tensor itself when it is f32. */
static const float *weight_f32(const ampc__op_call *c, const conv_geom *g) {
  float *wf = (float *)c->ws;
  return cpu_load(&c->in[1], 0, (size_t)(g->O * g->K), wf);
}

ampc_status ampc__cpu_conv2d_fwd(const ampc__op_call *c) {
  conv_geom g = conv_geometry(c, c->nthreads);
  const float *wf = weight_f32(c, &g);
  int64_t nchunks = (g.N + g.nb - 1) / g.nb;
  const ampc_tensor *x = &c->in[0], *y = &c->out;
  const ampc_tensor *b = c->n_in > 2 ? &c->in[2] : NULL;
#pragma omp parallel num_threads(g.nt)
  {
    int tid = omp_get_thread_num(), nth = omp_get_num_threads();
    float *ws = cpu_ws_slice(c, tid, g.per_thread, g.shared);
    float *cols = ws, *yc = cols + (size_t)g.K * g.nb * g.OHW;
    float *xs = yc + (size_t)g.O * g.nb * g.OHW + (size_t)g.K * g.nb * g.OHW + (size_t)g.O * g.K + g.O;
    float bias[1024];
    for (int64_t ch = tid; ch < nchunks; ch += nth) {
      int64_t n0 = ch * g.nb, nbe = g.N - n0 < g.nb ? g.N - n0 : g.nb, ld = nbe * g.OHW;
      for (int64_t s = 0; s < nbe; s++) {
        const float *xp = cpu_load(x, (n0 + s) * g.CHW, (size_t)g.CHW, xs);
        im2col(&g, xp, cols, ld, s * g.OHW);
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)g.O, (int)ld, (int)g.K, 1.0f, wf,
                  (int)g.K, cols, (int)ld, 0.0f, yc, (int)ld);
      for (int64_t m0 = 0; m0 < g.O; m0 += 1024) {
        int64_t mn = g.O - m0 < 1024 ? g.O - m0 : 1024;
        if (b) ampc_load_f32(bias, b->dtype, cpu_at(b, m0), (size_t)mn);
        for (int64_t m = m0; m < m0 + mn; m++)
          for (int64_t s = 0; s < nbe; s++) {
            float *row = yc + m * ld + s * g.OHW;
            if (b)
              for (int64_t i = 0; i < g.OHW; i++) row[i] += bias[m - m0];
            cpu_store(y, ((n0 + s) * g.O + m) * g.OHW, row, (size_t)g.OHW, 0, NULL);
          }
      }
    }
  }
  return AMPC_OK;
}

/* dY of one chunk as (O, nbe*OHW) f32 */
static void gather_dy(const conv_geom *g, const ampc_tensor *dy, int64_t n0, int64_t nbe, float *dyc) {
  int64_t ld = nbe * g->OHW;
  for (int64_t s = 0; s < nbe; s++)
    for (int64_t m = 0; m < g->O; m++) {
      float *dst = dyc + m * ld + s * g->OHW;
      const float *src = cpu_load(dy, ((n0 + s) * g->O + m) * g->OHW, (size_t)g->OHW, dst);
      if (src != dst) memcpy(dst, src, (size_t)g->OHW * sizeof(float));
    }
}

/* Backward in two passes, each parallel over chunks: the weight (and bias)
 * gradient, then the input gradient. */
ampc_status ampc__cpu_conv2d_bwd(const ampc__op_call *c) {
  conv_geom g = conv_geometry(c, c->nthreads);
  int64_t nchunks = (g.N + g.nb - 1) / g.nb;
  const ampc_tensor *x = &c->in[0], *dy = &c->dout, *dx = &c->din[0], *dw = &c->din[1];
  const ampc_tensor *db = c->n_in > 2 ? &c->din[2] : NULL;
  int need_dx = dx->data != NULL, need_dw = dw->data != NULL, need_db = db && db->data;
  size_t ncmax = (size_t)(g.nb * g.OHW);
  size_t off_dyc = (size_t)g.K * ncmax, off_dcols = off_dyc + (size_t)g.O * ncmax;
  size_t off_dw = off_dcols + (size_t)g.K * ncmax, off_db = off_dw + (size_t)(g.O * g.K), off_xs = off_db + (size_t)g.O;
  double t0 = c->timers ? omp_get_wtime() : 0.0;
  if (need_dw || need_db) {
    int nth_used = 1;
#pragma omp parallel num_threads(g.nt)
    {
      int tid = omp_get_thread_num(), nth = omp_get_num_threads();
#pragma omp single
      nth_used = nth;
      float *ws = cpu_ws_slice(c, tid, g.per_thread, g.shared);
      float *cols = ws, *dyc = ws + off_dyc, *dwt = ws + off_dw, *dbt = ws + off_db, *xs = ws + off_xs;
      memset(dwt, 0, (size_t)(g.O * g.K + g.O) * sizeof(float));
      for (int64_t ch = tid; ch < nchunks; ch += nth) {
        int64_t n0 = ch * g.nb, nbe = g.N - n0 < g.nb ? g.N - n0 : g.nb, ld = nbe * g.OHW;
        gather_dy(&g, dy, n0, nbe, dyc);
        if (need_dw) {
          for (int64_t s = 0; s < nbe; s++) {
            const float *xp = cpu_load(x, (n0 + s) * g.CHW, (size_t)g.CHW, xs);
            im2col(&g, xp, cols, ld, s * g.OHW);
          }
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)g.O, (int)g.K, (int)ld, 1.0f, dyc, (int)ld, cols,
                      (int)ld, 1.0f, dwt, (int)g.K);
        }
        if (need_db)
          for (int64_t m = 0; m < g.O; m++) {
            float acc = 0.0f;
            const float *row = dyc + m * ld;
            for (int64_t i = 0; i < ld; i++) acc += row[i];
            dbt[m] += acc;
          }
      }
    }
    /* fixed-order reduction of the per-thread partials: deterministic for a thread count */
    float *sum = cpu_ws_slice(c, 0, g.per_thread, g.shared) + off_dw;
    for (int t = 1; t < nth_used; t++) {
      const float *part = cpu_ws_slice(c, t, g.per_thread, g.shared) + off_dw;
      for (int64_t i = 0; i < g.O * g.K + g.O; i++) sum[i] += part[i];
    }
    float *tmp = (float *)c->ws; /* the shared weight copy is not made yet */
    if (need_dw) cpu_store(dw, 0, sum, (size_t)(g.O * g.K), c->din_acc[1], tmp);
    if (need_db) cpu_store(db, 0, sum + g.O * g.K, (size_t)g.O, c->din_acc[2], tmp);
  }
  double t1 = c->timers ? omp_get_wtime() : 0.0;
  if (need_dx) {
    const float *wf = weight_f32(c, &g);
#pragma omp parallel num_threads(g.nt)
    {
      int tid = omp_get_thread_num(), nth = omp_get_num_threads();
      float *ws = cpu_ws_slice(c, tid, g.per_thread, g.shared);
      float *dyc = ws + off_dyc, *dcols = ws + off_dcols, *xs = ws + off_xs, *dxs = xs + g.CHW;
      for (int64_t ch = tid; ch < nchunks; ch += nth) {
        int64_t n0 = ch * g.nb, nbe = g.N - n0 < g.nb ? g.N - n0 : g.nb, ld = nbe * g.OHW;
        gather_dy(&g, dy, n0, nbe, dyc);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)g.K, (int)ld, (int)g.O, 1.0f, wf, (int)g.K, dyc,
                    (int)ld, 0.0f, dcols, (int)ld);
        for (int64_t s = 0; s < nbe; s++) {
          memset(dxs, 0, (size_t)g.CHW * sizeof(float));
          col2im(&g, dcols, ld, s * g.OHW, dxs);
          cpu_store(dx, (n0 + s) * g.CHW, dxs, (size_t)g.CHW, c->din_acc[0], xs);
        }
      }
    }
  }
  if (c->timers) {
    double t2 = omp_get_wtime();
    c->timers[0] += t2 - t1;
    c->timers[1] += t1 - t0;
  }
  return AMPC_OK;
}
