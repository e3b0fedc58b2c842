/* Fuzz target: the safetensors reader (io/formats/safetensors.c) on arbitrary bytes.
 * Every input must either load (then every view lies inside the input and
 * the metadata strings are readable) or fail with a message; never crash. */
#include "config.h"

#include "io/formats/safetensors.h"
#include "tests/fuzz/fuzz.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ch_safetensors_t *st = NULL;
    volatile unsigned sink = 0;
    if (ch_safetensors_from_memory(data, size, "<fuzz input>", 0, &st) != CH_OK) {
        /* A failure must come with a message. */
        if (!ch_error_message()[0]) abort();
        return 0;
    }
    for (size_t i = 0; i < ch_safetensors_count(st); i++) {
        const ch_st_view_t *v = ch_safetensors_at(st, i);
        const unsigned char *p = v->data;
        /* Views must lie inside the input (ASan checks the reads). */
        if (v->nbytes && (p < data || p + v->nbytes > data + size)) abort();
        if ((int64_t)v->nbytes != ch_st_view_numel(v) * (int64_t)ch_st_dtype_size(v->dtype)) abort();
        if (v->nbytes) sink += p[0] + p[v->nbytes - 1];
        if (ch_safetensors_find(st, v->name) != v) abort();
        sink += (unsigned)strlen(v->name);
    }
    for (size_t i = 0; i < ch_safetensors_meta_count(st); i++) {
        const ch_st_meta_t *m = ch_safetensors_meta_at(st, i);
        sink += (unsigned)strlen(m->key) + (unsigned)strlen(m->value);
    }
    (void)sink;
    ch_safetensors_destroy(st);
    return 0;
}
