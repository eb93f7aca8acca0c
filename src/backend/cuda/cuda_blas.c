/* cuBLAS, loaded when a cuda device first asks for it.
 *
 * libcublas brings libcublasLt, whose static data costs a process that
 * loads it about 140 MB of resident memory at start-up, GPU or not. Linked
 * into libampc, every cpu run would pay that; opened here with dlopen, only
 * a program that trains on cuda does. The few entry points the backend
 * calls go through a table: the library's own (the versioned symbols that
 * cublas_v2.h's names stand for) or, in the host emulation, the emulated
 * functions linked in. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

#include "backend/cuda/cuda_internal.h"

#define CU_STR_(x) #x
#define CU_STR(x) CU_STR_(x) /* the name after cublas_v2.h's macros */

static ampc__cu_blas_api api;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static char why[512];

#ifdef AMPC_CUDA_EMU
static void load(void) {
  api.create = cublasCreate;
  api.destroy = cublasDestroy;
  api.set_stream = cublasSetStream;
  api.set_workspace = cublasSetWorkspace;
  api.set_math_mode = cublasSetMathMode;
  api.status_string = cublasGetStatusString;
  api.gemm_ex = cublasGemmEx;
  api.loaded = 1;
}
#else
#ifndef AMPC_CUBLAS_PATH
#define AMPC_CUBLAS_PATH ""
#endif

static void load(void) {
  /* the library's soname first (found by the loader's rules: the RUNPATH
   * ampc was linked with, LD_LIBRARY_PATH, ...), then the file this build
   * was configured with */
  static const char *const names[] = {"libcublas.so.13", "libcublas.so.12", AMPC_CUBLAS_PATH};
  void *h = NULL;
  for (size_t i = 0; i < sizeof names / sizeof names[0] && !h; i++)
    if (names[i][0]) h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char *e = dlerror();
    snprintf(why, sizeof why, "cannot load cuBLAS (libcublas.so.13, libcublas.so.12%s%s): %s", AMPC_CUBLAS_PATH[0] ? ", " : "",
             AMPC_CUBLAS_PATH, e ? e : "not found");
    return;
  }
  struct {
    void **slot;
    const char *name;
  } syms[] = {
      {(void **)&api.create, CU_STR(cublasCreate)},
      {(void **)&api.destroy, CU_STR(cublasDestroy)},
      {(void **)&api.set_stream, CU_STR(cublasSetStream)},
      {(void **)&api.set_workspace, CU_STR(cublasSetWorkspace)},
      {(void **)&api.set_math_mode, CU_STR(cublasSetMathMode)},
      {(void **)&api.status_string, CU_STR(cublasGetStatusString)},
      {(void **)&api.gemm_ex, CU_STR(cublasGemmEx)},
  };
  for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
    if (!(*syms[i].slot = dlsym(h, syms[i].name))) {
      snprintf(why, sizeof why, "cuBLAS has no %s (too old a cuBLAS?)", syms[i].name);
      dlclose(h);
      return;
    }
  }
  api.loaded = 1; /* (kept open for the process's life) */
}
#endif

ampc_status ampc__cu_blas_api_get(const ampc__cu_blas_api **out) {
  pthread_once(&once, load);
  *out = api.loaded ? &api : NULL;
  return api.loaded ? AMPC_OK : ampc__error(AMPC_EUNSUPPORTED, "cuda: %s", why);
}
