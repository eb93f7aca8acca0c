#include "ampc/rng.h"

#include <math.h>

#include "core/rng_internal.h"

uint64_t ampc_rng_at(uint64_t seed, uint64_t stream, uint64_t counter) { return ampc__rng_at(seed, stream, counter); }

uint64_t ampc_rng_below(ampc_rng *r, uint64_t n) {
  if (!r || n == 0) return 0;
  /* Rejection sampling on the top bits: exact for every n. */
  uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  for (;;) {
    uint64_t x = ampc_rng_u64(r);
    if (x < limit) return x % n;
  }
}

float ampc_rng_normal(ampc_rng *r) {
  if (!r) return 0.0f;
  double u1 = ((double)(ampc_rng_u64(r) >> 11) + 1.0) * (1.0 / 9007199254740992.0);
  double u2 = (double)(ampc_rng_u64(r) >> 11) * (1.0 / 9007199254740992.0);
  return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}
