/* Tests for io/state/atomic_file and io/state/checkpoint: resume-file round trip and
 * validation, atomic replacement under failures (a writer killed with
 * SIGKILL mid-write, a write failing midway on a file-size limit), and
 * clear errors for unwritable destinations. Single process (uses fork). */
#include "config.h"

#include "tests/harness.h"

#include "io/state/atomic_file.h"
#include "io/state/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char dir[512];

static const char *path_in(const char *name)
{
    static char buf[2][1024];
    static int k;
    k ^= 1;
    snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name);
    return buf[k];
}

static int count_temps(void)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    int n = 0;
    assert_non_null(d);
    while ((e = readdir(d)))
        if (strstr(e->d_name, ".tmp.")) n++;
    closedir(d);
    return n;
}

static int setup(void **state)
{
    snprintf(dir, sizeof dir, "%s/tests/tmp-checkpoint-%d", ch_test_builddir(), (int)getpid());
    mkdir(dir, 0755);
    return 0;
}

static int teardown(void **state)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    if (!d) return 0;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.' && (!e->d_name[1] || (e->d_name[1] == '.' && !e->d_name[2]))) continue;
        unlink(path_in(e->d_name));
    }
    closedir(d);
    rmdir(dir);
    return 0;
}

/* ---------------------------------------------------------------- a small training state */

typedef struct {
    float conv_w[8 * 3 * 3], bn_w[8], bn_b[8], bn_rm[8], bn_rv[8], fc_w[4 * 8], fc_b[4];
    int64_t nbt;
    float mom_conv[8 * 3 * 3], mom_fc_w[4 * 8];
    ch_st_view_t state[8], mom[2];
} model_t;

static void make_model(model_t *m, float seed)
{
    float *arrays[] = {m->conv_w, m->bn_w, m->bn_b, m->bn_rm, m->bn_rv, m->fc_w, m->fc_b, m->mom_conv, m->mom_fc_w};
    size_t sizes[] = {72, 8, 8, 8, 8, 32, 4, 72, 32};
    for (size_t a = 0; a < 9; a++)
        for (size_t i = 0; i < sizes[a]; i++) arrays[a][i] = seed * (float)(a + 1) + (float)i / 7.0f;
    m->nbt = 1234567890123LL;
#define V(i, nm, arr, nd, ...)                                                                     \
    m->state[i] = (ch_st_view_t){.name = nm, .dtype = CH_ST_F32, .ndim = nd, .shape = {__VA_ARGS__}, \
                                 .data = arr, .nbytes = sizeof arr}
    V(0, "conv1.weight", m->conv_w, 4, 8, 1, 3, 3);
    V(1, "bn1.weight", m->bn_w, 1, 8);
    V(2, "bn1.bias", m->bn_b, 1, 8);
    V(3, "bn1.running_mean", m->bn_rm, 1, 8);
    V(4, "bn1.running_var", m->bn_rv, 1, 8);
    m->state[5] = (ch_st_view_t){.name = "bn1.num_batches_tracked", .dtype = CH_ST_I64, .ndim = 0,
                                 .data = &m->nbt, .nbytes = 8};
    V(6, "fc.weight", m->fc_w, 2, 4, 8);
    V(7, "fc.bias", m->fc_b, 1, 4);
#undef V
    m->mom[0] = m->state[0];
    m->mom[0].data = m->mom_conv;
    m->mom[1] = m->state[6];
    m->mom[1].data = m->mom_fc_w;
}

static const char *config_text = "train: {\n  lr = 0.02;  # scaled\n  name = \"resnet18\";\n};\n";

static ch_resume_info_t make_info(int64_t epoch)
{
    ch_resume_info_t info = {.epoch = epoch,
                             .global_step = 938 * epoch,
                             .sampler_seed = 18446744073709551615ull,
                             .sampler_epoch = epoch - 1 >= 0 ? epoch - 1 : 0,
                             .world_size = 2,
                             .rng_state = "mt19937:5489:0",
                             .config = config_text};
    return info;
}

static void check_model_equal(const ch_safetensors_t *st, const model_t *m)
{
    for (size_t i = 0; i < 8; i++) {
        const ch_st_view_t *v = ch_safetensors_find(st, m->state[i].name);
        if (!v) fail_msg("tensor %s missing", m->state[i].name);
        assert_int_equal(v->dtype, m->state[i].dtype);
        assert_int_equal(v->nbytes, m->state[i].nbytes);
        assert_memory_equal(v->data, m->state[i].data, v->nbytes); /* bitwise */
    }
}

/* ---------------------------------------------------------------- resume files */

static void test_resume_roundtrip(void **state)
{
    model_t m;
    ch_resume_info_t info = make_info(3), got;
    ch_safetensors_t *st;
    ch_st_meta_t extra[1] = {{"cohort.git", "abc123"}};
    const char *p = path_in("resume.safetensors");
    const ch_st_view_t *mv;

    make_model(&m, 0.5f);
    assert_ch_ok(ch_checkpoint_write_resume(p, m.state, 8, m.mom, 2, &info, extra, 1));
    assert_ch_ok(ch_checkpoint_read_resume(p, &st, &got));
    assert_int_equal(got.epoch, 3);
    assert_int_equal(got.global_step, 938 * 3);
    assert_true(got.sampler_seed == 18446744073709551615ull);
    assert_int_equal(got.sampler_epoch, 2);
    assert_int_equal(got.world_size, 2);
    assert_string_equal(got.rng_state, "mt19937:5489:0");
    assert_string_equal(got.config, config_text);
    assert_string_equal(ch_safetensors_meta_get(st, "cohort.git"), "abc123");
    assert_string_equal(ch_safetensors_meta_get(st, "format"), "pt");
    check_model_equal(st, &m);
    /* state-dict order first, then momentum buffers */
    assert_string_equal(ch_safetensors_at(st, 0)->name, "conv1.weight");
    assert_string_equal(ch_safetensors_at(st, 8)->name, "optim.momentum_buffer.conv1.weight");
    mv = ch_checkpoint_momentum(st, "fc.weight");
    assert_non_null(mv);
    assert_memory_equal(mv->data, m.mom_fc_w, sizeof m.mom_fc_w);
    assert_null(ch_checkpoint_momentum(st, "fc.bias"));
    assert_true(ch_checkpoint_is_momentum(ch_safetensors_at(st, 9)->name));
    assert_false(ch_checkpoint_is_momentum("fc.weight"));
    assert_int_equal(ch_safetensors_count(st), 10);
    ch_safetensors_destroy(st);

    /* A model file is a plain state dict and not a resume file. */
    p = path_in("model-3.safetensors");
    assert_ch_ok(ch_checkpoint_write_model(p, m.state, 8));
    assert_ch_ok(ch_safetensors_open(p, &st));
    assert_int_equal(ch_safetensors_count(st), 8);
    assert_int_equal(ch_safetensors_meta_count(st), 1);
    check_model_equal(st, &m);
    ch_safetensors_destroy(st);
    assert_ch_error(ch_checkpoint_read_resume(p, &st, &got), CH_ERR_FORMAT, "not a cohort resume file");
    assert_non_null(strstr(ch_error_message(), p));
    assert_null(st);
}

static void test_resume_write_rejects(void **state)
{
    model_t m;
    ch_resume_info_t info = make_info(1);
    ch_st_view_t bad;
    ch_st_meta_t clash[1] = {{"epoch", "9"}};
    const char *p = path_in("rej.safetensors");
    make_model(&m, 1);

    bad = m.mom[0];
    bad.name = "conv2.weight";
    assert_ch_error(ch_checkpoint_write_resume(p, m.state, 8, &bad, 1, &info, NULL, 0), CH_ERR_INVALID,
                    "momentum buffer for 'conv2.weight', which is not in the state dict");
    bad = m.mom[1];
    bad.ndim = 1;
    bad.shape[0] = 32;
    assert_ch_error(ch_checkpoint_write_resume(p, m.state, 8, &bad, 1, &info, NULL, 0), CH_ERR_INVALID,
                    "does not match");
    assert_ch_error(ch_checkpoint_write_resume(p, m.state, 8, m.mom, 2, &info, clash, 1), CH_ERR_INVALID,
                    "key 'epoch' given twice");
    info.world_size = 0;
    assert_ch_error(ch_checkpoint_write_resume(p, m.state, 8, m.mom, 2, &info, NULL, 0), CH_ERR_INVALID,
                    "world_size 0");
    info = make_info(1);
    info.config = NULL;
    assert_ch_error(ch_checkpoint_write_resume(p, m.state, 8, m.mom, 2, &info, NULL, 0), CH_ERR_INVALID,
                    "config is NULL");
    assert_int_equal(access(p, F_OK), -1); /* nothing written */
    assert_int_equal(count_temps(), 0);
}

/* Resume files with a missing or malformed key are rejected naming it. */
static void test_resume_read_rejects(void **state)
{
    model_t m;
    const char *p = path_in("badmeta.safetensors");
    ch_safetensors_t *st;
    ch_resume_info_t info;
    ch_st_meta_t meta[10] = {{"format", "pt"},        {"cohort.file", "resume"}, {"cohort.resume_version", "1"},
                             {"epoch", "2"},          {"global_step", "10"},     {"sampler.seed", "0"},
                             {"sampler.epoch", "1"},  {"world_size", "4"},      {"rng_state", ""},
                             {"config", "x = 1;"}};
    struct {
        size_t idx;
        const char *value; /* NULL: drop the key */
        const char *needle;
    } cases[] = {
        {3, NULL, "resume metadata key 'epoch' is missing"},
        {3, "two", "resume metadata 'epoch' is \"two\", expected a decimal integer"},
        {3, "-1", "'epoch' is \"-1\""},
        {3, "", "'epoch' is \"\""},
        {3, " 2", "'epoch' is \" 2\""},
        {3, "2x", "'epoch' is \"2x\""},
        {4, "99999999999999999999", "'global_step'"},
        {5, "-3", "'sampler.seed' is \"-3\", expected an unsigned decimal integer"},
        {6, NULL, "'sampler.epoch' is missing"},
        {7, "0", "'world_size' is \"0\""},
        {8, NULL, "'rng_state' is missing"},
        {9, NULL, "'config' is missing"},
        {2, "2", "resume file version 2"},
        {1, "model", "not a cohort resume file (metadata 'cohort.file' is \"model\""},
        {1, NULL, "not a cohort resume file"},
    };
    make_model(&m, 2);

    /* the unmodified metadata is a valid resume file */
    assert_ch_ok(ch_safetensors_write(p, m.state, 8, meta, 10));
    assert_ch_ok(ch_checkpoint_read_resume(p, &st, &info));
    assert_int_equal(info.world_size, 4);
    assert_string_equal(info.rng_state, "");
    ch_safetensors_destroy(st);

    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        ch_st_meta_t mm[10];
        size_t n = 0;
        ch_status s;
        for (size_t i = 0; i < 10; i++) {
            if (i == cases[c].idx && !cases[c].value) continue;
            mm[n] = meta[i];
            if (i == cases[c].idx) mm[n].value = cases[c].value;
            n++;
        }
        assert_ch_ok(ch_safetensors_write(p, m.state, 8, mm, n));
        ch_error_clear();
        s = ch_checkpoint_read_resume(p, &st, &info);
        if (s != CH_ERR_FORMAT || !strstr(ch_error_message(), cases[c].needle) || !strstr(ch_error_message(), p))
            fail_msg("case %zu: %s '%s', expected CH_ERR_FORMAT with '%s'", c, ch_status_name(s),
                     ch_error_message(), cases[c].needle);
        assert_null(st);
    }
    /* An orphan momentum buffer. */
    {
        ch_st_view_t v[9];
        memcpy(v, m.state, sizeof m.state);
        v[8] = m.mom[0];
        v[8].name = "optim.momentum_buffer.layer9.weight";
        assert_ch_ok(ch_safetensors_write(p, v, 9, meta, 10));
        assert_ch_error(ch_checkpoint_read_resume(p, &st, &info), CH_ERR_FORMAT,
                        "momentum buffer 'optim.momentum_buffer.layer9.weight' has no parameter 'layer9.weight'");
    }
}

/* ---------------------------------------------------------------- atomic replacement */

static void test_atomic_file_basics(void **state)
{
    const char *p = path_in("plain.bin");
    ch_atomic_file_t *f;
    struct stat sb;
    static char buf[3000000];
    FILE *in;
    int removed = -1;
    mode_t old = umask(022);

    for (size_t i = 0; i < sizeof buf; i++) buf[i] = (char)(i * 31 + 7);
    assert_ch_ok(ch_atomic_file_write_all(p, "old", 3));
    assert_ch_ok(ch_atomic_file_open(p, &f));
    assert_non_null(strstr(ch_atomic_file_temp_path(f), "/.plain.bin.tmp."));
    assert_int_equal(count_temps(), 1);
    /* small, large (bypassing the buffer), small writes */
    assert_ch_ok(ch_atomic_file_write(f, buf, 10));
    assert_ch_ok(ch_atomic_file_write(f, buf + 10, 2500000));
    assert_ch_ok(ch_atomic_file_write(f, buf + 2500010, sizeof buf - 2500010));
    assert_int_equal(ch_atomic_file_size(f), sizeof buf);
    /* not visible before commit */
    assert_int_equal(stat(p, &sb), 0);
    assert_int_equal(sb.st_size, 3);
    assert_ch_ok(ch_atomic_file_commit(f));
    assert_int_equal(stat(p, &sb), 0);
    assert_int_equal(sb.st_size, sizeof buf);
    assert_int_equal(sb.st_mode & 0777, 0644); /* 0666 & ~umask, not mkstemp's 0600 */
    in = fopen(p, "rb");
    {
        static char back[sizeof buf];
        assert_int_equal(fread(back, 1, sizeof back, in), sizeof buf);
        assert_memory_equal(back, buf, sizeof buf);
    }
    fclose(in);
    assert_int_equal(count_temps(), 0);

    /* abort leaves the target alone */
    assert_ch_ok(ch_atomic_file_open(p, &f));
    assert_ch_ok(ch_atomic_file_write(f, "xyz", 3));
    ch_atomic_file_abort(f);
    assert_int_equal(stat(p, &sb), 0);
    assert_int_equal(sb.st_size, sizeof buf);
    assert_int_equal(count_temps(), 0);

    /* relative path (no directory part) */
    {
        char cwd[1024];
        assert_non_null(getcwd(cwd, sizeof cwd));
        assert_int_equal(chdir(dir), 0);
        assert_ch_ok(ch_atomic_file_write_all("rel.bin", "r", 1));
        assert_int_equal(chdir(cwd), 0);
        assert_int_equal(access(path_in("rel.bin"), R_OK), 0);
    }

    assert_ch_error(ch_atomic_file_open(dir, &f), CH_ERR_INVALID, "is a directory");
    assert_ch_error(ch_atomic_file_open("dir/", &f), CH_ERR_INVALID, "ends with '/'");
    assert_ch_error(ch_atomic_file_open("", &f), CH_ERR_INVALID, "empty file name");
    assert_ch_ok(ch_atomic_file_remove_stale(p, &removed));
    assert_int_equal(removed, 0);
    umask(old);
}

static void test_unwritable_destination(void **state)
{
    model_t m;
    ch_resume_info_t info = make_info(1);
    char pbuf[1100];
    const char *p = pbuf;
    ch_atomic_file_t *f;
    make_model(&m, 3);

    assert_ch_error(ch_checkpoint_write_resume("/nonexistent-cohort-dir/resume.safetensors", m.state, 8, m.mom, 2,
                                               &info, NULL, 0),
                    CH_ERR_IO, "cannot write '/nonexistent-cohort-dir/resume.safetensors'");
    assert_non_null(strstr(ch_error_message(), "No such file or directory"));
    /* a regular file used as a directory */
    assert_ch_ok(ch_atomic_file_write_all(path_in("afile"), "x", 1));
    snprintf(pbuf, sizeof pbuf, "%s/afile/model.safetensors", dir);
    assert_ch_error(ch_checkpoint_write_model(p, m.state, 8), CH_ERR_IO, p);
    assert_non_null(strstr(ch_error_message(), "Not a directory"));
    assert_ch_error(ch_checkpoint_check_dir(path_in("afile")), CH_ERR_IO, "is not a directory");
    assert_ch_error(ch_checkpoint_check_dir("/nonexistent-cohort-dir"), CH_ERR_IO,
                    "checkpoint directory '/nonexistent-cohort-dir': No such file or directory");
    assert_ch_ok(ch_checkpoint_check_dir(dir));
    assert_int_equal(count_temps(), 0);
    /* A directory without write permission (permissions do not bind root). */
    if (geteuid() != 0) {
        const char *ro = path_in("ro");
        assert_int_equal(mkdir(ro, 0555), 0);
        snprintf(pbuf, sizeof pbuf, "%s/model.safetensors", ro);
        assert_ch_error(ch_checkpoint_write_model(p, m.state, 8), CH_ERR_IO, "Permission denied");
        assert_non_null(strstr(ch_error_message(), p));
        assert_ch_error(ch_checkpoint_check_dir(ro), CH_ERR_IO, "not writable: Permission denied");
        rmdir(ro);
    }
    /* A read-only file system (/proc refuses new files even for root). */
    assert_ch_error(ch_atomic_file_open("/proc/cohort-test.safetensors", &f), CH_ERR_IO,
                    "cannot write '/proc/cohort-test.safetensors'");
}

/* Child processes report failures through their exit status and stderr. */
#define CHILD_CHECK(cond, ...)                                                                     \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "child: " __VA_ARGS__);                                                \
            fprintf(stderr, " (%s)\n", ch_error_message());                                       \
            _exit(3);                                                                              \
        }                                                                                          \
    } while (0)

/* Big momentum-free state: one 4 MiB tensor (value v everywhere). */
static float *big_state(ch_st_view_t *view, float v)
{
    size_t n = (size_t)1 << 20;
    float *data = malloc(n * sizeof *data);
    assert_non_null(data);
    for (size_t i = 0; i < n; i++) data[i] = v;
    *view = (ch_st_view_t){.name = "big.weight", .dtype = CH_ST_F32, .ndim = 2, .shape = {1024, 1024},
                           .data = data, .nbytes = n * sizeof *data};
    return data;
}

static void check_file_is(const char *p, const model_t *m, int64_t epoch)
{
    ch_safetensors_t *st;
    ch_resume_info_t info;
    assert_ch_ok(ch_checkpoint_read_resume(p, &st, &info));
    assert_int_equal(info.epoch, epoch);
    check_model_equal(st, m);
    ch_safetensors_destroy(st);
}

/* A writer killed with SIGKILL in the middle of writing the replacement
 * leaves the previous file intact and loadable, plus one stale temporary
 * that ch_atomic_file_remove_stale deletes. */
static void test_killed_writer_keeps_old_file(void **state)
{
    model_t m1;
    ch_resume_info_t info = make_info(1);
    const char *p = path_in("resume-kill.safetensors");
    int fds[2], status, removed = 0;
    pid_t pid;
    char c;

    make_model(&m1, 1);
    assert_ch_ok(ch_checkpoint_write_resume(p, m1.state, 8, m1.mom, 2, &info, NULL, 0));
    assert_int_equal(pipe(fds), 0);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        ch_atomic_file_t *f;
        static char chunk[1 << 16];
        close(fds[0]);
        memset(chunk, 0x5a, sizeof chunk);
        CHILD_CHECK(ch_atomic_file_open(p, &f) == CH_OK, "open");
        for (int i = 0; i < 40; i++) CHILD_CHECK(ch_atomic_file_write(f, chunk, sizeof chunk) == CH_OK, "write");
        CHILD_CHECK(write(fds[1], "w", 1) == 1, "pipe");
        for (int i = 0; i < 1000; i++) { /* keep writing until killed (at most ~10 s) */
            CHILD_CHECK(ch_atomic_file_write(f, chunk, sizeof chunk) == CH_OK, "write");
            usleep(10000);
        }
        ch_atomic_file_commit(f);
        _exit(4); /* should have been killed */
    }
    close(fds[1]);
    assert_int_equal(read(fds[0], &c, 1), 1); /* the child is mid-write */
    close(fds[0]);
    assert_int_equal(kill(pid, SIGKILL), 0);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    check_file_is(p, &m1, 1);
    assert_int_equal(count_temps(), 1);
    assert_ch_ok(ch_atomic_file_remove_stale(p, &removed));
    assert_int_equal(removed, 1);
    assert_int_equal(count_temps(), 0);
}

/* The real resume writer killed at random moments: the file is always a
 * complete old or new version, never a mix or a torn file. */
static void test_killed_resume_writer_race(void **state)
{
    model_t m1, m2;
    ch_resume_info_t i1 = make_info(1), i2 = make_info(2);
    const char *p = path_in("resume-race.safetensors");
    ch_st_view_t big1, big2;
    float *d1 = big_state(&big1, 1.0f), *d2 = big_state(&big2, 2.0f);
    int olds = 0, news = 0;
    unsigned seed = (unsigned)time(NULL);

    make_model(&m1, 1);
    make_model(&m2, 2);
    m1.state[7] = big1; /* replace fc.bias by a 4 MiB tensor to make writes take a while */
    m2.state[7] = big2;
    m1.state[7].name = m2.state[7].name = "fc.bias";
    assert_ch_ok(ch_checkpoint_write_resume(p, m1.state, 8, NULL, 0, &i1, NULL, 0));
    for (int round = 0; round < 6; round++) {
        int status, fds[2];
        char c;
        pid_t pid;
        assert_int_equal(pipe(fds), 0);
        pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            close(fds[0]);
            CHILD_CHECK(write(fds[1], "s", 1) == 1, "pipe");
            for (int k = 0; k < 200; k++)
                CHILD_CHECK(ch_checkpoint_write_resume(p, m2.state, 8, NULL, 0, &i2, NULL, 0) == CH_OK, "write");
            _exit(0);
        }
        close(fds[1]);
        assert_int_equal(read(fds[0], &c, 1), 1);
        close(fds[0]);
        usleep((useconds_t)(rand_r(&seed) % 8000)); /* a write takes a few ms here */
        kill(pid, SIGKILL);
        assert_int_equal(waitpid(pid, &status, 0), pid);
        {
            ch_safetensors_t *st;
            ch_resume_info_t got;
            assert_ch_ok(ch_checkpoint_read_resume(p, &st, &got));
            check_model_equal(st, got.epoch == 1 ? &m1 : &m2);
            if (got.epoch == 1)
                olds++;
            else
                news++;
            ch_safetensors_destroy(st);
        }
        assert_ch_ok(ch_atomic_file_remove_stale(p, NULL));
        /* back to the old version for the next round */
        assert_ch_ok(ch_checkpoint_write_resume(p, m1.state, 8, NULL, 0, &i1, NULL, 0));
    }
    fprintf(stderr, "race: %d old, %d new\n", olds, news);
    assert_int_equal(olds + news, 6);
    free(d1);
    free(d2);
}

/* A write that fails midway (the file-size limit makes write(2) fail with
 * EFBIG after 1 MiB, as a full disk would with ENOSPC) reports the path and
 * the reason, removes its temporary and keeps the old file. */
static void test_failing_write_keeps_old_file(void **state)
{
    model_t m1, m2;
    ch_resume_info_t i1 = make_info(1), i2 = make_info(2);
    const char *p = path_in("resume-efbig.safetensors");
    ch_st_view_t big;
    float *d = big_state(&big, 3.0f);
    int status;
    pid_t pid;

    make_model(&m1, 1);
    make_model(&m2, 2);
    m2.state[7] = big;
    m2.state[7].name = "fc.bias";
    assert_ch_ok(ch_checkpoint_write_resume(p, m1.state, 8, m1.mom, 2, &i1, NULL, 0));
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct rlimit rl = {(rlim_t)1 << 20, (rlim_t)1 << 20};
        ch_status s;
        signal(SIGXFSZ, SIG_IGN);
        CHILD_CHECK(setrlimit(RLIMIT_FSIZE, &rl) == 0, "setrlimit");
        s = ch_checkpoint_write_resume(p, m2.state, 8, NULL, 0, &i2, NULL, 0);
        CHILD_CHECK(s == CH_ERR_IO, "expected CH_ERR_IO, got %s", ch_status_name(s));
        CHILD_CHECK(strstr(ch_error_message(), p) != NULL, "message does not name the path");
        CHILD_CHECK(strstr(ch_error_message(), "File too large") != NULL, "message lacks the reason");
        CHILD_CHECK(strstr(ch_error_message(), "is unchanged") != NULL, "message lacks 'unchanged'");
        _exit(0);
    }
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    assert_int_equal(count_temps(), 0);
    check_file_is(p, &m1, 1);
    free(d);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_resume_roundtrip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_resume_write_rejects, setup, teardown),
        cmocka_unit_test_setup_teardown(test_resume_read_rejects, setup, teardown),
        cmocka_unit_test_setup_teardown(test_atomic_file_basics, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unwritable_destination, setup, teardown),
        cmocka_unit_test_setup_teardown(test_killed_writer_keeps_old_file, setup, teardown),
        cmocka_unit_test_setup_teardown(test_killed_resume_writer_race, setup, teardown),
        cmocka_unit_test_setup_teardown(test_failing_write_keeps_old_file, setup, teardown),
    };
    return ch_test_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
