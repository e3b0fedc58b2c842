/* Fuzz target: the .npy reader (io/formats/npy.c). The first byte picks:
 *   even: the rest is a .npy file (written to a temporary file, as the reader
 *         takes a path). ch_npy_read_header either fails with a message or
 *         gives a header whose invariants hold: version 1-3, 0 <= ndim <=
 *         CH_ARRAY_MAX_DIMS, no negative dim, a known dtype, and
 *         data_offset + elements * itemsize == the file's size. A header
 *         that parses must open as a source (ch_npy_source_open) with the
 *         same description, and every element must read back (the bytes
 *         after data_offset).
 *   odd:  the rest is a dims text for ch_npy_parse_shape (input.shape):
 *         a success gives 1..CH_ARRAY_MAX_DIMS dims, none negative, and a
 *         raw float64 source of that shape over an empty file
 *         (ch_raw_source_open) opens only when the shape has no element.
 * Never a crash, leak or hang. */
#include "config.h"

#include "io/formats/npy.h"
#include "tests/fuzz/fuzz.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char path[64];

static int write_file(const char *p, const void *data, size_t size)
{
    FILE *f = fopen(p, "wb");
    if (!f) return -1;
    size_t w = size ? fwrite(data, 1, size, f) : 0;
    return fclose(f) == 0 && w == size ? 0 : -1;
}

static void check_shape_text(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (!text) return;
    memcpy(text, data, size);
    text[size] = 0;
    int ndim = -1;
    int64_t shape[CH_ARRAY_MAX_DIMS];
    if (ch_npy_parse_shape(text, &ndim, shape) != CH_OK) {
        if (!ch_error_message()[0]) abort();
    } else {
        if (ndim < 1 || ndim > CH_ARRAY_MAX_DIMS) abort();
        for (int i = 0; i < ndim; i++)
            if (shape[i] < 0) abort();
        /* as a raw float64 input over an empty file: fits only when empty */
        ch_array_desc_t d;
        memset(&d, 0, sizeof d);
        d.dtype = CH_DT_FLOAT64;
        d.ndim = ndim;
        memcpy(d.shape, shape, sizeof shape);
        ch_file_source_t *fs = NULL;
        if (write_file(path, "", 0)) abort();
        if (ch_raw_source_open(path, &d, 0, &fs) == CH_OK) {
            if (ch_array_desc_count(&ch_file_source_get(fs)->seg[0]) != 0) abort();
            ch_file_source_destroy(fs);
        } else if (fs || !strstr(ch_error_message(), path)) {
            abort();
        }
    }
    ch_error_clear();
    free(text);
}

static void check_file(const uint8_t *data, size_t size)
{
    if (write_file(path, data, size)) return;
    ch_npy_header_t h;
    if (ch_npy_read_header(path, &h) != CH_OK) {
        /* A failure must come with a message naming the file. */
        if (!strstr(ch_error_message(), path)) abort();
        ch_error_clear();
        return;
    }
    const ch_array_desc_t *d = &h.desc;
    if (h.major < 1 || h.major > 3) abort();
    if (d->ndim < 0 || d->ndim > CH_ARRAY_MAX_DIMS) abort();
    if ((int)d->dtype < 0 || d->dtype >= CH_DT_COUNT_) abort();
    size_t isz = ch_array_dtype_size(d->dtype);
    if (isz == 0) abort();
    __int128 bytes = (__int128)isz;
    for (int i = 0; i < d->ndim; i++) {
        if (d->shape[i] < 0) abort();
        bytes *= d->shape[i];
        if (bytes > (__int128)size) bytes = (__int128)size + 1; /* no overflow here either */
    }
    if (h.data_offset < 10 || (__int128)h.data_offset + bytes != (__int128)size) abort();

    /* The same file as a source: same description, every element readable. */
    const char *paths[1] = {path};
    ch_file_source_t *fs = NULL;
    if (ch_npy_source_open(paths, 1, &fs) != CH_OK) {
        fprintf(stderr, "header parses but the source does not open: %s\n", ch_error_message());
        abort();
    }
    const ch_array_source_t *src = ch_file_source_get(fs);
    if (src->nseg != 1 || src->seg[0].dtype != d->dtype || src->seg[0].ndim != d->ndim ||
        src->desc.ndim != d->ndim)
        abort();
    for (int i = 0; i < d->ndim; i++)
        if (src->seg[0].shape[i] != d->shape[i]) abort();
    int64_t n = ch_array_desc_count(&src->seg[0]);
    if (n > 0) {
        void *buf = malloc((size_t)n * isz);
        if (!buf) abort();
        if (src->read(src->ctx, 0, 0, n, buf) != CH_OK) abort();
        if (memcmp(buf, data + h.data_offset, (size_t)n * isz)) abort();
        free(buf);
    }
    ch_file_source_destroy(fs);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!path[0]) snprintf(path, sizeof path, "/tmp/cohort-fuzz-npy-%d.npy", (int)getpid());
    if (size == 0 || size > 1 << 20) return 0;
    if (data[0] & 1)
        check_shape_text(data + 1, size - 1);
    else
        check_file(data + 1, size - 1);
    unlink(path);
    return 0;
}
