/*
 * emu_nccl.c -- the NCCL calls of src/dist/comm_nccl.c on the host, for the
 * AMPC_CUDA_EMU test build with MPI: a communicator is the ranks of
 * MPI_COMM_WORLD (the emulation's jobs are whole mpirun jobs), device memory
 * is host memory and the emulated streams run everything at once, so every
 * call is a blocking MPI collective on the buffers themselves and a group is
 * its calls one after another (every rank makes them in the same order).
 *
 * Arithmetic as NCCL's: 16-bit sums widen both operands to f32 and round
 * back once per addition; ncclAvg multiplies each rank's values by 1/N
 * rounded to their own type (a 16-bit product of two 16-bit values is exact
 * in f32, so one rounding, as __hmul's) before the sum.
 */
#include <limits.h>
#include <math.h>
#include <mpi.h>
#include <nccl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ampc/dtype.h"

struct ncclComm {
  MPI_Comm comm;
  int rank, size;
};

static MPI_Op ops16[2][3]; /* [f16, bf16][sum, max, min], made at first use */
static int have_ops16;

static void op16(ampc_dtype t, int which, const void *in, void *inout, int len) {
  enum { B = 256 };
  float a[B], b[B];
  const uint16_t *x = in;
  uint16_t *y = inout;
  for (int i = 0; i < len; i += B) {
    size_t k = (size_t)(len - i < B ? len - i : B);
    ampc_load_f32(a, t, x + i, k);
    ampc_load_f32(b, t, y + i, k);
    for (size_t j = 0; j < k; j++) b[j] = which == 0 ? a[j] + b[j] : which == 1 ? fmaxf(a[j], b[j]) : fminf(a[j], b[j]);
    ampc_store_f32(t, y + i, b, k);
  }
}
#define OP16(name, t, w)                                                  \
  static void name(void *in, void *inout, int *len, MPI_Datatype *dt) { \
    (void)dt;                                                            \
    op16(t, w, in, inout, *len);                                         \
  }
OP16(h_sum, AMPC_DTYPE_F16, 0)
OP16(h_max, AMPC_DTYPE_F16, 1)
OP16(h_min, AMPC_DTYPE_F16, 2)
OP16(b_sum, AMPC_DTYPE_BF16, 0)
OP16(b_max, AMPC_DTYPE_BF16, 1)
OP16(b_min, AMPC_DTYPE_BF16, 2)

static size_t type_size(ncclDataType_t t) {
  switch (t) {
    case ncclFloat: return 4;
    case ncclHalf:
    case ncclBfloat16: return 2;
    case ncclUint8:
    case ncclInt8: return 1;
    default: return 0;
  }
}

/* The MPI type and op of an NCCL reduction (AVG: a sum after the scaling). */
static ncclResult_t mpi_of(ncclDataType_t t, ncclRedOp_t op, MPI_Datatype *mt, MPI_Op *mo) {
  int w = op == ncclSum || op == ncclAvg ? 0 : op == ncclMax ? 1 : op == ncclMin ? 2 : -1;
  if (w < 0) return ncclInvalidArgument;
  if (t == ncclFloat) {
    *mt = MPI_FLOAT;
    *mo = w == 0 ? MPI_SUM : w == 1 ? MPI_MAX : MPI_MIN;
    return ncclSuccess;
  }
  if (t != ncclHalf && t != ncclBfloat16) return ncclInvalidArgument;
  if (!have_ops16) {
    MPI_User_function *f[2][3] = {{h_sum, h_max, h_min}, {b_sum, b_max, b_min}};
    for (int i = 0; i < 2; i++)
      for (int j = 0; j < 3; j++)
        if (MPI_Op_create(f[i][j], 1, &ops16[i][j]) != MPI_SUCCESS) return ncclSystemError;
    have_ops16 = 1;
  }
  *mt = MPI_UINT16_T;
  *mo = ops16[t == ncclBfloat16][w];
  return ncclSuccess;
}

/* A copy of n values of send, times 1/size for ncclAvg (malloc'd). */
static void *operand(const void *send, size_t n, ncclDataType_t t, ncclRedOp_t op, int size) {
  size_t es = type_size(t);
  void *p = malloc(n * es + 1);
  if (!p) return NULL;
  memcpy(p, send, n * es);
  if (op != ncclAvg) return p;
  ampc_dtype at = t == ncclFloat ? AMPC_DTYPE_F32 : t == ncclHalf ? AMPC_DTYPE_F16 : AMPC_DTYPE_BF16;
  float f = 1.0f / (float)size, v;
  uint16_t h;
  if (at != AMPC_DTYPE_F32) { /* the factor in the values' own type */
    ampc_store_f32(at, &h, &f, 1);
    ampc_load_f32(&f, at, &h, 1);
  }
  for (size_t i = 0; i < n; i++) {
    ampc_load_f32(&v, at, (char *)p + i * es, 1);
    v *= f;
    ampc_store_f32(at, (char *)p + i * es, &v, 1);
  }
  return p;
}

const char *ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclInvalidArgument: return "invalid argument (emulated NCCL)";
    case ncclSystemError: return "system error (emulated NCCL)";
    default: return "error (emulated NCCL)";
  }
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  memset(id, 0, sizeof *id);
  memcpy(id->internal, "ampc-emu-nccl", 13);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *out, int nranks, ncclUniqueId id, int rank) {
  *out = NULL;
  if (memcmp(id.internal, "ampc-emu-nccl", 13) != 0) return ncclInvalidArgument;
  ncclComm_t c = calloc(1, sizeof *c);
  if (!c) return ncclSystemError;
  if (MPI_Comm_split(MPI_COMM_WORLD, 0, rank, &c->comm) != MPI_SUCCESS) {
    free(c);
    return ncclSystemError;
  }
  MPI_Comm_rank(c->comm, &c->rank);
  MPI_Comm_size(c->comm, &c->size);
  if (c->size != nranks || c->rank != rank) {
    MPI_Comm_free(&c->comm);
    free(c);
    return ncclInvalidArgument;
  }
  *out = c;
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t c) {
  if (c) {
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin) MPI_Comm_free(&c->comm);
    free(c);
  }
  return ncclSuccess;
}
ncclResult_t ncclCommAbort(ncclComm_t c) { return ncclCommDestroy(c); }
ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *r) {
  (void)c;
  *r = ncclSuccess;
  return ncclSuccess;
}
ncclResult_t ncclGroupStart(void) { return ncclSuccess; }
ncclResult_t ncclGroupEnd(void) { return ncclSuccess; }

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t n, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c,
                           cudaStream_t s) {
  MPI_Datatype mt;
  MPI_Op mo;
  ncclResult_t r = mpi_of(t, op, &mt, &mo);
  if (r != ncclSuccess || n > INT_MAX) return r != ncclSuccess ? r : ncclInvalidArgument;
  void *p = operand(send, n, t, op, c->size);
  if (!p) return ncclSystemError;
  int rc = MPI_Allreduce(MPI_IN_PLACE, p, (int)n, mt, mo, c->comm);
  if (rc == MPI_SUCCESS) memcpy(recv, p, n * type_size(t));
  free(p);
  return rc == MPI_SUCCESS ? ncclSuccess : ncclSystemError;
}

ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t n, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c,
                               cudaStream_t s) {
  MPI_Datatype mt;
  MPI_Op mo;
  ncclResult_t r = mpi_of(t, op, &mt, &mo);
  if (r != ncclSuccess || n * (size_t)c->size > INT_MAX) return r != ncclSuccess ? r : ncclInvalidArgument;
  void *p = operand(send, n * (size_t)c->size, t, op, c->size), *q = malloc(n * type_size(t) + 1);
  int rc = p && q ? MPI_Reduce_scatter_block(p, q, (int)n, mt, mo, c->comm) : MPI_ERR_NO_MEM;
  if (rc == MPI_SUCCESS) memcpy(recv, q, n * type_size(t));
  free(p);
  free(q);
  return rc == MPI_SUCCESS ? ncclSuccess : ncclSystemError;
}

ncclResult_t ncclReduce(const void *send, void *recv, size_t n, ncclDataType_t t, ncclRedOp_t op, int root, ncclComm_t c,
                        cudaStream_t s) {
  MPI_Datatype mt;
  MPI_Op mo;
  ncclResult_t r = mpi_of(t, op, &mt, &mo);
  if (r != ncclSuccess || n > INT_MAX) return r != ncclSuccess ? r : ncclInvalidArgument;
  void *p = operand(send, n, t, op, c->size), *q = malloc(n * type_size(t) + 1);
  int rc = p && q ? MPI_Reduce(p, q, (int)n, mt, mo, root, c->comm) : MPI_ERR_NO_MEM;
  if (rc == MPI_SUCCESS && c->rank == root) memcpy(recv, q, n * type_size(t));
  free(p);
  free(q);
  return rc == MPI_SUCCESS ? ncclSuccess : ncclSystemError;
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t n, ncclDataType_t t, int root, ncclComm_t c,
                           cudaStream_t s) {
  size_t b = n * type_size(t);
  if (!type_size(t) || b > INT_MAX) return ncclInvalidArgument;
  if (c->rank == root && send != recv) memmove(recv, send, b);
  return MPI_Bcast(recv, (int)b, MPI_BYTE, root, c->comm) == MPI_SUCCESS ? ncclSuccess : ncclSystemError;
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t n, ncclDataType_t t, ncclComm_t c, cudaStream_t s) {
  size_t b = n * type_size(t);
  if (!type_size(t) || b * (size_t)c->size > INT_MAX) return ncclInvalidArgument;
  void *mine = (char *)recv + (size_t)c->rank * b;
  if (send != mine) memmove(mine, send, b);
  return MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, (int)b, MPI_BYTE, c->comm) == MPI_SUCCESS ? ncclSuccess
                                                                                                             : ncclSystemError;
}
