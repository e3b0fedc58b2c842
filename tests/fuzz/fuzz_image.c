/* Fuzz target: the JPEG / PNG decoders (io/data/image.c) from memory, to 1 and
 * 3 channels. */
#include "config.h"

#include "io/data/image.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ch_image_t img;
    ch_image_init(&img);
    if (ch_image_decode(data, size, 3, &img, "fuzz") == CH_OK) {
        /* touch every byte: a short decode would be caught by ASan */
        volatile unsigned sum = 0;
        for (size_t i = 0; i < (size_t)img.h * (size_t)img.w * (size_t)img.c; i++) sum += img.data[i];
    }
    (void)ch_image_decode(data, size, 1, &img, "fuzz");
    ch_image_free(&img);
    return 0;
}
