/* Compile: the precision pass, what needs a gradient, fusion, the flat
 * parameter buckets, the memory plan, and every buffer allocated on the
 * device. After compile, forward and backward allocate nothing. */
#include <stdlib.h>
#include <string.h>

#include "core/graph_internal.h"
#include "core/status_internal.h"

/* Which values need a gradient: those that depend on a parameter. */
static void mark_requires_grad(ampc_graph *g) {
  for (size_t k = 0; k < g->norder; k++) {
    ampc__value *v = &g->v[g->order[k]];
    v->requires_grad = 0;
    for (int j = 0; j < v->n_in; j++)
      if (v->in[j] >= 0 && g->v[v->in[j]].requires_grad && g->v[v->in[j]].op != AMPC_OP_BUFFER) v->requires_grad = 1;
  }
}

/* 0: batch norms are stored even where convolutions could apply them (a hook
 * for tests, which measure what that fusion saves). */
int ampc__graph_bn_prologue = 1;

static ampc_status fuse(ampc_graph *g) {
  if (!g->fuse) return AMPC_OK;
  int *uses = calloc(g->nv, sizeof *uses);
  if (!uses) return ampc__error(AMPC_ENOMEM, "graph: out of memory");
  for (size_t k = 0; k < g->norder; k++) {
    const ampc__value *v = &g->v[g->order[k]];
    for (int j = 0; j < v->n_in; j++)
      if (v->in[j] >= 0) uses[v->in[j]]++;
  }
  /* A ReLU whose input is a batch norm or an add used by nothing else runs
   * inside that op: the ReLU's value becomes a view of the op's output, which
   * saves one activation, its gradient and two passes over memory. */
  for (size_t k = 0; k < g->norder; k++) {
    ampc__value *r = &g->v[g->order[k]];
    if (r->op != AMPC_OP_RELU) continue;
    ampc__value *x = &g->v[r->in[0]];
    if ((x->op == AMPC_OP_BATCHNORM2D || x->op == AMPC_OP_ADD) && uses[r->in[0]] == 1 && x->dtype == r->dtype &&
        x->alias == AMPC_VALUE_NONE && !x->keep) { /* a kept value keeps its pre-ReLU values */
      x->attr.relu = 1;
      r->alias = r->in[0];
    }
  }
  /* A 2x2 stride-2 max pool that is the only reader of a batch norm (and its
   * fused ReLU) runs inside the batch norm too: the full-size output is never
   * stored, the batch norm writes the pooled planes and keeps each window's
   * winner for backward, which sends the pooled gradient straight there. */
  for (size_t k = 0; k < g->norder; k++) {
    ampc__value *p = &g->v[g->order[k]];
    if (p->op != AMPC_OP_MAXPOOL2D || g->retain_grads) continue;
    if (p->attr.k != 2 || p->attr.stride != 2 || p->attr.pad != 0) continue;
    ampc_value in = p->in[0], b = ampc__graph_root(g, in);
    ampc__value *bv = &g->v[b];
    if (bv->op != AMPC_OP_BATCHNORM2D || bv->keep || g->v[in].keep || uses[in] != 1 || (in != b && uses[b] != 1) ||
        bv->dtype != p->dtype || bv->pool_out != AMPC_VALUE_NONE)
      continue;
    bv->attr.pool = 1;
    bv->pool_out = g->order[k];
    bv->store = p->shape;
    p->alias = b;
  }
  /* A batch norm (with its fused ReLU) read only by convolutions, as their
   * input, stores nothing: each convolution reads the batch norm's input
   * and applies the batch norm's per-channel scale and shift (and the ReLU)
   * as it loads it, rounded as storing would round it, and the batch norm's
   * backward finds its ReLU's mask from its input the same way. One
   * activation less (ResNet-18: the first of each block's two batch norms)
   * and the pass that wrote it, on backends whose kernels can. One read by
   * residual sums too (ResNet-18's first, which the first block's shortcut
   * adds) is stored for them but recomputed the same way in backward
   * (attr.recompute), which reads it nowhere else: its memory is free once
   * forward has passed its last reader (ResNet-18 at batch 128: 16.8 MB at
   * the start of backward, the peak). */
  for (size_t k = 0; ampc__graph_bn_prologue && g->dev->be->conv_prologue && !g->retain_grads && k < g->norder; k++) {
    ampc_value b = g->order[k];
    ampc__value *bv = &g->v[b];
    if (bv->op != AMPC_OP_BATCHNORM2D || bv->alias != AMPC_VALUE_NONE || bv->pool_out != AMPC_VALUE_NONE || bv->keep) continue;
    int readers = 0, sums = 0, ok = 1;
    for (size_t j = k + 1; ok && j < g->norder; j++) {
      const ampc__value *u = &g->v[g->order[j]];
      for (int i = 0; ok && i < u->n_in; i++) {
        if (u->in[i] < 0 || ampc__graph_root(g, u->in[i]) != b) continue;
        if (u->alias != AMPC_VALUE_NONE) /* a view: only the fused ReLU, itself not kept */
          ok = u->op == AMPC_OP_RELU && u->alias == b && !u->keep;
        else if (u->op == AMPC_OP_ADD) /* its backward reads no input */
          sums++;
        else
          ok = u->op == AMPC_OP_CONV2D && i == 0 && (readers += 1);
      }
    }
    if (!ok || readers == 0) continue;
    if (sums) bv->attr.recompute = 1;
    else bv->attr.nostore = 1;
    for (size_t j = k + 1; j < g->norder; j++) {
      ampc__value *u = &g->v[g->order[j]];
      if (u->op == AMPC_OP_CONV2D && u->alias == AMPC_VALUE_NONE && u->in[0] >= 0 && ampc__graph_root(g, u->in[0]) == b) u->pro = b;
    }
  }
  free(uses);
  return AMPC_OK;
}

/* The flat numbering: the parameters of each storage type back to back (16-bit
 * ones first), in recording order within a type. */
static void layout_params(ampc_graph *g) {
  static const ampc_dtype order[AMPC__MAX_BUCKETS] = {AMPC_DTYPE_F16, AMPC_DTYPE_BF16, AMPC_DTYPE_F32};
  size_t flat = 0;
  g->nbuckets = 0;
  for (int t = 0; t < AMPC__MAX_BUCKETS; t++) {
    size_t start = flat;
    for (size_t i = 0; i < g->nparams; i++) {
      ampc__value *v = &g->v[g->params[i]];
      if (v->dtype != order[t]) continue;
      v->param_offset = flat;
      flat += (size_t)ampc_shape_numel(&v->shape);
    }
    if (flat > start) g->buckets[g->nbuckets++] = (ampc__bucket){order[t], start, flat - start, NULL, NULL};
  }
  AMPC_ASSERT(flat == g->param_numel);
}

/* Every parameter and buffer gets its recorded values. */
static ampc_status write_initial_values(ampc_graph *g) {
  for (size_t i = 0; i < g->nv; i++) {
    ampc__value *v = &g->v[i];
    if (v->op != AMPC_OP_PARAM && v->op != AMPC_OP_BUFFER) continue;
    size_t n = (size_t)ampc_shape_numel(&v->shape);
    if (v->dtype != AMPC_DTYPE_I64) {
      AMPC_TRY(ampc__dev_write(g->dev, v->data, v->dtype, v->init, AMPC_DTYPE_F32, n));
      continue;
    }
    int64_t *tmp = malloc(n * sizeof *tmp);
    if (!tmp) return ampc__error(AMPC_ENOMEM, "graph: out of memory");
    for (size_t e = 0; e < n; e++) tmp[e] = (int64_t)v->init[e];
    ampc_status s = ampc__dev_write(g->dev, v->data, AMPC_DTYPE_I64, tmp, AMPC_DTYPE_I64, n);
    free(tmp);
    AMPC_TRY(s);
  }
  return AMPC_OK;
}

ampc_status ampc_graph_compile(ampc_graph *g) {
  if (!g) return ampc__graph_null(__func__);
  if (g->err) return ampc__graph_err(g);
  if (g->compiled) return AMPC_OK;
  if (g->nv == 0 || g->max_batch < 1) return ampc__error(AMPC_ESTATE, "graph: nothing to compile (no input)");
  AMPC_TRY(ampc__graph_need_device(g));
  ampc__device *d = g->dev;
  AMPC_TRY(ampc__graph_assign_types(g, g->nv));
  for (size_t k = 0; k < g->norder; k++) {
    const ampc__value *v = &g->v[g->order[k]];
    if (!d->be->supports(d, v->op, v->dtype))
      return ampc__error(AMPC_EUNSUPPORTED, "graph: backend %s has no %s kernel for %s", d->be->name,
                         ampc_op_name(v->op), ampc_dtype_name(v->dtype));
  }
  mark_requires_grad(g);
  AMPC_TRY(fuse(g));
  layout_params(g);

  memset(g->bytes_by_type, 0, sizeof g->bytes_by_type);
  size_t bb = 0, ab = 0, agb = 0, ws = 0;
  for (size_t i = 0; i < g->nbuffers; i++) bb += ampc__align64(ampc__value_bytes(&g->v[g->buffers[i]]));
  /* saved state and workspace per op */
  size_t aux_bytes = 0;
  for (size_t k = 0; k < g->norder; k++) {
    ampc__value *v = &g->v[g->order[k]];
    ampc__op_call c = ampc__graph_call(g, v, g->max_batch);
    v->aux_floats = d->be->aux_floats(d, &c);
    aux_bytes += ampc__align64(v->aux_floats * sizeof(float));
    v->ws_need = d->be->workspace(d, &c);
    if (v->ws_need > ws) ws = v->ws_need;
  }
  /* activations: every op output except aliases, inputs and labels, planned */
  size_t ab_by_type[AMPC_DTYPE_COUNT] = {0};
  size_t agb_by_type[AMPC_DTYPE_COUNT] = {0};
  if (g->free_saved) {
    /* one arena for both and the ops' workspace (agb and the shared
     * workspace 0: their offsets are in it); ws: the workspace's part of
     * the arena at its peak */
    AMPC_TRY(ampc__graph_plan_joint(g, &ab, ab_by_type, &ws));
    g->ws_in_arena = 1;
  } else {
    AMPC_TRY(ampc__graph_plan_activations(g, &ab, ab_by_type));
    AMPC_TRY(ampc__graph_plan_activation_grads(g, &agb, agb_by_type));
    g->ws_in_arena = 0;
  }
  size_t values_bytes = ab;
  ab += aux_bytes;
  for (int t = 0; t < AMPC_DTYPE_COUNT; t++) g->bytes_by_type[3][t] = agb_by_type[t];

  /* the whole plan must fit in the device before any of it is allocated */
  uint64_t pb = 0;
  for (int b = 0; b < g->nbuckets; b++) pb += 2 * (uint64_t)g->buckets[b].n * ampc_dtype_size(g->buckets[b].type);
  size_t ws_shared = g->ws_in_arena ? 0 : ws; /* (else in ab) */
  uint64_t cap = d->be->capacity(d), total = pb + bb + ab + agb + ws_shared;
  if (cap && total > cap)
    return ampc__error(AMPC_ENOMEM,
                       "graph: batch %lld needs %.1f GB (activations %.1f, their gradients %.1f, parameters and "
                       "gradients %.1f, workspace %.1f), more than the %.1f GB of memory of backend %s",
                       (long long)g->max_batch, (double)total / 1e9, (double)ab / 1e9, (double)agb / 1e9,
                       (double)(pb + bb) / 1e9, (double)ws / 1e9, (double)cap / 1e9, d->be->name);
  for (int b = 0; b < g->nbuckets; b++) {
    ampc__bucket *k = &g->buckets[b];
    size_t bytes = k->n * ampc_dtype_size(k->type);
    k->data = ampc__dev_alloc(d, bytes);
    k->grad = ampc__dev_alloc(d, bytes);
    if (!k->data || !k->grad)
      return ampc__error(AMPC_ENOMEM, "graph: out of device memory for %zu bytes of %s parameters", bytes,
                         ampc_dtype_name(k->type));
  }
  g->buf_arena = ampc__dev_alloc(d, bb ? bb : 64);
  g->act_arena = ampc__dev_alloc(d, ab ? ab : 64);
  g->actgrad_arena = ampc__dev_alloc(d, agb ? agb : 64);
  g->ws = ampc__dev_alloc(d, ws_shared ? ws_shared : 64);
  if (!g->buf_arena || !g->act_arena || !g->actgrad_arena || !g->ws)
    return ampc__error(AMPC_ENOMEM, "graph: out of device memory allocating %zu bytes of activations", ab + agb + ws_shared);
  g->buf_bytes = bb;
  g->act_bytes = ab;
  g->actgrad_bytes = agb;
  g->ws_bytes = ws_shared;
  g->ws_report = ws;

  char *bp = g->buf_arena, *ap = g->act_arena, *agp = g->free_saved ? g->act_arena : g->actgrad_arena;
  for (size_t i = 0; i < g->nv; i++) {
    ampc__value *v = &g->v[i];
    size_t nb = ampc__value_bytes(v);
    if (v->op == AMPC_OP_PARAM) {
      const ampc__bucket *k = g->buckets;
      while (k->type != v->dtype) k++;
      size_t at = (v->param_offset - k->start) * ampc_dtype_size(v->dtype);
      v->data = (char *)k->data + at;
      v->grad = (char *)k->grad + at;
      g->bytes_by_type[0][v->dtype] += nb;
      g->bytes_by_type[1][v->dtype] += nb;
    } else if (v->op == AMPC_OP_BUFFER) {
      v->data = bp;
      bp += ampc__align64(nb);
      g->bytes_by_type[0][v->dtype] += nb;
    } else if (v->alias == AMPC_VALUE_NONE) {
      v->data = v->attr.nostore ? NULL : ap + v->act_off;
      if (v->grad_off != SIZE_MAX) v->grad = agp + v->grad_off;
    }
  }
  for (int t = 0; t < AMPC_DTYPE_COUNT; t++) g->bytes_by_type[2][t] += ab_by_type[t];
  ap += values_bytes;
  for (size_t k = 0; k < g->norder; k++) {
    ampc__value *v = &g->v[g->order[k]];
    if (v->aux_floats) {
      v->aux = (float *)ap;
      ap += ampc__align64(v->aux_floats * sizeof(float));
      g->bytes_by_type[2][AMPC_DTYPE_F32] += v->aux_floats * sizeof(float);
    }
  }
  for (size_t i = 0; i < g->nv; i++) {
    ampc__value *v = &g->v[i];
    if (v->alias != AMPC_VALUE_NONE) {
      ampc__value *r = &g->v[ampc__graph_root(g, (ampc_value)i)];
      v->data = r->data;
      v->grad = r->grad;
    }
  }
  AMPC_TRY(write_initial_values(g));

  g->bw_reach = calloc(g->nv, 1);
  g->bw_written = calloc(g->nv, 1);
  g->bw_pending = calloc(g->nv, sizeof *g->bw_pending);
  if (!g->bw_reach || !g->bw_written || !g->bw_pending) return ampc__error(AMPC_ENOMEM, "graph: out of memory");
  /* (the batch stays as recorded or as set_batch set it before compile) */
  g->compiled = 1;
  return AMPC_OK;
}

int ampc_graph_is_compiled(const ampc_graph *g) { return g && g->compiled; }
