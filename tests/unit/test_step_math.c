/* The shared formulas of backend/step_math.h (and the conversions and the
 * generator's hash it builds on), on the host. These are the functions the
 * cuda backend's kernels compile from the same text (AMPC__HD), so these
 * checks are checks of the GPU's arithmetic as well:
 *
 * - the optimizers' element updates against a plain re-statement of torch's
 *   sequence of f32 operations, and against a double-precision evaluation
 *   within a few f32 roundings; their special cases (no weight decay, the
 *   first momentum step, Nesterov, AdamW's decay, amsgrad's NaN-propagating
 *   maximum);
 * - the cpu backend's vector kernels (both builds) give ampc__sgd_one's and
 *   ampc__adam_one's bits over arrays;
 * - stochastic rounding: exact values and non-finite ones are kept, every
 *   result is one of the two neighbours, the chance of the larger magnitude
 *   is the distance (counted over many draws, within 5 standard
 *   deviations), so the mean is the value; at the ends of the range (the
 *   largest finite, zero and the subnormals) as well;
 * - the inline conversions and hash are the public functions' bits. */
#include <float.h>
#include <math.h>
#include <stdint.h>

#include "ampc/dtype.h"
#include "ampc/rng.h"
#include "backend/cpu/cpu_internal.h"
#include "backend/step_math.h"
#include "test.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

static float frand(uint64_t stream, uint64_t i, float lo, float hi) {
  return lo + (hi - lo) * (float)(ampc_rng_at(123, stream, i) >> 40) * (1.0f / 16777216.0f);
}

static uint32_t bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

/* ---------------- the optimizers' element updates ---------------- */

static ampc__optim_consts sgd_consts(float lr, float wd, float mom, float damp, int nesterov, int first) {
  ampc__optim_consts k;
  memset(&k, 0, sizeof k);
  k.neg_lr = -lr;
  k.weight_decay = wd;
  k.momentum = mom;
  k.one_minus_dampening = (float)(1.0 - (double)damp);
  k.nesterov = nesterov;
  k.first = first;
  return k;
}

static ampc__optim_consts adam_consts(float lr, float wd, int decoupled, int amsgrad, int t) {
  ampc__optim_consts k;
  memset(&k, 0, sizeof k);
  k.decoupled = decoupled;
  k.amsgrad = amsgrad;
  k.weight_decay = decoupled ? 0.0f : wd;
  k.decay = (float)(1.0 - (double)lr * (double)wd);
  k.beta1 = 0.9f;
  k.one_minus_beta1 = (float)(1.0 - 0.9);
  k.beta2 = 0.999f;
  k.one_minus_beta2 = (float)(1.0 - 0.999);
  k.neg_step_size = (float)(-(double)lr / (1.0 - pow(0.9, t)));
  k.bias_correction2_sqrt = (float)sqrt(1.0 - pow(0.999, t));
  k.eps = 1e-8f;
  return k;
}

/* torch 1.13's SGD as its tensor ops, one f32 rounding each (volatile keeps
 * every intermediate a rounded f32) */
static float sgd_torch(const ampc__optim_consts *k, float w, float g, float *buf) {
  volatile float d = g;
  if (k->weight_decay != 0.0f) d = fmaf(w, k->weight_decay, d);
  if (k->momentum != 0.0f) {
    volatile float b;
    if (k->first) {
      b = d;
    } else {
      volatile float m = *buf * k->momentum;
      b = fmaf(d, k->one_minus_dampening, m);
    }
    *buf = b;
    d = k->nesterov ? fmaf(b, k->momentum, d) : b;
  }
  return fmaf(d, k->neg_lr, w);
}

static float adam_torch(const ampc__optim_consts *k, float w, float g, float *m, float *v, float *vmax) {
  volatile float p = w, d = g;
  if (k->decoupled) p = p * k->decay;
  else if (k->weight_decay != 0.0f) d = fmaf(p, k->weight_decay, d);
  volatile float m1 = *m * k->beta1;
  *m = fmaf(d, k->one_minus_beta1, m1);
  volatile float v1 = *v * k->beta2, s = k->one_minus_beta2 * d;
  *v = fmaf(s, d, v1);
  volatile float vv = *v;
  if (vmax) {
    if (*vmax < vv || vv != vv) *vmax = vv;
    vv = *vmax;
  }
  volatile float den = sqrtf(vv);
  den = den / k->bias_correction2_sqrt;
  den = den + k->eps;
  volatile float u = k->neg_step_size * *m;
  u = u / den;
  return p + u;
}

TEST(sgd_element_is_torchs_sequence) {
  int bad = 0;
  for (int variant = 0; variant < 16; variant++) {
    ampc__optim_consts k = sgd_consts(0.1f, variant & 1 ? 5e-4f : 0.0f, variant & 2 ? 0.9f : 0.0f, variant & 8 ? 0.1f : 0.0f,
                                      (variant & 4) && (variant & 2) && !(variant & 8), variant & 8 ? 0 : 1);
    for (uint64_t i = 0; i < 20000; i++) {
      float w = frand(1, i, -2.0f, 2.0f), g = frand(2, i, -1.0f, 1.0f) * (i % 7 == 0 ? 1e-6f : 1.0f);
      float b0 = frand(3, i, -0.1f, 0.1f), b1 = b0, b2 = b0;
      float a = ampc__sgd_one(&k, w, g, &b1), r = sgd_torch(&k, w, g, &b2);
      if (bits(a) != bits(r) || bits(b1) != bits(b2)) bad++;
      /* and within a few roundings of the exact arithmetic */
      double d = (double)g + (k.weight_decay != 0.0f ? (double)w * k.weight_decay : 0.0), bd = d;
      if (k.momentum != 0.0f) {
        bd = k.first ? d : (double)b0 * k.momentum + d * k.one_minus_dampening;
        d = k.nesterov ? d + bd * k.momentum : bd;
      }
      double exact = (double)w + d * k.neg_lr;
      if (fabs(a - exact) > 8 * FLT_EPSILON * (fabs(exact) + fabs(w) + 1e-6)) bad++;
    }
  }
  CHECK_MSG(bad == 0, "%d SGD elements differ from torch's sequence or the exact update", bad);
}

TEST(adam_element_is_torchs_sequence) {
  int bad = 0;
  for (int variant = 0; variant < 8; variant++) {
    int decoupled = variant & 1, amsgrad = (variant >> 1) & 1, t = variant & 4 ? 1 : 7;
    ampc__optim_consts k = adam_consts(1e-3f, 0.01f, decoupled, amsgrad, t);
    for (uint64_t i = 0; i < 20000; i++) {
      float w = frand(4, i, -2.0f, 2.0f), g = frand(5, i, -1.0f, 1.0f) * (i % 5 == 0 ? 1e-5f : 1.0f);
      float m0 = frand(6, i, -0.01f, 0.01f), v0 = frand(7, i, 0.0f, 1e-3f), x0 = v0 * 1.5f;
      float m1 = m0, v1 = v0, x1 = x0, m2 = m0, v2 = v0, x2 = x0;
      float a = ampc__adam_one(&k, w, g, &m1, &v1, amsgrad ? &x1 : NULL);
      float r = adam_torch(&k, w, g, &m2, &v2, amsgrad ? &x2 : NULL);
      if (bits(a) != bits(r) || bits(m1) != bits(m2) || bits(v1) != bits(v2) || bits(x1) != bits(x2)) bad++;
    }
  }
  CHECK_MSG(bad == 0, "%d Adam elements differ from torch's sequence", bad);
  /* amsgrad's maximum propagates a NaN, as torch.maximum does */
  ampc__optim_consts k = adam_consts(1e-3f, 0.0f, 0, 1, 3);
  float m = 0.0f, v = NAN, vmax = 1.0f;
  (void)ampc__adam_one(&k, 1.0f, 0.5f, &m, &v, &vmax);
  CHECK(isnan(vmax));
  /* AdamW decays before it steps: a zero gradient from a fresh state moves w
   * by its decay alone */
  k = adam_consts(0.1f, 0.5f, 1, 0, 1);
  m = v = 0.0f;
  float w = ampc__adam_one(&k, 2.0f, 0.0f, &m, &v, NULL);
  CHECK(w == 2.0f * k.decay);
}

/* The cpu backend's vector kernels are step_math.h's, lane by lane. */
TEST(cpu_kernels_give_the_element_functions_bits) {
  enum { N = 4099 };
  static float w[N], g[N], ws[N], b[N], bs[N], m[N], ms[N], v[N], vs[N], x[N], xs[N];
  const ampc__cpu_isa *builds[3] = {&ampc__cpu_isa_baseline, NULL, NULL};
  if (ampc__cpu_isa_avx2 && ampc__cpu_has_avx2_f16c()) builds[1] = ampc__cpu_isa_avx2;
  if (ampc__cpu_isa_avx512 && ampc__cpu_has_avx512()) builds[2] = ampc__cpu_isa_avx512;
  for (int bi = 0; bi < 3; bi++) {
    if (!builds[bi]) continue;
    for (int variant = 0; variant < 4; variant++) {
      for (int i = 0; i < N; i++) {
        w[i] = ws[i] = frand(8, (uint64_t)i, -1.0f, 1.0f);
        g[i] = frand(9, (uint64_t)i, -1.0f, 1.0f);
        b[i] = bs[i] = m[i] = ms[i] = frand(10, (uint64_t)i, -0.1f, 0.1f);
        v[i] = vs[i] = frand(11, (uint64_t)i, 0.0f, 1e-3f);
        x[i] = xs[i] = v[i] * 1.25f;
      }
      const float gmul = 1.0f / 512.0f;
      ampc__optim_consts ks = sgd_consts(0.05f, variant & 1 ? 1e-4f : 0.0f, 0.9f, 0.0f, variant & 2, 0);
      builds[bi]->sgd(&ks, N, w, g, gmul, b);
      for (int i = 0; i < N; i++) ws[i] = ampc__sgd_one(&ks, ws[i], g[i] * gmul, &bs[i]);
      CHECK_MSG(memcmp(w, ws, sizeof w) == 0 && memcmp(b, bs, sizeof b) == 0, "%s: SGD variant %d", builds[bi]->name, variant);
      ampc__optim_consts ka = adam_consts(1e-3f, 0.01f, variant & 1, variant >> 1, 4);
      builds[bi]->adam(&ka, N, w, g, gmul, m, v, ka.amsgrad ? x : NULL);
      for (int i = 0; i < N; i++) ws[i] = ampc__adam_one(&ka, ws[i], g[i] * gmul, &ms[i], &vs[i], ka.amsgrad ? &xs[i] : NULL);
      CHECK_MSG(memcmp(w, ws, sizeof w) == 0 && memcmp(m, ms, sizeof m) == 0 && memcmp(v, vs, sizeof v) == 0 &&
                    memcmp(x, xs, sizeof x) == 0,
                "%s: Adam variant %d", builds[bi]->name, variant);
    }
  }
}

/* ---------------- stochastic rounding ---------------- */

static float to_f(int is_f16, uint16_t h) { return is_f16 ? ampc_f16_to_f32(h) : ampc_bf16_to_f32(h); }

/* Draws n roundings of w: each must be one of the neighbours lo < w < hi
 * (by magnitude), and hi must come up as often as the distance says. */
static void distribution(int is_f16, float w, int n, const char *what) {
  uint16_t near = is_f16 ? ampc_f32_to_f16(w) : ampc_f32_to_bf16(w);
  int up = 0, other = 0;
  float lo = NAN, hi = NAN;
  for (int i = 0; i < n; i++) {
    uint16_t r = ampc__round_stochastic(is_f16, w, ampc_rng_at(99, AMPC_RNG_STREAM_ROUNDING, (uint64_t)i));
    float f = to_f(is_f16, r);
    if (fabsf(f) > fabsf(w)) {
      up++;
      hi = f;
    } else if (fabsf(f) < fabsf(w)) {
      lo = f;
    } else {
      other++;
    }
  }
  CHECK_MSG(other == 0, "%s: %d results equal to an inexact value", what, other);
  if (isnan(lo) || isnan(hi)) {
    /* all one way: only right when the chance is (nearly) 0 or 1 */
    float n1 = to_f(is_f16, near);
    CHECK_MSG(fabsf(n1 - w) < 1e-3f * fabsf(w) || up == 0 || up == n, "%s: one-sided over %d draws", what, n);
    return;
  }
  double p = ((double)fabsf(w) - fabsf(lo)) / ((double)fabsf(hi) - fabsf(lo)), sd = sqrt(p * (1 - p) / n);
  CHECK_MSG(fabs((double)up / n - p) <= 5 * sd + 1.0 / (1 << 23), "%s: rounded up %d of %d, expected a share of %.4f (sd %.4f)", what,
            up, n, p, sd);
}

TEST(stochastic_rounding) {
  for (int is_f16 = 0; is_f16 < 2; is_f16++) {
    const char *t = is_f16 ? "f16" : "bf16";
    /* exact values and non-finite ones are kept */
    static const float exact[] = {0.0f, -0.0f, 1.0f, -2.5f, 0.375f};
    for (size_t i = 0; i < sizeof exact / sizeof exact[0]; i++) {
      uint16_t want = is_f16 ? ampc_f32_to_f16(exact[i]) : ampc_f32_to_bf16(exact[i]);
      for (uint64_t r = 0; r < 64; r++)
        CHECK_MSG(ampc__round_stochastic(is_f16, exact[i], ampc_rng_at(1, 4, r)) == want, "%s: exact %g", t, (double)exact[i]);
    }
    CHECK(isnan(to_f(is_f16, ampc__round_stochastic(is_f16, NAN, 12345))));
    CHECK(to_f(is_f16, ampc__round_stochastic(is_f16, INFINITY, 12345)) == INFINITY);
    CHECK(to_f(is_f16, ampc__round_stochastic(is_f16, -INFINITY, 0)) == -INFINITY);
    /* the chance of the larger magnitude is the distance, either sign */
    char what[96];
    for (int k = 0; k < 12; k++) {
      float base = is_f16 ? 1.0f : 3.0f, step = is_f16 ? 0x1p-10f : 0x1p-6f;
      float w = (k & 1 ? -1.0f : 1.0f) * (base + step * (float)(k + 1) / 13.0f);
      snprintf(what, sizeof what, "%s %.9g", t, (double)w);
      distribution(is_f16, w, 20000, what);
    }
    /* between zero and the smallest subnormal, and among the subnormals */
    float sub = is_f16 ? 0x1p-24f : 0x1p-133f;
    snprintf(what, sizeof what, "%s 0.3 x the smallest subnormal", t);
    distribution(is_f16, 0.3f * sub, 20000, what);
    snprintf(what, sizeof what, "%s -2.7 x the smallest subnormal", t);
    distribution(is_f16, -2.7f * sub, 20000, what);
    /* past the largest finite value the other neighbour would be infinite:
     * to nearest */
    float big = is_f16 ? 65504.0f + 8.0f : 3.3e38f;
    uint16_t nearest = is_f16 ? ampc_f32_to_f16(big) : ampc_f32_to_bf16(big);
    int same = 0;
    for (uint64_t r = 0; r < 1000; r++) same += ampc__round_stochastic(is_f16, big, ampc_rng_at(2, 4, r)) == nearest;
    CHECK_MSG(is_f16 ? same == 1000 : same > 0, "%s: near the largest finite value: %d of 1000 to nearest", t, same);
    /* unbiased: the mean of many roundings is the value */
    float w = 1.0f + 0.3f * (is_f16 ? 0x1p-10f : 0x1p-7f);
    double sum = 0.0;
    for (uint64_t r = 0; r < 200000; r++) sum += to_f(is_f16, ampc__round_stochastic(is_f16, w, ampc_rng_at(3, 4, r)));
    double ulp = is_f16 ? 0x1p-10 : 0x1p-7;
    CHECK_MSG(fabs(sum / 200000 - w) < 0.01 * ulp, "%s: mean %.9g of roundings of %.9g", t, sum / 200000, (double)w);
  }
}

/* ---------------- the building blocks ---------------- */

TEST(inline_conversions_and_hash_are_the_public_ones) {
  int bad = 0;
  for (uint64_t i = 0; i < 200000; i++) {
    uint32_t u = (uint32_t)(ampc_rng_at(7, 1, i) >> 32);
    float f;
    memcpy(&f, &u, 4);
    uint16_t h = (uint16_t)u;
    bad += ampc__f32_to_f16_inline(f) != ampc_f32_to_f16(f);
    bad += ampc__f32_to_bf16_inline(f) != ampc_f32_to_bf16(f);
    bad += bits(ampc__f16_to_f32_inline(h)) != bits(ampc_f16_to_f32(h));
    bad += bits(ampc__bf16_to_f32_inline(h)) != bits(ampc_bf16_to_f32(h));
    bad += ampc__rng_at(i, i % 7, i * 3) != ampc_rng_at(i, i % 7, i * 3);
  }
  CHECK_MSG(bad == 0, "%d differences", bad);
}

/* The cpu device's check, fold and overflow report (vector code, built per
 * instruction set) against the same sums written out element by element:
 * lengths around the 8-float vectors, the 16 partial sums and the 8192-value
 * chunks, a non-finite value in a vector, in a tail and in a later chunk. */
static double ref_sumsq(const float *g, size_t n, float gmul) {
  /* element i of a chunk into partial sum i % 16, the quarters and their
   * lanes added pairwise, the chunks in order */
  double t = 0.0;
  for (size_t c0 = 0; c0 < n; c0 += 8192) {
    double p[16] = {0};
    for (size_t i = 0; c0 + i < n && i < 8192; i++) {
      float v = g[c0 + i] * gmul;
      p[i % 16] += (double)v * v;
    }
    double q[4];
    for (int l = 0; l < 4; l++) q[l] = (p[l] + p[4 + l]) + (p[8 + l] + p[12 + l]);
    t += (q[0] + q[1]) + (q[2] + q[3]);
  }
  return t;
}

TEST(cpu_flat_passes_are_their_sums) {
  ampc__device *d;
  CHECK_OK(ampc__device_create(&d, "cpu", NULL));
  static const size_t lens[] = {0, 1, 7, 8, 9, 15, 16, 17, 31, 33, 100, 8191, 8192, 8193, 20011};
  ampc_rng rng = ampc_rng_make(11, AMPC_RNG_STREAM_USER);
  for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++)
    for (int plant = -1; plant < 3; plant++) {
      size_t n = lens[li];
      size_t at = plant == 0 ? n / 2 : plant == 1 ? n - 1 : n > 8200 ? 8200 : n - 1; /* in a vector, the tail, a later chunk */
      if (plant >= 0 && n == 0) continue;
      float *g = d->be->alloc(d, (n + 1) * sizeof(float)), *o = d->be->alloc(d, (n + 1) * sizeof(float));
      float *o2 = malloc((n + 1) * sizeof(float));
      CHECK(g && o && o2);
      for (size_t i = 0; i < n; i++) {
        /* large and small magnitudes side by side: where a small square
         * goes decides whether a partial sum's rounding drops it */
        g[i] = ampc_rng_normal(&rng) * (i % 7 == 3 ? 4096.0f : i % 5 == 0 ? 1e-20f : 3.0517578125e-05f);
        o[i] = o2[i] = ampc_rng_normal(&rng);
      }
      if (plant >= 0) g[at] = plant == 1 ? -INFINITY : NAN;
      ampc__span sp = {0, n, AMPC_DTYPE_F32, NULL, AMPC_DTYPE_F32, g};
      ampc__check ck;
      CHECK_OK(d->be->check(d, &sp, 1, 0.75f, 1, NULL, 0, NULL, &ck));
      float mx = 0.0f;
      for (size_t i = 0; i < n; i++) {
        float m = fabsf(g[i] * 0.75f);
        mx = m > mx ? m : mx;
      }
      CHECK_MSG(ck.found_inf == (plant >= 0), "n %zu plant %d: found_inf %d", n, plant, ck.found_inf);
      CHECK_MSG(ck.max_abs == mx, "n %zu plant %d: max %.9g vs %.9g", n, plant, (double)ck.max_abs, (double)mx);
      if (plant < 0) {
        double r = ref_sumsq(g, n, 0.75f);
        CHECK_MSG(memcmp(&ck.sumsq, &r, sizeof r) == 0, "n %zu: sum of squares %.17g vs %.17g", n, ck.sumsq, r);
      }
      for (int acc = 0; acc < 2; acc++) {
        float slot[2] = {0.0f, 0.0f};
        CHECK_OK(d->be->fold(d, &sp, 1, o, 0.5f, acc, slot, 2.0f));
        size_t diff = 0;
        for (size_t i = 0; i < n; i++) {
          float p = g[i] * 0.5f, want = acc ? o2[i] + p : p;
          diff += memcmp(&o[i], &want, sizeof want) != 0;
          o2[i] = want;
        }
        CHECK_MSG(diff == 0, "n %zu plant %d acc %d: %zu folded values differ", n, plant, acc, diff);
        CHECK_MSG(slot[0] == (plant >= 0 ? 1.0f : 0.0f), "n %zu plant %d: fold's non-finite slot %g", n, plant, (double)slot[0]);
      }
      size_t ranges[4] = {0, n / 2, n / 2, n - n / 2};
      unsigned char flags[2] = {7, 7};
      CHECK_OK(d->be->nonfinite(d, &sp, 1, ranges, 2, 0.75f, flags));
      for (int r = 0; r < 2; r++) {
        int want = plant >= 0 && at >= ranges[2 * r] && at < ranges[2 * r] + ranges[2 * r + 1];
        CHECK_MSG(flags[r] == want, "n %zu plant %d: range %d flag %d", n, plant, r, flags[r]);
      }
      d->be->free(d, g);
      d->be->free(d, o);
      free(o2);
    }
  /* a case where the lanes decide the bits: 4096^2 = 2^24 in lane 0 and
   * three squares of 2^-30 in lane 4 (elements 4, 20 and the tail's 36):
   * kept together they make 0.75 of an ulp of 2^24 and round it up; one of
   * them in lane 0 would be lost there and the rest tie to even */
  float *g = d->be->alloc(d, 40 * sizeof(float));
  CHECK(g != NULL);
  memset(g, 0, 40 * sizeof(float));
  g[0] = 4096.0f;
  g[4] = g[20] = g[36] = 3.0517578125e-05f; /* 2^-15 */
  ampc__span sp = {0, 40, AMPC_DTYPE_F32, NULL, AMPC_DTYPE_F32, g};
  ampc__check ck;
  CHECK_OK(d->be->check(d, &sp, 1, 1.0f, 0, NULL, 0, NULL, &ck));
  double want = ldexp(1.0, 24) + ldexp(1.0, -28), r = ref_sumsq(g, 40, 1.0f);
  CHECK_MSG(ck.sumsq == want && r == want, "sum of squares %.17g (reference %.17g), want %.17g", ck.sumsq, r, want);
  d->be->free(d, g);
  ampc__device_unref(d);
}

TEST_MAIN(TEST_ENTRY(sgd_element_is_torchs_sequence), TEST_ENTRY(cpu_flat_passes_are_their_sums), TEST_ENTRY(adam_element_is_torchs_sequence),
          TEST_ENTRY(cpu_kernels_give_the_element_functions_bits), TEST_ENTRY(stochastic_rounding),
          TEST_ENTRY(inline_conversions_and_hash_are_the_public_ones))
