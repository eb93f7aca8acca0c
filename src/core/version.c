/* ampc_version(): the facts of the generated ampc/config.h, and the CPU path
 * this machine takes. */
#include "ampc/version.h"

#include <string.h>

#include "ampc/dtype.h"
#include "core/dtype_internal.h"

/* The list in cmake/ampc_build_info.cmake must agree with the code it
 * describes: the AVX2 clones exist only on x86-64 with GCC or clang. */
#if defined(AMPC_HAVE_CPU_PATH_AVX2_FMA_F16C) && !(defined(__x86_64__) && defined(__GNUC__))
#error "config.h lists the avx2+fma+f16c path, which this compiler and target do not build"
#endif
#if defined(AMPC_HAVE_CPU_PATH_AVX512) && !(defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__))
#error "config.h lists the avx512 path, which only GCC's x86-64 build has"
#endif
#if !defined(AMPC_HAVE_BACKEND_CPU) || !defined(AMPC_HAVE_CPU_PATH_BASELINE)
#error "config.h lacks the cpu backend or its baseline path"
#endif

#define AMPC__VERSION_HEAD \
  "ampc " AMPC_VERSION_STRING " (" AMPC_BUILD_TYPE "; backends: " AMPC_BACKENDS "; communicators: " AMPC_COMMS "; cpu paths: " AMPC_CPU_PATHS "; this cpu: "

#define AMPC__VERSION_INFO(path)                                                                       \
  {AMPC_VERSION_MAJOR, AMPC_VERSION_MINOR,  AMPC_VERSION_PATCH, AMPC_VERSION_NUMBER, AMPC_VERSION_STRING, \
   AMPC_BUILD_TYPE,    AMPC_BACKENDS,       AMPC_COMMS,         AMPC_CPU_PATHS,     path}

/* The path this CPU takes, as ampc_kernel_path() names it, as an index into
 * the strings below (each a compile-time constant, so that ampc_version()
 * returns a static string). */
enum { PATH_BASELINE, PATH_AVX2, PATH_AVX512 };
static int this_path(void) {
  const char *k = ampc_kernel_path();
#ifdef AMPC_HAVE_CPU_PATH_AVX512
  if (strcmp(k, "avx512") == 0) return PATH_AVX512;
#endif
#ifdef AMPC_HAVE_CPU_PATH_AVX2_FMA_F16C
  if (strcmp(k, "baseline") != 0 && ampc__cpu_has_avx2_f16c()) return PATH_AVX2;
#endif
  (void)k;
  return PATH_BASELINE;
}

const char *ampc_version(void) {
  static const char *const s[] = {AMPC__VERSION_HEAD "baseline)", AMPC__VERSION_HEAD "avx2+fma+f16c)",
                                  AMPC__VERSION_HEAD "avx512)"};
  return s[this_path()];
}

const ampc_version_info *ampc_version_get(void) {
  static const ampc_version_info v[] = {AMPC__VERSION_INFO("baseline"), AMPC__VERSION_INFO("avx2+fma+f16c"),
                                        AMPC__VERSION_INFO("avx512")};
  return &v[this_path()];
}
