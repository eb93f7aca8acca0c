/* The computation graph: recording, the precision pass, compilation
 * (backward schedule and memory), and execution through a backend. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <omp.h>

#include "core/graph_internal.h"
#include "core/status_internal.h"

static const char *const op_names[AMPC_OP_COUNT] = {
    "input", "labels", "param", "buffer", "conv2d", "batchnorm2d", "relu", "maxpool2d",
    "avgpool2d", "global_avgpool", "linear", "add", "flatten", "softmax", "log_softmax",
    "cross_entropy", "cast"};

const char *ampc_op_name(ampc_op_kind k) { return (unsigned)k < AMPC_OP_COUNT ? op_names[k] : "?"; }

/* The O1 op lists (apex / torch autocast): matrix products in half; norms,
 * softmaxes, losses and reductions in fp32; element-wise ops promote. */
ampc_cast_policy ampc_op_cast_policy(ampc_op_kind k) {
  switch (k) {
    case AMPC_OP_CONV2D:
    case AMPC_OP_LINEAR: return AMPC_CAST_POLICY_HALF;
    case AMPC_OP_BATCHNORM2D:
    case AMPC_OP_SOFTMAX:
    case AMPC_OP_LOG_SOFTMAX:
    case AMPC_OP_CROSS_ENTROPY:
    case AMPC_OP_GLOBAL_AVGPOOL: return AMPC_CAST_POLICY_FP32;
    case AMPC_OP_ADD: return AMPC_CAST_POLICY_PROMOTE;
    default: return AMPC_CAST_POLICY_KEEP;
  }
}

const char *ampc_mem_category_name(ampc_mem_category c) {
  static const char *const n[AMPC_MEM_COUNT] = {"parameters", "master_weights", "gradients",
                                                "optimizer_state", "activations", "workspace"};
  return (unsigned)c < AMPC_MEM_COUNT ? n[c] : "?";
}

char *ampc_shape_str(const ampc_shape *s, char *buf, size_t len) {
  size_t o = 0;
  o += (size_t)snprintf(buf + o, o < len ? len - o : 0, "(");
  for (int i = 0; i < s->ndim; i++)
    o += (size_t)snprintf(buf + o, o < len ? len - o : 0, "%s%lld", i ? ", " : "", (long long)s->d[i]);
  snprintf(buf + o, o < len ? len - o : 0, ")");
  return buf;
}

ampc_status ampc_graph_create(ampc_graph **out) {
  *out = NULL;
  ampc_graph *g = calloc(1, sizeof *g);
  if (!g) return ampc__error(AMPC_ENOMEM, "graph: out of memory");
  g->prec = (ampc_graph_precision){AMPC_DTYPE_F32, AMPC_DTYPE_F32, AMPC_DTYPE_F32, 0, AMPC_DTYPE_F16};
  g->be = ampc__backend_cpu();
  g->nthreads = omp_get_max_threads();
  g->max_batch = -1;
  g->fuse = 1;
  *out = g;
  return AMPC_OK;
}

void ampc_graph_free(ampc_graph *g) {
  if (!g) return;
  for (size_t i = 0; i < g->nv; i++) {
    free(g->v[i].name);
    free(g->v[i].init);
  }
  if (g->be) {
    g->be->free(g->param_arena);
    g->be->free(g->grad_arena);
    g->be->free(g->act_arena);
    g->be->free(g->actgrad_arena);
    g->be->free(g->ws);
  }
  free(g->v);
  free(g->bw_reach);
  free(g->bw_written);
  free(g->order);
  free(g->params);
  free(g->buffers);
  free(g);
}

ampc_status ampc_graph_status(const ampc_graph *g) { return g->err; }

/* Records the first error and returns NONE. */
static ampc_value fail(ampc_graph *g, ampc_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static ampc_value fail(ampc_graph *g, ampc_status code, const char *fmt, ...) {
  if (g->err == 0) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    g->err = ampc__error(code, "graph: %s", msg);
  }
  return AMPC_VALUE_NONE;
}

static int valid(const ampc_graph *g, ampc_value v) { return v >= 0 && (size_t)v < g->nv; }

static ampc_value add_value(ampc_graph *g, ampc_op_kind op, const char *name, ampc_shape shape) {
  if (g->err) return AMPC_VALUE_NONE;
  if (g->compiled) return fail(g, AMPC_ESTATE, "cannot record '%s' after compile", ampc_op_name(op));
  for (int i = 0; i < shape.ndim; i++)
    if (shape.d[i] <= 0) return fail(g, AMPC_EINVAL, "%s: dimension %d is %lld", ampc_op_name(op), i, (long long)shape.d[i]);
  if (g->nv == g->cap) {
    size_t cap = g->cap ? g->cap * 2 : 64;
    ampc__value *nv = realloc(g->v, cap * sizeof *nv);
    if (!nv) return fail(g, AMPC_ENOMEM, "out of memory");
    g->v = nv;
    g->cap = cap;
  }
  ampc__value *v = &g->v[g->nv];
  memset(v, 0, sizeof *v);
  v->op = op;
  v->shape = shape;
  v->store = shape;
  v->dtype = AMPC_DTYPE_F32;
  v->alias = AMPC_VALUE_NONE;
  v->pool_out = AMPC_VALUE_NONE;
  char buf[64];
  if (!name) {
    snprintf(buf, sizeof buf, "%s#%zu", ampc_op_name(op), g->nv);
    name = buf;
  }
  v->name = strdup(name);
  if (!v->name) return fail(g, AMPC_ENOMEM, "out of memory");
  return (ampc_value)g->nv++;
}

static ampc_value add_op(ampc_graph *g, ampc_op_kind op, ampc_shape shape, int n_in, const ampc_value *in) {
  if (g->err) return AMPC_VALUE_NONE;
  for (int i = 0; i < n_in; i++)
    if (in[i] != AMPC_VALUE_NONE && !valid(g, in[i]))
      return fail(g, AMPC_EINVAL, "%s: input %d is not a value of this graph", ampc_op_name(op), i);
  ampc_value r = add_value(g, op, NULL, shape);
  if (r < 0) return r;
  ampc__value *v = &g->v[r];
  v->n_in = n_in;
  for (int i = 0; i < n_in; i++) v->in[i] = in[i];
  v->batched = 1;
  return r;
}

static const ampc__value *val(const ampc_graph *g, ampc_value v) { return &g->v[v]; }

static int name_taken(const ampc_graph *g, const char *name) {
  for (size_t i = 0; i < g->nv; i++)
    if (g->v[i].op <= AMPC_OP_BUFFER && strcmp(g->v[i].name, name) == 0) return 1;
  return 0;
}

static ampc_value add_leaf(ampc_graph *g, ampc_op_kind op, const char *name, ampc_shape shape) {
  if (g->err) return AMPC_VALUE_NONE;
  if (!name || !*name) return fail(g, AMPC_EINVAL, "%s without a name", ampc_op_name(op));
  if (name_taken(g, name)) return fail(g, AMPC_EINVAL, "duplicate name '%s'", name);
  return add_value(g, op, name, shape);
}

static int64_t batch_of(ampc_graph *g, int64_t n) {
  if (g->max_batch < 0) g->max_batch = g->batch = n;
  return g->max_batch == n;
}

ampc_value ampc_graph_input(ampc_graph *g, const char *name, ampc_shape shape) {
  if (g->err) return AMPC_VALUE_NONE;
  if (shape.ndim < 1) return fail(g, AMPC_EINVAL, "input '%s' needs a batch dimension", name ? name : "");
  if (!batch_of(g, shape.d[0])) return fail(g, AMPC_EINVAL, "input '%s': batch %lld differs from %lld", name ? name : "", (long long)shape.d[0], (long long)g->max_batch);
  ampc_value r = add_leaf(g, AMPC_OP_INPUT, name, shape);
  if (r >= 0) g->v[r].batched = 1;
  return r;
}

ampc_value ampc_graph_labels(ampc_graph *g, const char *name, int64_t n) {
  if (g->err) return AMPC_VALUE_NONE;
  if (!batch_of(g, n)) return fail(g, AMPC_EINVAL, "labels '%s': batch %lld differs from %lld", name ? name : "", (long long)n, (long long)g->max_batch);
  ampc_value r = add_leaf(g, AMPC_OP_LABELS, name, ampc_shape1(n));
  if (r >= 0) {
    g->v[r].batched = 1;
    g->v[r].dtype = AMPC_DTYPE_I32;
  }
  return r;
}

/* Appends to the list of parameters or buffers, kept in recording order. */
static int list_push(ampc_value **list, size_t *n, size_t *cap, ampc_value v) {
  if (*n == *cap) {
    size_t c = *cap ? *cap * 2 : 64;
    ampc_value *l = realloc(*list, c * sizeof *l);
    if (!l) return -1;
    *list = l;
    *cap = c;
  }
  (*list)[(*n)++] = v;
  return 0;
}

static ampc_value leaf_with_init(ampc_graph *g, ampc_op_kind op, const char *name, ampc_shape shape, const float *init) {
  ampc_value r = add_leaf(g, op, name, shape);
  if (r < 0) return r;
  int pushed = op == AMPC_OP_PARAM ? list_push(&g->params, &g->nparams, &g->cap_params, r)
                                   : list_push(&g->buffers, &g->nbuffers, &g->cap_buffers, r);
  if (pushed < 0) return fail(g, AMPC_ENOMEM, "out of memory for '%s'", name);
  size_t n = (size_t)ampc_shape_numel(&shape);
  /* parameters are held at least twice more (the model's copy, gradients):
   * more than half the machine in recorded values cannot be trained or run */
  uint64_t phys = ampc__physical_memory(), bytes = (uint64_t)n * sizeof(float);
  if (phys && (bytes > phys / 2 || g->init_bytes + bytes > phys / 2))
    return fail(g, AMPC_ENOMEM, "'%s' %s would bring the parameters to %.1f GB, more than half of this machine's %.1f GB of memory",
                name, ampc_shape_str(&shape, (char[96]){0}, 96), (double)(g->init_bytes + bytes) / 1e9, (double)phys / 1e9);
  float *p = calloc(n, sizeof *p);
  if (!p) return fail(g, AMPC_ENOMEM, "out of memory for '%s'", name);
  g->init_bytes += bytes;
  if (init) memcpy(p, init, n * sizeof *p);
  g->v[r].init = p;
  return r;
}

uint64_t ampc__physical_memory(void) {
  long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && size > 0 ? (uint64_t)pages * (uint64_t)size : 0;
}

float *ampc__graph_init_data(ampc_graph *g, ampc_value v) {
  if (!valid(g, v) || (val(g, v)->op != AMPC_OP_PARAM && val(g, v)->op != AMPC_OP_BUFFER)) return NULL;
  return val(g, v)->init;
}

ampc_value ampc_graph_param(ampc_graph *g, const char *name, ampc_shape shape, int is_norm, const float *init) {
  ampc_value r = leaf_with_init(g, AMPC_OP_PARAM, name, shape, init);
  if (r >= 0) {
    g->v[r].is_norm = is_norm;
    g->v[r].requires_grad = 1;
    g->v[r].param_offset = g->param_numel;
    g->param_numel += (size_t)ampc_shape_numel(&shape);
  }
  return r;
}

ampc_value ampc_graph_buffer(ampc_graph *g, const char *name, ampc_dtype dtype, ampc_shape shape, const float *init) {
  if (g->err) return AMPC_VALUE_NONE;
  if (dtype != AMPC_DTYPE_F32 && dtype != AMPC_DTYPE_I64)
    return fail(g, AMPC_EINVAL, "buffer '%s': dtype %s (expected f32 or i64)", name ? name : "", ampc_dtype_name(dtype));
  ampc_value r = leaf_with_init(g, AMPC_OP_BUFFER, name, shape, init);
  if (r >= 0) g->v[r].dtype = dtype;
  return r;
}

static int is_float_value(const ampc_graph *g, ampc_value v) {
  return valid(g, v) && val(g, v)->op != AMPC_OP_LABELS && !(val(g, v)->op == AMPC_OP_BUFFER);
}

#define NEED(cond, ...) \
  do {                  \
    if (g->err) return AMPC_VALUE_NONE; \
    if (!(cond)) return fail(g, AMPC_EINVAL, __VA_ARGS__); \
  } while (0)

static int64_t pool_out(int64_t n, int k, int s, int p) { return (n + 2 * p - k) / s + 1; }

ampc_value ampc_graph_conv2d(ampc_graph *g, ampc_value x, ampc_value w, ampc_value b, int stride, int pad) {
  NEED(is_float_value(g, x) && is_float_value(g, w), "conv2d: invalid input or weight");
  const ampc_shape *xs = &val(g, x)->shape, *ws = &val(g, w)->shape;
  NEED(xs->ndim == 4 && ws->ndim == 4, "conv2d: expected 4-d input and weight");
  NEED(ws->d[1] == xs->d[1], "conv2d: weight has %lld input channels, input has %lld", (long long)ws->d[1], (long long)xs->d[1]);
  NEED(ws->d[2] == ws->d[3], "conv2d: only square kernels are supported");
  NEED(stride >= 1 && pad >= 0, "conv2d: stride %d, padding %d", stride, pad);
  NEED(b == AMPC_VALUE_NONE || (is_float_value(g, b) && val(g, b)->shape.ndim == 1 && val(g, b)->shape.d[0] == ws->d[0]), "conv2d: bias must have shape (%lld)", (long long)ws->d[0]);
  int k = (int)ws->d[2];
  int64_t oh = pool_out(xs->d[2], k, stride, pad), ow = pool_out(xs->d[3], k, stride, pad);
  NEED(oh >= 1 && ow >= 1, "conv2d: kernel %d larger than padded input", k);
  ampc_value in[3] = {x, w, b};
  ampc_value r = add_op(g, AMPC_OP_CONV2D, ampc_shape4(xs->d[0], ws->d[0], oh, ow), b == AMPC_VALUE_NONE ? 2 : 3, in);
  if (r >= 0) g->v[r].attr = (ampc__op_attr){.stride = stride, .pad = pad, .k = k};
  return r;
}

ampc_value ampc_graph_batchnorm2d(ampc_graph *g, ampc_value x, ampc_value gamma, ampc_value beta, ampc_value rm,
                                  ampc_value rv, ampc_value nbt, float momentum, float eps) {
  NEED(is_float_value(g, x) && val(g, x)->shape.ndim == 4, "batchnorm2d: expected a 4-d input");
  int64_t c = val(g, x)->shape.d[1];
  ampc_value chk[4] = {gamma, beta, rm, rv};
  for (int i = 0; i < 4; i++)
    NEED(valid(g, chk[i]) && val(g, chk[i])->shape.ndim == 1 && val(g, chk[i])->shape.d[0] == c, "batchnorm2d: parameter %d must have shape (%lld)", i, (long long)c);
  NEED(val(g, rm)->op == AMPC_OP_BUFFER && val(g, rv)->op == AMPC_OP_BUFFER, "batchnorm2d: running statistics must be buffers");
  NEED(nbt == AMPC_VALUE_NONE || (valid(g, nbt) && val(g, nbt)->dtype == AMPC_DTYPE_I64), "batchnorm2d: num_batches_tracked must be an i64 buffer");
  NEED(momentum >= 0 && momentum <= 1 && eps > 0, "batchnorm2d: momentum %g, eps %g", momentum, eps);
  ampc_value in[6] = {x, gamma, beta, rm, rv, nbt};
  ampc_value r = add_op(g, AMPC_OP_BATCHNORM2D, val(g, x)->shape, nbt == AMPC_VALUE_NONE ? 5 : 6, in);
  if (r >= 0) {
    g->v[r].attr.momentum = momentum;
    g->v[r].attr.eps = eps;
  }
  return r;
}

static ampc_value unary(ampc_graph *g, ampc_op_kind op, ampc_value x, ampc_shape out) {
  NEED(is_float_value(g, x), "%s: invalid input", ampc_op_name(op));
  return add_op(g, op, out, 1, &x);
}

ampc_value ampc_graph_relu(ampc_graph *g, ampc_value x) {
  NEED(is_float_value(g, x), "relu: invalid input");
  return unary(g, AMPC_OP_RELU, x, val(g, x)->shape);
}

static ampc_value pool(ampc_graph *g, ampc_op_kind op, ampc_value x, int k, int s, int p) {
  NEED(is_float_value(g, x) && val(g, x)->shape.ndim == 4, "%s: expected a 4-d input", ampc_op_name(op));
  NEED(k >= 1 && s >= 1 && p >= 0 && 2 * p <= k, "%s: kernel %d, stride %d, padding %d", ampc_op_name(op), k, s, p);
  const ampc_shape *xs = &val(g, x)->shape;
  int64_t oh = pool_out(xs->d[2], k, s, p), ow = pool_out(xs->d[3], k, s, p);
  NEED(oh >= 1 && ow >= 1, "%s: kernel %d larger than input", ampc_op_name(op), k);
  ampc_value r = unary(g, op, x, ampc_shape4(xs->d[0], xs->d[1], oh, ow));
  if (r >= 0) g->v[r].attr = (ampc__op_attr){.stride = s, .pad = p, .k = k};
  return r;
}

ampc_value ampc_graph_maxpool2d(ampc_graph *g, ampc_value x, int k, int s, int p) { return pool(g, AMPC_OP_MAXPOOL2D, x, k, s, p); }
ampc_value ampc_graph_avgpool2d(ampc_graph *g, ampc_value x, int k, int s, int p) { return pool(g, AMPC_OP_AVGPOOL2D, x, k, s, p); }

ampc_value ampc_graph_global_avgpool(ampc_graph *g, ampc_value x) {
  NEED(is_float_value(g, x) && val(g, x)->shape.ndim == 4, "global_avgpool: expected a 4-d input");
  const ampc_shape *xs = &val(g, x)->shape;
  return unary(g, AMPC_OP_GLOBAL_AVGPOOL, x, ampc_shape2(xs->d[0], xs->d[1]));
}

ampc_value ampc_graph_linear(ampc_graph *g, ampc_value x, ampc_value w, ampc_value b) {
  NEED(is_float_value(g, x) && is_float_value(g, w), "linear: invalid input or weight");
  const ampc_shape *xs = &val(g, x)->shape, *ws = &val(g, w)->shape;
  NEED(xs->ndim == 2 && ws->ndim == 2, "linear: expected a 2-d input and weight (flatten first)");
  NEED(ws->d[1] == xs->d[1], "linear: weight expects %lld features, input has %lld", (long long)ws->d[1], (long long)xs->d[1]);
  NEED(b == AMPC_VALUE_NONE || (is_float_value(g, b) && val(g, b)->shape.ndim == 1 && val(g, b)->shape.d[0] == ws->d[0]), "linear: bias must have shape (%lld)", (long long)ws->d[0]);
  ampc_value in[3] = {x, w, b};
  return add_op(g, AMPC_OP_LINEAR, ampc_shape2(xs->d[0], ws->d[0]), b == AMPC_VALUE_NONE ? 2 : 3, in);
}

ampc_value ampc_graph_add(ampc_graph *g, ampc_value a, ampc_value b) {
  NEED(is_float_value(g, a) && is_float_value(g, b), "add: invalid input");
  const ampc_shape *as = &val(g, a)->shape, *bs = &val(g, b)->shape;
  int same = as->ndim == bs->ndim;
  for (int i = 0; same && i < as->ndim; i++) same = as->d[i] == bs->d[i];
  char s1[64], s2[64];
  NEED(same, "add: shapes %s and %s differ", ampc_shape_str(as, s1, sizeof s1), ampc_shape_str(bs, s2, sizeof s2));
  ampc_value in[2] = {a, b};
  return add_op(g, AMPC_OP_ADD, *as, 2, in);
}

ampc_value ampc_graph_flatten(ampc_graph *g, ampc_value x) {
  NEED(is_float_value(g, x), "flatten: invalid input");
  const ampc_shape *xs = &val(g, x)->shape;
  int64_t rest = ampc_shape_numel(xs) / xs->d[0];
  ampc_value r = unary(g, AMPC_OP_FLATTEN, x, ampc_shape2(xs->d[0], rest));
  if (r >= 0) g->v[r].alias = x;
  return r;
}

ampc_value ampc_graph_softmax(ampc_graph *g, ampc_value x) {
  NEED(is_float_value(g, x) && val(g, x)->shape.ndim == 2, "softmax: expected a 2-d input");
  return unary(g, AMPC_OP_SOFTMAX, x, val(g, x)->shape);
}

ampc_value ampc_graph_log_softmax(ampc_graph *g, ampc_value x) {
  NEED(is_float_value(g, x) && val(g, x)->shape.ndim == 2, "log_softmax: expected a 2-d input");
  return unary(g, AMPC_OP_LOG_SOFTMAX, x, val(g, x)->shape);
}

ampc_value ampc_graph_cross_entropy(ampc_graph *g, ampc_value logits, ampc_value labels, float s) {
  NEED(is_float_value(g, logits) && val(g, logits)->shape.ndim == 2, "cross_entropy: logits must be 2-d");
  NEED(valid(g, labels) && val(g, labels)->op == AMPC_OP_LABELS, "cross_entropy: labels must come from ampc_graph_labels");
  NEED(val(g, labels)->shape.d[0] == val(g, logits)->shape.d[0], "cross_entropy: %lld labels for %lld rows", (long long)val(g, labels)->shape.d[0], (long long)val(g, logits)->shape.d[0]);
  NEED(s >= 0 && s <= 1, "cross_entropy: label_smoothing %g outside [0, 1]", s);
  ampc_value in[2] = {logits, labels};
  ampc_value r = add_op(g, AMPC_OP_CROSS_ENTROPY, ampc_shape1(1), 2, in);
  if (r >= 0) {
    g->v[r].attr.label_smoothing = s;
    g->v[r].batched = 0;
  }
  return r;
}

ampc_value ampc_graph_cast(ampc_graph *g, ampc_value x, ampc_dtype to) {
  NEED(is_float_value(g, x), "cast: invalid input");
  NEED(to == AMPC_DTYPE_F32 || to == AMPC_DTYPE_F16 || to == AMPC_DTYPE_BF16, "cast: to %s", ampc_dtype_name(to));
  ampc_value r = unary(g, AMPC_OP_CAST, x, val(g, x)->shape);
  if (r >= 0) {
    g->v[r].dtype = to;
    g->v[r].batched = val(g, x)->batched;
    g->v[r].attr.k = (int)to; /* the requested type survives the precision pass */
  }
  return r;
}

ampc_status ampc_graph_set_precision(ampc_graph *g, const ampc_graph_precision *p) {
  if (g->compiled) return ampc__error(AMPC_ESTATE, "graph: precision must be set before compile");
  ampc_dtype ts[4] = {p->param_type, p->norm_param_type, p->act_type, p->half_type};
  for (int i = 0; i < 4; i++)
    if (ts[i] != AMPC_DTYPE_F32 && ts[i] != AMPC_DTYPE_F16 && ts[i] != AMPC_DTYPE_BF16)
      return ampc__error(AMPC_EINVAL, "graph: precision type %s (expected f32, f16 or bf16)", ampc_dtype_name(ts[i]));
  g->prec = *p;
  return AMPC_OK;
}

/* ---------------- compile ---------------- */

static ampc_dtype wider(ampc_dtype a, ampc_dtype b) {
  if (a == b) return a;
  return AMPC_DTYPE_F32; /* f32 with anything, or f16 with bf16 */
}

/* Inserts a cast of value x to type t before the current op (reusing one made
 * earlier for the same value and type: a weight is cast once per step). */
static ampc_value cast_for(ampc_graph *g, ampc_value x, ampc_dtype t, ampc_value *cache) {
  if (g->v[x].dtype == t) return x;
  if (cache[x] >= 0 && g->v[cache[x]].dtype == t) return cache[x];
  g->compiled = 0;
  ampc_value c = ampc_graph_cast(g, x, t);
  if (c < 0) return c;
  g->order[g->norder++] = c;
  cache[x] = c;
  return c;
}

static ampc_status assign_types(ampc_graph *g, size_t n_recorded) {
  const ampc_graph_precision *p = &g->prec;
  /* Recorded ops run in recording order; casts the pass inserts go just before their user. */
  size_t cap = n_recorded * 4 + 8;
  g->order = calloc(cap, sizeof *g->order);
  ampc_value *cache = malloc(cap * sizeof *cache);
  if (!g->order || !cache) {
    free(cache);
    return ampc__error(AMPC_ENOMEM, "graph: out of memory");
  }
  for (size_t i = 0; i < cap; i++) cache[i] = AMPC_VALUE_NONE;
  if (g->cap < cap) {
    ampc__value *nv = realloc(g->v, cap * sizeof *nv);
    if (!nv) {
      free(cache);
      return ampc__error(AMPC_ENOMEM, "graph: out of memory");
    }
    g->v = nv;
    g->cap = cap;
  }
  for (size_t i = 0; i < n_recorded; i++) {
    ampc__value *v = &g->v[i];
    switch (v->op) {
      case AMPC_OP_INPUT: v->dtype = p->act_type; continue;
      case AMPC_OP_PARAM: v->dtype = v->is_norm ? p->norm_param_type : p->param_type; continue;
      case AMPC_OP_LABELS:
      case AMPC_OP_BUFFER: continue;
      default: break;
    }
    ampc_value id = (ampc_value)i;
    if (v->op == AMPC_OP_CAST) {
      v->dtype = (ampc_dtype)v->attr.k;
    } else if (v->op == AMPC_OP_FLATTEN) {
      v->dtype = g->v[v->in[0]].dtype;
    } else if (v->op == AMPC_OP_CROSS_ENTROPY) {
      /* the model's output goes to the loss in fp32 */
      ampc_value c = cast_for(g, g->v[id].in[0], AMPC_DTYPE_F32, cache);
      if (c < 0) break;
      g->v[id].in[0] = c;
      g->v[id].dtype = AMPC_DTYPE_F32;
    } else if (p->autocast) {
      switch (ampc_op_cast_policy(v->op)) {
        case AMPC_CAST_POLICY_HALF:
          for (int j = 0; j < g->v[id].n_in; j++) {
            ampc_value c = cast_for(g, g->v[id].in[j], p->half_type, cache);
            if (c < 0) break;
            g->v[id].in[j] = c;
          }
          g->v[id].dtype = p->half_type;
          break;
        case AMPC_CAST_POLICY_FP32: v->dtype = AMPC_DTYPE_F32; break;
        case AMPC_CAST_POLICY_PROMOTE: v->dtype = wider(g->v[v->in[0]].dtype, g->v[v->in[1]].dtype); break;
        case AMPC_CAST_POLICY_KEEP: v->dtype = g->v[v->in[0]].dtype; break;
      }
    } else {
      v->dtype = p->act_type;
    }
    if (g->err) break;
    /* an op's output follows the batch when one of its inputs does (a cast of a
     * weight does not); the loss is a scalar */
    int batched = 0;
    for (int j = 0; j < g->v[id].n_in; j++)
      if (g->v[id].in[j] >= 0 && g->v[g->v[id].in[j]].batched) batched = 1;
    g->v[id].batched = batched && g->v[id].op != AMPC_OP_CROSS_ENTROPY;
    g->order[g->norder++] = id;
  }
  free(cache);
  g->compiled = 0;
  return g->err;
}

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

static size_t value_bytes(const ampc__value *v) {
  return (size_t)ampc_shape_numel(&v->store) * ampc_dtype_size(v->dtype);
}

static ampc_value root_of(const ampc_graph *g, ampc_value x) {
  while (g->v[x].alias != AMPC_VALUE_NONE) x = g->v[x].alias;
  return x;
}

static ampc__op_call make_call(const ampc_graph *g, const ampc__value *v, int64_t batch);

/* A first-fit allocator over one arena's offsets, for planning. */
typedef struct {
  size_t *off, *len;
  size_t n, cap, top;
} plan_arena;

static size_t plan_alloc(plan_arena *a, size_t len) {
  for (size_t i = 0; i < a->n; i++)
    if (a->len[i] >= len) {
      size_t o = a->off[i];
      a->off[i] += len;
      a->len[i] -= len;
      if (a->len[i] == 0) {
        memmove(a->off + i, a->off + i + 1, (a->n - i - 1) * sizeof *a->off);
        memmove(a->len + i, a->len + i + 1, (a->n - i - 1) * sizeof *a->len);
        a->n--;
      }
      return o;
    }
  size_t o = a->top;
  a->top += len;
  return o;
}

static int plan_free(plan_arena *a, size_t off, size_t len) {
  if (a->n == a->cap) {
    size_t cap = a->cap ? a->cap * 2 : 64;
    size_t *no = realloc(a->off, cap * sizeof *no);
    if (!no) return -1;
    a->off = no;
    size_t *nl = realloc(a->len, cap * sizeof *nl);
    if (!nl) return -1;
    a->len = nl;
    a->cap = cap;
  }
  size_t i = 0;
  while (i < a->n && a->off[i] < off) i++;
  memmove(a->off + i + 1, a->off + i, (a->n - i) * sizeof *a->off);
  memmove(a->len + i + 1, a->len + i, (a->n - i) * sizeof *a->len);
  a->off[i] = off;
  a->len[i] = len;
  a->n++;
  /* coalesce with the neighbours */
  if (i + 1 < a->n && a->off[i] + a->len[i] == a->off[i + 1]) {
    a->len[i] += a->len[i + 1];
    memmove(a->off + i + 1, a->off + i + 2, (a->n - i - 2) * sizeof *a->off);
    memmove(a->len + i + 1, a->len + i + 2, (a->n - i - 2) * sizeof *a->len);
    a->n--;
  }
  if (i > 0 && a->off[i - 1] + a->len[i - 1] == a->off[i]) {
    a->len[i - 1] += a->len[i];
    memmove(a->off + i, a->off + i + 1, (a->n - i - 1) * sizeof *a->off);
    memmove(a->len + i, a->len + i + 1, (a->n - i - 1) * sizeof *a->len);
    a->n--;
  }
  /* give the top back */
  if (a->n && a->off[a->n - 1] + a->len[a->n - 1] == a->top) {
    a->top = a->off[a->n - 1];
    a->n--;
  }
  return 0;
}

/* Whether op v's backward reads its inputs, or its own output. */
static int bwd_reads_inputs(const ampc__value *v) {
  switch (v->op) {
    case AMPC_OP_CONV2D:
    case AMPC_OP_LINEAR:
    case AMPC_OP_BATCHNORM2D:
    case AMPC_OP_MAXPOOL2D:
    case AMPC_OP_CROSS_ENTROPY: return 1;
    default: return 0; /* relu, add, average pools, softmax, cast: not their inputs */
  }
}
static int bwd_reads_output(const ampc__value *v) {
  switch (v->op) {
    case AMPC_OP_RELU:
    case AMPC_OP_SOFTMAX:
    case AMPC_OP_LOG_SOFTMAX: return 1;
    case AMPC_OP_BATCHNORM2D:
    case AMPC_OP_ADD: return v->attr.relu; /* the fused ReLU's mask */
    default: return 0;
  }
}

/* Plans the activation arena. A value backward reads (or that the user may
 * read: inputs, labels, values nothing consumes, kept ones, everything under
 * retain_grads) lives from its op to the end; any other lives only until its
 * last consumer has run in forward, and its memory is then reused. Sets
 * v->act_off and returns the arena size and its bytes by type at the peak. */
static ampc_status plan_activations(ampc_graph *g, size_t *arena, size_t *peak_by_type) {
  size_t nv = g->nv;
  int64_t *last_use = malloc(nv * sizeof *last_use);
  char *needed = calloc(nv, 1), *done = calloc(nv, 1);
  size_t live_by_type[AMPC_DTYPE_COUNT] = {0};
  plan_arena a = {0};
  ampc_status st = AMPC_OK;
  if (!last_use || !needed || !done) st = ampc__error(AMPC_ENOMEM, "graph: out of memory planning");
  for (size_t i = 0; st == 0 && i < nv; i++) {
    last_use[i] = -1;
    g->v[i].act_off = SIZE_MAX;
    const ampc__value *v = &g->v[i];
    if (v->op == AMPC_OP_INPUT || v->op == AMPC_OP_LABELS || v->keep || g->retain_grads) needed[root_of(g, (ampc_value)i)] = 1;
  }
  for (size_t k = 0; st == 0 && k < g->norder; k++) {
    ampc__value *v = &g->v[g->order[k]];
    if (v->alias != AMPC_VALUE_NONE) continue;
    for (int j = 0; j < v->n_in; j++) {
      if (v->in[j] < 0) continue;
      ampc_value r = root_of(g, v->in[j]);
      last_use[r] = (int64_t)k;
      if (bwd_reads_inputs(v)) needed[r] = 1;
    }
    if (bwd_reads_output(v)) needed[g->order[k]] = 1;
  }
  size_t peak = 0;
  /* leaves and values outside the order first, for good */
  for (size_t i = 0; st == 0 && i < nv; i++) {
    ampc__value *v = &g->v[i];
    if (v->op == AMPC_OP_PARAM || v->op == AMPC_OP_BUFFER || v->alias != AMPC_VALUE_NONE) continue;
    if (v->op != AMPC_OP_INPUT && v->op != AMPC_OP_LABELS) continue;
    v->act_off = plan_alloc(&a, align64(value_bytes(v)));
    live_by_type[v->dtype] += value_bytes(v);
  }
  for (size_t k = 0; st == 0 && k < g->norder; k++) {
    ampc_value id = g->order[k];
    ampc__value *v = &g->v[id];
    if (v->alias != AMPC_VALUE_NONE || v->act_off != SIZE_MAX || v->op <= AMPC_OP_BUFFER) continue;
    if (last_use[id] < 0) needed[id] = 1; /* an output: nothing consumes it */
    v->act_off = plan_alloc(&a, align64(value_bytes(v)));
    live_by_type[v->dtype] += value_bytes(v);
    if (a.top > peak) {
      peak = a.top;
      memcpy(peak_by_type, live_by_type, sizeof live_by_type);
    }
    for (int j = 0; j < v->n_in; j++) {
      if (v->in[j] < 0) continue;
      ampc_value r = root_of(g, v->in[j]);
      ampc__value *rv = &g->v[r];
      if (needed[r] || done[r] || last_use[r] != (int64_t)k || rv->act_off == SIZE_MAX || rv->op <= AMPC_OP_BUFFER) continue;
      done[r] = 1;
      live_by_type[rv->dtype] -= value_bytes(rv);
      if (plan_free(&a, rv->act_off, align64(value_bytes(rv))) < 0) st = ampc__error(AMPC_ENOMEM, "graph: out of memory planning");
    }
  }
  if (a.top > peak) {
    peak = a.top;
    memcpy(peak_by_type, live_by_type, sizeof live_by_type);
  }
  /* anything left unplaced (not reached by the order) gets its own space */
  for (size_t i = 0; st == 0 && i < nv; i++) {
    ampc__value *v = &g->v[i];
    if (v->op == AMPC_OP_PARAM || v->op == AMPC_OP_BUFFER || v->alias != AMPC_VALUE_NONE || v->act_off != SIZE_MAX) continue;
    v->act_off = peak;
    peak += align64(value_bytes(v));
    peak_by_type[v->dtype] += value_bytes(v);
  }
  *arena = peak;
  free(last_use);
  free(needed);
  free(done);
  free(a.off);
  free(a.len);
  return st;
}

/* Plans the activation-gradient arena. The gradient of a value lives from its
 * last consumer's backward (which writes it first) to its own op's backward
 * (which reads it last); buffers whose lifetimes do not overlap share memory.
 * Sets v->grad_off (SIZE_MAX: no gradient buffer) and returns the arena size. */
static ampc_status plan_activation_grads(ampc_graph *g, size_t *arena, size_t *peak_by_type) {
  size_t nv = g->nv;
  int64_t *pos = malloc(nv * sizeof *pos), *last_use = malloc(nv * sizeof *last_use);
  size_t *live_by_type = calloc(AMPC_DTYPE_COUNT, sizeof *live_by_type);
  plan_arena a = {0};
  ampc_status st = AMPC_OK;
  if (!pos || !last_use || !live_by_type) st = ampc__error(AMPC_ENOMEM, "graph: out of memory planning");
  for (size_t i = 0; st == 0 && i < nv; i++) {
    pos[i] = last_use[i] = -1;
    g->v[i].grad_off = SIZE_MAX;
  }
  for (size_t k = 0; st == 0 && k < g->norder; k++) {
    ampc__value *v = &g->v[g->order[k]];
    pos[g->order[k]] = (int64_t)k;
    if (v->alias != AMPC_VALUE_NONE) continue;
    for (int j = 0; j < v->n_in; j++)
      if (v->in[j] >= 0) last_use[root_of(g, v->in[j])] = (int64_t)k;
  }
  size_t peak = 0;
  for (int64_t t = (int64_t)g->norder - 1; st == 0 && t >= 0; t--) {
    ampc__value *v = &g->v[g->order[t]];
    for (int j = 0; j < v->n_in && v->alias == AMPC_VALUE_NONE; j++) {
      if (v->in[j] < 0) continue;
      ampc_value r = root_of(g, v->in[j]);
      ampc__value *rv = &g->v[r];
      if (!rv->requires_grad || rv->op <= AMPC_OP_BUFFER || rv->grad_off != SIZE_MAX || last_use[r] != t) continue;
      rv->grad_off = plan_alloc(&a, align64(value_bytes(rv)));
      live_by_type[rv->dtype] += value_bytes(rv);
      if (a.top > peak) {
        peak = a.top;
        memcpy(peak_by_type, live_by_type, AMPC_DTYPE_COUNT * sizeof *live_by_type);
      }
    }
    /* after this op's backward its own output gradient is dead */
    if (v->alias == AMPC_VALUE_NONE && v->grad_off != SIZE_MAX && !g->retain_grads) {
      live_by_type[v->dtype] -= value_bytes(v);
      if (plan_free(&a, v->grad_off, align64(value_bytes(v))) < 0) st = ampc__error(AMPC_ENOMEM, "graph: out of memory planning");
    }
  }
  *arena = peak;
  free(pos);
  free(last_use);
  free(live_by_type);
  free(a.off);
  free(a.len);
  return st;
}

ampc_status ampc_graph_compile(ampc_graph *g) {
  if (g->err) return g->err;
  if (g->compiled) return AMPC_OK;
  if (g->nv == 0 || g->max_batch < 1) return ampc__error(AMPC_ESTATE, "graph: nothing to compile (no input)");
  size_t n_recorded = g->nv;
  AMPC_TRY(assign_types(g, n_recorded));
  const ampc__backend *be = g->be;

  /* which values need a gradient */
  for (size_t k = 0; k < g->norder; k++) {
    ampc__value *v = &g->v[g->order[k]];
    v->requires_grad = 0;
    for (int j = 0; j < v->n_in; j++)
      if (v->in[j] >= 0 && g->v[v->in[j]].requires_grad && g->v[v->in[j]].op != AMPC_OP_BUFFER) v->requires_grad = 1;
  }

  /* A ReLU whose input is a batch norm or an add used by nothing else runs
   * inside that op: the ReLU's value becomes a view of the op's output, which
   * saves one activation, its gradient and two passes over memory. */
  int *uses = calloc(g->nv, sizeof *uses);
  if (!uses) return ampc__error(AMPC_ENOMEM, "graph: out of memory");
  for (size_t k = 0; k < g->norder; k++) {
    const ampc__value *v = &g->v[g->order[k]];
    for (int j = 0; j < v->n_in; j++)
      if (v->in[j] >= 0) uses[v->in[j]]++;
  }
  for (size_t k = 0; k < g->norder; k++) {
    ampc__value *r = &g->v[g->order[k]];
    if (r->op != AMPC_OP_RELU || !g->fuse) continue;
    ampc__value *x = &g->v[r->in[0]];
    if ((x->op == AMPC_OP_BATCHNORM2D || x->op == AMPC_OP_ADD) && uses[r->in[0]] == 1 && x->dtype == r->dtype &&
        x->alias == AMPC_VALUE_NONE && !x->keep) { /* a kept value keeps its pre-ReLU values */
      x->attr.relu = 1;
      r->alias = r->in[0];
    }
  }
  /* A 2x2 stride-2 max pool that is the only reader of a batch norm (and its
   * fused ReLU) runs inside the batch norm too: the full-size output is never
   * stored, the batch norm writes the pooled planes and keeps each window's
   * winner for backward, which sends the pooled gradient straight there. */
  for (size_t k = 0; k < g->norder; k++) {
    ampc__value *p = &g->v[g->order[k]];
    if (p->op != AMPC_OP_MAXPOOL2D || !g->fuse || g->retain_grads) continue;
    if (p->attr.k != 2 || p->attr.stride != 2 || p->attr.pad != 0) continue;
    ampc_value in = p->in[0], b = root_of(g, in);
    ampc__value *bv = &g->v[b];
    if (bv->op != AMPC_OP_BATCHNORM2D || bv->keep || g->v[in].keep || uses[in] != 1 || (in != b && uses[b] != 1) ||
        bv->dtype != p->dtype || bv->pool_out != AMPC_VALUE_NONE)
      continue;
    bv->attr.pool = 1;
    bv->pool_out = g->order[k];
    bv->store = p->shape;
    p->alias = b;
  }
  free(uses);

  /* params and buffers in recording order; flat element offsets */
  memset(g->bytes_by_type, 0, sizeof g->bytes_by_type);
  size_t pb = 0, ab = 0, agb = 0, ws = 0;
  for (size_t i = 0; i < g->nv; i++) {
    ampc__value *v = &g->v[i];
    if (v->op == AMPC_OP_PARAM || v->op == AMPC_OP_BUFFER) pb += align64(value_bytes(v));
  }
  /* activations: every op output except aliases, inputs and labels, planned */
  size_t ab_by_type[AMPC_DTYPE_COUNT] = {0};
  AMPC_TRY(plan_activations(g, &ab, ab_by_type));
  size_t values_bytes = ab;
  size_t agb_by_type[AMPC_DTYPE_COUNT] = {0};
  AMPC_TRY(plan_activation_grads(g, &agb, agb_by_type));
  for (int t = 0; t < AMPC_DTYPE_COUNT; t++) g->bytes_by_type[3][t] = agb_by_type[t];
  /* saved state and workspace per op */
  for (size_t k = 0; k < g->norder; k++) {
    ampc__value *v = &g->v[g->order[k]];
    ampc__op_call c = make_call(g, v, g->max_batch);
    v->aux_floats = be->aux_floats(&c);
    ab += align64(v->aux_floats * sizeof(float));
    size_t w = be->workspace(&c, g->nthreads);
    if (w > ws) ws = w;
  }
  size_t gb = 0;
  for (size_t i = 0; i < g->nparams; i++) gb += align64(value_bytes(&g->v[g->params[i]]));

  /* the whole plan must fit in the machine before any of it is allocated */
  uint64_t phys = ampc__physical_memory(), total = (uint64_t)pb + gb + ab + agb + ws;
  if (phys && total > phys)
    return ampc__error(AMPC_ENOMEM,
                       "graph: batch %lld needs %.1f GB (activations %.1f, their gradients %.1f, parameters and "
                       "gradients %.1f, workspace %.1f), more than this machine's %.1f GB of memory",
                       (long long)g->max_batch, (double)total / 1e9, (double)ab / 1e9, (double)agb / 1e9,
                       (double)(pb + gb) / 1e9, (double)ws / 1e9, (double)phys / 1e9);
  g->param_arena = be->alloc(pb ? pb : 64);
  g->grad_arena = be->alloc(gb ? gb : 64);
  g->act_arena = be->alloc(ab ? ab : 64);
  g->actgrad_arena = be->alloc(agb ? agb : 64);
  g->ws = be->alloc(ws ? ws : 64);
  if (!g->param_arena || !g->grad_arena || !g->act_arena || !g->actgrad_arena || !g->ws)
    return ampc__error(AMPC_ENOMEM, "graph: out of memory allocating %zu bytes of activations", ab);
  g->param_bytes = pb; g->grad_bytes = gb; g->act_bytes = ab; g->actgrad_bytes = agb; g->ws_bytes = ws;

  char *pp = g->param_arena, *gp = g->grad_arena, *ap = g->act_arena, *agp = g->actgrad_arena;
  for (size_t i = 0; i < g->nv; i++) {
    ampc__value *v = &g->v[i];
    size_t nb = value_bytes(v);
    if (v->op == AMPC_OP_PARAM || v->op == AMPC_OP_BUFFER) {
      v->data = pp;
      pp += align64(nb);
      g->bytes_by_type[0][v->dtype] += nb;
      size_t n = (size_t)ampc_shape_numel(&v->shape);
      if (v->dtype == AMPC_DTYPE_I64) {
        for (size_t e = 0; e < n; e++) ((int64_t *)v->data)[e] = (int64_t)v->init[e];
      } else {
        ampc_store_f32(v->dtype, v->data, v->init, n);
      }
      if (v->op == AMPC_OP_PARAM) {
        v->grad = gp;
        gp += align64(nb);
        g->bytes_by_type[1][v->dtype] += nb;
      }
    } else if (v->alias == AMPC_VALUE_NONE) {
      v->data = ap + v->act_off;
      if (v->grad_off != SIZE_MAX) v->grad = agp + v->grad_off;
    }
  }
  for (int t = 0; t < AMPC_DTYPE_COUNT; t++) g->bytes_by_type[2][t] += ab_by_type[t];
  ap += values_bytes;
  for (size_t k = 0; k < g->norder; k++) {
    ampc__value *v = &g->v[g->order[k]];
    if (v->aux_floats) {
      v->aux = (float *)ap;
      ap += align64(v->aux_floats * sizeof(float));
      g->bytes_by_type[2][AMPC_DTYPE_F32] += v->aux_floats * sizeof(float);
    }
  }
  for (size_t i = 0; i < g->nv; i++) {
    ampc__value *v = &g->v[i];
    if (v->alias != AMPC_VALUE_NONE) {
      ampc__value *r = &g->v[root_of(g, (ampc_value)i)];
      v->data = r->data;
      v->grad = r->grad;
    }
  }

  g->bw_reach = calloc(g->nv, 1);
  g->bw_written = calloc(g->nv, 1);
  if (!g->bw_reach || !g->bw_written) return ampc__error(AMPC_ENOMEM, "graph: out of memory");
  g->batch = g->max_batch;
  g->ws_threads = g->nthreads;
  g->compiled = 1;
  return AMPC_OK;
}

int ampc_graph_is_compiled(const ampc_graph *g) { return g->compiled; }

/* ---------------- execution ---------------- */

/* A value's tensor with the given shape (its own or its memory's) at batch. */
static ampc_tensor view_as(const ampc__value *v, const ampc_shape *shape, void *data, int64_t batch) {
  ampc_tensor t = {data, v->dtype, *shape};
  if (v->batched && t.shape.ndim > 0) t.shape.d[0] = batch;
  return t;
}
static ampc_tensor view(const ampc_graph *g, const ampc__value *v, void *data, int64_t batch) {
  return view_as(v, &v->store, data, batch);
}

static ampc__op_call make_call(const ampc_graph *g, const ampc__value *v, int64_t batch) {
  ampc__op_call c;
  memset(&c, 0, sizeof c);
  c.op = v->op;
  c.n_in = v->n_in;
  for (int j = 0; j < v->n_in; j++) {
    if (v->in[j] < 0) continue;
    const ampc__value *x = &g->v[v->in[j]];
    c.in[j] = view(g, x, x->data, batch);
    if (x->requires_grad && x->op != AMPC_OP_BUFFER) c.din[j] = view(g, x, x->grad, batch);
    else c.din[j].data = NULL;
  }
  c.out = view(g, v, v->data, batch);
  c.dout = view(g, v, v->grad, batch);
  c.attr = v->attr;
  c.aux = v->aux;
  c.ws = g->ws;
  c.ws_size = g->ws_bytes;
  c.nthreads = g->nthreads;
  c.conv_algo = g->conv_algo;
  return c;
}

ampc_status ampc_graph_set_batch(ampc_graph *g, int64_t n) {
  if (n < 1 || n > g->max_batch)
    return ampc__error(AMPC_EINVAL, "graph: batch %lld outside 1..%lld", (long long)n, (long long)g->max_batch);
  g->batch = n;
  return AMPC_OK;
}
int64_t ampc_graph_batch(const ampc_graph *g) { return g->batch; }
int64_t ampc_graph_max_batch(const ampc_graph *g) { return g->max_batch; }
void ampc_graph_set_threads(ampc_graph *g, int n) {
  if (n <= 0) n = omp_get_max_threads();
  /* the workspace is laid out for the thread count at compile time */
  if (g->compiled && n > g->ws_threads) n = g->ws_threads;
  g->nthreads = n;
}

/* Runs one kernel, timing it into times[op] when profiling. */
static ampc_status run_kernel(ampc_graph *g, ampc__kernel_fn f, const ampc__op_call *c, double *times, const char *pass) {
  AMPC_ASSERT(f != NULL);
  double t0 = g->profiling ? omp_get_wtime() : 0.0;
  ampc_status s = f(c);
  if (g->profiling) times[c->op] += omp_get_wtime() - t0;
  if (s < 0) return ampc__error_prefix(s, "%s %s", ampc_op_name(c->op), pass);
  return AMPC_OK;
}

ampc_status ampc_graph_forward(ampc_graph *g, int training) {
  AMPC_TRY(ampc_graph_compile(g));
  for (size_t k = 0; k < g->norder; k++) {
    ampc__value *v = &g->v[g->order[k]];
    if (v->alias != AMPC_VALUE_NONE) continue; /* views: flatten, fused relu */
    ampc__op_call c = make_call(g, v, g->batch);
    c.training = training;
    AMPC_TRY(run_kernel(g, g->be->fwd[v->op], &c, g->t_fwd, "forward"));
  }
  return AMPC_OK;
}

ampc_status ampc_graph_backward(ampc_graph *g, ampc_value loss, float seed, int accumulate) {
  if (!g->compiled) return ampc__error(AMPC_ESTATE, "graph: backward before forward");
  if (!valid(g, loss) || g->v[loss].op != AMPC_OP_CROSS_ENTROPY)
    return ampc__error(AMPC_EINVAL, "graph: backward needs a loss value");
  /* only the ops this loss depends on run; the first to produce a value's
   * gradient overwrites it (a parameter's: unless accumulating), later ones add */
  unsigned char *reach = g->bw_reach, *written = g->bw_written;
  memset(reach, 0, g->nv);
  memset(written, 0, g->nv);
  reach[loss] = 1;
  for (size_t k = g->norder; k-- > 0;) {
    ampc_value id = g->order[k];
    ampc__value *v = &g->v[id];
    if (!reach[id]) continue;
    if (v->alias != AMPC_VALUE_NONE) reach[v->alias] = 1;
    for (int j = 0; j < v->n_in; j++)
      if (v->in[j] >= 0) reach[v->in[j]] = 1;
  }
  for (size_t k = g->norder; k-- > 0;) {
    ampc_value id = g->order[k];
    ampc__value *v = &g->v[id];
    if (!reach[id] || v->alias != AMPC_VALUE_NONE || !v->requires_grad) continue;
    /* an output nothing differentiates (not the loss, which is seeded) has no gradient */
    if (!v->grad && v->op != AMPC_OP_CROSS_ENTROPY) continue;
    ampc__op_call c = make_call(g, v, g->batch);
    c.training = 1;
    c.seed = seed;
    for (int j = 0; j < v->n_in; j++) {
      if (v->in[j] < 0 || !c.din[j].data) continue;
      ampc_value r = root_of(g, v->in[j]);
      c.din_acc[j] = written[r] ? 1 : (g->v[r].op == AMPC_OP_PARAM ? accumulate : 0);
      written[r] = 1;
    }
    c.timers = g->profiling ? g->t_conv_split : NULL;
    c.grad_stats = g->count_underflow ? g->grad_stats : NULL;
    AMPC_TRY(run_kernel(g, g->be->bwd[v->op], &c, g->t_bwd, "backward"));
  }
  return AMPC_OK;
}

void ampc_graph_set_grad_underflow_counting(ampc_graph *g, int on) { g->count_underflow = on != 0; }

void ampc_graph_zero_grad(ampc_graph *g) {
  if (g->grad_arena) memset(g->grad_arena, 0, g->grad_bytes);
}

ampc_status ampc_graph_keep(ampc_graph *g, ampc_value v) {
  if (g->err) return g->err; /* keep the first error's message: v is NONE because of it */
  if (g->compiled) return ampc__error(AMPC_ESTATE, "graph: values to keep must be chosen before compile");
  if (!valid(g, v)) return ampc__error(AMPC_EINVAL, "graph: keep of an invalid value %d", (int)v);
  g->v[v].keep = 1;
  return AMPC_OK;
}

ampc_status ampc_graph_set_conv_algo(ampc_graph *g, ampc_conv_algo a) {
  if (g->compiled) return ampc__error(AMPC_ESTATE, "graph: the convolution algorithm must be chosen before compile");
  if (a < AMPC_CONV_AUTO || a > AMPC_CONV_DIRECT)
    return ampc__error(AMPC_EINVAL, "graph: unknown convolution algorithm %d", (int)a);
  g->conv_algo = a;
  return AMPC_OK;
}

ampc_status ampc_graph_set_retain_grads(ampc_graph *g, int on) {
  if (g->compiled) return ampc__error(AMPC_ESTATE, "graph: retain_grads must be chosen before compile");
  g->retain_grads = on;
  return AMPC_OK;
}

ampc_status ampc_graph_set_fusion(ampc_graph *g, int on) {
  if (g->compiled) return ampc__error(AMPC_ESTATE, "graph: fusion must be chosen before compile");
  g->fuse = on;
  return AMPC_OK;
}

void ampc_graph_set_profiling(ampc_graph *g, int on) {
  g->profiling = on;
  memset(g->t_fwd, 0, sizeof g->t_fwd);
  memset(g->t_bwd, 0, sizeof g->t_bwd);
  memset(g->t_conv_split, 0, sizeof g->t_conv_split);
}

void ampc_graph_grad_underflow(ampc_graph *g, int64_t *values, int64_t *underflow, int reset) {
  *values = g->grad_stats[0];
  *underflow = g->grad_stats[1];
  if (reset) g->grad_stats[0] = g->grad_stats[1] = 0;
}

void ampc_graph_conv_backward_times(const ampc_graph *g, double *data, double *weights) {
  *data = g->t_conv_split[0];
  *weights = g->t_conv_split[1];
}

double ampc_graph_forward_flops(const ampc_graph *g) {
  double f = 0.0;
  for (size_t i = 0; i < g->nv; i++) {
    const ampc__value *v = &g->v[i];
    if (v->op == AMPC_OP_CONV2D) {
      const ampc_shape *w = &g->v[v->in[1]].shape;
      f += 2.0 * (double)ampc_shape_numel(&v->shape) * (double)(w->d[1] * w->d[2] * w->d[3]);
    } else if (v->op == AMPC_OP_LINEAR) {
      f += 2.0 * (double)ampc_shape_numel(&v->shape) * (double)g->v[v->in[1]].shape.d[1];
    }
  }
  return f;
}

void ampc_graph_op_times(const ampc_graph *g, double fwd[AMPC_OP_COUNT], double bwd[AMPC_OP_COUNT]) {
  memcpy(fwd, g->t_fwd, sizeof g->t_fwd);
  memcpy(bwd, g->t_bwd, sizeof g->t_bwd);
}

/* ---------------- access ---------------- */

/* A batch norm whose max pool was fused into it, and its fused ReLU, have no
 * full-size values (their memory holds the pool's): their tensors say their
 * type and shape, with no data. */
static ampc_tensor value_tensor(const ampc_graph *g, ampc_value v, void *data) {
  ampc_tensor t = {0};
  if (!valid(g, v)) return t;
  ampc_value r = root_of(g, v);
  if (g->v[r].pool_out != AMPC_VALUE_NONE && g->v[r].pool_out != v) return view_as(&g->v[v], &g->v[v].shape, NULL, g->batch);
  return view(g, &g->v[v], data, g->batch);
}
ampc_tensor ampc_graph_tensor(const ampc_graph *g, ampc_value v) { return value_tensor(g, v, valid(g, v) ? g->v[v].data : NULL); }
ampc_tensor ampc_graph_grad(const ampc_graph *g, ampc_value v) { return value_tensor(g, v, valid(g, v) ? g->v[v].grad : NULL); }
const char *ampc_graph_name(const ampc_graph *g, ampc_value v) { return valid(g, v) ? g->v[v].name : NULL; }
ampc_op_kind ampc_graph_op(const ampc_graph *g, ampc_value v) { return valid(g, v) ? g->v[v].op : AMPC_OP_COUNT; }
ampc_value ampc_graph_find(const ampc_graph *g, const char *name) {
  for (size_t i = 0; i < g->nv; i++)
    if (strcmp(g->v[i].name, name) == 0) return (ampc_value)i;
  return AMPC_VALUE_NONE;
}
size_t ampc_graph_value_count(const ampc_graph *g) { return g->nv; }
size_t ampc_graph_param_count(const ampc_graph *g) { return g->nparams; }
ampc_value ampc_graph_param_at(const ampc_graph *g, size_t i) { return i < g->nparams ? g->params[i] : AMPC_VALUE_NONE; }
int ampc_graph_param_is_norm(const ampc_graph *g, ampc_value v) { return valid(g, v) && g->v[v].is_norm; }
size_t ampc_graph_param_numel(const ampc_graph *g) { return g->param_numel; }
size_t ampc_graph_param_offset(const ampc_graph *g, ampc_value v) { return valid(g, v) ? g->v[v].param_offset : 0; }
size_t ampc_graph_buffer_count(const ampc_graph *g) { return g->nbuffers; }
ampc_value ampc_graph_buffer_at(const ampc_graph *g, size_t i) { return i < g->nbuffers ? g->buffers[i] : AMPC_VALUE_NONE; }
const float *ampc_graph_param_init(const ampc_graph *g, ampc_value v) { return valid(g, v) ? g->v[v].init : NULL; }

void ampc_graph_release_init(ampc_graph *g) {
  if (!g->compiled) return; /* compile still needs them */
  for (size_t i = 0; i < g->nv; i++) {
    free(g->v[i].init);
    g->v[i].init = NULL;
  }
}

void ampc_graph_memory(const ampc_graph *g, ampc_mem_report *r) {
  memset(r, 0, sizeof *r);
  for (int t = 0; t < AMPC_DTYPE_COUNT; t++) {
    r->bytes[AMPC_MEM_PARAMETERS][t] = g->bytes_by_type[0][t];
    r->bytes[AMPC_MEM_GRADIENTS][t] = g->bytes_by_type[1][t];
    /* forward values and the gradients flowing back through them */
    r->bytes[AMPC_MEM_ACTIVATIONS][t] = g->bytes_by_type[2][t] + g->bytes_by_type[3][t];
  }
  r->bytes[AMPC_MEM_WORKSPACE][AMPC_DTYPE_F32] = g->ws_bytes;
}
