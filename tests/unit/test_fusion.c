/* The fused graph (ReLU inside batch norm / add) computes exactly what the
 * plain one-kernel-per-op graph does: same loss, same gradients, bit for bit
 * in f32 and in half storage. */
#include "ampc/nn.h"
#include "ampc/rng.h"
#include "test.h"

typedef struct {
  float loss;
  float *grads;
  size_t n;
} run_result;

static run_result run(const char *model, int C, int H, int fuse, ampc_dtype act) {
  run_result r = {0};
  ampc_model_opts o = {.batch = 4, .channels = C, .height = H, .width = H, .classes = 10, .seed = 3};
  ampc_model *m;
  CHECK_OK(ampc_model_create(&m, model, &o));
  ampc_graph *g = ampc_model_graph(m);
  CHECK_OK(ampc_graph_set_fusion(g, fuse));
  ampc_graph_precision p = {act, AMPC_DTYPE_F32, act, 0, AMPC_DTYPE_F16};
  CHECK_OK(ampc_graph_set_precision(g, &p));
  CHECK_OK(ampc_graph_compile(g));
  ampc_tensor x = ampc_graph_tensor(g, ampc_model_input(m)), y = ampc_graph_tensor(g, ampc_model_labels(m));
  ampc_rng rng = ampc_rng_make(7, AMPC_RNG_STREAM_USER);
  size_t nx = (size_t)ampc_tensor_numel(&x);
  float *xf = malloc(nx * sizeof *xf);
  for (size_t i = 0; i < nx; i++) xf[i] = ampc_rng_normal(&rng);
  ampc_store_f32(x.dtype, x.data, xf, nx);
  free(xf);
  for (int i = 0; i < 4; i++) ((int32_t *)y.data)[i] = i * 3 % 10;
  CHECK_OK(ampc_graph_forward(g, 1));
  CHECK_OK(ampc_graph_backward(g, ampc_model_loss(m), 1.0f, 0));
  r.loss = *(float *)ampc_graph_tensor(g, ampc_model_loss(m)).data;
  r.n = ampc_graph_param_numel(g);
  r.grads = malloc(r.n * sizeof(float));
  for (size_t i = 0; i < ampc_graph_param_count(g); i++) {
    ampc_value v = ampc_graph_param_at(g, i);
    ampc_tensor gt = ampc_graph_grad(g, v);
    ampc_load_f32(r.grads + ampc_graph_param_offset(g, v), gt.dtype, gt.data, (size_t)ampc_tensor_numel(&gt));
  }
  ampc_model_free(m);
  return r;
}

static void compare(const char *model, int C, int H, ampc_dtype act) {
  run_result a = run(model, C, H, 0, act), b = run(model, C, H, 1, act);
  CHECK_MSG(a.loss == b.loss, "%s %s: loss %.9g unfused vs %.9g fused", model, ampc_dtype_name(act), a.loss, b.loss);
  CHECK(a.n == b.n);
  size_t diff = 0;
  for (size_t i = 0; i < a.n && i < b.n; i++) diff += memcmp(&a.grads[i], &b.grads[i], 4) != 0;
  CHECK_MSG(diff == 0, "%s %s: %zu of %zu gradient values differ", model, ampc_dtype_name(act), diff, a.n);
  free(a.grads);
  free(b.grads);
}

TEST(cnn_fused_equals_plain) {
  compare("cnn", 1, 12, AMPC_DTYPE_F32);
  compare("cnn", 1, 12, AMPC_DTYPE_F16);
}

TEST(resnet18_fused_equals_plain) {
  compare("resnet18", 3, 8, AMPC_DTYPE_F32);
  compare("resnet18", 3, 8, AMPC_DTYPE_BF16);
}

TEST_MAIN(TEST_ENTRY(cnn_fused_equals_plain), TEST_ENTRY(resnet18_fused_equals_plain))
