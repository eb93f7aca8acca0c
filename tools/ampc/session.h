/* What train, eval, grad and bench set up alike: data, model, optimizer, amp. */
#ifndef AMPC_CLI_SESSION_H
#define AMPC_CLI_SESSION_H

#include "cli.h"
#include "ampc/backend.h"
#include "ampc/checkpoint.h"
#include "ampc/safetensors.h"

typedef struct {
  ampc_dataset *train, *test;
  ampc_model *model;
  ampc_graph *g;
  ampc_optim *opt;
  ampc_amp *amp;
  ampc_amp_config amp_cfg;
  int channels, height, width, classes;
  int normalize; /* the loader's per-channel normalisation, the same in training and evaluation */
} cli_session;

/* Opens the datasets asked for (need_train / need_test), builds the model for
 * batch (shape and classes from the data, or from `shape` when no data is
 * opened: {C, H, W, classes}), the optimizer (if ocfg) and amp. Prints the
 * error and returns -1 on failure. */
int cli_session_open(cli_session *s, const cli_common *c, int need_train, int need_test, const int *shape,
                     const ampc_optim_config *ocfg, int64_t batch);
void cli_session_close(cli_session *s);
/* Loads parameters and buffers by their PyTorch names from a safetensors file. */
int cli_load_weights(cli_session *s, const char *path);
/* Writes parameters (f32) and buffers under their PyTorch names. */
int cli_save_weights(cli_session *s, const char *path, const char *const *meta);
/* Mean loss and accuracy over a dataset (eval mode). */
int cli_evaluate(cli_session *s, const ampc_dataset *d, double *loss, double *acc);

#endif
