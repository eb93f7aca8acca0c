#include "ampc/rng.h"

#include <math.h>

static inline uint64_t splitmix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t ampc_rng_at(uint64_t seed, uint64_t stream, uint64_t counter) {
  uint64_t k = splitmix64(seed ^ splitmix64(stream * 0xd1b54a32d192ed03ull));
  return splitmix64(k ^ splitmix64(counter + 0x632be59bd9b4e019ull));
}

uint64_t ampc_rng_below(ampc_rng *r, uint64_t n) {
  /* Rejection sampling on the top bits: exact for every n. */
  uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  for (;;) {
    uint64_t x = ampc_rng_u64(r);
    if (x < limit) return x % n;
  }
}

float ampc_rng_normal(ampc_rng *r) {
  double u1 = ((double)(ampc_rng_u64(r) >> 11) + 1.0) * (1.0 / 9007199254740992.0);
  double u2 = (double)(ampc_rng_u64(r) >> 11) * (1.0 / 9007199254740992.0);
  return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}
