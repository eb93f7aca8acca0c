/* Internal: the counter-based generator's hash, inline, for kernels that draw
 * one number per element (stochastic rounding) on any backend. */
#ifndef AMPC_CORE_RNG_INTERNAL_H
#define AMPC_CORE_RNG_INTERNAL_H

#include <stdint.h>

#include "core/hd.h" /* AMPC__HD: host and device functions under CUDA */

AMPC__HD uint64_t ampc__splitmix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* The value at (seed, stream, counter): what ampc_rng_at() returns. */
AMPC__HD uint64_t ampc__rng_at(uint64_t seed, uint64_t stream, uint64_t counter) {
  uint64_t k = ampc__splitmix64(seed ^ ampc__splitmix64(stream * 0xd1b54a32d192ed03ull));
  return ampc__splitmix64(k ^ ampc__splitmix64(counter + 0x632be59bd9b4e019ull));
}

#endif
