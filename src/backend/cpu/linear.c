/* Fully connected layer: y (N, M) = x (N, K) w^T + b, through OpenBLAS. The
 * products run outside our parallel regions, so OpenBLAS threads them. */
#include <cblas.h>

#include "backend/cpu/cpu_internal.h"

typedef struct {
  int64_t N, K, M;
} lin_geom;

static lin_geom lin_geometry(const ampc__op_call *c) {
  lin_geom g = {c->in[0].shape.d[0], c->in[0].shape.d[1], c->in[1].shape.d[0]};
  return g;
}

/* workspace: x, w, y/dy, dx, dw as f32 */
size_t ampc__cpu_linear_ws(const ampc__op_call *c, int nthreads) {
  lin_geom g = lin_geometry(c);
  return (size_t)(2 * g.N * g.K + 2 * g.M * g.K + g.N * g.M + g.M + 64) * sizeof(float);
}

ampc_status ampc__cpu_linear_fwd(const ampc__op_call *c) {
  lin_geom g = lin_geometry(c);
  float *xb = c->ws, *wb = xb + g.N * g.K, *yb = wb + g.M * g.K;
  const float *xf = cpu_load(&c->in[0], 0, (size_t)(g.N * g.K), xb);
  const float *wf = cpu_load(&c->in[1], 0, (size_t)(g.M * g.K), wb);
  float *yf = c->out.dtype == AMPC_DTYPE_F32 ? (float *)c->out.data : yb;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)g.N, (int)g.M, (int)g.K, 1.0f, xf, (int)g.K, wf,
              (int)g.K, 0.0f, yf, (int)g.M);
  if (c->n_in > 2) {
    float *bias = yb + g.N * g.M;
    const float *bf = cpu_load(&c->in[2], 0, (size_t)g.M, bias);
    for (int64_t n = 0; n < g.N; n++)
      for (int64_t m = 0; m < g.M; m++) yf[n * g.M + m] += bf[m];
  }
  if (yf != c->out.data) ampc_store_f32(c->out.dtype, c->out.data, yf, (size_t)(g.N * g.M));
  return AMPC_OK;
}

ampc_status ampc__cpu_linear_bwd(const ampc__op_call *c) {
  lin_geom g = lin_geometry(c);
  float *xb = c->ws, *wb = xb + g.N * g.K, *dyb = wb + g.M * g.K, *dxb = dyb + g.N * g.M, *dwb = dxb + g.N * g.K;
  float *tmp = dwb + g.M * g.K; /* g.M floats for the bias */
  const float *dyf = cpu_load(&c->dout, 0, (size_t)(g.N * g.M), dyb);
  if (c->din[0].data) {
    const float *wf = cpu_load(&c->in[1], 0, (size_t)(g.M * g.K), wb);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)g.N, (int)g.K, (int)g.M, 1.0f, dyf, (int)g.M, wf,
                (int)g.K, 0.0f, dxb, (int)g.K);
    /* xb is not loaded yet: it stages the old gradient when accumulating */
    cpu_store_grad(c, &c->din[0], 0, dxb, (size_t)(g.N * g.K), c->din_acc[0], xb);
  }
  if (c->din[1].data) {
    const float *xf = cpu_load(&c->in[0], 0, (size_t)(g.N * g.K), xb);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)g.M, (int)g.K, (int)g.N, 1.0f, dyf, (int)g.M, xf,
                (int)g.K, 0.0f, dwb, (int)g.K);
    cpu_store_grad(c, &c->din[1], 0, dwb, (size_t)(g.M * g.K), c->din_acc[1], wb);
  }
  if (c->n_in > 2 && c->din[2].data) {
    float *db = dxb; /* free now */
    for (int64_t m = 0; m < g.M; m++) db[m] = 0.0f;
    for (int64_t n = 0; n < g.N; n++)
      for (int64_t m = 0; m < g.M; m++) db[m] += dyf[n * g.M + m];
    cpu_store_grad(c, &c->din[2], 0, db, (size_t)g.M, c->din_acc[2], tmp);
  }
  return AMPC_OK;
}
