/* cohort: cohort-farm's journal — the single source of truth of which task
 * attempts started and how they ended, durable across crashes and requeues.
 *
 * Layout: <dir>/journal/<host>-<pid>-<starttime>-<n>.log, one file per writer
 * (each slot supervisor of each run writes its own file, so no two processes
 * ever append to one file, which shared file systems such as NFS do not make
 * atomic). A file is append-only text:
 *
 *   #cohort-farm-journal 1 tasks=N checksum=HHHHHHHHHHHHHHHH taskfile=PATH *CRC
 *   S id attempt rank slot host sup_pid sup_start task_pid task_start start_ns *CRC
 *   E id attempt rank slot kind code start_ns end_ns out_bytes err_bytes *CRC
 *
 * (CRC: zlib crc32 of the line up to " *", 8 hex digits.) An S record is
 * written right after the task process was spawned, an E record after it
 * was reaped; each is one write(2) to an O_APPEND descriptor followed by
 * fdatasync(2) (the sync mode decides which). sup_start and task_start are
 * the processes' start times (clock ticks since boot, /proc/PID/stat field
 * 22), so that a pid reused by another process is not taken for the task.
 *
 * Reading (ch_journal_scan) merges every file: a header whose checksum or
 * task count differs from the task file's is an error naming the file; a
 * record with a bad CRC or bad fields, or one in the middle of a file that
 * lacks its newline, is an error naming FILE:LINE; the last line of a file
 * without its newline is a torn write (a writer killed mid-record, or a full
 * disk): it is reported (FILE:LINE, as a warning through *torn) and ignored,
 * and nothing else in the file is lost.
 */
#ifndef COHORT_FARM_JOURNAL_H
#define COHORT_FARM_JOURNAL_H

#include "framework/core/status.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* How an attempt ended. */
typedef enum {
    CH_END_EXIT = 0,        /* exited; code = exit status (0 = success) */
    CH_END_SIGNAL = 1,      /* killed by a signal it did not get from the farm; code = signal */
    CH_END_TIMEOUT = 2,     /* killed by the farm after farm.timeout; code = last signal sent */
    CH_END_INTERRUPTED = 3, /* stopped by preemption or a halt; re-run on resume, not a failure */
    CH_END_SPAWN_FAILED = 4,/* could not be started; code = errno */
    CH_END_KIND_COUNT_
} ch_end_kind;

/* "exit", "signal", "timeout", "interrupted", "spawn-failed". */
const char *ch_end_kind_name(int kind);

/* 1 when the attempt failed (counts toward farm.retries and the exit status). */
int ch_end_is_failure(int kind, int code);

#define CH_JOURNAL_HOST_MAX 64

typedef struct {
    int64_t id;
    int attempt;                     /* 1, 2, ... unique per task over all runs */
    int rank, slot;
    char host[CH_JOURNAL_HOST_MAX];  /* gethostname, no blanks */
    int64_t sup_pid;                 /* the slot supervisor that waits for the task */
    uint64_t sup_start;              /* its start time (ticks since boot) */
    int64_t task_pid;                /* the task's process (its process group leader) */
    uint64_t task_start;
    int64_t start_ns;                /* CLOCK_REALTIME, ns since the epoch */
} ch_journal_start_t;

typedef struct {
    int64_t id;
    int attempt;
    int rank, slot;
    int kind;                        /* ch_end_kind */
    int code;                        /* exit status, signal number or errno */
    int64_t start_ns, end_ns;        /* CLOCK_REALTIME */
    int64_t out_bytes, err_bytes;    /* captured stdout / stderr */
} ch_journal_end_t;

/* ---- writing */

/* Every mode survives a crash of the farm's own processes (records are
 * written before anyone is told); they differ in what an OS crash or power
 * loss can take: */
typedef enum {
    CH_JOURNAL_SYNC_ALL = 0,  /* fdatasync after every record, before going on */
    CH_JOURNAL_SYNC_END = 1,  /* only after E records (an S record is durable with the next E) */
    CH_JOURNAL_SYNC_NONE = 2, /* never */
    CH_JOURNAL_SYNC_BATCH = 3,/* a thread of the writer fdatasyncs pending records within
                                 CH_JOURNAL_BATCH_MS, off the writer's path: an OS
                                 crash loses at most that much (those tasks run again) */
} ch_journal_sync;

#define CH_JOURNAL_BATCH_MS 20

typedef struct ch_journal ch_journal_t;

/* Create this process's journal file under <dir>/journal/ (the directory is
 * made if missing), write and sync its header and the directory entry.
 * Errors: CH_ERR_IO naming the path and strerror; CH_ERR_NOMEM. */
ch_status ch_journal_open(const char *dir, uint64_t checksum, int64_t n_tasks,
                          const char *taskfile, ch_journal_sync sync, ch_journal_t **out);

/* Append one record (one write, then fdatasync per the sync mode).
 * CH_ERR_IO naming the file on a failed or short write or sync. */
ch_status ch_journal_write_start(ch_journal_t *j, const ch_journal_start_t *r);
ch_status ch_journal_write_end(ch_journal_t *j, const ch_journal_end_t *r);

/* Path of the file. */
const char *ch_journal_path(const ch_journal_t *j);

/* Close (in batch mode: a last fdatasync of pending records first). NULL is
 * a no-op. */
void ch_journal_close(ch_journal_t *j);

/* ---- reading */

/* Per-task summary over every file. */
typedef struct {
    int attempts;              /* highest attempt number started (0: never started) */
    int failures;              /* ended attempts with ch_end_is_failure */
    int interrupted;           /* ended attempts of kind CH_END_INTERRUPTED */
    int done;                  /* 1: some attempt exited 0 */
    int open;                  /* 1: attempt `attempts` started and has no E record */
    int has_end;               /* 1: last_end is set */
    ch_journal_end_t last_end; /* E record of the highest ended attempt */
    ch_journal_start_t last_start; /* S record of the highest attempt (attempts > 0) */
} ch_journal_task_t;

typedef struct {
    int64_t n_tasks;
    ch_journal_task_t *tasks;   /* n_tasks entries */
    ch_journal_start_t *starts; /* every S record, file order per file */
    int64_t n_starts;
    ch_journal_end_t *ends;     /* every E record */
    int64_t n_ends;
    int n_files;
    char *torn;                 /* NULL, or "FILE:LINE: ..." lines about torn records */
} ch_journal_state_t;

/* Read every journal file under <dir>/journal/ (none: an empty state, not an
 * error). Errors: CH_ERR_FORMAT (another task list, corrupt record: names
 * FILE:LINE), CH_ERR_IO, CH_ERR_NOMEM. */
ch_status ch_journal_scan(const char *dir, uint64_t checksum, int64_t n_tasks,
                          ch_journal_state_t **out);

void ch_journal_state_destroy(ch_journal_state_t *st);

/* Start time of process pid (ticks since boot, /proc/PID/stat field 22), or
 * 0 when there is no such process. */
uint64_t ch_proc_start_time(int64_t pid);

#ifdef __cplusplus
}
#endif
#endif /* COHORT_FARM_JOURNAL_H */
