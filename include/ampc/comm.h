/*
 * comm.h -- communicators: what data-parallel training needs of its ranks.
 *
 * A communicator joins N ranks, each training its own copy of the model on
 * its own part of every batch. Given one (ampc_amp_set_comm), the amp step
 * runs in phases so that one process and many run the same code:
 *
 *   1. gradients averaged across the ranks: in buckets of about 25 MB, each
 *      started (non-blocking) as soon as backward has written all of its
 *      gradients, so that communication overlaps the rest of backward; in
 *      the gradients' own type (16-bit at O2), or summed in f32
 *      (ampc_amp_set_allreduce_f32); with ZeRO-1 reduce-scattered instead
 *   2. unscale + finiteness check + sum of squares, each rank over its
 *      1/N share of the flat gradients (the one small read of the step)
 *   3. found_inf (and each loss's overflow flag) all-reduced with MAX, the
 *      sum of squares with SUM: every rank takes the same decision
 *   4. the loss scaler's update (identical on every rank)
 *   5. the optimizer step (or the skip); with ZeRO-1 each rank updates its
 *      shard of the f32 masters and optimizer state and the model's weights
 *      are all-gathered
 *
 * Over MPI, one process per rank, started by mpirun:
 *
 *     ampc_comm *c;
 *     if (ampc_comm_mpi_launched()) ampc_comm_mpi_create(&c);   // MPI_Init if needed
 *     ampc_amp_set_comm(amp, c);
 *     // each rank: its slice of every global batch (ampc_loader_opts.rank,
 *     // .world_size), forward, backward, step as in one process
 *     ampc_comm_free(c);                                         // MPI_Finalize if it initialised
 *
 * The in-process communicator runs N ranks as N graphs in one process, one
 * thread per rank (tests, and trying data-parallel code without MPI):
 *
 *     ampc_comm *ranks[2];
 *     ampc_comm_local_create(ranks, 2);
 *     // thread r: ampc_amp_set_comm(amp_r, ranks[r]); forward, backward, step ...
 *     ampc_comm_free(ranks[0]); ampc_comm_free(ranks[1]);
 *
 * Every rank must make the same collective calls in the same order (each
 * amp step is one such sequence). A rank that fails leaves the others
 * waiting in their next collective: a program ends the job then, say with
 * ampc_comm_abort after printing its error.
 */
#ifndef AMPC_COMM_H
#define AMPC_COMM_H

#include <stddef.h>

#include "ampc/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ampc_comm ampc_comm;

typedef enum { AMPC_COMM_SUM, AMPC_COMM_MAX, AMPC_COMM_MIN } ampc_comm_op;

/* n (>= 1) communicators of one in-process group, ranks 0..n-1, into out[]. */
ampc_status ampc_comm_local_create(ampc_comm **out, int n);
/* The ranks of MPI_COMM_WORLD (a duplicate of it), initialising MPI
 * (MPI_THREAD_FUNNELED: collectives are called from one thread) unless the
 * program has; ampc_comm_free then finalises it. Errors of MPI calls come
 * back as AMPC_ECOMM with MPI's message instead of aborting.
 * AMPC_EUNSUPPORTED where libampc was built without MPI (AMPC_HAVE_MPI). */
ampc_status ampc_comm_mpi_create(ampc_comm **out);
/* The same over a communicator of the program's own: mpi_comm points at an
 * MPI_Comm (which is duplicated; MPI must be initialised). */
ampc_status ampc_comm_mpi_create_from(ampc_comm **out, const void *mpi_comm);
/* The same ranks over NCCL (the CUDA backend's GPUs): rank r's collectives
 * on the amp's device memory run on that device's compute stream, ordered
 * after backward's kernels with no wait on the host. Every rank of mpi (an
 * MPI communicator, borrowed: it must outlive the result) calls it; rank 0's
 * ncclUniqueId reaches the others through mpi, which also carries the host
 * all-reduces (ampc_comm_allreduce_host) and ampc_comm_abort. The NCCL
 * communicator proper is made at the first collective, on the GPU of the
 * device that collective names; later ones must name the same GPU, and no
 * two ranks may share one. Free it before mpi.
 * AMPC_EUNSUPPORTED where libampc was built without NCCL (AMPC_HAVE_COMM_NCCL). */
ampc_status ampc_comm_nccl_create(ampc_comm **out, ampc_comm *mpi);
/* 1 if this process was started by an MPI launcher (mpirun, srun, ...),
 * from its environment: whether to create an MPI communicator at all. */
int ampc_comm_mpi_launched(void);
void ampc_comm_free(ampc_comm *c);
int ampc_comm_rank(const ampc_comm *c);
int ampc_comm_size(const ampc_comm *c);
/* This rank's place among the ranks of its machine, and their count (MPI:
 * the ranks that share memory with it): how many threads each may take. */
int ampc_comm_local_rank(const ampc_comm *c);
int ampc_comm_local_size(const ampc_comm *c);
/* "local", "mpi", "nccl" */
const char *ampc_comm_kind(const ampc_comm *c);
/* n doubles of every rank reduced (summed, their maximum or minimum) in
 * place; every rank calls it. A program's own agreements (a stop request,
 * a count) ride on it. A NULL c is one process alone: the values are
 * already reduced (AMPC_OK). */
ampc_status ampc_comm_allreduce_host(ampc_comm *c, double *values, size_t n, ampc_comm_op op);
/* Ends every rank of the job now with exit status code (MPI_Abort): for a
 * program whose rank cannot go on, after it has said why. Returns (doing
 * nothing) for one rank or the in-process communicator. */
void ampc_comm_abort(ampc_comm *c, int code);

#ifdef __cplusplus
}
#endif
#endif
