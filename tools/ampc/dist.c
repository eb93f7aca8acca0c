#include "dist.h"

#include <sched.h>
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

int cli_dist_agree(int ok) {
  cli_error_mode was = mode;
  mode = CLI_ERRORS_ALL;
  if (cli_dist_size() < 2) return ok;
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
  return first == cli_dist_size();
}

void cli_dist_abort(int code) {
  if (!cli_dist_comm()) return;
  fflush(stdout);
  fflush(stderr);
  ampc_comm_abort(comm, code);
}
