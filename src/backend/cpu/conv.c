/* Convolution on the CPU as cache-sized matrix products.
 *
 * Work is cut into blocks whose im2col matrix (K = C*k*k rows, `cols`
 * columns) stays in cache: several whole samples when a sample's output is
 * small (deep layers), or a band of output rows of one sample when it is large
 * (early layers). The block width is about the number of output channels, so
 * that streaming the weight matrix and building the columns cost about the
 * same. Forward and backward data: each thread takes whole samples (or
 * groups) as threads come free; the weight gradient: each thread the columns
 * of a share of the input channels over every group (on AMX tiles: a fixed
 * share of the groups, whose partial sums are added in thread order). Each
 * runs its blocks' products on the calling thread: ampc's kernel where it
 * runs 16 wide (conv_gemm), else
 * single-threaded sgemm (the OpenMP build of OpenBLAS runs on the calling
 * thread inside a parallel region, so there is one pool of threads and no
 * oversubscription). Half storage is converted to f32 while a sample is staged
 * for im2col, and the f32 product is rounded to the output type as it is
 * stored, so 16-bit storage adds no separate pass over memory.
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
  int64_t nb;   /* samples per group (1 when a sample is cut into row bands) */
  int64_t rb;   /* output rows per band (OH when whole samples are grouped) */
  int64_t ncmax; /* widest block */
  int nt;       /* threads the workspace is laid out for */
  int bf16;     /* the products on bf16 engines (conv_bf16): AMX tiles or AVX-512 BF16 */
  size_t per_thread, shared; /* floats */
  size_t off_y, off_dcols, off_db, off_xs, off_dxs;
  size_t off_pa, off_pb; /* AMX: a thread's packed A (dY) and B operands */
  size_t off_pw;         /* AMX: the packed weight, shared */
} conv_geom;

enum { CONV_MIN_COLS = 256, CONV_MAX_COL_BYTES = 4 << 20, CONV_WINO_MIN_CHANNELS = 8, CONV_BALANCE_GROUPS = 8 };

static int conv_bf16(const ampc__op_call *c);
static int use_a3(const ampc__op_call *c);

static size_t floats_of(size_t bytes) { return (bytes + 3) / 4 + 16; }

static conv_geom conv_geometry_of(const ampc__op_call *c, int nthreads, int bf16) {
  conv_geom g;
  g.bf16 = bf16;
  const ampc_shape *x = &c->in[0].shape, *w = &c->in[1].shape, *y = &c->out.shape;
  g.N = x->d[0]; g.C = x->d[1]; g.H = x->d[2]; g.W = x->d[3];
  g.O = w->d[0]; g.k = w->d[2]; g.s = c->attr.stride; g.p = c->attr.pad;
  g.OH = y->d[2]; g.OW = y->d[3]; g.OHW = g.OH * g.OW;
  g.K = g.C * g.k * g.k; g.CHW = g.C * g.H * g.W;
  g.nt = nthreads < 1 ? 1 : nthreads;
  int64_t target = g.O > CONV_MIN_COLS ? g.O : CONV_MIN_COLS;
  int64_t cap = CONV_MAX_COL_BYTES / (4 * g.K);
  if (target > cap) target = cap > g.OW ? cap : g.OW;
  cpu_blocking(target, g.OW, g.OH, (g.N + g.nt - 1) / g.nt, &g.nb, &g.rb);
  /* Groups of samples come in a multiple of the threads where they are
   * few, each then one sample smaller at most: threads take whole groups,
   * and ResNet-18's last strided layer (256 -> 512 channels, 4 x 4 outputs,
   * 28 samples a group) made 5 groups of its 128 samples, so one of 2
   * threads did 72 and the other 56. */
  if (g.nb > 1 && g.nt > 1) {
    int64_t ng = (g.N + g.nb - 1) / g.nb;
    if (ng % g.nt != 0 && ng < CONV_BALANCE_GROUPS * g.nt) {
      ng = (ng + g.nt - 1) / g.nt * g.nt;
      g.nb = (g.N + ng - 1) / ng;
    }
  }
  g.ncmax = g.nb * g.rb * g.OW;
  size_t nc = (size_t)g.ncmax;
  g.off_y = (size_t)g.K * nc;
  g.off_dcols = g.off_y + (size_t)g.O * nc;
  /* dcols: backward data's columns, or backward weights' transposed; then
   * the forward's bias in f32 */
  g.off_db = g.off_dcols + (size_t)g.K * nc;
  g.off_xs = g.off_db + (size_t)g.O;
  g.off_dxs = g.off_xs + (size_t)g.CHW;
  g.per_thread = g.off_dxs + (size_t)g.CHW + 16;
  /* the weight in f32 (forward, backward data), or the weight and bias
   * gradient the threads write (backward weights, before the weight) */
  g.shared = (size_t)(g.O * g.K + g.O) + 16;
  g.off_pa = g.off_pb = g.off_pw = 0;
  if (g.bf16) {
    /* A: dY (O x cols); B: the columns (K x cols), their transpose, or dY */
    size_t pb = ampc__cpu_amx_pack_b_bytes(g.K, g.ncmax), pb_dy = ampc__cpu_amx_pack_b_bytes(g.O, g.ncmax);
    g.off_pa = g.per_thread;
    g.off_pb = g.off_pa + floats_of(ampc__cpu_amx_pack_a_bytes(g.O, g.ncmax));
    g.per_thread = g.off_pb + floats_of(pb > pb_dy ? pb : pb_dy);
    g.off_pw = g.shared;
    g.shared += floats_of(ampc__cpu_amx_pack_a_bytes(g.O, g.K)); /* (O x K or K x O: the same tiles' size) */
  }
  return g;
}

/* The layout, with the bf16 engines' room where they are used -- at run time
 * only if the workspace laid out at compile has it (a test may switch them on
 * between compile and run). */
static conv_geom conv_geometry(const ampc__op_call *c, int nthreads) {
  conv_geom g = conv_geometry_of(c, nthreads, conv_bf16(c));
  if (g.bf16 && c->ws && c->ws_size < (g.shared + g.per_thread * (size_t)g.nt) * sizeof(float))
    g = conv_geometry_of(c, nthreads, 0);
  return g;
}

/* The build of the kernels' vector code in use. Defined here, with the
 * convolutions (the bulk of the vector code), to keep the backend's table
 * file untouched; it speaks for every CPU_VECTOR kernel. */
const char *ampc_kernel_path(void) { return cpu_vector_path(); }
const char *ampc_kernel_tiles(void) {
  return ampc__cpu_amx() ? "amx-bf16" : ampc__cpu_bf16dp() ? "avx512-bf16" : "none";
}

/* The im2col products in bf16 (gemm_amx.c) where the CPU has AMX tiles or
 * AVX-512 BF16's dot products and the convolution's input, weight and output
 * are bf16: their values, and the gradient's, are bf16's, so bf16 products
 * are the f32 products of the same values (the sums' order aside), 16 times
 * (tiles) or twice (dot products) as many a cycle as AVX-512's FMAs. Not for
 * the direct loop (the first layer's 3 channels) nor where the tests hold
 * the products to sgemm (ampc__cpu_conv_blas). */
int ampc__cpu_conv_blas = 0;
static int conv_bf16(const ampc__op_call *c) {
  return c->in[0].dtype == AMPC_DTYPE_BF16 && c->in[1].dtype == AMPC_DTYPE_BF16 && c->out.dtype == AMPC_DTYPE_BF16 &&
         !ampc__cpu_conv_blas && ampc__cpu_bf16_products();
}

/* Winograd where the graph asks for it, or (AUTO) where it is faster: with
 * few channels the transforms cost more than the products they save. (With
 * AMX's bf16 products too: im2col's passes over memory cost more than
 * Winograd's f32 products save, ResNet-18 O2 bf16 75-94 images/s against
 * 95-106 on a Xeon of model 207, 2 threads.) */
static int use_winograd(const ampc__op_call *c) {
  if (!cpu_conv3x3_s1(c) || (cpu_ctx(c)->conv_algo != AMPC_CONV_AUTO && cpu_ctx(c)->conv_algo != AMPC_CONV_WINOGRAD)) return 0;
  if (cpu_ctx(c)->conv_algo == AMPC_CONV_WINOGRAD) return 1;
  if (use_a3(c)) return 0;
  return c->in[0].shape.d[1] >= CONV_WINO_MIN_CHANNELS && c->in[1].shape.d[0] >= CONV_WINO_MIN_CHANNELS;
}

/* 3x3 stride-1 convolutions with padding 1 of bf16 (AUTO, on AMX tiles):
 * the forward, the input gradient and the weight gradient straight from
 * padded planes on the tiles (conv_amx.c). Not for the direct loop's few
 * input channels. */
static int use_a3(const ampc__op_call *c) {
  return cpu_ctx(c)->conv_algo == AMPC_CONV_AUTO && cpu_conv3x3_s1(c) && c->attr.pad == 1 &&
         !ampc__cpu_direct_preferred(c) && conv_bf16(c) && ampc__cpu_amx();
}

/* At run time: the tiles' path when chosen and the workspace laid out at
 * compile holds it (else im2col). */
static int run_a3(const ampc__op_call *c) {
  return use_a3(c) && c->ws_size >= ampc__cpu_a3_ws(c, cpu_ctx(c)->nthreads);
}

/* At run time: Winograd when chosen and the workspace laid out at compile
 * holds it. */
static int run_winograd(const ampc__op_call *c) {
  return use_winograd(c) && c->ws_size >= ampc__cpu_wino_ws(c, cpu_ctx(c)->nthreads);
}

/* The direct loop where the graph asks for it, or (AUTO) for 3x3 stride-1
 * convolutions of inputs with few channels. */
static int use_direct(const ampc__op_call *c) {
  if (!cpu_conv3x3_s1(c)) return 0;
  return cpu_ctx(c)->conv_algo == AMPC_CONV_DIRECT || (cpu_ctx(c)->conv_algo == AMPC_CONV_AUTO && ampc__cpu_direct_preferred(c));
}

static size_t im2col_ws(const ampc__op_call *c, int nthreads) {
  conv_geom g = conv_geometry(c, nthreads);
  return (g.shared + g.per_thread * (size_t)g.nt) * sizeof(float);
}

size_t ampc__cpu_conv2d_ws(const ampc__op_call *c, int nthreads) {
  if (use_winograd(c)) return ampc__cpu_wino_ws(c, nthreads);
  /* fewer threads at run time give each a larger group of samples: room for
   * every count up to the compiled one; the direct loop's input gradient is
   * the im2col path's */
  size_t w = use_direct(c) ? ampc__cpu_direct_ws(c, nthreads) : use_a3(c) ? ampc__cpu_a3_ws(c, nthreads) : 0;
  for (int t = 1; t <= (nthreads < 1 ? 1 : nthreads); t++) {
    size_t s = im2col_ws(c, t);
    if (s > w) w = s;
  }
  return w;
}

/* cols[row][col0 + (oy-oy0)*OW + ox] for output rows [oy0, oy1) of one staged
 * sample x (C, H, W), the rows of channels [c0, c1) (row 0: channel c0's
 * first tap); ld = the block's width. */
CPU_VECTOR static void im2col(const conv_geom *g, const float *x, float *cols, int64_t ld, int64_t col0, int64_t oy0, int64_t oy1,
                              int64_t c0, int64_t c1) {
  for (int64_t ch = c0; ch < c1; ch++)
    for (int64_t ky = 0; ky < g->k; ky++)
      for (int64_t kx = 0; kx < g->k; kx++) {
        float *dst = cols + (((ch - c0) * g->k + ky) * g->k + kx) * ld + col0;
        const float *plane = x + ch * g->H * g->W;
        /* output columns whose input column is inside the image (none where
         * the tap lies past the right edge for every column: the numerator
         * is negative there, and C's division rounds it up to 0) */
        int64_t lo = g->p - kx > 0 ? (g->p - kx + g->s - 1) / g->s : 0;
        int64_t right = g->W - 1 + g->p - kx;
        int64_t hi = right < 0 ? 0 : right / g->s + 1;
        if (hi > g->OW) hi = g->OW;
        if (lo > hi) lo = hi;
        for (int64_t oy = oy0; oy < oy1; oy++) {
          float *d = dst + (oy - oy0) * g->OW;
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

/* dx (C, H, W) += the columns of output rows [oy0, oy1) of one sample. */
CPU_VECTOR static void col2im(const conv_geom *g, const float *cols, int64_t ld, int64_t col0, int64_t oy0, int64_t oy1, float *dx) {
  for (int64_t ch = 0; ch < g->C; ch++)
    for (int64_t ky = 0; ky < g->k; ky++)
      for (int64_t kx = 0; kx < g->k; kx++) {
        const float *src = cols + ((ch * g->k + ky) * g->k + kx) * ld + col0;
        float *plane = dx + ch * g->H * g->W;
        int64_t lo = g->p - kx > 0 ? (g->p - kx + g->s - 1) / g->s : 0;
        int64_t right = g->W - 1 + g->p - kx; /* (as in im2col) */
        int64_t hi = right < 0 ? 0 : right / g->s + 1;
        if (hi > g->OW) hi = g->OW;
        for (int64_t oy = oy0; oy < oy1; oy++) {
          int64_t iy = oy * g->s - g->p + ky;
          if (iy < 0 || iy >= g->H) continue;
          float *row = plane + iy * g->W - g->p + kx;
          const float *sp = src + (oy - oy0) * g->OW;
          if (g->s == 1)
            for (int64_t ox = lo; ox < hi; ox++) row[ox] += sp[ox];
          else
            for (int64_t ox = lo; ox < hi; ox++) row[ox * g->s] += sp[ox];
        }
      }
}

/* The columns of a block, the rows of channels [c0, c1): output rows [oy0,
 * oy1) of samples [n0, n0 + nbe), each sample's band at column s * band. A
 * half sample's channels, or theirs through the call's batch norm prologue,
 * are staged into xs (at their place in the sample) once, on the first band
 * (a block of several samples has only one band). */
static void block_cols(const conv_geom *g, const ampc__op_call *c, int64_t n0, int64_t nbe, int64_t oy0, int64_t oy1, int64_t c0,
                       int64_t c1, float *xs, float *cols) {
  const ampc_tensor *x = &c->in[0];
  int64_t band = (oy1 - oy0) * g->OW, ld = nbe * band, HW = g->H * g->W;
  int direct = x->dtype == AMPC_DTYPE_F32 && !c->pro;
  for (int64_t s = 0; s < nbe; s++) {
    const float *xp = direct ? (const float *)x->data + (n0 + s) * g->CHW : xs;
    if (!direct && (nbe > 1 || oy0 == 0)) {
      if (c->pro)
        for (int64_t ch = c0; ch < c1; ch++) cpu_load_input(c, (n0 + s) * g->CHW + ch * HW, (size_t)HW, ch, xs + ch * HW);
      else
        ampc_load_f32(xs + c0 * HW, x->dtype, cpu_at(x, (n0 + s) * g->CHW + c0 * HW), (size_t)((c1 - c0) * HW));
    }
    im2col(g, xp, cols, ld, s * band, oy0, oy1, c0, c1);
  }
}

/* The weight as f32 (O, K): the tensor itself when it is f32. */
static const float *weight_f32(const ampc__op_call *c, const conv_geom *g) {
  float *wf = (float *)c->ws;
  return cpu_load(&c->in[1], 0, (size_t)(g->O * g->K), wf);
}

/* The products run on ampc's kernel where it runs 16 wide (AVX-512; see
 * ampc__cpu_gemm_wide) and the product's width is a multiple of 8 (forward
 * and backward data: the block's columns, which for ResNet-18's strided and
 * 1x1 convolutions are planes of 16x16, 8x8 or 4x4; the weight gradient: K),
 * else on sgemm. On an AMD EPYC of family 26 with OpenBLAS's AVX2 kernels
 * (OPENBLAS_CORETYPE=Haswell) that took ResNet-18 O2's step from 725 to 610
 * ms; with its AVX-512 ones it was level or a little faster. When
 * ampc__cpu_conv_blas is set (a hook for tests), always sgemm. */
static int conv_own(int64_t n) { return n % 8 == 0 && !ampc__cpu_conv_blas && ampc__cpu_gemm_wide(); }
static void conv_gemm(int64_t m, int64_t n, int64_t k, const float *A, int64_t lda, int ta, const float *B, int64_t ldb,
                      float *C, int64_t ldc) {
  if (conv_own(n)) {
    ampc__cpu_gemm(m, n, k, A, lda, ta, B, ldb, C, ldc, 0);
    return;
  }
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, CblasNoTrans, (int)m, (int)n, (int)k, 1.0f, A, (int)lda, B,
              (int)ldb, 0.0f, C, (int)ldc);
}

/* Groups of samples [n0, n0 + nbe), numbered 0..ngroups-1. */
static int64_t ngroups(const conv_geom *g) { return (g->N + g->nb - 1) / g->nb; }
static void group_of(const conv_geom *g, int64_t gi, int64_t *n0, int64_t *nbe) {
  *n0 = gi * g->nb;
  *nbe = g->N - *n0 < g->nb ? g->N - *n0 : g->nb;
}

/* dY of a block as (O, nbe * band) f32, rows *ld apart: the gradient itself
 * when it is one sample in f32, else gathered into dyc. */
static const float *gather_dy(const conv_geom *g, const ampc_tensor *dy, int64_t n0, int64_t nbe, int64_t oy0, int64_t oy1,
                              float *dyc, int64_t *ld_out) {
  int64_t band = (oy1 - oy0) * g->OW, ld = nbe * band;
  if (nbe == 1 && dy->dtype == AMPC_DTYPE_F32) {
    *ld_out = g->OHW;
    return (const float *)dy->data + n0 * g->O * g->OHW + oy0 * g->OW;
  }
  for (int64_t s = 0; s < nbe; s++)
    for (int64_t m = 0; m < g->O; m++) {
      float *dst = dyc + m * ld + s * band;
      const float *src = cpu_load(dy, ((n0 + s) * g->O + m) * g->OHW + oy0 * g->OW, (size_t)band, dst);
      if (src != dst) memcpy(dst, src, (size_t)band * sizeof(float));
    }
  *ld_out = ld;
  return dyc;
}

ampc_status ampc__cpu_conv2d_fwd(const ampc__op_call *c) {
  if (run_winograd(c)) return ampc__cpu_wino_fwd(c);
  if (use_direct(c)) return ampc__cpu_direct_fwd(c);
  if (run_a3(c)) return ampc__cpu_a3_fwd(c);
  conv_geom g = conv_geometry(c, cpu_ctx(c)->nthreads);
  const float *wf = weight_f32(c, &g);
  const ampc_tensor *y = &c->out;
  const ampc_tensor *b = c->n_in > 2 ? &c->in[2] : NULL;
  int64_t ng = ngroups(&g);
  float *pw = (float *)c->ws + g.off_pw;
#pragma omp parallel num_threads(g.nt)
  {
    int tid = omp_get_thread_num();
    float *ws = cpu_ws_slice(c, tid, g.per_thread, g.shared);
    float *cols = ws, *yc = ws + g.off_y, *xs = ws + g.off_xs, *bias = ws + g.off_db, *pb = ws + g.off_pb;
    if (b) ampc_load_f32(bias, b->dtype, b->data, (size_t)g.O);
    if (g.bf16) {
      /* the weight's tiles, packed by all threads */
      ampc__cpu_amx_pack_a(g.O, g.K, wf, g.K, 0, pw, tid, omp_get_num_threads());
#pragma omp barrier
    }
    /* groups are independent: handed out as threads come free */
#pragma omp for schedule(dynamic, 1) nowait
    for (int64_t gi = 0; gi < ng; gi++) {
      int64_t n0, nbe;
      group_of(&g, gi, &n0, &nbe);
      for (int64_t oy0 = 0; oy0 < g.OH; oy0 += g.rb) {
        int64_t oy1 = oy0 + g.rb < g.OH ? oy0 + g.rb : g.OH, band = (oy1 - oy0) * g.OW, ld = nbe * band;
        block_cols(&g, c, n0, nbe, oy0, oy1, 0, g.C, xs, cols);
        if (nbe == 1 && y->dtype == AMPC_DTYPE_F32) {
          /* one sample into f32: the product lands in place, rows OHW apart */
          float *yp = (float *)y->data + n0 * g.O * g.OHW + oy0 * g.OW;
          conv_gemm(g.O, band, g.K, wf, g.K, 0, cols, band, yp, g.OHW);
          if (b)
            for (int64_t m = 0; m < g.O; m++)
              for (int64_t i = 0; i < band; i++) yp[m * g.OHW + i] += bias[m];
          continue;
        }
        if (g.bf16) {
          ampc__cpu_amx_pack_b(g.K, ld, cols, ld, 0, pb);
          ampc__cpu_bf16_gemm_packed(g.O, ld, g.K, pw, pb, yc, ld, 0);
        } else {
          conv_gemm(g.O, ld, g.K, wf, g.K, 0, cols, ld, yc, ld);
        }
        for (int64_t m = 0; m < g.O; m++)
          for (int64_t s = 0; s < nbe; s++) {
            float *row = yc + m * ld + s * band;
            if (b)
              for (int64_t i = 0; i < band; i++) row[i] += bias[m];
            cpu_store(y, ((n0 + s) * g.O + m) * g.OHW + oy0 * g.OW, row, (size_t)band, 0, NULL);
          }
      }
    }
  }
  return AMPC_OK;
}

/* Backward in two passes, each parallel over groups: the weight (and bias)
 * gradient, then the input gradient. */
ampc_status ampc__cpu_conv2d_bwd(const ampc__op_call *c) {
  if (run_winograd(c)) return ampc__cpu_wino_bwd(c);
  conv_geom g = conv_geometry(c, cpu_ctx(c)->nthreads);
  const ampc_tensor *dy = &c->dout, *dx = &c->din[0], *dw = &c->din[1];
  const ampc_tensor *db = c->n_in > 2 ? &c->din[2] : NULL;
  int need_dx = dx->data != NULL, need_dw = dw->data != NULL, need_db = db && db->data;
  int64_t ng = ngroups(&g);
  /* (the workspace has the bf16 engines' room whatever dY's type; they are used
   * only where its values are bf16's too) */
  int bf16 = g.bf16 && dy->dtype == AMPC_DTYPE_BF16;
  double t0 = cpu_ctx(c)->timers ? omp_get_wtime() : 0.0;
  if ((need_dw || need_db) && use_direct(c)) {
    AMPC_TRY(ampc__cpu_direct_bwd_weights(c));
  } else if ((need_dw || need_db) && bf16 && run_a3(c)) {
    AMPC_TRY(ampc__cpu_a3_bwd_weights(c));
  } else if (need_dw || need_db) {
    /* Each thread takes the weight gradient's columns of a share of the
     * input channels (whole blocks of 8, so that each share's columns stay a
     * multiple of 8 where K is) over every group in order, written into the
     * one sum in the shared workspace (the weight's f32 copy is made after):
     * the rows of the im2col matrix a thread builds are its own channels'
     * only, no thread keeps a partial O x K gradient (ResNet-18's 256 -> 512
     * strided layer: 4.7 MB a thread), and on ampc's kernel each element is
     * the same in-order sum over the samples for any thread count (the bf16
     * engines sum pairs of samples' columns, as a group's size pairs them);
     * the bias gradient is the first share's. Each thread gathers and packs
     * a group's dY itself (O x cols conversions against the O x cols x K/nth
     * products they feed, and no barrier a group). */
    float *sum = (float *)c->ws;
#pragma omp parallel num_threads(g.nt)
    {
      int tid = omp_get_thread_num(), nth = omp_get_num_threads();
      float *ws = cpu_ws_slice(c, tid, g.per_thread, g.shared);
      float *cols = ws, *dyc = ws + g.off_y, *colst = ws + g.off_dcols, *xs = ws + g.off_xs;
      float *dwt = sum, *dbt = sum + g.O * g.K;
      int64_t blocks = (g.C + 7) / 8, c0 = 8 * (blocks * tid / nth), c1 = 8 * (blocks * (tid + 1) / nth);
      if (c0 > g.C) c0 = g.C;
      if (c1 > g.C) c1 = g.C;
      int64_t k0 = c0 * g.k * g.k, kr = (c1 - c0) * g.k * g.k, own = conv_own(g.K);
      int bias = need_db && tid == 0;
      for (int64_t m = 0; m < g.O; m++) memset(dwt + m * g.K + k0, 0, (size_t)kr * sizeof(float));
      if (bias) memset(dbt, 0, (size_t)g.O * sizeof(float));
      for (int64_t gi = 0; gi < ng && ((need_dw && kr > 0) || bias); gi++) {
        int64_t n0, nbe;
        group_of(&g, gi, &n0, &nbe);
        for (int64_t oy0 = 0; oy0 < g.OH; oy0 += g.rb) {
          int64_t oy1 = oy0 + g.rb < g.OH ? oy0 + g.rb : g.OH, band = (oy1 - oy0) * g.OW, ld = nbe * band;
          int64_t ldd;
          const float *dyp = gather_dy(&g, dy, n0, nbe, oy0, oy1, dyc, &ldd);
          if (need_dw && kr > 0) {
            block_cols(&g, c, n0, nbe, oy0, oy1, c0, c1, xs, cols);
            if (bf16) {
              /* dW's share += dY * cols^T: dY packed, and the share's columns turned */
              float *pa = ws + g.off_pa, *pb = ws + g.off_pb;
              ampc__cpu_amx_pack_a(g.O, ld, dyp, ldd, 0, pa, 0, 1);
              ampc__cpu_amx_pack_b(ld, kr, cols, ld, 1, pb);
              ampc__cpu_bf16_gemm_packed(g.O, kr, ld, pa, pb, dwt + k0, g.K, 1);
            } else if (own) {
              /* dW += dY * cols^T on ampc's kernel, which wants B's rows
               * contiguous: the columns transposed (ld x kr) first */
              ampc__cpu_transpose(cols, kr, ld, colst);
              ampc__cpu_gemm(g.O, kr, ld, dyp, ldd, 0, colst, kr, dwt + k0, g.K, 1);
            } else {
              cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)g.O, (int)kr, (int)ld, 1.0f, dyp, (int)ldd, cols,
                          (int)ld, 1.0f, dwt + k0, (int)g.K);
            }
          }
          if (bias) /* a sample's band at a time: the same sums whatever the group */
            for (int64_t m = 0; m < g.O; m++)
              for (int64_t s = 0; s < nbe; s++) dbt[m] += cpu_sum(dyp + m * ldd + s * band, (size_t)band);
        }
      }
#pragma omp barrier
      /* stored a row of the gradient at a time, rows shared out */
      if (need_dw)
#pragma omp for schedule(static)
        for (int64_t m = 0; m < g.O; m++)
          cpu_store_grad(c, dw, m * g.K, sum + m * g.K, (size_t)g.K, c->din_acc[1], cols);
      if (bias) cpu_store_grad(c, db, 0, dbt, (size_t)g.O, c->din_acc[2], cols);
    }
  }
  double t1 = cpu_ctx(c)->timers ? omp_get_wtime() : 0.0;
  if (need_dx && bf16 && run_a3(c)) {
    AMPC_TRY(ampc__cpu_a3_bwd_data(c));
  } else if (need_dx) {
    const float *wf = weight_f32(c, &g);
    float *pw = (float *)c->ws + g.off_pw;
#pragma omp parallel num_threads(g.nt)
    {
      int tid = omp_get_thread_num();
      float *ws = cpu_ws_slice(c, tid, g.per_thread, g.shared);
      float *dyc = ws + g.off_y, *dcols = ws + g.off_dcols, *xs = ws + g.off_xs, *dxs = ws + g.off_dxs;
      float *pb = ws + g.off_pb;
      if (bf16) {
        /* W^T's tiles (K x O), packed by all threads */
        ampc__cpu_amx_pack_a(g.K, g.O, wf, g.K, 1, pw, tid, omp_get_num_threads());
#pragma omp barrier
      }
#pragma omp for schedule(dynamic, 1) nowait
      for (int64_t gi = 0; gi < ng; gi++) {
        int64_t n0, nbe;
        group_of(&g, gi, &n0, &nbe);
        for (int64_t oy0 = 0; oy0 < g.OH; oy0 += g.rb) {
          int64_t oy1 = oy0 + g.rb < g.OH ? oy0 + g.rb : g.OH, band = (oy1 - oy0) * g.OW, ld = nbe * band;
          int64_t ldd;
          const float *dyp = gather_dy(&g, dy, n0, nbe, oy0, oy1, dyc, &ldd);
          if (bf16) {
            ampc__cpu_amx_pack_b(g.O, ld, dyp, ldd, 0, pb);
            ampc__cpu_bf16_gemm_packed(g.K, ld, g.O, pw, pb, dcols, ld, 0);
          } else {
            conv_gemm(g.K, ld, g.O, wf, g.K, 1, dyp, ldd, dcols, ld);
          }
          if (nbe == 1) {
            /* one sample in row bands: accumulate all bands, store after the last */
            if (oy0 == 0) memset(dxs, 0, (size_t)g.CHW * sizeof(float));
            col2im(&g, dcols, ld, 0, oy0, oy1, dxs);
            if (oy1 == g.OH) cpu_store_grad(c, dx, n0 * g.CHW, dxs, (size_t)g.CHW, c->din_acc[0], xs);
          } else {
            for (int64_t s = 0; s < nbe; s++) {
              memset(dxs, 0, (size_t)g.CHW * sizeof(float));
              col2im(&g, dcols, ld, s * band, 0, g.OH, dxs);
              cpu_store_grad(c, dx, (n0 + s) * g.CHW, dxs, (size_t)g.CHW, c->din_acc[0], xs);
            }
          }
        }
      }
    }
  }
  if (cpu_ctx(c)->timers) {
    double t2 = omp_get_wtime();
    cpu_ctx(c)->timers[0] += t2 - t1;
    cpu_ctx(c)->timers[1] += t1 - t0;
  }
  return AMPC_OK;
}
