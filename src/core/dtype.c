/* Storage types: traits and conversions. (Scalar path; a vectorised path is
 * selected at run time where the CPU supports it.) */
#include <math.h>
#include <string.h>
#include <strings.h>

#include "core/dtype_internal.h"
#include "core/status_internal.h"

static const struct {
  const char *name;
  size_t size;
  int is_float;
} dtype_traits[AMPC_DTYPE_COUNT] = {
    [AMPC_DTYPE_F32] = {"f32", 4, 1}, [AMPC_DTYPE_F16] = {"f16", 2, 1},
    [AMPC_DTYPE_BF16] = {"bf16", 2, 1}, [AMPC_DTYPE_F64] = {"f64", 8, 1},
    [AMPC_DTYPE_I64] = {"i64", 8, 0}, [AMPC_DTYPE_I32] = {"i32", 4, 0},
    [AMPC_DTYPE_I16] = {"i16", 2, 0}, [AMPC_DTYPE_I8] = {"i8", 1, 0},
    [AMPC_DTYPE_U8] = {"u8", 1, 0}, [AMPC_DTYPE_BOOL] = {"bool", 1, 0},
};

size_t ampc_dtype_size(ampc_dtype t) { return (unsigned)t < AMPC_DTYPE_COUNT ? dtype_traits[t].size : 0; }
const char *ampc_dtype_name(ampc_dtype t) { return (unsigned)t < AMPC_DTYPE_COUNT ? dtype_traits[t].name : "?"; }
int ampc_dtype_is_float(ampc_dtype t) { return (unsigned)t < AMPC_DTYPE_COUNT && dtype_traits[t].is_float; }

ampc_status ampc_dtype_parse(const char *name, ampc_dtype *out) {
  static const struct { const char *alias; ampc_dtype t; } aliases[] = {
      {"f32", AMPC_DTYPE_F32},   {"fp32", AMPC_DTYPE_F32},    {"float32", AMPC_DTYPE_F32},
      {"float", AMPC_DTYPE_F32}, {"f16", AMPC_DTYPE_F16},     {"fp16", AMPC_DTYPE_F16},
      {"float16", AMPC_DTYPE_F16}, {"half", AMPC_DTYPE_F16},  {"bf16", AMPC_DTYPE_BF16},
      {"bfloat16", AMPC_DTYPE_BF16},
  };
  for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
    if (name && strcasecmp(name, aliases[i].alias) == 0) {
      *out = aliases[i].t;
      return AMPC_OK;
    }
  return ampc__error(AMPC_EINVAL, "unknown dtype '%s' (expected f32, f16 or bf16)", name ? name : "");
}

static inline uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

float ampc_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ffu;
  if (exp == 0x1f) return bits_f32(sign | 0x7f800000u | (man << 13));
  if (exp == 0) {
    if (man == 0) return bits_f32(sign);
    float v = (float)man * (1.0f / 16777216.0f); /* man * 2^-24 */
    return sign ? -v : v;
  }
  return bits_f32(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t ampc_f32_to_f16(float f) {
  uint32_t u = f32_bits(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu)); /* quiet NaN */
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520: rounds to inf */
  if (a < 0x38800000u) { /* below 2^-14: subnormal or zero */
    if (a < 0x33000000u) return (uint16_t)sign; /* < 2^-25 rounds to zero (2^-25 exactly ties to 0) */
    uint32_t exp = a >> 23, man = (a & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - exp; /* 14 + (113 - exp) - ... : value = man * 2^(exp-150) */
    uint32_t q = man >> shift, rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1))) q++;
    return (uint16_t)(sign | q);
  }
  uint32_t r = a + 0xfffu + ((a >> 13) & 1); /* round to nearest even at bit 13 */
  return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
}

float ampc_bf16_to_f32(uint16_t b) { return bits_f32((uint32_t)b << 16); }

uint16_t ampc_f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

void ampc__f16_to_f32_n_scalar(float *dst, const uint16_t *src, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = ampc_f16_to_f32(src[i]);
}
void ampc__f32_to_f16_n_scalar(uint16_t *dst, const float *src, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = ampc_f32_to_f16(src[i]);
}
void ampc__bf16_to_f32_n_scalar(float *dst, const uint16_t *src, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = ampc_bf16_to_f32(src[i]);
}
void ampc__f32_to_bf16_n_scalar(uint16_t *dst, const float *src, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = ampc_f32_to_bf16(src[i]);
}

void ampc__convert_force_scalar(int force) { (void)force; }
int ampc__cpu_has_avx2_f16c(void) { return 0; }
const char *ampc_convert_path(void) { return "scalar"; }

void ampc_f16_to_f32_n(float *dst, const uint16_t *src, size_t n) { ampc__f16_to_f32_n_scalar(dst, src, n); }
void ampc_f32_to_f16_n(uint16_t *dst, const float *src, size_t n) { ampc__f32_to_f16_n_scalar(dst, src, n); }
void ampc_bf16_to_f32_n(float *dst, const uint16_t *src, size_t n) { ampc__bf16_to_f32_n_scalar(dst, src, n); }
void ampc_f32_to_bf16_n(uint16_t *dst, const float *src, size_t n) { ampc__f32_to_bf16_n_scalar(dst, src, n); }

void ampc_load_f32(float *dst, ampc_dtype t, const void *src, size_t n) {
  switch (t) {
    case AMPC_DTYPE_F16: ampc_f16_to_f32_n(dst, src, n); break;
    case AMPC_DTYPE_BF16: ampc_bf16_to_f32_n(dst, src, n); break;
    default: AMPC_ASSERT(t == AMPC_DTYPE_F32); if (dst != src) memmove(dst, src, n * 4); break;
  }
}
void ampc_store_f32(ampc_dtype t, void *dst, const float *src, size_t n) {
  switch (t) {
    case AMPC_DTYPE_F16: ampc_f32_to_f16_n(dst, src, n); break;
    case AMPC_DTYPE_BF16: ampc_f32_to_bf16_n(dst, src, n); break;
    default: AMPC_ASSERT(t == AMPC_DTYPE_F32); if (dst != src) memmove(dst, src, n * 4); break;
  }
}

ampc_status ampc_convert(ampc_dtype dt, void *dst, ampc_dtype st, const void *src, size_t n) {
  int ok = (dt == AMPC_DTYPE_F32 || dt == AMPC_DTYPE_F16 || dt == AMPC_DTYPE_BF16) &&
           (st == AMPC_DTYPE_F32 || st == AMPC_DTYPE_F16 || st == AMPC_DTYPE_BF16);
  if (!ok) return ampc__error(AMPC_EINVAL, "convert: unsupported types %s -> %s", ampc_dtype_name(st), ampc_dtype_name(dt));
  if (dt == st) { if (dst != src) memmove(dst, src, n * ampc_dtype_size(dt)); return AMPC_OK; }
  if (st == AMPC_DTYPE_F32) { ampc_store_f32(dt, dst, src, n); return AMPC_OK; }
  if (dt == AMPC_DTYPE_F32) { ampc_load_f32(dst, st, src, n); return AMPC_OK; }
  /* half -> other half through f32 in blocks */
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
