/* ampc train: the training loop, progress and per-epoch metrics. */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ampc/checkpoint.h"
#include "ckptdir.h"
#include "dist.h"
#include "progress.h"
#include "session.h"
#include "train_args.h"

static volatile sig_atomic_t stop_requested;
static void on_signal(int sig) { stop_requested = sig; }

#define CKPT_PREFIX "ckpt-step-"
#define CKPT_SUFFIX ".safetensors"

/* Errors every rank meets alike (a decision they took together): rank 0
 * says it, once. */
#define AGREED_ERROR(...)                      \
  do {                                         \
    cli_dist_error_mode(CLI_ERRORS_ROOT);      \
    cli_error(__VA_ARGS__);                    \
    cli_dist_error_mode(CLI_ERRORS_ALL);       \
  } while (0)

static int save_checkpoint(cli_session *s, const char *dir, int keep, const ampc_train_state *ts, int quiet, char *saved) {
  if (cli_mkdirs(dir) != 0) {
    cli_error("--checkpoint-dir: cannot create '%s': %s", dir, strerror(errno));
    return -1;
  }
  char path[4096];
  cli_checkpoint_path(path, sizeof path, dir, (long long)ts->step);
  if (ampc_checkpoint_save(path, s->model, s->amp, s->opt, ts) < 0) {
    cli_lib_error("saving checkpoint");
    return -1;
  }
  if (!quiet) fprintf(stderr, "ampc: saved %s\n", cli_shown(path));
  snprintf(saved, 4096, "%s", path);
  if (keep > 0) cli_prune_checkpoints(dir, keep);
  return 0;
}

static void add_grad_stats(ampc_amp_grad_stats *st, const ampc_amp_grad_stats *more) {
  st->values += more->values;
  st->underflow += more->underflow;
  if (more->max_abs > st->max_abs) st->max_abs = more->max_abs;
}

/* The run state at the start of epoch (0-based), before its first batch:
 * its running sums empty. */
static void epoch_start_state(ampc_train_state *ts, int64_t epoch) {
  ts->epoch = epoch;
  ts->batch = 0;
  ts->loss_sum = 0.0;
  ts->seen = ts->skipped = 0;
  ts->train_seconds = 0.0;
  ts->has_grad_stats = 0;
}

/* What every rank must hold alike to train as one (beyond the sizes): the
 * training and test sets' images and labels, and the model's parameters and
 * buffers as made from --seed or loaded from --resume, as hashes. -1 where
 * the memory to read the model with is not there. */
static int rank_contents(cli_session *s, uint64_t h[3]) {
  const ampc_dataset *sets[2] = {s->train, s->test};
  for (int k = 0; k < 2; k++) {
    const ampc_dataset *d = sets[k];
    size_t n = ampc_dataset_count(d), px = (size_t)ampc_dataset_channels(d) * (size_t)ampc_dataset_height(d) * (size_t)ampc_dataset_width(d);
    h[k] = cli_hash_bytes(CLI_HASH_START, ampc_dataset_images(d), n * px);
    h[k] = cli_hash_bytes(h[k], ampc_dataset_labels(d), n * sizeof(int32_t));
  }
  ampc_graph *g = s->g;
  size_t np = ampc_graph_param_count(g), nb = ampc_graph_buffer_count(g), most = 1;
  for (size_t i = 0; i < np + nb; i++) {
    ampc_tensor t = ampc_graph_tensor(g, i < np ? ampc_graph_param_at(g, i) : ampc_graph_buffer_at(g, i - np));
    if ((size_t)ampc_tensor_numel(&t) > most) most = (size_t)ampc_tensor_numel(&t);
  }
  unsigned char *buf = malloc(most * 8);
  if (!buf) return -1;
  h[2] = CLI_HASH_START;
  for (size_t i = 0; i < np + nb; i++) {
    ampc_value v = i < np ? ampc_graph_param_at(g, i) : ampc_graph_buffer_at(g, i - np);
    ampc_tensor t = ampc_graph_tensor(g, v);
    /* (in the tensor's own type, its bits) */
    if (ampc_graph_read(g, v, buf, t.dtype) < 0) {
      free(buf);
      return -1;
    }
    h[2] = cli_hash_bytes(h[2], buf, (size_t)ampc_tensor_numel(&t) * ampc_dtype_size(t.dtype));
  }
  free(buf);
  return 0;
}

/* Data-parallel: a rank's gradient statistics made those of every rank's
 * gradients (before their all-reduce): the counts summed, the largest
 * magnitude the largest; every rank calls it at the same point. 0, or -1
 * where the collective failed. */
static int reduce_grad_stats(ampc_amp_grad_stats *st) {
  ampc_comm *comm = cli_dist_comm();
  if (cli_dist_size() < 2 || !comm) return 0;
  double sums[2] = {(double)st->values, (double)st->underflow}, most = st->max_abs;
  if (ampc_comm_allreduce_host(comm, sums, 2, AMPC_COMM_SUM) < 0 || ampc_comm_allreduce_host(comm, &most, 1, AMPC_COMM_MAX) < 0)
    return -1;
  st->values = (int64_t)sums[0];
  st->underflow = (int64_t)sums[1];
  st->max_abs = (float)most;
  return 0;
}

/* What a checkpoint saves beside the counters the loop keeps in ts: the
 * steps since the last step record (rec_loss, rec_steps), and with
 * --amp-report (report) the epoch's gradient statistics so far with kept
 * (those of its steps before a resume), so that the epoch resumed from it
 * reports them whole; whole: they cover the epoch from its first step (else
 * none are saved). */
static int state_to_save(cli_session *s, ampc_train_state *ts, double rec_loss, int64_t rec_steps, int report,
                         const ampc_amp_grad_stats *kept, int whole) {
  ts->log_loss_sum = rec_loss;
  ts->log_steps = rec_steps;
  ts->has_grad_stats = 0;
  if (!report || !whole) return 0;
  ampc_amp_grad_stats now;
  ampc_amp_get_grad_stats(s->amp, &now, 0);
  if (reduce_grad_stats(&now) < 0) return -1; /* (every rank saves through here) */
  add_grad_stats(&now, kept);
  ts->has_grad_stats = 1;
  ts->grad_values = now.values;
  ts->grad_underflow = now.underflow;
  ts->grad_max_abs = now.max_abs;
  return 0;
}

/* A resumed run's metrics file, cut where its checkpoint is: at the first
 * record past it (a step record after its step, an epoch record after its
 * completed epochs: what a killed run wrote after its last checkpoint,
 * which this run writes again, bit for bit) or at a last line cut short (a
 * write the kill interrupted), so that no step or epoch has two records and
 * every line is whole. Lines that are no record of a step or an epoch are
 * kept, and so is a whole record that only lacks its newline (which is
 * added). mf: the file as opened for appending (nothing written yet). */
enum { METRICS_LINE_MAX = 1 << 20 }; /* a record is a few KB: a longer line is none */
typedef struct {
  long long dropped; /* lines cut off */
  int past;          /* the cut is at a record past the checkpoint (else at a last line cut short) */
} metrics_cut;
/* Whether a line is a record past the checkpoint (1), another whole JSON
 * object (0), or no JSON object (-1). */
static int metrics_past(const char *line, size_t n, const ampc_train_state *ts) {
  json_t *o = json_loadb(line, n, 0, NULL);
  if (!json_is_object(o)) {
    json_decref(o);
    return -1;
  }
  json_t *e = json_object_get(o, "epoch"), *st = json_object_get(o, "step");
  int past = json_is_integer(e) ? json_integer_value(e) > ts->epoch : json_is_integer(st) && json_integer_value(st) > ts->step;
  json_decref(o);
  return past;
}
/* Returns 0 (*cut filled; nothing cut: dropped 0), or -1 on an error (said). */
static int metrics_rewind(FILE *mf, const char *path, const ampc_train_state *ts, metrics_cut *cut_out) {
  struct stat ws, rs;
  cut_out->dropped = 0;
  cut_out->past = 0;
  if (fstat(fileno(mf), &ws) != 0 || !S_ISREG(ws.st_mode)) return 0; /* a pipe or a device: nothing to cut */
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) { /* (a file this run may write but not read) */
    fprintf(stderr, "ampc: --metrics: cannot read '%s' to cut it at the checkpoint (%s): appending to it as it is\n", cli_shown(path), strerror(errno));
    return 0;
  }
  FILE *in = NULL;
  if (fstat(fd, &rs) != 0 || rs.st_dev != ws.st_dev || rs.st_ino != ws.st_ino || !(in = fdopen(fd, "r"))) {
    close(fd);
    return 0; /* (replaced since it was opened: this run appends to what it opened) */
  }
  char *line = malloc(METRICS_LINE_MAX);
  if (!line) {
    fclose(in);
    cli_error("--metrics: out of memory reading '%s'", path);
    return -1;
  }
  off_t cut = -1;
  int add_newline = 0;
  for (;;) {
    off_t at = ftello(in); /* (not counted from the lines: one may hold a NUL byte) */
    if (at < 0 || !fgets(line, METRICS_LINE_MAX, in)) break;
    off_t end = ftello(in);
    size_t n = end > at ? (size_t)(end - at) : 0;
    int whole = n > 0 && line[n - 1] == '\n';
    if (!whole && !feof(in)) { /* a line longer than any record: the rest of it */
      int ch;
      while ((ch = getc(in)) != EOF && ch != '\n') {
      }
      if (ch != '\n') cut = at; /* (the last line, cut short) */
    } else if (!whole) { /* the last line, without its newline: a whole record before the checkpoint stays */
      int past = metrics_past(line, n, ts);
      if (past == 0) add_newline = 1;
      else cut = at, cut_out->past = past == 1;
    } else if (metrics_past(line, n, ts) == 1) {
      cut = at;
      cut_out->past = 1;
    }
    if (cut >= 0) break;
  }
  long long lines = 0;
  if (cut >= 0 && fseeko(in, cut, SEEK_SET) == 0) { /* the lines from the cut on, a last one without its newline too */
    size_t got;
    char last = '\n';
    while ((got = fread(line, 1, METRICS_LINE_MAX, in)) > 0) {
      for (const char *q = line; (q = memchr(q, '\n', got - (size_t)(q - line))) != NULL; q++) lines++;
      last = line[got - 1];
    }
    lines += last != '\n';
  }
  int rerr = ferror(in);
  free(line);
  fclose(in);
  if (rerr) {
    cli_error("--metrics: cannot read '%s' (a read error)", path);
    return -1;
  }
  if (cut >= 0 && ftruncate(fileno(mf), cut) != 0) {
    cli_error("--metrics: cannot cut '%s' at the checkpoint: %s", path, strerror(errno));
    return -1;
  }
  if (add_newline && (fputc('\n', mf) == EOF || fflush(mf) != 0)) {
    cli_error("--metrics: cannot write to '%s': %s", path, strerror(errno));
    return -1;
  }
  cut_out->dropped = cut >= 0 ? lines : 0;
  return 0;
}

/* A number for a record: null where it is not finite (JSON has no inf or
 * NaN): an overflowing step's loss, an epoch with no finite loss. */
static json_t *json_num(double v) { return isfinite(v) ? json_real(v) : json_null(); }

/* One JSON line into the metrics file. The first write that fails (a full
 * disk) is said at once, with why; training goes on and the run ends with an
 * error (the final check of the file). */
static const char *metrics_path;
static int metrics_said;
static void write_record(FILE *f, json_t *o) {
  char *line = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(8));
  if (line) {
    errno = 0;
    if ((fprintf(f, "%s\n", line) < 0 || fflush(f) != 0) && !metrics_said) {
      metrics_said = 1;
      cli_error("--metrics: error writing '%s': %s; training goes on, the run will end with an error", metrics_path,
                errno ? strerror(errno) : "write error");
    }
    free(line);
  }
  json_decref(o);
}

static long peak_rss_mb(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss / 1024;
}

/* Where a batch goes on its way to the device: host memory the loader
 * fills, written into the graph's input and labels. */
typedef struct {
  void *x;
  int32_t *y;
} staging;

static int staging_make(staging *st, cli_session *s, ampc_dtype xtype) {
  ampc_tensor x = ampc_graph_tensor(s->g, ampc_model_input(s->model));
  int64_t B = ampc_graph_max_batch(s->g);
  st->x = malloc((size_t)ampc_tensor_numel(&x) / (size_t)ampc_graph_batch(s->g) * (size_t)B * ampc_dtype_size(xtype));
  st->y = malloc((size_t)B * sizeof *st->y);
  if (!st->x || !st->y) {
    cli_error("out of memory for the batch");
    return -1;
  }
  return 0;
}

/* A checkpoint (or weights) written by rank 0 alone, after every rank has
 * gathered its ZeRO shards; the ranks then agree whether it worked. */
static int save_on_root(cli_session *s, const char *dir, int keep, const ampc_train_state *ts, int quiet, char *saved,
                        const char *weights, const char *const *meta) {
  int ok = 1;
  if (ampc_amp_gather_state(s->amp) < 0) {
    cli_lib_error("gathering the ZeRO shards");
    ok = 0;
  }
  if (ok && cli_dist_root())
    ok = weights ? cli_save_weights(s, weights, meta) == 0 : save_checkpoint(s, dir, keep, ts, quiet, saved) == 0;
  ampc_amp_release_state(s->amp);
  return cli_dist_agree(ok) ? 0 : -1;
}

/* Test hooks (tests/e2e/mpi.sh): AMPC_TEST_INF_AT=R:S puts an infinite
 * pixel into rank R's batch of optimizer step S; AMPC_TEST_DIVERGE_AT=R:S
 * doubles rank R's loss scale after step S (the rank check must find it);
 * AMPC_TEST_FAIL_AT=R:S makes rank R fail before step S as a failing call
 * would; AMPC_TEST_STEP_LOG=1 has every rank print each step's outcome and
 * a hash of its final weights. */
static int test_hook_at(const char *var, long long *step) {
  const char *v = getenv(var);
  int r;
  return v && sscanf(v, "%d:%lld", &r, step) == 2 && r == cli_dist_rank();
}

/* What a step record says of its step (--log-every) */
typedef struct {
  int64_t step;
  double progress, scale;
  int applied;
  double lr, grad_norm;
} step_fields;

/* A step record of f's step: the loss the mean over the rec_steps steps since the previous record */
static void write_step_record(FILE *mf, const step_fields *f, double rec_loss, int64_t rec_steps, int W) {
  json_t *o = json_object();
  json_object_set_new(o, "step", json_integer(f->step));
  json_object_set_new(o, "epoch_progress", json_num(f->progress));
  json_object_set_new(o, "loss", json_num(rec_loss / (double)rec_steps));
  json_object_set_new(o, "loss_scale", json_num(f->scale));
  json_object_set_new(o, "skipped", json_boolean(!f->applied));
  json_object_set_new(o, "lr", json_num(f->lr));
  if (isfinite(f->grad_norm)) json_object_set_new(o, "grad_norm", json_num(f->grad_norm)); /* (not on an overflow) */
  if (W > 1) json_object_set_new(o, "world_size", json_integer(W));
  write_record(mf, o);
}

/* With several ranks, a failure of this rank alone: it says why and the
 * whole job ends (the others would wait for it forever). */
static void rank_failed(void) {
  cli_lib_error(NULL);
  cli_dist_abort(1);
}

int cmd_train(int argc, char **argv) {
  train_args a;
  train_args_init(&a);
  cli_opt opts[96];
  train_args_opts(&a, opts);
  const int W = cli_dist_size(), root = cli_dist_root();
  ampc_comm *comm = cli_dist_comm();
  /* usage errors are every rank's alike: rank 0 says them */
  cli_dist_error_mode(CLI_ERRORS_ROOT);
  int pr = cli_parse("train", "[options]", opts, argc, argv);
  ampc_optim_config ocfg;
  ampc_lr_schedule sched;
  int skip_nonfinite;
  ampc_amp_config acfg;
  if (!pr && train_args_check(&a, &ocfg, &sched, &skip_nonfinite) < 0) pr = -1;
  if (!pr) pr = cli_common_check(&a.c, &acfg);
  pr = cli_dist_parse_agree(pr);
  if (!pr && !cli_dist_same_options(opts)) pr = -1;
  cli_dist_error_mode(CLI_ERRORS_ALL);
  if (pr) return pr > 0 ? 0 : pr == -2 ? 1 : 2;
  /* from here on, every exit goes through the one clean-up at the end; the
   * ranks' errors of the set-up wait until they agree that one failed */
  if (W > 1) cli_dist_error_mode(CLI_ERRORS_HOLD);
  int rc = 1, agreed = 0;
  FILE *mf = NULL;
  /* a --metrics file this run made, and whether the run got to writing it:
   * one made for a run that then never trained is removed again */
  int metrics_made = 0, metrics_began = 0;
  ampc_loader *ld = NULL;
  staging in = {NULL, NULL};
  cli_session s;
  memset(&s, 0, sizeof s);
  int quiet = a.quiet || !root; /* rank 0 alone shows progress */
  char resume_path[4096] = "";
  /* the checkpoints' paths (the folder, a name of up to 63 bytes) must fit
   * the 4096 bytes of a path, found out now rather than at the first save */
  if (a.checkpoint_dir && strlen(a.checkpoint_dir) > 4000) {
    cli_error("--checkpoint-dir: the path is %zu bytes long; at most 4000", strlen(a.checkpoint_dir));
    rc = 2;
    goto done;
  }
  if (a.resume && strlen(a.resume) > 4000) {
    cli_error("--resume: the path is %zu bytes long; at most 4000", strlen(a.resume));
    rc = 2;
    goto done;
  }
  /* one run per checkpoint folder: found out before anything else is done */
  if (root && a.checkpoint_dir && cli_ckptdir_lock("--checkpoint-dir", a.checkpoint_dir) < 0) goto done;
  if (a.resume) {
    struct stat sb;
    if (stat(a.resume, &sb) != 0) {
      cli_error("--resume: '%s': %s", a.resume, strerror(errno));
      goto done;
    }
    if (S_ISDIR(sb.st_mode)) {
      if (cli_latest_checkpoint(a.resume, resume_path, sizeof resume_path) < 0) {
        cli_error("--resume: no checkpoint (" CKPT_PREFIX "*" CKPT_SUFFIX ") in '%s'", a.resume);
        goto done;
      }
    } else {
      snprintf(resume_path, sizeof resume_path, "%s", a.resume);
    }
  }
  /* a folder of another run's checkpoints: this run's would mix with them,
   * --resume DIR would take the other run's newest, and --keep would delete
   * this run's own as the older ones */
  if (root && a.checkpoint_dir) {
    char other[4096], rdir[4096];
    snprintf(rdir, sizeof rdir, "%s", resume_path);
    char *slash = strrchr(rdir, '/');
    if (slash) *slash = '\0';
    else snprintf(rdir, sizeof rdir, ".");
    if (!cli_ckptdir_fits(a.checkpoint_dir, resume_path, other, sizeof other)) {
      if (resume_path[0] && cli_same_file(rdir, a.checkpoint_dir))
        /* a branch from an older checkpoint of the run: its saves would
         * replace the run's later ones (and --keep delete them) */
        cli_error("--resume: '%s' is not the latest checkpoint in '%s' (%s is): this run's checkpoints there would replace the "
                  "later ones; resume the latest (--resume %s), or give this run another --checkpoint-dir",
                  resume_path, a.checkpoint_dir, other, a.checkpoint_dir);
      else
        cli_error("--checkpoint-dir: '%s' holds another run's checkpoints (the latest %s); resume that run with --resume %s, or "
                  "give another folder", a.checkpoint_dir, other, a.checkpoint_dir);
      goto done;
    }
  }
  /* the run's other outputs must not be files it writes into its checkpoint
   * folder (the SIGINT/SIGTERM save's ./checkpoints where none is given) */
  const char *cdir = a.checkpoint_dir ? a.checkpoint_dir : "checkpoints";
  const char *owned = !root ? NULL : cli_ckptdir_owns(cdir, a.save) ? "--save" : cli_ckptdir_owns(cdir, a.metrics) ? "--metrics" : NULL;
  if (owned) {
    cli_error("%s: '%s' is a file this run writes into its checkpoint folder '%s' (a checkpoint, or its lock); choose another",
              owned, !strcmp(owned, "--save") ? a.save : a.metrics, cdir);
    rc = 2;
    goto done;
  }
  if (root && a.save) {
    /* find out now, not after training, that the weights cannot be written */
    struct stat sb;
    if (stat(a.save, &sb) == 0 && !S_ISREG(sb.st_mode)) {
      cli_error("--save: '%s' exists and is %s; give a file's path", a.save, S_ISDIR(sb.st_mode) ? "a folder" : "not a regular file");
      goto done;
    }
    if (cli_check_output_folder("--save", a.save) < 0) goto done;
  }
  /* an output that names an input would destroy it */
  if (root && a.save && resume_path[0] && cli_same_file(a.save, resume_path)) {
    cli_error("--save: '%s' is the checkpoint --resume reads; choose another file", a.save);
    rc = 2; /* options that clash: a usage error, as grad's and export's */
    goto done;
  }
  const char *data_name = NULL, *data_flag = !root                                       ? NULL
                                           : cli_output_is_data(&a.c, a.save, &data_name)    ? "--save"
                                           : cli_output_is_data(&a.c, a.metrics, &data_name) ? "--metrics"
                                                                                              : NULL;
  if (data_flag) {
    cli_error("%s: '%s' is the dataset's %s, which this run reads; choose another file", data_flag,
              !strcmp(data_flag, "--save") ? a.save : a.metrics, data_name);
    rc = 2;
    goto done;
  }
  const char *clash = !root || !a.metrics                                    ? NULL
                      : a.save && cli_same_path(a.metrics, a.save)           ? "--save"
                      : resume_path[0] && cli_same_file(a.metrics, resume_path) ? "--resume"
                                                                              : NULL;
  if (clash) {
    cli_error("--metrics: '%s' is the %s file; choose another", a.metrics, clash);
    rc = 2;
    goto done;
  }
  /* opened now (so that an unwritable path stops the run before it starts),
   * emptied only once the run is set to train */
  metrics_path = a.metrics;
  if (root && a.metrics) {
    struct stat sb;
    int existed = stat(a.metrics, &sb) == 0 || errno != ENOENT;
    if (!(mf = cli_open_output("--metrics", a.metrics, a.resume ? CLI_OUT_APPEND : CLI_OUT_KEEP))) goto done;
    metrics_made = !existed;
    /* one run writes a metrics file at a time (two interleaved their lines):
     * a lock for the run's life, dropped however it ends */
    struct stat ms;
    if (fstat(fileno(mf), &ms) == 0 && S_ISREG(ms.st_mode) && flock(fileno(mf), LOCK_EX | LOCK_NB) != 0) {
      cli_error("--metrics: '%s' is being written by another run (it holds a lock on it); choose another file", a.metrics);
      metrics_made = 0; /* (the other run's) */
      goto done;
    }
  }
  /* data-parallel: each rank takes its share of the cores */
  if (W > 1 && a.c.threads == 0 && !getenv("OMP_NUM_THREADS")) a.c.threads = cli_dist_default_threads();
  if (cli_session_open(&s, &a.c, 1, 1, NULL, &ocfg, a.c.batch_size, "--resume", resume_path[0] ? resume_path : NULL) < 0)
    goto done;
  /* a batch larger than the training set is the whole set, each epoch one
   * batch (as a DataLoader's without drop_last); the model was made for no more */
  if ((uint64_t)a.c.batch_size > ampc_dataset_count(s.train)) a.c.batch_size = (int64_t)ampc_dataset_count(s.train);
  const int64_t G = a.c.batch_size * W; /* images per batch over all the ranks */
  if (cli_check_grad_accum(a.c.grad_accum, ampc_dataset_count(s.train), G) < 0) goto done;
  /* the samples a rank's batch needs to train on: one, or two where a batch
   * norm would normalise single values (1x1 planes); an empty slice of a
   * short last batch cannot run, so with W ranks such a batch needs W */
  int min_batch = 1;
  for (size_t i = 0; i < ampc_graph_value_count(s.g); i++) {
    ampc_tensor t = ampc_graph_tensor(s.g, (ampc_value)i);
    if (ampc_graph_op(s.g, (ampc_value)i) == AMPC_OP_BATCHNORM2D && t.shape.ndim == 4 && t.shape.d[2] * t.shape.d[3] < 2) min_batch = 2;
  }
  if (a.c.batch_size < min_batch) {
    cli_error("--batch-size: %lld is too small for this model: its batch norms over single values need %d images a batch",
              (long long)a.c.batch_size, min_batch);
    rc = 2;
    goto done;
  }
  if (ampc_dataset_count(s.train) < (size_t)(min_batch * W)) {
    cli_error("the training set has %zu image%s, too few to give each of the %d ranks %d", ampc_dataset_count(s.train),
              ampc_dataset_count(s.train) == 1 ? "" : "s", W, min_batch);
    goto done;
  }
  int is_cifar = strncmp(a.c.dataset, "cifar", 5) == 0;
  int augment = a.augment_given ? a.augment : is_cifar;
  ampc_loader_opts lo;
  ampc_loader_opts_default(&lo);
  lo.batch_size = (int)a.c.batch_size;
  lo.seed = a.c.seed;
  lo.normalize = a.c.normalize;
  lo.random_crop_padding = augment ? 4 : 0;
  lo.hflip = augment;
  lo.rank = cli_dist_rank();
  lo.world_size = W;
  ampc_value xv = ampc_model_input(s.model), yv = ampc_model_labels(s.model), lossv = ampc_model_loss(s.model);
  lo.dtype = ampc_graph_tensor(s.g, xv).dtype; /* the loader converts as it goes: the write copies */
  if (staging_make(&in, &s, lo.dtype) < 0) goto done;
  if (ampc_loader_create(&ld, s.train, &lo) < 0) {
    cli_lib_error(NULL);
    goto done;
  }
  char desc[512];
  ampc_amp_config_describe(&s.amp_cfg, desc, sizeof desc);
  ampc_mem_report mem;
  ampc_amp_memory(s.amp, &mem);
  if (!quiet) {
    int cuda = strcmp(ampc_graph_backend_name(s.g), "cuda") == 0;
    fprintf(stderr, "ampc: model %s (%lld parameters), %s %zu train / %zu test images, batch %lld, %s, device %s%s\n",
            ampc_model_name(s.model), (long long)ampc_model_param_count(s.model), a.c.dataset,
            ampc_dataset_count(s.train), ampc_dataset_count(s.test), (long long)a.c.batch_size, ampc_optim_kind_name(ocfg.kind),
            ampc_graph_backend_name(s.g),
            cuda ? (a.c.tf32 ? (a.c.cudnn_deterministic ? " (tf32 on)" : " (tf32 on, cudnn-deterministic off)")
                             : (a.c.cudnn_deterministic ? " (tf32 off)" : " (tf32 off, cudnn-deterministic off)"))
                 : "");
    if (W > 1)
      fprintf(stderr, "ampc: data-parallel over %d ranks (%s, %d thread%s each): global batch %lld = %d x %lld, all-reduce %s%s%s%s\n",
              W, cli_dist_amp_kind(), ampc_graph_threads(s.g), ampc_graph_threads(s.g) == 1 ? "" : "s", (long long)G, W,
              (long long)a.c.batch_size, strcmp(a.c.allreduce_type, "f32") == 0 ? "f32" : "in the gradients' type",
              a.c.zero ? ", ZeRO-1" : "", a.c.sync_bn ? ", SyncBatchNorm" : "", a.c.grad_accum > 1 ? " (after each step's last micro-batch)" : "");
    fprintf(stderr, "ampc: amp %s\n", desc);
    fprintf(stderr, "ampc: %s", W > 1 ? "per rank " : "");
    cli_print_memory(stderr, &mem);
  }
  cli_progress pg;
  cli_progress_init(&pg, quiet);
  rc = 0;
  double run_t0 = cli_now(), best_acc = -1.0, last_acc = NAN;
  int best_epoch = 0, epochs_run = 0, interrupted = 0;
  char last_ckpt[4096] = "", dir_buf[64] = ""; /* dir_buf: the SIGINT/SIGTERM save's default folder */
  ampc_train_state ts = {.seed = a.c.seed};
  ampc_dataset_preprocessing(s.train, a.c.normalize, &ts.preprocessing); /* recorded in checkpoints */
  if (resume_path[0]) {
    /* every rank reads the checkpoint (ZeRO: keeping its shard) */
    if (ampc_checkpoint_load(resume_path, s.model, s.amp, s.opt, &ts) < 0) {
      cli_lib_error("--resume");
      rc = 1;
      goto done;
    }
    /* this program's runs step the optimizer once a step that was not
     * skipped: Adam's bias correction counts those steps */
    if (ampc_optim_step_count(s.opt) != ts.step - ts.skipped_total) {
      cli_error("--resume: %s: its optimizer took %lld steps, but its run took %lld of which %lld were skipped: not a checkpoint of "
                "this program's run", resume_path, (long long)ampc_optim_step_count(s.opt), (long long)ts.step, (long long)ts.skipped_total);
      rc = 1;
      goto done;
    }
    /* the inputs normalised as the saved run's were (its dataset and
     * --normalize were compared before the load; here its mean and std) */
    ampc_preprocessing now;
    ampc_dataset_preprocessing(s.train, a.c.normalize, &now);
    for (int c = 0; now.normalize && ts.preprocessing.normalize && c < now.channels && c < 3; c++)
      if (ts.preprocessing.mean[c] != now.mean[c] || ts.preprocessing.std[c] != now.std[c]) {
        cli_error("--resume: %s was trained on inputs normalised with mean %g and std %g (channel %d), this run's are %g and %g: "
                  "the model's inputs would differ", resume_path, (double)ts.preprocessing.mean[c], (double)ts.preprocessing.std[c], c,
                  (double)now.mean[c], (double)now.std[c]);
        rc = 1;
        goto done;
      }
    if (ts.global_batch > 0 && ts.global_batch != G && ts.batch > 0) {
      /* another number of ranks (or --batch-size): start at the batch that
       * holds the next image the saved run would have used */
      int64_t image = ts.batch * ts.global_batch, nb_here = ampc_loader_batches_per_epoch(ld);
      /* a run saved at its epoch's end (a stop on the last step) is past the
       * epoch's last image: this one goes on at the end of that epoch too,
       * not at a batch that is past it or trains its last images again */
      int at_end = image >= (int64_t)ampc_dataset_count(s.train);
      char where[160];
      if (at_end)
        snprintf(where, sizeof where, "it had finished epoch %lld's batches; resuming at its end", (long long)ts.epoch + 1);
      else
        snprintf(where, sizeof where, "resuming at image %lld of the epoch, batch %lld%s", (long long)image, (long long)(image / G),
                 image % G ? " (the images before it in that batch are seen again)" : "");
      if (!quiet)
        fprintf(stderr, "ampc: %s counted batches of %lld images (%lld rank%s), this run %lld (%d): %s\n", cli_shown(resume_path),
                (long long)ts.global_batch, (long long)ts.world_size, ts.world_size == 1 ? "" : "s", (long long)G, W, where);
      ts.batch = at_end ? nb_here : image / G;
    }
    if (cli_check_resume(resume_path, &ts, ampc_loader_batches_per_epoch(ld)) < 0) {
      rc = 1;
      goto done;
    }
    if (ts.seed != a.c.seed) {
      cli_error("--resume: %s was made with --seed %llu, this run has --seed %llu", resume_path, (unsigned long long)ts.seed, (unsigned long long)a.c.seed);
      rc = 1;
      goto done;
    }
    if (ts.epoch >= a.epochs) {
      /* nothing left to do: say so rather than silently exit */
      if (root)
        printf("ampc: the run in %s is finished: it trained all %lld epoch%s (%lld step%s); give a larger --epochs to train on%s%s%s\n",
               resume_path, (long long)ts.epoch, ts.epoch == 1 ? "" : "s", (long long)ts.step, ts.step == 1 ? "" : "s",
               a.save ? " (--save " : "", a.save ? a.save : "",
               a.save ? " not written: nothing was trained; ampc export CHECKPOINT -o FILE writes its weights)" : "");
      goto done;
    }
    if (!quiet) fprintf(stderr, "ampc: resumed from %s at epoch %lld, batch %lld, step %lld\n", cli_shown(resume_path), (long long)ts.epoch + 1, (long long)ts.batch, (long long)ts.step);
  }
  ts.world_size = W;
  ts.global_batch = G;
  /* the same data and starting point on every rank (options were compared
   * first; paths may differ between hosts, what they hold may not) */
  /* a rank whose set-up failed above is at its clean-up's agreement, which
   * this one matches; only then the values, a collective of another size */
  if (!cli_dist_agree(1)) {
    rc = 1;
    goto done;
  }
  if (W > 1) cli_dist_error_mode(CLI_ERRORS_HOLD); /* (the agreement printed what it held) */
  {
    static const char *const what[] = {"the training set's image count", "the test set's image count",
                                        "the resumed checkpoint's step", "the resumed checkpoint's epoch and batch",
                                        "the training set's images and labels (a hash)", "the training set's images and labels (a hash)",
                                        "the test set's images and labels (a hash)", "the test set's images and labels (a hash)",
                                        "the model's weights and buffers, as made or resumed (a hash)",
                                        "the model's weights and buffers, as made or resumed (a hash)"};
    double v[10] = {(double)ampc_dataset_count(s.train), (double)(s.test ? ampc_dataset_count(s.test) : 0), (double)ts.step,
                    (double)ts.epoch * 1e9 + (double)ts.batch};
    /* (the counts first: sets of other sizes differ in their hashes too) */
    uint64_t h[3] = {0, 0, 0};
    if (W > 1 && rank_contents(&s, h) < 0) {
      cli_lib_error("comparing the ranks' models");
      rc = 1;
      goto done;
    }
    for (int k = 0; k < 3; k++) {
      v[4 + 2 * k] = (double)(h[k] >> 32); /* (halves of 32 bits: exact in a double) */
      v[5 + 2 * k] = (double)(h[k] & 0xffffffffu);
    }
    if (!cli_dist_same_values(v, what, 10)) {
      rc = 1;
      goto done;
    }
  }
  /* every rank is ready, or none trains */
  agreed = 1;
  metrics_began = 1;
  if (!cli_dist_agree(1)) {
    rc = 1;
    goto done;
  }
  /* then (rank 0's) metrics file emptied for a new run, or cut at the
   * checkpoint for a resumed one; the ranks agree on that too (a rank 0 that
   * failed there would otherwise leave the others waiting in their first
   * step) */
  int metrics_ok = 1;
  struct stat mst; /* a device or a pipe has nothing to empty */
  if (mf && !a.resume && fstat(fileno(mf), &mst) == 0 && S_ISREG(mst.st_mode) && ftruncate(fileno(mf), 0) != 0) {
    cli_error("--metrics: cannot empty '%s': %s", a.metrics, strerror(errno));
    metrics_ok = 0;
  }
  if (mf && a.resume) {
    metrics_cut mc;
    if (metrics_rewind(mf, a.metrics, &ts, &mc) < 0) metrics_ok = 0;
    else if (mc.dropped > 0 && mc.past) /* (said with --quiet too: lines of the user's file went) */
      fprintf(stderr, "ampc: --metrics: %s: dropped %lld line%s from the first record past the checkpoint (step %lld) on, which this run writes again\n",
              cli_shown(a.metrics), mc.dropped, mc.dropped == 1 ? "" : "s", (long long)ts.step);
    else if (mc.dropped > 0)
      fprintf(stderr, "ampc: --metrics: %s: dropped its last line, cut short (a write the run before did not finish)\n", cli_shown(a.metrics));
  }
  if (!cli_dist_agree(metrics_ok)) {
    rc = 1;
    goto done;
  }
  signal(SIGINT, on_signal);
  signal(SIGTERM, on_signal);
  int64_t last_skip_report = -1, skip_repeats = 0;
  int accum = a.c.grad_accum;
  ampc_amp_set_loss_weight(s.amp, 1.0f / (float)accum);
  ampc_amp_set_grad_stats(s.amp, a.c.amp_report);
  int is_static = !s.amp_cfg.loss_scale_dynamic;
  double rec_loss = ts.log_loss_sum; /* the steps since the last step record (a resumed run: the checkpoint's) */
  int64_t rec_steps = ts.log_steps;
  step_fields last_fields = {0}; /* the last step's, for the record of the step the run stops at */
  long long inf_step = -1, diverge_step = -1, fail_step = -1;
  int inf_hook = test_hook_at("AMPC_TEST_INF_AT", &inf_step), diverge_hook = test_hook_at("AMPC_TEST_DIVERGE_AT", &diverge_step);
  int fail_hook = test_hook_at("AMPC_TEST_FAIL_AT", &fail_step);
  int step_log = getenv("AMPC_TEST_STEP_LOG") != NULL;
  for (int epoch = (int)ts.epoch; epoch < a.epochs && rc == 0; epoch++) {
    float lr = ampc_lr_at(&sched, ocfg.lr, epoch);
    int64_t start_batch = epoch == ts.epoch ? ts.batch : 0;
    if (epoch != ts.epoch) epoch_start_state(&ts, epoch);
    if (ampc_loader_start_epoch(ld, epoch, start_batch) < 0) {
      rank_failed();
      rc = 1;
      break;
    }
    int64_t nb = ampc_loader_batches_per_epoch(ld), b = start_batch;
    double t0 = cli_now(), last_print = t0 - 1.0, prior_seconds = ts.train_seconds; /* the bar shows from the first step */
    int64_t seen_here = 0;
    int micro = 0, stop_now = 0;
    int stop_elsewhere = 0; /* data-parallel: the signal a rank other than this one received */
    double comm_alone = -1.0, comm_alone_bytes = 0.0; /* the epoch's all-reduce alone: seconds, bytes */
    int64_t steps_here = 0;
    ampc_amp_comm_stats comm_kept = {0};              /* the overlapped steps' before that */
    double step_loss_sum = 0.0;        /* this step's micro-batch losses */
    double step_share_sum = 0.0;       /* data-parallel: each micro-batch's loss times this rank's share of its images */
    double step_lsum = 0.0, step_n = 0.0; /* ... times their images, and the images (data-parallel: this rank's) */
    ampc_amp_grad_stats st;
    ampc_amp_get_grad_stats(s.amp, &st, 1);
    /* an epoch resumed from a checkpoint with --amp-report's statistics: those of its steps before (a run
     * without --amp-report gathers none, and its checkpoints carry none on) */
    ampc_amp_grad_stats kept = {0, 0, 0.0f};
    if (!a.c.amp_report) ts.has_grad_stats = 0;
    if (ts.has_grad_stats) kept = (ampc_amp_grad_stats){ts.grad_values, ts.grad_underflow, (float)ts.grad_max_abs};
    int stats_whole = start_batch == 0 || ts.has_grad_stats;
    for (;;) {
      int got = 0;
      if (b >= nb) break; /* (a rank's slice of the last batch may be empty) */
      if (ampc_loader_next(ld, in.x, in.y, &got) < 0) {
        rank_failed();
        rc = 1;
        break;
      }
      int64_t gn = ampc_loader_global_samples(ld, b); /* over all the ranks */
      if (W == 1 && got == 0) break;
      b++;
      /* a last batch too small to train on (a rank's slice would be empty,
       * or too small for a batch norm; on every rank: the ranks decide
       * alike) is left out; it still ends the epoch's last step when
       * micro-batches of it are waiting (--grad-accum), applied without it */
      int short_batch = gn < (int64_t)min_batch * W;
      if (short_batch && micro == 0) continue;
      if (!short_batch) {
        if (fail_hook && ts.step + 1 == fail_step) {
          cli_error("step %lld: failing on purpose (AMPC_TEST_FAIL_AT)", (long long)ts.step + 1);
          cli_dist_abort(1);
          rc = 1;
          break;
        }
        if (inf_hook && ts.step + 1 == inf_step) {
          float inf = INFINITY; /* the test hook: this rank's batch gets an infinite pixel */
          ampc_store_f32(lo.dtype, in.x, &inf, 1);
        }
        /* each rank's mean loss weighted by its share of the global batch, so
         * that the ranks' average is the global batch's mean */
        ampc_amp_set_loss_weight(s.amp, (float)(1.0 / accum * (W > 1 ? (double)W * got / (double)gn : 1.0)));
        int last_micro = micro + 1 >= accum || b >= nb;
        /* the epoch's second step measures what the all-reduce costs alone
         * (after backward, the ranks lined up), the yardstick of what overlap
         * hides in the others (the run's first pays for MPI's connections) */
        int calibrate = W > 1 && last_micro && comm_alone < 0 && steps_here == 1;
        ampc_amp_set_no_sync(s.amp, !last_micro || calibrate); /* the step's last micro-batch reduces them all */
        float l = 0.0f;
        if (ampc_graph_set_batch(s.g, got) < 0 || ampc_graph_write(s.g, xv, in.x, lo.dtype) < 0 ||
            ampc_graph_write(s.g, yv, in.y, AMPC_DTYPE_I32) < 0 || ampc_amp_forward(s.amp, 1) < 0 ||
            ampc_amp_backward(s.amp, lossv, 0, micro > 0) < 0 || ampc_graph_read(s.g, lossv, &l, AMPC_DTYPE_F32) < 0) {
          rank_failed();
          rc = 1;
          break;
        }
        if (W == 1) {
          ts.loss_sum += (double)l * got;
          ts.seen += got;
          seen_here += got;
        }
        step_lsum += (double)l * got;
        step_n += got;
        step_loss_sum += (double)l;
        step_share_sum += (double)l * got / (double)(gn > 0 ? gn : 1);
        micro++;
        if (!last_micro) continue;
        if (calibrate) {
          ampc_amp_comm_stats keep;
          ampc_amp_get_comm_stats(s.amp, &keep, 1);
          comm_kept.steps += keep.steps;
          comm_kept.bytes += keep.bytes;
          comm_kept.seconds += keep.seconds;
          comm_kept.exposed_seconds += keep.exposed_seconds;
          double line_up = 0.0;
          int bad = ampc_comm_allreduce_host(comm, &line_up, 1, AMPC_COMM_SUM) < 0;
          double t_alone = cli_now();
          if (bad || ampc_amp_sync_grads(s.amp) < 0) {
            rank_failed();
            rc = 1;
            break;
          }
          comm_alone = cli_now() - t_alone;
          ampc_amp_get_comm_stats(s.amp, &keep, 1); /* not an overlapped step's */
          comm_alone_bytes = keep.bytes;
        }
      }
      double step_loss = step_loss_sum / (double)micro;
      if (W > 1) {
        /* the step's loss and images over the ranks, and whether a rank was
         * asked to stop: every rank stops after the same step */
        double v[5] = {step_lsum, step_n, stop_requested == SIGINT ? 1.0 : 0.0, stop_requested == SIGTERM ? 1.0 : 0.0, step_share_sum};
        if (ampc_comm_allreduce_host(comm, v, 5, AMPC_COMM_SUM) < 0) {
          rank_failed();
          rc = 1;
          break;
        }
        ts.loss_sum += v[0];
        ts.seen += (int64_t)v[1];
        seen_here += (int64_t)v[1];
        /* the mean of the micro-batches' losses over all their images, as one
         * process records it (each micro-batch weighs the same in the step:
         * its gradient is scaled by 1/accum whatever its size) */
        step_loss = micro > 0 ? v[4] / (double)micro : 0.0;
        stop_now = v[2] > 0 || v[3] > 0;
        /* the signal another rank received, named on this one */
        if (stop_now && !stop_requested) stop_elsewhere = v[2] > 0 ? SIGINT : SIGTERM;
      } else {
        stop_now = stop_requested != 0;
      }
      step_loss_sum = step_share_sum = step_lsum = step_n = 0.0;
      micro = 0;
      ampc_amp_step_info info;
      if (ampc_amp_step(s.amp, lr, &info) < 0) {
        rank_failed();
        rc = 1;
        break;
      }
      ts.step++;
      ts.batch = b;
      steps_here++;
      if (step_log)
        fprintf(stderr, "ampc: test: rank %d step %lld applied %d scale %g grad_norm %.9g\n", cli_dist_rank(), (long long)ts.step,
                info.applied, info.scale, info.grad_norm);
      if (diverge_hook && ts.step == diverge_step) {
        ampc_scaler_state sst;
        ampc_scaler_get_state(ampc_amp_scaler(s.amp, 0), &sst);
        sst.scale *= 2.0f; /* the test hook: this rank drifts */
        ampc_scaler_set_state(ampc_amp_scaler(s.amp, 0), &sst);
      }
      if (!info.applied) {
        ts.skipped++;
        ts.skipped_total++;
        if (is_static && !skip_nonfinite) {
          cli_progress_clear(&pg);
          AGREED_ERROR("step %lld: non-finite loss or gradients (loss %g; first non-finite gradient: %s); stopping (--on-nonfinite skip skips such steps)",
                       (long long)ts.step, step_loss, info.nonfinite[0] ? info.nonfinite[0] : "?");
          rc = 1; /* (after the step's metrics record) */
        } else if (last_skip_report == ts.step - 1) {
          /* one line per skipped step at most; a run of skips is counted, not repeated */
          skip_repeats++;
        } else if (root) {
          cli_progress_clear(&pg);
          if (skip_repeats) fprintf(stderr, "ampc: (%lld more skipped step%s in a row)\n", (long long)skip_repeats, skip_repeats == 1 ? "" : "s");
          skip_repeats = 0;
          fprintf(stderr, "ampc: step %lld: gradient overflow, step skipped, loss scale now %g; non-finite gradients in %d parameter%s: %s%s%s%s%s%s\n",
                  (long long)ts.step, info.scale, info.n_nonfinite, info.n_nonfinite == 1 ? "" : "s",
                  info.nonfinite[0] ? info.nonfinite[0] : "?", info.n_nonfinite > 1 ? ", " : "", info.n_nonfinite > 1 ? info.nonfinite[1] : "",
                  info.n_nonfinite > 2 ? ", " : "", info.n_nonfinite > 2 ? info.nonfinite[2] : "", info.n_nonfinite > 3 ? ", ..." : "");
        }
        last_skip_report = ts.step;
        if (!rc && ampc_scaler_diverged(ampc_amp_scaler(s.amp, 0), 20) && !skip_nonfinite) {
          AGREED_ERROR("step %lld: the loss scale stayed at its minimum (%g) for 20 overflowing steps in a row: training is diverging",
                       (long long)ts.step, info.scale);
          rc = 1; /* (after the step's metrics record) */
        }
      }
      ts.train_seconds = prior_seconds + (cli_now() - t0);
      rec_loss += step_loss;
      rec_steps++;
      last_fields = (step_fields){ts.step, (double)epoch + (double)b / (double)nb, info.scale, info.applied, lr, info.grad_norm};
      if (mf && a.log_every > 0 && (ts.step % a.log_every == 0 || !info.applied || rc)) {
        write_step_record(mf, &last_fields, rec_loss, rec_steps, W);
        rec_loss = 0.0;
        rec_steps = 0;
      }
      if (rc) break; /* the run stops at this step: its record is written */
      if (a.checkpoint_dir && a.save_every > 0 && ts.step % a.save_every == 0 && b < nb) {
        cli_progress_clear(&pg);
        if (state_to_save(&s, &ts, rec_loss, rec_steps, a.c.amp_report, &kept, stats_whole) < 0) {
          rank_failed();
          rc = 1;
          break;
        }
        if (save_on_root(&s, a.checkpoint_dir, a.keep, &ts, quiet, last_ckpt, NULL, NULL) < 0) {
          rc = 1;
          break;
        }
      }
      if (stop_now) break;
      double now = cli_now();
      if (pg.tty ? now - last_print > 0.25 : (b % (nb / 4 > 0 ? nb / 4 : 1) == 0 && b < nb)) {
        double el = now - t0, ips = (double)seen_here / (el > 0 ? el : 1e-9);
        cli_progress_update(&pg, epoch + 1, a.epochs, b, nb, ts.loss_sum / (double)ts.seen, ips, info.scale,
                            (double)(nb - b) * el / (double)(b - start_batch));
        last_print = now;
      }
    }
    if (rc) break;
    if (stop_now) {
      /* SIGINT/SIGTERM: save where we are and stop cleanly */
      const char *dir = a.checkpoint_dir ? a.checkpoint_dir : "checkpoints";
      cli_progress_clear(&pg);
      if (root)
        fprintf(stderr, "ampc: %s%s received at epoch %d, batch %lld/%lld: saving a checkpoint at step %lld and stopping\n",
                (stop_requested ? stop_requested : stop_elsewhere) == SIGINT ? "SIGINT" : "SIGTERM",
                stop_requested ? "" : " (by another rank)", epoch + 1, (long long)b, (long long)nb, (long long)ts.step);
      /* the default folder is taken only now, locked like --checkpoint-dir's:
       * ./checkpoints, or where that holds another run's checkpoints (or the
       * later ones of the run this one branched from), ./checkpoints.N */
      int locked = !root || a.checkpoint_dir || cli_ckptdir_default(resume_path, dir_buf, sizeof dir_buf) >= 0;
      if (root && !a.checkpoint_dir) dir = dir_buf;
      /* a stop on the run's last step: that step's record now, as the run
       * ending there writes it (a resumed run takes no step to carry the
       * steps since the last record into) */
      if (epoch == a.epochs - 1 && b >= nb && mf && a.log_every > 0 && rec_steps > 0 && last_fields.step == ts.step) {
        write_step_record(mf, &last_fields, rec_loss, rec_steps, W);
        rec_loss = 0.0;
        rec_steps = 0;
      }

      if (state_to_save(&s, &ts, rec_loss, rec_steps, a.c.amp_report, &kept, stats_whole) < 0) {
        rank_failed();
        rc = 1;
        break;
      }
      if (!cli_dist_agree(locked) || save_on_root(&s, dir, a.keep, &ts, 0, last_ckpt, NULL, NULL) < 0)
        rc = 1;
      else if (root)
        fprintf(stderr, "ampc: resume with: ampc train ... --resume %s\n", cli_shown(dir));
      interrupted = 1;
      break;
    }
    /* the run's last step has its record, whatever its number (where this
     * run took it: one resumed at its last epoch's end has no step's fields) */
    if (epoch == a.epochs - 1 && mf && a.log_every > 0 && rec_steps > 0 && last_fields.step == ts.step) {
      write_step_record(mf, &last_fields, rec_loss, rec_steps, W);
      rec_loss = 0.0;
      rec_steps = 0;
    }
    if (skip_repeats) {
      cli_progress_clear(&pg);
      if (root) fprintf(stderr, "ampc: (%lld more skipped step%s in a row)\n", (long long)skip_repeats, skip_repeats == 1 ? "" : "s");
      skip_repeats = 0;
      last_skip_report = -1;
    }
    /* the ranks still agree on the loss scale and the step count */
    if (ampc_amp_check_ranks(s.amp) < 0) {
      cli_progress_clear(&pg);
      AGREED_ERROR("epoch %d: %s", epoch + 1, ampc_last_error());
      rc = 1;
      break;
    }
    double train_time = ts.train_seconds;
    double test_loss = NAN, test_acc = NAN;
    double te0 = cli_now();
    /* rank 0 evaluates; the others go on to the next epoch's first step */
    if (root && cli_evaluate(&s, s.test, &test_loss, &test_acc) < 0) {
      rank_failed();
      rc = 1;
      break;
    }
    double secs = train_time + (cli_now() - te0);
    double train_loss = ts.seen ? ts.loss_sum / (double)ts.seen : NAN;
    double ips = (double)ts.seen / (train_time > 0 ? train_time : 1e-9);
    cli_progress_clear(&pg);
    if (a.c.amp_report) {
      ampc_amp_get_grad_stats(s.amp, &st, 1);
      if (reduce_grad_stats(&st) < 0) {
        rank_failed();
        rc = 1;
        break;
      }
      add_grad_stats(&st, &kept);
    }
    ampc_amp_comm_stats cs;
    ampc_amp_get_comm_stats(s.amp, &cs, 1);
    /* the epoch's calibration step, its all-reduce measured alone, counts
     * among the steps after it without its bytes or time */
    if (comm_alone >= 0 && cs.steps > 0) cs.steps--;
    cs.steps += comm_kept.steps;
    cs.bytes += comm_kept.bytes;
    cs.exposed_seconds += comm_kept.exposed_seconds;
    /* per step: the all-reduce alone and the time a rank spent in it while
     * overlapped, each the least over the ranks (a rank that reaches a
     * collective first also waits for the others to arrive) */
    double comm_step[2] = {comm_alone > 0 ? comm_alone : 0.0, cs.steps ? cs.exposed_seconds / (double)cs.steps : 0.0};
    if (W > 1 && ampc_comm_allreduce_host(comm, comm_step, 2, AMPC_COMM_MIN) < 0) {
      rank_failed();
      rc = 1;
      break;
    }
    double comm_hidden = comm_step[0] > 0 ? 1.0 - comm_step[1] / comm_step[0] : 0.0;
    if (comm_hidden < 0) comm_hidden = 0.0;
    /* an epoch of one step has no step to measure the all-reduce alone
     * (its second) nor overlapped ones: not measured, not 0 */
    int comm_measured = comm_alone > 0, overlap_measured = cs.steps > 0;
    if (!comm_measured) comm_step[0] = comm_hidden = NAN;
    if (!overlap_measured) comm_step[1] = comm_hidden = NAN;
    double comm_bytes = cs.steps ? cs.bytes / (double)cs.steps : comm_alone_bytes;
    double uf = st.values ? (double)st.underflow / (double)st.values : 0.0;
    if (root) {
      /* (a NaN as "nan", whatever its sign bit: printf may say "-nan") */
      printf("epoch %d: train_loss %.4f test_loss %.4f test_acc %.4f %.1f img/s %.1fs loss_scale %g skipped %lld", epoch + 1,
             isnan(train_loss) ? NAN : train_loss, isnan(test_loss) ? NAN : test_loss, test_acc, ips, secs,
             ampc_scaler_scale(ampc_amp_scaler(s.amp, 0)), (long long)ts.skipped);
      /* --amp-report's figures, with or without a metrics file */
      if (a.c.amp_report) printf(" grad_underflow %.4f%% of %lld half values, grad_max_abs %.4g", 100.0 * uf, (long long)st.values, st.max_abs);
      if (W > 1 && comm_measured && overlap_measured)
        printf(" ranks %d all-reduce %.1f ms/step alone, %.1f ms overlapped (%.0f%% hidden)", W, 1e3 * comm_step[0], 1e3 * comm_step[1],
               100.0 * comm_hidden);
      else if (W > 1)
        printf(" ranks %d all-reduce not measured (too few steps in the epoch)", W);
      printf("\n");
      fflush(stdout);
    }
    epochs_run++;
    last_acc = test_acc;
    if (test_acc > best_acc) {
      best_acc = test_acc;
      best_epoch = epoch + 1;
    }
    if (mf) {
      json_t *o = json_object();
      json_object_set_new(o, "epoch", json_integer(epoch + 1));
      json_object_set_new(o, "train_loss", json_num(train_loss));
      json_object_set_new(o, "test_loss", json_num(test_loss));
      json_object_set_new(o, "test_acc", json_num(test_acc));
      json_object_set_new(o, "images_per_s", json_num(ips));
      json_object_set_new(o, "seconds", json_num(secs));
      json_object_set_new(o, "train_seconds", json_num(train_time));
      json_object_set_new(o, "lr", json_num(lr));
      json_object_set_new(o, "steps", json_integer(ts.step));
      json_object_set_new(o, "opt_level", json_string(ampc_opt_level_name(s.amp_cfg.opt_level)));
      json_object_set_new(o, "half", json_string(ampc_dtype_name(s.amp_cfg.half_type)));
      if (strcmp(ampc_graph_backend_name(s.g), "cuda") == 0) {
        json_object_set_new(o, "tf32", json_boolean(a.c.tf32));
        json_object_set_new(o, "cudnn_deterministic", json_boolean(a.c.cudnn_deterministic));
      }
      json_object_set_new(o, "loss_scale", json_num(ampc_scaler_scale(ampc_amp_scaler(s.amp, 0))));
      json_object_set_new(o, "skipped_steps", json_integer(ts.skipped));
      json_object_set_new(o, "skipped_steps_total", json_integer(ts.skipped_total));
      json_object_set_new(o, "world_size", json_integer(W));
      json_object_set_new(o, "global_batch_size", json_integer(G));
      if (W > 1) {
        /* the gradient all-reduce of a step: alone (measured at the
         * epoch's second step), the time a rank spent in it overlapped with
         * backward, and the share of it overlap hid */
        json_object_set_new(o, "comm_seconds_per_step", json_num(comm_step[0]));
        json_object_set_new(o, "comm_exposed_seconds_per_step", json_num(comm_step[1]));
        json_object_set_new(o, "comm_hidden_fraction", json_num(comm_hidden));
        json_object_set_new(o, "comm_bytes_per_step", json_num(comm_bytes));
      }
      ampc_amp_memory(s.amp, &mem); /* with what the steps made (accumulation's f32 master gradients) */
      json_object_set_new(o, "memory", cli_memory_json(&mem));
      if (a.c.amp_report) {
        json_object_set_new(o, "grad_half_values", json_integer(st.values));
        json_object_set_new(o, "grad_underflow_fraction", json_num(uf));
        json_object_set_new(o, "grad_max_abs", json_num(st.max_abs));
      }
      write_record(mf, o);
    }
    if (a.checkpoint_dir) {
      ampc_train_state next = ts;
      epoch_start_state(&next, epoch + 1);
      state_to_save(&s, &next, rec_loss, rec_steps, 0, NULL, 0); /* (the next epoch's statistics: none yet) */
      if (save_on_root(&s, a.checkpoint_dir, a.keep, &next, quiet, last_ckpt, NULL, NULL) < 0) {
        rc = 1;
        break;
      }
    }
  }
  if (rc == 0 && step_log) {
    /* the test hook: every rank's final weights, as one hash each */
    size_t n = ampc_graph_param_numel(s.g);
    float *w = malloc(n * sizeof *w);
    int ok = w && ampc_amp_gather_state(s.amp) == 0 && ampc_amp_param_values(s.amp, w) == 0;
    ampc_amp_release_state(s.amp);
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; ok && i < n * sizeof *w; i++) h = (h ^ ((const unsigned char *)w)[i]) * 1099511628211ull;
    fprintf(stderr, "ampc: test: rank %d weights %016llx\n", cli_dist_rank(), ok ? (unsigned long long)h : 0ull);
    free(w);
  }
  int saved = 0;
  if (rc == 0 && a.save && epochs_run + interrupted > 0) {
    if (interrupted && !a.save_on_interrupt) {
      if (root) fprintf(stderr, "ampc: --save %s not written: the run stopped mid-epoch (--save-on-interrupt writes it anyway)\n", cli_shown(a.save));
    } else {
      /* the preprocessing goes with the weights, as in checkpoints and exports */
      char *pre = ts.preprocessing.dataset[0] ? ampc_preprocessing_json(&ts.preprocessing) : NULL;
      const char *meta[] = {"format", "ampc-weights-1", "model", ampc_model_name(s.model), pre ? "preprocessing" : NULL, pre, NULL};
      if (save_on_root(&s, NULL, 0, NULL, quiet, NULL, a.save, meta) < 0) rc = 1;
      else saved = 1;
      free(pre);
    }
  }
  if (rc == 0 && epochs_run + interrupted > 0 && !quiet) {
    /* the summary: what the run did and what it wrote */
    ampc_mem_report end;
    ampc_amp_memory(s.amp, &end);
    size_t acc_bytes = 0;
    for (int c = 0; c < AMPC_MEM_COUNT; c++) acc_bytes += ampc_mem_total(&end, (ampc_mem_category)c);
    fprintf(stderr, "ampc: %s in %.1fs: %d epoch%s, %lld step%s (%lld skipped), ", interrupted ? "stopped" : "done", cli_now() - run_t0,
            epochs_run, epochs_run == 1 ? "" : "s", (long long)ts.step, ts.step == 1 ? "" : "s", (long long)ts.skipped_total);
    if (best_epoch) fprintf(stderr, "test_acc best %.4f (epoch %d) final %.4f, ", best_acc, best_epoch, last_acc);
    fprintf(stderr, "loss scale %g, peak memory %ld MB (accounted %.1f MB)%s\n", ampc_scaler_scale(ampc_amp_scaler(s.amp, 0)),
            peak_rss_mb(), (double)acc_bytes / 1e6, W > 1 ? " on rank 0" : "");
    if (mf || saved || last_ckpt[0]) {
      fprintf(stderr, "ampc: wrote");
      if (mf) fprintf(stderr, " metrics %s%s", cli_shown(a.metrics), saved || last_ckpt[0] ? "," : "");
      if (saved) fprintf(stderr, " weights %s%s", cli_shown(a.save), last_ckpt[0] ? "," : "");
      if (last_ckpt[0]) fprintf(stderr, " checkpoints in %s (last %s)", cli_shown(a.checkpoint_dir ? a.checkpoint_dir : dir_buf), cli_shown(last_ckpt));
      fprintf(stderr, "\n");
    }
  }
done:
  /* a rank whose set-up failed: the ranks agree on it (the first failing
   * rank's errors are printed) before any leaves */
  if (!agreed) cli_dist_agree(rc == 0);
  if (rc != 0 && root) cli_ckptdir_abandon(); /* a checkpoint folder this run made and never wrote into */
  ampc_loader_free(ld);
  cli_session_close(&s);
  free(in.x);
  free(in.y);
  if (mf && (ferror(mf) | fclose(mf)) != 0) {
    if (!metrics_said) cli_error("--metrics: error writing '%s'", a.metrics);
    rc = 1;
  }
  if (mf && metrics_made && !metrics_began) unlink(a.metrics);
  return rc;
}
