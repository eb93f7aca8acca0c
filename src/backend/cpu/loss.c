/* Rows of (N, K): softmax, log-softmax and the cross-entropy loss with label
 * smoothing, forward and backward. */
#include <math.h>
#include <omp.h>

#include "backend/cpu/cpu_internal.h"

/* ---- rows: softmax, log-softmax, cross entropy over (N, K) ---- */

size_t ampc__cpu_rows_ws(const ampc__op_call *c, int nthreads) {
  int64_t K = c->in[0].shape.d[1], N = c->in[0].shape.d[0];
  return ((size_t)nthreads * (4 * (size_t)K + 16) + (size_t)N + 64) * sizeof(float);
}

/* logp = x - max - log(sum(exp(x - max))) for one row */
static void row_log_softmax(const float *x, float *out, int64_t K) {
  float mx = -INFINITY;
  for (int64_t j = 0; j < K; j++) mx = x[j] > mx ? x[j] : mx;
  double s = 0.0;
  for (int64_t j = 0; j < K; j++) s += exp((double)(x[j] - mx));
  float lse = mx + (float)log(s);
  for (int64_t j = 0; j < K; j++) out[j] = x[j] - lse;
}

ampc_status ampc__cpu_softmax_fwd(const ampc__op_call *c) {
  int64_t N = c->in[0].shape.d[0], K = c->in[0].shape.d[1];
  int is_log = c->op == AMPC_OP_LOG_SOFTMAX;
  size_t per = 4 * (size_t)K + 16;
#pragma omp parallel for num_threads(cpu_ctx(c)->nthreads) schedule(static) if (N * K > 65536)
  for (int64_t n = 0; n < N; n++) {
    float *b = cpu_ws_slice(c, omp_get_thread_num(), per, 64 + (size_t)N), *o = b + K;
    const float *x = cpu_load(&c->in[0], n * K, (size_t)K, b);
    row_log_softmax(x, o, K);
    if (!is_log)
      for (int64_t j = 0; j < K; j++) o[j] = expf(o[j]);
    cpu_store(&c->out, n * K, o, (size_t)K, 0, NULL);
  }
  return AMPC_OK;
}

ampc_status ampc__cpu_softmax_bwd(const ampc__op_call *c) {
  if (!c->din[0].data) return AMPC_OK;
  int64_t N = c->in[0].shape.d[0], K = c->in[0].shape.d[1];
  int is_log = c->op == AMPC_OP_LOG_SOFTMAX;
  size_t per = 4 * (size_t)K + 16;
#pragma omp parallel for num_threads(cpu_ctx(c)->nthreads) schedule(static) if (N * K > 65536)
  for (int64_t n = 0; n < N; n++) {
    float *b = cpu_ws_slice(c, omp_get_thread_num(), per, 64 + (size_t)N);
    float *yb = b, *dyb = b + K, *o = b + 2 * K, *tmp = b + 3 * K;
    const float *y = cpu_load(&c->out, n * K, (size_t)K, yb);
    const float *dy = cpu_load(&c->dout, n * K, (size_t)K, dyb);
    double s = 0.0;
    if (is_log) {
      for (int64_t j = 0; j < K; j++) s += dy[j];
      for (int64_t j = 0; j < K; j++) o[j] = dy[j] - expf(y[j]) * (float)s;
    } else {
      for (int64_t j = 0; j < K; j++) s += (double)dy[j] * y[j];
      for (int64_t j = 0; j < K; j++) o[j] = y[j] * (dy[j] - (float)s);
    }
    cpu_store_grad(c, &c->din[0], n * K, o, (size_t)K, c->din_acc[0], tmp);
  }
  return AMPC_OK;
}

ampc_status ampc__cpu_ce_fwd(const ampc__op_call *c) {
  int64_t N = c->in[0].shape.d[0], K = c->in[0].shape.d[1];
  const int32_t *lab = c->in[1].data;
  for (int64_t n = 0; n < N; n++)
    if (lab[n] < 0 || lab[n] >= K)
      return ampc__error(AMPC_ERANGE, "cross_entropy: label %d of sample %lld out of range for %lld classes", lab[n], (long long)n, (long long)K);
  float sm = c->attr.label_smoothing;
  float *losses = (float *)c->ws + 64; /* shared: one loss per row */
  size_t per = 4 * (size_t)K + 16;
#pragma omp parallel for num_threads(cpu_ctx(c)->nthreads) schedule(static) if (N * K > 65536)
  for (int64_t n = 0; n < N; n++) {
    float *b = cpu_ws_slice(c, omp_get_thread_num(), per, 64 + (size_t)N), *lp = b + K;
    const float *x = cpu_load(&c->in[0], n * K, (size_t)K, b);
    row_log_softmax(x, lp, K);
    double l = -(double)(1.0f - sm) * lp[lab[n]];
    if (sm > 0) {
      double s = 0.0;
      for (int64_t j = 0; j < K; j++) s += lp[j];
      l -= (double)sm / (double)K * s;
    }
    losses[n] = (float)l;
  }
  double total = 0.0;
  for (int64_t n = 0; n < N; n++) total += losses[n];
  float mean = (float)(total / (double)N);
  cpu_store(&c->out, 0, &mean, 1, 0, NULL);
  return AMPC_OK;
}

/* d logits = seed / N * (softmax - target), target = (1-s) one-hot + s/K */
ampc_status ampc__cpu_ce_bwd(const ampc__op_call *c) {
  if (!c->din[0].data) return AMPC_OK;
  int64_t N = c->in[0].shape.d[0], K = c->in[0].shape.d[1];
  const int32_t *lab = c->in[1].data;
  float sm = c->attr.label_smoothing, scale = c->seed / (float)N;
  size_t per = 4 * (size_t)K + 16;
#pragma omp parallel for num_threads(cpu_ctx(c)->nthreads) schedule(static) if (N * K > 65536)
  for (int64_t n = 0; n < N; n++) {
    float *b = cpu_ws_slice(c, omp_get_thread_num(), per, 64 + (size_t)N), *o = b + K, *tmp = b + 2 * K;
    const float *x = cpu_load(&c->in[0], n * K, (size_t)K, b);
    row_log_softmax(x, o, K);
    for (int64_t j = 0; j < K; j++) {
      float t = sm / (float)K + (j == lab[n] ? 1.0f - sm : 0.0f);
      o[j] = scale * (expf(o[j]) - t);
    }
    cpu_store_grad(c, &c->din[0], n * K, o, (size_t)K, c->din_acc[0], tmp);
  }
  return AMPC_OK;
}