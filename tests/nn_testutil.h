/* Helpers shared by test_nn, test_models and test_optim (not installed):
 * running golden scripts, reading their safetensors files, comparing. */
#ifndef COHORT_TESTS_NN_TESTUTIL_H
#define COHORT_TESTS_NN_TESTUTIL_H

#include "tests/harness.h"

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

#endif
