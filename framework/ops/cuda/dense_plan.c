/* cohort: CUDA dense ops — host-side planning helpers (dense_plan.h). */
#include "config.h"

#include "framework/ops/cuda/dense_plan.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

ch_layout_t ch_cd_pick_layout(ch_layout_t la, int64_t numel_a, ch_layout_t lb, int64_t numel_b)
{
    if (la == lb) return la;
    return numel_b > numel_a ? lb : la;
}

int ch_cd_fits_int(const int64_t *v, int n)
{
    for (int i = 0; i < n; i++)
        if (v[i] < 0 || v[i] > INT_MAX) return 0;
    return 1;
}

void ch_cd_carve_init(ch_cd_carve_t *c) { memset(c, 0, sizeof *c); }

int ch_cd_carve_add(ch_cd_carve_t *c, size_t bytes)
{
    if (c->n >= CH_CD_CARVE_MAX) return -1;
    size_t at = (c->total + CH_CD_ALIGN - 1) / CH_CD_ALIGN * CH_CD_ALIGN;
    c->off[c->n] = at;
    c->len[c->n] = bytes;
    c->total = bytes ? at + bytes : c->total;
    return c->n++;
}

void *ch_cd_carve_ptr(const ch_cd_carve_t *c, void *base, int i)
{
    if (i < 0 || i >= c->n || c->len[i] == 0 || !base) return NULL;
    return (char *)base + c->off[i];
}

/* FNV-1a over the key's bytes. */
uint64_t ch_cd_key_hash(const int64_t *key)
{
    uint64_t h = 1469598103934665603ULL;
    const unsigned char *b = (const unsigned char *)key;
    for (size_t i = 0; i < CH_CD_KEY_LEN * sizeof(int64_t); i++) {
        h ^= b[i];
        h *= 1099511628211ULL;
    }
    return h;
}

void *ch_cd_cache_find(const ch_cd_cache_t *c, const int64_t *key)
{
    uint64_t h = ch_cd_key_hash(key);
    for (size_t i = 0; i < c->n; i++)
        if (c->e[i].hash == h && !memcmp(c->e[i].key, key, sizeof c->e[i].key))
            return c->e[i].value;
    return NULL;
}

int ch_cd_cache_add(ch_cd_cache_t *c, const int64_t *key, void *value)
{
    if (c->n == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 32;
        ch_cd_cache_entry *e = realloc(c->e, cap * sizeof *e);
        if (!e) return -1;
        c->e = e;
        c->cap = cap;
    }
    memcpy(c->e[c->n].key, key, sizeof c->e[c->n].key);
    c->e[c->n].hash = ch_cd_key_hash(key);
    c->e[c->n].value = value;
    c->n++;
    return 0;
}

void ch_cd_cache_free(ch_cd_cache_t *c, void (*destroy)(void *ctx, void *value), void *ctx)
{
    for (size_t i = 0; i < c->n; i++)
        if (destroy) destroy(ctx, c->e[i].value);
    free(c->e);
    memset(c, 0, sizeof *c);
}

void ch_cd_conv_key(int64_t key[CH_CD_KEY_LEN], int op, const int64_t xs[4],
                    const int64_t ws[4], const int64_t ys[4], const ch_conv2d_params_t *p,
                    ch_layout_t layout, int bf16, int tf32, int search)
{
    memset(key, 0, CH_CD_KEY_LEN * sizeof key[0]);
    int k = 0;
    key[k++] = op;
    for (int i = 0; i < 4; i++) key[k++] = xs[i];
    key[k++] = ws[0];
    key[k++] = ws[2];
    key[k++] = ws[3];
    key[k++] = ys[2];
    key[k++] = ys[3];
    key[k++] = p->stride_h;
    key[k++] = p->stride_w;
    key[k++] = p->pad_h;
    key[k++] = p->pad_w;
    key[k++] = (int64_t)layout;
    key[k++] = bf16;
    key[k++] = bf16 ? 0 : tf32; /* TF32 is moot for bf16 data */
    key[k++] = search;
    key[k++] = ch_conv2d_dilation_h(p);
    key[k++] = ch_conv2d_dilation_w(p);
    key[k++] = ch_conv2d_groups(p);
}
