/* Helper for tests/test_job: a whole program on ch_job, run under
 * mpiexec -n 1, 2 or 4 by test_job (ch_job_finalize calls MPI_Finalize, so
 * every case is its own program run).
 *
 *   job_helper --test.mode=MODE [--test.rank=K] [--test.step=S]
 *              [--test.steps=N] --test.output_dir=DIR [runtime keys]
 *
 * Modes (K: the rank that acts, S: the step at which it acts):
 *   ok         N steps, each ending in ch_job_stop_agree; exit 0.
 *   fail       setup step "task file": rank K fails (CH_ERR_FORMAT), every
 *              rank ends with CH_EXIT_BAD_INPUT.
 *   remote     rank K fails with CH_ERR_REMOTE and rank K+1 with its own
 *              error: the own error is the one printed.
 *   request    rank K calls ch_job_request_stop before step S's agreement.
 *   stopfile   rank K creates <dir>/STOP before step S's agreement (then a
 *              barrier, so rank 0's check sees it at step S).
 *   signal     rank K raises SIGUSR2 (dist.warning_signal) before step S's
 *              agreement.
 *   nonfinite  rank K passes CH_STOP_NONFINITE at step S; exit 1.
 *   die        rank K exits at once (status 9, no MPI_Finalize) at step S;
 *              the others go on into the agreement.
 *   progress   every step reports ch_job_progress("epoch 0", step+1, N,
 *              every 2, "loss 0.5000").
 *   requeue    after the loop, ch_job_requeue (dist.requeue decides).
 *   mpierr     every rank's own collective fails at step S with CH_ERR_MPI
 *              naming rank K (as MPICH words a lost peer): each says in one
 *              line that rank K is gone, exit CH_EXIT_PEER_LOST.
 *   teardown_hang  after the loop, rank K registers a cleanup that never
 *              returns (a teardown stuck on a dead peer): dist.timeout ends it.
 *
 * Every rank that finishes the loop prints on stdout
 *   "rank R: stopped at step X of N, reasons 0xH, signal G"
 * (X = N when nothing stopped it), and every rank's finalize runs a
 * registered cleanup that prints "rank R: cleanup" (and frees memory, for
 * the leak check). */
#include "config.h"

#include "framework/core/status.h"
#include "framework/runtime/job.h"

#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const ch_config_key_t keys[] = {
    {"test.mode", CH_CFG_STRING, "ok", CH_CFG_NO_RANGE, "What to do (see tests/job_helper.c)."},
    {"test.rank", CH_CFG_INT, "0", 0, 1024, "The rank that acts."},
    {"test.step", CH_CFG_INT, "2", 0, 1000000, "The step at which it acts."},
    {"test.steps", CH_CFG_INT, "6", 0, 1000000, "Steps of the loop."},
    {"test.output_dir", CH_CFG_STRING, NULL, CH_CFG_NO_RANGE, "Output directory (required)."},
};

typedef struct {
    int rank;
    char *buffer; /* freed by the cleanup: a leak if finalize skipped it */
} cleanup_arg_t;

static void cleanup(void *arg)
{
    cleanup_arg_t *c = arg;
    printf("rank %d: cleanup\n", c->rank);
    fflush(stdout);
    free(c->buffer);
    free(c);
}

/* A cleanup that never returns (mode teardown_hang). */
static void hang_forever(void *arg)
{
    (void)arg;
    for (;;) sleep(1);
}

int main(int argc, char **argv)
{
    const ch_config_table_t tables[] = {
        {"test", keys, (int)(sizeof keys / sizeof keys[0])},
        ch_job_runtime_table(),
    };
    static const char *const phases[] = {"step"};
    ch_job_options_t o;
    ch_job_options_default(&o, "job_helper", "ch_job test program (tests/test_job.c)");
    o.tables = tables;
    o.n_tables = 2;
    o.output_dir_key = "test.output_dir";
    o.phase_names = phases;
    o.n_phases = 1;
    o.preemption = 1;
    ch_job_t *job;
    int rc = ch_job_init(&o, argc, argv, &job);
    if (rc != CH_JOB_CONTINUE) return ch_job_finalize(job, rc);

    const int rank = ch_job_rank(job);
    cleanup_arg_t *ca = malloc(sizeof *ca);
    if (ca) {
        ca->rank = rank;
        ca->buffer = malloc(1024);
    }
    if (!ca || ch_job_on_finalize(job, cleanup, ca) != CH_OK) {
        if (ca) free(ca->buffer);
        free(ca);
        fprintf(stderr, "job_helper: out of memory\n");
        return ch_job_finalize(job, CH_EXIT_ERROR);
    }

    ch_config_t *cfg = ch_job_config(job);
    const char *mode;
    int k, at, steps;
    ch_status s = ch_config_get_string(cfg, "test.mode", &mode);
    if (s == CH_OK) s = ch_config_get_int(cfg, "test.rank", &k);
    if (s == CH_OK) s = ch_config_get_int(cfg, "test.step", &at);
    if (s == CH_OK) s = ch_config_get_int(cfg, "test.steps", &steps);
    if (ch_job_agree(job, s, "helper keys")) return ch_job_finalize(job, CH_EXIT_BAD_INPUT);

    s = CH_OK;
    if (!strcmp(mode, "fail") && rank == k)
        s = CH_ERROR(CH_ERR_FORMAT, "tasks.txt:3: expected 2 fields, got 1");
    if (!strcmp(mode, "remote") && rank == k)
        s = CH_ERROR(CH_ERR_REMOTE, "rank %d: a peer failed (not the cause)", rank);
    if (!strcmp(mode, "remote") && rank == k + 1)
        s = CH_ERROR(CH_ERR_IO, "cannot open shard %d", rank);
    if (ch_job_agree(job, s, "task file")) return ch_job_finalize(job, CH_EXIT_BAD_INPUT);

    int step = 0, reasons = 0;
    for (step = 0; step < steps; step++) {
        ch_prof_begin(ch_job_profiler(job), 0);
        int local = 0;
        if (rank == k && step == at) {
            if (!strcmp(mode, "request")) ch_job_request_stop(job);
            if (!strcmp(mode, "signal")) raise(SIGUSR2);
            if (!strcmp(mode, "nonfinite")) local |= CH_STOP_NONFINITE;
            if (!strcmp(mode, "die")) {
                fflush(stdout);
                _exit(9);
            }
            if (!strcmp(mode, "stopfile")) {
                char path[4200];
                snprintf(path, sizeof path, "%s/STOP", ch_job_output_dir(job));
                FILE *f = fopen(path, "w");
                if (f) fclose(f);
            }
        }
        if (!strcmp(mode, "stopfile") && step == at) MPI_Barrier(MPI_COMM_WORLD);
        if (!strcmp(mode, "mpierr") && step == at) {
            ch_status e = CH_ERROR(CH_ERR_MPI, "MPI_Allreduce failed: Communication error with "
                                   "rank %d", k);
            int code = ch_job_check_collective(job, e, "loss all-reduce");
            printf("rank %d: peer lost %d, exit %d\n", rank, ch_job_peer_lost(job), code);
            fflush(stdout);
            return ch_job_finalize(job, code);
        }
        ch_prof_end(ch_job_profiler(job), 0);
        if (!strcmp(mode, "progress")) ch_job_progress(job, "epoch 0", step + 1, steps, 2, "loss 0.5000");
        ch_job_heartbeat(job);
        reasons = ch_job_stop_agree(job, local);
        if (reasons) break;
    }
    printf("rank %d: stopped at step %d of %d, reasons 0x%x, signal %d\n", rank, step, steps,
           reasons, ch_job_stop_signal(job));
    fflush(stdout);
    if (!strcmp(mode, "requeue")) ch_job_requeue(job);
    /* a teardown that never ends on rank K (an NCCL group draining towards
     * a dead peer): dist.timeout's watchdog must end it */
    if (!strcmp(mode, "teardown_hang") && rank == k) {
        s = ch_job_on_finalize(job, hang_forever, NULL);
        if (s != CH_OK) fprintf(stderr, "job_helper: %s\n", ch_error_message());
    }
    if (reasons & CH_STOP_NONFINITE) return ch_job_finalize(job, CH_EXIT_ERROR);
    if (reasons & (CH_STOP_PREEMPT | CH_STOP_FILE)) return ch_job_finalize(job, CH_EXIT_PREEMPTED);
    return ch_job_finalize(job, CH_EXIT_OK);
}
