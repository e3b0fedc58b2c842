/* cohort: module tree, entries, initialisation and state dicts (see nn.h). */
#include "config.h"

#include "framework/nn/nn_internal.h"
#include "framework/tensor/device.h"
#include "framework/core/log.h"
#include "framework/nn/nn_rng.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *kind_name(ch_nn_kind_t k)
{
    switch (k) {
    case CH_NN_SEQUENTIAL: return "Sequential";
    case CH_NN_RESIDUAL: return "Residual";
    case CH_NN_CONV2D: return "Conv2d";
    case CH_NN_BATCHNORM2D: return "BatchNorm2d";
    case CH_NN_SYNC_BATCHNORM: return "SyncBatchNorm";
    case CH_NN_RELU: return "ReLU";
    case CH_NN_MAXPOOL2D: return "MaxPool2d";
    case CH_NN_ADAPTIVE_AVGPOOL2D: return "AdaptiveAvgPool2d";
    case CH_NN_AVGPOOL2D: return "AvgPool2d";
    case CH_NN_LINEAR: return "Linear";
    case CH_NN_HARDTANH: return "Hardtanh";
    case CH_NN_LEAKY_RELU: return "LeakyReLU";
    case CH_NN_SILU: return "SiLU";
    case CH_NN_SIGMOID: return "Sigmoid";
    case CH_NN_TANH: return "Tanh";
    case CH_NN_GELU: return "GELU";
    case CH_NN_HARDSWISH: return "Hardswish";
    case CH_NN_HARDSIGMOID: return "Hardsigmoid";
    case CH_NN_LAYERNORM2D: return "LayerNorm2d";
    case CH_NN_FLATTEN: return "Flatten";
    case CH_NN_IDENTITY: return "Identity";
    case CH_NN_DROPOUT: return "Dropout";
    case CH_NN_SQUEEZE_EXCITATION: return "SqueezeExcitation";
    case CH_NN_CONCAT: return "Concat";
    case CH_NN_GRAPH: return "Graph";
    case CH_NN_ADD: return "Add";
    case CH_NN_MUL: return "Mul";
    case CH_NN_CAT: return "Cat";
    case CH_NN_NARROW: return "Narrow";
    case CH_NN_CHANNEL_SHUFFLE: return "ChannelShuffle";
    case CH_NN_AFFINE: return "Affine";
    default: return "?";
    }
}

static void module_free(ch_module_t *m)
{
    if (!m) return;
    for (int i = 0; i < m->nchild; i++) module_free(m->child[i]);
    free(m->child);
    free(m->main);
    free(m->step_out);
    free(m->part_out);
    free(m->part_dy);
    free(m->part_dyp);
    free(m->g_in);
    free(m->g_x);
    free(m->g_dxp);
    free(m->g_dx);
    free(m->g_val);
    free(m->g_grad);
    free(m->g_acc);
    free(m->g_nacc);
    free(m->g_live);
    free(m->g_need);
    free(m->g_have);
    free(m->g_useacc);
    free(m->local);
    free(m->path);
    for (int i = 0; i < m->nent; i++) free((char *)m->ent[i].name);
    ch_tensor_free(&m->mean);
    ch_tensor_free(&m->var);
    ch_tensor_free(&m->sums);
    ch_tensor_free(&m->g_dev);
    free(m->gather);
    free(m->g_counts);
    free(m);
}

ch_status ch_model_new(const char *arch, ch_model_t **out)
{
    CH_REQUIRE(out, "ch_model_new: out is NULL");
    *out = NULL;
    ch_model_t *M = calloc(1, sizeof *M);
    if (!M) return CH_ERROR(CH_ERR_NOMEM, "ch_model_new: out of memory");
    M->arch = strdup(arch ? arch : "model");
    M->root = calloc(1, sizeof *M->root);
    if (!M->arch || !M->root) {
        free(M->arch);
        free(M->root);
        free(M);
        return CH_ERROR(CH_ERR_NOMEM, "ch_model_new: out of memory");
    }
    M->root->kind = CH_NN_SEQUENTIAL;
    M->root->local = strdup("");
    M->root->model = M;
    M->training = 1;
    M->drop_key.sample_stride = 1;
    if (!M->root->local) {
        ch_model_destroy(M);
        return CH_ERROR(CH_ERR_NOMEM, "ch_model_new: out of memory");
    }
    *out = M;
    return CH_OK;
}

void ch_model_destroy(ch_model_t *M)
{
    if (!M) return;
    ch_tensor_data_changed(); /* its storage may be reused for other weights */
    ch_arena_destroy(M->arena);
    module_free(M->root);
    if (M->dev != CH_DEV_CPU) {
        ch_storage_free(M->dev, M->dev_index, M->d_param_block);
        ch_storage_free(M->dev, M->dev_index, M->d_grad_block);
        ch_storage_free(M->dev, M->dev_index, M->d_buffer_block);
    }
    free(M->entries);
    free(M->params);
    free(M->param_block);
    free(M->grad_block);
    free(M->buffer_block);
    free(M->i64_block);
    free(M->arch);
    free(M);
}

const char *ch_model_arch(const ch_model_t *M) { return M->arch; }
ch_module_t *ch_model_root(ch_model_t *M) { return M->root; }
ch_nn_kind_t ch_module_kind(const ch_module_t *m) { return m->kind; }
ch_module_t *ch_module_parent(const ch_module_t *m) { return m ? m->parent : NULL; }
const char *ch_module_path(const ch_module_t *m) { return m->path ? m->path : m->local; }

ch_module_t *ch_module_child(const ch_module_t *m, const char *name)
{
    for (int i = 0; i < m->nchild; i++)
        if (strcmp(m->child[i]->local, name) == 0) return m->child[i];
    return NULL;
}

int ch_module_num_children(const ch_module_t *m) { return m ? m->nchild : 0; }

ch_module_t *ch_module_child_at(const ch_module_t *m, int i)
{
    return m && i >= 0 && i < m->nchild ? m->child[i] : NULL;
}

static ch_status add_child(ch_module_t *parent, const char *name, ch_nn_kind_t kind,
                           ch_module_t **out)
{
    char autoname[16];
    if (parent && !name) { /* nn.Sequential(*layers): the child's position */
        snprintf(autoname, sizeof autoname, "%d", parent->nchild);
        name = autoname;
    }
    /* a graph named "" under the model root: its nodes' paths are unprefixed */
    const int root_graph = parent && name && !name[0] && kind == CH_NN_GRAPH && !parent->parent;
    CH_REQUIRE(parent && (name[0] || root_graph),
               "nn: adding a %s needs a parent and a non-empty name (\"\" only for a graph "
               "under the model root)", kind_name(kind));
    if (out) *out = NULL;
    CH_REQUIRE(!parent->model->finalized, "nn: cannot add '%s' to a finalized model", name);
    CH_REQUIRE(parent->kind == CH_NN_SEQUENTIAL || parent->kind == CH_NN_RESIDUAL ||
                   parent->kind == CH_NN_SQUEEZE_EXCITATION || parent->kind == CH_NN_CONCAT ||
                   parent->kind == CH_NN_GRAPH,
               "nn: '%s' cannot hold children (it is a %s)", parent->local, kind_name(parent->kind));
    /* inside a graph a node's local name may carry dots ("features.0") */
    CH_REQUIRE(parent->kind == CH_NN_GRAPH || !strchr(name, '.'),
               "nn: module name '%s' contains a '.'", name);
    CH_REQUIRE(parent->kind != CH_NN_GRAPH || (name[0] != '.' && name[strlen(name) - 1] != '.' &&
                                               !strstr(name, "..")),
               "nn: graph node name '%s' in '%s': empty dotted component", name, parent->local);
    CH_REQUIRE(!ch_module_child(parent, name), "nn: duplicate module name '%s' in '%s'", name,
               parent->local);
    if (parent->nchild == parent->capchild) {
        int cap = parent->capchild ? 2 * parent->capchild : 8;
        ch_module_t **nc = realloc(parent->child, (size_t)cap * sizeof *nc);
        if (!nc) return CH_ERROR(CH_ERR_NOMEM, "nn: out of memory adding '%s'", name);
        parent->child = nc;
        parent->capchild = cap;
    }
    ch_module_t *m = calloc(1, sizeof *m);
    if (!m) return CH_ERROR(CH_ERR_NOMEM, "nn: out of memory adding '%s'", name);
    m->local = strdup(name);
    if (!m->local) {
        free(m);
        return CH_ERROR(CH_ERR_NOMEM, "nn: out of memory adding '%s'", name);
    }
    m->kind = kind;
    m->parent = parent;
    m->model = parent->model;
    parent->child[parent->nchild++] = m;
    if (out) *out = m;
    return CH_OK;
}

/* Declare an entry of module m (name is the local name). */
static ch_status add_entry(ch_module_t *m, const char *local, int is_buffer, ch_dtype_t dtype,
                           int ndim, const int64_t *shape)
{
    if (m->nent >= NN_MAX_ENTRIES_PER_MODULE)
        return CH_ERROR(CH_ERR_INTERNAL, "nn: too many entries in '%s'", m->local);
    ch_param_t *p = &m->ent[m->nent];
    memset(p, 0, sizeof *p);
    p->name = strdup(local); /* replaced by the full name at finalize */
    if (!p->name) return CH_ERROR(CH_ERR_NOMEM, "nn: out of memory");
    p->local = NULL;
    p->is_buffer = is_buffer;
    p->dtype = dtype;
    p->ndim = ndim;
    p->numel = 1;
    for (int i = 0; i < CH_NN_MAX_DIMS; i++) p->shape[i] = 1;
    for (int i = 0; i < ndim; i++) {
        p->shape[i] = shape[i];
        p->numel *= (size_t)shape[i];
    }
    p->requires_grad = !is_buffer;
    p->param_index = -1;
    p->module = m;
    m->nent++;
    return CH_OK;
}

ch_status ch_nn_sequential(ch_module_t *parent, const char *name, ch_module_t **out)
{
    return add_child(parent, name, CH_NN_SEQUENTIAL, out);
}

ch_status ch_nn_conv2d(ch_module_t *parent, const char *name, int in_c, int out_c, int k,
                       int stride, int pad, int bias, ch_module_t **out)
{
    CH_REQUIRE(in_c > 0 && out_c > 0 && k > 0 && stride > 0 && pad >= 0,
               "nn: Conv2d '%s': invalid sizes in=%d out=%d kernel=%d stride=%d padding=%d", name,
               in_c, out_c, k, stride, pad);
    ch_module_t *m;
    CH_TRY(add_child(parent, name, CH_NN_CONV2D, &m));
    m->in_c = in_c;
    m->out_c = out_c;
    m->kernel = m->kernel_h = m->kernel_w = k;
    m->has_bias = bias != 0;
    m->conv.stride_h = m->conv.stride_w = stride;
    m->conv.pad_h = m->conv.pad_w = pad;
    int64_t ws[4] = {out_c, in_c, k, k}, bs[1] = {out_c};
    CH_TRY(add_entry(m, "weight", 0, CH_F32, 4, ws));
    if (bias) CH_TRY(add_entry(m, "bias", 0, CH_F32, 1, bs));
    if (out) *out = m;
    return CH_OK;
}

void ch_conv2d_options_default(ch_conv2d_options_t *o, int in_channels, int out_channels,
                               int kernel)
{
    memset(o, 0, sizeof *o);
    o->in_channels = in_channels;
    o->out_channels = out_channels;
    o->kernel_h = o->kernel_w = kernel;
    o->stride_h = o->stride_w = 1;
    o->dilation_h = o->dilation_w = 1;
    o->groups = 1;
    o->bias = 1;
}

ch_status ch_nn_conv2d_ex(ch_module_t *parent, const char *name, const ch_conv2d_options_t *o,
                          ch_module_t **out)
{
    CH_REQUIRE(o, "nn: Conv2d '%s': options are NULL", name ? name : "?");
    CH_REQUIRE(o->in_channels > 0 && o->out_channels > 0 && o->kernel_h > 0 && o->kernel_w > 0 &&
                   o->stride_h > 0 && o->stride_w > 0 && o->pad_h >= 0 && o->pad_w >= 0 &&
                   o->dilation_h > 0 && o->dilation_w > 0 && o->groups > 0,
               "nn: Conv2d '%s': invalid sizes in=%d out=%d kernel=%dx%d stride=%dx%d "
               "padding=%dx%d dilation=%dx%d groups=%d (expected all > 0, padding >= 0)",
               name, o->in_channels, o->out_channels, o->kernel_h, o->kernel_w, o->stride_h,
               o->stride_w, o->pad_h, o->pad_w, o->dilation_h, o->dilation_w, o->groups);
    CH_REQUIRE(o->in_channels % o->groups == 0 && o->out_channels % o->groups == 0,
               "nn: Conv2d '%s': groups=%d must divide in_channels=%d and out_channels=%d", name,
               o->groups, o->in_channels, o->out_channels);
    ch_module_t *m;
    CH_TRY(add_child(parent, name, CH_NN_CONV2D, &m));
    m->in_c = o->in_channels;
    m->out_c = o->out_channels;
    m->kernel = m->kernel_h = o->kernel_h;
    m->kernel_w = o->kernel_w;
    m->has_bias = o->bias != 0;
    m->conv.stride_h = o->stride_h;
    m->conv.stride_w = o->stride_w;
    m->conv.pad_h = o->pad_h;
    m->conv.pad_w = o->pad_w;
    m->conv.dilation_h = o->dilation_h;
    m->conv.dilation_w = o->dilation_w;
    m->conv.groups = o->groups;
    int64_t ws[4] = {o->out_channels, o->in_channels / o->groups, o->kernel_h, o->kernel_w};
    int64_t bs[1] = {o->out_channels};
    CH_TRY(add_entry(m, "weight", 0, CH_F32, 4, ws));
    if (m->has_bias) CH_TRY(add_entry(m, "bias", 0, CH_F32, 1, bs));
    if (out) *out = m;
    return CH_OK;
}

void ch_pool2d_options_default(ch_pool2d_options_t *o, int kernel)
{
    memset(o, 0, sizeof *o);
    o->kernel_h = o->kernel_w = kernel;
    o->stride_h = o->stride_w = kernel;
    o->count_include_pad = 1;
}

/* A pooling module of `kind` from o (checked as torch does). */
static ch_status pool_module(ch_module_t *parent, const char *name, ch_nn_kind_t kind,
                             const ch_pool2d_options_t *o, ch_module_t **out)
{
    const char *what = kind_name(kind);
    CH_REQUIRE(o, "nn: %s '%s': options are NULL", what, name ? name : "?");
    CH_REQUIRE(o->kernel_h > 0 && o->kernel_w > 0 && o->stride_h > 0 && o->stride_w > 0 &&
                   o->pad_h >= 0 && o->pad_w >= 0 && o->pad_h <= o->kernel_h / 2 &&
                   o->pad_w <= o->kernel_w / 2,
               "nn: %s '%s': invalid kernel=%dx%d stride=%dx%d padding=%dx%d (expected kernel "
               "and stride > 0, 0 <= padding <= kernel/2)",
               what, name, o->kernel_h, o->kernel_w, o->stride_h, o->stride_w, o->pad_h,
               o->pad_w);
    ch_module_t *m;
    CH_TRY(add_child(parent, name, kind, &m));
    m->pool.kernel_h = o->kernel_h;
    m->pool.kernel_w = o->kernel_w;
    m->pool.stride_h = o->stride_h;
    m->pool.stride_w = o->stride_w;
    m->pool.pad_h = o->pad_h;
    m->pool.pad_w = o->pad_w;
    m->pool.ceil_mode = o->ceil_mode != 0;
    m->pool.count_include_pad = o->count_include_pad != 0;
    if (out) *out = m;
    return CH_OK;
}

ch_status ch_nn_maxpool2d_ex(ch_module_t *parent, const char *name,
                             const ch_pool2d_options_t *o, ch_module_t **out)
{
    return pool_module(parent, name, CH_NN_MAXPOOL2D, o, out);
}

ch_status ch_nn_avgpool2d(ch_module_t *parent, const char *name, const ch_pool2d_options_t *o,
                          ch_module_t **out)
{
    return pool_module(parent, name, CH_NN_AVGPOOL2D, o, out);
}

ch_status ch_nn_adaptive_avgpool2d_hw(ch_module_t *parent, const char *name, int out_h,
                                      int out_w, ch_module_t **out)
{
    CH_REQUIRE(out_h > 0 && out_w > 0,
               "nn: AdaptiveAvgPool2d '%s': output size %dx%d, expected both > 0", name, out_h,
               out_w);
    ch_module_t *m;
    CH_TRY(add_child(parent, name, CH_NN_ADAPTIVE_AVGPOOL2D, &m));
    if (out_h != 1 || out_w != 1) {
        m->out_h = out_h;
        m->out_w = out_w;
    }
    if (out) *out = m;
    return CH_OK;
}

ch_status ch_nn_batchnorm2d(ch_module_t *parent, const char *name, int channels, ch_module_t **out)
{
    return ch_nn_batchnorm2d_ex(parent, name, channels, NN_BN_EPS, NN_BN_MOMENTUM, out);
}

ch_status ch_nn_batchnorm2d_ex(ch_module_t *parent, const char *name, int channels, float eps,
                               float momentum, ch_module_t **out)
{
    CH_REQUIRE(channels > 0, "nn: BatchNorm2d '%s': channels = %d, expected > 0", name, channels);
    CH_REQUIRE(eps > 0.0f && eps < 1.0f && momentum > 0.0f && momentum <= 1.0f,
               "nn: BatchNorm2d '%s': eps = %g, momentum = %g, expected 0 < eps < 1 and "
               "0 < momentum <= 1", name, (double)eps, (double)momentum);
    ch_module_t *m;
    CH_TRY(add_child(parent, name, CH_NN_BATCHNORM2D, &m));
    m->bn_eps = eps;
    m->bn_momentum = momentum;
    m->channels = channels;
    int64_t cs[1] = {channels};
    CH_TRY(add_entry(m, "weight", 0, CH_F32, 1, cs));
    CH_TRY(add_entry(m, "bias", 0, CH_F32, 1, cs));
    CH_TRY(add_entry(m, "running_mean", 1, CH_F32, 1, cs));
    CH_TRY(add_entry(m, "running_var", 1, CH_F32, 1, cs));
    CH_TRY(add_entry(m, "num_batches_tracked", 1, CH_I64, 0, cs));
    if (out) *out = m;
    return CH_OK;
}

ch_status ch_nn_relu(ch_module_t *parent, const char *name, ch_module_t **out)
{
    return add_child(parent, name, CH_NN_RELU, out);
}

ch_status ch_nn_maxpool2d(ch_module_t *parent, const char *name, int k, int stride, int pad,
                          ch_module_t **out)
{
    CH_REQUIRE(k > 0 && stride > 0 && pad >= 0 && pad <= k / 2,
               "nn: MaxPool2d '%s': invalid kernel=%d stride=%d padding=%d (padding <= kernel/2)",
               name, k, stride, pad);
    ch_module_t *m;
    CH_TRY(add_child(parent, name, CH_NN_MAXPOOL2D, &m));
    m->pool.kernel_h = m->pool.kernel_w = k;
    m->pool.stride_h = m->pool.stride_w = stride;
    m->pool.pad_h = m->pool.pad_w = pad;
    if (out) *out = m;
    return CH_OK;
}

ch_status ch_nn_adaptive_avgpool2d(ch_module_t *parent, const char *name, ch_module_t **out)
{
    return add_child(parent, name, CH_NN_ADAPTIVE_AVGPOOL2D, out);
}

ch_status ch_nn_linear(ch_module_t *parent, const char *name, int in_f, int out_f, int bias,
                       ch_module_t **out)
{
    CH_REQUIRE(in_f > 0 && out_f > 0, "nn: Linear '%s': invalid sizes in=%d out=%d", name, in_f,
               out_f);
    ch_module_t *m;
    CH_TRY(add_child(parent, name, CH_NN_LINEAR, &m));
    m->in_c = in_f;
    m->out_c = out_f;
    m->has_bias = bias != 0;
    int64_t ws[2] = {out_f, in_f}, bs[1] = {out_f};
    CH_TRY(add_entry(m, "weight", 0, CH_F32, 2, ws));
    if (bias) CH_TRY(add_entry(m, "bias", 0, CH_F32, 1, bs));
    if (out) *out = m;
    return CH_OK;
}

/* An activation module of kind k computing p. */
static ch_status add_act(ch_module_t *parent, const char *name, ch_nn_kind_t k,
                         ch_act_kind_t f, float alpha, float beta, ch_module_t **out)
{
    ch_module_t *m;
    CH_TRY(add_child(parent, name, k, &m));
    m->act.kind = f;
    m->act.alpha = alpha;
    m->act.beta = beta;
    if (out) *out = m;
    return CH_OK;
}

ch_status ch_nn_flatten(ch_module_t *parent, const char *name, ch_module_t **out)
{
    return add_child(parent, name, CH_NN_FLATTEN, out);
}

ch_status ch_nn_identity(ch_module_t *parent, const char *name, ch_module_t **out)
{
    return add_child(parent, name, CH_NN_IDENTITY, out);
}

ch_status ch_nn_dropout(ch_module_t *parent, const char *name, float p, ch_module_t **out)
{
    CH_REQUIRE(p >= 0.0f && p <= 1.0f, "nn: Dropout '%s': p = %g, expected 0 <= p <= 1",
               name ? name : "(automatic name)", (double)p);
    ch_module_t *m;
    CH_TRY(add_child(parent, name, CH_NN_DROPOUT, &m));
    m->drop_p = p;
    m->drop_stream = (uint64_t)m->model->n_dropout++;
    if (out) *out = m;
    return CH_OK;
}

ch_status ch_nn_hardtanh(ch_module_t *parent, const char *name, float min_val, float max_val,
                         ch_module_t **out)
{
    CH_REQUIRE(isfinite(min_val) && isfinite(max_val) && min_val <= max_val,
               "nn: Hardtanh '%s': min_val %g and max_val %g, expected finite min_val <= max_val",
               name ? name : "(null)", (double)min_val, (double)max_val);
    return add_act(parent, name, CH_NN_HARDTANH, CH_ACT_HARDTANH, min_val, max_val, out);
}

ch_status ch_nn_relu6(ch_module_t *parent, const char *name, ch_module_t **out)
{
    return ch_nn_hardtanh(parent, name, 0.0f, 6.0f, out);
}

ch_status ch_nn_leaky_relu(ch_module_t *parent, const char *name, float negative_slope,
                           ch_module_t **out)
{
    CH_REQUIRE(isfinite(negative_slope), "nn: LeakyReLU '%s': negative_slope %g is not finite",
               name ? name : "(null)", (double)negative_slope);
    return add_act(parent, name, CH_NN_LEAKY_RELU, CH_ACT_LEAKY_RELU, negative_slope, 0.0f, out);
}

ch_status ch_nn_silu(ch_module_t *parent, const char *name, ch_module_t **out)
{
    return add_act(parent, name, CH_NN_SILU, CH_ACT_SILU, 0.0f, 0.0f, out);
}

ch_status ch_nn_sigmoid(ch_module_t *parent, const char *name, ch_module_t **out)
{
    return add_act(parent, name, CH_NN_SIGMOID, CH_ACT_SIGMOID, 0.0f, 0.0f, out);
}

ch_status ch_nn_tanh(ch_module_t *parent, const char *name, ch_module_t **out)
{
    return add_act(parent, name, CH_NN_TANH, CH_ACT_TANH, 0.0f, 0.0f, out);
}

ch_status ch_nn_gelu(ch_module_t *parent, const char *name, const char *approximate,
                     ch_module_t **out)
{
    const char *a = approximate ? approximate : "none";
    CH_REQUIRE(!strcmp(a, "none") || !strcmp(a, "tanh"),
               "nn: GELU '%s': approximate '%s', expected 'none' or 'tanh'",
               name ? name : "(null)", a);
    return add_act(parent, name, CH_NN_GELU, strcmp(a, "tanh") ? CH_ACT_GELU_ERF : CH_ACT_GELU_TANH,
                   0.0f, 0.0f, out);
}

ch_status ch_nn_hardswish(ch_module_t *parent, const char *name, ch_module_t **out)
{
    return add_act(parent, name, CH_NN_HARDSWISH, CH_ACT_HARDSWISH, 0.0f, 0.0f, out);
}

ch_status ch_nn_hardsigmoid(ch_module_t *parent, const char *name, ch_module_t **out)
{
    return add_act(parent, name, CH_NN_HARDSIGMOID, CH_ACT_HARDSIGMOID, 0.0f, 0.0f, out);
}

ch_status ch_module_activation(const ch_module_t *m, ch_act_params_t *p)
{
    CH_REQUIRE(m && p, "ch_module_activation: NULL argument");
    CH_REQUIRE(ch_nn_is_activation(m->kind),
               "nn: '%s' is a %s, not an activation", ch_module_path(m), kind_name(m->kind));
    *p = m->act;
    return CH_OK;
}

ch_status ch_nn_layernorm2d(ch_module_t *parent, const char *name, int channels, float eps,
                            ch_module_t **out)
{
    CH_REQUIRE(channels > 0 && eps > 0.0f && isfinite(eps),
               "nn: LayerNorm2d '%s': channels = %d, eps = %g, expected channels > 0 and eps > 0",
               name ? name : "(null)", channels, (double)eps);
    ch_module_t *m;
    CH_TRY(add_child(parent, name, CH_NN_LAYERNORM2D, &m));
    m->channels = channels;
    m->ln_eps = eps;
    int64_t cs[1] = {channels};
    CH_TRY(add_entry(m, "weight", 0, CH_F32, 1, cs));
    CH_TRY(add_entry(m, "bias", 0, CH_F32, 1, cs));
    if (out) *out = m;
    return CH_OK;
}

ch_status ch_model_set_dropout_key(ch_model_t *M, uint64_t seed, uint64_t epoch,
                                   int64_t sample_base, int64_t sample_stride)
{
    CH_REQUIRE(M, "ch_model_set_dropout_key: model is NULL");
    CH_REQUIRE(sample_base >= 0 && sample_stride >= 1,
               "ch_model_set_dropout_key: sample_base %lld (expected >= 0), sample_stride %lld "
               "(expected >= 1)", (long long)sample_base, (long long)sample_stride);
    M->drop_key.seed = seed;
    M->drop_key.epoch = epoch;
    M->drop_key.sample_base = sample_base;
    M->drop_key.sample_stride = sample_stride;
    return CH_OK;
}

ch_status ch_nn_residual(ch_module_t *parent, const char *name, ch_module_t **out)
{
    return add_child(parent, name, CH_NN_RESIDUAL, out);
}

ch_status ch_nn_squeeze_excitation(ch_module_t *parent, const char *name, ch_module_t **out)
{
    return add_child(parent, name, CH_NN_SQUEEZE_EXCITATION, out);
}

ch_status ch_nn_concat(ch_module_t *parent, const char *name, ch_module_t **out)
{
    return add_child(parent, name, CH_NN_CONCAT, out);
}

ch_status ch_nn_graph(ch_module_t *parent, const char *name, ch_module_t **out)
{
    ch_module_t *g;
    CH_TRY(add_child(parent, name, CH_NN_GRAPH, &g));
    g->g_out = -1; /* the last node's output */
    if (out) *out = g;
    return CH_OK;
}

/* A graph node of `kind` (only a graph may hold Add / Mul / Cat). */
static ch_status graph_node(ch_module_t *parent, const char *name, ch_nn_kind_t kind,
                            ch_module_t **out)
{
    CH_REQUIRE(parent, "nn: a %s needs a parent", kind_name(kind));
    CH_REQUIRE(parent->kind == CH_NN_GRAPH ||
                   (kind != CH_NN_ADD && kind != CH_NN_MUL && kind != CH_NN_CAT),
               "nn: %s '%s' needs a graph as parent (ch_nn_graph), not the %s '%s'",
               kind_name(kind), name ? name : "(automatic name)", kind_name(parent->kind),
               parent->local);
    return add_child(parent, name, kind, out);
}

ch_status ch_nn_add(ch_module_t *parent, const char *name, ch_module_t **out)
{
    return graph_node(parent, name, CH_NN_ADD, out);
}

ch_status ch_nn_mul(ch_module_t *parent, const char *name, ch_module_t **out)
{
    return graph_node(parent, name, CH_NN_MUL, out);
}

ch_status ch_nn_cat(ch_module_t *parent, const char *name, ch_module_t **out)
{
    return graph_node(parent, name, CH_NN_CAT, out);
}

ch_status ch_nn_narrow(ch_module_t *parent, const char *name, int start, int length,
                       ch_module_t **out)
{
    CH_REQUIRE(start >= 0 && length >= 1, "nn: Narrow '%s': start %d, length %d, expected "
               "start >= 0 and length >= 1", name ? name : "(automatic name)", start, length);
    ch_module_t *m;
    CH_TRY(graph_node(parent, name, CH_NN_NARROW, &m));
    m->narrow_start = start;
    m->narrow_len = length;
    if (out) *out = m;
    return CH_OK;
}

ch_status ch_nn_channel_shuffle(ch_module_t *parent, const char *name, int groups,
                                ch_module_t **out)
{
    CH_REQUIRE(groups >= 1, "nn: ChannelShuffle '%s': groups %d, expected >= 1",
               name ? name : "(automatic name)", groups);
    ch_module_t *m;
    CH_TRY(graph_node(parent, name, CH_NN_CHANNEL_SHUFFLE, &m));
    m->groups = groups;
    if (out) *out = m;
    return CH_OK;
}

ch_status ch_nn_affine(ch_module_t *parent, const char *name, float alpha, float beta,
                       ch_module_t **out)
{
    CH_REQUIRE(isfinite(alpha) && isfinite(beta), "nn: Affine '%s': alpha %g, beta %g, expected "
               "finite values", name ? name : "(automatic name)", (double)alpha, (double)beta);
    ch_module_t *m;
    CH_TRY(graph_node(parent, name, CH_NN_AFFINE, &m));
    m->alpha = alpha;
    m->beta = beta;
    if (out) *out = m;
    return CH_OK;
}

static int node_id(const ch_module_t *g, const ch_module_t *m)
{
    for (int i = 0; i < g->nchild; i++)
        if (g->child[i] == m) return i + 1;
    return 0;
}

ch_status ch_nn_graph_connect(ch_module_t *g, ch_module_t *node, const int *inputs, int n)
{
    CH_REQUIRE(g && g->kind == CH_NN_GRAPH, "nn: ch_nn_graph_connect on a module that is not a "
               "graph (%s)", g ? g->local : "NULL");
    CH_REQUIRE(!g->model->finalized, "nn: graph '%s': connect after finalize", g->local);
    const int id = node ? node_id(g, node) : 0;
    CH_REQUIRE(id > 0, "nn: graph '%s': connect of a module that is not one of its nodes",
               g->local);
    CH_REQUIRE(!node->g_nin, "nn: graph '%s': node '%s' connected twice", g->local, node->local);
    const ch_nn_kind_t k = node->kind;
    const int two = k == CH_NN_ADD || k == CH_NN_MUL, many = k == CH_NN_CAT;
    CH_REQUIRE(inputs && (two ? n == 2 : many ? n >= 1 : n == 1),
               "nn: graph '%s': node '%s' (%s) takes %s input%s, got %d", g->local, node->local,
               kind_name(k), two ? "2" : many ? ">= 1" : "1", two || many ? "s" : "", n);
    for (int i = 0; i < n; i++)
        CH_REQUIRE(inputs[i] >= 0 && inputs[i] < id,
                   "nn: graph '%s': node '%s' (value %d) reads value %d, expected 0..%d (an "
                   "earlier node's output or 0, the graph's input: nodes are added in "
                   "topological order)", g->local, node->local, id, inputs[i], id - 1);
    int *in = malloc((size_t)n * sizeof *in);
    const ch_tensor_t **xs = calloc((size_t)n, sizeof *xs);
    ch_tensor_t **dxp = calloc((size_t)n, sizeof *dxp);
    ch_tensor_t *dx = calloc((size_t)n, sizeof *dx);
    if (!in || !xs || !dxp || !dx) {
        free(in);
        free(xs);
        free(dxp);
        free(dx);
        return CH_ERROR(CH_ERR_NOMEM, "nn: out of memory connecting '%s'", node->local);
    }
    memcpy(in, inputs, (size_t)n * sizeof *in);
    node->g_in = in;
    node->g_x = xs;
    node->g_dxp = dxp;
    node->g_dx = dx;
    node->g_nin = n;
    return CH_OK;
}

ch_status ch_nn_graph_set_output(ch_module_t *g, int value)
{
    CH_REQUIRE(g && g->kind == CH_NN_GRAPH, "nn: ch_nn_graph_set_output on a module that is not "
               "a graph (%s)", g ? g->local : "NULL");
    CH_REQUIRE(!g->model->finalized, "nn: graph '%s': set_output after finalize", g->local);
    CH_REQUIRE(value >= 0, "nn: graph '%s': output value %d, expected >= 0", g->local, value);
    g->g_out = value;
    return CH_OK;
}

static int is_child(const ch_module_t *parent, const ch_module_t *m)
{
    for (int i = 0; i < parent->nchild; i++)
        if (parent->child[i] == m) return 1;
    return 0;
}

ch_status ch_nn_residual_set_path(ch_module_t *blk, ch_module_t *const *main, int n,
                                  ch_module_t *shortcut, ch_module_t *final_relu)
{
    CH_REQUIRE(blk && blk->kind == CH_NN_RESIDUAL, "nn: residual path set on a non-residual module");
    CH_REQUIRE(main && n > 0, "nn: residual block '%s' needs a main path", blk->local);
    CH_REQUIRE(final_relu && final_relu->kind == CH_NN_RELU && is_child(blk, final_relu),
               "nn: residual block '%s' needs a ReLU child as final activation", blk->local);
    CH_REQUIRE(!shortcut || is_child(blk, shortcut),
               "nn: residual block '%s': shortcut is not its child", blk->local);
    for (int i = 0; i < n; i++)
        CH_REQUIRE(main[i] && is_child(blk, main[i]) && main[i] != shortcut,
                   "nn: residual block '%s': main step %d is not a child", blk->local, i);
    ch_module_t **mm = malloc((size_t)n * sizeof *mm);
    const ch_tensor_t **so = calloc((size_t)n, sizeof *so);
    if (!mm || !so) {
        free(mm);
        free(so);
        return CH_ERROR(CH_ERR_NOMEM, "nn: out of memory");
    }
    memcpy(mm, main, (size_t)n * sizeof *mm);
    free(blk->main);
    free(blk->step_out);
    blk->main = mm;
    blk->step_out = so;
    blk->nmain = n;
    blk->shortcut = shortcut;
    blk->final_relu = final_relu;
    return CH_OK;
}

/* ------------------------------------------------------------ finalize */

static ch_status count_entries(ch_module_t *m, int *ne, int *np)
{
    for (int i = 0; i < m->nent; i++) {
        (*ne)++;
        if (!m->ent[i].is_buffer) (*np)++;
    }
    if (m->kind == CH_NN_RESIDUAL && !m->main)
        return CH_ERROR(CH_ERR_INVALID, "nn: residual block '%s' has no path (ch_nn_residual_set_path)",
                        m->local);
    for (int i = 0; i < m->nchild; i++) {
        const ch_module_t *c = m->child[i];
        if (!c->local[0] && m->nchild != 1)
            return CH_ERROR(CH_ERR_INVALID, "nn: the graph named \"\" must be the model root's "
                            "only child (the root has %d)", m->nchild);
        if (m->kind == CH_NN_GRAPH && !c->g_nin)
            return CH_ERROR(CH_ERR_INVALID, "nn: graph '%s': node '%s' (value %d) is never "
                            "connected (ch_nn_graph_connect)", m->local, c->local, i + 1);
        if (m->kind != CH_NN_GRAPH && (c->kind == CH_NN_ADD || c->kind == CH_NN_MUL ||
                                       c->kind == CH_NN_CAT))
            return CH_ERROR(CH_ERR_INVALID, "nn: %s '%s' is not in a graph", kind_name(c->kind),
                            c->local);
    }
    if (m->kind == CH_NN_GRAPH) {
        if (m->g_out < 0) m->g_out = m->nchild;
        if (m->g_out > m->nchild)
            return CH_ERROR(CH_ERR_INVALID, "nn: graph '%s': output value %d, but it has %d "
                            "nodes", m->local, m->g_out, m->nchild);
    }
    for (int i = 0; i < m->nchild; i++) CH_TRY(count_entries(m->child[i], ne, np));
    return CH_OK;
}

static ch_status name_modules(ch_module_t *m, const char *prefix)
{
    size_t len = strlen(prefix) + strlen(m->local) + 2;
    free(m->path);
    m->path = malloc(len);
    if (!m->path) return CH_ERROR(CH_ERR_NOMEM, "nn: out of memory");
    if (prefix[0]) snprintf(m->path, len, "%s.%s", prefix, m->local);
    else snprintf(m->path, len, "%s", m->local);
    for (int i = 0; i < m->nent; i++) {
        ch_param_t *p = &m->ent[i];
        const char *local = p->local ? p->local : p->name;
        char full[CH_NN_NAME_MAX];
        int w = m->path[0] ? snprintf(full, sizeof full, "%s.%s", m->path, local)
                           : snprintf(full, sizeof full, "%s", local);
        if (w < 0 || (size_t)w >= sizeof full)
            return CH_ERROR(CH_ERR_INVALID, "nn: entry name '%s.%s' longer than %d bytes", m->path,
                            local, CH_NN_NAME_MAX - 1);
        char *nn = strdup(full);
        if (!nn) return CH_ERROR(CH_ERR_NOMEM, "nn: out of memory");
        free((char *)p->name);
        p->name = nn;
        p->local = strrchr(nn, '.') ? strrchr(nn, '.') + 1 : nn;
    }
    for (int i = 0; i < m->nchild; i++) CH_TRY(name_modules(m->child[i], m->path));
    return CH_OK;
}

/* torch state-dict order: own parameters, own buffers, then children. */
static void collect(ch_model_t *M, ch_module_t *m)
{
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < m->nent; i++) {
            ch_param_t *p = &m->ent[i];
            if (p->is_buffer != pass) continue;
            p->index = M->nentries;
            M->entries[M->nentries++] = p;
            if (!p->is_buffer) {
                p->param_index = M->nparams;
                M->params[M->nparams++] = p;
            }
        }
    for (int i = 0; i < m->nchild; i++) collect(M, m->child[i]);
}

static ch_status wrap_vec(const ch_model_t *M, ch_tensor_t *t, void *data, const ch_param_t *p)
{
    return ch_tensor_wrap(t, data, p->dtype, p->ndim, p->shape, CH_LAYOUT_PLAIN, M->dev,
                          M->dev_index);
}

ch_status ch_nn_bind_module(ch_model_t *M, ch_module_t *m)
{
    for (int i = 0; i < m->nent; i++) {
        ch_param_t *p = &m->ent[i];
        const char *l = p->local;
        /* weights and biases are versioned (tensor.h): every write to the
         * parameter block is followed by ch_tensor_data_changed() */
        if (!strcmp(l, "weight")) {
            CH_TRY(wrap_vec(M, &m->w, p->dev_data, p));
            m->w.versioned = 1;
            CH_TRY(wrap_vec(M, &m->dw, p->dev_grad, p));
        } else if (!strcmp(l, "bias")) {
            CH_TRY(wrap_vec(M, &m->b, p->dev_data, p));
            m->b.versioned = 1;
            CH_TRY(wrap_vec(M, &m->db, p->dev_grad, p));
        } else if (!strcmp(l, "running_mean")) {
            CH_TRY(wrap_vec(M, &m->rmean, p->dev_data, p));
        } else if (!strcmp(l, "running_var")) {
            CH_TRY(wrap_vec(M, &m->rvar, p->dev_data, p));
        } else if (!strcmp(l, "num_batches_tracked")) {
            m->nbt = p->data; /* a host counter on every device */
        }
    }
    if (m->kind == CH_NN_BATCHNORM2D || m->kind == CH_NN_SYNC_BATCHNORM) {
        int64_t c = m->channels, c2 = 2 * c;
        ch_tensor_free(&m->mean);
        ch_tensor_free(&m->var);
        ch_tensor_free(&m->sums);
        CH_TRY(ch_tensor_alloc(&m->mean, CH_F32, 1, &c, CH_LAYOUT_PLAIN, M->dev, M->dev_index));
        CH_TRY(ch_tensor_alloc(&m->var, CH_F32, 1, &c, CH_LAYOUT_PLAIN, M->dev, M->dev_index));
        CH_TRY(ch_tensor_alloc(&m->sums, CH_F32, 1, &c2, CH_LAYOUT_PLAIN, M->dev, M->dev_index));
        CH_TRY(ch_tensor_wrap(&m->sum_dy, m->sums.data, CH_F32, 1, &c, CH_LAYOUT_PLAIN, M->dev,
                              M->dev_index));
        CH_TRY(ch_tensor_wrap(&m->sum_dy_xmu, (float *)m->sums.data + c, CH_F32, 1, &c,
                              CH_LAYOUT_PLAIN, M->dev, M->dev_index));
        if (m->kind == CH_NN_SYNC_BATCHNORM && M->has_sync) CH_TRY(ch_nn_sync_storage(M, m));
    }
    for (int i = 0; i < m->nchild; i++) CH_TRY(ch_nn_bind_module(M, m->child[i]));
    return CH_OK;
}

static void *alloc_block(size_t n, size_t elem)
{
    size_t bytes = (n ? n : 1) * elem;
    bytes = (bytes + 63) / 64 * 64;
    void *p = aligned_alloc(64, bytes);
    if (p) memset(p, 0, bytes);
    return p;
}

ch_status ch_model_finalize(ch_model_t *M, uint64_t seed)
{
    CH_REQUIRE(M, "ch_model_finalize: model is NULL");
    CH_REQUIRE(!M->finalized, "nn: model '%s' finalized twice", M->arch);
    int ne = 0, np = 0;
    CH_TRY(count_entries(M->root, &ne, &np));
    CH_TRY(name_modules(M->root, ""));
    M->entries = calloc((size_t)(ne ? ne : 1), sizeof *M->entries);
    M->params = calloc((size_t)(np ? np : 1), sizeof *M->params);
    if (!M->entries || !M->params) return CH_ERROR(CH_ERR_NOMEM, "nn: out of memory");
    collect(M, M->root);
    for (int i = 0; i < ne; i++)
        for (int j = 0; j < i; j++)
            if (!strcmp(M->entries[i]->name, M->entries[j]->name))
                return CH_ERROR(CH_ERR_INVALID, "nn: duplicate entry name '%s'", M->entries[i]->name);
    size_t pn = 0, bn = 0, in = 0;
    for (int i = 0; i < ne; i++) {
        ch_param_t *p = M->entries[i];
        if (!p->is_buffer) pn += p->numel;
        else if (p->dtype == CH_F32) bn += p->numel;
        else in += p->numel;
    }
    M->param_block = alloc_block(pn, sizeof(float));
    M->grad_block = alloc_block(pn, sizeof(float));
    M->buffer_block = alloc_block(bn, sizeof(float));
    M->i64_block = alloc_block(in, sizeof(int64_t));
    if (!M->param_block || !M->grad_block || !M->buffer_block || !M->i64_block)
        return CH_ERROR(CH_ERR_NOMEM, "nn: out of memory for %zu parameters of '%s'", pn, M->arch);
    M->param_numel = pn;
    M->buffer_numel = bn;
    M->i64_numel = in;
    size_t po = 0, bo = 0, io = 0;
    for (int i = 0; i < ne; i++) {
        ch_param_t *p = M->entries[i];
        if (!p->is_buffer) {
            p->data = M->param_block + po;
            p->grad = M->grad_block + po;
            po += p->numel;
        } else if (p->dtype == CH_F32) {
            p->data = M->buffer_block + bo;
            bo += p->numel;
        } else {
            p->data = M->i64_block + io;
            io += p->numel;
        }
        p->dev_data = p->data;
        p->dev_grad = p->grad;
    }
    M->dev = CH_DEV_CPU;
    M->dev_index = 0;
    CH_TRY(ch_nn_bind_module(M, M->root));
    M->finalized = 1;
    return ch_model_init(M, seed);
}

ch_status ch_model_finalize_init(ch_model_t *M, ch_nn_init_t scheme, uint64_t seed)
{
    CH_TRY(ch_model_finalize(M, seed));
    return scheme == CH_NN_INIT_RESNET ? CH_OK : ch_model_init_scheme(M, scheme, seed);
}

/* ------------------------------------------------------------ init */

static ch_status init_module(ch_module_t *m, ch_nn_rng_t *rng, ch_nn_init_t scheme)
{
    if (m->kind == CH_NN_CONV2D || m->kind == CH_NN_LINEAR) {
        /* torch _calculate_fan_in_and_fan_out: from the weight's shape
         * (O, I/groups, kh, kw), so grouped convolutions count I/groups */
        const int64_t *wsh = m->ent[0].shape;
        size_t fan_in = m->kind == CH_NN_CONV2D ? (size_t)(wsh[1] * wsh[2] * wsh[3])
                                                : (size_t)m->in_c;
        double bound = 1.0 / sqrt((double)fan_in);
        for (int i = 0; i < m->nent; i++) {
            ch_param_t *p = &m->ent[i];
            if (m->kind == CH_NN_CONV2D && !strcmp(p->local, "weight") &&
                scheme == CH_NN_INIT_RESNET) {
                /* kaiming_normal_(mode='fan_out', nonlinearity='relu') */
                double fan_out = (double)(wsh[0] * wsh[2] * wsh[3]);
                ch_nn_rng_fill_normal(rng, p->data, p->numel, sqrt(2.0 / fan_out));
            } else {
                /* Linear.reset_parameters: kaiming_uniform_(a=sqrt(5)) for the
                 * weight = U(+-1/sqrt(fan_in)); bias U(+-1/sqrt(fan_in)). The
                 * same holds for a conv bias, and for the conv weight under
                 * CH_NN_INIT_DEFAULT (Conv2d.reset_parameters). */
                ch_nn_rng_fill_uniform(rng, p->data, p->numel, bound);
            }
        }
    } else if (m->kind == CH_NN_BATCHNORM2D || m->kind == CH_NN_SYNC_BATCHNORM ||
               m->kind == CH_NN_LAYERNORM2D) {
        /* LayerNorm.reset_parameters: weight 1, bias 0 */
        for (int i = 0; i < m->nent; i++) {
            ch_param_t *p = &m->ent[i];
            if (p->dtype == CH_I64) {
                memset(p->data, 0, p->numel * sizeof(int64_t));
                continue;
            }
            float v = (!strcmp(p->local, "weight") || !strcmp(p->local, "running_var")) ? 1.0f : 0.0f;
            float *d = p->data;
            for (size_t k = 0; k < p->numel; k++) d[k] = v;
        }
    }
    for (int i = 0; i < m->nchild; i++) CH_TRY(init_module(m->child[i], rng, scheme));
    return CH_OK;
}

ch_status ch_model_init_scheme(ch_model_t *M, ch_nn_init_t scheme, uint64_t seed)
{
    CH_REQUIRE(M && M->finalized, "ch_model_init: model not finalized");
    CH_REQUIRE(scheme == CH_NN_INIT_RESNET || scheme == CH_NN_INIT_DEFAULT,
               "ch_model_init_scheme: unknown scheme %d", (int)scheme);
    ch_nn_rng_t rng;
    ch_nn_rng_seed(&rng, seed);
    ch_tensor_data_changed(); /* new parameter values (tensor.h) */
    CH_TRY(init_module(M->root, &rng, scheme));
    ch_model_zero_grad(M);
    return CH_OK;
}

ch_status ch_model_init(ch_model_t *M, uint64_t seed)
{
    return ch_model_init_scheme(M, CH_NN_INIT_RESNET, seed);
}

ch_status ch_model_init_default(ch_model_t *M, uint64_t seed)
{
    return ch_model_init_scheme(M, CH_NN_INIT_DEFAULT, seed);
}

/* ------------------------------------------------------------ entries */

int ch_model_num_entries(const ch_model_t *M) { return M->nentries; }
/* Accessors that hand out writable pointers to a parameter count as a
 * write of the parameters (tensor.h): the caller may write through them
 * before the next forward. */
static ch_param_t *handed_out(ch_param_t *p)
{
    if (p && !p->is_buffer) ch_tensor_data_changed();
    return p;
}

ch_param_t *ch_model_entry(const ch_model_t *M, int i)
{
    return handed_out((i >= 0 && i < M->nentries) ? M->entries[i] : NULL);
}
int ch_model_num_params(const ch_model_t *M) { return M->nparams; }
ch_param_t *ch_model_param(const ch_model_t *M, int i)
{
    return handed_out((i >= 0 && i < M->nparams) ? M->params[i] : NULL);
}

ch_param_t *ch_model_find(const ch_model_t *M, const char *name)
{
    if (!name) return NULL;
    for (int i = 0; i < M->nentries; i++)
        if (!strcmp(M->entries[i]->name, name)) return handed_out(M->entries[i]);
    return NULL;
}

size_t ch_model_param_numel(const ch_model_t *M) { return M->param_numel; }

size_t ch_model_trainable_numel(const ch_model_t *M)
{
    size_t n = 0;
    for (int i = 0; i < M->nparams; i++)
        if (M->params[i]->requires_grad) n += M->params[i]->numel;
    return n;
}

float *ch_model_param_block(ch_model_t *M)
{
    ch_tensor_data_changed(); /* handed out for writing (tensor.h) */
    return M->param_block;
}
float *ch_model_grad_block(ch_model_t *M) { return M->grad_block; }

float *ch_model_buffer_block(ch_model_t *M, size_t *numel)
{
    if (numel) *numel = M->buffer_numel;
    return M->buffer_block;
}

int64_t *ch_model_counter_block(ch_model_t *M, size_t *numel)
{
    if (numel) *numel = M->i64_numel;
    return M->i64_block;
}

/* ------------------------------------------------------------ modes */

void ch_model_train(ch_model_t *M, int on) { M->training = on != 0; }
int ch_model_is_training(const ch_model_t *M) { return M->training; }

void ch_model_zero_grad(ch_model_t *M)
{
    if (M->grad_block) memset(M->grad_block, 0, M->param_numel * sizeof(float));
    if (M->dev != CH_DEV_CPU && M->d_grad_block &&
        ch_device_memzero(M->dev_index, M->d_grad_block, M->param_numel * sizeof(float)) != CH_OK)
        ch_log_error("zero_grad of '%s' on GPU %d: %s", M->arch, M->dev_index,
                     ch_error_message());
}

ch_status ch_model_set_requires_grad(ch_model_t *M, const char *name, int on)
{
    ch_param_t *p = ch_model_find(M, name);
    CH_REQUIRE(p && !p->is_buffer, "nn: '%s' is not a parameter of '%s'", name ? name : "(null)",
               M->arch);
    p->requires_grad = on != 0;
    return CH_OK;
}

ch_status ch_model_freeze(ch_model_t *M, const char *keep, int *n_frozen)
{
    CH_REQUIRE(M && keep, "ch_model_freeze: NULL argument");
    int n = 0;
    for (int i = 0; i < M->nparams; i++) {
        ch_param_t *p = M->params[i];
        if (!strstr(p->name, keep)) {
            if (p->requires_grad) n++;
            p->requires_grad = 0;
        }
    }
    if (n_frozen) *n_frozen = n;
    return CH_OK;
}

/* ------------------------------------------------------------ state dict */

ch_status ch_model_state_dict(ch_model_t *M, ch_nn_view_t *views, int capacity, int *count)
{
    CH_REQUIRE(M && M->finalized, "ch_model_state_dict: model not finalized");
    if (count) *count = M->nentries;
    if (capacity < M->nentries)
        return CH_ERROR(CH_ERR_RANGE, "nn: state dict of '%s' has %d entries, room for %d", M->arch,
                        M->nentries, capacity);
    ch_tensor_data_changed(); /* the views point into the parameters (tensor.h) */
    for (int i = 0; i < M->nentries; i++) {
        ch_param_t *p = M->entries[i];
        ch_nn_view_t *v = &views[i];
        v->name = p->name;
        v->dtype = p->dtype;
        v->ndim = p->ndim;
        for (int d = 0; d < CH_NN_MAX_DIMS; d++) v->shape[d] = d < p->ndim ? p->shape[d] : 1;
        v->numel = p->numel;
        v->data = p->data;
    }
    return CH_OK;
}

static void shape_str(char *buf, size_t len, int ndim, const int64_t *shape)
{
    size_t o = 0;
    o += (size_t)snprintf(buf + o, len - o, "[");
    for (int i = 0; i < ndim && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (o < len) snprintf(buf + o, len - o, "]");
}

static size_t view_numel(const ch_nn_view_t *v)
{
    size_t n = 1;
    for (int d = 0; d < v->ndim; d++) n *= (size_t)v->shape[d];
    return n;
}

ch_status ch_model_load_state_dict(ch_model_t *M, const ch_nn_view_t *views, int n, int strict,
                                   ch_nn_skip_fn skipped, void *arg, int *n_loaded)
{
    CH_REQUIRE(M && M->finalized, "ch_model_load_state_dict: model not finalized");
    CH_REQUIRE(n >= 0 && (views || n == 0), "ch_model_load_state_dict: bad view list");
    if (n_loaded) *n_loaded = 0;
    char reason[256], a[96], b[96];
    /* validate views themselves */
    for (int i = 0; i < n; i++) {
        const ch_nn_view_t *v = &views[i];
        CH_REQUIRE(v->name && v->ndim >= 0 && v->ndim <= CH_NN_MAX_DIMS && (v->data || view_numel(v) == 0),
                   "nn: state dict entry %d is malformed (name %s, ndim %d)", i,
                   v->name ? v->name : "(null)", v->ndim);
        for (int d = 0; d < v->ndim; d++)
            CH_REQUIRE(v->shape[d] >= 0, "nn: state dict entry '%s' has negative dimension %d", v->name, d);
        for (int j = 0; j < i; j++)
            CH_REQUIRE(strcmp(views[j].name, v->name) != 0, "nn: state dict names '%s' twice", v->name);
    }
    if (strict) {
        for (int i = 0; i < n; i++) {
            const ch_nn_view_t *v = &views[i];
            ch_param_t *p = ch_model_find(M, v->name);
            if (!p)
                return CH_ERROR(CH_ERR_INVALID, "nn: unexpected key '%s' in state dict for '%s' (strict)",
                                v->name, M->arch);
            int same = v->dtype == p->dtype && v->ndim == p->ndim;
            for (int d = 0; same && d < p->ndim; d++) same = v->shape[d] == p->shape[d];
            if (!same) {
                shape_str(a, sizeof a, v->ndim, v->shape);
                shape_str(b, sizeof b, p->ndim, p->shape);
                return CH_ERROR(CH_ERR_INVALID,
                                "nn: size mismatch for '%s': state dict %s %s, model %s %s (strict)",
                                v->name, ch_dtype_name(v->dtype), a, ch_dtype_name(p->dtype), b);
            }
        }
        for (int k = 0; k < M->nentries; k++) {
            int found = 0;
            for (int i = 0; i < n && !found; i++) found = !strcmp(views[i].name, M->entries[k]->name);
            if (!found)
                return CH_ERROR(CH_ERR_INVALID, "nn: missing key '%s' in state dict for '%s' (strict)",
                                M->entries[k]->name, M->arch);
        }
    }
    int loaded = 0;
    for (int i = 0; i < n; i++) {
        const ch_nn_view_t *v = &views[i];
        ch_param_t *p = ch_model_find(M, v->name);
        if (!p) {
            if (skipped) skipped(arg, v->name, "not in model");
            continue;
        }
        size_t vn = view_numel(v);
        if (vn != p->numel || v->dtype != p->dtype) {
            shape_str(a, sizeof a, v->ndim, v->shape);
            shape_str(b, sizeof b, p->ndim, p->shape);
            snprintf(reason, sizeof reason, "%s %s vs model %s %s", ch_dtype_name(v->dtype), a,
                     ch_dtype_name(p->dtype), b);
            if (skipped) skipped(arg, v->name, reason);
            continue;
        }
        memcpy(p->data, v->data, p->numel * ch_dtype_size(p->dtype));
        ch_tensor_data_changed(); /* tensor.h */
        loaded++;
    }
    if (n_loaded) *n_loaded = loaded;
    return CH_OK;
}

ch_status ch_model_copy(ch_model_t *dst, const ch_model_t *src)
{
    CH_REQUIRE(dst && src && dst->finalized && src->finalized, "ch_model_copy: models not finalized");
    CH_REQUIRE(dst->nentries == src->nentries, "nn: copy from '%s' (%d entries) to '%s' (%d entries)",
               src->arch, src->nentries, dst->arch, dst->nentries);
    for (int i = 0; i < dst->nentries; i++) {
        ch_param_t *d = dst->entries[i], *s = src->entries[i];
        CH_REQUIRE(!strcmp(d->name, s->name) && d->numel == s->numel && d->dtype == s->dtype,
                   "nn: copy: entry %d is '%s' in the source and '%s' in the destination", i, s->name,
                   d->name);
        memcpy(d->data, s->data, d->numel * ch_dtype_size(d->dtype));
    }
    ch_tensor_data_changed(); /* tensor.h */
    return CH_OK;
}

/* ------------------------------------------------------------ devices */

ch_devkind_t ch_model_device(const ch_model_t *M, int *dev_index)
{
    if (dev_index) *dev_index = M ? M->dev_index : 0;
    return M ? M->dev : CH_DEV_CPU;
}

float *ch_model_device_param_block(ch_model_t *M)
{
    ch_tensor_data_changed(); /* handed out for writing, e.g. DDP's broadcast (tensor.h) */
    return M->dev == CH_DEV_CPU ? M->param_block : M->d_param_block;
}

float *ch_model_device_grad_block(ch_model_t *M)
{
    return M->dev == CH_DEV_CPU ? M->grad_block : M->d_grad_block;
}

float *ch_model_device_buffer_block(ch_model_t *M, size_t *numel)
{
    if (numel) *numel = M->buffer_numel;
    return M->dev == CH_DEV_CPU ? M->buffer_block : M->d_buffer_block;
}

/* Copy the three float blocks between the host mirror and the device. */
static ch_status copy_blocks(ch_model_t *M, int to_device)
{
    const ch_memcpy_kind k = to_device ? CH_MEMCPY_HOST_TO_DEVICE : CH_MEMCPY_DEVICE_TO_HOST;
    float *host[3] = {M->param_block, M->grad_block, M->buffer_block};
    float *dev[3] = {M->d_param_block, M->d_grad_block, M->d_buffer_block};
    size_t n[3] = {M->param_numel, M->param_numel, M->buffer_numel};
    for (int i = 0; i < 3; i++) {
        ch_status s = to_device ? ch_device_memcpy(M->dev_index, dev[i], host[i], n[i] * sizeof(float), k)
                                : ch_device_memcpy(M->dev_index, host[i], dev[i], n[i] * sizeof(float), k);
        if (s) return ch_error_context("copying the %s of '%s' %s GPU %d",
                                       i == 0 ? "parameters" : i == 1 ? "gradients" : "buffers",
                                       M->arch, to_device ? "to" : "from", M->dev_index);
    }
    return CH_OK;
}

ch_status ch_model_sync_to_host(ch_model_t *M)
{
    CH_REQUIRE(M && M->finalized, "ch_model_sync_to_host: model not finalized");
    if (M->dev == CH_DEV_CPU) return CH_OK;
    return copy_blocks(M, 0);
}

ch_status ch_model_sync_to_device(ch_model_t *M)
{
    CH_REQUIRE(M && M->finalized, "ch_model_sync_to_device: model not finalized");
    if (M->dev == CH_DEV_CPU) return CH_OK;
    ch_tensor_data_changed(); /* tensor.h */
    return copy_blocks(M, 1);
}

/* Point every entry's dev_data/dev_grad at the current blocks. */
static void point_entries(ch_model_t *M, float *pb, float *gb, float *bb)
{
    size_t po = 0, bo = 0;
    for (int i = 0; i < M->nentries; i++) {
        ch_param_t *p = M->entries[i];
        if (!p->is_buffer) {
            p->dev_data = pb + po;
            p->dev_grad = gb + po;
            po += p->numel;
        } else if (p->dtype == CH_F32) {
            p->dev_data = bb + bo;
            bo += p->numel;
        } else {
            p->dev_data = p->data;
        }
    }
}

ch_status ch_model_to_device(ch_model_t *M, ch_devkind_t dev, int dev_index)
{
    CH_REQUIRE(M && M->finalized, "ch_model_to_device: model not finalized");
    CH_REQUIRE(dev == CH_DEV_CPU || dev == CH_DEV_CUDA, "ch_model_to_device: unknown device kind %d",
               (int)dev);
    CH_REQUIRE(dev_index >= 0, "ch_model_to_device: device index %d < 0", dev_index);
    if (dev == CH_DEV_CPU) dev_index = 0;
    if (dev == M->dev && dev_index == M->dev_index) return CH_OK;
    ch_status s = CH_OK;
    if (dev == CH_DEV_CPU) {
        /* back to the host: the mirror becomes the storage */
        CH_TRY(ch_model_sync_to_host(M));
    } else {
        CH_REQUIRE(M->dev == CH_DEV_CPU,
                   "ch_model_to_device: '%s' is on GPU %d; move it to the CPU before GPU %d",
                   M->arch, M->dev_index, dev_index);
        if (!ch_device_backend_compiled())
            return CH_ERROR(CH_ERR_UNSUPPORTED, "ch_model_to_device: cannot move '%s' to GPU %d: "
                            "cohort was built without CUDA", M->arch, dev_index);
        int ndev = 0;
        CH_TRY(ch_device_count(&ndev));
        if (dev_index >= ndev)
            return CH_ERROR(CH_ERR_RANGE, "ch_model_to_device: GPU %d requested for '%s' but %d "
                            "visible", dev_index, M->arch, ndev);
        CH_TRY(ch_device_enable_tensors());
        float *pb = NULL, *gb = NULL, *bb = NULL;
        const size_t pbytes = M->param_numel * sizeof(float), bbytes = M->buffer_numel * sizeof(float);
        s = ch_storage_alloc(dev, dev_index, pbytes, (void **)&pb);
        if (s == CH_OK) s = ch_storage_alloc(dev, dev_index, pbytes, (void **)&gb);
        if (s == CH_OK) s = ch_storage_alloc(dev, dev_index, bbytes, (void **)&bb);
        if (s == CH_OK) {
            M->d_param_block = pb;
            M->d_grad_block = gb;
            M->d_buffer_block = bb;
            M->dev_index = dev_index;
            s = copy_blocks(M, 1);
        }
        if (s != CH_OK) {
            ch_storage_free(dev, dev_index, pb);
            ch_storage_free(dev, dev_index, gb);
            ch_storage_free(dev, dev_index, bb);
            M->d_param_block = M->d_grad_block = M->d_buffer_block = NULL;
            M->dev_index = 0;
            return ch_error_context("moving '%s' to GPU %d", M->arch, dev_index);
        }
    }
    /* the plan's arena lives on the old device */
    ch_arena_destroy(M->arena);
    M->arena = NULL;
    M->planned = 0;
    M->have_forward = M->have_loss = M->have_loss_value = 0;
    M->logits = NULL;
    const ch_devkind_t old = M->dev;
    const int old_index = M->dev_index;
    float *opb = M->d_param_block, *ogb = M->d_grad_block, *obb = M->d_buffer_block;
    M->dev = dev;
    M->dev_index = dev_index;
    if (dev == CH_DEV_CPU) {
        point_entries(M, M->param_block, M->grad_block, M->buffer_block);
        M->d_param_block = M->d_grad_block = M->d_buffer_block = NULL;
    } else {
        point_entries(M, M->d_param_block, M->d_grad_block, M->d_buffer_block);
    }
    ch_tensor_data_changed(); /* the weights now live elsewhere (tensor.h) */
    s = ch_nn_bind_module(M, M->root);
    if (s != CH_OK) return ch_error_context("binding '%s' to its new device", M->arch);
    if (old != CH_DEV_CPU) {
        ch_storage_free(old, old_index, opb);
        ch_storage_free(old, old_index, ogb);
        ch_storage_free(old, old_index, obb);
    }
    return CH_OK;
}
