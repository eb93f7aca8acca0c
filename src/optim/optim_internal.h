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
 * and >= 0 (not checked). */
void ampc__optim_begin_step(ampc_optim *o, float lr, ampc__update *u);

#endif
