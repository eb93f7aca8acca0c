/* Internal: inline scalar conversions for kernels, and path selection for tests. */
#ifndef AMPC_CORE_DTYPE_INTERNAL_H
#define AMPC_CORE_DTYPE_INTERNAL_H

#include "ampc/dtype.h"

/* Force the scalar bulk path (1) or restore run-time selection (0). For tests
 * and benchmarks; not thread-safe against concurrent conversions. */
void ampc__convert_force_scalar(int force);

/* Portable scalar bulk conversions (always available). */
void ampc__f16_to_f32_n_scalar(float *dst, const uint16_t *src, size_t n);
void ampc__f32_to_f16_n_scalar(uint16_t *dst, const float *src, size_t n);
void ampc__bf16_to_f32_n_scalar(float *dst, const uint16_t *src, size_t n);
void ampc__f32_to_bf16_n_scalar(uint16_t *dst, const float *src, size_t n);

/* 1 if the CPU has AVX2, FMA and F16C (checked once). */
int ampc__cpu_has_avx2_f16c(void);

#endif
