/* ampc bench: timed training steps of a model on random data, with the
 * machine's own sgemm rate and its FMA peak measured in the same process as
 * the baselines. */
#include <cblas.h>
#include <jansson.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include "ampc/dtype.h"
#include "ampc/rng.h"
#include "ampc/version.h"
#include "dist.h"
#include "session.h"

/* The machine's arithmetic peak: every thread runs a loop of independent
 * vector multiply-adds on registers only (12 chains, more than the FMA
 * units' latency times their number on current x86 cores, so that no chain
 * waits for itself): 16-wide FMA where the CPU has AVX-512, 8-wide where it
 * has AVX2 and FMA, else 4-wide multiply and add. Returns the FLOPs done by one thread's call (2 per lane
 * of a multiply-add); *sink keeps the results alive. */
enum { PEAK_CHAINS = 12 };
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2,fma"))) static double peak_loop_fma(long iters, float *sink) {
  __m256 acc[PEAK_CHAINS], a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (int i = 0; i < PEAK_CHAINS; i++) acc[i] = _mm256_set1_ps((float)i);
  for (long it = 0; it < iters; it++)
    for (int i = 0; i < PEAK_CHAINS; i++) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  __m256 s = acc[0];
  for (int i = 1; i < PEAK_CHAINS; i++) s = _mm256_add_ps(s, acc[i]);
  *sink = _mm256_cvtss_f32(s);
  return 2.0 * 8 * PEAK_CHAINS * (double)iters;
}
__attribute__((target("avx512f"))) static double peak_loop_fma16(long iters, float *sink) {
  __m512 acc[PEAK_CHAINS], a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (int i = 0; i < PEAK_CHAINS; i++) acc[i] = _mm512_set1_ps((float)i);
  for (long it = 0; it < iters; it++)
    for (int i = 0; i < PEAK_CHAINS; i++) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  __m512 s = acc[0];
  for (int i = 1; i < PEAK_CHAINS; i++) s = _mm512_add_ps(s, acc[i]);
  *sink = _mm512_reduce_add_ps(s);
  return 2.0 * 16 * PEAK_CHAINS * (double)iters;
}
static double peak_loop_base(long iters, float *sink) {
  __m128 acc[PEAK_CHAINS], a = _mm_set1_ps(0.999999f), b = _mm_set1_ps(1e-7f);
  for (int i = 0; i < PEAK_CHAINS; i++) acc[i] = _mm_set1_ps((float)i);
  for (long it = 0; it < iters; it++)
    for (int i = 0; i < PEAK_CHAINS; i++) acc[i] = _mm_add_ps(_mm_mul_ps(acc[i], a), b);
  __m128 s = acc[0];
  for (int i = 1; i < PEAK_CHAINS; i++) s = _mm_add_ps(s, acc[i]);
  *sink = _mm_cvtss_f32(s);
  return 2.0 * 4 * PEAK_CHAINS * (double)iters;
}
#else
static double peak_loop_base(long iters, float *sink) {
  float acc[PEAK_CHAINS];
  for (int i = 0; i < PEAK_CHAINS; i++) acc[i] = (float)i;
  for (long it = 0; it < iters; it++)
    for (int i = 0; i < PEAK_CHAINS; i++) acc[i] = acc[i] * 0.999999f + 1e-7f;
  float s = 0.0f;
  for (int i = 0; i < PEAK_CHAINS; i++) s += acc[i];
  *sink = s;
  return 2.0 * PEAK_CHAINS * (double)iters;
}
#endif

/* The widest loop above this CPU runs: 2 (16-wide FMA), 1 (8-wide FMA) or 0. */
enum { PEAK_BASE, PEAK_FMA8, PEAK_FMA16 };
static int cpu_peak_kind(void) {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return PEAK_FMA16;
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? PEAK_FMA8 : PEAK_BASE;
#else
  return PEAK_BASE;
#endif
}

/* GFLOP/s of the loop above on `threads` threads together, all started
 * before the clock and waited for (best of 3 runs of about 0.07 s each on a
 * 3 GHz core). */
static double fma_peak(int threads, int kind) {
  const long iters = 32L << 20;
  double best = 0.0;
  float sink = 0.0f;
  for (int r = 0; r < 3; r++) {
    double flops = 0.0, t0 = cli_now();
#pragma omp parallel num_threads(threads) reduction(+ : flops)
    {
      float s = 0.0f;
#if defined(__x86_64__) && defined(__GNUC__)
      flops += kind == PEAK_FMA16  ? peak_loop_fma16(iters, &s)
               : kind == PEAK_FMA8 ? peak_loop_fma(iters, &s)
                                   : peak_loop_base(iters, &s);
#else
      (void)kind;
      flops += peak_loop_base(iters, &s);
#endif
#pragma omp atomic
      sink += s;
    }
    double rate = flops / (cli_now() - t0) / 1e9;
    if (rate > best) best = rate;
  }
  return sink == -1.0f ? 0.0 : best; /* a use of sink the compiler cannot drop */
}

/* GFLOP/s of a square sgemm of size n on the current thread count (best of 3). */
static double sgemm_rate(int n) {
  float *a = malloc((size_t)n * n * sizeof *a), *b = malloc((size_t)n * n * sizeof *b), *c = malloc((size_t)n * n * sizeof *c);
  if (!a || !b || !c) {
    free(a), free(b), free(c);
    return 0.0;
  }
  for (size_t i = 0; i < (size_t)n * n; i++) {
    a[i] = (float)(i % 7) * 0.1f;
    b[i] = (float)(i % 5) * 0.1f;
  }
  double best = 1e30;
  for (int r = 0; r < 3; r++) {
    double t0 = cli_now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
    double t = cli_now() - t0;
    if (t < best) best = t;
  }
  free(a), free(b), free(c);
  return 2.0 * (double)n * n * n / best / 1e9;
}

static long peak_rss_bytes(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss * 1024L;
}

int cmd_bench(int argc, char **argv) {
  cli_common c;
  cli_common_defaults(&c);
  c.model = "resnet18";
  int steps = 3, warmup = 1, json = 0, sgemm_n = 2048, profile = 1;
  cli_opt opts[48];
  int n = cli_common_opts(&c, opts, CLI_OPTS_BATCH | CLI_OPTS_SEED | CLI_OPTS_PRECISION | CLI_OPTS_STEP | CLI_OPTS_DIST);
  opts[0].help = "mlp, cnn or resnet18 (default resnet18)"; /* the first common option: --model */
  opts[n++] = (cli_opt){"--steps", OPT_INT, &steps, "N", "timed training steps (default 3)", 1, NULL};
  opts[n++] = (cli_opt){"--warmup", OPT_INT, &warmup, "N", "untimed steps first (default 1)", 0, NULL};
  opts[n++] = (cli_opt){"--sgemm-size", OPT_INT, &sgemm_n, "N", "size of the baseline sgemm, 64..16384 (default 2048)", 64, NULL};
  opts[n++] = (cli_opt){"--profile", OPT_ONOFF, &profile, "on|off", "time each kind of op (default on)", 0, NULL};
  opts[n++] = (cli_opt){"--json", OPT_FLAG, &json, NULL, "print one JSON object", 0, NULL};
  opts[n] = (cli_opt){0};
  const int W = cli_dist_size(), root = cli_dist_root();
  /* usage errors are every rank's alike: rank 0 says them */
  cli_dist_error_mode(CLI_ERRORS_ROOT);
  int pr = cli_parse("bench", "[--model M] [options]", opts, argc, argv);
  ampc_amp_config acfg;
  if (!pr) pr = cli_common_check(&c, &acfg);
  pr = cli_dist_parse_agree(pr);
  if (!pr && !cli_dist_same_options(opts)) pr = -1;
  cli_dist_error_mode(W > 1 ? CLI_ERRORS_HOLD : CLI_ERRORS_ALL);
  if (pr) return pr > 0 ? 0 : pr == -2 ? 1 : 2;
  /* data-parallel (mpirun): each rank its share of the cores, its own batch */
  if (W > 1 && c.threads == 0 && !getenv("OMP_NUM_THREADS")) c.threads = cli_dist_default_threads();
  int is_resnet = strcmp(c.model, "resnet18") == 0;
  int shape[4] = {is_resnet ? 3 : 1, is_resnet ? 32 : 28, is_resnet ? 32 : 28, 10};
  ampc_optim_config oc;
  ampc_optim_config_default(&oc, AMPC_OPTIM_ADAM);
  cli_session s;
  if (!cli_dist_agree(cli_session_open(&s, &c, 0, 0, shape, &oc, c.batch_size, NULL, NULL) == 0)) {
    cli_session_close(&s);
    return 1;
  }
  int threads = ampc_graph_threads(s.g);

  /* random inputs and labels, as the PyTorch reference uses */
  ampc_tensor x = ampc_graph_tensor(s.g, ampc_model_input(s.model));
  size_t nx = (size_t)ampc_tensor_numel(&x), ny = (size_t)ampc_graph_batch(s.g);
  float *xf = malloc(nx * sizeof *xf);
  int32_t *yi = malloc(ny * sizeof *yi);
  if (!xf || !yi) {
    free(xf);
    free(yi);
    cli_error("out of memory");
    cli_session_close(&s);
    return 1;
  }
  ampc_rng r = ampc_rng_make(c.seed + (uint64_t)cli_dist_rank(), AMPC_RNG_STREAM_DATA);
  for (size_t i = 0; i < nx; i++) xf[i] = ampc_rng_normal(&r);
  for (size_t i = 0; i < ny; i++) yi[i] = (int32_t)ampc_rng_below(&r, 10);
  int bad = ampc_graph_write(s.g, ampc_model_input(s.model), xf, AMPC_DTYPE_F32) < 0 ||
            ampc_graph_write(s.g, ampc_model_labels(s.model), yi, AMPC_DTYPE_I32) < 0;
  free(xf);
  free(yi);
  if (bad) {
    cli_lib_error(NULL);
    cli_dist_abort(1);
    cli_session_close(&s);
    return 1;
  }

  ampc_value loss = ampc_model_loss(s.model);
  double t_opt = 0.0, total = 0.0, comm_window = 0.0, comm_exposed = 0.0, comm_bytes = 0.0;
  int comm_buckets = 0;
  int rc = 0;
  float last_loss = 0.0f;
  for (int it = 0; it < warmup + steps && rc == 0; it++) {
    if (it == warmup) {
      /* a device runs behind the host: it is idle when the timing starts
       * (reading a value waits for it), and the last step's tail is timed
       * below */
      if (ampc_graph_read(s.g, loss, &last_loss, AMPC_DTYPE_F32) < 0) rc = 1;
      ampc_graph_set_profiling(s.g, profile);
      t_opt = 0.0;
      ampc_amp_comm_stats drop;
      ampc_amp_get_comm_stats(s.amp, &drop, 1);
    }
    double t0 = cli_now();
    if (ampc_amp_forward(s.amp, 1) < 0 || ampc_amp_backward(s.amp, loss, 0, 0) < 0) rc = 1;
    double t1 = cli_now();
    ampc_amp_step_info info;
    if (!rc && ampc_amp_step(s.amp, oc.lr, &info) < 0) rc = 1;
    double t2 = cli_now();
    if (it >= warmup) {
      t_opt += t2 - t1;
      total += t2 - t0;
    }
    if (W > 1 && !rc && it >= warmup) {
      /* this step's communication, the least over the ranks (untimed): a
       * rank that reaches a collective first also waits for the others,
       * the last to arrive for the communication alone */
      ampc_amp_comm_stats one;
      ampc_amp_get_comm_stats(s.amp, &one, 1);
      double v[2] = {one.seconds, one.exposed_seconds};
      if (ampc_comm_allreduce_host(cli_dist_comm(), v, 2, AMPC_COMM_MIN) < 0) rc = 1;
      comm_window += v[0];
      comm_exposed += v[1];
      comm_bytes += one.bytes;
      comm_buckets = one.buckets;
    }
  }
  ampc_backend_stats bs;
  ampc_graph_backend_stats(s.g, &bs, 0); /* of the timed steps */
  /* what the backend chose (cuda: each convolution's cuDNN algorithms) */
  static char notes[1 << 16];
  if (profile) ampc_graph_backend_notes(s.g, notes, sizeof notes);
  ampc_graph_set_profiling(s.g, 0);
  /* data-parallel: the overlapped steps' communication, and what the same
   * all-reduce costs when nothing overlaps it (after backward, blocking:
   * the better of two, the ranks lined up first) */
  double blocking = 0.0;
  for (int it = 0; W > 1 && it < 2 && rc == 0; it++) {
    ampc_amp_set_no_sync(s.amp, 1);
    if (ampc_amp_forward(s.amp, 1) < 0 || ampc_amp_backward(s.amp, loss, 0, 0) < 0) rc = 1;
    double line_up = 0.0;
    if (!rc && ampc_comm_allreduce_host(cli_dist_comm(), &line_up, 1, AMPC_COMM_SUM) < 0) rc = 1;
    double t0 = cli_now();
    if (!rc && ampc_amp_sync_grads(s.amp) < 0) rc = 1;
    double t = cli_now() - t0;
    if (!rc && ampc_amp_step(s.amp, oc.lr, NULL) < 0) rc = 1;
    if (it == 0 || t < blocking) blocking = t;
    ampc_amp_set_no_sync(s.amp, 0);
  }
  double t_end = cli_now();
  if (!rc && ampc_graph_read(s.g, loss, &last_loss, AMPC_DTYPE_F32) < 0) rc = 1;
  total += cli_now() - t_end;
  if (rc) {
    cli_lib_error(NULL);
    cli_dist_abort(1);
    cli_session_close(&s);
    return 1;
  }
  double comm_step = comm_window / steps, exposed_step = comm_exposed / steps;
  if (W > 1 && ampc_comm_allreduce_host(cli_dist_comm(), &blocking, 1, AMPC_COMM_MIN) < 0) {
    cli_lib_error(NULL);
    cli_dist_abort(1);
  }
  double hidden = blocking > 0 ? 1.0 - exposed_step / blocking : 0.0;
  if (hidden < 0) hidden = 0;
  const double *fwd = bs.fwd, *bwd = bs.bwd, cbd = bs.conv_bwd_data, cbw = bs.conv_bwd_weights;
  /* a device that runs behind the host (cuda) times the step's passes
   * itself: the host's time of ampc_amp_step there is mostly waiting for
   * the forward and backward queued before it */
  if (bs.step > 0.0) t_opt = bs.step;
  double per_step = total / steps;
  double ips = (double)c.batch_size * W / per_step; /* over all the ranks */
  double flops = 3.0 * ampc_graph_forward_flops(s.g); /* forward + two products backward */
  double gflops = flops / per_step / 1e9;
  double elt = 0.0;
  const ampc_op_kind eltwise[] = {AMPC_OP_RELU, AMPC_OP_ADD, AMPC_OP_MAXPOOL2D, AMPC_OP_AVGPOOL2D, AMPC_OP_GLOBAL_AVGPOOL,
                                  AMPC_OP_SOFTMAX, AMPC_OP_LOG_SOFTMAX, AMPC_OP_CROSS_ENTROPY};
  for (size_t i = 0; i < sizeof eltwise / sizeof eltwise[0]; i++) elt += fwd[eltwise[i]] + bwd[eltwise[i]];
  struct {
    const char *name;
    double t;
  } share[] = {
      {"conv_forward", fwd[AMPC_OP_CONV2D]},
      {"conv_backward_data", cbd},
      {"conv_backward_weights", cbw},
      {"linear", fwd[AMPC_OP_LINEAR] + bwd[AMPC_OP_LINEAR]},
      {"batch_norm", fwd[AMPC_OP_BATCHNORM2D] + bwd[AMPC_OP_BATCHNORM2D]},
      {"elementwise", elt},
      {"optimizer", t_opt},
      {"conversions", fwd[AMPC_OP_CAST] + bwd[AMPC_OP_CAST]},
  };
  size_t nshare = sizeof share / sizeof share[0];
  double accounted = 0.0;
  for (size_t i = 0; i < nshare; i++) accounted += share[i].t;
  ampc_mem_report mem;
  ampc_amp_memory(s.amp, &mem);
  /* the peak of training itself; the baseline's matrices come after it */
  long rss = peak_rss_bytes();
  double sgemm = sgemm_rate(sgemm_n);
  /* what the run computed in: an f32 run says f32, not the half type it
   * would have used */
  char precision[32];
  const ampc_amp_config *ac = &s.amp_cfg;
  if (ac->autocast) snprintf(precision, sizeof precision, "%s autocast", ampc_dtype_name(ac->half_type));
  else snprintf(precision, sizeof precision, "%s", ampc_dtype_name(ac->cast_model_type));
  int peak_kind = cpu_peak_kind();
  static const char *const kind_key[] = {"mul+add4", "fma8", "fma16"};
  static const char *const kind_words[] = {"4-wide multiply-adds", "8-wide FMAs", "16-wide FMAs"};
  double peak = fma_peak(threads, peak_kind);
  if (!root) {
    /* rank 0 reports */
  } else if (json) {
    json_t *o = json_object();
    json_object_set_new(o, "model", json_string(c.model));
    json_object_set_new(o, "batch_size", json_integer(c.batch_size));
    json_object_set_new(o, "opt_level", json_string(ampc_opt_level_name(s.amp_cfg.opt_level)));
    json_object_set_new(o, "half", json_string(ampc_dtype_name(s.amp_cfg.half_type)));
    json_object_set_new(o, "precision", json_string(precision));
    json_object_set_new(o, "threads", json_integer(threads));
    json_object_set_new(o, "steps", json_integer(steps));
    json_object_set_new(o, "seconds_per_step", json_real(per_step));
    json_object_set_new(o, "images_per_s", json_real(ips));
    json_object_set_new(o, "gflop_per_image", json_real(flops / (double)c.batch_size / 1e9));
    json_object_set_new(o, "gflops_per_s", json_real(gflops));
    json_object_set_new(o, "sgemm_gflops_per_s", json_real(sgemm));
    json_object_set_new(o, "sgemm_fraction", json_real(sgemm > 0 ? gflops / sgemm : 0.0));
    json_object_set_new(o, "peak_gflops_per_s", json_real(peak));
    json_object_set_new(o, "peak_kind", json_string(kind_key[peak_kind]));
    json_object_set_new(o, "peak_fraction", json_real(peak > 0 ? gflops / peak : 0.0));
    json_object_set_new(o, "kernel_path", json_string(ampc_kernel_path()));
    json_object_set_new(o, "kernel_tiles", json_string(ampc_kernel_tiles()));
    json_object_set_new(o, "blas", json_string(ampc_blas_name()));
    json_object_set_new(o, "blas_core", json_string(ampc_blas_core()));
    json_object_set_new(o, "blas_better_core", ampc_blas_better_core() ? json_string(ampc_blas_better_core()) : json_null());
    json_object_set_new(o, "convert_path", json_string(ampc_convert_path()));
    json_object_set_new(o, "peak_rss_bytes", json_integer(rss));
    json_object_set_new(o, "device", json_string(ampc_graph_backend_name(s.g)));
    if (bs.mem_reserved_peak > 0) {
      /* device memory (cuda): what the arena took from the device at its
       * peak, and the most of it handed out at once */
      json_object_set_new(o, "device_memory_peak_bytes", json_integer(bs.mem_reserved_peak));
      json_object_set_new(o, "device_memory_in_use_peak_bytes", json_integer(bs.mem_in_use_peak));
    }
    /* (with --profile off the ops are not timed: no share to give) */
    if (profile) {
      json_t *sh = json_object();
      for (size_t i = 0; i < nshare; i++) json_object_set_new(sh, share[i].name, json_real(total > 0 ? share[i].t / total : 0));
      json_object_set_new(sh, "other", json_real(total > 0 ? (total - accounted) / total : 0));
      json_object_set_new(o, "time_share", sh);
    }
    if (notes[0]) json_object_set_new(o, "backend_notes", json_string(notes));
    json_object_set_new(o, "memory", cli_memory_json(&mem));
    json_object_set_new(o, "world_size", json_integer(W));
    if (W > 1) {
      json_object_set_new(o, "global_batch_size", json_integer(c.batch_size * W));
      json_object_set_new(o, "comm_buckets", json_integer(comm_buckets));
      json_object_set_new(o, "comm_bytes_per_step", json_real(comm_bytes / steps));
      json_object_set_new(o, "comm_blocking_seconds_per_step", json_real(blocking));
      json_object_set_new(o, "comm_window_seconds_per_step", json_real(comm_step));
      json_object_set_new(o, "comm_exposed_seconds_per_step", json_real(exposed_step));
      json_object_set_new(o, "comm_hidden_fraction", json_real(hidden));
    }
    char *str = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(6));
    if (str) printf("%s\n", str);
    free(str);
    json_decref(o);
  } else {
    if (W > 1)
      printf("model %s, %d ranks x batch %lld (global %lld), %s (%s), device %s, %d thread%s a rank, %d step%s after %d warm-up\n", c.model, W,
             (long long)c.batch_size, (long long)c.batch_size * W, ampc_opt_level_name(s.amp_cfg.opt_level), precision,
             ampc_graph_backend_name(s.g), threads, threads == 1 ? "" : "s", steps, steps == 1 ? "" : "s", warmup);
    else
      printf("model %s, batch %lld, %s (%s), device %s, %d thread%s, %d step%s after %d warm-up\n", c.model, (long long)c.batch_size,
             ampc_opt_level_name(s.amp_cfg.opt_level), precision, ampc_graph_backend_name(s.g), threads, threads == 1 ? "" : "s", steps,
             steps == 1 ? "" : "s", warmup);
    printf("%.4g s/step, %.1f images/s, %.3g GFLOP/image, %.1f GFLOP/s = %.2f of this machine's sgemm (%.1f GFLOP/s at %d^3)\n",
           per_step, ips, flops / (double)c.batch_size / 1e9, gflops, sgemm > 0 ? gflops / sgemm : 0.0, sgemm, sgemm_n);
    printf("%.1f GFLOP/s = %.2f of this machine's peak (%.1f GFLOP/s: a register-only loop of %s on %d thread%s)\n",
           gflops, peak > 0 ? gflops / peak : 0.0, peak, kind_words[peak_kind], threads, threads == 1 ? "" : "s");
    printf("vector code: kernels %s, tiles %s, conversions %s; blas: %s, core %s\n", ampc_kernel_path(), ampc_kernel_tiles(), ampc_convert_path(),
           ampc_blas_name(), ampc_blas_core());
    const char *better = ampc_blas_better_core(), *ct = getenv("OPENBLAS_CORETYPE");
    if (better)
      printf("note: OpenBLAS runs its %s kernels (OPENBLAS_CORETYPE=%s), without vector instructions this CPU has; its %s "
             "kernels use them (unset OPENBLAS_CORETYPE and kernels that fit are chosen)\n",
             ampc_blas_core(), ct ? ct : "not set", better);
    if (profile) {
      printf("time share:");
      for (size_t i = 0; i < nshare; i++) printf(" %s %.1f%%", share[i].name, total > 0 ? 100.0 * share[i].t / total : 0.0);
      printf(" other %.1f%%\n", total > 0 ? 100.0 * (total - accounted) / total : 0.0);
    }
    if (W > 1)
      printf("gradient all-reduce: %d bucket%s, %.1f MB a step per rank; alone (after backward) %.1f ms, overlapped with backward "
             "%.1f ms of the rank's time (window %.1f ms): overlap hid %.0f%%\n",
             comm_buckets, comm_buckets == 1 ? "" : "s", comm_bytes / steps / 1e6, 1e3 * blocking, 1e3 * exposed_step,
             1e3 * comm_step, 100.0 * hidden);
    printf("peak resident memory %.1f MB%s\n", (double)rss / 1e6, W > 1 ? " (rank 0)" : "");
    if (bs.mem_reserved_peak > 0)
      printf("peak device memory %.1f MB (%.1f MB of it in use at once)\n", (double)bs.mem_reserved_peak / 1e6,
             (double)bs.mem_in_use_peak / 1e6);
    cli_print_memory(stdout, &mem);
    if (notes[0]) printf("backend's choices:\n%s", notes);
  }
  cli_session_close(&s);
  return 0;
}
