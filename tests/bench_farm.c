/* Reference rates for cohort-farm's benchmark (docs/PERFORMANCE.md):
 *   bench_farm spawn N SLOTS   N x `/bin/sh -c true` by posix_spawn + waitpid,
 *                              SLOTS at a time: the machine's bare fork+exec
 *                              rate for shell tasks (tasks/s)
 *   mpiexec -n 2 bench_farm pingpong N
 *                              MPI round trip of a 24-byte message between
 *                              ranks 0 and 1 (median of N, microseconds)
 *   mpiexec -n W bench_farm map N
 *                              ch_farm_map over N tiny function tasks
 *                              (result 2*i), default threads and chunks
 *   mpiexec -n W bench_farm farm N SLOTS DIR SYNC [BIND]
 *                              the farm engine alone (framework/farm, no job
 *                              runtime): N `true` tasks, SLOTS per rank, run
 *                              directory DIR (must not hold a journal), journal
 *                              sync all|end|none|batch, BIND 0 or 1 (farm.bind,
 *                              default 1); tasks/s of the dispatch
 */
#include "framework/farm/farm.h"
#include "framework/farm/map.h"

#include <mpi.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

extern char **environ;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int spawn_bench(long n, int slots)
{
    char *argv[] = {"sh", "-c", "true", NULL};
    long started = 0, ended = 0;
    int running = 0;
    double t0 = now();
    while (ended < n) {
        while (running < slots && started < n) {
            pid_t pid;
            if (posix_spawn(&pid, "/bin/sh", NULL, NULL, argv, environ) != 0) {
                perror("posix_spawn");
                return 1;
            }
            started++;
            running++;
        }
        int st;
        if (wait(&st) > 0) {
            ended++;
            running--;
        }
    }
    double el = now() - t0;
    printf("spawn: %ld tasks, %d slots, %.3f s, %.1f tasks/s\n", n, slots, el, (double)n / el);
    return 0;
}

static int pingpong(long n)
{
    int provided, rank, size;
    MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size != 2) {
        if (rank == 0) fprintf(stderr, "pingpong needs 2 ranks\n");
        MPI_Finalize();
        return 2;
    }
    char buf[24] = {0};
    double *t = malloc(sizeof *t * (size_t)n);
    for (long i = 0; i < n; i++) {
        double t0 = MPI_Wtime();
        if (rank == 0) {
            MPI_Send(buf, sizeof buf, MPI_BYTE, 1, 0, MPI_COMM_WORLD);
            MPI_Recv(buf, sizeof buf, MPI_BYTE, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else {
            MPI_Recv(buf, sizeof buf, MPI_BYTE, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Send(buf, sizeof buf, MPI_BYTE, 0, 0, MPI_COMM_WORLD);
        }
        t[i] = MPI_Wtime() - t0;
    }
    if (rank == 0) {
        qsort(t, (size_t)n, sizeof *t, cmp);
        printf("pingpong: %ld round trips, median %.2f us, min %.2f us (thread level %d)\n", n,
               1e6 * t[n / 2], 1e6 * t[0], provided);
    }
    free(t);
    MPI_Finalize();
    return 0;
}

static int farm_bench(long n, int slots, const char *dir, const char *sync, int bind)
{
    int provided, rank;
    MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    char *text = malloc((size_t)n * 5 + 1);
    for (long i = 0; i < n; i++) memcpy(text + 5 * i, "true\n", 5);
    ch_taskfile_t *tf = NULL;
    ch_farm_t *f = NULL;
    ch_farm_options_t o;
    ch_farm_summary_t sum;
    ch_farm_options_default(&o);
    o.dir = dir;
    o.slots_per_rank = slots;
    o.bind = bind;
    if (getenv("BENCH_FARM_OUTPUT")) o.output = (ch_farm_output)atoi(getenv("BENCH_FARM_OUTPUT"));
    o.sync = !strcmp(sync, "none")  ? CH_JOURNAL_SYNC_NONE
             : !strcmp(sync, "end")  ? CH_JOURNAL_SYNC_END
             : !strcmp(sync, "batch") ? CH_JOURNAL_SYNC_BATCH : CH_JOURNAL_SYNC_ALL;
    ch_status s = ch_taskfile_parse("bench", text, (size_t)n * 5, &tf);
    o.tasks = tf;
    if (!s) s = ch_farm_create(&o, MPI_COMM_WORLD, &f);
    if (!s) s = ch_farm_run(f, &sum);
    if (s && rank == 0) fprintf(stderr, "bench_farm: %s\n", ch_error_message());
    if (!s && rank == 0)
        printf("farm: %ld tasks, %d ranks x %d slots, sync %s, %.3f s, %.1f tasks/s\n", n,
               sum.world_size, sum.slots_per_rank, sync, sum.seconds,
               (double)sum.attempts / sum.seconds);
    ch_farm_destroy(f);
    ch_taskfile_destroy(tf);
    free(text);
    MPI_Finalize();
    return s ? 1 : 0;
}

static ch_status twice(int64_t i, void *result, void *ctx)
{
    (void)ctx;
    *(int64_t *)result = 2 * i;
    return CH_OK;
}

static int map_bench(long n)
{
    int provided, rank;
    MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    int64_t *r = rank == 0 ? malloc(sizeof *r * (size_t)n) : NULL;
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    ch_status s = ch_farm_map(MPI_COMM_WORLD, NULL, n, sizeof(int64_t), twice, NULL, r);
    double el = MPI_Wtime() - t0;
    if (rank == 0) {
        if (s || r[n - 1] != 2 * (int64_t)(n - 1)) fprintf(stderr, "bench_farm map: wrong result\n");
        else printf("map: %ld tasks, %.4f s, %.0f tasks/s\n", n, el, (double)n / el);
    }
    free(r);
    MPI_Finalize();
    return s ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "map")) return map_bench(atol(argv[2]));
    if ((argc == 6 || argc == 7) && !strcmp(argv[1], "farm"))
        return farm_bench(atol(argv[2]), atoi(argv[3]), argv[4], argv[5], argc == 7 ? atoi(argv[6]) : 1);
    if (argc == 4 && !strcmp(argv[1], "spawn")) return spawn_bench(atol(argv[2]), atoi(argv[3]));
    if (argc == 3 && !strcmp(argv[1], "pingpong")) return pingpong(atol(argv[2]));
    fprintf(stderr, "usage: bench_farm spawn N SLOTS | mpiexec -n 2 bench_farm pingpong N | "
                    "mpiexec -n W bench_farm farm N SLOTS DIR all|end|none|batch\n");
    return 2;
}
