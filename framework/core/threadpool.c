/* cohort: fixed-size thread pool with a FIFO job queue (see threadpool.h). */
#include "config.h"

#include "framework/core/threadpool.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* First failure of a set of jobs: code and a copy of the worker's message. */
typedef struct {
    ch_status code;
    char message[CH_ERROR_MAX];
} failure_t;

static void failure_record(failure_t *f, ch_status code, const char *message)
{
    if (f->code != CH_OK) return;
    f->code = code;
    snprintf(f->message, sizeof f->message, "%s", message);
}

/* Hand a recorded failure to the calling thread and clear it. */
static ch_status failure_take(failure_t *f)
{
    ch_status s = f->code;
    if (s == CH_OK) return CH_OK;
    f->code = CH_OK;
    return ch_error_adopt(s, f->message);
}

struct ch_threadpool_group {
    pthread_mutex_t lock;
    pthread_cond_t done;
    size_t pending;
    failure_t failure;
};

typedef struct {
    ch_threadpool_fn fn;
    void *arg;
    ch_threadpool_group_t *group;
} job_t;

struct ch_threadpool {
    pthread_mutex_t lock;
    pthread_cond_t work;  /* signalled when a job is queued or on stop */
    pthread_cond_t idle;  /* broadcast when queue empty and nothing running */
    job_t *ring;          /* queue: ring[(head + i) % cap], i < count */
    size_t cap, head, count;
    size_t running;
    int stop;
    failure_t failure;    /* first failure among ungrouped jobs */
    int n_workers;        /* threads actually started */
    pthread_t *threads;
};

/* ---------------------------------------------------------------- groups */

ch_status ch_threadpool_group_create(ch_threadpool_group_t **out)
{
    CH_REQUIRE(out != NULL, "ch_threadpool_group_create: out is NULL");
    *out = NULL;
    ch_threadpool_group_t *g = calloc(1, sizeof *g);
    if (!g) return CH_ERROR(CH_ERR_NOMEM, "thread pool group: out of memory");
    pthread_mutex_init(&g->lock, NULL);
    pthread_cond_init(&g->done, NULL);
    *out = g;
    return CH_OK;
}

static void group_add(ch_threadpool_group_t *g)
{
    pthread_mutex_lock(&g->lock);
    g->pending++;
    pthread_mutex_unlock(&g->lock);
}

/* Mark one member finished. The broadcast happens under the lock so that a
 * waiter that then destroys the group cannot race with it; after unlocking,
 * g is not touched again. */
static void group_finish(ch_threadpool_group_t *g, ch_status s, const char *message)
{
    pthread_mutex_lock(&g->lock);
    if (s != CH_OK) failure_record(&g->failure, s, message);
    g->pending--;
    if (g->pending == 0) pthread_cond_broadcast(&g->done);
    pthread_mutex_unlock(&g->lock);
}

ch_status ch_threadpool_group_wait(ch_threadpool_group_t *g)
{
    CH_REQUIRE(g != NULL, "ch_threadpool_group_wait: group is NULL");
    pthread_mutex_lock(&g->lock);
    while (g->pending > 0) pthread_cond_wait(&g->done, &g->lock);
    ch_status s = failure_take(&g->failure);
    pthread_mutex_unlock(&g->lock);
    return s;
}

size_t ch_threadpool_group_pending(ch_threadpool_group_t *g)
{
    if (!g) return 0;
    pthread_mutex_lock(&g->lock);
    size_t n = g->pending;
    pthread_mutex_unlock(&g->lock);
    return n;
}

void ch_threadpool_group_destroy(ch_threadpool_group_t *g)
{
    if (!g) return;
    pthread_mutex_lock(&g->lock);
    while (g->pending > 0) pthread_cond_wait(&g->done, &g->lock);
    pthread_mutex_unlock(&g->lock);
    pthread_cond_destroy(&g->done);
    pthread_mutex_destroy(&g->lock);
    free(g);
}

/* ---------------------------------------------------------------- workers */

static void *worker_main(void *arg)
{
    ch_threadpool_t *p = arg;
    char fallback[128];

    pthread_mutex_lock(&p->lock);
    for (;;) {
        while (p->count == 0 && !p->stop) pthread_cond_wait(&p->work, &p->lock);
        if (p->stop) break; /* queued jobs are dropped by destroy */
        job_t job = p->ring[p->head];
        p->head = (p->head + 1) % p->cap;
        p->count--;
        p->running++;
        pthread_mutex_unlock(&p->lock);

        ch_error_clear();
        ch_status s = job.fn(job.arg);
        const char *message = NULL;
        if (s != CH_OK) {
            message = ch_error_message();
            if (!message[0]) {
                snprintf(fallback, sizeof fallback,
                         "thread pool job failed with %s (no message)", ch_status_name(s));
                message = fallback;
            }
        }
        if (job.group) group_finish(job.group, s, message);

        pthread_mutex_lock(&p->lock);
        if (s != CH_OK && !job.group) failure_record(&p->failure, s, message);
        p->running--;
        if (p->count == 0 && p->running == 0) pthread_cond_broadcast(&p->idle);
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

/* ---------------------------------------------------------------- pool */

static void pool_stop_and_free(ch_threadpool_t *p)
{
    pthread_mutex_lock(&p->lock);
    p->stop = 1;
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->lock);
    for (int i = 0; i < p->n_workers; i++) pthread_join(p->threads[i], NULL);

    /* Every worker has exited: account for the jobs that never started. */
    for (size_t i = 0; i < p->count; i++) {
        job_t *j = &p->ring[(p->head + i) % p->cap];
        if (j->group)
            group_finish(j->group, CH_ERR_INTERNAL,
                         "thread pool job dropped: the pool was destroyed before it started");
    }
    pthread_cond_destroy(&p->idle);
    pthread_cond_destroy(&p->work);
    pthread_mutex_destroy(&p->lock);
    free(p->ring);
    free(p->threads);
    free(p);
}

ch_status ch_threadpool_create(int n_workers, ch_threadpool_t **out)
{
    CH_REQUIRE(out != NULL, "ch_threadpool_create: out is NULL");
    *out = NULL;
    if (n_workers < 1 || n_workers > CH_THREADPOOL_MAX_WORKERS)
        return CH_ERROR(CH_ERR_INVALID, "thread pool: n_workers = %d, expected 1..%d",
                        n_workers, CH_THREADPOOL_MAX_WORKERS);

    ch_threadpool_t *p = calloc(1, sizeof *p);
    if (!p) return CH_ERROR(CH_ERR_NOMEM, "thread pool: out of memory");
    p->cap = 64;
    p->ring = malloc(p->cap * sizeof *p->ring);
    p->threads = malloc((size_t)n_workers * sizeof *p->threads);
    if (!p->ring || !p->threads) {
        free(p->ring);
        free(p->threads);
        free(p);
        return CH_ERROR(CH_ERR_NOMEM, "thread pool: out of memory for %d workers", n_workers);
    }
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->work, NULL);
    pthread_cond_init(&p->idle, NULL);

    /* Workers inherit a mask blocking every signal that can be blocked. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    int err = 0;
    for (int i = 0; i < n_workers; i++) {
        err = pthread_create(&p->threads[i], NULL, worker_main, p);
        if (err) break;
        p->n_workers++;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);

    if (err) {
        int started = p->n_workers;
        pool_stop_and_free(p);
        return CH_ERROR(CH_ERR_INTERNAL,
                        "thread pool: pthread_create failed for worker %d of %d: %s",
                        started, n_workers, strerror(err));
    }
    *out = p;
    return CH_OK;
}

int ch_threadpool_size(const ch_threadpool_t *pool)
{
    return pool ? pool->n_workers : 0;
}

/* Append a job; grows the ring when full. Caller holds p->lock. */
static ch_status enqueue_locked(ch_threadpool_t *p, job_t job)
{
    if (p->count == p->cap) {
        size_t ncap = p->cap * 2;
        job_t *nring = malloc(ncap * sizeof *nring);
        if (!nring)
            return CH_ERROR(CH_ERR_NOMEM, "thread pool: cannot grow queue to %zu jobs", ncap);
        for (size_t i = 0; i < p->count; i++) nring[i] = p->ring[(p->head + i) % p->cap];
        free(p->ring);
        p->ring = nring;
        p->cap = ncap;
        p->head = 0;
    }
    p->ring[(p->head + p->count) % p->cap] = job;
    p->count++;
    pthread_cond_signal(&p->work);
    return CH_OK;
}

ch_status ch_threadpool_submit_group(ch_threadpool_t *pool, ch_threadpool_group_t *g,
                                     ch_threadpool_fn fn, void *arg)
{
    CH_REQUIRE(pool != NULL, "ch_threadpool_submit: pool is NULL");
    CH_REQUIRE(fn != NULL, "ch_threadpool_submit: job function is NULL");
    /* Count the job in its group before any worker can finish it. */
    if (g) group_add(g);
    pthread_mutex_lock(&pool->lock);
    ch_status s = enqueue_locked(pool, (job_t){fn, arg, g});
    pthread_mutex_unlock(&pool->lock);
    if (s != CH_OK && g) {
        pthread_mutex_lock(&g->lock);
        g->pending--;
        if (g->pending == 0) pthread_cond_broadcast(&g->done);
        pthread_mutex_unlock(&g->lock);
    }
    return s;
}

ch_status ch_threadpool_submit(ch_threadpool_t *pool, ch_threadpool_fn fn, void *arg)
{
    return ch_threadpool_submit_group(pool, NULL, fn, arg);
}

ch_status ch_threadpool_wait_all(ch_threadpool_t *pool)
{
    CH_REQUIRE(pool != NULL, "ch_threadpool_wait_all: pool is NULL");
    pthread_mutex_lock(&pool->lock);
    while (pool->count > 0 || pool->running > 0) pthread_cond_wait(&pool->idle, &pool->lock);
    ch_status s = failure_take(&pool->failure);
    pthread_mutex_unlock(&pool->lock);
    return s;
}

void ch_threadpool_destroy(ch_threadpool_t *pool)
{
    if (pool) pool_stop_and_free(pool);
}
