/* cohort: cohort-farm's slot supervisor — the small process that starts a
 * rank's tasks for one slot, waits for them, and records their ends in the
 * journal, so that a task's end is recorded even when the rank that asked
 * for it has died.
 *
 * ch_supervisor_spawn forks it from the rank (before the rank starts any
 * thread of its own). The child leaves the rank's session (setsid), closes
 * every inherited descriptor but its two pipes (so neither the MPI launcher
 * nor the rank's peers see it as part of the rank), sends its stdout to
 * /dev/null and its stderr to <dir>/supervisors.log, ignores SIGPIPE,
 * catches SIGTERM/SIGINT/SIGHUP/SIGUSR1/SIGUSR2 (a signal that reaches it
 * marks a task it then sees die of a signal as interrupted, not failed:
 * Slurm signals every process of a job step at preemption), optionally
 * binds itself (and so its tasks) to a CPU set, opens its own journal file,
 * and answers READY.
 *
 * Per task (RUN id attempt timeout): /bin/sh -c COMMAND through posix_spawn
 * in a new process group, stdin from /dev/null, stdout and stderr to
 * <dir>/out/<id/500>/<id>.out/.err (at most 1,000 files a folder), or, with
 * merged output, through pipes into <dir>/out/rank-<R>.log with each line
 * prefixed "<id>.<attempt> out| " / "err| " (one write per line, O_APPEND),
 * or to /dev/null; its cwd from the task file; its environment: the rank's,
 * without the MPI launcher's PMI_ / PMIX_ / OMPI_ / HYDRA_ variables (a task
 * is not a rank), plus the task file's ENV settings and COHORT_TASK_ID,
 * COHORT_TASK_ATTEMPT, COHORT_TASK_LINE, COHORT_RANK, COHORT_SLOT,
 * COHORT_FARM_DIR and, for REPEAT tasks, COHORT_REPEAT_INDEX. The S record is
 * written after the spawn, the end is noticed at once through a pidfd (a
 * SIGCHLD self-pipe where the kernel lacks pidfd_open, Linux < 5.3)
 * (poll(2), no timer), the E record is written after waitpid, then DONE is
 * sent. A timeout sends SIGTERM to the task's process group, then SIGKILL
 * kill_after seconds later. KILL (preemption, halt) does the same and
 * records the attempt as interrupted.
 *
 * Tasks start with ignore_signal ignored: srun passes the batch script's
 * warning signal to every process of the step, tasks included, and the farm
 * answers it for them (no new task starts; running ones get the grace time,
 * then SIGTERM).
 *
 * When its command pipe reaches end-of-file (the rank finished, or died),
 * the supervisor exits once its running task (if any) has ended and been
 * recorded.
 */
#ifndef COHORT_FARM_SUPERVISOR_H
#define COHORT_FARM_SUPERVISOR_H

#include "framework/core/status.h"
#include "framework/farm/journal.h"
#include "framework/farm/taskfile.h"

#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    CH_FARM_OUTPUT_FILES = 0,  /* out/<shard>/<id>.out and .err */
    CH_FARM_OUTPUT_MERGED = 1, /* out/rank-<R>.log, lines prefixed */
    CH_FARM_OUTPUT_NONE = 2,   /* /dev/null */
} ch_farm_output;

typedef struct {
    const ch_taskfile_t *tasks;
    const char *dir;         /* run directory */
    int rank, slot;
    ch_farm_output output;
    double kill_after;       /* seconds from SIGTERM to SIGKILL (>= 0) */
    ch_journal_sync sync;
    int ignore_signal;       /* a signal (SIGUSR1 or SIGUSR2) tasks start with ignored,
                                0: none (the warning signal: see below) */
    const int *cpus;         /* CPUs to bind to (n_cpus of them), NULL: no binding */
    int n_cpus;
} ch_supervisor_options_t;

/* RUNs a supervisor holds besides its running task: the next task starts
 * as soon as the running one has ended, without a round trip to rank 0. */
#define CH_SUP_QUEUE 4

/* Message from a supervisor to its rank. */
enum { CH_SUP_READY = 1, CH_SUP_DONE = 2, CH_SUP_ERROR = 3 };
typedef struct {
    int32_t type;
    int32_t attempt;
    int64_t id;
    int32_t started;         /* DONE: 0 for a queued RUN handed back by KILL (never started,
                                nothing recorded) */
    int32_t pad;
    ch_journal_end_t end;    /* DONE: the E record written */
    char error[192];         /* ERROR (also DONE when the journal write failed) */
} ch_sup_msg_t;

typedef struct ch_supervisor ch_supervisor_t;

/* Fork the supervisor and wait for READY. Errors: CH_ERR_IO (fork, pipe),
 * or the supervisor's own error (journal or output folder), naming the path. */
ch_status ch_supervisor_spawn(const ch_supervisor_options_t *o, ch_supervisor_t **out);

/* Ask it to run task id (attempt >= 1), killing it after timeout seconds
 * (0: no limit). While a task runs, up to CH_SUP_QUEUE more RUNs wait in
 * order. Errors: CH_ERR_IO when the supervisor is gone. */
ch_status ch_supervisor_run(ch_supervisor_t *s, int64_t id, int attempt, double timeout);

/* Ask it to stop its running task (recorded as interrupted) and hand back
 * its queued RUNs (DONE with started = 0). No-op when idle. */
ch_status ch_supervisor_interrupt(ch_supervisor_t *s);

/* Hand back its queued RUNs (DONE with started = 0, in order) and let the
 * running task go on: nothing queued starts after this (a halt, a stop).
 * No-op when nothing is queued. Errors: CH_ERR_IO when the supervisor is gone. */
ch_status ch_supervisor_drop_queued(ch_supervisor_t *s);

/* The descriptor that becomes readable when a message is waiting. */
int ch_supervisor_fd(const ch_supervisor_t *s);

/* Read one message (blocks until one arrives). CH_ERR_IO when the supervisor
 * died without answering (its pid and wait status in the message). */
ch_status ch_supervisor_read(ch_supervisor_t *s, ch_sup_msg_t *m);

pid_t ch_supervisor_pid(const ch_supervisor_t *s);

/* Close the command pipe (the supervisor exits after its running task) and
 * reap it (blocks until it has exited). NULL is a no-op. */
void ch_supervisor_close(ch_supervisor_t *s);

#ifdef __cplusplus
}
#endif
#endif /* COHORT_FARM_SUPERVISOR_H */
