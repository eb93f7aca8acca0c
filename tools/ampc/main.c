/* ampc: train, evaluate and inspect mixed-precision models. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <omp.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ampc/version.h"
#include "cli.h"
#include "dist.h"

static const struct {
  const char *name;
  int (*fn)(int, char **);
  const char *help;
} commands[] = {
    {"train", cmd_train, "train a model on a dataset"},
    {"eval", cmd_eval, "evaluate saved weights on a dataset's test set"},
    {"grad", cmd_grad, "one forward and backward on a batch; write loss, logits and gradients"},
    {"summary", cmd_summary, "layers, output shapes and parameter counts of a model"},
    {"bench", cmd_bench, "time training steps and compare with the machine's sgemm rate"},
    {"report", cmd_report, "draw the metrics of runs as one HTML page of charts"},
    {"export", cmd_export, "write a checkpoint's model weights as a PyTorch state_dict"},
};

static void usage(FILE *f) {
  fprintf(f, "usage: ampc <command> [options]\n\ncommands:\n");
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].help);
  fprintf(f, "\nampc <command> --help shows a command's options; ampc --version the build.\n");
}

/* Settings that libraries read only as they are loaded, before main, made
 * by running the program again with them in its environment (the second
 * run finds them set and goes on; if it cannot be run again, this one goes
 * on as it is). A variable the user (or the environment) set is left alone.
 *
 * - OPENBLAS_CORETYPE: where OpenBLAS chose kernels older than this CPU (it
 *   does not know every new model: see ampc_blas_better_core()), the ones
 *   that fit; --version and bench say where it holds OpenBLAS back.
 * - GOMP_SPINCOUNT=1000 (unless OMP_WAIT_POLICY or GOMP_SPINCOUNT is set): a
 *   thread waiting at one of the step's barriers spins about a microsecond
 *   rather than libgomp's default of about 0.3 s before it sleeps. On a
 *   machine whose cores another busy process shares, spinning threads take
 *   the time the threads they wait for need: measured on a 2-core AMD EPYC
 *   (family 25) with one other CPU-bound process, the cnn's O2 step on 2
 *   threads ran at 2960-4650 images/s with the default and 4440-4810 with
 *   1000 (one thread: 5050-5200); idle, the two were the same within the
 *   noise (9050-9650 images/s each; ResNet-18 O2 109-127). */
/* Where OMP_PROC_BIND or OMP_PLACES ask libgomp to bind threads, it binds
 * this one, before main, to the first place alone; a program run from it
 * inherits that single place as everything it may use, and so binds all of
 * its threads there (OMP_PLACES=cores, 2 threads on a 2-core AMD EPYC: the
 * cnn's step at 0.55-0.64 of the speed unbound). Before the program runs
 * again, its affinity goes back to every CPU of every place libgomp found:
 * what the first run could use. Returns whether it changed it (old: the
 * thread's affinity before). */
static int unbind_for_rerun(cpu_set_t *old) {
  if (omp_get_proc_bind() == omp_proc_bind_false) return 0;
  int places = omp_get_num_places();
  if (places <= 0 || sched_getaffinity(0, sizeof *old, old) != 0) return 0;
  cpu_set_t all;
  CPU_ZERO(&all);
  for (int p = 0; p < places; p++) {
    int ids[CPU_SETSIZE], n = omp_get_place_num_procs(p);
    if (n <= 0 || n > CPU_SETSIZE) continue;
    omp_get_place_proc_ids(p, ids);
    for (int i = 0; i < n; i++)
      if (ids[i] >= 0 && ids[i] < CPU_SETSIZE) CPU_SET(ids[i], &all);
  }
  return CPU_COUNT(&all) > 0 && !CPU_EQUAL(&all, old) && sched_setaffinity(0, sizeof all, &all) == 0;
}

static void reexec_settings(char **argv) {
  /* under valgrind (its preloaded library) the program run again would be
   * run natively, outside the tool (or refused): this run goes on as it is */
  const char *pre = getenv("LD_PRELOAD");
  if (pre && strstr(pre, "vgpreload")) return;
  int again = 0;
  const char *core = getenv("OPENBLAS_CORETYPE") ? NULL : ampc_blas_better_core();
  if (core && setenv("OPENBLAS_CORETYPE", core, 1) == 0) again = 1;
  if (!getenv("OMP_WAIT_POLICY") && !getenv("GOMP_SPINCOUNT") && setenv("GOMP_SPINCOUNT", "1000", 1) == 0) again = 1;
  if (!again) return;
  cpu_set_t bound;
  int unbound = unbind_for_rerun(&bound);
  /* by its own path, so that the process keeps its name (ps, pgrep ampc);
   * through /proc where that path is gone (a binary replaced while running) */
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n > 0) {
    self[n] = '\0';
    execv(self, argv);
  }
  execv("/proc/self/exe", argv);
  /* not run again: the environment and the binding back as they were */
  if (core) unsetenv("OPENBLAS_CORETYPE");
  unsetenv("GOMP_SPINCOUNT");
  if (unbound) sched_setaffinity(0, sizeof bound, &bound);
}

/* What was printed to standard output must have reached it: a full disk or
 * a closed pipe is an error, not a silent exit 0. */
/* standard output was closed when the program started (it is /dev/null now) */
static int stdout_was_closed;

static int stdout_done(int rc) {
  if (stdout_was_closed) {
    cli_error("standard output: write error: %s", strerror(EBADF));
    return rc ? rc : 1;
  }
  if (fflush(stdout) != 0 || ferror(stdout)) {
    /* the failed write's errno is long gone (other calls came since): one
     * more byte written straight says why (a full disk, a closed pipe) */
    errno = 0;
    int e = write(STDOUT_FILENO, "\n", 1) < 0 ? errno : 0;
    cli_error("standard output: write error: %s", e ? strerror(e) : "unknown");
    return rc ? rc : 1;
  }
  return rc;
}

/* Standard streams that are closed get /dev/null, so that no file the
 * program opens takes their number (the metrics file, a lock, would get
 * what is printed); closed standard output is still an error at the end. */
static void reserve_std_streams(void) {
  for (int fd = 0; fd <= 2; fd++) {
    if (fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
    int n = open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
    if (n >= 0 && n != fd) {
      dup2(n, fd);
      close(n);
    }
    if (fd == 1) stdout_was_closed = 1;
  }
}

/* OMP_NUM_THREADS sizes every thread's buffers as --threads does: the same
 * range (libgomp took 100000 and crashed creating them); 0 where it is
 * within it or not a number libgomp takes */
static int check_omp_threads(void) {
  const char *v = getenv("OMP_NUM_THREADS");
  if (!v || !*v) return 0;
  char *end;
  errno = 0;
  long long n = strtoll(v, &end, 10);
  if (end == v || errno == ERANGE) return errno == ERANGE ? -1 : 0;
  if (n > cli_max_threads()) return -1;
  return 0;
}

int main(int argc, char **argv) {
  /* write errors are errors, not signals: a closed pipe (EPIPE) or a file
   * past ulimit -f (EFBIG) is reported, temporary files removed, and a run
   * still writes its other outputs */
  signal(SIGPIPE, SIG_IGN);
  signal(SIGXFSZ, SIG_IGN);
  if (check_omp_threads() < 0) {
    cli_error("OMP_NUM_THREADS: '%s' is more than the %d threads this machine takes (as --threads: %d a CPU, at most %d)",
              getenv("OMP_NUM_THREADS"), cli_max_threads(), CLI_THREADS_PER_CPU, CLI_MAX_THREADS);
    return 2;
  }
  reexec_settings(argv);
  reserve_std_streams(); /* (after the re-run, if any: that process is the one to know) */
  /* whole thread teams, whatever OMP_DYNAMIC says, and no more threads than
   * OMP_THREAD_LIMIT allows: OpenBLAS's threaded sgemm (bench's baseline;
   * the library guards its own calls the same way) waits for every thread
   * it asked for, and with fewer it never returns */
  omp_set_dynamic(0);
  int threads = omp_get_max_threads();
  if (omp_get_thread_limit() < threads) threads = omp_get_thread_limit();
  /* by default no more threads than a CPU quota on the process's control
   * group (a container's --cpus) allows: libgomp counts the cores, and
   * threads past the quota only wait for their turn, the others for them
   * at every barrier */
  int quota = getenv("OMP_NUM_THREADS") ? 0 : cli_cpu_quota();
  if (quota > 0 && quota < threads) threads = quota;
  if (threads < omp_get_max_threads()) omp_set_num_threads(threads);
  if (argc < 2) {
    cli_error("no command given (train, eval, grad, summary, bench, report or export; ampc --help says more)");
    usage(stderr);
    return 2;
  }
  if (strcmp(argv[1], "help") == 0 && argc > 3) {
    cli_error("help: unexpected argument '%s' (ampc help COMMAND takes nothing more)", argv[3]);
    return 2;
  }
  if (strcmp(argv[1], "help") == 0 && argc == 3) {
    /* ampc help COMMAND: that command's help */
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
      if (strcmp(argv[2], commands[i].name) == 0) {
        char *hargv[] = {argv[2], "--help", NULL};
        return stdout_done(commands[i].fn(1, hargv + 1));
      }
    cli_error("help: unknown command '%s' (expected train, eval, grad, summary, bench, report or export)", argv[2]);
    return 2;
  }
  if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
    if (argc > 2) {
      cli_error("%s: unexpected argument '%s' (ampc help COMMAND shows a command's options)", argv[1], argv[2]);
      return 2;
    }
    usage(stdout);
    return stdout_done(0);
  }
  if (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "-V") == 0) {
    if (argc > 2) {
      cli_error("%s: unexpected argument '%s'", argv[1], argv[2]);
      return 2;
    }
    const ampc_version_info *v = ampc_version_get();
    printf("ampc %s\nbuild type: %s\nbackends: %s\ncommunicators: %s (MPI: %s)\ncpu paths: %s (this cpu: %s)\n", v->version,
           v->build_type, v->backends, v->comms, strstr(v->comms, "mpi") ? "built" : "not built", v->cpu_paths, v->cpu_path);
    const char *ct = getenv("OPENBLAS_CORETYPE");
    const char *better = ampc_blas_better_core();
    printf("blas: %s, core %s%s%s%s", ampc_blas_name(), ampc_blas_core(), ct ? " (OPENBLAS_CORETYPE=" : "", ct ? ct : "",
           ct ? ")" : "");
    if (better) printf("; this cpu fits its %s kernels (unset OPENBLAS_CORETYPE and kernels that fit are chosen)", better);
    printf("\n");
    /* how long the threads spin at a barrier before they sleep (see reexec_settings) */
    const char *wp = getenv("OMP_WAIT_POLICY"), *sc = getenv("GOMP_SPINCOUNT");
    if (!wp && !sc) printf("openmp: libgomp's default waits\n");
    else printf("openmp: %s%s%s%s%s\n", wp ? "OMP_WAIT_POLICY=" : "", wp ? wp : "", wp && sc ? ", " : "", sc ? "GOMP_SPINCOUNT=" : "", sc ? sc : "");
    return stdout_done(0);
  }
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
    if (strcmp(argv[1], commands[i].name) != 0) continue;
    /* under mpirun, train and bench run data-parallel: one rank each */
    int dist = commands[i].fn == cmd_train || commands[i].fn == cmd_bench;
    if ((dist || ampc_comm_mpi_launched()) && cli_dist_init() < 0) return 1;
    if (!dist && cli_dist_size() > 1) {
      /* the others would each do the whole of it: N copies of one result */
      if (cli_dist_root())
        cli_error("%s runs in one process (train and bench run data-parallel under mpirun); run it without mpirun", commands[i].name);
      cli_dist_finish();
      return 2;
    }
    int rc = commands[i].fn(argc - 2, argv + 2);
    cli_dist_finish();
    return stdout_done(rc);
  }
  cli_error("unknown command '%s' (expected train, eval, grad, summary, bench, report or export; see ampc --help)", argv[1]);
  return 2;
}
