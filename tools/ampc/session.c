#include "session.h"

#include <jansson.h>
#include <math.h>

#include "dist.h"
#include <stdlib.h>
#include <string.h>

static int dataset_kind(const cli_common *c, ampc_dataset_kind *kind, const char **dir) {
  if (ampc_dataset_kind_parse(c->dataset, kind) < 0) {
    cli_lib_error(NULL);
    return -1;
  }
  *dir = c->data_dir ? c->data_dir : ampc_dataset_default_dir(*kind);
  return 0;
}

const char *cli_dataset_name(const cli_common *c) {
  ampc_dataset_kind dk;
  return ampc_dataset_kind_parse(c->dataset, &dk) == 0 ? ampc_dataset_kind_name(dk) : c->dataset;
}

int cli_output_is_data(const cli_common *c, const char *out, const char **name) {
  ampc_dataset_kind kind;
  const char *dir;
  if (!out || ampc_dataset_kind_parse(c->dataset, &kind) < 0) return 0;
  dir = c->data_dir ? c->data_dir : ampc_dataset_default_dir(kind);
  for (int train = 0; train < 2; train++)
    for (int i = 0; ampc_dataset_file_name(kind, train, i); i++) {
      char path[4096];
      int n = snprintf(path, sizeof path, "%s/%s", dir, ampc_dataset_file_name(kind, train, i));
      if (n > 0 && (size_t)n < sizeof path && cli_same_file(out, path)) {
        *name = ampc_dataset_file_name(kind, train, i);
        return 1;
      }
    }
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

/* A checkpoint resumed (given as flag) against the run: the optimizer it
 * saved the state of, and the normalisation of the inputs it was trained
 * with, from its "ampc" metadata (its header only is read). A checkpoint that
 * records neither passes here; the library checks the rest as it loads. */
static int check_resume_run(const char *flag, const char *path, const cli_common *c, const ampc_optim_config *ocfg,
                            const ampc_amp_config *acfg) {
  ampc_st_file *f;
  if (ampc_st_open_header(&f, path) < 0) {
    cli_lib_error(flag);
    return -1;
  }
  json_error_t je;
  const char *js = ampc_st_metadata(f, "ampc");
  json_t *root = js ? json_loads(js, JSON_REJECT_DUPLICATES, &je) : NULL, *pre = NULL;
  int rc = cli_file_preprocessing(f, flag, path, &pre);
  ampc_st_close(f);
  const char *saved = json_string_value(json_object_get(root, "optimizer")), *want = ampc_optim_kind_name(ocfg->kind);
  ampc_optim_kind kind;
  /* (a name ampc does not know is the library's to refuse, as the file's fault) */
  if (rc == 0 && saved && ampc_optim_kind_parse(saved, &kind) == 0 && kind != ocfg->kind) {
    cli_error("%s: '%s' was trained with optimizer %s, not %s (--optimizer)", flag, path, saved, want);
    rc = -1;
  }
  /* the amp properties the opt level leaves to the user: the run goes on with
   * the numerics it had (the library checks the opt level and half type
   * again at load, for callers of the API) */
  json_t *amp = json_object_get(root, "amp");
  /* the opt level and half type first: the properties below follow from them */
  const char *lvl = json_string_value(json_object_get(amp, "opt_level")), *hf = json_string_value(json_object_get(amp, "half_type"));
  const char *lvl_now = ampc_opt_level_name(acfg->opt_level), *hf_now = ampc_dtype_name(acfg->half_type);
  if (rc == 0 && lvl && strcmp(lvl, lvl_now) != 0) {
    cli_error("%s: '%s' was trained at --opt-level %s, this run has %s: give the same amp options to resume it", flag, path, lvl,
              lvl_now);
    rc = -1;
  } else if (rc == 0 && hf && strcmp(hf, hf_now) != 0 && acfg->opt_level != AMPC_OPT_O0) { /* (nothing is half at O0) */
    cli_error("%s: '%s' was trained with --half %s, this run has %s: give the same amp options to resume it", flag, path, hf,
              hf_now);
    rc = -1;
  }
  static const struct {
    const char *key, *flag;
  } props[] = {{"master_weights", "--master-weights"}, {"keep_batchnorm_fp32", "--keep-batchnorm-fp32"}};
  for (size_t i = 0; rc == 0 && amp && i < sizeof props / sizeof props[0]; i++) {
    json_t *v = json_object_get(amp, props[i].key);
    int now = i == 0 ? acfg->master_weights : acfg->keep_batchnorm_fp32;
    if (json_is_integer(v) && json_integer_value(v) != now) {
      const char *was = json_integer_value(v) == 1 ? "on" : json_integer_value(v) == 0 ? "off" : "n/a";
      cli_error("%s: '%s' was trained with %s %s, this run has %s: give the same amp options to resume it", flag, path,
                props[i].flag, was, now == 1 ? "on" : now == 0 ? "off" : "n/a");
      rc = -1;
    }
  }
  json_t *nz = json_object_get(pre, "normalize");
  const char *ds = json_string_value(json_object_get(pre, "dataset"));
  const char *here = cli_dataset_name(c);
  if (rc == 0 && json_is_boolean(nz) && json_is_true(nz) != (c->normalize != 0)) {
    cli_error("%s: '%s' was trained with --normalize %s, not %s (the model's inputs would differ)", flag, path,
              json_is_true(nz) ? "on" : "off", c->normalize ? "on" : "off");
    rc = -1;
  } else if (rc == 0 && json_is_true(nz) && ds && strcmp(ds, here) != 0) {
    /* each dataset is normalised with its own mean and std */
    cli_error("%s: '%s' was trained on %s, normalised with its mean and std, not %s's (--dataset)", flag, path, ds, here);
    rc = -1;
  }
  json_decref(pre);
  json_decref(root);
  return rc;
}

int cli_session_open(cli_session *s, const cli_common *c, int need_train, int need_test, const int *shape,
                     const ampc_optim_config *ocfg, int64_t batch, const char *weights_flag, const char *weights) {
  memset(s, 0, sizeof *s);
  s->normalize = c->normalize;
  if (cli_set_threads(c->threads) < 0) return -1;
  /* everything that can be checked without the data is checked before it is read */
  if (cli_amp_config(c, &s->amp_cfg) < 0) return -1;
  if (ampc_backend_check(c->device) < 0) {
    cli_lib_error("--device");
    return -1;
  }
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
    snprintf(s->shape_from, sizeof s->shape_from, "the --batch file's x"); /* (the caller's only shape: grad's) */
  }
  /* a batch larger than the data never fills: the graph (and the memory
   * planned for it) takes the most images a batch can hold */
  size_t most = need_train ? tr.count : 0;
  if (need_test && te.count > most) most = te.count;
  if (d && most > 0 && (uint64_t)batch > most) batch = (int64_t)most;
  if (weights && d && cli_check_weights_input(weights_flag, weights, c->model, s->channels, s->height, s->width, s->classes, s->shape_from) < 0) return -1;
  /* weights with an optimizer: a checkpoint to resume the run from */
  if (weights && ocfg && check_resume_run(weights_flag, weights, c, ocfg, &s->amp_cfg) < 0) return -1;
  ampc_model_opts mo = {.batch = batch, .channels = s->channels, .height = s->height, .width = s->width,
                        .classes = s->classes, .seed = c->seed, .label_smoothing = c->label_smoothing};
  if (ampc_model_create(&s->model, c->model, &mo) < 0) {
    /* an input the model cannot take: say where its shape came from */
    if (strstr(ampc_last_error(), " input ") && s->shape_from[0])
      cli_error("--model: %s; the input is that of %s", ampc_last_error(), s->shape_from);
    else
      cli_lib_error("--model");
    return -1;
  }
  s->g = ampc_model_graph(s->model);
  ampc_backend_opts bo;
  ampc_backend_opts_default(&bo);
  bo.threads = c->threads;
  bo.tf32 = c->tf32;
  bo.no_cuda_graphs = !c->cuda_graphs;
  bo.cudnn_any_algo = !c->cudnn_deterministic;
  if (strcmp(c->conv, "im2col") == 0) bo.conv = AMPC_CONV_IM2COL;
  else if (strcmp(c->conv, "winograd") == 0) bo.conv = AMPC_CONV_WINOGRAD;
  else if (strcmp(c->conv, "direct") == 0) bo.conv = AMPC_CONV_DIRECT;
  else if (strcmp(c->conv, "auto") != 0) {
    cli_error("--conv: unknown algorithm '%s' (expected auto, im2col, winograd or direct)", c->conv);
    return -1;
  }
  ampc_comm *comm = cli_dist_comm(), *amp_comm = comm;
  int use_nccl = comm && cli_comm_nccl(c);
  if (use_nccl) {
    /* one GPU a rank: the local rank's; NCCL runs no two ranks on one GPU */
    bo.device = ampc_comm_local_rank(comm);
    ampc_status set = ampc_graph_set_backend(s->g, c->device, &bo);
    if (set == AMPC_EINVAL && bo.device > 0)
      cli_error("--comm nccl: local rank %d of %d has no GPU of its own (%s): NCCL cannot run two ranks on one GPU; "
                "start one rank per GPU, or use --comm mpi", bo.device, ampc_comm_local_size(comm), ampc_last_error());
    else if (set < 0)
      cli_lib_error("--device");
    /* (every rank here, before the NCCL communicator's collective set-up) */
    if (!cli_dist_agree(set == 0) || !(amp_comm = cli_dist_nccl())) return -1;
  } else if (ampc_graph_set_backend(s->g, c->device, &bo) < 0) {
    cli_lib_error("--device");
    return -1;
  }
  /* one backward per forward here, and only the loss and the logits (kept)
   * are read after it: activations and their gradients share one arena */
  if (ampc_graph_set_free_saved(s->g, 1) < 0) {
    cli_lib_error(NULL);
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
  if (comm) {
    /* data-parallel: this rank's share of the step, before any state is
     * loaded (ZeRO keeps only its shard of what a checkpoint holds) */
    ampc_amp_set_comm(s->amp, amp_comm);
    ampc_amp_set_allreduce_f32(s->amp, c->allreduce_type && strcmp(c->allreduce_type, "f32") == 0);
    if ((c->bucket_mb > 0 && ampc_amp_set_bucket_bytes(s->amp, (size_t)((double)c->bucket_mb * 1048576.0)) < 0) ||
        (ocfg && ampc_amp_set_zero(s->amp, c->zero) < 0) || ampc_amp_set_sync_batchnorm(s->amp, c->sync_bn) < 0) {
      cli_lib_error(NULL);
      return -1;
    }
  }
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

int cli_load_weights(cli_session *s, const char *path) {
  if (ampc_checkpoint_load_weights(path, s->model, s->amp) < 0) {
    /* name the file where the library's message does not, and say where
     * the model's shape came from (the data, or a grad batch) where a shape
     * is what disagrees */
    const char *e = ampc_last_error();
    cli_error("%s%s%s%s%s", strstr(e, path) ? "" : path, strstr(e, path) ? "" : ": ", e,
              s->shape_from[0] && strstr(e, "shape") ? "; the model is sized from " : "",
              s->shape_from[0] && strstr(e, "shape") ? s->shape_from : "");
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
