/* Benchmark (not a test): loading an ONNX file with the reader.
 *
 *   tests/bench_onnx MODEL.onnx [REPS]
 *
 * The file is loaded once first (page cache warm); then REPS times (default
 * 5) ch_onnx_load (map, wire scan, protobuf-c unpack, conversion, graph
 * checks) plus a read of every initializer's first and last element, then
 * ch_onnx_free. Prints the counts and the median and min in milliseconds.
 * The resnet50 file of docs/onnx.md ("Load time") is made with
 * tests/golden/onnx_golden.py's export call on torchvision's resnet50.
 */
#include "config.h"

#include "io/formats/onnx.h"

#include <stdio.h>
#include <stdlib.h>

#include "tests/bench_util.h"

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL.onnx [REPS]\n", argv[0]);
        return 2;
    }
    int reps = argc > 2 ? atoi(argv[2]) : 5;
    if (reps < 1 || reps > 1000) reps = 5;
    double *t = calloc((size_t)reps, sizeof *t);
    if (!t) return 1;
    volatile unsigned sink = 0;
    for (int r = -1; r < reps; r++) {
        double t0 = bench_now();
        ch_onnx_model_t *m = NULL;
        if (ch_onnx_load(argv[1], &m) != CH_OK) {
            fprintf(stderr, "%s\n", ch_error_message());
            return 1;
        }
        size_t bytes = 0;
        for (int k = 0; k < m->n_init; k++) {
            const ch_onnx_tensor_t *x = &m->init[k];
            const unsigned char *b = x->data;
            size_t nb = x->numel * (x->dtype == CH_F32 ? 4 : 8);
            if (nb) sink += b[0] + b[nb - 1];
            bytes += nb;
        }
        if (r < 0)
            printf("%s: opset %lld, %d nodes, %d initializers (%.1f MB)\n", argv[1], (long long)m->opset,
                   m->n_nodes, m->n_init, (double)bytes / 1e6);
        ch_onnx_free(m);
        if (r >= 0) t[r] = bench_now() - t0;
    }
    qsort(t, (size_t)reps, sizeof *t, bench_cmp_double);
    printf("ch_onnx_load + free, %d runs: median %.1f ms, min %.1f ms\n", reps, 1e3 * t[reps / 2], 1e3 * t[0]);
    free(t);
    (void)sink;
    return 0;
}
