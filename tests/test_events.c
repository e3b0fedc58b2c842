/* Tests for framework/events (TensorBoard event files) and framework/metrics
 * (scalars + CSV twin). The event files are re-read here by an independent
 * TFRecord/protobuf parser with a bitwise CRC32C, and by TensorBoard itself
 * (tests/golden/tensorboard_check.py) when the tensorboard package is
 * installed. */
#include "config.h"

#include "tests/harness.h"

#include "framework/train/events.h"
#include "framework/train/metrics.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char dir[512];

static void rm_rf(const char *path)
{
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    if (system(cmd) != 0) fail_msg("%s failed", cmd);
}

static int setup(void **state)
{
    snprintf(dir, sizeof dir, "%s/tests/tmp-events-%d", ch_test_builddir(), (int)getpid());
    rm_rf(dir);
    return 0;
}

static int teardown(void **state)
{
    rm_rf(dir);
    return 0;
}

/* ---------------------------------------------------------------- independent reader */

/* Bitwise CRC32C (no table), independent of the writer's. */
static uint32_t crc32c_bitwise(const unsigned char *p, size_t n)
{
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1)));
    }
    return c ^ 0xffffffffu;
}

static uint32_t unmask(uint32_t m)
{
    uint32_t r = m - 0xa282ead8u;
    return (r >> 17) | (r << 15);
}

typedef struct {
    double wall_time;
    int64_t step;
    char file_version[32];
    char tag[64];
    float value;
    int has_value, has_wall;
    int session_status; /* SessionLog.status, 0 when absent */
} event_t;

static uint64_t get_varint(const unsigned char *p, size_t n, size_t *pos)
{
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (*pos >= n) fail_msg("truncated varint");
        unsigned char b = p[(*pos)++];
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) return v;
    }
    fail_msg("varint too long");
    return 0;
}

/* Decode the fields of message p[0..n) into ev (Event, Summary, Value by depth). */
static void decode(const unsigned char *p, size_t n, event_t *ev, int depth)
{
    size_t pos = 0;
    while (pos < n) {
        uint64_t key = get_varint(p, n, &pos);
        unsigned field = (unsigned)(key >> 3), wt = (unsigned)(key & 7);
        if (wt == 0) {
            uint64_t v = get_varint(p, n, &pos);
            if (depth == 0 && field == 2) ev->step = (int64_t)v;
            else if (depth == 3 && field == 1) ev->session_status = (int)v;
            else fail_msg("unexpected varint field %u at depth %d", field, depth);
        } else if (wt == 1) {
            if (pos + 8 > n) fail_msg("truncated fixed64");
            if (depth == 0 && field == 1) {
                memcpy(&ev->wall_time, p + pos, 8);
                ev->has_wall = 1;
            } else fail_msg("unexpected fixed64 field %u", field);
            pos += 8;
        } else if (wt == 5) {
            if (pos + 4 > n) fail_msg("truncated fixed32");
            if (depth == 2 && field == 2) {
                memcpy(&ev->value, p + pos, 4);
                ev->has_value = 1;
            } else fail_msg("unexpected fixed32 field %u", field);
            pos += 4;
        } else if (wt == 2) {
            uint64_t len = get_varint(p, n, &pos);
            if (pos + len > n) fail_msg("truncated length-delimited field");
            if (depth == 0 && field == 3) {
                assert_true(len < sizeof ev->file_version);
                memcpy(ev->file_version, p + pos, len);
            } else if (depth == 0 && field == 7) {
                decode(p + pos, len, ev, 3); /* SessionLog */
            } else if (depth == 0 && field == 5) {
                decode(p + pos, len, ev, 1); /* Summary */
            } else if (depth == 1 && field == 1) {
                decode(p + pos, len, ev, 2); /* Summary.Value */
            } else if (depth == 2 && field == 1) {
                assert_true(len < sizeof ev->tag);
                memcpy(ev->tag, p + pos, len);
            } else fail_msg("unexpected field %u at depth %d", field, depth);
            pos += len;
        } else {
            fail_msg("unexpected wire type %u", wt);
        }
    }
}

/* Parse a whole event file; returns the number of events (at most max). */
static int read_events(const char *path, event_t *evs, int max)
{
    FILE *f = fopen(path, "rb");
    unsigned char *b;
    long size;
    size_t pos = 0;
    int n = 0;
    if (!f) fail_msg("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    size = ftell(f);
    fseek(f, 0, SEEK_SET);
    b = malloc((size_t)size + 1);
    assert_int_equal(fread(b, 1, (size_t)size, f), (size_t)size);
    fclose(f);
    while (pos < (size_t)size) {
        uint64_t len;
        uint32_t c;
        if (pos + 12 > (size_t)size) fail_msg("%s: torn record header at %zu", path, pos);
        memcpy(&len, b + pos, 8);
        memcpy(&c, b + pos + 8, 4);
        if (unmask(c) != crc32c_bitwise(b + pos, 8)) fail_msg("%s: bad length CRC at %zu", path, pos);
        pos += 12;
        if (pos + len + 4 > (size_t)size) fail_msg("%s: torn record at %zu", path, pos);
        memcpy(&c, b + pos + len, 4);
        if (unmask(c) != crc32c_bitwise(b + pos, len)) fail_msg("%s: bad data CRC at %zu", path, pos);
        if (n >= max) fail_msg("too many events");
        memset(&evs[n], 0, sizeof evs[n]);
        decode(b + pos, len, &evs[n], 0);
        n++;
        pos += len + 4;
    }
    free(b);
    return n;
}

/* ---------------------------------------------------------------- tests */

static void test_crc32c(void **state)
{
    unsigned char zeros[32] = {0}, ones[32], data[1000];
    memset(ones, 0xff, sizeof ones);
    assert_int_equal(ch_crc32c(0, "123456789", 9), 0xE3069283u); /* the standard check value */
    assert_int_equal(ch_crc32c(0, zeros, 32), 0x8A9136AAu);    /* RFC 3720 B.4 */
    assert_int_equal(ch_crc32c(0, ones, 32), 0x62A8AB43u);     /* RFC 3720 B.4 */
    assert_int_equal(ch_crc32c(0, "", 0), 0);
    for (size_t i = 0; i < sizeof data; i++) data[i] = (unsigned char)(i * 131 + 17);
    assert_int_equal(ch_crc32c(0, data, sizeof data), crc32c_bitwise(data, sizeof data));
    assert_int_equal(ch_crc32c(ch_crc32c(0, data, 300), data + 300, 700), ch_crc32c(0, data, sizeof data));
    assert_int_equal(unmask(ch_crc32c_mask(0x12345678u)), 0x12345678u);
}

static void test_event_file(void **state)
{
    ch_events_t *ev;
    event_t evs[16];
    char host[256], expect_prefix[600];
    const char *base;
    char logdir[600];
    int n;
    double before = ch_events_now();

    snprintf(logdir, sizeof logdir, "%s/a/b/tb", dir); /* parents are created */
    assert_ch_ok(ch_events_open(logdir, &ev));
    base = strrchr(ch_events_path(ev), '/') + 1;
    gethostname(host, sizeof host);
    snprintf(expect_prefix, sizeof expect_prefix, "events.out.tfevents.");
    assert_memory_equal(base, expect_prefix, strlen(expect_prefix));
    {
        /* events.out.tfevents.<10 digits>.<host>.<pid>.<n> */
        const char *t = base + strlen(expect_prefix);
        char tail[600];
        for (int i = 0; i < 10; i++) assert_true(t[i] >= '0' && t[i] <= '9');
        assert_int_equal(t[10], '.');
        snprintf(tail, sizeof tail, ".%s.%d.", host, (int)getpid());
        assert_memory_equal(t + 10, tail, strlen(tail));
        assert_true(llabs(atoll(t) - (long long)before) <= 2);
    }
    /* the version record is flushed at open */
    n = read_events(ch_events_path(ev), evs, 16);
    assert_int_equal(n, 1);
    assert_string_equal(evs[0].file_version, "brain.Event:2");
    assert_true(evs[0].wall_time >= before - 1 && evs[0].wall_time <= ch_events_now() + 1);

    assert_ch_ok(ch_events_add_scalar(ev, "loss", 2.5f, 0, 1700000000.25));
    assert_ch_ok(ch_events_add_scalar(ev, "loss", 0.1f, 1, 1700000100.5));
    assert_ch_ok(ch_events_add_scalar(ev, "train/accuracy", -INFINITY, -3, 1700000200.0));
    assert_ch_ok(ch_events_add_scalar(ev, "big_step", 1e-38f, 1234567890123456789LL, -1));
    assert_ch_error(ch_events_add_scalar(ev, "", 1, 0, -1), CH_ERR_INVALID, "empty scalar tag");
    assert_ch_ok(ch_events_add_session_start(ev, 7, 1700000300.0));
    assert_ch_ok(ch_events_flush(ev));
    n = read_events(ch_events_path(ev), evs, 16);
    assert_int_equal(n, 6);
    assert_int_equal(evs[5].session_status, 1); /* START */
    assert_int_equal(evs[5].step, 7);
    assert_false(evs[5].has_value);
    assert_int_equal(evs[1].session_status, 0);
    assert_string_equal(evs[1].tag, "loss");
    assert_true(evs[1].has_value && evs[1].value == 2.5f);
    assert_int_equal(evs[1].step, 0);
    assert_true(evs[1].wall_time == 1700000000.25);
    assert_string_equal(evs[2].tag, "loss");
    assert_true(evs[2].value == 0.1f);
    assert_int_equal(evs[2].step, 1);
    assert_string_equal(evs[3].tag, "train/accuracy");
    assert_true(isinf(evs[3].value) && evs[3].value < 0);
    assert_int_equal(evs[3].step, -3);
    assert_int_equal(evs[4].step, 1234567890123456789LL);
    assert_true(evs[4].value == 1e-38f);
    assert_true(evs[4].wall_time >= before);
    assert_ch_ok(ch_events_destroy(ev));

    /* a second writer in the same directory gets its own file */
    {
        ch_events_t *e2;
        assert_ch_ok(ch_events_open(logdir, &e2));
        assert_ch_ok(ch_events_open(logdir, &ev));
        assert_string_not_equal(ch_events_path(e2), ch_events_path(ev));
        assert_ch_ok(ch_events_destroy(ev));
        assert_ch_ok(ch_events_destroy(e2));
    }
    assert_ch_error(ch_events_open("/proc/cohort-events", &ev), CH_ERR_IO, "/proc/cohort-events");
}

static char *read_text(const char *path)
{
    FILE *f = fopen(path, "rb");
    static char buf[8192];
    size_t n;
    if (!f) fail_msg("cannot open %s", path);
    n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    return buf;
}

static const char *const cols[4] = {"loss", "accuracy", "learning_rate", "images_per_sec"};

static void test_metrics_csv_and_resume(void **state)
{
    ch_metrics_t *m;
    double v[4];
    char csv[700];
    event_t evs[64];

    assert_ch_ok(ch_metrics_open(dir, "metrics.csv", cols, 4, 0, &m));
    snprintf(csv, sizeof csv, "%s/metrics.csv", dir);
    assert_string_equal(ch_metrics_csv_path(m), csv);
    assert_string_equal(read_text(csv), "epoch,step,wall_time,loss,accuracy,learning_rate,images_per_sec\n");
    for (int e = 0; e < 3; e++) {
        v[0] = 1.0 / (e + 1);
        v[1] = 0.8 + 0.05 * e;
        v[2] = 0.02 * (e == 2 ? 0.5 : 1);
        v[3] = 527.25 + e;
        assert_ch_ok(ch_metrics_log_epoch(m, e, 938 * (e + 1), 1700000000.5 + e, v));
    }
    /* visible before close: flushed per epoch */
    assert_string_equal(read_text(csv),
                        "epoch,step,wall_time,loss,accuracy,learning_rate,images_per_sec\n"
                        "0,938,1700000000.500,1,0.8,0.02,527.25\n"
                        "1,1876,1700000001.500,0.5,0.85,0.02,528.25\n"
                        "2,2814,1700000002.500,0.333333333,0.9,0.01,529.25\n");
    {
        /* version, session START at epoch 0, then 4 scalars per epoch */
        int n = read_events(ch_metrics_events_path(m), evs, 64);
        assert_int_equal(n, 2 + 3 * 4);
        assert_int_equal(evs[1].session_status, 1);
        assert_int_equal(evs[1].step, 0);
        assert_string_equal(evs[2].tag, "loss");
        assert_string_equal(evs[5].tag, "images_per_sec");
        assert_int_equal(evs[13].step, 2);
        assert_true(evs[13].value == 529.25f);
        assert_true(evs[10].value == (float)(1.0 / 3));
        assert_true(evs[10].wall_time == 1700000002.5);
    }
    assert_ch_ok(ch_metrics_destroy(m));

    /* a torn last line (killed mid-write) is dropped on resume */
    {
        FILE *f = fopen(csv, "a");
        fputs("3,3752,17000", f);
        fclose(f);
    }
    /* resume at epoch 2: rows 0 and 1 kept, 2 and the torn line dropped */
    assert_ch_ok(ch_metrics_open(dir, "metrics.csv", cols, 4, 2, &m));
    v[0] = 0.25;
    assert_ch_ok(ch_metrics_log_epoch(m, 2, 2814, 1700000009.0, v));
    {
        int n = read_events(ch_metrics_events_path(m), evs, 64);
        assert_int_equal(n, 2 + 4);
        assert_int_equal(evs[1].session_status, 1);
        assert_int_equal(evs[1].step, 2); /* TensorBoard drops older points of epochs >= 2 */
    }
    assert_ch_ok(ch_metrics_destroy(m));
    assert_string_equal(read_text(csv),
                        "epoch,step,wall_time,loss,accuracy,learning_rate,images_per_sec\n"
                        "0,938,1700000000.500,1,0.8,0.02,527.25\n"
                        "1,1876,1700000001.500,0.5,0.85,0.02,528.25\n"
                        "2,2814,1700000009.000,0.25,0.9,0.01,529.25\n");

    /* other columns: refused, file untouched */
    assert_ch_error(ch_metrics_open(dir, "metrics.csv", cols, 3, 1, &m), CH_ERR_FORMAT,
                    "has header 'epoch,step,wall_time,loss,accuracy,learning_rate,images_per_sec', expected "
                    "'epoch,step,wall_time,loss,accuracy,learning_rate'");
    assert_non_null(strstr(read_text(csv), "2,2814,1700000009.000"));
    /* a fresh run starts the CSV anew */
    assert_ch_ok(ch_metrics_open(dir, "metrics.csv", cols, 4, 0, &m));
    assert_ch_ok(ch_metrics_destroy(m));
    assert_string_equal(read_text(csv), "epoch,step,wall_time,loss,accuracy,learning_rate,images_per_sec\n");
    /* a malformed row */
    {
        FILE *f = fopen(csv, "a");
        fputs("x,1,2,3,4,5,6\n", f);
        fclose(f);
    }
    assert_ch_error(ch_metrics_open(dir, "metrics.csv", cols, 4, 1, &m), CH_ERR_FORMAT, "line 2: expected an epoch");
}

static void test_metrics_rejects(void **state)
{
    ch_metrics_t *m;
    const char *bad1[2] = {"loss", "loss"};
    const char *bad2[1] = {"a,b"};
    const char *bad3[1] = {""};
    assert_ch_error(ch_metrics_open(dir, "m.csv", bad1, 2, 0, &m), CH_ERR_INVALID, "column 'loss' given twice");
    assert_ch_error(ch_metrics_open(dir, "m.csv", bad2, 1, 0, &m), CH_ERR_INVALID, "column 0 'a,b'");
    assert_ch_error(ch_metrics_open(dir, "m.csv", bad3, 1, 0, &m), CH_ERR_INVALID, "column 0 ''");
    assert_ch_error(ch_metrics_open(dir, "m.csv", cols, 0, 0, &m), CH_ERR_INVALID, "0 columns");
    assert_ch_error(ch_metrics_open(dir, "sub/m.csv", cols, 4, 0, &m), CH_ERR_INVALID, "plain CSV file name");
    assert_ch_error(ch_metrics_open(dir, "m.csv", cols, 4, -1, &m), CH_ERR_INVALID, "first epoch -1");
    assert_ch_error(ch_metrics_open("/proc/cohort-metrics", "m.csv", cols, 4, 0, &m), CH_ERR_IO,
                    "/proc/cohort-metrics");
    /* a failed open leaves no event file behind */
    {
        FILE *f;
        char p[700];
        DIR *d;
        struct dirent *e;
        int events = 0;
        mkdir(dir, 0755);
        snprintf(p, sizeof p, "%s/m.csv", dir);
        f = fopen(p, "w");
        fputs("other,header\n", f);
        fclose(f);
        assert_ch_error(ch_metrics_open(dir, "m.csv", cols, 4, 1, &m), CH_ERR_FORMAT, "has header 'other,header'");
        d = opendir(dir);
        while ((e = readdir(d)))
            if (strstr(e->d_name, "tfevents")) events++;
        closedir(d);
        assert_int_equal(events, 0);
    }
}

/* TensorBoard itself reads what cohort writes (skipped without the
 * tensorboard package). Two runs into one directory: a first run of epochs
 * 0-2, then a run resumed at epoch 2 that logs epochs 2-3 with other values:
 * TensorBoard must show epochs 0-3 once each, epoch 2 from the resumed run. */
static void test_tensorboard_reads_files(void **state)
{
    const char *py = getenv("PYTHON3");
    char logdir[700], expect[800], cmd[3000];
    ch_metrics_t *m;
    FILE *f;
    int rc;
    double first2[4] = {9.0, 0.125, 0.5, 1.0};
    double vals[4][4] = {{2.25, 0.5, 0.02, 500.5}, {1.125, 0.75, 0.015, 510.0}, {0.5, 0.875, 0.005, 520.0},
                         {0.25, 0.9375, 0.001, 530.0}};

    if (!py || !py[0]) ch_test_skip("PYTHON3 not set");
    snprintf(logdir, sizeof logdir, "%s/tests/golden-out/tensorboard", ch_test_builddir());
    rm_rf(logdir);
    assert_ch_ok(ch_metrics_open(logdir, "metrics.csv", cols, 4, 0, &m));
    for (int e = 0; e < 3; e++) assert_ch_ok(ch_metrics_log_epoch(m, e, 100 * (e + 1), -1, e == 2 ? first2 : vals[e]));
    assert_ch_ok(ch_metrics_destroy(m));
    sleep(1); /* TensorBoard reads event files in name order (timestamp first) */
    assert_ch_ok(ch_metrics_open(logdir, "metrics.csv", cols, 4, 2, &m));
    for (int e = 2; e < 4; e++) assert_ch_ok(ch_metrics_log_epoch(m, e, 100 * (e + 1), -1, vals[e]));
    assert_ch_ok(ch_metrics_destroy(m));

    snprintf(expect, sizeof expect, "%s/expected.json", logdir);
    f = fopen(expect, "w");
    assert_non_null(f);
    /* file 1: version, START, 3 epochs x 4 scalars; file 2: version, START, 2 x 4 */
    fprintf(f, "{\"events_total\": %d, \"scalars\": {", (2 + 3 * 4) + (2 + 2 * 4));
    for (int c = 0; c < 4; c++) {
        fprintf(f, "%s\"%s\": [", c ? ", " : "", cols[c]);
        for (int e = 0; e < 4; e++) fprintf(f, "%s[%d, %.17g]", e ? ", " : "", e, vals[e][c]);
        fprintf(f, "]");
    }
    fprintf(f, "}}\n");
    fclose(f);
    snprintf(cmd, sizeof cmd, "'%s' '%s/tests/golden/tensorboard_check.py' '%s' '%s'", py, ch_test_srcdir(),
             logdir, expect);
    rc = system(cmd);
    rc = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
    if (rc == 77)
        ch_test_skip("python package tensorboard not installed for %s (pip install -r .ci/pip-packages)", py);
    assert_int_equal(rc, 0);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_crc32c),
        cmocka_unit_test_setup_teardown(test_event_file, setup, teardown),
        cmocka_unit_test_setup_teardown(test_metrics_csv_and_resume, setup, teardown),
        cmocka_unit_test_setup_teardown(test_metrics_rejects, setup, teardown),
        cmocka_unit_test(test_tensorboard_reads_files),
    };
    return ch_test_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
