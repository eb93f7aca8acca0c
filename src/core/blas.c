/* Which kernels OpenBLAS chose for this CPU, and whether they fit it.
 *
 * OpenBLAS (the DYNAMIC_ARCH builds distributions ship) picks its kernels
 * once, as it is loaded, from the CPU's family and model numbers. A CPU newer
 * than the OpenBLAS build gets no match and falls back to the SSE3 kernels
 * ("Prescott"): OpenBLAS 0.3.21 (Debian 12's) does so on Xeons of model 207
 * (Emerald Rapids), where its sgemm then runs at a fifth of the speed of the
 * AVX-512 kernels ("SkylakeX"). The environment variable OPENBLAS_CORETYPE
 * overrides the choice, but only if it is set before the library is loaded:
 * the ampc program re-executes itself with it (tools/ampc/main.c). */
#include <pthread.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include "ampc/version.h"
#include "core/dtype_internal.h"
#include "core/status_internal.h"

/* OpenBLAS's own queries (its cblas.h declares them). */
char *openblas_get_corename(void);
char *openblas_get_config(void);

/* OpenBLAS's x86 kernel sets without AVX2 and FMA in their sgemm. */
static const char *const pre_avx2[] = {"Unknown",  "Katmai",     "Coppermine",   "Northwood", "Prescott",    "Banias",
                                       "Atom",     "Core2",      "Penryn",       "Dunnington", "Nehalem",    "Athlon",
                                       "Opteron",  "Opteron_SSE3", "Barcelona",  "Nano",      "Sandybridge", "Bobcat",
                                       "Bulldozer", "Piledriver", "Steamroller"};
/* Its x86 kernel sets with AVX2 and FMA but not AVX-512. */
static const char *const avx2_only[] = {"Haswell", "Zen", "Excavator"};
static int in_list(const char *core, const char *const *list, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (strcasecmp(core, list[i]) == 0) return 1;
  return 0;
}

const char *ampc__blas_better_core(const char *core, int avx2_fma, int avx512) {
  if (!core) return NULL;
  if (in_list(core, pre_avx2, sizeof pre_avx2 / sizeof *pre_avx2)) return avx512 ? "SkylakeX" : avx2_fma ? "Haswell" : NULL;
  /* AVX2 kernels on an AVX-512 CPU: OpenBLAS 0.3.21 picks its AVX-512 sets
   * by itself on such a CPU, so this is an OPENBLAS_CORETYPE at work (on an
   * AMD EPYC of family 26 its Haswell set ran ResNet-18 O2 at 0.7x the speed
   * of the Cooperlake set it chose) */
  if (avx512 && in_list(core, avx2_only, sizeof avx2_only / sizeof *avx2_only)) return "SkylakeX";
  return NULL;
}

const char *ampc_blas_core(void) {
  const char *c = openblas_get_corename();
  return c ? c : "unknown";
}

const char *ampc_blas_better_core(void) {
  return ampc__blas_better_core(ampc_blas_core(), ampc__cpu_has_avx2_f16c(), ampc__cpu_has_avx512());
}

/* "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH ...": its first two words, made
 * once (a static string, as version.h says: the same pointer on every
 * thread, valid for the life of the process) */
static char blas_name[64] = "OpenBLAS";
static pthread_once_t blas_name_once = PTHREAD_ONCE_INIT;
static void blas_name_make(void) {
  const char *cfg = openblas_get_config();
  if (!cfg) return;
  const char *sp = strchr(cfg, ' ');
  if (sp) sp = strchr(sp + 1, ' ');
  size_t n = sp ? (size_t)(sp - cfg) : strlen(cfg);
  if (n >= sizeof blas_name) n = sizeof blas_name - 1;
  memcpy(blas_name, cfg, n);
  blas_name[n] = '\0';
}

const char *ampc_blas_name(void) {
  pthread_once(&blas_name_once, blas_name_make);
  return blas_name;
}

/* the address-space and data limits, each flagged where set */
static void mem_limits(struct rlimit *as, int *has_as, struct rlimit *ds, int *has_ds) {
  *has_as = getrlimit(RLIMIT_AS, as) == 0 && as->rlim_cur != RLIM_INFINITY;
  *has_ds = getrlimit(RLIMIT_DATA, ds) == 0 && ds->rlim_cur != RLIM_INFINITY;
}

int ampc__mem_limited(void) {
  struct rlimit as, ds;
  int has_as, has_ds;
  mem_limits(&as, &has_as, &ds, &has_ds);
  return has_as || has_ds;
}

ampc_status ampc__blas_room(int buffers, const char *what) {
  if (buffers <= 0) return AMPC_OK;
  struct rlimit as, ds;
  int has_as, has_ds;
  mem_limits(&as, &has_as, &ds, &has_ds);
  if (!has_as && !has_ds) return AMPC_OK;
  size_t need = (size_t)buffers * AMPC__BLAS_BUFFER;
  void *p = mmap(NULL, need, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p != MAP_FAILED) {
    munmap(p, need);
    return AMPC_OK;
  }
  return ampc__error(AMPC_ENOMEM,
                     "out of memory: the process's %s limit (%s, %.0f MB) leaves too little for OpenBLAS's buffers, "
                     "%.0f MB more for %s: raise the limit or use fewer threads",
                     has_as ? "address-space" : "data", has_as ? "ulimit -v" : "ulimit -d",
                     (double)(has_as ? as.rlim_cur : ds.rlim_cur) / 1e6, (double)need / 1e6, what);
}
