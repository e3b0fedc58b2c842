/* cohort: model and resume checkpoint files (see checkpoint.h). */
#define _GNU_SOURCE /* mkostemp */
#include "config.h"

#include "io/state/checkpoint.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define K_FORMAT "format"
#define K_FILE "cohort.file"
#define K_VERSION "cohort.resume_version"
#define K_EPOCH "epoch"
#define K_STEP "global_step"
#define K_SEED "sampler.seed"
#define K_SEPOCH "sampler.epoch"
#define K_WORLD "world_size"
#define K_RNG "rng_state"
#define K_CONFIG "config"
#define N_FIXED 10

ch_status ch_checkpoint_write_model(const char *path, const ch_st_view_t *state, size_t n)
{
    static const ch_st_meta_t meta[1] = {{K_FORMAT, "pt"}};
    return ch_safetensors_write(path, state, n, meta, 1);
}

int ch_checkpoint_is_momentum(const char *name)
{
    return name && !strncmp(name, CH_CKPT_MOMENTUM_PREFIX, strlen(CH_CKPT_MOMENTUM_PREFIX));
}

static const ch_st_view_t *find_view(const ch_st_view_t *v, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (v[i].name && !strcmp(v[i].name, name)) return &v[i];
    return NULL;
}

static int same_shape(const ch_st_view_t *a, const ch_st_view_t *b)
{
    if (a->ndim != b->ndim) return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return 0;
    return 1;
}

ch_status ch_checkpoint_write_resume(const char *path, const ch_st_view_t *state, size_t nstate,
                                     const ch_st_view_t *momentum, size_t nmom,
                                     const ch_resume_info_t *info, const ch_st_meta_t *extra,
                                     size_t nextra)
{
    char num[5][32], ver[16];
    ch_st_meta_t *meta = NULL;
    ch_st_view_t *views = NULL;
    char **names = NULL;
    size_t i, nm = 0;
    ch_status s = CH_OK;

    if (!path) return CH_ERROR(CH_ERR_INVALID, "resume file: NULL path");
    if (!info) return CH_ERROR(CH_ERR_INVALID, "resume file '%s': NULL info", path);
    if (info->epoch < 0 || info->global_step < 0 || info->sampler_epoch < 0 || info->world_size < 1)
        return CH_ERROR(CH_ERR_INVALID,
                        "resume file '%s': invalid progress (epoch %" PRId64 ", global_step %" PRId64
                        ", sampler.epoch %" PRId64 ", world_size %d)",
                        path, info->epoch, info->global_step, info->sampler_epoch, info->world_size);
    if (!info->rng_state || !info->config)
        return CH_ERROR(CH_ERR_INVALID, "resume file '%s': %s is NULL", path,
                        info->rng_state ? "config" : "rng_state");
    if ((nstate && !state) || (nmom && !momentum) || (nextra && !extra))
        return CH_ERROR(CH_ERR_INVALID, "resume file '%s': NULL array with a nonzero count", path);

    for (i = 0; i < nmom; i++) {
        const ch_st_view_t *p;
        if (!momentum[i].name)
            return CH_ERROR(CH_ERR_INVALID, "resume file '%s': momentum buffer %zu has no name", path, i);
        p = find_view(state, nstate, momentum[i].name);
        if (!p)
            return CH_ERROR(CH_ERR_INVALID, "resume file '%s': momentum buffer for '%s', which is not in the state dict",
                            path, momentum[i].name);
        if (momentum[i].dtype != CH_ST_F32 || p->dtype != CH_ST_F32 || !same_shape(p, &momentum[i]))
            return CH_ERROR(CH_ERR_INVALID, "resume file '%s': momentum buffer for '%s' does not match the parameter's F32 shape",
                            path, momentum[i].name);
    }

    snprintf(num[0], sizeof num[0], "%" PRId64, info->epoch);
    snprintf(num[1], sizeof num[1], "%" PRId64, info->global_step);
    snprintf(num[2], sizeof num[2], "%" PRIu64, info->sampler_seed);
    snprintf(num[3], sizeof num[3], "%" PRId64, info->sampler_epoch);
    snprintf(num[4], sizeof num[4], "%d", info->world_size);
    snprintf(ver, sizeof ver, "%d", CH_CKPT_RESUME_VERSION);

    meta = calloc(N_FIXED + nextra, sizeof *meta);
    views = calloc(nstate + nmom ? nstate + nmom : 1, sizeof *views);
    names = calloc(nmom ? nmom : 1, sizeof *names);
    if (!meta || !views || !names) {
        s = CH_ERROR(CH_ERR_NOMEM, "resume file '%s': out of memory", path);
        goto out;
    }
    meta[nm++] = (ch_st_meta_t){K_FORMAT, "pt"};
    meta[nm++] = (ch_st_meta_t){K_FILE, "resume"};
    meta[nm++] = (ch_st_meta_t){K_VERSION, ver};
    meta[nm++] = (ch_st_meta_t){K_EPOCH, num[0]};
    meta[nm++] = (ch_st_meta_t){K_STEP, num[1]};
    meta[nm++] = (ch_st_meta_t){K_SEED, num[2]};
    meta[nm++] = (ch_st_meta_t){K_SEPOCH, num[3]};
    meta[nm++] = (ch_st_meta_t){K_WORLD, num[4]};
    meta[nm++] = (ch_st_meta_t){K_RNG, info->rng_state};
    meta[nm++] = (ch_st_meta_t){K_CONFIG, info->config};
    for (i = 0; i < nextra; i++) meta[nm++] = extra[i];

    for (i = 0; i < nstate; i++) views[i] = state[i];
    for (i = 0; i < nmom; i++) {
        size_t len = strlen(CH_CKPT_MOMENTUM_PREFIX) + strlen(momentum[i].name) + 1;
        names[i] = malloc(len);
        if (!names[i]) {
            s = CH_ERROR(CH_ERR_NOMEM, "resume file '%s': out of memory", path);
            goto out;
        }
        snprintf(names[i], len, "%s%s", CH_CKPT_MOMENTUM_PREFIX, momentum[i].name);
        views[nstate + i] = momentum[i];
        views[nstate + i].name = names[i];
    }
    s = ch_safetensors_write(path, views, nstate + nmom, meta, nm);
out:
    for (i = 0; names && i < nmom; i++) free(names[i]);
    free(names);
    free(views);
    free(meta);
    return s;
}

/* Parse a whole decimal integer in [lo, hi]. */
static ch_status meta_int(const ch_safetensors_t *st, const char *key, int64_t lo, int64_t hi,
                          int64_t *out)
{
    const char *v = ch_safetensors_meta_get(st, key);
    char *end;
    long long x;
    if (!v)
        return CH_ERROR(CH_ERR_FORMAT, "%s: resume metadata key '%s' is missing", ch_safetensors_source(st),
                        key);
    errno = 0;
    x = strtoll(v, &end, 10);
    if (!v[0] || *end || errno || v[0] == ' ' || v[0] == '+' || x < lo || x > hi)
        return CH_ERROR(CH_ERR_FORMAT,
                        "%s: resume metadata '%s' is \"%.100s\", expected a decimal integer in [%" PRId64
                        ", %" PRId64 "]",
                        ch_safetensors_source(st), key, v, lo, hi);
    *out = x;
    return CH_OK;
}

static ch_status meta_u64(const ch_safetensors_t *st, const char *key, uint64_t *out)
{
    const char *v = ch_safetensors_meta_get(st, key);
    char *end;
    unsigned long long x;
    if (!v)
        return CH_ERROR(CH_ERR_FORMAT, "%s: resume metadata key '%s' is missing", ch_safetensors_source(st),
                        key);
    errno = 0;
    x = strtoull(v, &end, 10);
    if (!v[0] || *end || errno || v[0] < '0' || v[0] > '9')
        return CH_ERROR(CH_ERR_FORMAT, "%s: resume metadata '%s' is \"%.100s\", expected an unsigned decimal integer",
                        ch_safetensors_source(st), key, v);
    *out = x;
    return CH_OK;
}

static ch_status meta_str(const ch_safetensors_t *st, const char *key, const char **out)
{
    *out = ch_safetensors_meta_get(st, key);
    if (!*out)
        return CH_ERROR(CH_ERR_FORMAT, "%s: resume metadata key '%s' is missing", ch_safetensors_source(st),
                        key);
    return CH_OK;
}

static ch_status validate_resume(const ch_safetensors_t *st, ch_resume_info_t *info)
{
    const char *src = ch_safetensors_source(st);
    const char *kind = ch_safetensors_meta_get(st, K_FILE);
    int64_t ver, ws;
    if (!kind || strcmp(kind, "resume") != 0)
        return CH_ERROR(CH_ERR_FORMAT, "%s: not a cohort resume file (metadata '%s' is %s%s%s, expected \"resume\"; a model file cannot be resumed from)",
                        src, K_FILE, kind ? "\"" : "", kind ? kind : "missing", kind ? "\"" : "");
    CH_TRY(meta_int(st, K_VERSION, 1, INT32_MAX, &ver));
    if (ver != CH_CKPT_RESUME_VERSION)
        return CH_ERROR(CH_ERR_FORMAT, "%s: resume file version %" PRId64 ", this cohort reads version %d", src,
                        ver, CH_CKPT_RESUME_VERSION);
    CH_TRY(meta_int(st, K_EPOCH, 0, INT64_MAX, &info->epoch));
    CH_TRY(meta_int(st, K_STEP, 0, INT64_MAX, &info->global_step));
    CH_TRY(meta_u64(st, K_SEED, &info->sampler_seed));
    CH_TRY(meta_int(st, K_SEPOCH, 0, INT64_MAX, &info->sampler_epoch));
    CH_TRY(meta_int(st, K_WORLD, 1, INT32_MAX, &ws));
    info->world_size = (int)ws;
    CH_TRY(meta_str(st, K_RNG, &info->rng_state));
    CH_TRY(meta_str(st, K_CONFIG, &info->config));
    for (size_t i = 0; i < ch_safetensors_count(st); i++) {
        const ch_st_view_t *m = ch_safetensors_at(st, i), *p;
        if (!ch_checkpoint_is_momentum(m->name)) continue;
        p = ch_safetensors_find(st, m->name + strlen(CH_CKPT_MOMENTUM_PREFIX));
        if (!p)
            return CH_ERROR(CH_ERR_FORMAT, "%s: momentum buffer '%.200s' has no parameter '%.200s' in the file", src,
                            m->name, m->name + strlen(CH_CKPT_MOMENTUM_PREFIX));
        if (m->dtype != CH_ST_F32 || p->dtype != CH_ST_F32 || !same_shape(m, p))
            return CH_ERROR(CH_ERR_FORMAT, "%s: momentum buffer '%.200s' does not match its parameter's F32 shape",
                            src, m->name);
    }
    return CH_OK;
}

ch_status ch_checkpoint_read_resume(const char *path, ch_safetensors_t **st, ch_resume_info_t *info)
{
    ch_status s;
    ch_resume_info_t tmp;
    *st = NULL;
    CH_TRY(ch_safetensors_open(path, st));
    memset(&tmp, 0, sizeof tmp);
    s = validate_resume(*st, &tmp);
    if (s) {
        ch_safetensors_destroy(*st);
        *st = NULL;
        return s;
    }
    *info = tmp;
    return CH_OK;
}

const ch_st_view_t *ch_checkpoint_momentum(const ch_safetensors_t *st, const char *param_name)
{
    const ch_st_view_t *v;
    size_t len;
    char *buf;
    if (!param_name) return NULL;
    len = strlen(CH_CKPT_MOMENTUM_PREFIX) + strlen(param_name) + 1;
    buf = malloc(len);
    if (!buf) return NULL;
    snprintf(buf, len, "%s%s", CH_CKPT_MOMENTUM_PREFIX, param_name);
    v = ch_safetensors_find(st, buf);
    free(buf);
    return v;
}

ch_status ch_checkpoint_check_dir(const char *dir)
{
    struct stat sb;
    char *tmp;
    size_t len;
    int fd;
    if (!dir || !dir[0]) return CH_ERROR(CH_ERR_INVALID, "checkpoint directory: empty path");
    if (stat(dir, &sb) != 0)
        return CH_ERROR(CH_ERR_IO, "checkpoint directory '%s': %s", dir, strerror(errno));
    if (!S_ISDIR(sb.st_mode))
        return CH_ERROR(CH_ERR_IO, "checkpoint directory '%s' is not a directory", dir);
    len = strlen(dir) + 32;
    tmp = malloc(len);
    if (!tmp) return CH_ERROR(CH_ERR_NOMEM, "out of memory");
    snprintf(tmp, len, "%s/.cohort-probe.XXXXXX", dir);
    fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0) {
        ch_status s = CH_ERROR(CH_ERR_IO, "checkpoint directory '%s' is not writable: %s", dir, strerror(errno));
        free(tmp);
        return s;
    }
    close(fd);
    unlink(tmp);
    free(tmp);
    return CH_OK;
}
