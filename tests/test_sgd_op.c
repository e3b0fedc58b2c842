/* Tests of ch_op_sgd_step (framework/ops/ops.h) on the CPU backend: the fused
 * step must equal an independent float32 transcription of torch.optim.SGD's
 * update written here (ref_step) bit for bit, and so must the optimizer
 * (framework/train/optim.c ch_sgd_step, which calls the same fused op), for plain SGD, momentum, Nesterov,
 * weight decay, dampening, the first step (buf = g) and later steps, and a
 * list where only some buffers are started. Also the chunk table the GPU
 * kernel uses (framework/ops/cuda/kernel_index.h) and argument errors. */
#include "config.h"

#include "tests/harness.h"

#include "framework/ops/ops.h"
#include "framework/ops/cuda/kernel_index.h"
#include "framework/train/optim.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NP 5
static const int64_t sizes[NP] = {1, 37, 1000, 0, 4099};

static uint64_t rng = 88172645463325252ull;
static float frand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

typedef struct {
    float *w_ref[NP], *w_op[NP], *g[NP], *b_op[NP];
} bufs_t;

static void bufs_init(bufs_t *b)
{
    for (int i = 0; i < NP; i++) {
        size_t n = (size_t)(sizes[i] > 0 ? sizes[i] : 1);
        b->w_ref[i] = malloc(n * sizeof(float));
        b->w_op[i] = malloc(n * sizeof(float));
        b->g[i] = malloc(n * sizeof(float));
        b->b_op[i] = malloc(n * sizeof(float));
        assert_non_null(b->w_ref[i]);
        assert_non_null(b->w_op[i]);
        assert_non_null(b->g[i]);
        assert_non_null(b->b_op[i]);
        for (size_t k = 0; k < n; k++) {
            b->w_ref[i][k] = b->w_op[i][k] = frand();
            b->b_op[i][k] = 1234.5f; /* garbage: the first step must overwrite it */
        }
    }
}

static void bufs_free(bufs_t *b)
{
    for (int i = 0; i < NP; i++) {
        free(b->w_ref[i]);
        free(b->w_op[i]);
        free(b->g[i]);
        free(b->b_op[i]);
    }
}

static void new_grads(bufs_t *b)
{
    for (int i = 0; i < NP; i++)
        for (int64_t k = 0; k < sizes[i]; k++) b->g[i][k] = frand() * 0.5f;
}

/* parameters and (when present) momentum buffers equal bit for bit */
static void compare(const bufs_t *b, ch_sgd_t *sgd, int step, const char *what)
{
    int j = 0;
    for (int i = 0; i < NP; i++) {
        if (sizes[i] == 0) continue;
        if (memcmp(b->w_ref[i], b->w_op[i], (size_t)sizes[i] * sizeof(float)) != 0)
            fail_msg("%s: step %d: parameter %d differs from ch_sgd_step", what, step, i);
        const float *buf = NULL;
        size_t numel = 0;
        int has = 0;
        assert_ch_ok(ch_sgd_buffer(sgd, j, NULL, &buf, &numel, &has));
        assert_int_equal(numel, (size_t)sizes[i]);
        if (has && memcmp(buf, b->b_op[i], numel * sizeof(float)) != 0)
            fail_msg("%s: step %d: momentum buffer %d differs from ch_sgd_step", what, step, i);
        j++;
    }
}

typedef struct {
    double lr, momentum, dampening, weight_decay;
    int nesterov;
    const char *name;
} cfg_t;

/* torch.optim.SGD (PyTorch 1.13 _single_tensor_sgd), element by element in
 * float32, written independently of framework/: d_p = grad + wd*p;
 * buf = clone(d_p) on the first step, else buf*mom + (1-damp)*d_p;
 * d_p = d_p + mom*buf (nesterov) or buf; p = p - lr*d_p. */
static void ref_step(float *w, const float *g, float *buf, int64_t n, const cfg_t *c, float lr,
                     int first)
{
    const float wd = (float)c->weight_decay, mom = (float)c->momentum;
    const float one_minus_damp = (float)(1.0 - c->dampening);
    for (int64_t k = 0; k < n; k++) {
        float d = g[k] + wd * w[k];
        if (mom != 0.0f) {
            float nb = first ? d : mom * buf[k] + one_minus_damp * d;
            buf[k] = nb;
            d = c->nesterov ? d + mom * nb : nb;
        }
        w[k] = w[k] - lr * d;
    }
}

static void run_cfg(ch_compute_t *cx, const cfg_t *c)
{
    bufs_t b;
    bufs_init(&b);
    ch_sgd_options_t o = {c->lr, c->momentum, c->dampening, c->weight_decay, c->nesterov};
    ch_sgd_t *sgd = NULL;
    assert_ch_ok(ch_sgd_create(&o, &sgd));
    char name[32];
    for (int i = 0; i < NP; i++) {
        if (sizes[i] == 0) continue; /* the optimizer holds no empty parameters */
        snprintf(name, sizeof name, "p%d", i);
        assert_ch_ok(ch_sgd_add_param(sgd, name, b.w_ref[i], b.g[i], (size_t)sizes[i]));
    }
    ch_sgd_tensor_t ts[NP];
    float *w_ind[NP], *b_ind[NP];
    for (int i = 0; i < NP; i++) {
        size_t n = (size_t)(sizes[i] > 0 ? sizes[i] : 1);
        w_ind[i] = malloc(n * sizeof(float));
        b_ind[i] = calloc(n, sizeof(float));
        assert_non_null(w_ind[i]);
        assert_non_null(b_ind[i]);
        memcpy(w_ind[i], b.w_op[i], n * sizeof(float));
    }
    for (int step = 0; step < 4; step++) {
        new_grads(&b);
        if (step == 2) ch_sgd_set_lr(sgd, c->lr * 0.5);
        ch_sgd_hparams_t h = {(float)ch_sgd_get_lr(sgd), (float)c->momentum, (float)c->dampening,
                              (float)c->weight_decay, c->nesterov};
        for (int i = 0; i < NP; i++) {
            ts[i].param = sizes[i] ? b.w_op[i] : NULL;
            ts[i].grad = sizes[i] ? b.g[i] : NULL;
            ts[i].momentum_buffer = c->momentum != 0.0 && sizes[i] ? b.b_op[i] : NULL;
            ts[i].numel = sizes[i];
            ts[i].buffer_started = step > 0;
        }
        assert_ch_ok(ch_sgd_step(sgd));
        assert_ch_ok(ch_op_sgd_step(cx, CH_DEV_CPU, 0, ts, NP, &h));
        compare(&b, sgd, step, c->name);
        for (int i = 0; i < NP; i++) {
            ref_step(w_ind[i], b.g[i], b_ind[i], sizes[i], c, h.lr, step == 0);
            if (sizes[i] && memcmp(w_ind[i], b.w_op[i], (size_t)sizes[i] * sizeof(float)))
                fail_msg("%s: step %d: parameter %d differs from the reference transcription of "
                         "torch.optim.SGD", c->name, step, i);
        }
    }
    for (int i = 0; i < NP; i++) {
        free(w_ind[i]);
        free(b_ind[i]);
    }
    /* the update did something (a test that cannot fail is a defect) */
    int moved = 0;
    for (int64_t k = 0; k < sizes[2]; k++) moved |= b.w_op[2][k] != b.w_op[2][(k + 1) % sizes[2]];
    assert_true(moved);
    ch_sgd_destroy(sgd);
    bufs_free(&b);
}

static void test_matches_optim(void **state)
{
    (void)state;
    static const cfg_t cfgs[] = {
        {0.1, 0.0, 0.0, 0.0, 0, "plain"},
        {0.05, 0.0, 0.0, 1e-4, 0, "plain+wd"},
        {0.1, 0.9, 0.0, 0.0, 0, "momentum"},
        {0.1, 0.9, 0.0, 5e-4, 0, "momentum+wd"},
        {0.1, 0.9, 0.0, 5e-4, 1, "nesterov+wd"},
        {0.02, 0.9, 0.5, 1e-4, 0, "dampening 0.5"},
        {0.3, 0.8, 0.1, 0.01, 0, "dampening 0.1"},
        {0.1, 0.9, 0.0, 0.0, 1, "nesterov"},
    };
    ch_compute_t *cx = NULL;
    assert_ch_ok(ch_compute_create(NULL, &cx));
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) run_cfg(cx, &cfgs[i]);
    ch_compute_destroy(cx);
}

/* Only some buffers started: the optimizer after ch_sgd_load_buffer of one
 * parameter, the op with per-tensor flags. */
static void test_mixed_started(void **state)
{
    (void)state;
    bufs_t b;
    bufs_init(&b);
    ch_sgd_options_t o = {0.1, 0.9, 0.0, 1e-4, 1};
    ch_sgd_t *sgd = NULL;
    assert_ch_ok(ch_sgd_create(&o, &sgd));
    char name[32];
    for (int i = 0; i < NP; i++) {
        if (sizes[i] == 0) continue;
        snprintf(name, sizeof name, "p%d", i);
        assert_ch_ok(ch_sgd_add_param(sgd, name, b.w_ref[i], b.g[i], (size_t)sizes[i]));
    }
    for (int64_t k = 0; k < sizes[2]; k++) b.b_op[2][k] = frand();
    assert_ch_ok(ch_sgd_load_buffer(sgd, "p2", b.b_op[2], (size_t)sizes[2]));
    new_grads(&b);
    ch_sgd_tensor_t ts[NP];
    for (int i = 0; i < NP; i++) {
        ts[i].param = sizes[i] ? b.w_op[i] : NULL;
        ts[i].grad = sizes[i] ? b.g[i] : NULL;
        ts[i].momentum_buffer = sizes[i] ? b.b_op[i] : NULL;
        ts[i].numel = sizes[i];
        ts[i].buffer_started = i == 2;
    }
    ch_sgd_hparams_t h = {0.1f, 0.9f, 0.0f, 1e-4f, 1};
    ch_compute_t *cx = NULL;
    assert_ch_ok(ch_compute_create(NULL, &cx));
    assert_ch_ok(ch_sgd_step(sgd));
    assert_ch_ok(ch_op_sgd_step(cx, CH_DEV_CPU, 0, ts, NP, &h));
    compare(&b, sgd, 0, "mixed");
    ch_compute_destroy(cx);
    ch_sgd_destroy(sgd);
    bufs_free(&b);
}

static void test_errors(void **state)
{
    (void)state;
    ch_compute_t *cx = NULL;
    assert_ch_ok(ch_compute_create(NULL, &cx));
    float w[4] = {0}, g[4] = {0};
    ch_sgd_tensor_t t = {w, g, NULL, 4, 0};
    ch_sgd_hparams_t h = {0.1f, 0.9f, 0.0f, 0.0f, 0};
    assert_ch_error(ch_op_sgd_step(cx, CH_DEV_CPU, 0, &t, 1, &h), CH_ERR_INVALID,
                    "momentum buffer");
    assert_ch_error(ch_op_sgd_step(cx, CH_DEV_CPU, 0, &t, -1, &h), CH_ERR_INVALID, "-1 tensors");
    assert_ch_error(ch_op_sgd_step(cx, CH_DEV_CPU, 0, &t, 1, NULL), CH_ERR_INVALID,
                    "hyperparameters");
    ch_sgd_tensor_t bad = {NULL, g, NULL, 4, 0};
    h.momentum = 0.0f;
    assert_ch_error(ch_op_sgd_step(cx, CH_DEV_CPU, 0, &bad, 1, &h), CH_ERR_INVALID, "NULL param");
    /* momentum 0: no buffer needed; w -= lr * g */
    g[1] = 2.0f;
    assert_ch_ok(ch_op_sgd_step(cx, CH_DEV_CPU, 0, &t, 1, &h));
    assert_true(w[1] == -0.1f * 2.0f && w[0] == 0.0f);
    ch_compute_destroy(cx);
}

/* The GPU kernel's chunk table covers every element of every tensor exactly
 * once, in tensor order, with chunks of 1..CHUNK elements. */
static void test_chunk_table(void **state)
{
    (void)state;
    const int64_t numel[] = {0, 1, 16384, 16385, 5, 0, 40000, 3};
    const int n = (int)(sizeof numel / sizeof numel[0]);
    const int64_t chunks[] = {1, 7, 16384};
    for (size_t ci = 0; ci < sizeof chunks / sizeof chunks[0]; ci++) {
        const int64_t ck = chunks[ci];
        int64_t m = chk_sgd_count_chunks(numel, n, ck);
        int64_t expect = 0;
        for (int i = 0; i < n; i++) expect += (numel[i] + ck - 1) / ck;
        assert_int_equal(m, expect);
        chk_sgd_chunk_t *t = calloc((size_t)m, sizeof *t);
        assert_non_null(t);
        assert_int_equal(chk_sgd_fill_chunks(numel, n, ck, t), m);
        int64_t next_tensor = 0, next_start = 0;
        for (int64_t q = 0; q < m; q++) {
            while (next_tensor < n && next_start == numel[next_tensor]) {
                next_tensor++;
                next_start = 0;
            }
            assert_true(next_tensor < n);
            assert_int_equal(t[q].tensor, next_tensor);
            assert_int_equal(t[q].start, next_start);
            assert_true(t[q].len >= 1 && t[q].len <= ck);
            next_start += t[q].len;
        }
        /* all remaining tensors are fully covered (or empty) */
        while (next_tensor < n && next_start == numel[next_tensor]) {
            next_tensor++;
            next_start = 0;
        }
        assert_int_equal(next_tensor, n);
        free(t);
    }
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matches_optim),
        cmocka_unit_test(test_mixed_started),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_chunk_table),
    };
    return ch_test_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
