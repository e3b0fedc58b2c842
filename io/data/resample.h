/* cohort: bilinear image resampling, bit-exact with PIL.
 *
 * Pillow 9's Image.resize(size, Image.BILINEAR) on 8-bit "L"/"RGB" images
 * (libImaging/Resample.c): a separable triangle filter whose support grows
 * with the downscale factor (so downscaling is antialiased), coefficients in
 * 22-bit fixed point, a horizontal pass then a vertical pass, each rounded
 * and clipped to uint8. torchvision's Resize / RandomResizedCrop on PIL
 * images (the ImageFolder path) call exactly this. torchvision's tensor path
 * (F.interpolate, antialias=False in 0.14) differs when downscaling; see
 * docs/perf-data.md for the measured difference.
 */
#ifndef COHORT_RESAMPLE_H
#define COHORT_RESAMPLE_H

#include <stddef.h>
#include <stdint.h>

#include "framework/core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Reusable buffers (coefficients and the intermediate image); zero-init,
 * free with ch_resample_scratch_free. Grows only when a larger resize than
 * before is requested. */
typedef struct ch_resample_scratch {
    int32_t *kx, *ky;
    int *bx, *by;
    size_t kx_cap, ky_cap, bx_cap, by_cap;
    uint8_t *tmp;
    size_t tmp_cap;
    int32_t *acc; /* one output row of vertical-pass sums */
    size_t acc_cap;
    int32_t *rowx; /* horizontal pass, 3-4 channels: one input row as int32 x 4 per pixel */
    size_t rowx_cap;
} ch_resample_scratch_t;

void ch_resample_scratch_free(ch_resample_scratch_t *s);

/* Resize src (sh x sw pixels, c interleaved uint8 channels, rows
 * src_stride bytes apart: H,W,C) to dst (dh x dw x c, rows dw*c bytes).
 * All sizes >= 1. Errors: CH_ERR_INVALID (sizes), CH_ERR_NOMEM. */
ch_status ch_resample_bilinear(const uint8_t *src, int sh, int sw, int c, size_t src_stride,
                               uint8_t *dst, int dh, int dw, ch_resample_scratch_t *scratch);

/* As ch_resample_bilinear, over the box (x0, y0, x1, y1) of src in pixel
 * coordinates (fractional allowed; 0 <= x0 < x1 <= sw, 0 <= y0 < y1 <= sh):
 * Pillow's Image.resize(size, BILINEAR, box=...). The filter reads the
 * pixels of src around the box (within src). The box (0, 0, sw, sh) is
 * ch_resample_bilinear. Errors: CH_ERR_INVALID (sizes, box), CH_ERR_NOMEM. */
ch_status ch_resample_bilinear_box(const uint8_t *src, int sh, int sw, int c, size_t src_stride,
                                   const double box[4], uint8_t *dst, int dh, int dw,
                                   ch_resample_scratch_t *scratch);

#ifdef __cplusplus
}
#endif
#endif /* COHORT_RESAMPLE_H */
