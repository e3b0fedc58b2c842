/* cohort-farm: a task farm over the ranks of one allocation, exactly once
 * across crashes and requeues (docs/farm.md). The engine is framework/farm;
 * this file is its keys and the job's life on the shared runtime (ch_job).
 *
 *   mpiexec -n W jobs/cohort-farm --tasks FILE [--config FILE] [--resume] [--KEY=VALUE]...
 */
#include "framework/farm/farm.h"
#include "framework/launch/signals.h"
#include "framework/runtime/job.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>

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
#define N_FARM_KEYS ((int)(sizeof farm_keys / sizeof farm_keys[0]))

static int stop_requested(void *job) { return ch_job_stop_local(job, 0) != 0; }

static void show_progress(void *job, int64_t ended, int64_t total, const char *text)
{
    ch_job_progress(job, "tasks", ended, total, 20, text);
}

static ch_status setup(ch_job_t *job, ch_farm_options_t *o, ch_taskfile_t **tf, char **dir)
{
    static const char *const outputs[] = {"files", "merged", "none"}, *const syncs[] = {"all", "end", "none", "batch"},
                             *const halts[] = {"soon", "now"};
    ch_config_t *c = ch_job_config(job);
    const char *path;
    int out, sync;
    ch_farm_options_default(o);
    CH_TRY(ch_config_get_string(c, "farm.tasks", &path));
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
    const char *restarts = getenv("SLURM_RESTART_COUNT"); /* requeued: go on where it stopped */
    if (restarts && atoi(restarts) > 0) o->resume = 1;
    const char *warn; /* srun passes it to the tasks too: they ignore it, the farm answers */
    CH_TRY(ch_config_get_string(c, "dist.warning_signal", &warn));
    CH_TRY(ch_signal_parse(warn, &o->ignore_signal));
    o->output = (ch_farm_output)out;
    o->sync = (ch_journal_sync)sync;
    /* absolute, so that COHORT_FARM_DIR means the same in a task's own cwd */
    if (!(*dir = realpath(ch_job_output_dir(job), NULL)))
        return CH_ERROR(CH_ERR_IO, "farm.dir %s: %s", ch_job_output_dir(job), strerror(errno));
    o->dir = *dir;
    o->should_stop = stop_requested;
    o->progress = show_progress;
    o->cb_arg = job;
    CH_TRY(ch_taskfile_load(path, tf));
    o->tasks = *tf;
    return CH_OK;
}

int main(int argc, char **argv)
{
    const ch_config_table_t tables[] = {{"farm", farm_keys, N_FARM_KEYS}, ch_job_runtime_table()};
    ch_job_options_t jo;
    ch_job_options_default(&jo, "cohort-farm", "task farm over the ranks of one allocation, exactly once across crashes and requeues");
    jo.tables = tables;
    jo.n_tables = 2;
    jo.output_dir_key = "farm.dir";
    jo.preemption = 1;
    ch_job_t *job;
    int rc = ch_job_init(&jo, argc, argv, &job);
    if (rc != CH_JOB_CONTINUE) return ch_job_finalize(job, rc);
    ch_farm_options_t o;
    ch_taskfile_t *tf = NULL;
    char *dir = NULL;
    ch_status s = setup(job, &o, &tf, &dir);
    if (ch_job_agree(job, s, "task file")) {
        ch_taskfile_destroy(tf);
        free(dir);
        return ch_job_finalize(job, CH_EXIT_BAD_INPUT);
    }
    ch_farm_t *farm = NULL;
    ch_farm_summary_t sum;
    s = ch_farm_create(&o, ch_pg_mpi_comm(ch_job_pg(job)), &farm);
    rc = s == CH_ERR_FORMAT || s == CH_ERR_CONFIG ? CH_EXIT_BAD_INPUT : CH_EXIT_ERROR;
    if (!ch_job_agree(job, s, "farm setup")) {
        s = ch_farm_run(farm, &sum);
        if (!s) s = ch_farm_write_status(farm);
        rc = CH_EXIT_ERROR;
        if (!ch_job_agree(job, s, "farm")) {
            ch_farm_print_summary(farm, &sum, stdout);
            rc = sum.stop == CH_FARM_PREEMPTED ? CH_EXIT_PREEMPTED : sum.failed || sum.not_run ? CH_EXIT_ERROR : CH_EXIT_OK;
            if (rc == CH_EXIT_PREEMPTED) ch_job_requeue(job);
        }
    }
    ch_farm_destroy(farm);
    ch_taskfile_destroy(tf);
    free(dir);
    return ch_job_finalize(job, rc);
}
