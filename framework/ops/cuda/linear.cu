/* cohort: CUDA backend — linear layers through cuBLAS.
 *
 * Row-major to column-major mapping. cuBLAS is column-major; a row-major
 * (r, c) matrix with leading dimension c is, read column-major, its
 * transpose (c x r). With x (N,K), w (M,K), y (N,M), dy (N,M), dx (N,K),
 * dw (M,K) all row-major:
 *   forward       y  = x w^T    <=>  y^T (MxN)  = w (MxK) * x^T (KxN):
 *                 C(MxN, ldc=M) = op_T(A = w buffer, KxM, lda=K) * op_N(B = x buffer, KxN, ldb=K)
 *   backward data dx = dy w     <=>  dx^T (KxN) = w^T (KxM) * dy^T (MxN):
 *                 C(KxN, ldc=K) = op_N(A = w buffer, KxM, lda=K) * op_N(B = dy buffer, MxN, ldb=M)
 *   backward wts  dw = dy^T x   <=>  dw^T (KxM) = x^T (KxN) * dy (NxM):
 *                 C(KxM, ldc=K) = op_N(A = x buffer, KxN, lda=K) * op_T(B = dy buffer, MxN, ldb=M)
 *
 * Precision: fp32 uses cublasSgemm with the handle's CUBLAS_DEFAULT_MATH
 * (no TF32: torch.backends.cuda.matmul.allow_tf32 = False). bf16 autocast
 * rounds both GEMM inputs to bf16 in the workspace and runs cublasGemmEx
 * with CUDA_R_16BF inputs, CUBLAS_COMPUTE_32F and an fp32 output written
 * straight into y / dx / dw (PyTorch's autocast would round y and dx to
 * bf16 as well; here they keep the fp32 accumulator's value). The bias is
 * added in fp32 by a kernel; db = dy summed over N in fp32 partials
 * combined in double (deterministic).
 */
#include "config.h"

#include "framework/ops/cuda/dense_internal.h"

#include <cuda_bf16.h>

static ch_status lin_check(void *st, const char *op, const ch_tensor_t *a, const char *an,
                           const ch_tensor_t *b, const char *bn, const ch_tensor_t *c,
                           const char *cn)
{
    CH_TRY(ch_cd_check_tensor(st, op, an, a));
    CH_TRY(ch_cd_check_tensor(st, op, bn, b));
    CH_TRY(ch_cd_check_tensor(st, op, cn, c));
    return CH_OK;
}

static ch_status dims_fit(const char *op, int64_t N, int64_t M, int64_t K)
{
    int64_t v[3] = {N, M, K};
    if (!ch_cd_fits_int(v, 3))
        return CH_ERROR(CH_ERR_UNSUPPORTED,
                        "%s: N=%lld, M=%lld, K=%lld exceed cuBLAS's 32-bit sizes", op,
                        (long long)N, (long long)M, (long long)K);
    return CH_OK;
}

/* C = op(A) op(B) with fp32 or (bf16 != 0) bf16-rounded inputs; fp32 C.
 * A has na elements, B nb (for the bf16 copies). */
static ch_status gemm(void *st, const char *op, cublasOperation_t ta, cublasOperation_t tb, int m,
                      int n, int k, const float *A, int64_t na, int lda, const float *B,
                      int64_t nb, int ldb, float *C, int ldc)
{
    const float one = 1.0f, zero = 0.0f;
    cublasHandle_t h = ch_cuda_cublas(st);
    if (!ch_cuda_opts(st)->bf16) {
        CH_CHECK_CUBLAS(cublasSgemm(h, ta, tb, m, n, k, &one, A, lda, B, ldb, &zero, C, ldc));
        return CH_OK;
    }
    ch_cd_carve_t cv;
    ch_cd_carve_init(&cv);
    int ia = ch_cd_carve_add(&cv, (size_t)na * 2);
    int ib = ch_cd_carve_add(&cv, (size_t)nb * 2);
    void *base = NULL;
    CH_TRY(ch_cuda_workspace(st, cv.total, &base));
    void *a16 = ch_cd_carve_ptr(&cv, base, ia), *b16 = ch_cd_carve_ptr(&cv, base, ib);
    /* plain casts: (na,1,1) in PLAIN layout */
    CH_TRY(ch_cd_convert(st, A, CH_CD_F32, CH_LAYOUT_PLAIN, a16, CH_CD_BF16, CH_LAYOUT_PLAIN, na,
                         1, 1));
    CH_TRY(ch_cd_convert(st, B, CH_CD_F32, CH_LAYOUT_PLAIN, b16, CH_CD_BF16, CH_LAYOUT_PLAIN, nb,
                         1, 1));
    (void)op;
    CH_CHECK_CUBLAS(cublasGemmEx(h, ta, tb, m, n, k, &one, a16, CUDA_R_16BF, lda, b16, CUDA_R_16BF,
                                 ldb, &zero, C, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
                                 CUBLAS_GEMM_DEFAULT));
    return CH_OK;
}

static ch_status zero(void *st, void *p, size_t bytes)
{
    if (bytes) CH_CHECK_CUDA(cudaMemsetAsync(p, 0, bytes, ch_cuda_stream(st)));
    return CH_OK;
}

static ch_status cd_linear_forward(void *st, const ch_tensor_t *x, const ch_tensor_t *w,
                                   const ch_tensor_t *b, ch_tensor_t *y)
{
    const char *op = "ch_op_linear_forward";
    CH_TRY(lin_check(st, op, x, "x", w, "weight", y, "y"));
    if (b) CH_TRY(ch_cd_check_tensor(st, op, "bias", b));
    int64_t N = x->shape[0], K = x->shape[1], M = w->shape[0];
    CH_TRY(dims_fit(op, N, M, K));
    if (N == 0 || M == 0) return CH_OK;
    if (K == 0)
        CH_TRY(zero(st, y->data, y->nbytes));
    else
        CH_TRY(gemm(st, op, CUBLAS_OP_T, CUBLAS_OP_N, (int)M, (int)N, (int)K,
                    (const float *)w->data, M * K, (int)K, (const float *)x->data, N * K, (int)K,
                    (float *)y->data, (int)M));
    /* y (N,M) row-major: channel of element i is i % M, i.e. (N, C=M, HW=1) */
    if (b) CH_TRY(ch_cd_bias_add(st, (float *)y->data, (const float *)b->data, CH_LAYOUT_PLAIN, N,
                                 M, 1));
    return CH_OK;
}

static ch_status cd_linear_backward_data(void *st, const ch_tensor_t *dy, const ch_tensor_t *w,
                                         ch_tensor_t *dx)
{
    const char *op = "ch_op_linear_backward_data";
    CH_TRY(lin_check(st, op, dy, "dy", w, "weight", dx, "dx"));
    int64_t N = dy->shape[0], M = w->shape[0], K = w->shape[1];
    CH_TRY(dims_fit(op, N, M, K));
    if (N == 0 || K == 0) return CH_OK;
    if (M == 0) return zero(st, dx->data, dx->nbytes);
    return gemm(st, op, CUBLAS_OP_N, CUBLAS_OP_N, (int)K, (int)N, (int)M, (const float *)w->data,
                M * K, (int)K, (const float *)dy->data, N * M, (int)M, (float *)dx->data, (int)K);
}

static ch_status cd_linear_backward_weights(void *st, const ch_tensor_t *x, const ch_tensor_t *dy,
                                            ch_tensor_t *dw, ch_tensor_t *db)
{
    const char *op = "ch_op_linear_backward_weights";
    CH_TRY(lin_check(st, op, x, "x", dy, "dy", dw, "dweight"));
    if (db) CH_TRY(ch_cd_check_tensor(st, op, "dbias", db));
    int64_t N = x->shape[0], K = x->shape[1], M = dy->shape[1];
    CH_TRY(dims_fit(op, N, M, K));
    if (N == 0 || M == 0 || K == 0)
        CH_TRY(zero(st, dw->data, dw->nbytes));
    else
        CH_TRY(gemm(st, op, CUBLAS_OP_N, CUBLAS_OP_T, (int)K, (int)M, (int)N,
                    (const float *)x->data, N * K, (int)K, (const float *)dy->data, N * M, (int)M,
                    (float *)dw->data, (int)K));
    if (db && M > 0) {
        /* dy (N,M) as (N, C=M, HW=1): column sums */
        void *part = NULL;
        CH_TRY(ch_cuda_workspace(st, ch_cd_chansum_scratch(st, N, M, 1, CH_LAYOUT_PLAIN), &part));
        CH_TRY(ch_cd_chansum(st, (const float *)dy->data, CH_LAYOUT_PLAIN, N, M, 1,
                             (float *)db->data, part));
    }
    return CH_OK;
}

void ch_cuda_table_linear(ch_ops_backend_t *t)
{
    t->linear_forward = cd_linear_forward;
    t->linear_backward_data = cd_linear_backward_data;
    t->linear_backward_weights = cd_linear_backward_weights;
}
