/* The fused graph (ReLU inside batch norm / add, a 2x2 max pool inside the
 * batch norm before it) computes exactly what the plain one-kernel-per-op
 * graph does: same loss, same gradients, bit for bit in f32 and in half
 * storage, in training and in eval mode, on even and odd planes. */
#include "ampc/nn.h"
#include "ampc/rng.h"
#include "backend/cpu/cpu_internal.h"
#include "core/graph_internal.h"
#include "test.h"

/* the cpu kernels' instruction-set level both graphs run with (NULL: the best the CPU has) */
static const ampc__cpu_isa *test_isa = NULL;

typedef struct {
  float loss;
  float *grads;
  size_t n;
  size_t act_bytes;
} run_result;

static run_result run(const char *model, int C, int H, int fuse, ampc_dtype act, int training, int nan_at) {
  run_result r = {0};
  ampc_model_opts o = {.batch = 4, .channels = C, .height = H, .width = H, .classes = 10, .seed = 3};
  ampc_model *m;
  CHECK_OK(ampc_model_create(&m, model, &o));
  ampc_graph *g = ampc_model_graph(m);
  CHECK_OK(ampc_graph_set_fusion(g, fuse));
  ampc_graph_precision p = {act, AMPC_DTYPE_F32, act, 0, AMPC_DTYPE_F16, NULL};
  CHECK_OK(ampc_graph_set_precision(g, &p));
  CHECK_OK(ampc_graph_compile(g));
  if (test_isa) ampc__cpu_set_isa(ampc__graph_device(g), test_isa);
  ampc_tensor x = ampc_graph_tensor(g, ampc_model_input(m));
  ampc_rng rng = ampc_rng_make(7, AMPC_RNG_STREAM_USER);
  size_t nx = (size_t)ampc_tensor_numel(&x);
  float *xf = malloc(nx * sizeof *xf);
  for (size_t i = 0; i < nx; i++) xf[i] = ampc_rng_normal(&rng);
  if (nan_at >= 0) xf[nan_at] = NAN;
  CHECK_OK(ampc_graph_write(g, ampc_model_input(m), xf, AMPC_DTYPE_F32));
  free(xf);
  CHECK_OK(ampc_graph_write(g, ampc_model_labels(m), (const int32_t[]){0, 3, 6, 9}, AMPC_DTYPE_I32));
  CHECK_OK(ampc_graph_forward(g, training));
  CHECK_OK(ampc_graph_backward(g, ampc_model_loss(m), 1.0f, 0));
  CHECK_OK(ampc_graph_read(g, ampc_model_loss(m), &r.loss, AMPC_DTYPE_F32));
  ampc_mem_report mr;
  ampc_graph_memory(g, &mr);
  r.act_bytes = ampc_mem_total(&mr, AMPC_MEM_ACTIVATIONS);
  r.n = ampc_graph_param_numel(g);
  r.grads = malloc(r.n * sizeof(float));
  for (size_t i = 0; i < ampc_graph_param_count(g); i++) {
    ampc_value v = ampc_graph_param_at(g, i);
    CHECK_OK(ampc_graph_read_grad(g, v, r.grads + ampc_graph_param_offset(g, v), AMPC_DTYPE_F32));
  }
  ampc_model_free(m);
  return r;
}

static int same_float(float a, float b) { return (isnan(a) && isnan(b)) || memcmp(&a, &b, 4) == 0; }

/* Returns the fused graph's activation bytes over the plain one's. */
static double compare_mode(const char *model, int C, int H, ampc_dtype act, int training, int nan_at) {
  run_result a = run(model, C, H, 0, act, training, nan_at), b = run(model, C, H, 1, act, training, nan_at);
  CHECK_MSG(same_float(a.loss, b.loss), "%s %s H=%d training=%d: loss %.9g unfused vs %.9g fused", model,
            ampc_dtype_name(act), H, training, a.loss, b.loss);
  CHECK(a.n == b.n);
  size_t diff = 0;
  for (size_t i = 0; i < a.n && i < b.n; i++) diff += !same_float(a.grads[i], b.grads[i]);
  CHECK_MSG(diff == 0, "%s %s H=%d training=%d: %zu of %zu gradient values differ", model, ampc_dtype_name(act), H,
            training, diff, a.n);
  free(a.grads);
  free(b.grads);
  return (double)b.act_bytes / (double)a.act_bytes;
}

static void compare(const char *model, int C, int H, ampc_dtype act) { compare_mode(model, C, H, act, 1, -1); }

TEST(cnn_fused_equals_plain) {
  compare("cnn", 1, 12, AMPC_DTYPE_F32);
  compare("cnn", 1, 12, AMPC_DTYPE_F16);
}

/* the cnn's pools run inside its batch norms: odd planes (the last row and
 * column outside every window), bf16, eval-mode statistics, and a NaN that
 * wins its window */
TEST(cnn_fused_pool_cases) {
  static const ampc_dtype types[] = {AMPC_DTYPE_F32, AMPC_DTYPE_F16, AMPC_DTYPE_BF16};
  for (int t = 0; t < 3; t++) {
    compare_mode("cnn", 1, 13, types[t], 1, -1);
    compare_mode("cnn", 2, 19, types[t], 1, -1);
    compare_mode("cnn", 1, 12, types[t], 0, -1);
  }
  compare_mode("cnn", 1, 12, AMPC_DTYPE_F32, 1, 30);
  compare_mode("cnn", 1, 12, AMPC_DTYPE_F16, 0, 30);
  /* the batch norms' full-size outputs are gone: only the pooled values and
   * a byte per window are kept */
  double ratio = compare_mode("cnn", 1, 16, AMPC_DTYPE_F16, 1, -1);
  CHECK_MSG(ratio < 0.8, "fused activations %.3f of the plain graph's", ratio);
}

/* the batch norm's output rounded to f16 for its fused pool in one pass
 * with the normalisation (the AVX2 and AVX-512 levels) or after it (the
 * baseline): each level the CPU runs, with a NaN and odd planes */
TEST(cnn_fused_pool_each_isa) {
  const ampc__cpu_isa *isas[3] = {&ampc__cpu_isa_baseline, NULL, NULL};
  if (ampc__cpu_isa_avx2 && ampc__cpu_has_avx2_f16c()) isas[1] = ampc__cpu_isa_avx2;
  if (ampc__cpu_isa_avx512 && ampc__cpu_has_avx512()) isas[2] = ampc__cpu_isa_avx512;
  for (int i = 0; i < 3; i++) {
    if (!isas[i]) continue;
    test_isa = isas[i];
    compare_mode("cnn", 1, 12, AMPC_DTYPE_F16, 1, -1);
    compare_mode("cnn", 2, 19, AMPC_DTYPE_F16, 1, 30);
    compare_mode("cnn", 1, 12, AMPC_DTYPE_F16, 0, 30);
  }
  test_isa = NULL;
}

TEST(resnet18_fused_equals_plain) {
  compare("resnet18", 3, 8, AMPC_DTYPE_F32);
  compare("resnet18", 3, 8, AMPC_DTYPE_BF16);
}

TEST_MAIN(TEST_ENTRY(cnn_fused_equals_plain), TEST_ENTRY(cnn_fused_pool_cases), TEST_ENTRY(cnn_fused_pool_each_isa),
          TEST_ENTRY(resnet18_fused_equals_plain))
