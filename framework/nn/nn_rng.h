/* cohort: the seeded random generator used for parameter initialisation.
 *
 * xoshiro256** (Blackman & Vigna, "Scrambled linear pseudorandom number
 * generators", 2018) seeded through splitmix64. Normal variates use the
 * Box-Muller transform in double precision. The stream is fully determined
 * by the seed, on every platform; it is NOT PyTorch's generator (bit equality
 * with torch's init is not a goal, its distributions are).
 */
#ifndef COHORT_NN_RNG_H
#define COHORT_NN_RNG_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    uint64_t s[4];
    double spare;     /* second Box-Muller variate */
    int has_spare;
} ch_nn_rng_t;

/* Seed the generator (any 64-bit value, 0 included). */
void ch_nn_rng_seed(ch_nn_rng_t *rng, uint64_t seed);

/* Next 64 random bits. */
uint64_t ch_nn_rng_next(ch_nn_rng_t *rng);

/* Uniform double in [0, 1) with 53 random bits. */
double ch_nn_rng_uniform(ch_nn_rng_t *rng);

/* Standard normal variate N(0, 1) (Box-Muller). */
double ch_nn_rng_normal(ch_nn_rng_t *rng);

/* Fill x[0..n) with N(0, std^2) (torch.nn.init.normal_ semantics). */
void ch_nn_rng_fill_normal(ch_nn_rng_t *rng, float *x, size_t n, double std);

/* Fill x[0..n) with U(-bound, bound) (torch.nn.init.uniform_(-b, b)). */
void ch_nn_rng_fill_uniform(ch_nn_rng_t *rng, float *x, size_t n, double bound);

#ifdef __cplusplus
}
#endif
#endif /* COHORT_NN_RNG_H */
