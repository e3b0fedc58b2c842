/* cohort: SGD / AdamW / RMSprop behind one interface (see optimizer.h). */
#include "config.h"

#include "framework/train/optimizer.h"

#include "framework/nn/nn.h"
#include "framework/ops/ops.h"
#include "framework/tensor/device.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_STATE = 3 };

typedef struct {
    char *name;
    float *data;
    const float *grad;
    size_t numel;
    float *buf[MAX_STATE];  /* state j, on the optimizer's device */
    float *hbuf[MAX_STATE]; /* GPU optimizer: host copies for ch_optimizer_state */
    int has;                /* state present (after a step or a load) */
} opt_param;

struct ch_optimizer {
    ch_optimizer_options_t o;
    ch_sgd_t *sgd; /* kind sgd: everything is delegated */
    const char *state_names[MAX_STATE];
    int nstate;
    opt_param *p;
    int n, cap;
    ch_devkind_t dev;
    int dev_index, dev_fixed;
    ch_compute_t *cx;
    void *ts; /* cap ch_adamw_tensor_t or ch_rmsprop_tensor_t */
    int64_t steps;
};

static const char *const kind_names[] = {"sgd", "adamw", "rmsprop"};

const char *ch_optimizer_kind_name(ch_optimizer_kind_t kind)
{
    return (unsigned)kind < 3 ? kind_names[kind] : NULL;
}

void ch_optimizer_options_default(ch_optimizer_kind_t kind, ch_optimizer_options_t *o)
{
    memset(o, 0, sizeof *o);
    o->kind = kind;
    o->lr = kind == CH_OPTIM_ADAMW ? 1e-3 : 1e-2;
    o->weight_decay = kind == CH_OPTIM_ADAMW ? 1e-2 : 0.0;
    o->beta1 = 0.9;
    o->beta2 = 0.999;
    o->eps = 1e-8;
    o->alpha = 0.99;
}

/* ------------------------------------------------------------- config keys */

static const ch_config_key_t optimizer_keys[] = {
    {"optimizer.name", CH_CFG_STRING, "sgd", CH_CFG_NO_RANGE,
     "Optimizer: sgd, adamw or rmsprop (torch.optim.SGD / AdamW / RMSprop)."},
    {"optimizer.betas", CH_CFG_STRLIST, "0.9,0.999", CH_CFG_NO_RANGE,
     "AdamW's (beta1, beta2), two numbers in [0, 1)."},
    {"optimizer.eps", CH_CFG_FLOAT, "1e-8", 0, 1, "AdamW / RMSprop denominator term."},
    {"optimizer.alpha", CH_CFG_FLOAT, "0.99", 0, 1, "RMSprop smoothing constant."},
    {"optimizer.centered", CH_CFG_BOOL, "false", CH_CFG_NO_RANGE,
     "RMSprop: normalise by the centered second moment."},
    {"optimizer.amsgrad", CH_CFG_BOOL, "false", CH_CFG_NO_RANGE,
     "AdamW: use the maximum of past second moments (AMSGrad)."},
};

ch_config_table_t ch_optimizer_config_table(void)
{
    ch_config_table_t t = {"optimizer", optimizer_keys,
                           (int)(sizeof optimizer_keys / sizeof optimizer_keys[0])};
    return t;
}

/* Which kinds use a key (bit k for kind k). */
#define USE_SGD (1u << CH_OPTIM_SGD)
#define USE_ADAMW (1u << CH_OPTIM_ADAMW)
#define USE_RMSPROP (1u << CH_OPTIM_RMSPROP)
static const struct {
    const char *key;
    unsigned used_by;
} key_users[] = {
    {"optimizer.momentum", USE_SGD | USE_RMSPROP}, {"optimizer.dampening", USE_SGD},
    {"optimizer.nesterov", USE_SGD},               {"optimizer.betas", USE_ADAMW},
    {"optimizer.eps", USE_ADAMW | USE_RMSPROP},    {"optimizer.alpha", USE_RMSPROP},
    {"optimizer.centered", USE_RMSPROP},           {"optimizer.amsgrad", USE_ADAMW},
};

static int is_default(const ch_config_t *cfg, const char *key)
{
    const char *src = ch_config_source(cfg, key);
    return src && !strcmp(src, "default");
}

static const ch_config_key_t *find_key(const char *name)
{
    const ch_config_table_t t[2] = {ch_sgd_config_table(), ch_optimizer_config_table()};
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < t[i].n_keys; k++)
            if (!strcmp(t[i].keys[k].name, name)) return &t[i].keys[k];
    return NULL;
}

/* The key's value differs from its table default (1), or not (0); a file
 * that repeats a default (jobs/train.cfg writes every SGD key) is not a
 * choice of the user. */
static ch_status differs_from_default(const ch_config_t *cfg, const char *name, int *differs)
{
    const ch_config_key_t *k = find_key(name);
    *differs = 0;
    if (!k || is_default(cfg, name)) return CH_OK;
    if (k->type == CH_CFG_FLOAT) {
        double v;
        CH_TRY(ch_config_get_double(cfg, name, &v));
        *differs = v != strtod(k->def, NULL);
    } else if (k->type == CH_CFG_BOOL) {
        int v;
        CH_TRY(ch_config_get_bool(cfg, name, &v));
        *differs = v != !strcmp(k->def, "true");
    } else { /* the betas list: compare the words */
        const char *const *items;
        int n;
        char joined[256] = "";
        CH_TRY(ch_config_get_strlist(cfg, name, &items, &n));
        for (int i = 0; i < n; i++)
            snprintf(joined + strlen(joined), sizeof joined - strlen(joined), "%s%s",
                     i ? "," : "", items[i]);
        *differs = strcmp(joined, k->def) != 0;
    }
    return CH_OK;
}

ch_status ch_optimizer_options_from_config(const ch_config_t *cfg, ch_optimizer_options_t *o)
{
    int kind;
    CH_TRY(ch_config_get_choice(cfg, "optimizer.name", kind_names, 3, &kind));
    ch_optimizer_options_default((ch_optimizer_kind_t)kind, o);
    for (size_t i = 0; i < sizeof key_users / sizeof key_users[0]; i++) {
        int differs;
        if (key_users[i].used_by & (1u << kind)) continue;
        CH_TRY(differs_from_default(cfg, key_users[i].key, &differs));
        if (differs)
            return CH_ERROR(CH_ERR_CONFIG, "%s (%s) is not used by optimizer.name = %s",
                            key_users[i].key, ch_config_source(cfg, key_users[i].key),
                            kind_names[kind]);
    }
    ch_sgd_options_t s;
    CH_TRY(ch_sgd_options_from_config(cfg, &s));
    o->lr = s.lr;
    o->dampening = s.dampening;
    o->nesterov = s.nesterov;
    if (kind == CH_OPTIM_SGD || !is_default(cfg, "optimizer.momentum")) o->momentum = s.momentum;
    if (kind == CH_OPTIM_SGD || !is_default(cfg, "optimizer.weight_decay"))
        o->weight_decay = s.weight_decay;
    CH_TRY(ch_config_get_double(cfg, "optimizer.eps", &o->eps));
    CH_TRY(ch_config_get_double(cfg, "optimizer.alpha", &o->alpha));
    CH_TRY(ch_config_get_bool(cfg, "optimizer.centered", &o->centered));
    CH_TRY(ch_config_get_bool(cfg, "optimizer.amsgrad", &o->amsgrad));
    const char *const *betas;
    int nb;
    CH_TRY(ch_config_get_strlist(cfg, "optimizer.betas", &betas, &nb));
    double b[2] = {0, 0};
    int ok = nb == 2;
    for (int i = 0; ok && i < 2; i++) {
        char *end;
        b[i] = strtod(betas[i], &end);
        ok = end != betas[i] && !*end && b[i] >= 0.0 && b[i] < 1.0;
    }
    if (!ok)
        return CH_ERROR(CH_ERR_CONFIG, "optimizer.betas (%s): expected two numbers in [0, 1), "
                        "e.g. \"0.9,0.999\"", ch_config_source(cfg, "optimizer.betas"));
    o->beta1 = b[0];
    o->beta2 = b[1];
    return CH_OK;
}

/* ------------------------------------------------------------- life cycle */

ch_status ch_optimizer_create(const ch_optimizer_options_t *o, ch_optimizer_t **out)
{
    CH_REQUIRE(o && out, "ch_optimizer_create: NULL argument");
    *out = NULL;
    const char *kn = ch_optimizer_kind_name(o->kind);
    CH_REQUIRE(kn, "optimizer: unknown kind %d", (int)o->kind);
#define NONNEG(v)                                                                            \
    CH_REQUIRE(isfinite(o->v) && o->v >= 0.0, "%s: invalid " #v " %g (expected >= 0)", kn, \
               o->v)
    NONNEG(lr);
    NONNEG(weight_decay);
    NONNEG(momentum);
    NONNEG(eps);
    NONNEG(alpha);
#undef NONNEG
    CH_REQUIRE(o->kind != CH_OPTIM_ADAMW || (o->beta1 >= 0.0 && o->beta1 < 1.0 &&
                                             o->beta2 >= 0.0 && o->beta2 < 1.0),
               "adamw: invalid betas (%g, %g) (expected each in [0, 1))", o->beta1, o->beta2);
    ch_optimizer_t *s = calloc(1, sizeof *s);
    if (!s) return CH_ERROR(CH_ERR_NOMEM, "optimizer: out of memory");
    s->o = *o;
    if (o->kind == CH_OPTIM_SGD) {
        ch_sgd_options_t so = {o->lr, o->momentum, o->dampening, o->weight_decay, o->nesterov};
        ch_status st = ch_sgd_create(&so, &s->sgd);
        if (st) {
            free(s);
            return st;
        }
        if (o->momentum != 0.0) s->state_names[s->nstate++] = "momentum_buffer";
    } else if (o->kind == CH_OPTIM_ADAMW) {
        s->state_names[s->nstate++] = "exp_avg";
        s->state_names[s->nstate++] = "exp_avg_sq";
        if (o->amsgrad) s->state_names[s->nstate++] = "max_exp_avg_sq";
    } else {
        s->state_names[s->nstate++] = "square_avg";
        if (o->momentum > 0.0) s->state_names[s->nstate++] = "momentum_buffer";
        if (o->centered) s->state_names[s->nstate++] = "grad_avg";
    }
    *out = s;
    return CH_OK;
}

static void free_param(ch_optimizer_t *s, opt_param *p)
{
    for (int j = 0; j < MAX_STATE; j++) {
        if (p->buf[j]) ch_storage_free(s->dev, s->dev_index, p->buf[j]);
        free(p->hbuf[j]);
    }
    free(p->name);
}

void ch_optimizer_destroy(ch_optimizer_t *s)
{
    if (!s) return;
    ch_sgd_destroy(s->sgd);
    for (int i = 0; !s->sgd && i < s->n; i++) free_param(s, &s->p[i]);
    free(s->p);
    free(s->ts);
    free(s);
}

ch_status ch_optimizer_add_param(ch_optimizer_t *s, const char *name, float *data,
                                 const float *grad, size_t numel)
{
    return ch_optimizer_add_param_on(s, name, data, grad, numel, CH_DEV_CPU, 0);
}

ch_status ch_optimizer_add_param_on(ch_optimizer_t *s, const char *name, float *data,
                                    const float *grad, size_t numel, ch_devkind_t dev,
                                    int dev_index)
{
    CH_REQUIRE(s, "ch_optimizer_add_param: NULL optimizer");
    if (s->sgd) {
        CH_TRY(ch_sgd_add_param_on(s->sgd, name, data, grad, numel, dev, dev_index));
        s->n++; /* count only: the names live in the SGD optimizer */
        return CH_OK;
    }
    const char *kn = ch_optimizer_kind_name(s->o.kind);
    CH_REQUIRE(name && data && grad, "%s: add_param: NULL argument (name %s)", kn,
               name ? name : "(null)");
    CH_REQUIRE(dev == CH_DEV_CPU || dev == CH_DEV_CUDA, "%s: unknown device kind %d for '%s'",
               kn, (int)dev, name);
    if (dev == CH_DEV_CPU) dev_index = 0;
    CH_REQUIRE(!s->dev_fixed || (s->dev == dev && s->dev_index == dev_index),
               "%s: parameter '%s' is on %s %d but the optimizer's parameters are on %s %d", kn,
               name, dev == CH_DEV_CPU ? "cpu" : "cuda", dev_index,
               s->dev == CH_DEV_CPU ? "cpu" : "cuda", s->dev_index);
    for (int i = 0; i < s->n; i++)
        CH_REQUIRE(strcmp(s->p[i].name, name) != 0, "%s: parameter '%s' added twice", kn, name);
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 64;
        opt_param *np = realloc(s->p, (size_t)cap * sizeof *np);
        if (!np) return CH_ERROR(CH_ERR_NOMEM, "%s: out of memory adding '%s'", kn, name);
        s->p = np;
        size_t tsz = s->o.kind == CH_OPTIM_ADAMW ? sizeof(ch_adamw_tensor_t)
                                                 : sizeof(ch_rmsprop_tensor_t);
        void *nt = realloc(s->ts, (size_t)cap * tsz);
        if (!nt) return CH_ERROR(CH_ERR_NOMEM, "%s: out of memory adding '%s'", kn, name);
        s->ts = nt;
        s->cap = cap;
    }
    opt_param *p = &s->p[s->n];
    memset(p, 0, sizeof *p);
    s->dev = dev;
    s->dev_index = dev_index;
    s->dev_fixed = 1;
    ch_status st = (p->name = strdup(name)) ? CH_OK : CH_ERROR(CH_ERR_NOMEM, "out of memory");
    if (st == CH_OK && dev == CH_DEV_CUDA) st = ch_device_enable_tensors();
    const size_t bytes = (numel ? numel : 1) * sizeof(float);
    for (int j = 0; j < s->nstate && st == CH_OK; j++) {
        st = ch_storage_alloc(dev, dev_index, bytes, (void **)&p->buf[j]); /* zero-filled */
        if (st == CH_OK && dev == CH_DEV_CUDA && !(p->hbuf[j] = calloc(1, bytes)))
            st = CH_ERROR(CH_ERR_NOMEM, "out of host memory");
    }
    if (st) {
        free_param(s, p);
        return ch_error_context("%s: state of parameter '%s' (%zu floats)", kn, name, numel);
    }
    p->data = data;
    p->grad = grad;
    p->numel = numel;
    s->n++;
    return CH_OK;
}

ch_status ch_optimizer_add_model(ch_optimizer_t *s, ch_model_t *model)
{
    CH_REQUIRE(s && model, "ch_optimizer_add_model: NULL argument");
    int n = ch_model_num_params(model), di = 0;
    ch_devkind_t dev = ch_model_device(model, &di);
    for (int i = 0; i < n; i++) {
        ch_param_t *p = ch_model_param(model, i);
        if (!p->requires_grad) continue;
        CH_TRY(ch_optimizer_add_param_on(s, p->name, (float *)p->dev_data, p->dev_grad,
                                         p->numel, dev, di));
    }
    return CH_OK;
}

void ch_optimizer_set_compute(ch_optimizer_t *s, ch_compute_t *cx)
{
    if (!s) return;
    s->cx = cx;
    if (s->sgd) ch_sgd_set_compute(s->sgd, cx);
}

/* ------------------------------------------------------------------- step */

static ch_status step_adamw(ch_optimizer_t *s)
{
    const ch_optimizer_options_t *o = &s->o;
    const double t = (double)(s->steps + 1);
    /* _single_tensor_adamw's Python floats, then one rounding to float32 */
    const double bc1 = 1.0 - pow(o->beta1, t), bc2 = 1.0 - pow(o->beta2, t);
    const double step_size = o->lr / bc1;
    ch_adamw_hparams_t h = {.decay = (float)(1.0 - o->lr * o->weight_decay),
                            .beta1 = (float)o->beta1,
                            .one_minus_beta1 = (float)(1.0 - o->beta1),
                            .beta2 = (float)o->beta2,
                            .one_minus_beta2 = (float)(1.0 - o->beta2),
                            .bias_correction2_sqrt = (float)sqrt(bc2),
                            .neg_step_size = (float)(-step_size),
                            .eps = (float)o->eps,
                            .amsgrad = o->amsgrad != 0};
    ch_adamw_tensor_t *ts = s->ts;
    for (int k = 0; k < s->n; k++) {
        opt_param *p = &s->p[k];
        ts[k] = (ch_adamw_tensor_t){p->data, p->grad, p->buf[0], p->buf[1],
                                    o->amsgrad ? p->buf[2] : NULL, (int64_t)p->numel};
    }
    return ch_op_adamw_step(s->cx, s->dev, s->dev_index, ts, s->n, &h);
}

static ch_status step_rmsprop(ch_optimizer_t *s)
{
    const ch_optimizer_options_t *o = &s->o;
    ch_rmsprop_hparams_t h = {.neg_lr = (float)(-o->lr),
                              .alpha = (float)o->alpha,
                              .one_minus_alpha = (float)(1.0 - o->alpha),
                              .eps = (float)o->eps,
                              .weight_decay = (float)o->weight_decay,
                              .momentum = (float)o->momentum,
                              .centered = o->centered != 0};
    const int jm = o->momentum > 0.0 ? 1 : -1, jc = o->centered ? (jm > 0 ? 2 : 1) : -1;
    ch_rmsprop_tensor_t *ts = s->ts;
    for (int k = 0; k < s->n; k++) {
        opt_param *p = &s->p[k];
        ts[k] = (ch_rmsprop_tensor_t){p->data, p->grad, p->buf[0], jc > 0 ? p->buf[jc] : NULL,
                                      jm > 0 ? p->buf[jm] : NULL, (int64_t)p->numel};
    }
    return ch_op_rmsprop_step(s->cx, s->dev, s->dev_index, ts, s->n, &h);
}

ch_status ch_optimizer_step(ch_optimizer_t *s)
{
    CH_REQUIRE(s, "ch_optimizer_step: NULL optimizer");
    if (s->sgd) {
        CH_TRY(ch_sgd_step(s->sgd));
        s->steps++;
        return CH_OK;
    }
    const char *kn = ch_optimizer_kind_name(s->o.kind);
    CH_REQUIRE(s->cx || s->dev == CH_DEV_CPU,
               "%s: the parameters are on GPU %d but no compute context was given "
               "(ch_optimizer_set_compute)", kn, s->dev_index);
    ch_status st = s->o.kind == CH_OPTIM_ADAMW ? step_adamw(s) : step_rmsprop(s);
    if (st) return ch_error_context("%s step %lld of %d parameters", kn,
                                    (long long)(s->steps + 1), s->n);
    s->steps++;
    for (int k = 0; k < s->n; k++) s->p[k].has = 1;
    return CH_OK;
}

void ch_optimizer_set_lr(ch_optimizer_t *s, double lr)
{
    s->o.lr = lr;
    if (s->sgd) ch_sgd_set_lr(s->sgd, lr);
}

double ch_optimizer_get_lr(const ch_optimizer_t *s) { return s->o.lr; }
const ch_optimizer_options_t *ch_optimizer_options(const ch_optimizer_t *s) { return &s->o; }
ch_sgd_t *ch_optimizer_sgd(ch_optimizer_t *s) { return s ? s->sgd : NULL; }
int64_t ch_optimizer_steps(const ch_optimizer_t *s) { return s->steps; }

ch_status ch_optimizer_set_steps(ch_optimizer_t *s, int64_t steps)
{
    CH_REQUIRE(s && steps >= 0, "optimizer: step count %lld, expected >= 0", (long long)steps);
    s->steps = steps;
    return CH_OK;
}

/* ------------------------------------------------------------------ state */

int ch_optimizer_num_params(const ch_optimizer_t *s) { return s ? s->n : 0; }

const char *ch_optimizer_param_name(const ch_optimizer_t *s, int i)
{
    if (!s || i < 0 || i >= s->n) return NULL;
    if (s->sgd) {
        const char *name = NULL;
        return ch_sgd_buffer(s->sgd, i, &name, NULL, NULL, NULL) == CH_OK ? name : NULL;
    }
    return s->p[i].name;
}

int ch_optimizer_num_state(const ch_optimizer_t *s) { return s ? s->nstate : 0; }

const char *ch_optimizer_state_name(const ch_optimizer_t *s, int j)
{
    return s && j >= 0 && j < s->nstate ? s->state_names[j] : NULL;
}

ch_status ch_optimizer_state(const ch_optimizer_t *s, int i, int j, const float **buf,
                             size_t *numel, int *has)
{
    CH_REQUIRE(s && i >= 0 && i < s->n && j >= 0 && j < s->nstate,
               "optimizer: state (%d, %d) outside [0, %d) x [0, %d)", i, j, s ? s->n : 0,
               s ? s->nstate : 0);
    if (s->sgd) return ch_sgd_buffer(s->sgd, i, NULL, buf, numel, has);
    const opt_param *p = &s->p[i];
    if (numel) *numel = p->numel;
    if (has) *has = p->has;
    if (!buf) return CH_OK;
    *buf = NULL;
    if (!p->has) return CH_OK;
    if (s->dev == CH_DEV_CPU) {
        *buf = p->buf[j];
        return CH_OK;
    }
    ch_status st = ch_device_memcpy(s->dev_index, p->hbuf[j], p->buf[j],
                                    p->numel * sizeof(float), CH_MEMCPY_DEVICE_TO_HOST);
    if (st) return ch_error_context("optimizer: reading %s of '%s' from GPU %d",
                                    s->state_names[j], p->name, s->dev_index);
    *buf = p->hbuf[j];
    return CH_OK;
}

ch_status ch_optimizer_load_state(ch_optimizer_t *s, const char *param_name,
                                  const char *state_name, const float *data, size_t numel)
{
    CH_REQUIRE(s && param_name && state_name && data, "ch_optimizer_load_state: NULL argument");
    const char *kn = ch_optimizer_kind_name(s->o.kind);
    int j = 0;
    while (j < s->nstate && strcmp(s->state_names[j], state_name) != 0) j++;
    CH_REQUIRE(j < s->nstate, "%s: state '%s' for '%s' given but this configuration keeps no "
               "such state", kn, state_name, param_name);
    if (s->sgd) return ch_sgd_load_buffer(s->sgd, param_name, data, numel);
    for (int i = 0; i < s->n; i++) {
        opt_param *p = &s->p[i];
        if (strcmp(p->name, param_name) != 0) continue;
        CH_REQUIRE(p->numel == numel, "%s: %s of '%s' has %zu elements, expected %zu", kn,
                   state_name, param_name, numel, p->numel);
        if (s->dev == CH_DEV_CPU) {
            memcpy(p->buf[j], data, numel * sizeof(float));
        } else {
            ch_status st = ch_device_memcpy(s->dev_index, p->buf[j], data, numel * sizeof(float),
                                            CH_MEMCPY_HOST_TO_DEVICE);
            if (st) return ch_error_context("%s: %s of '%s' to GPU %d", kn, state_name,
                                            param_name, s->dev_index);
        }
        p->has = 1;
        return CH_OK;
    }
    return CH_ERROR(CH_ERR_INVALID, "%s: no parameter named '%s' in the optimizer", kn,
                    param_name);
}

ch_status ch_optimizer_reset(ch_optimizer_t *s)
{
    CH_REQUIRE(s, "ch_optimizer_reset: NULL optimizer");
    s->steps = 0;
    if (s->sgd) {
        ch_sgd_reset(s->sgd);
        return CH_OK;
    }
    for (int i = 0; i < s->n; i++) {
        opt_param *p = &s->p[i];
        p->has = 0;
        for (int j = 0; j < s->nstate; j++) {
            const size_t bytes = p->numel * sizeof(float);
            if (s->dev == CH_DEV_CPU) memset(p->buf[j], 0, bytes);
            else CH_TRY(ch_device_memzero(s->dev_index, p->buf[j], bytes));
        }
    }
    return CH_OK;
}
