/* Internal: AMPC__HD marks the inline functions every backend's compiler
 * builds from one text -- the conversions (dtype_internal.h), the generator's
 * hash (rng_internal.h), the optimizer updates and stochastic rounding
 * (backend/step_math.h): plain static inline in C, host and device functions
 * under CUDA's compiler, so that the CPU tests of these formulas check the
 * GPU's arithmetic too. */
#ifndef AMPC_CORE_HD_H
#define AMPC_CORE_HD_H

#ifndef AMPC__HD
#if defined(__CUDACC__)
#define AMPC__HD static __host__ __device__ __forceinline__
#else
#define AMPC__HD static inline
#endif
#endif

#endif
