/* ampc train's options: what they hold, their table, and the checks made on
 * them before any data is read. Shared by the train command and the option
 * parser's fuzz target, so that both see the same options. */
#ifndef AMPC_CLI_TRAIN_ARGS_H
#define AMPC_CLI_TRAIN_ARGS_H

#include "cli.h"

typedef struct {
  cli_common c;
  int epochs;
  const char *optimizer, *lr_schedule, *metrics, *save;
  float lr, momentum, weight_decay, beta1, beta2, eps, dampening, gamma, eta_min, warmup_start;
  int nesterov, amsgrad, augment, augment_given, quiet;
  const char *checkpoint_dir, *resume, *on_nonfinite;
  int64_t save_every, log_every;
  int keep, save_on_interrupt;
  int64_t step_size, warmup;
  int lr_given, wd_given, beta1_given, beta2_given, eps_given;
  int momentum_given, dampening_given, step_size_given, gamma_given, eta_min_given, warmup_start_given;
} train_args;

/* The defaults of the headline example: Adam, lr 1e-3, 3 epochs. */
void train_args_init(train_args *a);
/* Fills opts (room for 64) with train's table, NULL-terminated; returns the count. */
int train_args_opts(train_args *a, cli_opt *opts);
/* The optimizer and schedule the options describe, and the --on-nonfinite
 * choice; prints the error and returns -1 for a value the library refuses. */
int train_args_check(const train_args *a, ampc_optim_config *ocfg, ampc_lr_schedule *sched, int *skip_nonfinite);

#endif
