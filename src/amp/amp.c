/* The graph-facing half of amp: opt-level application, master weights,
 * gradient folding and the fused unscale/check/step pass. */
#include <float.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "ampc/amp.h"
#include "ampc/rng.h"
#include "core/status_internal.h"

enum { AMP_CHUNK = 8192 }; /* elements per unit of work in the fused passes */

typedef struct {
  ampc_value v;
  const char *name;
  size_t off, n;
  ampc_dtype dtype;
  void *data, *grad;
} amp_param;

typedef struct {
  int p;
  size_t start, n;
} amp_chunk;

struct ampc_amp {
  ampc_amp_config cfg;
  ampc_graph *g;
  ampc_optim *opt;
  ampc_scaler *scalers;
  int *loss_inf;               /* per loss: an inf/NaN was folded since the last step */
  amp_param *params;
  size_t nparams, numel;
  amp_chunk *chunks;
  size_t nchunks;
  float *master;               /* f32 masters, or NULL */
  float *mgrad;                /* f32 gradients folded from the model's, or NULL */
  unsigned char *param_inf;    /* per param: non-finite gradient this step */
  float *scratch;              /* per thread: 2 * AMP_CHUNK floats */
  double *partial;             /* per chunk: sum of squares */
  int nthreads;
  float clip;
  float loss_weight;
  int sr;
  uint64_t sr_seed;
  float st_max;
};

static int is_half(ampc_dtype t) { return t == AMPC_DTYPE_F16 || t == AMPC_DTYPE_BF16; }


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
  a->nthreads = omp_get_max_threads();
  a->nparams = ampc_graph_param_count(g);
  a->params = calloc(a->nparams ? a->nparams : 1, sizeof *a->params);
  a->param_inf = calloc(a->nparams ? a->nparams : 1, 1);
  a->scalers = calloc((size_t)cfg->num_losses, sizeof *a->scalers);
  a->loss_inf = calloc((size_t)cfg->num_losses, sizeof *a->loss_inf);
  size_t nch = 0;
  for (size_t i = 0; i < a->nparams; i++) {
    ampc_value v = ampc_graph_param_at(g, i);
    ampc_tensor t = ampc_graph_tensor(g, v), gr = ampc_graph_grad(g, v);
    a->params[i] = (amp_param){v, ampc_graph_name(g, v), ampc_graph_param_offset(g, v), (size_t)ampc_tensor_numel(&t), t.dtype, t.data, gr.data};
    nch += (a->params[i].n + AMP_CHUNK - 1) / AMP_CHUNK;
  }
  a->chunks = calloc(nch ? nch : 1, sizeof *a->chunks);
  a->partial = calloc(nch ? nch : 1, sizeof *a->partial);
  a->scratch = malloc((size_t)a->nthreads * 2 * AMP_CHUNK * sizeof(float));
  int bad = !a->params || !a->param_inf || !a->scalers || !a->loss_inf || !a->chunks || !a->partial || !a->scratch;
  if (!bad && ampc_amp_config_uses_master_weights(cfg)) {
    a->master = malloc((numel ? numel : 1) * sizeof(float));
    bad = !a->master;
  }
  /* f32 gradients to fold into: needed with several losses (each unscaled by
   * its own scale); with master weights only once backward accumulates
   * (allocated then, see ampc_amp_backward) -- a single backward per step is
   * read straight from the model's gradients, converted as the step goes */
  if (!bad && cfg->num_losses > 1) {
    a->mgrad = calloc(numel ? numel : 1, sizeof(float));
    bad = !a->mgrad;
  }
  if (bad) {
    ampc_amp_free(a);
    return ampc__error(AMPC_ENOMEM, "amp: out of memory for %zu parameters", numel);
  }
  for (size_t i = 0; i < a->nparams; i++)
    for (size_t s = 0; s < a->params[i].n; s += AMP_CHUNK)
      a->chunks[a->nchunks++] = (amp_chunk){(int)i, s, a->params[i].n - s < AMP_CHUNK ? a->params[i].n - s : AMP_CHUNK};
  if (a->master)
    for (size_t i = 0; i < a->nparams; i++) {
      /* the masters start from the recorded f32 values, not their half copy
       * (from the model itself when those were released already) */
      const amp_param *p = &a->params[i];
      const float *w0 = ampc_graph_param_init(g, p->v);
      if (w0) memcpy(a->master + p->off, w0, p->n * sizeof(float));
      else ampc_load_f32(a->master + p->off, p->dtype, p->data, p->n);
    }
  /* the graph holds its parameters now (and the masters their f32 values) */
  ampc_graph_release_init(g);
  for (int k = 0; k < cfg->num_losses; k++) ampc_scaler_init(&a->scalers[k], cfg);
  a->sr_seed = 0;
  a->loss_weight = 1.0f;
  *out = a;
  return AMPC_OK;
}

void ampc_amp_free(ampc_amp *a) {
  if (!a) return;
  free(a->params);
  free(a->param_inf);
  free(a->scalers);
  free(a->loss_inf);
  free(a->chunks);
  free(a->partial);
  free(a->scratch);
  free(a->master);
  free(a->mgrad);
  free(a);
}

const ampc_amp_config *ampc_amp_get_config(const ampc_amp *a) { return &a->cfg; }
ampc_scaler *ampc_amp_scaler(ampc_amp *a, int loss_id) {
  return loss_id >= 0 && loss_id < a->cfg.num_losses ? &a->scalers[loss_id] : NULL;
}
float *ampc_amp_master_weights(ampc_amp *a) { return a->master; }
void ampc_amp_set_clip_grad_norm(ampc_amp *a, float max_norm) { a->clip = max_norm; }
void ampc_amp_set_loss_weight(ampc_amp *a, float w) { a->loss_weight = w; }
void ampc_amp_set_stochastic_rounding(ampc_amp *a, int on, uint64_t seed) {
  a->sr = on;
  a->sr_seed = seed;
}

ampc_status ampc_amp_forward(ampc_amp *a, int training) { return ampc_graph_forward(a->g, training); }

static float *thread_scratch(ampc_amp *a) { return a->scratch + (size_t)omp_get_thread_num() * 2 * AMP_CHUNK; }

/* The f32 view of a chunk of a parameter's model gradient. */
static const float *grad_chunk(ampc_amp *a, const amp_param *p, const amp_chunk *c, float *tmp) {
  if (p->dtype == AMPC_DTYPE_F32) return (const float *)p->grad + c->start;
  ampc_load_f32(tmp, p->dtype, (char *)p->grad + c->start * ampc_dtype_size(p->dtype), c->n);
  return tmp;
}

static void fold(ampc_amp *a, float f, int accumulate, int loss_id, float scale);

ampc_status ampc_amp_backward(ampc_amp *a, ampc_value loss, int loss_id, int accumulate) {
  if (loss_id < 0 || loss_id >= a->cfg.num_losses)
    return ampc__error(AMPC_EINVAL, "amp: loss id %d outside 0..%d (num_losses=%d)", loss_id, a->cfg.num_losses - 1, a->cfg.num_losses);
  float scale = ampc_scaler_scale(&a->scalers[loss_id]);
  if (!a->mgrad && accumulate && a->master) {
    /* the first accumulating backward: from now on gradients add up in f32,
     * starting from the ones the model holds */
    a->mgrad = calloc(a->numel ? a->numel : 1, sizeof(float));
    if (!a->mgrad) return ampc__error(AMPC_ENOMEM, "amp: out of memory for %zu f32 gradients", a->numel);
    fold(a, 1.0f, 0, loss_id, scale);
  }
  if (!a->mgrad) return ampc_graph_backward(a->g, loss, scale * a->loss_weight, accumulate);
  /* backward writes only the parameters this loss reaches: the others must
   * read zero, not the previous backward's gradient, when they are folded */
  ampc_graph_zero_grad(a->g);
  AMPC_TRY(ampc_graph_backward(a->g, loss, scale * a->loss_weight, 0));
  /* Fold the model's gradients into the f32 ones. With several losses each is
   * unscaled by its own scale now; with one, the unscale waits for step(). */
  fold(a, a->cfg.num_losses > 1 ? 1.0f / scale : 1.0f, accumulate, loss_id, scale);
  return AMPC_OK;
}

/* mgrad (+)= f * the model's gradients, noting non-finite values and the
 * largest magnitude. */
static void fold(ampc_amp *a, float f, int accumulate, int loss_id, float scale) {
  int any_inf = 0;
  float mx = 0.0f;
#pragma omp parallel for schedule(static) reduction(| : any_inf) reduction(max : mx)
  for (size_t ci = 0; ci < a->nchunks; ci++) {
    const amp_chunk *c = &a->chunks[ci];
    const amp_param *p = &a->params[c->p];
    const float *gsrc = grad_chunk(a, p, c, thread_scratch(a));
    float *dst = a->mgrad + p->off + c->start;
    int bad = 0;
    for (size_t i = 0; i < c->n; i++) {
      float v = gsrc[i];
      if (!isfinite(v)) bad = 1;
      float m = fabsf(v);
      if (m > mx) mx = m;
      dst[i] = accumulate ? dst[i] + v * f : v * f;
    }
    if (bad) {
      a->param_inf[c->p] = 1;
      any_inf = 1;
    }
  }
  if (any_inf) a->loss_inf[loss_id] = 1;
  if (isfinite(mx) && mx / scale > a->st_max) a->st_max = mx / scale;
}

/* Rounds w to a 16-bit type stochastically: up with probability equal to the
 * distance from the value below, from a counter-based stream. */
static uint16_t round_stochastic(ampc_dtype t, float w, uint64_t r) {
  uint16_t near = t == AMPC_DTYPE_F16 ? ampc_f32_to_f16(w) : ampc_f32_to_bf16(w);
  float nv = t == AMPC_DTYPE_F16 ? ampc_f16_to_f32(near) : ampc_bf16_to_f32(near);
  if (nv == w || !isfinite(w) || !isfinite(nv)) return near;
  /* the neighbour on the other side of w, by stepping the magnitude */
  uint16_t other = fabsf(nv) > fabsf(w) ? (uint16_t)(near - 1) : (uint16_t)(near + 1);
  if ((near & 0x7fff) == 0) other = (uint16_t)((w < 0 ? 0x8000u : 0u) | 1u);
  float ov = t == AMPC_DTYPE_F16 ? ampc_f16_to_f32(other) : ampc_bf16_to_f32(other);
  if (!isfinite(ov)) return near;
  float lo = fabsf(nv) < fabsf(ov) ? nv : ov, hi = lo == nv ? ov : nv;
  uint16_t lo_b = lo == nv ? near : other, hi_b = lo == nv ? other : near;
  float pr = (fabsf(w) - fabsf(lo)) / (fabsf(hi) - fabsf(lo)); /* chance of the larger magnitude */
  float u = (float)(r >> 40) * (1.0f / 16777216.0f);
  return u < pr ? hi_b : lo_b;
}

/* Pass 1: finiteness, sum of squares of the unscaled gradients, and (without
 * folding) the statistics. Returns found_inf. */
static int check_pass(ampc_amp *a, float gmul, double *sumsq, int with_stats) {
  int any_inf = 0;
  float mx = 0.0f;
#pragma omp parallel for schedule(static) reduction(| : any_inf) reduction(max : mx)
  for (size_t ci = 0; ci < a->nchunks; ci++) {
    const amp_chunk *c = &a->chunks[ci];
    const amp_param *p = &a->params[c->p];
    const float *gv = a->mgrad ? a->mgrad + p->off + c->start : grad_chunk(a, p, c, thread_scratch(a));
    /* four partial sums (element i into sum i % 4, added in order at the
     * end) and no branches, so that the pass pipelines */
    double s4[4] = {0.0, 0.0, 0.0, 0.0};
    float m4[4] = {0.0f, 0.0f, 0.0f, 0.0f}; /* the largest |v| (a NaN never wins) */
    int bad = 0;
    size_t i = 0;
    for (; i + 4 <= c->n; i += 4)
      for (int k = 0; k < 4; k++) {
        float v = gv[i + k] * gmul, m = fabsf(v);
        bad |= !(m <= FLT_MAX);
        s4[k] += (double)v * v;
        m4[k] = m > m4[k] ? m : m4[k];
      }
    for (; i < c->n; i++) {
      float v = gv[i] * gmul, m = fabsf(v);
      bad |= !(m <= FLT_MAX);
      s4[0] += (double)v * v;
      m4[0] = m > m4[0] ? m : m4[0];
    }
    for (int k = 0; k < 4 && with_stats; k++) mx = m4[k] > mx ? m4[k] : mx;
    a->partial[ci] = (s4[0] + s4[1]) + (s4[2] + s4[3]);
    if (bad) {
      a->param_inf[c->p] = 1;
      any_inf = 1;
    }
  }
  double t = 0.0;
  for (size_t ci = 0; ci < a->nchunks; ci++) t += a->partial[ci]; /* fixed order */
  *sumsq = t;
  if (with_stats && isfinite(mx) && mx > a->st_max) a->st_max = mx;
  return any_inf;
}

/* What the step multiplies the gradients by to unscale them: with several
 * losses each was unscaled as it was folded; with one, it happens here. */
static float step_unscale(const ampc_amp *a) {
  return a->mgrad && a->cfg.num_losses > 1 ? 1.0f : ampc_scaler_inv_scale(&a->scalers[0]);
}

int ampc_amp_unscaled_grads(ampc_amp *a, float *out) {
  float gmul = step_unscale(a);
  int bad = 0;
  for (size_t ci = 0; ci < a->nchunks; ci++) {
    const amp_chunk *c = &a->chunks[ci];
    const amp_param *p = &a->params[c->p];
    float *dst = out + p->off + c->start;
    const float *gv = a->mgrad ? a->mgrad + p->off + c->start : grad_chunk(a, p, c, dst);
    for (size_t i = 0; i < c->n; i++) {
      dst[i] = gv[i] * gmul;
      if (!isfinite(dst[i])) bad = 1;
    }
  }
  return bad;
}

static void clear_grads(ampc_amp *a) {
  ampc_graph_zero_grad(a->g);
  if (a->mgrad) memset(a->mgrad, 0, a->numel * sizeof(float));
  memset(a->param_inf, 0, a->nparams);
  for (int k = 0; k < a->cfg.num_losses; k++) a->loss_inf[k] = 0;
}

ampc_status ampc_amp_step(ampc_amp *a, float lr, ampc_amp_step_info *info) {
  ampc_amp_step_info local;
  if (!info) info = &local;
  memset(info, 0, sizeof *info);
  if (!a->opt) return ampc__error(AMPC_ESTATE, "amp: step without an optimizer");
  if (!(lr >= 0.0f) || !isfinite(lr)) return ampc__error(AMPC_EINVAL, "amp: learning rate %g", lr);
  float unscale = step_unscale(a);
  double sumsq = 0.0;
  int found = check_pass(a, unscale, &sumsq, a->mgrad == NULL);
  for (int k = 0; k < a->cfg.num_losses; k++) found |= a->loss_inf[k];
  info->found_inf = found;
  for (size_t i = 0; i < a->nparams; i++)
    if (a->param_inf[i]) {
      if (info->n_nonfinite < AMPC_AMP_MAX_REPORTED) info->nonfinite[info->n_nonfinite] = a->params[i].name;
      info->n_nonfinite++;
    }
  int apply = 1, flagged = 0;
  for (int k = 0; k < a->cfg.num_losses; k++) flagged |= a->loss_inf[k];
  for (int k = 0; k < a->cfg.num_losses; k++) {
    /* each loss's scaler backs off for its own overflow; an overflow no loss
     * owns (the folded sum itself) backs all of them off */
    int inf_k = a->cfg.num_losses > 1 ? (a->loss_inf[k] || (found && !flagged)) : found;
    if (!ampc_scaler_update(&a->scalers[k], inf_k)) apply = 0;
  }
  if (found) apply = 0;
  info->scale = ampc_scaler_scale(&a->scalers[0]);
  info->clip_coef = ampc_clip_coef(found ? INFINITY : sumsq, a->clip, &info->grad_norm);
  if (!apply) {
    clear_grads(a);
    return AMPC_OK;
  }
  float gmul = unscale * info->clip_coef;
  int64_t step_no = ampc_optim_step_count(a->opt);
  ampc_optim_begin_step(a->opt, lr);
#pragma omp parallel for schedule(static)
  for (size_t ci = 0; ci < a->nchunks; ci++) {
    const amp_chunk *c = &a->chunks[ci];
    const amp_param *p = &a->params[c->p];
    size_t off = p->off + c->start, es = ampc_dtype_size(p->dtype);
    void *model = (char *)p->data + c->start * es;
    if (a->master) {
      /* f32 masters: update them and write the model copy in the same pass */
      const float *gv = a->mgrad ? a->mgrad + off : grad_chunk(a, p, c, thread_scratch(a));
      ampc_optim_update_at(a->opt, off, c->n, a->master + off, gv, gmul, p->dtype, model);
    } else if (p->dtype == AMPC_DTYPE_F32) {
      const float *gv = a->mgrad ? a->mgrad + off : (const float *)p->grad + c->start;
      ampc_optim_update_at(a->opt, off, c->n, model, gv, gmul, AMPC_DTYPE_F32, NULL);
    } else {
      /* half weights, no masters: update an f32 copy of the chunk, round back */
      float *w = thread_scratch(a), *gs = w + AMP_CHUNK;
      ampc_load_f32(w, p->dtype, model, c->n);
      const float *gv = a->mgrad ? a->mgrad + off : grad_chunk(a, p, c, gs);
      ampc_optim_update_at(a->opt, off, c->n, w, gv, gmul, AMPC_DTYPE_F32, NULL);
      if (a->sr && is_half(p->dtype)) {
        uint16_t *d = model;
        for (size_t i = 0; i < c->n; i++)
          d[i] = round_stochastic(p->dtype, w[i], ampc_rng_at(a->sr_seed, AMPC_RNG_STREAM_ROUNDING, (uint64_t)step_no * a->numel + off + i));
      } else {
        ampc_store_f32(p->dtype, model, w, c->n);
      }
    }
  }
  info->applied = 1;
  clear_grads(a);
  return AMPC_OK;
}

void ampc_amp_param_values(ampc_amp *a, float *out) {
  if (a->master) {
    memcpy(out, a->master, a->numel * sizeof(float));
    return;
  }
  for (size_t i = 0; i < a->nparams; i++) ampc_load_f32(out + a->params[i].off, a->params[i].dtype, a->params[i].data, a->params[i].n);
}

ampc_status ampc_amp_load_params(ampc_amp *a, const float *values) {
  for (size_t i = 0; i < a->nparams; i++) {
    const amp_param *p = &a->params[i];
    ampc_store_f32(p->dtype, p->data, values + p->off, p->n);
    if (a->master) memcpy(a->master + p->off, values + p->off, p->n * sizeof(float));
  }
  return AMPC_OK;
}

void ampc_amp_set_grad_stats(ampc_amp *a, int on) { ampc_graph_set_grad_underflow_counting(a->g, on); }

void ampc_amp_get_grad_stats(ampc_amp *a, ampc_amp_grad_stats *st, int reset) {
  /* the underflow count comes from the kernels, which see each weight gradient
   * in f32 before it is rounded to its storage type */
  ampc_graph_grad_underflow(a->g, &st->values, &st->underflow, reset);
  st->max_abs = a->st_max;
  if (reset) a->st_max = 0.0f;
}

void ampc_amp_memory(const ampc_amp *a, ampc_mem_report *r) {
  ampc_graph_memory(a->g, r);
  if (a->master) r->bytes[AMPC_MEM_MASTER_WEIGHTS][AMPC_DTYPE_F32] += a->numel * sizeof(float);
  if (a->mgrad) r->bytes[AMPC_MEM_GRADIENTS][AMPC_DTYPE_F32] += a->numel * sizeof(float);
  if (a->opt) r->bytes[AMPC_MEM_OPTIMIZER_STATE][AMPC_DTYPE_F32] += ampc_optim_state_count(a->opt) * a->numel * sizeof(float);
  r->bytes[AMPC_MEM_WORKSPACE][AMPC_DTYPE_F32] += (size_t)a->nthreads * 2 * AMP_CHUNK * sizeof(float);
}
