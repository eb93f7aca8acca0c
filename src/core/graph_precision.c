/* The precision pass: the storage type of every value, and the casts the
 * chosen precision needs (the model's input to the activation type, logits
 * to f32 before the loss, and with autocast each op's inputs to the type
 * its policy asks for). */
#include <stdlib.h>
#include <string.h>

#include "core/graph_internal.h"
#include "core/status_internal.h"

ampc_status ampc_graph_set_precision(ampc_graph *g, const ampc_graph_precision *p) {
  if (!g) return ampc__graph_null(__func__);
  if (!p) return ampc__error(AMPC_EINVAL, "ampc_graph_set_precision: precision is NULL");
  if (g->compiled) return ampc__error(AMPC_ESTATE, "graph: precision must be set before compile");
  ampc_dtype ts[4] = {p->param_type, p->norm_param_type, p->act_type, p->half_type};
  for (int i = 0; i < 4; i++)
    if (ts[i] != AMPC_DTYPE_F32 && ts[i] != AMPC_DTYPE_F16 && ts[i] != AMPC_DTYPE_BF16)
      return ampc__error(AMPC_EINVAL, "graph: precision type %s (expected f32, f16 or bf16)", ampc_dtype_name(ts[i]));
  if (p->autocast && !p->policy)
    return ampc__error(AMPC_EINVAL, "graph: autocast needs a cast policy (such as ampc_amp_cast_policy)");
  g->prec = *p;
  return AMPC_OK;
}

static ampc_dtype wider(ampc_dtype a, ampc_dtype b) {
  if (a == b) return a;
  return AMPC_DTYPE_F32; /* f32 with anything, or f16 with bf16 */
}

/* Inserts a cast of value x to type t before the current op (reusing one made
 * earlier for the same value and type: a weight is cast once per step). */
static ampc_value cast_for(ampc_graph *g, ampc_value x, ampc_dtype t, ampc_value *cache) {
  if (g->v[x].dtype == t) return x;
  if (cache[x] >= 0 && g->v[cache[x]].dtype == t) return cache[x];
  g->compiled = 0;
  ampc_value c = ampc_graph_cast(g, x, t);
  if (c < 0) return c;
  g->order[g->norder++] = c;
  cache[x] = c;
  return c;
}

ampc_status ampc__graph_assign_types(ampc_graph *g, size_t n_recorded) {
  const ampc_graph_precision *p = &g->prec;
  /* Recorded ops run in recording order; casts the pass inserts go just before their user. */
  size_t cap = n_recorded * 4 + 8;
  g->order = calloc(cap, sizeof *g->order);
  ampc_value *cache = malloc(cap * sizeof *cache);
  if (!g->order || !cache) {
    free(cache);
    return ampc__error(AMPC_ENOMEM, "graph: out of memory");
  }
  for (size_t i = 0; i < cap; i++) cache[i] = AMPC_VALUE_NONE;
  if (g->cap < cap) {
    ampc__value *nv = realloc(g->v, cap * sizeof *nv);
    if (!nv) {
      free(cache);
      return ampc__error(AMPC_ENOMEM, "graph: out of memory");
    }
    g->v = nv;
    g->cap = cap;
  }
  for (size_t i = 0; i < n_recorded; i++) {
    ampc__value *v = &g->v[i];
    switch (v->op) {
      case AMPC_OP_INPUT: v->dtype = p->act_type; continue;
      case AMPC_OP_PARAM: v->dtype = v->is_norm ? p->norm_param_type : p->param_type; continue;
      case AMPC_OP_LABELS:
      case AMPC_OP_BUFFER: continue;
      default: break;
    }
    ampc_value id = (ampc_value)i;
    if (v->op == AMPC_OP_CAST) {
      v->dtype = (ampc_dtype)v->attr.k;
    } else if (v->op == AMPC_OP_FLATTEN) {
      v->dtype = g->v[v->in[0]].dtype;
    } else if (v->op == AMPC_OP_CROSS_ENTROPY) {
      /* the model's output goes to the loss in fp32 */
      ampc_value c = cast_for(g, g->v[id].in[0], AMPC_DTYPE_F32, cache);
      if (c < 0) break;
      g->v[id].in[0] = c;
      g->v[id].dtype = AMPC_DTYPE_F32;
    } else if (p->autocast) {
      switch (p->policy(v->op)) {
        case AMPC_CAST_POLICY_HALF:
          for (int j = 0; j < g->v[id].n_in; j++) {
            ampc_value c = cast_for(g, g->v[id].in[j], p->half_type, cache);
            if (c < 0) break;
            g->v[id].in[j] = c;
          }
          g->v[id].dtype = p->half_type;
          break;
        case AMPC_CAST_POLICY_FP32: v->dtype = AMPC_DTYPE_F32; break;
        case AMPC_CAST_POLICY_PROMOTE: v->dtype = wider(g->v[v->in[0]].dtype, g->v[v->in[1]].dtype); break;
        case AMPC_CAST_POLICY_KEEP: v->dtype = g->v[v->in[0]].dtype; break;
      }
    } else {
      v->dtype = p->act_type;
    }
    if (g->err) break;
    /* an op's output follows the batch when one of its inputs does (a cast of a
     * weight does not); the loss is a scalar */
    int batched = 0;
    for (int j = 0; j < g->v[id].n_in; j++)
      if (g->v[id].in[j] >= 0 && g->v[g->v[id].in[j]].batched) batched = 1;
    g->v[id].batched = batched && g->v[id].op != AMPC_OP_CROSS_ENTROPY;
    g->order[g->norder++] = id;
  }
  free(cache);
  g->compiled = 0;
  return ampc__graph_err(g);
}
