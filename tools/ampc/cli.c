#include "cli.h"

#include "ampc/backend.h"
#include "ampc/config.h"
#include "core/cgroup_internal.h"
#include "core/dtype_internal.h"
#include "core/status_internal.h"
#include "io/fsutil_internal.h"
#include "dist.h"

#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <jansson.h>
#include <math.h>
#include <omp.h>
#include <stdarg.h>
#include <stdlib.h>
#include <limits.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cblas.h>

void openblas_set_num_threads(int num_threads);
int openblas_get_num_threads(void);

/* One error line; with several ranks it names the rank, or waits for the
 * ranks to agree which one reports (dist.h). A flag's value or a file's
 * content quoted in it stays on the line, as in the library's messages. */
static void error_line(char *line) {
  ampc__one_line(line);
  const char *pre;
  if (cli_dist_error_route(&pre, line)) fprintf(stderr, "ampc: error: %s%s\n", pre, line);
}

void cli_error(const char *fmt, ...) {
  char line[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  error_line(line);
}

void cli_lib_error(const char *context) {
  char line[4096], limit[96] = "";
  const char *e = ampc_last_error();
  /* out of memory where a control group (a container's) limits it: say so */
  uint64_t cg = strstr(e, "out of memory") || strstr(e, "of memory of backend") ? ampc__cgroup_memory() : 0;
  if (cg) snprintf(limit, sizeof limit, " (this process's control group limits its memory to %.2f GB)", (double)cg / 1e9);
  if (context)
    snprintf(line, sizeof line, "%s: %s%s", context, e, limit);
  else
    snprintf(line, sizeof line, "%s%s", e, limit);
  error_line(line);
}

const char *cli_shown(const char *name) {
  static char buf[4][4096];
  static unsigned next;
  char *b = buf[next++ % 4];
  snprintf(b, sizeof buf[0], "%s", name ? name : "");
  ampc__one_line(b);
  return b;
}

int cli_not_stdout(const char *flag, const char *path) {
  if (!path || strcmp(path, "-") != 0) return 0;
  cli_error("%s: '-': this writes a file, not standard output; write ./- for a file named '-'", flag);
  return -1;
}

double cli_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int cli_is_tty(void) { return isatty(fileno(stderr)); }

/* An integer option that counts something, at most CLI_MAX_COUNT (every
 * integer option but the seed), as --help and the README say. */
static int is_count(const cli_opt *o) { return (o->kind == OPT_INT || o->kind == OPT_I64) && strcmp(o->name, "--seed") != 0; }

static void print_help(const char *cmd, const char *usage, const cli_opt *opts) {
  printf("usage: ampc %s %s\n\noptions:\n", cmd, usage);
  for (const cli_opt *o = opts; o->name; o++) {
    char left[64];
    snprintf(left, sizeof left, "%s%s%s", o->name, o->meta ? " " : "", o->meta ? o->meta : "");
    /* a count's range, where its text does not give it */
    if (is_count(o) && !strstr(o->help, "..")) {
      double max = cli_opt_max(o->name);
      char hi[32] = "10^9";
      if (max > 0) snprintf(hi, sizeof hi, "%.0f", max);
      printf("  %-28s %s [%.0f..%s]\n", left, o->help, o->min, hi);
    } else
      printf("  %-28s %s\n", left, o->help);
  }
  printf("  %-28s %s\n", "--help", "show this help");
}

static int parse_value(const cli_opt *o, const char *v) {
  char *end = NULL;
  errno = 0;
  switch (o->kind) {
    case OPT_INT:
    case OPT_I64: {
      long long x = strtoll(v, &end, 10);
      if (*v && !*end && errno == ERANGE) {
        cli_error("%s: %s is out of range", o->name, v);
        return -1;
      }
      if (!*v || *end || errno) {
        cli_error("%s: expected an integer, got '%s'", o->name, v);
        return -1;
      }
      if ((double)x < o->min) {
        cli_error("%s: must be at least %g, got %lld", o->name, o->min, x);
        return -1;
      }
      double max = cli_opt_max(o->name);
      if (max > 0 && (double)x > max) {
        cli_error("%s: must be at most %.0f, got %lld", o->name, max, x);
        return -1;
      }
      if (is_count(o) && x > CLI_MAX_COUNT) {
        cli_error("%s: %lld is too large (at most %lld)", o->name, x, CLI_MAX_COUNT);
        return -1;
      }
      if (o->kind == OPT_INT) {
        *(int *)o->dest = (int)x;
      } else {
        *(int64_t *)o->dest = x;
      }
      return 0;
    }
    case OPT_FLOAT: {
      double x = strtod(v, &end);
      int range = errno == ERANGE; /* past a double's range, or below it (then 0 or subnormal) */
      if (!*v || *end || (errno && !range)) {
        cli_error("%s: expected a number, got '%s'", o->name, v);
        return -1;
      }
      if (isnan(x) || (isinf(x) && !range)) { /* "inf", "nan" */
        cli_error("%s: must be a finite number, got '%s'", o->name, v);
        return -1;
      }
      if (fabs(x) > FLT_MAX) {
        cli_error("%s: %s is too large for a 32-bit float", o->name, v);
        return -1;
      }
      /* a value that is 0 as a 32-bit float (its subnormal ones are kept,
       * as PyTorch takes them) */
      if ((x == 0.0 && range) || (x != 0.0 && (float)x == 0.0f)) {
        cli_error("%s: %s is too small for a 32-bit float (the smallest is %g; it would be 0)", o->name, v, (double)FLT_TRUE_MIN);
        return -1;
      }
      if (x < o->min) {
        cli_error("%s: must be at least %g, got %g", o->name, o->min, x);
        return -1;
      }
      *(float *)o->dest = (float)x;
      return 0;
    }
    case OPT_ONOFF:
      if (strcmp(v, "on") == 0 || strcmp(v, "1") == 0 || strcmp(v, "true") == 0) *(int *)o->dest = 1;
      else if (strcmp(v, "off") == 0 || strcmp(v, "0") == 0 || strcmp(v, "false") == 0) *(int *)o->dest = 0;
      else {
        cli_error("%s: expected on or off, got '%s'", o->name, v);
        return -1;
      }
      return 0;
    case OPT_STRING:
      if (!*v) {
        cli_error("%s: empty value", o->name);
        return -1;
      }
      *(const char **)o->dest = v;
      return 0;
    case OPT_FLAG: return 0;
  }
  return -1;
}

int cli_parse(const char *cmd, const char *usage, const cli_opt *opts, int argc, char **argv) {
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      print_help(cmd, usage, opts);
      return 1;
    }
    if (strncmp(a, "--help=", 7) == 0) {
      cli_error("--help takes no value");
      return -1;
    }
    if (strncmp(a, "--", 2) != 0) {
      cli_error("%s: unexpected argument '%s' (see ampc %s --help)", cmd, a, cmd);
      return -1;
    }
    const char *eq = strchr(a, '=');
    size_t len = eq ? (size_t)(eq - a) : strlen(a);
    const cli_opt *o = NULL;
    for (const cli_opt *p = opts; p->name; p++)
      if (strlen(p->name) == len && strncmp(p->name, a, len) == 0) o = p;
    if (!o) {
      cli_error("%s: unknown option '%.*s' (see ampc %s --help)", cmd, (int)len, a, cmd);
      return -1;
    }
    if (o->seen) *o->seen = 1;
    if (o->kind == OPT_FLAG) {
      if (eq) {
        cli_error("%s takes no value", o->name);
        return -1;
      }
      *(int *)o->dest = 1;
      continue;
    }
    const char *v = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
    if (!v) {
      cli_error("%s: missing value", o->name);
      return -1;
    }
    if (!eq && strncmp(v, "--", 2) == 0 && v[2]) {
      /* "--save --quiet": the value forgotten, not a file named --quiet */
      cli_error("%s: missing value (the next argument '%s' is an option; write %s=VALUE for a value that starts with --)", o->name, v,
                o->name);
      return -1;
    }
    if (parse_value(o, v) < 0) return -1;
  }
  return 0;
}

void cli_common_defaults(cli_common *c) {
  memset(c, 0, sizeof *c);
  c->model = "cnn";
  c->dataset = "fashion-mnist";
  c->batch_size = 128;
  c->seed = 0;
  c->threads = 0;
  c->opt_level = "O0";
  c->half = "f16";
  c->grad_accum = 1;
  c->normalize = 1;
  c->conv = "auto";
  c->device = "cpu";
  c->allreduce_type = "auto";
  c->comm = "auto";
  c->cuda_graphs = 1;
  c->cudnn_deterministic = 1;
}

int cli_common_opts(cli_common *c, cli_opt *out, int groups) {
  int n = 0;
  out[n++] = (cli_opt){"--model", OPT_STRING, &c->model, "NAME", "mlp, cnn or resnet18 (default cnn)", 0, NULL};
  if (groups & CLI_OPTS_DATA) {
    out[n++] = (cli_opt){"--dataset", OPT_STRING, &c->dataset, "NAME", "fashion-mnist, mnist, cifar10 or cifar100 (default fashion-mnist)", 0, NULL};
    out[n++] = (cli_opt){"--data", OPT_STRING, &c->data_dir, "DIR", "dataset folder (default: the dataset's standard location)", 0, NULL};
  }
  if (groups & CLI_OPTS_BATCH)
    out[n++] = (cli_opt){"--batch-size", OPT_I64, &c->batch_size, "N", "images per batch, 1.." CLI_STR(CLI_MAX_BATCH) " and the model must fit in memory (default 128)", 1, NULL};
  if (groups & CLI_OPTS_TRAIN_DATA)
    out[n++] = (cli_opt){"--train-limit", OPT_I64, &c->train_limit, "N", "use only the first N training images", 1, NULL};
  if (groups & CLI_OPTS_DATA)
    out[n++] = (cli_opt){"--test-limit", OPT_I64, &c->test_limit, "N", "use only the first N test images", 1, NULL};
  if (groups & CLI_OPTS_SEED)
    out[n++] = (cli_opt){"--seed", OPT_I64, &c->seed, "N", "seed of every random choice (default 0)", 0, NULL};
  out[n++] = (cli_opt){"--threads", OPT_INT, &c->threads, "N", "threads, 1.." CLI_STR(CLI_THREADS_PER_CPU) "x the online CPUs, at most " CLI_STR(CLI_MAX_THREADS) " (default: all cores, within a control group's CPU quota)", 1, NULL};
  out[n++] = (cli_opt){"--conv", OPT_STRING, &c->conv, "auto|im2col|winograd|direct",
                       "convolution algorithm: im2col products, Winograd or a direct loop (default auto: for stride-1 3x3, Winograd from 8 input and output channels, direct up to 4 input channels)", 0, NULL};
  out[n++] = (cli_opt){"--device", OPT_STRING, &c->device, "NAME", "where the model runs: cpu (default), cpu-guarded (tests), cuda (where built)", 0, NULL};
  out[n++] = (cli_opt){"--tf32", OPT_ONOFF, &c->tf32, "on|off", "cuda: f32 products and convolutions on TF32 tensor cores (default off: true f32)", 0, &c->tf32_given};
  out[n++] = (cli_opt){"--cuda-graphs", OPT_ONOFF, &c->cuda_graphs, "on|off", "cuda: replay each step's kernels as one CUDA graph (default on)", 0, &c->cuda_graphs_given};
  out[n++] = (cli_opt){"--cudnn-deterministic", OPT_ONOFF, &c->cudnn_deterministic, "on|off",
                       "cuda: deterministic cuDNN convolution algorithms where one fits, the same bits every run (default on; off: the fastest)", 0, &c->cudnn_det_given};
  if (groups & CLI_OPTS_SEED)
    out[n++] = (cli_opt){"--label-smoothing", OPT_FLOAT, &c->label_smoothing, "X", "cross-entropy label smoothing, 0..1 (default 0)", 0, NULL};
  if (groups & CLI_OPTS_DATA)
    out[n++] = (cli_opt){"--normalize", OPT_ONOFF, &c->normalize, "on|off", "per-channel mean/std normalisation of the images (default on)", 0, NULL};
  if (groups & CLI_OPTS_PRECISION) {
    out[n++] = (cli_opt){"--opt-level", OPT_STRING, &c->opt_level, "O0|O1|O2|O3", "apex opt level (default O0)", 0, NULL};
    out[n++] = (cli_opt){"--half", OPT_STRING, &c->half, "f16|bf16", "the 16-bit type (default f16)", 0, NULL};
  }
  if (groups & CLI_OPTS_STEP)
    out[n++] = (cli_opt){"--loss-scale", OPT_STRING, &c->loss_scale, "dynamic|N", "loss scale (default: dynamic at O1 and O2 with f16; 1 at O0, O3 and with bf16)", 0, NULL};
  if (groups & CLI_OPTS_PRECISION)
    out[n++] = (cli_opt){"--keep-batchnorm-fp32", OPT_STRING, &c->keep_bn_fp32, "on|off", "batch norm parameters in fp32", 0, &c->keep_bn_fp32_given};
  if (!(groups & CLI_OPTS_STEP)) return n;
  out[n++] = (cli_opt){"--master-weights", OPT_STRING, &c->master_weights, "on|off", "fp32 master weights", 0, &c->master_weights_given};
  out[n++] = (cli_opt){"--min-loss-scale", OPT_STRING, &c->min_loss_scale, "X", "floor of the dynamic scale", 0, NULL};
  out[n++] = (cli_opt){"--max-loss-scale", OPT_STRING, &c->max_loss_scale, "X", "ceiling of the dynamic scale (default 2^24)", 0, NULL};
  out[n++] = (cli_opt){"--scale-window", OPT_STRING, &c->scale_window, "N", "clean steps before the scale grows, 1..10^9 (default 2000)", 0, NULL};
  out[n++] = (cli_opt){"--hysteresis", OPT_STRING, &c->hysteresis, "N", "the scale backs off at the N-th overflow since it last grew, 1..10^9 (default 1: at every one)", 0, NULL};
  out[n++] = (cli_opt){"--stochastic-rounding", OPT_FLAG, &c->stochastic_rounding, NULL, "round half weight updates stochastically (no masters)", 0, NULL};
  out[n++] = (cli_opt){"--clip-grad-norm", OPT_FLOAT, &c->clip_grad_norm, "X", "clip the global gradient norm to X > 0", -INFINITY, &c->clip_given}; /* X <= 0: cli_common_check */
  if (groups & CLI_OPTS_EPOCH) {
    out[n++] = (cli_opt){"--grad-accum", OPT_INT, &c->grad_accum, "N", "micro-batches per optimizer step, 1..the batches of an epoch (default 1)", 1, NULL};
    out[n++] = (cli_opt){"--amp-report", OPT_FLAG, &c->amp_report, NULL, "gradient underflow statistics, in the epoch lines and the metrics", 0, NULL};
  }
  if (!(groups & CLI_OPTS_DIST)) return n;
  out[n++] = (cli_opt){"--allreduce-type", OPT_STRING, &c->allreduce_type, "auto|f32",
                       "data-parallel (mpirun): all-reduce 16-bit gradients in their own type (auto, the default) or as f32 sums", 0, NULL};
  out[n++] = (cli_opt){"--zero", OPT_INT, &c->zero, "0|1", "data-parallel: ZeRO stage 1 shards the f32 masters and optimizer state across the ranks (default 0)", 0, NULL};
  out[n++] = (cli_opt){"--sync-bn", OPT_FLAG, &c->sync_bn, NULL, "data-parallel: batch norm statistics over the global batch (SyncBatchNorm; default: each rank's own)", 0, NULL};
  out[n++] = (cli_opt){"--bucket-mb", OPT_FLOAT, &c->bucket_mb, "X", "data-parallel: gradient buckets of about X MB, 0.01..4096 (default 25)", 0.01, NULL};
  out[n++] = (cli_opt){"--comm", OPT_STRING, &c->comm, "auto|mpi|nccl",
                       "data-parallel: the gradients' collectives over NCCL (each rank on GPU = its local rank) or MPI; auto (the default): "
                       "NCCL for --device cuda where ampc has it", 0, NULL};
  return n;
}

/* The amp properties and the flags that set them: an error about a
 * property names the flag. dynamic: it sets the dynamic loss scale only. */
static const struct {
  const char *flag, *prop;
  int dynamic;
} amp_flags[] = {
    {"--loss-scale", "loss_scale", 0},         {"--keep-batchnorm-fp32", "keep_batchnorm_fp32", 0},
    {"--master-weights", "master_weights", 0}, {"--min-loss-scale", "min_loss_scale", 1},
    {"--max-loss-scale", "max_loss_scale", 1}, {"--scale-window", "scale_window", 1},
    {"--hysteresis", "hysteresis", 1},
};

int cli_amp_config(const cli_common *c, ampc_amp_config *cfg) {
  ampc_opt_level lvl;
  ampc_dtype half;
  if (ampc_opt_level_parse(c->opt_level, &lvl) < 0) {
    cli_lib_error("--opt-level");
    return -1;
  }
  if (ampc_dtype_parse(c->half, &half) < 0 || (half != AMPC_DTYPE_F16 && half != AMPC_DTYPE_BF16)) {
    cli_error("--half: expected f16 or bf16, got '%s'", c->half);
    return -1;
  }
  if (ampc_amp_config_init(cfg, lvl, half) < 0) {
    cli_lib_error(NULL);
    return -1;
  }
  const char *values[] = {c->loss_scale, c->keep_bn_fp32, c->master_weights, c->min_loss_scale, c->max_loss_scale,
                          c->scale_window, c->hysteresis};
  for (size_t i = 0; i < sizeof amp_flags / sizeof amp_flags[0]; i++)
    if (values[i] && ampc_amp_config_set(cfg, amp_flags[i].prop, values[i]) < 0) {
      cli_lib_error(amp_flags[i].flag);
      return -1;
    }
  /* O0's model is f32 already: masters or f32 batch norm would change nothing
   * (O1 refuses them in the library, as apex does) */
  if (lvl == AMPC_OPT_O0 && (c->keep_bn_fp32 || c->master_weights)) {
    cli_error("%s: does nothing at O0, whose model is f32 throughout; drop it or choose --opt-level O2 or O3",
              c->master_weights ? "--master-weights" : "--keep-batchnorm-fp32");
    return -1;
  }
  if (lvl == AMPC_OPT_O0 && half != AMPC_DTYPE_F16) {
    cli_error("--half %s: does nothing at O0, whose model is f32 throughout; drop it or choose --opt-level O1, O2 or O3", c->half);
    return -1;
  }
  /* the dynamic scale's settings with a static scale would do nothing */
  for (size_t i = 0; !cfg->loss_scale_dynamic && i < sizeof amp_flags / sizeof amp_flags[0]; i++)
    if (values[i] && amp_flags[i].dynamic) {
      cli_error("%s: sets the dynamic loss scale, but this run's scale is static (%s); drop it or use --loss-scale dynamic",
                amp_flags[i].flag,
                c->loss_scale ? "--loss-scale N"
                : half == AMPC_DTYPE_BF16 ? "bf16's default: no scaling at any opt level"
                                          : "the opt level's");
      return -1;
    }
  if (ampc_amp_config_validate(cfg) < 0) {
    /* name the flag the refusal is about: the first given one it mentions */
    const char *flag = "--opt-level";
    for (size_t i = 0; i < sizeof amp_flags / sizeof amp_flags[0]; i++)
      if (values[i] && strstr(ampc_last_error(), amp_flags[i].prop)) {
        flag = amp_flags[i].flag;
        break;
      }
    cli_lib_error(flag);
    return -1;
  }
  return 0;
}

int cli_common_check(const cli_common *c, ampc_amp_config *cfg) {
  if (cli_amp_config(c, cfg) < 0) return -1;
  if ((c->tf32_given || c->cuda_graphs_given || c->cudnn_det_given) && strcmp(c->device, "cuda") != 0) {
    cli_error("%s: applies to --device cuda only; this run is on %s",
              c->tf32_given ? "--tf32" : c->cuda_graphs_given ? "--cuda-graphs" : "--cudnn-deterministic", c->device);
    return -1;
  }
  if (c->clip_given && !(c->clip_grad_norm > 0.0f)) {
    /* (PyTorch's clip_grad_norm_ with 0 zeroes every gradient) */
    cli_error("--clip-grad-norm: must be more than 0, got %g (leave it out not to clip)", (double)c->clip_grad_norm);
    return -1;
  }
  if (!ampc_model_known(c->model)) {
    cli_error("--model: unknown model '%s' (expected one of: %s)", c->model, ampc_model_names());
    return -1;
  }
  ampc_dataset_kind kind;
  if (ampc_dataset_kind_parse(c->dataset, &kind) < 0) {
    cli_lib_error("--dataset");
    return -1;
  }
  if (strcmp(c->conv, "auto") != 0 && strcmp(c->conv, "im2col") != 0 && strcmp(c->conv, "winograd") != 0 &&
      strcmp(c->conv, "direct") != 0) {
    cli_error("--conv: unknown algorithm '%s' (expected auto, im2col, winograd or direct)", c->conv);
    return -1;
  }
  ampc_status dev = ampc_backend_check(c->device);
  if (dev < 0) {
    /* an unknown name is a usage error; a device this machine or build
     * lacks (cuda without a GPU) is the run's failure */
    cli_lib_error("--device");
    return dev == AMPC_EINVAL ? -1 : -2;
  }
  if (!(c->label_smoothing >= 0.0f && c->label_smoothing <= 1.0f)) {
    cli_error("--label-smoothing: %g is outside [0, 1]", c->label_smoothing);
    return -1;
  }
  if (strcmp(c->allreduce_type, "auto") != 0 && strcmp(c->allreduce_type, "f32") != 0) {
    cli_error("--allreduce-type: expected auto or f32, got '%s'", c->allreduce_type);
    return -1;
  }
  if (c->bucket_mb > 4096.0f) {
    cli_error("--bucket-mb: %g is more than 4096", c->bucket_mb);
    return -1;
  }
  if (strcmp(c->comm, "auto") != 0 && strcmp(c->comm, "mpi") != 0 && strcmp(c->comm, "nccl") != 0) {
    cli_error("--comm: expected auto, mpi or nccl, got '%s'", c->comm);
    return -1;
  }
  if (strcmp(c->comm, "nccl") == 0 && strcmp(c->device, "cuda") != 0) {
    cli_error("--comm nccl: NCCL serves --device cuda only, not %s", c->device);
    return -1;
  }
#ifndef AMPC_HAVE_COMM_NCCL
  if (strcmp(c->comm, "nccl") == 0) {
    cli_error("--comm nccl: this ampc was built without NCCL (it needs the CUDA backend, MPI and NCCL)");
    return -1;
  }
#endif
  /* options that would do nothing in this run: refused, not ignored */
  const char *dp = c->zero                                 ? "--zero"
                   : c->sync_bn                            ? "--sync-bn"
                   : strcmp(c->allreduce_type, "auto") != 0 ? "--allreduce-type"
                   : c->bucket_mb > 0                      ? "--bucket-mb"
                   : strcmp(c->comm, "auto") != 0           ? "--comm"
                                                           : NULL;
  if (dp && cli_dist_size() < 2) {
    cli_error("%s: applies to data-parallel training (mpirun -np N, N >= 2); this run is one process", dp);
    return -1;
  }
  if (strcmp(c->allreduce_type, "f32") == 0 && cfg->cast_model_type == AMPC_DTYPE_F32) {
    cli_error("--allreduce-type f32: this run's gradients are f32 already (an f32 model, %s); it applies to O2 and O3", c->opt_level);
    return -1;
  }
  if (c->stochastic_rounding && (cfg->cast_model_type == AMPC_DTYPE_F32 || cfg->master_weights != 0)) {
    cli_error("--stochastic-rounding: rounds the updates of 16-bit weights kept without f32 masters (O3, or O2 with --master-weights off); "
              "at %s%s it would do nothing", c->opt_level, cfg->master_weights == 1 ? " with master weights" : "");
    return -1;
  }
  /* (the mlp: linear layers only) */
  if (strcmp(c->conv, "auto") != 0 && strcmp(c->model, "mlp") == 0) {
    cli_error("--conv: model mlp has no convolutions");
    return -1;
  }
  return 0;
}

int cli_comm_nccl(const cli_common *c) {
#ifdef AMPC_HAVE_COMM_NCCL
  return c->comm && strcmp(c->comm, "mpi") != 0 && strcmp(c->device, "cuda") == 0;
#else
  (void)c;
  return 0;
#endif
}

int cli_max_threads(void) {
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  if (cpus < 1) cpus = 1;
  return cpus > CLI_MAX_THREADS / CLI_THREADS_PER_CPU ? CLI_MAX_THREADS : (int)cpus * CLI_THREADS_PER_CPU;
}

double cli_opt_max(const char *name) {
  /* the counts that size buffers; their help texts give these ranges */
  if (strcmp(name, "--threads") == 0) return cli_max_threads();
  if (strcmp(name, "--batch-size") == 0) return CLI_MAX_BATCH;
  if (strcmp(name, "--classes") == 0) return CLI_MAX_CLASSES;
  if (strcmp(name, "--sgemm-size") == 0) return 16384;
  if (strcmp(name, "--zero") == 0) return 1;
  return 0;
}

FILE *cli_open_output(const char *flag, const char *path, cli_out_mode mode) {
  /* O_NONBLOCK: opening a FIFO that has no reader fails with ENXIO instead
   * of waiting; the flag is dropped again for the writes themselves */
  int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC | O_NONBLOCK | (mode == CLI_OUT_APPEND ? O_APPEND : mode == CLI_OUT_TRUNCATE ? O_TRUNC : 0), 0666);
  if (fd < 0) {
    int e = errno;
    cli_error("%s: cannot open '%s' for writing: %s", flag, path, e == ENXIO ? "a FIFO with no reader" : strerror(e));
    return NULL;
  }
  int fl = fcntl(fd, F_GETFL);
  FILE *f = fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0 ? NULL : fdopen(fd, mode == CLI_OUT_APPEND ? "a" : "w");
  if (!f) {
    cli_error("%s: cannot open '%s' for writing: %s", flag, path, strerror(errno));
    close(fd);
  }
  return f;
}

FILE *cli_open_read(const char *flag, const char *path) {
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  struct stat st;
  const char *why = NULL;
  int e = 0;
  if (fd < 0) e = errno;
  else if (fstat(fd, &st) != 0) e = errno;
  else if (!S_ISREG(st.st_mode)) why = S_ISDIR(st.st_mode) ? "a folder, not a file" : "not a regular file";
  if (!e && !why) {
    int fl = fcntl(fd, F_GETFL);
    FILE *f = fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0 ? NULL : fdopen(fd, "r");
    if (f) return f;
    e = errno;
  }
  if (fd >= 0) close(fd);
  if (flag) cli_error("%s: cannot open '%s': %s", flag, path, why ? why : strerror(e));
  else cli_error("%s: cannot open: %s", path, why ? why : strerror(e));
  return NULL;
}

int cli_cpu_quota(void) {
  static int quota = -1;
  if (quota < 0) quota = ampc__cgroup_cpus();
  return quota;
}

int cli_same_file(const char *a, const char *b) {
  struct stat sa, sb;
  if (!a || !b || stat(a, &sa) != 0 || stat(b, &sb) != 0) return 0;
  return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

/* path with its folder resolved (links, "..") and its last name as given;
 * 0 where the folder does not resolve */
static int resolved_path(const char *path, char *out, size_t cap) {
  char dir[4096], real[PATH_MAX];
  const char *slash = strrchr(path, '/'), *base = slash ? slash + 1 : path;
  int n = slash ? snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path) : snprintf(dir, sizeof dir, ".");
  if (n < 0 || (size_t)n >= sizeof dir) return 0;
  if (!dir[0]) snprintf(dir, sizeof dir, "/");
  if (!realpath(dir, real)) return 0;
  n = snprintf(out, cap, "%s/%s", real, base);
  return n > 0 && (size_t)n < cap;
}

int cli_same_path(const char *a, const char *b) {
  if (!a || !b) return 0;
  if (cli_same_file(a, b)) return 1;
  struct stat st;
  if (stat(a, &st) == 0 && stat(b, &st) == 0) return 0; /* two files that exist: not the same one */
  char ra[4096 + 8], rb[4096 + 8];
  return resolved_path(a, ra, sizeof ra) && resolved_path(b, rb, sizeof rb) && strcmp(ra, rb) == 0;
}

int cli_check_output_folder(const char *flag, const char *path) {
  /* the writer's own first step, now: what it would meet -- no such folder,
   * a read-only or virtual file system, a name too long -- is met before
   * the run, not after it */
  if (ampc__probe_write(path) < 0) {
    cli_error("%s: %s", flag, ampc_last_error());
    return -1;
  }
  return 0;
}

int cli_set_threads(int threads) {
  if (threads <= 0) return 0;
  /* OpenBLAS takes a buffer for each thread of its own more than it had,
   * and hangs where the process's memory limits leave no room for one */
  char what[64];
  snprintf(what, sizeof what, "--threads %d", threads);
  if (ampc__blas_room(threads - openblas_get_num_threads(), what) < 0) {
    cli_lib_error("--threads");
    return -1;
  }
  omp_set_num_threads(threads);
  openblas_set_num_threads(threads);
  return 0;
}

json_t *cli_memory_json(const ampc_mem_report *r) {
  json_t *o = json_object();
  size_t total = 0;
  for (int c = 0; c < AMPC_MEM_COUNT; c++) {
    json_t *cat = json_object();
    for (int t = 0; t < AMPC_DTYPE_COUNT; t++)
      if (r->bytes[c][t]) json_object_set_new(cat, ampc_dtype_name((ampc_dtype)t), json_integer((json_int_t)r->bytes[c][t]));
    json_object_set_new(cat, "total", json_integer((json_int_t)ampc_mem_total(r, (ampc_mem_category)c)));
    total += ampc_mem_total(r, (ampc_mem_category)c);
    json_object_set_new(o, ampc_mem_category_name((ampc_mem_category)c), cat);
  }
  json_object_set_new(o, "total", json_integer((json_int_t)total));
  return o;
}

void cli_print_memory(FILE *f, const ampc_mem_report *r) {
  size_t total = 0;
  fprintf(f, "memory:");
  for (int c = 0; c < AMPC_MEM_COUNT; c++) {
    size_t b = ampc_mem_total(r, (ampc_mem_category)c);
    total += b;
    fprintf(f, " %s %.1f MB", ampc_mem_category_name((ampc_mem_category)c), (double)b / 1e6);
    int first = 1;
    for (int t = 0; t < AMPC_DTYPE_COUNT; t++)
      if (r->bytes[c][t] && b) {
        fprintf(f, "%s%s %.0f%%", first ? " (" : ", ", ampc_dtype_name((ampc_dtype)t), 100.0 * (double)r->bytes[c][t] / (double)b);
        first = 0;
      }
    if (!first) fprintf(f, ")");
    fprintf(f, c + 1 < AMPC_MEM_COUNT ? "," : "");
  }
  fprintf(f, "; total %.1f MB\n", (double)total / 1e6);
}
