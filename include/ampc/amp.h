/*
 * amp.h -- mixed-precision training: apex's amp.initialize / scale_loss /
 * optimizer.step, in C.
 *
 *     ampc_amp_config cfg;
 *     ampc_amp_config_init(&cfg, AMPC_OPT_O2, AMPC_DTYPE_F16);   // + overrides
 *     ampc_optim *opt;  ampc_optim_create(&opt, &ocfg, ampc_graph_param_numel(g));
 *     ampc_amp *amp;    ampc_amp_initialize(&amp, g, opt, &cfg);  // casts, compiles
 *     for (...) {
 *         ampc_graph_write(g, x, images, AMPC_DTYPE_F32);   // converted to the model's type
 *         ampc_graph_write(g, y, labels, AMPC_DTYPE_I32);
 *         ampc_amp_forward(amp, 1);
 *         ampc_amp_backward(amp, loss, 0, 0);      // loss * scale, backward
 *         ampc_amp_step(amp, lr, &info);           // unscale, check, step or skip
 *     }
 *
 * initialize() applies the opt level to the graph: the storage type of every
 * parameter and activation (O2: half model, f32 batch norm, input cast to half,
 * logits to f32 before the loss; O1: the per-op cast policy; O3: all half),
 * then compiles it. With master weights the optimizer owns f32 copies of every
 * parameter. With one backward per step the step reads the half gradients
 * themselves (converting as it goes); once backward accumulates (micro-batches)
 * or there are several losses, they are folded into f32 gradients, unscaled
 * per loss. step() makes one pass to find inf/NaN and the global norm
 * and, when the gradients are finite, one fused pass that runs the optimizer on
 * the f32 masters and writes the half model copy. An overflowing step changes
 * nothing: weights, optimizer moments and step count stay bit-identical, the
 * scale backs off, the gradients are cleared.
 *
 * Everything runs on the graph's device (ampc/backend.h): masters, f32
 * gradients and the optimizer's state live there, the passes are the
 * backend's, and a step reads one small result back to decide. With a
 * communicator (ampc/comm.h) the same step averages the gradients over the
 * ranks first and agrees on the overflow flag and the norm, so every rank
 * skips or steps alike.
 */
#ifndef AMPC_AMP_H
#define AMPC_AMP_H

#include "ampc/amp_config.h"
#include "ampc/comm.h"
#include "ampc/graph.h"
#include "ampc/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ampc_amp ampc_amp;

#define AMPC_AMP_MAX_REPORTED 3

typedef struct {
  int applied;             /* 1: the optimizer stepped; 0: skipped */
  int found_inf;           /* some gradient was inf or NaN */
  float scale;             /* loss scale of loss 0 after the update */
  float grad_norm;         /* global L2 norm of the unscaled gradients (inf on overflow) */
  float clip_coef;         /* applied clipping coefficient (1 = none) */
  int n_nonfinite;         /* parameters with non-finite gradients (counted up to all) */
  const char *nonfinite[AMPC_AMP_MAX_REPORTED]; /* the first of their names */
} ampc_amp_step_info;

/* Gradient statistics since the last reset (for --amp-report). */
typedef struct {
  int64_t values;          /* non-zero gradient values (computed in f32) stored into 16-bit tensors */
  int64_t underflow;       /* of those, the ones that became zero or subnormal there */
  float max_abs;           /* largest unscaled gradient magnitude (an overflowing step: the least that overflows at its scale) */
} ampc_amp_grad_stats;

/* apex's O1 op lists (the policy initialize gives the graph under autocast). */
ampc_cast_policy ampc_amp_cast_policy(ampc_op_kind k);

/* Applies the opt level to g and compiles it; takes opt's state to g's
 * device. opt may be NULL (no optimizer: step() is then AMPC_ESTATE); g, cfg
 * and out may not (AMPC_EINVAL). The amp borrows g and opt: both must outlive
 * it (free the amp first; freeing the optimizer or the graph -- or the model
 * that owns it -- while the amp is alive is a use-after-free). */
ampc_status ampc_amp_initialize(ampc_amp **out, ampc_graph *g, ampc_optim *opt, const ampc_amp_config *cfg);
void ampc_amp_free(ampc_amp *a);
const ampc_amp_config *ampc_amp_get_config(const ampc_amp *a);

/* Forward pass (training = 1 uses batch statistics). */
ampc_status ampc_amp_forward(ampc_amp *a, int training);
/* scale_loss + backward for loss_id: gradients of loss * scale[loss_id].
 * With f32 gradient buffers (several losses, or master weights once a
 * backward accumulates: the buffer is made by the first such call) the
 * model's gradients are folded into them before this returns: what the step
 * reads then is those f32 gradients, not ampc_graph_grad()'s.
 * accumulate = 0 starts a new step's gradients, 1 adds this micro-batch (or
 * this second loss) to them; the unscale happens once, at step time. */
ampc_status ampc_amp_backward(ampc_amp *a, ampc_value loss, int loss_id, int accumulate);
/* Multiplies every loss by w before backward (1/N for N accumulated
 * micro-batches, so that the step sees the mean over all of them). */
void ampc_amp_set_loss_weight(ampc_amp *a, float w);
/* Clip the unscaled gradients' global norm to max_norm in every step (0: off). */
void ampc_amp_set_clip_grad_norm(ampc_amp *a, float max_norm);
/* Stochastic rounding of updates written into half weights when there are no
 * f32 masters (O3, O2 without master weights); seeded, reproducible. */
void ampc_amp_set_stochastic_rounding(ampc_amp *a, int on, uint64_t seed);
/* Data-parallel training: the step averages the gradients over c's ranks
 * and agrees on overflow and the norm (NULL: one process, the default).
 * The settings below take effect between steps; set the communicator
 * first. */
void ampc_amp_set_comm(ampc_amp *a, ampc_comm *c);
/* 16-bit gradients are all-reduced in their own type by default (each
 * rank's divided by the rank count first, then summed: half the bytes of
 * f32); on: converted to f32 and summed there, and the step reads those f32
 * sums (more memory: an f32 copy of the gradients). */
void ampc_amp_set_allreduce_f32(ampc_amp *a, int on);
/* Gradient buckets of about this many bytes (default 25 MB, DDP's; the
 * first of each storage type at most 1 MB): each bucket's all-reduce
 * starts as soon as backward has written all of its gradients. */
ampc_status ampc_amp_set_bucket_bytes(ampc_amp *a, size_t bytes);
/* While on, backward leaves the gradients local (DDP's no_sync(), for the
 * micro-batches before the last of a step); the step averages them all. */
void ampc_amp_set_no_sync(ampc_amp *a, int on);
/* The gradients averaged across the ranks now (blocking), if backward has
 * not done it; the step does not do it again. A no-op for one rank. */
ampc_status ampc_amp_sync_grads(ampc_amp *a);
/* ZeRO stage 1 (stage 1; 0 is the default): the f32 masters and the
 * optimizer state sharded across the ranks -- rank r keeps its 1/N of the
 * flat parameters' (ampc_amp_memory reports those bytes) -- the gradients
 * reduce-scattered, each rank updating its shard, the model's weights
 * all-gathered. Once per amp, after ampc_amp_set_comm; a no-op for one
 * rank. Reading masters or optimizer state beyond a rank's shard
 * (ampc_amp_param_values, a checkpoint) needs ampc_amp_gather_state. */
ampc_status ampc_amp_set_zero(ampc_amp *a, int stage);
int ampc_amp_zero_stage(const ampc_amp *a);
/* With ZeRO-1: every rank gathers the full masters and optimizer state
 * (a collective: every rank calls it), which the reads of masters and
 * state then serve until ampc_amp_release_state frees them. A no-op
 * without ZeRO. */
ampc_status ampc_amp_gather_state(ampc_amp *a);
void ampc_amp_release_state(ampc_amp *a);
/* SyncBatchNorm: batch norm in training computes its statistics over the
 * global batch -- the per-channel sums of every rank all-reduced between
 * its statistics and its normalisation, and again in backward -- instead of
 * each rank's own (the default, DDP's). After ampc_amp_set_comm. */
ampc_status ampc_amp_set_sync_batchnorm(ampc_amp *a, int on);
/* Whether the ranks still agree: every loss scale and the optimizer's step
 * count compared across them (a cheap all-reduce; every rank calls it). A
 * rank whose state has drifted is an AMPC_ESTATE error naming the values.
 * The step runs it every 100 steps by itself. */
ampc_status ampc_amp_check_ranks(ampc_amp *a);

/* What the gradient all-reduce cost (data-parallel). */
typedef struct {
  int64_t steps;           /* steps whose gradients were averaged across the ranks */
  int buckets;             /* gradient buckets */
  double bytes;            /* gradient bytes this rank put into the reductions */
  double seconds;          /* communication windows, summed: from the first bucket's
                            * start to the last one's completion */
  double exposed_seconds;  /* of that, the time this rank spent in communication
                            * calls (starting, progressing, waiting): what overlap
                            * with backward did not hide */
} ampc_amp_comm_stats;
void ampc_amp_get_comm_stats(ampc_amp *a, ampc_amp_comm_stats *st, int reset);
/* Unscale, check, clip, step or skip, update the scale(s), clear the gradients. */
ampc_status ampc_amp_step(ampc_amp *a, float lr, ampc_amp_step_info *info);
/* The unscaled f32 gradient of every parameter into out (param_numel floats,
 * in the flat order of ampc_graph_param_offset); *found_inf (if not NULL)
 * says whether any was non-finite. Does not change the gradients. */
ampc_status ampc_amp_unscaled_grads(ampc_amp *a, float *out, int *found_inf);

ampc_scaler *ampc_amp_scaler(ampc_amp *a, int loss_id);
/* 1 if the step keeps f32 master weights. */
int ampc_amp_has_master_weights(const ampc_amp *a);
/* The current f32 value of every parameter into out (param_numel floats, flat
 * order): the masters, or the model's copy converted. */
ampc_status ampc_amp_param_values(ampc_amp *a, float *out);
/* Sets every parameter (masters and the model copy) from f32 values. */
ampc_status ampc_amp_load_params(ampc_amp *a, const float *values);
/* One parameter's f32 master weights by name, n values (its numel):
 * AMPC_ESTATE without masters, AMPC_ENOTFOUND for an unknown name,
 * AMPC_EINVAL for a wrong n. */
ampc_status ampc_amp_read_master(const ampc_amp *a, const char *param, float *dst, size_t n);
ampc_status ampc_amp_write_master(ampc_amp *a, const char *param, const float *src, size_t n);
/* One parameter's optimizer state of the given kind ("exp_avg", ...) by name. */
ampc_status ampc_amp_read_optim_state(const ampc_amp *a, const char *state, const char *param, float *dst, size_t n);
ampc_status ampc_amp_write_optim_state(ampc_amp *a, const char *state, const char *param, const float *src, size_t n);
/* Gradient statistics (values, underflow, max_abs) since the last reset; the
 * underflow counts need ampc_amp_set_grad_stats(a, 1) first. */
void ampc_amp_set_grad_stats(ampc_amp *a, int on);
void ampc_amp_get_grad_stats(ampc_amp *a, ampc_amp_grad_stats *st, int reset);
/* Everything the training step holds: the graph's bytes plus master weights,
 * master gradients and optimizer state (all zero for a NULL a). */
void ampc_amp_memory(const ampc_amp *a, ampc_mem_report *r);

#ifdef __cplusplus
}
#endif
#endif
