/* Fully connected layer: y (N, M) = x (N, K) w^T + b.
 * Each product is split over our own threads along one of its output
 * dimensions, every part a single-threaded product: the same pool as every
 * other kernel, a fixed partition (so results do not depend on scheduling),
 * and no allocation inside OpenBLAS's threaded driver. The parts run on
 * ampc's kernel where it runs 16 wide (AVX-512; ampc__cpu_gemm_wide) and the
 * product's width is a multiple of 8 (the forward against w transposed
 * first), else on OpenBLAS's sgemm: the cnn's 3136 -> 128 layer took 0.99 ms
 * a step instead of 1.54 with OpenBLAS's AVX2 kernels (AMD EPYC family 26,
 * OPENBLAS_CORETYPE=Haswell, medians of 5 and 6 alternating runs). A layer
 * stored in bf16 takes the bf16 engine where the CPU has one (par_bf16):
 * the cnn's layer at --half bf16 0.59 -> 0.36 ms forward, 1.17 -> 0.66 ms
 * backward on a Zen 4's AVX-512 BF16, 2 threads. */
#include <cblas.h>
#include <omp.h>

#include "backend/cpu/cpu_internal.h"

typedef struct {
  int64_t N, K, M;
} lin_geom;

int ampc__cpu_linear_blas = 0; /* a hook for tests: always sgemm */
static int lin_own(int tb, int64_t cols) { return !tb && cols % 8 == 0 && !ampc__cpu_linear_blas && ampc__cpu_gemm_wide(); }

/* C (rows, cols) = op(A) op(B), row-major, split into nthreads bands of
 * rows (split_rows) or of columns. A, B, C are addressed for the whole product;
 * ta/tb: A is stored transposed (K x rows) / B is stored as (cols x K). */
static void par_sgemm(int nthreads, int split_rows, int ta, int tb, int64_t rows, int64_t cols, int64_t k,
                      const float *a, int64_t lda, const float *b, int64_t ldb, float *c, int64_t ldc) {
  int64_t total = split_rows ? rows : cols;
  int parts = nthreads < 1 ? 1 : nthreads, own = lin_own(tb, cols);
  if (total < 2 * parts || rows * cols * k < (1 << 18)) parts = 1;
#pragma omp parallel for num_threads(parts) schedule(static) if (parts > 1)
  for (int p = 0; p < parts; p++) {
    int64_t lo = total * p / parts, hi = total * (p + 1) / parts;
    if (own && !split_rows) { /* bands of columns: whole vectors of 8 */
      lo = lo / 8 * 8;
      hi = p == parts - 1 ? total : hi / 8 * 8;
    }
    if (hi <= lo) continue;
    const float *ap = a, *bp = b;
    float *cp = c;
    int64_t r = rows, q = cols;
    if (split_rows) {
      ap = ta ? a + lo : a + lo * lda;
      cp = c + lo * ldc;
      r = hi - lo;
    } else {
      bp = tb ? b + lo * ldb : b + lo;
      cp = c + lo;
      q = hi - lo;
    }
    if (own)
      ampc__cpu_gemm(r, q, k, ap, lda, ta, bp, ldb, cp, ldc, 0);
    else
      cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (int)r, (int)q, (int)k, 1.0f,
                  ap, (int)lda, bp, (int)ldb, 0.0f, cp, (int)ldc);
  }
}

/* Whole-tensor conversions, split over the threads in blocks. */
enum { LIN_CONVERT_BLOCK = 1 << 15 };

static const float *load_par(const ampc__op_call *c, const ampc_tensor *t, size_t n, float *buf) {
  if (t->dtype == AMPC_DTYPE_F32) return t->data;
  int64_t nb = (int64_t)((n + LIN_CONVERT_BLOCK - 1) / LIN_CONVERT_BLOCK);
#pragma omp parallel for num_threads(cpu_ctx(c)->nthreads) schedule(static) if (nb > 1)
  for (int64_t b = 0; b < nb; b++) {
    size_t i = (size_t)b * LIN_CONVERT_BLOCK, m = n - i < LIN_CONVERT_BLOCK ? n - i : LIN_CONVERT_BLOCK;
    ampc_load_f32(buf + i, t->dtype, cpu_at(t, (int64_t)i), m);
  }
  return buf;
}

/* cpu_store_grad of n values over the threads; tmp as long as src */
static void store_grad_par(const ampc__op_call *c, const ampc_tensor *t, float *src, size_t n, int acc, float *tmp) {
  int64_t nb = (int64_t)((n + LIN_CONVERT_BLOCK - 1) / LIN_CONVERT_BLOCK);
#pragma omp parallel for num_threads(cpu_ctx(c)->nthreads) schedule(static) if (nb > 1)
  for (int64_t b = 0; b < nb; b++) {
    size_t i = (size_t)b * LIN_CONVERT_BLOCK, m = n - i < LIN_CONVERT_BLOCK ? n - i : LIN_CONVERT_BLOCK;
    cpu_store_grad(c, t, (int64_t)i, src + i, m, acc, tmp + i);
  }
}

/* dst (cols x rows) = src (rows x cols)^T, over the threads in bands of
 * columns of src (multiples of 8): the cnn's 3136 -> 128 layer's forward
 * took 0.36 ms a step with one thread transposing, 0.28 with two */
static void transpose_par(const ampc__op_call *c, const float *src, int64_t rows, int64_t cols, float *dst) {
  int parts = cpu_ctx(c)->nthreads < 1 ? 1 : cpu_ctx(c)->nthreads;
  if (rows * cols < LIN_CONVERT_BLOCK || cols < 16 * parts) parts = 1;
#pragma omp parallel for num_threads(parts) schedule(static) if (parts > 1)
  for (int p = 0; p < parts; p++) {
    int64_t lo = cols * p / parts / 8 * 8, hi = p == parts - 1 ? cols : cols * (p + 1) / parts / 8 * 8;
    if (hi > lo) ampc__cpu_transpose_ld(src + lo, rows, hi - lo, cols, dst + lo * rows, rows);
  }
}

static lin_geom lin_geometry(const ampc__op_call *c) {
  lin_geom g = {c->in[0].shape.d[0], c->in[0].shape.d[1], c->in[1].shape.d[0]};
  return g;
}

/* The products in bf16 (gemm_amx.c: AMX tiles or AVX-512 BF16's dot
 * products) where the layer's input, weight and output are bf16, as the
 * convolutions' (conv.c: their values, and the gradient's, are bf16's, so
 * the products are exact). Each product C (rows x cols) = A B packs A once,
 * shared, and each thread a band of B's columns; the bytes: */
static size_t lin_bf16_product_bytes(int64_t rows, int64_t cols, int64_t k, int nt) {
  int64_t band = (cols + nt - 1) / nt;
  return ampc__cpu_amx_pack_a_bytes(rows, k) + (size_t)nt * ampc__cpu_amx_pack_b_bytes(k, band);
}
static size_t lin_bf16_bytes(const lin_geom *g, int nt) {
  size_t f = lin_bf16_product_bytes(g->N, g->M, g->K, nt), dx = lin_bf16_product_bytes(g->N, g->K, g->M, nt),
         dw = lin_bf16_product_bytes(g->M, g->K, g->N, nt);
  size_t most = f > dx ? f : dx;
  return (most > dw ? most : dw) + (size_t)(nt + 1) * 64;
}
static size_t lin_f32_floats(const lin_geom *g) { return (size_t)(2 * g->N * g->K + 2 * g->M * g->K + g->N * g->M + g->M + 64); }
/* (not for the smallest layers, whose packing costs more than the products
 * save: the cnn's 128 -> 10 layer's backward went from 0.013 to 0.02 ms) */
static int lin_bf16_wanted(const ampc__op_call *c) {
  lin_geom g = lin_geometry(c);
  return c->in[0].dtype == AMPC_DTYPE_BF16 && c->in[1].dtype == AMPC_DTYPE_BF16 && c->out.dtype == AMPC_DTYPE_BF16 &&
         g.N * g.M * g.K >= (1 << 18) && !ampc__cpu_linear_blas && ampc__cpu_bf16_products();
}
/* At run time: wanted, and the workspace laid out at compile has the room
 * (a test may switch the engine on between compile and run). */
static int lin_bf16(const ampc__op_call *c) {
  lin_geom g = lin_geometry(c);
  int nt = cpu_ctx(c)->nthreads < 1 ? 1 : cpu_ctx(c)->nthreads;
  return lin_bf16_wanted(c) && c->ws_size >= lin_f32_floats(&g) * sizeof(float) + lin_bf16_bytes(&g, nt);
}

/* C (rows x cols) = op(A) op(B) as par_sgemm's, on the bf16 engine: A
 * packed by all the threads, then each thread's band of columns of B packed
 * and multiplied, in the workspace after the f32 copies (lin_bf16_bytes). */
static void par_bf16(const ampc__op_call *c, int ta, int tb, int64_t rows, int64_t cols, int64_t k, const float *a,
                     int64_t lda, const float *b, int64_t ldb, float *C, int64_t ldc) {
  lin_geom g = lin_geometry(c);
  int nt = cpu_ctx(c)->nthreads < 1 ? 1 : cpu_ctx(c)->nthreads;
  int64_t band = (cols + nt - 1) / nt;
  char *pa = (char *)c->ws + lin_f32_floats(&g) * sizeof(float), *pb0 = pa + ampc__cpu_amx_pack_a_bytes(rows, k) + 64;
  size_t pb_bytes = ampc__cpu_amx_pack_b_bytes(k, band) + 64;
#pragma omp parallel num_threads(nt)
  {
    int tid = omp_get_thread_num(), np = omp_get_num_threads();
    ampc__cpu_amx_pack_a(rows, k, a, lda, ta, pa, tid, np);
#pragma omp barrier
    /* nt bands (the room is laid out for them), however many threads came */
    for (int part = tid; part < nt; part += np) {
      int64_t lo = band * part, hi = lo + band < cols ? lo + band : cols;
      if (hi <= lo) continue;
      char *pb = pb0 + (size_t)tid * pb_bytes;
      ampc__cpu_amx_pack_b(k, hi - lo, tb ? b + lo * ldb : b + lo, ldb, tb, pb);
      ampc__cpu_bf16_gemm_packed(rows, hi - lo, k, pa, pb, C + lo, ldc, 0);
    }
  }
}

/* workspace: x, w, y/dy, dx, dw as f32; the bf16 engine's packed operands
 * after them where it runs */
size_t ampc__cpu_linear_ws(const ampc__op_call *c, int nthreads) {
  lin_geom g = lin_geometry(c);
  int nt = nthreads < 1 ? 1 : nthreads;
  return lin_f32_floats(&g) * sizeof(float) + (lin_bf16_wanted(c) ? lin_bf16_bytes(&g, nt) : 0);
}

ampc_status ampc__cpu_linear_fwd(const ampc__op_call *c) {
  lin_geom g = lin_geometry(c);
  float *xb = c->ws, *wb = xb + g.N * g.K, *yb = wb + g.M * g.K;
  const float *xf = load_par(c, &c->in[0], (size_t)(g.N * g.K), xb);
  const float *wf = load_par(c, &c->in[1], (size_t)(g.M * g.K), wb);
  float *yf = c->out.dtype == AMPC_DTYPE_F32 ? (float *)c->out.data : yb;
  if (lin_bf16(c)) {
    par_bf16(c, 0, 1, g.N, g.M, g.K, xf, g.K, wf, g.K, yf, g.M);
  } else if (lin_own(0, g.M)) {
    /* w^T (K, M) in the space the backward's dx and dw take */
    float *wt = yb + g.N * g.M + g.M + 16;
    transpose_par(c, wf, g.M, g.K, wt);
    par_sgemm(cpu_ctx(c)->nthreads, g.N >= g.M, 0, 0, g.N, g.M, g.K, xf, g.K, wt, g.M, yf, g.M);
  } else {
    par_sgemm(cpu_ctx(c)->nthreads, g.N >= g.M, 0, 1, g.N, g.M, g.K, xf, g.K, wf, g.K, yf, g.M);
  }
  if (c->n_in > 2) {
    float *bias = yb + g.N * g.M;
    const float *bf = cpu_load(&c->in[2], 0, (size_t)g.M, bias);
    for (int64_t n = 0; n < g.N; n++)
      for (int64_t m = 0; m < g.M; m++) yf[n * g.M + m] += bf[m];
  }
  if (yf != c->out.data) cpu_store(&c->out, 0, yf, (size_t)(g.N * g.M), 0, NULL);
  return AMPC_OK;
}

ampc_status ampc__cpu_linear_bwd(const ampc__op_call *c) {
  lin_geom g = lin_geometry(c);
  float *xb = c->ws, *wb = xb + g.N * g.K, *dyb = wb + g.M * g.K, *dxb = dyb + g.N * g.M, *dwb = dxb + g.N * g.K;
  float *tmp = dwb + g.M * g.K; /* g.M floats for the bias */
  const float *dyf = load_par(c, &c->dout, (size_t)(g.N * g.M), dyb);
  /* (the bf16 engine only where dY's values are bf16's too) */
  int bf16 = lin_bf16(c) && c->dout.dtype == AMPC_DTYPE_BF16;
  if (c->din[0].data) {
    const float *wf = load_par(c, &c->in[1], (size_t)(g.M * g.K), wb);
    if (bf16) par_bf16(c, 0, 0, g.N, g.K, g.M, dyf, g.M, wf, g.K, dxb, g.K);
    else par_sgemm(cpu_ctx(c)->nthreads, g.N >= g.K, 0, 0, g.N, g.K, g.M, dyf, g.M, wf, g.K, dxb, g.K);
    /* xb is not loaded yet: it stages the old gradient when accumulating */
    store_grad_par(c, &c->din[0], dxb, (size_t)(g.N * g.K), c->din_acc[0], xb);
  }
  if (c->din[1].data) {
    const float *xf = load_par(c, &c->in[0], (size_t)(g.N * g.K), xb);
    if (bf16) par_bf16(c, 1, 0, g.M, g.K, g.N, dyf, g.M, xf, g.K, dwb, g.K);
    else par_sgemm(cpu_ctx(c)->nthreads, g.M >= g.K, 1, 0, g.M, g.K, g.N, dyf, g.M, xf, g.K, dwb, g.K);
    store_grad_par(c, &c->din[1], dwb, (size_t)(g.M * g.K), c->din_acc[1], wb);
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
