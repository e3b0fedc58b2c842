/* cohort: atomic replacement of a file (see atomic_file.h). */
#define _GNU_SOURCE /* mkostemp, O_CLOEXEC */
#include "config.h"

#include "io/state/atomic_file.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define BUF_SIZE ((size_t)1 << 20)
#define TMP_TAG ".tmp."
#define TMP_X "XXXXXX"

struct ch_atomic_file {
    int fd;
    char *path;   /* target */
    char *dir;    /* its directory ("." when path has no slash) */
    char *tmp;    /* temporary file */
    unsigned char *buf;
    size_t used;  /* bytes in buf */
    size_t total; /* bytes appended */
};

/* Split path into directory and final component (both malloc'd). */
static ch_status split_path(const char *path, char **dir, char **base)
{
    const char *slash = strrchr(path, '/');
    *dir = *base = NULL;
    if (!path[0]) return CH_ERROR(CH_ERR_INVALID, "atomic write: empty file name");
    if (slash && !slash[1])
        return CH_ERROR(CH_ERR_INVALID, "atomic write to '%s': path ends with '/', expected a file name", path);
    if (!slash) {
        *dir = strdup(".");
        *base = strdup(path);
    } else if (slash == path) {
        *dir = strdup("/");
        *base = strdup(slash + 1);
    } else {
        *dir = strndup(path, (size_t)(slash - path));
        *base = strdup(slash + 1);
    }
    if (!*dir || !*base) {
        free(*dir);
        free(*base);
        *dir = *base = NULL;
        return CH_ERROR(CH_ERR_NOMEM, "atomic write to '%s': out of memory", path);
    }
    return CH_OK;
}

/* The process umask, read without changing it (umask(2) is process-wide and
 * not thread-safe to probe). Falls back to 022. */
static mode_t current_umask(void)
{
    mode_t m = 022;
    FILE *f = fopen("/proc/self/status", "re");
    char line[256];
    if (!f) return m;
    while (fgets(line, sizeof line, f)) {
        unsigned v;
        if (sscanf(line, "Umask: %o", &v) == 1) {
            m = (mode_t)v;
            break;
        }
    }
    fclose(f);
    return m;
}

static void destroy(ch_atomic_file_t *f, int remove_tmp)
{
    if (!f) return;
    if (f->fd >= 0) close(f->fd);
    if (remove_tmp && f->tmp) unlink(f->tmp);
    free(f->path);
    free(f->dir);
    free(f->tmp);
    free(f->buf);
    free(f);
}

ch_status ch_atomic_file_open(const char *path, ch_atomic_file_t **out)
{
    ch_atomic_file_t *f;
    char *base = NULL;
    struct stat sb;
    size_t len;
    ch_status s;

    *out = NULL;
    if (!path) return CH_ERROR(CH_ERR_INVALID, "atomic write: NULL path");
    f = calloc(1, sizeof *f);
    if (!f) return CH_ERROR(CH_ERR_NOMEM, "atomic write to '%s': out of memory", path);
    f->fd = -1;
    s = split_path(path, &f->dir, &base);
    if (s) {
        destroy(f, 0);
        return s;
    }
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        free(base);
        destroy(f, 0);
        return CH_ERROR(CH_ERR_INVALID, "cannot write '%s': it is a directory", path);
    }
    len = strlen(f->dir) + 2 + strlen(base) + strlen(TMP_TAG) + strlen(TMP_X) + 1;
    f->path = strdup(path);
    f->tmp = malloc(len);
    f->buf = malloc(BUF_SIZE);
    if (!f->path || !f->tmp || !f->buf) {
        free(base);
        destroy(f, 0);
        return CH_ERROR(CH_ERR_NOMEM, "atomic write to '%s': out of memory", path);
    }
    snprintf(f->tmp, len, "%s/.%s%s%s", f->dir, base, TMP_TAG, TMP_X);
    free(base);
    f->fd = mkostemp(f->tmp, O_CLOEXEC);
    if (f->fd < 0) {
        int e = errno;
        s = CH_ERROR(CH_ERR_IO, "cannot write '%s': creating a temporary file in directory '%s' failed: %s",
                     path, f->dir, strerror(e));
        free(f->tmp);
        f->tmp = NULL; /* nothing was created */
        destroy(f, 0);
        return s;
    }
    if (fchmod(f->fd, 0666 & ~current_umask()) != 0) {
        int e = errno;
        s = CH_ERROR(CH_ERR_IO, "cannot write '%s': fchmod of temporary '%s' failed: %s", path,
                     f->tmp, strerror(e));
        destroy(f, 1);
        return s;
    }
    *out = f;
    return CH_OK;
}

/* write(2) all of buf, retrying on EINTR and partial writes. Returns 0 or an
 * errno value. */
static int write_fully(int fd, const unsigned char *buf, size_t size)
{
    while (size > 0) {
        ssize_t w = write(fd, buf, size > ((size_t)1 << 30) ? ((size_t)1 << 30) : size);
        if (w < 0) {
            if (errno == EINTR) continue;
            return errno;
        }
        if (w == 0) return EIO;
        buf += w;
        size -= (size_t)w;
    }
    return 0;
}

/* On failure: remove the temporary, free f, return the error. */
static ch_status fail_errno(ch_atomic_file_t *f, const char *what, int e)
{
    ch_status s = CH_ERROR(CH_ERR_IO, "writing '%s' failed (%s of temporary '%s'): %s; '%s' is unchanged",
                           f->path, what, f->tmp, strerror(e), f->path);
    destroy(f, 1);
    return s;
}

static int flush_buf(ch_atomic_file_t *f)
{
    int e = write_fully(f->fd, f->buf, f->used);
    if (!e) f->used = 0;
    return e;
}

ch_status ch_atomic_file_write(ch_atomic_file_t *f, const void *buf, size_t size)
{
    const unsigned char *p = buf;
    int e;
    if (!f) return CH_ERROR(CH_ERR_INVALID, "atomic write: NULL file");
    if (size && !buf) {
        ch_status s = CH_ERROR(CH_ERR_INVALID, "writing '%s': NULL buffer of %zu bytes", f->path, size);
        destroy(f, 1);
        return s;
    }
    if (f->used + size <= BUF_SIZE) {
        if (size) memcpy(f->buf + f->used, p, size);
        f->used += size;
        f->total += size;
        return CH_OK;
    }
    if ((e = flush_buf(f))) return fail_errno(f, "write", e);
    if (size >= BUF_SIZE) {
        if ((e = write_fully(f->fd, p, size))) return fail_errno(f, "write", e);
    } else {
        memcpy(f->buf, p, size);
        f->used = size;
    }
    f->total += size;
    return CH_OK;
}

size_t ch_atomic_file_size(const ch_atomic_file_t *f) { return f ? f->total : 0; }

const char *ch_atomic_file_temp_path(const ch_atomic_file_t *f) { return f ? f->tmp : NULL; }

ch_status ch_atomic_file_commit(ch_atomic_file_t *f)
{
    int e, dfd;
    ch_status s = CH_OK;
    if (!f) return CH_ERROR(CH_ERR_INVALID, "atomic write: NULL file");
    if ((e = flush_buf(f))) return fail_errno(f, "write", e);
    if (fsync(f->fd) != 0) return fail_errno(f, "fsync", errno);
    e = close(f->fd);
    f->fd = -1;
    if (e != 0) return fail_errno(f, "close", errno);
    if (rename(f->tmp, f->path) != 0) return fail_errno(f, "rename", errno);
    /* The temporary is now the target: do not remove it below. */
    dfd = open(f->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0 || fsync(dfd) != 0) {
        e = errno;
        /* Some file systems refuse fsync on directories (EINVAL): the rename
         * is done and visible, only its durability is not guaranteed. */
        if (e != EINVAL && e != EROFS)
            s = CH_ERROR(CH_ERR_IO, "wrote '%s' but fsync of its directory '%s' failed: %s",
                         f->path, f->dir, strerror(e));
    }
    if (dfd >= 0) close(dfd);
    destroy(f, 0);
    return s;
}

void ch_atomic_file_abort(ch_atomic_file_t *f) { destroy(f, 1); }

ch_status ch_atomic_file_remove_stale(const char *path, int *removed)
{
    char *dir = NULL, *base = NULL;
    DIR *d;
    struct dirent *ent;
    size_t plen;
    char *prefix;
    int n = 0;
    ch_status s = CH_OK;

    if (removed) *removed = 0;
    if (!path) return CH_ERROR(CH_ERR_INVALID, "remove stale temporaries: NULL path");
    CH_TRY(split_path(path, &dir, &base));
    plen = strlen(base) + 1 + strlen(TMP_TAG);
    prefix = malloc(plen + 1);
    if (!prefix) {
        free(dir);
        free(base);
        return CH_ERROR(CH_ERR_NOMEM, "out of memory");
    }
    snprintf(prefix, plen + 1, ".%s%s", base, TMP_TAG);
    d = opendir(dir);
    if (!d) {
        s = CH_ERROR(CH_ERR_IO, "cannot read directory '%s' to remove stale temporaries of '%s': %s",
                     dir, path, strerror(errno));
        goto out;
    }
    while ((ent = readdir(d)) != NULL) {
        size_t len = strlen(ent->d_name);
        char *full;
        size_t flen;
        if (len != plen + strlen(TMP_X) || strncmp(ent->d_name, prefix, plen) != 0) continue;
        flen = strlen(dir) + 1 + len + 1;
        full = malloc(flen);
        if (!full) {
            s = CH_ERROR(CH_ERR_NOMEM, "out of memory");
            break;
        }
        snprintf(full, flen, "%s/%s", dir, ent->d_name);
        if (unlink(full) == 0) {
            n++;
        } else if (errno != ENOENT) {
            s = CH_ERROR(CH_ERR_IO, "cannot remove stale temporary '%s': %s", full, strerror(errno));
            free(full);
            break;
        }
        free(full);
    }
    closedir(d);
out:
    if (removed) *removed = n;
    free(prefix);
    free(dir);
    free(base);
    return s;
}

ch_status ch_atomic_file_write_all(const char *path, const void *buf, size_t size)
{
    ch_atomic_file_t *f;
    CH_TRY(ch_atomic_file_open(path, &f));
    CH_TRY(ch_atomic_file_write(f, buf, size));
    return ch_atomic_file_commit(f);
}
