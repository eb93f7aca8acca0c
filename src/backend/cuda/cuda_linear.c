/* Fully connected layer on cuBLAS: y (N, M) = x (N, K) w^T + b, with 16-bit
 * inputs on the tensor cores and f32 accumulation (f32 inputs: true f32, or
 * TF32 with the tf32 option). Row-major tensors are cuBLAS's column-major
 * transposes:
 *
 *   forward:        y' (M x N)  = w'^T (M x K) x' (K x N)    gemm(T, N)
 *   backward data:  dx' (K x N) = w' (K x M) dy' (M x N)     gemm(N, N)
 *   backward weight dw' (K x M) = x' (K x N) dy'^T (N x M)   gemm(N, T)
 *
 * The bias is written into y first and the product added to it (beta = 1),
 * so that the sum is rounded once into 16-bit storage, as on the cpu;
 * gradients accumulate likewise (beta = 1). With the underflow statistics on,
 * a 16-bit gradient is computed in f32 and stored by a kernel that counts.
 * Operands of different storage types (an f32 activation into a 16-bit
 * layer) are converted to f32 in the workspace and multiplied there, as the
 * cpu backend computes every storage type in f32. */
#include "backend/cuda/cuda_internal.h"

static cudaDataType_t blas_type(ampc_dtype t) {
  return t == AMPC_DTYPE_F16 ? CUDA_R_16F : t == AMPC_DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

static cublasComputeType_t compute_type(ampc__device *d, ampc_dtype t) {
  return t == AMPC_DTYPE_F32 && d->opts.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}

static int is_half(ampc_dtype t) { return t == AMPC_DTYPE_F16 || t == AMPC_DTYPE_BF16; }

/* C (m x n, column-major) (+)= op(A) op(B) */
static ampc_status gemm(ampc__device *d, int ta, int tb, int64_t m, int64_t n, int64_t k, const void *a, ampc_dtype at,
                        int64_t lda, const void *b, ampc_dtype bt, int64_t ldb, float beta, void *c, ampc_dtype ct,
                        int64_t ldc, ampc_dtype op_type) {
  cublasHandle_t h;
  const ampc__cu_blas_api *api;
  AMPC_TRY(ampc__cu_blas(d, &h));
  AMPC_TRY(ampc__cu_blas_api_get(&api));
  const float alpha = 1.0f;
  cublasStatus_t s = api->gemm_ex(h, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, (int)m, (int)n, (int)k,
                                  &alpha, a, blas_type(at), (int)lda, b, blas_type(bt), (int)ldb, &beta, c, blas_type(ct),
                                  (int)ldc, compute_type(d, op_type), CUBLAS_GEMM_DEFAULT);
  if (s != CUBLAS_STATUS_SUCCESS)
    return ampc__error(AMPC_EIO, "cuda: cublasGemmEx (%lld x %lld x %lld, %s): %s", (long long)m, (long long)n, (long long)k,
                       ampc_dtype_name(op_type), api->status_string(s));
  return AMPC_OK;
}

/* x, weight, output and its gradient not all of one type */
static int mixed(const ampc__op_call *c) {
  ampc_dtype t = c->in[0].dtype;
  return c->in[1].dtype != t || c->out.dtype != t || c->dout.dtype != t;
}

/* workspace: f32 gradients of x and w (the counting path), and f32 copies
 * of x, w and y (the mixed-type path) */
size_t ampc__cu_linear_ws(ampc__device *d, const ampc__op_call *c) {
  int64_t N = c->in[0].shape.d[0], K = c->in[0].shape.d[1], M = c->in[1].shape.d[0];
  return (size_t)(2 * N * K + 2 * M * K + N * M) * sizeof(float) + 256;
}

/* f32 copy of a tensor into workspace */
static ampc_status to_f32(ampc__device *d, const ampc_tensor *t, float *dst) {
  int e = ampc__cu_convert(ampc__cu_of(d)->stream, dst, AMPC_DTYPE_F32, t->data, t->dtype, (size_t)ampc_tensor_numel(t));
  return e ? ampc__cu_error_rt(e, "linear: converting an operand") : AMPC_OK;
}

ampc_status ampc__cu_linear_fwd(ampc__device *d, const ampc__op_call *c) {
  int64_t N = c->in[0].shape.d[0], K = c->in[0].shape.d[1], M = c->in[1].shape.d[0];
  ampc_dtype t = c->in[0].dtype;
  const void *x = c->in[0].data, *w = c->in[1].data;
  void *y = c->out.data;
  float *ws = c->ws;
  int mix = mixed(c);
  if (mix) {
    AMPC_TRY(to_f32(d, &c->in[0], ws));
    AMPC_TRY(to_f32(d, &c->in[1], ws + N * K));
    x = ws;
    w = ws + N * K;
    y = ws + N * K + M * K;
    t = AMPC_DTYPE_F32;
  }
  float beta = 0.0f;
  if (c->n_in > 2 && c->in[2].data) {
    int e = ampc__cu_fill_channels(ampc__cu_of(d)->stream, y, t, c->in[2].data, c->in[2].dtype, N, M, 1);
    if (e) return ampc__cu_error_rt(e, "linear: the bias");
    beta = 1.0f;
  }
  AMPC_TRY(gemm(d, 1, 0, M, N, K, w, t, K, x, t, K, beta, y, t, M, t));
  if (!mix) return AMPC_OK;
  int e = ampc__cu_convert(ampc__cu_of(d)->stream, c->out.data, c->out.dtype, y, AMPC_DTYPE_F32, (size_t)(N * M));
  return e ? ampc__cu_error_rt(e, "linear: storing the output") : AMPC_OK;
}

/* The gradient (rows x cols, row-major, for tensor g) of a product: straight
 * into g, or (counting underflow of a 16-bit g) into f32 workspace first. */
static ampc_status grad_product(ampc__device *d, ampc_dtype t, const ampc_tensor *g, int acc, int tb, int64_t m, int64_t n,
                                int64_t k, const void *a, int64_t lda, const void *b, int64_t ldb, float *tmp) {
  ampc__cu_count *cnt = ampc__cu_counters(d, 1);
  if (t == g->dtype && (!cnt || !is_half(g->dtype))) return gemm(d, 0, tb, m, n, k, a, t, lda, b, t, ldb, acc ? 1.0f : 0.0f, g->data, g->dtype, m, t);
  AMPC_TRY(gemm(d, 0, tb, m, n, k, a, t, lda, b, t, ldb, 0.0f, tmp, AMPC_DTYPE_F32, m, t));
  int e = ampc__cu_store_grad(ampc__cu_of(d)->stream, tmp, g->data, g->dtype, acc, (size_t)(m * n), cnt);
  return e ? ampc__cu_error_rt(e, "linear: storing a gradient") : AMPC_OK;
}

ampc_status ampc__cu_linear_bwd(ampc__device *d, const ampc__op_call *c) {
  int64_t N = c->in[0].shape.d[0], K = c->in[0].shape.d[1], M = c->in[1].shape.d[0];
  ampc_dtype t = c->in[0].dtype;
  const void *x = c->in[0].data, *w = c->in[1].data, *dy = c->dout.data;
  float *tmp = c->ws, *f = tmp + N * K + M * K; /* products; then f32 copies of dy, w, x */
  if (mixed(c)) {
    AMPC_TRY(to_f32(d, &c->dout, f));
    AMPC_TRY(to_f32(d, &c->in[1], f + N * M));
    AMPC_TRY(to_f32(d, &c->in[0], f + N * M + M * K));
    dy = f;
    w = f + N * M;
    x = f + N * M + M * K;
    t = AMPC_DTYPE_F32;
  }
  if (c->din[0].data) AMPC_TRY(grad_product(d, t, &c->din[0], c->din_acc[0], 0, K, N, M, w, K, dy, M, tmp));
  if (c->din[1].data) AMPC_TRY(grad_product(d, t, &c->din[1], c->din_acc[1], 1, K, M, N, x, K, dy, M, tmp + N * K));
  if (c->n_in > 2 && c->din[2].data) {
    int e = ampc__cu_channel_sum(ampc__cu_of(d)->stream, c->dout.data, c->dout.dtype, N, M, 1, c->din[2].data,
                                 c->din[2].dtype, c->din_acc[2], ampc__cu_counters(d, 1));
    if (e) return ampc__cu_error_rt(e, "linear: the bias gradient");
  }
  return AMPC_OK;
}
