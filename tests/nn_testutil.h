/* Helpers shared by test_nn, test_models and test_optim (not installed):
 * running golden scripts, reading their safetensors files, comparing. */
#ifndef COHORT_TESTS_NN_TESTUTIL_H
#define COHORT_TESTS_NN_TESTUTIL_H

#include "tests/harness.h"

#include "framework/nn/nn_exec.h"
#include "models/models.h"
#include "io/formats/safetensors.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

static inline int nt_have_torch(void)
{
    const char *h = getenv("HAVE_TORCH");
    return h && !strcmp(h, "yes");
}

/* Run tests/golden/<script> with args in the build tree's
 * tests/golden-out/<sub> (created); a call repeated in one process reuses
 * the first successful run. Returns the
 * directory in dir. 0 on success. */
static inline int nt_run_golden(const char *script, const char *sub, const char *args, char *dir,
                                size_t len)
{
    static char done[8][512];
    static int ndone;
    char key[512];
    const char *py = getenv("PYTHON3");
    char cmd[4096];
    snprintf(dir, len, "%s/tests/golden-out/%s", ch_test_builddir(), sub);
    snprintf(key, sizeof key, "%s|%s|%s", script, sub, args ? args : "");
    for (int i = 0; i < ndone; i++)
        if (!strcmp(done[i], key)) return 0; /* already made by this process */
    snprintf(cmd, sizeof cmd, "mkdir -p '%s' && OMP_NUM_THREADS=1 '%s' '%s/tests/golden/%s' '%s' %s",
             dir, py ? py : "python3", ch_test_srcdir(), script, dir, args ? args : "");
    int rc = system(cmd);
    rc = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
    if (rc == 0 && ndone < 8) snprintf(done[ndone++], sizeof done[0], "%s", key);
    return rc;
}

/* Copy a float32 tensor of a golden file into a malloc'd array (n floats). */
static inline float *nt_read_f32(const ch_safetensors_t *st, const char *name, size_t *n)
{
    const ch_st_view_t *v = ch_safetensors_find(st, name);
    if (!v) fail_msg("golden file lacks tensor '%s'", name);
    if (v->dtype != CH_ST_F32) fail_msg("golden tensor '%s' is not F32", name);
    size_t k = (size_t)ch_st_view_numel(v);
    float *d = malloc((k ? k : 1) * sizeof(float));
    assert_non_null(d);
    memcpy(d, v->data, k * sizeof(float));
    if (n) *n = k;
    return d;
}

/* max |a-b| / (max |b| + floor): a tensor-level relative error. */
static inline double nt_rel_err(const float *a, const float *b, size_t n, double floor_)
{
    double md = 0, mb = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= md)) md = d; /* catches NaN */
        if (fabs((double)b[i]) > mb) mb = fabs((double)b[i]);
    }
    return md / (mb + floor_);
}

/* Fail with a message when the relative error exceeds tol. */
#define nt_assert_close(a, b, n, tol, what)                                    \
    do {                                                                       \
        double nt_e_ = nt_rel_err((a), (b), (n), 1e-12);                       \
        if (!(nt_e_ <= (tol)))                                                 \
            fail_msg("%s: relative error %.3g > %.1g", (what), nt_e_, (double)(tol)); \
    } while (0)

/* ch_model_create(arch) with 1 input channel, 10 classes and `seed`. */
static inline ch_model_t *nt_model_1x10(const char *arch, uint64_t seed)
{
    ch_model_options_t o;
    ch_model_options_default(&o);
    o.in_channels = 1;
    o.num_classes = 10;
    o.seed = seed;
    ch_model_t *m = NULL;
    assert_ch_ok(ch_model_create(arch, &o, &m));
    return m;
}

/* Copies of the "sd.<name>" tensors of a golden file as state-dict views
 * (names point into st; at most capacity, the count in *n); free with
 * nt_golden_sd_free. */
static inline ch_nn_view_t *nt_golden_sd(const ch_safetensors_t *st, int capacity, int *n)
{
    ch_nn_view_t *views = calloc((size_t)capacity, sizeof *views);
    *n = 0;
    for (size_t i = 0; i < ch_safetensors_count(st); i++) {
        const ch_st_view_t *v = ch_safetensors_at(st, i);
        if (strncmp(v->name, "sd.", 3)) continue;
        assert_true(*n < capacity);
        ch_nn_view_t *w = &views[(*n)++];
        w->name = v->name + 3;
        w->dtype = v->dtype == CH_ST_F32 ? CH_F32 : CH_I64;
        w->ndim = v->ndim;
        w->numel = (size_t)ch_st_view_numel(v);
        for (int d = 0; d < v->ndim; d++) w->shape[d] = v->shape[d];
        w->data = malloc(v->nbytes ? v->nbytes : 1);
        memcpy(w->data, v->data, v->nbytes);
    }
    return views;
}

static inline void nt_golden_sd_free(ch_nn_view_t *views, int n)
{
    for (int i = 0; i < n; i++) free(views[i].data);
    free(views);
}

/* The batch of a golden file: "x" (N, C, H, W) float32 and "y" (N) int64,
 * copied into new CPU tensors. */
static inline void nt_golden_batch(const ch_safetensors_t *st, ch_tensor_t *x, ch_tensor_t *y)
{
    const ch_st_view_t *vx = ch_safetensors_find(st, "x"), *vy = ch_safetensors_find(st, "y");
    assert_non_null(vx);
    assert_non_null(vy);
    assert_ch_ok(ch_tensor_alloc_f32(x, 4, vx->shape));
    memcpy(x->data, vx->data, vx->nbytes);
    assert_ch_ok(ch_tensor_alloc(y, CH_I64, 1, vy->shape, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    memcpy(y->data, vy->data, vy->nbytes);
}

/* A training-mode forward and loss of m on (x, y), checked against the
 * golden file's "logits" and "loss" (relative 1e-4). */
static inline void nt_golden_forward_loss(const ch_safetensors_t *st, ch_model_t *m,
                                          ch_compute_t *cx, const ch_tensor_t *x,
                                          const ch_tensor_t *y)
{
    const ch_tensor_t *logits;
    float loss;
    ch_model_train(m, 1);
    assert_ch_ok(ch_model_forward(m, cx, x, &logits));
    assert_ch_ok(ch_model_loss(m, cx, y, &loss));
    float *ref = nt_read_f32(st, "logits", NULL);
    nt_assert_close(ch_tensor_f32(logits), ref, (size_t)ch_tensor_numel(logits), 1e-4, "logits");
    free(ref);
    ref = nt_read_f32(st, "loss", NULL);
    if (fabs(loss - ref[0]) > 1e-4 * fabs(ref[0])) fail_msg("loss %.7g vs torch %.7g", loss, ref[0]);
    free(ref);
}

/* A CPU compute context on `threads` threads (ch_compute_options_default). */
static inline ch_compute_t *nt_make_cx(int threads)
{
    ch_compute_options_t o;
    ch_compute_options_default(&o);
    o.num_threads = threads;
    ch_compute_t *cx = NULL;
    assert_ch_ok(ch_compute_create(&o, &cx));
    return cx;
}

/* t in layout l: a new CPU tensor (ch_op_reorder). */
static inline void nt_relayout(ch_compute_t *cx, const ch_tensor_t *t, ch_layout_t l,
                               ch_tensor_t *out)
{
    assert_ch_ok(ch_tensor_alloc(out, CH_F32, t->ndim, t->shape, l, CH_DEV_CPU, 0));
    assert_ch_ok(ch_op_reorder(cx, t, out));
}

#endif
