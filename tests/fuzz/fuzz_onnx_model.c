/* Fuzz target: the ONNX mapper (models/onnx_model.c: constant folding,
 * shape propagation, the op mapping and weight loading) on whatever graph
 * the reader accepts from arbitrary bytes. Every input must either build a
 * model whose entries are all readable, or fail with a message; never
 * crash, hang or allocate without bound. make check only (standalone.c);
 * the mapper links the whole nn/ops stack, so there is no libFuzzer build
 * of it in `make fuzz` (tests/fuzz/fuzz_onnx covers the reader there). */
#include "config.h"

#include "io/formats/onnx.h"
#include "models/onnx_model.h"
#include "tests/fuzz/fuzz.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ch_onnx_model_t *g = NULL;
    if (ch_onnx_parse(data, size, "<fuzz input>", &g) != CH_OK) return 0;
    /* the input shape the file declares where it is small, else 2x1x28x28 */
    int64_t shape[4] = {2, 1, 28, 28};
    if (g->n_inputs == 1 && g->inputs[0].ndim == 4)
        for (int d = 1; d < 4; d++)
            if (g->inputs[0].dims[d] > 0 && g->inputs[0].dims[d] <= 64)
                shape[d] = g->inputs[0].dims[d];
    ch_onnx_map_options_t o;
    ch_onnx_map_options_default(&o);
    o.what = "<fuzz input>";
    ch_model_t *m = NULL;
    ch_error_clear();
    if (ch_onnx_to_model(g, shape, &o, &m) != CH_OK) {
        if (!ch_error_message()[0] || m) abort();
    } else {
        volatile unsigned sink = 0;
        for (int i = 0; i < ch_model_num_entries(m); i++) {
            const ch_param_t *p = ch_model_entry(m, i);
            const unsigned char *b = p->data;
            size_t bytes = p->numel * (p->dtype == CH_F32 ? 4 : 8);
            if (bytes) sink += b[0] + b[bytes - 1];
        }
        (void)sink;
        ch_model_destroy(m);
    }
    ch_onnx_free(g);
    return 0;
}
