/* The AVX-512 kernels on any CPU: src/core/dtype_avx512.c and
 * src/backend/cpu/step_avx512.c compiled a second time, here, against an
 * emulation of the intrinsics (avx512_emu.h: SIMDe, and what it lacks), and
 * compared bit for bit with the library's scalar code, which test_dtype and
 * test_step_math check against references of their own.
 *
 * This checks the kernels' logic (lanes, masks, tails, the order of the
 * operations) where the CPU cannot run them; where it can, test_dtype,
 * test_optim and test_step_math run the real ones against the same scalar
 * code. What it cannot check is the compiler's code for AVX-512 (that is
 * what those tests are for): contraction into FMAs in particular, which the
 * library's build allows in step_avx512.c and this one does not. The
 * emulation of the f16 conversions is checked against the F16C instructions
 * (through the library's AVX2 path) where the CPU has them. */
#include "avx512_emu.h"

#include <float.h>
#include <sys/mman.h>
#include <unistd.h>

/* The kernels under test, renamed so as not to clash with the library's
 * (linked for its scalar code). */
#define AMPC_AVX512_EMULATE 1
#define ampc__f16_to_f32_n_avx512 emu_f16_to_f32_n
#define ampc__f32_to_f16_n_avx512 emu_f32_to_f16_n
#define ampc__bf16_to_f32_n_avx512 emu_bf16_to_f32_n
#define ampc__f32_to_bf16_n_avx512 emu_f32_to_bf16_n
#define ampc__f16_round_n_avx512 emu_f16_round_n
#define ampc__bf16_round_n_avx512 emu_bf16_round_n
#define ampc__cpu_sgd_avx512 emu_sgd
#define ampc__cpu_adam_avx512 emu_adam
#include "core/dtype_avx512.c"
#include "backend/cpu/step_avx512.c"

#include "test.h"

static uint32_t fbits(float f) { return emu_f32_bits(f); }
static float bitsf(uint32_t u) { return emu_bits_f32(u); }

static uint64_t lcg(uint64_t *s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return *s >> 32;
}

/* f32 values where the conversions are hard: zeros, f32 and f16
 * subnormals, the f16 and bf16 rounding ties and overflow boundaries,
 * infinities, NaNs of both signs, quiet and signalling, with payloads. */
static const uint32_t special32[] = {
    0x00000000u, 0x80000000u, 0x00000001u, 0x80000001u, 0x007fffffu, 0x00400000u, 0x00800000u, /* f32 subnormals */
    0x33000000u, 0x33000001u, 0xb3000000u, 0x33800000u, 0x33c00000u, 0x34000000u,             /* 2^-25, 2^-24 */
    0x387fc000u, 0x387fe000u, 0x387ff000u, 0x38800000u, 0xb87fe000u,                           /* f16 subnormal top */
    0x3f801000u, 0x3f803000u, 0x3f800fffu, 0x3f801001u, 0x3f808000u, 0x3f818000u, 0x3f807fffu, /* ties at 1 */
    0x477fe000u, 0x477fefffu, 0x477ff000u, 0x477ff001u, 0x47800000u, 0xc77ff000u, 0xc77fefffu, /* 65504..65536 */
    0x7f7f7fffu, 0x7f7f8000u, 0x7f7fffffu, 0xff7f8000u,                                         /* bf16 overflow */
    0x7f800000u, 0xff800000u,                                                                   /* infinities */
    0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7fa00000u, 0x7fbfffffu, 0x7fffffffu, 0xffffffffu,
    0x7f802000u, 0x7f801fffu, 0x7fc0ffffu, 0xff812345u, /* NaN payloads around the bits f16 and bf16 keep */
};
enum { NSPECIAL32 = sizeof special32 / sizeof special32[0] };

/* The f32 narrowing inputs: every f16-sized step of the f32 patterns (the
 * top 19 bits, sign included) with the low 13 bits at and around the f16
 * rounding point, then the specials and random patterns; the count is no
 * multiple of 16, so the end is a tail. */
static float *narrow_inputs(size_t *n) {
  static const uint32_t low[] = {0x0000u, 0x0001u, 0x0fffu, 0x1000u, 0x1001u, 0x1fffu};
  size_t nlow = sizeof low / sizeof low[0], cnt = ((size_t)1 << 19) * nlow + NSPECIAL32 + 100003;
  float *x = malloc(cnt * sizeof *x);
  size_t k = 0;
  for (uint32_t hi = 0; hi < (1u << 19); hi++)
    for (size_t j = 0; j < nlow; j++) x[k++] = bitsf(hi << 13 | low[j]);
  for (int i = 0; i < NSPECIAL32; i++) x[k++] = bitsf(special32[i]);
  uint64_t s = 42;
  while (k < cnt) x[k++] = bitsf((uint32_t)lcg(&s));
  *n = cnt;
  return x;
}

/* ---- the emulation itself ---- */

/* The emulated FMA rounds once: (1 + 2^-23)(1 - 2^-23) - 1 = -2^-46 exactly,
 * where rounding the product first gives 0. */
TEST(emulated_fma_is_fused) {
  __m512 a = _mm512_set1_ps(1.0f + 0x1p-23f), b = _mm512_set1_ps(1.0f - 0x1p-23f), c = _mm512_set1_ps(-1.0f);
  float r[16];
  _mm512_storeu_ps(r, _mm512_fmadd_ps(a, b, c));
  for (int i = 0; i < 16; i++) CHECK(r[i] == -0x1p-46f);
}

/* The emulated vcvtph2ps/vcvtps2ph give the F16C instructions' bits: on
 * every f16 code, and on the narrowing inputs. */
TEST(emulated_f16_conversions_are_f16c) {
#if AMPC__DTYPE_X86
  if (!ampc__cpu_has_avx2_f16c()) {
    printf("     (no F16C on this CPU: the emulated f16 conversions are not checked against it)\n");
    return;
  }
  enum { NH = 65536 };
  uint16_t *h = malloc(NH * sizeof *h), *got16 = NULL, *want16 = NULL;
  float *got = malloc(NH * sizeof *got), *want = malloc(NH * sizeof *want);
  for (uint32_t i = 0; i < NH; i++) h[i] = (uint16_t)i;
  for (size_t i = 0; i < NH; i += 16) _mm512_storeu_ps(got + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(h + i))));
  ampc__f16_to_f32_n_avx2(want, h, NH);
  int bad = 0;
  for (size_t i = 0; i < NH; i++)
    if (fbits(got[i]) != fbits(want[i]) && bad++ < 5)
      CHECK_MSG(0, "emulated vcvtph2ps %04zx -> %08x, F16C %08x", i, fbits(got[i]), fbits(want[i]));
  size_t n;
  float *x = narrow_inputs(&n);
  n -= n % 16;
  got16 = malloc(n * sizeof *got16);
  want16 = malloc(n * sizeof *want16);
  for (size_t i = 0; i < n; i += 16)
    _mm256_storeu_si256((__m256i *)(got16 + i), _mm512_cvtps_ph(_mm512_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
  ampc__f32_to_f16_n_avx2(want16, x, n);
  for (size_t i = 0; i < n; i++)
    if (got16[i] != want16[i] && bad++ < 10)
      CHECK_MSG(0, "emulated vcvtps2ph %08x -> %04x, F16C %04x", fbits(x[i]), got16[i], want16[i]);
  CHECK(bad == 0);
  free(h), free(got), free(want), free(x), free(got16), free(want16);
#endif
}

/* ---- the conversions against the scalar code ---- */

typedef void (*widen_fn)(float *, const uint16_t *, size_t);
typedef void (*narrow_fn)(uint16_t *, const float *, size_t);

/* What storing as f16 and loading back gives, by the scalar code. */
static void f16_round_n_scalar(float *p, size_t n) {
  uint16_t *h = malloc((n ? n : 1) * sizeof *h);
  ampc__f32_to_f16_n_scalar(h, p, n);
  ampc__f16_to_f32_n_scalar(p, h, n);
  free(h);
}

/* ... and as bf16 */
static void bf16_round_n_scalar(float *p, size_t n) {
  uint16_t *h = malloc((n ? n : 1) * sizeof *h);
  ampc__f32_to_bf16_n_scalar(h, p, n);
  ampc__bf16_to_f32_n_scalar(p, h, n);
  free(h);
}

static const struct {
  const char *name;
  widen_fn emu_widen, ref_widen;
  narrow_fn emu_narrow, ref_narrow;
} kinds[2] = {
    {"f16", emu_f16_to_f32_n, ampc__f16_to_f32_n_scalar, emu_f32_to_f16_n, ampc__f32_to_f16_n_scalar},
    {"bf16", emu_bf16_to_f32_n, ampc__bf16_to_f32_n_scalar, emu_f32_to_bf16_n, ampc__f32_to_bf16_n_scalar},
};

/* Every 16-bit code widened, the narrowing inputs narrowed and
 * rounded in place, in one long call each: the vector bodies, and a tail. */
TEST(conversions_match_scalar) {
  enum { NH = 65536 };
  uint16_t *h = malloc(NH * sizeof *h);
  float *got = malloc(NH * sizeof *got), *want = malloc(NH * sizeof *want);
  for (uint32_t i = 0; i < NH; i++) h[i] = (uint16_t)(i * 0x9e37u); /* every code, out of order */
  int bad = 0;
  for (int f = 0; f < 2; f++) {
    kinds[f].emu_widen(got, h, NH);
    kinds[f].ref_widen(want, h, NH);
    for (size_t i = 0; i < NH; i++)
      if (fbits(got[i]) != fbits(want[i]) && bad++ < 5)
        CHECK_MSG(0, "%s %04x -> f32 %08x, scalar %08x", kinds[f].name, h[i], fbits(got[i]), fbits(want[i]));
  }
  size_t n;
  float *x = narrow_inputs(&n);
  uint16_t *g16 = malloc(n * sizeof *g16), *w16 = malloc(n * sizeof *w16);
  for (int f = 0; f < 2; f++) {
    kinds[f].emu_narrow(g16, x, n);
    kinds[f].ref_narrow(w16, x, n);
    for (size_t i = 0; i < n; i++)
      if (g16[i] != w16[i] && bad++ < 10)
        CHECK_MSG(0, "f32 %08x -> %s %04x, scalar %04x", fbits(x[i]), kinds[f].name, g16[i], w16[i]);
  }
  float *r = malloc(n * sizeof *r), *w = malloc(n * sizeof *w);
  for (int f = 0; f < 2; f++) {
    memcpy(r, x, n * sizeof *r);
    memcpy(w, x, n * sizeof *w);
    (f ? emu_bf16_round_n : emu_f16_round_n)(r, n);
    (f ? bf16_round_n_scalar : f16_round_n_scalar)(w, n);
    for (size_t i = 0; i < n; i++)
      if (fbits(r[i]) != fbits(w[i]) && bad++ < 15)
        CHECK_MSG(0, "%s rounding in place [%zu] = %08x, scalar %08x", kinds[f].name, i, fbits(r[i]), fbits(w[i]));
  }
  free(w);
  CHECK(bad == 0);
  free(h), free(got), free(want), free(x), free(g16), free(w16), free(r);
}

/* Memory whose end is followed by an inaccessible page: a kernel that reads
 * or writes past the end of an array placed there stops the test. */
typedef struct {
  char *base;
  size_t size; /* the accessible bytes */
} guarded;

static guarded guarded_new(size_t bytes) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE), size = (bytes + page - 1) / page * page;
  guarded g = {NULL, 0};
  char *p = mmap(NULL, size + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return g;
  if (mprotect(p + size, page, PROT_NONE) != 0) {
    munmap(p, size + page);
    return g;
  }
  g.base = p;
  g.size = size;
  return g;
}

static void guarded_free(guarded g) {
  if (g.base) munmap(g.base, g.size + (size_t)sysconf(_SC_PAGESIZE));
}

/* The last `bytes` accessible bytes. */
static void *guarded_tail(guarded g, size_t bytes) { return g.base + g.size - bytes; }

/* Short and odd lengths, the tails' masked lanes: the results are the
 * scalar code's; nothing before the arrays is written (a sentinel), nothing
 * after them is read or written (arrays ending at an inaccessible page),
 * whatever the alignment (which the arrays' placement at the page's end
 * varies with the length). */
TEST(conversion_tails) {
  enum { MAXN = 300, PAD = 8 };
  static const int lengths[] = {41, 47, 63, 64, 65, 100, 127, 255, 257, MAXN};
  float src32[MAXN];
  uint16_t src16[MAXN];
  uint64_t s = 7;
  for (int i = 0; i < MAXN; i++) {
    uint32_t u = (uint32_t)lcg(&s);
    src32[i] = bitsf(i % 3 == 0 ? special32[(size_t)i / 3 % NSPECIAL32] : u);
    src16[i] = (uint16_t)(i % 5 == 0 ? special32[(size_t)i / 5 % NSPECIAL32] >> 16 : u >> 7);
  }
  size_t bytes = (MAXN + PAD) * sizeof(float);
  guarded gs = guarded_new(bytes), gd = guarded_new(bytes);
  CHECK(gs.base && gd.base);
  if (!gs.base || !gd.base) return;
  int bad = 0;
  for (int li = -41; li < (int)(sizeof lengths / sizeof lengths[0]); li++) {
    size_t n = li < 0 ? (size_t)(li + 41) : (size_t)lengths[li]; /* 0..40, then the longer ones */
    for (int f = 0; f < 2; f++) {
      /* widening: n codes at the end of gs into n floats at the end of gd */
      uint16_t *in16 = guarded_tail(gs, n * sizeof *in16);
      float *out32 = guarded_tail(gd, n * sizeof *out32), want32[MAXN];
      memcpy(in16, src16, n * sizeof *in16);
      memset(out32 - PAD, 0xa5, (n + PAD) * sizeof *out32);
      kinds[f].emu_widen(out32, in16, n);
      kinds[f].ref_widen(want32, src16, n);
      for (int i = -PAD; i < (int)n; i++) {
        uint32_t want = i < 0 ? 0xa5a5a5a5u : fbits(want32[i]);
        if (fbits(out32[i]) != want && bad++ < 5)
          CHECK_MSG(0, "%s widen n=%zu: [%d] = %08x, want %08x", kinds[f].name, n, i, fbits(out32[i]), want);
      }
      /* narrowing: n floats at the end of gs into n codes at the end of gd */
      float *in32 = guarded_tail(gs, n * sizeof *in32);
      uint16_t *out16 = guarded_tail(gd, n * sizeof *out16), want16[MAXN];
      memcpy(in32, src32, n * sizeof *in32);
      memset(out16 - PAD, 0xa5, (n + PAD) * sizeof *out16);
      kinds[f].emu_narrow(out16, in32, n);
      kinds[f].ref_narrow(want16, src32, n);
      for (int i = -PAD; i < (int)n; i++) {
        uint16_t want = i < 0 ? 0xa5a5u : want16[i];
        if (out16[i] != want && bad++ < 5)
          CHECK_MSG(0, "%s narrow n=%zu: [%d] = %04x, want %04x", kinds[f].name, n, i, out16[i], want);
      }
    }
    /* f16 and bf16 rounding in place, n floats at the end of gd */
    for (int f = 0; f < 2; f++) {
      float *p = guarded_tail(gd, n * sizeof *p), want[MAXN];
      memset(p - PAD, 0xa5, PAD * sizeof *p);
      for (size_t i = 0; i < n; i++) p[i] = want[i] = src32[i];
      (f ? emu_bf16_round_n : emu_f16_round_n)(p, n);
      (f ? bf16_round_n_scalar : f16_round_n_scalar)(want, n);
      for (int i = -PAD; i < (int)n; i++) {
        uint32_t w = i < 0 ? 0xa5a5a5a5u : fbits(want[i]);
        if (fbits(p[i]) != w && bad++ < 5)
          CHECK_MSG(0, "%s round n=%zu: [%d] = %08x, want %08x", kinds[f].name, n, i, fbits(p[i]), w);
      }
    }
  }
  CHECK(bad == 0);
  guarded_free(gs);
  guarded_free(gd);
}

/* ---- the optimizers against the scalar kernels ---- */

static ampc__optim_consts sgd_consts(float lr, float wd, float mom, float damp, int nesterov) {
  ampc__optim_consts k;
  memset(&k, 0, sizeof k);
  k.neg_lr = -lr;
  k.weight_decay = wd;
  k.momentum = mom;
  k.one_minus_dampening = (float)(1.0 - (double)damp);
  k.nesterov = nesterov;
  return k;
}

static ampc__optim_consts adam_consts(float lr, float wd, int decoupled, int amsgrad, float eps, float beta1) {
  ampc__optim_consts k;
  memset(&k, 0, sizeof k);
  k.decoupled = decoupled;
  k.amsgrad = amsgrad;
  k.weight_decay = decoupled ? 0.0f : wd;
  k.decay = (float)(1.0 - (double)lr * (double)wd);
  k.beta1 = beta1;
  k.one_minus_beta1 = (float)(1.0 - (double)beta1);
  k.beta2 = 0.999f;
  k.one_minus_beta2 = (float)(1.0 - (double)0.999f);
  k.eps = eps;
  return k;
}

/* Step t's bias corrections (Adam), and whether it is the first (SGD). */
static void at_step(ampc__optim_consts *k, float lr, int t) {
  k->first = t == 1;
  k->neg_step_size = (float)(-(double)lr / (1.0 - pow((double)k->beta1, t)));
  k->bias_correction2_sqrt = (float)sqrt(1.0 - pow((double)k->beta2, t));
}

/* A value of about 10^[lo, hi) of either sign, or, at every `every`th index,
 * one of the awkward ones: zeros of both signs, subnormals, huge, tiny,
 * infinite, NaN. */
static float mixed(uint64_t *s, int i, int lo, int hi, int every) {
  static const float odd[] = {0.0f, -0.0f, 1e-40f, -3e-39f, 1e30f, -1e30f, 1e-20f, NAN, INFINITY, -INFINITY, -NAN, FLT_MAX};
  if (every && i % every == every - 1) return odd[lcg(s) % (sizeof odd / sizeof odd[0])];
  float u = (float)(lcg(s) >> 8) * 0x1p-24f;
  float m = powf(10.0f, (float)lo + (float)(hi - lo) * (float)(lcg(s) >> 8) * 0x1p-24f);
  return (lcg(s) & 1 ? -m : m) * (0.5f + u);
}

enum { STATE = 5 }; /* w, buf/m, v, vmax, g */

/* n elements of every array the kernels read or write, and 16 more past
 * the end (which they must leave alone). */
typedef struct {
  float *a[STATE];
} opt_arrays;

static void opt_fill(opt_arrays *x, size_t n, uint64_t seed, int awkward) {
  uint64_t s = seed;
  for (size_t i = 0; i < n + 16; i++) {
    int e = awkward ? 23 : 0;
    x->a[0][i] = mixed(&s, (int)i, -3, 1, e);                   /* weights */
    x->a[1][i] = mixed(&s, (int)i, -5, -1, e ? e + 6 : 0);      /* momentum buffer / first moment */
    float v = fabsf(mixed(&s, (int)i, -9, -2, e ? e + 4 : 0)); /* second moment */
    x->a[2][i] = i % 41 == 40 ? -0.0f : v;
    int r = (int)(lcg(&s) % 5);
    x->a[3][i] = r == 0 ? v * 0.5f : r == 1 ? v : r == 2 ? v * 2.0f : r == 3 ? 0.0f : (awkward ? NAN : v * 4.0f);
    x->a[4][i] = mixed(&s, (int)i, -6, 0, e ? e - 6 : 0); /* gradients */
  }
}

/* Same bits, or both NaN: the payload of a NaN made from two NaN operands
 * is the one of the operand the instruction takes first, which the
 * compilers choose freely for the commutative operations (in the scalar
 * code and the emulation alike). */
static int opt_same(const opt_arrays *a, const opt_arrays *b, size_t n) {
  for (int k = 0; k < STATE; k++)
    for (size_t i = 0; i < n + 16; i++) {
      float x = a->a[k][i], y = b->a[k][i];
      if (fbits(x) != fbits(y) && !(x != x && y != y)) {
        if (getenv("AMPC_TEST_VERBOSE"))
          fprintf(stderr, "  array %d [%zu]: %08x, scalar %08x\n", k, i, fbits(x), fbits(y));
        return 0;
      }
    }
  return 1;
}

/* Every SGD and Adam/AdamW variant, several steps, lengths 0..40 and long
 * ones with and without a tail, plain and awkward values, two gradient
 * multipliers: the emulated AVX-512 kernels give the baseline's bits in the
 * weights and every state buffer, and leave the memory past n alone. */
TEST(optimizers_match_scalar) {
  enum { MAXN = 4099 + 16 };
  opt_arrays e, r;
  for (int k = 0; k < STATE; k++) {
    e.a[k] = malloc(MAXN * sizeof(float));
    r.a[k] = malloc(MAXN * sizeof(float));
  }
  static const int longer[] = {47, 64, 255, 1000, 1037, 4099};
  ampc__optim_consts cfg[64];
  const char *what[64];
  float lr[64];
  int nc = 0;
  for (int v = 0; v < 16; v++) { /* weight decay, momentum, dampening, nesterov */
    float wd = v & 1 ? 1e-3f : 0.0f, mom = v & 2 ? 0.9f : 0.0f, damp = v & 4 ? 0.1f : 0.0f;
    what[nc] = "sgd";
    lr[nc] = v & 8 ? 0.05f : 0.1f;
    cfg[nc] = sgd_consts(lr[nc], wd, mom, damp, v >> 3);
    nc++;
  }
  for (int v = 0; v < 16; v++) { /* decoupled (AdamW), weight decay, amsgrad, eps/beta1 */
    int decoupled = v & 1, amsgrad = (v >> 2) & 1;
    float wd = v & 2 ? (decoupled ? 0.1f : 1e-2f) : 0.0f;
    what[nc] = decoupled ? "adamw" : "adam";
    lr[nc] = v & 8 ? 3e-3f : 1e-3f;
    cfg[nc] = adam_consts(lr[nc], wd, decoupled, amsgrad, v & 8 ? 1e-6f : 1e-8f, v & 8 ? 0.8f : 0.9f);
    nc++;
  }
  const float gmuls[2] = {1.0f, 1.0f / 512.0f};
  int bad = 0;
  long runs = 0;
  for (int c = 0; c < nc; c++)
    for (int li = -41; li < (int)(sizeof longer / sizeof longer[0]); li++) {
      size_t n = li < 0 ? (size_t)(li + 41) : (size_t)longer[li];
      for (int awkward = 0; awkward < 2; awkward++)
        for (int gm = 0; gm < 2; gm++) {
          uint64_t seed = (uint64_t)(c * 1000 + (int)n * 4 + awkward * 2 + gm);
          opt_fill(&e, n, seed, awkward);
          opt_fill(&r, n, seed, awkward);
          ampc__optim_consts k = cfg[c];
          int sgd = what[c][0] == 's';
          for (int t = 1; t <= 3; t++) {
            at_step(&k, lr[c], t);
            if (sgd) {
              float *be = k.momentum != 0.0f ? e.a[1] : NULL, *br = k.momentum != 0.0f ? r.a[1] : NULL;
              emu_sgd(&k, n, e.a[0], e.a[4], gmuls[gm], be);
              ampc__cpu_isa_baseline.sgd(&k, n, r.a[0], r.a[4], gmuls[gm], br);
            } else {
              emu_adam(&k, n, e.a[0], e.a[4], gmuls[gm], e.a[1], e.a[2], k.amsgrad ? e.a[3] : NULL);
              ampc__cpu_isa_baseline.adam(&k, n, r.a[0], r.a[4], gmuls[gm], r.a[1], r.a[2], k.amsgrad ? r.a[3] : NULL);
            }
            runs++;
            if (!opt_same(&e, &r, n) && bad++ < 5)
              CHECK_MSG(0, "%s config %d, n=%zu, awkward=%d, gmul=%g, step %d: not the scalar bits", what[c], c, n, awkward,
                        (double)gmuls[gm], t);
          }
        }
    }
  CHECK(bad == 0);
  printf("     %ld kernel calls compared\n", runs);
  for (int k = 0; k < STATE; k++) free(e.a[k]), free(r.a[k]);
}

TEST_MAIN(TEST_ENTRY(emulated_fma_is_fused), TEST_ENTRY(emulated_f16_conversions_are_f16c),
          TEST_ENTRY(conversions_match_scalar), TEST_ENTRY(conversion_tails), TEST_ENTRY(optimizers_match_scalar))
