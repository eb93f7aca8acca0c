/* ampc: train, evaluate and inspect mixed-precision models. */
#include <stdio.h>
#include <string.h>

#include "ampc/version.h"
#include "cli.h"
#include "dist.h"

static const struct {
  const char *name;
  int (*fn)(int, char **);
  const char *help;
} commands[] = {
    {"train", cmd_train, "train a model on a dataset"},
    {"eval", cmd_eval, "evaluate saved weights on a dataset's test set"},
    {"grad", cmd_grad, "one forward and backward on a batch; write loss, logits and gradients"},
    {"summary", cmd_summary, "layers, output shapes and parameter counts of a model"},
    {"bench", cmd_bench, "time training steps and compare with the machine's sgemm rate"},
    {"report", cmd_report, "draw the metrics of runs as one HTML page of charts"},
    {"export", cmd_export, "write a checkpoint's model weights as a PyTorch state_dict"},
};

static void usage(FILE *f) {
  fprintf(f, "usage: ampc <command> [options]\n\ncommands:\n");
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].help);
  fprintf(f, "\nampc <command> --help shows a command's options; ampc --version the build.\n");
}

int main(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
    usage(stdout);
    return 0;
  }
  if (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "-V") == 0) {
    const ampc_version_info *v = ampc_version_get();
    printf("ampc %s\nbuild type: %s\nbackends: %s\ncommunicators: %s (MPI: %s)\ncpu paths: %s (this cpu: %s)\n", v->version,
           v->build_type, v->backends, v->comms, strstr(v->comms, "mpi") ? "built" : "not built", v->cpu_paths, v->cpu_path);
    return 0;
  }
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
    if (strcmp(argv[1], commands[i].name) != 0) continue;
    /* under mpirun, train and bench run data-parallel: one rank each */
    int dist = commands[i].fn == cmd_train || commands[i].fn == cmd_bench;
    if (dist && cli_dist_init() < 0) return 1;
    int rc = commands[i].fn(argc - 2, argv + 2);
    if (dist) cli_dist_finish();
    return rc;
  }
  cli_error("unknown command '%s' (expected train, eval, grad, summary, bench, report or export; see ampc --help)", argv[1]);
  return 2;
}
