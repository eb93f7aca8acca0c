/* Storage types: traits, conversions, and the choice between the scalar, the
 * F16C/AVX2 and the AVX-512 bulk path (made once, at run time). The
 * conversion rules (rounding, NaN) are in dtype_internal.h. */
#include <stdatomic.h>
#include <math.h>
#include <string.h>
#include <strings.h>

#include "core/dtype_internal.h"
#include "core/status_internal.h"

#if AMPC__DTYPE_X86
#include <cpuid.h>
#endif

static const struct {
  const char *name;
  size_t size;
  int is_float;
} dtype_traits[AMPC_DTYPE_COUNT] = {
    [AMPC_DTYPE_F32] = {"f32", 4, 1},  [AMPC_DTYPE_F16] = {"f16", 2, 1},
    [AMPC_DTYPE_BF16] = {"bf16", 2, 1}, [AMPC_DTYPE_F64] = {"f64", 8, 1},
    [AMPC_DTYPE_I64] = {"i64", 8, 0},  [AMPC_DTYPE_I32] = {"i32", 4, 0},
    [AMPC_DTYPE_I16] = {"i16", 2, 0},  [AMPC_DTYPE_I8] = {"i8", 1, 0},
    [AMPC_DTYPE_U8] = {"u8", 1, 0},    [AMPC_DTYPE_BOOL] = {"bool", 1, 0},
};

size_t ampc_dtype_size(ampc_dtype t) { return (unsigned)t < AMPC_DTYPE_COUNT ? dtype_traits[t].size : 0; }
const char *ampc_dtype_name(ampc_dtype t) { return (unsigned)t < AMPC_DTYPE_COUNT ? dtype_traits[t].name : "?"; }
int ampc_dtype_is_float(ampc_dtype t) { return (unsigned)t < AMPC_DTYPE_COUNT && dtype_traits[t].is_float; }

ampc_status ampc_dtype_parse(const char *name, ampc_dtype *out) {
  static const struct {
    const char *alias;
    ampc_dtype t;
  } aliases[] = {
      {"f32", AMPC_DTYPE_F32},     {"fp32", AMPC_DTYPE_F32},    {"float32", AMPC_DTYPE_F32},
      {"float", AMPC_DTYPE_F32},   {"f16", AMPC_DTYPE_F16},     {"fp16", AMPC_DTYPE_F16},
      {"float16", AMPC_DTYPE_F16}, {"half", AMPC_DTYPE_F16},    {"bf16", AMPC_DTYPE_BF16},
      {"bfloat16", AMPC_DTYPE_BF16},
  };
  if (!out) return ampc__error(AMPC_EINVAL, "dtype: parse: null output");
  for (size_t i = 0; name && i < sizeof aliases / sizeof aliases[0]; i++)
    if (strcasecmp(name, aliases[i].alias) == 0) {
      *out = aliases[i].t;
      return AMPC_OK;
    }
  return ampc__error(AMPC_EINVAL, "unknown dtype '%s' (expected f32, f16 or bf16)", name ? name : "");
}

float ampc_f16_to_f32(uint16_t h) { return ampc__f16_to_f32_inline(h); }
uint16_t ampc_f32_to_f16(float f) { return ampc__f32_to_f16_inline(f); }
float ampc_bf16_to_f32(uint16_t b) { return ampc__bf16_to_f32_inline(b); }
uint16_t ampc_f32_to_bf16(float f) { return ampc__f32_to_bf16_inline(f); }

void ampc__f16_to_f32_n_scalar(float *dst, const uint16_t *src, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = ampc__f16_to_f32_inline(src[i]);
}
void ampc__f32_to_f16_n_scalar(uint16_t *dst, const float *src, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = ampc__f32_to_f16_inline(src[i]);
}
void ampc__bf16_to_f32_n_scalar(float *dst, const uint16_t *src, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = ampc__bf16_to_f32_inline(src[i]);
}
void ampc__f32_to_bf16_n_scalar(uint16_t *dst, const float *src, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = ampc__f32_to_bf16_inline(src[i]);
}

/* -1: not yet detected; 0: CPU lacks a feature; 1: AVX2+FMA+F16C usable. */
static atomic_int cpu_features = -1;
/* The same for AVX-512 F/BW/VL (with AVX2+FMA+F16C). */
static atomic_int cpu_features_avx512 = -1;
/* The path the bulk functions take: -1 not chosen yet, else AMPC__CONVERT_*. */
static atomic_int convert_mode = -1;

int ampc__cpu_has_avx2_f16c(void) {
  int has = atomic_load_explicit(&cpu_features, memory_order_relaxed);
  if (has >= 0) return has;
  has = 0;
#if AMPC__DTYPE_X86
  __builtin_cpu_init();
  /* avx2 also tells that the OS saves the YMM registers (XGETBV), which the
   * VEX-encoded F16C instructions need. clang 14's builtin does not know
   * "f16c", so that bit comes from CPUID leaf 1 directly. */
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    unsigned a, b, c, d;
    has = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
  }
#endif
  atomic_store_explicit(&cpu_features, has, memory_order_relaxed);
  return has;
}

int ampc__cpu_has_avx512(void) {
  int has = atomic_load_explicit(&cpu_features_avx512, memory_order_relaxed);
  if (has >= 0) return has;
  has = 0;
#if AMPC__DTYPE_X86
  __builtin_cpu_init();
  /* GCC's and clang's runtimes report the avx512 features only where XGETBV
   * says the OS saves the opmask and ZMM registers too. BW and VL (every
   * AVX-512 CPU but the Xeon Phis) give the conversions their 16-bit masked
   * loads and stores. */
  has = ampc__cpu_has_avx2_f16c() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl");
#endif
  atomic_store_explicit(&cpu_features_avx512, has, memory_order_relaxed);
  return has;
}

static int best_path(void) {
  if (ampc__cpu_has_avx512()) return AMPC__CONVERT_AVX512;
  return ampc__cpu_has_avx2_f16c() ? AMPC__CONVERT_AVX2 : AMPC__CONVERT_SCALAR;
}

int ampc__convert_force_path(int path) {
  int best = best_path(), mode = path < 0 || path > best ? best : path;
  atomic_store_explicit(&convert_mode, mode, memory_order_relaxed);
  return mode;
}

void ampc__convert_force_scalar(int force) { ampc__convert_force_path(force ? AMPC__CONVERT_SCALAR : -1); }

static inline int convert_path(void) {
  int mode = atomic_load_explicit(&convert_mode, memory_order_relaxed);
  if (mode < 0) {
    /* a racing first call stores the same value */
    mode = best_path();
    atomic_store_explicit(&convert_mode, mode, memory_order_relaxed);
  }
  return mode;
}

const char *ampc_convert_path(void) {
  switch (convert_path()) {
    case AMPC__CONVERT_AVX512: return "avx512";
    case AMPC__CONVERT_AVX2: return "avx2+f16c";
    default: return "scalar";
  }
}

#if AMPC__DTYPE_X86
/* Fewer than 8 values (a kernel loading one element) go to the scalar code,
 * which is cheaper there than a vector tail; the bits are the same. The
 * AVX-512 path takes every longer run, its tail in masked lanes. */
#define DISPATCH(fn, dst, src, n)                                              \
  do {                                                                         \
    int mode_ = n >= 8 ? convert_path() : AMPC__CONVERT_SCALAR;                \
    if (mode_ == AMPC__CONVERT_AVX512) ampc__##fn##_avx512(dst, src, n);       \
    else if (mode_ == AMPC__CONVERT_AVX2) ampc__##fn##_avx2(dst, src, n);      \
    else ampc__##fn##_scalar(dst, src, n);                                     \
  } while (0)
#else
#define DISPATCH(fn, dst, src, n) ampc__##fn##_scalar(dst, src, n)
#endif

void ampc_f16_to_f32_n(float *dst, const uint16_t *src, size_t n) { DISPATCH(f16_to_f32_n, dst, src, n); }
void ampc_f32_to_f16_n(uint16_t *dst, const float *src, size_t n) { DISPATCH(f32_to_f16_n, dst, src, n); }
void ampc_bf16_to_f32_n(float *dst, const uint16_t *src, size_t n) { DISPATCH(bf16_to_f32_n, dst, src, n); }
void ampc_f32_to_bf16_n(uint16_t *dst, const float *src, size_t n) { DISPATCH(f32_to_bf16_n, dst, src, n); }

void ampc_load_f32(float *dst, ampc_dtype t, const void *src, size_t n) {
  switch (t) {
    case AMPC_DTYPE_F16: ampc_f16_to_f32_n(dst, src, n); break;
    case AMPC_DTYPE_BF16: ampc_bf16_to_f32_n(dst, src, n); break;
    case AMPC_DTYPE_F32:
      if (dst != src && n) memmove(dst, src, n * sizeof(float));
      break;
    case AMPC_DTYPE_F64:
      for (size_t i = 0; i < n; i++) dst[i] = (float)((const double *)src)[i];
      break;
    default: /* not a float type: no value to give (the call cannot fail) */
      for (size_t i = 0; i < n; i++) dst[i] = NAN;
      break;
  }
}

void ampc_store_f32(ampc_dtype t, void *dst, const float *src, size_t n) {
  switch (t) {
    case AMPC_DTYPE_F16: ampc_f32_to_f16_n(dst, src, n); break;
    case AMPC_DTYPE_BF16: ampc_f32_to_bf16_n(dst, src, n); break;
    case AMPC_DTYPE_F32:
      if (dst != src && n) memmove(dst, src, n * sizeof(float));
      break;
    case AMPC_DTYPE_F64:
      for (size_t i = 0; i < n; i++) ((double *)dst)[i] = src[i];
      break;
    default: break; /* not a float type: nothing is written */
  }
}

void ampc__round_f32(ampc_dtype t, float *p, size_t n) {
  if (t == AMPC_DTYPE_F32) return;
#if AMPC__DTYPE_X86
  int mode = (t == AMPC_DTYPE_F16 || t == AMPC_DTYPE_BF16) && n >= 8 ? convert_path() : AMPC__CONVERT_SCALAR;
  if (mode == AMPC__CONVERT_AVX512) {
    (t == AMPC_DTYPE_F16 ? ampc__f16_round_n_avx512 : ampc__bf16_round_n_avx512)(p, n);
    return;
  }
  if (mode == AMPC__CONVERT_AVX2) {
    (t == AMPC_DTYPE_F16 ? ampc__f16_round_n_avx2 : ampc__bf16_round_n_avx2)(p, n);
    return;
  }
#endif
  uint16_t buf[256];
  for (size_t i = 0; i < n; i += 256) {
    size_t m = n - i < 256 ? n - i : 256;
    ampc_store_f32(t, buf, p + i, m);
    ampc_load_f32(p + i, t, buf, m);
  }
}

static int is_convertible(ampc_dtype t) {
  return t == AMPC_DTYPE_F32 || t == AMPC_DTYPE_F16 || t == AMPC_DTYPE_BF16;
}

ampc_status ampc_convert(ampc_dtype dt, void *dst, ampc_dtype st, const void *src, size_t n) {
  if (!is_convertible(dt) || !is_convertible(st))
    return ampc__error(AMPC_EINVAL, "convert: unsupported types %s -> %s", ampc_dtype_name(st),
                       ampc_dtype_name(dt));
  if (n == 0) return AMPC_OK;
  if (!dst || !src) return ampc__error(AMPC_EINVAL, "convert: null buffer for %zu elements", n);
  if (dt == st) {
    if (dst != src) memmove(dst, src, n * ampc_dtype_size(dt));
    return AMPC_OK;
  }
  if (st == AMPC_DTYPE_F32) {
    ampc_store_f32(dt, dst, src, n);
    return AMPC_OK;
  }
  if (dt == AMPC_DTYPE_F32) {
    ampc_load_f32(dst, st, src, n);
    return AMPC_OK;
  }
  /* f16 <-> bf16 through f32 in blocks: widening is exact, so this rounds
   * once, as a direct conversion would. 1 KiB of stack. */
  float buf[256];
  const uint16_t *s = src;
  uint16_t *d = dst;
  for (size_t i = 0; i < n; i += 256) {
    size_t m = n - i < 256 ? n - i : 256;
    ampc_load_f32(buf, st, s + i, m);
    ampc_store_f32(dt, d + i, buf, m);
  }
  return AMPC_OK;
}
