#include "session.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int open_dataset(const cli_common *c, int train, ampc_dataset **out) {
  ampc_dataset_kind kind;
  if (ampc_dataset_kind_parse(c->dataset, &kind) < 0) {
    cli_lib_error(NULL);
    return -1;
  }
  const char *dir = c->data_dir ? c->data_dir : ampc_dataset_default_dir(kind);
  size_t limit = (size_t)(train ? c->train_limit : c->test_limit);
  if (ampc_dataset_open(out, kind, dir, train, limit) < 0) {
    cli_lib_error(NULL);
    return -1;
  }
  return 0;
}

int cli_session_open(cli_session *s, const cli_common *c, int need_train, int need_test, const int *shape,
                     const ampc_optim_config *ocfg, int64_t batch) {
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
  if (need_train && open_dataset(c, 1, &s->train) < 0) return -1;
  if (need_test && open_dataset(c, 0, &s->test) < 0) return -1;
  const ampc_dataset *d = s->train ? s->train : s->test;
  if (d) {
    s->channels = ampc_dataset_channels(d);
    s->height = ampc_dataset_height(d);
    s->width = ampc_dataset_width(d);
    s->classes = ampc_dataset_classes(d);
  } else {
    s->channels = shape[0];
    s->height = shape[1];
    s->width = shape[2];
    s->classes = shape[3];
  }
  ampc_model_opts mo = {.batch = batch, .channels = s->channels, .height = s->height, .width = s->width,
                        .classes = s->classes, .seed = c->seed, .label_smoothing = c->label_smoothing};
  if (ampc_model_create(&s->model, c->model, &mo) < 0) {
    cli_lib_error("--model");
    return -1;
  }
  s->g = ampc_model_graph(s->model);
  ampc_backend_opts bo;
  ampc_backend_opts_default(&bo);
  bo.threads = c->threads;
  if (strcmp(c->conv, "im2col") == 0) bo.conv = AMPC_CONV_IM2COL;
  else if (strcmp(c->conv, "winograd") == 0) bo.conv = AMPC_CONV_WINOGRAD;
  else if (strcmp(c->conv, "direct") == 0) bo.conv = AMPC_CONV_DIRECT;
  else if (strcmp(c->conv, "auto") != 0) {
    cli_error("--conv: unknown algorithm '%s' (expected auto, im2col, winograd or direct)", c->conv);
    return -1;
  }
  if (ampc_graph_set_backend(s->g, c->device, &bo) < 0) {
    cli_lib_error("--device");
    return -1;
  }
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

int cli_load_weights(cli_session *s, const char *path) {
  if (ampc_checkpoint_load_weights(path, s->model, s->amp) < 0) {
    cli_lib_error(NULL);
    return -1;
  }
  return 0;
}

int cli_save_weights(cli_session *s, const char *path, const char *const *meta) {
  if (ampc_checkpoint_save_weights(path, s->model, s->amp, meta) < 0) {
    cli_lib_error(NULL);
    return -1;
  }
  return 0;
}

int cli_evaluate(cli_session *s, const ampc_dataset *d, double *loss, double *acc) {
  ampc_eval_result r;
  if (ampc_model_evaluate(s->model, d, s->normalize, &r) < 0) {
    cli_lib_error(NULL);
    return -1;
  }
  *loss = r.loss;
  *acc = r.accuracy;
  return 0;
}
