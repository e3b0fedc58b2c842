/* Tests for framework/train/optimizer (SGD / AdamW / RMSprop), schedule
 * (torchvision-recipe LR schedules), loss (label smoothing) and the
 * optimizer state in resume files, against PyTorch 1.13
 * (tests/golden/optimizer_golden.py) and by construction.
 *
 * Tolerances, and why:
 *  - AdamW / RMSprop vs torch: at most MAX_ULP units in the last place per
 *    element after 6 steps. cohort repeats ATen's CPU order of float32
 *    operations, including its fused multiply-adds (ops.h), so the result is
 *    expected to be bitwise; the allowance covers a torch build whose
 *    kernels fuse differently (another CPU capability than AVX2).
 *  - LR schedules: exact (the same double operations as torch's Python).
 *  - Label smoothing: relative 2e-6 (torch sums in float32, cohort in double).
 *  - Thread counts, CPU resume, SGD wrapper: bitwise.
 */
#include "config.h"

#include "tests/nn_testutil.h"

#include "framework/nn/nn.h"
#include "framework/ops/ops.h"
#include "framework/train/criterion.h"
#include "framework/train/lr_schedule.h"
#include "framework/train/optimizer.h"
#include "framework/train/schedule.h"
#include "io/state/train_state.h"
#include "models/models.h"

#include <stdint.h>
#include <unistd.h>

#define MAX_ULP 1
enum { STEPS = 6 };

/* same tables as optimizer_golden.py */
static const double adamw_combos[][5] = {
    {0.9, 0.999, 1e-8, 0.01, 0}, {0.9, 0.999, 1e-8, 0.0, 1},
    {0.8, 0.99, 1e-6, 0.1, 1},   {0.5, 0.9, 1e-8, 0.05, 0},
};
static const double rmsprop_combos[][5] = {
    {0.99, 1e-8, 0.0, 0.0, 0}, {0.9, 1e-8, 0.01, 0.0, 0}, {0.99, 1e-8, 0.0, 0.9, 0},
    {0.95, 1e-6, 0.005, 0.0, 1}, {0.99, 1e-8, 0.01, 0.5, 1},
};
static const double ls_values[] = {0.1, 0.25, 1.0};
static const double step_lrs[STEPS] = {0.01, 0.005, 0.02, 0.001, 0.01, 0.003};

static ch_optimizer_options_t adamw_opts(int k)
{
    ch_optimizer_options_t o;
    ch_optimizer_options_default(CH_OPTIM_ADAMW, &o);
    o.beta1 = adamw_combos[k][0];
    o.beta2 = adamw_combos[k][1];
    o.eps = adamw_combos[k][2];
    o.weight_decay = adamw_combos[k][3];
    o.amsgrad = adamw_combos[k][4] != 0;
    return o;
}

static ch_optimizer_options_t rmsprop_opts(int k)
{
    ch_optimizer_options_t o;
    ch_optimizer_options_default(CH_OPTIM_RMSPROP, &o);
    o.alpha = rmsprop_combos[k][0];
    o.eps = rmsprop_combos[k][1];
    o.weight_decay = rmsprop_combos[k][2];
    o.momentum = rmsprop_combos[k][3];
    o.centered = rmsprop_combos[k][4] != 0;
    return o;
}

/* Distance in units in the last place between two floats (NaN: huge). */
static int64_t ulp_dist(float a, float b)
{
    if (a != a || b != b) return INT64_MAX;
    int32_t ia, ib;
    memcpy(&ia, &a, 4);
    memcpy(&ib, &b, 4);
    int64_t la = ia < 0 ? (int64_t)INT32_MIN - ia : ia, lb = ib < 0 ? (int64_t)INT32_MIN - ib : ib;
    return la > lb ? la - lb : lb - la;
}

static int64_t max_ulp(const float *a, const float *b, size_t n)
{
    int64_t m = 0;
    for (size_t i = 0; i < n; i++) {
        int64_t d = ulp_dist(a[i], b[i]);
        if (d > m) m = d;
    }
    return m;
}

static const char *golden_dir(void)
{
    static char dir[1024];
    if (!nt_have_torch()) ch_test_skip("python3-torch not available (HAVE_TORCH != yes)");
    assert_int_equal(nt_run_golden("optimizer_golden.py", "optimizer", "", dir, sizeof dir), 0);
    return dir;
}

static ch_safetensors_t *open_golden(void)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/optimizer.safetensors", golden_dir());
    ch_safetensors_t *st;
    assert_ch_ok(ch_safetensors_open(path, &st));
    return st;
}

/* Run 6 steps of o on the golden parameters and compare parameters and
 * every state with torch's. */
static void check_golden(const ch_safetensors_t *st, const ch_optimizer_options_t *o,
                         const char *prefix, int64_t *worst)
{
    size_t n[2];
    float *p[2] = {nt_read_f32(st, "init.p0", &n[0]), nt_read_f32(st, "init.p1", &n[1])};
    float *g[2] = {malloc(n[0] * sizeof(float)), malloc(n[1] * sizeof(float))};
    float frozen[5] = {1, 2, 3, 4, 5}, frozen0[5];
    memcpy(frozen0, frozen, sizeof frozen);
    ch_optimizer_t *opt;
    assert_ch_ok(ch_optimizer_create(o, &opt));
    assert_ch_ok(ch_optimizer_add_param(opt, "p0", p[0], g[0], n[0]));
    assert_ch_ok(ch_optimizer_add_param(opt, "p1", p[1], g[1], n[1]));
    /* "frozen" is not added: like a requires_grad=False parameter */
    char name[128];
    for (int s = 0; s < STEPS; s++) {
        for (int i = 0; i < 2; i++) {
            snprintf(name, sizeof name, "grad.%d.p%d", s, i);
            float *gs = nt_read_f32(st, name, NULL);
            memcpy(g[i], gs, n[i] * sizeof(float));
            free(gs);
        }
        ch_optimizer_set_lr(opt, step_lrs[s]);
        assert_ch_ok(ch_optimizer_step(opt));
    }
    assert_int_equal(ch_optimizer_steps(opt), STEPS);
    for (int i = 0; i < 2; i++) {
        snprintf(name, sizeof name, "%s.final.p%d", prefix, i);
        float *ref = nt_read_f32(st, name, NULL);
        int64_t d = max_ulp(p[i], ref, n[i]);
        if (d > MAX_ULP) fail_msg("%s: parameter %d differs by %lld ulp", prefix, i, (long long)d);
        if (d > *worst) *worst = d;
        free(ref);
        for (int j = 0; j < ch_optimizer_num_state(opt); j++) {
            const char *sn = ch_optimizer_state_name(opt, j);
            snprintf(name, sizeof name, "%s.%s.p%d", prefix, sn, i);
            assert_non_null(ch_safetensors_find(st, name)); /* torch keeps that state too */
            ref = nt_read_f32(st, name, NULL);
            const float *buf;
            size_t m;
            int has;
            assert_ch_ok(ch_optimizer_state(opt, i, j, &buf, &m, &has));
            assert_true(has && m == n[i]);
            d = max_ulp(buf, ref, m);
            if (d > MAX_ULP) fail_msg("%s: %s of parameter %d differs by %lld ulp", prefix, sn, i,
                                      (long long)d);
            if (d > *worst) *worst = d;
            free(ref);
        }
    }
    assert_memory_equal(frozen, frozen0, sizeof frozen);
    ch_optimizer_destroy(opt);
    free(p[0]); free(p[1]); free(g[0]); free(g[1]);
}

static void test_adamw_rmsprop_golden(void **state)
{
    ch_safetensors_t *st = open_golden();
    int64_t worst = 0;
    char prefix[32];
    for (int k = 0; k < (int)(sizeof adamw_combos / sizeof adamw_combos[0]); k++) {
        ch_optimizer_options_t o = adamw_opts(k);
        snprintf(prefix, sizeof prefix, "adamw%d", k);
        check_golden(st, &o, prefix, &worst);
    }
    for (int k = 0; k < (int)(sizeof rmsprop_combos / sizeof rmsprop_combos[0]); k++) {
        ch_optimizer_options_t o = rmsprop_opts(k);
        snprintf(prefix, sizeof prefix, "rmsprop%d", k);
        check_golden(st, &o, prefix, &worst);
    }
    printf("# AdamW / RMSprop vs torch 1.13: max %lld ulp over all parameters and states\n",
           (long long)worst);
    ch_safetensors_destroy(st);
}

/* AdamW by hand, one element, step 1: m = 0.1 g, v = 0.001 g^2,
 * p' = p (1 - lr wd) - lr * (m / 0.1) / (sqrt(v / 0.001) + eps). */
static void test_adamw_by_hand(void **state)
{
    ch_optimizer_options_t o;
    ch_optimizer_options_default(CH_OPTIM_ADAMW, &o);
    assert_true(o.lr == 1e-3 && o.weight_decay == 0.01 && o.beta1 == 0.9 && o.beta2 == 0.999);
    o.lr = 0.1;
    float p = 2.0f, g = 0.5f;
    ch_optimizer_t *opt;
    assert_ch_ok(ch_optimizer_create(&o, &opt));
    assert_ch_ok(ch_optimizer_add_param(opt, "w", &p, &g, 1));
    assert_ch_ok(ch_optimizer_step(opt));
    /* 2 * 0.999 - 0.1 * 0.5 / (0.5 + 1e-8) */
    assert_float_equal(p, 2.0 * 0.999 - 0.1, 1e-6);
    ch_optimizer_destroy(opt);
}

/* The sgd kind is ch_sgd_t, bitwise. */
static void test_sgd_wrapper_bitwise(void **state)
{
    enum { N = 333 };
    float a[N], b[N], g[N];
    for (int i = 0; i < N; i++) {
        a[i] = b[i] = sinf((float)i);
        g[i] = cosf(0.7f * (float)i);
    }
    ch_sgd_options_t so = {0.05, 0.9, 0.1, 0.005, 0};
    ch_optimizer_options_t o;
    ch_optimizer_options_default(CH_OPTIM_SGD, &o);
    o.lr = so.lr;
    o.momentum = so.momentum;
    o.dampening = so.dampening;
    o.weight_decay = so.weight_decay;
    ch_sgd_t *s;
    ch_optimizer_t *opt;
    assert_ch_ok(ch_sgd_create(&so, &s));
    assert_ch_ok(ch_optimizer_create(&o, &opt));
    assert_ch_ok(ch_sgd_add_param(s, "w", a, g, N));
    assert_ch_ok(ch_optimizer_add_param(opt, "w", b, g, N));
    assert_int_equal(ch_optimizer_num_state(opt), 1);
    assert_string_equal(ch_optimizer_state_name(opt, 0), "momentum_buffer");
    assert_string_equal(ch_optimizer_param_name(opt, 0), "w");
    for (int k = 0; k < 4; k++) {
        ch_sgd_set_lr(s, 0.05 / (k + 1));
        ch_optimizer_set_lr(opt, 0.05 / (k + 1));
        assert_ch_ok(ch_sgd_step(s));
        assert_ch_ok(ch_optimizer_step(opt));
    }
    assert_memory_equal(a, b, sizeof a);
    const float *b1, *b2;
    assert_ch_ok(ch_sgd_buffer(s, 0, NULL, &b1, NULL, NULL));
    assert_ch_ok(ch_optimizer_state(opt, 0, 0, &b2, NULL, NULL));
    assert_memory_equal(b1, b2, N * sizeof(float));
    ch_sgd_destroy(s);
    ch_optimizer_destroy(opt);
}

/* Bitwise the same on 1 and 3 threads (large enough to be threaded). */
static void run_threads(const ch_optimizer_options_t *o, int threads, float *p, const float *g,
                        size_t n)
{
    ch_compute_options_t co;
    ch_compute_options_default(&co);
    co.num_threads = threads;
    ch_compute_t *cx;
    assert_ch_ok(ch_compute_create(&co, &cx));
    ch_optimizer_t *opt;
    assert_ch_ok(ch_optimizer_create(o, &opt));
    ch_optimizer_set_compute(opt, cx);
    assert_ch_ok(ch_optimizer_add_param(opt, "w", p, g, n));
    for (int k = 0; k < 3; k++) assert_ch_ok(ch_optimizer_step(opt));
    ch_optimizer_destroy(opt);
    ch_compute_destroy(cx);
}

static void test_thread_count_bitwise(void **state)
{
    const size_t n = 400003;
    float *g = malloc(n * sizeof(float)), *p1 = malloc(n * sizeof(float)),
          *p3 = malloc(n * sizeof(float));
    assert_true(g && p1 && p3);
    ch_optimizer_options_t os[2];
    os[0] = adamw_opts(2);
    os[1] = rmsprop_opts(4);
    for (int c = 0; c < 2; c++) {
        for (size_t i = 0; i < n; i++) {
            g[i] = sinf(0.01f * (float)i);
            p1[i] = p3[i] = cosf(0.003f * (float)i);
        }
        run_threads(&os[c], 1, p1, g, n);
        run_threads(&os[c], 3, p3, g, n);
        assert_memory_equal(p1, p3, n * sizeof(float));
        assert_true(p1[7] != cosf(0.003f * 7.0f)); /* it did update */
    }
    free(g); free(p1); free(p3);
}

static void test_errors_and_config(void **state)
{
    ch_optimizer_options_t o;
    ch_optimizer_t *opt = NULL;
    ch_optimizer_options_default(CH_OPTIM_ADAMW, &o);
    o.beta1 = 1.0;
    assert_ch_error(ch_optimizer_create(&o, &opt), CH_ERR_INVALID, "betas");
    ch_optimizer_options_default(CH_OPTIM_RMSPROP, &o);
    o.eps = -1;
    assert_ch_error(ch_optimizer_create(&o, &opt), CH_ERR_INVALID, "eps");
    ch_optimizer_options_default(CH_OPTIM_RMSPROP, &o);
    o.centered = 1;
    float p[3] = {0}, g[3] = {0}, s[2] = {0};
    assert_ch_ok(ch_optimizer_create(&o, &opt));
    assert_ch_ok(ch_optimizer_add_param(opt, "a", p, g, 3));
    assert_ch_error(ch_optimizer_add_param(opt, "a", p, g, 3), CH_ERR_INVALID, "added twice");
    assert_ch_error(ch_optimizer_load_state(opt, "a", "exp_avg", s, 3), CH_ERR_INVALID,
                    "no such state");
    assert_ch_error(ch_optimizer_load_state(opt, "a", "grad_avg", s, 2), CH_ERR_INVALID,
                    "2 elements, expected 3");
    assert_ch_error(ch_optimizer_load_state(opt, "b", "grad_avg", s, 3), CH_ERR_INVALID,
                    "no parameter named 'b'");
    ch_optimizer_destroy(opt);

    const ch_config_table_t t[4] = {ch_sgd_config_table(), ch_optimizer_config_table(),
                                    ch_lr_cosine_config_table(), ch_lr_schedule_config_table()};
    ch_config_t *cfg = NULL;
    char *dflt[] = {"prog", NULL};
    assert_ch_ok(ch_config_load_tables(t, 4, NULL, 1, dflt, &cfg));
    assert_ch_ok(ch_optimizer_options_from_config(cfg, &o));
    assert_true(o.kind == CH_OPTIM_SGD && o.lr == 0.01 && o.momentum == 0.9 &&
                o.weight_decay == 0.005); /* today's defaults */
    ch_lr_schedule_options_t so;
    assert_ch_ok(ch_lr_schedule_options_from_config(cfg, 0.02, &so));
    assert_true(so.kind == CH_LR_COSINE && so.warmup_epochs == 0 && so.epochs == 5);
    for (int e = 0; e <= 7; e++) /* bitwise today's cosine */
        assert_true(ch_lr_schedule_at(&so, e) == ch_lr_cosine_at(0.02, so.lrf, 5, e));
    ch_config_destroy(cfg);

    char *aw[] = {"prog", "--optimizer.name=adamw", "--optimizer.betas=0.8,0.95",
                  "--optimizer.amsgrad=true", NULL};
    assert_ch_ok(ch_config_load_tables(t, 4, NULL, 4, aw, &cfg));
    assert_ch_ok(ch_optimizer_options_from_config(cfg, &o));
    assert_true(o.kind == CH_OPTIM_ADAMW && o.beta1 == 0.8 && o.beta2 == 0.95 && o.amsgrad &&
                o.weight_decay == 0.01 && o.lr == 0.01);
    ch_config_destroy(cfg);

    char *bad[] = {"prog", "--optimizer.betas=0.8,0.95", NULL};
    assert_ch_ok(ch_config_load_tables(t, 4, NULL, 2, bad, &cfg));
    assert_ch_error(ch_optimizer_options_from_config(cfg, &o), CH_ERR_CONFIG,
                    "optimizer.betas (command line");
    ch_config_destroy(cfg);
    /* repeating a default is not a choice (jobs/train.cfg writes every SGD key) */
    char *rep[] = {"prog", "--optimizer.name=adamw", "--optimizer.nesterov=false",
                   "--optimizer.momentum=0.9", "--optimizer.weight_decay=0.005", NULL};
    assert_ch_ok(ch_config_load_tables(t, 4, NULL, 5, rep, &cfg));
    assert_ch_ok(ch_optimizer_options_from_config(cfg, &o));
    assert_true(o.kind == CH_OPTIM_ADAMW && o.weight_decay == 0.005); /* as given */
    ch_config_destroy(cfg);
    char *bad1[] = {"prog", "--optimizer.name=rmsprop", "--optimizer.nesterov=true", NULL};
    assert_ch_ok(ch_config_load_tables(t, 4, NULL, 3, bad1, &cfg));
    assert_ch_error(ch_optimizer_options_from_config(cfg, &o), CH_ERR_CONFIG,
                    "optimizer.nesterov (command line");
    ch_config_destroy(cfg);
    char *bad2[] = {"prog", "--optimizer.name=adamw", "--optimizer.betas=0.8", NULL};
    assert_ch_ok(ch_config_load_tables(t, 4, NULL, 3, bad2, &cfg));
    assert_ch_error(ch_optimizer_options_from_config(cfg, &o), CH_ERR_CONFIG,
                    "expected two numbers");
    ch_config_destroy(cfg);
    char *ca[] = {"prog", "--schedule.name=cosine_annealing", "--schedule.warmup_epochs=2",
                  "--schedule.lr_min=0.001", NULL};
    assert_ch_ok(ch_config_load_tables(t, 4, NULL, 4, ca, &cfg));
    assert_ch_ok(ch_lr_schedule_options_from_config(cfg, 0.1, &so));
    assert_true(so.kind == CH_LR_COSINE_ANNEALING && so.warmup_epochs == 2 &&
                so.warmup_method == CH_LR_WARMUP_CONSTANT && so.warmup_factor == 0.01 &&
                so.lr_min == 0.001); /* torchvision's warmup defaults */
    assert_true(ch_lr_schedule_at(&so, 0) == 0.1 * 0.01);
    ch_config_destroy(cfg);
    char *bad3[] = {"prog", "--schedule.name=multistep", NULL};
    assert_ch_ok(ch_config_load_tables(t, 4, NULL, 2, bad3, &cfg));
    assert_ch_error(ch_lr_schedule_options_from_config(cfg, 0.1, &so), CH_ERR_CONFIG,
                    "schedule.milestones");
    ch_config_destroy(cfg);
    char *bad4[] = {"prog", "--schedule.name=multistep", "--schedule.milestones=5,3", NULL};
    assert_ch_ok(ch_config_load_tables(t, 4, NULL, 3, bad4, &cfg));
    assert_ch_error(ch_lr_schedule_options_from_config(cfg, 0.1, &so), CH_ERR_CONFIG, "'3'");
    ch_config_destroy(cfg);
}

/* same table as optimizer_golden.py SCHEDULES */
static const struct {
    ch_lr_schedule_kind_t kind;
    double base;
    int epochs;
    double lrf; /* lr_min for cosine_annealing */
    int step_size;
    double gamma;
    int milestones[4], n_milestones, warmup;
    ch_lr_warmup_method_t method;
    double factor;
} schedules[] = {
    {CH_LR_COSINE, 0.1, 10, 0.01, 0, 0.0, {0}, 0, 0, CH_LR_WARMUP_LINEAR, 0.0},
    {CH_LR_COSINE, 0.1, 12, 0.05, 0, 0.0, {0}, 0, 3, CH_LR_WARMUP_LINEAR, 0.01},
    {CH_LR_STEP, 0.2, 15, 0.0, 3, 0.1, {0}, 0, 0, CH_LR_WARMUP_LINEAR, 0.0},
    {CH_LR_STEP, 0.2, 15, 0.0, 4, 0.3, {0}, 0, 2, CH_LR_WARMUP_CONSTANT, 0.1},
    {CH_LR_MULTISTEP, 0.05, 14, 0.0, 0, 0.5, {3, 5, 5, 9}, 4, 4, CH_LR_WARMUP_LINEAR, 0.001},
    {CH_LR_MULTISTEP, 0.05, 10, 0.0, 0, 0.1, {2, 6}, 2, 0, CH_LR_WARMUP_LINEAR, 0.0},
    {CH_LR_COSINE_ANNEALING, 0.1, 10, 0.0, 0, 0.0, {0}, 0, 0, CH_LR_WARMUP_LINEAR, 0.0},
    {CH_LR_COSINE_ANNEALING, 0.5, 20, 1e-4, 0, 0.0, {0}, 0, 5, CH_LR_WARMUP_LINEAR, 0.01},
    {CH_LR_COSINE_ANNEALING, 0.5, 8, 0.02, 0, 0.0, {0}, 0, 2, CH_LR_WARMUP_CONSTANT, 0.25},
};
enum { EXTRA_EPOCHS = 3 }; /* as optimizer_golden.py: past the end too */

static void test_schedules_golden(void **state)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/schedules.txt", golden_dir());
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    for (size_t k = 0; k < sizeof schedules / sizeof schedules[0]; k++) {
        ch_lr_schedule_options_t o;
        memset(&o, 0, sizeof o);
        o.kind = schedules[k].kind;
        o.base_lr = schedules[k].base;
        o.epochs = schedules[k].epochs;
        o.lrf = schedules[k].lrf;
        o.lr_min = schedules[k].lrf;
        o.step_size = schedules[k].step_size;
        o.gamma = schedules[k].gamma;
        o.n_milestones = schedules[k].n_milestones;
        memcpy(o.milestones, schedules[k].milestones, sizeof schedules[k].milestones);
        o.warmup_epochs = schedules[k].warmup;
        o.warmup_method = schedules[k].method;
        o.warmup_factor = schedules[k].factor;
        ch_lr_schedule_t s;
        assert_ch_ok(ch_lr_schedule_init(&s, &o));
        for (int e = 0; e <= o.epochs + EXTRA_EPOCHS; e++) {
            double ref;
            assert_int_equal(fscanf(f, "%lf", &ref), 1);
            double mine = ch_lr_schedule_get(&s);
            if (mine != ref)
                fail_msg("schedule %zu epoch %d: lr %.17g, torch %.17g", k, e, mine, ref);
            ch_lr_schedule_step(&s);
        }
        assert_ch_ok(ch_lr_schedule_set_epoch(&s, 3));
        assert_true(ch_lr_schedule_get(&s) == ch_lr_schedule_at(&o, 3));
    }
    fclose(f);
}

static void test_label_smoothing(void **state)
{
    /* e = 0 is the plain op, bitwise; e outside [0, 1] is refused */
    float x[6] = {0.5f, -1.0f, 2.0f, 0.25f, 0.0f, -3.0f}, l1, l2, d1[6], d2[6];
    int64_t lab[2] = {2, 0};
    ch_tensor_t tx, tl, tloss1, tloss2, td1, td2;
    int64_t sx[2] = {2, 3}, sl[1] = {2}, s1[1] = {1};
    assert_ch_ok(ch_tensor_wrap(&tx, x, CH_F32, 2, sx, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_wrap(&tl, lab, CH_I64, 1, sl, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_wrap(&tloss1, &l1, CH_F32, 1, s1, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_wrap(&tloss2, &l2, CH_F32, 1, s1, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_wrap(&td1, d1, CH_F32, 2, sx, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_wrap(&td2, d2, CH_F32, 2, sx, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    ch_compute_t *cx;
    assert_ch_ok(ch_compute_create(NULL, &cx));
    assert_ch_ok(ch_op_cross_entropy(cx, &tx, &tl, &tloss1, &td1));
    ch_loss_options_t lo = {0.0};
    assert_ch_ok(ch_loss_cross_entropy(cx, &lo, &tx, &tl, &tloss2, &td2));
    assert_memory_equal(&l1, &l2, sizeof l1);
    assert_memory_equal(d1, d2, sizeof d1);
    assert_ch_error(ch_op_cross_entropy_smooth(cx, &tx, &tl, 1.5, &tloss2, NULL), CH_ERR_INVALID,
                    "label_smoothing = 1.5");
    lab[1] = 3;
    assert_ch_error(ch_op_cross_entropy_smooth(cx, &tx, &tl, 0.1, &tloss2, NULL), CH_ERR_RANGE,
                    "sample 1 is 3");
    ch_compute_destroy(cx); /* before the golden part, which may skip */

    ch_safetensors_t *st = open_golden();
    assert_ch_ok(ch_compute_create(NULL, &cx));
    size_t nx, nl;
    float *lx = nt_read_f32(st, "ls.logits", &nx);
    const ch_st_view_t *lv = ch_safetensors_find(st, "ls.labels");
    assert_non_null(lv);
    nl = (size_t)ch_st_view_numel(lv);
    int64_t *labels = malloc(nl * sizeof(int64_t));
    memcpy(labels, lv->data, nl * sizeof(int64_t));
    int64_t shape[2] = {(int64_t)nl, (int64_t)(nx / nl)}, ln[1] = {(int64_t)nl};
    float *grad = malloc(nx * sizeof(float)), loss;
    assert_ch_ok(ch_tensor_wrap(&tx, lx, CH_F32, 2, shape, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_wrap(&tl, labels, CH_I64, 1, ln, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_wrap(&tloss1, &loss, CH_F32, 1, s1, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_wrap(&td1, grad, CH_F32, 2, shape, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    for (int k = 0; k < (int)(sizeof ls_values / sizeof ls_values[0]); k++) {
        char name[64], what[64];
        lo.label_smoothing = ls_values[k];
        assert_ch_ok(ch_loss_cross_entropy(cx, &lo, &tx, &tl, &tloss1, &td1));
        snprintf(name, sizeof name, "ls%d.loss", k);
        float *rl = nt_read_f32(st, name, NULL);
        snprintf(what, sizeof what, "label_smoothing %g loss", ls_values[k]);
        nt_assert_close(&loss, rl, 1, 2e-6, what);
        snprintf(name, sizeof name, "ls%d.grad", k);
        float *rg = nt_read_f32(st, name, NULL);
        snprintf(what, sizeof what, "label_smoothing %g gradient", ls_values[k]);
        nt_assert_close(grad, rg, nx, 2e-6, what);
        free(rl);
        free(rg);
    }
    free(lx); free(labels); free(grad);
    ch_safetensors_destroy(st);
    ch_compute_destroy(cx);
}

/* Resume: k steps, save, restore into a fresh model + optimizer, continue;
 * equals the uninterrupted run bit for bit. */
static ch_model_t *small_model(void)
{
    ch_model_options_t o;
    ch_model_options_default(&o);
    o.in_channels = 1;
    o.num_classes = 4;
    o.seed = 7;
    ch_model_t *m = NULL;
    assert_ch_ok(ch_model_create("smallcnn", &o, &m));
    return m;
}

static void set_grads(ch_model_t *m, int step)
{
    for (int i = 0; i < ch_model_num_params(m); i++) {
        ch_param_t *p = ch_model_param(m, i);
        for (size_t k = 0; k < p->numel; k++)
            p->grad[k] = sinf(0.37f * (float)k + (float)(i + 3 * step));
    }
}

static void steps(ch_model_t *m, ch_optimizer_t *opt, int from, int to)
{
    for (int s = from; s < to; s++) {
        set_grads(m, s);
        assert_ch_ok(ch_optimizer_step(opt));
    }
}

static ch_optimizer_t *make_opt(ch_model_t *m, const ch_optimizer_options_t *o)
{
    ch_optimizer_t *opt;
    assert_ch_ok(ch_optimizer_create(o, &opt));
    assert_ch_ok(ch_optimizer_add_model(opt, m));
    return opt;
}

static void test_resume_round_trip(void **state)
{
    char dir[] = "/tmp/cohort-optimizer-XXXXXX", path[128];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/resume.safetensors", dir);
    ch_optimizer_options_t os[4];
    os[0] = adamw_opts(1);     /* amsgrad */
    os[1] = rmsprop_opts(4);   /* momentum + centered */
    os[2] = rmsprop_opts(0);
    ch_optimizer_options_default(CH_OPTIM_SGD, &os[3]);
    os[3].momentum = 0.9;
    for (int c = 0; c < 4; c++) {
        ch_model_t *a = small_model(), *b = small_model();
        assert_ch_ok(ch_model_set_requires_grad(a, "conv1.weight", 0)); /* a frozen parameter */
        assert_ch_ok(ch_model_set_requires_grad(b, "conv1.weight", 0));
        ch_optimizer_t *oa = make_opt(a, &os[c]);
        assert_int_equal(ch_optimizer_num_params(oa), ch_model_num_params(a) - 1);
        steps(a, oa, 0, 3);
        ch_train_progress_t p = {.epoch = 1, .global_step = 3, .epoch_step = 0,
                                 .epoch_steps = 3, .seed = 1, .world_size = 1};
        assert_ch_ok(ch_train_state_write_resume_optimizer(a, oa, path, &p, ""));
        ch_optimizer_t *ob = make_opt(b, &os[c]);
        ch_train_progress_t q;
        ch_pretrained_report_t rep;
        assert_ch_ok(ch_train_state_load_pretrained(b, path, NULL, &rep));
        assert_int_equal(rep.not_in_model, 0); /* optimizer state is reported as such */
        assert_int_equal(rep.optimizer_state,
                         ch_optimizer_num_state(oa) * ch_optimizer_num_params(oa));
        assert_ch_ok(ch_train_state_read_resume_optimizer(b, ob, path, &q));
        assert_int_equal(q.global_step, 3);
        assert_int_equal(ch_optimizer_steps(ob), 3);
        steps(a, oa, 3, 5);
        steps(b, ob, 3, 5);
        for (int i = 0; i < ch_model_num_entries(a); i++) {
            const ch_param_t *ea = ch_model_entry(a, i), *eb = ch_model_entry(b, i);
            if (memcmp(ea->data, eb->data, (size_t)ea->numel * ch_dtype_size(ea->dtype)))
                fail_msg("%s: %s differs after resume", ch_optimizer_kind_name(os[c].kind),
                         ea->name);
        }
        /* the same run without the state differs (the test can fail) */
        if (c < 2) {
            ch_model_t *z = small_model();
            assert_ch_ok(ch_model_set_requires_grad(z, "conv1.weight", 0));
            ch_optimizer_t *oz = make_opt(z, &os[c]);
            assert_ch_ok(ch_train_state_read_resume_optimizer(z, NULL, path, &q));
            steps(z, oz, 3, 5);
            assert_true(memcmp(ch_model_param(a, 1)->data, ch_model_param(z, 1)->data,
                               (size_t)ch_model_param(a, 1)->numel * sizeof(float)) != 0);
            ch_optimizer_destroy(oz);
            ch_model_destroy(z);
        }
        /* another optimizer's file is refused */
        ch_optimizer_options_t other = os[c].kind == CH_OPTIM_ADAMW ? os[1] : os[0];
        ch_optimizer_t *ox = make_opt(b, &other);
        if (os[c].kind != CH_OPTIM_SGD)
            assert_ch_error(ch_train_state_read_resume_optimizer(b, ox, path, &q),
                            CH_ERR_INVALID, "state, this run uses optimizer.name");
        ch_optimizer_destroy(ox);
        ch_optimizer_destroy(oa);
        ch_optimizer_destroy(ob);
        ch_model_destroy(a);
        ch_model_destroy(b);
    }
    unlink(path);
    rmdir(dir);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_adamw_by_hand),
        cmocka_unit_test(test_sgd_wrapper_bitwise),
        cmocka_unit_test(test_thread_count_bitwise),
        cmocka_unit_test(test_errors_and_config),
        cmocka_unit_test(test_resume_round_trip),
        cmocka_unit_test(test_adamw_rmsprop_golden),
        cmocka_unit_test(test_schedules_golden),
        cmocka_unit_test(test_label_smoothing),
    };
    return ch_test_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
