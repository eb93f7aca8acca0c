/* The graph-facing half of amp: opt-level application, master weights,
 * gradient folding, and the training step in phases. The arithmetic runs in
 * the graph's backend over the flat parameter buckets; what stays here is
 * the policy: which buffers, which multiplier, whether to step. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ampc/amp.h"
#include "core/graph_internal.h"
#include "core/status_internal.h"
#include "dist/comm_internal.h"
#include "optim/optim_internal.h"

struct ampc_amp {
  ampc_amp_config cfg;
  ampc_graph *g;
  ampc_optim *opt;
  ampc__device *dev;
  ampc_comm *comm;
  ampc_scaler *scalers;
  ampc__span spans[AMPC__MAX_BUCKETS]; /* the model's buckets: its copy and own gradients */
  int nspans;
  size_t nparams, numel;
  size_t *ranges;              /* per parameter: flat start, n (for the overflow report) */
  const char **names;          /* per parameter */
  unsigned char *flags;        /* per parameter: a non-finite gradient (filled on overflow) */
  float *master;               /* device: f32 masters, or NULL */
  float *mgrad;                /* device: f32 gradients folded from the model's, or NULL */
  float *slots;                /* device: per loss {overflow in a fold, largest folded |g|} */
  float *slots_host;           /* their copy, read with the check */
  double *reduce;              /* host: the values the ranks reduce (2 + 2 * num_losses) */
  float clip;
  float loss_weight;
  int sr;
  uint64_t sr_seed;
  float st_max;
};


/* apex's O1 lists (torch autocast's are close): matrix products in half;
 * norms, softmaxes, losses and reductions in fp32; element-wise ops promote. */
ampc_cast_policy ampc_amp_cast_policy(ampc_op_kind k) {
  switch (k) {
    case AMPC_OP_CONV2D:
    case AMPC_OP_LINEAR: return AMPC_CAST_POLICY_HALF;
    case AMPC_OP_BATCHNORM2D:
    case AMPC_OP_SOFTMAX:
    case AMPC_OP_LOG_SOFTMAX:
    case AMPC_OP_CROSS_ENTROPY:
    case AMPC_OP_GLOBAL_AVGPOOL: return AMPC_CAST_POLICY_FP32;
    case AMPC_OP_ADD: return AMPC_CAST_POLICY_PROMOTE;
    default: return AMPC_CAST_POLICY_KEEP;
  }
}

/* The masters start from the recorded f32 values, not their half copy (from
 * the model itself when those were released already). */
static ampc_status init_masters(ampc_amp *a) {
  ampc_graph *g = a->g;
  float *tmp = NULL;
  ampc_status s = AMPC_OK;
  for (size_t i = 0; i < a->nparams && s == 0; i++) {
    ampc_value v = ampc_graph_param_at(g, i);
    size_t off = a->ranges[2 * i], n = a->ranges[2 * i + 1];
    const float *w0 = ampc_graph_param_init(g, v);
    if (!w0) {
      float *t = realloc(tmp, n * sizeof *t);
      if (!t) {
        s = ampc__error(AMPC_ENOMEM, "amp: out of memory");
        break;
      }
      tmp = t;
      s = ampc_graph_read(g, v, tmp, AMPC_DTYPE_F32);
      w0 = tmp;
    }
    if (s == 0) s = ampc__dev_write(a->dev, a->master + off, AMPC_DTYPE_F32, w0, AMPC_DTYPE_F32, n);
  }
  free(tmp);
  return s;
}

ampc_status ampc_amp_initialize(ampc_amp **out, ampc_graph *g, ampc_optim *opt, const ampc_amp_config *cfg) {
  *out = NULL;
  AMPC_TRY(ampc_amp_config_validate(cfg));
  if (ampc_graph_is_compiled(g))
    return ampc__error(AMPC_ESTATE, "amp: initialize the graph before it is compiled (the opt level decides its storage types)");
  ampc_graph_precision p = {
      .param_type = cfg->cast_model_type,
      .norm_param_type = ampc_amp_config_batchnorm_type(cfg),
      .act_type = cfg->cast_model_type,
      .autocast = cfg->autocast,
      .half_type = cfg->half_type,
      .policy = ampc_amp_cast_policy,
  };
  size_t numel = ampc_graph_param_numel(g);
  if (opt && ampc_optim_numel(opt) != numel)
    return ampc__error(AMPC_EINVAL, "amp: optimizer holds %zu values, the model has %zu parameters", ampc_optim_numel(opt), numel);
  AMPC_TRY(ampc_graph_set_precision(g, &p));
  AMPC_TRY(ampc_graph_compile(g));

  ampc_amp *a = calloc(1, sizeof *a);
  if (!a) return ampc__error(AMPC_ENOMEM, "amp: out of memory");
  a->cfg = *cfg;
  a->g = g;
  a->opt = opt;
  a->numel = numel;
  a->dev = ampc__device_ref(ampc__graph_device(g));
  a->nspans = ampc__graph_spans(g, a->spans);
  a->nparams = ampc_graph_param_count(g);
  size_t np = a->nparams ? a->nparams : 1, nl = (size_t)cfg->num_losses;
  a->ranges = calloc(2 * np, sizeof *a->ranges);
  a->names = calloc(np, sizeof *a->names);
  a->flags = calloc(np, 1);
  a->scalers = calloc(nl, sizeof *a->scalers);
  a->slots_host = calloc(2 * nl, sizeof *a->slots_host);
  a->reduce = calloc(2 + 2 * nl, sizeof *a->reduce);
  a->slots = ampc__dev_alloc(a->dev, 2 * nl * sizeof(float));
  int bad = !a->ranges || !a->names || !a->flags || !a->scalers || !a->slots_host || !a->reduce || !a->slots;
  for (size_t i = 0; !bad && i < a->nparams; i++) {
    ampc_value v = ampc_graph_param_at(g, i);
    ampc_tensor t = ampc_graph_tensor(g, v);
    a->ranges[2 * i] = ampc_graph_param_offset(g, v);
    a->ranges[2 * i + 1] = (size_t)ampc_tensor_numel(&t);
    a->names[i] = ampc_graph_name(g, v);
  }
  if (!bad && ampc_amp_config_uses_master_weights(cfg)) bad = !(a->master = ampc__dev_alloc(a->dev, numel * sizeof(float)));
  /* f32 gradients to fold into: needed with several losses (each unscaled by
   * its own scale); with master weights only once backward accumulates
   * (allocated then, see ampc_amp_backward) -- a single backward per step is
   * read straight from the model's gradients, converted as the step goes */
  if (!bad && cfg->num_losses > 1) bad = !(a->mgrad = ampc__dev_alloc(a->dev, numel * sizeof(float)));
  if (bad) {
    ampc_amp_free(a);
    return ampc__error(AMPC_ENOMEM, "amp: out of memory for %zu parameters", numel);
  }
  ampc_status s = a->master ? init_masters(a) : AMPC_OK;
  if (s == 0 && opt) s = ampc__optim_bind(opt, a->dev);
  if (s < 0) {
    ampc_amp_free(a);
    return s;
  }
  /* the graph holds its parameters now (and the masters their f32 values) */
  ampc_graph_release_init(g);
  for (int k = 0; k < cfg->num_losses; k++) ampc_scaler_init(&a->scalers[k], cfg);
  a->loss_weight = 1.0f;
  *out = a;
  return AMPC_OK;
}

void ampc_amp_free(ampc_amp *a) {
  if (!a) return;
  if (a->dev) {
    ampc__dev_free(a->dev, a->master);
    ampc__dev_free(a->dev, a->mgrad);
    ampc__dev_free(a->dev, a->slots);
    ampc__device_unref(a->dev);
  }
  free(a->ranges);
  free(a->names);
  free(a->flags);
  free(a->scalers);
  free(a->slots_host);
  free(a->reduce);
  free(a);
}

const ampc_amp_config *ampc_amp_get_config(const ampc_amp *a) { return &a->cfg; }
ampc_scaler *ampc_amp_scaler(ampc_amp *a, int loss_id) {
  return loss_id >= 0 && loss_id < a->cfg.num_losses ? &a->scalers[loss_id] : NULL;
}
int ampc_amp_has_master_weights(const ampc_amp *a) { return a->master != NULL; }
void ampc_amp_set_clip_grad_norm(ampc_amp *a, float max_norm) { a->clip = max_norm; }
void ampc_amp_set_loss_weight(ampc_amp *a, float w) { a->loss_weight = w; }
void ampc_amp_set_stochastic_rounding(ampc_amp *a, int on, uint64_t seed) {
  a->sr = on;
  a->sr_seed = seed;
}
void ampc_amp_set_comm(ampc_amp *a, ampc_comm *c) { a->comm = c; }

ampc_status ampc_amp_forward(ampc_amp *a, int training) { return ampc_graph_forward(a->g, training); }

/* The gradients the step reads: the f32 ones folded into, or the model's. */
static int grad_spans(const ampc_amp *a, ampc__span *out) {
  if (!a->mgrad) {
    memcpy(out, a->spans, (size_t)a->nspans * sizeof *out);
    return a->nspans;
  }
  for (int i = 0; i < a->nspans; i++) {
    out[i] = a->spans[i];
    out[i].grad_type = AMPC_DTYPE_F32;
    out[i].grad = a->mgrad + a->spans[i].start;
  }
  return a->nspans;
}

/* mgrad (+)= f * the model's gradients, noting an overflow and the largest
 * magnitude in the loss's slot. */
static ampc_status fold(ampc_amp *a, float f, int accumulate, int loss_id, float scale) {
  return a->dev->be->fold(a->dev, a->spans, a->nspans, a->mgrad, f, accumulate, a->slots + 2 * loss_id, scale);
}

ampc_status ampc_amp_backward(ampc_amp *a, ampc_value loss, int loss_id, int accumulate) {
  if (loss_id < 0 || loss_id >= a->cfg.num_losses)
    return ampc__error(AMPC_EINVAL, "amp: loss id %d outside 0..%d (num_losses=%d)", loss_id, a->cfg.num_losses - 1, a->cfg.num_losses);
  float scale = ampc_scaler_scale(&a->scalers[loss_id]);
  if (!a->mgrad && accumulate && a->master) {
    /* the first accumulating backward: from now on gradients add up in f32,
     * starting from the ones the model holds */
    a->mgrad = ampc__dev_alloc(a->dev, (a->numel ? a->numel : 1) * sizeof(float));
    if (!a->mgrad) return ampc__error(AMPC_ENOMEM, "amp: out of memory for %zu f32 gradients", a->numel);
    AMPC_TRY(fold(a, 1.0f, 0, loss_id, scale));
  }
  if (!a->mgrad) return ampc_graph_backward(a->g, loss, scale * a->loss_weight, accumulate);
  /* backward writes only the parameters this loss reaches: the others must
   * read zero, not the previous backward's gradient, when they are folded */
  AMPC_TRY(ampc_graph_zero_grad(a->g));
  AMPC_TRY(ampc_graph_backward(a->g, loss, scale * a->loss_weight, 0));
  /* Fold the model's gradients into the f32 ones. With several losses each is
   * unscaled by its own scale now; with one, the unscale waits for step(). */
  return fold(a, a->cfg.num_losses > 1 ? 1.0f / scale : 1.0f, accumulate, loss_id, scale);
}

/* What the step multiplies the gradients by to unscale them: with several
 * losses each was unscaled as it was folded; with one, it happens here. */
static float step_unscale(const ampc_amp *a) {
  return a->mgrad && a->cfg.num_losses > 1 ? 1.0f : ampc_scaler_inv_scale(&a->scalers[0]);
}

ampc_status ampc_amp_unscaled_grads(ampc_amp *a, float *out, int *found_inf) {
  ampc__span s[AMPC__MAX_BUCKETS];
  int ns = grad_spans(a, s);
  float gmul = step_unscale(a);
  int bad = 0;
  for (int i = 0; i < ns; i++) {
    float *dst = out + s[i].start;
    AMPC_TRY(ampc__dev_read(a->dev, dst, AMPC_DTYPE_F32, s[i].grad, s[i].grad_type, s[i].n));
    for (size_t e = 0; e < s[i].n; e++) {
      dst[e] *= gmul;
      if (!isfinite(dst[e])) bad = 1;
    }
  }
  if (found_inf) *found_inf = bad;
  return AMPC_OK;
}

static ampc_status clear_grads(ampc_amp *a) {
  AMPC_TRY(ampc_graph_zero_grad(a->g));
  if (a->mgrad) AMPC_TRY(ampc__dev_set(a->dev, a->mgrad, 0, a->numel * sizeof(float)));
  return ampc__dev_set(a->dev, a->slots, 0, 2 * (size_t)a->cfg.num_losses * sizeof(float));
}

/* This rank's share of spans s for the check: flat elements [lo, hi). */
static int clip_spans(const ampc__span *s, int ns, size_t lo, size_t hi, ampc__span *out) {
  int k = 0;
  for (int i = 0; i < ns; i++) {
    size_t a = s[i].start > lo ? s[i].start : lo, b = s[i].start + s[i].n < hi ? s[i].start + s[i].n : hi;
    if (a >= b) continue;
    size_t skip = a - s[i].start;
    out[k] = s[i];
    out[k].start = a;
    out[k].n = b - a;
    if (out[k].model) out[k].model = (char *)out[k].model + skip * ampc_dtype_size(s[i].type);
    out[k].grad = (const char *)out[k].grad + skip * ampc_dtype_size(s[i].grad_type);
    k++;
  }
  return k;
}

/* Phases 1-3 of the step (see ampc/comm.h): the gradients all-reduced, the
 * check over this rank's share, the overflow flags and the norm reduced. */
static ampc_status check_phase(ampc_amp *a, const ampc__span *s, int ns, float gmul, ampc__check *chk) {
  /* the largest magnitude for the grad stats: here, or (with f32 gradients)
   * as they were folded */
  int nl = a->cfg.num_losses, want_max = !a->mgrad;
  ampc__span share[AMPC__MAX_BUCKETS];
  int nshare = ns;
  const ampc__span *cs = s;
  if (a->comm && a->comm->size > 1) {
    for (int i = 0; i < ns; i++)
      AMPC_TRY(a->comm->ops->allreduce(a->comm, a->dev, (void *)s[i].grad, s[i].grad_type, s[i].n, AMPC__REDUCE_AVG));
    size_t per = (a->numel + (size_t)a->comm->size - 1) / (size_t)a->comm->size, lo = per * (size_t)a->comm->rank;
    nshare = clip_spans(s, ns, lo < a->numel ? lo : a->numel, lo + per < a->numel ? lo + per : a->numel, share);
    cs = share;
  }
  AMPC_TRY(a->dev->be->check(a->dev, cs, nshare, gmul, want_max, a->slots, 2 * nl, a->slots_host, chk));
  a->dev->reads++;
  if (a->comm && a->comm->size > 1) {
    double *m = a->reduce;
    m[0] = chk->found_inf;
    m[1] = chk->max_abs;
    for (int k = 0; k < 2 * nl; k++) m[2 + k] = a->slots_host[k];
    AMPC_TRY(a->comm->ops->allreduce_host(a->comm, m, 2 + 2 * (size_t)nl, AMPC__REDUCE_MAX));
    chk->found_inf = m[0] != 0.0;
    chk->max_abs = (float)m[1];
    for (int k = 0; k < 2 * nl; k++) a->slots_host[k] = (float)m[2 + k];
    AMPC_TRY(a->comm->ops->allreduce_host(a->comm, &chk->sumsq, 1, AMPC__REDUCE_SUM));
  }
  return AMPC_OK;
}

ampc_status ampc_amp_step(ampc_amp *a, float lr, ampc_amp_step_info *info) {
  ampc_amp_step_info local;
  if (!info) info = &local;
  memset(info, 0, sizeof *info);
  if (!a->opt) return ampc__error(AMPC_ESTATE, "amp: step without an optimizer");
  if (!(lr >= 0.0f) || !isfinite(lr)) return ampc__error(AMPC_EINVAL, "amp: learning rate %g", lr);
  ampc__span s[AMPC__MAX_BUCKETS];
  int ns = grad_spans(a, s);
  float unscale = step_unscale(a);
  ampc__check chk;
  AMPC_TRY(check_phase(a, s, ns, unscale, &chk));
  int nl = a->cfg.num_losses, found = chk.found_inf, flagged = 0;
  for (int k = 0; k < nl; k++) {
    found |= a->slots_host[2 * k] != 0.0f;
    flagged |= a->slots_host[2 * k] != 0.0f;
    if (a->slots_host[2 * k + 1] > a->st_max) a->st_max = a->slots_host[2 * k + 1];
  }
  if (isfinite(chk.max_abs) && chk.max_abs > a->st_max) a->st_max = chk.max_abs;
  info->found_inf = found;
  if (found) {
    /* which parameters overflowed: a second pass, on skipped steps only */
    AMPC_TRY(a->dev->be->nonfinite(a->dev, s, ns, a->ranges, a->nparams, unscale, a->flags));
    a->dev->reads++;
    for (size_t i = 0; i < a->nparams; i++)
      if (a->flags[i]) {
        if (info->n_nonfinite < AMPC_AMP_MAX_REPORTED) info->nonfinite[info->n_nonfinite] = a->names[i];
        info->n_nonfinite++;
      }
  }
  /* phase 4: the scalers. Each loss's backs off for its own overflow; an
   * overflow no loss owns (the folded sum itself) backs all of them off */
  int apply = !found;
  for (int k = 0; k < nl; k++) {
    int inf_k = nl > 1 ? (a->slots_host[2 * k] != 0.0f || (found && !flagged)) : found;
    if (!ampc_scaler_update(&a->scalers[k], inf_k)) apply = 0;
  }
  info->scale = ampc_scaler_scale(&a->scalers[0]);
  info->clip_coef = ampc_clip_coef(found ? INFINITY : chk.sumsq, a->clip, &info->grad_norm);
  if (apply) {
    /* phase 5: the optimizer on the masters (writing the model copy) or on
     * the model itself */
    ampc__update u;
    int64_t step_no = ampc_optim_step_count(a->opt);
    ampc__optim_begin_step(a->opt, lr, &u);
    u.master = a->master;
    u.gmul = unscale * info->clip_coef;
    u.sr = a->sr && !a->master;
    u.sr_seed = a->sr_seed;
    u.sr_base = (uint64_t)step_no * a->numel;
    AMPC_TRY(a->dev->be->update(a->dev, s, ns, &u));
    info->applied = 1;
  }
  return clear_grads(a);
}

/* ---- values in and out ---- */

ampc_status ampc_amp_param_values(ampc_amp *a, float *out) {
  if (a->master) return ampc__dev_read(a->dev, out, AMPC_DTYPE_F32, a->master, AMPC_DTYPE_F32, a->numel);
  for (int i = 0; i < a->nspans; i++)
    AMPC_TRY(ampc__dev_read(a->dev, out + a->spans[i].start, AMPC_DTYPE_F32, a->spans[i].model, a->spans[i].type, a->spans[i].n));
  return AMPC_OK;
}

ampc_status ampc_amp_load_params(ampc_amp *a, const float *values) {
  for (int i = 0; i < a->nspans; i++)
    AMPC_TRY(ampc__dev_write(a->dev, a->spans[i].model, a->spans[i].type, values + a->spans[i].start, AMPC_DTYPE_F32, a->spans[i].n));
  if (a->master) AMPC_TRY(ampc__dev_write(a->dev, a->master, AMPC_DTYPE_F32, values, AMPC_DTYPE_F32, a->numel));
  return AMPC_OK;
}

/* The flat range of the parameter called name, checked against n. */
static ampc_status param_range(const ampc_amp *a, const char *name, size_t n, size_t *off) {
  for (size_t i = 0; i < a->nparams; i++)
    if (name && strcmp(a->names[i], name) == 0) {
      if (n != a->ranges[2 * i + 1])
        return ampc__error(AMPC_EINVAL, "amp: parameter '%s' has %zu values, not %zu", name, a->ranges[2 * i + 1], n);
      *off = a->ranges[2 * i];
      return AMPC_OK;
    }
  return ampc__error(AMPC_ENOTFOUND, "amp: no parameter named '%s'", name ? name : "");
}

static ampc_status master_range(const ampc_amp *a, const char *name, size_t n, size_t *off) {
  if (!a->master) return ampc__error(AMPC_ESTATE, "amp: no master weights at %s", ampc_opt_level_name(a->cfg.opt_level));
  return param_range(a, name, n, off);
}

ampc_status ampc_amp_read_master(const ampc_amp *a, const char *name, float *dst, size_t n) {
  size_t off;
  AMPC_TRY(master_range(a, name, n, &off));
  return ampc__dev_read(a->dev, dst, AMPC_DTYPE_F32, a->master + off, AMPC_DTYPE_F32, n);
}

ampc_status ampc_amp_write_master(ampc_amp *a, const char *name, const float *src, size_t n) {
  size_t off;
  AMPC_TRY(master_range(a, name, n, &off));
  return ampc__dev_write(a->dev, a->master + off, AMPC_DTYPE_F32, src, AMPC_DTYPE_F32, n);
}

static ampc_status state_at(const ampc_amp *a, const char *state, const char *name, size_t n, size_t *k, size_t *off) {
  if (!a->opt) return ampc__error(AMPC_ESTATE, "amp: no optimizer");
  AMPC_TRY(ampc_optim_state_index(a->opt, state, k));
  return param_range(a, name, n, off);
}

ampc_status ampc_amp_read_optim_state(const ampc_amp *a, const char *state, const char *name, float *dst, size_t n) {
  size_t k, off;
  AMPC_TRY(state_at(a, state, name, n, &k, &off));
  return ampc_optim_state_read(a->opt, k, off, n, dst);
}

ampc_status ampc_amp_write_optim_state(ampc_amp *a, const char *state, const char *name, const float *src, size_t n) {
  size_t k, off;
  AMPC_TRY(state_at(a, state, name, n, &k, &off));
  return ampc_optim_state_write(a->opt, k, off, n, src);
}

/* ---- statistics and memory ---- */

void ampc_amp_set_grad_stats(ampc_amp *a, int on) { ampc__graph_count_underflow(a->g, on); }

void ampc_amp_get_grad_stats(ampc_amp *a, ampc_amp_grad_stats *st, int reset) {
  /* the underflow count comes from the kernels, which see each weight gradient
   * in f32 before it is rounded to its storage type */
  ampc_backend_stats bs;
  a->dev->be->stats(a->dev, &bs, reset ? AMPC__STATS_GRADS : 0);
  st->values = bs.grad_values;
  st->underflow = bs.grad_underflow;
  st->max_abs = a->st_max;
  if (reset) a->st_max = 0.0f;
}

void ampc_amp_memory(const ampc_amp *a, ampc_mem_report *r) {
  ampc_graph_memory(a->g, r);
  if (a->master) r->bytes[AMPC_MEM_MASTER_WEIGHTS][AMPC_DTYPE_F32] += a->numel * sizeof(float);
  if (a->mgrad) r->bytes[AMPC_MEM_GRADIENTS][AMPC_DTYPE_F32] += a->numel * sizeof(float);
  if (a->opt) r->bytes[AMPC_MEM_OPTIMIZER_STATE][AMPC_DTYPE_F32] += ampc_optim_state_count(a->opt) * a->numel * sizeof(float);
}
