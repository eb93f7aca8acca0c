/* Learning-rate schedules in closed form (see include/ampc/optim.h). */
#include <math.h>
#include <string.h>
#include <strings.h>

#include "ampc/optim.h"
#include "core/status_internal.h"

static const double pi = 3.14159265358979323846;

static const char *const lr_kind_names[] = {
    [AMPC_LR_CONSTANT] = "constant", [AMPC_LR_STEP] = "step", [AMPC_LR_COSINE] = "cosine"};

const char *ampc_lr_kind_name(ampc_lr_kind kind) {
  return (unsigned)kind < sizeof lr_kind_names / sizeof lr_kind_names[0] ? lr_kind_names[kind] : "?";
}

ampc_status ampc_lr_kind_parse(const char *name, ampc_lr_kind *out) {
  if (!out) return ampc__error(AMPC_EINVAL, "ampc_lr_kind_parse: out is NULL");
  for (size_t i = 0; i < sizeof lr_kind_names / sizeof lr_kind_names[0]; i++)
    if (name && strcasecmp(name, lr_kind_names[i]) == 0) {
      *out = (ampc_lr_kind)i;
      return AMPC_OK;
    }
  return ampc__error(AMPC_EINVAL, "lr schedule: unknown kind '%s' (expected constant, step or cosine)",
                     name ? name : "");
}

void ampc_lr_schedule_default(ampc_lr_schedule *s, ampc_lr_kind kind) {
  if (!s) return;
  memset(s, 0, sizeof *s);
  s->kind = kind;
  s->gamma = 0.1f;
  s->warmup_start_factor = 1.0f / 3.0f;
}

/* The checks of validate; with report == 0 they only return the code, so that
 * ampc_lr_at can use them without touching the thread's error message. */
#define FAIL(...) (report ? ampc__error(AMPC_EINVAL, __VA_ARGS__) : AMPC_EINVAL)
static ampc_status check(const ampc_lr_schedule *s, int report) {
  if (!s) return FAIL("lr schedule: NULL");
  switch (s->kind) {
    case AMPC_LR_CONSTANT: break;
    case AMPC_LR_STEP:
      if (s->step_size < 1)
        return FAIL("lr schedule: step: step_size must be >= 1 (got %lld)", (long long)s->step_size);
      if (!(s->gamma >= 0.0f) || !isfinite(s->gamma))
        return FAIL("lr schedule: step: gamma must be finite and >= 0 (got %g)", s->gamma);
      break;
    case AMPC_LR_COSINE:
      if (s->t_max < 1)
        return FAIL("lr schedule: cosine: t_max must be >= 1 (got %lld)", (long long)s->t_max);
      if (!(s->eta_min >= 0.0f) || !isfinite(s->eta_min))
        return FAIL("lr schedule: cosine: eta_min must be finite and >= 0 (got %g)", s->eta_min);
      break;
    default: return FAIL("lr schedule: unknown kind %d", (int)s->kind);
  }
  if (s->warmup < 0)
    return FAIL("lr schedule: warmup must be >= 0 (got %lld)", (long long)s->warmup);
  if (s->warmup > 0 && !(s->warmup_start_factor > 0.0f && s->warmup_start_factor <= 1.0f))
    return FAIL("lr schedule: warmup_start_factor must be in (0, 1] (got %g)",
                       s->warmup_start_factor);
  return AMPC_OK;
}

#undef FAIL

ampc_status ampc_lr_schedule_validate(const ampc_lr_schedule *s) { return check(s, 1); }

float ampc_lr_at(const ampc_lr_schedule *s, float base_lr, int64_t t) {
  if (check(s, 0) < 0) return base_lr;
  if (t < 0) t = 0;
  double base = base_lr, factor = 1.0;
  int64_t tm = t; /* the main schedule's index: counted from the end of the warm-up */
  if (s->warmup > 0) {
    double start = s->warmup_start_factor;
    int64_t tw = t < s->warmup ? t : s->warmup;
    factor = start + (1.0 - start) * (double)tw / (double)s->warmup;
    tm = t > s->warmup ? t - s->warmup : 0;
  }
  double lr = base;
  switch (s->kind) {
    case AMPC_LR_STEP: lr = base * pow((double)s->gamma, (double)(tm / s->step_size)); break;
    case AMPC_LR_COSINE: {
      int64_t tc = tm < s->t_max ? tm : s->t_max;
      double eta = s->eta_min;
      lr = eta + (base - eta) * (1.0 + cos(pi * (double)tc / (double)s->t_max)) / 2.0;
      break;
    }
    default: break;
  }
  return (float)(lr * factor);
}
