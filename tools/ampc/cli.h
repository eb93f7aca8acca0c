/* The ampc command line: shared option parsing, errors and output helpers. */
#ifndef AMPC_CLI_H
#define AMPC_CLI_H

#include <stdint.h>
#include <stdio.h>

#include "ampc/amp.h"
#include "ampc/data.h"
#include "ampc/nn.h"
#include "ampc/optim.h"

typedef enum { OPT_FLAG, OPT_INT, OPT_I64, OPT_FLOAT, OPT_STRING, OPT_ONOFF } cli_opt_kind;

typedef struct {
  const char *name;     /* "--epochs" */
  cli_opt_kind kind;
  void *dest;
  const char *meta;     /* "N" */
  const char *help;
  double min;           /* numbers: smallest allowed value */
  int *seen;            /* set to 1 when given (optional) */
} cli_opt;

/* Parses argv[first..]; prints help and returns 1 for --help; returns -1 with
 * an error printed for anything wrong; 0 otherwise. */
int cli_parse(const char *cmd, const char *usage, const cli_opt *opts, int argc, char **argv);
void cli_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Prints "ampc: error: <ampc_last_error()>" with an optional context prefix. */
void cli_lib_error(const char *context);
/* A file name as an informational line shows it: each control character '?',
 * as in error lines, so that no name breaks the line or drives the terminal.
 * The result stays valid for the next three calls (one line's names). */
const char *cli_shown(const char *name);
/* An output file option given "-": these write files, not standard output
 * (report's -o alone takes "-" for it). Prints the error and returns -1;
 * 0 for any other name (./- names a file called "-"). */
int cli_not_stdout(const char *flag, const char *path);
double cli_now(void);
int cli_is_tty(void);

/* Options shared by train, eval, grad and bench: the model, the data, amp. */
typedef struct {
  const char *model, *dataset, *data_dir;
  int64_t batch_size;
  int64_t train_limit, test_limit;
  uint64_t seed;
  int threads;
  float label_smoothing;
  int normalize;
  const char *conv;     /* convolution algorithm: auto, im2col, winograd */
  const char *device;   /* backend: cpu, cpu-guarded, cuda */
  int tf32;             /* cuda: f32 products on TF32 tensor cores */
  int cuda_graphs;      /* cuda: replay a step's kernels as a CUDA graph */
  int cudnn_deterministic; /* cuda: deterministic convolution algorithms only, where one fits */
  int tf32_given, cuda_graphs_given, cudnn_det_given; /* whether the three above were given */
  /* amp */
  const char *opt_level, *half, *loss_scale;
  int keep_bn_fp32_given, master_weights_given;
  const char *keep_bn_fp32, *master_weights;
  const char *min_loss_scale, *max_loss_scale, *scale_window, *hysteresis;
  int stochastic_rounding;
  float clip_grad_norm;
  int clip_given;
  int grad_accum;
  int amp_report;
  /* data-parallel, under mpirun */
  const char *allreduce_type; /* "auto" (the gradients' own type) or "f32" */
  int zero;                   /* ZeRO stage: 0 or 1 */
  int sync_bn;                /* SyncBatchNorm */
  float bucket_mb;            /* gradient bucket size (0: the default, 25) */
  const char *comm;           /* the gradients' collectives: "auto", "mpi" or "nccl" */
} cli_common;

/* 1 if the amp's collectives go over NCCL (--comm, --device): a cuda device
 * and an ampc built with NCCL, unless --comm mpi. */
int cli_comm_nccl(const cli_common *c);

void cli_common_defaults(cli_common *c);
/* The groups of shared options a command takes (--model, --threads, --conv
 * and --device always): each command lists and accepts only its own. */
enum {
  CLI_OPTS_DATA = 1,       /* --dataset, --data, --test-limit, --normalize */
  CLI_OPTS_TRAIN_DATA = 2, /* --train-limit */
  CLI_OPTS_BATCH = 4,      /* --batch-size */
  CLI_OPTS_SEED = 8,       /* --seed, --label-smoothing */
  CLI_OPTS_PRECISION = 16, /* --opt-level, --half, --keep-batchnorm-fp32 */
  CLI_OPTS_STEP = 32,      /* loss scaling, master weights, clipping, accumulation, stochastic rounding, --amp-report */
  CLI_OPTS_DIST = 64,      /* data-parallel: --allreduce-type, --zero, --sync-bn, --bucket-mb */
  CLI_OPTS_EPOCH = 128,    /* with STEP: --grad-accum, --amp-report (what bench's timed steps leave out) */
  CLI_OPTS_ALL = 255
};
/* Appends the shared options of the groups to a table; returns the count added. */
int cli_common_opts(cli_common *c, cli_opt *out, int groups);
/* Every shared option's value, before anything is read: the model and
 * dataset names, the convolution algorithm, the device, the label
 * smoothing, the amp configuration (into cfg). Prints the error, naming the
 * flag, and returns -1: a usage error, exit status 2; or -2 where the device
 * named exists but not here (cuda without a GPU or not built): exit status 1. */
int cli_common_check(const cli_common *c, ampc_amp_config *cfg);
/* Builds the amp configuration from the options (the part of
 * cli_common_check that fuzzing and the session use). */
int cli_amp_config(const cli_common *c, ampc_amp_config *cfg);
/* Sets the thread count for ampc and OpenBLAS; -1 with the error printed
 * where the process's memory limits leave no room for OpenBLAS's buffers. */
int cli_set_threads(int threads);

/* Ranges of the counts given on the command line, checked at parse time and
 * listed in --help: --threads at most CLI_THREADS_PER_CPU times the online
 * CPUs and never above CLI_MAX_THREADS; --batch-size at most CLI_MAX_BATCH;
 * --classes at most CLI_MAX_CLASSES; every other count (integer options
 * but --seed) at most CLI_MAX_COUNT. Whether the model then fits in memory
 * is checked when it is built, before its buffers are allocated. */
#define CLI_STR_(x) #x
#define CLI_STR(x) CLI_STR_(x)
#define CLI_THREADS_PER_CPU 4
#define CLI_MAX_THREADS 1024
#define CLI_MAX_BATCH 65536
#define CLI_MAX_CLASSES 100000
#define CLI_MAX_COUNT 1000000000LL
int cli_max_threads(void);
/* The largest value an integer option takes (the table in cli.c, by option
 * name; 0 when it has none beyond CLI_MAX_COUNT). */
double cli_opt_max(const char *name);

/* Opens path for writing without ever blocking: a FIFO with no reader is
 * refused at once instead of waiting for one. CLI_OUT_KEEP leaves the old
 * contents for the caller to empty (ftruncate) once it is sure to write.
 * Prints the error (prefixed with flag) and returns NULL on failure. */
typedef enum { CLI_OUT_TRUNCATE, CLI_OUT_APPEND, CLI_OUT_KEEP } cli_out_mode;
FILE *cli_open_output(const char *flag, const char *path, cli_out_mode mode);
/* Opens a regular file for reading without blocking on a FIFO or a device
 * (which are refused); prints the error, naming flag (or the path alone when
 * flag is NULL), and returns NULL on failure. */
FILE *cli_open_read(const char *flag, const char *path);
/* Whether the paths a and b name one existing file (the same device and
 * inode; a path that does not exist names none). */
int cli_same_file(const char *a, const char *b);
/* The CPUs a CPU quota on the process's control group allows (0: none),
 * read once for the process. */
int cli_cpu_quota(void);
/* cli_same_file, or, where a path names no file yet, the same folder and name
 * (the folder resolved: links, ".."). */
int cli_same_path(const char *a, const char *b);
/* Whether an output file can be created at path: creates and removes a file
 * in its folder as the atomic writer would; -1 with a message naming flag. */
int cli_check_output_folder(const char *flag, const char *path);

/* Memory report as one JSON object {"parameters": {...bytes by dtype...}, ...} */
struct json_t;
struct json_t *cli_memory_json(const ampc_mem_report *r);
void cli_print_memory(FILE *f, const ampc_mem_report *r);

int cmd_train(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_grad(int argc, char **argv);
int cmd_summary(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_report(int argc, char **argv);
int cmd_export(int argc, char **argv);

#endif
