/* F16C/AVX2 bulk conversions. Only these functions are compiled for
 * AVX2/F16C/FMA (by attribute), so the rest of the library runs on any
 * x86-64; dtype.c calls them only when the CPU has the features.
 *
 * f16 uses the F16C instructions, whose results (round to nearest even with
 * an explicit rounding mode, subnormals kept, NaN quieted with its leading
 * payload bits) are the rule in dtype_internal.h. bf16 is integer arithmetic,
 * the scalar code eight lanes at a time. Tails go through a small zero-padded
 * buffer so they take the same instructions as the body. */
#include "core/dtype_internal.h"

#if AMPC__DTYPE_X86
#include <immintrin.h>

#define AMPC__AVX2 __attribute__((target("avx2,f16c,fma")))

AMPC__AVX2 void ampc__f16_to_f32_n_avx2(float *dst, const uint16_t *src, size_t n) {
  size_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (size_t j = 0; j < 32; j += 8)
      _mm256_storeu_ps(dst + i + j, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i + j))));
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
  if (i < n) {
    uint16_t in[8] = {0};
    float out[8];
    memcpy(in, src + i, (n - i) * sizeof *src);
    _mm256_storeu_ps(out, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)in)));
    memcpy(dst + i, out, (n - i) * sizeof *dst);
  }
}

AMPC__AVX2 void ampc__f32_to_f16_n_avx2(uint16_t *dst, const float *src, size_t n) {
  size_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (size_t j = 0; j < 32; j += 8)
      _mm_storeu_si128((__m128i *)(dst + i + j),
                       _mm256_cvtps_ph(_mm256_loadu_ps(src + i + j), _MM_FROUND_TO_NEAREST_INT));
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128((__m128i *)(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
  if (i < n) {
    float in[8] = {0};
    uint16_t out[8];
    memcpy(in, src + i, (n - i) * sizeof *src);
    _mm_storeu_si128((__m128i *)out, _mm256_cvtps_ph(_mm256_loadu_ps(in), _MM_FROUND_TO_NEAREST_INT));
    memcpy(dst + i, out, (n - i) * sizeof *dst);
  }
}

AMPC__AVX2 void ampc__f16_round_n_avx2(float *p, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(p + i, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(p + i), _MM_FROUND_TO_NEAREST_INT)));
  if (i < n) {
    float t[8] = {0};
    memcpy(t, p + i, (n - i) * sizeof *p);
    _mm256_storeu_ps(t, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(t), _MM_FROUND_TO_NEAREST_INT)));
    memcpy(p + i, t, (n - i) * sizeof *p);
  }
}

/* 16 bf16 -> 16 f32 (two vectors): widen, shift into the top half, quiet NaNs. */
AMPC__AVX2 static inline void bf16_to_f32_16(float *dst, __m256i h) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
  const __m256i quiet = _mm256_set1_epi32((int)AMPC__F32_QUIET);
  __m256i lo = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(h)), 16);
  __m256i hi = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_extracti128_si256(h, 1)), 16);
  /* |x| > inf as signed 32-bit compares: both sides are non-negative */
  lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_cmpgt_epi32(_mm256_and_si256(lo, abs_mask), inf), quiet));
  hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_cmpgt_epi32(_mm256_and_si256(hi, abs_mask), inf), quiet));
  _mm256_storeu_si256((__m256i *)dst, lo);
  _mm256_storeu_si256((__m256i *)(dst + 8), hi);
}

AMPC__AVX2 void ampc__bf16_to_f32_n_avx2(float *dst, const uint16_t *src, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) bf16_to_f32_16(dst + i, _mm256_loadu_si256((const __m256i *)(src + i)));
  if (i < n) {
    uint16_t in[16] = {0};
    float out[16];
    memcpy(in, src + i, (n - i) * sizeof *src);
    bf16_to_f32_16(out, _mm256_loadu_si256((const __m256i *)in));
    memcpy(dst + i, out, (n - i) * sizeof *dst);
  }
}

/* 8 f32 bit patterns -> 8 bf16 in the low half of each 32-bit lane (AMPC__BF16_RNE256). */
AMPC__AVX2 static inline __m256i f32_to_bf16_8(__m256i u) { return _mm256_srli_epi32(AMPC__BF16_RNE256(u), 16); }

/* 8 f32 rounded to bf16 and widened back. */
AMPC__AVX2 static inline __m256i bf16_round_8(__m256i u) { return AMPC__BF16_WIDE256(u); }

AMPC__AVX2 void ampc__bf16_round_n_avx2(float *p, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_si256((__m256i *)(p + i), bf16_round_8(_mm256_loadu_si256((const __m256i *)(p + i))));
  if (i < n) {
    float t[8] = {0};
    memcpy(t, p + i, (n - i) * sizeof *p);
    _mm256_storeu_si256((__m256i *)t, bf16_round_8(_mm256_loadu_si256((const __m256i *)t)));
    memcpy(p + i, t, (n - i) * sizeof *p);
  }
}

/* 16 f32 -> 16 bf16. packus works lane-wise (a0-3 b0-3 a4-7 b4-7); the
 * permute puts the quarters back in order. */
AMPC__AVX2 static inline __m256i f32_to_bf16_16(const float *src) {
  __m256i a = f32_to_bf16_8(_mm256_loadu_si256((const __m256i *)src));
  __m256i b = f32_to_bf16_8(_mm256_loadu_si256((const __m256i *)(src + 8)));
  return _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xd8);
}

AMPC__AVX2 void ampc__f32_to_bf16_n_avx2(uint16_t *dst, const float *src, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) _mm256_storeu_si256((__m256i *)(dst + i), f32_to_bf16_16(src + i));
  if (i < n) {
    float in[16] = {0};
    uint16_t out[16];
    memcpy(in, src + i, (n - i) * sizeof *src);
    _mm256_storeu_si256((__m256i *)out, f32_to_bf16_16(in));
    memcpy(dst + i, out, (n - i) * sizeof *dst);
  }
}

#endif
