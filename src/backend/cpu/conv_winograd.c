/* Winograd convolution for stride-1 3x3 kernels: F(2x2, 3x3) and F(4x4, 3x3).
 *
 * Each m x m block of outputs (m = 2 or 4) is computed from an a x a input
 * tile (a = m + 2) with a*a products per (input, output) channel pair instead
 * of 9*m*m:
 *
 *   Y = A^T [ U (.) V ] A,   U = G g G^T (weights),   V = B^T d B (input tile)
 *
 * where (.) is the element-wise product summed over input channels. Summed
 * over channels, each of the a*a transform points is one matrix product
 *
 *   M[xi] (co, tiles) = U[xi] (co, ci) * V[xi] (ci, tiles)
 *
 * done by sgemm. The matrices are Lavin and Gray's (points 0, 1, -1 for
 * m = 2; 0, +-1, +-2 for m = 4). Tiles are processed in chunks (several
 * samples, or a band of tile rows of one sample) small enough that V and M
 * stay in cache. Every thread works on the same chunk: the input transform is
 * split by (sample, channel), the products by transform point, the output
 * transform by (sample, channel), with a barrier between phases; so no thread
 * keeps a private copy of anything large and results do not depend on timing.
 *
 * Backward data is the same convolution of dY with the weights rotated by 180
 * degrees and their channel axes swapped, padded by 2 - pad. Backward weights
 * works in the transform domain: dU[xi] = sum over tiles of dM[xi] V[xi]^T with
 * dM = A dY A^T, then dg = G^T dU G. Half inputs are converted to f32 as a band
 * of a plane is staged for the transform, and outputs are rounded to their
 * storage type as a band is stored, so 16-bit storage adds no pass over memory.
 */
#include <cblas.h>
#include <omp.h>

#include "backend/cpu/cpu_internal.h"

enum { WG_MIN_TILES = 128 };
#define WG_CHUNK_BYTES ((size_t)2 << 20)

/* Tiles per chunk when > 0 instead of the size chosen for the cache: a hook
 * for tests, which use it to exercise chunks of bands and of several samples. */
int64_t ampc__cpu_wino_tile_target = 0;

/* One convolution as Winograd sees it: ci input channels of ih x iw planes,
 * padded by pad, into co output channels of oh x ow, in m x m output tiles. */
typedef struct {
  int64_t m, a, np;   /* output tile side, input tile side, transform points */
  int64_t N, ci, co, ih, iw, oh, ow, pad;
  int64_t th, tw;     /* tile rows and columns */
  int64_t nb, rb;     /* samples per chunk; tile rows per chunk (th when nb > 1) */
  int64_t tbmax;      /* tiles of the largest chunk */
  int64_t prow, pcol; /* staged, zero-padded band of an input plane */
  int64_t band;       /* floats of a loaded input band or a computed output band */
} wg_geom;

static wg_geom wg_geometry(int64_t m, int64_t N, int64_t ci, int64_t co, int64_t ih, int64_t iw, int64_t oh, int64_t ow,
                           int64_t pad) {
  wg_geom g;
  g.m = m; g.a = m + 2; g.np = g.a * g.a;
  g.N = N; g.ci = ci; g.co = co; g.ih = ih; g.iw = iw; g.oh = oh; g.ow = ow; g.pad = pad;
  g.th = (oh + m - 1) / m; g.tw = (ow + m - 1) / m;
  int64_t tps = g.th * g.tw;
  int64_t target = (int64_t)(WG_CHUNK_BYTES / ((size_t)g.np * sizeof(float) * (size_t)(ci + co)));
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
  g.prow = m * g.rb + 2;
  g.pcol = m * (g.tw + 1);
  int64_t in = g.prow * iw, out = m * g.rb * (m * g.tw);
  g.band = in > out ? in : out;
  return g;
}

/* Workspace: shared U (or dU), the chunk's V and M and the bias; per thread a
 * staged band, the row transforms, a loaded or computed band and its
 * conversion buffer, and 9 * channels for a weight row. */
typedef struct {
  wg_geom f, d;    /* forward (and backward weights); backward data */
  size_t off_v, off_m, off_db, shared, per_thread;         /* floats */
  size_t off_pl, off_r, off_band, off_tmp, off_w;          /* within a thread's slice */
} wg_layout;

static size_t zmax(size_t x, size_t y) { return x > y ? x : y; }

/* Output tile side for this call: 0 when Winograd does not apply. */
int ampc__cpu_wino_tile(const ampc__op_call *c) {
  const ampc_shape *w = &c->in[1].shape;
  if (w->d[2] != 3 || w->d[3] != 3 || c->attr.stride != 1 || c->attr.pad < 0 || c->attr.pad > 2) return 0;
  return c->conv_algo == AMPC_CONV_WINOGRAD_2X2 ? 2 : 4;
}

static wg_layout wg_plan(const ampc__op_call *c) {
  wg_layout L;
  const ampc_shape *x = &c->in[0].shape, *w = &c->in[1].shape, *y = &c->out.shape;
  int64_t N = x->d[0], C = x->d[1], H = x->d[2], W = x->d[3], O = w->d[0], OH = y->d[2], OW = y->d[3], p = c->attr.pad;
  int64_t m = ampc__cpu_wino_tile(c);
  L.f = wg_geometry(m, N, C, O, H, W, OH, OW, p);
  L.d = wg_geometry(m, N, O, C, OH, OW, H, W, 2 - p);
  int64_t np = L.f.np, cmax = C > O ? C : O, tb = L.f.tbmax > L.d.tbmax ? L.f.tbmax : L.d.tbmax;
  L.off_v = (size_t)(np * O * C);
  L.off_m = L.off_v + (size_t)(np * cmax * tb);
  L.off_db = L.off_m + (size_t)(np * cmax * tb);
  L.shared = L.off_db + (size_t)O + 16;
  size_t pl = zmax((size_t)(L.f.prow * L.f.pcol), (size_t)(L.d.prow * L.d.pcol));
  size_t r = (size_t)L.f.a * zmax((size_t)L.f.pcol, (size_t)L.d.pcol);
  size_t band = zmax((size_t)L.f.band, (size_t)L.d.band), wrow = (size_t)(9 * cmax);
  L.off_pl = 0;
  L.off_r = L.off_pl + pl;
  L.off_band = L.off_r + r;
  L.off_tmp = L.off_band + band;
  L.off_w = L.off_tmp + zmax(band, wrow);
  L.per_thread = L.off_w + wrow + 16;
  return L;
}

size_t ampc__cpu_wino_ws(const ampc__op_call *c, int nthreads) {
  wg_layout L = wg_plan(c);
  return (L.shared + L.per_thread * (size_t)(nthreads < 1 ? 1 : nthreads)) * sizeof(float);
}

/* ---- the transforms, in one dimension ---- */

/* The transforms are loops over a row of tiles written to vectorise; they
 * are built twice, for AVX2 and for the baseline, and the loader picks one. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(AMPC_NO_CLONES)
#define WG_VECTOR __attribute__((target_clones("avx2", "default")))
#else
#define WG_VECTOR
#endif

/* B^T d */
#define WG2_IN(d0, d1, d2, d3, v0, v1, v2, v3) \
  do { v0 = (d0) - (d2); v1 = (d1) + (d2); v2 = (d2) - (d1); v3 = (d1) - (d3); } while (0)
#define WG4_IN(d0, d1, d2, d3, d4, d5, v0, v1, v2, v3, v4, v5) \
  do {                                                           \
    v0 = 4.0f * (d0) - 5.0f * (d2) + (d4);                       \
    v1 = (d3) + (d4) - 4.0f * ((d1) + (d2));                     \
    v2 = (d4) - (d3) + 4.0f * ((d1) - (d2));                     \
    v3 = (d4) - (d2) + 2.0f * ((d3) - (d1));                     \
    v4 = (d4) - (d2) + 2.0f * ((d1) - (d3));                     \
    v5 = 4.0f * (d1) - 5.0f * (d3) + (d5);                       \
  } while (0)
/* A^T m */
#define WG2_OUT(m0, m1, m2, m3, y0, y1) do { y0 = (m0) + (m1) + (m2); y1 = (m1) - (m2) - (m3); } while (0)
#define WG4_OUT(m0, m1, m2, m3, m4, m5, y0, y1, y2, y3)     \
  do {                                                      \
    float p_ = (m1) + (m2), q_ = (m1) - (m2);               \
    float r_ = (m3) + (m4), s_ = (m3) - (m4);               \
    y0 = (m0) + p_ + r_;                                    \
    y1 = q_ + 2.0f * s_;                                    \
    y2 = p_ + 4.0f * r_;                                    \
    y3 = q_ + 8.0f * s_ + (m5);                             \
  } while (0)
/* A y (the transpose of A^T, for gradients) */
#define WG2_OUTT(y0, y1, m0, m1, m2, m3) do { m0 = (y0); m1 = (y0) + (y1); m2 = (y0) - (y1); m3 = -(y1); } while (0)
#define WG4_OUTT(y0, y1, y2, y3, m0, m1, m2, m3, m4, m5) \
  do {                                                   \
    float e_ = (y0) + (y2), o_ = (y1) + (y3);            \
    float e4_ = (y0) + 4.0f * (y2), o8_ = 2.0f * (y1) + 8.0f * (y3); \
    m0 = (y0);                                           \
    m1 = e_ + o_;                                        \
    m2 = e_ - o_;                                        \
    m3 = e4_ + o8_;                                      \
    m4 = e4_ - o8_;                                      \
    m5 = (y3);                                           \
  } while (0)

/* U = G g G^T of one 3x3 kernel, written with `stride` between points. */
static void wg_weight(int64_t m, const float *g, float *u, size_t stride) {
  int64_t a = m + 2;
  float t[6][3], v[6];
  for (int k = 0; k < 3; k++) {
    float g0 = g[k], g1 = g[3 + k], g2 = g[6 + k];
    if (m == 2) {
      t[0][k] = g0; t[1][k] = 0.5f * (g0 + g1 + g2); t[2][k] = 0.5f * (g0 - g1 + g2); t[3][k] = g2;
    } else {
      t[0][k] = 0.25f * g0;
      t[1][k] = -(g0 + g1 + g2) / 6.0f;
      t[2][k] = -(g0 - g1 + g2) / 6.0f;
      t[3][k] = g0 / 24.0f + g1 / 12.0f + g2 / 6.0f;
      t[4][k] = g0 / 24.0f - g1 / 12.0f + g2 / 6.0f;
      t[5][k] = g2;
    }
  }
  for (int64_t i = 0; i < a; i++) {
    float g0 = t[i][0], g1 = t[i][1], g2 = t[i][2];
    if (m == 2) {
      v[0] = g0; v[1] = 0.5f * (g0 + g1 + g2); v[2] = 0.5f * (g0 - g1 + g2); v[3] = g2;
    } else {
      v[0] = 0.25f * g0;
      v[1] = -(g0 + g1 + g2) / 6.0f;
      v[2] = -(g0 - g1 + g2) / 6.0f;
      v[3] = g0 / 24.0f + g1 / 12.0f + g2 / 6.0f;
      v[4] = g0 / 24.0f - g1 / 12.0f + g2 / 6.0f;
      v[5] = g2;
    }
    for (int64_t j = 0; j < a; j++) u[(size_t)(i * a + j) * stride] = v[j];
  }
}

/* dg = G^T dU G of one a x a gradient, read with `stride` between points. */
static void wg_weight_grad(int64_t m, const float *du, size_t stride, float *dg) {
  int64_t a = m + 2;
  float t[3][6] = {{0}};
  for (int64_t j = 0; j < a; j++) {
    float u[6] = {0};
    for (int64_t i = 0; i < a; i++) u[i] = du[(size_t)(i * a + j) * stride];
    if (m == 2) {
      t[0][j] = u[0] + 0.5f * (u[1] + u[2]); t[1][j] = 0.5f * (u[1] - u[2]); t[2][j] = 0.5f * (u[1] + u[2]) + u[3];
    } else {
      t[0][j] = 0.25f * u[0] - (u[1] + u[2]) / 6.0f + (u[3] + u[4]) / 24.0f;
      t[1][j] = (u[2] - u[1]) / 6.0f + (u[3] - u[4]) / 12.0f;
      t[2][j] = (u[3] + u[4] - u[1] - u[2]) / 6.0f + u[5];
    }
  }
  for (int k = 0; k < 3; k++) {
    const float *u = t[k];
    if (m == 2) {
      dg[k * 3 + 0] = u[0] + 0.5f * (u[1] + u[2]); dg[k * 3 + 1] = 0.5f * (u[1] - u[2]); dg[k * 3 + 2] = 0.5f * (u[1] + u[2]) + u[3];
    } else {
      dg[k * 3 + 0] = 0.25f * u[0] - (u[1] + u[2]) / 6.0f + (u[3] + u[4]) / 24.0f;
      dg[k * 3 + 1] = (u[2] - u[1]) / 6.0f + (u[3] - u[4]) / 12.0f;
      dg[k * 3 + 2] = (u[3] + u[4] - u[1] - u[2]) / 6.0f + u[5];
    }
  }
}

/* ---- the transforms of a row of tiles ---- */

/* V = B^T d B for one row of tiles. d: the a staged rows, pcol apart, each
 * holding its padded columns by phase (column q = m*k + ph at ph*(tw+1) + k),
 * so that every operand is read with unit stride; r: scratch for a rows; v:
 * the a*a output streams, vstride apart. */
WG_VECTOR static void wg_input_row(int64_t m, const float *d, int64_t pcol, int64_t tw, float *r, float *v, size_t vstride) {
  int64_t h = tw + 1;
  if (m == 2) {
    const float *d0 = d, *d1 = d + pcol, *d2 = d1 + pcol, *d3 = d2 + pcol;
    float *r0 = r, *r1 = r + pcol, *r2 = r1 + pcol, *r3 = r2 + pcol;
    for (int64_t q = 0; q < pcol; q++) WG2_IN(d0[q], d1[q], d2[q], d3[q], r0[q], r1[q], r2[q], r3[q]);
    for (int i = 0; i < 4; i++) {
      const float *e = r + i * pcol, *o = e + h;
      float *v0 = v + (size_t)(i * 4) * vstride, *v1 = v0 + vstride, *v2 = v1 + vstride, *v3 = v2 + vstride;
      for (int64_t tx = 0; tx < tw; tx++) WG2_IN(e[tx], o[tx], e[tx + 1], o[tx + 1], v0[tx], v1[tx], v2[tx], v3[tx]);
    }
    return;
  }
  const float *d0 = d, *d1 = d + pcol, *d2 = d1 + pcol, *d3 = d2 + pcol, *d4 = d3 + pcol, *d5 = d4 + pcol;
  float *r0 = r, *r1 = r + pcol, *r2 = r1 + pcol, *r3 = r2 + pcol, *r4 = r3 + pcol, *r5 = r4 + pcol;
  for (int64_t q = 0; q < pcol; q++)
    WG4_IN(d0[q], d1[q], d2[q], d3[q], d4[q], d5[q], r0[q], r1[q], r2[q], r3[q], r4[q], r5[q]);
  for (int i = 0; i < 6; i++) {
    const float *p0 = r + i * pcol, *p1 = p0 + h, *p2 = p1 + h, *p3 = p2 + h;
    float *v0 = v + (size_t)(i * 6) * vstride, *v1 = v0 + vstride, *v2 = v1 + vstride, *v3 = v2 + vstride;
    float *v4 = v3 + vstride, *v5 = v4 + vstride;
    for (int64_t tx = 0; tx < tw; tx++)
      WG4_IN(p0[tx], p1[tx], p2[tx], p3[tx], p0[tx + 1], p1[tx + 1], v0[tx], v1[tx], v2[tx], v3[tx], v4[tx], v5[tx]);
  }
}

/* Y = A^T M A for one row of tiles, plus the bias: a*a streams in, m output
 * rows of m * tw values (ystride apart) out. */
WG_VECTOR static void wg_output_row(int64_t m, const float *M, size_t mstride, int64_t tw, float b, float *y, int64_t ystride) {
  if (m == 2) {
    float *y0 = y, *y1 = y + ystride;
    for (int64_t tx = 0; tx < tw; tx++) {
      float s0[4], s1[4];
      for (int j = 0; j < 4; j++)
        WG2_OUT(M[(size_t)j * mstride + tx], M[(size_t)(4 + j) * mstride + tx], M[(size_t)(8 + j) * mstride + tx],
                M[(size_t)(12 + j) * mstride + tx], s0[j], s1[j]);
      WG2_OUT(s0[0], s0[1], s0[2], s0[3], y0[2 * tx], y0[2 * tx + 1]);
      WG2_OUT(s1[0], s1[1], s1[2], s1[3], y1[2 * tx], y1[2 * tx + 1]);
      y0[2 * tx] += b; y0[2 * tx + 1] += b; y1[2 * tx] += b; y1[2 * tx + 1] += b;
    }
    return;
  }
  for (int64_t tx = 0; tx < tw; tx++) {
    float s[4][6];
    for (int j = 0; j < 6; j++)
      WG4_OUT(M[(size_t)j * mstride + tx], M[(size_t)(6 + j) * mstride + tx], M[(size_t)(12 + j) * mstride + tx],
              M[(size_t)(18 + j) * mstride + tx], M[(size_t)(24 + j) * mstride + tx], M[(size_t)(30 + j) * mstride + tx],
              s[0][j], s[1][j], s[2][j], s[3][j]);
    for (int i = 0; i < 4; i++) {
      float *yi = y + i * ystride + 4 * tx;
      WG4_OUT(s[i][0], s[i][1], s[i][2], s[i][3], s[i][4], s[i][5], yi[0], yi[1], yi[2], yi[3]);
      yi[0] += b; yi[1] += b; yi[2] += b; yi[3] += b;
    }
  }
}

/* dM = A dY A^T for one row of tiles from m gradient rows (m * tw values
 * each, ystride apart, zero past the plane), into a*a streams. */
WG_VECTOR static void wg_output_grad_row(int64_t m, const float *y, int64_t ystride, int64_t tw, float *M, size_t mstride) {
  if (m == 2) {
    const float *y0 = y, *y1 = y + ystride;
    for (int64_t tx = 0; tx < tw; tx++) {
      float u[4][2];
      for (int j = 0; j < 2; j++) WG2_OUTT(y0[2 * tx + j], y1[2 * tx + j], u[0][j], u[1][j], u[2][j], u[3][j]);
      for (int i = 0; i < 4; i++)
        WG2_OUTT(u[i][0], u[i][1], M[(size_t)(i * 4) * mstride + tx], M[(size_t)(i * 4 + 1) * mstride + tx],
                 M[(size_t)(i * 4 + 2) * mstride + tx], M[(size_t)(i * 4 + 3) * mstride + tx]);
    }
    return;
  }
  for (int64_t tx = 0; tx < tw; tx++) {
    float u[6][4];
    for (int j = 0; j < 4; j++) {
      const float *c = y + 4 * tx + j;
      WG4_OUTT(c[0], c[ystride], c[2 * ystride], c[3 * ystride], u[0][j], u[1][j], u[2][j], u[3][j], u[4][j], u[5][j]);
    }
    for (int i = 0; i < 6; i++) {
      float *mi = M + (size_t)(i * 6) * mstride + tx;
      WG4_OUTT(u[i][0], u[i][1], u[i][2], u[i][3], mi[0], mi[mstride], mi[2 * mstride], mi[3 * mstride], mi[4 * mstride],
               mi[5 * mstride]);
    }
  }
}

/* ---- staging ---- */

/* Stages tile rows [ty0, ty1) of one input plane (element offset `at` of
 * tensor t) as f32 with its zero padding: row r is input row m*ty0 - pad + r,
 * laid out by column phase (see wg_input_row). The band's rows are loaded
 * (and converted) with one call into `band`. */
static void wg_stage(const wg_geom *g, const ampc_tensor *t, int64_t at, int64_t ty0, int64_t ty1, float *pl, float *band) {
  int64_t rows = g->m * (ty1 - ty0) + 2, h = g->tw + 1, m = g->m;
  int64_t iy0 = g->m * ty0 - g->pad, lo = iy0 < 0 ? 0 : iy0, hi = iy0 + rows < g->ih ? iy0 + rows : g->ih;
  const float *src = hi > lo ? cpu_load(t, at + lo * g->iw, (size_t)((hi - lo) * g->iw), band) : NULL;
  memset(pl, 0, (size_t)(rows * g->pcol) * sizeof(float));
  for (int64_t iy = lo; iy < hi; iy++) {
    float *dst = pl + (iy - iy0) * g->pcol;
    const float *s = src + (iy - lo) * g->iw;
    for (int64_t ix = 0, q = g->pad; ix < g->iw; ix++, q++) dst[(q % m) * h + q / m] = s[ix];
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

/* V of one staged plane band: tiles of rows [ty0, ty1) into the streams at v. */
static void wg_input_band(const wg_geom *g, const float *pl, int64_t ty0, int64_t ty1, float *r, float *v, size_t vstride) {
  for (int64_t ty = ty0; ty < ty1; ty++)
    wg_input_row(g->m, pl + g->m * (ty - ty0) * g->pcol, g->pcol, g->tw, r, v + (ty - ty0) * g->tw, vstride);
}

/* Runs inside a parallel region, on every thread; U holds the transformed
 * weights, (xi, co, ci). */
static void wg_conv_run(const wg_conv *a, const float *U, int tid, int nth) {
  const wg_geom *g = a->g;
  const wg_layout *L = a->L;
  float *ws = (float *)a->c->ws, *V = ws + L->off_v, *M = ws + L->off_m;
  float *me = cpu_ws_slice(a->c, tid, L->per_thread, L->shared);
  float *pl = me + L->off_pl, *r = me + L->off_r, *band = me + L->off_band, *tmp = me + L->off_tmp;
  int64_t nchunks = wg_chunks(g), ihw = g->ih * g->iw, ohw = g->oh * g->ow, m = g->m, ys = m * g->tw;
  for (int64_t k = 0; k < nchunks; k++) {
    int64_t n0, nbe, ty0, ty1;
    wg_chunk(g, k, &n0, &nbe, &ty0, &ty1);
    int64_t bt = (ty1 - ty0) * g->tw, tb = nbe * bt;
    size_t vstride = (size_t)(g->ci * tb), mstride = (size_t)(g->co * tb);
    for (int64_t it = tid; it < nbe * g->ci; it += nth) {
      int64_t s = it / g->ci, ch = it % g->ci;
      wg_stage(g, a->in, ((n0 + s) * g->ci + ch) * ihw, ty0, ty1, pl, band);
      wg_input_band(g, pl, ty0, ty1, r, V + ch * tb + s * bt, vstride);
    }
#pragma omp barrier
    for (int64_t xi = tid; xi < g->np; xi += nth)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)g->co, (int)tb, (int)g->ci, 1.0f, U + (size_t)xi * g->co * g->ci,
                  (int)g->ci, V + (size_t)xi * vstride, (int)tb, 0.0f, M + (size_t)xi * mstride, (int)tb);
#pragma omp barrier
    int64_t oy0 = m * ty0, oy1 = m * ty1 < g->oh ? m * ty1 : g->oh, nrow = oy1 - oy0;
    for (int64_t it = tid; it < nbe * g->co; it += nth) {
      int64_t s = it / g->co, o = it % g->co;
      const float *mo = M + o * tb + s * bt;
      float b = a->bias ? a->bias[o] : 0.0f;
      for (int64_t ty = ty0; ty < ty1; ty++) wg_output_row(m, mo + (ty - ty0) * g->tw, mstride, g->tw, b, band + m * (ty - ty0) * ys, ys);
      /* rows of m*tw values -> rows of ow, then one store of the band */
      if (ys != g->ow)
        for (int64_t i = 1; i < nrow; i++) memmove(band + i * g->ow, band + i * ys, (size_t)g->ow * sizeof(float));
      int64_t at = ((n0 + s) * g->co + o) * ohw + oy0 * g->ow;
      if (a->grad) cpu_store_grad(a->c, a->out, at, band, (size_t)(nrow * g->ow), a->acc, tmp);
      else cpu_store(a->out, at, band, (size_t)(nrow * g->ow), 0, NULL);
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
        wg_weight(L->f.m, wr, U + ch * O + o, stride);
      } else {
        wg_weight(L->f.m, k, U + o * C + ch, stride);
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

/* dM of one gradient plane band: output rows [m*ty0, m*ty1) of dy at `at`,
 * loaded with one call, zero past the plane. */
static void wg_grad_band(const wg_geom *g, const ampc_tensor *dy, int64_t at, int64_t ty0, int64_t ty1, float *band, float *y,
                         float *M, size_t mstride) {
  int64_t m = g->m, ys = m * g->tw, oy0 = m * ty0, oy1 = m * ty1 < g->oh ? m * ty1 : g->oh, rows = m * (ty1 - ty0);
  const float *src = cpu_load(dy, at + oy0 * g->ow, (size_t)((oy1 - oy0) * g->ow), band);
  for (int64_t i = 0; i < rows; i++) {
    float *dst = y + i * ys;
    if (oy0 + i < oy1) {
      memcpy(dst, src + i * g->ow, (size_t)g->ow * sizeof(float));
      for (int64_t q = g->ow; q < ys; q++) dst[q] = 0.0f;
    } else {
      memset(dst, 0, (size_t)ys * sizeof(float));
    }
  }
  for (int64_t ty = ty0; ty < ty1; ty++) wg_output_grad_row(m, y + m * (ty - ty0) * ys, ys, g->tw, M + (ty - ty0) * g->tw, mstride);
}

ampc_status ampc__cpu_wino_bwd(const ampc__op_call *c) {
  wg_layout L = wg_plan(c);
  const wg_geom *g = &L.f;
  const ampc_tensor *x = &c->in[0], *dy = &c->dout, *dx = &c->din[0], *dw = &c->din[1];
  const ampc_tensor *db = c->n_in > 2 ? &c->din[2] : NULL;
  int need_dx = dx->data != NULL, need_dw = dw->data != NULL, need_db = db && db->data;
  float *ws = (float *)c->ws, *U = ws, *V = ws + L.off_v, *M = ws + L.off_m, *dbias = ws + L.off_db;
  double t0 = c->timers ? omp_get_wtime() : 0.0, t1 = t0;
  int64_t ihw = g->ih * g->iw, ohw = g->oh * g->ow, O = g->co, C = g->ci, np = g->np;
  if (need_dw || need_db) {
#pragma omp parallel num_threads(c->nthreads)
    {
      int tid = omp_get_thread_num(), nth = omp_get_num_threads();
      float *me = cpu_ws_slice(c, tid, L.per_thread, L.shared);
      float *pl = me + L.off_pl, *r = me + L.off_r, *band = me + L.off_band, *tmp = me + L.off_tmp, *wr = me + L.off_w;
      if (need_db)
        for (int64_t o = tid; o < O; o += nth) {
          float s = 0.0f;
          int64_t piece = g->band / g->ow * g->ow; /* whole rows that fit the band buffer */
          for (int64_t n = 0; n < g->N; n++)
            for (int64_t i = 0; i < ohw; i += piece) {
              size_t len = (size_t)(ohw - i < piece ? ohw - i : piece);
              s += cpu_sum(cpu_load(dy, (n * O + o) * ohw + i, len, band), len);
            }
          dbias[o] = s;
        }
      if (need_dw) {
        int64_t nchunks = wg_chunks(g);
        for (int64_t k = 0; k < nchunks; k++) {
          int64_t n0, nbe, ty0, ty1;
          wg_chunk(g, k, &n0, &nbe, &ty0, &ty1);
          int64_t bt = (ty1 - ty0) * g->tw, tb = nbe * bt;
          size_t vstride = (size_t)(C * tb), mstride = (size_t)(O * tb);
          for (int64_t it = tid; it < nbe * (C + O); it += nth) {
            int64_t s = it / (C + O), ch = it % (C + O);
            if (ch < C) {
              wg_stage(g, x, ((n0 + s) * C + ch) * ihw, ty0, ty1, pl, band);
              wg_input_band(g, pl, ty0, ty1, r, V + ch * tb + s * bt, vstride);
            } else {
              int64_t o = ch - C;
              wg_grad_band(g, dy, ((n0 + s) * O + o) * ohw, ty0, ty1, band, pl, M + o * tb + s * bt, mstride);
            }
          }
#pragma omp barrier
          for (int64_t xi = tid; xi < np; xi += nth)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)O, (int)C, (int)tb, 1.0f, M + (size_t)xi * mstride, (int)tb,
                        V + (size_t)xi * vstride, (int)tb, k ? 1.0f : 0.0f, U + (size_t)xi * O * C, (int)C);
#pragma omp barrier
        }
        for (int64_t o = tid; o < O; o += nth) {
          for (int64_t ch = 0; ch < C; ch++) wg_weight_grad(g->m, U + o * C + ch, (size_t)(O * C), wr + ch * 9);
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
  if (c->timers) {
    double t2 = omp_get_wtime();
    c->timers[0] += t2 - t1;
    c->timers[1] += t1 - t0;
  }
  return AMPC_OK;
}
