/* Batch normalisation over (N, H, W) for each channel, PyTorch semantics:
 * training normalises with the biased batch variance and updates the running
 * statistics with the unbiased one; eval uses the running statistics.
 * Parallel over channels; every sum is a two-pass f32 accumulation.
 *
 * SyncBatchNorm (the call's sync set, data-parallel training): the
 * statistics cover every rank's batch. Forward and backward then run as two
 * parallel passes with the cross-rank sum between them: the per-channel sums
 * of this rank's values (forward: of x - k and (x - k)^2 around a shift k all
 * ranks share, the running mean; backward: of dy and dy * (x - mean)) and its
 * value count go into the workspace as doubles, sync adds them over the
 * ranks, and the second pass normalises (or forms dx) with the global ones.
 * The weight and bias gradients stay this rank's own: the gradient all-reduce
 * averages them like every other parameter's. */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"
#include "core/dtype_internal.h"

typedef struct {
  int64_t N, C, H, W, HW;
  int64_t PHW; /* with a fused 2x2 max pool: elements of a pooled plane */
} bn_geom;

static bn_geom bn_geometry(const ampc__op_call *c) {
  const ampc_shape *s = &c->in[0].shape;
  bn_geom g = {s->d[0], s->d[1], s->d[2], s->d[3], s->d[2] * s->d[3], (s->d[2] / 2) * (s->d[3] / 2)};
  return g;
}

/* Whether forward keeps each channel's scale and shift for the convolutions
 * after it (and for backward's recomputed output): nostore or recompute. */
static int bn_keeps_scale_shift(const ampc__op_call *c) { return c->attr.nostore || c->attr.recompute; }

/* With a fused max pool, each window's winner (0..3), one byte per pooled
 * value, is kept after the statistics in the op's saved state. */
size_t ampc__cpu_bn_aux_floats(const ampc__op_call *c) {
  size_t n = 2 * (size_t)c->in[0].shape.d[1] + 1; /* mean, inverse std, mode */
  if (c->attr.pool) n += ((size_t)ampc_shape_numel(&c->out.shape) + 3) / 4;
  if (bn_keeps_scale_shift(c)) n += 2 * (size_t)c->in[0].shape.d[1]; /* scale, shift: the convolutions' prologue */
  return n;
}
/* With nostore or recompute (no pool then): each channel's scale, then each
 * one's shift. */
static float *bn_scale_shift(const ampc__op_call *c, const bn_geom *g) { return c->aux + 2 * g->C + 1; }
static unsigned char *bn_winners(const ampc__op_call *c, const bn_geom *g) {
  return (unsigned char *)(c->aux + 2 * g->C + 1);
}

/* A channel's x and dy (all samples) are kept in f32 between the two passes
 * of forward and backward when they fit, so that 16-bit values are converted
 * once and the ReLU-masked gradient is not written back. */
enum { BN_CACHE_FLOATS = 1 << 18, BN_CACHE_BOTH_FLOATS = 1 << 16 };

static int bn_cache(const ampc__op_call *c, const bn_geom *g) {
  return g->N * g->HW <= BN_CACHE_FLOATS &&
         (c->in[0].dtype != AMPC_DTYPE_F32 || c->dout.dtype != AMPC_DTYPE_F32 || c->attr.relu || c->attr.pool);
}

/* per thread: staged x plane, dy plane, output planes, then the channel cache */
static size_t bn_per_thread(const ampc__op_call *c, const bn_geom *g) {
  return 4 * (size_t)g->HW + (bn_cache(c, g) ? 2 * (size_t)(g->N * g->HW) : 0);
}

/* shared floats: 64, then dgamma, dbeta and a conversion buffer (4C) */
static size_t bn_shared(const bn_geom *g) { return 64 + 4 * (size_t)g->C; }

/* After the per-thread slices: SyncBatchNorm's 2C + 1 sums as doubles. */
static double *bn_sync_sums(const ampc__op_call *c, const bn_geom *g, size_t per) {
  size_t at = bn_shared(g) + (size_t)cpu_ctx(c)->nthreads * per;
  return (double *)((float *)c->ws + (at + 1) / 2 * 2);
}

/* Small planes go a sample at a time (bn_fwd_by_sample, bn_bwd_by_sample):
 * a plane of a few hundred values is too little work for the per-plane
 * calls of the channel loop (ResNet-18's deep layers have 16), while a
 * sample's C planes are contiguous, converted and stored in one call each.
 * The sums are the same per-plane sums, added over the samples in the same
 * order, so both ways give the same bits. */
enum { BN_SAMPLE_HW = 64, BN_SAMPLE_FLOATS = 1 << 15 };

int ampc__cpu_bn_by_channel = 0; /* a hook for tests: always the channel loop */
static int bn_sample_fits(const bn_geom *g) { return g->HW <= BN_SAMPLE_HW && g->C * g->HW <= BN_SAMPLE_FLOATS; }
static int bn_by_sample(const ampc__op_call *c, const bn_geom *g) {
  return !c->sync && bn_sample_fits(g) && !ampc__cpu_bn_by_channel;
}

/* per thread: x, dy, output and y staging of a sample, then 3 pooled
 * planes' worth (dy, y, masked dy); shared: bn_shared, then each plane's two
 * sums (N x C pairs) */
static size_t bn_sample_per_thread(const bn_geom *g) { return 4 * (size_t)(g->C * g->HW) + 3 * (size_t)(g->C * g->PHW) + 16; }
static size_t bn_sample_shared(const bn_geom *g) { return bn_shared(g) + 2 * (size_t)(g->N * g->C); }

size_t ampc__cpu_bn_ws(const ampc__op_call *c, int nthreads) {
  bn_geom g = bn_geometry(c);
  size_t by_channel = (size_t)nthreads * bn_per_thread(c, &g) + bn_shared(&g) + 2 + 2 * (2 * (size_t)g.C + 1);
  size_t by_sample = bn_sample_fits(&g) ? (size_t)nthreads * bn_sample_per_thread(&g) + bn_sample_shared(&g) : 0;
  return (by_channel > by_sample ? by_channel : by_sample) * sizeof(float);
}

/* The per-plane loops, built for AVX2 and the baseline. */
CPU_VECTOR static void plane_sums(const float *x, float k, size_t n, float *s1, float *s2) { cpu_sum_dev_sq(x, k, n, s1, s2); }
CPU_VECTOR static void plane_dsums(const float *dy, const float *x, float mean, size_t n, float *s1, float *s2) {
  cpu_sum_dy_dyx(dy, x, mean, n, s1, s2);
}
CPU_VECTOR static void plane_apply(const float *x, size_t n, float scale, float shift, int relu, float *y) {
  if (relu)
    for (size_t i = 0; i < n; i++) {
      float v = x[i] * scale + shift;
      y[i] = v <= 0.0f ? 0.0f : v; /* NaN stays */
    }
  else
    for (size_t i = 0; i < n; i++) y[i] = x[i] * scale + shift;
}
CPU_VECTOR static void plane_dx(const float *x, const float *dy, size_t n, float mean, float invstd, float k, float count,
                                float dbeta, float dgamma, float *o) {
  for (size_t i = 0; i < n; i++) {
    float xhat = (x[i] - mean) * invstd;
    o[i] = k * (count * dy[i] - dbeta - xhat * dgamma);
  }
}

/* plane_apply, then each value rounded to f16 (what a fused pool reads: the
 * unfused graph pools the stored f16 output), in one pass: for the AVX2
 * (FMA, F16C) and AVX-512 levels, whose builds of plane_apply contract
 * x * scale + shift into an FMA as these do, so the values are the same. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define BN_X86 1
/* 8 f32 rounded to the 16-bit type and widened back: f16 by F16C, bf16 by
 * the library's rule (ampc_f32_to_bf16: ties to even, a NaN quieted), on
 * the bit patterns */
__attribute__((target("avx2,fma,f16c"))) static inline __m256 h8_round(__m256 v, int bf) {
  if (!bf) return _mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  __m256i u = _mm256_castps_si256(v);
  return _mm256_castsi256_ps(AMPC__BF16_WIDE256(u));
}
/* ... and narrowed to the 8 16-bit codes */
__attribute__((target("avx2,fma,f16c"))) static inline __m128i h8_pack(__m256 v, int bf) {
  if (!bf) return _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
  __m256i r = _mm256_srli_epi32(AMPC__BF16_RNE256(_mm256_castps_si256(v)), 16); /* each rounded value's top half */
  return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}
__attribute__((target("f16c"))) static inline float h1_round(float v, int bf) {
  return bf ? ampc_bf16_to_f32(ampc_f32_to_bf16(v)) : _cvtsh_ss(_cvtss_sh(v, _MM_FROUND_TO_NEAREST_INT));
}
__attribute__((target("avx2,fma,f16c"))) static void apply_h16_avx2(const float *x, size_t n, float scale, float shift, int relu,
                                                                      int bf, float *y) {
  const __m256 s = _mm256_set1_ps(scale), b = _mm256_set1_ps(shift), z = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), s, b);
    if (relu) v = _mm256_blendv_ps(v, z, _mm256_cmp_ps(v, z, _CMP_LE_OQ)); /* NaN stays */
    _mm256_storeu_ps(y + i, h8_round(v, bf));
  }
  for (; i < n; i++) {
    float v = fmaf(x[i], scale, shift);
    if (relu && v <= 0.0f) v = 0.0f;
    y[i] = h1_round(v, bf);
  }
}
/* ... on 16 lanes, and narrowed to the 16-bit codes */
__attribute__((target("avx512f,avx2,fma,f16c"))) static inline __m512 h16_round(__m512 v, int bf) {
  if (!bf) return _mm512_cvtph_ps(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  __m512i u = _mm512_castps_si512(v);
  return _mm512_castsi512_ps(AMPC__BF16_WIDE512(u));
}
__attribute__((target("avx512f,avx2,fma,f16c"))) static inline __m256i h16_pack(__m512 v, int bf) {
  if (!bf) return _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
  __m512i u = _mm512_castps_si512(v);
  return AMPC__BF16_CODES512(u);
}
__attribute__((target("avx512f,avx2,fma,f16c"))) static void apply_h16_avx512(const float *x, size_t n, float scale, float shift,
                                                                                int relu, int bf, float *y) {
  const __m512 s = _mm512_set1_ps(scale), b = _mm512_set1_ps(shift), z = _mm512_setzero_ps();
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 v = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), s, b);
    if (relu) v = _mm512_mask_mov_ps(v, _mm512_cmp_ps_mask(v, z, _CMP_LE_OQ), z);
    _mm512_storeu_ps(y + i, h16_round(v, bf));
  }
  if (i < n) apply_h16_avx2(x + i, n - i, scale, shift, relu, bf, y + i);
}

/* Batch norm backward's per-plane passes over 16-bit storage, one pass
 * each (AVX-512 here, AVX2 below), where the per-plane loops above convert
 * a plane to f32, then mask and scatter or sum it, then convert the result
 * back, each a call: the fused pool's gradient from the 16-bit pooled planes,
 * the two sums with x converted as they read it, and dx stored straight into
 * its 16-bit type (f16 by F16C, bf16 rounded as ampc_f32_to_bf16 rounds).
 * Each gives the loops' bits: the sums add the same elements in the
 * same lanes and order as cpu_sum_dy_dyx (whose AVX2 and AVX-512 builds
 * contract the products into FMAs, as these do), dx is plane_dx's
 * arithmetic with its FMAs, and the scatter is exact. test_fusion's
 * batchnorm_bwd_passes_same_bits runs them against the loops at each level.
 * (The forward's passes done the same way were no faster on a Zen 4: its
 * f16 conversions and masked 16-bit stores cost what the fusion saves;
 * measured, left out.) */
#define BN512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

BN512 static inline __m512 h16_ld(const uint16_t *p, int bf) {
  __m256i h = _mm256_loadu_si256((const __m256i *)p);
  return bf ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)) : _mm512_cvtph_ps(h);
}
BN512 static inline __m512 h16_ldm(const uint16_t *p, __mmask16 m, int bf) {
  __m256i h = _mm256_maskz_loadu_epi16(m, p);
  return bf ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)) : _mm512_cvtph_ps(h);
}
/* AVX2 and F16C alone, as h1_ld below: for both levels' passes */
__attribute__((target("avx2,f16c"))) static inline __m256 h8_ld(const uint16_t *p, int bf) {
  __m128i h = _mm_loadu_si128((const __m128i *)p);
  return bf ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)) : _mm256_cvtph_ps(h);
}
/* F16C alone: inlined into the AVX2 passes as well (an AVX-512 build of it,
 * called from them, could use AVX-512 encodings on a CPU without them) */
__attribute__((target("f16c"))) static inline float h1_ld(uint16_t v, int bf) {
  if (!bf) return _cvtsh_ss(v);
  uint32_t u = (uint32_t)v << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* cpu_sum_dy_dyx's ending: its four 8-lane partial sums are (lo, hi of a)
 * and (lo, hi of b), the tails already in lo (lane 0 for single elements) */
static float bn_sum32_end(const float lo[8], const float a1[8], const float a2[8], const float a3[8]) {
  float v[8];
  for (int j = 0; j < 8; j++) v[j] = (lo[j] + a1[j]) + (a2[j] + a3[j]);
  return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
}
BN512 static void bn_sums_end(__m512 A, __m512 B, __m256 lo, float tail, int has_tail, float *out) {
  float a[16], b[16], l[8];
  _mm512_storeu_ps(a, A);
  _mm512_storeu_ps(b, B);
  _mm256_storeu_ps(l, lo);
  if (has_tail) l[0] = tail;
  *out = bn_sum32_end(l, a + 8, b, b + 8);
}

/* plane_dsums with x a 16-bit plane (its f32 values also stored in cache
 * unless NULL) */
BN512 static void dsums_h16_avx512(const float *dy, const uint16_t *x, int bf, float mean, size_t n, float *cache, float *s1,
                                   float *s2) {
  const __m512 mm = _mm512_set1_ps(mean);
  __m512 A = _mm512_setzero_ps(), B = A, QA = A, QB = A;
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m512 u = h16_ld(x + i, bf), v = h16_ld(x + i + 16, bf);
    if (cache) {
      _mm512_storeu_ps(cache + i, u);
      _mm512_storeu_ps(cache + i + 16, v);
    }
    __m512 d = _mm512_loadu_ps(dy + i), e = _mm512_loadu_ps(dy + i + 16);
    A = _mm512_add_ps(A, d);
    B = _mm512_add_ps(B, e);
    QA = _mm512_fmadd_ps(d, _mm512_sub_ps(u, mm), QA);
    QB = _mm512_fmadd_ps(e, _mm512_sub_ps(v, mm), QB);
  }
  __m256 a0 = _mm512_castps512_ps256(A), q0 = _mm512_castps512_ps256(QA);
  const __m256 m8 = _mm256_set1_ps(mean);
  for (; i + 8 <= n; i += 8) {
    __m256 u = h8_ld(x + i, bf), d = _mm256_loadu_ps(dy + i);
    if (cache) _mm256_storeu_ps(cache + i, u);
    a0 = _mm256_add_ps(a0, d);
    q0 = _mm256_fmadd_ps(d, _mm256_sub_ps(u, m8), q0);
  }
  float ta = _mm256_cvtss_f32(a0), tq = _mm256_cvtss_f32(q0);
  int tail = i < n;
  for (; i < n; i++) {
    float u = h1_ld(x[i], bf);
    if (cache) cache[i] = u;
    ta += dy[i];
    tq = fmaf(dy[i], u - mean, tq);
  }
  bn_sums_end(A, B, a0, ta, tail, s1);
  bn_sums_end(QA, QB, q0, tq, tail, s2);
}

/* plane_dx into an f16 plane o, x from its f32 copy xc or (xc NULL) the
 * 16-bit plane x: k * (count * dy - dbeta - xhat * dgamma), with the two
 * FMAs plane_dx's AVX2 and AVX-512 builds make of it; dx_f16_tail from
 * element i on, one at a time (both widths' tails) */
__attribute__((target("fma,f16c"))) static inline void dx_f16_tail(const float *xc, const uint16_t *x, int bf, const float *dy,
                                                                   size_t i, size_t n, float mean, float invstd, float k,
                                                                   float count, float dbeta, float dgamma, int obf, uint16_t *o) {
  for (; i < n; i++) {
    float xv = xc ? xc[i] : h1_ld(x[i], bf), xhat = (xv - mean) * invstd;
    float v = k * fmaf(-xhat, dgamma, fmaf(count, dy[i], -dbeta));
    o[i] = obf ? ampc_f32_to_bf16(v) : _cvtss_sh(v, _MM_FROUND_TO_NEAREST_INT);
  }
}
BN512 static void dx_f16_avx512(const float *xc, const uint16_t *x, int bf, const float *dy, size_t n, float mean, float invstd,
                                float k, float count, float dbeta, float dgamma, int obf, uint16_t *o) {
  const __m512 mm = _mm512_set1_ps(mean), is = _mm512_set1_ps(invstd), kk = _mm512_set1_ps(k), cn = _mm512_set1_ps(count);
  const __m512 db = _mm512_set1_ps(dbeta), dgm = _mm512_set1_ps(dgamma);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 xv = xc ? _mm512_loadu_ps(xc + i) : h16_ld(x + i, bf);
    __m512 xhat = _mm512_mul_ps(_mm512_sub_ps(xv, mm), is);
    __m512 t = _mm512_fnmadd_ps(xhat, dgm, _mm512_fmsub_ps(cn, _mm512_loadu_ps(dy + i), db));
    _mm256_storeu_si256((__m256i *)(o + i), h16_pack(_mm512_mul_ps(kk, t), obf));
  }
  dx_f16_tail(xc, x, bf, dy, i, n, mean, invstd, k, count, dbeta, dgamma, obf, o);
}

/* pool_dy from 16-bit pooled dy and output: the full plane d (H x W) with
 * each window's gradient at its winner, masked by the fused ReLU where the
 * pooled output is not positive; zeros elsewhere */
BN512 static void pool_dy_h16_avx512(const uint16_t *dy, const uint16_t *y, int bf, int relu, const unsigned char *win, int64_t H,
                                     int64_t W, float *d) {
  const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i hi = _mm512_add_epi32(lo, _mm512_set1_epi32(8));
  int64_t OH = H / 2, OW = W / 2;
  for (int64_t oy = 0; oy < OH; oy++) {
    float *d0 = d + 2 * oy * W, *d1 = d0 + W;
    for (int64_t ox = 0; ox < OW; ox += 16) {
      int64_t m = OW - ox < 16 ? OW - ox : 16, cols = 2 * m;
      __mmask16 mw = (__mmask16)((1u << m) - 1);
      __mmask16 ml = cols >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << cols) - 1);
      __mmask16 mh = cols > 16 ? (__mmask16)((1u << (cols - 16)) - 1) : 0;
      int64_t at = oy * OW + ox;
      __m512 g = h16_ldm(dy + at, mw, bf);
      if (relu) g = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(h16_ldm(y + at, mw, bf), _mm512_setzero_ps(), _CMP_GT_OQ), g);
      __m512i w = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(mw, win + at));
      __m512 ga = _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(w, _mm512_setzero_si512()), g);
      __m512 gb = _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(w, _mm512_set1_epi32(1)), g);
      __m512 gc = _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(w, _mm512_set1_epi32(2)), g);
      __m512 gd = _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(w, _mm512_set1_epi32(3)), g);
      _mm512_mask_storeu_ps(d0 + 2 * ox, ml, _mm512_permutex2var_ps(ga, lo, gb));
      _mm512_mask_storeu_ps(d0 + 2 * ox + 16, mh, _mm512_permutex2var_ps(ga, hi, gb));
      _mm512_mask_storeu_ps(d1 + 2 * ox, ml, _mm512_permutex2var_ps(gc, lo, gd));
      _mm512_mask_storeu_ps(d1 + 2 * ox + 16, mh, _mm512_permutex2var_ps(gc, hi, gd));
    }
  }
  if (W & 1) /* a last odd column is outside every window */
    for (int64_t r = 0; r < 2 * OH; r++) d[r * W + W - 1] = 0.0f;
  if (H & 1) memset(d + (H - 1) * W, 0, (size_t)W * sizeof(float));
}

/* The same three passes 8 wide, for the AVX2 level (AVX2, FMA, F16C): the
 * sums in cpu_sum_dy_dyx's four 8-lane chains themselves. */
#define BN256 __attribute__((target("avx2,fma,f16c")))
BN256 static void dsums_h16_avx2(const float *dy, const uint16_t *x, int bf, float mean, size_t n, float *cache, float *s1,
                                 float *s2) {
  const __m256 mm = _mm256_set1_ps(mean);
  __m256 a[4], b[4];
  for (int j = 0; j < 4; j++) a[j] = b[j] = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int j = 0; j < 4; j++) {
      __m256 u = h8_ld(x + i + 8 * j, bf), d = _mm256_loadu_ps(dy + i + 8 * j);
      if (cache) _mm256_storeu_ps(cache + i + 8 * j, u);
      a[j] = _mm256_add_ps(a[j], d);
      b[j] = _mm256_fmadd_ps(d, _mm256_sub_ps(u, mm), b[j]);
    }
  for (; i + 8 <= n; i += 8) {
    __m256 u = h8_ld(x + i, bf), d = _mm256_loadu_ps(dy + i);
    if (cache) _mm256_storeu_ps(cache + i, u);
    a[0] = _mm256_add_ps(a[0], d);
    b[0] = _mm256_fmadd_ps(d, _mm256_sub_ps(u, mm), b[0]);
  }
  float la[4][8], lb[4][8];
  for (int j = 0; j < 4; j++) {
    _mm256_storeu_ps(la[j], a[j]);
    _mm256_storeu_ps(lb[j], b[j]);
  }
  for (; i < n; i++) {
    float u = h1_ld(x[i], bf);
    if (cache) cache[i] = u;
    la[0][0] += dy[i];
    lb[0][0] = fmaf(dy[i], u - mean, lb[0][0]);
  }
  *s1 = bn_sum32_end(la[0], la[1], la[2], la[3]);
  *s2 = bn_sum32_end(lb[0], lb[1], lb[2], lb[3]);
}

BN256 static void dx_f16_avx2(const float *xc, const uint16_t *x, int bf, const float *dy, size_t n, float mean, float invstd,
                              float k, float count, float dbeta, float dgamma, int obf, uint16_t *o) {
  const __m256 mm = _mm256_set1_ps(mean), is = _mm256_set1_ps(invstd), kk = _mm256_set1_ps(k), cn = _mm256_set1_ps(count);
  const __m256 db = _mm256_set1_ps(dbeta), dgm = _mm256_set1_ps(dgamma);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 xv = xc ? _mm256_loadu_ps(xc + i) : h8_ld(x + i, bf);
    __m256 xhat = _mm256_mul_ps(_mm256_sub_ps(xv, mm), is);
    __m256 t = _mm256_fnmadd_ps(xhat, dgm, _mm256_fmsub_ps(cn, _mm256_loadu_ps(dy + i), db));
    _mm_storeu_si128((__m128i *)(o + i), h8_pack(_mm256_mul_ps(kk, t), obf));
  }
  dx_f16_tail(xc, x, bf, dy, i, n, mean, invstd, k, count, dbeta, dgamma, obf, o);
}

/* pool_dy on rows of at least 8 windows (OW >= 8), 8 a step: a row's last
 * step overlaps the one before where 8 does not divide OW (the windows they
 * share are written twice, the same). Shorter rows stay on the loops: taken
 * here through zero-padded copies, the cnn's second batch norm backward took
 * 1.02 ms against their 0.65 (Zen 4, the device's level set to AVX2). */
BN256 static void pool_dy_h16_avx2(const uint16_t *dy, const uint16_t *y, int bf, int relu, const unsigned char *win, int64_t H,
                                   int64_t W, float *d) {
  int64_t OH = H / 2, OW = W / 2;
  for (int64_t oy = 0; oy < OH; oy++) {
    float *d0 = d + 2 * oy * W, *d1 = d0 + W;
    for (int64_t s = 0; s < OW; s += 8) {
      int64_t ox = s + 8 <= OW ? s : OW - 8, at = oy * OW + ox;
      __m256 g = h8_ld(dy + at, bf);
      if (relu) g = _mm256_and_ps(g, _mm256_cmp_ps(h8_ld(y + at, bf), _mm256_setzero_ps(), _CMP_GT_OQ));
      __m256i w = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(win + at)));
      __m256 ga = _mm256_and_ps(g, _mm256_castsi256_ps(_mm256_cmpeq_epi32(w, _mm256_setzero_si256())));
      __m256 gb = _mm256_and_ps(g, _mm256_castsi256_ps(_mm256_cmpeq_epi32(w, _mm256_set1_epi32(1))));
      __m256 gc = _mm256_and_ps(g, _mm256_castsi256_ps(_mm256_cmpeq_epi32(w, _mm256_set1_epi32(2))));
      __m256 gd = _mm256_and_ps(g, _mm256_castsi256_ps(_mm256_cmpeq_epi32(w, _mm256_set1_epi32(3))));
      __m256 l0 = _mm256_unpacklo_ps(ga, gb), h0 = _mm256_unpackhi_ps(ga, gb);
      __m256 l1 = _mm256_unpacklo_ps(gc, gd), h1 = _mm256_unpackhi_ps(gc, gd);
      _mm256_storeu_ps(d0 + 2 * ox, _mm256_permute2f128_ps(l0, h0, 0x20));
      _mm256_storeu_ps(d0 + 2 * ox + 8, _mm256_permute2f128_ps(l0, h0, 0x31));
      _mm256_storeu_ps(d1 + 2 * ox, _mm256_permute2f128_ps(l1, h1, 0x20));
      _mm256_storeu_ps(d1 + 2 * ox + 8, _mm256_permute2f128_ps(l1, h1, 0x31));
    }
  }
  if (W & 1)
    for (int64_t r = 0; r < 2 * OH; r++) d[r * W + W - 1] = 0.0f;
  if (H & 1) memset(d + (H - 1) * W, 0, (size_t)W * sizeof(float));
}
#else
#define BN_X86 0
#endif

/* 1: the per-plane loops even where the fused passes run (a test hook) */
int ampc__cpu_bn_generic = 0;

/* Batch norm backward's fused passes over 16-bit planes at the device's
 * level (AVX-512 or AVX2), or none (the per-plane loops). */
typedef struct {
  void (*dsums)(const float *dy, const uint16_t *x, int bf, float mean, size_t n, float *cache, float *s1, float *s2);
  void (*dx)(const float *xc, const uint16_t *x, int bf, const float *dy, size_t n, float mean, float invstd, float k, float count,
             float dbeta, float dgamma, int obf, uint16_t *o);
  void (*pool_dy)(const uint16_t *dy, const uint16_t *y, int bf, int relu, const unsigned char *win, int64_t H, int64_t W, float *d);
  int64_t pool_min_ow; /* pool_dy for rows of at least this many windows */
} bn_passes;
static bn_passes bn_fused(const ampc__op_call *c) {
  bn_passes p = {NULL, NULL, NULL, 0};
#if BN_X86
  const ampc__cpu_isa *isa = cpu_ctx(c)->isa;
  if (!isa || ampc__cpu_bn_generic) return p;
  if (isa->avx512) return (bn_passes){dsums_h16_avx512, dx_f16_avx512, pool_dy_h16_avx512, 1};
  if (isa->avx2) return (bn_passes){dsums_h16_avx2, dx_f16_avx2, pool_dy_h16_avx2, 8};
#else
  (void)c;
#endif
  return p;
}
static int is_h16(ampc_dtype t) { return t == AMPC_DTYPE_F16 || t == AMPC_DTYPE_BF16; }

/* y = x * scale + shift (through a fused ReLU), rounded to the storage type
 * where a fused pool reads it. */
static void apply_rounded(const ampc__op_call *c, const float *x, size_t n, float scale, float shift, float *y) {
#if BN_X86
  const ampc__cpu_isa *isa = cpu_ctx(c)->isa;
  if (c->attr.pool && is_h16(c->out.dtype) && isa && isa->avx2) {
    (isa->avx512 ? apply_h16_avx512 : apply_h16_avx2)(x, n, scale, shift, c->attr.relu, c->out.dtype == AMPC_DTYPE_BF16, y);
    return;
  }
#endif
  plane_apply(x, n, scale, shift, c->attr.relu, y);
  if (c->attr.pool) ampc__round_f32(c->out.dtype, y, n); /* pooled as the unfused graph pools: after rounding */
}

/* What the batch norm stores, x * scale + shift through its ReLU, rounded to
 * type t as storing rounds it: also the prologue of the convolutions after a
 * batch norm that stores nothing (ampc__op_call.pro), the same code on the
 * same values, so the fused graph's bits are the plain one's. x may be y. */
void ampc__cpu_bn_recompute(const float *x, size_t n, float scale, float shift, int relu, ampc_dtype t, float *y) {
  plane_apply(x, n, scale, shift, relu, y);
  if (t != AMPC_DTYPE_F32) ampc__round_f32(t, y, n);
}

/* The output's values [off, off + n) (within a plane, or whole planes) as
 * f32: loaded, or where nothing was stored (nostore) or what was stored is
 * gone by backward (recompute) computed again from x as forward stored
 * them. */
static const float *bn_out(const ampc__op_call *c, const bn_geom *g, int64_t off, size_t n, float *ys) {
  if (!bn_keeps_scale_shift(c)) return cpu_load(&c->out, off, n, ys);
  const float *x = cpu_load(&c->in[0], off, n, ys), *ss = bn_scale_shift(c, g);
  for (size_t i = 0; i < n;) {
    int64_t e = off + (int64_t)i, ch = e / g->HW % g->C;
    size_t len = (size_t)(g->HW - e % g->HW);
    if (len > n - i) len = n - i;
    ampc__cpu_bn_recompute(x + i, len, ss[ch], ss[g->C + ch], c->attr.relu, c->out.dtype, ys + i);
    i += len;
  }
  return ys;
}

/* dy of one plane. With a fused ReLU it is masked where the output is not
 * positive, in place: the output's gradient is dead after this backward, so
 * the first pass leaves the masked values for the second. Masking is exact in
 * every storage type. */
static const float *load_dy(const ampc__op_call *c, int64_t off, size_t n, float *dys, float *ys, int mask) {
  if (!c->attr.relu || !mask) return cpu_load(&c->dout, off, n, dys);
  bn_geom g = bn_geometry(c);
  const float *y = bn_out(c, &g, off, n, ys);
  float *d = c->dout.dtype == AMPC_DTYPE_F32 ? (float *)c->dout.data + off : dys;
  if (d == dys) ampc_load_f32(dys, c->dout.dtype, cpu_at(&c->dout, off), n);
  ampc__cpu_relu_mask(y, d, n, d);
  if (d == dys) ampc_store_f32(c->dout.dtype, cpu_at(&c->dout, off), dys, n);
  return d;
}

/* dy of one plane into the channel cache d, masked by a fused ReLU; the
 * tensor itself when it is f32 and there is nothing to mask. */
static const float *cache_dy(const ampc__op_call *c, int64_t off, size_t n, float *d, float *ys) {
  if (!c->attr.relu) return cpu_load(&c->dout, off, n, d);
  bn_geom g = bn_geometry(c);
  const float *y = bn_out(c, &g, off, n, ys);
  ampc_load_f32(d, c->dout.dtype, cpu_at(&c->dout, off), n);
  ampc__cpu_relu_mask(y, d, n, d);
  return d;
}

/* With a fused max pool: dy of one full plane into d. The pooled gradient
 * goes to each window's winner, masked by a fused ReLU where the pooled output
 * is not positive (the winner's own output); tmp holds 3 pooled planes. */
static const float *pool_dy(const ampc__op_call *c, const bn_geom *g, int64_t plane, float *d, float *tmp) {
  size_t np = (size_t)g->PHW;
  bn_passes fp = bn_fused(c);
  if (fp.pool_dy && g->W / 2 >= fp.pool_min_ow && is_h16(c->dout.dtype) && (!c->attr.relu || c->out.dtype == c->dout.dtype)) {
    fp.pool_dy(cpu_at(&c->dout, plane * g->PHW), cpu_at(&c->out, plane * g->PHW), c->dout.dtype == AMPC_DTYPE_BF16, c->attr.relu,
               bn_winners(c, g) + plane * g->PHW, g->H, g->W, d);
    return d;
  }
  const float *dy = cpu_load(&c->dout, plane * g->PHW, np, tmp);
  if (c->attr.relu) {
    const float *y = cpu_load(&c->out, plane * g->PHW, np, tmp + np);
    float *m = tmp + 2 * np;
    ampc__cpu_relu_mask(y, dy, np, m);
    dy = m;
  }
  ampc__cpu_pool2_scatter(dy, bn_winners(c, g) + plane * g->PHW, g->H, g->W, d);
  return d;
}

/* The memory backward's first pass reads for plane pl, asked for ahead. */
static void bn_prefetch_bwd(const ampc__op_call *c, const bn_geom *g, int64_t pl) {
  cpu_prefetch(&c->in[0], pl * g->HW, (size_t)g->HW, 0);
  int64_t n = c->attr.pool ? g->PHW : g->HW;
  cpu_prefetch(&c->dout, pl * n, (size_t)n, 0);
  if (c->attr.relu && !c->attr.nostore) cpu_prefetch(&c->out, pl * n, (size_t)n, 0);
  if (c->attr.pool) cpu_prefetch_bytes(bn_winners(c, g) + pl * g->PHW, (size_t)g->PHW, 0);
}

/* ... and forward's second: the output plane (pooled, with its winners),
 * and the input when it is read again. */
static void bn_prefetch_fwd(const ampc__op_call *c, const bn_geom *g, int64_t pl, int input) {
  if (input) cpu_prefetch(&c->in[0], pl * g->HW, (size_t)g->HW, 0);
  int64_t n = c->attr.pool ? g->PHW : g->HW;
  cpu_prefetch(&c->out, pl * n, (size_t)n, 1);
  if (c->attr.pool) cpu_prefetch_bytes(bn_winners(c, g) + pl * g->PHW, (size_t)g->PHW, 1);
}

static float param_at(const ampc_tensor *t, int64_t i) {
  float v;
  ampc_load_f32(&v, t->dtype, cpu_at(t, i), 1);
  return v;
}

/* With nostore or recompute: each channel's scale and shift as bn_apply
 * computes them, for the convolutions that apply them and for backward's
 * recomputed output (after forward's statistics). */
static void bn_keep_scale_shift(const ampc__op_call *c, const bn_geom *g) {
  const float *mean_s = c->aux, *invstd_s = c->aux + g->C;
  float *ss = bn_scale_shift(c, g);
  for (int64_t ch = 0; ch < g->C; ch++) {
    float scale = param_at(&c->in[1], ch) * invstd_s[ch], shift = param_at(&c->in[2], ch) - mean_s[ch] * scale;
    ss[ch] = scale;
    ss[g->C + ch] = shift;
  }
}

/* Channel ch's mean and inverse std into the saved state: in training from
 * the sums of (x - k) and (x - k)^2 around k over count values (the channel's
 * first value: accurate without a second pass), updating the running
 * statistics (with the unbiased variance); in eval from those. */
static void bn_channel_stats(const ampc__op_call *c, int64_t C, int64_t ch, float k, double sum, double sq, int64_t count) {
  float *rm = c->in[3].data, *rv = c->in[4].data, *mean_s = c->aux, *invstd_s = c->aux + C;
  float mom = c->attr.momentum, eps = c->attr.eps;
  if (!c->training) {
    mean_s[ch] = rm[ch];
    invstd_s[ch] = 1.0f / sqrtf(rv[ch] + eps);
    return;
  }
  double md = sum / (double)count;
  float mean = (float)(k + md);
  sq -= md * sum; /* sum of squared deviations from the mean */
  if (sq < 0) sq = 0;
  float var = (float)(sq / (double)count);
  mean_s[ch] = mean;
  invstd_s[ch] = 1.0f / sqrtf(var + eps);
  float unbiased = (float)(sq / (double)(count - 1));
  rm[ch] = (1.0f - mom) * rm[ch] + mom * mean;
  rv[ch] = (1.0f - mom) * rv[ch] + mom * unbiased;
}

/* y of channel ch from x, normalised with (mean, invstd), scaled and
 * shifted, through a fused ReLU and pool; xc: the channel's x cached in f32
 * (NULL: loaded again), xs and ys the thread's staging planes. */
static void bn_apply(const ampc__op_call *c, const bn_geom *gp, int64_t ch, float mean, float invstd, const float *xc, float *xs,
                     float *ys) {
  const bn_geom g = *gp;
  const ampc_tensor *x = &c->in[0], *y = &c->out;
  float scale = param_at(&c->in[1], ch) * invstd, shift = param_at(&c->in[2], ch) - mean * scale;
  for (int64_t n = 0; n < g.N; n++) {
    int64_t off = (n * g.C + ch) * g.HW;
    if (n + CPU_AHEAD < g.N) bn_prefetch_fwd(c, &g, (n + CPU_AHEAD) * g.C + ch, xc == NULL);
    const float *xp = xc ? xc + n * g.HW : cpu_load(x, off, (size_t)g.HW, xs);
    float *yp = c->attr.pool ? ys : cpu_out(y, off, ys);
    apply_rounded(c, xp, (size_t)g.HW, scale, shift, yp);
    if (!c->attr.pool) {
      cpu_commit(y, off, yp, (size_t)g.HW);
      continue;
    }
    int64_t plane = n * g.C + ch;
    ampc__cpu_pool2_select(yp, g.H, g.W, ys + g.HW, bn_winners(c, &g) + plane * g.PHW);
    cpu_store(y, plane * g.PHW, ys + g.HW, (size_t)g.PHW, 0, NULL);
  }
}

/* Forward a sample at a time (small planes; see bn_by_sample): each plane's
 * sums around the channel's first value, added over the samples in order
 * as ampc__cpu_bn_fwd adds them; then every sample normalised, through the
 * fused ReLU and pool, with one conversion in and one out. */
static void bn_fwd_by_sample(const ampc__op_call *c, const bn_geom *gp) {
  const bn_geom g = *gp;
  const ampc_tensor *x = &c->in[0], *y = &c->out;
  const float *mean_s = c->aux, *invstd_s = c->aux + g.C;
  float *scale = (float *)c->ws, *shift = scale + g.C, *part = (float *)c->ws + bn_shared(&g);
  int64_t CHW = g.C * g.HW, CP = g.C * g.PHW, count = g.N * g.HW;
  size_t per = bn_sample_per_thread(&g), shared = bn_sample_shared(&g);
  int nt = cpu_ctx(c)->nthreads;
  float *k0 = shift; /* each channel's first value, until the shifts */
  if (c->training) {
    for (int64_t ch = 0; ch < g.C; ch++) ampc_load_f32(&k0[ch], x->dtype, cpu_at(x, ch * g.HW), 1);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t n = 0; n < g.N; n++) {
      float *xs = cpu_ws_slice(c, omp_get_thread_num(), per, shared);
      const float *xp = cpu_load(x, n * CHW, (size_t)CHW, xs);
      for (int64_t ch = 0; ch < g.C; ch++) {
        float *s = part + 2 * (n * g.C + ch);
        plane_sums(xp + ch * g.HW, k0[ch], (size_t)g.HW, &s[0], &s[1]);
      }
    }
  }
  for (int64_t ch = 0; ch < g.C; ch++) {
    double sum = 0.0, sq = 0.0;
    for (int64_t n = 0; c->training && n < g.N; n++) {
      sum += part[2 * (n * g.C + ch)];
      sq += part[2 * (n * g.C + ch) + 1];
    }
    bn_channel_stats(c, g.C, ch, c->training ? k0[ch] : 0.0f, sum, sq, count);
  }
  for (int64_t ch = 0; ch < g.C; ch++) {
    scale[ch] = param_at(&c->in[1], ch) * invstd_s[ch];
    shift[ch] = param_at(&c->in[2], ch) - mean_s[ch] * scale[ch];
  }
  if (c->attr.nostore) return; /* ampc__cpu_bn_fwd keeps the scales and shifts */
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int64_t n = 0; n < g.N; n++) {
    float *xs = cpu_ws_slice(c, omp_get_thread_num(), per, shared), *ys = xs + CHW, *ps = ys + 3 * CHW;
    const float *xp = cpu_load(x, n * CHW, (size_t)CHW, xs);
    float *yp = c->attr.pool ? ys : cpu_out(y, n * CHW, ys);
    for (int64_t ch = 0; ch < g.C; ch++) apply_rounded(c, xp + ch * g.HW, (size_t)g.HW, scale[ch], shift[ch], yp + ch * g.HW);
    if (!c->attr.pool) {
      cpu_commit(y, n * CHW, yp, (size_t)CHW);
      continue;
    }
    for (int64_t ch = 0; ch < g.C; ch++)
      ampc__cpu_pool2_select(yp + ch * g.HW, g.H, g.W, ps + ch * g.PHW, bn_winners(c, &g) + (n * g.C + ch) * g.PHW);
    cpu_store(y, n * CP, ps, (size_t)CP, 0, NULL);
  }
}

/* dy of sample n at full size, masked by a fused ReLU and sent through a
 * fused pool's winners; d and ys: CHW floats, pt: 3 x CP. */
static const float *sample_dy(const ampc__op_call *c, const bn_geom *g, int64_t n, float *d, float *ys, float *pt) {
  int64_t CHW = g->C * g->HW, CP = g->C * g->PHW;
  if (!c->attr.pool) {
    const float *dy = cpu_load(&c->dout, n * CHW, (size_t)CHW, d);
    if (!c->attr.relu) return dy;
    ampc__cpu_relu_mask(bn_out(c, g, n * CHW, (size_t)CHW, ys), dy, (size_t)CHW, d);
    return d;
  }
  const float *dy = cpu_load(&c->dout, n * CP, (size_t)CP, pt);
  if (c->attr.relu) {
    ampc__cpu_relu_mask(cpu_load(&c->out, n * CP, (size_t)CP, pt + CP), dy, (size_t)CP, pt + 2 * CP);
    dy = pt + 2 * CP;
  }
  for (int64_t ch = 0; ch < g->C; ch++)
    ampc__cpu_pool2_scatter(dy + ch * g->PHW, bn_winners(c, g) + (n * g->C + ch) * g->PHW, g->H, g->W, d + ch * g->HW);
  return d;
}

/* Backward a sample at a time (small planes): the same per-plane sums as
 * ampc__cpu_bn_bwd, added over the samples in order, then dx. dg and dbt
 * receive the parameters' gradients. */
static void bn_bwd_by_sample(const ampc__op_call *c, const bn_geom *gp, int batch_stats, float *dg, float *dbt) {
  const bn_geom g = *gp;
  const ampc_tensor *x = &c->in[0], *dx = &c->din[0];
  const float *mean_s = c->aux, *invstd_s = c->aux + g.C;
  float *part = (float *)c->ws + bn_shared(&g);
  int64_t CHW = g.C * g.HW, count = g.N * g.HW;
  size_t per = bn_sample_per_thread(&g), shared = bn_sample_shared(&g);
  int nt = cpu_ctx(c)->nthreads;
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int64_t n = 0; n < g.N; n++) {
    float *xs = cpu_ws_slice(c, omp_get_thread_num(), per, shared), *ds = xs + CHW, *ys = ds + 2 * CHW, *pt = ys + CHW;
    const float *xp = cpu_load(x, n * CHW, (size_t)CHW, xs);
    const float *dp = sample_dy(c, &g, n, ds, ys, pt);
    for (int64_t ch = 0; ch < g.C; ch++) {
      float *s = part + 2 * (n * g.C + ch);
      plane_dsums(dp + ch * g.HW, xp + ch * g.HW, mean_s[ch], (size_t)g.HW, &s[0], &s[1]);
    }
  }
  for (int64_t ch = 0; ch < g.C; ch++) {
    double sdy = 0.0, sdyx = 0.0;
    for (int64_t n = 0; n < g.N; n++) {
      sdy += part[2 * (n * g.C + ch)];
      sdyx += part[2 * (n * g.C + ch) + 1];
    }
    dg[ch] = (float)(sdyx * invstd_s[ch]);
    dbt[ch] = (float)sdy;
  }
  if (!dx->data) return;
  float *gm = part, *k = part + g.C; /* the sums are added up: their room holds gamma and gamma * invstd / count */
  for (int64_t ch = 0; ch < g.C; ch++) {
    gm[ch] = param_at(&c->in[1], ch);
    k[ch] = gm[ch] * invstd_s[ch] / (float)count;
  }
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int64_t n = 0; n < g.N; n++) {
    float *xs = cpu_ws_slice(c, omp_get_thread_num(), per, shared), *ds = xs + CHW, *os = ds + CHW, *ys = os + CHW;
    float *pt = ys + CHW;
    const float *xp = cpu_load(x, n * CHW, (size_t)CHW, xs);
    const float *dp = sample_dy(c, &g, n, ds, ys, pt);
    float *o = c->din_acc[0] ? os : cpu_out(dx, n * CHW, os);
    for (int64_t ch = 0; ch < g.C; ch++) {
      const float *xq = xp + ch * g.HW, *dq = dp + ch * g.HW;
      float *oq = o + ch * g.HW, invstd = invstd_s[ch];
      if (batch_stats) {
        plane_dx(xq, dq, (size_t)g.HW, mean_s[ch], invstd, k[ch], (float)count, dbt[ch], dg[ch], oq);
      } else {
        for (int64_t i = 0; i < g.HW; i++) oq[i] = gm[ch] * invstd * dq[i];
      }
    }
    cpu_store_grad(c, dx, n * CHW, o, (size_t)CHW, c->din_acc[0], ys); /* x and dy are read: ys is free */
  }
}

/* SyncBatchNorm's forward in training (see the top of the file). */
static ampc_status bn_fwd_sync(const ampc__op_call *c) {
  bn_geom g = bn_geometry(c);
  const ampc_tensor *x = &c->in[0];
  float *rm = c->in[3].data, *rv = c->in[4].data;
  float *mean_s = c->aux, *invstd_s = c->aux + g.C;
  float mom = c->attr.momentum, eps = c->attr.eps;
  size_t per = bn_per_thread(c, &g), shared = bn_shared(&g);
  double *acc = bn_sync_sums(c, &g, per);
#pragma omp parallel for num_threads(cpu_ctx(c)->nthreads) schedule(static)
  for (int64_t ch = 0; ch < g.C; ch++) {
    float *xs = cpu_ws_slice(c, omp_get_thread_num(), per, shared);
    double sum = 0.0, sq = 0.0;
    for (int64_t n = 0; n < g.N; n++) {
      if (n + CPU_AHEAD < g.N) cpu_prefetch(x, ((n + CPU_AHEAD) * g.C + ch) * g.HW, (size_t)g.HW, 0);
      const float *xp = cpu_load(x, (n * g.C + ch) * g.HW, (size_t)g.HW, xs);
      float a, b;
      plane_sums(xp, rm[ch], (size_t)g.HW, &a, &b);
      sum += a;
      sq += b;
    }
    acc[ch] = sum;
    acc[g.C + ch] = sq;
  }
  acc[2 * g.C] = (double)(g.N * g.HW);
  AMPC_TRY(c->sync->sum(c->sync->ctx, acc, 2 * (size_t)g.C + 1));
  double count = acc[2 * g.C];
  if (count < 2) return ampc__error(AMPC_EINVAL, "batchnorm2d: training needs more than one value per channel over the ranks (got %.0f)", count);
#pragma omp parallel for num_threads(cpu_ctx(c)->nthreads) schedule(static)
  for (int64_t ch = 0; ch < g.C; ch++) {
    float *xs = cpu_ws_slice(c, omp_get_thread_num(), per, shared), *ys = xs + 2 * g.HW;
    double md = acc[ch] / count, sq = acc[g.C + ch] - md * acc[ch];
    if (sq < 0) sq = 0;
    float mean = (float)(rm[ch] + md); /* the shift is the running mean before this update */
    float invstd = 1.0f / sqrtf((float)(sq / count) + eps);
    mean_s[ch] = mean;
    invstd_s[ch] = invstd;
    rm[ch] = (1.0f - mom) * rm[ch] + mom * mean;
    rv[ch] = (1.0f - mom) * rv[ch] + mom * (float)(sq / (count - 1));
    if (!c->attr.nostore) bn_apply(c, &g, ch, mean, invstd, NULL, xs, ys);
  }
  if (bn_keeps_scale_shift(c)) bn_keep_scale_shift(c, &g);
  c->aux[2 * g.C] = 1.0f;
  if (c->n_in > 5 && c->in[5].data) ((int64_t *)c->in[5].data)[0] += 1;
  return AMPC_OK;
}

/* Forward a channel at a time: each thread a block of channels, a channel's
 * planes through the sums and then normalised (16-bit ones kept in f32
 * between the two where they fit: bn_cache). */
static void bn_fwd_by_channel(const ampc__op_call *c, const bn_geom *gp) {
  const bn_geom g = *gp;
  const ampc_tensor *x = &c->in[0];
  const float *mean_s = c->aux, *invstd_s = c->aux + g.C;
  size_t shared = 64, per = bn_per_thread(c, &g);
  int64_t count = g.N * g.HW;
  int cache = bn_cache(c, &g) && x->dtype != AMPC_DTYPE_F32 && !c->attr.nostore;
#pragma omp parallel for num_threads(cpu_ctx(c)->nthreads) schedule(static)
  for (int64_t ch = 0; ch < g.C; ch++) {
    float *xs = cpu_ws_slice(c, omp_get_thread_num(), per, shared), *ys = xs + 2 * g.HW, *xc = xs + 4 * g.HW;
    float k0 = 0.0f;
    double sum = 0.0, sq = 0.0;
    if (c->training) {
      /* one pass: sums of (x - k) and (x - k)^2 around k, the channel's first value */
      ampc_load_f32(&k0, x->dtype, cpu_at(x, ch * g.HW), 1);
      for (int64_t n = 0; n < g.N; n++) {
        if (n + CPU_AHEAD < g.N) cpu_prefetch(x, ((n + CPU_AHEAD) * g.C + ch) * g.HW, (size_t)g.HW, 0);
        const float *xp = cpu_load(x, (n * g.C + ch) * g.HW, (size_t)g.HW, cache ? xc + n * g.HW : xs);
        float a, b;
        plane_sums(xp, k0, (size_t)g.HW, &a, &b);
        sum += a;
        sq += b;
      }
    }
    bn_channel_stats(c, g.C, ch, k0, sum, sq, count);
    if (!c->attr.nostore) bn_apply(c, &g, ch, mean_s[ch], invstd_s[ch], cache && c->training ? xc : NULL, xs, ys);
  }
}

ampc_status ampc__cpu_bn_fwd(const ampc__op_call *c) {
  if (c->sync && c->training) return bn_fwd_sync(c);
  bn_geom g = bn_geometry(c);
  int64_t count = g.N * g.HW;
  if (c->attr.pool && (c->out.shape.d[2] != g.H / 2 || c->out.shape.d[3] != g.W / 2))
    return ampc__error(AMPC_EINVAL, "batchnorm2d: a fused pool's output must be half the input's size");
  if (c->training && count < 2) return ampc__error(AMPC_EINVAL, "batchnorm2d: training needs more than one value per channel (got %lld)", (long long)count);
  if (c->attr.nostore && c->attr.pool) return ampc__error(AMPC_EINVAL, "batchnorm2d: a fused pool needs the output stored");
  if (bn_by_sample(c, &g))
    bn_fwd_by_sample(c, &g);
  else
    bn_fwd_by_channel(c, &g);
  if (bn_keeps_scale_shift(c)) bn_keep_scale_shift(c, &g);
  c->aux[2 * g.C] = c->training ? 1.0f : 0.0f; /* which statistics backward differentiates */
  if (c->training && c->n_in > 5 && c->in[5].data) ((int64_t *)c->in[5].data)[0] += 1;
  return AMPC_OK;
}

/* SyncBatchNorm's backward after a forward with batch statistics. */
static ampc_status bn_bwd_sync(const ampc__op_call *c) {
  bn_geom g = bn_geometry(c);
  const ampc_tensor *x = &c->in[0], *gamma = &c->in[1];
  const ampc_tensor *dx = &c->din[0], *dgamma = &c->din[1], *dbeta = &c->din[2];
  const float *mean_s = c->aux, *invstd_s = c->aux + g.C;
  float *dg = (float *)c->ws, *dbt = dg + g.C;
  size_t per = bn_per_thread(c, &g), shared = bn_shared(&g);
  double *acc = bn_sync_sums(c, &g, per);
#pragma omp parallel for num_threads(cpu_ctx(c)->nthreads) schedule(static)
  for (int64_t ch = 0; ch < g.C; ch++) {
    float *xs = cpu_ws_slice(c, omp_get_thread_num(), per, shared), *dys = xs + g.HW, *ys = dys + 2 * g.HW;
    double sdy = 0.0, sdyx = 0.0;
    for (int64_t n = 0; n < g.N; n++) {
      int64_t off = (n * g.C + ch) * g.HW;
      if (n + CPU_AHEAD < g.N) bn_prefetch_bwd(c, &g, (n + CPU_AHEAD) * g.C + ch);
      const float *xp = cpu_load(x, off, (size_t)g.HW, xs);
      /* a fused ReLU's mask is applied in place here, for the second pass */
      const float *dp = c->attr.pool ? pool_dy(c, &g, n * g.C + ch, dys, ys) : load_dy(c, off, (size_t)g.HW, dys, ys, 1);
      float a, b;
      plane_dsums(dp, xp, mean_s[ch], (size_t)g.HW, &a, &b);
      sdy += a;
      sdyx += b;
    }
    dg[ch] = (float)(sdyx * invstd_s[ch]); /* this rank's: averaged with the other gradients */
    dbt[ch] = (float)sdy;
    acc[ch] = sdy;
    acc[g.C + ch] = sdyx;
  }
  acc[2 * g.C] = (double)(g.N * g.HW);
  AMPC_TRY(c->sync->sum(c->sync->ctx, acc, 2 * (size_t)g.C + 1));
  double count = acc[2 * g.C];
  if (dx->data) {
#pragma omp parallel for num_threads(cpu_ctx(c)->nthreads) schedule(static)
    for (int64_t ch = 0; ch < g.C; ch++) {
      float *xs = cpu_ws_slice(c, omp_get_thread_num(), per, shared), *dys = xs + g.HW, *out = dys + g.HW, *ys = out + g.HW;
      float mean = mean_s[ch], invstd = invstd_s[ch];
      float dbeta_c = (float)acc[ch], dgamma_c = (float)(acc[g.C + ch] * invstd);
      float k = (float)(param_at(gamma, ch) * invstd / count);
      for (int64_t n = 0; n < g.N; n++) {
        int64_t off = (n * g.C + ch) * g.HW;
        const float *xp = cpu_load(x, off, (size_t)g.HW, xs);
        const float *dp = c->attr.pool ? pool_dy(c, &g, n * g.C + ch, dys, ys) : load_dy(c, off, (size_t)g.HW, dys, ys, 0);
        float *o = c->din_acc[0] ? out : cpu_out(dx, off, out);
        plane_dx(xp, dp, (size_t)g.HW, mean, invstd, k, (float)count, dbeta_c, dgamma_c, o);
        cpu_store_grad(c, dx, off, o, (size_t)g.HW, c->din_acc[0], xs);
      }
    }
  }
  float *tmp = dbt + g.C;
  if (dgamma->data) cpu_store_grad(c, dgamma, 0, dg, (size_t)g.C, c->din_acc[1], tmp);
  if (dbeta->data) cpu_store_grad(c, dbeta, 0, dbt, (size_t)g.C, c->din_acc[2], tmp);
  return AMPC_OK;
}

/* Backward a channel at a time: each thread a block of channels, a channel's
 * sums over its planes, then dx (a channel's values kept in f32 between the
 * two passes where they fit: bn_cache). dg and dbt receive the parameters'
 * gradients. */
static void bn_bwd_by_channel(const ampc__op_call *c, const bn_geom *gp, int batch_stats, float *dg, float *dbt) {
  const bn_geom g = *gp;
  const ampc_tensor *x = &c->in[0], *gamma = &c->in[1], *dx = &c->din[0];
  const float *mean_s = c->aux, *invstd_s = c->aux + g.C;
  size_t shared = bn_shared(&g);
  int64_t count = g.N * g.HW;
  size_t per = bn_per_thread(c, &g);
  int cache = bn_cache(c, &g);
  /* backward's two caches (x and dy) together in L2, or dy's alone: x is
   * then converted again in the second pass (measured: the cnn's first batch
   * norm backward 7% faster than with both caches spilling) */
  int cache_x = cache && g.N * g.HW <= BN_CACHE_BOTH_FLOATS;
  int64_t NHW = g.N * g.HW;
  bn_passes fp = bn_fused(c);
  int fast = fp.dsums && is_h16(x->dtype), bf = x->dtype == AMPC_DTYPE_BF16;
  /* dx straight into its 16-bit type where nothing is added to it or counted (--amp-report) */
  int fast_dx = fast && batch_stats && is_h16(dx->dtype) && !c->din_acc[0] && !cpu_ctx(c)->grad_stats;
#pragma omp parallel for num_threads(cpu_ctx(c)->nthreads) schedule(static)
  for (int64_t ch = 0; ch < g.C; ch++) {
    float *xs = cpu_ws_slice(c, omp_get_thread_num(), per, shared), *dys = xs + g.HW, *out = dys + g.HW;
    float *ys = out + g.HW, *xc = ys + g.HW, *dc = xc + NHW;
    float mean = mean_s[ch], invstd = invstd_s[ch];
    double sdy = 0.0, sdyx = 0.0;
    for (int64_t n = 0; n < g.N; n++) {
      int64_t off = (n * g.C + ch) * g.HW;
      if (n + CPU_AHEAD < g.N) bn_prefetch_bwd(c, &g, (n + CPU_AHEAD) * g.C + ch);
      const float *dp = c->attr.pool ? pool_dy(c, &g, n * g.C + ch, cache ? dc + n * g.HW : dys, ys)
                        : cache       ? cache_dy(c, off, (size_t)g.HW, dc + n * g.HW, ys)
                                      : load_dy(c, off, (size_t)g.HW, dys, ys, 1);
      float a, b;
      if (fast) {
        fp.dsums(dp, cpu_at(x, off), bf, mean, (size_t)g.HW, cache_x ? xc + n * g.HW : NULL, &a, &b);
        sdy += a;
        sdyx += b;
        continue;
      }
      const float *xp = cpu_load(x, off, (size_t)g.HW, cache_x ? xc + n * g.HW : xs);
      plane_dsums(dp, xp, mean, (size_t)g.HW, &a, &b);
      sdy += a;
      sdyx += b;
    }
    float dbeta_c = (float)sdy, dgamma_c = (float)(sdyx * invstd);
    dg[ch] = dgamma_c;
    dbt[ch] = dbeta_c;
    if (dx->data) {
      float gm = param_at(gamma, ch);
      float k = gm * invstd / (float)count;
      for (int64_t n = 0; n < g.N; n++) {
        int64_t off = (n * g.C + ch) * g.HW;
        if (n + CPU_AHEAD < g.N) cpu_prefetch(dx, off + CPU_AHEAD * g.C * g.HW, (size_t)g.HW, 1);
        const float *dp = cache && (c->dout.dtype != AMPC_DTYPE_F32 || c->attr.relu || c->attr.pool) ? dc + n * g.HW
                          : c->attr.pool ? pool_dy(c, &g, n * g.C + ch, dys, ys)
                                         : load_dy(c, off, (size_t)g.HW, dys, ys, 0);
        const float *xq = cache_x && x->dtype != AMPC_DTYPE_F32 ? xc + n * g.HW : NULL;
        if (fast_dx) {
          fp.dx(xq, cpu_at(x, off), bf, dp, (size_t)g.HW, mean, invstd, k, (float)count, dbeta_c, dgamma_c,
                dx->dtype == AMPC_DTYPE_BF16, cpu_at(dx, off));
          continue;
        }
        const float *xp = xq ? xq : cpu_load(x, off, (size_t)g.HW, xs);
        float *o = c->din_acc[0] ? out : cpu_out(dx, off, out);
        if (batch_stats) {
          plane_dx(xp, dp, (size_t)g.HW, mean, invstd, k, (float)count, dbeta_c, dgamma_c, o);
        } else {
          for (int64_t i = 0; i < g.HW; i++) o[i] = gm * invstd * dp[i];
        }
        cpu_store_grad(c, dx, off, o, (size_t)g.HW, c->din_acc[0], xs);
      }
    }
  }
}

ampc_status ampc__cpu_bn_bwd(const ampc__op_call *c) {
  bn_geom g = bn_geometry(c);
  if (c->sync && c->aux[2 * g.C] != 0.0f) return bn_bwd_sync(c);
  const ampc_tensor *dgamma = &c->din[1], *dbeta = &c->din[2];
  float *dg = (float *)c->ws, *dbt = dg + g.C; /* shared: per-channel parameter gradients */
  /* after an eval-mode forward the statistics are constants: dx = dy * gamma * invstd */
  int batch_stats = c->aux[2 * g.C] != 0.0f;
  if (bn_by_sample(c, &g))
    bn_bwd_by_sample(c, &g, batch_stats, dg, dbt);
  else
    bn_bwd_by_channel(c, &g, batch_stats, dg, dbt);
  float *tmp = dbt + g.C;
  if (dgamma->data) cpu_store_grad(c, dgamma, 0, dg, (size_t)g.C, c->din_acc[1], tmp);
  if (dbeta->data) cpu_store_grad(c, dbeta, 0, dbt, (size_t)g.C, c->din_acc[2], tmp);
  return AMPC_OK;
}
