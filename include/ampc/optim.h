/*
 * optim.h -- SGD, Adam and AdamW with torch.optim's exact update rules, and
 * learning-rate schedules with torch.optim.lr_scheduler's semantics.
 *
 * An optimizer updates one flat f32 array of numel parameters (all of a
 * model's tensors carved from one buffer) from a gradient array of the same
 * length. Its state (exp_avg, ...) lives in buffers of numel floats each,
 * indexed like the parameters, so a checkpoint saves it as named arrays. The
 * state lives on a device (ampc/backend.h): the cpu's until the amp layer
 * takes the optimizer to the graph's device; it is read and written through
 * ampc_optim_state_read/write.
 *
 *     ampc_optim_config c;
 *     ampc_optim_config_default(&c, AMPC_OPTIM_SGD);
 *     c.lr = 0.1f; c.momentum = 0.9f; c.weight_decay = 5e-4f; c.nesterov = 1;
 *     ampc_optim *opt;
 *     if (ampc_optim_create(&opt, &c, numel) < 0) ...ampc_last_error()...
 *
 *     ampc_lr_schedule s = {.kind = AMPC_LR_COSINE, .t_max = epochs, .warmup = 5,
 *                           .warmup_start_factor = 0.1f};
 *     for (int64_t epoch = 0; epoch < epochs; epoch++)
 *       for (each batch) {
 *         ...forward, backward into grads...
 *         ampc_optim_step(opt, params, grads, ampc_lr_at(&s, c.lr, epoch));
 *       }
 *     ampc_optim_free(opt);
 *
 * The mixed-precision layer steps the optimizer itself, on the device: one
 * fused pass that unscales the gradients, updates the f32 masters and
 * writes the 16-bit model copy (ampc_amp_step). Both give the same bits.
 *
 * Parity with PyTorch: the arithmetic is torch 1.13's single-tensor
 * (foreach=False) CPU code, rounding for rounding: per-step constants are
 * computed in double and rounded to f32 as torch does when it hands a Python
 * float to a kernel, and the same products are fused (torch's add(alpha=) and
 * addcmul are an FMA in its AVX2/AVX-512 kernels). Given the same f32 values,
 * the trajectories match torch bit for bit. The config holds f32, so a
 * decimal such as beta2 = 0.999 is 0.99900001 here while torch uses the
 * double 0.999: 1 - beta2 then differs by 1.3e-5 (relative), which shows in
 * exp_avg_sq; the weights move by a few f32 ulps only. torch 2.x updates
 * exp_avg with lerp_, which rounds differently again by an ulp or so.
 */
#ifndef AMPC_OPTIM_H
#define AMPC_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include "ampc/dtype.h"
#include "ampc/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { AMPC_OPTIM_SGD, AMPC_OPTIM_ADAM, AMPC_OPTIM_ADAMW } ampc_optim_kind;

/* torch.optim's hyper-parameters (same names and meanings). SGD uses lr,
 * momentum, dampening, weight_decay, nesterov; Adam and AdamW use lr, beta1,
 * beta2, eps, weight_decay, amsgrad. Adam's weight_decay is L2 (added to the
 * gradient); AdamW's is decoupled (w *= 1 - lr*weight_decay before the step). */
typedef struct {
  ampc_optim_kind kind;
  float lr, momentum, dampening, weight_decay, beta1, beta2, eps;
  int nesterov, amsgrad;
} ampc_optim_config;

/* torch's defaults for kind; fields the kind does not use are 0. torch's SGD
 * has no default lr; here it is 1e-3. AdamW's weight_decay defaults to 1e-2. */
void ampc_optim_config_default(ampc_optim_config *c, ampc_optim_kind kind);
/* The checks torch's constructors make (lr, eps, momentum, weight_decay >= 0,
 * betas in [0, 1), nesterov needs momentum > 0 and dampening == 0), plus: all
 * values finite, and no option the kind does not have (momentum, dampening or
 * nesterov for Adam/AdamW, amsgrad for SGD). AMPC_EINVAL with a message. */
ampc_status ampc_optim_config_validate(const ampc_optim_config *c);
/* "sgd", "adam", "adamw" (case-insensitive). */
ampc_status ampc_optim_kind_parse(const char *name, ampc_optim_kind *out);
const char *ampc_optim_kind_name(ampc_optim_kind kind);

typedef struct ampc_optim ampc_optim;

/* Validates c (see above) and allocates the state for numel > 0 parameters,
 * zeroed, step count 0. */
ampc_status ampc_optim_create(ampc_optim **out, const ampc_optim_config *c, size_t numel);
void ampc_optim_free(ampc_optim *o);

/* One step over all numel values of host arrays: increments the step count,
 * then updates w (numel floats) from g (numel floats). lr is this step's
 * learning rate and replaces c->lr (which is the base a schedule starts
 * from: pass ampc_lr_at(&s, ampc_optim_get_config(o)->lr, t), or the
 * config's lr for a constant rate). AMPC_EINVAL if lr is negative or not
 * finite; AMPC_ESTATE once the optimizer belongs to amp on a device whose
 * memory is not host memory. The result does not depend on the thread count. */
ampc_status ampc_optim_step(ampc_optim *o, float *w, const float *g, float lr);

/* Steps taken (torch's state['step']). set_step_count restores it from a
 * checkpoint (with the state buffers); AMPC_EINVAL if step < 0, AMPC_ERANGE
 * if step > 2^53 (ampc_optim_step at count 2^53 is AMPC_ERANGE too). With SGD
 * momentum, the step after count 0 takes the gradient as the momentum buffer
 * (torch's buffer-is-None case). */
int64_t ampc_optim_step_count(const ampc_optim *o);
ampc_status ampc_optim_set_step_count(ampc_optim *o, int64_t step);

/* State buffers, numel floats each, named as in torch's state_dict:
 * SGD with momentum: "momentum_buffer"; SGD without: none;
 * Adam/AdamW: "exp_avg", "exp_avg_sq", and "max_exp_avg_sq" with amsgrad.
 * name() is NULL past the count; index() gives AMPC_ENOTFOUND for a name
 * this optimizer does not keep. read/write copy elements [offset, offset + n)
 * of buffer i out of / into the device (AMPC_ERANGE past the count or the
 * numel), e.g. to save and restore a checkpoint. */
size_t ampc_optim_state_count(const ampc_optim *o);
const char *ampc_optim_state_name(const ampc_optim *o, size_t i);
ampc_status ampc_optim_state_index(const ampc_optim *o, const char *name, size_t *i);
ampc_status ampc_optim_state_read(const ampc_optim *o, size_t i, size_t offset, size_t n, float *dst);
ampc_status ampc_optim_state_write(ampc_optim *o, size_t i, size_t offset, size_t n, const float *src);

const ampc_optim_config *ampc_optim_get_config(const ampc_optim *o);
size_t ampc_optim_numel(const ampc_optim *o);

/* ---- learning-rate schedules ---------------------------------------------
 *
 * lr(t) for an epoch (or iteration) index t >= 0, in closed form:
 *   constant: base
 *   step:     base * gamma^floor(t / step_size)                 (StepLR)
 *   cosine:   eta_min + (base - eta_min) * (1 + cos(pi * t / t_max)) / 2,
 *             t clamped at t_max                                 (CosineAnnealingLR)
 * With warmup > 0, the main schedule's t counts from the end of the warm-up
 * and a linear factor from warmup_start_factor to 1 over warmup iterations is
 * multiplied in, as SequentialLR([LinearLR(start_factor, total_iters=warmup),
 * main], milestones=[warmup]) does:
 *   lr(t) = main(max(t - warmup, 0)) * (start + (1 - start) * min(t, warmup) / warmup)
 * torch's schedulers mostly update recursively (lr *= ...); the closed form
 * agrees with them to f32 rounding, except that torch's CosineAnnealingLR
 * rises again after t_max where this one stays at eta_min.
 */
typedef enum { AMPC_LR_CONSTANT, AMPC_LR_STEP, AMPC_LR_COSINE } ampc_lr_kind;

typedef struct {
  ampc_lr_kind kind;
  int64_t step_size;         /* step: epochs between decays, >= 1 */
  float gamma;               /* step: decay factor, >= 0 */
  int64_t t_max;             /* cosine: length of the half period, >= 1 */
  float eta_min;             /* cosine: final rate, >= 0 */
  int64_t warmup;            /* 0 for none */
  float warmup_start_factor; /* in (0, 1] when warmup > 0 */
} ampc_lr_schedule;

/* torch's defaults: gamma 0.1, eta_min 0, warmup 0, warmup_start_factor 1/3.
 * step_size and t_max have no default (torch requires them) and are left 0,
 * which validate refuses until they are set. */
void ampc_lr_schedule_default(ampc_lr_schedule *s, ampc_lr_kind kind);
/* AMPC_EINVAL naming the offending field. */
ampc_status ampc_lr_schedule_validate(const ampc_lr_schedule *s);
/* The rate for index t (t < 0 counts as 0). For a schedule validate refuses,
 * the result is base_lr. */
float ampc_lr_at(const ampc_lr_schedule *s, float base_lr, int64_t t);
/* "constant", "step", "cosine" (case-insensitive). */
ampc_status ampc_lr_kind_parse(const char *name, ampc_lr_kind *out);
const char *ampc_lr_kind_name(ampc_lr_kind kind);

#ifdef __cplusplus
}
#endif
#endif
