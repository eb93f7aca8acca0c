/*
 * rng.h -- the one seeded, counter-based random generator.
 *
 * Every random choice in ampc (initialisation, shuffling, augmentation,
 * stochastic rounding) is a pure function of (seed, stream, counter), so a
 * run is reproducible bit for bit and any position can be restored from
 * three integers. Streams keep the users apart: the loader's shuffle never
 * shifts the initialisation's numbers.
 *
 *     ampc_rng r = ampc_rng_make(seed, AMPC_RNG_STREAM_INIT);
 *     float u = ampc_rng_uniform(&r);          // [0, 1)
 */
#ifndef AMPC_RNG_H
#define AMPC_RNG_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
  AMPC_RNG_STREAM_INIT = 1,
  AMPC_RNG_STREAM_SHUFFLE = 2,
  AMPC_RNG_STREAM_AUGMENT = 3,
  AMPC_RNG_STREAM_ROUNDING = 4,
  AMPC_RNG_STREAM_DATA = 5,
  AMPC_RNG_STREAM_USER = 16
};

typedef struct {
  uint64_t seed;
  uint64_t stream;
  uint64_t counter;
} ampc_rng;

/* The value at (seed, stream, counter): a 64-bit hash (splitmix64-based,
 * two rounds), uniform over all 2^64 values. */
uint64_t ampc_rng_at(uint64_t seed, uint64_t stream, uint64_t counter);

static inline ampc_rng ampc_rng_make(uint64_t seed, uint64_t stream) {
  ampc_rng r = {seed, stream, 0};
  return r;
}
static inline uint64_t ampc_rng_u64(ampc_rng *r) {
  return ampc_rng_at(r->seed, r->stream, r->counter++);
}
/* Uniform in [0, 1) with 24 random bits. */
static inline float ampc_rng_uniform(ampc_rng *r) {
  return (float)(ampc_rng_u64(r) >> 40) * (1.0f / 16777216.0f);
}
/* Uniform integer in [0, n) (exact rejection sampling); 0 for n == 0 or a
 * NULL r (nothing drawn). */
uint64_t ampc_rng_below(ampc_rng *r, uint64_t n);
/* Standard normal (Box-Muller, two counters per value); 0 for a NULL r. */
float ampc_rng_normal(ampc_rng *r);

#ifdef __cplusplus
}
#endif
#endif
