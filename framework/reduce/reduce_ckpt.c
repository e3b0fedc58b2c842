/* cohort: checkpoint files of a chunked reduction, see reduce_ckpt.h. */
#include "config.h"

#include "framework/reduce/reduce_ckpt.h"

#include "io/formats/h5.h"
#include "io/state/atomic_file.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static const char ckpt_magic[8] = {'C', 'H', 'R', 'D', 'C', 'K', '0', '2'};
static const char ckpt_magic_v1[8] = {'C', 'H', 'R', 'D', 'C', 'K', '0', '1'};

/* The fixed header after the magic (this host's layout: the files are
 * read back by the same program on the same cluster). */
typedef struct {
    int32_t world, rank;
    int64_t chunk_elems;
    int32_t pass, pad;
    int64_t step;
    uint64_t identity_len;
} ckpt_head_t;

/* ------------------------------------------------------------- identity */

typedef struct {
    char *buf;
    size_t len, cap;
    int nomem;
} text_t;

static void add(text_t *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add(text_t *t, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        size_t room = t->cap - t->len;
        int n = t->buf ? vsnprintf(t->buf + t->len, room, fmt, ap) : -1;
        va_end(ap);
        if (n >= 0 && (size_t)n < room) {
            t->len += (size_t)n;
            return;
        }
        size_t cap = t->cap ? 2 * t->cap : 1024;
        while (n >= 0 && cap - t->len <= (size_t)n) cap *= 2;
        char *nb = realloc(t->buf, cap);
        if (!nb) {
            t->nomem = 1;
            return;
        }
        t->buf = nb;
        t->cap = cap;
    }
}

static int cmp_int(const void *a, const void *b)
{
    return (*(const int *)a > *(const int *)b) - (*(const int *)a < *(const int *)b);
}

ch_status ch_reduce_ckpt_identity(const ch_reduce_spec_t *spec, const ch_file_source_t *src,
                                  char **out)
{
    CH_REQUIRE(spec && src && out, "ch_reduce_ckpt_identity: NULL argument");
    *out = NULL;
    const ch_array_source_t *a = ch_file_source_get(src);
    text_t t = {0};
    add(&t, "op: %s\n", ch_reduce_kind_name(spec->op));
    if (spec->naxes < 0) {
        add(&t, "axis: none\n");
    } else {
        int ax[CH_REDUCE_MAX_DIMS];
        for (int i = 0; i < spec->naxes; i++)
            ax[i] = spec->axes[i] < 0 ? spec->axes[i] + a->desc.ndim : spec->axes[i];
        qsort(ax, (size_t)spec->naxes, sizeof ax[0], cmp_int);
        add(&t, "axis: ");
        for (int i = 0; i < spec->naxes; i++) add(&t, "%s%d", i ? "," : "", ax[i]);
        add(&t, "%s\n", spec->naxes ? "" : "()");
    }
    add(&t, "keepdims: %s\nddof: %lld\nmode: %s\n", spec->keepdims ? "true" : "false",
        (long long)spec->ddof, spec->mode == CH_REDUCE_FAST ? "fast" : "exact");
    if (spec->op == CH_ROP_HISTOGRAM) {
        add(&t, "bins: %lld\n", (long long)spec->bins);
        if (spec->has_range) add(&t, "range: %.17g,%.17g\n", spec->range[0], spec->range[1]);
        else add(&t, "range: the data's min,max\n");
    }
    add(&t, "array: %s (", ch_array_dtype_name(a->desc.dtype));
    for (int i = 0; i < a->desc.ndim; i++) add(&t, "%s%lld", i ? ", " : "", (long long)a->desc.shape[i]);
    add(&t, "%s)\ninputs: %d\n", a->desc.ndim == 1 ? "," : "", a->nseg);
    ch_status s = CH_OK;
    for (int i = 0; i < a->nseg && s == CH_OK; i++) {
        const char *name = ch_file_source_path(src, i);
        size_t flen = strlen(name);
        if (!ch_h5_is_dataset_spec(name, &flen)) flen = strlen(name);
        char file[PATH_MAX], full[PATH_MAX];
        snprintf(file, sizeof file, "%.*s", (int)flen, name);
        struct stat sb;
        if (stat(file, &sb) != 0) {
            s = CH_ERROR(CH_ERR_IO, "%s: cannot stat the input: %s", file, strerror(errno));
            break;
        }
        if (!realpath(file, full)) snprintf(full, sizeof full, "%s", file);
        char when[64];
        struct tm tm;
        time_t sec = sb.st_mtim.tv_sec;
        if (gmtime_r(&sec, &tm)) strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", &tm);
        else snprintf(when, sizeof when, "%lld", (long long)sec);
        add(&t, "input %d: %s%s, %lld bytes, modified %s.%09ld UTC\n", i, full, name + flen,
            (long long)sb.st_size, when, (long)sb.st_mtim.tv_nsec);
    }
    if (s == CH_OK && t.nomem) s = CH_ERROR(CH_ERR_NOMEM, "reduce state identity");
    if (s != CH_OK) {
        free(t.buf);
        return s;
    }
    *out = t.buf;
    return CH_OK;
}

/* ------------------------------------------------------------- files */

void ch_reduce_ckpt_path(const char *dir, int rank, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s/rank-%d.state", dir, rank);
}

ch_status ch_reduce_ckpt_save(const char *dir, const ch_reducer_t *r, const ch_reduce_ckpt_t *c)
{
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        return CH_ERROR(CH_ERR_IO, "%s: cannot create the state directory: %s", dir, strerror(errno));
    char path[4096];
    ch_reduce_ckpt_path(dir, c->rank, path, sizeof path);
    const char *id = c->identity ? c->identity : "";
    ckpt_head_t h = {c->world, c->rank, c->chunk_elems, c->pass, 0, c->step, strlen(id)};
    size_t n = ch_reducer_state_size(r), head = sizeof ckpt_magic + sizeof h + h.identity_len;
    unsigned char *buf = malloc(head + n);
    if (!buf) return CH_ERROR(CH_ERR_NOMEM, "%s: state of %zu bytes", path, n);
    memcpy(buf, ckpt_magic, sizeof ckpt_magic);
    memcpy(buf + sizeof ckpt_magic, &h, sizeof h);
    memcpy(buf + sizeof ckpt_magic + sizeof h, id, h.identity_len);
    ch_reducer_state_save(r, buf + head);
    ch_status s = ch_atomic_file_write_all(path, buf, head + n);
    free(buf);
    return s;
}

/* The first line where the identity texts a (saved) and b (now) differ,
 * as "saved 'LINE' vs now 'LINE'" into msg. */
static void first_difference(const char *a, size_t alen, const char *b, char *msg, size_t cap)
{
    const char *ae = a + alen;
    for (;;) {
        const char *an = memchr(a, '\n', (size_t)(ae - a)), *bn = strchr(b, '\n');
        size_t la = an ? (size_t)(an - a) : (size_t)(ae - a), lb = bn ? (size_t)(bn - b) : strlen(b);
        if (la != lb || memcmp(a, b, la) || (!an) != (!bn)) {
            snprintf(msg, cap, "saved '%.*s' vs now '%.*s'", (int)(la ? la : 9),
                     la ? a : "(nothing)", (int)(lb ? lb : 9), lb ? b : "(nothing)");
            return;
        }
        if (!an) break;
        a = an + 1;
        b = bn + 1;
    }
    snprintf(msg, cap, "(no difference)");
}

ch_status ch_reduce_ckpt_load(const char *dir, ch_reducer_t *r, const ch_reduce_ckpt_t *expect,
                              ch_reduce_ckpt_t *c)
{
    char path[4096];
    ch_reduce_ckpt_path(dir, expect->rank, path, sizeof path);
    FILE *f = fopen(path, "rb");
    if (!f) return CH_ERROR(CH_ERR_IO, "%s: cannot open the resume state: %s", path, strerror(errno));
    struct stat sb;
    size_t total = fstat(fileno(f), &sb) == 0 && sb.st_size > 0 ? (size_t)sb.st_size : 0;
    unsigned char *buf = malloc(total + 1);
    size_t got = buf ? fread(buf, 1, total + 1, f) : 0;
    fclose(f);
    ch_status s = CH_OK;
    ckpt_head_t h;
    memset(&h, 0, sizeof h);
    size_t head = sizeof ckpt_magic + sizeof h;
    if (!buf) s = CH_ERROR(CH_ERR_NOMEM, "%s", path);
    else if (got >= sizeof ckpt_magic && !memcmp(buf, ckpt_magic_v1, sizeof ckpt_magic_v1))
        s = CH_ERROR(CH_ERR_FORMAT, "%s: a state file of an older cohort-reduce that did not record "
                     "which input and operation it belongs to, so it cannot be checked; remove %s "
                     "to start over", path, dir);
    else if (got < head || memcmp(buf, ckpt_magic, sizeof ckpt_magic))
        s = CH_ERROR(CH_ERR_FORMAT, "%s: not a cohort-reduce state file", path);
    if (s == CH_OK) {
        memcpy(&h, buf + sizeof ckpt_magic, sizeof h);
        if (h.identity_len > got - head)
            s = CH_ERROR(CH_ERR_FORMAT, "%s: truncated cohort-reduce state file", path);
    }
    if (s == CH_OK) {
        memset(c, 0, sizeof *c);
        c->world = h.world;
        c->rank = h.rank;
        c->chunk_elems = h.chunk_elems;
        c->pass = h.pass;
        c->step = h.step;
        const char *saved = (const char *)buf + head;
        const char *now = expect->identity ? expect->identity : "";
        if (c->world != expect->world || c->rank != expect->rank) {
            s = CH_ERROR(CH_ERR_FORMAT, "%s: saved by rank %d of %d ranks; resume with the same "
                         "number of ranks (this is rank %d of %d)", path, c->rank, c->world,
                         expect->rank, expect->world);
        } else if (c->chunk_elems != expect->chunk_elems) {
            s = CH_ERROR(CH_ERR_FORMAT, "%s: saved with chunks of %lld elements, this run uses %lld "
                         "(keep reduce.chunk_mb)", path, (long long)c->chunk_elems,
                         (long long)expect->chunk_elems);
        } else if (expect->identity &&
                   (h.identity_len != strlen(now) || memcmp(saved, now, h.identity_len))) {
            char diff[1024];
            first_difference(saved, h.identity_len, now, diff, sizeof diff);
            s = CH_ERROR(CH_ERR_FORMAT, "%s: the saved state belongs to another reduction: %s; "
                         "remove %s to start over, or write to another output", path, diff, dir);
        } else {
            s = ch_reducer_state_load(r, buf + head + h.identity_len, got - head - h.identity_len);
            if (s != CH_OK) ch_error_context("%s", path);
        }
    }
    free(buf);
    return s;
}

ch_status ch_reduce_ckpt_check_dir(const char *dir, int rank)
{
    char path[4096];
    struct stat sb;
    if (stat(dir, &sb) == 0) {
        if (!S_ISDIR(sb.st_mode))
            return CH_ERROR(CH_ERR_INVALID, "%s: the resume state directory exists and is not a "
                            "directory", dir);
        ch_reduce_ckpt_path(dir, rank, path, sizeof path);
    } else {
        snprintf(path, sizeof path, "%s", dir); /* a temporary file beside it */
    }
    ch_atomic_file_t *f;
    ch_status s = ch_atomic_file_open(path, &f);
    if (s == CH_OK) ch_atomic_file_abort(f);
    else ch_error_context("resume state directory %s", dir);
    return s;
}

void ch_reduce_ckpt_remove(const char *dir, int rank)
{
    char path[4096];
    ch_reduce_ckpt_path(dir, rank, path, sizeof path);
    unlink(path);
}
