/* Checks that the inputs of a command agree with each other -- the data, a
 * weights or checkpoint file, a `grad` batch, the counts given as flags --
 * made from their headers and metadata before anything is read or allocated
 * for them. Each prints one error naming both sides and returns -1. */
#include <jansson.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "ampc/checkpoint.h"
#include "ampc/data.h"
#include "session.h"

int cli_check_weights_input(const char *flag, const char *path, const char *model, int channels, int height, int width, int classes,
                            const char *against) {
  ampc_st_file *f;
  if (ampc_st_open_header(&f, path) < 0) {
    cli_lib_error(flag);
    return -1;
  }
  /* the model the file holds: a weights file's "model" entry, a checkpoint's in its "ampc" object */
  char held[64] = "";
  const char *m = ampc_st_metadata(f, "model"), *js = ampc_st_metadata(f, "ampc");
  if (m) snprintf(held, sizeof held, "%s", m);
  else if (js) {
    json_error_t je;
    json_t *root = json_loads(js, JSON_REJECT_DUPLICATES, &je);
    const char *n = json_string_value(json_object_get(root, "model"));
    if (n) snprintf(held, sizeof held, "%s", n);
    json_decref(root);
  }
  int c, h, w, k;
  ampc_status st = ampc_checkpoint_input(f, &c, &h, &w, &k);
  ampc_st_close(f);
  if (model && held[0] && strcmp(held, model) != 0) {
    cli_error("%s: %s holds model %s, not %s (--model)", flag, path, held, model);
    return -1;
  }
  if (st < 0) {
    cli_lib_error(flag);
    return -1;
  }
  if (st == 1 && (c != channels || h != height || w != width || k != classes)) {
    cli_error("%s: %s was made for %dx%dx%d inputs and %d classes, but %s has %dx%dx%d inputs and %d classes",
              flag, path, c, h, w, k, against, channels, height, width, classes);
    return -1;
  }
  return 0;
}

const char *cli_st_shape(const ampc_st_tensor *t, char *buf, size_t len) {
  ampc_shape s = {.ndim = t->ndim < AMPC_MAX_DIMS ? t->ndim : AMPC_MAX_DIMS};
  for (int d = 0; d < s.ndim; d++) s.d[d] = t->shape[d];
  ampc_shape_str(&s, buf, len);
  if (t->ndim > AMPC_MAX_DIMS && strlen(buf) + 4 <= len) strcat(buf, "...");
  return buf;
}

int cli_check_batch(const char *path, const ampc_st_tensor *x, const ampc_st_tensor *y, int classes, int shape[4], int64_t *n) {
  char xs[96], ys[96];
  if (!x || !y) {
    cli_error("--batch: %s has no tensor '%s' (expected x, the images (N, C, H, W), and y, their N labels)", path, !x ? "x" : "y");
    return -1;
  }
  if (x->ndim != 4 || y->ndim != 1 || y->shape[0] != x->shape[0]) {
    cli_error("--batch: %s: x is %s and y %s, expected x (N, C, H, W) and y (N)", path, cli_st_shape(x, xs, sizeof xs),
              cli_st_shape(y, ys, sizeof ys));
    return -1;
  }
  /* each size in its full width before it becomes an int */
  if (x->shape[0] < 1 || x->shape[0] > CLI_MAX_BATCH) {
    cli_error("--batch: %s: x has a batch of %lld, expected 1..%d", path, (long long)x->shape[0], CLI_MAX_BATCH);
    return -1;
  }
  for (int d = 1; d < 4; d++)
    if (x->shape[d] < 1 || x->shape[d] > INT_MAX) {
      cli_error("--batch: %s: x (N, C, H, W) has %s %lld, expected 1..%d", path, d == 1 ? "C" : d == 2 ? "H" : "W", (long long)x->shape[d], INT_MAX);
      return -1;
    }
  shape[0] = (int)x->shape[1];
  shape[1] = (int)x->shape[2];
  shape[2] = (int)x->shape[3];
  shape[3] = classes;
  *n = x->shape[0];
  return 0;
}

int cli_check_grad_accum(int accum, size_t images, int64_t batch) {
  int64_t batches = (int64_t)((images + (size_t)batch - 1) / (size_t)batch);
  if (accum > batches) {
    cli_error("--grad-accum: %d is more than the %lld batches of an epoch (%zu training images in batches of %lld): each epoch's one step would sum only %lld micro-batches: give at most %lld",
              accum, (long long)batches, images, (long long)batch, (long long)batches, (long long)batches);
    return -1;
  }
  return 0;
}

int cli_check_resume(const char *path, const ampc_train_state *ts, int64_t batches) {
  /* the epoch loop counts in int: an epoch past --epochs' range would wrap */
  if (ts->epoch > CLI_MAX_COUNT) {
    cli_error("--resume: %s: the checkpoint is at epoch %lld, beyond the most a run can have (%lld)", path, (long long)ts->epoch + 1,
              CLI_MAX_COUNT);
    return -1;
  }
  if (ts->batch > batches) {
    cli_error("--resume: %s: the checkpoint is at batch %lld of epoch %lld, but an epoch here has %lld batches (another --batch-size or --train-limit?)",
              path, (long long)ts->batch, (long long)ts->epoch + 1, (long long)batches);
    return -1;
  }
  return 0;
}

int cli_file_preprocessing(const ampc_st_file *f, const char *what, const char *path, json_t **out) {
  *out = NULL;
  json_error_t je;
  const char *own = ampc_st_metadata(f, "preprocessing"), *js = own ? own : ampc_st_metadata(f, "ampc");
  json_t *root = js ? json_loads(js, JSON_REJECT_DUPLICATES, &je) : NULL;
  json_t *p = own ? root : json_incref(json_object_get(root, "preprocessing"));
  if (!own) json_decref(root);
  if (!p && !own) return 0; /* none recorded (a checkpoint's malformed "ampc" object is the library's to refuse) */
  /* checked as the library reads it (a checkpoint's, nested in its "ampc"
   * object, as text again): what a later run or export is told must be sound */
  char *nested = own ? NULL : json_dumps(p, JSON_COMPACT | JSON_ENCODE_ANY); /* (any value: the parser names what is wrong) */
  ampc_preprocessing pp;
  if (!own && !nested) {
    cli_error("%s: %s: out of memory", what, path);
  } else if (ampc_preprocessing_parse(own ? own : nested, &pp) < 0) {
    cli_error("%s: %s: its preprocessing record is malformed: %s", what, path, ampc_last_error());
  } else {
    free(nested);
    *out = p;
    return 0;
  }
  free(nested);
  json_decref(p);
  return -1;
}

