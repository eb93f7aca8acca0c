/* Execution: the graph's device, forward and backward through it, and
 * values in and out of device memory. */
#include <stdlib.h>
#include <string.h>

#include "core/graph_internal.h"
#include "core/status_internal.h"

/* ---- the device ---- */

ampc_status ampc_graph_set_backend(ampc_graph *g, const char *name, const ampc_backend_opts *o) {
  if (!g) return ampc__graph_null(__func__);
  if (g->compiled) return ampc__error(AMPC_ESTATE, "graph: the backend must be chosen before compile");
  ampc__device *d;
  AMPC_TRY(ampc__device_create(&d, name, o));
  ampc__device_unref(g->dev);
  g->dev = d;
  return AMPC_OK;
}

ampc_status ampc__graph_need_device(ampc_graph *g) {
  if (g->dev) return AMPC_OK;
  return ampc__device_create(&g->dev, "cpu", NULL);
}

ampc__device *ampc__graph_device(const ampc_graph *g) { return g->dev; }

const char *ampc_graph_backend_name(const ampc_graph *g) { return !g ? NULL : g->dev ? g->dev->be->name : "cpu"; }

int ampc_graph_threads(const ampc_graph *g) { return !g ? 0 : g->dev ? g->dev->opts.threads : 1; }

void ampc_graph_backend_stats(const ampc_graph *g, ampc_backend_stats *s, int reset) {
  if (!s) return;
  if (!g) {
    if (s) memset(s, 0, sizeof *s);
    return;
  }
  memset(s, 0, sizeof *s);
  if (!g->dev) return;
  g->dev->be->stats(g->dev, s, reset ? AMPC__STATS_ALL : 0);
  s->reads = g->dev->reads;
  if (reset) g->dev->reads = 0;
}

size_t ampc_graph_backend_notes(const ampc_graph *g, char *buf, size_t n) {
  if (n && buf) buf[0] = 0;
  if (!g || !buf || !g->dev || !g->dev->be->notes || n < 2) return 0;
  return g->dev->be->notes(g->dev, buf, n);
}

void ampc_graph_set_profiling(ampc_graph *g, int on) {
  if (!g) return;
  if (ampc__graph_need_device(g) < 0) return;
  ampc_backend_stats s;
  g->dev->be->stats(g->dev, &s, AMPC__STATS_TIMES);
  g->dev->opts.profiling = on != 0;
}

void ampc__graph_set_grad_hook(ampc_graph *g, ampc_status (*hook)(void *ctx, size_t start, size_t n), void *ctx) {
  g->grad_hook = hook;
  g->grad_hook_ctx = ctx;
}

void ampc__graph_set_bn_sync(ampc_graph *g, const ampc__sync *sync) { g->bn_sync = sync; }

void ampc__graph_count_underflow(ampc_graph *g, int on) {
  if (ampc__graph_need_device(g) == 0) g->dev->count_underflow = on != 0;
}

int ampc__graph_spans(const ampc_graph *g, ampc__span *out) {
  for (int b = 0; b < g->nbuckets; b++) {
    const ampc__bucket *k = &g->buckets[b];
    out[b] = (ampc__span){k->start, k->n, k->type, k->data, k->type, k->grad};
  }
  return g->nbuckets;
}

/* ---- running ---- */

/* A value's tensor with the given shape (its own or its memory's) at batch. */
static ampc_tensor view_as(const ampc__value *v, const ampc_shape *shape, void *data, int64_t batch) {
  ampc_tensor t = {data, v->dtype, *shape};
  if (v->batched && t.shape.ndim > 0) t.shape.d[0] = batch;
  return t;
}
static ampc_tensor view(const ampc__value *v, void *data, int64_t batch) { return view_as(v, &v->store, data, batch); }

ampc__op_call ampc__graph_call(const ampc_graph *g, const ampc__value *v, int64_t batch) {
  ampc__op_call c;
  memset(&c, 0, sizeof c);
  c.op = v->op;
  c.n_in = v->n_in;
  for (int j = 0; j < v->n_in; j++) {
    if (v->in[j] < 0) continue;
    const ampc__value *x = &g->v[v->in[j]];
    c.in[j] = view(x, x->data, batch);
    if (x->requires_grad && x->op != AMPC_OP_BUFFER) c.din[j] = view(x, x->grad, batch);
    else c.din[j].data = NULL;
  }
  if (v->pro != AMPC_VALUE_NONE) { /* the batch norm's input, normalised as it is read */
    const ampc__value *b = &g->v[v->pro], *x = &g->v[b->in[0]];
    c.in[0] = view(x, x->data, batch);
    c.pro = b->aux ? b->aux + 2 * b->shape.d[1] + 1 : NULL; /* after mean, invstd, mode (see the cpu batch norm) */
    c.pro_relu = b->attr.relu;
    c.pro_type = b->dtype;
  }
  c.out = view(v, v->data, batch);
  c.dout = view(v, v->grad, batch);
  c.attr = v->attr;
  if (v->op == AMPC_OP_BATCHNORM2D) c.sync = g->bn_sync;
  c.aux = v->aux;
  c.ws = g->ws;
  c.ws_size = g->ws_bytes;
  return c;
}

ampc_status ampc_graph_set_batch(ampc_graph *g, int64_t n) {
  if (!g) return ampc__graph_null(__func__);
  if (n < 1 || n > g->max_batch)
    return ampc__error(AMPC_EINVAL, "graph: batch %lld outside 1..%lld", (long long)n, (long long)g->max_batch);
  if (n != g->batch) g->forwarded = 0; /* the saved values are another batch's */
  g->batch = n;
  return AMPC_OK;
}
int64_t ampc_graph_batch(const ampc_graph *g) { return g ? g->batch : 0; }
int64_t ampc_graph_max_batch(const ampc_graph *g) { return g ? g->max_batch : 0; }

static ampc_status run(ampc_graph *g, const ampc__op_call *c, int backward) {
  ampc_status s = g->dev->be->run(g->dev, c, backward);
  if (s < 0) return ampc__error_prefix(s, "%s %s", ampc_op_name(c->op), backward ? "backward" : "forward");
  return AMPC_OK;
}

/* free_saved: the op's own workspace for its forward (dir 0) or backward,
 * planned in the activation arena (ops that ask for none keep the empty
 * shared one) */
static void op_workspace(const ampc_graph *g, const ampc__value *v, int dir, ampc__op_call *c) {
  if (!g->ws_in_arena || v->ws_off[dir] == SIZE_MAX) return;
  c->ws = (char *)g->act_arena + v->ws_off[dir];
  c->ws_size = v->ws_need;
}

ampc_status ampc_graph_forward(ampc_graph *g, int training) {
  if (!g) return ampc__graph_null(__func__);
  AMPC_TRY(ampc_graph_compile(g));
  g->saved_freed = 0;
  for (size_t k = 0; k < g->norder; k++) {
    ampc__value *v = &g->v[g->order[k]];
    if (v->alias != AMPC_VALUE_NONE) continue; /* views: flatten, fused relu */
    ampc__op_call c = ampc__graph_call(g, v, g->batch);
    c.training = training;
    op_workspace(g, v, 0, &c);
    AMPC_TRY(run(g, &c, 0));
  }
  g->forwarded = 1;
  return AMPC_OK;
}

/* Whether backward runs op value id (reached from the loss, not a view, and
 * with a gradient to pass on). */
static int bw_runs(const ampc_graph *g, const unsigned char *reach, ampc_value id) {
  const ampc__value *v = &g->v[id];
  if (!reach[id] || v->alias != AMPC_VALUE_NONE || !v->requires_grad) return 0;
  /* an output nothing differentiates (not the loss, which is seeded) has no gradient */
  return v->grad || v->op == AMPC_OP_CROSS_ENTROPY;
}

/* Whether an op's input x is a parameter whose gradient the op writes. */
static int writes_param_grad(const ampc_graph *g, ampc_value x) {
  if (x < 0) return 0;
  const ampc__value *p = &g->v[x];
  return p->op == AMPC_OP_PARAM && p->requires_grad && p->grad;
}

ampc_status ampc_graph_backward(ampc_graph *g, ampc_value loss, float seed, int accumulate) {
  if (!g) return ampc__graph_null(__func__);
  if (!g->compiled || !g->forwarded) return ampc__error(AMPC_ESTATE, "graph: backward before forward");
  if (!ampc__graph_valid(g, loss) || g->v[loss].op != AMPC_OP_CROSS_ENTROPY)
    return ampc__error(AMPC_EINVAL, "graph: backward needs a loss value");
  if (g->saved_freed)
    return ampc__error(AMPC_ESTATE, "graph: a second backward after one forward, with free_saved (the first freed the "
                                    "activations backward reads): run forward again");
  g->saved_freed = g->free_saved; /* (from its first op on, memory is reused) */
  /* only the ops this loss depends on run; the first to produce a value's
   * gradient overwrites it (a parameter's: unless accumulating), later ones add */
  unsigned char *reach = g->bw_reach, *written = g->bw_written;
  memset(reach, 0, g->nv);
  memset(written, 0, g->nv);
  reach[loss] = 1;
  for (size_t k = g->norder; k-- > 0;) {
    ampc_value id = g->order[k];
    ampc__value *v = &g->v[id];
    if (!reach[id]) continue;
    if (v->alias != AMPC_VALUE_NONE) reach[v->alias] = 1;
    for (int j = 0; j < v->n_in; j++)
      if (v->in[j] >= 0) reach[v->in[j]] = 1;
  }
  /* with a hook: how many of the ops that run write each parameter's
   * gradient, so that the last one can say it is final */
  int *pending = g->bw_pending;
  if (g->grad_hook) {
    memset(pending, 0, g->nv * sizeof *pending);
    for (size_t k = g->norder; k-- > 0;) {
      ampc__value *v = &g->v[g->order[k]];
      if (!bw_runs(g, reach, g->order[k])) continue;
      for (int j = 0; j < v->n_in; j++)
        if (writes_param_grad(g, v->in[j])) pending[v->in[j]]++;
    }
  }
  for (size_t k = g->norder; k-- > 0;) {
    ampc_value id = g->order[k];
    ampc__value *v = &g->v[id];
    if (!bw_runs(g, reach, id)) continue;
    ampc__op_call c = ampc__graph_call(g, v, g->batch);
    c.training = 1;
    c.seed = seed;
    op_workspace(g, v, 1, &c);
    for (int j = 0; j < v->n_in; j++) {
      if (v->in[j] < 0 || !c.din[j].data) continue;
      ampc_value r = ampc__graph_root(g, v->in[j]);
      c.din_acc[j] = written[r] ? 1 : (g->v[r].op == AMPC_OP_PARAM ? accumulate : 0);
      written[r] = 1;
    }
    AMPC_TRY(run(g, &c, 1));
    for (int j = 0; g->grad_hook && j < v->n_in; j++) {
      if (!writes_param_grad(g, v->in[j]) || --pending[v->in[j]] != 0) continue;
      const ampc__value *p = &g->v[v->in[j]];
      AMPC_TRY(g->grad_hook(g->grad_hook_ctx, p->param_offset, (size_t)ampc_shape_numel(&p->shape)));
    }
  }
  return AMPC_OK;
}

ampc_status ampc_graph_zero_grad(ampc_graph *g) {
  if (!g) return ampc__graph_null(__func__);
  for (int b = 0; b < g->nbuckets; b++)
    AMPC_TRY(ampc__dev_set(g->dev, g->buckets[b].grad, 0, g->buckets[b].n * ampc_dtype_size(g->buckets[b].type)));
  return AMPC_OK;
}

/* ---- values in and out ---- */

/* A batch norm whose max pool was fused into it, and its fused ReLU, have no
 * full-size values (their memory holds the pool's): their tensors say their
 * type and shape, with no data. */
ampc_tensor ampc__graph_view(const ampc_graph *g, ampc_value v, int grad) {
  ampc_tensor t = {0};
  if (!ampc__graph_valid(g, v)) return t;
  const ampc__value *x = &g->v[v];
  ampc_value r = ampc__graph_root(g, v);
  if (g->v[r].pool_out != AMPC_VALUE_NONE && g->v[r].pool_out != v) return view_as(x, &x->shape, NULL, g->batch);
  return view(x, grad ? x->grad : x->data, g->batch);
}

static ampc_status io_view(const ampc_graph *g, ampc_value v, int grad, const char *what, ampc_tensor *t) {
  if (!g->compiled) return ampc__error(AMPC_ESTATE, "graph: %s before compile", what);
  if (!ampc__graph_valid(g, v)) return ampc__error(AMPC_EINVAL, "graph: %s of an invalid value %d", what, (int)v);
  *t = ampc__graph_view(g, v, grad);
  if (!grad && g->saved_freed && g->v[ampc__graph_root(g, v)].bw_freed)
    return ampc__error(AMPC_ESTATE, "graph: %s: '%s' was freed by backward (free_saved: keep it with ampc_graph_keep to read it "
                                    "after backward)", what, g->v[v].name);
  if (!t->data)
    return ampc__error(AMPC_EINVAL, "graph: %s: '%s' has no %s of its own (%s)", what, g->v[v].name, grad ? "gradient" : "memory",
                       grad ? "nothing differentiates it, or it is only live during backward"
                            : "fused into the op before it, or into the convolutions after it");
  return AMPC_OK;
}

ampc_status ampc_graph_write(ampc_graph *g, ampc_value v, const void *src, ampc_dtype src_type) {
  if (!g) return ampc__graph_null(__func__);
  ampc_tensor t = {0};
  AMPC_TRY(io_view(g, v, 0, "write", &t));
  if (!src) return ampc__error(AMPC_EINVAL, "graph: write of '%s': the source is NULL", g->v[v].name);
  ampc_status s = ampc__dev_write(g->dev, t.data, t.dtype, src, src_type, (size_t)ampc_tensor_numel(&t));
  if (s < 0) return ampc__error_prefix(s, "graph: write of '%s'", g->v[v].name);
  return AMPC_OK;
}

ampc_status ampc_graph_write_grad(ampc_graph *g, ampc_value v, const void *src, ampc_dtype src_type) {
  if (!g) return ampc__graph_null(__func__);
  ampc_tensor t = {0};
  AMPC_TRY(io_view(g, v, 1, "write of a gradient", &t));
  if (!src) return ampc__error(AMPC_EINVAL, "graph: write of the gradient of '%s': the source is NULL", g->v[v].name);
  ampc_status s = ampc__dev_write(g->dev, t.data, t.dtype, src, src_type, (size_t)ampc_tensor_numel(&t));
  if (s < 0) return ampc__error_prefix(s, "graph: write of the gradient of '%s'", g->v[v].name);
  return AMPC_OK;
}

static ampc_status read_value(const ampc_graph *g, ampc_value v, int grad, void *dst, ampc_dtype dst_type) {
  ampc_tensor t = {0};
  AMPC_TRY(io_view(g, v, grad, grad ? "read of a gradient" : "read", &t));
  if (!dst) return ampc__error(AMPC_EINVAL, "graph: read of '%s': the destination is NULL", g->v[v].name);
  ampc_status s = ampc__dev_read(g->dev, dst, dst_type, t.data, t.dtype, (size_t)ampc_tensor_numel(&t));
  if (s < 0) return ampc__error_prefix(s, "graph: read of '%s'", g->v[v].name);
  return AMPC_OK;
}

ampc_status ampc_graph_read(const ampc_graph *g, ampc_value v, void *dst, ampc_dtype dst_type) {
  if (!g) return ampc__graph_null(__func__);
  return read_value(g, v, 0, dst, dst_type);
}

ampc_status ampc_graph_read_grad(const ampc_graph *g, ampc_value v, void *dst, ampc_dtype dst_type) {
  if (!g) return ampc__graph_null(__func__);
  return read_value(g, v, 1, dst, dst_type);
}
