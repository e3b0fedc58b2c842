/* cohort: the Mersenne Twister MT19937 (32-bit) random number generator.
 *
 * Exactly the generator behind torch.Generator on CPU (at::mt19937 in
 * ATen/core/MT19937RNGEngine.h) and Python's `random`: Matsumoto & Nishimura,
 * "Mersenne Twister: a 623-dimensionally equidistributed uniform
 * pseudo-random number generator", ACM TOMACS 8(1), 1998, with the standard
 * init_genrand seeding. torch.Generator.manual_seed(s) seeds it with the low
 * 32 bits of s, which is what ch_mt19937_seed does.
 */
#ifndef COHORT_MT19937_H
#define COHORT_MT19937_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CH_MT19937_N 624

typedef struct ch_mt19937 {
    uint32_t state[CH_MT19937_N];
    int index;
} ch_mt19937_t;

/* init_genrand(seed & 0xffffffff), as torch.Generator.manual_seed(seed). */
void ch_mt19937_seed(ch_mt19937_t *g, uint64_t seed);

/* Next 32-bit output (genrand_int32; torch's CPUGeneratorImpl::random()). */
uint32_t ch_mt19937_next(ch_mt19937_t *g);

#ifdef __cplusplus
}
#endif
#endif /* COHORT_MT19937_H */
