/* cohort: cuBLAS loaded on first use (dlopen) instead of at program start.
 *
 * libcublas needs libcublasLt, whose static constructors run when the
 * library is loaded: about 0.25 s of CPU and 210 MB of resident memory per
 * process on the project's VM (an empty program linked with -lcublasLt:
 * 0.24 s, 211 MB max RSS; docs/PERFORMANCE.md, cohort-reduce start-up),
 * GPU or not. Linked into libcohort, every process of every cohort program
 * paid it: cohort-reduce and cohort-farm on CPU nodes, each rank of a CPU
 * training run. Only the GPU backend (backend.cu, linear.cu) calls cuBLAS,
 * so the library is not linked: the functions it calls are defined here
 * with cuBLAS's own prototypes (cublas_v2.h, so the compiler checks them)
 * and forward to the library's, resolved once (pthread_once) by dlopen of
 * CH_CUBLAS_PATH (configure: the toolkit's libcublas, by its soname), else
 * the soname through the library search path. When it cannot be loaded,
 * cublasCreate returns CUBLAS_STATUS_NOT_INITIALIZED and
 * cublasGetStatusString names the dlopen error (so CH_CHECK_CUBLAS's
 * message says why). A backend function added later that calls another
 * cuBLAS function needs its line here (the link fails without it).
 */
#include "config.h"

#include <cublas_v2.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

#ifndef CH_CUBLAS_SONAME
#define CH_CUBLAS_SONAME "libcublas.so"
#endif
#ifndef CH_CUBLAS_PATH
#define CH_CUBLAS_PATH CH_CUBLAS_SONAME
#endif

static pthread_once_t once = PTHREAD_ONCE_INIT;
static void *lib;
static char why[512];

static struct {
    cublasStatus_t (*create)(cublasHandle_t *);
    cublasStatus_t (*destroy)(cublasHandle_t);
    cublasStatus_t (*set_stream)(cublasHandle_t, cudaStream_t);
    cublasStatus_t (*get_version)(cublasHandle_t, int *);
    cublasStatus_t (*set_math_mode)(cublasHandle_t, cublasMath_t);
    const char *(*status_string)(cublasStatus_t);
    cublasStatus_t (*sgemm)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                            const float *, const float *, int, const float *, int, const float *,
                            float *, int);
    cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                              const void *, const void *, cudaDataType, int, const void *,
                              cudaDataType, int, const void *, void *, cudaDataType, int,
                              cublasComputeType_t, cublasGemmAlgo_t);
} fn;

static void *sym(const char *name)
{
    void *p = dlsym(lib, name);
    if (!p && !why[0]) snprintf(why, sizeof why, "%s: no symbol %s", CH_CUBLAS_PATH, name);
    return p;
}

static void load(void)
{
    lib = dlopen(CH_CUBLAS_PATH, RTLD_NOW | RTLD_LOCAL);
    if (!lib) lib = dlopen(CH_CUBLAS_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *e = dlerror();
        snprintf(why, sizeof why, "cannot load cuBLAS (%s): %s", CH_CUBLAS_SONAME, e ? e : "?");
        return;
    }
    /* (object pointers to function pointers: POSIX dlsym's documented use) */
    *(void **)&fn.create = sym("cublasCreate_v2");
    *(void **)&fn.destroy = sym("cublasDestroy_v2");
    *(void **)&fn.set_stream = sym("cublasSetStream_v2");
    *(void **)&fn.get_version = sym("cublasGetVersion_v2");
    *(void **)&fn.set_math_mode = sym("cublasSetMathMode");
    *(void **)&fn.status_string = sym("cublasGetStatusString");
    *(void **)&fn.sgemm = sym("cublasSgemm_v2");
    *(void **)&fn.gemm_ex = sym("cublasGemmEx");
    if (why[0]) fn.create = NULL; /* a library without one of them: not used at all */
}

/* 1 when the library and every function are there */
static int ready(void)
{
    pthread_once(&once, load);
    return fn.create != NULL;
}

cublasStatus_t CUBLASWINAPI cublasCreate_v2(cublasHandle_t *handle)
{
    return ready() ? fn.create(handle) : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t CUBLASWINAPI cublasDestroy_v2(cublasHandle_t handle)
{
    return ready() ? fn.destroy(handle) : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t CUBLASWINAPI cublasSetStream_v2(cublasHandle_t handle, cudaStream_t streamId)
{
    return ready() ? fn.set_stream(handle, streamId) : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t CUBLASWINAPI cublasGetVersion_v2(cublasHandle_t handle, int *version)
{
    return ready() ? fn.get_version(handle, version) : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t CUBLASWINAPI cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode)
{
    return ready() ? fn.set_math_mode(handle, mode) : CUBLAS_STATUS_NOT_INITIALIZED;
}

const char *CUBLASWINAPI cublasGetStatusString(cublasStatus_t status)
{
    return ready() ? fn.status_string(status) : why;
}

cublasStatus_t CUBLASWINAPI cublasSgemm_v2(cublasHandle_t handle, cublasOperation_t transa,
                                           cublasOperation_t transb, int m, int n, int k,
                                           const float *alpha, const float *A, int lda,
                                           const float *B, int ldb, const float *beta, float *C,
                                           int ldc)
{
    if (!ready()) return CUBLAS_STATUS_NOT_INITIALIZED;
    return fn.sgemm(handle, transa, transb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}

cublasStatus_t CUBLASWINAPI cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                                         cublasOperation_t transb, int m, int n, int k,
                                         const void *alpha, const void *A, cudaDataType Atype,
                                         int lda, const void *B, cudaDataType Btype, int ldb,
                                         const void *beta, void *C, cudaDataType Ctype, int ldc,
                                         cublasComputeType_t computeType, cublasGemmAlgo_t algo)
{
    if (!ready()) return CUBLAS_STATUS_NOT_INITIALIZED;
    return fn.gemm_ex(handle, transa, transb, m, n, k, alpha, A, Atype, lda, B, Btype, ldb, beta,
                      C, Ctype, ldc, computeType, algo);
}
