/* cohort: the shard dataset (WebDataset tar shards read by index), see shards.h. */
#include "config.h"

#include "io/data/shards.h"

#include "framework/core/log.h"
#include "io/state/atomic_file.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ------------------------------------------------------------ shard list */

void ch_shards_paths_free(char **paths, int n)
{
    if (!paths) return;
    for (int k = 0; k < n; k++) free(paths[k]);
    free(paths);
}

static char *dir_of(const char *path)
{
    const char *sl = strrchr(path, '/');
    if (!sl) return strdup(".");
    if (sl == path) return strdup("/");
    return strndup(path, (size_t)(sl - path));
}

static int push(char ***v, int *n, int *cap, char *s)
{
    if (!s) return -1;
    if (*n == *cap) {
        int nc = *cap ? 2 * *cap : 64;
        char **p = realloc(*v, (size_t)nc * sizeof *p);
        if (!p) {
            free(s);
            return -1;
        }
        *v = p;
        *cap = nc;
    }
    (*v)[(*n)++] = s;
    return 0;
}

static int parse_dec(const char *s, size_t n, long long *v)
{
    if (n == 0 || n > 15) return -1;
    long long x = 0;
    for (size_t k = 0; k < n; k++) {
        if (s[k] < '0' || s[k] > '9') return -1;
        x = x * 10 + (s[k] - '0');
    }
    *v = x;
    return 0;
}

ch_status ch_shards_list(const char *spec, char ***paths, int *n, char **dir)
{
    *paths = NULL;
    *n = 0;
    *dir = NULL;
    CH_REQUIRE(spec && spec[0], "data.format = shards: data.path is empty");
    char **v = NULL;
    int cnt = 0, cap = 0;
    struct stat sb;
    const char *brace = strchr(spec, '{');
    if (!brace && stat(spec, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        DIR *d = opendir(spec);
        if (!d) return CH_ERROR(CH_ERR_IO, "shards %s: %s", spec, strerror(errno));
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            size_t l = strlen(e->d_name);
            if (e->d_name[0] == '.' || l < 5 || strcmp(e->d_name + l - 4, ".tar")) continue;
            char *p = ch_dataset_path_join(spec, e->d_name);
            struct stat fs;
            if (p && (stat(p, &fs) != 0 || !S_ISREG(fs.st_mode))) {
                free(p);
                continue;
            }
            if (push(&v, &cnt, &cap, p)) {
                closedir(d);
                ch_shards_paths_free(v, cnt);
                return CH_ERROR(CH_ERR_NOMEM, "shards %s: out of memory", spec);
            }
        }
        closedir(d);
        if (cnt == 0) return CH_ERROR(CH_ERR_IO, "shards %s: the directory holds no .tar file", spec);
        qsort(v, (size_t)cnt, sizeof *v, ch_dataset_cmp_str);
        *dir = strdup(spec);
    } else if (brace) {
        const char *dots = strstr(brace, ".."), *close = strchr(brace, '}');
        const char *slash = strrchr(spec, '/');
        long long a, b;
        if (!dots || !close || dots > close || (slash && slash > brace) ||
            strchr(close + 1, '{') || strchr(close + 1, '}') ||
            parse_dec(brace + 1, (size_t)(dots - brace - 1), &a) ||
            parse_dec(dots + 2, (size_t)(close - dots - 2), &b) || a > b || b - a >= 1000000)
            return CH_ERROR(CH_ERR_CONFIG, "shards %s: expected one {A..B} of decimal numbers "
                            "(A <= B, at most 10^6 shards) in the file name, as "
                            "name-{000000..000099}.tar", spec);
        int width = (int)(dots - brace - 1);
        for (long long k = a; k <= b; k++) {
            size_t need = strlen(spec) + 32;
            char *p = malloc(need);
            if (p)
                snprintf(p, need, "%.*s%0*lld%s", (int)(brace - spec), spec, width, k, close + 1);
            if (push(&v, &cnt, &cap, p)) {
                ch_shards_paths_free(v, cnt);
                return CH_ERROR(CH_ERR_NOMEM, "shards %s: out of memory", spec);
            }
            if (stat(p, &sb) != 0 || !S_ISREG(sb.st_mode)) {
                ch_status st = CH_ERROR(CH_ERR_IO, "shards %s: shard %s is missing (%s)", spec, p,
                                        errno && stat(p, &sb) != 0 ? strerror(errno)
                                                                   : "not a regular file");
                ch_shards_paths_free(v, cnt);
                return st;
            }
        }
        *dir = dir_of(spec);
    } else {
        if (stat(spec, &sb) != 0)
            return CH_ERROR(CH_ERR_IO, "shards %s: %s", spec, strerror(errno));
        if (!S_ISREG(sb.st_mode))
            return CH_ERROR(CH_ERR_IO, "shards %s: not a directory, a .tar file or a "
                            "{A..B} pattern", spec);
        if (push(&v, &cnt, &cap, strdup(spec)))
            return CH_ERROR(CH_ERR_NOMEM, "shards %s: out of memory", spec);
        *dir = dir_of(spec);
    }
    if (!*dir) {
        ch_shards_paths_free(v, cnt);
        return CH_ERROR(CH_ERR_NOMEM, "shards %s: out of memory", spec);
    }
    *paths = v;
    *n = cnt;
    return CH_OK;
}

char *ch_shards_index_path(const char *spec)
{
    struct stat sb;
    if (!strchr(spec, '{') && stat(spec, &sb) == 0 && S_ISDIR(sb.st_mode))
        return ch_dataset_path_join(spec, "cohort-shards.index");
    size_t l = strlen(spec);
    char *p = malloc(l + 7);
    if (p) {
        memcpy(p, spec, l);
        memcpy(p + l, ".index", 7);
    }
    return p;
}

/* ------------------------------------------------------------ the dataset */

typedef struct {
    ch_shard_index_t idx;
    char **paths;    /* idx.nshards full paths */
    int *fds;        /* -1 until opened (set once, atomically) */
    int64_t opened;  /* files opened (atomic counter) */
} shards_impl_t;

static const char *base_name(const char *p)
{
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

typedef struct {
    int fd;
} fd_ctx_t;

static int64_t fd_read(void *ctx, uint64_t off, void *buf, size_t len)
{
    const fd_ctx_t *c = ctx;
    size_t got = 0;
    while (got < len) {
        ssize_t r = pread(c->fd, (char *)buf + got, len - got, (off_t)(off + got));
        if (r < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (r == 0) break;
        got += (size_t)r;
    }
    return (int64_t)got;
}

/* Does the file's stat still match what the index recorded? */
static int stat_matches(const struct stat *sb, const ch_shard_entry_t *e)
{
    return (uint64_t)sb->st_size == e->size && (int64_t)sb->st_mtim.tv_sec == e->mtime_s &&
           (int64_t)sb->st_mtim.tv_nsec == e->mtime_ns;
}

static ch_status stale_error(const char *index_path, const char *shard, const char *why)
{
    return CH_ERROR(CH_ERR_FORMAT, "shard index %s is stale: %s %s since it was built (delete the "
                    "index to rebuild it, or restore the shards)", index_path, shard, why);
}

static int shard_fd(const ch_dataset_t *ds, int s, ch_status *st)
{
    shards_impl_t *im = ds->impl;
    int fd = __atomic_load_n(&im->fds[s], __ATOMIC_ACQUIRE);
    if (fd >= 0) return fd;
    fd = open(im->paths[s], O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        *st = CH_ERROR(CH_ERR_IO, "shard %s: %s", im->paths[s], strerror(errno));
        return -1;
    }
    __atomic_add_fetch(&im->opened, 1, __ATOMIC_RELAXED);
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !stat_matches(&sb, &im->idx.shards[s])) {
        close(fd);
        *st = CH_ERROR(CH_ERR_FORMAT, "shard %s changed since the dataset was opened (size or "
                       "mtime differ from its index)", im->paths[s]);
        return -1;
    }
    int expected = -1;
    if (!__atomic_compare_exchange_n(&im->fds[s], &expected, fd, 0, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE)) {
        close(fd); /* another thread opened it first */
        fd = expected;
    }
    return fd;
}

static ch_status shards_get(const ch_dataset_t *ds, int64_t i, ch_image_t *img, int64_t *label)
{
    const shards_impl_t *im = ds->impl;
    int s = ch_shard_index_find(&im->idx, i);
    const ch_shard_entry_t *e = &im->idx.shards[s];
    const ch_shard_sample_t *x = &e->samples[i - im->idx.first[s]];
    ch_status st = CH_OK;
    int fd = shard_fd(ds, s, &st);
    if (fd < 0) return ch_error_context("shards %s: sample %lld", ds->name, (long long)i);
    CH_TRY(ch_image_reserve_raw(img, (size_t)x->size + 1));
    fd_ctx_t c = {fd};
    int64_t r = fd_read(&c, x->offset, img->raw, (size_t)x->size);
    if (r != (int64_t)x->size)
        return CH_ERROR(CH_ERR_IO, "shard %s: sample %lld (key %.*s): %s at byte %llu", im->paths[s],
                        (long long)i, (int)x->key_len, e->keys + x->key_off,
                        r < 0 ? strerror(errno) : "short read", (unsigned long long)x->offset);
    img->raw_size = (size_t)x->size;
    char name[CH_SHARD_KEY_MAX + 512];
    snprintf(name, sizeof name, "%s:%.*s.%s", im->paths[s], (int)x->key_len, e->keys + x->key_off,
             x->kind == CH_SHARD_PNG ? "png" : "jpg");
    st = ch_image_decode(img->raw, img->raw_size, ds->channels, img, name);
    if (st != CH_OK) return ch_error_context("shards %s: sample %lld", ds->name, (long long)i);
    *label = x->label;
    return CH_OK;
}

static const char *shards_sample_path(const ch_dataset_t *ds, int64_t i)
{
    const shards_impl_t *im = ds->impl;
    return im->paths[ch_shard_index_find(&im->idx, i)];
}

static void shards_destroy(ch_dataset_t *ds)
{
    shards_impl_t *im = ds->impl;
    if (!im) return;
    for (int s = 0; s < im->idx.nshards; s++)
        if (im->fds && im->fds[s] >= 0) close(im->fds[s]);
    free(im->fds);
    ch_shards_paths_free(im->paths, im->idx.nshards);
    ch_shard_index_free(&im->idx);
    free(im);
}

int64_t ch_dataset_shards_files_opened(const ch_dataset_t *ds)
{
    if (!ds || !ds->kind || strcmp(ds->kind, "shards")) return 0;
    const shards_impl_t *im = ds->impl;
    return __atomic_load_n(&im->opened, __ATOMIC_RELAXED);
}

const ch_shard_index_t *ch_dataset_shards_index(const ch_dataset_t *ds)
{
    if (!ds || !ds->kind || strcmp(ds->kind, "shards")) return NULL;
    return &((const shards_impl_t *)ds->impl)->idx;
}

/* ------------------------------------------------------------ open */

static ch_status agree(ch_pg_t *pg, ch_status local)
{
    if (!pg || ch_pg_size(pg) == 1) return local;
    return ch_pg_check_all(pg, local, NULL);
}

/* Check a parsed index against the shards' current names and stat. */
static ch_status index_check(const char *index_path, char **paths, int n, const struct stat *sbs,
                             const ch_shard_index_t *idx)
{
    for (int s = 0; s < n && s < idx->nshards; s++) {
        if (strcmp(idx->shards[s].name, base_name(paths[s])))
            return CH_ERROR(CH_ERR_FORMAT, "shard index %s is stale: its shard %d is %s but the "
                            "shards now list %s there (shards added, removed or renamed; delete "
                            "the index to rebuild it)", index_path, s, idx->shards[s].name, paths[s]);
        if (!stat_matches(&sbs[s], &idx->shards[s]))
            return stale_error(index_path, paths[s],
                               (uint64_t)sbs[s].st_size != idx->shards[s].size
                                   ? "changed size" : "was modified (mtime)");
    }
    if (idx->nshards != n)
        return CH_ERROR(CH_ERR_FORMAT, "shard index %s is stale: it lists %d shards, %d are there "
                        "now (delete the index to rebuild it)", index_path, idx->nshards, n);
    return CH_OK;
}

/* Rank 0 reads the index file (*len = -1: there is none) and stats every
 * shard; the bytes go to every rank (one read of the file, not one per
 * rank), each rank parses them, rank 0 checks them against the shards
 * (every other rank's first read of a shard checks that shard by fstat). */
static ch_status index_load(const char *index_path, char **paths, int n, ch_pg_t *pg,
                            ch_shard_index_t *idx, int *found)
{
    int rank = pg ? ch_pg_rank(pg) : 0, world = pg ? ch_pg_size(pg) : 1;
    *found = 0;
    uint8_t *buf = NULL;
    size_t blen = 0;
    int64_t len = -1;
    struct stat *sbs = NULL;
    ch_status st = CH_OK;
    if (rank == 0) {
        sbs = calloc((size_t)n, sizeof *sbs);
        if (!sbs) st = CH_ERROR(CH_ERR_NOMEM, "shard index %s: out of memory", index_path);
        for (int s = 0; st == CH_OK && s < n; s++)
            if (stat(paths[s], &sbs[s]) != 0)
                st = CH_ERROR(CH_ERR_IO, "shard %s: %s", paths[s], strerror(errno));
        struct stat sb;
        if (st == CH_OK && !(stat(index_path, &sb) != 0 && errno == ENOENT)) {
            st = ch_dataset_read_file(index_path, &buf, &blen);
            if (st == CH_OK) len = (int64_t)blen;
        }
    }
    st = agree(pg, st);
    if (st == CH_OK && world > 1) {
        st = ch_pg_broadcast(pg, &len, 1, CH_DIST_INT64, 0);
        if (st == CH_OK && len >= 0 && rank != 0) {
            buf = malloc(len ? (size_t)len : 1);
            if (!buf) st = CH_ERROR(CH_ERR_NOMEM, "shard index %s: %lld bytes", index_path,
                                    (long long)len);
        }
        st = agree(pg, st);
        if (st == CH_OK && len > 0) st = ch_pg_broadcast(pg, buf, len, CH_DIST_UINT8, 0);
    }
    if (st == CH_OK && len >= 0) {
        st = ch_shard_index_parse(buf, (size_t)len, index_path, idx);
        if (st == CH_OK && rank == 0) st = index_check(index_path, paths, n, sbs, idx);
        st = agree(pg, st);
        *found = st == CH_OK;
        if (st != CH_OK) ch_shard_index_free(idx);
    }
    free(buf);
    free(sbs);
    return st;
}

static ch_status scan_one(const char *path, ch_shard_entry_t *e)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return CH_ERROR(CH_ERR_IO, "shard %s: %s", path, strerror(errno));
    struct stat sbuf, *sb = &sbuf;
    if (fstat(fd, sb) != 0) {
        ch_status st = CH_ERROR(CH_ERR_IO, "shard %s: %s", path, strerror(errno));
        close(fd);
        return st;
    }
    fd_ctx_t c = {fd};
    ch_status st = ch_tar_scan(fd_read, &c, (uint64_t)sb->st_size, path, e);
    close(fd);
    CH_TRY(st);
    if (e->n == 0) {
        ch_shard_entry_free(e);
        return CH_ERROR(CH_ERR_FORMAT, "shard %s: no samples (no KEY.jpg/.png + KEY.cls members)",
                        path);
    }
    e->name = strdup(base_name(path));
    if (!e->name) {
        ch_shard_entry_free(e);
        return CH_ERROR(CH_ERR_NOMEM, "shard %s: out of memory", path);
    }
    e->size = (uint64_t)sb->st_size;
    e->mtime_s = (int64_t)sb->st_mtim.tv_sec;
    e->mtime_ns = (int64_t)sb->st_mtim.tv_nsec;
    return CH_OK;
}

/* Every rank gets every shard's records; shard s was scanned by rank
 * s % world (pg size > 1). One all-reduce of the shards' counts, sizes and
 * mtimes, then one broadcast per rank of all the records it scanned
 * (samples, then keys, shard after shard): world + 2 collectives, not 5
 * per shard (on a busy node each collective can cost a scheduler slice:
 * 30 of them took 0.14 s of a 6-shard pack on 2 shared vCPUs). */
static ch_status share_entries(ch_pg_t *pg, ch_shard_index_t *idx, char **paths, int n)
{
    enum { F = 5 }; /* n, keys_len, size, mtime_s, mtime_ns */
    int rank = ch_pg_rank(pg), world = ch_pg_size(pg);
    ch_shard_entry_t *e = idx->shards;
    int64_t *h = calloc((size_t)n * F, sizeof *h);
    ch_status st = h ? CH_OK : CH_ERROR(CH_ERR_NOMEM, "shard index: out of memory");
    for (int s = rank; st == CH_OK && s < n; s += world) {
        int64_t v[F] = {e[s].n, (int64_t)e[s].keys_len, (int64_t)e[s].size, e[s].mtime_s,
                        e[s].mtime_ns};
        memcpy(h + (size_t)s * F, v, sizeof v);
    }
    st = agree(pg, st);
    if (st == CH_OK) st = ch_pg_allreduce(pg, h, h, (int64_t)n * F, CH_DIST_INT64, CH_REDUCE_SUM);
    for (int s = 0; st == CH_OK && s < n; s++) {
        if (s % world == rank) continue;
        const int64_t *v = h + (size_t)s * F;
        e[s].n = v[0];
        e[s].keys_len = (size_t)v[1];
        e[s].size = (uint64_t)v[2];
        e[s].mtime_s = v[3];
        e[s].mtime_ns = v[4];
        e[s].samples = malloc((size_t)(e[s].n ? e[s].n : 1) * sizeof *e[s].samples);
        e[s].keys = malloc(e[s].keys_len ? e[s].keys_len : 1);
        e[s].name = strdup(base_name(paths[s]));
        if (!e[s].samples || !e[s].keys || !e[s].name)
            st = CH_ERROR(CH_ERR_NOMEM, "shard %s: out of memory", paths[s]);
    }
    free(h);
    uint8_t *buf = NULL;
    for (int r = 0; r < world; r++) {
        size_t total = 0;
        for (int s = r; s < n; s += world)
            total += (size_t)e[s].n * sizeof *e[s].samples + e[s].keys_len;
        free(buf);
        buf = st == CH_OK ? malloc(total ? total : 1) : NULL;
        if (st == CH_OK && !buf) st = CH_ERROR(CH_ERR_NOMEM, "shard index: %zu bytes", total);
        st = agree(pg, st);
        if (st != CH_OK) break;
        size_t at = 0;
        for (int s = r; r == rank && s < n; s += world) {
            memcpy(buf + at, e[s].samples, (size_t)e[s].n * sizeof *e[s].samples);
            at += (size_t)e[s].n * sizeof *e[s].samples;
            memcpy(buf + at, e[s].keys, e[s].keys_len);
            at += e[s].keys_len;
        }
        if (total) st = ch_pg_broadcast(pg, buf, (int64_t)total, CH_DIST_UINT8, r);
        if (st != CH_OK) break;
        at = 0;
        for (int s = r; r != rank && s < n; s += world) {
            memcpy(e[s].samples, buf + at, (size_t)e[s].n * sizeof *e[s].samples);
            at += (size_t)e[s].n * sizeof *e[s].samples;
            memcpy(e[s].keys, buf + at, e[s].keys_len);
            at += e[s].keys_len;
        }
    }
    free(buf);
    return st;
}

static ch_status index_build(const char *spec, const char *index_path, char **paths, int n,
                             ch_pg_t *pg, ch_shard_index_t *idx)
{
    int rank = pg ? ch_pg_rank(pg) : 0, world = pg ? ch_pg_size(pg) : 1;
    memset(idx, 0, sizeof *idx);
    idx->shards = calloc((size_t)n, sizeof *idx->shards);
    ch_status st = idx->shards ? CH_OK : CH_ERROR(CH_ERR_NOMEM, "shards %s: out of memory", spec);
    if (st == CH_OK) idx->nshards = n;
    for (int s = rank; st == CH_OK && s < n; s += world) st = scan_one(paths[s], &idx->shards[s]);
    st = agree(pg, st);
    if (st == CH_OK && world > 1) st = share_entries(pg, idx, paths, n);
    if (st == CH_OK) st = ch_shard_index_finish(idx);
    if (st == CH_OK && rank == 0) {
        uint8_t *buf;
        size_t len;
        ch_status w = ch_shard_index_encode(idx, &buf, &len);
        if (w == CH_OK) {
            w = ch_atomic_file_write_all(index_path, buf, len);
            free(buf);
        }
        if (w == CH_OK)
            ch_log_info("shards %s: built the index of %d shards, %lld samples: %s", spec, n,
                        (long long)idx->total, index_path);
        else
            ch_log_warn("shards %s: index not written (%s); it is kept in memory for this run",
                        spec, ch_error_message());
    }
    if (st == CH_OK && pg && world > 1) st = ch_pg_barrier(pg);
    if (st != CH_OK) ch_shard_index_free(idx);
    return st;
}

ch_status ch_dataset_shards_open(const char *spec, int channels, ch_pg_t *pg, ch_dataset_t **out)
{
    *out = NULL;
    CH_REQUIRE(channels == 1 || channels == 3, "shards %s: channels %d (expected 1 or 3)",
               spec ? spec : "(null)", channels);
    char **paths = NULL, *dir = NULL, *index_path = NULL;
    int n = 0, found = 0;
    ch_shard_index_t idx;
    memset(&idx, 0, sizeof idx);
    ch_status st = ch_shards_list(spec, &paths, &n, &dir);
    free(dir);
    if (st == CH_OK && !(index_path = ch_shards_index_path(spec)))
        st = CH_ERROR(CH_ERR_NOMEM, "shards %s: out of memory", spec);
    st = agree(pg, st);
    if (st == CH_OK) st = index_load(index_path, paths, n, pg, &idx, &found);
    if (st == CH_OK && !found) st = index_build(spec, index_path, paths, n, pg, &idx);
    free(index_path);
    ch_dataset_t *ds = NULL;
    shards_impl_t *im = NULL;
    if (st == CH_OK) {
        ds = calloc(1, sizeof *ds);
        im = calloc(1, sizeof *im);
        if (ds) ds->name = strdup(spec);
        if (im) im->fds = malloc((size_t)n * sizeof *im->fds);
        if (!ds || !im || !ds->name || !im->fds)
            st = CH_ERROR(CH_ERR_NOMEM, "shards %s: out of memory", spec);
    }
    if (st != CH_OK) {
        if (ds) free(ds->name);
        free(ds);
        if (im) free(im->fds);
        free(im);
        ch_shards_paths_free(paths, n);
        ch_shard_index_free(&idx);
        return st;
    }
    int64_t max_label = -1;
    int same = 1; /* every image of one size (from the headers): the dataset's size */
    const ch_shard_sample_t *x0 = &idx.shards[0].samples[0];
    for (int s = 0; s < n; s++) {
        im->fds[s] = -1;
        for (int64_t i = 0; i < idx.shards[s].n; i++) {
            const ch_shard_sample_t *x = &idx.shards[s].samples[i];
            if (x->label > max_label) max_label = x->label;
            same &= x->width == x0->width && x->height == x0->height;
        }
    }
    if (same && x0->width > 0 && x0->height > 0) {
        ds->width = x0->width;
        ds->height = x0->height;
    }
    im->idx = idx;
    im->paths = paths;
    ds->kind = "shards";
    ds->length = idx.total;
    ds->num_classes = (int)(max_label + 1);
    ds->channels = channels;
    ds->get = shards_get;
    ds->sample_path = shards_sample_path;
    ds->destroy_impl = shards_destroy;
    ds->impl = im;
    *out = ds;
    return CH_OK;
}
