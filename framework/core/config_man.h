/* cohort: man pages (roff, man(7) macros) generated from a program's key
 * tables, so that `man PROG` and `PROG --help` never disagree.
 *
 * Every cohort program prints its page with `PROG --help-man` (handled by
 * ch_config_load / ch_config_load_tables, so by ch_job_init too); the build
 * runs that to make PROG.1 and installs it. The page has NAME,
 * SYNOPSIS (direct, mpiexec and srun launches), DESCRIPTION, OPTIONS
 * (those of ch_config_load, then the keys' aliases and positional
 * arguments, as --help lists them), KEYS (one subsection per table, keys
 * sorted as in --help, each with type, default, range and its sentence),
 * CONFIGURATION FILES, EXIT STATUS (the codes of framework/runtime/job.h),
 * ENVIRONMENT and SEE ALSO. No date is written, so the page of a given
 * version is the same on every build (reproducible builds).
 */
#ifndef COHORT_CONFIG_MAN_H
#define COHORT_CONFIG_MAN_H

#include "framework/core/configuration.h"
#include "framework/core/status.h"

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What goes on one page. Plain text: the writer escapes roff (backslashes,
 * '-' as \-, lines starting with '.' or '\''). */
typedef struct {
    const char *prog;    /* program name, "cohort-train" (required) */
    const char *summary; /* what the program does: its first sentence (up to
                            ". " or the end, newlines as spaces) is the NAME
                            line (whatis), all of it opens DESCRIPTION; a
                            blank line in it starts a paragraph. NULL: "a
                            cohort batch job" */
    const ch_config_table_t *tables; /* key tables, each a KEYS subsection
                                        titled by its title (untitled when
                                        the title is NULL or "") */
    int n_tables;
    const char *see_also; /* extra SEE ALSO entries, "cohort-bench(1)";
                             cohort(7), mpiexec(1), srun(1), sbatch(1) are
                             always listed */
} ch_man_page_t;

/* Write the page to out. Errors: CH_ERR_INVALID (out, page or prog NULL or
 * prog empty, a table with a negative key count or NULL keys), CH_ERR_IO
 * (write error on out). */
ch_status ch_man_write(FILE *out, const ch_man_page_t *page);

/* 1 when argv[1..argc-1] contains --help-man, else 0 (ch_config_load and
 * ch_config_load_tables then print the page, like --help). */
int ch_man_requested(int argc, char *const *argv);

#ifdef __cplusplus
}
#endif

#endif
