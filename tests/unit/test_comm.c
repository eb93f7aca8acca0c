/* The amp step with a communicator: the in-process one joins two graphs as
 * two ranks (one thread each). Two half batches give the weights one full
 * batch gives -- within f32 (O0) or f16 (O2) rounding, and bit for bit where
 * the reduction's order is the same (both ranks on the same batch); an inf
 * on one rank makes both skip with the same new scale; clipping sees the
 * same norm on every rank. */
#include <pthread.h>

#include "ampc/ampc.h"
#include "test.h"

enum { N = 8, DMAX = 64, K = 5, STEPS = 4 };

static const char *backend = "cpu"; /* of the ranks rank_make_model builds */

typedef struct {
  ampc_model *m;
  ampc_graph *g;
  ampc_optim *opt;
  ampc_amp *amp;
  ampc_comm *comm;
  int lo, n;              /* the samples of each batch this rank trains on */
  int inf_at;             /* the step whose backward is seeded with an infinite weight (-1: none) */
  int accum;              /* micro-batches per step (1: none) */
  int feat;               /* input features: the mlp's 1 x 3 x 4, the cnn's 1 x 8 x 8 */
  ampc_amp_step_info info[STEPS];
  float *w;               /* the final weights (f32) */
} rank;

/* The batch of step s: N samples of DMAX features (a model takes the first
 * it needs of each), labels below K. */
static void batch(int s, float *x, int32_t *y) {
  ampc_rng r = ampc_rng_make(77 + (uint64_t)s, AMPC_RNG_STREAM_USER);
  for (int i = 0; i < N * DMAX; i++) x[i] = ampc_rng_normal(&r);
  for (int i = 0; i < N; i++) y[i] = (int32_t)ampc_rng_below(&r, K);
}

static int rank_make_model(rank *k, const char *model, int lo, int n, ampc_opt_level lvl, ampc_comm *c, ampc_optim_kind kind) {
  memset(k, 0, sizeof *k);
  k->lo = lo;
  k->n = n;
  k->comm = c;
  k->inf_at = -1;
  /* the mlp on 1 x 3 x 4 inputs: no batch norm, so a half batch sees the
   * same function of its samples as the full one; the cnn (batch norm) on
   * 1 x 8 x 8 */
  int cnn = strcmp(model, "cnn") == 0;
  ampc_model_opts mo = {.batch = n, .channels = 1, .height = cnn ? 8 : 3, .width = cnn ? 8 : 4, .classes = K, .seed = 5};
  k->feat = mo.height * mo.width;
  CHECK_OK(ampc_model_create(&k->m, model, &mo));
  if (!k->m) return 0;
  k->g = ampc_model_graph(k->m);
  ampc_backend_opts bo;
  ampc_backend_opts_default(&bo);
  bo.threads = 1; /* two ranks share the machine */
  CHECK_OK(ampc_graph_set_backend(k->g, backend, &bo));
  ampc_optim_config oc;
  ampc_optim_config_default(&oc, kind);
  oc.lr = 1e-2f;
  if (kind == AMPC_OPTIM_SGD) oc.momentum = 0.9f;
  CHECK_OK(ampc_optim_create(&k->opt, &oc, ampc_graph_param_numel(k->g)));
  ampc_amp_config ac;
  CHECK_OK(ampc_amp_config_init(&ac, lvl, AMPC_DTYPE_F16));
  /* the cnn's last layer: a rank's f16 gradient of half the batch (its
   * mean over 4 samples) can overflow at 2^16 where the full batch's does
   * not -- a skip on two ranks that one process would not make */
  if (cnn && lvl == AMPC_OPT_O2) CHECK_OK(ampc_amp_config_set(&ac, "init_scale", "1024"));
  CHECK_OK(ampc_amp_initialize(&k->amp, k->g, k->opt, &ac));
  if (!k->amp) return 0;
  ampc_amp_set_clip_grad_norm(k->amp, 0.5f);
  ampc_amp_set_comm(k->amp, c);
  return 1;
}

static int rank_make_with(rank *k, int lo, int n, ampc_opt_level lvl, ampc_comm *c, ampc_optim_kind kind) {
  return rank_make_model(k, "mlp", lo, n, lvl, c, kind);
}

static int rank_make(rank *k, int lo, int n, ampc_opt_level lvl, ampc_comm *c) {
  return rank_make_with(k, lo, n, lvl, c, AMPC_OPTIM_ADAM);
}

static void rank_free(rank *k) {
  ampc_amp_free(k->amp);
  ampc_optim_free(k->opt);
  ampc_model_free(k->m);
  free(k->w);
}

static void *rank_run(void *arg) {
  rank *k = arg;
  float x[N * DMAX], xr[N * DMAX];
  int32_t y[N];
  int acc = k->accum > 1 ? k->accum : 1, mb = k->n / acc;
  for (int s = 0; s < STEPS; s++) {
    batch(s, x, y);
    for (int i = 0; i < N; i++) memcpy(xr + i * k->feat, x + i * DMAX, (size_t)k->feat * sizeof *x);
    for (int u = 0; u < acc; u++) {
      /* micro-batch u of this rank's samples */
      CHECK_OK(ampc_graph_set_batch(k->g, mb));
      CHECK_OK(ampc_graph_write(k->g, ampc_model_input(k->m), xr + (k->lo + u * mb) * k->feat, AMPC_DTYPE_F32));
      CHECK_OK(ampc_graph_write(k->g, ampc_model_labels(k->m), y + k->lo + u * mb, AMPC_DTYPE_I32));
      CHECK_OK(ampc_amp_forward(k->amp, 1));
      ampc_amp_set_loss_weight(k->amp, s == k->inf_at ? INFINITY : 1.0f / (float)acc);
      CHECK_OK(ampc_amp_backward(k->amp, ampc_model_loss(k->m), 0, u > 0));
    }
    CHECK_OK(ampc_amp_step(k->amp, 1e-2f, &k->info[s]));
  }
  size_t n = ampc_graph_param_numel(k->g);
  k->w = malloc(n * sizeof *k->w);
  CHECK_OK(ampc_amp_gather_state(k->amp)); /* ZeRO: every rank's shard of the masters */
  CHECK_OK(ampc_amp_param_values(k->amp, k->w));
  ampc_amp_release_state(k->amp);
  return NULL;
}

/* Runs the ranks (one thread each) to the end. */
static void run_ranks(rank *r, int n) {
  pthread_t t[4];
  for (int i = 0; i < n; i++) CHECK(pthread_create(&t[i], NULL, rank_run, &r[i]) == 0);
  for (int i = 0; i < n; i++) pthread_join(t[i], NULL);
}

static double max_rel(const float *a, const float *b, size_t n) {
  double m = 0.0, s = 0.0;
  for (size_t i = 0; i < n; i++) {
    m = fmax(m, fabs((double)a[i] - b[i]));
    s = fmax(s, fabs((double)b[i]));
  }
  return m / (s > 0 ? s : 1.0);
}

static void half_batches(ampc_opt_level lvl, ampc_optim_kind kind, double tol) {
  rank one, two[2];
  ampc_comm *c[2];
  CHECK_OK(ampc_comm_local_create(c, 2));
  int ok = rank_make_with(&one, 0, N, lvl, NULL, kind) & rank_make_with(&two[0], 0, N / 2, lvl, c[0], kind) &
           rank_make_with(&two[1], N / 2, N / 2, lvl, c[1], kind);
  if (ok) {
    rank_run(&one);
    run_ranks(two, 2);
    size_t n = ampc_graph_param_numel(one.g);
    CHECK_MSG(memcmp(two[0].w, two[1].w, n * sizeof(float)) == 0, "%s: the ranks' weights differ", ampc_opt_level_name(lvl));
    double e = max_rel(two[0].w, one.w, n);
    printf("  %s %s: 2 ranks x %d vs 1 x %d, %d steps: max |w2 - w1| / max |w1| = %.3g\n", ampc_opt_level_name(lvl),
           ampc_optim_kind_name(kind), N / 2, N, STEPS, e);
    CHECK_MSG(e <= tol, "%s: two half batches differ from the full batch by %.3g (tolerance %g)", ampc_opt_level_name(lvl), e, tol);
    for (int s = 0; s < STEPS; s++) {
      CHECK(two[0].info[s].applied == one.info[s].applied && two[1].info[s].applied == one.info[s].applied);
      /* clipping sees the global norm, the same on every rank */
      CHECK(two[0].info[s].grad_norm == two[1].info[s].grad_norm && two[0].info[s].clip_coef == two[1].info[s].clip_coef);
      CHECK_MSG(fabs(two[0].info[s].grad_norm - one.info[s].grad_norm) <= 1e-3 * one.info[s].grad_norm,
                "step %d: norm %g on 2 ranks, %g on one", s, (double)two[0].info[s].grad_norm, (double)one.info[s].grad_norm);
    }
  }
  rank_free(&one);
  rank_free(&two[0]);
  rank_free(&two[1]);
  ampc_comm_free(c[0]);
  ampc_comm_free(c[1]);
}

/* O0 within f32 summation order, with Adam; O2 within f16 gradient
 * rounding (the half batches' gradients round differently from the full
 * batch's), with SGD -- Adam's update divides by the gradient's own size and
 * turns a rounding of a near-zero gradient into a step of lr either way. */
TEST(two_half_batches_equal_one_full_batch) {
  half_batches(AMPC_OPT_O0, AMPC_OPTIM_ADAM, 5e-6);
  half_batches(AMPC_OPT_O0, AMPC_OPTIM_SGD, 1e-6);
  half_batches(AMPC_OPT_O2, AMPC_OPTIM_SGD, 1e-4);
}

/* Both ranks on the same (full) batch: the mean of two equal gradients is
 * the gradient itself, the reduction adds them in one order -- every bit as
 * one process, f32 and f16 gradients alike. */
TEST(same_batch_on_two_ranks_is_bit_identical) {
  for (int l = 0; l < 2; l++) {
    ampc_opt_level lvl = l ? AMPC_OPT_O2 : AMPC_OPT_O0;
    rank one, two[2];
    ampc_comm *c[2];
    CHECK_OK(ampc_comm_local_create(c, 2));
    if (rank_make(&one, 0, N, lvl, NULL) & rank_make(&two[0], 0, N, lvl, c[0]) & rank_make(&two[1], 0, N, lvl, c[1])) {
      rank_run(&one);
      run_ranks(two, 2);
      size_t n = ampc_graph_param_numel(one.g);
      CHECK_MSG(memcmp(two[0].w, one.w, n * sizeof(float)) == 0 && memcmp(two[1].w, one.w, n * sizeof(float)) == 0,
                "%s: not bit-identical to one process", ampc_opt_level_name(lvl));
    }
    rank_free(&one);
    rank_free(&two[0]);
    rank_free(&two[1]);
    ampc_comm_free(c[0]);
    ampc_comm_free(c[1]);
  }
}

/* An inf on rank 1 alone: both ranks skip that step, back off to the same
 * scale, and keep identical weights; the steps around it apply. */
TEST(inf_on_one_rank_skips_on_both) {
  rank two[2];
  ampc_comm *c[2];
  CHECK_OK(ampc_comm_local_create(c, 2));
  if (rank_make(&two[0], 0, N / 2, AMPC_OPT_O2, c[0]) & rank_make(&two[1], N / 2, N / 2, AMPC_OPT_O2, c[1])) {
    two[1].inf_at = 2;
    run_ranks(two, 2);
    size_t n = ampc_graph_param_numel(two[0].g);
    for (int s = 0; s < STEPS; s++) {
      CHECK_MSG(two[0].info[s].applied == (s != 2) && two[1].info[s].applied == (s != 2), "step %d: applied %d and %d", s,
                two[0].info[s].applied, two[1].info[s].applied);
      CHECK_MSG(two[0].info[s].scale == two[1].info[s].scale, "step %d: scales %g and %g", s, (double)two[0].info[s].scale,
                (double)two[1].info[s].scale);
    }
    CHECK(two[0].info[2].found_inf && two[1].info[2].found_inf);
    CHECK(two[0].info[2].scale == 0.5f * two[0].info[1].scale);
    CHECK(memcmp(two[0].w, two[1].w, n * sizeof(float)) == 0);
  }
  rank_free(&two[0]);
  rank_free(&two[1]);
  ampc_comm_free(c[0]);
  ampc_comm_free(c[1]);
}

/* Two ranks on half batches under each data-parallel setting, against the
 * same two ranks with the defaults (vs) or one process on the full batch
 * (one): e, the largest weight difference over the largest weight. */
typedef struct {
  int zero, ar_f32, accum, no_sync;
  size_t bucket;
} dp_setting;

static double run_setting(ampc_opt_level lvl, ampc_optim_kind kind, const dp_setting *st, const float *ref, float **out_w,
                          size_t *master_optim_bytes) {
  rank two[2];
  ampc_comm *c[2];
  double e = INFINITY;
  CHECK_OK(ampc_comm_local_create(c, 2));
  if (rank_make_with(&two[0], 0, N / 2, lvl, c[0], kind) & rank_make_with(&two[1], N / 2, N / 2, lvl, c[1], kind)) {
    for (int r = 0; r < 2; r++) {
      if (st->zero) CHECK_OK(ampc_amp_set_zero(two[r].amp, 1));
      ampc_amp_set_allreduce_f32(two[r].amp, st->ar_f32);
      if (st->bucket) CHECK_OK(ampc_amp_set_bucket_bytes(two[r].amp, st->bucket));
      ampc_amp_set_no_sync(two[r].amp, st->no_sync);
      two[r].accum = st->accum;
    }
    run_ranks(two, 2);
    size_t n = ampc_graph_param_numel(two[0].g);
    int same = 1;
    for (size_t i = 0; i < n; i++) same &= two[0].w[i] == two[1].w[i];
    CHECK_MSG(same, "the ranks' weights differ");
    e = ref ? max_rel(two[0].w, ref, n) : 0.0;
    if (out_w) {
      *out_w = two[0].w;
      two[0].w = NULL;
    }
    ampc_mem_report mr;
    ampc_amp_memory(two[0].amp, &mr);
    if (master_optim_bytes)
      *master_optim_bytes = ampc_mem_total(&mr, AMPC_MEM_MASTER_WEIGHTS) + ampc_mem_total(&mr, AMPC_MEM_OPTIMIZER_STATE);
  }
  rank_free(&two[0]);
  rank_free(&two[1]);
  ampc_comm_free(c[0]);
  ampc_comm_free(c[1]);
  return e;
}

/* ZeRO-1 (masters and Adam's state sharded, gradients reduce-scattered,
 * weights all-gathered) gives the weights the unsharded ranks give, holding
 * half the master and optimizer bytes; so do small buckets (each parameter
 * its own all-reduce, started from backward's hook). */
TEST(zero_and_buckets_change_nothing) {
  for (int l = 0; l < 2; l++) {
    ampc_opt_level lvl = l ? AMPC_OPT_O2 : AMPC_OPT_O0;
    dp_setting base = {0}, zero = {.zero = 1}, small = {.bucket = 1024}, both = {.zero = 1, .bucket = 1024};
    float *w = NULL;
    size_t full = 0, sharded = 0;
    run_setting(lvl, AMPC_OPTIM_ADAM, &base, NULL, &w, &full);
    if (!w) continue;
    double ez = run_setting(lvl, AMPC_OPTIM_ADAM, &zero, w, NULL, &sharded);
    double eb = run_setting(lvl, AMPC_OPTIM_ADAM, &small, w, NULL, NULL);
    double e2 = run_setting(lvl, AMPC_OPTIM_ADAM, &both, w, NULL, NULL);
    printf("  %s: ZeRO-1 vs not %.3g, 1 KB buckets vs 25 MB %.3g, both %.3g; master + optimizer bytes per rank %zu vs %zu (%.3f)\n",
           ampc_opt_level_name(lvl), ez, eb, e2, sharded, full, (double)sharded / (double)full);
    CHECK_MSG(ez == 0.0 && eb == 0.0 && e2 == 0.0, "%s: weights differ", ampc_opt_level_name(lvl));
    CHECK_MSG((double)sharded <= 0.55 * (double)full, "%s: %zu of %zu bytes", ampc_opt_level_name(lvl), sharded, full);
    free(w);
  }
}

/* The f32 all-reduce of f16 gradients, micro-batches (two per step on each
 * rank, reduced after every backward or only at the step with no_sync) and
 * ZeRO with all of them: each against one process on the full batch. */
TEST(allreduce_f32_and_accumulation_match_one_process) {
  for (int l = 0; l < 2; l++) {
    ampc_opt_level lvl = l ? AMPC_OPT_O2 : AMPC_OPT_O0;
    double tol = l ? 1e-4 : 1e-6;
    rank one;
    if (!rank_make_with(&one, 0, N, lvl, NULL, AMPC_OPTIM_SGD)) {
      rank_free(&one);
      continue;
    }
    rank_run(&one);
    const dp_setting sets[] = {{.ar_f32 = 1}, {.accum = 2}, {.accum = 2, .no_sync = 1}, {.accum = 2, .bucket = 1024, .zero = 1},
                               {.ar_f32 = 1, .zero = 1, .bucket = 1024}};
    for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++) {
      double e = run_setting(lvl, AMPC_OPTIM_SGD, &sets[i], one.w, NULL, NULL);
      printf("  %s: f32 all-reduce %d, micro-batches %d, no_sync %d, ZeRO %d: max |w2 - w1| / max |w1| = %.3g\n",
             ampc_opt_level_name(lvl), sets[i].ar_f32, sets[i].accum ? sets[i].accum : 1, sets[i].no_sync, sets[i].zero, e);
      CHECK_MSG(e <= tol, "%s setting %zu: %.3g", ampc_opt_level_name(lvl), i, e);
    }
    rank_free(&one);
  }
}

/* The cnn's batch norms see half batches on two ranks: with SyncBatchNorm
 * their statistics are the full batch's and the weights follow one process
 * within f32 summation order (O0) or f16 rounding (O2); without it they
 * differ by design. The running statistics agree too. */
TEST(sync_batchnorm_matches_the_full_batch) {
  for (int l = 0; l < 2; l++) {
    ampc_opt_level lvl = l ? AMPC_OPT_O2 : AMPC_OPT_O0;
    double e[2] = {0, 0};
    for (int sync = 0; sync < 2; sync++) {
      rank one, two[2];
      ampc_comm *c[2];
      CHECK_OK(ampc_comm_local_create(c, 2));
      int ok = rank_make_model(&one, "cnn", 0, N, lvl, NULL, AMPC_OPTIM_SGD) &
               rank_make_model(&two[0], "cnn", 0, N / 2, lvl, c[0], AMPC_OPTIM_SGD) &
               rank_make_model(&two[1], "cnn", N / 2, N / 2, lvl, c[1], AMPC_OPTIM_SGD);
      if (ok) {
        for (int r = 0; r < 2; r++) CHECK_OK(ampc_amp_set_sync_batchnorm(two[r].amp, sync));
        rank_run(&one);
        run_ranks(two, 2);
        size_t n = ampc_graph_param_numel(one.g);
        e[sync] = max_rel(two[0].w, one.w, n);
        CHECK(memcmp(two[0].w, two[1].w, n * sizeof(float)) == 0);
        for (int st = 0; st < STEPS; st++) CHECK(one.info[st].applied && two[0].info[st].applied);
        float rm1[64], rm2[64];
        ampc_value bn = ampc_graph_find(one.g, "5.running_var");
        CHECK(bn >= 0);
        if (sync && bn >= 0) {
          CHECK_OK(ampc_graph_read(one.g, bn, rm1, AMPC_DTYPE_F32));
          CHECK_OK(ampc_graph_read(two[1].g, ampc_graph_find(two[1].g, "5.running_var"), rm2, AMPC_DTYPE_F32));
          CHECK(max_rel(rm2, rm1, 64) <= 1e-5);
        }
      }
      rank_free(&one);
      rank_free(&two[0]);
      rank_free(&two[1]);
      ampc_comm_free(c[0]);
      ampc_comm_free(c[1]);
    }
    printf("  cnn %s: 2 ranks x %d vs 1 x %d: max |w2 - w1| / max |w1| = %.3g with SyncBatchNorm, %.3g without\n",
           ampc_opt_level_name(lvl), N / 2, N, e[1], e[0]);
    CHECK_MSG(e[1] <= (l ? 1e-3 : 1e-5), "%s: %.3g", ampc_opt_level_name(lvl), e[1]);
    CHECK_MSG(e[0] > 10 * e[1], "%s: per-rank statistics should differ (%.3g vs %.3g)", ampc_opt_level_name(lvl), e[0], e[1]);
  }
}

/* SyncBatchNorm's sums live in the workspace of the batch norm's call: on
 * the guarded backend (device memory closed outside backend calls) the two
 * ranks give the cpu backend's bits. */
TEST(sync_batchnorm_on_the_guarded_backend) {
  float *w[2] = {NULL, NULL};
  for (int b = 0; b < 2; b++) {
    backend = b ? "cpu-guarded" : "cpu";
    rank two[2];
    ampc_comm *c[2];
    CHECK_OK(ampc_comm_local_create(c, 2));
    if (rank_make_model(&two[0], "cnn", 0, N / 2, AMPC_OPT_O2, c[0], AMPC_OPTIM_ADAM) &
        rank_make_model(&two[1], "cnn", N / 2, N / 2, AMPC_OPT_O2, c[1], AMPC_OPTIM_ADAM)) {
      for (int r = 0; r < 2; r++) CHECK_OK(ampc_amp_set_sync_batchnorm(two[r].amp, 1));
      for (int r = 0; r < 2; r++) CHECK_OK(ampc_amp_set_zero(two[r].amp, 1));
      run_ranks(two, 2);
      w[b] = two[0].w;
      two[0].w = NULL;
    }
    rank_free(&two[0]);
    rank_free(&two[1]);
    ampc_comm_free(c[0]);
    ampc_comm_free(c[1]);
  }
  backend = "cpu";
  ampc_model_opts mo = {.batch = N / 2, .channels = 1, .height = 8, .width = 8, .classes = K, .seed = 5};
  ampc_model *m = NULL;
  CHECK_OK(ampc_model_create(&m, "cnn", &mo));
  size_t n = m ? ampc_graph_param_numel(ampc_model_graph(m)) : 0;
  CHECK_MSG(w[0] && w[1] && memcmp(w[0], w[1], n * sizeof(float)) == 0, "cpu-guarded differs from cpu");
  ampc_model_free(m);
  free(w[0]);
  free(w[1]);
}

typedef struct {
  rank *k;
  ampc_status s;
} check_arg;

static void *check_thread(void *p) {
  check_arg *c = p;
  c->s = ampc_amp_check_ranks(c->k->amp);
  return NULL;
}

/* A rank whose loss scale drifted is found by the rank check, on every rank. */
TEST(rank_check_finds_a_drifted_scale) {
  rank two[2];
  ampc_comm *c[2];
  CHECK_OK(ampc_comm_local_create(c, 2));
  if (rank_make(&two[0], 0, N / 2, AMPC_OPT_O2, c[0]) & rank_make(&two[1], N / 2, N / 2, AMPC_OPT_O2, c[1])) {
    for (int drift = 0; drift < 2; drift++) {
      if (drift) {
        ampc_scaler_state st;
        ampc_scaler_get_state(ampc_amp_scaler(two[1].amp, 0), &st);
        st.scale *= 2.0f;
        CHECK_OK(ampc_scaler_set_state(ampc_amp_scaler(two[1].amp, 0), &st));
      }
      check_arg a[2] = {{&two[0], 0}, {&two[1], 0}};
      pthread_t t[2];
      for (int r = 0; r < 2; r++) pthread_create(&t[r], NULL, check_thread, &a[r]);
      for (int r = 0; r < 2; r++) pthread_join(t[r], NULL);
      for (int r = 0; r < 2; r++) CHECK_MSG(drift ? a[r].s == AMPC_ESTATE : a[r].s == 0, "drift %d: rank %d: %d", drift, r, a[r].s);
    }
  }
  rank_free(&two[0]);
  rank_free(&two[1]);
  ampc_comm_free(c[0]);
  ampc_comm_free(c[1]);
}

TEST(local_comm_basics) {
  ampc_comm *c[3];
  CHECK_OK(ampc_comm_local_create(c, 3));
  for (int i = 0; i < 3; i++) CHECK(ampc_comm_rank(c[i]) == i && ampc_comm_size(c[i]) == 3);
  CHECK(strcmp(ampc_comm_kind(c[0]), "local") == 0);
  for (int i = 0; i < 3; i++) ampc_comm_free(c[i]);
  CHECK_ERR(ampc_comm_local_create(c, 0), AMPC_EINVAL, "ranks");
  CHECK(ampc_comm_size(NULL) == 1 && ampc_comm_rank(NULL) == 0);
}

TEST_MAIN(TEST_ENTRY(two_half_batches_equal_one_full_batch), TEST_ENTRY(same_batch_on_two_ranks_is_bit_identical),
          TEST_ENTRY(inf_on_one_rank_skips_on_both), TEST_ENTRY(zero_and_buckets_change_nothing),
          TEST_ENTRY(allreduce_f32_and_accumulation_match_one_process), TEST_ENTRY(sync_batchnorm_matches_the_full_batch),
          TEST_ENTRY(sync_batchnorm_on_the_guarded_backend),
          TEST_ENTRY(rank_check_finds_a_drifted_scale),
          TEST_ENTRY(local_comm_basics))
