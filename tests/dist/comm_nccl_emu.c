/* The NCCL communicator (src/dist/comm_nccl.c) on the cuda backend's host
 * emulation, whose NCCL calls run over MPI (src/backend/cuda/emu/emu_nccl.c):
 * run under mpirun with 2 ranks (tests/CMakeLists.txt), every rank this
 * program. Its results are compared with the MPI communicator's on the same
 * cuda (emulated) device, bit for bit:
 *
 * - all-reduce SUM, AVG and MAX in f32, f16 and bf16, blocking and through
 *   ireduce + test/wait, with values near each type's largest (a SUM
 *   overflows there, an AVG, dividing before the sum, does not); 16-bit MAX,
 *   which the MPI communicator lacks, against the values themselves;
 * - reduce-scatter (ireduce with counts) with equal and with uneven blocks,
 *   and an all-gather of each;
 * - a collective runs on the device's stream: the host does not wait;
 * - the amp step: a few O2 steps of the mlp (f16) and the cnn (bf16, with
 *   ZeRO-1), each rank on its half of every batch, give the same weights
 *   with either communicator;
 * - a cpu device's memory is refused with a clear error. */
#include <math.h>
#include <stdint.h>

#include "ampc/ampc.h"
#include "backend/backend.h"
#include "dist/comm_internal.h"
#include "test.h"

extern int64_t ampc__cu_syncs;

static ampc_comm *mpi, *nccl;
static ampc__device *dev;

/* Rank r's value i: in [-4, 4), and every 97th near the type's largest. */
static float value(ampc_dtype t, int r, size_t i) {
  if (i % 97 == 0) return t == AMPC_DTYPE_F16 ? 40000.0f : 2e38f;
  return -4.0f + 8.0f * (float)(ampc_rng_at(91, (uint64_t)r, i) >> 40) * (1.0f / 16777216.0f);
}

/* buf (device) = this rank's values */
static void *fill(ampc_dtype t, size_t n) {
  float *v = malloc(n * sizeof *v);
  for (size_t i = 0; i < n; i++) v[i] = value(t, ampc_comm_rank(mpi), i);
  void *buf = ampc__dev_alloc(dev, n * ampc_dtype_size(t));
  CHECK(buf != NULL);
  CHECK_OK(ampc__dev_write(dev, buf, t, v, AMPC_DTYPE_F32, n));
  free(v);
  return buf;
}

/* A reduction of this rank's values through c (ireduce, then test until
 * done or wait), its result into out (n values of t). */
static void reduce(ampc_comm *c, ampc_dtype t, size_t n, const size_t *counts, ampc__reduce_op op, int poll, void *out) {
  void *buf = fill(t, n);
  ampc__comm_req *q = NULL;
  ampc_status s = ampc__comm_ireduce(c, dev, buf, t, n, counts, op, &q);
  CHECK_OK(s);
  if (s == AMPC_OK && poll) {
    int done = 0;
    for (int k = 0; !done && k < 1000000; k++) {
      s = ampc__comm_test(c, q, &done);
      CHECK_OK(s);
      if (s < 0) break;
    }
    CHECK(done);
  } else if (s == AMPC_OK) {
    CHECK_OK(ampc__comm_wait(c, q));
  }
  CHECK_OK(ampc__dev_read(dev, out, t, buf, t, n));
  ampc__dev_free(dev, buf);
}

static const ampc_dtype types[] = {AMPC_DTYPE_F32, AMPC_DTYPE_F16, AMPC_DTYPE_BF16};
static const char *op_name(ampc__reduce_op op) {
  return op == AMPC__REDUCE_SUM ? "sum" : op == AMPC__REDUCE_AVG ? "avg" : op == AMPC__REDUCE_MAX ? "max" : "min";
}

TEST(allreduce_matches_mpi) {
  enum { N = 1001 };
  const ampc__reduce_op ops[] = {AMPC__REDUCE_SUM, AMPC__REDUCE_AVG, AMPC__REDUCE_MAX};
  for (int ti = 0; ti < 3; ti++)
    for (int oi = 0; oi < 3; oi++)
      for (int poll = 0; poll < 2; poll++) {
        ampc_dtype t = types[ti];
        ampc__reduce_op op = ops[oi];
        size_t es = ampc_dtype_size(t);
        unsigned char *a = malloc(N * es), *b = malloc(N * es);
        float *f = malloc(N * sizeof *f);
        int64_t syncs = ampc__cu_syncs;
        reduce(nccl, t, N, NULL, op, poll, a);
        /* (the read of the result is the one wait) */
        CHECK_MSG(ampc__cu_syncs - syncs <= 1, "nccl %s %s: the host waited %lld times", ampc_dtype_name(t), op_name(op),
                  (long long)(ampc__cu_syncs - syncs));
        ampc_load_f32(f, t, a, N);
        if (t == AMPC_DTYPE_F32 || op != AMPC__REDUCE_MAX) {
          reduce(mpi, t, N, NULL, op, poll, b);
          size_t bad = 0, first = 0;
          for (size_t i = 0; i < N * es; i++)
            if (a[i] != b[i] && !bad++) first = i / es;
          CHECK_MSG(bad == 0, "%s %s (%s): %zu bytes differ from the mpi communicator's, first at value %zu", ampc_dtype_name(t),
                    op_name(op), poll ? "test" : "wait", bad, first);
        } else {
          /* the larger of the two ranks' values, each in the type */
          float x[2], v;
          uint16_t h;
          size_t bad = 0;
          for (size_t i = 0; i < N; i++) {
            for (int r = 0; r < 2; r++) {
              v = value(t, r % ampc_comm_size(mpi), i);
              ampc_store_f32(t, &h, &v, 1);
              ampc_load_f32(&x[r], t, &h, 1);
            }
            bad += f[i] != fmaxf(x[0], x[1]);
          }
          CHECK_MSG(bad == 0, "%s max: %zu values are not the larger of the ranks'", ampc_dtype_name(t), bad);
        }
        if (op == AMPC__REDUCE_AVG) {
          /* divided before the sum: the large values average to themselves */
          float big = value(t, 0, 0);
          uint16_t h;
          if (t != AMPC_DTYPE_F32) ampc_store_f32(t, &h, &big, 1), ampc_load_f32(&big, t, &h, 1);
          for (size_t i = 0; i < N; i += 97) CHECK_MSG(f[i] == big, "%s avg: value %zu is %g, not %g", ampc_dtype_name(t), i, (double)f[i], (double)big);
        }
        if (op == AMPC__REDUCE_SUM && ampc_comm_size(mpi) == 2) CHECK_MSG(isinf(f[0]), "%s sum: the largest values overflow", ampc_dtype_name(t));
        free(a), free(b), free(f);
      }
}

/* counts[r]: n cut into the ranks' blocks, equal or not */
static size_t *blocks(size_t n, int uneven) {
  int size = ampc_comm_size(mpi);
  size_t *counts = calloc((size_t)size, sizeof *counts), left = n;
  for (int r = 0; r < size; r++) {
    size_t lo, hi;
    ampc__comm_block(n, size, r, &lo, &hi);
    counts[r] = uneven ? (r == size - 1 ? left : (hi - lo) + 37 * (size_t)(r + 1)) : hi - lo;
    left -= counts[r];
  }
  return counts;
}

TEST(reduce_scatter_and_allgather_match_mpi) {
  int size = ampc_comm_size(mpi), rank = ampc_comm_rank(mpi);
  for (int uneven = 0; uneven < 2; uneven++)
    for (int ti = 0; ti < 3; ti++)
      for (int avg = 0; avg < 2; avg++) {
        ampc_dtype t = types[ti];
        size_t es = ampc_dtype_size(t), n = (size_t)size * 300;
        size_t *counts = blocks(n, uneven), off = 0;
        for (int r = 0; r < rank; r++) off += counts[r];
        unsigned char *a = malloc(n * es), *b = malloc(n * es);
        ampc__reduce_op op = avg ? AMPC__REDUCE_AVG : AMPC__REDUCE_SUM;
        reduce(nccl, t, n, counts, op, avg, a);
        reduce(mpi, t, n, counts, op, 0, b);
        CHECK_MSG(memcmp(a + off * es, b + off * es, counts[rank] * es) == 0, "%s reduce-scatter (%s, %s blocks): rank %d's block differs",
                  ampc_dtype_name(t), op_name(op), uneven ? "uneven" : "equal", rank);
        /* the all-gather of every rank's block (the rest: garbage) */
        void *buf[2];
        for (int k = 0; k < 2; k++) {
          buf[k] = fill(t, n);
          CHECK_OK(ampc__dev_set(dev, buf[k], 0x5A, off * es));
          CHECK_OK(ampc__comm_allgather(k ? mpi : nccl, dev, buf[k], t, counts));
          CHECK_OK(ampc__dev_read(dev, k ? b : a, t, buf[k], t, n));
          ampc__dev_free(dev, buf[k]);
        }
        CHECK_MSG(memcmp(a, b, n * es) == 0, "%s all-gather (%s blocks) differs", ampc_dtype_name(t), uneven ? "uneven" : "equal");
        float v, x;
        size_t at = 0, bad = 0;
        for (int r = 0; r < size; r++)
          for (size_t i = 0; i < counts[r]; i++, at++) {
            uint16_t h;
            v = value(t, r, at);
            if (t != AMPC_DTYPE_F32) ampc_store_f32(t, &h, &v, 1), ampc_load_f32(&v, t, &h, 1);
            ampc_load_f32(&x, t, a + at * es, 1);
            bad += x != v;
          }
        CHECK_MSG(bad == 0, "%s all-gather: %zu values are not their rank's", ampc_dtype_name(t), bad);
        free(a), free(b), free(counts);
      }
}

/* ---- the amp step ---- */

enum { BATCH = 8, STEPS = 4 };

static float *train(ampc_comm *c, const char *model, ampc_dtype half, int zero) {
  int size = ampc_comm_size(c), rank = ampc_comm_rank(c), per = BATCH / size;
  ampc_model *m = NULL;
  ampc_optim *opt = NULL;
  ampc_amp *amp = NULL;
  ampc_model_opts mo = {.batch = per, .channels = 1, .height = 8, .width = 8, .classes = 5, .seed = 5};
  CHECK_OK(ampc_model_create(&m, model, &mo));
  if (!m) return NULL;
  ampc_graph *g = ampc_model_graph(m);
  ampc_backend_opts bo;
  ampc_backend_opts_default(&bo);
  bo.threads = 1;
  CHECK_OK(ampc_graph_set_backend(g, "cuda", &bo));
  ampc_optim_config oc;
  ampc_optim_config_default(&oc, AMPC_OPTIM_SGD);
  oc.lr = 0.05f;
  oc.momentum = 0.9f;
  CHECK_OK(ampc_optim_create(&opt, &oc, ampc_graph_param_numel(g)));
  ampc_amp_config ac;
  CHECK_OK(ampc_amp_config_init(&ac, AMPC_OPT_O2, half));
  CHECK_OK(ampc_amp_initialize(&amp, g, opt, &ac));
  float *w = NULL;
  if (amp) {
    ampc_amp_set_comm(amp, c);
    CHECK_OK(ampc_amp_set_bucket_bytes(amp, 2048)); /* several buckets in flight */
    if (zero) CHECK_OK(ampc_amp_set_zero(amp, 1));
    ampc_tensor xt = ampc_graph_tensor(g, ampc_model_input(m));
    size_t feat = (size_t)ampc_tensor_numel(&xt) / (size_t)per;
    float *x = malloc((size_t)BATCH * feat * sizeof *x);
    int32_t y[BATCH];
    for (int s = 0; s < STEPS; s++) {
      ampc_rng r = ampc_rng_make(300 + (uint64_t)s, AMPC_RNG_STREAM_USER);
      for (size_t i = 0; i < (size_t)BATCH * feat; i++) x[i] = ampc_rng_normal(&r);
      for (int i = 0; i < BATCH; i++) y[i] = (int32_t)ampc_rng_below(&r, 5);
      CHECK_OK(ampc_graph_write(g, ampc_model_input(m), x + (size_t)rank * per * feat, AMPC_DTYPE_F32));
      CHECK_OK(ampc_graph_write(g, ampc_model_labels(m), y + rank * per, AMPC_DTYPE_I32));
      CHECK_OK(ampc_amp_forward(amp, 1));
      CHECK_OK(ampc_amp_backward(amp, ampc_model_loss(m), 0, 0));
      CHECK_OK(ampc_amp_step(amp, oc.lr, NULL));
    }
    free(x);
    w = malloc(ampc_graph_param_numel(g) * sizeof *w);
    if (zero) CHECK_OK(ampc_amp_gather_state(amp));
    CHECK_OK(ampc_amp_param_values(amp, w));
  }
  ampc_amp_free(amp);
  ampc_optim_free(opt);
  ampc_model_free(m);
  return w;
}

TEST(amp_steps_match_mpi) {
  const struct {
    const char *model;
    ampc_dtype half;
    int zero;
  } cases[] = {{"mlp", AMPC_DTYPE_F16, 0}, {"cnn", AMPC_DTYPE_BF16, 1}, {"mlp", AMPC_DTYPE_BF16, 1}};
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    float *a = train(nccl, cases[k].model, cases[k].half, cases[k].zero);
    float *b = train(mpi, cases[k].model, cases[k].half, cases[k].zero);
    if (a && b) {
      ampc_model *m = NULL;
      ampc_model_opts mo = {.batch = 1, .channels = 1, .height = 8, .width = 8, .classes = 5, .seed = 5};
      CHECK_OK(ampc_model_create(&m, cases[k].model, &mo));
      size_t n = m ? ampc_graph_param_numel(ampc_model_graph(m)) : 0, bad = 0;
      for (size_t i = 0; i < n; i++) bad += memcmp(&a[i], &b[i], sizeof(float)) != 0;
      /* every rank has the same weights (their sums: the largest is everyone's) */
      double sum = 0.0;
      for (size_t i = 0; i < n; i++) sum += a[i];
      double v = sum;
      CHECK_OK(ampc_comm_allreduce_host(mpi, &v, 1, AMPC_COMM_MAX));
      CHECK_MSG(bad == 0, "%s O2 %s%s: %zu of %zu weights differ between the nccl and the mpi communicator", cases[k].model,
                ampc_dtype_name(cases[k].half), cases[k].zero ? " ZeRO-1" : "", bad, n);
      CHECK_MSG(v == sum, "%s: the ranks' weights differ", cases[k].model);
      ampc_model_free(m);
    }
    free(a);
    free(b);
  }
}

TEST(errors) {
  CHECK(strcmp(ampc_comm_kind(nccl), "nccl") == 0);
  CHECK(ampc_comm_rank(nccl) == ampc_comm_rank(mpi) && ampc_comm_size(nccl) == ampc_comm_size(mpi));
  ampc__device *cpu = NULL;
  CHECK_OK(ampc__device_create(&cpu, "cpu", NULL));
  float *p = ampc__dev_alloc(cpu, 64);
  CHECK_ERR(nccl->ops->allreduce(nccl, cpu, p, AMPC_DTYPE_F32, 4, AMPC__REDUCE_SUM), AMPC_EINVAL, "cuda devices only");
  ampc__dev_free(cpu, p);
  ampc__device_unref(cpu);
  ampc_comm *bad = NULL;
  CHECK_ERR(ampc_comm_nccl_create(&bad, nccl), AMPC_EINVAL, "MPI communicator");
  /* host all-reduces go through the MPI communicator */
  double v = 1.0 + ampc_comm_rank(mpi);
  CHECK_OK(ampc_comm_allreduce_host(nccl, &v, 1, AMPC_COMM_SUM));
  int s = ampc_comm_size(mpi);
  CHECK(v == s * (s + 1) / 2.0);
}

int main(int argc, char **argv) {
  if (ampc_comm_mpi_create(&mpi) < 0) {
    fprintf(stderr, "comm_nccl_emu: %s\n", ampc_last_error());
    return 1;
  }
  if (ampc_comm_nccl_create(&nccl, mpi) < 0 || ampc__device_create(&dev, "cuda", NULL) < 0) {
    fprintf(stderr, "comm_nccl_emu: %s\n", ampc_last_error());
    ampc_comm_abort(mpi, 1);
    return 1;
  }
  if (ampc_comm_size(mpi) != 2) printf("note: %d ranks (the test is meant for mpirun -np 2)\n", ampc_comm_size(mpi));
  static const test__entry tests[] = {TEST_ENTRY(allreduce_matches_mpi), TEST_ENTRY(reduce_scatter_and_allgather_match_mpi),
                                      TEST_ENTRY(amp_steps_match_mpi), TEST_ENTRY(errors)};
  int rc = test__run(tests, (int)(sizeof tests / sizeof tests[0]), argc, argv);
  double f = rc;
  if (ampc_comm_allreduce_host(mpi, &f, 1, AMPC_COMM_MAX) < 0) f = 1;
  ampc_comm_free(nccl);
  ampc__device_unref(dev);
  ampc_comm_free(mpi);
  return f != 0.0;
}
