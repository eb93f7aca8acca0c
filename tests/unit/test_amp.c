/* The mixed-precision machinery end to end on small graphs: storage types per
 * opt level, skipped steps, the dynamic scaler in the loop, gradient
 * accumulation, clipping, why loss scaling exists (f16 gradient underflow),
 * resuming, stochastic rounding, refused combinations and several losses.
 * The memory accounting of ResNet-18 is in test_amp_memory.c. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ampc/amp.h"
#include "ampc/nn.h"
#include "ampc/rng.h"
#include "test.h"

/* ---------------------------------------------------------------- helpers */

/* A configuration from a level's defaults and NULL-terminated name/value pairs. */
static ampc_amp_config make_config(ampc_opt_level lv, ampc_dtype half, const char *const *kv) {
  ampc_amp_config c;
  memset(&c, 0, sizeof c);
  CHECK_OK(ampc_amp_config_init(&c, lv, half));
  for (; kv && kv[0]; kv += 2) CHECK_OK(ampc_amp_config_set(&c, kv[0], kv[1]));
  return c;
}

/* One model (built-in or hand-built), its optimizer and its amp handle. */
typedef struct {
  ampc_model *m; /* NULL for a hand-built graph */
  ampc_graph *g;
  ampc_value x, y, logits, loss;
  int64_t n, features, classes; /* batch, elements per sample, classes */
  ampc_optim *opt;
  ampc_amp *amp;
} rig;

static void rig_free(rig *r) {
  ampc_amp_free(r->amp);
  ampc_optim_free(r->opt);
  if (r->m) ampc_model_free(r->m);
  else ampc_graph_free(r->g);
  memset(r, 0, sizeof *r);
}

static int rig_model(rig *r, const char *name, int64_t batch, int c, int h, int w, int classes, uint64_t seed) {
  memset(r, 0, sizeof *r);
  ampc_model_opts o = {.batch = batch, .channels = c, .height = h, .width = w, .classes = classes, .seed = seed};
  CHECK_OK(ampc_model_create(&r->m, name, &o));
  if (!r->m) return 0;
  r->g = ampc_model_graph(r->m);
  r->x = ampc_model_input(r->m);
  r->y = ampc_model_labels(r->m);
  r->logits = ampc_model_logits(r->m);
  r->loss = ampc_model_loss(r->m);
  r->n = batch;
  r->features = (int64_t)c * h * w;
  r->classes = classes;
  return 1;
}

/* A parameter with values uniform in (-bound, bound), from its own stream. */
static ampc_value rand_param(ampc_graph *g, const char *name, ampc_shape s, float bound, uint64_t seed) {
  size_t n = (size_t)ampc_shape_numel(&s);
  float *v = malloc(n * sizeof *v);
  ampc_rng rr = ampc_rng_make(seed, AMPC_RNG_STREAM_USER);
  for (size_t i = 0; i < n; i++) v[i] = bound * (2.0f * ampc_rng_uniform(&rr) - 1.0f);
  ampc_value p = ampc_graph_param(g, name, s, 0, v);
  free(v);
  return p;
}

/* Hand-built: x (n, d) -> fc1 (no bias) -> ... -> fcL (classes) -> cross
 * entropy, with relu between the layers if relu is set. */
static int rig_chain(rig *r, int64_t n, int64_t d, const int64_t *widths, const float *bounds, int layers, int relu,
                     uint64_t seed) {
  memset(r, 0, sizeof *r);
  CHECK_OK(ampc_graph_create(&r->g));
  if (!r->g) return 0;
  r->x = ampc_graph_input(r->g, "x", ampc_shape2(n, d));
  r->y = ampc_graph_labels(r->g, "y", n);
  ampc_value h = r->x;
  int64_t in = d;
  for (int l = 0; l < layers; l++) {
    char name[32];
    snprintf(name, sizeof name, "fc%d.weight", l + 1);
    ampc_value w = rand_param(r->g, name, ampc_shape2(widths[l], in), bounds[l], seed + (uint64_t)l);
    h = ampc_graph_linear(r->g, h, w, AMPC_VALUE_NONE);
    if (relu && l + 1 < layers) h = ampc_graph_relu(r->g, h);
    in = widths[l];
  }
  r->logits = h;
  ampc_graph_keep(r->g, h); /* the tests read the logits */
  r->loss = ampc_graph_cross_entropy(r->g, h, r->y, 0.0f);
  r->n = n;
  r->features = d;
  r->classes = in;
  CHECK_OK(ampc_graph_status(r->g));
  return ampc_graph_status(r->g) == 0;
}

static ampc_optim_config optim_config(ampc_optim_kind kind, float lr) {
  ampc_optim_config oc;
  ampc_optim_config_default(&oc, kind);
  oc.lr = lr;
  return oc;
}

static int rig_init(rig *r, const ampc_amp_config *cfg, const ampc_optim_config *oc) {
  CHECK_OK(ampc_optim_create(&r->opt, oc, ampc_graph_param_numel(r->g)));
  if (!r->opt) return 0;
  CHECK_OK(ampc_amp_initialize(&r->amp, r->g, r->opt, cfg));
  return r->amp != NULL;
}

static size_t numel_of(rig *r) { return ampc_graph_param_numel(r->g); }

static void set_input(rig *r, const float *vals) { CHECK_OK(ampc_graph_write(r->g, r->x, vals, AMPC_DTYPE_F32)); }

static void set_labels(rig *r, const int32_t *lab) { CHECK_OK(ampc_graph_write(r->g, r->y, lab, AMPC_DTYPE_I32)); }

/* Inputs uniform in (-a, a) and random labels, reproducible from seed. */
static void random_batch(rig *r, uint64_t seed, float a) {
  size_t n = (size_t)(r->n * r->features);
  float *x = malloc(n * sizeof *x);
  int32_t *y = malloc((size_t)r->n * sizeof *y);
  ampc_rng rr = ampc_rng_make(seed, AMPC_RNG_STREAM_DATA);
  for (size_t i = 0; i < n; i++) x[i] = a * (2.0f * ampc_rng_uniform(&rr) - 1.0f);
  for (int64_t i = 0; i < r->n; i++) y[i] = (int32_t)ampc_rng_below(&rr, (uint64_t)r->classes);
  set_input(r, x);
  set_labels(r, y);
  free(x);
  free(y);
}

static void fwd_bwd(rig *r, int accumulate) {
  CHECK_OK(ampc_amp_forward(r->amp, 1));
  CHECK_OK(ampc_amp_backward(r->amp, r->loss, 0, accumulate));
}

static ampc_amp_step_info train_step(rig *r, float lr) {
  ampc_amp_step_info info;
  memset(&info, 0, sizeof info);
  fwd_bwd(r, 0);
  CHECK_OK(ampc_amp_step(r->amp, lr, &info));
  return info;
}

/* The raw bytes of every parameter's model copy, concatenated (malloc'd). */
static unsigned char *model_bytes(rig *r, size_t *len) {
  size_t total = 0;
  for (size_t i = 0; i < ampc_graph_param_count(r->g); i++) {
    ampc_tensor t = ampc_graph_tensor(r->g, ampc_graph_param_at(r->g, i));
    total += ampc_tensor_nbytes(&t);
  }
  unsigned char *b = malloc(total ? total : 1), *p = b;
  for (size_t i = 0; i < ampc_graph_param_count(r->g); i++) {
    ampc_value v = ampc_graph_param_at(r->g, i);
    ampc_tensor t = ampc_graph_tensor(r->g, v);
    CHECK_OK(ampc_graph_read(r->g, v, p, t.dtype)); /* in its own type: the bits */
    p += ampc_tensor_nbytes(&t);
  }
  *len = total;
  return b;
}

static float *param_values(rig *r) {
  float *v = malloc(numel_of(r) * sizeof *v);
  CHECK_OK(ampc_amp_param_values(r->amp, v));
  return v;
}

static float *unscaled(rig *r, int *bad) {
  float *v = malloc(numel_of(r) * sizeof *v);
  int b = 0;
  CHECK_OK(ampc_amp_unscaled_grads(r->amp, v, &b));
  if (bad) *bad = b;
  return v;
}

/* Everything a step may change: masters, the model copy, optimizer state and
 * step count. */
typedef struct {
  float *master;
  unsigned char *model;
  size_t model_len;
  float *state[4];
  size_t nstate, numel;
  int64_t steps;
} snapshot;

static snapshot take_snapshot(rig *r) {
  snapshot s;
  memset(&s, 0, sizeof s);
  s.numel = numel_of(r);
  if (ampc_amp_has_master_weights(r->amp)) {
    s.master = malloc(s.numel * sizeof(float));
    CHECK_OK(ampc_amp_param_values(r->amp, s.master)); /* with masters: the masters */
  }
  s.model = model_bytes(r, &s.model_len);
  s.nstate = ampc_optim_state_count(r->opt);
  for (size_t i = 0; i < s.nstate && i < 4; i++) {
    s.state[i] = malloc(s.numel * sizeof(float));
    CHECK_OK(ampc_optim_state_read(r->opt, i, 0, s.numel, s.state[i]));
  }
  s.steps = ampc_optim_step_count(r->opt);
  return s;
}

static void free_snapshot(snapshot *s) {
  free(s->master);
  free(s->model);
  for (size_t i = 0; i < 4; i++) free(s->state[i]);
  memset(s, 0, sizeof *s);
}

/* 1 if the two snapshots are bit-identical (reports what differs). */
static int same_snapshot(const snapshot *a, const snapshot *b, const char *what) {
  int same = 1;
  if ((a->master == NULL) != (b->master == NULL) ||
      (a->master && memcmp(a->master, b->master, a->numel * sizeof(float)) != 0)) {
    fprintf(stderr, "  %s: master weights differ\n", what);
    same = 0;
  }
  if (a->model_len != b->model_len || memcmp(a->model, b->model, a->model_len) != 0) {
    fprintf(stderr, "  %s: model copy differs\n", what);
    same = 0;
  }
  for (size_t i = 0; i < a->nstate && i < 4; i++)
    if (memcmp(a->state[i], b->state[i], a->numel * sizeof(float)) != 0) {
      fprintf(stderr, "  %s: optimizer state %zu differs\n", what, i);
      same = 0;
    }
  if (a->steps != b->steps) {
    fprintf(stderr, "  %s: step count %lld vs %lld\n", what, (long long)a->steps, (long long)b->steps);
    same = 0;
  }
  return same;
}

/* 1 if every parameter's model gradient is all zero bits. */
static int model_grads_zero(rig *r) {
  int zero = 1;
  for (size_t i = 0; i < ampc_graph_param_count(r->g) && zero; i++) {
    ampc_value v = ampc_graph_param_at(r->g, i);
    ampc_tensor t = ampc_graph_grad(r->g, v);
    unsigned char *p = malloc(ampc_tensor_nbytes(&t));
    if (!p) return 0;
    CHECK_OK(ampc_graph_read_grad(r->g, v, p, t.dtype));
    for (size_t k = 0; k < ampc_tensor_nbytes(&t); k++)
      if (p[k]) zero = 0;
    free(p);
  }
  return zero;
}

static int all_zero(const float *v, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (v[i] != 0.0f) return 0;
  return 1;
}

/* ||a - b|| / ||b|| */
static double rel_err(const float *a, const float *b, size_t n) {
  double d = 0, s = 0;
  for (size_t i = 0; i < n; i++) {
    d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    s += (double)b[i] * b[i];
  }
  return s > 0 ? sqrt(d / s) : sqrt(d);
}

/* Writes one element of a parameter's model gradient in its storage type. */
static void poke_grad(rig *r, const char *param, size_t idx, float v) {
  ampc_value p = ampc_graph_find(r->g, param);
  CHECK(p >= 0);
  if (p < 0) return;
  ampc_tensor t = ampc_graph_grad(r->g, p);
  size_t n = (size_t)ampc_tensor_numel(&t);
  CHECK(idx < n);
  float *g = malloc(n * sizeof *g);
  if (!g || idx >= n) {
    free(g);
    return;
  }
  /* through f32 and back: exact for every storage type */
  CHECK_OK(ampc_graph_read_grad(r->g, p, g, AMPC_DTYPE_F32));
  g[idx] = v;
  CHECK_OK(ampc_graph_write_grad(r->g, p, g, AMPC_DTYPE_F32));
  free(g);
}

/* ------------------------------------------------- 1. storage types */

typedef struct {
  ampc_opt_level lv;
  ampc_dtype half;
  const char *kv[3];
  ampc_dtype param, norm, input, conv, bn, linear;
  int casts;      /* cast values the precision pass inserts */
  int half_casts; /* of those, casts to the half type */
} level_want;

static const char *dn(ampc_dtype t) { return ampc_dtype_name(t); }

/* The Fashion-MNIST CNN on 1x4x4 inputs, batch 5 (so no activation shape
 * equals a parameter shape): conv-bn-relu-pool, conv-bn-relu-pool, flatten,
 * linear-relu-linear. */
static void check_level(const level_want *w) {
  rig r;
  if (!rig_model(&r, "cnn", 5, 1, 4, 4, 3, 7)) return;
  ampc_amp_config cfg = make_config(w->lv, w->half, w->kv);
  ampc_optim_config oc = optim_config(AMPC_OPTIM_SGD, 0.01f);
  char tag[64];
  snprintf(tag, sizeof tag, "%s/%s%s%s", ampc_opt_level_name(w->lv), dn(w->half), w->kv[0] ? " " : "",
           w->kv[0] ? w->kv[0] : "");
  if (!rig_init(&r, &cfg, &oc)) {
    rig_free(&r);
    return;
  }
  ampc_graph *g = r.g;
  int casts = 0, half_casts = 0, logits_cast_f32 = 0;
  ampc_dtype last = AMPC_DTYPE_COUNT; /* storage of the previous recorded op's output */
  ampc_tensor lt = ampc_graph_tensor(g, r.logits);
  for (size_t i = 0; i < ampc_graph_value_count(g); i++) {
    ampc_value v = (ampc_value)i;
    ampc_tensor t = ampc_graph_tensor(g, v);
    ampc_op_kind op = ampc_graph_op(g, v);
    const char *nm = ampc_graph_name(g, v);
    ampc_dtype want = AMPC_DTYPE_COUNT;
    switch (op) {
      case AMPC_OP_PARAM: want = ampc_graph_param_is_norm(g, v) ? w->norm : w->param; break;
      case AMPC_OP_INPUT: want = w->input; break;
      case AMPC_OP_LABELS: want = AMPC_DTYPE_I32; break;
      case AMPC_OP_BUFFER: want = strstr(nm, "num_batches") ? AMPC_DTYPE_I64 : AMPC_DTYPE_F32; break;
      case AMPC_OP_CONV2D: want = w->conv; break;
      case AMPC_OP_BATCHNORM2D: want = w->bn; break;
      case AMPC_OP_LINEAR: want = w->linear; break;
      case AMPC_OP_RELU:
      case AMPC_OP_MAXPOOL2D:
      case AMPC_OP_FLATTEN: want = last; break; /* keep their input's type */
      case AMPC_OP_CROSS_ENTROPY: want = AMPC_DTYPE_F32; break;
      case AMPC_OP_CAST:
        casts++;
        if (t.dtype == w->half) half_casts++;
        if (t.dtype == AMPC_DTYPE_F32 && t.shape.ndim == 2 && t.shape.d[0] == 5 && t.shape.d[1] == 3) logits_cast_f32++;
        break;
      default: break;
    }
    if (want != AMPC_DTYPE_COUNT)
      CHECK_MSG(t.dtype == want, "%s: %s (%s) stored as %s, want %s", tag, nm, ampc_op_name(op), dn(t.dtype), dn(want));
    if (op > AMPC_OP_BUFFER && op != AMPC_OP_CAST && op != AMPC_OP_CROSS_ENTROPY) last = t.dtype;
  }
  CHECK_MSG(casts == w->casts, "%s: %d casts, want %d", tag, casts, w->casts);
  CHECK_MSG(half_casts == w->half_casts, "%s: %d casts to %s, want %d", tag, half_casts, dn(w->half), w->half_casts);
  /* the loss always reads f32 logits: a cast exactly when the logits are half */
  CHECK_MSG(logits_cast_f32 == (lt.dtype != AMPC_DTYPE_F32), "%s: logits %s, %d f32 casts of shape (5, 3)", tag,
            dn(lt.dtype), logits_cast_f32);
  /* and a step runs at that precision */
  random_batch(&r, 1, 1.0f);
  ampc_amp_step_info info = train_step(&r, 0.01f);
  CHECK_MSG(info.applied == 1, "%s: first step not applied", tag);
  rig_free(&r);
}

TEST(storage_types_per_level) {
  const ampc_dtype F32 = AMPC_DTYPE_F32, F16 = AMPC_DTYPE_F16, BF = AMPC_DTYPE_BF16;
  /* O1 casts, cnn: conv1 {x, w, b}, conv2 {pool1, w, b}, fc1 {flatten, w, b},
   * fc2 {w, b} to half (11: 8 weights + 3 f32 activations), logits to f32 (1). */
  const level_want cases[] = {
      {AMPC_OPT_O0, F16, {NULL}, F32, F32, F32, F32, F32, F32, 0, 0},
      {AMPC_OPT_O1, F16, {NULL}, F32, F32, F32, F16, F32, F16, 12, 11},
      {AMPC_OPT_O2, F16, {NULL}, F16, F32, F16, F16, F16, F16, 1, 0},
      {AMPC_OPT_O2, F16, {"keep_batchnorm_fp32", "false", NULL}, F16, F16, F16, F16, F16, F16, 1, 0},
      {AMPC_OPT_O3, F16, {NULL}, F16, F16, F16, F16, F16, F16, 1, 0},
      {AMPC_OPT_O3, F16, {"keep_batchnorm_fp32", "true", NULL}, F16, F32, F16, F16, F16, F16, 1, 0},
      {AMPC_OPT_O1, BF, {NULL}, F32, F32, F32, BF, F32, BF, 12, 11},
      {AMPC_OPT_O2, BF, {NULL}, BF, F32, BF, BF, BF, BF, 1, 0},
      {AMPC_OPT_O3, BF, {NULL}, BF, BF, BF, BF, BF, BF, 1, 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_level(&cases[i]);
}

/* O1 casts each f32 weight once per step however many half ops use it (torch
 * autocast's weight cache). The public API cannot name a cast's input, so
 * this counts casts by shape: x (5, 8) -> fc(W, b) -> relu -> fc(W, b) ->
 * relu -> out(W2) with W (8, 8) shared. */
TEST(o1_casts_a_shared_weight_once) {
  float *gref = NULL;
  for (int pass = 0; pass < 2; pass++) {
    ampc_graph *g;
    CHECK_OK(ampc_graph_create(&g));
    if (!g) return;
    ampc_value x = ampc_graph_input(g, "x", ampc_shape2(5, 8));
    ampc_value y = ampc_graph_labels(g, "y", 5);
    ampc_value w = rand_param(g, "fc.weight", ampc_shape2(8, 8), 0.5f, 1);
    ampc_value b = rand_param(g, "fc.bias", ampc_shape1(8), 0.5f, 2);
    ampc_value w2 = rand_param(g, "out.weight", ampc_shape2(3, 8), 0.5f, 3);
    ampc_value h = ampc_graph_relu(g, ampc_graph_linear(g, x, w, b));
    h = ampc_graph_relu(g, ampc_graph_linear(g, h, w, b));
    ampc_value logits = ampc_graph_linear(g, h, w2, AMPC_VALUE_NONE);
    ampc_value loss = ampc_graph_cross_entropy(g, logits, y, 0.0f);
    size_t recorded = ampc_graph_value_count(g);
    rig r = {.g = g, .x = x, .y = y, .logits = logits, .loss = loss, .n = 5, .features = 8, .classes = 3};
    ampc_amp_config cfg = make_config(pass ? AMPC_OPT_O1 : AMPC_OPT_O0, AMPC_DTYPE_F16, NULL);
    ampc_optim_config oc = optim_config(AMPC_OPTIM_SGD, 0.1f);
    if (!rig_init(&r, &cfg, &oc)) {
      rig_free(&r);
      free(gref);
      return;
    }
    int casts = 0, w_casts = 0, b_casts = 0;
    for (size_t i = 0; i < ampc_graph_value_count(g); i++) {
      if (ampc_graph_op(g, (ampc_value)i) != AMPC_OP_CAST) continue;
      casts++;
      ampc_tensor t = ampc_graph_tensor(g, (ampc_value)i);
      if (t.shape.ndim == 2 && t.shape.d[0] == 8 && t.shape.d[1] == 8) w_casts++;
      if (t.shape.ndim == 1 && t.shape.d[0] == 8) b_casts++;
    }
    size_t added = ampc_graph_value_count(g) - recorded;
    if (pass) {
      /* x, W, b, W2 to half; logits to f32 */
      CHECK_MSG(casts == 5 && added == 5, "O1: %d casts (%zu values added), want 5", casts, added);
      CHECK_MSG(w_casts == 1 && b_casts == 1, "O1: shared W cast %d times, b %d times (want once each)", w_casts, b_casts);
    } else {
      CHECK_MSG(casts == 0, "O0: %d casts", casts);
    }
    /* the shared weight's gradient sums both uses through the one cast */
    random_batch(&r, 5, 1.0f);
    fwd_bwd(&r, 0);
    float *gr = unscaled(&r, NULL);
    if (!pass) {
      gref = gr;
    } else {
      double e = rel_err(gr, gref, numel_of(&r));
      CHECK_MSG(e < 5e-3, "O1 gradients vs O0: relative error %g", e);
      free(gr);
    }
    rig_free(&r);
  }
  free(gref);
}

/* ------------------------------------------------- 2. skipped steps */

/* x (8, 4) -> fc1 (4, 4) -> fc2 (3, 4) -> loss, fc1 tiny. With inputs of
 * 4096 and one label the scaled gradient of fc1 (sum over the batch of
 * dy * 4096) overflows f16 while fc2's (dlogits * y, y ~ 0.1) does not. */
TEST(overflow_skips_the_step_bit_identically) {
  const int64_t widths[] = {4, 3};
  const float bounds[] = {1e-5f, 0.1f};
  rig r;
  if (!rig_chain(&r, 8, 4, widths, bounds, 2, 0, 11)) return;
  ampc_amp_config cfg = make_config(AMPC_OPT_O2, AMPC_DTYPE_F16, NULL);
  ampc_optim_config oc = optim_config(AMPC_OPTIM_ADAM, 1e-6f);
  if (!rig_init(&r, &cfg, &oc)) {
    rig_free(&r);
    return;
  }
  /* a clean step first, so that the moments and step count are not zero
   * (Adam moves every weight by ~lr: keep fc1 tiny) */
  random_batch(&r, 1, 1.0f);
  ampc_amp_step_info info = train_step(&r, 1e-6f);
  CHECK(info.applied == 1 && info.found_inf == 0 && info.n_nonfinite == 0);
  CHECK(ampc_optim_step_count(r.opt) == 1);
  CHECK(ampc_scaler_scale(ampc_amp_scaler(r.amp, 0)) == 65536.0f);
  snapshot before = take_snapshot(&r);
  CHECK(before.master != NULL);

  float x[32];
  int32_t y[8] = {0};
  for (int i = 0; i < 32; i++) x[i] = 4096.0f;
  set_input(&r, x);
  set_labels(&r, y);
  info = train_step(&r, 1e-6f);
  CHECK(info.applied == 0);
  CHECK(info.found_inf == 1);
  CHECK_MSG(info.n_nonfinite == 1, "n_nonfinite %d", info.n_nonfinite);
  CHECK_MSG(info.n_nonfinite >= 1 && info.nonfinite[0] && strcmp(info.nonfinite[0], "fc1.weight") == 0,
            "nonfinite[0] = %s", info.n_nonfinite >= 1 && info.nonfinite[0] ? info.nonfinite[0] : "(none)");
  CHECK_MSG(info.scale == 32768.0f, "info.scale %g", (double)info.scale);
  CHECK(ampc_scaler_scale(ampc_amp_scaler(r.amp, 0)) == 32768.0f);
  CHECK(isinf(info.grad_norm) && info.grad_norm > 0);
  snapshot after = take_snapshot(&r);
  CHECK(same_snapshot(&before, &after, "O2 after a skipped step"));
  CHECK_MSG(model_grads_zero(&r), "model gradients not cleared after a skipped step");
  int bad = -1;
  float *g = unscaled(&r, &bad);
  CHECK(bad == 0);
  CHECK_MSG(all_zero(g, numel_of(&r)), "unscaled (master) gradients not cleared after a skipped step");
  free(g);
  ampc_scaler_state st;
  ampc_scaler_get_state(ampc_amp_scaler(r.amp, 0), &st);
  CHECK(st.overflows == 1 && st.skipped_steps == 1 && st.steps == 2);

  /* the next clean step applies */
  random_batch(&r, 2, 1.0f);
  info = train_step(&r, 1e-6f);
  CHECK(info.applied == 1 && info.found_inf == 0);
  CHECK(ampc_optim_step_count(r.opt) == 2);
  snapshot later = take_snapshot(&r);
  CHECK(memcmp(later.master, after.master, later.numel * sizeof(float)) != 0);
  free_snapshot(&before);
  free_snapshot(&after);
  free_snapshot(&later);
  rig_free(&r);
}

/* The same without master weights (O0 f32, O3 f16), where the step reads the
 * model gradients: an inf or NaN written into one of them after backward
 * skips the step (with a static scale too) and names that parameter. */
TEST(injected_nonfinite_gradient_skips_without_masters) {
  const struct {
    ampc_opt_level lv;
    float bad;
  } cases[] = {{AMPC_OPT_O0, INFINITY}, {AMPC_OPT_O3, INFINITY}, {AMPC_OPT_O3, NAN}, {AMPC_OPT_O0, -INFINITY}};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    const int64_t widths[] = {6, 3};
    const float bounds[] = {0.5f, 0.5f};
    rig r;
    if (!rig_chain(&r, 4, 5, widths, bounds, 2, 1, 21)) return;
    ampc_amp_config cfg = make_config(cases[c].lv, AMPC_DTYPE_F16, NULL);
    ampc_optim_config oc = optim_config(AMPC_OPTIM_ADAM, 1e-2f);
    if (!rig_init(&r, &cfg, &oc)) {
      rig_free(&r);
      return;
    }
    random_batch(&r, 1, 1.0f);
    CHECK(train_step(&r, 1e-2f).applied == 1);
    snapshot before = take_snapshot(&r);
    float scale = ampc_scaler_scale(ampc_amp_scaler(r.amp, 0));
    random_batch(&r, 2, 1.0f);
    fwd_bwd(&r, 0);
    poke_grad(&r, "fc2.weight", 4, cases[c].bad);
    ampc_amp_step_info info;
    CHECK_OK(ampc_amp_step(r.amp, 1e-2f, &info));
    CHECK_MSG(info.applied == 0 && info.found_inf == 1, "%s %g: applied %d found_inf %d",
              ampc_opt_level_name(cases[c].lv), (double)cases[c].bad, info.applied, info.found_inf);
    CHECK(info.n_nonfinite == 1 && info.nonfinite[0] && strcmp(info.nonfinite[0], "fc2.weight") == 0);
    CHECK(ampc_scaler_scale(ampc_amp_scaler(r.amp, 0)) == scale); /* static: stays */
    snapshot after = take_snapshot(&r);
    CHECK(same_snapshot(&before, &after, ampc_opt_level_name(cases[c].lv)));
    CHECK(model_grads_zero(&r));
    free_snapshot(&before);
    free_snapshot(&after);
    rig_free(&r);
  }
}

/* ------------------------------------------------- 3. dynamic scaler */

TEST(dynamic_scale_grows_after_window_clean_steps) {
  rig r;
  if (!rig_model(&r, "mlp", 4, 1, 4, 4, 3, 3)) return;
  static const char *const kv[] = {"scale_window", "3", NULL};
  ampc_amp_config cfg = make_config(AMPC_OPT_O2, AMPC_DTYPE_F16, kv);
  ampc_optim_config oc = optim_config(AMPC_OPTIM_SGD, 0.01f);
  if (!rig_init(&r, &cfg, &oc)) {
    rig_free(&r);
    return;
  }
  const float want[] = {65536.0f, 65536.0f, 131072.0f, 131072.0f, 131072.0f, 262144.0f};
  for (int s = 0; s < 6; s++) {
    random_batch(&r, (uint64_t)s, 1.0f);
    ampc_amp_step_info info = train_step(&r, 0.01f);
    float sc = ampc_scaler_scale(ampc_amp_scaler(r.amp, 0));
    CHECK_MSG(info.applied == 1 && sc == want[s] && info.scale == want[s], "step %d: applied %d scale %g (info %g), want %g",
              s + 1, info.applied, (double)sc, (double)info.scale, (double)want[s]);
  }
  rig_free(&r);
}

/* ------------------------------------------------- 4. accumulation */

/* Gradients of micro-batches A and B (4 samples each) separately, then of A
 * with B accumulated, for one level. Returns the three unscaled gradients. */
static int accumulate_grads(ampc_opt_level lv, float **ga, float **gb, float **gab, size_t *numel, float **delta) {
  rig r;
  if (!rig_model(&r, "mlp", 4, 1, 4, 4, 3, 5)) return 0;
  ampc_amp_config cfg = make_config(lv, AMPC_DTYPE_F16, NULL);
  ampc_optim_config oc = optim_config(AMPC_OPTIM_SGD, 1.0f);
  if (!rig_init(&r, &cfg, &oc)) {
    rig_free(&r);
    return 0;
  }
  *numel = numel_of(&r);
  random_batch(&r, 100, 1.0f);
  fwd_bwd(&r, 0);
  *ga = unscaled(&r, NULL);
  random_batch(&r, 200, 1.0f);
  fwd_bwd(&r, 0);
  *gb = unscaled(&r, NULL);
  random_batch(&r, 100, 1.0f);
  fwd_bwd(&r, 0);
  random_batch(&r, 200, 1.0f);
  fwd_bwd(&r, 1);
  *gab = unscaled(&r, NULL);
  /* one step (SGD, lr 1, no momentum) applies exactly -gab */
  float *w0 = param_values(&r);
  ampc_amp_step_info info;
  CHECK_OK(ampc_amp_step(r.amp, 1.0f, &info));
  CHECK(info.applied == 1);
  float *w1 = param_values(&r);
  for (size_t i = 0; i < *numel; i++) w1[i] -= w0[i];
  *delta = w1;
  free(w0);
  rig_free(&r);
  return 1;
}

TEST(gradient_accumulation_sums_micro_batches) {
  float *ref = NULL;
  size_t n = 0;
  for (int pass = 0; pass < 2; pass++) {
    ampc_opt_level lv = pass ? AMPC_OPT_O2 : AMPC_OPT_O0;
    float *ga = NULL, *gb = NULL, *gab = NULL, *delta = NULL;
    if (!accumulate_grads(lv, &ga, &gb, &gab, &n, &delta)) break;
    float *sum = malloc(n * sizeof *sum);
    double gmax = 0;
    for (size_t i = 0; i < n; i++) {
      sum[i] = ga[i] + gb[i];
      gmax = fmax(gmax, fabs(sum[i]));
    }
    /* accumulation is an f32 add at both levels (O2: into the f32 master
     * gradients), so the sum matches to f32 rounding */
    double worst = 0, worst_step = 0;
    for (size_t i = 0; i < n; i++) {
      worst = fmax(worst, fabs((double)gab[i] - sum[i]));
      worst_step = fmax(worst_step, fabs((double)delta[i] + gab[i]));
    }
    CHECK_MSG(worst <= 1e-5 * gmax, "%s: accumulated vs summed gradients differ by %g (max %g)", ampc_opt_level_name(lv),
              worst, gmax);
    CHECK_MSG(worst_step <= 1e-5 * gmax + 1e-6, "%s: the step applied differs from -gradient by %g",
              ampc_opt_level_name(lv), worst_step);
    CHECK(rel_err(gab, ga, n) > 0.1); /* B contributed */
    if (!pass) {
      ref = gab;
      gab = NULL;
    } else {
      double e = rel_err(gab, ref, n);
      printf("  accumulated gradients O2 vs O0: relative error %.3g\n", e);
      CHECK_MSG(e < 1e-2, "O2 accumulated gradients vs O0: relative error %g", e);
    }
    free(ga);
    free(gb);
    free(gab);
    free(sum);
    free(delta);
  }
  free(ref);
}

/* ------------------------------------------------- 5. clipping */

TEST(clipping_uses_the_unscaled_norm) {
  for (int pass = 0; pass < 2; pass++) {
    ampc_opt_level lv = pass ? AMPC_OPT_O2 : AMPC_OPT_O0;
    rig r;
    if (!rig_model(&r, "mlp", 4, 1, 4, 4, 3, 9)) return;
    ampc_amp_config cfg = make_config(lv, AMPC_DTYPE_F16, NULL);
    ampc_optim_config oc = optim_config(AMPC_OPTIM_SGD, 1.0f);
    if (!rig_init(&r, &cfg, &oc)) {
      rig_free(&r);
      return;
    }
    size_t n = numel_of(&r);
    random_batch(&r, 3, 1.0f);
    fwd_bwd(&r, 0);
    float *g = unscaled(&r, NULL);
    double sq = 0;
    for (size_t i = 0; i < n; i++) sq += (double)g[i] * g[i];
    double norm = sqrt(sq);
    float max_norm = (float)(norm / 4);
    ampc_amp_set_clip_grad_norm(r.amp, max_norm);
    float *w0 = param_values(&r);
    ampc_amp_step_info info;
    CHECK_OK(ampc_amp_step(r.amp, 1.0f, &info));
    double want_coef = (double)max_norm / (norm + 1e-6);
    CHECK(info.applied == 1);
    CHECK_MSG(fabs(info.grad_norm - norm) <= 1e-6 * norm, "%s: grad_norm %.9g, computed %.9g", ampc_opt_level_name(lv),
              (double)info.grad_norm, norm);
    CHECK_MSG(fabs(info.clip_coef - want_coef) <= 1e-6 * want_coef, "%s: clip_coef %.9g, want %.9g",
              ampc_opt_level_name(lv), (double)info.clip_coef, want_coef);
    float *w1 = param_values(&r);
    double worst = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
      double want = -want_coef * g[i];
      /* w1 - w0 carries the rounding of w1: one ulp of |w| */
      double tol = 2.4e-7 * fabs((double)w0[i]) + 1e-6 * fabs(want);
      double e = fabs(((double)w1[i] - w0[i]) - want);
      if (e > tol) worst = fmax(worst, e / tol);
      scale = fmax(scale, fabs(want));
    }
    CHECK_MSG(worst == 0, "%s: applied update differs from -clip_coef * grad (worst %.3g x tolerance)",
              ampc_opt_level_name(lv), worst);
    CHECK(scale > 0);
    free(w1);
    free(w0);
    free(g);

    /* a non-finite gradient: the norm reported is inf, nothing changes */
    if (lv == AMPC_OPT_O0) {
      snapshot before = take_snapshot(&r);
      random_batch(&r, 4, 1.0f);
      fwd_bwd(&r, 0);
      poke_grad(&r, "1.weight", 0, INFINITY);
      CHECK_OK(ampc_amp_step(r.amp, 1.0f, &info));
      CHECK(info.applied == 0 && info.found_inf == 1);
      CHECK_MSG(isinf(info.grad_norm) && info.grad_norm > 0, "grad_norm %g", (double)info.grad_norm);
      CHECK(info.clip_coef == 1.0f);
      CHECK(info.n_nonfinite == 1 && strcmp(info.nonfinite[0], "1.weight") == 0);
      snapshot after = take_snapshot(&r);
      CHECK(same_snapshot(&before, &after, "O0 clipped step with an inf gradient"));
      free_snapshot(&before);
      free_snapshot(&after);
    }
    rig_free(&r);
  }
}

/* ------------------------------------------------- 6. underflow */

/* Solves the SPD system A z = b in place (A n x n, B n x k), Gaussian
 * elimination with partial pivoting, in double. */
static void solve(double *A, double *B, int n, int k) {
  for (int c = 0; c < n; c++) {
    int p = c;
    for (int i = c + 1; i < n; i++)
      if (fabs(A[i * n + c]) > fabs(A[p * n + c])) p = i;
    for (int j = 0; j < n; j++) {
      double t = A[c * n + j];
      A[c * n + j] = A[p * n + j];
      A[p * n + j] = t;
    }
    for (int j = 0; j < k; j++) {
      double t = B[c * k + j];
      B[c * k + j] = B[p * k + j];
      B[p * k + j] = t;
    }
    for (int i = c + 1; i < n; i++) {
      double f = A[i * n + c] / A[c * n + c];
      for (int j = c; j < n; j++) A[i * n + j] -= f * A[c * n + j];
      for (int j = 0; j < k; j++) B[i * k + j] -= f * B[c * k + j];
    }
  }
  for (int c = n - 1; c >= 0; c--)
    for (int j = 0; j < k; j++) {
      double s = B[c * k + j];
      for (int i = c + 1; i < n; i++) s -= A[c * n + i] * B[i * k + j];
      B[c * k + j] = s / A[c * n + c];
    }
}

enum { UF_N = 16, UF_D = 32, UF_K = 4 };
#define UF_LR 0.05f

/* Mean cross entropy of the current logits, in double (the library's f32 loss
 * cannot resolve values near 1e-7). */
static double loss_of(rig *r) {
  float l[UF_N * UF_K];
  int32_t y[UF_N];
  CHECK_OK(ampc_graph_read(r->g, r->logits, l, AMPC_DTYPE_F32));
  CHECK_OK(ampc_graph_read(r->g, r->y, y, AMPC_DTYPE_I32));
  double s = 0;
  for (int n = 0; n < UF_N; n++) {
    double e = 0;
    for (int k = 0; k < UF_K; k++)
      if (k != y[n]) e += exp((double)l[n * UF_K + k] - l[n * UF_K + y[n]]);
    s += log1p(e);
  }
  return s / UF_N;
}

typedef struct {
  double loss0, loss_end;
  double underflow_first, underflow_all;
  int changed, skipped;
} uf_result;

/* A linear classifier x (16, 32) -> W (4, 32) that already fits its data:
 * W interpolates logits of 16.5 for the right class and 0 for the others, so
 * every d logits is ~1e-9..2e-8 -- below half of f16's smallest subnormal
 * (2.98e-8), so that they flush to zero in a half backward pass -- while the
 * loss (~2e-7) still falls steadily under Adam, whose step does not depend on
 * the gradient's magnitude (eps is set far below it). */
static int underflow_run(const ampc_amp_config *cfg, int steps, uf_result *res) {
  memset(res, 0, sizeof *res);
  static float x[UF_N * UF_D];
  static float w[UF_K * UF_D];
  static int32_t y[UF_N];
  ampc_rng rr = ampc_rng_make(77, AMPC_RNG_STREAM_USER);
  for (int i = 0; i < UF_N * UF_D; i++) /* f16-exact, so every level sees the same inputs */
    x[i] = ampc_f16_to_f32(ampc_f32_to_f16(2.0f * ampc_rng_uniform(&rr) - 1.0f));
  for (int n = 0; n < UF_N; n++) y[n] = n % UF_K;
  /* W = L^T (X X^T)^-1 X: W x_n = L_n exactly */
  static double G[UF_N * UF_N], Z[UF_N * UF_K];
  for (int a = 0; a < UF_N; a++) {
    for (int b = 0; b < UF_N; b++) {
      double s = 0;
      for (int j = 0; j < UF_D; j++) s += (double)x[a * UF_D + j] * x[b * UF_D + j];
      G[a * UF_N + b] = s;
    }
    for (int k = 0; k < UF_K; k++) Z[a * UF_K + k] = k == y[a] ? 16.5 : 0.0;
  }
  solve(G, Z, UF_N, UF_K);
  for (int k = 0; k < UF_K; k++)
    for (int j = 0; j < UF_D; j++) {
      double s = 0;
      for (int n = 0; n < UF_N; n++) s += Z[n * UF_K + k] * x[n * UF_D + j];
      w[k * UF_D + j] = (float)s;
    }
  rig r;
  memset(&r, 0, sizeof r);
  CHECK_OK(ampc_graph_create(&r.g));
  if (!r.g) return 0;
  r.x = ampc_graph_input(r.g, "x", ampc_shape2(UF_N, UF_D));
  r.y = ampc_graph_labels(r.g, "y", UF_N);
  ampc_value wv = ampc_graph_param(r.g, "fc.weight", ampc_shape2(UF_K, UF_D), 0, w);
  r.logits = ampc_graph_linear(r.g, r.x, wv, AMPC_VALUE_NONE);
  ampc_graph_keep(r.g, r.logits); /* loss_of reads them */
  r.loss = ampc_graph_cross_entropy(r.g, r.logits, r.y, 0.0f);
  r.n = UF_N;
  r.features = UF_D;
  r.classes = UF_K;
  ampc_optim_config oc = optim_config(AMPC_OPTIM_ADAM, UF_LR);
  oc.eps = 1e-20f;
  if (!rig_init(&r, cfg, &oc)) {
    rig_free(&r);
    return 0;
  }
  set_input(&r, x);
  set_labels(&r, y);
  float *w0 = param_values(&r);
  ampc_amp_set_grad_stats(r.amp, 1);
  for (int s = 0; s < steps; s++) {
    CHECK_OK(ampc_amp_forward(r.amp, 1));
    if (s == 0) res->loss0 = loss_of(&r);
    CHECK_OK(ampc_amp_backward(r.amp, r.loss, 0, 0));
    if (s == 0) {
      ampc_amp_grad_stats st;
      ampc_amp_get_grad_stats(r.amp, &st, 0);
      res->underflow_first = st.values ? (double)st.underflow / (double)st.values : -1;
    }
    ampc_amp_step_info info;
    CHECK_OK(ampc_amp_step(r.amp, UF_LR, &info));
    res->skipped += !info.applied;
  }
  ampc_amp_grad_stats st;
  ampc_amp_get_grad_stats(r.amp, &st, 1);
  res->underflow_all = st.values ? (double)st.underflow / (double)st.values : -1;
  CHECK_OK(ampc_amp_forward(r.amp, 0));
  res->loss_end = loss_of(&r);
  float *w1 = param_values(&r);
  res->changed = memcmp(w0, w1, numel_of(&r) * sizeof(float)) != 0;
  free(w0);
  free(w1);
  rig_free(&r);
  return 1;
}

TEST(loss_scaling_rescues_underflowing_f16_gradients) {
  enum { STEPS = 8 };
  static const char *const static1[] = {"loss_scale", "1", NULL};
  ampc_amp_config c0 = make_config(AMPC_OPT_O0, AMPC_DTYPE_F16, NULL);
  ampc_amp_config c1 = make_config(AMPC_OPT_O2, AMPC_DTYPE_F16, static1);
  ampc_amp_config cd = make_config(AMPC_OPT_O2, AMPC_DTYPE_F16, NULL);
  uf_result r0, r1, rd;
  if (!underflow_run(&c0, STEPS, &r0) || !underflow_run(&c1, STEPS, &r1) || !underflow_run(&cd, STEPS, &rd)) return;
  printf("  O0:             loss %.3g -> %.3g\n", r0.loss0, r0.loss_end);
  printf("  O2, scale 1:    loss %.3g -> %.3g, underflow fraction %.3f first step, %.3f all steps, weights %s\n",
         r1.loss0, r1.loss_end, r1.underflow_first, r1.underflow_all, r1.changed ? "changed" : "unchanged");
  printf("  O2, dynamic:    loss %.3g -> %.3g, underflow fraction %.3f first step, %.3f all steps, %d skipped\n",
         rd.loss0, rd.loss_end, rd.underflow_first, rd.underflow_all, rd.skipped);
  /* the problem learns in f32 */
  CHECK_MSG(r0.loss_end < 0.5 * r0.loss0, "O0 loss %g -> %g: the setup does not learn", r0.loss0, r0.loss_end);
  CHECK(r0.loss0 > 1e-8 && r0.loss0 < 1e-5);
  /* without scaling every f16 gradient flushes: nothing moves */
  CHECK_MSG(r1.underflow_first > 0.99 && r1.underflow_all > 0.99, "O2 scale 1: underflow fraction %g / %g",
            r1.underflow_first, r1.underflow_all);
  CHECK(!r1.changed);
  CHECK(r1.loss_end == r1.loss0);
  /* with dynamic scaling the gradients survive and it learns as in f32 */
  CHECK_MSG(rd.underflow_first < 0.15, "O2 dynamic: underflow fraction %g on the first step", rd.underflow_first);
  CHECK(rd.changed && rd.skipped == 0);
  CHECK_MSG(fabs(log(rd.loss_end / r0.loss_end)) < 0.15, "O2 dynamic final loss %g vs O0's %g", rd.loss_end,
            r0.loss_end);
  CHECK_MSG(fabs(log(rd.loss0 / r0.loss0)) < 0.1, "O2 initial loss %g vs O0's %g", rd.loss0, r0.loss0);
}

/* ------------------------------------------------- 7. resume */

static int resume_rig(rig *r, const ampc_amp_config *cfg) {
  if (!rig_model(r, "mlp", 4, 1, 4, 4, 3, 13)) return 0;
  ampc_optim_config oc = optim_config(AMPC_OPTIM_ADAM, 1e-3f);
  if (!rig_init(r, cfg, &oc)) {
    rig_free(r);
    return 0;
  }
  return 1;
}

TEST(resume_restores_scaler_masters_and_optimizer_bit_identically) {
  enum { K1 = 3, K2 = 4 };
  /* window 2: the scale moves during the run, so a lost scaler state shows */
  static const char *const kv[] = {"scale_window", "2", NULL};
  ampc_amp_config cfg = make_config(AMPC_OPT_O2, AMPC_DTYPE_F16, kv);
  rig a, b, c;
  if (!resume_rig(&a, &cfg)) return;
  for (int s = 0; s < K1 + K2; s++) {
    random_batch(&a, 1000 + (uint64_t)s, 1.0f);
    train_step(&a, 1e-3f);
  }
  /* interrupted: K1 steps, then everything copied into a fresh amp + optimizer */
  if (!resume_rig(&b, &cfg)) {
    rig_free(&a);
    return;
  }
  for (int s = 0; s < K1; s++) {
    random_batch(&b, 1000 + (uint64_t)s, 1.0f);
    train_step(&b, 1e-3f);
  }
  for (int restore_optim = 1; restore_optim >= 0; restore_optim--) {
    if (!resume_rig(&c, &cfg)) break;
    ampc_scaler_state st;
    ampc_scaler_get_state(ampc_amp_scaler(b.amp, 0), &st);
    CHECK_OK(ampc_scaler_set_state(ampc_amp_scaler(c.amp, 0), &st));
    CHECK(ampc_amp_has_master_weights(b.amp) && ampc_amp_has_master_weights(c.amp));
    float *mb = param_values(&b);
    CHECK_OK(ampc_amp_load_params(c.amp, mb));
    free(mb);
    if (restore_optim) {
      float *st = malloc(numel_of(&b) * sizeof *st);
      for (size_t i = 0; st && i < ampc_optim_state_count(b.opt); i++) {
        CHECK_OK(ampc_optim_state_read(b.opt, i, 0, numel_of(&b), st));
        CHECK_OK(ampc_optim_state_write(c.opt, i, 0, numel_of(&b), st));
      }
      free(st);
      CHECK_OK(ampc_optim_set_step_count(c.opt, ampc_optim_step_count(b.opt)));
    }
    for (int s = K1; s < K1 + K2; s++) {
      random_batch(&c, 1000 + (uint64_t)s, 1.0f);
      train_step(&c, 1e-3f);
    }
    snapshot sa = take_snapshot(&a), sc = take_snapshot(&c);
    float scale_a = ampc_scaler_scale(ampc_amp_scaler(a.amp, 0)), scale_c = ampc_scaler_scale(ampc_amp_scaler(c.amp, 0));
    if (restore_optim) {
      CHECK(same_snapshot(&sa, &sc, "resumed run vs uninterrupted"));
      CHECK_MSG(scale_a == scale_c, "scale %g vs %g", (double)scale_c, (double)scale_a);
      CHECK(scale_a != 65536.0f); /* the scale did move */
    } else {
      /* control: without the optimizer state the run differs */
      CHECK(memcmp(sa.master, sc.master, sa.numel * sizeof(float)) != 0);
    }
    free_snapshot(&sa);
    free_snapshot(&sc);
    rig_free(&c);
  }
  rig_free(&a);
  rig_free(&b);
}

/* ------------------------------------------------- 8. stochastic rounding */

enum { SR_N = 32, SR_D = 64, SR_K = 16, SR_STEPS = 30 };

typedef struct {
  unsigned char *model;
  size_t len;
  float *w0, *w1, *expected; /* start, end, sum of the f32 updates -lr * g */
  double max_ratio;          /* largest |update| / half an ulp of its weight */
} sr_result;

/* O3 (f16 weights, no masters), SGD with an lr so small that every update is
 * below half an ulp of its weight. */
static int sr_run(int on, uint64_t seed, sr_result *res) {
  memset(res, 0, sizeof *res);
  rig r;
  memset(&r, 0, sizeof r);
  CHECK_OK(ampc_graph_create(&r.g));
  if (!r.g) return 0;
  r.x = ampc_graph_input(r.g, "x", ampc_shape2(SR_N, SR_D));
  r.y = ampc_graph_labels(r.g, "y", SR_N);
  static float w[SR_K * SR_D];
  ampc_rng rr = ampc_rng_make(5, AMPC_RNG_STREAM_USER);
  for (int i = 0; i < SR_K * SR_D; i++) { /* |w| in [0.25, 1): ulp >= 2^-12 */
    float m = 0.25f + 0.74f * ampc_rng_uniform(&rr);
    w[i] = ampc_rng_uniform(&rr) < 0.5f ? -m : m;
  }
  ampc_value wv = ampc_graph_param(r.g, "fc.weight", ampc_shape2(SR_K, SR_D), 0, w);
  r.logits = ampc_graph_linear(r.g, r.x, wv, AMPC_VALUE_NONE);
  r.loss = ampc_graph_cross_entropy(r.g, r.logits, r.y, 0.0f);
  r.n = SR_N;
  r.features = SR_D;
  r.classes = SR_K;
  ampc_amp_config cfg = make_config(AMPC_OPT_O3, AMPC_DTYPE_F16, NULL);
  const float lr = 2e-4f;
  ampc_optim_config oc = optim_config(AMPC_OPTIM_SGD, lr);
  if (!rig_init(&r, &cfg, &oc)) {
    rig_free(&r);
    return 0;
  }
  CHECK(!ampc_amp_has_master_weights(r.amp));
  ampc_amp_set_stochastic_rounding(r.amp, on, seed);
  random_batch(&r, 9, 1.0f);
  size_t n = numel_of(&r);
  res->w0 = param_values(&r);
  res->expected = calloc(n, sizeof(float));
  for (int s = 0; s < SR_STEPS; s++) {
    fwd_bwd(&r, 0);
    float *g = unscaled(&r, NULL);
    float *wc = param_values(&r);
    for (size_t i = 0; i < n; i++) {
      float u = -lr * g[i];
      res->expected[i] += u;
      int e;
      frexpf(wc[i], &e); /* |w| in [2^(e-1), 2^e): f16 ulp 2^(e-11) */
      res->max_ratio = fmax(res->max_ratio, fabs(u) / ldexp(0.5, e - 11));
    }
    free(g);
    free(wc);
    ampc_amp_step_info info;
    CHECK_OK(ampc_amp_step(r.amp, lr, &info));
    CHECK(info.applied == 1);
  }
  res->w1 = param_values(&r);
  res->model = model_bytes(&r, &res->len);
  rig_free(&r);
  return 1;
}

static void sr_free(sr_result *r) {
  free(r->model);
  free(r->w0);
  free(r->w1);
  free(r->expected);
}

TEST(stochastic_rounding_moves_tiny_updates_reproducibly) {
  sr_result nearest, a, a2, b;
  if (!sr_run(0, 0, &nearest)) return;
  CHECK_MSG(nearest.max_ratio < 1.0, "setup: an update of %.3g half-ulps would round", nearest.max_ratio);
  /* nearest rounding: every update is lost */
  CHECK(memcmp(nearest.w0, nearest.w1, SR_K * SR_D * sizeof(float)) == 0);
  if (!sr_run(1, 42, &a) || !sr_run(1, 42, &a2) || !sr_run(1, 43, &b)) {
    sr_free(&nearest);
    return;
  }
  /* stochastic: the realised displacement follows the f32 updates in
   * expectation (projection ratio ~1; rounding noise is ~3% here) */
  double du = 0, uu = 0;
  int moved = 0;
  for (int i = 0; i < SR_K * SR_D; i++) {
    double d = (double)a.w1[i] - a.w0[i];
    du += d * a.expected[i];
    uu += (double)a.expected[i] * a.expected[i];
    moved += d != 0;
  }
  double ratio = uu > 0 ? du / uu : 0;
  printf("  stochastic rounding: %d of %d weights moved, projection on the f32 updates %.3f\n", moved, SR_K * SR_D, ratio);
  CHECK_MSG(ratio > 0.8 && ratio < 1.2, "projection ratio %g (want ~1)", ratio);
  CHECK(moved > SR_K * SR_D / 10);
  CHECK(a.len == a2.len && memcmp(a.model, a2.model, a.len) == 0);  /* same seed: same bits */
  CHECK(a.len == b.len && memcmp(a.model, b.model, a.len) != 0);    /* another seed: others */
  sr_free(&nearest);
  sr_free(&a);
  sr_free(&a2);
  sr_free(&b);
}

/* ------------------------------------------------- 9. refused */

TEST(refused_combinations) {
  rig r;
  if (!rig_model(&r, "mlp", 2, 1, 2, 2, 3, 1)) return;
  ampc_optim_config oc = optim_config(AMPC_OPTIM_SGD, 0.1f);
  CHECK_OK(ampc_optim_create(&r.opt, &oc, numel_of(&r)));
  ampc_amp_config c;
  CHECK_OK(ampc_amp_config_init(&c, AMPC_OPT_O1, AMPC_DTYPE_F16));
  CHECK_OK(ampc_amp_config_set(&c, "master_weights", "true"));
  ampc_amp *a = (ampc_amp *)&c; /* must be overwritten with NULL */
  CHECK_ERR(ampc_amp_initialize(&a, r.g, r.opt, &c), AMPC_EINVAL, "master_weights");
  CHECK(a == NULL);
  CHECK(!ampc_graph_is_compiled(r.g)); /* nothing applied */
  CHECK_OK(ampc_amp_config_init(&c, AMPC_OPT_O1, AMPC_DTYPE_F16));
  CHECK_OK(ampc_amp_config_set(&c, "keep_batchnorm_fp32", "false"));
  CHECK_ERR(ampc_amp_initialize(&a, r.g, r.opt, &c), AMPC_EINVAL, "keep_batchnorm_fp32");
  CHECK_OK(ampc_amp_config_init(&c, AMPC_OPT_O2, AMPC_DTYPE_F16));
  c.autocast = 1; /* patching functions at O2: refused by validate */
  CHECK_ERR(ampc_amp_initialize(&a, r.g, r.opt, &c), AMPC_EINVAL, "autocast");
  /* a graph compiled before initialize cannot take the opt level */
  CHECK_OK(ampc_graph_compile(r.g));
  CHECK_OK(ampc_amp_config_init(&c, AMPC_OPT_O2, AMPC_DTYPE_F16));
  CHECK_ERR(ampc_amp_initialize(&a, r.g, r.opt, &c), AMPC_ESTATE, "compiled");
  CHECK(a == NULL);
  rig_free(&r);
}

/* A failing initialize leaves the graph as it was, so a retry can succeed. */
TEST(failed_initialize_leaves_the_graph_uncompiled) {
  rig r;
  if (!rig_model(&r, "mlp", 2, 1, 2, 2, 3, 1)) return;
  ampc_optim_config oc = optim_config(AMPC_OPTIM_SGD, 0.1f);
  CHECK_OK(ampc_optim_create(&r.opt, &oc, numel_of(&r) + 1)); /* wrong size */
  ampc_amp_config c = make_config(AMPC_OPT_O2, AMPC_DTYPE_F16, NULL);
  ampc_amp *a = NULL;
  CHECK_ERR(ampc_amp_initialize(&a, r.g, r.opt, &c), AMPC_EINVAL, "optimizer");
  CHECK(a == NULL);
  CHECK_MSG(!ampc_graph_is_compiled(r.g), "initialize failed on the optimizer's size after compiling the graph");
  ampc_optim_free(r.opt);
  r.opt = NULL;
  CHECK_OK(ampc_optim_create(&r.opt, &oc, numel_of(&r)));
  CHECK_OK(ampc_amp_initialize(&r.amp, r.g, r.opt, &c)); /* the retry */
  rig_free(&r);
}

/* ------------------------------------------------- 10. two losses */

/* x (4, 8) -> trunk (8, 8) -> relu -> head0 (3, 8) -> loss0
 *                                   -> head1 (3, 8) -> loss1 */
typedef struct {
  rig r;
  ampc_value loss1;
} two_heads;

static int two_heads_make(two_heads *t, ampc_opt_level lv) {
  memset(t, 0, sizeof *t);
  rig *r = &t->r;
  CHECK_OK(ampc_graph_create(&r->g));
  if (!r->g) return 0;
  ampc_graph *g = r->g;
  r->x = ampc_graph_input(g, "x", ampc_shape2(4, 8));
  r->y = ampc_graph_labels(g, "y", 4);
  ampc_value h = ampc_graph_relu(g, ampc_graph_linear(g, r->x, rand_param(g, "trunk.weight", ampc_shape2(8, 8), 0.5f, 1),
                                                      AMPC_VALUE_NONE));
  ampc_value l0 = ampc_graph_linear(g, h, rand_param(g, "head0.weight", ampc_shape2(3, 8), 0.5f, 2), AMPC_VALUE_NONE);
  ampc_value l1 = ampc_graph_linear(g, h, rand_param(g, "head1.weight", ampc_shape2(3, 8), 0.5f, 3), AMPC_VALUE_NONE);
  r->logits = l0;
  r->loss = ampc_graph_cross_entropy(g, l0, r->y, 0.0f);
  t->loss1 = ampc_graph_cross_entropy(g, l1, r->y, 0.0f);
  r->n = 4;
  r->features = 8;
  r->classes = 3;
  static const char *const kv[] = {"num_losses", "2", NULL};
  ampc_amp_config cfg = make_config(lv, AMPC_DTYPE_F16, kv);
  ampc_optim_config oc = optim_config(AMPC_OPTIM_SGD, 0.1f);
  if (!rig_init(r, &cfg, &oc)) {
    rig_free(r);
    return 0;
  }
  return 1;
}

/* two_heads_make at level lv, then a forward on a random batch. */
static int two_heads_forward(two_heads *t, ampc_opt_level lv) {
  if (!two_heads_make(t, lv)) return 0;
  random_batch(&t->r, 3, 1.0f);
  CHECK_OK(ampc_amp_forward(t->r.amp, 1));
  return 1;
}

TEST(two_losses_overflow_in_one_backs_off_only_its_scaler) {
  two_heads t;
  if (!two_heads_make(&t, AMPC_OPT_O2)) return;
  rig *r = &t.r;
  ampc_scaler *s0 = ampc_amp_scaler(r->amp, 0), *s1 = ampc_amp_scaler(r->amp, 1);
  CHECK(s0 && s1 && s0 != s1 && ampc_amp_scaler(r->amp, 2) == NULL);
  if (!s0 || !s1) {
    rig_free(r);
    return;
  }
  /* a clean step with both losses */
  random_batch(r, 1, 1.0f);
  CHECK_OK(ampc_amp_forward(r->amp, 1));
  CHECK_OK(ampc_amp_backward(r->amp, r->loss, 0, 0));
  CHECK_OK(ampc_amp_backward(r->amp, t.loss1, 1, 1));
  ampc_amp_step_info info;
  CHECK_OK(ampc_amp_step(r->amp, 0.1f, &info));
  CHECK(info.applied == 1);
  /* loss 1 at 2^24: its d logits (~2^24 / 4) overflow f16 */
  ampc_scaler_state st;
  ampc_scaler_get_state(s1, &st);
  st.scale = 16777216.0f;
  CHECK_OK(ampc_scaler_set_state(s1, &st));
  snapshot before = take_snapshot(r);
  random_batch(r, 2, 1.0f);
  CHECK_OK(ampc_amp_forward(r->amp, 1));
  CHECK_OK(ampc_amp_backward(r->amp, r->loss, 0, 0));
  CHECK_OK(ampc_amp_backward(r->amp, t.loss1, 1, 1));
  CHECK_OK(ampc_amp_step(r->amp, 0.1f, &info));
  CHECK(info.applied == 0 && info.found_inf == 1 && info.n_nonfinite >= 1);
  CHECK_MSG(ampc_scaler_scale(s0) == 65536.0f, "scaler 0: %g", (double)ampc_scaler_scale(s0));
  CHECK_MSG(ampc_scaler_scale(s1) == 8388608.0f, "scaler 1: %g", (double)ampc_scaler_scale(s1));
  CHECK(info.scale == 65536.0f);
  snapshot after = take_snapshot(r);
  CHECK(same_snapshot(&before, &after, "two losses, skipped"));
  ampc_scaler_state s0st;
  ampc_scaler_get_state(s0, &s0st);
  CHECK(s0st.overflows == 0);
  free_snapshot(&before);
  free_snapshot(&after);
  rig_free(r);
}

/* Backward of one loss computes that loss's gradients only (apex's
 * scale_loss(loss1, ..., loss_id=1)): head0, which only loss 0 uses, gets no
 * gradient from loss 1's backward. */
TEST(two_losses_backward_of_one_loss_touches_only_its_graph) {
  for (int pass = 0; pass < 2; pass++) {
    ampc_opt_level lv = pass ? AMPC_OPT_O2 : AMPC_OPT_O0;
    two_heads t;
    if (!two_heads_forward(&t, lv)) return;
    rig *r = &t.r;
    CHECK_OK(ampc_amp_backward(r->amp, t.loss1, 1, 0));
    float *g = unscaled(r, NULL);
    ampc_value h0 = ampc_graph_find(r->g, "head0.weight"), h1 = ampc_graph_find(r->g, "head1.weight");
    size_t o0 = ampc_graph_param_offset(r->g, h0), o1 = ampc_graph_param_offset(r->g, h1);
    CHECK_MSG(all_zero(g + o0, 24), "%s: backward of loss 1 wrote a gradient into head0 (only loss 0 uses it)",
              ampc_opt_level_name(lv));
    CHECK(!all_zero(g + o1, 24));
    free(g);
    rig_free(r);
  }
}

/* With two losses each parameter gets the gradient of the losses that reach
 * it, once: after backward of loss 0 and then of loss 1 (accumulating), the
 * head only loss 0 uses holds loss 0's gradient, not twice it. */
TEST(two_losses_add_each_gradient_once) {
  for (int pass = 0; pass < 2; pass++) {
    ampc_opt_level lv = pass ? AMPC_OPT_O2 : AMPC_OPT_O0;
    two_heads t;
    if (!two_heads_forward(&t, lv)) return;
    rig *r = &t.r;
    CHECK_OK(ampc_amp_backward(r->amp, r->loss, 0, 0));
    float *ga = unscaled(r, NULL);
    CHECK_OK(ampc_amp_backward(r->amp, t.loss1, 1, 1));
    float *gab = unscaled(r, NULL);
    ampc_value h0 = ampc_graph_find(r->g, "head0.weight");
    size_t o0 = ampc_graph_param_offset(r->g, h0);
    CHECK(!all_zero(ga + o0, 24));
    CHECK_MSG(memcmp(ga + o0, gab + o0, 24 * sizeof(float)) == 0,
              "%s: head0 (only loss 0 reaches it) changed when loss 1 was added: %g -> %g", ampc_opt_level_name(lv),
              (double)ga[o0], (double)gab[o0]);
    free(ga);
    free(gab);
    rig_free(r);
  }
}

/* Four steps of Adam (the second of two accumulated micro-batches) on
 * random batches from seed 40 + step: the losses, the parameters' bytes
 * and the accounted activations, into the rig r, which stays open. With
 * free_saved set on its graph before initialising. 0 when the rig failed. */
typedef struct {
  const char *model;
  int c, h, w;
  ampc_opt_level lv;
} four_case;
static const four_case four_cases[] = {{"cnn", 1, 12, 12, AMPC_OPT_O0}, {"cnn", 1, 12, 12, AMPC_OPT_O2},
                                       {"resnet18", 3, 8, 8, AMPC_OPT_O0}, {"resnet18", 3, 8, 8, AMPC_OPT_O2}};
static int four_steps(rig *r, const four_case *fc, int free_saved, float loss[4], unsigned char **bytes, size_t *len, size_t *act) {
  ampc_amp_config cfg = make_config(fc->lv, AMPC_DTYPE_F16, NULL);
  ampc_optim_config oc = optim_config(AMPC_OPTIM_ADAM, 1e-3f);
  if (!rig_model(r, fc->model, 6, fc->c, fc->h, fc->w, 10, 5)) return 0;
  CHECK_OK(ampc_graph_set_free_saved(r->g, free_saved));
  if (!rig_init(r, &cfg, &oc)) return 0;
  for (int s = 0; s < 4; s++) {
    random_batch(r, 40 + (uint64_t)s, 1.0f);
    fwd_bwd(r, s == 2);
    CHECK_OK(ampc_graph_read(r->g, r->loss, &loss[s], AMPC_DTYPE_F32));
    if (s != 1) CHECK_OK(ampc_amp_step(r->amp, 1e-3f, NULL));
  }
  ampc_mem_report m;
  ampc_graph_memory(r->g, &m);
  *act = ampc_mem_total(&m, AMPC_MEM_ACTIVATIONS);
  *bytes = model_bytes(r, len);
  return 1;
}

/* free_saved (one arena over forward and backward) changes where values
 * live, not what is computed: three steps (the second of two accumulated
 * micro-batches) give the same losses and parameters bit for bit as the two
 * arenas, in fewer activation bytes; after a backward a second one is
 * refused, and so is a read of an activation it freed (the logits, kept,
 * and the loss stay readable); a forward makes everything readable again. */
TEST(free_saved_gives_the_same_bits_in_less_memory) {
  for (size_t c = 0; c < sizeof four_cases / sizeof four_cases[0]; c++) {
    rig r[2];
    float loss[2][4];
    size_t act[2] = {0, 0};
    unsigned char *bytes[2] = {NULL, NULL};
    size_t len[2] = {0, 0};
    for (int f = 0; f < 2; f++)
      if (!four_steps(&r[f], &four_cases[c], f, loss[f], &bytes[f], &len[f], &act[f])) return;
    const char *what = four_cases[c].model;
    ampc_opt_level lv = four_cases[c].lv;
    CHECK_MSG(memcmp(loss[0], loss[1], sizeof loss[0]) == 0, "%s %s: losses differ with free_saved", what, ampc_opt_level_name(lv));
    CHECK_MSG(len[0] == len[1] && memcmp(bytes[0], bytes[1], len[0]) == 0, "%s %s: parameters differ with free_saved", what,
              ampc_opt_level_name(lv));
    CHECK_MSG(act[1] < act[0], "%s %s: activations %zu bytes with free_saved, %zu without", what, ampc_opt_level_name(lv), act[1],
              act[0]);
    /* after a backward: no second one, no read of what it freed */
    rig *q = &r[1];
    float *lg = malloc((size_t)(q->n * q->classes) * sizeof *lg);
    CHECK_MSG(ampc_amp_backward(q->amp, q->loss, 0, 0) == AMPC_ESTATE, "a second backward after one forward was taken");
    CHECK_OK(ampc_graph_read(q->g, q->logits, lg, AMPC_DTYPE_F32));
    size_t refused = 0, nv = ampc_graph_value_count(q->g);
    float *buf = malloc(1 << 22);
    for (size_t v = 0; v < nv; v++) {
      ampc_tensor t = ampc_graph_tensor(q->g, (ampc_value)v);
      if (!t.data && ampc_tensor_numel(&t) == 0) continue;
      if ((size_t)ampc_tensor_numel(&t) * sizeof(float) > (1u << 22)) continue;
      if (ampc_graph_read(q->g, (ampc_value)v, buf, AMPC_DTYPE_F32) == AMPC_ESTATE) refused++;
    }
    CHECK_MSG(refused > 0, "%s: no activation was refused after backward", what);
    CHECK_OK(ampc_amp_forward(q->amp, 1));
    for (size_t v = 0; v < nv; v++) {
      ampc_tensor t = ampc_graph_tensor(q->g, (ampc_value)v);
      if ((size_t)ampc_tensor_numel(&t) * sizeof(float) > (1u << 22)) continue;
      CHECK_MSG(ampc_graph_read(q->g, (ampc_value)v, buf, AMPC_DTYPE_F32) != AMPC_ESTATE, "%s: value %zu refused after forward",
                what, v);
    }
    free(buf);
    free(lg);
    for (int f = 0; f < 2; f++) {
      free(bytes[f]);
      rig_free(&r[f]);
    }
  }
}

/* Batch norm over planes of up to 64 values runs a sample at a time; the
 * channel loop (forced by a hook) must give the same losses and parameters
 * bit for bit: the cnn on 16x16 images (its second batch norm, 8x8, with
 * the fused ReLU and pool) and ResNet-18 on 8x8 (every batch norm), four
 * steps with an accumulated micro-batch, at O0 and O2. */
extern int ampc__cpu_bn_by_channel;
TEST(batchnorm_by_sample_gives_the_channel_loops_bits) {
  static const four_case cases[] = {{"cnn", 1, 16, 16, AMPC_OPT_O0}, {"cnn", 1, 16, 16, AMPC_OPT_O2},
                                    {"resnet18", 3, 8, 8, AMPC_OPT_O0}, {"resnet18", 3, 8, 8, AMPC_OPT_O2}};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    rig r[2];
    float loss[2][4];
    unsigned char *bytes[2] = {NULL, NULL};
    size_t len[2] = {0, 0}, act[2];
    for (int f = 0; f < 2; f++) {
      ampc__cpu_bn_by_channel = f;
      int ok = four_steps(&r[f], &cases[c], 0, loss[f], &bytes[f], &len[f], &act[f]);
      ampc__cpu_bn_by_channel = 0;
      if (!ok) return;
    }
    const char *what = cases[c].model;
    CHECK_MSG(memcmp(loss[0], loss[1], sizeof loss[0]) == 0, "%s %s: losses differ between the two batch norm loops", what,
              ampc_opt_level_name(cases[c].lv));
    CHECK_MSG(len[0] == len[1] && memcmp(bytes[0], bytes[1], len[0]) == 0,
              "%s %s: parameters differ between the two batch norm loops", what, ampc_opt_level_name(cases[c].lv));
    for (int f = 0; f < 2; f++) {
      free(bytes[f]);
      rig_free(&r[f]);
    }
  }
}

TEST_MAIN(TEST_ENTRY(storage_types_per_level), TEST_ENTRY(o1_casts_a_shared_weight_once),
          TEST_ENTRY(overflow_skips_the_step_bit_identically), TEST_ENTRY(injected_nonfinite_gradient_skips_without_masters),
          TEST_ENTRY(dynamic_scale_grows_after_window_clean_steps), TEST_ENTRY(gradient_accumulation_sums_micro_batches),
          TEST_ENTRY(clipping_uses_the_unscaled_norm), TEST_ENTRY(loss_scaling_rescues_underflowing_f16_gradients),
          TEST_ENTRY(resume_restores_scaler_masters_and_optimizer_bit_identically),
          TEST_ENTRY(stochastic_rounding_moves_tiny_updates_reproducibly), TEST_ENTRY(refused_combinations),
          TEST_ENTRY(failed_initialize_leaves_the_graph_uncompiled),
          TEST_ENTRY(two_losses_overflow_in_one_backs_off_only_its_scaler),
          TEST_ENTRY(two_losses_backward_of_one_loss_touches_only_its_graph), TEST_ENTRY(two_losses_add_each_gradient_once),
          TEST_ENTRY(free_saved_gives_the_same_bits_in_less_memory),
          TEST_ENTRY(batchnorm_by_sample_gives_the_channel_loops_bits))
