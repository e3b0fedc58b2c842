/* cohort: MPI rank printer for the Slurm tests (tests/test_slurm.sh) and a
 * stand-in for jobs/cohort-train under the sbatch templates (COHORT_BIN).
 *
 * Prints one line per process:
 *   rank R of W procid P nodeid N localid L threads T gpus G restart C args A...
 * where R, W come from MPI_Comm_rank / MPI_Comm_size of MPI_COMM_WORLD and
 * the rest from the environment Slurm gives a task (SLURM_PROCID,
 * SLURM_NODEID, SLURM_LOCALID, OMP_NUM_THREADS, CUDA_VISIBLE_DEVICES,
 * SLURM_RESTART_COUNT; "-" where unset), followed by the command-line
 * arguments (so a test sees what a template passes to cohort-train).
 *
 * With COHORT_STANDIN_WAIT_SIGNAL=SECONDS in the environment, on a job's
 * first run (SLURM_RESTART_COUNT unset or 0) every rank then waits up to
 * SECONDS for SIGUSR2 or SIGTERM, prints
 *   rank R got signal NAME
 * (or "rank R no signal") and exits 3 after a signal, as cohort-train does
 * after a preemption stop (0 without one): this checks that a template
 * forwards the preemption warning signal from the batch shell to the
 * program and requeues after it. A requeued run (SLURM_RESTART_COUNT >= 1)
 * does not wait.
 * Exit status 0 on success, 3 after a signal, 1 if MPI fails. */
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static volatile sig_atomic_t got_signal;

static void on_signal(int sig)
{
    got_signal = sig;
}

static const char *env_or_dash(const char *name)
{
    const char *v = getenv(name);
    return (v && *v) ? v : "-";
}

int main(int argc, char **argv)
{
    int rank = -1, size = -1;
    const char *wait_s = getenv("COHORT_STANDIN_WAIT_SIGNAL");
    const char *restarts = getenv("SLURM_RESTART_COUNT");
    struct sigaction sa;

    if (restarts && atoi(restarts) > 0)
        wait_s = NULL;

    /* Install handlers before MPI_Init so that a signal sent as soon as the
     * task exists is not lost (the default action would kill the task). */
    if (wait_s) {
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_signal;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGUSR2, &sa, NULL);
        sigaction(SIGTERM, &sa, NULL);
    }
    if (MPI_Init(&argc, &argv) != MPI_SUCCESS
        || MPI_Comm_rank(MPI_COMM_WORLD, &rank) != MPI_SUCCESS
        || MPI_Comm_size(MPI_COMM_WORLD, &size) != MPI_SUCCESS) {
        fprintf(stderr, "test_slurm_rank: MPI initialisation failed\n");
        return 1;
    }

    char line[4096];
    int n = snprintf(line, sizeof line,
                     "rank %d of %d procid %s nodeid %s localid %s threads %s gpus %s restart %s args",
                     rank, size, env_or_dash("SLURM_PROCID"), env_or_dash("SLURM_NODEID"),
                     env_or_dash("SLURM_LOCALID"), env_or_dash("OMP_NUM_THREADS"),
                     env_or_dash("CUDA_VISIBLE_DEVICES"), env_or_dash("SLURM_RESTART_COUNT"));
    for (int i = 1; i < argc && n > 0 && (size_t)n < sizeof line; i++)
        n += snprintf(line + n, sizeof line - (size_t)n, " %s", argv[i]);
    /* One write per line so that lines of different ranks do not interleave. */
    printf("%s\n", line);
    fflush(stdout);

    if (wait_s) {
        double limit = atof(wait_s);
        struct timespec t0, now, nap = {0, 20 * 1000 * 1000};
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (;;) {
            if (got_signal)
                break;
            clock_gettime(CLOCK_MONOTONIC, &now);
            if ((double)(now.tv_sec - t0.tv_sec) + 1e-9 * (double)(now.tv_nsec - t0.tv_nsec) > limit)
                break;
            nanosleep(&nap, NULL);
        }
        if (got_signal)
            printf("rank %d got signal %s\n", rank, got_signal == SIGUSR2 ? "USR2" : "TERM");
        else
            printf("rank %d no signal\n", rank);
        fflush(stdout);
    }
    MPI_Finalize();
    return got_signal ? 3 : 0;
}
