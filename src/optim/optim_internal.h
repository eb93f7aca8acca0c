/* Internal: the optimizer's per-step constants and its element kernels.
 *
 * A kernel updates n consecutive elements; its pointers are already offset
 * to the first one. Two builds of each kernel exist: a portable one (fmaf
 * from libm) and, on x86-64, an AVX2+FMA one. Every operation in both is a
 * single IEEE-rounded f32 operation (mul, fma, div, sqrt, add) in the same
 * order, so they are bit-identical. */
#ifndef AMPC_OPTIM_INTERNAL_H
#define AMPC_OPTIM_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "ampc/optim.h"

/* Fixed by begin_step. Every value is f32 because torch's CPU kernels cast
 * their Python-float arguments to the tensor type; the ones torch derives in
 * Python (1 - beta1, lr / bias_correction1, ...) are computed in double
 * first, as there. */
typedef struct {
  float neg_lr;               /* SGD: w += neg_lr * d */
  float weight_decay;         /* L2 term g += wd * w (SGD, Adam); 0 = skipped, as torch does */
  float momentum;             /* SGD; 0 = no buffer */
  float one_minus_dampening;  /* SGD */
  int nesterov;               /* SGD */
  int first;                  /* SGD: this is step 1, the buffer starts as the gradient */
  int decoupled;              /* AdamW: w *= decay first */
  int amsgrad;
  float decay;                /* AdamW: 1 - lr * weight_decay */
  float beta1, one_minus_beta1, beta2, one_minus_beta2;
  float neg_step_size;        /* -lr / (1 - beta1^t) */
  float bias_correction2_sqrt; /* sqrt(1 - beta2^t) */
  float eps;
} ampc__optim_consts;

typedef struct {
  const char *name; /* "scalar" or "avx2" */
  /* buf: momentum buffer (NULL when momentum == 0). */
  void (*sgd)(const ampc__optim_consts *k, size_t n, float *w, const float *g, float gmul, float *buf);
  /* vmax: NULL unless amsgrad. */
  void (*adam)(const ampc__optim_consts *k, size_t n, float *w, const float *g, float gmul, float *m,
               float *v, float *vmax);
} ampc__optim_kernels;

extern const ampc__optim_kernels ampc__optim_kernels_scalar;
/* NULL where the AVX2 build is not compiled in (not x86-64). Whether the CPU
 * can run it is for the caller to check. */
extern const ampc__optim_kernels *const ampc__optim_kernels_avx2;

/* The kernels a new optimizer uses: AVX2 where compiled in and the CPU has
 * AVX2 and FMA, else scalar. */
const ampc__optim_kernels *ampc__optim_kernels_best(void);

/* Makes o use the given kernels (tests compare the builds on one object
 * type); the caller has checked that the CPU can run them. */
void ampc__optim_set_kernels(ampc_optim *o, const ampc__optim_kernels *k);
const ampc__optim_kernels *ampc__optim_get_kernels(const ampc_optim *o);

#endif
