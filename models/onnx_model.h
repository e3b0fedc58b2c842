/* cohort: a trainable model from an ONNX graph (docs/onnx.md).
 *
 *   ch_onnx_model_t *g;
 *   CH_TRY(ch_onnx_load("net.onnx", &g));                 // io/formats/onnx.h
 *   int64_t in[4] = {64, 1, 28, 28};                       // (N, C, H, W) of the data
 *   ch_onnx_map_options_t o;
 *   ch_onnx_map_options_default(&o);
 *   o.what = "net.onnx"; o.num_classes = 10;
 *   ch_model_t *model;
 *   CH_TRY(ch_onnx_to_model(g, in, &o, &model));           // g may be freed afterwards
 *
 * The model's root holds one DAG container (ch_nn_graph, named "", so the
 * entries carry no prefix) whose nodes are cohort's own modules, run by the
 * one executor (framework/nn). Parameter and buffer names are the
 * initializer names the exporter wrote, i.e. PyTorch's state-dict names
 * ("features.0.weight", "bn1.running_mean"), plus "<bn>.num_batches_tracked"
 * (int64 scalar; from the file when it has one, else 0) for every
 * BatchNormalization, so a cohort checkpoint loads into the PyTorch module
 * with load_state_dict(strict=True). Starting values are the file's
 * initializers (the user's PyTorch init), never cohort's own init.
 *
 * Shapes are propagated statically from input_shape, so the constant
 * subgraphs torch.onnx.export emits for flatten / reshape / chunk (Shape,
 * Gather, Unsqueeze, Squeeze, Concat, Cast, Slice, Constant,
 * ConstantOfShape, Range-free int64 Add/Sub/Mul/Div, Reshape of a constant)
 * are folded at load. The batch dimension of the file (often 1, as in
 * torch.onnx.export(model, torch.zeros(1, 1, 28, 28), ...)) is not binding:
 * the model runs at the data's batch; a Reshape to (file batch, -1),
 * (data batch, -1), (0, -1) or (-1, C*H*W) of an (N, C, H, W) value is a
 * Flatten.
 *
 * Ops and what they become (ONNX operator names; CH_ONNX_SUPPORTED_OPS):
 *   Conv (2-D, group, dilations, strides, symmetric pads, bias) -> Conv2d;
 *   BatchNormalization (the training-mode outputs ignored; its epsilon, and
 *   torch's momentum = 1 - the ONNX momentum) -> BatchNorm2d
 *   (ch_nn_batchnorm2d_ex);
 *   Relu; Clip(0, 6) -> ReLU6, Clip(a, b) -> Hardtanh(a, b), Clip(0, none)
 *   -> ReLU; LeakyRelu; Sigmoid (Mul(x, Sigmoid(x)) -> SiLU); HardSigmoid
 *   (alpha 1/6, beta 1/2: torch's; Mul(x, HardSigmoid(x)) -> Hardswish);
 *   HardSwish; Tanh; Gelu; the erf form of GELU (Div(x, sqrt 2), Erf,
 *   Add 1, Mul x, Mul 0.5 in any operand order) -> GELU; Add / Mul of two
 *   tensors -> Add / Mul (broadcast from (N, C, 1, 1)); Add / Sub / Mul /
 *   Div with a scalar constant -> Affine; Concat (axis 1) -> Cat; Split and
 *   Slice on axis 1 (step 1) -> Narrow; Reshape (N, g, C/g, H, W) +
 *   Transpose (0, 2, 1, 3, 4) + Reshape (N, C, H, W) -> ChannelShuffle(g);
 *   Transpose (0, 2, 3, 1) + LayerNormalization (last axis) + Transpose
 *   (0, 3, 1, 2) (ConvNeXt's channels-last LayerNorm, torchvision's
 *   LayerNorm2d), or torch's decomposed LayerNorm (ReduceMean, Sub, Pow,
 *   ReduceMean, Add eps, Sqrt, Div, Mul weight, Add bias) between the
 *   Transposes -> LayerNorm2d(C, eps); either form over the last axis of
 *   an (N, F) value -> LayerNorm2d on (N, F) (nn.LayerNorm(F));
 *   MaxPool, AveragePool (count_include_pad, ceil_mode, symmetric pads) ->
 *   MaxPool2d / AvgPool2d; GlobalAveragePool and ReduceMean over (2, 3)
 *   with keepdims -> AvgPool2d over the whole map ((N, C, 1, 1)),
 *   ReduceMean without keepdims -> AdaptiveAvgPool2d((1, 1)) ((N, C));
 *   Flatten (axis 1) -> Flatten; Gemm (alpha = beta = 1, transA 0) ->
 *   Linear (transB 0 weights transposed at load); MatMul by a constant (+
 *   Add of a constant vector) -> Linear; Dropout (ratio) -> Dropout;
 *   Identity, Pad with zero pads, Reshape / Squeeze to the same shape ->
 *   nothing.
 *
 * Errors (CH_ERR_UNSUPPORTED or CH_ERR_INVALID, one line starting with
 * o->what): an op outside the list (its node name, op type, the opset and
 * the list of supported ops); a node input that is neither an
 * initializer nor computed (CH_ERR_FORMAT: "missing initializer");
 * not exactly one graph input, or one that is not (N, C, H, W) float, or
 * whose C, H or W differ from input_shape (both shapes named); not
 * exactly one graph output, or one that is not a float (N, classes) value
 * (or classes != o->num_classes when that is set); attribute values
 * cohort cannot run (asymmetric pads, auto_pad, ...), naming
 * the node and the value.
 */
#ifndef COHORT_MODELS_ONNX_MODEL_H
#define COHORT_MODELS_ONNX_MODEL_H

#include <stdint.h>

#include "framework/core/status.h"
#include "framework/nn/nn.h"
#include "io/formats/onnx.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Comma-separated list of the ONNX op types the mapper accepts. */
extern const char CH_ONNX_SUPPORTED_OPS[];

typedef struct {
    const char *what; /* name for messages (the file's path); NULL: "ONNX model" */
    int num_classes;  /* expected width of the (N, classes) output; 0: any */
} ch_onnx_map_options_t;

void ch_onnx_map_options_default(ch_onnx_map_options_t *o);

/* Build the model of g for inputs of shape input_shape (N, C, H, W), all
 * > 0 (see the top of this file). The new model is finalized, its entries
 * hold the file's initializers, it is in training mode; its arch label is
 * "onnx". g is not referred to afterwards. *out is NULL on error. */
ch_status ch_onnx_to_model(const ch_onnx_model_t *g, const int64_t input_shape[4],
                           const ch_onnx_map_options_t *o, ch_model_t **out);

/* ch_onnx_load(path) + ch_onnx_to_model (o->what defaults to path). */
ch_status ch_onnx_model_load(const char *path, const int64_t input_shape[4],
                             const ch_onnx_map_options_t *o, ch_model_t **out);

#ifdef __cplusplus
}
#endif
#endif /* COHORT_MODELS_ONNX_MODEL_H */
