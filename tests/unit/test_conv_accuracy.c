/* The default convolution is as accurate as PyTorch's float32: the CIFAR
 * ResNet-18's gradients at O0 (everything in f32) against float64, over
 * several batches, with the default algorithm (Winograd wherever it applies)
 * beside the plain im2col one and PyTorch's own float32 model.
 *
 * The fixture (tests/fixtures/resnet18_grad_batches/, made by
 * tests/fixtures/make_resnet18_grad_batches_fixture.py with PyTorch 1.13)
 * holds 9 batches of 8 images, for each the float64 gradient of every
 * parameter on a fixed random subset of its elements, and PyTorch float32's
 * error there; the weights are ampc's own initialisation for seed 1, which
 * the script re-implements (checked first, from the fixture's checksums).
 *
 * A tensor's error comes in one of two sizes at initialisation: rounding
 * (~1e-6), or, for every tensor before a ReLU whose input lay within
 * rounding of zero and flipped, ~1e-3. How often that happens follows the
 * forward pass's error. Over 32 batches the median over ResNet-18's 62
 * tensors was in the flipped range in 14 for PyTorch fp32, 9 for ampc's
 * im2col, 29 for Winograd F(4x4, 3x3) in f32 (the default before) and 12
 * for F(2x2, 3x3) (the default now). So the test holds the default to two
 * bounds, each failed by F(4x4) in f32 (AMPC_CONV_ACCURACY_F4=1 shows it):
 *
 *   1. issue 15's: the median over the batches of each batch's median over
 *      the tensors, at most 1.5x PyTorch fp32's (F(4x4): 2.7x). In this
 *      fixture PyTorch's median lies in the flipped range (5 batches of 9
 *      flipped), so this bound asks the default to flip in fewer batches
 *      than that;
 *   2. the rounding level: over the (batch, tensor) pairs that no flip
 *      reached in either (errors below 1e-4 in both), the default's median
 *      error at most 1.5x PyTorch's (F(4x4): 3.8x, its backward data mostly).
 *
 * Relative error of a tensor on its subset S (as the script computes it):
 *     ||g[S] - g64[S]|| / max(||g64[S]||, 1e-12 * ||G64||)
 * G64 being all of the batch's subsets together.
 *
 * The computation runs in this process on the library (a graph in f32 is
 * what `ampc grad --opt-level O0` runs; their medians agree to the digit):
 * 10-20 s on two cores.
 *
 * For measurements beyond the test: AMPC_CONV_ACCURACY_FIXTURE=FILE takes
 * another fixture (the script writes one of any number of batches), and
 * AMPC_CONV_ACCURACY_F4=1 adds a run with Winograd F(4x4, 3x3) in f32, the
 * tile the default used there before (printed, not held to the bounds).
 * Under AMPC_TEST_QUICK (the sanitizer pass) two batches run and the bounds,
 * which need them all, are left to the plain build. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ampc/backend.h"
#include "ampc/nn.h"
#include "ampc/safetensors.h"
#include "test.h"

#define FIXTURE AMPC_TEST_FIXTURES "/resnet18_grad_batches/resnet18_grad_batches.safetensors"
#define SEED 1
#define CLASSES 10
#define FLOOR_REL 1e-12
/* the bound of issue 15: the default's median at most 1.5 times PyTorch's */
#define BOUND 1.5
/* a tensor's error from at least here is a flipped ReLU's (rounding leaves
 * them below 1e-5 here, a flip above 1e-4) */
#define FLIPPED 1e-4

extern int ampc__cpu_wino_f32_tile; /* the CPU backend's hook: 4 runs F(4x4) in f32 */

static ampc_st_file *fix;
static int nbatch, batch_n, prepared = -1; /* -1 not yet, 0 ok, 1 failed */
static size_t nparam;                      /* the model's parameter tensors */
static double *err_torch;                  /* PyTorch float32's error of tensor i on batch b at [b * nparam + i] */

static const ampc_st_tensor *fixture_tensor(const char *fmt, int b, const char *name) {
  char key[256];
  if (b >= 0) snprintf(key, sizeof key, fmt, b, name);
  else snprintf(key, sizeof key, fmt, name);
  return ampc_st_find(fix, key);
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* the median of n values (sorted in place) */
static double median(double *v, size_t n) {
  qsort(v, n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* The model for one convolution algorithm, compiled in f32; its init must
 * match the fixture's checksums (float64 sum and four values of every float
 * tensor). NULL after a message if not. */
static ampc_model *make_model(ampc_conv_algo algo) {
  ampc_model *m = NULL;
  ampc_model_opts o = {.batch = batch_n, .channels = 3, .height = 32, .width = 32, .classes = CLASSES, .seed = SEED};
  ampc_backend_opts bo = {.conv = algo};
  if (ampc_model_create(&m, "resnet18", &o) < 0 || ampc_graph_set_backend(ampc_model_graph(m), "cpu", &bo) < 0 ||
      ampc_graph_compile(ampc_model_graph(m)) < 0) {
    fprintf(stderr, "resnet18: %s\n", ampc_last_error());
    ampc_model_free(m);
    return NULL;
  }
  ampc_graph *g = ampc_model_graph(m);
  size_t np = ampc_graph_param_count(g), nb = ampc_graph_buffer_count(g);
  int bad = 0;
  for (size_t i = 0; i < np + nb; i++) {
    ampc_value v = i < np ? ampc_graph_param_at(g, i) : ampc_graph_buffer_at(g, i - np);
    ampc_tensor t = ampc_graph_tensor(g, v);
    if (t.dtype != AMPC_DTYPE_F32) continue;
    const float *w = ampc_graph_param_init(g, v);
    const ampc_st_tensor *ref = fixture_tensor("init.%s", -1, ampc_graph_name(g, v));
    size_t n = (size_t)ampc_tensor_numel(&t);
    if (!w || !ref || ref->dtype != AMPC_DTYPE_F64 || ampc_st_numel(ref) != 5) {
      bad++;
      continue;
    }
    const double *r = ref->values;
    double sum = 0.0, asum = 0.0;
    for (size_t j = 0; j < n; j++) {
      sum += w[j];
      asum += fabs(w[j]);
    }
    size_t at[4] = {0, n / 3, 2 * n / 3, n - 1};
    int ok = fabs(sum - r[0]) <= 1e-12 * asum + 1e-30;
    for (int k = 0; k < 4; k++) ok = ok && (double)w[at[k]] == r[1 + k];
    bad += !ok;
  }
  if (bad) {
    fprintf(stderr,
            "%d tensors of ampc's resnet18 init for seed %d differ from the fixture's (src/core/rng.c or src/nn/nn.c "
            "changed?): re-implement the init in tests/fixtures/make_resnet18_grad_fixture.py and regenerate "
            "both fixtures\n",
            bad, SEED);
    ampc_model_free(m);
    return NULL;
  }
  return m;
}

static int prepare(void) {
  if (prepared >= 0) return prepared;
  prepared = 1;
  const char *path = getenv("AMPC_CONV_ACCURACY_FIXTURE");
  if (ampc_st_open(&fix, path && *path ? path : FIXTURE) < 0) {
    fprintf(stderr, "%s\n", ampc_last_error());
    return prepared;
  }
  const char *nb = ampc_st_metadata(fix, "batches"), *bn = ampc_st_metadata(fix, "batch");
  nbatch = nb ? atoi(nb) : 0;
  batch_n = bn ? atoi(bn) : 0;
  if (nbatch < 5 || batch_n < 1) {
    fprintf(stderr, "fixture: metadata batches %s, batch %s (at least 5 batches wanted)\n", nb ? nb : "-", bn ? bn : "-");
    return prepared;
  }
  if (getenv("AMPC_TEST_QUICK")) nbatch = 2;
  nparam = 0;
  for (size_t i = 0; i < ampc_st_count(fix); i++) nparam += strncmp(ampc_st_get(fix, i)->name, "idx.", 4) == 0;
  err_torch = calloc((size_t)nbatch * (nparam ? nparam : 1), sizeof *err_torch);
  prepared = err_torch && nparam ? 0 : 1;
  return prepared;
}

/* Runs every batch through model m (one training-mode forward and backward)
 * and writes tensor i's error on batch b into err[b * np + i] (np: the
 * model's parameters), PyTorch's from the fixture into err_torch. Returns the
 * number of failures. */
static int measure(ampc_model *m, const char *tag, double *err) {
  ampc_graph *g = ampc_model_graph(m);
  size_t np = ampc_graph_param_count(g);
  ampc_tensor xt = ampc_graph_tensor(g, ampc_model_input(m)), yt = ampc_graph_tensor(g, ampc_model_labels(m));
  size_t nx = (size_t)ampc_tensor_numel(&xt);
  double *d2 = malloc(np * sizeof *d2), *r2 = malloc(np * sizeof *r2);
  float *xh = malloc((nx ? nx : 1) * sizeof *xh); /* a batch in host memory, written to the device */
  int32_t *yh = malloc((size_t)batch_n * sizeof *yh);
  float *gv = NULL;
  int32_t *idx = NULL;
  int fails = 0;
  CHECK(d2 && r2 && xh && yh && xt.dtype == AMPC_DTYPE_F32 && yt.dtype == AMPC_DTYPE_I32 && np == nparam);
  for (int b = 0; d2 && r2 && xh && yh && np == nparam && b < nbatch; b++) {
    const ampc_st_tensor *x = fixture_tensor("x.%d%s", b, ""), *y = fixture_tensor("y.%d%s", b, "");
    if (!x || !y || ampc_st_numel(x) != (int64_t)nx || ampc_st_numel(y) != batch_n || ampc_st_read_f32(x, xh, nx) < 0 ||
        ampc_st_read_i32(y, yh, (size_t)batch_n) < 0) {
      CHECK_MSG(0, "fixture: batch %d (x %zu values, y %d labels) missing or unreadable", b, nx, batch_n);
      fails++;
      break;
    }
    CHECK_OK(ampc_graph_write(g, ampc_model_input(m), xh, AMPC_DTYPE_F32));
    CHECK_OK(ampc_graph_write(g, ampc_model_labels(m), yh, AMPC_DTYPE_I32));
    CHECK_OK(ampc_graph_forward(g, 1));
    CHECK_OK(ampc_graph_backward(g, ampc_model_loss(m), 1.0f, 0));
    double all2 = 0.0;
    for (size_t i = 0; i < np; i++) {
      ampc_value v = ampc_graph_param_at(g, i);
      const char *name = ampc_graph_name(g, v);
      ampc_tensor gt = ampc_graph_grad(g, v);
      size_t n = (size_t)ampc_tensor_numel(&gt);
      const ampc_st_tensor *it = fixture_tensor("idx.%s", -1, name), *g64 = fixture_tensor("grad64.%d.%s", b, name);
      const ampc_st_tensor *re = fixture_tensor("ref_err.%d.%s", b, name);
      size_t k = it ? (size_t)ampc_st_numel(it) : 0;
      float *gv2 = realloc(gv, (n ? n : 1) * sizeof *gv);
      if (gv2) gv = gv2;
      int32_t *idx2 = realloc(idx, (k ? k : 1) * sizeof *idx);
      if (idx2) idx = idx2;
      d2[i] = r2[i] = 0.0;
      int ok = it && g64 && re && gv2 && idx2 && g64->dtype == AMPC_DTYPE_F64 && ampc_st_numel(g64) == (int64_t)k &&
               re->dtype == AMPC_DTYPE_F64 && ampc_st_numel(re) == 1 && ampc_st_read_i32(it, idx, k) == 0;
      if (!ok) {
        CHECK_MSG(0, "%s: gradient, subset or reference of '%s' (batch %d) missing", tag, name, b);
        fails++;
        d2[i] = INFINITY;
        continue;
      }
      if (ampc_graph_read_grad(g, v, gv, AMPC_DTYPE_F32) < 0) {
        CHECK_MSG(0, "%s: reading the gradient of '%s': %s", tag, name, ampc_last_error());
        fails++;
        d2[i] = INFINITY;
        continue;
      }
      const double *ref64 = g64->values;
      for (size_t j = 0; j < k; j++) {
        size_t at = idx[j] >= 0 && (size_t)idx[j] < n ? (size_t)idx[j] : 0;
        double a = gv[at];
        CHECK(isfinite(a));
        d2[i] += (a - ref64[j]) * (a - ref64[j]);
        r2[i] += ref64[j] * ref64[j];
      }
      all2 += r2[i];
      err_torch[(size_t)b * np + i] = *(const double *)re->values;
    }
    double floor = FLOOR_REL * sqrt(all2);
    for (size_t i = 0; i < np; i++) err[(size_t)b * np + i] = sqrt(d2[i]) / fmax(sqrt(r2[i]), floor);
  }
  free(d2);
  free(r2);
  free(xh);
  free(yh);
  free(gv);
  free(idx);
  return fails;
}

/* Each batch's median over the tensors of err (nbatch x nparam) into med. */
static void batch_medians(const double *err, double *med, double *scratch) {
  for (int b = 0; b < nbatch; b++) {
    memcpy(scratch, err + (size_t)b * nparam, nparam * sizeof *scratch);
    med[b] = median(scratch, nparam);
  }
}

/* The rounding level: of the (batch, tensor) pairs that no flip reached in
 * either (both errors below FLIPPED), the median of a's errors over the
 * median of b's. Also counts the pairs. */
static double rounding_ratio(const double *a, const double *b, double *scratch, size_t *pairs) {
  size_t n = 0, tot = (size_t)nbatch * nparam;
  for (size_t i = 0; i < tot; i++) n += a[i] < FLIPPED && b[i] < FLIPPED;
  double *sa = scratch, *sb = scratch + tot;
  size_t k = 0;
  for (size_t i = 0; i < tot; i++)
    if (a[i] < FLIPPED && b[i] < FLIPPED) {
      sa[k] = a[i];
      sb[k++] = b[i];
    }
  *pairs = n;
  return n ? median(sa, n) / median(sb, n) : NAN;
}

static int flipped_batches(const double *med) {
  int n = 0;
  for (int b = 0; b < nbatch; b++) n += med[b] >= FLIPPED;
  return n;
}

TEST(default_conv_as_accurate_as_pytorch_fp32) {
  if (prepare() != 0) {
    CHECK_MSG(0, "fixture not ready");
    return;
  }
  static const struct {
    ampc_conv_algo algo;
    int f32_tile;
    const char *name;
  } runs[3] = {{AMPC_CONV_AUTO, 0, "default"}, {AMPC_CONV_IM2COL, 0, "im2col"}, {AMPC_CONV_AUTO, 4, "F(4x4) f32"}};
  const char *f4 = getenv("AMPC_CONV_ACCURACY_F4");
  int nruns = f4 && strcmp(f4, "1") == 0 ? 3 : 2;
  size_t tot = (size_t)nbatch * nparam;
  double *err[3], *med[4], *scratch = malloc(2 * tot * sizeof *scratch);
  int ok = scratch != NULL;
  for (int r = 0; r < 4; r++) {
    if (r < 3) ok &= (err[r] = calloc(tot, sizeof(double))) != NULL;
    ok &= (med[r] = calloc((size_t)nbatch, sizeof(double))) != NULL;
  }
  CHECK(ok);
  if (!ok) goto done;
  for (int r = 0; r < nruns; r++) {
    ampc__cpu_wino_f32_tile = runs[r].f32_tile;
    ampc_model *m = make_model(runs[r].algo);
    CHECK_MSG(m != NULL, "%s: no model", runs[r].name);
    if (m) CHECK(measure(m, runs[r].name, err[r]) == 0);
    ampc_model_free(m);
    ampc__cpu_wino_f32_tile = 0;
  }
  for (int r = 0; r < nruns; r++) batch_medians(err[r], med[r], scratch);
  batch_medians(err_torch, med[3], scratch);
  printf("each batch's median over the %zu tensors of the relative gradient error against float64 (%d batches of %d;\n"
         "at least %.0e: a flipped ReLU reached more than half the tensors):\n",
         nparam, nbatch, batch_n, FLIPPED);
  printf("  batch  PyTorch fp32    default     im2col%s\n", nruns > 2 ? "  F(4x4) f32" : "");
  for (int b = 0; b < nbatch; b++) {
    printf("  %5d  %12.3e %10.3e %10.3e", b, med[3][b], med[0][b], med[1][b]);
    if (nruns > 2) printf(" %10.3e", med[2][b]);
    printf("\n");
  }
  printf("  flipped %6d %10d %10d", flipped_batches(med[3]), flipped_batches(med[0]), flipped_batches(med[1]));
  if (nruns > 2) printf(" %10d", flipped_batches(med[2]));
  double mm[4];
  for (int r = 0; r < 4; r++) mm[r] = r < nruns || r == 3 ? median(med[r], (size_t)nbatch) : NAN;
  printf("\n  median %11.3e %10.3e %10.3e", mm[3], mm[0], mm[1]);
  if (nruns > 2) printf(" %10.3e", mm[2]);
  printf("\nmedian over the batches: default / PyTorch fp32 %.3g (at most %.1f), im2col / PyTorch fp32 %.3g", mm[0] / mm[3],
         BOUND, mm[1] / mm[3]);
  if (nruns > 2) printf(", F(4x4) f32 / PyTorch fp32 %.3g", mm[2] / mm[3]);
  size_t pd, pi, p4 = 0;
  double rd = rounding_ratio(err[0], err_torch, scratch, &pd), ri = rounding_ratio(err[1], err_torch, scratch, &pi);
  double r4 = nruns > 2 ? rounding_ratio(err[2], err_torch, scratch, &p4) : NAN;
  printf("\nrounding level (median over the pairs (batch, tensor) no flip reached, below %.0e in both):\n"
         "  default / PyTorch fp32 %.2f (%zu pairs, at most %.1f), im2col / PyTorch fp32 %.2f (%zu pairs)",
         FLIPPED, rd, pd, BOUND, ri, pi);
  if (nruns > 2) printf(", F(4x4) f32 / PyTorch fp32 %.2f (%zu pairs)", r4, p4);
  printf("\n");
  if (getenv("AMPC_TEST_QUICK")) {
    printf("AMPC_TEST_QUICK: %d batches; the bounds are checked in the plain build\n", nbatch);
    CHECK(mm[0] < 1.0 && mm[1] < 1.0);
    goto done;
  }
  CHECK_MSG(mm[0] <= BOUND * mm[3], "the default convolution's median gradient error %.3e is more than %.1f x PyTorch fp32's %.3e",
            mm[0], BOUND, mm[3]);
  CHECK_MSG(rd <= BOUND, "where no flip reached, the default's errors are %.2f x PyTorch fp32's (at most %.1f)", rd, BOUND);
  CHECK_MSG(pd >= tot / 4, "only %zu of %zu (batch, tensor) pairs below %.0e in both the default and PyTorch", pd, tot, FLIPPED);
done:
  for (int r = 0; r < 4; r++) {
    if (r < 3) free(err[r]);
    free(med[r]);
  }
  free(scratch);
}

TEST(cleanup) {
  ampc_st_close(fix);
  free(err_torch);
  fix = NULL;
  err_torch = NULL;
  prepared = -1;
}

TEST_MAIN(TEST_ENTRY(default_conv_as_accurate_as_pytorch_fp32), TEST_ENTRY(cleanup))
