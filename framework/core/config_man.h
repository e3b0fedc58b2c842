/* cohort: man pages (roff, man(7) macros) generated from a program's key
 * tables, so that `man PROG` and `PROG --help` never disagree.
 *
 * Every cohort program prints its page with `PROG --help-man` (for programs
 * that read their settings through ch_config_load, configuration.c does it);
 * the build runs that to make PROG.1 and installs it. The page has NAME,
 * SYNOPSIS (direct, mpiexec and srun launches), DESCRIPTION, OPTIONS, KEYS
 * (one subsection per table, keys sorted as in --help, each with type,
 * default, range and its sentence), CONFIGURATION FILES, EXIT STATUS (the
 * codes of framework/runtime/job.h), ENVIRONMENT and SEE ALSO. No date is
 * written, so the page of a given version is the same on every build
 * (reproducible builds).
 */
#ifndef COHORT_CONFIG_MAN_H
#define COHORT_CONFIG_MAN_H

#include "framework/core/configuration.h"
#include "framework/core/status.h"

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One command-line option of a program that parses its own options (not
 * through ch_config_load), for OPTIONS. `flags` is the option as --help
 * shows it: comma-separated spellings, then the argument's name, e.g.
 * "-b, --min-bytes N" (words starting with '-' are set in bold, the others
 * in italics). `help` is the text (newlines in it are filled, as in
 * description). */
typedef struct {
    const char *flags;
    const char *help;
} ch_man_option_t;

/* What goes on one page. Plain text everywhere: the writer escapes roff
 * (backslashes, '-' as \-, lines starting with '.' or '\''). */
typedef struct {
    const char *prog;        /* program name, "cohort-train" (required) */
    const char *summary;     /* one line for NAME (whatis) and DESCRIPTION
                                (NULL: "a cohort batch job") */
    const char *synopsis;    /* arguments after the program name in SYNOPSIS;
                                NULL: the config form [--config FILE]... */
    const char *description; /* extra DESCRIPTION text (NULL: none); lines
                                are filled, a blank line ("\n\n") starts a
                                paragraph */
    const ch_man_option_t *options; /* NULL: the options of ch_config_load */
    int n_options;
    const ch_config_table_t *tables; /* key tables, each a KEYS subsection */
    int n_tables;
    const char *see_also;    /* extra SEE ALSO entries, "cohort-bench(1)";
                                cohort(7), mpiexec(1), srun(1), sbatch(1) are
                                always listed */
} ch_man_page_t;

/* Write the page to out. Errors: CH_ERR_INVALID (page or prog NULL, a table
 * with a negative key count or NULL keys), CH_ERR_IO (write error on out). */
ch_status ch_man_write(FILE *out, const ch_man_page_t *page);

/* 1 when argv[1..argc-1] contains --help-man, else 0. For programs with
 * their own option parser (cohort-bench); ch_config_load handles it itself. */
int ch_man_requested(int argc, char *const *argv);

#ifdef __cplusplus
}
#endif

#endif
