/* cohort: checkpoint files of a chunked reduction, see reduce_ckpt.h. */
#include "config.h"

#include "io/state/reduce_ckpt.h"

#include "io/state/atomic_file.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char ckpt_magic[8] = {'C', 'H', 'R', 'D', 'C', 'K', '0', '1'};

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
    size_t n = ch_reducer_state_size(r);
    unsigned char *buf = malloc(sizeof ckpt_magic + sizeof *c + n);
    if (!buf) return CH_ERROR(CH_ERR_NOMEM, "%s: state of %zu bytes", path, n);
    memcpy(buf, ckpt_magic, sizeof ckpt_magic);
    memcpy(buf + sizeof ckpt_magic, c, sizeof *c);
    ch_reducer_state_save(r, buf + sizeof ckpt_magic + sizeof *c);
    ch_status s = ch_atomic_file_write_all(path, buf, sizeof ckpt_magic + sizeof *c + n);
    free(buf);
    return s;
}

ch_status ch_reduce_ckpt_load(const char *dir, ch_reducer_t *r, const ch_reduce_ckpt_t *expect,
                              ch_reduce_ckpt_t *c)
{
    char path[4096];
    ch_reduce_ckpt_path(dir, expect->rank, path, sizeof path);
    FILE *f = fopen(path, "rb");
    if (!f) return CH_ERROR(CH_ERR_IO, "%s: cannot open the resume state: %s", path, strerror(errno));
    size_t want = ch_reducer_state_size(r);
    size_t total = sizeof ckpt_magic + sizeof *c + want;
    unsigned char *buf = malloc(total + 1);
    size_t got = buf ? fread(buf, 1, total + 1, f) : 0;
    fclose(f);
    ch_status s = CH_OK;
    if (!buf) s = CH_ERROR(CH_ERR_NOMEM, "%s", path);
    else if (got < sizeof ckpt_magic + sizeof *c || memcmp(buf, ckpt_magic, sizeof ckpt_magic))
        s = CH_ERROR(CH_ERR_FORMAT, "%s: not a cohort-reduce state file", path);
    if (s == CH_OK) {
        memcpy(c, buf + sizeof ckpt_magic, sizeof *c);
        if (c->world != expect->world || c->rank != expect->rank)
            s = CH_ERROR(CH_ERR_FORMAT, "%s: saved by rank %d of %d ranks; resume with the same "
                         "number of ranks (this is rank %d of %d)", path, c->rank, c->world,
                         expect->rank, expect->world);
        else if (c->chunk_elems != expect->chunk_elems)
            s = CH_ERROR(CH_ERR_FORMAT, "%s: saved with chunks of %lld elements, this run uses %lld "
                         "(keep reduce.chunk_mb)", path, (long long)c->chunk_elems,
                         (long long)expect->chunk_elems);
        else
            s = ch_reducer_state_load(r, buf + sizeof ckpt_magic + sizeof *c,
                                      got - sizeof ckpt_magic - sizeof *c);
        if (s != CH_OK) ch_error_context("%s", path);
    }
    free(buf);
    return s;
}

void ch_reduce_ckpt_remove(const char *dir, int rank)
{
    char path[4096];
    ch_reduce_ckpt_path(dir, rank, path, sizeof path);
    unlink(path);
}
