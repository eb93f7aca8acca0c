/* Internal: the communicator interface the amp step calls. Each kind (the
 * in-process one here, MPI and NCCL later) fills a table of collectives. */
#ifndef AMPC_DIST_COMM_INTERNAL_H
#define AMPC_DIST_COMM_INTERNAL_H

#include "ampc/comm.h"
#include "backend/backend.h"

typedef enum { AMPC__REDUCE_SUM, AMPC__REDUCE_MAX, AMPC__REDUCE_AVG } ampc__reduce_op;

typedef struct {
  const char *name;
  /* n elements of type t in device memory of d, reduced across the ranks
   * in place (AVG: each rank's values divided by the size, then summed) */
  ampc_status (*allreduce)(ampc_comm *c, ampc__device *d, void *buf, ampc_dtype t, size_t n, ampc__reduce_op op);
  /* n doubles in host memory, reduced in place */
  ampc_status (*allreduce_host)(ampc_comm *c, double *buf, size_t n, ampc__reduce_op op);
  void (*free)(ampc_comm *c);
} ampc__comm_ops;

struct ampc_comm {
  const ampc__comm_ops *ops;
  int rank, size;
  void *impl;
};

#endif
