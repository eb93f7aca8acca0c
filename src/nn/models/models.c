/* The built-in models: mlp, cnn, resnet18. Each takes its input shape and
 * class count from the options (that is, from the dataset). */
#include <stdlib.h>
#include <string.h>

#include "ampc/nn.h"
#include "core/status_internal.h"

struct ampc_model {
  char name[32];
  ampc_model_opts opts;
  ampc_graph *g;
  ampc_nn *nn;
  ampc_value x, y, logits, loss;
};

/* Flatten, Linear(in, 256), ReLU, Linear(256, 128), ReLU, Linear(128, classes). */
static ampc_value build_mlp(ampc_nn *b, ampc_value x, int classes) {
  const ampc_layer L[] = {
      {AMPC_LAYER_FLATTEN, 0, 0, 0, 0, 0},   {AMPC_LAYER_LINEAR, 256, 0, 0, 0, 1},
      {AMPC_LAYER_RELU, 0, 0, 0, 0, 0},      {AMPC_LAYER_LINEAR, 128, 0, 0, 0, 1},
      {AMPC_LAYER_RELU, 0, 0, 0, 0, 0},      {AMPC_LAYER_LINEAR, classes, 0, 0, 0, 1},
  };
  return ampc_nn_sequential(b, NULL, x, L, sizeof L / sizeof L[0]);
}

/* The reference Fashion-MNIST CNN (an nn.Sequential of 12 modules):
 * conv(C->32, 3x3, pad 1), BN, ReLU, max-pool 2, conv(32->64), BN, ReLU,
 * max-pool 2, flatten, linear(64*H/4*W/4 -> 128), ReLU, linear(128 -> classes). */
static ampc_value build_cnn(ampc_nn *b, ampc_value x, int classes) {
  const ampc_layer L[] = {
      {AMPC_LAYER_CONV2D, 32, 3, 1, 1, 1}, {AMPC_LAYER_BATCHNORM2D, 0, 0, 0, 0, 0},
      {AMPC_LAYER_RELU, 0, 0, 0, 0, 0},    {AMPC_LAYER_MAXPOOL2D, 0, 2, 2, 0, 0},
      {AMPC_LAYER_CONV2D, 64, 3, 1, 1, 1}, {AMPC_LAYER_BATCHNORM2D, 0, 0, 0, 0, 0},
      {AMPC_LAYER_RELU, 0, 0, 0, 0, 0},    {AMPC_LAYER_MAXPOOL2D, 0, 2, 2, 0, 0},
      {AMPC_LAYER_FLATTEN, 0, 0, 0, 0, 0}, {AMPC_LAYER_LINEAR, 128, 0, 0, 0, 1},
      {AMPC_LAYER_RELU, 0, 0, 0, 0, 0},    {AMPC_LAYER_LINEAR, classes, 0, 0, 0, 1},
  };
  return ampc_nn_sequential(b, NULL, x, L, sizeof L / sizeof L[0]);
}

/* ResNet-18 for 32x32 inputs: conv1 3x3/64 + bn1 + relu, layer1..layer4 of two
 * BasicBlocks each (64, 128/2, 256/2, 512/2), global average pool, linear. */
static ampc_value build_resnet18(ampc_nn *b, ampc_value x, int classes) {
  x = ampc_nn_relu(b, ampc_nn_batchnorm2d(b, "bn1", ampc_nn_conv2d(b, "conv1", x, 64, 3, 1, 1, 0)));
  const int64_t widths[4] = {64, 128, 256, 512};
  for (int s = 0; s < 4; s++) {
    char name[16];
    snprintf(name, sizeof name, "layer%d", s + 1);
    ampc_nn_push(b, name);
    x = ampc_nn_basic_block(b, "0", x, widths[s], s == 0 ? 1 : 2);
    x = ampc_nn_basic_block(b, "1", x, widths[s], 1);
    ampc_nn_pop(b);
  }
  x = ampc_nn_global_avgpool(b, x);
  return ampc_nn_linear(b, "linear", x, classes, 1);
}

static const struct {
  const char *name;
  ampc_value (*build)(ampc_nn *, ampc_value, int);
} model_table[] = {{"mlp", build_mlp}, {"cnn", build_cnn}, {"resnet18", build_resnet18}};

const char *ampc_model_names(void) { return "mlp, cnn, resnet18"; }

int ampc_model_known(const char *name) {
  for (size_t i = 0; name && i < sizeof model_table / sizeof model_table[0]; i++)
    if (strcmp(name, model_table[i].name) == 0) return 1;
  return 0;
}

ampc_status ampc_model_create(ampc_model **out, const char *name, const ampc_model_opts *o) {
  if (!out) return ampc__error(AMPC_EINVAL, "ampc_model_create: out is NULL");
  *out = NULL;
  if (!name) return ampc__error(AMPC_EINVAL, "ampc_model_create: name is NULL");
  size_t which = sizeof model_table / sizeof model_table[0];
  for (size_t i = 0; i < sizeof model_table / sizeof model_table[0]; i++)
    if (name && strcmp(name, model_table[i].name) == 0) which = i;
  if (which == sizeof model_table / sizeof model_table[0])
    return ampc__error(AMPC_EINVAL, "unknown model '%s' (expected one of: %s)", name ? name : "", ampc_model_names());
  if (!o) return ampc__error(AMPC_EINVAL, "ampc_model_create: options are NULL");
  if (o->batch < 1 || o->channels < 1 || o->height < 1 || o->width < 1 || o->classes < 2)
    return ampc__error(AMPC_EINVAL, "model %s: invalid shape batch %lld, input %dx%dx%d, %d classes", name,
                       (long long)o->batch, o->channels, o->height, o->width, o->classes);
  /* two 2x2 max-pools, which drop a last odd row or column as PyTorch's do */
  if (strcmp(name, "cnn") == 0 && (o->height < 4 || o->width < 4))
    return ampc__error(AMPC_EINVAL, "model cnn: input %dx%d is smaller than 4x4 (two 2x2 max-pools)", o->height, o->width);
  ampc_model *m = calloc(1, sizeof *m);
  if (!m) return ampc__error(AMPC_ENOMEM, "model: out of memory");
  snprintf(m->name, sizeof m->name, "%s", name);
  m->opts = *o;
  ampc_status s = ampc_graph_create(&m->g);
  if (s == 0) s = ampc_nn_create(&m->nn, m->g, o->seed);
  if (s == 0) {
    m->x = ampc_graph_input(m->g, "x", ampc_shape4(o->batch, o->channels, o->height, o->width));
    m->y = ampc_graph_labels(m->g, "y", o->batch);
    m->logits = model_table[which].build(m->nn, m->x, o->classes);
    m->loss = ampc_graph_cross_entropy(m->g, m->logits, m->y, o->label_smoothing);
    ampc_graph_keep(m->g, m->logits); /* read for accuracy and by ampc grad */
    s = ampc_graph_status(m->g);
  }
  if (s < 0) {
    ampc_model_free(m);
    return ampc__error_prefix(s, "model %s", name);
  }
  *out = m;
  return AMPC_OK;
}

void ampc_model_free(ampc_model *m) {
  if (!m) return;
  ampc_nn_free(m->nn);
  ampc_graph_free(m->g);
  free(m);
}

/* A NULL m: no name, graph, builder or options, and no values. */
const char *ampc_model_name(const ampc_model *m) { return m ? m->name : NULL; }
ampc_graph *ampc_model_graph(ampc_model *m) { return m ? m->g : NULL; }
const ampc_nn *ampc_model_builder(const ampc_model *m) { return m ? m->nn : NULL; }
const ampc_model_opts *ampc_model_options(const ampc_model *m) { return m ? &m->opts : NULL; }
ampc_value ampc_model_input(const ampc_model *m) { return m ? m->x : AMPC_VALUE_NONE; }
ampc_value ampc_model_labels(const ampc_model *m) { return m ? m->y : AMPC_VALUE_NONE; }
ampc_value ampc_model_logits(const ampc_model *m) { return m ? m->logits : AMPC_VALUE_NONE; }
ampc_value ampc_model_loss(const ampc_model *m) { return m ? m->loss : AMPC_VALUE_NONE; }

int64_t ampc_model_param_count(const ampc_model *m) {
  if (!m) return 0;
  int64_t n = 0;
  for (size_t i = 0; i < ampc_graph_value_count(m->g); i++)
    if (ampc_graph_op(m->g, (ampc_value)i) == AMPC_OP_PARAM) {
      ampc_tensor t = ampc_graph_tensor(m->g, (ampc_value)i);
      n += ampc_tensor_numel(&t);
    }
  return n;
}
