/*
 * amp_config.h -- apex opt levels and their properties, the loss scaler, and
 * the gradient-clipping coefficient. Pure logic: nothing here touches a graph
 * or a tensor (the graph-facing half of amp is amp.h, built on this).
 *
 * A configuration starts from an opt level's defaults (apex's table) and then
 * takes user overrides, like apex's amp.initialize(opt_level=..., **kwargs);
 * validate() refuses the combinations apex refuses:
 *
 *     ampc_amp_config c;
 *     ampc_amp_config_init(&c, AMPC_OPT_O2, AMPC_DTYPE_F16);
 *     if (ampc_amp_config_set(&c, "master_weights", "false") < 0 ||
 *         ampc_amp_config_validate(&c) < 0)
 *         fprintf(stderr, "error: %s\n", ampc_last_error());
 *
 * One loss scaler per loss (c.num_losses of them). After each step's overflow
 * check, update() says whether to apply the optimizer step and adjusts the
 * scale:
 *
 *     ampc_scaler s;
 *     ampc_scaler_init(&s, &c);
 *     ... backward of loss * ampc_scaler_scale(&s), unscale by
 *         ampc_scaler_inv_scale(&s) into the f32 master grads, found_inf = any
 *         inf/NaN seen ...
 *     if (ampc_scaler_update(&s, found_inf)) optimizer step; else skip;
 *
 * The opt levels (apex/amp/frontend.py; "half" is f16 or bf16, chosen at init):
 *
 *   level  cast_model_type  autocast  keep_batchnorm_fp32  master_weights  loss_scale
 *   O0     f32              off       n/a                  off             1.0 static
 *   O1     f32 (none)       on        n/a                  n/a             dynamic
 *   O2     half             off       on                   on              dynamic
 *   O3     half             off       off                  off             1.0 static
 *
 * With bf16 as the half type every level defaults to no loss scaling (static
 * 1.0): bf16 has f32's 8-bit exponent, so gradients that fit in f32 do not
 * underflow in bf16 and scaling them only risks overflow. "loss_scale=dynamic"
 * still turns scaling on.
 *
 * Where ampc differs from apex on purpose:
 *   - A step whose gradients overflow is skipped with a static scale too (apex
 *     only checks with a dynamic scale and applies an inf/NaN step).
 *   - Hysteresis (DeepSpeed/Megatron): hysteresis=N tolerates N-1 overflows
 *     before backing off; see ampc_scaler_update().
 *   - The scale never reaches 0 (or a subnormal): with min_loss_scale unset it
 *     stops at FLT_MIN (2^-126), so 1/scale stays finite.
 */
#ifndef AMPC_AMP_CONFIG_H
#define AMPC_AMP_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "ampc/dtype.h"
#include "ampc/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { AMPC_OPT_O0 = 0, AMPC_OPT_O1, AMPC_OPT_O2, AMPC_OPT_O3, AMPC_OPT_COUNT } ampc_opt_level;

/* "O0".."O3" (also lower-case "o0".."o3"). */
ampc_status ampc_opt_level_parse(const char *s, ampc_opt_level *out);
/* "O0".."O3"; "?" for a value out of range. */
const char *ampc_opt_level_name(ampc_opt_level level);

/* One bit per property, in ampc_amp_config.user_set: which ones the user set
 * explicitly (apex refuses "O1 + master_weights=False" although O1's value is
 * not "on" either: what counts is that the user asked). */
typedef enum {
  AMPC_AMP_PROP_CAST_MODEL_TYPE = 1u << 0,
  AMPC_AMP_PROP_AUTOCAST = 1u << 1,
  AMPC_AMP_PROP_KEEP_BATCHNORM_FP32 = 1u << 2,
  AMPC_AMP_PROP_MASTER_WEIGHTS = 1u << 3,
  AMPC_AMP_PROP_LOSS_SCALE = 1u << 4,
  AMPC_AMP_PROP_INIT_SCALE = 1u << 5,
  AMPC_AMP_PROP_MIN_LOSS_SCALE = 1u << 6,
  AMPC_AMP_PROP_MAX_LOSS_SCALE = 1u << 7,
  AMPC_AMP_PROP_SCALE_WINDOW = 1u << 8,
  AMPC_AMP_PROP_GROWTH_FACTOR = 1u << 9,
  AMPC_AMP_PROP_BACKOFF_FACTOR = 1u << 10,
  AMPC_AMP_PROP_HYSTERESIS = 1u << 11,
  AMPC_AMP_PROP_CONSECUTIVE_HYSTERESIS = 1u << 12,
  AMPC_AMP_PROP_NUM_LOSSES = 1u << 13
} ampc_amp_prop;

/* Plain data: read the fields freely; change them through set() so that the
 * values are parsed and user_set is kept, or write them directly and call
 * validate(). */
typedef struct {
  ampc_opt_level opt_level;
  ampc_dtype half_type;       /* F16 (default) or BF16: what "half" means at this level */
  ampc_dtype cast_model_type; /* F32 (O0; O1's "none": weights stay f32), or half_type (O2, O3) */
  int autocast;               /* apex's patch_torch_functions: per-op cast policy, O1 only */
  int keep_batchnorm_fp32;    /* -1 = n/a (O0, O1), 0/1 */
  int master_weights;         /* -1 = n/a (O1), 0/1 */
  int loss_scale_dynamic;     /* 1: "dynamic" */
  float loss_scale;           /* the static scale, or the initial dynamic scale (2^16) */
  float min_loss_scale;       /* 0 = none (floor FLT_MIN) */
  float max_loss_scale;       /* 2^24 (apex); INFINITY = none */
  int scale_window;           /* clean steps before growth: 2000 */
  float growth_factor;        /* 2 */
  float backoff_factor;       /* 0.5 */
  int hysteresis;             /* 1 = off: back off on the first overflow; DeepSpeed's 2 */
  int consecutive_hysteresis; /* 1: every clean step refills hysteresis (DeepSpeed's option); 0 */
  int num_losses;             /* loss scalers, one per loss: 1 */
  unsigned user_set;          /* ampc_amp_prop bits set by ampc_amp_config_set() */
} ampc_amp_config;

/* Fills c with the defaults of `level` for `half_type` (F16 or BF16), with
 * user_set = 0. AMPC_EINVAL for another level or type. */
ampc_status ampc_amp_config_init(ampc_amp_config *c, ampc_opt_level level, ampc_dtype half_type);

/* Overrides one property from its text value (the CLI and C users share this
 * parser and its error messages), and marks it in user_set. Names may use '-'
 * for '_'. Only the value is checked here; combinations are validate()'s job.
 *   cast_model_type         f32|f16|bf16 (aliases of ampc_dtype_parse; "none" = f32)
 *   autocast                bool; alias patch_torch_functions
 *   keep_batchnorm_fp32     bool
 *   master_weights          bool
 *   loss_scale              "dynamic" (initial scale 2^16 unless init_scale is set)
 *                           or a positive finite number: a static scale
 *   init_scale              positive finite number: the initial dynamic scale
 *   min_loss_scale          number >= 0, or "none" (= 0)
 *   max_loss_scale          positive number, or "none"/"inf" (= INFINITY)
 *   scale_window            integer 1..10^9
 *   growth_factor           finite number > 1
 *   backoff_factor          number in (0, 1)
 *   hysteresis              integer 1..10^9
 *   consecutive_hysteresis  bool
 *   num_losses              integer in 1..1024
 * A bool is true/false/on/off/yes/no/1/0 (any case). A number may be written
 * as a power, "2**16" or "2^16". AMPC_EINVAL on an unknown name or bad value,
 * leaving c unchanged. */
ampc_status ampc_amp_config_set(ampc_amp_config *c, const char *property, const char *value);

/* Checks the values and their combination. Refused, as apex does:
 *   - O1 with cast_model_type set to a 16-bit type (f32/"none" is accepted);
 *   - O1 with keep_batchnorm_fp32 or master_weights set at all;
 *   - autocast on at any level but O1.
 * Refused by ampc: a 16-bit cast_model_type other than half_type; a value out
 * of its range (see set()); min_loss_scale > max_loss_scale.
 * Accepted with no effect, as apex does: master_weights and
 * keep_batchnorm_fp32 when the model is f32 (e.g. O0, or O2 with
 * cast_model_type=f32) -- use the ampc_amp_config_uses_* helpers below for the
 * effective behaviour; dynamic-scaling settings with a static scale. */
ampc_status ampc_amp_config_validate(const ampc_amp_config *c);

/* Effective behaviour of a configuration: */
/* 1 when f32 master weights are kept for a 16-bit model (master_weights == 1
 * and cast_model_type is not f32). */
int ampc_amp_config_uses_master_weights(const ampc_amp_config *c);
/* The storage type of batchnorm parameters: f32 with an f32 model or with
 * keep_batchnorm_fp32 == 1 (or n/a, -1), cast_model_type otherwise; f32 for
 * a NULL c. */
ampc_dtype ampc_amp_config_batchnorm_type(const ampc_amp_config *c);

/* One line naming every property, e.g. "O2 (f16 training with f32 batchnorm
 * and f32 master weights): half_type=f16 cast_model_type=f16 autocast=off ...
 * overrides: master_weights". Writes at most len bytes (NUL-terminated when
 * len > 0; buf may be NULL when len is 0) and returns the length the whole
 * line needs, like snprintf; AMPC_EINVAL for a NULL c. */
int ampc_amp_config_describe(const ampc_amp_config *c, char *buf, size_t len);

/* ---- Loss scaler ------------------------------------------------------- */

/* The scaler's changing state: plain data, saved into checkpoints as is
 * (apex's loss_scale/unskipped, torch's scale/growth tracker, Megatron's
 * hysteresis tracker) and restored with ampc_scaler_set_state(), which
 * takes counters of 0..AMPC_SCALER_MAX_COUNT (2^53: far past any run, and
 * never near int64's end however many steps follow). */
#define AMPC_SCALER_MAX_COUNT ((int64_t)1 << 53)
typedef struct {
  float scale;
  int64_t growth_tracker;  /* clean steps since the last overflow or growth (apex "unskipped") */
  int hysteresis_left;     /* overflows left to tolerate, counting this one: 1 = back off now */
  int64_t overflows;       /* steps that found an inf/NaN */
  int64_t skipped_steps;   /* steps not applied (== overflows) */
  int64_t steps;           /* update() calls */
  int64_t min_scale_hits;  /* consecutive overflowing steps taken at the minimum scale */
} ampc_scaler_state;

/* Plain data too; the fields after st are a copy of the configuration. */
typedef struct ampc_scaler {
  ampc_scaler_state st;
  int dynamic;
  float init_scale;
  float growth_factor, backoff_factor;
  float min_scale;  /* effective floor: min_loss_scale, or FLT_MIN when that is 0 */
  float max_scale;  /* INFINITY = none */
  int window;
  int hysteresis;
  int consecutive_hysteresis;
} ampc_scaler;

/* From a validated configuration. The initial dynamic scale is clamped into
 * [min, max] (apex starts at min(2^16, max_loss_scale)). */
void ampc_scaler_init(ampc_scaler *s, const ampc_amp_config *c);

/* Call once per step after the overflow check (found_inf != 0: some gradient
 * was inf or NaN). Returns 1 if the optimizer step should be applied, 0 if it
 * is skipped (found_inf, with a static or a dynamic scale).
 * Dynamic scale:
 *   overflow: growth_tracker = 0; if hysteresis_left > 1, hysteresis_left--
 *     and the scale stays; otherwise scale = max(scale * backoff, min) (and
 *     hysteresis_left stays 1: once used up, every overflow backs off until
 *     the next growth refills it -- DeepSpeed's and Megatron's rule).
 *   clean step: growth_tracker++; at `window`: scale = min(scale * growth,
 *     max), kept only if finite (torch), growth_tracker = 0 and
 *     hysteresis_left = hysteresis. With consecutive_hysteresis every clean
 *     step refills hysteresis_left, so only N overflows in a row back off.
 * Static scale: the scale never changes.
 * An overflow taken at the minimum scale (for a static scale: at any overflow,
 * the scale being its own minimum) counts in min_scale_hits; a clean step
 * resets it. */
int ampc_scaler_update(ampc_scaler *s, int found_inf);

/* The scale to multiply the loss by, and 1/scale to unscale gradients by. */
float ampc_scaler_scale(const ampc_scaler *s);
float ampc_scaler_inv_scale(const ampc_scaler *s);

/* 1 when the last n (>= 1) steps all overflowed at the minimum scale: lowering
 * the scale cannot help any more, the model has diverged (NaN in the forward
 * pass, or an lr too high). */
int ampc_scaler_diverged(const ampc_scaler *s, int n);

/* Copies the state out (for a checkpoint). */
void ampc_scaler_get_state(const ampc_scaler *s, ampc_scaler_state *out);
/* Restores a saved state, checking it: AMPC_EINVAL for a non-finite or
 * non-positive scale, negative counters or a hysteresis_left below 1, the
 * least a state holds (s unchanged). A dynamic scale is clamped into the
 * current [min, max] and hysteresis_left down to hysteresis, so a run may
 * resume with changed limits; a static scaler
 * keeps its configured scale and restores only the counters. */
ampc_status ampc_scaler_set_state(ampc_scaler *s, const ampc_scaler_state *st);

/* ---- Gradient clipping ------------------------------------------------- */

/* The coefficient to multiply the unscaled master gradients by so that their
 * global L2 norm is at most max_norm: min(1, max_norm / (norm + 1e-6)), with
 * norm = sqrt(total_sq_norm), as torch.nn.utils.clip_grad_norm_. Stores the
 * norm in *norm_out (if not NULL). A non-finite norm (inf/NaN gradients, or a
 * negative total_sq_norm) never clips: it returns 1 and reports the norm as
 * +INFINITY -- the scaler skips that step anyway, and scaling by 0 or NaN
 * would only hide which step overflowed. max_norm that is not > 0 (or NaN)
 * means no clipping (1); max_norm = INFINITY too. */
float ampc_clip_coef(double total_sq_norm, float max_norm, float *norm_out);

#ifdef __cplusplus
}
#endif
#endif
