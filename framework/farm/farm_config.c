/* cohort: the task farm's config keys (the "farm" table of a job) and the
 * ch_farm_options_t they describe (see farm.h). */
#include "framework/farm/farm.h"

#include <math.h>
#include <stdint.h>

static const ch_config_key_t farm_keys[] = {
    {"farm.tasks", CH_CFG_STRING, NULL, CH_CFG_NO_RANGE, "Task file: one shell command a line, #COHORT directives (docs/farm.md); --tasks FILE.", "--tasks"},
    {"farm.dir", CH_CFG_STRING, "farm-run", CH_CFG_NO_RANGE, "Run directory (seen by every rank): journal/, out/, status.tsv."},
    {"farm.slots_per_rank", CH_CFG_INT, "0", 0, 4096, "Tasks a rank runs at once; 0: the rank's cores / farm.cores_per_task."},
    {"farm.cores_per_task", CH_CFG_INT, "1", 1, 4096, "Cores each task uses (slots and CPU binding)."},
    {"farm.prefetch", CH_CFG_INT, "1", 0, CH_SUP_QUEUE, "Tasks queued at each busy slot, started without a round trip to rank 0 (0: none)."},
    {"farm.bind", CH_CFG_BOOL, "true", CH_CFG_NO_RANGE, "Bind each slot to its own cores when the rank has several."},
    {"farm.output", CH_CFG_STRING, "files", CH_CFG_NO_RANGE, "files (out/<id/500>/<id>.out, .err), merged (out/rank-R.log, lines prefixed) or none."},
    {"farm.journal_sync", CH_CFG_STRING, "batch", CH_CFG_NO_RANGE, "When the journal reaches the disk: within 20 ms, off the tasks' path (batch), after every record (all), after end records (end), never (none). All survive a crash of the farm; an OS crash re-runs the tasks of the unsynced records."},
    {"farm.retries", CH_CFG_INT, "0", 0, 1000, "Extra attempts of a failed task (exit != 0, signal, timeout)."},
    {"farm.retry_backoff", CH_CFG_FLOAT, "1", 0, 300, "Seconds before retry k: backoff * 2^(k-1), at most 300."},
    {"farm.timeout", CH_CFG_FLOAT, "0", 0, INFINITY, "Seconds an attempt may run (then SIGTERM, SIGKILL after farm.kill_after); 0: none."},
    {"farm.timeout_median", CH_CFG_FLOAT, "0", 0, INFINITY, "Also kill after this multiple of the median successful duration (after 5 tasks); 0: off."},
    {"farm.kill_after", CH_CFG_FLOAT, "5", 0, 3600, "Seconds from SIGTERM to SIGKILL of a task's process group."},
    {"farm.halt_after", CH_CFG_INT, "0", 0, INT32_MAX, "Start no new task once this many tasks failed for good; 0: never."},
    {"farm.halt_fraction", CH_CFG_FLOAT, "0", 0, 1, "Start no new task once failed/ended reaches this (after 10 ended); 0: off."},
    {"farm.halt_mode", CH_CFG_STRING, "soon", CH_CFG_NO_RANGE, "At a halt, running tasks finish (soon) or are stopped (now)."},
    {"farm.grace", CH_CFG_FLOAT, "60", 0, 86400, "Seconds running tasks may finish after SIGTERM / the warning signal before they are stopped (interrupted, run again on resume)."},
    {"farm.resume", CH_CFG_BOOL, "false", CH_CFG_NO_RANGE, "Continue the journal in farm.dir (--resume; automatic after a Slurm requeue).", "--resume", "true"},
    {"farm.resume_failed", CH_CFG_BOOL, "false", CH_CFG_NO_RANGE, "On resume, run tasks that failed for good again."},
};

ch_config_table_t ch_farm_config_table(void)
{
    ch_config_table_t t = {"farm", farm_keys, (int)(sizeof farm_keys / sizeof farm_keys[0])};
    return t;
}

ch_status ch_farm_options_from_config(const ch_config_t *c, ch_farm_options_t *o)
{
    static const char *const outputs[] = {"files", "merged", "none"}, *const syncs[] = {"all", "end", "none", "batch"},
                             *const halts[] = {"soon", "now"};
    int out, sync;
    ch_farm_options_default(o);
    CH_TRY(ch_config_get_int(c, "farm.slots_per_rank", &o->slots_per_rank));
    CH_TRY(ch_config_get_int(c, "farm.cores_per_task", &o->cores_per_task));
    CH_TRY(ch_config_get_bool(c, "farm.bind", &o->bind));
    CH_TRY(ch_config_get_int(c, "farm.prefetch", &o->prefetch));
    CH_TRY(ch_config_get_choice(c, "farm.output", outputs, 3, &out));
    CH_TRY(ch_config_get_choice(c, "farm.journal_sync", syncs, 4, &sync));
    CH_TRY(ch_config_get_int(c, "farm.retries", &o->retries));
    CH_TRY(ch_config_get_double(c, "farm.retry_backoff", &o->retry_backoff));
    CH_TRY(ch_config_get_double(c, "farm.timeout", &o->timeout));
    CH_TRY(ch_config_get_double(c, "farm.timeout_median", &o->timeout_median));
    CH_TRY(ch_config_get_double(c, "farm.kill_after", &o->kill_after));
    CH_TRY(ch_config_get_int(c, "farm.halt_after", &o->halt_after));
    CH_TRY(ch_config_get_double(c, "farm.halt_fraction", &o->halt_fraction));
    CH_TRY(ch_config_get_choice(c, "farm.halt_mode", halts, 2, &o->halt_now));
    CH_TRY(ch_config_get_double(c, "farm.grace", &o->preempt_grace));
    CH_TRY(ch_config_get_bool(c, "farm.resume", &o->resume));
    CH_TRY(ch_config_get_bool(c, "farm.resume_failed", &o->resume_failed));
    o->output = (ch_farm_output)out;
    o->sync = (ch_journal_sync)sync;
    return CH_OK;
}
