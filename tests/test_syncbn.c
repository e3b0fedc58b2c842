/* SyncBN across MPI ranks (run alone and under mpiexec -n 2 / -n 4): a
 * global batch split unevenly over the ranks (one rank may hold none) gives,
 * after summing the per-rank gradients, the gradients, logits and running
 * statistics of plain BatchNorm on the whole batch in one process. With a
 * non-blocking all-reduce (the backward overlaps it with a deferred
 * convolution weight gradient) the gradients are bitwise those of the
 * blocking path. */
#include "config.h"

#include "tests/nn_testutil.h"

#include "framework/nn/nn.h"
#include "framework/nn/nn_exec.h"
#include "framework/ops/ops.h"
#include "models/models.h"

#include <mpi.h>

static ch_status mpi_sum(void *ctx, float *d, size_t n)
{
    int rc = MPI_Allreduce(MPI_IN_PLACE, d, (int)n, MPI_FLOAT, MPI_SUM, *(MPI_Comm *)ctx);
    return rc == MPI_SUCCESS ? CH_OK : CH_ERROR(CH_ERR_MPI, "MPI_Allreduce failed");
}

static ch_status mpi_gather(void *ctx, const float *in, float *out, size_t n)
{
    int rc = MPI_Allgather(in, (int)n, MPI_FLOAT, out, (int)n, MPI_FLOAT, *(MPI_Comm *)ctx);
    return rc == MPI_SUCCESS ? CH_OK : CH_ERROR(CH_ERR_MPI, "MPI_Allgather failed");
}

static MPI_Comm comm = MPI_COMM_WORLD;

/* the non-blocking pair: one MPI_Request per call, freed by the wait */
static ch_status mpi_isum(void *ctx, float *d, size_t n, void **req)
{
    MPI_Request *r = malloc(sizeof *r);
    if (!r) return CH_ERROR(CH_ERR_NOMEM, "mpi_isum: out of memory");
    int rc = MPI_Iallreduce(MPI_IN_PLACE, d, (int)n, MPI_FLOAT, MPI_SUM, *(MPI_Comm *)ctx, r);
    if (rc != MPI_SUCCESS) {
        free(r);
        return CH_ERROR(CH_ERR_MPI, "MPI_Iallreduce failed");
    }
    *req = r;
    return CH_OK;
}

static ch_status mpi_igather(void *ctx, const float *in, float *out, size_t n, void **req)
{
    MPI_Request *r = malloc(sizeof *r);
    if (!r) return CH_ERROR(CH_ERR_NOMEM, "mpi_igather: out of memory");
    int rc = MPI_Iallgather(in, (int)n, MPI_FLOAT, out, (int)n, MPI_FLOAT, *(MPI_Comm *)ctx, r);
    if (rc != MPI_SUCCESS) {
        free(r);
        return CH_ERROR(CH_ERR_MPI, "MPI_Iallgather failed");
    }
    *req = r;
    return CH_OK;
}

static ch_status mpi_wait(void *ctx, void **req)
{
    MPI_Request *r = *req;
    int rc = MPI_Wait(r, MPI_STATUS_IGNORE);
    free(r);
    *req = NULL;
    return rc == MPI_SUCCESS ? CH_OK : CH_ERROR(CH_ERR_MPI, "MPI_Wait failed");
}

typedef struct {
    double logits, grads, buffers;
    long long nbt_diff;
    long long bitwise_diff; /* non-blocking run: values differing from the blocking one */
    int status_ok;
    char msg[512];
} result_t;

/* Rank r's share of B samples: sizes[] of the split. */
static void split(int B, int W, int empty_rank, int *sizes)
{
    if (empty_rank >= 0 && W > 1) {
        for (int r = 0, k = 0; r < W; r++) sizes[r] = r == empty_rank ? 0 : B / (W - 1) + (k++ < B % (W - 1));
        return;
    }
    /* uneven: rank r gets about (r+1)/sum share */
    int tot = W * (W + 1) / 2, given = 0;
    for (int r = 0; r < W; r++) {
        sizes[r] = B * (r + 1) / tot;
        given += sizes[r];
    }
    sizes[W - 1] += B - given;
}

#define RUN(expr)                                                              \
    do {                                                                       \
        if (res->status_ok) {                                                  \
            ch_status s_ = (expr);                                             \
            if (s_) {                                                          \
                res->status_ok = 0;                                            \
                snprintf(res->msg, sizeof res->msg, "%s: %s", #expr, ch_error_message()); \
            }                                                                  \
        }                                                                      \
    } while (0)

/* Number of floats that differ bitwise between a and b. */
static long long bit_diffs(const float *a, const float *b, size_t n)
{
    long long d = 0;
    for (size_t i = 0; i < n; i++) d += memcmp(a + i, b + i, sizeof(float)) != 0;
    return d;
}

/* use_nb: the process group also has the non-blocking forms (all-reduce,
 * and all-gather with use_gather); a second model with the blocking forms
 * only runs the same local step, and its logits, gradients and buffers must
 * be bitwise the same. frozen: a parameter left without gradient in every
 * model (NULL: none). */
static void run_case(const char *arch, int hw, int B, int empty_rank, int use_gather, int use_nb,
                     const char *frozen, result_t *res)
{
    int rank, W;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &W);
    memset(res, 0, sizeof *res);
    res->status_ok = 1;
    ch_compute_options_t co;
    ch_compute_options_default(&co);
    co.num_threads = 1;
    ch_compute_t *cx = NULL;
    RUN(ch_compute_create(&co, &cx));
    ch_model_options_t o;
    ch_model_options_default(&o);
    o.in_channels = 1;
    o.num_classes = 10;
    o.seed = 11;
    ch_model_t *ref = NULL, *m = NULL, *mb = NULL;
    RUN(ch_model_create(arch, &o, &ref));
    RUN(ch_model_create(arch, &o, &m));
    ch_nn_sync_t sync = {mpi_sum, use_gather ? mpi_gather : NULL, &comm, rank, W,
                         use_nb ? mpi_isum : NULL, use_nb && use_gather ? mpi_igather : NULL,
                         use_nb ? mpi_wait : NULL};
    RUN(ch_model_convert_sync_bn(m, &sync, NULL));
    if (use_nb) {
        ch_nn_sync_t blocking = sync;
        blocking.iallreduce_sum = NULL;
        blocking.iallgather = NULL;
        blocking.wait = NULL;
        RUN(ch_model_create(arch, &o, &mb));
        RUN(ch_model_convert_sync_bn(mb, &blocking, NULL));
    }
    for (int i = 0; frozen && res->status_ok && i < ch_model_num_params(ref); i++) {
        ch_model_t *all[3] = {ref, m, mb};
        for (int k = 0; k < 3; k++)
            if (all[k] && !strcmp(ch_model_param(all[k], i)->name, frozen))
                ch_model_param(all[k], i)->requires_grad = 0;
    }
    if (!res->status_ok) goto out_early;

    /* the global batch, identical on every rank */
    int64_t xs[4] = {B, 1, hw, hw}, ys[1] = {B};
    ch_tensor_t x, y, xl, dl;
    RUN(ch_tensor_alloc_f32(&x, 4, xs));
    RUN(ch_tensor_alloc(&y, CH_I64, 1, ys, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    for (int64_t i = 0; i < ch_tensor_numel(&x); i++)
        ch_tensor_f32(&x)[i] = sinf(0.05f * (float)i) + 0.3f * cosf(0.7f * (float)(i % 37));
    for (int i = 0; i < B; i++) ch_tensor_i64(&y)[i] = (i * 3) % 10;

    /* reference: plain BN on the whole batch */
    const ch_tensor_t *lref, *lm;
    RUN(ch_model_forward(ref, cx, &x, &lref));
    RUN(ch_model_loss(ref, cx, &y, NULL));
    RUN(ch_model_backward(ref, cx, NULL));
    if (!res->status_ok) goto out_early;
    /* dlogits of the mean loss over B: (softmax - onehot) / B */
    int64_t K = lref->shape[1];
    int sizes[16], off = 0;
    split(B, W, empty_rank, sizes);
    for (int r = 0; r < rank; r++) off += sizes[r];
    int n = sizes[rank];
    int64_t xls[4] = {n, 1, hw, hw}, dls[2] = {n, K};
    RUN(ch_tensor_alloc_f32(&xl, 4, xls));
    RUN(ch_tensor_alloc_f32(&dl, 2, dls));
    memcpy(xl.data, ch_tensor_f32(&x) + (size_t)off * hw * hw, (size_t)n * hw * hw * sizeof(float));
    for (int i = 0; i < n; i++) {
        const float *l = ch_tensor_f32(lref) + (size_t)(off + i) * K;
        float *d = ch_tensor_f32(&dl) + (size_t)i * K;
        double mx = l[0], s = 0;
        for (int k = 1; k < K; k++) mx = l[k] > mx ? l[k] : mx;
        for (int k = 0; k < K; k++) s += exp(l[k] - mx);
        for (int k = 0; k < K; k++)
            d[k] = (float)((exp(l[k] - mx) / s - (k == ch_tensor_i64(&y)[off + i])) / B);
    }
    /* distributed: local slice, SyncBN, then the sum of gradients over ranks */
    RUN(ch_model_forward(m, cx, &xl, &lm));
    RUN(ch_model_backward(m, cx, &dl));
    if (use_nb && res->status_ok) {
        const ch_tensor_t *lb;
        RUN(ch_model_forward(mb, cx, &xl, &lb));
        RUN(ch_model_backward(mb, cx, &dl));
        if (res->status_ok) {
            res->bitwise_diff = bit_diffs(ch_tensor_f32(lm), ch_tensor_f32(lb), (size_t)n * K) +
                                bit_diffs(ch_model_grad_block(m), ch_model_grad_block(mb),
                                          ch_model_param_numel(m));
            for (int i = 0; i < ch_model_num_entries(m); i++) {
                ch_param_t *p = ch_model_entry(m, i), *q = ch_model_entry(mb, i);
                if (p->is_buffer && p->dtype == CH_F32)
                    res->bitwise_diff += bit_diffs(p->data, q->data, p->numel);
            }
        }
    }
    size_t pn = ch_model_param_numel(m);
    MPI_Allreduce(MPI_IN_PLACE, ch_model_grad_block(m), (int)pn, MPI_FLOAT, MPI_SUM, comm);
    if (res->status_ok) {
        res->logits = n ? nt_rel_err(ch_tensor_f32(lm), ch_tensor_f32(lref) + (size_t)off * K,
                                     (size_t)n * K, 1e-12) : 0;
        res->grads = 0;
        for (int i = 0; i < ch_model_num_params(m); i++) {
            ch_param_t *p = ch_model_param(m, i), *q = ch_model_param(ref, i);
            double e = nt_rel_err(p->grad, q->grad, p->numel, 1e-12);
            if (e > res->grads) res->grads = e;
        }
        for (int i = 0; i < ch_model_num_entries(m); i++) {
            ch_param_t *p = ch_model_entry(m, i), *q = ch_model_entry(ref, i);
            if (!p->is_buffer) continue;
            if (p->dtype == CH_I64) {
                res->nbt_diff += llabs((long long)(*(int64_t *)p->data - *(int64_t *)q->data));
            } else {
                double e = nt_rel_err(p->data, q->data, p->numel, 1e-12);
                if (e > res->buffers) res->buffers = e;
            }
        }
    }
    ch_tensor_free(&xl);
    ch_tensor_free(&dl);
    ch_tensor_free(&x);
    ch_tensor_free(&y);
out_early:
    ch_model_destroy(ref);
    ch_model_destroy(m);
    ch_model_destroy(mb);
    ch_compute_destroy(cx);
}

static void check_result(const char *what, result_t *r)
{
    /* every rank reports the worst value of any rank */
    double v[4] = {r->logits, r->grads, r->buffers, (double)r->bitwise_diff};
    int ok = r->status_ok;
    MPI_Allreduce(MPI_IN_PLACE, v, 4, MPI_DOUBLE, MPI_MAX, comm);
    MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, comm);
    if (!r->status_ok) fail_msg("%s: %s", what, r->msg);
    if (!ok) fail_msg("%s: another rank failed", what);
    if (!(v[0] <= 1e-4)) fail_msg("%s: logits relative error %.3g", what, v[0]);
    if (!(v[1] <= 1e-4)) fail_msg("%s: summed gradients relative error %.3g", what, v[1]);
    if (!(v[2] <= 1e-4)) fail_msg("%s: running stats relative error %.3g", what, v[2]);
    if (v[3] != 0)
        fail_msg("%s: %.0f values differ bitwise between the non-blocking and the blocking "
                 "all-reduce", what, v[3]);
    assert_int_equal(r->nbt_diff, 0);
}

static void test_syncbn_uneven_smallcnn(void **state)
{
    result_t r;
    run_case("smallcnn", 12, 12, -1, 0, 0, NULL, &r);
    check_result("smallcnn, uneven split, all-reduce", &r);
    run_case("smallcnn", 12, 12, -1, 1, 0, NULL, &r);
    check_result("smallcnn, uneven split, all-gather", &r);
    run_case("smallcnn", 12, 12, -1, 0, 1, NULL, &r);
    check_result("smallcnn, uneven split, non-blocking all-reduce", &r);
    run_case("smallcnn", 12, 12, -1, 1, 1, NULL, &r);
    check_result("smallcnn, uneven split, non-blocking all-gather and all-reduce", &r);
}

static void test_syncbn_uneven_resnet18(void **state)
{
    result_t r;
    run_case("resnet18", 28, 10, -1, 1, 0, NULL, &r);
    check_result("resnet18, uneven split", &r);
    run_case("resnet18", 28, 10, -1, 1, 1, NULL, &r);
    check_result("resnet18, uneven split, non-blocking all-gather and all-reduce", &r);
    run_case("resnet18", 28, 10, -1, 0, 1, NULL, &r);
    check_result("resnet18, uneven split, non-blocking all-reduce", &r);
    /* a frozen stem: the stem BN has no input gradient, so no all-reduce
     * follows the deferred layer1.0.conv1 and the end of backward runs it */
    run_case("resnet18", 28, 10, -1, 1, 1, "conv1.weight", &r);
    check_result("resnet18, frozen stem convolution, non-blocking", &r);
}

static void test_syncbn_empty_rank(void **state)
{
    if (ch_test_world_size() < 2) ch_test_skip("needs 2 or more ranks");
    result_t r;
    run_case("smallcnn", 12, 9, 0, 0, 0, NULL, &r);
    check_result("smallcnn, rank 0 without samples", &r);
    run_case("resnet18", 12, 9, 0, 1, 1, NULL, &r);
    check_result("resnet18, rank 0 without samples, non-blocking", &r);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_syncbn_uneven_smallcnn),
        cmocka_unit_test(test_syncbn_uneven_resnet18),
        cmocka_unit_test(test_syncbn_empty_rank),
    };
    return ch_test_main_mpi(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
