/* The in-process communicator: N ranks as N threads of one process, meeting
 * at a barrier. Each collective copies every rank's values to the host (as
 * f32, or doubles for host values), reduces them in rank order -- so every
 * rank computes the same bits -- and writes the result back in the buffer's
 * own type. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/status_internal.h"
#include "dist/comm_internal.h"

typedef struct {
  pthread_barrier_t barrier;
  int size, refs;
  pthread_mutex_t lock;
  float **in;     /* per rank: its values as f32 */
  size_t *cap;    /* per rank: floats allocated in in[r] */
  size_t *count;  /* per rank: this collective's element count */
  double **host;  /* per rank: allreduce_host's values */
  size_t *hcap;   /* per rank: doubles allocated in host[r] */
} local_group;

typedef struct {
  local_group *g;
  float *out; /* this rank's result */
  size_t out_cap;
  double *hout; /* ... of allreduce_host */
  size_t hout_cap;
} local_rank;

static ampc_status grow(float **p, size_t *cap, size_t n) {
  if (n <= *cap) return AMPC_OK;
  float *q = realloc(*p, n * sizeof *q);
  if (!q) return ampc__error(AMPC_ENOMEM, "comm: out of memory for %zu values", n);
  *p = q;
  *cap = n;
  return AMPC_OK;
}

static ampc_status grow_d(double **p, size_t *cap, size_t n) {
  if (n <= *cap) return AMPC_OK;
  double *q = realloc(*p, n * sizeof *q);
  if (!q) return ampc__error(AMPC_ENOMEM, "comm: out of memory for %zu values", n);
  *p = q;
  *cap = n;
  return AMPC_OK;
}

static ampc_status local_allreduce(ampc_comm *c, ampc__device *d, void *buf, ampc_dtype t, size_t n, ampc__reduce_op op) {
  local_rank *me = c->impl;
  local_group *g = me->g;
  int r = c->rank, N = g->size;
  ampc_status s = grow(&g->in[r], &g->cap[r], n);
  if (s == 0) s = grow(&me->out, &me->out_cap, n);
  if (s == 0) s = ampc__dev_read(d, g->in[r], AMPC_DTYPE_F32, buf, t, n);
  g->count[r] = s == 0 ? n : SIZE_MAX;
  pthread_barrier_wait(&g->barrier);
  int agree = 1;
  for (int k = 0; k < N; k++) agree &= g->count[k] == n;
  if (agree) {
    float inv = 1.0f / (float)N;
    for (size_t i = 0; i < n; i++) {
      float acc = op == AMPC__REDUCE_MAX || op == AMPC__REDUCE_MIN ? g->in[0][i] : 0.0f;
      for (int k = 0; k < N; k++) {
        float v = g->in[k][i];
        if (op == AMPC__REDUCE_MAX) acc = v > acc || v != v ? v : acc;
        else if (op == AMPC__REDUCE_MIN) acc = v < acc || v != v ? v : acc;
        else acc += op == AMPC__REDUCE_AVG ? v * inv : v;
      }
      me->out[i] = acc;
    }
  }
  pthread_barrier_wait(&g->barrier);
  if (s < 0) return s;
  if (!agree) return ampc__error(AMPC_ESTATE, "comm: rank %d all-reduces %zu values, another rank a different count (or failed)", r, n);
  return ampc__dev_write(d, buf, t, me->out, AMPC_DTYPE_F32, n);
}

static ampc_status local_allreduce_host(ampc_comm *c, double *buf, size_t n, ampc__reduce_op op) {
  local_rank *me = c->impl;
  local_group *g = me->g;
  int r = c->rank, N = g->size;
  ampc_status s = grow_d(&g->host[r], &g->hcap[r], n);
  if (s == 0) s = grow_d(&me->hout, &me->hout_cap, n);
  if (s == 0) memcpy(g->host[r], buf, n * sizeof *buf);
  g->count[r] = s == 0 ? n : SIZE_MAX;
  pthread_barrier_wait(&g->barrier);
  int agree = 1;
  for (int k = 0; k < N; k++) agree &= g->count[k] == n;
  for (size_t i = 0; agree && i < n; i++) {
    double acc = op == AMPC__REDUCE_MAX || op == AMPC__REDUCE_MIN ? g->host[0][i] : 0.0;
    for (int k = 0; k < N; k++) {
      double v = g->host[k][i];
      if (op == AMPC__REDUCE_MAX) acc = v > acc || v != v ? v : acc;
      else if (op == AMPC__REDUCE_MIN) acc = v < acc || v != v ? v : acc;
      else acc += op == AMPC__REDUCE_AVG ? v / N : v;
    }
    me->hout[i] = acc;
  }
  pthread_barrier_wait(&g->barrier);
  if (s < 0) return s;
  if (!agree) return ampc__error(AMPC_ESTATE, "comm: rank %d reduces %zu values, another rank a different count (or failed)", r, n);
  memcpy(buf, me->hout, n * sizeof *buf);
  return AMPC_OK;
}

static void group_unref(local_group *g) {
  pthread_mutex_lock(&g->lock);
  int last = --g->refs == 0;
  pthread_mutex_unlock(&g->lock);
  if (!last) return;
  pthread_barrier_destroy(&g->barrier);
  pthread_mutex_destroy(&g->lock);
  for (int k = 0; k < g->size; k++) free(g->in[k]), free(g->host[k]);
  free(g->in);
  free(g->cap);
  free(g->count);
  free(g->host);
  free(g->hcap);
  free(g);
}

static void local_free(ampc_comm *c) {
  local_rank *me = c->impl;
  free(me->out);
  free(me->hout);
  group_unref(me->g);
  free(me);
  free(c);
}

/* no non-blocking or sharded collectives of its own: the generic ones
 * (comm.c) build them from the all-reduce */
static const ampc__comm_ops local_ops = {.name = "local", .allreduce = local_allreduce, .allreduce_host = local_allreduce_host,
                                         .free = local_free};

ampc_status ampc_comm_local_create(ampc_comm **out, int n) {
  if (!out) return ampc__error(AMPC_EINVAL, "ampc_comm_local_create: out is NULL");
  if (n < 1 || n > 1024) return ampc__error(AMPC_EINVAL, "comm: %d ranks (expected 1..1024)", n);
  for (int r = 0; r < n; r++) out[r] = NULL;
  local_group *g = calloc(1, sizeof *g);
  if (!g) return ampc__error(AMPC_ENOMEM, "comm: out of memory");
  g->size = n;
  g->in = calloc((size_t)n, sizeof *g->in);
  g->cap = calloc((size_t)n, sizeof *g->cap);
  g->count = calloc((size_t)n, sizeof *g->count);
  g->host = calloc((size_t)n, sizeof *g->host);
  g->hcap = calloc((size_t)n, sizeof *g->hcap);
  if (!g->in || !g->cap || !g->count || !g->host || !g->hcap || pthread_barrier_init(&g->barrier, NULL, (unsigned)n) != 0) {
    free(g->in), free(g->cap), free(g->count), free(g->host), free(g->hcap), free(g);
    return ampc__error(AMPC_ENOMEM, "comm: out of memory");
  }
  pthread_mutex_init(&g->lock, NULL);
  for (int r = 0; r < n; r++) {
    ampc_comm *c = calloc(1, sizeof *c);
    local_rank *me = calloc(1, sizeof *me);
    if (!c || !me) {
      free(c), free(me);
      for (int k = 0; k < r; k++) ampc_comm_free(out[k]), out[k] = NULL;
      if (r == 0) {
        g->refs = 1;
        group_unref(g);
      }
      return ampc__error(AMPC_ENOMEM, "comm: out of memory");
    }
    me->g = g;
    g->refs++;
    *c = (ampc_comm){&local_ops, r, n, r, n, me};
    out[r] = c;
  }
  return AMPC_OK;
}
