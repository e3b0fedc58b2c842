/* Fuzz target: the JPEG / PNG decoders (io/data/image.c) from memory, to 1 and
 * 3 channels, full decodes and the partial (region + DCT-scaled) JPEG decode
 * of data.fast_decode, with a region drawn from the input's first bytes. */
#include "config.h"

#include "io/data/image.h"
#include "tests/fuzz/fuzz.h"

/* The region callback: scale 1..8 and a box inside the scaled image, both
 * from a seed taken from the input (any box the contract allows). */
static int fuzz_roi(void *ctx, int h, int w, ch_image_roi_t *roi)
{
    uint32_t r = *(const uint32_t *)ctx;
    int n = 1 + (int)(r % 8);
    int sh = (int)(((int64_t)h * n + 7) / 8), sw = (int)(((int64_t)w * n + 7) / 8);
    if (sh < 1 || sw < 1) return 0;
    roi->scale_num = n;
    roi->y = (int)((r >> 3) % (uint32_t)sh);
    roi->x = (int)((r >> 11) % (uint32_t)sw);
    roi->h = 1 + (int)((r >> 19) % (uint32_t)(sh - roi->y));
    roi->w = 1 + (int)((r >> 7) % (uint32_t)(sw - roi->x));
    return 1;
}

static void touch(const ch_image_t *img)
{
    /* every byte: a short decode would be caught by ASan */
    volatile unsigned sum = 0;
    for (size_t i = 0; i < (size_t)img->h * (size_t)img->w * (size_t)img->c; i++) sum += img->data[i];
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ch_image_t img;
    ch_image_init(&img);
    if (ch_image_decode(data, size, 3, &img, "fuzz") == CH_OK) touch(&img);
    (void)ch_image_decode(data, size, 1, &img, "fuzz");
    /* the partial decode, seeded from the bytes after the JPEG SOI marker */
    uint32_t seed = 0;
    for (size_t i = 2; i < size && i < 6; i++) seed = seed * 257u + data[i];
    img.roi_fn = fuzz_roi;
    img.roi_ctx = &seed;
    if (ch_image_decode(data, size, 3, &img, "fuzz") == CH_OK) touch(&img);
    ch_image_free(&img);
    return 0;
}
