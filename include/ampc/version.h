/*
 * version.h -- which libampc this is: version, build type, backends and the
 * CPU code paths built into it.
 *
 * The same facts are available at compile time as macros from the generated
 * "ampc/config.h" (AMPC_VERSION_STRING, AMPC_VERSION_NUMBER, AMPC_BUILD_TYPE,
 * AMPC_BACKENDS, AMPC_COMMS, AMPC_CPU_PATHS, one AMPC_HAVE_BACKEND_* and one
 * AMPC_HAVE_CPU_PATH_* per entry, AMPC_HAVE_MPI) and at run time from the library itself;
 * the two differ only when a program runs against another build of the
 * shared library than the one it was compiled with.
 *
 *     printf("%s\n", ampc_version());
 *     // ampc 0.1.0 (Release; backends: cpu; communicators: local, mpi; cpu paths: avx512, avx2+fma+f16c, baseline; this cpu: avx2+fma+f16c)
 *
 *     const ampc_version_info *v = ampc_version_get();
 *     if (v->number < 100) ...;           // older than 0.1.0
 */
#ifndef AMPC_VERSION_H
#define AMPC_VERSION_H

#include "ampc/config.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  int major, minor, patch;
  int number;             /* major * 10000 + minor * 100 + patch */
  const char *version;    /* "0.1.0" */
  const char *build_type; /* "Release", "Debug", ... ("none" when unset) */
  const char *backends;   /* comma-separated: "cpu" */
  const char *comms;      /* the communicators built, comma-separated: "local, mpi" */
  const char *cpu_paths;  /* the CPU backend's paths built, preferred first: "avx512, avx2+fma+f16c, baseline" */
  const char *cpu_path;   /* the path this machine's CPU takes: one of cpu_paths */
} ampc_version_info;

/* One line: "ampc VERSION (BUILD_TYPE; backends: ...; communicators: ...;
 * cpu paths: ...; this cpu: ...)". A static string; never NULL. */
const char *ampc_version(void);

/* The same facts one by one. A static struct; never NULL. */
const ampc_version_info *ampc_version_get(void);

/* The BLAS library the CPU backend's products run on, and the kernel set it
 * chose for this CPU: ampc_blas_name() "OpenBLAS 0.3.21", ampc_blas_core()
 * "SkylakeX", "Haswell", "Zen", ... (static strings; never NULL).
 *
 * OpenBLAS chooses its kernels as it is loaded, by the CPU's model number,
 * and falls back to its SSE3 kernels ("Prescott") on a CPU it does not know
 * (0.3.21 on Intel's model 207 Xeons): sgemm then runs at a fifth of the
 * speed. ampc_blas_better_core() names the kernel set that fits this CPU
 * ("SkylakeX" with AVX-512, "Haswell" with AVX2 and FMA) when OpenBLAS runs
 * one without AVX2, or one without AVX-512 on an AVX-512 CPU, else NULL. The
 * environment variable OPENBLAS_CORETYPE set to that name before OpenBLAS is
 * loaded overrides its choice: the ampc program re-executes itself with it
 * where OPENBLAS_CORETYPE is not set, and where it is set keeps it and says
 * so (--version, bench); a program of your own sets it in the environment it
 * is started from. */
const char *ampc_blas_name(void);
const char *ampc_blas_core(void);
const char *ampc_blas_better_core(void);

#ifdef __cplusplus
}
#endif
#endif
