/* cohort-reduce: numpy-style reductions (sum, mean, var, min, argmax,
 * histogram, ...) of arrays bigger than one process holds, over the ranks of
 * a job, bit-reproducible for any number of ranks (docs/reduce.md):
 *
 *   mpiexec -n W cohort-reduce --op mean --axis 0 x.npy --out m.npy
 *
 * The machinery is framework/reduce (reducer, pipeline), io/formats/npy (inputs,
 * .npy output) and framework/reduce/reduce_ckpt (resume files); this file is the glue. */
#include "config.h"

#include "framework/core/log.h"
#include "framework/reduce/reduce.h"
#include "framework/runtime/job.h"
#include "io/formats/npy.h"
#include "io/state/atomic_file.h"
#include "framework/reduce/reduce_ckpt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const ch_config_key_t keys[] = {
    {"output.out", CH_CFG_STRING, "reduce.npy", CH_CFG_NO_RANGE, "Result .npy, written atomically by rank 0.", "--out"},
    {"output.edges", CH_CFG_STRING, "", CH_CFG_NO_RANGE, "histogram: bin edges .npy (default: OUT with _edges before .npy).", "--edges"},
    {"output.state_dir", CH_CFG_STRING, "", CH_CFG_NO_RANGE, "Directory of the resume state (default: OUT.state).", "--state_dir"},
    {"output.resume", CH_CFG_BOOL, "false", CH_CFG_NO_RANGE, "Continue from the state in output.state_dir.", "--resume"},
};

typedef struct {
    ch_job_t *job;
    ch_reducer_t *r;
    const char *dir;
    ch_reduce_ckpt_t cur;
    double every, last;
    int save_failed; /* a state save failed, or the input changed (printed): exit 1 */
    int64_t shown;   /* steps done at the last progress line */
    long long syncs; /* agreement points passed, all passes (the test hold point) */
    const ch_file_source_t *fs; /* the input, checked unchanged before a state is saved */
} hook_t;

/* At every agreement point: progress, the agreed stop, the checkpoint clock. */
static int step_hook(void *arg, const ch_reduce_step_t *st)
{
    hook_t *h = arg;
    char text[96];
    double s = st->read_wait_s + st->compute_s;
    int64_t done = st->step + 1;
    snprintf(text, sizeof text, "pass %d/%d  %.2f GB done  %.2f GB/s", st->pass + 1, st->passes,
             ch_job_world_size(h->job) * st->bytes_done / 1e9,
             ch_job_world_size(h->job) * st->bytes_done / 1e9 / (s + 1e-9));
    /* a line per 16 steps passed (the agreement points fall anywhere) */
    ch_job_progress(h->job, "reduce", done, st->steps, done / 16 != h->shown / 16 || done < h->shown, text);
    h->shown = done;
    ch_job_test_hold(h->job, "sync", ++h->syncs); /* tests only: the first is after chunk 1 */
    int stop = ch_job_stop_agree(h->job, 0);
    /* all work read: finish and write the result rather than ask for a requeue */
    if (stop && st->pass + 1 == st->passes && done == st->steps) {
        ch_log_info("cohort-reduce: stop requested after the last chunk: writing the result");
        return 0;
    }
    if (stop || ch_reduce_checkpoint_due(ch_job_pg(h->job), &h->last, h->every)) {
        /* an input written in place since the start: a state of its mixed
         * contents could never be resumed (the run ends now, exit 1) */
        if (ch_job_agree(h->job, ch_file_source_check_unchanged(h->fs), "input")) {
            h->save_failed = 1;
            return 1;
        }
        h->cur.pass = st->pass;
        h->cur.step = done;
        if (ch_job_agree(h->job, ch_reduce_ckpt_save(h->dir, h->r, &h->cur), "saving the state")) {
            h->save_failed = 1;
            return 1;
        }
        ch_log_info("cohort-reduce: state saved in %s (pass %d/%d after step %lld/%lld)", h->dir,
                    st->pass + 1, st->passes, (long long)done, (long long)st->steps);
    }
    return stop;
}

/* Can path be written (atomically)? A temporary file made and removed. */
static ch_status probe_output(const char *path)
{
    ch_atomic_file_t *f;
    ch_status s = ch_atomic_file_open(path, &f);
    if (s == CH_OK) ch_atomic_file_abort(f);
    return s;
}

int main(int argc, char **argv)
{
    const ch_config_table_t tables[] = {ch_reduce_config_table(), ch_file_source_config_table(),
                                        {"output", keys, 4}, ch_job_runtime_table()};
    static const char *const phases[] = {"read wait", "compute", "combine"};
    ch_job_options_t o;
    ch_job_options_default(&o, "cohort-reduce", "chunked, reproducible numpy-style reductions over the ranks.\n"
        "Usage: cohort-reduce --op OP [--axis A] [--KEY VALUE]... INPUT... [--out FILE]; each --KEY is\n"
        "short for the --reduce.KEY, --input.KEY or --output.KEY below; bare words are input.files.");
    o.tables = tables; o.n_tables = 4; o.phase_names = phases; o.n_phases = 3;
    o.preemption = 1;
    ch_job_t *job;
    int rc = ch_job_init(&o, argc, argv, &job);
    if (rc != CH_JOB_CONTINUE) return ch_job_finalize(job, rc);
    ch_config_t *cfg = ch_job_config(job);
    const char *out = NULL, *edges_out = NULL, *sdir = NULL;
    ch_reduce_spec_t spec;
    ch_reduce_run_options_t ro;
    hook_t h = {job, NULL, NULL, {ch_job_world_size(job), ch_job_rank(job), 0, 0, 0, NULL}, 0, ch_time_now(), 0, 0, 0};
    int resume = 0;
    ch_status s = ch_reduce_options_from_config(cfg, &spec, &ro, &h.every);
    if (!s) s = ch_config_get_string(cfg, "output.out", &out);
    if (!s) s = ch_config_get_string(cfg, "output.edges", &edges_out);
    if (!s) s = ch_config_get_string(cfg, "output.state_dir", &sdir);
    if (!s) s = ch_config_get_bool(cfg, "output.resume", &resume);
    ch_file_source_t *fs = NULL;
    if (!s) s = ch_file_source_from_config(cfg, &fs);
    if (fs && (s = ch_job_on_finalize(job, (void (*)(void *))ch_file_source_destroy, fs)) != CH_OK) ch_file_source_destroy(fs);
    if (!s) s = ch_reducer_create(&spec, &ch_file_source_get(fs)->desc, &h.r);
    if (h.r && (s = ch_job_on_finalize(job, (void (*)(void *))ch_reducer_destroy, h.r)) != CH_OK) ch_reducer_destroy(h.r);
    char *identity = NULL;
    if (!s) s = ch_reduce_ckpt_identity(&spec, fs, &identity);
    if (identity && (s = ch_job_on_finalize(job, free, identity)) != CH_OK) free(identity);
    h.cur.identity = identity;
    if (ch_job_agree(job, s, "input")) return ch_job_finalize(job, CH_EXIT_BAD_INPUT);

    char dir[4096], edges_path[4096];
    snprintf(dir, sizeof dir, "%s%s", *sdir ? sdir : out, *sdir ? "" : ".state");
    h.dir = dir;
    size_t l = strlen(out) - (strlen(out) > 4 && !strcmp(out + strlen(out) - 4, ".npy") ? 4 : 0);
    snprintf(edges_path, sizeof edges_path, "%.*s%s", (int)(*edges_out ? strlen(edges_out) : l), *edges_out ? edges_out : out, *edges_out ? "" : "_edges.npy");
    /* the outputs can be written: found now, not after the whole input was read */
    if (ch_job_rank(job) == 0) s = probe_output(out);
    if (!s && ch_job_rank(job) == 0 && spec.op == CH_ROP_HISTOGRAM) s = probe_output(edges_path);
    if (!s) s = ch_reduce_ckpt_check_dir(dir, ch_job_rank(job));
    if (ch_job_agree(job, s, "output")) return ch_job_finalize(job, CH_EXIT_BAD_INPUT);
    h.cur.chunk_elems = ro.chunk_bytes / (int64_t)ch_array_dtype_size(ch_file_source_get(fs)->desc.dtype);
    if (h.cur.chunk_elems < 1) h.cur.chunk_elems = 1;
    if (resume) {
        ch_reduce_ckpt_t got;
        if (ch_job_agree(job, ch_reduce_ckpt_load(dir, h.r, &h.cur, &got), "resume state")) return ch_job_finalize(job, CH_EXIT_BAD_INPUT);
        ro.start_pass = got.pass;
        ro.start_step = got.step;
        ch_log_info("cohort-reduce: resuming in pass %d/%d after step %lld", got.pass + 1, ch_reducer_passes(h.r), (long long)got.step);
    }
    ch_reduce_step_t tot = {0};
    ro.step_hook = step_hook; ro.arg = &h; ro.totals = &tot;
    h.fs = fs;
    int stopped = 0;
    s = ch_reduce_run(h.r, ch_file_source_get(fs), ch_job_pg(job), &ro, &stopped);
    ch_prof_add(ch_job_profiler(job), 0, tot.read_wait_s);
    ch_prof_add(ch_job_profiler(job), 1, tot.compute_s);
    ch_prof_add(ch_job_profiler(job), 2, tot.combine_s);
    ch_log_debug("cohort-reduce: %lld chunks memory-mapped (reduce.mmap = %s), the others read",
                 (long long)tot.mapped, ro.mmap ? "true" : "false");
    int bad = ch_error_code() == CH_ERR_INVALID || ch_error_code() == CH_ERR_FORMAT;
    if (ch_job_agree(job, s, "reduce")) return ch_job_finalize(job, bad ? CH_EXIT_BAD_INPUT : CH_EXIT_ERROR);
    if (stopped) return ch_job_finalize(job, h.save_failed ? CH_EXIT_ERROR : CH_EXIT_PREEMPTED);
    /* an input written in place during the run: no result from a mix */
    if (ch_job_agree(job, ch_file_source_check_unchanged(fs), "input"))
        return ch_job_finalize(job, CH_EXIT_ERROR);

    ch_array_desc_t rd;
    const void *data;
    const double *edges;
    const char *warnings;
    s = ch_reducer_result(h.r, &rd, &data, &edges, &warnings);
    if (!s && ch_job_rank(job) == 0) {
        if (*warnings) ch_log_warn("cohort-reduce: RuntimeWarning: %s", warnings);
        s = ch_npy_write(out, &rd, data);
        ch_array_desc_t ed = {CH_DT_FLOAT64, 0, 0, 1, {rd.shape[0] + 1}};
        if (!s && edges) s = ch_npy_write(edges_path, &ed, edges);
        if (!s) ch_log_info("cohort-reduce: %s -> %s (%s, %lld elements)", ch_reduce_kind_name(spec.op), out, ch_array_dtype_name(rd.dtype), (long long)ch_array_desc_count(&rd));
    }
    if (ch_job_agree(job, s, "writing the result")) return ch_job_finalize(job, CH_EXIT_ERROR);
    ch_reduce_ckpt_remove(dir, ch_job_rank(job));
    if (!ch_job_agree(job, CH_OK, "cleanup") && ch_job_rank(job) == 0) rmdir(dir);
    return ch_job_finalize(job, CH_EXIT_OK);
}
