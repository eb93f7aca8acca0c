/*
 * emu_runtime.cpp -- the parts of the CUDA runtime, cuBLAS and cuDNN the
 * cuda backend calls, on the host, for the AMPC_CUDA_EMU test build: device
 * memory is host memory, every stream operation runs at once, kernels run
 * through emu.h's launch (blocks in turn, a block's threads as host
 * threads), and the library calls are plain loops that follow the
 * documented semantics (cuBLAS's column-major GEMM with op(A), op(B), alpha
 * and beta; cuDNN's NCHW cross-correlation with padding and stride, its three
 * directions, alpha and beta). So the backend's own code -- its memory
 * arena, staging, kernels, the way it calls the libraries -- runs in the
 * tests of a machine without a GPU; what it cannot check is the libraries
 * themselves and the GPU's timing.
 *
 * A convolution fills its workspace with NaNs before using it, so that an op
 * that expected the workspace to keep its contents across calls fails.
 */
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <ucontext.h>
#include <vector>

#include "backend/cuda/emu/emu.h"
#include "core/dtype_internal.h"

/* ---------------- kernels: blocks of fibers ----------------
 *
 * A block's threads are fibers (ucontext) on the calling thread, run in
 * rounds: each runs until its next __syncthreads or its end, and the next
 * round starts only when every live one has arrived -- a barrier, with the
 * threads that returned left out of it, as an exited GPU thread is. Blocks
 * run one after another. */

namespace ampc_emu {
uint3 threadIdx, blockIdx;
dim3 blockDim, gridDim;
unsigned char *dyn_smem;

namespace {
enum { FIBER_STACK = 256 << 10 };
struct fiber {
  ucontext_t ctx;
  std::vector<unsigned char> stack;
  bool done;
};
ucontext_t scheduler;
std::vector<fiber> fibers;
int current;
const std::function<void()> *kernel;
std::mutex launch_mutex;

void fiber_main() {
  (*kernel)();
  fibers[(size_t)current].done = true;
  swapcontext(&fibers[(size_t)current].ctx, &scheduler);
}
/* (apart: getcontext returns twice, which the caller's locals must not see) */
__attribute__((noinline)) void start_fiber(fiber &f) {
  if (f.stack.empty()) f.stack.resize(FIBER_STACK);
  getcontext(&f.ctx);
  f.ctx.uc_stack.ss_sp = f.stack.data();
  f.ctx.uc_stack.ss_size = f.stack.size();
  f.ctx.uc_link = NULL;
  f.done = false;
  makecontext(&f.ctx, fiber_main, 0);
}
} // namespace

void syncthreads() { swapcontext(&fibers[(size_t)current].ctx, &scheduler); }

/* Stream capture: while a capture is open, the stream's work is recorded
 * (a graph is the list of it) instead of run. */
std::vector<std::function<void()>> *capturing;

/* Runs work now, or records it into the capture in progress. */
void stream_work(std::function<void()> work) {
  if (capturing) capturing->push_back(std::move(work));
  else work();
}

static void launch_now(dim3 grid, dim3 block, size_t smem, const std::function<void()> &fn);

void launch(dim3 grid, dim3 block, size_t smem, const std::function<void()> &fn) {
  if (capturing) {
    std::function<void()> copy = fn;
    capturing->push_back([=] { launch_now(grid, block, smem, copy); });
    return;
  }
  launch_now(grid, block, smem, fn);
}

static void launch_now(dim3 grid, dim3 block, size_t smem, const std::function<void()> &fn) {
  std::lock_guard<std::mutex> lock(launch_mutex);
  if (block.y != 1 || block.z != 1 || grid.y != 1 || grid.z != 1 || block.x < 1 || block.x > 1024) abort();
  int nt = (int)block.x;
  std::vector<unsigned char> shared(smem + 16);
  if (fibers.size() < (size_t)nt) fibers.resize((size_t)nt);
  kernel = &fn;
  blockDim = block;
  gridDim = grid;
  dyn_smem = shared.data();
  for (unsigned b = 0; b < grid.x; b++) {
    blockIdx = make_uint3(b, 0, 0);
    for (int t = 0; t < nt; t++) start_fiber(fibers[(size_t)t]);
    for (int live = nt; live > 0;) {
      live = 0;
      for (int t = 0; t < nt; t++) {
        if (fibers[(size_t)t].done) continue;
        current = t;
        threadIdx = make_uint3((unsigned)t, 0, 0);
        swapcontext(&scheduler, &fibers[(size_t)t].ctx);
        live += !fibers[(size_t)t].done;
      }
    }
  }
}
} // namespace ampc_emu

/* ---------------- the runtime ---------------- */

namespace {
struct emu_event {
  std::chrono::steady_clock::time_point t;
};
struct CUstream_st_emu {
  int dummy;
};
CUstream_st_emu the_stream;
}

extern "C" {

cudaError_t cudaGetDeviceCount(int *n) {
  *n = 1;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int) { return cudaSuccess; }
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int) {
  memset(p, 0, sizeof *p);
  snprintf(p->name, sizeof p->name, "ampc host emulation");
  p->totalGlobalMem = (size_t)8 << 30;
  p->multiProcessorCount = 4;
  p->major = 9;
  return cudaSuccess;
}
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
const char *cudaGetErrorName(cudaError_t) { return "cudaErrorEmulated"; }
const char *cudaGetErrorString(cudaError_t) { return "an error of the host emulation"; }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int) {
  *s = (cudaStream_t)(void *)&the_stream;
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamSynchronize(cudaStream_t) { return ampc_emu::capturing ? cudaErrorStreamCaptureUnsupported : cudaSuccess; }
cudaError_t cudaMalloc(void **p, size_t n) {
  /* not zeroed: the backend must zero what it promises to */
  *p = aligned_alloc(256, (n + 255) / 256 * 256);
  if (!*p) return cudaErrorMemoryAllocation;
  memset(*p, 0xA5, n);
  return cudaSuccess;
}
cudaError_t cudaFree(void *p) {
  free(p);
  return cudaSuccess;
}
cudaError_t cudaHostAlloc(void **p, size_t n, unsigned int) {
  *p = aligned_alloc(256, (n + 255) / 256 * 256);
  return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFreeHost(void *p) {
  free(p);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, cudaStream_t) {
  if (ampc_emu::capturing && kind != cudaMemcpyDeviceToDevice) return cudaErrorStreamCaptureUnsupported;
  ampc_emu::stream_work([=] { memmove(dst, src, n); });
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *dst, int v, size_t n, cudaStream_t) {
  ampc_emu::stream_work([=] { memset(dst, v, n); });
  return cudaSuccess;
}

/* graphs: a recorded list of work */
struct CUgraph_st {
  std::vector<std::function<void()>> work;
};
struct CUgraphExec_st {
  std::vector<std::function<void()>> work;
};
cudaError_t cudaStreamBeginCapture(cudaStream_t, enum cudaStreamCaptureMode) {
  if (ampc_emu::capturing) return cudaErrorIllegalState;
  ampc_emu::capturing = new std::vector<std::function<void()>>();
  return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t, cudaGraph_t *g) {
  if (!ampc_emu::capturing) return cudaErrorIllegalState;
  *g = new CUgraph_st{std::move(*ampc_emu::capturing)};
  delete ampc_emu::capturing;
  ampc_emu::capturing = NULL;
  return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *e, cudaGraph_t g, unsigned long long) {
  *e = new CUgraphExec_st{g->work};
  return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t) {
  if (ampc_emu::capturing) return cudaErrorStreamCaptureUnsupported;
  for (auto &w : e->work) w();
  return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e) {
  delete e;
  return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t g) {
  delete g;
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t *e) {
  *e = (cudaEvent_t)(void *)new emu_event();
  return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int) { return cudaEventCreate(e); }
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete (emu_event *)(void *)e;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t) {
  ((emu_event *)(void *)e)->t = std::chrono::steady_clock::now();
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventQuery(cudaEvent_t) { return cudaSuccess; } /* (the work recorded before ran already) */
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
  *ms = std::chrono::duration<float, std::milli>(((emu_event *)(void *)b)->t - ((emu_event *)(void *)a)->t).count();
  return cudaSuccess;
}

} // extern "C"

/* ---------------- typed access for the library loops ---------------- */

namespace {
double ld(const void *p, int t, size_t i) {
  switch (t) {
    case 0: return ((const float *)p)[i];
    case 1: return ampc__f16_to_f32_inline(((const uint16_t *)p)[i]);
    default: return ampc__bf16_to_f32_inline(((const uint16_t *)p)[i]);
  }
}
void st(void *p, int t, size_t i, double v) {
  float f = (float)v;
  switch (t) {
    case 0: ((float *)p)[i] = f; break;
    case 1: ((uint16_t *)p)[i] = ampc__f32_to_f16_inline(f); break;
    default: ((uint16_t *)p)[i] = ampc__f32_to_bf16_inline(f); break;
  }
}
int blas_kind(cudaDataType_t t) { return t == CUDA_R_32F ? 0 : t == CUDA_R_16F ? 1 : t == CUDA_R_16BF ? 2 : -1; }
int dnn_kind(cudnnDataType_t t) { return t == CUDNN_DATA_FLOAT ? 0 : t == CUDNN_DATA_HALF ? 1 : t == CUDNN_DATA_BFLOAT16 ? 2 : -1; }
} // namespace

/* ---------------- cuBLAS ---------------- */

struct cublasContext {
  int dummy;
};

extern "C" {

cublasStatus_t cublasCreate_v2(cublasHandle_t *h) {
  *h = new cublasContext();
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy_v2(cublasHandle_t h) {
  delete h;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream_v2(cublasHandle_t, cudaStream_t) { return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t, void *, size_t) { return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasSetMathMode(cublasHandle_t, cublasMath_t) { return CUBLAS_STATUS_SUCCESS; }
const char *cublasGetStatusString(cublasStatus_t) { return "emulated cuBLAS error"; }

/* C (m x n, column-major, ldc) = alpha op(A) op(B) + beta C */
cublasStatus_t cublasGemmEx(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void *alpha, const void *A, cudaDataType_t at, int lda, const void *B, cudaDataType_t bt,
                            int ldb, const void *beta, void *C, cudaDataType_t ct, int ldc, cublasComputeType_t,
                            cublasGemmAlgo_t) {
  int ak = blas_kind(at), bk = blas_kind(bt), ck = blas_kind(ct);
  if (ak < 0 || bk < 0 || ck < 0 || ak != bk) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (lda < (ta == CUBLAS_OP_N ? m : k) || ldb < (tb == CUBLAS_OP_N ? k : n) || ldc < m) return CUBLAS_STATUS_INVALID_VALUE;
  double al = *(const float *)alpha, be = *(const float *)beta;
  ampc_emu::stream_work([=] {
  for (int j = 0; j < n; j++)
    for (int i = 0; i < m; i++) {
      double acc = 0.0;
      for (int p = 0; p < k; p++) {
        double a = ta == CUBLAS_OP_N ? ld(A, ak, (size_t)i + (size_t)p * lda) : ld(A, ak, (size_t)p + (size_t)i * lda);
        double b = tb == CUBLAS_OP_N ? ld(B, bk, (size_t)p + (size_t)j * ldb) : ld(B, bk, (size_t)j + (size_t)p * ldb);
        acc += a * b;
      }
      size_t ci = (size_t)i + (size_t)j * ldc;
      st(C, ck, ci, al * acc + (be != 0.0 ? be * ld(C, ck, ci) : 0.0));
    }
  });
  return CUBLAS_STATUS_SUCCESS;
}

} // extern "C"

/* ---------------- cuDNN ---------------- */

struct cudnnContext {
  int dummy;
};
struct cudnnTensorStruct {
  int t, n, c, h, w;
};
struct cudnnFilterStruct {
  int t, o, c, h, w;
};
struct cudnnConvolutionStruct {
  int ph, pw, sh, sw;
  cudnnMathType_t math;
};

namespace {
const size_t EMU_CONV_WS = 4096;

void poison(void *ws, size_t n) {
  if (!ws) return;
  float nan = std::nanf("");
  for (size_t i = 0; i + sizeof(float) <= n && i < EMU_CONV_WS; i += sizeof(float)) memcpy((char *)ws + i, &nan, sizeof nan);
}

/* checks the shapes agree: y = conv(x, w) */
bool shapes_ok(const cudnnTensorStruct *x, const cudnnFilterStruct *w, const cudnnConvolutionStruct *c,
               const cudnnTensorStruct *y) {
  return x->c == w->c && y->c == w->o && x->n == y->n && x->t == w->t && x->t == y->t &&
         y->h == (x->h + 2 * c->ph - w->h) / c->sh + 1 && y->w == (x->w + 2 * c->pw - w->w) / c->sw + 1;
}

/* visits every (output, input, weight) index triple of the convolution */
template <typename F>
void each_tap(const cudnnTensorStruct *x, const cudnnFilterStruct *w, const cudnnConvolutionStruct *c,
              const cudnnTensorStruct *y, F f) {
  for (int n = 0; n < y->n; n++)
    for (int o = 0; o < y->c; o++)
      for (int oy = 0; oy < y->h; oy++)
        for (int ox = 0; ox < y->w; ox++) {
          size_t yi = (((size_t)n * y->c + o) * y->h + oy) * y->w + ox;
          for (int ci = 0; ci < x->c; ci++)
            for (int ky = 0; ky < w->h; ky++)
              for (int kx = 0; kx < w->w; kx++) {
                int iy = oy * c->sh - c->ph + ky, ix = ox * c->sw - c->pw + kx;
                if (iy < 0 || iy >= x->h || ix < 0 || ix >= x->w) continue;
                size_t xi = (((size_t)n * x->c + ci) * x->h + iy) * x->w + ix;
                size_t wi = (((size_t)o * w->c + ci) * w->h + ky) * w->w + kx;
                f(yi, xi, wi);
              }
        }
}

size_t count(const cudnnTensorStruct *t) { return (size_t)t->n * t->c * t->h * t->w; }
size_t count(const cudnnFilterStruct *t) { return (size_t)t->o * t->c * t->h * t->w; }

template <typename P>
void one_result(P *perf, int *returned, cudnnMathType_t math) {
  memset(perf, 0, sizeof *perf);
  perf->algo = {};
  perf->status = CUDNN_STATUS_SUCCESS;
  perf->time = 1.0f;
  perf->memory = EMU_CONV_WS;
  perf->determinism = CUDNN_DETERMINISTIC;
  perf->mathType = math;
  *returned = 1;
}
} // namespace

extern "C" {

cudnnStatus_t cudnnCreate(cudnnHandle_t *h) {
  *h = new cudnnContext();
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnDestroy(cudnnHandle_t h) {
  delete h;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetStream(cudnnHandle_t, cudaStream_t) { return CUDNN_STATUS_SUCCESS; }
const char *cudnnGetErrorString(cudnnStatus_t) { return "emulated cuDNN error"; }
cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t *d) {
  *d = new cudnnTensorStruct();
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t d) {
  delete d;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t *d) {
  *d = new cudnnFilterStruct();
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t d) {
  delete d;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t *d) {
  *d = new cudnnConvolutionStruct();
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnDestroyConvolutionDescriptor(cudnnConvolutionDescriptor_t d) {
  delete d;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t d, cudnnTensorFormat_t f, cudnnDataType_t t, int n, int c,
                                         int h, int w) {
  if (f != CUDNN_TENSOR_NCHW || dnn_kind(t) < 0 || n < 1 || c < 1 || h < 1 || w < 1) return CUDNN_STATUS_BAD_PARAM;
  *d = {dnn_kind(t), n, c, h, w};
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t d, cudnnDataType_t t, cudnnTensorFormat_t f, int o, int c,
                                         int h, int w) {
  if (f != CUDNN_TENSOR_NCHW || dnn_kind(t) < 0 || o < 1 || c < 1 || h < 1 || w < 1) return CUDNN_STATUS_BAD_PARAM;
  *d = {dnn_kind(t), o, c, h, w};
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetConvolution2dDescriptor(cudnnConvolutionDescriptor_t d, int ph, int pw, int sh, int sw, int dh, int dw,
                                              cudnnConvolutionMode_t mode, cudnnDataType_t compute) {
  if (dh != 1 || dw != 1 || mode != CUDNN_CROSS_CORRELATION || compute != CUDNN_DATA_FLOAT || sh < 1 || sw < 1 || ph < 0 || pw < 0)
    return CUDNN_STATUS_BAD_PARAM;
  d->ph = ph;
  d->pw = pw;
  d->sh = sh;
  d->sw = sw;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t d, cudnnMathType_t m) {
  d->math = m;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnFindConvolutionForwardAlgorithm(cudnnHandle_t, const cudnnTensorDescriptor_t x, const cudnnFilterDescriptor_t w,
                                                   const cudnnConvolutionDescriptor_t c, const cudnnTensorDescriptor_t y, const int,
                                                   int *n, cudnnConvolutionFwdAlgoPerf_t *perf) {
  if (!shapes_ok(x, w, c, y)) return CUDNN_STATUS_BAD_PARAM;
  one_result(perf, n, c->math);
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(cudnnHandle_t h, const cudnnTensorDescriptor_t x,
                                                     const cudnnFilterDescriptor_t w, const cudnnConvolutionDescriptor_t c,
                                                     const cudnnTensorDescriptor_t y, const int k, int *n,
                                                     cudnnConvolutionFwdAlgoPerf_t *perf) {
  return cudnnFindConvolutionForwardAlgorithm(h, x, w, c, y, k, n, perf);
}
cudnnStatus_t cudnnFindConvolutionBackwardDataAlgorithm(cudnnHandle_t, const cudnnFilterDescriptor_t w,
                                                        const cudnnTensorDescriptor_t y, const cudnnConvolutionDescriptor_t c,
                                                        const cudnnTensorDescriptor_t x, const int, int *n,
                                                        cudnnConvolutionBwdDataAlgoPerf_t *perf) {
  if (!shapes_ok(x, w, c, y)) return CUDNN_STATUS_BAD_PARAM;
  one_result(perf, n, c->math);
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(cudnnHandle_t h, const cudnnFilterDescriptor_t w,
                                                          const cudnnTensorDescriptor_t y, const cudnnConvolutionDescriptor_t c,
                                                          const cudnnTensorDescriptor_t x, const int k, int *n,
                                                          cudnnConvolutionBwdDataAlgoPerf_t *perf) {
  return cudnnFindConvolutionBackwardDataAlgorithm(h, w, y, c, x, k, n, perf);
}
cudnnStatus_t cudnnFindConvolutionBackwardFilterAlgorithm(cudnnHandle_t, const cudnnTensorDescriptor_t x,
                                                          const cudnnTensorDescriptor_t y, const cudnnConvolutionDescriptor_t c,
                                                          const cudnnFilterDescriptor_t w, const int, int *n,
                                                          cudnnConvolutionBwdFilterAlgoPerf_t *perf) {
  if (!shapes_ok(x, w, c, y)) return CUDNN_STATUS_BAD_PARAM;
  one_result(perf, n, c->math);
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(cudnnHandle_t h, const cudnnTensorDescriptor_t x,
                                                            const cudnnTensorDescriptor_t y, const cudnnConvolutionDescriptor_t c,
                                                            const cudnnFilterDescriptor_t w, const int k, int *n,
                                                            cudnnConvolutionBwdFilterAlgoPerf_t *perf) {
  return cudnnFindConvolutionBackwardFilterAlgorithm(h, x, y, c, w, k, n, perf);
}
cudnnStatus_t cudnnGetConvolutionForwardWorkspaceSize(cudnnHandle_t, const cudnnTensorDescriptor_t, const cudnnFilterDescriptor_t,
                                                      const cudnnConvolutionDescriptor_t, const cudnnTensorDescriptor_t,
                                                      cudnnConvolutionFwdAlgo_t, size_t *n) {
  *n = EMU_CONV_WS;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnGetConvolutionBackwardDataWorkspaceSize(cudnnHandle_t, const cudnnFilterDescriptor_t,
                                                           const cudnnTensorDescriptor_t, const cudnnConvolutionDescriptor_t,
                                                           const cudnnTensorDescriptor_t, cudnnConvolutionBwdDataAlgo_t, size_t *n) {
  *n = EMU_CONV_WS;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnGetConvolutionBackwardFilterWorkspaceSize(cudnnHandle_t, const cudnnTensorDescriptor_t,
                                                             const cudnnTensorDescriptor_t, const cudnnConvolutionDescriptor_t,
                                                             const cudnnFilterDescriptor_t, cudnnConvolutionBwdFilterAlgo_t,
                                                             size_t *n) {
  *n = EMU_CONV_WS;
  return CUDNN_STATUS_SUCCESS;
}

/* One of cuDNN's three convolution passes: the tensor `to` names (the
 * output y forward, x for backward data, w for backward filter) = alpha x
 * its sum over the taps of the product of the other two + beta x itself. */
enum conv_to { TO_Y, TO_X, TO_W };
static cudnnStatus_t emu_conv(conv_to to, const void *alpha, const void *beta, const cudnnTensorDescriptor_t xd,
                              const void *x, const cudnnFilterDescriptor_t wd, const void *w,
                              const cudnnConvolutionDescriptor_t cd, const cudnnTensorDescriptor_t yd, const void *y,
                              void *ws, size_t wsb, void *out) {
  if (!shapes_ok(xd, wd, cd, yd) || wsb < EMU_CONV_WS) return CUDNN_STATUS_BAD_PARAM;
  double al = *(const float *)alpha, be = *(const float *)beta;
  cudnnTensorStruct xs = *xd, ys = *yd;
  cudnnFilterStruct wf = *wd;
  cudnnConvolutionStruct cs = *cd;
  ampc_emu::stream_work([=] {
    const cudnnTensorStruct *xd = &xs, *yd = &ys;
    const cudnnFilterStruct *wd = &wf;
    poison(ws, wsb);
    int ot = to == TO_Y ? yd->t : to == TO_X ? xd->t : wd->t;
    std::vector<double> acc(to == TO_Y ? count(yd) : to == TO_X ? count(xd) : count(wd), 0.0);
    each_tap(xd, wd, &cs, yd, [&](size_t yi, size_t xi, size_t wi) {
      if (to == TO_Y) acc[yi] += ld(x, xd->t, xi) * ld(w, wd->t, wi);
      else if (to == TO_X) acc[xi] += ld(y, yd->t, yi) * ld(w, wd->t, wi);
      else acc[wi] += ld(y, yd->t, yi) * ld(x, xd->t, xi);
    });
    for (size_t i = 0; i < acc.size(); i++) st(out, ot, i, al * acc[i] + (be != 0.0 ? be * ld(out, ot, i) : 0.0));
  });
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t, const void *alpha, const cudnnTensorDescriptor_t xd, const void *x,
                                      const cudnnFilterDescriptor_t wd, const void *w, const cudnnConvolutionDescriptor_t cd,
                                      cudnnConvolutionFwdAlgo_t, void *ws, size_t wsb, const void *beta,
                                      const cudnnTensorDescriptor_t yd, void *y) {
  return emu_conv(TO_Y, alpha, beta, xd, x, wd, w, cd, yd, NULL, ws, wsb, y);
}
cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t, const void *alpha, const cudnnFilterDescriptor_t wd, const void *w,
                                           const cudnnTensorDescriptor_t yd, const void *dy,
                                           const cudnnConvolutionDescriptor_t cd, cudnnConvolutionBwdDataAlgo_t, void *ws,
                                           size_t wsb, const void *beta, const cudnnTensorDescriptor_t xd, void *dx) {
  return emu_conv(TO_X, alpha, beta, xd, NULL, wd, w, cd, yd, dy, ws, wsb, dx);
}
cudnnStatus_t cudnnConvolutionBackwardFilter(cudnnHandle_t, const void *alpha, const cudnnTensorDescriptor_t xd, const void *x,
                                             const cudnnTensorDescriptor_t yd, const void *dy,
                                             const cudnnConvolutionDescriptor_t cd, cudnnConvolutionBwdFilterAlgo_t, void *ws,
                                             size_t wsb, const void *beta, const cudnnFilterDescriptor_t wd, void *dw) {
  return emu_conv(TO_W, alpha, beta, xd, x, wd, NULL, cd, yd, dy, ws, wsb, dw);
}

} // extern "C"
