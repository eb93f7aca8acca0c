/* The graph's ops on the cuda backend: each op call unpacked into a kernel
 * launch (cuda_kernels.h), cuBLAS (cuda_linear.c) or cuDNN (cuda_conv.c);
 * which ops and types it runs; the workspace and saved state each needs. */
#include <string.h>

#include "backend/cuda/cuda_internal.h"

static int64_t numel(const ampc_tensor *t) { return ampc_tensor_numel(t); }

static ampc_status launched(int e, const ampc__op_call *c, int backward) {
  if (e) return ampc__cu_error_rt(e, backward ? "launching a backward kernel" : "launching a kernel");
  (void)c;
  return AMPC_OK;
}

/* ---- batch norm ---- */

/* mean, invstd (C each), the mode, then with a fused pool one byte per
 * pooled value: each window's winner -- the cpu's layout */
static size_t bn_aux_floats(const ampc__op_call *c) {
  size_t n = 2 * (size_t)c->in[0].shape.d[1] + 1;
  if (c->attr.pool) n += ((size_t)ampc_shape_numel(&c->out.shape) + 3) / 4;
  return n;
}

static ampc__cu_bn bn_params(ampc__device *d, const ampc__op_call *c, int backward) {
  const ampc_shape *s = &c->in[0].shape;
  ampc__cu_bn p;
  memset(&p, 0, sizeof p);
  p.x = c->in[0].data;
  p.xt = c->in[0].dtype;
  p.gamma = c->in[1].data;
  p.gt = c->in[1].dtype;
  p.beta = c->in[2].data;
  p.bt = c->in[2].dtype;
  p.rm = c->in[3].data;
  p.rv = c->in[4].data;
  p.nbt = c->n_in > 5 ? c->in[5].data : NULL;
  p.y = c->out.data;
  p.yt = c->out.dtype;
  p.dy = c->dout.data;
  p.dyt = c->dout.dtype;
  p.dx = c->din[0].data;
  p.dxt = c->din[0].dtype;
  p.dx_acc = c->din_acc[0];
  p.dgamma = c->din[1].data;
  p.dgt = c->din[1].dtype;
  p.dg_acc = c->din_acc[1];
  p.dbeta = c->din[2].data;
  p.dbt_ = c->din[2].dtype;
  p.db_acc = c->din_acc[2];
  p.aux = c->aux;
  p.N = s->d[0];
  p.C = s->d[1];
  p.H = s->d[2];
  p.W = s->d[3];
  p.momentum = c->attr.momentum;
  p.eps = c->attr.eps;
  p.training = c->training;
  p.relu = c->attr.relu;
  p.pool = c->attr.pool;
  p.ws = c->ws;
  p.cnt = ampc__cu_counters(d, backward);
  return p;
}

static ampc_status bn_run(ampc__device *d, const ampc__op_call *c, int backward) {
  ampc__cu_bn p = bn_params(d, c, backward);
  cudaStream_t st = ampc__cu_of(d)->stream;
  if (ampc__cu_bn_ws(p.N, p.C, p.H * p.W) > c->ws_size)
    return ampc__error(AMPC_EINVAL, "batchnorm2d: the workspace (%zu bytes) is smaller than the batch needs", c->ws_size);
  if (c->sync && c->training) return ampc__error(AMPC_EUNSUPPORTED, "batchnorm2d: SyncBatchNorm is not implemented on cuda");
  if (backward) return launched(ampc__cu_bn_bwd(st, &p), c, 1);
  if (c->attr.pool && (c->out.shape.d[2] != p.H / 2 || c->out.shape.d[3] != p.W / 2))
    return ampc__error(AMPC_EINVAL, "batchnorm2d: a fused pool's output must be half the input's size");
  if (c->training && p.N * p.H * p.W < 2)
    return ampc__error(AMPC_EINVAL, "batchnorm2d: training needs more than one value per channel (got %lld)",
                       (long long)(p.N * p.H * p.W));
  return launched(ampc__cu_bn_fwd(st, &p), c, 0);
}

/* ---- pools ---- */

static ampc_status pool_run(ampc__device *d, const ampc__op_call *c, int backward) {
  const ampc_shape *xs = &c->in[0].shape, *ys = &c->out.shape;
  cudaStream_t st = ampc__cu_of(d)->stream;
  int64_t planes = xs->d[0] * xs->d[1];
  if (c->op == AMPC_OP_GLOBAL_AVGPOOL) {
    int64_t HW = xs->d[2] * xs->d[3];
    if (!backward) return launched(ampc__cu_gap_fwd(st, c->in[0].data, c->in[0].dtype, c->out.data, c->out.dtype, planes, HW), c, 0);
    if (!c->din[0].data) return AMPC_OK;
    return launched(ampc__cu_gap_bwd(st, c->dout.data, c->dout.dtype, c->din[0].data, c->din[0].dtype, c->din_acc[0], planes,
                                     HW, ampc__cu_counters(d, 1)),
                    c, 1);
  }
  int is_max = c->op == AMPC_OP_MAXPOOL2D;
  if (!backward)
    return launched(ampc__cu_pool_fwd(st, c->in[0].data, c->in[0].dtype, c->out.data, c->out.dtype, planes, xs->d[2],
                                      xs->d[3], ys->d[2], ys->d[3], c->attr.k, c->attr.stride, c->attr.pad, is_max),
                    c, 0);
  if (!c->din[0].data) return AMPC_OK;
  return launched(ampc__cu_pool_bwd(st, c->in[0].data, c->in[0].dtype, c->dout.data, c->dout.dtype, c->din[0].data,
                                    c->din[0].dtype, c->din_acc[0], planes, xs->d[2], xs->d[3], ys->d[2], ys->d[3],
                                    c->attr.k, c->attr.stride, c->attr.pad, is_max, ampc__cu_counters(d, 1)),
                  c, 1);
}

/* ---- rows ---- */

static ampc_status rows_run(ampc__device *d, const ampc__op_call *c, int backward) {
  cudaStream_t st = ampc__cu_of(d)->stream;
  int64_t N = c->in[0].shape.d[0], K = c->in[0].shape.d[1];
  const ampc_tensor *x = &c->in[0];
  if (c->op == AMPC_OP_CROSS_ENTROPY) {
    if (!backward) {
      if ((size_t)N * sizeof(float) > c->ws_size)
        return ampc__error(AMPC_EINVAL, "cross_entropy: the workspace is smaller than the batch needs");
      return launched(ampc__cu_ce_fwd(st, x->data, x->dtype, c->in[1].data, c->out.data, c->out.dtype, N, K,
                                      c->attr.label_smoothing, c->ws, &ampc__cu_of(d)->state->err),
                      c, 0);
    }
    return launched(ampc__cu_ce_bwd(st, x->data, x->dtype, c->in[1].data, c->din[0].data, c->din[0].dtype, c->din_acc[0], N,
                                    K, c->attr.label_smoothing, c->seed, ampc__cu_counters(d, 1)),
                    c, 1);
  }
  int is_log = c->op == AMPC_OP_LOG_SOFTMAX;
  if (!backward) return launched(ampc__cu_softmax_fwd(st, x->data, x->dtype, c->out.data, c->out.dtype, N, K, is_log), c, 0);
  return launched(ampc__cu_softmax_bwd(st, c->out.data, c->out.dtype, c->dout.data, c->dout.dtype, c->din[0].data,
                                       c->din[0].dtype, c->din_acc[0], N, K, is_log, ampc__cu_counters(d, 1)),
                  c, 1);
}

/* ---- element-wise ---- */

static ampc_status eltwise_run(ampc__device *d, const ampc__op_call *c, int backward) {
  cudaStream_t st = ampc__cu_of(d)->stream;
  size_t n = (size_t)numel(&c->out);
  const ampc_tensor *x = &c->in[0], *y = &c->out, *dy = &c->dout, *dx = &c->din[0];
  ampc__cu_count *cnt = ampc__cu_counters(d, backward);
  switch (c->op) {
    case AMPC_OP_RELU:
      if (!backward) return launched(ampc__cu_relu(st, x->data, x->dtype, y->data, y->dtype, n), c, 0);
      if (!dx->data) return AMPC_OK;
      return launched(ampc__cu_grad_pass(st, y->data, y->dtype, dy->data, dy->dtype, dx->data, dx->dtype, c->din_acc[0], n, cnt),
                      c, 1);
    case AMPC_OP_CAST:
      if (!backward) return launched(ampc__cu_convert(st, y->data, y->dtype, x->data, x->dtype, n), c, 0);
      if (!dx->data) return AMPC_OK;
      return launched(ampc__cu_grad_pass(st, NULL, 0, dy->data, dy->dtype, dx->data, dx->dtype, c->din_acc[0], n, cnt), c, 1);
    case AMPC_OP_ADD:
      if (!backward)
        return launched(ampc__cu_add(st, x->data, x->dtype, c->in[1].data, c->in[1].dtype, y->data, y->dtype, c->attr.relu, n),
                        c, 0);
      return launched(ampc__cu_add_bwd(st, y->data, y->dtype, c->attr.relu, dy->data, dy->dtype, c->din[0].data,
                                       c->din[0].dtype, c->din_acc[0], c->din[1].data, c->din[1].dtype, c->din_acc[1], n, cnt),
                      c, 1);
    default: return ampc__error(AMPC_EUNSUPPORTED, "cuda: no kernel for %s", ampc_op_name(c->op));
  }
}

ampc_status ampc__cu_run(ampc__device *d, const ampc__op_call *c, int backward) {
  switch (c->op) {
    case AMPC_OP_INPUT:
    case AMPC_OP_LABELS:
    case AMPC_OP_PARAM:
    case AMPC_OP_BUFFER:
    case AMPC_OP_FLATTEN: return AMPC_OK;
    case AMPC_OP_CONV2D: return backward ? ampc__cu_conv_bwd(d, c) : ampc__cu_conv_fwd(d, c);
    case AMPC_OP_LINEAR: return backward ? ampc__cu_linear_bwd(d, c) : ampc__cu_linear_fwd(d, c);
    case AMPC_OP_BATCHNORM2D: return bn_run(d, c, backward);
    case AMPC_OP_MAXPOOL2D:
    case AMPC_OP_AVGPOOL2D:
    case AMPC_OP_GLOBAL_AVGPOOL: return pool_run(d, c, backward);
    case AMPC_OP_SOFTMAX:
    case AMPC_OP_LOG_SOFTMAX:
    case AMPC_OP_CROSS_ENTROPY: return rows_run(d, c, backward);
    default: return eltwise_run(d, c, backward);
  }
}

int ampc__cu_supports(const ampc__device *d, ampc_op_kind op, ampc_dtype t) {
  if ((unsigned)op >= AMPC_OP_COUNT) return 0;
  switch (op) {
    case AMPC_OP_LABELS: return t == AMPC_DTYPE_I32;
    case AMPC_OP_BUFFER: return t == AMPC_DTYPE_F32 || t == AMPC_DTYPE_I64;
    default: return t == AMPC_DTYPE_F32 || t == AMPC_DTYPE_F16 || t == AMPC_DTYPE_BF16;
  }
}

size_t ampc__cu_workspace(ampc__device *d, const ampc__op_call *c) {
  switch (c->op) {
    case AMPC_OP_CONV2D: return ampc__cu_conv_ws(d, c);
    case AMPC_OP_LINEAR: return ampc__cu_linear_ws(d, c);
    case AMPC_OP_BATCHNORM2D: {
      const ampc_shape *s = &c->in[0].shape;
      return ampc__cu_bn_ws(s->d[0], s->d[1], s->d[2] * s->d[3]);
    }
    case AMPC_OP_CROSS_ENTROPY: return (size_t)c->in[0].shape.d[0] * sizeof(float) + 256;
    default: return 0;
  }
}

size_t ampc__cu_aux_floats(ampc__device *d, const ampc__op_call *c) {
  return c->op == AMPC_OP_BATCHNORM2D ? bn_aux_floats(c) : 0;
}
