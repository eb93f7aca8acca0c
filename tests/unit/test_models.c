/* The built-in models: parameter counts, state_dict names and shapes in
 * PyTorch's order (ResNet-18 against a list PyTorch printed, committed as
 * tests/fixtures/resnet18_state_dict_keys.txt), default initialisation,
 * refused options, and a forward/backward that runs.
 *
 * The references: the reference training script (bench/pytorch_resnet18.py is the same model) (the CIFAR
 * ResNet-18, 11,173,962 parameters for 10 classes) and
 * the reference Fashion-MNIST script (bench/pytorch_fmnist_cnn.py) (an nn.Sequential of 12
 * modules, 421,834 parameters for 1x28x28 inputs and 10 classes).
 */
#include <math.h>

#include "ampc/nn.h"
#include "ampc/rng.h"
#include "ampc/amp.h"
#include "test.h"

static ampc_model_opts opts_of(int64_t batch, int c, int h, int w, int classes, uint64_t seed) {
  ampc_model_opts o = {.batch = batch, .channels = c, .height = h, .width = w, .classes = classes, .seed = seed};
  return o;
}

/* One state_dict entry: name and shape (ndim 0 for a scalar). */
typedef struct {
  char name[96];
  int ndim;
  int64_t d[4];
} entry;

/* Every parameter and buffer of the model's graph, in recording order
 * (which is the order PyTorch's state_dict lists them in). */
static size_t model_entries(ampc_model *m, entry *out, size_t cap) {
  ampc_graph *g = ampc_model_graph(m);
  size_t n = 0;
  for (size_t i = 0; i < ampc_graph_value_count(g); i++) {
    ampc_op_kind k = ampc_graph_op(g, (ampc_value)i);
    if (k != AMPC_OP_PARAM && k != AMPC_OP_BUFFER) continue;
    if (n < cap) {
      entry *e = &out[n];
      snprintf(e->name, sizeof e->name, "%s", ampc_graph_name(g, (ampc_value)i));
      ampc_tensor t = ampc_graph_tensor(g, (ampc_value)i);
      e->ndim = t.shape.ndim;
      for (int j = 0; j < 4; j++) e->d[j] = j < t.shape.ndim ? t.shape.d[j] : 0;
    }
    n++;
  }
  return n;
}

/* "name [64, 3, 3, 3]" per line; '#' lines are comments. */
static size_t read_fixture(const char *path, entry *out, size_t cap) {
  FILE *f = fopen(path, "r");
  CHECK_MSG(f != NULL, "cannot open %s", path);
  if (!f) return 0;
  char line[256];
  size_t n = 0;
  while (fgets(line, sizeof line, f)) {
    if (line[0] == '#' || line[0] == '\n') continue;
    char *sp = strchr(line, ' '), *lb = strchr(line, '[');
    CHECK_MSG(sp && lb, "bad fixture line: %s", line);
    if (!sp || !lb || n >= cap) continue;
    entry *e = &out[n++];
    memset(e, 0, sizeof *e);
    *sp = '\0';
    snprintf(e->name, sizeof e->name, "%.95s", line);
    char *p = lb + 1;
    while (*p && *p != ']' && e->ndim < 4) {
      char *end;
      long long v = strtoll(p, &end, 10);
      if (end == p) break;
      e->d[e->ndim++] = v;
      p = end;
      while (*p == ',' || *p == ' ') p++;
    }
  }
  fclose(f);
  return n;
}

static void shape_text(const entry *e, char *buf, size_t len) {
  size_t o = (size_t)snprintf(buf, len, "[");
  for (int i = 0; i < e->ndim && o < len; i++) o += (size_t)snprintf(buf + o, len - o, "%s%lld", i ? ", " : "", (long long)e->d[i]);
  if (o < len) snprintf(buf + o, len - o, "]");
}

static void check_entries(const entry *got, size_t ngot, const entry *want, size_t nwant, const char *model) {
  CHECK_MSG(ngot == nwant, "%s: %zu parameters and buffers, PyTorch has %zu", model, ngot, nwant);
  size_t n = ngot < nwant ? ngot : nwant;
  int reported = 0;
  for (size_t i = 0; i < n && reported < 5; i++) {
    int same = strcmp(got[i].name, want[i].name) == 0 && got[i].ndim == want[i].ndim;
    for (int j = 0; same && j < got[i].ndim; j++) same = got[i].d[j] == want[i].d[j];
    if (!same) {
      char a[64], b[64];
      shape_text(&got[i], a, sizeof a);
      shape_text(&want[i], b, sizeof b);
      CHECK_MSG(same, "%s: entry %zu is %s %s, PyTorch has %s %s", model, i, got[i].name, a, want[i].name, b);
      reported++;
    }
  }
}

static ampc_model *make(const char *name, ampc_model_opts o) {
  ampc_model *m = NULL;
  CHECK_OK(ampc_model_create(&m, name, &o));
  return m;
}

/* The shape of the named parameter or buffer (ndim -1 if there is none). */
static entry find_entry(ampc_model *m, const char *name) {
  entry e = {.ndim = -1};
  ampc_graph *g = ampc_model_graph(m);
  ampc_value v = ampc_graph_find(g, name);
  if (v < 0) return e;
  ampc_tensor t = ampc_graph_tensor(g, v);
  snprintf(e.name, sizeof e.name, "%s", name);
  e.ndim = t.shape.ndim;
  for (int j = 0; j < t.shape.ndim; j++) e.d[j] = t.shape.d[j];
  return e;
}

static void check_shape(ampc_model *m, const char *name, int ndim, int64_t d0, int64_t d1, int64_t d2, int64_t d3) {
  entry e = find_entry(m, name);
  int64_t d[4] = {d0, d1, d2, d3};
  int same = e.ndim == ndim;
  for (int j = 0; same && j < ndim; j++) same = e.d[j] == d[j];
  char a[64];
  shape_text(&e, a, sizeof a);
  CHECK_MSG(same, "%s: shape %s (ndim %d)", name, e.ndim < 0 ? "missing" : a, e.ndim);
}

TEST(resnet18_matches_pytorch_state_dict) {
  ampc_model *m = make("resnet18", opts_of(2, 3, 32, 32, 10, 1));
  if (!m) return;
  CHECK(ampc_model_param_count(m) == 11173962);
  static entry got[200], want[200];
  size_t ngot = model_entries(m, got, 200);
  size_t nwant = read_fixture(AMPC_TEST_FIXTURES "/resnet18_state_dict_keys.txt", want, 200);
  CHECK(nwant == 122);
  check_entries(got, ngot, want, nwant, "resnet18");
  check_shape(m, "conv1.weight", 4, 64, 3, 3, 3);
  check_shape(m, "bn1.running_mean", 1, 64, 0, 0, 0);
  check_shape(m, "bn1.num_batches_tracked", 0, 0, 0, 0, 0);
  check_shape(m, "layer2.0.shortcut.0.weight", 4, 128, 64, 1, 1);
  check_shape(m, "layer2.0.shortcut.1.weight", 1, 128, 0, 0, 0);
  check_shape(m, "layer4.1.bn2.bias", 1, 512, 0, 0, 0);
  check_shape(m, "linear.weight", 2, 10, 512, 0, 0);
  check_shape(m, "linear.bias", 1, 10, 0, 0, 0);
  /* blocks that keep their width have no shortcut */
  CHECK(ampc_graph_find(ampc_model_graph(m), "layer1.0.shortcut.0.weight") < 0);
  CHECK(ampc_graph_find(ampc_model_graph(m), "layer2.1.shortcut.0.weight") < 0);
  /* normalisation parameters are marked (keep_batchnorm_fp32 keeps exactly these) */
  ampc_graph *g = ampc_model_graph(m);
  CHECK(ampc_graph_param_is_norm(g, ampc_graph_find(g, "layer3.1.bn1.weight")));
  CHECK(ampc_graph_param_is_norm(g, ampc_graph_find(g, "layer2.0.shortcut.1.bias")));
  CHECK(!ampc_graph_param_is_norm(g, ampc_graph_find(g, "layer3.1.conv1.weight")));
  CHECK(!ampc_graph_param_is_norm(g, ampc_graph_find(g, "linear.bias")));
  ampc_model_free(m);
}

/* The Fashion-MNIST CNN of the reference (nn.Sequential, so PyTorch names
 * its modules by index); listed here from its state_dict. */
TEST(cnn_matches_pytorch_state_dict) {
  static const entry want[] = {
      {"0.weight", 4, {32, 1, 3, 3}}, {"0.bias", 1, {32}},
      {"1.weight", 1, {32}},          {"1.bias", 1, {32}},
      {"1.running_mean", 1, {32}},    {"1.running_var", 1, {32}},
      {"1.num_batches_tracked", 0, {0}},
      {"4.weight", 4, {64, 32, 3, 3}}, {"4.bias", 1, {64}},
      {"5.weight", 1, {64}},          {"5.bias", 1, {64}},
      {"5.running_mean", 1, {64}},    {"5.running_var", 1, {64}},
      {"5.num_batches_tracked", 0, {0}},
      {"9.weight", 2, {128, 3136}},   {"9.bias", 1, {128}},
      {"11.weight", 2, {10, 128}},    {"11.bias", 1, {10}},
  };
  ampc_model *m = make("cnn", opts_of(4, 1, 28, 28, 10, 1));
  if (!m) return;
  CHECK(ampc_model_param_count(m) == 421834);
  entry got[40];
  size_t ngot = model_entries(m, got, 40);
  check_entries(got, ngot, want, sizeof want / sizeof want[0], "cnn");
  ampc_model_free(m);
  /* other input sizes and class counts change only the linear layers */
  m = make("cnn", opts_of(4, 3, 32, 32, 7, 1));
  if (!m) return;
  check_shape(m, "0.weight", 4, 32, 3, 3, 3);
  check_shape(m, "9.weight", 2, 128, 64 * 8 * 8, 0, 0);
  check_shape(m, "11.weight", 2, 7, 128, 0, 0);
  CHECK(ampc_model_param_count(m) == 32 * 27 + 32 + 64 + 64 * 32 * 9 + 64 + 128 + 4096 * 128 + 128 + 128 * 7 + 7);
  ampc_model_free(m);
}

/* nn.Sequential(Flatten, Linear(in, 256), ReLU, Linear(256, 128), ReLU, Linear(128, classes)). */
TEST(mlp_names_and_count) {
  ampc_model *m = make("mlp", opts_of(4, 1, 28, 28, 10, 1));
  if (!m) return;
  CHECK(ampc_model_param_count(m) == 784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10);
  static const entry want[] = {{"1.weight", 2, {256, 784}}, {"1.bias", 1, {256}}, {"3.weight", 2, {128, 256}},
                               {"3.bias", 1, {128}},        {"5.weight", 2, {10, 128}}, {"5.bias", 1, {10}}};
  entry got[10];
  size_t ngot = model_entries(m, got, 10);
  check_entries(got, ngot, want, sizeof want / sizeof want[0], "mlp");
  ampc_model_free(m);
}

/* PyTorch's defaults: conv and linear weights kaiming_uniform(a = sqrt(5)),
 * i.e. uniform(+-1/sqrt(fan_in)), so std bound/sqrt(3); biases the same
 * bound; batch norm weight 1, bias 0, running mean 0, running var 1, no
 * batches tracked. */
TEST(default_init) {
  ampc_model *m = make("resnet18", opts_of(2, 3, 32, 32, 10, 7));
  if (!m) return;
  ampc_graph *g = ampc_model_graph(m);
  CHECK_OK(ampc_graph_compile(g));
  int convs = 0, bns = 0;
  for (size_t i = 0; i < ampc_graph_value_count(g); i++) {
    ampc_value v = (ampc_value)i;
    ampc_op_kind k = ampc_graph_op(g, v);
    if (k != AMPC_OP_PARAM && k != AMPC_OP_BUFFER) continue;
    const char *name = ampc_graph_name(g, v);
    ampc_tensor t = ampc_graph_tensor(g, v);
    size_t n = (size_t)ampc_tensor_numel(&t);
    const char *leaf = strrchr(name, '.') ? strrchr(name, '.') + 1 : name;
    if (t.dtype == AMPC_DTYPE_I64) {
      int64_t nbt = -1;
      CHECK_OK(ampc_graph_read(g, v, &nbt, AMPC_DTYPE_I64));
      CHECK(strcmp(leaf, "num_batches_tracked") == 0 && n == 1 && nbt == 0);
      continue;
    }
    CHECK(t.dtype == AMPC_DTYPE_F32);
    float *x = malloc(n * sizeof *x);
    if (!x) continue;
    CHECK_OK(ampc_graph_read(g, v, x, AMPC_DTYPE_F32));
    if (k == AMPC_OP_PARAM) CHECK(memcmp(x, ampc_graph_param_init(g, v), n * sizeof(float)) == 0);
    if (ampc_graph_param_is_norm(g, v) || strstr(leaf, "running_")) {
      float want = strcmp(leaf, "weight") == 0 || strcmp(leaf, "running_var") == 0 ? 1.0f : 0.0f;
      size_t bad = 0;
      for (size_t j = 0; j < n; j++) bad += x[j] != want;
      CHECK_MSG(bad == 0, "%s: %zu values differ from %g", name, bad, (double)want);
      bns += strcmp(leaf, "weight") == 0;
      free(x);
      continue;
    }
    /* conv weights (O, C, k, k): fan_in C*k*k; the linear layer: 512 */
    double fan_in = t.shape.ndim == 4 ? (double)(t.shape.d[1] * t.shape.d[2] * t.shape.d[3]) : 512.0;
    double bound = 1.0 / sqrt(fan_in), mx = 0.0, s = 0.0, s2 = 0.0;
    for (size_t j = 0; j < n; j++) {
      mx = fmax(mx, fabs(x[j]));
      s += x[j];
      s2 += (double)x[j] * x[j];
    }
    double mean = s / (double)n, sd = sqrt(s2 / (double)n - mean * mean), want_sd = bound / sqrt(3.0);
    CHECK_MSG(mx <= bound * (1 + 1e-6), "%s: max |w| %g > bound %g", name, mx, bound);
    if (n >= 1000) {
      CHECK_MSG(fabs(sd / want_sd - 1.0) < 0.05, "%s: std %g, expected %g", name, sd, want_sd);
      CHECK_MSG(fabs(mean) < 5.0 * want_sd / sqrt((double)n), "%s: mean %g", name, mean);
      CHECK_MSG(mx > 0.95 * bound, "%s: max |w| %g, bound %g: the range is not covered", name, mx, bound);
    }
    convs += t.shape.ndim == 4;
    free(x);
  }
  CHECK(convs == 20); /* conv1, 16 in the blocks, 3 shortcuts */
  CHECK(bns == 20);
  ampc_model_free(m);
}

/* The initialisation is a function of the seed alone. */
TEST(init_is_seeded) {
  ampc_model *a = make("cnn", opts_of(2, 1, 28, 28, 10, 42)), *b = make("cnn", opts_of(8, 1, 28, 28, 10, 42));
  ampc_model *c = make("cnn", opts_of(2, 1, 28, 28, 10, 43));
  if (a && b && c) {
    ampc_graph *ga = ampc_model_graph(a), *gb = ampc_model_graph(b), *gc = ampc_model_graph(c);
    const char *names[] = {"0.weight", "4.bias", "9.weight", "11.weight"};
    for (int i = 0; i < 4; i++) {
      ampc_value va = ampc_graph_find(ga, names[i]), vb = ampc_graph_find(gb, names[i]), vc = ampc_graph_find(gc, names[i]);
      CHECK(va >= 0 && vb >= 0 && vc >= 0);
      if (va < 0 || vb < 0 || vc < 0) continue;
      ampc_tensor t = ampc_graph_tensor(ga, va);
      size_t n = (size_t)ampc_tensor_numel(&t) * sizeof(float);
      CHECK_MSG(memcmp(ampc_graph_param_init(ga, va), ampc_graph_param_init(gb, vb), n) == 0, "%s: same seed, other batch", names[i]);
      CHECK_MSG(memcmp(ampc_graph_param_init(ga, va), ampc_graph_param_init(gc, vc), n) != 0, "%s: other seed, same values", names[i]);
    }
  }
  ampc_model_free(a);
  ampc_model_free(b);
  ampc_model_free(c);
}

TEST(model_errors) {
  static int sentinel;
  ampc_model *const junk = (ampc_model *)(void *)&sentinel; /* create must set NULL on failure */
  ampc_model *m = junk;
  ampc_model_opts ok = opts_of(2, 1, 28, 28, 10, 1);
  CHECK_ERR(ampc_model_create(&m, "vgg16", &ok), AMPC_EINVAL, "unknown model 'vgg16'");
  CHECK(m == NULL);
  CHECK(strstr(ampc_last_error(), "mlp") && strstr(ampc_last_error(), "cnn") && strstr(ampc_last_error(), "resnet18"));
  CHECK_ERR(ampc_model_create(&m, NULL, &ok), AMPC_EINVAL, "ampc_model_create: name is NULL");
  CHECK_ERR(ampc_model_create(&m, "", &ok), AMPC_EINVAL, "unknown model");
  CHECK_ERR(ampc_model_create(&m, "ResNet18", &ok), AMPC_EINVAL, "unknown model");
  const ampc_model_opts bad[] = {
      opts_of(0, 1, 28, 28, 10, 1), opts_of(-3, 1, 28, 28, 10, 1), opts_of(2, 0, 28, 28, 10, 1),
      opts_of(2, 1, 0, 28, 10, 1),  opts_of(2, 1, 28, -1, 10, 1),  opts_of(2, 1, 28, 28, 1, 1),
      opts_of(2, 1, 28, 28, 0, 1),
  };
  const char *models[] = {"mlp", "cnn", "resnet18"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    for (int j = 0; j < 3; j++) {
      m = junk;
      CHECK_ERR(ampc_model_create(&m, models[j], &bad[i]), AMPC_EINVAL, models[j]);
      CHECK(m == NULL);
    }
  /* two 2x2 max-pools need sides of at least 4; odd sides lose their last
   * row or column at each pool, as in PyTorch: 30x27 -> 15x13 -> 7x6 */
  ampc_model_opts tiny = opts_of(2, 1, 3, 28, 10, 1);
  CHECK_ERR(ampc_model_create(&m, "cnn", &tiny), AMPC_EINVAL, "smaller than 4x4");
  CHECK(m == NULL);
  ampc_model_opts odd = opts_of(2, 1, 30, 27, 10, 1);
  CHECK_OK(ampc_model_create(&m, "cnn", &odd));
  ampc_value w = ampc_graph_find(ampc_model_graph(m), "9.weight");
  CHECK(w >= 0 && ampc_graph_tensor(ampc_model_graph(m), w).shape.d[1] == 64 * 7 * 6);
  ampc_model_free(m);
  ampc_model_free(NULL);
}

TEST(model_accessors) {
  CHECK(strstr(ampc_model_names(), "mlp") && strstr(ampc_model_names(), "cnn") && strstr(ampc_model_names(), "resnet18"));
  ampc_model_opts o = opts_of(3, 1, 28, 28, 10, 5);
  o.label_smoothing = 0.1f;
  ampc_model *m = make("cnn", o);
  if (!m) return;
  ampc_graph *g = ampc_model_graph(m);
  CHECK(strcmp(ampc_model_name(m), "cnn") == 0);
  CHECK(ampc_model_options(m)->batch == 3 && ampc_model_options(m)->label_smoothing == 0.1f);
  CHECK(ampc_graph_op(g, ampc_model_input(m)) == AMPC_OP_INPUT);
  CHECK(ampc_graph_op(g, ampc_model_labels(m)) == AMPC_OP_LABELS);
  CHECK(ampc_graph_op(g, ampc_model_loss(m)) == AMPC_OP_CROSS_ENTROPY);
  CHECK(ampc_graph_op(g, ampc_model_logits(m)) == AMPC_OP_LINEAR);
  CHECK_OK(ampc_graph_compile(g));
  ampc_tensor x = ampc_graph_tensor(g, ampc_model_input(m)), l = ampc_graph_tensor(g, ampc_model_logits(m));
  CHECK(x.shape.ndim == 4 && x.shape.d[0] == 3 && x.shape.d[1] == 1 && x.shape.d[2] == 28 && x.shape.d[3] == 28);
  CHECK(l.shape.ndim == 2 && l.shape.d[0] == 3 && l.shape.d[1] == 10);
  CHECK(ampc_graph_max_batch(g) == 3);
  /* the summary has a row per module, with its output shape and parameters */
  const ampc_nn *b = ampc_model_builder(m);
  CHECK(ampc_nn_row_count(b) == 12);
  int64_t total = 0;
  for (size_t i = 0; i < ampc_nn_row_count(b); i++) total += ampc_nn_row_at(b, i)->params;
  CHECK(total == 421834);
  const ampc_nn_row *r0 = ampc_nn_row_at(b, 0);
  CHECK(r0 && strcmp(r0->name, "0") == 0 && strcmp(r0->kind, "Conv2d") == 0);
  CHECK_MSG(r0 && r0->out.ndim == 4 && r0->out.d[0] == 3 && r0->out.d[1] == 32 && r0->out.d[2] == 28,
            "row 0 output (%lld, %lld, %lld, %lld): expected (3, 32, 28, 28)", r0 ? (long long)r0->out.d[0] : -1,
            r0 ? (long long)r0->out.d[1] : -1, r0 ? (long long)r0->out.d[2] : -1, r0 ? (long long)r0->out.d[3] : -1);
  CHECK(ampc_nn_row_at(b, 12) == NULL);
  ampc_model_free(m);
}

/* Every model's summary lists every layer the same way: a row per op the
 * model applies (parameter-free ones too), named as PyTorch would name the
 * module, in order; the rows' parameters add up to the model's. ResNet-18:
 * the stem (conv, bn, relu), per block conv-bn-relu-conv-bn, the shortcut
 * where there is one, the add and the second relu, then pool and linear. */
TEST(summary_rows_are_uniform) {
  static const struct {
    const char *model;
    int c, hw;
    size_t rows, relus;
  } want[] = {{"mlp", 1, 28, 6, 2}, {"cnn", 1, 28, 12, 3}, {"resnet18", 3, 32, 3 + 8 * 7 + 3 * 2 + 2, 17}};
  for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) {
    ampc_model *m = make(want[k].model, opts_of(1, want[k].c, want[k].hw, want[k].hw, 10, 1));
    if (!m) continue;
    const ampc_nn *b = ampc_model_builder(m);
    size_t relus = 0;
    int64_t total = 0;
    for (size_t i = 0; i < ampc_nn_row_count(b); i++) {
      const ampc_nn_row *r = ampc_nn_row_at(b, i);
      CHECK_MSG(r->name[0] && r->kind[0] && r->out.ndim >= 2 && r->out.d[0] == 1, "%s row %zu: '%s' '%s'", want[k].model, i,
                r->name, r->kind);
      relus += strcmp(r->kind, "ReLU") == 0;
      total += r->params;
    }
    CHECK_MSG(ampc_nn_row_count(b) == want[k].rows && relus == want[k].relus, "%s: %zu rows (%zu ReLUs), expected %zu (%zu)",
              want[k].model, ampc_nn_row_count(b), relus, want[k].rows, want[k].relus);
    CHECK(total == ampc_model_param_count(m));
    if (strcmp(want[k].model, "resnet18") == 0) {
      const char *seq[] = {"layer2.0.conv1", "layer2.0.bn1", "layer2.0.relu1", "layer2.0.conv2", "layer2.0.bn2",
                           "layer2.0.shortcut.0", "layer2.0.shortcut.1", "layer2.0.add", "layer2.0.relu2"};
      size_t at = 0;
      while (at < ampc_nn_row_count(b) && strcmp(ampc_nn_row_at(b, at)->name, seq[0]) != 0) at++;
      for (size_t i = 0; i < sizeof seq / sizeof seq[0]; i++) {
        const ampc_nn_row *r = ampc_nn_row_at(b, at + i);
        CHECK_MSG(r && strcmp(r->name, seq[i]) == 0, "resnet18 row %zu: '%s', expected '%s'", at + i, r ? r->name : "(none)", seq[i]);
      }
    }
    ampc_model_free(m);
  }
}

static void fill_batch(ampc_model *m, uint64_t seed) {
  ampc_graph *g = ampc_model_graph(m);
  ampc_tensor x = ampc_graph_tensor(g, ampc_model_input(m)), y = ampc_graph_tensor(g, ampc_model_labels(m));
  size_t n = (size_t)ampc_tensor_numel(&x), ny = (size_t)y.shape.d[0];
  float *v = malloc(n * sizeof *v);
  int32_t *lab = malloc(ny * sizeof *lab);
  if (v && lab) {
    ampc_rng r = ampc_rng_make(seed, AMPC_RNG_STREAM_USER);
    for (size_t i = 0; i < n; i++) v[i] = ampc_rng_normal(&r);
    for (size_t i = 0; i < ny; i++) lab[i] = (int32_t)(i * 3 % (size_t)ampc_model_options(m)->classes);
    CHECK_OK(ampc_graph_write(g, ampc_model_input(m), v, AMPC_DTYPE_F32));
    CHECK_OK(ampc_graph_write(g, ampc_model_labels(m), lab, AMPC_DTYPE_I32));
  }
  free(v);
  free(lab);
}

/* A value's (or its gradient's) values as f32 (the caller frees). */
static float *read_values(ampc_graph *g, ampc_value v, int grad, size_t *n) {
  ampc_tensor t = grad ? ampc_graph_grad(g, v) : ampc_graph_tensor(g, v);
  *n = (size_t)ampc_tensor_numel(&t);
  float *x = malloc(*n * sizeof *x);
  if (x) CHECK_OK(grad ? ampc_graph_read_grad(g, v, x, AMPC_DTYPE_F32) : ampc_graph_read(g, v, x, AMPC_DTYPE_F32));
  return x;
}

static size_t count_nonfinite(ampc_graph *g, ampc_value v, int grad) {
  size_t n, bad = 0;
  float *x = read_values(g, v, grad, &n);
  if (!x) return n;
  for (size_t i = 0; i < n; i++) bad += !isfinite(x[i]);
  free(x);
  return bad;
}

static float loss_value(ampc_model *m) {
  float l = NAN;
  CHECK_OK(ampc_graph_read(ampc_model_graph(m), ampc_model_loss(m), &l, AMPC_DTYPE_F32));
  return l;
}

static int64_t read_i64(ampc_graph *g, ampc_value v) {
  int64_t x = -1;
  CHECK_OK(ampc_graph_read(g, v, &x, AMPC_DTYPE_I64));
  return x;
}

/* ResNet-18 at batch 2: a training forward and backward, and an eval
 * forward, give finite logits, loss and gradients. */
TEST(resnet18_runs) {
  ampc_model *m = make("resnet18", opts_of(2, 3, 32, 32, 10, 3));
  if (!m) return;
  ampc_graph *g = ampc_model_graph(m);
  CHECK_OK(ampc_graph_compile(g));
  fill_batch(m, 11);
  CHECK_OK(ampc_graph_forward(g, 1));
  ampc_tensor logits = ampc_graph_tensor(g, ampc_model_logits(m));
  CHECK(logits.shape.d[0] == 2 && logits.shape.d[1] == 10);
  CHECK(count_nonfinite(g, ampc_model_logits(m), 0) == 0);
  float l = loss_value(m);
  CHECK_MSG(isfinite(l) && l > 0.5f && l < 10.0f, "loss %g", (double)l);
  CHECK_OK(ampc_graph_backward(g, ampc_model_loss(m), 1.0f, 0));
  size_t bad = 0, nonzero = 0;
  for (size_t i = 0; i < ampc_graph_param_count(g); i++) {
    size_t n;
    float *d = read_values(g, ampc_graph_param_at(g, i), 1, &n);
    for (size_t j = 0; d && j < n; j++) {
      nonzero += d[j] != 0.0f;
      bad += !isfinite(d[j]);
    }
    free(d);
  }
  CHECK(bad == 0);
  CHECK(nonzero > 1000000);
  ampc_value nbt = ampc_graph_find(g, "layer4.1.bn2.num_batches_tracked");
  CHECK(nbt >= 0 && read_i64(g, nbt) == 1);
  CHECK_OK(ampc_graph_forward(g, 0));
  CHECK(count_nonfinite(g, ampc_model_logits(m), 0) == 0);
  CHECK(read_i64(g, nbt) == 1);
  ampc_model_free(m);
}

/* The CNN under O1 autocast (fp32 parameters, f16 activations) and in
 * bf16: finite loss and gradients, close to the f32 loss. */
TEST(cnn_runs_in_half) {
  const ampc_graph_precision precs[] = {
      {AMPC_DTYPE_F32, AMPC_DTYPE_F32, AMPC_DTYPE_F32, 0, AMPC_DTYPE_F16, NULL},
      {AMPC_DTYPE_F32, AMPC_DTYPE_F32, AMPC_DTYPE_F16, 1, AMPC_DTYPE_F16, ampc_amp_cast_policy},
      {AMPC_DTYPE_BF16, AMPC_DTYPE_F32, AMPC_DTYPE_BF16, 0, AMPC_DTYPE_BF16, NULL},
  };
  float loss32 = 0.0f;
  for (int p = 0; p < 3; p++) {
    ampc_model *m = make("cnn", opts_of(4, 1, 28, 28, 10, 9));
    if (!m) return;
    ampc_graph *g = ampc_model_graph(m);
    CHECK_OK(ampc_graph_set_precision(g, &precs[p]));
    CHECK_OK(ampc_graph_compile(g));
    fill_batch(m, 5);
    CHECK_OK(ampc_graph_forward(g, 1));
    CHECK_OK(ampc_graph_backward(g, ampc_model_loss(m), 1.0f, 0));
    float l = loss_value(m);
    if (p == 0) loss32 = l;
    CHECK_MSG(isfinite(l) && fabsf(l - loss32) < 0.05f * loss32, "precision %d: loss %g vs f32 %g", p, (double)l, (double)loss32);
    size_t bad = 0;
    for (size_t i = 0; i < ampc_graph_param_count(g); i++) bad += count_nonfinite(g, ampc_graph_param_at(g, i), 1);
    CHECK(bad == 0);
    ampc_model_free(m);
  }
}

TEST_MAIN(TEST_ENTRY(resnet18_matches_pytorch_state_dict), TEST_ENTRY(cnn_matches_pytorch_state_dict),
          TEST_ENTRY(mlp_names_and_count), TEST_ENTRY(default_init), TEST_ENTRY(init_is_seeded),
          TEST_ENTRY(model_errors), TEST_ENTRY(model_accessors), TEST_ENTRY(resnet18_runs),
          TEST_ENTRY(cnn_runs_in_half), TEST_ENTRY(summary_rows_are_uniform))
