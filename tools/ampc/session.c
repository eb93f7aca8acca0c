#include "session.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int dataset_kind(const cli_common *c, ampc_dataset_kind *kind, const char **dir) {
  if (ampc_dataset_kind_parse(c->dataset, kind) < 0) {
    cli_lib_error(NULL);
    return -1;
  }
  *dir = c->data ? c->data : ampc_dataset_default_dir(*kind);
  return 0;
}

/* The split's headers (no data read); the limit is the command's. */
static int probe_dataset(const cli_common *c, int train, ampc_dataset_info *info) {
  ampc_dataset_kind kind;
  const char *dir;
  if (dataset_kind(c, &kind, &dir) < 0) return -1;
  size_t limit = (size_t)(train ? c->train_limit : c->test_limit);
  if (ampc_dataset_probe(info, kind, dir, train, limit) < 0) {
    cli_lib_error(NULL);
    return -1;
  }
  return 0;
}

static int open_dataset(const cli_common *c, int train, const ampc_dataset_info *info, ampc_dataset **out) {
  ampc_dataset_kind kind;
  const char *dir;
  if (dataset_kind(c, &kind, &dir) < 0) return -1;
  size_t limit = (size_t)(train ? c->train_limit : c->test_limit);
  if (ampc_dataset_open(out, kind, dir, train, limit) < 0) {
    cli_lib_error(NULL);
    return -1;
  }
  /* the files may have changed since their headers were read */
  if (ampc_dataset_channels(*out) != info->channels || ampc_dataset_height(*out) != info->height ||
      ampc_dataset_width(*out) != info->width || ampc_dataset_classes(*out) != info->classes) {
    cli_error("%s: changed while it was being read", info->images);
    return -1;
  }
  return 0;
}

int cli_session_open(cli_session *s, const cli_common *c, int need_train, int need_test, const int *shape,
                     const ampc_optim_config *ocfg, int64_t batch, const char *weights_flag, const char *weights) {
  memset(s, 0, sizeof *s);
  s->normalize = c->normalize;
  cli_set_threads(c->threads);
  /* everything that can be checked without the data is checked before it is read */
  if (cli_amp_config(c, &s->amp_cfg) < 0) return -1;
  if (!ampc_model_known(c->model)) {
    cli_error("--model: unknown model '%s' (expected one of: %s)", c->model, ampc_model_names());
    return -1;
  }
  if (!(c->label_smoothing >= 0.0f && c->label_smoothing <= 1.0f)) {
    cli_error("--label-smoothing: %g is outside [0, 1]", c->label_smoothing);
    return -1;
  }
  /* the inputs must agree with each other before any of them is read */
  ampc_dataset_info tr, te;
  if (need_train && probe_dataset(c, 1, &tr) < 0) return -1;
  if (need_test && probe_dataset(c, 0, &te) < 0) return -1;
  if (need_train && need_test && ampc_dataset_check_pair(&tr, &te) < 0) {
    cli_lib_error(NULL);
    return -1;
  }
  const ampc_dataset_info *d = need_train ? &tr : need_test ? &te : NULL;
  if (d) {
    s->channels = d->channels;
    s->height = d->height;
    s->width = d->width;
    s->classes = d->classes;
    snprintf(s->shape_from, sizeof s->shape_from, "the %s set %s", d->train ? "training" : "test", d->images);
  } else {
    s->channels = shape[0];
    s->height = shape[1];
    s->width = shape[2];
    s->classes = shape[3];
  }
  if (weights && d && cli_check_weights_input(weights_flag, weights, s->channels, s->height, s->width, s->classes, s->shape_from) < 0) return -1;
  ampc_model_opts mo = {.batch = batch, .channels = s->channels, .height = s->height, .width = s->width,
                        .classes = s->classes, .seed = c->seed, .label_smoothing = c->label_smoothing};
  if (ampc_model_create(&s->model, c->model, &mo) < 0) {
    cli_lib_error("--model");
    return -1;
  }
  s->g = ampc_model_graph(s->model);
  if (c->threads > 0) ampc_graph_set_threads(s->g, c->threads);
  ampc_conv_algo algo = AMPC_CONV_AUTO;
  if (strcmp(c->conv, "im2col") == 0) algo = AMPC_CONV_IM2COL;
  else if (strcmp(c->conv, "winograd") == 0) algo = AMPC_CONV_WINOGRAD;
  else if (strcmp(c->conv, "direct") == 0) algo = AMPC_CONV_DIRECT;
  else if (strcmp(c->conv, "auto") != 0) {
    cli_error("--conv: unknown algorithm '%s' (expected auto, im2col, winograd or direct)", c->conv);
    return -1;
  }
  ampc_graph_set_conv_algo(s->g, algo);
  if (ocfg && ampc_optim_create(&s->opt, ocfg, ampc_graph_param_numel(s->g)) < 0) {
    cli_lib_error("optimizer");
    return -1;
  }
  if (ampc_amp_initialize(&s->amp, s->g, s->opt, &s->amp_cfg) < 0) {
    cli_lib_error(NULL);
    return -1;
  }
  ampc_amp_set_clip_grad_norm(s->amp, c->clip_grad_norm);
  ampc_amp_set_stochastic_rounding(s->amp, c->stochastic_rounding, c->seed);
  if (need_train && open_dataset(c, 1, &tr, &s->train) < 0) return -1;
  if (need_test && open_dataset(c, 0, &te, &s->test) < 0) return -1;
  return 0;
}

void cli_session_close(cli_session *s) {
  ampc_amp_free(s->amp);
  ampc_optim_free(s->opt);
  ampc_model_free(s->model);
  ampc_dataset_free(s->train);
  ampc_dataset_free(s->test);
  memset(s, 0, sizeof *s);
}

static int shape_matches(const ampc_st_tensor *t, const ampc_tensor *v) {
  int64_t n = 1;
  for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
  if (n != ampc_tensor_numel(v)) return 0;
  if (t->ndim != v->shape.ndim) return 0;
  for (int i = 0; i < t->ndim; i++)
    if (t->shape[i] != v->shape.d[i]) return 0;
  return 1;
}

int cli_load_weights(cli_session *s, const char *path) {
  ampc_st_file *f;
  if (ampc_st_open(&f, path) < 0) {
    cli_lib_error(NULL);
    return -1;
  }
  size_t numel = ampc_graph_param_numel(s->g);
  float *vals = malloc((numel ? numel : 1) * sizeof *vals);
  int rc = vals ? 0 : -1;
  if (!vals) cli_error("out of memory");
  size_t used = 0;
  for (size_t i = 0; rc == 0 && i < ampc_graph_param_count(s->g); i++) {
    ampc_value v = ampc_graph_param_at(s->g, i);
    const char *name = ampc_graph_name(s->g, v);
    char mname[256];
    snprintf(mname, sizeof mname, "master.%s", name);
    /* a checkpoint's f32 master copy is the exact value; the model copy may be half */
    const ampc_st_tensor *t = ampc_st_find(f, mname);
    if (!t) t = ampc_st_find(f, name);
    ampc_tensor tv = ampc_graph_tensor(s->g, v);
    if (!t) {
      cli_error("%s: missing tensor '%s' for model %s", path, name, ampc_model_name(s->model));
      rc = -1;
    } else if (!shape_matches(t, &tv)) {
      char sh[64];
      cli_error("%s: tensor '%s' has the wrong shape for model %s (expected %s for %dx%dx%d inputs and %d classes%s%s)", path, name,
                ampc_model_name(s->model), ampc_shape_str(&tv.shape, sh, sizeof sh), s->channels, s->height, s->width, s->classes,
                s->shape_from[0] ? ", from " : "", s->shape_from);
      rc = -1;
    } else if (ampc_st_read_f32(t, vals + ampc_graph_param_offset(s->g, v), (size_t)ampc_tensor_numel(&tv)) < 0) {
      cli_lib_error(NULL);
      rc = -1;
    }
    used++;
  }
  for (size_t i = 0; rc == 0 && i < ampc_graph_buffer_count(s->g); i++) {
    ampc_value v = ampc_graph_buffer_at(s->g, i);
    const char *name = ampc_graph_name(s->g, v);
    const ampc_st_tensor *t = ampc_st_find(f, name);
    ampc_tensor tv = ampc_graph_tensor(s->g, v);
    if (!t) {
      cli_error("%s: missing tensor '%s' for model %s", path, name, ampc_model_name(s->model));
      rc = -1;
      break;
    }
    used++;
    int64_t n = ampc_tensor_numel(&tv);
    if (ampc_st_numel(t) != n) {
      cli_error("%s: tensor '%s' has the wrong shape for model %s", path, name, ampc_model_name(s->model));
      rc = -1;
    } else if (tv.dtype == AMPC_DTYPE_I64) {
      int32_t tmp;
      if (ampc_st_read_i32(t, &tmp, 1) < 0) {
        cli_lib_error(NULL);
        rc = -1;
      } else {
        *(int64_t *)tv.data = tmp;
      }
    } else if (ampc_st_read_f32(t, tv.data, (size_t)n) < 0) {
      cli_lib_error(NULL);
      rc = -1;
    }
  }
  if (rc == 0) {
    /* anything else must belong to a checkpoint's own sections */
    for (size_t i = 0; i < ampc_st_count(f); i++) {
      const char *name = ampc_st_get(f, i)->name;
      if (ampc_graph_find(s->g, name) >= 0 || strncmp(name, "master.", 7) == 0 || strncmp(name, "optim.", 6) == 0) continue;
      cli_error("%s: unexpected tensor '%s' for model %s", path, name, ampc_model_name(s->model));
      rc = -1;
      break;
    }
  }
  if (rc == 0) ampc_amp_load_params(s->amp, vals);
  free(vals);
  ampc_st_close(f);
  return rc;
}

int cli_save_weights(cli_session *s, const char *path, const char *const *meta) {
  size_t np = ampc_graph_param_count(s->g), nb = ampc_graph_buffer_count(s->g), numel = ampc_graph_param_numel(s->g);
  ampc_st_tensor *ts = calloc(np + nb, sizeof *ts);
  float *vals = malloc((numel ? numel : 1) * sizeof *vals);
  if (!ts || !vals) {
    free(ts);
    free(vals);
    cli_error("out of memory");
    return -1;
  }
  ampc_amp_param_values(s->amp, vals);
  size_t k = 0;
  for (size_t i = 0; i < np + nb; i++) {
    ampc_value v = i < np ? ampc_graph_param_at(s->g, i) : ampc_graph_buffer_at(s->g, i - np);
    ampc_tensor t = ampc_graph_tensor(s->g, v);
    ampc_st_tensor *o = &ts[k++];
    o->name = ampc_graph_name(s->g, v);
    o->ndim = t.shape.ndim;
    for (int d = 0; d < t.shape.ndim; d++) o->shape[d] = t.shape.d[d];
    if (i < np) {
      o->dtype = AMPC_DTYPE_F32;
      o->data = vals + ampc_graph_param_offset(s->g, v);
      o->nbytes = (size_t)ampc_tensor_numel(&t) * 4;
    } else {
      o->dtype = t.dtype;
      o->data = t.data;
      o->nbytes = ampc_tensor_nbytes(&t);
    }
  }
  /* the caller's metadata, then the shapes the weights were made for */
  const char *all[16];
  char input[64], classes[16];
  snprintf(input, sizeof input, "%dx%dx%d", s->channels, s->height, s->width);
  snprintf(classes, sizeof classes, "%d", s->classes);
  size_t m = 0;
  for (; meta && meta[m] && m < 10; m += 2) {
    all[m] = meta[m];
    all[m + 1] = meta[m + 1];
  }
  all[m++] = "input";
  all[m++] = input;
  all[m++] = "classes";
  all[m++] = classes;
  all[m] = NULL;
  int rc = ampc_st_write(path, ts, k, all) < 0 ? -1 : 0;
  if (rc) cli_lib_error(NULL);
  free(ts);
  free(vals);
  return rc;
}

int cli_evaluate(cli_session *s, const ampc_dataset *d, double *loss, double *acc) {
  /* the loader writes images of the data's shape into the model's input */
  const ampc_model_opts *mo = ampc_model_options(s->model);
  if (ampc_dataset_channels(d) != mo->channels || ampc_dataset_height(d) != mo->height ||
      ampc_dataset_width(d) != mo->width || ampc_dataset_classes(d) > mo->classes) {
    cli_error("the data to evaluate has %dx%dx%d images and %d classes, the model takes %dx%dx%d and %d", ampc_dataset_channels(d),
              ampc_dataset_height(d), ampc_dataset_width(d), ampc_dataset_classes(d), mo->channels, mo->height, mo->width, mo->classes);
    return -1;
  }
  ampc_loader_opts lo;
  ampc_loader_opts_default(&lo);
  lo.batch_size = (int)ampc_graph_max_batch(s->g);
  lo.shuffle = 0;
  lo.normalize = s->normalize;
  ampc_value xv = ampc_model_input(s->model), yv = ampc_model_labels(s->model);
  lo.dtype = ampc_graph_tensor(s->g, xv).dtype;
  ampc_loader *l;
  if (ampc_loader_create(&l, d, &lo) < 0 || ampc_loader_start_epoch(l, 0, 0) < 0) {
    cli_lib_error(NULL);
    return -1;
  }
  double total = 0.0;
  int64_t correct = 0, seen = 0;
  int rc = 0;
  for (;;) {
    ampc_graph_set_batch(s->g, ampc_graph_max_batch(s->g));
    int n = 0;
    ampc_tensor x = ampc_graph_tensor(s->g, xv), y = ampc_graph_tensor(s->g, yv);
    if (ampc_loader_next(l, x.data, y.data, &n) < 0) {
      cli_lib_error(NULL);
      rc = -1;
      break;
    }
    if (n == 0) break;
    ampc_graph_set_batch(s->g, n);
    if (ampc_amp_forward(s->amp, 0) < 0) {
      cli_lib_error(NULL);
      rc = -1;
      break;
    }
    ampc_tensor lt = ampc_graph_tensor(s->g, ampc_model_loss(s->model));
    total += (double)*(float *)lt.data * n;
    ampc_tensor lg = ampc_graph_tensor(s->g, ampc_model_logits(s->model));
    int64_t K = lg.shape.d[1];
    float row[1024];
    const int32_t *lab = y.data;
    for (int i = 0; i < n; i++) {
      int64_t kk = K < 1024 ? K : 1024;
      ampc_load_f32(row, lg.dtype, (char *)lg.data + (size_t)(i * K) * ampc_dtype_size(lg.dtype), (size_t)kk);
      int64_t best = 0;
      for (int64_t j = 1; j < kk; j++)
        if (row[j] > row[best]) best = j;
      correct += best == lab[i];
    }
    seen += n;
  }
  ampc_loader_free(l);
  ampc_graph_set_batch(s->g, ampc_graph_max_batch(s->g));
  if (rc == 0) {
    *loss = seen ? total / (double)seen : NAN;
    *acc = seen ? (double)correct / (double)seen : NAN;
  }
  return rc;
}
