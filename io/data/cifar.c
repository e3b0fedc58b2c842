/* cohort: CIFAR-10 binary datasets, see cifar.h and dataset.h. */
#include "io/data/cifar.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PLANE (CH_CIFAR_SIDE * CH_CIFAR_SIDE)

ch_status ch_dataset_cifar10_from_memory(const uint8_t *const *bufs,
                                         const size_t *lens, const char *const *names, int nbufs, ch_dataset_t **out)
{
    *out = NULL;
    CH_REQUIRE(nbufs >= 1, "CIFAR-10: no batch files given");
    int64_t n = 0;
    for (int f = 0; f < nbufs; f++) {
        if (lens[f] == 0 || lens[f] % CH_CIFAR_RECORD != 0)
            return CH_ERROR(CH_ERR_FORMAT,
                            "%s: size %zu bytes is not a positive multiple of the %d-byte CIFAR-10 "
                            "record (truncated or not a CIFAR-10 binary batch)",
                            names[f], lens[f], CH_CIFAR_RECORD);
        for (size_t r = 0; r < lens[f] / CH_CIFAR_RECORD; r++)
            if (bufs[f][r * CH_CIFAR_RECORD] >= 10)
                return CH_ERROR(CH_ERR_FORMAT,
                                "%s: label %d of record %zu is out of range for 10 classes",
                                names[f], bufs[f][r * CH_CIFAR_RECORD], r);
        n += (int64_t)(lens[f] / CH_CIFAR_RECORD);
    }
    uint8_t *px;
    int64_t *lab;
    CH_TRY(ch_dataset_memory_create("cifar10", names[0], n, CH_CIFAR_SIDE, CH_CIFAR_SIDE, 3, 10,
                                    &px, &lab, out));
    int64_t i = 0;
    for (int f = 0; f < nbufs; f++) {
        for (size_t r = 0; r < lens[f] / CH_CIFAR_RECORD; r++, i++) {
            const uint8_t *rec = bufs[f] + r * CH_CIFAR_RECORD;
            lab[i] = rec[0];
            uint8_t *dst = px + (size_t)i * 3 * PLANE;
            for (int p = 0; p < PLANE; p++) { /* C,H,W planes -> H,W,C */
                dst[3 * p + 0] = rec[1 + p];
                dst[3 * p + 1] = rec[1 + PLANE + p];
                dst[3 * p + 2] = rec[1 + 2 * PLANE + p];
            }
        }
    }
    return CH_OK;
}

ch_status ch_dataset_cifar10_open_files(const char *const *paths, int npaths, ch_dataset_t **out)
{
    *out = NULL;
    CH_REQUIRE(npaths >= 1 && paths != NULL, "CIFAR-10: no batch files given");
    uint8_t **bufs = calloc((size_t)npaths, sizeof *bufs);
    size_t *lens = calloc((size_t)npaths, sizeof *lens);
    ch_status st = CH_OK;
    if (!bufs || !lens) {
        st = CH_ERROR(CH_ERR_NOMEM, "CIFAR-10: out of memory");
        goto done;
    }
    for (int f = 0; f < npaths && st == CH_OK; f++) st = ch_dataset_read_file(paths[f], &bufs[f], &lens[f]);
    if (st == CH_OK)
        st = ch_dataset_cifar10_from_memory((const uint8_t *const *)bufs, lens, paths, npaths, out);
done:
    if (bufs)
        for (int f = 0; f < npaths; f++) free(bufs[f]);
    free(bufs);
    free(lens);
    return st;
}

ch_status ch_dataset_cifar10_open(const char *dir, int train, ch_dataset_t **out)
{
    *out = NULL;
    char buf[6][4096];
    const char *paths[5];
    int n = train ? 5 : 1;
    for (int k = 0; k < n; k++) {
        if (train)
            snprintf(buf[k], sizeof buf[k], "%s/data_batch_%d.bin", dir, k + 1);
        else
            snprintf(buf[k], sizeof buf[k], "%s/test_batch.bin", dir);
        paths[k] = buf[k];
    }
    return ch_dataset_cifar10_open_files(paths, n, out);
}
