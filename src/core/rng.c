/* splitmix64 and the distributions drawn from it (rng.h). */
#include "core/rng.h"

#include <math.h>

uint64_t moh_rng_next(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

double moh_rng_uniform01(uint64_t *state) { return (double)(moh_rng_next(state) >> 11) / 9007199254740992.0; }

double moh_rng_normal(uint64_t *state) {
    const double u1 = ((double)(moh_rng_next(state) >> 11) + 1.0) / 9007199254740993.0;
    const double u2 = moh_rng_uniform01(state);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}
