/* The cuda backend: the device (one GPU, one stream), its memory (a caching
 * arena over cudaMalloc), copies through pinned staging buffers, profiling
 * with events, and the vtable. The ops are cuda_ops.c's; the step's passes
 * cuda_step.c's. */
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_internal.h"

enum {
  CU_PIN_BYTES = 8 << 20,    /* each of the two staging buffers */
  CU_PIN_SMALL = 64 << 10,   /* the step's results and the device state */
  CU_ALIGN = 256,
  CU_BLAS_WS = 32 << 20      /* cuBLAS's workspace */
};

ampc_status ampc__cu_error_rt(int err, const char *what) {
  cudaError_t e = (cudaError_t)err;
  return ampc__error(e == cudaErrorMemoryAllocation ? AMPC_ENOMEM : AMPC_EIO, "cuda: %s: %s: %s", what, cudaGetErrorName(e),
                     cudaGetErrorString(e));
}

/* ---- memory: a caching arena ----
 *
 * Blocks come from cudaMalloc and go back to the arena when freed, never to
 * the driver while the device lives: a graph compiled again, or the amp
 * layer's buffers made again, reuse them, and the training step allocates
 * nothing. A request takes the smallest free block that holds it without
 * wasting more than half of it; large requests are rounded to 2 MB. */

static size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

static void note_use(ampc__cuda_dev *cd, int64_t delta) {
  cd->in_use += delta;
  if (cd->in_use > cd->in_use_peak) cd->in_use_peak = cd->in_use;
}

void *ampc__cu_alloc(ampc__device *d, size_t bytes) {
  ampc__cuda_dev *cd = ampc__cu_of(d);
  size_t want = round_up(bytes ? bytes : 1, CU_ALIGN);
  ampc__cu_block *best = NULL;
  for (size_t i = 0; i < cd->nblocks; i++) {
    ampc__cu_block *b = &cd->blocks[i];
    if (!b->used && b->size >= want && b->size <= 2 * want + (2u << 20) && (!best || b->size < best->size)) best = b;
  }
  if (!best) {
    if (cd->nblocks == cd->cap_blocks) {
      size_t cap = cd->cap_blocks ? 2 * cd->cap_blocks : 64;
      ampc__cu_block *nb = realloc(cd->blocks, cap * sizeof *nb);
      if (!nb) return NULL;
      cd->blocks = nb;
      cd->cap_blocks = cap;
    }
    size_t size = want >= (1u << 20) ? round_up(want, 2u << 20) : want;
    void *p = NULL;
    cudaSetDevice(cd->dev);
    if (cudaMalloc(&p, size) != cudaSuccess) {
      /* give the cached blocks back and try once more */
      cudaGetLastError();
      cudaStreamSynchronize(cd->stream);
      size_t k = 0;
      for (size_t i = 0; i < cd->nblocks; i++) {
        if (cd->blocks[i].used) {
          cd->blocks[k++] = cd->blocks[i];
        } else {
          cudaFree(cd->blocks[i].p);
          cd->reserved -= (int64_t)cd->blocks[i].size;
        }
      }
      cd->nblocks = k;
      if (cudaMalloc(&p, size) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
      }
    }
    cd->reserved += (int64_t)size;
    if (cd->reserved > cd->reserved_peak) cd->reserved_peak = cd->reserved;
    best = &cd->blocks[cd->nblocks++];
    best->p = p;
    best->size = size;
  }
  best->used = 1;
  note_use(cd, (int64_t)best->size);
  /* zeroed, in stream order: earlier kernels that used the block are done first */
  if (cudaMemsetAsync(best->p, 0, want, cd->stream) != cudaSuccess) {
    cudaGetLastError();
    best->used = 0;
    note_use(cd, -(int64_t)best->size);
    return NULL;
  }
  return best->p;
}

void ampc__cu_free(ampc__device *d, void *p) {
  ampc__cuda_dev *cd = ampc__cu_of(d);
  if (!p) return;
  for (size_t i = 0; i < cd->nblocks; i++)
    if (cd->blocks[i].p == p && cd->blocks[i].used) {
      cd->blocks[i].used = 0;
      note_use(cd, -(int64_t)cd->blocks[i].size);
      return;
    }
  AMPC_ASSERT(!"cuda: free of memory this device did not allocate");
}

/* Every device call but run() first ends a sequence of op calls that the
 * graph replay may be holding back (cuda_graph.c). */
#define FLUSH(d) AMPC_TRY(ampc__cu_graph_flush(d))

static void *cu_alloc(ampc__device *d, size_t bytes) {
  if (ampc__cu_graph_flush(d) < 0) return NULL;
  return ampc__cu_alloc(d, bytes);
}
static void cu_free(ampc__device *d, void *p) {
  (void)ampc__cu_graph_flush(d); /* (an error shows at the next call that waits) */
  ampc__cu_free(d, p);
}

/* ---- synchronisation and the device's own state ---- */

static ampc__cu_state *state_host(ampc__cuda_dev *cd) { return (ampc__cu_state *)cd->pin_small; }

/* How often the host waited for the device (the tests check that a training
 * step does once). */
int64_t ampc__cu_syncs;

ampc_status ampc__cu_finish(ampc__device *d) {
  ampc__cuda_dev *cd = ampc__cu_of(d);
  ampc__cu_syncs++;
  cudaSetDevice(cd->dev);
  AMPC_CU_TRY(cudaMemcpyAsync(state_host(cd), cd->state, sizeof(ampc__cu_state), cudaMemcpyDeviceToHost, cd->stream),
              "reading the device's state");
  AMPC_CU_TRY(cudaStreamSynchronize(cd->stream), "synchronizing");
  ampc__cu_error e = state_host(cd)->err;
  if (e.code) {
    AMPC_CU_TRY(cudaMemsetAsync(&cd->state->err, 0, sizeof cd->state->err, cd->stream), "clearing the error word");
    if (e.code == AMPC__CU_ERR_LABEL)
      return ampc__error(AMPC_ERANGE, "cross_entropy: label %d of sample %lld out of range for %lld classes", e.label,
                         e.sample, e.classes);
    return ampc__error(AMPC_EIO, "cuda: a kernel reported error %d", e.code);
  }
  return AMPC_OK;
}

static ampc_status cu_synchronize(ampc__device *d) {
  FLUSH(d);
  return ampc__cu_finish(d);
}

/* ---- copies: host <-> device through pinned staging ----
 *
 * Types are converted on the host, by the cpu backend's own conversion (the
 * same bits): a write converts a chunk into a staging buffer and enqueues
 * its copy, the next chunk (or the next write: the loader's next batch)
 * filling the other buffer meanwhile; a read copies a chunk into staging,
 * waits for it and converts it out. */

static ampc_status cu_write(ampc__device *d, void *dst, ampc_dtype dt, const void *src, ampc_dtype st, size_t n) {
  ampc__cuda_dev *cd = ampc__cu_of(d);
  size_t des = ampc_dtype_size(dt), ses = ampc_dtype_size(st), per = cd->pin_bytes / des;
  cudaSetDevice(cd->dev);
  FLUSH(d);
  for (size_t off = 0; off < n; off += per) {
    size_t m = n - off < per ? n - off : per;
    int k = cd->pin_next;
    cd->pin_next ^= 1;
    AMPC_CU_TRY(cudaEventSynchronize(cd->pin_ev[k]), "waiting for a staging buffer");
    AMPC_TRY(ampc__backend_cpu.write(NULL, cd->pin[k], dt, (const char *)src + off * ses, st, m));
    AMPC_CU_TRY(cudaMemcpyAsync((char *)dst + off * des, cd->pin[k], m * des, cudaMemcpyHostToDevice, cd->stream),
                "copying to the device");
    AMPC_CU_TRY(cudaEventRecord(cd->pin_ev[k], cd->stream), "recording a copy");
  }
  return AMPC_OK;
}

static ampc_status cu_read(ampc__device *d, void *dst, ampc_dtype dt, const void *src, ampc_dtype st, size_t n) {
  ampc__cuda_dev *cd = ampc__cu_of(d);
  size_t des = ampc_dtype_size(dt), ses = ampc_dtype_size(st), per = cd->pin_bytes / ses;
  cudaSetDevice(cd->dev);
  FLUSH(d);
  for (size_t off = 0; off < n; off += per) {
    size_t m = n - off < per ? n - off : per;
    /* both staging buffers' pending copies are earlier on the stream */
    AMPC_CU_TRY(cudaMemcpyAsync(cd->pin[0], (const char *)src + off * ses, m * ses, cudaMemcpyDeviceToHost, cd->stream),
                "copying from the device");
    AMPC_TRY(ampc__cu_finish(d));
    AMPC_TRY(ampc__backend_cpu.read(NULL, (char *)dst + off * des, dt, cd->pin[0], st, m));
  }
  return AMPC_OK;
}

static ampc_status cu_copy(ampc__device *d, void *dst, const void *src, size_t bytes) {
  ampc__cuda_dev *cd = ampc__cu_of(d);
  cudaSetDevice(cd->dev);
  FLUSH(d);
  AMPC_CU_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cd->stream), "copying on the device");
  return AMPC_OK;
}

static ampc_status cu_set(ampc__device *d, void *dst, int byte, size_t bytes) {
  ampc__cuda_dev *cd = ampc__cu_of(d);
  cudaSetDevice(cd->dev);
  FLUSH(d);
  AMPC_CU_TRY(cudaMemsetAsync(dst, byte, bytes, cd->stream), "setting memory");
  return AMPC_OK;
}

static uint64_t cu_capacity(ampc__device *d) { return ampc__cu_of(d)->total_mem; }

/* ---- handles ---- */

ampc_status ampc__cu_blas(ampc__device *d, cublasHandle_t *out) {
  ampc__cuda_dev *cd = ampc__cu_of(d);
  if (!cd->blas) {
    const ampc__cu_blas_api *b;
    AMPC_TRY(ampc__cu_blas_api_get(&b));
    cublasHandle_t h;
    cublasStatus_t s = b->create(&h);
    if (s != CUBLAS_STATUS_SUCCESS) return ampc__error(AMPC_EIO, "cuda: cublasCreate: %s", b->status_string(s));
    cd->blas_ws = ampc__cu_alloc(d, CU_BLAS_WS);
    /* products without reduced-precision reductions: f32 accumulation throughout */
    if (!cd->blas_ws || b->set_stream(h, cd->stream) != CUBLAS_STATUS_SUCCESS ||
        b->set_workspace(h, cd->blas_ws, CU_BLAS_WS) != CUBLAS_STATUS_SUCCESS ||
        b->set_math_mode(h, CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION) != CUBLAS_STATUS_SUCCESS) {
      b->destroy(h);
      ampc__cu_free(d, cd->blas_ws);
      cd->blas_ws = NULL;
      return ampc__error(AMPC_EIO, "cuda: setting up cuBLAS failed");
    }
    cd->blas = h;
  }
  *out = cd->blas;
  return AMPC_OK;
}

ampc_status ampc__cu_dnn(ampc__device *d, cudnnHandle_t *out) {
  ampc__cuda_dev *cd = ampc__cu_of(d);
  if (!cd->dnn) {
    cudnnHandle_t h;
    cudnnStatus_t s = cudnnCreate(&h);
    if (s != CUDNN_STATUS_SUCCESS) return ampc__error(AMPC_EIO, "cuda: cudnnCreate: %s", cudnnGetErrorString(s));
    s = cudnnSetStream(h, cd->stream);
    if (s != CUDNN_STATUS_SUCCESS) {
      cudnnDestroy(h);
      return ampc__error(AMPC_EIO, "cuda: cudnnSetStream: %s", cudnnGetErrorString(s));
    }
    cd->dnn = h;
  }
  *out = cd->dnn;
  return AMPC_OK;
}

ampc__cu_count *ampc__cu_counters(ampc__device *d, int backward) {
  return backward && d->count_underflow ? ampc__cu_of(d)->state->cnt : NULL;
}

/* ---- the device ---- */

static void cu_destroy(ampc__device *d);

static ampc_status cu_create(ampc__device *d) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return ampc__error(AMPC_EUNSUPPORTED, "no CUDA device (cudaGetDeviceCount: %s: %s)", cudaGetErrorName(e),
                       cudaGetErrorString(e));
  }
  if (n < 1) return ampc__error(AMPC_EUNSUPPORTED, "no CUDA device (cudaGetDeviceCount found none)");
  if (d->opts.device >= n)
    return ampc__error(AMPC_EINVAL, "device %d: there %s only %d CUDA device%s", d->opts.device, n == 1 ? "is" : "are", n,
                       n == 1 ? "" : "s");
  ampc__cuda_dev *cd = calloc(1, sizeof *cd);
  if (!cd) return ampc__error(AMPC_ENOMEM, "out of memory");
  d->impl = cd;
  d->opts.threads = 1; /* the kernels' threads are the GPU's */
  cd->dev = d->opts.device;
  struct cudaDeviceProp prop;
  ampc_status s = AMPC_OK;
#define CREATE_TRY(call, what)                                   \
  do {                                                           \
    int e_ = (int)(call);                                        \
    if (e_ != 0 && s == 0) s = ampc__cu_error_rt(e_, (what));    \
  } while (0)
  CREATE_TRY(cudaSetDevice(cd->dev), "cudaSetDevice");
  CREATE_TRY(cudaGetDeviceProperties(&prop, cd->dev), "cudaGetDeviceProperties");
  if (s == 0) {
    snprintf(cd->name, sizeof cd->name, "%s", prop.name);
    cd->total_mem = (uint64_t)prop.totalGlobalMem;
    cd->sm_count = prop.multiProcessorCount;
  }
  if (s == 0) CREATE_TRY(cudaStreamCreateWithFlags(&cd->stream, cudaStreamNonBlocking), "creating a stream");
  const ampc__cu_blas_api *blas_api;
  if (s == 0) s = ampc__cu_blas_api_get(&blas_api); /* (cuBLAS is opened now: a missing one is said at once) */
  void *pin = NULL;
  if (s == 0) CREATE_TRY(cudaHostAlloc(&pin, 2 * (size_t)CU_PIN_BYTES + CU_PIN_SMALL, cudaHostAllocDefault), "allocating pinned memory");
  if (s == 0) {
    cd->pin[0] = pin;
    cd->pin[1] = cd->pin[0] + CU_PIN_BYTES;
    cd->pin_small = cd->pin[1] + CU_PIN_BYTES;
    cd->pin_bytes = CU_PIN_BYTES;
  }
  for (int k = 0; k < 2 && s == 0; k++) CREATE_TRY(cudaEventCreateWithFlags(&cd->pin_ev[k], cudaEventDisableTiming), "creating an event");
  if (s == 0 && !(cd->state = ampc__cu_alloc(d, sizeof(ampc__cu_state))))
    s = ampc__error(AMPC_ENOMEM, "cuda: out of device memory");
  if (s == 0) s = ampc__cu_finish(d);
#undef CREATE_TRY
  if (s < 0) {
    cu_destroy(d);
    d->impl = NULL;
  }
  return s;
}

static void cu_destroy(ampc__device *d) {
  ampc__cuda_dev *cd = ampc__cu_of(d);
  if (!cd) return;
  cudaSetDevice(cd->dev);
  if (cd->stream) cudaStreamSynchronize(cd->stream);
  ampc__cu_graphs_free(d);
  ampc__cu_conv_free_all(d);
  if (cd->dnn) cudnnDestroy(cd->dnn);
  const ampc__cu_blas_api *b = NULL;
  if (cd->blas && ampc__cu_blas_api_get(&b) == AMPC_OK) b->destroy(cd->blas);
  for (size_t i = 0; i < cd->ntimings; i++)
    for (int k = 0; k < 3; k++)
      if (cd->timings[i].ev[k]) cudaEventDestroy(cd->timings[i].ev[k]);
  free(cd->timings);
  for (int k = 0; k < 2; k++)
    if (cd->pin_ev[k]) cudaEventDestroy(cd->pin_ev[k]);
  if (cd->pin[0]) cudaFreeHost(cd->pin[0]);
  for (size_t i = 0; i < cd->nblocks; i++) cudaFree(cd->blocks[i].p);
  free(cd->blocks);
  if (cd->stream) cudaStreamDestroy(cd->stream);
  cudaGetLastError();
  free(cd);
}

/* ---- profiling: events around each kernel call, added up when read ---- */

cudaEvent_t ampc__cu_timing_event(ampc__device *d, int k) {
  ampc__cuda_dev *cd = ampc__cu_of(d);
  if (!d->opts.profiling || !cd->used_timings) return NULL;
  return cd->timings[cd->used_timings - 1].ev[k];
}

static ampc__cu_timing *timing_begin(ampc__device *d, int op, int backward) {
  ampc__cuda_dev *cd = ampc__cu_of(d);
  if (cd->used_timings == cd->ntimings) {
    if (cd->ntimings == cd->cap_timings) {
      size_t cap = cd->cap_timings ? 2 * cd->cap_timings : 256;
      ampc__cu_timing *t = realloc(cd->timings, cap * sizeof *t);
      if (!t) return NULL;
      cd->timings = t;
      cd->cap_timings = cap;
    }
    ampc__cu_timing *t = &cd->timings[cd->ntimings];
    memset(t, 0, sizeof *t);
    for (int k = 0; k < 3; k++)
      if (cudaEventCreate(&t->ev[k]) != cudaSuccess) {
        cudaGetLastError();
        for (int j = 0; j < k; j++) cudaEventDestroy(t->ev[j]);
        return NULL;
      }
    cd->ntimings++;
  }
  ampc__cu_timing *t = &cd->timings[cd->used_timings++];
  t->op = op;
  t->backward = backward;
  /* a call that records no middle point gets it at its end (see timing_end) */
  cudaEventRecord(t->ev[0], cd->stream);
  cudaEventRecord(t->ev[1], cd->stream);
  return t;
}

/* (op -1: the step's passes) */
ampc__cu_timing *ampc__cu_step_timing_begin(ampc__device *d) {
  return d->opts.profiling ? timing_begin(d, -1, 0) : NULL;
}
void ampc__cu_step_timing_end(ampc__device *d, ampc__cu_timing *t) {
  if (t) cudaEventRecord(t->ev[2], ampc__cu_of(d)->stream);
}

/* Adds up the recorded times (waits for the stream). */
static void timings_collect(ampc__device *d) {
  ampc__cuda_dev *cd = ampc__cu_of(d);
  if (!cd->used_timings) return;
  cudaStreamSynchronize(cd->stream);
  for (size_t i = 0; i < cd->used_timings; i++) {
    ampc__cu_timing *t = &cd->timings[i];
    float a = 0.0f, b = 0.0f;
    cudaEventElapsedTime(&a, t->ev[0], t->ev[1]);
    cudaEventElapsedTime(&b, t->ev[1], t->ev[2]);
    double secs = ((double)a + (double)b) * 1e-3;
    if (t->op < 0) {
      cd->t_step += secs;
      continue;
    }
    (t->backward ? cd->t_bwd : cd->t_fwd)[t->op] += secs;
    if (t->backward && t->op == AMPC_OP_CONV2D) {
      cd->t_conv[0] += (double)a * 1e-3;
      cd->t_conv[1] += (double)b * 1e-3;
    }
  }
  cudaGetLastError();
  cd->used_timings = 0;
}

static ampc_status cu_run(ampc__device *d, const ampc__op_call *c, int backward) {
  ampc__cuda_dev *cd = ampc__cu_of(d);
  cudaSetDevice(cd->dev);
  ampc_status st;
  if (ampc__cu_graph_defer(d, c, backward, &st)) return st;
  AMPC_TRY(st);
  ampc__cu_timing *t = NULL;
  if (d->opts.profiling) {
    if (cd->used_timings >= 1 << 16) timings_collect(d);
    t = timing_begin(d, c->op, backward);
  }
  ampc_status s = ampc__cu_run(d, c, backward);
  if (t) {
    /* a conv backward records its middle point itself; elsewhere the
     * middle is the start */
    cudaEventRecord(t->ev[2], cd->stream);
  }
  return s;
}

static void cu_stats(ampc__device *d, ampc_backend_stats *out, int reset) {
  ampc__cuda_dev *cd = ampc__cu_of(d);
  cudaSetDevice(cd->dev);
  (void)ampc__cu_graph_flush(d);
  timings_collect(d);
  memcpy(out->fwd, cd->t_fwd, sizeof out->fwd);
  memcpy(out->bwd, cd->t_bwd, sizeof out->bwd);
  out->conv_bwd_data = cd->t_conv[0];
  out->conv_bwd_weights = cd->t_conv[1];
  out->step = cd->t_step;
  if (ampc__cu_finish(d) == 0) {
    out->grad_values = (int64_t)state_host(cd)->cnt[0];
    out->grad_underflow = (int64_t)state_host(cd)->cnt[1];
  }
  out->mem_reserved = cd->reserved;
  out->mem_reserved_peak = cd->reserved_peak;
  out->mem_in_use_peak = cd->in_use_peak;
  if (reset & AMPC__STATS_TIMES) {
    memset(cd->t_fwd, 0, sizeof cd->t_fwd);
    memset(cd->t_bwd, 0, sizeof cd->t_bwd);
    memset(cd->t_conv, 0, sizeof cd->t_conv);
    cd->t_step = 0.0;
  }
  if (reset & AMPC__STATS_GRADS) cudaMemsetAsync(cd->state->cnt, 0, sizeof cd->state->cnt, cd->stream);
}

const ampc__backend ampc__backend_cuda = {
    .name = "cuda",
    .host_memory = 0,
    .create = cu_create,
    .destroy = cu_destroy,
    .alloc = cu_alloc,
    .free = cu_free,
    .write = cu_write,
    .read = cu_read,
    .copy = cu_copy,
    .set = cu_set,
    .synchronize = cu_synchronize,
    .capacity = cu_capacity,
    .supports = ampc__cu_supports,
    .run = cu_run,
    .workspace = ampc__cu_workspace,
    .aux_floats = ampc__cu_aux_floats,
    .check = ampc__cu_check_pass,
    .fold = ampc__cu_fold_pass,
    .nonfinite = ampc__cu_nonfinite_pass,
    .update = ampc__cu_update_pass,
    .stats = cu_stats,
    .notes = ampc__cu_conv_notes,
};
