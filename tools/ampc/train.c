/* ampc train: the training loop, progress and per-epoch metrics. */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "session.h"

typedef struct {
  cli_common c;
  int epochs;
  const char *optimizer, *lr_schedule, *metrics, *save;
  float lr, momentum, weight_decay, beta1, beta2, eps, dampening, gamma, eta_min, warmup_start;
  int nesterov, amsgrad, augment, augment_given, normalize, quiet;
  int64_t step_size, warmup;
  int lr_given, wd_given, beta1_given, beta2_given, eps_given;
} train_args;

static void progress(int tty, int epoch, int64_t b, int64_t nb, double loss, double ips, double eta) {
  if (tty) {
    int width = 30, filled = nb ? (int)(width * b / nb) : width;
    char bar[64];
    for (int i = 0; i < width; i++) bar[i] = i < filled ? '#' : '.';
    bar[width] = '\0';
    fprintf(stderr, "\repoch %d [%s] %lld/%lld loss %.4f %.1f img/s ETA %.0fs ", epoch, bar, (long long)b, (long long)nb, loss, ips, eta);
    fflush(stderr);
  } else {
    fprintf(stderr, "epoch %d: batch %lld/%lld loss %.4f %.1f img/s ETA %.0fs\n", epoch, (long long)b, (long long)nb, loss, ips, eta);
  }
}

int cmd_train(int argc, char **argv) {
  train_args a;
  memset(&a, 0, sizeof a);
  cli_common_defaults(&a.c);
  a.epochs = 3;
  a.optimizer = "adam";
  a.lr_schedule = "constant";
  a.normalize = 1;
  a.gamma = 0.1f;
  a.step_size = 30;
  a.warmup_start = 0.1f;
  cli_opt opts[64];
  int n = cli_common_opts(&a.c, opts, 1);
  opts[n++] = (cli_opt){"--epochs", OPT_INT, &a.epochs, "N", "epochs (default 3)", 1, NULL};
  opts[n++] = (cli_opt){"--optimizer", OPT_STRING, &a.optimizer, "NAME", "sgd, adam or adamw (default adam)", 0, NULL};
  opts[n++] = (cli_opt){"--lr", OPT_FLOAT, &a.lr, "X", "learning rate (default 1e-3)", 0, &a.lr_given};
  opts[n++] = (cli_opt){"--momentum", OPT_FLOAT, &a.momentum, "X", "SGD momentum (default 0)", 0, NULL};
  opts[n++] = (cli_opt){"--dampening", OPT_FLOAT, &a.dampening, "X", "SGD dampening (default 0)", 0, NULL};
  opts[n++] = (cli_opt){"--nesterov", OPT_FLAG, &a.nesterov, NULL, "SGD Nesterov momentum", 0, NULL};
  opts[n++] = (cli_opt){"--weight-decay", OPT_FLOAT, &a.weight_decay, "X", "weight decay (default 0; adamw 1e-2)", 0, &a.wd_given};
  opts[n++] = (cli_opt){"--beta1", OPT_FLOAT, &a.beta1, "X", "Adam beta1 (default 0.9)", 0, &a.beta1_given};
  opts[n++] = (cli_opt){"--beta2", OPT_FLOAT, &a.beta2, "X", "Adam beta2 (default 0.999)", 0, &a.beta2_given};
  opts[n++] = (cli_opt){"--eps", OPT_FLOAT, &a.eps, "X", "Adam eps (default 1e-8)", 0, &a.eps_given};
  opts[n++] = (cli_opt){"--amsgrad", OPT_FLAG, &a.amsgrad, NULL, "Adam AMSGrad", 0, NULL};
  opts[n++] = (cli_opt){"--lr-schedule", OPT_STRING, &a.lr_schedule, "NAME", "constant, step or cosine, per epoch (default constant)", 0, NULL};
  opts[n++] = (cli_opt){"--step-size", OPT_I64, &a.step_size, "N", "step schedule: epochs between decays (default 30)", 1, NULL};
  opts[n++] = (cli_opt){"--gamma", OPT_FLOAT, &a.gamma, "X", "step schedule: decay factor (default 0.1)", 0, NULL};
  opts[n++] = (cli_opt){"--eta-min", OPT_FLOAT, &a.eta_min, "X", "cosine schedule: final learning rate (default 0)", 0, NULL};
  opts[n++] = (cli_opt){"--warmup", OPT_I64, &a.warmup, "N", "linear warm-up epochs (default 0)", 0, NULL};
  opts[n++] = (cli_opt){"--warmup-start", OPT_FLOAT, &a.warmup_start, "X", "warm-up start factor (default 0.1)", 0, NULL};
  opts[n++] = (cli_opt){"--augment", OPT_ONOFF, &a.augment, "on|off", "random crop (pad 4) and flip (default: on for CIFAR)", 0, &a.augment_given};
  opts[n++] = (cli_opt){"--normalize", OPT_ONOFF, &a.normalize, "on|off", "per-channel mean/std normalisation (default on)", 0, NULL};
  opts[n++] = (cli_opt){"--metrics", OPT_STRING, &a.metrics, "FILE", "write one JSON object per epoch to FILE", 0, NULL};
  opts[n++] = (cli_opt){"--save", OPT_STRING, &a.save, "FILE", "save the trained weights (safetensors)", 0, NULL};
  opts[n++] = (cli_opt){"--quiet", OPT_FLAG, &a.quiet, NULL, "no progress output", 0, NULL};
  opts[n] = (cli_opt){0};
  int pr = cli_parse("train", "[options]", opts, argc, argv);
  if (pr) return pr > 0 ? 0 : 2;

  ampc_optim_config ocfg;
  ampc_optim_kind kind;
  if (ampc_optim_kind_parse(a.optimizer, &kind) < 0) {
    cli_lib_error("--optimizer");
    return 2;
  }
  ampc_optim_config_default(&ocfg, kind);
  ocfg.lr = a.lr_given ? a.lr : 1e-3f;
  ocfg.momentum = a.momentum;
  ocfg.dampening = a.dampening;
  ocfg.nesterov = a.nesterov;
  ocfg.amsgrad = a.amsgrad;
  if (a.wd_given) ocfg.weight_decay = a.weight_decay;
  if (a.beta1_given) ocfg.beta1 = a.beta1;
  if (a.beta2_given) ocfg.beta2 = a.beta2;
  if (a.eps_given) ocfg.eps = a.eps;
  if (ampc_optim_config_validate(&ocfg) < 0) {
    cli_lib_error(NULL);
    return 2;
  }
  ampc_lr_schedule sched;
  ampc_lr_kind lk;
  if (ampc_lr_kind_parse(a.lr_schedule, &lk) < 0) {
    cli_lib_error("--lr-schedule");
    return 2;
  }
  ampc_lr_schedule_default(&sched, lk);
  sched.step_size = a.step_size;
  sched.gamma = a.gamma;
  sched.t_max = a.epochs - a.warmup > 0 ? a.epochs - a.warmup : 1;
  sched.eta_min = a.eta_min;
  sched.warmup = a.warmup;
  sched.warmup_start_factor = a.warmup_start;
  if (ampc_lr_schedule_validate(&sched) < 0) {
    cli_lib_error("--lr-schedule");
    return 2;
  }
  FILE *mf = NULL;
  if (a.metrics && !(mf = fopen(a.metrics, "w"))) {
    cli_error("--metrics: cannot open '%s' for writing", a.metrics);
    return 1;
  }

  cli_session s;
  if (cli_session_open(&s, &a.c, 1, 1, NULL, &ocfg, a.c.batch_size) < 0) {
    cli_session_close(&s);
    if (mf) fclose(mf);
    return 1;
  }
  int is_cifar = strncmp(a.c.dataset, "cifar", 5) == 0;
  int augment = a.augment_given ? a.augment : is_cifar;
  ampc_loader_opts lo;
  ampc_loader_opts_default(&lo);
  lo.batch_size = (int)a.c.batch_size;
  lo.seed = a.c.seed;
  lo.normalize = a.normalize;
  lo.random_crop_padding = augment ? 4 : 0;
  lo.hflip = augment;
  ampc_value xv = ampc_model_input(s.model), yv = ampc_model_labels(s.model), lossv = ampc_model_loss(s.model);
  lo.dtype = ampc_graph_tensor(s.g, xv).dtype;
  ampc_loader *ld = NULL;
  if (ampc_loader_create(&ld, s.train, &lo) < 0) {
    cli_lib_error(NULL);
    cli_session_close(&s);
    if (mf) fclose(mf);
    return 1;
  }
  char desc[512];
  ampc_amp_config_describe(&s.amp_cfg, desc, sizeof desc);
  ampc_mem_report mem;
  ampc_amp_memory(s.amp, &mem);
  if (!a.quiet) {
    fprintf(stderr, "ampc: model %s (%lld parameters), %s %zu train / %zu test images, batch %lld, %s\n",
            ampc_model_name(s.model), (long long)ampc_model_param_count(s.model), a.c.dataset,
            ampc_dataset_count(s.train), ampc_dataset_count(s.test), (long long)a.c.batch_size, ampc_optim_kind_name(kind));
    fprintf(stderr, "ampc: amp %s\n", desc);
    fprintf(stderr, "ampc: ");
    cli_print_memory(stderr, &mem);
  }
  int tty = cli_is_tty() && !a.quiet, rc = 0;
  int64_t step = 0, skipped_total = 0, last_skip_report = -1, skip_repeats = 0;
  int accum = a.c.grad_accum;
  for (int epoch = 0; epoch < a.epochs && rc == 0; epoch++) {
    float lr = ampc_lr_at(&sched, ocfg.lr, epoch);
    if (ampc_loader_start_epoch(ld, epoch, 0) < 0) {
      cli_lib_error(NULL);
      rc = 1;
      break;
    }
    int64_t nb = ampc_loader_batches_per_epoch(ld), b = 0, seen = 0, skipped = 0;
    double loss_sum = 0.0, t0 = cli_now(), last_print = t0;
    int micro = 0;
    ampc_amp_grad_stats st;
    ampc_amp_get_grad_stats(s.amp, &st, 1);
    for (;;) {
      int got = 0;
      ampc_graph_set_batch(s.g, ampc_graph_max_batch(s.g));
      ampc_tensor x = ampc_graph_tensor(s.g, xv), y = ampc_graph_tensor(s.g, yv);
      if (ampc_loader_next(ld, x.data, y.data, &got) < 0) {
        cli_lib_error(NULL);
        rc = 1;
        break;
      }
      if (got == 0) break;
      if (got < 2 && ampc_graph_max_batch(s.g) > 1) continue; /* batch norm needs two samples */
      ampc_graph_set_batch(s.g, got);
      if (ampc_amp_forward(s.amp, 1) < 0 || ampc_amp_backward(s.amp, lossv, 0, micro > 0) < 0) {
        cli_lib_error(NULL);
        rc = 1;
        break;
      }
      float l = *(float *)ampc_graph_tensor(s.g, lossv).data;
      loss_sum += (double)l * got;
      seen += got;
      b++;
      if (++micro < accum && b < nb) continue;
      micro = 0;
      ampc_amp_step_info info;
      if (ampc_amp_step(s.amp, lr, &info) < 0) {
        cli_lib_error(NULL);
        rc = 1;
        break;
      }
      step++;
      if (!info.applied) {
        skipped++;
        skipped_total++;
        /* one line per skipped step at most; repeats of the same cause are counted */
        if (last_skip_report == step - 1) {
          skip_repeats++;
        } else {
          if (skip_repeats) fprintf(stderr, "\nampc: (%lld more skipped steps in a row)\n", (long long)skip_repeats);
          skip_repeats = 0;
          fprintf(stderr, "%sampc: step %lld: gradient overflow, step skipped, loss scale now %g; non-finite gradients in %d parameter%s: %s%s%s%s%s%s\n",
                  tty ? "\n" : "", (long long)step, info.scale, info.n_nonfinite, info.n_nonfinite == 1 ? "" : "s",
                  info.nonfinite[0] ? info.nonfinite[0] : "?", info.n_nonfinite > 1 ? ", " : "", info.n_nonfinite > 1 ? info.nonfinite[1] : "",
                  info.n_nonfinite > 2 ? ", " : "", info.n_nonfinite > 2 ? info.nonfinite[2] : "", info.n_nonfinite > 3 ? ", ..." : "");
        }
        last_skip_report = step;
      }
      double now = cli_now();
      if (!a.quiet && (tty ? now - last_print > 0.5 : (b % (nb / 4 > 0 ? nb / 4 : 1) == 0 && b < nb))) {
        double el = now - t0, ips = (double)seen / (el > 0 ? el : 1e-9);
        progress(tty, epoch + 1, b, nb, loss_sum / (double)seen, ips, (double)(nb - b) * el / (double)b);
        last_print = now;
      }
    }
    if (rc) break;
    if (skip_repeats) {
      fprintf(stderr, "%sampc: (%lld more skipped steps in a row)\n", tty ? "\n" : "", (long long)skip_repeats);
      skip_repeats = 0;
      last_skip_report = -1;
    }
    double train_time = cli_now() - t0;
    double test_loss = NAN, test_acc = NAN;
    if (cli_evaluate(&s, s.test, &test_loss, &test_acc) < 0) {
      rc = 1;
      break;
    }
    double secs = cli_now() - t0;
    double train_loss = seen ? loss_sum / (double)seen : NAN;
    double ips = (double)seen / train_time;
    if (tty) fprintf(stderr, "\r%*s\r", 100, "");
    printf("epoch %d: train_loss %.4f test_loss %.4f test_acc %.4f %.1f img/s %.1fs loss_scale %g skipped %lld\n",
           epoch + 1, train_loss, test_loss, test_acc, ips, secs, ampc_scaler_scale(ampc_amp_scaler(s.amp, 0)), (long long)skipped);
    fflush(stdout);
    if (mf) {
      json_t *o = json_object();
      json_object_set_new(o, "epoch", json_integer(epoch + 1));
      json_object_set_new(o, "train_loss", json_real(train_loss));
      json_object_set_new(o, "test_loss", json_real(test_loss));
      json_object_set_new(o, "test_acc", json_real(test_acc));
      json_object_set_new(o, "images_per_s", json_real(ips));
      json_object_set_new(o, "seconds", json_real(secs));
      json_object_set_new(o, "train_seconds", json_real(train_time));
      json_object_set_new(o, "lr", json_real(lr));
      json_object_set_new(o, "steps", json_integer(step));
      json_object_set_new(o, "opt_level", json_string(ampc_opt_level_name(s.amp_cfg.opt_level)));
      json_object_set_new(o, "loss_scale", json_real(ampc_scaler_scale(ampc_amp_scaler(s.amp, 0))));
      json_object_set_new(o, "skipped_steps", json_integer(skipped));
      json_object_set_new(o, "skipped_steps_total", json_integer(skipped_total));
      json_object_set_new(o, "memory", cli_memory_json(&mem));
      if (a.c.amp_report) {
        ampc_amp_get_grad_stats(s.amp, &st, 1);
        json_object_set_new(o, "grad_values", json_integer(st.values));
        json_object_set_new(o, "grad_underflow_fraction", json_real(st.values ? (double)st.underflow / (double)st.values : 0.0));
        json_object_set_new(o, "grad_max_abs", json_real(st.max_abs));
      }
      char *line = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(8));
      if (line) {
        fprintf(mf, "%s\n", line);
        fflush(mf);
        free(line);
      }
      json_decref(o);
    }
  }
  if (rc == 0 && a.save) {
    const char *meta[] = {"format", "ampc-weights-1", "model", ampc_model_name(s.model), NULL};
    if (cli_save_weights(&s, a.save, meta) < 0) rc = 1;
  }
  ampc_loader_free(ld);
  cli_session_close(&s);
  if (mf && fclose(mf) != 0) {
    cli_error("--metrics: error writing '%s'", a.metrics);
    rc = 1;
  }
  return rc;
}
