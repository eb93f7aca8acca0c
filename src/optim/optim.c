/* Optimizer objects: configuration, the state's layout on a device, the
 * per-step constants. The element updates are the backend's (step_math.h). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/status_internal.h"
#include "optim/optim_internal.h"

enum { OPTIM_MAX_STATE = 3 };
/* The largest step count: exact as the double the bias corrections use, and
 * far from int64_t's overflow at the next step. */
#define OPTIM_MAX_STEP ((int64_t)1 << 53)

struct ampc_optim {
  ampc_optim_config cfg;
  size_t numel;
  size_t shard_lo, shard_n; /* the flat elements whose state is kept: [0, numel) unless sharded */
  int64_t step;
  ampc__device *dev;    /* where the state lives: a cpu device until amp binds it */
  /* One device allocation holding nstate buffers of numel floats, each
   * starting on a 64-byte boundary: (nstate, stride) with stride >= numel,
   * in the order of names (torch's state_dict order). */
  float *state;
  size_t stride, nstate;
  int dirty;            /* the state may hold other values than the zeros it was made with */
  const char *names[OPTIM_MAX_STATE];
};

static const char *const kind_names[] = {
    [AMPC_OPTIM_SGD] = "sgd", [AMPC_OPTIM_ADAM] = "adam", [AMPC_OPTIM_ADAMW] = "adamw"};

const char *ampc_optim_kind_name(ampc_optim_kind kind) {
  return (unsigned)kind < sizeof kind_names / sizeof kind_names[0] ? kind_names[kind] : "?";
}

ampc_status ampc_optim_kind_parse(const char *name, ampc_optim_kind *out) {
  if (!out) return ampc__error(AMPC_EINVAL, "ampc_optim_kind_parse: out is NULL");
  for (size_t i = 0; i < sizeof kind_names / sizeof kind_names[0]; i++)
    if (name && strcasecmp(name, kind_names[i]) == 0) {
      *out = (ampc_optim_kind)i;
      return AMPC_OK;
    }
  return ampc__error(AMPC_EINVAL, "optim: unknown optimizer '%s' (expected sgd, adam or adamw)",
                     name ? name : "");
}

void ampc_optim_config_default(ampc_optim_config *c, ampc_optim_kind kind) {
  if (!c) return;
  memset(c, 0, sizeof *c);
  c->kind = kind;
  c->lr = 1e-3f;
  if (kind == AMPC_OPTIM_ADAM || kind == AMPC_OPTIM_ADAMW) {
    c->beta1 = 0.9f;
    c->beta2 = 0.999f;
    c->eps = 1e-8f;
    c->weight_decay = kind == AMPC_OPTIM_ADAMW ? 1e-2f : 0.0f;
  }
}

/* "x >= 0" written so that NaN fails it. */
static int nonneg(float x) { return x >= 0.0f && isfinite(x); }

ampc_status ampc_optim_config_validate(const ampc_optim_config *c) {
  if (!c) return ampc__error(AMPC_EINVAL, "optim: config is NULL");
  if ((unsigned)c->kind > AMPC_OPTIM_ADAMW)
    return ampc__error(AMPC_EINVAL, "optim: unknown optimizer kind %d", (int)c->kind);
  const char *who = ampc_optim_kind_name(c->kind);
  if (!nonneg(c->lr)) return ampc__error(AMPC_EINVAL, "%s: invalid learning rate: %g (must be >= 0)", who, c->lr);
  if (!nonneg(c->weight_decay))
    return ampc__error(AMPC_EINVAL, "%s: invalid weight_decay value: %g (must be >= 0)", who, c->weight_decay);
  if (c->kind == AMPC_OPTIM_SGD) {
    if (!nonneg(c->momentum))
      return ampc__error(AMPC_EINVAL, "sgd: invalid momentum value: %g (must be >= 0)", c->momentum);
    if (!isfinite(c->dampening))
      return ampc__error(AMPC_EINVAL, "sgd: invalid dampening value: %g (must be finite)", c->dampening);
    if (c->nesterov && (c->momentum <= 0.0f || c->dampening != 0.0f))
      return ampc__error(AMPC_EINVAL,
                         "sgd: nesterov momentum requires a momentum and zero dampening "
                         "(momentum %g, dampening %g)", c->momentum, c->dampening);
    if (c->amsgrad) return ampc__error(AMPC_EINVAL, "sgd: amsgrad applies to adam and adamw only");
    return AMPC_OK;
  }
  if (!nonneg(c->eps)) return ampc__error(AMPC_EINVAL, "%s: invalid epsilon value: %g (must be >= 0)", who, c->eps);
  if (!(c->beta1 >= 0.0f && c->beta1 < 1.0f))
    return ampc__error(AMPC_EINVAL, "%s: invalid beta parameter at index 0: %g (must be in [0, 1))", who, c->beta1);
  if (!(c->beta2 >= 0.0f && c->beta2 < 1.0f))
    return ampc__error(AMPC_EINVAL, "%s: invalid beta parameter at index 1: %g (must be in [0, 1))", who, c->beta2);
  if (c->momentum != 0.0f || c->dampening != 0.0f || c->nesterov)
    return ampc__error(AMPC_EINVAL, "%s: momentum, dampening and nesterov apply to sgd only", who);
  return AMPC_OK;
}

static size_t state_bytes(const ampc_optim *o) { return o->nstate * o->stride * sizeof(float); }

ampc_status ampc_optim_create(ampc_optim **out, const ampc_optim_config *c, size_t numel) {
  if (!out) return ampc__error(AMPC_EINVAL, "ampc_optim_create: out is NULL");
  *out = NULL;
  AMPC_TRY(ampc_optim_config_validate(c));
  const char *who = ampc_optim_kind_name(c->kind);
  if (numel == 0) return ampc__error(AMPC_EINVAL, "%s: empty parameter list (numel 0)", who);
  const size_t align = 16; /* floats: 64 bytes */
  if (numel > (SIZE_MAX / sizeof(float) - align) / OPTIM_MAX_STATE)
    return ampc__error(AMPC_ENOMEM, "%s: %zu parameters is too many", who, numel);
  ampc_optim *o = calloc(1, sizeof *o);
  if (!o) return ampc__error(AMPC_ENOMEM, "%s: out of memory", who);
  o->cfg = *c;
  o->numel = numel;
  o->shard_n = numel;
  o->stride = (numel + align - 1) / align * align;
  if (c->kind == AMPC_OPTIM_SGD) {
    if (c->momentum != 0.0f) o->names[o->nstate++] = "momentum_buffer";
  } else {
    o->names[o->nstate++] = "exp_avg";
    o->names[o->nstate++] = "exp_avg_sq";
    if (c->amsgrad) o->names[o->nstate++] = "max_exp_avg_sq";
  }
  ampc_status s = ampc__device_create(&o->dev, "cpu", NULL);
  if (s == 0 && o->nstate && !(o->state = ampc__dev_alloc(o->dev, state_bytes(o))))
    s = ampc__error(AMPC_ENOMEM, "%s: out of memory for %zu state values", who, o->nstate * numel);
  if (s < 0) {
    ampc_optim_free(o);
    return s;
  }
  *out = o;
  return AMPC_OK;
}

void ampc_optim_free(ampc_optim *o) {
  if (!o) return;
  if (o->dev) ampc__dev_free(o->dev, o->state);
  ampc__device_unref(o->dev);
  free(o);
}

ampc_status ampc__optim_bind(ampc_optim *o, ampc__device *d) {
  if (o->dev == d) return AMPC_OK;
  float *st = NULL;
  if (o->nstate && !o->dirty) {
    /* zeros still: made anew on d, never two copies at once (the state of
     * a large model is several times its weights) */
    size_t bytes = state_bytes(o);
    ampc__dev_free(o->dev, o->state);
    o->state = NULL;
    if (!(st = ampc__dev_alloc(d, bytes))) {
      o->state = ampc__dev_alloc(o->dev, bytes);
      return ampc__error(AMPC_ENOMEM, "%s: out of memory for its state", ampc_optim_kind_name(o->cfg.kind));
    }
  } else if (o->nstate) {
    size_t bytes = state_bytes(o);
    float *host = malloc(bytes);
    st = ampc__dev_alloc(d, bytes);
    ampc_status s = host && st ? AMPC_OK : ampc__error(AMPC_ENOMEM, "%s: out of memory for its state", ampc_optim_kind_name(o->cfg.kind));
    /* the state carries over (zeros for a new optimizer, or what was restored) */
    if (s == 0) s = ampc__dev_read(o->dev, host, AMPC_DTYPE_F32, o->state, AMPC_DTYPE_F32, bytes / sizeof(float));
    if (s == 0) s = ampc__dev_write(d, st, AMPC_DTYPE_F32, host, AMPC_DTYPE_F32, bytes / sizeof(float));
    free(host);
    if (s < 0) {
      ampc__dev_free(d, st);
      return s;
    }
    ampc__dev_free(o->dev, o->state);
  }
  ampc__device_unref(o->dev);
  o->dev = ampc__device_ref(d);
  o->state = st;
  return AMPC_OK;
}

ampc__device *ampc__optim_device(const ampc_optim *o) { return o->dev; }

ampc_status ampc__optim_shard(ampc_optim *o, size_t lo, size_t n) {
  if (o->shard_n != o->numel) return ampc__error(AMPC_ESTATE, "%s: the state is sharded already", ampc_optim_kind_name(o->cfg.kind));
  o->dirty = 1;
  if (lo > o->numel || n > o->numel - lo) return ampc__error(AMPC_ERANGE, "%s: a shard of %zu from %zu: outside [0, %zu)", ampc_optim_kind_name(o->cfg.kind), n, lo, o->numel);
  size_t stride = (n + 15) / 16 * 16;
  if (o->nstate) {
    float *st = ampc__dev_alloc(o->dev, (stride ? o->nstate * stride : 1) * sizeof(float));
    if (!st) return ampc__error(AMPC_ENOMEM, "%s: out of memory for its state", ampc_optim_kind_name(o->cfg.kind));
    for (size_t k = 0; k < o->nstate; k++) {
      ampc_status s = ampc__dev_copy(o->dev, st + k * stride, o->state + k * o->stride + lo, n * sizeof(float));
      if (s < 0) {
        ampc__dev_free(o->dev, st);
        return s;
      }
    }
    ampc__dev_free(o->dev, o->state);
    o->state = st;
  }
  o->stride = stride;
  o->shard_lo = lo;
  o->shard_n = n;
  return AMPC_OK;
}

size_t ampc__optim_state_numel(const ampc_optim *o) { return o->shard_n; }
const float *ampc__optim_state_base(const ampc_optim *o, size_t k) { return k < o->nstate ? o->state + k * o->stride : NULL; }

void ampc__optim_begin_step(ampc_optim *o, float lr, ampc__update *u) {
  const ampc_optim_config *c = &o->cfg;
  memset(u, 0, sizeof *u);
  u->kind = c->kind;
  o->dirty = 1;
  /* indexed by the flat number (device memory: only ever offset, never
   * dereferenced here) */
  for (size_t i = 0; i < o->nstate; i++) u->state[i] = (float *)((uintptr_t)(o->state + i * o->stride) - o->shard_lo * sizeof(float));
  u->gmul = 1.0f;
  ampc__optim_consts *k = &u->k;
  o->step++;
  /* torch computes these from Python floats (doubles) and the kernels round
   * them to f32; the config's f32 values are exact in double. */
  double dlr = lr, dwd = c->weight_decay;
  if (c->kind == AMPC_OPTIM_SGD) {
    k->neg_lr = (float)-dlr;
    k->weight_decay = c->weight_decay;
    k->momentum = c->momentum;
    k->one_minus_dampening = (float)(1.0 - (double)c->dampening);
    k->nesterov = c->nesterov != 0;
    k->first = o->step == 1;
    return;
  }
  /* torch's step is a float tensor read back with .item(); beta ** step is
   * Python's pow in double. */
  double t = (double)o->step;
  double bc1 = 1.0 - pow((double)c->beta1, t);
  double bc2 = 1.0 - pow((double)c->beta2, t);
  k->decoupled = c->kind == AMPC_OPTIM_ADAMW;
  k->weight_decay = k->decoupled ? 0.0f : c->weight_decay;
  k->decay = (float)(1.0 - dlr * dwd);
  k->amsgrad = c->amsgrad != 0;
  k->beta1 = c->beta1;
  k->one_minus_beta1 = (float)(1.0 - (double)c->beta1);
  k->beta2 = c->beta2;
  k->one_minus_beta2 = (float)(1.0 - (double)c->beta2);
  k->neg_step_size = (float)-(dlr / bc1);
  k->bias_correction2_sqrt = (float)sqrt(bc2);
  k->eps = c->eps;
}

ampc_status ampc_optim_step(ampc_optim *o, float *w, const float *g, float lr) {
  if (!o) return ampc__error(AMPC_EINVAL, "ampc_optim_step: optimizer is NULL");
  const char *who = ampc_optim_kind_name(o->cfg.kind);
  if (!w || !g) return ampc__error(AMPC_EINVAL, "%s: step: NULL %s", who, w ? "gradient" : "parameters");
  if (!nonneg(lr)) return ampc__error(AMPC_EINVAL, "%s: step: invalid learning rate: %g (must be finite and >= 0)", who, lr);
  if (!o->dev->be->host_memory)
    return ampc__error(AMPC_ESTATE, "%s: step on host arrays, but the state lives on backend %s (step through amp)", who,
                       o->dev->be->name);
  if (o->shard_n != o->numel) return ampc__error(AMPC_ESTATE, "%s: step on host arrays with a sharded state (step through amp)", who);
  if (o->step >= OPTIM_MAX_STEP) return ampc__error(AMPC_ERANGE, "%s: step count %lld at its limit 2^53", who, (long long)o->step);
  ampc__update u;
  ampc__optim_begin_step(o, lr, &u);
  ampc__span s = {0, o->numel, AMPC_DTYPE_F32, w, AMPC_DTYPE_F32, g};
  return o->dev->be->update(o->dev, &s, 1, &u);
}

int64_t ampc_optim_step_count(const ampc_optim *o) { return o ? o->step : 0; }

ampc_status ampc_optim_set_step_count(ampc_optim *o, int64_t step) {
  if (!o) return ampc__error(AMPC_EINVAL, "ampc_optim_set_step_count: optimizer is NULL");
  if (step > OPTIM_MAX_STEP)
    return ampc__error(AMPC_ERANGE, "%s: step count %lld is above 2^53", ampc_optim_kind_name(o->cfg.kind), (long long)step);
  if (step < 0)
    return ampc__error(AMPC_EINVAL, "%s: step count %lld is negative", ampc_optim_kind_name(o->cfg.kind),
                       (long long)step);
  o->step = step;
  return AMPC_OK;
}

size_t ampc_optim_state_count(const ampc_optim *o) { return o ? o->nstate : 0; }

const char *ampc_optim_state_name(const ampc_optim *o, size_t i) { return o && i < o->nstate ? o->names[i] : NULL; }

ampc_status ampc_optim_state_index(const ampc_optim *o, const char *name, size_t *i) {
  if (!o || !i || !name) return ampc__error(AMPC_EINVAL, "ampc_optim_state_index: %s is NULL", !o ? "optimizer" : !i ? "index" : "name");
  for (size_t k = 0; k < o->nstate; k++)
    if (name && strcmp(name, o->names[k]) == 0) {
      *i = k;
      return AMPC_OK;
    }
  return ampc__error(AMPC_ENOTFOUND, "%s: no state named '%s'", ampc_optim_kind_name(o->cfg.kind), name ? name : "");
}

static ampc_status state_range(const ampc_optim *o, size_t i, size_t offset, size_t n, float **at) {
  const char *who = ampc_optim_kind_name(o->cfg.kind);
  if (i >= o->nstate)
    return ampc__error(AMPC_ERANGE, "%s: state index %zu out of range (this optimizer keeps %zu)", who, i, o->nstate);
  if (offset > o->numel || n > o->numel - offset)
    return ampc__error(AMPC_ERANGE, "%s: %zu state elements from %zu: outside [0, %zu)", who, n, offset, o->numel);
  if (offset < o->shard_lo || offset + n > o->shard_lo + o->shard_n)
    return ampc__error(AMPC_ERANGE, "%s: state elements [%zu, %zu) outside this rank's shard [%zu, %zu)", who, offset, offset + n,
                       o->shard_lo, o->shard_lo + o->shard_n);
  *at = o->state + i * o->stride + (offset - o->shard_lo);
  return AMPC_OK;
}

ampc_status ampc_optim_state_read(const ampc_optim *o, size_t i, size_t offset, size_t n, float *dst) {
  if (!o || !dst) return ampc__error(AMPC_EINVAL, "ampc_optim_state_read: %s is NULL", o ? "dst" : "optimizer");
  float *at = NULL;
  AMPC_TRY(state_range(o, i, offset, n, &at));
  return ampc__dev_read(o->dev, dst, AMPC_DTYPE_F32, at, AMPC_DTYPE_F32, n);
}

ampc_status ampc_optim_state_write(ampc_optim *o, size_t i, size_t offset, size_t n, const float *src) {
  if (!o || !src) return ampc__error(AMPC_EINVAL, "ampc_optim_state_write: %s is NULL", o ? "src" : "optimizer");
  float *at = NULL;
  AMPC_TRY(state_range(o, i, offset, n, &at));
  o->dirty = 1;
  return ampc__dev_write(o->dev, at, AMPC_DTYPE_F32, src, AMPC_DTYPE_F32, n);
}

const ampc_optim_config *ampc_optim_get_config(const ampc_optim *o) { return o ? &o->cfg : NULL; }
size_t ampc_optim_numel(const ampc_optim *o) { return o ? o->numel : 0; }
