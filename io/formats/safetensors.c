/* cohort: safetensors reader and writer (see safetensors.h). */
#include "config.h"

#include "io/formats/safetensors.h"
#include "io/state/atomic_file.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "io/formats/safetensors.c assumes a little-endian host (tensor bytes are stored as they are in memory)"
#endif

#define META_KEY "__metadata__"
/* Longest tensor name quoted in a message. */
#define NM "%.200s"

struct ch_safetensors {
    char *source;              /* path or label */
    unsigned char *owned;      /* buffer we own (file contents or copy), or NULL */
    void *map;                 /* read-only mapping of the file, or NULL */
    size_t map_size;
    const unsigned char *buf;  /* the whole file */
    size_t size;
    json_t *root;              /* parsed header; names and metadata point into it */
    ch_st_view_t *views;       /* file order */
    size_t n;
    size_t *by_name;           /* indices into views, sorted by name */
    ch_st_meta_t *meta;
    size_t nmeta;
};

size_t ch_st_dtype_size(ch_st_dtype_t dtype)
{
    switch (dtype) {
    case CH_ST_F32: return 4;
    case CH_ST_I64: return 8;
    }
    return 0;
}

const char *ch_st_dtype_name(ch_st_dtype_t dtype)
{
    switch (dtype) {
    case CH_ST_F32: return "F32";
    case CH_ST_I64: return "I64";
    }
    return "?";
}

int64_t ch_st_view_numel(const ch_st_view_t *v)
{
    int64_t n = 1;
    for (int i = 0; i < v->ndim; i++) n *= v->shape[i];
    return n;
}

/* Dtypes of the safetensors format that cohort does not handle. */
static const char *const other_dtypes[] = {
    "BOOL", "U8",  "I8",  "F8_E5M2", "F8_E4M3", "F8_E8M0", "F4", "F6_E2M3", "F6_E3M2",
    "I16",  "U16", "F16", "BF16",    "I32",     "U32",     "F64", "U64",    "C64",
};

static ch_status parse_dtype(const char *src, const char *name, const char *s, ch_st_dtype_t *out)
{
    if (!strcmp(s, "F32")) {
        *out = CH_ST_F32;
        return CH_OK;
    }
    if (!strcmp(s, "I64")) {
        *out = CH_ST_I64;
        return CH_OK;
    }
    for (size_t i = 0; i < sizeof other_dtypes / sizeof other_dtypes[0]; i++)
        if (!strcmp(s, other_dtypes[i]))
            return CH_ERROR(CH_ERR_UNSUPPORTED,
                            "%s: tensor '" NM "' has dtype %s; cohort reads only F32 and I64 tensors",
                            src, name, s);
    return CH_ERROR(CH_ERR_FORMAT, "%s: tensor '" NM "' has unknown dtype '%.40s'", src, name, s);
}

/* A JSON value as a non-negative integer. */
static int json_uint(const json_t *v, uint64_t *out)
{
    json_int_t i;
    if (!json_is_integer(v)) return 0;
    i = json_integer_value(v);
    if (i < 0) return 0;
    *out = (uint64_t)i;
    return 1;
}

static const char *json_kind(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return json_integer_value(v) < 0 ? "a negative integer" : "an integer";
    case JSON_REAL: return "a non-integer number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "?";
}

typedef struct {
    uint64_t begin, end;
    size_t order; /* position in the JSON object, to keep sorting total */
} span_t;

/* Parse one tensor entry into v (name set by caller) and its span. */
static ch_status parse_entry(const char *src, const char *name, const json_t *e, ch_st_view_t *v,
                             span_t *sp)
{
    const json_t *dt, *shape, *offs;
    uint64_t numel = 1, nbytes;
    size_t ndim;

    if (!json_is_object(e))
        return CH_ERROR(CH_ERR_FORMAT, "%s: tensor '" NM "': entry is %s, expected an object with dtype, shape, data_offsets",
                        src, name, json_kind(e));
    dt = json_object_get(e, "dtype");
    shape = json_object_get(e, "shape");
    offs = json_object_get(e, "data_offsets");
    if (!dt) return CH_ERROR(CH_ERR_FORMAT, "%s: tensor '" NM "': missing \"dtype\"", src, name);
    if (!shape) return CH_ERROR(CH_ERR_FORMAT, "%s: tensor '" NM "': missing \"shape\"", src, name);
    if (!offs) return CH_ERROR(CH_ERR_FORMAT, "%s: tensor '" NM "': missing \"data_offsets\"", src, name);
    if (!json_is_string(dt))
        return CH_ERROR(CH_ERR_FORMAT, "%s: tensor '" NM "': \"dtype\" is %s, expected a string", src,
                        name, json_kind(dt));
    CH_TRY(parse_dtype(src, name, json_string_value(dt), &v->dtype));

    if (!json_is_array(shape))
        return CH_ERROR(CH_ERR_FORMAT, "%s: tensor '" NM "': \"shape\" is %s, expected an array", src,
                        name, json_kind(shape));
    ndim = json_array_size(shape);
    if (ndim > CH_ST_MAX_DIMS)
        return CH_ERROR(CH_ERR_UNSUPPORTED, "%s: tensor '" NM "' has %zu dimensions; cohort handles at most %d",
                        src, name, ndim, CH_ST_MAX_DIMS);
    v->ndim = (int)ndim;
    for (size_t i = 0; i < ndim; i++) {
        uint64_t d;
        const json_t *x = json_array_get(shape, i);
        if (!json_uint(x, &d))
            return CH_ERROR(CH_ERR_FORMAT, "%s: tensor '" NM "': shape[%zu] is %s, expected a non-negative integer",
                            src, name, i, json_kind(x));
        v->shape[i] = (int64_t)d;
        if (__builtin_mul_overflow(numel, d, &numel))
            return CH_ERROR(CH_ERR_FORMAT, "%s: tensor '" NM "': the element count of its shape overflows 64 bits",
                            src, name);
    }
    if (__builtin_mul_overflow(numel, (uint64_t)ch_st_dtype_size(v->dtype), &nbytes))
        return CH_ERROR(CH_ERR_FORMAT, "%s: tensor '" NM "': its byte size (shape x %zu) overflows 64 bits",
                        src, name, ch_st_dtype_size(v->dtype));

    if (!json_is_array(offs) || json_array_size(offs) != 2 ||
        !json_uint(json_array_get(offs, 0), &sp->begin) ||
        !json_uint(json_array_get(offs, 1), &sp->end))
        return CH_ERROR(CH_ERR_FORMAT, "%s: tensor '" NM "': \"data_offsets\" must be an array of two non-negative integers [begin, end]",
                        src, name);
    if (sp->begin > sp->end)
        return CH_ERROR(CH_ERR_FORMAT, "%s: tensor '" NM "': data_offsets [%llu, %llu] has begin > end", src,
                        name, (unsigned long long)sp->begin, (unsigned long long)sp->end);
    if (sp->end - sp->begin != nbytes)
        return CH_ERROR(CH_ERR_FORMAT, "%s: tensor '" NM "': shape and dtype %s give %llu bytes but data_offsets [%llu, %llu] hold %llu",
                        src, name, ch_st_dtype_name(v->dtype), (unsigned long long)nbytes,
                        (unsigned long long)sp->begin, (unsigned long long)sp->end,
                        (unsigned long long)(sp->end - sp->begin));
    v->nbytes = (size_t)nbytes;
    return CH_OK;
}

/* qsort contexts (no qsort_r needed: sort index arrays with a file-static
 * pointer would not be thread-safe, so sort small structs instead). */
typedef struct {
    span_t span;
    ch_st_view_t view;
} entry_t;

static int cmp_entry(const void *a, const void *b)
{
    const entry_t *x = a, *y = b;
    if (x->span.begin != y->span.begin) return x->span.begin < y->span.begin ? -1 : 1;
    if (x->span.end != y->span.end) return x->span.end < y->span.end ? -1 : 1;
    return x->span.order < y->span.order ? -1 : x->span.order > y->span.order;
}

typedef struct {
    const char *name;
    size_t index;
} name_idx_t;

static int cmp_name(const void *a, const void *b)
{
    return strcmp(((const name_idx_t *)a)->name, ((const name_idx_t *)b)->name);
}

/* Check the file size and the 8-byte header length (first8: the first 8
 * bytes, read only when size >= 8). */
static ch_status check_prefix(const char *src, size_t size, const unsigned char *first8,
                              uint64_t *hlen_out)
{
    uint64_t hlen = 0;
    if (size < 8)
        return CH_ERROR(CH_ERR_FORMAT, "%s: %zu bytes, too short for a safetensors file (it starts with an 8-byte header length)",
                        src, size);
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)first8[i] << (8 * i);
    if (hlen < 2)
        return CH_ERROR(CH_ERR_FORMAT, "%s: header length %llu is too small (a JSON object needs at least 2 bytes)",
                        src, (unsigned long long)hlen);
    if (hlen > CH_ST_MAX_HEADER)
        return CH_ERROR(CH_ERR_FORMAT, "%s: header length %llu exceeds the limit of %u bytes (not a safetensors file?)",
                        src, (unsigned long long)hlen, CH_ST_MAX_HEADER);
    if (hlen > size - 8)
        return CH_ERROR(CH_ERR_FORMAT, "%s: header length %llu exceeds the %zu bytes after the length field (truncated file?)",
                        src, (unsigned long long)hlen, size - 8);
    *hlen_out = hlen;
    return CH_OK;
}

static ch_status parse(ch_safetensors_t *st)
{
    const char *src = st->source;
    const unsigned char *b = st->buf;
    uint64_t hlen = 0, data_len, pos = 0;
    json_error_t jerr;
    json_t *meta = NULL;
    const char *key;
    json_t *val;
    entry_t *ents = NULL;
    name_idx_t *names = NULL;
    size_t n, i, k;
    ch_status s = CH_OK;

    CH_TRY(check_prefix(src, st->size, b, &hlen));
    data_len = st->size - 8 - hlen;

    st->root = json_loadb((const char *)b + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!st->root)
        return CH_ERROR(CH_ERR_FORMAT, "%s: header is not valid JSON: %s (header line %d, column %d)", src,
                        jerr.text, jerr.line, jerr.column);
    if (!json_is_object(st->root))
        return CH_ERROR(CH_ERR_FORMAT, "%s: header is %s, expected a JSON object", src,
                        json_kind(st->root));

    meta = json_object_get(st->root, META_KEY);
    n = json_object_size(st->root) - (meta ? 1 : 0);
    if (meta) {
        if (!json_is_object(meta))
            return CH_ERROR(CH_ERR_FORMAT, "%s: \"" META_KEY "\" is %s, expected an object of strings", src,
                            json_kind(meta));
        st->meta = calloc(json_object_size(meta) ? json_object_size(meta) : 1, sizeof *st->meta);
        if (!st->meta) return CH_ERROR(CH_ERR_NOMEM, "%s: out of memory", src);
        json_object_foreach(meta, key, val) {
            if (!json_is_string(val))
                return CH_ERROR(CH_ERR_FORMAT, "%s: \"" META_KEY "\" entry '" NM "' is %s, expected a string",
                                src, key, json_kind(val));
            st->meta[st->nmeta].key = key;
            st->meta[st->nmeta].value = json_string_value(val);
            st->nmeta++;
        }
    }

    ents = calloc(n ? n : 1, sizeof *ents);
    names = calloc(n ? n : 1, sizeof *names);
    st->views = calloc(n ? n : 1, sizeof *st->views);
    st->by_name = calloc(n ? n : 1, sizeof *st->by_name);
    if (!ents || !names || !st->views || !st->by_name) {
        s = CH_ERROR(CH_ERR_NOMEM, "%s: out of memory for %zu tensor entries", src, n);
        goto out;
    }
    k = 0;
    json_object_foreach(st->root, key, val) {
        if (!strcmp(key, META_KEY)) continue;
        ents[k].view.name = key;
        ents[k].span.order = k;
        s = parse_entry(src, key, val, &ents[k].view, &ents[k].span);
        if (s) goto out;
        k++;
    }
    qsort(ents, n, sizeof *ents, cmp_entry);
    for (i = 0; i < n; i++) {
        const span_t *sp = &ents[i].span;
        if (sp->begin != pos) {
            if (sp->begin < pos)
                s = CH_ERROR(CH_ERR_FORMAT, "%s: tensor '" NM "' (data_offsets [%llu, %llu]) overlaps tensor '" NM "' (which ends at %llu)",
                             src, ents[i].view.name, (unsigned long long)sp->begin,
                             (unsigned long long)sp->end, ents[i - 1].view.name,
                             (unsigned long long)pos);
            else
                s = CH_ERROR(CH_ERR_FORMAT, "%s: %llu unused bytes before tensor '" NM "' (data_offsets [%llu, %llu]); tensors must cover the data area contiguously",
                             src, (unsigned long long)(sp->begin - pos), ents[i].view.name,
                             (unsigned long long)sp->begin, (unsigned long long)sp->end);
            goto out;
        }
        if (sp->end > data_len) {
            s = CH_ERROR(CH_ERR_FORMAT, "%s: tensor '" NM "': data_offsets [%llu, %llu] run past the end of the %llu-byte data area (truncated file?)",
                         src, ents[i].view.name, (unsigned long long)sp->begin,
                         (unsigned long long)sp->end, (unsigned long long)data_len);
            goto out;
        }
        pos = sp->end;
    }
    if (pos != data_len) {
        s = CH_ERROR(CH_ERR_FORMAT, "%s: tensors cover %llu bytes but the data area after the header holds %llu (trailing bytes)",
                     src, (unsigned long long)pos, (unsigned long long)data_len);
        goto out;
    }
    for (i = 0; i < n; i++) {
        st->views[i] = ents[i].view;
        st->views[i].data = b + 8 + hlen + ents[i].span.begin;
        names[i].name = st->views[i].name;
        names[i].index = i;
    }
    qsort(names, n, sizeof *names, cmp_name);
    for (i = 0; i < n; i++) st->by_name[i] = names[i].index;
    st->n = n;
out:
    free(ents);
    free(names);
    return s;
}

static ch_status finish_open(ch_safetensors_t *st, ch_safetensors_t **out)
{
    ch_status s = parse(st);
    if (s) {
        ch_safetensors_destroy(st);
        return s;
    }
    *out = st;
    return CH_OK;
}

static ch_safetensors_t *new_st(const char *source)
{
    ch_safetensors_t *st = calloc(1, sizeof *st);
    if (!st) return NULL;
    st->source = strdup(source ? source : "<memory>");
    if (!st->source) {
        free(st);
        return NULL;
    }
    return st;
}

ch_status ch_safetensors_open(const char *path, ch_safetensors_t **out)
{
    ch_safetensors_t *st;
    struct stat sb;
    int fd;
    size_t got = 0;
    ch_status s;

    *out = NULL;
    if (!path) return CH_ERROR(CH_ERR_INVALID, "safetensors: NULL path");
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return CH_ERROR(CH_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
    if (fstat(fd, &sb) != 0) {
        s = CH_ERROR(CH_ERR_IO, "cannot stat '%s': %s", path, strerror(errno));
        close(fd);
        return s;
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return CH_ERROR(CH_ERR_IO, "'%s' is not a regular file", path);
    }
    st = new_st(path);
    if (!st) {
        close(fd);
        return CH_ERROR(CH_ERR_NOMEM, "%s: out of memory", path);
    }
    st->size = (size_t)sb.st_size;
    /* Check the header length before allocating the whole file. */
    {
        unsigned char h[8] = {0};
        uint64_t hlen;
        errno = 0;
        if (st->size >= 8 && pread(fd, h, 8, 0) != 8) {
            s = CH_ERROR(CH_ERR_IO, "reading '%s' failed: %s", path, strerror(errno ? errno : EIO));
            close(fd);
            ch_safetensors_destroy(st);
            return s;
        }
        s = check_prefix(path, st->size, h, &hlen);
        if (s) {
            close(fd);
            ch_safetensors_destroy(st);
            return s;
        }
    }
    /* Map the file (zero copy; pages are read when the data is used). */
    {
        const char *no = getenv("COHORT_SAFETENSORS_NO_MMAP");
        st->map = no && no[0] && strcmp(no, "0") != 0
                      ? MAP_FAILED
                      : mmap(NULL, st->size, PROT_READ, MAP_PRIVATE, fd, 0);
    }
    if (st->map != MAP_FAILED) {
        close(fd);
        st->map_size = st->size;
        st->buf = st->map;
        return finish_open(st, out);
    }
    st->map = NULL; /* e.g. a file system without mmap: read it instead */
    if (posix_memalign((void **)&st->owned, 64, st->size ? st->size : 1) != 0) {
        close(fd);
        s = CH_ERROR(CH_ERR_NOMEM, "%s: out of memory reading %zu bytes", path, st->size);
        ch_safetensors_destroy(st);
        return s;
    }
    while (got < st->size) {
        ssize_t r = pread(fd, st->owned + got, st->size - got, (off_t)got);
        if (r < 0) {
            if (errno == EINTR) continue;
            s = CH_ERROR(CH_ERR_IO, "reading '%s' failed: %s", path, strerror(errno));
            close(fd);
            ch_safetensors_destroy(st);
            return s;
        }
        if (r == 0) break; /* shrank while reading */
        got += (size_t)r;
    }
    close(fd);
    if (got != st->size) {
        s = CH_ERROR(CH_ERR_IO, "reading '%s': file shrank from %zu to %zu bytes while being read", path,
                     st->size, got);
        ch_safetensors_destroy(st);
        return s;
    }
    st->buf = st->owned;
    return finish_open(st, out);
}

ch_status ch_safetensors_from_memory(const void *buf, size_t size,
                                     const char *label, int copy, ch_safetensors_t **out)
{
    ch_safetensors_t *st;
    *out = NULL;
    if (!buf && size) return CH_ERROR(CH_ERR_INVALID, "safetensors: NULL buffer of %zu bytes", size);
    st = new_st(label);
    if (!st) return CH_ERROR(CH_ERR_NOMEM, "safetensors: out of memory");
    st->size = size;
    if (copy) {
        if (posix_memalign((void **)&st->owned, 64, size ? size : 1) != 0) {
            ch_safetensors_destroy(st);
            return CH_ERROR(CH_ERR_NOMEM, "%s: out of memory copying %zu bytes", label ? label : "<memory>",
                            size);
        }
        if (size) memcpy(st->owned, buf, size);
        st->buf = st->owned;
    } else {
        st->buf = buf;
    }
    return finish_open(st, out);
}

void ch_safetensors_destroy(ch_safetensors_t *st)
{
    if (!st) return;
    if (st->root) json_decref(st->root);
    free(st->views);
    free(st->by_name);
    free(st->meta);
    free(st->owned);
    if (st->map) munmap(st->map, st->map_size);
    free(st->source);
    free(st);
}

const char *ch_safetensors_source(const ch_safetensors_t *st) { return st->source; }

size_t ch_safetensors_count(const ch_safetensors_t *st) { return st->n; }

const ch_st_view_t *ch_safetensors_at(const ch_safetensors_t *st, size_t i)
{
    return i < st->n ? &st->views[i] : NULL;
}

const ch_st_view_t *ch_safetensors_find(const ch_safetensors_t *st, const char *name)
{
    size_t lo = 0, hi = st->n;
    if (!name) return NULL;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const ch_st_view_t *v = &st->views[st->by_name[mid]];
        int c = strcmp(name, v->name);
        if (c == 0) return v;
        if (c < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return NULL;
}

ch_status ch_safetensors_get(const ch_safetensors_t *st, const char *name, const ch_st_view_t **out)
{
    *out = ch_safetensors_find(st, name);
    if (!*out)
        return CH_ERROR(CH_ERR_INVALID, "%s: no tensor named '" NM "' (the file holds %zu tensors)",
                        st->source, name ? name : "(null)", st->n);
    return CH_OK;
}

static void format_shape(char *buf, size_t size, int ndim, const int64_t *shape)
{
    size_t used = 0;
    int w = snprintf(buf, size, "(");
    used = w > 0 ? (size_t)w : 0;
    for (int i = 0; i < ndim && used < size; i++) {
        w = snprintf(buf + used, size - used, "%s%lld", i ? ", " : "", (long long)shape[i]);
        if (w > 0) used += (size_t)w;
    }
    if (used < size) snprintf(buf + used, size - used, ")");
}

ch_status ch_safetensors_read_into(const ch_safetensors_t *st, const char *name,
                                   ch_st_dtype_t dtype, int ndim, const int64_t *shape,
                                   void *dst, size_t nbytes)
{
    const ch_st_view_t *v;
    int same = 1;
    CH_TRY(ch_safetensors_get(st, name, &v));
    if (v->dtype != dtype)
        return CH_ERROR(CH_ERR_INVALID, "%s: tensor '" NM "' has dtype %s, expected %s", st->source,
                        name, ch_st_dtype_name(v->dtype), ch_st_dtype_name(dtype));
    if (v->ndim != ndim) same = 0;
    for (int i = 0; same && i < ndim; i++)
        if (v->shape[i] != shape[i]) same = 0;
    if (!same) {
        char a[256], b[256];
        format_shape(a, sizeof a, v->ndim, v->shape);
        format_shape(b, sizeof b, ndim, shape);
        return CH_ERROR(CH_ERR_INVALID, "%s: tensor '" NM "' has shape %s, expected %s", st->source,
                        name, a, b);
    }
    if (v->nbytes != nbytes)
        return CH_ERROR(CH_ERR_INVALID, "%s: tensor '" NM "' holds %zu bytes, destination has %zu",
                        st->source, name, v->nbytes, nbytes);
    if (nbytes) memcpy(dst, v->data, nbytes);
    return CH_OK;
}

size_t ch_safetensors_meta_count(const ch_safetensors_t *st) { return st->nmeta; }

const ch_st_meta_t *ch_safetensors_meta_at(const ch_safetensors_t *st, size_t i)
{
    return i < st->nmeta ? &st->meta[i] : NULL;
}

const char *ch_safetensors_meta_get(const ch_safetensors_t *st, const char *key)
{
    for (size_t i = 0; key && i < st->nmeta; i++)
        if (!strcmp(st->meta[i].key, key)) return st->meta[i].value;
    return NULL;
}

/* ------------------------------------------------------------------ writer */

/* Build the padded header for views/meta. *header is malloc'd, *hlen a
 * multiple of 8 minus 0 (8 + hlen is a multiple of 8); *data_len the sum of
 * the tensors' bytes. */
static ch_status build_header(const ch_st_view_t *views, size_t n, const ch_st_meta_t *meta,
                              size_t nmeta, char **header, size_t *hlen, uint64_t *data_len)
{
    json_t *root = json_object(), *m = NULL;
    uint64_t off = 0;
    char *text = NULL, *padded;
    size_t len, plen;
    ch_status s = CH_OK;

    *header = NULL;
    if (!root) return CH_ERROR(CH_ERR_NOMEM, "safetensors header: out of memory");
    if (n && !views) {
        s = CH_ERROR(CH_ERR_INVALID, "safetensors write: NULL views for %zu tensors", n);
        goto out;
    }
    if (nmeta) {
        if (!meta) {
            s = CH_ERROR(CH_ERR_INVALID, "safetensors write: NULL metadata for %zu entries", nmeta);
            goto out;
        }
        m = json_object();
        if (!m || json_object_set_new(root, META_KEY, m) != 0) {
            s = CH_ERROR(CH_ERR_NOMEM, "safetensors header: out of memory");
            goto out;
        }
        for (size_t i = 0; i < nmeta; i++) {
            json_t *v;
            if (!meta[i].key || !meta[i].value) {
                s = CH_ERROR(CH_ERR_INVALID, "safetensors write: metadata entry %zu has a NULL %s", i,
                             meta[i].key ? "value" : "key");
                goto out;
            }
            if (json_object_get(m, meta[i].key)) {
                s = CH_ERROR(CH_ERR_INVALID, "safetensors write: metadata key '" NM "' given twice",
                             meta[i].key);
                goto out;
            }
            v = json_string(meta[i].value);
            if (!v || json_object_set_new(m, meta[i].key, v) != 0) {
                s = CH_ERROR(CH_ERR_INVALID, "safetensors write: metadata '" NM "' is not valid UTF-8",
                             meta[i].key);
                goto out;
            }
        }
    }
    for (size_t i = 0; i < n; i++) {
        const ch_st_view_t *v = &views[i];
        json_t *e, *shape, *offs;
        uint64_t numel = 1, nbytes;
        if (!v->name || !v->name[0]) {
            s = CH_ERROR(CH_ERR_INVALID, "safetensors write: tensor %zu has an empty name", i);
            goto out;
        }
        if (!strcmp(v->name, META_KEY)) {
            s = CH_ERROR(CH_ERR_INVALID, "safetensors write: a tensor may not be called '" META_KEY "'");
            goto out;
        }
        if (json_object_get(root, v->name)) {
            s = CH_ERROR(CH_ERR_INVALID, "safetensors write: tensor name '" NM "' given twice", v->name);
            goto out;
        }
        if (ch_st_dtype_size(v->dtype) == 0) {
            s = CH_ERROR(CH_ERR_INVALID, "safetensors write: tensor '" NM "' has invalid dtype %d", v->name,
                         (int)v->dtype);
            goto out;
        }
        if (v->ndim < 0 || v->ndim > CH_ST_MAX_DIMS) {
            s = CH_ERROR(CH_ERR_INVALID, "safetensors write: tensor '" NM "' has ndim %d, expected 0..%d",
                         v->name, v->ndim, CH_ST_MAX_DIMS);
            goto out;
        }
        for (int d = 0; d < v->ndim; d++) {
            if (v->shape[d] < 0 || __builtin_mul_overflow(numel, (uint64_t)v->shape[d], &numel)) {
                s = CH_ERROR(CH_ERR_INVALID, "safetensors write: tensor '" NM "' has invalid shape[%d] = %lld",
                             v->name, d, (long long)v->shape[d]);
                goto out;
            }
        }
        if (__builtin_mul_overflow(numel, (uint64_t)ch_st_dtype_size(v->dtype), &nbytes) ||
            nbytes != v->nbytes) {
            s = CH_ERROR(CH_ERR_INVALID, "safetensors write: tensor '" NM "': shape and dtype %s need %llu bytes, view has %zu",
                         v->name, ch_st_dtype_name(v->dtype), (unsigned long long)nbytes, v->nbytes);
            goto out;
        }
        if (v->nbytes && !v->data) {
            s = CH_ERROR(CH_ERR_INVALID, "safetensors write: tensor '" NM "' has NULL data", v->name);
            goto out;
        }
        e = json_object();
        shape = json_array();
        offs = json_array();
        if (!e || !shape || !offs) {
            json_decref(e);
            json_decref(shape);
            json_decref(offs);
            s = CH_ERROR(CH_ERR_NOMEM, "safetensors header: out of memory");
            goto out;
        }
        for (int d = 0; d < v->ndim; d++) json_array_append_new(shape, json_integer(v->shape[d]));
        json_array_append_new(offs, json_integer((json_int_t)off));
        json_array_append_new(offs, json_integer((json_int_t)(off + nbytes)));
        json_object_set_new(e, "dtype", json_string(ch_st_dtype_name(v->dtype)));
        json_object_set_new(e, "shape", shape);
        json_object_set_new(e, "data_offsets", offs);
        if (json_object_set_new(root, v->name, e) != 0) {
            s = CH_ERROR(CH_ERR_INVALID, "safetensors write: tensor name '" NM "' is not valid UTF-8", v->name);
            goto out;
        }
        off += nbytes;
    }
    text = json_dumps(root, JSON_COMPACT);
    if (!text) {
        s = CH_ERROR(CH_ERR_NOMEM, "safetensors header: JSON encoding failed (out of memory)");
        goto out;
    }
    len = strlen(text);
    plen = (len + 7) / 8 * 8; /* 8 + plen is a multiple of 8, as save_file writes it */
    if (plen > CH_ST_MAX_HEADER) {
        s = CH_ERROR(CH_ERR_INVALID, "safetensors write: header of %zu bytes exceeds the %u-byte limit readers accept",
                     plen, CH_ST_MAX_HEADER);
        goto out;
    }
    padded = malloc(plen ? plen : 1);
    if (!padded) {
        s = CH_ERROR(CH_ERR_NOMEM, "safetensors header: out of memory");
        goto out;
    }
    memcpy(padded, text, len);
    memset(padded + len, ' ', plen - len);
    *header = padded;
    *hlen = plen;
    *data_len = off;
out:
    free(text);
    json_decref(root);
    return s;
}

static void put_le64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

ch_status ch_safetensors_serialize(const ch_st_view_t *views, size_t n, const ch_st_meta_t *meta,
                                   size_t nmeta, void **out, size_t *size)
{
    char *header;
    size_t hlen;
    uint64_t data_len, total;
    unsigned char *buf, *p;

    *out = NULL;
    *size = 0;
    CH_TRY(build_header(views, n, meta, nmeta, &header, &hlen, &data_len));
    total = 8 + (uint64_t)hlen + data_len;
    buf = total <= SIZE_MAX ? malloc((size_t)total) : NULL;
    if (!buf) {
        free(header);
        return CH_ERROR(CH_ERR_NOMEM, "safetensors serialize: out of memory for %llu bytes",
                        (unsigned long long)total);
    }
    put_le64(buf, hlen);
    memcpy(buf + 8, header, hlen);
    free(header);
    p = buf + 8 + hlen;
    for (size_t i = 0; i < n; i++) {
        if (views[i].nbytes) memcpy(p, views[i].data, views[i].nbytes);
        p += views[i].nbytes;
    }
    *out = buf;
    *size = (size_t)total;
    return CH_OK;
}

ch_status ch_safetensors_write(const char *path, const ch_st_view_t *views, size_t n,
                               const ch_st_meta_t *meta, size_t nmeta)
{
    char *header;
    size_t hlen;
    uint64_t data_len;
    unsigned char len8[8];
    ch_atomic_file_t *f;
    ch_status s;

    if (!path) return CH_ERROR(CH_ERR_INVALID, "safetensors write: NULL path");
    s = build_header(views, n, meta, nmeta, &header, &hlen, &data_len);
    if (s) return ch_error_context("writing '%s'", path);
    s = ch_atomic_file_open(path, &f);
    if (s) {
        free(header);
        return s;
    }
    put_le64(len8, hlen);
    /* ch_atomic_file_write frees f and removes the temporary on error. */
    s = ch_atomic_file_write(f, len8, 8);
    if (!s) s = ch_atomic_file_write(f, header, hlen);
    free(header);
    for (size_t i = 0; !s && i < n; i++) s = ch_atomic_file_write(f, views[i].data, views[i].nbytes);
    if (s) return s;
    return ch_atomic_file_commit(f);
}
