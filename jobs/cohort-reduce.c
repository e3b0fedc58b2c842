/* cohort-reduce: numpy-style reductions (sum, mean, var, min, argmax,
 * histogram, ...) of arrays bigger than one process holds, over the ranks of
 * a job, bit-reproducible for any number of ranks (docs/reduce.md):
 *
 *   mpiexec -n W cohort-reduce --op mean --axis 0 x.npy --out m.npy
 *
 * The machinery is framework/reduce (reducer, pipeline), io/npy (inputs,
 * .npy output) and io/reduce_ckpt (resume files); this file is the glue. */
#include "config.h"

#include "framework/core/log.h"
#include "framework/reduce/reduce.h"
#include "framework/runtime/job.h"
#include "io/formats/npy.h"
#include "io/state/reduce_ckpt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const ch_config_key_t keys[] = {
    {"output.out", CH_CFG_STRING, "reduce.npy", CH_CFG_NO_RANGE, "Result .npy, written atomically by rank 0."},
    {"output.edges", CH_CFG_STRING, "", CH_CFG_NO_RANGE, "histogram: bin edges .npy (default: OUT with _edges before .npy)."},
    {"output.state_dir", CH_CFG_STRING, "", CH_CFG_NO_RANGE, "Directory of the resume state (default: OUT.state)."},
    {"output.resume", CH_CFG_BOOL, "false", CH_CFG_NO_RANGE, "Continue from the state in output.state_dir."},
};

/* --op, --axis, --out, --dtype, --resume ... stand for --reduce.op, --input.dtype,
 * --output.out ... (the full dotted names work too, with = or a space, and the
 * runtime's dist.* keys by their full names);
 * bare words are the input files. Strings live until exit. */
static const ch_config_key_t *find_short(const char *a, size_t len)
{
    /* the runtime's keys (dist.timeout ...) by their full names only */
    const ch_config_table_t rt = ch_job_runtime_table();
    const ch_config_key_t *tabs[4] = {ch_reduce_keys, ch_input_keys, keys, rt.keys};
    const int ns[4] = {ch_reduce_n_keys, ch_input_n_keys, 4, rt.n_keys};
    for (int t = 0; t < 4; t++)
        for (int k = 0; k < ns[t]; k++) {
            const char *name = tabs[t][k].name, *dot = strchr(name, '.') + 1;
            if (t < 3 && strlen(dot) == len && !strncmp(dot, a, len)) return &tabs[t][k];
            if (strlen(name) == len && !strncmp(name, a, len)) return &tabs[t][k]; /* full name */
        }
    return NULL;
}
static char *kept[1024];
static char **rewrite(int argc, char **argv, int *out_argc)
{
    char **nv = calloc((size_t)argc + 2, sizeof *nv);
    size_t room = 32;
    for (int i = 1; i < argc; i++) room += strlen(argv[i]) + 1;
    char *files = kept[0] = calloc(1, room);
    if (!nv || !files || argc > 1000) { free(nv); return NULL; }
    int n = 0, nk = 1;
    nv[n++] = argv[0];
    strcpy(files, "--input.files=");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        size_t len = a[0] == '-' && a[1] == '-' ? strcspn(a + 2, "=") : 0;
        const ch_config_key_t *k = len ? find_short(a + 2, len) : NULL;
        if (k) {
            nv[n++] = kept[nk] = malloc(strlen(k->name) + strlen(a) + 4);
            if (!kept[nk++]) { free(nv); return NULL; }
            sprintf(nv[n - 1], "--%s%s", k->name, a + 2 + len);
            /* --KEY VALUE; a bool takes the next word only when it is one */
            if (!a[2 + len] && i + 1 < argc &&
                (k->type != CH_CFG_BOOL || !strcmp(argv[i + 1], "true") || !strcmp(argv[i + 1], "false")))
                nv[n++] = argv[++i];
        } else if (a[0] != '-') {
            strcat(strcat(files, files[14] ? "," : ""), a);
        } else {
            nv[n++] = argv[i];
            if ((!strcmp(a, "--config") || !strcmp(a, "--set")) && i + 1 < argc) nv[n++] = argv[++i];
        }
    }
    if (files[14]) nv[n++] = files;
    *out_argc = n;
    return nv;
}

typedef struct {
    ch_job_t *job;
    ch_reducer_t *r;
    const char *dir;
    ch_reduce_ckpt_t cur;
    double every, last;
    long long chunks; /* chunks done, all passes (the test hold point) */
} hook_t;

/* After every chunk: progress, the agreed stop, the checkpoint clock. */
static int step_hook(void *arg, const ch_reduce_step_t *st)
{
    hook_t *h = arg;
    char text[96];
    double s = st->read_wait_s + st->compute_s;
    snprintf(text, sizeof text, "pass %d/%d  %.2f GB done  %.2f GB/s", st->pass + 1, st->passes,
             ch_job_world_size(h->job) * st->bytes_done / 1e9,
             ch_job_world_size(h->job) * st->bytes_done / 1e9 / (s + 1e-9));
    ch_job_progress(h->job, "reduce", st->step + 1, st->steps, 16, text);
    ch_job_test_hold(h->job, "chunk", ++h->chunks); /* tests only */
    int stop = ch_job_stop_agree(h->job, 0);
    if (stop || ch_reduce_checkpoint_due(ch_job_pg(h->job), &h->last, h->every)) {
        h->cur.pass = st->pass;
        h->cur.step = st->step + 1;
        if (ch_job_agree(h->job, ch_reduce_ckpt_save(h->dir, h->r, &h->cur), "saving the state")) return 1;
        ch_log_info("cohort-reduce: state saved in %s (pass %d, step %lld)", h->dir, st->pass, (long long)h->cur.step);
    }
    return stop;
}

int main(int argc, char **argv)
{
    const ch_config_table_t tables[] = {{"reduce", ch_reduce_keys, ch_reduce_n_keys},
                                        {"input", ch_input_keys, ch_input_n_keys},
                                        {"output", keys, 4}, ch_job_runtime_table()};
    static const char *const phases[] = {"read wait", "compute", "combine"};
    ch_job_options_t o;
    ch_job_options_default(&o, "cohort-reduce", "chunked, reproducible numpy-style reductions over the ranks.\n"
        "Usage: cohort-reduce --op OP [--axis A] [--KEY VALUE]... INPUT... [--out FILE]; each --KEY is\n"
        "short for the --reduce.KEY, --input.KEY or --output.KEY below; bare words are input.files.");
    o.tables = tables; o.n_tables = 4; o.phase_names = phases; o.n_phases = 3;
    o.preemption = 1; o.rewrite_args = rewrite;
    ch_job_t *job;
    int rc = ch_job_init(&o, argc, argv, &job);
    if (rc != CH_JOB_CONTINUE) return ch_job_finalize(job, rc);
    ch_config_t *cfg = ch_job_config(job);
    const char *out = NULL, *edges_out = NULL, *sdir = NULL;
    ch_reduce_spec_t spec;
    ch_reduce_run_options_t ro;
    hook_t h = {job, NULL, NULL, {ch_job_world_size(job), ch_job_rank(job), 0, 0, 0}, 0, ch_time_now(), 0};
    int resume = 0;
    ch_status s = ch_reduce_from_config(cfg, &spec, &ro, &h.every);
    if (!s) s = ch_config_get_string(cfg, "output.out", &out);
    if (!s) s = ch_config_get_string(cfg, "output.edges", &edges_out);
    if (!s) s = ch_config_get_string(cfg, "output.state_dir", &sdir);
    if (!s) s = ch_config_get_bool(cfg, "output.resume", &resume);
    ch_file_source_t *fs = NULL;
    if (!s) s = ch_file_source_from_config(cfg, &fs);
    if (fs && (s = ch_job_on_finalize(job, (void (*)(void *))ch_file_source_destroy, fs)) != CH_OK) ch_file_source_destroy(fs);
    if (!s) s = ch_reducer_create(&spec, &ch_file_source_get(fs)->desc, &h.r);
    if (h.r && (s = ch_job_on_finalize(job, (void (*)(void *))ch_reducer_destroy, h.r)) != CH_OK) ch_reducer_destroy(h.r);
    if (ch_job_agree(job, s, "input")) return ch_job_finalize(job, CH_EXIT_BAD_INPUT);

    char dir[4096], edges_path[4096];
    snprintf(dir, sizeof dir, "%s%s", *sdir ? sdir : out, *sdir ? "" : ".state");
    h.dir = dir;
    h.cur.chunk_elems = ro.chunk_bytes / (int64_t)ch_array_dtype_size(ch_file_source_get(fs)->desc.dtype);
    if (h.cur.chunk_elems < 1) h.cur.chunk_elems = 1;
    if (resume) {
        ch_reduce_ckpt_t got;
        if (ch_job_agree(job, ch_reduce_ckpt_load(dir, h.r, &h.cur, &got), "resume state")) return ch_job_finalize(job, CH_EXIT_BAD_INPUT);
        ro.start_pass = got.pass;
        ro.start_step = got.step;
        ch_log_info("cohort-reduce: resuming at pass %d, step %lld", got.pass, (long long)got.step);
    }
    ch_reduce_step_t tot = {0};
    ro.step_hook = step_hook; ro.arg = &h; ro.totals = &tot;
    int stopped = 0;
    s = ch_reduce_run(h.r, ch_file_source_get(fs), ch_job_pg(job), &ro, &stopped);
    ch_prof_add(ch_job_profiler(job), 0, tot.read_wait_s);
    ch_prof_add(ch_job_profiler(job), 1, tot.compute_s);
    ch_prof_add(ch_job_profiler(job), 2, tot.combine_s);
    int bad = ch_error_code() == CH_ERR_INVALID || ch_error_code() == CH_ERR_FORMAT;
    if (ch_job_agree(job, s, "reduce")) return ch_job_finalize(job, bad ? CH_EXIT_BAD_INPUT : CH_EXIT_ERROR);
    if (stopped) return ch_job_finalize(job, CH_EXIT_PREEMPTED);

    ch_array_desc_t rd;
    const void *data;
    const double *edges;
    const char *warnings;
    s = ch_reducer_result(h.r, &rd, &data, &edges, &warnings);
    if (!s && ch_job_rank(job) == 0) {
        if (*warnings) ch_log_warn("cohort-reduce: RuntimeWarning: %s", warnings);
        s = ch_npy_write(out, &rd, data);
        size_t l = strlen(out) - (strlen(out) > 4 && !strcmp(out + strlen(out) - 4, ".npy") ? 4 : 0);
        snprintf(edges_path, sizeof edges_path, "%.*s%s", (int)(*edges_out ? strlen(edges_out) : l), *edges_out ? edges_out : out, *edges_out ? "" : "_edges.npy");
        ch_array_desc_t ed = {CH_DT_FLOAT64, 0, 0, 1, {rd.shape[0] + 1}};
        if (!s && edges) s = ch_npy_write(edges_path, &ed, edges);
        if (!s) ch_log_info("cohort-reduce: %s -> %s (%s, %lld elements)", ch_reduce_kind_name(spec.op), out, ch_array_dtype_name(rd.dtype), (long long)ch_array_desc_count(&rd));
    }
    if (ch_job_agree(job, s, "writing the result")) return ch_job_finalize(job, CH_EXIT_ERROR);
    ch_reduce_ckpt_remove(dir, ch_job_rank(job));
    if (!ch_job_agree(job, CH_OK, "cleanup") && ch_job_rank(job) == 0) rmdir(dir);
    return ch_job_finalize(job, CH_EXIT_OK);
}
