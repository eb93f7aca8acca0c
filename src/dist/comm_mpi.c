/* The MPI communicator: one process per rank, collectives over MPI.
 *
 * Device buffers whose memory is host memory (the cpu backend) are handed to
 * MPI in place, as a CUDA-aware MPI is handed device memory; any other
 * device's are copied to a host buffer through its read call and back
 * through its write call (the guarded backend, or a GPU without NCCL).
 *
 * MPI has no 16-bit float types: f16 and bf16 buffers travel as MPI_UINT16_T
 * and are summed by user-defined reductions that widen a block of each
 * operand to f32 with the library's vectorised conversions, add, and round
 * back -- so a 16-bit all-reduce sends half the bytes of an f32 one and
 * rounds once per addition, as an f16 all-reduce on a GPU does. AVG divides
 * every rank's values by the size in their own type before the sum (torch's
 * fp16 compression hook does the same), so the sum cannot overflow where the
 * mean would not; for a power-of-two size that division is exact.
 *
 * Non-blocking collectives (MPI_Iallreduce, MPI_Ireduce_scatter) come from a
 * small pool of requests whose staging memory is kept from one step to the
 * next: after the first step a collective allocates nothing. Open MPI moves
 * a non-blocking collective forward only inside MPI calls, which is why the
 * amp layer tests its requests between backward's ops.
 *
 * Errors of MPI calls come back (MPI_ERRORS_RETURN on the communicator) as
 * AMPC_ECOMM with MPI's own message. */
#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status_internal.h"
#include "dist/comm_internal.h"

enum { MPI_MAX_REQS = 64, SUM16_BLOCK = 512 };

struct ampc__comm_req {
  MPI_Request r;
  int used;
  ampc__device *d;
  void *dev;        /* the device buffer */
  void *host;       /* what MPI works on: dev itself, or stage */
  int staged;
  ampc_dtype t;
  size_t n;
  int scatter;      /* reduce-scatter: MPI writes this rank's block into recv */
  size_t my_off, my_n;
  void *recv, *stage;
  size_t recv_cap, stage_cap;
  int *counts;      /* per rank, for MPI (kept until completion) */
};

typedef struct {
  MPI_Comm comm;
  int finalize;     /* MPI_Init was ours */
  MPI_Op sum_f16, sum_bf16;
  int *counts, *displs; /* per rank, for the blocking all-gather */
  void *gstage;         /* its staging buffer (devices without host memory) */
  size_t gstage_cap;
  struct ampc__comm_req req[MPI_MAX_REQS];
} mpi_comm;

static ampc_status mpi_fail(int rc, const char *what) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "MPI error %d", rc);
  return ampc__error(AMPC_ECOMM, "mpi: %s: %s", what, msg);
}
#define MPI_TRY(call, what)               \
  do {                                    \
    int rc_ = (call);                     \
    if (rc_ != MPI_SUCCESS) return mpi_fail(rc_, what); \
  } while (0)

/* ---- 16-bit sums ---- */

static void sum16(ampc_dtype t, const void *in, void *inout, int len) {
  float a[SUM16_BLOCK], b[SUM16_BLOCK];
  const uint16_t *x = in;
  uint16_t *y = inout;
  for (int i = 0; i < len; i += SUM16_BLOCK) {
    size_t k = (size_t)(len - i < SUM16_BLOCK ? len - i : SUM16_BLOCK);
    ampc_load_f32(a, t, x + i, k);
    ampc_load_f32(b, t, y + i, k);
    for (size_t j = 0; j < k; j++) b[j] += a[j];
    ampc_store_f32(t, y + i, b, k);
  }
}
static void sum_f16(void *in, void *inout, int *len, MPI_Datatype *dt) {
  (void)dt;
  sum16(AMPC_DTYPE_F16, in, inout, *len);
}
static void sum_bf16(void *in, void *inout, int *len, MPI_Datatype *dt) {
  (void)dt;
  sum16(AMPC_DTYPE_BF16, in, inout, *len);
}

/* x *= f in place, in x's own type (the AVG's division before the sum). */
static void scale(void *x, ampc_dtype t, size_t n, float f) {
  if (t == AMPC_DTYPE_F32) {
    float *p = x;
    for (size_t i = 0; i < n; i++) p[i] *= f;
    return;
  }
  float a[SUM16_BLOCK];
  uint16_t *p = x;
  for (size_t i = 0; i < n; i += SUM16_BLOCK) {
    size_t k = n - i < SUM16_BLOCK ? n - i : SUM16_BLOCK;
    ampc_load_f32(a, t, p + i, k);
    for (size_t j = 0; j < k; j++) a[j] *= f;
    ampc_store_f32(t, p + i, a, k);
  }
}

static ampc_status mpi_types(const mpi_comm *m, ampc_dtype t, ampc__reduce_op op, MPI_Datatype *mt, MPI_Op *mo) {
  int sum = op == AMPC__REDUCE_SUM || op == AMPC__REDUCE_AVG;
  switch (t) {
    case AMPC_DTYPE_F32:
      *mt = MPI_FLOAT;
      *mo = sum ? MPI_SUM : op == AMPC__REDUCE_MAX ? MPI_MAX : MPI_MIN;
      return AMPC_OK;
    case AMPC_DTYPE_F16:
    case AMPC_DTYPE_BF16:
      if (!sum) break;
      *mt = MPI_UINT16_T;
      *mo = t == AMPC_DTYPE_F16 ? m->sum_f16 : m->sum_bf16;
      return AMPC_OK;
    default: break;
  }
  return ampc__error(AMPC_EUNSUPPORTED, "mpi: no %s reduction of %s values", sum ? "sum" : "max/min", ampc_dtype_name(t));
}

static ampc_status grow(void **p, size_t *cap, size_t bytes) {
  if (bytes <= *cap) return AMPC_OK;
  void *q = realloc(*p, bytes);
  if (!q) return ampc__error(AMPC_ENOMEM, "mpi: out of memory for %zu bytes of staging", bytes);
  *p = q;
  *cap = bytes;
  return AMPC_OK;
}

/* ---- non-blocking reductions ---- */

static ampc_status mpi_ireduce(ampc_comm *c, ampc__device *d, void *buf, ampc_dtype t, size_t n, const size_t *counts,
                               ampc__reduce_op op, ampc__comm_req **req) {
  mpi_comm *m = c->impl;
  *req = NULL;
  if (n == 0) return AMPC_OK;
  if (n > INT_MAX) return ampc__error(AMPC_EINVAL, "mpi: %zu values in one collective (at most %d)", n, INT_MAX);
  if (op != AMPC__REDUCE_SUM && op != AMPC__REDUCE_AVG && counts)
    return ampc__error(AMPC_EINVAL, "mpi: a reduce-scatter sums or averages");
  MPI_Datatype mt = MPI_DATATYPE_NULL;
  MPI_Op mo = MPI_OP_NULL;
  AMPC_TRY(mpi_types(m, t, op, &mt, &mo));
  struct ampc__comm_req *q = NULL;
  for (int i = 0; i < MPI_MAX_REQS && !q; i++)
    if (!m->req[i].used) q = &m->req[i];
  if (!q) return ampc__error(AMPC_ESTATE, "mpi: more than %d collectives in flight", MPI_MAX_REQS);
  size_t es = ampc_dtype_size(t);
  q->d = d;
  q->dev = buf;
  q->t = t;
  q->n = n;
  q->staged = !d->be->host_memory;
  q->scatter = counts != NULL;
  if (q->staged) {
    AMPC_TRY(grow(&q->stage, &q->stage_cap, n * es));
    AMPC_TRY(ampc__dev_read(d, q->stage, t, buf, t, n));
    q->host = q->stage;
  } else {
    q->host = buf;
  }
  if (op == AMPC__REDUCE_AVG) scale(q->host, t, n, 1.0f / (float)c->size);
  if (counts) {
    if (!q->counts && !(q->counts = malloc((size_t)c->size * sizeof *q->counts)))
      return ampc__error(AMPC_ENOMEM, "mpi: out of memory");
    size_t total = 0;
    q->my_off = 0;
    for (int r = 0; r < c->size; r++) {
      if (r == c->rank) q->my_off = total;
      q->counts[r] = (int)counts[r];
      total += counts[r];
    }
    if (total != n) return ampc__error(AMPC_EINVAL, "mpi: reduce-scatter blocks of %zu values in all, not %zu", total, n);
    q->my_n = counts[c->rank];
    AMPC_TRY(grow(&q->recv, &q->recv_cap, q->my_n * es + 64));
    MPI_TRY(MPI_Ireduce_scatter(q->host, q->recv, q->counts, mt, mo, m->comm, &q->r), "MPI_Ireduce_scatter");
  } else {
    MPI_TRY(MPI_Iallreduce(MPI_IN_PLACE, q->host, (int)n, mt, mo, m->comm, &q->r), "MPI_Iallreduce");
  }
  q->used = 1;
  *req = q;
  return AMPC_OK;
}

/* The results where they belong, and the request free again. */
static ampc_status finish(struct ampc__comm_req *q) {
  q->used = 0;
  size_t es = ampc_dtype_size(q->t);
  if (q->scatter) memcpy((char *)q->host + q->my_off * es, q->recv, q->my_n * es);
  if (!q->staged) return AMPC_OK;
  if (q->scatter)
    return ampc__dev_write(q->d, (char *)q->dev + q->my_off * es, q->t, (char *)q->host + q->my_off * es, q->t, q->my_n);
  return ampc__dev_write(q->d, q->dev, q->t, q->host, q->t, q->n);
}

static ampc_status mpi_test(ampc_comm *c, ampc__comm_req *q, int *done) {
  int flag = 0;
  MPI_TRY(MPI_Test(&q->r, &flag, MPI_STATUS_IGNORE), "MPI_Test");
  *done = flag;
  return flag ? finish(q) : AMPC_OK;
}

static ampc_status mpi_wait(ampc_comm *c, ampc__comm_req *q) {
  MPI_TRY(MPI_Wait(&q->r, MPI_STATUS_IGNORE), "MPI_Wait");
  return finish(q);
}

/* ---- blocking collectives ---- */

static ampc_status mpi_allreduce(ampc_comm *c, ampc__device *d, void *buf, ampc_dtype t, size_t n, ampc__reduce_op op) {
  const size_t chunk = (size_t)1 << 30;
  size_t es = ampc_dtype_size(t);
  for (size_t at = 0; at < n; at += chunk) {
    ampc__comm_req *q;
    AMPC_TRY(mpi_ireduce(c, d, (char *)buf + at * es, t, n - at < chunk ? n - at : chunk, NULL, op, &q));
    if (q) AMPC_TRY(mpi_wait(c, q));
  }
  return AMPC_OK;
}

static ampc_status mpi_allgather(ampc_comm *c, ampc__device *d, void *buf, ampc_dtype t, const size_t *counts) {
  mpi_comm *m = c->impl;
  size_t es = ampc_dtype_size(t), total = 0, my_off = 0;
  for (int r = 0; r < c->size; r++) {
    if (counts[r] > INT_MAX || total > INT_MAX) return ampc__error(AMPC_EINVAL, "mpi: all-gather blocks too large");
    if (r == c->rank) my_off = total;
    m->counts[r] = (int)counts[r];
    m->displs[r] = (int)total;
    total += counts[r];
  }
  if (total == 0) return AMPC_OK;
  MPI_Datatype mt = t == AMPC_DTYPE_F32 ? MPI_FLOAT : es == 2 ? MPI_UINT16_T : MPI_BYTE;
  if (es != 4 && es != 2) return ampc__error(AMPC_EUNSUPPORTED, "mpi: all-gather of %s values", ampc_dtype_name(t));
  void *host = buf;
  if (!d->be->host_memory) {
    AMPC_TRY(grow(&m->gstage, &m->gstage_cap, total * es));
    host = m->gstage;
    AMPC_TRY(ampc__dev_read(d, (char *)host + my_off * es, t, (char *)buf + my_off * es, t, counts[c->rank]));
  }
  MPI_TRY(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, host, m->counts, m->displs, mt, m->comm), "MPI_Allgatherv");
  if (host != buf) AMPC_TRY(ampc__dev_write(d, buf, t, host, t, total));
  return AMPC_OK;
}

static ampc_status mpi_allreduce_host(ampc_comm *c, double *buf, size_t n, ampc__reduce_op op) {
  mpi_comm *m = c->impl;
  if (n > INT_MAX) return ampc__error(AMPC_EINVAL, "mpi: %zu host values", n);
  MPI_Op mo = op == AMPC__REDUCE_MAX ? MPI_MAX : op == AMPC__REDUCE_MIN ? MPI_MIN : MPI_SUM;
  MPI_TRY(MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_DOUBLE, mo, m->comm), "MPI_Allreduce");
  if (op == AMPC__REDUCE_AVG)
    for (size_t i = 0; i < n; i++) buf[i] /= c->size;
  return AMPC_OK;
}

static void mpi_abort(ampc_comm *c, int code) {
  mpi_comm *m = c->impl;
  MPI_Abort(m->comm, code);
}

static void mpi_free(ampc_comm *c) {
  mpi_comm *m = c->impl;
  for (int i = 0; i < MPI_MAX_REQS; i++) {
    if (m->req[i].used) MPI_Wait(&m->req[i].r, MPI_STATUS_IGNORE);
    free(m->req[i].stage);
    free(m->req[i].recv);
    free(m->req[i].counts);
  }
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin) {
    if (m->sum_f16 != MPI_OP_NULL) MPI_Op_free(&m->sum_f16);
    if (m->sum_bf16 != MPI_OP_NULL) MPI_Op_free(&m->sum_bf16);
    if (m->comm != MPI_COMM_NULL) MPI_Comm_free(&m->comm);
    if (m->finalize) MPI_Finalize();
  }
  free(m->counts);
  free(m->displs);
  free(m->gstage);
  free(m);
  free(c);
}

static const ampc__comm_ops mpi_ops = {
    .name = "mpi",
    .allreduce = mpi_allreduce,
    .allreduce_host = mpi_allreduce_host,
    .ireduce = mpi_ireduce,
    .test = mpi_test,
    .wait = mpi_wait,
    .allgather = mpi_allgather,
    .abort = mpi_abort,
    .free = mpi_free,
};

/* ---- creation ---- */

static ampc_status create(ampc_comm **out, MPI_Comm base, int finalize) {
  ampc_comm *c = calloc(1, sizeof *c);
  mpi_comm *m = calloc(1, sizeof *m);
  if (!c || !m) {
    free(c), free(m);
    return ampc__error(AMPC_ENOMEM, "mpi: out of memory");
  }
  m->comm = MPI_COMM_NULL;
  m->sum_f16 = m->sum_bf16 = MPI_OP_NULL;
  m->finalize = finalize;
  *c = (ampc_comm){&mpi_ops, 0, 1, 0, 1, m};
  const char *what = "MPI_Comm_dup";
  int rc = MPI_Comm_dup(base, &m->comm);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN), what = "MPI_Comm_set_errhandler";
  if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(m->comm, &c->rank), what = "MPI_Comm_rank";
  if (rc == MPI_SUCCESS) rc = MPI_Comm_size(m->comm, &c->size), what = "MPI_Comm_size";
  if (rc == MPI_SUCCESS) rc = MPI_Op_create(sum_f16, 1, &m->sum_f16), what = "MPI_Op_create";
  if (rc == MPI_SUCCESS) rc = MPI_Op_create(sum_bf16, 1, &m->sum_bf16), what = "MPI_Op_create";
  MPI_Comm node = MPI_COMM_NULL;
  if (rc == MPI_SUCCESS) rc = MPI_Comm_split_type(m->comm, MPI_COMM_TYPE_SHARED, c->rank, MPI_INFO_NULL, &node), what = "MPI_Comm_split_type";
  if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(node, &c->local_rank), what = "MPI_Comm_rank";
  if (rc == MPI_SUCCESS) rc = MPI_Comm_size(node, &c->local_size), what = "MPI_Comm_size";
  if (node != MPI_COMM_NULL) MPI_Comm_free(&node);
  ampc_status s = rc == MPI_SUCCESS ? AMPC_OK : mpi_fail(rc, what);
  if (s == 0) {
    m->counts = malloc((size_t)c->size * sizeof *m->counts);
    m->displs = malloc((size_t)c->size * sizeof *m->displs);
    if (!m->counts || !m->displs) s = ampc__error(AMPC_ENOMEM, "mpi: out of memory");
  }
  if (s < 0) {
    m->finalize = 0; /* the caller's MPI_Init stays the caller's to undo */
    mpi_free(c);
    if (finalize) MPI_Finalize();
    return s;
  }
  *out = c;
  return AMPC_OK;
}

ampc_status ampc_comm_mpi_create_from(ampc_comm **out, const void *mpi_comm) {
  if (!out || !mpi_comm) return ampc__error(AMPC_EINVAL, "ampc_comm_mpi_create_from: %s is NULL", out ? "mpi_comm" : "out");
  *out = NULL;
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) return ampc__error(AMPC_ESTATE, "mpi: MPI is not initialised (MPI_Init first, or ampc_comm_mpi_create)");
  return create(out, *(const MPI_Comm *)mpi_comm, 0);
}

ampc_status ampc_comm_mpi_create(ampc_comm **out) {
  if (!out) return ampc__error(AMPC_EINVAL, "ampc_comm_mpi_create: out is NULL");
  *out = NULL;
  int inited = 0, fin = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&fin);
  if (fin) return ampc__error(AMPC_ESTATE, "mpi: MPI was finalised already");
  if (!inited) {
    int provided = 0;
    int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided);
    if (rc != MPI_SUCCESS) return mpi_fail(rc, "MPI_Init_thread");
    if (provided < MPI_THREAD_FUNNELED) {
      MPI_Finalize();
      return ampc__error(AMPC_EUNSUPPORTED, "mpi: this MPI does not let a multi-threaded process call it (MPI_THREAD_FUNNELED)");
    }
  }
  return create(out, MPI_COMM_WORLD, !inited);
}
