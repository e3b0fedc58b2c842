/* Fuzz target: the ONNX reader (io/formats/onnx.c: the protobuf wire scan,
 * protobuf-c's ModelProto unpack, tensor conversion and bounds, attributes,
 * the graph checks) on arbitrary bytes. Every input must either load (then
 * every tensor's data is readable for numel elements, names resolve, node
 * inputs/outputs and attributes are readable) or fail with a message; never
 * crash, hang or allocate without bound. */
#include "config.h"

#include "io/formats/onnx.h"
#include "tests/fuzz/fuzz.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static unsigned touch_tensor(const ch_onnx_tensor_t *t)
{
    unsigned s = (unsigned)strlen(t->name);
    if (t->dtype != CH_F32 && t->dtype != CH_I64) abort();
    if (t->ndim < 0 || t->ndim > CH_ONNX_MAX_DIMS || !t->data) abort();
    size_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= (size_t)t->dims[d];
    if (n != t->numel) abort();
    const unsigned char *b = t->data;
    size_t bytes = t->numel * 8 / (t->dtype == CH_F32 ? 2 : 1);
    if (bytes) s += b[0] + b[bytes - 1]; /* ASan checks the ends */
    return s;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    volatile unsigned sink = 0;
    ch_onnx_model_t *m = NULL;
    if (ch_onnx_parse(data, size, "<fuzz input>", &m) != CH_OK) {
        if (!ch_error_message()[0]) abort();
        if (m) abort();
        return 0;
    }
    if (m->opset < CH_ONNX_OPSET_MIN || m->opset > CH_ONNX_OPSET_MAX) abort();
    sink += (unsigned)strlen(m->producer_name) + (unsigned)strlen(m->graph_name);
    for (int k = 0; k < m->n_init; k++) {
        sink += touch_tensor(&m->init[k]);
        if (ch_onnx_find_init(m, m->init[k].name) != &m->init[k]) abort();
    }
    for (int k = 0; k < m->n_nodes; k++) {
        const ch_onnx_node_t *n = &m->nodes[k];
        sink += (unsigned)strlen(n->name) + (unsigned)strlen(n->op_type) + (unsigned)strlen(n->domain);
        for (int j = 0; j < n->n_in; j++) sink += (unsigned)strlen(n->in[j]);
        for (int j = 0; j < n->n_out; j++) sink += (unsigned)strlen(n->out[j]);
        for (int j = 0; j < n->n_attr; j++) {
            const ch_onnx_attr_t *a = &n->attr[j];
            if (ch_onnx_node_attr(n, a->name) != a) abort();
            switch ((int)a->type) {
            case CH_ONNX_ATTR_STRING: sink += (unsigned)strlen(a->s); break;
            case CH_ONNX_ATTR_TENSOR: sink += touch_tensor(a->t); break;
            case CH_ONNX_ATTR_FLOATS: if (a->n) sink += a->floats[a->n - 1] != 0.0f; break;
            case CH_ONNX_ATTR_INTS: if (a->n) sink += (unsigned)a->ints[a->n - 1]; break;
            case CH_ONNX_ATTR_STRINGS:
                for (int i = 0; i < a->n; i++) sink += (unsigned)strlen(a->strings[i]);
                break;
            default: break;
            }
        }
    }
    for (int k = 0; k < m->n_inputs; k++)
        if (m->inputs[k].elem_type != 1 || m->inputs[k].ndim > CH_ONNX_MAX_DIMS) abort();
    for (int k = 0; k < m->n_outputs; k++) sink += (unsigned)strlen(m->outputs[k].name);
    ch_onnx_free(m);
    (void)sink;
    return 0;
}
