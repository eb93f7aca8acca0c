/*
 * avx512_emu.h -- the AVX-512 intrinsics on any CPU, for test_avx512_emu.c:
 * SIMDe's portable versions (Debian: libsimde-dev), under the intrinsics'
 * own names, and the ones SIMDe 0.7.4 lacks, or emulates differently from
 * the instruction, written here from Intel's descriptions of the
 * instructions:
 *
 * - _mm512_fmadd_ps (vfmadd*ps): where the compiler is not told the CPU has
 *   FMA, SIMDe computes a * b + c with two roundings; the instruction rounds
 *   once, and the kernels' bits depend on it.
 * - _mm512_cvtph_ps, _mm512_cvtps_ph (vcvtph2ps, vcvtps2ph): the IEEE
 *   conversions between binary16 and binary32, exact when widening and
 *   rounded to nearest, ties to even, when narrowing (subnormals kept,
 *   overflow to infinity); a NaN keeps its sign, gets the quiet bit and
 *   keeps the leading bits of its payload. They are computed here from the
 *   formats' fields in double arithmetic, independently of the library's
 *   integer code, and test_avx512_emu checks them against the F16C
 *   instructions where the CPU has those.
 * - _mm512_cvtepu16_epi32 (vpmovzxwd) and _mm512_cvtepi32_epi16 (vpmovdw):
 *   zero extension, and truncation to the low 16 bits.
 * - _mm512_maskz_loadu_ps, _mm512_mask_storeu_ps, _mm256_maskz_loadu_epi16,
 *   _mm256_mask_storeu_epi16 (vmovups, vmovdqu16 with a mask): lanes whose
 *   mask bit is clear are neither read (a load gives 0 there) nor written,
 *   so, like the instructions, they touch no memory there.
 * - the type __mmask16.
 *
 * Include it before anything that includes <immintrin.h> (its types would
 * clash with SIMDe's); compile without contraction (-ffp-contract=off), so
 * that the emulation's separate multiplies and adds stay separate, and with
 * -Wno-psabi (SIMDe passes 64-byte vectors by value to functions compiled
 * without AVX-512).
 */
#ifndef AMPC_TEST_AVX512_EMU_H
#define AMPC_TEST_AVX512_EMU_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>

#if !defined(SIMDE_X86_AVX512F_NATIVE) && !defined(_MM_CMPINT_GE) && !defined(_MM_CMPINT_NLT)
typedef simde__mmask16 __mmask16;
#endif

/* ---- fused multiply-add ---- */

static inline __m512 emu_mm512_fmadd_ps(__m512 a, __m512 b, __m512 c) {
  float x[16], y[16], z[16];
  memcpy(x, &a, sizeof x);
  memcpy(y, &b, sizeof y);
  memcpy(z, &c, sizeof z);
  for (int i = 0; i < 16; i++) x[i] = fmaf(x[i], y[i], z[i]); /* C's fmaf rounds once */
  memcpy(&a, x, sizeof x);
  return a;
}
#undef _mm512_fmadd_ps
#define _mm512_fmadd_ps(a, b, c) emu_mm512_fmadd_ps(a, b, c)

/* ---- binary16 <-> binary32 ---- */

static inline uint32_t emu_f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static inline float emu_bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* binary16 h as binary32: (-1)^s * 2^(e-15) * 1.m, or 2^-14 * 0.m when e = 0. */
static inline float emu_half_to_single(uint16_t h) {
  uint32_t sign = h >> 15, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1f) {
    if (m == 0) return emu_bits_f32(sign << 31 | 0x7f800000u);
    return emu_bits_f32(sign << 31 | 0x7fc00000u | m << 13); /* quiet, payload on top */
  }
  double mag = e == 0 ? ldexp((double)m, -24) : ldexp((double)(1024 + m), (int)e - 25);
  return (float)(sign ? -mag : mag); /* exact: every binary16 is a binary32 */
}

/* binary32 x as binary16, rounded to nearest, ties to even: x's magnitude
 * in units of the quantum of binary16 numbers of its size (2^-24 below
 * 2^-14, else 2^(exponent - 10)), rounded to an integer q; q * quantum is
 * the result, which may step up to the next binade or to infinity. */
static inline uint16_t emu_single_to_half(float x, int imm) {
  if ((imm & 7) != _MM_FROUND_TO_NEAREST_INT) abort(); /* only the mode the kernels use is written here */
  uint32_t u = emu_f32_bits(x);
  uint16_t sign = (uint16_t)(u >> 16 & 0x8000u);
  if (isnan(x)) return (uint16_t)(sign | 0x7e00u | (u >> 13 & 0x3ffu));
  if (isinf(x)) return (uint16_t)(sign | 0x7c00u);
  if (x == 0.0f) return sign;
  double a = fabs((double)x);
  int e;
  (void)frexp(a, &e); /* a = f * 2^e, f in [0.5, 1): its binade is 2^(e-1) */
  int qe = (e - 1 < -14 ? -14 : e - 1) - 10;
  double q = ldexp(a, -qe), fl = floor(q), fr = q - fl; /* all exact */
  uint32_t n = (uint32_t)fl;
  if (fr > 0.5 || (fr == 0.5 && (n & 1u))) n++;
  if (qe == -24) return (uint16_t)(sign | n); /* subnormal, or 0x400: the smallest normal */
  if (n == 2048) { /* rounded up into the next binade */
    n = 1024;
    qe++;
  }
  int biased = qe + 10 + 15;
  if (biased >= 31) return (uint16_t)(sign | 0x7c00u);
  return (uint16_t)(sign | (uint32_t)biased << 10 | (n - 1024));
}

static inline __m512 emu_mm512_cvtph_ps(__m256i a) {
  uint16_t h[16];
  float f[16];
  __m512 r;
  memcpy(h, &a, sizeof h);
  for (int i = 0; i < 16; i++) f[i] = emu_half_to_single(h[i]);
  memcpy(&r, f, sizeof r);
  return r;
}
#define _mm512_cvtph_ps(a) emu_mm512_cvtph_ps(a)

static inline __m256i emu_mm512_cvtps_ph(__m512 a, int imm) {
  float f[16];
  uint16_t h[16];
  __m256i r;
  memcpy(f, &a, sizeof f);
  for (int i = 0; i < 16; i++) h[i] = emu_single_to_half(f[i], imm);
  memcpy(&r, h, sizeof r);
  return r;
}
#define _mm512_cvtps_ph(a, imm) emu_mm512_cvtps_ph(a, imm)

/* ---- integer widening and narrowing ---- */

static inline __m512i emu_mm512_cvtepu16_epi32(__m256i a) {
  uint16_t h[16];
  uint32_t w[16];
  __m512i r;
  memcpy(h, &a, sizeof h);
  for (int i = 0; i < 16; i++) w[i] = h[i];
  memcpy(&r, w, sizeof r);
  return r;
}
#define _mm512_cvtepu16_epi32(a) emu_mm512_cvtepu16_epi32(a)

static inline __m256i emu_mm512_cvtepi32_epi16(__m512i a) {
  uint32_t w[16];
  uint16_t h[16];
  __m256i r;
  memcpy(w, &a, sizeof w);
  for (int i = 0; i < 16; i++) h[i] = (uint16_t)w[i];
  memcpy(&r, h, sizeof r);
  return r;
}
#define _mm512_cvtepi32_epi16(a) emu_mm512_cvtepi32_epi16(a)

/* ---- masked loads and stores: lane by lane, only the lanes of the mask ---- */

static inline __m512 emu_mm512_maskz_loadu_ps(__mmask16 k, const void *p) {
  float f[16] = {0};
  __m512 r;
  for (int i = 0; i < 16; i++)
    if (k >> i & 1) memcpy(&f[i], (const char *)p + 4 * i, 4);
  memcpy(&r, f, sizeof r);
  return r;
}
#define _mm512_maskz_loadu_ps(k, p) emu_mm512_maskz_loadu_ps(k, p)

static inline void emu_mm512_mask_storeu_ps(void *p, __mmask16 k, __m512 a) {
  float f[16];
  memcpy(f, &a, sizeof f);
  for (int i = 0; i < 16; i++)
    if (k >> i & 1) memcpy((char *)p + 4 * i, &f[i], 4);
}
#define _mm512_mask_storeu_ps(p, k, a) emu_mm512_mask_storeu_ps(p, k, a)

static inline __m256i emu_mm256_maskz_loadu_epi16(__mmask16 k, const void *p) {
  uint16_t h[16] = {0};
  __m256i r;
  for (int i = 0; i < 16; i++)
    if (k >> i & 1) memcpy(&h[i], (const char *)p + 2 * i, 2);
  memcpy(&r, h, sizeof r);
  return r;
}
#define _mm256_maskz_loadu_epi16(k, p) emu_mm256_maskz_loadu_epi16(k, p)

static inline void emu_mm256_mask_storeu_epi16(void *p, __mmask16 k, __m256i a) {
  uint16_t h[16];
  memcpy(h, &a, sizeof h);
  for (int i = 0; i < 16; i++)
    if (k >> i & 1) memcpy((char *)p + 2 * i, &h[i], 2);
}
#define _mm256_mask_storeu_epi16(p, k, a) emu_mm256_mask_storeu_epi16(p, k, a)

#endif
