/* Optimizer objects: configuration, state buffers, the step and its split form. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/dtype_internal.h"
#include "core/status_internal.h"
#include "optim/optim_internal.h"

enum { OPTIM_MAX_STATE = 3 };

struct ampc_optim {
  ampc_optim_config cfg;
  size_t numel;
  int64_t step;
  ampc__optim_consts k; /* this step's constants, set by begin_step */
  const ampc__optim_kernels *kern;
  /* One allocation holding nstate buffers of numel floats, each starting on a
   * 64-byte boundary: (nstate, stride) with stride >= numel. */
  float *state;
  size_t stride, nstate;
  const char *names[OPTIM_MAX_STATE];
  float *bufs[OPTIM_MAX_STATE];
  /* Views into bufs; NULL where the configuration keeps no such state. */
  float *momentum_buffer, *exp_avg, *exp_avg_sq, *max_exp_avg_sq;
};

static const char *const kind_names[] = {
    [AMPC_OPTIM_SGD] = "sgd", [AMPC_OPTIM_ADAM] = "adam", [AMPC_OPTIM_ADAMW] = "adamw"};

const char *ampc_optim_kind_name(ampc_optim_kind kind) {
  return (unsigned)kind < sizeof kind_names / sizeof kind_names[0] ? kind_names[kind] : "?";
}

ampc_status ampc_optim_kind_parse(const char *name, ampc_optim_kind *out) {
  for (size_t i = 0; i < sizeof kind_names / sizeof kind_names[0]; i++)
    if (name && strcasecmp(name, kind_names[i]) == 0) {
      *out = (ampc_optim_kind)i;
      return AMPC_OK;
    }
  return ampc__error(AMPC_EINVAL, "optim: unknown optimizer '%s' (expected sgd, adam or adamw)",
                     name ? name : "");
}

void ampc_optim_config_default(ampc_optim_config *c, ampc_optim_kind kind) {
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

const ampc__optim_kernels *ampc__optim_kernels_best(void) {
  if (ampc__optim_kernels_avx2 && ampc__cpu_has_avx2_f16c()) return ampc__optim_kernels_avx2;
  return &ampc__optim_kernels_scalar;
}

void ampc__optim_set_kernels(ampc_optim *o, const ampc__optim_kernels *k) {
  AMPC_ASSERT(k != NULL);
  o->kern = k;
}

const ampc__optim_kernels *ampc__optim_get_kernels(const ampc_optim *o) { return o->kern; }

static float *add_state(ampc_optim *o, const char *name) {
  AMPC_ASSERT(o->nstate < OPTIM_MAX_STATE);
  float *buf = o->state + o->nstate * o->stride;
  o->names[o->nstate] = name;
  o->bufs[o->nstate] = buf;
  o->nstate++;
  return buf;
}

ampc_status ampc_optim_create(ampc_optim **out, const ampc_optim_config *c, size_t numel) {
  *out = NULL;
  AMPC_TRY(ampc_optim_config_validate(c));
  if (numel == 0) return ampc__error(AMPC_EINVAL, "%s: empty parameter list (numel 0)", ampc_optim_kind_name(c->kind));
  size_t nstate = 0;
  if (c->kind == AMPC_OPTIM_SGD)
    nstate = c->momentum != 0.0f;
  else
    nstate = 2 + (c->amsgrad != 0);
  const size_t align = 16; /* floats: 64 bytes */
  if (numel > (SIZE_MAX / sizeof(float) - align) / OPTIM_MAX_STATE)
    return ampc__error(AMPC_ENOMEM, "%s: %zu parameters is too many", ampc_optim_kind_name(c->kind), numel);
  size_t stride = (numel + align - 1) / align * align;

  ampc_optim *o = calloc(1, sizeof *o);
  if (!o) return ampc__error(AMPC_ENOMEM, "%s: out of memory", ampc_optim_kind_name(c->kind));
  o->cfg = *c;
  o->numel = numel;
  o->stride = stride;
  o->kern = ampc__optim_kernels_best();
  if (nstate) {
    size_t bytes = nstate * stride * sizeof(float);
    o->state = aligned_alloc(64, bytes);
    if (!o->state) {
      free(o);
      return ampc__error(AMPC_ENOMEM, "%s: out of memory for %zu state values",
                         ampc_optim_kind_name(c->kind), nstate * numel);
    }
    memset(o->state, 0, bytes);
  }
  if (c->kind == AMPC_OPTIM_SGD) {
    if (nstate) o->momentum_buffer = add_state(o, "momentum_buffer");
  } else {
    o->exp_avg = add_state(o, "exp_avg");
    o->exp_avg_sq = add_state(o, "exp_avg_sq");
    if (c->amsgrad) o->max_exp_avg_sq = add_state(o, "max_exp_avg_sq");
  }
  *out = o;
  return AMPC_OK;
}

void ampc_optim_free(ampc_optim *o) {
  if (!o) return;
  free(o->state);
  free(o);
}

void ampc_optim_begin_step(ampc_optim *o, float lr) {
  const ampc_optim_config *c = &o->cfg;
  ampc__optim_consts *k = &o->k;
  o->step++;
  memset(k, 0, sizeof *k);
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

/* Elements per pass: the just-updated weights are rounded into the copy
 * while they are still in L1 (4 KB of f32). */
enum { OPTIM_BLOCK = 1024 };

void ampc_optim_update_at(ampc_optim *o, size_t offset, size_t n, float *w, const float *g, float gmul,
                          ampc_dtype copy_type, void *copy) {
  AMPC_ASSERT(offset <= o->numel && n <= o->numel - offset);
  AMPC_ASSERT(!copy || copy_type == AMPC_DTYPE_F32 || copy_type == AMPC_DTYPE_F16 ||
              copy_type == AMPC_DTYPE_BF16);
  const ampc__optim_kernels *kern = o->kern;
  const ampc__optim_consts *k = &o->k;
  size_t esize = copy ? ampc_dtype_size(copy_type) : 0;
  for (size_t j = 0; j < n;) {
    size_t len = copy && n - j > OPTIM_BLOCK ? OPTIM_BLOCK : n - j;
    size_t s = offset + j; /* state index of element j */
    if (o->cfg.kind == AMPC_OPTIM_SGD)
      kern->sgd(k, len, w + j, g + j, gmul, o->momentum_buffer ? o->momentum_buffer + s : NULL);
    else
      kern->adam(k, len, w + j, g + j, gmul, o->exp_avg + s, o->exp_avg_sq + s,
                 o->max_exp_avg_sq ? o->max_exp_avg_sq + s : NULL);
    if (copy) ampc_store_f32(copy_type, (char *)copy + j * esize, w + j, len);
    j += len;
  }
}

void ampc_optim_update(ampc_optim *o, size_t offset, size_t n, float *w, const float *g, float gmul,
                       ampc_dtype copy_type, void *copy) {
  ampc_optim_update_at(o, offset, n, w + offset, g + offset, gmul, copy_type, copy);
}

/* Per OpenMP chunk in ampc_optim_step: large enough to amortise the fork. */
enum { OPTIM_PAR_CHUNK = 1 << 16 };

ampc_status ampc_optim_step(ampc_optim *o, float *w, const float *g, float lr) {
  const char *who = ampc_optim_kind_name(o->cfg.kind);
  if (!w || !g) return ampc__error(AMPC_EINVAL, "%s: step: NULL %s", who, w ? "gradient" : "parameters");
  if (!nonneg(lr)) return ampc__error(AMPC_EINVAL, "%s: step: invalid learning rate: %g (must be finite and >= 0)", who, lr);
  ampc_optim_begin_step(o, lr);
  size_t nchunks = (o->numel + OPTIM_PAR_CHUNK - 1) / OPTIM_PAR_CHUNK;
#pragma omp parallel for schedule(static) if (nchunks > 1)
  for (size_t c = 0; c < nchunks; c++) {
    size_t off = c * OPTIM_PAR_CHUNK;
    size_t len = o->numel - off < OPTIM_PAR_CHUNK ? o->numel - off : OPTIM_PAR_CHUNK;
    ampc_optim_update(o, off, len, w, g, 1.0f, AMPC_DTYPE_F32, NULL);
  }
  return AMPC_OK;
}

int64_t ampc_optim_step_count(const ampc_optim *o) { return o->step; }

ampc_status ampc_optim_set_step_count(ampc_optim *o, int64_t step) {
  if (step < 0)
    return ampc__error(AMPC_EINVAL, "%s: step count %lld is negative", ampc_optim_kind_name(o->cfg.kind),
                       (long long)step);
  o->step = step;
  return AMPC_OK;
}

size_t ampc_optim_state_count(const ampc_optim *o) { return o->nstate; }

ampc_status ampc_optim_state_get(ampc_optim *o, size_t i, const char **name, float **data) {
  if (i >= o->nstate)
    return ampc__error(AMPC_ERANGE, "%s: state index %zu out of range (this optimizer keeps %zu)",
                       ampc_optim_kind_name(o->cfg.kind), i, o->nstate);
  if (name) *name = o->names[i];
  if (data) *data = o->bufs[i];
  return AMPC_OK;
}

ampc_status ampc_optim_state_find(ampc_optim *o, const char *name, float **data) {
  for (size_t i = 0; i < o->nstate; i++)
    if (name && strcmp(name, o->names[i]) == 0) {
      if (data) *data = o->bufs[i];
      return AMPC_OK;
    }
  return ampc__error(AMPC_ENOTFOUND, "%s: no state named '%s'", ampc_optim_kind_name(o->cfg.kind),
                     name ? name : "");
}

const ampc_optim_config *ampc_optim_get_config(const ampc_optim *o) { return &o->cfg; }
size_t ampc_optim_numel(const ampc_optim *o) { return o->numel; }
