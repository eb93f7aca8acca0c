/* The register-blocked f32 matrix product of the CPU backend (see
 * cpu_internal.h, ampc__cpu_gemm): Winograd's products per transform point,
 * and where it runs 16 wide the im2col convolutions' and the linear layers'
 * products, run on it instead of the BLAS's sgemm. Blocks of C stay in registers while the sum over k streams A's
 * elements (broadcast) and B's rows; no packing, so it costs nothing to set
 * up for the short sums of small layers, and for the long ones the sum is cut
 * into slices of GEMM_KB so that a block column of B stays in the L1 cache.
 * The sum over k for each element of C runs in order, one FMA at a time, so
 * the result has the same bits whatever the vector width, the blocking and
 * the way rows are shared out between threads. */
#include "backend/cpu/cpu_internal.h"

typedef cpu_v8 v8;

/* C (R x VW*NV) (+)= A (R x k, rows lda apart) * B (k x VW*NV, rows ldb
 * apart), C rows ldc apart: a block of R rows (at most RMAX) by NV vectors of
 * VW floats in registers, B's block row broadcast against A's elements (FMA
 * in the AVX2 and AVX-512 builds); the sum over k runs in order, so the result
 * does not depend on how the rows are shared out, nor on the vector width.
 * mk: 8-wide vectors, up to 6 rows by 16 columns. */
#define GEMM_MK_DEF(name, vt, VW, RMAX)                                                                                  \
  static inline __attribute__((always_inline)) void name(int64_t k, const float *A, int64_t lda, const float *B,          \
                                                         int64_t ldb, float *C, int64_t ldc, int add, const int TA,       \
                                                         const int R, const int NV) {                                     \
    vt acc[RMAX][2];                                                                                                       \
    for (int r = 0; r < R; r++)                                                                                            \
      for (int v = 0; v < NV; v++) acc[r][v] = add ? *(const vt *)(C + r * ldc + VW * v) : (vt){0};                       \
    for (int64_t p = 0; p < k; p++) {                                                                                      \
      vt b[2];                                                                                                             \
      for (int v = 0; v < NV; v++) b[v] = *(const vt *)(B + p * ldb + VW * v);                                             \
      for (int r = 0; r < R; r++) {                                                                                        \
        float a = TA ? A[r + p * lda] : A[r * lda + p];                                                                    \
        for (int v = 0; v < NV; v++) acc[r][v] += a * b[v];                                                                \
      }                                                                                                                    \
    }                                                                                                                      \
    for (int r = 0; r < R; r++)                                                                                            \
      for (int v = 0; v < NV; v++) *(vt *)(C + r * ldc + VW * v) = acc[r][v];                                              \
  }
GEMM_MK_DEF(mk, v8, 8, 6)

/* name: one block of VW * NV columns of C (m x n) (+)= A (m x k) * B (k x n)
 * on the block kernel mkf, rows R0 at a time, then 6 (where R0 is larger),
 * then 4, then one by one: see ampc__cpu_gemm. */
#define GEMM_ROWS_DEF(name, mkf, R0)                                                                                     \
  static inline __attribute__((always_inline)) void name(int64_t m, int64_t k, const float *A, int64_t lda,              \
                                                         const float *B, int64_t ldb, float *C, int64_t ldc, int add,    \
                                                         const int TA, const int NV) {                                   \
    int64_t i = 0;                                                                                                       \
    for (; i + (R0) <= m; i += (R0)) mkf(k, A + i * (TA ? 1 : lda), lda, B, ldb, C + i * ldc, ldc, add, TA, (R0), NV);   \
    if ((R0) > 6 && i + 6 <= m) {                                                                                        \
      mkf(k, A + i * (TA ? 1 : lda), lda, B, ldb, C + i * ldc, ldc, add, TA, 6, NV);                                     \
      i += 6;                                                                                                            \
    }                                                                                                                    \
    if (i + 4 <= m) {                                                                                                    \
      mkf(k, A + i * (TA ? 1 : lda), lda, B, ldb, C + i * ldc, ldc, add, TA, 4, NV);                                     \
      i += 4;                                                                                                            \
    }                                                                                                                    \
    for (; i < m; i++) mkf(k, A + i * (TA ? 1 : lda), lda, B, ldb, C + i * ldc, ldc, add, TA, 1, NV);                    \
  }
GEMM_ROWS_DEF(mk_rows, mk, 6)

/* name: C (m x n) (+)= A (m x k) * B (k x n) on the row loop rowsf of VW-wide
 * vectors: A row-major with rows lda apart, or (ta) stored transposed (k x m,
 * rows lda apart); B's rows ldb apart, n a multiple of 8, C's rows ldc apart;
 * added to C when add. Columns 2 * VW at a time, then VW, then a last 8
 * through the 8-wide rows (none left where VW is 8). */
#define GEMM_ALL_DEF(name, rowsf, VW)                                                                                    \
  static inline __attribute__((always_inline)) void name(int64_t m, int64_t n, int64_t k, const float *A, int64_t lda,   \
                                                         const float *B, int64_t ldb, float *C, int64_t ldc, int add,    \
                                                         const int TA) {                                                 \
    int64_t j = 0;                                                                                                       \
    for (; j + 2 * (VW) <= n; j += 2 * (VW)) rowsf(m, k, A, lda, B + j, ldb, C + j, ldc, add, TA, 2);                    \
    if (j + (VW) <= n) {                                                                                                 \
      rowsf(m, k, A, lda, B + j, ldb, C + j, ldc, add, TA, 1);                                                           \
      j += (VW);                                                                                                         \
    }                                                                                                                    \
    if (j < n) mk_rows(m, k, A, lda, B + j, ldb, C + j, ldc, add, TA, 1);                                                \
  }
GEMM_ALL_DEF(mk_all, mk_rows, 8)
CPU_VECTOR static void gemm8(int64_t m, int64_t n, int64_t k, const float *A, int64_t lda, int ta, const float *B,
                                      int64_t ldb, float *C, int64_t ldc, int add) {
  if (ta) mk_all(m, n, k, A, lda, B, ldb, C, ldc, add, 1);
  else mk_all(m, n, k, A, lda, B, ldb, C, ldc, add, 0);
}

/* The same product 16 columns to a vector, for AVX-512's 32 registers of 16
 * floats: blocks of 12 rows by 32 columns (24 accumulators, 2 of B and the
 * broadcast), then 6 and 4 and single rows; 16 columns alone; a last 8 columns
 * through the 8-wide blocks. Every C element is still one in-order sum over
 * k of FMAs, so the bits are those of the 8-wide kernel. */
typedef float cpu_v16 __attribute__((vector_size(64), aligned(4), may_alias));
GEMM_MK_DEF(mk16, cpu_v16, 16, 12)
GEMM_ROWS_DEF(mk16_rows, mk16, 12)
GEMM_ALL_DEF(mk16_all, mk16_rows, 16)
#define GEMM16_BODY                                         \
  if (ta) mk16_all(m, n, k, A, lda, B, ldb, C, ldc, add, 1); \
  else mk16_all(m, n, k, A, lda, B, ldb, C, ldc, add, 0);
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(AMPC_NO_CLONES)
#define GEMM_HAVE_AVX512 1
__attribute__((target("arch=x86-64-v4"))) static void gemm16_avx512(int64_t m, int64_t n, int64_t k,
                                                                            const float *A, int64_t lda, int ta,
                                                                            const float *B, int64_t ldb, float *C,
                                                                            int64_t ldc, int add) {
  GEMM16_BODY
}
#endif
/* The 16-wide kernel built like the others (on a CPU without AVX-512 the
 * compiler splits its vectors): what the tests run through the hook below,
 * to check the 16-wide blocking on any machine. */
CPU_VECTOR static void gemm16(int64_t m, int64_t n, int64_t k, const float *A, int64_t lda, int ta, const float *B,
                                       int64_t ldb, float *C, int64_t ldc, int add) {
  GEMM16_BODY
}

/* CPU_VECTOR with GCC only: clang does not export a target_clones function
 * to other files. */
#if defined(__clang__)
#define GEMM_CLONES_EXPORTED
#else
#define GEMM_CLONES_EXPORTED CPU_VECTOR
#endif
GEMM_CLONES_EXPORTED void ampc__cpu_transpose_ld(const float *src, int64_t rows, int64_t cols, int64_t lds, float *dst,
                                                 int64_t ldd) {
  for (int64_t i0 = 0; i0 < rows; i0 += 8)
    for (int64_t j0 = 0; j0 < cols; j0 += 8) {
      if (i0 + 8 <= rows && j0 + 8 <= cols) {
        v8 r[8];
        for (int i = 0; i < 8; i++) r[i] = CPU_LD8(src + (i0 + i) * lds + j0);
        cpu_tr8(r);
        for (int j = 0; j < 8; j++) CPU_ST8(dst + (j0 + j) * ldd + i0, r[j]);
        continue;
      }
      int64_t i1 = i0 + 8 < rows ? i0 + 8 : rows, j1 = j0 + 8 < cols ? j0 + 8 : cols;
      for (int64_t j = j0; j < j1; j++)
        for (int64_t i = i0; i < i1; i++) dst[j * ldd + i] = src[i * lds + j];
    }
}
void ampc__cpu_transpose(const float *src, int64_t rows, int64_t cols, float *dst) {
  ampc__cpu_transpose_ld(src, rows, cols, cols, dst, rows);
}

/* When set, the products run the 16-wide kernel (its portable build where
 * the CPU has no AVX-512) and take the large products as on an AVX-512 CPU:
 * a hook for tests. */
int ampc__cpu_gemm_force_wide = 0;

int ampc__cpu_gemm_wide(void) {
  if (ampc__cpu_gemm_force_wide) return 1;
#ifdef GEMM_HAVE_AVX512
  return __builtin_cpu_supports("x86-64-v4") != 0;
#else
  return 0;
#endif
}

/* The sum over k in slices of GEMM_KB: B's block column (GEMM_KB x 32
 * floats, 32 KB) and A's block row (12 x GEMM_KB) fit a 48 KB L1 cache. */
enum { GEMM_KB = 256 };

typedef void gemm_fn(int64_t m, int64_t n, int64_t k, const float *A, int64_t lda, int ta, const float *B, int64_t ldb,
                     float *C, int64_t ldc, int add);

void ampc__cpu_gemm(int64_t m, int64_t n, int64_t k, const float *A, int64_t lda, int ta, const float *B, int64_t ldb,
                    float *C, int64_t ldc, int add) {
  /* the build once a call, then each slice on it (libgcc fills in the CPU's
   * features before main: the check is a load and a bit test) */
  gemm_fn *f = gemm8;
  if (ampc__cpu_gemm_force_wide) f = gemm16;
#ifdef GEMM_HAVE_AVX512
  else if (__builtin_cpu_supports("x86-64-v4")) f = gemm16_avx512;
#endif
  if (k <= GEMM_KB) {
    f(m, n, k, A, lda, ta, B, ldb, C, ldc, add);
    return;
  }
  for (int64_t k0 = 0; k0 < k; k0 += GEMM_KB) {
    int64_t kb = k - k0 < GEMM_KB ? k - k0 : GEMM_KB;
    f(m, n, kb, A + (ta ? k0 * lda : k0), lda, ta, B + k0 * ldb, ldb, C, ldc, add || k0 > 0);
  }
}
