#include <float.h>
#include <math.h>

#include "ampc/amp_config.h"
#include "test.h"

/* A validated O2/f16 (dynamic) config with overrides "name=value" pairs. */
static ampc_amp_config o2(const char *const *kv, int n) {
  ampc_amp_config c;
  CHECK_OK(ampc_amp_config_init(&c, AMPC_OPT_O2, AMPC_DTYPE_F16));
  for (int i = 0; i < n; i++) CHECK_OK(ampc_amp_config_set(&c, kv[2 * i], kv[2 * i + 1]));
  CHECK_OK(ampc_amp_config_validate(&c));
  return c;
}

static ampc_scaler scaler(const char *const *kv, int n) {
  ampc_amp_config c = o2(kv, n);
  ampc_scaler s;
  ampc_scaler_init(&s, &c);
  return s;
}

/* Runs a step pattern ('O' overflow, 'C' clean) and checks the scale after
 * each step against want[]. */
static void run(ampc_scaler *s, const char *pattern, const float *want) {
  for (int i = 0; pattern[i]; i++) {
    int inf = pattern[i] == 'O';
    int applied = ampc_scaler_update(s, inf);
    CHECK_MSG(applied == !inf, "step %d of %s", i, pattern);
    CHECK_MSG(ampc_scaler_scale(s) == want[i], "step %d of %s: scale %g, want %g", i, pattern,
              (double)ampc_scaler_scale(s), (double)want[i]);
  }
}

TEST(overflow_backoff_sequence) {
  ampc_scaler s = scaler(NULL, 0);
  CHECK(ampc_scaler_scale(&s) == 65536.0f);
  CHECK(ampc_scaler_inv_scale(&s) == 1.0f / 65536.0f);
  static const float want[] = {32768, 16384, 8192, 4096, 2048};
  run(&s, "OOOOO", want);
  CHECK(s.st.overflows == 5 && s.st.skipped_steps == 5 && s.st.steps == 5);
  CHECK(ampc_scaler_inv_scale(&s) == 1.0f / 2048.0f);
}

TEST(growth_after_exactly_window_clean_steps) {
  /* Default window 2000: no growth after 1999, growth at 2000. */
  ampc_scaler s = scaler(NULL, 0);
  for (int i = 0; i < 1999; i++) CHECK(ampc_scaler_update(&s, 0) == 1);
  CHECK(ampc_scaler_scale(&s) == 65536.0f && s.st.growth_tracker == 1999);
  ampc_scaler_update(&s, 0);
  CHECK(ampc_scaler_scale(&s) == 131072.0f && s.st.growth_tracker == 0);

  /* Window 3; an overflow resets the count of clean steps. */
  static const char *const kv[] = {"scale_window", "3"};
  s = scaler(kv, 1);
  static const float want[] = {65536, 65536, 32768, 32768, 32768, 65536, 65536, 65536, 131072};
  run(&s, "CCOCCCCCC", want);
  CHECK(s.st.steps == 9 && s.st.overflows == 1 && s.st.skipped_steps == 1 && s.st.growth_tracker == 0);

  /* growth_factor / backoff_factor other than 2 / 0.5. */
  static const char *const kv2[] = {"scale_window", "1", "growth_factor", "4", "backoff_factor", "0.25"};
  s = scaler(kv2, 3);
  static const float want2[] = {262144, 65536, 16384, 65536};
  run(&s, "COOC", want2);
}

TEST(max_clamp) {
  static const char *const kv[] = {"scale_window", "1"};
  ampc_scaler s = scaler(kv, 1);
  for (int i = 0; i < 8; i++) ampc_scaler_update(&s, 0);
  CHECK(ampc_scaler_scale(&s) == 16777216.0f); /* 2^16 * 2^8 = 2^24, apex's max */
  ampc_scaler_update(&s, 0);
  CHECK(ampc_scaler_scale(&s) == 16777216.0f);

  /* A max below 2^16 makes the scaler start at the max (apex). */
  static const char *const kv2[] = {"max_loss_scale", "1000", "scale_window", "1"};
  s = scaler(kv2, 2);
  CHECK(ampc_scaler_scale(&s) == 1000.0f);
  static const float want[] = {1000, 500, 1000};
  run(&s, "COC", want);
}

TEST(min_clamp_and_divergence) {
  static const char *const kv[] = {"min_loss_scale", "1024"};
  ampc_scaler s = scaler(kv, 1);
  static const float want[] = {32768, 16384, 8192, 4096, 2048, 1024};
  run(&s, "OOOOOO", want);
  /* The overflow that brought the scale to its floor was not taken at it. */
  CHECK(s.st.min_scale_hits == 0 && !ampc_scaler_diverged(&s, 1));
  for (int i = 1; i <= 3; i++) {
    CHECK(ampc_scaler_update(&s, 1) == 0);
    CHECK(ampc_scaler_scale(&s) == 1024.0f);
    CHECK(s.st.min_scale_hits == i);
  }
  CHECK(ampc_scaler_diverged(&s, 3) && !ampc_scaler_diverged(&s, 4));
  CHECK(ampc_scaler_diverged(&s, 0)); /* n < 1 counts as 1 */
  ampc_scaler_update(&s, 0);
  CHECK(s.st.min_scale_hits == 0 && !ampc_scaler_diverged(&s, 1));
  ampc_scaler_update(&s, 1);
  CHECK(s.st.min_scale_hits == 1);

  /* With no min the scale stops at FLT_MIN, never 0 or subnormal. */
  s = scaler(NULL, 0);
  for (int i = 0; i < 200; i++) ampc_scaler_update(&s, 1);
  CHECK(ampc_scaler_scale(&s) == FLT_MIN);
  CHECK(isfinite(ampc_scaler_inv_scale(&s)) && ampc_scaler_inv_scale(&s) > 0);
  CHECK(s.st.min_scale_hits == 200 - 142); /* 2^16 -> 2^-126 takes 142 halvings */
}

TEST(hysteresis_not_consecutive) {
  /* DeepSpeed's default: clean steps do not refill hysteresis, growth does. */
  static const char *const kv[] = {"hysteresis", "2", "scale_window", "4"};
  ampc_scaler s = scaler(kv, 2);
  CHECK(s.st.hysteresis_left == 2);
  /* O: tolerated; C: no refill; O: backs off; O: backs off again (used up). */
  static const float want[] = {65536, 65536, 32768, 16384};
  run(&s, "OCOO", want);
  CHECK(s.st.hysteresis_left == 1);
  /* Four clean steps grow the scale and refill hysteresis; one overflow is tolerated again. */
  static const float want2[] = {16384, 16384, 16384, 32768, 32768, 16384};
  run(&s, "CCCCOO", want2);
  CHECK(s.st.overflows == 5 && s.st.skipped_steps == 5);

  static const char *const kv3[] = {"hysteresis", "3"};
  s = scaler(kv3, 1);
  static const float want3[] = {65536, 65536, 32768, 16384};
  run(&s, "OOOO", want3);
}

TEST(hysteresis_consecutive) {
  static const char *const kv[] = {"hysteresis", "2", "consecutive_hysteresis", "true"};
  ampc_scaler s = scaler(kv, 2);
  /* Isolated overflows never back off; two in a row do. */
  static const float want[] = {65536, 65536, 65536, 65536, 65536, 32768, 32768, 32768};
  run(&s, "OCOCOOCO", want);
  /* The clean step refilled hysteresis (2), the last overflow used one. */
  CHECK(s.st.hysteresis_left == 1);

  static const char *const kv3[] = {"hysteresis", "3", "consecutive_hysteresis", "1"};
  s = scaler(kv3, 2);
  static const float want3[] = {65536, 65536, 65536, 65536, 65536, 32768};
  run(&s, "OOCOOO", want3);
}

TEST(growth_to_inf_prevented) {
  static const char *const kv[] = {"max_loss_scale", "none", "init_scale", "2**127", "scale_window", "1"};
  ampc_scaler s = scaler(kv, 3);
  CHECK(ampc_scaler_scale(&s) == 0x1p127f);
  CHECK(ampc_scaler_update(&s, 0) == 1);
  CHECK(ampc_scaler_scale(&s) == 0x1p127f); /* 2^128 is inf: not kept */
  CHECK(s.st.growth_tracker == 0);
  /* Just below: grows to the largest power of two, then stops. */
  static const char *const kv2[] = {"max_loss_scale", "inf", "init_scale", "2**126", "scale_window", "1"};
  s = scaler(kv2, 3);
  ampc_scaler_update(&s, 0);
  CHECK(ampc_scaler_scale(&s) == 0x1p127f);
  ampc_scaler_update(&s, 0);
  CHECK(ampc_scaler_scale(&s) == 0x1p127f && isfinite(ampc_scaler_inv_scale(&s)));
}

TEST(static_scale) {
  ampc_amp_config c;
  CHECK_OK(ampc_amp_config_init(&c, AMPC_OPT_O3, AMPC_DTYPE_F16));
  CHECK_OK(ampc_amp_config_set(&c, "scale_window", "1"));
  CHECK_OK(ampc_amp_config_set(&c, "loss_scale", "128"));
  CHECK_OK(ampc_amp_config_validate(&c));
  ampc_scaler s;
  ampc_scaler_init(&s, &c);
  CHECK(s.dynamic == 0 && ampc_scaler_scale(&s) == 128.0f);
  static const float want[] = {128, 128, 128, 128, 128};
  run(&s, "CCOCC", want); /* the overflowing step is skipped, the scale stays */
  CHECK(s.st.skipped_steps == 1 && s.st.overflows == 1 && s.st.steps == 5);
  /* Overflows at a static scale count toward divergence: nothing can lower it. */
  ampc_scaler_update(&s, 1);
  ampc_scaler_update(&s, 1);
  CHECK(ampc_scaler_diverged(&s, 2) && ampc_scaler_scale(&s) == 128.0f);
  CHECK(ampc_scaler_inv_scale(&s) == 1.0f / 128.0f);
}

TEST(bf16_default_is_static_one) {
  for (int l = 0; l < 4; l++) {
    ampc_amp_config c;
    CHECK_OK(ampc_amp_config_init(&c, (ampc_opt_level)l, AMPC_DTYPE_BF16));
    ampc_scaler s;
    ampc_scaler_init(&s, &c);
    CHECK(s.dynamic == 0 && ampc_scaler_scale(&s) == 1.0f && ampc_scaler_inv_scale(&s) == 1.0f);
    CHECK(ampc_scaler_update(&s, 1) == 0 && ampc_scaler_scale(&s) == 1.0f);
  }
}

/* Field by field: struct padding is not copied by assignment. */
static int same_state(const ampc_scaler *a, const ampc_scaler *b) {
  const ampc_scaler_state *x = &a->st, *y = &b->st;
  return x->scale == y->scale && x->growth_tracker == y->growth_tracker && x->hysteresis_left == y->hysteresis_left &&
         x->overflows == y->overflows && x->skipped_steps == y->skipped_steps && x->steps == y->steps &&
         x->min_scale_hits == y->min_scale_hits;
}

TEST(state_roundtrip) {
  static const char *const kv[] = {"hysteresis", "3", "min_loss_scale", "4", "max_loss_scale", "2**20"};
  ampc_scaler a = scaler(kv, 3);
  for (int i = 0; i < 10; i++) ampc_scaler_update(&a, i % 4 == 0);
  ampc_scaler_state st;
  ampc_scaler_get_state(&a, &st);
  ampc_scaler b = scaler(kv, 3);
  CHECK(!same_state(&a, &b));
  CHECK_OK(ampc_scaler_set_state(&b, &st));
  CHECK(same_state(&a, &b));
  /* Both continue identically. */
  for (int i = 0; i < 5; i++) CHECK(ampc_scaler_update(&a, i == 2) == ampc_scaler_update(&b, i == 2));
  CHECK(same_state(&a, &b));

  /* Bad states are refused and change nothing. */
  ampc_scaler before = b;
  ampc_scaler_state bad = st;
  bad.scale = 0;
  CHECK_ERR(ampc_scaler_set_state(&b, &bad), AMPC_EINVAL, "saved scale 0 is not a positive finite number");
  bad.scale = NAN;
  CHECK_ERR(ampc_scaler_set_state(&b, &bad), AMPC_EINVAL, "not a positive finite number");
  bad = st, bad.growth_tracker = -1;
  CHECK_ERR(ampc_scaler_set_state(&b, &bad), AMPC_EINVAL, "negative counter");
  bad = st, bad.hysteresis_left = 0;
  CHECK_ERR(ampc_scaler_set_state(&b, &bad), AMPC_EINVAL, "hysteresis_left < 1");
  /* counters that the next update would carry past int64's end */
  bad = st, bad.steps = INT64_MAX;
  CHECK_ERR(ampc_scaler_set_state(&b, &bad), AMPC_EINVAL, "a counter past 2^53");
  bad = st, bad.min_scale_hits = AMPC_SCALER_MAX_COUNT + 1;
  CHECK_ERR(ampc_scaler_set_state(&b, &bad), AMPC_EINVAL, "a counter past 2^53");
  bad = st, bad.overflows = AMPC_SCALER_MAX_COUNT;
  CHECK_OK(ampc_scaler_set_state(&b, &bad));
  CHECK_OK(ampc_scaler_set_state(&b, &before.st));
  CHECK(same_state(&before, &b));

  /* Resuming with tighter limits clamps. */
  bad = st, bad.scale = 1e9f, bad.hysteresis_left = 7;
  CHECK_OK(ampc_scaler_set_state(&b, &bad));
  CHECK(ampc_scaler_scale(&b) == 1048576.0f && b.st.hysteresis_left == 3);
  bad.scale = 1;
  CHECK_OK(ampc_scaler_set_state(&b, &bad));
  CHECK(ampc_scaler_scale(&b) == 4.0f);

  /* A static scaler keeps its configured scale. */
  ampc_amp_config c;
  CHECK_OK(ampc_amp_config_init(&c, AMPC_OPT_O3, AMPC_DTYPE_F16));
  CHECK_OK(ampc_amp_config_set(&c, "loss_scale", "8"));
  ampc_scaler s;
  ampc_scaler_init(&s, &c);
  CHECK_OK(ampc_scaler_set_state(&s, &st));
  CHECK(ampc_scaler_scale(&s) == 8.0f && s.st.steps == st.steps);
}

TEST(clip_coef) {
  float norm = -1;
  CHECK_NEAR(ampc_clip_coef(16.0, 1.0f, &norm), 1.0 / (4.0 + 1e-6), 1e-7);
  CHECK(norm == 4.0f);
  CHECK(ampc_clip_coef(16.0, 10.0f, &norm) == 1.0f && norm == 4.0f);
  CHECK(ampc_clip_coef(16.0, 4.0f, NULL) < 1.0f); /* 4 / (4 + 1e-6), as torch: the epsilon clips a hair */
  CHECK_NEAR(ampc_clip_coef(1e4, 2.0f, &norm), 0.02, 1e-8);
  CHECK(norm == 100.0f);
  CHECK(ampc_clip_coef(0.0, 1.0f, &norm) == 1.0f && norm == 0.0f);
  /* Non-finite norms never clip. */
  CHECK(ampc_clip_coef(INFINITY, 1.0f, &norm) == 1.0f && isinf(norm) && norm > 0);
  norm = 0;
  CHECK(ampc_clip_coef(NAN, 1.0f, &norm) == 1.0f && isinf(norm) && norm > 0);
  norm = 0;
  CHECK(ampc_clip_coef(-1.0, 1.0f, &norm) == 1.0f && isinf(norm));
  norm = 0;
  CHECK(ampc_clip_coef(1e300, 1.0f, &norm) == 1.0f && isinf(norm)); /* norm 1e150 > FLT_MAX */
  /* max_norm that is not positive, or infinite: no clipping. */
  CHECK(ampc_clip_coef(16.0, 0.0f, &norm) == 1.0f && norm == 4.0f);
  CHECK(ampc_clip_coef(16.0, -1.0f, NULL) == 1.0f);
  CHECK(ampc_clip_coef(16.0, NAN, NULL) == 1.0f);
  CHECK(ampc_clip_coef(16.0, INFINITY, NULL) == 1.0f);
}

TEST_MAIN(TEST_ENTRY(overflow_backoff_sequence), TEST_ENTRY(growth_after_exactly_window_clean_steps),
          TEST_ENTRY(max_clamp), TEST_ENTRY(min_clamp_and_divergence), TEST_ENTRY(hysteresis_not_consecutive),
          TEST_ENTRY(hysteresis_consecutive), TEST_ENTRY(growth_to_inf_prevented), TEST_ENTRY(static_scale),
          TEST_ENTRY(bf16_default_is_static_one), TEST_ENTRY(state_roundtrip), TEST_ENTRY(clip_coef))
