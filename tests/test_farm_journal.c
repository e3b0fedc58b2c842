/* Tests of cohort-farm's journal (framework/farm/journal.h). */
#include "tests/farm_testutil.h"

#include "framework/farm/journal.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

static char dir[512];

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "%s/tests/tmp-farm-journal-%d", ch_test_builddir(), (int)getpid());
    farm_rm_rf(dir);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    farm_rm_rf(dir);
    return 0;
}

static ch_journal_start_t start_rec(int64_t id, int attempt)
{
    ch_journal_start_t r = {.id = id, .attempt = attempt, .rank = 1, .slot = 2, .sup_pid = 100,
                            .sup_start = 5, .task_pid = 101, .task_start = 6,
                            .start_ns = 1000000000LL * id};
    snprintf(r.host, sizeof r.host, "node%d", (int)id);
    return r;
}

static ch_journal_end_t end_rec(int64_t id, int attempt, int kind, int code)
{
    ch_journal_end_t r = {.id = id, .attempt = attempt, .rank = 1, .slot = 2, .kind = kind,
                          .code = code, .start_ns = 1, .end_ns = 2, .out_bytes = 10 * id,
                          .err_bytes = 3};
    return r;
}

/* The one journal file under dir/journal (tests make exactly one). */
static void journal_file(char *path, size_t n)
{
    char jd[1024];
    snprintf(jd, sizeof jd, "%s/journal", dir);
    DIR *d = opendir(jd);
    assert_non_null(d);
    struct dirent *e;
    path[0] = 0;
    while ((e = readdir(d)))
        if (strstr(e->d_name, ".log")) snprintf(path, n, "%s/%s", jd, e->d_name);
    closedir(d);
    assert_true(path[0] != 0);
}

static void test_round_trip(void **state)
{
    (void)state;
    ch_journal_state_t *st;
    /* no journal yet: an empty state */
    assert_ch_ok(ch_journal_scan(dir, 42, 4, &st));
    assert_int_equal(st->n_files, 0);
    assert_int_equal(st->tasks[0].attempts, 0);
    ch_journal_state_destroy(st);

    ch_journal_t *j;
    assert_ch_ok(ch_journal_open(dir, 42, 4, "tasks.txt", CH_JOURNAL_SYNC_ALL, &j));
    ch_journal_start_t s0 = start_rec(0, 1), s1 = start_rec(1, 1), s1b = start_rec(1, 2),
                       s2 = start_rec(2, 1);
    assert_ch_ok(ch_journal_write_start(j, &s0));
    ch_journal_end_t e0 = end_rec(0, 1, CH_END_EXIT, 0);
    assert_ch_ok(ch_journal_write_end(j, &e0));
    assert_ch_ok(ch_journal_write_start(j, &s1));
    ch_journal_end_t e1 = end_rec(1, 1, CH_END_EXIT, 3);
    assert_ch_ok(ch_journal_write_end(j, &e1));
    assert_ch_ok(ch_journal_write_start(j, &s1b));
    ch_journal_end_t e1b = end_rec(1, 2, CH_END_TIMEOUT, 15);
    assert_ch_ok(ch_journal_write_end(j, &e1b));
    assert_ch_ok(ch_journal_write_start(j, &s2)); /* still running */
    ch_journal_close(j);
    /* a second writer (another slot) */
    assert_ch_ok(ch_journal_open(dir, 42, 4, "tasks.txt", CH_JOURNAL_SYNC_NONE, &j));
    ch_journal_start_t s3 = start_rec(3, 1);
    assert_ch_ok(ch_journal_write_start(j, &s3));
    ch_journal_end_t e3 = end_rec(3, 1, CH_END_INTERRUPTED, 15);
    assert_ch_ok(ch_journal_write_end(j, &e3));
    ch_journal_close(j);

    assert_ch_ok(ch_journal_scan(dir, 42, 4, &st));
    assert_int_equal(st->n_files, 2);
    assert_int_equal(st->n_starts, 5);
    assert_int_equal(st->n_ends, 4);
    assert_null(st->torn);
    const ch_journal_task_t *t = st->tasks;
    assert_true(t[0].done && !t[0].open && t[0].attempts == 1 && t[0].failures == 0);
    assert_int_equal(t[0].last_end.out_bytes, 0);
    assert_true(!t[1].done && !t[1].open && t[1].attempts == 2 && t[1].failures == 2);
    assert_int_equal(t[1].last_end.kind, CH_END_TIMEOUT);
    assert_int_equal(t[1].last_end.code, 15);
    assert_true(!t[2].done && t[2].open && t[2].attempts == 1);
    assert_string_equal(t[2].last_start.host, "node2");
    assert_int_equal(t[2].last_start.task_pid, 101);
    assert_int_equal(t[2].last_start.task_start, 6);
    assert_true(!t[3].done && !t[3].open && t[3].failures == 0 && t[3].interrupted == 1);
    ch_journal_state_destroy(st);
}

static void test_other_task_list(void **state)
{
    (void)state;
    ch_journal_t *j;
    assert_ch_ok(ch_journal_open(dir, 42, 4, "tasks.txt", CH_JOURNAL_SYNC_END, &j));
    ch_journal_close(j);
    ch_journal_state_t *st = NULL;
    assert_ch_error(ch_journal_scan(dir, 43, 4, &st), CH_ERR_FORMAT,
                    ":1: journal of another task list (4 tasks, checksum 000000000000002a, task "
                    "file tasks.txt)");
    assert_null(st);
    assert_ch_error(ch_journal_scan(dir, 42, 5, &st), CH_ERR_FORMAT, "this task file has 5 tasks");
}

static void append_raw(const char *path, const char *text)
{
    FILE *f = fopen(path, "a");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_torn_tail_is_kept_and_reported(void **state)
{
    (void)state;
    ch_journal_t *j;
    assert_ch_ok(ch_journal_open(dir, 7, 3, "t", CH_JOURNAL_SYNC_ALL, &j));
    ch_journal_start_t s0 = start_rec(0, 1);
    assert_ch_ok(ch_journal_write_start(j, &s0));
    ch_journal_end_t e0 = end_rec(0, 1, CH_END_EXIT, 0);
    assert_ch_ok(ch_journal_write_end(j, &e0));
    char path[2048];
    snprintf(path, sizeof path, "%s", ch_journal_path(j));
    ch_journal_close(j);
    append_raw(path, "E 1 1 0 0 0 0 5 6 0"); /* killed mid-record */
    ch_journal_state_t *st;
    assert_ch_ok(ch_journal_scan(dir, 7, 3, &st));
    assert_non_null(st->torn);
    char want[2400];
    snprintf(want, sizeof want, "%s:4: torn last record (19 bytes", path);
    if (!strstr(st->torn, want)) fail_msg("'%s' lacks '%s'", st->torn, (const char *)want);
    assert_true(st->tasks[0].done);  /* what was recorded before is kept */
    assert_false(st->tasks[1].done); /* the torn record does not count */
    assert_int_equal(st->n_ends, 1);
    ch_journal_state_destroy(st);
}

/* A new journal of 3 tasks (checksum 7) with no record yet; its path. */
static void empty_journal(char *path, size_t n)
{
    ch_journal_t *j;
    assert_ch_ok(ch_journal_open(dir, 7, 3, "t", CH_JOURNAL_SYNC_ALL, &j));
    snprintf(path, n, "%s", ch_journal_path(j));
    ch_journal_close(j);
}

static void test_corrupt_record(void **state)
{
    (void)state;
    ch_journal_t *j;
    char path[2048];
    empty_journal(path, sizeof path);
    append_raw(path, "E 1 1 0 0 0 0 5 6 0 0 *00000000\n");
    ch_journal_state_t *st = NULL;
    char want[2400];
    const char *wantp = want;
    snprintf(want, sizeof want, "%s:2: corrupt journal record (checksum", path);
    assert_ch_error(ch_journal_scan(dir, 7, 3, &st), CH_ERR_FORMAT, wantp);
    assert_null(st);
    /* a record with a valid checksum but a task id out of range */
    farm_rm_rf(dir);
    assert_ch_ok(ch_journal_open(dir, 7, 3, "t", CH_JOURNAL_SYNC_ALL, &j));
    ch_journal_start_t s = start_rec(9, 1);
    assert_ch_ok(ch_journal_write_start(j, &s));
    ch_journal_close(j);
    journal_file(path, sizeof path);
    snprintf(want, sizeof want, "%s:2: bad start record", path);
    assert_ch_error(ch_journal_scan(dir, 7, 3, &st), CH_ERR_FORMAT, wantp);
}

/* Append `body` as a record with its valid checksum (what journal.c writes). */
static void append_record(const char *path, const char *body)
{
    char line[512];
    unsigned long crc = crc32(0L, (const Bytef *)body, (uInt)strlen(body)) & 0xffffffffUL;
    snprintf(line, sizeof line, "%s *%08lx\n", body, crc);
    append_raw(path, line);
}

/* Numbers beyond their field's range (an int field of 2^32 + 1, a number
 * beyond long long, a kind out of range) are bad records, not truncated
 * (sscanf's %d on them was undefined behaviour). */
static void test_numbers_out_of_range(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "E 1 4294967297 0 0 0 0 5 6 0 0",             /* attempt beyond int */
        "E 1 1 0 0 0 99999999999 5 6 0 0",            /* code beyond int */
        "E 1 1 0 0 7 0 5 6 0 0",                      /* kind out of range */
        "E 1 1 0 0 0 0 99999999999999999999 6 0 0",   /* beyond long long */
        "S 1 1 0 0 host 1 -5 2 3 4",                  /* negative start time */
        "S 1 1 0 0 host 1 2 3 4",                     /* a field missing */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        farm_rm_rf(dir);
        char path[2048], want[2400];
        empty_journal(path, sizeof path);
        append_record(path, bad[i]);
        snprintf(want, sizeof want, "%s:2: bad %s record", path, bad[i][0] == 'S' ? "start" : "end");
        ch_journal_state_t *st = NULL;
        const char *wantp = want;
        assert_ch_error(ch_journal_scan(dir, 7, 3, &st), CH_ERR_FORMAT, wantp);
        assert_null(st);
    }
    /* the same records in range are read */
    farm_rm_rf(dir);
    char path[2048];
    empty_journal(path, sizeof path);
    append_record(path, "S 1 2147483647 0 0 host 1 18446744073709551615 3 4 5");
    append_record(path, "E 1 2147483647 0 0 0 -2147483648 5 6 0 0");
    ch_journal_state_t *st = NULL;
    assert_ch_ok(ch_journal_scan(dir, 7, 3, &st));
    assert_int_equal(st->n_starts, 1);
    assert_int_equal(st->starts[0].attempt, 2147483647);
    assert_true(st->starts[0].sup_start == 18446744073709551615ULL);
    assert_int_equal(st->n_ends, 1);
    assert_int_equal(st->ends[0].code, -2147483648);
    ch_journal_state_destroy(st);
}

static void test_batch_sync(void **state)
{
    (void)state;
    ch_journal_t *j;
    assert_ch_ok(ch_journal_open(dir, 9, 1000, "t", CH_JOURNAL_SYNC_BATCH, &j));
    for (int i = 0; i < 1000; i++) {
        ch_journal_start_t s = start_rec(i, 1);
        assert_ch_ok(ch_journal_write_start(j, &s));
        ch_journal_end_t e = end_rec(i, 1, CH_END_EXIT, 0);
        assert_ch_ok(ch_journal_write_end(j, &e));
    }
    /* written at once (a reader sees every record before the sync thread ran) */
    ch_journal_state_t *st;
    assert_ch_ok(ch_journal_scan(dir, 9, 1000, &st));
    assert_int_equal(st->n_ends, 1000);
    ch_journal_state_destroy(st);
    ch_journal_close(j); /* joins the sync thread after its last fdatasync */
    assert_ch_ok(ch_journal_scan(dir, 9, 1000, &st));
    for (int i = 0; i < 1000; i++) assert_true(st->tasks[i].done);
    ch_journal_state_destroy(st);
}

static void test_proc_start_time(void **state)
{
    (void)state;
    uint64_t me = ch_proc_start_time(getpid());
    assert_true(me > 0);
    assert_true(ch_proc_start_time(getpid()) == me);
    assert_true(ch_proc_start_time(999999999) == 0);
    assert_true(ch_end_is_failure(CH_END_EXIT, 1));
    assert_false(ch_end_is_failure(CH_END_EXIT, 0));
    assert_false(ch_end_is_failure(CH_END_INTERRUPTED, 15));
    assert_true(ch_end_is_failure(CH_END_TIMEOUT, 9));
    assert_string_equal(ch_end_kind_name(CH_END_SPAWN_FAILED), "spawn-failed");
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_round_trip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_other_task_list, setup, teardown),
        cmocka_unit_test_setup_teardown(test_torn_tail_is_kept_and_reported, setup, teardown),
        cmocka_unit_test_setup_teardown(test_corrupt_record, setup, teardown),
        cmocka_unit_test_setup_teardown(test_numbers_out_of_range, setup, teardown),
        cmocka_unit_test_setup_teardown(test_batch_sync, setup, teardown),
        cmocka_unit_test(test_proc_start_time),
    };
    return ch_test_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
