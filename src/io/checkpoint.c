/* Checkpoints and weights files: the model's tensors by their PyTorch names,
 * masters and optimizer state, and the run state -- each saved and loaded as
 * one walk over the parameters, through the device's read and write calls. */
#include <float.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ampc/checkpoint.h"
#include "ampc/safetensors.h"
#include "core/status_internal.h"

/* ---- saving ---- */

typedef enum { SRC_VALUE, SRC_VALUE_F32, SRC_MASTER, SRC_OPTIM } src_kind;

/* Where a tensor of the file comes from. */
typedef struct {
  src_kind kind;
  ampc_value v;          /* the graph value (every kind: names and shapes) */
  const char *state;     /* SRC_OPTIM: the optimizer state's name */
} src;

typedef struct {
  ampc_graph *g;
  ampc_amp *amp;
  ampc_st_tensor *t;
  src *src;
  char **names;
  size_t n, cap;
} walk;

static ampc_status walk_add(walk *w, src_kind kind, ampc_value v, const char *state, const char *prefix) {
  if (w->n == w->cap) {
    size_t cap = w->cap ? w->cap * 2 : 256;
    ampc_st_tensor *t = realloc(w->t, cap * sizeof *t);
    if (t) w->t = t;
    src *s = realloc(w->src, cap * sizeof *s);
    if (s) w->src = s;
    char **nm = realloc(w->names, cap * sizeof *nm);
    if (nm) w->names = nm;
    if (!t || !s || !nm) return ampc__error(AMPC_ENOMEM, "checkpoint: out of memory");
    w->cap = cap;
  }
  const char *name = ampc_graph_name(w->g, v);
  size_t len = strlen(prefix) + strlen(name) + 1;
  char *full = malloc(len);
  if (!full) return ampc__error(AMPC_ENOMEM, "checkpoint: out of memory");
  snprintf(full, len, "%s%s", prefix, name);
  ampc_tensor tv = ampc_graph_tensor(w->g, v);
  ampc_dtype dt = kind == SRC_VALUE ? tv.dtype : AMPC_DTYPE_F32;
  ampc_st_tensor *t = &w->t[w->n];
  memset(t, 0, sizeof *t);
  t->name = full;
  t->dtype = dt;
  t->ndim = tv.shape.ndim;
  for (int i = 0; i < tv.shape.ndim; i++) t->shape[i] = tv.shape.d[i];
  t->nbytes = (size_t)ampc_tensor_numel(&tv) * ampc_dtype_size(dt);
  w->names[w->n] = full;
  w->src[w->n] = (src){kind, v, state};
  w->n++;
  return AMPC_OK;
}

static void walk_free(walk *w) {
  for (size_t i = 0; i < w->n; i++) free(w->names[i]);
  free(w->names);
  free(w->src);
  free(w->t);
}

static ampc_status fetch(void *ctx, size_t i, void *buf) {
  walk *w = ctx;
  const src *s = &w->src[i];
  size_t n = w->t[i].nbytes / ampc_dtype_size(w->t[i].dtype);
  const char *name = ampc_graph_name(w->g, s->v);
  switch (s->kind) {
    case SRC_VALUE: return ampc_graph_read(w->g, s->v, buf, w->t[i].dtype);
    case SRC_VALUE_F32:
      if (ampc_amp_has_master_weights(w->amp)) return ampc_amp_read_master(w->amp, name, buf, n);
      return ampc_graph_read(w->g, s->v, buf, AMPC_DTYPE_F32);
    case SRC_MASTER: return ampc_amp_read_master(w->amp, name, buf, n);
    case SRC_OPTIM: return ampc_amp_read_optim_state(w->amp, s->state, name, buf, n);
  }
  return AMPC_OK;
}

/* Parameters (as stored, or f32 from the masters), then buffers. */
static ampc_status walk_model(walk *w, int params_f32) {
  ampc_graph *g = w->g;
  for (size_t i = 0; i < ampc_graph_param_count(g); i++)
    AMPC_TRY(walk_add(w, params_f32 ? SRC_VALUE_F32 : SRC_VALUE, ampc_graph_param_at(g, i), NULL, ""));
  for (size_t i = 0; i < ampc_graph_buffer_count(g); i++) AMPC_TRY(walk_add(w, SRC_VALUE, ampc_graph_buffer_at(g, i), NULL, ""));
  return AMPC_OK;
}

/* The metadata every file of a model carries: the caller's, then the input
 * shape ("1x28x28") and class count it was made for. */
typedef struct {
  const char *kv[24];
  char input[64], classes[16];
} model_meta;

static ampc_status make_meta(model_meta *mm, const ampc_model *m, const char *const *meta) {
  const ampc_model_opts *mo = ampc_model_options(m);
  snprintf(mm->input, sizeof mm->input, "%dx%dx%d", mo->channels, mo->height, mo->width);
  snprintf(mm->classes, sizeof mm->classes, "%d", mo->classes);
  size_t k = 0;
  for (; meta && meta[k]; k += 2) {
    if (k + 6 >= sizeof mm->kv / sizeof mm->kv[0]) return ampc__error(AMPC_EINVAL, "checkpoint: too many metadata entries");
    mm->kv[k] = meta[k];
    mm->kv[k + 1] = meta[k + 1];
  }
  mm->kv[k++] = "input";
  mm->kv[k++] = mm->input;
  mm->kv[k++] = "classes";
  mm->kv[k++] = mm->classes;
  mm->kv[k] = NULL;
  return AMPC_OK;
}

ampc_status ampc_checkpoint_save_weights(const char *path, ampc_model *m, ampc_amp *amp, const char *const *meta) {
  if (!path || !m) return ampc__error(AMPC_EINVAL, "ampc_checkpoint_save_weights: %s is NULL", path ? "model" : "path");
  walk w = {ampc_model_graph(m), amp, NULL, NULL, NULL, 0, 0};
  model_meta mm;
  ampc_status s = make_meta(&mm, m, meta);
  if (s == 0) s = walk_model(&w, 1);
  if (s == 0) s = ampc_st_write_stream(path, w.t, w.n, mm.kv, fetch, &w);
  walk_free(&w);
  return s;
}

static json_t *amp_json(const ampc_amp_config *c) {
  /* no ceiling (max_loss_scale none: infinite) is null, JSON having no inf */
  json_t *max_scale = isfinite(c->max_loss_scale) ? json_real((double)c->max_loss_scale) : json_null();
  return json_pack("{s:s, s:s, s:s, s:b, s:i, s:i, s:b, s:f, s:f, s:o, s:i, s:f, s:f, s:i, s:b, s:i}",
                   "opt_level", ampc_opt_level_name(c->opt_level), "half_type", ampc_dtype_name(c->half_type),
                   "cast_model_type", ampc_dtype_name(c->cast_model_type), "autocast", c->autocast,
                   "keep_batchnorm_fp32", c->keep_batchnorm_fp32, "master_weights", c->master_weights,
                   "loss_scale_dynamic", c->loss_scale_dynamic, "loss_scale", (double)c->loss_scale,
                   "min_loss_scale", (double)c->min_loss_scale, "max_loss_scale", max_scale,
                   "scale_window", c->scale_window, "growth_factor", (double)c->growth_factor,
                   "backoff_factor", (double)c->backoff_factor, "hysteresis", c->hysteresis,
                   "consecutive_hysteresis", c->consecutive_hysteresis, "num_losses", c->num_losses);
}

/* The preprocessing record: {"dataset", "normalize", "shape": [C, H, W],
 * "mean": [...], "std": [...] (one per channel), "formula"}. */
/* The shortest decimal that reads back as f: 0.286f is written 0.286, not
 * 0.28600001335144043, and JSON printed with 9 digits shows it as such. */
static double short_decimal(float f) {
  char buf[32];
  for (int prec = 1; prec < 9; prec++) {
    snprintf(buf, sizeof buf, "%.*g", prec, (double)f);
    if ((float)strtod(buf, NULL) == f) return strtod(buf, NULL);
  }
  return (double)f;
}

static json_t *preprocessing_json(const ampc_preprocessing *p) {
  int nc = p->channels < 1 ? 1 : p->channels > 3 ? 3 : p->channels;
  json_t *mean = json_array(), *std = json_array();
  for (int c = 0; c < nc; c++) {
    json_array_append_new(mean, json_real(short_decimal(p->mean[c])));
    json_array_append_new(std, json_real(short_decimal(p->std[c])));
  }
  return json_pack("{s:s, s:b, s:[i, i, i], s:o, s:o, s:s}", "dataset", p->dataset, "normalize", p->normalize, "shape", p->channels,
                   p->height, p->width, "mean", mean, "std", std, "formula",
                   "x[c] = (pixel[c] / 255 - mean[c]) / std[c], images (N, C, H, W) in [0, 255]");
}

char *ampc_preprocessing_json(const ampc_preprocessing *p) {
  json_t *o = p ? preprocessing_json(p) : NULL;
  char *js = o ? json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(9)) : NULL;
  json_decref(o);
  return js;
}

/* A preprocessing record as preprocessing_json writes it, each entry checked:
 * a dataset name, a boolean, a shape of 1..3 channels and positive int sizes,
 * one finite mean and one positive std for each channel. */
static ampc_status preprocessing_from_json(json_t *o, ampc_preprocessing *out) {
  ampc_preprocessing p;
  memset(&p, 0, sizeof p);
  if (!json_is_object(o)) return ampc__error(AMPC_EFORMAT, "preprocessing: not a JSON object");
  const char *ds = json_string_value(json_object_get(o, "dataset"));
  if (!ds || !ds[0] || strlen(ds) >= sizeof p.dataset)
    return ampc__error(AMPC_EFORMAT, "preprocessing: 'dataset' is missing or not a name of 1..%zu characters", sizeof p.dataset - 1);
  for (const char *c = ds; *c; c++)
    if ((unsigned char)*c < 0x20 || (unsigned char)*c >= 0x7f)
      return ampc__error(AMPC_EFORMAT, "preprocessing: 'dataset' has a character that is not printable ASCII");
  snprintf(p.dataset, sizeof p.dataset, "%s", ds);
  json_t *nz = json_object_get(o, "normalize"), *shape = json_object_get(o, "shape");
  if (!json_is_boolean(nz)) return ampc__error(AMPC_EFORMAT, "preprocessing: 'normalize' is missing or not true/false");
  p.normalize = json_is_true(nz);
  static const char *const dim[3] = {"channels", "height", "width"};
  int *dst[3] = {&p.channels, &p.height, &p.width};
  if (!json_is_array(shape) || json_array_size(shape) != 3)
    return ampc__error(AMPC_EFORMAT, "preprocessing: 'shape' is missing or not [channels, height, width]");
  for (int d = 0; d < 3; d++) {
    json_t *v = json_array_get(shape, (size_t)d);
    json_int_t x = json_integer_value(v), most = d == 0 ? 3 : INT32_MAX;
    if (!json_is_integer(v) || x < 1 || x > most)
      return ampc__error(AMPC_EFORMAT, "preprocessing: 'shape' has %s that is not an integer in 1..%lld", dim[d], (long long)most);
    *dst[d] = (int)x;
  }
  json_t *mean = json_object_get(o, "mean"), *std = json_object_get(o, "std");
  if (!json_is_array(mean) || !json_is_array(std) || json_array_size(mean) != (size_t)p.channels ||
      json_array_size(std) != (size_t)p.channels)
    return ampc__error(AMPC_EFORMAT, "preprocessing: 'mean' and 'std' must each be an array of one number per channel (%d)", p.channels);
  for (int c = 0; c < 3; c++) {
    p.mean[c] = 0.0f;
    p.std[c] = 1.0f;
    if (c >= p.channels) continue;
    json_t *m = json_array_get(mean, (size_t)c), *sd = json_array_get(std, (size_t)c);
    double mv = json_number_value(m), sv = json_number_value(sd);
    if (!json_is_number(m) || !(fabs(mv) <= 1e6))
      return ampc__error(AMPC_EFORMAT, "preprocessing: 'mean'[%d] is not a number in -1e6..1e6", c);
    if (!json_is_number(sd) || !(sv >= 1e-6 && sv <= 1e6))
      return ampc__error(AMPC_EFORMAT, "preprocessing: 'std'[%d] is not a number in 1e-6..1e6", c);
    p.mean[c] = (float)mv;
    p.std[c] = (float)sv;
  }
  *out = p;
  return AMPC_OK;
}

ampc_status ampc_preprocessing_parse(const char *json, ampc_preprocessing *out) {
  if (!json || !out) return ampc__error(AMPC_EINVAL, "ampc_preprocessing_parse: NULL argument");
  json_error_t je;
  json_t *o = json_loads(json, JSON_REJECT_DUPLICATES, &je);
  if (!o) return ampc__error(AMPC_EFORMAT, "preprocessing: not JSON: %s", je.text);
  ampc_status s = preprocessing_from_json(o, out);
  json_decref(o);
  return s;
}

static char *run_json(ampc_model *m, ampc_amp *amp, ampc_optim *opt, const ampc_train_state *ts) {
  const ampc_amp_config *c = ampc_amp_get_config(amp);
  json_t *scalers = json_array();
  for (int k = 0; k < c->num_losses; k++) {
    ampc_scaler_state st;
    ampc_scaler_get_state(ampc_amp_scaler(amp, k), &st);
    json_array_append_new(scalers, json_pack("{s:f, s:I, s:i, s:I, s:I, s:I, s:I}", "scale", (double)st.scale,
                                             "growth_tracker", (json_int_t)st.growth_tracker, "hysteresis_left", st.hysteresis_left,
                                             "overflows", (json_int_t)st.overflows, "skipped_steps", (json_int_t)st.skipped_steps,
                                             "steps", (json_int_t)st.steps, "min_scale_hits", (json_int_t)st.min_scale_hits));
  }
  json_t *root = json_pack("{s:s, s:o, s:o, s:I, s:I, s:I, s:I, s:f, s:I, s:I, s:I, s:f}", "model", ampc_model_name(m),
                           "amp", amp_json(c), "scalers", scalers, "seed", (json_int_t)ts->seed, "epoch", (json_int_t)ts->epoch,
                           "batch", (json_int_t)ts->batch, "step", (json_int_t)ts->step, "loss_sum", isfinite(ts->loss_sum) ? ts->loss_sum : 0.0,
                           "seen", (json_int_t)ts->seen, "skipped", (json_int_t)ts->skipped,
                           "skipped_total", (json_int_t)ts->skipped_total, "train_seconds", ts->train_seconds);
  /* an epoch with a step whose loss was not finite (an overflow): its sum
   * is not either, and its mean loss will be null */
  if (root && !isfinite(ts->loss_sum)) json_object_set_new(root, "loss_sum", json_null());
  if (root && ts->preprocessing.dataset[0]) json_object_set_new(root, "preprocessing", preprocessing_json(&ts->preprocessing));
  /* (0: not recorded; anything else written, so that saving's read-back sees a negative one) */
  if (root && ts->world_size != 0) json_object_set_new(root, "world_size", json_integer((json_int_t)ts->world_size));
  if (root && ts->global_batch != 0) json_object_set_new(root, "global_batch", json_integer((json_int_t)ts->global_batch));
  if (root && ts->has_grad_stats)
    json_object_set_new(root, "grad_stats", json_pack("{s:I, s:I, s:f}", "values", (json_int_t)ts->grad_values, "underflow",
                                                      (json_int_t)ts->grad_underflow, "max_abs", ts->grad_max_abs));
  if (root && ts->log_steps > 0) {
    json_object_set_new(root, "log_steps", json_integer((json_int_t)ts->log_steps));
    json_object_set_new(root, "log_loss_sum", isfinite(ts->log_loss_sum) ? json_real(ts->log_loss_sum) : json_null());
  }
  if (root && opt) {
    json_object_set_new(root, "optimizer", json_string(ampc_optim_kind_name(ampc_optim_get_config(opt)->kind)));
    json_object_set_new(root, "optimizer_step", json_integer((json_int_t)ampc_optim_step_count(opt)));
  }
  char *js = root ? json_dumps(root, JSON_COMPACT | JSON_SORT_KEYS | JSON_REAL_PRECISION(17)) : NULL;
  json_decref(root);
  return js;
}

/* A checkpoint's run record, as read_run reads it (loading, and saving's
 * read-back): the run state (with the preprocessing where recorded), each
 * loss scaler's state, the optimizer's step count. */
#define RUN_MAX_SCALERS 8
typedef struct {
  ampc_train_state ts;
  int has_pre;
  ampc_scaler_state sc[RUN_MAX_SCALERS];
  int64_t optim_step;
} run_record;
static ampc_status read_run(const char *path, json_t *root, const ampc_amp_config *c, const ampc_optim *opt, run_record *r);

ampc_status ampc_checkpoint_save(const char *path, ampc_model *m, ampc_amp *amp, ampc_optim *opt, const ampc_train_state *ts) {
  if (!path || !m || !amp)
    return ampc__error(AMPC_EINVAL, "ampc_checkpoint_save: %s is NULL", !path ? "path" : !m ? "model" : "amp");
  /* (JSON has no non-finite numbers: named here, not failed as out of memory) */
  if (ts && (!isfinite(ts->train_seconds) || (ts->has_grad_stats && !isfinite(ts->grad_max_abs))))
    return ampc__error(AMPC_EINVAL, "ampc_checkpoint_save: the run state's '%s' is not finite",
                       !isfinite(ts->train_seconds) ? "train_seconds" : "grad_max_abs");
  /* a NULL ts: a run state of zeros but its step, the optimizer's steps (a
   * step count below those would not load back) */
  ampc_train_state no_state;
  if (!ts) {
    memset(&no_state, 0, sizeof no_state);
    no_state.step = opt ? ampc_optim_step_count(opt) : 0;
    ts = &no_state;
  }
  ampc_graph *g = ampc_model_graph(m);
  walk w = {g, amp, NULL, NULL, NULL, 0, 0};
  ampc_status s = walk_model(&w, 0);
  size_t np = ampc_graph_param_count(g);
  for (size_t i = 0; s == 0 && ampc_amp_has_master_weights(amp) && i < np; i++)
    s = walk_add(&w, SRC_MASTER, ampc_graph_param_at(g, i), NULL, "master.");
  for (size_t k = 0; s == 0 && opt && k < ampc_optim_state_count(opt); k++) {
    const char *sname = ampc_optim_state_name(opt, k);
    char prefix[64];
    snprintf(prefix, sizeof prefix, "optim.%s.", sname);
    for (size_t i = 0; s == 0 && i < np; i++) s = walk_add(&w, SRC_OPTIM, ampc_graph_param_at(g, i), sname, prefix);
  }
  char *js = s == 0 ? run_json(m, amp, opt, ts) : NULL;
  if (s == 0 && !js) s = ampc__error(AMPC_ENOMEM, "checkpoint: out of memory");
  /* what loading would refuse is not written: the record read back as
   * loading reads it, every range checked there and only there */
  if (s == 0) {
    json_error_t je;
    json_t *back = json_loads(js, JSON_REJECT_DUPLICATES, &je);
    run_record rr;
    s = back ? read_run(path, back, ampc_amp_get_config(amp), opt, &rr) : ampc__error(AMPC_ENOMEM, "checkpoint: out of memory");
    json_decref(back);
    if (s < 0) s = ampc__error_prefix(AMPC_EINVAL, "ampc_checkpoint_save: not written, as loading would refuse its run state");
  }
  if (s == 0) {
    char ver[16];
    snprintf(ver, sizeof ver, "%d", AMPC_CHECKPOINT_VERSION);
    const char *meta[] = {"format", AMPC_CHECKPOINT_FORMAT, "format_version", ver, "ampc", js, NULL};
    model_meta mm;
    s = make_meta(&mm, m, meta);
    if (s == 0) s = ampc_st_write_stream(path, w.t, w.n, mm.kv, fetch, &w);
  }
  free(js);
  walk_free(&w);
  return s;
}

/* ---- loading ---- */

static int same_shape(const ampc_st_tensor *t, const ampc_tensor *v) {
  if (t->ndim != v->shape.ndim) return 0;
  for (int i = 0; i < t->ndim; i++)
    if (t->shape[i] != v->shape.d[i]) return 0;
  return 1;
}

/* The integer values of t (numel n) as i64. */
static ampc_status read_i64(const ampc_st_tensor *t, int64_t *dst, size_t n) {
  if (t->dtype == AMPC_DTYPE_I64) {
    memcpy(dst, t->values, n * sizeof *dst);
    return AMPC_OK;
  }
  int32_t *tmp = malloc(n * sizeof *tmp);
  if (!tmp) return ampc__error(AMPC_ENOMEM, "checkpoint: out of memory");
  ampc_status s = ampc_st_read_i32(t, tmp, n);
  for (size_t i = 0; s == 0 && i < n; i++) dst[i] = tmp[i];
  free(tmp);
  return s;
}

/* Whether name is a parameter of g (or, with buffers, a buffer too). */
static int graph_state(const ampc_graph *g, const char *name, int buffers) {
  ampc_value v = ampc_graph_find(g, name);
  if (v < 0) return 0;
  ampc_op_kind k = ampc_graph_op(g, v);
  return k == AMPC_OP_PARAM || (buffers && k == AMPC_OP_BUFFER);
}

/* A tensor of f that only a checkpoint's own sections name: "master.P" or
 * "optim.S.P" with P a parameter of g. */
static int checkpoint_section(const ampc_graph *g, const char *name) {
  if (strncmp(name, "master.", 7) == 0) return graph_state(g, name + 7, 0);
  if (strncmp(name, "optim.", 6) != 0) return 0;
  const char *dot = strchr(name + 6, '.');
  return dot && dot > name + 6 && graph_state(g, dot + 1, 0);
}

static ampc_status wrong_shape(const char *path, const ampc_st_tensor *t, const ampc_tensor *tv, const char *model,
                               const ampc_model_opts *mo) {
  char got[96], sh[64];
  ampc_shape fs = {.ndim = t->ndim < AMPC_MAX_DIMS ? t->ndim : AMPC_MAX_DIMS};
  for (int k = 0; k < fs.ndim; k++) fs.d[k] = t->shape[k];
  return ampc__error(AMPC_EFORMAT, "%s: tensor '%s' has the wrong shape for model %s: %s%s, expected %s (for %dx%dx%d inputs and %d classes)",
                     path, t->name, model, ampc_shape_str(&fs, got, sizeof got), t->ndim > AMPC_MAX_DIMS ? "..." : "",
                     ampc_shape_str(&tv->shape, sh, sizeof sh), mo->channels, mo->height, mo->width, mo->classes);
}

/* Every parameter and buffer of m from f by name: a parameter from its f32
 * master copy ("master.<name>") where the file has one, else from its own
 * tensor (any float type), into the model's copy and the masters. With
 * strict, a tensor that is neither the model's nor a checkpoint's own
 * section is an error. check_only: the same checks (and conversions, which
 * can fail), changing nothing. masters: every parameter's master copy must
 * be there (a checkpoint saved with master weights: the model copy of a
 * parameter whose master is missing is not its exact value). */
static ampc_status load_model(const ampc_st_file *f, ampc_model *m, ampc_amp *amp, int strict, int check_only, int masters) {
  const char *path = ampc_st_label(f), *model = ampc_model_name(m);
  ampc_graph *g = ampc_model_graph(m);
  const ampc_model_opts *mo = ampc_model_options(m);
  size_t np = ampc_graph_param_count(g), nb = ampc_graph_buffer_count(g), most = 1;
  for (size_t i = 0; i < np + nb; i++) {
    ampc_tensor t = ampc_graph_tensor(g, i < np ? ampc_graph_param_at(g, i) : ampc_graph_buffer_at(g, i - np));
    if ((size_t)ampc_tensor_numel(&t) > most) most = (size_t)ampc_tensor_numel(&t);
  }
  void *tmp = malloc(most * 8);
  if (!tmp) return ampc__error(AMPC_ENOMEM, "checkpoint: out of memory");
  ampc_status s = AMPC_OK;
  for (size_t i = 0; i < np + nb && s == 0; i++) {
    ampc_value v = i < np ? ampc_graph_param_at(g, i) : ampc_graph_buffer_at(g, i - np);
    const char *name = ampc_graph_name(g, v);
    ampc_tensor tv = ampc_graph_tensor(g, v);
    size_t n = (size_t)ampc_tensor_numel(&tv);
    char mname[256];
    snprintf(mname, sizeof mname, "master.%s", name);
    /* a checkpoint's f32 master copy is the exact value; the model copy may be half */
    const ampc_st_tensor *t = i < np ? ampc_st_find(f, mname) : NULL, *own = ampc_st_find(f, name);
    if (!t && i < np && masters) {
      s = ampc__error(AMPC_EFORMAT, "%s: missing tensor '%s' (the f32 master copy of '%s'; the checkpoint was saved with master weights)",
                      path, mname, name);
      break;
    }
    if (!t) t = own;
    if (!t) {
      s = ampc__error(AMPC_EFORMAT, "%s: missing tensor '%s' for model %s", path, name, model);
    } else if (!same_shape(t, &tv)) {
      s = wrong_shape(path, t, &tv, model, mo);
    } else if (strict && own && own != t && (!same_shape(own, &tv) || !ampc_dtype_is_float(own->dtype))) {
      /* the model's own copy beside the master is not read, but checked */
      s = same_shape(own, &tv) ? ampc__error(AMPC_EFORMAT, "%s: tensor '%s' is %s, expected a float type", path, name,
                                             ampc_dtype_name(own->dtype))
                               : wrong_shape(path, own, &tv, model, mo);
    } else if (tv.dtype == AMPC_DTYPE_I64) {
      if (ampc_dtype_is_float(t->dtype))
        s = ampc__error(AMPC_EFORMAT, "%s: tensor '%s' is %s, expected an integer type", path, t->name, ampc_dtype_name(t->dtype));
      if (s == 0) s = read_i64(t, tmp, n);
      if (s == 0 && !check_only) s = ampc_graph_write(g, v, tmp, AMPC_DTYPE_I64);
    } else {
      s = ampc_st_read_f32(t, tmp, n);
      if (s == 0 && !check_only) s = ampc_graph_write(g, v, tmp, AMPC_DTYPE_F32);
      if (s == 0 && !check_only && i < np && amp && ampc_amp_has_master_weights(amp)) s = ampc_amp_write_master(amp, name, tmp, n);
    }
  }
  free(tmp);
  for (size_t i = 0; s == 0 && strict && i < ampc_st_count(f); i++) {
    const char *name = ampc_st_get(f, i)->name;
    if (graph_state(g, name, 1) || checkpoint_section(g, name)) continue;
    s = ampc__error(AMPC_EFORMAT, "%s: unexpected tensor '%s' for model %s", path, name, model);
  }
  return s;
}

ampc_status ampc_checkpoint_load_weights(const char *path, ampc_model *m, ampc_amp *amp) {
  if (!path || !m) return ampc__error(AMPC_EINVAL, "ampc_checkpoint_load_weights: %s is NULL", path ? "model" : "path");
  ampc_st_file *f;
  AMPC_TRY(ampc_st_open(&f, path));
  /* everything checked before anything is changed */
  ampc_status s = load_model(f, m, amp, 1, 1, 0);
  if (s == 0) s = load_model(f, m, amp, 1, 0, 0);
  ampc_st_close(f);
  return s;
}

static ampc_status load_optim(const ampc_st_file *f, ampc_model *m, ampc_amp *amp, ampc_optim *opt, int check_only) {
  const char *path = ampc_st_label(f);
  ampc_graph *g = ampc_model_graph(m);
  float *tmp = NULL;
  ampc_status s = AMPC_OK;
  for (size_t k = 0; k < ampc_optim_state_count(opt) && s == 0; k++) {
    const char *sname = ampc_optim_state_name(opt, k);
    for (size_t i = 0; i < ampc_graph_param_count(g) && s == 0; i++) {
      ampc_value v = ampc_graph_param_at(g, i);
      ampc_tensor tv = ampc_graph_tensor(g, v);
      size_t n = (size_t)ampc_tensor_numel(&tv);
      char name[256];
      snprintf(name, sizeof name, "optim.%s.%s", sname, ampc_graph_name(g, v));
      const ampc_st_tensor *t = ampc_st_find(f, name);
      if (!t) {
        s = ampc__error(AMPC_EFORMAT, "checkpoint: %s: missing tensor '%s'", path, name);
        break;
      }
      if (!same_shape(t, &tv)) {
        char have[96], want[96];
        ampc_shape fs = {.ndim = t->ndim < AMPC_MAX_DIMS ? t->ndim : AMPC_MAX_DIMS};
        for (int k = 0; k < fs.ndim; k++) fs.d[k] = t->shape[k];
        s = ampc__error(AMPC_EFORMAT, "checkpoint: %s: tensor '%s' is %s, the model's is %s", path, name,
                        ampc_shape_str(&fs, have, sizeof have), ampc_shape_str(&tv.shape, want, sizeof want));
        break;
      }
      float *p = realloc(tmp, n * sizeof *p);
      if (!p) {
        s = ampc__error(AMPC_ENOMEM, "checkpoint: out of memory");
        break;
      }
      tmp = p;
      s = ampc_st_read_f32(t, tmp, n);
      if (s < 0) ampc__error_prefix(s, "checkpoint: %s", path);
      if (s == 0 && !check_only) s = ampc_amp_write_optim_state(amp, sname, ampc_graph_name(g, v), tmp, n);
    }
  }
  free(tmp);
  /* and no state this optimizer does not keep */
  for (size_t i = 0; s == 0 && check_only && i < ampc_st_count(f); i++) {
    const char *name = ampc_st_get(f, i)->name;
    if (strncmp(name, "optim.", 6) != 0) continue;
    size_t k = 0, len = strcspn(name + 6, ".");
    while (k < ampc_optim_state_count(opt) &&
           !(strlen(ampc_optim_state_name(opt, k)) == len && strncmp(ampc_optim_state_name(opt, k), name + 6, len) == 0))
      k++;
    if (k == ampc_optim_state_count(opt))
      s = ampc__error(AMPC_EFORMAT, "checkpoint: %s: unexpected tensor '%s' (not a state of this optimizer)", path, name);
  }
  return s;
}

/* A decimal integer in [lo, hi] spanning the whole of [p, end) (end NULL: to the NUL). */
static int parse_int_in(const char *p, const char *end, long long lo, long long hi, long long *out) {
  if (!end) end = p + strlen(p);
  if (p == end || end - p > 19 || (*p == '0' && end - p > 1)) return 0; /* digits as ampc writes them: no sign, no leading zero */
  long long v = 0;
  for (const char *q = p; q < end; q++) {
    if (*q < '0' || *q > '9') return 0;
    v = v * 10 + (*q - '0');
  }
  if (v < lo || v > hi) return 0;
  *out = v;
  return 1;
}

ampc_status ampc_checkpoint_input(const ampc_st_file *f, int *channels, int *height, int *width, int *classes) {
  if (!f || !channels || !height || !width || !classes)
    return ampc__error(AMPC_EINVAL, "ampc_checkpoint_input: %s is NULL", f ? "an output pointer" : "file");
  const char *in = ampc_st_metadata(f, "input"), *k = ampc_st_metadata(f, "classes");
  if (!in && !k) return 0;
  long long d[3], kk;
  const char *p = in;
  int ok = in && k;
  for (int i = 0; ok && i < 3; i++) {
    const char *x = strchr(p, 'x');
    if ((i < 2) != (x != NULL)) ok = 0;
    else ok = parse_int_in(p, i < 2 ? x : NULL, 1, INT32_MAX, &d[i]);
    if (ok && x) p = x + 1;
  }
  if (ok) ok = parse_int_in(k, NULL, 2, INT32_MAX, &kk);
  if (!ok)
    return ampc__error(AMPC_EFORMAT, "%s: metadata input '%s' and classes '%s' are not CxHxW and a class count (each at least 1, classes at least 2, at most %d)",
                       ampc_st_label(f), in ? in : "(none)", k ? k : "(none)", INT32_MAX);
  *channels = (int)d[0];
  *height = (int)d[1];
  *width = (int)d[2];
  *classes = (int)kk;
  return 1;
}

/* An integer of the metadata in [lo, hi], in its full width; 0 or a message. */
static ampc_status jint_in(const char *path, json_t *o, const char *what, const char *k, int64_t lo, int64_t hi, int64_t *out) {
  json_t *v = json_object_get(o, k);
  if (!json_is_integer(v))
    return ampc__error(AMPC_EFORMAT, "checkpoint: %s: %s'%s' is %s, not an integer", path, what, k, v ? "of another type" : "missing");
  json_int_t x = json_integer_value(v);
  if (x < lo || x > hi)
    return ampc__error(AMPC_EFORMAT, "checkpoint: %s: %s'%s' = %lld is outside [%lld, %lld]", path, what, k, (long long)x, (long long)lo, (long long)hi);
  *out = (int64_t)x;
  return AMPC_OK;
}

/* A finite number of the metadata, at least 0. */
static ampc_status jnum_nonneg(const char *path, json_t *o, const char *k, double *out) {
  json_t *v = json_object_get(o, k);
  double x = json_number_value(v);
  if (!json_is_number(v) || !(x >= 0) || !isfinite(x))
    return ampc__error(AMPC_EFORMAT, "checkpoint: %s: '%s' is %s", path, k, json_is_number(v) ? "negative or not finite" : "missing or not a number");
  *out = x;
  return AMPC_OK;
}

/* The counters' limits: far beyond any run (2^40 steps is over ten years
 * at 3000 steps a second), yet small enough that the sums and products made
 * of them fit: images stay exact in a double (2^53), and a batch's first
 * image, batch x global_batch, fits in int64. */
#define MAX_STEPS ((int64_t)1 << 40)
#define MAX_IMAGES ((int64_t)1 << 53)
#define MAX_GLOBAL_BATCH ((int64_t)1 << 31)
#define MAX_TRAIN_SECONDS 3.2e9 /* about 100 years */
#define MAX_MEAN_LOSS 1e30 /* per image: a cross-entropy far past any a run survives */
#define MAX_GRAD_VALUES ((int64_t)1 << 62) /* gradient values counted in an epoch: an int64 that one more step cannot overflow */

/* Every number of the run state, range-checked in its full width before any is used. */
static ampc_status read_train_state(const char *path, json_t *root, ampc_train_state *ts) {
  int64_t seed = 0;
  AMPC_TRY(jint_in(path, root, "", "seed", 0, INT64_MAX, &seed));
  AMPC_TRY(jint_in(path, root, "", "epoch", 0, MAX_STEPS, &ts->epoch));
  AMPC_TRY(jint_in(path, root, "", "batch", 0, MAX_STEPS, &ts->batch));
  AMPC_TRY(jint_in(path, root, "", "step", 0, MAX_STEPS, &ts->step));
  AMPC_TRY(jint_in(path, root, "", "seen", 0, MAX_IMAGES, &ts->seen));
  AMPC_TRY(jint_in(path, root, "", "skipped_total", 0, ts->step, &ts->skipped_total));
  AMPC_TRY(jint_in(path, root, "", "skipped", 0, ts->skipped_total, &ts->skipped));
  if (json_is_null(json_object_get(root, "loss_sum")))
    ts->loss_sum = NAN; /* the epoch had a step whose loss was not finite */
  else
    AMPC_TRY(jnum_nonneg(path, root, "loss_sum", &ts->loss_sum));
  /* the epoch's summed loss over its `seen` images: a mean loss past the
   * bound (or a loss without images) is no run's */
  if (ts->loss_sum > (double)ts->seen * MAX_MEAN_LOSS)
    return ampc__error(AMPC_EFORMAT, "checkpoint: %s: 'loss_sum' = %g is more than %g per image of 'seen' = %lld", path, ts->loss_sum,
                       MAX_MEAN_LOSS, (long long)ts->seen);
  AMPC_TRY(jnum_nonneg(path, root, "train_seconds", &ts->train_seconds));
  if (ts->train_seconds > MAX_TRAIN_SECONDS)
    return ampc__error(AMPC_EFORMAT, "checkpoint: %s: 'train_seconds' = %g is more than a run can have trained (%g s, 100 years)",
                       path, ts->train_seconds, MAX_TRAIN_SECONDS);
  /* recorded since data-parallel training: absent in older checkpoints */
  ts->world_size = ts->global_batch = 0;
  if (json_object_get(root, "world_size")) AMPC_TRY(jint_in(path, root, "", "world_size", 1, INT32_MAX, &ts->world_size));
  if (json_object_get(root, "global_batch")) AMPC_TRY(jint_in(path, root, "", "global_batch", 1, MAX_GLOBAL_BATCH, &ts->global_batch));
  /* a resume with another global batch starts at image batch x global_batch */
  if (ts->global_batch > 0 && ts->batch > MAX_IMAGES / ts->global_batch)
    return ampc__error(AMPC_EFORMAT, "checkpoint: %s: 'batch' = %lld of 'global_batch' = %lld images is more than %lld images in an epoch", path,
                       (long long)ts->batch, (long long)ts->global_batch, (long long)MAX_IMAGES);
  /* --amp-report's statistics of the epoch so far: absent where the run did not gather them */
  ts->has_grad_stats = 0;
  ts->grad_values = ts->grad_underflow = 0;
  ts->grad_max_abs = 0.0;
  json_t *gs = json_object_get(root, "grad_stats");
  if (gs) {
    if (!json_is_object(gs)) return ampc__error(AMPC_EFORMAT, "checkpoint: %s: 'grad_stats' is not an object", path);
    AMPC_TRY(jint_in(path, gs, "grad_stats ", "values", 0, MAX_GRAD_VALUES, &ts->grad_values));
    AMPC_TRY(jint_in(path, gs, "grad_stats ", "underflow", 0, ts->grad_values, &ts->grad_underflow));
    json_t *mv = json_object_get(gs, "max_abs");
    double mx = json_number_value(mv);
    if (!json_is_number(mv) || !(mx >= 0) || !(mx <= FLT_MAX))
      return ampc__error(AMPC_EFORMAT, "checkpoint: %s: grad_stats 'max_abs' is %s", path,
                         json_is_number(mv) ? "negative or past the largest f32" : "missing or not a number");
    ts->grad_max_abs = mx;
    ts->has_grad_stats = 1;
  }
  /* the steps since the last step record: absent where there were none */
  ts->log_steps = 0;
  ts->log_loss_sum = 0.0;
  if (json_object_get(root, "log_steps")) {
    AMPC_TRY(jint_in(path, root, "", "log_steps", 1, ts->step, &ts->log_steps));
    json_t *lv = json_object_get(root, "log_loss_sum");
    if (json_is_null(lv)) {
      ts->log_loss_sum = NAN; /* a step whose loss was not finite */
    } else {
      AMPC_TRY(jnum_nonneg(path, root, "log_loss_sum", &ts->log_loss_sum));
      if (ts->log_loss_sum > (double)ts->log_steps * MAX_MEAN_LOSS)
        return ampc__error(AMPC_EFORMAT, "checkpoint: %s: 'log_loss_sum' = %g is more than %g per step of 'log_steps' = %lld", path,
                           ts->log_loss_sum, MAX_MEAN_LOSS, (long long)ts->log_steps);
    }
  }
  ts->seed = (uint64_t)seed;
  return AMPC_OK;
}

/* The optimizer the checkpoint records ("optimizer": one of ampc's, and
 * "optimizer_step": at most "step"), and with opt, that it is opt's kind;
 * *step the recorded step count (0 when none). */
static ampc_status read_optimizer(const char *path, json_t *root, const ampc_optim *opt, int64_t steps, int64_t *step) {
  json_t *v = json_object_get(root, "optimizer");
  const char *name = json_string_value(v);
  ampc_optim_kind kind = AMPC_OPTIM_SGD;
  *step = 0;
  if (v && !name) return ampc__error(AMPC_EFORMAT, "checkpoint: %s: 'optimizer' is not a string", path);
  if (name && (ampc_optim_kind_parse(name, &kind) < 0 || strcmp(name, ampc_optim_kind_name(kind)) != 0))
    return ampc__error(AMPC_EFORMAT, "checkpoint: %s: 'optimizer' is '%.40s', not one of sgd, adam or adamw", path, name);
  if (opt) {
    const char *want = ampc_optim_kind_name(ampc_optim_get_config(opt)->kind);
    if (!name) return ampc__error(AMPC_EFORMAT, "checkpoint: %s: 'optimizer' is missing (saved without optimizer state), the run uses %s", path, want);
    if (strcmp(name, want) != 0)
      return ampc__error(AMPC_EINVAL, "checkpoint: %s: saved with optimizer %s, the run uses %s", path, name, want);
  }
  /* Adam's bias correction counts its steps: never more than the run took */
  if (!opt && !json_object_get(root, "optimizer_step")) return AMPC_OK;
  AMPC_TRY(jint_in(path, root, "", "optimizer_step", 0, INT64_MAX, step));
  if (*step > steps)
    return ampc__error(AMPC_EFORMAT, "checkpoint: %s: 'optimizer_step' = %lld is more than 'step' = %lld", path, (long long)*step, (long long)steps);
  return AMPC_OK;
}

/* The run record of a checkpoint's metadata (root), every entry checked in
 * type and range: the run state, each loss scaler's state (one per loss of
 * c), the preprocessing where recorded, and the optimizer's step (with opt,
 * that the record is of opt's kind). Loading reads it; saving reads back what
 * it is about to write. */
static ampc_status read_run(const char *path, json_t *root, const ampc_amp_config *c, const ampc_optim *opt, run_record *r) {
  memset(r, 0, sizeof *r);
  json_t *scalers = json_object_get(root, "scalers");
  if (!json_is_array(scalers) || json_array_size(scalers) != (size_t)c->num_losses)
    return ampc__error(AMPC_EFORMAT, "checkpoint: %s: %zu loss scalers saved, the run has %d", path, json_array_size(scalers), c->num_losses);
  AMPC_TRY(read_train_state(path, root, &r->ts));
  if (c->num_losses > RUN_MAX_SCALERS)
    return ampc__error(AMPC_EUNSUPPORTED, "checkpoint: %s: more than %d loss scalers", path, RUN_MAX_SCALERS);
  for (int k = 0; k < c->num_losses; k++) {
    json_t *o = json_array_get(scalers, (size_t)k);
    char what[32];
    snprintf(what, sizeof what, "scaler %d: ", k);
    int64_t hl = 0;
    ampc_scaler_state *st = &r->sc[k];
    json_t *sj = json_object_get(o, "scale");
    if (!json_is_number(sj)) return ampc__error(AMPC_EFORMAT, "checkpoint: %s: %s'scale' is missing or not a number", path, what);
    st->scale = (float)json_number_value(sj);
    if (!(st->scale > 0) || !isfinite(st->scale))
      return ampc__error(AMPC_EFORMAT, "checkpoint: %s: %s'scale' = %g is not a positive finite f32", path, what, json_number_value(sj));
    AMPC_TRY(jint_in(path, o, what, "growth_tracker", 0, AMPC_SCALER_MAX_COUNT, &st->growth_tracker));
    AMPC_TRY(jint_in(path, o, what, "hysteresis_left", 1, INT32_MAX, &hl));
    AMPC_TRY(jint_in(path, o, what, "overflows", 0, AMPC_SCALER_MAX_COUNT, &st->overflows));
    AMPC_TRY(jint_in(path, o, what, "skipped_steps", 0, AMPC_SCALER_MAX_COUNT, &st->skipped_steps));
    AMPC_TRY(jint_in(path, o, what, "steps", 0, AMPC_SCALER_MAX_COUNT, &st->steps));
    AMPC_TRY(jint_in(path, o, what, "min_scale_hits", 0, AMPC_SCALER_MAX_COUNT, &st->min_scale_hits));
    st->hysteresis_left = (int)hl;
    /* counters of the same steps: each at most the steps (a part of them), the
     * minimum-scale hits at most the overflows (consecutive ones of them) */
    static const char *const part[] = {"skipped_steps", "overflows", "growth_tracker", "min_scale_hits"};
    const int64_t pv[] = {st->skipped_steps, st->overflows, st->growth_tracker, st->min_scale_hits};
    for (int j = 0; j < 4; j++) {
      int64_t whole = j == 3 ? st->overflows : st->steps;
      if (pv[j] > whole)
        return ampc__error(AMPC_EFORMAT, "checkpoint: %s: %s'%s' = %lld is more than '%s' = %lld", path, what, part[j], (long long)pv[j],
                           j == 3 ? "overflows" : "steps", (long long)whole);
    }
  }
  json_t *pj = json_object_get(root, "preprocessing");
  if (pj) {
    ampc_status s = preprocessing_from_json(pj, &r->ts.preprocessing);
    if (s < 0) return ampc__error_prefix(s, "checkpoint: %s", path);
    r->has_pre = 1;
  }
  return read_optimizer(path, root, opt, r->ts.step, &r->optim_step);
}

ampc_status ampc_checkpoint_load(const char *path, ampc_model *m, ampc_amp *amp, ampc_optim *opt, ampc_train_state *ts) {
  if (!path || !m || !amp)
    return ampc__error(AMPC_EINVAL, "ampc_checkpoint_load: %s is NULL", !path ? "path" : !m ? "model" : "amp");
  ampc_st_file *f;
  AMPC_TRY(ampc_st_open(&f, path));
  ampc_status s = AMPC_OK;
  const char *fmt = ampc_st_metadata(f, "format"), *ver = ampc_st_metadata(f, "format_version"), *js = ampc_st_metadata(f, "ampc");
  json_t *root = NULL;
  if (!fmt || strcmp(fmt, AMPC_CHECKPOINT_FORMAT) != 0 || !js) {
    s = ampc__error(AMPC_EFORMAT, "checkpoint: %s: not an ampc checkpoint (no '%s' format in the metadata)", path, AMPC_CHECKPOINT_FORMAT);
    goto done;
  }
  long long vnum = 0;
  if (!ver || !parse_int_in(ver, NULL, 0, INT32_MAX, &vnum) || vnum != AMPC_CHECKPOINT_VERSION) {
    s = ampc__error(AMPC_EUNSUPPORTED, "checkpoint: %s: format version %s, this ampc reads version %d", path, ver ? ver : "(none)", AMPC_CHECKPOINT_VERSION);
    goto done;
  }
  json_error_t je;
  root = json_loads(js, JSON_REJECT_DUPLICATES, &je);
  if (!root || !json_is_object(root)) {
    s = ampc__error(AMPC_EFORMAT, "checkpoint: %s: malformed metadata: %s", path, root ? "not an object" : je.text);
    goto done;
  }
  const char *model = json_string_value(json_object_get(root, "model"));
  if (!model || strcmp(model, ampc_model_name(m)) != 0) {
    s = ampc__error(AMPC_EINVAL, "checkpoint: %s: saved from model %s, not %s", path, model ? model : "(none)", ampc_model_name(m));
    goto done;
  }
  const ampc_amp_config *c = ampc_amp_get_config(amp);
  json_t *aj = json_object_get(root, "amp");
  const char *lvl = json_string_value(json_object_get(aj, "opt_level")), *half = json_string_value(json_object_get(aj, "half_type"));
  /* (at O0 nothing is half: a half type recorded there is none of the run's) */
  if (!lvl || strcmp(lvl, ampc_opt_level_name(c->opt_level)) != 0 || !half ||
      (c->opt_level != AMPC_OPT_O0 && strcmp(half, ampc_dtype_name(c->half_type)) != 0)) {
    s = ampc__error(AMPC_EINVAL, "checkpoint: %s: saved at opt level %s with half %s, the run uses %s with %s", path,
                    lvl ? lvl : "?", half ? half : "?", ampc_opt_level_name(c->opt_level), ampc_dtype_name(c->half_type));
    goto done;
  }
  /* the shapes it was made for must be the model's, before any tensor is touched */
  const ampc_model_opts *mo = ampc_model_options(m);
  int ic, ih, iw, ik;
  s = ampc_checkpoint_input(f, &ic, &ih, &iw, &ik);
  if (s < 0) {
    ampc__error_prefix(s, "checkpoint");
    goto done;
  }
  if (s == 1 && (ic != mo->channels || ih != mo->height || iw != mo->width || ik != mo->classes)) {
    s = ampc__error(AMPC_EINVAL, "checkpoint: %s: made for %dx%dx%d inputs and %d classes, but the model here takes %dx%dx%d inputs and %d classes",
                    path, ic, ih, iw, ik, mo->channels, mo->height, mo->width, mo->classes);
    goto done;
  }
  run_record rr;
  s = read_run(path, root, c, opt, &rr);
  /* everything checked before anything is changed */
  int masters = ampc_amp_has_master_weights(amp);
  if (s == 0) s = load_model(f, m, amp, 1, 1, masters);
  if (s == 0 && opt) s = load_optim(f, m, amp, opt, 1);
  if (s == 0) s = load_model(f, m, amp, 1, 0, masters);
  if (s == 0 && opt) s = load_optim(f, m, amp, opt, 0);
  if (s < 0 && strncmp(ampc_last_error(), "checkpoint", 10) != 0) ampc__error_prefix(s, "checkpoint");
  if (s == 0 && opt) s = ampc_optim_set_step_count(opt, rr.optim_step);
  for (int k = 0; k < c->num_losses && s == 0; k++) {
    s = ampc_scaler_set_state(ampc_amp_scaler(amp, k), &rr.sc[k]);
    if (s < 0) ampc__error_prefix(s, "checkpoint: %s", path);
  }
  if (s == 0 && ts) {
    if (!rr.has_pre) rr.ts.preprocessing = ts->preprocessing;
    *ts = rr.ts;
  }
done:
  json_decref(root);
  ampc_st_close(f);
  return s;
}
