/* cohort: man pages from key tables (see config_man.h). Macros: man(7). */
#include "config.h"

#include "framework/core/config_man.h"
#include "framework/core/config_internal.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

/* Text of n bytes of s with roff escaped: '\' -> \e, '-' -> \- (a minus,
 * so that options copy and paste as ASCII), a leading '.' or '\'' guarded
 * by \& (it would be read as a request). */
static void put_esc_n(FILE *out, const char *s, size_t n, int line_start)
{
    for (size_t i = 0; i < n && s[i]; i++) {
        char ch = s[i];
        if (line_start && (ch == '.' || ch == '\'')) fputs("\\&", out);
        line_start = 0;
        if (ch == '\\')
            fputs("\\e", out);
        else if (ch == '-')
            fputs("\\-", out);
        else
            fputc(ch, out);
    }
}

static void put_esc(FILE *out, const char *s)
{
    put_esc_n(out, s, strlen(s), 0);
}

/* Body text: each input line an output line (escaped; roff fills them into
 * one paragraph), a blank line a new paragraph (.PP). */
static void put_text(FILE *out, const char *text)
{
    const char *p = text;
    while (*p) {
        size_t n = strcspn(p, "\n");
        if (n == 0) {
            while (*p == '\n') p++;
            if (*p) fputs(".PP\n", out);
            continue;
        }
        put_esc_n(out, p, n, 1);
        fputc('\n', out);
        p += n;
        if (*p == '\n' && p[1] != '\n') p++;
    }
}

/* An option's flags: words starting with '-' bold, the others italic, the
 * separators (", ", " ", "=", "|") upright. */
static void put_flags(FILE *out, const char *flags)
{
    const char *p = flags;
    while (*p) {
        size_t sep = strspn(p, ", =|[]");
        if (sep) {
            put_esc_n(out, p, sep, 0);
            p += sep;
            continue;
        }
        size_t n = strcspn(p, ", =|[]");
        fputs(p[0] == '-' ? "\\fB" : "\\fI", out);
        put_esc_n(out, p, n, 0);
        fputs("\\fR", out);
        p += n;
    }
}

static void put_upper(FILE *out, const char *s)
{
    for (; *s; s++) {
        if (*s == '-')
            fputs("\\-", out);
        else
            fputc(toupper((unsigned char)*s), out);
    }
}

/* The options of ch_config_load, as --help shows them. */
static const struct {
    const char *flags, *help;
} config_options[] = {
    {"--config FILE", "Read settings from a libconfig file. May be given several times; "
                      "later files override earlier ones."},
    {"--set KEY=VALUE", "Override one key (any key of KEYS below)."},
    {"--KEY=VALUE, --KEY VALUE",
     "The same as --set KEY=VALUE. A bool key alone (--KEY) means true."},
    {"--help, -h", "Print the options and keys and exit (status 0); no file is read."},
    {"--help-man", "Print this manual page (roff) and exit (status 0)."},
};

static void put_config_synopsis(FILE *out)
{
    fputs("[\\fB\\-\\-config\\fR \\fIFILE\\fR]... [\\fB\\-\\-set\\fR "
          "\\fIKEY\\fR=\\fIVALUE\\fR]... [\\fB\\-\\-\\fIKEY\\fR=\\fIVALUE\\fR]... "
          "[\\fB\\-\\-help\\fR] [\\fB\\-\\-help\\-man\\fR]\n",
          out);
}

static void put_keys(FILE *out, const ch_config_table_t *t)
{
    int *idx = ch_config_sorted_order(t->keys, t->n_keys);
    for (int j = 0; j < t->n_keys; j++) {
        const ch_config_key_t *k = &t->keys[idx ? idx[j] : j];
        char desc[400];
        ch_config_key_describe(k, desc, sizeof desc);
        fputs(".TP\n\\fB\\-\\-", out);
        put_esc(out, k->name);
        fputs("\\fR\n", out);
        fputc('(', out);
        put_esc(out, desc);
        fputs(")\n", out);
        if (k->help && *k->help) {
            fputs(".br\n", out);
            put_text(out, k->help);
        }
    }
    free(idx);
}

/* The first sentence of text (up to ". ", ".\n" or the end; newlines as
 * spaces, no final period), escaped: the NAME line. */
static void put_first_sentence(FILE *out, const char *text)
{
    size_t n = 0;
    while (text[n] && !(text[n] == '.' && (text[n + 1] == ' ' || text[n + 1] == '\n')))
        n++;
    if (n > 0 && text[n] == '\0' && text[n - 1] == '.') n--;
    for (size_t i = 0; i < n; i++) {
        if (text[i] == '\n')
            fputc(' ', out);
        else
            put_esc_n(out, text + i, 1, 0);
    }
}

ch_status ch_man_write(FILE *out, const ch_man_page_t *page)
{
    CH_REQUIRE(out != NULL && page != NULL && page->prog != NULL && *page->prog,
               "ch_man_write: NULL stream, page or program name");
    CH_REQUIRE(page->n_tables >= 0 && (page->tables != NULL || page->n_tables == 0),
               "ch_man_write: bad table list (%d tables)", page->n_tables);
    for (int t = 0; t < page->n_tables; t++)
        CH_REQUIRE(page->tables[t].n_keys >= 0 &&
                       (page->tables[t].keys != NULL || page->tables[t].n_keys == 0),
                   "ch_man_write: table %d (%s) has a bad key list (%d keys)", t,
                   page->tables[t].title ? page->tables[t].title : "untitled",
                   page->tables[t].n_keys);
    const char *prog = page->prog;
    const char *summary = page->summary && *page->summary ? page->summary : "a cohort batch job";
    int n_keys = 0;
    for (int t = 0; t < page->n_tables; t++) n_keys += page->tables[t].n_keys;

    fprintf(out, ".\\\" Generated by `%s --help-man` from the program's key tables; do not "
                 "edit.\n", prog);
    fputs(".TH ", out);
    put_upper(out, prog);
    fputs(" 1 \"\" \"cohort " PACKAGE_VERSION "\" \"cohort manual\"\n", out);
    fputs(".nh\n.ad l\n.SH NAME\n", out);
    put_esc(out, prog);
    fputs(" \\- ", out);
    put_first_sentence(out, summary);

    fputs("\n.SH SYNOPSIS\n", out);
    /* a summary line "Usage: PROG ARGS" (a job's short form) is the
     * synopsis' first form, and not repeated in the description */
    char *desc = NULL;
    const char *own = strstr(summary, "Usage: ");
    if (own && own != summary && own[-1] != '\n') own = NULL;
    const size_t plen = strlen(prog);
    if (own && !strncmp(own + 7, prog, plen) && own[7 + plen] == ' ') {
        const char *args = own + 7 + plen + 1, *end = args + strcspn(args, "\n");
        fputs("\\fB", out);
        put_esc(out, prog);
        fputs("\\fR ", out);
        put_esc_n(out, args, (size_t)(end - args), 0);
        fputs("\n.br\n", out);
        desc = malloc(strlen(summary) + 1);
        if (desc) { /* the summary without that line */
            size_t head = (size_t)(own - summary);
            while (head > 0 && summary[head - 1] == '\n') head--;
            memcpy(desc, summary, head);
            strcpy(desc + head, *end ? end : "");
            if (!*desc) strcpy(desc, "a cohort batch job");
            summary = desc;
        }
    }
    const char *const launchers[] = {"", "mpiexec \\-n \\fIN\\fB ", "srun \\-\\-mpi=pmi2 "};
    for (int l = 0; l < 3; l++) {
        fputs(l ? ".br\n\\fB" : "\\fB", out);
        fputs(launchers[l], out);
        put_esc(out, prog);
        fputs("\\fR ", out);
        put_config_synopsis(out);
    }

    fputs(".SH DESCRIPTION\n", out);
    size_t len = strlen(summary);
    if (summary[len - 1] == '.') {
        put_text(out, summary);
    } else { /* the period on the summary's line, not after a space */
        char *with_period = malloc(len + 2);
        if (with_period) {
            memcpy(with_period, summary, len);
            memcpy(with_period + len, ".", 2);
            put_text(out, with_period);
            free(with_period);
        } else {
            put_text(out, summary);
        }
    }
    fputs(".PP\nRun it with one process per rank: under \\fBmpiexec\\fR(1), under "
          "\\fBsrun\\fR(1) with \\-\\-mpi=pmi2 inside a Slurm allocation (see the "
          "sbatch templates in share/cohort/slurm of the installation), or alone as one "
          "rank.\n"
          ".PP\nEvery setting is a key (KEYS below). A value comes from the command "
          "line, else from the last \\-\\-config file that sets it, else from the "
          "default. Unknown keys, wrong types and values out of range are errors "
          "(exit status 2) that name the file and line or the option.\n",
          out);

    fputs(".SH OPTIONS\n", out);
    for (size_t i = 0; i < sizeof config_options / sizeof *config_options; i++) {
        fputs(".TP\n", out);
        put_flags(out, config_options[i].flags);
        fputc('\n', out);
        put_text(out, config_options[i].help);
    }

    /* the keys' aliases and the positional key, as --help lists them */
    for (int t = 0; t < page->n_tables; t++) {
        const ch_config_table_t *tab = &page->tables[t];
        for (int j = 0; j < 2 * tab->n_keys; j++) {
            char usage[400], meaning[800];
            ch_config_alias_describe(&tab->keys[j / 2], j % 2, usage, sizeof usage, meaning,
                                     sizeof meaning);
            if (!usage[0]) continue;
            fputs(".TP\n", out);
            put_flags(out, usage);
            fputc('\n', out);
            meaning[0] = (char)toupper((unsigned char)meaning[0]);
            size_t ml = strlen(meaning);
            if (ml + 1 < sizeof meaning) memcpy(meaning + ml, ".", 2);
            put_text(out, meaning);
        }
    }

    if (n_keys > 0) {
        fputs(".SH KEYS\nType, default and range of each key, then what it does. Defaults "
              "are given as on the command line.\n",
              out);
        const char *last = NULL;
        for (int t = 0; t < page->n_tables; t++) {
            if (page->tables[t].n_keys == 0) continue;
            const char *title = page->tables[t].title;
            /* consecutive tables of one owner under one heading */
            int same = title && last && !strcmp(title, last);
            last = title;
            if (title && *title && !same) {
                fputs(".SS \"", out);
                put_esc(out, page->tables[t].title);
                fputs("\"\n", out);
            }
            put_keys(out, &page->tables[t]);
        }
    }
    fputs(".SH \"CONFIGURATION FILES\"\n"
          "libconfig syntax (\\fIhttps://hyperrealm.github.io/libconfig/\\fR). Each "
          "dot of a key name is a group, so \\fBtrain.lr\\fR is written\n"
          ".PP\n.RS\n.nf\ntrain = { lr = 0.1; };\n.fi\n.RE\n.PP\n"
          "Strings are quoted, lists are [\"a\", \"b\"], booleans are true or false. "
          "On the command line a list is comma\\-separated (\"a,b\").\n",
          out);

    fputs(".SH \"EXIT STATUS\"\n"
          "The same on every rank:\n"
          ".TP\n.B 0\nSuccess (also after \\-\\-help).\n"
          ".TP\n.B 1\nRuntime error; a failing rank ends every rank, none hangs.\n"
          ".TP\n.B 2\nBad configuration or input, found before the work started.\n"
          ".TP\n.B 3\nStopped by a preemption or stop request (SIGTERM, the warning "
          "signal) after saving its state; the sbatch templates requeue the job.\n"
          ".TP\n.B 4\nAnother rank died; the survivors say which and end.\n",
          out);
    fputs(".SH ENVIRONMENT\n"
          ".TP\n.B COHORT_LOG_LEVEL\nerror, warn, info (the default) or debug. Lines of "
          "ranks other than 0 start with [rank N].\n"
          ".TP\n.B COHORT_SAFETENSORS_NO_MMAP\n1: read safetensors files instead of "
          "mapping them.\n",
          out);
    fputs(".SH \"SEE ALSO\"\n\\fBcohort\\fR(7), ", out);
    if (page->see_also && *page->see_also) {
        put_esc(out, page->see_also);
        fputs(", ", out);
    }
    fputs("\\fBmpiexec\\fR(1), \\fBsrun\\fR(1), \\fBsbatch\\fR(1)\n", out);
    free(desc);
    if (ferror(out)) return CH_ERROR(CH_ERR_IO, "man page of %s: write failed", prog);
    return CH_OK;
}

int ch_man_requested(int argc, char *const *argv)
{
    for (int i = 1; i < argc && argv; i++)
        if (argv[i] && !strcmp(argv[i], "--help-man")) return 1;
    return 0;
}
