/* cohort: neural-network module tree (torch.nn semantics).
 *
 * A model (ch_model_t) is a tree of modules with PyTorch's names: containers
 * (Sequential, residual blocks, the model root) hold children under local
 * names ("layer1", "0", "downsample"); leaf layers (Conv2d, BatchNorm2d,
 * Linear, ReLU, MaxPool2d, AvgPool2d, AdaptiveAvgPool2d) hold parameters ("weight",
 * "bias") and buffers ("running_mean", "running_var", "num_batches_tracked").
 * Full names join the path with dots, exactly as torch.nn.Module.state_dict():
 * "conv1.weight", "layer1.0.downsample.1.running_var", "fc.bias".
 *
 * Entries (parameters and buffers) are enumerated in state-dict order:
 * for each module, its parameters, then its buffers, then its children
 * recursively in registration order (torch.nn.Module._save_to_state_dict).
 * Parameters alone, in that order, are model.parameters()' order.
 *
 * Storage: all parameters live in one contiguous float32 block in parameter
 * order, all gradients in a second block with the same layout, buffers in a
 * third (float32) and int64 counters apart. Layouts are PyTorch's: conv
 * weights (O, I, kH, kW), linear weights (out, in), vectors (C).
 *
 * Life cycle: ch_model_new -> build with ch_nn_* (models/ does this) ->
 * ch_model_finalize (names, storage, init) -> use -> ch_model_destroy.
 * Forward/backward (nn_exec) are declared in framework/nn/nn_exec.h.
 */
#ifndef COHORT_NN_H
#define COHORT_NN_H

#include <stddef.h>
#include <stdint.h>

#include "framework/core/status.h"
#include "framework/tensor/tensor.h"
#include "framework/ops/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CH_NN_MAX_DIMS 4
#define CH_NN_NAME_MAX 128 /* longest full entry name, including the NUL */

typedef struct ch_model ch_model_t;
typedef struct ch_module ch_module_t;


/* Kinds of modules. */
typedef enum {
    CH_NN_SEQUENTIAL = 0,   /* children run in order (torch.nn.Sequential; also the model root) */
    CH_NN_RESIDUAL,         /* relu(main(x) + shortcut(x)) (torchvision BasicBlock/Bottleneck) */
    CH_NN_CONV2D,           /* torch.nn.Conv2d (groups, dilation: ch_nn_conv2d_ex) */
    CH_NN_BATCHNORM2D,      /* torch.nn.BatchNorm2d (eps 1e-5, momentum 0.1) */
    CH_NN_SYNC_BATCHNORM,   /* torch.nn.SyncBatchNorm (same entries) */
    CH_NN_RELU,             /* torch.nn.ReLU(inplace=True) */
    CH_NN_MAXPOOL2D,        /* torch.nn.MaxPool2d */
    CH_NN_ADAPTIVE_AVGPOOL2D, /* torch.nn.AdaptiveAvgPool2d((1, 1)) or ((h, w)) */
    CH_NN_LINEAR,           /* torch.nn.Linear; input (N, C, 1, 1) or (N, C) is flattened */
    /* activations (formulas: framework/ops/ops.h, "activations") */
    CH_NN_HARDTANH,         /* torch.nn.Hardtanh(min_val, max_val); torch.nn.ReLU6 = (0, 6) */
    CH_NN_LEAKY_RELU,       /* torch.nn.LeakyReLU(negative_slope) */
    CH_NN_SILU,             /* torch.nn.SiLU */
    CH_NN_SIGMOID,          /* torch.nn.Sigmoid */
    CH_NN_TANH,             /* torch.nn.Tanh */
    CH_NN_GELU,             /* torch.nn.GELU(approximate='none' | 'tanh') */
    CH_NN_HARDSWISH,        /* torch.nn.Hardswish */
    CH_NN_HARDSIGMOID,      /* torch.nn.Hardsigmoid */
    CH_NN_LAYERNORM2D,      /* ConvNeXt's LayerNorm2d: LayerNorm over C at each (n, h, w) */
    CH_NN_AVGPOOL2D,        /* torch.nn.AvgPool2d */
    CH_NN_FLATTEN,          /* torch.nn.Flatten() (start_dim 1): (N, C, H, W) -> (N, C*H*W) */
    CH_NN_IDENTITY,         /* torch.nn.Identity */
    CH_NN_DROPOUT,          /* torch.nn.Dropout(p) (own generator: ch_model_set_dropout_key) */
    CH_NN_SQUEEZE_EXCITATION, /* x * gate(x) (torchvision.ops.SqueezeExcitation) */
    CH_NN_CONCAT,           /* torch.cat([branch(x) for branch in children], dim=1) */
    /* DAG graphs (ch_nn_graph) and their multi-input nodes */
    CH_NN_GRAPH,            /* a DAG of child modules (the nodes), run in the order added */
    CH_NN_ADD,              /* y = a + b (2 inputs), b a's shape or (N|1, C, 1, 1) broadcast */
    CH_NN_MUL,              /* y = a * b (2 inputs), same broadcasting (SE gates) */
    CH_NN_CAT,              /* torch.cat(inputs, dim=1), n >= 1 inputs */
    CH_NN_NARROW,           /* x[:, start:start+length] (torch.narrow / chunk / ONNX Split) */
    CH_NN_CHANNEL_SHUFFLE,  /* torchvision shufflenet channel_shuffle(x, groups) */
    CH_NN_AFFINE,           /* y = alpha * x + beta, scalar constants */
    CH_NN_KIND_COUNT_
} ch_nn_kind_t;

/* One state-dict entry: a parameter or a buffer. Owned by the model. */
typedef struct ch_param {
    const char *name;      /* full dotted name, e.g. "layer1.0.bn1.running_mean" */
    const char *local;     /* last component, e.g. "running_mean" */
    int is_buffer;         /* 0 parameter, 1 buffer */
    ch_dtype_t dtype;      /* CH_F32; num_batches_tracked is CH_I64 */
    int ndim;
    int64_t shape[CH_NN_MAX_DIMS];
    size_t numel;
    void *data;            /* float* or int64_t*, numel elements, contiguous */
    float *grad;           /* parameters: gradient, same layout; NULL for buffers */
    /* Where compute reads and writes the entry (ch_model_device): the same
     * pointers as data / grad for a model on the CPU; after
     * ch_model_to_device(CH_DEV_CUDA) device memory of the model's GPU, while
     * data / grad stay the HOST MIRROR (state-dict export/import, see
     * ch_model_sync_to_host / ch_model_sync_to_device). int64 buffers
     * (num_batches_tracked) are host counters on every device: dev_data ==
     * data. dev_grad is NULL for buffers. */
    void *dev_data;
    float *dev_grad;
    int requires_grad;     /* parameters: 1 unless frozen; buffers: 0 */
    int index;             /* position in state-dict order */
    int param_index;       /* position in parameter order, -1 for buffers */
    ch_module_t *module;   /* owning module */
} ch_param_t;

/* A view of one state-dict entry for saving/loading (the shape of a
 * safetensors tensor). For export, data points into the model. */
typedef struct {
    const char *name;
    ch_dtype_t dtype;
    int ndim;
    int64_t shape[CH_NN_MAX_DIMS];
    size_t numel;
    void *data;
} ch_nn_view_t;

/* ------------------------------------------------------------ building */

/* A new empty model whose root is a Sequential container. `arch` is a label
 * kept for messages ("resnet18"). */
ch_status ch_model_new(const char *arch, ch_model_t **out);
void ch_model_destroy(ch_model_t *model);
const char *ch_model_arch(const ch_model_t *model);
ch_module_t *ch_model_root(ch_model_t *model);

/* Add children to `parent` (a Sequential, residual, squeeze-excitation,
 * concat or graph container) under the
 * local name `name` (unique among its siblings; no '.' except in a
 * graph, see "DAG graphs"). name NULL gives the child
 * PyTorch's automatic name in nn.Sequential(*layers): its position among
 * the parent's children, "0", "1", ... (parameterless children count).
 * The child is returned in *out (may be NULL). All fail with
 * CH_ERR_INVALID on bad sizes, a duplicate name, or after
 * ch_model_finalize. */
ch_status ch_nn_sequential(ch_module_t *parent, const char *name, ch_module_t **out);
/* Conv2d(in, out, kernel k x k, stride, padding, bias). */
ch_status ch_nn_conv2d(ch_module_t *parent, const char *name, int in_channels, int out_channels,
                       int kernel, int stride, int padding, int bias, ch_module_t **out);
ch_status ch_nn_batchnorm2d(ch_module_t *parent, const char *name, int channels, ch_module_t **out);
/* BatchNorm2d(channels, eps, momentum) (torch.nn.BatchNorm2d's arguments;
 * ch_nn_batchnorm2d is eps 1e-5, momentum 0.1): invstd = 1 / sqrt(var + eps),
 * running = (1 - momentum) * running + momentum * batch statistic. SyncBN
 * conversion keeps both. CH_ERR_INVALID unless 0 < eps < 1, 0 < momentum <= 1. */
ch_status ch_nn_batchnorm2d_ex(ch_module_t *parent, const char *name, int channels, float eps,
                               float momentum, ch_module_t **out);
ch_status ch_nn_relu(ch_module_t *parent, const char *name, ch_module_t **out);
ch_status ch_nn_maxpool2d(ch_module_t *parent, const char *name, int kernel, int stride,
                          int padding, ch_module_t **out);
ch_status ch_nn_adaptive_avgpool2d(ch_module_t *parent, const char *name, ch_module_t **out);
ch_status ch_nn_linear(ch_module_t *parent, const char *name, int in_features, int out_features,
                       int bias, ch_module_t **out);

/* Activations, PyTorch's modules with their defaults (inplace=False: the
 * output is a tensor of its own; backward reads the module's input). Any
 * input shape; the output has the input's shape and layout. Formulas, their
 * PyTorch sources and derivatives (breakpoints included): framework/ops/ops.h,
 * "activations"; docs/nn-numerics.md. No state-dict entries.
 * Errors: CH_ERR_INVALID for a bad name (add_child rules) or parameter. */
/* torch.nn.Hardtanh(min_val, max_val): clamp to [min_val, max_val]
 * (min_val <= max_val; PyTorch's defaults -1, 1). */
ch_status ch_nn_hardtanh(ch_module_t *parent, const char *name, float min_val, float max_val,
                         ch_module_t **out);
/* torch.nn.ReLU6: Hardtanh(0, 6) (kind CH_NN_HARDTANH, as ReLU6 subclasses
 * Hardtanh in PyTorch). */
ch_status ch_nn_relu6(ch_module_t *parent, const char *name, ch_module_t **out);
/* torch.nn.LeakyReLU(negative_slope); PyTorch's default slope: */
#define CH_NN_LEAKY_RELU_SLOPE 0.01f
ch_status ch_nn_leaky_relu(ch_module_t *parent, const char *name, float negative_slope,
                           ch_module_t **out);
ch_status ch_nn_silu(ch_module_t *parent, const char *name, ch_module_t **out);
ch_status ch_nn_sigmoid(ch_module_t *parent, const char *name, ch_module_t **out);
ch_status ch_nn_tanh(ch_module_t *parent, const char *name, ch_module_t **out);
/* torch.nn.GELU(approximate): "none" (or NULL; the erf form) or "tanh". */
ch_status ch_nn_gelu(ch_module_t *parent, const char *name, const char *approximate,
                     ch_module_t **out);
ch_status ch_nn_hardswish(ch_module_t *parent, const char *name, ch_module_t **out);
ch_status ch_nn_hardsigmoid(ch_module_t *parent, const char *name, ch_module_t **out);

/* The element-wise function of an activation module (kind CH_NN_HARDTANH ..
 * CH_NN_HARDSIGMOID; ops.h ch_act_params_t), e.g. for an exporter.
 * CH_ERR_INVALID for another kind. */
ch_status ch_module_activation(const ch_module_t *m, ch_act_params_t *p);

/* LayerNorm over channels of (N, C, H, W) inputs: ConvNeXt's LayerNorm2d
 * (torchvision.models.convnext.LayerNorm2d, the official ConvNeXt
 * LayerNorm(data_format="channels_first")): at each (n, h, w), normalise
 * the C values with their mean and biased variance, y = (x - mean) /
 * sqrt(var + eps) * weight[c] + bias[c]. Entries "weight" (C, init 1) and
 * "bias" (C, init 0), elementwise_affine as PyTorch's default. eps > 0;
 * ConvNeXt's value is CH_NN_LAYERNORM2D_EPS. Same in training and eval.
 * An (N, C) input runs as (N, C, 1, 1): torch.nn.LayerNorm(C) over the
 * features of a flattened value (the ONNX mapper's LayerNormalization
 * after a Flatten). Formulas of forward and backward: ops.h
 * ch_op_layernorm2d_forward. */
#define CH_NN_LAYERNORM2D_EPS 1e-6f
ch_status ch_nn_layernorm2d(ch_module_t *parent, const char *name, int channels, float eps,
                            ch_module_t **out);
/* Every argument of torch.nn.Conv2d (padding_mode 'zeros' only). Start from
 * ch_conv2d_options_default, which sets PyTorch's defaults. */
typedef struct ch_conv2d_options {
    int in_channels, out_channels; /* > 0, both divisible by groups */
    int kernel_h, kernel_w;        /* > 0 */
    int stride_h, stride_w;        /* > 0; default 1 */
    int pad_h, pad_w;              /* >= 0, zeros on both sides; default 0 */
    int dilation_h, dilation_w;    /* > 0; default 1 */
    int groups;                    /* > 0; default 1; in_channels: depthwise */
    int bias;                      /* 1 (default): a bias entry (O) */
} ch_conv2d_options_t;

/* *o = Conv2d(in_channels, out_channels, kernel) with PyTorch's defaults:
 * square kernel, stride 1, padding 0, dilation 1, groups 1, bias. */
void ch_conv2d_options_default(ch_conv2d_options_t *o, int in_channels, int out_channels,
                               int kernel);

/* Conv2d with every option: weight (out, in/groups, kh, kw) as PyTorch,
 * bias (out) when o->bias. Output size torch's
 * floor((H + 2p - d(k-1) - 1)/s) + 1. CH_ERR_INVALID naming the module and
 * the bad value (sizes <= 0, channels not divisible by groups). */
ch_status ch_nn_conv2d_ex(ch_module_t *parent, const char *name, const ch_conv2d_options_t *o,
                          ch_module_t **out);

/* torch.nn.MaxPool2d / AvgPool2d arguments (dilation 1, no
 * divisor_override). Start from ch_pool2d_options_default. */
typedef struct ch_pool2d_options {
    int kernel_h, kernel_w;        /* > 0 */
    int stride_h, stride_w;        /* > 0; default = the kernel (torch stride=None) */
    int pad_h, pad_w;              /* 0 <= pad <= kernel/2; default 0 */
    int ceil_mode;                 /* 0 (default) floor, 1 ceil: the output size rule of
                                      ops.h ch_pool_out_size */
    int count_include_pad;         /* AvgPool2d only; 1 (default) */
} ch_pool2d_options_t;

/* *o = a square kernel, stride = kernel, padding 0, ceil_mode 0,
 * count_include_pad 1 (PyTorch's defaults). */
void ch_pool2d_options_default(ch_pool2d_options_t *o, int kernel);

/* MaxPool2d with every option (padding is -inf; ceil_mode). */
ch_status ch_nn_maxpool2d_ex(ch_module_t *parent, const char *name,
                             const ch_pool2d_options_t *o, ch_module_t **out);

/* AvgPool2d(kernel, stride, padding, ceil_mode, count_include_pad): the
 * divisor rules of ops.h ch_op_avgpool2d_forward. */
ch_status ch_nn_avgpool2d(ch_module_t *parent, const char *name, const ch_pool2d_options_t *o,
                          ch_module_t **out);

/* AdaptiveAvgPool2d((out_h, out_w)), both > 0: output (N, C, out_h, out_w)
 * with PyTorch's bins (ops.h ch_op_adaptive_avgpool2d_forward). (1, 1) is
 * ch_nn_adaptive_avgpool2d (global average, output (N, C) for Linear). */
ch_status ch_nn_adaptive_avgpool2d_hw(ch_module_t *parent, const char *name, int out_h,
                                      int out_w, ch_module_t **out);
/* Flatten (torch.nn.Flatten(), start_dim 1, end_dim -1): (N, C, H, W) ->
 * (N, C*H*W) in PyTorch's order (c, h, w), whatever layout the activation
 * had (a blocked or channels-last input is reordered to plain; a plain one
 * is only viewed); (N, F) passes through. No entries. Linear takes its
 * output. */
ch_status ch_nn_flatten(ch_module_t *parent, const char *name, ch_module_t **out);
/* Identity (torch.nn.Identity): y = x, dx = dy. No entries. */
ch_status ch_nn_identity(ch_module_t *parent, const char *name, ch_module_t **out);
/* Dropout(p) (torch.nn.Dropout, 0 <= p <= 1): in training mode each element
 * is zeroed with probability p and the rest scaled by 1 / (1 - p)
 * (ch_op_dropout); in eval mode the identity. The backward applies the
 * forward's mask to dy. Masks come from cohort's own counter-based
 * generator (framework/ops/dropout_mask.h), keyed per step by
 * ch_model_set_dropout_key and per layer by its ordinal among the model's
 * Dropout layers: the same for any thread count and device, and NOT
 * mask-identical to PyTorch's (statistics match, bits do not). Output:
 * plain layout (a blocked input is reordered first). No entries. */
ch_status ch_nn_dropout(ch_module_t *parent, const char *name, float p, ch_module_t **out);

/* Which masks the model's Dropout layers draw in the next training
 * forward (ch_dropout_key_t of ops.h, with stream = the layer's ordinal):
 * local sample n of the batch is global sample sample_base + n *
 * sample_stride of `epoch`. The trainer calls it before every step with
 * train.seed, the epoch, step * batch * world + rank and the world size,
 * so the masks are a function of (seed, layer, epoch, global sample) and
 * do not change with the world size; a hand-written loop must call it per
 * step too (otherwise each step repeats the masks). Defaults: 0, 0, 0, 1.
 * CH_ERR_INVALID for sample_base < 0 or sample_stride < 1. */
ch_status ch_model_set_dropout_key(ch_model_t *model, uint64_t seed, uint64_t epoch,
                                   int64_t sample_base, int64_t sample_stride);

/* A residual container computing final_relu(main(x) + shortcut(x)).
 * Add its children with the ch_nn_* builders in torchvision's registration
 * order, then describe the computation with ch_nn_residual_set_path: `main`
 * lists n children applied in order (a ReLU child may appear several times:
 * it is applied in place), `shortcut` is a child Sequential (downsample) or
 * NULL for identity, `final_relu` a ReLU child. */
ch_status ch_nn_residual(ch_module_t *parent, const char *name, ch_module_t **out);
ch_status ch_nn_residual_set_path(ch_module_t *block, ch_module_t *const *main, int n,
                                  ch_module_t *shortcut, ch_module_t *final_relu);

/* A squeeze-excitation container (torchvision.ops.SqueezeExcitation):
 * y = x * gate(x), x (N, C, H, W), where the gate is the container's
 * children run in order, as a Sequential, on x, ending in (N, C, 1, 1)
 * (or (N, C)), broadcast over H and W (ch_op_mul_channel). Built with
 * torchvision's names the state dict matches it: avgpool
 * (ch_nn_adaptive_avgpool2d: inside this container its output stays
 * (N, C, 1, 1), as AdaptiveAvgPool2d(1)), fc1 (Conv2d C -> S, 1x1, bias),
 * activation (ReLU), fc2 (Conv2d S -> C, 1x1, bias), scale_activation
 * (Sigmoid), giving "<name>.fc1.weight", "<name>.fc2.bias". Backward:
 * dx = dy * s + (gradient through the gate of ds = sum over H, W of
 * dy * x). The gate must not start with an in-place ReLU (it would change
 * x). Errors at plan: CH_ERR_INVALID naming the block when the gate gives
 * a shape other than (N, C, 1, 1). */
ch_status ch_nn_squeeze_excitation(ch_module_t *parent, const char *name, ch_module_t **out);

/* A channel-concat container (Inception-style branches): every child
 * (a branch; a Sequential for more than one layer) takes the container's
 * input x and the outputs (N, C_i, H, W) are concatenated along C in the
 * order the children were added (torch.cat(dim=1), ch_op_concat_channels);
 * output layout: the compute context's preferred one for sum C_i.
 * Backward splits dy by channels and sums the branches' input gradients.
 * Branches must not start with an in-place ReLU. Errors at plan:
 * CH_ERR_INVALID naming the container when it has no child or branches
 * disagree in N, H, W. */
ch_status ch_nn_concat(ch_module_t *parent, const char *name, ch_module_t **out);

/* ------------------------------------------------------------ DAG graphs
 *
 * A graph container runs its children (the nodes) in the order they were
 * added, which must be a topological order; each node reads VALUES:
 *
 *   value 0            the graph's input x
 *   value k (k >= 1)   the output of the k-th node added (1-based)
 *
 * Build: add a node with any ch_nn_* builder (parent = the graph), then
 * ch_nn_graph_connect it to its input values (ids < its own id), then add
 * the next; a node's own value id is ch_module_num_children(graph) right
 * after it was added. Every existing single-input module (Conv2d, BatchNorm2d,
 * activations, pools, Linear, Flatten, Dropout, Identity, Sequential,
 * Residual, ...) is a node with one input; CH_NN_ADD and CH_NN_MUL take 2,
 * CH_NN_CAT n >= 1, the others 1. The graph's output is the value
 * ch_nn_graph_set_output names, by default the last node's; nodes that do
 * not lead to it still run forward but get no gradient.
 *
 * Names: node local names may contain dots ("features.0", giving entries
 * "features.0.weight"); a graph named "" must be the model root's only
 * child, and its nodes then have unprefixed paths, so a graph can carry a
 * PyTorch model's state-dict names verbatim. Entry names stay unique
 * (finalize checks). Parameter and state-dict order = node order.
 *
 * Values and gradients (docs/nn-numerics.md, "DAG graphs"): a value keeps
 * its producer's tensor and layout; consumers read it and never change it,
 * except an in-place ReLU under the rule below. The gradient of a value
 * read by one consumer is that consumer's input gradient as it comes (no
 * copy); a value read by several (or twice by one node) gets an
 * accumulation tensor: the first contribution copied in, the others added
 * (summed in reverse node order).
 *
 * In-place ReLU rule: a CH_NN_RELU node runs in place (as in trees) only
 * when its input value has no other consumer, is not the graph's input,
 * and its producer writes a fresh output that its own backward does not
 * read (Conv2d, BatchNorm2d, LayerNorm2d, Linear, pools, activations,
 * Add, Mul, Cat, Narrow, ChannelShuffle, Affine, SqueezeExcitation,
 * Concat); otherwise it writes an output of its own (torch's
 * ReLU(inplace=False)); the results are the same either way. A
 * Sequential node whose first layer is a ReLU follows the same rule, and
 * an Add of one shape or with b broadcast writes its sum over a under it
 * (as the residual block's add), else into a tensor of its own.
 *
 * Inside a graph AdaptiveAvgPool2d(1) keeps (N, C, 1, 1) (torch's shape;
 * Linear and Flatten take it). A graph model ends in Linear or Flatten
 * (logits (N, classes)), as every model. Everything of a tree model works
 * on a graph model: ch_model_convert_sync_bn (BN nodes), the
 * gradient-ready hook (reverse parameter order), requires_grad,
 * train/eval, ch_model_to_device (the graph ops have CUDA kernels),
 * state dicts and model files, dropout keys, both init schemes;
 * ch_model_activation takes a node's path ("layer1.0.add").
 *
 * Layouts: values keep their producers' layouts (the compute context's
 * preferred ones); Add, Mul and Cat accept operands in different layouts
 * (Add reorders b into a's layout when they differ; Mul and Cat read any
 * layout), the output takes the full operand's layout (Cat, Narrow: the
 * preferred one for their channels).
 *
 * Errors (CH_ERR_INVALID, one line naming the graph and node): at connect,
 * an input id >= the node's own id, a node connected twice or not a child
 * of the graph, a wrong input count for the kind; at finalize, a node
 * never connected; at plan, operand shapes that do not match (both
 * shapes named). */
ch_status ch_nn_graph(ch_module_t *parent, const char *name, ch_module_t **out);
/* Connect `node` (the graph's most recently added child) to its input
 * values inputs[0..n_inputs). */
ch_status ch_nn_graph_connect(ch_module_t *graph, ch_module_t *node, const int *inputs,
                              int n_inputs);
/* The graph's output: value 0..number of nodes (checked at finalize). */
ch_status ch_nn_graph_set_output(ch_module_t *graph, int value);
/* Graph nodes (parent: a graph; Narrow, ChannelShuffle and Affine also work
 * as one-input layers of a Sequential). No entries.
 * Add: y = a + b; Mul: y = a * b. Inputs (a, b): both (N, C, H, W) of one
 * shape, or one of them (N, C, 1, 1) / (1, C, 1, 1) (or (N, C) / (1, C))
 * broadcast over H, W (and N) in either operand order; backward sums the
 * broadcast operand's gradient over the broadcast dimensions
 * (ops.h ch_op_binary_backward). */
ch_status ch_nn_add(ch_module_t *parent, const char *name, ch_module_t **out);
ch_status ch_nn_mul(ch_module_t *parent, const char *name, ch_module_t **out);
/* torch.cat(inputs, dim=1) of n >= 1 inputs (N, C_i, H, W), same N, H, W;
 * output in the preferred layout for sum C_i. */
ch_status ch_nn_cat(ch_module_t *parent, const char *name, ch_module_t **out);
/* x[:, start:start + length] of an (N, C, H, W) input (torch.narrow(x, 1,
 * start, length), torch.chunk, ONNX Split / Slice on axis 1): start >= 0,
 * length >= 1, start + length <= C at plan. Output in the preferred layout
 * for length channels; backward scatters dy into a zero dx. */
ch_status ch_nn_narrow(ch_module_t *parent, const char *name, int start, int length,
                       ch_module_t **out);
/* torchvision.models.shufflenetv2.channel_shuffle(x, groups), groups >= 1
 * dividing C (checked at plan): y[:, j] = x[:, (j % g) * (C / g) + j / g];
 * backward is the inverse permutation. Output in x's layout. */
ch_status ch_nn_channel_shuffle(ch_module_t *parent, const char *name, int groups,
                                ch_module_t **out);
/* y = alpha * x + beta with scalar constants (ONNX Mul / Add / Sub / Div by
 * a scalar), x (N, F) or (N, C, H, W); dx = alpha * dy. Output in x's
 * layout. alpha, beta finite. */
ch_status ch_nn_affine(ch_module_t *parent, const char *name, float alpha, float beta,
                       ch_module_t **out);

/* Find a child by local name (NULL if absent). */
ch_module_t *ch_module_child(const ch_module_t *m, const char *name);
/* The children of m in registration order (torch.nn.Module.children()):
 * 0 <= i < ch_module_num_children(m); NULL out of range. */
int ch_module_num_children(const ch_module_t *m);
ch_module_t *ch_module_child_at(const ch_module_t *m, int i);
ch_nn_kind_t ch_module_kind(const ch_module_t *m);
/* The parent module (NULL for the root). */
ch_module_t *ch_module_parent(const ch_module_t *m);
/* Full dotted path of the module ("layer1.0.bn1"; "" for the root). */
const char *ch_module_path(const ch_module_t *m);

/* Assign names, check them (unique, < CH_NN_NAME_MAX), allocate parameter,
 * gradient and buffer storage, and initialise with ch_model_init(seed). */
ch_status ch_model_finalize(ch_model_t *model, uint64_t seed);

/* Initialisation schemes (ch_model_init_scheme). */
typedef enum {
    CH_NN_INIT_RESNET = 0, /* torchvision's ResNet init (ch_model_init) */
    CH_NN_INIT_DEFAULT     /* each module's PyTorch reset_parameters (ch_model_init_default) */
} ch_nn_init_t;

/* ch_model_finalize with the given scheme instead of the ResNet one. */
ch_status ch_model_finalize_init(ch_model_t *model, ch_nn_init_t scheme, uint64_t seed);

/* Re-initialise with `scheme` (ch_model_init or ch_model_init_default). */
ch_status ch_model_init_scheme(ch_model_t *model, ch_nn_init_t scheme, uint64_t seed);

/* PyTorch's default initialisation of a module a user builds
 * (torch.nn.Conv2d / Linear .reset_parameters, torch 1.13 and 2.x):
 * weight kaiming_uniform_(a=sqrt(5)), which is U(-b, b) with
 * b = gain * sqrt(3 / fan_in), gain = sqrt(2 / (1 + 5)), i.e.
 * b = 1 / sqrt(fan_in); bias U(-1/sqrt(fan_in), 1/sqrt(fan_in));
 * fan_in = in_channels * kh * kw (conv) or in_features (linear).
 * BatchNorm weight 1, bias 0, running_mean 0, running_var 1,
 * num_batches_tracked 0. One xoshiro256** stream seeded with `seed`,
 * entries in state-dict order (so the same on every rank; not torch's
 * generator: the distributions match, not the bits). Gradients zeroed. */
ch_status ch_model_init_default(ch_model_t *model, uint64_t seed);

/* Re-initialise every entry as torchvision's ResNet does (SEMANTICS.md):
 * Conv2d weight ~ N(0, 2 / (out_channels * kh * kw)) (kaiming_normal_,
 * mode='fan_out', nonlinearity='relu'), conv bias (if any) and Linear weight
 * and bias ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (Linear.reset_parameters),
 * BatchNorm weight 1, bias 0, running_mean 0, running_var 1,
 * num_batches_tracked 0, LayerNorm2d weight 1, bias 0. Draws from one xoshiro256** stream seeded with
 * `seed`, entries in state-dict order. Gradients are zeroed. */
ch_status ch_model_init(ch_model_t *model, uint64_t seed);

/* ------------------------------------------------------------ entries
 *
 * Writing parameters (framework/tensor/tensor.h, "parameter data version"):
 * the CPU convolution keeps each weight converted into its kernel's format
 * until ch_tensor_data_version() changes. Every function here that writes
 * parameters or returns a pointer to them (ch_model_entry / _param / _find
 * for a parameter, ch_model_param_block, ch_model_device_param_block,
 * ch_model_state_dict) calls ch_tensor_data_changed(), so "get the pointer,
 * write, forward" is safe; code that keeps such a pointer and writes
 * through it after a later forward must call ch_tensor_data_changed()
 * itself before the next forward. */

/* State-dict entries (parameters and buffers), 0 <= i < count. */
int ch_model_num_entries(const ch_model_t *model);
ch_param_t *ch_model_entry(const ch_model_t *model, int i);
/* Parameters only (model.parameters() order). */
int ch_model_num_params(const ch_model_t *model);
ch_param_t *ch_model_param(const ch_model_t *model, int i);
/* Entry by full name, NULL if none. */
ch_param_t *ch_model_find(const ch_model_t *model, const char *name);
/* Total float32 elements of all parameters / of the trainable ones. */
size_t ch_model_param_numel(const ch_model_t *model);
size_t ch_model_trainable_numel(const ch_model_t *model);
/* The contiguous parameter and gradient blocks (parameter order, numel =
 * ch_model_param_numel). Parameter i starts at
 * ch_model_param(model, i)->data - block. */
float *ch_model_param_block(ch_model_t *model);
float *ch_model_grad_block(ch_model_t *model);
/* The float32 buffers (running_mean/running_var in state-dict order) and the
 * int64 buffers (num_batches_tracked) as two contiguous blocks, e.g. for
 * DDP's broadcast of rank 0's buffers before each forward in two calls.
 * *numel (may be NULL) receives the element count. */
float *ch_model_buffer_block(ch_model_t *model, size_t *numel);
int64_t *ch_model_counter_block(ch_model_t *model, size_t *numel);

/* ------------------------------------------------------------ modes */

/* model.train(on) / model.eval(): BatchNorm uses batch statistics and
 * updates running stats in training mode, running stats in eval mode. */
void ch_model_train(ch_model_t *model, int on);
int ch_model_is_training(const ch_model_t *model);

/* Set every gradient to 0 (optimizer.zero_grad(set_to_none=False)): the
 * host block, and for a device model also the device block (synchronously,
 * ch_device_memzero; a CUDA failure there is logged with ch_log_error). */
void ch_model_zero_grad(ch_model_t *model);

/* requires_grad of one parameter by name. CH_ERR_INVALID when no parameter
 * has that name (buffers never require grad). */
ch_status ch_model_set_requires_grad(ch_model_t *model, const char *name, int on);

/* freeze_layers of the seed recipe: every parameter whose name does not
 * contain `keep` (normally "fc") gets requires_grad = 0. Returns in
 * *n_frozen (may be NULL) how many were frozen. */
ch_status ch_model_freeze(ch_model_t *model, const char *keep, int *n_frozen);

/* ------------------------------------------------------------ state dict */

/* Export the state dict: fills views[0..n) with n = ch_model_num_entries
 * (state-dict order; data points into the model's HOST storage, the mirror
 * of a GPU model: ch_model_sync_to_host first; valid until the model is
 * destroyed). CH_ERR_RANGE when capacity < n. */
ch_status ch_model_state_dict(ch_model_t *model, ch_nn_view_t *views, int capacity, int *count);

/* Load a state dict given as n views (any order).
 *  strict != 0 (load_state_dict(strict=True)): every model entry must be
 *   present with the same dtype and shape and no unknown name may appear;
 *   otherwise CH_ERR_INVALID naming the first offender, and nothing is
 *   changed.
 *  strict == 0 (pretrained weights, SEMANTICS.md): an entry is copied when
 *   the model has that name and the element counts match (dtype float32 or
 *   int64 must match the entry's); everything else is skipped.
 * Skipped view names are reported through `skipped` (may be NULL): called
 * once per skipped name with a reason ("not in model", "shape [10, 512] vs
 * model [1000, 512]"); *n_loaded (may be NULL) receives the number copied.
 * Model entries that the views do not mention keep their values.
 * Writes the HOST storage: on a GPU model call ch_model_sync_to_device
 * afterwards. */
typedef void (*ch_nn_skip_fn)(void *arg, const char *name, const char *reason);
ch_status ch_model_load_state_dict(ch_model_t *model, const ch_nn_view_t *views, int n,
                                   int strict, ch_nn_skip_fn skipped, void *arg, int *n_loaded);

/* Copy every entry (parameters and buffers) from src to dst; both must have
 * identical entry lists (same names and shapes). Copies the host storage
 * (the host mirror of a device model: ch_model_sync_to_host src first and
 * ch_model_sync_to_device dst afterwards when they live on a GPU). */
ch_status ch_model_copy(ch_model_t *dst, const ch_model_t *src);

/* ------------------------------------------------------------ devices
 *
 * A finalized model computes on the CPU (host blocks) until moved:
 *
 *   ch_model_finalize / load weights     host blocks hold the state
 *   ch_model_to_device(m, CH_DEV_CUDA, g) device blocks (parameters,
 *                                        gradients, float buffers) on GPU g,
 *                                        copied from the host; the host
 *                                        blocks stay as the mirror
 *   ch_model_plan/forward/loss/backward  take CH_DEV_CUDA inputs (x, labels,
 *                                        dlogits) on GPU g; activations in a
 *                                        device arena; logits on the device
 *   ch_model_sync_to_host                device -> mirror, before
 *                                        ch_model_state_dict / saving /
 *                                        comparing
 *   ch_model_load_state_dict + ch_model_sync_to_device   mirror -> device
 *
 * The int64 counters (num_batches_tracked) are host values on every device
 * (they never enter a kernel), so they are always current in the mirror.
 * Everything that reads or writes ch_param_t data/grad (state dict, copy,
 * init, load) touches the mirror only; compute uses dev_data/dev_grad. */

/* Move parameters, gradients and float buffers to device storage on
 * (dev, dev_index): CH_DEV_CUDA allocates device blocks through the tensor
 * allocator (ch_device_enable_tensors), copies the host blocks there and
 * binds every module tensor (weights, gradients, running stats, batch-norm
 * scratch vectors, SyncBN gather buffers) to device memory; CH_DEV_CPU
 * (from a GPU) copies the device state back into the host blocks, frees the
 * device blocks and binds the host ones again. Moving to where the model
 * already is does nothing. Drops the activation plan (the arena lives on
 * the model's device; the next forward plans again). Call after
 * finalize/loading and before planning. Synchronous (ch_device_memcpy).
 * Errors: CH_ERR_INVALID (not finalized, unknown device, negative index),
 * CH_ERR_UNSUPPORTED (build without CUDA), CH_ERR_RANGE (no such GPU),
 * CH_ERR_NOMEM / CH_ERR_CUDA; on an allocation or copy error the model
 * stays on its old device (an out-of-memory while re-binding the small
 * batch-norm vectors afterwards leaves it unusable: destroy it). */
ch_status ch_model_to_device(ch_model_t *m, ch_devkind_t dev, int dev_index);

/* Device -> host mirror: parameters, gradients and float buffers (after all
 * queued GPU work: ch_device_memcpy waits for every stream of the GPU).
 * Before ch_model_state_dict, saving, comparing. No-op (CH_OK) on the CPU. */
ch_status ch_model_sync_to_host(ch_model_t *m);

/* Host mirror -> device: parameters, gradients and float buffers (after
 * ch_model_load_state_dict, ch_model_copy or ch_model_init into the
 * mirror). No-op (CH_OK) on the CPU. */
ch_status ch_model_sync_to_device(ch_model_t *m);

/* The device compute uses for this model (CH_DEV_CPU until
 * ch_model_to_device); *dev_index (may be NULL) receives the GPU ordinal (0
 * for the CPU). */
ch_devkind_t ch_model_device(const ch_model_t *m, int *dev_index);

/* The blocks compute uses (ch_model_device): the host blocks of
 * ch_model_param_block / ch_model_grad_block / ch_model_buffer_block on the
 * CPU, the device blocks after ch_model_to_device(CH_DEV_CUDA). Same layout
 * and numel as the host blocks. For DDP (all-reduce / broadcast in place). */
float *ch_model_device_param_block(ch_model_t *m);
float *ch_model_device_grad_block(ch_model_t *m);
float *ch_model_device_buffer_block(ch_model_t *m, size_t *numel);

#ifdef __cplusplus
}
#endif
#endif /* COHORT_NN_H */
