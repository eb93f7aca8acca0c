/* dtype: traits, parsing, and the f16/bf16 conversions of every bulk path
 * this CPU runs (scalar, F16C/AVX2, AVX-512) against references written
 * independently of the implementation:
 *
 * - widening: the value built with ldexp from the format's fields;
 * - narrowing, per value ("slow"): the two representable neighbours of x
 *   computed in double, the nearer one taken, ties to the even code;
 * - narrowing, the 2^32 sweep ("walk"): bit patterns of one sign increase
 *   with the value, so the correct code is found by walking a table of
 *   midpoints between consecutive 16-bit values (from the ldexp decoding)
 *   alongside the patterns, a merge rather than arithmetic on bits.
 *
 * Every f32 bit pattern (2^32) and every 16-bit pattern (2^16) is checked on
 * every path. The NaN rule (dtype_internal.h): same sign, quiet bit set,
 * leading payload bits kept. */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ampc/dtype.h"
#include "ampc/version.h"
#include "core/dtype_internal.h"
#include "test.h"

#if AMPC__DTYPE_X86
#include <immintrin.h>
#endif

/* ---- the two 16-bit formats, described by their fields ---- */

typedef void (*widen_fn)(float *, const uint16_t *, size_t);
typedef void (*narrow_fn)(uint16_t *, const float *, size_t);

typedef struct {
  const char *name;
  int mbits, ebits;   /* mantissa and exponent field widths */
  uint32_t inf;       /* code of +inf */
  float (*widen1)(uint16_t);
  uint16_t (*narrow1)(float);
  widen_fn widen[3];  /* [0] scalar, [1] avx2, [2] avx512 (NULL without the CPU features) */
  narrow_fn narrow[3];
} fmt16;

/* indexed as the AMPC__CONVERT_* paths */
static const char *path_name[3] = {"scalar", "avx2", "avx512"};

static fmt16 fmt_f16 = {"f16", 10, 5, 0x7c00, ampc_f16_to_f32, ampc_f32_to_f16,
                        {ampc__f16_to_f32_n_scalar, NULL, NULL}, {ampc__f32_to_f16_n_scalar, NULL, NULL}};
static fmt16 fmt_bf16 = {"bf16", 7, 8, 0x7f80, ampc_bf16_to_f32, ampc_f32_to_bf16,
                         {ampc__bf16_to_f32_n_scalar, NULL, NULL}, {ampc__f32_to_bf16_n_scalar, NULL, NULL}};

/* Fills in the AVX2 and AVX-512 entries where the CPU has them (AVX-512
 * CPUs have AVX2 too); returns how many paths there are to test. The
 * AVX-512 kernels also run emulated, on every CPU, in test_avx512_emu. */
static int npaths(void) {
#if AMPC__DTYPE_X86
  if (ampc__cpu_has_avx2_f16c()) {
    fmt_f16.widen[1] = ampc__f16_to_f32_n_avx2;
    fmt_f16.narrow[1] = ampc__f32_to_f16_n_avx2;
    fmt_bf16.widen[1] = ampc__bf16_to_f32_n_avx2;
    fmt_bf16.narrow[1] = ampc__f32_to_bf16_n_avx2;
  }
  if (ampc__cpu_has_avx512()) {
    fmt_f16.widen[2] = ampc__f16_to_f32_n_avx512;
    fmt_f16.narrow[2] = ampc__f32_to_f16_n_avx512;
    fmt_bf16.widen[2] = ampc__bf16_to_f32_n_avx512;
    fmt_bf16.narrow[2] = ampc__f32_to_bf16_n_avx512;
  }
#endif
  return fmt_f16.widen[2] ? 3 : fmt_f16.widen[1] ? 2 : 1;
}

static uint32_t fbits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
static float bitsf(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* Seconds on a clock: wall (CLOCK_MONOTONIC) for a whole sweep, the calling
 * thread's CPU time (CLOCK_THREAD_CPUTIME_ID) for its parts, which other
 * processes on a busy machine disturb less. Informational only. */
static double seconds(clockid_t clock) {
  struct timespec ts;
  clock_gettime(clock, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static double now(void) { return seconds(CLOCK_THREAD_CPUTIME_ID); }

/* Value of a non-negative code, reading the all-ones exponent as an ordinary
 * one: for the inf code that gives 2^(emax+1), the value the rounding
 * compares against above the largest finite number. */
static double ref_value(const fmt16 *f, uint32_t code) {
  uint32_t field = code >> f->mbits, man = code & ((1u << f->mbits) - 1);
  int bias = (1 << (f->ebits - 1)) - 1;
  if (field == 0) return ldexp(man, 1 - bias - f->mbits);
  return ldexp(man + (1u << f->mbits), (int)field - bias - f->mbits);
}

static uint32_t ref_widen(const fmt16 *f, uint16_t h) {
  uint32_t sign = (uint32_t)(h >> 15) << 31, mag = h & 0x7fffu;
  if (mag > f->inf) return sign | 0x7fc00000u | (mag & ((1u << f->mbits) - 1)) << (23 - f->mbits);
  if (mag == f->inf) return sign | 0x7f800000u;
  float v = (float)ref_value(f, mag); /* exact: at most 11 significant bits */
  return fbits(sign ? -v : v);
}

static uint16_t ref_nan_narrow(const fmt16 *f, uint32_t u) {
  uint32_t sign = (u >> 16) & 0x8000u;
  return (uint16_t)(sign | f->inf | 1u << (f->mbits - 1) | (u & 0x7fffffu) >> (23 - f->mbits));
}

/* Encodes a non-negative value that is representable (or >= 2^(emax+1):
 * inf), the inverse of ref_value via frexp. */
static uint32_t ref_encode(const fmt16 *f, double v) {
  int bias = (1 << (f->ebits - 1)) - 1, e;
  if (v >= ldexp(1.0, bias + 1)) return f->inf;
  if (v < ldexp(1.0, 1 - bias)) return (uint32_t)(v / ldexp(1.0, 1 - bias - f->mbits));
  double m = frexp(v, &e); /* v = m 2^e, m in [0.5, 1) */
  return (uint32_t)(e - 1 + bias) << f->mbits | (uint32_t)((2 * m - 1) * ldexp(1.0, f->mbits));
}

/* Narrowing, one value: the two neighbours of |x| on the format's grid (the
 * grid of x's binade, or the subnormal grid), the nearer one, ties to even. */
static uint16_t ref_narrow_slow(const fmt16 *f, float x) {
  uint32_t u = fbits(x), sign = (u >> 16) & 0x8000u;
  if (isnan(x)) return ref_nan_narrow(f, u);
  if (isinf(x)) return (uint16_t)(sign | f->inf);
  int bias = (1 << (f->ebits - 1)) - 1, e;
  double a = fabs((double)x);
  frexp(a, &e);
  int binade = e - 1 < 1 - bias ? 1 - bias : e - 1;
  double q = ldexp(1.0, binade - f->mbits); /* grid spacing */
  double lo = floor(a / q) * q, hi = lo + q;
  double pick;
  if (a - lo != hi - a) pick = a - lo < hi - a ? lo : hi;
  else pick = fmod(lo / q, 2.0) == 0.0 ? lo : hi;
  return (uint16_t)(sign | ref_encode(f, pick));
}

/* ---- traits and parsing ---- */

TEST(dtype_traits) {
  static const struct { ampc_dtype t; const char *name; size_t size; int is_float; } want[] = {
      {AMPC_DTYPE_F32, "f32", 4, 1}, {AMPC_DTYPE_F16, "f16", 2, 1}, {AMPC_DTYPE_BF16, "bf16", 2, 1},
      {AMPC_DTYPE_F64, "f64", 8, 1}, {AMPC_DTYPE_I64, "i64", 8, 0}, {AMPC_DTYPE_I32, "i32", 4, 0},
      {AMPC_DTYPE_I16, "i16", 2, 0}, {AMPC_DTYPE_I8, "i8", 1, 0},   {AMPC_DTYPE_U8, "u8", 1, 0},
      {AMPC_DTYPE_BOOL, "bool", 1, 0},
  };
  CHECK(sizeof want / sizeof want[0] == AMPC_DTYPE_COUNT);
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    CHECK_MSG(strcmp(ampc_dtype_name(want[i].t), want[i].name) == 0, "%s", want[i].name);
    CHECK_MSG(ampc_dtype_size(want[i].t) == want[i].size, "%s", want[i].name);
    CHECK_MSG(ampc_dtype_is_float(want[i].t) == want[i].is_float, "%s", want[i].name);
  }
  CHECK(ampc_dtype_size(AMPC_DTYPE_COUNT) == 0);
  CHECK(ampc_dtype_size((ampc_dtype)-1) == 0);
  CHECK(strcmp(ampc_dtype_name(AMPC_DTYPE_COUNT), "?") == 0);
  CHECK(!ampc_dtype_is_float((ampc_dtype)-1));
}

TEST(dtype_parse) {
  static const struct { const char *s; ampc_dtype t; } ok[] = {
      {"f32", AMPC_DTYPE_F32},      {"fp32", AMPC_DTYPE_F32},     {"float32", AMPC_DTYPE_F32},
      {"FLOAT32", AMPC_DTYPE_F32},  {"f16", AMPC_DTYPE_F16},      {"fp16", AMPC_DTYPE_F16},
      {"half", AMPC_DTYPE_F16},     {"float16", AMPC_DTYPE_F16},  {"F16", AMPC_DTYPE_F16},
      {"bf16", AMPC_DTYPE_BF16},    {"bfloat16", AMPC_DTYPE_BF16}, {"BF16", AMPC_DTYPE_BF16},
  };
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
    ampc_dtype t = AMPC_DTYPE_COUNT;
    CHECK_OK(ampc_dtype_parse(ok[i].s, &t));
    CHECK_MSG(t == ok[i].t, "%s", ok[i].s);
  }
  /* name -> parse is the identity for the float storage types */
  for (ampc_dtype t = AMPC_DTYPE_F32; t <= AMPC_DTYPE_BF16; t++) {
    ampc_dtype back = AMPC_DTYPE_COUNT;
    CHECK_OK(ampc_dtype_parse(ampc_dtype_name(t), &back));
    CHECK(back == t);
  }
  ampc_dtype t = AMPC_DTYPE_I8;
  CHECK_ERR(ampc_dtype_parse("f8", &t), AMPC_EINVAL, "unknown dtype 'f8'");
  CHECK(t == AMPC_DTYPE_I8); /* untouched on failure */
  CHECK_ERR(ampc_dtype_parse("", &t), AMPC_EINVAL, "unknown dtype");
  CHECK_ERR(ampc_dtype_parse("f16 ", &t), AMPC_EINVAL, "unknown dtype");
  CHECK_ERR(ampc_dtype_parse(NULL, &t), AMPC_EINVAL, "unknown dtype");
  CHECK_ERR(ampc_dtype_parse("f16", NULL), AMPC_EINVAL, "null");
}

/* ---- spot values: the rules, written out ---- */

TEST(known_values) {
  static const struct { uint32_t f; uint16_t h, b; } v[] = {
      {0x00000000u, 0x0000, 0x0000}, {0x80000000u, 0x8000, 0x8000}, /* +-0 */
      {0x3f800000u, 0x3c00, 0x3f80}, {0xc0000000u, 0xc000, 0xc000}, /* 1, -2 */
      {0x477fe000u, 0x7bff, 0x4780}, /* 65504, f16 max */
      {0x477fefffu, 0x7bff, 0x4780}, /* just below 65520 */
      {0x477ff000u, 0x7c00, 0x4780}, /* 65520: the tie goes to inf */
      {0x7f7fffffu, 0x7c00, 0x7f80}, /* f32 max: overflows both */
      {0x7f7f7fffu, 0x7c00, 0x7f7f}, /* just below bf16's overflow tie */
      {0x7f800000u, 0x7c00, 0x7f80}, {0xff800000u, 0xfc00, 0xff80}, /* +-inf */
      {0x38800000u, 0x0400, 0x3880}, /* 2^-14: smallest normal f16 */
      {0x387fc000u, 0x03ff, 0x3880}, /* largest subnormal f16 */
      {0x387fe000u, 0x0400, 0x3880}, /* tie between it and 2^-14: to even */
      {0x33800000u, 0x0001, 0x3380}, /* 2^-24: smallest subnormal f16 */
      {0x33000000u, 0x0000, 0x3300}, /* 2^-25: tie, to even zero */
      {0x33000001u, 0x0001, 0x3300}, /* just above: rounds up */
      {0xb3000000u, 0x8000, 0xb300}, /* -2^-25: to -0 */
      {0x00000001u, 0x0000, 0x0000}, /* smallest f32 subnormal */
      {0x00400000u, 0x0000, 0x0040}, /* an f32 subnormal bf16 keeps */
      {0x3f808000u, 0x3c04, 0x3f80}, /* bf16 tie at even: stays */
      {0x3f818000u, 0x3c0c, 0x3f82}, /* bf16 tie at odd: goes up */
      {0x3f801000u, 0x3c00, 0x3f80}, /* f16 tie at even: stays */
      {0x3f803000u, 0x3c02, 0x3f80}, /* f16 tie at odd: goes up */
      {0x7f800001u, 0x7e00, 0x7fc0}, /* signalling NaN: quiet, payload truncated */
      {0xff800001u, 0xfe00, 0xffc0}, /* sign kept */
      {0x7fc00000u, 0x7e00, 0x7fc0}, {0x7fffffffu, 0x7fff, 0x7fff},
      {0x7fa00000u, 0x7f00, 0x7fe0}, {0x7f802000u, 0x7e01, 0x7fc0},
      {0x7f810000u, 0x7e08, 0x7fc1},
  };
  for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
    float x = bitsf(v[i].f);
    CHECK_MSG(ampc_f32_to_f16(x) == v[i].h, "f32 %08x -> f16 %04x, want %04x", v[i].f, ampc_f32_to_f16(x), v[i].h);
    CHECK_MSG(ampc_f32_to_bf16(x) == v[i].b, "f32 %08x -> bf16 %04x, want %04x", v[i].f, ampc_f32_to_bf16(x), v[i].b);
    for (int p = 0; p < npaths(); p++) {
      uint16_t h, b;
      fmt_f16.narrow[p](&h, &x, 1);
      fmt_bf16.narrow[p](&b, &x, 1);
      CHECK_MSG(h == v[i].h, "%s: f32 %08x -> f16 %04x", path_name[p], v[i].f, h);
      CHECK_MSG(b == v[i].b, "%s: f32 %08x -> bf16 %04x", path_name[p], v[i].f, b);
    }
  }
  /* widening NaN: quiet bit set, payload zero-extended */
  CHECK(fbits(ampc_f16_to_f32(0x7c01)) == 0x7fc02000u);
  CHECK(fbits(ampc_f16_to_f32(0xfe00)) == 0xffc00000u);
  CHECK(fbits(ampc_bf16_to_f32(0xff81)) == 0xffc10000u);
  CHECK(fbits(ampc_f16_to_f32(0x0001)) == 0x33800000u);
  CHECK(fbits(ampc_f16_to_f32(0x8000)) == 0x80000000u);
  CHECK(fbits(ampc_bf16_to_f32(0x0001)) == 0x00010000u); /* an f32 subnormal */
}

/* ---- every 16-bit pattern, widened ---- */

static void check_widen_all(const fmt16 *f) {
  uint16_t *h = malloc(65536 * sizeof *h);
  uint32_t *want = malloc(65536 * sizeof *want);
  float *got = malloc(65536 * sizeof *got);
  for (uint32_t i = 0; i < 65536; i++) {
    h[i] = (uint16_t)i;
    want[i] = ref_widen(f, (uint16_t)i);
  }
  int bad = 0;
  for (uint32_t i = 0; i < 65536; i++)
    if (fbits(f->widen1(h[i])) != want[i] && bad++ < 5)
      CHECK_MSG(0, "%s %04x -> f32 %08x, want %08x", f->name, i, fbits(f->widen1(h[i])), want[i]);
  for (int p = 0; p < npaths(); p++) {
    f->widen[p](got, h, 65536);
    for (uint32_t i = 0; i < 65536; i++)
      if (fbits(got[i]) != want[i] && bad++ < 10)
        CHECK_MSG(0, "%s: %s %04x -> f32 %08x, want %08x", path_name[p], f->name, i, fbits(got[i]), want[i]);
  }
  CHECK_MSG(bad == 0, "%s widening: %d mismatches", f->name, bad);
  free(h);
  free(want);
  free(got);
}

TEST(f16_to_f32_all) { check_widen_all(&fmt_f16); }
TEST(bf16_to_f32_all) { check_widen_all(&fmt_bf16); }

/* 16 -> 32 -> 16 is the identity except that signalling NaNs come back quiet. */
static void check_roundtrip(const fmt16 *f) {
  uint16_t *h = malloc(65536 * sizeof *h), *back = malloc(65536 * sizeof *back);
  float *x = malloc(65536 * sizeof *x);
  for (uint32_t i = 0; i < 65536; i++) h[i] = (uint16_t)i;
  int bad = 0;
  for (int p = 0; p < npaths(); p++) {
    f->widen[p](x, h, 65536);
    f->narrow[p](back, x, 65536);
    for (uint32_t i = 0; i < 65536; i++) {
      int nan = (i & 0x7fffu) > f->inf;
      uint32_t want = nan ? (i | 1u << (f->mbits - 1)) : i;
      uint16_t one = f->narrow1(f->widen1((uint16_t)i));
      if ((back[i] != want || one != want) && bad++ < 5)
        CHECK_MSG(0, "%s %04x -> f32 -> %04x (%s bulk), %04x (single), want %04x", f->name, i, back[i],
                  path_name[p], one, want);
    }
  }
  CHECK_MSG(bad == 0, "%s round trip: %d mismatches", f->name, bad);
  free(h);
  free(back);
  free(x);
}

TEST(roundtrip_f16) { check_roundtrip(&fmt_f16); }
TEST(roundtrip_bf16) { check_roundtrip(&fmt_bf16); }

/* ---- narrowing: the slow reference on the hard cases ---- */

/* Every f32 within 3 ulps of every midpoint between neighbouring codes and of
 * every code's own value (both signs), specials, and a sparse spread over all
 * patterns: slow reference == single-value function == each bulk path. */
static void check_narrow_slow(const fmt16 *f) {
  size_t cap = (size_t)f->inf * 2 * 2 * 7 + 2 * 1048576 + 64, n = 0;
  float *x = malloc(cap * sizeof *x);
  uint16_t *got = malloc(cap * sizeof *got);
  for (uint32_t k = 0; k <= f->inf; k++) {
    double at[2] = {ref_value(f, k), k < f->inf ? (ref_value(f, k) + ref_value(f, k + 1)) / 2 : 0};
    for (int w = 0; w < (k < f->inf ? 2 : 1); w++) {
      uint32_t c = fbits((float)at[w]); /* exact: midpoints need mbits + 2 bits */
      for (uint32_t d = c < 3 ? 0 : c - 3; d <= c + 3; d++) {
        x[n++] = bitsf(d);
        x[n++] = bitsf(d | 0x80000000u);
      }
    }
  }
  for (uint32_t i = 0; i < 1048576; i++) { /* 4099 is odd: visits all low bits */
    x[n++] = bitsf(i * 4099u * 997u);
    x[n++] = bitsf(0x7f800000u + i); /* inf and the first NaNs */
  }
  if (n > cap) abort(); /* the sizes above are wrong */
  int bad = 0;
  for (size_t i = 0; i < n; i++) {
    uint16_t want = ref_narrow_slow(f, x[i]), one = f->narrow1(x[i]);
    if (one != want && bad++ < 5)
      CHECK_MSG(0, "%s: f32 %08x -> %04x, reference %04x", f->name, fbits(x[i]), one, want);
  }
  for (int p = 0; p < npaths(); p++) {
    f->narrow[p](got, x, n);
    for (size_t i = 0; i < n; i++) {
      uint16_t want = ref_narrow_slow(f, x[i]);
      if (got[i] != want && bad++ < 10)
        CHECK_MSG(0, "%s: f32 %08x -> %s %04x, reference %04x", path_name[p], fbits(x[i]), f->name, got[i], want);
    }
  }
  CHECK_MSG(bad == 0, "%s narrowing (slow reference, %zu values): %d mismatches", f->name, n, bad);
  free(x);
  free(got);
}

TEST(f32_to_f16_hard_cases) { check_narrow_slow(&fmt_f16); }
TEST(f32_to_bf16_hard_cases) { check_narrow_slow(&fmt_bf16); }

/* ---- narrowing: all 2^32 patterns, every path ---- */

#define BLOCK 65536u /* patterns per block; blocks never straddle the sign bit */

/* The midpoints between consecutive codes as f32 bit patterns: each one is
 * an f32 exactly (it needs mbits + 2 significant bits, and bf16's subnormal
 * midpoints lie on the f32 subnormal grid), and for non-negative floats the
 * order of the bit patterns is the order of the values, so the walk compares
 * integers. */
typedef struct {
  uint32_t *mid; /* mid[k]: midpoint between codes k and k+1, k < inf */
  uint32_t inf;
} walk_table;

static int walk_table_make(const fmt16 *f, walk_table *w) {
  w->inf = f->inf;
  w->mid = malloc(f->inf * sizeof *w->mid);
  for (uint32_t k = 0; k < f->inf; k++) {
    double m = (ref_value(f, k) + ref_value(f, k + 1)) / 2;
    if ((double)(float)m != m) return 0;
    w->mid[k] = fbits((float)m);
  }
  return 1;
}

/* Rounding |x| (bits mag) goes up past code k if it is above the midpoint,
 * or on it with k odd. */
static int walk_up(const walk_table *w, uint32_t k, uint32_t mag) {
  return k < w->inf && (mag > w->mid[k] || (mag == w->mid[k] && (k & 1u)));
}

/* The correct code for mag: the number of k for which rounding goes past k
 * (monotone in k), by bisection. */
static uint32_t walk_start(const walk_table *w, uint32_t mag) {
  uint32_t lo = 0, hi = w->inf; /* answer in [lo, hi] */
  while (lo < hi) {
    uint32_t m = lo + (hi - lo) / 2;
    if (walk_up(w, m, mag)) lo = m + 1;
    else hi = m;
  }
  return lo;
}

/* Expected codes for the BLOCK patterns from base on. Walking up from the
 * first pattern's code, code k covers a run of patterns that ends at mid[k]
 * (a tie stays at an even k) or just before it (odd k), so the block is
 * filled run by run. */
static void walk_block(const fmt16 *f, const walk_table *w, uint32_t base, uint16_t *want) {
  uint32_t sign = (base >> 16) & 0x8000u, mag0 = base & 0x7fffffffu, i = 0;
  if (mag0 <= 0x7f800000u) {
    uint32_t numbers = 0x7f800000u - mag0 + 1 < BLOCK ? 0x7f800000u - mag0 + 1 : BLOCK; /* up to inf */
    for (uint32_t k = walk_start(w, mag0); i < numbers; k++) {
      uint64_t last = k < w->inf ? (uint64_t)w->mid[k] - (k & 1u) : UINT64_MAX; /* >= mag0 */
      uint64_t end = last - mag0 + 1 < numbers ? last - mag0 + 1 : numbers;
      for (; i < end; i++) want[i] = (uint16_t)(sign | k);
    }
  }
  for (; i < BLOCK; i++) want[i] = ref_nan_narrow(f, base + i);
}

static void sweep_narrow(const fmt16 *f) {
  walk_table w;
  CHECK_MSG(walk_table_make(f, &w), "%s: a midpoint is not an f32", f->name);
  long bad[3] = {0, 0, 0};
  uint32_t first_bad[3] = {0, 0, 0};
  double t_ref = 0, t_path[3] = {0, 0, 0}, t0 = seconds(CLOCK_MONOTONIC);
  int np = npaths(), threads = 1;
#pragma omp parallel reduction(+ : t_ref)
  {
    float *in = malloc(BLOCK * sizeof *in);
    uint16_t *want = malloc(BLOCK * sizeof *want), *got = malloc(BLOCK * sizeof *got);
    double tp[3] = {0, 0, 0};
#pragma omp single
    threads = omp_get_num_threads();
#pragma omp for schedule(dynamic, 16)
    for (long b = 0; b < (long)(4294967296ull / BLOCK); b++) {
      uint32_t base = (uint32_t)b * BLOCK;
      for (uint32_t i = 0; i < BLOCK; i++) in[i] = bitsf(base + i);
      double t = now();
      walk_block(f, &w, base, want);
      t_ref += now() - t;
      for (int p = 0; p < np; p++) {
        t = now();
        f->narrow[p](got, in, BLOCK);
        tp[p] += now() - t;
        if (memcmp(got, want, BLOCK * sizeof *got) == 0) continue;
        long nb = 0;
        uint32_t fb = 0;
        for (uint32_t i = BLOCK; i-- > 0;)
          if (got[i] != want[i]) nb++, fb = base + i;
#pragma omp critical
        {
          if (bad[p] == 0 || fb < first_bad[p]) first_bad[p] = fb;
          bad[p] += nb;
        }
      }
    }
#pragma omp critical
    for (int p = 0; p < 3; p++) t_path[p] += tp[p];
    free(in);
    free(want);
    free(got);
  }
  double wall = seconds(CLOCK_MONOTONIC) - t0;
  for (int p = 0; p < np; p++) {
    if (bad[p]) {
      float x = bitsf(first_bad[p]);
      uint16_t got1;
      f->narrow[p](&got1, &x, 1);
      CHECK_MSG(0, "%s: f32 -> %s: %ld of 2^32 patterns wrong, first %08x -> %04x, reference %04x",
                path_name[p], f->name, bad[p], first_bad[p], got1, ref_narrow_slow(f, x));
    }
  }
  printf("     f32 -> %-4s all 2^32 patterns: %.1f s wall on %d threads; CPU seconds: reference %.1f",
         f->name, wall, threads, t_ref);
  for (int p = 0; p < np; p++)
    printf(", %s %.2f (%.1f GB/s)", path_name[p], t_path[p], 6.0 * 4294967296.0 / t_path[p] / 1e9);
  printf("\n");
  free(w.mid);
}

/* AMPC_TEST_QUICK (the sanitizer pass) skips the 2^32 sweeps, which the plain
 * build runs in full. */
static int quick(void) { return getenv("AMPC_TEST_QUICK") != NULL; }
TEST(f32_to_f16_all_2p32) {
  if (quick()) printf("skipped under AMPC_TEST_QUICK: the full sweep runs in the plain build\n");
  else sweep_narrow(&fmt_f16);
}
/* (where the CPU has avx512_bf16, the AVX-512 path narrows with its
 * conversion instruction: swept that way, then with the integer rounding) */
TEST(f32_to_bf16_all_2p32) {
  if (quick()) {
    printf("skipped under AMPC_TEST_QUICK: the full sweep runs in the plain build\n");
    return;
  }
  sweep_narrow(&fmt_bf16);
#if AMPC__DTYPE_X86
  if (ampc__cpu_has_avx512_bf16()) { /* (which includes the AVX-512 path itself) */
    printf("     (the avx512 path above with avx512_bf16's vcvtneps2bf16; again with the integer rounding:)\n");
    ampc__convert_bf16_instruction = 0;
    sweep_narrow(&fmt_bf16);
    ampc__convert_bf16_instruction = 1;
  }
#endif
}

/* ---- bulk functions: tails, alignment, no writes outside [0, n) ---- */

TEST(bulk_tails) {
  enum { MAXN = 70, PAD = 8 };
  float src32[MAXN + PAD], dst32[MAXN + 2 * PAD];
  uint16_t src16[MAXN + PAD], dst16[MAXN + 2 * PAD];
  for (int i = 0; i < MAXN + PAD; i++) {
    src32[i] = bitsf(0x3f800000u + (uint32_t)i * 0x01234567u); /* spread, with NaNs and tiny values */
    src16[i] = (uint16_t)(0x3c00u + (uint32_t)i * 0x2345u);
  }
  const fmt16 *fmts[2] = {&fmt_f16, &fmt_bf16};
  int bad = 0;
  for (int fi = 0; fi < 2; fi++)
    for (int p = 0; p < npaths(); p++)
      for (int off = 0; off < PAD; off++)
        for (int n = 0; n <= MAXN; n++) {
          const fmt16 *f = fmts[fi];
          memset(dst16, 0xa5, sizeof dst16);
          f->narrow[p](dst16 + PAD + off, src32 + off, (size_t)n);
          for (int i = 0; i < MAXN + 2 * PAD; i++) {
            int j = i - PAD - off;
            uint16_t want = j >= 0 && j < n ? f->narrow1(src32[off + j]) : 0xa5a5;
            if (dst16[i] != want && bad++ < 5)
              CHECK_MSG(0, "%s %s narrow n=%d off=%d: [%d] = %04x, want %04x", path_name[p], f->name, n, off, j,
                        dst16[i], want);
          }
          memset(dst32, 0xa5, sizeof dst32);
          f->widen[p](dst32 + PAD + off, src16 + off, (size_t)n);
          for (int i = 0; i < MAXN + 2 * PAD; i++) {
            int j = i - PAD - off;
            uint32_t want = j >= 0 && j < n ? fbits(f->widen1(src16[off + j])) : 0xa5a5a5a5u;
            if (fbits(dst32[i]) != want && bad++ < 5)
              CHECK_MSG(0, "%s %s widen n=%d off=%d: [%d] = %08x, want %08x", path_name[p], f->name, n, off, j,
                        fbits(dst32[i]), want);
          }
        }
  CHECK(bad == 0);
}

/* Rounding in place is storing and loading back, bit for bit, in each type,
 * on every path, for every length (vector bodies and tails) and for special
 * values: NaN, infinities, subnormals, ties. */
TEST(round_in_place) {
  enum { MAXN = 300 };
  static const ampc_dtype types[] = {AMPC_DTYPE_F32, AMPC_DTYPE_F16, AMPC_DTYPE_BF16};
  float src[MAXN], got[MAXN], want[MAXN];
  uint16_t buf[MAXN];
  for (int i = 0; i < MAXN; i++) src[i] = bitsf(0x33000000u + (uint32_t)i * 0x00f12345u);
  src[3] = NAN;
  src[4] = INFINITY;
  src[5] = -INFINITY;
  src[6] = 1.0f + 1.0f / 2048.0f; /* an f16 tie */
  src[7] = 1e-6f;                 /* f16 subnormal */
  src[8] = 70000.0f;              /* f16 overflow */
  src[9] = bitsf(0x7f800001u);    /* signalling NaNs, payloads below and across bf16's bits */
  src[10] = bitsf(0xff812345u);
  src[11] = bitsf(0x7f7fffffu);   /* the largest finite f32: bf16 rounds it to inf */
  src[12] = bitsf(0x3f808000u);   /* a bf16 tie, to even (down) */
  src[13] = bitsf(0x3f818000u);   /* and up */
  src[14] = bitsf(0x00008001u);   /* a subnormal f32 */
  int bad = 0;
  for (int p = 0; p < npaths(); p++) {
    CHECK(ampc__convert_force_path(p) == p);
    for (int t = 0; t < 3; t++)
      for (int n = 0; n <= MAXN; n += n < 40 ? 1 : 37) {
        memcpy(got, src, sizeof src);
        memcpy(want, src, sizeof src);
        ampc__round_f32(types[t], got, (size_t)n);
        if (types[t] != AMPC_DTYPE_F32) {
          ampc_store_f32(types[t], buf, want, (size_t)n);
          ampc_load_f32(want, types[t], buf, (size_t)n);
        }
        for (int i = 0; i < MAXN; i++)
          if (fbits(got[i]) != fbits(want[i]) && bad++ < 5)
            CHECK_MSG(0, "%s %s n=%d: [%d] = %08x, want %08x", ampc_dtype_name(types[t]), path_name[p], n, i, fbits(got[i]),
                      fbits(want[i]));
      }
  }
  ampc__convert_force_path(-1);
  CHECK(bad == 0);
}

/* ---- path selection ---- */

TEST(convert_path) {
  static const char *names[3] = {"scalar", "avx2+f16c", "avx512"};
  int best = npaths() - 1;
  CHECK(best == (ampc__cpu_has_avx512() ? 2 : ampc__cpu_has_avx2_f16c() ? 1 : 0));
  CHECK(strcmp(ampc_convert_path(), names[best]) == 0);
  ampc__convert_force_scalar(1);
  CHECK(strcmp(ampc_convert_path(), "scalar") == 0);
  ampc__convert_force_scalar(0);
  CHECK(strcmp(ampc_convert_path(), names[best]) == 0);
  /* each path the CPU runs can be forced; one it cannot run gives the best */
  for (int p = 0; p < 3; p++) {
    CHECK(ampc__convert_force_path(p) == (p <= best ? p : best));
    CHECK(strcmp(ampc_convert_path(), names[p <= best ? p : best]) == 0);
  }
  CHECK(ampc__convert_force_path(-1) == best);
  CHECK(strcmp(ampc_convert_path(), names[best]) == 0);
  printf("     bulk conversion path: %s\n", ampc_convert_path());
}

/* The OpenBLAS kernel set ampc asks for: only where OpenBLAS chose one
 * without AVX2 on a CPU that has it (model numbers it does not know), the
 * AVX-512 set where the CPU has AVX-512; its own choice kept otherwise. */
TEST(blas_core_rule) {
  CHECK(strcmp(ampc__blas_better_core("Prescott", 1, 1), "SkylakeX") == 0);
  CHECK(strcmp(ampc__blas_better_core("prescott", 1, 0), "Haswell") == 0);
  CHECK(strcmp(ampc__blas_better_core("Sandybridge", 1, 0), "Haswell") == 0);
  CHECK(strcmp(ampc__blas_better_core("Nehalem", 1, 1), "SkylakeX") == 0);
  CHECK(ampc__blas_better_core("Prescott", 0, 0) == NULL); /* the CPU has no better */
  /* AVX2 kernels: right for an AVX2 CPU, narrow for an AVX-512 one */
  static const char *const avx2[] = {"Haswell", "zen", "Excavator"};
  for (size_t i = 0; i < sizeof avx2 / sizeof *avx2; i++) {
    CHECK(ampc__blas_better_core(avx2[i], 1, 0) == NULL);
    CHECK(strcmp(ampc__blas_better_core(avx2[i], 1, 1), "SkylakeX") == 0);
  }
  static const char *const fine[] = {"SkylakeX", "Cooperlake", "SapphireRapids", "NewCore"};
  for (size_t i = 0; i < sizeof fine / sizeof *fine; i++) {
    CHECK(ampc__blas_better_core(fine[i], 1, 1) == NULL);
    CHECK(ampc__blas_better_core(fine[i], 1, 0) == NULL);
  }
  CHECK(ampc__blas_better_core(NULL, 1, 1) == NULL);
  /* the library's answer for this process: the linked OpenBLAS's core */
  const char *core = ampc_blas_core(), *better = ampc_blas_better_core();
  CHECK(core && *core && strncmp(ampc_blas_name(), "OpenBLAS", 8) == 0);
  CHECK(better == ampc__blas_better_core(core, ampc__cpu_has_avx2_f16c(), ampc__cpu_has_avx512()));
  printf("     %s, core %s%s%s\n", ampc_blas_name(), core, better ? "; fits this cpu better: " : "", better ? better : "");
}

/* ---- ampc_convert, load/store: every pair, every path ---- */

enum { NCONV = 1000 + 37 }; /* several of convert's 256-element blocks, and a tail */

static void fill_mixed(float *x32, uint16_t *x16, int n) {
  static const uint32_t special[] = {0, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7f800001u, 0x7fc00000u,
                                     0x477ff000u, 0x33000000u, 0x00000001u, 0x3f808000u};
  uint32_t s = 12345;
  for (int i = 0; i < n; i++) {
    s = s * 1664525u + 1013904223u;
    x32[i] = bitsf(i < 10 ? special[i] : s);
    x16[i] = i < 10 ? (uint16_t)(special[i] >> 16) : (uint16_t)(s >> 16);
  }
}

/* Element i of an array of type t, as bits. */
static uint32_t elem(ampc_dtype t, const void *p, int i) {
  if (t == AMPC_DTYPE_F32) {
    uint32_t u;
    memcpy(&u, (const char *)p + 4 * (size_t)i, 4);
    return u;
  }
  return ((const uint16_t *)p)[i];
}

/* Element i converted from type st to dt by the single-value functions. */
static uint32_t convert1(ampc_dtype dt, ampc_dtype st, const void *src, int i) {
  uint32_t x = elem(st, src, i);
  if (st == dt) return x; /* a copy, bit for bit (NaNs untouched) */
  if (st == AMPC_DTYPE_F16) x = fbits(ampc_f16_to_f32((uint16_t)x));
  if (st == AMPC_DTYPE_BF16) x = fbits(ampc_bf16_to_f32((uint16_t)x));
  if (dt == AMPC_DTYPE_F16) return ampc_f32_to_f16(bitsf(x));
  if (dt == AMPC_DTYPE_BF16) return ampc_f32_to_bf16(bitsf(x));
  return x;
}

TEST(convert_pairs) {
  static float src32[NCONV], dst32[NCONV];
  static uint16_t src16[NCONV], dst16[NCONV];
  fill_mixed(src32, src16, NCONV);
  const ampc_dtype types[3] = {AMPC_DTYPE_F32, AMPC_DTYPE_F16, AMPC_DTYPE_BF16};
  int bad = 0;
  for (int p = 0; p < npaths(); p++) {
    CHECK(ampc__convert_force_path(p) == p);
    for (int a = 0; a < 3; a++)
      for (int b = 0; b < 3; b++) {
        ampc_dtype st = types[a], dt = types[b];
        const void *src = st == AMPC_DTYPE_F32 ? (const void *)src32 : src16;
        void *dst = dt == AMPC_DTYPE_F32 ? (void *)dst32 : dst16;
        CHECK_OK(ampc_convert(dt, dst, st, src, NCONV));
        for (int i = 0; i < NCONV; i++) {
          uint32_t want = convert1(dt, st, src, i);
          if (elem(dt, dst, i) != want && bad++ < 5)
            CHECK_MSG(0, "%s: convert %s -> %s [%d] = %x, want %x", ampc_convert_path(), ampc_dtype_name(st),
                      ampc_dtype_name(dt), i, elem(dt, dst, i), want);
        }
        if (st == AMPC_DTYPE_F32 || dt == AMPC_DTYPE_F32) {
          /* load/store are the same conversions */
          memset(dst, 0, NCONV * ampc_dtype_size(dt));
          if (dt == AMPC_DTYPE_F32) ampc_load_f32(dst32, st, src, NCONV);
          else ampc_store_f32(dt, dst, src32, NCONV);
          for (int i = 0; i < NCONV; i++) {
            if (elem(dt, dst, i) != convert1(dt, st, src, i) && bad++ < 5)
              CHECK_MSG(0, "load/store %s -> %s [%d]", ampc_dtype_name(st), ampc_dtype_name(dt), i);
          }
        }
      }
    /* the public bulk functions give the same bits on every path */
    static float xf[NCONV];
    static uint16_t h[NCONV];
    memcpy(xf, src32, sizeof xf);
    ampc_f32_to_f16_n(h, xf, NCONV);
    for (int i = 0; i < NCONV; i++) bad += h[i] != ampc_f32_to_f16(xf[i]);
    ampc_f32_to_bf16_n(h, xf, NCONV);
    for (int i = 0; i < NCONV; i++) bad += h[i] != ampc_f32_to_bf16(xf[i]);
    ampc_f16_to_f32_n(xf, src16, NCONV);
    for (int i = 0; i < NCONV; i++) bad += fbits(xf[i]) != fbits(ampc_f16_to_f32(src16[i]));
    ampc_bf16_to_f32_n(xf, src16, NCONV);
    for (int i = 0; i < NCONV; i++) bad += fbits(xf[i]) != fbits(ampc_bf16_to_f32(src16[i]));
  }
  ampc__convert_force_scalar(0);
  CHECK(bad == 0);

  /* in place, same type: a no-op */
  memcpy(dst16, src16, sizeof dst16);
  CHECK_OK(ampc_convert(AMPC_DTYPE_F16, dst16, AMPC_DTYPE_F16, dst16, NCONV));
  CHECK(memcmp(dst16, src16, sizeof dst16) == 0);
  /* nothing to do: null buffers allowed */
  CHECK_OK(ampc_convert(AMPC_DTYPE_F16, NULL, AMPC_DTYPE_F32, NULL, 0));
  CHECK_ERR(ampc_convert(AMPC_DTYPE_F16, NULL, AMPC_DTYPE_F32, src32, 4), AMPC_EINVAL, "null buffer");
  CHECK_ERR(ampc_convert(AMPC_DTYPE_I32, dst32, AMPC_DTYPE_F32, src32, 4), AMPC_EINVAL, "f32 -> i32");
  CHECK_ERR(ampc_convert(AMPC_DTYPE_F32, dst32, AMPC_DTYPE_F64, src32, 4), AMPC_EINVAL, "f64 -> f32");
  CHECK_ERR(ampc_convert(AMPC_DTYPE_F16, dst16, AMPC_DTYPE_COUNT, src16, 4), AMPC_EINVAL, "unsupported");
}

/* ---- the floating-point environment ---- */

/* Nothing (no -ffast-math start-up code, no library call) has turned on
 * flush-to-zero or denormals-are-zero; and each path gives the same bits
 * when a caller has set FTZ/DAZ and any rounding mode (correctness itself is
 * checked above, in the default environment). */
TEST(fp_environment) {
#if AMPC__DTYPE_X86
  enum { FTZ = 0x8000, DAZ = 0x0040, RC_SHIFT = 13, NX = 2 * 65536 };
  float *xs = malloc(NX * sizeof *xs), *w0 = malloc(65536 * sizeof *w0), *w1 = malloc(65536 * sizeof *w1);
  uint16_t *h = malloc(65536 * sizeof *h), *n0 = malloc(NX * sizeof *n0), *n1 = malloc(NX * sizeof *n1);
  const fmt16 *fmts[2] = {&fmt_f16, &fmt_bf16};
  for (uint32_t i = 0; i < 65536; i++) {
    h[i] = (uint16_t)i;
    xs[i] = bitsf(i * 0x10001u);                    /* every exponent, f32 subnormals included */
    xs[65536 + i] = bitsf(0x33000000u + i * 0x71u); /* the f16 subnormal range, with ties */
  }
  ampc_f32_to_f16_n(n0, xs, NX);
  ampc_f16_to_f32_n(w0, h, 65536);
  CHECK((_mm_getcsr() & (FTZ | DAZ)) == 0);
  unsigned saved = _mm_getcsr();
  for (int fi = 0; fi < 2; fi++)
    for (int p = 0; p < npaths(); p++) {
      const fmt16 *f = fmts[fi];
      f->narrow[p](n0, xs, NX);
      f->widen[p](w0, h, 65536);
      for (unsigned rc = 0; rc < 4; rc++) {
        _mm_setcsr((saved & ~(3u << RC_SHIFT)) | FTZ | DAZ | rc << RC_SHIFT);
        f->narrow[p](n1, xs, NX);
        f->widen[p](w1, h, 65536);
        _mm_setcsr(saved);
        CHECK_MSG(memcmp(n0, n1, NX * sizeof *n0) == 0, "%s: f32 -> %s changed under FTZ/DAZ, rounding control %u",
                  path_name[p], f->name, rc);
        CHECK_MSG(memcmp(w0, w1, 65536 * sizeof *w0) == 0, "%s: %s -> f32 changed under FTZ/DAZ, rounding control %u",
                  path_name[p], f->name, rc);
      }
    }
  free(xs);
  free(w0);
  free(w1);
  free(h);
  free(n0);
  free(n1);
#endif
}

/* load/store of f64 (to nearest), and of types that are not float ones:
 * NaNs out, nothing in -- neither call can fail or stop the program */
TEST(load_store_other_types) {
  double d[3] = {1.5, 1.0 + 1e-12, -3.25e38};
  float f[3];
  ampc_load_f32(f, AMPC_DTYPE_F64, d, 3);
  CHECK(f[0] == 1.5f && f[1] == 1.0f && f[2] == -3.25e38f);
  double back[3] = {0};
  ampc_store_f32(AMPC_DTYPE_F64, back, f, 3);
  CHECK(back[0] == 1.5 && back[1] == 1.0 && back[2] == (double)-3.25e38f);
  int32_t ints[2] = {7, 9};
  ampc_load_f32(f, AMPC_DTYPE_I32, ints, 2);
  CHECK(isnan(f[0]) && isnan(f[1]));
  ampc_store_f32(AMPC_DTYPE_I32, ints, f, 2);
  CHECK(ints[0] == 7 && ints[1] == 9);
  ampc_load_f32(f, (ampc_dtype)99, ints, 1);
  CHECK(isnan(f[0]));
}

TEST_MAIN(TEST_ENTRY(dtype_traits), TEST_ENTRY(load_store_other_types), TEST_ENTRY(round_in_place), TEST_ENTRY(dtype_parse), TEST_ENTRY(convert_path), TEST_ENTRY(blas_core_rule),
          TEST_ENTRY(known_values), TEST_ENTRY(f16_to_f32_all), TEST_ENTRY(bf16_to_f32_all),
          TEST_ENTRY(roundtrip_f16), TEST_ENTRY(roundtrip_bf16), TEST_ENTRY(f32_to_f16_hard_cases),
          TEST_ENTRY(f32_to_bf16_hard_cases), TEST_ENTRY(bulk_tails), TEST_ENTRY(convert_pairs),
          TEST_ENTRY(fp_environment), TEST_ENTRY(f32_to_f16_all_2p32), TEST_ENTRY(f32_to_bf16_all_2p32))
