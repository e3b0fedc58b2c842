/* cohort: WebDataset tar shards — member scan and index file, see shards.h. */
#include "config.h"

#include "io/formats/shards.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zlib.h>

#define BLOCK 512

/* ------------------------------------------------------------ tar headers */

/* An octal field (NUL/space padded) or GNU base-256 (high bit of byte 0). */
static int tar_number(const uint8_t *f, int len, uint64_t *out)
{
    uint64_t v = 0;
    if (f[0] & 0x80) {
        if (f[0] != 0x80) return -1; /* negative or > 2^(8*(len-1)) */
        for (int k = 1; k < len; k++) {
            if (v >> 56) return -1;
            v = v << 8 | f[k];
        }
        *out = v;
        return 0;
    }
    int k = 0, digits = 0;
    while (k < len && f[k] == ' ') k++;
    for (; k < len && f[k] >= '0' && f[k] <= '7'; k++, digits++) {
        if (v >> 60) return -1;
        v = v << 3 | (uint64_t)(f[k] - '0');
    }
    for (; k < len; k++)
        if (f[k] != ' ' && f[k] != 0) return -1;
    if (!digits) return -1;
    *out = v;
    return 0;
}

static int all_zero(const uint8_t *b)
{
    for (int k = 0; k < BLOCK; k++)
        if (b[k]) return 0;
    return 1;
}

/* Header checksum: the sum of all bytes with the checksum field as spaces;
 * unsigned as POSIX says, or signed as some old tars wrote it. */
static int tar_checksum_ok(const uint8_t *h)
{
    uint64_t want;
    if (tar_number(h + 148, 8, &want)) return 0;
    int64_t su = 0, ss = 0;
    for (int k = 0; k < BLOCK; k++) {
        uint8_t c = k >= 148 && k < 156 ? ' ' : h[k];
        su += c;
        ss += (int8_t)c;
    }
    return (uint64_t)su == want || (ss >= 0 && (uint64_t)ss == want);
}

/* A pax extended header's records "LEN KEY=VALUE\n": take path and size. */
static int pax_parse(const char *p, size_t n, char *path, int *has_path, uint64_t *size,
                     int *has_size)
{
    size_t pos = 0;
    while (pos < n) {
        size_t len = 0, k = pos;
        while (k < n && p[k] >= '0' && p[k] <= '9') {
            len = len * 10 + (size_t)(p[k] - '0');
            if (len > n) return -1;
            k++;
        }
        if (k == pos || k >= n || p[k] != ' ' || len < k - pos + 3 || pos + len > n ||
            p[pos + len - 1] != '\n')
            return -1;
        const char *kv = p + k + 1, *end = p + pos + len - 1;
        const char *eq = memchr(kv, '=', (size_t)(end - kv));
        if (!eq) return -1;
        size_t klen = (size_t)(eq - kv), vlen = (size_t)(end - eq - 1);
        if (klen == 4 && !memcmp(kv, "path", 4)) {
            if (vlen == 0 || vlen >= CH_TAR_NAME_MAX) return -1;
            memcpy(path, eq + 1, vlen);
            path[vlen] = 0;
            *has_path = 1;
        } else if (klen == 4 && !memcmp(kv, "size", 4)) {
            uint64_t v = 0;
            if (vlen == 0 || vlen > 19) return -1;
            for (size_t j = 0; j < vlen; j++) {
                char c = eq[1 + j];
                if (c < '0' || c > '9') return -1;
                v = v * 10 + (uint64_t)(c - '0');
            }
            *size = v;
            *has_size = 1;
        }
        pos += len;
    }
    return 0;
}

ch_status ch_tar_header(uint8_t h[512], const char *name, uint64_t size, int64_t mtime)
{
    size_t nl = name ? strlen(name) : 0;
    if (nl == 0 || nl > 100)
        return CH_ERROR(CH_ERR_INVALID, "tar member name '%s': 1 to 100 bytes expected",
                        name ? name : "");
    if (size >= (1ull << 33) || mtime < 0 || mtime >= (1ll << 33))
        return CH_ERROR(CH_ERR_INVALID, "tar member %s: size %llu or mtime %lld beyond the ustar "
                        "octal fields", name, (unsigned long long)size, (long long)mtime);
    memset(h, 0, BLOCK);
    memcpy(h, name, nl);
    snprintf((char *)h + 100, 8, "%07o", 0644u);
    snprintf((char *)h + 108, 8, "%07o", 0u);
    snprintf((char *)h + 116, 8, "%07o", 0u);
    snprintf((char *)h + 124, 12, "%011llo", (unsigned long long)size);
    snprintf((char *)h + 136, 12, "%011llo", (unsigned long long)mtime);
    h[156] = '0';
    memcpy(h + 257, "ustar", 6);
    memcpy(h + 263, "00", 2);
    unsigned sum = 0;
    memset(h + 148, ' ', 8);
    for (int k = 0; k < BLOCK; k++) sum += h[k];
    snprintf((char *)h + 148, 8, "%06o", sum); /* six digits, NUL, space */
    h[155] = ' ';
    return CH_OK;
}

/* ------------------------------------------------------------ samples */

typedef struct {
    ch_shard_entry_t *e;
    size_t cap, keys_cap;
    /* the sample being gathered */
    int open;
    char key[CH_SHARD_KEY_MAX];
    size_t key_len;
    int kind;                   /* best image so far: 0 none, else priority */
    uint64_t img_off, img_size, key_hdr;
    int has_label;
    int64_t label;
    uint16_t img_w, img_h;
} gather_t;

static const char *const img_ext[] = {"jpg", "jpeg", "png"};
static const uint8_t img_kind[] = {CH_SHARD_JPEG, CH_SHARD_JPEG, CH_SHARD_PNG};

static ch_status sample_close(gather_t *g, const char *shard)
{
    if (!g->open) return CH_OK;
    g->open = 0;
    ch_shard_entry_t *e = g->e;
    if ((size_t)e->n == g->cap) {
        size_t nc = g->cap ? 2 * g->cap : 256;
        ch_shard_sample_t *p = realloc(e->samples, nc * sizeof *p);
        if (!p) return CH_ERROR(CH_ERR_NOMEM, "shard %s: out of memory", shard);
        e->samples = p;
        g->cap = nc;
    }
    if (e->keys_len + g->key_len > g->keys_cap || !e->keys) {
        size_t nc = g->keys_cap ? 2 * g->keys_cap : 4096;
        while (nc < e->keys_len + g->key_len) nc *= 2;
        char *p = realloc(e->keys, nc);
        if (!p) return CH_ERROR(CH_ERR_NOMEM, "shard %s: out of memory", shard);
        e->keys = p;
        g->keys_cap = nc;
    }
    if (e->keys_len > UINT32_MAX - g->key_len)
        return CH_ERROR(CH_ERR_FORMAT, "shard %s: keys exceed 4 GiB", shard);
    ch_shard_sample_t *s = &e->samples[e->n++];
    memset(s, 0, sizeof *s);
    /* an incomplete sample is kept (kind 0: no image, offset = its first
     * header; label -1: no .cls) and reported after the adjacency check */
    s->offset = g->kind ? g->img_off : g->key_hdr;
    s->size = g->kind ? g->img_size : 0;
    s->label = g->has_label ? g->label : -1;
    s->kind = g->kind ? img_kind[g->kind - 1] : 0;
    s->width = g->kind ? g->img_w : 0;
    s->height = g->kind ? g->img_h : 0;
    s->key_off = (uint32_t)e->keys_len;
    s->key_len = (uint16_t)g->key_len;
    memcpy(e->keys + e->keys_len, g->key, g->key_len);
    e->keys_len += g->key_len;
    return CH_OK;
}

static int parse_label(const char *t, size_t n, int64_t *out)
{
    size_t k = 0;
    while (k < n && isspace((unsigned char)t[k])) k++;
    int64_t v = 0;
    size_t d0 = k;
    while (k < n && t[k] >= '0' && t[k] <= '9') {
        v = v * 10 + (t[k] - '0');
        if (v > INT32_MAX) return -1;
        k++;
    }
    if (k == d0) return -1;
    while (k < n && isspace((unsigned char)t[k])) k++;
    if (k != n) return -1;
    *out = v;
    return 0;
}

static int cmp_key(const void *a, const void *b, void *ctx)
{
    const ch_shard_entry_t *e = ctx;
    const ch_shard_sample_t *x = &e->samples[*(const int64_t *)a], *y = &e->samples[*(const int64_t *)b];
    size_t n = x->key_len < y->key_len ? x->key_len : y->key_len;
    int c = memcmp(e->keys + x->key_off, e->keys + y->key_off, n);
    if (c) return c;
    return (x->key_len > y->key_len) - (x->key_len < y->key_len);
}

/* A key seen twice in one shard: its members were not adjacent. qsort has
 * no context argument in C99: the entry being sorted is a thread-local. */
static __thread const ch_shard_entry_t *t_sort_entry;

static int cmp_sample_key_tls(const void *a, const void *b)
{
    return cmp_key(a, b, (void *)t_sort_entry);
}

static ch_status check_unique_keys(const ch_shard_entry_t *e, const char *shard)
{
    if (e->n < 2) return CH_OK;
    int64_t *ord = malloc((size_t)e->n * sizeof *ord);
    if (!ord) return CH_ERROR(CH_ERR_NOMEM, "shard %s: out of memory", shard);
    for (int64_t i = 0; i < e->n; i++) ord[i] = i;
    t_sort_entry = e;
    qsort(ord, (size_t)e->n, sizeof *ord, cmp_sample_key_tls);
    ch_status st = CH_OK;
    for (int64_t i = 1; i < e->n && st == CH_OK; i++)
        if (cmp_key(&ord[i - 1], &ord[i], (void *)e) == 0) {
            const ch_shard_sample_t *s = &e->samples[ord[i]];
            st = CH_ERROR(CH_ERR_FORMAT, "shard %s: the members of key '%.*s' are not adjacent "
                          "(samples %lld and %lld; a reordered shard: WebDataset groups only "
                          "consecutive members)", shard, (int)s->key_len, e->keys + s->key_off,
                          (long long)(ord[i - 1] < ord[i] ? ord[i - 1] : ord[i]),
                          (long long)(ord[i - 1] < ord[i] ? ord[i] : ord[i - 1]));
        }
    free(ord);
    return st;
}

/* Width and height from an image's header: PNG's IHDR, or a JPEG's SOFn
 * marker (walking the segments from SOI). 0, 0 when they cannot be read:
 * the decoder then reports the image at its first read. */
static void image_dims(ch_tar_read_fn read, void *ctx, uint64_t off, uint64_t size, int kind,
                       uint16_t *w, uint16_t *h)
{
    uint8_t b[24];
    *w = *h = 0;
    if (kind == CH_SHARD_PNG) {
        if (size < 24 || read(ctx, off, b, 24) != 24 || memcmp(b, "\x89PNG\r\n\x1a\n", 8) ||
            memcmp(b + 12, "IHDR", 4))
            return;
        uint32_t ww = (uint32_t)b[16] << 24 | (uint32_t)b[17] << 16 | (uint32_t)b[18] << 8 | b[19];
        uint32_t hh = (uint32_t)b[20] << 24 | (uint32_t)b[21] << 16 | (uint32_t)b[22] << 8 | b[23];
        if (ww <= 65535 && hh <= 65535) {
            *w = (uint16_t)ww;
            *h = (uint16_t)hh;
        }
        return;
    }
    uint64_t pos = 2;
    if (size < 4 || read(ctx, off, b, 2) != 2 || b[0] != 0xFF || b[1] != 0xD8) return;
    for (int seg = 0; seg < 256 && pos + 9 <= size; seg++) {
        if (read(ctx, off + pos, b, 9) != 9 || b[0] != 0xFF) return;
        uint8_t m = b[1];
        if (m == 0xFF) { /* fill byte */
            pos++;
            continue;
        }
        unsigned len = (unsigned)b[2] << 8 | b[3];
        if ((m >= 0xC0 && m <= 0xCF) && m != 0xC4 && m != 0xC8 && m != 0xCC) {
            *h = (uint16_t)((unsigned)b[5] << 8 | b[6]);
            *w = (uint16_t)((unsigned)b[7] << 8 | b[8]);
            return;
        }
        if (m == 0xD8 || m == 0xD9 || m == 0xDA || len < 2) return;
        pos += 2 + len;
    }
}

static ch_status read_exact(ch_tar_read_fn read, void *ctx, uint64_t off, void *buf, size_t n,
                            const char *shard, const char *what)
{
    int64_t r = read(ctx, off, buf, n);
    if (r < 0) return CH_ERROR(CH_ERR_IO, "shard %s: reading %s at byte %llu: %s", shard, what,
                               (unsigned long long)off, strerror(errno));
    if ((size_t)r != n)
        return CH_ERROR(CH_ERR_FORMAT, "shard %s: truncated: the file ends inside %s at byte %llu",
                        shard, what, (unsigned long long)off);
    return CH_OK;
}

/* One regular member named path (data at off, size bytes, header at hdr). */
static ch_status member(gather_t *g, ch_tar_read_fn read, void *ctx, const char *shard,
                        const char *path, uint64_t hdr, uint64_t off, uint64_t size)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    const char *dot = strchr(base, '.');
    if (!dot || dot == base) return CH_OK; /* no key.ext: not part of a sample */
    size_t key_len = (size_t)(dot - path);
    if (key_len >= CH_SHARD_KEY_MAX || key_len > 65535)
        return CH_ERROR(CH_ERR_FORMAT, "shard %s: member at byte %llu: key longer than %d bytes",
                        shard, (unsigned long long)hdr, CH_SHARD_KEY_MAX - 1);
    char ext[16];
    size_t el = strlen(dot + 1);
    int known = el < sizeof ext;
    if (known) {
        for (size_t k = 0; k <= el; k++) ext[k] = (char)tolower((unsigned char)dot[1 + k]);
    }
    if (!g->open || g->key_len != key_len || memcmp(g->key, path, key_len)) {
        CH_TRY(sample_close(g, shard));
        g->open = 1;
        memcpy(g->key, path, key_len);
        g->key_len = key_len;
        g->kind = 0;
        g->has_label = 0;
        g->key_hdr = hdr;
    }
    if (!known) return CH_OK;
    for (int k = 0; k < 3; k++)
        if (!strcmp(ext, img_ext[k])) {
            if (!g->kind || k + 1 < g->kind) {
                g->kind = k + 1;
                g->img_off = off;
                g->img_size = size;
                image_dims(read, ctx, off, size, img_kind[k], &g->img_w, &g->img_h);
            }
            return CH_OK;
        }
    if (!strcmp(ext, "cls")) {
        char t[64];
        if (size >= sizeof t)
            return CH_ERROR(CH_ERR_FORMAT, "shard %s: %s (byte %llu): a .cls member of %llu bytes "
                            "(expected a decimal class index)", shard, path,
                            (unsigned long long)hdr, (unsigned long long)size);
        CH_TRY(read_exact(read, ctx, off, t, (size_t)size, shard, path));
        if (parse_label(t, (size_t)size, &g->label)) {
            char q[160];
            return CH_ERROR(CH_ERR_FORMAT, "shard %s: %s (byte %llu): '%s' is not a class index "
                            "in [0, 2^31)", shard, path, (unsigned long long)hdr,
                            ch_error_quote(t, (size_t)size, q, sizeof q));
        }
        g->has_label = 1;
    }
    return CH_OK;
}

ch_status ch_tar_scan(ch_tar_read_fn read, void *ctx, uint64_t file_size, const char *name,
                      ch_shard_entry_t *e)
{
    memset(e, 0, sizeof *e);
    gather_t *g = calloc(1, sizeof *g);
    char *path = malloc(CH_TAR_NAME_MAX), *next_path = malloc(CH_TAR_NAME_MAX);
    char *pax = NULL;
    ch_status st = CH_OK;
    if (!g || !path || !next_path) {
        st = CH_ERROR(CH_ERR_NOMEM, "shard %s: out of memory", name);
        goto done;
    }
    g->e = e;
    uint8_t h[BLOCK];
    uint64_t pos = 0, next_size = 0;
    int has_next_path = 0, has_next_size = 0;
    for (;;) {
        if (pos == file_size) {
            /* every tar writer (GNU tar, Python's tarfile, cohort-pack) ends
             * with two zero blocks: a file that stops after a member is one
             * whose writer was killed or whose copy was cut short, and the
             * samples after the cut would be lost without a word */
            st = CH_ERROR(CH_ERR_FORMAT, "shard %s: truncated: the file ends at byte %llu after a "
                          "member, without the two zero blocks that end a tar file (a cut-short "
                          "copy or a killed writer)", name, (unsigned long long)pos);
            break;
        }
        if (file_size - pos < BLOCK) {
            st = CH_ERROR(CH_ERR_FORMAT, "shard %s: truncated: %llu bytes after the last member "
                          "at byte %llu, less than a 512-byte header", name,
                          (unsigned long long)(file_size - pos), (unsigned long long)pos);
            break;
        }
        if ((st = read_exact(read, ctx, pos, h, BLOCK, name, "a member header"))) break;
        if (all_zero(h)) break; /* end of archive */
        if (!tar_checksum_ok(h)) {
            st = CH_ERROR(CH_ERR_FORMAT, "shard %s: corrupt: the tar header at byte %llu has a bad "
                          "checksum (not a tar file, or damaged)", name, (unsigned long long)pos);
            break;
        }
        uint64_t size;
        if (tar_number(h + 124, 12, &size)) {
            st = CH_ERROR(CH_ERR_FORMAT, "shard %s: corrupt: the tar header at byte %llu has a bad "
                          "size field", name, (unsigned long long)pos);
            break;
        }
        char type = (char)h[156];
        if (has_next_size && (type == '0' || type == 0 || type == '7')) size = next_size;
        uint64_t data = pos + BLOCK;
        if (size > file_size - data) {
            st = CH_ERROR(CH_ERR_FORMAT, "shard %s: truncated: member at byte %llu has %llu data "
                          "bytes but the file ends at %llu", name, (unsigned long long)pos,
                          (unsigned long long)size, (unsigned long long)file_size);
            break;
        }
        uint64_t padded = (size + BLOCK - 1) / BLOCK * BLOCK;
        uint64_t after = padded > file_size - data ? file_size : data + padded;
        if (type == 'x' || type == 'L') {
            if (size >= (1u << 20)) {
                st = CH_ERROR(CH_ERR_FORMAT, "shard %s: %s header at byte %llu of %llu bytes (at most "
                              "1 MiB)", name, type == 'x' ? "pax" : "long-name",
                              (unsigned long long)pos, (unsigned long long)size);
                break;
            }
            char *p = realloc(pax, (size_t)size + 1);
            if (!p) {
                st = CH_ERROR(CH_ERR_NOMEM, "shard %s: out of memory", name);
                break;
            }
            pax = p;
            if ((st = read_exact(read, ctx, data, pax, (size_t)size, name, "a pax header"))) break;
            pax[size] = 0;
            if (type == 'x') {
                if (pax_parse(pax, (size_t)size, next_path, &has_next_path, &next_size,
                              &has_next_size)) {
                    st = CH_ERROR(CH_ERR_FORMAT, "shard %s: corrupt pax header at byte %llu", name,
                                  (unsigned long long)pos);
                    break;
                }
            } else {
                size_t l = strnlen(pax, (size_t)size);
                if (l == 0 || l >= CH_TAR_NAME_MAX) {
                    st = CH_ERROR(CH_ERR_FORMAT, "shard %s: bad GNU long name at byte %llu", name,
                                  (unsigned long long)pos);
                    break;
                }
                memcpy(next_path, pax, l + 1);
                has_next_path = 1;
            }
            pos = after;
            continue;
        }
        if (type == '0' || type == 0 || type == '7') { /* a regular file */
            if (has_next_path) {
                memcpy(path, next_path, strlen(next_path) + 1);
            } else {
                size_t np = 0;
                if (!memcmp(h + 257, "ustar", 5) && h[345]) {
                    size_t pl = strnlen((const char *)h + 345, 155);
                    memcpy(path, h + 345, pl);
                    path[pl] = '/';
                    np = pl + 1;
                }
                size_t nl = strnlen((const char *)h, 100);
                memcpy(path + np, h, nl);
                path[np + nl] = 0;
            }
            if (path[0] == 0) {
                st = CH_ERROR(CH_ERR_FORMAT, "shard %s: member at byte %llu has an empty name", name,
                              (unsigned long long)pos);
                break;
            }
            if ((st = member(g, read, ctx, name, path, pos, data, size))) break;
        }
        has_next_path = has_next_size = 0; /* pax/GNU headers apply to one member */
        pos = after;
    }
    if (st == CH_OK) st = sample_close(g, name);
    if (st == CH_OK) st = check_unique_keys(e, name);
    for (int64_t i = 0; st == CH_OK && i < e->n; i++) {
        const ch_shard_sample_t *x = &e->samples[i];
        if (!x->kind || x->label < 0)
            st = CH_ERROR(CH_ERR_FORMAT, "shard %s: sample '%.*s' has no %s member (%s at byte "
                          "%llu; expected KEY.jpg/.jpeg/.png and KEY.cls adjacent)", name,
                          (int)x->key_len, e->keys + x->key_off, !x->kind ? "image" : ".cls",
                          x->kind ? "its image data" : "its first member header",
                          (unsigned long long)x->offset);
    }
done:
    free(g);
    free(path);
    free(next_path);
    free(pax);
    if (st != CH_OK) ch_shard_entry_free(e);
    return st;
}

void ch_shard_entry_free(ch_shard_entry_t *e)
{
    if (!e) return;
    free(e->name);
    free(e->samples);
    free(e->keys);
    memset(e, 0, sizeof *e);
}

ch_status ch_shard_index_finish(ch_shard_index_t *idx)
{
    free(idx->first);
    idx->first = malloc((size_t)(idx->nshards + 1) * sizeof *idx->first);
    if (!idx->first) return CH_ERROR(CH_ERR_NOMEM, "shard index: out of memory");
    idx->first[0] = 0;
    for (int s = 0; s < idx->nshards; s++) idx->first[s + 1] = idx->first[s] + idx->shards[s].n;
    idx->total = idx->first[idx->nshards];
    return CH_OK;
}

void ch_shard_index_free(ch_shard_index_t *idx)
{
    if (!idx) return;
    for (int s = 0; s < idx->nshards; s++) ch_shard_entry_free(&idx->shards[s]);
    free(idx->shards);
    free(idx->first);
    memset(idx, 0, sizeof *idx);
}

int ch_shard_index_find(const ch_shard_index_t *idx, int64_t i)
{
    int lo = 0, hi = idx->nshards - 1; /* first[lo] <= i < first[hi + 1] */
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        if (idx->first[mid] <= i) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* ------------------------------------------------------------ index file */

#define INDEX_MAGIC "CHSHIDX1"
#define INDEX_VERSION 1u

typedef struct {
    const uint8_t *p;
    size_t len, pos;
    int bad;
} rd_t;

static uint64_t rd_le(rd_t *r, int n)
{
    if (r->bad || r->len - r->pos < (size_t)n) {
        r->bad = 1;
        return 0;
    }
    uint64_t v = 0;
    for (int k = n - 1; k >= 0; k--) v = v << 8 | r->p[r->pos + (size_t)k];
    r->pos += (size_t)n;
    return v;
}

static const uint8_t *rd_bytes(rd_t *r, size_t n)
{
    if (r->bad || r->len - r->pos < n) {
        r->bad = 1;
        return NULL;
    }
    const uint8_t *q = r->p + r->pos;
    r->pos += n;
    return q;
}

ch_status ch_shard_index_parse(const uint8_t *buf, size_t len, const char *name,
                               ch_shard_index_t *idx)
{
    memset(idx, 0, sizeof *idx);
    if (len < 8 + 4 + 4 + 4 || memcmp(buf, INDEX_MAGIC, 8))
        return CH_ERROR(CH_ERR_FORMAT, "shard index %s: not a cohort shard index (magic "
                        "\"" INDEX_MAGIC "\" expected)", name);
    uint32_t crc = (uint32_t)crc32(0L, buf, (uInt)(len - 4));
    uint32_t want = (uint32_t)buf[len - 4] | (uint32_t)buf[len - 3] << 8 |
                    (uint32_t)buf[len - 2] << 16 | (uint32_t)buf[len - 1] << 24;
    if (len - 4 > UINT32_MAX) crc = ~want; /* crc32's length is 32-bit: not for us */
    if (crc != want)
        return CH_ERROR(CH_ERR_FORMAT, "shard index %s: CRC-32 mismatch (damaged or truncated; "
                        "delete it to rebuild)", name);
    rd_t r = {buf, len - 4, 8, 0};
    uint32_t ver = (uint32_t)rd_le(&r, 4), ns = (uint32_t)rd_le(&r, 4);
    if (ver != INDEX_VERSION)
        return CH_ERROR(CH_ERR_FORMAT, "shard index %s: version %u (this cohort reads %u)", name,
                        ver, INDEX_VERSION);
    if (ns == 0 || ns > (1u << 24) || ns > (len - 16) / 34)
        return CH_ERROR(CH_ERR_FORMAT, "shard index %s: %u shards (expected 1 to %zu for its size)",
                        name, ns, (len - 16) / 34);
    ch_status st = CH_OK;
    idx->shards = calloc(ns, sizeof *idx->shards);
    if (!idx->shards) return CH_ERROR(CH_ERR_NOMEM, "shard index %s: out of memory", name);
    idx->nshards = (int)ns;
    for (uint32_t s = 0; s < ns && st == CH_OK; s++) {
        ch_shard_entry_t *e = &idx->shards[s];
        size_t nl = (size_t)rd_le(&r, 2);
        const uint8_t *nm = rd_bytes(&r, nl);
        e->size = rd_le(&r, 8);
        e->mtime_s = (int64_t)rd_le(&r, 8);
        e->mtime_ns = (int64_t)rd_le(&r, 8);
        uint64_t m = rd_le(&r, 8);
        if (r.bad) break;
        if (nl == 0 || memchr(nm, '/', nl) || memchr(nm, 0, nl)) {
            st = CH_ERROR(CH_ERR_FORMAT, "shard index %s: shard %u has a bad file name", name, s);
            break;
        }
        if (m > (r.len - r.pos) / 31) {
            r.bad = 1;
            break;
        }
        e->name = malloc(nl + 1);
        e->samples = malloc((size_t)(m ? m : 1) * sizeof *e->samples);
        if (!e->name || !e->samples) {
            st = CH_ERROR(CH_ERR_NOMEM, "shard index %s: out of memory", name);
            break;
        }
        memcpy(e->name, nm, nl);
        e->name[nl] = 0;
        size_t keys0 = r.pos, kl_total = 0;
        for (uint64_t i = 0; i < m && !r.bad; i++) { /* first pass: sizes */
            rd_bytes(&r, 8 + 8 + 8 + 1 + 2 + 2);
            size_t kl = (size_t)rd_le(&r, 2);
            rd_bytes(&r, kl);
            kl_total += kl;
        }
        if (r.bad) break;
        r.pos = keys0;
        e->keys = malloc(kl_total ? kl_total : 1);
        if (!e->keys) {
            st = CH_ERROR(CH_ERR_NOMEM, "shard index %s: out of memory", name);
            break;
        }
        for (uint64_t i = 0; i < m; i++) {
            ch_shard_sample_t *x = &e->samples[i];
            memset(x, 0, sizeof *x);
            x->offset = rd_le(&r, 8);
            x->size = rd_le(&r, 8);
            x->label = (int64_t)rd_le(&r, 8);
            x->kind = (uint8_t)rd_le(&r, 1);
            x->width = (uint16_t)rd_le(&r, 2);
            x->height = (uint16_t)rd_le(&r, 2);
            x->key_len = (uint16_t)rd_le(&r, 2);
            const uint8_t *k = rd_bytes(&r, x->key_len);
            x->key_off = (uint32_t)e->keys_len;
            memcpy(e->keys + e->keys_len, k, x->key_len);
            e->keys_len += x->key_len;
            e->n++;
            if (x->offset < 512 || x->offset > e->size || x->size > e->size - x->offset) {
                st = CH_ERROR(CH_ERR_FORMAT, "shard index %s: sample %llu of shard %s lies outside "
                              "the shard's %llu bytes", name, (unsigned long long)i, e->name,
                              (unsigned long long)e->size);
                break;
            }
            if (x->kind != CH_SHARD_JPEG && x->kind != CH_SHARD_PNG) {
                st = CH_ERROR(CH_ERR_FORMAT, "shard index %s: sample %llu of shard %s has image "
                              "kind %u (1 jpg, 2 png expected)", name, (unsigned long long)i,
                              e->name, x->kind);
                break;
            }
            if (x->label < 0 || x->label > INT32_MAX) {
                st = CH_ERROR(CH_ERR_FORMAT, "shard index %s: sample %llu of shard %s has label "
                              "%lld", name, (unsigned long long)i, e->name, (long long)x->label);
                break;
            }
        }
    }
    if (st == CH_OK && r.bad)
        st = CH_ERROR(CH_ERR_FORMAT, "shard index %s: truncated at byte %zu", name, r.pos);
    if (st == CH_OK && r.pos != r.len)
        st = CH_ERROR(CH_ERR_FORMAT, "shard index %s: %zu bytes after the last shard", name,
                      r.len - r.pos);
    if (st == CH_OK) st = ch_shard_index_finish(idx);
    if (st != CH_OK) ch_shard_index_free(idx);
    return st;
}

typedef struct {
    uint8_t *p;
    size_t len, cap;
    int bad;
} wr_t;

static void wr_bytes(wr_t *w, const void *b, size_t n)
{
    if (w->bad) return;
    if (w->len + n > w->cap) {
        size_t nc = w->cap ? w->cap : 1 << 16;
        while (nc < w->len + n) nc *= 2;
        uint8_t *q = realloc(w->p, nc);
        if (!q) {
            w->bad = 1;
            return;
        }
        w->p = q;
        w->cap = nc;
    }
    memcpy(w->p + w->len, b, n);
    w->len += n;
}

static void wr_le(wr_t *w, uint64_t v, int n)
{
    uint8_t b[8];
    for (int k = 0; k < n; k++) b[k] = (uint8_t)(v >> (8 * k));
    wr_bytes(w, b, (size_t)n);
}

ch_status ch_shard_index_encode(const ch_shard_index_t *idx, uint8_t **buf, size_t *len)
{
    *buf = NULL;
    *len = 0;
    wr_t w = {0};
    wr_bytes(&w, INDEX_MAGIC, 8);
    wr_le(&w, INDEX_VERSION, 4);
    wr_le(&w, (uint64_t)idx->nshards, 4);
    for (int s = 0; s < idx->nshards; s++) {
        const ch_shard_entry_t *e = &idx->shards[s];
        size_t nl = strlen(e->name);
        if (nl > 65535) {
            free(w.p);
            return CH_ERROR(CH_ERR_INVALID, "shard index: file name %s is too long", e->name);
        }
        wr_le(&w, nl, 2);
        wr_bytes(&w, e->name, nl);
        wr_le(&w, e->size, 8);
        wr_le(&w, (uint64_t)e->mtime_s, 8);
        wr_le(&w, (uint64_t)e->mtime_ns, 8);
        wr_le(&w, (uint64_t)e->n, 8);
        for (int64_t i = 0; i < e->n; i++) {
            const ch_shard_sample_t *x = &e->samples[i];
            wr_le(&w, x->offset, 8);
            wr_le(&w, x->size, 8);
            wr_le(&w, (uint64_t)x->label, 8);
            wr_le(&w, x->kind, 1);
            wr_le(&w, x->width, 2);
            wr_le(&w, x->height, 2);
            wr_le(&w, x->key_len, 2);
            wr_bytes(&w, e->keys + x->key_off, x->key_len);
        }
    }
    if (!w.bad && w.len > UINT32_MAX) {
        free(w.p);
        return CH_ERROR(CH_ERR_INVALID, "shard index: larger than 4 GiB");
    }
    wr_le(&w, w.bad ? 0 : (uint32_t)crc32(0L, w.p, (uInt)w.len), 4);
    if (w.bad) {
        free(w.p);
        return CH_ERROR(CH_ERR_NOMEM, "shard index: out of memory");
    }
    *buf = w.p;
    *len = w.len;
    return CH_OK;
}
