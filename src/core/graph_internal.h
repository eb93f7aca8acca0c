/*
 * Internal layout of the graph, shared by its parts:
 *
 *   graph.c            recording (values, leaves, ops) and access by value
 *   graph_precision.c  the precision pass: storage types and inserted casts
 *   graph_plan.c       the memory planner for activations and their gradients
 *   graph_compile.c    compile: what needs a gradient, fusion, the flat
 *                      parameter buckets, allocation on the device
 *   graph_exec.c       execution (forward, backward), the device, reading
 *                      and writing values
 *
 * Device memory (every value's data and grad, the arenas) is only ever used
 * for pointer arithmetic here; the backend alone dereferences it.
 */
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
  ampc_value pro;        /* conv2d: the batch norm (attr.nostore or recompute) it applies to its input
                          * as it loads it, reading that batch norm's input */
  ampc_shape store;      /* the shape of its memory: shape, or pool_out's */
  float *init;           /* params and buffers: recorded f32 values (host) */
  void *data, *grad;     /* device memory */
  float *aux;            /* device memory */
  size_t aux_floats;
  size_t param_offset;   /* params: offset in the flat element numbering */
  size_t grad_off;       /* activations: offset in the planned gradient arena */
  size_t act_off;        /* activations: offset in the planned value arena */
  unsigned char bw_freed; /* free_saved: its memory is reused once backward has read it */
  size_t ws_need;        /* ops: the workspace the backend asks for (forward or backward) */
  size_t ws_off[2];      /* free_saved: the op's workspace in the arena, forward / backward
                          * (SIZE_MAX: the graph's shared one) */
  int keep;              /* readable after forward even if backward does not need it */
} ampc__value;

/* A run of the flat parameter numbering in one storage type: the model's
 * parameters of that type, back to back, and their gradients likewise. */
typedef struct {
  ampc_dtype type;
  size_t start, n;       /* flat elements [start, start + n) */
  void *data, *grad;     /* device memory, n elements each */
} ampc__bucket;

#define AMPC__MAX_BUCKETS 3 /* one per float storage type; at most two are used */

extern int ampc__graph_bn_prologue; /* graph_compile.c: a hook for tests */

struct ampc_graph {
  ampc__value *v;
  size_t nv, cap;
  ampc_status err;
  char err_msg[480]; /* err's message: said again by every call that returns err */
  int compiled;
  ampc_graph_precision prec;
  ampc_value *order;     /* execution order of op values */
  size_t norder;
  ampc_value *params, *buffers;
  size_t nparams, nbuffers, param_numel, cap_params, cap_buffers;
  uint64_t init_bytes;   /* recorded values of params and buffers, for the memory check */
  int64_t max_batch, batch;
  int fuse;              /* fuse ReLUs into batch norm / add (default on) */
  int retain_grads;      /* every activation gradient its own buffer */
  int free_saved;        /* one arena: what backward reads is freed as backward passes it */
  int saved_freed;       /* free_saved: a backward ran since the last forward */
  int forwarded;  /* a forward pass has run since compile (backward needs its saved values) */
  int ws_in_arena;       /* free_saved: each op's workspace is its own, in the activation arena */
  size_t ws_report;      /* the workspace's bytes at the peak (the shared one's size, or the arena's part) */
  unsigned char *bw_reach, *bw_written; /* per backward: ops that reach the loss, gradients written */
  int *bw_pending;       /* per value, with a grad hook: backward ops still to write a parameter's gradient */
  ampc_status (*grad_hook)(void *ctx, size_t start, size_t n);
  void *grad_hook_ctx;
  const ampc__sync *bn_sync; /* batch norm statistics over the ranks (SyncBatchNorm), or NULL */
  ampc__device *dev;     /* NULL until set or compiled (then "cpu") */
  ampc__bucket buckets[AMPC__MAX_BUCKETS];
  int nbuckets;
  void *buf_arena, *act_arena, *actgrad_arena, *ws; /* buffers (running statistics), activations, ... */
  size_t buf_bytes, act_bytes, actgrad_bytes, ws_bytes;
  size_t bytes_by_type[4][AMPC_DTYPE_COUNT]; /* params, grads, acts, actgrads */
};

/* graph.c */
int ampc__graph_valid(const ampc_graph *g, ampc_value v);
/* The error of a public function given a NULL graph (fn: its name). */
ampc_status ampc__graph_null(const char *fn);
/* The graph's first recording error, its message set again on this thread
 * (the recording may have been on another, or other calls failed since). */
ampc_status ampc__graph_err(const ampc_graph *g);
/* Records msg as the graph's first error (a builder's misuse: ampc_nn's),
 * where it has none yet. */
void ampc__graph_fail(ampc_graph *g, ampc_status code, const char *msg);
ampc_value ampc__graph_root(const ampc_graph *g, ampc_value x);
size_t ampc__value_bytes(const ampc__value *v);
static inline size_t ampc__align64(size_t n) { return (n + 63) & ~(size_t)63; }
/* v's tensor over device memory (data NULL where a fusion left it no memory). */
ampc_tensor ampc__graph_view(const ampc_graph *g, ampc_value v, int grad);
/* The call of op value v at the given batch. */
ampc__op_call ampc__graph_call(const ampc_graph *g, const ampc__value *v, int64_t batch);

/* graph_precision.c: storage types of the first n_recorded values and the
 * casts the policy needs; fills g->order. */
ampc_status ampc__graph_assign_types(ampc_graph *g, size_t n_recorded);

/* graph_plan.c: activation and activation-gradient arenas (offsets in
 * act_off / grad_off; sizes and the bytes by type at the peak). */
ampc_status ampc__graph_plan_activations(ampc_graph *g, size_t *arena, size_t *peak_by_type);
ampc_status ampc__graph_plan_activation_grads(ampc_graph *g, size_t *arena, size_t *peak_by_type);
/* free_saved: both in one arena over forward and backward (act_off and
 * grad_off in it), with each op's workspace (ws_need) for its forward and
 * its backward (ws_off); its size, the bytes by type at the peak and the
 * workspace's part of them. */
ampc_status ampc__graph_plan_joint(ampc_graph *g, size_t *arena, size_t *peak_by_type, size_t *peak_ws);

/* graph_exec.c: the device, made with the defaults if none was set. */
ampc_status ampc__graph_need_device(ampc_graph *g);

/* For the amp layer: the device, and the parameter buckets as spans (model
 * copy and own gradients); returns the count. */
ampc__device *ampc__graph_device(const ampc_graph *g);
int ampc__graph_spans(const ampc_graph *g, ampc__span *out);
/* While set, backward calls hook(ctx, start, n) as soon as a parameter's
 * gradient is final for this backward -- after the last op (in backward's
 * reverse recording order) that writes it -- with the parameter's flat
 * elements [start, start + n): the amp layer starts a bucket's all-reduce
 * once all of its parameters are in, while backward goes on. Parameters
 * this backward does not reach are not reported. An error from the hook
 * stops backward. NULL: no hook (the default). */
void ampc__graph_set_grad_hook(ampc_graph *g, ampc_status (*hook)(void *ctx, size_t start, size_t n), void *ctx);
/* Batch norm in training computes its statistics over every rank's batch
 * through sync (ampc__sync in backend.h; NULL: each rank its own, the
 * default). The pointer must stay valid while set. */
void ampc__graph_set_bn_sync(ampc_graph *g, const ampc__sync *sync);
/* Backward counts 16-bit weight-gradient underflow while on (amp's grad stats). */
void ampc__graph_count_underflow(ampc_graph *g, int on);

/* The recorded f32 values of a parameter or buffer (its numel floats), for a
 * builder to fill in place; NULL for any other value. */
float *ampc__graph_init_data(ampc_graph *g, ampc_value v);

/* The machine's physical memory in bytes (0 if unknown): no plan larger than
 * this, and no set of parameters larger than half of it, is allocated. */
uint64_t ampc__physical_memory(void);

#endif
