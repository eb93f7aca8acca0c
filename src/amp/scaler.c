/* The loss scaler (apex/torch dynamic scaling with DeepSpeed's hysteresis and
 * both a floor and a ceiling), and the gradient-clipping coefficient. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "ampc/amp_config.h"
#include "core/status_internal.h"

static float clamp_scale(const ampc_scaler *s, float x) { return fmaxf(s->min_scale, fminf(x, s->max_scale)); }

void ampc_scaler_init(ampc_scaler *s, const ampc_amp_config *c) {
  if (!s || !c) return; /* void: a NULL scaler or config is a no-op */
  memset(s, 0, sizeof *s);
  s->dynamic = c->loss_scale_dynamic;
  s->growth_factor = c->growth_factor;
  s->backoff_factor = c->backoff_factor;
  /* No floor would let repeated halving reach subnormals and then 0, where
   * 1/scale is inf and every unscaled gradient NaN: stop at the smallest
   * normal float instead. */
  s->min_scale = c->min_loss_scale > 0 ? c->min_loss_scale : FLT_MIN;
  s->max_scale = c->max_loss_scale;
  s->window = c->scale_window;
  s->hysteresis = c->hysteresis;
  s->consecutive_hysteresis = c->consecutive_hysteresis;
  s->init_scale = s->dynamic ? clamp_scale(s, c->loss_scale) : c->loss_scale;
  s->st.scale = s->init_scale;
  s->st.hysteresis_left = s->hysteresis;
}

int ampc_scaler_update(ampc_scaler *s, int found_inf) {
  if (!s) return 0; /* no scaler: the step is not applied */
  ampc_scaler_state *st = &s->st;
  st->steps++;
  if (found_inf) {
    st->overflows++;
    st->skipped_steps++;
    st->growth_tracker = 0;
    /* A static scale is its own minimum: nothing can lower it either. */
    if (!s->dynamic || st->scale <= s->min_scale) st->min_scale_hits++;
    else st->min_scale_hits = 0;
    if (s->dynamic) {
      /* Hysteresis is not refilled by backing off: once used up, every
       * overflow backs off until a growth (or, with consecutive_hysteresis, a
       * clean step) refills it, as DeepSpeed and Megatron do. */
      if (st->hysteresis_left > 1) st->hysteresis_left--;
      else st->scale = fmaxf(st->scale * s->backoff_factor, s->min_scale);
    }
    return 0;
  }
  st->min_scale_hits = 0;
  st->growth_tracker++;
  if (s->dynamic) {
    if (s->consecutive_hysteresis) st->hysteresis_left = s->hysteresis;
    if (st->growth_tracker >= s->window) {
      /* With max_scale = INFINITY the product can overflow: torch keeps a
       * grown scale only if it is finite. */
      float g = fminf(st->scale * s->growth_factor, s->max_scale);
      if (isfinite(g)) st->scale = g;
      st->growth_tracker = 0;
      st->hysteresis_left = s->hysteresis;
    }
  }
  return 1;
}

float ampc_scaler_scale(const ampc_scaler *s) { return s ? s->st.scale : 0.0f; }

float ampc_scaler_inv_scale(const ampc_scaler *s) { return s ? (float)(1.0 / (double)s->st.scale) : 0.0f; }

int ampc_scaler_diverged(const ampc_scaler *s, int n) { return s && s->st.min_scale_hits >= (n < 1 ? 1 : n); }

void ampc_scaler_get_state(const ampc_scaler *s, ampc_scaler_state *out) {
  if (s && out) *out = s->st;
}

ampc_status ampc_scaler_set_state(ampc_scaler *s, const ampc_scaler_state *st) {
  if (!s || !st) return ampc__error(AMPC_EINVAL, "scaler: set_state: NULL argument");
  if (!(st->scale > 0) || !isfinite(st->scale))
    return ampc__error(AMPC_EINVAL, "scaler: saved scale %g is not a positive finite number", (double)st->scale);
  const int64_t counters[] = {st->growth_tracker, st->overflows, st->skipped_steps, st->steps, st->min_scale_hits};
  for (size_t i = 0; i < sizeof counters / sizeof counters[0]; i++) {
    if (counters[i] < 0) return ampc__error(AMPC_EINVAL, "scaler: saved state has a negative counter (or hysteresis_left < 1)");
    if (counters[i] > AMPC_SCALER_MAX_COUNT) return ampc__error(AMPC_EINVAL, "scaler: saved state has a counter past 2^53");
  }
  if (st->hysteresis_left < 1)
    return ampc__error(AMPC_EINVAL, "scaler: saved state has a negative counter (or hysteresis_left < 1)");
  s->st = *st;
  s->st.scale = s->dynamic ? clamp_scale(s, st->scale) : s->init_scale;
  if (s->st.hysteresis_left > s->hysteresis) s->st.hysteresis_left = s->hysteresis;
  return AMPC_OK;
}

float ampc_clip_coef(double total_sq_norm, float max_norm, float *norm_out) {
  /* NaN for a NaN or negative sum; a norm beyond FLT_MAX counts as infinite,
   * as it would be in f32. */
  double norm = sqrt(total_sq_norm);
  if (!(norm <= FLT_MAX)) {
    if (norm_out) *norm_out = INFINITY;
    return 1.0f;
  }
  if (norm_out) *norm_out = (float)norm;
  if (!(max_norm > 0)) return 1.0f;
  double coef = (double)max_norm / (norm + 1e-6);
  return coef < 1.0 ? (float)coef : 1.0f;
}
