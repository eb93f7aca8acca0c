/* Internal layout of the graph (shared by graph.c and the memory report). */
#ifndef AMPC_CORE_GRAPH_INTERNAL_H
#define AMPC_CORE_GRAPH_INTERNAL_H

#include "ampc/graph.h"
#include "backend/backend.h"

typedef struct {
  ampc_op_kind op;
  char *name;            /* leaves: the PyTorch name; ops: "conv2d#12" */
  ampc_shape shape;      /* as built (full batch) */
  ampc_dtype dtype;      /* storage, fixed at compile */
  int batched;           /* dim 0 follows the effective batch */
  int requires_grad;
  int is_norm;
  int n_in;
  ampc_value in[AMPC__MAX_INPUTS];
  ampc__op_attr attr;
  ampc_value alias;      /* flatten, fused ops: the value whose memory this one shares */
  ampc_value pool_out;   /* batch norm with a fused 2x2 max pool: the pool's value */
  ampc_shape store;      /* the shape of its memory: shape, or pool_out's */
  float *init;           /* params and buffers: recorded f32 values */
  void *data, *grad;
  float *aux;
  size_t aux_floats;
  size_t param_offset;   /* params: offset in the flat element numbering */
  size_t grad_off;       /* activations: offset in the planned gradient arena */
  size_t act_off;        /* activations: offset in the planned value arena */
  int keep;              /* readable after forward even if backward does not need it */
} ampc__value;

struct ampc_graph {
  ampc__value *v;
  size_t nv, cap;
  ampc_status err;
  int compiled;
  ampc_graph_precision prec;
  ampc_value *order;     /* execution order of op values */
  size_t norder;
  ampc_value *params, *buffers;
  size_t nparams, nbuffers, param_numel, cap_params, cap_buffers;
  uint64_t init_bytes;   /* recorded values of params and buffers, for the memory check */
  int64_t max_batch, batch;
  int nthreads;
  int profiling;
  int fuse;              /* fuse ReLUs into batch norm / add (default on) */
  int retain_grads;      /* every activation gradient its own buffer */
  int conv_algo;         /* ampc_conv_algo */
  unsigned char *bw_reach, *bw_written; /* per backward: ops that reach the loss, gradients written */
  double t_fwd[AMPC_OP_COUNT], t_bwd[AMPC_OP_COUNT];
  double t_conv_split[2];
  int count_underflow;   /* backward fills grad_stats */
  int64_t grad_stats[2];  /* weight-gradient values stored, and those lost to underflow */
  int ws_threads;        /* threads the workspace was sized for */
  const ampc__backend *be;
  void *param_arena, *grad_arena, *act_arena, *actgrad_arena, *ws;
  size_t param_bytes, grad_bytes, act_bytes, actgrad_bytes, ws_bytes;
  size_t bytes_by_type[4][AMPC_DTYPE_COUNT]; /* params, grads, acts, actgrads */
};

/* The recorded f32 values of a parameter or buffer (its numel floats), for a
 * builder to fill in place; NULL for any other value. */
float *ampc__graph_init_data(ampc_graph *g, ampc_value v);

/* The machine's physical memory in bytes (0 if unknown): no plan larger than
 * this, and no set of parameters larger than half of it, is allocated. */
uint64_t ampc__physical_memory(void);

#endif
