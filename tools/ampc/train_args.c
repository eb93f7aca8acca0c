#include "train_args.h"

#include <string.h>

void train_args_init(train_args *a) {
  memset(a, 0, sizeof *a);
  cli_common_defaults(&a->c);
  a->epochs = 3;
  a->optimizer = "adam";
  a->lr_schedule = "constant";
  a->gamma = 0.1f;
  a->step_size = 30;
  a->warmup_start = 0.1f;
}

int train_args_opts(train_args *a, cli_opt *opts) {
  int n = cli_common_opts(&a->c, opts, CLI_OPTS_ALL);
  opts[n++] = (cli_opt){"--epochs", OPT_INT, &a->epochs, "N", "epochs (default 3)", 1, NULL};
  opts[n++] = (cli_opt){"--optimizer", OPT_STRING, &a->optimizer, "NAME", "sgd, adam or adamw (default adam)", 0, NULL};
  opts[n++] = (cli_opt){"--lr", OPT_FLOAT, &a->lr, "X", "learning rate (default 1e-3)", 0, &a->lr_given};
  opts[n++] = (cli_opt){"--momentum", OPT_FLOAT, &a->momentum, "X", "SGD momentum (default 0)", 0, &a->momentum_given};
  opts[n++] = (cli_opt){"--dampening", OPT_FLOAT, &a->dampening, "X", "SGD dampening (default 0)", 0, &a->dampening_given};
  opts[n++] = (cli_opt){"--nesterov", OPT_FLAG, &a->nesterov, NULL, "SGD Nesterov momentum", 0, NULL};
  opts[n++] = (cli_opt){"--weight-decay", OPT_FLOAT, &a->weight_decay, "X", "weight decay (default 0; adamw 1e-2)", 0, &a->wd_given};
  opts[n++] = (cli_opt){"--beta1", OPT_FLOAT, &a->beta1, "X", "Adam beta1 (default 0.9)", 0, &a->beta1_given};
  opts[n++] = (cli_opt){"--beta2", OPT_FLOAT, &a->beta2, "X", "Adam beta2 (default 0.999)", 0, &a->beta2_given};
  opts[n++] = (cli_opt){"--eps", OPT_FLOAT, &a->eps, "X", "Adam eps (default 1e-8)", 0, &a->eps_given};
  opts[n++] = (cli_opt){"--amsgrad", OPT_FLAG, &a->amsgrad, NULL, "Adam AMSGrad", 0, NULL};
  opts[n++] = (cli_opt){"--lr-schedule", OPT_STRING, &a->lr_schedule, "NAME", "constant, step or cosine, per epoch (default constant)", 0, NULL};
  opts[n++] = (cli_opt){"--step-size", OPT_I64, &a->step_size, "N", "step schedule: epochs between decays (default 30)", 1, &a->step_size_given};
  opts[n++] = (cli_opt){"--gamma", OPT_FLOAT, &a->gamma, "X", "step schedule: decay factor (default 0.1)", 0, &a->gamma_given};
  opts[n++] = (cli_opt){"--eta-min", OPT_FLOAT, &a->eta_min, "X", "cosine schedule: final learning rate (default 0)", 0, &a->eta_min_given};
  opts[n++] = (cli_opt){"--warmup", OPT_I64, &a->warmup, "N", "linear warm-up epochs (default 0)", 0, NULL};
  opts[n++] = (cli_opt){"--warmup-start", OPT_FLOAT, &a->warmup_start, "X", "warm-up start factor (default 0.1)", 0, &a->warmup_start_given};
  opts[n++] = (cli_opt){"--augment", OPT_ONOFF, &a->augment, "on|off", "random crop (pad 4) and flip (default: on for CIFAR)", 0, &a->augment_given};
  opts[n++] = (cli_opt){"--metrics", OPT_STRING, &a->metrics, "FILE", "write one JSON object per epoch to FILE", 0, NULL};
  opts[n++] = (cli_opt){"--log-every", OPT_I64, &a->log_every, "N", "also a step record (step, epoch_progress, loss, loss_scale, skipped, lr, grad_norm where finite) in --metrics every N optimizer steps, at every skipped step, at the step a run fails at and at its last (a SIGINT/SIGTERM stop leaves its steps since the last record to the resumed run's next)", 1, NULL};
  opts[n++] = (cli_opt){"--save", OPT_STRING, &a->save, "FILE", "save the trained weights (safetensors) when the run completes", 0, NULL};
  opts[n++] = (cli_opt){"--save-on-interrupt", OPT_FLAG, &a->save_on_interrupt, NULL, "write --save also when SIGINT/SIGTERM stops the run mid-epoch", 0, NULL};
  opts[n++] = (cli_opt){"--checkpoint-dir", OPT_STRING, &a->checkpoint_dir, "DIR", "save a checkpoint at each epoch end (and on SIGINT/SIGTERM) in DIR (default for the SIGINT/SIGTERM save: ./checkpoints); one run per DIR (it locks DIR/.lock)", 0, NULL};
  opts[n++] = (cli_opt){"--save-every", OPT_I64, &a->save_every, "N", "also save every N optimizer steps", 1, NULL};
  opts[n++] = (cli_opt){"--keep", OPT_INT, &a->keep, "K", "keep only the last K complete checkpoints (default: all)", 1, NULL};
  opts[n++] = (cli_opt){"--resume", OPT_STRING, &a->resume, "FILE|DIR", "continue a run from a checkpoint (a folder: its latest)", 0, NULL};
  opts[n++] = (cli_opt){"--on-nonfinite", OPT_STRING, &a->on_nonfinite, "stop|skip", "steps with inf/NaN gradients: stop the run (default) or skip them; with a dynamic loss scale, overflows are always skipped and skip only keeps the run going when the scale stays at its minimum", 0, NULL};
  opts[n++] = (cli_opt){"--quiet", OPT_FLAG, &a->quiet, NULL, "no progress output", 0, NULL};
  opts[n] = (cli_opt){0};
  return n;
}

int train_args_check(const train_args *a, ampc_optim_config *ocfg, ampc_lr_schedule *sched, int *skip_nonfinite) {
  ampc_optim_kind kind;
  if (ampc_optim_kind_parse(a->optimizer, &kind) < 0) {
    cli_lib_error("--optimizer");
    return -1;
  }
  ampc_optim_config_default(ocfg, kind);
  ocfg->lr = a->lr_given ? a->lr : 1e-3f;
  ocfg->momentum = a->momentum;
  ocfg->dampening = a->dampening;
  ocfg->nesterov = a->nesterov;
  ocfg->amsgrad = a->amsgrad;
  if (a->wd_given) ocfg->weight_decay = a->weight_decay;
  /* below 1, but 1 as a 32-bit float: say so rather than "1" */
  for (int i = 0; i < 2; i++) {
    float b = i ? a->beta2 : a->beta1;
    if ((i ? a->beta2_given : a->beta1_given) && b == 1.0f) {
      cli_error("--beta%d: must be less than 1 as a 32-bit float, which holds none between 0.99999994 and 1: a value past 0.99999997 "
                "is 1", i + 1);
      return -1;
    }
  }
  if (a->beta1_given) ocfg->beta1 = a->beta1;
  if (a->beta2_given) ocfg->beta2 = a->beta2;
  if (a->eps_given) ocfg->eps = a->eps;
  if (ampc_optim_config_validate(ocfg) < 0) {
    cli_lib_error(NULL);
    return -1;
  }
  ampc_lr_kind lk;
  if (ampc_lr_kind_parse(a->lr_schedule, &lk) < 0) {
    cli_lib_error("--lr-schedule");
    return -1;
  }
  ampc_lr_schedule_default(sched, lk);
  sched->step_size = a->step_size;
  sched->gamma = a->gamma;
  sched->t_max = a->epochs - a->warmup > 0 ? a->epochs - a->warmup : 1;
  sched->eta_min = a->eta_min;
  sched->warmup = a->warmup;
  sched->warmup_start_factor = a->warmup_start;
  if (!(a->warmup_start > 0.0f && a->warmup_start <= 1.0f)) {
    cli_error("--warmup-start: must be in (0, 1], got %g", (double)a->warmup_start);
    return -1;
  }
  if (ampc_lr_schedule_validate(sched) < 0) {
    cli_lib_error("--lr-schedule");
    return -1;
  }
  if (a->log_every > 0 && !a->metrics) {
    cli_error("--log-every: step records are written to the metrics file: give --metrics FILE too");
    return -1;
  }
  /* options that would otherwise do nothing, silently */
  const char *unused = NULL, *why = NULL;
  int sgd = kind == AMPC_OPTIM_SGD;
  if (sgd && (a->beta1_given || a->beta2_given || a->eps_given || a->amsgrad))
    unused = a->beta1_given ? "--beta1" : a->beta2_given ? "--beta2" : a->eps_given ? "--eps" : "--amsgrad", why = "Adam's (--optimizer adam or adamw)";
  else if (!sgd && (a->momentum_given || a->dampening_given || a->nesterov))
    unused = a->momentum_given ? "--momentum" : a->dampening_given ? "--dampening" : "--nesterov", why = "SGD's (--optimizer sgd)";
  else if (sgd && a->dampening_given && !(a->momentum > 0.0f))
    unused = "--dampening", why = "SGD's momentum (--momentum M, more than 0)";
  else if (lk != AMPC_LR_STEP && (a->step_size_given || a->gamma_given))
    unused = a->step_size_given ? "--step-size" : "--gamma", why = "the step schedule's (--lr-schedule step)";
  else if (lk != AMPC_LR_COSINE && a->eta_min_given)
    unused = "--eta-min", why = "the cosine schedule's (--lr-schedule cosine)";
  else if (a->warmup == 0 && a->warmup_start_given)
    unused = "--warmup-start", why = "the warm-up's (--warmup N)";
  if (unused) {
    cli_error("%s: an option of %s, which this run does not use", unused, why);
    return -1;
  }
  if (!sgd && ocfg->eps == 0.0f) {
    /* Adam divides by sqrt(v) + eps, and v is 0 wherever a gradient has been 0 */
    cli_error("--eps: must be more than 0 (with 0, a parameter whose gradients have all been 0 becomes NaN)");
    return -1;
  }
  if ((a->save_every > 0 || a->keep > 0) && !a->checkpoint_dir) {
    cli_error("%s: checkpoints are written to the --checkpoint-dir folder: give --checkpoint-dir DIR too",
              a->save_every > 0 ? "--save-every" : "--keep");
    return -1;
  }
  if (cli_not_stdout("--save", a->save) < 0 || cli_not_stdout("--metrics", a->metrics) < 0) return -1;
  if (a->save_on_interrupt && !a->save) {
    cli_error("--save-on-interrupt: it writes the --save file: give --save FILE too");
    return -1;
  }
  *skip_nonfinite = 0;
  if (a->on_nonfinite) {
    if (strcmp(a->on_nonfinite, "skip") == 0) *skip_nonfinite = 1;
    else if (strcmp(a->on_nonfinite, "stop") != 0) {
      cli_error("--on-nonfinite: expected stop or skip, got '%s'", a->on_nonfinite);
      return -1;
    }
  }
  return 0;
}
