/* The fused graph (ReLU inside batch norm / add, a 2x2 max pool inside the
 * batch norm before it, a batch norm applied by the convolutions after it
 * instead of stored) computes exactly what the plain one-kernel-per-op graph
 * does: same loss, same gradients, bit for bit in f32 and in half storage,
 * in training and in eval mode, on even and odd planes. */
#include "ampc/nn.h"
#include "ampc/rng.h"
#include "backend/cpu/cpu_internal.h"
#include "core/graph_internal.h"
#include "test.h"

/* the cpu kernels' instruction-set level both graphs run with (NULL: the best the CPU has) */
static const ampc__cpu_isa *test_isa = NULL;
/* and the backend, its convolution algorithm and threads, free_saved, and
 * SyncBatchNorm's path (over one rank) */
static const char *test_backend = NULL;
static ampc_conv_algo test_conv = AMPC_CONV_AUTO;
static int test_threads = 0, test_free_saved = 0, test_sync = 0, test_batch = 4;

static ampc_status one_rank_sum(void *ctx, double *v, size_t n) {
  (void)ctx, (void)v, (void)n;
  return AMPC_OK;
}
static const ampc__sync one_rank = {one_rank_sum, NULL};

/* batch norms of a compiled graph that store nothing (attr.nostore) */
static int count_nostore(const ampc_graph *g) {
  int n = 0;
  for (size_t i = 0; i < g->nv; i++) n += g->v[i].op == AMPC_OP_BATCHNORM2D && g->v[i].attr.nostore;
  return n;
}
static int last_nostore = -1, last_recompute = -1;
/* and those stored for forward but recomputed by backward (attr.recompute) */
static int count_recompute(const ampc_graph *g) {
  int n = 0;
  for (size_t i = 0; i < g->nv; i++) n += g->v[i].op == AMPC_OP_BATCHNORM2D && g->v[i].attr.recompute;
  return n;
}

typedef struct {
  float loss;
  float *grads;
  size_t n;
  size_t act_bytes;
} run_result;

static run_result run(const char *model, int C, int H, int fuse, ampc_dtype act, int training, int nan_at) {
  run_result r = {0};
  ampc_model_opts o = {.batch = test_batch, .channels = C, .height = H, .width = H, .classes = 10, .seed = 3};
  ampc_model *m;
  CHECK_OK(ampc_model_create(&m, model, &o));
  ampc_graph *g = ampc_model_graph(m);
  CHECK_OK(ampc_graph_set_fusion(g, fuse));
  if (test_backend || test_conv != AMPC_CONV_AUTO || test_threads) {
    ampc_backend_opts bo;
    ampc_backend_opts_default(&bo);
    bo.conv = test_conv;
    bo.threads = test_threads;
    CHECK_OK(ampc_graph_set_backend(g, test_backend ? test_backend : "cpu", &bo));
  }
  if (test_free_saved) CHECK_OK(ampc_graph_set_free_saved(g, 1));
  if (test_sync) ampc__graph_set_bn_sync(g, &one_rank);
  ampc_graph_precision p = {act, AMPC_DTYPE_F32, act, 0, AMPC_DTYPE_F16, NULL};
  CHECK_OK(ampc_graph_set_precision(g, &p));
  CHECK_OK(ampc_graph_compile(g));
  if (fuse) last_nostore = count_nostore(g), last_recompute = count_recompute(g);
  if (test_isa) ampc__cpu_set_isa(ampc__graph_device(g), test_isa);
  ampc_tensor x = ampc_graph_tensor(g, ampc_model_input(m));
  ampc_rng rng = ampc_rng_make(7, AMPC_RNG_STREAM_USER);
  size_t nx = (size_t)ampc_tensor_numel(&x);
  float *xf = malloc(nx * sizeof *xf);
  for (size_t i = 0; i < nx; i++) xf[i] = ampc_rng_normal(&rng);
  if (nan_at >= 0) xf[nan_at] = NAN;
  CHECK_OK(ampc_graph_write(g, ampc_model_input(m), xf, AMPC_DTYPE_F32));
  free(xf);
  int32_t labels[64];
  for (int i = 0; i < test_batch && i < 64; i++) labels[i] = (3 * i) % 10;
  CHECK_OK(ampc_graph_write(g, ampc_model_labels(m), labels, AMPC_DTYPE_I32));
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

/* a and b the same loss and gradients, bit for bit; frees both */
static void check_same(run_result a, run_result b, const char *what, const char *model, int H, ampc_dtype act, int training) {
  CHECK_MSG(same_float(a.loss, b.loss), "%s %s H=%d training=%d: loss %.9g vs %.9g (%s)", model, ampc_dtype_name(act), H, training,
            a.loss, b.loss, what);
  CHECK(a.n == b.n);
  size_t diff = 0;
  for (size_t i = 0; i < a.n && i < b.n; i++) diff += !same_float(a.grads[i], b.grads[i]);
  CHECK_MSG(diff == 0, "%s %s H=%d training=%d: %zu of %zu gradient values differ (%s)", model, ampc_dtype_name(act), H,
            training, diff, a.n, what);
  free(a.grads);
  free(b.grads);
}

/* Returns the fused graph's activation bytes over the plain one's. */
static double compare_mode(const char *model, int C, int H, ampc_dtype act, int training, int nan_at) {
  run_result a = run(model, C, H, 0, act, training, nan_at), b = run(model, C, H, 1, act, training, nan_at);
  double ratio = (double)b.act_bytes / (double)a.act_bytes;
  check_same(a, b, "unfused vs fused", model, H, act, training);
  return ratio;
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

/* the batch norm's output rounded to its 16-bit type (f16, bf16) for its
 * fused pool in one pass with the normalisation (the AVX2 and AVX-512
 * levels) or after it (the baseline): each level the CPU runs, with a NaN
 * and odd planes */
TEST(cnn_fused_pool_each_isa) {
  const ampc__cpu_isa *isas[3] = {&ampc__cpu_isa_baseline, NULL, NULL};
  if (ampc__cpu_isa_avx2 && ampc__cpu_has_avx2_f16c()) isas[1] = ampc__cpu_isa_avx2;
  if (ampc__cpu_isa_avx512 && ampc__cpu_has_avx512()) isas[2] = ampc__cpu_isa_avx512;
  static const ampc_dtype types[] = {AMPC_DTYPE_F16, AMPC_DTYPE_BF16};
  for (int i = 0; i < 3; i++) {
    if (!isas[i]) continue;
    test_isa = isas[i];
    for (int t = 0; t < 2; t++) {
      compare_mode("cnn", 1, 12, types[t], 1, -1);
      compare_mode("cnn", 2, 19, types[t], 1, 30);
      compare_mode("cnn", 1, 12, types[t], 0, 30);
    }
  }
  test_isa = NULL;
}

/* Batch norm backward's fused passes over 16-bit planes (the fused pool's
 * gradient, the sums with x converted as they are read, dx stored straight
 * into f16), at the AVX-512 and the AVX2 level where the CPU has them, give
 * the per-plane loops' bits (dx straight into bf16 too): fused and plain
 * graphs, f16 and bf16, training and eval, a NaN, planes whose sizes end in
 * a whole vector, 8 values and single ones (12x12 -> 6x6, 13x13, 28x28 ->
 * 14x14), pooled rows of 6, 8, 9 and 14 windows, odd planes, x kept in f32 between the passes or converted again
 * (N x H x W above 65536), and no channel cache at all (above 2^18); planes
 * of 4x4 to 9x9 through the channel loop, SyncBatchNorm's passes and the
 * guarded backend; ResNet-18 (batch norms that store nothing or are
 * recomputed). Where the CPU has neither level, both runs take the loops. */
extern int ampc__cpu_bn_generic;
static void compare_generic(const char *model, int C, int H, int fuse, ampc_dtype act, int training, int nan_at) {
  ampc__cpu_bn_generic = 1;
  run_result a = run(model, C, H, fuse, act, training, nan_at);
  ampc__cpu_bn_generic = 0;
  run_result b = run(model, C, H, fuse, act, training, nan_at);
  check_same(a, b, fuse ? "fused graph, per-plane loops vs fused passes" : "plain graph, per-plane loops vs fused passes", model,
             H, act, training);
}
static void bn_passes_cases(void) {
  static const ampc_dtype types[] = {AMPC_DTYPE_F16, AMPC_DTYPE_BF16};
  static const int sizes[] = {12, 13, 17, 19, 28};
  for (int f = 0; f < 2; f++)
    for (int t = 0; t < 2; t++) {
      for (int h = 0; h < 5; h++) compare_generic("cnn", 1 + (h & 1), sizes[h], f, types[t], 1, -1);
      compare_generic("cnn", 1, 12, f, types[t], 0, -1);
      compare_generic("cnn", 1, 12, f, types[t], 1, 30);
      compare_generic("resnet18", 3, 8, f, types[t], 1, -1);
    }
  /* small planes through the channel loop (the pool gradient's masked
   * stores), SyncBatchNorm's passes, the guarded backend */
  extern int ampc__cpu_bn_by_channel;
  ampc__cpu_bn_by_channel = 1;
  for (int h = 4; h <= 9; h++) compare_generic("cnn", 1, h, 1, AMPC_DTYPE_F16, 1, -1);
  ampc__cpu_bn_by_channel = 0;
  test_sync = 1;
  compare_generic("cnn", 1, 13, 1, AMPC_DTYPE_F16, 1, -1);
  compare_generic("cnn", 2, 6, 1, AMPC_DTYPE_BF16, 1, -1);
  test_sync = 0;
  test_backend = "cpu-guarded";
  compare_generic("cnn", 1, 13, 1, AMPC_DTYPE_F16, 1, -1);
  test_backend = NULL;
  test_batch = 2;
  compare_generic("cnn", 1, 186, 1, AMPC_DTYPE_F16, 1, -1); /* 2 x 186 x 186 > 65536: x converted again */
  compare_generic("cnn", 1, 363, 1, AMPC_DTYPE_F16, 1, -1); /* > 2^18: no cache */
  test_batch = 4;
}
TEST(batchnorm_bwd_passes_same_bits) {
  const ampc__cpu_isa *isas[2] = {NULL, NULL};
  if (ampc__cpu_isa_avx512 && ampc__cpu_has_avx512()) isas[0] = ampc__cpu_isa_avx512;
  if (ampc__cpu_isa_avx2 && ampc__cpu_has_avx2_f16c()) isas[1] = ampc__cpu_isa_avx2;
  for (int i = 0; i < 2; i++) {
    if (!isas[i]) continue;
    test_isa = isas[i];
    bn_passes_cases();
  }
  test_isa = NULL;
}

TEST(resnet18_fused_equals_plain) {
  compare("resnet18", 3, 8, AMPC_DTYPE_F32);
  compare("resnet18", 3, 8, AMPC_DTYPE_BF16);
}

/* ResNet-18's first batch norm of each block is applied by the block's
 * second convolution as it loads its input, on each convolution path
 * (Winograd, im2col, the direct loop), each storage type, in training and
 * eval mode, with a NaN, on one and two threads, with free_saved, through
 * SyncBatchNorm's path and on the guarded backend (whose pages outside a
 * call's named memory fault); its output is not stored. */
TEST(resnet18_batchnorm_in_convolution) {
  static const ampc_dtype types[] = {AMPC_DTYPE_F32, AMPC_DTYPE_F16, AMPC_DTYPE_BF16};
  static const ampc_conv_algo algos[] = {AMPC_CONV_AUTO, AMPC_CONV_IM2COL, AMPC_CONV_DIRECT};
  for (int a = 0; a < 3; a++) {
    test_conv = algos[a];
    for (int t = 0; t < 3; t++) compare_mode("resnet18", 3, 8, types[t], a == 0 || t == 1, -1);
  }
  test_conv = AMPC_CONV_AUTO;
  CHECK_MSG(last_nostore == 8, "%d batch norms store nothing, not ResNet-18's 8", last_nostore);
  CHECK_MSG(last_recompute == 1, "%d batch norms recomputed by backward, not ResNet-18's first alone", last_recompute);
  compare_mode("resnet18", 3, 8, AMPC_DTYPE_F16, 0, -1);
  compare_mode("resnet18", 3, 8, AMPC_DTYPE_F16, 1, 17);
  compare_mode("resnet18", 3, 6, AMPC_DTYPE_F32, 1, -1); /* planes of 6, 3, 2, 1 */
  test_threads = 1;
  compare_mode("resnet18", 3, 8, AMPC_DTYPE_F16, 1, -1);
  test_threads = 2;
  test_free_saved = 1;
  compare_mode("resnet18", 3, 8, AMPC_DTYPE_F16, 1, -1);
  test_free_saved = 0;
  test_sync = 1;
  compare_mode("resnet18", 3, 8, AMPC_DTYPE_F16, 1, -1);
  compare_mode("resnet18", 3, 8, AMPC_DTYPE_F32, 1, 5);
  test_sync = 0;
  test_threads = 0;
  test_backend = "cpu-guarded";
  compare_mode("resnet18", 3, 8, AMPC_DTYPE_F16, 1, -1);
  test_backend = NULL;
  /* activations: what the other fusions leave, less these outputs (a
   * quarter of ResNet-18's stored activations at batch 128) */
  ampc__graph_bn_prologue = 0;
  double before = compare_mode("resnet18", 3, 8, AMPC_DTYPE_F16, 1, -1);
  CHECK(last_nostore == 0);
  ampc__graph_bn_prologue = 1;
  double ratio = compare_mode("resnet18", 3, 8, AMPC_DTYPE_F16, 1, -1);
  CHECK_MSG(ratio < 0.9 * before, "fused activations %.3f of the plain graph's, %.3f without this fusion", ratio, before);
}

/* A kept batch norm output (or its ReLU's) is stored and readable; one that
 * is not says why it cannot be read. */
TEST(batchnorm_in_convolution_kept) {
  ampc_model_opts o = {.batch = 2, .channels = 3, .height = 8, .width = 8, .classes = 10, .seed = 3};
  ampc_model *m;
  CHECK_OK(ampc_model_create(&m, "resnet18", &o));
  ampc_graph *g = ampc_model_graph(m);
  CHECK_OK(ampc_graph_compile(g));
  ampc_value bn = AMPC_VALUE_NONE, relu = AMPC_VALUE_NONE;
  for (size_t i = 0; i < g->nv && bn == AMPC_VALUE_NONE; i++)
    if (g->v[i].op == AMPC_OP_BATCHNORM2D && g->v[i].attr.nostore) bn = (ampc_value)i;
  for (size_t i = 0; i < g->nv; i++)
    if (g->v[i].op == AMPC_OP_RELU && g->v[i].alias == bn) relu = (ampc_value)i;
  CHECK(bn != AMPC_VALUE_NONE && relu != AMPC_VALUE_NONE);
  float *buf = calloc(2 * 64 * 64, sizeof(float));
  CHECK_OK(ampc_graph_forward(g, 1));
  CHECK(ampc_graph_read(g, relu, buf, AMPC_DTYPE_F32) == AMPC_EINVAL);
  CHECK(strstr(ampc_last_error(), "convolutions after it") != NULL);
  ampc_model_free(m);
  for (int k = 0; k < 2; k++) {
    CHECK_OK(ampc_model_create(&m, "resnet18", &o));
    g = ampc_model_graph(m);
    CHECK_OK(ampc_graph_keep(g, k ? relu : bn));
    CHECK_OK(ampc_graph_compile(g));
    CHECK(!g->v[bn].attr.nostore);
    CHECK(count_nostore(g) == 7);
    CHECK_OK(ampc_graph_forward(g, 1));
    CHECK_OK(ampc_graph_read(g, relu, buf, AMPC_DTYPE_F32));
    ampc_model_free(m);
  }
  free(buf);
}

TEST_MAIN(TEST_ENTRY(cnn_fused_equals_plain), TEST_ENTRY(cnn_fused_pool_cases), TEST_ENTRY(cnn_fused_pool_each_isa),
          TEST_ENTRY(batchnorm_bwd_passes_same_bits),
          TEST_ENTRY(resnet18_fused_equals_plain), TEST_ENTRY(resnet18_batchnorm_in_convolution),
          TEST_ENTRY(batchnorm_in_convolution_kept))
