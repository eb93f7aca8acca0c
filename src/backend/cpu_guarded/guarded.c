/* The guarded cpu backend: the cpu kernels over device memory that is mapped
 * with no access whenever control is outside a backend call. Every buffer is
 * its own mapping, inaccessible (PROT_NONE) from the start; a call of the
 * interface opens exactly the memory it was given -- the pages under the op
 * call's tensors, aux state and workspace, under a pass's spans, masters and
 * optimizer state, under a copy's destination -- runs the cpu backend's own
 * code, and closes them again. So a load or store through a device pointer
 * anywhere else (a tool, the amp layer, a test), or by a kernel outside the
 * memory its call names, faults at once (SIGSEGV). The results are the cpu
 * backend's, bit for bit: the same kernels run on the same values. */
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "backend/cpu/cpu_internal.h"

typedef struct {
  void *p;
  size_t len;
} region;

enum { GD_MAX_OPEN = 64 };

typedef struct {
  ampc__device *cpu; /* the cpu device whose kernels run */
  region *r;
  size_t n, cap;
  region open[GD_MAX_OPEN]; /* what the call in progress opened */
  int nopen;
  size_t page;
} guarded;

static guarded *G(ampc__device *d) { return d->impl; }

/* Opens the pages under [p, p + bytes) for the call in progress. */
static void open_range(guarded *g, const void *p, size_t bytes) {
  if (!p || !bytes) return;
  uintptr_t lo = (uintptr_t)p / g->page * g->page, hi = ((uintptr_t)p + bytes + g->page - 1) / g->page * g->page;
  AMPC_ASSERT(g->nopen < GD_MAX_OPEN);
  if (mprotect((void *)lo, hi - lo, PROT_READ | PROT_WRITE) != 0) AMPC_ASSERT(!"cpu-guarded: mprotect failed");
  g->open[g->nopen++] = (region){(void *)lo, hi - lo};
}
static void open_tensor(guarded *g, const ampc_tensor *t) {
  if (t->data) open_range(g, t->data, ampc_tensor_nbytes(t));
}

/* Closes everything the call opened. */
static void close_all(guarded *g) {
  for (int i = 0; i < g->nopen; i++)
    if (mprotect(g->open[i].p, g->open[i].len, PROT_NONE) != 0) AMPC_ASSERT(!"cpu-guarded: mprotect failed");
  g->nopen = 0;
}

ampc__device *ampc__cpu_device_of(ampc__device *d) { return d->be == &ampc__backend_cpu_guarded ? G(d)->cpu : d; }

static ampc_status gd_create(ampc__device *d) {
  guarded *g = calloc(1, sizeof *g);
  if (!g) return ampc__error(AMPC_ENOMEM, "out of memory");
  g->page = (size_t)sysconf(_SC_PAGESIZE);
  ampc_status s = ampc__device_create(&g->cpu, "cpu", &d->opts);
  if (s < 0) {
    free(g);
    return s;
  }
  d->opts = g->cpu->opts; /* as the cpu device resolved them */
  d->impl = g;
  return AMPC_OK;
}

static void gd_destroy(ampc__device *d) {
  guarded *g = G(d);
  if (!g) return;
  for (size_t i = 0; i < g->n; i++) munmap(g->r[i].p, g->r[i].len);
  free(g->r);
  ampc__device_unref(g->cpu);
  free(g);
}

static void *gd_alloc(ampc__device *d, size_t bytes) {
  guarded *g = G(d);
  if (g->n == g->cap) {
    size_t cap = g->cap ? 2 * g->cap : 32;
    region *r = realloc(g->r, cap * sizeof *r);
    if (!r) return NULL;
    g->r = r;
    g->cap = cap;
  }
  size_t len = ((bytes ? bytes : 1) + g->page - 1) / g->page * g->page;
  void *p = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return NULL;
  g->r[g->n++] = (region){p, len};
  return p;
}

static void gd_free(ampc__device *d, void *p) {
  guarded *g = G(d);
  for (size_t i = 0; i < g->n; i++)
    if (g->r[i].p == p) {
      munmap(p, g->r[i].len);
      g->r[i] = g->r[--g->n];
      return;
    }
  AMPC_ASSERT(!"cpu-guarded: free of memory this device did not allocate");
}

/* Each call: open the memory it names, run the cpu backend's own, close. */
#define RUN(call)      \
  do {                 \
    ampc_status s_ = (call); \
    close_all(g);      \
    return s_;         \
  } while (0)

static ampc_status gd_write(ampc__device *d, void *dst, ampc_dtype dt, const void *src, ampc_dtype st, size_t n) {
  guarded *g = G(d);
  open_range(g, dst, n * ampc_dtype_size(dt));
  RUN(ampc__backend_cpu.write(g->cpu, dst, dt, src, st, n));
}
static ampc_status gd_read(ampc__device *d, void *dst, ampc_dtype dt, const void *src, ampc_dtype st, size_t n) {
  guarded *g = G(d);
  open_range(g, src, n * ampc_dtype_size(st));
  RUN(ampc__backend_cpu.read(g->cpu, dst, dt, src, st, n));
}
static ampc_status gd_copy(ampc__device *d, void *dst, const void *src, size_t bytes) {
  guarded *g = G(d);
  open_range(g, dst, bytes);
  open_range(g, src, bytes);
  RUN(ampc__backend_cpu.copy(g->cpu, dst, src, bytes));
}
static ampc_status gd_set(ampc__device *d, void *dst, int byte, size_t bytes) {
  guarded *g = G(d);
  open_range(g, dst, bytes);
  RUN(ampc__backend_cpu.set(g->cpu, dst, byte, bytes));
}
static ampc_status gd_synchronize(ampc__device *d) { return AMPC_OK; }
static uint64_t gd_capacity(ampc__device *d) { return ampc__backend_cpu.capacity(G(d)->cpu); }
static int gd_supports(const ampc__device *d, ampc_op_kind op, ampc_dtype t) {
  return ampc__backend_cpu.supports(((const guarded *)d->impl)->cpu, op, t);
}
static ampc_status gd_run(ampc__device *d, const ampc__op_call *c, int backward) {
  guarded *g = G(d);
  g->cpu->count_underflow = d->count_underflow;
  g->cpu->opts.profiling = d->opts.profiling;
  for (int j = 0; j < c->n_in; j++) {
    open_tensor(g, &c->in[j]);
    open_tensor(g, &c->din[j]);
  }
  open_tensor(g, &c->out);
  open_tensor(g, &c->dout);
  open_range(g, c->aux, ampc__backend_cpu.aux_floats(g->cpu, c) * sizeof(float));
  open_range(g, c->ws, c->ws_size);
  if (c->pro) open_range(g, c->pro, 2 * (size_t)c->in[0].shape.d[1] * sizeof(float));
  RUN(ampc__backend_cpu.run(g->cpu, c, backward));
}
static size_t gd_workspace(ampc__device *d, const ampc__op_call *c) { return ampc__backend_cpu.workspace(G(d)->cpu, c); }
static size_t gd_aux_floats(ampc__device *d, const ampc__op_call *c) { return ampc__backend_cpu.aux_floats(G(d)->cpu, c); }

/* The gradients of the spans (and their model copies when asked). */
static void open_spans(guarded *g, const ampc__span *s, int ns, int models) {
  for (int i = 0; i < ns; i++) {
    open_range(g, s[i].grad, s[i].n * ampc_dtype_size(s[i].grad_type));
    if (models) open_range(g, s[i].model, s[i].n * ampc_dtype_size(s[i].type));
  }
}
/* The elements of a flat f32 array (masters, state, f32 gradients) under the spans. */
static void open_flat(guarded *g, const float *a, const ampc__span *s, int ns) {
  for (int i = 0; a && i < ns; i++) open_range(g, a + s[i].start, s[i].n * sizeof(float));
}

static ampc_status gd_check(ampc__device *d, const ampc__span *s, int ns, float gmul, int want_max, const float *slots,
                            int nslots, float *slots_out, ampc__check *out) {
  guarded *g = G(d);
  open_spans(g, s, ns, 0);
  open_range(g, slots, (size_t)nslots * sizeof(float));
  RUN(ampc__backend_cpu.check(g->cpu, s, ns, gmul, want_max, slots, nslots, slots_out, out));
}
static ampc_status gd_fold(ampc__device *d, const ampc__span *s, int ns, float *dst, float mul, int accumulate,
                           float *slot, float max_div) {
  guarded *g = G(d);
  open_spans(g, s, ns, 0);
  open_flat(g, dst, s, ns);
  open_range(g, slot, 2 * sizeof(float));
  RUN(ampc__backend_cpu.fold(g->cpu, s, ns, dst, mul, accumulate, slot, max_div));
}
static ampc_status gd_nonfinite(ampc__device *d, const ampc__span *s, int ns, const size_t *ranges, size_t nranges,
                                float gmul, unsigned char *flags) {
  guarded *g = G(d);
  open_spans(g, s, ns, 0);
  RUN(ampc__backend_cpu.nonfinite(g->cpu, s, ns, ranges, nranges, gmul, flags));
}
static ampc_status gd_update(ampc__device *d, const ampc__span *s, int ns, const ampc__update *u) {
  guarded *g = G(d);
  open_spans(g, s, ns, 1);
  open_flat(g, u->master, s, ns);
  for (int k = 0; k < 3; k++) open_flat(g, u->state[k], s, ns);
  RUN(ampc__backend_cpu.update(g->cpu, s, ns, u));
}
static void gd_stats(ampc__device *d, ampc_backend_stats *out, int reset) { ampc__backend_cpu.stats(G(d)->cpu, out, reset); }

const ampc__backend ampc__backend_cpu_guarded = {
    .name = "cpu-guarded",
    .host_memory = 0,
    .sync_batchnorm = 1,
    .conv_prologue = 1,
    .create = gd_create,
    .destroy = gd_destroy,
    .alloc = gd_alloc,
    .free = gd_free,
    .write = gd_write,
    .read = gd_read,
    .copy = gd_copy,
    .set = gd_set,
    .synchronize = gd_synchronize,
    .capacity = gd_capacity,
    .supports = gd_supports,
    .run = gd_run,
    .workspace = gd_workspace,
    .aux_floats = gd_aux_floats,
    .check = gd_check,
    .fold = gd_fold,
    .nonfinite = gd_nonfinite,
    .update = gd_update,
    .stats = gd_stats,
};
