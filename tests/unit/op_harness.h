/*
 * op_harness.h -- the op-test harness shared by test_ops.c (every op, every
 * storage type, every backend) and test_graph.c (the graph's behaviour).
 *
 * Each op is tested in a small graph of this shape (h is the op's input,
 * (N, C, H, W) or (N, K)):
 *
 *   x (input) --\
 *                add -- cast(act_type) = h -- OP -- y -- flatten -- linear(head.weight) -- cross_entropy
 *   P (param) --/                            |
 *                               op parameters (weight, bias / gamma, beta, running stats)
 *
 * Graph inputs get no gradient, so the op's input is h = x + P: whatever
 * gradient reaches h reaches P unchanged (checked exactly), and perturbing P
 * perturbs h for finite differences. For the cross-entropy op itself there is
 * no head: the op is the loss. Every value goes in and out through the
 * graph's I/O (ampc_graph_write / ampc_graph_read), so the same harness runs
 * on any backend.
 */
#ifndef AMPC_TEST_OP_HARNESS_H
#define AMPC_TEST_OP_HARNESS_H

/* each test file uses some of the helpers */
#pragma GCC diagnostic ignored "-Wunused-function"

#include <math.h>
#include <stdint.h>

#include "ampc/amp.h"
#include "ampc/backend.h"
#include "ampc/graph.h"
#include "ampc/rng.h"
#include "test.h"

#define SEED 0x5eed0f0dULL

/* ---------------- small utilities ---------------- */

/* Every allocation of one case, freed together at its end. */
static void *bag[2048];
static int nbag;
static void *tmp_alloc(size_t bytes) {
  void *p = calloc(bytes ? bytes : 1, 1);
  if (!p) abort();
  if (nbag == (int)(sizeof bag / sizeof bag[0])) abort();
  bag[nbag++] = p;
  return p;
}
static void tmp_free_all(void) {
  while (nbag > 0) free(bag[--nbag]);
}

/* Uniform in [lo, hi), a pure function of (stream, i): a tensor's first k
 * samples are the same whatever batch it was made for. */
static float urand(uint64_t stream, uint64_t i, float lo, float hi) {
  float u = (float)(ampc_rng_at(SEED, stream, i) >> 40) * (1.0f / 16777216.0f);
  return lo + (hi - lo) * u;
}
static float *rand_vec(uint64_t stream, size_t n, float lo, float hi) {
  float *v = tmp_alloc(n * sizeof *v);
  for (size_t i = 0; i < n; i++) v[i] = urand(stream, i, lo, hi);
  return v;
}

static float round_to(ampc_dtype t, float x) {
  if (t == AMPC_DTYPE_F16) return ampc_f16_to_f32(ampc_f32_to_f16(x));
  if (t == AMPC_DTYPE_BF16) return ampc_bf16_to_f32(ampc_f32_to_bf16(x));
  return x;
}

/* Normalised-error tolerance per storage type: about 2 ulps of the type
 * relative to the tensor's largest value. */
static double tol_of(ampc_dtype t) {
  switch (t) {
    case AMPC_DTYPE_F16: return 2e-3;
    case AMPC_DTYPE_BF16: return 1.6e-2;
    default: return 1e-5;
  }
}
static double tol_max(double a, double b) { return a > b ? a : b; }

static size_t numel_of(ampc_tensor t) { return (size_t)ampc_tensor_numel(&t); }

/* A value's stored values (grad: its gradient's) at the effective batch as
 * f32, read through the graph's I/O (zeros where it has none). */
static float *read_f32(ampc_graph *g, ampc_value v, int grad) {
  ampc_tensor t = grad ? ampc_graph_grad(g, v) : ampc_graph_tensor(g, v);
  size_t n = numel_of(t);
  float *f = tmp_alloc(n * sizeof *f);
  CHECK_OK(grad ? ampc_graph_read_grad(g, v, f, AMPC_DTYPE_F32) : ampc_graph_read(g, v, f, AMPC_DTYPE_F32));
  return f;
}
static float *val_f32(ampc_graph *g, ampc_value v) { return read_f32(g, v, 0); }
static float *grad_f32(ampc_graph *g, ampc_value v) { return read_f32(g, v, 1); }
/* The same as fp64, rounded on to `eff` (the type an op computes from). */
static double *read_f64(ampc_graph *g, ampc_value v, int grad, ampc_dtype eff) {
  size_t n = numel_of(grad ? ampc_graph_grad(g, v) : ampc_graph_tensor(g, v));
  float *f = read_f32(g, v, grad);
  double *d = tmp_alloc(n * sizeof *d);
  for (size_t i = 0; i < n; i++) d[i] = round_to(eff, f[i]);
  return d;
}
static double *val_f64(ampc_graph *g, ampc_value v, ampc_dtype eff) { return read_f64(g, v, 0, eff); }
static double *grad_f64(ampc_graph *g, ampc_value v, ampc_dtype eff) { return read_f64(g, v, 1, eff); }
static int64_t read_i64(ampc_graph *g, ampc_value v) {
  int64_t x = -1;
  CHECK_OK(ampc_graph_read(g, v, &x, AMPC_DTYPE_I64));
  return x;
}
static void write_labels(ampc_graph *g, ampc_value v, const int32_t *l) { CHECK_OK(ampc_graph_write(g, v, l, AMPC_DTYPE_I32)); }
static double *zeros(size_t n) { return tmp_alloc(n * sizeof(double)); }

/* max|got - ref| / (max|ref| + tiny); NaN or infinity in got counts as infinite. */
static double nerr(const float *got, const double *ref, size_t n) {
  double m = 0.0, e = 0.0;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)got[i] - ref[i]);
    if (!(d == d) || isinf(d)) return INFINITY;
    if (fabs(ref[i]) > m) m = fabs(ref[i]);
    if (d > e) e = d;
  }
  return e / (m + 1e-30);
}

static const char *ctx_case, *ctx_prec;

static void check_close(const char *what, const float *got, const double *ref, size_t n, double tol) {
  double e = nerr(got, ref, n);
  CHECK_MSG(e <= tol, "%s [%s]: %s: normalised error %.3g > %.3g", ctx_case, ctx_prec, what, e, tol);
}

/* ---------------- precisions ---------------- */

typedef struct {
  const char *name;
  ampc_graph_precision p;
} prec_case;

static const prec_case PRECS[] = {
    {"f32", {AMPC_DTYPE_F32, AMPC_DTYPE_F32, AMPC_DTYPE_F32, 0, AMPC_DTYPE_F16, NULL}},
    {"f16", {AMPC_DTYPE_F16, AMPC_DTYPE_F16, AMPC_DTYPE_F16, 0, AMPC_DTYPE_F16, NULL}},
    {"bf16", {AMPC_DTYPE_BF16, AMPC_DTYPE_BF16, AMPC_DTYPE_BF16, 0, AMPC_DTYPE_BF16, NULL}},
    /* apex O1: fp32 parameters, half activations, per-op casts */
    {"o1-f16", {AMPC_DTYPE_F32, AMPC_DTYPE_F32, AMPC_DTYPE_F16, 1, AMPC_DTYPE_F16, ampc_amp_cast_policy}},
};
#define NPRECS ((int)(sizeof PRECS / sizeof PRECS[0]))

/* ---------------- op cases ---------------- */

typedef enum {
  K_CONV,
  K_BN_TRAIN,
  K_BN_EVAL,
  K_RELU,
  K_MAXPOOL,
  K_AVGPOOL,
  K_GAP,
  K_LINEAR,
  K_ADD,
  K_FLATTEN,
  K_SOFTMAX,
  K_LOG_SOFTMAX,
  K_CE,
  K_CAST
} kind;

typedef struct {
  const char *name;
  kind k;
  int64_t n, c, h, w;            /* the op's input h: (n, c, h, w), or (n, c) when h == 0 */
  int o, ks, stride, pad, bias;  /* conv: out channels, kernel; linear: out features; pools */
  float smoothing;               /* cross entropy */
  ampc_dtype to;                 /* cast */
  int h2_f32;                    /* add: the second operand stored in f32 (autocast promotes) */
  int no_fd;                     /* no finite differences (a case there for its shape, checked against fp64) */
} op_case;

static const op_case CASES[] = {
    {.name = "conv3x3_s1_p1_bias", .k = K_CONV, .n = 2, .c = 3, .h = 5, .w = 5, .o = 4, .ks = 3, .stride = 1, .pad = 1, .bias = 1},
    {.name = "conv3x3_s2_p1", .k = K_CONV, .n = 3, .c = 2, .h = 7, .w = 6, .o = 3, .ks = 3, .stride = 2, .pad = 1},
    {.name = "conv3x3_s1_p0_bias", .k = K_CONV, .n = 2, .c = 2, .h = 7, .w = 7, .o = 3, .ks = 3, .stride = 1, .pad = 0, .bias = 1},
    {.name = "conv1x1_s1_bias", .k = K_CONV, .n = 2, .c = 3, .h = 6, .w = 5, .o = 2, .ks = 1, .stride = 1, .bias = 1},
    /* big enough that the convolution's workspace is the graph's largest and
     * element-wise ops run in several blocks */
    {.name = "conv3x3_16x16", .k = K_CONV, .n = 4, .c = 8, .h = 16, .w = 16, .o = 8, .ks = 3, .stride = 1, .pad = 1, .bias = 1},
    {.name = "conv1x1_s2", .k = K_CONV, .n = 3, .c = 4, .h = 5, .w = 5, .o = 3, .ks = 1, .stride = 2},
    /* im2col with a group of samples per thread that grows when fewer threads run than were compiled for */
    {.name = "conv3x3_c6_o1", .k = K_CONV, .n = 3, .c = 6, .h = 8, .w = 8, .o = 1, .ks = 3, .stride = 1, .pad = 0},
    {.name = "conv3x3_c1_wide", .k = K_CONV, .n = 3, .c = 1, .h = 6, .w = 37, .o = 5, .ks = 3, .stride = 1, .pad = 1, .bias = 1},
    {.name = "conv3x3_c1_p0_w11", .k = K_CONV, .n = 2, .c = 1, .h = 5, .w = 11, .o = 2, .ks = 3, .stride = 1, .pad = 0},
    {.name = "conv3x3_s1_p2", .k = K_CONV, .n = 2, .c = 3, .h = 4, .w = 5, .o = 2, .ks = 3, .stride = 1, .pad = 2},
    /* enough channels that the default algorithm is Winograd; odd planes */
    {.name = "conv3x3_24ch", .k = K_CONV, .n = 3, .c = 24, .h = 9, .w = 11, .o = 20, .ks = 3, .stride = 1, .pad = 1, .bias = 1},
    /* 40 outputs from 32 inputs: Winograd's small products in every block of the 16-wide kernel (32 + 8 columns
       forward, 32 in the weight gradient, 12-row blocks) */
    {.name = "conv3x3_32to40", .k = K_CONV, .n = 2, .c = 32, .h = 8, .w = 10, .o = 40, .ks = 3, .stride = 1, .pad = 1, .bias = 1},
    /* ResNet-18's downsampling shapes in small: im2col's products on ampc's kernel where it runs 16 wide
       (planes of 4x4 outputs; 288 rows of columns, past one slice of the kernel's sum over k) */
    /* the Fashion-MNIST cnn's 14 x 14 planes: enough samples that Winograd's F(4x4) packs them 3 x 3 to a
       canvas (wg_pack), two canvases, the second with room for 9 more */
    {.name = "conv3x3_14x14", .k = K_CONV, .n = 18, .c = 8, .h = 14, .w = 14, .o = 8, .ks = 3, .stride = 1, .pad = 1, .bias = 1,
     .no_fd = 1},
    {.name = "conv3x3_s2_32ch", .k = K_CONV, .n = 2, .c = 32, .h = 8, .w = 8, .o = 16, .ks = 3, .stride = 2, .pad = 1},
    {.name = "conv1x1_s2_8ch", .k = K_CONV, .n = 2, .c = 8, .h = 8, .w = 8, .o = 16, .ks = 1, .stride = 2},
    /* im2col's groups of samples evened out over 2 threads: 16 a group by
       its column target, 3 groups, made 4 of 10 */
    {.name = "conv3x3_s2_groups", .k = K_CONV, .n = 40, .c = 4, .h = 8, .w = 8, .o = 4, .ks = 3, .stride = 2, .pad = 1, .no_fd = 1},
    /* strided, with kernel columns that only ever land on the right padding
       (k >= W + pad + 1): im2col/col2im once read the next row for them */
    {.name = "conv3x3_s2_1x1", .k = K_CONV, .n = 2, .c = 3, .h = 1, .w = 1, .o = 5, .ks = 3, .stride = 2, .pad = 1, .bias = 1},
    {.name = "conv3x3_s3_1x1", .k = K_CONV, .n = 2, .c = 2, .h = 1, .w = 1, .o = 3, .ks = 3, .stride = 3, .pad = 1},
    {.name = "conv5x5_s2_2x2_p2", .k = K_CONV, .n = 3, .c = 2, .h = 2, .w = 2, .o = 3, .ks = 5, .stride = 2, .pad = 2},
    {.name = "conv7x7_s2_9x5_p1", .k = K_CONV, .n = 2, .c = 2, .h = 9, .w = 5, .o = 2, .ks = 7, .stride = 2, .pad = 1},
    {.name = "conv5x5_s3_w3_p1", .k = K_CONV, .n = 2, .c = 2, .h = 7, .w = 3, .o = 2, .ks = 5, .stride = 3, .pad = 1},
    {.name = "bn_train", .k = K_BN_TRAIN, .n = 3, .c = 3, .h = 5, .w = 5},
    {.name = "bn_train_odd", .k = K_BN_TRAIN, .n = 2, .c = 4, .h = 3, .w = 7},
    {.name = "bn_eval", .k = K_BN_EVAL, .n = 2, .c = 3, .h = 5, .w = 6},
    /* rows of 8 and 4 (the cuda kernels' runs of 8 and 4 elements a load) */
    {.name = "bn_train_w16", .k = K_BN_TRAIN, .n = 3, .c = 5, .h = 3, .w = 16},
    {.name = "bn_eval_w8", .k = K_BN_EVAL, .n = 2, .c = 3, .h = 2, .w = 8},
    {.name = "bn_train_w4", .k = K_BN_TRAIN, .n = 5, .c = 6, .h = 4, .w = 4},
    /* channels of more than 2^16 values (backward keeps dy but not x between
     * its passes) and of more than 2^18 (neither) */
    {.name = "bn_train_big", .k = K_BN_TRAIN, .n = 2, .c = 2, .h = 200, .w = 201},
    {.name = "bn_train_huge", .k = K_BN_TRAIN, .n = 2, .c = 1, .h = 370, .w = 372},
    {.name = "relu", .k = K_RELU, .n = 2, .c = 3, .h = 5, .w = 5},
    /* multiples of 8 elements (the cuda element-wise kernels' runs of 8) */
    {.name = "relu_8s", .k = K_RELU, .n = 2, .c = 4, .h = 3, .w = 8},
    {.name = "maxpool_k2_s2", .k = K_MAXPOOL, .n = 2, .c = 3, .h = 6, .w = 6, .ks = 2, .stride = 2},
    {.name = "maxpool_k3_s2_p1", .k = K_MAXPOOL, .n = 2, .c = 2, .h = 7, .w = 7, .ks = 3, .stride = 2, .pad = 1},
    /* wide enough for the vectorised 2x2 path (8 windows at a time) and its tail */
    {.name = "maxpool_k2_s2_wide", .k = K_MAXPOOL, .n = 2, .c = 2, .h = 4, .w = 35, .ks = 2, .stride = 2},
    {.name = "maxpool_k2_s2_odd", .k = K_MAXPOOL, .n = 3, .c = 2, .h = 5, .w = 7, .ks = 2, .stride = 2},
    /* rows of 4 to 7 windows (one step per row pair), odd and even planes */
    {.name = "maxpool_k2_s2_short", .k = K_MAXPOOL, .n = 2, .c = 3, .h = 9, .w = 13, .ks = 2, .stride = 2},
    {.name = "maxpool_k2_s2_short4", .k = K_MAXPOOL, .n = 2, .c = 2, .h = 8, .w = 8, .ks = 2, .stride = 2},
    {.name = "maxpool_k2_s2_short7", .k = K_MAXPOOL, .n = 2, .c = 2, .h = 14, .w = 15, .ks = 2, .stride = 2},
    {.name = "avgpool_k2_s2", .k = K_AVGPOOL, .n = 2, .c = 3, .h = 6, .w = 6, .ks = 2, .stride = 2},
    {.name = "avgpool_k3_s2_p1", .k = K_AVGPOOL, .n = 2, .c = 2, .h = 7, .w = 5, .ks = 3, .stride = 2, .pad = 1},
    {.name = "global_avgpool", .k = K_GAP, .n = 3, .c = 4, .h = 5, .w = 5},
    {.name = "linear_bias", .k = K_LINEAR, .n = 3, .c = 7, .o = 5, .bias = 1},
    {.name = "linear", .k = K_LINEAR, .n = 2, .c = 6, .o = 4},
    /* widths of whole vectors of 8, products big enough to split over the threads (by rows forward, by
       columns of 8 backward): ampc's kernel where it runs 16 wide */
    {.name = "linear_wide", .k = K_LINEAR, .n = 64, .c = 72, .o = 64, .bias = 1},
    /* a weight of more than 2^15 values: its transpose shared between the threads in bands of 8 columns, a partial block at the end */
    {.name = "linear_long", .k = K_LINEAR, .n = 8, .c = 604, .o = 64, .bias = 1},
    {.name = "add", .k = K_ADD, .n = 2, .c = 3, .h = 5, .w = 5},
    {.name = "add_f32_operand", .k = K_ADD, .n = 3, .c = 2, .h = 3, .w = 5, .h2_f32 = 1},
    {.name = "add_8s", .k = K_ADD, .n = 2, .c = 3, .h = 4, .w = 8},
    {.name = "add_f32_operand_8s", .k = K_ADD, .n = 2, .c = 2, .h = 2, .w = 8, .h2_f32 = 1},
    {.name = "flatten", .k = K_FLATTEN, .n = 2, .c = 3, .h = 5, .w = 5},
    {.name = "softmax", .k = K_SOFTMAX, .n = 3, .c = 7},
    {.name = "log_softmax", .k = K_LOG_SOFTMAX, .n = 3, .c = 7},
    {.name = "cross_entropy", .k = K_CE, .n = 4, .c = 6},
    {.name = "cross_entropy_ls0.1", .k = K_CE, .n = 3, .c = 5, .smoothing = 0.1f},
    {.name = "cast_f32", .k = K_CAST, .n = 2, .c = 3, .h = 5, .w = 5, .to = AMPC_DTYPE_F32},
    {.name = "cast_f16", .k = K_CAST, .n = 2, .c = 3, .h = 5, .w = 5, .to = AMPC_DTYPE_F16},
    {.name = "cast_bf16", .k = K_CAST, .n = 2, .c = 3, .h = 5, .w = 5, .to = AMPC_DTYPE_BF16},
    {.name = "cast_f32_8s", .k = K_CAST, .n = 2, .c = 2, .h = 2, .w = 8, .to = AMPC_DTYPE_F32},
    {.name = "cast_f16_8s", .k = K_CAST, .n = 2, .c = 2, .h = 2, .w = 8, .to = AMPC_DTYPE_F16},
};
#define NCASES ((int)(sizeof CASES / sizeof CASES[0]))

static const op_case *find_case(const char *name) {
  for (int i = 0; i < NCASES; i++)
    if (strcmp(CASES[i].name, name) == 0) return &CASES[i];
  abort();
}

enum { HEAD_CLASSES = 3 };
static const float BN_MOMENTUM = 0.1f, BN_EPS = 1e-5f;

/* random streams of the test data */
enum { S_X = 1, S_P, S_X2, S_P2, S_W, S_B, S_GAMMA, S_BETA, S_RM, S_RV, S_HEAD, S_LABELS, S_FD };

static ampc_shape in_shape(const op_case *cs, int64_t n) {
  return cs->h ? ampc_shape4(n, cs->c, cs->h, cs->w) : ampc_shape2(n, cs->c);
}
static int64_t per_sample(const op_case *cs) { return cs->c * (cs->h ? cs->h * cs->w : 1); }
static int64_t conv_out(int64_t n, int k, int s, int p) { return (n + 2 * p - k) / s + 1; }
static int is_bn(const op_case *cs) { return cs->k == K_BN_TRAIN || cs->k == K_BN_EVAL; }
static int training_of(const op_case *cs) { return cs->k != K_BN_EVAL; }

/* ---------------- the test graph ---------------- */

typedef struct {
  ampc_graph *g;
  int64_t n;
  ampc_value x, p, h, x2, p2, h2; /* h2: the second operand of add */
  ampc_value w, b;                /* conv/linear weight and bias; batch norm gamma and beta */
  ampc_value rm, rv, nbt;
  ampc_value y, head, labels, loss;
  int classes;
} net;

/* h = cast(x + P, act): an input (filled after compile) plus a parameter. */
static ampc_value op_input(ampc_graph *g, const char *xn, const char *pn, ampc_shape s, uint64_t sp, ampc_dtype act,
                           ampc_value *xo, ampc_value *po) {
  *xo = ampc_graph_input(g, xn, s);
  *po = ampc_graph_param(g, pn, s, 0, rand_vec(sp, (size_t)ampc_shape_numel(&s), -0.5f, 0.5f));
  return ampc_graph_cast(g, ampc_graph_add(g, *xo, *po), act);
}

static void fill_input(net *t, ampc_value v, uint64_t stream, float lo, float hi) {
  size_t n = numel_of(ampc_graph_tensor(t->g, v));
  CHECK_OK(ampc_graph_write(t->g, v, rand_vec(stream, n, lo, hi), AMPC_DTYPE_F32));
}

/* The convolution algorithm graphs are built with, and the Winograd chunk
 * size (tiles; 0 = the library's choice), a hook of the CPU backend. */
static ampc_conv_algo test_conv_algo = AMPC_CONV_AUTO;
extern int64_t ampc__cpu_wino_tile_target;
/* Winograd's tile where everything is f32 (0: the library's choice, F(2x2);
 * 4: F(4x4), the tile of 16-bit storage), a hook of the CPU backend. */
extern int ampc__cpu_wino_f32_tile;
/* When set, the CPU backend's own products (ampc__cpu_gemm) run its 16-wide
 * (AVX-512) kernel on any CPU, and take the products they take on an
 * AVX-512 CPU: a hook of the CPU backend. */
extern int ampc__cpu_gemm_force_wide;
/* 1: every Winograd product on the library's sgemm, as past 512 channels
 * (and past 64 on a CPU without AVX-512) */
extern int ampc__cpu_wino_blas;
/* > 0: a single-chunk Winograd layer makes U a block of that many output
 * channels (rounded up to 8) at a time, as ResNet-18's 512-channel layers do */
extern int ampc__cpu_wino_block;
/* 4 or 6: Winograd's tile where storage is 16-bit, F(4x4) or F(6x6); 0: the
 * library's choice (a hook of the CPU backend) */
extern int ampc__cpu_wino_tile16;
/* > 0: a same-size Winograd convolution packs that many samples a side to a
 * canvas; < 0: never; 0: the library's choice (a hook of the CPU backend) */
extern int ampc__cpu_wino_pack;
/* 1: every im2col product on the library's sgemm, as on a CPU without AVX-512 */
extern int ampc__cpu_conv_blas;
/* 1: every linear product on the library's sgemm, as on a CPU without AVX-512 */
extern int ampc__cpu_linear_blas;
extern int ampc__cpu_bn_by_channel;
/* the direct loop's 16-wide code on any CPU (conv_direct.c) */
extern int ampc__cpu_direct_wide;

/* The backend graphs are built on. */
static const char *test_backend = "cpu";

/* Records the op graph for batch n on the test backend, compiles it with
 * precision pr and fills the inputs (threads > 0: the cpu backends' thread
 * count). Returns 0 when it worked. */
static int build(net *t, const op_case *cs, const ampc_graph_precision *pr, int64_t n, int threads) {
  memset(t, 0, sizeof *t);
  t->n = n;
  t->w = t->b = t->rm = t->rv = t->nbt = t->x2 = t->p2 = t->h2 = t->head = AMPC_VALUE_NONE;
  CHECK_OK(ampc_graph_create(&t->g));
  if (!t->g) return -1;
  ampc_graph *g = t->g;
  ampc_backend_opts bo;
  ampc_backend_opts_default(&bo);
  bo.threads = threads;
  bo.conv = test_conv_algo;
  CHECK_OK(ampc_graph_set_backend(g, test_backend, &bo));
  t->h = op_input(g, "x", "P", in_shape(cs, n), S_P, pr->act_type, &t->x, &t->p);
  t->labels = ampc_graph_labels(g, "y", n);
  int64_t fan_in = cs->c * (cs->k == K_CONV ? cs->ks * cs->ks : 1);
  float wb = 2.0f / sqrtf((float)fan_in);
  switch (cs->k) {
    case K_CONV:
      t->w = ampc_graph_param(g, "op.weight", ampc_shape4(cs->o, cs->c, cs->ks, cs->ks), 0,
                              rand_vec(S_W, (size_t)(cs->o * fan_in), -wb, wb));
      if (cs->bias) t->b = ampc_graph_param(g, "op.bias", ampc_shape1(cs->o), 0, rand_vec(S_B, (size_t)cs->o, -0.5f, 0.5f));
      t->y = ampc_graph_conv2d(g, t->h, t->w, t->b, cs->stride, cs->pad);
      break;
    case K_BN_TRAIN:
    case K_BN_EVAL:
      t->w = ampc_graph_param(g, "op.weight", ampc_shape1(cs->c), 1, rand_vec(S_GAMMA, (size_t)cs->c, 0.5f, 1.5f));
      t->b = ampc_graph_param(g, "op.bias", ampc_shape1(cs->c), 1, rand_vec(S_BETA, (size_t)cs->c, -0.5f, 0.5f));
      t->rm = ampc_graph_buffer(g, "op.running_mean", AMPC_DTYPE_F32, ampc_shape1(cs->c), rand_vec(S_RM, (size_t)cs->c, -0.3f, 0.3f));
      t->rv = ampc_graph_buffer(g, "op.running_var", AMPC_DTYPE_F32, ampc_shape1(cs->c), rand_vec(S_RV, (size_t)cs->c, 0.5f, 1.5f));
      t->nbt = ampc_graph_buffer(g, "op.num_batches_tracked", AMPC_DTYPE_I64, (ampc_shape){0, {1, 1, 1, 1}}, NULL);
      t->y = ampc_graph_batchnorm2d(g, t->h, t->w, t->b, t->rm, t->rv, t->nbt, BN_MOMENTUM, BN_EPS);
      break;
    case K_RELU: t->y = ampc_graph_relu(g, t->h); break;
    case K_MAXPOOL: t->y = ampc_graph_maxpool2d(g, t->h, cs->ks, cs->stride, cs->pad); break;
    case K_AVGPOOL: t->y = ampc_graph_avgpool2d(g, t->h, cs->ks, cs->stride, cs->pad); break;
    case K_GAP: t->y = ampc_graph_global_avgpool(g, t->h); break;
    case K_LINEAR:
      t->w = ampc_graph_param(g, "op.weight", ampc_shape2(cs->o, cs->c), 0, rand_vec(S_W, (size_t)(cs->o * cs->c), -wb, wb));
      if (cs->bias) t->b = ampc_graph_param(g, "op.bias", ampc_shape1(cs->o), 0, rand_vec(S_B, (size_t)cs->o, -0.5f, 0.5f));
      t->y = ampc_graph_linear(g, t->h, t->w, t->b);
      break;
    case K_ADD:
      t->h2 = op_input(g, "x2", "P2", in_shape(cs, n), S_P2, cs->h2_f32 ? AMPC_DTYPE_F32 : pr->act_type, &t->x2, &t->p2);
      t->y = ampc_graph_add(g, t->h, t->h2);
      break;
    case K_FLATTEN: t->y = ampc_graph_flatten(g, t->h); break;
    case K_SOFTMAX: t->y = ampc_graph_softmax(g, t->h); break;
    case K_LOG_SOFTMAX: t->y = ampc_graph_log_softmax(g, t->h); break;
    case K_CE: t->y = ampc_graph_cross_entropy(g, t->h, t->labels, cs->smoothing); break;
    case K_CAST: t->y = ampc_graph_cast(g, t->h, cs->to); break;
  }
  if (cs->k == K_CE) {
    t->loss = t->y;
    t->classes = (int)cs->c;
  } else {
    /* the head: a fixed linear map of the flattened output to HEAD_CLASSES logits */
    ampc_value f = ampc_graph_flatten(g, t->y);
    int64_t feat = ampc_graph_status(g) ? 1 : ampc_graph_tensor(g, f).shape.d[1];
    float hb = 2.0f / sqrtf((float)feat);
    t->head = ampc_graph_param(g, "head.weight", ampc_shape2(HEAD_CLASSES, feat), 0,
                               rand_vec(S_HEAD, (size_t)(HEAD_CLASSES * feat), -hb, hb));
    t->loss = ampc_graph_cross_entropy(g, ampc_graph_linear(g, f, t->head, AMPC_VALUE_NONE), t->labels, 0.0f);
    t->classes = HEAD_CLASSES;
  }
  CHECK_OK(ampc_graph_set_precision(g, pr));
  ampc_graph_set_retain_grads(g, 1); /* the checks read activation gradients */
  /* AMPC_TEST_FREE_SAVED: one arena, each op's workspace exactly its own
   * (a kernel that used more would overwrite a value next to it) */
  if (getenv("AMPC_TEST_FREE_SAVED")) CHECK_OK(ampc_graph_set_free_saved(g, 1));
  ampc_status s = ampc_graph_compile(g);
  CHECK_OK(s);
  if (s < 0) return -1;
  /* the inputs spread a little wider than P, so h covers about [-1.5, 1.5] */
  fill_input(t, t->x, S_X, -1.0f, 1.0f);
  if (t->x2 >= 0) fill_input(t, t->x2, S_X2, -1.0f, 1.0f);
  int32_t *lab = tmp_alloc((size_t)n * sizeof *lab);
  for (int64_t i = 0; i < n; i++) lab[i] = (int32_t)(ampc_rng_at(SEED, S_LABELS, (uint64_t)i) % (uint64_t)t->classes);
  write_labels(g, t->labels, lab);
  return 0;
}

static float loss_of(const net *t) {
  float l = NAN;
  CHECK_OK(ampc_graph_read(t->g, t->loss, &l, AMPC_DTYPE_F32));
  return l;
}

/* ---------------- fp64 references ---------------- */

/* Forward y and, when dy is given, backward into zeroed dx, dw, db (any may be NULL). */
static void ref_conv(const double *x, const double *w, const double *b, int64_t N, int64_t C, int64_t H, int64_t W,
                     int64_t O, int k, int s, int p, const double *dy, double *y, double *dx, double *dw, double *db) {
  int64_t OH = conv_out(H, k, s, p), OW = conv_out(W, k, s, p);
  for (int64_t n = 0; n < N; n++)
    for (int64_t o = 0; o < O; o++)
      for (int64_t oy = 0; oy < OH; oy++)
        for (int64_t ox = 0; ox < OW; ox++) {
          int64_t yi = ((n * O + o) * OH + oy) * OW + ox;
          double acc = b ? b[o] : 0.0, gy = dy ? dy[yi] : 0.0;
          for (int64_t c = 0; c < C; c++)
            for (int ky = 0; ky < k; ky++)
              for (int kx = 0; kx < k; kx++) {
                int64_t iy = oy * s - p + ky, ix = ox * s - p + kx;
                if (iy < 0 || iy >= H || ix < 0 || ix >= W) continue;
                int64_t xi = ((n * C + c) * H + iy) * W + ix, wi = ((o * C + c) * k + ky) * k + kx;
                acc += x[xi] * w[wi];
                if (dy) {
                  dx[xi] += gy * w[wi];
                  dw[wi] += gy * x[xi];
                }
              }
          y[yi] = acc;
          if (dy && db) db[o] += gy;
        }
}

/* Batch norm, PyTorch semantics: training normalises with the biased batch
 * variance and moves the running statistics towards the batch mean and the
 * unbiased variance; eval normalises with the running statistics (and its
 * backward treats them as constants). */
static void ref_bn(const double *x, const double *gm, const double *bt, const double *rm0, const double *rv0, int train,
                   int64_t N, int64_t C, int64_t HW, const double *dy, double *y, double *rm1, double *rv1, double *dx,
                   double *dg, double *db) {
  double M = (double)(N * HW), mom = BN_MOMENTUM, eps = BN_EPS;
  for (int64_t c = 0; c < C; c++) {
    double mean = 0.0, var = 0.0;
    for (int64_t n = 0; n < N; n++)
      for (int64_t i = 0; i < HW; i++) mean += x[(n * C + c) * HW + i];
    mean /= M;
    for (int64_t n = 0; n < N; n++)
      for (int64_t i = 0; i < HW; i++) {
        double d = x[(n * C + c) * HW + i] - mean;
        var += d * d;
      }
    double mu, is;
    if (train) {
      mu = mean;
      is = 1.0 / sqrt(var / M + eps);
      rm1[c] = (1.0 - mom) * rm0[c] + mom * mean;
      rv1[c] = (1.0 - mom) * rv0[c] + mom * var / (M - 1.0);
    } else {
      mu = rm0[c];
      is = 1.0 / sqrt(rv0[c] + eps);
      rm1[c] = rm0[c];
      rv1[c] = rv0[c];
    }
    double sdy = 0.0, sdyx = 0.0;
    for (int64_t n = 0; n < N; n++)
      for (int64_t i = 0; i < HW; i++) {
        int64_t j = (n * C + c) * HW + i;
        double xh = (x[j] - mu) * is;
        y[j] = gm[c] * xh + bt[c];
        if (dy) {
          sdy += dy[j];
          sdyx += dy[j] * xh;
        }
      }
    if (!dy) continue;
    dg[c] = sdyx;
    db[c] = sdy;
    for (int64_t n = 0; n < N; n++)
      for (int64_t i = 0; i < HW; i++) {
        int64_t j = (n * C + c) * HW + i;
        double xh = (x[j] - mu) * is;
        dx[j] = train ? gm[c] * is / M * (M * dy[j] - sdy - xh * sdyx) : gm[c] * is * dy[j];
      }
  }
}

/* Max pooling sends the gradient to the first maximum of its window (in
 * row-major order, as PyTorch); average pooling divides by k*k always
 * (count_include_pad). */
static void ref_pool(const double *x, int64_t planes, int64_t H, int64_t W, int k, int s, int p, int is_max,
                     const double *dy, double *y, double *dx) {
  int64_t OH = conv_out(H, k, s, p), OW = conv_out(W, k, s, p);
  for (int64_t pl = 0; pl < planes; pl++)
    for (int64_t oy = 0; oy < OH; oy++)
      for (int64_t ox = 0; ox < OW; ox++) {
        int64_t yi = (pl * OH + oy) * OW + ox, best = -1;
        double acc = 0.0, bv = 0.0;
        for (int ky = 0; ky < k; ky++)
          for (int kx = 0; kx < k; kx++) {
            int64_t iy = oy * s - p + ky, ix = ox * s - p + kx;
            if (iy < 0 || iy >= H || ix < 0 || ix >= W) continue;
            int64_t xi = (pl * H + iy) * W + ix;
            if (is_max) {
              if (best < 0 || x[xi] > bv) {
                best = xi;
                bv = x[xi];
              }
            } else {
              acc += x[xi];
              if (dy) dx[xi] += dy[yi] / (double)(k * k);
            }
          }
        y[yi] = is_max ? bv : acc / (double)(k * k);
        if (is_max && dy) dx[best] += dy[yi];
      }
}

static void ref_linear(const double *x, const double *w, const double *b, int64_t N, int64_t K, int64_t M,
                       const double *dy, double *y, double *dx, double *dw, double *db) {
  for (int64_t n = 0; n < N; n++)
    for (int64_t m = 0; m < M; m++) {
      double acc = b ? b[m] : 0.0;
      for (int64_t k = 0; k < K; k++) acc += x[n * K + k] * w[m * K + k];
      y[n * M + m] = acc;
      if (!dy) continue;
      double g = dy[n * M + m];
      for (int64_t k = 0; k < K; k++) {
        dx[n * K + k] += g * w[m * K + k];
        dw[m * K + k] += g * x[n * K + k];
      }
      if (db) db[m] += g;
    }
}

/* log-softmax of each row of x (N, K) */
static void ref_log_softmax_rows(const double *x, int64_t N, int64_t K, double *lp) {
  for (int64_t n = 0; n < N; n++) {
    double mx = -INFINITY, s = 0.0;
    for (int64_t j = 0; j < K; j++) mx = fmax(mx, x[n * K + j]);
    for (int64_t j = 0; j < K; j++) s += exp(x[n * K + j] - mx);
    for (int64_t j = 0; j < K; j++) lp[n * K + j] = x[n * K + j] - mx - log(s);
  }
}

/* Mean cross entropy with PyTorch's label smoothing, and d loss / d logits
 * for d(loss) = seed. */
static double ref_ce(const double *x, const int32_t *lab, int64_t N, int64_t K, double sm, double seed, double *dx) {
  double *lp = zeros((size_t)(N * K)), total = 0.0;
  ref_log_softmax_rows(x, N, K, lp);
  for (int64_t n = 0; n < N; n++) {
    double l = -(1.0 - sm) * lp[n * K + lab[n]];
    for (int64_t j = 0; j < K; j++) l -= sm / (double)K * lp[n * K + j];
    total += l;
    if (dx)
      for (int64_t j = 0; j < K; j++)
        dx[n * K + j] = seed / (double)N * (exp(lp[n * K + j]) - (sm / (double)K + (j == lab[n] ? 1.0 - sm : 0.0)));
  }
  return total / (double)N;
}

/* ---------------- one op case in one precision ---------------- */

/* The type an op reads its floating inputs as: autocast runs conv and
 * linear in half whatever the inputs are stored as. */
static ampc_dtype eff_type(const op_case *cs, const ampc_graph_precision *pr) {
  if (pr->autocast && (cs->k == K_CONV || cs->k == K_LINEAR)) return pr->half_type;
  return AMPC_DTYPE_F32;
}

/* The type the op's output should have under pr. */
static ampc_dtype expected_out_type(const op_case *cs, const ampc_graph_precision *pr) {
  if (cs->k == K_CE) return AMPC_DTYPE_F32;
  if (cs->k == K_CAST) return cs->to;
  if (!pr->autocast) return pr->act_type;
  switch (cs->k) {
    case K_CONV:
    case K_LINEAR: return pr->half_type;
    case K_BN_TRAIN:
    case K_BN_EVAL:
    case K_GAP:
    case K_SOFTMAX:
    case K_LOG_SOFTMAX: return AMPC_DTYPE_F32;
    case K_ADD: return cs->h2_f32 ? AMPC_DTYPE_F32 : pr->act_type; /* the wider operand's type */
    default: return pr->act_type; /* keep: the input's type */
  }
}

typedef struct {
  double *y, *dh, *dh2, *dw, *db, *rm, *rv;
  size_t ny, nh, nw, nb;
} ref_result;

/* The reference forward and backward from what t holds now: stored inputs
 * and parameters, and (with_grad) the stored gradient of y. rm0/rv0 are the
 * running statistics before the forward. */
static ref_result reference(const op_case *cs, const net *t, const ampc_graph_precision *pr, int with_grad, double seed) {
  ref_result r;
  memset(&r, 0, sizeof r);
  ampc_graph *g = t->g;
  ampc_dtype eff = eff_type(cs, pr);
  int64_t N = ampc_graph_batch(g);
  ampc_tensor ht = ampc_graph_tensor(g, t->h), yt = ampc_graph_tensor(g, t->y);
  r.nh = numel_of(ht);
  r.ny = numel_of(yt);
  double *h = val_f64(g, t->h, eff);
  double *w = t->w >= 0 ? val_f64(g, t->w, eff) : NULL;
  double *b = t->b >= 0 ? val_f64(g, t->b, eff) : NULL;
  if (t->w >= 0) r.nw = numel_of(ampc_graph_tensor(g, t->w));
  if (t->b >= 0) r.nb = numel_of(ampc_graph_tensor(g, t->b));
  double *dy = with_grad && cs->k != K_CE ? grad_f64(g, t->y, AMPC_DTYPE_F32) : NULL;
  r.y = zeros(r.ny);
  if (with_grad) {
    r.dh = zeros(r.nh);
    r.dw = zeros(r.nw);
    r.db = zeros(r.nb);
  }
  switch (cs->k) {
    case K_CONV:
      ref_conv(h, w, b, N, cs->c, cs->h, cs->w, cs->o, cs->ks, cs->stride, cs->pad, dy, r.y, r.dh, r.dw, b ? r.db : NULL);
      break;
    case K_BN_TRAIN:
    case K_BN_EVAL: {
      double *rm0 = zeros((size_t)cs->c), *rv0 = zeros((size_t)cs->c);
      for (int64_t c = 0; c < cs->c; c++) {
        rm0[c] = urand(S_RM, (uint64_t)c, -0.3f, 0.3f);
        rv0[c] = urand(S_RV, (uint64_t)c, 0.5f, 1.5f);
      }
      r.rm = zeros((size_t)cs->c);
      r.rv = zeros((size_t)cs->c);
      ref_bn(h, w, b, rm0, rv0, cs->k == K_BN_TRAIN, N, cs->c, cs->h * cs->w, dy, r.y, r.rm, r.rv, r.dh, r.dw, r.db);
      break;
    }
    case K_RELU:
      for (size_t i = 0; i < r.nh; i++) {
        r.y[i] = h[i] > 0 ? h[i] : 0.0;
        if (dy) r.dh[i] = h[i] > 0 ? dy[i] : 0.0;
      }
      break;
    case K_MAXPOOL:
    case K_AVGPOOL:
      ref_pool(h, N * cs->c, cs->h, cs->w, cs->ks, cs->stride, cs->pad, cs->k == K_MAXPOOL, dy, r.y, r.dh);
      break;
    case K_GAP:
      for (int64_t pl = 0; pl < N * cs->c; pl++) {
        int64_t HW = cs->h * cs->w;
        for (int64_t i = 0; i < HW; i++) {
          r.y[pl] += h[pl * HW + i] / (double)HW;
          if (dy) r.dh[pl * HW + i] = dy[pl] / (double)HW;
        }
      }
      break;
    case K_LINEAR: ref_linear(h, w, b, N, cs->c, cs->o, dy, r.y, r.dh, r.dw, b ? r.db : NULL); break;
    case K_ADD: {
      double *h2 = val_f64(g, t->h2, AMPC_DTYPE_F32);
      if (with_grad) r.dh2 = zeros(r.nh);
      for (size_t i = 0; i < r.nh; i++) {
        r.y[i] = h[i] + h2[i];
        if (dy) r.dh[i] = r.dh2[i] = dy[i];
      }
      break;
    }
    case K_FLATTEN:
    case K_CAST:
      for (size_t i = 0; i < r.nh; i++) {
        r.y[i] = cs->k == K_CAST ? round_to(cs->to, (float)h[i]) : h[i];
        if (dy) r.dh[i] = dy[i];
      }
      break;
    case K_SOFTMAX:
    case K_LOG_SOFTMAX: {
      int64_t K = cs->c;
      ref_log_softmax_rows(h, N, K, r.y);
      for (int64_t n = 0; n < N; n++) {
        double s = 0.0;
        double *lp = r.y + n * K;
        if (cs->k == K_SOFTMAX)
          for (int64_t j = 0; j < K; j++) lp[j] = exp(lp[j]);
        if (!dy) continue;
        for (int64_t j = 0; j < K; j++) s += cs->k == K_SOFTMAX ? dy[n * K + j] * lp[j] : dy[n * K + j];
        for (int64_t j = 0; j < K; j++)
          r.dh[n * K + j] = cs->k == K_SOFTMAX ? lp[j] * (dy[n * K + j] - s) : dy[n * K + j] - exp(lp[j]) * s;
      }
      break;
    }
    case K_CE:
    {
      int32_t *lab = tmp_alloc((size_t)N * sizeof *lab);
      CHECK_OK(ampc_graph_read(g, t->labels, lab, AMPC_DTYPE_I32));
      r.y[0] = ref_ce(h, lab, N, cs->c, cs->smoothing, seed, r.dh);
    }
      break;
  }
  return r;
}

/* Copies of a tensor's stored values (at the effective batch), for later comparison. */
static float *snap_value(const net *t, ampc_value v, int grad, size_t *n) {
  if (v < 0) {
    *n = 0;
    return NULL;
  }
  *n = numel_of(grad ? ampc_graph_grad(t->g, v) : ampc_graph_tensor(t->g, v));
  return read_f32(t->g, v, grad);
}

/* Central differences of the loss w.r.t. some elements of the f32 tensor v,
 * against the analytic gradient ga (all elements). */
static void check_fd(const net *t, ampc_value v, const float *ga, const char *what, int training) {
  ampc_tensor x = ampc_graph_tensor(t->g, v);
  CHECK(x.dtype == AMPC_DTYPE_F32);
  if (x.dtype != AMPC_DTYPE_F32) return;
  float *d = val_f32(t->g, v); /* perturbed here, written back whole */
  size_t n = numel_of(x), m = n < 20 ? n : 20;
  double gmax = 0.0, emax = 0.0, fdmax = 0.0;
  for (size_t i = 0; i < n; i++) gmax = fmax(gmax, fabs(ga[i]));
  const float eps = 1e-3f;
  size_t worst = 0;
  for (size_t j = 0; j < m; j++) {
    size_t i = m == n ? j : (size_t)(ampc_rng_at(SEED, S_FD, j) % n);
    float orig = d[i];
    d[i] = orig + eps;
    CHECK_OK(ampc_graph_write(t->g, v, d, AMPC_DTYPE_F32));
    CHECK_OK(ampc_graph_forward(t->g, training));
    double lp = loss_of(t);
    d[i] = orig - eps;
    CHECK_OK(ampc_graph_write(t->g, v, d, AMPC_DTYPE_F32));
    CHECK_OK(ampc_graph_forward(t->g, training));
    double lm = loss_of(t);
    d[i] = orig;
    CHECK_OK(ampc_graph_write(t->g, v, d, AMPC_DTYPE_F32));
    double fd = (lp - lm) / (2.0 * (double)eps), e = fabs(fd - ga[i]);
    fdmax = fmax(fdmax, fabs(fd));
    if (!(e <= emax)) {
      emax = e;
      worst = i;
    }
  }
  double ne = emax / (fmax(gmax, fdmax) + 1e-30);
  CHECK_MSG(ne <= 1e-2, "%s [%s]: finite differences of %s: normalised error %.3g (element %zu: analytic %.6g)",
            ctx_case, ctx_prec, what, ne, worst, (double)ga[worst]);
}

/* ---------------- set_batch and threads ---------------- */

/* What one forward + backward produced, for comparing two graphs; only the
 * first n samples of P's gradient (the rest belong to samples not run). */
typedef struct {
  float *v[9];
  size_t n[9];
} snapshot;
static const char *const SNAP_NAMES[9] = {"y", "loss", "grad h", "grad P", "grad weight", "grad bias", "running_mean",
                                          "running_var", "grad h2"};

static snapshot take_snapshot(const net *t, const op_case *cs) {
  snapshot s;
  memset(&s, 0, sizeof s);
  s.v[0] = snap_value(t, t->y, 0, &s.n[0]);
  s.v[1] = snap_value(t, t->loss, 0, &s.n[1]);
  s.v[2] = snap_value(t, t->h, 1, &s.n[2]);
  s.v[3] = snap_value(t, t->p, 1, &s.n[3]);
  s.n[3] = (size_t)(ampc_graph_batch(t->g) * per_sample(cs));
  s.v[4] = snap_value(t, t->w, 1, &s.n[4]);
  s.v[5] = snap_value(t, t->b, 1, &s.n[5]);
  s.v[6] = snap_value(t, t->rm, 0, &s.n[6]);
  s.v[7] = snap_value(t, t->rv, 0, &s.n[7]);
  s.v[8] = snap_value(t, t->h2, 1, &s.n[8]);
  return s;
}

static void compare_snapshots(const snapshot *a, const snapshot *b, double tol, const char *what) {
  for (int i = 0; i < 9; i++) {
    CHECK_MSG(a->n[i] == b->n[i], "%s [%s]: %s: %s has %zu vs %zu elements", ctx_case, ctx_prec, what, SNAP_NAMES[i],
              a->n[i], b->n[i]);
    if (a->n[i] != b->n[i] || !a->n[i]) continue;
    double *ref = zeros(b->n[i]);
    for (size_t k = 0; k < b->n[i]; k++) ref[k] = b->v[i][k];
    double e = nerr(a->v[i], ref, a->n[i]);
    CHECK_MSG(e <= tol, "%s [%s]: %s: %s differs, normalised error %.3g > %.3g", ctx_case, ctx_prec, what,
              SNAP_NAMES[i], e, tol);
  }
}

static double prec_tol(const ampc_graph_precision *p) {
  double t = tol_max(tol_of(p->act_type), tol_of(p->param_type));
  return p->autocast ? tol_max(t, tol_of(p->half_type)) : t;
}

#endif
