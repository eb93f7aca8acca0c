/* The layer builder: name scopes, PyTorch initialisation, summary rows. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ampc/nn.h"
#include "ampc/rng.h"
#include "core/graph_internal.h"
#include "core/status_internal.h"

#define NN_MAX_DEPTH 8

struct ampc_nn {
  ampc_graph *g;
  ampc_rng rng;
  char scope[NN_MAX_DEPTH][48];
  int depth;
  int over; /* pushes past NN_MAX_DEPTH, refused (the graph holds the error) */
  ampc_nn_row *rows;
  size_t nrows, caprows;
};

ampc_status ampc_nn_create(ampc_nn **out, ampc_graph *g, uint64_t seed) {
  if (!out) return ampc__error(AMPC_EINVAL, "ampc_nn_create: out is NULL");
  *out = NULL;
  if (!g) return ampc__error(AMPC_EINVAL, "ampc_nn_create: graph is NULL");
  ampc_nn *b = calloc(1, sizeof *b);
  if (!b) return ampc__error(AMPC_ENOMEM, "nn: out of memory");
  b->g = g;
  b->rng = ampc_rng_make(seed, AMPC_RNG_STREAM_INIT);
  *out = b;
  return AMPC_OK;
}

void ampc_nn_free(ampc_nn *b) {
  if (!b) return;
  free(b->rows);
  free(b);
}

ampc_graph *ampc_nn_graph(ampc_nn *b) { return b ? b->g : NULL; }

/* A misuse of the builder fails its graph, as a bad layer would: the first
 * error is kept and every later layer records nothing. */
static void nn_fail(ampc_nn *b, const char *what) {
  char m[400];
  snprintf(m, sizeof m, "nn: %s", what);
  ampc__graph_fail(b->g, AMPC_EINVAL, m);
}

void ampc_nn_push(ampc_nn *b, const char *scope) {
  if (!b) return;
  if (b->depth >= NN_MAX_DEPTH) {
    b->over++;
    nn_fail(b, "name scopes nested more than 8 deep");
    return;
  }
  snprintf(b->scope[b->depth++], sizeof b->scope[0], "%s", scope ? scope : "");
}

void ampc_nn_pop(ampc_nn *b) {
  if (!b) return;
  if (b->over > 0) b->over--;
  else if (b->depth > 0) b->depth--;
  else nn_fail(b, "pop without a matching push");
}

/* "scope.scope.name.leaf" (name and leaf may be NULL) */
static void full_name(const ampc_nn *b, const char *name, const char *leaf, char *out, size_t len) {
  size_t o = 0;
  out[0] = '\0';
  for (int i = 0; i < b->depth; i++) o += (size_t)snprintf(out + o, o < len ? len - o : 0, "%s%s", o ? "." : "", b->scope[i]);
  if (name && *name) o += (size_t)snprintf(out + o, o < len ? len - o : 0, "%s%s", o ? "." : "", name);
  if (leaf) snprintf(out + o, o < len ? len - o : 0, "%s%s", o ? "." : "", leaf);
}

static void add_row(ampc_nn *b, const char *name, const char *kind, ampc_value out, int64_t params) {
  if (out < 0) return;
  if (b->nrows == b->caprows) {
    size_t cap = b->caprows ? b->caprows * 2 : 32;
    ampc_nn_row *r = realloc(b->rows, cap * sizeof *r);
    if (!r) return; /* the summary is informational; the graph still records */
    b->rows = r;
    b->caprows = cap;
  }
  ampc_nn_row *r = &b->rows[b->nrows++];
  full_name(b, name, NULL, r->name, sizeof r->name);
  snprintf(r->kind, sizeof r->kind, "%s", kind);
  r->out = ampc_graph_tensor(b->g, out).shape;
  r->params = params;
}

size_t ampc_nn_row_count(const ampc_nn *b) { return b ? b->nrows : 0; }
const ampc_nn_row *ampc_nn_row_at(const ampc_nn *b, size_t i) { return b && i < b->nrows ? &b->rows[i] : NULL; }

static ampc_value uniform_param(ampc_nn *b, const char *name, const char *leaf, ampc_shape s, float bound) {
  size_t n = (size_t)ampc_shape_numel(&s);
  char full[160];
  full_name(b, name, leaf, full, sizeof full);
  /* recorded as zeros first: the graph checks the size (and reports a failure) before the values are drawn */
  ampc_value v = ampc_graph_param(b->g, full, s, 0, NULL);
  float *init = ampc__graph_init_data(b->g, v);
  if (!init) return AMPC_VALUE_NONE;
  for (size_t i = 0; i < n; i++) init[i] = (2.0f * ampc_rng_uniform(&b->rng) - 1.0f) * bound;
  return v;
}

static ampc_shape shape_of(ampc_nn *b, ampc_value x) { return ampc_graph_tensor(b->g, x).shape; }

ampc_value ampc_nn_linear(ampc_nn *b, const char *name, ampc_value x, int64_t out, int bias) {
  if (!b || ampc_graph_status(b->g) || x < 0) return AMPC_VALUE_NONE;
  int64_t in = shape_of(b, x).d[1];
  float bound = 1.0f / sqrtf((float)in); /* kaiming_uniform(a=sqrt(5)) and the bias rule agree */
  ampc_value w = uniform_param(b, name, "weight", ampc_shape2(out, in), bound);
  ampc_value bb = bias ? uniform_param(b, name, "bias", ampc_shape1(out), bound) : AMPC_VALUE_NONE;
  ampc_value y = ampc_graph_linear(b->g, x, w, bb);
  add_row(b, name, "Linear", y, out * in + (bias ? out : 0));
  return y;
}

ampc_value ampc_nn_conv2d(ampc_nn *b, const char *name, ampc_value x, int64_t out, int k, int stride, int pad, int bias) {
  if (!b || ampc_graph_status(b->g) || x < 0) return AMPC_VALUE_NONE;
  int64_t in = shape_of(b, x).d[1];
  float bound = 1.0f / sqrtf((float)(in * k * k));
  ampc_value w = uniform_param(b, name, "weight", ampc_shape4(out, in, k, k), bound);
  ampc_value bb = bias ? uniform_param(b, name, "bias", ampc_shape1(out), bound) : AMPC_VALUE_NONE;
  ampc_value y = ampc_graph_conv2d(b->g, x, w, bb, stride, pad);
  add_row(b, name, "Conv2d", y, out * in * k * k + (bias ? out : 0));
  return y;
}

ampc_value ampc_nn_batchnorm2d(ampc_nn *b, const char *name, ampc_value x) {
  if (!b || ampc_graph_status(b->g) || x < 0) return AMPC_VALUE_NONE;
  int64_t c = shape_of(b, x).d[1];
  float *ones = malloc((size_t)c * sizeof *ones);
  if (!ones) return AMPC_VALUE_NONE;
  for (int64_t i = 0; i < c; i++) ones[i] = 1.0f;
  char n[160];
  full_name(b, name, "weight", n, sizeof n);
  ampc_value gm = ampc_graph_param(b->g, n, ampc_shape1(c), 1, ones);
  full_name(b, name, "bias", n, sizeof n);
  ampc_value bt = ampc_graph_param(b->g, n, ampc_shape1(c), 1, NULL);
  full_name(b, name, "running_mean", n, sizeof n);
  ampc_value rm = ampc_graph_buffer(b->g, n, AMPC_DTYPE_F32, ampc_shape1(c), NULL);
  full_name(b, name, "running_var", n, sizeof n);
  ampc_value rv = ampc_graph_buffer(b->g, n, AMPC_DTYPE_F32, ampc_shape1(c), ones);
  full_name(b, name, "num_batches_tracked", n, sizeof n);
  ampc_shape scalar = {0, {1, 1, 1, 1}};
  ampc_value nbt = ampc_graph_buffer(b->g, n, AMPC_DTYPE_I64, scalar, NULL);
  free(ones);
  ampc_value y = ampc_graph_batchnorm2d(b->g, x, gm, bt, rm, rv, nbt, 0.1f, 1e-5f);
  add_row(b, name, "BatchNorm2d", y, 2 * c);
  return y;
}

/* Layers without parameters get a summary row too, under a name of their
 * own ("relu" in a scope, the index in a sequential), as every layer of
 * every model is listed the same way. */
static ampc_value relu_as(ampc_nn *b, const char *name, ampc_value x) {
  ampc_value y = ampc_graph_relu(b->g, x);
  add_row(b, name, "ReLU", y, 0);
  return y;
}
static ampc_value maxpool_as(ampc_nn *b, const char *name, ampc_value x, int k, int stride) {
  ampc_value y = ampc_graph_maxpool2d(b->g, x, k, stride, 0);
  add_row(b, name, "MaxPool2d", y, 0);
  return y;
}
static ampc_value flatten_as(ampc_nn *b, const char *name, ampc_value x) {
  ampc_value y = ampc_graph_flatten(b->g, x);
  add_row(b, name, "Flatten", y, 0);
  return y;
}

ampc_value ampc_nn_relu(ampc_nn *b, ampc_value x) { return b ? relu_as(b, "relu", x) : AMPC_VALUE_NONE; }
ampc_value ampc_nn_maxpool2d(ampc_nn *b, ampc_value x, int k, int stride) {
  return b ? maxpool_as(b, "maxpool", x, k, stride) : AMPC_VALUE_NONE;
}
ampc_value ampc_nn_flatten(ampc_nn *b, ampc_value x) { return b ? flatten_as(b, "flatten", x) : AMPC_VALUE_NONE; }
ampc_value ampc_nn_global_avgpool(ampc_nn *b, ampc_value x) {
  if (!b) return AMPC_VALUE_NONE;
  ampc_value y = ampc_graph_global_avgpool(b->g, x);
  add_row(b, "avgpool", "AdaptiveAvgPool2d", y, 0);
  return y;
}

ampc_value ampc_nn_basic_block(ampc_nn *b, const char *name, ampc_value x, int64_t out, int stride) {
  if (!b || ampc_graph_status(b->g) || x < 0) return AMPC_VALUE_NONE;
  int64_t in = shape_of(b, x).d[1];
  ampc_nn_push(b, name);
  ampc_value y = relu_as(b, "relu1", ampc_nn_batchnorm2d(b, "bn1", ampc_nn_conv2d(b, "conv1", x, out, 3, stride, 1, 0)));
  y = ampc_nn_batchnorm2d(b, "bn2", ampc_nn_conv2d(b, "conv2", y, out, 3, 1, 1, 0));
  ampc_value sc = x;
  if (stride != 1 || in != out) {
    ampc_nn_push(b, "shortcut");
    sc = ampc_nn_batchnorm2d(b, "1", ampc_nn_conv2d(b, "0", x, out, 1, stride, 0, 0));
    ampc_nn_pop(b);
  }
  y = ampc_graph_add(b->g, y, sc);
  add_row(b, "add", "Add", y, 0); /* the residual */
  y = relu_as(b, "relu2", y);
  ampc_nn_pop(b);
  return y;
}

ampc_value ampc_nn_sequential(ampc_nn *b, const char *name, ampc_value x, const ampc_layer *layers, size_t n) {
  if (!b) return AMPC_VALUE_NONE;
  if (n && !layers) return nn_fail(b, "sequential: layers is NULL"), AMPC_VALUE_NONE;
  if (name && *name) ampc_nn_push(b, name);
  for (size_t i = 0; i < n && x >= 0; i++) {
    char idx[24];
    snprintf(idx, sizeof idx, "%zu", i);
    const ampc_layer *l = &layers[i];
    switch (l->kind) {
      case AMPC_LAYER_LINEAR: x = ampc_nn_linear(b, idx, x, l->out, l->bias); break;
      case AMPC_LAYER_CONV2D: x = ampc_nn_conv2d(b, idx, x, l->out, l->kernel, l->stride ? l->stride : 1, l->pad, l->bias); break;
      case AMPC_LAYER_BATCHNORM2D: x = ampc_nn_batchnorm2d(b, idx, x); break;
      case AMPC_LAYER_RELU: x = relu_as(b, idx, x); break;
      case AMPC_LAYER_MAXPOOL2D: x = maxpool_as(b, idx, x, l->kernel, l->stride ? l->stride : l->kernel); break;
      case AMPC_LAYER_FLATTEN: x = flatten_as(b, idx, x); break;
      case AMPC_LAYER_BASIC_BLOCK: x = ampc_nn_basic_block(b, idx, x, l->out, l->stride ? l->stride : 1); break;
      default: {
        char what[64];
        snprintf(what, sizeof what, "sequential: layer %zu has an unknown kind %d", i, (int)l->kind);
        nn_fail(b, what);
        x = AMPC_VALUE_NONE;
      }
    }
  }
  if (name && *name) ampc_nn_pop(b);
  return x;
}
