/* cohort: reading ONNX models (https://onnx.ai, onnx.proto).
 *
 * An ONNX file is one protobuf message, ModelProto. cohort reads it with
 * libprotobuf-c through C types that protoc-c generates at build time from
 * the system's onnx.proto (Debian's libonnx-dev; configure
 * --with-onnx-proto), and converts it into the plain structs below: the
 * graph's nodes (op type, inputs, outputs, attributes), its initializers
 * (weights and buffers, converted to float32 or int64), its inputs and
 * outputs, and the opset of the default domain. This module only reads; it
 * builds no modules (the mapper onto framework/nn does that) and runs
 * nothing.
 *
 * What is read (onnx.proto field names):
 *   ModelProto: ir_version, opset_import (the version of domain "" or
 *     "ai.onnx"; other domains are not checked here: nodes keep their
 *     domain and the mapper refuses ops it does not know), producer_name,
 *     producer_version, graph.
 *   GraphProto: name, node (in file order, which must be a topological
 *     order), initializer, input, output. value_info, sparse_initializer,
 *     quantization_annotation, functions and training_info are ignored.
 *   TensorProto: dims, data_type, and the data from raw_data (little-endian)
 *     or the typed field onnx.proto assigns to the type (float_data;
 *     int32_data for int32/int16/int8/uint16/uint8/bool and the bit
 *     patterns of float16/bfloat16; int64_data; double_data; uint64_data
 *     for uint32/uint64). float16, bfloat16 and double become float32
 *     (float16/bfloat16 exactly, double rounded to nearest as a C cast);
 *     every integer type and bool becomes int64 (uint64 above INT64_MAX is
 *     refused).
 *   AttributeProto: FLOAT, INT, STRING, TENSOR, FLOATS, INTS, STRINGS (a
 *     TENSOR converted like an initializer). Attributes of other types
 *     (GRAPH, GRAPHS, TENSORS, SPARSE_TENSOR, TYPE_PROTO, ...) are kept with
 *     their onnx.proto type number and no value, so the mapper can name
 *     them when it refuses the node.
 *
 * Checked at load (each failure returns the code given and sets ONE line
 * that starts with the file name, or the label given to ch_onnx_parse):
 *   - the bytes are a protobuf message whose fields all lie inside the
 *     buffer, nested at most CH_ONNX_MAX_DEPTH deep (a wire-format scan
 *     before protobuf-c unpacks anything); a file cut short is
 *     "truncated" (CH_ERR_FORMAT); bytes that do not start like a
 *     ModelProto, do not unpack, or hold no graph are "not an ONNX model
 *     (protobuf ModelProto expected)" (CH_ERR_FORMAT);
 *   - the default domain's opset is in [CH_ONNX_OPSET_MIN, CH_ONNX_OPSET_MAX]
 *     (CH_ERR_UNSUPPORTED naming the opset and the range; no default-domain
 *     opset at all is CH_ERR_FORMAT);
 *   - tensors: at most CH_ONNX_MAX_DIMS dims, each >= 0, the element count
 *     computed without overflow, raw_data exactly numel x element size
 *     bytes, or the typed field exactly numel values (CH_ERR_FORMAT);
 *     data_location EXTERNAL / external_data: "external data not
 *     supported: save with all tensors inside the file" (CH_ERR_UNSUPPORTED);
 *     string, complex and other element types (CH_ERR_UNSUPPORTED);
 *   - every node input (other than "", an omitted optional input) is a
 *     graph input, an initializer or an output of an EARLIER node; the
 *     message names the node, its op type and the missing name ("missing
 *     initializer or input"); no name is produced twice (node outputs,
 *     initializers, graph inputs); every node has an op type; the graph has
 *     at least one output and each is produced by something (CH_ERR_FORMAT);
 *   - graph inputs (other than initializers) are tensors of element type
 *     float (CH_ERR_UNSUPPORTED naming the input and its type), of rank <=
 *     CH_ONNX_MAX_DIMS (CH_ERR_FORMAT).
 * Graph inputs that are also initializers (older exporters list every
 * weight as an input) are dropped from `inputs`.
 *
 * Memory: every allocation is bounded by the file size (protobuf-c sizes
 * repeated fields from the bytes present; converted tensors are checked
 * against the bytes or values present before they are allocated). The
 * model keeps the unpacked protobuf message and points into it (names,
 * node input/output arrays, float and int64 data stored in the file's own
 * type, attribute floats/ints); converted data and NUL-terminated copies
 * of attribute strings are owned by the model too. Everything reachable
 * from a ch_onnx_model_t stays valid until ch_onnx_free and is read-only.
 * Tensor data pointers are aligned for their element type.
 */
#ifndef COHORT_IO_ONNX_H
#define COHORT_IO_ONNX_H

#include "framework/core/status.h"
#include "framework/tensor/tensor.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Range of default-domain opsets accepted. */
#define CH_ONNX_OPSET_MIN 11
#define CH_ONNX_OPSET_MAX 21
/* Most dimensions of a tensor or value info. */
#define CH_ONNX_MAX_DIMS 8
/* Deepest nesting of protobuf messages accepted (a ModelProto without
 * subgraphs nests about 6 deep; each If/Loop body adds 3). */
#define CH_ONNX_MAX_DEPTH 64

/* A tensor (initializer, or the value of a TENSOR attribute).
 * Element types after conversion: CH_F32 (float, float16, bfloat16, double
 * converted) or CH_I64 (int64, int32, int16, int8, uint8, uint16, uint32,
 * uint64, bool converted). data: numel elements (float* or int64_t*) in C
 * (row-major) order, never NULL (a valid pointer when numel is 0), owned by
 * the model. ndim 0 is a scalar (numel 1). */
typedef struct ch_onnx_tensor {
    const char *name;          /* "" for an unnamed attribute tensor */
    ch_dtype_t dtype;          /* CH_F32 or CH_I64 */
    int ndim;                  /* 0..8 */
    int64_t dims[CH_ONNX_MAX_DIMS];
    size_t numel;              /* product of dims[0..ndim-1] (1 for ndim 0) */
    void *data;                /* float* or int64_t*, numel, C order, owned by the model */
    int onnx_type;             /* element type in the file (onnx.proto TensorProto.DataType) */
} ch_onnx_tensor_t;

/* onnx.proto AttributeProto.AttributeType numbers. */
typedef enum {
    CH_ONNX_ATTR_FLOAT = 1,
    CH_ONNX_ATTR_INT = 2,
    CH_ONNX_ATTR_STRING = 3,
    CH_ONNX_ATTR_TENSOR = 4,
    CH_ONNX_ATTR_FLOATS = 6,
    CH_ONNX_ATTR_INTS = 7,
    CH_ONNX_ATTR_STRINGS = 8
} ch_onnx_attr_type_t;

/* One node attribute. Which fields hold the value depends on type:
 *   FLOAT: f; INT: i; STRING: s (NUL-terminated copy; bytes after an
 *   embedded NUL are not seen); TENSOR: t; FLOATS: n, floats; INTS: n, ints;
 *   STRINGS: n, strings.
 * The others are 0 / NULL. An attribute of another onnx.proto type (GRAPH
 * 5, TENSORS 9, GRAPHS 10, SPARSE_TENSOR 11, ...) has that number in type
 * and no value. */
typedef struct ch_onnx_attr {
    const char *name;
    ch_onnx_attr_type_t type;
    float f;
    int64_t i;
    const char *s;
    int n;
    const float *floats;
    const int64_t *ints;
    const char *const *strings;
    const ch_onnx_tensor_t *t;
} ch_onnx_attr_t;

/* One graph node. in[0..n_in-1], out[0..n_out-1]: value names; "" marks an
 * omitted optional input or output. domain "" is the default (ai.onnx; a
 * node that says "ai.onnx" is given ""). name may be "" (ONNX allows
 * unnamed nodes). Constant nodes stay nodes (op_type "Constant", attribute
 * "value" of type TENSOR, or value_float / value_ints / ...). */
typedef struct ch_onnx_node {
    const char *name, *op_type, *domain;
    int n_in, n_out;
    const char *const *in, *const *out;
    int n_attr;
    const ch_onnx_attr_t *attr;
} ch_onnx_node_t;

/* A graph input or output. elem_type: onnx.proto TensorProto.DataType (1 =
 * float). ndim: the rank, or -1 when the file gives no shape; dims[d] = -1
 * for a symbolic (dim_param) or unknown dimension. */
typedef struct ch_onnx_value_info {
    const char *name;
    int elem_type;
    int ndim;
    int64_t dims[CH_ONNX_MAX_DIMS];
} ch_onnx_value_info_t;

/* A loaded, validated model. All pointers are owned by it (see the top of
 * this file); strings are never NULL ("" when absent). */
typedef struct ch_onnx_model {
    int64_t ir_version, opset;          /* opset: of the default domain */
    const char *producer_name, *producer_version, *graph_name;
    int n_nodes;
    const ch_onnx_node_t *nodes;        /* file order, checked to be topological */
    int n_init;
    const ch_onnx_tensor_t *init;       /* graph initializers, in file order (Constant nodes stay nodes) */
    int n_inputs;
    const ch_onnx_value_info_t *inputs; /* graph inputs that are NOT initializers */
    int n_outputs;
    const ch_onnx_value_info_t *outputs;
} ch_onnx_model_t;

/* Load the ONNX file at path (mapped read-only while it is unpacked, then
 * unmapped: the model does not refer to the file afterwards).
 * Errors: CH_ERR_IO (cannot open or read: names the path and the errno
 * text), CH_ERR_FORMAT / CH_ERR_UNSUPPORTED (see the list at the top of this
 * file), CH_ERR_NOMEM. *out is NULL on error. */
ch_status ch_onnx_load(const char *path, ch_onnx_model_t **out);

/* Same from the len bytes at buf (a whole file); what names the buffer in
 * messages (NULL: "<memory>"). buf is not referred to after the call. */
ch_status ch_onnx_parse(const void *buf, size_t len, const char *what, ch_onnx_model_t **out);

/* The initializer named name, or NULL if none (O(1): a hash of the names). */
const ch_onnx_tensor_t *ch_onnx_find_init(const ch_onnx_model_t *m, const char *name);

/* The attribute of n named name, or NULL if absent. */
const ch_onnx_attr_t *ch_onnx_node_attr(const ch_onnx_node_t *n, const char *name);

/* Name of an onnx.proto TensorProto.DataType ("float", "float16", "int64",
 * ...); "type N" style text is not produced: unknown numbers give "?". */
const char *ch_onnx_type_name(int onnx_type);

/* Free a model (NULL is fine). */
void ch_onnx_free(ch_onnx_model_t *m);

#ifdef __cplusplus
}
#endif

#endif /* COHORT_IO_ONNX_H */
