/*
 * dtype.h -- storage types and conversions.
 *
 * Tensors are stored as f32, f16 (IEEE 754 binary16) or bf16 (the top half of
 * an f32); every kernel computes and accumulates in f32 and converts on load
 * and store. Integer types exist for labels and for files (safetensors).
 *
 * Conversions to a 16-bit type round to nearest, ties to even; they keep
 * subnormals, infinities and NaN (a NaN stays a NaN, with its sign, and is
 * made quiet) and overflow to infinity. Conversions to f32 are exact. Every
 * conversion of a NaN, either way, keeps its sign and the leading bits of
 * its payload that fit, and sets the quiet bit (as the F16C instructions
 * do): f32 0x7f800001 -> f16 0x7e00; f16 0x7c01 -> f32 0x7fc02000. Results
 * do not depend on the rounding mode or on FTZ/DAZ. The bulk functions pick
 * an F16C/AVX2 path at run time where the CPU has one, and a portable scalar
 * path otherwise; both give bit-identical results.
 *
 *     float x[n]; uint16_t h[n];
 *     ampc_convert(AMPC_DTYPE_F16, h, AMPC_DTYPE_F32, x, n);
 */
#ifndef AMPC_DTYPE_H
#define AMPC_DTYPE_H

#include <stddef.h>
#include <stdint.h>

#include "ampc/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  AMPC_DTYPE_F32 = 0,
  AMPC_DTYPE_F16,
  AMPC_DTYPE_BF16,
  AMPC_DTYPE_F64,
  AMPC_DTYPE_I64,
  AMPC_DTYPE_I32,
  AMPC_DTYPE_I16,
  AMPC_DTYPE_I8,
  AMPC_DTYPE_U8,
  AMPC_DTYPE_BOOL,
  AMPC_DTYPE_COUNT
} ampc_dtype;

/* Bytes per element. */
size_t ampc_dtype_size(ampc_dtype t);
/* Short lower-case name: "f32", "f16", "bf16", "f64", "i64", ... */
const char *ampc_dtype_name(ampc_dtype t);
/* Parses "f32"/"fp32"/"float32", "f16"/"fp16"/"half"/"float16", "bf16"/"bfloat16". */
ampc_status ampc_dtype_parse(const char *name, ampc_dtype *out);
/* 1 for f32, f16, bf16, f64. */
int ampc_dtype_is_float(ampc_dtype t);

/* Single values. */
float ampc_f16_to_f32(uint16_t h);
uint16_t ampc_f32_to_f16(float f);
float ampc_bf16_to_f32(uint16_t b);
uint16_t ampc_f32_to_bf16(float f);

/* Bulk conversion between any two of f32, f16, bf16 (src and dst must not
 * overlap unless they are the same type, which copies). Returns AMPC_EINVAL
 * for other types, or for a NULL buffer when n > 0. */
ampc_status ampc_convert(ampc_dtype dst_type, void *dst, ampc_dtype src_type,
                         const void *src, size_t n);

/* The same, specialised: the hot paths kernels call. */
void ampc_f16_to_f32_n(float *dst, const uint16_t *src, size_t n);
void ampc_f32_to_f16_n(uint16_t *dst, const float *src, size_t n);
void ampc_bf16_to_f32_n(float *dst, const uint16_t *src, size_t n);
void ampc_f32_to_bf16_n(uint16_t *dst, const float *src, size_t n);

/* Load n values of any float storage type (f32, f16, bf16, f64) as f32 /
 * store f32 into it (to nearest, ties to even). Neither can fail: for a
 * type that is not a float one, load gives n NaNs and store writes nothing. */
void ampc_load_f32(float *dst, ampc_dtype src_type, const void *src, size_t n);
void ampc_store_f32(ampc_dtype dst_type, void *dst, const float *src, size_t n);

/* Which bulk path is in use: "avx512", "avx2+f16c" or "scalar". */
const char *ampc_convert_path(void);
/* Which build of the CPU kernels' vector code runs on this CPU (chosen when
 * the program loads, by the CPU's features): "avx512" (the x86-64-v4 build,
 * GCC only), "avx2+fma+f16c" (the x86-64-v3 build), "avx2" (a clang build's,
 * without FMA) or "baseline". */
const char *ampc_kernel_path(void);
/* The bf16 engine the CPU kernels use beside the vector code for the
 * products of convolutions and linear layers stored in bf16: "amx-bf16"
 * where the CPU has Intel's AMX-BF16 and the OS grants it to the process,
 * else "avx512-bf16" where it has AVX-512 BF16's dot products (the linear
 * layers' products and those of the convolutions on im2col -- the strided
 * and 1x1 ones, and 3x3 ones of fewer than 8 channels; Winograd keeps the
 * rest on the FMAs), else "none". */
const char *ampc_kernel_tiles(void);

#ifdef __cplusplus
}
#endif
#endif
