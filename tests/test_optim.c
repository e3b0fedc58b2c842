/* Tests for framework/optim (SGD) and framework/lr_schedule against
 * hand-computed values and PyTorch (tests/golden/optim_golden.py). */
#include "config.h"

#include "tests/nn_testutil.h"

#include "framework/train/lr_schedule.h"
#include "framework/train/optim.h"

/* same table as optim_golden.py: momentum, dampening, weight_decay, nesterov */
static const ch_sgd_options_t combos[] = {
    {0, 0.0, 0.0, 0.0, 0}, {0, 0.0, 0.0, 0.005, 0}, {0, 0.9, 0.0, 0.0, 0},
    {0, 0.9, 0.0, 0.005, 0}, {0, 0.9, 0.1, 0.005, 0}, {0, 0.9, 0.0, 0.005, 1},
    {0, 0.5, 0.3, 0.01, 0}, {0, 0.9, 0.0, 0.0, 1},
};

static void test_sgd_by_hand(void **state)
{
    /* p = 1, g = 0.5, lr 0.1, momentum 0.9, wd 0.1, dampening 0:
     * step 1: d = 0.5 + 0.1 = 0.6, buf = 0.6, p = 1 - 0.06 = 0.94
     * step 2 (g = 0.5): d = 0.5 + 0.094 = 0.594, buf = 0.54 + 0.594 = 1.134,
     *   p = 0.94 - 0.1134 = 0.8266 */
    ch_sgd_options_t o = {0.1, 0.9, 0.0, 0.1, 0};
    ch_sgd_t *s;
    float p = 1.0f, g = 0.5f;
    assert_ch_ok(ch_sgd_create(&o, &s));
    assert_ch_ok(ch_sgd_add_param(s, "w", &p, &g, 1));
    const float *buf;
    int has;
    assert_ch_ok(ch_sgd_buffer(s, 0, NULL, &buf, NULL, &has));
    assert_int_equal(has, 0);
    assert_null(buf);
    assert_ch_ok(ch_sgd_step(s));
    assert_float_equal(p, 0.94f, 1e-6);
    assert_ch_ok(ch_sgd_buffer(s, 0, NULL, &buf, NULL, &has));
    assert_int_equal(has, 1);
    assert_float_equal(buf[0], 0.6f, 1e-6);
    assert_ch_ok(ch_sgd_step(s));
    assert_float_equal(p, 0.8266f, 1e-6);
    assert_float_equal(buf[0], 1.134f, 1e-6);
    ch_sgd_destroy(s);

    /* nesterov, first step: d = g = 1, buf = 1, direction = 1 + 0.9 = 1.9 */
    ch_sgd_options_t on = {0.1, 0.9, 0.0, 0.0, 1};
    p = 0.0f;
    g = 1.0f;
    assert_ch_ok(ch_sgd_create(&on, &s));
    assert_ch_ok(ch_sgd_add_param(s, "w", &p, &g, 1));
    assert_ch_ok(ch_sgd_step(s));
    assert_float_equal(p, -0.19f, 1e-7);
    ch_sgd_destroy(s);
}

static void test_sgd_errors(void **state)
{
    ch_sgd_t *s = NULL;
    ch_sgd_options_t o = {-0.1, 0, 0, 0, 0};
    assert_ch_error(ch_sgd_create(&o, &s), CH_ERR_INVALID, "learning rate");
    o = (ch_sgd_options_t){0.1, -1, 0, 0, 0};
    assert_ch_error(ch_sgd_create(&o, &s), CH_ERR_INVALID, "momentum");
    o = (ch_sgd_options_t){0.1, 0.9, 0, -1, 0};
    assert_ch_error(ch_sgd_create(&o, &s), CH_ERR_INVALID, "weight_decay");
    o = (ch_sgd_options_t){0.1, 0.0, 0, 0, 1};
    assert_ch_error(ch_sgd_create(&o, &s), CH_ERR_INVALID, "nesterov");
    o = (ch_sgd_options_t){0.1, 0.9, 0.1, 0, 1};
    assert_ch_error(ch_sgd_create(&o, &s), CH_ERR_INVALID, "nesterov");
    o = (ch_sgd_options_t){NAN, 0.9, 0, 0, 0};
    assert_ch_error(ch_sgd_create(&o, &s), CH_ERR_INVALID, "learning rate");

    o = (ch_sgd_options_t){0.1, 0.9, 0, 0, 0};
    float p[4] = {0}, g[4] = {0}, b[3] = {0};
    assert_ch_ok(ch_sgd_create(&o, &s));
    assert_ch_ok(ch_sgd_add_param(s, "a", p, g, 4));
    assert_ch_error(ch_sgd_add_param(s, "a", p, g, 4), CH_ERR_INVALID, "'a' added twice");
    assert_ch_error(ch_sgd_load_buffer(s, "b", b, 3), CH_ERR_INVALID, "no parameter named 'b'");
    assert_ch_error(ch_sgd_load_buffer(s, "a", b, 3), CH_ERR_INVALID, "3 elements, expected 4");
    assert_ch_error(ch_sgd_buffer(s, 1, NULL, NULL, NULL, NULL), CH_ERR_INVALID, "index 1");
    ch_sgd_destroy(s);

    o.momentum = 0;
    assert_ch_ok(ch_sgd_create(&o, &s));
    assert_ch_ok(ch_sgd_add_param(s, "a", p, g, 4));
    assert_ch_error(ch_sgd_load_buffer(s, "a", p, 4), CH_ERR_INVALID, "momentum is 0");
    ch_sgd_destroy(s);
}

/* Resuming from exported momentum buffers continues bit for bit. */
static void test_sgd_resume(void **state)
{
    enum { N = 257 };
    float p1[N], p2[N], g[N];
    ch_sgd_options_t o = {0.05, 0.9, 0.1, 0.005, 0};
    for (int i = 0; i < N; i++) {
        p1[i] = sinf((float)i);
        g[i] = cosf(3.0f * (float)i);
    }
    ch_sgd_t *a, *b;
    assert_ch_ok(ch_sgd_create(&o, &a));
    assert_ch_ok(ch_sgd_add_param(a, "layer.weight", p1, g, N));
    for (int k = 0; k < 3; k++) assert_ch_ok(ch_sgd_step(a));
    memcpy(p2, p1, sizeof p1);
    const char *name;
    const float *buf;
    size_t n;
    int has;
    assert_ch_ok(ch_sgd_buffer(a, 0, &name, &buf, &n, &has));
    assert_string_equal(name, "layer.weight");
    assert_int_equal(n, N);
    assert_true(has);
    assert_ch_ok(ch_sgd_create(&o, &b));
    assert_ch_ok(ch_sgd_add_param(b, "layer.weight", p2, g, N));
    assert_ch_ok(ch_sgd_load_buffer(b, "layer.weight", buf, n));
    for (int k = 0; k < 2; k++) {
        g[k] += 0.25f;
        assert_ch_ok(ch_sgd_step(a));
        assert_ch_ok(ch_sgd_step(b));
    }
    assert_memory_equal(p1, p2, sizeof p1);
    /* a fresh optimizer without the buffer does differ */
    float p3[N];
    memcpy(p3, p2, sizeof p3);
    ch_sgd_reset(b);
    assert_ch_ok(ch_sgd_step(a));
    assert_ch_ok(ch_sgd_step(b));
    assert_true(memcmp(p1, p2, sizeof p1) != 0);
    ch_sgd_destroy(a);
    ch_sgd_destroy(b);
}

static void test_sgd_golden(void **state)
{
    if (!nt_have_torch()) ch_test_skip("python3-torch not available (HAVE_TORCH != yes)");
    char dir[1024], path[1200];
    assert_int_equal(nt_run_golden("optim_golden.py", "optim", "", dir, sizeof dir), 0);
    snprintf(path, sizeof path, "%s/sgd.safetensors", dir);
    ch_safetensors_t *st;
    assert_ch_ok(ch_safetensors_open(path, &st));
    size_t n0, n1, nl;
    float *init0 = nt_read_f32(st, "init.p0", &n0), *init1 = nt_read_f32(st, "init.p1", &n1);
    float *lrs = nt_read_f32(st, "lr", &nl);
    float *grads[5][2];
    char name[64];
    for (int s = 0; s < 5; s++) {
        snprintf(name, sizeof name, "grad.%d.p0", s);
        grads[s][0] = nt_read_f32(st, name, NULL);
        snprintf(name, sizeof name, "grad.%d.p1", s);
        grads[s][1] = nt_read_f32(st, name, NULL);
    }
    float *p0 = malloc(n0 * sizeof(float)), *p1 = malloc(n1 * sizeof(float));
    float *g0 = malloc(n0 * sizeof(float)), *g1 = malloc(n1 * sizeof(float));
    for (size_t k = 0; k < sizeof combos / sizeof combos[0]; k++) {
        ch_sgd_options_t o = combos[k];
        o.lr = lrs[0];
        ch_sgd_t *s;
        memcpy(p0, init0, n0 * sizeof(float));
        memcpy(p1, init1, n1 * sizeof(float));
        assert_ch_ok(ch_sgd_create(&o, &s));
        assert_ch_ok(ch_sgd_add_param(s, "p0", p0, g0, n0));
        assert_ch_ok(ch_sgd_add_param(s, "p1", p1, g1, n1));
        for (size_t step = 0; step < nl; step++) {
            memcpy(g0, grads[step][0], n0 * sizeof(float));
            memcpy(g1, grads[step][1], n1 * sizeof(float));
            ch_sgd_set_lr(s, lrs[step]);
            assert_ch_ok(ch_sgd_step(s));
        }
        for (int i = 0; i < 2; i++) {
            char what[96];
            snprintf(name, sizeof name, "c%zu.final.p%d", k, i);
            float *ref = nt_read_f32(st, name, NULL);
            snprintf(what, sizeof what, "combo %zu param %d", k, i);
            nt_assert_close(i ? p1 : p0, ref, i ? n1 : n0, 1e-6, what);
            free(ref);
            snprintf(name, sizeof name, "c%zu.buf.p%d", k, i);
            const float *buf;
            int has;
            assert_ch_ok(ch_sgd_buffer(s, i, NULL, &buf, NULL, &has));
            assert_int_equal(has, ch_safetensors_find(st, name) != NULL);
            if (has) {
                ref = nt_read_f32(st, name, NULL);
                snprintf(what, sizeof what, "combo %zu momentum buffer %d", k, i);
                nt_assert_close(buf, ref, i ? n1 : n0, 1e-6, what);
                free(ref);
            }
        }
        ch_sgd_destroy(s);
    }
    free(p0); free(p1); free(g0); free(g1);
    free(init0); free(init1); free(lrs);
    for (int s = 0; s < 5; s++) { free(grads[s][0]); free(grads[s][1]); }
    ch_safetensors_destroy(st);
}

static void test_cosine(void **state)
{
    ch_lr_cosine_t c;
    assert_ch_error(ch_lr_cosine_init(&c, 0.1, 0.01, 0), CH_ERR_INVALID, "epochs = 0");
    assert_ch_error(ch_lr_cosine_init(&c, 0.1, 1.5, 10), CH_ERR_INVALID, "lrf = 1.5");
    assert_ch_error(ch_lr_cosine_init(&c, -0.1, 0.1, 10), CH_ERR_INVALID, "base lr");
    assert_ch_ok(ch_lr_cosine_init(&c, 0.02, 0.01, 20));
    assert_true(ch_lr_cosine_get(&c) == 0.02);
    for (int e = 1; e <= 20; e++) {
        double prev = ch_lr_cosine_get(&c);
        double now = ch_lr_cosine_step(&c);
        assert_true(now < prev); /* strictly decreasing over the schedule */
    }
    assert_float_equal(ch_lr_cosine_get(&c), 0.02 * 0.01, 1e-15);
    assert_float_equal(ch_lr_cosine_at(0.02, 0.01, 20, 10), 0.02 * (0.5 * 0.99 + 0.01), 1e-15);
    assert_ch_ok(ch_lr_cosine_set_epoch(&c, 3));
    assert_true(ch_lr_cosine_get(&c) == ch_lr_cosine_at(0.02, 0.01, 20, 3));

    if (!nt_have_torch()) ch_test_skip("python3-torch not available (HAVE_TORCH != yes)");
    char dir[1024], path[1200];
    assert_int_equal(nt_run_golden("optim_golden.py", "optim", "", dir, sizeof dir), 0);
    snprintf(path, sizeof path, "%s/cosine.txt", dir);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    assert_ch_ok(ch_lr_cosine_init(&c, 0.02, 0.01, 20));
    int e = 0;
    double ref;
    while (fscanf(f, "%lf", &ref) == 1) {
        double mine = ch_lr_cosine_get(&c);
        if (fabs(mine - ref) > 1e-15 * ref) fail_msg("epoch %d: lr %.17g, torch %.17g", e, mine, ref);
        ch_lr_cosine_step(&c);
        e++;
    }
    fclose(f);
    assert_int_equal(e, 21);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sgd_by_hand),
        cmocka_unit_test(test_sgd_errors),
        cmocka_unit_test(test_sgd_resume),
        cmocka_unit_test(test_sgd_golden),
        cmocka_unit_test(test_cosine),
    };
    return ch_test_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
