/* cohort: array dtypes, float16 conversion and array descriptions (see array.h). */
#include "config.h"

#include "io/formats/array.h"

#include <math.h>
#include <string.h>

/* array.h lists the sizes in the enum's order: a new dtype must be added there too. */
_Static_assert(CH_DT_COUNT_ == 12, "ch_array_dtype_size's table has 12 entries");

/* ------------------------------------------------------------------ dtypes */

static const struct {
    const char *name, *code;
} dtype_info[CH_DT_COUNT_] = {
    [CH_DT_BOOL] = {"bool", "b1"},       [CH_DT_INT8] = {"int8", "i1"},
    [CH_DT_INT16] = {"int16", "i2"},     [CH_DT_INT32] = {"int32", "i4"},
    [CH_DT_INT64] = {"int64", "i8"},     [CH_DT_UINT8] = {"uint8", "u1"},
    [CH_DT_UINT16] = {"uint16", "u2"},   [CH_DT_UINT32] = {"uint32", "u4"},
    [CH_DT_UINT64] = {"uint64", "u8"},   [CH_DT_FLOAT16] = {"float16", "f2"},
    [CH_DT_FLOAT32] = {"float32", "f4"}, [CH_DT_FLOAT64] = {"float64", "f8"},
};

const char *ch_array_dtype_name(ch_array_dtype dt)
{
    return (unsigned)dt < CH_DT_COUNT_ ? dtype_info[dt].name : "?";
}

ch_status ch_array_dtype_from_name(const char *name, ch_array_dtype *out)
{
    for (int i = 0; i < CH_DT_COUNT_; i++)
        if (!strcmp(name, dtype_info[i].name) || !strcmp(name, dtype_info[i].code)) {
            *out = (ch_array_dtype)i;
            return CH_OK;
        }
    return CH_ERROR(CH_ERR_INVALID,
                    "unknown dtype '%s' (expected bool, int8, int16, int32, int64, uint8, uint16, "
                    "uint32, uint64, float16, float32, float64 or a code like f8)",
                    name);
}

double ch_half_to_double(uint16_t h)
{
    int e = (h >> 10) & 0x1f;
    double m = (double)(h & 0x3ff);
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(m + 1024.0, e - 25);
    return (h & 0x8000) ? -v : v;
}

uint16_t ch_double_to_half(double x)
{
    uint16_t sign = signbit(x) ? 0x8000 : 0;
    double a = fabs(x);
    if (isnan(x)) return 0x7e00;
    if (a >= 65520.0) return sign | 0x7c00; /* rounds to inf */
    if (a < 0x1p-14) {                      /* subnormal grid 2^-24 */
        double q = nearbyint(a * 0x1p24);   /* ties to even (default mode) */
        return sign | (uint16_t)q;
    }
    int e;
    double f = frexp(a, &e);                /* a = f 2^e, f in [0.5, 1) */
    double m = nearbyint(ldexp(f, 11));     /* 11 significant bits */
    if (m >= 2048.0) { m /= 2; e++; }
    if (e + 14 > 30) return sign | 0x7c00;
    return sign | (uint16_t)((e + 14) << 10) | (uint16_t)((int)m - 1024);
}

int64_t ch_array_desc_count(const ch_array_desc_t *d)
{
    int64_t n = 1;
    for (int i = 0; i < d->ndim; i++) n *= d->shape[i];
    return n;
}
