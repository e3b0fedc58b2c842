/* cohort: exact float64 summation, see xsum.h. */
#include "config.h"

#include "framework/reduce/xsum.h"

#include <math.h>

/* Weight-2^0 position: bit 1074 = limb 33, bit 18. */
#define XSUM_INT_LIMB 33
#define XSUM_INT_SHIFT 18

static void add_at(ch_xsum_t *a, uint64_t mag, int negative, int pos)
{
    unsigned __int128 v = (unsigned __int128)mag << (pos & 31);
    int64_t *l = a->limb + (pos >> 5);
    int64_t p0 = (int64_t)(uint32_t)v, p1 = (int64_t)(uint32_t)(v >> 32), p2 = (int64_t)(v >> 64);
    if (negative) {
        l[0] -= p0; l[1] -= p1; l[2] -= p2;
    } else {
        l[0] += p0; l[1] += p1; l[2] += p2;
    }
}

static void add_magnitude(ch_xsum_t *a, uint64_t mag, int negative)
{
    add_at(a, mag, negative, XSUM_INT_LIMB * 32 + XSUM_INT_SHIFT);
}

void ch_xsum_add_scaled(ch_xsum_t *a, int64_t v, int pos)
{
    add_at(a, v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v, v < 0, pos);
}

void ch_xsum_add_scaled_u128(ch_xsum_t *a, unsigned __int128 v, int pos)
{
    int64_t *l = a->limb + (pos >> 5);
    unsigned s = (unsigned)(pos & 31);
    unsigned __int128 lo = v << s;          /* bits 0..127 of v << s */
    uint64_t hi = s ? (uint64_t)(v >> (128 - s)) : 0; /* bits 128.. */
    for (int i = 0; i < 4; i++) l[i] += (int64_t)(uint32_t)(lo >> (32 * i));
    l[4] += (int64_t)hi;
}

void ch_xsum_add_i64(ch_xsum_t *a, int64_t x)
{
    /* |INT64_MIN| = 2^63 is representable as uint64 */
    uint64_t mag = x < 0 ? (uint64_t)0 - (uint64_t)x : (uint64_t)x;
    add_magnitude(a, mag, x < 0);
}

void ch_xsum_add_u64(ch_xsum_t *a, uint64_t x) { add_magnitude(a, x, 0); }

void ch_xsum_add_array(ch_xsum_t *a, const double *x, int64_t n, int64_t stride)
{
    for (int64_t i = 0; i < n; i++) ch_xsum_add(a, x[i * stride]);
}

void ch_xsum_normalize(ch_xsum_t *a)
{
    int64_t carry = 0;
    for (int i = 0; i < CH_XSUM_LIMBS - 1; i++) {
        int64_t v = a->limb[i] + carry;
        carry = v >> 32; /* arithmetic shift: floor division by 2^32 */
        a->limb[i] = v - carry * ((int64_t)1 << 32);
    }
    a->limb[CH_XSUM_LIMBS - 1] += carry;
}

void ch_xsum_merge(ch_xsum_t *dst, const ch_xsum_t *src)
{
    for (int i = 0; i < CH_XSUM_LIMBS; i++) dst->limb[i] += src->limb[i];
    dst->nan += src->nan;
    dst->pinf += src->pinf;
    dst->ninf += src->ninf;
    ch_xsum_normalize(dst);
}

int ch_xsum_is_zero(const ch_xsum_t *a)
{
    ch_xsum_t t = *a;
    ch_xsum_normalize(&t);
    for (int i = 0; i < CH_XSUM_LIMBS; i++)
        if (t.limb[i]) return 0;
    return 1;
}

/* ---------------------------------------------------------------- rounding */

/* Digits d[0..nd) of 32 bits each (held in uint64), little-endian. */
static uint64_t get_bits(const uint64_t *d, int nd, int pos, int cnt)
{
    int w = pos / 32, off = pos % 32;
    unsigned __int128 acc = 0;
    for (int j = 2; j >= 0; j--) {
        acc <<= 32;
        if (w + j < nd) acc |= d[w + j];
    }
    acc >>= off;
    return cnt >= 64 ? (uint64_t)acc : (uint64_t)acc & ((1ULL << cnt) - 1);
}

static int any_bits_below(const uint64_t *d, int pos)
{
    int w = pos / 32, off = pos % 32;
    for (int i = 0; i < w; i++)
        if (d[i]) return 1;
    return off && (d[w] & ((1ULL << off) - 1)) != 0;
}

typedef struct {
    int precision; /* significand bits */
    int qmin;      /* exponent of the smallest subnormal */
    double max;    /* largest finite value */
} format_t;

static format_t format_of(ch_xsum_format f)
{
    switch (f) {
    case CH_XSUM_F32: return (format_t){24, -149, 0x1.fffffep127};
    case CH_XSUM_F16: return (format_t){11, -24, 65504.0};
    default: return (format_t){53, -1074, 0x1.fffffffffffffp1023};
    }
}

/* Round (-1)^negative * (N + s) * 2^G to the format, where N is the digit
 * integer and s in [0, 1) is nonzero iff sticky_in. The caller guarantees
 * that the format's ulp is at least 2^(G+1) whenever sticky_in is set. */
static double round_digits(const uint64_t *d, int nd, int G, int sticky_in, ch_xsum_format fmt,
                           int negative)
{
    format_t f = format_of(fmt);
    int h = nd - 1;
    while (h >= 0 && d[h] == 0) h--;
    if (h < 0) return (sticky_in && negative) ? -0.0 : 0.0;
    if (d[h] >> 32) return negative ? -INFINITY : INFINITY; /* beyond every format */
    int b = 32 * h + (64 - __builtin_clzll(d[h]));
    int k = b - f.precision;
    if (k < f.qmin - G) k = f.qmin - G;
    double r;
    if (k <= 0) {
        r = ldexp((double)get_bits(d, nd, 0, b), G); /* b <= precision: exact */
    } else {
        uint64_t m = k < b ? get_bits(d, nd, k, b - k) : 0;
        int round_bit = k - 1 < b ? (int)get_bits(d, nd, k - 1, 1) : 0;
        int sticky = sticky_in || any_bits_below(d, k - 1);
        if (round_bit && (sticky || (m & 1))) m++;
        r = ldexp((double)m, k + G);
    }
    if (r > f.max) r = INFINITY;
    return negative ? -r : r;
}

/* Non-finite result of the counted inputs, or 0 (finite) with *out unset. */
static int nonfinite(const ch_xsum_t *a, double *out)
{
    if (a->nan || (a->pinf && a->ninf)) { *out = NAN; return 1; }
    if (a->pinf) { *out = INFINITY; return 1; }
    if (a->ninf) { *out = -INFINITY; return 1; }
    return 0;
}

/* Magnitude digits of a normalized accumulator; returns 1 if negative. */
static int magnitude(ch_xsum_t *a, uint64_t *d)
{
    ch_xsum_normalize(a);
    int negative = a->limb[CH_XSUM_LIMBS - 1] < 0;
    if (negative) {
        ch_xsum_t t;
        for (int i = 0; i < CH_XSUM_LIMBS; i++) t.limb[i] = -a->limb[i];
        ch_xsum_normalize(&t);
        for (int i = 0; i < CH_XSUM_LIMBS; i++) d[i] = (uint64_t)t.limb[i];
    } else {
        for (int i = 0; i < CH_XSUM_LIMBS; i++) d[i] = (uint64_t)a->limb[i];
    }
    return negative;
}

double ch_xsum_round(ch_xsum_t *a, ch_xsum_format fmt)
{
    double r;
    if (nonfinite(a, &r)) return r;
    uint64_t d[CH_XSUM_LIMBS];
    int negative = magnitude(a, d);
    return round_digits(d, CH_XSUM_LIMBS, -1074, 0, fmt, negative);
}

double ch_xsum_div_round(ch_xsum_t *a, uint64_t n, ch_xsum_format fmt)
{
    if (n == 0) return NAN;
    double r;
    if (nonfinite(a, &r)) return r;
    /* dividend = N * 2^32 (one zero digit below) so the quotient keeps 32
     * guard bits below 2^-1074; the remainder is the sticky bit */
    uint64_t d[CH_XSUM_LIMBS + 1], q[CH_XSUM_LIMBS + 1];
    d[0] = 0;
    int negative = magnitude(a, d + 1);
    unsigned __int128 rem = 0;
    for (int i = CH_XSUM_LIMBS; i >= 0; i--) {
        unsigned __int128 cur = (rem << 32) | d[i];
        q[i] = (uint64_t)(cur / n);
        rem = cur % n;
    }
    return round_digits(q, CH_XSUM_LIMBS + 1, -1074 - 32, rem != 0, fmt, negative);
}
