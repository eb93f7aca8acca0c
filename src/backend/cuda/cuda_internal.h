/*
 * cuda_internal.h -- the cuda backend's host side: its device state, shared
 * by cuda_backend.c (memory, copies, the vtable), cuda_ops.c (the graph's ops
 * through the kernels of cuda_kernels.h), cuda_linear.c (cuBLAS),
 * cuda_conv.c (cuDNN) and cuda_step.c (the step's passes).
 *
 * One device is one GPU with one compute stream: every kernel, library call
 * and copy is enqueued on it in order, so nothing waits for the GPU except a
 * read of values back to the host (ampc_graph_read, the step's check, the
 * statistics), which synchronises once and reports any error a kernel left
 * on the device (a label out of range) at that point.
 */
#ifndef AMPC_BACKEND_CUDA_INTERNAL_H
#define AMPC_BACKEND_CUDA_INTERNAL_H

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_kernels.h"
#include "core/status_internal.h"

/* cuBLAS's entry points, opened on first use (cuda_blas.c) */
typedef struct {
  int loaded;
  cublasStatus_t (*create)(cublasHandle_t *h);
  cublasStatus_t (*destroy)(cublasHandle_t h);
  cublasStatus_t (*set_stream)(cublasHandle_t h, cudaStream_t s);
  cublasStatus_t (*set_workspace)(cublasHandle_t h, void *ws, size_t bytes);
  cublasStatus_t (*set_math_mode)(cublasHandle_t h, cublasMath_t mode);
  const char *(*status_string)(cublasStatus_t s);
  cublasStatus_t (*gemm_ex)(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void *alpha, const void *a, cudaDataType_t at, int lda, const void *b, cudaDataType_t bt,
                            int ldb, const void *beta, void *c, cudaDataType_t ct, int ldc, cublasComputeType_t compute,
                            cublasGemmAlgo_t algo);
} ampc__cu_blas_api;
ampc_status ampc__cu_blas_api_get(const ampc__cu_blas_api **out);

/* A block of device memory the arena took from cudaMalloc. */
typedef struct {
  void *p;
  size_t size;
  int used;
} ampc__cu_block;

/* What lives on the device for the backend itself, read back with every
 * synchronising call: the underflow counters and the error word. */
typedef struct {
  ampc__cu_count cnt[2];
  ampc__cu_error err;
} ampc__cu_state;

/* One kernel call timed with events (profiling). */
typedef struct {
  int op, backward;
  cudaEvent_t ev[3]; /* start, end (conv backward: after the data gradient), end */
} ampc__cu_timing;

typedef struct ampc__cu_conv ampc__cu_conv;

/* An op call as the graph replay records it (cuda_graph.c). */
typedef struct {
  ampc__op_call c;
  int backward, counting;
} ampc__cu_call;
typedef struct ampc__cu_graphs ampc__cu_graphs;

typedef struct {
  int dev;
  char name[256];
  uint64_t total_mem;
  int sm_count;
  cudaStream_t stream;
  cublasHandle_t blas;     /* made at first use */
  void *blas_ws;           /* cuBLAS's workspace (ours, so that it never allocates) */
  cudnnHandle_t dnn;       /* made at first use */

  /* the caching arena */
  ampc__cu_block *blocks;
  size_t nblocks, cap_blocks;
  int64_t reserved, reserved_peak, in_use, in_use_peak;

  /* pinned staging: two buffers for writes (one fills while the other's copy
   * runs), the first also for reads; a small one for the step's results */
  unsigned char *pin[2];
  cudaEvent_t pin_ev[2];
  int pin_next;
  size_t pin_bytes;
  unsigned char *pin_small;
  ampc__cu_state *state;   /* device */

  /* the step's passes: their device scratch, grown as needed */
  ampc__cu_partial *partials;
  size_t npartials;
  ampc__cu_check_result *check;
  unsigned *fold_scratch;
  unsigned long long *ranges;
  unsigned char *flags;
  size_t cap_ranges;

  /* convolutions: descriptors and algorithms, one per shape */
  ampc__cu_conv **convs;
  size_t nconvs, cap_convs;

  /* repeated sequences of op calls as CUDA graphs */
  ampc__cu_graphs *graphs;

  /* profiling */
  ampc__cu_timing *timings;
  size_t ntimings, cap_timings, used_timings;
  double t_fwd[AMPC_OP_COUNT], t_bwd[AMPC_OP_COUNT], t_conv[2], t_step;
} ampc__cuda_dev;

static inline ampc__cuda_dev *ampc__cu_of(ampc__device *d) { return (ampc__cuda_dev *)d->impl; }

/* An error from the CUDA runtime as an ampc_status with a message:
 * "cuda: <what>: <error name>: <description>". */
ampc_status ampc__cu_error_rt(int err, const char *what);
#define AMPC_CU_TRY(call, what)                       \
  do {                                                \
    int ampc__e = (int)(call);                        \
    if (ampc__e != 0) return ampc__cu_error_rt(ampc__e, (what)); \
  } while (0)

/* Device memory from the arena (zeroed on the stream), and back to it. */
void *ampc__cu_alloc(ampc__device *d, size_t bytes);
void ampc__cu_free(ampc__device *d, void *p);
/* Waits for the stream and reports what the kernels left: a CUDA error, or
 * the error word (then cleared). */
ampc_status ampc__cu_finish(ampc__device *d);
extern int64_t ampc__cu_syncs; /* how often it waited (the tests count) */
/* The handles, made at first use. */
ampc_status ampc__cu_blas(ampc__device *d, cublasHandle_t *out);
ampc_status ampc__cu_dnn(ampc__device *d, cudnnHandle_t *out);
/* The counters kernels add gradient-underflow counts to, or NULL when off. */
ampc__cu_count *ampc__cu_counters(ampc__device *d, int backward);
/* Profiling: the event to record at point k (0 start, 1 middle, 2 end) of
 * the timed call in progress, or NULL when not profiling. */
cudaEvent_t ampc__cu_timing_event(ampc__device *d, int k);
/* Profiling the step's passes: begin before its kernels, end after them
 * (their time goes to the stats' step); NULL and nothing when not profiling. */
ampc__cu_timing *ampc__cu_step_timing_begin(ampc__device *d);
void ampc__cu_step_timing_end(ampc__device *d, ampc__cu_timing *t);

/* cuda_graph.c: 1 when the call is taken (recorded, to run later as part of
 * a graph), 0 when it is to run now (*st: an error of running earlier ones);
 * flush ends the sequence: every device call but run() calls it first. */
int ampc__cu_graph_defer(ampc__device *d, const ampc__op_call *c, int backward, ampc_status *st);
ampc_status ampc__cu_graph_flush(ampc__device *d);
void ampc__cu_graphs_free(ampc__device *d);
extern int64_t ampc__cu_graph_captures, ampc__cu_graph_launches;

/* cuda_ops.c */
ampc_status ampc__cu_run(ampc__device *d, const ampc__op_call *c, int backward);
size_t ampc__cu_workspace(ampc__device *d, const ampc__op_call *c);
size_t ampc__cu_aux_floats(ampc__device *d, const ampc__op_call *c);
int ampc__cu_supports(const ampc__device *d, ampc_op_kind op, ampc_dtype t);

/* cuda_linear.c */
ampc_status ampc__cu_linear_fwd(ampc__device *d, const ampc__op_call *c);
ampc_status ampc__cu_linear_bwd(ampc__device *d, const ampc__op_call *c);
size_t ampc__cu_linear_ws(ampc__device *d, const ampc__op_call *c);

/* cuda_conv.c */
ampc_status ampc__cu_conv_fwd(ampc__device *d, const ampc__op_call *c);
ampc_status ampc__cu_conv_bwd(ampc__device *d, const ampc__op_call *c);
size_t ampc__cu_conv_ws(ampc__device *d, const ampc__op_call *c);
void ampc__cu_conv_free_all(ampc__device *d);
size_t ampc__cu_conv_notes(ampc__device *d, char *buf, size_t n);

/* cuda_step.c: the vtable's step passes */
ampc_status ampc__cu_check_pass(ampc__device *d, const ampc__span *s, int ns, float gmul, int want_max,
                                const float *slots, int nslots, float *slots_out, ampc__check *out);
ampc_status ampc__cu_fold_pass(ampc__device *d, const ampc__span *s, int ns, float *dst, float mul, int accumulate,
                               float *slot, float max_div);
ampc_status ampc__cu_nonfinite_pass(ampc__device *d, const ampc__span *s, int ns, const size_t *ranges, size_t nranges,
                                    float gmul, unsigned char *flags);
ampc_status ampc__cu_update_pass(ampc__device *d, const ampc__span *s, int ns, const ampc__update *u);

#endif
