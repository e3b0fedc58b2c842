/* Thread pool benchmark: run JOBS jobs of WORK LCG steps each, either through
 * a pool of WORKERS threads (mode "pool", jobs in one group) or inline on the
 * calling thread (mode "inline"), and print the wall time and jobs/s.
 * Time the whole process with farm-bench for comparisons (see docs).
 *
 *   tests/bench_threadpool pool|inline WORKERS JOBS WORK
 */
#include "config.h"

#include "framework/core/status.h"
#include "framework/core/threadpool.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
    uint64_t work;
    uint64_t seed;
    uint64_t result;
} job_t;

static ch_status run_job(void *arg)
{
    job_t *j = arg;
    uint64_t x = j->seed;
    for (uint64_t i = 0; i < j->work; i++) x = x * 6364136223846793005ull + 1442695040888963407ull;
    j->result = x;
    return CH_OK;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv)
{
    if (argc != 5 || (strcmp(argv[1], "pool") && strcmp(argv[1], "inline"))) {
        fprintf(stderr, "usage: %s pool|inline WORKERS JOBS WORK\n", argv[0]);
        return 2;
    }
    int workers = atoi(argv[2]);
    long n = atol(argv[3]);
    uint64_t work = strtoull(argv[4], NULL, 10);
    job_t *jobs = calloc((size_t)(n > 0 ? n : 1), sizeof *jobs);
    if (!jobs || n <= 0) return 2;
    for (long i = 0; i < n; i++) {
        jobs[i].work = work;
        jobs[i].seed = (uint64_t)i;
    }
    double t0 = now();
    if (!strcmp(argv[1], "inline")) {
        for (long i = 0; i < n; i++) run_job(&jobs[i]);
    } else {
        ch_threadpool_t *pool;
        ch_threadpool_group_t *g;
        ch_check_fatal(ch_threadpool_create(workers, &pool), "pool");
        ch_check_fatal(ch_threadpool_group_create(&g), "group");
        for (long i = 0; i < n; i++) ch_check_fatal(ch_threadpool_submit_group(pool, g, run_job, &jobs[i]), "submit");
        ch_check_fatal(ch_threadpool_group_wait(g), "wait");
        ch_threadpool_group_destroy(g);
        ch_threadpool_destroy(pool);
    }
    double t = now() - t0;
    uint64_t sum = 0;
    for (long i = 0; i < n; i++) sum ^= jobs[i].result;
    printf("%s workers=%d jobs=%ld work=%llu: %.4f s, %.0f jobs/s (checksum %016llx)\n", argv[1],
           workers, n, (unsigned long long)work, t, (double)n / t, (unsigned long long)sum);
    free(jobs);
    return 0;
}
