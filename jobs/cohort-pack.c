/* cohort-pack: any dataset cohort reads (ImageFolder, IDX, CIFAR-10) as
 * WebDataset tar shards of a target size, with their index, over the ranks
 * of a job (docs/shards.md):
 *
 *   mpiexec -n W cohort-pack --format imagefolder /data/train --out /scratch/train-shards
 *
 * Shard k is OUT/PREFIX-%06d.tar, members KEY.jpg|KEY.png + KEY.cls in the
 * dataset's order (KEY = the sample index, %09d): ImageFolder files are
 * copied with their bytes unchanged (JPEG or PNG), IDX / CIFAR-10 images as
 * PNG (lossless), so data.format = shards over OUT gives the same samples
 * in the same order (io/data/shards.h). Where each shard ends follows from
 * the samples' sizes alone (pack.shard_bytes, computed by all ranks from
 * the same sizes), and shard k is written by rank k mod W with fixed tar
 * headers (mtime 0, uid 0, mode 0644), so the output is the same bytes for
 * any number of ranks. Each shard is written atomically (temp file, fsync,
 * rename); OUT/cohort-pack.plan records what is being packed. Run again
 * after a kill or a preemption (exit 3) and it goes on: a shard is kept
 * when its size is the planned one and its size and mtime are those this
 * job recorded when it wrote it (OUT/.NAME.done; a shard changed since, by
 * a copy or a stray write, is written again), the others are written; a
 * plan for other input is an error. At the end the ranks build the shard index
 * (OUT/cohort-shards.index) together. */
#include "config.h"

#include "framework/core/log.h"
#include "framework/runtime/job.h"
#include "io/data/cifar.h"
#include "io/data/dataset.h"
#include "io/data/image.h"
#include "io/data/shards.h"
#include "io/formats/shards.h"
#include "io/state/atomic_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const ch_config_key_t keys[] = {
    {"pack.input", CH_CFG_STRING, NULL, CH_CFG_NO_RANGE,
     "The dataset to pack: a class-folder root (imagefolder) or a directory of IDX / CIFAR-10 "
     "files.", NULL, NULL, 1},
    {"pack.format", CH_CFG_STRING, "imagefolder", CH_CFG_NO_RANGE,
     "Input format: imagefolder, idx or cifar10.", "--format"},
    {"pack.split", CH_CFG_STRING, "train", CH_CFG_NO_RANGE,
     "idx / cifar10: which split, train or test.", "--split"},
    {"pack.out", CH_CFG_STRING, NULL, CH_CFG_NO_RANGE,
     "Output directory of the shards (made if missing).", "--out"},
    {"pack.prefix", CH_CFG_STRING, "shard", CH_CFG_NO_RANGE,
     "Shard file names: PREFIX-000000.tar, PREFIX-000001.tar, ...", "--prefix"},
    {"pack.shard_bytes", CH_CFG_INT64, "1073741824", 10240, 1e13,
     "Target shard size in bytes: a shard ends before the sample that would take it past "
     "this (a single larger sample makes a shard of its own); 8M, 1G: binary suffixes K, M, G, "
     "T.", "--shard_bytes"},
    {"pack.limit", CH_CFG_INT64, "0", 0, 1e12, "Pack only the first N samples (0: all).",
     "--limit"},
};

#define TAR_END 1024 /* two zero blocks */

static uint64_t pad512(uint64_t n) { return (n + 511) / 512 * 512; }

/* Tar bytes of one sample whose image has `size` bytes: its header and
 * padded data, the .cls header and one block of text. */
static uint64_t sample_tar_bytes(uint64_t size) { return 512 + pad512(size) + 512 + 512; }

typedef struct {
    ch_dataset_t *ds;
    int folder;        /* imagefolder: copy the files' bytes */
    ch_image_t img;
    uint8_t *png;
    size_t png_len;
} source_t;

/* JPEG or PNG by the first bytes, else NULL. */
static const char *sniff(const uint8_t *b, size_t n)
{
    if (n >= 3 && b[0] == 0xFF && b[1] == 0xD8 && b[2] == 0xFF) return "jpg";
    if (n >= 8 && !memcmp(b, "\x89PNG\r\n\x1a\n", 8)) return "png";
    return NULL;
}

/* The sample buffers, released at the job's one exit (ch_job_on_finalize):
 * every return path, bad input included, frees them. */
static void source_release(void *p)
{
    source_t *src = p;
    free(src->png);
    src->png = NULL;
    ch_image_free(&src->img);
}

static ch_status not_jpeg_png(const char *path)
{
    return CH_ERROR(CH_ERR_UNSUPPORTED, "%s: neither JPEG nor PNG (cohort reads only those from "
                    "shards)", path);
}

/* Sample i's image bytes (*data, *len: valid until the next call), its
 * extension and label. */
static ch_status sample_bytes(source_t *src, int64_t i, const uint8_t **data, size_t *len,
                              const char **ext, int64_t *label)
{
    if (src->folder) {
        const char *path = ch_dataset_sample_path(src->ds, i);
        CH_TRY(ch_image_read_file(&src->img, path));
        const uint8_t *b = src->img.raw;
        size_t n = src->img.raw_size;
        if (!(*ext = sniff(b, n))) return not_jpeg_png(path);
        *data = b;
        *len = n;
        *label = ch_dataset_imagefolder_label(src->ds, i);
        return CH_OK;
    }
    CH_TRY(ch_dataset_get(src->ds, i, &src->img, label));
    free(src->png);
    src->png = NULL;
    CH_TRY(ch_image_encode_png(&src->img, &src->png, &src->png_len));
    *data = src->png;
    *len = src->png_len;
    *ext = "png";
    return CH_OK;
}

/* The image bytes of sample i, for the plan (imagefolder: the file's size,
 * and its first bytes say JPEG or PNG: a bad file is found before any
 * shard is written). */
static ch_status sample_size(source_t *src, int64_t i, int64_t *size)
{
    if (src->folder) {
        const char *path = ch_dataset_sample_path(src->ds, i);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) return CH_ERROR(CH_ERR_IO, "%s: %s", path, strerror(errno));
        struct stat sb;
        uint8_t head[8];
        ssize_t r = fstat(fd, &sb) == 0 ? pread(fd, head, sizeof head, 0) : -1;
        int e = errno;
        close(fd);
        if (r < 0) return CH_ERROR(CH_ERR_IO, "%s: %s", path, strerror(e));
        if (!sniff(head, (size_t)r)) return not_jpeg_png(path);
        *size = (int64_t)sb.st_size;
        return CH_OK;
    }
    const uint8_t *d;
    size_t len;
    const char *ext;
    int64_t label;
    CH_TRY(sample_bytes(src, i, &d, &len, &ext, &label));
    *size = (int64_t)len;
    return CH_OK;
}

static ch_status write_block(ch_atomic_file_t *f, const void *data, size_t len)
{
    static const uint8_t zero[512];
    CH_TRY(ch_atomic_file_write(f, data, len));
    size_t pad = (size_t)(pad512(len) - len);
    return pad ? ch_atomic_file_write(f, zero, pad) : CH_OK;
}

/* Write shard path from samples [a, b), expected to be `bytes` long. */
/* The record of a finished shard: "size mtime_s mtime_ns\n" in
 * OUT/.NAME.done (NAME the shard's file name), written after the shard was
 * renamed into place. */
static void done_path(const char *shard, char *buf, size_t len)
{
    const char *slash = strrchr(shard, '/');
    size_t dir = slash ? (size_t)(slash - shard + 1) : 0;
    snprintf(buf, len, "%.*s.%s.done", (int)dir, shard, shard + dir);
}

static ch_status record_done(const char *shard)
{
    struct stat sb;
    char path[4200], text[96];
    if (stat(shard, &sb) != 0) return CH_ERROR(CH_ERR_IO, "%s: %s", shard, strerror(errno));
    done_path(shard, path, sizeof path);
    int n = snprintf(text, sizeof text, "%lld %lld %ld\n", (long long)sb.st_size,
                     (long long)sb.st_mtim.tv_sec, (long)sb.st_mtim.tv_nsec);
    return ch_atomic_file_write_all(path, text, (size_t)n);
}

/* 1 when shard is there with `bytes` bytes and the size and mtime of its
 * record (this job wrote it, and nothing changed it since). */
static int kept_shard(const char *shard, uint64_t bytes)
{
    struct stat sb;
    char path[4200], text[96] = "";
    if (stat(shard, &sb) != 0 || (uint64_t)sb.st_size != bytes) return 0;
    done_path(shard, path, sizeof path);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    long long size = -1, sec = -1;
    long nsec = -1;
    int ok = fgets(text, sizeof text, f) && sscanf(text, "%lld %lld %ld", &size, &sec, &nsec) == 3;
    fclose(f);
    return ok && size == (long long)sb.st_size && sec == (long long)sb.st_mtim.tv_sec &&
           nsec == (long)sb.st_mtim.tv_nsec;
}

static ch_status write_shard(source_t *src, const char *path, int64_t a, int64_t b, uint64_t bytes)
{
    ch_atomic_file_t *f;
    CH_TRY(ch_atomic_file_remove_stale(path, NULL)); /* only this rank writes path */
    CH_TRY(ch_atomic_file_open(path, &f));
    uint8_t h[512];
    char name[64], cls[32];
    ch_status st = CH_OK;
    for (int64_t i = a; i < b && st == CH_OK; i++) {
        const uint8_t *d;
        size_t len;
        const char *ext;
        int64_t label;
        st = sample_bytes(src, i, &d, &len, &ext, &label);
        if (st == CH_OK) {
            snprintf(name, sizeof name, "%09lld.%s", (long long)i, ext);
            st = ch_tar_header(h, name, len, 0);
        }
        if (st == CH_OK && (st = ch_atomic_file_write(f, h, 512)) != CH_OK) return st; /* f freed */
        if (st == CH_OK && (st = write_block(f, d, len)) != CH_OK) return st;
        int cl = snprintf(cls, sizeof cls, "%lld", (long long)label);
        snprintf(name, sizeof name, "%09lld.cls", (long long)i);
        if (st == CH_OK) st = ch_tar_header(h, name, (uint64_t)cl, 0);
        if (st == CH_OK && (st = ch_atomic_file_write(f, h, 512)) != CH_OK) return st;
        if (st == CH_OK && (st = write_block(f, cls, (size_t)cl)) != CH_OK) return st;
    }
    static const uint8_t end[TAR_END];
    if (st == CH_OK && (st = ch_atomic_file_write(f, end, TAR_END)) != CH_OK) return st;
    if (st == CH_OK && ch_atomic_file_size(f) != bytes)
        st = CH_ERROR(CH_ERR_INTERNAL, "%s: %zu bytes written, %llu planned (an input file changed "
                      "size while packing?)", path, ch_atomic_file_size(f), (unsigned long long)bytes);
    if (st != CH_OK) {
        ch_atomic_file_abort(f);
        return ch_error_context("shard %s", path);
    }
    return ch_atomic_file_commit(f);
}

/* Rank 0: write the plan, or check that the one there is this plan. */
static ch_status check_plan(const char *out, const char *plan)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/cohort-pack.plan", out);
    struct stat sb;
    if (stat(path, &sb) != 0) return ch_atomic_file_write_all(path, plan, strlen(plan));
    uint8_t *old;
    size_t len;
    CH_TRY(ch_dataset_read_file(path, &old, &len));
    int same = len == strlen(plan) && !memcmp(old, plan, len);
    free(old);
    if (!same)
        return CH_ERROR(CH_ERR_CONFIG, "%s holds shards of another pack (its cohort-pack.plan "
                        "differs from this run's: other input, format, split, limit, prefix or "
                        "shard size); use another pack.out or empty it", out);
    return CH_OK;
}

int main(int argc, char **argv)
{
    const ch_config_table_t tables[] = {{"pack", keys, (int)(sizeof keys / sizeof keys[0])},
                                        ch_job_runtime_table()};
    static const char *const phases[] = {"plan", "write", "index"};
    ch_job_options_t o;
    ch_job_options_default(&o, "cohort-pack",
        "pack a dataset (ImageFolder, IDX, CIFAR-10) into WebDataset tar shards with an index.\n"
        "Usage: cohort-pack [--format F] [--KEY VALUE]... INPUT --out DIR");
    o.tables = tables;
    o.n_tables = 2;
    o.phase_names = phases;
    o.n_phases = 3;
    o.preemption = 1;
    ch_job_t *job;
    int rc = ch_job_init(&o, argc, argv, &job);
    if (rc != CH_JOB_CONTINUE) return ch_job_finalize(job, rc);
    ch_config_t *cfg = ch_job_config(job);
    const int rank = ch_job_rank(job), world = ch_job_world_size(job);
    ch_pg_t *pg = ch_job_pg(job);
    const char *input, *format, *split, *out, *prefix;
    long long shard_bytes, limit;
    static const char *const formats[] = {"imagefolder", "idx", "cifar10"};
    static const char *const splits[] = {"train", "test"};
    int fmt = 0, sp = 0;
    ch_status s = ch_config_get_string(cfg, "pack.input", &input);
    if (!s) s = ch_config_get_choice(cfg, "pack.format", formats, 3, &fmt);
    if (!s) s = ch_config_get_choice(cfg, "pack.split", splits, 2, &sp);
    if (!s) s = ch_config_get_string(cfg, "pack.format", &format);
    if (!s) s = ch_config_get_string(cfg, "pack.split", &split);
    if (!s) s = ch_config_get_string(cfg, "pack.out", &out);
    if (!s) s = ch_config_get_string(cfg, "pack.prefix", &prefix);
    if (!s) s = ch_config_get_int64(cfg, "pack.shard_bytes", &shard_bytes);
    if (!s) s = ch_config_get_int64(cfg, "pack.limit", &limit);
    if (!s && (!prefix[0] || strchr(prefix, '/') || strlen(prefix) > 200))
        s = CH_ERROR(CH_ERR_CONFIG, "pack.prefix '%s': a file name prefix (no '/') expected", prefix);
    source_t src = {0};
    ch_image_init(&src.img);
    if (!s) s = ch_job_on_finalize(job, source_release, &src);
    if (!s) {
        src.folder = fmt == 0;
        if (fmt == 0) s = ch_dataset_imagefolder_open(input, 3, &src.ds);
        else if (fmt == 1) s = ch_dataset_fashion_mnist_open(input, sp == 0, &src.ds);
        else s = ch_dataset_cifar10_open(input, sp == 0, &src.ds);
    }
    if (src.ds && (s = ch_job_on_finalize(job, (void (*)(void *))ch_dataset_destroy, src.ds)) != CH_OK)
        ch_dataset_destroy(src.ds);
    if (ch_job_agree(job, s, "input")) return ch_job_finalize(job, CH_EXIT_BAD_INPUT);
    int64_t n = src.ds->length;
    if (limit > 0 && limit < n) n = limit;

    /* plan: every sample's size (each rank its share, summed), then the cuts */
    double t0 = ch_time_now();
    int64_t *sizes = calloc((size_t)(n ? n : 1), sizeof *sizes);
    int64_t *cut = malloc((size_t)(n + 1) * sizeof *cut); /* shard k = [cut[k], cut[k+1]) */
    s = sizes && cut ? CH_OK : CH_ERROR(CH_ERR_NOMEM, "plan of %lld samples", (long long)n);
    /* freed at the one exit, whichever return takes it */
    if (s) {
        free(sizes);
        free(cut);
    } else if ((s = ch_job_on_finalize(job, free, sizes)) != CH_OK) {
        free(sizes);
        free(cut);
    } else if ((s = ch_job_on_finalize(job, free, cut)) != CH_OK) {
        free(cut);
    }
    for (int64_t i = rank; !s && i < n; i += world) s = sample_size(&src, i, &sizes[i]);
    if (ch_job_agree(job, s, "reading the input")) return ch_job_finalize(job, CH_EXIT_BAD_INPUT);
    if (world > 1 && (rc = ch_job_check_collective(job, ch_pg_allreduce(pg, sizes, sizes, n,
                                                   CH_DIST_INT64, CH_REDUCE_SUM), "plan")))
        return ch_job_finalize(job, rc);
    int64_t nshards = 0;
    uint64_t cur = 0;
    for (int64_t i = 0; i < n; i++) {
        uint64_t b = sample_tar_bytes((uint64_t)sizes[i]);
        if (i == 0 || (cur > 0 && cur + b + TAR_END > (uint64_t)shard_bytes)) {
            cut[nshards++] = i;
            cur = 0;
        }
        cur += b;
    }
    cut[nshards] = n;
    char plan[8192];
    snprintf(plan, sizeof plan, "cohort-pack plan 1\ninput %s\nformat %s\nsplit %s\nlimit %lld\n"
             "samples %lld\nshard_bytes %lld\nprefix %s\nshards %lld\n", input, format,
             fmt ? split : "-", limit, (long long)n, shard_bytes, prefix, (long long)nshards);
    s = n > 0 ? CH_OK : CH_ERROR(CH_ERR_INVALID, "%s: no samples to pack", input);
    if (!s && rank == 0) {
        if (mkdir(out, 0777) != 0 && errno != EEXIST)
            s = CH_ERROR(CH_ERR_IO, "pack.out %s: %s", out, strerror(errno));
        if (!s) s = check_plan(out, plan);
    }
    if (ch_job_agree(job, s, "output")) return ch_job_finalize(job, CH_EXIT_BAD_INPUT);
    ch_prof_add(ch_job_profiler(job), 0, ch_time_now() - t0);

    /* write: round r, rank q writes shard r * W + q */
    t0 = ch_time_now();
    long long written = 0, kept = 0;
    uint64_t bytes_written = 0;
    int64_t rounds = (nshards + world - 1) / world;
    char path[4096];
    for (int64_t r = 0; r < rounds; r++) {
        int64_t k = r * world + rank;
        s = CH_OK;
        if (k < nshards) {
            uint64_t bytes = TAR_END;
            for (int64_t i = cut[k]; i < cut[k + 1]; i++) bytes += sample_tar_bytes((uint64_t)sizes[i]);
            snprintf(path, sizeof path, "%s/%s-%06lld.tar", out, prefix, (long long)k);
            if (kept_shard(path, bytes)) {
                kept++; /* written by an earlier run (renamed into place only when complete) */
            } else {
                s = write_shard(&src, path, cut[k], cut[k + 1], bytes);
                if (!s) s = record_done(path);
                written++;
                bytes_written += bytes;
            }
        }
        if (ch_job_agree(job, s, "writing shards")) return ch_job_finalize(job, CH_EXIT_ERROR);
        char text[96];
        snprintf(text, sizeof text, "%.1f MB/s (this rank)",
                 bytes_written / 1e6 / (ch_time_now() - t0 + 1e-9));
        ch_job_progress(job, "pack", (r + 1) * world < nshards ? (r + 1) * world : nshards, nshards,
                        world, text);
        ch_job_test_hold(job, "round", r + 1);
        if (r + 1 < rounds && ch_job_stop_agree(job, 0)) {
            ch_log_info("cohort-pack: stopped after %lld of %lld shards; run the same command "
                        "again to go on", (long long)((r + 1) * world), (long long)nshards);
            return ch_job_finalize(job, CH_EXIT_PREEMPTED);
        }
    }
    double write_s = ch_time_now() - t0;
    ch_prof_add(ch_job_profiler(job), 1, write_s);
    long long sums[3] = {written, kept, (long long)bytes_written};
    if (world > 1 && (rc = ch_job_check_collective(job, ch_pg_allreduce(pg, sums, sums, 3,
                                                   CH_DIST_INT64, CH_REDUCE_SUM), "totals")))
        return ch_job_finalize(job, rc);
    ch_log_info("cohort-pack: %lld samples in %lld shards in %s (%lld written, %lld kept from an "
                "earlier run), %.1f MB in %.2f s: %.1f MB/s", (long long)n, (long long)nshards, out,
                sums[0], sums[1], sums[2] / 1e6, write_s, sums[2] / 1e6 / (write_s + 1e-9));
    source_release(&src);

    /* the index, built by the ranks together (and a check of what was written) */
    t0 = ch_time_now();
    char spec[4096];
    snprintf(spec, sizeof spec, "%s/%s-{%06d..%06lld}.tar", out, prefix, 0, (long long)(nshards - 1));
    ch_dataset_t *ds = NULL;
    char index[4096];
    snprintf(index, sizeof index, "%s/cohort-shards.index", out);
    if (rank == 0 && sums[0] > 0) unlink(index); /* shards (re)written: an old index is stale */
    if (world > 1 && (rc = ch_job_check_collective(job, ch_pg_barrier(pg), "index")))
        return ch_job_finalize(job, rc);
    s = ch_dataset_shards_open(out, 3, pg, &ds);
    if (!s && ds->length != n)
        s = CH_ERROR(CH_ERR_FORMAT, "%s: the index counts %lld samples, %lld were packed (other .tar "
                     "files in the directory?)", out, (long long)ds->length, (long long)n);
    ch_dataset_destroy(ds);
    ch_prof_add(ch_job_profiler(job), 2, ch_time_now() - t0);
    if (ch_job_agree(job, s, "index")) return ch_job_finalize(job, CH_EXIT_ERROR);
    ch_log_info("cohort-pack: train with --data.format=shards --data.path=%s (or the pattern %s)",
                out, spec);
    return ch_job_finalize(job, CH_EXIT_OK);
}
