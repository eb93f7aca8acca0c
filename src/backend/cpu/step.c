/* The training step's flat passes on the cpu: the finiteness check with the
 * sum of squares, folding gradients into f32, the per-parameter overflow
 * report, and the fused optimizer update that writes the 16-bit model copy.
 *
 * Work is cut into chunks of STEP_CHUNK elements of one span, handed to the
 * threads statically; sums are kept per chunk and added in chunk order, so
 * the results do not depend on the thread count. The optimizers' element
 * updates are step_math.h's, 8 lanes at a time in the AVX2 build and 16 in
 * the AVX-512 one (step_avx512.c): every operation in each build is a single
 * IEEE-rounded f32 operation (mul, fma, div, sqrt, add) in the same order, so
 * they give the same bits. */
#include <float.h>
#include <omp.h>
#include <stdlib.h>

#include "ampc/rng.h"
#include "backend/cpu/cpu_internal.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

enum {
  STEP_CHUNK = 8192,  /* elements per unit of work */
  STEP_BLOCK = 1024   /* elements updated before they are rounded into the model copy (4 KB of f32: still in L1) */
};

/* ---- the optimizers' element kernels ---- */

static void sgd_scalar(const ampc__optim_consts *k, size_t n, float *w, const float *g, float gmul, float *buf) {
  for (size_t i = 0; i < n; i++) w[i] = ampc__sgd_one(k, w[i], g[i] * gmul, buf ? buf + i : NULL);
}

static void adam_scalar(const ampc__optim_consts *k, size_t n, float *w, const float *g, float gmul, float *m, float *v,
                        float *vmax) {
  for (size_t i = 0; i < n; i++) w[i] = ampc__adam_one(k, w[i], g[i] * gmul, m + i, v + i, vmax ? vmax + i : NULL);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define STEP_HAVE_AVX2 1

/* 8 lanes at a time, the same operations as ampc__sgd_one; the tail goes
 * through it. The constants are copied out of k so that stores through
 * w/buf (which the compiler must assume may alias k) do not reload them. */
__attribute__((target("avx2,fma"))) static void sgd_avx2(const ampc__optim_consts *k, size_t n, float *w,
                                                         const float *g, float gmul, float *buf) {
  const int has_wd = k->weight_decay != 0.0f, has_mom = k->momentum != 0.0f;
  const int first = k->first, nesterov = k->nesterov;
  const __m256 vgmul = _mm256_set1_ps(gmul), vwd = _mm256_set1_ps(k->weight_decay);
  const __m256 vmom = _mm256_set1_ps(k->momentum), vomd = _mm256_set1_ps(k->one_minus_dampening);
  const __m256 vnlr = _mm256_set1_ps(k->neg_lr);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 x = _mm256_loadu_ps(w + i);
    __m256 d = _mm256_mul_ps(_mm256_loadu_ps(g + i), vgmul);
    if (has_wd) d = _mm256_fmadd_ps(x, vwd, d);
    if (has_mom) {
      __m256 b = d;
      if (!first) b = _mm256_fmadd_ps(d, vomd, _mm256_mul_ps(_mm256_loadu_ps(buf + i), vmom));
      _mm256_storeu_ps(buf + i, b);
      d = nesterov ? _mm256_fmadd_ps(b, vmom, d) : b;
    }
    _mm256_storeu_ps(w + i, _mm256_fmadd_ps(d, vnlr, x));
  }
  for (; i < n; i++) w[i] = ampc__sgd_one(k, w[i], g[i] * gmul, buf ? buf + i : NULL);
}

__attribute__((target("avx2,fma"))) static void adam_avx2(const ampc__optim_consts *k, size_t n, float *w,
                                                          const float *g, float gmul, float *m, float *v, float *vmax) {
  const int decoupled = k->decoupled, has_wd = k->weight_decay != 0.0f;
  const __m256 vgmul = _mm256_set1_ps(gmul), vwd = _mm256_set1_ps(k->weight_decay);
  const __m256 vdecay = _mm256_set1_ps(k->decay);
  const __m256 vb1 = _mm256_set1_ps(k->beta1), vomb1 = _mm256_set1_ps(k->one_minus_beta1);
  const __m256 vb2 = _mm256_set1_ps(k->beta2), vomb2 = _mm256_set1_ps(k->one_minus_beta2);
  const __m256 vbc2 = _mm256_set1_ps(k->bias_correction2_sqrt), veps = _mm256_set1_ps(k->eps);
  const __m256 vnss = _mm256_set1_ps(k->neg_step_size);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 x = _mm256_loadu_ps(w + i);
    __m256 d = _mm256_mul_ps(_mm256_loadu_ps(g + i), vgmul);
    if (decoupled) {
      x = _mm256_mul_ps(x, vdecay);
      AMPC__KEEP_ROUNDED(x);
    } else if (has_wd) {
      d = _mm256_fmadd_ps(x, vwd, d);
    }
    __m256 mm = _mm256_fmadd_ps(d, vomb1, _mm256_mul_ps(_mm256_loadu_ps(m + i), vb1));
    _mm256_storeu_ps(m + i, mm);
    __m256 vv = _mm256_fmadd_ps(_mm256_mul_ps(vomb2, d), d, _mm256_mul_ps(_mm256_loadu_ps(v + i), vb2));
    _mm256_storeu_ps(v + i, vv);
    if (vmax) {
      __m256 cur = _mm256_loadu_ps(vmax + i);
      __m256 take = _mm256_or_ps(_mm256_cmp_ps(cur, vv, _CMP_LT_OQ), _mm256_cmp_ps(vv, vv, _CMP_UNORD_Q));
      cur = _mm256_blendv_ps(cur, vv, take);
      _mm256_storeu_ps(vmax + i, cur);
      vv = cur;
    }
    __m256 den = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vv), vbc2), veps);
    x = _mm256_add_ps(x, _mm256_div_ps(_mm256_mul_ps(vnss, mm), den));
    _mm256_storeu_ps(w + i, x);
  }
  for (; i < n; i++) w[i] = ampc__adam_one(k, w[i], g[i] * gmul, m + i, v + i, vmax ? vmax + i : NULL);
}
#endif

const ampc__cpu_isa ampc__cpu_isa_baseline = {"baseline", 0, sgd_scalar, adam_scalar, 0};
#ifdef STEP_HAVE_AVX2
static const ampc__cpu_isa isa_avx2 = {"avx2+fma+f16c", 1, sgd_avx2, adam_avx2, 0};
const ampc__cpu_isa *const ampc__cpu_isa_avx2 = &isa_avx2;
#else
const ampc__cpu_isa *const ampc__cpu_isa_avx2 = NULL;
#endif

#ifdef AMPC__CPU_AVX512
/* AVX-512 CPUs have AVX2, FMA and F16C (ampc__cpu_has_avx512 checks), so the
 * kernels outside the step take their AVX2 code here too. */
static const ampc__cpu_isa isa_avx512 = {"avx512", 1, ampc__cpu_sgd_avx512, ampc__cpu_adam_avx512, 1};
const ampc__cpu_isa *const ampc__cpu_isa_avx512 = &isa_avx512;
#else
const ampc__cpu_isa *const ampc__cpu_isa_avx512 = NULL;
#endif

const ampc__cpu_isa *ampc__cpu_isa_best(void) {
  if (ampc__cpu_isa_avx512 && ampc__cpu_has_avx512()) return ampc__cpu_isa_avx512;
  if (ampc__cpu_isa_avx2 && ampc__cpu_has_avx2_f16c()) return ampc__cpu_isa_avx2;
  return &ampc__cpu_isa_baseline;
}

/* ---- chunks over spans ---- */

static size_t span_chunks(const ampc__span *s) { return (s->n + STEP_CHUNK - 1) / STEP_CHUNK; }

static size_t count_chunks(const ampc__span *s, int ns) {
  size_t n = 0;
  for (int i = 0; i < ns; i++) n += span_chunks(&s[i]);
  return n;
}

/* Chunk k of the spans: its span and its first element and length there. */
static const ampc__span *chunk_at(const ampc__span *s, int ns, size_t k, size_t *off, size_t *len) {
  for (int i = 0; i < ns; i++) {
    size_t c = span_chunks(&s[i]);
    if (k < c) {
      *off = k * STEP_CHUNK;
      *len = s[i].n - *off < STEP_CHUNK ? s[i].n - *off : STEP_CHUNK;
      return &s[i];
    }
    k -= c;
  }
  AMPC_ASSERT(0);
  return NULL;
}

/* The f32 view of grad[off, off + len) of a span (tmp: len floats). */
static const float *grad_f32(const ampc__span *s, size_t off, size_t len, float *tmp) {
  if (s->grad_type == AMPC_DTYPE_F32) return (const float *)s->grad + off;
  ampc_load_f32(tmp, s->grad_type, (const char *)s->grad + off * ampc_dtype_size(s->grad_type), len);
  return tmp;
}

static float *thread_scratch(ampc__cpu_dev *cd) {
  return cd->scratch + (size_t)omp_get_thread_num() * 2 * STEP_CHUNK;
}

/* The per-chunk sums: grown once to the largest chunk count seen. */
static ampc_status need_partial(ampc__cpu_dev *cd, size_t n) {
  if (n <= cd->npartial) return AMPC_OK;
  double *p = realloc(cd->partial, n * sizeof *p);
  if (!p) return ampc__error(AMPC_ENOMEM, "cpu: out of memory for %zu partial sums", n);
  cd->partial = p;
  cd->npartial = n;
  return AMPC_OK;
}

/* The chunk loops of the check, the fold and the overflow report, written
 * with 8-float vectors and built for AVX-512, AVX2 and the baseline
 * (CPU_VECTOR) like the other kernels. Every build does the same IEEE
 * operations in the same order, so they give the same bits: the squares are
 * exact in double (a contracted one is the same sum) and the fold's product
 * and sum stay two roundings (contraction off there). */
typedef float step_v8 __attribute__((vector_size(32), aligned(4), may_alias));
typedef int step_v8i __attribute__((vector_size(32)));
typedef double step_v4d __attribute__((vector_size(32)));
/* m > mx ? m : mx per lane (a NaN m never wins) */
#define STEP_MAX8(mx, m) ((step_v8)(((step_v8i)(m) & ((m) > (mx))) | ((step_v8i)(mx) & ~((m) > (mx)))))

/* Sums of squares in 16 partial sums (element i into sum i % 16, the four
 * quarters added pairwise at the end) so that the adds pipeline, and the
 * largest |v| (a NaN never wins); returns whether a value is not finite. */
CPU_VECTOR static int check_chunk(const float *gv, size_t n, float gmul, double *sumsq, float *maxabs) {
  step_v4d acc[4] = {{0}, {0}, {0}, {0}};
  step_v8 mx = {0};
  step_v8i bad = {0};
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int h = 0; h < 2; h++) {
      step_v8 v = *(const step_v8 *)(gv + i + 8 * h) * gmul;
      step_v8 m = (step_v8)((step_v8i)v & 0x7fffffff);
      bad |= ~(m <= FLT_MAX);
      mx = STEP_MAX8(mx, m);
      step_v4d lo = __builtin_convertvector(__builtin_shufflevector(v, v, 0, 1, 2, 3), step_v4d);
      step_v4d hi = __builtin_convertvector(__builtin_shufflevector(v, v, 4, 5, 6, 7), step_v4d);
      acc[2 * h] += lo * lo;
      acc[2 * h + 1] += hi * hi;
    }
  float mt = 0.0f;
  int bt = 0;
  for (; i < n; i++) {
    float v = gv[i] * gmul, m = fabsf(v);
    bt |= !(m <= FLT_MAX);
    acc[(i % 16) / 4][i % 4] += (double)v * v;
    mt = m > mt ? m : mt;
  }
  for (int k = 0; k < 8; k++) {
    bt |= bad[k] != 0;
    mt = mx[k] > mt ? mx[k] : mt;
  }
  step_v4d t = (acc[0] + acc[1]) + (acc[2] + acc[3]);
  *sumsq = (t[0] + t[1]) + (t[2] + t[3]);
  *maxabs = mt;
  return bt;
}

#if defined(__GNUC__) && !defined(__clang__)
#define STEP_NO_CONTRACT __attribute__((optimize("fp-contract=off")))
#else
#define STEP_NO_CONTRACT
#endif
/* o (+)= v * mul; returns whether a value is not finite, *maxabs the largest |v| */
STEP_NO_CONTRACT CPU_VECTOR static int fold_chunk(const float *gv, size_t n, float mul, int accumulate, float *o,
                                                  float *maxabs) {
  step_v8 mx = {0};
  step_v8i bad = {0};
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    step_v8 v = *(const step_v8 *)(gv + i), m = (step_v8)((step_v8i)v & 0x7fffffff), p = v * mul;
    bad |= ~(m <= FLT_MAX);
    mx = STEP_MAX8(mx, m);
    if (accumulate) p = *(const step_v8 *)(o + i) + p;
    *(step_v8 *)(o + i) = p;
  }
  float mt = 0.0f;
  int bt = 0;
  for (; i < n; i++) {
    float v = gv[i], m = fabsf(v), p = v * mul;
    bt |= !(m <= FLT_MAX);
    mt = m > mt ? m : mt;
    o[i] = accumulate ? o[i] + p : p;
  }
  for (int k = 0; k < 8; k++) {
    bt |= bad[k] != 0;
    mt = mx[k] > mt ? mx[k] : mt;
  }
  *maxabs = mt;
  return bt;
}

CPU_VECTOR static int nonfinite_chunk(const float *gv, size_t n, float gmul) {
  step_v8i bad = {0};
  size_t i = 0;
  for (; i + 8 <= n; i += 8) bad |= ~((step_v8)((step_v8i)(*(const step_v8 *)(gv + i) * gmul) & 0x7fffffff) <= FLT_MAX);
  int bt = 0;
  for (; i < n; i++) bt |= !(fabsf(gv[i] * gmul) <= FLT_MAX);
  for (int k = 0; k < 8; k++) bt |= bad[k] != 0;
  return bt;
}

ampc_status ampc__cpu_check(ampc__device *d, const ampc__span *s, int ns, float gmul, int want_max, const float *slots,
                            int nslots, float *slots_out, ampc__check *out) {
  ampc__cpu_dev *cd = d->impl;
  size_t nch = count_chunks(s, ns);
  AMPC_TRY(need_partial(cd, nch));
  double *partial = cd->partial;
  int any_inf = 0;
  float mx = 0.0f;
#pragma omp parallel for num_threads(cd->ctx.nthreads) schedule(static) reduction(| : any_inf) reduction(max : mx)
  for (size_t ci = 0; ci < nch; ci++) {
    size_t off, n;
    const ampc__span *sp = chunk_at(s, ns, ci, &off, &n);
    const float *gv = grad_f32(sp, off, n, thread_scratch(cd));
    float m;
    any_inf |= check_chunk(gv, n, gmul, &partial[ci], &m);
    if (want_max) mx = m > mx ? m : mx;
  }
  double t = 0.0;
  for (size_t ci = 0; ci < nch; ci++) t += partial[ci]; /* fixed order */
  out->found_inf = any_inf;
  out->sumsq = t;
  out->max_abs = mx;
  if (nslots > 0) memcpy(slots_out, slots, (size_t)nslots * sizeof *slots);
  return AMPC_OK;
}

ampc_status ampc__cpu_fold(ampc__device *d, const ampc__span *s, int ns, float *dst, float mul, int accumulate,
                           float *slot, float max_div) {
  ampc__cpu_dev *cd = d->impl;
  size_t nch = count_chunks(s, ns);
  int any_inf = 0;
  float mx = 0.0f;
#pragma omp parallel for num_threads(cd->ctx.nthreads) schedule(static) reduction(| : any_inf) reduction(max : mx)
  for (size_t ci = 0; ci < nch; ci++) {
    size_t off, n;
    const ampc__span *sp = chunk_at(s, ns, ci, &off, &n);
    const float *gv = grad_f32(sp, off, n, thread_scratch(cd));
    float m;
    any_inf |= fold_chunk(gv, n, mul, accumulate, dst + sp->start + off, &m);
    mx = m > mx ? m : mx;
  }
  if (any_inf) slot[0] = 1.0f;
  if (isfinite(mx) && mx / max_div > slot[1]) slot[1] = mx / max_div;
  return AMPC_OK;
}

ampc_status ampc__cpu_nonfinite(ampc__device *d, const ampc__span *s, int ns, const size_t *ranges, size_t nranges,
                                float gmul, unsigned char *flags) {
  ampc__cpu_dev *cd = d->impl;
#pragma omp parallel for num_threads(cd->ctx.nthreads) schedule(dynamic, 1)
  for (size_t r = 0; r < nranges; r++) {
    size_t start = ranges[2 * r], n = ranges[2 * r + 1];
    flags[r] = 0;
    for (int i = 0; i < ns; i++) {
      if (start < s[i].start || start + n > s[i].start + s[i].n) continue;
      float *tmp = thread_scratch(cd);
      for (size_t o = 0; o < n && !flags[r]; o += STEP_CHUNK) {
        size_t len = n - o < STEP_CHUNK ? n - o : STEP_CHUNK;
        const float *gv = grad_f32(&s[i], start - s[i].start + o, len, tmp);
        if (nonfinite_chunk(gv, len, gmul)) flags[r] = 1;
      }
      break;
    }
  }
  return AMPC_OK;
}

/* The optimizer on n f32 weights w (element `flat` of the numbering first). */
static void update_f32(const ampc__cpu_isa *isa, const ampc__update *u, size_t flat, size_t n, float *w, const float *g) {
  if (u->kind == AMPC_OPTIM_SGD)
    isa->sgd(&u->k, n, w, g, u->gmul, u->state[0] ? u->state[0] + flat : NULL);
  else
    isa->adam(&u->k, n, w, g, u->gmul, u->state[0] + flat, u->state[1] + flat, u->state[2] ? u->state[2] + flat : NULL);
}

ampc_status ampc__cpu_update(ampc__device *d, const ampc__span *s, int ns, const ampc__update *u) {
  ampc__cpu_dev *cd = d->impl;
  const ampc__cpu_isa *isa = cd->isa;
  size_t nch = count_chunks(s, ns);
#pragma omp parallel for num_threads(cd->ctx.nthreads) schedule(static)
  for (size_t ci = 0; ci < nch; ci++) {
    size_t off, n;
    const ampc__span *sp = chunk_at(s, ns, ci, &off, &n);
    size_t flat = sp->start + off, es = ampc_dtype_size(sp->type);
    float *scratch = thread_scratch(cd);
    const float *g = grad_f32(sp, off, n, scratch + STEP_CHUNK);
    char *model = sp->model ? (char *)sp->model + off * es : NULL;
    if (u->master) {
      /* f32 masters: update them and round each block into the model copy
       * while it is still in L1 */
      float *w = u->master + flat;
      for (size_t j = 0; j < n; j += STEP_BLOCK) {
        size_t len = n - j < STEP_BLOCK ? n - j : STEP_BLOCK;
        update_f32(isa, u, flat + j, len, w + j, g + j);
        if (model) ampc_store_f32(sp->type, model + j * es, w + j, len);
      }
    } else if (sp->type == AMPC_DTYPE_F32) {
      update_f32(isa, u, flat, n, (float *)model, g);
    } else {
      /* 16-bit weights without masters: update an f32 copy, round it back */
      float *w = scratch;
      ampc_load_f32(w, sp->type, model, n);
      update_f32(isa, u, flat, n, w, g);
      if (u->sr) {
        uint16_t *m16 = (uint16_t *)model;
        int is_f16 = sp->type == AMPC_DTYPE_F16;
        for (size_t i = 0; i < n; i++)
          m16[i] = ampc__round_stochastic(is_f16, w[i], ampc__rng_at(u->sr_seed, AMPC_RNG_STREAM_ROUNDING, u->sr_base + flat + i));
      } else {
        ampc_store_f32(sp->type, model, w, n);
      }
    }
  }
  return AMPC_OK;
}

size_t ampc__cpu_scratch_floats(int nthreads) { return (size_t)nthreads * 2 * STEP_CHUNK; }
