/* Winograd F(6x6, 3x3), F(4x4, 3x3) and F(2x2, 3x3) convolution for stride-1
 * 3x3 kernels.
 *
 * Each m x m block of outputs (m = 6, 4 or 2) is computed from an a x a
 * input tile (a = m + 2) with a*a products per (input, output) channel pair
 * instead of 9*m*m (F(6x6): 64 instead of 324; F(4x4): 36 instead of 144;
 * F(2x2): 16 instead of 36):
 *
 *   Y = A^T [ U (.) V ] A,   U = G g G^T (weights),   V = B^T d B (input tile)
 *
 * where (.) is the element-wise product summed over input channels. Summed
 * over channels, each of the a*a transform points is one matrix product
 *
 *   M[xi] (tiles, co) = V[xi] (tiles, ci) * U[xi] (ci, co)
 *
 * done by ampc's register-blocked kernel (gemm.c) or sgemm (see wg_own).
 * The matrices are Lavin and Gray's (points 0, +-1, +-2, inf
 * for F(4x4); 0, +-1, inf for F(2x2)); F(6x6)'s points are 0, +-1, +-2,
 * +-1/2, inf.
 *
 * Which tile: F(4x4) costs fewer products, but it is the less accurate: its
 * output transform (entries up to 8, with cancellation) amplifies the
 * rounding of the channel sums. Measured in f32 on ResNet-18's layer shapes
 * (64 to 512 channels, batch 8): forward outputs 6.8-13x as far from exact
 * as im2col's sums, input gradients 11-12x; F(2x2) 1.1-2.3x and 1.7-1.8x;
 * PyTorch's fp32 convolution 1.4-3.7x and 1.0-1.4x. Other points do not
 * close that gap: 0, +-1, +-1/2, inf is the mirror image of 0, +-1, +-2, inf
 * (the same error: the scalings between them are powers of 2), mixing them
 * (1/2 and -2) cuts it by a third. So where a convolution's input, weight
 * and output are all stored in f32 (O0, where the point is f32's accuracy),
 * forward and backward data use F(2x2): the forward error decides how often
 * a ReLU input near zero flips, which puts a gradient's error against
 * float64 at ~1e-3 instead of ~1e-6 for every tensor before it (with F(4x4)
 * the median over ResNet-18's tensors was there in 29 of 32 batches of 8,
 * PyTorch fp32's in 14, F(2x2)'s in 12, im2col's in 9), and the input
 * gradient's error reaches every layer below (where nothing flipped, F(4x4)
 * backward data alone made the median error 3x PyTorch's); see
 * tests/unit/test_conv_accuracy.c. With 16-bit storage the rounding to
 * f16/bf16 (2^-11, 2^-8 relative) dwarfs F(4x4)'s, which stays there, and
 * F(6x6)'s, taken where it saves work (wg_tile): on the cnn's second layer
 * at batch 128 the outputs' and both gradients' errors against float64 are
 * im2col's to two digits (rms 2.07e-4 forward in f16, 1.66e-3 in bf16).
 * Backward weights is F(4x4) after F(2x2) (its error, 7-9x im2col's, stays
 * in the weight gradient, where it is small next to what reaches it from
 * above), else the forward's tile.
 *
 * V and M keep channels innermost, in blocks of 8, so that every transform
 * is a handful of 8-wide vector operations per tile: a band of input planes
 * is staged channel-interleaved (and converted from half storage on the way),
 * and outputs are de-interleaved into planes as they are stored (and rounded
 * to their storage type then), so 16-bit storage adds no pass over memory.
 *
 * Where a plane's side is not a multiple of the tile's, a same-size
 * convolution packs the planes of several samples into one canvas, a zero
 * row or column between them, and tiles the canvas (wg_pack): the cnn's
 * 14 x 14 planes take 14 tiles each instead of 16.
 *
 * Tiles are processed in chunks (several samples, or a band of tile rows of
 * one sample; canvases the same) small enough that V and M stay in cache.
 * When a layer has many chunks (large planes, few channels) each thread
 * takes whole chunks, handed out as threads come free, with its own V and
 * M: no barriers, and a thread slowed down by something else on the machine
 * does less of the work. When
 * it has few (deep layers, whose transformed weights are the bulk of the
 * traffic) every thread works on the same chunk: transforms are split by
 * (sample, block of 8 channels), the products by transform point, handed out
 * as threads come free, with a barrier between phases. Either way a chunk's
 * arithmetic is the same, so results are the same bits for any thread count
 * and any timing.
 *
 * Backward data is the same convolution of dY with the weights rotated by 180
 * degrees and their channel axes swapped, padded by 2 - pad. Backward weights
 * works in the transform domain: dU[xi] = dM[xi]^T V[xi] summed over tiles,
 * with dM = A dY A^T, then dg = G^T dU G.
 */
#include <cblas.h>
#include <omp.h>

#include "backend/cpu/cpu_internal.h"

enum { WG_VL = 8, WG_MIN_TILES = 96 };
#define WG_CHUNK_BYTES ((size_t)1 << 20)

/* Tiles per chunk when > 0 instead of the size chosen for the cache: a hook
 * for tests, which use it to exercise chunks of bands and of several samples. */
int64_t ampc__cpu_wino_tile_target = 0;
/* The tile (2 or 4) of forward and backward data where everything is stored
 * in f32, when set; 0: F(2x2) there (see above). A hook for tests and
 * measurements, which run F(4x4) in f32 with it. */
int ampc__cpu_wino_f32_tile = 0;

typedef cpu_v8 v8;
#define LD(p) CPU_LD8(p)
#define ST(p, v) CPU_ST8(p, v)

static int64_t up8(int64_t n) { return (n + WG_VL - 1) / WG_VL * WG_VL; }

/* Floats between the transform points of a chunk's V or M, at least n: an
 * odd number of cache lines, so that the 36 or 64 points of a tile, which the
 * transforms store or load together, fall in different sets of the L1 cache
 * (a multiple of 4 KB apart they would all compete for one set's 8 ways). */
static size_t wg_pstride(int64_t n) {
  size_t s = ((size_t)n + 15) / 16 * 16;
  return (s / 16) % 2 ? s : s + 16;
}

/* One convolution as Winograd sees it: ci input channels of ih x iw planes,
 * padded by pad, into co output channels of oh x ow, in m x m tiles. */
typedef struct {
  int64_t m, a, np;  /* outputs per tile side (4 or 2), inputs (m + 2), transform points (a * a) */
  int64_t N, ci, co, ci8, co8, ih, iw, oh, ow, pad; /* N, ih, iw, oh, ow: of the canvases where packed */
  int64_t P;        /* samples a canvas side (see wg_pack); 1: a canvas is a sample's plane */
  int64_t ns, sih, siw, soh, sow; /* samples; a sample's input and output planes */
  int64_t th, tw;   /* tile rows and columns */
  int64_t nb, rb;   /* samples per chunk; tile rows per chunk (th when nb > 1) */
  int64_t tbmax;    /* tiles of the largest chunk */
  int64_t srow, scol; /* staged band: rows, columns (times 8 channels) */
  int64_t band;     /* floats of one plane's loaded input band or output band */
} wg_geom;

/* Samples a side of the square canvas a same-size convolution (pad 1,
 * output the input's size) packs its planes into, P x P of them with a zero
 * row and column between neighbours -- each plane's padding, so every output
 * is its own plane's convolution -- when that takes fewer tiles: planes whose
 * side is not a multiple of m leave part of their last tiles empty (a 14 x 14
 * plane in tiles of 4 outputs is 16 x 16, 31% more than its outputs), a
 * canvas only at its own edge (4 x 4 planes of 14: 59 x 59 in 15 x 15 tiles,
 * 14.1 tiles a plane instead of 16). The products, transforms and staging
 * all scale with the tiles. P: the side whose canvases (the last one part
 * empty) take the fewest tiles, 1 (each plane on its own) unless they take
 * at most WG_PACK_GAIN percent of the planes' tiles. The cnn's 128 samples:
 * 8 canvases of 4 x 4 planes, 1800 tiles instead of 2048 (3 x 3: 15
 * canvases, 1815); its second convolution 2.35 -> 2.05-2.1 ms forward,
 * 4.7 -> 4.2-4.4 backward on an AMD Zen 4 (O2, 2 threads, min of 300
 * steps, alternating runs). A tile then holds
 * values of up to four planes: an output is its own plane's sum, but its
 * rounding error scales with the largest input of its tile, as Winograd's
 * does within a plane; and a non-finite input reaches the other planes of
 * its tiles (in training it makes the loss non-finite all the same). */
enum { WG_PACK_MAX = 6, WG_PACK_GAIN = 92 };
/* P where > 0 (same-size convolutions only), never packed where < 0, instead
 * of the choice below: a hook for tests. */
int ampc__cpu_wino_pack = 0;
static int wg_same_size(int64_t ih, int64_t iw, int64_t oh, int64_t ow, int64_t pad) { return pad == 1 && oh == ih && ow == iw; }
/* tiles of m x m outputs a canvas of P x P planes of oh x ow outputs takes
 * (P = 1: a plane) */
static int64_t wg_canvas_tiles(int64_t m, int64_t P, int64_t oh, int64_t ow) {
  return ((P * (oh + 1) - 1 + m - 1) / m) * ((P * (ow + 1) - 1 + m - 1) / m);
}
static int64_t wg_pack(int64_t m, int64_t N, int64_t ih, int64_t iw, int64_t oh, int64_t ow, int64_t pad) {
  if (!wg_same_size(ih, iw, oh, ow, pad) || ampc__cpu_wino_pack < 0) return 1;
  if (ampc__cpu_wino_pack > 0) return ampc__cpu_wino_pack;
  int64_t plain = N * wg_canvas_tiles(m, 1, oh, ow), best = 1, bt = plain * WG_PACK_GAIN / 100 + 1;
  for (int64_t P = 2; P <= WG_PACK_MAX; P++) {
    int64_t t = (N + P * P - 1) / (P * P) * wg_canvas_tiles(m, P, oh, ow);
    if (t < bt) bt = t, best = P;
  }
  return best;
}

/* pack: samples a canvas side where > 0 (same-size convolutions only), else
 * wg_pack's choice */
static wg_geom wg_geometry(int64_t m, int64_t N, int64_t ci, int64_t co, int64_t ih, int64_t iw, int64_t oh, int64_t ow,
                           int64_t pad, int64_t pack) {
  wg_geom g;
  g.m = m; g.a = m + 2; g.np = g.a * g.a;
  g.ns = N; g.sih = ih; g.siw = iw; g.soh = oh; g.sow = ow;
  g.P = pack <= 0 ? wg_pack(m, N, ih, iw, oh, ow, pad) : wg_same_size(ih, iw, oh, ow, pad) ? pack : 1;
  if (g.P > 1) {
    N = (N + g.P * g.P - 1) / (g.P * g.P);
    ih = oh = g.P * (ih + 1) - 1;
    iw = ow = g.P * (iw + 1) - 1;
  }
  g.N = N; g.ci = ci; g.co = co; g.ci8 = up8(ci); g.co8 = up8(co);
  g.ih = ih; g.iw = iw; g.oh = oh; g.ow = ow; g.pad = pad;
  g.th = (oh + m - 1) / m; g.tw = (ow + m - 1) / m;
  int64_t target = (int64_t)(WG_CHUNK_BYTES / ((size_t)g.np * sizeof(float) * (size_t)(g.ci8 + g.co8)));
  /* at least WG_MIN_TILES of F(4x4)'s 36 points, or as many floats in
   * F(6x6)'s tiles of 64 (54 tiles: the cnn's 14 x 14 planes in chunks of
   * two 5 x 5-tile canvases; with 96 of its tiles a chunk, three canvases,
   * V and M outgrew a 1 MB L2 cache: its second convolution 1.95 against
   * 1.79-1.86 ms forward, 3.97-4.35 against 3.72-4.03 backward with chunks
   * of one or two canvases, min of 300 steps, alternating runs on an AMD
   * Zen 4) */
  int64_t least = g.np > 36 ? WG_MIN_TILES * 36 / g.np : WG_MIN_TILES;
  if (target < least) target = least;
  /* Where the products run on ampc's 16-wide kernel, which streams U (ci x co
   * a point; the weight gradient: dU, read and written) once a chunk: at
   * least ci8 * co8 / (ci8 + co8) tiles, so that U costs a chunk no more than
   * its V and M (tiles x (ci + co)). ResNet-18's 512-channel layers then take
   * their 128 tiles in one chunk, not 96 + 32, and its 256-channel ones 128
   * tiles a chunk, not 96: on an AMD EPYC of family 26 (O2, 2 threads, three
   * or four alternating runs each) its step 3-6% shorter at O2, 1.5% at O0,
   * for 9.4 MB more workspace (75.6 MB, the 512-channel layers' chunk). */
  int64_t balance = g.ci8 * g.co8 / (g.ci8 + g.co8);
  if (ampc__cpu_gemm_wide() && balance > target) target = balance;
  if (ampc__cpu_wino_tile_target > 0) target = ampc__cpu_wino_tile_target;
  cpu_blocking(target, g.tw, g.th, N, &g.nb, &g.rb);
  /* a canvas in bands of even height (the cnn's 15 tile rows in 5 + 5 + 5,
   * not 6 + 6 + 3: conv2 0.1-0.2 ms a step faster on an AMD Zen 4) */
  if (g.P > 1 && g.nb == 1) {
    int64_t bands = (g.th + g.rb - 1) / g.rb;
    g.rb = (g.th + bands - 1) / bands;
  }
  g.tbmax = g.nb * g.rb * g.tw;
  g.srow = m * g.rb + 2;
  g.scol = m * g.tw + 2;
  int64_t in = g.srow * iw, out = m * g.rb * ow;
  g.band = in > out ? in : out;
  return g;
}

/* Workspace. Shared: U (or dU), the chunk's V and M, the weight in f32, the
 * bias. Per thread: a staged band of 8 interleaved planes, 8 planes' bands
 * and its conversion buffer, a row of weights. */
typedef struct {
  wg_geom f, d, w; /* forward; backward data; backward weights (F(4x4) where those are F(2x2)) */
  int64_t cb;      /* output channels a pass where U is made a block at a time (wg_block); 0: all at once */
  size_t off_v, off_m, off_wf, off_db, shared, per_thread; /* floats */
  size_t vm;                                               /* a V and M pair; one per thread from off_v */
  size_t off_du, du;                                       /* backward weights by slots: WG_SLOTS partial dU of du */
  size_t off_dbp; /* with a bias: its gradient's partial sums, co8 a (weight-gradient chunk, sample or canvas) */
  size_t off_st, off_band, off_tmp, off_w;                 /* within a thread's slice */
} wg_layout;

/* Chunks per thread from which each thread takes whole chunks. Backward
 * weights then sums dU in WG_SLOTS fixed partials (chunk k into slot
 * k % WG_SLOTS, added in slot order), which threads take whole, when the
 * partials are small: the same bits for any thread count. */
enum { WG_PRIVATE_CHUNKS = 4, WG_SLOTS = 4 };
#define WG_SLOT_BYTES ((size_t)8 << 20)

static size_t zmax(size_t x, size_t y) { return x > y ? x : y; }

static int64_t wg_chunks(const wg_geom *g);

/* Which products run on ampc's kernel (ampc__cpu_gemm) rather than the
 * library's sgemm. Those of few channels always (at most WG_SMALL_K summed,
 * WG_SMALL_N out: the cnn, ResNet-18's first stage), where a library sgemm
 * spends much of its time packing and clearing for so short a sum; so the
 * weight gradient's up to WG_SMALL_WGRAD_K columns. Where the kernel runs 16
 * wide (AVX-512), every product up to WG_OWN_MAX channels: for ResNet-18's
 * deeper layers (128 to 512 channels, batch 128, f16 storage, 2 threads, an
 * AMD EPYC of family 26) it was as fast as OpenBLAS 0.3.21's AVX-512 kernels
 * (its Cooperlake set) and 1.2-1.9x faster than its AVX2 ones (Haswell,
 * which OPENBLAS_CORETYPE may name on an AVX-512 CPU), with no packing: U is
 * stored as its right-hand side (wg_weights). Past 512 channels a panel of U
 * outgrows the L2 cache, where the library's packed, cache-blocked product is
 * the safer choice (not measured). */
enum { WG_SMALL_K = 64, WG_SMALL_N = 128, WG_SMALL_WGRAD_K = 32, WG_OWN_MAX = 512 };
/* When set, every product runs on the library's sgemm: a hook for tests,
 * whose cases have too few channels to reach it otherwise. */
int ampc__cpu_wino_blas = 0;
/* k channels summed, n out (for the weight gradient: k its columns, n its
 * rows), small_k the bound of k for the few-channel rule */
static int wg_own(int64_t k, int64_t n, int64_t small_k) {
  if (ampc__cpu_wino_blas) return 0;
  if (k <= small_k && n <= WG_SMALL_N) return 1;
  return ampc__cpu_gemm_wide() && k <= WG_OWN_MAX && n <= WG_OWN_MAX;
}

/* The tile (4 or 6) of a convolution with 16-bit storage where > 0, instead
 * of wg_tile's choice: a hook for tests. */
int ampc__cpu_wino_tile16 = 0;

/* A plane's arithmetic in tiles of m x m outputs, ci channels in and co
 * out: the tiles a plane takes (where planes pack, the fewest of any
 * canvas side, canvases counted full), each with its products (a*a x ci x
 * co multiply-adds, 16 to an AVX-512 FMA) and the transforms of its inputs
 * and outputs in blocks of 8 channels (the vector operations the 1-D
 * transforms above take for a tile: 156 in and 100 out for F(4x4), 416 and
 * 280 for F(6x6)) at half an FMA's cost each (narrower, with more ports). */
static double wg_plane_cost(int64_t m, int64_t ci, int64_t co, int64_t ih, int64_t iw, int64_t oh, int64_t ow, int64_t pad) {
  double tiles = (double)wg_canvas_tiles(m, 1, oh, ow);
  for (int64_t P = 2; wg_same_size(ih, iw, oh, ow, pad) && P <= WG_PACK_MAX; P++) {
    double t = (double)wg_canvas_tiles(m, P, oh, ow) / (double)(P * P);
    if (t < tiles) tiles = t;
  }
  double a = (double)(m + 2), c8 = (double)up8(ci), o8 = (double)up8(co);
  double tin = m == 6 ? 416.0 : 156.0, tout = m == 6 ? 280.0 : 100.0;
  return tiles * (a * a * c8 * o8 / 16.0 + 0.5 * (tin * c8 + tout * o8) / 8.0);
}

/* The tile of forward and backward data (see the top of the file): F(2x2)
 * where input, weight and output are all stored in f32; else F(6x6) where
 * F(4x4)'s tiles overhang the output planes and a plane's arithmetic in
 * F(6x6) (wg_plane_cost) is at most WG_TILE6_COST percent of F(4x4)'s,
 * else F(4x4). A choice of the layer's shape alone, not of the batch: a
 * graph keeps its tile at every batch (the workspace is that tile's). The
 * cnn's 14 x 14 planes: F(6x6) packs 2 x 2 of them to a canvas in 5 x 5
 * tiles of 6, 0.79 of the products of F(4x4)'s 3 x 3 in 11 x 11 tiles of 4
 * (cost 0.89): its second convolution 2.07-2.17 -> 1.79-1.86 ms forward,
 * 4.26-4.34 -> 3.72-4.03 backward, the O2 step 6142 -> 6629 images/s
 * (minima over 300 steps; medians of five alternating runs; O2, 2
 * threads, AMD Zen 4). ResNet-18's 32 x 32 planes would cost as little
 * (0.89: F(6x6) packs them 2 x 2 in 11 x 11 tiles), but where F(4x4)
 * fits a plane exactly it keeps it: with its 32 x 32 layers in F(6x6)
 * ResNet-18 O2 ran at 71.1-80.4 images/s against 72.6-84.4, slower in each
 * of six alternating pairs (its minimum convolution times 1-3% lower). Its
 * smaller planes cost more in F(6x6) anyway (1.05-1.34). */
enum { WG_TILE6_COST = 90 };
static int64_t wg_tile(const ampc__op_call *c) {
  int f32 = c->in[0].dtype == AMPC_DTYPE_F32 && c->in[1].dtype == AMPC_DTYPE_F32 && c->out.dtype == AMPC_DTYPE_F32;
  if (f32) return ampc__cpu_wino_f32_tile == 4 ? 4 : 2;
  if (ampc__cpu_wino_tile16 == 4 || ampc__cpu_wino_tile16 == 6) return ampc__cpu_wino_tile16;
  const ampc_shape *x = &c->in[0].shape, *w = &c->in[1].shape, *y = &c->out.shape;
  int64_t C = x->d[1], O = w->d[0], H = x->d[2], W = x->d[3], OH = y->d[2], OW = y->d[3], p = c->attr.pad;
  if (OH % 4 == 0 && OW % 4 == 0) return 4;
  double c6 = wg_plane_cost(6, C, O, H, W, OH, OW, p), c4 = wg_plane_cost(4, C, O, H, W, OH, OW, p);
  return c6 * 100.0 <= c4 * WG_TILE6_COST ? 6 : 4;
}

/* Floats of one chunk's V or M: its transform points, each pstride apart. */
static size_t wg_vm_floats(const wg_geom *g, int64_t c8) { return (size_t)g->np * wg_pstride(c8 * g->tbmax); }

/* Layers of one chunk in every phase (ResNet-18's 512-channel layers at
 * batch 128: 128 tiles) make U, M and the weight in f32 a block of output
 * channels at a time, when U whole would pass WG_UBLOCK_BYTES: the chunk's V
 * is made once, then for each block of cb output channels (the forward's
 * and the weight gradient's O, backward data's C) the block's U (or dU), its
 * products and its outputs. The products' sums are the same (each output
 * channel's sum over the input channels, in order), so the results are the
 * same bits as one pass; the workspace of a 512-channel layer is 13.1 MB
 * instead of 56.7 (U alone 37.7 MB: the largest workspace of ResNet-18's
 * ops, part of its training's peak memory; blocks of 32 channels, 2.4 MB of
 * U, ran as fast as one pass on an AMD Zen 4, a little faster forward). A
 * layer of several chunks keeps U whole: a block at a time would make each
 * chunk's V again for every block, or U for every chunk. Output channels a
 * pass: a multiple of 32 (the 16-wide kernel's block of columns) with U
 * within WG_UBLOCK_BYTES. */
enum { WG_UBLOCK_BYTES = 3 << 20 };
/* Output channels a pass when > 0 (rounded up to 8), wherever a layer has a
 * single chunk: a hook for tests, whose layers are too small to reach the
 * bound. */
int ampc__cpu_wino_block = 0;
static int64_t wg_block(const wg_geom *f, const wg_geom *d, const wg_geom *w, int64_t c8) {
  if (wg_chunks(f) != 1 || wg_chunks(d) != 1 || wg_chunks(w) != 1) return 0;
  int64_t cb = ampc__cpu_wino_block > 0 ? up8(ampc__cpu_wino_block)
                                        : (int64_t)(WG_UBLOCK_BYTES / ((size_t)w->np * (size_t)c8 * sizeof(float))) / 32 * 32;
  if (cb < WG_VL) cb = WG_VL;
  return cb < (f->co > d->co ? f->co : d->co) ? cb : 0;
}

/* m: the tile, wg_tile's choice (the caller's, made once) */
static wg_layout wg_plan(const ampc__op_call *c, int nthreads, int64_t pack, int64_t m) {
  wg_layout L;
  const ampc_shape *x = &c->in[0].shape, *w = &c->in[1].shape, *y = &c->out.shape;
  int64_t N = x->d[0], C = x->d[1], H = x->d[2], W = x->d[3], O = w->d[0], OH = y->d[2], OW = y->d[3], p = c->attr.pad;
  L.f = wg_geometry(m, N, C, O, H, W, OH, OW, p, pack);
  L.d = wg_geometry(m, N, O, C, OH, OW, H, W, 2 - p, pack);
  /* backward weights: F(4x4) after F(2x2) */
  L.w = wg_geometry(m == 2 ? 4 : m, N, C, O, H, W, OH, OW, p, pack);
  int64_t np = L.w.np; /* the most points of the three */
  int64_t c8 = up8(C > O ? C : O);
  size_t vm1 = zmax(zmax(wg_vm_floats(&L.f, c8), wg_vm_floats(&L.d, c8)), wg_vm_floats(&L.w, c8));
  L.cb = wg_block(&L.f, &L.d, &L.w, c8);
  if (L.cb) {
    /* U of a block (xi, c8 columns, cb8 rows), V, a block's M, a block's
     * weight in f32 (cb x c8 x 9), the bias */
    int64_t cb8 = up8(L.cb);
    size_t mb = zmax(zmax(wg_vm_floats(&L.f, cb8), wg_vm_floats(&L.d, cb8)), wg_vm_floats(&L.w, cb8));
    L.off_v = (size_t)(np * c8 * cb8);
    L.off_m = L.off_v + vm1;
    L.off_wf = L.off_m + mb;
    L.vm = 0;
    L.off_db = L.off_wf + (size_t)(L.cb * c8 * 9);
    L.du = 0;
    L.off_du = L.off_db + (size_t)up8(O) + 16;
    L.shared = L.off_du;
  } else {
    L.off_v = (size_t)(np * c8 * c8);
    L.off_m = L.off_v + vm1;
    /* the weight in f32 is needed only while U is made, before any chunk: it
     * shares V and M's space, growing it when it does not fit */
    L.vm = 2 * vm1;
    L.du = (size_t)(np * O) * (size_t)L.w.ci8;
    int slots = wg_chunks(&L.w) >= WG_PRIVATE_CHUNKS * 2 && WG_SLOT_BYTES >= WG_SLOTS * L.du * sizeof(float);
    if (!slots) L.du = 0;
    /* V and M pairs: one per thread where threads take whole chunks (the
     * weight gradient by slots: every thread; forward and backward data: nth
     * threads of at most nthreads with WG_PRIVATE_CHUNKS chunks each, see
     * wg_conv_run), else the one the team shares (ResNet-18's 512-channel
     * layers, a chunk each: 18.9 MB less workspace at 2 threads) */
    int64_t nt = nthreads < 1 ? 1 : nthreads, pairs = slots ? nt : 1;
    const wg_geom *run[2] = {&L.f, &L.d};
    for (int i = 0; i < 2; i++) {
      int64_t most = wg_chunks(run[i]) / WG_PRIVATE_CHUNKS; /* the most threads that take private chunks */
      if (most > nt) most = nt;
      if (most >= 2 && most > pairs) pairs = most;
    }
    size_t vm = L.vm * (size_t)pairs, wf = (size_t)(O * C * 9);
    L.off_wf = L.off_v;
    L.off_db = L.off_v + (vm > wf ? vm : wf);
    L.off_du = L.off_db + (size_t)up8(O) + 16;
    L.shared = L.off_du + WG_SLOTS * L.du;
  }
  L.off_dbp = L.shared;
  if (c->n_in > 2) L.shared += (size_t)(wg_chunks(&L.w) * L.w.nb * L.w.co8);
  /* staging: the forward input, backward data's output gradient and backward
   * weights' input (rows of srow x scol positions), or backward weights'
   * output gradient (4 * rb x 4 * tw, fewer) */
  size_t st = zmax(zmax((size_t)(L.f.srow * L.f.scol), (size_t)(L.d.srow * L.d.scol)), (size_t)(L.w.srow * L.w.scol)) * WG_VL;
  size_t band = zmax(zmax((size_t)L.f.band, (size_t)L.d.band), (size_t)L.w.band), wrow = (size_t)(9 * c8);
  L.off_st = 0;
  L.off_band = L.off_st + st;
  L.off_tmp = L.off_band + WG_VL * band;
  L.off_w = L.off_tmp + zmax(band, wrow);
  L.per_thread = L.off_w + wrow + 16;
  return L;
}

/* The workspace for the call's batch and any smaller one, which may pack
 * its planes differently (wg_pack): where a plane's side is not a multiple
 * of the tile (elsewhere nothing packs; F(2x2)'s: of 4), the most any side
 * of canvas takes (for a given side, a smaller batch takes no more). */
size_t ampc__cpu_wino_ws(const ampc__op_call *c, int nthreads) {
  const ampc_shape *x = &c->in[0].shape, *y = &c->out.shape;
  int64_t tile = wg_tile(c), m = tile == 2 ? 4 : tile;
  int may_pack = wg_same_size(x->d[2], x->d[3], y->d[2], y->d[3], c->attr.pad) && (y->d[2] % m || y->d[3] % m);
  size_t most = 0;
  for (int64_t pack = 0; pack <= (may_pack ? WG_PACK_MAX : 0); pack++) {
    wg_layout L = wg_plan(c, nthreads, pack, tile);
    size_t n = (L.shared + L.per_thread * (size_t)(nthreads < 1 ? 1 : nthreads)) * sizeof(float);
    if (n > most) most = n;
  }
  return most;
}

/* ---- the transforms, one dimension, on 8 channels at once ---- */

#define WG_VECTOR CPU_VECTOR

/* F(4x4, 3x3). v = B^T d */
static inline void in1(const v8 d[6], v8 v[6]) {
  v[0] = 4.0f * d[0] - 5.0f * d[2] + d[4];
  v[1] = d[3] + d[4] - 4.0f * (d[1] + d[2]);
  v[2] = d[4] - d[3] + 4.0f * (d[1] - d[2]);
  v[3] = d[4] - d[2] + 2.0f * (d[3] - d[1]);
  v[4] = d[4] - d[2] + 2.0f * (d[1] - d[3]);
  v[5] = 4.0f * d[1] - 5.0f * d[3] + d[5];
}
/* y = A^T m */
static inline void out1(const v8 m[6], v8 y[4]) {
  v8 p = m[1] + m[2], q = m[1] - m[2], r = m[3] + m[4], s = m[3] - m[4];
  y[0] = m[0] + p + r;
  y[1] = q + 2.0f * s;
  y[2] = p + 4.0f * r;
  y[3] = q + 8.0f * s + m[5];
}
/* m = A y (the transpose, for gradients) */
static inline void outt1(const v8 y[4], v8 m[6]) {
  v8 e = y[0] + y[2], o = y[1] + y[3], e4 = y[0] + 4.0f * y[2], o8 = 2.0f * y[1] + 8.0f * y[3];
  m[0] = y[0];
  m[1] = e + o;
  m[2] = e - o;
  m[3] = e4 + o8;
  m[4] = e4 - o8;
  m[5] = y[3];
}
/* u = G g */
static inline void w1(const v8 g[3], v8 u[6]) {
  const float s6 = 1.0f / 6.0f, s12 = 1.0f / 12.0f, s24 = 1.0f / 24.0f;
  u[0] = 0.25f * g[0];
  u[1] = -s6 * (g[0] + g[1] + g[2]);
  u[2] = -s6 * (g[0] - g[1] + g[2]);
  u[3] = s24 * g[0] + s12 * g[1] + s6 * g[2];
  u[4] = s24 * g[0] - s12 * g[1] + s6 * g[2];
  u[5] = g[2];
}
/* g = G^T u (the transpose, for gradients) */
static inline void wt1(const v8 u[6], v8 g[3]) {
  const float s6 = 1.0f / 6.0f, s12 = 1.0f / 12.0f, s24 = 1.0f / 24.0f;
  g[0] = 0.25f * u[0] - s6 * (u[1] + u[2]) + s24 * (u[3] + u[4]);
  g[1] = s6 * (u[2] - u[1]) + s12 * (u[3] - u[4]);
  g[2] = s6 * (u[3] + u[4] - u[1] - u[2]) + u[5];
}

/* F(2x2, 3x3): v = B^T d, y = A^T m, u = G g (every coefficient exact) */
static inline void in1_2(const v8 d[4], v8 v[4]) {
  v[0] = d[0] - d[2];
  v[1] = d[1] + d[2];
  v[2] = d[2] - d[1];
  v[3] = d[1] - d[3];
}
static inline void out1_2(const v8 m[4], v8 y[2]) {
  y[0] = m[0] + m[1] + m[2];
  y[1] = m[1] - m[2] - m[3];
}
static inline void w1_2(const v8 g[3], v8 u[4]) {
  v8 e = g[0] + g[2];
  u[0] = g[0];
  u[1] = 0.5f * (e + g[1]);
  u[2] = 0.5f * (e - g[1]);
  u[3] = g[2];
}

/* F(6x6, 3x3), points 0, +-1, +-2, +-1/2, inf: v = B^T d */
static inline void in1_6(const v8 d[8], v8 v[8]) {
  v[0] = d[0] - d[6] + 5.25f * (d[4] - d[2]);
  v[7] = d[7] - d[1] + 5.25f * (d[3] - d[5]);
  v8 a = d[2] + d[6] - 4.25f * d[4], b = d[1] + d[5] - 4.25f * d[3];
  v[1] = a + b;
  v[2] = a - b;
  a = d[6] + 0.25f * d[2] - 1.25f * d[4];
  b = 0.5f * d[1] - 2.5f * d[3] + 2.0f * d[5];
  v[3] = a + b;
  v[4] = a - b;
  a = d[6] + 4.0f * d[2] - 5.0f * d[4];
  b = 2.0f * d[1] - 2.5f * d[3] + 0.5f * d[5];
  v[5] = a + b;
  v[6] = a - b;
}
/* y = A^T m */
static inline void out1_6(const v8 m[8], v8 y[6]) {
  v8 p1 = m[1] + m[2], q1 = m[1] - m[2], p2 = m[3] + m[4], q2 = m[3] - m[4], p3 = m[5] + m[6], q3 = m[5] - m[6];
  y[0] = m[0] + p1 + p2 + p3;
  y[1] = q1 + 2.0f * q2 + 0.5f * q3;
  y[2] = p1 + 4.0f * p2 + 0.25f * p3;
  y[3] = q1 + 8.0f * q2 + 0.125f * q3;
  y[4] = p1 + 16.0f * p2 + 0.0625f * p3;
  y[5] = q1 + 32.0f * q2 + 0.03125f * q3 + m[7];
}
/* m = A y */
static inline void outt1_6(const v8 y[6], v8 m[8]) {
  v8 e1 = y[0] + y[2] + y[4], o1 = y[1] + y[3] + y[5];
  v8 e2 = y[0] + 4.0f * y[2] + 16.0f * y[4], o2 = 2.0f * y[1] + 8.0f * y[3] + 32.0f * y[5];
  v8 e3 = y[0] + 0.25f * y[2] + 0.0625f * y[4], o3 = 0.5f * y[1] + 0.125f * y[3] + 0.03125f * y[5];
  m[0] = y[0];
  m[1] = e1 + o1;
  m[2] = e1 - o1;
  m[3] = e2 + o2;
  m[4] = e2 - o2;
  m[5] = e3 + o3;
  m[6] = e3 - o3;
  m[7] = y[5];
}
/* u = G g */
static inline void w1_6(const v8 g[3], v8 u[8]) {
  const float s29 = 2.0f / 9.0f, s90 = 1.0f / 90.0f, s45 = 1.0f / 45.0f, s245 = 2.0f / 45.0f;
  const float s3245 = 32.0f / 45.0f, s1645 = 16.0f / 45.0f, s845 = 8.0f / 45.0f;
  v8 e = g[0] + g[2];
  u[0] = g[0];
  u[1] = -s29 * (e + g[1]);
  u[2] = -s29 * (e - g[1]);
  u[3] = s90 * g[0] + s245 * g[2] + s45 * g[1];
  u[4] = s90 * g[0] + s245 * g[2] - s45 * g[1];
  u[5] = s3245 * g[0] + s845 * g[2] + s1645 * g[1];
  u[6] = s3245 * g[0] + s845 * g[2] - s1645 * g[1];
  u[7] = g[2];
}
/* g = G^T u */
static inline void wt1_6(const v8 u[8], v8 g[3]) {
  const float s29 = 2.0f / 9.0f, s90 = 1.0f / 90.0f, s45 = 1.0f / 45.0f, s245 = 2.0f / 45.0f;
  const float s3245 = 32.0f / 45.0f, s1645 = 16.0f / 45.0f, s845 = 8.0f / 45.0f;
  v8 p1 = u[1] + u[2], p2 = u[3] + u[4], p3 = u[5] + u[6];
  g[0] = u[0] - s29 * p1 + s90 * p2 + s3245 * p3;
  g[1] = s29 * (u[2] - u[1]) + s45 * (u[3] - u[4]) + s1645 * (u[5] - u[6]);
  g[2] = s245 * p2 + s845 * p3 - s29 * p1 + u[7];
}

/* The 1-D transforms of tile M (6, 4 or 2, a constant where inlined). */
#define WG_INLINE static inline __attribute__((always_inline))
WG_INLINE void wg_in1(const v8 *d, v8 *v, const int M) {
  if (M == 6) in1_6(d, v);
  else if (M == 4) in1(d, v);
  else in1_2(d, v);
}
WG_INLINE void wg_out1(const v8 *m, v8 *y, const int M) {
  if (M == 6) out1_6(m, y);
  else if (M == 4) out1(m, y);
  else out1_2(m, y);
}
WG_INLINE void wg_w1(const v8 *g, v8 *u, const int M) {
  if (M == 6) w1_6(g, u);
  else if (M == 4) w1(g, u);
  else w1_2(g, u);
}
/* the transposes, for the weight gradient (F(4x4) and F(6x6)) */
WG_INLINE void wg_outt1(const v8 *y, v8 *m, const int M) {
  if (M == 6) outt1_6(y, m);
  else outt1(y, m);
}
WG_INLINE void wg_wt1(const v8 *u, v8 *g, const int M) {
  if (M == 6) wt1_6(u, g);
  else wt1(u, g);
}

/* V for the tiles of tile rows [0, nty) of a staged band st (srow x scol
 * positions of 8 channels): tile (ty, tx) goes to v + (ty*tw + tx)*ld, its
 * points vstride apart; tiles of M x M outputs. */
WG_INLINE void wg_input_tiles_m(const float *st, int64_t scol, int64_t nty, int64_t tw, float *v, size_t vstride, int64_t ld,
                                const int M) {
  const int A = M + 2;
  for (int64_t ty = 0; ty < nty; ty++)
    for (int64_t tx = 0; tx < tw; tx++) {
      const float *d0 = st + ((M * ty) * scol + M * tx) * WG_VL;
      v8 t[8][8], col[8], res[8];
      for (int j = 0; j < A; j++) {
        for (int i = 0; i < A; i++) col[i] = LD(d0 + (i * scol + j) * WG_VL);
        wg_in1(col, res, M);
        for (int i = 0; i < A; i++) t[i][j] = res[i];
      }
      float *vt = v + (ty * tw + tx) * ld;
      for (int i = 0; i < A; i++) {
        wg_in1(t[i], res, M);
        for (int j = 0; j < A; j++) ST(vt + (size_t)(i * A + j) * vstride, res[j]);
      }
    }
}
WG_VECTOR static void wg_input_tiles4(const float *st, int64_t scol, int64_t nty, int64_t tw, float *v, size_t vstride,
                                      int64_t ld) {
  wg_input_tiles_m(st, scol, nty, tw, v, vstride, ld, 4);
}
WG_VECTOR static void wg_input_tiles2(const float *st, int64_t scol, int64_t nty, int64_t tw, float *v, size_t vstride,
                                      int64_t ld) {
  wg_input_tiles_m(st, scol, nty, tw, v, vstride, ld, 2);
}
WG_VECTOR static void wg_input_tiles6(const float *st, int64_t scol, int64_t nty, int64_t tw, float *v, size_t vstride,
                                      int64_t ld) {
  wg_input_tiles_m(st, scol, nty, tw, v, vstride, ld, 6);
}
static void wg_input_tiles(const wg_geom *g, const float *st, int64_t nty, float *v, size_t vstride, int64_t ld) {
  if (g->m == 6) wg_input_tiles6(st, g->scol, nty, g->tw, v, vstride, ld);
  else if (g->m == 4) wg_input_tiles4(st, g->scol, nty, g->tw, v, vstride, ld);
  else wg_input_tiles2(st, g->scol, nty, g->tw, v, vstride, ld);
}

/* Y = A^T M A plus the bias for the tiles of tile rows [0, nty): points
 * mstride apart, tile (ty, tx) at m + (ty*tw + tx)*ld; outputs 8-interleaved
 * into y, rows of M*tw positions. */
WG_INLINE void wg_output_tiles_m(const float *m, size_t mstride, int64_t ld, int64_t nty, int64_t tw, const float *b8, float *y,
                                 const int M) {
  const int A = M + 2;
  int64_t yc = M * tw;
  v8 bias = LD(b8);
  for (int64_t ty = 0; ty < nty; ty++)
    for (int64_t tx = 0; tx < tw; tx++) {
      const float *mt = m + (ty * tw + tx) * ld;
      v8 t[6][8], col[8], res[6];
      for (int j = 0; j < A; j++) {
        for (int i = 0; i < A; i++) col[i] = LD(mt + (size_t)(i * A + j) * mstride);
        wg_out1(col, res, M);
        for (int i = 0; i < M; i++) t[i][j] = res[i];
      }
      float *yt = y + ((M * ty) * yc + M * tx) * WG_VL;
      for (int i = 0; i < M; i++) {
        wg_out1(t[i], res, M);
        for (int j = 0; j < M; j++) ST(yt + (i * yc + j) * WG_VL, res[j] + bias);
      }
    }
}
WG_VECTOR static void wg_output_tiles4(const float *m, size_t mstride, int64_t ld, int64_t nty, int64_t tw, const float *b8,
                                       float *y) {
  wg_output_tiles_m(m, mstride, ld, nty, tw, b8, y, 4);
}
WG_VECTOR static void wg_output_tiles2(const float *m, size_t mstride, int64_t ld, int64_t nty, int64_t tw, const float *b8,
                                       float *y) {
  wg_output_tiles_m(m, mstride, ld, nty, tw, b8, y, 2);
}
WG_VECTOR static void wg_output_tiles6(const float *m, size_t mstride, int64_t ld, int64_t nty, int64_t tw, const float *b8,
                                       float *y) {
  wg_output_tiles_m(m, mstride, ld, nty, tw, b8, y, 6);
}
static void wg_output_tiles(const wg_geom *g, const float *m, size_t mstride, int64_t ld, int64_t nty, const float *b8, float *y) {
  if (g->m == 6) wg_output_tiles6(m, mstride, ld, nty, g->tw, b8, y);
  else if (g->m == 4) wg_output_tiles4(m, mstride, ld, nty, g->tw, b8, y);
  else wg_output_tiles2(m, mstride, ld, nty, g->tw, b8, y);
}

/* dM = A dY A^T for the tiles of tile rows [0, nty) of a staged gradient band
 * (rows of M*tw positions of 8 channels, zero past the plane); laid out like
 * V. F(4x4) and F(6x6) (backward weights). */
WG_INLINE void wg_grad_tiles_m(const float *st, int64_t nty, int64_t tw, float *m, size_t mstride, int64_t ld, const int M) {
  const int A = M + 2;
  int64_t yc = M * tw;
  for (int64_t ty = 0; ty < nty; ty++)
    for (int64_t tx = 0; tx < tw; tx++) {
      const float *y0 = st + ((M * ty) * yc + M * tx) * WG_VL;
      v8 t[8][6], col[6], res[8];
      for (int j = 0; j < M; j++) {
        for (int i = 0; i < M; i++) col[i] = LD(y0 + (i * yc + j) * WG_VL);
        wg_outt1(col, res, M);
        for (int i = 0; i < A; i++) t[i][j] = res[i];
      }
      float *mt = m + (ty * tw + tx) * ld;
      for (int i = 0; i < A; i++) {
        wg_outt1(t[i], res, M);
        for (int j = 0; j < A; j++) ST(mt + (size_t)(i * A + j) * mstride, res[j]);
      }
    }
}
WG_VECTOR static void wg_grad_tiles4(const float *st, int64_t nty, int64_t tw, float *m, size_t mstride, int64_t ld) {
  wg_grad_tiles_m(st, nty, tw, m, mstride, ld, 4);
}
WG_VECTOR static void wg_grad_tiles6(const float *st, int64_t nty, int64_t tw, float *m, size_t mstride, int64_t ld) {
  wg_grad_tiles_m(st, nty, tw, m, mstride, ld, 6);
}
static void wg_grad_tiles(const wg_geom *g, const float *st, int64_t nty, float *m, size_t mstride, int64_t ld) {
  if (g->m == 6) wg_grad_tiles6(st, nty, g->tw, m, mstride, ld);
  else wg_grad_tiles4(st, nty, g->tw, m, mstride, ld);
}

/* ---- staging: planes <-> 8-channel interleaved bands ---- */

/* dst[8i + k] = src[k][i] for i < n (a channel without a source made
 * zero), eight positions at a time through a transpose; n >= 8 lets a
 * last partial step overlap the one before. */
WG_VECTOR static void wg_interleave(const float *const src[WG_VL], int64_t n, float *dst) {
  if (n >= WG_VL)
    for (int64_t i = 0;; i += WG_VL) {
      if (i + WG_VL > n) i = n - WG_VL;
      v8 r[8];
      for (int k = 0; k < 8; k++) r[k] = src[k] ? LD(src[k] + i) : (v8){0};
      cpu_tr8(r);
      for (int j = 0; j < 8; j++) ST(dst + (i + j) * WG_VL, r[j]);
      if (i + WG_VL >= n) return;
    }
  for (int k = 0; k < 8; k++)
    for (int64_t j = 0; j < n; j++) dst[j * WG_VL + k] = src[k] ? src[k][j] : 0.0f;
}

/* dst[q][i] = src[8i + q] for i < n: the inverse of wg_interleave. */
WG_VECTOR static void wg_deinterleave(const float *src, int64_t n, float *const dst[WG_VL]) {
  if (n >= WG_VL)
    for (int64_t i = 0;; i += WG_VL) {
      if (i + WG_VL > n) i = n - WG_VL;
      v8 r[8];
      for (int j = 0; j < 8; j++) r[j] = LD(src + (i + j) * WG_VL);
      cpu_tr8(r);
      for (int q = 0; q < 8; q++) ST(dst[q] + i, r[q]);
      if (i + WG_VL >= n) return;
    }
  for (int q = 0; q < 8; q++)
    for (int64_t j = 0; j < n; j++) dst[q][j] = src[j * WG_VL + q];
}

/* Rows [r0, r0 + nrow) of the w-wide planes of channels [c0, c0 + 8) of t
 * (channel c's plane at element (base + c) * plane; channels >= nch are
 * zero), 8-interleaved into dst, ld floats from row to row; bands: 8 planes'
 * bands of g->band, where 16-bit rows are converted. pro: the call whose
 * input t is, when it is read through a batch norm prologue (else NULL). */
static void wg_stage_rows(const wg_geom *g, const ampc_tensor *t, const ampc__op_call *pro, int64_t base, int64_t c0, int64_t nch,
                          int64_t plane, int64_t r0, int64_t nrow, int64_t w, float *bands, float *dst, int64_t ld) {
  const float *src[WG_VL];
  for (int64_t k = 0; k < WG_VL; k++) {
    int64_t at = (base + c0 + k) * plane + r0 * w;
    size_t n = (size_t)(nrow * w);
    float *b = bands + k * g->band;
    src[k] = c0 + k >= nch ? NULL : pro ? cpu_load_input(pro, at, n, c0 + k, b) : cpu_load(t, at, n, b);
  }
  for (int64_t r = 0; r < nrow; r++) {
    const float *row[WG_VL];
    for (int k = 0; k < WG_VL; k++) row[k] = src[k] ? src[k] + r * w : NULL;
    wg_interleave(row, w, dst + r * ld);
  }
}

/* The pieces of canvas rows [y0, y1) (see wg_pack): for each sample s < ns
 * of canvas n with rows there, its rows [r0, r0 + nrow) lie at canvas rows
 * from y, columns from x; fn(s, r0, nrow, y, x) each. h, w: a sample's
 * plane. One piece, the canvas itself, where P is 1. */
#define WG_PIECES(g, n, y0, y1, h, w, fn)                                                            \
  for (int64_t gy_ = 0; gy_ < (g)->P; gy_++) {                                                      \
    int64_t top_ = gy_ * ((h) + 1), lo_ = (y0) > top_ ? (y0) : top_;                                 \
    int64_t hi_ = (y1) < top_ + (h) ? (y1) : top_ + (h);                                             \
    for (int64_t gx_ = 0; gx_ < (g)->P && hi_ > lo_; gx_++) {                                        \
      int64_t s_ = ((n) * (g)->P + gy_) * (g)->P + gx_;                                              \
      if (s_ >= (g)->ns) break;                                                                     \
      fn(s_, lo_ - top_, hi_ - lo_, lo_, gx_ * ((w) + 1));                                           \
    }                                                                                               \
  }

/* Stages tile rows [ty0, ty1) of channels [c0, c0 + 8) of canvas n (sample
 * s's plane of channel c at element (s * nch + c) * sih*siw of t; channels >=
 * nch are zero) as st[r][q][8]: row r is canvas row m*ty0 - pad + r, column
 * q canvas column q - pad, zero outside the samples' planes. */
static void wg_stage(const wg_geom *g, const ampc_tensor *t, const ampc__op_call *pro, int64_t n, int64_t c0, int64_t nch,
                     int64_t ty0, int64_t ty1, float *st, float *bands) {
  int64_t rows = g->m * (ty1 - ty0) + 2, iy0 = g->m * ty0 - g->pad;
  memset(st, 0, (size_t)(rows * g->scol * WG_VL) * sizeof(float));
#define WG_STAGE_PIECE(s, row0, nrow, y, x)                                                                              \
  wg_stage_rows(g, t, pro, (s) * nch, c0, nch, g->sih * g->siw, row0, nrow, g->siw, bands,                                   \
                st + (((y) - iy0) * g->scol + g->pad + (x)) * WG_VL, g->scol * WG_VL)
  WG_PIECES(g, n, iy0, iy0 + rows, g->sih, g->siw, WG_STAGE_PIECE)
#undef WG_STAGE_PIECE
}

/* Stages canvas rows [m*ty0, m*ty1) of gradient channels [c0, c0 + 8) of
 * canvas n as st[r][q][8], rows of m*tw positions, zero outside the samples'
 * planes. */
static void wg_stage_grad(const wg_geom *g, const ampc_tensor *dy, int64_t n, int64_t c0, int64_t ty0, int64_t ty1, float *st,
                          float *bands) {
  int64_t yc = g->m * g->tw, oy0 = g->m * ty0, oy1 = g->m * ty1;
  memset(st, 0, (size_t)(g->m * (ty1 - ty0) * yc * WG_VL) * sizeof(float));
#define WG_GRAD_PIECE(s, row0, nrow, y, x)                                                                               \
  wg_stage_rows(g, dy, NULL, (s) * g->co, c0, g->co, g->soh * g->sow, row0, nrow, g->sow, bands,                             \
                st + (((y) - oy0) * yc + (x)) * WG_VL, yc * WG_VL)
  WG_PIECES(g, n, oy0, oy1, g->soh, g->sow, WG_GRAD_PIECE)
#undef WG_GRAD_PIECE
}

/* ---- one convolution: in (N, ci, ih, iw) -> out (N, co, oh, ow) ---- */

typedef struct {
  const ampc__op_call *c;
  const wg_layout *L;
  const wg_geom *g;
  const ampc_tensor *in, *out;
  const ampc__op_call *pro; /* in is read through c's batch norm prologue (forward), or NULL */
  const float *bias; /* f32, co8 long, or NULL */
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

/* A phase of a chunk, over the caller's nth threads: shared (nth > 1), its
 * items go to the threads as they come free, in runs that shrink as the
 * phase ends (guided: deep layers' transform items are a tile or two each,
 * and taking them one at a time cost ResNet-18 3-4% on 2 threads), and the
 * work-sharing loop ends in a barrier; alone, in order. */
#define WG_ITEMS(var, n, ...)                             \
  if (nth > 1) {                                          \
    _Pragma("omp for schedule(guided)")                   \
    for (int64_t var = 0; var < (n); var++) __VA_ARGS__   \
  } else {                                                \
    for (int64_t var = 0; var < (n); var++) __VA_ARGS__   \
  }

/* One chunk's input transforms (by sample and block of 8 channels), into V:
 * shared by the team when nth > 1, the items handed out as threads come
 * free; else by the calling thread. */
static void wg_chunk_inputs(const wg_conv *a, int64_t k, float *V, float *me, int nth) {
  const wg_geom *g = a->g;
  float *st = me + a->L->off_st, *band = me + a->L->off_band;
  int64_t cib = g->ci8 / WG_VL;
  int64_t n0, nbe, ty0, ty1;
  wg_chunk(g, k, &n0, &nbe, &ty0, &ty1);
  int64_t nty = ty1 - ty0, bt = nty * g->tw, tb = nbe * bt;
  size_t vstride = wg_pstride(tb * g->ci8);
  WG_ITEMS(it, nbe * cib, {
    int64_t s = it / cib, c0 = (it % cib) * WG_VL;
    wg_stage(g, a->in, a->pro, n0 + s, c0, g->ci, ty0, ty1, st, band);
    wg_input_tiles(g, st, nty, V + s * bt * g->ci8 + c0, vstride, g->ci8);
  })
}

/* wg_chunk_outputs' piece of sample smp: its rows [row0, row0 + nrow0) at
 * canvas rows from y, columns from x of the staged output band st. */
#define WG_OUT_PIECE(smp, row0, nrow0, y, x)                                                                         \
  {                                                                                                                  \
    for (int64_t r = 0; r < (nrow0); r++) {                                                                          \
      float *row[WG_VL];                                                                                             \
      for (int q = 0; q < WG_VL; q++) row[q] = band + q * g->band + r * g->sow;                                      \
      wg_deinterleave(st + (((y) - oy0 + r) * yc + (x)) * WG_VL, g->sow, row);                                       \
    }                                                                                                                \
    for (int64_t q = 0; q < WG_VL && j0 + q < nr; q++) {                                                             \
      int64_t at = ((smp) * g->co + o0 + q) * ohw + (row0) * g->sow;                                                 \
      if (a->grad) cpu_store_grad(a->c, a->out, at, band + q * g->band, (size_t)((nrow0) * g->sow), a->acc, tmp);     \
      else cpu_store(a->out, at, band + q * g->band, (size_t)((nrow0) * g->sow), 0, NULL);                            \
    }                                                                                                                \
  }

/* One chunk's products (by transform point) and outputs for output channels
 * [r0, r0 + nr), from its V and U (xi, ci, up8(nr)): shared by the team when
 * nth > 1, as wg_chunk_inputs. */
static void wg_chunk_outputs(const wg_conv *a, const float *U, int64_t k, const float *V, float *M, float *me, int nth,
                             int64_t r0, int64_t nr) {
  const wg_geom *g = a->g;
  float *st = me + a->L->off_st, *band = me + a->L->off_band, *tmp = me + a->L->off_tmp;
  int64_t ohw = g->soh * g->sow, ld = up8(nr), cob = ld / WG_VL, yc = g->m * g->tw;
  int64_t n0, nbe, ty0, ty1;
  wg_chunk(g, k, &n0, &nbe, &ty0, &ty1);
  int64_t nty = ty1 - ty0, bt = nty * g->tw, tb = nbe * bt;
  size_t vstride = wg_pstride(tb * g->ci8), mstride = wg_pstride(tb * ld);
  WG_ITEMS(xi, g->np, {
    const float *u = U + (size_t)xi * g->ci * ld;
    if (wg_own(g->ci, g->co8, WG_SMALL_K))
      ampc__cpu_gemm(tb, ld, g->ci, V + (size_t)xi * vstride, g->ci8, 0, u, ld, M + (size_t)xi * mstride, ld, 0);
    else
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)tb, (int)nr, (int)g->ci, 1.0f, V + (size_t)xi * vstride,
                  (int)g->ci8, u, (int)ld, 0.0f, M + (size_t)xi * mstride, (int)ld);
  })
  int64_t oy0 = g->m * ty0, oy1 = g->m * ty1 < g->oh ? g->m * ty1 : g->oh, nrow = oy1 - oy0;
  WG_ITEMS(it, nbe * cob, {
    int64_t s = it / cob, j0 = (it % cob) * WG_VL, o0 = r0 + j0;
    static const float zero8[WG_VL] = {0};
    wg_output_tiles(g, M + s * bt * ld + j0, mstride, ld, nty, a->bias ? a->bias + o0 : zero8, st);
    /* each sample's rows of the canvas band, de-interleaved into its planes */
    WG_PIECES(g, n0 + s, oy0, oy0 + nrow, g->soh, g->sow, WG_OUT_PIECE)
  })
}

/* One chunk: its input transforms, products and outputs. */
static void wg_conv_chunk(const wg_conv *a, const float *U, int64_t k, float *V, float *M, float *me, int nth) {
  wg_chunk_inputs(a, k, V, me, nth);
  wg_chunk_outputs(a, U, k, V, M, me, nth, 0, a->g->co);
}

/* Runs inside a parallel region, on every thread; U holds the transformed
 * weights, (xi, ci, co8). */
static void wg_conv_run(const wg_conv *a, const float *U, int tid, int nth) {
  const wg_layout *L = a->L;
  float *ws = (float *)a->c->ws, *me = cpu_ws_slice(a->c, tid, L->per_thread, L->shared);
  int64_t nchunks = wg_chunks(a->g);
  if (nth > 1 && nchunks >= WG_PRIVATE_CHUNKS * nth) {
    float *V = ws + L->off_v + (size_t)tid * L->vm, *M = V + L->vm / 2;
#pragma omp for schedule(dynamic, 1) nowait
    for (int64_t k = 0; k < nchunks; k++) wg_conv_chunk(a, U, k, V, M, me, 1);
    return;
  }
  for (int64_t k = 0; k < nchunks; k++) wg_conv_chunk(a, U, k, ws + L->off_v, ws + L->off_m, me, nth);
}

/* U[xi][col][row] (xi, cols, up8(rows)), from the f32 weight wf (O, C, 3, 3):
 * the forward weights (rot = 0: row o, column c) or the rotated, transposed
 * ones backward data uses (rot = 1: row c, column o), for tiles of M x M
 * outputs. A row is an output channel of the product M = V U, a column one
 * of the channels it sums over: each U[xi] is the product's right-hand side
 * as it is read, output channels innermost (8 to a vector here). The columns
 * from col0 in steps of step. */
WG_INLINE void wg_weights_m(const float *wf, int64_t O, int64_t C, int rot, float *U, int64_t col0, int64_t step,
                            const int M) {
  const int A = M + 2;
  int64_t rows = rot ? C : O, cols = rot ? O : C, ld = up8(rows);
  size_t stride = (size_t)(cols * ld);
  for (int64_t col = col0; col < cols; col += step)
    for (int64_t r0 = 0; r0 < rows; r0 += WG_VL) {
      float k[9][WG_VL];
      for (int64_t q = 0; q < WG_VL; q++) {
        int64_t row = r0 + q;
        const float *src = row < rows ? wf + (rot ? col * C + row : row * C + col) * 9 : NULL;
        for (int i = 0; i < 9; i++) k[i][q] = src ? src[rot ? 8 - i : i] : 0.0f;
      }
      v8 t[8][3], g3[3], u6[8];
      for (int j = 0; j < 3; j++) {
        for (int i = 0; i < 3; i++) g3[i] = LD(k[i * 3 + j]);
        wg_w1(g3, u6, M);
        for (int i = 0; i < A; i++) t[i][j] = u6[i];
      }
      float *ut = U + col * ld + r0;
      for (int i = 0; i < A; i++) {
        wg_w1(t[i], u6, M);
        for (int j = 0; j < A; j++) ST(ut + (size_t)(i * A + j) * stride, u6[j]);
      }
    }
}
WG_VECTOR static void wg_weights4(const float *wf, int64_t O, int64_t C, int rot, float *U, int64_t col0, int64_t step) {
  wg_weights_m(wf, O, C, rot, U, col0, step, 4);
}
WG_VECTOR static void wg_weights2(const float *wf, int64_t O, int64_t C, int rot, float *U, int64_t col0, int64_t step) {
  wg_weights_m(wf, O, C, rot, U, col0, step, 2);
}
WG_VECTOR static void wg_weights6(const float *wf, int64_t O, int64_t C, int rot, float *U, int64_t col0, int64_t step) {
  wg_weights_m(wf, O, C, rot, U, col0, step, 6);
}
static void wg_weights(const wg_geom *g, const float *wf, int64_t O, int64_t C, int rot, float *U, int64_t col0,
                       int64_t step) {
  if (g->m == 6) wg_weights6(wf, O, C, rot, U, col0, step);
  else if (g->m == 4) wg_weights4(wf, O, C, rot, U, col0, step);
  else wg_weights2(wf, O, C, rot, U, col0, step);
}

/* dg = G^T dU G for output channel o: dU (xi, O, ci8) -> dw (C, 3, 3) f32,
 * tiles of M x M outputs (4 or 6). */
WG_INLINE void wg_weight_grad_row_m(const float *dU, int64_t O, int64_t C, int64_t o, float *dw, const int M) {
  const int A = M + 2;
  int64_t ld = up8(C);
  size_t stride = (size_t)(O * ld);
  for (int64_t c0 = 0; c0 < C; c0 += WG_VL) {
    const float *ut = dU + o * ld + c0;
    v8 t[3][8], u6[8], g3[3];
    for (int j = 0; j < A; j++) {
      for (int i = 0; i < A; i++) u6[i] = LD(ut + (size_t)(i * A + j) * stride);
      wg_wt1(u6, g3, M);
      for (int i = 0; i < 3; i++) t[i][j] = g3[i];
    }
    float k[9][WG_VL];
    for (int i = 0; i < 3; i++) {
      wg_wt1(t[i], g3, M);
      for (int j = 0; j < 3; j++) ST(k[i * 3 + j], g3[j]);
    }
    for (int64_t q = 0; q < WG_VL && c0 + q < C; q++)
      for (int i = 0; i < 9; i++) dw[(c0 + q) * 9 + i] = k[i][q];
  }
}
WG_VECTOR static void wg_weight_grad_row4(const float *dU, int64_t O, int64_t C, int64_t o, float *dw) {
  wg_weight_grad_row_m(dU, O, C, o, dw, 4);
}
WG_VECTOR static void wg_weight_grad_row6(const float *dU, int64_t O, int64_t C, int64_t o, float *dw) {
  wg_weight_grad_row_m(dU, O, C, o, dw, 6);
}
static void wg_weight_grad_row(const wg_geom *g, const float *dU, int64_t O, int64_t C, int64_t o, float *dw) {
  if (g->m == 6) wg_weight_grad_row6(dU, O, C, o, dw);
  else wg_weight_grad_row4(dU, O, C, o, dw);
}

/* The weight as f32 in the shared workspace (or the tensor itself). */
static const float *wg_weight_f32(const ampc__op_call *c, const wg_layout *L) {
  const ampc_tensor *w = &c->in[1];
  return cpu_load(w, 0, (size_t)ampc_shape_numel(&w->shape), (float *)c->ws + L->off_wf);
}

/* A single-chunk layer a block of L->cb output channels at a time (see
 * wg_block), inside a parallel region on every thread: the chunk's V, then
 * for each block its weight in f32, its U and its products and outputs. The
 * forward's blocks are rows of the weight (O, C, 3, 3), which lie end to
 * end; backward data's (rot) are slices of the input channels of every
 * output channel's row, gathered as (O, nr, 3, 3). */
static void wg_conv_blocked(const wg_conv *a, int rot, int tid, int nth) {
  const wg_layout *L = a->L;
  const wg_geom *g = a->g;
  const ampc_tensor *w = &a->c->in[1];
  int64_t O = w->shape.d[0], C = w->shape.d[1];
  float *ws = (float *)a->c->ws, *me = cpu_ws_slice(a->c, tid, L->per_thread, L->shared);
  float *U = ws, *V = ws + L->off_v, *M = ws + L->off_m, *wb = ws + L->off_wf;
  wg_chunk_inputs(a, 0, V, me, nth);
  for (int64_t r0 = 0; r0 < g->co; r0 += L->cb) {
    int64_t nr = g->co - r0 < L->cb ? g->co - r0 : L->cb;
    if (!rot) {
      WG_ITEMS(o, nr, { ampc_load_f32(wb + o * C * 9, w->dtype, cpu_at(w, (r0 + o) * C * 9), (size_t)(C * 9)); })
    } else {
      WG_ITEMS(o, O, { ampc_load_f32(wb + o * nr * 9, w->dtype, cpu_at(w, (o * C + r0) * 9), (size_t)(nr * 9)); })
    }
    wg_weights(g, wb, rot ? O : nr, rot ? nr : C, rot, U, tid, nth);
    if (nth > 1) {
#pragma omp barrier
    }
    wg_chunk_outputs(a, U, 0, V, M, me, nth, r0, nr);
  }
}

ampc_status ampc__cpu_wino_fwd(const ampc__op_call *c) {
  wg_layout L = wg_plan(c, cpu_ctx(c)->nthreads, 0, wg_tile(c));
  const ampc_tensor *b = c->n_in > 2 ? &c->in[2] : NULL;
  float *U = (float *)c->ws, *bias = b ? (float *)c->ws + L.off_db : NULL;
  if (b) {
    memset(bias, 0, (size_t)L.f.co8 * sizeof(float));
    ampc_load_f32(bias, b->dtype, b->data, (size_t)L.f.co);
  }
  const float *wf = L.cb ? NULL : wg_weight_f32(c, &L);
  wg_conv a = {.c = c, .L = &L, .g = &L.f, .in = &c->in[0], .out = &c->out, .pro = c->pro ? c : NULL, .bias = bias,
               .grad = 0, .acc = 0};
#pragma omp parallel num_threads(cpu_ctx(c)->nthreads)
  {
    int tid = omp_get_thread_num(), nth = omp_get_num_threads();
    if (L.cb) {
      wg_conv_blocked(&a, 0, tid, nth);
    } else {
      wg_weights(&L.f, wf, L.f.co, L.f.ci, 0, U, tid, nth);
#pragma omp barrier
      wg_conv_run(&a, U, tid, nth);
    }
  }
  return AMPC_OK;
}

/* out[q] = the sum of lane q of n vectors of 8 (in order) */
WG_VECTOR static void wg_sum8(const float *st, int64_t n, float *out) {
  v8 acc = {0};
  for (int64_t i = 0; i < n; i++) acc += LD(st + i * WG_VL);
  ST(out, acc);
}

/* One chunk of the weight gradient for output channels [r0, r0 + nr): the
 * input's transforms (when inputs) and the output gradient's, then dU[xi]
 * (+)= dM[xi]^T V[xi] by transform point (added when acc), dU (xi, nr,
 * ci8); shared by the team when nth > 1, as wg_conv_chunk. dbp (or NULL):
 * each staged block of 8 output channels' sums, the bias gradient's part
 * from (chunk k, its sample or canvas s), at dbp + (k * nb + s) * co8. */
static void wg_wgrad_chunk(const ampc__op_call *c, const wg_layout *L, int64_t k, float *V, float *M, float *me, int nth,
                           float *dU, int acc, int64_t r0, int64_t nr, int inputs, float *dbp) {
  const wg_geom *g = &L->w;
  float *st = me + L->off_st, *band = me + L->off_band;
  int64_t O = g->co, C = g->ci, cib = inputs ? g->ci8 / WG_VL : 0, ld = up8(nr), cob = ld / WG_VL;
  int64_t n0, nbe, ty0, ty1;
  wg_chunk(g, k, &n0, &nbe, &ty0, &ty1);
  int64_t nty = ty1 - ty0, bt = nty * g->tw, tb = nbe * bt;
  size_t vstride = wg_pstride(tb * g->ci8), mstride = wg_pstride(tb * ld);
  WG_ITEMS(it, nbe * (cib + cob), {
    int64_t s = it / (cib + cob), blk = it % (cib + cob);
    if (blk < cib) {
      wg_stage(g, &c->in[0], c->pro ? c : NULL, n0 + s, blk * WG_VL, C, ty0, ty1, st, band);
      wg_input_tiles(g, st, nty, V + s * bt * g->ci8 + blk * WG_VL, vstride, g->ci8);
    } else {
      int64_t j0 = (blk - cib) * WG_VL;
      wg_stage_grad(g, &c->dout, n0 + s, r0 + j0, ty0, ty1, st, band);
      if (dbp) wg_sum8(st, g->m * nty * g->m * g->tw, dbp + (k * g->nb + s) * g->co8 + r0 + j0);
      wg_grad_tiles(g, st, nty, M + s * bt * ld + j0, mstride, ld);
    }
  })
  WG_ITEMS(xi, g->np, {
    if (wg_own(g->ci8, O, WG_SMALL_WGRAD_K))
      ampc__cpu_gemm(nr, g->ci8, tb, M + (size_t)xi * mstride, ld, 1, V + (size_t)xi * vstride, g->ci8,
                    dU + (size_t)xi * nr * g->ci8, g->ci8, acc);
    else
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)nr, (int)C, (int)tb, 1.0f, M + (size_t)xi * mstride, (int)ld,
                  V + (size_t)xi * vstride, (int)g->ci8, acc ? 1.0f : 0.0f, dU + (size_t)xi * nr * g->ci8, (int)g->ci8);
  })
}

ampc_status ampc__cpu_wino_bwd(const ampc__op_call *c) {
  wg_layout L = wg_plan(c, cpu_ctx(c)->nthreads, 0, wg_tile(c));
  const wg_geom *g = &L.w;
  const ampc_tensor *dy = &c->dout, *dx = &c->din[0], *dw = &c->din[1];
  const ampc_tensor *db = c->n_in > 2 ? &c->din[2] : NULL;
  int need_dx = dx->data != NULL, need_dw = dw->data != NULL, need_db = db && db->data;
  float *ws = (float *)c->ws, *U = ws, *V = ws + L.off_v, *M = ws + L.off_m, *dbias = ws + L.off_db;
  double t0 = cpu_ctx(c)->timers ? omp_get_wtime() : 0.0, t1 = t0;
  int64_t ohw = g->soh * g->sow, O = g->co, C = g->ci;
  if (need_dw || need_db) {
#pragma omp parallel num_threads(cpu_ctx(c)->nthreads)
    {
      int tid = omp_get_thread_num(), nth = omp_get_num_threads();
      float *me = cpu_ws_slice(c, tid, L.per_thread, L.shared);
      float *band = me + L.off_band, *tmp = me + L.off_tmp, *wr = me + L.off_w;
      /* with the weight gradient, the bias gradient from the dY it stages
       * (instead of a pass of its own over dY: the cnn's second convolution's
       * backward 4.16-4.18 -> 4.07-4.15 ms on a Zen 4, three alternating
       * runs) */
      float *dbp = need_db && need_dw ? ws + L.off_dbp : NULL;
      if (need_db && !need_dw)
        for (int64_t o = tid; o < O; o += nth) {
          float s = 0.0f;
          int64_t piece = g->band / g->sow * g->sow; /* whole rows that fit the band buffer */
          for (int64_t n = 0; n < g->ns; n++) {
            if (n + CPU_AHEAD < g->ns) cpu_prefetch(dy, ((n + CPU_AHEAD) * O + o) * ohw, (size_t)ohw, 0);
            for (int64_t i = 0; i < ohw; i += piece) {
              size_t len = (size_t)(ohw - i < piece ? ohw - i : piece);
              s += cpu_sum(cpu_load(dy, (n * O + o) * ohw + i, len, band), len);
            }
          }
          dbias[o] = s;
        }
      if (need_dw && L.du) {
        /* by slots: each thread takes whole slots, with its own V and M */
        float *V = ws + L.off_v + (size_t)tid * L.vm, *Mt = V + L.vm / 2;
        int64_t nchunks = wg_chunks(g);
#pragma omp for schedule(dynamic, 1)
        for (int sl = 0; sl < WG_SLOTS; sl++) {
          float *dU = ws + L.off_du + (size_t)sl * L.du;
          if (sl >= nchunks) memset(dU, 0, L.du * sizeof(float));
          for (int64_t k = sl; k < nchunks; k += WG_SLOTS)
            wg_wgrad_chunk(c, &L, k, V, Mt, me, 1, dU, k >= WG_SLOTS, 0, O, 1, dbp);
        }
        /* dU = the slots in order; each thread sums the rows it then turns into dw */
        for (int64_t o = tid; o < O; o += nth) {
          for (int64_t xi = 0; xi < g->np; xi++) {
            float *u = U + ((size_t)xi * O + o) * g->ci8;
            const float *p0 = ws + L.off_du + ((size_t)xi * O + o) * g->ci8;
            for (int64_t i = 0; i < g->ci8; i++) {
              float acc = p0[i];
              for (int sl = 1; sl < WG_SLOTS; sl++) acc += p0[(size_t)sl * L.du + i];
              u[i] = acc;
            }
          }
          wg_weight_grad_row(g, U, O, C, o, wr);
          cpu_store_grad(c, dw, o * C * 9, wr, (size_t)(C * 9), c->din_acc[1], tmp);
        }
      } else if (need_dw && L.cb) {
        /* a single chunk, a block of output channels at a time (wg_block):
         * V with the first block's dM, then each block's dU and its rows of
         * dw */
        for (int64_t r0 = 0; r0 < O; r0 += L.cb) {
          int64_t nr = O - r0 < L.cb ? O - r0 : L.cb;
          wg_wgrad_chunk(c, &L, 0, V, M, me, nth, U, 0, r0, nr, r0 == 0, dbp);
          for (int64_t o = r0 + tid; o < r0 + nr; o += nth) {
            wg_weight_grad_row(g, U, nr, C, o - r0, wr);
            cpu_store_grad(c, dw, o * C * 9, wr, (size_t)(C * 9), c->din_acc[1], tmp);
          }
#pragma omp barrier
        }
      } else if (need_dw) {
        int64_t nchunks = wg_chunks(g);
        for (int64_t k = 0; k < nchunks; k++) wg_wgrad_chunk(c, &L, k, V, M, me, nth, U, k > 0, 0, O, 1, dbp);
#pragma omp barrier
        for (int64_t o = tid; o < O; o += nth) {
          wg_weight_grad_row(g, U, O, C, o, wr);
          cpu_store_grad(c, dw, o * C * 9, wr, (size_t)(C * 9), c->din_acc[1], tmp);
        }
      }
      /* each path ends its chunks with a barrier: the parts are all there,
       * added in a fixed order (the same bits for any thread count) */
      if (dbp)
        for (int64_t o = tid; o < O; o += nth) {
          float sum = 0.0f;
          for (int64_t k = 0, nchunks = wg_chunks(g); k < nchunks; k++) {
            int64_t n0, nbe, ty0, ty1;
            wg_chunk(g, k, &n0, &nbe, &ty0, &ty1);
            for (int64_t s = 0; s < nbe; s++) sum += dbp[(k * g->nb + s) * g->co8 + o];
          }
          dbias[o] = sum;
        }
    }
    if (need_db) {
      float *tmp = cpu_ws_slice(c, 0, L.per_thread, L.shared) + L.off_tmp;
      cpu_store_grad(c, db, 0, dbias, (size_t)O, c->din_acc[2], tmp);
    }
    t1 = cpu_ctx(c)->timers ? omp_get_wtime() : 0.0;
  }
  if (need_dx) {
    const float *wf = L.cb ? NULL : wg_weight_f32(c, &L);
    wg_conv a = {.c = c, .L = &L, .g = &L.d, .in = dy, .out = dx, .pro = NULL, .bias = NULL, .grad = 1, .acc = c->din_acc[0]};
#pragma omp parallel num_threads(cpu_ctx(c)->nthreads)
    {
      int tid = omp_get_thread_num(), nth = omp_get_num_threads();
      if (L.cb) {
        wg_conv_blocked(&a, 1, tid, nth);
      } else {
        wg_weights(&L.d, wf, O, C, 1, U, tid, nth);
#pragma omp barrier
        wg_conv_run(&a, U, tid, nth);
      }
    }
  }
  if (cpu_ctx(c)->timers) {
    double t2 = omp_get_wtime();
    cpu_ctx(c)->timers[0] += t2 - t1;
    cpu_ctx(c)->timers[1] += t1 - t0;
  }
  return AMPC_OK;
}
