/* Checkpoints: model, masters, optimizer and run state in one safetensors file. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ampc/checkpoint.h"
#include "ampc/safetensors.h"
#include "core/status_internal.h"

typedef struct {
  ampc_st_tensor *t;
  char **names;
  size_t n, cap;
} tlist;

static int tl_add(tlist *l, const char *prefix, const char *name, ampc_dtype dt, const ampc_shape *s, const void *data, size_t nbytes) {
  if (l->n == l->cap) {
    size_t cap = l->cap ? l->cap * 2 : 256;
    ampc_st_tensor *t = realloc(l->t, cap * sizeof *t);
    if (!t) return -1;
    l->t = t;
    char **nm = realloc(l->names, cap * sizeof *nm);
    if (!nm) return -1;
    l->names = nm;
    l->cap = cap;
  }
  size_t len = strlen(prefix) + strlen(name) + 1;
  char *full = malloc(len);
  if (!full) return -1;
  snprintf(full, len, "%s%s", prefix, name);
  l->names[l->n] = full;
  ampc_st_tensor *t = &l->t[l->n++];
  memset(t, 0, sizeof *t);
  t->name = full;
  t->dtype = dt;
  t->ndim = s->ndim;
  for (int i = 0; i < s->ndim; i++) t->shape[i] = s->d[i];
  t->data = data;
  t->nbytes = nbytes;
  return 0;
}

static void tl_free(tlist *l) {
  for (size_t i = 0; i < l->n; i++) free(l->names[i]);
  free(l->names);
  free(l->t);
}

static json_t *amp_json(const ampc_amp_config *c) {
  return json_pack("{s:s, s:s, s:s, s:b, s:i, s:i, s:b, s:f, s:f, s:f, s:i, s:f, s:f, s:i, s:b, s:i}",
                   "opt_level", ampc_opt_level_name(c->opt_level), "half_type", ampc_dtype_name(c->half_type),
                   "cast_model_type", ampc_dtype_name(c->cast_model_type), "autocast", c->autocast,
                   "keep_batchnorm_fp32", c->keep_batchnorm_fp32, "master_weights", c->master_weights,
                   "loss_scale_dynamic", c->loss_scale_dynamic, "loss_scale", (double)c->loss_scale,
                   "min_loss_scale", (double)c->min_loss_scale, "max_loss_scale", (double)c->max_loss_scale,
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

static void preprocessing_from_json(json_t *o, ampc_preprocessing *p) {
  const char *ds = json_string_value(json_object_get(o, "dataset"));
  json_t *shape = json_object_get(o, "shape"), *mean = json_object_get(o, "mean"), *std = json_object_get(o, "std");
  if (!ds || !json_is_array(shape) || json_array_size(shape) != 3 || !json_is_array(mean) || !json_is_array(std)) return;
  memset(p, 0, sizeof *p);
  snprintf(p->dataset, sizeof p->dataset, "%s", ds);
  p->normalize = json_is_true(json_object_get(o, "normalize"));
  p->channels = (int)json_integer_value(json_array_get(shape, 0));
  p->height = (int)json_integer_value(json_array_get(shape, 1));
  p->width = (int)json_integer_value(json_array_get(shape, 2));
  for (int c = 0; c < 3; c++) {
    p->mean[c] = c < (int)json_array_size(mean) ? (float)json_number_value(json_array_get(mean, (size_t)c)) : 0.0f;
    p->std[c] = c < (int)json_array_size(std) ? (float)json_number_value(json_array_get(std, (size_t)c)) : 1.0f;
  }
}

ampc_status ampc_checkpoint_save(const char *path, ampc_model *m, ampc_amp *amp, ampc_optim *opt, const ampc_train_state *ts) {
  ampc_graph *g = ampc_model_graph(m);
  tlist l = {0};
  int bad = 0;
  size_t np = ampc_graph_param_count(g);
  for (size_t i = 0; i < np && !bad; i++) {
    ampc_value v = ampc_graph_param_at(g, i);
    ampc_tensor t = ampc_graph_tensor(g, v);
    bad = tl_add(&l, "", ampc_graph_name(g, v), t.dtype, &t.shape, t.data, ampc_tensor_nbytes(&t));
  }
  for (size_t i = 0; i < ampc_graph_buffer_count(g) && !bad; i++) {
    ampc_value v = ampc_graph_buffer_at(g, i);
    ampc_tensor t = ampc_graph_tensor(g, v);
    bad = tl_add(&l, "", ampc_graph_name(g, v), t.dtype, &t.shape, t.data, ampc_tensor_nbytes(&t));
  }
  float *master = ampc_amp_master_weights(amp);
  for (size_t i = 0; master && i < np && !bad; i++) {
    ampc_value v = ampc_graph_param_at(g, i);
    ampc_tensor t = ampc_graph_tensor(g, v);
    bad = tl_add(&l, "master.", ampc_graph_name(g, v), AMPC_DTYPE_F32, &t.shape, master + ampc_graph_param_offset(g, v), (size_t)ampc_tensor_numel(&t) * 4);
  }
  for (size_t k = 0; opt && k < ampc_optim_state_count(opt) && !bad; k++) {
    const char *sname;
    float *data;
    ampc_optim_state_get(opt, k, &sname, &data);
    char prefix[64];
    snprintf(prefix, sizeof prefix, "optim.%s.", sname);
    for (size_t i = 0; i < np && !bad; i++) {
      ampc_value v = ampc_graph_param_at(g, i);
      ampc_tensor t = ampc_graph_tensor(g, v);
      bad = tl_add(&l, prefix, ampc_graph_name(g, v), AMPC_DTYPE_F32, &t.shape, data + ampc_graph_param_offset(g, v), (size_t)ampc_tensor_numel(&t) * 4);
    }
  }
  if (bad) {
    tl_free(&l);
    return ampc__error(AMPC_ENOMEM, "checkpoint: out of memory");
  }
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
                           "batch", (json_int_t)ts->batch, "step", (json_int_t)ts->step, "loss_sum", ts->loss_sum,
                           "seen", (json_int_t)ts->seen, "skipped", (json_int_t)ts->skipped,
                           "skipped_total", (json_int_t)ts->skipped_total, "train_seconds", ts->train_seconds);
  if (root && ts->preprocessing.dataset[0]) json_object_set_new(root, "preprocessing", preprocessing_json(&ts->preprocessing));
  if (opt) {
    json_object_set_new(root, "optimizer", json_string(ampc_optim_kind_name(ampc_optim_get_config(opt)->kind)));
    json_object_set_new(root, "optimizer_step", json_integer((json_int_t)ampc_optim_step_count(opt)));
  }
  char *js = root ? json_dumps(root, JSON_COMPACT | JSON_SORT_KEYS | JSON_REAL_PRECISION(17)) : NULL;
  json_decref(root);
  if (!js) {
    tl_free(&l);
    return ampc__error(AMPC_ENOMEM, "checkpoint: out of memory");
  }
  char ver[16];
  snprintf(ver, sizeof ver, "%d", AMPC_CHECKPOINT_VERSION);
  const char *meta[] = {"format", AMPC_CHECKPOINT_FORMAT, "format_version", ver, "ampc", js, NULL};
  ampc_status s = ampc_st_write(path, l.t, l.n, meta);
  free(js);
  tl_free(&l);
  return s;
}

static ampc_status restore_tensor(const char *path, const ampc_st_file *f, const char *name, ampc_tensor *t) {
  const ampc_st_tensor *s = ampc_st_find(f, name);
  if (!s) return ampc__error(AMPC_EFORMAT, "checkpoint: %s: missing tensor '%s'", path, name);
  if (ampc_st_numel(s) != ampc_tensor_numel(t))
    return ampc__error(AMPC_EFORMAT, "checkpoint: %s: tensor '%s' has %lld values, the model has %lld", path, name,
                       (long long)ampc_st_numel(s), (long long)ampc_tensor_numel(t));
  if (s->dtype == t->dtype) {
    memcpy(t->data, s->data, ampc_tensor_nbytes(t));
    return AMPC_OK;
  }
  if (!ampc_dtype_is_float(t->dtype)) return ampc__error(AMPC_EFORMAT, "checkpoint: %s: tensor '%s' is %s, expected %s", path, name, ampc_dtype_name(s->dtype), ampc_dtype_name(t->dtype));
  size_t n = (size_t)ampc_tensor_numel(t);
  float *tmp = malloc((n ? n : 1) * sizeof *tmp);
  if (!tmp) return ampc__error(AMPC_ENOMEM, "checkpoint: out of memory");
  ampc_status st = ampc_st_read_f32(s, tmp, n);
  if (st == 0) ampc_store_f32(t->dtype, t->data, tmp, n);
  free(tmp);
  return st;
}

static int64_t jint(json_t *o, const char *k) { return (int64_t)json_integer_value(json_object_get(o, k)); }

ampc_status ampc_checkpoint_load(const char *path, ampc_model *m, ampc_amp *amp, ampc_optim *opt, ampc_train_state *ts) {
  ampc_st_file *f;
  AMPC_TRY(ampc_st_open(&f, path));
  ampc_graph *g = ampc_model_graph(m);
  ampc_status s = AMPC_OK;
  const char *fmt = ampc_st_metadata(f, "format"), *ver = ampc_st_metadata(f, "format_version"), *js = ampc_st_metadata(f, "ampc");
  json_t *root = NULL;
  if (!fmt || strcmp(fmt, AMPC_CHECKPOINT_FORMAT) != 0 || !js) {
    s = ampc__error(AMPC_EFORMAT, "checkpoint: %s: not an ampc checkpoint (no '%s' format in the metadata)", path, AMPC_CHECKPOINT_FORMAT);
    goto done;
  }
  if (!ver || atoi(ver) != AMPC_CHECKPOINT_VERSION) {
    s = ampc__error(AMPC_EUNSUPPORTED, "checkpoint: %s: format version %s, this ampc reads version %d", path, ver ? ver : "(none)", AMPC_CHECKPOINT_VERSION);
    goto done;
  }
  json_error_t je;
  root = json_loads(js, 0, &je);
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
  if (!lvl || strcmp(lvl, ampc_opt_level_name(c->opt_level)) != 0 || !half || strcmp(half, ampc_dtype_name(c->half_type)) != 0) {
    s = ampc__error(AMPC_EINVAL, "checkpoint: %s: saved at opt level %s with half %s, the run uses %s with %s", path,
                    lvl ? lvl : "?", half ? half : "?", ampc_opt_level_name(c->opt_level), ampc_dtype_name(c->half_type));
    goto done;
  }
  json_t *scalers = json_object_get(root, "scalers");
  if (!json_is_array(scalers) || (int)json_array_size(scalers) != c->num_losses) {
    s = ampc__error(AMPC_EFORMAT, "checkpoint: %s: %zu loss scalers saved, the run has %d", path, json_array_size(scalers), c->num_losses);
    goto done;
  }
  size_t np = ampc_graph_param_count(g);
  for (size_t i = 0; i < np && s == 0; i++) {
    ampc_value v = ampc_graph_param_at(g, i);
    ampc_tensor t = ampc_graph_tensor(g, v);
    s = restore_tensor(path, f, ampc_graph_name(g, v), &t);
  }
  for (size_t i = 0; i < ampc_graph_buffer_count(g) && s == 0; i++) {
    ampc_value v = ampc_graph_buffer_at(g, i);
    ampc_tensor t = ampc_graph_tensor(g, v);
    s = restore_tensor(path, f, ampc_graph_name(g, v), &t);
  }
  float *master = ampc_amp_master_weights(amp);
  for (size_t i = 0; master && i < np && s == 0; i++) {
    ampc_value v = ampc_graph_param_at(g, i);
    ampc_tensor t = ampc_graph_tensor(g, v);
    char name[256];
    snprintf(name, sizeof name, "master.%s", ampc_graph_name(g, v));
    ampc_tensor mt = {master + ampc_graph_param_offset(g, v), AMPC_DTYPE_F32, t.shape};
    s = restore_tensor(path, f, name, &mt);
  }
  for (size_t k = 0; opt && k < ampc_optim_state_count(opt) && s == 0; k++) {
    const char *sname;
    float *data;
    ampc_optim_state_get(opt, k, &sname, &data);
    for (size_t i = 0; i < np && s == 0; i++) {
      ampc_value v = ampc_graph_param_at(g, i);
      ampc_tensor t = ampc_graph_tensor(g, v);
      char name[256];
      snprintf(name, sizeof name, "optim.%s.%s", sname, ampc_graph_name(g, v));
      ampc_tensor ot = {data + ampc_graph_param_offset(g, v), AMPC_DTYPE_F32, t.shape};
      s = restore_tensor(path, f, name, &ot);
    }
  }
  if (s == 0 && opt) s = ampc_optim_set_step_count(opt, jint(root, "optimizer_step"));
  for (int k = 0; k < c->num_losses && s == 0; k++) {
    json_t *o = json_array_get(scalers, (size_t)k);
    ampc_scaler_state st = {
        .scale = (float)json_number_value(json_object_get(o, "scale")),
        .growth_tracker = jint(o, "growth_tracker"),
        .hysteresis_left = (int)jint(o, "hysteresis_left"),
        .overflows = jint(o, "overflows"),
        .skipped_steps = jint(o, "skipped_steps"),
        .steps = jint(o, "steps"),
        .min_scale_hits = jint(o, "min_scale_hits"),
    };
    s = ampc_scaler_set_state(ampc_amp_scaler(amp, k), &st);
    if (s < 0) ampc__error_prefix(s, "checkpoint: %s", path);
  }
  if (s == 0 && ts) {
    ts->seed = (uint64_t)jint(root, "seed");
    ts->epoch = jint(root, "epoch");
    ts->batch = jint(root, "batch");
    ts->step = jint(root, "step");
    ts->loss_sum = json_number_value(json_object_get(root, "loss_sum"));
    ts->seen = jint(root, "seen");
    ts->skipped = jint(root, "skipped");
    ts->skipped_total = jint(root, "skipped_total");
    ts->train_seconds = json_number_value(json_object_get(root, "train_seconds"));
    preprocessing_from_json(json_object_get(root, "preprocessing"), &ts->preprocessing);
  }
done:
  json_decref(root);
  ampc_st_close(f);
  return s;
}
