/* cohort: PyTorch .pth / .pt state dicts (see pth.h). */
#include "config.h"

#include "io/formats/pth.h"

#include "io/formats/pickle.h"

#include "io/state/atomic_file.h"

#include <minizip/unzip.h>
#include <minizip/zip.h>

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Most records in a zip .pth (a state dict has one per tensor). */
#define MAX_RECORDS ((size_t)1 << 20)

typedef struct {
    char *name;
    size_t offset, size; /* data bytes [offset, offset + size) of the file */
} record_t;

/* One storage: its element type and bytes. */
typedef struct {
    const char *key;
    ch_pk_global_t type;
    int64_t numel;
    const unsigned char *data;
    size_t nbytes; /* bytes available (the record's size) */
} storage_t;

struct ch_pth {
    char *label;
    ch_pth_kind_t kind;
    const unsigned char *buf;
    size_t size;
    void *map;
    size_t map_size;
    unsigned char *owned_file;
    ch_pk_t *pk;
    record_t *rec;
    size_t nrec;
    storage_t *sto; /* legacy: one per key of the key list */
    size_t nsto;
    ch_st_view_t *views;
    size_t n;
    const ch_st_view_t **sorted;
    void **owned;
    size_t nowned, owned_bytes;
    const char *state_key;
    char *prefix; /* zip: the record prefix ("archive", the file's stem, ...) */
};

ch_pth_kind_t ch_pth_detect(const void *head, size_t n)
{
    static const unsigned char legacy[] = {0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46,
                                           0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19};
    const unsigned char *h = head;
    if (n >= 4 && !memcmp(h, "PK\3\4", 4)) return CH_PTH_ZIP;
    if (n >= sizeof legacy && !memcmp(h, legacy, sizeof legacy)) return CH_PTH_LEGACY;
    return CH_PTH_NOT;
}

void ch_pth_destroy(ch_pth_t *p)
{
    if (!p) return;
    for (size_t i = 0; i < p->nowned; i++) free(p->owned[i]);
    free(p->owned);
    for (size_t i = 0; i < p->nrec; i++) free(p->rec[i].name);
    free(p->rec);
    free(p->sto);
    free(p->views);
    free(p->sorted);
    free(p->prefix);
    ch_pk_destroy(p->pk);
    if (p->map) munmap(p->map, p->map_size);
    free(p->owned_file);
    free(p->label);
    free(p);
}

size_t ch_pth_count(const ch_pth_t *p) { return p->n; }
const ch_st_view_t *ch_pth_at(const ch_pth_t *p, size_t i) { return i < p->n ? &p->views[i] : NULL; }
const char *ch_pth_state_key(const ch_pth_t *p) { return p->state_key; }
ch_pth_kind_t ch_pth_kind(const ch_pth_t *p) { return p->kind; }

static int cmp_view(const void *a, const void *b)
{
    return strcmp((*(const ch_st_view_t *const *)a)->name, (*(const ch_st_view_t *const *)b)->name);
}

const ch_st_view_t *ch_pth_find(const ch_pth_t *p, const char *name)
{
    size_t lo = 0, hi = p->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(p->sorted[mid]->name, name);
        if (!c) return p->sorted[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

/* Converted and gathered tensors may take at most this many bytes: 4 x the
 * file's size (float16 gathered, then converted: 3x) + 64 MiB. Views with
 * stride 0 (expand) or aliasing one storage could otherwise make a small
 * file allocate without bound. */
static size_t owned_limit(const ch_pth_t *p)
{
    return p->size > (SIZE_MAX - ((size_t)64 << 20)) / 4 ? SIZE_MAX
                                                          : 4 * p->size + ((size_t)64 << 20);
}

static void *own(ch_pth_t *p, size_t n)
{
    if (n > owned_limit(p) - p->owned_bytes) return NULL;
    void **o = realloc(p->owned, (p->nowned + 1) * sizeof *o);
    if (!o) return NULL;
    p->owned = o;
    void *b = malloc(n ? n : 1);
    if (b) {
        p->owned[p->nowned++] = b;
        p->owned_bytes += n;
    }
    return b;
}

/* ------------------------------------------------------------ zip */

typedef struct {
    const unsigned char *buf;
    size_t size, pos;
} memio_t;

static voidpf ZCALLBACK mem_open(voidpf opaque, const void *name, int mode)
{
    (void)name;
    (void)mode;
    ((memio_t *)opaque)->pos = 0;
    return opaque;
}

static uLong ZCALLBACK mem_read(voidpf opaque, voidpf stream, void *buf, uLong n)
{
    memio_t *m = stream;
    (void)opaque;
    if (m->pos >= m->size) return 0;
    if (n > m->size - m->pos) n = (uLong)(m->size - m->pos);
    memcpy(buf, m->buf + m->pos, n);
    m->pos += n;
    return n;
}

static uLong ZCALLBACK mem_write(voidpf opaque, voidpf stream, const void *buf, uLong n)
{
    (void)opaque;
    (void)stream;
    (void)buf;
    (void)n;
    return 0;
}

static ZPOS64_T ZCALLBACK mem_tell(voidpf opaque, voidpf stream)
{
    (void)opaque;
    return ((memio_t *)stream)->pos;
}

static long ZCALLBACK mem_seek(voidpf opaque, voidpf stream, ZPOS64_T off, int origin)
{
    memio_t *m = stream;
    (void)opaque;
    ZPOS64_T base = origin == ZLIB_FILEFUNC_SEEK_SET ? 0
                    : origin == ZLIB_FILEFUNC_SEEK_CUR ? m->pos : m->size;
    if (off > m->size || base > m->size - off) return -1;
    m->pos = (size_t)(base + off);
    return 0;
}

static int ZCALLBACK mem_close(voidpf opaque, voidpf stream)
{
    (void)opaque;
    (void)stream;
    return 0;
}

static int ZCALLBACK mem_error(voidpf opaque, voidpf stream)
{
    (void)opaque;
    (void)stream;
    return 0;
}

static int cmp_rec(const void *a, const void *b)
{
    return strcmp(((const record_t *)a)->name, ((const record_t *)b)->name);
}

static const record_t *find_rec(const ch_pth_t *p, const char *name)
{
    record_t key = {(char *)name, 0, 0};
    return bsearch(&key, p->rec, p->nrec, sizeof *p->rec, cmp_rec);
}

/* Every record of the central directory with its data offset (STORED only). */
static ch_status zip_records(ch_pth_t *p)
{
    memio_t m = {p->buf, p->size, 0};
    zlib_filefunc64_def ff = {mem_open, mem_read, mem_write, mem_tell, mem_seek,
                              mem_close, mem_error, &m};
    unzFile uf = unzOpen2_64(p->label, &ff);
    if (!uf)
        return CH_ERROR(CH_ERR_FORMAT, "%s: not a readable zip archive (no valid central "
                        "directory; a truncated .pth?)", p->label);
    ch_status s = CH_OK;
    size_t cap = 0;
    int r = unzGoToFirstFile(uf);
    while (r == UNZ_OK) {
        unz_file_info64 info;
        char name[1024];
        if (p->nrec >= MAX_RECORDS) {
            s = CH_ERROR(CH_ERR_RANGE, "%s: more than %zu zip records", p->label, MAX_RECORDS);
            break;
        }
        if (unzGetCurrentFileInfo64(uf, &info, name, sizeof name, NULL, 0, NULL, 0) != UNZ_OK ||
            info.size_filename >= sizeof name) {
            s = CH_ERROR(CH_ERR_FORMAT, "%s: zip record %zu: unreadable entry or a name of more "
                         "than %zu bytes", p->label, p->nrec, sizeof name - 1);
            break;
        }
        name[info.size_filename] = 0;
        if (strlen(name) != info.size_filename) {
            s = CH_ERROR(CH_ERR_FORMAT, "%s: zip record %zu: name contains a NUL byte", p->label,
                         p->nrec);
            break;
        }
        int method = -1, level = 0;
        if (unzOpenCurrentFile2(uf, &method, &level, 1) != UNZ_OK) {
            s = CH_ERROR(CH_ERR_FORMAT, "%s: zip record '%s': local header does not match the "
                         "central directory", p->label, name);
            break;
        }
        ZPOS64_T off = unzGetCurrentFileZStreamPos64(uf);
        unzCloseCurrentFile(uf);
        if (method != 0 || info.compressed_size != info.uncompressed_size) {
            s = CH_ERROR(CH_ERR_FORMAT, "%s: zip record '%s' is compressed (method %d): torch.save "
                         "writes STORED records; re-save the file with torch.save", p->label, name,
                         method);
            break;
        }
        if (off > p->size || info.uncompressed_size > p->size - off) {
            s = CH_ERROR(CH_ERR_FORMAT, "%s: zip record '%s' (%llu bytes at %llu) extends past the "
                         "end of the file (%zu bytes)", p->label, name,
                         (unsigned long long)info.uncompressed_size, (unsigned long long)off, p->size);
            break;
        }
        if (p->nrec == cap) {
            cap = cap ? 2 * cap : 64;
            record_t *q = realloc(p->rec, cap * sizeof *q);
            if (!q) {
                s = CH_ERROR(CH_ERR_NOMEM, "%s: zip directory", p->label);
                break;
            }
            p->rec = q;
        }
        record_t *rc = &p->rec[p->nrec];
        if (!(rc->name = strdup(name))) {
            s = CH_ERROR(CH_ERR_NOMEM, "%s: zip directory", p->label);
            break;
        }
        rc->offset = (size_t)off;
        rc->size = (size_t)info.uncompressed_size;
        p->nrec++;
        r = unzGoToNextFile(uf);
    }
    if (s == CH_OK && r != UNZ_END_OF_LIST_OF_FILE)
        s = CH_ERROR(CH_ERR_FORMAT, "%s: zip central directory unreadable after %zu records",
                     p->label, p->nrec);
    unzClose(uf);
    if (s) return s;
    qsort(p->rec, p->nrec, sizeof *p->rec, cmp_rec);
    for (size_t i = 1; i < p->nrec; i++)
        if (!strcmp(p->rec[i - 1].name, p->rec[i].name))
            return CH_ERROR(CH_ERR_FORMAT, "%s: zip record '%s' appears twice", p->label,
                            p->rec[i].name);
    return CH_OK;
}

/* ------------------------------------------------------------ storages */

static size_t elem_size(ch_pk_global_t t)
{
    switch (t) {
    case CH_PK_G_FLOAT_STORAGE: case CH_PK_G_INT_STORAGE: return 4;
    case CH_PK_G_HALF_STORAGE: case CH_PK_G_BFLOAT16_STORAGE: case CH_PK_G_SHORT_STORAGE: return 2;
    case CH_PK_G_DOUBLE_STORAGE: case CH_PK_G_LONG_STORAGE: return 8;
    case CH_PK_G_CHAR_STORAGE: case CH_PK_G_BYTE_STORAGE: case CH_PK_G_BOOL_STORAGE: return 1;
    default: return 0;
    }
}

static int cmp_storage(const void *a, const void *b)
{
    return strcmp(((const storage_t *)a)->key, ((const storage_t *)b)->key);
}

static ch_status storage_bytes(const ch_pth_t *p, storage_t *st, size_t *at);

/* The fields of a storage persistent id. */
static ch_status parse_persid(const ch_pth_t *p, const ch_pk_value_t *v, storage_t *st)
{
    const ch_pk_value_t *t = v->a;
    size_t want = p->kind == CH_PTH_LEGACY ? 6 : 5;
    if (t->kind != CH_PK_TUPLE || t->n != want || t->items[0]->kind != CH_PK_STR ||
        strcmp(t->items[0]->s, "storage") || t->items[1]->kind != CH_PK_GLOBAL ||
        !elem_size((ch_pk_global_t)t->items[1]->i) || t->items[2]->kind != CH_PK_STR ||
        t->items[3]->kind != CH_PK_STR || t->items[4]->kind != CH_PK_INT || t->items[4]->i < 0)
        return CH_ERROR(CH_ERR_FORMAT, "%s: a persistent id is not ('storage', torch.<T>Storage, "
                        "key, location, numel%s)", p->label,
                        p->kind == CH_PTH_LEGACY ? ", None" : "");
    if (want == 6 && t->items[5]->kind != CH_PK_NONE)
        return CH_ERROR(CH_ERR_UNSUPPORTED, "%s: storage '%s' is a view of another storage "
                        "(torch < 0.4 files): not supported", p->label, t->items[2]->s);
    st->key = t->items[2]->s;
    st->type = (ch_pk_global_t)t->items[1]->i;
    st->numel = t->items[4]->i;
    st->data = NULL;
    st->nbytes = 0;
    return CH_OK;
}

/* Bytes of the storage a persistent id names. */
static ch_status resolve_storage(const ch_pth_t *p, const ch_pk_value_t *v, storage_t *st)
{
    CH_TRY(parse_persid(p, v, st));
    size_t es = elem_size(st->type), need;
    if (__builtin_mul_overflow((size_t)st->numel, es, &need))
        return CH_ERROR(CH_ERR_FORMAT, "%s: storage '%s': %lld elements overflow", p->label,
                        st->key, (long long)st->numel);
    if (p->kind == CH_PTH_ZIP) {
        const record_t *r = NULL;
        char name[1100];
        int w = snprintf(name, sizeof name, "%s/data/%s", p->prefix, st->key);
        if (w > 0 && (size_t)w < sizeof name) r = find_rec(p, name);
        if (!r)
            return CH_ERROR(CH_ERR_FORMAT, "%s: storage '%s' has no record '%s'", p->label,
                            st->key, name);
        st->data = p->buf + r->offset;
        st->nbytes = r->size;
    } else {
        const storage_t *f = bsearch(st, p->sto, p->nsto, sizeof *p->sto, cmp_storage);
        if (!f)
            return CH_ERROR(CH_ERR_FORMAT, "%s: storage '%s' is not in the file's storage list",
                            p->label, st->key);
        if (f->type != st->type)
            return CH_ERROR(CH_ERR_FORMAT, "%s: storage '%s' is named with two types", p->label,
                            st->key);
        st->data = f->data;
        st->nbytes = f->nbytes;
    }
    if (need > st->nbytes)
        return CH_ERROR(CH_ERR_FORMAT, "%s: storage '%s' declares %lld elements (%zu bytes) but "
                        "its data has %zu bytes", p->label, st->key, (long long)st->numel, need,
                        st->nbytes);
    return CH_OK;
}

/* ------------------------------------------------------------ tensors */

static float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0x1f) u = sign | 0x7f800000u | (man << 13); /* inf, nan (payload kept) */
    else if (exp) u = sign | ((exp + 112) << 23) | (man << 13);
    else if (!man) u = sign;
    else { /* subnormal: normalise */
        int e = -1;
        do {
            man <<= 1;
            e++;
        } while (!(man & 0x400));
        u = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ff) << 13);
    }
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* dst[0..n) float32 from n contiguous little-endian elements of type t. */
static void to_float(ch_pk_global_t t, const unsigned char *src, float *dst, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (t == CH_PK_G_HALF_STORAGE) {
            dst[i] = half_to_float((uint16_t)(src[2 * i] | src[2 * i + 1] << 8));
        } else if (t == CH_PK_G_BFLOAT16_STORAGE) {
            uint32_t u = (uint32_t)(src[2 * i] | src[2 * i + 1] << 8) << 16;
            memcpy(&dst[i], &u, sizeof u);
        } else { /* double: round to nearest, as Tensor.float() */
            double d;
            memcpy(&d, src + 8 * i, sizeof d);
            dst[i] = (float)d;
        }
    }
}

static ch_status own_failed(const ch_pth_t *p, const char *name, size_t n)
{
    if (n > owned_limit(p) - p->owned_bytes)
        return CH_ERROR(CH_ERR_RANGE, "%s: '%s': converting or gathering it needs %zu bytes, "
                        "beyond the limit of %zu for a file of %zu bytes (expanded or aliasing "
                        "views?)", p->label, name, n, owned_limit(p), p->size);
    return CH_ERROR(CH_ERR_NOMEM, "%s: '%s' (%zu bytes)", p->label, name, n);
}

static int64_t int_of(const ch_pk_value_t *v, int *ok)
{
    if (v->kind != CH_PK_INT) {
        *ok = 0;
        return 0;
    }
    return v->i;
}

/* The tensor of _rebuild_tensor_v2 call v (or of _rebuild_parameter around
 * one) as view out (named name). */
static ch_status build_tensor(ch_pth_t *p, const char *name, const ch_pk_value_t *v,
                              ch_st_view_t *out)
{
    if (v->kind == CH_PK_CALL && v->a->i == CH_PK_G_REBUILD_PARAMETER) {
        if (v->b->n < 1 || v->b->items[0]->kind != CH_PK_CALL ||
            v->b->items[0]->a->i != CH_PK_G_REBUILD_TENSOR_V2)
            return CH_ERROR(CH_ERR_FORMAT, "%s: '%s': _rebuild_parameter of something other than "
                            "a tensor", p->label, name);
        v = v->b->items[0];
    }
    if (v->kind != CH_PK_CALL || v->a->i != CH_PK_G_REBUILD_TENSOR_V2)
        return CH_ERROR(CH_ERR_FORMAT, "%s: '%s' is a %s, not a tensor", p->label, name,
                        ch_pk_kind_name(v->kind));
    const ch_pk_value_t *a = v->b;
    if (a->n < 6 || a->n > 7 || a->items[0]->kind != CH_PK_PERSID ||
        a->items[2]->kind != CH_PK_TUPLE || a->items[3]->kind != CH_PK_TUPLE)
        return CH_ERROR(CH_ERR_FORMAT, "%s: '%s': _rebuild_tensor_v2 arguments are not (storage, "
                        "storage_offset, size, stride, requires_grad, backward_hooks)", p->label,
                        name);
    storage_t st;
    CH_TRY(resolve_storage(p, a->items[0], &st));
    int ok = 1;
    int64_t off = int_of(a->items[1], &ok);
    const ch_pk_value_t *sz = a->items[2], *sd = a->items[3];
    if (sz->n > CH_ST_MAX_DIMS || sz->n != sd->n)
        return CH_ERROR(sz->n > CH_ST_MAX_DIMS ? CH_ERR_UNSUPPORTED : CH_ERR_FORMAT,
                        "%s: '%s': %zu sizes and %zu strides (same count, at most %d)", p->label,
                        name, sz->n, sd->n, CH_ST_MAX_DIMS);
    int nd = (int)sz->n;
    int64_t size[CH_ST_MAX_DIMS], stride[CH_ST_MAX_DIMS];
    uint64_t numel = 1, last = 0;
    int overflow = 0;
    for (int d = 0; d < nd; d++) {
        size[d] = int_of(sz->items[d], &ok);
        stride[d] = int_of(sd->items[d], &ok);
        if (size[d] < 0 || stride[d] < 0) ok = 0;
    }
    if (!ok || off < 0)
        return CH_ERROR(CH_ERR_FORMAT, "%s: '%s': storage offset, sizes and strides must be "
                        "integers >= 0", p->label, name);
    for (int d = 0; d < nd; d++) overflow |= __builtin_mul_overflow(numel, (uint64_t)size[d], &numel);
    size_t es = elem_size(st.type);
    if (!overflow && numel) {
        /* the largest element index: offset + sum (size_d - 1) x stride_d */
        last = (uint64_t)off;
        for (int d = 0; d < nd; d++) {
            uint64_t t;
            overflow |= __builtin_mul_overflow((uint64_t)(size[d] - 1), (uint64_t)stride[d], &t);
            overflow |= __builtin_add_overflow(last, t, &last);
        }
        uint64_t end;
        overflow |= __builtin_add_overflow(last, 1, &end);
        overflow |= __builtin_mul_overflow(end, (uint64_t)es, &end);
        if (!overflow && end > (uint64_t)st.numel * es) overflow = 1;
    }
    if (overflow)
        return CH_ERROR(CH_ERR_FORMAT, "%s: '%s': offset %lld with its sizes and strides reaches "
                        "past its storage '%s' of %lld elements", p->label, name, (long long)off,
                        st.key, (long long)st.numel);
    if (st.type != CH_PK_G_FLOAT_STORAGE && st.type != CH_PK_G_LONG_STORAGE &&
        st.type != CH_PK_G_HALF_STORAGE && st.type != CH_PK_G_BFLOAT16_STORAGE &&
        st.type != CH_PK_G_DOUBLE_STORAGE)
        return CH_ERROR(CH_ERR_UNSUPPORTED, "%s: '%s' is a %s tensor: only float32/16/64, "
                        "bfloat16 (read as float32) and int64 are read", p->label, name,
                        ch_pk_global_name(st.type));
    out->name = name;
    out->dtype = st.type == CH_PK_G_LONG_STORAGE ? CH_ST_I64 : CH_ST_F32;
    out->ndim = nd;
    for (int d = 0; d < nd; d++) out->shape[d] = size[d];
    size_t osz = out->dtype == CH_ST_I64 ? 8 : 4;
    out->nbytes = (size_t)numel * osz;
    const unsigned char *src = st.data + (size_t)off * es;
    if (!numel) {
        out->data = st.data;
        return CH_OK;
    }
    int contig = 1;
    int64_t expect = 1;
    for (int d = nd; d-- > 0;) {
        if (size[d] != 1 && stride[d] != expect) contig = 0;
        expect *= size[d];
    }
    unsigned char *gathered = NULL;
    if (!contig) { /* gather in C order; whole rows when the last stride is 1 */
        gathered = own(p, (size_t)numel * es);
        if (!gathered) return own_failed(p, name, (size_t)numel * es);
        int64_t idx[CH_ST_MAX_DIMS] = {0};
        int inner = nd - 1;
        size_t row = (size_t)size[inner], k = 0;
        int rowcopy = stride[inner] == 1;
        for (;;) {
            size_t o = 0;
            for (int d = 0; d < inner; d++) o += (size_t)(idx[d] * stride[d]);
            if (rowcopy) {
                memcpy(gathered + k * es, src + o * es, row * es);
            } else {
                for (size_t j = 0; j < row; j++)
                    memcpy(gathered + (k + j) * es, src + (o + j * (size_t)stride[inner]) * es, es);
            }
            k += row;
            int d = inner - 1;
            while (d >= 0 && ++idx[d] == size[d]) idx[d--] = 0;
            if (d < 0) break;
        }
        src = gathered;
    }
    if (out->dtype == CH_ST_I64 || st.type == CH_PK_G_FLOAT_STORAGE) {
        out->data = src;
        return CH_OK;
    }
    float *f = own(p, out->nbytes);
    if (!f) return own_failed(p, name, out->nbytes);
    to_float(st.type, src, f, (size_t)numel);
    out->data = f;
    return CH_OK;
}

/* ------------------------------------------------------------ state dict */

static int is_tensor(const ch_pk_value_t *v)
{
    return v->kind == CH_PK_CALL &&
           (v->a->i == CH_PK_G_REBUILD_TENSOR_V2 || v->a->i == CH_PK_G_REBUILD_PARAMETER);
}

static int is_state_dict(const ch_pk_value_t *v)
{
    if (!v || v->kind != CH_PK_DICT || !v->n) return 0;
    for (size_t k = 0; k < v->n; k++)
        if (v->items[2 * k]->kind != CH_PK_STR || !is_tensor(v->items[2 * k + 1])) return 0;
    return 1;
}

/* "'epoch', 'model', 'optimizer'" (the first 8 str keys of d, then
 * "... (N keys)"; at most ~400 bytes). */
static void key_list(const ch_pk_value_t *d, char *buf, size_t len)
{
    size_t k = 0;
    buf[0] = 0;
    for (size_t i = 0; d->kind == CH_PK_DICT && i < d->n && k + 8 < len; i++) {
        if (i == 8) {
            snprintf(buf + k, len - k, ", ... (%zu keys)", d->n);
            break;
        }
        const ch_pk_value_t *key = d->items[2 * i];
        int w = key->kind == CH_PK_STR
                    ? snprintf(buf + k, len - k, "%s'%.60s'", i ? ", " : "", key->s)
                    : snprintf(buf + k, len - k, "%s<%s>", i ? ", " : "", ch_pk_kind_name(key->kind));
        if (w < 0 || (size_t)w >= len - k) {
            snprintf(buf + k, len - k, ", ...");
            break;
        }
        k += (size_t)w;
    }
}

static ch_status select_state_dict(ch_pth_t *p, const ch_pk_value_t *root, const char *state_key,
                                   const ch_pk_value_t **sd)
{
    static const char *const keys[] = {"model", "state_dict", "model_state_dict"};
    char list[480];
    *sd = NULL;
    if (state_key && state_key[0]) {
        const ch_pk_value_t *v = ch_pk_dict_get(root, state_key);
        if (is_state_dict(v)) {
            p->state_key = state_key;
            *sd = v;
            return CH_OK;
        }
        if (!v && is_state_dict(root))
            return CH_ERROR(CH_ERR_FORMAT, "%s: model.weights_key '%s': no such key; the file is "
                            "itself a state dict (%zu tensors): leave model.weights_key unset",
                            p->label, state_key, root->n);
        key_list(root, list, sizeof list);
        return CH_ERROR(CH_ERR_FORMAT, "%s: model.weights_key '%s': %s (top-level %s: %s)",
                        p->label, state_key, v ? "its value is not a state dict of tensors"
                                               : "no such key", ch_pk_kind_name(root->kind),
                        root->kind == CH_PK_DICT ? list : "not a dict");
    }
    if (is_state_dict(root)) {
        p->state_key = "";
        *sd = root;
        return CH_OK;
    }
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
        const ch_pk_value_t *v = ch_pk_dict_get(root, keys[k]);
        if (is_state_dict(v)) {
            p->state_key = keys[k];
            *sd = v;
            return CH_OK;
        }
    }
    if (root->kind != CH_PK_DICT)
        return CH_ERROR(CH_ERR_FORMAT, "%s: holds a %s, not a state dict (torch.save(model."
                        "state_dict(), path) writes one)", p->label, ch_pk_kind_name(root->kind));
    key_list(root, list, sizeof list);
    return CH_ERROR(CH_ERR_FORMAT, "%s: no state dict found: the top-level dict is not one of "
                    "tensors and none is under 'model', 'state_dict' or 'model_state_dict' "
                    "(keys: %s); name the key with model.weights_key", p->label, list);
}

static ch_status build_views(ch_pth_t *p, const ch_pk_value_t *root, const char *state_key)
{
    const ch_pk_value_t *sd;
    CH_TRY(select_state_dict(p, root, state_key, &sd));
    p->views = calloc(sd->n, sizeof *p->views);
    p->sorted = calloc(sd->n, sizeof *p->sorted);
    if (!p->views || !p->sorted) return CH_ERROR(CH_ERR_NOMEM, "%s: %zu tensors", p->label, sd->n);
    for (size_t k = 0; k < sd->n; k++) {
        const ch_pk_value_t *key = sd->items[2 * k];
        if (strlen(key->s) != key->len || !key->len)
            return CH_ERROR(CH_ERR_FORMAT, "%s: state dict entry %zu has an empty name or one "
                            "with a NUL byte", p->label, k);
        CH_TRY(build_tensor(p, key->s, sd->items[2 * k + 1], &p->views[k]));
        p->sorted[k] = &p->views[k];
        p->n = k + 1;
    }
    qsort(p->sorted, p->n, sizeof *p->sorted, cmp_view);
    for (size_t k = 1; k < p->n; k++)
        if (!strcmp(p->sorted[k - 1]->name, p->sorted[k]->name))
            return CH_ERROR(CH_ERR_FORMAT, "%s: state dict names '%s' twice", p->label,
                            p->sorted[k]->name);
    return CH_OK;
}

/* ------------------------------------------------------------ containers */

static ch_status open_zip(ch_pth_t *p, const char *state_key)
{
    CH_TRY(zip_records(p));
    const record_t *pkl = NULL;
    static const char tail[] = "/data.pkl";
    const size_t tl = sizeof tail - 1;
    for (size_t i = 0; i < p->nrec; i++) {
        const char *nm = p->rec[i].name;
        size_t l = strlen(nm);
        if (l <= tl || strcmp(nm + l - tl, tail) || memchr(nm, '/', l - tl)) continue;
        if (pkl)
            return CH_ERROR(CH_ERR_FORMAT, "%s: two pickles '%s' and '%s' in one archive",
                            p->label, pkl->name, nm);
        pkl = &p->rec[i];
    }
    if (!pkl)
        return CH_ERROR(CH_ERR_FORMAT, "%s: a zip archive without '<prefix>/data.pkl': not a "
                        "torch.save file", p->label);
    size_t plen = strlen(pkl->name) - tl;
    if (!(p->prefix = strndup(pkl->name, plen))) return CH_ERROR(CH_ERR_NOMEM, "%s", p->label);
    char bo[1100];
    snprintf(bo, sizeof bo, "%s/byteorder", p->prefix);
    const record_t *b = find_rec(p, bo);
    if (b && !(b->size >= 6 && !memcmp(p->buf + b->offset, "little", 6)))
        return CH_ERROR(CH_ERR_UNSUPPORTED, "%s: byteorder is not 'little': big-endian files are "
                        "not read", p->label);
    ch_pk_value_t *root;
    CH_TRY(ch_pk_load(p->pk, p->buf + pkl->offset, pkl->size, pkl->offset, &root, NULL));
    return build_views(p, root, state_key);
}

static ch_status open_legacy(ch_pth_t *p, const char *state_key)
{
    size_t pos = 0, used = 0;
    ch_pk_value_t *v[5];
    for (int k = 0; k < 5; k++) {
        CH_TRY(ch_pk_load(p->pk, p->buf + pos, p->size - pos, pos, &v[k], &used));
        pos += used;
        if (k == 0) {
            static const unsigned char magic[] = {0x6c, 0xfc, 0x9c, 0x46, 0xf9,
                                                  0x20, 0x6a, 0xa8, 0x50, 0x19};
            if (v[0]->kind != CH_PK_BIGINT || v[0]->len != sizeof magic ||
                memcmp(v[0]->s, magic, sizeof magic))
                return CH_ERROR(CH_ERR_FORMAT, "%s: not a legacy torch.save file (magic number)",
                                p->label);
        } else if (k == 1 && (v[1]->kind != CH_PK_INT || v[1]->i != 1001)) {
            return CH_ERROR(CH_ERR_FORMAT, "%s: legacy protocol version is not 1001", p->label);
        } else if (k == 2) {
            const ch_pk_value_t *le = ch_pk_dict_get(v[2], "little_endian");
            if (!le || le->kind != CH_PK_BOOL || !le->i)
                return CH_ERROR(CH_ERR_UNSUPPORTED, "%s: sys_info does not say little_endian: "
                                "big-endian files are not read", p->label);
        }
    }
    /* the storage list, then each storage's count and bytes in that order */
    const ch_pk_value_t *keys = v[4];
    if (keys->kind != CH_PK_LIST)
        return CH_ERROR(CH_ERR_FORMAT, "%s: the storage key list is a %s", p->label,
                        ch_pk_kind_name(keys->kind));
    ch_pk_value_t *const *pid;
    size_t npid = ch_pk_persids(p->pk, &pid);
    /* the storages the pickle declares, sorted by key (no quadratic search) */
    storage_t *decl = calloc(npid + 1, sizeof *decl);
    p->sto = calloc(keys->n + 1, sizeof *p->sto);
    if (!decl || !p->sto) {
        free(decl);
        return CH_ERROR(CH_ERR_NOMEM, "%s: %zu storages", p->label, keys->n);
    }
    ch_status s = CH_OK;
    for (size_t j = 0; j < npid && !s; j++) s = parse_persid(p, pid[j], &decl[j]);
    if (s) {
        free(decl);
        return s;
    }
    qsort(decl, npid, sizeof *decl, cmp_storage);
    for (size_t k = 0; k < keys->n && !s; k++) {
        const ch_pk_value_t *key = keys->items[k];
        if (key->kind != CH_PK_STR) {
            s = CH_ERROR(CH_ERR_FORMAT, "%s: storage key %zu is a %s", p->label, k,
                         ch_pk_kind_name(key->kind));
            break;
        }
        storage_t *st = &p->sto[k], want = {.key = key->s};
        const storage_t *d = bsearch(&want, decl, npid, sizeof *decl, cmp_storage);
        if (!d) {
            s = CH_ERROR(CH_ERR_FORMAT, "%s: storage '%s' of the key list is used by no tensor",
                         p->label, key->s);
            break;
        }
        *st = *d;
        s = storage_bytes(p, st, &pos);
        p->nsto = k + 1;
    }
    free(decl);
    if (s) return s;
    qsort(p->sto, p->nsto, sizeof *p->sto, cmp_storage);
    for (size_t k = 1; k < p->nsto; k++)
        if (!strcmp(p->sto[k - 1].key, p->sto[k].key))
            return CH_ERROR(CH_ERR_FORMAT, "%s: storage '%s' listed twice", p->label, p->sto[k].key);
    return build_views(p, v[3], state_key);
}

/* Legacy: storage st's element count (int64) and bytes at *pos, advanced. */
static ch_status storage_bytes(const ch_pth_t *p, storage_t *st, size_t *at)
{
    size_t pos = *at;
    if (p->size - pos < 8)
        return CH_ERROR(CH_ERR_FORMAT, "%s: truncated at storage '%s' (byte %zu)", p->label,
                        st->key, pos);
    uint64_t cnt = 0;
    for (int b = 8; b-- > 0;) cnt = cnt << 8 | p->buf[pos + (size_t)b];
    pos += 8;
    size_t es = elem_size(st->type);
    if (cnt != (uint64_t)st->numel || cnt > (p->size - pos) / es)
        return CH_ERROR(CH_ERR_FORMAT, "%s: storage '%s' at byte %zu: %llu elements (declared "
                        "%lld) do not fit in the %zu bytes left", p->label, st->key, pos - 8,
                        (unsigned long long)cnt, (long long)st->numel, p->size - pos);
    st->data = p->buf + pos;
    st->nbytes = (size_t)cnt * es;
    *at = pos + st->nbytes;
    return CH_OK;
}

static ch_status finish(ch_pth_t *p, const char *state_key, ch_pth_t **out)
{
    ch_status s;
    p->kind = ch_pth_detect(p->buf, p->size);
    if (p->kind == CH_PTH_NOT)
        s = CH_ERROR(CH_ERR_FORMAT, "%s: not a PyTorch .pth/.pt file (neither a zip archive nor "
                     "a legacy torch.save pickle)", p->label);
    else if ((s = ch_pk_create(p->label, NULL, &p->pk)) == CH_OK)
        s = p->kind == CH_PTH_ZIP ? open_zip(p, state_key) : open_legacy(p, state_key);
    if (s) {
        ch_pth_destroy(p);
        return s;
    }
    *out = p;
    return CH_OK;
}

static ch_pth_t *new_pth(const char *label)
{
    ch_pth_t *p = calloc(1, sizeof *p);
    if (p && !(p->label = strdup(label))) {
        free(p);
        p = NULL;
    }
    if (p) p->state_key = "";
    return p;
}

ch_status ch_pth_from_memory(const void *buf, size_t size, const char *label,
                             const char *state_key, ch_pth_t **out)
{
    *out = NULL;
    if (!label) label = "<memory>";
    if (!buf && size) return CH_ERROR(CH_ERR_INVALID, "%s: NULL buffer", label);
    ch_pth_t *p = new_pth(label);
    if (!p) return CH_ERROR(CH_ERR_NOMEM, "%s", label);
    p->buf = buf ? buf : (const unsigned char *)"";
    p->size = size;
    return finish(p, state_key, out);
}

ch_status ch_pth_open(const char *path, const char *state_key, ch_pth_t **out)
{
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return CH_ERROR(CH_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) || !S_ISREG(sb.st_mode)) {
        close(fd);
        return CH_ERROR(CH_ERR_IO, "'%s' is not a regular file", path);
    }
    ch_pth_t *p = new_pth(path);
    if (!p) {
        close(fd);
        return CH_ERROR(CH_ERR_NOMEM, "%s", path);
    }
    p->size = (size_t)sb.st_size;
    void *m = p->size ? mmap(NULL, p->size, PROT_READ, MAP_PRIVATE, fd, 0) : MAP_FAILED;
    if (m != MAP_FAILED) {
        p->map = m;
        p->map_size = p->size;
        p->buf = m;
    } else { /* no mmap (or an empty file): read it */
        size_t got = 0;
        p->owned_file = malloc(p->size ? p->size : 1);
        while (p->owned_file && got < p->size) {
            ssize_t r = pread(fd, p->owned_file + got, p->size - got, (off_t)got);
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) break;
            got += (size_t)r;
        }
        if (!p->owned_file || got != p->size) {
            ch_status code = p->owned_file ? CH_ERR_IO : CH_ERR_NOMEM;
            close(fd);
            ch_pth_destroy(p);
            return CH_ERROR(code, "reading '%s' failed", path);
        }
        p->buf = p->owned_file;
    }
    close(fd);
    return finish(p, state_key, out);
}

/* ------------------------------------------------------------ writer */

typedef struct {
    unsigned char *b;
    size_t n, cap;
    int oom;
} obuf_t;

static void put(obuf_t *o, const void *src, size_t n)
{
    if (o->oom) return;
    if (o->cap - o->n < n) {
        size_t cap = o->cap ? o->cap : 4096;
        while (cap - o->n < n) cap *= 2;
        unsigned char *b = realloc(o->b, cap);
        if (!b) {
            o->oom = 1;
            return;
        }
        o->b = b;
        o->cap = cap;
    }
    memcpy(o->b + o->n, src, n);
    o->n += n;
}

static void op(obuf_t *o, unsigned char c) { put(o, &c, 1); }

static void put_le(obuf_t *o, uint64_t v, int n)
{
    unsigned char b[8];
    for (int k = 0; k < n; k++) b[k] = (unsigned char)(v >> (8 * k));
    put(o, b, (size_t)n);
}

static void put_str(obuf_t *o, const char *s) /* BINUNICODE */
{
    size_t l = strlen(s);
    op(o, 'X');
    put_le(o, l, 4);
    put(o, s, l);
}

static void put_int(obuf_t *o, int64_t v) /* what pickle's save_long writes for protocol 2 */
{
    if (v >= 0 && v < 256) {
        op(o, 'K');
        put_le(o, (uint64_t)v, 1);
    } else if (v >= 0 && v < 65536) {
        op(o, 'M');
        put_le(o, (uint64_t)v, 2);
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
        op(o, 'J');
        put_le(o, (uint64_t)v, 4);
    } else {
        op(o, 0x8a);
        op(o, 8);
        put_le(o, (uint64_t)v, 8);
    }
}

static void put_global(obuf_t *o, const char *mod, const char *name)
{
    op(o, 'c');
    put(o, mod, strlen(mod));
    op(o, '\n');
    put(o, name, strlen(name));
    op(o, '\n');
}

static void put_ordered_dict(obuf_t *o) /* OrderedDict() */
{
    put_global(o, "collections", "OrderedDict");
    op(o, ')');
    op(o, 'R');
}

static void put_tensor(obuf_t *o, const ch_st_view_t *v, size_t key)
{
    char k[32];
    snprintf(k, sizeof k, "%zu", key);
    put_global(o, "torch._utils", "_rebuild_tensor_v2");
    op(o, '(');
    op(o, '(');
    put_str(o, "storage");
    put_global(o, "torch", v->dtype == CH_ST_I64 ? "LongStorage" : "FloatStorage");
    put_str(o, k);
    put_str(o, "cpu");
    put_int(o, ch_st_view_numel(v));
    op(o, 't');
    op(o, 'Q');
    put_int(o, 0);
    int64_t stride[CH_ST_MAX_DIMS], st = 1;
    for (int d = v->ndim; d-- > 0;) {
        stride[d] = st;
        st *= v->shape[d] > 1 ? v->shape[d] : 1;
    }
    for (int pass = 0; pass < 2; pass++) {
        op(o, '(');
        for (int d = 0; d < v->ndim; d++) put_int(o, pass ? stride[d] : v->shape[d]);
        op(o, 't');
    }
    op(o, 0x89); /* requires_grad False */
    put_ordered_dict(o);
    op(o, 't');
    op(o, 'R');
}

/* {prefix: {"version": v}} for each of modules[0..nm) (the _metadata dict's items). */
static void put_module_versions(obuf_t *o, const ch_pth_module_t *modules, size_t nm)
{
    if (nm) op(o, '(');
    for (size_t j = 0; j < nm; j++) {
        put_str(o, modules[j].prefix);
        op(o, '}');
        put_str(o, "version");
        put_int(o, modules[j].version);
        op(o, 's');
    }
    if (nm) op(o, 'u');
}

/* The state dict's _metadata: {prefix: {"version": v}} for "" and every
 * module prefix of the names, in first-appearance (pre-)order; or, when
 * modules is not NULL, exactly modules[0..n_modules). */
static ch_status put_metadata(obuf_t *o, const ch_st_view_t *views, size_t n,
                              const ch_pth_module_t *modules, size_t n_modules)
{
    if (modules) {
        op(o, '}');
        put_str(o, "_metadata");
        put_ordered_dict(o);
        put_module_versions(o, modules, n_modules);
        op(o, 's');
        return CH_OK;
    }
    size_t cap = 64, nm = 0;
    char **mods = calloc(cap, sizeof *mods);
    ch_status s = CH_OK;
    if (!mods) return CH_ERROR(CH_ERR_NOMEM, "pth writer: %zu names", n);
    if (!(mods[nm++] = strdup(""))) s = CH_ERROR(CH_ERR_NOMEM, "pth writer");
    for (size_t i = 0; i < n && !s; i++) {
        const char *nm_ = views[i].name;
        for (const char *dot = strchr(nm_, '.'); dot && !s; dot = strchr(dot + 1, '.')) {
            size_t l = (size_t)(dot - nm_), j = nm;
                    while (j-- > 1)
                if (strlen(mods[j]) == l && !strncmp(mods[j], nm_, l)) break;
            if (j > 0) continue;
            if (nm == cap) {
                char **g = realloc(mods, 2 * cap * sizeof *mods);
                if (!g) {
                    s = CH_ERROR(CH_ERR_NOMEM, "pth writer");
                    break;
                }
                mods = g;
                cap *= 2;
            }
            if (!(mods[nm] = strndup(nm_, l))) s = CH_ERROR(CH_ERR_NOMEM, "pth writer");
            else nm++;
        }
    }
    ch_pth_module_t *list = s ? NULL : calloc(nm ? nm : 1, sizeof *list);
    if (!s && !list) s = CH_ERROR(CH_ERR_NOMEM, "pth writer");
    for (size_t j = 0; j < nm && !s; j++) {
        size_t l = strlen(mods[j]);
        int version = 1;
        for (size_t i = 0; i < n && version == 1; i++) {
            const char *nm_ = views[i].name;
            if (l ? !strncmp(nm_, mods[j], l) && !strcmp(nm_ + l, ".running_mean")
                  : !strcmp(nm_, "running_mean"))
                version = 2; /* BatchNorm's _version */
        }
        list[j] = (ch_pth_module_t){mods[j], version};
    }
    if (!s) s = put_metadata(o, views, n, list, nm);
    free(list);
    for (size_t j = 0; j < nm; j++) free(mods[j]);
    free(mods);
    return s;
}

static ch_status check_views(const char *path, const ch_st_view_t *views, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const ch_st_view_t *v = &views[i];
        if (!v->name || !v->name[0] || (v->dtype != CH_ST_F32 && v->dtype != CH_ST_I64) ||
            v->ndim < 0 || v->ndim > CH_ST_MAX_DIMS)
            return CH_ERROR(CH_ERR_INVALID, "%s: tensor %zu ('%s'): empty name, dtype other than "
                            "F32/I64 or more than %d dims", path, i, v->name ? v->name : "",
                            CH_ST_MAX_DIMS);
        for (int d = 0; d < v->ndim; d++)
            if (v->shape[d] < 0)
                return CH_ERROR(CH_ERR_INVALID, "%s: '%s': negative size", path, v->name);
        if ((int64_t)v->nbytes != ch_st_view_numel(v) * (int64_t)ch_st_dtype_size(v->dtype) ||
            (v->nbytes && !v->data))
            return CH_ERROR(CH_ERR_INVALID, "%s: '%s': %zu bytes for its shape and dtype", path,
                            v->name, v->nbytes);
        for (size_t j = 0; j < i; j++)
            if (!strcmp(views[j].name, v->name))
                return CH_ERROR(CH_ERR_INVALID, "%s: tensor name '%s' appears twice", path, v->name);
    }
    return CH_OK;
}

/* One STORED record with its data 64-byte aligned in the file (torch's
 * PyTorchStreamWriter pads the local header's extra field, id "FB").
 * *pos: offset of the next local header, advanced. */
static int zip_record(zipFile zf, uint64_t *pos, const char *name, const void *data, size_t size)
{
    unsigned char extra[4 + 128];
    int zip64 = size >= 0xffffffffu || *pos >= 0xffffffffu;
    uint64_t hdr = *pos + 30 + strlen(name) + (zip64 ? 20 : 0);
    size_t pad = (size_t)((64 - (hdr + 4) % 64) % 64) + 4;
    extra[0] = 'F';
    extra[1] = 'B';
    extra[2] = (unsigned char)(pad - 4);
    extra[3] = 0;
    memset(extra + 4, 'Z', pad - 4);
    zip_fileinfo zi;
    memset(&zi, 0, sizeof zi);
    if (zipOpenNewFileInZip64(zf, name, &zi, extra, (uInt)pad, NULL, 0, NULL, 0, 0, zip64) != ZIP_OK)
        return -1;
    const unsigned char *p = data;
    for (size_t done = 0; done < size;) {
        size_t c = size - done > ((size_t)1 << 30) ? (size_t)1 << 30 : size - done;
        if (zipWriteInFileInZip(zf, p + done, (unsigned)c) != ZIP_OK) return -1;
        done += c;
    }
    if (zipCloseFileInZip(zf) != ZIP_OK) return -1;
    *pos = hdr + pad + size;
    return 0;
}

ch_status ch_pth_write(const char *path, const ch_st_view_t *views, size_t n)
{
    return ch_pth_write_modules(path, views, n, NULL, 0);
}

ch_status ch_pth_write_modules(const char *path, const ch_st_view_t *views, size_t n,
                               const ch_pth_module_t *modules, size_t n_modules)
{
    CH_REQUIRE(path && (views || !n), "ch_pth_write: NULL argument");
    for (size_t j = 0; j < n_modules; j++)
        CH_REQUIRE(modules[j].prefix, "ch_pth_write_modules: module %zu has no prefix", j);
    CH_TRY(check_views(path, views, n));
    obuf_t o = {0};
    op(&o, 0x80);
    op(&o, 2);
    put_ordered_dict(&o);
    for (size_t i = 0; i < n; i++) {
        if (i % 1000 == 0) op(&o, '(');
        put_str(&o, views[i].name);
        put_tensor(&o, &views[i], i);
        if (i % 1000 == 999 || i + 1 == n) op(&o, 'u');
    }
    ch_status s = put_metadata(&o, views, n, modules, n_modules);
    op(&o, 'b');
    op(&o, '.');
    if (!s && o.oom) s = CH_ERROR(CH_ERR_NOMEM, "%s: pickle", path);
    ch_atomic_file_t *af = NULL;
    if (!s) s = ch_atomic_file_open(path, &af);
    if (s) {
        free(o.b);
        return s;
    }
    zipFile zf = zipOpen64(ch_atomic_file_temp_path(af), APPEND_STATUS_CREATE);
    uint64_t pos = 0;
    int bad = !zf || zip_record(zf, &pos, "archive/data.pkl", o.b, o.n);
    for (size_t i = 0; i < n && !bad; i++) {
        char name[48];
        snprintf(name, sizeof name, "archive/data/%zu", i);
        bad = zip_record(zf, &pos, name, views[i].data, views[i].nbytes);
    }
    if (!bad) bad = zip_record(zf, &pos, "archive/version", "3\n", 2);
    if (zf && zipClose(zf, NULL) != ZIP_OK) bad = 1;
    free(o.b);
    if (bad) {
        int e = errno;
        ch_atomic_file_abort(af);
        return CH_ERROR(CH_ERR_IO, "writing '%s' failed: %s", path, e ? strerror(e) : "zip error");
    }
    return ch_atomic_file_commit(af);
}
