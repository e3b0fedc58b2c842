/* cohort: staging shards to node-local storage, see stage.h. */
#include "config.h"

#include "io/data/stage.h"

#include "framework/core/log.h"
#include "framework/core/profiler.h"
#include "io/data/shards.h"
#include "io/state/atomic_file.h"

#include <errno.h>
#include <fcntl.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <dirent.h>
#include <pthread.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zlib.h>

#define CHUNK (4u << 20)
#define LOCK_NAME ".cohort-stage.lock"

/* The staging directories this process uses, each with its shared lock
 * (flock LOCK_SH on DIR/.cohort-stage.lock): ch_shards_unstage removes a
 * directory only when it can take the lock exclusively, i.e. no process of
 * any job still holds it. */
typedef struct held {
    char *dir;
    int fd;
    struct held *next;
} held_t;
static held_t *g_held;
static pthread_mutex_t g_held_lock = PTHREAD_MUTEX_INITIALIZER;

/* Take the shared lock on sdir (made by the node's first rank). The lock
 * file is checked to still be the one in the directory after the lock is
 * granted (a remover may have unlinked it meanwhile: then the directory is
 * made again and locked anew). */
static ch_status hold_dir(const char *sdir)
{
    pthread_mutex_lock(&g_held_lock);
    for (held_t *h = g_held; h; h = h->next)
        if (!strcmp(h->dir, sdir)) {
            pthread_mutex_unlock(&g_held_lock);
            return CH_OK;
        }
    pthread_mutex_unlock(&g_held_lock);
    char path[4200];
    snprintf(path, sizeof path, "%s/" LOCK_NAME, sdir);
    for (int tries = 0; tries < 100; tries++) {
        if (mkdir(sdir, 0777) != 0 && errno != EEXIST)
            return CH_ERROR(CH_ERR_IO, "data.stage %s: %s", sdir, strerror(errno));
        int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
        if (fd < 0) {
            if (errno == ENOENT) continue; /* the directory was just removed */
            return CH_ERROR(CH_ERR_IO, "data.stage %s: %s", path, strerror(errno));
        }
        if (flock(fd, LOCK_SH) != 0) {
            int e = errno;
            close(fd);
            return CH_ERROR(CH_ERR_IO, "data.stage %s: lock: %s", path, strerror(e));
        }
        struct stat a, b;
        if (fstat(fd, &a) != 0 || stat(path, &b) != 0 || a.st_ino != b.st_ino || a.st_dev != b.st_dev) {
            close(fd); /* unlinked by a remover between open and lock */
            continue;
        }
        held_t *h = malloc(sizeof *h);
        char *d = strdup(sdir);
        if (!h || !d) {
            free(h);
            free(d);
            close(fd);
            return CH_ERROR(CH_ERR_NOMEM, "data.stage %s", sdir);
        }
        h->dir = d;
        h->fd = fd;
        pthread_mutex_lock(&g_held_lock);
        h->next = g_held;
        g_held = h;
        pthread_mutex_unlock(&g_held_lock);
        return CH_OK;
    }
    return CH_ERROR(CH_ERR_IO, "data.stage %s: the directory keeps being removed by another job",
                    sdir);
}

/* Drop this process's shared lock on sdir (if it holds one). */
static void release_dir(const char *sdir)
{
    pthread_mutex_lock(&g_held_lock);
    for (held_t **pp = &g_held; *pp; pp = &(*pp)->next)
        if (!strcmp((*pp)->dir, sdir)) {
            held_t *h = *pp;
            *pp = h->next;
            close(h->fd);
            free(h->dir);
            free(h);
            break;
        }
    pthread_mutex_unlock(&g_held_lock);
}

/* A file staging writes: a shard copy (.tar), the index, a sidecar
 * (.NAME.crc32) or a copy's temp file (NAME.tmp.XXXXXX). */
static int staged_name(const char *n)
{
    const size_t l = strlen(n);
    if (!strcmp(n, "cohort-shards.index")) return 1;
    if (l > 4 && !strcmp(n + l - 4, ".tar")) return 1;
    if (n[0] == '.' && l > 7 && !strcmp(n + l - 6, ".crc32")) return 1;
    return strstr(n, ".tmp.") != NULL;
}

static const char *base_name(const char *p)
{
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

/* CRC-32 of the whole file at path (CH_ERR_IO naming it). */
static ch_status file_crc(const char *path, uint8_t *buf, uint32_t *crc, uint64_t *size)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return CH_ERROR(CH_ERR_IO, "%s: %s", path, strerror(errno));
    uLong c = crc32(0L, Z_NULL, 0);
    uint64_t n = 0;
    for (;;) {
        ssize_t r = read(fd, buf, CHUNK);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            ch_status st = CH_ERROR(CH_ERR_IO, "%s: %s", path, strerror(errno));
            close(fd);
            return st;
        }
        if (r == 0) break;
        c = crc32(c, buf, (uInt)r);
        n += (uint64_t)r;
    }
    close(fd);
    *crc = (uint32_t)c;
    *size = n;
    return CH_OK;
}

/* Copy src (stat sb) to dst atomically, keeping its mtime; *crc of the
 * bytes read. */
static ch_status copy_file(const char *src, const struct stat *sb, const char *dst, uint8_t *buf,
                           uint32_t *crc)
{
    int fd = open(src, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return CH_ERROR(CH_ERR_IO, "staging %s: %s", src, strerror(errno));
    ch_atomic_file_t *f;
    ch_status st = ch_atomic_file_open(dst, &f);
    if (st != CH_OK) {
        close(fd);
        return st;
    }
    uLong c = crc32(0L, Z_NULL, 0);
    for (;;) {
        ssize_t r = read(fd, buf, CHUNK);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            st = CH_ERROR(CH_ERR_IO, "staging %s: %s", src, strerror(errno));
            ch_atomic_file_abort(f);
            close(fd);
            return st;
        }
        if (r == 0) break;
        c = crc32(c, buf, (uInt)r);
        if ((st = ch_atomic_file_write(f, buf, (size_t)r)) != CH_OK) { /* f is freed */
            close(fd);
            return st;
        }
    }
    close(fd);
    CH_TRY(ch_atomic_file_commit(f));
    struct timespec ts[2] = {sb->st_atim, sb->st_mtim};
    if (utimensat(AT_FDCWD, dst, ts, 0) != 0)
        return CH_ERROR(CH_ERR_IO, "staging %s: setting its mtime: %s", dst, strerror(errno));
    *crc = (uint32_t)c;
    return CH_OK;
}

/* Stage one file: reuse a valid copy, else copy and verify. */
static ch_status stage_file(const char *src, const char *dir, uint8_t *buf, int64_t *copied,
                            int64_t *reused, int64_t *files_copied)
{
    struct stat sb;
    if (stat(src, &sb) != 0) return CH_ERROR(CH_ERR_IO, "staging %s: %s", src, strerror(errno));
    size_t dl = strlen(dir) + strlen(base_name(src)) + 16;
    char *dst = malloc(dl), *side = malloc(dl);
    if (!dst || !side) {
        free(dst);
        free(side);
        return CH_ERROR(CH_ERR_NOMEM, "staging %s", src);
    }
    snprintf(dst, dl, "%s/%s", dir, base_name(src));
    snprintf(side, dl, "%s/.%s.crc32", dir, base_name(src));
    ch_status st = CH_OK;
    /* a copy there with a sidecar for this very source: check its bytes */
    FILE *f = fopen(side, "r");
    unsigned long long s_size = 0;
    long long s_sec = 0, s_nsec = 0;
    unsigned s_crc = 0;
    int have = f && fscanf(f, "%llu %lld %lld %x", &s_size, &s_sec, &s_nsec, &s_crc) == 4;
    if (f) fclose(f);
    if (have && s_size == (unsigned long long)sb.st_size && s_sec == (long long)sb.st_mtim.tv_sec &&
        s_nsec == (long long)sb.st_mtim.tv_nsec) {
        uint32_t c;
        uint64_t n;
        if (file_crc(dst, buf, &c, &n) == CH_OK && n == s_size && c == s_crc) {
            *reused += (int64_t)n;
            goto done;
        }
        ch_log_warn("staging: the copy %s is damaged or incomplete: copying it again", dst);
    }
    unlink(side);
    uint32_t c_src = 0, c_dst = 0;
    uint64_t n = 0;
    if ((st = copy_file(src, &sb, dst, buf, &c_src)) != CH_OK) goto done;
    if ((st = file_crc(dst, buf, &c_dst, &n)) != CH_OK) goto done;
    if (c_dst != c_src || n != (uint64_t)sb.st_size) {
        st = CH_ERROR(CH_ERR_FORMAT, "staging %s: the copy %s reads back as %llu bytes with CRC-32 "
                      "%08x, the source gave %llu bytes with %08x", src, dst, (unsigned long long)n,
                      c_dst, (unsigned long long)sb.st_size, c_src);
        unlink(dst);
        goto done;
    }
    char text[128];
    int tl = snprintf(text, sizeof text, "%llu %lld %lld %08x\n", (unsigned long long)sb.st_size,
                      (long long)sb.st_mtim.tv_sec, (long long)sb.st_mtim.tv_nsec, c_src);
    st = ch_atomic_file_write_all(side, text, (size_t)tl);
    *copied += (int64_t)n;
    (*files_copied)++;
done:
    free(dst);
    free(side);
    return st;
}

static uint32_t fnv1a32(const char *s)
{
    uint32_t h = 2166136261u;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 16777619u;
    return h;
}

ch_status ch_shards_stage(const char *spec, const char *stage_dir, ch_pg_t *pg, char **staged,
                          ch_stage_stats_t *stats)
{
    *staged = NULL;
    double t0 = ch_time_now();
    int world = pg ? ch_pg_size(pg) : 1;
    char **paths = NULL, *dir = NULL, *index = NULL, *real = NULL, *sdir = NULL;
    int n = 0, lrank = 0, lsize = 1;
    uint8_t *buf = NULL;
    int64_t sums[3] = {0, 0, 0}; /* copied, reused, files copied */
    MPI_Comm node = MPI_COMM_NULL;
    ch_status st = ch_shards_list(spec, &paths, &n, &dir);
    if (st == CH_OK) {
        index = ch_shards_index_path(spec);
        real = realpath(dir, NULL);
        buf = malloc(CHUNK);
        if (!index || !real || !buf)
            st = CH_ERROR(CH_ERR_NOMEM, "staging %s", spec);
    }
    if (st == CH_OK) {
        size_t l = strlen(stage_dir) + strlen(base_name(real)) + 16;
        sdir = malloc(l);
        if (sdir) snprintf(sdir, l, "%s/%s-%08x", stage_dir, base_name(real), fnv1a32(real));
        else st = CH_ERROR(CH_ERR_NOMEM, "staging %s", spec);
    }
    if (pg && world > 1) {
        if (MPI_Comm_split_type(ch_pg_mpi_comm(pg), MPI_COMM_TYPE_SHARED, ch_pg_rank(pg),
                                MPI_INFO_NULL, &node) != MPI_SUCCESS && st == CH_OK)
            st = CH_ERROR(CH_ERR_MPI, "staging: MPI_Comm_split_type failed");
        if (node != MPI_COMM_NULL) {
            MPI_Comm_rank(node, &lrank);
            MPI_Comm_size(node, &lsize);
        }
    }
    if (st == CH_OK && lrank == 0) {
        if (mkdir(stage_dir, 0777) != 0 && errno != EEXIST)
            st = CH_ERROR(CH_ERR_IO, "data.stage %s: %s", stage_dir, strerror(errno));
        else if (mkdir(sdir, 0777) != 0 && errno != EEXIST)
            st = CH_ERROR(CH_ERR_IO, "data.stage %s: %s", sdir, strerror(errno));
    }
    if (pg && world > 1) st = ch_pg_check_all(pg, st, NULL); /* the directory exists */
    if (st == CH_OK) st = hold_dir(sdir);
    if (pg && world > 1) st = ch_pg_check_all(pg, st, NULL);
    struct stat isb;
    int has_index = st == CH_OK && stat(index, &isb) == 0;
    for (int j = lrank; st == CH_OK && j < n + has_index; j += lsize)
        st = stage_file(j < n ? paths[j] : index, sdir, buf, &sums[0], &sums[1], &sums[2]);
    if (pg && world > 1) st = ch_pg_check_all(pg, st, NULL);
    double secs = ch_time_now() - t0;
    if (st == CH_OK && pg && world > 1) {
        st = ch_pg_allreduce(pg, sums, sums, 3, CH_DIST_INT64, CH_REDUCE_SUM);
        if (st == CH_OK) st = ch_pg_allreduce(pg, &secs, &secs, 1, CH_DIST_FLOAT64, CH_REDUCE_MAX);
    }
    if (st == CH_OK) {
        /* the spec naming the copies: the directory, or its file name / pattern inside it */
        struct stat sb;
        int is_dir = !strchr(spec, '{') && stat(spec, &sb) == 0 && S_ISDIR(sb.st_mode);
        size_t l = strlen(sdir) + strlen(spec) + 2;
        *staged = malloc(l);
        if (!*staged) st = CH_ERROR(CH_ERR_NOMEM, "staging %s", spec);
        else if (is_dir) snprintf(*staged, l, "%s", sdir);
        else snprintf(*staged, l, "%s/%s", sdir, base_name(spec));
    }
    if (st == CH_OK) {
        ch_log_info("data.stage: %s -> %s: %d files, %.1f MB copied, %.1f MB reused, %.2f s (%.0f "
                    "MB/s per node)", spec, sdir, n + has_index, sums[0] / 1e6, sums[1] / 1e6,
                    secs, (sums[0] + sums[1]) / 1e6 / (secs + 1e-9) / (world / lsize > 0 ? world / lsize : 1));
        if (stats) {
            stats->files = n + has_index;
            stats->bytes_copied = sums[0];
            stats->bytes_reused = sums[1];
            stats->files_copied = sums[2];
            stats->seconds = secs;
        }
    }
    if (node != MPI_COMM_NULL) MPI_Comm_free(&node);
    ch_shards_paths_free(paths, n);
    free(dir);
    free(index);
    free(real);
    free(sdir);
    free(buf);
    return st;
}

ch_status ch_shards_unstage(const char *staged, ch_pg_t *pg, int *removed)
{
    if (removed) *removed = 0;
    const int world = pg ? ch_pg_size(pg) : 1;
    /* the staging directory: the spec itself, or the directory of its file / pattern */
    struct stat sb;
    char sdir[4096];
    snprintf(sdir, sizeof sdir, "%s", staged);
    if (!(!strchr(staged, '{') && stat(staged, &sb) == 0 && S_ISDIR(sb.st_mode))) {
        char *slash = strrchr(sdir, '/');
        if (slash) *slash = 0;
    }
    ch_status st = CH_OK;
    if (pg && world > 1) st = ch_pg_barrier(pg); /* every rank has done reading */
    release_dir(sdir);
    if (st == CH_OK && pg && world > 1) st = ch_pg_barrier(pg); /* every lock dropped */
    int lrank = 0;
    MPI_Comm node = MPI_COMM_NULL;
    if (st == CH_OK && pg && world > 1) {
        if (MPI_Comm_split_type(ch_pg_mpi_comm(pg), MPI_COMM_TYPE_SHARED, ch_pg_rank(pg),
                                MPI_INFO_NULL, &node) != MPI_SUCCESS)
            st = CH_ERROR(CH_ERR_MPI, "unstaging: MPI_Comm_split_type failed");
        else
            MPI_Comm_rank(node, &lrank);
    }
    int64_t counts[2] = {0, 0}; /* files, bytes removed */
    int gone = 0;
    if (st == CH_OK && lrank == 0) {
        char lock[4200];
        snprintf(lock, sizeof lock, "%s/" LOCK_NAME, sdir);
        int fd = open(lock, O_RDWR | O_CLOEXEC);
        if (fd < 0) {
            ch_log_warn("data.stage: %s: %s; the staged copies are left", lock, strerror(errno));
        } else if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
            ch_log_info("data.stage: %s is in use by another job: the staged copies are kept", sdir);
        } else {
            DIR *d = opendir(sdir);
            struct dirent *e;
            char path[4400];
            while (d && (e = readdir(d)) != NULL) {
                if (!staged_name(e->d_name)) continue;
                snprintf(path, sizeof path, "%s/%s", sdir, e->d_name);
                struct stat fsb;
                if (lstat(path, &fsb) == 0 && S_ISREG(fsb.st_mode) && unlink(path) == 0 &&
                    e->d_name[0] != '.') { /* counted: the copies, not their sidecars */
                    counts[0]++;
                    counts[1] += (int64_t)fsb.st_size;
                }
            }
            if (d) closedir(d);
            unlink(lock); /* before the lock is released: a new stager sees a fresh file */
            gone = rmdir(sdir) == 0;
            if (!gone)
                ch_log_info("data.stage: %s: %s (other files in it are kept)", sdir, strerror(errno));
        }
        if (fd >= 0) close(fd);
    }
    if (node != MPI_COMM_NULL) MPI_Comm_free(&node);
    if (pg && world > 1) {
        st = ch_pg_check_all(pg, st, NULL);
        if (st == CH_OK) st = ch_pg_allreduce(pg, counts, counts, 2, CH_DIST_INT64, CH_REDUCE_SUM);
    }
    if (st == CH_OK && counts[0] > 0)
        ch_log_info("data.stage: removed the staged copies in %s (%lld files, %.1f MB, summed "
                    "over the nodes)", sdir, (long long)counts[0], counts[1] / 1e6);
    if (removed) *removed = (int)counts[0];
    (void)gone;
    return st;
}
