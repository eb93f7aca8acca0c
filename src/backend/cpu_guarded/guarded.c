/* The guarded cpu backend: the cpu kernels over device memory that is mapped
 * with no access whenever control is outside a backend call. Every buffer is
 * its own mapping; entering any call of the interface opens them all and
 * leaving it closes them again, so a load or store through a device pointer
 * anywhere else -- a tool, the amp layer, a test -- faults at once
 * (SIGSEGV). The results are the cpu backend's, bit for bit: the same
 * kernels run on the same values. Meant for tests; slow where there are
 * many large buffers (each call changes every mapping's protection twice). */
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "backend/cpu/cpu_internal.h"

typedef struct {
  void *p;
  size_t len;
} region;

typedef struct {
  ampc__device *cpu; /* the cpu device whose kernels run */
  region *r;
  size_t n, cap;
  int depth;         /* nesting of calls in progress */
  size_t page;
} guarded;

static guarded *G(ampc__device *d) { return d->impl; }

static void protect_all(guarded *g, int prot) {
  for (size_t i = 0; i < g->n; i++)
    if (mprotect(g->r[i].p, g->r[i].len, prot) != 0) AMPC_ASSERT(!"mprotect failed");
}

static void enter(ampc__device *d) {
  guarded *g = G(d);
  if (g->depth++ == 0) protect_all(g, PROT_READ | PROT_WRITE);
}
static void leave(ampc__device *d) {
  guarded *g = G(d);
  if (--g->depth == 0) protect_all(g, PROT_NONE);
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
  void *p = mmap(NULL, len, g->depth ? PROT_READ | PROT_WRITE : PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
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

/* Each call: open the memory, run the cpu backend's own, close it again. */
#define WRAP(call) \
  do {             \
    enter(d);      \
    ampc_status s_ = (call); \
    leave(d);      \
    return s_;     \
  } while (0)

static ampc_status gd_write(ampc__device *d, void *dst, ampc_dtype dt, const void *src, ampc_dtype st, size_t n) {
  WRAP(ampc__backend_cpu.write(G(d)->cpu, dst, dt, src, st, n));
}
static ampc_status gd_read(ampc__device *d, void *dst, ampc_dtype dt, const void *src, ampc_dtype st, size_t n) {
  WRAP(ampc__backend_cpu.read(G(d)->cpu, dst, dt, src, st, n));
}
static ampc_status gd_copy(ampc__device *d, void *dst, const void *src, size_t bytes) {
  WRAP(ampc__backend_cpu.copy(G(d)->cpu, dst, src, bytes));
}
static ampc_status gd_set(ampc__device *d, void *dst, int byte, size_t bytes) {
  WRAP(ampc__backend_cpu.set(G(d)->cpu, dst, byte, bytes));
}
static ampc_status gd_synchronize(ampc__device *d) { return AMPC_OK; }
static int gd_supports(const ampc__device *d, ampc_op_kind op, ampc_dtype t) {
  return ampc__backend_cpu.supports(((const guarded *)d->impl)->cpu, op, t);
}
static ampc_status gd_run(ampc__device *d, const ampc__op_call *c, int backward) {
  guarded *g = G(d);
  g->cpu->count_underflow = d->count_underflow;
  g->cpu->opts.profiling = d->opts.profiling;
  WRAP(ampc__backend_cpu.run(g->cpu, c, backward));
}
static size_t gd_workspace(ampc__device *d, const ampc__op_call *c) { return ampc__backend_cpu.workspace(G(d)->cpu, c); }
static size_t gd_aux_floats(ampc__device *d, const ampc__op_call *c) { return ampc__backend_cpu.aux_floats(G(d)->cpu, c); }
static ampc_status gd_check(ampc__device *d, const ampc__span *s, int ns, float gmul, int want_max, const float *slots,
                            int nslots, float *slots_out, ampc__check *out) {
  WRAP(ampc__backend_cpu.check(G(d)->cpu, s, ns, gmul, want_max, slots, nslots, slots_out, out));
}
static ampc_status gd_fold(ampc__device *d, const ampc__span *s, int ns, float *dst, float mul, int accumulate,
                           float *slot, float max_div) {
  WRAP(ampc__backend_cpu.fold(G(d)->cpu, s, ns, dst, mul, accumulate, slot, max_div));
}
static ampc_status gd_nonfinite(ampc__device *d, const ampc__span *s, int ns, const size_t *ranges, size_t nranges,
                                float gmul, unsigned char *flags) {
  WRAP(ampc__backend_cpu.nonfinite(G(d)->cpu, s, ns, ranges, nranges, gmul, flags));
}
static ampc_status gd_update(ampc__device *d, const ampc__span *s, int ns, const ampc__update *u) {
  WRAP(ampc__backend_cpu.update(G(d)->cpu, s, ns, u));
}
static void gd_stats(ampc__device *d, ampc_backend_stats *out, int reset) { ampc__backend_cpu.stats(G(d)->cpu, out, reset); }

const ampc__backend ampc__backend_cpu_guarded = {
    .name = "cpu-guarded",
    .host_memory = 0,
    .create = gd_create,
    .destroy = gd_destroy,
    .alloc = gd_alloc,
    .free = gd_free,
    .write = gd_write,
    .read = gd_read,
    .copy = gd_copy,
    .set = gd_set,
    .synchronize = gd_synchronize,
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
