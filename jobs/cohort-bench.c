/* cohort-bench: all-reduce bandwidth benchmark in the style of nccl-tests.
 *
 *   mpiexec -n 2 cohort-bench [options]        (--help lists them)
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
 * Backend: GPUs visible (ch_device_count > 0) and at least one per rank on
 * each node -> NCCL on device buffers, GPU = local rank; else MPI on host
 * buffers. --backend forces one. Only rank 0 prints. */
#include "config.h"

#include "framework/tensor/device.h"
#include "framework/dist/dist.h"
#include "framework/core/config_man.h"
#include "framework/core/log.h"
#include "framework/core/status.h"

#include <getopt.h>
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

static int g_rank, g_size;
static int g_aa; /* --aa: the "cohort" column also runs the raw call (A/A control) */

/* The options, for --help and the man page (--help-man): one table. */
static const ch_man_option_t bench_options[] = {
    {"-b, --min-bytes N", "smallest message size in bytes (default 8)"},
    {"-e, --max-bytes N", "largest message size in bytes (default 256M)"},
    {"-f, --step-factor N", "multiply the size by N each step (default 2, >= 2)"},
    {"-w, --warmup N", "untimed iterations per size and backend call (default 5)"},
    {"-n, --iters N", "timed iterations per size (default 50)"},
    {"--min-iters N", "at least this many timed iterations (default 5)"},
    {"--bytes-per-size N", "fewer iterations for big sizes: iterations x bytes <= N,\n"
                           "but >= --min-iters (default 1G)"},
    {"-p, --place MODE", "out (out-of-place), in (in-place) or both (default out)"},
    {"-c, --check 0|1", "compare cohort's result with the expected sum (default 1)"},
    {"-d, --backend B", "auto, mpi or nccl (default auto: nccl when every rank\n"
                        "has its own GPU, else mpi)"},
    {"--aa", "A/A control: the cohort column runs the raw call too,\n"
             "showing the noise floor of the comparison"},
    {"--raw-comm C", "communicator of the raw MPI call: world (MPI_COMM_WORLD,\n"
                     "default) or group (cohort's own duplicate of it)"},
    {"-h, --help", "this text"},
};
#define N_BENCH_OPTIONS ((int)(sizeof bench_options / sizeof *bench_options))

static const char bench_summary[] =
    "all-reduce benchmark of cohort's process group against raw MPI or NCCL";
static const char bench_intro[] =
    "All-reduce (float32, sum) benchmark: cohort's ch_pg_allreduce against the raw\n"
    "backend call on the same buffers, interleaved in one run. Sizes take K, M, G\n"
    "suffixes (binary: 1K = 1024 bytes).";
static const char bench_columns[] =
    "Columns: time is the median over iterations of the slowest rank (us);\n"
    "algbw = bytes/time; busbw = algbw*2(W-1)/W (GB/s = 1e9 B/s); maxerr = max\n"
    "|cohort result - expected|; ratio = median over iterations of the paired\n"
    "ratio cohort time / raw time of the two back-to-back calls of an iteration;\n"
    "ratio min = fastest cohort call / fastest raw call.";

static void usage(FILE *f)
{
    fprintf(f, "usage: mpiexec -n W cohort-bench [options]\n%s\n", bench_intro);
    for (int i = 0; i < N_BENCH_OPTIONS; i++) {
        const char *flags = bench_options[i].flags, *h = bench_options[i].help;
        /* "-b, --x" at column 2, a long-only option at column 6 */
        int col = fprintf(f, "%s%s", flags[1] == '-' ? "      " : "  ", flags);
        for (;;) {
            size_t n = strcspn(h, "\n");
            fprintf(f, "%*s%.*s\n", col < 26 ? 26 - col : 1, "", (int)n, h);
            if (!h[n]) break;
            h += n + 1;
            col = 0;
        }
    }
    fprintf(f, "%s\n", bench_columns);
}

/* --help-man: the same text as a man page. */
static int write_man(void)
{
    char desc[sizeof bench_intro + sizeof bench_columns + 2];
    snprintf(desc, sizeof desc, "%s\n\n%s", bench_intro, bench_columns);
    const ch_man_page_t page = {
        .prog = "cohort-bench",
        .summary = bench_summary,
        .synopsis = "[options]",
        .description = desc,
        .options = bench_options,
        .n_options = N_BENCH_OPTIONS,
        .see_also = "cohort-train(1)",
    };
    if (ch_man_write(stdout, &page) || fflush(stdout)) {
        fprintf(stderr, "cohort-bench: %s\n", ch_error_message());
        return 1;
    }
    return 0;
}

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

static int parse_int(const char *s, int lo, int hi, int *out)
{
    char *end = NULL;
    long v = strtol(s, &end, 10);
    if (end == s || *end || v < lo || v > hi) return -1;
    *out = (int)v;
    return 0;
}

/* 0: run, 1: exit 0 (help), 2: usage error (message printed by rank 0) */
static int parse_args(int argc, char **argv, bench_opts *o)
{
    static const struct option longopts[] = {
        {"min-bytes", required_argument, NULL, 'b'},
        {"max-bytes", required_argument, NULL, 'e'},
        {"step-factor", required_argument, NULL, 'f'},
        {"warmup", required_argument, NULL, 'w'},
        {"iters", required_argument, NULL, 'n'},
        {"min-iters", required_argument, NULL, 'I'},
        {"bytes-per-size", required_argument, NULL, 'B'},
        {"place", required_argument, NULL, 'p'},
        {"check", required_argument, NULL, 'c'},
        {"backend", required_argument, NULL, 'd'},
        {"raw-comm", required_argument, NULL, 'R'},
        {"aa", no_argument, NULL, 'A'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    o->min_bytes = 8;
    o->max_bytes = 256u << 20;
    o->bytes_per_size = 1u << 30;
    o->factor = 2;
    o->warmup = 5;
    o->iters = 50;
    o->min_iters = 5;
    o->place = 0;
    o->check = 1;
    o->backend = -1;
    o->raw_dup = 0;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, "b:e:f:w:n:p:c:d:h", longopts, NULL)) != -1) {
        int bad = 0;
        const char *what = "";
        switch (c) {
        case 'b': bad = parse_size(optarg, &o->min_bytes); what = "--min-bytes: a size like 8, 64K, 1M"; break;
        case 'e': bad = parse_size(optarg, &o->max_bytes); what = "--max-bytes: a size like 256M"; break;
        case 'B': bad = parse_size(optarg, &o->bytes_per_size); what = "--bytes-per-size: a size like 1G"; break;
        case 'f': bad = parse_int(optarg, 2, 1024, &o->factor); what = "--step-factor: an integer 2..1024"; break;
        case 'w': bad = parse_int(optarg, 0, 1000000, &o->warmup); what = "--warmup: an integer >= 0"; break;
        case 'n': bad = parse_int(optarg, 1, 1000000, &o->iters); what = "--iters: an integer >= 1"; break;
        case 'I': bad = parse_int(optarg, 1, 1000000, &o->min_iters); what = "--min-iters: an integer >= 1"; break;
        case 'c': bad = parse_int(optarg, 0, 1, &o->check); what = "--check: 0 or 1"; break;
        case 'p':
            if (!strcmp(optarg, "out")) o->place = 0;
            else if (!strcmp(optarg, "in")) o->place = 1;
            else if (!strcmp(optarg, "both")) o->place = 2;
            else bad = 1;
            what = "--place: out, in or both";
            break;
        case 'd':
            if (!strcmp(optarg, "auto")) o->backend = -1;
            else if (!strcmp(optarg, "mpi")) o->backend = CH_PG_MPI;
            else if (!strcmp(optarg, "nccl")) o->backend = CH_PG_NCCL;
            else bad = 1;
            what = "--backend: auto, mpi or nccl";
            break;
        case 'A': g_aa = 1; break;
        case 'R':
            if (!strcmp(optarg, "world")) o->raw_dup = 0;
            else if (!strcmp(optarg, "group")) o->raw_dup = 1;
            else bad = 1;
            what = "--raw-comm: world or group";
            break;
        case 'h':
            if (g_rank == 0) usage(stdout);
            return 1;
        default:
            if (g_rank == 0) {
                fprintf(stderr, "cohort-bench: unknown option or missing value: '%s'\n",
                        argv[optind - 1]);
                usage(stderr);
            }
            return 2;
        }
        if (bad) {
            if (g_rank == 0)
                fprintf(stderr, "cohort-bench: bad value '%s' for %s\n", optarg, what);
            return 2;
        }
    }
    if (optind < argc) {
        if (g_rank == 0) fprintf(stderr, "cohort-bench: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (o->min_bytes < 4 || o->min_bytes > o->max_bytes) {
        if (g_rank == 0)
            fprintf(stderr, "cohort-bench: need 4 <= --min-bytes (%zu) <= --max-bytes (%zu)\n",
                    o->min_bytes, o->max_bytes);
        return 2;
    }
    if (o->max_bytes / 4 > (size_t)INT32_MAX) {
        if (g_rank == 0) fprintf(stderr, "cohort-bench: --max-bytes must be below 8G\n");
        return 2;
    }
    return 0;
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

static ch_status bench(const bench_opts *o)
{
    ch_pg_t *mpi_pg = NULL, *pg = NULL;
    CH_TRY(ch_pg_create_mpi(MPI_COMM_WORLD, &mpi_pg));

    /* backend choice: NCCL needs a GPU per rank on every node */
    int ndev = 0, local_rank = 0, local_size = 1;
    CH_TRY(ch_device_count(&ndev));
    MPI_Comm node;
    CH_CHECK_MPI(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
    MPI_Comm_rank(node, &local_rank);
    MPI_Comm_size(node, &local_size);
    MPI_Comm_free(&node);
    int enough = ndev >= local_size, all_enough = 0;
    CH_CHECK_MPI(MPI_Allreduce(&enough, &all_enough, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
    int backend = o->backend;
    if (backend < 0) backend = (ndev > 0 && all_enough) ? CH_PG_NCCL : CH_PG_MPI;
    char devname[256] = "host memory";
    if (backend == CH_PG_NCCL) {
        if (!all_enough) {
            ch_pg_destroy(mpi_pg);
            return CH_ERROR(CH_ERR_UNSUPPORTED, "--backend nccl needs one GPU per rank: a "
                            "node runs %d rank%s but rank %d sees %d GPU(s)", local_size,
                            local_size == 1 ? "" : "s",
                            g_rank, ndev);
        }
        ch_check_fatal(ch_pg_create_nccl(mpi_pg, local_rank, &pg), "creating the NCCL group");
        if (ch_device_name(local_rank, devname, sizeof devname) != CH_OK) ch_error_clear();
    } else {
        pg = mpi_pg;
    }

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
    s = ch_pg_check_all(mpi_pg, s, NULL);

    summary sum = {0, 0, 0, 0};
    if (s == CH_OK && g_rank == 0) {
        printf("# cohort-bench: all-reduce, float32, sum, %d rank(s), backend %s (%s)\n",
               ch_pg_size(pg), backend == CH_PG_NCCL ? "nccl" : "mpi", devname);
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
    if (s == CH_OK && g_rank == 0 && sum.n_big > 0)
        printf("# sizes >= 64 KiB: %d of %d within 5%% of raw; worst ratio %.3f at %zu bytes\n",
               sum.n_big_ok, sum.n_big, sum.worst_ratio, sum.worst_bytes);
    ch_pg_buffer_free(pg, send);
    ch_pg_buffer_free(pg, recv);
    free(stage);
    free(times);
    if (pg != mpi_pg) ch_pg_destroy(pg);
    ch_pg_destroy(mpi_pg);
    return s;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    ch_log_set_rank(g_rank, g_size);
    if (ch_man_requested(argc, argv)) {
        int rc = g_rank == 0 ? write_man() : 0;
        MPI_Finalize();
        return rc;
    }
    bench_opts o;
    int pr = parse_args(argc, argv, &o);
    if (pr != 0) {
        MPI_Finalize();
        return pr == 1 ? 0 : 2;
    }
    ch_check_fatal(bench(&o), "cohort-bench");
    MPI_Finalize();
    return 0;
}
