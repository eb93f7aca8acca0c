/*
 * backend.h -- the private device interface.
 *
 * A backend is a device (ggml's backend, in spirit): it allocates and frees
 * its own buffers, copies between the host and itself (converting types on
 * the way) and within itself, sets memory, synchronises, says which ops and
 * types it supports, runs the graph's op kernels, and runs the training
 * step's flat-buffer passes -- unscale + finiteness check + sum of squares,
 * folding gradients into f32, the optimizer update on f32 masters that also
 * writes the 16-bit model copy. Device memory is addressed by pointers that
 * only the backend may dereference: the graph and the amp layer do pointer
 * arithmetic on them (offsets into buffers they planned), never loads or
 * stores. A device is one instance of a backend with its options (the cpu
 * backend's threads and convolution algorithm, profiling), shared by the
 * graph, the amp layer and the optimizer that run on it (reference counted).
 *
 * Everything returns 0 or a negative ampc_status with a message.
 */
#ifndef AMPC_BACKEND_H
#define AMPC_BACKEND_H

#include "ampc/backend.h"
#include "ampc/config.h"
#include "ampc/graph.h"
#include "ampc/optim.h"
#include "backend/step_math.h"

#define AMPC__MAX_INPUTS 6

typedef struct ampc__device ampc__device;

typedef struct {
  int stride, pad, k;      /* conv, pooling */
  float momentum, eps;     /* batch norm */
  float label_smoothing;   /* cross entropy */
  int relu;                /* batch norm, add: a ReLU fused into the output */
  int pool;                /* batch norm: a 2x2 stride-2 max pool fused after that:
                            * out and dout are the pooled planes */
  int nostore;             /* batch norm: its output is not stored (out.data NULL);
                            * the convolutions that read it apply it as they load
                            * their input (ampc__op_call.pro), and forward keeps
                            * each channel's scale, then each one's shift, in aux
                            * after mean, invstd and the mode (at aux + 2C + 1) */
  int recompute;           /* batch norm: its output is stored for forward readers
                            * that backward does not read it for (a residual sum),
                            * but backward reads it from nowhere: the convolutions
                            * after it apply it to their input as with nostore, its
                            * own backward takes its ReLU's mask from its input,
                            * and forward keeps the scales and shifts as nostore's */
} ampc__op_attr;

/* Sums across the ranks of data-parallel training, for a kernel whose
 * statistics must cover every rank's batch (batch norm's under SyncBatchNorm):
 * sum(ctx, v, n) replaces n doubles with their sum over the ranks, every
 * rank calling it at the same point. v is host memory: the cpu backends pass
 * a part of the call's workspace (a device backend would pass a host copy, or
 * bring its own collective over device memory). */
typedef struct {
  ampc_status (*sum)(void *ctx, double *v, size_t n);
  void *ctx;
} ampc__sync;

/* One op, as the graph hands it to a backend: typed views of device memory
 * for every input, output and gradient, with the effective batch applied. */
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
  float seed;                         /* d(loss) for the loss op's backward */
  const ampc__sync *sync;             /* batch norm in training: statistics over the ranks'
                                       * batches, between its statistics pass and its
                                       * normalisation (NULL: this rank's batch alone) */
  const void *ctx;                    /* the backend's own context for its kernels (set by run) */
  /* conv2d after a batch norm that stores no output (attr.nostore) or that
   * backward recomputes (attr.recompute): in[0] is
   * the batch norm's input, and each value the convolution loads from it is
   * what the batch norm would have stored: x * pro[ch] + pro[C + ch] (C
   * channels), through a ReLU when pro_relu, rounded to pro_type. NULL: none. */
  const float *pro;
  int pro_relu;
  ampc_dtype pro_type;
} ampc__op_call;

/* ---- the flat parameter state ----
 *
 * A model's parameters are numbered flat (the order of ampc_graph_param_offset),
 * and stored per storage type in contiguous buckets: a span is one such run
 * [start, start + n) of the numbering, with the model's copy of those
 * parameters and their gradients (the model's own, of the same type, or a
 * run of an f32 buffer). Masters and optimizer state are f32 arrays indexed
 * by the flat number. */
typedef struct {
  size_t start, n;
  ampc_dtype type;                    /* of model */
  void *model;                        /* the model's copy (n elements), or NULL */
  ampc_dtype grad_type;               /* of grad */
  const void *grad;                   /* the gradients (n elements) */
} ampc__span;

/* What the step reads back from the device, once per step. */
typedef struct {
  int found_inf;                      /* some gradient (times gmul) is inf or NaN */
  double sumsq;                       /* sum of squares of the gradients times gmul */
  float max_abs;                      /* largest |gradient * gmul| (when asked for) */
} ampc__check;

/* One optimizer update over spans. */
typedef struct {
  ampc_optim_kind kind;
  ampc__optim_consts k;               /* the step's constants (step_math.h) */
  float *state[3];                    /* SGD: momentum_buffer or NULL; Adam: exp_avg,
                                       * exp_avg_sq, max_exp_avg_sq (amsgrad) or NULL */
  float *master;                      /* f32 masters (flat), or NULL: the model copy is the weight */
  float gmul;                         /* the gradient multiplier: unscale x clip */
  int sr;                             /* stochastic rounding of 16-bit weights without masters */
  uint64_t sr_seed, sr_base;          /* counter of element i: sr_base + i (flat) */
} ampc__update;

typedef struct ampc__backend {
  const char *name;
  int host_memory;                    /* device pointers are host pointers (ampc_tensor.data) */
  int sync_batchnorm;                 /* its batch norm honours ampc__op_call.sync */
  int conv_prologue;                  /* its convolutions honour ampc__op_call.pro (and its
                                       * batch norm attr.nostore) */
  ampc_status (*create)(ampc__device *d);
  void (*destroy)(ampc__device *d);

  /* memory: zeroed, 64-byte aligned; NULL when out of memory */
  void *(*alloc)(ampc__device *d, size_t bytes);
  void (*free)(ampc__device *d, void *p);
  /* n elements host -> device and device -> host, converting between float
   * types (f32, f16, bf16) or between integer types (i32, i64) */
  ampc_status (*write)(ampc__device *d, void *dst, ampc_dtype dt, const void *src, ampc_dtype st, size_t n);
  ampc_status (*read)(ampc__device *d, void *dst, ampc_dtype dt, const void *src, ampc_dtype st, size_t n);
  ampc_status (*copy)(ampc__device *d, void *dst, const void *src, size_t bytes);
  ampc_status (*set)(ampc__device *d, void *dst, int byte, size_t bytes);
  ampc_status (*synchronize)(ampc__device *d);
  /* bytes of memory the device has (0: unknown): no plan larger is allocated */
  uint64_t (*capacity)(ampc__device *d);

  /* ops */
  int (*supports)(const ampc__device *d, ampc_op_kind op, ampc_dtype t);
  ampc_status (*run)(ampc__device *d, const ampc__op_call *c, int backward);
  /* workspace bytes an op needs (forward and backward), for the built shapes */
  size_t (*workspace)(ampc__device *d, const ampc__op_call *c);
  /* floats of saved state an op keeps between forward and backward */
  size_t (*aux_floats)(ampc__device *d, const ampc__op_call *c);

  /* the step's flat passes */
  /* Finiteness, sum of squares (and the largest magnitude when want_max) of
   * grad * gmul over the spans, into *out; slots (device, nslots floats,
   * may be NULL) come back into slots_out in the same read. */
  ampc_status (*check)(ampc__device *d, const ampc__span *s, int ns, float gmul, int want_max,
                       const float *slots, int nslots, float *slots_out, ampc__check *out);
  /* dst[start + i] (+)= mul * grad[i] over the spans (dst: f32, flat); a
   * non-finite value sets slot[0] = 1, and slot[1] = max(slot[1],
   * max|grad| / max_div) over the finite ones (slot: 2 device floats). */
  ampc_status (*fold)(ampc__device *d, const ampc__span *s, int ns, float *dst, float mul, int accumulate,
                      float *slot, float max_div);
  /* flags[r] = 1 where the flat range r (ranges: start, n pairs) holds a
   * gradient that times gmul is not finite, else 0 (host array): which
   * parameters overflowed. */
  ampc_status (*nonfinite)(ampc__device *d, const ampc__span *s, int ns, const size_t *ranges, size_t nranges,
                           float gmul, unsigned char *flags);
  /* The optimizer update of every element of the spans: the weight is
   * master[start + i] (its new value is also rounded into model[i]) or,
   * without masters, model[i] itself (16-bit: updated in f32 and rounded
   * back, stochastically with sr). */
  ampc_status (*update)(ampc__device *d, const ampc__span *s, int ns, const ampc__update *u);

  /* what the device measured; reset: which of it to zero after reading */
  void (*stats)(ampc__device *d, ampc_backend_stats *out, int reset);
  /* optional: what it chose, as text (ampc_graph_backend_notes) */
  size_t (*notes)(ampc__device *d, char *buf, size_t n);
} ampc__backend;

enum { AMPC__STATS_TIMES = 1, AMPC__STATS_GRADS = 2, AMPC__STATS_ALL = 3 };

struct ampc__device {
  const ampc__backend *be;
  int refs;
  ampc_backend_opts opts;             /* as resolved (threads >= 1) */
  int count_underflow;                /* kernels count 16-bit gradient underflow */
  int64_t reads;                      /* device-to-host reads (the generic wrappers count) */
  void *impl;                         /* the backend's own state */
};

/* The backends built in (NULL-terminated), and one by name (NULL: "cpu");
 * an unknown or unbuilt one is an error saying why. */
const ampc__backend *const *ampc__backends(void);
ampc_status ampc__backend_find(const char *name, const ampc__backend **out);

/* A new device of the named backend (refs = 1). */
ampc_status ampc__device_create(ampc__device **out, const char *name, const ampc_backend_opts *o);
ampc__device *ampc__device_ref(ampc__device *d);
void ampc__device_unref(ampc__device *d);

/* Thin wrappers: every caller goes through these (they count reads). */
static inline void *ampc__dev_alloc(ampc__device *d, size_t bytes) { return d->be->alloc(d, bytes); }
static inline void ampc__dev_free(ampc__device *d, void *p) {
  if (p) d->be->free(d, p);
}
static inline ampc_status ampc__dev_write(ampc__device *d, void *dst, ampc_dtype dt, const void *src, ampc_dtype st,
                                          size_t n) {
  return n ? d->be->write(d, dst, dt, src, st, n) : AMPC_OK;
}
static inline ampc_status ampc__dev_read(ampc__device *d, void *dst, ampc_dtype dt, const void *src, ampc_dtype st,
                                         size_t n) {
  if (!n) return AMPC_OK;
  d->reads++;
  return d->be->read(d, dst, dt, src, st, n);
}
static inline ampc_status ampc__dev_copy(ampc__device *d, void *dst, const void *src, size_t bytes) {
  return bytes ? d->be->copy(d, dst, src, bytes) : AMPC_OK;
}
static inline ampc_status ampc__dev_set(ampc__device *d, void *dst, int byte, size_t bytes) {
  return bytes ? d->be->set(d, dst, byte, bytes) : AMPC_OK;
}

/* The backends' tables. */
extern const ampc__backend ampc__backend_cpu;
extern const ampc__backend ampc__backend_cpu_guarded;
/* The cuda backend: built where config.h says so, or in the test build that
 * runs its kernels on the host (AMPC_CUDA_EMU, src/backend/cuda/emu/). */
#if defined(AMPC_HAVE_BACKEND_CUDA) || defined(AMPC_CUDA_EMU)
#define AMPC__BACKEND_CUDA 1
extern const ampc__backend ampc__backend_cuda;
#endif

#endif
