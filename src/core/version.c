/* ampc_version(): the facts of the generated ampc/config.h, and the CPU path
 * this machine takes. */
#include "ampc/version.h"

#include "core/dtype_internal.h"

/* The list in cmake/ampc_build_info.cmake must agree with the code it
 * describes: the AVX2 clones exist only on x86-64 with GCC or clang. */
#if defined(AMPC_HAVE_CPU_PATH_AVX2_FMA_F16C) && !(defined(__x86_64__) && defined(__GNUC__))
#error "config.h lists the avx2+fma+f16c path, which this compiler and target do not build"
#endif
#if !defined(AMPC_HAVE_BACKEND_CPU) || !defined(AMPC_HAVE_CPU_PATH_BASELINE)
#error "config.h lacks the cpu backend or its baseline path"
#endif

#define AMPC__VERSION_HEAD \
  "ampc " AMPC_VERSION_STRING " (" AMPC_BUILD_TYPE "; backends: " AMPC_BACKENDS "; communicators: " AMPC_COMMS "; cpu paths: " AMPC_CPU_PATHS "; this cpu: "

#define AMPC__VERSION_INFO(path)                                                                       \
  {AMPC_VERSION_MAJOR, AMPC_VERSION_MINOR,  AMPC_VERSION_PATCH, AMPC_VERSION_NUMBER, AMPC_VERSION_STRING, \
   AMPC_BUILD_TYPE,    AMPC_BACKENDS,       AMPC_COMMS,         AMPC_CPU_PATHS,     path}

static int fast_path(void) {
#ifdef AMPC_HAVE_CPU_PATH_AVX2_FMA_F16C
  return ampc__cpu_has_avx2_f16c();
#else
  return 0;
#endif
}

const char *ampc_version(void) {
  return fast_path() ? AMPC__VERSION_HEAD "avx2+fma+f16c)" : AMPC__VERSION_HEAD "baseline)";
}

const ampc_version_info *ampc_version_get(void) {
  static const ampc_version_info fast = AMPC__VERSION_INFO("avx2+fma+f16c"), base = AMPC__VERSION_INFO("baseline");
  return fast_path() ? &fast : &base;
}
