/* The computation graph: recording values and ops, recording options, and
 * access by value (see graph_internal.h for the other parts). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/graph_internal.h"
#include "core/status_internal.h"

static const char *const op_names[AMPC_OP_COUNT] = {
    "input", "labels", "param", "buffer", "conv2d", "batchnorm2d", "relu", "maxpool2d",
    "avgpool2d", "global_avgpool", "linear", "add", "flatten", "softmax", "log_softmax",
    "cross_entropy", "cast"};

const char *ampc_op_name(ampc_op_kind k) { return (unsigned)k < AMPC_OP_COUNT ? op_names[k] : "?"; }

const char *ampc_mem_category_name(ampc_mem_category c) {
  static const char *const n[AMPC_MEM_COUNT] = {"parameters", "master_weights", "gradients",
                                                "optimizer_state", "activations", "workspace"};
  return (unsigned)c < AMPC_MEM_COUNT ? n[c] : "?";
}

char *ampc_shape_str(const ampc_shape *s, char *buf, size_t len) {
  if (!buf || !len) return buf;
  if (!s) {
    snprintf(buf, len, "(?)");
    return buf;
  }
  size_t o = 0;
  o += (size_t)snprintf(buf + o, o < len ? len - o : 0, "(");
  int nd = s->ndim < 0 ? 0 : s->ndim > AMPC_MAX_DIMS ? AMPC_MAX_DIMS : s->ndim;
  for (int i = 0; i < nd; i++)
    o += (size_t)snprintf(buf + o, o < len ? len - o : 0, "%s%lld", i ? ", " : "", (long long)s->d[i]);
  snprintf(buf + o, o < len ? len - o : 0, ")");
  return buf;
}

ampc_status ampc_graph_create(ampc_graph **out) {
  if (!out) return ampc__error(AMPC_EINVAL, "ampc_graph_create: out is NULL");
  *out = NULL;
  ampc_graph *g = calloc(1, sizeof *g);
  if (!g) return ampc__error(AMPC_ENOMEM, "graph: out of memory");
  g->prec = (ampc_graph_precision){.param_type = AMPC_DTYPE_F32, .norm_param_type = AMPC_DTYPE_F32, .act_type = AMPC_DTYPE_F32, .half_type = AMPC_DTYPE_F16};
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
  if (g->dev) {
    for (int b = 0; b < g->nbuckets; b++) {
      ampc__dev_free(g->dev, g->buckets[b].data);
      ampc__dev_free(g->dev, g->buckets[b].grad);
    }
    ampc__dev_free(g->dev, g->buf_arena);
    ampc__dev_free(g->dev, g->act_arena);
    ampc__dev_free(g->dev, g->actgrad_arena);
    ampc__dev_free(g->dev, g->ws);
    ampc__device_unref(g->dev);
  }
  free(g->v);
  free(g->bw_reach);
  free(g->bw_pending);
  free(g->bw_written);
  free(g->order);
  free(g->params);
  free(g->buffers);
  free(g);
}

ampc_status ampc__graph_null(const char *fn) { return ampc__error(AMPC_EINVAL, "%s: the graph is NULL", fn); }

ampc_status ampc_graph_status(const ampc_graph *g) {
  if (!g) return ampc__graph_null(__func__);
  return ampc__graph_err(g);
}

/* Records the first error and returns NONE. */
static ampc_value fail(ampc_graph *g, ampc_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static ampc_value fail(ampc_graph *g, ampc_status code, const char *fmt, ...) {
  if (g->err == 0) {
    char msg[400], full[408];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(full, sizeof full, "graph: %s", msg);
    ampc__graph_fail(g, code, full);
  }
  return AMPC_VALUE_NONE;
}

void ampc__graph_fail(ampc_graph *g, ampc_status code, const char *msg) {
  if (g->err == 0) {
    snprintf(g->err_msg, sizeof g->err_msg, "%s", msg);
    g->err = ampc__error(code, "%s", g->err_msg);
  }
}

ampc_status ampc__graph_err(const ampc_graph *g) { return g->err ? ampc__error(g->err, "%s", g->err_msg) : AMPC_OK; }

int ampc__graph_valid(const ampc_graph *g, ampc_value v) { return g && v >= 0 && (size_t)v < g->nv; }
static int valid(const ampc_graph *g, ampc_value v) { return ampc__graph_valid(g, v); }

ampc_value ampc__graph_root(const ampc_graph *g, ampc_value x) {
  while (g->v[x].alias != AMPC_VALUE_NONE) x = g->v[x].alias;
  return x;
}

size_t ampc__value_bytes(const ampc__value *v) {
  return (size_t)ampc_shape_numel(&v->store) * ampc_dtype_size(v->dtype);
}

static ampc_value add_value(ampc_graph *g, ampc_op_kind op, const char *name, ampc_shape shape) {
  if (g->err) return AMPC_VALUE_NONE;
  if (g->compiled) return fail(g, AMPC_ESTATE, "cannot record '%s' after compile", ampc_op_name(op));
  if (shape.ndim < 0 || shape.ndim > AMPC_MAX_DIMS)
    return fail(g, AMPC_EINVAL, "%s: %d dimensions (at most %d)", ampc_op_name(op), shape.ndim, AMPC_MAX_DIMS);
  int64_t numel = 1;
  for (int i = 0; i < shape.ndim; i++) {
    if (shape.d[i] <= 0) return fail(g, AMPC_EINVAL, "%s: dimension %d is %lld", ampc_op_name(op), i, (long long)shape.d[i]);
    /* the element count, and its bytes at 8 a value, must fit int64 */
    if (numel > (INT64_MAX / 8) / shape.d[i])
      return fail(g, AMPC_EINVAL, "%s: shape %s has too many elements", ampc_op_name(op), ampc_shape_str(&shape, (char[96]){0}, 96));
    numel *= shape.d[i];
  }
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
  v->pro = AMPC_VALUE_NONE;
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
  if (!g) return ((void)ampc__graph_null(__func__), AMPC_VALUE_NONE);
  if (g->err) return AMPC_VALUE_NONE;
  if (shape.ndim < 1) return fail(g, AMPC_EINVAL, "input '%s' needs a batch dimension", name ? name : "");
  if (!batch_of(g, shape.d[0])) return fail(g, AMPC_EINVAL, "input '%s': batch %lld differs from %lld", name ? name : "", (long long)shape.d[0], (long long)g->max_batch);
  ampc_value r = add_leaf(g, AMPC_OP_INPUT, name, shape);
  if (r >= 0) g->v[r].batched = 1;
  return r;
}

ampc_value ampc_graph_labels(ampc_graph *g, const char *name, int64_t n) {
  if (!g) return ((void)ampc__graph_null(__func__), AMPC_VALUE_NONE);
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
  if (!g) return ((void)ampc__graph_null(__func__), AMPC_VALUE_NONE);
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
  if (!g) return ((void)ampc__graph_null(__func__), AMPC_VALUE_NONE);
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

/* Output positions of a window of k at stride s over n padded by p each
 * side; 0 where the window is larger than the padded input (C's division
 * would round the negative span up to 0, one output: torch refuses them) */
static int64_t pool_out(int64_t n, int k, int s, int p) { return n + 2 * p < k ? 0 : (n + 2 * p - k) / s + 1; }

ampc_value ampc_graph_conv2d(ampc_graph *g, ampc_value x, ampc_value w, ampc_value b, int stride, int pad) {
  if (!g) return ((void)ampc__graph_null(__func__), AMPC_VALUE_NONE);
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
  if (!g) return ((void)ampc__graph_null(__func__), AMPC_VALUE_NONE);
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
  if (!g) return ((void)ampc__graph_null(__func__), AMPC_VALUE_NONE);
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

ampc_value ampc_graph_maxpool2d(ampc_graph *g, ampc_value x, int k, int s, int p) {
  if (!g) return ((void)ampc__graph_null(__func__), AMPC_VALUE_NONE);
  return pool(g, AMPC_OP_MAXPOOL2D, x, k, s, p);
}
ampc_value ampc_graph_avgpool2d(ampc_graph *g, ampc_value x, int k, int s, int p) {
  if (!g) return ((void)ampc__graph_null(__func__), AMPC_VALUE_NONE);
  return pool(g, AMPC_OP_AVGPOOL2D, x, k, s, p);
}

ampc_value ampc_graph_global_avgpool(ampc_graph *g, ampc_value x) {
  if (!g) return ((void)ampc__graph_null(__func__), AMPC_VALUE_NONE);
  NEED(is_float_value(g, x) && val(g, x)->shape.ndim == 4, "global_avgpool: expected a 4-d input");
  const ampc_shape *xs = &val(g, x)->shape;
  return unary(g, AMPC_OP_GLOBAL_AVGPOOL, x, ampc_shape2(xs->d[0], xs->d[1]));
}

ampc_value ampc_graph_linear(ampc_graph *g, ampc_value x, ampc_value w, ampc_value b) {
  if (!g) return ((void)ampc__graph_null(__func__), AMPC_VALUE_NONE);
  NEED(is_float_value(g, x) && is_float_value(g, w), "linear: invalid input or weight");
  const ampc_shape *xs = &val(g, x)->shape, *ws = &val(g, w)->shape;
  NEED(xs->ndim == 2 && ws->ndim == 2, "linear: expected a 2-d input and weight (flatten first)");
  NEED(ws->d[1] == xs->d[1], "linear: weight expects %lld features, input has %lld", (long long)ws->d[1], (long long)xs->d[1]);
  NEED(b == AMPC_VALUE_NONE || (is_float_value(g, b) && val(g, b)->shape.ndim == 1 && val(g, b)->shape.d[0] == ws->d[0]), "linear: bias must have shape (%lld)", (long long)ws->d[0]);
  ampc_value in[3] = {x, w, b};
  return add_op(g, AMPC_OP_LINEAR, ampc_shape2(xs->d[0], ws->d[0]), b == AMPC_VALUE_NONE ? 2 : 3, in);
}

ampc_value ampc_graph_add(ampc_graph *g, ampc_value a, ampc_value b) {
  if (!g) return ((void)ampc__graph_null(__func__), AMPC_VALUE_NONE);
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
  if (!g) return ((void)ampc__graph_null(__func__), AMPC_VALUE_NONE);
  NEED(is_float_value(g, x), "flatten: invalid input");
  const ampc_shape *xs = &val(g, x)->shape;
  int64_t rest = ampc_shape_numel(xs) / xs->d[0];
  ampc_value r = unary(g, AMPC_OP_FLATTEN, x, ampc_shape2(xs->d[0], rest));
  if (r >= 0) g->v[r].alias = x;
  return r;
}

ampc_value ampc_graph_softmax(ampc_graph *g, ampc_value x) {
  if (!g) return ((void)ampc__graph_null(__func__), AMPC_VALUE_NONE);
  NEED(is_float_value(g, x) && val(g, x)->shape.ndim == 2, "softmax: expected a 2-d input");
  return unary(g, AMPC_OP_SOFTMAX, x, val(g, x)->shape);
}

ampc_value ampc_graph_log_softmax(ampc_graph *g, ampc_value x) {
  if (!g) return ((void)ampc__graph_null(__func__), AMPC_VALUE_NONE);
  NEED(is_float_value(g, x) && val(g, x)->shape.ndim == 2, "log_softmax: expected a 2-d input");
  return unary(g, AMPC_OP_LOG_SOFTMAX, x, val(g, x)->shape);
}

ampc_value ampc_graph_cross_entropy(ampc_graph *g, ampc_value logits, ampc_value labels, float s) {
  if (!g) return ((void)ampc__graph_null(__func__), AMPC_VALUE_NONE);
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
  if (!g) return ((void)ampc__graph_null(__func__), AMPC_VALUE_NONE);
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

/* ---------------- options ---------------- */

ampc_status ampc_graph_keep(ampc_graph *g, ampc_value v) {
  if (!g) return ampc__graph_null(__func__);
  if (g->err) return ampc__graph_err(g); /* the first error's message: v is NONE because of it */
  if (g->compiled) return ampc__error(AMPC_ESTATE, "graph: values to keep must be chosen before compile");
  if (!valid(g, v)) return ampc__error(AMPC_EINVAL, "graph: keep of an invalid value %d", (int)v);
  g->v[v].keep = 1;
  return AMPC_OK;
}

ampc_status ampc_graph_set_retain_grads(ampc_graph *g, int on) {
  if (!g) return ampc__graph_null(__func__);
  if (g->compiled) return ampc__error(AMPC_ESTATE, "graph: retain_grads must be chosen before compile");
  g->retain_grads = on;
  return AMPC_OK;
}

ampc_status ampc_graph_set_free_saved(ampc_graph *g, int on) {
  if (!g) return ampc__graph_null(__func__);
  if (g->compiled) return ampc__error(AMPC_ESTATE, "graph: free_saved must be chosen before compile");
  g->free_saved = on != 0;
  return AMPC_OK;
}

ampc_status ampc_graph_set_fusion(ampc_graph *g, int on) {
  if (!g) return ampc__graph_null(__func__);
  if (g->compiled) return ampc__error(AMPC_ESTATE, "graph: fusion must be chosen before compile");
  g->fuse = on;
  return AMPC_OK;
}

/* ---------------- access ---------------- */

double ampc_graph_forward_flops(const ampc_graph *g) {
  if (!g) return 0;
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


/* Device memory is a host pointer only on a backend whose memory is host
 * memory; elsewhere the tensor says its type and shape, with no data. */
static ampc_tensor host_view(const ampc_graph *g, ampc_value v, int grad) {
  ampc_tensor t = ampc__graph_view(g, v, grad);
  if (!g->dev || !g->dev->be->host_memory) t.data = NULL;
  return t;
}
/* The getters: a NULL graph (valid() is false for it) gives the neutral value. */
ampc_tensor ampc_graph_tensor(const ampc_graph *g, ampc_value v) { return g ? host_view(g, v, 0) : (ampc_tensor){0}; }
ampc_tensor ampc_graph_grad(const ampc_graph *g, ampc_value v) { return g ? host_view(g, v, 1) : (ampc_tensor){0}; }
const char *ampc_graph_name(const ampc_graph *g, ampc_value v) { return valid(g, v) ? g->v[v].name : NULL; }
ampc_op_kind ampc_graph_op(const ampc_graph *g, ampc_value v) { return valid(g, v) ? g->v[v].op : AMPC_OP_COUNT; }
ampc_value ampc_graph_find(const ampc_graph *g, const char *name) {
  if (!g) return ((void)ampc__graph_null(__func__), AMPC_VALUE_NONE);
  for (size_t i = 0; name && i < g->nv; i++)
    if (strcmp(g->v[i].name, name) == 0) return (ampc_value)i;
  return AMPC_VALUE_NONE;
}
size_t ampc_graph_value_count(const ampc_graph *g) { return g ? g->nv : 0; }
size_t ampc_graph_param_count(const ampc_graph *g) { return g ? g->nparams : 0; }
ampc_value ampc_graph_param_at(const ampc_graph *g, size_t i) { return g && i < g->nparams ? g->params[i] : AMPC_VALUE_NONE; }
int ampc_graph_param_is_norm(const ampc_graph *g, ampc_value v) { return valid(g, v) && g->v[v].is_norm; }
size_t ampc_graph_param_numel(const ampc_graph *g) { return g ? g->param_numel : 0; }
size_t ampc_graph_param_offset(const ampc_graph *g, ampc_value v) { return valid(g, v) ? g->v[v].param_offset : 0; }
size_t ampc_graph_buffer_count(const ampc_graph *g) { return g ? g->nbuffers : 0; }
ampc_value ampc_graph_buffer_at(const ampc_graph *g, size_t i) { return g && i < g->nbuffers ? g->buffers[i] : AMPC_VALUE_NONE; }
const float *ampc_graph_param_init(const ampc_graph *g, ampc_value v) { return valid(g, v) ? g->v[v].init : NULL; }

void ampc_graph_release_init(ampc_graph *g) {
  if (!g) return;
  if (!g->compiled) return; /* compile still needs them */
  for (size_t i = 0; i < g->nv; i++) {
    free(g->v[i].init);
    g->v[i].init = NULL;
  }
}

void ampc_graph_memory(const ampc_graph *g, ampc_mem_report *r) {
  if (!r) return;
  if (!g) {
    if (r) memset(r, 0, sizeof *r);
    return;
  }
  memset(r, 0, sizeof *r);
  for (int t = 0; t < AMPC_DTYPE_COUNT; t++) {
    r->bytes[AMPC_MEM_PARAMETERS][t] = g->bytes_by_type[0][t];
    r->bytes[AMPC_MEM_GRADIENTS][t] = g->bytes_by_type[1][t];
    /* forward values and the gradients flowing back through them */
    r->bytes[AMPC_MEM_ACTIVATIONS][t] = g->bytes_by_type[2][t] + g->bytes_by_type[3][t];
  }
  r->bytes[AMPC_MEM_WORKSPACE][AMPC_DTYPE_F32] = g->ws_report;
}
