/* Direct 3x3 stride-1 convolution, for inputs with few channels (a network's
 * first layer: 1 or 3 channels). There an im2col product has only K = 9C
 * rows, far too few for a matrix product to run near its peak, while the
 * direct loop keeps a block of outputs in registers: two output channels by
 * up to 32 columns of one output row, accumulated over the 9C taps of the
 * sample's zero-padded f32 copy. The weight gradient runs the same way with
 * the 9 taps of one (output, input) channel pair in registers over a row of
 * the output gradient (with AVX-512, two output channels' at once, from the
 * same shifted input vectors: the cnn's first convolution's backward
 * 0.68-0.80 -> 0.60 ms a step on a Zen 4, the same bits).
 *
 * Forward and the weight (and bias) gradient; the input gradient, which a
 * first layer does not need, stays with the im2col path. Each thread takes
 * whole samples (forward: as threads come free); the weight gradient's
 * per-thread partials are added in a fixed order, so results are the same for
 * a thread count. Built twice: for
 * AVX2 with FMA and for the baseline, picked at run time. */
#include <omp.h>

#include "backend/cpu/cpu_internal.h"
#include "core/dtype_internal.h"

typedef struct {
  int64_t N, C, H, W, O, p, OH, OW, OHW;
  int64_t nv;        /* vectors of 8 columns per block: 1, 2 or 4 */
  int64_t OWv;       /* OW rounded up to whole blocks */
  int64_t nv16, OWv16; /* the same for the 16-wide (AVX-512) loops: 1 or 2 vectors */
  int64_t Hp, Wp;    /* the padded sample's planes */
  /* per thread, in floats: the padded sample, four output planes (with a
   * block's overrun; backward's second output gradient plane is the first),
   * an output gradient plane (with 32 floats to spare), the weight gradient
   * partial, a plane of the input being staged */
  size_t off_y0, off_y1, off_y2, off_y3, off_dys, off_part, off_xt, per_thread;
  size_t shared; /* the f32 weight and bias */
} dconv_geom;

enum { DCONV_MAX_AUTO_CHANNELS = 4 };

int ampc__cpu_direct_preferred(const ampc__op_call *c) {
  return cpu_conv3x3_s1(c) && c->in[0].shape.d[1] <= DCONV_MAX_AUTO_CHANNELS;
}

static dconv_geom dconv_geometry(const ampc__op_call *c) {
  dconv_geom g;
  const ampc_shape *x = &c->in[0].shape, *w = &c->in[1].shape, *y = &c->out.shape;
  g.N = x->d[0]; g.C = x->d[1]; g.H = x->d[2]; g.W = x->d[3];
  g.O = w->d[0]; g.p = c->attr.pad;
  g.OH = y->d[2]; g.OW = y->d[3]; g.OHW = g.OH * g.OW;
  g.nv = g.OW <= 8 ? 1 : g.OW <= 16 ? 2 : 4;
  g.OWv = (g.OW + 8 * g.nv - 1) / (8 * g.nv) * (8 * g.nv);
  g.nv16 = g.OW <= 16 ? 1 : 2;
  g.OWv16 = (g.OW + 16 * g.nv16 - 1) / (16 * g.nv16) * (16 * g.nv16);
  g.Hp = g.H + 2 * g.p;
  int64_t cols = g.OWv > g.OWv16 ? g.OWv : g.OWv16;
  g.Wp = cols + 2 > g.W + 2 * g.p ? cols + 2 : g.W + 2 * g.p;
  g.Wp = (g.Wp + 15) & ~(int64_t)15; /* rows of whole 16-float vectors (bwd_taps16 reads 16 past a block) */
  g.off_y0 = (size_t)(g.C * g.Hp * g.Wp);
  g.off_y1 = g.off_y0 + (size_t)g.OHW + 32;
  g.off_y2 = g.off_y1 + (size_t)g.OHW + 32;
  g.off_y3 = g.off_y2 + (size_t)g.OHW + 32;
  g.off_dys = g.off_y3 + (size_t)g.OHW + 32;
  g.off_part = g.off_dys + (size_t)g.OHW + 32;
  g.off_xt = g.off_part + (size_t)(g.O * g.C * 9 + g.O);
  /* whole 64-byte lines, so that each thread's padded rows are aligned as the workspace is */
  g.per_thread = (g.off_xt + (size_t)(g.H * g.W) + 16 + 15) & ~(size_t)15;
  g.shared = ((size_t)(g.O * g.C * 9 + g.O) + 16 + 15) & ~(size_t)15;
  return g;
}

size_t ampc__cpu_direct_ws(const ampc__op_call *c, int nthreads) {
  dconv_geom g = dconv_geometry(c);
  return (g.shared + (size_t)(nthreads < 1 ? 1 : nthreads) * g.per_thread) * sizeof(float);
}

/* The f32 copy of sample n of the input (through the call's batch norm
 * prologue), zero-padded by p, planes Hp x Wp; tmp: a plane. */
static void stage_sample(const dconv_geom *g, const ampc__op_call *c, int64_t n, float *xp, float *tmp) {
  memset(xp, 0, (size_t)(g->C * g->Hp * g->Wp) * sizeof(float));
  for (int64_t ch = 0; ch < g->C; ch++) {
    int64_t hw = g->H * g->W;
    const float *src = cpu_load_input(c, (n * g->C + ch) * hw, (size_t)hw, ch, tmp);
    float *dst = xp + (ch * g->Hp + g->p) * g->Wp + g->p;
    for (int64_t iy = 0; iy < g->H; iy++) memcpy(dst + iy * g->Wp, src + iy * g->W, (size_t)g->W * sizeof(float));
  }
}

/* Keeps a vector in a register (the AVX2 and AVX-512 builds: reg = 1):
 * without it GCC folds the load of an input vector into every channel's FMA,
 * loading it again each time, and the loop is then bound by loads rather than
 * FMAs. "v": any vector register the build can encode (16 without AVX-512,
 * 32 with it). No effect on the arithmetic. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define DCONV_IN_REGISTER(v) __asm__("" : "+v"(v))
#else
#define DCONV_IN_REGISTER(v) ((void)0)
#endif

/* Output rows of channels o and o+1 (o1 = 0: o alone) of one sample into y0
 * and y1 (rows OW apart; a row's last block may overrun into the next row,
 * which is written after it, and past the plane by < 32). */
static inline __attribute__((always_inline)) void fwd_pair(const dconv_geom *g, const float *xp, const float *w0,
                                                           const float *w1, float b0, float b1, float *y0, float *y1,
                                                           const int nv, const int reg) {
  for (int64_t oy = 0; oy < g->OH; oy++)
    for (int64_t cb = 0; cb < g->OWv; cb += 8 * nv) {
      cpu_v8 a0[4], a1[4];
      for (int v = 0; v < nv; v++) {
        a0[v] = (cpu_v8){0} + b0;
        a1[v] = (cpu_v8){0} + b1;
      }
      for (int64_t ch = 0; ch < g->C; ch++)
        for (int ky = 0; ky < 3; ky++) {
          const float *row = xp + (ch * g->Hp + oy + ky) * g->Wp + cb;
          const float *k0 = w0 + (ch * 3 + ky) * 3, *k1 = w1 + (ch * 3 + ky) * 3;
          for (int kx = 0; kx < 3; kx++) {
            float s0 = k0[kx], s1 = k1[kx];
            for (int v = 0; v < nv; v++) {
              cpu_v8 xv = CPU_LD8(row + 8 * v + kx);
              if (reg) DCONV_IN_REGISTER(xv);
              a0[v] += s0 * xv;
              a1[v] += s1 * xv;
            }
          }
        }
      for (int v = 0; v < nv; v++) {
        CPU_ST8(y0 + oy * g->OW + cb + 8 * v, a0[v]);
        CPU_ST8(y1 + oy * g->OW + cb + 8 * v, a1[v]);
      }
    }
}

/* The 9 taps' gradient of output channel o over input channel ch, from one
 * sample's padded input and the output gradient plane dyp (rows OW apart,
 * readable 32 floats past its end; columns past OW are masked off), added to
 * dw[0..8]: in 8-lane partial sums over blocks of OWv columns (bwd_taps16
 * below: the 16-wide loop). */
static inline __attribute__((always_inline)) void bwd_taps(const dconv_geom *g, const float *xp, const float *dyp, int64_t ch,
                                                           float *dw, const int nv) {
  cpu_v8 acc[9];
  cpu_v8i lane;
  for (int l = 0; l < 8; l++) lane[l] = l;
  for (int t = 0; t < 9; t++) acc[t] = (cpu_v8){0};
  for (int64_t oy = 0; oy < g->OH; oy++)
    for (int64_t cb = 0; cb < g->OWv; cb += 8 * nv)
      for (int v = 0; v < nv; v++) {
        cpu_v8i live = lane < (int)(g->OW - cb - 8 * v);
        cpu_v8 d = (cpu_v8)((cpu_v8i) * (const cpu_v8 *)(dyp + oy * g->OW + cb + 8 * v) & live);
        for (int ky = 0; ky < 3; ky++) {
          const float *row = xp + (ch * g->Hp + oy + ky) * g->Wp + cb + 8 * v;
          for (int kx = 0; kx < 3; kx++) acc[ky * 3 + kx] += d * *(const cpu_v8 *)(row + kx);
        }
      }
  for (int t = 0; t < 9; t++) dw[t] += cpu_hsum8(acc[t]);
}

/* ---- the 16-wide loops (AVX-512's 32 registers of 16 floats) ----
 *
 * Forward: four output channels by up to 32 columns (8 accumulators), each
 * output the same in-order sum of the same FMAs as the 8-wide loop's, so the
 * same bits. The weight gradient: 16-lane partial sums, so its last bits
 * differ from the 8-wide loop's. Built with target("arch=x86-64-v4") for
 * CPUs with AVX-512 and, for the tests, like the other kernels (the
 * compiler splits the vectors where the CPU has no AVX-512). */
typedef float dconv_v16 __attribute__((vector_size(64), aligned(4), may_alias));
typedef int dconv_v16i __attribute__((vector_size(64), aligned(4), may_alias));
#define DCONV_LD16(p) (*(const dconv_v16 *)(p))

/* GCC's portable (split-vector) build of the splats below warns that they
 * may be used uninitialised: they are all set before use. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
/* 16-bit output rows (f16, or bf16: bf) straight from the accumulators,
 * rounded as cpu_store rounds them (the AVX-512 build's fwd_quad16; a call,
 * never made, from the portable one) */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(AMPC_NO_CLONES)
#include <immintrin.h>
__attribute__((target("avx512f,f16c"))) static inline void dconv_st16h(uint16_t *p, const dconv_v16 *a, int bf) {
  if (bf) {
    __m512i u = _mm512_castps_si512((__m512)*a);
    _mm256_storeu_si256((__m256i *)p, AMPC__BF16_CODES512(u));
  } else {
    _mm256_storeu_si256((__m256i *)p, _mm512_cvtps_ph((__m512)*a, _MM_FROUND_TO_NEAREST_INT));
  }
}
#else
static inline void dconv_st16h(uint16_t *p, const dconv_v16 *a, int bf) { (void)p, (void)a, (void)bf; }
#endif

/* Output rows of channels o .. o + 3 (w[c], b[c], planes y[c]; a group of
 * fewer channels repeats its last one into planes nobody stores). With h
 * (16-bit output, bf16 where bf; OW >= 16) every row but the last goes straight into
 * the output planes h[c], as cpu_store would round it (a row's overrun, less
 * than a row, lands in the next row, written after it); the last row into
 * y[c], for the caller to store. */
static inline __attribute__((always_inline)) void fwd_quad16(const dconv_geom *g, const float *xp, const float *const w[4],
                                                             const float b[4], float *const y[4], uint16_t *const *h,
                                                             const int bf, const int nv, const int reg) {
  for (int64_t oy = 0; oy < g->OH; oy++)
    for (int64_t cb = 0; cb < g->OWv16; cb += 16 * nv) {
      dconv_v16 a[4][2];
      for (int c = 0; c < 4; c++)
        for (int v = 0; v < nv; v++) a[c][v] = (dconv_v16){0} + b[c];
      for (int64_t ch = 0; ch < g->C; ch++)
        for (int ky = 0; ky < 3; ky++) {
          const float *row = xp + (ch * g->Hp + oy + ky) * g->Wp + cb;
          for (int kx = 0; kx < 3; kx++) {
            dconv_v16 s[4];
            for (int c = 0; c < 4; c++) {
              s[c] = (dconv_v16){0} + w[c][(ch * 3 + ky) * 3 + kx]; /* (a -0 weight becomes +0: the same sums) */
              if (reg && nv > 1) DCONV_IN_REGISTER(s[c]); /* one broadcast for both vectors */
            }
            for (int v = 0; v < nv; v++) {
              dconv_v16 xv = DCONV_LD16(row + 16 * v + kx);
              if (reg) DCONV_IN_REGISTER(xv);
              for (int c = 0; c < 4; c++) a[c][v] += s[c] * xv;
            }
          }
        }
      if (h && oy + 1 < g->OH)
        for (int c = 0; c < 4; c++)
          for (int v = 0; v < nv; v++) dconv_st16h(h[c] + oy * g->OW + cb + 16 * v, &a[c][v], bf);
      else
        for (int c = 0; c < 4; c++)
          for (int v = 0; v < nv; v++) *(dconv_v16 *)(y[c] + oy * g->OW + cb + 16 * v) = a[c][v];
    }
}

/* the 16 lanes folded to 8, then as the 8-wide sums */
#define dconv_hsum16(a)                                                                                                \
  cpu_hsum8(((cpu_v8){(a)[0], (a)[1], (a)[2], (a)[3], (a)[4], (a)[5], (a)[6], (a)[7]} +                                \
             (cpu_v8){(a)[8], (a)[9], (a)[10], (a)[11], (a)[12], (a)[13], (a)[14], (a)[15]}))
/* bwd_taps 16 wide, for K (1 or 2) output channels at once (dyp[k] into
 * dw[k]): each input row's three shifted vectors from two loads (aligned
 * where the padded rows are: Wp a multiple of 16) and two shuffles instead
 * of three unaligned loads, every one crossing a cache line (the load ports,
 * not the FMAs, bound the loop then: the cnn's first convolution's backward
 * went from 0.76 to 0.66-0.69 ms a step on a Zen 4, min of 300 steps, three
 * alternating runs), and made once for both channels where K is 2 (18
 * accumulators of AVX-512's 32 registers: 0.68-0.80 -> 0.60 ms); each
 * channel's products and sums the same, in the same order, so the same
 * bits */
static inline __attribute__((always_inline)) void bwd_taps16(const dconv_geom *g, const float *xp, const float *const dyp[2],
                                                             int64_t ch, float *const dw[2], const int nv, const int K) {
  dconv_v16 acc[2][9];
  dconv_v16i lane;
  for (int l = 0; l < 16; l++) lane[l] = l;
  for (int k = 0; k < K; k++)
    for (int t = 0; t < 9; t++) acc[k][t] = (dconv_v16){0};
  for (int64_t oy = 0; oy < g->OH; oy++)
    for (int64_t cb = 0; cb < g->OWv16; cb += 16 * nv)
      for (int v = 0; v < nv; v++) {
        dconv_v16i live = lane < (int)(g->OW - cb - 16 * v);
        dconv_v16 d[2];
        for (int k = 0; k < K; k++) d[k] = (dconv_v16)((dconv_v16i)DCONV_LD16(dyp[k] + oy * g->OW + cb + 16 * v) & live);
        for (int ky = 0; ky < 3; ky++) {
          const float *row = xp + (ch * g->Hp + oy + ky) * g->Wp + cb + 16 * v;
          dconv_v16 x0 = DCONV_LD16(row), x1 = DCONV_LD16(row + 16);
          dconv_v16 s1 = __builtin_shufflevector(x0, x1, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16);
          dconv_v16 s2 = __builtin_shufflevector(x0, x1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17);
          for (int k = 0; k < K; k++) {
            acc[k][ky * 3] += d[k] * x0;
            acc[k][ky * 3 + 1] += d[k] * s1;
            acc[k][ky * 3 + 2] += d[k] * s2;
          }
        }
      }
  for (int k = 0; k < K; k++)
    for (int t = 0; t < 9; t++) dw[k][ch * 9 + t] += dconv_hsum16(acc[k][t]);
}

#define DCONV16_BODY(ATTR, REG, fwd_sample16, bwd_plane16)                                                              \
  ATTR static void fwd_sample16(const dconv_geom *g, const float *xp, const float *wf, const float *bias, float *const yb[4], \
                                const ampc_tensor *y, int64_t n) {                                                       \
    for (int64_t o = 0; o < g->O; o += 4) {                                                                              \
      int64_t rem = g->O - o < 4 ? g->O - o : 4;                                                                         \
      const float *w[4];                                                                                                 \
      float b[4];                                                                                                        \
      for (int c = 0; c < 4; c++) {                                                                                      \
        int64_t oc = o + (c < rem ? c : rem - 1);                                                                        \
        w[c] = wf + oc * g->C * 9;                                                                                       \
        b[c] = bias ? bias[oc] : 0.0f;                                                                                   \
      }                                                                                                                  \
      /* 16-bit rows straight into the output (the AVX-512 build) */                                                \
      int direct = REG && (y->dtype == AMPC_DTYPE_F16 || y->dtype == AMPC_DTYPE_BF16) && g->OW >= 16;                   \
      int bf = y->dtype == AMPC_DTYPE_BF16;                                                                              \
      uint16_t *h[4];                                                                                                    \
      for (int c = 0; c < 4; c++) h[c] = cpu_at(y, (n * g->O + o + (c < rem ? c : rem - 1)) * g->OHW);                 \
      if (g->nv16 == 2) fwd_quad16(g, xp, w, b, yb, direct ? h : NULL, bf, 2, REG);                                      \
      else fwd_quad16(g, xp, w, b, yb, direct ? h : NULL, bf, 1, REG);                                                   \
      int64_t from = direct ? (g->OH - 1) * g->OW : 0;                                                                   \
      for (int64_t c = 0; c < rem; c++)                                                                                  \
        cpu_store(y, (n * g->O + o + c) * g->OHW + from, yb[c] + from, (size_t)(g->OHW - from), 0, NULL);                \
    }                                                                                                                    \
  }                                                                                                                      \
  ATTR static void bwd_plane16(const dconv_geom *g, const float *xp, const float *dyp, float *dw) {                      \
    const float *const d[2] = {dyp, dyp};                                                                                \
    float *const w[2] = {dw, dw};                                                                                        \
    for (int64_t ch = 0; ch < g->C; ch++) {                                                                              \
      if (g->nv16 == 2) bwd_taps16(g, xp, d, ch, w, 2, 1);                                                               \
      else bwd_taps16(g, xp, d, ch, w, 1, 1);                                                                            \
    }                                                                                                                    \
  }                                                                                                                      \
  ATTR static void bwd_plane16##_2(const dconv_geom *g, const float *xp, const float *dyp0, const float *dyp1,            \
                                   float *dw0, float *dw1) {                                                             \
    const float *const d[2] = {dyp0, dyp1};                                                                              \
    float *const w[2] = {dw0, dw1};                                                                                      \
    for (int64_t ch = 0; ch < g->C; ch++) {                                                                              \
      if (g->nv16 == 2) bwd_taps16(g, xp, d, ch, w, 2, 2);                                                               \
      else bwd_taps16(g, xp, d, ch, w, 1, 2);                                                                            \
    }                                                                                                                    \
  }

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(AMPC_NO_CLONES)
#define DCONV_AVX512 1
DCONV16_BODY(__attribute__((target("arch=x86-64-v4"))), 1, fwd_sample16_avx512, bwd_plane16_avx512)
#else
#define DCONV_AVX512 0
#endif
DCONV16_BODY(CPU_VECTOR, 0, fwd_sample16_any, bwd_plane16_any)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

/* When set, the direct loop runs its 16-wide code whatever the CPU (the
 * portable build where the CPU has no AVX-512): a hook for tests. */
int ampc__cpu_direct_wide = 0;

/* Everything above in one function per instruction set, so that the vector
 * loops are compiled (and contracted to FMA) for it. */
#define DCONV_BODY(ATTR, REG, fwd_sample, bwd_plane)                                                                  \
  ATTR static void fwd_sample(const dconv_geom *g, const float *xp, const float *wf, const float *bias,                  \
                              float *const yb[4], const ampc_tensor *y, int64_t n) {                                     \
    float *y0 = yb[0], *y1 = yb[1];                                                                                      \
    for (int64_t o = 0; o < g->O; o += 2) {                                                                              \
      int two = o + 1 < g->O;                                                                                            \
      const float *w0 = wf + o * g->C * 9, *w1 = two ? w0 + g->C * 9 : w0;                                               \
      float b0 = bias ? bias[o] : 0.0f, b1 = bias && two ? bias[o + 1] : 0.0f;                                           \
      if (g->nv == 4) fwd_pair(g, xp, w0, w1, b0, b1, y0, y1, 4, REG);                                                   \
      else if (g->nv == 2) fwd_pair(g, xp, w0, w1, b0, b1, y0, y1, 2, REG);                                              \
      else fwd_pair(g, xp, w0, w1, b0, b1, y0, y1, 1, REG);                                                              \
      cpu_store(y, (n * g->O + o) * g->OHW, y0, (size_t)g->OHW, 0, NULL);                                                \
      if (two) cpu_store(y, (n * g->O + o + 1) * g->OHW, y1, (size_t)g->OHW, 0, NULL);                                   \
    }                                                                                                                    \
  }                                                                                                                      \
  ATTR static void bwd_plane(const dconv_geom *g, const float *xp, const float *dyp, float *dw) {                        \
    for (int64_t ch = 0; ch < g->C; ch++) {                                                                              \
      if (g->nv == 4) bwd_taps(g, xp, dyp, ch, dw + ch * 9, 4);                                                          \
      else if (g->nv == 2) bwd_taps(g, xp, dyp, ch, dw + ch * 9, 2);                                                     \
      else bwd_taps(g, xp, dyp, ch, dw + ch * 9, 1);                                                                     \
    }                                                                                                                    \
  }

#if defined(__x86_64__) && defined(__GNUC__) && !defined(AMPC_NO_CLONES)
#define DCONV_X86 1
DCONV_BODY(__attribute__((target("avx2,fma"))), 1, fwd_sample_avx2, bwd_plane_avx2)
#else
#define DCONV_X86 0
#endif
DCONV_BODY(, 0, fwd_sample, bwd_plane)

/* One sample's output planes (yb: the thread's four planes) and one output
 * channel's weight gradient, in one build of the loops. */
typedef struct {
  void (*fwd)(const dconv_geom *g, const float *xp, const float *wf, const float *bias, float *const yb[4],
              const ampc_tensor *y, int64_t n);
  void (*bwd)(const dconv_geom *g, const float *xp, const float *dyp, float *dw);
  /* two output channels' weight gradient at once (the 16-wide loops), or NULL */
  void (*bwd2)(const dconv_geom *g, const float *xp, const float *dyp0, const float *dyp1, float *dw0, float *dw1);
} dconv_kernels;

/* The build, chosen once per call: the 16-wide loops' portable build where
 * the test hook asks for it (any CPU), their AVX-512 build where the
 * device's level is avx512, else the 8-wide loops of the AVX2 level or the
 * baseline (the device's level is chosen once, with the rest). */
static dconv_kernels dconv_pick(const ampc__op_call *c) {
  const ampc__cpu_isa *isa = cpu_ctx(c)->isa;
  if (ampc__cpu_direct_wide) return (dconv_kernels){fwd_sample16_any, bwd_plane16_any, bwd_plane16_any_2};
#if DCONV_AVX512
  if (isa->avx512) return (dconv_kernels){fwd_sample16_avx512, bwd_plane16_avx512, bwd_plane16_avx512_2};
#endif
#if DCONV_X86
  if (isa->avx2) return (dconv_kernels){fwd_sample_avx2, bwd_plane_avx2, NULL};
#endif
  (void)isa;
  return (dconv_kernels){fwd_sample, bwd_plane, NULL};
}

ampc_status ampc__cpu_direct_fwd(const ampc__op_call *c) {
  dconv_geom g = dconv_geometry(c);
  const ampc_tensor *y = &c->out;
  const ampc_tensor *b = c->n_in > 2 && c->in[2].data ? &c->in[2] : NULL;
  int nt = cpu_ctx(c)->nthreads < 1 ? 1 : cpu_ctx(c)->nthreads;
  if (ampc__cpu_direct_ws(c, nt) > c->ws_size) return ampc__error(AMPC_ESTATE, "conv2d: direct workspace too small");
  dconv_kernels k = dconv_pick(c);
  float *shared = (float *)c->ws;
  const float *wf = cpu_load(&c->in[1], 0, (size_t)(g.O * g.C * 9), shared);
  const float *bias = b ? cpu_load(b, 0, (size_t)g.O, shared + g.O * g.C * 9) : NULL;
#pragma omp parallel num_threads(nt)
  {
    float *xp = cpu_ws_slice(c, omp_get_thread_num(), g.per_thread, g.shared);
    float *const yb[4] = {xp + g.off_y0, xp + g.off_y1, xp + g.off_y2, xp + g.off_y3};
#pragma omp for schedule(dynamic, 1) nowait
    for (int64_t n = 0; n < g.N; n++) {
      stage_sample(&g, c, n, xp, xp + g.off_xt);
      k.fwd(&g, xp, wf, bias, yb, y, n);
    }
  }
  return AMPC_OK;
}

/* The weight and bias gradients (stored or accumulated as the call says). */
ampc_status ampc__cpu_direct_bwd_weights(const ampc__op_call *c) {
  dconv_geom g = dconv_geometry(c);
  const ampc_tensor *dy = &c->dout, *dw = &c->din[1];
  const ampc_tensor *db = c->n_in > 2 && c->din[2].data ? &c->din[2] : NULL;
  int nt = cpu_ctx(c)->nthreads < 1 ? 1 : cpu_ctx(c)->nthreads, nth_used = 1;
  size_t nw = (size_t)(g.O * g.C * 9);
  if (ampc__cpu_direct_ws(c, nt) > c->ws_size) return ampc__error(AMPC_ESTATE, "conv2d: direct workspace too small");
  dconv_kernels k = dconv_pick(c);
#pragma omp parallel num_threads(nt)
  {
    int tid = omp_get_thread_num(), nth = omp_get_num_threads();
#pragma omp single
    nth_used = nth;
    float *xp = cpu_ws_slice(c, tid, g.per_thread, g.shared), *dys[2] = {xp + g.off_dys, xp + g.off_y0};
    float *part = xp + g.off_part;
    memset(part, 0, (nw + (size_t)g.O) * sizeof(float));
    for (int i = 0; i < 2; i++) memset(dys[i], 0, ((size_t)g.OHW + 32) * sizeof(float));
    for (int64_t n = tid; n < g.N; n += nth) {
      if (dw->data) stage_sample(&g, c, n, xp, xp + g.off_xt);
      for (int64_t o = 0; o < g.O; o += k.bwd2 ? 2 : 1) {
        int64_t two = k.bwd2 && o + 1 < g.O ? 2 : 1;
        for (int64_t i = 0; i < two; i++) {
          /* staged even from f32: the taps read a little past the plane */
          ampc_load_f32(dys[i], dy->dtype, cpu_at(dy, (n * g.O + o + i) * g.OHW), (size_t)g.OHW);
          if (db) part[nw + o + i] += cpu_sum(dys[i], (size_t)g.OHW);
        }
        if (!dw->data) continue;
        if (two == 2) k.bwd2(&g, xp, dys[0], dys[1], part + o * g.C * 9, part + (o + 1) * g.C * 9);
        else k.bwd(&g, xp, dys[0], part + o * g.C * 9);
      }
    }
  }
  /* fixed-order reduction of the per-thread partials */
  float *sum = cpu_ws_slice(c, 0, g.per_thread, g.shared) + g.off_part;
  for (int t = 1; t < nth_used; t++) {
    const float *p = cpu_ws_slice(c, t, g.per_thread, g.shared) + g.off_part;
    for (size_t i = 0; i < nw + (size_t)g.O; i++) sum[i] += p[i];
  }
  float *tmp = (float *)c->ws;
  if (dw->data) cpu_store_grad(c, dw, 0, sum, nw, c->din_acc[1], tmp);
  if (db) cpu_store_grad(c, db, 0, sum + nw, (size_t)g.O, c->din_acc[2], tmp);
  return AMPC_OK;
}
