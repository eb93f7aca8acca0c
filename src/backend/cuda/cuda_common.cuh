/*
 * cuda_common.cuh -- what every kernel file shares: typed loads and stores
 * of any float storage type, block reductions, launch geometry, and the
 * gradient store with the underflow count.
 *
 * Kernels are written in a small subset of CUDA that the host emulation
 * (emu/emu.h, the AMPC_CUDA_EMU test build) also runs: one-dimensional
 * blocks, __syncthreads, static and dynamic shared memory, integer atomics,
 * launches through AMPC_LAUNCH. Block reductions go through shared memory
 * (no warp shuffles), in a fixed order, so that every result is the same
 * from run to run.
 */
#ifndef AMPC_BACKEND_CUDA_COMMON_CUH
#define AMPC_BACKEND_CUDA_COMMON_CUH

#ifdef AMPC_CUDA_EMU
#include "backend/cuda/emu/emu.h"
#else
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#define AMPC_LAUNCH(kernel, grid, block, smem, stream, ...) kernel<<<(grid), (block), (smem), (stream)>>>(__VA_ARGS__)
#define AMPC_SHARED_DYN(type, name)                      \
  extern __shared__ __align__(16) unsigned char ampc_dyn_smem_[]; \
  type *name = (type *)ampc_dyn_smem_
#endif

#include <stdint.h>
#include <string.h>

#include "ampc/dtype.h"
#include "backend/cuda/cuda_kernels.h"
#include "core/dtype_internal.h"

#define AMPC__D static __device__ __forceinline__
/* loops over a run of elements unrolled (the emulation's compiler decides) */
#ifdef AMPC_CUDA_EMU
#define AMPC_UNROLL
#else
#define AMPC_UNROLL _Pragma("unroll")
#endif

namespace ampc_cu {

enum { F32 = AMPC_DTYPE_F32, F16 = AMPC_DTYPE_F16, BF16 = AMPC_DTYPE_BF16 };
/* threads of a block, at most, everywhere (the emulation runs fewer: each
 * is a fiber there) */
#ifdef AMPC_CUDA_EMU
enum { THREADS = 64 };
#else
enum { THREADS = 256 };
#endif
/* n threads, at most THREADS */
static inline unsigned threads_upto(unsigned n) { return n < (unsigned)THREADS ? n : (unsigned)THREADS; }

/* The conversions of core/dtype_internal.h. On the GPU the conversion
 * instructions give the same bits for every number (round to nearest even,
 * subnormals kept, overflow to infinity) in one instruction instead of a
 * dozen; a NaN, whose payload rule they do not follow, takes the shared
 * code. */
AMPC__D float f16_to_f32(uint16_t h) {
#ifndef AMPC_CUDA_EMU
  if ((h & 0x7c00u) != 0x7c00u || !(h & 0x3ffu)) return __half2float(__ushort_as_half(h));
#endif
  return ampc__f16_to_f32_inline(h);
}
AMPC__D uint16_t f32_to_f16(float v) {
#ifndef AMPC_CUDA_EMU
  if (v == v) return __half_as_ushort(__float2half_rn(v));
#endif
  return ampc__f32_to_f16_inline(v);
}
AMPC__D uint16_t f32_to_bf16(float v) {
#ifndef AMPC_CUDA_EMU
  if (v == v) return __bfloat16_as_ushort(__float2bfloat16_rn(v));
#endif
  return ampc__f32_to_bf16_inline(v);
}

/* a 16-bit value of type dt (f16 or bf16) as f32, and back */
AMPC__D float h_to_f32(int dt, uint16_t h) { return dt == F16 ? f16_to_f32(h) : ampc__bf16_to_f32_inline(h); }
AMPC__D uint16_t f32_to_h(int dt, float v) { return dt == F16 ? f32_to_f16(v) : f32_to_bf16(v); }

/* element i of a tensor of type dt as f32 */
AMPC__D float ld(const void *p, int dt, int64_t i) {
  if (dt == F32) return ((const float *)p)[i];
  return h_to_f32(dt, ((const uint16_t *)p)[i]);
}
/* v stored as element i of type dt (rounded to nearest even) */
AMPC__D void st(void *p, int dt, int64_t i, float v) {
  if (dt == F32) ((float *)p)[i] = v;
  else ((uint16_t *)p)[i] = f32_to_h(dt, v);
}
/* ---- runs of V elements in one load or store ----
 *
 * ldv/stv move elements i..i+V-1 (V = 1, 2, 4 or 8; i a multiple of V) of
 * a tensor whose start is 16-byte aligned (vec_ok) with one access of 2V
 * or 4V bytes (two for 8 f32), so that a warp reads whole lines with few
 * instructions. The emulation copies the bytes, and first checks the
 * alignment a GPU would fault on. */
static inline bool vec_ok(const void *p) { return ((uintptr_t)p & 15u) == 0; }
template <typename T>
AMPC__D T vload(const void *p) {
#ifdef AMPC_CUDA_EMU
  if ((uintptr_t)p % sizeof(T)) __builtin_trap(); /* a misaligned vector access */
  T v;
  memcpy(&v, p, sizeof v);
  return v;
#else
  return *(const T *)p;
#endif
}
template <typename T>
AMPC__D void vstore(void *p, T v) {
#ifdef AMPC_CUDA_EMU
  if ((uintptr_t)p % sizeof(T)) __builtin_trap();
  memcpy(p, &v, sizeof v);
#else
  *(T *)p = v;
#endif
}
AMPC__D unsigned pack2(int dt, float a, float b) { return (unsigned)f32_to_h(dt, a) | (unsigned)f32_to_h(dt, b) << 16; }

template <int V>
AMPC__D void ldv(const void *p, int dt, int64_t i, float *o) {
  if (dt == F32) {
    const float *f = (const float *)p + i;
    if (V >= 4) {
      AMPC_UNROLL
      for (int q = 0; q < V / 4; q++) {
        float4 a = vload<float4>(f + 4 * q);
        o[4 * q] = a.x;
        o[4 * q + 1] = a.y;
        o[4 * q + 2] = a.z;
        o[4 * q + 3] = a.w;
      }
    } else if (V == 2) {
      float2 a = vload<float2>(f);
      o[0] = a.x;
      o[1] = a.y;
    } else {
      o[0] = f[0];
    }
    return;
  }
  const uint16_t *h = (const uint16_t *)p + i;
  unsigned w[V / 2 > 0 ? V / 2 : 1];
  if (V == 8) {
    uint4 a = vload<uint4>(h);
    w[0] = a.x;
    w[1] = a.y;
    w[2] = a.z;
    w[3] = a.w;
  } else if (V == 4) {
    uint2 a = vload<uint2>(h);
    w[0] = a.x;
    w[1] = a.y;
  } else if (V == 2) {
    w[0] = vload<unsigned>(h);
  } else {
    o[0] = h_to_f32(dt, h[0]);
    return;
  }
  AMPC_UNROLL
  for (int q = 0; q < V / 2; q++) {
    o[2 * q] = h_to_f32(dt, (uint16_t)(w[q] & 0xffffu));
    o[2 * q + 1] = h_to_f32(dt, (uint16_t)(w[q] >> 16));
  }
}

template <int V>
AMPC__D void stv(void *p, int dt, int64_t i, const float *v) {
  if (dt == F32) {
    float *f = (float *)p + i;
    if (V >= 4) {
      AMPC_UNROLL
      for (int q = 0; q < V / 4; q++) {
        float4 a;
        a.x = v[4 * q];
        a.y = v[4 * q + 1];
        a.z = v[4 * q + 2];
        a.w = v[4 * q + 3];
        vstore<float4>(f + 4 * q, a);
      }
    } else if (V == 2) {
      float2 a;
      a.x = v[0];
      a.y = v[1];
      vstore<float2>(f, a);
    } else {
      f[0] = v[0];
    }
    return;
  }
  uint16_t *h = (uint16_t *)p + i;
  if (V == 8) {
    uint4 a;
    a.x = pack2(dt, v[0], v[1]);
    a.y = pack2(dt, v[2], v[3]);
    a.z = pack2(dt, v[4], v[5]);
    a.w = pack2(dt, v[6], v[7]);
    vstore<uint4>(h, a);
  } else if (V == 4) {
    uint2 a;
    a.x = pack2(dt, v[0], v[1]);
    a.y = pack2(dt, v[2], v[3]);
    vstore<uint2>(h, a);
  } else if (V == 2) {
    vstore<unsigned>(h, pack2(dt, v[0], v[1]));
  } else {
    h[0] = f32_to_h(dt, v[0]);
  }
}

/* v rounded to type dt and back: what storing and loading gives */
AMPC__D float round_to(int dt, float v) { return dt == F32 ? v : h_to_f32(dt, f32_to_h(dt, v)); }
AMPC__D bool is_nan(float v) { return v != v; }
/* r = a + b or a * b with the NaN an x86 CPU gives (the GPU gives every NaN
 * as 0x7fffffff): a NaN operand's own, quieted (the first's when both are;
 * the cpu backend's operands are alike there), else the default NaN
 * 0xffc00000 (inf - inf, 0 * inf) */
AMPC__D float x86_nan(float r, float a, float b) {
  if (r == r) return r;
  uint32_t bits = a != a ? ampc__f32_bits(a) : b != b ? ampc__f32_bits(b) : 0xffc00000u;
  return ampc__bits_f32(bits | 0x00400000u);
}

/* a / b and a % b of non-negative indices: in 32 bits where they fit (a
 * 64-bit division costs a GPU several times more) */
AMPC__D int64_t idiv(int64_t a, int64_t b) {
  return (uint64_t)(a | b) >> 32 == 0 ? (int64_t)((uint32_t)a / (uint32_t)b) : a / b;
}
AMPC__D int64_t imod(int64_t a, int64_t b) { return a - idiv(a, b) * b; }
/* the elements a thread takes in a row: the largest of 8, 4, 2, 1 that
 * divides n, so that they share their plane (and row) */
static inline int run_of(int64_t n) { return n % 8 == 0 ? 8 : n % 4 == 0 ? 4 : n % 2 == 0 ? 2 : 1; }
AMPC__D bool is_finite(float v) { return (ampc__f32_bits(v) & 0x7f800000u) != 0x7f800000u; }

/* Gradient store: element i of dx (+)= v, counting v for the underflow
 * statistics into c[0..1] (per thread; see count_flush). */
struct counts {
  unsigned long long nonzero, lost;
};
/* v counted for a 16-bit tensor of type dt: non-zero, and lost (subnormal
 * there, or zero once rounded: below the smallest normal) */
AMPC__D void count_grad(counts &c, int dt, float v) {
  float tiny = dt == F16 ? 6.103515625e-05f : 1.17549435e-38f; /* the smallest normal */
  c.nonzero += v != 0.0f;
  c.lost += v != 0.0f && fabsf(v) < tiny;
}

/* g[k] kept where the stored output y (elements i..i+V-1) is positive:
 * the gradient through a ReLU whose output y is (a NaN's is 0) */
template <int V>
AMPC__D void relu_mask(const void *y, int yt, int64_t i, float *g) {
  float yv[V];
  ldv<V>(y, yt, i, yv);
  AMPC_UNROLL
  for (int k = 0; k < V; k++) g[k] = yv[k] > 0.0f ? g[k] : 0.0f;
}

/* store_grad of V elements from element i (ldv/stv's rules) */
template <int V>
AMPC__D void store_grad_v(void *dx, int dt, int64_t i, float *v, int acc, counts &c, bool counting) {
  if (counting && dt != F32) {
    AMPC_UNROLL
    for (int k = 0; k < V; k++) count_grad(c, dt, v[k]);
  }
  if (acc) {
    float o[V];
    ldv<V>(dx, dt, i, o);
    AMPC_UNROLL
    for (int k = 0; k < V; k++) v[k] += o[k];
  }
  stv<V>(dx, dt, i, v);
}
/* one element: store_grad_v<1> */
AMPC__D void store_grad(void *dx, int dt, int64_t i, float v, int acc, counts &c, bool counting) {
  store_grad_v<1>(dx, dt, i, &v, acc, c, counting);
}

/* Sum of v over the block (every thread calls it; the result is returned
 * to all); a fixed tree order. sh: blockDim.x values of shared memory. */
template <typename T>
__device__ T block_sum(T v, T *sh) {
  int t = (int)threadIdx.x, n = (int)blockDim.x;
  sh[t] = v;
  __syncthreads();
  for (int s = THREADS / 2; s > 0; s >>= 1) {
    if (t < s && t + s < n) sh[t] += sh[t + s];
    __syncthreads();
  }
  T r = sh[0];
  __syncthreads();
  return r;
}
/* The largest v over the block (NaN-free values), likewise. */
__device__ inline float block_max(float v, float *sh) {
  int t = (int)threadIdx.x, n = (int)blockDim.x;
  sh[t] = v;
  __syncthreads();
  for (int s = THREADS / 2; s > 0; s >>= 1) {
    if (t < s && t + s < n) sh[t] = fmaxf(sh[t], sh[t + s]);
    __syncthreads();
  }
  float r = sh[0];
  __syncthreads();
  return r;
}

/* Adds the block's counts to the device counters (every thread calls it). */
__device__ inline void count_flush(counts c, ampc__cu_count *cnt) {
  __shared__ unsigned long long sh[THREADS];
  unsigned long long a = block_sum<unsigned long long>(c.nonzero, sh);
  unsigned long long b = block_sum<unsigned long long>(c.lost, sh);
  if (threadIdx.x == 0 && (a || b)) {
    atomicAdd(&cnt[0], a);
    atomicAdd(&cnt[1], b);
  }
}

/* Blocks for n elements, one per THREADS, at most `cap` (grid-stride loops
 * cover the rest). The emulation runs few blocks. */
static inline unsigned grid_for(size_t n, unsigned cap = 4096) {
#ifdef AMPC_CUDA_EMU
  cap = cap < 3 ? cap : 3;
#endif
  size_t b = (n + THREADS - 1) / THREADS;
  if (b < 1) b = 1;
  return (unsigned)(b < cap ? b : cap);
}

#define AMPC_GRID_STRIDE(i, n) \
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (int64_t)(n); i += (int64_t)gridDim.x * blockDim.x)

static inline int launch_status() { return (int)cudaGetLastError(); }

} // namespace ampc_cu

#endif
