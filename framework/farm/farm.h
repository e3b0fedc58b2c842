/* cohort: a task farm over the ranks of one MPI job (cohort-farm's engine),
 * exactly once across crashes and requeues.
 *
 * Roles. Rank 0 dispatches: it keeps every task's state, hands tasks to the
 * free slots of any rank (its own included) as slots free up (dynamic load
 * balancing), applies retries, timeouts, barriers, halt rules and the
 * preemption stop, and writes the status table. Every rank runs tasks in
 * `slots` slot supervisors (framework/farm/supervisor.h): each slot is a
 * small process forked at setup that spawns one task at a time, notices its
 * end at once (pidfd + poll, no timer), records it in the journal
 * (framework/farm/journal.h) and tells its rank through a pipe.
 *
 * Transport. MPI carries the setup and the final summary; during the
 * dispatch rank 0 and each worker rank talk over one TCP stream (rank 0
 * listens on a port of its host, loopback when every rank is there; the
 * address, port and a random secret each worker must send first are told
 * by MPI_Bcast, and a connection without the secret is refused), because
 * a blocking MPI receive spins a core in MPICH (ch4) and Open MPI, which on
 * a node full of tasks takes the core from them (measured: 60 tasks/s of
 * `true` with blocking MPI receives against 700 by bare posix_spawn on our
 * 2-core VM). So every rank is one thread blocked in poll(2) on its
 * supervisors' pipes and its stream(s): a finished task wakes it at once,
 * idle ranks use no CPU. Rank 0 also wakes once a second (stop requests,
 * retry backoff, grace time), the only timer. Any MPI thread level works.
 *
 * Exactly once. The journal is the only truth. On resume, rank 0 reads it:
 * a task with an exit-0 attempt is skipped; an attempt that has a start and
 * no end record ("open") was running when the farm's processes died: the
 * ranks on its host check whether its supervisor or its process is still
 * alive (pid and start time), and wait for it to end (pidfd) before any
 * task is dispatched, then rank 0 reads the journal again; an open attempt
 * whose processes are gone without an end record (the host crashed, or the
 * supervisor was killed too) is run again: its effects may be partial, as
 * with any crash. An open attempt on a host that is not part of this run
 * cannot be checked and is assumed gone (under Slurm, a requeued job's
 * processes are all killed before it runs again). Attempts ended by
 * preemption are "interrupted" and run again; failed attempts count toward
 * farm.retries; tasks that failed for good in an earlier run are not run
 * again unless resume_failed.
 *
 * A rank that dies: MPICH (and any MPI without fault tolerance) ends the
 * whole job, so the farm ends too, but every slot supervisor outlives its
 * rank, finishes and records its running task, then exits; the next run
 * (--resume, or the requeue) runs only what has not ended. No rank hangs:
 * mpiexec / srun kill the surviving ranks.
 */
#ifndef COHORT_FARM_H
#define COHORT_FARM_H

#include "framework/core/configuration.h"
#include "framework/core/status.h"
#include "framework/farm/journal.h"
#include "framework/farm/supervisor.h"
#include "framework/farm/taskfile.h"

#include <mpi.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    const ch_taskfile_t *tasks; /* every rank loads the same task file */
    const char *dir;            /* run directory (every rank sees it): journal/, out/, status.tsv */
    int slots_per_rank;         /* tasks run at once per rank; 0: the rank's cores / cores_per_task */
    int cores_per_task;         /* >= 1 */
    int bind;                   /* 1: bind each slot to its cores when the rank has several */
    int ignore_signal;          /* SIGUSR1/SIGUSR2 tasks start with ignored (the warning
                                   signal srun passes to every process), 0: none */
    int prefetch;               /* tasks queued at each slot behind its running one
                                   (0..CH_SUP_QUEUE): the next starts without a round
                                   trip to rank 0; only once every slot is busy, and
                                   taken back for a slot that asks for work while it
                                   still waits behind a running task (docs/farm.md);
                                   handed back at a halt or stop */
    ch_farm_output output;
    ch_journal_sync sync;
    int retries;                /* extra attempts after a failed one (>= 0) */
    double retry_backoff;       /* s before retry k: backoff * 2^(k-1), at most 300 s */
    double timeout;             /* s per attempt, 0: none */
    double timeout_median;      /* > 0: also kill after this multiple of the median
                                   duration of the successful attempts (after 5) */
    double kill_after;          /* s from SIGTERM to SIGKILL */
    int halt_after;             /* stop after this many tasks failed for good (0: never) */
    double halt_fraction;       /* stop when failed/ended >= this, after 10 ended (0: off) */
    int halt_now;               /* 1: a halt kills running tasks; 0: lets them finish */
    double preempt_grace;       /* s running tasks may finish after a stop request */
    int resume;                 /* 0: a previous journal in dir is an error */
    int resume_failed;          /* 1: re-run tasks that failed for good earlier */
    /* Rank 0 only, called from the thread that called ch_farm_run: */
    int (*should_stop)(void *arg); /* nonzero: stop (preemption); checked every tick */
    void (*progress)(void *arg, int64_t ended, int64_t total, const char *text);
    void *cb_arg;
} ch_farm_options_t;

/* Defaults: 1 core per task, bind, prefetch 1, files, sync batch, no retries, backoff
 * 1 s, no timeout, kill_after 5 s, no halt, grace 60 s. */
void ch_farm_options_default(ch_farm_options_t *o);

/* The farm's config keys (a job lists them as its "farm" table; --help
 * groups them under "farm"):
 *   farm.tasks            string, the task file (required)
 *   farm.dir              string, the run directory (default farm-run)
 *   farm.slots_per_rank, farm.cores_per_task, farm.prefetch, farm.bind,
 *   farm.output (files | merged | none), farm.journal_sync (batch | all |
 *   end | none), farm.retries, farm.retry_backoff (s), farm.timeout (s),
 *   farm.timeout_median, farm.kill_after (s), farm.halt_after,
 *   farm.halt_fraction, farm.halt_mode (soon | now), farm.grace (s),
 *   farm.resume, farm.resume_failed: the fields of ch_farm_options_t above
 *   (defaults: ch_farm_options_default; ranges and help text in the table).
 */
ch_config_table_t ch_farm_config_table(void);

/* Options from those keys (PETSc's set-from-options): *o gets the defaults,
 * then every farm.* key but farm.tasks and farm.dir, which name files the
 * job opens (it loads the task file and sets o->tasks; the run directory is
 * its output directory, o->dir). o->ignore_signal and the callbacks stay 0.
 * cfg must have been loaded with ch_farm_config_table among its tables.
 * Errors: CH_ERR_CONFIG (a choice key with another value, naming the key,
 * value and the accepted ones), CH_ERR_INVALID (a key missing from cfg's
 * tables). */
ch_status ch_farm_options_from_config(const ch_config_t *cfg, ch_farm_options_t *o);

enum { CH_FARM_FINISHED = 0, CH_FARM_PREEMPTED = 1, CH_FARM_HALTED = 2 };

#define CH_FARM_SLOWEST 5
typedef struct {
    int64_t total;        /* tasks in the task file */
    int64_t done;         /* ended with exit 0 (this run or before) */
    int64_t failed;       /* failed for good (this run or before, not re-run) */
    int64_t skipped;      /* done before this run (included in done) */
    int64_t not_run;      /* not run: stopped or halted before their turn */
    int64_t attempts;     /* attempts started in this run */
    int64_t retried;      /* attempts in this run that were retries */
    int64_t timed_out;    /* attempts in this run killed by the timeout */
    int64_t interrupted;  /* attempts in this run stopped by preemption or halt */
    int64_t spawn_failed; /* attempts in this run that could not start (spawn-failed) */
    int64_t waited;       /* attempts of an earlier run still running at start, waited for */
    int64_t rerun_lost;   /* open attempts of an earlier run whose processes were gone */
    int stop;             /* CH_FARM_FINISHED / _PREEMPTED / _HALTED */
    int world_size, slots_per_rank;
    double seconds;       /* wall time of the dispatch */
    int64_t exit_codes[257]; /* attempts ending with exit status c (256: killed by a
                                signal, not by the timeout: see timed_out) */
    int64_t slowest_id[CH_FARM_SLOWEST];
    double slowest_s[CH_FARM_SLOWEST];
} ch_farm_summary_t;

typedef struct ch_farm ch_farm_t;

/* Set up on every rank (collective over comm): reads the journal (rank 0), waits for attempts of an earlier run that are
 * still running, forks this rank's slot supervisors, connects the streams
 * to rank 0. Every rank returns the
 * same status; a failure's message (with the rank that failed) is the same
 * on every rank. Errors: CH_ERR_FORMAT (journal of another task list,
 * corrupt record: FILE:LINE), CH_ERR_CONFIG (a previous journal without
 * resume), CH_ERR_IO, CH_ERR_MPI, CH_ERR_NOMEM. */
ch_status ch_farm_create(const ch_farm_options_t *o, MPI_Comm comm, ch_farm_t **out);

/* Run the farm to its end (collective). *sum is filled on every rank.
 * Returns CH_OK when the dispatch ended normally (tasks may have failed:
 * see sum->failed), or an error (a supervisor died, MPI failed) after every
 * rank stopped. */
ch_status ch_farm_run(ch_farm_t *f, ch_farm_summary_t *sum);

/* Rank 0: write <dir>/status.tsv from the journal (atomically), one line per
 * attempt: id attempt rank slot host start end seconds status code
 * stdout_bytes stderr_bytes line command. Other ranks: no-op. */
ch_status ch_farm_write_status(ch_farm_t *f);

/* Rank 0: print the end-of-run summary (counts, exit codes, slowest tasks). */
void ch_farm_print_summary(const ch_farm_t *f, const ch_farm_summary_t *sum, FILE *out);

/* This rank's share of the CPUs (collective over comm): its affinity mask,
 * split into contiguous parts between the ranks of a node when they all
 * have the same mask (a launcher that did not bind). *cpus (malloc'd, the
 * caller frees) gets *n CPU numbers. Errors: CH_ERR_IO, CH_ERR_NOMEM. */
ch_status ch_farm_cpu_share(MPI_Comm comm, int **cpus, int *n);

/* Slots per rank chosen at create. */
int ch_farm_slots(const ch_farm_t *f);

/* Collective; stops the supervisors (each exits after its running task). */
void ch_farm_destroy(ch_farm_t *f);

#ifdef __cplusplus
}
#endif
#endif /* COHORT_FARM_H */
