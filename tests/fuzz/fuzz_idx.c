/* Fuzz target: the IDX reader (gzip or raw, images + labels) from memory.
 * Input: 2 bytes (little-endian) giving where the images file ends, then
 * the images file bytes, then the labels file bytes. */
#include "config.h"

#include <stdlib.h>

#include "io/data/dataset.h"
#include "io/data/idx.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2) return 0;
    size_t split = (size_t)data[0] | (size_t)data[1] << 8;
    data += 2;
    size -= 2;
    if (split > size) split = size;
    /* the pieces alone */
    uint8_t *raw = NULL;
    size_t raw_len = 0;
    if (ch_idx_gunzip(data, size, (size_t)1 << 24, "fuzz", &raw, &raw_len) == CH_OK) {
        ch_idx_t idx;
        (void)ch_idx_parse(raw ? raw : data, raw ? raw_len : size, CH_IDX_MAGIC_IMAGES, "fuzz", &idx);
        (void)ch_idx_parse(raw ? raw : data, raw ? raw_len : size, CH_IDX_MAGIC_LABELS, "fuzz", &idx);
        free(raw);
    }
    /* a whole dataset */
    ch_dataset_t *ds = NULL;
    if (ch_dataset_idx_from_memory(data, split, "fuzz-images", data + split, size - split,
                                   "fuzz-labels", size & 1 ? 10 : 0, &ds) == CH_OK) {
        ch_image_t img;
        ch_image_init(&img);
        int64_t label;
        if (ds->length > 0) {
            (void)ch_dataset_get(ds, 0, &img, &label);
            (void)ch_dataset_get(ds, ds->length - 1, &img, &label);
        }
        (void)ch_dataset_get(ds, ds->length, &img, &label);
        ch_image_free(&img);
        ch_dataset_destroy(ds);
    }
    return 0;
}
