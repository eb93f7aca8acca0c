#include "dist.h"

#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

static ampc_comm *comm, *nccl;
static cli_error_mode mode = CLI_ERRORS_ALL;
static char held[8192];
static size_t held_len;
static char prefix[32];

int cli_dist_init(void) {
  if (!ampc_comm_mpi_launched()) return 0;
  if (ampc_comm_mpi_create(&comm) < 0) {
    /* built without MPI, every process would train alone: say so */
    cli_lib_error("started by an MPI launcher");
    return -1;
  }
  snprintf(prefix, sizeof prefix, "rank %d: ", ampc_comm_rank(comm));
  if (ampc_comm_size(comm) == 1) prefix[0] = '\0';
  return 0;
}

void cli_dist_finish(void) {
  ampc_comm_free(nccl); /* (before the MPI communicator it borrows) */
  nccl = NULL;
  ampc_comm_free(comm);
  comm = NULL;
}

ampc_comm *cli_dist_comm(void) { return comm && ampc_comm_size(comm) > 1 ? comm : NULL; }
ampc_comm *cli_dist_nccl(void) {
  if (!nccl && cli_dist_comm() && ampc_comm_nccl_create(&nccl, comm) < 0) {
    cli_lib_error("--comm nccl");
    return NULL;
  }
  return nccl;
}
const char *cli_dist_amp_kind(void) { return ampc_comm_kind(nccl ? nccl : comm); }
int cli_dist_rank(void) { return ampc_comm_rank(comm); }
int cli_dist_size(void) { return ampc_comm_size(comm); }
int cli_dist_root(void) { return ampc_comm_rank(comm) == 0; }

int cli_dist_default_threads(void) {
  if (cli_dist_size() < 2) return 0;
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  int local = ampc_comm_local_size(comm);
  int t = (int)(cpus > 0 ? cpus : 1) / (local > 0 ? local : 1);
  /* a rank bound to fewer cores (mpirun --bind-to) takes those */
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0 && CPU_COUNT(&set) < t) t = CPU_COUNT(&set);
  /* and the machine's ranks share a control group's CPU quota (a container's) */
  int quota = cli_cpu_quota(), share = quota / (local > 0 ? local : 1);
  if (share < 1) share = 1;
  if (quota > 0 && share < t) t = share;
  return t > 0 ? t : 1;
}

void cli_dist_error_mode(cli_error_mode m) {
  mode = m;
  held_len = 0;
}

int cli_dist_error_route(const char **pre, const char *line) {
  *pre = "";
  if (cli_dist_size() < 2) return 1;
  switch (mode) {
    case CLI_ERRORS_ROOT: return cli_dist_root();
    case CLI_ERRORS_HOLD: {
      size_t n = strlen(line);
      if (held_len + n + 1 < sizeof held) {
        memcpy(held + held_len, line, n);
        held_len += n;
        held[held_len++] = '\n';
        held[held_len] = '\0';
      }
      return 0;
    }
    case CLI_ERRORS_ALL: break;
  }
  *pre = prefix;
  return 1;
}

/* Set once the ranks have agreed that one failed: the job is ending, and a
 * rank that learnt it at a check of its own does not call another (the
 * failing rank's one call at its clean-up was the one that matched it). */
static int job_failed;

int cli_dist_agree(int ok) {
  cli_error_mode was = mode;
  mode = CLI_ERRORS_ALL;
  if (cli_dist_size() < 2) return ok;
  if (job_failed) return 0;
  int rank = cli_dist_rank();
  double v = ok ? (double)cli_dist_size() : (double)rank;
  if (ampc_comm_allreduce_host(comm, &v, 1, AMPC_COMM_MIN) < 0) {
    cli_lib_error(NULL);
    cli_dist_abort(1);
    return 0;
  }
  int first = (int)v;
  if (first < cli_dist_size() && first == rank && was == CLI_ERRORS_HOLD && held_len) {
    /* the held lines, each with this rank */
    for (char *line = held, *nl; (nl = strchr(line, '\n')); line = nl + 1) {
      *nl = '\0';
      fprintf(stderr, "ampc: error: %s%s\n", prefix, line);
    }
  }
  held_len = 0;
  if (first != cli_dist_size()) job_failed = 1;
  return first == cli_dist_size();
}

void cli_dist_abort(int code) {
  if (!cli_dist_comm()) return;
  fflush(stdout);
  fflush(stderr);
  ampc_comm_abort(comm, code);
}

/* MIN and MAX of n values over the ranks (lo, hi); -1 where the collective fails. */
static int min_max(const double *v, double *lo, double *hi, size_t n) {
  memcpy(lo, v, n * sizeof *v);
  memcpy(hi, v, n * sizeof *v);
  if (ampc_comm_allreduce_host(comm, lo, n, AMPC_COMM_MIN) < 0 || ampc_comm_allreduce_host(comm, hi, n, AMPC_COMM_MAX) < 0) {
    cli_lib_error(NULL);
    return -1;
  }
  return 0;
}

int cli_dist_parse_agree(int pr) {
  if (cli_dist_size() < 2) return pr;
  double v[2] = {pr, pr < 0 ? cli_dist_rank() : cli_dist_size()}, lo[2], hi[2];
  if (min_max(v, lo, hi, 2) < 0) return -1;
  if (lo[0] == hi[0]) return pr;
  if (cli_dist_root() && lo[0] < 0)
    cli_error("the ranks were started with different command lines: rank %d's has an error (run it alone to see it); start "
              "every rank with the same options", (int)lo[1]);
  else if (cli_dist_root())
    cli_error("the ranks were started with different command lines: one asks for --help; start every rank with the same options");
  return -1;
}

uint64_t cli_hash_bytes(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = p;
  for (; n >= 8; n -= 8, b += 8) {
    uint64_t w;
    memcpy(&w, b, 8);
    h = (h ^ w) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 29;
  }
  for (; n > 0; n--, b++) h = (h ^ *b) * 1099511628211ull; /* (FNV-1a's prime) */
  return h;
}

int cli_dist_same_options(const cli_opt *opts) {
  if (cli_dist_size() < 2) return 1;
  enum { MAX_OPTS = 160 };
  double v[MAX_OPTS + 1], lo[MAX_OPTS + 1], hi[MAX_OPTS + 1];
  int n = 0;
  while (opts[n].name && n < MAX_OPTS) n++;
  v[0] = n; /* (another build's table) */
  for (int i = 0; i < n; i++) {
    const cli_opt *o = &opts[i];
    uint64_t h = CLI_HASH_START;
    int path = o->meta && (strstr(o->meta, "FILE") || strstr(o->meta, "DIR")),
        local = path || !strcmp(o->name, "--threads") || !strcmp(o->name, "--quiet");
    /* a path may differ between hosts, but not be given on some ranks alone:
     * the ranks would save, resume or log at different points, and the
     * collectives of one would wait for the others' forever */
    if (path && o->kind == OPT_STRING && strcmp(o->name, "--data") != 0) h = cli_hash_bytes(h, *(const char *const *)o->dest ? "1" : "0", 1);
    if (!local) switch (o->kind) {
        case OPT_FLAG:
        case OPT_INT:
        case OPT_ONOFF: h = cli_hash_bytes(h, o->dest, sizeof(int)); break;
        case OPT_I64: h = cli_hash_bytes(h, o->dest, sizeof(int64_t)); break;
        case OPT_FLOAT: h = cli_hash_bytes(h, o->dest, sizeof(float)); break;
        case OPT_STRING: {
          const char *s = *(const char *const *)o->dest;
          h = s ? cli_hash_bytes(h, s, strlen(s) + 1) : cli_hash_bytes(h, "", 0) + 1;
          break;
        }
      }
    v[i + 1] = (double)(h >> 12);
  }
  if (min_max(v, lo, hi, (size_t)n + 1) < 0) return 0;
  if (lo[0] != hi[0]) {
    cli_error("the ranks run different builds of ampc (their options differ): start every rank with the same program");
    return 0;
  }
  for (int i = 0; i < n; i++)
    if (lo[i + 1] != hi[i + 1]) {
      const cli_opt *o = &opts[i];
      if (o->meta && (strstr(o->meta, "FILE") || strstr(o->meta, "DIR")) && o->kind == OPT_STRING)
        cli_error("%s is given on some ranks and not on others (%s here): give it to every rank or to none (its path may differ "
                  "between hosts)", o->name, *(const char *const *)o->dest ? "given" : "not given");
      else
        cli_error("%s is not the same on every rank: start every rank with the same options (only FILE and DIR paths, "
                  "--threads and --quiet may differ)", o->name);
      return 0;
    }
  return 1;
}

int cli_dist_same_values(const double *v, const char *const *names, int n) {
  if (cli_dist_size() < 2) return 1;
  double lo[16], hi[16];
  if (n > 16) n = 16;
  if (min_max(v, lo, hi, (size_t)n) < 0) return 0;
  for (int i = 0; i < n; i++)
    if (lo[i] != hi[i]) {
      cli_error("the ranks differ in %s (%.17g on this rank, %.17g on another): every rank must see the same data and checkpoint",
                names[i], v[i], v[i] == lo[i] ? hi[i] : lo[i]);
      return 0;
    }
  return 1;
}
