/* cohort: the dataset interface, in-memory datasets, Subset and
 * random_split; see dataset.h. */
#include "io/data/dataset.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "io/data/sampler.h"

ch_status ch_dataset_get(const ch_dataset_t *ds, int64_t i, ch_image_t *img, int64_t *label)
{
    CH_REQUIRE(ds != NULL && img != NULL && label != NULL, "ch_dataset_get: NULL argument");
    if (i < 0 || i >= ds->length)
        return CH_ERROR(CH_ERR_RANGE, "%s: sample index %lld out of range [0, %lld)", ds->name,
                        (long long)i, (long long)ds->length);
    return ds->get(ds, i, img, label);
}

const char *ch_dataset_sample_path(const ch_dataset_t *ds, int64_t i)
{
    const char *p = NULL;
    if (ds->sample_path && i >= 0 && i < ds->length) p = ds->sample_path(ds, i);
    return p ? p : ds->name;
}

void ch_dataset_destroy(ch_dataset_t *ds)
{
    if (!ds) return;
    if (ds->destroy_impl) ds->destroy_impl(ds);
    if (ds->class_names) {
        for (int k = 0; k < ds->num_classes; k++) free(ds->class_names[k]);
        free(ds->class_names);
    }
    free(ds->name);
    free(ds);
}

char *ch_dataset_path_join(const char *dir, const char *name)
{
    size_t la = strlen(dir), lb = strlen(name);
    char *p = malloc(la + lb + 2);
    if (!p) return NULL;
    memcpy(p, dir, la);
    p[la] = '/';
    memcpy(p + la + 1, name, lb + 1);
    return p;
}

int ch_dataset_cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

ch_status ch_dataset_read_file(const char *path, uint8_t **buf, size_t *len)
{
    *buf = NULL;
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return CH_ERROR(CH_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fileno(f), &sb) == 0 && S_ISDIR(sb.st_mode)) {
        fclose(f);
        return CH_ERROR(CH_ERR_IO, "'%s' is a directory, not a file", path);
    }
    long size = -1;
    if (fseek(f, 0, SEEK_END) == 0) size = ftell(f);
    if (size < 0 || fseek(f, 0, SEEK_SET) != 0) {
        int e = errno;
        fclose(f);
        return CH_ERROR(CH_ERR_IO, "cannot read '%s' (is it a directory?): %s", path, strerror(e));
    }
    uint8_t *p = malloc((size_t)size + 1);
    if (!p) {
        fclose(f);
        return CH_ERROR(CH_ERR_NOMEM, "out of memory reading '%s' (%ld bytes)", path, size);
    }
    if (size > 0 && fread(p, 1, (size_t)size, f) != (size_t)size) {
        int e = errno;
        fclose(f);
        free(p);
        return CH_ERROR(CH_ERR_IO, "short read from '%s': %s", path, strerror(e));
    }
    fclose(f);
    *buf = p;
    *len = (size_t)size;
    return CH_OK;
}

/* ---------------------------------------------------------------- memory */

struct memory_impl {
    uint8_t *pixels;
    int64_t *labels;
    size_t image_bytes;
};

static ch_status memory_get(const ch_dataset_t *ds, int64_t i, ch_image_t *img, int64_t *label)
{
    const struct memory_impl *m = ds->impl;
    CH_TRY(ch_image_reshape(img, ds->height, ds->width, ds->channels));
    memcpy(img->data, m->pixels + (size_t)i * m->image_bytes, m->image_bytes);
    *label = m->labels[i];
    return CH_OK;
}

static void memory_destroy(ch_dataset_t *ds)
{
    struct memory_impl *m = ds->impl;
    if (!m) return;
    free(m->pixels);
    free(m->labels);
    free(m);
}

ch_status ch_dataset_memory_create(const char *kind, const char *name,
                                   int64_t n, int h, int w, int c, int num_classes,
                                   uint8_t **pixels, int64_t **labels, ch_dataset_t **out)
{
    *out = NULL;
    CH_REQUIRE(n >= 0 && h > 0 && w > 0 && c > 0, "%s: bad dataset shape n=%lld %dx%dx%d", name,
               (long long)n, h, w, c);
    ch_dataset_t *ds = calloc(1, sizeof *ds);
    struct memory_impl *m = calloc(1, sizeof *m);
    char *nm = strdup(name);
    size_t ib = (size_t)h * (size_t)w * (size_t)c;
    uint8_t *px = malloc(ib * (size_t)(n > 0 ? n : 1));
    int64_t *lb = malloc(sizeof *lb * (size_t)(n > 0 ? n : 1));
    if (!ds || !m || !nm || !px || !lb) {
        free(ds);
        free(m);
        free(nm);
        free(px);
        free(lb);
        return CH_ERROR(CH_ERR_NOMEM, "%s: out of memory for %lld images", name, (long long)n);
    }
    m->pixels = px;
    m->labels = lb;
    m->image_bytes = ib;
    ds->kind = kind;
    ds->name = nm;
    ds->length = n;
    ds->num_classes = num_classes;
    ds->channels = c;
    ds->height = h;
    ds->width = w;
    ds->get = memory_get;
    ds->destroy_impl = memory_destroy;
    ds->impl = m;
    *pixels = px;
    *labels = lb;
    *out = ds;
    return CH_OK;
}

/* ---------------------------------------------------------------- subset */

struct subset_impl {
    ch_dataset_t *base;
    int64_t *indices;
};

static ch_status subset_get(const ch_dataset_t *ds, int64_t i, ch_image_t *img, int64_t *label)
{
    const struct subset_impl *s = ds->impl;
    return s->base->get(s->base, s->indices[i], img, label);
}

static const char *subset_path(const ch_dataset_t *ds, int64_t i)
{
    const struct subset_impl *s = ds->impl;
    return ch_dataset_sample_path(s->base, s->indices[i]);
}

static void subset_destroy(ch_dataset_t *ds)
{
    struct subset_impl *s = ds->impl;
    if (!s) return;
    free(s->indices);
    free(s);
}

ch_status ch_dataset_subset_create(ch_dataset_t *base,
                                   const int64_t *indices, int64_t n, ch_dataset_t **out)
{
    *out = NULL;
    CH_REQUIRE(base != NULL && n >= 0 && (n == 0 || indices != NULL),
               "ch_dataset_subset_create: bad arguments (n=%lld)", (long long)n);
    for (int64_t k = 0; k < n; k++)
        if (indices[k] < 0 || indices[k] >= base->length)
            return CH_ERROR(CH_ERR_RANGE, "subset of %s: index %lld at position %lld outside [0, %lld)",
                            base->name, (long long)indices[k], (long long)k,
                            (long long)base->length);
    ch_dataset_t *ds = calloc(1, sizeof *ds);
    struct subset_impl *s = calloc(1, sizeof *s);
    size_t nl = strlen(base->name) + 32;
    char *nm = malloc(nl);
    int64_t *idx = malloc(sizeof *idx * (size_t)(n > 0 ? n : 1));
    if (!ds || !s || !nm || !idx) {
        free(ds);
        free(s);
        free(nm);
        free(idx);
        return CH_ERROR(CH_ERR_NOMEM, "subset of %s: out of memory", base->name);
    }
    if (n) memcpy(idx, indices, sizeof *idx * (size_t)n);
    snprintf(nm, nl, "%s (subset)", base->name);
    s->base = base;
    s->indices = idx;
    ds->kind = "subset";
    ds->name = nm;
    ds->length = n;
    ds->num_classes = base->num_classes;
    ds->channels = base->channels;
    ds->height = base->height;
    ds->width = base->width;
    ds->get = subset_get;
    ds->sample_path = subset_path;
    ds->destroy_impl = subset_destroy;
    ds->impl = s;
    *out = ds;
    return CH_OK;
}

ch_status ch_dataset_random_split(ch_dataset_t *base, double val_fraction, uint64_t seed,
                                  ch_dataset_t **train, ch_dataset_t **val)
{
    *train = *val = NULL;
    CH_REQUIRE(base != NULL, "ch_dataset_random_split: base is NULL");
    CH_REQUIRE(val_fraction >= 0.0 && val_fraction <= 1.0,
               "%s: validation fraction %g outside [0, 1]", base->name, val_fraction);
    int64_t n = base->length;
    double frac[2] = {1.0 - val_fraction, val_fraction};
    int64_t len[2];
    for (int k = 0; k < 2; k++) len[k] = (int64_t)floor((double)n * frac[k]);
    int64_t rem = n - len[0] - len[1];
    for (int64_t i = 0; i < rem; i++) len[i % 2]++;
    int64_t *perm = malloc(sizeof *perm * (size_t)(n > 0 ? n : 1));
    if (!perm) return CH_ERROR(CH_ERR_NOMEM, "%s: out of memory", base->name);
    ch_randperm(n, seed, perm);
    ch_status st = ch_dataset_subset_create(base, perm, len[0], train);
    if (st == CH_OK) st = ch_dataset_subset_create(base, perm + len[0], len[1], val);
    free(perm);
    if (st != CH_OK) {
        ch_dataset_destroy(*train);
        *train = NULL;
    }
    return st;
}
