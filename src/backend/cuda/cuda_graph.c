/* CUDA graphs for the sequence of ops between two other device calls.
 *
 * A training step reaches the device as a run of op calls -- forward, then
 * backward -- between calls of other kinds (the input's write before, the
 * step's check after). Launching each kernel costs the host microseconds,
 * which at small batches is longer than the GPU takes to run it. So the
 * backend keeps the last run of calls (a segment) and counts how often the
 * same run, call for call (every pointer, shape, flag and the loss's seed),
 * came again. Once it has repeated, the next segment that starts with the
 * same call is not executed as it comes: its calls are only compared with
 * the recorded ones. When the segment ends (any other device call) and every
 * call matched, the recorded segment runs as one CUDA graph -- captured the
 * first time, replayed after; at the first call that differs, the matched
 * calls run as usual, and so does everything after. Nothing can observe the
 * difference: device memory is only seen through calls that end the segment
 * first, and a replay is the same kernels on the same memory. A capture
 * that fails turns graphs off for the device. */
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_internal.h"

struct ampc__cu_graphs {
  ampc__cu_call *prev, *cur;  /* the recorded segment; the one in progress */
  size_t nprev, ncur, cap_prev, cap_cur;
  int repeats;                /* times the recorded segment came again in a row */
  int deferring;              /* comparing, not executing */
  size_t matched;
  cudaGraph_t graph;
  cudaGraphExec_t exec;       /* the recorded segment, captured */
  int off;                    /* a capture failed */
};

/* graphs captured and launched so far (the tests read them) */
int64_t ampc__cu_graph_captures, ampc__cu_graph_launches;

static int same_call(const ampc__cu_call *a, const ampc__op_call *c, int backward, int counting) {
  return a->backward == backward && a->counting == counting && memcmp(&a->c, c, sizeof *c) == 0;
}

static int append(ampc__cu_graphs *g, const ampc__op_call *c, int backward, int counting) {
  if (g->ncur == g->cap_cur) {
    size_t cap = g->cap_cur ? 2 * g->cap_cur : 256;
    ampc__cu_call *n = realloc(g->cur, cap * sizeof *n);
    if (!n) return -1;
    g->cur = n;
    g->cap_cur = cap;
  }
  ampc__cu_call *e = &g->cur[g->ncur++];
  memset(e, 0, sizeof *e);
  e->c = *c;
  e->backward = backward;
  e->counting = counting;
  return 0;
}

static void drop_exec(ampc__cu_graphs *g) {
  if (g->exec) cudaGraphExecDestroy(g->exec);
  if (g->graph) cudaGraphDestroy(g->graph);
  g->exec = NULL;
  g->graph = NULL;
}

void ampc__cu_graphs_free(ampc__device *d) {
  ampc__cu_graphs *g = ampc__cu_of(d)->graphs;
  if (!g) return;
  drop_exec(g);
  free(g->prev);
  free(g->cur);
  free(g);
  ampc__cu_of(d)->graphs = NULL;
}

static int enabled(ampc__device *d) { return !d->opts.no_cuda_graphs && !d->opts.profiling; }

/* The recorded calls [0, n) as usual. */
static ampc_status run_recorded(ampc__device *d, size_t n) {
  ampc__cu_graphs *g = ampc__cu_of(d)->graphs;
  for (size_t i = 0; i < n; i++) AMPC_TRY(ampc__cu_run(d, &g->prev[i].c, g->prev[i].backward));
  return AMPC_OK;
}

/* The recorded segment as a graph: captured now if it is not yet. */
static ampc_status replay(ampc__device *d) {
  ampc__cuda_dev *cd = ampc__cu_of(d);
  ampc__cu_graphs *g = cd->graphs;
  if (!g->exec) {
    cudaGraph_t graph = NULL;
    if (cudaStreamBeginCapture(cd->stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
      cudaGetLastError();
      g->off = 1;
      return run_recorded(d, g->nprev);
    }
    ampc_status s = run_recorded(d, g->nprev);
    cudaError_t e = cudaStreamEndCapture(cd->stream, &graph);
    if (s == 0 && e == cudaSuccess && graph && cudaGraphInstantiate(&g->exec, graph, 0) == cudaSuccess) {
      g->graph = graph;
      ampc__cu_graph_captures++;
    } else {
      /* not capturable: from now on as usual */
      cudaGetLastError();
      if (graph) cudaGraphDestroy(graph);
      g->exec = NULL;
      g->off = 1;
      return run_recorded(d, g->nprev);
    }
  }
  AMPC_CU_TRY(cudaGraphLaunch(g->exec, cd->stream), "launching a CUDA graph");
  ampc__cu_graph_launches++;
  return AMPC_OK;
}

int ampc__cu_graph_defer(ampc__device *d, const ampc__op_call *c, int backward, ampc_status *st) {
  ampc__cuda_dev *cd = ampc__cu_of(d);
  *st = AMPC_OK;
  if (!enabled(d) || (cd->graphs && cd->graphs->off)) return 0;
  if (!cd->graphs && !(cd->graphs = calloc(1, sizeof *cd->graphs))) return 0;
  ampc__cu_graphs *g = cd->graphs;
  int counting = ampc__cu_counters(d, backward) != NULL;
  if (!g->deferring && g->ncur == 0 && g->repeats >= 1 && g->nprev > 0 && same_call(&g->prev[0], c, backward, counting)) {
    g->deferring = 1;
    g->matched = 0;
  }
  if (g->deferring) {
    if (g->matched < g->nprev && same_call(&g->prev[g->matched], c, backward, counting)) {
      if (append(g, c, backward, counting) < 0) {
        g->off = 1;
        g->deferring = 0;
        *st = run_recorded(d, g->matched);
        return 0;
      }
      g->matched++;
      return 1;
    }
    /* it parts from the recorded segment: what matched runs now */
    g->deferring = 0;
    *st = run_recorded(d, g->matched);
    if (*st < 0) return 1;
  }
  if (append(g, c, backward, counting) < 0) g->off = 1;
  return 0;
}

ampc_status ampc__cu_graph_flush(ampc__device *d) {
  ampc__cu_graphs *g = ampc__cu_of(d)->graphs;
  if (!g) return AMPC_OK;
  ampc_status s = AMPC_OK;
  if (g->deferring) {
    g->deferring = 0;
    s = g->matched == g->nprev ? replay(d) : run_recorded(d, g->matched);
  }
  if (g->ncur) {
    int same = g->ncur == g->nprev;
    for (size_t i = 0; same && i < g->ncur; i++)
      same = same_call(&g->prev[i], &g->cur[i].c, g->cur[i].backward, g->cur[i].counting);
    if (same) {
      g->repeats++;
    } else {
      ampc__cu_call *t = g->prev;
      size_t tc = g->cap_prev;
      g->prev = g->cur;
      g->cap_prev = g->cap_cur;
      g->nprev = g->ncur;
      g->cur = t;
      g->cap_cur = tc;
      g->repeats = 0;
      drop_exec(g);
    }
    g->ncur = 0;
  }
  return s;
}
