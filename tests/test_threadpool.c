/* Tests for framework/threadpool. Single process. */
#include "config.h"

#include "tests/harness.h"

#include "framework/core/status.h"
#include "framework/core/threadpool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static ch_status job_add(void *arg)
{
    atomic_fetch_add((atomic_long *)arg, 1);
    return CH_OK;
}

static void run_many(int workers, long n)
{
    ch_threadpool_t *pool = NULL;
    atomic_long counter = 0;
    assert_ch_ok(ch_threadpool_create(workers, &pool));
    assert_int_equal(ch_threadpool_size(pool), workers);
    for (long i = 0; i < n; i++) assert_ch_ok(ch_threadpool_submit(pool, job_add, &counter));
    assert_ch_ok(ch_threadpool_wait_all(pool));
    assert_int_equal(atomic_load(&counter), n);
    /* Reusable after a wait. */
    for (long i = 0; i < n; i++) assert_ch_ok(ch_threadpool_submit(pool, job_add, &counter));
    assert_ch_ok(ch_threadpool_wait_all(pool));
    assert_int_equal(atomic_load(&counter), 2 * n);
    ch_threadpool_destroy(pool);
}

static void test_many_jobs_one_worker(void **state) { run_many(1, 20000); }
static void test_many_jobs_n_workers(void **state) { run_many(4, 20000); }
static void test_many_jobs_more_workers_than_cores(void **state) { run_many(16, 5000); }

/* With one worker, jobs run in submission order. */
typedef struct {
    int order[500];
    int n;
} order_t;
typedef struct {
    order_t *o;
    int id;
} order_job_t;

static ch_status job_record(void *arg)
{
    order_job_t *j = arg;
    j->o->order[j->o->n++] = j->id; /* one worker: no race */
    return CH_OK;
}

static void test_fifo_order_one_worker(void **state)
{
    ch_threadpool_t *pool = NULL;
    static order_t o;
    static order_job_t jobs[500];
    o.n = 0;
    assert_ch_ok(ch_threadpool_create(1, &pool));
    for (int i = 0; i < 500; i++) {
        jobs[i] = (order_job_t){&o, i};
        assert_ch_ok(ch_threadpool_submit(pool, job_record, &jobs[i]));
    }
    assert_ch_ok(ch_threadpool_wait_all(pool));
    assert_int_equal(o.n, 500);
    for (int i = 0; i < 500; i++) assert_int_equal(o.order[i], i);
    ch_threadpool_destroy(pool);
}

/* Jobs run on several threads at once: 4 jobs each wait until all 4 started. */
static atomic_int started;
static ch_status job_rendezvous(void *arg)
{
    (void)arg;
    atomic_fetch_add(&started, 1);
    for (int i = 0; i < 5000 && atomic_load(&started) < 4; i++) sleep_ms(1);
    if (atomic_load(&started) < 4)
        return CH_ERROR(CH_ERR_INTERNAL, "only %d of 4 jobs ran concurrently",
                        atomic_load(&started));
    return CH_OK;
}

static void test_workers_run_concurrently(void **state)
{
    ch_threadpool_t *pool = NULL;
    atomic_store(&started, 0);
    assert_ch_ok(ch_threadpool_create(4, &pool));
    for (int i = 0; i < 4; i++) assert_ch_ok(ch_threadpool_submit(pool, job_rendezvous, NULL));
    assert_ch_ok(ch_threadpool_wait_all(pool));
    ch_threadpool_destroy(pool);
}

static ch_status job_fail_if_odd(void *arg)
{
    long v = (long)(intptr_t)arg;
    if (v % 2) {
        sleep_ms(1);
        return CH_ERROR(CH_ERR_FORMAT, "bad record %ld in 'train.idx'", v);
    }
    return CH_OK;
}

static void test_error_propagates_to_wait_all(void **state)
{
    ch_threadpool_t *pool = NULL;
    assert_ch_ok(ch_threadpool_create(1, &pool));
    for (long i = 0; i < 10; i++)
        assert_ch_ok(ch_threadpool_submit(pool, job_fail_if_odd, (void *)(intptr_t)i));
    ch_error_clear();
    /* One worker runs in order: the first failure is record 1. */
    assert_ch_error(ch_threadpool_wait_all(pool), CH_ERR_FORMAT, "bad record 1 in 'train.idx'");
    /* the worker's message whole (users see no source location) */
    assert_string_equal(ch_error_message(), "bad record 1 in 'train.idx'");
    assert_int_equal(ch_error_code(), CH_ERR_FORMAT);
    /* The failure is cleared once reported. */
    assert_ch_ok(ch_threadpool_submit(pool, job_fail_if_odd, (void *)(intptr_t)2));
    assert_ch_ok(ch_threadpool_wait_all(pool));
    ch_threadpool_destroy(pool);
}

static void test_error_with_n_workers_is_one_of_them(void **state)
{
    ch_threadpool_t *pool = NULL;
    assert_ch_ok(ch_threadpool_create(3, &pool));
    for (long i = 0; i < 200; i++)
        assert_ch_ok(ch_threadpool_submit(pool, job_fail_if_odd, (void *)(intptr_t)i));
    assert_ch_error(ch_threadpool_wait_all(pool), CH_ERR_FORMAT, "bad record ");
    long rec = -1;
    const char *p = strstr(ch_error_message(), "bad record ");
    assert_non_null(p);
    assert_int_equal(sscanf(p, "bad record %ld", &rec), 1);
    assert_true(rec % 2 == 1 && rec < 200);
    ch_threadpool_destroy(pool);
}

static ch_status job_fail_silently(void *arg)
{
    (void)arg;
    return CH_ERR_IO;
}

static void test_error_without_message(void **state)
{
    ch_threadpool_t *pool = NULL;
    assert_ch_ok(ch_threadpool_create(2, &pool));
    assert_ch_ok(ch_threadpool_submit(pool, job_fail_silently, NULL));
    assert_ch_error(ch_threadpool_wait_all(pool), CH_ERR_IO, "failed with CH_ERR_IO (no message)");
    ch_threadpool_destroy(pool);
}

/* Worker error messages do not leak from one job into the next. */
static ch_status job_set_error_then_succeed(void *arg)
{
    (void)arg;
    (void)CH_ERROR(CH_ERR_IO, "stale");
    return CH_OK;
}

static void test_stale_worker_message_not_reported(void **state)
{
    ch_threadpool_t *pool = NULL;
    assert_ch_ok(ch_threadpool_create(1, &pool));
    assert_ch_ok(ch_threadpool_submit(pool, job_set_error_then_succeed, NULL));
    assert_ch_ok(ch_threadpool_submit(pool, job_fail_silently, NULL));
    assert_ch_error(ch_threadpool_wait_all(pool), CH_ERR_IO, "(no message)");
    assert_null(strstr(ch_error_message(), "stale"));
    ch_threadpool_destroy(pool);
}

static void test_groups(void **state)
{
    ch_threadpool_t *pool = NULL, *pool2 = NULL;
    ch_threadpool_group_t *ga = NULL, *gb = NULL;
    atomic_long ca = 0, cb = 0;
    assert_ch_ok(ch_threadpool_create(3, &pool));
    assert_ch_ok(ch_threadpool_create(2, &pool2));
    assert_ch_ok(ch_threadpool_group_create(&ga));
    assert_ch_ok(ch_threadpool_group_create(&gb));
    for (int i = 0; i < 1000; i++) {
        assert_ch_ok(ch_threadpool_submit_group(pool, ga, job_add, &ca));
        assert_ch_ok(ch_threadpool_submit_group(i % 2 ? pool : pool2, gb, job_add, &cb));
    }
    assert_ch_ok(ch_threadpool_group_wait(ga));
    assert_int_equal(atomic_load(&ca), 1000);
    assert_int_equal(ch_threadpool_group_pending(ga), 0);
    assert_ch_ok(ch_threadpool_group_wait(gb));
    assert_int_equal(atomic_load(&cb), 1000);

    /* A group failure goes to its group only, not to wait_all. */
    assert_ch_ok(ch_threadpool_submit_group(pool, ga, job_fail_if_odd, (void *)(intptr_t)7));
    assert_ch_ok(ch_threadpool_submit_group(pool, gb, job_add, &cb));
    assert_ch_ok(ch_threadpool_wait_all(pool));
    assert_ch_ok(ch_threadpool_group_wait(gb));
    assert_ch_error(ch_threadpool_group_wait(ga), CH_ERR_FORMAT, "bad record 7");
    /* cleared after being reported; the group is reusable */
    assert_ch_ok(ch_threadpool_group_wait(ga));
    assert_ch_ok(ch_threadpool_submit_group(pool, ga, job_add, &ca));
    assert_ch_ok(ch_threadpool_group_wait(ga));
    assert_int_equal(atomic_load(&ca), 1001);

    ch_threadpool_group_destroy(ga);
    ch_threadpool_group_destroy(gb);
    ch_threadpool_destroy(pool);
    ch_threadpool_destroy(pool2);
}

/* A job that submits further jobs (fan-out from inside the pool). */
typedef struct {
    ch_threadpool_t *pool;
    atomic_long *counter;
} nest_t;

static ch_status job_spawn(void *arg)
{
    nest_t *n = arg;
    for (int i = 0; i < 10; i++) CH_TRY(ch_threadpool_submit(n->pool, job_add, n->counter));
    return CH_OK;
}

static void test_jobs_submit_jobs(void **state)
{
    ch_threadpool_t *pool = NULL;
    atomic_long counter = 0;
    assert_ch_ok(ch_threadpool_create(2, &pool));
    nest_t n = {pool, &counter};
    for (int i = 0; i < 50; i++) assert_ch_ok(ch_threadpool_submit(pool, job_spawn, &n));
    assert_ch_ok(ch_threadpool_wait_all(pool));
    assert_int_equal(atomic_load(&counter), 500);
    ch_threadpool_destroy(pool);
}

/* Destroy with queued jobs: the running job finishes, queued ones are dropped
 * and their group sees them finished with a "dropped" failure. */
static atomic_int gate_open, gate_entered;
static ch_status job_gate(void *arg)
{
    (void)arg;
    atomic_store(&gate_entered, 1);
    while (!atomic_load(&gate_open)) sleep_ms(1);
    return CH_OK;
}

static void *open_gate_later(void *arg)
{
    (void)arg;
    sleep_ms(300);
    atomic_store(&gate_open, 1);
    return NULL;
}

static void test_destroy_drops_queued_jobs(void **state)
{
    ch_threadpool_t *pool = NULL;
    ch_threadpool_group_t *g = NULL;
    atomic_long ran = 0;
    pthread_t opener;
    atomic_store(&gate_open, 0);
    atomic_store(&gate_entered, 0);
    assert_ch_ok(ch_threadpool_create(1, &pool));
    assert_ch_ok(ch_threadpool_group_create(&g));
    assert_ch_ok(ch_threadpool_submit(pool, job_gate, NULL));
    while (!atomic_load(&gate_entered)) sleep_ms(1);
    for (int i = 0; i < 100; i++) assert_ch_ok(ch_threadpool_submit_group(pool, g, job_add, &ran));
    /* also enough ungrouped jobs to make the ring grow past its first size */
    for (int i = 0; i < 200; i++) assert_ch_ok(ch_threadpool_submit(pool, job_add, &ran));
    assert_int_equal(ch_threadpool_group_pending(g), 100);
    pthread_create(&opener, NULL, open_gate_later, NULL);
    ch_threadpool_destroy(pool); /* blocks until the gate job returns */
    pthread_join(opener, NULL);
    assert_int_equal(atomic_load(&gate_open), 1);
    assert_int_equal(atomic_load(&ran), 0);
    assert_int_equal(ch_threadpool_group_pending(g), 0);
    assert_ch_error(ch_threadpool_group_wait(g), CH_ERR_INTERNAL, "dropped");
    ch_threadpool_group_destroy(g);
}

static void test_destroy_idle_and_null(void **state)
{
    ch_threadpool_t *pool = NULL;
    ch_threadpool_destroy(NULL);
    ch_threadpool_group_destroy(NULL);
    assert_ch_ok(ch_threadpool_create(8, &pool));
    ch_threadpool_destroy(pool);
    /* a pool that never got a job, waited on */
    assert_ch_ok(ch_threadpool_create(1, &pool));
    assert_ch_ok(ch_threadpool_wait_all(pool));
    ch_threadpool_destroy(pool);
}

static void test_invalid_arguments(void **state)
{
    ch_threadpool_t *pool = (ch_threadpool_t *)&pool;
    assert_ch_error(ch_threadpool_create(0, &pool), CH_ERR_INVALID, "n_workers = 0");
    assert_null(pool);
    assert_ch_error(ch_threadpool_create(-3, &pool), CH_ERR_INVALID, "n_workers = -3");
    assert_ch_error(ch_threadpool_create(CH_THREADPOOL_MAX_WORKERS + 1, &pool), CH_ERR_INVALID,
                    "expected 1..1024");
    assert_ch_error(ch_threadpool_create(1, NULL), CH_ERR_INVALID, "out is NULL");
    assert_ch_ok(ch_threadpool_create(1, &pool));
    assert_ch_error(ch_threadpool_submit(pool, NULL, NULL), CH_ERR_INVALID, "job function is NULL");
    assert_ch_error(ch_threadpool_submit(NULL, job_add, NULL), CH_ERR_INVALID, "pool is NULL");
    assert_ch_error(ch_threadpool_wait_all(NULL), CH_ERR_INVALID, "pool is NULL");
    assert_ch_error(ch_threadpool_group_wait(NULL), CH_ERR_INVALID, "group is NULL");
    assert_ch_error(ch_threadpool_group_create(NULL), CH_ERR_INVALID, "out is NULL");
    assert_int_equal(ch_threadpool_size(NULL), 0);
    ch_threadpool_destroy(pool);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_many_jobs_one_worker),
        cmocka_unit_test(test_many_jobs_n_workers),
        cmocka_unit_test(test_many_jobs_more_workers_than_cores),
        cmocka_unit_test(test_fifo_order_one_worker),
        cmocka_unit_test(test_workers_run_concurrently),
        cmocka_unit_test(test_error_propagates_to_wait_all),
        cmocka_unit_test(test_error_with_n_workers_is_one_of_them),
        cmocka_unit_test(test_error_without_message),
        cmocka_unit_test(test_stale_worker_message_not_reported),
        cmocka_unit_test(test_groups),
        cmocka_unit_test(test_jobs_submit_jobs),
        cmocka_unit_test(test_destroy_drops_queued_jobs),
        cmocka_unit_test(test_destroy_idle_and_null),
        cmocka_unit_test(test_invalid_arguments),
    };
    return ch_test_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
