/* Every graph op on the CPU backend, in every storage type, against naive
 * fp64 references written here.
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
 * no head: the op is the loss.
 *
 * Checks, for each op case and each precision (f32, f16, bf16, and O1
 * autocast with f32 parameters and f16 activations):
 *  - forward against the fp64 reference computed from the values ampc stored
 *    (h and parameters after rounding to their storage type, and to the half
 *    type where autocast runs the op in half), with the normalised error
 *    max|got - ref| / max|ref| within a tolerance of the output's type;
 *  - backward against the fp64 reference backward fed with the output
 *    gradient ampc stored (grad(y)), so each op is checked on its own;
 *  - in f32, the gradients of P and of the op's parameters against central
 *    finite differences of the loss (the whole chain, ampc's own forward);
 *  - the effective batch (set_batch) against a graph built for that batch,
 *    and 1 thread against 2.
 * Further cases: values with several consumers, the accumulate flag, loss
 * seeds, batch-norm running statistics, label range, recording errors.
 */
#include <math.h>
#include <stdint.h>

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

/* A tensor's stored values as f32. */
static float *get_f32(ampc_tensor t) {
  size_t n = numel_of(t);
  float *f = tmp_alloc(n * sizeof *f);
  if (t.data) ampc_load_f32(f, t.dtype, t.data, n);
  return f;
}
/* The same as fp64, rounded on to `eff` (the type an op computes from). */
static double *get_f64(ampc_tensor t, ampc_dtype eff) {
  size_t n = numel_of(t);
  float *f = get_f32(t);
  double *d = tmp_alloc(n * sizeof *d);
  for (size_t i = 0; i < n; i++) d[i] = round_to(eff, f[i]);
  return d;
}
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
    {"f32", {AMPC_DTYPE_F32, AMPC_DTYPE_F32, AMPC_DTYPE_F32, 0, AMPC_DTYPE_F16}},
    {"f16", {AMPC_DTYPE_F16, AMPC_DTYPE_F16, AMPC_DTYPE_F16, 0, AMPC_DTYPE_F16}},
    {"bf16", {AMPC_DTYPE_BF16, AMPC_DTYPE_BF16, AMPC_DTYPE_BF16, 0, AMPC_DTYPE_BF16}},
    /* apex O1: fp32 parameters, half activations, per-op casts */
    {"o1-f16", {AMPC_DTYPE_F32, AMPC_DTYPE_F32, AMPC_DTYPE_F16, 1, AMPC_DTYPE_F16}},
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
    {.name = "bn_train", .k = K_BN_TRAIN, .n = 3, .c = 3, .h = 5, .w = 5},
    {.name = "bn_train_odd", .k = K_BN_TRAIN, .n = 2, .c = 4, .h = 3, .w = 7},
    {.name = "bn_eval", .k = K_BN_EVAL, .n = 2, .c = 3, .h = 5, .w = 6},
    /* channels of more than 2^16 values (backward keeps dy but not x between
     * its passes) and of more than 2^18 (neither) */
    {.name = "bn_train_big", .k = K_BN_TRAIN, .n = 2, .c = 2, .h = 200, .w = 201},
    {.name = "bn_train_huge", .k = K_BN_TRAIN, .n = 2, .c = 1, .h = 370, .w = 372},
    {.name = "relu", .k = K_RELU, .n = 2, .c = 3, .h = 5, .w = 5},
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
    {.name = "add", .k = K_ADD, .n = 2, .c = 3, .h = 5, .w = 5},
    {.name = "add_f32_operand", .k = K_ADD, .n = 3, .c = 2, .h = 3, .w = 5, .h2_f32 = 1},
    {.name = "flatten", .k = K_FLATTEN, .n = 2, .c = 3, .h = 5, .w = 5},
    {.name = "softmax", .k = K_SOFTMAX, .n = 3, .c = 7},
    {.name = "log_softmax", .k = K_LOG_SOFTMAX, .n = 3, .c = 7},
    {.name = "cross_entropy", .k = K_CE, .n = 4, .c = 6},
    {.name = "cross_entropy_ls0.1", .k = K_CE, .n = 3, .c = 5, .smoothing = 0.1f},
    {.name = "cast_f32", .k = K_CAST, .n = 2, .c = 3, .h = 5, .w = 5, .to = AMPC_DTYPE_F32},
    {.name = "cast_f16", .k = K_CAST, .n = 2, .c = 3, .h = 5, .w = 5, .to = AMPC_DTYPE_F16},
    {.name = "cast_bf16", .k = K_CAST, .n = 2, .c = 3, .h = 5, .w = 5, .to = AMPC_DTYPE_BF16},
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
  ampc_tensor tx = ampc_graph_tensor(t->g, v);
  size_t n = numel_of(tx);
  ampc_store_f32(tx.dtype, tx.data, rand_vec(stream, n, lo, hi), n);
}

/* The convolution algorithm graphs are built with, and the Winograd chunk
 * size (tiles; 0 = the library's choice), a hook of the CPU backend. */
static ampc_conv_algo test_conv_algo = AMPC_CONV_AUTO;
extern int64_t ampc__cpu_wino_tile_target;
/* Winograd's tile where everything is f32 (0: the library's choice, F(2x2);
 * 4: F(4x4), the tile of 16-bit storage), a hook of the CPU backend. */
extern int ampc__cpu_wino_f32_tile;

/* Records the op graph for batch n, compiles it with precision pr and fills
 * the inputs. threads > 0 is set before compile. Returns 0 when it worked. */
static int build(net *t, const op_case *cs, const ampc_graph_precision *pr, int64_t n, int threads) {
  memset(t, 0, sizeof *t);
  t->n = n;
  t->w = t->b = t->rm = t->rv = t->nbt = t->x2 = t->p2 = t->h2 = t->head = AMPC_VALUE_NONE;
  CHECK_OK(ampc_graph_create(&t->g));
  if (!t->g) return -1;
  ampc_graph *g = t->g;
  if (threads > 0) ampc_graph_set_threads(g, threads);
  CHECK_OK(ampc_graph_set_conv_algo(g, test_conv_algo));
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
  ampc_status s = ampc_graph_compile(g);
  CHECK_OK(s);
  if (s < 0) return -1;
  /* the inputs spread a little wider than P, so h covers about [-1.5, 1.5] */
  fill_input(t, t->x, S_X, -1.0f, 1.0f);
  if (t->x2 >= 0) fill_input(t, t->x2, S_X2, -1.0f, 1.0f);
  ampc_tensor lt = ampc_graph_tensor(g, t->labels);
  for (int64_t i = 0; i < n; i++) ((int32_t *)lt.data)[i] = (int32_t)(ampc_rng_at(SEED, S_LABELS, (uint64_t)i) % (uint64_t)t->classes);
  return 0;
}

static float loss_of(const net *t) {
  float l = NAN;
  ampc_tensor lt = ampc_graph_tensor(t->g, t->loss);
  ampc_load_f32(&l, lt.dtype, lt.data, 1);
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
  double *h = get_f64(ht, eff);
  double *w = t->w >= 0 ? get_f64(ampc_graph_tensor(g, t->w), eff) : NULL;
  double *b = t->b >= 0 ? get_f64(ampc_graph_tensor(g, t->b), eff) : NULL;
  if (t->w >= 0) r.nw = numel_of(ampc_graph_tensor(g, t->w));
  if (t->b >= 0) r.nb = numel_of(ampc_graph_tensor(g, t->b));
  double *dy = with_grad && cs->k != K_CE ? get_f64(ampc_graph_grad(g, t->y), AMPC_DTYPE_F32) : NULL;
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
      double *h2 = get_f64(ampc_graph_tensor(g, t->h2), AMPC_DTYPE_F32);
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
      r.y[0] = ref_ce(h, ampc_graph_tensor(g, t->labels).data, N, cs->c, cs->smoothing, seed, r.dh);
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
  ampc_tensor x = grad ? ampc_graph_grad(t->g, v) : ampc_graph_tensor(t->g, v);
  *n = numel_of(x);
  return get_f32(x);
}

/* Central differences of the loss w.r.t. some elements of the f32 tensor v,
 * against the analytic gradient ga (all elements). */
static void check_fd(const net *t, ampc_value v, const float *ga, const char *what, int training) {
  ampc_tensor x = ampc_graph_tensor(t->g, v);
  CHECK(x.dtype == AMPC_DTYPE_F32);
  if (x.dtype != AMPC_DTYPE_F32) return;
  float *d = x.data;
  size_t n = numel_of(x), m = n < 20 ? n : 20;
  double gmax = 0.0, emax = 0.0, fdmax = 0.0;
  for (size_t i = 0; i < n; i++) gmax = fmax(gmax, fabs(ga[i]));
  const float eps = 1e-3f;
  size_t worst = 0;
  for (size_t j = 0; j < m; j++) {
    size_t i = m == n ? j : (size_t)(ampc_rng_at(SEED, S_FD, j) % n);
    float orig = d[i];
    d[i] = orig + eps;
    CHECK_OK(ampc_graph_forward(t->g, training));
    double lp = loss_of(t);
    d[i] = orig - eps;
    CHECK_OK(ampc_graph_forward(t->g, training));
    double lm = loss_of(t);
    d[i] = orig;
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

static void run_case(const op_case *cs, const prec_case *pc) {
  const ampc_graph_precision *pr = &pc->p;
  ctx_case = cs->name;
  ctx_prec = pc->name;
  net t;
  if (build(&t, cs, pr, cs->n, 0) < 0) {
    ampc_graph_free(t.g);
    tmp_free_all();
    return;
  }
  ampc_graph *g = t.g;
  int training = training_of(cs);
  ampc_tensor yt = ampc_graph_tensor(g, t.y);
  ampc_dtype yd = expected_out_type(cs, pr);
  CHECK_MSG(yt.dtype == yd, "%s [%s]: output stored as %s, expected %s", cs->name, pc->name, ampc_dtype_name(yt.dtype),
            ampc_dtype_name(yd));
  CHECK_MSG(ampc_graph_tensor(g, t.h).dtype == pr->act_type, "%s [%s]: h stored as %s", cs->name, pc->name,
            ampc_dtype_name(ampc_graph_tensor(g, t.h).dtype));

  if (cs->k == K_FLATTEN) { /* a view of h: (N, C*H*W) over the same memory */
    CHECK(yt.shape.ndim == 2 && yt.shape.d[0] == cs->n && yt.shape.d[1] == per_sample(cs));
    CHECK(yt.data == ampc_graph_tensor(g, t.h).data && ampc_graph_grad(g, t.y).data == ampc_graph_grad(g, t.h).data);
  }
  CHECK_OK(ampc_graph_forward(g, training));
  ref_result rf = reference(cs, &t, pr, 0, 1.0);
  double tf = tol_of(yt.dtype);
  check_close("forward", get_f32(yt), rf.y, rf.ny, tf);
  if (is_bn(cs)) {
    check_close("running_mean", get_f32(ampc_graph_tensor(g, t.rm)), rf.rm, (size_t)cs->c, 1e-5);
    check_close("running_var", get_f32(ampc_graph_tensor(g, t.rv)), rf.rv, (size_t)cs->c, 1e-5);
    int64_t nbt = *(int64_t *)ampc_graph_tensor(g, t.nbt).data;
    CHECK_MSG(nbt == (training ? 1 : 0), "%s [%s]: num_batches_tracked %lld", cs->name, pc->name, (long long)nbt);
  }

  CHECK_OK(ampc_graph_backward(g, t.loss, 1.0f, 0));
  ref_result rb = reference(cs, &t, pr, 1, 1.0);
  ampc_tensor dht = ampc_graph_grad(g, t.h);
  CHECK(dht.data != NULL);
  float *dh = get_f32(dht);
  check_close("grad h", dh, rb.dh, rb.nh, tol_max(tol_of(dht.dtype), tf));
  /* the gradient of h reaches P through cast and add unchanged */
  float *dp = get_f32(ampc_graph_grad(g, t.p));
  size_t same = 0;
  for (size_t i = 0; i < rb.nh; i++) same += dp[i] == dh[i];
  CHECK_MSG(same == rb.nh, "%s [%s]: grad P differs from grad h in %zu of %zu", cs->name, pc->name, rb.nh - same, rb.nh);
  float *dw = NULL, *db = NULL, *dp2 = NULL;
  if (t.w >= 0) {
    ampc_tensor gt = ampc_graph_grad(g, t.w);
    dw = get_f32(gt);
    check_close(is_bn(cs) ? "grad gamma" : "grad weight", dw, rb.dw, rb.nw, tol_max(tol_of(gt.dtype), tf));
  }
  if (t.b >= 0) {
    ampc_tensor gt = ampc_graph_grad(g, t.b);
    db = get_f32(gt);
    check_close(is_bn(cs) ? "grad beta" : "grad bias", db, rb.db, rb.nb, tol_max(tol_of(gt.dtype), tf));
  }
  if (t.h2 >= 0) {
    ampc_tensor gt = ampc_graph_grad(g, t.h2);
    check_close("grad h2", get_f32(gt), rb.dh2, rb.nh, tol_max(tol_of(gt.dtype), tf));
    dp2 = get_f32(ampc_graph_grad(g, t.p2));
  }

  /* finite differences need a smooth loss: not in half precision, and not
   * through a cast to half (a staircase whose derivative is taken as 1);
   * and one of few terms: over 10^5 of them an f32 loss moves by its own
   * rounding as much as by the step (big cases have the fp64 reference) */
  int smooth = !(cs->k == K_CAST && cs->to != AMPC_DTYPE_F32) && numel_of(yt) <= 100000;
  if (pr->act_type == AMPC_DTYPE_F32 && pr->param_type == AMPC_DTYPE_F32 && smooth) {
    check_fd(&t, t.p, dp, "P", training);
    if (dw) check_fd(&t, t.w, dw, is_bn(cs) ? "gamma" : "weight", training);
    if (db) check_fd(&t, t.b, db, is_bn(cs) ? "beta" : "bias", training);
    if (dp2) check_fd(&t, t.p2, dp2, "P2", training);
  }
  ampc_graph_free(g);
  tmp_free_all();
}

static void run_kind(kind k) {
  int n = 0;
  for (int i = 0; i < NCASES; i++)
    if (CASES[i].k == k) {
      for (int p = 0; p < NPRECS; p++) run_case(&CASES[i], &PRECS[p]);
      n++;
    }
  CHECK(n > 0);
}

TEST(conv2d) { run_kind(K_CONV); }
/* Every case again with the plain im2col path forced, and with Winograd
 * forced wherever it applies (stride 1, 3x3): with the default chunks, with
 * chunks that cut a sample into bands of tile rows, and with chunks of
 * several samples; in f32 with both tiles, F(2x2) (the default there) and
 * F(4x4) (the one of 16-bit storage). */
TEST(conv2d_im2col) {
  test_conv_algo = AMPC_CONV_IM2COL;
  run_kind(K_CONV);
  test_conv_algo = AMPC_CONV_AUTO;
}
TEST(conv2d_winograd) {
  static const int64_t targets[] = {0, 5, 20};
  test_conv_algo = AMPC_CONV_WINOGRAD;
  for (int t = 0; t < 2; t++) {
    ampc__cpu_wino_f32_tile = t ? 4 : 0;
    for (int i = 0; i < 3; i++) {
      ampc__cpu_wino_tile_target = targets[i];
      run_kind(K_CONV);
    }
  }
  ampc__cpu_wino_tile_target = 0;
  ampc__cpu_wino_f32_tile = 0;
  test_conv_algo = AMPC_CONV_AUTO;
}
/* and the direct loop forced wherever it applies (stride 1, 3x3) */
TEST(conv2d_direct) {
  test_conv_algo = AMPC_CONV_DIRECT;
  run_kind(K_CONV);
  test_conv_algo = AMPC_CONV_AUTO;
}
TEST(batchnorm2d_train) { run_kind(K_BN_TRAIN); }
/* PyTorch's eval-mode batch norm is differentiable with the running
 * statistics as constants: dx = dy * gamma / sqrt(running_var + eps). */
TEST(batchnorm2d_eval) { run_kind(K_BN_EVAL); }
TEST(relu) { run_kind(K_RELU); }
TEST(maxpool2d) { run_kind(K_MAXPOOL); }
TEST(avgpool2d) { run_kind(K_AVGPOOL); }
TEST(global_avgpool) { run_kind(K_GAP); }
TEST(linear) { run_kind(K_LINEAR); }
TEST(add) { run_kind(K_ADD); }
TEST(flatten) { run_kind(K_FLATTEN); }
TEST(softmax) { run_kind(K_SOFTMAX); }
TEST(log_softmax) { run_kind(K_LOG_SOFTMAX); }
TEST(cross_entropy) { run_kind(K_CE); }
TEST(cast) { run_kind(K_CAST); }

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

/* A graph built for batch n+1 and run at effective batch n equals a graph
 * built for batch n (the data of the first n samples being the same). */
TEST(set_batch_matches_smaller_graph) {
  for (int i = 0; i < NCASES; i++)
    for (int p = 0; p < NPRECS; p++) {
      const op_case *cs = &CASES[i];
      ctx_case = cs->name;
      ctx_prec = PRECS[p].name;
      int64_t n = cs->n - 1 >= 2 ? cs->n - 1 : 2, big = n + 1;
      net a = {0}, b = {0};
      int ok = build(&a, cs, &PRECS[p].p, big, 0) == 0 && build(&b, cs, &PRECS[p].p, n, 0) == 0;
      if (ok) {
        CHECK_OK(ampc_graph_set_batch(a.g, n));
        CHECK(ampc_graph_batch(a.g) == n && ampc_graph_max_batch(a.g) == big);
        CHECK(ampc_graph_tensor(a.g, a.y).shape.d[0] == (cs->k == K_CE ? 1 : n));
        for (int r = 0; r < 2; r++) {
          net *t = r ? &b : &a;
          CHECK_OK(ampc_graph_forward(t->g, training_of(cs)));
          CHECK_OK(ampc_graph_backward(t->g, t->loss, 1.0f, 0));
        }
        snapshot sa = take_snapshot(&a, cs), sb = take_snapshot(&b, cs);
        compare_snapshots(&sa, &sb, prec_tol(&PRECS[p].p), "set_batch");
        /* back at the full batch, the graph runs the full batch again */
        CHECK_OK(ampc_graph_set_batch(a.g, big));
        CHECK_OK(ampc_graph_forward(a.g, training_of(cs)));
        CHECK(isfinite(loss_of(&a)));
      }
      ampc_graph_free(a.g);
      ampc_graph_free(b.g);
      tmp_free_all();
    }
}

TEST(set_batch_range) {
  net t;
  ctx_case = "set_batch_range";
  if (build(&t, find_case("conv3x3_s2_p1"), &PRECS[0].p, 3, 0) == 0) {
    CHECK_ERR(ampc_graph_set_batch(t.g, 0), AMPC_EINVAL, "batch");
    CHECK_ERR(ampc_graph_set_batch(t.g, 4), AMPC_EINVAL, "batch");
    CHECK(ampc_graph_batch(t.g) == 3);
  }
  ampc_graph_free(t.g);
  tmp_free_all();
}

/* One thread and two give the same results (within f32 rounding: the
 * convolution cuts its batch into chunks by thread count). */
TEST(thread_counts_agree) {
  for (int i = 0; i < NCASES; i++)
    for (int p = 0; p < NPRECS; p++) {
      const op_case *cs = &CASES[i];
      ctx_case = cs->name;
      ctx_prec = PRECS[p].name;
      net a = {0}, b = {0};
      int ok = build(&a, cs, &PRECS[p].p, cs->n, 1) == 0 && build(&b, cs, &PRECS[p].p, cs->n, 2) == 0;
      if (ok) {
        for (int r = 0; r < 2; r++) {
          net *t = r ? &b : &a;
          CHECK_OK(ampc_graph_forward(t->g, training_of(cs)));
          CHECK_OK(ampc_graph_backward(t->g, t->loss, 1.0f, 0));
        }
        snapshot sa = take_snapshot(&a, cs), sb = take_snapshot(&b, cs);
        compare_snapshots(&sa, &sb, prec_tol(&PRECS[p].p), "1 vs 2 threads");
      }
      ampc_graph_free(a.g);
      ampc_graph_free(b.g);
      tmp_free_all();
    }
}

/* Winograd's results are the same bits for any thread count, whether the
 * threads share each chunk (few chunks) or take whole chunks each (many). */
TEST(winograd_same_bits_any_threads) {
  static const char *names[] = {"conv3x3_16x16", "conv3x3_24ch"};
  static const int64_t targets[] = {0, 5};
  test_conv_algo = AMPC_CONV_WINOGRAD;
  for (int i = 0; i < 2; i++)
    for (int t = 0; t < 2; t++)
      for (int p = 0; p < NPRECS; p++) {
        const op_case *cs = find_case(names[i]);
        ctx_case = cs->name;
        ctx_prec = PRECS[p].name;
        ampc__cpu_wino_tile_target = targets[t];
        net a = {0}, b = {0};
        for (int nt = 2; nt <= 3; nt++)
          if (build(&a, cs, &PRECS[p].p, cs->n, 1) == 0 && build(&b, cs, &PRECS[p].p, cs->n, nt) == 0) {
            for (int r = 0; r < 2; r++) {
              net *q = r ? &b : &a;
              CHECK_OK(ampc_graph_forward(q->g, 1));
              CHECK_OK(ampc_graph_backward(q->g, q->loss, 1.0f, 0));
            }
            snapshot sa = take_snapshot(&a, cs), sb = take_snapshot(&b, cs);
            compare_snapshots(&sa, &sb, 0.0, "1 thread vs several, bit for bit");
            ampc_graph_free(a.g);
            ampc_graph_free(b.g);
            tmp_free_all();
          }
      }
  ampc__cpu_wino_tile_target = 0;
  test_conv_algo = AMPC_CONV_AUTO;
}

/* Raising the thread count after compile is safe: the kernels would need
 * more per-thread workspace than was planned at compile time, so the graph
 * keeps within the compiled count (it clamps), and results stay right. */
TEST(threads_raised_after_compile) {
  const op_case *cs = find_case("conv3x3_16x16");
  ctx_case = "threads_raised_after_compile";
  ctx_prec = "f32";
  net a = {0}, b = {0};
  if (build(&a, cs, &PRECS[0].p, cs->n, 1) == 0 && build(&b, cs, &PRECS[0].p, cs->n, 4) == 0) {
    ampc_graph_set_threads(a.g, 4);
    for (int r = 0; r < 2; r++) {
      net *t = r ? &b : &a;
      CHECK_OK(ampc_graph_forward(t->g, 1));
      CHECK_OK(ampc_graph_backward(t->g, t->loss, 1.0f, 0));
    }
    snapshot sa = take_snapshot(&a, cs), sb = take_snapshot(&b, cs);
    compare_snapshots(&sa, &sb, 1e-5, "threads 1 -> 4 after compile");
  }
  ampc_graph_free(a.g);
  ampc_graph_free(b.g);
  tmp_free_all();
}

/* Lowering the thread count after compile is safe too: each thread then
 * takes a larger share (the convolution a larger group of samples), which the
 * workspace planned at compile holds. Every case, compiled for 3 threads, run
 * on 2 and on 1, against a 1-thread graph. */
TEST(threads_lowered_after_compile) {
  for (int i = 0; i < NCASES; i++) {
    const op_case *cs = &CASES[i];
    ctx_case = cs->name;
    ctx_prec = "f32";
    net a = {0}, b = {0};
    if (build(&a, cs, &PRECS[0].p, cs->n, 3) == 0 && build(&b, cs, &PRECS[0].p, cs->n, 1) == 0) {
      for (int nt = 2; nt >= 1; nt--) {
        ampc_graph_set_threads(a.g, nt);
        for (int r = 0; r < 2; r++) {
          net *t = r ? &b : &a;
          CHECK_OK(ampc_graph_forward(t->g, training_of(cs)));
          CHECK_OK(ampc_graph_backward(t->g, t->loss, 1.0f, 0));
        }
        snapshot sa = take_snapshot(&a, cs), sb = take_snapshot(&b, cs);
        compare_snapshots(&sa, &sb, 1e-5, nt == 2 ? "threads 3 -> 2 after compile" : "threads 3 -> 1 after compile");
      }
    }
    ampc_graph_free(a.g);
    ampc_graph_free(b.g);
    tmp_free_all();
  }
}

/* ---------------- several consumers, accumulation, seeds ---------------- */

/* y = add(h, h): h gets both gradients (2 dy); y = add(relu(h), h) (a
 * residual): h gets dy * (h > 0) + dy. */
TEST(value_used_twice) {
  for (int p = 0; p < NPRECS; p++) {
    const ampc_graph_precision *pr = &PRECS[p].p;
    ctx_prec = PRECS[p].name;
    for (int residual = 0; residual < 2; residual++) {
      ctx_case = residual ? "add(relu(h), h)" : "add(h, h)";
      ampc_graph *g;
      CHECK_OK(ampc_graph_create(&g));
      ampc_shape s = ampc_shape4(2, 3, 5, 5);
      ampc_value x, P;
      ampc_value h = op_input(g, "x", "P", s, S_P, pr->act_type, &x, &P);
      ampc_value lab = ampc_graph_labels(g, "y", 2);
      ampc_value y = ampc_graph_add(g, residual ? ampc_graph_relu(g, h) : h, h);
      ampc_value f = ampc_graph_flatten(g, y);
      ampc_value hw = ampc_graph_param(g, "head.weight", ampc_shape2(3, 75), 0, rand_vec(S_HEAD, 225, -0.2f, 0.2f));
      ampc_value loss = ampc_graph_cross_entropy(g, ampc_graph_linear(g, f, hw, AMPC_VALUE_NONE), lab, 0.0f);
      CHECK_OK(ampc_graph_set_precision(g, pr));
      ampc_graph_set_retain_grads(g, 1); /* the checks read activation gradients */
      CHECK_OK(ampc_graph_compile(g));
      if (ampc_graph_is_compiled(g)) {
        ampc_tensor xt = ampc_graph_tensor(g, x);
        ampc_store_f32(xt.dtype, xt.data, rand_vec(S_X, 150, -1.0f, 1.0f), 150);
        int32_t *l = ampc_graph_tensor(g, lab).data;
        l[0] = 1;
        l[1] = 2;
        CHECK_OK(ampc_graph_forward(g, 1));
        CHECK_OK(ampc_graph_backward(g, loss, 1.0f, 0));
        double *hv = get_f64(ampc_graph_tensor(g, h), AMPC_DTYPE_F32);
        double *dy = get_f64(ampc_graph_grad(g, y), AMPC_DTYPE_F32), *ref = zeros(150), *yr = zeros(150);
        for (int i = 0; i < 150; i++) {
          ref[i] = dy[i] * (residual ? (hv[i] > 0 ? 2.0 : 1.0) : 2.0);
          yr[i] = (residual ? (hv[i] > 0 ? hv[i] : 0.0) : hv[i]) + hv[i];
        }
        ampc_tensor yt = ampc_graph_tensor(g, y), dht = ampc_graph_grad(g, h);
        check_close("forward", get_f32(yt), yr, 150, tol_of(yt.dtype));
        check_close("grad h", get_f32(dht), ref, 150, tol_of(dht.dtype));
        check_close("grad P", get_f32(ampc_graph_grad(g, P)), ref, 150, tol_of(dht.dtype));
      }
      ampc_graph_free(g);
      tmp_free_all();
    }
  }
}

/* One weight used by two convolutions gets the sum of both gradients; with
 * accumulate = 1 a second backward adds to the first; zero_grad clears. */
TEST(shared_weight_and_accumulate) {
  for (int p = 0; p < NPRECS; p++) {
    const ampc_graph_precision *pr = &PRECS[p].p;
    ctx_prec = PRECS[p].name;
    ctx_case = "shared conv weight";
    ampc_graph *g;
    CHECK_OK(ampc_graph_create(&g));
    ampc_value x, P;
    ampc_value h = op_input(g, "x", "P", ampc_shape4(2, 2, 5, 5), S_P, pr->act_type, &x, &P);
    ampc_value lab = ampc_graph_labels(g, "y", 2);
    ampc_value w = ampc_graph_param(g, "w", ampc_shape4(3, 2, 3, 3), 0, rand_vec(S_W, 54, -0.4f, 0.4f));
    ampc_value b = ampc_graph_param(g, "b", ampc_shape1(3), 0, rand_vec(S_B, 3, -0.5f, 0.5f));
    ampc_value c1 = ampc_graph_conv2d(g, h, w, b, 1, 1), c2 = ampc_graph_conv2d(g, h, w, b, 1, 1);
    ampc_value y = ampc_graph_add(g, c1, c2);
    ampc_value f = ampc_graph_flatten(g, y);
    ampc_value hw = ampc_graph_param(g, "head.weight", ampc_shape2(3, 75), 0, rand_vec(S_HEAD, 225, -0.2f, 0.2f));
    ampc_value loss = ampc_graph_cross_entropy(g, ampc_graph_linear(g, f, hw, AMPC_VALUE_NONE), lab, 0.0f);
    CHECK_OK(ampc_graph_set_precision(g, pr));
    ampc_graph_set_retain_grads(g, 1); /* the checks read activation gradients */
    CHECK_OK(ampc_graph_compile(g));
    if (ampc_graph_is_compiled(g)) {
      ampc_tensor xt = ampc_graph_tensor(g, x);
      ampc_store_f32(xt.dtype, xt.data, rand_vec(S_X, 100, -1.0f, 1.0f), 100);
      int32_t *l = ampc_graph_tensor(g, lab).data;
      l[0] = 0;
      l[1] = 2;
      CHECK_OK(ampc_graph_forward(g, 1));
      CHECK_OK(ampc_graph_backward(g, loss, 1.0f, 0));
      ampc_dtype eff = pr->autocast ? pr->half_type : AMPC_DTYPE_F32;
      double *hv = get_f64(ampc_graph_tensor(g, h), eff), *wv = get_f64(ampc_graph_tensor(g, w), eff);
      double *bv = get_f64(ampc_graph_tensor(g, b), eff);
      /* both convolutions see the same dy (that of y), so each gradient is twice one conv's */
      double *dy = get_f64(ampc_graph_grad(g, y), AMPC_DTYPE_F32);
      double *yr = zeros(150), *dh = zeros(100), *dw = zeros(54), *db = zeros(3);
      ref_conv(hv, wv, bv, 2, 2, 5, 5, 3, 3, 1, 1, dy, yr, dh, dw, db);
      for (int i = 0; i < 100; i++) dh[i] *= 2;
      for (int i = 0; i < 54; i++) dw[i] *= 2;
      for (int i = 0; i < 3; i++) db[i] *= 2;
      ampc_tensor gw = ampc_graph_grad(g, w), yt = ampc_graph_tensor(g, y);
      double tol = prec_tol(pr);
      for (int i = 0; i < 150; i++) yr[i] *= 2;
      check_close("forward", get_f32(yt), yr, 150, tol_of(yt.dtype));
      check_close("grad h", get_f32(ampc_graph_grad(g, h)), dh, 100, tol);
      check_close("grad w", get_f32(gw), dw, 54, tol);
      check_close("grad b", get_f32(ampc_graph_grad(g, b)), db, 3, tol);
      float *w1 = get_f32(gw), *p1 = get_f32(ampc_graph_grad(g, P)), *h1 = get_f32(ampc_graph_grad(g, h));

      /* accumulate = 1: parameter gradients add, activation gradients do
       * not. P has one writer, so its old and new gradient are the same
       * number and the sum is exact in any type; w gets its two convolutions'
       * gradients added one at a time, rounded to its type after each. */
      CHECK_OK(ampc_graph_forward(g, 1));
      CHECK_OK(ampc_graph_backward(g, loss, 1.0f, 1));
      double *w2 = zeros(54), *p2 = zeros(100), *h2 = zeros(100);
      for (int i = 0; i < 54; i++) w2[i] = 2.0 * (double)w1[i];
      for (int i = 0; i < 100; i++) {
        p2[i] = 2.0 * (double)p1[i];
        h2[i] = h1[i];
      }
      ctx_case = "accumulate=1";
      check_close("grad w", get_f32(gw), w2, 54, tol_of(gw.dtype));
      check_close("grad P", get_f32(ampc_graph_grad(g, P)), p2, 100, 0.0);
      check_close("grad h", get_f32(ampc_graph_grad(g, h)), h2, 100, 0.0);

      /* zero_grad, then accumulate = 1 gives one backward's gradient */
      ampc_graph_zero_grad(g);
      float *z = get_f32(gw);
      int zero = 1;
      for (int i = 0; i < 54; i++) zero &= z[i] == 0.0f;
      CHECK(zero);
      CHECK_OK(ampc_graph_forward(g, 1));
      CHECK_OK(ampc_graph_backward(g, loss, 1.0f, 1));
      double *w1d = zeros(54);
      for (int i = 0; i < 54; i++) w1d[i] = w1[i];
      ctx_case = "zero_grad + accumulate=1";
      check_close("grad w", get_f32(gw), w1d, 54, 0.0);

      /* accumulate = 0 overwrites again */
      CHECK_OK(ampc_graph_backward(g, loss, 1.0f, 0));
      ctx_case = "accumulate=0 after accumulate=1";
      check_close("grad w", get_f32(gw), w1d, 54, 0.0);
    }
    ampc_graph_free(g);
    tmp_free_all();
  }
}

/* The seed is d(loss), the loss scale: a power of two scales every gradient
 * exactly. */
TEST(backward_seed_scales_gradients) {
  for (int p = 0; p < NPRECS; p++) {
    ctx_prec = PRECS[p].name;
    ctx_case = "seed 8";
    net t;
    if (build(&t, find_case("conv3x3_s1_p1_bias"), &PRECS[p].p, 2, 0) == 0) {
      CHECK_OK(ampc_graph_forward(t.g, 1));
      CHECK_OK(ampc_graph_backward(t.g, t.loss, 1.0f, 0));
      float *w1 = get_f32(ampc_graph_grad(t.g, t.w)), *p1 = get_f32(ampc_graph_grad(t.g, t.p));
      CHECK_OK(ampc_graph_backward(t.g, t.loss, 8.0f, 0));
      float *w8 = get_f32(ampc_graph_grad(t.g, t.w)), *p8 = get_f32(ampc_graph_grad(t.g, t.p));
      size_t nw = numel_of(ampc_graph_grad(t.g, t.w)), np = numel_of(ampc_graph_grad(t.g, t.p)), bad = 0;
      for (size_t i = 0; i < nw; i++) bad += w8[i] != 8.0f * w1[i];
      for (size_t i = 0; i < np; i++) bad += p8[i] != 8.0f * p1[i];
      CHECK_MSG(bad == 0, "[%s]: %zu gradients not exactly 8x", ctx_prec, bad);
    }
    ampc_graph_free(t.g);
    tmp_free_all();
  }
}

/* ---------------- batch norm state ---------------- */

/* Two training forwards move the running statistics twice (momentum 0.1,
 * unbiased variance) and count two batches; an eval forward changes nothing. */
TEST(batchnorm_running_stats) {
  const op_case *cs = find_case("bn_train");
  ctx_case = "bn running stats";
  ctx_prec = "f32";
  CHECK(cs->k == K_BN_TRAIN);
  net t;
  if (build(&t, cs, &PRECS[0].p, cs->n, 0) == 0) {
    int64_t C = cs->c, HW = cs->h * cs->w, N = cs->n;
    double rm[8], rv[8];
    for (int64_t c = 0; c < C; c++) {
      rm[c] = urand(S_RM, (uint64_t)c, -0.3f, 0.3f);
      rv[c] = urand(S_RV, (uint64_t)c, 0.5f, 1.5f);
    }
    CHECK_OK(ampc_graph_forward(t.g, 1));
    double *x = get_f64(ampc_graph_tensor(t.g, t.h), AMPC_DTYPE_F32); /* h is made by the forward */
    CHECK_OK(ampc_graph_forward(t.g, 1));
    for (int64_t c = 0; c < C; c++) {
      double m = 0, v = 0;
      for (int64_t n = 0; n < N; n++)
        for (int64_t i = 0; i < HW; i++) m += x[(n * C + c) * HW + i];
      m /= (double)(N * HW);
      for (int64_t n = 0; n < N; n++)
        for (int64_t i = 0; i < HW; i++) v += pow(x[(n * C + c) * HW + i] - m, 2);
      v /= (double)(N * HW - 1);
      for (int k = 0; k < 2; k++) {
        rm[c] = 0.9 * rm[c] + 0.1 * m;
        rv[c] = 0.9 * rv[c] + 0.1 * v;
      }
    }
    float *grm = get_f32(ampc_graph_tensor(t.g, t.rm)), *grv = get_f32(ampc_graph_tensor(t.g, t.rv));
    check_close("running_mean after 2", grm, rm, (size_t)C, 1e-5);
    check_close("running_var after 2", grv, rv, (size_t)C, 1e-5);
    CHECK(*(int64_t *)ampc_graph_tensor(t.g, t.nbt).data == 2);
    CHECK(ampc_graph_tensor(t.g, t.nbt).dtype == AMPC_DTYPE_I64);
    CHECK_OK(ampc_graph_forward(t.g, 0));
    float *erm = get_f32(ampc_graph_tensor(t.g, t.rm)), *erv = get_f32(ampc_graph_tensor(t.g, t.rv));
    CHECK(memcmp(erm, grm, (size_t)C * sizeof(float)) == 0 && memcmp(erv, grv, (size_t)C * sizeof(float)) == 0);
    CHECK(*(int64_t *)ampc_graph_tensor(t.g, t.nbt).data == 2);
  }
  ampc_graph_free(t.g);
  tmp_free_all();
}

/* Training normalises over N*H*W values; with one value per channel the
 * variance is undefined and PyTorch refuses ("Expected more than 1 value
 * per channel when training"). */
TEST(batchnorm_needs_two_values) {
  ampc_graph *g;
  CHECK_OK(ampc_graph_create(&g));
  float one = 1.0f;
  ampc_value x = ampc_graph_input(g, "x", ampc_shape4(1, 1, 1, 1));
  ampc_value gm = ampc_graph_param(g, "g", ampc_shape1(1), 1, &one), bt = ampc_graph_param(g, "b", ampc_shape1(1), 1, NULL);
  ampc_value rm = ampc_graph_buffer(g, "rm", AMPC_DTYPE_F32, ampc_shape1(1), NULL);
  ampc_value rv = ampc_graph_buffer(g, "rv", AMPC_DTYPE_F32, ampc_shape1(1), &one);
  ampc_value y = ampc_graph_batchnorm2d(g, x, gm, bt, rm, rv, AMPC_VALUE_NONE, 0.1f, 1e-5f);
  CHECK(y >= 0);
  ampc_graph_set_retain_grads(g, 1); /* the checks read activation gradients */
  CHECK_OK(ampc_graph_compile(g));
  CHECK_ERR(ampc_graph_forward(g, 1), AMPC_EINVAL, "batchnorm2d");
  CHECK_OK(ampc_graph_forward(g, 0));
  ampc_graph_free(g);
}

/* ---------------- cross entropy ---------------- */

TEST(cross_entropy_label_out_of_range) {
  for (int bad = 0; bad < 2; bad++) {
    ampc_graph *g;
    CHECK_OK(ampc_graph_create(&g));
    ampc_value x = ampc_graph_input(g, "x", ampc_shape2(3, 4));
    ampc_value lab = ampc_graph_labels(g, "y", 3);
    ampc_value loss = ampc_graph_cross_entropy(g, x, lab, 0.1f);
    CHECK(loss >= 0);
    ampc_graph_set_retain_grads(g, 1); /* the checks read activation gradients */
    CHECK_OK(ampc_graph_compile(g));
    int32_t *l = ampc_graph_tensor(g, lab).data;
    l[0] = 0;
    l[1] = bad ? -1 : 4;
    l[2] = 3;
    CHECK_ERR(ampc_graph_forward(g, 1), AMPC_ERANGE, "label");
    l[1] = 1;
    CHECK_OK(ampc_graph_forward(g, 1));
    ampc_graph_free(g);
  }
}

/* With smoothing s the loss is (1-s) CE(one-hot) + s * mean over classes of
 * -log p; for uniform logits it is log K whatever the labels. */
TEST(cross_entropy_values) {
  ampc_graph *g;
  CHECK_OK(ampc_graph_create(&g));
  ampc_value x = ampc_graph_input(g, "x", ampc_shape2(2, 5));
  ampc_value lab = ampc_graph_labels(g, "y", 2);
  ampc_value l0 = ampc_graph_cross_entropy(g, x, lab, 0.0f);
  ampc_value l1 = ampc_graph_cross_entropy(g, x, lab, 0.1f);
  ampc_graph_set_retain_grads(g, 1); /* the checks read activation gradients */
  CHECK_OK(ampc_graph_compile(g));
  float *xv = ampc_graph_tensor(g, x).data;
  for (int i = 0; i < 10; i++) xv[i] = 0.25f;
  int32_t *l = ampc_graph_tensor(g, lab).data;
  l[0] = 4;
  l[1] = 0;
  CHECK_OK(ampc_graph_forward(g, 1));
  CHECK_NEAR(*(float *)ampc_graph_tensor(g, l0).data, log(5.0), 1e-6);
  CHECK_NEAR(*(float *)ampc_graph_tensor(g, l1).data, log(5.0), 1e-6);
  /* row 0 (label 4): logits 0,1,2,3,4; row 1 (label 0): 4,3,2,1,0 -> the same loss */
  for (int i = 0; i < 5; i++) {
    xv[i] = (float)i;
    xv[5 + i] = (float)(4 - i);
  }
  CHECK_OK(ampc_graph_forward(g, 1));
  double lse = log(1 + exp(1) + exp(2) + exp(3) + exp(4));
  double ce = lse - 4.0, mean_nlp = lse - 2.0;
  CHECK_NEAR(*(float *)ampc_graph_tensor(g, l0).data, ce, 1e-6);
  CHECK_NEAR(*(float *)ampc_graph_tensor(g, l1).data, 0.9 * ce + 0.1 * mean_nlp, 1e-6);
  ampc_graph_free(g);
}

/* ---------------- graph errors ---------------- */

static ampc_status record_and_compile(int which) {
  ampc_graph *g;
  ampc_status s = ampc_graph_create(&g);
  if (s < 0) return s;
  ampc_value x = ampc_graph_input(g, "x", ampc_shape4(2, 3, 5, 5));
  ampc_value x2 = ampc_graph_input(g, "x2", ampc_shape2(2, 7));
  ampc_value lab = ampc_graph_labels(g, "y", 2);
  ampc_value w = ampc_graph_param(g, "w", ampc_shape4(4, 2, 3, 3), 0, NULL);
  ampc_value lw = ampc_graph_param(g, "lw", ampc_shape2(3, 6), 0, NULL);
  switch (which) {
    case 0: ampc_graph_conv2d(g, x, w, AMPC_VALUE_NONE, 1, 1); break;           /* 2 vs 3 channels */
    case 1: ampc_graph_linear(g, x2, lw, AMPC_VALUE_NONE); break;               /* 6 vs 7 features */
    case 2: ampc_graph_add(g, x, ampc_graph_relu(g, x2)); break;                /* shapes differ */
    case 3: ampc_graph_cross_entropy(g, x2, x2, 0.0f); break;                  /* labels not labels */
    case 4: ampc_graph_cross_entropy(g, x2, lab, 1.5f); break;                 /* smoothing > 1 */
    case 5: ampc_graph_maxpool2d(g, x, 7, 1, 0); break;                         /* kernel > input */
    case 6: ampc_graph_input(g, "x3", ampc_shape2(3, 7)); break;                /* batch 3 vs 2 */
    case 7: ampc_graph_param(g, "w", ampc_shape1(3), 0, NULL); break;           /* duplicate name */
    case 8: ampc_graph_linear(g, x, lw, AMPC_VALUE_NONE); break;                /* 4-d into linear */
    case 9: ampc_graph_conv2d(g, x, ampc_graph_param(g, "w3", ampc_shape4(4, 3, 3, 3), 0, NULL),
                              ampc_graph_param(g, "b3", ampc_shape1(5), 0, NULL), 1, 1); break; /* bias (5) for 4 */
    default: break;
  }
  ampc_graph_set_retain_grads(g, 1); /* the checks read activation gradients */
  s = ampc_graph_compile(g);
  ampc_graph_free(g);
  return s;
}

TEST(recording_errors) {
  const char *const expect[] = {"channels", "features", "shapes", "labels", "label_smoothing",
                                "kernel", "batch", "duplicate", "2-d", "bias"};
  for (int i = 0; i < 10; i++) CHECK_ERR(record_and_compile(i), AMPC_EINVAL, expect[i]);
  CHECK_OK(record_and_compile(-1));
}

TEST(backward_errors) {
  net t;
  ctx_case = "backward_errors";
  ctx_prec = "f32";
  if (build(&t, find_case("relu"), &PRECS[0].p, 2, 0) == 0) {
    CHECK_OK(ampc_graph_forward(t.g, 1));
    CHECK_ERR(ampc_graph_backward(t.g, t.y, 1.0f, 0), AMPC_EINVAL, "loss");
    CHECK_ERR(ampc_graph_backward(t.g, 12345, 1.0f, 0), AMPC_EINVAL, "loss");
    CHECK_OK(ampc_graph_backward(t.g, t.loss, 1.0f, 0));
  }
  ampc_graph_free(t.g);
  tmp_free_all();
  ampc_graph *g;
  CHECK_OK(ampc_graph_create(&g));
  ampc_value x = ampc_graph_input(g, "x", ampc_shape2(2, 3));
  ampc_value loss = ampc_graph_cross_entropy(g, x, ampc_graph_labels(g, "y", 2), 0.0f);
  CHECK_ERR(ampc_graph_backward(g, loss, 1.0f, 0), AMPC_ESTATE, "before");
  ampc_graph_set_retain_grads(g, 1); /* the checks read activation gradients */
  CHECK_OK(ampc_graph_compile(g));
  CHECK_ERR(ampc_graph_set_precision(g, &PRECS[1].p), AMPC_ESTATE, "before compile");
  ampc_graph_free(g);
  ampc_graph_free(NULL);
}

/* An explicit cast of a parameter (a weight kept in f32 and cast by the
 * model itself) is not batched: the convolution must see the whole weight
 * (4 output channels) at the built batch (3) and at a smaller one (2). */
/* The 2x2 max-pool gradient goes to each window's first maximum, a NaN
 * beating any number (PyTorch's choice), in the vectorised path (8 windows at
 * a time) and its scalar tail alike: windows of ties, NaNs in every position,
 * and plain maxima in every position. */
/* nw windows per row, R rows of windows: ties, one maximum, NaNs, through
 * the row path (nw >= 8, its last step overlapping when 8 does not divide
 * it), a step per row pair (4 <= nw < 8) and the gathered one (nw < 4) */
static void pool_ties_case(int nw, int R) {
  int W = 2 * nw, H = 2 * R, nwin = nw * R;
  float *x = calloc((size_t)(H * W), sizeof *x), *head = calloc((size_t)(2 * nwin), sizeof *head);
  int *winner = calloc((size_t)nwin, sizeof *winner);
  for (int w = 0; w < nwin; w++) {
    float *r0 = x + 2 * (w / nw) * W + 2 * (w % nw), *r1 = r0 + W;
    int kind = w % 7, pos = (w / 7 + w) % 4;
    r0[0] = r0[1] = r1[0] = r1[1] = 0.5f;
    winner[w] = 0;                                       /* kind 0: four ties */
    if (kind == 1) { r0[0] = r0[1] = r1[0] = r1[1] = -1.0f; }
    float *cell[4] = {&r0[0], &r0[1], &r1[0], &r1[1]};
    if (kind == 2 || kind == 3) { *cell[pos] = 2.0f; winner[w] = pos; }   /* one maximum */
    if (kind == 4) { *cell[pos] = NAN; winner[w] = pos; }                 /* one NaN */
    if (kind == 5) { *cell[3] = NAN; *cell[1] = NAN; winner[w] = 1; }     /* the first NaN */
    if (kind == 6) { *cell[pos] = 2.0f; *cell[(pos + 1) % 4] = 2.0f; winner[w] = pos < 3 ? pos : 0; } /* a tie of two */
  }
  ampc_graph *g;
  CHECK_OK(ampc_graph_create(&g));
  ampc_value p = ampc_graph_param(g, "x", ampc_shape4(1, 1, H, W), 0, x);
  ampc_value y = ampc_graph_maxpool2d(g, p, 2, 2, 0);
  for (int i = 0; i < nwin; i++) head[i] = 1.0f; /* logit 0 = sum of the pooled values; logit 1 = 0 */
  ampc_value hw = ampc_graph_param(g, "head", ampc_shape2(2, nwin), 0, head);
  ampc_value lab = ampc_graph_labels(g, "y", 1);
  ampc_value loss = ampc_graph_cross_entropy(g, ampc_graph_linear(g, ampc_graph_flatten(g, y), hw, AMPC_VALUE_NONE), lab, 0.0f);
  CHECK_OK(ampc_graph_compile(g));
  if (ampc_graph_is_compiled(g)) {
    ((int32_t *)ampc_graph_tensor(g, lab).data)[0] = 1;
    CHECK_OK(ampc_graph_forward(g, 1));
    CHECK_OK(ampc_graph_backward(g, loss, 1.0f, 0));
    const float *dx = ampc_graph_grad(g, p).data, *yv = ampc_graph_tensor(g, y).data;
    for (int w = 0; w < nwin; w++) {
      int at = 2 * (w / nw) * W + 2 * (w % nw);
      const float *d[4] = {dx + at, dx + at + 1, dx + at + W, dx + at + W + 1};
      const float want = x[at + (winner[w] & 1) + (winner[w] >> 1) * W];
      CHECK_MSG(isnan(want) ? isnan(yv[w]) : yv[w] == want, "%d x %d windows: window %d pooled %g, want %g", nw, R, w,
                (double)yv[w], (double)want);
      for (int q = 0; q < 4; q++)
        CHECK_MSG((*d[q] != 0.0f) == (q == winner[w]), "%d x %d windows: window %d: gradient %g at position %d, winner %d", nw,
                  R, w, (double)*d[q], q, winner[w]);
    }
  }
  ampc_graph_free(g);
  free(x);
  free(head);
  free(winner);
}

TEST(maxpool_backward_ties_and_nan) {
  pool_ties_case(5, 7); /* rows of 4 to 7 windows: a step per row pair */
  pool_ties_case(7, 3);
  pool_ties_case(4, 5);
  pool_ties_case(6, 1);
  pool_ties_case(3, 6); /* rows of 1 to 3: gathered, windows in reading order */
  pool_ties_case(1, 9);
  pool_ties_case(16, 2); /* along rows: whole steps */
  pool_ties_case(21, 1); /* along rows, the last step overlapping */
  pool_ties_case(37, 3);
  pool_ties_case(9, 4);
}

/* A kept batch-norm output keeps its own values: the ReLU after it is not
 * fused into it (fused, the two would share memory holding the ReLU's). */
TEST(keep_stops_relu_fusion) {
  for (int keep = 0; keep < 2; keep++) {
    ampc_graph *g;
    CHECK_OK(ampc_graph_create(&g));
    ampc_value x = ampc_graph_input(g, "x", ampc_shape4(2, 3, 4, 4));
    static const float ones[3] = {1.0f, 1.0f, 1.0f};
    ampc_value gm = ampc_graph_param(g, "bn.weight", ampc_shape1(3), 1, ones);
    ampc_value bt = ampc_graph_param(g, "bn.bias", ampc_shape1(3), 1, NULL);
    ampc_value rm = ampc_graph_buffer(g, "bn.running_mean", AMPC_DTYPE_F32, ampc_shape1(3), NULL);
    ampc_value rv = ampc_graph_buffer(g, "bn.running_var", AMPC_DTYPE_F32, ampc_shape1(3), ones);
    ampc_value bn = ampc_graph_batchnorm2d(g, x, gm, bt, rm, rv, AMPC_VALUE_NONE, 0.1f, 1e-5f);
    ampc_value r = ampc_graph_relu(g, bn);
    ampc_value hw = ampc_graph_param(g, "head", ampc_shape2(2, 48), 0, rand_vec(S_HEAD, 96, -0.2f, 0.2f));
    ampc_value lab = ampc_graph_labels(g, "y", 2);
    ampc_graph_cross_entropy(g, ampc_graph_linear(g, ampc_graph_flatten(g, r), hw, AMPC_VALUE_NONE), lab, 0.0f);
    if (keep) CHECK_OK(ampc_graph_keep(g, bn));
    CHECK_OK(ampc_graph_compile(g));
    if (ampc_graph_is_compiled(g)) {
      ampc_tensor xt = ampc_graph_tensor(g, x);
      ampc_store_f32(xt.dtype, xt.data, rand_vec(S_X, 96, -1.0f, 1.0f), 96);
      CHECK_OK(ampc_graph_forward(g, 1));
      const float *b = ampc_graph_tensor(g, bn).data, *y = ampc_graph_tensor(g, r).data;
      int negative = 0;
      for (int i = 0; i < 96; i++) negative += b[i] < 0.0f;
      CHECK_MSG(keep ? (b != y && negative > 0) : b == y, "keep %d: batch norm output %s the ReLU's, %d negative values", keep,
                b == y ? "shares memory with" : "is apart from", negative);
    }
    ampc_graph_free(g);
    tmp_free_all();
  }
}

TEST(cast_of_param) {
  ctx_case = "conv(x, cast(w))";
  ctx_prec = "f32";
  ampc_graph *g;
  CHECK_OK(ampc_graph_create(&g));
  ampc_value x = ampc_graph_input(g, "x", ampc_shape4(3, 2, 5, 5));
  ampc_value w = ampc_graph_param(g, "w", ampc_shape4(4, 2, 3, 3), 0, rand_vec(S_W, 72, -0.4f, 0.4f));
  ampc_value wc = ampc_graph_cast(g, w, AMPC_DTYPE_F32);
  ampc_value y = ampc_graph_conv2d(g, x, wc, AMPC_VALUE_NONE, 1, 1);
  ampc_value lab = ampc_graph_labels(g, "y", 3);
  ampc_graph_cross_entropy(g, ampc_graph_global_avgpool(g, y), lab, 0.0f);
  ampc_graph_set_retain_grads(g, 1); /* the checks read activation gradients */
  CHECK_OK(ampc_graph_compile(g));
  if (ampc_graph_is_compiled(g)) {
    ampc_tensor xt = ampc_graph_tensor(g, x);
    ampc_store_f32(xt.dtype, xt.data, rand_vec(S_X, 150, -1.0f, 1.0f), 150);
    int32_t *l = ampc_graph_tensor(g, lab).data;
    for (int i = 0; i < 3; i++) l[i] = i;
    for (int64_t n = 3; n >= 2; n--) {
      CHECK_OK(ampc_graph_set_batch(g, n));
      CHECK_OK(ampc_graph_forward(g, 1));
      ampc_tensor wt = ampc_graph_tensor(g, wc);
      CHECK_MSG(wt.shape.d[0] == 4, "batch %lld: cast of the weight has shape[0] = %lld, expected 4", (long long)n,
                (long long)wt.shape.d[0]);
      double *yr = zeros((size_t)(n * 100));
      ref_conv(get_f64(ampc_graph_tensor(g, x), AMPC_DTYPE_F32), get_f64(ampc_graph_tensor(g, w), AMPC_DTYPE_F32), NULL,
               n, 2, 5, 5, 4, 3, 1, 1, NULL, yr, NULL, NULL, NULL);
      check_close(n == 3 ? "conv output, batch 3" : "conv output, batch 2", get_f32(ampc_graph_tensor(g, y)), yr,
                  (size_t)(n * 100), 1e-5);
    }
  }
  ampc_graph_free(g);
  tmp_free_all();
}

TEST(op_names_and_policies) {
  CHECK(strcmp(ampc_op_name(AMPC_OP_CONV2D), "conv2d") == 0);
  CHECK(strcmp(ampc_op_name(AMPC_OP_CROSS_ENTROPY), "cross_entropy") == 0);
  CHECK(strcmp(ampc_op_name(AMPC_OP_COUNT), "?") == 0);
  CHECK(ampc_op_cast_policy(AMPC_OP_CONV2D) == AMPC_CAST_POLICY_HALF);
  CHECK(ampc_op_cast_policy(AMPC_OP_LINEAR) == AMPC_CAST_POLICY_HALF);
  CHECK(ampc_op_cast_policy(AMPC_OP_BATCHNORM2D) == AMPC_CAST_POLICY_FP32);
  CHECK(ampc_op_cast_policy(AMPC_OP_SOFTMAX) == AMPC_CAST_POLICY_FP32);
  CHECK(ampc_op_cast_policy(AMPC_OP_ADD) == AMPC_CAST_POLICY_PROMOTE);
  CHECK(ampc_op_cast_policy(AMPC_OP_RELU) == AMPC_CAST_POLICY_KEEP);
}

TEST_MAIN(TEST_ENTRY(conv2d), TEST_ENTRY(conv2d_im2col), TEST_ENTRY(conv2d_winograd), TEST_ENTRY(conv2d_direct), TEST_ENTRY(winograd_same_bits_any_threads), TEST_ENTRY(maxpool_backward_ties_and_nan), TEST_ENTRY(keep_stops_relu_fusion), TEST_ENTRY(batchnorm2d_train), TEST_ENTRY(batchnorm2d_eval), TEST_ENTRY(relu),
          TEST_ENTRY(maxpool2d), TEST_ENTRY(avgpool2d), TEST_ENTRY(global_avgpool), TEST_ENTRY(linear),
          TEST_ENTRY(add), TEST_ENTRY(flatten), TEST_ENTRY(softmax), TEST_ENTRY(log_softmax),
          TEST_ENTRY(cross_entropy), TEST_ENTRY(cast), TEST_ENTRY(set_batch_matches_smaller_graph),
          TEST_ENTRY(set_batch_range), TEST_ENTRY(thread_counts_agree), TEST_ENTRY(threads_raised_after_compile), TEST_ENTRY(threads_lowered_after_compile),
          TEST_ENTRY(value_used_twice), TEST_ENTRY(shared_weight_and_accumulate),
          TEST_ENTRY(backward_seed_scales_gradients), TEST_ENTRY(batchnorm_running_stats),
          TEST_ENTRY(batchnorm_needs_two_values), TEST_ENTRY(cross_entropy_label_out_of_range),
          TEST_ENTRY(cross_entropy_values), TEST_ENTRY(recording_errors), TEST_ENTRY(backward_errors),
          TEST_ENTRY(cast_of_param), TEST_ENTRY(op_names_and_policies))
