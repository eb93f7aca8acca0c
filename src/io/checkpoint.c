/* Checkpoints: model, masters, optimizer and run state in one safetensors file. */
#include <jansson.h>
#include <math.h>
#include <stdint.h>
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
  char ver[16], input[64], classes[16];
  snprintf(ver, sizeof ver, "%d", AMPC_CHECKPOINT_VERSION);
  const ampc_model_opts *mo = ampc_model_options(m);
  snprintf(input, sizeof input, "%dx%dx%d", mo->channels, mo->height, mo->width);
  snprintf(classes, sizeof classes, "%d", mo->classes);
  const char *meta[] = {"format", AMPC_CHECKPOINT_FORMAT, "format_version", ver, "ampc", js,
                        "input", input, "classes", classes, NULL};
  ampc_status s = ampc_st_write(path, l.t, l.n, meta);
  free(js);
  tl_free(&l);
  return s;
}

/* Checks (check_only) or restores one tensor of the model from the file: it
 * must be there with the model's exact shape, in the model's type or (for a
 * float tensor) a float type it converts from. */
static ampc_status restore_tensor(const char *path, const ampc_st_file *f, const char *name, ampc_tensor *t, int check_only) {
  const ampc_st_tensor *s = ampc_st_find(f, name);
  if (!s) return ampc__error(AMPC_EFORMAT, "checkpoint: %s: missing tensor '%s'", path, name);
  int same = s->ndim == t->shape.ndim;
  for (int i = 0; same && i < s->ndim; i++) same = s->shape[i] == t->shape.d[i];
  if (!same) {
    char want[96];
    ampc_shape got = {.ndim = s->ndim < AMPC_MAX_DIMS ? s->ndim : AMPC_MAX_DIMS};
    for (int i = 0; i < got.ndim; i++) got.d[i] = s->shape[i];
    char have[96];
    return ampc__error(AMPC_EFORMAT, "checkpoint: %s: tensor '%s' is %s%s, the model's is %s", path, name,
                       ampc_shape_str(&got, have, sizeof have), s->ndim > AMPC_MAX_DIMS ? "..." : "",
                       ampc_shape_str(&t->shape, want, sizeof want));
  }
  if (s->dtype != t->dtype && (!ampc_dtype_is_float(t->dtype) || !ampc_dtype_is_float(s->dtype)))
    return ampc__error(AMPC_EFORMAT, "checkpoint: %s: tensor '%s' is %s, expected %s", path, name, ampc_dtype_name(s->dtype), ampc_dtype_name(t->dtype));
  if (s->dtype == t->dtype) {
    if (!check_only) memcpy(t->data, s->data, ampc_tensor_nbytes(t));
    return AMPC_OK;
  }
  /* a conversion can fail (an f64 beyond f32's range): the check converts too */
  size_t n = (size_t)ampc_tensor_numel(t);
  float *tmp = malloc((n ? n : 1) * sizeof *tmp);
  if (!tmp) return ampc__error(AMPC_ENOMEM, "checkpoint: out of memory");
  ampc_status st = ampc_st_read_f32(s, tmp, n);
  if (st < 0) ampc__error_prefix(st, "checkpoint: %s", path);
  else if (!check_only) ampc_store_f32(t->dtype, t->data, tmp, n);
  free(tmp);
  return st;
}

/* Every tensor the run needs, checked (check_only) or restored. */
static ampc_status restore_tensors(const char *path, const ampc_st_file *f, ampc_model *m, ampc_amp *amp, ampc_optim *opt, int check_only) {
  ampc_graph *g = ampc_model_graph(m);
  ampc_status s = AMPC_OK;
  size_t np = ampc_graph_param_count(g);
  for (size_t i = 0; i < np && s == 0; i++) {
    ampc_value v = ampc_graph_param_at(g, i);
    ampc_tensor t = ampc_graph_tensor(g, v);
    s = restore_tensor(path, f, ampc_graph_name(g, v), &t, check_only);
  }
  for (size_t i = 0; i < ampc_graph_buffer_count(g) && s == 0; i++) {
    ampc_value v = ampc_graph_buffer_at(g, i);
    ampc_tensor t = ampc_graph_tensor(g, v);
    s = restore_tensor(path, f, ampc_graph_name(g, v), &t, check_only);
  }
  float *master = ampc_amp_master_weights(amp);
  for (size_t i = 0; master && i < np && s == 0; i++) {
    ampc_value v = ampc_graph_param_at(g, i);
    ampc_tensor t = ampc_graph_tensor(g, v);
    char name[256];
    snprintf(name, sizeof name, "master.%s", ampc_graph_name(g, v));
    ampc_tensor mt = {master + ampc_graph_param_offset(g, v), AMPC_DTYPE_F32, t.shape};
    s = restore_tensor(path, f, name, &mt, check_only);
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
      s = restore_tensor(path, f, name, &ot, check_only);
    }
  }
  return s;
}

/* A decimal integer in [lo, hi] spanning the whole of [p, end) (end NULL: to the NUL). */
static int parse_int_in(const char *p, const char *end, long long lo, long long hi, long long *out) {
  if (!end) end = p + strlen(p);
  if (p == end || end - p > 19) return 0;
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

/* Every number of the run state, range-checked in its full width before any is used. */
static ampc_status read_train_state(const char *path, json_t *root, ampc_train_state *ts) {
  int64_t seed = 0;
  AMPC_TRY(jint_in(path, root, "", "seed", 0, INT64_MAX, &seed));
  AMPC_TRY(jint_in(path, root, "", "epoch", 0, INT64_MAX, &ts->epoch));
  AMPC_TRY(jint_in(path, root, "", "batch", 0, INT64_MAX, &ts->batch));
  AMPC_TRY(jint_in(path, root, "", "step", 0, INT64_MAX, &ts->step));
  AMPC_TRY(jint_in(path, root, "", "seen", 0, INT64_MAX, &ts->seen));
  AMPC_TRY(jint_in(path, root, "", "skipped_total", 0, ts->step, &ts->skipped_total));
  AMPC_TRY(jint_in(path, root, "", "skipped", 0, ts->skipped_total, &ts->skipped));
  AMPC_TRY(jnum_nonneg(path, root, "loss_sum", &ts->loss_sum));
  AMPC_TRY(jnum_nonneg(path, root, "train_seconds", &ts->train_seconds));
  ts->seed = (uint64_t)seed;
  return AMPC_OK;
}

ampc_status ampc_checkpoint_load(const char *path, ampc_model *m, ampc_amp *amp, ampc_optim *opt, ampc_train_state *ts) {
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
  s = AMPC_OK;
  json_t *scalers = json_object_get(root, "scalers");
  if (!json_is_array(scalers) || json_array_size(scalers) != (size_t)c->num_losses) {
    s = ampc__error(AMPC_EFORMAT, "checkpoint: %s: %zu loss scalers saved, the run has %d", path, json_array_size(scalers), c->num_losses);
    goto done;
  }
  ampc_train_state st_read;
  s = read_train_state(path, root, &st_read);
  if (s < 0) goto done;
  ampc_scaler_state sc_read[8];
  if (c->num_losses > 8) {
    s = ampc__error(AMPC_EUNSUPPORTED, "checkpoint: %s: more than 8 loss scalers", path);
    goto done;
  }
  for (int k = 0; k < c->num_losses && s == 0; k++) {
    json_t *o = json_array_get(scalers, (size_t)k);
    char what[32];
    snprintf(what, sizeof what, "scaler %d: ", k);
    int64_t hl = 0;
    ampc_scaler_state *st = &sc_read[k];
    json_t *sj = json_object_get(o, "scale");
    if (!json_is_number(sj)) {
      s = ampc__error(AMPC_EFORMAT, "checkpoint: %s: %s'scale' is missing or not a number", path, what);
      break;
    }
    st->scale = (float)json_number_value(sj);
    if (!(st->scale > 0) || !isfinite(st->scale)) {
      s = ampc__error(AMPC_EFORMAT, "checkpoint: %s: %s'scale' = %g is not a positive finite f32", path, what, json_number_value(sj));
      break;
    }
    if (s == 0) s = jint_in(path, o, what, "growth_tracker", 0, INT64_MAX, &st->growth_tracker);
    if (s == 0) s = jint_in(path, o, what, "hysteresis_left", 1, INT32_MAX, &hl);
    if (s == 0) s = jint_in(path, o, what, "overflows", 0, INT64_MAX, &st->overflows);
    if (s == 0) s = jint_in(path, o, what, "skipped_steps", 0, INT64_MAX, &st->skipped_steps);
    if (s == 0) s = jint_in(path, o, what, "steps", 0, INT64_MAX, &st->steps);
    if (s == 0) s = jint_in(path, o, what, "min_scale_hits", 0, INT64_MAX, &st->min_scale_hits);
    st->hysteresis_left = (int)hl;
  }
  if (s < 0) goto done;
  int64_t optim_step = 0;
  if (opt) s = jint_in(path, root, "", "optimizer_step", 0, INT64_MAX, &optim_step);
  /* everything checked before anything is changed */
  if (s == 0) s = restore_tensors(path, f, m, amp, opt, 1);
  if (s == 0) s = restore_tensors(path, f, m, amp, opt, 0);
  if (s == 0 && opt) s = ampc_optim_set_step_count(opt, optim_step);
  for (int k = 0; k < c->num_losses && s == 0; k++) {
    s = ampc_scaler_set_state(ampc_amp_scaler(amp, k), &sc_read[k]);
    if (s < 0) ampc__error_prefix(s, "checkpoint: %s", path);
  }
  if (s == 0 && ts) *ts = st_read;
done:
  json_decref(root);
  ampc_st_close(f);
  return s;
}
