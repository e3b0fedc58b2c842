/* cohort-bench: all-reduce bandwidth benchmark in the style of nccl-tests.
 *
 *   mpiexec -n 2 cohort-bench [--KEY=VALUE ...]   (--help lists the keys)
 *
 * For each message size (float32, SUM) it times cohort's ch_pg_allreduce and,
 * interleaved in the same run on the same buffers, the raw backend call
 * (MPI_Allreduce on MPI_COMM_WORLD for host buffers; ncclAllReduce on the
 * group's comm stream for device buffers), and prints one row per size:
 * bytes, count, iterations, cohort time, algbw, busbw, the max abs error of
 * cohort's result against the closed-form expected sum, raw time, raw busbw
 * and the ratio of cohort's time to raw's (median of paired ratios, below).
 *
 * Timing: before every call all ranks meet in MPI_Barrier; each rank times
 * its own call (MPI_Wtime; for NCCL until the comm stream is idle); the time
 * of an iteration is the slowest rank's; the figure printed is the MEDIAN
 * over the timed iterations (robust on a shared, noisy machine). cohort and
 * raw alternate call by call (which one goes first alternates too), so both
 * see the same machine state; the ratio column is the median over
 * iterations of the paired ratio cohort_i / raw_i of the two calls of one
 * iteration, which cancels the machine's drift better than a ratio of
 * medians.
 *   algbw = bytes / time   (GB/s, 1 GB = 1e9 bytes)
 *   busbw = algbw * 2 (W - 1) / W   (nccl-tests' all-reduce bus bandwidth)
 * Iterations shrink for big sizes so that iterations x bytes stays near
 * --bytes-per-size (but at least --min-iters), keeping a default run short.
 *
 * Backend: ranks on GPUs (the job runtime's choice, dist.device_rule: every
 * rank its own GPU, or every rank on CPU) -> NCCL on device buffers (the
 * runtime's NCCL group); else MPI on host buffers. --backend forces one.
 * Only rank 0 prints.
 *
 * Options are config keys (framework/core/configuration.h): --min-bytes=8
 * or --min-bytes 8, also in a --config file; the short forms -b -e -f -w -n
 * -p -c -d of earlier versions are kept as aliases. Runs on ch_job
 * (framework/runtime/job.h): launch checks, device choice, exit status. */
#include "config.h"

#include "framework/core/configuration.h"
#include "framework/core/log.h"
#include "framework/core/status.h"
#include "framework/dist/dist.h"
#include "framework/runtime/job.h"
#include "framework/tensor/device.h"

#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    size_t min_bytes, max_bytes, bytes_per_size;
    int factor;
    int warmup, iters, min_iters;
    int place;   /* 0 out-of-place, 1 in-place, 2 both */
    int check;
    int backend; /* -1 auto, CH_PG_MPI, CH_PG_NCCL */
    int raw_dup; /* raw MPI on the group's duplicated comm instead of WORLD */
} bench_opts;

static int g_rank;
static int g_aa; /* --aa: the "cohort" column also runs the raw call (A/A control) */

static const ch_config_key_t bench_keys[] = {
    {"min-bytes", CH_CFG_STRING, "8", CH_CFG_NO_RANGE,
     "Smallest message size in bytes (K, M, G suffixes, binary: 1K = 1024); -b.", "-b"},
    {"max-bytes", CH_CFG_STRING, "256M", CH_CFG_NO_RANGE,
     "Largest message size in bytes (below 8G); -e.", "-e"},
    {"step-factor", CH_CFG_INT, "2", 2, 1024, "Multiply the size by N each step; -f.", "-f"},
    {"warmup", CH_CFG_INT, "5", 0, 1000000,
     "Untimed iterations per size and backend call; -w.", "-w"},
    {"iters", CH_CFG_INT, "50", 1, 1000000, "Timed iterations per size; -n.", "-n"},
    {"min-iters", CH_CFG_INT, "5", 1, 1000000, "At least this many timed iterations."},
    {"bytes-per-size", CH_CFG_STRING, "1G", CH_CFG_NO_RANGE,
     "Fewer iterations for big sizes: iterations x bytes <= N, but >= min-iters."},
    {"place", CH_CFG_STRING, "out", CH_CFG_NO_RANGE,
     "out (out-of-place), in (in-place) or both; -p.", "-p"},
    {"check", CH_CFG_BOOL, "true", CH_CFG_NO_RANGE,
     "Compare cohort's result with the expected sum (0/1 or false/true); -c.", "-c"},
    {"backend", CH_CFG_STRING, "auto", CH_CFG_NO_RANGE,
     "auto, mpi or nccl (auto: nccl when the ranks are on GPUs, else mpi); -d.", "-d"},
    {"aa", CH_CFG_BOOL, "false", CH_CFG_NO_RANGE,
     "A/A control: the cohort column runs the raw call too, showing the noise floor of the "
     "comparison."},
    {"raw-comm", CH_CFG_STRING, "world", CH_CFG_NO_RANGE,
     "Communicator of the raw MPI call: world (MPI_COMM_WORLD) or group (cohort's own "
     "duplicate of it)."},
};
#define N_BENCH_KEYS ((int)(sizeof bench_keys / sizeof bench_keys[0]))

static const char bench_summary[] =
    "All-reduce (float32, sum) benchmark: cohort's ch_pg_allreduce against the raw backend\n"
    "call on the same buffers, interleaved in one run. Columns: time is the median over\n"
    "iterations of the slowest rank (us); algbw = bytes/time; busbw = algbw*2(W-1)/W\n"
    "(GB/s = 1e9 B/s); maxerr = max |cohort result - expected|; ratio = median over\n"
    "iterations of the paired ratio cohort time / raw time of the two back-to-back calls of\n"
    "an iteration; ratio min = fastest cohort call / fastest raw call.";

static int parse_size(const char *s, size_t *out)
{
    char *end = NULL;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s) return -1;
    unsigned long long mul = 1;
    if (*end == 'K' || *end == 'k') mul = 1ULL << 10, end++;
    else if (*end == 'M' || *end == 'm') mul = 1ULL << 20, end++;
    else if (*end == 'G' || *end == 'g') mul = 1ULL << 30, end++;
    if (*end == 'B' || *end == 'b') end++;
    if (*end || s[0] == '-' || v > (1ULL << 40) / mul) return -1;
    *out = (size_t)(v * mul);
    return 0;
}

/* Options from the config; CH_ERR_CONFIG naming the key and its source. */
static ch_status read_options(const ch_config_t *c, bench_opts *o)
{
    const char *text;
    static const char *const sizes[3] = {"min-bytes", "max-bytes", "bytes-per-size"};
    size_t *dst[3] = {&o->min_bytes, &o->max_bytes, &o->bytes_per_size};
    for (int k = 0; k < 3; k++) {
        CH_TRY(ch_config_get_string(c, sizes[k], &text));
        if (parse_size(text, dst[k]))
            return CH_ERROR(CH_ERR_CONFIG, "%s: %s = '%s' is not a size (bytes, e.g. 8, 64K, 1M, "
                            "1G)", ch_config_source(c, sizes[k]), sizes[k], text);
    }
    CH_TRY(ch_config_get_int(c, "step-factor", &o->factor));
    CH_TRY(ch_config_get_int(c, "warmup", &o->warmup));
    CH_TRY(ch_config_get_int(c, "iters", &o->iters));
    CH_TRY(ch_config_get_int(c, "min-iters", &o->min_iters));
    static const char *const places[] = {"out", "in", "both"};
    CH_TRY(ch_config_get_choice(c, "place", places, 3, &o->place));
    CH_TRY(ch_config_get_bool(c, "check", &o->check));
    static const char *const backends[] = {"auto", "mpi", "nccl"};
    int b;
    CH_TRY(ch_config_get_choice(c, "backend", backends, 3, &b));
    o->backend = b == 0 ? -1 : b == 1 ? CH_PG_MPI : CH_PG_NCCL;
    CH_TRY(ch_config_get_bool(c, "aa", &g_aa));
    static const char *const comms[] = {"world", "group"};
    CH_TRY(ch_config_get_choice(c, "raw-comm", comms, 2, &o->raw_dup));
    if (o->min_bytes < 4 || o->min_bytes > o->max_bytes)
        return CH_ERROR(CH_ERR_CONFIG, "need 4 <= min-bytes (%zu) <= max-bytes (%zu)",
                        o->min_bytes, o->max_bytes);
    if (o->max_bytes / 4 > (size_t)INT32_MAX)
        return CH_ERROR(CH_ERR_CONFIG, "max-bytes must be below 8G (got %zu)", o->max_bytes);
    return CH_OK;
}

/* value of rank r's send buffer at index i (exact sums in float32) */
static float pattern(int r, size_t i) { return (float)((r + 1) * (int)(i % 7 + 1)); }

enum { CHUNK = 1 << 18 }; /* floats per staging chunk (1 MiB) */

/* Fill count floats of a group buffer: the pattern of rank r, or zeros. */
static ch_status fill(ch_pg_t *pg, float *buf, size_t count, int r, int zeros, float *stage)
{
    for (size_t off = 0; off < count; off += CHUNK) {
        size_t m = count - off < CHUNK ? count - off : CHUNK;
        for (size_t i = 0; i < m; i++) stage[i] = zeros ? 0.0f : pattern(r, off + i);
        CH_TRY(ch_pg_buffer_write(pg, buf + off, stage, m * sizeof(float)));
    }
    return CH_OK;
}

/* max |buf[i] - sum over ranks of pattern(r, i)| */
static ch_status max_error(ch_pg_t *pg, const float *buf, size_t count, int w, float *stage,
                           double *err)
{
    double e = 0;
    for (size_t off = 0; off < count; off += CHUNK) {
        size_t m = count - off < CHUNK ? count - off : CHUNK;
        CH_TRY(ch_pg_buffer_read(pg, stage, buf + off, m * sizeof(float)));
        for (size_t i = 0; i < m; i++) {
            double want = (double)w * (w + 1) / 2.0 * (double)((off + i) % 7 + 1);
            double d = fabs((double)stage[i] - want);
            if (d > e || d != d) e = d != d ? INFINITY : d;
        }
    }
    *err = e;
    return CH_OK;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* One call of cohort (which == 0) or raw (which == 1), host-timed to
 * completion. */
static ch_status one_call(ch_pg_t *pg, int which, const float *send, float *recv, int count,
                          MPI_Comm raw_comm, double *seconds)
{
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    if (ch_pg_backend_of(pg) == CH_PG_MPI) {
        if (which == 0 && !g_aa) {
            CH_TRY(ch_pg_allreduce(pg, send, recv, count, CH_DIST_FLOAT32, CH_REDUCE_SUM));
        } else {
            const void *sb = (const void *)send == (void *)recv ? MPI_IN_PLACE : send;
            CH_CHECK_MPI(MPI_Allreduce(sb, recv, count, MPI_FLOAT, MPI_SUM, raw_comm));
        }
    } else {
        if (which == 0 && !g_aa)
            CH_TRY(ch_pg_allreduce(pg, send, recv, count, CH_DIST_FLOAT32, CH_REDUCE_SUM));
        else
            CH_TRY(ch_pg_nccl_allreduce_raw(pg, send, recv, count, CH_DIST_FLOAT32,
                                            CH_REDUCE_SUM));
        CH_TRY(ch_pg_synchronize(pg));
    }
    *seconds = MPI_Wtime() - t0;
    return CH_OK;
}

typedef struct {
    double worst_ratio;
    size_t worst_bytes;
    int n_big, n_big_ok;
} summary;

static ch_status run_size(ch_pg_t *pg, const bench_opts *o, size_t bytes, int inplace,
                          float *send, float *recv, float *stage, double *times, summary *sum)
{
    int w = ch_pg_size(pg);
    int count = (int)(bytes / sizeof(float));
    size_t cap = o->bytes_per_size / (bytes ? bytes : 1);
    int iters = (size_t)o->iters < cap ? o->iters : (int)cap;
    if (iters < o->min_iters) iters = o->min_iters;
    int warmup = (size_t)o->warmup < cap / 4 ? o->warmup : (int)(cap / 4);
    if (warmup < 1 && o->warmup > 0) warmup = 1;
    const float *sb = inplace ? recv : send;
    MPI_Comm rc = o->raw_dup ? ch_pg_mpi_comm(pg) : MPI_COMM_WORLD;

    /* in place: the buffer is summed into itself every call; zeros keep the
     * timed work identical without overflow */
    if (inplace) CH_TRY(fill(pg, recv, (size_t)count, g_rank, 1, stage));
    for (int i = 0; i < warmup; i++) {
        double t;
        CH_TRY(one_call(pg, 0, sb, recv, count, rc, &t));
        CH_TRY(one_call(pg, 1, sb, recv, count, rc, &t));
    }
    double *tc = times, *tr = times + iters;
    for (int i = 0; i < iters; i++) {
        int first = i & 1; /* alternate which goes first */
        CH_TRY(one_call(pg, first, sb, recv, count, rc, first ? &tr[i] : &tc[i]));
        CH_TRY(one_call(pg, !first, sb, recv, count, rc, first ? &tc[i] : &tr[i]));
    }
    /* the slowest rank's time per iteration */
    CH_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, times, 2 * iters, MPI_DOUBLE, MPI_MAX,
                               MPI_COMM_WORLD));
    /* ratio: median over iterations of the paired ratio cohort_i / raw_i (the
     * two calls of a pair run back to back, so slow drifts of a shared machine
     * cancel); computed before the sorts below reorder the arrays */
    double *pr = times + 2 * iters;
    for (int i = 0; i < iters; i++) pr[i] = tc[i] / tr[i];
    double ratio = median(pr, iters);
    double t_c = median(tc, iters), t_r = median(tr, iters);
    double ratio_min = tc[0] / tr[0]; /* median() sorted: [0] is the fastest */

    double err = -1;
    if (o->check) {
        if (inplace) CH_TRY(fill(pg, recv, (size_t)count, g_rank, 0, stage));
        CH_TRY(ch_pg_allreduce(pg, sb, recv, count, CH_DIST_FLOAT32, CH_REDUCE_SUM));
        CH_TRY(ch_pg_synchronize(pg));
        CH_TRY(max_error(pg, recv, (size_t)count, w, stage, &err));
        CH_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &err, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
    }
    double bus = w > 1 ? 2.0 * (w - 1) / w : 0.0;
    double algbw_c = (double)bytes / t_c / 1e9, algbw_r = (double)bytes / t_r / 1e9;
    if (bytes >= 64 * 1024) {
        sum->n_big++;
        if (ratio <= 1.05) sum->n_big_ok++;
        if (ratio > sum->worst_ratio) {
            sum->worst_ratio = ratio;
            sum->worst_bytes = bytes;
        }
    }
    if (g_rank == 0) {
        char errs[32];
        if (err < 0) snprintf(errs, sizeof errs, "%10s", "-");
        else snprintf(errs, sizeof errs, "%10.2e", err);
        printf("%12zu %11d %5s %5d %11.2f %9.3f %9.3f %s %11.2f %9.3f %7.3f %7.3f\n", bytes,
               count, inplace ? "in" : "out", iters, t_c * 1e6, algbw_c, algbw_c * bus, errs,
               t_r * 1e6, algbw_r * bus, ratio, ratio_min);
        fflush(stdout);
    }
    return CH_OK;
}

/* The benchmark over pg (MPI group on host buffers or NCCL group on device
 * buffers). Setup failures are agreed over the job; a failure inside the
 * timed loop (a collective) ends the job (ch_fatal: others may be waiting
 * in a collective). */
static ch_status bench(ch_job_t *job, ch_pg_t *pg, const bench_opts *o, const char *devname)
{
    int backend = ch_pg_backend_of(pg);
    size_t max_count = o->max_bytes / sizeof(float);
    int max_iters = o->iters > o->min_iters ? o->iters : o->min_iters;
    float *send = NULL, *recv = NULL;
    float *stage = malloc(CHUNK * sizeof(float));
    double *times = malloc(3 * (size_t)max_iters * sizeof(double));
    ch_status s = stage && times ? CH_OK : CH_ERROR(CH_ERR_NOMEM, "no memory for staging");
    if (s == CH_OK) s = ch_pg_buffer_alloc(pg, max_count * sizeof(float), (void **)&send);
    if (s == CH_OK) s = ch_pg_buffer_alloc(pg, max_count * sizeof(float), (void **)&recv);
    /* touch every page before timing: the send pattern, recv zeros */
    if (s == CH_OK) s = fill(pg, send, max_count, g_rank, 0, stage);
    if (s == CH_OK) s = fill(pg, recv, max_count, g_rank, 1, stage);
    if (ch_job_agree(job, s, "benchmark buffers")) {
        ch_pg_buffer_free(pg, send);
        ch_pg_buffer_free(pg, recv);
        free(stage);
        free(times);
        return CH_ERR_REMOTE;
    }

    summary sum = {0, 0, 0, 0};
    if (s == CH_OK && g_rank == 0) {
        printf("# cohort-bench: all-reduce, float32, sum, %d rank%s, backend %s (%s)\n",
               ch_pg_size(pg), ch_pg_size(pg) == 1 ? "" : "s",
               backend == CH_PG_NCCL ? "nccl" : "mpi", devname);
        printf("# launch: %s\n", ch_job_env(job)->note);
        if (g_aa) printf("# A/A CONTROL (--aa): the 'cohort' column runs the raw call too\n");
        printf("# raw = %s on the same buffers, interleaved call by call with cohort\n",
               backend == CH_PG_NCCL ? "ncclAllReduce on the comm stream"
               : o->raw_dup ? "MPI_Allreduce on cohort's duplicated communicator"
                            : "MPI_Allreduce on MPI_COMM_WORLD");
        printf("# time: median over iterations of the slowest rank (barrier before each call); "
               "busbw = algbw*2(W-1)/W;\n# ratio paired = median over iterations of cohort_i/raw_i (back-to-back calls); "
               "ratio min = fastest cohort / fastest raw\n");
        printf("# %10s %11s %5s %5s %11s %9s %9s %10s %11s %9s %7s %7s\n", "bytes", "count",
               "place", "iters", "time(us)", "algbw", "busbw", "maxerr", "raw(us)",
               "raw_busbw", "ratio", "ratio");
        printf("# %10s %11s %5s %5s %11s %9s %9s %10s %11s %9s %7s %7s\n", "", "(float)", "",
               "", "cohort", "(GB/s)", "(GB/s)", "cohort", "", "(GB/s)", "paired", "min");
        fflush(stdout);
    }
    for (size_t bytes = o->min_bytes; s == CH_OK && bytes <= o->max_bytes;) {
        bytes -= bytes % sizeof(float);
        for (int p = 0; p < 2 && s == CH_OK; p++) {
            if (o->place != 2 && o->place != p) continue;
            s = run_size(pg, o, bytes, p, send, recv, stage, times, &sum);
        }
        if (bytes > o->max_bytes / (size_t)o->factor) break;
        bytes *= (size_t)o->factor;
    }
    ch_check_fatal(s, "cohort-bench");
    if (g_rank == 0 && sum.n_big > 0)
        printf("# sizes >= 64 KiB: %d of %d within 5%% of raw; worst ratio %.3f at %zu bytes\n",
               sum.n_big_ok, sum.n_big, sum.worst_ratio, sum.worst_bytes);
    ch_pg_buffer_free(pg, send);
    ch_pg_buffer_free(pg, recv);
    free(stage);
    free(times);
    return CH_OK;
}

int main(int argc, char **argv)
{
    const ch_config_table_t tables[] = {
        {"cohort-bench", bench_keys, N_BENCH_KEYS},
        ch_job_runtime_table(),
    };
    ch_job_options_t jo;
    ch_job_options_default(&jo, "cohort-bench", bench_summary);
    jo.tables = tables;
    jo.n_tables = 2;
    jo.compute = 1; /* the device rule; the NCCL group when the ranks are on GPUs */
    jo.no_identity_line = 1; /* a "# launch:" line of the table instead */
    ch_job_t *job;
    int rc = ch_job_init(&jo, argc, argv, &job);
    if (rc != CH_JOB_CONTINUE) return ch_job_finalize(job, rc);
    g_rank = ch_job_rank(job);

    bench_opts o;
    memset(&o, 0, sizeof o);
    ch_status s = read_options(ch_job_config(job), &o);
    /* the backend: NCCL needs every rank on its own GPU */
    ch_pg_t *pg = ch_job_pg(job);
    int on_gpu = ch_job_on_gpu(job);
    if (s == CH_OK && o.backend == CH_PG_NCCL && !on_gpu)
        s = CH_ERROR(CH_ERR_CONFIG, "backend = nccl needs every rank on its own GPU, but the "
                     "ranks run on CPUs (%s)", ch_device_backend_compiled()
                                                   ? "no GPU visible"
                                                   : "cohort was built without CUDA");
    if (ch_job_agree(job, s, NULL)) return ch_job_finalize(job, CH_EXIT_BAD_INPUT);
    char devname[256] = "host memory";
    if (o.backend == CH_PG_NCCL || (o.backend < 0 && on_gpu)) {
        pg = ch_job_nccl(job);
        int dev = ch_job_env(job)->device;
        if (ch_device_name(dev, devname, sizeof devname) != CH_OK) ch_error_clear();
    }
    s = bench(job, pg, &o, devname);
    return ch_job_finalize(job, s == CH_OK ? CH_EXIT_OK : CH_EXIT_ERROR);
}
