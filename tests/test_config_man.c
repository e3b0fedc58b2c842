/* Tests for framework/core/config_man: the man page made from key tables
 * (roff escaping, sections, table subsections, key order and descriptions
 * as in --help, NAME and DESCRIPTION from the summary, errors) and
 * --help-man through ch_config_load and ch_config_load_tables. The rendered pages are checked with man(1) by
 * tests/test_install.sh. Single process. */
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

static const ch_config_key_t train_keys[] = {
    {"train.lr", CH_CFG_FLOAT, "0.01", 0, 10, "Base learning rate before scaling by world size."},
    {"train.epochs", CH_CFG_INT, "90", 1, 100000, ".starts with a dot, has a back\\slash."},
    {"data.path", CH_CFG_STRING, NULL, CH_CFG_NO_RANGE, "Dataset directory (required)."},
    {"data.max-bytes", CH_CFG_INT64, "1024", 0, INFINITY, "'quoted start; a-b."},
};
static const ch_config_key_t dist_keys[] = {
    {"dist.warning_signal", CH_CFG_STRING, "USR2", CH_CFG_NO_RANGE, "Preemption warning."},
};

/* The page of `page` as a malloc'd string. */
static char *page_text(const ch_man_page_t *page)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    assert_ch_ok(ch_man_write(f, page));
    assert_int_equal(fclose(f), 0);
    return buf;
}

static void test_config_page(void **state)
{
    const ch_config_table_t tables[] = {{"train", train_keys, 4}, {"runtime", dist_keys, 1}};
    const ch_man_page_t page = {.prog = "cohort-x", .summary = "does x over the ranks",
                                .tables = tables, .n_tables = 2,
                                .see_also = "cohort-train(1)"};
    char *t = page_text(&page);
    /* header, NAME line for whatis, no date (reproducible) */
    assert_non_null(strstr(t, ".TH COHORT\\-X 1 \"\" \"cohort " PACKAGE_VERSION "\""));
    assert_non_null(strstr(t, ".SH NAME\ncohort\\-x \\- does x over the ranks\n"));
    const char *sections[] = {".SH SYNOPSIS", ".SH DESCRIPTION", ".SH OPTIONS", ".SH KEYS",
                              ".SH \"CONFIGURATION FILES\"", ".SH \"EXIT STATUS\"",
                              ".SH ENVIRONMENT", ".SH \"SEE ALSO\""};
    const char *prev = t;
    for (size_t i = 0; i < sizeof sections / sizeof *sections; i++) {
        const char *at = strstr(t, sections[i]);
        assert_non_null(at);
        assert_true(at > prev); /* in man(7)'s order */
        prev = at;
    }
    /* the config options, --help-man among them; every exit code */
    assert_non_null(strstr(t, "\\fB\\-\\-config\\fR \\fIFILE\\fR"));
    assert_non_null(strstr(t, "\\fB\\-\\-help\\-man\\fR"));
    for (int code = 0; code <= 4; code++) {
        char want[16];
        snprintf(want, sizeof want, ".TP\n.B %d\n", code);
        assert_non_null(strstr(t, want));
    }
    /* one subsection per table, in the given order; keys sorted as --help
     * sorts them (data.* before train.*; epochs before lr) */
    const char *ss_train = strstr(t, ".SS \"train\""), *ss_rt = strstr(t, ".SS \"runtime\"");
    assert_non_null(ss_train);
    assert_non_null(ss_rt);
    assert_true(ss_train < ss_rt);
    const char *k_path = strstr(t, "\\fB\\-\\-data.path\\fR\n(string, required)\n");
    const char *k_bytes =
        strstr(t, "\\fB\\-\\-data.max\\-bytes\\fR\n(int64, default 1024, range [0, inf])\n");
    const char *k_ep =
        strstr(t, "\\fB\\-\\-train.epochs\\fR\n(int, default 90, range [1, 100000])\n");
    const char *k_lr = strstr(t, "\\fB\\-\\-train.lr\\fR\n(float, default 0.01, range [0, 10])\n");
    const char *k_sig = strstr(t, "\\fB\\-\\-dist.warning_signal\\fR\n(string, default \"USR2\")\n");
    assert_non_null(k_path);
    assert_non_null(k_bytes);
    assert_non_null(k_ep);
    assert_non_null(k_lr);
    assert_non_null(k_sig);
    assert_true(ss_train < k_bytes && k_bytes < k_path && k_path < k_ep && k_ep < k_lr &&
                k_lr < ss_rt && ss_rt < k_sig);
    /* roff escapes: a help line starting with '.' or '\'' is guarded, a
     * backslash is \e, a minus is \- */
    assert_non_null(strstr(t, "\n\\&.starts with a dot, has a back\\eslash.\n"));
    assert_non_null(strstr(t, "\n\\&'quoted start; a\\-b.\n"));
    assert_null(strstr(t, "\n.starts"));
    assert_non_null(strstr(t, "\\fBcohort\\fR(7), cohort\\-train(1), \\fBmpiexec\\fR(1)"));
    free(t);
}

static void test_summary(void **state)
{
    /* NAME: the first sentence, newlines as spaces, without its period;
     * DESCRIPTION: all of it, paragraphs kept */
    ch_man_page_t page = {.prog = "cohort-b",
                          .summary = "All-reduce benchmark: cohort against the\nraw call. "
                                     "Columns: time, busbw.\n\nSecond paragraph."};
    char *t = page_text(&page);
    assert_non_null(strstr(t, ".SH NAME\ncohort\\-b \\- All\\-reduce benchmark: cohort "
                              "against the raw call\n.SH SYNOPSIS\n"));
    assert_non_null(strstr(t, ".SH DESCRIPTION\nAll\\-reduce benchmark: cohort against the\n"
                              "raw call. Columns: time, busbw.\n.PP\nSecond paragraph.\n.PP\n"));
    /* no tables: no KEYS section; the fallback summary */
    assert_null(strstr(t, ".SH KEYS"));
    free(t);
    page.summary = "one sentence.";
    t = page_text(&page);
    assert_non_null(strstr(t, "cohort\\-b \\- one sentence\n"));
    assert_non_null(strstr(t, ".SH DESCRIPTION\none sentence.\n.PP\n"));
    free(t);
    page.summary = NULL;
    t = page_text(&page);
    assert_non_null(strstr(t, "cohort\\-b \\- a cohort batch job\n"));
    assert_non_null(strstr(t, ".SH DESCRIPTION\na cohort batch job.\n"));
    free(t);
}

static void test_errors(void **state)
{
    const ch_config_table_t bad = {"t", NULL, 2};
    ch_man_page_t page = {.prog = "p", .tables = &bad, .n_tables = 1};
    FILE *f = fopen("/dev/null", "w");
    assert_non_null(f);
    assert_ch_error(ch_man_write(f, &page), CH_ERR_INVALID, "table 0 (t)");
    assert_ch_error(ch_man_write(f, NULL), CH_ERR_INVALID, "NULL");
    page.tables = NULL;
    page.n_tables = 0;
    page.prog = "";
    assert_ch_error(ch_man_write(f, &page), CH_ERR_INVALID, "program name");
    page.prog = "p";
    page.n_tables = 1;
    assert_ch_error(ch_man_write(f, &page), CH_ERR_INVALID, "table list");
    fclose(f);
    /* a stream that cannot be written */
    page.n_tables = 0;
    f = fopen("/dev/null", "r");
    assert_non_null(f);
    assert_ch_error(ch_man_write(f, &page), CH_ERR_IO, "man page of p");
    fclose(f);
}

static void test_requested(void **state)
{
    char *a[] = {"prog", "--x=1", "--help-man", NULL};
    assert_int_equal(ch_man_requested(3, a), 1);
    assert_int_equal(ch_man_requested(2, a), 0);
    char *b[] = {"--help-man", "--help-man-not", NULL}; /* argv[0] is the program */
    assert_int_equal(ch_man_requested(2, b), 0);
    assert_int_equal(ch_man_requested(0, NULL), 0);
}

/* Run --help-man through ch_config_load (tables NULL: train_keys alone) or
 * ch_config_load_tables with stdout captured; check the help flag; return
 * the page (malloc'd). */
static char *help_man_text(const ch_config_table_t *tables, int n_tables, const char *summary)
{
    char path[] = "/tmp/cohort-test-man.XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    unlink(path);
    fflush(stdout);
    int saved = dup(1);
    dup2(fd, 1);
    char *argv[] = {"/some/dir/cohort-x", "--config", "/nonexistent.cfg", "--help-man", NULL};
    ch_config_t *cfg = NULL;
    ch_status s = tables ? ch_config_load_tables(tables, n_tables, summary, 4, argv, &cfg)
                         : ch_config_load(train_keys, 4, 4, argv, &cfg);
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    assert_ch_ok(s);
    assert_int_equal(ch_config_help_requested(cfg), 1);
    ch_config_destroy(cfg);
    off_t len = lseek(fd, 0, SEEK_END);
    assert_true(len > 0);
    char *text = malloc((size_t)len + 1);
    assert_non_null(text);
    assert_int_equal(pread(fd, text, (size_t)len, 0), len);
    text[len] = '\0';
    close(fd);
    return text;
}

/* --help-man through ch_config_load and ch_config_load_tables: the page on
 * stdout, the help flag set, no file read; "help-man" is a reserved key. */
static void test_load(void **state)
{
    char *text = help_man_text(NULL, 0, NULL);
    assert_non_null(strstr(text, ".TH COHORT\\-X 1 "));
    assert_non_null(strstr(text, "\\fB\\-\\-train.lr\\fR\n(float, default 0.01, range [0, 10])\n"));
    assert_non_null(strstr(text, "\\fB\\-\\-data.path\\fR\n(string, required)\n"));
    free(text);

    /* the job's summary and titled tables */
    const ch_config_table_t tables[] = {{"train", train_keys, 4}, {"runtime", dist_keys, 1}};
    text = help_man_text(tables, 2, "trains a model. More text.");
    assert_non_null(strstr(text, "cohort\\-x \\- trains a model\n"));
    assert_non_null(strstr(text, ".SS \"train\""));
    assert_non_null(strstr(text, ".SS \"runtime\""));
    assert_non_null(strstr(text, "\\fB\\-\\-dist.warning_signal\\fR\n"));
    free(text);

    const ch_config_key_t reserved[] = {{"help-man", CH_CFG_BOOL, "false", CH_CFG_NO_RANGE, "x"}};
    char *plain[] = {"p", NULL};
    ch_config_t *cfg = NULL;
    assert_ch_error(ch_config_load(reserved, 1, 1, plain, &cfg), CH_ERR_INVALID,
                    "'help-man' is reserved");
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_page), cmocka_unit_test(test_summary),
        cmocka_unit_test(test_errors),      cmocka_unit_test(test_requested),
        cmocka_unit_test(test_load),
    };
    return ch_test_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
