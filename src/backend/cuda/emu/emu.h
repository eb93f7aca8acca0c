/*
 * emu.h -- the cuda backend's kernels on the host, for tests on machines
 * without a GPU (the AMPC_CUDA_EMU build: tests/CMakeLists.txt).
 *
 * A launch runs its blocks one after another; a block's threads are fibers
 * on the calling thread, so __syncthreads is a barrier between rounds,
 * __shared__ memory is one static instance (a block at a time uses it),
 * atomics are the compiler's. Kernels
 * written in the subset cuda_common.cuh describes run here as on a GPU, with
 * host floating point (no fused multiply-adds unless written: the file is
 * compiled with -ffp-contract=off) and the host's libm for exp and log.
 */
#ifndef AMPC_BACKEND_CUDA_EMU_H
#define AMPC_BACKEND_CUDA_EMU_H

#include <cuda_runtime_api.h> /* types only: cudaStream_t, dim3, cudaError_t */

#include <cmath>
#include <cstddef>
#include <functional>
#include <tuple>

/* (host_defines.h gave these their host-compiler meanings) */
#undef __global__
#undef __device__
#undef __host__
#undef __forceinline__
#undef __shared__
#undef __align__
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __align__(n) alignas(n)

namespace ampc_emu {
extern uint3 threadIdx, blockIdx;
extern dim3 blockDim, gridDim;
extern unsigned char *dyn_smem;
void syncthreads();
/* Runs fn as grid.x blocks of block.x threads with smem bytes of dynamic
 * shared memory. */
void launch(dim3 grid, dim3 block, size_t smem, const std::function<void()> &fn);
/* A kernel launch: the arguments converted to the kernel's parameters now,
 * as a GPU launch takes them (a captured graph replays these values). */
template <typename... P, typename... A>
void launch_kernel(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, A &&...a) {
  std::tuple<P...> args(std::forward<A>(a)...);
  launch(grid, block, smem, [=]() { std::apply(kernel, args); });
}
} // namespace ampc_emu

using ampc_emu::blockDim;
using ampc_emu::blockIdx;
using ampc_emu::gridDim;
using ampc_emu::threadIdx;
using std::fabs;
using std::fmax;

static inline void __syncthreads() { ampc_emu::syncthreads(); }
static inline unsigned long long atomicAdd(unsigned long long *p, unsigned long long v) {
  return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}
static inline unsigned atomicMax(unsigned *p, unsigned v) {
  unsigned old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
  while (old < v && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
  }
  return old;
}
static inline unsigned atomicOr(unsigned *p, unsigned v) { return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST); }

#define AMPC_LAUNCH(kernel, grid, block, smem, stream, ...) \
  ((void)(stream), ampc_emu::launch_kernel(kernel, (grid), (block), (smem), __VA_ARGS__))
#define AMPC_SHARED_DYN(type, name) type *name = (type *)ampc_emu::dyn_smem

#endif
