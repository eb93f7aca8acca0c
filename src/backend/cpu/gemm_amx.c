/* Matrix products of bf16 values on Intel's AMX tiles (AMX-BF16), or where
 * a CPU has no tiles on AVX-512 BF16's dot products (further down), for the
 * convolutions of models stored in bf16 (see conv.c).
 *
 * TDPBF16PS multiplies a 16 x 32 tile of bf16 values (A) by a 32 x 16 one (B,
 * stored as 16 rows of 16 pairs: the two k of a column side by side) and adds
 * the 16 x 16 products to f32 sums. Where A and B hold values that came from
 * bf16 storage their products are exact in f32, so the result is that of the
 * f32 product of the same values up to the order of the sums (and denormals,
 * which the tiles flush to zero): bf16 convolutions on AMX compute what their
 * f32 products did, 16 times as many products a cycle as AVX-512's FMAs.
 *
 * A is packed once per product (or once per call and shared between
 * threads: ampc__cpu_amx_pack_a), B per product, into tiles of 1 KB laid
 * out in the order the kernel reads them; both are padded with zeros to whole
 * tiles, which add nothing to the sums. The kernel keeps a 32 x 32 block of C
 * in four tiles while the sum runs over a slice of k whose B panel stays in
 * the L2 cache.
 *
 * Linux hands a process the tiles' 8 KB of state only when it asks
 * (arch_prctl ARCH_REQ_XCOMP_PERM); ampc__cpu_amx asks once, and reports 0
 * where the CPU, the kernel or the compiler cannot run them. */
#include "backend/cpu/cpu_internal.h"
#include "core/dtype_internal.h"

#include <stdint.h>

int ampc__cpu_amx_off = 0;

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11 && defined(__linux__)
#define AMX_BUILT 1
#include <cpuid.h>
#include <immintrin.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

enum { ARCH_REQ_XCOMP_PERM_ = 0x1023, XFEATURE_XTILEDATA_ = 18 };

static int amx_ok;
static pthread_once_t amx_once = PTHREAD_ONCE_INIT;

__attribute__((target("xsave"))) static unsigned long long amx_xcr0(void) { return _xgetbv(0); }

static void amx_probe(void) {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return;
  /* EDX 22: AMX-BF16, 24: AMX-TILE; EBX 16/30/31: AVX-512 F/BW/VL; ECX 27: OSXSAVE (leaf 1) */
  if (!(d & (1u << 22)) || !(d & (1u << 24))) return;
  if (!ampc__cpu_has_avx512_bf16()) return; /* what both engines' packing needs */
  unsigned a1, b1, c1, d1;
  if (!__get_cpuid(1, &a1, &b1, &c1, &d1) || !(c1 & (1u << 27))) return;
  if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM_, XFEATURE_XTILEDATA_) != 0) return;
  /* the OS saves the tile state (XCR0 bits 17 and 18) */
  if ((amx_xcr0() & (3ull << 17)) != (3ull << 17)) return;
  amx_ok = 1;
}

int ampc__cpu_amx(void) {
  if (ampc__cpu_amx_off) return 0;
  pthread_once(&amx_once, amx_probe);
  return amx_ok;
}
#else
int ampc__cpu_amx(void) { return 0; }
#endif

size_t ampc__cpu_amx_pack_a_bytes(int64_t m, int64_t k) {
  return (size_t)(cpu_round_up(m, 32) * cpu_round_up(k, 32)) * 2 + 64;
}
size_t ampc__cpu_amx_pack_b_bytes(int64_t k, int64_t n) {
  return (size_t)(cpu_round_up(k, 32) * cpu_round_up(n, 32)) * 2 + 64;
}

#ifdef AMX_BUILT
#define AMX_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c,amx-tile,amx-bf16")))
/* the packing and the dot products: no tile instructions, for CPUs with
 * avx512_bf16 and none */
#define BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c")))

static uint16_t *amx_align(void *p) { return (uint16_t *)(((uintptr_t)p + 63) & ~(uintptr_t)63); }

/* dst[j][r] = src[r][j] for 16 x 16 pairs of bf16 */
static inline void amx_tr16(const uint32_t *src, uint32_t *dst) {
  for (int j = 0; j < 16; j++)
    for (int r = 0; r < 16; r++) dst[j * 16 + r] = src[r * 16 + j];
}

/* Rows p, p + 1 of a matrix with 16 columns from col (masked by mc; a row
 * past kend is zeros) as 16 pairs of bf16, the two rows' values of a column
 * side by side. */
BF16_TARGET static inline __m512i amx_pairs(const float *row, int64_t ld, int64_t p, int64_t kend, __mmask16 mc) {
  const __m512i ilv = _mm512_set_epi16(CPU_AMX_PAIRS_IDX);
  __m512 r0 = p < kend ? _mm512_maskz_loadu_ps(mc, row + p * ld) : _mm512_setzero_ps();
  __m512 r1 = p + 1 < kend ? _mm512_maskz_loadu_ps(mc, row + (p + 1) * ld) : _mm512_setzero_ps();
  return _mm512_permutexvar_epi16(ilv, (__m512i)_mm512_cvtne2ps_pbh(r1, r0));
}

/* 32 values of a row (kn of them, the rest zeros) as 32 bf16 */
BF16_TARGET static inline __m512i amx_row32(const float *a, int64_t kn) {
  __mmask16 m0 = kn >= 16 ? 0xffff : kn > 0 ? (__mmask16)((1u << kn) - 1) : 0;
  __mmask16 m1 = kn >= 32 ? 0xffff : kn > 16 ? (__mmask16)((1u << (kn - 16)) - 1) : 0;
  return (__m512i)_mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(m1, a + 16), _mm512_maskz_loadu_ps(m0, a));
}

static __mmask16 amx_mask(int64_t n) { return n >= 16 ? 0xffff : n > 0 ? (__mmask16)((1u << n) - 1) : 0; }

/* A (m x k; ta: stored k x m, rows lda apart) into tiles [m/16][k/32][16][32]:
 * the row blocks of part `part` of `nparts` (threads share the packing). */
BF16_TARGET void ampc__cpu_amx_pack_a(int64_t m, int64_t k, const float *A, int64_t lda, int ta, void *dst_, int part,
                                     int nparts) {
  uint16_t *dst = amx_align(dst_);
  int64_t mb = cpu_round_up(m, 32) / 16, kb = cpu_round_up(k, 32) / 32;
  int64_t b0 = mb * part / nparts, b1 = mb * (part + 1) / nparts;
  uint32_t tmp[256] __attribute__((aligned(64)));
  for (int64_t ib = b0; ib < b1; ib++)
    for (int64_t q = 0; q < kb; q++) {
      uint16_t *t = dst + (ib * kb + q) * 512;
      int64_t k0 = q * 32, kn = k - k0 < 32 ? k - k0 : 32, i0 = ib * 16;
      if (!ta) {
        for (int r = 0; r < 16; r++)
          _mm512_store_si512((__m512i *)(t + r * 32), i0 + r < m ? amx_row32(A + (i0 + r) * lda + k0, kn)
                                                                 : _mm512_setzero_si512());
      } else {
        /* pairs of k for 16 rows, then turned: row i of the tile */
        __mmask16 mr = amx_mask(m - i0);
        for (int r = 0; r < 16; r++) _mm512_store_si512((__m512i *)(tmp + r * 16), amx_pairs(A + i0, lda, k0 + 2 * r, k, mr));
        amx_tr16(tmp, (uint32_t *)t);
      }
    }
}

/* B (k x n, rows ldb apart; tb: stored n x k) into tiles [n/16][k/32][16
 * pairs of k][16 columns][2]. */
BF16_TARGET void ampc__cpu_amx_pack_b(int64_t k, int64_t n, const float *B, int64_t ldb, int tb, void *dst_) {
  uint16_t *dst = amx_align(dst_);
  int64_t nb = cpu_round_up(n, 32) / 16, kb = cpu_round_up(k, 32) / 32;
  uint32_t tmp[256] __attribute__((aligned(64)));
  for (int64_t jb = 0; jb < nb; jb++) {
    int64_t j0 = jb * 16;
    __mmask16 mc = amx_mask(n - j0);
    for (int64_t q = 0; q < kb; q++) {
      uint16_t *t = dst + (jb * kb + q) * 512;
      int64_t k0 = q * 32, kn = k - k0 < 32 ? k - k0 : 32;
      if (!tb) {
        for (int r = 0; r < 16; r++) _mm512_store_si512((__m512i *)(t + r * 32), amx_pairs(B + j0, ldb, k0 + 2 * r, k, mc));
      } else {
        /* row j of the stored matrix holds column j's k in order: its pairs, turned */
        for (int j = 0; j < 16; j++)
          _mm512_store_si512((__m512i *)(tmp + j * 16), j0 + j < n ? amx_row32(B + (j0 + j) * ldb + k0, kn)
                                                                   : _mm512_setzero_si512());
        amx_tr16(tmp, (uint32_t *)t);
      }
    }
  }
}

typedef struct {
  uint8_t palette, start_row, rsv[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} amx_cfg;

/* Every tile 16 rows of 64 bytes, on the calling thread (the tiles'
 * configuration is a thread's own state), and back to their initial state.
 * The configuration is a constant: GCC does not see that LDTILECFG reads all
 * 64 bytes of its operand, and dropped the stores of one built on the stack
 * (the tiles then had no rows, and the first load faulted). */
static const amx_cfg amx_config = {
    .palette = 1,
    .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
    .rows = {16, 16, 16, 16, 16, 16, 16, 16},
};
AMX_TARGET void ampc__cpu_amx_begin(void) { _tile_loadconfig(&amx_config); }
AMX_TARGET void ampc__cpu_amx_end(void) { _tile_release(); }

/* The sum over k in slices of AMX_KB: the panel of 32 rows of A or 32
 * columns of B for a slice (16 KB) stays in L1 while the other operand's
 * slice streams from L2 past it -- the smaller one's, so that it fits. */
enum { AMX_KB = 256 };

/* One 16 x 16 block of C: loaded (add) or zeroed into tile T, stored back;
 * a partial block through a 16 x 16 buffer. */
#define AMX_C_LOAD(T, i0, j0)                                                                              \
  do {                                                                                                     \
    int64_t ri = m - (i0), rj = n - (j0);                                                                  \
    if (!acc) _tile_zero(T);                                                                               \
    else if (ri >= 16 && rj >= 16) _tile_loadd(T, C + (i0) * ldc + (j0), ldc * 4);                         \
    else {                                                                                                 \
      memset(buf, 0, sizeof buf);                                                                          \
      for (int64_t r = 0; r < ri && r < 16; r++)                                                           \
        for (int64_t j = 0; j < rj && j < 16; j++) buf[r * 16 + j] = C[((i0) + r) * ldc + (j0) + j];       \
      _tile_loadd(T, buf, 64);                                                                             \
    }                                                                                                      \
  } while (0)
#define AMX_C_STORE(T, i0, j0)                                                                             \
  do {                                                                                                     \
    int64_t ri = m - (i0), rj = n - (j0);                                                                  \
    if (ri >= 16 && rj >= 16) _tile_stored(T, C + (i0) * ldc + (j0), ldc * 4);                             \
    else if (ri > 0 && rj > 0) {                                                                           \
      _tile_stored(T, buf, 64);                                                                            \
      for (int64_t r = 0; r < ri && r < 16; r++)                                                           \
        for (int64_t j = 0; j < rj && j < 16; j++) C[((i0) + r) * ldc + (j0) + j] = buf[r * 16 + j];       \
    }                                                                                                      \
  } while (0)

/* C (m x n) (+)= packed A (m x k) * packed B (k x n), C's rows ldc apart. */
AMX_TARGET void ampc__cpu_amx_gemm_packed(int64_t m, int64_t n, int64_t k, const void *Ap_, const void *Bp_, float *C,
                                          int64_t ldc, int add) {
  const uint16_t *Ap = amx_align((void *)Ap_), *Bp = amx_align((void *)Bp_);
  ampc__cpu_amx_begin();
  float buf[256] __attribute__((aligned(64)));
  int64_t kb = cpu_round_up(k, 32) / 32, mp = cpu_round_up(m, 32), np = cpu_round_up(n, 32);
  for (int64_t q0 = 0; q0 < kb; q0 += AMX_KB / 32) {
    int64_t q1 = q0 + AMX_KB / 32 < kb ? q0 + AMX_KB / 32 : kb;
    int acc = add || q0 > 0;
    int64_t outer = mp > np ? mp : np, inner = mp > np ? np : mp;
    for (int64_t o0 = 0; o0 < outer; o0 += 32)
      for (int64_t n0 = 0; n0 < inner; n0 += 32) {
        int64_t i0 = mp > np ? o0 : n0, j0 = mp > np ? n0 : o0;
        const uint16_t *b0 = Bp + ((j0 / 16) * kb) * 512, *b1 = b0 + kb * 512;
        const uint16_t *a0 = Ap + ((i0 / 16) * kb) * 512, *a1 = a0 + kb * 512;
        AMX_C_LOAD(0, i0, j0);
        AMX_C_LOAD(1, i0, j0 + 16);
        AMX_C_LOAD(2, i0 + 16, j0);
        AMX_C_LOAD(3, i0 + 16, j0 + 16);
        for (int64_t q = q0; q < q1; q++) {
          _tile_loadd(4, a0 + q * 512, 64);
          _tile_loadd(6, b0 + q * 512, 64);
          _tile_loadd(5, a1 + q * 512, 64);
          _tile_loadd(7, b1 + q * 512, 64);
          _tile_dpbf16ps(0, 4, 6);
          _tile_dpbf16ps(1, 4, 7);
          _tile_dpbf16ps(2, 5, 6);
          _tile_dpbf16ps(3, 5, 7);
        }
        AMX_C_STORE(0, i0, j0);
        AMX_C_STORE(1, i0, j0 + 16);
        AMX_C_STORE(2, i0 + 16, j0);
        AMX_C_STORE(3, i0 + 16, j0 + 16);
      }
  }
  ampc__cpu_amx_end();
}

/* The same packed product on AVX-512 BF16's dot products, for CPUs with
 * avx512_bf16 and no tiles (AMD Zen 4, Intel Cooper Lake). VDPBF16PS adds to
 * each of 16 f32 sums the products of a pair of bf16 from each operand: the
 * B tiles' rows are such pairs for 16 columns, and one pair of an A row,
 * broadcast, multiplies them. As on the tiles, the products of bf16 values
 * are exact in f32 and denormals are flushed. It runs at twice the FMAs'
 * rate (64 against 32 flops an instruction). */
int ampc__cpu_bf16dp_off = 0;
int ampc__cpu_bf16dp(void) { return !ampc__cpu_bf16dp_off && ampc__cpu_has_avx512_bf16(); }

/* One 16 x 16 block of C (ri x rj of it inside C) over nq slices of 32 k:
 * a is the A row block's first tile of them, b the B column block's. (On a
 * Zen 4, the pair broadcast as the instruction's memory operand, {1to16},
 * ran ~10% slower than GCC's broadcast into a register, and blocks of 8 rows
 * by 32 columns, half the broadcasts, no faster: the strided convolutions of
 * ResNet-18 spend most of their time outside the products now.) */
BF16_TARGET static void dp_block(const uint16_t *a, const uint16_t *b, int64_t nq, float *C, int64_t ldc, int64_t ri,
                               int64_t rj, int acc) {
  __m512 c[16];
  __mmask16 mc = amx_mask(rj);
#pragma GCC unroll 16
  for (int r = 0; r < 16; r++) c[r] = acc && r < ri ? _mm512_maskz_loadu_ps(mc, C + r * ldc) : _mm512_setzero_ps();
  for (int64_t q = 0; q < nq; q++, a += 512, b += 512) {
#pragma GCC unroll 16
    for (int p = 0; p < 16; p++) {
      __m512bh bv = (__m512bh)_mm512_load_si512((const void *)(b + p * 32));
#pragma GCC unroll 16
      for (int r = 0; r < 16; r++) {
        int32_t pair;
        memcpy(&pair, a + r * 32 + 2 * p, 4);
        c[r] = _mm512_dpbf16_ps(c[r], (__m512bh)_mm512_set1_epi32(pair), bv);
      }
    }
  }
  for (int r = 0; r < 16 && r < ri; r++) _mm512_mask_storeu_ps(C + r * ldc, mc, c[r]);
}

/* C (m x n) (+)= packed A * packed B as ampc__cpu_amx_gemm_packed: slices
 * of AMX_KB k, in which a 16-column B panel (8 KB) stays in L1 while the A
 * panels stream from L2 past it (or the other way round where n > m). */
BF16_TARGET void ampc__cpu_dp_gemm_packed(int64_t m, int64_t n, int64_t k, const void *Ap_, const void *Bp_, float *C,
                                        int64_t ldc, int add) {
  const uint16_t *Ap = amx_align((void *)Ap_), *Bp = amx_align((void *)Bp_);
  int64_t kb = cpu_round_up(k, 32) / 32, mb = cpu_round_up(m, 32) / 16, nb = cpu_round_up(n, 32) / 16;
  int rows_outer = mb > nb;
  for (int64_t q0 = 0; q0 < kb; q0 += AMX_KB / 32) {
    int64_t nq = q0 + AMX_KB / 32 < kb ? AMX_KB / 32 : kb - q0;
    int64_t outer = rows_outer ? mb : nb, inner = rows_outer ? nb : mb;
    for (int64_t o = 0; o < outer; o++)
      for (int64_t i = 0; i < inner; i++) {
        int64_t ib = rows_outer ? o : i, jb = rows_outer ? i : o;
        if (ib * 16 >= m || jb * 16 >= n) continue; /* (the padding to 32) */
        dp_block(Ap + (ib * kb + q0) * 512, Bp + (jb * kb + q0) * 512, nq, C + ib * 16 * ldc + jb * 16, ldc,
                 m - ib * 16, n - jb * 16, add || q0 > 0);
      }
  }
}
#else
int ampc__cpu_bf16dp_off = 0;
int ampc__cpu_bf16dp(void) { return 0; }
void ampc__cpu_dp_gemm_packed(int64_t m, int64_t n, int64_t k, const void *Ap, const void *Bp, float *C, int64_t ldc,
                              int add) {}
void ampc__cpu_amx_begin(void) {}
void ampc__cpu_amx_end(void) {}
void ampc__cpu_amx_pack_a(int64_t m, int64_t k, const float *A, int64_t lda, int ta, void *dst, int part, int nparts) {}
void ampc__cpu_amx_pack_b(int64_t k, int64_t n, const float *B, int64_t ldb, int tb, void *dst) {}
void ampc__cpu_amx_gemm_packed(int64_t m, int64_t n, int64_t k, const void *Ap, const void *Bp, float *C, int64_t ldc,
                               int add) {}
#endif

int ampc__cpu_bf16_products(void) { return ampc__cpu_amx() || ampc__cpu_bf16dp(); }

void ampc__cpu_bf16_gemm_packed(int64_t m, int64_t n, int64_t k, const void *Ap, const void *Bp, float *C,
                                int64_t ldc, int add) {
  if (ampc__cpu_amx()) ampc__cpu_amx_gemm_packed(m, n, k, Ap, Bp, C, ldc, add);
  else ampc__cpu_dp_gemm_packed(m, n, k, Ap, Bp, C, ldc, add);
}
