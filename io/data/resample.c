/* cohort: PIL-exact bilinear resampling, see resample.h. Follows Pillow
 * 9.4 src/libImaging/Resample.c (precompute_coeffs, normalize_coeffs_8bpc,
 * ImagingResampleHorizontal_8bpc / Vertical_8bpc, ImagingResampleInner). */
#include "io/data/resample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define PRECISION_BITS (32 - 8 - 2)

/* The passes vectorize at -O3 (GCC), whatever the build's -O level; one
 * clone per ISA picked at load time, as framework/reduce's kernels. The
 * sums are integers, so the result does not depend on the clone. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define RESAMPLE_KERNEL \
    __attribute__((target_clones("avx2", "sse4.1", "default"), optimize("O3")))
#elif defined(__GNUC__) && !defined(__clang__)
#define RESAMPLE_KERNEL __attribute__((optimize("O3")))
#else
#define RESAMPLE_KERNEL
#endif

void ch_resample_scratch_free(ch_resample_scratch_t *s)
{
    free(s->kx);
    free(s->ky);
    free(s->bx);
    free(s->by);
    free(s->tmp);
    free(s->acc);
    free(s->rowx);
    memset(s, 0, sizeof *s);
}

static int grow(void **p, size_t *cap, size_t need)
{
    if (need <= *cap) return 0;
    void *q = realloc(*p, need);
    if (!q) return -1;
    *p = q;
    *cap = need;
    return 0;
}

static double bilinear_filter(double x)
{
    if (x < 0.0) x = -x;
    if (x < 1.0) return 1.0 - x;
    return 0.0;
}

/* Coefficients for in_size -> out_size over the box [in0, in1) (Pillow's
 * resize box): returns ksize, fills kk (out_size * ksize fixed-point) and
 * bounds (xmin, count). */
static int precompute_coeffs(int in_size, double in0, double in1, int out_size, int32_t **kk_p,
                             size_t *kk_cap, int **b_p, size_t *b_cap)
{
    double scale = (in1 - in0) / out_size, filterscale = scale;
    if (filterscale < 1.0) filterscale = 1.0;
    double support = 1.0 * filterscale;
    int ksize = (int)ceil(support) * 2 + 1;
    /* double coefficients first (as Pillow), then fixed point in place */
    if (grow((void **)kk_p, kk_cap, (size_t)out_size * (size_t)ksize * sizeof(double)) ||
        grow((void **)b_p, b_cap, (size_t)out_size * 2 * sizeof(int)))
        return -1;
    double *kd = (double *)(void *)*kk_p;
    int *bounds = *b_p;
    for (int xx = 0; xx < out_size; xx++) {
        double center = in0 + (xx + 0.5) * scale;
        double ww = 0.0, ss = 1.0 / filterscale;
        int xmin = (int)(center - support + 0.5);
        if (xmin < 0) xmin = 0;
        int xmax = (int)(center + support + 0.5);
        if (xmax > in_size) xmax = in_size;
        xmax -= xmin;
        double *k = &kd[xx * ksize];
        int x;
        for (x = 0; x < xmax; x++) {
            double w = bilinear_filter((x + xmin - center + 0.5) * ss);
            k[x] = w;
            ww += w;
        }
        for (x = 0; x < xmax; x++)
            if (ww != 0.0) k[x] /= ww;
        for (; x < ksize; x++) k[x] = 0;
        bounds[xx * 2 + 0] = xmin;
        bounds[xx * 2 + 1] = xmax;
    }
    /* normalize_coeffs_8bpc: same buffer, int32 written front to back
     * (element x of int32 never overtakes element x of double) */
    int32_t *ki = *kk_p;
    for (size_t x = 0; x < (size_t)out_size * (size_t)ksize; x++) {
        double v = kd[x];
        ki[x] = v < 0 ? (int32_t)(-0.5 + v * (1 << PRECISION_BITS))
                      : (int32_t)(0.5 + v * (1 << PRECISION_BITS));
    }
    return ksize;
}

/* Four int32 lanes (GCC/Clang vector extension): a pixel's channels in the
 * horizontal pass, one multiply-add per tap for all of them. */
typedef int32_t v4si __attribute__((vector_size(16)));

static inline uint8_t clip8(int32_t in)
{
    int32_t v = in >> PRECISION_BITS;
    return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
}

ch_status ch_resample_bilinear(const uint8_t *src, int sh, int sw, int c, size_t src_stride,
                               uint8_t *dst, int dh, int dw, ch_resample_scratch_t *s)
{
    const double box[4] = {0.0, 0.0, (double)(float)sw, (double)(float)sh};
    return ch_resample_bilinear_box(src, sh, sw, c, src_stride, box, dst, dh, dw, s);
}

RESAMPLE_KERNEL
ch_status ch_resample_bilinear_box(const uint8_t *src, int sh, int sw, int c, size_t src_stride,
                                   const double box[4], uint8_t *dst, int dh, int dw,
                                   ch_resample_scratch_t *s)
{
    CH_REQUIRE(sh > 0 && sw > 0 && dh > 0 && dw > 0 && c >= 1 && c <= 4,
               "resample: bad sizes %dx%d -> %dx%d (c=%d)", sh, sw, dh, dw, c);
    CH_REQUIRE(box[0] >= 0 && box[1] >= 0 && box[2] <= sw && box[3] <= sh && box[2] > box[0] &&
                   box[3] > box[1],
               "resample: box (%g, %g, %g, %g) outside the %dx%d image", box[0], box[1], box[2],
               box[3], sh, sw);
    /* Pillow: a pass is needed when the size changes or the box is not the whole axis */
    int need_h = dw != sw || box[0] != 0.0 || box[2] != (double)sw;
    int need_v = dh != sh || box[1] != 0.0 || box[3] != (double)sh;
    if (!need_h && !need_v) {
        for (int y = 0; y < sh; y++)
            memcpy(dst + (size_t)y * (size_t)dw * (size_t)c, src + (size_t)y * src_stride,
                   (size_t)sw * (size_t)c);
        return CH_OK;
    }
    int ksx = precompute_coeffs(sw, box[0], box[2], dw, &s->kx, &s->kx_cap, &s->bx, &s->bx_cap);
    int ksy = precompute_coeffs(sh, box[1], box[3], dh, &s->ky, &s->ky_cap, &s->by, &s->by_cap);
    if (ksx < 0 || ksy < 0) return CH_ERROR(CH_ERR_NOMEM, "resample: out of memory");
    const int32_t *kx = s->kx, *ky = s->ky;
    int *by = s->by;
    const int *bx = s->bx;
    const uint8_t *vin = src;
    size_t vin_stride = src_stride;
    int ybox_first = by[0], ybox_last = by[dh * 2 - 2] + by[dh * 2 - 1];
    if (need_h) {
        int rows = need_v ? ybox_last - ybox_first : sh;
        int first = need_v ? ybox_first : 0;
        if (need_v)
            for (int i = 0; i < dh; i++) by[i * 2] -= ybox_first;
        uint8_t *out = dst;
        size_t out_stride = (size_t)dw * (size_t)c;
        if (need_v) {
            if (grow((void **)&s->tmp, &s->tmp_cap, (size_t)rows * out_stride))
                return CH_ERROR(CH_ERR_NOMEM, "resample: out of memory");
            out = s->tmp;
        }
        /* 3-4 channels: each input row widened once to int32 x 4 per
         * pixel (the columns the taps read), then one vector multiply-add
         * per tap gives all channels of an output pixel. The same integer
         * products and sums as the scalar loop below: the same bytes. */
        int x0 = bx[0], x1 = bx[dw * 2 - 2] + bx[dw * 2 - 1];
        int wide = c >= 3 && x1 > x0;
        if (wide && grow((void **)&s->rowx, &s->rowx_cap, (size_t)(x1 - x0) * sizeof(v4si)))
            return CH_ERROR(CH_ERR_NOMEM, "resample: out of memory");
        for (int yy = 0; wide && yy < rows; yy++) {
            const uint8_t *p = src + (size_t)(yy + first) * src_stride + (size_t)x0 * (size_t)c;
            uint8_t *orow = out + (size_t)yy * out_stride;
            v4si *rx = (v4si *)(void *)s->rowx;
            for (int x = 0; x < x1 - x0; x++, p += c)
                rx[x] = (v4si){p[0], p[1], p[2], c == 4 ? p[3] : 0};
            for (int xx = 0; xx < dw; xx++) {
                int xmin = bx[xx * 2], xmax = bx[xx * 2 + 1];
                const int32_t *k = &kx[xx * ksx];
                const v4si *q = rx + (xmin - x0);
                v4si acc = {1 << (PRECISION_BITS - 1), 1 << (PRECISION_BITS - 1),
                            1 << (PRECISION_BITS - 1), 1 << (PRECISION_BITS - 1)};
                for (int x = 0; x < xmax; x++) acc += q[x] * k[x];
                acc >>= PRECISION_BITS;
                acc &= ~(acc < 0);                  /* below 0: 0 */
                v4si big = acc > 255;
                acc = (acc & ~big) | (big & 255);   /* above 255: 255 */
                uint8_t *o = orow + (size_t)xx * (size_t)c;
                for (int ch = 0; ch < c; ch++) o[ch] = (uint8_t)acc[ch];
            }
        }
        for (int yy = 0; !wide && yy < rows; yy++) {
            const uint8_t *row = src + (size_t)(yy + first) * src_stride;
            uint8_t *orow = out + (size_t)yy * out_stride;
            for (int xx = 0; xx < dw; xx++) {
                int xmin = bx[xx * 2], xmax = bx[xx * 2 + 1];
                const int32_t *k = &kx[xx * ksx];
                if (c == 3) { /* the three channels in one pass (same integer sums) */
                    int32_t s0 = 1 << (PRECISION_BITS - 1), s1 = s0, s2 = s0;
                    const uint8_t *p = row + (size_t)xmin * 3;
                    for (int x = 0; x < xmax; x++, p += 3) {
                        s0 += (int32_t)p[0] * k[x];
                        s1 += (int32_t)p[1] * k[x];
                        s2 += (int32_t)p[2] * k[x];
                    }
                    orow[(size_t)xx * 3] = clip8(s0);
                    orow[(size_t)xx * 3 + 1] = clip8(s1);
                    orow[(size_t)xx * 3 + 2] = clip8(s2);
                    continue;
                }
                for (int ch = 0; ch < c; ch++) {
                    int32_t ss = 1 << (PRECISION_BITS - 1);
                    const uint8_t *p = row + (size_t)xmin * (size_t)c + (size_t)ch;
                    for (int x = 0; x < xmax; x++) ss += (int32_t)p[(size_t)x * (size_t)c] * k[x];
                    orow[(size_t)xx * (size_t)c + (size_t)ch] = clip8(ss);
                }
            }
        }
        if (!need_v) return CH_OK;
        vin = s->tmp;
        vin_stride = out_stride;
    }
    size_t w_bytes = (size_t)dw * (size_t)c;
    /* row by row into one row of int32 sums (vectorizes; integer sums are
     * exact, so the order of the taps does not change the result) */
    if (grow((void **)&s->acc, &s->acc_cap, w_bytes * sizeof(int32_t)))
        return CH_ERROR(CH_ERR_NOMEM, "resample: out of memory");
    int32_t *acc = s->acc;
    for (int yy = 0; yy < dh; yy++) {
        const int32_t *k = &ky[yy * ksy];
        int ymin = by[yy * 2], ymax = by[yy * 2 + 1];
        uint8_t *orow = dst + (size_t)yy * w_bytes;
        for (size_t xx = 0; xx < w_bytes; xx++) acc[xx] = 1 << (PRECISION_BITS - 1);
        for (int y = 0; y < ymax; y++) {
            const uint8_t *row = vin + (size_t)(y + ymin) * vin_stride;
            int32_t ky1 = k[y];
            for (size_t xx = 0; xx < w_bytes; xx++) acc[xx] += (int32_t)row[xx] * ky1;
        }
        for (size_t xx = 0; xx < w_bytes; xx++) orow[xx] = clip8(acc[xx]);
    }
    return CH_OK;
}
