/* AVX-512 bulk conversions (AVX512F, with BW and VL for the 16-bit masked
 * loads and stores). As in dtype_avx2.c, only these functions are compiled
 * for the features (by attribute), so the rest of the library runs on any
 * x86-64; dtype.c calls them only when ampc__cpu_has_avx512().
 *
 * f16 uses the EVEX forms of the F16C conversions, which give the same
 * results as the VEX ones (the rule in dtype_internal.h: round to nearest
 * even by an explicit rounding mode, subnormals kept, NaN quieted with its
 * leading payload bits). bf16 is the scalar code's integer arithmetic on 16
 * lanes, with the NaN lanes picked by a mask. A tail of fewer than 16 values
 * takes masked loads and stores: the body's instructions on fewer lanes,
 * touching no memory past the end of either array.
 *
 * Built with AMPC_AVX512_EMULATE (by tests/unit/test_avx512_emu.c, which
 * first provides the intrinsics from an emulation and renames the
 * functions), the same code runs on CPUs without AVX-512, so that the tests
 * check it everywhere. */
#include <stdatomic.h>

#include "core/dtype_internal.h"

#if defined(AMPC_AVX512_EMULATE)
#define AMPC__AVX512
#define AMPC__DTYPE_AVX512 1
#elif AMPC__DTYPE_X86
#include <immintrin.h>
#define AMPC__AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#define AMPC__DTYPE_AVX512 1
#else
#define AMPC__DTYPE_AVX512 0
#endif

#if AMPC__DTYPE_AVX512

/* The first r lanes (0 < r < 16). */
static inline __mmask16 tail_mask(size_t r) { return (__mmask16)((1u << r) - 1u); }

AMPC__AVX512 void ampc__f16_to_f32_n_avx512(float *dst, const uint16_t *src, size_t n) {
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i))));
    _mm512_storeu_ps(dst + i + 16, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i + 16))));
  }
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i))));
  if (i < n) {
    __mmask16 k = tail_mask(n - i);
    _mm512_mask_storeu_ps(dst + i, k, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, src + i)));
  }
}

AMPC__AVX512 void ampc__f32_to_f16_n_avx512(uint16_t *dst, const float *src, size_t n) {
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    _mm256_storeu_si256((__m256i *)(dst + i), _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    _mm256_storeu_si256((__m256i *)(dst + i + 16),
                        _mm512_cvtps_ph(_mm512_loadu_ps(src + i + 16), _MM_FROUND_TO_NEAREST_INT));
  }
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256((__m256i *)(dst + i), _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
  if (i < n) {
    __mmask16 k = tail_mask(n - i);
    _mm256_mask_storeu_epi16(dst + i, k, _mm512_cvtps_ph(_mm512_maskz_loadu_ps(k, src + i), _MM_FROUND_TO_NEAREST_INT));
  }
}

AMPC__AVX512 void ampc__f16_round_n_avx512(float *p, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(p + i, _mm512_cvtph_ps(_mm512_cvtps_ph(_mm512_loadu_ps(p + i), _MM_FROUND_TO_NEAREST_INT)));
  if (i < n) {
    __mmask16 k = tail_mask(n - i);
    _mm512_mask_storeu_ps(p + i, k,
                          _mm512_cvtph_ps(_mm512_cvtps_ph(_mm512_maskz_loadu_ps(k, p + i), _MM_FROUND_TO_NEAREST_INT)));
  }
}

/* 16 bf16 -> 16 f32 bit patterns: widen, shift into the top half, quiet the
 * NaNs (|x| > inf as signed 32-bit compares: both sides are non-negative). */
AMPC__AVX512 static inline __m512i bf16_to_f32_16(__m256i h) {
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
  const __m512i quiet = _mm512_set1_epi32((int)AMPC__F32_QUIET);
  __m512i u = _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16);
  __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, abs_mask), inf);
  return _mm512_mask_or_epi32(u, nan, u, quiet);
}

AMPC__AVX512 void ampc__bf16_to_f32_n_avx512(float *dst, const uint16_t *src, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_si512(dst + i, bf16_to_f32_16(_mm256_loadu_si256((const __m256i *)(src + i))));
  if (i < n) {
    __mmask16 k = tail_mask(n - i);
    _mm512_mask_storeu_ps(dst + i, k, _mm512_castsi512_ps(bf16_to_f32_16(_mm256_maskz_loadu_epi16(k, src + i))));
  }
}

/* 16 f32 bit patterns -> 16 bf16 (AMPC__BF16_RNE512), each lane's top half,
 * narrowed. */
AMPC__AVX512 static inline __m256i f32_to_bf16_16(__m512i u) { return AMPC__BF16_CODES512(u); }

#if !defined(AMPC_AVX512_EMULATE)
/* Where the CPU has avx512_bf16, its conversion instruction (vcvtneps2bf16)
 * rounds as AMPC__BF16_RNE512 does -- ties to even, a NaN quieted with its
 * leading payload bits -- except that it flushes subnormal inputs to zero
 * (measured on every f32 pattern on a Zen 4), and it ignores MXCSR: a
 * vector holding a subnormal takes the integer rounding instead. One
 * instruction a vector where the integer rounding takes nine. test_dtype
 * checks both ways on every f32 pattern where the CPU has the instruction. */
#define AMPC__AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c")))
AMPC__AVX512BF16 static inline __m256i f32_to_bf16_16_ins(__m512 v) {
  /* subnormal: exponent field 0, mantissa not (integer tests: the FP ones
   * would see zeros under MXCSR's DAZ, which the instruction ignores) */
  __m512i u = _mm512_castps_si512(v);
  __mmask16 sub = _mm512_testn_epi32_mask(u, _mm512_set1_epi32(0x7f800000)) & _mm512_test_epi32_mask(u, _mm512_set1_epi32(0x007fffff));
  if (sub) return f32_to_bf16_16(u);
  return (__m256i)_mm512_cvtneps_pbh(v);
}
AMPC__AVX512BF16 static void f32_to_bf16_n_ins(uint16_t *dst, const float *src, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) _mm256_storeu_si256((__m256i *)(dst + i), f32_to_bf16_16_ins(_mm512_loadu_ps(src + i)));
  if (i < n) {
    __mmask16 k = tail_mask(n - i);
    _mm256_mask_storeu_epi16(dst + i, k, f32_to_bf16_16_ins(_mm512_maskz_loadu_ps(k, src + i)));
  }
}

int ampc__convert_bf16_instruction = 1;
int ampc__cpu_has_avx512_bf16(void) {
  static _Atomic int has = -1;
  int h = atomic_load_explicit(&has, memory_order_relaxed);
  if (h < 0) { /* (a racing first call stores the same value) */
    __builtin_cpu_init();
    /* x86-64-v4's AVX-512 set, named one by one (clang knows no "x86-64-v4"
     * here); ampc__cpu_has_avx512 adds AVX2, FMA and F16C, and the OS's
     * saving of the state */
    h = ampc__cpu_has_avx512() && __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512bf16");
    atomic_store_explicit(&has, h, memory_order_relaxed);
  }
  return h;
}
#endif

AMPC__AVX512 void ampc__f32_to_bf16_n_avx512(uint16_t *dst, const float *src, size_t n) {
#if !defined(AMPC_AVX512_EMULATE)
  if (ampc__convert_bf16_instruction && ampc__cpu_has_avx512_bf16()) {
    f32_to_bf16_n_ins(dst, src, n);
    return;
  }
#endif
  size_t i = 0;
  for (; i + 16 <= n; i += 16) _mm256_storeu_si256((__m256i *)(dst + i), f32_to_bf16_16(_mm512_loadu_si512(src + i)));
  if (i < n) {
    __mmask16 k = tail_mask(n - i);
    _mm256_mask_storeu_epi16(dst + i, k, f32_to_bf16_16(_mm512_castps_si512(_mm512_maskz_loadu_ps(k, src + i))));
  }
}

/* 16 f32 bit patterns rounded to bf16 and widened back: what widening the
 * narrowed codes gives, its NaNs already quiet. */
AMPC__AVX512 static inline __m512i bf16_round_16(__m512i u) { return AMPC__BF16_WIDE512(u); }

AMPC__AVX512 void ampc__bf16_round_n_avx512(float *p, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_si512(p + i, bf16_round_16(_mm512_loadu_si512(p + i)));
  if (i < n) {
    __mmask16 k = tail_mask(n - i);
    _mm512_mask_storeu_ps(p + i, k, _mm512_castsi512_ps(bf16_round_16(_mm512_castps_si512(_mm512_maskz_loadu_ps(k, p + i)))));
  }
}

#endif
