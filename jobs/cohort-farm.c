/* cohort-farm: a task farm over the ranks of one allocation, exactly once
 * across crashes and requeues (docs/farm.md). The engine is framework/farm;
 * this file is the job's life on the shared runtime (ch_job); the farm.*
 * keys are the engine's (ch_farm_config_table).
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

/* The task file, read by check_keys: every rank parses it (a small file,
 * and no rank waits for another's copy). */
static ch_taskfile_t *g_tasks;

/* The farm's keys and the task file, checked before the run directory is
 * made: a bad choice (--farm.output=all) or a bad task file leaves no
 * farm.dir/cohort.lock behind. */
static ch_status check_keys(const ch_config_t *c)
{
    ch_farm_options_t o;
    const char *path;
    CH_TRY(ch_farm_options_from_config(c, &o));
    CH_TRY(ch_config_get_string(c, "farm.tasks", &path));
    if (!*path) return CH_ERROR(CH_ERR_CONFIG, "farm.tasks: no task file given (--tasks FILE)");
    return ch_taskfile_load(path, &g_tasks);
}

static int stop_requested(void *job) { return ch_job_stop_local(job, 0) != 0; }

static void show_progress(void *job, int64_t ended, int64_t total, const char *text)
{
    ch_job_progress(job, "tasks", ended, total, 20, text);
}

static ch_status setup(ch_job_t *job, ch_farm_options_t *o, char **dir)
{
    ch_config_t *c = ch_job_config(job);
    CH_TRY(ch_farm_options_from_config(c, o));
    const char *restarts = getenv("SLURM_RESTART_COUNT"); /* requeued: go on where it stopped */
    if (restarts && atoi(restarts) > 0) o->resume = 1;
    const char *warn; /* srun passes it to the tasks too: they ignore it, the farm answers */
    CH_TRY(ch_config_get_string(c, "dist.warning_signal", &warn));
    CH_TRY(ch_signal_parse(warn, &o->ignore_signal));
    /* absolute, so that COHORT_FARM_DIR means the same in a task's own cwd */
    if (!(*dir = realpath(ch_job_output_dir(job), NULL)))
        return CH_ERROR(CH_ERR_IO, "farm.dir %s: %s", ch_job_output_dir(job), strerror(errno));
    o->dir = *dir;
    o->should_stop = stop_requested;
    o->progress = show_progress;
    o->cb_arg = job;
    o->tasks = g_tasks;
    return CH_OK;
}

/* s is already agreed over the ranks (the farm library's collectives give
 * every rank the lowest failing rank's status, its message starting with
 * "rank R: " on more than one rank): rank 0 prints it once as
 * "cohort-farm: <what>: <message>". ch_job_agree would add its own rank and
 * rank count to a message that carries them already. Returns s != CH_OK. */
static int farm_failed(ch_job_t *job, ch_status s, const char *what)
{
    if (s == CH_OK) return 0;
    if (ch_job_rank(job) == 0) {
        fprintf(stderr, "%s: %s: %s\n", ch_job_name(job), what, ch_error_message());
        fflush(stderr);
    }
    return 1;
}

int main(int argc, char **argv)
{
    const ch_config_table_t tables[] = {ch_farm_config_table(), ch_job_runtime_table()};
    ch_job_options_t jo;
    ch_job_options_default(&jo, "cohort-farm", "task farm over the ranks of one allocation, exactly once across crashes and requeues");
    jo.tables = tables;
    jo.n_tables = 2;
    jo.output_dir_key = "farm.dir";
    jo.preemption = 1;
    jo.check_config = check_keys;
    ch_job_t *job;
    int rc = ch_job_init(&jo, argc, argv, &job);
    ch_taskfile_t *tf = g_tasks; /* read by check_keys, or NULL */
    if (rc != CH_JOB_CONTINUE) {
        ch_taskfile_destroy(tf);
        return ch_job_finalize(job, rc);
    }
    ch_farm_options_t o;
    char *dir = NULL;
    ch_status s = setup(job, &o, &dir);
    if (ch_job_agree(job, s, "farm setup")) {
        ch_taskfile_destroy(tf);
        free(dir);
        return ch_job_finalize(job, CH_EXIT_BAD_INPUT);
    }
    ch_farm_t *farm = NULL;
    ch_farm_summary_t sum;
    s = ch_farm_create(&o, ch_pg_mpi_comm(ch_job_pg(job)), &farm);
    rc = s == CH_ERR_FORMAT || s == CH_ERR_CONFIG ? CH_EXIT_BAD_INPUT : CH_EXIT_ERROR;
    if (!farm_failed(job, s, "farm setup")) {
        s = ch_farm_run(farm, &sum);
        if (!s) s = ch_farm_write_status(farm);
        rc = CH_EXIT_ERROR;
        if (!farm_failed(job, s, "farm")) {
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
