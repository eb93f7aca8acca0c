/* The CPU backend: the kernel table, memory, and workspace sizing. */
#include <stdlib.h>
#include <sys/mman.h>

#include "backend/cpu/cpu_internal.h"

/* Zeroed, 64-byte aligned memory. Large blocks are fresh anonymous pages:
 * zero without being written, so that they become resident only as the
 * kernels first touch them (an arena sized for the largest batch costs what
 * is used). Two words before the block say how it was made. */
enum { CPU_MMAP_MIN = 1 << 20, CPU_PAGE = 4096 };

static void *cpu_alloc(size_t bytes) {
  size_t n = (bytes + 63) & ~(size_t)63;
  if (!n) n = 64;
  if (n >= CPU_MMAP_MIN) {
    char *m = mmap(NULL, n + CPU_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return NULL;
    size_t *h = (size_t *)(m + CPU_PAGE) - 2;
    h[0] = n + CPU_PAGE;
    h[1] = 1;
    return m + CPU_PAGE;
  }
  char *p = aligned_alloc(64, n + 64);
  if (!p) return NULL;
  memset(p + 64, 0, n);
  size_t *h = (size_t *)(p + 64) - 2;
  h[0] = 0;
  h[1] = 0;
  return p + 64;
}

static void cpu_free(void *q) {
  if (!q) return;
  size_t *h = (size_t *)q - 2;
  if (h[1]) munmap((char *)q - CPU_PAGE, h[0]);
  else free((char *)q - 64);
}

static size_t cpu_elt_ws(const ampc__op_call *c, int nthreads) {
  /* element-wise kernels stage blocks of CPU_CHUNK floats, up to 4 per thread */
  return (size_t)nthreads * 4 * CPU_CHUNK * sizeof(float);
}

static size_t cpu_workspace(const ampc__op_call *c, int nthreads) {
  switch (c->op) {
    case AMPC_OP_CONV2D: return ampc__cpu_conv2d_ws(c, nthreads);
    case AMPC_OP_LINEAR: return ampc__cpu_linear_ws(c, nthreads);
    case AMPC_OP_BATCHNORM2D: return ampc__cpu_bn_ws(c, nthreads);
    case AMPC_OP_MAXPOOL2D:
    case AMPC_OP_AVGPOOL2D:
    case AMPC_OP_GLOBAL_AVGPOOL: return ampc__cpu_pool_ws(c, nthreads);
    case AMPC_OP_SOFTMAX:
    case AMPC_OP_LOG_SOFTMAX:
    case AMPC_OP_CROSS_ENTROPY: return ampc__cpu_rows_ws(c, nthreads);
    default: return cpu_elt_ws(c, nthreads);
  }
}

static size_t cpu_aux_floats(const ampc__op_call *c) {
  if (c->op == AMPC_OP_BATCHNORM2D) return ampc__cpu_bn_aux_floats(c);
  return 0;
}

static ampc_status cpu_noop(const ampc__op_call *c) { return AMPC_OK; }

static const ampc__backend cpu_backend = {
    .name = "cpu",
    .fwd =
        {
            [AMPC_OP_INPUT] = cpu_noop, [AMPC_OP_LABELS] = cpu_noop, [AMPC_OP_PARAM] = cpu_noop,
            [AMPC_OP_BUFFER] = cpu_noop, [AMPC_OP_FLATTEN] = cpu_noop,
            [AMPC_OP_CONV2D] = ampc__cpu_conv2d_fwd, [AMPC_OP_BATCHNORM2D] = ampc__cpu_bn_fwd,
            [AMPC_OP_RELU] = ampc__cpu_relu_fwd, [AMPC_OP_MAXPOOL2D] = ampc__cpu_pool_fwd,
            [AMPC_OP_AVGPOOL2D] = ampc__cpu_pool_fwd, [AMPC_OP_GLOBAL_AVGPOOL] = ampc__cpu_gap_fwd,
            [AMPC_OP_LINEAR] = ampc__cpu_linear_fwd, [AMPC_OP_ADD] = ampc__cpu_add_fwd,
            [AMPC_OP_SOFTMAX] = ampc__cpu_softmax_fwd, [AMPC_OP_LOG_SOFTMAX] = ampc__cpu_softmax_fwd,
            [AMPC_OP_CROSS_ENTROPY] = ampc__cpu_ce_fwd, [AMPC_OP_CAST] = ampc__cpu_cast_fwd,
        },
    .bwd =
        {
            [AMPC_OP_INPUT] = cpu_noop, [AMPC_OP_LABELS] = cpu_noop, [AMPC_OP_PARAM] = cpu_noop,
            [AMPC_OP_BUFFER] = cpu_noop, [AMPC_OP_FLATTEN] = cpu_noop,
            [AMPC_OP_CONV2D] = ampc__cpu_conv2d_bwd, [AMPC_OP_BATCHNORM2D] = ampc__cpu_bn_bwd,
            [AMPC_OP_RELU] = ampc__cpu_relu_bwd, [AMPC_OP_MAXPOOL2D] = ampc__cpu_pool_bwd,
            [AMPC_OP_AVGPOOL2D] = ampc__cpu_pool_bwd, [AMPC_OP_GLOBAL_AVGPOOL] = ampc__cpu_gap_bwd,
            [AMPC_OP_LINEAR] = ampc__cpu_linear_bwd, [AMPC_OP_ADD] = ampc__cpu_add_bwd,
            [AMPC_OP_SOFTMAX] = ampc__cpu_softmax_bwd, [AMPC_OP_LOG_SOFTMAX] = ampc__cpu_softmax_bwd,
            [AMPC_OP_CROSS_ENTROPY] = ampc__cpu_ce_bwd, [AMPC_OP_CAST] = ampc__cpu_cast_bwd,
        },
    .workspace = cpu_workspace,
    .aux_floats = cpu_aux_floats,
    .alloc = cpu_alloc,
    .free = cpu_free,
};

const ampc__backend *ampc__backend_cpu(void) { return &cpu_backend; }
