/* cohort: exact summation of float64 values (a fixed-point superaccumulator).
 *
 * A ch_xsum_t holds the exact sum of any number of float64 (and int64 /
 * uint64) values as one long fixed-point integer N times 2^-1074 (the
 * smallest subnormal), split into CH_XSUM_LIMBS signed 64-bit limbs of 32
 * bits each: limb i weighs 2^(32 i - 1074). Adding a double x = M 2^(p-1074)
 * (M its 53-bit significand, p = biased exponent - 1, subnormals p = 0)
 * adds the 85-bit M << (p mod 32) to the three limbs from p / 32 on; each
 * limb changes by less than 2^32 per add, so 2^30 adds can go between two
 * carry propagations (ch_xsum_normalize) without overflow. The idea is
 * Radford Neal's "small superaccumulator" (arXiv:1505.05571) and the long
 * accumulator of ExBLAS (Collange, Defour, Graillat, Iakymchuk 2015); this is
 * our own implementation of it.
 *
 * Because the sum is an integer, it is exact, and merging two accumulators
 * (limb-wise integer addition, also as an MPI_SUM all-reduce of the limbs)
 * is exact, associative and commutative: the result does not depend on the
 * order of the adds, the chunking, or the number of ranks. The value is
 * rounded once, at the end, to float64, float32 or float16 (round to nearest,
 * ties to even; IEEE 754 overflow to +-inf), optionally after an exact
 * division by a count (the correctly rounded mean).
 *
 * Non-finite inputs are counted apart: any NaN, or both +inf and -inf, make
 * the result NaN; otherwise an inf makes it that inf (IEEE addition). An
 * exact zero sum gives +0.0.
 *
 * Range: the limbs cover 2^-1074 .. 2^(32*CH_XSUM_LIMBS - 1074 - 1) =
 * 2^1165, so sums of up to 2^140 values of magnitude DBL_MAX are exact; only
 * the final rounding overflows.
 */
#ifndef COHORT_REDUCE_XSUM_H
#define COHORT_REDUCE_XSUM_H

#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CH_XSUM_LIMBS 70
/* Adds allowed between two ch_xsum_normalize calls (each limb moves by
 * < 2^32 per add; 2^30 adds keep |limb| < 2^62 from a normalized start). */
#define CH_XSUM_ADDS_BETWEEN_NORMALIZE (1LL << 30)

/* A 128-bit unsigned integer (GCC/Clang); __extension__ keeps -pedantic
 * builds of programs that include this header quiet. */
__extension__ typedef unsigned __int128 ch_xsum_u128_t;

typedef struct {
    int64_t limb[CH_XSUM_LIMBS];
    /* counts of non-finite inputs (int64 so the struct merges as limbs) */
    int64_t nan, pinf, ninf;
} ch_xsum_t;

/* Number of int64 words in one accumulator (for MPI all-reduces of arrays
 * of accumulators: MPI_INT64_T with MPI_SUM merges them exactly, after
 * ch_xsum_normalize on every rank). */
#define CH_XSUM_WORDS ((int)(sizeof(ch_xsum_t) / sizeof(int64_t)))

/* Target formats of the final rounding. */
typedef enum {
    CH_XSUM_F64 = 0, /* binary64: 53-bit significand, min subnormal 2^-1074 */
    CH_XSUM_F32,     /* binary32: 24 bits, 2^-149, max FLT_MAX */
    CH_XSUM_F16,     /* binary16: 11 bits, 2^-24, max 65504 */
} ch_xsum_format;

static inline void ch_xsum_init(ch_xsum_t *a) { memset(a, 0, sizeof *a); }

/* Add one double (exact). Hot path: inline, branch-free except for inf/NaN. */
static inline void ch_xsum_add(ch_xsum_t *a, double x)
{
    uint64_t u;
    memcpy(&u, &x, sizeof u);
    uint64_t e = (u >> 52) & 0x7ff;
    uint64_t m = u & ((1ULL << 52) - 1);
    if (__builtin_expect(e == 0x7ff, 0)) {
        if (m) a->nan++;
        else if (u >> 63) a->ninf++;
        else a->pinf++;
        return;
    }
    /* normal: implicit bit, position e - 1; subnormal (e == 0): position 0 */
    uint64_t normal = (e != 0);
    m |= normal << 52;
    uint64_t p = e - normal;
    unsigned s = (unsigned)(p & 31);
    int64_t *l = a->limb + (p >> 5);
    ch_xsum_u128_t v = (ch_xsum_u128_t)m << s;
    int64_t neg = -(int64_t)(u >> 63); /* 0 or -1 */
    int64_t l0 = (int64_t)(uint32_t)v, l1 = (int64_t)(uint32_t)(v >> 32), l2 = (int64_t)(v >> 64);
    l[0] += (l0 ^ neg) - neg;
    l[1] += (l1 ^ neg) - neg;
    l[2] += (l2 ^ neg) - neg;
}

/* Add an integer exactly (weight 2^0 sits at bit 1074). */
void ch_xsum_add_i64(ch_xsum_t *a, int64_t x);
void ch_xsum_add_u64(ch_xsum_t *a, uint64_t x);

/* Add v * 2^(pos - 1074) exactly (0 <= pos <= 2175: the three limbs from
 * pos / 32 on exist): a fixed-point block sum whose unit is bit `pos` of
 * the accumulator. */
void ch_xsum_add_scaled(ch_xsum_t *a, int64_t v, int pos);
/* The same for a nonnegative 128-bit v < 2^120 (0 <= pos <= 2080). */
void ch_xsum_add_scaled_u128(ch_xsum_t *a, ch_xsum_u128_t v, int pos);

/* Add the n values x[0], x[stride], ... (stride in elements). Each call
 * counts n adds toward CH_XSUM_ADDS_BETWEEN_NORMALIZE. */
void ch_xsum_add_array(ch_xsum_t *a, const double *x, int64_t n, int64_t stride);

/* Propagate carries: afterwards limbs 0..L-2 are in [0, 2^32) and the top
 * limb holds the sign. The value is unchanged. */
void ch_xsum_normalize(ch_xsum_t *a);

/* dst += src (exact). Both must have had fewer than 2^30 adds since their
 * last normalize (the sum of two such is still representable); dst is
 * normalized afterwards. */
void ch_xsum_merge(ch_xsum_t *dst, const ch_xsum_t *src);

/* 1 when the (finite part of the) sum is exactly zero. */
int ch_xsum_is_zero(const ch_xsum_t *a);

/* The sum rounded once to fmt (returned as a double that fmt represents
 * exactly, or +-inf / NaN). a is normalized as a side effect. */
double ch_xsum_round(ch_xsum_t *a, ch_xsum_format fmt);

/* sum / n rounded once to fmt (the correctly rounded mean; n >= 1). n == 0
 * gives NaN (numpy's mean of an empty slice). a is normalized. */
double ch_xsum_div_round(ch_xsum_t *a, uint64_t n, ch_xsum_format fmt);

#ifdef __cplusplus
}
#endif
#endif /* COHORT_REDUCE_XSUM_H */
