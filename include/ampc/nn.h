/*
 * nn.h -- layers and models, recorded into a graph with PyTorch's names.
 *
 * A builder (ampc_nn) records layers into a graph under a name scope, so
 * parameters get the names PyTorch's state_dict gives them
 * ("layer2.0.shortcut.0.weight"), and initialises them as PyTorch does
 * (kaiming-uniform with a = sqrt(5) for weights, uniform(+-1/sqrt(fan_in))
 * for biases; batch norm weight 1, bias 0, running mean 0, running var 1),
 * drawing from the seeded generator. It also keeps a summary row per layer.
 *
 *     ampc_model *m;
 *     ampc_model_opts o = {.batch = 128, .channels = 3, .height = 32, .width = 32, .classes = 10};
 *     ampc_model_create(&m, "resnet18", &o);
 *     ampc_graph *g = ampc_model_graph(m);
 *
 * Models: "mlp", "cnn" (the Fashion-MNIST CNN of the PyTorch reference, an
 * nn.Sequential, so its names are "0.weight", "1.running_mean", ...) and
 * "resnet18" (the CIFAR variant: 3x3 stem, no max-pool).
 */
#ifndef AMPC_NN_H
#define AMPC_NN_H

#include "ampc/data.h"
#include "ampc/graph.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ampc_nn ampc_nn;

/* Records into g, which must outlive the builder: AMPC_EINVAL for a NULL out
 * or g. The functions below do nothing for a NULL b (the layers return
 * AMPC_VALUE_NONE, the getters NULL or 0). */
ampc_status ampc_nn_create(ampc_nn **out, ampc_graph *g, uint64_t seed);
void ampc_nn_free(ampc_nn *b);
ampc_graph *ampc_nn_graph(ampc_nn *b);
/* Enter / leave a name scope ("layer1", then "0", ...). Scopes nest at most
 * 8 deep: a deeper push, or a pop without a push, fails the graph
 * (AMPC_EINVAL in ampc_graph_status). */
void ampc_nn_push(ampc_nn *b, const char *scope);
void ampc_nn_pop(ampc_nn *b);

ampc_value ampc_nn_linear(ampc_nn *b, const char *name, ampc_value x, int64_t out_features, int bias);
ampc_value ampc_nn_conv2d(ampc_nn *b, const char *name, ampc_value x, int64_t out_channels, int kernel,
                          int stride, int pad, int bias);
/* momentum 0.1, eps 1e-5 (PyTorch's defaults) */
ampc_value ampc_nn_batchnorm2d(ampc_nn *b, const char *name, ampc_value x);
ampc_value ampc_nn_relu(ampc_nn *b, ampc_value x);
ampc_value ampc_nn_maxpool2d(ampc_nn *b, ampc_value x, int kernel, int stride);
ampc_value ampc_nn_flatten(ampc_nn *b, ampc_value x);
/* (N, C, H, W) -> (N, C): the mean of each plane (PyTorch's
 * AdaptiveAvgPool2d(1) followed by a flatten). */
ampc_value ampc_nn_global_avgpool(ampc_nn *b, ampc_value x);
/* The residual block of ResNet-18/34: conv3x3-bn-relu-conv3x3-bn, plus a
 * 1x1 conv + bn shortcut when the stride or width changes, then relu. */
ampc_value ampc_nn_basic_block(ampc_nn *b, const char *name, ampc_value x, int64_t out_channels, int stride);

/* nn.Sequential: layers named by their index, as PyTorch numbers them. */
typedef enum {
  AMPC_LAYER_LINEAR,
  AMPC_LAYER_CONV2D,
  AMPC_LAYER_BATCHNORM2D,
  AMPC_LAYER_RELU,
  AMPC_LAYER_MAXPOOL2D,
  AMPC_LAYER_FLATTEN,
  AMPC_LAYER_BASIC_BLOCK
} ampc_layer_kind;

typedef struct {
  ampc_layer_kind kind;
  int64_t out;          /* features / channels */
  int kernel, stride, pad;
  int bias;             /* linear, conv2d */
} ampc_layer;

ampc_value ampc_nn_sequential(ampc_nn *b, const char *name, ampc_value x, const ampc_layer *layers, size_t n);

/* One row per recorded layer, for `ampc summary`: every layer, with or
 * without parameters, in the order applied (a residual block's add and
 * ReLUs included). */
typedef struct {
  char name[96];
  char kind[24];
  ampc_shape out;
  int64_t params;
} ampc_nn_row;
size_t ampc_nn_row_count(const ampc_nn *b);
const ampc_nn_row *ampc_nn_row_at(const ampc_nn *b, size_t i);

/* ---- models ---- */
typedef struct {
  int64_t batch;
  int channels, height, width, classes;
  uint64_t seed;
  float label_smoothing;
} ampc_model_opts;

typedef struct ampc_model ampc_model;

/* The built-in model names, comma separated: "mlp, cnn, resnet18". */
const char *ampc_model_names(void);
/* 1 if name is a built-in model. */
int ampc_model_known(const char *name);
ampc_status ampc_model_create(ampc_model **out, const char *name, const ampc_model_opts *o);
void ampc_model_free(ampc_model *m);
/* For a NULL m: NULL, AMPC_VALUE_NONE, or a param count of 0. */
const char *ampc_model_name(const ampc_model *m);
ampc_graph *ampc_model_graph(ampc_model *m);
const ampc_nn *ampc_model_builder(const ampc_model *m);
const ampc_model_opts *ampc_model_options(const ampc_model *m);
ampc_value ampc_model_input(const ampc_model *m);  /* x (N, C, H, W) */
ampc_value ampc_model_labels(const ampc_model *m); /* y (N,) */
ampc_value ampc_model_logits(const ampc_model *m); /* (N, classes) */
ampc_value ampc_model_loss(const ampc_model *m);   /* mean cross entropy */
/* Trainable parameter count. */
int64_t ampc_model_param_count(const ampc_model *m);

/* Mean loss and accuracy (argmax of the logits) of the compiled model over
 * every image of d, in eval mode (batch norm uses its running statistics),
 * in batches of the model's batch size, the images normalised as the loader
 * does when normalize is set (as they were in training). */
typedef struct {
  double loss, accuracy;
  size_t images;
} ampc_eval_result;
ampc_status ampc_model_evaluate(ampc_model *m, const ampc_dataset *d, int normalize, ampc_eval_result *out);

#ifdef __cplusplus
}
#endif
#endif
