/* cohort: a fixed-size thread pool with a FIFO job queue.
 *
 * A pool owns n worker threads created up front. Jobs are (function, argument)
 * pairs run in submission order (FIFO start order; with more than one worker
 * they may finish in any order). A job returns ch_status; the first failing
 * job's status and error message (the worker thread's ch_error_message()) are
 * kept and handed to whoever waits, through ch_error_adopt(), so the waiter
 * sees exactly the message the job set.
 *
 * Two ways to wait:
 *   - ch_threadpool_wait_all(): every job submitted so far, in any group, has
 *     finished; returns the first failure among jobs submitted WITHOUT a
 *     group since the previous wait_all.
 *   - a group (ch_threadpool_group_t, a counting latch): submit jobs with
 *     ch_threadpool_submit_group() and wait for just those with
 *     ch_threadpool_group_wait(); returns the first failure among them.
 *     Several groups may be in flight at once (e.g. one per batch slot of a
 *     data loader). A failure of a grouped job is reported only to its group.
 *
 *     ch_threadpool_t *pool;
 *     ch_threadpool_group_t *g;
 *     CH_TRY(ch_threadpool_create(4, &pool));
 *     CH_TRY(ch_threadpool_group_create(&g));
 *     for (i = 0; i < n; i++) CH_TRY(ch_threadpool_submit_group(pool, g, decode, &items[i]));
 *     ch_status s = ch_threadpool_group_wait(g);   // message of the first failure
 *     ch_threadpool_group_destroy(g);
 *     ch_threadpool_destroy(pool);
 *
 * Destroy DROPS jobs still queued (not yet started): it waits for the jobs
 * that are running, then joins every worker. Call ch_threadpool_wait_all()
 * (or wait on your groups) first if every job must run. Jobs that own their
 * argument must therefore not rely on running to free it.
 *
 * Memory: the queue is a ring buffer that grows (doubling) only when more
 * jobs are queued than ever before, so steady-state submission does not
 * allocate. Worker threads block all asynchronous signals so that signal
 * handlers (preemption) run on the application's own threads.
 *
 * Thread safety: submit, wait_all and the group functions may be called from
 * any thread, including from inside a job (a job may submit more jobs). A job
 * must not wait for jobs of its own pool when the pool has one worker, or
 * for a group containing itself: that deadlocks.
 */
#ifndef COHORT_THREADPOOL_H
#define COHORT_THREADPOOL_H

#include "framework/core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ch_threadpool ch_threadpool_t;
typedef struct ch_threadpool_group ch_threadpool_group_t;

/* A job: returns CH_OK or a failure set with CH_ERROR (its message is what the
 * waiter gets). A job returning a failure without a message is reported as
 * "thread pool job failed with <CODE> (no message)". */
typedef ch_status (*ch_threadpool_fn)(void *arg);

/* Most worker threads one pool may have. */
#define CH_THREADPOOL_MAX_WORKERS 1024

/* Create a pool with n_workers threads (1 <= n_workers <=
 * CH_THREADPOOL_MAX_WORKERS) and store it in *out.
 * Errors: CH_ERR_INVALID (n_workers out of range, out NULL), CH_ERR_NOMEM,
 * CH_ERR_INTERNAL (pthread_create failed; message has strerror). On error
 * nothing is left running and *out is NULL. */
ch_status ch_threadpool_create(int n_workers, ch_threadpool_t **out);

/* Number of worker threads of pool. */
int ch_threadpool_size(const ch_threadpool_t *pool);

/* Queue fn(arg) (not in any group). Errors: CH_ERR_INVALID (NULL pool/fn),
 * CH_ERR_NOMEM (queue could not grow). */
ch_status ch_threadpool_submit(ch_threadpool_t *pool, ch_threadpool_fn fn, void *arg);

/* Block until every job submitted so far (grouped or not) has finished and the
 * queue is empty. Returns CH_OK, or the status of the first failing ungrouped
 * job since the previous wait_all with its message adopted into the calling
 * thread; the recorded failure is then cleared. */
ch_status ch_threadpool_wait_all(ch_threadpool_t *pool);

/* Destroy: drop queued jobs that have not started, wait for running jobs,
 * join every worker, free the pool. Groups with dropped jobs have those jobs
 * counted as finished with CH_ERR_INTERNAL ("dropped"). NULL is a no-op.
 * Must not be called from inside one of the pool's jobs. */
void ch_threadpool_destroy(ch_threadpool_t *pool);

/* A group: counts its unfinished jobs and keeps its first failure. Reusable:
 * after ch_threadpool_group_wait returns, new jobs may be added.
 * Errors: CH_ERR_INVALID (out NULL), CH_ERR_NOMEM. */
ch_status ch_threadpool_group_create(ch_threadpool_group_t **out);

/* Queue fn(arg) as a member of group g (which may have jobs in several
 * pools). Errors as ch_threadpool_submit. */
ch_status ch_threadpool_submit_group(ch_threadpool_t *pool, ch_threadpool_group_t *g,
                                     ch_threadpool_fn fn, void *arg);

/* Block until every job of g has finished. Returns CH_OK or the first failing
 * member's status with its message adopted into the calling thread; the
 * group's failure record is then cleared. */
ch_status ch_threadpool_group_wait(ch_threadpool_group_t *g);

/* Number of g's jobs not yet finished (a snapshot). */
size_t ch_threadpool_group_pending(ch_threadpool_group_t *g);

/* Wait for g's unfinished jobs (ignoring their status), then free g. NULL is
 * a no-op. */
void ch_threadpool_group_destroy(ch_threadpool_group_t *g);

#ifdef __cplusplus
}
#endif
#endif /* COHORT_THREADPOOL_H */
