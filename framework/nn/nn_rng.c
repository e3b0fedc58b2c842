/* cohort: xoshiro256** generator for parameter initialisation. */
#include "config.h"

#include <stddef.h>

#include "framework/nn/nn_rng.h"

#include <math.h>

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

void ch_nn_rng_seed(ch_nn_rng_t *rng, uint64_t seed)
{
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) rng->s[i] = splitmix64(&x);
    rng->has_spare = 0;
    rng->spare = 0.0;
}

uint64_t ch_nn_rng_next(ch_nn_rng_t *rng)
{
    uint64_t *s = rng->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double ch_nn_rng_uniform(ch_nn_rng_t *rng)
{
    return (double)(ch_nn_rng_next(rng) >> 11) * 0x1.0p-53;
}

double ch_nn_rng_normal(ch_nn_rng_t *rng)
{
    if (rng->has_spare) {
        rng->has_spare = 0;
        return rng->spare;
    }
    double u1;
    do u1 = ch_nn_rng_uniform(rng); while (u1 <= 0.0);
    double u2 = ch_nn_rng_uniform(rng);
    double r = sqrt(-2.0 * log(u1));
    double th = 2.0 * M_PI * u2;
    rng->spare = r * sin(th);
    rng->has_spare = 1;
    return r * cos(th);
}

void ch_nn_rng_fill_normal(ch_nn_rng_t *rng, float *x, size_t n, double std)
{
    for (size_t i = 0; i < n; i++) x[i] = (float)(std * ch_nn_rng_normal(rng));
}

void ch_nn_rng_fill_uniform(ch_nn_rng_t *rng, float *x, size_t n, double bound)
{
    for (size_t i = 0; i < n; i++)
        x[i] = (float)((2.0 * ch_nn_rng_uniform(rng) - 1.0) * bound);
}
