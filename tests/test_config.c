/* Tests for framework/configuration: files, overrides, precedence, --help,
 * every error, dump round trip. Single process. */
#define _GNU_SOURCE /* open_memstream */
#include "config.h"

#include "tests/harness.h"

#include "framework/core/config_man.h"
#include "framework/core/configuration.h"
#include "framework/core/status.h"

#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const ch_config_key_t keys[] = {
    {"train.lr", CH_CFG_FLOAT, "0.01", 0, 10, "Base learning rate before scaling by world size."},
    {"train.epochs", CH_CFG_INT, "90", 1, 100000, "Number of epochs."},
    {"train.nesterov", CH_CFG_BOOL, "false", CH_CFG_NO_RANGE, "Use Nesterov momentum."},
    {"train.optimizer", CH_CFG_STRING, "sgd", CH_CFG_NO_RANGE, "Optimizer: sgd or adam."},
    {"data.root", CH_CFG_STRING, "/data", CH_CFG_NO_RANGE, "Dataset directory."},
    {"data.files", CH_CFG_STRLIST, "a.idx,b.idx", CH_CFG_NO_RANGE, "Files to read, in order."},
    {"data.max_bytes", CH_CFG_INT64, "1099511627776", 0, INFINITY, "Cache size in bytes."},
    {"model.resnet.depth", CH_CFG_INT, "18", 18, 152, "ResNet depth."},
    {"seed", CH_CFG_INT, "0", CH_CFG_NO_RANGE, "Random seed."},
};
#define NKEYS ((int)(sizeof keys / sizeof keys[0]))

static char path_buf[8][1024];
static int path_next;
/* Path of a test config file in the source tree (a few live at once). */
static const char *data(const char *name)
{
    char *p = path_buf[path_next++ % 8];
    snprintf(p, 1024, "%s/tests/data/config/%s", ch_test_srcdir(), name);
    return p;
}

/* load with a NULL-terminated argument list (argv[0] added). */
static ch_status load_args(ch_config_t **cfg, const ch_config_key_t *k, int n, ...)
{
    char *argv[32];
    int argc = 0;
    argv[argc++] = (char *)"cohort-test";
    va_list ap;
    va_start(ap, n);
    const char *a;
    while ((a = va_arg(ap, const char *)) != NULL && argc < 31) argv[argc++] = (char *)a;
    va_end(ap);
    argv[argc] = NULL;
    return ch_config_load(k, n, argc, argv, cfg);
}

#define LOAD(cfg, ...) load_args(cfg, keys, NKEYS, __VA_ARGS__, (const char *)NULL)

static void assert_one_line(void)
{
    assert_null(strchr(ch_error_message(), '\n'));
}

static void test_defaults(void **state)
{
    ch_config_t *cfg = NULL;
    assert_ch_ok(ch_config_load(keys, NKEYS, 0, NULL, &cfg));
    double lr;
    int epochs, nest, depth;
    long long mb;
    const char *root;
    const char *const *files;
    int nf;
    assert_ch_ok(ch_config_get_double(cfg, "train.lr", &lr));
    assert_true(lr == 0.01);
    assert_ch_ok(ch_config_get_int(cfg, "train.epochs", &epochs));
    assert_int_equal(epochs, 90);
    assert_ch_ok(ch_config_get_bool(cfg, "train.nesterov", &nest));
    assert_int_equal(nest, 0);
    assert_ch_ok(ch_config_get_string(cfg, "data.root", &root));
    assert_string_equal(root, "/data");
    assert_ch_ok(ch_config_get_strlist(cfg, "data.files", &files, &nf));
    assert_int_equal(nf, 2);
    assert_string_equal(files[0], "a.idx");
    assert_string_equal(files[1], "b.idx");
    assert_ch_ok(ch_config_get_int64(cfg, "data.max_bytes", &mb));
    assert_true(mb == 1099511627776LL);
    assert_ch_ok(ch_config_get_int(cfg, "model.resnet.depth", &depth));
    assert_int_equal(depth, 18);
    assert_string_equal(ch_config_source(cfg, "train.lr"), "default");
    assert_int_equal(ch_config_help_requested(cfg), 0);
    ch_config_destroy(cfg);
}

static void test_file_values(void **state)
{
    ch_config_t *cfg = NULL;
    assert_ch_ok(LOAD(&cfg, "--config", data("good.cfg")));
    double lr;
    int epochs, nest, depth, seed, nf;
    long long mb;
    const char *const *files;
    assert_ch_ok(ch_config_get_double(cfg, "train.lr", &lr));
    assert_true(lr == 0.1);
    assert_ch_ok(ch_config_get_int(cfg, "train.epochs", &epochs));
    assert_int_equal(epochs, 5);
    assert_ch_ok(ch_config_get_bool(cfg, "train.nesterov", &nest));
    assert_int_equal(nest, 1);
    assert_ch_ok(ch_config_get_int(cfg, "model.resnet.depth", &depth));
    assert_int_equal(depth, 50);
    assert_ch_ok(ch_config_get_int(cfg, "seed", &seed));
    assert_int_equal(seed, 3);
    assert_ch_ok(ch_config_get_int64(cfg, "data.max_bytes", &mb));
    assert_true(mb == 5000000000LL);
    assert_ch_ok(ch_config_get_strlist(cfg, "data.files", &files, &nf));
    assert_int_equal(nf, 2);
    assert_string_equal(files[1], "y.idx");
    /* a key the file does not set keeps its default */
    const char *opt;
    assert_ch_ok(ch_config_get_string(cfg, "train.optimizer", &opt));
    assert_string_equal(opt, "sgd");
    assert_non_null(strstr(ch_config_source(cfg, "train.lr"), "good.cfg:3"));
    assert_non_null(strstr(ch_config_source(cfg, "model.resnet.depth"), "good.cfg:7"));
    const char *root;
    assert_ch_ok(ch_config_get_string(cfg, "data.root", &root));
    assert_string_equal(root, "/d/5000000000");
    ch_config_destroy(cfg);
}

static void test_int_literal_for_float(void **state)
{
    ch_config_t *cfg = NULL;
    double lr;
    assert_ch_ok(LOAD(&cfg, "--config", data("int_for_float.cfg")));
    assert_ch_ok(ch_config_get_double(cfg, "train.lr", &lr));
    assert_true(lr == 1.0);
    ch_config_destroy(cfg);
}

static void test_precedence_order(void **state)
{
    ch_config_t *cfg = NULL;
    double lr;
    int epochs, nest, depth, seed;
    const char *root, *opt;
    char second[1100];
    snprintf(second, sizeof second, "--config=%s", data("second.cfg"));
    assert_ch_ok(LOAD(&cfg, "--set", "train.epochs=7", "--config", data("good.cfg"), second,
                      "--data.root=/scratch", "--train.optimizer", "adam", "--train.nesterov",
                      "false", "--model.resnet.depth", "34", "--set=seed=11", "--seed", "12"));
    assert_ch_ok(ch_config_get_double(cfg, "train.lr", &lr)); /* second.cfg over good.cfg */
    assert_true(lr == 0.2);
    assert_non_null(strstr(ch_config_source(cfg, "train.lr"), "second.cfg:2"));
    assert_ch_ok(ch_config_get_int(cfg, "train.epochs", &epochs)); /* --set over file */
    assert_int_equal(epochs, 7);
    assert_string_equal(ch_config_source(cfg, "train.epochs"), "command line (--set train.epochs=7)");
    assert_ch_ok(ch_config_get_string(cfg, "data.root", &root));
    assert_string_equal(root, "/scratch");
    assert_ch_ok(ch_config_get_string(cfg, "train.optimizer", &opt));
    assert_string_equal(opt, "adam");
    assert_ch_ok(ch_config_get_bool(cfg, "train.nesterov", &nest)); /* file true, cmdline false */
    assert_int_equal(nest, 0);
    assert_ch_ok(ch_config_get_int(cfg, "model.resnet.depth", &depth));
    assert_int_equal(depth, 34);
    assert_ch_ok(ch_config_get_int(cfg, "seed", &seed)); /* last override wins */
    assert_int_equal(seed, 12);
    assert_string_equal(ch_config_source(cfg, "seed"), "command line (--seed 12)");
    ch_config_destroy(cfg);

    /* a bool flag alone means true; a following option is not its value */
    assert_ch_ok(LOAD(&cfg, "--train.nesterov", "--seed=4"));
    assert_ch_ok(ch_config_get_bool(cfg, "train.nesterov", &nest));
    assert_int_equal(nest, 1);
    assert_ch_ok(ch_config_get_int(cfg, "seed", &seed));
    assert_int_equal(seed, 4);
    ch_config_destroy(cfg);
    assert_ch_ok(LOAD(&cfg, "--train.nesterov=yes", "--set", "data.files=", "--train.lr", "-0"));
    assert_ch_ok(ch_config_get_bool(cfg, "train.nesterov", &nest));
    assert_int_equal(nest, 1);
    const char *const *files;
    int nf = -1;
    assert_ch_ok(ch_config_get_strlist(cfg, "data.files", &files, &nf));
    assert_int_equal(nf, 0);
    ch_config_destroy(cfg);
}

static void test_help(void **state)
{
    /* The generated text lists every key with type, default, range and help. */
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    ch_config_print_help(keys, NKEYS, "cohort-train", f);
    fclose(f);
    assert_non_null(strstr(buf, "Usage: cohort-train"));
    for (int i = 0; i < NKEYS; i++) {
        assert_non_null(strstr(buf, keys[i].name));
        assert_non_null(strstr(buf, keys[i].help));
    }
    assert_non_null(strstr(buf, "--train.lr  (float, default 0.01, range [0, 10])"));
    assert_non_null(strstr(buf, "--data.max_bytes  (int64, default 1099511627776, range [0, inf])"));
    assert_non_null(strstr(buf, "--data.root  (string, default \"/data\")"));
    /* grouped: data.* before model.* before seed before train.* */
    assert_true(strstr(buf, "--data.files") < strstr(buf, "--model.resnet.depth"));
    assert_true(strstr(buf, "--model.resnet.depth") < strstr(buf, "--seed"));
    assert_true(strstr(buf, "--seed") < strstr(buf, "--train.epochs"));
    free(buf);

    /* --help through load: flag set, no file read (even a missing one), the
     * text goes to stdout (silenced here so it does not mix with TAP). */
    fflush(stdout);
    int saved = dup(1);
    int devnull = open("/dev/null", O_WRONLY);
    dup2(devnull, 1);
    ch_config_t *cfg = NULL;
    ch_status s = LOAD(&cfg, "--config", "/nonexistent.cfg", "--help");
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    close(devnull);
    assert_ch_ok(s);
    assert_int_equal(ch_config_help_requested(cfg), 1);
    ch_config_destroy(cfg);
}

/* a list key reads numbers as their text and a single value as a list of
 * one (data.mean = [0.5, 0.25] in a job file, as --data.mean 0.5,0.25) */
static void test_strlist_numbers(void **state)
{
    (void)state;
    ch_config_t *cfg = NULL;
    const char *const *files;
    int nf = -1;
    assert_ch_ok(LOAD(&cfg, "--config", data("list_numbers.cfg")));
    assert_ch_ok(ch_config_get_strlist(cfg, "data.files", &files, &nf));
    assert_int_equal(nf, 2);
    assert_string_equal(files[0], "0.5");
    assert_string_equal(files[1], "0.25");
    ch_config_destroy(cfg);
    cfg = NULL;
    assert_ch_ok(LOAD(&cfg, "--config", data("list_scalar.cfg")));
    assert_ch_ok(ch_config_get_strlist(cfg, "data.files", &files, &nf));
    assert_int_equal(nf, 1);
    assert_string_equal(files[0], "3");
    ch_config_destroy(cfg);
}

/* ---- errors from files: one line, file:line and key */

static void file_error(const char *file, ch_status code, const char *n1, const char *n2)
{
    ch_config_t *cfg = (ch_config_t *)&cfg;
    assert_ch_error(LOAD(&cfg, "--config", data(file)), code, n1);
    if (n2 && !strstr(ch_error_message(), n2))
        fail_msg("%s: message '%s' does not mention '%s'", file, ch_error_message(), n2);
    assert_null(cfg);
    assert_one_line();
}

static void test_unknown_key_in_file(void **state)
{
    file_error("unknown_key.cfg", CH_ERR_CONFIG, "unknown_key.cfg:3: unknown key 'train.lrr'",
               "did you mean 'train.lr'?");
    file_error("unknown_group.cfg", CH_ERR_CONFIG, "unknown_group.cfg:2: unknown key 'trian.lr'",
               "did you mean 'train.lr'?");
    file_error("unknown_toplevel.cfg", CH_ERR_CONFIG, "unknown_toplevel.cfg:2: unknown key 'lr'",
               "did you mean 'train.lr'?");
    file_error("unknown_empty_group.cfg", CH_ERR_CONFIG,
               "unknown_empty_group.cfg:2: unknown key 'optim'", NULL);
}

static void test_wrong_type_in_file(void **state)
{
    file_error("wrong_type.cfg", CH_ERR_CONFIG,
               "wrong_type.cfg:3: train.lr: expected float, got string \"abc\"", NULL);
    file_error("wrong_type_bool.cfg", CH_ERR_CONFIG,
               "wrong_type_bool.cfg:1: train.nesterov: expected bool, got int 1", NULL);
    file_error("wrong_type_int.cfg", CH_ERR_CONFIG,
               "wrong_type_int.cfg:2: train.epochs: expected int, got float 2.5", NULL);
    file_error("group_for_scalar.cfg", CH_ERR_CONFIG,
               "group_for_scalar.cfg:2: train.lr: expected float, got a group", NULL);
    file_error("scalar_for_group.cfg", CH_ERR_CONFIG,
               "scalar_for_group.cfg:1: 'train' is a group of keys", NULL);
    file_error("list_bad_elem.cfg", CH_ERR_CONFIG,
               "list_bad_elem.cfg:2: data.files: element 1: expected a string or a number, got bool true", NULL);
    file_error("int_overflow.cfg", CH_ERR_CONFIG,
               "int_overflow.cfg:1: train.epochs: 5000000000 does not fit in int", NULL);
}

static void test_int_literal_too_big_for_libconfig(void **state)
{
    /* libconfig 1.5 would silently wrap these to 32 bits */
    file_error("int_too_big.cfg", CH_ERR_CONFIG,
               "int_too_big.cfg:2: integer 5000000000 does not fit in a 32-bit libconfig int; "
               "write 5000000000L",
               NULL);
    file_error("int_too_big_neg.cfg", CH_ERR_CONFIG,
               "int_too_big_neg.cfg:2: integer -2147483649 does not fit", NULL);
}

static void test_include_relative_to_file(void **state)
{
    ch_config_t *cfg = NULL;
    double lr;
    int seed;
    assert_ch_ok(LOAD(&cfg, "--config", data("include.cfg")));
    assert_ch_ok(ch_config_get_double(cfg, "train.lr", &lr));
    assert_true(lr == 0.2); /* from second.cfg */
    assert_non_null(strstr(ch_config_source(cfg, "train.lr"), "second.cfg:2"));
    assert_ch_ok(ch_config_get_int(cfg, "seed", &seed));
    assert_int_equal(seed, 8);
    ch_config_destroy(cfg);
}

static void test_out_of_range_in_file(void **state)
{
    file_error("out_of_range.cfg", CH_ERR_CONFIG,
               "out_of_range.cfg:3: train.epochs = 0 is out of range [1, 100000]", NULL);
    file_error("out_of_range_float.cfg", CH_ERR_CONFIG,
               "out_of_range_float.cfg:1: train.lr = 11.5 is out of range [0, 10]", NULL);
}

static void test_malformed_and_missing_file(void **state)
{
    /* libconfig's own file:line: text */
    file_error("malformed.cfg", CH_ERR_CONFIG, "malformed.cfg:3: syntax error", NULL);
    file_error("unterminated.cfg", CH_ERR_CONFIG,
               "unterminated.cfg:2: unterminated string (the quote opens here)", NULL);
    ch_config_t *cfg = NULL;
    assert_ch_error(LOAD(&cfg, "--config", data("does-not-exist.cfg")), CH_ERR_IO,
                    "does-not-exist.cfg: cannot open config file: No such file or directory");
    assert_one_line();
    assert_ch_error(LOAD(&cfg, "--config", "/"), CH_ERR_IO,
                    "--config /: is a directory (a libconfig file expected)");
    assert_ch_error(LOAD(&cfg, "--config"), CH_ERR_CONFIG, "--config needs a file name");
    assert_ch_error(LOAD(&cfg, "--config="), CH_ERR_CONFIG, "--config needs a file name");
}

/* ---- errors from the command line */

static void test_command_line_errors(void **state)
{
    ch_config_t *cfg = (ch_config_t *)&cfg;
    assert_ch_error(LOAD(&cfg, "--set", "train.lr=abc"), CH_ERR_CONFIG,
                    "--set train.lr=abc: train.lr: expected float, got 'abc'");
    assert_null(cfg);
    assert_ch_error(LOAD(&cfg, "--set", "train.lr=nan"), CH_ERR_CONFIG, "expected a finite float");
    assert_ch_error(LOAD(&cfg, "--train.lr=20"), CH_ERR_CONFIG,
                    "--train.lr=20: train.lr = 20 is out of range [0, 10]");
    assert_ch_error(LOAD(&cfg, "--train.epochs", "3.5"), CH_ERR_CONFIG,
                    "--train.epochs 3.5: train.epochs: expected int (a decimal integer), got '3.5'");
    assert_ch_error(LOAD(&cfg, "--train.epochs=99999999999"), CH_ERR_CONFIG,
                    "'99999999999' does not fit in int");
    assert_ch_error(LOAD(&cfg, "--data.max_bytes=-1"), CH_ERR_CONFIG,
                    "data.max_bytes = -1 is out of range [0, inf]");
    assert_ch_error(LOAD(&cfg, "--data.max_bytes=8X"), CH_ERR_CONFIG,
                    "data.max_bytes: expected int64 (a decimal integer, or with a suffix K, M, G "
                    "or T), got '8X'");
    assert_ch_error(LOAD(&cfg, "--data.max_bytes=9000000T"), CH_ERR_CONFIG,
                    "'9000000T' does not fit in int64");
    {   /* a *_bytes key takes binary suffixes */
        long long mb;
        assert_ch_ok(LOAD(&cfg, "--data.max_bytes", "8M"));
        assert_ch_ok(ch_config_get_int64(cfg, "data.max_bytes", &mb));
        assert_true(mb == 8LL << 20);
        ch_config_destroy(cfg);
        assert_ch_ok(LOAD(&cfg, "--config", data("bytes_string.cfg"))); /* "8M" in a file */
        assert_ch_ok(ch_config_get_int64(cfg, "data.max_bytes", &mb));
        assert_true(mb == 8LL << 20);
        ch_config_destroy(cfg);
        assert_ch_ok(LOAD(&cfg, "--data.max_bytes=3GiB"));
        assert_ch_ok(ch_config_get_int64(cfg, "data.max_bytes", &mb));
        assert_true(mb == 3LL << 30);
        ch_config_destroy(cfg);
        cfg = NULL;
    }
    assert_ch_error(LOAD(&cfg, "--train.nesterov=maybe"), CH_ERR_CONFIG,
                    "train.nesterov: expected bool");
    assert_ch_error(LOAD(&cfg, "--set", "train.lrr=0.1"), CH_ERR_CONFIG,
                    "--set train.lrr=0.1: unknown key 'train.lrr' (did you mean 'train.lr'?)");
    assert_one_line();
    assert_ch_error(LOAD(&cfg, "--train.lrr=0.1"), CH_ERR_CONFIG,
                    "unknown option '--train.lrr=0.1' (did you mean '--train.lr'?)");
    assert_ch_error(LOAD(&cfg, "--confg", "x.cfg"), CH_ERR_CONFIG, "did you mean '--config'?");
    assert_ch_error(LOAD(&cfg, "--set", "train.lr"), CH_ERR_CONFIG,
                    "--set train.lr: expected KEY=VALUE");
    assert_ch_error(LOAD(&cfg, "--set"), CH_ERR_CONFIG, "--set needs KEY=VALUE");
    assert_ch_error(LOAD(&cfg, "--train.lr"), CH_ERR_CONFIG, "--train.lr needs a value (float)");
    assert_ch_error(LOAD(&cfg, "positional"), CH_ERR_CONFIG, "unexpected argument 'positional'");
    assert_ch_error(LOAD(&cfg, "--"), CH_ERR_CONFIG, "unexpected argument '--'");
    /* the command line is checked even when the file is fine */
    assert_ch_error(LOAD(&cfg, "--config", data("good.cfg"), "--model.resnet.depth=10"),
                    CH_ERR_CONFIG, "model.resnet.depth = 10 is out of range [18, 152]");
    assert_null(cfg);
}

static void test_required_key(void **state)
{
    static const ch_config_key_t req[] = {
        {"data.root", CH_CFG_STRING, NULL, CH_CFG_NO_RANGE, "Dataset directory."},
    };
    ch_config_t *cfg = NULL;
    const char *root;
    assert_ch_error(load_args(&cfg, req, 1, (const char *)NULL), CH_ERR_CONFIG,
                    "required key data.root (string) is not set");
    assert_ch_ok(load_args(&cfg, req, 1, "--data.root=/d", (const char *)NULL));
    assert_ch_ok(ch_config_get_string(cfg, "data.root", &root));
    assert_string_equal(root, "/d");
    ch_config_destroy(cfg);
}

static void test_bad_tables(void **state)
{
    ch_config_t *cfg = NULL;
    static const ch_config_key_t dup[] = {
        {"a.b", CH_CFG_INT, "1", CH_CFG_NO_RANGE, ""},
        {"a.b", CH_CFG_INT, "1", CH_CFG_NO_RANGE, ""},
    };
    static const ch_config_key_t grp[] = {
        {"a", CH_CFG_INT, "1", CH_CFG_NO_RANGE, ""},
        {"a.b", CH_CFG_INT, "1", CH_CFG_NO_RANGE, ""},
    };
    static const ch_config_key_t baddef[] = {{"a.b", CH_CFG_FLOAT, "x1", CH_CFG_NO_RANGE, ""}};
    static const ch_config_key_t outdef[] = {{"a.b", CH_CFG_INT, "0", 1, 5, ""}};
    static const ch_config_key_t badname[] = {{"a..b", CH_CFG_INT, "0", CH_CFG_NO_RANGE, ""}};
    static const ch_config_key_t badname2[] = {{"a.9b", CH_CFG_INT, "0", CH_CFG_NO_RANGE, ""}};
    static const ch_config_key_t reserved[] = {{"config", CH_CFG_STRING, "", CH_CFG_NO_RANGE, ""}};
    static const ch_config_key_t minmax[] = {{"a", CH_CFG_INT, "0", 5, 1, ""}};
    assert_ch_error(load_args(&cfg, dup, 2, (const char *)NULL), CH_ERR_INVALID, "declared twice");
    assert_ch_error(load_args(&cfg, grp, 2, (const char *)NULL), CH_ERR_INVALID,
                    "cannot also be a group");
    assert_ch_error(load_args(&cfg, baddef, 1, (const char *)NULL), CH_ERR_INVALID,
                    "default of a.b: a.b: expected float, got 'x1'");
    assert_ch_error(load_args(&cfg, outdef, 1, (const char *)NULL), CH_ERR_INVALID,
                    "default of a.b: a.b = 0 is out of range [1, 5]");
    assert_ch_error(load_args(&cfg, badname, 1, (const char *)NULL), CH_ERR_INVALID,
                    "invalid key name 'a..b'");
    assert_ch_error(load_args(&cfg, badname2, 1, (const char *)NULL), CH_ERR_INVALID,
                    "invalid key name 'a.9b'");
    assert_ch_error(load_args(&cfg, reserved, 1, (const char *)NULL), CH_ERR_INVALID, "reserved");
    assert_ch_error(load_args(&cfg, minmax, 1, (const char *)NULL), CH_ERR_INVALID, "min 5 > max 1");
    assert_ch_error(ch_config_load(keys, NKEYS, 0, NULL, NULL), CH_ERR_INVALID, "out is NULL");
}

static void test_lookup_errors(void **state)
{
    ch_config_t *cfg = NULL;
    int i;
    long long ll;
    double d;
    const char *s;
    assert_ch_ok(ch_config_load(keys, NKEYS, 0, NULL, &cfg));
    assert_ch_error(ch_config_get_int(cfg, "train.lrr", &i), CH_ERR_INVALID,
                    "'train.lrr' is not in the job's key table");
    assert_ch_error(ch_config_get_int(cfg, "train.lr", &i), CH_ERR_INVALID,
                    "train.lr is float; it cannot be read as int");
    assert_ch_error(ch_config_get_string(cfg, "seed", &s), CH_ERR_INVALID, "seed is int");
    assert_ch_error(ch_config_get_int(cfg, "data.max_bytes", &i), CH_ERR_INVALID, "is int64");
    /* widening */
    assert_ch_ok(ch_config_get_int64(cfg, "train.epochs", &ll));
    assert_true(ll == 90);
    assert_ch_ok(ch_config_get_double(cfg, "data.max_bytes", &d));
    assert_true(d == 1099511627776.0);
    assert_null(ch_config_source(cfg, "nope"));
    ch_config_destroy(cfg);
}

static void test_choice(void **state)
{
    static const char *const opts[] = {"sgd", "adam"};
    ch_config_t *cfg = NULL;
    int idx = -1;
    assert_ch_ok(LOAD(&cfg, "--train.optimizer=adam"));
    assert_ch_ok(ch_config_get_choice(cfg, "train.optimizer", opts, 2, &idx));
    assert_int_equal(idx, 1);
    ch_config_destroy(cfg);
    assert_ch_ok(LOAD(&cfg, "--set", "train.optimizer=adm"));
    assert_ch_error(ch_config_get_choice(cfg, "train.optimizer", opts, 2, &idx), CH_ERR_CONFIG,
                    "command line (--set train.optimizer=adm): train.optimizer = 'adm' is not "
                    "one of: sgd, adam");
    ch_config_destroy(cfg);
}

static void test_dump_round_trip(void **state)
{
    ch_config_t *cfg = NULL, *back = NULL;
    assert_ch_ok(LOAD(&cfg, "--config", data("good.cfg"), "--train.lr=0.1",
                      "--set", "train.optimizer=we\"ird\\name\ttab", "--data.files=p q,r",
                      "--data.max_bytes=9007199254740993", "--seed=-5"));
    char *text = NULL;
    assert_ch_ok(ch_config_dump_string(cfg, &text));
    assert_non_null(strstr(text, "train = {\n"));
    assert_non_null(strstr(text, "  lr = 0.1;  # command line (--train.lr=0.1)\n"));
    assert_non_null(strstr(text, "model = {\n  resnet = {\n    depth = 50;  # "));
    assert_non_null(strstr(text, "max_bytes = 9007199254740993L;"));
    assert_non_null(strstr(text, "files = [ \"p q\", \"r\" ];"));

    char path[1100];
    snprintf(path, sizeof path, "%s/tests/test_config-dump.cfg", ch_test_builddir());
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    assert_ch_ok(ch_config_dump(cfg, f));
    fclose(f);
    assert_ch_ok(LOAD(&back, "--config", path));
    /* every key reads back identically */
    char *text2 = NULL;
    assert_ch_ok(ch_config_dump_string(back, &text2));
    for (int i = 0; i < NKEYS; i++) {
        const char *n = keys[i].name;
        switch (keys[i].type) {
        case CH_CFG_INT: {
            int a, b;
            assert_ch_ok(ch_config_get_int(cfg, n, &a));
            assert_ch_ok(ch_config_get_int(back, n, &b));
            assert_int_equal(a, b);
            break;
        }
        case CH_CFG_INT64: {
            long long a, b;
            assert_ch_ok(ch_config_get_int64(cfg, n, &a));
            assert_ch_ok(ch_config_get_int64(back, n, &b));
            assert_true(a == b);
            break;
        }
        case CH_CFG_FLOAT: {
            double a, b;
            assert_ch_ok(ch_config_get_double(cfg, n, &a));
            assert_ch_ok(ch_config_get_double(back, n, &b));
            assert_true(a == b);
            break;
        }
        case CH_CFG_BOOL: {
            int a, b;
            assert_ch_ok(ch_config_get_bool(cfg, n, &a));
            assert_ch_ok(ch_config_get_bool(back, n, &b));
            assert_int_equal(a, b);
            break;
        }
        case CH_CFG_STRING: {
            const char *a, *b;
            assert_ch_ok(ch_config_get_string(cfg, n, &a));
            assert_ch_ok(ch_config_get_string(back, n, &b));
            assert_string_equal(a, b);
            break;
        }
        case CH_CFG_STRLIST: {
            const char *const *a, *const *b;
            int na, nb;
            assert_ch_ok(ch_config_get_strlist(cfg, n, &a, &na));
            assert_ch_ok(ch_config_get_strlist(back, n, &b, &nb));
            assert_int_equal(na, nb);
            for (int j = 0; j < na; j++) assert_string_equal(a[j], b[j]);
            break;
        }
        }
    }
    const char *opt;
    assert_ch_ok(ch_config_get_string(back, "train.optimizer", &opt));
    assert_string_equal(opt, "we\"ird\\name\ttab");
    free(text);
    free(text2);
    ch_config_destroy(cfg);
    ch_config_destroy(back);
    unlink(path);
}

static void test_dump_floats_exact(void **state)
{
    static const double vals[] = {0.1, 1.0 / 3.0, 1e-7, 2.5e10, 5.0, 0.0, 1e300};
    static const ch_config_key_t k1[] = {{"x", CH_CFG_FLOAT, "0", CH_CFG_NO_RANGE, ""},
                                         {"e.list", CH_CFG_STRLIST, "", CH_CFG_NO_RANGE, ""}};
    char path[1100], opt[64];
    snprintf(path, sizeof path, "%s/tests/test_config-float.cfg", ch_test_builddir());
    for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++) {
        ch_config_t *cfg = NULL, *back = NULL;
        snprintf(opt, sizeof opt, "--x=%.17g", vals[i]);
        assert_ch_ok(load_args(&cfg, k1, 2, opt, (const char *)NULL));
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        assert_ch_ok(ch_config_dump(cfg, f));
        fclose(f);
        assert_ch_ok(load_args(&back, k1, 2, "--config", path, (const char *)NULL));
        double a, b;
        assert_ch_ok(ch_config_get_double(back, "x", &b));
        assert_ch_ok(ch_config_get_double(cfg, "x", &a));
        assert_true(a == b && a == vals[i]);
        const char *const *items;
        int n = -1;
        assert_ch_ok(ch_config_get_strlist(back, "e.list", &items, &n));
        assert_int_equal(n, 0); /* empty list dumps as [] and reads back */
        ch_config_destroy(cfg);
        ch_config_destroy(back);
    }
    unlink(path);
}

/* ---- several tables (ch_config_load_tables): a job's and its objects' */

/* ch_config_compare_dump: the keys whose values differ from a saved dump
 * (floats by their dump text: 0.1 and 0.30000000000000004 differ; strings,
 * lists, int64), in key order; a key
 * the dump lacks only when set to another value than its default; a dump that does not parse is
 * CH_ERR_FORMAT naming the line. */
static void test_compare_dump(void **state)
{
    (void)state;
    ch_config_t *saved = NULL, *now = NULL;
    assert_ch_ok(LOAD(&saved, "--train.lr=0.1", "--data.files=p,q"));
    char *text = NULL;
    assert_ch_ok(ch_config_dump_string(saved, &text));
    ch_config_change_t *ch = NULL;
    int n = -1;
    assert_ch_ok(ch_config_compare_dump(saved, text, &ch, &n));
    assert_int_equal(n, 0); /* the same configuration */
    ch_config_changes_free(ch, n);

    assert_ch_ok(LOAD(&now, "--train.lr=0.30000000000000004", "--data.files=p",
                      "--data.max_bytes=1099511627777", "--train.optimizer=adam"));
    assert_ch_ok(ch_config_compare_dump(now, text, &ch, &n));
    assert_int_equal(n, 4);
    assert_string_equal(ch[0].name, "data.files");
    assert_string_equal(ch[0].saved, "[ \"p\", \"q\" ]");
    assert_string_equal(ch[0].now, "[ \"p\" ]");
    assert_string_equal(ch[1].name, "data.max_bytes");
    assert_string_equal(ch[1].saved, "1099511627776L");
    assert_string_equal(ch[1].now, "1099511627777L");
    assert_string_equal(ch[2].name, "train.lr");
    assert_string_equal(ch[2].saved, "0.1");
    assert_string_equal(ch[2].now, "0.30000000000000004");
    assert_string_equal(ch[3].name, "train.optimizer");
    assert_string_equal(ch[3].saved, "\"sgd\"");
    assert_string_equal(ch[3].now, "\"adam\"");
    ch_config_changes_free(ch, n);

    /* a dump without the key "seed" (an older table): only an explicit
     * value counts as a change */
    char *cut = strstr(text, "seed = ");
    assert_non_null(cut);
    cut[0] = '#';
    assert_ch_ok(ch_config_compare_dump(saved, text, &ch, &n));
    assert_int_equal(n, 0);
    ch_config_changes_free(ch, n);
    ch_config_destroy(now);
    assert_ch_ok(LOAD(&now, "--train.lr=0.1", "--data.files=p,q", "--seed=3"));
    assert_ch_ok(ch_config_compare_dump(now, text, &ch, &n));
    assert_int_equal(n, 1);
    assert_string_equal(ch[0].name, "seed");
    assert_null(ch[0].saved);
    assert_string_equal(ch[0].now, "3");
    ch_config_changes_free(ch, n);
    /* ... and an explicit value equal to the default is the same run (a
     * config file that lists the newer key with its default) */
    ch_config_destroy(now);
    assert_ch_ok(LOAD(&now, "--train.lr=0.1", "--data.files=p,q", "--seed=0")); /* its default */
    assert_ch_ok(ch_config_compare_dump(now, text, &ch, &n));
    assert_int_equal(n, 0);
    ch_config_changes_free(ch, n);

    assert_ch_error(ch_config_compare_dump(now, "train = { lr = ; };", &ch, &n), CH_ERR_FORMAT,
                    "saved configuration: line 1: ");
    assert_null(ch);
    free(text);
    ch_config_destroy(now);
    ch_config_destroy(saved);
}

/* ch_config_dump_string_quiet: the named keys are left out while they hold
 * their default (unset or set to it), written otherwise; the rest is
 * ch_config_dump_string's text; compare_dump takes the left-out keys as
 * their defaults. */
static void test_dump_quiet(void **state)
{
    (void)state;
    const char *quiet[] = {"seed", "train.optimizer"};
    ch_config_t *cfg = NULL;
    char *full = NULL, *text = NULL;
    assert_ch_ok(LOAD(&cfg, "--train.lr=0.1", "--seed=0"));
    assert_ch_ok(ch_config_dump_string(cfg, &full));
    assert_ch_ok(ch_config_dump_string_quiet(cfg, quiet, 2, &text));
    assert_non_null(strstr(full, "seed = 0;"));
    assert_non_null(strstr(full, "optimizer = \"sgd\";"));
    assert_null(strstr(text, "seed ="));
    assert_null(strstr(text, "optimizer ="));
    assert_non_null(strstr(text, "lr = 0.1"));
    /* the text is the full dump less those two lines */
    assert_int_equal(strlen(full) - strlen(text),
                     strlen("seed = 0;  # command line (--seed=0)\n") +
                         strlen("  optimizer = \"sgd\";  # default\n"));
    ch_config_change_t *ch = NULL;
    int n = -1;
    assert_ch_ok(ch_config_compare_dump(cfg, text, &ch, &n));
    assert_int_equal(n, 0);
    ch_config_changes_free(ch, n);
    free(text);
    free(full);
    ch_config_destroy(cfg);
    /* set to another value: written, and a run with the default differs */
    assert_ch_ok(LOAD(&cfg, "--train.optimizer=adam"));
    assert_ch_ok(ch_config_dump_string_quiet(cfg, quiet, 2, &text));
    assert_non_null(strstr(text, "optimizer = \"adam\";"));
    ch_config_t *now = NULL;
    assert_ch_ok(LOAD(&now, "--seed=0"));
    assert_ch_ok(ch_config_compare_dump(now, text, &ch, &n));
    assert_int_equal(n, 1);
    assert_string_equal(ch[0].name, "train.optimizer");
    assert_string_equal(ch[0].saved, "\"adam\"");
    ch_config_changes_free(ch, n);
    free(text);
    ch_config_destroy(now);
    assert_ch_error(ch_config_dump_string_quiet(cfg, NULL, 1, &text), CH_ERR_INVALID, "quiet");
    ch_config_destroy(cfg);
}

static const ch_config_key_t job_keys[] = {
    {"train.lr", CH_CFG_FLOAT, "0.01", 0, 10, "Base learning rate."},
    {"output.dir", CH_CFG_STRING, "runs", CH_CFG_NO_RANGE, "Output directory."},
};
static const ch_config_key_t object_keys[] = {
    {"compute.bf16", CH_CFG_BOOL, "false", CH_CFG_NO_RANGE, "bf16 autocast."},
    {"compute.gpu_workspace_mb", CH_CFG_INT, "1024", 1, 1048576, "Workspace cap in MiB."},
};
static const ch_config_key_t clash_keys[] = {
    {"train.lr", CH_CFG_FLOAT, "0.1", 0, 10, "Same name as the job's key."},
};

static void test_tables(void **state)
{
    (void)state;
    const ch_config_table_t tables[] = {{"train", job_keys, 2}, {"compute", object_keys, 2}};
    char *argv[] = {(char *)"cohort-test", (char *)"--compute.gpu_workspace_mb=64",
                    (char *)"--train.lr", (char *)"0.5", NULL};
    ch_config_t *cfg = NULL;
    assert_ch_ok(ch_config_load_tables(tables, 2, "summary", 4, argv, &cfg));
    double lr = 0;
    int mb = 0, bf16 = 1;
    const char *dir = NULL;
    assert_ch_ok(ch_config_get_double(cfg, "train.lr", &lr));
    assert_ch_ok(ch_config_get_int(cfg, "compute.gpu_workspace_mb", &mb));
    assert_ch_ok(ch_config_get_bool(cfg, "compute.bf16", &bf16));
    assert_ch_ok(ch_config_get_string(cfg, "output.dir", &dir));
    assert_true(lr == 0.5);
    assert_int_equal(mb, 64);
    assert_int_equal(bf16, 0);
    assert_string_equal(dir, "runs");
    assert_string_equal(ch_config_source(cfg, "compute.gpu_workspace_mb"),
                        "command line (--compute.gpu_workspace_mb=64)");
    /* the dump covers every table's keys */
    char *text = NULL;
    assert_ch_ok(ch_config_dump_string(cfg, &text));
    assert_non_null(strstr(text, "gpu_workspace_mb = 64;"));
    assert_non_null(strstr(text, "lr = 0.5;"));
    free(text);
    ch_config_destroy(cfg);

    /* an unknown option suggests keys of every table */
    char *bad[] = {(char *)"cohort-test", (char *)"--compute.gpu_workspace=64", NULL};
    assert_ch_error(ch_config_load_tables(tables, 2, NULL, 2, bad, &cfg), CH_ERR_CONFIG,
                    "compute.gpu_workspace_mb");
    assert_null(cfg);

    /* a key in two tables is a bug of the job: named */
    const ch_config_table_t clash[] = {{"train", job_keys, 2}, {"other", clash_keys, 1}};
    assert_ch_error(ch_config_load_tables(clash, 2, NULL, 1, argv, &cfg), CH_ERR_INVALID,
                    "train.lr");
    assert_null(cfg);
    /* no tables: an empty configuration */
    assert_ch_ok(ch_config_load_tables(NULL, 0, NULL, 1, argv, &cfg));
    ch_config_destroy(cfg);
    assert_ch_error(ch_config_load_tables(NULL, 1, NULL, 1, argv, &cfg), CH_ERR_INVALID,
                    "bad table list");
}

static void test_help_tables(void **state)
{
    (void)state;
    const ch_config_table_t tables[] = {{"train", job_keys, 2}, {"compute", object_keys, 2}};
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    ch_config_print_help_tables(tables, 2, "cohort-x", "One line about cohort-x.", f);
    fclose(f);
    /* usage, the summary under it, then the groups in the given order, each
     * key under its own table's heading */
    assert_int_equal(strncmp(buf, "Usage: cohort-x ", 16), 0);
    assert_non_null(strstr(buf, "]\nOne line about cohort-x.\n\nOptions:"));
    char *t = strstr(buf, "\ntrain:\n"), *c = strstr(buf, "\ncompute:\n");
    assert_non_null(t);
    assert_non_null(c);
    assert_true(t < c);
    char *lr = strstr(buf, "--train.lr  (float"), *ws = strstr(buf, "--compute.gpu_workspace_mb");
    assert_true(t < lr && lr < c);
    assert_true(c < ws);
    /* sorted by name within a table */
    assert_true(strstr(buf, "--output.dir") < lr);
    assert_true(strstr(buf, "--compute.bf16") < ws);
    free(buf);
}

/* ------------------------------------------------------------ short options */

/* The shapes of the jobs' short options: --resume [PATH] (cohort-train),
 * --resume-allow LIST, a bool flag with an implicit value (cohort-farm's
 * --resume), one-letter options (cohort-bench's -b8, -c). */
static const ch_config_key_t short_keys[] = {
    {"output.resume", CH_CFG_STRING, "", CH_CFG_NO_RANGE, "Resume file.", "--resume", "auto"},
    {"output.resume_allow", CH_CFG_STRLIST, "", CH_CFG_NO_RANGE, "Keys that may differ.",
     "--resume-allow"},
    {"farm.again", CH_CFG_BOOL, "false", CH_CFG_NO_RANGE, "Continue.", "--again", "true"},
    {"bench.bytes", CH_CFG_STRING, "8", CH_CFG_NO_RANGE, "Size.", "-b"},
    {"bench.check", CH_CFG_BOOL, "true", CH_CFG_NO_RANGE, "Check.", "-c"},
    {"bench.iters", CH_CFG_INT, "5", 1, 100, "Iterations.", "-n"},
    {"train.lr", CH_CFG_FLOAT, "0.1", 0, 10, "Learning rate."},
};
#define NSHORT ((int)(sizeof short_keys / sizeof short_keys[0]))
#define LOAD_SHORT(cfg, ...) load_args(cfg, short_keys, NSHORT, __VA_ARGS__, (const char *)NULL)

/* cohort-reduce's shape: bare words are input.files, --op, a bool --resume. */
static const ch_config_key_t pos_keys[] = {
    {"input.files", CH_CFG_STRLIST, "", CH_CFG_NO_RANGE, "Inputs.", "--files", NULL, 1},
    {"reduce.op", CH_CFG_STRING, "sum", CH_CFG_NO_RANGE, "Operation.", "--op"},
    {"output.resume", CH_CFG_BOOL, "false", CH_CFG_NO_RANGE, "Resume.", "--resume"},
    {"reduce.ddof", CH_CFG_INT64, "0", 0, 1e18, "ddof.", "--ddof"},
};
#define NPOS ((int)(sizeof pos_keys / sizeof pos_keys[0]))
#define LOAD_POS(cfg, ...) load_args(cfg, pos_keys, NPOS, __VA_ARGS__, (const char *)NULL)

/* string key `key` of cfg is `value`, set by `source` (NULL: not checked) */
static void check_string(ch_config_t *cfg, const char *key, const char *value,
                         const char *source)
{
    const char *v;
    assert_ch_ok(ch_config_get_string(cfg, key, &v));
    assert_string_equal(v, value);
    if (source) assert_string_equal(ch_config_source(cfg, key), source);
}

static void check_bool(ch_config_t *cfg, const char *key, int value)
{
    int v;
    assert_ch_ok(ch_config_get_bool(cfg, key, &v));
    assert_int_equal(v, value);
}

static void test_alias(void **state)
{
    (void)state;
    ch_config_t *cfg = NULL;
    /* alone: the implicit value; the source reads as the key's own option */
    assert_ch_ok(LOAD_SHORT(&cfg, "--resume"));
    check_string(cfg, "output.resume", "auto", "command line (--output.resume=auto)");
    ch_config_destroy(cfg);
    assert_ch_ok(LOAD_SHORT(&cfg, "--resume", "/r/resume.safetensors"));
    check_string(cfg, "output.resume", "/r/resume.safetensors",
                 "command line (--output.resume /r/resume.safetensors)");
    ch_config_destroy(cfg);
    assert_ch_ok(LOAD_SHORT(&cfg, "--resume=/r/x"));
    check_string(cfg, "output.resume", "/r/x", "command line (--output.resume=/r/x)");
    ch_config_destroy(cfg);
    /* a following option is not its value */
    double lr;
    assert_ch_ok(LOAD_SHORT(&cfg, "--resume", "--train.lr", "0.5"));
    check_string(cfg, "output.resume", "auto", NULL);
    assert_ch_ok(ch_config_get_double(cfg, "train.lr", &lr));
    assert_true(lr == 0.5);
    ch_config_destroy(cfg);
    /* the key's own option keeps its rules: it needs a value */
    assert_ch_error(LOAD_SHORT(&cfg, "--output.resume"), CH_ERR_CONFIG,
                    "--output.resume needs a value (string)");
    assert_null(cfg);
    assert_one_line();

    /* an alias without an implicit value: as --NAME */
    const char *const *items;
    int n;
    assert_ch_ok(LOAD_SHORT(&cfg, "--resume-allow", "optimizer.lr,train.epochs"));
    assert_ch_ok(ch_config_get_strlist(cfg, "output.resume_allow", &items, &n));
    assert_int_equal(n, 2);
    assert_string_equal(items[1], "train.epochs");
    ch_config_destroy(cfg);
    assert_ch_ok(LOAD_SHORT(&cfg, "--resume-allow=optimizer.lr"));
    assert_ch_ok(ch_config_get_strlist(cfg, "output.resume_allow", &items, &n));
    assert_int_equal(n, 1);
    assert_string_equal(ch_config_source(cfg, "output.resume_allow"),
                        "command line (--output.resume_allow=optimizer.lr)");
    ch_config_destroy(cfg);
    assert_ch_error(LOAD_SHORT(&cfg, "--resume-allow"), CH_ERR_CONFIG,
                    "--output.resume_allow needs a value (strlist)");
    /* "--resume-allow" is not "--resume" followed by "-allow" */
    assert_ch_error(LOAD_SHORT(&cfg, "--resume-allowx"), CH_ERR_CONFIG,
                    "unknown option '--resume-allowx'");

    /* a bool alias with an implicit value is a flag: it takes no word */
    assert_ch_ok(LOAD_SHORT(&cfg, "--again"));
    check_bool(cfg, "farm.again", 1);
    assert_string_equal(ch_config_source(cfg, "farm.again"), "command line (--farm.again=true)");
    ch_config_destroy(cfg);
    assert_ch_ok(LOAD_SHORT(&cfg, "--again=false"));
    check_bool(cfg, "farm.again", 0);
    ch_config_destroy(cfg);
    assert_ch_error(LOAD_SHORT(&cfg, "--again", "false"), CH_ERR_CONFIG,
                    "unexpected argument 'false'");
    assert_one_line();
    assert_ch_ok(LOAD_SHORT(&cfg, "--farm.again", "false")); /* the key's own option */
    check_bool(cfg, "farm.again", 0);
    ch_config_destroy(cfg);

    /* one letter: -b V, -bV; a bool letter as a bool key */
    int iters;
    assert_ch_ok(LOAD_SHORT(&cfg, "-b64K", "-n", "7", "-c"));
    check_string(cfg, "bench.bytes", "64K", "command line (--bench.bytes=64K)");
    assert_ch_ok(ch_config_get_int(cfg, "bench.iters", &iters));
    assert_int_equal(iters, 7);
    assert_string_equal(ch_config_source(cfg, "bench.iters"), "command line (--bench.iters 7)");
    check_bool(cfg, "bench.check", 1);
    ch_config_destroy(cfg);
    assert_ch_ok(LOAD_SHORT(&cfg, "-c", "0", "-b", "1M"));
    check_bool(cfg, "bench.check", 0);
    check_string(cfg, "bench.bytes", "1M", NULL);
    ch_config_destroy(cfg);
    assert_ch_error(LOAD_SHORT(&cfg, "-n0"), CH_ERR_CONFIG,
                    "--bench.iters=0: bench.iters = 0 is out of range [1, 100]");
    assert_ch_error(LOAD_SHORT(&cfg, "-b"), CH_ERR_CONFIG, "--bench.bytes needs a value (string)");
    assert_ch_error(LOAD_SHORT(&cfg, "-x"), CH_ERR_CONFIG, "unexpected argument '-x'");
    assert_one_line();

    /* aliases are options, not keys: --set and files know only the names */
    assert_ch_error(LOAD_SHORT(&cfg, "--set", "resume=auto"), CH_ERR_CONFIG,
                    "unknown key 'resume'");
    /* later options win, alias or not */
    assert_ch_ok(LOAD_SHORT(&cfg, "--output.resume=a", "--resume", "b", "--set",
                            "output.resume=c", "--resume"));
    check_string(cfg, "output.resume", "auto", NULL);
    ch_config_destroy(cfg);
    /* -h stays help */
    assert_ch_ok(LOAD_SHORT(&cfg, "--resume", "-h"));
    assert_int_equal(ch_config_help_requested(cfg), 1);
    ch_config_destroy(cfg);
}

static void test_positional(void **state)
{
    (void)state;
    ch_config_t *cfg = NULL;
    const char *const *items;
    int n;
    assert_ch_ok(LOAD_POS(&cfg, "a.npy", "--op", "mean", "b.npy"));
    assert_ch_ok(ch_config_get_strlist(cfg, "input.files", &items, &n));
    assert_int_equal(n, 2);
    assert_string_equal(items[0], "a.npy");
    assert_string_equal(items[1], "b.npy");
    assert_string_equal(ch_config_source(cfg, "input.files"),
                        "command line (--input.files=a.npy,b.npy)");
    check_string(cfg, "reduce.op", "mean", "command line (--reduce.op mean)");
    ch_config_destroy(cfg);
    /* words and an option for the same key: one would silently drop the
     * other's files, whatever the order, so it is an error naming both */
    assert_ch_error(LOAD_POS(&cfg, "a.npy", "--files=z.npy"), CH_ERR_CONFIG,
                    "--input.files=z.npy and the arguments 'a.npy' both give input.files");
    assert_null(cfg);
    assert_one_line();
    assert_ch_error(LOAD_POS(&cfg, "--set", "input.files=y.npy", "a.npy", "b.npy"), CH_ERR_CONFIG,
                    "--set input.files=y.npy and the arguments 'a.npy,b.npy' both give input.files");
    assert_ch_ok(LOAD_POS(&cfg, "--files", "z.npy"));
    assert_ch_ok(ch_config_get_strlist(cfg, "input.files", &items, &n));
    assert_int_equal(n, 1);
    assert_string_equal(items[0], "z.npy");
    ch_config_destroy(cfg);
    /* no words: the default */
    assert_ch_ok(LOAD_POS(&cfg, "--op=max"));
    assert_string_equal(ch_config_source(cfg, "input.files"), "default");
    ch_config_destroy(cfg);

    /* a bool takes the next word only when it is true or false: any other
     * word is an argument */
    assert_ch_ok(LOAD_POS(&cfg, "--resume", "x.npy"));
    check_bool(cfg, "output.resume", 1);
    assert_ch_ok(ch_config_get_strlist(cfg, "input.files", &items, &n));
    assert_int_equal(n, 1);
    ch_config_destroy(cfg);
    assert_ch_ok(LOAD_POS(&cfg, "--resume", "false", "x.npy"));
    check_bool(cfg, "output.resume", 0);
    ch_config_destroy(cfg);
    assert_ch_ok(LOAD_POS(&cfg, "--output.resume", "yes", "x.npy"));
    check_bool(cfg, "output.resume", 1);
    assert_ch_ok(ch_config_get_strlist(cfg, "input.files", &items, &n));
    assert_int_equal(n, 2);
    assert_string_equal(items[0], "yes");
    ch_config_destroy(cfg);
    /* a non-bool option takes the next word, even one that looks like a file */
    assert_ch_ok(LOAD_POS(&cfg, "--op", "x.npy"));
    check_string(cfg, "reduce.op", "x.npy", NULL);
    ch_config_destroy(cfg);

    /* errors: one line, naming the option */
    assert_ch_error(LOAD_POS(&cfg, "x.npy", "--op"), CH_ERR_CONFIG,
                    "--reduce.op needs a value (string)");
    /* a short option's value is not the next option (--out --keepdims wrote
     * a file named --keepdims); --op=--x is still a value */
    assert_ch_error(LOAD_POS(&cfg, "--op", "--resume", "x.npy"), CH_ERR_CONFIG,
                    "--reduce.op needs a value (string), not the option '--resume'");
    assert_one_line();
    assert_ch_ok(LOAD_POS(&cfg, "--op=--x", "x.npy"));
    check_string(cfg, "reduce.op", "--x", NULL);
    ch_config_destroy(cfg);
    assert_ch_error(LOAD_POS(&cfg, "--ddof", "zz", "x.npy"), CH_ERR_CONFIG,
                    "--reduce.ddof zz: reduce.ddof: expected int64 (a decimal integer), got 'zz'");
    assert_one_line();
    assert_ch_error(LOAD_POS(&cfg, "-", "x.npy"), CH_ERR_CONFIG, "unexpected argument '-'");
    assert_ch_error(LOAD_POS(&cfg, "--foo", "x.npy"), CH_ERR_CONFIG, "unknown option '--foo'");
    /* without a positional key a word stays an error */
    assert_ch_error(LOAD_SHORT(&cfg, "x.npy"), CH_ERR_CONFIG, "unexpected argument 'x.npy'");
    assert_one_line();
}

static void test_bad_alias_tables(void **state)
{
    (void)state;
    ch_config_t *cfg = NULL;
    static const ch_config_key_t dotted[] = {
        {"a.b", CH_CFG_INT, "1", CH_CFG_NO_RANGE, "", "--a.b"}};
    static const ch_config_key_t letters[] = {{"a.b", CH_CFG_INT, "1", CH_CFG_NO_RANGE, "", "-bb"}};
    static const ch_config_key_t nodash[] = {{"a.b", CH_CFG_INT, "1", CH_CFG_NO_RANGE, "", "b"}};
    static const ch_config_key_t reserved[] = {
        {"a.b", CH_CFG_INT, "1", CH_CFG_NO_RANGE, "", "--config"}};
    static const ch_config_key_t help[] = {{"a.b", CH_CFG_BOOL, "false", CH_CFG_NO_RANGE, "", "-h"}};
    static const ch_config_key_t keyname[] = {
        {"a.b", CH_CFG_INT, "1", CH_CFG_NO_RANGE, ""},
        {"seed", CH_CFG_INT, "1", CH_CFG_NO_RANGE, ""},
        {"c.d", CH_CFG_INT, "1", CH_CFG_NO_RANGE, "", "--seed"},
    };
    static const ch_config_key_t twice[] = {
        {"a.b", CH_CFG_INT, "1", CH_CFG_NO_RANGE, "", "--b"},
        {"c.b", CH_CFG_INT, "1", CH_CFG_NO_RANGE, "", "--b"},
    };
    static const ch_config_key_t orphan[] = {
        {"a.b", CH_CFG_STRING, "", CH_CFG_NO_RANGE, "", NULL, "auto"}};
    static const ch_config_key_t badimplicit[] = {
        {"a.b", CH_CFG_INT, "1", 1, 5, "", "--b", "9"}};
    static const ch_config_key_t twopos[] = {
        {"a.b", CH_CFG_STRLIST, "", CH_CFG_NO_RANGE, "", NULL, NULL, 1},
        {"a.c", CH_CFG_STRING, "", CH_CFG_NO_RANGE, "", NULL, NULL, 1},
    };
    static const ch_config_key_t intpos[] = {{"a.b", CH_CFG_INT, "1", CH_CFG_NO_RANGE, "", NULL, NULL, 1}};
    assert_ch_error(load_args(&cfg, dotted, 1, (const char *)NULL), CH_ERR_INVALID,
                    "key a.b: invalid alias '--a.b'");
    assert_ch_error(load_args(&cfg, letters, 1, (const char *)NULL), CH_ERR_INVALID,
                    "invalid alias '-bb'");
    assert_ch_error(load_args(&cfg, nodash, 1, (const char *)NULL), CH_ERR_INVALID,
                    "invalid alias 'b'");
    assert_ch_error(load_args(&cfg, reserved, 1, (const char *)NULL), CH_ERR_INVALID,
                    "alias '--config' is reserved");
    assert_ch_error(load_args(&cfg, help, 1, (const char *)NULL), CH_ERR_INVALID,
                    "alias '-h' is reserved");
    assert_ch_error(load_args(&cfg, keyname, 3, (const char *)NULL), CH_ERR_INVALID,
                    "alias '--seed' of key c.d is the option of key seed");
    assert_ch_error(load_args(&cfg, twice, 2, (const char *)NULL), CH_ERR_INVALID,
                    "alias '--b' is given to keys a.b and c.b");
    assert_ch_error(load_args(&cfg, orphan, 1, (const char *)NULL), CH_ERR_INVALID,
                    "key a.b has an implicit value 'auto' but no alias");
    assert_ch_error(load_args(&cfg, badimplicit, 1, (const char *)NULL), CH_ERR_INVALID,
                    "implicit value of a.b: a.b = 9 is out of range [1, 5]");
    assert_ch_error(load_args(&cfg, twopos, 2, (const char *)NULL), CH_ERR_INVALID,
                    "keys a.b and a.c are both positional");
    assert_ch_error(load_args(&cfg, intpos, 1, (const char *)NULL), CH_ERR_INVALID,
                    "key a.b is positional but int");
    assert_null(cfg);
    /* across tables: an alias of one table against a key of another */
    static const ch_config_key_t seed_key[] = {{"seed", CH_CFG_INT, "1", CH_CFG_NO_RANGE, ""}};
    static const ch_config_key_t seed_alias[] = {
        {"c.seed", CH_CFG_INT, "1", CH_CFG_NO_RANGE, "", "--seed"}};
    const ch_config_table_t tables[] = {{"a", seed_key, 1}, {"b", seed_alias, 1}};
    char *argv[] = {(char *)"x", NULL};
    assert_ch_error(ch_config_load_tables(tables, 2, NULL, 1, argv, &cfg), CH_ERR_INVALID,
                    "alias '--seed' of key c.seed is the option of key seed");
}

static char *help_text(const ch_config_table_t *tables, int n_tables)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    if (n_tables < 0)
        ch_config_print_help(tables[0].keys, tables[0].n_keys, "cohort-x", f);
    else
        ch_config_print_help_tables(tables, n_tables, "cohort-x", NULL, f);
    fclose(f);
    return buf;
}

static void test_help_aliases(void **state)
{
    (void)state;
    const ch_config_table_t shorts = {"s", short_keys, NSHORT}, pos = {"r", pos_keys, NPOS},
                            plain = {"p", keys, NKEYS};
    char *buf = help_text(&shorts, -1);
    /* one line each, in table order, between the options and the keys */
    const char *sec = strstr(buf, "\n\nShort options and arguments:\n"
                                  "  --resume [RESUME]       alias of --output.resume; alone: "
                                  "--output.resume=auto\n"
                                  "  --resume-allow RESUME_ALLOW\n"
                                  "                          alias of --output.resume_allow\n"
                                  "  --again                 alias of --farm.again; alone: "
                                  "--farm.again=true\n"
                                  "  -b BYTES                alias of --bench.bytes\n"
                                  "  -c [true|false]         alias of --bench.check\n"
                                  "  -n ITERS                alias of --bench.iters\n\n"
                                  "Keys (");
    assert_non_null(sec);
    assert_true(strstr(buf, "--help-man") < sec);
    free(buf);
    /* the alias and the positional words of one key: two lines */
    const ch_config_table_t two[] = {plain, pos};
    buf = help_text(two, 2);
    assert_non_null(strstr(buf, "Short options and arguments:\n"
                                "  --files FILES           alias of --input.files\n"
                                "  FILES...                non-option words, as "
                                "--input.files=A,B,...\n"
                                "  --op OP                 alias of --reduce.op\n"
                                "  --resume [true|false]   alias of --output.resume\n"
                                "  --ddof DDOF             alias of --reduce.ddof\n\n"
                                "Keys (command line > --config file > default), by owner:\n"));
    free(buf);
    /* no aliases: no section, the help as before */
    buf = help_text(&plain, -1);
    assert_null(strstr(buf, "Short options"));
    assert_non_null(strstr(buf, "and exit.\n\nKeys (command line > --config file > default):\n"));
    free(buf);
    /* the man page lists them under OPTIONS */
    buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    const ch_man_page_t page = {.prog = "cohort-x", .tables = two, .n_tables = 2};
    assert_ch_ok(ch_man_write(f, &page));
    fclose(f);
    const char *opts = strstr(buf, ".SH OPTIONS\n"), *keys_sec = strstr(buf, ".SH KEYS\n");
    const char *files = strstr(buf, ".TP\n\\fB\\-\\-files\\fR \\fIFILES\\fR\n"
                                    "Alias of \\-\\-input.files.\n"
                                    ".TP\n\\fIFILES...\\fR\n"
                                    "Non\\-option words, as \\-\\-input.files=A,B,....\n");
    assert_non_null(opts);
    assert_non_null(files);
    assert_true(opts < files && files < keys_sec);
    assert_non_null(strstr(buf, ".TP\n\\fB\\-\\-resume\\fR [\\fItrue\\fR|\\fIfalse\\fR]\n"
                                "Alias of \\-\\-output.resume.\n"));
    free(buf);
    const ch_man_page_t page2 = {.prog = "cohort-x", .tables = &shorts, .n_tables = 1};
    buf = NULL;
    f = open_memstream(&buf, &len);
    assert_non_null(f);
    assert_ch_ok(ch_man_write(f, &page2));
    fclose(f);
    assert_non_null(strstr(buf, ".TP\n\\fB\\-\\-resume\\fR [\\fIRESUME\\fR]\n"
                                "Alias of \\-\\-output.resume; alone: "
                                "\\-\\-output.resume=auto.\n"));
    assert_non_null(strstr(buf, ".TP\n\\fB\\-b\\fR \\fIBYTES\\fR\nAlias of \\-\\-bench.bytes.\n"));
    free(buf);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_file_values),
        cmocka_unit_test(test_int_literal_for_float),
        cmocka_unit_test(test_precedence_order),
        cmocka_unit_test(test_help),
        cmocka_unit_test(test_unknown_key_in_file),
        cmocka_unit_test(test_wrong_type_in_file),
        cmocka_unit_test(test_strlist_numbers),
        cmocka_unit_test(test_out_of_range_in_file),
        cmocka_unit_test(test_int_literal_too_big_for_libconfig),
        cmocka_unit_test(test_include_relative_to_file),
        cmocka_unit_test(test_malformed_and_missing_file),
        cmocka_unit_test(test_command_line_errors),
        cmocka_unit_test(test_required_key),
        cmocka_unit_test(test_bad_tables),
        cmocka_unit_test(test_lookup_errors),
        cmocka_unit_test(test_choice),
        cmocka_unit_test(test_dump_round_trip),
        cmocka_unit_test(test_dump_floats_exact),
        cmocka_unit_test(test_compare_dump),
        cmocka_unit_test(test_dump_quiet),
        cmocka_unit_test(test_tables),
        cmocka_unit_test(test_help_tables),
        cmocka_unit_test(test_alias),
        cmocka_unit_test(test_positional),
        cmocka_unit_test(test_bad_alias_tables),
        cmocka_unit_test(test_help_aliases),
    };
    return ch_test_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
