/* The cpu backend: host memory, the kernel table, workspace sizing, and the
 * device calls every backend has. */
#include <cblas.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "backend/cpu/cpu_internal.h"
#include "core/cgroup_internal.h"
#include "core/dtype_internal.h"

/* ---- memory ---- */

/* Zeroed, 64-byte aligned memory. Large blocks are fresh anonymous pages:
 * zero without being written, so that they become resident only as the
 * kernels first touch them (an arena sized for the largest batch costs what
 * is used). Two words before the block say how it was made. Blocks of 2 MB
 * and more ask for transparent huge pages (where the kernel's setting is
 * "madvise", as Debian's is; a hint, ignored where THP is off): the cnn's
 * step touches about 25 MB of arenas, more than the 4 KB pages the L2 TLB
 * maps (12 MB on a Zen 4): with them it ran more images/s in 12 of 14
 * alternating `ampc bench` pairs in a busy spell (median ratio 1.06), in 3
 * of 6 in a quiet one (0.99-1.11, median 1.01); ResNet-18's speed and peak
 * RSS unchanged. */
enum { CPU_MMAP_MIN = 1 << 20, CPU_PAGE = 4096, CPU_HUGE_MIN = 2 << 20 };

/* Where the process's control group limits its memory, the blocks a device
 * holds may not add up past it: the allocation that would fails (its caller
 * then says what it was for), where the kernel would kill the process as the
 * pages are touched (the graph's plan is checked against the same limit as
 * a whole, see cpu_capacity; the amp and optimizer state come after it). */
static int cpu_reserve(ampc__device *d, size_t n) {
  ampc__cpu_dev *cd = d ? d->impl : NULL;
  if (!cd) return 1;
  uint64_t now = __atomic_add_fetch(&cd->reserved, (uint64_t)n, __ATOMIC_RELAXED);
  if (!cd->mem_limit || now <= cd->mem_limit) return 1;
  __atomic_sub_fetch(&cd->reserved, (uint64_t)n, __ATOMIC_RELAXED);
  return 0;
}
static void cpu_unreserve(ampc__device *d, size_t n) {
  ampc__cpu_dev *cd = d ? d->impl : NULL;
  if (cd) __atomic_sub_fetch(&cd->reserved, (uint64_t)n, __ATOMIC_RELAXED);
}

static void *cpu_alloc(ampc__device *d, size_t bytes) {
  size_t n = (bytes + 63) & ~(size_t)63;
  if (!n) n = 64;
  if (!cpu_reserve(d, n)) return NULL;
  if (n >= CPU_MMAP_MIN) {
    char *m = mmap(NULL, n + CPU_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) {
      cpu_unreserve(d, n);
      return NULL;
    }
#ifdef MADV_HUGEPAGE
    if (n >= CPU_HUGE_MIN) (void)madvise(m, n + CPU_PAGE, MADV_HUGEPAGE);
#endif
    size_t *h = (size_t *)(m + CPU_PAGE) - 2;
    h[0] = n + CPU_PAGE;
    h[1] = 1;
    return m + CPU_PAGE;
  }
  char *p = aligned_alloc(64, n + 64);
  if (!p) {
    cpu_unreserve(d, n);
    return NULL;
  }
  memset(p + 64, 0, n);
  size_t *h = (size_t *)(p + 64) - 2;
  h[0] = n;
  h[1] = 0;
  return p + 64;
}

static void cpu_free(ampc__device *d, void *q) {
  if (!q) return;
  size_t *h = (size_t *)q - 2;
  cpu_unreserve(d, h[1] ? h[0] - CPU_PAGE : h[0]);
  if (h[1]) munmap((char *)q - CPU_PAGE, h[0]);
  else free((char *)q - 64);
}

static int is_int(ampc_dtype t) { return t == AMPC_DTYPE_I32 || t == AMPC_DTYPE_I64; }

/* n elements from src (st) to dst (dt): between float types, or i32/i64. */
static ampc_status cpu_convert(void *dst, ampc_dtype dt, const void *src, ampc_dtype st, size_t n) {
  if (dt == st) {
    memcpy(dst, src, n * ampc_dtype_size(dt));
    return AMPC_OK;
  }
  if (is_int(dt) && is_int(st)) {
    if (dt == AMPC_DTYPE_I64)
      for (size_t i = 0; i < n; i++) ((int64_t *)dst)[i] = ((const int32_t *)src)[i];
    else
      for (size_t i = 0; i < n; i++) {
        int64_t v = ((const int64_t *)src)[i];
        if (v < INT32_MIN || v > INT32_MAX) return ampc__error(AMPC_ERANGE, "cpu: i64 value %lld does not fit i32", (long long)v);
        ((int32_t *)dst)[i] = (int32_t)v;
      }
    return AMPC_OK;
  }
  return ampc_convert(dt, dst, st, src, n);
}

static ampc_status cpu_write(ampc__device *d, void *dst, ampc_dtype dt, const void *src, ampc_dtype st, size_t n) {
  return cpu_convert(dst, dt, src, st, n);
}
static ampc_status cpu_read(ampc__device *d, void *dst, ampc_dtype dt, const void *src, ampc_dtype st, size_t n) {
  return cpu_convert(dst, dt, src, st, n);
}
static ampc_status cpu_copy(ampc__device *d, void *dst, const void *src, size_t bytes) {
  memmove(dst, src, bytes);
  return AMPC_OK;
}
static ampc_status cpu_set(ampc__device *d, void *dst, int byte, size_t bytes) {
  memset(dst, byte, bytes);
  return AMPC_OK;
}
static ampc_status cpu_synchronize(ampc__device *d) { return AMPC_OK; }
/* The machine's memory, or less where the process's control group limits
 * it (a container's): a plan past the limit is an error at compile, not a
 * process the kernel kills as it first touches the pages (ResNet-18 O2 under
 * a 300 MB limit: killed, exit status 137, no message). */
static uint64_t cpu_capacity(ampc__device *d) {
  const ampc__cpu_dev *cd = d->impl;
  long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGE_SIZE);
  uint64_t phys = pages > 0 && size > 0 ? (uint64_t)pages * (uint64_t)size : 0, limit = cd->mem_limit;
  return limit && (!phys || limit < phys) ? limit : phys;
}

/* ---- the device ---- */

/* OpenBLAS's buffers (ampc__blas_room): where the process's address space
 * or data segment is limited, a device first makes sure that one for each of
 * its threads fits, then has OpenBLAS take them -- one product of 128 x 128
 * (past its small-matrix path, which takes none) on each thread -- before
 * the plan's memory is asked for: a limit too low is then an error, not a
 * hang in the first product, and one the plan does not fit the plan's own
 * "out of memory". OpenBLAS keeps the buffers for later products: the
 * process's devices count how many threads have had theirs, and only more
 * threads than that ask for more. */
enum { CPU_BLAS_WARM = 128 };
static int cpu_blas_warmed;

static ampc_status cpu_blas_buffers(int threads) {
  int warmed = __atomic_load_n(&cpu_blas_warmed, __ATOMIC_ACQUIRE);
  if (!ampc__mem_limited() || threads <= warmed) return AMPC_OK;
  char what[64];
  snprintf(what, sizeof what, "the products on %d thread%s", threads, threads == 1 ? "" : "s");
  ampc_status s = ampc__blas_room(threads - warmed, what);
  if (s < 0) return s;
  /* the operands from this thread (a thread's first allocation would make
   * it an arena of its own, 64 MB more of the address space) */
  enum { W = CPU_BLAS_WARM };
  float *m = calloc((2 + (size_t)threads) * W * W, sizeof *m);
  if (!m) return ampc__error(AMPC_ENOMEM, "out of memory");
#pragma omp parallel num_threads(threads)
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, W, W, W, 1.0f, m, W, m + W * W, W, 0.0f,
              m + (2 + (size_t)omp_get_thread_num()) * W * W, W);
  free(m);
  /* (the most any device has warmed; two at once may both warm) */
  while (warmed < threads && !__atomic_compare_exchange_n(&cpu_blas_warmed, &warmed, threads, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
  }
  return AMPC_OK;
}

static ampc_status cpu_create(ampc__device *d) {
  ampc__cpu_dev *cd = calloc(1, sizeof *cd);
  if (!cd) return ampc__error(AMPC_ENOMEM, "out of memory");
  if (d->opts.threads <= 0) d->opts.threads = omp_get_max_threads();
  /* (the products run on the device's threads, one buffer each; OpenBLAS's
   * own threads have theirs from its start or openblas_set_num_threads) */
  ampc_status bs = cpu_blas_buffers(d->opts.threads);
  if (bs < 0) {
    free(cd);
    return bs;
  }
  cd->mem_limit = ampc__cgroup_memory(); /* read once: capacity and the blocks' check */
  cd->ctx.nthreads = d->opts.threads;
  cd->ctx.conv_algo = d->opts.conv;
  cd->isa = ampc__cpu_isa_best();
  cd->ctx.isa = cd->isa;
  cd->scratch = malloc(ampc__cpu_scratch_floats(d->opts.threads) * sizeof(float));
  if (!cd->scratch) {
    free(cd);
    return ampc__error(AMPC_ENOMEM, "out of memory");
  }
  d->impl = cd;
  return AMPC_OK;
}

static void cpu_destroy(ampc__device *d) {
  ampc__cpu_dev *cd = d->impl;
  if (!cd) return;
  free(cd->scratch);
  free(cd->partial);
  free(cd);
}

void ampc__cpu_set_isa(ampc__device *d, const ampc__cpu_isa *isa) {
  AMPC_ASSERT(isa != NULL);
  ampc__cpu_dev *cd = ampc__cpu_device_of(d)->impl;
  cd->isa = isa;
  cd->ctx.isa = isa;
}

static void cpu_stats(ampc__device *d, ampc_backend_stats *out, int reset) {
  ampc__cpu_dev *cd = d->impl;
  memcpy(out->fwd, cd->t_fwd, sizeof out->fwd);
  memcpy(out->bwd, cd->t_bwd, sizeof out->bwd);
  out->conv_bwd_data = cd->t_conv[0];
  out->conv_bwd_weights = cd->t_conv[1];
  out->grad_values = cd->grad_stats[0];
  out->grad_underflow = cd->grad_stats[1];
  if (reset & AMPC__STATS_TIMES) {
    memset(cd->t_fwd, 0, sizeof cd->t_fwd);
    memset(cd->t_bwd, 0, sizeof cd->t_bwd);
    memset(cd->t_conv, 0, sizeof cd->t_conv);
  }
  if (reset & AMPC__STATS_GRADS) memset(cd->grad_stats, 0, sizeof cd->grad_stats);
}

/* ---- ops ---- */

static ampc_status cpu_noop(const ampc__op_call *c) { return AMPC_OK; }

typedef ampc_status (*cpu_kernel)(const ampc__op_call *c);

static const cpu_kernel cpu_fwd[AMPC_OP_COUNT] = {
    [AMPC_OP_INPUT] = cpu_noop, [AMPC_OP_LABELS] = cpu_noop, [AMPC_OP_PARAM] = cpu_noop,
    [AMPC_OP_BUFFER] = cpu_noop, [AMPC_OP_FLATTEN] = cpu_noop,
    [AMPC_OP_CONV2D] = ampc__cpu_conv2d_fwd, [AMPC_OP_BATCHNORM2D] = ampc__cpu_bn_fwd,
    [AMPC_OP_RELU] = ampc__cpu_relu_fwd, [AMPC_OP_MAXPOOL2D] = ampc__cpu_pool_fwd,
    [AMPC_OP_AVGPOOL2D] = ampc__cpu_pool_fwd, [AMPC_OP_GLOBAL_AVGPOOL] = ampc__cpu_gap_fwd,
    [AMPC_OP_LINEAR] = ampc__cpu_linear_fwd, [AMPC_OP_ADD] = ampc__cpu_add_fwd,
    [AMPC_OP_SOFTMAX] = ampc__cpu_softmax_fwd, [AMPC_OP_LOG_SOFTMAX] = ampc__cpu_softmax_fwd,
    [AMPC_OP_CROSS_ENTROPY] = ampc__cpu_ce_fwd, [AMPC_OP_CAST] = ampc__cpu_cast_fwd,
};

static const cpu_kernel cpu_bwd[AMPC_OP_COUNT] = {
    [AMPC_OP_INPUT] = cpu_noop, [AMPC_OP_LABELS] = cpu_noop, [AMPC_OP_PARAM] = cpu_noop,
    [AMPC_OP_BUFFER] = cpu_noop, [AMPC_OP_FLATTEN] = cpu_noop,
    [AMPC_OP_CONV2D] = ampc__cpu_conv2d_bwd, [AMPC_OP_BATCHNORM2D] = ampc__cpu_bn_bwd,
    [AMPC_OP_RELU] = ampc__cpu_relu_bwd, [AMPC_OP_MAXPOOL2D] = ampc__cpu_pool_bwd,
    [AMPC_OP_AVGPOOL2D] = ampc__cpu_pool_bwd, [AMPC_OP_GLOBAL_AVGPOOL] = ampc__cpu_gap_bwd,
    [AMPC_OP_LINEAR] = ampc__cpu_linear_bwd, [AMPC_OP_ADD] = ampc__cpu_add_bwd,
    [AMPC_OP_SOFTMAX] = ampc__cpu_softmax_bwd, [AMPC_OP_LOG_SOFTMAX] = ampc__cpu_softmax_bwd,
    [AMPC_OP_CROSS_ENTROPY] = ampc__cpu_ce_bwd, [AMPC_OP_CAST] = ampc__cpu_cast_bwd,
};

static int cpu_supports(const ampc__device *d, ampc_op_kind op, ampc_dtype t) {
  if ((unsigned)op >= AMPC_OP_COUNT || !cpu_fwd[op]) return 0;
  switch (op) {
    case AMPC_OP_LABELS: return t == AMPC_DTYPE_I32;
    case AMPC_OP_BUFFER: return t == AMPC_DTYPE_F32 || t == AMPC_DTYPE_I64;
    default: return t == AMPC_DTYPE_F32 || t == AMPC_DTYPE_F16 || t == AMPC_DTYPE_BF16;
  }
}

static ampc_status cpu_run(ampc__device *d, const ampc__op_call *call, int backward) {
  ampc__cpu_dev *cd = d->impl;
  ampc__op_call c = *call;
  ampc__cpu_ctx ctx = cd->ctx;
  ctx.timers = d->opts.profiling && backward ? cd->t_conv : NULL;
  ctx.grad_stats = backward && d->count_underflow ? cd->grad_stats : NULL;
  c.ctx = &ctx;
  cpu_kernel f = backward ? cpu_bwd[c.op] : cpu_fwd[c.op];
  AMPC_ASSERT(f != NULL);
  /* OpenBLAS's threaded sgemm asks for omp_get_max_threads() threads and
   * waits for every one: where a team comes smaller, with dynamic teams
   * (OMP_DYNAMIC=true; libgomp gives fewer the busier the machine) or a
   * thread limit below that count (OMP_THREAD_LIMIT), the wait never ends (a
   * hang, seen on a 2-core machine). So each op runs with whole teams of at
   * most the limit; the caller's settings are back on return. */
  int dyn = omp_get_dynamic(), most = omp_get_max_threads(), limit = omp_get_thread_limit();
  if (dyn) omp_set_dynamic(0);
  if (limit > 0 && most > limit) omp_set_num_threads(limit);
  double t0 = d->opts.profiling ? omp_get_wtime() : 0.0;
  ampc_status s = f(&c);
  if (d->opts.profiling) (backward ? cd->t_bwd : cd->t_fwd)[c.op] += omp_get_wtime() - t0;
  if (limit > 0 && most > limit) omp_set_num_threads(most);
  if (dyn) omp_set_dynamic(1);
  return s;
}

static size_t cpu_elt_ws(const ampc__op_call *c, int nthreads) {
  /* element-wise kernels stage blocks of CPU_CHUNK floats, up to 4 per thread */
  return (size_t)nthreads * 4 * CPU_CHUNK * sizeof(float);
}

static size_t cpu_workspace(ampc__device *d, const ampc__op_call *call) {
  ampc__cpu_dev *cd = d->impl;
  ampc__op_call c = *call;
  c.ctx = &cd->ctx;
  int nt = cd->ctx.nthreads;
  switch (c.op) {
    case AMPC_OP_CONV2D: return ampc__cpu_conv2d_ws(&c, nt);
    case AMPC_OP_LINEAR: return ampc__cpu_linear_ws(&c, nt);
    case AMPC_OP_BATCHNORM2D: return ampc__cpu_bn_ws(&c, nt);
    case AMPC_OP_MAXPOOL2D:
    case AMPC_OP_AVGPOOL2D:
    case AMPC_OP_GLOBAL_AVGPOOL: return ampc__cpu_pool_ws(&c, nt);
    case AMPC_OP_SOFTMAX:
    case AMPC_OP_LOG_SOFTMAX:
    case AMPC_OP_CROSS_ENTROPY: return ampc__cpu_rows_ws(&c, nt);
    default: return cpu_elt_ws(&c, nt);
  }
}

static size_t cpu_aux_floats(ampc__device *d, const ampc__op_call *c) {
  if (c->op == AMPC_OP_BATCHNORM2D) return ampc__cpu_bn_aux_floats(c);
  return 0;
}

const ampc__backend ampc__backend_cpu = {
    .name = "cpu",
    .host_memory = 1,
    .sync_batchnorm = 1,
    .conv_prologue = 1,
    .create = cpu_create,
    .destroy = cpu_destroy,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .write = cpu_write,
    .read = cpu_read,
    .copy = cpu_copy,
    .set = cpu_set,
    .synchronize = cpu_synchronize,
    .capacity = cpu_capacity,
    .supports = cpu_supports,
    .run = cpu_run,
    .workspace = cpu_workspace,
    .aux_floats = cpu_aux_floats,
    .check = ampc__cpu_check,
    .fold = ampc__cpu_fold,
    .nonfinite = ampc__cpu_nonfinite,
    .update = ampc__cpu_update,
    .stats = cpu_stats,
};
