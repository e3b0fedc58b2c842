/* st_compare: compare two safetensors files tensor by tensor.
 *
 *   st_compare A B [--rtol R] [--bitwise] [--only-prefix P] [--skip-prefix P]
 *
 * For every tensor of A (optionally only names starting with P / skipping
 * names starting with P) B must have the same name, dtype and shape; the
 * relative error of a tensor is max|a-b| / max(max|b|, 1e-12). Prints the
 * worst tensor and exits 0 when every tensor is within R (default 1e-4), or
 * bit-identical with --bitwise; 1 otherwise; 2 on a read error.
 * --norm: the error is instead the relative L2 distance over all compared
 * float tensors together, ||a - b|| / ||b|| (torch.testing-style), which is
 * well conditioned for tensors that start at 0 (BN biases) where a per-tensor
 * max-relative error measures only rounding noise amplified by training.
 * Used by the training tests (equivalence, resume, PyTorch parity). */
#include "config.h"

#include "framework/core/status.h"
#include "io/formats/safetensors.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    const char *pa = NULL, *pb = NULL, *only = NULL, *skip = NULL;
    double rtol = 1e-4;
    int bitwise = 0, norm = 0;
    double d2 = 0, b2 = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--rtol") && i + 1 < argc) rtol = atof(argv[++i]);
        else if (!strcmp(argv[i], "--bitwise")) bitwise = 1;
        else if (!strcmp(argv[i], "--norm")) norm = 1;
        else if (!strcmp(argv[i], "--only-prefix") && i + 1 < argc) only = argv[++i];
        else if (!strcmp(argv[i], "--skip-prefix") && i + 1 < argc) skip = argv[++i];
        else if (!pa) pa = argv[i];
        else if (!pb) pb = argv[i];
        else {
            fprintf(stderr, "usage: st_compare A B [--rtol R] [--bitwise] [--only-prefix P] "
                            "[--skip-prefix P]\n");
            return 2;
        }
    }
    if (!pa || !pb) {
        fprintf(stderr, "usage: st_compare A B [--rtol R] [--bitwise]\n");
        return 2;
    }
    ch_safetensors_t *a = NULL, *b = NULL;
    if (ch_safetensors_open(pa, &a) || ch_safetensors_open(pb, &b)) {
        fprintf(stderr, "st_compare: %s\n", ch_error_message());
        ch_safetensors_destroy(a);
        return 2;
    }
    double worst = 0;
    const char *worst_name = "";
    int bad = 0;
    size_t compared = 0;
    for (size_t i = 0; i < ch_safetensors_count(a); i++) {
        const ch_st_view_t *ta = ch_safetensors_at(a, i);
        if (only && strncmp(ta->name, only, strlen(only))) continue;
        if (skip && !strncmp(ta->name, skip, strlen(skip))) continue;
        const ch_st_view_t *tb = ch_safetensors_find(b, ta->name);
        if (!tb || tb->dtype != ta->dtype || tb->nbytes != ta->nbytes || tb->ndim != ta->ndim) {
            printf("%s: missing or different dtype/shape in %s\n", ta->name, pb);
            bad = 1;
            continue;
        }
        compared++;
        if (bitwise) {
            if (memcmp(ta->data, tb->data, ta->nbytes)) {
                printf("%s: not bit-identical\n", ta->name);
                bad = 1;
            }
            continue;
        }
        size_t n = ta->nbytes / (ta->dtype == CH_ST_I64 ? 8 : 4);
        double maxdiff = 0, maxb = 1e-12;
        for (size_t k = 0; k < n; k++) {
            double x, y;
            if (ta->dtype == CH_ST_I64) {
                long long u, v;
                memcpy(&u, (const char *)ta->data + 8 * k, 8);
                memcpy(&v, (const char *)tb->data + 8 * k, 8);
                x = (double)u;
                y = (double)v;
            } else {
                float u, v;
                memcpy(&u, (const char *)ta->data + 4 * k, 4);
                memcpy(&v, (const char *)tb->data + 4 * k, 4);
                x = u;
                y = v;
            }
            if (!isfinite(x) || !isfinite(y)) maxdiff = INFINITY;
            maxdiff = fmax(maxdiff, fabs(x - y));
            if (ta->dtype == CH_ST_F32) {
                d2 += (x - y) * (x - y);
                b2 += y * y;
            }
            maxb = fmax(maxb, fabs(y));
        }
        double rel = maxdiff / maxb;
        if (!(rel <= worst)) {
            worst = rel;
            worst_name = ta->name;
        }
        if (!norm && !(rel <= rtol)) bad = 1;
    }
    double nrel = sqrt(d2) / fmax(sqrt(b2), 1e-30);
    if (norm && !bitwise && !(nrel <= rtol)) bad = 1;
    if (compared == 0) {
        printf("no tensors compared\n");
        bad = 1;
    }
    if (bitwise) printf("%zu tensors %s\n", compared, bad ? "DIFFER" : "bit-identical");
    else printf("%zu tensors, relative L2 error %.3g, max per-tensor relative error %.3g (%s); "
                "tolerance %.3g on the %s: %s\n", compared, nrel, worst, worst_name, rtol,
                norm ? "L2 error" : "per-tensor error", bad ? "FAIL" : "ok");
    ch_safetensors_destroy(a);
    ch_safetensors_destroy(b);
    return bad;
}
