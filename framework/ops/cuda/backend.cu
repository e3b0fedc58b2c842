/* cohort: CUDA ops backend — per-context GPU state (device, compute and copy
 * streams, cuDNN and cuBLAS handles bound to the compute stream, one growing
 * workspace, per-op-file caches) and the ch_ops_backend_t table. The ops
 * themselves live in the other files of this directory (cuda_internal.h). */
#include "config.h"

#include "framework/ops/cuda/cuda_internal.h"
#include "framework/ops/cuda/kernels.h"

#include "framework/tensor/device.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ch_cuda_state {
    ch_compute_options_t opts;
    int device;
    int sm_count;
    char name[256];
    cudaStream_t compute, copy;
    cudnnHandle_t cudnn;
    cublasHandle_t cublas;
    void *ws;
    size_t ws_bytes;
    void *slot[CH_CUDA_SLOT_COUNT_];
    const ch_cuda_slot_ops_t *slot_ops[CH_CUDA_SLOT_COUNT_];
};

#define S(st) ((ch_cuda_state_t *)(st))

cudaStream_t ch_cuda_stream(void *st) { return S(st)->compute; }
cudaStream_t ch_cuda_copy_stream(void *st) { return S(st)->copy; }
cudnnHandle_t ch_cuda_cudnn(void *st) { return S(st)->cudnn; }
cublasHandle_t ch_cuda_cublas(void *st) { return S(st)->cublas; }
int ch_cuda_device(void *st) { return S(st)->device; }
const ch_compute_options_t *ch_cuda_opts(void *st) { return &S(st)->opts; }
int ch_cuda_sm_count(void *st) { return S(st)->sm_count; }
size_t ch_cuda_workspace_bytes(void *st) { return S(st)->ws_bytes; }
void *ch_cuda_slot(void *st, ch_cuda_slot_id id) { return S(st)->slot[id]; }

void ch_cuda_slot_set(void *st, ch_cuda_slot_id id, void *slot, const ch_cuda_slot_ops_t *ops)
{
    S(st)->slot[id] = slot;
    S(st)->slot_ops[id] = ops;
}

ch_status ch_cuda_workspace(void *st, size_t bytes, void **ptr)
{
    ch_cuda_state_t *s = S(st);
    *ptr = NULL;
    if (bytes == 0) return CH_OK;
    if (bytes > s->ws_bytes) {
        /* kernels queued earlier may still use the old block */
        CH_CHECK_CUDA(cudaStreamSynchronize(s->compute));
        if (s->ws) cudaFree(s->ws);
        s->ws = NULL;
        s->ws_bytes = 0;
        size_t grow = bytes + bytes / 4; /* fewer regrowths while shapes are first seen */
        cudaError_t e = cudaMalloc(&s->ws, grow);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            e = cudaMalloc(&s->ws, bytes);
            if (e != cudaSuccess) {
                (void)cudaGetLastError();
                s->ws = NULL;
                return CH_ERROR(CH_ERR_NOMEM, "GPU %d: cannot allocate a %zu-byte workspace: %s",
                                s->device, bytes, cudaGetErrorString(e));
            }
            grow = bytes;
        }
        s->ws_bytes = grow;
    }
    *ptr = s->ws;
    return CH_OK;
}

static void cuda_destroy(void *st)
{
    ch_cuda_state_t *s = S(st);
    if (!s) return;
    int prev = -1;
    (void)cudaGetDevice(&prev);
    (void)cudaSetDevice(s->device);
    if (s->compute) (void)cudaStreamSynchronize(s->compute);
    for (int i = 0; i < CH_CUDA_SLOT_COUNT_; i++)
        if (s->slot[i] && s->slot_ops[i] && s->slot_ops[i]->destroy)
            s->slot_ops[i]->destroy(st, s->slot[i]);
    if (s->ws) cudaFree(s->ws);
    if (s->cublas) cublasDestroy(s->cublas);
    if (s->cudnn) cudnnDestroy(s->cudnn);
    if (s->copy) cudaStreamDestroy(s->copy);
    if (s->compute) cudaStreamDestroy(s->compute);
    if (prev >= 0) (void)cudaSetDevice(prev);
    free(s);
}

static ch_status cuda_setup(ch_cuda_state_t *s)
{
    int n = 0;
    CH_TRY(ch_device_count(&n));
    if (n == 0) return CH_ERROR(CH_ERR_UNSUPPORTED, "GPU ops requested but no GPU is visible");
    if (s->opts.gpu_device >= 0) {
        if (s->opts.gpu_device >= n)
            return CH_ERROR(CH_ERR_RANGE, "gpu_device %d requested but %d GPU%s visible",
                            s->opts.gpu_device, n, n == 1 ? "" : "s");
        CH_CHECK_CUDA(cudaSetDevice(s->opts.gpu_device));
    }
    CH_CHECK_CUDA(cudaGetDevice(&s->device));
    CH_TRY(ch_device_enable_tensors());
    cudaDeviceProp prop;
    CH_CHECK_CUDA(cudaGetDeviceProperties(&prop, s->device));
    s->sm_count = prop.multiProcessorCount;
    snprintf(s->name, sizeof s->name, "%s", prop.name);
    CH_CHECK_CUDA(cudaStreamCreateWithFlags(&s->compute, cudaStreamNonBlocking));
    CH_CHECK_CUDA(cudaStreamCreateWithFlags(&s->copy, cudaStreamNonBlocking));
    CH_CHECK_CUDNN(cudnnCreate(&s->cudnn));
    CH_CHECK_CUDNN(cudnnSetStream(s->cudnn, s->compute));
    CH_CHECK_CUBLAS(cublasCreate(&s->cublas));
    CH_CHECK_CUBLAS(cublasSetStream(s->cublas, s->compute));
    /* fp32 GEMMs stay fp32 (torch.backends.cuda.matmul.allow_tf32 = False) */
    CH_CHECK_CUBLAS(cublasSetMathMode(s->cublas, CUBLAS_DEFAULT_MATH));
    return CH_OK;
}

static ch_status cuda_create(void **state, const ch_compute_options_t *opts)
{
    *state = NULL;
    ch_cuda_state_t *s = (ch_cuda_state_t *)calloc(1, sizeof *s);
    if (!s) return CH_ERROR(CH_ERR_NOMEM, "CUDA backend: out of memory");
    s->opts = *opts;
    if (s->opts.gpu_workspace_bytes == 0) s->opts.gpu_workspace_bytes = (size_t)1 << 30;
    ch_status st = cuda_setup(s);
    if (st != CH_OK) {
        cuda_destroy(s);
        return st;
    }
    *state = s;
    return CH_OK;
}

static ch_status cuda_set_num_threads(void *st, int n)
{
    (void)st;
    (void)n;
    return CH_OK; /* host threads are the CPU backend's business */
}

static int cuda_num_threads(const void *st)
{
    (void)st;
    return 1;
}

/* Channels-last (NHWC) is what cuDNN's tensor-core kernels run natively
 * (PyTorch's channels_last); inputs with few channels (images) stay plain. */
static ch_layout_t cuda_preferred_layout(const void *st, int64_t channels)
{
    (void)st;
    return channels % 8 == 0 ? CH_LAYOUT_NHWC : CH_LAYOUT_PLAIN;
}

static void cuda_describe(const void *st, char *buf, size_t len)
{
    const ch_cuda_state_t *s = (const ch_cuda_state_t *)st;
    size_t v = cudnnGetVersion();
    int cublas_v = 0;
    cublasGetVersion(s->cublas, &cublas_v);
    snprintf(buf, len, "CUDA GPU %d %s (%d SMs), cuDNN %zu.%zu.%zu, cuBLAS %d, %s%s, conv algos by %s%s",
             s->device, s->name, s->sm_count, v / 10000, (v % 10000) / 100, v % 100, cublas_v,
             s->opts.bf16 ? "bf16 autocast" : "fp32",
             s->opts.bf16 ? "" : (s->opts.allow_tf32 ? " (TF32 convs)" : " (no TF32)"),
             s->opts.conv_search ? "timed search" : "heuristics",
             s->opts.deterministic ? " (deterministic only)" : "");
}

static size_t cuda_cache_entries(const void *st)
{
    const ch_cuda_state_t *s = (const ch_cuda_state_t *)st;
    size_t n = 0;
    for (int i = 0; i < CH_CUDA_SLOT_COUNT_; i++)
        if (s->slot[i] && s->slot_ops[i] && s->slot_ops[i]->cache_entries)
            n += s->slot_ops[i]->cache_entries(s->slot[i]);
    return n;
}

static size_t cuda_scratchpad_bytes(const void *st)
{
    return ((const ch_cuda_state_t *)st)->ws_bytes;
}

/* ch_compute_sync: "all queued work on the context", which includes the
 * host->device copies ch_op_upload_async queued on the copy stream (they do
 * not wait for the compute stream, nor it for them, until wait_upload). */
static ch_status cuda_sync(void *st)
{
    CH_CHECK_CUDA(cudaStreamSynchronize(S(st)->compute));
    CH_CHECK_CUDA(cudaStreamSynchronize(S(st)->copy));
    return ch_cuda_loss_check(st); /* errors the device found in queued ops */
}

static void *cuda_stream_ptr(void *st) { return (void *)S(st)->compute; }

static ch_ops_backend_t table;
static int table_ready;

extern "C" const ch_ops_backend_t *ch_ops_cuda_backend(void)
{
    if (!table_ready) {
        memset(&table, 0, sizeof table);
        table.name = "cuda";
        table.create = cuda_create;
        table.destroy = cuda_destroy;
        table.set_num_threads = cuda_set_num_threads;
        table.num_threads = cuda_num_threads;
        table.preferred_layout = cuda_preferred_layout;
        table.describe = cuda_describe;
        table.cache_entries = cuda_cache_entries;
        table.scratchpad_bytes = cuda_scratchpad_bytes;
        table.sync = cuda_sync;
        table.stream = cuda_stream_ptr;
        ch_cuda_table_dense(&table);
        ch_cuda_table_kernels(&table);
        table_ready = 1;
    }
    return &table;
}
