/* Winograd F(2x2, 3x3) convolution for stride-1 3x3 kernels.
 *
 * Each 2x2 block of outputs is computed from a 4x4 input tile with 16
 * products per (input, output) channel pair instead of 36:
 *
 *   Y = A^T [ U (.) V ] A,   U = G g G^T (weights),   V = B^T d B (input tile)
 *
 * where (.) is the element-wise product summed over input channels. Summed
 * over channels, each of the 16 transform points is one matrix product
 *
 *   M[xi] (co, tiles) = U[xi] (co, ci) * V[xi] (ci, tiles)
 *
 * done by sgemm. The tiles are processed in chunks (several samples, or a band
 * of tile rows of one sample) small enough that V and M stay in cache. Every
 * thread works on the same chunk: the input transform is split by (sample,
 * channel), the 16 products by transform point, the output transform by
 * (sample, channel), with a barrier between phases; so no thread keeps a
 * private copy of anything large and the results do not depend on timing.
 *
 * Backward data is the same convolution of dY with the weights rotated by 180
 * degrees and their channel axes swapped, padded by 2 - pad. Backward weights
 * works in the transform domain: dU[xi] = sum over tiles of dM[xi] V[xi]^T with
 * dM = A dY A^T, then dg = G^T dU G. Half inputs are converted to f32 as a
 * plane is staged for the transform, and outputs are rounded to their storage
 * type as they are stored, so 16-bit storage adds no pass over memory.
 */
#include <cblas.h>
#include <omp.h>

#include "backend/cpu/cpu_internal.h"

enum { WG_P = 16, WG_MIN_TILES = 256 };
#define WG_CHUNK_BYTES ((size_t)4 << 20)

/* One convolution as Winograd sees it: ci input channels of ih x iw planes,
 * padded by pad, into co output channels of oh x ow. */
typedef struct {
  int64_t N, ci, co, ih, iw, oh, ow, pad;
  int64_t th, tw;   /* tile rows and columns */
  int64_t nb, rb;   /* samples per chunk; tile rows per chunk (th when nb > 1) */
  int64_t tbmax;    /* tiles of the largest chunk */
  int64_t prow, pcol; /* staged, zero-padded band of an input plane */
} wg_geom;

/* Tiles per chunk when > 0 instead of the size chosen for the cache: a hook
 * for tests, which use it to exercise chunks of bands and of several samples. */
int64_t ampc__cpu_wino_tile_target = 0;

static wg_geom wg_geometry(int64_t N, int64_t ci, int64_t co, int64_t ih, int64_t iw, int64_t oh, int64_t ow, int64_t pad) {
  wg_geom g;
  g.N = N; g.ci = ci; g.co = co; g.ih = ih; g.iw = iw; g.oh = oh; g.ow = ow; g.pad = pad;
  g.th = (oh + 1) / 2; g.tw = (ow + 1) / 2;
  int64_t tps = g.th * g.tw;
  int64_t target = (int64_t)(WG_CHUNK_BYTES / ((size_t)WG_P * sizeof(float) * (size_t)(ci + co)));
  if (target < WG_MIN_TILES) target = WG_MIN_TILES;
  if (ampc__cpu_wino_tile_target > 0) target = ampc__cpu_wino_tile_target;
  if (tps >= target) {
    g.nb = 1;
    g.rb = target / g.tw;
    if (g.rb < 1) g.rb = 1;
    if (g.rb > g.th) g.rb = g.th;
  } else {
    g.rb = g.th;
    g.nb = target / tps;
    if (g.nb > N) g.nb = N;
    if (g.nb < 1) g.nb = 1;
  }
  g.tbmax = g.nb * g.rb * g.tw;
  g.prow = 2 * g.rb + 2;
  g.pcol = 2 * g.tw + 2;
  return g;
}

/* Workspace: shared U (or dU) and the chunk's V and M, then per thread a
 * staged plane band, four transformed rows, two output rows and two rows of
 * 9 * channels for weight gradients. */
typedef struct {
  wg_geom f, d;      /* forward (and backward weights); backward data */
  size_t off_v, off_m, off_db, shared, per_thread; /* floats */
  size_t off_pl, off_r, off_row, off_w, off_tmp;   /* within a thread's slice */
} wg_layout;

static wg_layout wg_plan(const ampc__op_call *c) {
  wg_layout L;
  const ampc_shape *x = &c->in[0].shape, *w = &c->in[1].shape, *y = &c->out.shape;
  int64_t N = x->d[0], C = x->d[1], H = x->d[2], W = x->d[3], O = w->d[0], OH = y->d[2], OW = y->d[3], p = c->attr.pad;
  L.f = wg_geometry(N, C, O, H, W, OH, OW, p);
  L.d = wg_geometry(N, O, C, OH, OW, H, W, 2 - p);
  int64_t cmax = C > O ? C : O, tb = L.f.tbmax > L.d.tbmax ? L.f.tbmax : L.d.tbmax;
  L.off_v = (size_t)(WG_P * O * C);
  L.off_m = L.off_v + (size_t)(WG_P * cmax * tb);
  L.off_db = L.off_m + (size_t)(WG_P * cmax * tb);
  L.shared = L.off_db + (size_t)O + 16;
  size_t pl = (size_t)(L.f.prow * L.f.pcol), pld = (size_t)(L.d.prow * L.d.pcol);
  size_t pc = (size_t)(L.f.pcol > L.d.pcol ? L.f.pcol : L.d.pcol);
  size_t wrow = (size_t)(9 * cmax) > 2 * pc ? (size_t)(9 * cmax) : 2 * pc;
  L.off_pl = 0;
  L.off_r = L.off_pl + (pl > pld ? pl : pld);
  L.off_row = L.off_r + 4 * pc;
  L.off_w = L.off_row + 2 * pc;
  L.off_tmp = L.off_w + wrow;
  L.per_thread = L.off_tmp + wrow + 16;
  return L;
}

int ampc__cpu_wino_applies(const ampc__op_call *c) {
  const ampc_shape *w = &c->in[1].shape;
  return w->d[2] == 3 && w->d[3] == 3 && c->attr.stride == 1 && c->attr.pad >= 0 && c->attr.pad <= 2;
}

size_t ampc__cpu_wino_ws(const ampc__op_call *c, int nthreads) {
  wg_layout L = wg_plan(c);
  return (L.shared + L.per_thread * (size_t)(nthreads < 1 ? 1 : nthreads)) * sizeof(float);
}

/* ---- transforms ---- */

/* U = G g G^T of one 3x3 kernel, written with stride `stride` between points. */
static void wg_weight(const float *g, float *u, size_t stride) {
  float t[4][3];
  for (int k = 0; k < 3; k++) {
    float g0 = g[k], g1 = g[3 + k], g2 = g[6 + k];
    t[0][k] = g0;
    t[1][k] = 0.5f * (g0 + g1 + g2);
    t[2][k] = 0.5f * (g0 - g1 + g2);
    t[3][k] = g2;
  }
  for (int i = 0; i < 4; i++) {
    float a = t[i][0], b = t[i][1], d = t[i][2];
    u[(size_t)(i * 4 + 0) * stride] = a;
    u[(size_t)(i * 4 + 1) * stride] = 0.5f * (a + b + d);
    u[(size_t)(i * 4 + 2) * stride] = 0.5f * (a - b + d);
    u[(size_t)(i * 4 + 3) * stride] = d;
  }
}

/* dg = G^T dU G of one 4x4 gradient, read with stride `stride` between points. */
static void wg_weight_grad(const float *du, size_t stride, float *dg) {
  float t[3][4];
  for (int j = 0; j < 4; j++) {
    float u0 = du[(size_t)(0 * 4 + j) * stride], u1 = du[(size_t)(1 * 4 + j) * stride];
    float u2 = du[(size_t)(2 * 4 + j) * stride], u3 = du[(size_t)(3 * 4 + j) * stride];
    t[0][j] = u0 + 0.5f * (u1 + u2);
    t[1][j] = 0.5f * (u1 - u2);
    t[2][j] = 0.5f * (u1 + u2) + u3;
  }
  for (int k = 0; k < 3; k++) {
    dg[k * 3 + 0] = t[k][0] + 0.5f * (t[k][1] + t[k][2]);
    dg[k * 3 + 1] = 0.5f * (t[k][1] - t[k][2]);
    dg[k * 3 + 2] = 0.5f * (t[k][1] + t[k][2]) + t[k][3];
  }
}

/* The transforms are loops over a row of tiles written to vectorise; they
 * are built twice, for AVX2 and for the baseline, and the loader picks one. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(AMPC_NO_CLONES)
#define WG_VECTOR __attribute__((target_clones("avx2", "default")))
#else
#define WG_VECTOR
#endif

/* Stages tile rows [ty0, ty1) of one input plane (element offset `at` of
 * tensor t) as f32 with its zero padding: row r is input row 2*ty0 - pad + r;
 * a row holds the even padded columns (q = 2k, input column q - pad) in its
 * first tw + 1 floats and the odd ones after them, so that the transform
 * reads every operand with unit stride. */
static void wg_stage(const wg_geom *g, const ampc_tensor *t, int64_t at, int64_t ty0, int64_t ty1, float *pl, float *tmp) {
  int64_t rows = 2 * (ty1 - ty0) + 2, half = g->tw + 1;
  for (int64_t r = 0; r < rows; r++) {
    float *dst = pl + r * g->pcol;
    int64_t iy = 2 * ty0 - g->pad + r;
    memset(dst, 0, (size_t)g->pcol * sizeof(float));
    if (iy < 0 || iy >= g->ih) continue;
    const float *src = cpu_load(t, at + iy * g->iw, (size_t)g->iw, tmp);
    float *even = dst, *odd = dst + half;
    int64_t ix = 0, q = g->pad;
    if (q & 1) odd[q++ / 2] = src[ix++];
    for (; ix + 1 < g->iw; ix += 2, q += 2) {
      even[q / 2] = src[ix];
      odd[q / 2] = src[ix + 1];
    }
    if (ix < g->iw) even[q / 2] = src[ix];
  }
}

/* V = B^T d B for one row of tiles: d0..d3 are four staged rows (even
 * columns, then odd), r scratch for 4 rows, v the 16 output streams. */
WG_VECTOR static void wg_input_row(const float *d0, const float *d1, const float *d2, const float *d3, int64_t tw, float *r,
                                   float *v, size_t vstride) {
  int64_t pc = 2 * tw + 2, half = tw + 1;
  float *r0 = r, *r1 = r + pc, *r2 = r + 2 * pc, *r3 = r + 3 * pc;
  for (int64_t q = 0; q < pc; q++) {
    r0[q] = d0[q] - d2[q];
    r1[q] = d1[q] + d2[q];
    r2[q] = d2[q] - d1[q];
    r3[q] = d1[q] - d3[q];
  }
  for (int i = 0; i < 4; i++) {
    const float *e = r + i * pc, *o = e + half;
    float *v0 = v + (size_t)(i * 4 + 0) * vstride, *v1 = v + (size_t)(i * 4 + 1) * vstride;
    float *v2 = v + (size_t)(i * 4 + 2) * vstride, *v3 = v + (size_t)(i * 4 + 3) * vstride;
    for (int64_t tx = 0; tx < tw; tx++) {
      v0[tx] = e[tx] - e[tx + 1];
      v1[tx] = o[tx] + e[tx + 1];
      v2[tx] = e[tx + 1] - o[tx];
      v3[tx] = o[tx] - o[tx + 1];
    }
  }
}

/* V for the tiles of rows [ty0, ty1) of a staged plane, into
 * v[xi * vstride + t0 + (ty - ty0) * tw + tx]. */
static void wg_input(const wg_geom *g, const float *pl, int64_t ty0, int64_t ty1, float *r, float *v, size_t vstride,
                     int64_t t0) {
  int64_t pc = g->pcol;
  for (int64_t ty = ty0; ty < ty1; ty++) {
    const float *d0 = pl + 2 * (ty - ty0) * pc;
    wg_input_row(d0, d0 + pc, d0 + 2 * pc, d0 + 3 * pc, g->tw, r, v + t0 + (ty - ty0) * g->tw, vstride);
  }
}

/* dM = A dY A^T for one row of tiles from the two gradient rows y0, y1
 * (2 * tw values each, zero past the plane), into 16 streams. */
WG_VECTOR static void wg_output_grad_row(const float *y0, const float *y1, int64_t tw, float *m, size_t mstride) {
  float *m0 = m, *m1 = m + mstride, *m2 = m + 2 * mstride, *m3 = m + 3 * mstride;
  for (int64_t tx = 0; tx < tw; tx++) {
    float a = y0[2 * tx], b = y0[2 * tx + 1], c = y1[2 * tx], d = y1[2 * tx + 1];
    /* rows of A dY: (a, b), (a + c, b + d), (a - c, b - d), (-c, -d); each
     * row (p, s) becomes (p, p + s, p - s, -s) */
    float p1 = a + c, s1 = b + d, p2 = a - c, s2 = b - d;
    m0[tx] = a;
    m1[tx] = a + b;
    m2[tx] = a - b;
    m3[tx] = -b;
    m0[4 * mstride + tx] = p1;
    m1[4 * mstride + tx] = p1 + s1;
    m2[4 * mstride + tx] = p1 - s1;
    m3[4 * mstride + tx] = -s1;
    m0[8 * mstride + tx] = p2;
    m1[8 * mstride + tx] = p2 + s2;
    m2[8 * mstride + tx] = p2 - s2;
    m3[8 * mstride + tx] = -s2;
    m0[12 * mstride + tx] = -c;
    m1[12 * mstride + tx] = -c - d;
    m2[12 * mstride + tx] = d - c;
    m3[12 * mstride + tx] = d;
  }
}

/* dM for the tiles of output rows [2*ty0, 2*ty1) of one gradient plane
 * (element offset `at` of dy), zero outside the plane; laid out like V. */
static void wg_output_grad(const wg_geom *g, const ampc_tensor *dy, int64_t at, int64_t ty0, int64_t ty1, float *rows,
                           float *tmp, float *m, size_t mstride, int64_t t0) {
  int64_t tw = g->tw, w2 = 2 * tw;
  for (int64_t ty = ty0; ty < ty1; ty++) {
    for (int i = 0; i < 2; i++) {
      float *dst = rows + i * w2;
      int64_t oy = 2 * ty + i;
      if (oy >= g->oh) {
        memset(dst, 0, (size_t)w2 * sizeof(float));
        continue;
      }
      const float *src = cpu_load(dy, at + oy * g->ow, (size_t)g->ow, tmp);
      memcpy(dst, src, (size_t)g->ow * sizeof(float));
      for (int64_t q = g->ow; q < w2; q++) dst[q] = 0.0f;
    }
    wg_output_grad_row(rows, rows + w2, tw, m + t0 + (ty - ty0) * tw, mstride);
  }
}

/* Y = A^T m A for one row of tiles, plus the bias: 16 streams in, two
 * output rows of 2 * tw values out. */
WG_VECTOR static void wg_output_row(const float *m, size_t mstride, int64_t tw, float b, float *y0, float *y1) {
  for (int64_t tx = 0; tx < tw; tx++) {
    float s0[4], s1[4];
    for (int j = 0; j < 4; j++) {
      float a = m[(size_t)j * mstride + tx], c = m[(size_t)(4 + j) * mstride + tx];
      float d = m[(size_t)(8 + j) * mstride + tx], e = m[(size_t)(12 + j) * mstride + tx];
      s0[j] = a + c + d; /* A^T m: rows m0 + m1 + m2 and m1 - m2 - m3 */
      s1[j] = c - d - e;
    }
    y0[2 * tx] = s0[0] + s0[1] + s0[2] + b;
    y0[2 * tx + 1] = s0[1] - s0[2] - s0[3] + b;
    y1[2 * tx] = s1[0] + s1[1] + s1[2] + b;
    y1[2 * tx + 1] = s1[1] - s1[2] - s1[3] + b;
  }
}

/* ---- one convolution: in (N, ci, ih, iw) -> out (N, co, oh, ow) ---- */

typedef struct {
  const ampc__op_call *c;
  const wg_layout *L;
  const wg_geom *g;
  const ampc_tensor *in, *out;
  const float *bias; /* f32, or NULL */
  int grad, acc;     /* store as a gradient (counted, added when acc) */
} wg_conv;

static int64_t wg_chunks(const wg_geom *g) { return ((g->N + g->nb - 1) / g->nb) * ((g->th + g->rb - 1) / g->rb); }

static void wg_chunk(const wg_geom *g, int64_t k, int64_t *n0, int64_t *nbe, int64_t *ty0, int64_t *ty1) {
  int64_t bands = (g->th + g->rb - 1) / g->rb;
  *n0 = (k / bands) * g->nb;
  *nbe = g->N - *n0 < g->nb ? g->N - *n0 : g->nb;
  *ty0 = (k % bands) * g->rb;
  *ty1 = *ty0 + g->rb < g->th ? *ty0 + g->rb : g->th;
}

/* Runs inside a parallel region, on every thread; U holds the transformed
 * weights, (xi, co, ci). */
static void wg_conv_run(const wg_conv *a, const float *U, int tid, int nth) {
  const wg_geom *g = a->g;
  const wg_layout *L = a->L;
  float *ws = (float *)a->c->ws, *V = ws + L->off_v, *M = ws + L->off_m;
  float *me = cpu_ws_slice(a->c, tid, L->per_thread, L->shared);
  float *pl = me + L->off_pl, *r = me + L->off_r, *rows = me + L->off_row, *tmp = me + L->off_tmp;
  int64_t nchunks = wg_chunks(g), ihw = g->ih * g->iw, ohw = g->oh * g->ow;
  for (int64_t k = 0; k < nchunks; k++) {
    int64_t n0, nbe, ty0, ty1;
    wg_chunk(g, k, &n0, &nbe, &ty0, &ty1);
    int64_t band = (ty1 - ty0) * g->tw, tb = nbe * band;
    size_t vstride = (size_t)(g->ci * tb), mstride = (size_t)(g->co * tb);
    for (int64_t it = tid; it < nbe * g->ci; it += nth) {
      int64_t s = it / g->ci, ch = it % g->ci;
      wg_stage(g, a->in, ((n0 + s) * g->ci + ch) * ihw, ty0, ty1, pl, tmp);
      wg_input(g, pl, ty0, ty1, r, V + ch * tb, vstride, s * band);
    }
#pragma omp barrier
    for (int xi = tid; xi < WG_P; xi += nth)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)g->co, (int)tb, (int)g->ci, 1.0f, U + (size_t)xi * g->co * g->ci,
                  (int)g->ci, V + (size_t)xi * vstride, (int)tb, 0.0f, M + (size_t)xi * mstride, (int)tb);
#pragma omp barrier
    for (int64_t it = tid; it < nbe * g->co; it += nth) {
      int64_t s = it / g->co, o = it % g->co;
      const float *mo = M + o * tb + s * band;
      float b = a->bias ? a->bias[o] : 0.0f;
      int64_t at = ((n0 + s) * g->co + o) * ohw;
      float *y0 = rows, *y1 = rows + 2 * g->tw;
      for (int64_t ty = ty0; ty < ty1; ty++) {
        wg_output_row(mo + (ty - ty0) * g->tw, mstride, g->tw, b, y0, y1);
        for (int i = 0; i < 2; i++) {
          int64_t oy = 2 * ty + i;
          if (oy >= g->oh) break;
          float *row = i ? y1 : y0;
          if (a->grad) cpu_store_grad(a->c, a->out, at + oy * g->ow, row, (size_t)g->ow, a->acc, tmp);
          else cpu_store(a->out, at + oy * g->ow, row, (size_t)g->ow, 0, NULL);
        }
      }
    }
#pragma omp barrier
  }
}

/* U[xi][o][c] of the forward weights (rot = 0), or U'[xi][c][o] of the
 * rotated, transposed ones backward data uses (rot = 1). */
static void wg_weights(const ampc__op_call *c, const wg_layout *L, float *U, int rot, int tid, int nth) {
  const ampc_tensor *w = &c->in[1];
  int64_t O = L->f.co, C = L->f.ci;
  float *me = cpu_ws_slice(c, tid, L->per_thread, L->shared);
  float *wt = me + L->off_tmp, *wr = me + L->off_w;
  size_t stride = (size_t)(O * C);
  for (int64_t o = tid; o < O; o += nth) {
    const float *wo = cpu_load(w, o * C * 9, (size_t)(C * 9), wt);
    for (int64_t ch = 0; ch < C; ch++) {
      const float *k = wo + ch * 9;
      if (rot) {
        for (int i = 0; i < 9; i++) wr[i] = k[8 - i];
        wg_weight(wr, U + ch * O + o, stride);
      } else {
        wg_weight(k, U + o * C + ch, stride);
      }
    }
  }
}

ampc_status ampc__cpu_wino_fwd(const ampc__op_call *c) {
  wg_layout L = wg_plan(c);
  const ampc_tensor *b = c->n_in > 2 ? &c->in[2] : NULL;
  float *U = (float *)c->ws, *bias = b ? (float *)c->ws + L.off_db : NULL;
  if (b) ampc_load_f32(bias, b->dtype, b->data, (size_t)L.f.co);
  wg_conv a = {.c = c, .L = &L, .g = &L.f, .in = &c->in[0], .out = &c->out, .bias = bias, .grad = 0, .acc = 0};
#pragma omp parallel num_threads(c->nthreads)
  {
    int tid = omp_get_thread_num(), nth = omp_get_num_threads();
    wg_weights(c, &L, U, 0, tid, nth);
#pragma omp barrier
    wg_conv_run(&a, U, tid, nth);
  }
  return AMPC_OK;
}

ampc_status ampc__cpu_wino_bwd(const ampc__op_call *c) {
  wg_layout L = wg_plan(c);
  const wg_geom *g = &L.f;
  const ampc_tensor *x = &c->in[0], *dy = &c->dout, *dx = &c->din[0], *dw = &c->din[1];
  const ampc_tensor *db = c->n_in > 2 ? &c->din[2] : NULL;
  int need_dx = dx->data != NULL, need_dw = dw->data != NULL, need_db = db && db->data;
  float *ws = (float *)c->ws, *U = ws, *V = ws + L.off_v, *M = ws + L.off_m, *dbias = ws + L.off_db;
  double t0 = c->timers ? omp_get_wtime() : 0.0, t1 = t0;
  int64_t ihw = g->ih * g->iw, ohw = g->oh * g->ow, O = g->co, C = g->ci;
  if (need_dw || need_db) {
#pragma omp parallel num_threads(c->nthreads)
    {
      int tid = omp_get_thread_num(), nth = omp_get_num_threads();
      float *me = cpu_ws_slice(c, tid, L.per_thread, L.shared);
      float *pl = me + L.off_pl, *r = me + L.off_r, *rows = me + L.off_row, *tmp = me + L.off_tmp, *wr = me + L.off_w;
      if (need_db)
        for (int64_t o = tid; o < O; o += nth) {
          float s = 0.0f;
          for (int64_t n = 0; n < g->N; n++)
            for (int64_t oy = 0; oy < g->oh; oy++)
              s += cpu_sum(cpu_load(dy, (n * O + o) * ohw + oy * g->ow, (size_t)g->ow, tmp), (size_t)g->ow);
          dbias[o] = s;
        }
      if (need_dw) {
        int64_t nchunks = wg_chunks(g);
        for (int64_t k = 0; k < nchunks; k++) {
          int64_t n0, nbe, ty0, ty1;
          wg_chunk(g, k, &n0, &nbe, &ty0, &ty1);
          int64_t band = (ty1 - ty0) * g->tw, tb = nbe * band;
          size_t vstride = (size_t)(C * tb), mstride = (size_t)(O * tb);
          for (int64_t it = tid; it < nbe * (C + O); it += nth) {
            int64_t s = it / (C + O), ch = it % (C + O);
            if (ch < C) {
              wg_stage(g, x, ((n0 + s) * C + ch) * ihw, ty0, ty1, pl, tmp);
              wg_input(g, pl, ty0, ty1, r, V + ch * tb, vstride, s * band);
            } else {
              int64_t o = ch - C;
              wg_output_grad(g, dy, ((n0 + s) * O + o) * ohw, ty0, ty1, rows, tmp, M + o * tb, mstride, s * band);
            }
          }
#pragma omp barrier
          for (int xi = tid; xi < WG_P; xi += nth)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)O, (int)C, (int)tb, 1.0f, M + (size_t)xi * mstride, (int)tb,
                        V + (size_t)xi * vstride, (int)tb, k ? 1.0f : 0.0f, U + (size_t)xi * O * C, (int)C);
#pragma omp barrier
        }
        for (int64_t o = tid; o < O; o += nth) {
          for (int64_t ch = 0; ch < C; ch++) wg_weight_grad(U + o * C + ch, (size_t)(O * C), wr + ch * 9);
          cpu_store_grad(c, dw, o * C * 9, wr, (size_t)(C * 9), c->din_acc[1], tmp);
        }
      }
    }
    if (need_db) {
      float *tmp = cpu_ws_slice(c, 0, L.per_thread, L.shared) + L.off_tmp;
      cpu_store_grad(c, db, 0, dbias, (size_t)O, c->din_acc[2], tmp);
    }
    t1 = c->timers ? omp_get_wtime() : 0.0;
  }
  if (need_dx) {
    wg_conv a = {.c = c, .L = &L, .g = &L.d, .in = dy, .out = dx, .bias = NULL, .grad = 1, .acc = c->din_acc[0]};
#pragma omp parallel num_threads(c->nthreads)
    {
      int tid = omp_get_thread_num(), nth = omp_get_num_threads();
      wg_weights(c, &L, U, 1, tid, nth);
#pragma omp barrier
      wg_conv_run(&a, U, tid, nth);
    }
  }
  (void)V; (void)M;
  if (c->timers) {
    double t2 = omp_get_wtime();
    c->timers[0] += t2 - t1;
    c->timers[1] += t1 - t0;
  }
  return AMPC_OK;
}
