/* Convolutions on cuDNN: forward, backward data and backward filter, NCHW,
 * f32 accumulation (16-bit data on the tensor cores; f32 data in true f32,
 * or TF32 with the tf32 option). Each shape gets its descriptors and its
 * three algorithms once: at compile, when the graph asks for the workspace,
 * by timing the candidates (cudnnFind*, as torch.backends.cudnn.benchmark
 * does) at the largest batch; for a smaller batch met later, from cuDNN's
 * heuristics within the workspace the graph planned. Only deterministic
 * algorithms are taken where one fits, so that a run repeats bit for bit.
 *
 * A bias is written into y first and the convolution added to it (beta = 1),
 * the sum rounded once. With the underflow statistics on, 16-bit gradients
 * are counted after cuDNN has rounded them (a value that rounds to zero is
 * not counted; the cpu counts it as lost). */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_internal.h"

enum { CONV_MAX_ALGOS = 16 };
#define CONV_WS_LIMIT ((size_t)512 << 20) /* the most workspace one convolution may take */

/* What was chosen for one direction, and the fastest candidate (for the
 * notes): times from cuDNN's timing, -1 where it only ranked (heuristics). */
typedef struct {
  int algo, det, fast_algo, fast_det;
  cudnnMathType_t math;
  float time, fast_time;
  size_t mem;
} conv_pick;

/* A shape's three algorithms, their math and workspace. */
typedef struct {
  cudnnConvolutionFwdAlgo_t fwd;
  cudnnConvolutionBwdDataAlgo_t data;
  cudnnConvolutionBwdFilterAlgo_t filter;
  cudnnMathType_t fwd_math, data_math, filter_math;
  size_t fwd_ws, data_ws, filter_ws;
  conv_pick pick[3]; /* forward, backward data, backward filter */
} conv_algos;

struct ampc__cu_conv {
  int64_t N, C, H, W, O, k, s, p, OH, OW;
  ampc_dtype t;
  ampc_status err; /* choosing failed: reported when the shape runs */
  char msg[256];
  cudnnTensorDescriptor_t xd, yd;
  cudnnFilterDescriptor_t wd;
  cudnnConvolutionDescriptor_t cd;
  conv_algos a;
  size_t limit;
};

static cudnnDataType_t dnn_type(ampc_dtype t) {
  return t == AMPC_DTYPE_F16 ? CUDNN_DATA_HALF : t == AMPC_DTYPE_BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
}

/* The math a shape may use: tensor cores for 16-bit data; for f32, FMA
 * only (true f32) unless TF32 is allowed. */
static cudnnMathType_t base_math(ampc__device *d, ampc_dtype t) {
  if (t != AMPC_DTYPE_F32) return CUDNN_TENSOR_OP_MATH;
  return d->opts.tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
}
/* a candidate's math is acceptable: true f32 takes no tensor-op candidate
 * (one cuDNN reports as default math runs FMA-only under the FMA setting,
 * which is what it runs with: chosen_math) */
static int math_ok(ampc__device *d, ampc_dtype t, cudnnMathType_t m) {
  return t != AMPC_DTYPE_F32 || d->opts.tf32 || m == CUDNN_FMA_MATH || m == CUDNN_DEFAULT_MATH;
}
static cudnnMathType_t chosen_math(ampc__device *d, ampc_dtype t, cudnnMathType_t m) {
  return t == AMPC_DTYPE_F32 && !d->opts.tf32 ? CUDNN_FMA_MATH : m;
}

static ampc_status dnn_error(cudnnStatus_t s, const char *what) {
  return ampc__error(AMPC_EIO, "cuda: %s: %s", what, cudnnGetErrorString(s));
}
#define DNN_TRY(call, what)                                 \
  do {                                                      \
    cudnnStatus_t s_ = (call);                              \
    if (s_ != CUDNN_STATUS_SUCCESS) return dnn_error(s_, what); \
  } while (0)

static void conv_destroy(ampc__cu_conv *e) {
  if (!e) return;
  if (e->xd) cudnnDestroyTensorDescriptor(e->xd);
  if (e->yd) cudnnDestroyTensorDescriptor(e->yd);
  if (e->wd) cudnnDestroyFilterDescriptor(e->wd);
  if (e->cd) cudnnDestroyConvolutionDescriptor(e->cd);
  free(e);
}

void ampc__cu_conv_free_all(ampc__device *d) {
  ampc__cuda_dev *cd = ampc__cu_of(d);
  for (size_t i = 0; i < cd->nconvs; i++) conv_destroy(cd->convs[i]);
  free(cd->convs);
  cd->convs = NULL;
  cd->nconvs = cd->cap_convs = 0;
}

/* A candidate list (cuDNN's order: fastest or most promising first): the
 * first deterministic one that fits the limit, else the first that fits;
 * then, where the candidates were timed (benchmark), the one of that kind
 * needing the least workspace among those within PICK_SLACK of its time
 * (the workspace is device memory the whole run holds; 5% is about the
 * timing's own spread). */
#define PICK_SLACK 1.05f
#define PICK_OK(p, limit, d, t) \
  ((p).status == CUDNN_STATUS_SUCCESS && (p).memory <= (limit) && math_ok((d), (t), (p).mathType))
#define PICK(perf, n, limit, d, t, out_i)                                                              \
  do {                                                                                                \
    out_i = -1;                                                                                       \
    for (int pass = 0; pass < 2 && out_i < 0; pass++)                                                 \
      for (int i_ = 0; i_ < (n) && out_i < 0; i_++)                                                   \
        if (PICK_OK((perf)[i_], limit, d, t) &&                                                       \
            (pass || (d)->opts.cudnn_any_algo || (perf)[i_].determinism == CUDNN_DETERMINISTIC))      \
          out_i = i_;                                                                                 \
    if (out_i >= 0 && (perf)[out_i].time > 0.0f) {                                                    \
      float t0_ = (perf)[out_i].time;                                                                 \
      cudnnDeterminism_t det_ = (perf)[out_i].determinism;                                            \
      for (int i_ = 0; i_ < (n); i_++)                                                                \
        if (PICK_OK((perf)[i_], limit, d, t) && ((d)->opts.cudnn_any_algo || (perf)[i_].determinism == det_) && \
            (perf)[i_].time > 0.0f &&                                                                 \
            (perf)[i_].time <= t0_ * PICK_SLACK && (perf)[i_].memory < (perf)[out_i].memory)             \
          out_i = i_;                                                                                 \
    }                                                                                                 \
  } while (0)

/* the choice i of a candidate list, and its fastest candidate that fits,
 * into pick (for the notes) */
#define RECORD(perf, n, i, limit, d, t, pk)                                                             \
  do {                                                                                                \
    (pk).algo = (int)(perf)[i].algo;                                                                  \
    (pk).det = (perf)[i].determinism == CUDNN_DETERMINISTIC;                                          \
    (pk).math = (perf)[i].mathType;                                                                   \
    (pk).time = (perf)[i].time;                                                                       \
    (pk).mem = (perf)[i].memory;                                                                      \
    (pk).fast_algo = (pk).algo;                                                                       \
    (pk).fast_det = (pk).det;                                                                         \
    (pk).fast_time = (pk).time;                                                                       \
    for (int j_ = 0; j_ < (n); j_++)                                                                  \
      if (PICK_OK((perf)[j_], limit, d, t) && (perf)[j_].time > 0.0f &&                               \
          ((pk).fast_time <= 0.0f || (perf)[j_].time < (pk).fast_time)) {                             \
        (pk).fast_algo = (int)(perf)[j_].algo;                                                        \
        (pk).fast_det = (perf)[j_].determinism == CUDNN_DETERMINISTIC;                                \
        (pk).fast_time = (perf)[j_].time;                                                             \
      }                                                                                               \
  } while (0)

/* ---- the choices, shared by the process's devices ----
 *
 * Timing the candidates is noisy: two devices (a model's training and
 * evaluation graphs, two runs of a test) choosing on their own could take
 * different algorithms for one shape, and so differ in the last bits. The
 * first choice for a (GPU, shape, type, math, limit) is kept for the
 * process, as PyTorch's cudnn.benchmark keeps its choices. */
typedef struct {
  int dev, tf32, any_algo, benchmark;
  int64_t N, C, H, W, O, k, s, p;
  ampc_dtype t;
  size_t limit;
} conv_key;
typedef struct {
  conv_key key;
  conv_algos a;
} conv_choice;
enum { CHOICES_MAX = 1024 };
static conv_choice choices[CHOICES_MAX];
static size_t nchoices;
static pthread_mutex_t choices_lock = PTHREAD_MUTEX_INITIALIZER;

static conv_key key_of(ampc__device *d, const ampc__cu_conv *e, int benchmark) {
  conv_key k;
  memset(&k, 0, sizeof k); /* (compared with memcmp: no stray padding bytes) */
  k.dev = ampc__cu_of(d)->dev;
  k.tf32 = d->opts.tf32 != 0;
  k.any_algo = d->opts.cudnn_any_algo != 0;
  k.benchmark = benchmark;
  k.N = e->N;
  k.C = e->C;
  k.H = e->H;
  k.W = e->W;
  k.O = e->O;
  k.k = e->k;
  k.s = e->s;
  k.p = e->p;
  k.t = e->t;
  k.limit = e->limit;
  return k;
}

/* 1 when an earlier choice for the shape was copied into e */
static int choice_get(ampc__device *d, ampc__cu_conv *e, int benchmark) {
  conv_key k = key_of(d, e, benchmark);
  int found = 0;
  pthread_mutex_lock(&choices_lock);
  for (size_t i = 0; i < nchoices && !found; i++)
    if (memcmp(&choices[i].key, &k, sizeof k) == 0) {
      e->a = choices[i].a;
      found = 1;
    }
  pthread_mutex_unlock(&choices_lock);
  return found;
}

static void choice_put(ampc__device *d, const ampc__cu_conv *e, int benchmark) {
  pthread_mutex_lock(&choices_lock);
  if (nchoices < CHOICES_MAX) { /* (past it, shapes are chosen each time) */
    choices[nchoices].key = key_of(d, e, benchmark);
    choices[nchoices++].a = e->a;
  }
  pthread_mutex_unlock(&choices_lock);
}

static ampc_status choose(ampc__device *d, ampc__cu_conv *e, int benchmark, int need_data, int need_filter) {
  cudnnHandle_t h;
  AMPC_TRY(ampc__cu_dnn(d, &h));
  int n = 0, i;
  DNN_TRY(cudnnSetConvolutionMathType(e->cd, base_math(d, e->t)), "cudnnSetConvolutionMathType");
  {
    cudnnConvolutionFwdAlgoPerf_t perf[CONV_MAX_ALGOS];
    cudnnStatus_t s = benchmark ? cudnnFindConvolutionForwardAlgorithm(h, e->xd, e->wd, e->cd, e->yd, CONV_MAX_ALGOS, &n, perf)
                                : CUDNN_STATUS_NOT_SUPPORTED;
    if (s != CUDNN_STATUS_SUCCESS)
      DNN_TRY(cudnnGetConvolutionForwardAlgorithm_v7(h, e->xd, e->wd, e->cd, e->yd, CONV_MAX_ALGOS, &n, perf),
              "choosing a forward convolution");
    PICK(perf, n, e->limit, d, e->t, i);
    if (i < 0) return ampc__error(AMPC_EUNSUPPORTED, "cuda: no cuDNN forward convolution for this shape fits %zu bytes", e->limit);
    RECORD(perf, n, i, e->limit, d, e->t, e->a.pick[0]);
    e->a.fwd = perf[i].algo;
    e->a.fwd_math = chosen_math(d, e->t, perf[i].mathType);
    DNN_TRY(cudnnSetConvolutionMathType(e->cd, e->a.fwd_math), "cudnnSetConvolutionMathType");
    DNN_TRY(cudnnGetConvolutionForwardWorkspaceSize(h, e->xd, e->wd, e->cd, e->yd, e->a.fwd, &e->a.fwd_ws), "workspace size");
  }
  if (need_data) {
    cudnnConvolutionBwdDataAlgoPerf_t perf[CONV_MAX_ALGOS];
    DNN_TRY(cudnnSetConvolutionMathType(e->cd, base_math(d, e->t)), "cudnnSetConvolutionMathType");
    cudnnStatus_t s = benchmark ? cudnnFindConvolutionBackwardDataAlgorithm(h, e->wd, e->yd, e->cd, e->xd, CONV_MAX_ALGOS, &n, perf)
                                : CUDNN_STATUS_NOT_SUPPORTED;
    if (s != CUDNN_STATUS_SUCCESS)
      DNN_TRY(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, e->wd, e->yd, e->cd, e->xd, CONV_MAX_ALGOS, &n, perf),
              "choosing a backward-data convolution");
    PICK(perf, n, e->limit, d, e->t, i);
    if (i < 0) return ampc__error(AMPC_EUNSUPPORTED, "cuda: no cuDNN backward-data convolution for this shape fits %zu bytes", e->limit);
    RECORD(perf, n, i, e->limit, d, e->t, e->a.pick[1]);
    e->a.data = perf[i].algo;
    e->a.data_math = chosen_math(d, e->t, perf[i].mathType);
    DNN_TRY(cudnnSetConvolutionMathType(e->cd, e->a.data_math), "cudnnSetConvolutionMathType");
    DNN_TRY(cudnnGetConvolutionBackwardDataWorkspaceSize(h, e->wd, e->yd, e->cd, e->xd, e->a.data, &e->a.data_ws), "workspace size");
  }
  if (need_filter) {
    cudnnConvolutionBwdFilterAlgoPerf_t perf[CONV_MAX_ALGOS];
    DNN_TRY(cudnnSetConvolutionMathType(e->cd, base_math(d, e->t)), "cudnnSetConvolutionMathType");
    cudnnStatus_t s = benchmark ? cudnnFindConvolutionBackwardFilterAlgorithm(h, e->xd, e->yd, e->cd, e->wd, CONV_MAX_ALGOS, &n, perf)
                                : CUDNN_STATUS_NOT_SUPPORTED;
    if (s != CUDNN_STATUS_SUCCESS)
      DNN_TRY(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, e->xd, e->yd, e->cd, e->wd, CONV_MAX_ALGOS, &n, perf),
              "choosing a backward-filter convolution");
    PICK(perf, n, e->limit, d, e->t, i);
    if (i < 0) return ampc__error(AMPC_EUNSUPPORTED, "cuda: no cuDNN backward-filter convolution for this shape fits %zu bytes", e->limit);
    RECORD(perf, n, i, e->limit, d, e->t, e->a.pick[2]);
    e->a.filter = perf[i].algo;
    e->a.filter_math = chosen_math(d, e->t, perf[i].mathType);
    DNN_TRY(cudnnSetConvolutionMathType(e->cd, e->a.filter_math), "cudnnSetConvolutionMathType");
    DNN_TRY(cudnnGetConvolutionBackwardFilterWorkspaceSize(h, e->xd, e->yd, e->cd, e->wd, e->a.filter, &e->a.filter_ws),
            "workspace size");
  }
  return AMPC_OK;
}

static ampc_status describe(ampc__cu_conv *e) {
  cudnnDataType_t t = dnn_type(e->t);
  DNN_TRY(cudnnCreateTensorDescriptor(&e->xd), "cudnnCreateTensorDescriptor");
  DNN_TRY(cudnnCreateTensorDescriptor(&e->yd), "cudnnCreateTensorDescriptor");
  DNN_TRY(cudnnCreateFilterDescriptor(&e->wd), "cudnnCreateFilterDescriptor");
  DNN_TRY(cudnnCreateConvolutionDescriptor(&e->cd), "cudnnCreateConvolutionDescriptor");
  DNN_TRY(cudnnSetTensor4dDescriptor(e->xd, CUDNN_TENSOR_NCHW, t, (int)e->N, (int)e->C, (int)e->H, (int)e->W), "the input's shape");
  DNN_TRY(cudnnSetTensor4dDescriptor(e->yd, CUDNN_TENSOR_NCHW, t, (int)e->N, (int)e->O, (int)e->OH, (int)e->OW), "the output's shape");
  DNN_TRY(cudnnSetFilter4dDescriptor(e->wd, t, CUDNN_TENSOR_NCHW, (int)e->O, (int)e->C, (int)e->k, (int)e->k), "the weight's shape");
  DNN_TRY(cudnnSetConvolution2dDescriptor(e->cd, (int)e->p, (int)e->p, (int)e->s, (int)e->s, 1, 1, CUDNN_CROSS_CORRELATION,
                                          CUDNN_DATA_FLOAT),
          "the convolution");
  return AMPC_OK;
}

static int same_shape(const ampc__cu_conv *e, const ampc__op_call *c) {
  const ampc_shape *x = &c->in[0].shape, *w = &c->in[1].shape, *y = &c->out.shape;
  return e->N == x->d[0] && e->C == x->d[1] && e->H == x->d[2] && e->W == x->d[3] && e->O == w->d[0] && e->k == w->d[2] &&
         e->s == c->attr.stride && e->p == c->attr.pad && e->OH == y->d[2] && e->OW == y->d[3] && e->t == c->in[0].dtype;
}

/* The shape's entry, made (and its algorithms chosen within limit) when new. */
static ampc__cu_conv *conv_entry(ampc__device *d, const ampc__op_call *c, int benchmark, size_t limit) {
  ampc__cuda_dev *cd = ampc__cu_of(d);
  for (size_t i = 0; i < cd->nconvs; i++)
    if (same_shape(cd->convs[i], c)) return cd->convs[i];
  if (cd->nconvs == cd->cap_convs) {
    size_t cap = cd->cap_convs ? 2 * cd->cap_convs : 16;
    ampc__cu_conv **nc = realloc(cd->convs, cap * sizeof *nc);
    if (!nc) return NULL;
    cd->convs = nc;
    cd->cap_convs = cap;
  }
  ampc__cu_conv *e = calloc(1, sizeof *e);
  if (!e) return NULL;
  const ampc_shape *x = &c->in[0].shape, *w = &c->in[1].shape, *y = &c->out.shape;
  e->N = x->d[0];
  e->C = x->d[1];
  e->H = x->d[2];
  e->W = x->d[3];
  e->O = w->d[0];
  e->k = w->d[2];
  e->s = c->attr.stride;
  e->p = c->attr.pad;
  e->OH = y->d[2];
  e->OW = y->d[3];
  e->t = c->in[0].dtype;
  e->limit = limit;
  ampc_status s = describe(e);
  /* both gradients are chosen for: which ones a backward needs can change */
  if (s == 0 && !choice_get(d, e, benchmark)) {
    s = choose(d, e, benchmark, 1, 1);
    if (s == 0) choice_put(d, e, benchmark);
  }
  if (s < 0) {
    e->err = s;
    snprintf(e->msg, sizeof e->msg, "%s", ampc_last_error());
  }
  cd->convs[cd->nconvs++] = e;
  return e;
}

static size_t entry_ws(const ampc__cu_conv *e) {
  size_t w = e->a.fwd_ws;
  if (e->a.data_ws > w) w = e->a.data_ws;
  if (e->a.filter_ws > w) w = e->a.filter_ws;
  return w;
}

size_t ampc__cu_conv_ws(ampc__device *d, const ampc__op_call *c) {
  ampc__cuda_dev *cd = ampc__cu_of(d);
  size_t limit = cd->total_mem / 16 < CONV_WS_LIMIT ? (size_t)(cd->total_mem / 16) : CONV_WS_LIMIT;
  ampc__cu_conv *e = conv_entry(d, c, 1, limit);
  return e && !e->err ? entry_ws(e) : 0;
}

/* The entry for a call: the compiled one, or (another batch) one chosen
 * within the planned workspace; its error if choosing failed. */
static ampc_status entry_for(ampc__device *d, const ampc__op_call *c, ampc__cu_conv **out) {
  ampc_dtype t = c->in[0].dtype;
  if (c->in[1].dtype != t || c->out.dtype != t)
    return ampc__error(AMPC_EUNSUPPORTED, "conv2d: cuda runs x, weight and output of one type (got %s, %s, %s)",
                       ampc_dtype_name(c->in[0].dtype), ampc_dtype_name(c->in[1].dtype), ampc_dtype_name(c->out.dtype));
  ampc__cu_conv *e = conv_entry(d, c, 0, c->ws_size);
  if (!e) return ampc__error(AMPC_ENOMEM, "cuda: out of memory");
  if (e->err) return ampc__error(e->err, "%s", e->msg);
  if (entry_ws(e) > c->ws_size)
    return ampc__error(AMPC_EINVAL, "conv2d: cuDNN's algorithms need %zu bytes of workspace, the graph planned %zu", entry_ws(e),
                       c->ws_size);
  *out = e;
  return AMPC_OK;
}

ampc_status ampc__cu_conv_fwd(ampc__device *d, const ampc__op_call *c) {
  ampc__cu_conv *e = NULL;
  AMPC_TRY(entry_for(d, c, &e));
  cudnnHandle_t h;
  AMPC_TRY(ampc__cu_dnn(d, &h));
  float one = 1.0f, beta = 0.0f;
  if (c->n_in > 2 && c->in[2].data) {
    int r = ampc__cu_fill_channels(ampc__cu_of(d)->stream, c->out.data, c->out.dtype, c->in[2].data, c->in[2].dtype, e->N,
                                   e->O, e->OH * e->OW);
    if (r) return ampc__cu_error_rt(r, "conv2d: the bias");
    beta = 1.0f;
  }
  DNN_TRY(cudnnSetConvolutionMathType(e->cd, e->a.fwd_math), "cudnnSetConvolutionMathType");
  DNN_TRY(cudnnConvolutionForward(h, &one, e->xd, c->in[0].data, e->wd, c->in[1].data, e->cd, e->a.fwd, c->ws, c->ws_size, &beta,
                                  e->yd, c->out.data),
          "conv2d forward (cudnnConvolutionForward)");
  return AMPC_OK;
}

static ampc_status count_half(ampc__device *d, const ampc_tensor *t) {
  ampc__cu_count *cnt = ampc__cu_counters(d, 1);
  if (!cnt || t->dtype == AMPC_DTYPE_F32) return AMPC_OK;
  int r = ampc__cu_count_half(ampc__cu_of(d)->stream, t->data, t->dtype, (size_t)ampc_tensor_numel(t), cnt);
  return r ? ampc__cu_error_rt(r, "conv2d: counting gradients") : AMPC_OK;
}

ampc_status ampc__cu_conv_bwd(ampc__device *d, const ampc__op_call *c) {
  ampc__cu_conv *e = NULL;
  AMPC_TRY(entry_for(d, c, &e));
  if (c->dout.dtype != e->t) return ampc__error(AMPC_EUNSUPPORTED, "conv2d: cuda needs the output's gradient in the output's type");
  cudnnHandle_t h;
  AMPC_TRY(ampc__cu_dnn(d, &h));
  float one = 1.0f, beta;
  if (c->din[0].data) {
    beta = c->din_acc[0] ? 1.0f : 0.0f;
    DNN_TRY(cudnnSetConvolutionMathType(e->cd, e->a.data_math), "cudnnSetConvolutionMathType");
    DNN_TRY(cudnnConvolutionBackwardData(h, &one, e->wd, c->in[1].data, e->yd, c->dout.data, e->cd, e->a.data, c->ws, c->ws_size,
                                         &beta, e->xd, c->din[0].data),
            "conv2d backward data (cudnnConvolutionBackwardData)");
    AMPC_TRY(count_half(d, &c->din[0]));
  }
  cudaEvent_t mid = ampc__cu_timing_event(d, 1);
  if (mid) cudaEventRecord(mid, ampc__cu_of(d)->stream);
  if (c->din[1].data) {
    beta = c->din_acc[1] ? 1.0f : 0.0f;
    DNN_TRY(cudnnSetConvolutionMathType(e->cd, e->a.filter_math), "cudnnSetConvolutionMathType");
    DNN_TRY(cudnnConvolutionBackwardFilter(h, &one, e->xd, c->in[0].data, e->yd, c->dout.data, e->cd, e->a.filter, c->ws,
                                           c->ws_size, &beta, e->wd, c->din[1].data),
            "conv2d backward filter (cudnnConvolutionBackwardFilter)");
    AMPC_TRY(count_half(d, &c->din[1]));
  }
  if (c->n_in > 2 && c->din[2].data) {
    int r = ampc__cu_channel_sum(ampc__cu_of(d)->stream, c->dout.data, c->dout.dtype, e->N, e->O, e->OH * e->OW, c->din[2].data,
                                 c->din[2].dtype, c->din_acc[2], ampc__cu_counters(d, 1));
    if (r) return ampc__cu_error_rt(r, "conv2d: the bias gradient");
  }
  return AMPC_OK;
}

/* ---- the notes: each shape's choices ---- */

static const char *algo_name(int dir, int a) {
  static const char *fwd[] = {"IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM", "GEMM", "DIRECT",
                              "FFT", "FFT_TILING", "WINOGRAD", "WINOGRAD_NONFUSED"};
  static const char *data[] = {"ALGO_0", "ALGO_1", "FFT", "FFT_TILING", "WINOGRAD", "WINOGRAD_NONFUSED"};
  static const char *filter[] = {"ALGO_0", "ALGO_1", "FFT", "ALGO_3", "WINOGRAD", "WINOGRAD_NONFUSED", "FFT_TILING"};
  const char **names = dir == 0 ? fwd : dir == 1 ? data : filter;
  int count = dir == 0 ? 8 : dir == 1 ? 6 : 7;
  return a >= 0 && a < count ? names[a] : "?";
}

static const char *math_name(cudnnMathType_t m) {
  return m == CUDNN_TENSOR_OP_MATH || m == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION ? "tensor-op"
         : m == CUDNN_FMA_MATH                                                    ? "fma"
                                                                                  : "default-math";
}

/* appends to line (cap bytes) at *k, never past its end */
static void app(char *line, size_t cap, size_t *k, const char *fmt, ...) {
  if (*k + 1 >= cap) return;
  va_list ap;
  va_start(ap, fmt);
  int w = vsnprintf(line + *k, cap - *k, fmt, ap);
  va_end(ap);
  if (w > 0) *k = *k + (size_t)w < cap - 1 ? *k + (size_t)w : cap - 1;
}

size_t ampc__cu_conv_notes(ampc__device *d, char *buf, size_t n) {
  ampc__cuda_dev *cd = ampc__cu_of(d);
  static const char *dirs[] = {"forward", "data", "filter"};
  size_t len = 0;
  char line[1024];
  for (size_t i = 0; i < cd->nconvs; i++) {
    const ampc__cu_conv *e = cd->convs[i];
    size_t k = 0, cap = sizeof line - 1; /* (room for the newline) */
    app(line, cap, &k, "conv %lldx%lldx%lldx%lld -> %lld, %lldx%lld stride %lld pad %lld, %s:", (long long)e->N,
        (long long)e->C, (long long)e->H, (long long)e->W, (long long)e->O, (long long)e->k, (long long)e->k, (long long)e->s,
        (long long)e->p, ampc_dtype_name(e->t));
    if (e->err) app(line, cap, &k, " not chosen (%s)", e->msg);
    for (int j = 0; j < 3 && !e->err; j++) {
      const conv_pick *p = &e->a.pick[j];
      app(line, cap, &k, "%s %s %s %s", j ? ";" : "", dirs[j], algo_name(j, p->algo), math_name(p->math));
      if (p->time > 0.0f) app(line, cap, &k, " %.3f ms", (double)p->time);
      app(line, cap, &k, " %.1f MB%s", (double)p->mem / 1e6, p->det ? "" : " non-deterministic");
      if (p->fast_time > 0.0f && p->fast_algo != p->algo)
        app(line, cap, &k, " (fastest: %s %.3f ms%s)", algo_name(j, p->fast_algo), (double)p->fast_time,
            p->fast_det ? "" : ", non-deterministic");
    }
    line[k++] = '\n';
    line[k] = 0;
    if (len + k + 1 > n) break; /* whole lines only */
    memcpy(buf + len, line, k + 1);
    len += k;
  }
  return len;
}
