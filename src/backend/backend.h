/*
 * backend.h -- the private interface between the graph and a compute backend.
 *
 * The graph hands a backend one op at a time as an ampc__op_call: typed views
 * of every input, output and gradient, with the effective batch applied. A
 * backend fills a table of forward and backward kernels per op kind; the CPU
 * backend is the reference, a CUDA one later implements the same table. Models,
 * optimizers and the amp layer never see this header.
 */
#ifndef AMPC_BACKEND_H
#define AMPC_BACKEND_H

#include "ampc/graph.h"

#define AMPC__MAX_INPUTS 6

typedef struct {
  int stride, pad, k;      /* conv, pooling */
  float momentum, eps;     /* batch norm */
  float label_smoothing;   /* cross entropy */
  int relu;                /* batch norm, add: a ReLU fused into the output */
  int pool;                /* batch norm: a 2x2 stride-2 max pool fused after that:
                            * out and dout are the pooled planes */
} ampc__op_attr;

typedef struct {
  ampc_op_kind op;
  int n_in;
  ampc_tensor in[AMPC__MAX_INPUTS];   /* forward inputs */
  ampc_tensor din[AMPC__MAX_INPUTS];  /* their gradients; data NULL = not needed */
  int din_acc[AMPC__MAX_INPUTS];      /* 1: add into din, 0: overwrite */
  ampc_tensor out, dout;
  ampc__op_attr attr;
  float *aux;                         /* op-owned saved state (bn: mean, invstd) */
  void *ws;                           /* workspace, ws_size bytes, for this call */
  size_t ws_size;
  int training;
  int nthreads;
  float seed;                         /* d(loss) for the loss op's backward */
  double *timers;                     /* profiling: conv backward data [0], weights [1] */
  int64_t *grad_stats;                /* weight gradients stored: [0] values, [1] underflowed */
  int conv_algo;                      /* ampc_conv_algo the graph asks for */
} ampc__op_call;

typedef ampc_status (*ampc__kernel_fn)(const ampc__op_call *c);

typedef struct {
  const char *name;
  ampc__kernel_fn fwd[AMPC_OP_COUNT];
  ampc__kernel_fn bwd[AMPC_OP_COUNT];
  /* Workspace bytes an op needs (forward and backward), for the built shapes. */
  size_t (*workspace)(const ampc__op_call *c, int nthreads);
  /* Floats of saved state an op keeps between forward and backward. */
  size_t (*aux_floats)(const ampc__op_call *c);
  void *(*alloc)(size_t bytes);       /* zeroed, 64-byte aligned */
  void (*free)(void *p);
} ampc__backend;

const ampc__backend *ampc__backend_cpu(void);

#endif
