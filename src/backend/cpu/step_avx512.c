/* The optimizers' element kernels for AVX-512 (AVX512F): step.c's AVX2
 * kernels on 16 lanes, the same operations as ampc__sgd_one/ampc__adam_one
 * in the same order, so that they give the same bits; a tail of fewer than
 * 16 elements goes through those element functions. Only these functions
 * are compiled for AVX-512 (by attribute); step.c puts them in
 * ampc__cpu_isa_avx512, which a device takes only where the CPU runs them.
 *
 * Built with AMPC_AVX512_EMULATE (by tests/unit/test_avx512_emu.c, which
 * first provides the intrinsics from an emulation and renames the
 * functions), the same code runs on CPUs without AVX-512, so that the tests
 * check it everywhere. */
#include "backend/cpu/cpu_internal.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

#if defined(AMPC_AVX512_EMULATE)
#define STEP_AVX512 1
#define STEP_TARGET
/* The emulated vector is no register operand: a trip through memory rounds
 * it just as well. */
#define KEEP_ROUNDED_512(x) __asm__("" : "+m"(x))
#elif defined(AMPC__CPU_AVX512)
#include <immintrin.h>
#define STEP_AVX512 1
#define STEP_TARGET __attribute__((target("avx512f")))
/* AMPC__KEEP_ROUNDED for a zmm register: this file is compiled with
 * -ffp-contract=fast, which would fuse AdamW's w * decay into the add that
 * ends the update, where torch rounds the product first. */
#define KEEP_ROUNDED_512(x) __asm__("" : "+v"(x))
#else
#define STEP_AVX512 0
#endif

#if STEP_AVX512

/* The constants are copied out of k so that stores through w/buf (which the
 * compiler must assume may alias k) do not reload them. */
STEP_TARGET void ampc__cpu_sgd_avx512(const ampc__optim_consts *k, size_t n, float *w, const float *g, float gmul,
                                      float *buf) {
  const int has_wd = k->weight_decay != 0.0f, has_mom = k->momentum != 0.0f;
  const int first = k->first, nesterov = k->nesterov;
  const __m512 vgmul = _mm512_set1_ps(gmul), vwd = _mm512_set1_ps(k->weight_decay);
  const __m512 vmom = _mm512_set1_ps(k->momentum), vomd = _mm512_set1_ps(k->one_minus_dampening);
  const __m512 vnlr = _mm512_set1_ps(k->neg_lr);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 x = _mm512_loadu_ps(w + i);
    __m512 d = _mm512_mul_ps(_mm512_loadu_ps(g + i), vgmul);
    if (has_wd) d = _mm512_fmadd_ps(x, vwd, d);
    if (has_mom) {
      __m512 b = d;
      if (!first) b = _mm512_fmadd_ps(d, vomd, _mm512_mul_ps(_mm512_loadu_ps(buf + i), vmom));
      _mm512_storeu_ps(buf + i, b);
      d = nesterov ? _mm512_fmadd_ps(b, vmom, d) : b;
    }
    _mm512_storeu_ps(w + i, _mm512_fmadd_ps(d, vnlr, x));
  }
  for (; i < n; i++) w[i] = ampc__sgd_one(k, w[i], g[i] * gmul, buf ? buf + i : NULL);
}

STEP_TARGET void ampc__cpu_adam_avx512(const ampc__optim_consts *k, size_t n, float *w, const float *g, float gmul,
                                       float *m, float *v, float *vmax) {
  const int decoupled = k->decoupled, has_wd = k->weight_decay != 0.0f;
  const __m512 vgmul = _mm512_set1_ps(gmul), vwd = _mm512_set1_ps(k->weight_decay);
  const __m512 vdecay = _mm512_set1_ps(k->decay);
  const __m512 vb1 = _mm512_set1_ps(k->beta1), vomb1 = _mm512_set1_ps(k->one_minus_beta1);
  const __m512 vb2 = _mm512_set1_ps(k->beta2), vomb2 = _mm512_set1_ps(k->one_minus_beta2);
  const __m512 vbc2 = _mm512_set1_ps(k->bias_correction2_sqrt), veps = _mm512_set1_ps(k->eps);
  const __m512 vnss = _mm512_set1_ps(k->neg_step_size);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 x = _mm512_loadu_ps(w + i);
    __m512 d = _mm512_mul_ps(_mm512_loadu_ps(g + i), vgmul);
    if (decoupled) {
      x = _mm512_mul_ps(x, vdecay);
      KEEP_ROUNDED_512(x);
    } else if (has_wd) {
      d = _mm512_fmadd_ps(x, vwd, d);
    }
    __m512 mm = _mm512_fmadd_ps(d, vomb1, _mm512_mul_ps(_mm512_loadu_ps(m + i), vb1));
    _mm512_storeu_ps(m + i, mm);
    __m512 vv = _mm512_fmadd_ps(_mm512_mul_ps(vomb2, d), d, _mm512_mul_ps(_mm512_loadu_ps(v + i), vb2));
    _mm512_storeu_ps(v + i, vv);
    if (vmax) {
      /* torch.maximum: the new value where it is larger or NaN */
      __m512 cur = _mm512_loadu_ps(vmax + i);
      __mmask16 take = (__mmask16)(_mm512_cmp_ps_mask(cur, vv, _CMP_LT_OQ) | _mm512_cmp_ps_mask(vv, vv, _CMP_UNORD_Q));
      cur = _mm512_mask_blend_ps(take, cur, vv);
      _mm512_storeu_ps(vmax + i, cur);
      vv = cur;
    }
    __m512 den = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vv), vbc2), veps);
    x = _mm512_add_ps(x, _mm512_div_ps(_mm512_mul_ps(vnss, mm), den));
    _mm512_storeu_ps(w + i, x);
  }
  for (; i < n; i++) w[i] = ampc__adam_one(k, w[i], g[i] * gmul, m + i, v + i, vmax ? vmax + i : NULL);
}

#endif
