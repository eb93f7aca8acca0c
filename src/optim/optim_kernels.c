/* Element kernels for SGD and Adam/AdamW, in torch 1.13's order of roundings.
 *
 * torch's single-tensor step is a sequence of tensor ops, each rounding to
 * f32; on its AVX2/AVX-512 CPU kernels add(x, alpha=a) is fma(x, a, self) and
 * addcmul(t1, t2, value=s) is fma(s*t1, t2, self), while mul, div, sqrt,
 * add(scalar) and addcdiv (self + (s*t1)/t2) round each operation. Each line
 * below is one of those roundings; keep every product in its own statement so
 * that no compiler contracts it into an FMA torch does not do (GCC does not
 * contract in ISO C mode; clang is told by the pragma). The one product that
 * feeds an add (AdamW's w * decay) also goes through KEEP_ROUNDED, so that
 * -ffp-contract=fast (GNU C modes) cannot fuse it either. */
#include <math.h>
#include <stddef.h>

#include "optim/optim_internal.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define AMPC_OPTIM_HAVE_AVX2 1
#include <immintrin.h>
#endif

/* An empty asm that claims to change x: the compiler must materialise the
 * rounded value, so it cannot fuse the product into the next add. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define KEEP_ROUNDED(x) __asm__("" : "+x"(x))
#else
#define KEEP_ROUNDED(x) ((void)0)
#endif

/* One SGD element. g already carries gmul. buf: NULL without momentum. */
static inline float sgd_one(const ampc__optim_consts *k, float w, float g, float *buf) {
  if (k->weight_decay != 0.0f) g = fmaf(w, k->weight_decay, g); /* d_p.add(param, alpha=wd) */
  if (k->momentum != 0.0f) {
    float b;
    if (k->first) {
      b = g; /* torch.clone(d_p) */
    } else {
      b = *buf * k->momentum;                  /* buf.mul_(momentum) */
      b = fmaf(g, k->one_minus_dampening, b); /* .add_(d_p, alpha=1-dampening) */
    }
    *buf = b;
    g = k->nesterov ? fmaf(b, k->momentum, g) : b; /* d_p.add(buf, alpha=momentum) */
  }
  return fmaf(g, k->neg_lr, w); /* param.add_(d_p, alpha=-lr) */
}

/* One Adam/AdamW element; returns the new weight. */
static inline float adam_one(const ampc__optim_consts *k, float w, float g, float *m, float *v,
                             float *vmax) {
  if (k->decoupled) {
    w = w * k->decay; /* param.mul_(1 - lr*wd) */
    KEEP_ROUNDED(w);
  } else if (k->weight_decay != 0.0f) {
    g = fmaf(w, k->weight_decay, g); /* grad.add(param, alpha=wd) */
  }
  float mm = *m * k->beta1;            /* exp_avg.mul_(beta1) */
  mm = fmaf(g, k->one_minus_beta1, mm); /* .add_(grad, alpha=1-beta1) */
  *m = mm;
  float vv = *v * k->beta2;            /* exp_avg_sq.mul_(beta2) */
  float sg = k->one_minus_beta2 * g;   /* .addcmul_(grad, grad, value=1-beta2) */
  vv = fmaf(sg, g, vv);
  *v = vv;
  if (vmax) { /* torch.maximum(max_exp_avg_sq, exp_avg_sq): NaN propagates */
    float cur = *vmax;
    if (cur < vv || vv != vv) cur = vv;
    *vmax = cur;
    vv = cur;
  }
  float den = sqrtf(vv);
  den = den / k->bias_correction2_sqrt; /* .sqrt() / bias_correction2_sqrt */
  den = den + k->eps;                   /* .add_(eps) */
  float u = k->neg_step_size * *m;      /* param.addcdiv_(exp_avg, denom, value=-step_size) */
  u = u / den;
  return w + u;
}

static void sgd_scalar(const ampc__optim_consts *k, size_t n, float *w, const float *g, float gmul,
                       float *buf) {
  for (size_t i = 0; i < n; i++) w[i] = sgd_one(k, w[i], g[i] * gmul, buf ? buf + i : NULL);
}

static void adam_scalar(const ampc__optim_consts *k, size_t n, float *w, const float *g, float gmul,
                        float *m, float *v, float *vmax) {
  for (size_t i = 0; i < n; i++)
    w[i] = adam_one(k, w[i], g[i] * gmul, m + i, v + i, vmax ? vmax + i : NULL);
}

const ampc__optim_kernels ampc__optim_kernels_scalar = {"scalar", sgd_scalar, adam_scalar};

#ifdef AMPC_OPTIM_HAVE_AVX2

/* 8 lanes at a time, the same operations as sgd_one; the tail goes through
 * sgd_one itself. The constants are copied out of k so that stores through
 * w/buf (which the compiler must assume may alias k) do not reload them. */
__attribute__((target("avx2,fma"))) static void sgd_avx2(const ampc__optim_consts *k, size_t n,
                                                         float *w, const float *g, float gmul,
                                                         float *buf) {
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
  for (; i < n; i++) w[i] = sgd_one(k, w[i], g[i] * gmul, buf ? buf + i : NULL);
}

__attribute__((target("avx2,fma"))) static void adam_avx2(const ampc__optim_consts *k, size_t n,
                                                          float *w, const float *g, float gmul,
                                                          float *m, float *v, float *vmax) {
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
      KEEP_ROUNDED(x);
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
  for (; i < n; i++)
    w[i] = adam_one(k, w[i], g[i] * gmul, m + i, v + i, vmax ? vmax + i : NULL);
}

static const ampc__optim_kernels optim_kernels_avx2 = {"avx2", sgd_avx2, adam_avx2};
const ampc__optim_kernels *const ampc__optim_kernels_avx2 = &optim_kernels_avx2;

#else
const ampc__optim_kernels *const ampc__optim_kernels_avx2 = NULL;
#endif
