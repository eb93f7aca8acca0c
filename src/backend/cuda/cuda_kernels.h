/*
 * cuda_kernels.h -- the cuda backend's own kernels, as C functions that
 * enqueue them on a stream (the .cu files define them; the backend's C files
 * call them). Every tensor is passed as device pointer + storage type
 * (ampc_dtype: f32, f16 or bf16 unless said otherwise) + sizes; kernels load
 * any type as f32, compute in f32 (statistics and loss sums in f64), and
 * store through the shared conversions of core/dtype_internal.h, which give
 * the cpu backend's bits.
 *
 * Gradient stores take `acc` (add into what is there) and `cnt`: NULL, or
 * two device counters that the store adds to -- the non-zero f32 values
 * going into a 16-bit tensor, and how many of them become zero or subnormal
 * there (amp's gradient-underflow statistics, as the cpu backend counts
 * them: the value before accumulation).
 *
 * Each returns 0 or the CUDA error of the launch (cudaGetLastError); none
 * synchronises.
 */
#ifndef AMPC_BACKEND_CUDA_KERNELS_H
#define AMPC_BACKEND_CUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "backend/step_math.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct CUstream_st *ampc__cu_stream;
typedef unsigned long long ampc__cu_count; /* device counters */

/* Errors a kernel finds in the data (a label out of range), kept on the
 * device and read back at the next synchronising call. */
typedef struct {
  int code;                 /* 0: none; AMPC__CU_ERR_LABEL */
  int label;
  long long sample, classes;
} ampc__cu_error;
enum { AMPC__CU_ERR_LABEL = 1 };

/* ---- element-wise (eltwise.cu) ---- */

/* dst (dt) = src (st), n elements of float types, as ampc_convert does */
int ampc__cu_convert(ampc__cu_stream s, void *dst, int dt, const void *src, int st, size_t n);
/* y = max(x, 0) (a NaN stays) */
int ampc__cu_relu(ampc__cu_stream s, const void *x, int xt, void *y, int yt, size_t n);
/* dx (+)= y > 0 ? dy : 0 (mask_y), or dy (y NULL): relu and cast backward */
int ampc__cu_grad_pass(ampc__cu_stream s, const void *y, int yt, const void *dy, int dyt, void *dx, int dxt, int acc,
                       size_t n, ampc__cu_count *cnt);
/* y = a + b, with a ReLU after it when relu */
int ampc__cu_add(ampc__cu_stream s, const void *a, int at, const void *b, int bt, void *y, int yt, int relu, size_t n);
/* add backward: g = relu ? (y > 0 ? dy : 0) : dy; dx0 (+)= g; dx1 (+)= g (NULL: not needed) */
int ampc__cu_add_bwd(ampc__cu_stream s, const void *y, int yt, int relu, const void *dy, int dyt, void *dx0, int dx0t,
                     int acc0, void *dx1, int dx1t, int acc1, size_t n, ampc__cu_count *cnt);
/* y (N, C, HW) = bias[c] for every element: the bias a product then adds to */
int ampc__cu_fill_channels(ampc__cu_stream s, void *y, int yt, const void *bias, int bt, int64_t N, int64_t C, int64_t HW);
/* db[c] (+)= sum over n, i of dy (N, C, HW): a bias's gradient (deterministic) */
int ampc__cu_channel_sum(ampc__cu_stream s, const void *dy, int dyt, int64_t N, int64_t C, int64_t HW, void *db, int dbt,
                         int acc, ampc__cu_count *cnt);
/* dx (+)= src (f32, n): a product computed into f32 stored as a gradient */
int ampc__cu_store_grad(ampc__cu_stream s, const float *src, void *dx, int dxt, int acc, size_t n, ampc__cu_count *cnt);

/* the underflow counts of n values already stored in a 16-bit type */
int ampc__cu_count_half(ampc__cu_stream s, const void *p, int dt, size_t n, ampc__cu_count *cnt);

/* ---- pooling (pool.c's counterparts, pool.cu) ---- */

/* max (is_max) or average (count_include_pad) pooling of planes of H x W
 * into OH x OW; a window's maximum is its first, a NaN beating any number */
int ampc__cu_pool_fwd(ampc__cu_stream s, const void *x, int xt, void *y, int yt, int64_t planes, int64_t H, int64_t W,
                      int64_t OH, int64_t OW, int k, int stride, int pad, int is_max);
int ampc__cu_pool_bwd(ampc__cu_stream s, const void *x, int xt, const void *dy, int dyt, void *dx, int dxt, int acc,
                      int64_t planes, int64_t H, int64_t W, int64_t OH, int64_t OW, int k, int stride, int pad, int is_max,
                      ampc__cu_count *cnt);
/* y[p] = mean of plane p (HW values); backward dx (+)= dy[p] / HW */
int ampc__cu_gap_fwd(ampc__cu_stream s, const void *x, int xt, void *y, int yt, int64_t planes, int64_t HW);
int ampc__cu_gap_bwd(ampc__cu_stream s, const void *dy, int dyt, void *dx, int dxt, int acc, int64_t planes, int64_t HW,
                     ampc__cu_count *cnt);

/* ---- batch norm (norm.c's counterparts, norm.cu) ---- */

typedef struct {
  const void *x; int xt;                /* input (N, C, H, W) */
  const void *gamma; int gt;            /* (C) */
  const void *beta; int bt;             /* (C) */
  float *rm, *rv;                       /* running statistics (C, f32) */
  int64_t *nbt;                         /* num_batches_tracked (1 element) or NULL */
  void *y; int yt;                      /* output: (N, C, H, W), or the pooled (N, C, H/2, W/2) */
  const void *dy; int dyt;              /* its gradient (backward) */
  void *dx; int dxt; int dx_acc;        /* backward: NULL when not needed */
  void *dgamma; int dgt; int dg_acc;
  void *dbeta; int dbt_; int db_acc;
  float *aux;                           /* mean (C), invstd (C), mode, then the winners' bytes */
  int64_t N, C, H, W;
  float momentum, eps;
  int training, relu, pool;
  void *ws;                             /* workspace: ampc__cu_bn_ws(C) bytes */
  ampc__cu_count *cnt;
} ampc__cu_bn;
/* the workspace batch norm's kernels need, in bytes */
size_t ampc__cu_bn_ws(int64_t N, int64_t C, int64_t HW);
int ampc__cu_bn_fwd(ampc__cu_stream s, const ampc__cu_bn *p);
int ampc__cu_bn_bwd(ampc__cu_stream s, const ampc__cu_bn *p);

/* ---- rows: softmax, log-softmax, cross entropy (loss.cu) ---- */

int ampc__cu_softmax_fwd(ampc__cu_stream s, const void *x, int xt, void *y, int yt, int64_t N, int64_t K, int is_log);
int ampc__cu_softmax_bwd(ampc__cu_stream s, const void *y, int yt, const void *dy, int dyt, void *dx, int dxt, int acc,
                         int64_t N, int64_t K, int is_log, ampc__cu_count *cnt);
/* the mean loss into out (one value of type ot); losses: N floats of
 * workspace; a label outside 0..K-1 sets *err (the first such sample) */
int ampc__cu_ce_fwd(ampc__cu_stream s, const void *x, int xt, const int32_t *labels, void *out, int ot, int64_t N,
                    int64_t K, float smoothing, float *losses, ampc__cu_error *err);
int ampc__cu_ce_bwd(ampc__cu_stream s, const void *x, int xt, const int32_t *labels, void *dx, int dxt, int acc, int64_t N,
                    int64_t K, float smoothing, float seed, ampc__cu_count *cnt);

/* ---- the step's flat passes (step.cu) ---- */

typedef struct {
  size_t start, n;
  int type;               /* of model */
  void *model;
  int grad_type;
  const void *grad;
} ampc__cu_span;
typedef struct {
  int ns;
  ampc__cu_span s[3];
} ampc__cu_spans;

/* What the check reduces to (device), read back once a step. */
typedef struct {
  double sumsq;
  float max_abs;
  int found_inf;
} ampc__cu_check_result;

/* One chunk's partial result of the check (device workspace). */
typedef struct {
  double sumsq;
  float max_abs;
  int bad;
} ampc__cu_partial;
enum { AMPC__CU_STEP_CHUNK = 8192 };
/* chunks of the spans: the partials the check needs */
size_t ampc__cu_check_chunks(const ampc__cu_spans *sp);
int ampc__cu_check(ampc__cu_stream s, const ampc__cu_spans *sp, float gmul, int want_max, ampc__cu_partial *partials,
                   ampc__cu_check_result *out);
/* dst[start + i] (+)= mul * grad[i]; scratch: 2 device ints (zeroed here) */
int ampc__cu_fold(ampc__cu_stream s, const ampc__cu_spans *sp, float *dst, float mul, int accumulate, float *slot,
                  float max_div, unsigned *scratch);
/* flags[r] = some grad * gmul of flat range r = ranges[2r] + [0, ranges[2r+1]) is not finite */
int ampc__cu_nonfinite(ampc__cu_stream s, const ampc__cu_spans *sp, const unsigned long long *ranges, size_t nranges,
                       float gmul, unsigned char *flags);
typedef struct {
  int kind;                    /* ampc_optim_kind */
  ampc__optim_consts k;
  float *state[3];
  float *master;
  float gmul;
  int sr;
  uint64_t sr_seed, sr_base, sr_stream;
} ampc__cu_update;
int ampc__cu_update_run(ampc__cu_stream s, const ampc__cu_spans *sp, const ampc__cu_update *u);

#ifdef __cplusplus
}
#endif
#endif
