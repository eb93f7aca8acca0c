/* Internal: the scalar conversions (inline, for kernels converting one value
 * at a time), the F16C/AVX2 and AVX-512 bulk conversions, and path selection
 * for tests.
 *
 * The conversion rules, defined here once and followed by every path:
 *
 * - Narrowing (f32 -> f16/bf16) rounds to nearest, ties to even, on the bit
 *   pattern; values at or beyond max + ulp/2 become infinity; subnormals are
 *   produced and kept (no flush to zero).
 * - Widening (f16/bf16 -> f32) is exact.
 * - NaN rule: a NaN becomes a NaN of the same sign with the quiet bit set;
 *   the rest of its payload is the source payload's leading bits --
 *   truncated when narrowing, zero-extended when widening. This is what the
 *   F16C instructions do in both directions, so the scalar code copies it
 *   (and the AVX2 bf16 code reproduces it). Consequences: a NaN never turns
 *   into an infinity (the quiet bit keeps the mantissa non-zero), a quiet NaN
 *   survives f16 -> f32 -> f16 unchanged, and a signalling one comes back
 *   quiet. Examples: f32 0x7f800001 -> f16 0x7e00, bf16 0x7fc0;
 *   f16 0x7c01 -> f32 0x7fc02000; bf16 0xff81 -> f32 0xffc10000.
 * - Results never depend on the floating-point environment (rounding mode,
 *   FTZ/DAZ): the scalar code uses integer arithmetic (plus one exact
 *   multiplication between normal numbers), the F16C instructions get an
 *   explicit rounding mode and do not honour DAZ.
 */
#ifndef AMPC_CORE_DTYPE_INTERNAL_H
#define AMPC_CORE_DTYPE_INTERNAL_H

#include <string.h>

#include "ampc/dtype.h"
#include "core/hd.h" /* AMPC__HD: the scalar conversions are device functions too under CUDA */

#if defined(__x86_64__) || defined(__i386__)
#define AMPC__DTYPE_X86 1
#else
#define AMPC__DTYPE_X86 0
#endif

/* The quiet bit of an f32 NaN (the top mantissa bit); bit 9 of an f16 and
 * bit 6 of a bf16 are the same bit after conversion. */
#define AMPC__F32_QUIET 0x00400000u

AMPC__HD uint32_t ampc__f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

AMPC__HD float ampc__bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

AMPC__HD float ampc__f16_to_f32_inline(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0x1f) /* inf, or NaN made quiet */
    return ampc__bits_f32(sign | 0x7f800000u | (man ? AMPC__F32_QUIET : 0) | (man << 13));
  if (exp == 0) {
    /* zero or subnormal: man * 2^-24, a normal f32, so the product is exact
     * whatever the rounding mode and FTZ/DAZ */
    float v = (float)man * 0x1p-24f;
    return ampc__bits_f32(sign | ampc__f32_bits(v));
  }
  return ampc__bits_f32(sign | ((exp + (127 - 15)) << 23) | (man << 13));
}

AMPC__HD uint16_t ampc__f32_to_f16_inline(float f) {
  uint32_t u = ampc__f32_bits(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) /* NaN: top 10 payload bits, quiet bit set */
    return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  if (a >= 0x477ff000u) /* >= 65520 = 65504 + ulp/2 (the tie goes to the even inf), or inf */
    return (uint16_t)(sign | 0x7c00u);
  if (a >= 0x38800000u) { /* >= 2^-14: normal; round at bit 13, a carry bumps the exponent */
    uint32_t r = a + 0xfffu + ((a >> 13) & 1u);
    return (uint16_t)(sign | ((r - ((127u - 15u) << 23)) >> 13));
  }
  if (a < 0x33000000u) /* < 2^-25 (half the smallest subnormal): rounds to zero */
    return (uint16_t)sign;
  /* subnormal result: value = man * 2^(exp-150), counted in units of 2^-24;
   * exp in [102, 112] so the shift is 14..24 */
  uint32_t exp = a >> 23, man = (a & 0x7fffffu) | 0x800000u, shift = 126 - exp;
  uint32_t q = man >> shift, rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1u))) q++; /* q may become 0x400: the smallest normal */
  return (uint16_t)(sign | q);
}

AMPC__HD float ampc__bf16_to_f32_inline(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  if ((u & 0x7fffffffu) > 0x7f800000u) u |= AMPC__F32_QUIET;
  return ampc__bits_f32(u);
}

AMPC__HD uint16_t ampc__f32_to_bf16_inline(float f) {
  uint32_t u = ampc__f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u | AMPC__F32_QUIET) >> 16);
  /* round at bit 16, ties to even; the largest finite values carry into inf */
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* The bulk paths, slowest first; run-time selection takes the last one the
 * CPU can run. */
enum { AMPC__CONVERT_SCALAR = 0, AMPC__CONVERT_AVX2 = 1, AMPC__CONVERT_AVX512 = 2 };

/* Makes the bulk functions take the given path (AMPC__CONVERT_*), or the
 * best the CPU can run when it cannot run that one or path < 0 (run-time
 * selection); returns the path now taken. For tests and benchmarks. Safe to
 * call while other threads convert (every path gives the same bits), but
 * which path those calls take is then unspecified. */
int ampc__convert_force_path(int path);
/* Force the scalar bulk path (1) or restore run-time selection (0). */
void ampc__convert_force_scalar(int force);

/* Portable scalar bulk conversions (always available). */
void ampc__f16_to_f32_n_scalar(float *dst, const uint16_t *src, size_t n);
void ampc__f32_to_f16_n_scalar(uint16_t *dst, const float *src, size_t n);
void ampc__bf16_to_f32_n_scalar(float *dst, const uint16_t *src, size_t n);
void ampc__f32_to_bf16_n_scalar(uint16_t *dst, const float *src, size_t n);

/* 1 if the CPU (and OS) support AVX2, FMA and F16C (checked once). */
int ampc__cpu_has_avx2_f16c(void);
/* 1 if the CPU (and OS: the opmask and ZMM state) support AVX-512 F, BW and
 * VL, besides AVX2, FMA and F16C (checked once). The AVX-512 conversions and
 * the cpu backend's AVX-512 kernels both need this. */
int ampc__cpu_has_avx512(void);
/* The OpenBLAS kernel set (OPENBLAS_CORETYPE) that fits a CPU with these
 * features where OpenBLAS runs core (one without AVX2, or without AVX-512 on
 * an AVX-512 CPU), or NULL: the rule behind ampc_blas_better_core(), separate
 * for the tests. */
const char *ampc__blas_better_core(const char *core, int avx2_fma, int avx512);
/* OpenBLAS takes a buffer of 128 MiB and two pages for each thread of its own
 * (openblas_set_num_threads) and for each thread that runs one of its
 * products, the first time; where the allocation fails -- under a limit on
 * the address space or the data segment (ulimit -v or -d, a batch system's
 * h_vmem) -- it retries for ever, and the process hangs. AMPC_OK where
 * `buffers` more of them fit under the process's limits (a mapping of their
 * size, never touched) or there are no limits; AMPC_ENOMEM with the error
 * set, naming the limit, `what` the buffers are for, where they do not. */
#define AMPC__BLAS_BUFFER ((size_t)(128 << 20) + (64 << 10))
ampc_status ampc__blas_room(int buffers, const char *what);
/* 1 where the process's address space or data segment is limited (the
 * limits ampc__blas_room checks against), 0 where neither is. */
int ampc__mem_limited(void);

#if AMPC__DTYPE_X86
/* F16C/AVX2 bulk conversions (dtype_avx2.c, compiled for those features by
 * function attributes only). Call them only if ampc__cpu_has_avx2_f16c(). */
void ampc__f16_to_f32_n_avx2(float *dst, const uint16_t *src, size_t n);
void ampc__f32_to_f16_n_avx2(uint16_t *dst, const float *src, size_t n);
void ampc__bf16_to_f32_n_avx2(float *dst, const uint16_t *src, size_t n);
void ampc__f32_to_bf16_n_avx2(uint16_t *dst, const float *src, size_t n);
/* p[i] = f16 -> f32 of f32 -> f16 of p[i], in registers; and for bf16 */
void ampc__f16_round_n_avx2(float *p, size_t n);
void ampc__bf16_round_n_avx2(float *p, size_t n);
/* The same six on 16 lanes (dtype_avx512.c, also compiled by function
 * attributes only). Call them only if ampc__cpu_has_avx512(). */
void ampc__f16_to_f32_n_avx512(float *dst, const uint16_t *src, size_t n);
void ampc__f32_to_f16_n_avx512(uint16_t *dst, const float *src, size_t n);
void ampc__bf16_to_f32_n_avx512(float *dst, const uint16_t *src, size_t n);
void ampc__f32_to_bf16_n_avx512(uint16_t *dst, const float *src, size_t n);
void ampc__f16_round_n_avx512(float *p, size_t n);
void ampc__bf16_round_n_avx512(float *p, size_t n);
/* Whether the CPU has avx512_bf16 with the x86-64-v4 set (AVX-512 F, BW,
 * CD, DQ, VL; the OS saving their state): also what the CPU backend's bf16
 * engines ask for (gemm_amx.c). Where it does and the hook
 * ampc__convert_bf16_instruction is 1 (the default), ampc__f32_to_bf16_n_avx512
 * narrows with its conversion instruction (the same bits); 0: the integer
 * rounding everywhere (for tests). */
int ampc__cpu_has_avx512_bf16(void);
extern int ampc__convert_bf16_instruction;
#endif

/* bf16 rounding of f32 bit patterns in vector registers, for the conversion
 * kernels and for the fused kernels that round as they store (one
 * definition, which test_dtype checks on every f32 pattern on each path):
 * each 32-bit lane of u (a variable) rounded at bit 16, ties to even (the
 * largest finite values carry into inf), or a NaN with its quiet bit set
 * instead; the bf16 code is the top half, and the top half alone is the
 * widened value (AMPC__BF16_WIDE512 / 256: the low halves cleared;
 * AMPC__BF16_CODES512: the 16 codes, narrowed). Macros,
 * so that they take the target of the function they are used in: 16 lanes
 * (AVX-512F) and 8 (AVX2). */
#define AMPC__BF16_RNE512(u)                                                                                            \
  _mm512_mask_or_epi32(                                                                                                \
      _mm512_add_epi32((u), _mm512_add_epi32(_mm512_set1_epi32(0x7fff), _mm512_and_si512(_mm512_srli_epi32((u), 16), _mm512_set1_epi32(1)))), \
      _mm512_cmpgt_epi32_mask(_mm512_and_si512((u), _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000)), (u),  \
      _mm512_set1_epi32((int)AMPC__F32_QUIET))
#define AMPC__BF16_RNE256(u)                                                                                            \
  _mm256_blendv_epi8(                                                                                                  \
      _mm256_add_epi32((u), _mm256_add_epi32(_mm256_set1_epi32(0x7fff), _mm256_and_si256(_mm256_srli_epi32((u), 16), _mm256_set1_epi32(1)))), \
      _mm256_or_si256((u), _mm256_set1_epi32((int)AMPC__F32_QUIET)),                                                    \
      _mm256_cmpgt_epi32(_mm256_and_si256((u), _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000)))
#define AMPC__BF16_WIDE512(u) _mm512_and_si512(AMPC__BF16_RNE512(u), _mm512_set1_epi32((int)0xffff0000u))
#define AMPC__BF16_CODES512(u) _mm512_cvtepi32_epi16(_mm512_srli_epi32(AMPC__BF16_RNE512(u), 16)) /* __m256i */
#define AMPC__BF16_WIDE256(u) _mm256_and_si256(AMPC__BF16_RNE256(u), _mm256_set1_epi32((int)0xffff0000u))

/* Rounds n f32 values in place to what storing them as t and loading them
 * back gives, bit for bit (f32: unchanged). */
void ampc__round_f32(ampc_dtype t, float *p, size_t n);

#endif
