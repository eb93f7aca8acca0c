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

const ampc__cpu_isa ampc__cpu_isa_baseline = {"baseline", 0, sgd_scalar, adam_scalar};
#ifdef STEP_HAVE_AVX2
static const ampc__cpu_isa isa_avx2 = {"avx2+fma+f16c", 1, sgd_avx2, adam_avx2};
const ampc__cpu_isa *const ampc__cpu_isa_avx2 = &isa_avx2;
#else
const ampc__cpu_isa *const ampc__cpu_isa_avx2 = NULL;
#endif

#ifdef AMPC__CPU_AVX512
/* AVX-512 CPUs have AVX2, FMA and F16C (ampc__cpu_has_avx512 checks), so the
 * kernels outside the step take their AVX2 code here too. */
static const ampc__cpu_isa isa_avx512 = {"avx512", 1, ampc__cpu_sgd_avx512, ampc__cpu_adam_avx512};
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
    /* four partial sums (element i into sum i % 4, added in order at the
     * end) and no branches, so that the pass pipelines */
    double s4[4] = {0.0, 0.0, 0.0, 0.0};
    float m4[4] = {0.0f, 0.0f, 0.0f, 0.0f}; /* the largest |v| (a NaN never wins) */
    int bad = 0;
    size_t i = 0;
    for (; i + 4 <= n; i += 4)
      for (int k = 0; k < 4; k++) {
        float v = gv[i + k] * gmul, m = fabsf(v);
        bad |= !(m <= FLT_MAX);
        s4[k] += (double)v * v;
        m4[k] = m > m4[k] ? m : m4[k];
      }
    for (; i < n; i++) {
      float v = gv[i] * gmul, m = fabsf(v);
      bad |= !(m <= FLT_MAX);
      s4[0] += (double)v * v;
      m4[0] = m > m4[0] ? m : m4[0];
    }
    for (int k = 0; k < 4 && want_max; k++) mx = m4[k] > mx ? m4[k] : mx;
    partial[ci] = (s4[0] + s4[1]) + (s4[2] + s4[3]);
    any_inf |= bad;
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
    float *o = dst + sp->start + off;
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
      float v = gv[i];
      if (!isfinite(v)) bad = 1;
      float m = fabsf(v);
      if (m > mx) mx = m;
      o[i] = accumulate ? o[i] + v * mul : v * mul;
    }
    any_inf |= bad;
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
        for (size_t e = 0; e < len; e++)
          if (!(fabsf(gv[e] * gmul) <= FLT_MAX)) flags[r] = 1;
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
