/* 3x3 stride-1 convolutions (padding 1) of bf16 on AMX tiles, without
 * im2col: the forward and the input gradient (the weight gradient is
 * im2col's, conv.c).
 *
 * A group of samples is staged once as bf16 planes padded by one pixel on
 * each side, two channels interleaved (pair-planes: the pair of a pixel side
 * by side, as the tiles' B operand wants them), the group's planes end to end.
 * In that layout the input under 16 consecutive output positions for one
 * tap (ky, kx) and 32 channels is 16 rows of 64 bytes, a plane apart: a tile
 * loaded straight from the staged planes. Output position f of the
 * concatenated padded planes reads input f + ky * Wp + kx for every tap, so
 * each tap is one matrix product over the channels, and the nine sum into the
 * same tiles. Positions in a padded plane's last two rows and columns are
 * computed and dropped (a plane of 4 x 4 keeps 16 of 36, of 32 x 32 1024 of
 * 1156).
 *
 * The input gradient is the same product over dY with the weight turned
 * (W'[c][o][ky][kx] = W[o][c][2 - ky][2 - kx]). bf16 products are exact in
 * f32, so the results are the f32 products' up to the order of the sums, as
 * on conv.c's tiles. */
#include <omp.h>
#include <stdint.h>

#include "backend/cpu/cpu_internal.h"

typedef struct {
  int64_t N, Ci, Co, H, W, Hp, Wp, plane;
  int64_t cb;    /* chunks of 32 input channels */
  int64_t ob;    /* blocks of 16 output channels (even) */
  int64_t G;     /* samples per group */
  int64_t F;     /* positions computed per group (a multiple of 32) */
  int64_t L;     /* a pair-plane's length, in pairs */
  size_t wbytes; /* packed weight, shared */
  size_t off_y, off_t, off_t2, off_t16, per_thread; /* bytes */
  int nt;
} a3_geom;

/* About 1 MB a thread for a group's staged planes and f32 outputs. */
enum { A3_GROUP_BYTES = 1 << 20 };

static size_t al64(size_t b) { return (b + 63) & ~(size_t)63; }

static a3_geom a3_geometry(int64_t N, int64_t Ci, int64_t Co, int64_t H, int64_t W, int nt) {
  a3_geom g;
  g.N = N; g.Ci = Ci; g.Co = Co; g.H = H; g.W = W;
  g.Hp = H + 2; g.Wp = W + 2; g.plane = g.Hp * g.Wp;
  g.cb = cpu_round_up(Ci, 32) / 32;
  g.ob = cpu_round_up(Co, 32) / 16;
  int64_t per = g.plane * (cpu_round_up(Co, 32) * 4 + cpu_round_up(Ci, 32) * 2);
  g.G = A3_GROUP_BYTES / (per > 0 ? per : 1);
  int64_t share = (N + (nt < 1 ? 1 : nt) - 1) / (nt < 1 ? 1 : nt);
  if (g.G > share) g.G = share;
  if (g.G < 1) g.G = 1;
  g.F = cpu_round_up(g.G * g.plane, 32);
  g.L = g.F + 2 * g.Wp + 2 + 32;
  g.wbytes = al64((size_t)(9 * g.ob * 16 * g.cb * 32) * 2) + 64;
  size_t pbytes = al64((size_t)(g.cb * 16 * g.L) * 4);
  g.off_y = pbytes;
  g.off_t = g.off_y + al64((size_t)(g.ob * 16 * g.F) * 4);
  g.off_t2 = g.off_t + al64((size_t)(H * W) * 4);
  g.off_t16 = g.off_t2 + al64((size_t)(H * W) * 4);
  g.per_thread = g.off_t16 + al64((size_t)(H * W) * 4) + 64; /* two bf16 planes */
  g.nt = nt < 1 ? 1 : nt;
  return g;
}

static a3_geom a3_of(const ampc__op_call *c, int bwd, int nt) {
  const ampc_shape *x = &c->in[0].shape, *w = &c->in[1].shape;
  return bwd ? a3_geometry(x->d[0], w->d[0], x->d[1], x->d[2], x->d[3], nt)
             : a3_geometry(x->d[0], x->d[1], w->d[0], x->d[2], x->d[3], nt);
}

typedef struct {
  int64_t N, Ci, Co, H, W, Hp, Wp, plane, Cop, Cip;
  int64_t G, F;  /* samples per group; positions per group (a multiple of 32) */
  int64_t QL;    /* positions staged per channel: F and what the taps reach past it */
  size_t shared, off_db, off_dy, off_xp, off_q0, off_q1, off_t, off_t16, per_thread; /* bytes */
  int nt;
} a3w_geom;

/* About 2 MB a thread for a group's staged dY and input. */
enum { A3W_GROUP_BYTES = 2 << 20 };

static a3w_geom a3w_of(const ampc__op_call *c, int nt) {
  a3w_geom g;
  const ampc_shape *x = &c->in[0].shape, *w = &c->in[1].shape;
  g.N = x->d[0]; g.Ci = x->d[1]; g.H = x->d[2]; g.W = x->d[3]; g.Co = w->d[0];
  g.Hp = g.H + 2; g.Wp = g.W + 2; g.plane = g.Hp * g.Wp;
  g.Cop = cpu_round_up(g.Co, 32); g.Cip = cpu_round_up(g.Ci, 32);
  /* groups of about 2 MB staged, and at least the size of the f32 partial
   * weight gradient the tiles add each group to (9 Cop Cip floats: for 512
   * channels 9.4 MB); no more than a thread's share of the batch */
  int64_t per = g.plane * (g.Cop * 2 + g.Cip * 6), dwb = 9 * g.Cop * g.Cip * 4;
  int64_t budget = dwb > A3W_GROUP_BYTES ? dwb : A3W_GROUP_BYTES;
  g.G = budget / (per > 0 ? per : 1);
  int64_t share = (g.N + (nt < 1 ? 1 : nt) - 1) / (nt < 1 ? 1 : nt);
  if (g.G > share) g.G = share;
  if (g.G < 1) g.G = 1;
  g.F = cpu_round_up(g.G * g.plane, 32);
  g.QL = cpu_round_up(g.F + 2 * g.Wp + 2 + 2, 32);
  size_t ok = (size_t)(g.Co * g.Ci * 9) * 4;
  g.shared = al64(ok) * 2 + 64;
  size_t dwt = al64((size_t)(9 * g.Cop * g.Cip) * 4), HW = (size_t)(g.H * g.W);
  g.off_db = dwt;
  g.off_dy = g.off_db + al64((size_t)g.Cop * 4);
  g.off_xp = g.off_dy + al64((size_t)(g.Cop * g.F) * 2);
  g.off_q0 = g.off_xp + al64((size_t)(g.Cip * g.QL) * 2);
  g.off_q1 = g.off_q0 + al64((size_t)(g.QL / 2 * g.Cip) * 4);
  g.off_t = g.off_q1 + al64((size_t)(g.QL / 2 * g.Cip) * 4);
  g.off_t16 = g.off_t + al64(HW * 4);
  g.per_thread = g.off_t16 + al64(HW * 4) + 64;
  g.nt = nt < 1 ? 1 : nt;
  return g;
}

/* Room for every thread count up to the compiled one: fewer threads at run
 * time take larger groups. */
size_t ampc__cpu_a3_ws(const ampc__op_call *c, int nthreads) {
  size_t best = 0;
  for (int t = 1; t <= (nthreads < 1 ? 1 : nthreads); t++) {
    a3w_geom gw = a3w_of(c, t);
    size_t s = gw.shared + (size_t)gw.nt * gw.per_thread + 64;
    if (s > best) best = s;
    for (int bwd = 0; bwd < 2; bwd++) {
      a3_geom g = a3_of(c, bwd, t);
      s = g.wbytes + (size_t)g.nt * g.per_thread + 64;
      if (s > best) best = s;
    }
  }
  return best;
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11 && defined(__linux__)
#include <immintrin.h>
#define A3_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c,amx-tile,amx-bf16")))

/* At most the threads whose slices (per_thread bytes each, after `shared`)
 * the call's workspace holds. */
static ampc_status a3_threads(const ampc__op_call *c, size_t shared, size_t per_thread, int *nt) {
  size_t room = c->ws_size > shared + 64 ? (c->ws_size - shared - 64) / per_thread : 0;
  if (room < 1) return ampc__error(AMPC_ESTATE, "conv2d: AMX workspace too small");
  if ((size_t)*nt > room) *nt = (int)room;
  return AMPC_OK;
}

/* The weight's tiles: [tap][block of 16 outputs][chunk of 32 inputs][16][32],
 * out-of-range entries zero; turned (input gradient) or not. Threads share
 * the blocks. */
static void a3_pack_weight(const a3_geom *g, const uint16_t *w, int turned, uint16_t *dst, int part, int nparts) {
  int64_t units = 9 * g->ob, u0 = units * part / nparts, u1 = units * (part + 1) / nparts;
  for (int64_t u = u0; u < u1; u++) {
    int64_t t = u / g->ob, b = u % g->ob;
    for (int64_t q = 0; q < g->cb; q++) {
      uint16_t *tile = dst + ((t * g->ob + b) * g->cb + q) * 512;
      for (int r = 0; r < 16; r++) {
        int64_t o = b * 16 + r;
        for (int p = 0; p < 32; p++) {
          int64_t i = q * 32 + p;
          uint16_t v = 0;
          if (o < g->Co && i < g->Ci)
            /* forward: W[o][i][t]; turned: the stored weight is (Ci' = Co, Co' = Ci): W[i][o][8 - t] */
            v = turned ? w[(i * g->Co + o) * 9 + (8 - t)] : w[(o * g->Ci + i) * 9 + t];
          tile[r * 32 + p] = v;
        }
      }
    }
  }
}

/* One group's products: out (ob*16 x F f32, rows F apart) = sum over taps of
 * W_t * shifted planes. */
A3_TARGET static void a3_products(const a3_geom *g, const uint16_t *wp, const uint16_t *pp, float *out) {
  ampc__cpu_amx_begin();
  const int64_t lstride = g->L * 4; /* bytes between pair-planes */
  for (int64_t b = 0; b < g->ob; b += 2)
    for (int64_t f0 = 0; f0 < g->F; f0 += 32) {
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int t = 0; t < 9; t++) {
        int64_t off = (t / 3) * g->Wp + t % 3;
        const uint16_t *a0 = wp + ((t * g->ob + b) * g->cb) * 512, *a1 = a0 + g->cb * 512;
        const uint16_t *b0 = pp + (f0 + off) * 2;
        for (int64_t q = 0; q < g->cb; q++) {
          _tile_loadd(4, a0 + q * 512, 64);
          _tile_loadd(6, b0 + q * 16 * g->L * 2, lstride);
          _tile_loadd(5, a1 + q * 512, 64);
          _tile_loadd(7, b0 + q * 16 * g->L * 2 + 32, lstride);
          _tile_dpbf16ps(0, 4, 6);
          _tile_dpbf16ps(1, 4, 7);
          _tile_dpbf16ps(2, 5, 6);
          _tile_dpbf16ps(3, 5, 7);
        }
      }
      float *o0 = out + b * 16 * g->F + f0, *o1 = o0 + 16 * g->F;
      _tile_stored(0, o0, g->F * 4);
      _tile_stored(1, o0 + 16, g->F * 4);
      _tile_stored(2, o1, g->F * 4);
      _tile_stored(3, o1 + 16, g->F * 4);
    }
  ampc__cpu_amx_end();
}

/* The plane of HW values of channel ch at element `at` of x as bf16: the
 * tensor's own values, or through the call's batch norm prologue (pro) into
 * t16 (tf: HW floats of room). */
static const uint16_t *a3_channel(const ampc__op_call *c, const ampc_tensor *x, int pro, int64_t at, int64_t HW,
                                  int64_t ch, float *tf, uint16_t *t16) {
  if (!pro) return (const uint16_t *)x->data + at;
  const float *v = cpu_load_input(c, at, (size_t)HW, ch, tf);
  ampc_f32_to_bf16_n(t16, v, (size_t)HW);
  return t16;
}

/* Stages samples [n0, n0 + ns) of x (bf16 planes, or through the call's
 * batch norm prologue when pro) as pair-planes: a pair's two planes read
 * 16 pixels at a time and interleaved into 64-byte rows. */
A3_TARGET static void a3_stage(const a3_geom *g, const ampc__op_call *c, const ampc_tensor *x, int pro, int64_t n0,
                               int64_t ns, uint16_t *pp, float *tf, uint16_t *t16) {
  memset(pp, 0, (size_t)(g->cb * 16 * g->L) * 4);
  int64_t HW = g->H * g->W;
  const __m512i ilv = _mm512_set_epi16(CPU_AMX_PAIRS_IDX);
  for (int64_t s = 0; s < ns; s++)
    for (int64_t ch = 0; ch < g->Ci; ch += 2) {
      /* the pair's first plane goes through t16 when staged, the second
       * through t16's second half */
      int64_t at = ((n0 + s) * g->Ci + ch) * HW;
      const uint16_t *s0 = a3_channel(c, x, pro, at, HW, ch, tf, t16);
      const uint16_t *s1 = ch + 1 < g->Ci ? a3_channel(c, x, pro, at + HW, HW, ch + 1, tf, t16 + HW) : NULL;
      uint16_t *dst = pp + ((ch >> 1) * g->L + s * g->plane + g->Wp + 1) * 2;
      for (int64_t iy = 0; iy < g->H; iy++)
        for (int64_t ix = 0; ix < g->W; ix += 16) {
          int64_t n = g->W - ix < 16 ? g->W - ix : 16;
          __mmask16 m = n >= 16 ? 0xffff : (__mmask16)((1u << n) - 1);
          __m256i a = _mm256_maskz_loadu_epi16(m, s0 + iy * g->W + ix);
          __m256i b = s1 ? _mm256_maskz_loadu_epi16(m, s1 + iy * g->W + ix) : _mm256_setzero_si256();
          __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
          __mmask32 m2 = n >= 16 ? 0xffffffffu : (__mmask32)((1ull << (2 * n)) - 1);
          _mm512_mask_storeu_epi16(dst + (iy * g->Wp + ix) * 2, m2, _mm512_permutexvar_epi16(ilv, both));
        }
    }
}

/* Forward (bwd 0: y = conv(x)) or input gradient (bwd 1: dx = conv'(dY)). */
static ampc_status a3_run(const ampc__op_call *c, int bwd) {
  const ampc_tensor *x = bwd ? &c->dout : &c->in[0];
  int nt = cpu_ctx(c)->nthreads;
  a3_geom g = a3_of(c, bwd, nt);
  /* threads the workspace holds */
  AMPC_TRY(a3_threads(c, g.wbytes, g.per_thread, &g.nt));
  char *base = (char *)(((uintptr_t)c->ws + 63) & ~(uintptr_t)63);
  uint16_t *wp = (uint16_t *)base;
  const ampc_tensor *b = !bwd && c->n_in > 2 ? &c->in[2] : NULL;
  const ampc_tensor *dx = &c->din[0];
  int pro = !bwd && c->pro;
  int64_t HW = g.H * g.W, ngr = (g.N + g.G - 1) / g.G;
#pragma omp parallel num_threads(g.nt)
  {
    int tid = omp_get_thread_num();
    char *ws = base + g.wbytes + (size_t)tid * g.per_thread;
    uint16_t *pp = (uint16_t *)ws, *t16 = (uint16_t *)(ws + g.off_t16);
    float *yf = (float *)(ws + g.off_y), *tf = (float *)(ws + g.off_t), *tf2 = (float *)(ws + g.off_t2);
    a3_pack_weight(&g, (const uint16_t *)c->in[1].data, bwd, wp, tid, omp_get_num_threads());
#pragma omp barrier
#pragma omp for schedule(dynamic, 1) nowait
    for (int64_t gi = 0; gi < ngr; gi++) {
      int64_t n0 = gi * g.G, ns = g.N - n0 < g.G ? g.N - n0 : g.G;
      a3_stage(&g, c, x, pro, n0, ns, pp, tf, t16);
      a3_products(&g, wp, pp, yf);
      for (int64_t s = 0; s < ns; s++)
        for (int64_t o = 0; o < g.Co; o++) {
          const float *src = yf + o * g.F + s * g.plane;
          float bv = 0.0f;
          if (b) ampc_load_f32(&bv, b->dtype, cpu_at(b, o), 1);
          for (int64_t oy = 0; oy < g.H; oy++)
            for (int64_t ox = 0; ox < g.W; ox++) tf[oy * g.W + ox] = src[oy * g.Wp + ox] + bv;
          int64_t at = ((n0 + s) * g.Co + o) * HW;
          if (bwd) cpu_store_grad(c, dx, at, tf, (size_t)HW, c->din_acc[0], tf2);
          else cpu_store(&c->out, at, tf, (size_t)HW, 0, NULL);
        }
    }
  }
  return AMPC_OK;
}
/* ---- the weight gradient: dW_t (Co x Ci) = sum over positions f of
 * dY[o][f] * X[c][f + off_t], dY on the padded positions (zero where no
 * output is) as the tiles' A (32 positions a row), the input as B: pairs of
 * positions per channel, staged twice (pairs starting at even positions and
 * at odd ones) since a tap's offset may be odd. */

/* The staged input's pairs of positions, channels side by side: a row of
 * 16 channels' pairs is one gather of 16 32-bit values a channel apart. */
A3_TARGET static void a3w_pairs(const a3w_geom *g, const uint16_t *xp, uint16_t *q0, uint16_t *q1) {
  int64_t np = g->QL / 2 - 1;
  const __m512i idx = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                         _mm512_set1_epi32((int)(g->QL * 2)));
  for (int64_t c0 = 0; c0 < g->Cip; c0 += 16) {
    const uint16_t *src = xp + c0 * g->QL;
    uint32_t *d0 = (uint32_t *)q0 + c0, *d1 = (uint32_t *)q1 + c0;
    for (int64_t p = 0; p < np; p++) {
      _mm512_storeu_si512((void *)(d0 + p * g->Cip), _mm512_i32gather_epi32(idx, (const void *)(src + 2 * p), 1));
      _mm512_storeu_si512((void *)(d1 + p * g->Cip), _mm512_i32gather_epi32(idx, (const void *)(src + 2 * p + 1), 1));
    }
  }
}

A3_TARGET static void a3w_products(const a3w_geom *g, const uint16_t *dy, const uint16_t *q0, const uint16_t *q1,
                                   float *dwt) {
  ampc__cpu_amx_begin();
  const int64_t ldq = g->Cip * 2; /* uint16 between pair rows */
  for (int t = 0; t < 9; t++) {
    int64_t off = (t / 3) * g->Wp + t % 3;
    const uint16_t *q = (off & 1) ? q1 : q0;
    int64_t pp = (off & 1) ? (off - 1) / 2 : off / 2; /* pair row of position f = 0 */
    float *dt = dwt + (size_t)t * g->Cop * g->Cip;
    for (int64_t o0 = 0; o0 < g->Cop; o0 += 32)
      for (int64_t c0 = 0; c0 < g->Cip; c0 += 32) {
        float *d0 = dt + o0 * g->Cip + c0, *d1 = d0 + 16 * g->Cip;
        _tile_loadd(0, d0, g->Cip * 4);
        _tile_loadd(1, d0 + 16, g->Cip * 4);
        _tile_loadd(2, d1, g->Cip * 4);
        _tile_loadd(3, d1 + 16, g->Cip * 4);
        const uint16_t *a0 = dy + o0 * g->F, *a1 = a0 + 16 * g->F;
        const uint16_t *b0 = q + pp * ldq + c0 * 2;
        for (int64_t f0 = 0; f0 < g->F; f0 += 32) {
          _tile_loadd(4, a0 + f0, g->F * 2);
          _tile_loadd(6, b0 + (f0 / 2) * ldq, ldq * 2);
          _tile_loadd(5, a1 + f0, g->F * 2);
          _tile_loadd(7, b0 + (f0 / 2) * ldq + 32, ldq * 2);
          _tile_dpbf16ps(0, 4, 6);
          _tile_dpbf16ps(1, 4, 7);
          _tile_dpbf16ps(2, 5, 6);
          _tile_dpbf16ps(3, 5, 7);
        }
        _tile_stored(0, d0, g->Cip * 4);
        _tile_stored(1, d0 + 16, g->Cip * 4);
        _tile_stored(2, d1, g->Cip * 4);
        _tile_stored(3, d1 + 16, g->Cip * 4);
      }
  }
  ampc__cpu_amx_end();
}

ampc_status ampc__cpu_a3_bwd_weights(const ampc__op_call *c) {
  const ampc_tensor *dy = &c->dout, *dw = &c->din[1];
  const ampc_tensor *db = c->n_in > 2 ? &c->din[2] : NULL;
  int need_dw = dw->data != NULL, need_db = db && db->data;
  a3w_geom g = a3w_of(c, cpu_ctx(c)->nthreads);
  AMPC_TRY(a3_threads(c, g.shared, g.per_thread, &g.nt));
  char *base = (char *)(((uintptr_t)c->ws + 63) & ~(uintptr_t)63);
  int64_t HW = g.H * g.W, ngr = (g.N + g.G - 1) / g.G, K9 = g.Ci * 9;
  size_t ok = (size_t)(g.Co * K9);
  float *sum = (float *)base, *tmp = (float *)(base + al64(ok * 4));
  int nth_used = 1;
#pragma omp parallel num_threads(g.nt)
  {
    int tid = omp_get_thread_num(), nth = omp_get_num_threads();
#pragma omp single
    nth_used = nth;
    char *ws = base + g.shared + (size_t)tid * g.per_thread;
    float *dwt = (float *)ws, *dbt = (float *)(ws + g.off_db), *tf = (float *)(ws + g.off_t);
    uint16_t *dyb = (uint16_t *)(ws + g.off_dy), *xp = (uint16_t *)(ws + g.off_xp);
    uint16_t *q0 = (uint16_t *)(ws + g.off_q0), *q1 = (uint16_t *)(ws + g.off_q1), *t16 = (uint16_t *)(ws + g.off_t16);
    memset(dwt, 0, (size_t)(9 * g.Cop * g.Cip) * 4);
    memset(dbt, 0, (size_t)g.Cop * 4);
    /* groups in a fixed share: the partial sums are added in thread order */
    for (int64_t gi = tid; gi < ngr; gi += nth) {
      int64_t n0 = gi * g.G, ns = g.N - n0 < g.G ? g.N - n0 : g.G;
      memset(dyb, 0, (size_t)(g.Cop * g.F) * 2);
      memset(xp, 0, (size_t)(g.Cip * g.QL) * 2);
      for (int64_t s = 0; s < ns; s++) {
        for (int64_t o = 0; o < g.Co; o++) {
          const uint16_t *src = (const uint16_t *)dy->data + ((n0 + s) * g.Co + o) * HW;
          uint16_t *dst = dyb + o * g.F + s * g.plane;
          for (int64_t oy = 0; oy < g.H; oy++) memcpy(dst + oy * g.Wp, src + oy * g.W, (size_t)g.W * 2);
          if (need_db) {
            const float *v = cpu_load(dy, ((n0 + s) * g.Co + o) * HW, (size_t)HW, tf);
            dbt[o] += cpu_sum(v, (size_t)HW);
          }
        }
        if (need_dw)
          for (int64_t ch = 0; ch < g.Ci; ch++) {
            const uint16_t *src = a3_channel(c, &c->in[0], c->pro != NULL, ((n0 + s) * g.Ci + ch) * HW, HW, ch, tf, t16);
            uint16_t *dst = xp + ch * g.QL + s * g.plane + g.Wp + 1;
            for (int64_t iy = 0; iy < g.H; iy++) memcpy(dst + iy * g.Wp, src + iy * g.W, (size_t)g.W * 2);
          }
      }
      if (!need_dw) continue;
      /* the pairs: q0[p][c] = positions (2p, 2p + 1) of channel c, q1[p][c] = (2p + 1, 2p + 2) */
      a3w_pairs(&g, xp, q0, q1);
      a3w_products(&g, dyb, q0, q1, dwt);
    }
  }
  /* the partials in thread order, then dW's layout [o][c][tap] */
  float *acc = (float *)(base + g.shared);
  for (int t = 1; t < nth_used; t++) {
    const float *part = (const float *)(base + g.shared + (size_t)t * g.per_thread);
    for (int64_t i = 0; i < 9 * g.Cop * g.Cip + g.Cop; i++) acc[i] += part[i];
  }
  if (need_dw) {
    for (int64_t o = 0; o < g.Co; o++)
      for (int64_t ch = 0; ch < g.Ci; ch++)
        for (int t = 0; t < 9; t++) sum[o * K9 + ch * 9 + t] = acc[((size_t)t * g.Cop + o) * g.Cip + ch];
    cpu_store_grad(c, dw, 0, sum, ok, c->din_acc[1], tmp);
  }
  if (need_db) {
    const float *dbs = (const float *)((char *)acc + g.off_db);
    memcpy(sum, dbs, (size_t)g.Co * 4);
    cpu_store_grad(c, db, 0, sum, (size_t)g.Co, c->din_acc[2], tmp);
  }
  return AMPC_OK;
}
#else
static ampc_status a3_run(const ampc__op_call *c, int bwd) {
  return ampc__error(AMPC_ESTATE, "conv2d: AMX tiles not built in");
}
ampc_status ampc__cpu_a3_bwd_weights(const ampc__op_call *c) {
  return ampc__error(AMPC_ESTATE, "conv2d: AMX tiles not built in");
}
#endif

ampc_status ampc__cpu_a3_fwd(const ampc__op_call *c) { return a3_run(c, 0); }
ampc_status ampc__cpu_a3_bwd_data(const ampc__op_call *c) { return a3_run(c, 1); }
