/* The one pseudo-random generator of moh: splitmix64 (Steele, Lea, Flood 2014). Used by weight
 * initialisation, data samplers and augmentation; every state (0 included) is valid, and saving
 * the state reproduces the stream from that point. Pure functions of the state: no global state. */
#ifndef MOH_RNG_H
#define MOH_RNG_H
#include <stdint.h>

/* Advances *state by the golden-ratio increment and returns the mixed 64-bit value. */
uint64_t moh_rng_next(uint64_t *state);
/* Uniform double in [0, 1) from the top 53 bits of one draw. */
double moh_rng_uniform01(uint64_t *state);
/* Standard normal from two draws (Box-Muller, cosine branch; u1 in (0, 1]). */
double moh_rng_normal(uint64_t *state);
#endif
