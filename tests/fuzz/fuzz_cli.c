/* libFuzzer target: the CLI option parser (tools/ampc/cli.c's cli_parse)
 * with the option table of `ampc train`, then the checks train makes of the
 * parsed values before it opens any data: the amp configuration (opt level,
 * half type, loss-scale overrides), the optimizer and the lr schedule. No
 * data is read and nothing is trained.
 *
 * The input is argv[1..]: the arguments separated by NUL bytes, e.g.
 * "--epochs\0" "3\0" "--lr=0.1". The table and the checks are train's own
 * (tools/ampc/train_args.c), so the target follows train's options.
 *
 * The parser prints its errors and --help to stdout/stderr; the target points
 * the stdio streams at /dev/null (libFuzzer and the sanitizers keep writing
 * their reports to the real fd 2). Set AMPC_FUZZ_VERBOSE=1 to see them. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train_args.h"

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

/* What cmd_train checks after parsing and before opening the data. */
static void check_values(const train_args *a) {
  ampc_amp_config acfg;
  if (cli_amp_config(&a->c, &acfg) < 0) return;
  char desc[512];
  ampc_amp_config_describe(&acfg, desc, sizeof desc);
  ampc_optim_config ocfg;
  ampc_lr_schedule sched;
  int skip;
  if (train_args_check(a, &ocfg, &sched, &skip) < 0) return;
  for (int e = 0; e < a->epochs && e < 4; e++) (void)ampc_lr_at(&sched, ocfg.lr, e);
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
  train_args_init(&a);
  cli_opt opts[96];
  train_args_opts(&a, opts);
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
