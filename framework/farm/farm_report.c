/* cohort: the task farm's report (see farm.h): status.tsv from the journal
 * and the end-of-run summary. */
#define _GNU_SOURCE
#include "framework/farm/farm_internal.h"

#include "io/state/atomic_file.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

static int cmp_end(const void *a, const void *b)
{
    const ch_journal_end_t *x = a, *y = b;
    if (x->id != y->id) return x->id < y->id ? -1 : 1;
    return (x->attempt > y->attempt) - (x->attempt < y->attempt);
}

static int cmp_start(const void *a, const void *b)
{
    const ch_journal_start_t *x = a, *y = b;
    if (x->id != y->id) return x->id < y->id ? -1 : 1;
    return (x->attempt > y->attempt) - (x->attempt < y->attempt);
}

ch_status ch_farm_write_status(ch_farm_t *f)
{
    if (f->rank != 0) return CH_OK;
    ch_journal_state_t *js;
    CH_TRY(ch_journal_scan(f->o.dir, ch_taskfile_checksum(f->o.tasks), f->n_tasks, &js));
    qsort(js->ends, (size_t)js->n_ends, sizeof *js->ends, cmp_end);
    size_t pl = strlen(f->o.dir) + 16;
    char *path = malloc(pl);
    if (!path) {
        ch_journal_state_destroy(js);
        return CH_ERROR(CH_ERR_NOMEM, "out of memory");
    }
    snprintf(path, pl, "%s/status.tsv", f->o.dir);
    ch_atomic_file_t *af;
    ch_status s = ch_atomic_file_open(path, &af);
    if (s) {
        free(path);
        ch_journal_state_destroy(js);
        return s;
    }
    qsort(js->starts, (size_t)js->n_starts, sizeof *js->starts, cmp_start);
    char line[8192], cmd[4001];
    int n = snprintf(line, sizeof line, "id\tattempt\trank\tslot\thost\tstart\tend\tseconds\t"
                     "status\tcode\tstdout_bytes\tstderr_bytes\tline\tcommand\n");
    s = ch_atomic_file_write(af, line, (size_t)n);
    int64_t k = 0;
    for (int64_t i = 0; !s && i < js->n_ends; i++) {
        const ch_journal_end_t *e = &js->ends[i];
        /* both lists are sorted by (id, attempt): walk them together */
        while (k < js->n_starts && (js->starts[k].id < e->id ||
                                    (js->starts[k].id == e->id && js->starts[k].attempt < e->attempt)))
            k++;
        const char *host = k < js->n_starts && js->starts[k].id == e->id &&
                                   js->starts[k].attempt == e->attempt
                               ? js->starts[k].host
                               : "-";
        const ch_task_t *t = ch_taskfile_task(f->o.tasks, e->id);
        snprintf(cmd, sizeof cmd, "%s", t->command);
        for (char *c = cmd; *c; c++)
            if (*c == '\t' || *c == '\n' || *c == '\r') *c = ' ';
        n = snprintf(line, sizeof line,
                     "%" PRId64 "\t%d\t%d\t%d\t%s\t%.3f\t%.3f\t%.3f\t%s\t%d\t%" PRId64 "\t%" PRId64
                     "\t%d\t%s\n", e->id, e->attempt, e->rank, e->slot, host,
                     (double)e->start_ns / 1e9, (double)e->end_ns / 1e9,
                     (double)(e->end_ns - e->start_ns) / 1e9, ch_end_kind_name(e->kind), e->code,
                     e->out_bytes, e->err_bytes, t->line, cmd);
        s = ch_atomic_file_write(af, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
    }
    if (!s) s = ch_atomic_file_commit(af);
    else ch_atomic_file_abort(af);
    free(path);
    ch_journal_state_destroy(js);
    return s;
}

void ch_farm_print_summary(const ch_farm_t *f, const ch_farm_summary_t *s, FILE *out)
{
    if (f->rank != 0) return;
    static const char *const how[] = {"finished", "stopped (preemption or stop request)",
                                      "halted (farm.halt)"};
    fprintf(out, "cohort-farm: %s: %" PRId64 " tasks, %" PRId64 " done (%" PRId64 " already done "
            "before), %" PRId64 " failed, %" PRId64 " not run\n", how[s->stop], s->total, s->done,
            s->skipped, s->failed, s->not_run);
    fprintf(out, "  this run: %" PRId64 " attempts on %d ranks x %d slots in %.2f s (%.1f "
            "tasks/s), %" PRId64 " retries, %" PRId64 " timed out, %" PRId64 " interrupted\n",
            s->attempts, s->world_size, s->slots_per_rank, s->seconds,
            s->seconds > 0 ? (double)s->attempts / s->seconds : 0.0, s->retried, s->timed_out,
            s->interrupted);
    if (s->waited || s->rerun_lost)
        fprintf(out, "  earlier run: %" PRId64 " running tasks waited for, %" PRId64 " lost ones "
                "run again\n", s->waited, s->rerun_lost);
    int any = 0;
    for (int c = 0; c < 257; c++) {
        if (!s->exit_codes[c]) continue;
        if (!any) fprintf(out, "  exit codes:");
        any = 1;
        if (c == 256) fprintf(out, " signal x%" PRId64, s->exit_codes[c]);
        else fprintf(out, " %d x%" PRId64, c, s->exit_codes[c]);
    }
    /* every ended attempt once: exit codes, signals, then the farm's own ends */
    const int64_t own[2] = {s->timed_out, s->spawn_failed};
    static const char *const own_name[2] = {"timeout", "spawn-failed"};
    for (int k = 0; k < 2; k++) {
        if (!own[k]) continue;
        if (!any) fprintf(out, "  exit codes:");
        any = 1;
        fprintf(out, " %s x%" PRId64, own_name[k], own[k]);
    }
    if (any) fprintf(out, "\n");
    if (s->slowest_id[0] >= 0) {
        fprintf(out, "  slowest:");
        for (int i = 0; i < CH_FARM_SLOWEST && s->slowest_id[i] >= 0; i++)
            fprintf(out, " task %" PRId64 " %.3f s%s", s->slowest_id[i], s->slowest_s[i],
                    i + 1 < CH_FARM_SLOWEST && s->slowest_id[i + 1] >= 0 ? "," : "");
        fprintf(out, "\n");
    }
    fprintf(out, "  status table: %s/status.tsv\n", f->o.dir);
}
