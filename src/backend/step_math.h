/*
 * step_math.h -- the arithmetic of the training step, written once for every
 * backend: the optimizers' element updates (torch 1.13's order of roundings),
 * stochastic rounding, and the counter-based generator it draws from.
 *
 * Every function here is a pure function of its arguments, inline, in the
 * subset of C that CUDA's compiler also takes (AMPC__HD marks them for the
 * device there), so the CPU tests of these formulas check the GPU's
 * arithmetic too.
 *
 * torch's single-tensor step is a sequence of tensor ops, each rounding to
 * f32; on its AVX2/AVX-512 CPU kernels add(x, alpha=a) is fma(x, a, self) and
 * addcmul(t1, t2, value=s) is fma(s*t1, t2, self), while mul, div, sqrt,
 * add(scalar) and addcdiv (self + (s*t1)/t2) round each operation. Each line
 * below is one of those roundings; keep every product in its own statement so
 * that no compiler contracts it into an FMA torch does not do (files that
 * include this header are compiled without contraction: GCC does not
 * contract in ISO C mode, clang is told by the pragma in the including
 * file). The one product that feeds an add (AdamW's w * decay) also goes
 * through AMPC__KEEP_ROUNDED, so that -ffp-contract=fast cannot fuse it.
 */
#ifndef AMPC_BACKEND_STEP_MATH_H
#define AMPC_BACKEND_STEP_MATH_H

#include <math.h>
#include <stdint.h>

#include "core/dtype_internal.h"
#include "core/rng_internal.h" /* AMPC__HD, ampc__rng_at */

/* An empty asm that claims to change x: the compiler must materialise the
 * rounded value, so it cannot fuse the product into the next add. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDA_ARCH__)
#define AMPC__KEEP_ROUNDED(x) __asm__("" : "+x"(x))
#else
#define AMPC__KEEP_ROUNDED(x) ((void)0)
#endif

/* The per-step constants of an optimizer, fixed by its begin_step. Every
 * value is f32 because torch's CPU kernels cast their Python-float arguments
 * to the tensor type; the ones torch derives in Python (1 - beta1,
 * lr / bias_correction1, ...) are computed in double first, as there. */
typedef struct {
  float neg_lr;               /* SGD: w += neg_lr * d */
  float weight_decay;         /* L2 term g += wd * w (SGD, Adam); 0 = skipped, as torch does */
  float momentum;             /* SGD; 0 = no buffer */
  float one_minus_dampening;  /* SGD */
  int nesterov;               /* SGD */
  int first;                  /* SGD: this is step 1, the buffer starts as the gradient */
  int decoupled;              /* AdamW: w *= decay first */
  int amsgrad;
  float decay;                /* AdamW: 1 - lr * weight_decay */
  float beta1, one_minus_beta1, beta2, one_minus_beta2;
  float neg_step_size;        /* -lr / (1 - beta1^t) */
  float bias_correction2_sqrt; /* sqrt(1 - beta2^t) */
  float eps;
} ampc__optim_consts;

/* One SGD element. g already carries the gradient multiplier. buf: NULL
 * without momentum. */
AMPC__HD float ampc__sgd_one(const ampc__optim_consts *k, float w, float g, float *buf) {
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

/* One Adam/AdamW element; returns the new weight. vmax: NULL unless amsgrad. */
AMPC__HD float ampc__adam_one(const ampc__optim_consts *k, float w, float g, float *m, float *v, float *vmax) {
  if (k->decoupled) {
    w = w * k->decay; /* param.mul_(1 - lr*wd) */
    AMPC__KEEP_ROUNDED(w);
  } else if (k->weight_decay != 0.0f) {
    g = fmaf(w, k->weight_decay, g); /* grad.add(param, alpha=wd) */
  }
  float mm = *m * k->beta1;             /* exp_avg.mul_(beta1) */
  mm = fmaf(g, k->one_minus_beta1, mm); /* .add_(grad, alpha=1-beta1) */
  *m = mm;
  float vv = *v * k->beta2;          /* exp_avg_sq.mul_(beta2) */
  float sg = k->one_minus_beta2 * g; /* .addcmul_(grad, grad, value=1-beta2) */
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

/* Rounds w to a 16-bit type (f16 if is_f16, else bf16) stochastically: to
 * the neighbour of larger magnitude with probability equal to w's distance
 * from the smaller one (in units of their gap), using 24 bits of r. Values
 * that are exact, non-finite, or whose other neighbour would be infinite
 * round to nearest. */
AMPC__HD uint16_t ampc__round_stochastic(int is_f16, float w, uint64_t r) {
  uint16_t near = is_f16 ? ampc__f32_to_f16_inline(w) : ampc__f32_to_bf16_inline(w);
  float nv = is_f16 ? ampc__f16_to_f32_inline(near) : ampc__bf16_to_f32_inline(near);
  if (nv == w || !isfinite(w) || !isfinite(nv)) return near;
  /* the neighbour on the other side of w, by stepping the magnitude */
  uint16_t other = fabsf(nv) > fabsf(w) ? (uint16_t)(near - 1) : (uint16_t)(near + 1);
  if ((near & 0x7fff) == 0) other = (uint16_t)((w < 0 ? 0x8000u : 0u) | 1u);
  float ov = is_f16 ? ampc__f16_to_f32_inline(other) : ampc__bf16_to_f32_inline(other);
  if (!isfinite(ov)) return near;
  float lo = fabsf(nv) < fabsf(ov) ? nv : ov, hi = lo == nv ? ov : nv;
  uint16_t lo_b = lo == nv ? near : other, hi_b = lo == nv ? other : near;
  float pr = (fabsf(w) - fabsf(lo)) / (fabsf(hi) - fabsf(lo)); /* chance of the larger magnitude */
  float u = (float)(r >> 40) * (1.0f / 16777216.0f);
  return u < pr ? hi_b : lo_b;
}

#endif
