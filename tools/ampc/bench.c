/* ampc bench: timed training steps of a model on random data, with the
 * machine's own sgemm rate measured in the same process as the baseline. */
#include <cblas.h>
#include <jansson.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "ampc/rng.h"
#include "session.h"

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
  int n = cli_common_opts(&c, opts, 1);
  opts[n++] = (cli_opt){"--steps", OPT_INT, &steps, "N", "timed training steps (default 3)", 1, NULL};
  opts[n++] = (cli_opt){"--warmup", OPT_INT, &warmup, "N", "untimed steps first (default 1)", 0, NULL};
  opts[n++] = (cli_opt){"--sgemm-size", OPT_INT, &sgemm_n, "N", "size of the baseline sgemm, 64..16384 (default 2048)", 64, NULL};
  opts[n++] = (cli_opt){"--profile", OPT_ONOFF, &profile, "on|off", "time each kind of op (default on)", 0, NULL};
  opts[n++] = (cli_opt){"--json", OPT_FLAG, &json, NULL, "print one JSON object", 0, NULL};
  opts[n] = (cli_opt){0};
  int pr = cli_parse("bench", "[--model M] [options]", opts, argc, argv);
  if (pr) return pr > 0 ? 0 : 2;
  int is_resnet = strcmp(c.model, "resnet18") == 0;
  int shape[4] = {is_resnet ? 3 : 1, is_resnet ? 32 : 28, is_resnet ? 32 : 28, 10};
  ampc_optim_config oc;
  ampc_optim_config_default(&oc, AMPC_OPTIM_ADAM);
  cli_session s;
  if (cli_session_open(&s, &c, 0, 0, shape, &oc, c.batch_size, NULL, NULL) < 0) {
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
  ampc_rng r = ampc_rng_make(c.seed, AMPC_RNG_STREAM_DATA);
  for (size_t i = 0; i < nx; i++) xf[i] = ampc_rng_normal(&r);
  for (size_t i = 0; i < ny; i++) yi[i] = (int32_t)ampc_rng_below(&r, 10);
  int bad = ampc_graph_write(s.g, ampc_model_input(s.model), xf, AMPC_DTYPE_F32) < 0 ||
            ampc_graph_write(s.g, ampc_model_labels(s.model), yi, AMPC_DTYPE_I32) < 0;
  free(xf);
  free(yi);
  if (bad) {
    cli_lib_error(NULL);
    cli_session_close(&s);
    return 1;
  }

  ampc_value loss = ampc_model_loss(s.model);
  double t_opt = 0.0, total = 0.0;
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
  }
  double t_end = cli_now();
  if (!rc && ampc_graph_read(s.g, loss, &last_loss, AMPC_DTYPE_F32) < 0) rc = 1;
  total += cli_now() - t_end;
  if (rc) {
    cli_lib_error(NULL);
    cli_session_close(&s);
    return 1;
  }
  ampc_backend_stats bs;
  ampc_graph_backend_stats(s.g, &bs, 0);
  const double *fwd = bs.fwd, *bwd = bs.bwd, cbd = bs.conv_bwd_data, cbw = bs.conv_bwd_weights;
  double per_step = total / steps;
  double ips = (double)c.batch_size / per_step;
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
  if (json) {
    json_t *o = json_object();
    json_object_set_new(o, "model", json_string(c.model));
    json_object_set_new(o, "batch_size", json_integer(c.batch_size));
    json_object_set_new(o, "opt_level", json_string(ampc_opt_level_name(s.amp_cfg.opt_level)));
    json_object_set_new(o, "half", json_string(ampc_dtype_name(s.amp_cfg.half_type)));
    json_object_set_new(o, "threads", json_integer(threads));
    json_object_set_new(o, "steps", json_integer(steps));
    json_object_set_new(o, "seconds_per_step", json_real(per_step));
    json_object_set_new(o, "images_per_s", json_real(ips));
    json_object_set_new(o, "gflop_per_image", json_real(flops / (double)c.batch_size / 1e9));
    json_object_set_new(o, "gflops_per_s", json_real(gflops));
    json_object_set_new(o, "sgemm_gflops_per_s", json_real(sgemm));
    json_object_set_new(o, "sgemm_fraction", json_real(sgemm > 0 ? gflops / sgemm : 0.0));
    json_object_set_new(o, "peak_rss_bytes", json_integer(rss));
    json_object_set_new(o, "device", json_string(ampc_graph_backend_name(s.g)));
    if (bs.mem_reserved_peak > 0) {
      /* device memory (cuda): what the arena took from the device at its
       * peak, and the most of it handed out at once */
      json_object_set_new(o, "device_memory_peak_bytes", json_integer(bs.mem_reserved_peak));
      json_object_set_new(o, "device_memory_in_use_peak_bytes", json_integer(bs.mem_in_use_peak));
    }
    json_t *sh = json_object();
    for (size_t i = 0; i < nshare; i++) json_object_set_new(sh, share[i].name, json_real(total > 0 ? share[i].t / total : 0));
    json_object_set_new(sh, "other", json_real(total > 0 ? (total - accounted) / total : 0));
    json_object_set_new(o, "time_share", sh);
    json_object_set_new(o, "memory", cli_memory_json(&mem));
    char *str = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(6));
    if (str) printf("%s\n", str);
    free(str);
    json_decref(o);
  } else {
    printf("model %s, batch %lld, %s (%s), device %s, %d threads, %d steps after %d warm-up\n", c.model, (long long)c.batch_size,
           ampc_opt_level_name(s.amp_cfg.opt_level), ampc_dtype_name(s.amp_cfg.half_type), ampc_graph_backend_name(s.g), threads,
           steps, warmup);
    printf("%.3f s/step, %.1f images/s, %.2f GFLOP/image, %.1f GFLOP/s = %.2f of this machine's sgemm (%.1f GFLOP/s at %d^3)\n",
           per_step, ips, flops / (double)c.batch_size / 1e9, gflops, sgemm > 0 ? gflops / sgemm : 0.0, sgemm, sgemm_n);
    printf("time share:");
    for (size_t i = 0; i < nshare; i++) printf(" %s %.1f%%", share[i].name, total > 0 ? 100.0 * share[i].t / total : 0.0);
    printf(" other %.1f%%\n", total > 0 ? 100.0 * (total - accounted) / total : 0.0);
    printf("peak resident memory %.1f MB\n", (double)rss / 1e6);
    if (bs.mem_reserved_peak > 0)
      printf("peak device memory %.1f MB (%.1f MB of it in use at once)\n", (double)bs.mem_reserved_peak / 1e6,
             (double)bs.mem_in_use_peak / 1e6);
    cli_print_memory(stdout, &mem);
  }
  cli_session_close(&s);
  return 0;
}
