/* Shared helpers of the CPU kernels: typed element access and f32 staging. */
#ifndef AMPC_CPU_INTERNAL_H
#define AMPC_CPU_INTERNAL_H

#include <math.h>
#include <string.h>

#include "backend/backend.h"
#include "core/status_internal.h"

/* What the cpu kernels know of their device, beside the op call: its options
 * and where profiling and gradient statistics go. The backend's run() sets
 * the call's ctx to it. */
struct ampc__cpu_isa;
typedef struct {
  int nthreads;
  int conv_algo;          /* ampc_conv_algo */
  const struct ampc__cpu_isa *isa; /* the device's instruction-set level */
  double *timers;         /* profiling: conv backward data [0], weights [1]; NULL when off */
  int64_t *grad_stats;    /* weight gradients stored into 16-bit: [0] values, [1] underflowed; NULL when off */
} ampc__cpu_ctx;
static inline const ampc__cpu_ctx *cpu_ctx(const ampc__op_call *c) { return (const ampc__cpu_ctx *)c->ctx; }

/* The kernels of one instruction-set level, chosen once per device: the
 * AVX-512 build where the CPU has AVX-512 F/BW/VL (ampc__cpu_has_avx512),
 * else the AVX2+FMA+F16C build where it has those, else the baseline. */
typedef struct ampc__cpu_isa {
  const char *name;
  int avx2;  /* 1: AVX2 + FMA + F16C code (the direct convolution's loops take it too; the AVX-512 level has it) */
  /* buf: momentum buffer (NULL when momentum == 0) */
  void (*sgd)(const ampc__optim_consts *k, size_t n, float *w, const float *g, float gmul, float *buf);
  /* vmax: NULL unless amsgrad */
  void (*adam)(const ampc__optim_consts *k, size_t n, float *w, const float *g, float gmul, float *m, float *v,
               float *vmax);
  int avx512; /* 1: the AVX-512 level (the direct convolution's 16-wide loops take it) */
} ampc__cpu_isa;
extern const ampc__cpu_isa ampc__cpu_isa_baseline;
/* NULL where the AVX2 build is not compiled in (not x86-64); whether the CPU
 * can run it is for the caller to check. */
extern const ampc__cpu_isa *const ampc__cpu_isa_avx2;
/* NULL where the AVX-512 build is not compiled in; the caller checks
 * ampc__cpu_has_avx512(). */
extern const ampc__cpu_isa *const ampc__cpu_isa_avx512;
const ampc__cpu_isa *ampc__cpu_isa_best(void);

/* The AVX-512 build's element kernels (step_avx512.c, compiled for AVX512F
 * by function attributes only), the fields of ampc__cpu_isa_avx512. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define AMPC__CPU_AVX512 1
void ampc__cpu_sgd_avx512(const ampc__optim_consts *k, size_t n, float *w, const float *g, float gmul, float *buf);
void ampc__cpu_adam_avx512(const ampc__optim_consts *k, size_t n, float *w, const float *g, float gmul, float *m,
                           float *v, float *vmax);
#endif

/* A cpu device's own state. */
typedef struct {
  ampc__cpu_ctx ctx;                   /* threads and convolution algorithm; timers and
                                        * grad_stats are filled in per run */
  const ampc__cpu_isa *isa;
  double t_fwd[AMPC_OP_COUNT], t_bwd[AMPC_OP_COUNT], t_conv[2];
  int64_t grad_stats[2];
  float *scratch;                      /* the step passes: per thread 2 chunks of floats */
  double *partial;                     /* the check's per-chunk sums */
  size_t npartial;
  uint64_t mem_limit;                  /* the control group's memory limit (0: none) */
  uint64_t reserved;                   /* bytes of the blocks the device holds */
} ampc__cpu_dev;

/* The step passes (step.c). */
ampc_status ampc__cpu_check(ampc__device *d, const ampc__span *s, int ns, float gmul, int want_max, const float *slots,
                            int nslots, float *slots_out, ampc__check *out);
ampc_status ampc__cpu_fold(ampc__device *d, const ampc__span *s, int ns, float *dst, float mul, int accumulate,
                           float *slot, float max_div);
ampc_status ampc__cpu_nonfinite(ampc__device *d, const ampc__span *s, int ns, const size_t *ranges, size_t nranges,
                                float gmul, unsigned char *flags);
ampc_status ampc__cpu_update(ampc__device *d, const ampc__span *s, int ns, const ampc__update *u);
size_t ampc__cpu_scratch_floats(int nthreads);
/* Makes a cpu device (or the cpu device inside a guarded one) use the given
 * kernels, for the tests that compare the builds; the caller has checked
 * that the CPU can run them. */
void ampc__cpu_set_isa(ampc__device *d, const ampc__cpu_isa *isa);
/* The cpu device whose kernels a device runs: itself, or the one inside a
 * guarded device. */
ampc__device *ampc__cpu_device_of(ampc__device *d);

/* Address of element i of a float tensor of any storage type. */
/* ampc_dtype_size inline for the types kernels address most (it is a
 * call per cpu_at otherwise: ~1% of the cnn's step on the Zen 4) */
static inline size_t cpu_dtype_size(ampc_dtype t) {
  return t == AMPC_DTYPE_F32 ? 4 : t == AMPC_DTYPE_F16 || t == AMPC_DTYPE_BF16 ? 2 : ampc_dtype_size(t);
}
static inline void *cpu_at(const ampc_tensor *t, int64_t i) {
  return (char *)t->data + (size_t)i * cpu_dtype_size(t->dtype);
}

/* Asks for elements [i, i + n) of t to be brought into cache ahead of their
 * use (a hint: no effect on results). Loops that walk a channel across the
 * samples touch short planes far apart, which the hardware does not foresee:
 * they ask for the plane CPU_AHEAD samples on (measured on the cnn's batch
 * norms: backward ~1.5x faster; 2 ahead beat 1, 3 and 5). */
enum { CPU_AHEAD = 2 };
static inline void cpu_prefetch_bytes(const void *p, size_t bytes, int write) {
  const char *c = (const char *)p;
  for (size_t o = 0; o < bytes; o += 64) {
    if (write) __builtin_prefetch(c + o, 1, 3);
    else __builtin_prefetch(c + o, 0, 3);
  }
  if (bytes && write) __builtin_prefetch(c + bytes - 1, 1, 3);
  else if (bytes) __builtin_prefetch(c + bytes - 1, 0, 3);
}
static inline void cpu_prefetch(const ampc_tensor *t, int64_t i, size_t n, int write) {
  cpu_prefetch_bytes(cpu_at(t, i), n * cpu_dtype_size(t->dtype), write);
}

/* Load n elements starting at element i as f32. When the tensor is already
 * f32 no copy is made and the tensor's own memory is returned. */
static inline const float *cpu_load(const ampc_tensor *t, int64_t i, size_t n, float *tmp) {
  if (t->dtype == AMPC_DTYPE_F32) return (const float *)t->data + i;
  ampc_load_f32(tmp, t->dtype, cpu_at(t, i), n);
  return tmp;
}

/* Store n f32 values at element i, or add them to what is there (acc). tmp
 * must hold n floats when acc is set and the type is not f32. */
static inline void cpu_store(const ampc_tensor *t, int64_t i, float *src, size_t n, int acc, float *tmp) {
  if (t->dtype == AMPC_DTYPE_F32) {
    float *d = (float *)t->data + i;
    if (acc)
      for (size_t k = 0; k < n; k++) d[k] += src[k];
    else if (d != src)
      memcpy(d, src, n * sizeof(float));
    return;
  }
  if (acc) {
    ampc_load_f32(tmp, t->dtype, cpu_at(t, i), n);
    for (size_t k = 0; k < n; k++) src[k] += tmp[k];
  }
  ampc_store_f32(t->dtype, cpu_at(t, i), src, n);
}

/* Stores n gradient values at element i like cpu_store and, for --amp-report,
 * counts the non-zero f32 values going into a 16-bit tensor and how many of
 * them become zero or subnormal there: the gradient half precision loses
 * without (enough) loss scaling. Safe inside parallel regions. */
static inline void cpu_store_grad(const ampc__op_call *c, const ampc_tensor *t, int64_t i, float *src, size_t n, int acc,
                                  float *tmp) {
  if (cpu_ctx(c)->grad_stats && (t->dtype == AMPC_DTYPE_F16 || t->dtype == AMPC_DTYPE_BF16)) {
    float tiny = t->dtype == AMPC_DTYPE_F16 ? 6.103515625e-05f : 1.17549435e-38f; /* smallest normal */
    int64_t nonzero = 0, lost = 0;
    for (size_t k = 0; k < n; k++) {
      nonzero += src[k] != 0.0f;
      lost += src[k] != 0.0f && fabsf(src[k]) < tiny;
    }
#pragma omp atomic
    cpu_ctx(c)->grad_stats[0] += nonzero;
#pragma omp atomic
    cpu_ctx(c)->grad_stats[1] += lost;
  }
  cpu_store(t, i, src, n, acc, tmp);
}

/* Where to compute n f32 results bound for element i: the tensor's own
 * memory when it is f32, else tmp; cpu_commit() then stores them. */
static inline float *cpu_out(const ampc_tensor *t, int64_t i, float *tmp) {
  return t->dtype == AMPC_DTYPE_F32 ? (float *)t->data + i : tmp;
}
static inline void cpu_commit(const ampc_tensor *t, int64_t i, const float *src, size_t n) {
  if (t->dtype != AMPC_DTYPE_F32) ampc_store_f32(t->dtype, cpu_at(t, i), src, n);
}

/* Reductions with 32 independent partial sums, four vectors of eight (lane
 * k takes elements 32i + k; a tail of whole vectors goes to the first, the
 * rest to its lane 0): four chains, so that the additions pipeline instead of
 * waiting on each other's latency; the order is fixed, so results are
 * reproducible (the AVX2 build contracts products into FMAs, so it and the
 * baseline differ in the last bits). */
typedef float cpu_v8f_al __attribute__((vector_size(32), aligned(4), may_alias));
#define cpu_hsum8(a) ((((a)[0] + (a)[1]) + ((a)[2] + (a)[3])) + (((a)[4] + (a)[5]) + ((a)[6] + (a)[7])))
#define cpu_ld8(p) (*(const cpu_v8f_al *)(p))
/* sum(x), out of line and built for AVX2 and the baseline (eltwise.c): its
 * callers are plain loops, where GCC keeps the sums in memory */
float ampc__cpu_sum(const float *x, size_t n);
static inline float cpu_sum(const float *x, size_t n) { return ampc__cpu_sum(x, n); }
/* sum(x - k) and sum((x - k)^2) in one pass */
static inline __attribute__((always_inline)) void cpu_sum_dev_sq(const float *x, float k, size_t n, float *s1, float *s2) {
  cpu_v8f_al a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, b0 = {0}, b1 = {0}, b2 = {0}, b3 = {0};
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    cpu_v8f_al d0 = cpu_ld8(x + i) - k, d1 = cpu_ld8(x + i + 8) - k, d2 = cpu_ld8(x + i + 16) - k, d3 = cpu_ld8(x + i + 24) - k;
    a0 += d0, a1 += d1, a2 += d2, a3 += d3;
    b0 += d0 * d0, b1 += d1 * d1, b2 += d2 * d2, b3 += d3 * d3;
  }
  for (; i + 8 <= n; i += 8) {
    cpu_v8f_al d = cpu_ld8(x + i) - k;
    a0 += d;
    b0 += d * d;
  }
  for (; i < n; i++) {
    float d = x[i] - k;
    a0[0] += d;
    b0[0] += d * d;
  }
  a0 = (a0 + a1) + (a2 + a3);
  b0 = (b0 + b1) + (b2 + b3);
  *s1 = cpu_hsum8(a0);
  *s2 = cpu_hsum8(b0);
}

/* sum(dy) and sum(dy * (x - mean)) in one pass */
static inline __attribute__((always_inline)) void cpu_sum_dy_dyx(const float *dy, const float *x, float mean, size_t n, float *sdy, float *sdyx) {
  cpu_v8f_al a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, b0 = {0}, b1 = {0}, b2 = {0}, b3 = {0};
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    cpu_v8f_al d0 = cpu_ld8(dy + i), d1 = cpu_ld8(dy + i + 8), d2 = cpu_ld8(dy + i + 16), d3 = cpu_ld8(dy + i + 24);
    a0 += d0, a1 += d1, a2 += d2, a3 += d3;
    b0 += d0 * (cpu_ld8(x + i) - mean), b1 += d1 * (cpu_ld8(x + i + 8) - mean);
    b2 += d2 * (cpu_ld8(x + i + 16) - mean), b3 += d3 * (cpu_ld8(x + i + 24) - mean);
  }
  for (; i + 8 <= n; i += 8) {
    cpu_v8f_al d = cpu_ld8(dy + i);
    a0 += d;
    b0 += d * (cpu_ld8(x + i) - mean);
  }
  for (; i < n; i++) {
    a0[0] += dy[i];
    b0[0] += dy[i] * (x[i] - mean);
  }
  a0 = (a0 + a1) + (a2 + a3);
  b0 = (b0 + b1) + (b2 + b3);
  *sdy = cpu_hsum8(a0);
  *sdyx = cpu_hsum8(b0);
}

/* A 3x3 stride-1 convolution padded by 0..2: what Winograd and the direct
 * loop compute. */
static inline int cpu_conv3x3_s1(const ampc__op_call *c) {
  const ampc_shape *w = &c->in[1].shape;
  return w->d[2] == 3 && w->d[3] == 3 && c->attr.stride == 1 && c->attr.pad >= 0 && c->attr.pad <= 2;
}

/* How a convolution cuts its samples into blocks of about `target` units
 * (columns, tiles) when a sample has `rows` rows of `row_len` units: a band of
 * *rb rows of one sample (*nb = 1) when a sample is at least that big, else
 * *nb whole samples (at most max_samples) with *rb = rows. */
static inline void cpu_blocking(int64_t target, int64_t row_len, int64_t rows, int64_t max_samples, int64_t *nb, int64_t *rb) {
  if (row_len * rows >= target) {
    *nb = 1;
    *rb = target / row_len;
    if (*rb < 1) *rb = 1;
    if (*rb > rows) *rb = rows;
  } else {
    *rb = rows;
    *nb = target / (row_len * rows);
    if (*nb > max_samples) *nb = max_samples;
    if (*nb < 1) *nb = 1;
  }
}

/* Per-thread slice of the call's workspace, in floats. */
static inline float *cpu_ws_slice(const ampc__op_call *c, int tid, size_t floats_per_thread, size_t shared_floats) {
  return (float *)c->ws + shared_floats + (size_t)tid * floats_per_thread;
}

/* Hot loops written to vectorise are built three times with GCC: for
 * AVX-512 (the x86-64-v4 level: F, BW, CD, DQ, VL, with 32 vector
 * registers; the compiler's own loops may use 16-float vectors there), for
 * AVX2 with FMA (x86-64-v3) and for the baseline; the loader picks one by the
 * CPU's features (libgcc's check includes that the OS saves the AVX-512
 * state). Files of kernels are compiled with -ffp-contract=fast, so a * b + c
 * becomes one FMA in the AVX2 and AVX-512 builds. clang builds the AVX2 clone
 * and the baseline. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(AMPC_NO_CLONES)
#define CPU_VECTOR __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#elif defined(__x86_64__) && defined(__GNUC__) && !defined(AMPC_NO_CLONES)
#define CPU_VECTOR __attribute__((target_clones("avx2", "default")))
#else
#define CPU_VECTOR
#endif
/* The build of CPU_VECTOR code the loader picks on this CPU, as its
 * resolver does (ampc_kernel_path() reports it). */
static inline const char *cpu_vector_path(void) {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(AMPC_NO_CLONES)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("x86-64-v4")) return "avx512";
  return __builtin_cpu_supports("x86-64-v3") ? "avx2+fma+f16c" : "baseline";
#elif defined(__x86_64__) && defined(__GNUC__) && !defined(AMPC_NO_CLONES)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") ? "avx2" : "baseline";
#else
  return "baseline";
#endif
}

/* 8 floats (and 8 ints, for masks) as GCC/clang vector types; loads and
 * stores through them may be unaligned and alias floats. */
typedef float cpu_v8 __attribute__((vector_size(32), aligned(4), may_alias));
typedef int cpu_v8i __attribute__((vector_size(32), aligned(4), may_alias));
#define CPU_LD8(p) (*(const cpu_v8 *)(p))
#define CPU_ST8(p, v) (*(cpu_v8 *)(p) = (v))
#define CPU_SEL8(m, x, y) ((cpu_v8)(((cpu_v8i)(x) & (m)) | ((cpu_v8i)(y) & ~(m)))) /* m ? x : y, per lane */
/* r[j][k] <-> r[k][j]: an 8 x 8 block transposed in registers */
static inline __attribute__((always_inline)) void cpu_tr8(cpu_v8 r[8]) {
  cpu_v8 a[8], b[8];
  for (int i = 0; i < 8; i += 2) {
    a[i] = __builtin_shufflevector(r[i], r[i + 1], 0, 8, 1, 9, 4, 12, 5, 13);
    a[i + 1] = __builtin_shufflevector(r[i], r[i + 1], 2, 10, 3, 11, 6, 14, 7, 15);
  }
  for (int i = 0; i < 8; i += 4) /* b[i + c]: columns c and c + 4 of rows i .. i+3 */
    for (int h = 0; h < 2; h++) {
      b[i + 2 * h] = __builtin_shufflevector(a[i + h], a[i + h + 2], 0, 1, 8, 9, 4, 5, 12, 13);
      b[i + 2 * h + 1] = __builtin_shufflevector(a[i + h], a[i + h + 2], 2, 3, 10, 11, 6, 7, 14, 15);
    }
  for (int i = 0; i < 4; i++) {
    r[i] = __builtin_shufflevector(b[i], b[i + 4], 0, 1, 2, 3, 8, 9, 10, 11);
    r[i + 4] = __builtin_shufflevector(b[i], b[i + 4], 4, 5, 6, 7, 12, 13, 14, 15);
  }
}

#define CPU_CHUNK 1024 /* elements per block in element-wise kernels */

/* Kernels, by file. */
ampc_status ampc__cpu_conv2d_fwd(const ampc__op_call *c);
ampc_status ampc__cpu_conv2d_bwd(const ampc__op_call *c);
size_t ampc__cpu_conv2d_ws(const ampc__op_call *c, int nthreads);
/* C (m x n) (+)= A (m x k) * B (k x n) in f32 (gemm.c): A row-major with
 * rows lda apart, or (ta) stored transposed (k x m, rows lda apart); B's rows
 * ldb apart; n a multiple of 8; C's rows ldc apart, added to when add. Runs on
 * the calling thread; each element of C is one in-order sum over k. */
void ampc__cpu_gemm(int64_t m, int64_t n, int64_t k, const float *A, int64_t lda, int ta, const float *B, int64_t ldb,
                    float *C, int64_t ldc, int add);
/* 1 where ampc__cpu_gemm runs 16 floats to a vector (AVX-512, or forced by
 * the test hook ampc__cpu_gemm_force_wide). Only then does it take the large
 * products from the BLAS: there it was measured as fast as OpenBLAS 0.3.21's
 * AVX-512 kernels and faster than its AVX2 ones, which OPENBLAS_CORETYPE can
 * hold it to; 8 wide it was level with OpenBLAS's AVX2 kernels at best. */
int ampc__cpu_gemm_wide(void);
/* dst (cols x rows) = src (rows x cols)^T, in 8 x 8 blocks transposed in
 * registers; src rows lds floats apart, dst rows ldd apart (_ld), or both
 * dense. */
void ampc__cpu_transpose_ld(const float *src, int64_t rows, int64_t cols, int64_t lds, float *dst, int64_t ldd);
void ampc__cpu_transpose(const float *src, int64_t rows, int64_t cols, float *dst);
/* Products on AMX tiles (gemm_amx.c): 1 where this CPU and OS run
 * AMX-BF16 (asked of the OS once per process) and the test hook
 * ampc__cpu_amx_off is 0. The operands are packed into tiles of bf16
 * (round to nearest even: exact for values that came from bf16 storage) in
 * buffers of the _bytes sizes; the product sums in f32. A: m x k, or (ta)
 * stored k x m; B: k x n, or (tb) stored n x k; C's rows ldc apart, added
 * to when add. pack_a packs part `part` of `nparts` of A's rows, for threads
 * to share it. */
int ampc__cpu_amx(void);
/* x rounded up to a multiple of m */
static inline int64_t cpu_round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
/* _mm512_set_epi16's arguments that interleave two rows of 16 bf16 (a's
 * then b's in one vector) into 16 pairs (a[j], b[j]): the tiles' B layout */
#define CPU_AMX_PAIRS_IDX                                                                                          \
  31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0
extern int ampc__cpu_amx_off;
size_t ampc__cpu_amx_pack_a_bytes(int64_t m, int64_t k);
size_t ampc__cpu_amx_pack_b_bytes(int64_t k, int64_t n);
void ampc__cpu_amx_pack_a(int64_t m, int64_t k, const float *A, int64_t lda, int ta, void *dst, int part, int nparts);
void ampc__cpu_amx_pack_b(int64_t k, int64_t n, const float *B, int64_t ldb, int tb, void *dst);
void ampc__cpu_amx_gemm_packed(int64_t m, int64_t n, int64_t k, const void *Ap, const void *Bp, float *C, int64_t ldc,
                               int add);
/* The same packed product on AVX-512 BF16's dot products (VDPBF16PS), for
 * CPUs with avx512_bf16 and no tiles: ampc__cpu_bf16dp() is 1 where the CPU
 * has them and the test hook ampc__cpu_bf16dp_off is 0. The packing is the
 * tiles'. ampc__cpu_bf16_products() is 1 where either engine runs, and
 * ampc__cpu_bf16_gemm_packed the product on the tiles where there are any,
 * else on the dot products. */
extern int ampc__cpu_bf16dp_off;
int ampc__cpu_bf16dp(void);
void ampc__cpu_dp_gemm_packed(int64_t m, int64_t n, int64_t k, const void *Ap, const void *Bp, float *C, int64_t ldc,
                              int add);
int ampc__cpu_bf16_products(void);
void ampc__cpu_bf16_gemm_packed(int64_t m, int64_t n, int64_t k, const void *Ap, const void *Bp, float *C,
                                int64_t ldc, int add);
/* Configures the calling thread's tiles (8 of 16 rows by 64 bytes) before
 * it uses them, and releases them after. */
void ampc__cpu_amx_begin(void);
void ampc__cpu_amx_end(void);
/* 3x3 stride-1 convolutions of bf16 on AMX tiles without im2col
 * (conv_amx.c): the forward, the input gradient, the weight (and bias)
 * gradient. */
size_t ampc__cpu_a3_ws(const ampc__op_call *c, int nthreads);
ampc_status ampc__cpu_a3_fwd(const ampc__op_call *c);
ampc_status ampc__cpu_a3_bwd_data(const ampc__op_call *c);
ampc_status ampc__cpu_a3_bwd_weights(const ampc__op_call *c);
size_t ampc__cpu_wino_ws(const ampc__op_call *c, int nthreads);
ampc_status ampc__cpu_wino_fwd(const ampc__op_call *c);
ampc_status ampc__cpu_wino_bwd(const ampc__op_call *c);
int ampc__cpu_direct_preferred(const ampc__op_call *c);
size_t ampc__cpu_direct_ws(const ampc__op_call *c, int nthreads);
ampc_status ampc__cpu_direct_fwd(const ampc__op_call *c);
ampc_status ampc__cpu_direct_bwd_weights(const ampc__op_call *c);
/* When set, the direct convolution runs its 16-wide (AVX-512) loops on any
 * CPU, through their portable build: a hook for tests. */
extern int ampc__cpu_direct_wide;
ampc_status ampc__cpu_linear_fwd(const ampc__op_call *c);
ampc_status ampc__cpu_linear_bwd(const ampc__op_call *c);
size_t ampc__cpu_linear_ws(const ampc__op_call *c, int nthreads);
ampc_status ampc__cpu_bn_fwd(const ampc__op_call *c);
ampc_status ampc__cpu_bn_bwd(const ampc__op_call *c);
size_t ampc__cpu_bn_ws(const ampc__op_call *c, int nthreads);
size_t ampc__cpu_bn_aux_floats(const ampc__op_call *c);
void ampc__cpu_bn_recompute(const float *x, size_t n, float scale, float shift, int relu, ampc_dtype t, float *y);

/* A convolution's input: n values of channel ch from element i of in[0],
 * as f32 -- through the batch norm the convolution applies as it loads
 * (ampc__op_call.pro) into tmp, or as cpu_load gives them. */
static inline const float *cpu_load_input(const ampc__op_call *c, int64_t i, size_t n, int64_t ch, float *tmp) {
  const float *x = cpu_load(&c->in[0], i, n, tmp);
  if (!c->pro) return x;
  int64_t C = c->in[0].shape.d[1];
  ampc__cpu_bn_recompute(x, n, c->pro[ch], c->pro[C + ch], c->pro_relu, c->pro_type, tmp);
  return tmp;
}
ampc_status ampc__cpu_relu_fwd(const ampc__op_call *c);
ampc_status ampc__cpu_relu_bwd(const ampc__op_call *c);
ampc_status ampc__cpu_add_fwd(const ampc__op_call *c);
ampc_status ampc__cpu_add_bwd(const ampc__op_call *c);
ampc_status ampc__cpu_cast_fwd(const ampc__op_call *c);
ampc_status ampc__cpu_cast_bwd(const ampc__op_call *c);
ampc_status ampc__cpu_pool_fwd(const ampc__op_call *c);
ampc_status ampc__cpu_pool_bwd(const ampc__op_call *c);
size_t ampc__cpu_pool_ws(const ampc__op_call *c, int nthreads);
/* 2x2 stride-2 max pooling of one f32 plane of H x W (OH = H/2, OW = W/2):
 * out gets each window's first maximum (a NaN beats any number), win its
 * place 0..3 in reading order; scatter sends dy to those places in an H x W
 * plane and zeroes the rest. */
/* out = dy where y > 0, else 0 (a ReLU's gradient; out may be dy) */
void ampc__cpu_relu_mask(const float *y, const float *dy, size_t n, float *out);
void ampc__cpu_pool2_select(const float *x, int64_t H, int64_t W, float *out, unsigned char *win);
void ampc__cpu_pool2_scatter(const float *dy, const unsigned char *win, int64_t H, int64_t W, float *dx);
ampc_status ampc__cpu_gap_fwd(const ampc__op_call *c);
ampc_status ampc__cpu_gap_bwd(const ampc__op_call *c);
ampc_status ampc__cpu_softmax_fwd(const ampc__op_call *c);
ampc_status ampc__cpu_softmax_bwd(const ampc__op_call *c);
ampc_status ampc__cpu_ce_fwd(const ampc__op_call *c);
ampc_status ampc__cpu_ce_bwd(const ampc__op_call *c);
size_t ampc__cpu_rows_ws(const ampc__op_call *c, int nthreads);

#endif
