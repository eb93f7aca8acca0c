/* Internal: the communicator interface the amp step calls. Each kind (the
 * in-process one, MPI; NCCL with the CUDA backend) fills a table of
 * collectives over device buffers. The optional entries may be NULL: the
 * generic versions below then build them from the blocking all-reduce, so a
 * new kind starts with three functions and grows non-blocking and sharded
 * collectives when it wants overlap and ZeRO to cost what they should.
 *
 * Device buffers are memory of the device d the call names, typed t (f32,
 * f16 or bf16): a kind may hand them to its transport directly where the
 * device's memory is host memory (the cpu backend) or the transport reads
 * device memory (NCCL), and otherwise copies through the device's read and
 * write calls. */
#ifndef AMPC_DIST_COMM_INTERNAL_H
#define AMPC_DIST_COMM_INTERNAL_H

#include "ampc/comm.h"
#include "backend/backend.h"

typedef enum { AMPC__REDUCE_SUM, AMPC__REDUCE_MAX, AMPC__REDUCE_AVG, AMPC__REDUCE_MIN } ampc__reduce_op;

/* One collective in flight (the kind's own). */
typedef struct ampc__comm_req ampc__comm_req;

typedef struct {
  const char *name;
  /* n elements of type t in device memory of d, reduced across the ranks
   * in place (AVG: each rank's values divided by the size in their own
   * type, then summed -- so that a 16-bit sum cannot overflow where the
   * mean would not) */
  ampc_status (*allreduce)(ampc_comm *c, ampc__device *d, void *buf, ampc_dtype t, size_t n, ampc__reduce_op op);
  /* n doubles in host memory, reduced in place */
  ampc_status (*allreduce_host)(ampc_comm *c, double *buf, size_t n, ampc__reduce_op op);

  /* -- optional -- */
  /* Starts reducing n elements at buf with SUM or AVG, in place. counts
   * NULL: an all-reduce, every rank gets all n results. counts (one per
   * rank, summing to n): a reduce-scatter, rank r's block -- counts[r]
   * elements after those of the ranks before it -- gets its results, the
   * rest of buf is left as it is or undefined. buf must stay untouched
   * until the request completes; counts may change once this returns.
   * *req: NULL if it completed already. */
  ampc_status (*ireduce)(ampc_comm *c, ampc__device *d, void *buf, ampc_dtype t, size_t n, const size_t *counts,
                         ampc__reduce_op op, ampc__comm_req **req);
  /* Progress: *done = 1 once req has completed (it is then released). */
  ampc_status (*test)(ampc_comm *c, ampc__comm_req *req, int *done);
  /* Until req completes (then released). */
  ampc_status (*wait)(ampc_comm *c, ampc__comm_req *req);
  /* In place: rank r's block of buf (counts[r] elements, as for ireduce)
   * copied to every rank. */
  ampc_status (*allgather)(ampc_comm *c, ampc__device *d, void *buf, ampc_dtype t, const size_t *counts);
  /* Ends every rank of the job with exit status code. */
  void (*abort)(ampc_comm *c, int code);

  void (*free)(ampc_comm *c);
} ampc__comm_ops;

struct ampc_comm {
  const ampc__comm_ops *ops;
  int rank, size;
  int local_rank, local_size; /* among the ranks of this machine */
  void *impl;
};

/* The collectives as the amp layer calls them: a kind's own, or the
 * generic versions (blocking, built on allreduce). */
ampc_status ampc__comm_ireduce(ampc_comm *c, ampc__device *d, void *buf, ampc_dtype t, size_t n, const size_t *counts,
                               ampc__reduce_op op, ampc__comm_req **req);
ampc_status ampc__comm_test(ampc_comm *c, ampc__comm_req *req, int *done);
ampc_status ampc__comm_wait(ampc_comm *c, ampc__comm_req *req);
ampc_status ampc__comm_allgather(ampc_comm *c, ampc__device *d, void *buf, ampc_dtype t, const size_t *counts);

/* Rank r's block of a flat range of n elements cut into size blocks of
 * ceil(n / size): [*lo, *hi). */
static inline void ampc__comm_block(size_t n, int size, int r, size_t *lo, size_t *hi) {
  size_t per = (n + (size_t)size - 1) / (size_t)size, a = per * (size_t)r, b = a + per;
  *lo = a < n ? a : n;
  *hi = b < n ? b : n;
}

#endif
