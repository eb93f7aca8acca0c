/*
 * checkpoint.h -- everything a run needs to continue exactly, in one
 * safetensors file that PyTorch tools can read.
 *
 * Tensors: the model's parameters and buffers under their PyTorch names in
 * their stored type (so `model.load_state_dict` takes them), "master.<name>"
 * for the f32 master weights, "optim.<state>.<name>" for the optimizer state
 * (exp_avg, exp_avg_sq, momentum_buffer, ...). __metadata__ holds "format"
 * ("ampc-checkpoint"), "format_version" and "ampc": a JSON object with the
 * model, the opt level and every amp property, the epoch and step, each loss
 * scaler's state, the seed, the loader position (and the ranks and global
 * batch it counts in), the running metrics and,
 * where the caller sets it, "preprocessing": how the model's inputs were
 * made from the dataset's pixels ({"dataset", "normalize", "mean", "std",
 * "shape": [C, H, W], "formula"}), so that another framework can feed the
 * model the same inputs.
 *
 *     ampc_train_state ts = {...};
 *     ampc_checkpoint_save("run/ckpt.safetensors", m, amp, opt, &ts);   // atomic
 *     ampc_checkpoint_load("run/ckpt.safetensors", m, amp, opt, &ts);   // exact resume
 *
 * Writes are atomic (temporary file, fsync, rename, fsync of the folder): a
 * failure leaves the previous file as it was and is reported.
 */
#ifndef AMPC_CHECKPOINT_H
#define AMPC_CHECKPOINT_H

#include "ampc/amp.h"
#include "ampc/data.h"
#include "ampc/nn.h"
#include "ampc/safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

#define AMPC_CHECKPOINT_FORMAT "ampc-checkpoint"
#define AMPC_CHECKPOINT_VERSION 1

typedef struct {
  uint64_t seed;
  int64_t epoch;        /* epoch in progress (0-based) */
  int64_t batch;        /* next batch of that epoch */
  int64_t step;         /* optimizer steps taken (applied or skipped) */
  double loss_sum;      /* of the epoch so far: sum of loss * images */
  int64_t seen;         /* images of the epoch so far */
  int64_t skipped;      /* skipped steps of the epoch so far */
  int64_t skipped_total;
  double train_seconds; /* of the epoch so far */
  /* The run that saved it: its ranks and its images per batch over all of
   * them (data-parallel: ranks x --batch-size), so that a run with another
   * count can start at the same image of the epoch. 0 where unknown
   * (checkpoints written before these were recorded). */
  int64_t world_size;
  int64_t global_batch;
  /* Saved when preprocessing.dataset is set (ampc_dataset_preprocessing());
   * loading fills it from a checkpoint that has it and leaves it as it was
   * for one that has not (checkpoints written before it was recorded). */
  ampc_preprocessing preprocessing;
  /* --amp-report's gradient statistics of the epoch so far
   * (ampc_amp_get_grad_stats), so that an epoch resumed from the checkpoint
   * reports its steps before the resume too. has_grad_stats 0: not recorded
   * (the run did not gather them, or the checkpoint predates them). */
  int has_grad_stats;
  int64_t grad_values, grad_underflow;
  double grad_max_abs;
  /* The steps since the last step record (--log-every): their summed loss
   * (NaN where one was not finite) and their count, so that the first
   * record after a resume averages the same steps. */
  double log_loss_sum;
  int64_t log_steps;
} ampc_train_state;

/* path, m and amp may not be NULL (AMPC_EINVAL); opt may (no optimizer
 * state saved), and a NULL ts saves a run state of zeros but its step, which
 * is the optimizer's step count (0 without opt). A run state that
 * ampc_checkpoint_load would refuse (a count out of its range, a non-finite
 * sum, more optimizer steps than steps) is not written: AMPC_EINVAL with
 * loading's message naming the entry, and the file there before kept. */
ampc_status ampc_checkpoint_save(const char *path, ampc_model *m, ampc_amp *amp, ampc_optim *opt,
                                 const ampc_train_state *ts);
/* Checks that the file is an ampc checkpoint of a supported version for the
 * same model, input shape, class count and opt level, and that every number
 * of its metadata is in range (in its full 64-bit width), then restores
 * everything: the model (as ampc_checkpoint_load_weights does), the
 * optimizer state, each loss scaler's state and the run state. Nothing is
 * restored when a check fails. opt and ts may be NULL (not restored); path,
 * m and amp may not (AMPC_EINVAL). */
ampc_status ampc_checkpoint_load(const char *path, ampc_model *m, ampc_amp *amp, ampc_optim *opt,
                                 ampc_train_state *ts);

/* A weights file: every parameter as f32 (the masters' values, or the
 * model's converted) and every buffer as stored, under the PyTorch names;
 * meta as for ampc_st_write. Atomic like a checkpoint. amp may be NULL (the
 * model's own values); path and m may not (AMPC_EINVAL). */
ampc_status ampc_checkpoint_save_weights(const char *path, ampc_model *m, ampc_amp *amp, const char *const *meta);
/* Loads every parameter and buffer of m by name from a weights file or a
 * checkpoint (a parameter from its f32 master copy where the file has one),
 * into the model and, with master weights, the masters. Like PyTorch's
 * load_state_dict(strict=True): a missing tensor, a wrong shape, or a tensor
 * that belongs to neither the model nor a checkpoint's own sections is an
 * error naming the file and the tensor. */
ampc_status ampc_checkpoint_load_weights(const char *path, ampc_model *m, ampc_amp *amp);

/* The input shape (C x H x W) and class count a file written by ampc (a
 * checkpoint, or weights saved by `ampc train --save`) was made for, from its
 * metadata: "input" ("1x28x28") and "classes" ("10"). Returns 1 with them
 * filled, 0 when the file records neither (weights from another program or
 * an older ampc), AMPC_EFORMAT when they are malformed or out of range,
 * AMPC_EINVAL for a NULL argument. f may come from ampc_st_open_header. */
ampc_status ampc_checkpoint_input(const ampc_st_file *f, int *channels, int *height, int *width,
                                  int *classes);

#ifdef __cplusplus
}
#endif
#endif
