/* cohort-farm-example: the seed's Pool.apply_async example on ch_farm_map.
 * Task k of example.tasks sums f(x) = sqrt(x * tanh(x) / log2(x) / log10(x))
 * over the example.range integers x = 2 + k * range ... 2 + (k + 1) * range - 1
 * (x = 1 would divide by log2(1) = 0) in double, over the ranks and their
 * threads; rank 0 prints the sums in task order, the wall time, and, with
 * example.check, compares each with the same sum in long double (computed
 * with ch_farm_map too): relative difference at most 1e-9.
 *
 *   mpiexec -n 2 jobs/cohort-farm-example [--example.range=30000000] [--example.threads=1]
 */
#include "framework/farm/map.h"
#include "framework/runtime/job.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static const ch_config_key_t keys[] = {
    {"example.tasks", CH_CFG_INT, "8", 1, 1 << 20, "Number of tasks."},
    {"example.range", CH_CFG_INT64, "30000000", 1, 1e12, "Integers summed by each task."},
    {"example.threads", CH_CFG_INT, "0", 0, 1024, "Threads per rank; 0: the rank's cores."},
    {"example.check", CH_CFG_BOOL, "true", CH_CFG_NO_RANGE, "Check each sum against a long double reference."},
};

static long long range;

static ch_status task_double(int64_t k, void *result, void *ctx)
{
    (void)ctx;
    double s = 0;
    for (long long x = 2 + k * range, end = x + range; x < end; x++) {
        double v = (double)x;
        s += sqrt(v * tanh(v) / log2(v) / log10(v));
    }
    *(double *)result = s;
    return CH_OK;
}

static ch_status task_long_double(int64_t k, void *result, void *ctx)
{
    (void)ctx;
    long double s = 0;
    for (long long x = 2 + k * range, end = x + range; x < end; x++) {
        long double v = (long double)x;
        s += sqrtl(v * tanhl(v) / log2l(v) / log10l(v));
    }
    *(long double *)result = s;
    return CH_OK;
}

int main(int argc, char **argv)
{
    const ch_config_table_t tables[] = {{"example", keys, 4}, ch_job_runtime_table()};
    ch_job_options_t jo;
    ch_job_options_default(&jo, "cohort-farm-example",
                           "the seed's sqrt(x*tanh(x)/log2(x)/log10(x)) sums as function tasks");
    jo.tables = tables;
    jo.n_tables = 2;
    ch_job_t *job;
    int rc = ch_job_init(&jo, argc, argv, &job);
    if (rc != CH_JOB_CONTINUE) return ch_job_finalize(job, rc);
    ch_config_t *c = ch_job_config(job);
    int n, check;
    ch_farm_map_options_t o = {0, 1};
    ch_status s = ch_config_get_int(c, "example.tasks", &n);
    if (!s) s = ch_config_get_int64(c, "example.range", &range);
    if (!s) s = ch_config_get_int(c, "example.threads", &o.threads);
    if (!s) s = ch_config_get_bool(c, "example.check", &check);
    double *sum = calloc((size_t)n, sizeof *sum);
    long double *ref = calloc((size_t)n, sizeof *ref);
    if (!s && (!sum || !ref)) s = CH_ERROR(CH_ERR_NOMEM, "out of memory");
    if (ch_job_agree(job, s, "example")) {
        free(sum);
        free(ref);
        return ch_job_finalize(job, CH_EXIT_BAD_INPUT);
    }
    MPI_Comm comm = ch_pg_mpi_comm(ch_job_pg(job));
    double t0 = MPI_Wtime();
    s = ch_farm_map(comm, &o, n, sizeof *sum, task_double, NULL, sum);
    double wall = MPI_Wtime() - t0;
    if (!s && check) s = ch_farm_map(comm, &o, n, sizeof *ref, task_long_double, NULL, ref);
    rc = ch_job_agree(job, s, "ch_farm_map") ? CH_EXIT_ERROR : CH_EXIT_OK;
    if (!rc && ch_job_rank(job) == 0) {
        double worst = 0;
        for (int k = 0; k < n; k++) {
            double rel = check ? (double)fabsl(((long double)sum[k] - ref[k]) / ref[k]) : 0;
            if (rel > worst) worst = rel;
            printf("task %d: %.17g\n", k, sum[k]);
        }
        printf("%d tasks x %lld integers on %d ranks: %.3f s", n, range, ch_job_world_size(job), wall);
        if (check) printf(", largest relative difference from long double %.3g (%s)", worst,
                          worst <= 1e-9 ? "ok" : "TOO LARGE");
        printf("\n");
        if (check && !(worst <= 1e-9)) rc = CH_EXIT_ERROR;
    }
    MPI_Bcast(&rc, 1, MPI_INT, 0, comm);
    free(sum);
    free(ref);
    return ch_job_finalize(job, rc);
}
