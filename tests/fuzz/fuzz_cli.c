/* libFuzzer target: the CLI option parser (tools/ampc/cli.c's cli_parse)
 * with the option table of `ampc train`, then the checks train makes of the
 * parsed values before it opens any data: the amp configuration (opt level,
 * half type, loss-scale overrides), the optimizer and the lr schedule. No
 * data is read and nothing is trained.
 *
 * The input is argv[1..]: the arguments separated by NUL bytes, e.g.
 * "--epochs\0" "3\0" "--lr=0.1". The table below copies train.c's (only
 * their destinations differ); keep it in step when train gains options.
 *
 * The parser prints its errors and --help to stdout/stderr; the target points
 * the stdio streams at /dev/null (libFuzzer and the sanitizers keep writing
 * their reports to the real fd 2). Set AMPC_FUZZ_VERBOSE=1 to see them. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* At most this many arguments are passed (train has ~50 options). */
#define FUZZ_MAX_ARGS 128

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  const char *v = getenv("AMPC_FUZZ_VERBOSE");
  if (v && *v && strcmp(v, "0") != 0) return 0;
  /* glibc's stdout/stderr are plain variables; the parser reads them at
   * every call, libFuzzer kept its own copy of the original at start-up. */
  FILE *null = fopen("/dev/null", "w");
  if (null) {
    stdout = null;
    stderr = null;
  }
  return 0;
}

typedef struct {
  cli_common c;
  int epochs;
  const char *optimizer, *lr_schedule, *metrics, *save;
  float lr, momentum, weight_decay, beta1, beta2, eps, dampening, gamma, eta_min, warmup_start;
  int nesterov, amsgrad, augment, augment_given, quiet;
  const char *checkpoint_dir, *resume, *on_nonfinite;
  int64_t save_every;
  int keep;
  int64_t step_size, warmup;
  int lr_given, wd_given, beta1_given, beta2_given, eps_given;
} train_args;

static int build_table(train_args *a, cli_opt *opts) {
  int n = cli_common_opts(&a->c, opts, 1);
  opts[n++] = (cli_opt){"--epochs", OPT_INT, &a->epochs, "N", "epochs", 1, NULL};
  opts[n++] = (cli_opt){"--optimizer", OPT_STRING, &a->optimizer, "NAME", "optimizer", 0, NULL};
  opts[n++] = (cli_opt){"--lr", OPT_FLOAT, &a->lr, "X", "learning rate", 0, &a->lr_given};
  opts[n++] = (cli_opt){"--momentum", OPT_FLOAT, &a->momentum, "X", "momentum", 0, NULL};
  opts[n++] = (cli_opt){"--dampening", OPT_FLOAT, &a->dampening, "X", "dampening", 0, NULL};
  opts[n++] = (cli_opt){"--nesterov", OPT_FLAG, &a->nesterov, NULL, "nesterov", 0, NULL};
  opts[n++] = (cli_opt){"--weight-decay", OPT_FLOAT, &a->weight_decay, "X", "weight decay", 0, &a->wd_given};
  opts[n++] = (cli_opt){"--beta1", OPT_FLOAT, &a->beta1, "X", "beta1", 0, &a->beta1_given};
  opts[n++] = (cli_opt){"--beta2", OPT_FLOAT, &a->beta2, "X", "beta2", 0, &a->beta2_given};
  opts[n++] = (cli_opt){"--eps", OPT_FLOAT, &a->eps, "X", "eps", 0, &a->eps_given};
  opts[n++] = (cli_opt){"--amsgrad", OPT_FLAG, &a->amsgrad, NULL, "amsgrad", 0, NULL};
  opts[n++] = (cli_opt){"--lr-schedule", OPT_STRING, &a->lr_schedule, "NAME", "schedule", 0, NULL};
  opts[n++] = (cli_opt){"--step-size", OPT_I64, &a->step_size, "N", "step size", 1, NULL};
  opts[n++] = (cli_opt){"--gamma", OPT_FLOAT, &a->gamma, "X", "gamma", 0, NULL};
  opts[n++] = (cli_opt){"--eta-min", OPT_FLOAT, &a->eta_min, "X", "eta min", 0, NULL};
  opts[n++] = (cli_opt){"--warmup", OPT_I64, &a->warmup, "N", "warm-up epochs", 0, NULL};
  opts[n++] = (cli_opt){"--warmup-start", OPT_FLOAT, &a->warmup_start, "X", "warm-up start", 0, NULL};
  opts[n++] = (cli_opt){"--augment", OPT_ONOFF, &a->augment, "on|off", "augment", 0, &a->augment_given};
  opts[n++] = (cli_opt){"--metrics", OPT_STRING, &a->metrics, "FILE", "metrics", 0, NULL};
  opts[n++] = (cli_opt){"--save", OPT_STRING, &a->save, "FILE", "save", 0, NULL};
  opts[n++] = (cli_opt){"--checkpoint-dir", OPT_STRING, &a->checkpoint_dir, "DIR", "checkpoints", 0, NULL};
  opts[n++] = (cli_opt){"--save-every", OPT_I64, &a->save_every, "N", "save every N steps", 1, NULL};
  opts[n++] = (cli_opt){"--keep", OPT_INT, &a->keep, "K", "keep K checkpoints", 1, NULL};
  opts[n++] = (cli_opt){"--resume", OPT_STRING, &a->resume, "FILE|DIR", "resume", 0, NULL};
  opts[n++] = (cli_opt){"--on-nonfinite", OPT_STRING, &a->on_nonfinite, "stop|skip", "on inf/NaN", 0, NULL};
  opts[n++] = (cli_opt){"--quiet", OPT_FLAG, &a->quiet, NULL, "quiet", 0, NULL};
  opts[n] = (cli_opt){0};
  return n;
}

/* What cmd_train checks after parsing and before opening the data. */
static void check_values(train_args *a) {
  ampc_amp_config acfg;
  if (cli_amp_config(&a->c, &acfg) < 0) return;
  char desc[512];
  ampc_amp_config_describe(&acfg, desc, sizeof desc);
  ampc_optim_kind kind;
  if (ampc_optim_kind_parse(a->optimizer, &kind) < 0) return;
  ampc_optim_config ocfg;
  ampc_optim_config_default(&ocfg, kind);
  ocfg.lr = a->lr_given ? a->lr : 1e-3f;
  ocfg.momentum = a->momentum;
  ocfg.dampening = a->dampening;
  ocfg.nesterov = a->nesterov;
  ocfg.amsgrad = a->amsgrad;
  if (a->wd_given) ocfg.weight_decay = a->weight_decay;
  if (a->beta1_given) ocfg.beta1 = a->beta1;
  if (a->beta2_given) ocfg.beta2 = a->beta2;
  if (a->eps_given) ocfg.eps = a->eps;
  if (ampc_optim_config_validate(&ocfg) < 0) return;
  ampc_lr_kind lk;
  if (ampc_lr_kind_parse(a->lr_schedule, &lk) < 0) return;
  ampc_lr_schedule sched;
  ampc_lr_schedule_default(&sched, lk);
  sched.step_size = a->step_size;
  sched.gamma = a->gamma;
  sched.t_max = a->epochs - a->warmup > 0 ? a->epochs - a->warmup : 1;
  sched.eta_min = a->eta_min;
  sched.warmup = a->warmup;
  sched.warmup_start_factor = a->warmup_start;
  if (ampc_lr_schedule_validate(&sched) < 0) return;
  for (int e = 0; e < a->epochs && e < 4; e++) (void)ampc_lr_at(&sched, ocfg.lr, e);
  if (a->on_nonfinite && strcmp(a->on_nonfinite, "skip") != 0 && strcmp(a->on_nonfinite, "stop") != 0)
    return;
  ampc_dataset_kind dk;
  (void)ampc_dataset_kind_parse(a->c.dataset, &dk);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  /* A private, NUL-terminated copy: the parser keeps pointers into argv. */
  char *buf = malloc(size + 1);
  if (!buf) return 0;
  if (size) memcpy(buf, data, size);
  buf[size] = '\0';
  char *argv[FUZZ_MAX_ARGS + 1];
  int argc = 0;
  for (size_t i = 0; i < size && argc < FUZZ_MAX_ARGS;) {
    argv[argc++] = buf + i;
    i += strlen(buf + i) + 1;
  }
  argv[argc] = NULL;

  train_args a;
  memset(&a, 0, sizeof a);
  cli_common_defaults(&a.c);
  a.epochs = 3;
  a.optimizer = "adam";
  a.lr_schedule = "constant";
  a.gamma = 0.1f;
  a.step_size = 30;
  a.warmup_start = 0.1f;
  cli_opt opts[64];
  build_table(&a, opts);
  int pr = cli_parse("train", "[options]", opts, argc, argv);
  if (pr == 0) {
    /* The minimums in the table hold for every accepted value. */
    if (a.epochs < 1 || a.c.batch_size < 1 || a.step_size < 1 || a.c.grad_accum < 1 ||
        a.lr < 0 || a.warmup < 0 || a.save_every < 0 || a.keep < 0) {
      /* fd 2, not stderr: that stream is /dev/null here. */
      dprintf(2, "fuzz: cli_parse accepted a value below its minimum\n");
      abort();
    }
    check_values(&a);
  } else if (pr != 1 && pr != -1) {
    dprintf(2, "fuzz: cli_parse returned %d\n", pr);
    abort();
  }
  free(buf);
  return 0;
}
