/*
 * comm.h -- communicators: what data-parallel training needs of its ranks.
 *
 * A communicator joins N ranks, each training its own copy of the model on
 * its own part of every batch. Given one (ampc_amp_set_comm), the amp step
 * runs in phases so that one process and many run the same code:
 *
 *   1. gradients all-reduced (averaged) across the ranks
 *   2. unscale + finiteness check + sum of squares, each rank over its
 *      1/N share of the flat gradients (the one small read of the step)
 *   3. found_inf (and each loss's overflow flag) all-reduced with MAX, the
 *      sum of squares with SUM: every rank takes the same decision
 *   4. the loss scaler's update (identical on every rank)
 *   5. the optimizer step (or the skip)
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
 * waiting; the caller ends the run.
 */
#ifndef AMPC_COMM_H
#define AMPC_COMM_H

#include "ampc/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ampc_comm ampc_comm;

/* n (>= 1) communicators of one in-process group, ranks 0..n-1, into out[]. */
ampc_status ampc_comm_local_create(ampc_comm **out, int n);
void ampc_comm_free(ampc_comm *c);
int ampc_comm_rank(const ampc_comm *c);
int ampc_comm_size(const ampc_comm *c);
/* "local", "mpi", ... */
const char *ampc_comm_kind(const ampc_comm *c);

#ifdef __cplusplus
}
#endif
#endif
