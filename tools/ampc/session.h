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
  char shape_from[4200]; /* what the model's input shape came from, for messages ("" if given) */
} cli_session;

/* Opens the datasets asked for (need_train / need_test), builds the model for
 * batch (shape and classes from the data, or from `shape` when no data is
 * opened: {C, H, W, classes}), the optimizer (if ocfg) and amp. The data's
 * headers are checked first -- the test set against the training set, and
 * weights (a weights or checkpoint file given as weights_flag, or NULL)
 * against them; a checkpoint resumed (weights with ocfg) against the run's
 * optimizer and normalisation -- then the
 * model is built (which refuses a model too large for the machine), and only
 * then is the data read. Prints the error and returns -1 on failure. */
int cli_session_open(cli_session *s, const cli_common *c, int need_train, int need_test, const int *shape,
                     const ampc_optim_config *ocfg, int64_t batch, const char *weights_flag, const char *weights);
void cli_session_close(cli_session *s);
/* Loads parameters and buffers by their PyTorch names from a safetensors file. */
int cli_load_weights(cli_session *s, const char *path);
/* Writes parameters (f32) and buffers under their PyTorch names. */
int cli_save_weights(cli_session *s, const char *path, const char *const *meta);
/* Mean loss and accuracy over a dataset (eval mode). */
int cli_evaluate(cli_session *s, const ampc_dataset *d, double *loss, double *acc);

/* inputs.c: checks that inputs agree, each printing one error and returning -1. */
/* The model (its name: model) and the input shape and classes a weights or
 * checkpoint file (given as flag) records (its header only is read) against
 * those the run builds,
 * which come from `against` ("the test set DIR/t10k-images-idx3-ubyte"); a
 * file that records none passes. */
int cli_check_weights_input(const char *flag, const char *path, const char *model, int channels, int height, int width, int classes,
                            const char *against);
/* "(2, 1, 28, 28)" of a safetensors tensor into buf: its first 4
 * dimensions, "..." after them where it has more. */
const char *cli_st_shape(const ampc_st_tensor *t, char *buf, size_t len);
/* A `grad` batch file's x (N, C, H, W) and y (N): present, of those ranks,
 * and every size in range in its full width; fills shape {C, H, W, classes}
 * and *n. */
int cli_check_batch(const char *path, const ampc_st_tensor *x, const ampc_st_tensor *y, int classes, int shape[4], int64_t *n);
/* The preprocessing record a file written by ampc carries (a checkpoint's in
 * its "ampc" metadata object, a --save weights file's as its own metadata
 * entry), checked as ampc_preprocessing_parse checks it, into *out as a new
 * JSON reference for json_decref() (NULL when it has none): 0, or -1 after
 * one error naming what (a flag or command) and path. */
struct json_t;
int cli_file_preprocessing(const ampc_st_file *f, const char *what, const char *path, struct json_t **out);
/* --grad-accum at most the batches of an epoch of `images` in `batch`es. */
int cli_check_grad_accum(int accum, size_t images, int64_t batch);
/* Whether output path out is one of the files the run's dataset may be read
 * from (either split): 1 with *name its file name, else 0. */
int cli_output_is_data(const cli_common *c, const char *out, const char **name);
/* --dataset's canonical name ("fashion-mnist" for "fmnist"), as preprocessing records name it; the value as given where it is none */
const char *cli_dataset_name(const cli_common *c);
/* A resumed run state against this run: its epoch within --epochs' range and
 * its batch within the `batches` of an epoch here; names the checkpoint. */
int cli_check_resume(const char *path, const ampc_train_state *ts, int64_t batches);

#endif
