/* Communicators: the generic part, and the collectives a kind leaves out
 * built from its blocking all-reduce. */
#include <stdlib.h>

#include "ampc/config.h"
#include "core/status_internal.h"
#include "dist/comm_internal.h"

void ampc_comm_free(ampc_comm *c) {
  if (c) c->ops->free(c);
}
int ampc_comm_rank(const ampc_comm *c) { return c ? c->rank : 0; }
int ampc_comm_size(const ampc_comm *c) { return c ? c->size : 1; }
int ampc_comm_local_rank(const ampc_comm *c) { return c ? c->local_rank : 0; }
int ampc_comm_local_size(const ampc_comm *c) { return c ? c->local_size : 1; }
const char *ampc_comm_kind(const ampc_comm *c) { return c ? c->ops->name : "none"; }

ampc_status ampc_comm_allreduce_host(ampc_comm *c, double *values, size_t n, ampc_comm_op op) {
  if (op != AMPC_COMM_SUM && op != AMPC_COMM_MAX && op != AMPC_COMM_MIN) return ampc__error(AMPC_EINVAL, "comm: unknown reduction %d", (int)op);
  if (n > 0 && !values) return ampc__error(AMPC_EINVAL, "ampc_comm_allreduce_host: values is NULL");
  if (!c || c->size == 1 || n == 0) return AMPC_OK; /* (no communicator: one process, nothing to reduce) */
  ampc__reduce_op r = op == AMPC_COMM_SUM ? AMPC__REDUCE_SUM : op == AMPC_COMM_MAX ? AMPC__REDUCE_MAX : AMPC__REDUCE_MIN;
  return c->ops->allreduce_host(c, values, n, r);
}

void ampc_comm_abort(ampc_comm *c, int code) {
  if (c && c->size > 1 && c->ops->abort) c->ops->abort(c, code);
}

int ampc_comm_mpi_launched(void) {
  /* Open MPI's mpirun, and the PMI / PMIx of Slurm, MPICH's hydra, ... */
  static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE", "MPI_LOCALNRANKS"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
    if (getenv(vars[i])) return 1;
  return 0;
}

#ifndef AMPC_HAVE_MPI
ampc_status ampc_comm_mpi_create(ampc_comm **out) {
  if (!out) return ampc__error(AMPC_EINVAL, "ampc_comm_mpi_create: out is NULL");
  *out = NULL;
  return ampc__error(AMPC_EUNSUPPORTED, "comm: this libampc was built without MPI (configure with an MPI installed, -DAMPC_MPI=ON)");
}
ampc_status ampc_comm_mpi_create_from(ampc_comm **out, const void *mpi_comm) {
  (void)mpi_comm;
  return ampc_comm_mpi_create(out);
}
#endif

#ifndef AMPC_HAVE_NCCL
ampc_status ampc_comm_nccl_create(ampc_comm **out, ampc_comm *mpi) {
  (void)mpi;
  if (!out) return ampc__error(AMPC_EINVAL, "ampc_comm_nccl_create: out is NULL");
  *out = NULL;
  return ampc__error(AMPC_EUNSUPPORTED, "comm: this libampc was built without NCCL (it needs the CUDA backend, MPI, "
                                        "and nccl.h / libnccl beside the CUDA toolkit)");
}
#endif

/* ---- the generic collectives ---- */

ampc_status ampc__comm_ireduce(ampc_comm *c, ampc__device *d, void *buf, ampc_dtype t, size_t n, const size_t *counts,
                               ampc__reduce_op op, ampc__comm_req **req) {
  *req = NULL;
  if (c->ops->ireduce) return c->ops->ireduce(c, d, buf, t, n, counts, op, req);
  /* a reduce-scatter may give every rank everything */
  return c->ops->allreduce(c, d, buf, t, n, op);
}

ampc_status ampc__comm_test(ampc_comm *c, ampc__comm_req *req, int *done) {
  if (!req) {
    *done = 1;
    return AMPC_OK;
  }
  return c->ops->test(c, req, done);
}

ampc_status ampc__comm_wait(ampc_comm *c, ampc__comm_req *req) { return req ? c->ops->wait(c, req) : AMPC_OK; }

ampc_status ampc__comm_allgather(ampc_comm *c, ampc__device *d, void *buf, ampc_dtype t, const size_t *counts) {
  if (c->ops->allgather) return c->ops->allgather(c, d, buf, t, counts);
  /* everyone's block summed with zeros elsewhere: exact in every type */
  size_t es = ampc_dtype_size(t), at = 0, n = 0;
  for (int r = 0; r < c->size; r++) n += counts[r];
  for (int r = 0; r < c->size; r++) {
    if (r != c->rank) AMPC_TRY(ampc__dev_set(d, (char *)buf + at * es, 0, counts[r] * es));
    at += counts[r];
  }
  return c->ops->allreduce(c, d, buf, t, n, AMPC__REDUCE_SUM);
}
