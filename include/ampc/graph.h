/*
 * graph.h -- a static computation graph with automatic backward.
 *
 * A model is recorded once, for a batch shape, as a list of ops on values
 * (inputs, parameters, buffers, activations). Recording knows nothing of
 * precision: ampc_graph_set_precision() (normally called by the amp layer)
 * decides the storage type of every value -- f32, f16 or bf16 -- and where
 * casts go; ampc_graph_compile() then derives the backward pass, plans and
 * allocates every buffer. After that, forward and backward allocate nothing.
 *
 *     ampc_graph *g; ampc_graph_create(&g);
 *     ampc_value x = ampc_graph_input(g, "x", ampc_shape4(128, 1, 28, 28));
 *     ampc_value y = ampc_graph_labels(g, "y", 128);
 *     ampc_value w = ampc_graph_param(g, "fc.weight", ampc_shape2(10, 784), 0, init);
 *     ...
 *     ampc_value loss = ampc_graph_cross_entropy(g, logits, y, 0.0f);
 *     if (ampc_graph_compile(g) < 0) ...;          // also reports any recording error
 *     ampc_graph_write(g, x, images, AMPC_DTYPE_F32);   // host memory in, converted
 *     ampc_graph_write(g, y, labels, AMPC_DTYPE_I32);
 *     ampc_graph_forward(g, 1); ampc_graph_backward(g, loss, 1.0f, 0);
 *     float l; ampc_graph_read(g, loss, &l, AMPC_DTYPE_F32);
 *
 * Recording calls return AMPC_VALUE_NONE on error and remember the first
 * error; ampc_graph_compile() returns it, so a model builder needs no
 * checks of its own between calls.
 *
 * Every op accepts f32, f16 and bf16 storage for every tensor and computes
 * and accumulates in f32. The batch dimension (dim 0 of inputs and of every
 * activation) can be lowered at run time with ampc_graph_set_batch() for a
 * final partial batch.
 *
 * The graph runs on a device (ampc/backend.h; "cpu" unless another is set
 * before compile), which owns every buffer. Values go in and out through
 * ampc_graph_write() and ampc_graph_read(), which convert types; the data
 * pointer of ampc_graph_tensor() is the device's memory only on a backend
 * whose memory is host memory (cpu), and NULL elsewhere.
 */
#ifndef AMPC_GRAPH_H
#define AMPC_GRAPH_H

#include <stddef.h>
#include <stdint.h>

#include "ampc/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef int32_t ampc_value;
#define AMPC_VALUE_NONE ((ampc_value)-1)

typedef struct ampc_graph ampc_graph;

typedef enum {
  AMPC_OP_INPUT = 0,
  AMPC_OP_LABELS,
  AMPC_OP_PARAM,
  AMPC_OP_BUFFER,
  AMPC_OP_CONV2D,
  AMPC_OP_BATCHNORM2D,
  AMPC_OP_RELU,
  AMPC_OP_MAXPOOL2D,
  AMPC_OP_AVGPOOL2D,
  AMPC_OP_GLOBAL_AVGPOOL,
  AMPC_OP_LINEAR,
  AMPC_OP_ADD,
  AMPC_OP_FLATTEN,
  AMPC_OP_SOFTMAX,
  AMPC_OP_LOG_SOFTMAX,
  AMPC_OP_CROSS_ENTROPY,
  AMPC_OP_CAST,
  AMPC_OP_COUNT
} ampc_op_kind;

/* Name of an op kind: "conv2d", "batchnorm2d", ... */
const char *ampc_op_name(ampc_op_kind k);

/* How an op runs under an autocast policy (apex O1's lists are amp's:
 * ampc_amp_cast_policy in amp.h). */
typedef enum {
  AMPC_CAST_POLICY_HALF,    /* run in half: inputs and weights cast to half */
  AMPC_CAST_POLICY_FP32,    /* run in fp32: output stored in fp32 */
  AMPC_CAST_POLICY_PROMOTE, /* output in the widest input type */
  AMPC_CAST_POLICY_KEEP     /* output in the input's type (relu, pooling, flatten) */
} ampc_cast_policy;

ampc_status ampc_graph_create(ampc_graph **out);
void ampc_graph_free(ampc_graph *g);
/* The first recording error (0 if none). */
ampc_status ampc_graph_status(const ampc_graph *g);

/* ---- leaves ---- */
/* A float input (dim 0 is the batch). */
ampc_value ampc_graph_input(ampc_graph *g, const char *name, ampc_shape shape);
/* Integer class labels, shape (n,), stored as i32. */
ampc_value ampc_graph_labels(ampc_graph *g, const char *name, int64_t n);
/* A trainable parameter. is_norm marks normalisation parameters (kept in
 * fp32 under keep_batchnorm_fp32). init: numel f32 values (copied). */
ampc_value ampc_graph_param(ampc_graph *g, const char *name, ampc_shape shape, int is_norm,
                            const float *init);
/* A non-trainable buffer (running statistics), stored as dtype (f32 or i64). */
ampc_value ampc_graph_buffer(ampc_graph *g, const char *name, ampc_dtype dtype, ampc_shape shape,
                             const float *init);

/* ---- ops ---- */
/* x (N, C, H, W), w (O, C, k, k), b (O) or NONE -> (N, O, H', W'). */
ampc_value ampc_graph_conv2d(ampc_graph *g, ampc_value x, ampc_value w, ampc_value b, int stride,
                             int pad);
/* Batch norm over (N, H, W) per channel; running_mean/var updated in training
 * with momentum (PyTorch's: new = (1-m)*old + m*batch, unbiased variance);
 * num_batches_tracked (i64 buffer) counted. */
ampc_value ampc_graph_batchnorm2d(ampc_graph *g, ampc_value x, ampc_value gamma, ampc_value beta,
                                  ampc_value running_mean, ampc_value running_var,
                                  ampc_value num_batches_tracked, float momentum, float eps);
ampc_value ampc_graph_relu(ampc_graph *g, ampc_value x);
ampc_value ampc_graph_maxpool2d(ampc_graph *g, ampc_value x, int k, int stride, int pad);
/* Average pooling; padding counts as zeros in the average (count_include_pad). */
ampc_value ampc_graph_avgpool2d(ampc_graph *g, ampc_value x, int k, int stride, int pad);
/* (N, C, H, W) -> (N, C): mean over H, W. */
ampc_value ampc_graph_global_avgpool(ampc_graph *g, ampc_value x);
/* x (N, K), w (M, K), b (M) or NONE -> (N, M) = x w^T + b. */
ampc_value ampc_graph_linear(ampc_graph *g, ampc_value x, ampc_value w, ampc_value b);
ampc_value ampc_graph_add(ampc_graph *g, ampc_value a, ampc_value b);
/* (N, ...) -> (N, prod(...)), a view. */
ampc_value ampc_graph_flatten(ampc_graph *g, ampc_value x);
/* Over the last dim of (N, K). */
ampc_value ampc_graph_softmax(ampc_graph *g, ampc_value x);
ampc_value ampc_graph_log_softmax(ampc_graph *g, ampc_value x);
/* Mean cross-entropy of logits (N, K) against labels (N,), with PyTorch's
 * label smoothing: target = (1-s) one-hot + s/K. Output shape (1,), f32. */
ampc_value ampc_graph_cross_entropy(ampc_graph *g, ampc_value logits, ampc_value labels,
                                    float label_smoothing);
/* Explicit cast (the precision pass inserts these itself). */
ampc_value ampc_graph_cast(ampc_graph *g, ampc_value x, ampc_dtype to);

/* ---- precision and compilation ---- */
typedef struct {
  ampc_dtype param_type;      /* storage of non-norm parameters */
  ampc_dtype norm_param_type; /* storage of batch-norm parameters */
  ampc_dtype act_type;        /* storage of inputs and activations */
  int autocast;               /* per-op policy (O1): half ops run in half_type */
  ampc_dtype half_type;       /* f16 or bf16 */
  ampc_cast_policy (*policy)(ampc_op_kind op); /* with autocast: each op's policy */
} ampc_graph_precision;

/* Fusion of a ReLU into the batch norm or add before it (default on; off
 * gives the plain one-kernel-per-op graph the fused one is tested against). */
ampc_status ampc_graph_set_fusion(ampc_graph *g, int on);
/* Keep every activation's gradient readable after backward (like PyTorch's
 * retain_grad on every tensor). Off by default: gradient buffers whose
 * lifetimes do not overlap then share memory, and ampc_graph_grad() of an
 * activation is meaningful only during backward. Parameter gradients are
 * always kept. Before compile. */
ampc_status ampc_graph_set_retain_grads(ampc_graph *g, int on);
/* Free what backward reads as backward passes it, as PyTorch frees a
 * graph's saved tensors: activations, activation gradients and each op's
 * workspace then share one arena planned over forward and backward
 * together, so the gradients of the first layers reuse the memory of the
 * last layers' activations (less memory at the peak; the same results). After a backward, an activation
 * that is not kept (ampc_graph_keep; inputs, labels and values nothing
 * consumes are) can no longer be read, and a second backward needs a new
 * forward. Off by default (any number of backward calls per forward, every
 * value backward reads readable until the next forward). Before compile. */
ampc_status ampc_graph_set_free_saved(ampc_graph *g, int on);
/* Keeps a value readable after forward. By default the memory of an
 * intermediate value that backward does not need (a batch norm's output that
 * only feeds a residual add, a cast's input, ...) is reused once its last
 * consumer has run; inputs, labels, values nothing consumes and every value
 * under retain_grads are kept. Before compile. */
ampc_status ampc_graph_keep(ampc_graph *g, ampc_value v);
/* Must be called before compile; the default is all f32. */
ampc_status ampc_graph_set_precision(ampc_graph *g, const ampc_graph_precision *p);
ampc_status ampc_graph_compile(ampc_graph *g);
int ampc_graph_is_compiled(const ampc_graph *g);

/* ---- running ---- */
/* Forward compiles the graph first where it is not compiled yet (with the
 * precision and backend set so far). Inputs can be written only after
 * compile, so a program compiles, writes its inputs, then runs forward: a
 * forward that compiled the graph itself ran on zeroed inputs. Before
 * compile, set_batch sets the batch the first forward runs and zero_grad has
 * no gradients to zero (both succeed). */
/* Effective batch for the next forward/backward, 1..built batch. */
ampc_status ampc_graph_set_batch(ampc_graph *g, int64_t n);
int64_t ampc_graph_batch(const ampc_graph *g);
int64_t ampc_graph_max_batch(const ampc_graph *g);
/* training = 1: batch norm uses batch statistics and updates running ones. */
ampc_status ampc_graph_forward(ampc_graph *g, int training);
/* Backward from a scalar value, with d(loss) = seed (the loss scale).
 * Parameter gradients are written (accumulate = 0) or added (1). */
ampc_status ampc_graph_backward(ampc_graph *g, ampc_value loss, float seed, int accumulate);
/* Sets every parameter gradient to zero (one memset per bucket). */
ampc_status ampc_graph_zero_grad(ampc_graph *g);

/* Forward multiply-add FLOPs (2 per MAC) of the convolutions and linear
 * layers at the built batch. */
double ampc_graph_forward_flops(const ampc_graph *g);

/* ---- values in and out (after compile) ----
 * The value's elements at the current batch (the shape ampc_graph_tensor()
 * gives), converted between src/dst_type and the value's storage type: any
 * two of f32, f16, bf16, or i32 and i64 (labels, num_batches_tracked).
 * Writing a parameter sets the model's copy only (with amp, use
 * ampc_amp_load_params, which sets the masters too). AMPC_EINVAL for a value
 * with no memory of its own (a ReLU or batch norm fused into the op before
 * it) or, for gradients, no gradient. */
ampc_status ampc_graph_write(ampc_graph *g, ampc_value v, const void *src, ampc_dtype src_type);
ampc_status ampc_graph_read(const ampc_graph *g, ampc_value v, void *dst, ampc_dtype dst_type);
ampc_status ampc_graph_read_grad(const ampc_graph *g, ampc_value v, void *dst, ampc_dtype dst_type);
/* Sets a gradient (between backward and the step: to clip or inject by hand). */
ampc_status ampc_graph_write_grad(ampc_graph *g, ampc_value v, const void *src, ampc_dtype src_type);

/* ---- access ---- */
/* The value's type and shape at the current batch; data: its memory where
 * the backend's memory is host memory (cpu), NULL elsewhere or before compile. */
ampc_tensor ampc_graph_tensor(const ampc_graph *g, ampc_value v);
ampc_tensor ampc_graph_grad(const ampc_graph *g, ampc_value v);
const char *ampc_graph_name(const ampc_graph *g, ampc_value v);
ampc_op_kind ampc_graph_op(const ampc_graph *g, ampc_value v);
ampc_value ampc_graph_find(const ampc_graph *g, const char *name);
size_t ampc_graph_value_count(const ampc_graph *g);
size_t ampc_graph_param_count(const ampc_graph *g);
ampc_value ampc_graph_param_at(const ampc_graph *g, size_t i);
int ampc_graph_param_is_norm(const ampc_graph *g, ampc_value v);
/* Total elements of all parameters, and each one's offset in that flat count
 * (the indexing shared by master weights, optimizer state and gradients).
 * Compile numbers the parameters of each storage type back to back (16-bit
 * ones first, recording order within a type): before compile the offsets
 * are not yet fixed. */
size_t ampc_graph_param_numel(const ampc_graph *g);
size_t ampc_graph_param_offset(const ampc_graph *g, ampc_value v);
size_t ampc_graph_buffer_count(const ampc_graph *g);
ampc_value ampc_graph_buffer_at(const ampc_graph *g, size_t i);
/* The f32 values a parameter was recorded with (before compile and after),
 * until ampc_graph_release_init() frees them (ampc_amp_initialize does, once
 * it has made the master weights): NULL then. */
const float *ampc_graph_param_init(const ampc_graph *g, ampc_value v);
void ampc_graph_release_init(ampc_graph *g);

/* ---- memory accounting ---- */
typedef enum {
  AMPC_MEM_PARAMETERS = 0,
  AMPC_MEM_MASTER_WEIGHTS,
  AMPC_MEM_GRADIENTS,
  AMPC_MEM_OPTIMIZER_STATE,
  AMPC_MEM_ACTIVATIONS,
  AMPC_MEM_WORKSPACE,
  AMPC_MEM_COUNT
} ampc_mem_category;
const char *ampc_mem_category_name(ampc_mem_category c);

typedef struct {
  /* bytes[category][dtype]; dtype index is ampc_dtype */
  size_t bytes[AMPC_MEM_COUNT][AMPC_DTYPE_COUNT];
} ampc_mem_report;
static inline size_t ampc_mem_total(const ampc_mem_report *r, ampc_mem_category c) {
  size_t s = 0;
  for (int t = 0; t < AMPC_DTYPE_COUNT; t++) s += r->bytes[c][t];
  return s;
}
/* What the compiled graph holds (parameters, their gradients, activations,
 * workspace); the amp layer and the optimizer add their own. A NULL g gives
 * zeros; a NULL r, nothing. */
void ampc_graph_memory(const ampc_graph *g, ampc_mem_report *r);

#ifdef __cplusplus
}
#endif
#endif
