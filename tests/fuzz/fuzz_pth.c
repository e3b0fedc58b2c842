/* Fuzz target: the .pth reader (io/formats/pth.c: minizip over memory, the
 * legacy container, the restricted unpickler of io/formats/pickle.c, tensor
 * bounds, dtype conversion) on arbitrary bytes. Every input must either
 * load (then every view's bytes are readable, its size matches its shape and
 * find returns it) or fail with a message; never crash, hang or allocate
 * without bound. Both the automatic state-dict choice and a named key. */
#include "config.h"

#include "io/formats/pth.h"
#include "tests/fuzz/fuzz.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char *const keys[] = {NULL, "model"};
    volatile unsigned sink = 0;
    for (int k = 0; k < 2; k++) {
        ch_pth_t *p = NULL;
        if (ch_pth_from_memory(data, size, "<fuzz input>", keys[k], &p) != CH_OK) {
            if (!ch_error_message()[0]) abort();
            if (p) abort();
            continue;
        }
        for (size_t i = 0; i < ch_pth_count(p); i++) {
            const ch_st_view_t *v = ch_pth_at(p, i);
            const unsigned char *b = v->data;
            if ((int64_t)v->nbytes != ch_st_view_numel(v) * (int64_t)ch_st_dtype_size(v->dtype))
                abort();
            /* ASan checks these reads: first and last byte of every tensor */
            if (v->nbytes) sink += b[0] + b[v->nbytes - 1];
            if (ch_pth_find(p, v->name) != v) abort();
            sink += (unsigned)strlen(v->name);
        }
        sink += (unsigned)strlen(ch_pth_state_key(p));
        ch_pth_destroy(p);
    }
    (void)sink;
    return 0;
}
