/* Tests for framework/ddp: buckets, overlap hook, averaging, broadcasts.
 * Runs alone and under mpiexec -n 2 / -n 4. */
#include "config.h"

#include "tests/harness.h"

#include "framework/train/ddp.h"
#include "framework/dist/dist.h"
#include "framework/nn/nn.h"
#include "framework/nn/nn_exec.h"
#include "framework/ops/ops.h"
#include "framework/tensor/tensor.h"
#include "models/models.h"

#include <math.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    ch_pg_t *pg;
    ch_compute_t *cx;
    ch_model_t *model;
    ch_tensor_t x, y;
} fixture_t;

/* Rank-dependent batch of 4 random 1x8x8 images, deterministic per rank. */
static void make_batch(fixture_t *f, int rank, int salt)
{
    int64_t xs[4] = {4, 1, 8, 8}, ys[1] = {4};
    assert_ch_ok(ch_tensor_alloc_f32(&f->x, 4, xs));
    assert_ch_ok(ch_tensor_alloc(&f->y, CH_I64, 1, ys, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    uint64_t s = 12345u + 977u * (uint64_t)rank + 31u * (uint64_t)salt;
    float *x = ch_tensor_f32(&f->x);
    for (int i = 0; i < 4 * 64; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((s >> 40) & 0xffff) / 65536.0f - 0.5f;
    }
    int64_t *y = f->y.data;
    for (int i = 0; i < 4; i++) y[i] = (rank + i * 3 + salt) % 10;
}

static int setup(void **state)
{
    fixture_t *f = calloc(1, sizeof *f);
    ch_model_options_t o;
    ch_model_options_default(&o);
    o.num_classes = 10;
    o.in_channels = 1;
    o.seed = 7;
    if (ch_pg_create_mpi(MPI_COMM_WORLD, &f->pg) || ch_compute_create(NULL, &f->cx) ||
        ch_model_create("smallcnn", &o, &f->model))
        return -1;
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture_t *f = *state;
    ch_tensor_free(&f->x);
    ch_tensor_free(&f->y);
    ch_model_destroy(f->model);
    ch_compute_destroy(f->cx);
    ch_pg_destroy(f->pg);
    free(f);
    return 0;
}

static double max_rel_diff(const float *a, const float *b, size_t n)
{
    double m = 0, scale = 1e-12;
    for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs((double)b[i]));
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - (double)b[i]));
    return m / scale;
}

/* Gradients after DDP equal the average of the ranks' local gradients, for
 * one big bucket and for many tiny buckets. */
static void test_gradients_are_averaged(void **state)
{
    fixture_t *f = *state;
    int rank = ch_pg_rank(f->pg), world = ch_pg_size(f->pg);
    size_t n = ch_model_param_numel(f->model);
    float *local = malloc(n * sizeof *local), *want = malloc(n * sizeof *want);
    const ch_tensor_t *logits;
    make_batch(f, rank, 0);
    ch_model_train(f->model, 1);
    /* reference: local backward, then a blocking all-reduce average */
    assert_ch_ok(ch_model_forward(f->model, f->cx, &f->x, &logits));
    assert_ch_ok(ch_model_loss(f->model, f->cx, &f->y, NULL));
    assert_ch_ok(ch_model_backward(f->model, f->cx, NULL));
    memcpy(local, ch_model_grad_block(f->model), n * sizeof *local);
    assert_ch_ok(ch_pg_allreduce(f->pg, local, want, (int64_t)n, CH_DIST_FLOAT32, CH_REDUCE_AVG));

    size_t caps[2] = {0, 64 * sizeof(float)};
    for (int c = 0; c < 2; c++) {
        ch_ddp_options_t o;
        ch_ddp_t *ddp = NULL;
        ch_ddp_options_default(&o);
        o.bucket_cap_bytes = caps[c];
        o.broadcast_buffers = 0; /* keep the running stats of the reference pass */
        assert_ch_ok(ch_ddp_create(f->model, f->pg, &o, &ddp));
        if (c == 0) assert_int_equal(ch_ddp_num_buckets(ddp), 1);
        else assert_true(ch_ddp_num_buckets(ddp) > 3);
        ch_model_zero_grad(f->model);
        assert_ch_ok(ch_ddp_before_forward(ddp));
        assert_ch_ok(ch_model_forward(f->model, f->cx, &f->x, &logits));
        assert_ch_ok(ch_model_loss(f->model, f->cx, &f->y, NULL));
        assert_ch_ok(ch_model_backward(f->model, f->cx, NULL));
        double wait = -1;
        assert_ch_ok(ch_ddp_finish(ddp, &wait));
        assert_true(wait >= 0);
        double err = max_rel_diff(ch_model_grad_block(f->model), want, n);
        ch_ddp_destroy(ddp);
        if (err > 1e-5) fail_msg("cap %zu: DDP gradient differs from mean by %g", caps[c], err);
    }
    /* the local gradients really differ between ranks (else the test is void) */
    if (world > 1) assert_true(max_rel_diff(local, want, n) > 1e-4);
    free(local);
    free(want);
}

/* Buckets cover every trainable parameter once, in reverse order, each a
 * contiguous slice, split at frozen parameters. */
static void test_bucket_layout(void **state)
{
    fixture_t *f = *state;
    int np = ch_model_num_params(f->model);
    ch_ddp_options_t o;
    ch_ddp_t *ddp = NULL;
    ch_ddp_options_default(&o);
    o.bucket_cap_bytes = 200 * sizeof(float);
    assert_ch_ok(ch_model_set_requires_grad(f->model, "bn1.weight", 0));
    assert_ch_ok(ch_ddp_create(f->model, f->pg, &o, &ddp));
    int *seen = calloc((size_t)np, sizeof *seen);
    int prev_first = np;
    for (int b = 0; b < ch_ddp_num_buckets(ddp); b++) {
        int first, last;
        size_t numel, sum = 0;
        assert_ch_ok(ch_ddp_bucket_info(ddp, b, &first, &last, &numel));
        assert_true(last < prev_first); /* reverse parameter order */
        prev_first = first;
        for (int i = first; i <= last; i++) {
            ch_param_t *p = ch_model_param(f->model, i);
            assert_true(p->requires_grad);
            seen[i]++;
            sum += p->numel;
        }
        assert_int_equal(sum, numel);
        /* a bucket holding more than one parameter stays under the cap */
        if (first != last) assert_true(numel * sizeof(float) <= o.bucket_cap_bytes);
    }
    for (int i = 0; i < np; i++)
        assert_int_equal(seen[i], ch_model_param(f->model, i)->requires_grad ? 1 : 0);
    free(seen);
    ch_ddp_destroy(ddp);
    assert_ch_ok(ch_model_set_requires_grad(f->model, "bn1.weight", 1));
    assert_ch_error(ch_ddp_bucket_info(NULL, 0, NULL, NULL, NULL), CH_ERR_INVALID, "bucket");
}

/* broadcast_state makes every rank hold rank 0's parameters and buffers;
 * broadcast_buffers before forward replaces the buffers again. */
static void test_broadcasts(void **state)
{
    fixture_t *f = *state;
    int rank = ch_pg_rank(f->pg);
    ch_ddp_t *ddp = NULL;
    ch_param_t *w = ch_model_find(f->model, "conv1.weight");
    ch_param_t *rm = ch_model_find(f->model, "bn1.running_mean");
    ch_param_t *nb = ch_model_find(f->model, "bn1.num_batches_tracked");
    assert_non_null(w);
    assert_non_null(rm);
    assert_non_null(nb);
    ((float *)w->data)[0] = 100.0f + (float)rank;
    ((float *)rm->data)[1] = 5.0f + (float)rank;
    ((int64_t *)nb->data)[0] = 40 + rank;
    assert_ch_ok(ch_ddp_create(f->model, f->pg, NULL, &ddp));
    assert_ch_ok(ch_ddp_broadcast_state(ddp));
    float w0 = ((float *)w->data)[0], rm1 = ((float *)rm->data)[1];
    int64_t nb0 = ((int64_t *)nb->data)[0];
    ((float *)rm->data)[1] = 9.0f + (float)rank;
    assert_ch_ok(ch_ddp_before_forward(ddp));
    float rm1b = ((float *)rm->data)[1];
    ch_ddp_destroy(ddp);
    assert_true(w0 == 100.0f);
    assert_true(rm1 == 5.0f);
    assert_int_equal(nb0, 40);
    assert_true(rm1b == 9.0f);
}

/* A trainable parameter without a gradient is reported, not hung on. */
static void test_missing_gradient_is_an_error(void **state)
{
    fixture_t *f = *state;
    ch_ddp_t *ddp = NULL;
    ch_ddp_options_t o;
    ch_ddp_options_default(&o);
    o.broadcast_buffers = 0;
    assert_ch_ok(ch_ddp_create(f->model, f->pg, &o, &ddp));
    assert_ch_ok(ch_ddp_before_forward(ddp));
    /* no backward at all */
    assert_ch_error(ch_ddp_finish(ddp, NULL), CH_ERR_INTERNAL, "received no gradient");
    assert_ch_error(ch_ddp_finish(ddp, NULL), CH_ERR_INTERNAL, "without a backward");
    ch_ddp_destroy(ddp);
}

/* ch_ddp_convert_sync_bn: both BatchNorm layers of smallcnn become SyncBN
 * over the group, so a training forward on rank-dependent batches leaves
 * the same running statistics on every rank (per-rank BN would not). */
static void test_convert_sync_bn(void **state)
{
    fixture_t *f = *state;
    int n = -1;
    assert_ch_ok(ch_ddp_convert_sync_bn(f->model, f->pg, f->pg, &n));
    assert_int_equal(n, 2);
    make_batch(f, ch_test_rank(), 1);
    ch_model_train(f->model, 1);
    const ch_tensor_t *logits = NULL;
    assert_ch_ok(ch_model_forward(f->model, f->cx, &f->x, &logits));
    const ch_param_t *rm = ch_model_find(f->model, "bn1.running_mean");
    assert_non_null(rm);
    const float *v = rm->data;
    float *lo = malloc(rm->numel * sizeof *lo), *hi = malloc(rm->numel * sizeof *hi);
    assert_int_equal(MPI_Allreduce(v, lo, (int)rm->numel, MPI_FLOAT, MPI_MIN, MPI_COMM_WORLD), MPI_SUCCESS);
    assert_int_equal(MPI_Allreduce(v, hi, (int)rm->numel, MPI_FLOAT, MPI_MAX, MPI_COMM_WORLD), MPI_SUCCESS);
    assert_memory_equal(lo, hi, rm->numel * sizeof *lo);
    double moved = 0;
    for (size_t i = 0; i < rm->numel; i++) moved += fabs((double)v[i]);
    assert_true(moved > 0); /* the statistics did move from their initial 0 */
    free(lo);
    free(hi);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_gradients_are_averaged, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bucket_layout, setup, teardown),
        cmocka_unit_test_setup_teardown(test_broadcasts, setup, teardown),
        cmocka_unit_test_setup_teardown(test_missing_gradient_is_an_error, setup, teardown),
        cmocka_unit_test_setup_teardown(test_convert_sync_bn, setup, teardown),
    };
    return ch_test_main_mpi(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
