/* The NCCL communicator: the ranks of an MPI communicator, their device
 * collectives over NCCL on the cuda backend's GPUs.
 *
 * Built with the CUDA backend where MPI and NCCL are found. The MPI
 * communicator it is made from is borrowed: rank 0's ncclUniqueId reaches the
 * other ranks through its host all-reduce (128 bytes as doubles, rank 0's
 * values summed with the others' zeros: exact), and it carries every host
 * all-reduce (found_inf, the gradient norm, SyncBN's statistics) and the
 * abort. The NCCL communicator proper is made at the first device
 * collective, on the GPU of the device that collective names (every rank
 * reaches it at the same collective, as every rank makes the same calls);
 * later collectives must name the same GPU.
 *
 * Every collective runs on the compute stream of the device it names, so it
 * starts after the kernels that wrote its buffer (backward's) and whatever
 * reads the results later comes after it: the host never waits for one. A
 * request is an event recorded on that stream after the collective: test
 * asks the event (cudaEventQuery) and NCCL's asynchronous error; wait only
 * releases the request -- everything that reads the buffer is ordered after
 * the collective on the same stream, so blocking the host there would only
 * add a synchronisation.
 *
 * Reductions: f32, f16 and bf16 in NCCL's types, SUM, MAX, MIN and AVG. AVG
 * is ncclAvg, which multiplies every rank's values by 1/N in their own type
 * before the sum -- the MPI communicator's semantics (the sum cannot overflow
 * where the mean would not). For a power-of-two N the two agree bit for bit
 * given the same order of additions; for another N NCCL rounds 1/N to the
 * 16-bit type first, which can move a result by an ulp.
 *
 * Reduce-scatter (counts given): ncclReduceScatter in place where every
 * rank's block has the same size, else one ncclReduce per rank onto that
 * rank, in one group. The all-gather likewise: ncclAllGather in place, or one
 * ncclBroadcast per rank in a group. NCCL's errors come back as AMPC_ECOMM
 * with its message. */
#include <nccl.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_internal.h"
#include "core/status_internal.h"
#include "dist/comm_internal.h"

enum { NCCL_MAX_REQS = 64 };

struct ampc__comm_req {
  cudaEvent_t ev;
  int used;
};

typedef struct {
  ampc_comm *mpi;     /* borrowed */
  ncclUniqueId id;    /* rank 0's, on every rank */
  ncclComm_t nc;      /* NULL until the first device collective */
  int gpu;            /* its GPU */
  int broken;         /* the communicator failed: every later collective too */
  struct ampc__comm_req req[NCCL_MAX_REQS];
} nccl_comm;

static ampc_status nccl_fail(ncclResult_t r, const char *what) {
  return ampc__error(AMPC_ECOMM, "nccl: %s: %s", what, ncclGetErrorString(r));
}
#define NCCL_TRY(call, what)                                   \
  do {                                                         \
    ncclResult_t r_ = (call);                                  \
    if (r_ != ncclSuccess) return nccl_fail(r_, what);         \
  } while (0)

static ampc_status nccl_types(ampc_dtype t, ampc__reduce_op op, ncclDataType_t *nt, ncclRedOp_t *no) {
  switch (t) {
    case AMPC_DTYPE_F32: *nt = ncclFloat; break;
    case AMPC_DTYPE_F16: *nt = ncclHalf; break;
    case AMPC_DTYPE_BF16: *nt = ncclBfloat16; break;
    default: return ampc__error(AMPC_EUNSUPPORTED, "nccl: no reduction of %s values", ampc_dtype_name(t));
  }
  *no = op == AMPC__REDUCE_SUM ? ncclSum : op == AMPC__REDUCE_MAX ? ncclMax : op == AMPC__REDUCE_MIN ? ncclMin : ncclAvg;
  return AMPC_OK;
}

/* The stream of d for a collective: d is a cuda device on this
 * communicator's GPU (the communicator made now if this is the first), and
 * the op calls d deferred into a CUDA graph have been issued. */
static ampc_status prepare(ampc_comm *c, ampc__device *d, cudaStream_t *s) {
  nccl_comm *m = c->impl;
  if (strcmp(d->be->name, "cuda") != 0)
    return ampc__error(AMPC_EINVAL, "nccl: collectives on the memory of cuda devices only, not %s", d->be->name);
  if (m->broken) return ampc__error(AMPC_ECOMM, "nccl: the communicator failed earlier");
  ampc__cuda_dev *cd = ampc__cu_of(d);
  if (m->nc && cd->dev != m->gpu)
    return ampc__error(AMPC_EINVAL, "nccl: a collective on GPU %d, but this rank's communicator is on GPU %d", cd->dev,
                       m->gpu);
  AMPC_TRY(ampc__cu_graph_flush(d));
  AMPC_CU_TRY(cudaSetDevice(cd->dev), "cudaSetDevice");
  if (!m->nc) {
    ncclResult_t r = ncclCommInitRank(&m->nc, c->size, m->id, c->rank);
    if (r != ncclSuccess) {
      m->nc = NULL;
      m->broken = 1;
      return ampc__error(AMPC_ECOMM, "nccl: ncclCommInitRank (rank %d of %d, GPU %d): %s", c->rank, c->size, cd->dev,
                         ncclGetErrorString(r));
    }
    m->gpu = cd->dev;
  }
  *s = cd->stream;
  return AMPC_OK;
}

/* A free request, its event recorded on s now. */
static ampc_status record(nccl_comm *m, cudaStream_t s, ampc__comm_req **req) {
  struct ampc__comm_req *q = NULL;
  for (int i = 0; i < NCCL_MAX_REQS && !q; i++)
    if (!m->req[i].used) q = &m->req[i];
  if (!q) return ampc__error(AMPC_ESTATE, "nccl: more than %d collectives in flight", NCCL_MAX_REQS);
  if (!q->ev) AMPC_CU_TRY(cudaEventCreateWithFlags(&q->ev, cudaEventDisableTiming), "cudaEventCreateWithFlags");
  AMPC_CU_TRY(cudaEventRecord(q->ev, s), "cudaEventRecord");
  q->used = 1;
  *req = q;
  return AMPC_OK;
}

/* The end of a group whose calls stopped at the first error (which wins). */
static ampc_status group_end(ncclResult_t r, const char *what) {
  ncclResult_t e = ncclGroupEnd();
  if (r != ncclSuccess) return nccl_fail(r, what);
  if (e != ncclSuccess) return nccl_fail(e, "ncclGroupEnd");
  return AMPC_OK;
}

/* 1 if every rank's count is the same. */
static int even(const ampc_comm *c, const size_t *counts) {
  for (int r = 1; r < c->size; r++)
    if (counts[r] != counts[0]) return 0;
  return 1;
}

static ampc_status nccl_ireduce(ampc_comm *c, ampc__device *d, void *buf, ampc_dtype t, size_t n, const size_t *counts,
                                ampc__reduce_op op, ampc__comm_req **req) {
  nccl_comm *m = c->impl;
  *req = NULL;
  if (n == 0) return AMPC_OK;
  if (op != AMPC__REDUCE_SUM && op != AMPC__REDUCE_AVG && counts)
    return ampc__error(AMPC_EINVAL, "nccl: a reduce-scatter sums or averages");
  ncclDataType_t nt = ncclFloat;
  ncclRedOp_t no = ncclSum;
  AMPC_TRY(nccl_types(t, op, &nt, &no));
  size_t es = ampc_dtype_size(t);
  if (counts) {
    size_t total = 0;
    for (int r = 0; r < c->size; r++) total += counts[r];
    if (total != n) return ampc__error(AMPC_EINVAL, "nccl: reduce-scatter blocks of %zu values in all, not %zu", total, n);
  }
  cudaStream_t s;
  AMPC_TRY(prepare(c, d, &s));
  char *p = buf;
  if (!counts) {
    NCCL_TRY(ncclAllReduce(p, p, n, nt, no, m->nc, s), "ncclAllReduce");
  } else if (even(c, counts)) {
    /* in place: this rank's block of the send buffer receives */
    NCCL_TRY(ncclReduceScatter(p, p + (size_t)c->rank * counts[0] * es, counts[0], nt, no, m->nc, s), "ncclReduceScatter");
  } else {
    NCCL_TRY(ncclGroupStart(), "ncclGroupStart");
    ncclResult_t r = ncclSuccess;
    size_t at = 0;
    for (int root = 0; root < c->size && r == ncclSuccess; root++) {
      if (counts[root]) r = ncclReduce(p + at * es, p + at * es, counts[root], nt, no, root, m->nc, s);
      at += counts[root];
    }
    AMPC_TRY(group_end(r, "ncclReduce"));
  }
  return record(m, s, req);
}

static ampc_status async_error(nccl_comm *m) {
  ncclResult_t ae = ncclSuccess;
  NCCL_TRY(ncclCommGetAsyncError(m->nc, &ae), "ncclCommGetAsyncError");
  if (ae != ncclSuccess && ae != ncclInProgress) {
    m->broken = 1;
    return nccl_fail(ae, "a collective in flight");
  }
  return AMPC_OK;
}

static ampc_status nccl_test(ampc_comm *c, ampc__comm_req *q, int *done) {
  nccl_comm *m = c->impl;
  *done = 0;
  cudaError_t e = cudaEventQuery(q->ev);
  if (e == cudaErrorNotReady) return async_error(m);
  q->used = 0;
  AMPC_CU_TRY(e, "cudaEventQuery");
  *done = 1;
  return async_error(m);
}

/* Stream order completes it for everything that reads the buffer. */
static ampc_status nccl_wait(ampc_comm *c, ampc__comm_req *q) {
  q->used = 0;
  return async_error(c->impl);
}

static ampc_status nccl_allreduce(ampc_comm *c, ampc__device *d, void *buf, ampc_dtype t, size_t n, ampc__reduce_op op) {
  ampc__comm_req *q;
  AMPC_TRY(nccl_ireduce(c, d, buf, t, n, NULL, op, &q));
  return q ? nccl_wait(c, q) : AMPC_OK;
}

static ampc_status nccl_allgather(ampc_comm *c, ampc__device *d, void *buf, ampc_dtype t, const size_t *counts) {
  nccl_comm *m = c->impl;
  size_t es = ampc_dtype_size(t), total = 0;
  for (int r = 0; r < c->size; r++) total += counts[r];
  if (total == 0) return AMPC_OK;
  cudaStream_t s;
  AMPC_TRY(prepare(c, d, &s));
  char *p = buf;
  /* (bytes: a copy needs no arithmetic type) */
  if (even(c, counts)) {
    size_t b = counts[0] * es;
    NCCL_TRY(ncclAllGather(p + (size_t)c->rank * b, p, b, ncclUint8, m->nc, s), "ncclAllGather");
  } else {
    NCCL_TRY(ncclGroupStart(), "ncclGroupStart");
    ncclResult_t r = ncclSuccess;
    size_t at = 0;
    for (int root = 0; root < c->size && r == ncclSuccess; root++) {
      if (counts[root]) r = ncclBroadcast(p + at * es, p + at * es, counts[root] * es, ncclUint8, root, m->nc, s);
      at += counts[root];
    }
    AMPC_TRY(group_end(r, "ncclBroadcast"));
  }
  return async_error(m);
}

static ampc_status nccl_allreduce_host(ampc_comm *c, double *buf, size_t n, ampc__reduce_op op) {
  nccl_comm *m = c->impl;
  return m->mpi->ops->allreduce_host(m->mpi, buf, n, op);
}

static void nccl_abort(ampc_comm *c, int code) {
  nccl_comm *m = c->impl;
  if (m->nc) ncclCommAbort(m->nc), m->nc = NULL;
  if (m->mpi->ops->abort) m->mpi->ops->abort(m->mpi, code);
}

static void nccl_free(ampc_comm *c) {
  nccl_comm *m = c->impl;
  for (int i = 0; i < NCCL_MAX_REQS; i++)
    if (m->req[i].ev) {
      if (m->nc) cudaEventSynchronize(m->req[i].ev);
      cudaEventDestroy(m->req[i].ev);
    }
  if (m->nc) {
    cudaSetDevice(m->gpu);
    if (m->broken) ncclCommAbort(m->nc);
    else ncclCommDestroy(m->nc);
  }
  free(m);
  free(c);
}

static const ampc__comm_ops nccl_ops = {
    .name = "nccl",
    .allreduce = nccl_allreduce,
    .allreduce_host = nccl_allreduce_host,
    .ireduce = nccl_ireduce,
    .test = nccl_test,
    .wait = nccl_wait,
    .allgather = nccl_allgather,
    .abort = nccl_abort,
    .free = nccl_free,
};

ampc_status ampc_comm_nccl_create(ampc_comm **out, ampc_comm *mpi) {
  if (!out) return ampc__error(AMPC_EINVAL, "ampc_comm_nccl_create: out is NULL");
  *out = NULL;
  if (!mpi || strcmp(mpi->ops->name, "mpi") != 0)
    return ampc__error(AMPC_EINVAL, "nccl: made from an MPI communicator (ampc_comm_mpi_create), not %s",
                       mpi ? mpi->ops->name : "NULL");
  /* rank 0's id to every rank, with whether it has one: 128 bytes as
   * doubles, summed with the other ranks' zeros */
  enum { IDB = (int)sizeof(ncclUniqueId) };
  double v[IDB + 1];
  memset(v, 0, sizeof v);
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  ncclResult_t r = ncclSuccess;
  if (mpi->rank == 0) {
    r = ncclGetUniqueId(&id);
    for (int i = 0; i < IDB; i++) v[i] = (double)((const unsigned char *)&id)[i];
    v[IDB] = r != ncclSuccess;
  }
  AMPC_TRY(mpi->ops->allreduce_host(mpi, v, IDB + 1, AMPC__REDUCE_SUM));
  if (r != ncclSuccess) return nccl_fail(r, "ncclGetUniqueId");
  if (v[IDB] != 0.0) return ampc__error(AMPC_ECOMM, "nccl: rank 0 could not make the communicator's id (ncclGetUniqueId)");
  ampc_comm *c = calloc(1, sizeof *c);
  nccl_comm *m = calloc(1, sizeof *m);
  if (!c || !m) {
    free(c), free(m);
    return ampc__error(AMPC_ENOMEM, "nccl: out of memory");
  }
  for (int i = 0; i < IDB; i++) ((unsigned char *)&m->id)[i] = (unsigned char)v[i];
  m->mpi = mpi;
  m->gpu = -1;
  *c = (ampc_comm){&nccl_ops, mpi->rank, mpi->size, mpi->local_rank, mpi->local_size, m};
  *out = c;
  return AMPC_OK;
}
