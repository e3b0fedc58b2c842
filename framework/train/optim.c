/* cohort: SGD (torch.optim.SGD semantics, see optim.h). */
#include "config.h"

#include "framework/train/optim.h"

#include "framework/tensor/device.h"
#include "framework/nn/nn.h"
#include "framework/ops/ops.h"
#include "framework/tensor/tensor.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char *name;
    float *data;
    const float *grad;
    float *buf;     /* NULL when momentum == 0; device memory on a GPU optimizer */
    float *hbuf;    /* GPU optimizer: host copy of buf for ch_sgd_buffer */
    size_t numel;
    int has_buf;    /* 0 until the first step / a load */
} sgd_param;

struct ch_sgd {
    ch_sgd_options_t o;
    sgd_param *p;
    int n, cap;
    /* where the parameters live: fixed by the first parameter added */
    ch_devkind_t dev;
    int dev_index;
    int dev_fixed;
    ch_compute_t *cx;      /* for ch_op_sgd_step on a GPU */
    ch_sgd_tensor_t *ts;   /* GPU: the fused step's tensor list (cap entries) */
};

static const ch_config_key_t ch_sgd_config_keys[] = {
    {"optimizer.lr", CH_CFG_FLOAT, "0.01", 0, 1e3,
     "Base learning rate per rank; the job uses lr x world size."},
    {"optimizer.momentum", CH_CFG_FLOAT, "0.9", 0, 1e3, "SGD momentum."},
    {"optimizer.dampening", CH_CFG_FLOAT, "0", 0, 1, "SGD dampening."},
    {"optimizer.weight_decay", CH_CFG_FLOAT, "0.005", 0, 1e3, "SGD weight decay (L2)."},
    {"optimizer.nesterov", CH_CFG_BOOL, "false", CH_CFG_NO_RANGE, "Nesterov momentum."},
};

ch_config_table_t ch_sgd_config_table(void)
{
    ch_config_table_t t = {"optimizer", ch_sgd_config_keys, (int)(sizeof ch_sgd_config_keys / sizeof ch_sgd_config_keys[0])};
    return t;
}

ch_status ch_sgd_options_from_config(const ch_config_t *cfg, ch_sgd_options_t *o)
{
    memset(o, 0, sizeof *o);
    CH_TRY(ch_config_get_double(cfg, "optimizer.lr", &o->lr));
    CH_TRY(ch_config_get_double(cfg, "optimizer.momentum", &o->momentum));
    CH_TRY(ch_config_get_double(cfg, "optimizer.dampening", &o->dampening));
    CH_TRY(ch_config_get_double(cfg, "optimizer.weight_decay", &o->weight_decay));
    CH_TRY(ch_config_get_bool(cfg, "optimizer.nesterov", &o->nesterov));
    if (o->nesterov && (o->momentum <= 0 || o->dampening != 0))
        return CH_ERROR(CH_ERR_CONFIG, "optimizer.nesterov needs momentum > 0 and dampening 0 "
                        "(got momentum %g, dampening %g)", o->momentum, o->dampening);
    return CH_OK;
}

ch_status ch_sgd_create(const ch_sgd_options_t *o, ch_sgd_t **out)
{
    CH_REQUIRE(o && out, "ch_sgd_create: NULL argument");
    *out = NULL;
    CH_REQUIRE(isfinite(o->lr) && o->lr >= 0.0, "SGD: invalid learning rate %g (expected >= 0)", o->lr);
    CH_REQUIRE(isfinite(o->momentum) && o->momentum >= 0.0,
               "SGD: invalid momentum %g (expected >= 0)", o->momentum);
    CH_REQUIRE(isfinite(o->weight_decay) && o->weight_decay >= 0.0,
               "SGD: invalid weight_decay %g (expected >= 0)", o->weight_decay);
    CH_REQUIRE(isfinite(o->dampening), "SGD: invalid dampening %g", o->dampening);
    CH_REQUIRE(!o->nesterov || (o->momentum > 0.0 && o->dampening == 0.0),
               "SGD: nesterov momentum requires momentum > 0 and dampening 0 (got momentum %g, dampening %g)",
               o->momentum, o->dampening);
    ch_sgd_t *s = calloc(1, sizeof *s);
    if (!s) return CH_ERROR(CH_ERR_NOMEM, "SGD: out of memory");
    s->o = *o;
    *out = s;
    return CH_OK;
}

void ch_sgd_destroy(ch_sgd_t *s)
{
    if (!s) return;
    for (int i = 0; i < s->n; i++) {
        free(s->p[i].name);
        if (s->dev == CH_DEV_CPU) free(s->p[i].buf);
        else ch_storage_free(s->dev, s->dev_index, s->p[i].buf);
        free(s->p[i].hbuf);
    }
    free(s->p);
    free(s->ts);
    free(s);
}

ch_status ch_sgd_add_param(ch_sgd_t *s, const char *name, float *data, const float *grad,
                           size_t numel)
{
    return ch_sgd_add_param_on(s, name, data, grad, numel, CH_DEV_CPU, 0);
}

ch_status ch_sgd_add_param_on(ch_sgd_t *s, const char *name, float *data, const float *grad,
                              size_t numel, ch_devkind_t dev, int dev_index)
{
    CH_REQUIRE(s && name && data && grad, "ch_sgd_add_param: NULL argument (name %s)",
               name ? name : "(null)");
    CH_REQUIRE(dev == CH_DEV_CPU || dev == CH_DEV_CUDA, "SGD: unknown device kind %d for '%s'",
               (int)dev, name);
    if (dev == CH_DEV_CPU) dev_index = 0;
    if (s->dev_fixed)
        CH_REQUIRE(s->dev == dev && s->dev_index == dev_index,
                   "SGD: parameter '%s' is on %s %d but the optimizer's parameters are on %s %d",
                   name, dev == CH_DEV_CPU ? "cpu" : "cuda", dev_index,
                   s->dev == CH_DEV_CPU ? "cpu" : "cuda", s->dev_index);
    for (int i = 0; i < s->n; i++)
        CH_REQUIRE(strcmp(s->p[i].name, name) != 0, "SGD: parameter '%s' added twice", name);
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 64;
        sgd_param *np = realloc(s->p, (size_t)cap * sizeof *np);
        if (!np) return CH_ERROR(CH_ERR_NOMEM, "SGD: out of memory adding '%s'", name);
        s->p = np;
        ch_sgd_tensor_t *nt = realloc(s->ts, (size_t)cap * sizeof *nt);
        if (!nt) return CH_ERROR(CH_ERR_NOMEM, "SGD: out of memory adding '%s'", name);
        s->ts = nt;
        s->cap = cap;
    }
    sgd_param *p = &s->p[s->n];
    memset(p, 0, sizeof *p);
    p->name = strdup(name);
    if (!p->name) return CH_ERROR(CH_ERR_NOMEM, "SGD: out of memory adding '%s'", name);
    if (s->o.momentum != 0.0 && dev == CH_DEV_CPU) {
        p->buf = calloc(numel ? numel : 1, sizeof(float));
        if (!p->buf) {
            free(p->name);
            return CH_ERROR(CH_ERR_NOMEM, "SGD: out of memory for the momentum buffer of '%s' (%zu floats)",
                            name, numel);
        }
    } else if (s->o.momentum != 0.0) {
        /* zero-filled device memory (tensor allocator) and its host copy */
        ch_status st = ch_device_enable_tensors();
        if (st == CH_OK)
            st = ch_storage_alloc(dev, dev_index, (numel ? numel : 1) * sizeof(float),
                                  (void **)&p->buf);
        p->hbuf = calloc(numel ? numel : 1, sizeof(float));
        if (st != CH_OK || !p->hbuf) {
            if (p->buf) ch_storage_free(dev, dev_index, p->buf);
            free(p->hbuf);
            free(p->name);
            p->buf = p->hbuf = NULL;
            if (st != CH_OK)
                return ch_error_context("SGD: momentum buffer of '%s' (%zu floats) on GPU %d", name,
                                        numel, dev_index);
            return CH_ERROR(CH_ERR_NOMEM, "SGD: out of memory for the momentum buffer of '%s'", name);
        }
    }
    s->dev = dev;
    s->dev_index = dev_index;
    s->dev_fixed = 1;
    p->data = data;
    p->grad = grad;
    p->numel = numel;
    s->n++;
    return CH_OK;
}

ch_status ch_sgd_add_model(ch_sgd_t *s, ch_model_t *model)
{
    CH_REQUIRE(s && model, "ch_sgd_add_model: NULL argument");
    int n = ch_model_num_params(model), di = 0;
    ch_devkind_t dev = ch_model_device(model, &di);
    for (int i = 0; i < n; i++) {
        ch_param_t *p = ch_model_param(model, i);
        if (!p->requires_grad) continue;
        CH_TRY(ch_sgd_add_param_on(s, p->name, (float *)p->dev_data, p->dev_grad, p->numel, dev,
                                   di));
    }
    return CH_OK;
}

void ch_sgd_set_compute(ch_sgd_t *s, ch_compute_t *cx)
{
    if (s) s->cx = cx;
}

/* One fused ch_op_sgd_step over every parameter: the CPU backend's loop
 * (PyTorch's order of float32 operations: d = grad + wd*p; buf = mom*buf +
 * (1-damp)*d; d = d + mom*buf (nesterov); p = p - lr*d), or on the GPU one
 * multi-tensor kernel queued on the compute stream after backward and the
 * gradient all-reduce. */
static ch_status step_fused(ch_sgd_t *s)
{
    CH_REQUIRE(s->cx || s->dev == CH_DEV_CPU,
               "SGD: the parameters are on GPU %d but no compute context was given "
               "(ch_sgd_set_compute)", s->dev_index);
    int n = 0;
    for (int k = 0; k < s->n; k++) {
        sgd_param *p = &s->p[k];
        if (p->numel == 0) continue;
        ch_sgd_tensor_t *t = &s->ts[n++];
        t->param = p->data;
        t->grad = p->grad;
        t->momentum_buffer = p->buf;
        t->numel = (int64_t)p->numel;
        t->buffer_started = p->has_buf;
    }
    ch_sgd_hparams_t h = {.lr = (float)s->o.lr,
                          .momentum = (float)s->o.momentum,
                          .dampening = (float)s->o.dampening,
                          .weight_decay = (float)s->o.weight_decay,
                          .nesterov = s->o.nesterov != 0};
    ch_status st = ch_op_sgd_step(s->cx, s->dev, s->dev_index, s->ts, n, &h);
    if (st) return ch_error_context("SGD step of %d parameters", n);
    for (int k = 0; k < s->n; k++)
        if (s->p[k].buf) s->p[k].has_buf = 1;
    return CH_OK;
}

ch_status ch_sgd_step(ch_sgd_t *s)
{
    CH_REQUIRE(s, "ch_sgd_step: NULL optimizer");
    return step_fused(s);
}

void ch_sgd_set_lr(ch_sgd_t *s, double lr) { s->o.lr = lr; }
double ch_sgd_get_lr(const ch_sgd_t *s) { return s->o.lr; }
const ch_sgd_options_t *ch_sgd_options(const ch_sgd_t *s) { return &s->o; }
int ch_sgd_num_params(const ch_sgd_t *s) { return s ? s->n : 0; }

ch_status ch_sgd_buffer(const ch_sgd_t *s, int i, const char **name, const float **buf,
                        size_t *numel, int *has_buf)
{
    CH_REQUIRE(s && i >= 0 && i < s->n, "SGD: parameter index %d outside [0, %d)", i, s ? s->n : 0);
    const sgd_param *p = &s->p[i];
    if (name) *name = p->name;
    if (numel) *numel = p->numel;
    if (has_buf) *has_buf = p->buf && p->has_buf;
    if (buf) *buf = NULL;
    if (!p->buf || !p->has_buf) return CH_OK;
    if (s->dev == CH_DEV_CPU) {
        if (buf) *buf = p->buf;
        return CH_OK;
    }
    if (buf) {
        /* the device buffer into its host copy (after all queued work) */
        ch_status st = ch_device_memcpy(s->dev_index, p->hbuf, p->buf, p->numel * sizeof(float),
                                        CH_MEMCPY_DEVICE_TO_HOST);
        if (st) return ch_error_context("SGD: reading the momentum buffer of '%s' from GPU %d",
                                        p->name, s->dev_index);
        *buf = p->hbuf;
    }
    return CH_OK;
}

ch_status ch_sgd_load_buffer(ch_sgd_t *s, const char *name, const float *data, size_t numel)
{
    CH_REQUIRE(s && name && data, "ch_sgd_load_buffer: NULL argument");
    CH_REQUIRE(s->o.momentum != 0.0, "SGD: momentum buffer for '%s' given but momentum is 0", name);
    for (int i = 0; i < s->n; i++) {
        sgd_param *p = &s->p[i];
        if (strcmp(p->name, name) != 0) continue;
        CH_REQUIRE(p->numel == numel, "SGD: momentum buffer '%s' has %zu elements, expected %zu", name,
                   numel, p->numel);
        if (s->dev != CH_DEV_CPU) {
            memcpy(p->hbuf, data, numel * sizeof(float));
            ch_status st = ch_device_memcpy(s->dev_index, p->buf, data, numel * sizeof(float),
                                            CH_MEMCPY_HOST_TO_DEVICE);
            if (st) return ch_error_context("SGD: momentum buffer of '%s' to GPU %d", name,
                                            s->dev_index);
        } else {
            memcpy(p->buf, data, numel * sizeof(float));
        }
        p->has_buf = 1;
        return CH_OK;
    }
    return CH_ERROR(CH_ERR_INVALID, "SGD: no parameter named '%s' in the optimizer", name);
}

void ch_sgd_reset(ch_sgd_t *s)
{
    for (int i = 0; i < s->n; i++) s->p[i].has_buf = 0;
}
