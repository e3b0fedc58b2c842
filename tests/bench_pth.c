/* Benchmark (not a test): reading pretrained weights from a PyTorch .pth vs
 * the same weights as safetensors, through the library's loader.
 *
 *   tests/bench_pth ARCH CLASSES WEIGHTS.pth WEIGHTS.safetensors [REPS]
 *
 * e.g. resnet50 1000 with the files of `tests/golden/pth_golden.py
 * --resnet50 DIR`. Both files are read once first (page cache warm); then,
 * REPS times each (default 9), alternating, ch_train_state_load_pretrained
 * into one ARCH model (open, validate, copy every tensor into the model)
 * and, separately, the reader alone (ch_pth_open / ch_safetensors_open plus
 * a read of every tensor's first and last byte, then close). Prints the
 * median and min in milliseconds. PyTorch's torch.load on the same .pth:
 * tests/golden/bench_pth_torch.py.
 */
#include "config.h"

#include "framework/core/log.h"
#include "io/formats/pth.h"
#include "io/formats/safetensors.h"
#include "io/state/train_state.h"
#include "models/models.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tests/bench_util.h"

static void report(const char *what, double *t, int n)
{
    qsort(t, (size_t)n, sizeof *t, bench_cmp_double);
    printf("%-34s median %8.2f ms   min %8.2f ms\n", what, 1e3 * t[n / 2], 1e3 * t[0]);
}

static unsigned touch(const ch_st_view_t *v)
{
    const unsigned char *b = v->data;
    return v->nbytes ? b[0] + b[v->nbytes - 1] : 0;
}

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: %s ARCH CLASSES WEIGHTS.pth WEIGHTS.safetensors [REPS]\n", argv[0]);
        return 2;
    }
    int reps = argc > 5 ? atoi(argv[5]) : 9;
    if (reps < 1 || reps > 1000) reps = 9;
    ch_log_set_level(CH_LOG_WARN);
    ch_model_options_t mo;
    ch_model_options_default(&mo);
    mo.num_classes = atoi(argv[2]);
    mo.in_channels = 3;
    ch_model_t *m = NULL;
    if (ch_model_create(argv[1], &mo, &m)) {
        fprintf(stderr, "%s\n", ch_error_message());
        return 1;
    }
    double *t[4];
    for (int k = 0; k < 4; k++) t[k] = calloc((size_t)reps, sizeof(double));
    volatile unsigned sink = 0;
    for (int r = -1; r < reps; r++) { /* r = -1: warm the page cache */
        for (int f = 0; f < 2; f++) {
            double t0 = bench_now();
            if (ch_train_state_load_pretrained(m, argv[3 + f], NULL, NULL)) {
                fprintf(stderr, "%s\n", ch_error_message());
                return 1;
            }
            double t1 = bench_now();
            if (f == 0) {
                ch_pth_t *p = NULL;
                if (ch_pth_open(argv[3], NULL, &p)) return 1;
                for (size_t i = 0; i < ch_pth_count(p); i++) sink += touch(ch_pth_at(p, i));
                ch_pth_destroy(p);
            } else {
                ch_safetensors_t *s = NULL;
                if (ch_safetensors_open(argv[4], &s)) return 1;
                for (size_t i = 0; i < ch_safetensors_count(s); i++)
                    sink += touch(ch_safetensors_at(s, i));
                ch_safetensors_destroy(s);
            }
            double t2 = bench_now();
            if (r >= 0) {
                t[f][r] = t1 - t0;
                t[2 + f][r] = t2 - t1;
            }
        }
    }
    (void)sink;
    printf("%s, %d runs each, page cache warm\n", argv[1], reps);
    report("load_pretrained .pth", t[0], reps);
    report("load_pretrained .safetensors", t[1], reps);
    report("reader alone .pth", t[2], reps);
    report("reader alone .safetensors", t[3], reps);
    for (int k = 0; k < 4; k++) free(t[k]);
    ch_model_destroy(m);
    return 0;
}
