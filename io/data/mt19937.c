/* cohort: MT19937, see mt19937.h. */
#include "io/data/mt19937.h"

#define MT_M 397
#define MT_MATRIX_A 0x9908b0dfu
#define MT_UPPER 0x80000000u
#define MT_LOWER 0x7fffffffu

void ch_mt19937_seed(ch_mt19937_t *g, uint64_t seed)
{
    g->state[0] = (uint32_t)(seed & 0xffffffffu);
    for (int i = 1; i < CH_MT19937_N; i++)
        g->state[i] = 1812433253u * (g->state[i - 1] ^ (g->state[i - 1] >> 30)) + (uint32_t)i;
    g->index = CH_MT19937_N;
}

static void mt_twist(ch_mt19937_t *g)
{
    uint32_t *s = g->state;
    int k;
    for (k = 0; k < CH_MT19937_N - MT_M; k++) {
        uint32_t y = (s[k] & MT_UPPER) | (s[k + 1] & MT_LOWER);
        s[k] = s[k + MT_M] ^ (y >> 1) ^ ((y & 1u) ? MT_MATRIX_A : 0u);
    }
    for (; k < CH_MT19937_N - 1; k++) {
        uint32_t y = (s[k] & MT_UPPER) | (s[k + 1] & MT_LOWER);
        s[k] = s[k + (MT_M - CH_MT19937_N)] ^ (y >> 1) ^ ((y & 1u) ? MT_MATRIX_A : 0u);
    }
    uint32_t y = (s[CH_MT19937_N - 1] & MT_UPPER) | (s[0] & MT_LOWER);
    s[CH_MT19937_N - 1] = s[MT_M - 1] ^ (y >> 1) ^ ((y & 1u) ? MT_MATRIX_A : 0u);
    g->index = 0;
}

uint32_t ch_mt19937_next(ch_mt19937_t *g)
{
    if (g->index >= CH_MT19937_N) mt_twist(g);
    uint32_t y = g->state[g->index++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    return y;
}
