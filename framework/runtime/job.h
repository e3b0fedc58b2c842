/* cohort: the job runtime (ch_job). One lifecycle for every cohort program.
 *
 * A job is a program in jobs/ that does its own work (a training loop, a task
 * farm, a reduction) on top of this runtime; the runtime owns everything
 * around it, so that a new job is about 100 lines:
 *
 *     static const ch_config_key_t my_keys[] = {...};
 *     int main(int argc, char **argv)
 *     {
 *         const ch_config_table_t tables[] = {
 *             {"farm", my_keys, N_MY_KEYS}, ch_job_runtime_table(),
 *         };
 *         ch_job_options_t o;
 *         ch_job_options_default(&o, "cohort-farm", "task farm over the ranks");
 *         o.tables = tables; o.n_tables = 2;
 *         ch_job_t *job;
 *         int rc = ch_job_init(&o, argc, argv, &job);
 *         if (rc != CH_JOB_CONTINUE) return ch_job_finalize(job, rc);
 *         ... read keys with ch_config_get_*(ch_job_config(job), ...) ...
 *         if (ch_job_agree(job, s, "task file")) return ch_job_finalize(job, CH_EXIT_BAD_INPUT);
 *         while (...) { ...; if (ch_job_stop_agree(job, 0)) break; }
 *         return ch_job_finalize(job, CH_EXIT_OK);
 *     }
 *
 * What ch_job_init does, in order (each step's failure becomes one verdict on
 * every rank, printed once (ch_job_agree), and an exit code; the MPI process
 * group is made right after MPI starts, so that every later step can be
 * agreed over it):
 *   1. MPI_Init_thread with the asked thread level (MPI_THREAD_FUNNELED by
 *      default; a lower level provided is an error, exit 1) unless MPI is
 *      already initialised (then ch_job_finalize leaves MPI_Finalize to the
 *      caller); MPI errors on MPI_COMM_WORLD return instead of aborting,
 *      so a lost peer rank is reported in one line (CH_EXIT_PEER_LOST).
 *   2. identity and launch checks (framework/launch/env.h: MPI, torchrun,
 *      srun + PMI2, a singleton MPI under an srun step of several tasks is
 *      refused), rank-aware logging (ch_log_set_rank).
 *   3. the MPI process group over MPI_COMM_WORLD.
 *   4. configuration: --config FILE, then command-line overrides, against
 *      the concatenation of opt->tables; --help prints every key grouped by
 *      table (the job's, then each object's) and init returns CH_EXIT_OK;
 *      then the runtime's keys and opt->check_config (the job's own check).
 *   5. with opt->compute: the device rule (dist.device_rule), the all-or-none
 *      GPU check, the compute backend (compute.* keys, ch_compute_from_config,
 *      when the job lists ch_compute_config_table(); else the defaults), and
 *      an NCCL process group over MPI when the ranks are on GPUs.
 *   6. with opt->output_dir_key: rank 0 creates the directory (mkdir -p),
 *      probes it, takes the run-directory lock (<dir>/cohort.lock, a POSIX
 *      fcntl write lock held until ch_job_finalize; the file holds
 *      "host=H job=SLURM_JOB_ID pid=P"): a directory locked by a live run
 *      is refused at once (CH_EXIT_BAD_INPUT, the message names the holder),
 *      a lock left by a run that has ended is taken over (logged). Holding
 *      it, rank 0 removes stale temp files of atomic writes: no other run
 *      writes there, so they are a dead writer's. On a file system without
 *      POSIX locks (Lustre without -o flock) the run goes on without the
 *      lock and without the sweep, with a warning.
 *   7. the profiler (opt->phase_names). With opt->preemption the
 *      preemption signal handlers (SIGTERM + dist.warning_signal) are
 *      installed earlier, right after the configuration (step 4): a signal
 *      during steps 5-7 (device, NCCL, output directory) is a stop at the
 *      job's first ch_job_stop_agree, not a death by the signal.
 *
 * Threading: every ch_job_* function is called from the thread that called
 * ch_job_init (the main thread), unless its docstring says otherwise.
 */
#ifndef COHORT_JOB_H
#define COHORT_JOB_H

#include "framework/core/configuration.h"
#include "framework/core/status.h"
#include "framework/dist/dist.h"
#include "framework/launch/env.h"
#include "framework/ops/ops.h"
#include "framework/core/profiler.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Exit codes of every cohort program (README "Exit status", cohort(7)). */
enum {
    CH_EXIT_OK = 0,        /* success on every rank (also --help) */
    CH_EXIT_ERROR = 1,     /* runtime error; every rank ends, none hangs */
    CH_EXIT_BAD_INPUT = 2, /* bad configuration or input, found before work started */
    CH_EXIT_PREEMPTED = 3, /* stopped by a preemption/stop request after saving state */
    CH_EXIT_PEER_LOST = 4, /* another rank died; the survivors say which and end */
};

/* ch_job_init's return when the job should go on (not an exit code). */
#define CH_JOB_CONTINUE (-1)

/* ch_config_table_t (a named key table) is in framework/core/configuration.h. */

/* Reasons to stop at a step boundary (bits; ch_job_stop_agree ORs them over
 * ranks). */
enum {
    CH_STOP_PREEMPT = 1,    /* SIGTERM or the warning signal arrived */
    CH_STOP_NONFINITE = 2,  /* a non-finite value (loss) on some rank */
    CH_STOP_FILE = 4,       /* the user's stop file (<output dir>/STOP) exists */
    CH_STOP_REQUESTED = 8,  /* the job asked (ch_job_request_stop) */
    CH_STOP_PEER_LOST = 16, /* the agreement itself failed: a peer rank is gone
                               (ch_job_finalize then exits CH_EXIT_PEER_LOST) */
};

typedef struct ch_job ch_job_t;

typedef struct {
    const char *name;                /* program name, "cohort-train" */
    const char *summary;             /* one line for --help and the man page */
    const ch_config_table_t *tables; /* the job's table first, then the objects' */
    int n_tables;
    int mpi_thread_level;            /* MPI_THREAD_* (default MPI_THREAD_FUNNELED) */
    int compute;                     /* 1: device rule, compute backend, NCCL on GPUs
                                        (compute.* keys when the job lists
                                        ch_compute_config_table(), else defaults) */
    const char *output_dir_key;      /* config key of the output directory, or NULL */
    const char *const *phase_names;  /* profiler phases (NULL: no phases) */
    int n_phases;
    int preemption;                  /* 1: SIGTERM + dist.warning_signal handlers */
    const char *threads_key;         /* with compute: int key of the CPU thread count
                                        (ch_compute_options_t.num_threads, e.g.
                                        "train.threads"); NULL: the runtime's default */
    int no_identity_line;            /* 1: init does not log the launch identity line
                                        (ch_job_env(job)->note); the job shows it itself,
                                        e.g. as a comment of a table on stdout */
    ch_status (*check_config)(const ch_config_t *cfg); /* NULL, or the job's own check of
                                        its keys (choices, combinations), called on every
                                        rank right after the configuration is read (step
                                        4): its error is a config error (CH_EXIT_BAD_INPUT,
                                        no prefix), before any device or output directory
                                        (no run directory, no lock left behind) */
} ch_job_options_t;

/* Defaults: FUNNELED, no compute, no output dir, no phases, no preemption. */
void ch_job_options_default(ch_job_options_t *opt, const char *name, const char *summary);

/* The runtime's own keys (dist.device_rule, dist.warning_signal,
 * dist.requeue, ...), titled "runtime"; list it in opt->tables. */
ch_config_table_t ch_job_runtime_table(void);

/* Start the job (steps 1-7 above). Always sets *out (also on failure, so
 * ch_job_finalize can end it) except when out of memory before MPI starts.
 * Returns CH_JOB_CONTINUE, or the exit code to hand to ch_job_finalize:
 * CH_EXIT_OK after --help, CH_EXIT_BAD_INPUT for a bad launch, config,
 * device or output directory, CH_EXIT_ERROR for a runtime failure. The
 * error has been printed once (ch_job_agree's format, "<name>: rank R:
 * <message>"). --help prints the help (rank 0, stdout) and nothing before
 * it. The launch identity (env note) is logged once the config is read,
 * unless opt->no_identity_line. */
int ch_job_init(const ch_job_options_t *opt, int argc, char **argv, ch_job_t **out);

/* The one exit: prints the profile table (rank 0; when phases were given and
 * the job got past init), destroys what the runtime made (NCCL group,
 * compute backend, process group, config, profiler; runs the cleanup
 * functions registered with ch_job_on_finalize in reverse order first),
 * MPI_Finalize, and returns exit_code for main to return. Ranks must agree
 * on exit_code (use ch_job_agree / ch_job_stop_agree first). job may be
 * NULL (out of memory at init): returns CH_EXIT_ERROR. After a lost peer
 * (ch_job_peer_lost) it makes no collective (no profile table, no
 * MPI_Comm_free, no MPI_Finalize, which could wait for the dead rank
 * forever): the job's cleanups run, then the process ends at once with
 * _exit(CH_EXIT_PEER_LOST) and the call does not return. With dist.timeout
 * > 0 the whole teardown (profile table, cleanups, the NCCL group's drain
 * of its comm stream, the process groups) runs under the watchdog with a
 * fresh timeout: past it, one line ("teardown ... not done after N s") and
 * _exit(CH_EXIT_PEER_LOST), as in the step. */
int ch_job_finalize(ch_job_t *job, int exit_code);

/* Register fn(arg) to run in ch_job_finalize (last registered runs first),
 * so a job's objects are destroyed on every exit path. CH_ERR_NOMEM. */
ch_status ch_job_on_finalize(ch_job_t *job, void (*fn)(void *arg), void *arg);

/* One verdict over all ranks for a setup step (collective: two small
 * all-reduces). `local` is this rank's status, its message the thread's
 * error message. Returns 0 when every rank succeeded; otherwise 1 on every
 * rank, with one message printed once on stderr, by the lowest rank whose
 * failure is its own (a CH_ERR_REMOTE status, "another rank failed", only
 * when no rank has another code):
 *     "<name>: rank R: <what>: <message>[ [on K of W ranks; the lowest shown]]"
 * (K: the ranks whose failure is their own, shown when more than one;
 * "[on all W ranks]" when every rank failed on its own; no "rank R: " in a
 * world of one; no "<what>: " when what is NULL). Ranks that failed too stay quiet;
 * this rank's own message stays the thread's error. When the all-reduce
 * itself fails (a peer rank gone) the peer-lost line is printed instead
 * (see ch_job_check_collective) and ch_job_peer_lost becomes 1. */
int ch_job_agree(ch_job_t *job, ch_status local, const char *what);

/* For a collective the job makes itself (ch_pg_allreduce of its loss, ...):
 * 0 when s is CH_OK. CH_ERR_MPI (the collective failed: with MPI_ERRORS_RETURN
 * that is a peer rank gone or the network down): prints one line
 * "<name>: rank R: rank K is gone (<what> failed: <MPI's text>); the job is
 * ending (exit 4)" (K when MPI's text names it, else "another rank"), marks
 * the job (ch_job_peer_lost) and returns CH_EXIT_PEER_LOST: the caller ends
 * with ch_job_finalize without further collectives. Any other error may
 * leave peers waiting in the next collective: ch_fatal(what, CH_EXIT_ERROR)
 * (MPI_Abort; never returns).
 * Note: under MPICH's hydra (mpiexec) a rank that dies makes hydra SIGKILL
 * the others at once, so survivors never get here; the exit status of
 * mpiexec is then the dead rank's (e.g. 9). Where the launcher lets the
 * survivors run (srun without --kill-on-bad-exit, an MPI whose collectives
 * return an error for a lost peer) this is the one line and exit 4. */
int ch_job_check_collective(ch_job_t *job, ch_status s, const char *what);

/* The agreed stop flag at a step boundary (collective: every rank calls it
 * at the same step). local_reasons are CH_STOP_* bits this rank adds (e.g.
 * CH_STOP_NONFINITE); the runtime adds CH_STOP_PREEMPT when a signal
 * arrived, CH_STOP_FILE when the stop file exists (rank 0 checks), and
 * CH_STOP_REQUESTED after ch_job_request_stop. Rank 0 renames the stop
 * file to <output dir>/STOPPED when it finds it (so that a resumed run goes
 * on, and a batch script can tell a user's stop from a preemption: the
 * sbatch templates do not requeue it) and logs it.
 * Returns the OR over ranks
 * (0: go on); the same value on every rank. The value is also kept
 * (ch_job_stop_reasons). */
int ch_job_stop_agree(ch_job_t *job, int local_reasons);

/* For jobs that fold the stop flag into a collective they make anyway (the
 * training loss all-reduce): ch_job_stop_local gives this rank's reasons
 * (as ch_job_stop_agree would contribute), and ch_job_stop_set records the
 * reduced value the job computed. */
int ch_job_stop_local(ch_job_t *job, int local_reasons);
void ch_job_stop_set(ch_job_t *job, int agreed_reasons);

/* Ask to stop at the next ch_job_stop_agree (this rank only). */
void ch_job_request_stop(ch_job_t *job);

/* A step boundary was reached (call it once per step, and per batch of
 * long phases such as evaluation). The first call arms a watchdog thread:
 * when no call comes for dist.timeout seconds (default 1800; 0 turns it
 * off) this rank prints one line ("<prog>: rank R: no step boundary for T s
 * ...: a peer rank is gone or hung") and ends with CH_EXIT_PEER_LOST. It
 * is how the survivors of a dead rank end where the launcher leaves them
 * running and MPI does not report the loss (srun without
 * --kill-on-bad-exit, mpiexec -disable-auto-cleanup): their collective
 * never returns. Setup before the first call is not covered (its steps are
 * agreed with ch_job_agree). Cheap: a mutex and a clock read. */
void ch_job_heartbeat(ch_job_t *job);

/* The last agreed reasons (0 if none), and the preemption signal number:
 * after ch_job_stop_agree the highest signal number any rank received (so
 * every rank reports the same one); after ch_job_stop_set this rank's own
 * (0 when the signal arrived on another rank only). */
int ch_job_stop_reasons(const ch_job_t *job);
int ch_job_stop_signal(const ch_job_t *job);

/* Test hook (for the test suite; not a configuration key): a hold point
 * that makes "the job is still running at X" deterministic, however fast
 * the machine. When the environment variable COHORT_TEST_HOLD is
 * KIND:N:DIR (read once by ch_job_init; a malformed value or a DIR that is
 * not a directory fails the init with exit 2 and one line) and this call's
 * kind and n are KIND and N, for the first such call only: the rank creates
 * DIR/held.RANK, then waits (polling every 10 ms, no signal used, so a
 * Slurm SIGCONT does not end the wait) until DIR/release exists; a
 * preemption signal received meanwhile is recorded as DIR/signal.RANK
 * (its number) and, as always, acted on at the next stop check. The wait
 * is no step boundary (no ch_job_heartbeat): dist.timeout still runs. Nothing
 * read from the variable is executed. Unset: returns at once (a pointer
 * test). The jobs name their points, e.g. cohort-train "step" with the
 * global step number just completed (before the step's stop check) and
 * "epoch" with the epoch whose checkpoints were just written; cohort-reduce
 * "sync" with the number of the ranks' agreement points passed (all passes,
 * from 1; the first comes after the first chunk), before that agreement. */
void ch_job_test_hold(ch_job_t *job, const char *kind, long long n);

/* Requeue the Slurm job (scontrol requeue $SLURM_JOB_ID) when dist.requeue
 * is on; rank 0 only (other ranks: no-op). Logs what it did. */
void ch_job_requeue(ch_job_t *job);

/* Rank-0 progress on stderr (other ranks: no-op). On a terminal a bar
 * redrawn in place, "\r<what> [#####.....] done/total  ETA 12s  <text>",
 * ended by a newline at done == total; else one line
 * "<what> done/total  ETA 12s  <text>" when done is a multiple of `every`
 * (every <= 0: never) and at done == total. text (may be NULL) is appended
 * ("1234 img/s  loss 0.4321"). The ETA is from the time since the first
 * call with this `what` (a new what, or done going back, restarts it). */
void ch_job_progress(ch_job_t *job, const char *what, int64_t done, int64_t total, int every,
                     const char *text);

/* Accessors (valid from ch_job_init until ch_job_finalize). */
int ch_job_rank(const ch_job_t *job);
int ch_job_world_size(const ch_job_t *job);
int ch_job_local_rank(const ch_job_t *job);
const ch_env_t *ch_job_env(const ch_job_t *job);
const char *ch_job_name(const ch_job_t *job);
ch_config_t *ch_job_config(const ch_job_t *job);
ch_pg_t *ch_job_pg(const ch_job_t *job);        /* MPI group, host buffers */
ch_pg_t *ch_job_nccl(const ch_job_t *job);      /* NCCL group on GPU ranks, else NULL */
ch_compute_t *ch_job_compute(const ch_job_t *job); /* NULL without opt->compute */
int ch_job_on_gpu(const ch_job_t *job);         /* 1: every rank computes on its GPU */
ch_prof_t *ch_job_profiler(const ch_job_t *job);
const char *ch_job_output_dir(const ch_job_t *job); /* NULL without output_dir_key */
/* 1 after a collective of the runtime failed (a peer rank is gone; the
 * line saying so has been printed): no collective should follow, and
 * ch_job_finalize returns CH_EXIT_PEER_LOST. */
int ch_job_peer_lost(const ch_job_t *job);

#ifdef __cplusplus
}
#endif
#endif /* COHORT_JOB_H */
