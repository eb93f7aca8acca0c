/* The memory planner: where each activation and each activation gradient
 * lives in its arena, reusing memory whose value is dead. */
#include <stdlib.h>
#include <string.h>

#include "core/graph_internal.h"
#include "core/status_internal.h"

/* A first-fit allocator over one arena's offsets, for planning. */
typedef struct {
  size_t *off, *len;
  size_t n, cap, top;
} plan_arena;

static size_t plan_alloc(plan_arena *a, size_t len) {
  for (size_t i = 0; i < a->n; i++)
    if (a->len[i] >= len) {
      size_t o = a->off[i];
      a->off[i] += len;
      a->len[i] -= len;
      if (a->len[i] == 0) {
        memmove(a->off + i, a->off + i + 1, (a->n - i - 1) * sizeof *a->off);
        memmove(a->len + i, a->len + i + 1, (a->n - i - 1) * sizeof *a->len);
        a->n--;
      }
      return o;
    }
  size_t o = a->top;
  a->top += len;
  return o;
}

static int plan_free(plan_arena *a, size_t off, size_t len) {
  if (a->n == a->cap) {
    size_t cap = a->cap ? a->cap * 2 : 64;
    size_t *no = realloc(a->off, cap * sizeof *no);
    if (!no) return -1;
    a->off = no;
    size_t *nl = realloc(a->len, cap * sizeof *nl);
    if (!nl) return -1;
    a->len = nl;
    a->cap = cap;
  }
  size_t i = 0;
  while (i < a->n && a->off[i] < off) i++;
  memmove(a->off + i + 1, a->off + i, (a->n - i) * sizeof *a->off);
  memmove(a->len + i + 1, a->len + i, (a->n - i) * sizeof *a->len);
  a->off[i] = off;
  a->len[i] = len;
  a->n++;
  /* coalesce with the neighbours */
  if (i + 1 < a->n && a->off[i] + a->len[i] == a->off[i + 1]) {
    a->len[i] += a->len[i + 1];
    memmove(a->off + i + 1, a->off + i + 2, (a->n - i - 2) * sizeof *a->off);
    memmove(a->len + i + 1, a->len + i + 2, (a->n - i - 2) * sizeof *a->len);
    a->n--;
  }
  if (i > 0 && a->off[i - 1] + a->len[i - 1] == a->off[i]) {
    a->len[i - 1] += a->len[i];
    memmove(a->off + i, a->off + i + 1, (a->n - i - 1) * sizeof *a->off);
    memmove(a->len + i, a->len + i + 1, (a->n - i - 1) * sizeof *a->len);
    a->n--;
  }
  /* give the top back */
  if (a->n && a->off[a->n - 1] + a->len[a->n - 1] == a->top) {
    a->top = a->off[a->n - 1];
    a->n--;
  }
  return 0;
}

/* The value a convolution reads through its batch norm prologue (the batch
 * norm's input), or NONE. */
static ampc_value pro_read(const ampc_graph *g, const ampc__value *v) {
  return v->pro == AMPC_VALUE_NONE ? AMPC_VALUE_NONE : ampc__graph_root(g, g->v[v->pro].in[0]);
}

/* Whether op v's backward reads its inputs, or its own output. */
static int bwd_reads_inputs(const ampc__value *v) {
  switch (v->op) {
    case AMPC_OP_CONV2D:
    case AMPC_OP_LINEAR:
    case AMPC_OP_BATCHNORM2D:
    case AMPC_OP_MAXPOOL2D:
    case AMPC_OP_CROSS_ENTROPY: return 1;
    default: return 0; /* relu, add, average pools, softmax, cast: not their inputs */
  }
}
static int bwd_reads_output(const ampc__value *v) {
  switch (v->op) {
    case AMPC_OP_RELU:
    case AMPC_OP_SOFTMAX:
    case AMPC_OP_LOG_SOFTMAX: return 1;
    case AMPC_OP_BATCHNORM2D: return v->attr.relu && !v->attr.recompute; /* the fused ReLU's mask */
    case AMPC_OP_ADD: return v->attr.relu;
    default: return 0;
  }
}

/* The planner, over the order forward (step k) and then backward in reverse
 * (the op at k runs at backward step T-1-k); acts: place the activations,
 * grads: place the activation gradients, both: in one arena (free_saved).
 *
 * An activation lives from its op's forward to the end when the user may
 * read it (inputs, labels, kept values, values nothing consumes, everything
 * under retain_grads); to its last forward consumer when backward does not
 * read it; when backward does, to the end -- or, in one arena with the
 * gradients, to the backward step of its last reader. A gradient lives from
 * its last consumer's backward (which writes it first) to its own op's
 * backward (which reads it last). Within a backward step the op's input
 * gradients are placed while everything it reads is still live; its own
 * output gradient and the activations it read last are freed after it.
 * A batch norm that stores nothing (attr.nostore) has no memory, one that
 * backward recomputes (attr.recompute) none after forward's last reader; the
 * convolutions that apply it read its input, in forward and backward.
 * Sets act_off / grad_off (SIZE_MAX: none) and bw_freed; returns the arena's
 * size and its bytes by type at the peak. */
static ampc_status plan(ampc_graph *g, int acts, int grads, size_t *arena, size_t *peak_by_type, size_t *peak_ws) {
  size_t nv = g->nv;
  int64_t T = (int64_t)g->norder;
  int64_t *last_use = malloc(nv * sizeof *last_use), *dies = malloc(nv * sizeof *dies);
  int64_t *last_read = malloc(nv * sizeof *last_read); /* last forward reader, with prologue reads */
  char *forever = calloc(nv, 1), *gone = calloc(nv, 1);
  size_t live_by_type[AMPC_DTYPE_COUNT] = {0};
  plan_arena a = {0};
  ampc_status st = AMPC_OK;
  size_t peak = 0, live_ws = 0;
  int joint = acts && grads;
  if (!last_use || !dies || !last_read || !forever || !gone) st = ampc__error(AMPC_ENOMEM, "graph: out of memory planning");
#define PLAN_PEAK()                                                   \
  do {                                                                \
    if (a.top > peak) {                                               \
      peak = a.top;                                                   \
      memcpy(peak_by_type, live_by_type, sizeof live_by_type);        \
      if (peak_ws) *peak_ws = live_ws;                                \
    }                                                                 \
  } while (0)
  /* in one arena: op v's workspace for direction dir, placed while what the
   * op reads and writes is live, and free again once it has run */
#define PLAN_WS(v, dir)                                                                            \
  do {                                                                                             \
    if (joint && (v)->ws_need) {                                                                   \
      size_t len_ = ampc__align64((v)->ws_need);                                                   \
      (v)->ws_off[dir] = plan_alloc(&a, len_);                                                     \
      live_ws += len_;                                                                             \
      PLAN_PEAK();                                                                                 \
      live_ws -= len_;                                                                             \
      if (plan_free(&a, (v)->ws_off[dir], len_) < 0) st = ampc__error(AMPC_ENOMEM, "graph: out of memory planning"); \
    }                                                                                              \
  } while (0)
  if (peak_ws) *peak_ws = 0;
#define PLAN_FREE(off, v)                                                                          \
  do {                                                                                             \
    live_by_type[(v)->dtype] -= ampc__value_bytes(v);                                              \
    if (plan_free(&a, (off), ampc__align64(ampc__value_bytes(v))) < 0)                             \
      st = ampc__error(AMPC_ENOMEM, "graph: out of memory planning");                              \
  } while (0)
  for (size_t i = 0; st == 0 && i < nv; i++) {
    ampc__value *v = &g->v[i];
    last_use[i] = dies[i] = last_read[i] = -1;
    if (acts) {
      v->act_off = SIZE_MAX;
      v->bw_freed = 0;
      v->ws_off[0] = v->ws_off[1] = SIZE_MAX;
    }
    if (grads) v->grad_off = SIZE_MAX;
    if (v->op == AMPC_OP_INPUT || v->op == AMPC_OP_LABELS || v->keep || g->retain_grads)
      forever[ampc__graph_root(g, (ampc_value)i)] = 1;
  }
  /* forward consumers; the last backward step that reads each value */
  for (int64_t k = 0; st == 0 && k < T; k++) {
    ampc_value id = g->order[k];
    ampc__value *v = &g->v[id];
    if (v->alias != AMPC_VALUE_NONE) continue;
    for (int j = 0; j < v->n_in; j++) {
      if (v->in[j] < 0) continue;
      ampc_value r = ampc__graph_root(g, v->in[j]);
      last_use[r] = last_read[r] = k;
      /* (a convolution's batch norm input: what the prologue reads, below) */
      if (bwd_reads_inputs(v) && !(j == 0 && v->pro != AMPC_VALUE_NONE) && T - 1 - k > dies[r]) dies[r] = T - 1 - k;
    }
    ampc_value x = pro_read(g, v);
    if (x != AMPC_VALUE_NONE) {
      last_read[x] = k;
      if (T - 1 - k > dies[x]) dies[x] = T - 1 - k; /* its weight gradient reads it too */
    }
    if (bwd_reads_output(v) && T - 1 - k > dies[id]) dies[id] = T - 1 - k;
  }
  for (size_t i = 0; st == 0 && i < nv; i++)
    if (last_use[i] < 0) forever[i] = 1; /* an output: nothing consumes it */
  /* forward: the leaves the user reads for good, then each op's output */
  for (size_t i = 0; st == 0 && acts && i < nv; i++) {
    ampc__value *v = &g->v[i];
    if ((v->op != AMPC_OP_INPUT && v->op != AMPC_OP_LABELS) || v->alias != AMPC_VALUE_NONE) continue;
    v->act_off = plan_alloc(&a, ampc__align64(ampc__value_bytes(v)));
    live_by_type[v->dtype] += ampc__value_bytes(v);
  }
  for (int64_t k = 0; st == 0 && acts && k < T; k++) {
    ampc_value id = g->order[k];
    ampc__value *v = &g->v[id];
    if (v->alias != AMPC_VALUE_NONE || v->act_off != SIZE_MAX || v->op <= AMPC_OP_BUFFER) continue;
    if (!v->attr.nostore) {
      v->act_off = plan_alloc(&a, ampc__align64(ampc__value_bytes(v)));
      live_by_type[v->dtype] += ampc__value_bytes(v);
      PLAN_PEAK();
    }
    PLAN_WS(v, 0);
    for (int j = 0; j <= v->n_in; j++) { /* (j = n_in: what a prologue reads) */
      ampc_value r = j < v->n_in ? (v->in[j] < 0 ? AMPC_VALUE_NONE : ampc__graph_root(g, v->in[j])) : pro_read(g, v);
      if (r == AMPC_VALUE_NONE) continue;
      ampc__value *rv = &g->v[r];
      if (forever[r] || dies[r] >= 0 || gone[r] || last_read[r] != k || rv->act_off == SIZE_MAX || rv->op <= AMPC_OP_BUFFER)
        continue;
      gone[r] = 1;
      PLAN_FREE(rv->act_off, rv);
    }
  }
  /* backward */
  for (int64_t b = 0; st == 0 && grads && b < T; b++) {
    int64_t t = T - 1 - b;
    ampc_value id = g->order[t];
    ampc__value *v = &g->v[id];
    for (int j = 0; j < v->n_in && v->alias == AMPC_VALUE_NONE; j++) {
      if (v->in[j] < 0) continue;
      ampc_value r = ampc__graph_root(g, v->in[j]);
      ampc__value *rv = &g->v[r];
      if (!rv->requires_grad || rv->op <= AMPC_OP_BUFFER || rv->grad_off != SIZE_MAX || last_use[r] != t) continue;
      rv->grad_off = plan_alloc(&a, ampc__align64(ampc__value_bytes(rv)));
      live_by_type[rv->dtype] += ampc__value_bytes(rv);
      PLAN_PEAK();
    }
    if (v->alias == AMPC_VALUE_NONE && v->op > AMPC_OP_BUFFER) PLAN_WS(v, 1);
    /* after this op's backward its own output gradient is dead */
    if (v->alias == AMPC_VALUE_NONE && v->grad_off != SIZE_MAX && !g->retain_grads) PLAN_FREE(v->grad_off, v);
    /* in one arena: so are the activations it read last */
    for (size_t i = 0; st == 0 && acts && i < nv; i++) {
      ampc__value *x = &g->v[i];
      if (dies[i] != b || forever[i] || gone[i] || x->act_off == SIZE_MAX || x->op <= AMPC_OP_BUFFER) continue;
      gone[i] = 1;
      x->bw_freed = 1;
      PLAN_FREE(x->act_off, x);
    }
  }
  PLAN_PEAK();
#undef PLAN_PEAK
#undef PLAN_FREE
#undef PLAN_WS
  /* anything left unplaced (not reached by the order) gets its own space */
  for (size_t i = 0; st == 0 && acts && i < nv; i++) {
    ampc__value *v = &g->v[i];
    if (v->op == AMPC_OP_PARAM || v->op == AMPC_OP_BUFFER || v->alias != AMPC_VALUE_NONE || v->act_off != SIZE_MAX ||
        v->attr.nostore)
      continue;
    v->act_off = peak;
    peak += ampc__align64(ampc__value_bytes(v));
    peak_by_type[v->dtype] += ampc__value_bytes(v);
  }
  *arena = peak;
  free(last_use);
  free(last_read);
  free(dies);
  free(forever);
  free(gone);
  free(a.off);
  free(a.len);
  return st;
}

ampc_status ampc__graph_plan_activations(ampc_graph *g, size_t *arena, size_t *peak_by_type) {
  return plan(g, 1, 0, arena, peak_by_type, NULL);
}

ampc_status ampc__graph_plan_activation_grads(ampc_graph *g, size_t *arena, size_t *peak_by_type) {
  return plan(g, 0, 1, arena, peak_by_type, NULL);
}

ampc_status ampc__graph_plan_joint(ampc_graph *g, size_t *arena, size_t *peak_by_type, size_t *peak_ws) {
  return plan(g, 1, 1, arena, peak_by_type, peak_ws);
}
