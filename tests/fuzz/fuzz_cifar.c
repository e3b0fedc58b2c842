/* Fuzz target: the CIFAR-10 binary batch reader from memory. Input: one
 * batch file (or two: split at the middle when the first byte is odd). */
#include "config.h"

#include "io/data/cifar.h"
#include "io/data/dataset.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *bufs[2] = {data, data + size / 2};
    size_t lens[2] = {size, size - size / 2};
    const char *names[2] = {"fuzz-a.bin", "fuzz-b.bin"};
    int n = 1;
    if (size > 0 && (data[0] & 1)) {
        lens[0] = size / 2;
        n = 2;
    }
    ch_dataset_t *ds = NULL;
    if (ch_dataset_cifar10_from_memory(bufs, lens, names, n, &ds) == CH_OK) {
        ch_image_t img;
        ch_image_init(&img);
        int64_t label;
        (void)ch_dataset_get(ds, 0, &img, &label);
        (void)ch_dataset_get(ds, ds->length - 1, &img, &label);
        ch_image_free(&img);
        ch_dataset_destroy(ds);
    }
    return 0;
}
