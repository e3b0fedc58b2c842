/* Benchmark (not a test): checkpoint I/O of a real state dict.
 *
 *   tests/bench_checkpoint STATE.safetensors OUTDIR [REPS]
 *
 * STATE: a state dict, e.g. resnet18's from tests/golden/safetensors_golden.py
 * (tests/golden-out/safetensors/torch_hand.safetensors after make check).
 * Times, over REPS runs (default 7), median and min in milliseconds:
 *   open      ch_safetensors_open alone (map the file, parse and validate the header)
 *   load      open + copy every tensor into preallocated, already touched
 *             buffers (what loading into a model's parameters costs) + close
 *   model     ch_checkpoint_write_model (atomic: temp file, fsync, rename, fsync dir)
 *   resume    ch_checkpoint_write_resume with a momentum buffer per F32 tensor
 *             that is not a running statistic (about twice the bytes)
 *   memory    ch_safetensors_serialize into a memory buffer
 * then, when $PYTHON3 is set, runs tests/golden/bench_checkpoint.py on the
 * same file for PyTorch's figures (torch.save/torch.load, and the
 * safetensors library when installed) measured the same way.
 */
#include "config.h"

#include "io/state/checkpoint.h"
#include "io/formats/safetensors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tests/bench_util.h"

static void report(const char *what, double *t, int reps, double mb)
{
    qsort(t, (size_t)reps, sizeof *t, bench_cmp_double);
    printf("%-8s %9.1f MB  median %8.2f ms  min %8.2f ms  (%7.0f MB/s at the median)\n", what, mb,
           t[reps / 2] * 1e3, t[0] * 1e3, mb / t[reps / 2]);
}

static void die(const char *what)
{
    fprintf(stderr, "bench_checkpoint: %s: %s\n", what, ch_error_message());
    exit(1);
}

int main(int argc, char **argv)
{
    ch_safetensors_t *st;
    ch_st_view_t *state, *mom;
    size_t n, nmom = 0, bytes = 0, mbytes = 0;
    int reps = argc > 3 ? atoi(argv[3]) : 7;
    double *t;
    char model[4096], resume[4096];
    ch_resume_info_t info = {.epoch = 1, .global_step = 469, .sampler_seed = 0, .sampler_epoch = 0,
                             .world_size = 2, .rng_state = "", .config = "bench"};

    if (argc < 3 || reps < 1) {
        fprintf(stderr, "usage: %s STATE.safetensors OUTDIR [REPS]\n", argv[0]);
        return 2;
    }
    t = calloc((size_t)reps, sizeof *t);
    snprintf(model, sizeof model, "%s/bench-model.safetensors", argv[2]);
    snprintf(resume, sizeof resume, "%s/bench-resume.safetensors", argv[2]);
    if (ch_safetensors_open(argv[1], &st)) die(argv[1]);
    n = ch_safetensors_count(st);
    state = calloc(n, sizeof *state);
    mom = calloc(n, sizeof *mom);
    for (size_t i = 0; i < n; i++) {
        state[i] = *ch_safetensors_at(st, i);
        bytes += state[i].nbytes;
        if (state[i].dtype == CH_ST_F32 && !strstr(state[i].name, "running_")) {
            mom[nmom] = state[i];
            mbytes += mom[nmom].nbytes;
            nmom++;
        }
    }
    printf("state dict %s: %zu tensors, %.1f MB; %zu momentum buffers, %.1f MB; %d runs each\n", argv[1], n,
           bytes / 1e6, nmom, mbytes / 1e6, reps);

    for (int r = 0; r < reps; r++) {
        ch_safetensors_t *x;
        double t0 = bench_now();
        if (ch_safetensors_open(argv[1], &x)) die("open");
        t[r] = bench_now() - t0;
        ch_safetensors_destroy(x);
    }
    report("open", t, reps, bytes / 1e6);
    {
        unsigned char *dst = malloc(bytes ? bytes : 1);
        memset(dst, 0, bytes); /* preallocated and touched, like a model's parameters */
        for (int r = 0; r < reps; r++) {
            ch_safetensors_t *x;
            size_t off = 0;
            double t0 = bench_now();
            if (ch_safetensors_open(argv[1], &x)) die("open");
            for (size_t i = 0; i < n; i++) {
                const ch_st_view_t *v = ch_safetensors_at(x, i);
                memcpy(dst + off, v->data, v->nbytes);
                off += v->nbytes;
            }
            ch_safetensors_destroy(x);
            t[r] = bench_now() - t0;
        }
        free(dst);
    }
    report("load", t, reps, bytes / 1e6);
    for (int r = 0; r < reps; r++) {
        double t0 = bench_now();
        if (ch_checkpoint_write_model(model, state, n)) die("model");
        t[r] = bench_now() - t0;
    }
    report("model", t, reps, bytes / 1e6);
    for (int r = 0; r < reps; r++) {
        double t0 = bench_now();
        if (ch_checkpoint_write_resume(resume, state, n, mom, nmom, &info, NULL, 0)) die("resume");
        t[r] = bench_now() - t0;
    }
    report("resume", t, reps, (bytes + mbytes) / 1e6);
    for (int r = 0; r < reps; r++) {
        void *buf;
        size_t size;
        double t0 = bench_now();
        if (ch_safetensors_serialize(state, n, NULL, 0, &buf, &size)) die("serialize");
        t[r] = bench_now() - t0;
        free(buf);
    }
    report("memory", t, reps, bytes / 1e6);
    unlink(model);
    unlink(resume);
    ch_safetensors_destroy(st);
    free(state);
    free(mom);
    free(t);
    fflush(stdout);

    if (getenv("PYTHON3") && getenv("COHORT_SRCDIR")) {
        char cmd[8192];
        snprintf(cmd, sizeof cmd, "'%s' '%s/tests/golden/bench_checkpoint.py' '%s' '%s' %d", getenv("PYTHON3"),
                 getenv("COHORT_SRCDIR"), argv[1], argv[2], reps);
        printf("PyTorch (%s):\n", getenv("PYTHON3"));
        fflush(stdout);
        return system(cmd) == 0 ? 0 : 1;
    }
    return 0;
}
