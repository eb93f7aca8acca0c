#include <math.h>

#include "ampc/amp_config.h"
#include "test.h"

static ampc_amp_config cfg(ampc_opt_level l, ampc_dtype h) {
  ampc_amp_config c;
  CHECK_OK(ampc_amp_config_init(&c, l, h));
  return c;
}

TEST(opt_level_parse) {
  ampc_opt_level l = AMPC_OPT_O0;
  CHECK_OK(ampc_opt_level_parse("O2", &l));
  CHECK(l == AMPC_OPT_O2);
  CHECK_OK(ampc_opt_level_parse("o3", &l));
  CHECK(l == AMPC_OPT_O3);
  CHECK_OK(ampc_opt_level_parse("O0", &l));
  CHECK(l == AMPC_OPT_O0);
  CHECK_ERR(ampc_opt_level_parse("O4", &l), AMPC_EINVAL, "unknown opt level 'O4'");
  CHECK_ERR(ampc_opt_level_parse("O22", &l), AMPC_EINVAL, "expected O0, O1, O2 or O3");
  CHECK_ERR(ampc_opt_level_parse("2", &l), AMPC_EINVAL, "unknown opt level");
  CHECK_ERR(ampc_opt_level_parse("", &l), AMPC_EINVAL, "unknown opt level");
  CHECK_ERR(ampc_opt_level_parse(NULL, &l), AMPC_EINVAL, "unknown opt level");
  CHECK(l == AMPC_OPT_O0);
  CHECK(strcmp(ampc_opt_level_name(AMPC_OPT_O1), "O1") == 0);
  CHECK(strcmp(ampc_opt_level_name((ampc_opt_level)9), "?") == 0);
}

/* Everything but the level's row is the same at every level. */
static void check_common(const ampc_amp_config *c) {
  CHECK(c->min_loss_scale == 0.0f);
  CHECK(c->max_loss_scale == 16777216.0f);
  CHECK(c->scale_window == 2000);
  CHECK(c->growth_factor == 2.0f);
  CHECK(c->backoff_factor == 0.5f);
  CHECK(c->hysteresis == 1);
  CHECK(c->consecutive_hysteresis == 0);
  CHECK(c->num_losses == 1);
  CHECK(c->user_set == 0);
  CHECK_OK(ampc_amp_config_validate(c));
}

TEST(defaults_f16_match_apex) {
  ampc_amp_config c = cfg(AMPC_OPT_O0, AMPC_DTYPE_F16);
  CHECK(c.opt_level == AMPC_OPT_O0 && c.half_type == AMPC_DTYPE_F16);
  CHECK(c.cast_model_type == AMPC_DTYPE_F32 && c.autocast == 0 && c.keep_batchnorm_fp32 == -1 && c.master_weights == 0);
  CHECK(c.loss_scale_dynamic == 0 && c.loss_scale == 1.0f);
  check_common(&c);

  c = cfg(AMPC_OPT_O1, AMPC_DTYPE_F16);
  CHECK(c.cast_model_type == AMPC_DTYPE_F32 && c.autocast == 1 && c.keep_batchnorm_fp32 == -1 && c.master_weights == -1);
  CHECK(c.loss_scale_dynamic == 1 && c.loss_scale == 65536.0f);
  check_common(&c);

  c = cfg(AMPC_OPT_O2, AMPC_DTYPE_F16);
  CHECK(c.cast_model_type == AMPC_DTYPE_F16 && c.autocast == 0 && c.keep_batchnorm_fp32 == 1 && c.master_weights == 1);
  CHECK(c.loss_scale_dynamic == 1 && c.loss_scale == 65536.0f);
  check_common(&c);

  c = cfg(AMPC_OPT_O3, AMPC_DTYPE_F16);
  CHECK(c.cast_model_type == AMPC_DTYPE_F16 && c.autocast == 0 && c.keep_batchnorm_fp32 == 0 && c.master_weights == 0);
  CHECK(c.loss_scale_dynamic == 0 && c.loss_scale == 1.0f);
  check_common(&c);
}

TEST(defaults_bf16_no_loss_scaling) {
  static const ampc_dtype cast[4] = {AMPC_DTYPE_F32, AMPC_DTYPE_F32, AMPC_DTYPE_BF16, AMPC_DTYPE_BF16};
  static const int autocast[4] = {0, 1, 0, 0}, keep_bn[4] = {-1, -1, 1, 0}, master[4] = {0, -1, 1, 0};
  for (int l = 0; l < 4; l++) {
    ampc_amp_config c = cfg((ampc_opt_level)l, AMPC_DTYPE_BF16);
    CHECK(c.half_type == AMPC_DTYPE_BF16);
    CHECK(c.cast_model_type == cast[l]);
    CHECK(c.autocast == autocast[l] && c.keep_batchnorm_fp32 == keep_bn[l] && c.master_weights == master[l]);
    CHECK_MSG(c.loss_scale_dynamic == 0 && c.loss_scale == 1.0f, "level O%d", l);
    check_common(&c);
  }
  /* Scaling can still be asked for. */
  ampc_amp_config c = cfg(AMPC_OPT_O2, AMPC_DTYPE_BF16);
  CHECK_OK(ampc_amp_config_set(&c, "loss_scale", "dynamic"));
  CHECK(c.loss_scale_dynamic == 1 && c.loss_scale == 65536.0f);
  CHECK_OK(ampc_amp_config_validate(&c));
}

TEST(init_rejects_bad_args) {
  ampc_amp_config c;
  CHECK_ERR(ampc_amp_config_init(&c, (ampc_opt_level)4, AMPC_DTYPE_F16), AMPC_EINVAL, "opt level 4 out of range");
  CHECK_ERR(ampc_amp_config_init(&c, AMPC_OPT_O2, AMPC_DTYPE_F32), AMPC_EINVAL, "half type must be f16 or bf16, not f32");
}

TEST(set_parses_values) {
  ampc_amp_config c = cfg(AMPC_OPT_O2, AMPC_DTYPE_F16);
  CHECK_OK(ampc_amp_config_set(&c, "master_weights", "False"));
  CHECK(c.master_weights == 0 && c.user_set == AMPC_AMP_PROP_MASTER_WEIGHTS);
  CHECK_OK(ampc_amp_config_set(&c, "master-weights", "on"));
  CHECK(c.master_weights == 1);
  CHECK_OK(ampc_amp_config_set(&c, "keep_batchnorm_fp32", "0"));
  CHECK(c.keep_batchnorm_fp32 == 0);
  CHECK_OK(ampc_amp_config_set(&c, "keep-batchnorm-fp32", "TRUE"));
  CHECK(c.keep_batchnorm_fp32 == 1);
  CHECK_OK(ampc_amp_config_set(&c, "patch_torch_functions", "off"));
  CHECK(c.autocast == 0 && (c.user_set & AMPC_AMP_PROP_AUTOCAST));
  CHECK_OK(ampc_amp_config_set(&c, "autocast", "yes"));
  CHECK(c.autocast == 1);
  CHECK_OK(ampc_amp_config_set(&c, "autocast", "no"));
  CHECK_OK(ampc_amp_config_set(&c, "cast_model_type", "fp32"));
  CHECK(c.cast_model_type == AMPC_DTYPE_F32);
  CHECK_OK(ampc_amp_config_set(&c, "cast_model_type", "half"));
  CHECK(c.cast_model_type == AMPC_DTYPE_F16);
  CHECK_OK(ampc_amp_config_set(&c, "cast_model_type", "none"));
  CHECK(c.cast_model_type == AMPC_DTYPE_F32);

  CHECK_OK(ampc_amp_config_set(&c, "loss_scale", "128"));
  CHECK(c.loss_scale_dynamic == 0 && c.loss_scale == 128.0f);
  CHECK_OK(ampc_amp_config_set(&c, "loss_scale", "2**10"));
  CHECK(c.loss_scale == 1024.0f);
  CHECK_OK(ampc_amp_config_set(&c, "loss_scale", "2^15"));
  CHECK(c.loss_scale == 32768.0f);
  CHECK_OK(ampc_amp_config_set(&c, "loss_scale", "0.25"));
  CHECK(c.loss_scale == 0.25f);
  CHECK_OK(ampc_amp_config_set(&c, "loss_scale", "Dynamic"));
  CHECK(c.loss_scale_dynamic == 1 && c.loss_scale == 65536.0f);

  CHECK_OK(ampc_amp_config_set(&c, "min_loss_scale", "1"));
  CHECK(c.min_loss_scale == 1.0f);
  CHECK_OK(ampc_amp_config_set(&c, "min_loss_scale", "none"));
  CHECK(c.min_loss_scale == 0.0f);
  CHECK_OK(ampc_amp_config_set(&c, "max_loss_scale", "2**20"));
  CHECK(c.max_loss_scale == 1048576.0f);
  CHECK_OK(ampc_amp_config_set(&c, "max_loss_scale", "none"));
  CHECK(isinf(c.max_loss_scale));
  CHECK_OK(ampc_amp_config_set(&c, "max_loss_scale", "inf"));
  CHECK(isinf(c.max_loss_scale) && c.max_loss_scale > 0);
  CHECK_OK(ampc_amp_config_set(&c, "scale_window", "1000"));
  CHECK(c.scale_window == 1000);
  CHECK_OK(ampc_amp_config_set(&c, "hysteresis", "2"));
  CHECK(c.hysteresis == 2);
  CHECK_OK(ampc_amp_config_set(&c, "consecutive_hysteresis", "true"));
  CHECK(c.consecutive_hysteresis == 1);
  CHECK_OK(ampc_amp_config_set(&c, "num_losses", "3"));
  CHECK(c.num_losses == 3);
  CHECK_OK(ampc_amp_config_set(&c, "growth_factor", "1.5"));
  CHECK(c.growth_factor == 1.5f);
  CHECK_OK(ampc_amp_config_set(&c, "backoff_factor", "0.25"));
  CHECK(c.backoff_factor == 0.25f);
  CHECK_OK(ampc_amp_config_validate(&c));
  unsigned all = AMPC_AMP_PROP_CAST_MODEL_TYPE | AMPC_AMP_PROP_AUTOCAST | AMPC_AMP_PROP_KEEP_BATCHNORM_FP32 |
                 AMPC_AMP_PROP_MASTER_WEIGHTS | AMPC_AMP_PROP_LOSS_SCALE | AMPC_AMP_PROP_MIN_LOSS_SCALE |
                 AMPC_AMP_PROP_MAX_LOSS_SCALE | AMPC_AMP_PROP_SCALE_WINDOW | AMPC_AMP_PROP_GROWTH_FACTOR |
                 AMPC_AMP_PROP_BACKOFF_FACTOR | AMPC_AMP_PROP_HYSTERESIS | AMPC_AMP_PROP_CONSECUTIVE_HYSTERESIS |
                 AMPC_AMP_PROP_NUM_LOSSES;
  CHECK(c.user_set == all);
}

TEST(set_init_scale_and_dynamic_in_any_order) {
  ampc_amp_config c = cfg(AMPC_OPT_O3, AMPC_DTYPE_F16);
  CHECK_OK(ampc_amp_config_set(&c, "init_scale", "1024"));
  CHECK_OK(ampc_amp_config_set(&c, "loss_scale", "dynamic"));
  CHECK(c.loss_scale_dynamic == 1 && c.loss_scale == 1024.0f);
  CHECK_OK(ampc_amp_config_validate(&c));
  c = cfg(AMPC_OPT_O3, AMPC_DTYPE_F16);
  CHECK_OK(ampc_amp_config_set(&c, "loss_scale", "dynamic"));
  CHECK_OK(ampc_amp_config_set(&c, "init_scale", "256"));
  CHECK(c.loss_scale_dynamic == 1 && c.loss_scale == 256.0f);
  CHECK_OK(ampc_amp_config_validate(&c));
}

TEST(set_rejects_junk) {
  ampc_amp_config c = cfg(AMPC_OPT_O2, AMPC_DTYPE_F16), before = c;
  CHECK_ERR(ampc_amp_config_set(&c, "loss_scale", "abc"), AMPC_EINVAL,
            "loss_scale: expected 'dynamic' or a positive finite number, got 'abc'");
  CHECK_ERR(ampc_amp_config_set(&c, "loss_scale", "0"), AMPC_EINVAL, "loss_scale: expected");
  CHECK_ERR(ampc_amp_config_set(&c, "loss_scale", "-8"), AMPC_EINVAL, "loss_scale: expected");
  CHECK_ERR(ampc_amp_config_set(&c, "loss_scale", "inf"), AMPC_EINVAL, "loss_scale: expected");
  CHECK_ERR(ampc_amp_config_set(&c, "loss_scale", "nan"), AMPC_EINVAL, "loss_scale: expected");
  CHECK_ERR(ampc_amp_config_set(&c, "loss_scale", "1e39"), AMPC_EINVAL, "loss_scale: expected");
  CHECK_ERR(ampc_amp_config_set(&c, "loss_scale", "2**200"), AMPC_EINVAL, "loss_scale: expected");
  CHECK_ERR(ampc_amp_config_set(&c, "loss_scale", "12abc"), AMPC_EINVAL, "loss_scale: expected");
  CHECK_ERR(ampc_amp_config_set(&c, "loss_scale", " 12"), AMPC_EINVAL, "loss_scale: expected");
  CHECK_ERR(ampc_amp_config_set(&c, "loss_scale", ""), AMPC_EINVAL, "loss_scale: expected");
  CHECK_ERR(ampc_amp_config_set(&c, "loss_scale", "2**"), AMPC_EINVAL, "loss_scale: expected");
  CHECK_ERR(ampc_amp_config_set(&c, "init_scale", "0"), AMPC_EINVAL, "init_scale: expected a positive finite number");
  CHECK_ERR(ampc_amp_config_set(&c, "scale_window", "0"), AMPC_EINVAL, "scale_window: expected an integer from 1 to 1000000000, got '0'");
  CHECK_ERR(ampc_amp_config_set(&c, "scale_window", "-3"), AMPC_EINVAL, "scale_window: expected an integer from 1 to 1000000000");
  CHECK_ERR(ampc_amp_config_set(&c, "scale_window", "2.5"), AMPC_EINVAL, "scale_window: expected an integer from 1 to 1000000000");
  CHECK_ERR(ampc_amp_config_set(&c, "scale_window", "99999999999"), AMPC_EINVAL, "scale_window: expected");
  CHECK_ERR(ampc_amp_config_set(&c, "hysteresis", "0"), AMPC_EINVAL, "hysteresis: expected an integer from 1 to 1000000000");
  CHECK_ERR(ampc_amp_config_set(&c, "hysteresis", "2147483648"), AMPC_EINVAL, "hysteresis: expected an integer from 1 to 1000000000");
  CHECK_ERR(ampc_amp_config_set(&c, "scale_window", "1000000001"), AMPC_EINVAL, "scale_window: expected an integer from 1 to 1000000000");
  CHECK_ERR(ampc_amp_config_set(&c, "num_losses", "x"), AMPC_EINVAL, "num_losses: expected an integer >= 1");
  CHECK_ERR(ampc_amp_config_set(&c, "growth_factor", "1"), AMPC_EINVAL, "growth_factor: expected a finite number > 1");
  CHECK_ERR(ampc_amp_config_set(&c, "growth_factor", "inf"), AMPC_EINVAL, "growth_factor: expected");
  CHECK_ERR(ampc_amp_config_set(&c, "backoff_factor", "1"), AMPC_EINVAL, "backoff_factor: expected a number in (0, 1)");
  CHECK_ERR(ampc_amp_config_set(&c, "backoff_factor", "0"), AMPC_EINVAL, "backoff_factor: expected");
  CHECK_ERR(ampc_amp_config_set(&c, "min_loss_scale", "-1"), AMPC_EINVAL, "min_loss_scale: expected");
  CHECK_ERR(ampc_amp_config_set(&c, "min_loss_scale", "inf"), AMPC_EINVAL, "min_loss_scale: expected");
  CHECK_ERR(ampc_amp_config_set(&c, "max_loss_scale", "0"), AMPC_EINVAL, "max_loss_scale: expected");
  CHECK_ERR(ampc_amp_config_set(&c, "master_weights", "maybe"), AMPC_EINVAL,
            "master_weights: expected true or false, got 'maybe'");
  CHECK_ERR(ampc_amp_config_set(&c, "autocast", "2"), AMPC_EINVAL, "autocast: expected true or false");
  CHECK_ERR(ampc_amp_config_set(&c, "cast_model_type", "i8"), AMPC_EINVAL,
            "cast_model_type: expected f32, f16, bf16 or none, got 'i8'");
  CHECK_ERR(ampc_amp_config_set(&c, "cast_model_type", "f64"), AMPC_EINVAL, "cast_model_type: expected");
  CHECK_ERR(ampc_amp_config_set(&c, "lossscale", "1"), AMPC_EINVAL, "unknown property 'lossscale' (known: ");
  CHECK_ERR(ampc_amp_config_set(&c, "opt_level", "O1"), AMPC_EINVAL, "unknown property 'opt_level'");
  CHECK_ERR(ampc_amp_config_set(&c, "", "1"), AMPC_EINVAL, "unknown property");
  CHECK_ERR(ampc_amp_config_set(&c, NULL, "1"), AMPC_EINVAL, "NULL");
  CHECK(memcmp(&c, &before, sizeof c) == 0);
}

TEST(validate_apex_refusals) {
  ampc_amp_config c = cfg(AMPC_OPT_O1, AMPC_DTYPE_F16);
  CHECK_OK(ampc_amp_config_set(&c, "cast_model_type", "f16"));
  CHECK_ERR(ampc_amp_config_validate(&c), AMPC_EINVAL, "O1 casts around ops, not the model");
  CHECK_ERR(ampc_amp_config_validate(&c), AMPC_EINVAL, "must be f32 or none, not f16");
  /* f32 (apex: torch.float32) is what O1 means anyway: accepted. */
  c = cfg(AMPC_OPT_O1, AMPC_DTYPE_F16);
  CHECK_OK(ampc_amp_config_set(&c, "cast_model_type", "f32"));
  CHECK_OK(ampc_amp_config_validate(&c));
  c = cfg(AMPC_OPT_O1, AMPC_DTYPE_BF16);
  CHECK_OK(ampc_amp_config_set(&c, "cast_model_type", "bf16"));
  CHECK_ERR(ampc_amp_config_validate(&c), AMPC_EINVAL, "not bf16");

  /* Even a value that does no harm is refused once set, as apex does. */
  c = cfg(AMPC_OPT_O1, AMPC_DTYPE_F16);
  CHECK_OK(ampc_amp_config_set(&c, "keep_batchnorm_fp32", "true"));
  CHECK_ERR(ampc_amp_config_validate(&c), AMPC_EINVAL, "O1 runs batchnorm in f32");
  c = cfg(AMPC_OPT_O1, AMPC_DTYPE_F16);
  CHECK_OK(ampc_amp_config_set(&c, "keep_batchnorm_fp32", "false"));
  CHECK_ERR(ampc_amp_config_validate(&c), AMPC_EINVAL, "keep_batchnorm_fp32 must not be set");
  c = cfg(AMPC_OPT_O1, AMPC_DTYPE_F16);
  CHECK_OK(ampc_amp_config_set(&c, "master_weights", "false"));
  CHECK_ERR(ampc_amp_config_validate(&c), AMPC_EINVAL, "master_weights makes no sense with O1");
  c = cfg(AMPC_OPT_O1, AMPC_DTYPE_F16);
  c.master_weights = 1; /* written directly, without set() */
  CHECK_ERR(ampc_amp_config_validate(&c), AMPC_EINVAL, "master_weights makes no sense with O1");

  static const ampc_opt_level not_o1[3] = {AMPC_OPT_O0, AMPC_OPT_O2, AMPC_OPT_O3};
  for (int i = 0; i < 3; i++) {
    c = cfg(not_o1[i], AMPC_DTYPE_F16);
    CHECK_OK(ampc_amp_config_set(&c, "patch_torch_functions", "true"));
    CHECK_ERR(ampc_amp_config_validate(&c), AMPC_EINVAL, "autocast (patch_torch_functions) can only be on at O1, not O");
    CHECK_OK(ampc_amp_config_set(&c, "autocast", "false"));
    CHECK_OK(ampc_amp_config_validate(&c));
  }
  c = cfg(AMPC_OPT_O1, AMPC_DTYPE_F16);
  CHECK_OK(ampc_amp_config_set(&c, "autocast", "false"));
  CHECK_OK(ampc_amp_config_validate(&c));
}

TEST(validate_ampc_refusals) {
  ampc_amp_config c = cfg(AMPC_OPT_O2, AMPC_DTYPE_F16);
  CHECK_OK(ampc_amp_config_set(&c, "cast_model_type", "bf16"));
  CHECK_ERR(ampc_amp_config_validate(&c), AMPC_EINVAL, "cast_model_type bf16 differs from the half type f16");

  c = cfg(AMPC_OPT_O2, AMPC_DTYPE_F16);
  CHECK_OK(ampc_amp_config_set(&c, "min_loss_scale", "2**10"));
  CHECK_OK(ampc_amp_config_set(&c, "max_loss_scale", "512"));
  CHECK_ERR(ampc_amp_config_validate(&c), AMPC_EINVAL, "min_loss_scale 1024 is above max_loss_scale 512");
  CHECK_OK(ampc_amp_config_set(&c, "max_loss_scale", "1024"));
  CHECK_OK(ampc_amp_config_validate(&c)); /* equal: a fixed dynamic range */

  /* scales below f32's smallest normal number (2^-126): 1/scale is inf there,
   * and an unset floor (2^-126) would lie above such a ceiling */
  static const struct {
    const char *prop, *value, *says;
  } tiny[] = {{"max_loss_scale", "1e-40", "max_loss_scale 9.99995e-41 is below f32's smallest normal number"},
              {"min_loss_scale", "1e-40", "min_loss_scale 9.99995e-41 is below"},
              {"loss_scale", "1e-40", "loss_scale 9.99995e-41 is below"},
              {"init_scale", "1e-39", "loss_scale 1e-39 is below"}};
  for (size_t i = 0; i < sizeof tiny / sizeof tiny[0]; i++) {
    c = cfg(AMPC_OPT_O2, AMPC_DTYPE_F16);
    CHECK_OK(ampc_amp_config_set(&c, tiny[i].prop, tiny[i].value));
    CHECK_ERR(ampc_amp_config_validate(&c), AMPC_EINVAL, tiny[i].says);
  }
  c = cfg(AMPC_OPT_O2, AMPC_DTYPE_F16);
  CHECK_OK(ampc_amp_config_set(&c, "max_loss_scale", "2**-126"));
  CHECK_OK(ampc_amp_config_set(&c, "min_loss_scale", "2**-126"));
  CHECK_OK(ampc_amp_config_validate(&c)); /* the smallest normal number itself */

  c = cfg(AMPC_OPT_O3, AMPC_DTYPE_F16);
  CHECK_OK(ampc_amp_config_set(&c, "init_scale", "1024"));
  CHECK_ERR(ampc_amp_config_validate(&c), AMPC_EINVAL, "init_scale applies to a dynamic loss scale");
  /* a static scale the user set is not overwritten by a later init_scale
   * (they share a field): refused there, naming the user's scale */
  c = cfg(AMPC_OPT_O2, AMPC_DTYPE_F16);
  CHECK_OK(ampc_amp_config_set(&c, "loss_scale", "128"));
  CHECK_ERR(ampc_amp_config_set(&c, "init_scale", "1024"), AMPC_EINVAL, "init_scale applies to a dynamic loss scale, but loss_scale is static (128)");
  CHECK(c.loss_scale == 128.0f && !c.loss_scale_dynamic);

  /* Fields written directly, bypassing set(). */
  ampc_amp_config base = cfg(AMPC_OPT_O2, AMPC_DTYPE_F16);
  c = base, c.loss_scale = 0;
  CHECK_ERR(ampc_amp_config_validate(&c), AMPC_EINVAL, "loss_scale must be a positive finite number");
  c = base, c.loss_scale = -2;
  CHECK_ERR(ampc_amp_config_validate(&c), AMPC_EINVAL, "loss_scale must be a positive finite number");
  c = base, c.loss_scale = NAN;
  CHECK_ERR(ampc_amp_config_validate(&c), AMPC_EINVAL, "loss_scale must be a positive finite number");
  c = base, c.loss_scale = INFINITY;
  CHECK_ERR(ampc_amp_config_validate(&c), AMPC_EINVAL, "loss_scale must be a positive finite number");
  c = base, c.min_loss_scale = -1;
  CHECK_ERR(ampc_amp_config_validate(&c), AMPC_EINVAL, "min_loss_scale must be a finite number >= 0");
  c = base, c.max_loss_scale = 0;
  CHECK_ERR(ampc_amp_config_validate(&c), AMPC_EINVAL, "max_loss_scale must be positive");
  c = base, c.scale_window = 0;
  CHECK_ERR(ampc_amp_config_validate(&c), AMPC_EINVAL, "scale_window must be >= 1");
  c = base, c.growth_factor = 1;
  CHECK_ERR(ampc_amp_config_validate(&c), AMPC_EINVAL, "growth_factor must be a finite number > 1");
  c = base, c.backoff_factor = 1;
  CHECK_ERR(ampc_amp_config_validate(&c), AMPC_EINVAL, "backoff_factor must be in (0, 1)");
  c = base, c.hysteresis = 0;
  CHECK_ERR(ampc_amp_config_validate(&c), AMPC_EINVAL, "hysteresis must be >= 1");
  c = base, c.num_losses = 0;
  CHECK_ERR(ampc_amp_config_validate(&c), AMPC_EINVAL, "num_losses must be >= 1");
  c = base, c.keep_batchnorm_fp32 = 2;
  CHECK_ERR(ampc_amp_config_validate(&c), AMPC_EINVAL, "must be -1 (n/a), 0 or 1");
  c = base, c.half_type = AMPC_DTYPE_F32;
  CHECK_ERR(ampc_amp_config_validate(&c), AMPC_EINVAL, "half type must be f16 or bf16");
  c = base, c.cast_model_type = AMPC_DTYPE_I8;
  CHECK_ERR(ampc_amp_config_validate(&c), AMPC_EINVAL, "cast_model_type must be f32, f16 or bf16, not i8");
  c = base, c.opt_level = (ampc_opt_level)7;
  CHECK_ERR(ampc_amp_config_validate(&c), AMPC_EINVAL, "opt level 7 out of range");
  CHECK_ERR(ampc_amp_config_validate(NULL), AMPC_EINVAL, "NULL");
}

TEST(no_effect_overrides_are_accepted) {
  /* apex accepts these and they change nothing: an f32 model has no half
   * copy to keep masters for, nor batchnorm to keep in f32. */
  ampc_amp_config c = cfg(AMPC_OPT_O0, AMPC_DTYPE_F16);
  CHECK_OK(ampc_amp_config_set(&c, "master_weights", "true"));
  CHECK_OK(ampc_amp_config_set(&c, "keep_batchnorm_fp32", "true"));
  CHECK_OK(ampc_amp_config_validate(&c));
  CHECK(ampc_amp_config_uses_master_weights(&c) == 0);
  CHECK(ampc_amp_config_batchnorm_type(&c) == AMPC_DTYPE_F32);

  c = cfg(AMPC_OPT_O2, AMPC_DTYPE_F16);
  CHECK(ampc_amp_config_uses_master_weights(&c) == 1);
  CHECK(ampc_amp_config_batchnorm_type(&c) == AMPC_DTYPE_F32);
  CHECK_OK(ampc_amp_config_set(&c, "cast_model_type", "f32"));
  CHECK_OK(ampc_amp_config_validate(&c));
  CHECK(ampc_amp_config_uses_master_weights(&c) == 0);

  c = cfg(AMPC_OPT_O3, AMPC_DTYPE_BF16);
  CHECK(ampc_amp_config_uses_master_weights(&c) == 0);
  CHECK(ampc_amp_config_batchnorm_type(&c) == AMPC_DTYPE_BF16);
  CHECK_OK(ampc_amp_config_set(&c, "keep_batchnorm_fp32", "true"));
  CHECK_OK(ampc_amp_config_set(&c, "master_weights", "true"));
  CHECK_OK(ampc_amp_config_validate(&c));
  CHECK(ampc_amp_config_batchnorm_type(&c) == AMPC_DTYPE_F32);
  CHECK(ampc_amp_config_uses_master_weights(&c) == 1);

  c = cfg(AMPC_OPT_O1, AMPC_DTYPE_F16);
  CHECK(ampc_amp_config_uses_master_weights(&c) == 0);
  CHECK(ampc_amp_config_batchnorm_type(&c) == AMPC_DTYPE_F32);
}

TEST(describe_line) {
  ampc_amp_config c = cfg(AMPC_OPT_O2, AMPC_DTYPE_F16);
  CHECK_OK(ampc_amp_config_set(&c, "master_weights", "false"));
  CHECK_OK(ampc_amp_config_set(&c, "min_loss_scale", "1"));
  char line[1024];
  int n = ampc_amp_config_describe(&c, line, sizeof line);
  CHECK(n > 0 && (size_t)n == strlen(line));
  CHECK(!strchr(line, '\n'));
  static const char *const want[] = {
      "O2 (f16 training with f32 batchnorm and no master weights):", " half_type=f16", " cast_model_type=f16",
      " autocast=off", " keep_batchnorm_fp32=on", " master_weights=off", " loss_scale=dynamic", " init_scale=65536",
      " min_loss_scale=1 ", " max_loss_scale=16777216", " scale_window=2000", " growth_factor=2",
      " backoff_factor=0.5", " hysteresis=1", " consecutive_hysteresis=off", " num_losses=1",
      "; overrides: master_weights,min_loss_scale"};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) CHECK_MSG(strstr(line, want[i]), "'%s' in '%s'", want[i], line);

  /* Length query and truncation, like snprintf. */
  CHECK(ampc_amp_config_describe(&c, NULL, 0) == n);
  char small[16];
  CHECK(ampc_amp_config_describe(&c, small, sizeof small) == n);
  CHECK(strlen(small) == sizeof small - 1 && strncmp(small, line, sizeof small - 1) == 0);

  c = cfg(AMPC_OPT_O0, AMPC_DTYPE_F16);
  CHECK_OK(ampc_amp_config_set(&c, "master_weights", "true"));
  CHECK_OK(ampc_amp_config_set(&c, "max_loss_scale", "none"));
  ampc_amp_config_describe(&c, line, sizeof line);
  CHECK_MSG(strstr(line, "O0 (pure f32 training):"), "%s", line);
  CHECK_MSG(strstr(line, " keep_batchnorm_fp32=n/a"), "%s", line);
  CHECK_MSG(strstr(line, " master_weights=on(no effect: f32 model)"), "%s", line);
  CHECK_MSG(strstr(line, " loss_scale=1 "), "%s", line);
  CHECK_MSG(strstr(line, " min_loss_scale=none max_loss_scale=none"), "%s", line);

  c = cfg(AMPC_OPT_O3, AMPC_DTYPE_BF16);
  ampc_amp_config_describe(&c, line, sizeof line);
  CHECK_MSG(strstr(line, "O3 (pure bf16 training):"), "%s", line);
  CHECK_MSG(strstr(line, "; overrides: none"), "%s", line);
  /* the headline says what the overrides make of the level; the first
   * step's scale is bounded by the ceiling */
  CHECK_OK(ampc_amp_config_set(&c, "master_weights", "true"));
  ampc_amp_config_describe(&c, line, sizeof line);
  CHECK_MSG(strstr(line, "O3 (bf16 training with bf16 batchnorm and f32 master weights):"), "%s", line);
  c = cfg(AMPC_OPT_O2, AMPC_DTYPE_F16);
  CHECK_OK(ampc_amp_config_set(&c, "keep_batchnorm_fp32", "false"));
  CHECK_OK(ampc_amp_config_set(&c, "master_weights", "false"));
  CHECK_OK(ampc_amp_config_set(&c, "max_loss_scale", "1024"));
  ampc_amp_config_describe(&c, line, sizeof line);
  CHECK_MSG(strstr(line, "O2 (pure f16 training):") && strstr(line, " init_scale=1024 "), "%s", line);
  c = cfg(AMPC_OPT_O2, AMPC_DTYPE_F16);
  ampc_amp_config_describe(&c, line, sizeof line);
  CHECK_MSG(strstr(line, "O2 (f16 training with f32 batchnorm and f32 master weights):"), "%s", line);
  c = cfg(AMPC_OPT_O1, AMPC_DTYPE_F16);
  ampc_amp_config_describe(&c, line, sizeof line);
  CHECK_MSG(strstr(line, "O1 (f16 casts around ops") && strstr(line, " autocast=on") && strstr(line, " master_weights=n/a"),
            "%s", line);
}

TEST_MAIN(TEST_ENTRY(opt_level_parse), TEST_ENTRY(defaults_f16_match_apex), TEST_ENTRY(defaults_bf16_no_loss_scaling),
          TEST_ENTRY(init_rejects_bad_args), TEST_ENTRY(set_parses_values),
          TEST_ENTRY(set_init_scale_and_dynamic_in_any_order), TEST_ENTRY(set_rejects_junk),
          TEST_ENTRY(validate_apex_refusals), TEST_ENTRY(validate_ampc_refusals),
          TEST_ENTRY(no_effect_overrides_are_accepted), TEST_ENTRY(describe_line))
