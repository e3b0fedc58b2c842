/* cohort: .npy and raw binary array sources, see npy.h. */
#include "config.h"

#include "io/formats/npy.h"

#include "io/state/atomic_file.h"
#include "io/formats/h5.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static int host_little(void)
{
    const uint16_t one = 1;
    unsigned char b;
    memcpy(&b, &one, 1);
    return b == 1;
}

/* Read exactly n bytes at off (EOF before n: *got < n). */
static ch_status pread_full(int fd, void *buf, size_t n, int64_t off, size_t *got, const char *path)
{
    size_t done = 0;
    while (done < n) {
        ssize_t k = pread(fd, (char *)buf + done, n - done, (off_t)(off + (int64_t)done));
        if (k < 0) {
            if (errno == EINTR) continue;
            return CH_ERROR(CH_ERR_IO, "%s: read of %zu bytes at offset %lld failed: %s", path, n,
                            (long long)off, strerror(errno));
        }
        if (k == 0) break;
        done += (size_t)k;
    }
    *got = done;
    return CH_OK;
}

/* ------------------------------------------------------------------ header */

/* Data bytes of an array of desc's dtype and shape. As numpy ("array is too
 * big"), the nonzero dims times the item size must fit in 2^63 - 1 bytes,
 * even when a zero dim makes the array empty: element counts and strides
 * computed from the shape (ch_array_desc_count, the reducer) then fit in
 * int64. *too_big: 1 when they do not (the result is then meaningless). */
static __int128 shape_bytes(const ch_array_desc_t *d, int *too_big)
{
    __int128 bytes = (__int128)ch_array_dtype_size(d->dtype);
    int empty = 0;
    *too_big = 0;
    for (int i = 0; i < d->ndim && !*too_big; i++) {
        if (d->shape[i] == 0) empty = 1;
        else *too_big = (bytes *= d->shape[i]) > INT64_MAX; /* below 2^126: no overflow */
    }
    return empty ? 0 : bytes;
}

/* Text of the value of 'key' in the header dict (points into hdr). */
static const char *dict_value(const char *hdr, const char *key)
{
    char pat[32];
    const char *q[2] = {"'", "\""};
    for (int i = 0; i < 2; i++) {
        snprintf(pat, sizeof pat, "%s%s%s", q[i], key, q[i]);
        const char *p = strstr(hdr, pat);
        if (!p) continue;
        p += strlen(pat);
        while (isspace((unsigned char)*p)) p++;
        if (*p != ':') return NULL;
        p++;
        while (isspace((unsigned char)*p)) p++;
        return p;
    }
    return NULL;
}

/* Length of the bracketed literal at v ("[('a', '<f8'), ('b', '<i4')]" or
 * "{...}"): up to its matching close bracket, quotes skipped; the rest of
 * the text when it is not closed. */
static int literal_len(const char *v)
{
    int depth = 0;
    char quote = 0;
    const char *p = v;
    for (; *p; p++) {
        if (quote) {
            if (*p == quote) quote = 0;
        } else if (*p == '\'' || *p == '"') {
            quote = *p;
        } else if (*p == '[' || *p == '{' || *p == '(') {
            depth++;
        } else if ((*p == ']' || *p == '}' || *p == ')') && --depth == 0) {
            return (int)(p - v) + 1;
        }
    }
    return (int)(p - v);
}

static ch_status parse_descr(const char *path, const char *v, ch_array_desc_t *d)
{
    if (*v == '[' || *v == '{') {
        int n = literal_len(v);
        return CH_ERROR(CH_ERR_UNSUPPORTED, "%s: structured dtype %.*s%s is not supported (expected "
                        "one numeric field per element: bool, int, uint or float)", path,
                        n > 120 ? 117 : n, v, n > 120 ? "..." : "");
    }
    if (*v != '\'' && *v != '"')
        return CH_ERROR(CH_ERR_FORMAT, "%s: header 'descr' is not a string", path);
    char quote = *v++;
    const char *end = strchr(v, quote);
    if (!end || end - v > 30) return CH_ERROR(CH_ERR_FORMAT, "%s: header 'descr' unterminated", path);
    char s[32];
    memcpy(s, v, (size_t)(end - v));
    s[end - v] = 0;
    char order = s[0];
    const char *code = s;
    if (order == '<' || order == '>' || order == '|' || order == '=') code = s + 1;
    else order = '=';
    if (code[0] == 'O')
        return CH_ERROR(CH_ERR_UNSUPPORTED, "%s: dtype '%s' (Python objects) cannot be reduced: "
                        "expected bool, int, uint or float", path, s);
    if (!strcmp(code, "?")) code = "b1";
    ch_array_dtype dt;
    if (strlen(code) > 3 || ch_array_dtype_from_name(code, &dt) != CH_OK) {
        ch_error_clear();
        return CH_ERROR(CH_ERR_UNSUPPORTED, "%s: dtype '%s' is not supported: expected bool (b1), "
                        "int (i1-i8), uint (u1-u8) or float (f2, f4, f8)", path, s);
    }
    d->dtype = dt;
    int little = order == '<' || ((order == '=' || order == '|') && host_little());
    d->byteswap = ch_array_dtype_size(dt) > 1 && little != host_little();
    return CH_OK;
}

static ch_status parse_shape_tuple(const char *path, const char *v, ch_array_desc_t *d)
{
    if (*v != '(') return CH_ERROR(CH_ERR_FORMAT, "%s: header 'shape' is not a tuple", path);
    v++;
    d->ndim = 0;
    for (;;) {
        while (isspace((unsigned char)*v) || *v == ',') v++;
        if (*v == ')') break;
        if (!isdigit((unsigned char)*v))
            return CH_ERROR(CH_ERR_FORMAT, "%s: header 'shape' holds a non-integer", path);
        if (d->ndim == CH_ARRAY_MAX_DIMS)
            return CH_ERROR(CH_ERR_UNSUPPORTED, "%s: more than %d dimensions", path,
                            CH_ARRAY_MAX_DIMS);
        char *end;
        errno = 0;
        long long n = strtoll(v, &end, 10);
        if (errno) return CH_ERROR(CH_ERR_FORMAT, "%s: header 'shape' value too large", path);
        d->shape[d->ndim++] = n;
        v = end;
        while (*v == 'L') v++;
    }
    return CH_OK;
}

ch_status ch_npy_read_header(const char *path, ch_npy_header_t *out)
{
    memset(out, 0, sizeof *out);
    /* O_NONBLOCK: a FIFO opens at once (and is refused below) instead of
     * blocking in open(), where no stop signal is acted on */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return CH_ERROR(CH_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    unsigned char pre[12];
    size_t got = 0;
    char *hdr = NULL;
    ch_status s = fstat(fd, &sb) ? CH_ERROR(CH_ERR_IO, "%s: stat: %s", path, strerror(errno))
                  : !S_ISREG(sb.st_mode)
                      ? CH_ERROR(CH_ERR_INVALID, "%s: not a regular file (a FIFO, device or "
                                 "socket cannot be read in chunks)", path)
                      : pread_full(fd, pre, sizeof pre, 0, &got, path);
    if (s != CH_OK) goto done;
    if (got < 10 || memcmp(pre, "\x93NUMPY", 6)) {
        s = CH_ERROR(CH_ERR_FORMAT, "%s: not a .npy file (no \\x93NUMPY magic at the start)", path);
        goto done;
    }
    out->major = pre[6];
    out->minor = pre[7];
    uint32_t hlen;
    int64_t hstart;
    if (out->major == 1) {
        hlen = (uint32_t)pre[8] | (uint32_t)pre[9] << 8;
        hstart = 10;
    } else if (out->major == 2 || out->major == 3) {
        if (got < 12) {
            s = CH_ERROR(CH_ERR_FORMAT, "%s: truncated .npy header", path);
            goto done;
        }
        hlen = (uint32_t)pre[8] | (uint32_t)pre[9] << 8 | (uint32_t)pre[10] << 16 |
               (uint32_t)pre[11] << 24;
        hstart = 12;
    } else {
        s = CH_ERROR(CH_ERR_FORMAT, "%s: .npy format version %d.%d (expected 1.0, 2.0 or 3.0)",
                     path, out->major, out->minor);
        goto done;
    }
    if (hstart + (int64_t)hlen > (int64_t)sb.st_size) {
        s = CH_ERROR(CH_ERR_FORMAT, "%s: truncated: the header says %u header bytes, the file "
                     "holds %lld bytes", path, hlen, (long long)sb.st_size);
        goto done;
    }
    hdr = malloc((size_t)hlen + 1);
    if (!hdr) {
        s = CH_ERROR(CH_ERR_NOMEM, "%s: header of %u bytes", path, hlen);
        goto done;
    }
    if ((s = pread_full(fd, hdr, hlen, hstart, &got, path)) != CH_OK) goto done;
    hdr[got] = 0;
    out->data_offset = hstart + hlen;
    const char *v_descr = dict_value(hdr, "descr"), *v_fo = dict_value(hdr, "fortran_order"),
               *v_shape = dict_value(hdr, "shape");
    if (hdr[0] != '{' || !v_descr || !v_fo || !v_shape) {
        /* the header as text: without its padding (spaces, the newline), cut
         * at a line break, at most 80 characters */
        int n = (int)strcspn(hdr, "\r\n");
        while (n > 0 && isspace((unsigned char)hdr[n - 1])) n--;
        s = CH_ERROR(CH_ERR_FORMAT, "%s: header is not a dict with 'descr', 'fortran_order' and "
                     "'shape': %.*s%s", path, n > 80 ? 77 : n, hdr, n > 80 ? "..." : "");
        goto done;
    }
    if ((s = parse_descr(path, v_descr, &out->desc)) != CH_OK) goto done;
    if (!strncmp(v_fo, "True", 4)) out->desc.fortran = 1;
    else if (strncmp(v_fo, "False", 5)) {
        s = CH_ERROR(CH_ERR_FORMAT, "%s: header 'fortran_order' is neither True nor False", path);
        goto done;
    }
    if ((s = parse_shape_tuple(path, v_shape, &out->desc)) != CH_OK) goto done;
    {
        int too_big;
        __int128 bytes = shape_bytes(&out->desc, &too_big);
        __int128 have = (__int128)sb.st_size - out->data_offset;
        char shp[256];
        int len = 0;
        shp[0] = 0;
        for (int i = 0; i < out->desc.ndim && len < 200; i++)
            len += snprintf(shp + len, sizeof shp - (size_t)len, "%s%lld", i ? ", " : "",
                            (long long)out->desc.shape[i]);
        if (too_big)
            s = CH_ERROR(CH_ERR_FORMAT, "%s: the header's shape (%s) %s is more than 2^63 - 1 "
                         "bytes (numpy: array is too big)", path, shp,
                         ch_array_dtype_name(out->desc.dtype));
        else if (have < bytes)
            s = CH_ERROR(CH_ERR_FORMAT, "%s: truncated: the header says shape (%s) %s = %lld data "
                         "bytes from offset %lld, the file holds %lld", path, shp,
                         ch_array_dtype_name(out->desc.dtype), (long long)bytes,
                         (long long)out->data_offset, (long long)have);
        else if (have > bytes)
            s = CH_ERROR(CH_ERR_FORMAT, "%s: the header says shape (%s) %s = %lld data bytes, the "
                         "file holds %lld (extra bytes after the array)", path, shp,
                         ch_array_dtype_name(out->desc.dtype), (long long)bytes, (long long)have);
    }
done:
    free(hdr);
    close(fd);
    return s;
}

/* ------------------------------------------------------------------- write */

static const char *descr_of(ch_array_dtype dt)
{
    static const char *const le[CH_DT_COUNT_] = {"|b1", "|i1", "<i2", "<i4", "<i8", "|u1",
                                                 "<u2", "<u4", "<u8", "<f2", "<f4", "<f8"};
    static const char *const be[CH_DT_COUNT_] = {"|b1", "|i1", ">i2", ">i4", ">i8", "|u1",
                                                 ">u2", ">u4", ">u8", ">f2", ">f4", ">f8"};
    return host_little() ? le[dt] : be[dt];
}

ch_status ch_npy_write(const char *path, const ch_array_desc_t *desc, const void *data)
{
    CH_REQUIRE(path && desc && (data || ch_array_desc_count(desc) == 0), "ch_npy_write: NULL argument");
    size_t cap = 128 + 24 * (size_t)desc->ndim;
    char *h = malloc(cap + 80);
    if (!h) return CH_ERROR(CH_ERR_NOMEM, "%s: .npy header", path);
    int len = snprintf(h, cap, "{'descr': '%s', 'fortran_order': %s, 'shape': (",
                       descr_of(desc->dtype), desc->fortran ? "True" : "False");
    for (int i = 0; i < desc->ndim; i++)
        len += snprintf(h + len, cap - (size_t)len, "%s%lld", i ? ", " : "", (long long)desc->shape[i]);
    len += snprintf(h + len, cap - (size_t)len, "%s), }", desc->ndim == 1 ? "," : "");
    int major = (10 + len + 1 > 65535) ? 2 : 1;
    int pre = major == 1 ? 10 : 12;
    int total = (pre + len + 1 + 63) / 64 * 64; /* numpy aligns the data to 64 bytes */
    while (len < total - pre - 1) h[len++] = ' ';
    h[len++] = '\n';
    unsigned char p[12] = {0x93, 'N', 'U', 'M', 'P', 'Y', (unsigned char)major, 0};
    uint32_t hl = (uint32_t)len;
    for (int i = 0; i < (major == 1 ? 2 : 4); i++) p[8 + i] = (unsigned char)(hl >> (8 * i));
    ch_atomic_file_t *f = NULL;
    ch_status s = ch_atomic_file_open(path, &f);
    if (s == CH_OK) s = ch_atomic_file_write(f, p, (size_t)pre);
    if (s == CH_OK) s = ch_atomic_file_write(f, h, (size_t)len);
    size_t bytes = (size_t)ch_array_desc_count(desc) * ch_array_dtype_size(desc->dtype);
    if (s == CH_OK && bytes) s = ch_atomic_file_write(f, data, bytes);
    if (s == CH_OK) s = ch_atomic_file_commit(f); /* a failed write already freed f */
    free(h);
    return s;
}

/* ------------------------------------------------------------------ sources */

struct ch_file_source {
    ch_array_source_t src;
    int n;
    char **paths;
    int *fds;
    int64_t *offsets;
    ch_array_desc_t *seg;
    int64_t *row0;
    ch_h5_dataset_t **h5; /* per segment: the HDF5 dataset, or NULL for a file read by pread */
    int64_t page;         /* the page size (mmap offsets) */
    struct stat *at_open; /* per segment: the open file's fstat when opened */
};

static ch_status file_read(void *ctx, int seg, int64_t e0, int64_t n, void *dst)
{
    ch_file_source_t *s = ctx;
    if (s->h5[seg]) return ch_h5_read(s->h5[seg], e0, n, dst);
    size_t isz = ch_array_dtype_size(s->seg[seg].dtype);
    size_t want = (size_t)n * isz, got = 0;
    CH_TRY(pread_full(s->fds[seg], dst, want, s->offsets[seg] + e0 * (int64_t)isz, &got,
                      s->paths[seg]));
    if (got != want)
        return CH_ERROR(CH_ERR_IO, "%s: file shrank while reading: %zu of %zu bytes at element %lld",
                        s->paths[seg], got, want, (long long)e0);
    return CH_OK;
}

/* The zero-copy view (ch_array_source_t.map): the chunk's byte range
 * mapped MAP_PRIVATE / PROT_READ from the page boundary below it and
 * populated at once (MAP_POPULATE: the page-cache pages are entered in
 * the page table here, on the reader thread, and a range not in the page
 * cache is read now), so the compute thread sums page-cache memory with
 * no copy and no page fault. MADV_SEQUENTIAL lets the kernel read ahead
 * and drop pages behind (inputs larger than RAM). Not for HDF5 datasets,
 * nor where the elements would not be aligned to their size (a raw file
 * with an odd offset), nor a range past the file's current end (the file
 * shrank: read() reports it; a file cut while mapped raises SIGBUS at the
 * next load from a lost page, which ch_reduce_run's summing thread turns
 * into an error for the piece it sums). Any failure returns nonzero with no message: the
 * caller reads the range instead. */
static ch_status file_map(void *ctx, int seg, int64_t e0, int64_t n, ch_array_view_t *view)
{
    ch_file_source_t *s = ctx;
    if (s->h5[seg] || n <= 0) return CH_ERR_UNSUPPORTED;
    int64_t isz = (int64_t)ch_array_dtype_size(s->seg[seg].dtype);
    int64_t off = s->offsets[seg] + e0 * isz, end = off + n * isz;
    if (off % isz != 0 || s->page <= 0) return CH_ERR_UNSUPPORTED;
    struct stat sb;
    if (fstat(s->fds[seg], &sb) != 0 || (int64_t)sb.st_size < end) return CH_ERR_IO;
    int64_t a = off - off % s->page;
    void *p = mmap(NULL, (size_t)(end - a), PROT_READ, MAP_PRIVATE | MAP_POPULATE, s->fds[seg], (off_t)a);
    if (p == MAP_FAILED) return CH_ERR_IO;
    (void)madvise(p, (size_t)(end - a), MADV_SEQUENTIAL);
    view->base = p;
    view->len = (size_t)(end - a);
    view->data = (const unsigned char *)p + (off - a);
    return CH_OK;
}

static void file_unmap(void *ctx, ch_array_view_t *view)
{
    (void)ctx;
    if (view->base) munmap(view->base, view->len);
    memset(view, 0, sizeof *view);
}

ch_status ch_file_source_check_unchanged(const ch_file_source_t *s)
{
    for (int i = 0; s && s->at_open && i < s->n; i++) {
        if (s->h5[i] || s->fds[i] < 0) continue;
        struct stat now;
        if (fstat(s->fds[i], &now) != 0)
            return CH_ERROR(CH_ERR_IO, "%s: stat: %s", s->paths[i], strerror(errno));
        const struct stat *then = &s->at_open[i];
        if (now.st_size != then->st_size || now.st_mtim.tv_sec != then->st_mtim.tv_sec ||
            now.st_mtim.tv_nsec != then->st_mtim.tv_nsec)
            return CH_ERROR(CH_ERR_IO, "%s was modified while it was being read (%s): the "
                            "result would mix its old and new contents, so none is written; "
                            "run again on a file nothing writes to",
                            s->paths[i], now.st_size != then->st_size ? "its size changed"
                                                                      : "its mtime changed");
    }
    return CH_OK;
}

void ch_file_source_destroy(ch_file_source_t *s)
{
    if (!s) return;
    for (int i = 0; i < s->n; i++) {
        if (s->fds && s->fds[i] >= 0) close(s->fds[i]);
        if (s->h5) ch_h5_close(s->h5[i]);
        if (s->paths) free(s->paths[i]);
    }
    free(s->paths);
    free(s->fds);
    free(s->offsets);
    free(s->seg);
    free(s->row0);
    free(s->h5);
    free(s->at_open);
    free(s);
}

static ch_status source_alloc(int n, ch_file_source_t **out)
{
    ch_file_source_t *s = calloc(1, sizeof *s);
    if (!s) return CH_ERROR(CH_ERR_NOMEM, "array source");
    s->n = n;
    s->paths = calloc((size_t)n, sizeof *s->paths);
    s->fds = malloc((size_t)n * sizeof *s->fds);
    s->offsets = calloc((size_t)n, sizeof *s->offsets);
    s->seg = calloc((size_t)n, sizeof *s->seg);
    s->row0 = calloc((size_t)n, sizeof *s->row0);
    s->h5 = calloc((size_t)n, sizeof *s->h5);
    if (!s->paths || !s->fds || !s->offsets || !s->seg || !s->row0 || !s->h5) {
        s->n = 0;
        ch_file_source_destroy(s);
        return CH_ERROR(CH_ERR_NOMEM, "array source of %d files", n);
    }
    for (int i = 0; i < n; i++) s->fds[i] = -1;
    *out = s;
    return CH_OK;
}

static ch_status source_finish(ch_file_source_t *s)
{
    s->at_open = calloc((size_t)(s->n ? s->n : 1), sizeof *s->at_open);
    if (!s->at_open) return CH_ERROR(CH_ERR_NOMEM, "array source of %d files", s->n);
    for (int i = 0; i < s->n; i++) {
        if (s->h5[i]) continue;
        s->fds[i] = open(s->paths[i], O_RDONLY | O_CLOEXEC | O_NONBLOCK);
        if (s->fds[i] < 0) return CH_ERROR(CH_ERR_IO, "%s: cannot open: %s", s->paths[i], strerror(errno));
        struct stat *sb = &s->at_open[i];
        if (fstat(s->fds[i], sb) != 0)
            return CH_ERROR(CH_ERR_IO, "%s: stat: %s", s->paths[i], strerror(errno));
        if (!S_ISREG(sb->st_mode))
            return CH_ERROR(CH_ERR_INVALID, "%s: not a regular file (a FIFO, device or socket "
                            "cannot be read in chunks)", s->paths[i]);
    }
    s->src.nseg = s->n;
    s->src.seg = s->seg;
    s->src.seg_row0 = s->row0;
    s->src.read = file_read;
    s->src.map = file_map;
    s->src.unmap = file_unmap;
    s->src.seg_names = (const char *const *)s->paths;
    s->src.ctx = s;
    s->page = (int64_t)sysconf(_SC_PAGESIZE);
    return CH_OK;
}

static void shape_text(const ch_array_desc_t *d, int from, char *buf, size_t cap)
{
    int len = snprintf(buf, cap, "(");
    for (int i = from; i < d->ndim && (size_t)len < cap - 24; i++)
        len += snprintf(buf + len, cap - (size_t)len, "%s%lld", i > from ? ", " : "",
                        (long long)d->shape[i]);
    snprintf(buf + len, cap - (size_t)len, ")");
}

ch_status ch_npy_source_open(const char *const *paths, int n, ch_file_source_t **out)
{
    *out = NULL;
    CH_REQUIRE(paths && n >= 1, "no input file given");
    /* expand globs */
    char **list = NULL;
    int nl = 0, cap = 0;
    ch_status s = CH_OK;
    for (int i = 0; i < n && s == CH_OK; i++) {
        glob_t g;
        memset(&g, 0, sizeof g);
        int pattern = strpbrk(paths[i], "*?[") != NULL && !ch_h5_is_dataset_spec(paths[i], NULL);
        const char *one[1] = {paths[i]};
        char *const *names = (char *const *)one;
        size_t count = 1;
        if (pattern) {
            int rc = glob(paths[i], 0, NULL, &g);
            if (rc != 0 || g.gl_pathc == 0) {
                s = CH_ERROR(CH_ERR_IO, "%s: no file matches this pattern", paths[i]);
                globfree(&g);
                break;
            }
            names = g.gl_pathv;
            count = g.gl_pathc;
        }
        for (size_t j = 0; j < count && s == CH_OK; j++) {
            if (nl == cap) {
                cap = cap ? 2 * cap : 16;
                char **nlist = realloc(list, (size_t)cap * sizeof *list);
                if (!nlist) { s = CH_ERROR(CH_ERR_NOMEM, "input list"); break; }
                list = nlist;
            }
            list[nl] = strdup(names[j]);
            if (!list[nl]) s = CH_ERROR(CH_ERR_NOMEM, "input list");
            else nl++;
        }
        if (pattern) globfree(&g);
    }
    ch_file_source_t *src = NULL;
    if (s == CH_OK) s = source_alloc(nl, &src);
    for (int i = 0; i < nl; i++) {
        if (src && s == CH_OK) src->paths[i] = list[i];
        else free(list[i]);
    }
    free(list);
    if (s != CH_OK) {
        ch_file_source_destroy(src);
        return s;
    }
    int64_t rows = 0;
    for (int i = 0; i < nl && s == CH_OK; i++) {
        ch_npy_header_t h;
        memset(&h, 0, sizeof h);
        if (ch_h5_is_dataset_spec(src->paths[i], NULL))
            s = ch_h5_open(src->paths[i], &h.desc, &src->h5[i]);
        else
            s = ch_npy_read_header(src->paths[i], &h);
        if (s != CH_OK) break;
        src->seg[i] = h.desc;
        src->offsets[i] = h.data_offset;
        src->row0[i] = rows;
        const ch_array_desc_t *a = &src->seg[0], *b = &h.desc;
        if (nl > 1 && b->ndim == 0) {
            s = CH_ERROR(CH_ERR_FORMAT, "%s: a 0-d array cannot be stacked with other shards",
                         src->paths[i]);
            break;
        }
        int same = a->dtype == b->dtype && a->ndim == b->ndim;
        for (int k = 1; same && k < a->ndim; k++) same = a->shape[k] == b->shape[k];
        if (!same) {
            char sa[128], sb[128];
            shape_text(a, 1, sa, sizeof sa);
            shape_text(b, 1, sb, sizeof sb);
            s = CH_ERROR(CH_ERR_FORMAT, "shard %s: %s with %d dims and trailing shape %s, but the "
                         "first shard %s is %s with %d dims and trailing shape %s (shards stack "
                         "along axis 0)", src->paths[i], ch_array_dtype_name(b->dtype), b->ndim, sb,
                         src->paths[0], ch_array_dtype_name(a->dtype), a->ndim, sa);
            break;
        }
        rows += b->ndim ? b->shape[0] : 1;
    }
    if (s == CH_OK) {
        src->src.desc = src->seg[0];
        if (src->src.desc.ndim > 0) src->src.desc.shape[0] = rows;
        src->src.desc.byteswap = 0;
        src->src.desc.fortran = 0;
        s = source_finish(src);
    }
    if (s != CH_OK) {
        ch_file_source_destroy(src);
        return s;
    }
    *out = src;
    return CH_OK;
}

ch_status ch_raw_source_open(const char *path, const ch_array_desc_t *desc, int64_t offset,
                             ch_file_source_t **out)
{
    *out = NULL;
    CH_REQUIRE(path && desc, "ch_raw_source_open: NULL argument");
    CH_REQUIRE(offset >= 0, "%s: raw offset %lld < 0", path, (long long)offset);
    struct stat sb;
    if (stat(path, &sb)) return CH_ERROR(CH_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    int too_big;
    __int128 bytes = shape_bytes(desc, &too_big);
    if (too_big) {
        char shp[256];
        shape_text(desc, 0, shp, sizeof shp);
        return CH_ERROR(CH_ERR_FORMAT, "%s: raw %s array of shape %s is more than 2^63 - 1 bytes",
                        path, ch_array_dtype_name(desc->dtype), shp);
    }
    if ((__int128)sb.st_size != offset + bytes) {
        char shp[256];
        shape_text(desc, 0, shp, sizeof shp);
        return CH_ERROR(CH_ERR_FORMAT, "%s: raw %s array of shape %s needs %lld bytes after offset "
                        "%lld, the file holds %lld", path, ch_array_dtype_name(desc->dtype), shp,
                        (long long)bytes, (long long)offset, (long long)sb.st_size);
    }
    ch_file_source_t *s;
    CH_TRY(source_alloc(1, &s));
    s->paths[0] = strdup(path);
    s->seg[0] = *desc;
    s->offsets[0] = offset;
    s->src.desc = *desc;
    s->src.desc.byteswap = 0;
    s->src.desc.fortran = 0;
    ch_status st = s->paths[0] ? source_finish(s) : CH_ERROR(CH_ERR_NOMEM, "path");
    if (st != CH_OK) {
        ch_file_source_destroy(s);
        return st;
    }
    *out = s;
    return CH_OK;
}

const ch_array_source_t *ch_file_source_get(const ch_file_source_t *s) { return &s->src; }

const char *ch_file_source_path(const ch_file_source_t *s, int i)
{
    return (i >= 0 && i < s->n) ? s->paths[i] : "?";
}

ch_status ch_npy_parse_shape(const char *text, int *ndim, int64_t *shape)
{
    const char *p = text;
    int n = 0;
    while (*p) {
        while (*p == '(' || *p == ')' || *p == ',' || *p == 'x' || isspace((unsigned char)*p)) p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (end == p || errno || v < 0)
            return CH_ERROR(CH_ERR_INVALID, "shape '%s': expected sizes like 20000x20000 or 3,4", text);
        if (n == CH_ARRAY_MAX_DIMS)
            return CH_ERROR(CH_ERR_INVALID, "shape '%s': more than %d dims", text, CH_ARRAY_MAX_DIMS);
        shape[n++] = v;
        p = end;
    }
    if (n == 0) return CH_ERROR(CH_ERR_INVALID, "shape '%s' is empty", text);
    *ndim = n;
    return CH_OK;
}

/* ------------------------------------------------------------- config */

static const ch_config_key_t input_keys[] = {
    {"input.files", CH_CFG_STRLIST, "", CH_CFG_NO_RANGE,
     "Input .npy files or globs (several: shards stacked along axis 0), or one raw binary file.", "--files", NULL, 1},
    {"input.dtype", CH_CFG_STRING, "", CH_CFG_NO_RANGE,
     "Raw input: element dtype (float64, f4, int16, ...); empty: the inputs are .npy files.", "--dtype"},
    {"input.shape", CH_CFG_STRING, "", CH_CFG_NO_RANGE, "Raw input: shape, e.g. 20000x20000.", "--shape"},
    {"input.order", CH_CFG_STRING, "C", CH_CFG_NO_RANGE, "Raw input: memory order, C or F.", "--order"},
    {"input.byteorder", CH_CFG_STRING, "native", CH_CFG_NO_RANGE,
     "Raw input: byte order, little, big or native.", "--byteorder"},
    {"input.offset", CH_CFG_INT64, "0", 0, 1e18, "Raw input: bytes before the first element.", "--offset"},
};
ch_config_table_t ch_file_source_config_table(void)
{
    ch_config_table_t t = {"input", input_keys, (int)(sizeof input_keys / sizeof input_keys[0])};
    return t;
}

ch_status ch_file_source_from_config(const ch_config_t *cfg, ch_file_source_t **out)
{
    static const char *const orders[] = {"C", "F"};
    static const char *const byteorders[] = {"native", "little", "big"};
    const char *const *files;
    const char *dtype, *shape;
    int n = 0, order, bo;
    long long offset;
    *out = NULL;
    CH_TRY(ch_config_get_strlist(cfg, "input.files", &files, &n));
    if (n == 0) return CH_ERROR(CH_ERR_CONFIG, "no input: give one or more .npy files (input.files)");
    CH_TRY(ch_config_get_string(cfg, "input.dtype", &dtype));
    if (!*dtype) return ch_npy_source_open(files, n, out);
    ch_array_desc_t d;
    memset(&d, 0, sizeof d);
    CH_TRY(ch_array_dtype_from_name(dtype, &d.dtype));
    CH_TRY(ch_config_get_string(cfg, "input.shape", &shape));
    CH_TRY(ch_npy_parse_shape(shape, &d.ndim, d.shape));
    CH_TRY(ch_config_get_choice(cfg, "input.order", orders, 2, &order));
    CH_TRY(ch_config_get_choice(cfg, "input.byteorder", byteorders, 3, &bo));
    CH_TRY(ch_config_get_int64(cfg, "input.offset", &offset));
    d.fortran = order == 1;
    d.byteswap = (bo == 1 && !host_little()) || (bo == 2 && host_little());
    if (n != 1) return CH_ERROR(CH_ERR_CONFIG, "raw input: give exactly one file, not %d", n);
    return ch_raw_source_open(files[0], &d, offset, out);
}
