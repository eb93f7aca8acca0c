/* Internal: what the amp layer and the tests need of an optimizer beyond
 * its public interface -- its device, moving its state to another one, and
 * one step's constants and state for the backend's update. */
#ifndef AMPC_OPTIM_INTERNAL_H
#define AMPC_OPTIM_INTERNAL_H

#include "ampc/optim.h"
#include "backend/backend.h"

/* Moves the state (with its values) to device d, which the optimizer then
 * shares; a no-op if it is there already. */
ampc_status ampc__optim_bind(ampc_optim *o, ampc__device *d);
ampc__device *ampc__optim_device(const ampc_optim *o);
/* Increments the step count and fills u with the step's kind, constants and
 * state pointers (gmul 1, no masters, no stochastic rounding). lr: finite
 * and >= 0 (not checked). The state pointers are indexed by the flat
 * number: with a shard, pointer + lo is the shard's first element. */
void ampc__optim_begin_step(ampc_optim *o, float lr, ampc__update *u);
/* ZeRO-1: keeps only the state of the flat elements [lo, lo + n) (its
 * values carried over), freeing the rest; state reads and writes then take
 * ranges inside it. Once per optimizer. */
ampc_status ampc__optim_shard(ampc_optim *o, size_t lo, size_t n);
/* Elements of each state the optimizer holds (numel, or its shard's). */
size_t ampc__optim_state_numel(const ampc_optim *o);
/* The memory of state k: its shard's first element. */
const float *ampc__optim_state_base(const ampc_optim *o, size_t k); /* (read only) */

#endif
