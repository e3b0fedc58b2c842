/* cohort: internals of the module tree shared by nn.c and nn_exec.c.
 * Not installed; nothing outside framework/nn*.c includes it. */
#ifndef COHORT_NN_INTERNAL_H
#define COHORT_NN_INTERNAL_H

#include "framework/tensor/arena.h"
#include "framework/nn/nn.h"
#include "framework/nn/nn_exec.h"
#include "framework/ops/ops.h"
#include "framework/tensor/tensor.h"

#define NN_MAX_ENTRIES_PER_MODULE 5
#define NN_BN_EPS 1e-5f
#define NN_BN_MOMENTUM 0.1f
/* a batch norm module's eps and momentum (ch_nn_batchnorm2d_ex; 0 = the defaults above) */
#define NN_BN_EPS_OF(m) ((m)->bn_eps > 0.0f ? (m)->bn_eps : NN_BN_EPS)
#define NN_BN_MOMENTUM_OF(m) ((m)->bn_momentum > 0.0f ? (m)->bn_momentum : NN_BN_MOMENTUM)

struct ch_module {
    ch_nn_kind_t kind;
    char *local;             /* local name ("conv1", "0"); "" for the root */
    char *path;              /* full dotted path, set at finalize */
    ch_module_t *parent;
    ch_model_t *model;
    ch_module_t **child;
    int nchild, capchild;

    /* entries declared by the builder, in torch registration order
     * (parameters first, then buffers) */
    ch_param_t ent[NN_MAX_ENTRIES_PER_MODULE];
    int nent;

    /* configuration */
    int in_c, out_c, kernel, has_bias;     /* conv, linear */
    int channels;                          /* batch norm */
    float bn_eps, bn_momentum;             /* batch norm; 0: NN_BN_EPS / NN_BN_MOMENTUM */
    int kernel_h, kernel_w;                /* conv (kernel: the square one's) */
    int out_h, out_w;                      /* adaptive avg pool; 0: global (1, 1) */
    ch_conv2d_params_t conv;
    ch_pool2d_params_t pool;
    float drop_p;                          /* dropout probability */
    uint64_t drop_stream;                  /* dropout: ordinal among the model's Dropout layers */

    /* residual container */
    ch_module_t **main;
    int nmain;
    ch_module_t *shortcut, *final_relu;
    const ch_tensor_t **step_out; /* per main step: output seen in forward */

    /* squeeze-excitation: ds = gradient of the gate's output (arena);
     * concat: per child, its output seen in forward and its slice of dy
     * (arena), nchild each, allocated at plan */
    ch_tensor_t se_ds;
    const ch_tensor_t **part_out;
    ch_tensor_t *part_dy;
    ch_tensor_t **part_dyp;              /* &part_dy[i] */

    /* tensors over parameter / gradient / buffer storage (set at finalize) */
    ch_tensor_t w, b, dw, db;              /* conv, linear, bn weight/bias */
    ch_tensor_t rmean, rvar;               /* bn running stats */
    int64_t *nbt;                          /* bn num_batches_tracked */

    /* batch norm per-step vectors (C each, allocated at finalize) */
    ch_tensor_t mean, var;                 /* batch (or global) statistics */
    ch_tensor_t sum_dy, sum_dy_xmu;        /* views into sums */
    ch_tensor_t sums;                      /* (2C): [sum_dy | sum_dy_xmu] */
    float *gather;                         /* SyncBN: R*(2C+1) floats */
    ch_tensor_t g_means, g_vars;           /* (R, C) views into gather (CPU) or g_dev (GPU) */
    ch_tensor_t g_dev;                     /* SyncBN on a GPU model: (2*R*C) [means | vars] */
    int64_t *g_counts;                     /* R */
    int64_t count_total;                   /* count used by the last training forward */

    /* activations (arena) */
    ch_tensor_t y, dx;
    ch_tensor_t xview;                     /* linear: 2-D view of a (N,C,1,1) input;
                                              layernorm2d: 4-D view of a (N,C) input */
    ch_tensor_t flat, dyview;              /* flatten: 2-D output view, 4-D view of dy;
                                              layernorm2d on (N,C): 4-D y / dx, dy views */
    const ch_tensor_t *in;                 /* input of the last forward */
    const ch_tensor_t *out;                /* output of the last forward */
    int forward_training;                  /* mode of the last forward */

    /* activations (CH_NN_HARDTANH .. CH_NN_HARDSIGMOID) and LayerNorm2d */
    ch_act_params_t act;
    float ln_eps;
    ch_tensor_t ln_mean, ln_rstd;          /* (N*H*W) per position, arena */

    /* graph node (a child of a CH_NN_GRAPH): input value ids (g_nin; 0:
     * not connected), inputs seen in forward, per-input gradients of the
     * last backward (NULL: none) and, for Add / Mul / Cat, per-input
     * gradient tensors (arena; Add: the broadcast operand's only) */
    int *g_in;
    int g_nin;
    const ch_tensor_t **g_x;
    ch_tensor_t **g_dxp;
    ch_tensor_t *g_dx;
    ch_tensor_t g_tmp;                     /* add: b reordered into a's layout */
    int g_bcast;                           /* add/mul: input 1 (or 0 if g_swap) broadcast */
    int g_swap;                            /* add/mul: the broadcast operand is input 0 */
    int g_reorder;                         /* add: b in another layout (g_tmp) */
    int g_inplace;                         /* add: y written over the full operand */
    int relu_copy;                         /* ReLU: out of place (graph in-place rule) */
    int narrow_start, narrow_len, groups;  /* narrow, channel shuffle */
    float alpha, beta;                     /* affine */
    /* graph container: output value, per value (nnodes + 1) its tensor in
     * the last forward, its gradient in backward, its accumulation tensor
     * (arena, used when g_nacc[v] > 1 contributions), live flags */
    int g_out;
    const ch_tensor_t **g_val;
    ch_tensor_t **g_grad;
    ch_tensor_t *g_acc;
    int *g_nacc;
    unsigned char *g_live, *g_need, *g_have, *g_useacc;

    /* backward flags, recomputed at the start of each backward */
    int needs_dx;                          /* gradient w.r.t. the input is wanted */
    int trainable;                         /* subtree has a parameter with requires_grad */
};

struct ch_model {
    char *arch;
    ch_module_t *root;
    int finalized;
    int training;

    ch_param_t **entries; /* state-dict order */
    int nentries;
    ch_param_t **params;  /* parameter order */
    int nparams;

    float *param_block, *grad_block; /* nparams' data / grads */
    size_t param_numel;
    float *buffer_block;             /* float buffers */
    /* device copies (ch_model_to_device); NULL on the CPU */
    ch_devkind_t dev;
    int dev_index;
    float *d_param_block, *d_grad_block, *d_buffer_block;
    float loss_host;                 /* last loss read back from the device */
    int have_loss_value;             /* a ch_model_loss since the last forward */
    double label_smoothing;          /* ch_model_set_label_smoothing; 0: plain cross-entropy */
    int64_t *i64_block;              /* int64 buffers */
    size_t buffer_numel, i64_numel;

    /* execution */
    ch_arena_t *arena;
    int planned;
    int64_t plan_shape[4];
    ch_layout_t plan_layout;
    ch_dtype_t plan_dtype;
    ch_tensor_t dlogits, loss;    /* arena */
    const ch_tensor_t *logits;
    int have_forward;             /* a forward since the last plan */
    int have_loss;                /* ch_model_loss since the last forward */

    ch_nn_grad_hook_fn hook;
    void *hook_arg;

    ch_dropout_key_t drop_key;    /* ch_model_set_dropout_key (stream set per layer) */
    int n_dropout;                /* Dropout layers added so far */

    ch_nn_sync_t sync;            /* SyncBN process group (valid when has_sync) */
    int has_sync;
    ch_nn_count_gather_fn count_gather; /* SyncBN on a GPU: host gather of counts */
    void *count_gather_ctx;
    double sync_seconds;          /* ch_model_sync_bn_seconds */
    /* SyncBN backward with iallreduce_sum: a convolution whose weight
     * gradient waits for the next SyncBN's all-reduce to be in flight (NULL:
     * none), and the gradient of its output */
    ch_module_t *deferred_conv;
    const ch_tensor_t *deferred_dy;
    const ch_tensor_t *last_sync_dx; /* dx of the SyncBN backward that ran last */
};

/* Kinds CH_NN_HARDTANH .. CH_NN_HARDSIGMOID: element-wise activations
 * computed by ch_op_act_* with the module's act parameters. */
static inline int ch_nn_is_activation(ch_nn_kind_t k)
{
    return k >= CH_NN_HARDTANH && k <= CH_NN_HARDSIGMOID;
}

/* (Re)allocate the SyncBN gather storage of batch-norm module m for the
 * model's device and world size (nn_exec.c; used by convert and by
 * ch_model_to_device). */
ch_status ch_nn_sync_storage(ch_model_t *M, ch_module_t *m);

/* (Re)bind module m's (and its children's) tensors to the model's current
 * storage (dev_data/dev_grad) and allocate the batch-norm vectors on the
 * model's device (nn.c). */
ch_status ch_nn_bind_module(ch_model_t *M, ch_module_t *m);

#endif /* COHORT_NN_INTERNAL_H */
