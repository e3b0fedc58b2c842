/* cohort: a model and its SGD state to and from safetensors files. */
#define _GNU_SOURCE /* asprintf */
#include "config.h"

#include "io/state/train_state.h"

#include "framework/core/log.h"
#include "io/state/checkpoint.h"
#include "io/formats/pth.h"
#include "io/formats/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Prefix of the optimizer state a resume file holds besides the state dict. */
#define OPTIM_PREFIX "optim."

/* ------------------------------------------------------------ output.* keys */

static const ch_config_key_t ch_train_output_config_keys[] = {
    {"output.dir", CH_CFG_STRING, "runs/fashion-mnist", CH_CFG_NO_RANGE,
     "Directory for checkpoints, the resume file, TensorBoard events and the CSV log "
     "(created by rank 0)."},
    {"output.save_every", CH_CFG_INT, "1", 0, 1e6,
     "Write model-<epoch>.safetensors every N epochs (0: only at the end)."},
    {"output.resume", CH_CFG_STRING, "", CH_CFG_NO_RANGE,
     "Resume file to continue from; 'auto' = <output.dir>/resume.safetensors when present.",
     "--resume", "auto"},
    {"output.format", CH_CFG_STRING, "safetensors", CH_CFG_NO_RANGE,
     "Format of the model files: 'safetensors' (model-<epoch>.safetensors) or 'pth' "
     "(model-<epoch>.pth, a zip .pth that torch.load(path, weights_only=True) reads). The "
     "resume file is always safetensors."},
    {"output.resume_allow", CH_CFG_STRLIST, "", CH_CFG_NO_RANGE,
     "Keys that may differ from the resumed run's saved configuration (intended changes, "
     "e.g. optimizer.lr); any other key that changes the result must match.",
     "--resume-allow"},
};

ch_config_table_t ch_train_output_config_table(void)
{
    ch_config_table_t t = {"output", ch_train_output_config_keys, (int)(sizeof ch_train_output_config_keys / sizeof ch_train_output_config_keys[0])};
    return t;
}

ch_status ch_train_output_options_from_config(const ch_config_t *cfg,
                                              ch_train_output_options_t *o)
{
    CH_TRY(ch_config_get_string(cfg, "output.dir", &o->dir));
    CH_TRY(ch_config_get_int(cfg, "output.save_every", &o->save_every));
    static const char *const formats[] = {"safetensors", "pth"};
    int which;
    CH_TRY(ch_config_get_choice(cfg, "output.format", formats, 2, &which));
    o->format = formats[which];
    return ch_config_get_string(cfg, "output.resume", &o->resume);
}

static ch_status path_in(char *buf, size_t len, const char *dir, const char *name, int epoch,
                         const char *ext)
{
    int n = epoch >= 0 ? snprintf(buf, len, "%s/%s-%d.%s", dir, name, epoch, ext)
                       : snprintf(buf, len, "%s/%s.%s", dir, name, ext);
    if (n < 0 || (size_t)n >= len)
        return CH_ERROR(CH_ERR_RANGE, "output.dir: path '%s/%s...' is longer than %zu bytes", dir,
                        name, len - 1);
    return CH_OK;
}

ch_status ch_train_output_resume_path(const ch_train_output_options_t *o, char *buf, size_t len)
{
    return path_in(buf, len, o->dir, "resume", -1, "safetensors");
}

ch_status ch_train_output_model_path(const ch_train_output_options_t *o, int epoch, char *buf,
                                     size_t len)
{
    return path_in(buf, len, o->dir, "model", epoch,
                   o->format && !strcmp(o->format, "pth") ? "pth" : "safetensors");
}

int ch_train_output_saves_model(const ch_train_output_options_t *o, int epoch, int epochs)
{
    return epoch + 1 == epochs || (o->save_every > 0 && (epoch + 1) % o->save_every == 0);
}

ch_status ch_train_output_resume_source(const ch_train_output_options_t *o, char *buf,
                                        size_t len, const char **path)
{
    *path = NULL;
    if (!o->resume[0]) return CH_OK;
    if (strcmp(o->resume, "auto")) {
        if (access(o->resume, R_OK))
            return CH_ERROR(CH_ERR_IO, "output.resume: '%s' not found", o->resume);
        *path = o->resume;
        return CH_OK;
    }
    CH_TRY(ch_train_output_resume_path(o, buf, len));
    if (access(buf, R_OK) == 0) *path = buf;
    return CH_OK;
}

/* ------------------------------------------------------------ state dict views */

static ch_st_dtype_t st_dtype(ch_dtype_t t) { return t == CH_I64 ? CH_ST_I64 : CH_ST_F32; }

static void view_of(const ch_param_t *e, const char *name, ch_st_view_t *v)
{
    v->name = name;
    v->dtype = st_dtype(e->dtype);
    v->ndim = e->ndim;
    for (int d = 0; d < e->ndim; d++) v->shape[d] = e->shape[d];
    v->data = e->data;
    v->nbytes = e->numel * ch_dtype_size(e->dtype);
}

/* The model's state dict as safetensors views (host storage), in
 * state-dict order. *views is malloc'd. */
static ch_status model_views(ch_model_t *m, ch_st_view_t **views, int *n)
{
    CH_TRY(ch_model_sync_to_host(m));
    *n = ch_model_num_entries(m);
    *views = calloc((size_t)*n + 1, sizeof **views);
    if (!*views) return CH_ERROR(CH_ERR_NOMEM, "state dict of %d entries", *n);
    for (int i = 0; i < *n; i++) {
        const ch_param_t *e = ch_model_entry(m, i);
        view_of(e, e->name, &(*views)[i]);
    }
    return CH_OK;
}

/* The modules under m in torch.nn.Module.state_dict()'s visiting order
 * (pre-order, parameterless ones included) with their classes' _version
 * (BatchNorm 2, the rest 1), appended to list[*n..); count only when list
 * is NULL. */
static void module_versions(ch_module_t *m, ch_pth_module_t *list, size_t *n)
{
    const ch_nn_kind_t k = ch_module_kind(m);
    /* a graph named "" under the root is not a module of torch's: its nodes
     * are the root's children there (nn.h, DAG graphs) */
    const int unnamed_graph = k == CH_NN_GRAPH && !ch_module_path(m)[0] && ch_module_parent(m);
    if (list && !unnamed_graph) {
        list[*n].prefix = ch_module_path(m);
        list[*n].version = k == CH_NN_BATCHNORM2D || k == CH_NN_SYNC_BATCHNORM ? 2 : 1;
    }
    if (!unnamed_graph) (*n)++;
    for (int i = 0; i < ch_module_num_children(m); i++)
        module_versions(ch_module_child_at(m, i), list, n);
}

ch_status ch_train_state_write_model(ch_model_t *model, const char *path)
{
    ch_st_view_t *views = NULL;
    int n = 0;
    ch_status s = model_views(model, &views, &n);
    size_t pl = strlen(path);
    int pth = (pl > 4 && !strcmp(path + pl - 4, ".pth")) || (pl > 3 && !strcmp(path + pl - 3, ".pt"));
    if (s == CH_OK && pth) {
        /* _metadata as torch writes it: every module, ReLU and MaxPool too */
        size_t nm = 0;
        module_versions(ch_model_root(model), NULL, &nm);
        ch_pth_module_t *mods = calloc(nm, sizeof *mods);
        if (!mods) s = CH_ERROR(CH_ERR_NOMEM, "%s: %zu modules", path, nm);
        nm = 0;
        if (!s) module_versions(ch_model_root(model), mods, &nm);
        if (!s) s = ch_pth_write_modules(path, views, (size_t)n, mods, nm);
        free(mods);
    } else if (s == CH_OK) {
        s = ch_checkpoint_write_model(path, views, (size_t)n);
    }
    free(views);
    return s;
}

/* ------------------------------------------------------------ resume files */

/* The resume file of model with optimizer tensors: mom[0..nmom) momentum
 * buffers (named by parameter), more[0..nmore) further state tensors (full
 * names), meta[0..nmeta) further metadata. */
static ch_status write_resume_with(ch_model_t *model, const char *path,
                                   const ch_train_progress_t *p, const char *config_text,
                                   const ch_st_view_t *mom, size_t nmom, const ch_st_view_t *more,
                                   size_t nmore, const ch_st_meta_t *meta, size_t nmeta)
{
    CH_REQUIRE(p->epoch_step == 0 || (p->epoch_step > 0 && p->epoch_step < p->epoch_steps),
               "%s: step %" PRId64 " is not inside an epoch of %" PRId64 " steps", path,
               p->epoch_step, p->epoch_steps);
    ch_st_view_t *state = NULL;
    int n = 0;
    ch_status s = model_views(model, &state, &n);
    if (s == CH_OK && nmore) {
        ch_st_view_t *all = realloc(state, ((size_t)n + nmore + 1) * sizeof *all);
        if (!all) s = CH_ERROR(CH_ERR_NOMEM, "%s: optimizer state", path);
        else {
            state = all;
            memcpy(state + n, more, nmore * sizeof *more);
            n += (int)nmore;
        }
    }
    if (s == CH_OK) {
        char v[4][32];
        snprintf(v[0], sizeof v[0], "%.17g", p->epoch_loss_sum);
        snprintf(v[1], sizeof v[1], "%" PRId64, p->epoch_loss_steps);
        snprintf(v[2], sizeof v[2], "%" PRId64, p->epoch_step);
        snprintf(v[3], sizeof v[3], "%" PRId64, p->epoch_steps);
        ch_st_meta_t extra[8] = {{"epoch_loss_sum", v[0]}, {"epoch_loss_steps", v[1]},
                                 {"epoch_step", v[2]}, {"epoch_steps", v[3]}};
        size_t nextra = 4;
        for (size_t i = 0; i < nmeta && nextra < 8; i++) extra[nextra++] = meta[i];
        ch_resume_info_t info = {.epoch = p->epoch,
                                 .global_step = p->global_step,
                                 .sampler_seed = p->seed,
                                 .sampler_epoch = p->epoch,
                                 .world_size = p->world_size,
                                 .rng_state = "augmentation streams keyed by (seed, epoch, index)",
                                 .config = config_text};
        s = ch_checkpoint_write_resume(path, state, (size_t)n, mom, nmom, &info, extra, nextra);
    }
    free(state);
    return s;
}

ch_status ch_train_state_write_resume(ch_model_t *model, const ch_sgd_t *sgd, const char *path,
                                      const ch_train_progress_t *p, const char *config_text)
{
    CH_REQUIRE(model && sgd && path && p && config_text, "ch_train_state_write_resume: NULL argument");
    ch_st_view_t *mom = NULL;
    size_t nmom = 0;
    ch_status s = CH_OK;
    int np = ch_sgd_num_params(sgd);
    mom = calloc((size_t)np + 1, sizeof *mom);
    if (!mom) s = CH_ERROR(CH_ERR_NOMEM, "%s: momentum buffers", path);
    for (int i = 0; s == CH_OK && i < np; i++) {
        const char *name;
        const float *buf;
        size_t numel;
        int has;
        s = ch_sgd_buffer(sgd, i, &name, &buf, &numel, &has);
        const ch_param_t *e = s == CH_OK ? ch_model_find(model, name) : NULL;
        if (s != CH_OK || !has || !e) continue;
        /* named by the parameter; the writer adds "optim.momentum_buffer." */
        view_of(e, e->name, &mom[nmom]);
        mom[nmom].data = buf;
        mom[nmom].nbytes = numel * sizeof(float);
        nmom++;
    }
    if (s == CH_OK)
        s = write_resume_with(model, path, p, config_text, mom, nmom, NULL, 0, NULL, 0);
    free(mom);
    return s;
}

/* Optional integer metadata: *out = dflt when absent; CH_ERR_FORMAT when
 * present but not an integer >= lo. */
static ch_status meta_int(const ch_safetensors_t *st, const char *path, const char *key,
                          int64_t lo, int64_t dflt, int64_t *out)
{
    const char *v = ch_safetensors_meta_get(st, key);
    *out = dflt;
    if (!v) return CH_OK;
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || end == v || *end || x < lo)
        return CH_ERROR(CH_ERR_FORMAT, "%s: metadata %s = '%s' is not an integer >= %lld", path,
                        key, v, (long long)lo);
    *out = x;
    return CH_OK;
}

ch_status ch_train_state_read_resume(ch_model_t *model, ch_sgd_t *sgd, const char *path,
                                     ch_train_progress_t *p)
{
    CH_REQUIRE(model && path && p, "ch_train_state_read_resume: NULL argument");
    ch_safetensors_t *st = NULL;
    ch_resume_info_t info;
    CH_TRY(ch_checkpoint_read_resume(path, &st, &info));
    ch_status s = CH_OK;
    memset(p, 0, sizeof *p);
    p->epoch = (int)info.epoch;
    p->global_step = info.global_step;
    p->seed = info.sampler_seed;
    p->world_size = info.world_size;
    if (info.epoch > INT32_MAX)
        s = CH_ERROR(CH_ERR_FORMAT, "%s: epoch %" PRId64 " is out of range", path, info.epoch);
    if (s == CH_OK) s = meta_int(st, path, "epoch_step", 0, -1, &p->epoch_step);
    if (s == CH_OK) s = meta_int(st, path, "epoch_steps", 1, -1, &p->epoch_steps);
    if (s == CH_OK) s = meta_int(st, path, "epoch_loss_steps", 0, 0, &p->epoch_loss_steps);
    const char *lsum = ch_safetensors_meta_get(st, "epoch_loss_sum");
    if (s == CH_OK && lsum) {
        char *end;
        p->epoch_loss_sum = strtod(lsum, &end);
        if (end == lsum || *end)
            s = CH_ERROR(CH_ERR_FORMAT, "%s: metadata epoch_loss_sum = '%s' is not a number", path,
                         lsum);
    }
    int ne = ch_model_num_entries(model);
    for (int i = 0; i < ne && s == CH_OK; i++) {
        ch_param_t *e = ch_model_entry(model, i);
        s = ch_safetensors_read_into(st, e->name, st_dtype(e->dtype), e->ndim, e->shape, e->data,
                                     e->numel * ch_dtype_size(e->dtype));
    }
    ch_tensor_data_changed(); /* the parameters were written (framework/tensor/tensor.h) */
    int np = sgd ? ch_model_num_params(model) : 0;
    for (int i = 0; i < np && s == CH_OK; i++) {
        const ch_param_t *e = ch_model_param(model, i);
        const ch_st_view_t *m = ch_checkpoint_momentum(st, e->name);
        if (!m) continue;
        float *tmp = malloc(m->nbytes ? m->nbytes : 1);
        if (!tmp) {
            s = CH_ERROR(CH_ERR_NOMEM, "%s: momentum of %s", path, e->name);
            break;
        }
        memcpy(tmp, m->data, m->nbytes); /* file data need not be aligned */
        s = ch_sgd_load_buffer(sgd, e->name, tmp, m->nbytes / sizeof(float));
        free(tmp);
        if (s) ch_error_context("%s", path);
    }
    ch_safetensors_destroy(st);
    if (s == CH_OK) s = ch_model_sync_to_device(model);
    return s;
}

ch_status ch_train_resume_check(const char *path, const ch_train_progress_t *saved,
                                int world_size, int64_t steps_per_epoch, uint64_t seed,
                                int64_t *start_step)
{
    CH_REQUIRE(path && saved && start_step && steps_per_epoch > 0 && world_size > 0,
               "ch_train_resume_check: bad argument");
    if (saved->seed != seed)
        return CH_ERROR(CH_ERR_INVALID, "%s used train.seed %" PRIu64 " but this run has %" PRIu64,
                        path, saved->seed, seed);
    int64_t step = saved->epoch_step;
    if (step < 0) {
        /* written before epoch_step was stored */
        if (saved->world_size != world_size)
            return CH_ERROR(CH_ERR_INVALID, "%s was written by %d rank%s by an older cohort that "
                            "did not store the step within the epoch; resume it with %d rank%s",
                            path, saved->world_size, saved->world_size == 1 ? "" : "s",
                            saved->world_size, saved->world_size == 1 ? "" : "s");
        step = saved->global_step - (int64_t)saved->epoch * steps_per_epoch;
        if (step < 0 || step >= steps_per_epoch)
            return CH_ERROR(CH_ERR_FORMAT, "%s: global step %" PRId64 " does not fall in epoch %d "
                            "with %" PRId64 " steps per epoch (batch size or data changed?)", path,
                            saved->global_step, saved->epoch, steps_per_epoch);
    } else if (step > 0) {
        if (saved->world_size != world_size)
            return CH_ERROR(CH_ERR_INVALID, "%s was written mid-epoch (epoch %d, step %" PRId64
                            ") by %d rank%s; resuming it with %d rank%s would change the rest of "
                            "the epoch's data order (use %d rank%s, or resume from a file written "
                            "at an epoch boundary)", path, saved->epoch, step, saved->world_size,
                            saved->world_size == 1 ? "" : "s", world_size,
                            world_size == 1 ? "" : "s", saved->world_size,
                            saved->world_size == 1 ? "" : "s");
        if ((saved->epoch_steps > 0 && saved->epoch_steps != steps_per_epoch) ||
            step >= steps_per_epoch)
            return CH_ERROR(CH_ERR_INVALID, "%s was written mid-epoch (epoch %d, step %" PRId64
                            ") with %" PRId64 " steps per epoch, this run has %" PRId64
                            " (batch size or data changed?)", path, saved->epoch, step,
                            saved->epoch_steps, steps_per_epoch);
    }
    *start_step = step;
    return CH_OK;
}

/* ------------------------------------------------------------ pretrained */

void ch_pretrained_options_default(ch_pretrained_options_t *o)
{
    o->reshape = 0;
    o->min_fraction = 0.5;
    o->weights_key = NULL;
}

/* A weights file of either format, chosen by content (io/formats/pth.h). */
typedef struct {
    ch_safetensors_t *st;
    ch_pth_t *pth;
} weights_t;

static ch_status weights_open(weights_t *w, const char *path, const char *key)
{
    unsigned char head[16] = {0};
    ssize_t got = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        got = pread(fd, head, sizeof head, 0);
        close(fd);
    }
    ch_pth_kind_t kind = ch_pth_detect(head, got > 0 ? (size_t)got : 0);
    w->st = NULL;
    w->pth = NULL;
    if (kind == CH_PTH_NOT) {
        if (key && key[0])
            ch_log_info("pretrained weights: %s is a safetensors file: model.weights_key '%s' "
                        "is not used", path, key);
        /* a safetensors file is an 8-byte header length, then its JSON
         * header ('{'); anything else is neither format */
        if (fd >= 0 && got >= 9 && head[8] != '{')
            return CH_ERROR(CH_ERR_FORMAT, "%s: neither a safetensors file nor a PyTorch "
                            "torch.save file (.pth/.pt, zip or legacy): it starts with bytes "
                            "%02x %02x %02x %02x", path, head[0], head[1], head[2], head[3]);
        return ch_safetensors_open(path, &w->st);
    }
    CH_TRY(ch_pth_open(path, key, &w->pth));
    const char *sk = ch_pth_state_key(w->pth);
    ch_log_info("pretrained weights: %s is a PyTorch %s .pth file; state dict %s%s%s", path,
                kind == CH_PTH_ZIP ? "zip" : "legacy", sk[0] ? "under '" : "at the top level",
                sk, sk[0] ? "' of the checkpoint dict" : "");
    return CH_OK;
}

static size_t weights_count(const weights_t *w)
{
    return w->pth ? ch_pth_count(w->pth) : ch_safetensors_count(w->st);
}

static const ch_st_view_t *weights_at(const weights_t *w, size_t i)
{
    return w->pth ? ch_pth_at(w->pth, i) : ch_safetensors_at(w->st, i);
}

static const ch_st_view_t *weights_find(const weights_t *w, const char *name)
{
    return w->pth ? ch_pth_find(w->pth, name) : ch_safetensors_find(w->st, name);
}

static void shape_text(char *buf, size_t len, int ndim, const int64_t *shape)
{
    size_t k = (size_t)snprintf(buf, len, "[");
    for (int d = 0; d < ndim && k < len; d++)
        k += (size_t)snprintf(buf + k, len - k, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (k + 1 < len) {
        buf[k] = ']';
        buf[k + 1] = 0;
    }
}

/* One summary line per skip reason: the count and the first few names. */
enum { SKIP_NOT_IN_MODEL, SKIP_OTHER_SHAPE, SKIP_OPTIMIZER, SKIP_N };
#define SKIP_EXAMPLES 3

typedef struct {
    int count[SKIP_N];
    char examples[SKIP_N][512];
} skip_summary_t;

static void skip_add(skip_summary_t *sk, int why, const char *text)
{
    char *ex = sk->examples[why];
    size_t k = strlen(ex);
    if (sk->count[why]++ < SKIP_EXAMPLES && k < sizeof sk->examples[why])
        snprintf(ex + k, sizeof sk->examples[why] - k, "%s%s", k ? "; " : "", text);
}

static void skip_report(const skip_summary_t *sk, const char *path)
{
    static const char *const what[SKIP_N] = {
        "not in the model", "with another shape or dtype than the model's",
        "of optimizer state (a resume file's momentum buffers)"};
    for (int w = 0; w < SKIP_N; w++) {
        int n = sk->count[w];
        if (!n) continue;
        int more = n > SKIP_EXAMPLES ? n - SKIP_EXAMPLES : 0;
        char tail[48] = "";
        if (more) snprintf(tail, sizeof tail, "; and %d more", more);
        ch_log_info("pretrained weights: skipped %d tensor%s of %s %s: %s%s", n, n == 1 ? "" : "s",
                    path, what[w], sk->examples[w], tail);
    }
}

ch_status ch_train_state_load_pretrained(ch_model_t *model, const char *path,
                                         const ch_pretrained_options_t *o,
                                         ch_pretrained_report_t *rep)
{
    CH_REQUIRE(model && path, "ch_train_state_load_pretrained: NULL argument");
    ch_pretrained_options_t dflt;
    if (!o) {
        ch_pretrained_options_default(&dflt);
        o = &dflt;
    }
    ch_pretrained_report_t r;
    memset(&r, 0, sizeof r);
    weights_t st;
    ch_status s = weights_open(&st, path, o->weights_key);
    if (s) return ch_error_context("model.weights");
    size_t n = weights_count(&st);
    r.n_tensors = (int)n;
    const size_t plen = strlen("module.");
    r.prefix_stripped = n > 0;
    for (size_t i = 0; i < n && r.prefix_stripped; i++)
        r.prefix_stripped = !strncmp(weights_at(&st, i)->name, "module.", plen);
    ch_nn_view_t *views = calloc(n + 1, sizeof *views);
    skip_summary_t *sk = calloc(1, sizeof *sk);
    if (!views || !sk) {
        s = CH_ERROR(CH_ERR_NOMEM, "pretrained weights %s", path);
        goto done;
    }
    int nv = 0;
    for (size_t i = 0; i < n; i++) {
        const ch_st_view_t *t = weights_at(&st, i);
        const char *name = t->name + (r.prefix_stripped ? plen : 0);
        const ch_param_t *e = ch_model_find(model, name);
        char text[256], a[96], b[96];
        if (!e) {
            /* SGD momentum buffers and the optim.<state>.<param> tensors of other optimizers */
            int opt = ch_checkpoint_is_momentum(name) ||
                      !strncmp(name, OPTIM_PREFIX, strlen(OPTIM_PREFIX));
            skip_add(sk, opt ? SKIP_OPTIMIZER : SKIP_NOT_IN_MODEL, name);
            if (opt) r.optimizer_state++;
            else r.not_in_model++;
            continue;
        }
        size_t numel = 1;
        int same_shape = t->ndim == e->ndim;
        for (int d = 0; d < t->ndim; d++) {
            numel *= (size_t)t->shape[d];
            if (same_shape && t->shape[d] != e->shape[d]) same_shape = 0;
        }
        int same_dtype = t->dtype == st_dtype(e->dtype);
        int reshaped = !same_shape && o->reshape && numel == e->numel;
        /* "[16, 1, 3, 3]", with a leading space when a dtype precedes it */
        a[0] = b[0] = ' ';
        shape_text(a + !same_dtype, sizeof a - 1, t->ndim, t->shape);
        shape_text(b + !same_dtype, sizeof b - 1, e->ndim, e->shape);
        if (!same_dtype || (!same_shape && !reshaped)) {
            int w = snprintf(text, sizeof text, "%s %s%s vs model %s%s%s", name,
                             same_dtype ? "" : ch_st_dtype_name(t->dtype), a,
                             same_dtype ? "" : ch_st_dtype_name(st_dtype(e->dtype)), b,
                             same_dtype && numel == e->numel ? " (same element count: "
                                                               "model.weights_reshape loads it)" : "");
            if (w >= (int)sizeof text) text[sizeof text - 2] = '~'; /* cut: mark it */
            skip_add(sk, SKIP_OTHER_SHAPE, text);
            r.other_shape++;
            continue;
        }
        if (reshaped) {
            r.reshaped++;
            if (ch_log_rank() == 0)
                ch_log_warn_rank0("pretrained weights: %s of %s has shape %s, the model's is %s: loaded "
                            "by element count (model.weights_reshape)", name, path, a, b);
        }
        /* the file's bytes are copied by ch_model_load_state_dict (memcpy:
         * no alignment needed) */
        ch_nn_view_t *v = &views[nv++];
        v->name = e->name;
        v->dtype = e->dtype;
        v->ndim = e->ndim;
        memcpy(v->shape, e->shape, sizeof v->shape);
        v->numel = e->numel;
        v->data = (void *)t->data;
    }
    int ne = ch_model_num_entries(model);
    /* model entries the file does not name at all keep their values (as
     * load_state_dict(strict=False) reports them in missing_keys) */
    skip_summary_t missing;
    memset(&missing, 0, sizeof missing);
    for (int i = 0; i < ne; i++) {
        const char *name = ch_model_entry(model, i)->name;
        char full[512];
        snprintf(full, sizeof full, "%s%s", r.prefix_stripped ? "module." : "", name);
        if (!weights_find(&st, full)) skip_add(&missing, 0, name);
    }
    r.not_in_file = missing.count[0];
    /* ch_log_info prints on rank 0 only */
    if (r.prefix_stripped)
        ch_log_info("pretrained weights: every name in %s starts with 'module.' (saved from a "
                    "DistributedDataParallel model): removed that prefix", path);
    skip_report(sk, path);
    if (r.not_in_file) {
        int more = r.not_in_file > SKIP_EXAMPLES ? r.not_in_file - SKIP_EXAMPLES : 0;
        char tail[48] = "";
        if (more) snprintf(tail, sizeof tail, "; and %d more", more);
        ch_log_warn_rank0("pretrained weights: %d model tensor%s not in %s, left at %s initial "
                    "value%s: %s%s", r.not_in_file, r.not_in_file == 1 ? " is" : "s are", path,
                    r.not_in_file == 1 ? "its" : "their", r.not_in_file == 1 ? "" : "s",
                    missing.examples[0], tail);
    }
    if ((double)nv < o->min_fraction * (double)ne) {
        s = CH_ERROR(CH_ERR_FORMAT, "model.weights: %s matches only %d of the %d tensors of %s "
                     "(name, dtype and %s): no tensor matching most of the model; is it a state "
                     "dict of this architecture?", path, nv, ne, ch_model_arch(model),
                     o->reshape ? "element count" : "shape");
        goto done;
    }
    s = ch_model_load_state_dict(model, views, nv, 0, NULL, NULL, &r.loaded);
    if (s == CH_OK) s = ch_model_sync_to_device(model);
    if (s == CH_OK)
        ch_log_info("pretrained weights: loaded %d of %zu tensors from %s%s", r.loaded, n, path,
                    r.reshaped ? " (some reshaped: see the warnings)" : "");
done:
    free(sk);
    free(views);
    ch_safetensors_destroy(st.st);
    ch_pth_destroy(st.pth);
    if (rep) *rep = r;
    return s;
}

/* ------------------------------------------------------------ resume config */

ch_status ch_train_state_read_config(const char *path, char **config)
{
    CH_REQUIRE(path && config, "ch_train_state_read_config: NULL argument");
    *config = NULL;
    ch_safetensors_t *st = NULL;
    ch_resume_info_t info;
    CH_TRY(ch_checkpoint_read_resume(path, &st, &info));
    *config = strdup(info.config);
    ch_safetensors_destroy(st);
    return *config ? CH_OK : CH_ERROR(CH_ERR_NOMEM, "%s: out of memory", path);
}

static int in_list(const char *name, const char *const *list, int n)
{
    for (int i = 0; i < n; i++) {
        size_t l = strlen(list[i]);
        /* "group." names every key of the group */
        if (l && list[i][l - 1] == '.' ? !strncmp(name, list[i], l) : !strcmp(name, list[i]))
            return 1;
    }
    return 0;
}

/* Append "name saved X, now Y" (or "name: not saved, now Y") to a
 * growing malloc'd list; returns 0 out of memory. */
static int append_change(char **list, size_t *len, const ch_config_change_t *c)
{
    char *item = NULL;
    int n = c->saved ? asprintf(&item, "%s%s (saved %s, now %s)", *len ? ", " : "", c->name,
                                c->saved, c->now)
                     : asprintf(&item, "%s%s (not in the saved configuration, now %s)",
                                *len ? ", " : "", c->name, c->now);
    if (n < 0) return 0;
    char *grown = realloc(*list, *len + (size_t)n + 1);
    if (!grown) {
        free(item);
        return 0;
    }
    memcpy(grown + *len, item, (size_t)n + 1);
    *list = grown;
    *len += (size_t)n;
    free(item);
    return 1;
}

ch_status ch_train_resume_config_check(const char *path, const char *saved_config,
                                       const ch_config_t *cfg, const char *const *free_keys,
                                       int n_free)
{
    CH_REQUIRE(path && saved_config && cfg && (free_keys || n_free == 0),
               "ch_train_resume_config_check: NULL argument");
    const char *const *allow = NULL;
    int n_allow = 0;
    CH_TRY(ch_config_get_strlist(cfg, "output.resume_allow", &allow, &n_allow));
    for (int i = 0; i < n_allow; i++) {
        size_t l = strlen(allow[i]);
        if (l && allow[i][l - 1] == '.') continue; /* a group: checked below by use */
        if (!ch_config_source(cfg, allow[i]))
            return CH_ERROR(CH_ERR_CONFIG, "output.resume_allow: '%s' is not a configuration key",
                            allow[i]);
    }
    if (!*saved_config) {
        ch_log_warn_rank0("resume: %s holds no saved configuration (an older cohort wrote it): "
                    "the configuration is not compared", path);
        return CH_OK;
    }
    ch_config_change_t *ch = NULL;
    int n = 0;
    ch_status s = ch_config_compare_dump(cfg, saved_config, &ch, &n);
    if (s) {
        ch_error_context("%s", path);
        return s;
    }
    char *refused = NULL, *allowed = NULL, *other = NULL;
    size_t lr = 0, la = 0, lo = 0;
    int ok = 1;
    for (int i = 0; i < n && ok; i++) {
        if (in_list(ch[i].name, free_keys, n_free)) ok = append_change(&other, &lo, &ch[i]);
        else if (in_list(ch[i].name, allow, n_allow)) ok = append_change(&allowed, &la, &ch[i]);
        else ok = append_change(&refused, &lr, &ch[i]);
    }
    if (!ok) {
        s = CH_ERROR(CH_ERR_NOMEM, "%s: out of memory comparing configurations", path);
    } else if (refused) {
        s = CH_ERROR(CH_ERR_INVALID,
                     "%s: this run's configuration differs from the saved one in keys that "
                     "change the result: %s; start in another output.dir, or, if the change is "
                     "intended, list the keys in output.resume_allow (--resume-allow KEY,...)",
                     path, refused);
    } else {
        if (allowed)
            ch_log_info("resume: %s: changed as output.resume_allow permits: %s", path, allowed);
        if (other) ch_log_info("resume: %s: changed (does not change the result): %s", path, other);
    }
    free(refused);
    free(allowed);
    free(other);
    ch_config_changes_free(ch, n);
    return s;
}

/* ------------------------------------------- resume files, any optimizer */

ch_status ch_train_state_write_resume_optimizer(ch_model_t *model, const ch_optimizer_t *opt,
                                                const char *path, const ch_train_progress_t *p,
                                                const char *config_text)
{
    CH_REQUIRE(model && opt && path && p && config_text,
               "ch_train_state_write_resume_optimizer: NULL argument");
    const ch_optimizer_options_t *o = ch_optimizer_options(opt);
    if (o->kind == CH_OPTIM_SGD) /* today's file, byte for byte */
        return ch_train_state_write_resume(model, ch_optimizer_sgd((ch_optimizer_t *)opt), path,
                                           p, config_text);
    const int np = ch_optimizer_num_params(opt), ns = ch_optimizer_num_state(opt);
    const size_t cap = (size_t)np * (size_t)ns + 1;
    ch_st_view_t *mom = calloc(cap, sizeof *mom), *more = calloc(cap, sizeof *more);
    char **names = calloc(cap, sizeof *names);
    size_t nmom = 0, nmore = 0;
    ch_status s = mom && more && names ? CH_OK : CH_ERROR(CH_ERR_NOMEM, "%s: optimizer state", path);
    for (int i = 0; s == CH_OK && i < np; i++) {
        const ch_param_t *e = ch_model_find(model, ch_optimizer_param_name(opt, i));
        for (int j = 0; s == CH_OK && j < ns; j++) {
            const float *buf;
            size_t numel;
            int has;
            s = ch_optimizer_state(opt, i, j, &buf, &numel, &has);
            if (s != CH_OK || !has || !e) continue;
            const char *sn = ch_optimizer_state_name(opt, j);
            ch_st_view_t *v;
            if (!strcmp(sn, "momentum_buffer")) {
                v = &mom[nmom++]; /* "optim.momentum_buffer.<param>", as SGD's */
                view_of(e, e->name, v);
            } else {
                char **nm = &names[nmore];
                if (asprintf(nm, OPTIM_PREFIX "%s.%s", sn, e->name) < 0) {
                    *nm = NULL;
                    s = CH_ERROR(CH_ERR_NOMEM, "%s: optimizer state", path);
                    break;
                }
                v = &more[nmore++];
                view_of(e, *nm, v);
            }
            v->data = buf;
            v->nbytes = numel * sizeof(float);
        }
    }
    if (s == CH_OK) {
        char step[32];
        snprintf(step, sizeof step, "%" PRId64, ch_optimizer_steps(opt));
        ch_st_meta_t meta[2] = {{OPTIM_PREFIX "name", ch_optimizer_kind_name(o->kind)},
                                {OPTIM_PREFIX "step", step}};
        s = write_resume_with(model, path, p, config_text, mom, nmom, more, nmore, meta, 2);
    }
    for (size_t k = 0; names && k < nmore; k++) free(names[k]);
    free(names);
    free(more);
    free(mom);
    return s;
}

/* Optimizer state of opt (adamw / rmsprop) from the open resume file st. */
static ch_status read_optimizer_state(const ch_safetensors_t *st, const char *path,
                                      ch_optimizer_t *opt)
{
    const char *kn = ch_optimizer_kind_name(ch_optimizer_options(opt)->kind);
    const char *fk = ch_safetensors_meta_get(st, OPTIM_PREFIX "name");
    if (!fk || strcmp(fk, kn) != 0)
        return CH_ERROR(CH_ERR_INVALID, "%s: the resume file holds %s state, this run uses "
                        "optimizer.name = %s", path, fk ? fk : "sgd", kn);
    int64_t steps;
    CH_TRY(meta_int(st, path, OPTIM_PREFIX "step", 0, 0, &steps));
    CH_TRY(ch_optimizer_set_steps(opt, steps));
    const int np = ch_optimizer_num_params(opt), ns = ch_optimizer_num_state(opt);
    char name[1024];
    for (int i = 0; i < np; i++) {
        const char *pn = ch_optimizer_param_name(opt, i);
        for (int j = 0; j < ns; j++) {
            const char *sn = ch_optimizer_state_name(opt, j);
            const ch_st_view_t *v;
            if (!strcmp(sn, "momentum_buffer")) {
                v = ch_checkpoint_momentum(st, pn);
            } else {
                snprintf(name, sizeof name, OPTIM_PREFIX "%s.%s", sn, pn);
                v = ch_safetensors_find(st, name);
            }
            if (!v) continue; /* no state yet (saved before the first step) */
            if (v->dtype != CH_ST_F32)
                return CH_ERROR(CH_ERR_FORMAT, "%s: %s of '%s' is not F32", path, sn, pn);
            float *tmp = malloc(v->nbytes ? v->nbytes : 1);
            if (!tmp) return CH_ERROR(CH_ERR_NOMEM, "%s: %s of %s", path, sn, pn);
            memcpy(tmp, v->data, v->nbytes); /* file data need not be aligned */
            ch_status s = ch_optimizer_load_state(opt, pn, sn, tmp, v->nbytes / sizeof(float));
            free(tmp);
            if (s) return ch_error_context("%s", path);
        }
    }
    return CH_OK;
}

ch_status ch_train_state_read_resume_optimizer(ch_model_t *model, ch_optimizer_t *opt,
                                               const char *path, ch_train_progress_t *p)
{
    CH_REQUIRE(model && path && p, "ch_train_state_read_resume_optimizer: NULL argument");
    ch_sgd_t *sgd = opt ? ch_optimizer_sgd(opt) : NULL;
    CH_TRY(ch_train_state_read_resume(model, sgd, path, p));
    if (!opt) return CH_OK;
    if (sgd) {
        ch_safetensors_t *st = NULL;
        ch_resume_info_t info;
        CH_TRY(ch_checkpoint_read_resume(path, &st, &info));
        const char *fk = ch_safetensors_meta_get(st, OPTIM_PREFIX "name");
        ch_status s = CH_OK;
        if (fk && strcmp(fk, "sgd") != 0)
            s = CH_ERROR(CH_ERR_INVALID, "%s: the resume file holds %s state, this run uses "
                         "optimizer.name = sgd", path, fk);
        ch_safetensors_destroy(st);
        CH_TRY(s);
        return ch_optimizer_set_steps(opt, p->global_step);
    }
    ch_safetensors_t *st = NULL;
    ch_resume_info_t info;
    CH_TRY(ch_checkpoint_read_resume(path, &st, &info));
    ch_status s = read_optimizer_state(st, path, opt);
    ch_safetensors_destroy(st);
    return s;
}
