/* cohort: fused multi-tensor SGD on the GPU (ch_op_sgd_step; issue #7).
 *
 * torch.optim.SGD (PyTorch 1.13 _single_tensor_sgd; framework/train/optim.h) for
 * all n parameters in ONE kernel launch, in the manner of apex's
 * multi_tensor_apply: the parameters are cut into chunks of CHUNK elements
 * (chk_sgd_fill_chunks, kernel_index.h); each block updates one chunk at a
 * time (grid-stride over the chunk list). The tensor table (pointers,
 * numel) and the chunk table are built on the host and uploaded once per
 * distinct tensor list: they are cached in this file's slot keyed by the
 * list's content (param, grad, buffer pointers and numel), so a training
 * loop that passes the same list every step uploads nothing after the first
 * step. The per-tensor "buffer started" flags are launch arguments: all
 * off (first step) and all on (later steps) are a kernel parameter; a mixed
 * list (e.g. after restoring only some buffers) uploads a flag array, again
 * only when it changed. An upload waits for the compute stream once (the
 * host staging memory must be consumed before it is reused); steps with an
 * unchanged list never wait.
 *
 * Arithmetic: float32 per element in exactly the order of
 * framework/train/optim.c step_momentum, with __fmul_rn/__fadd_rn/__fsub_rn so
 * nvcc cannot contract into FMAs: the GPU update equals the CPU update bit
 * for bit (given equal inputs).
 */
#include "config.h"

#include "framework/ops/cuda/kernels.h"

#include "framework/ops/cuda/kernel_index.h"

#include <stdlib.h>
#include <string.h>

namespace {

constexpr int SGD_THREADS = 512;
constexpr int64_t CHUNK = 16384; /* 32 elements per thread */

struct sgd_dev_tensor {
    float *param;
    const float *grad;
    float *buf;
    int64_t numel;
};

/* started: 0 all first step, 1 all started, 2 per-tensor flags[] */
__global__ void __launch_bounds__(SGD_THREADS)
    k_sgd(const sgd_dev_tensor *T, const chk_sgd_chunk_t *chunks, int64_t nchunks,
          const unsigned char *flags, int started, float lr, float wd, float mom, float damp1,
          int nesterov, int use_momentum)
{
    for (int64_t q = blockIdx.x; q < nchunks; q += gridDim.x) {
        const chk_sgd_chunk_t ck = chunks[q];
        const sgd_dev_tensor t = T[ck.tensor];
        float *w = t.param + ck.start;
        const float *g = t.grad + ck.start;
        if (!use_momentum) {
            for (int64_t i = threadIdx.x; i < ck.len; i += SGD_THREADS) {
                const float wv = w[i];
                const float d = __fadd_rn(g[i], __fmul_rn(wd, wv));
                w[i] = __fsub_rn(wv, __fmul_rn(lr, d));
            }
            continue;
        }
        float *b = t.buf + ck.start;
        const int first = started == 0 ? 1 : started == 1 ? 0 : !flags[ck.tensor];
        for (int64_t i = threadIdx.x; i < ck.len; i += SGD_THREADS) {
            const float wv = w[i];
            const float d = __fadd_rn(g[i], __fmul_rn(wd, wv));
            const float nb = first ? d : __fadd_rn(__fmul_rn(mom, b[i]), __fmul_rn(damp1, d));
            b[i] = nb;
            const float dir = nesterov ? __fadd_rn(d, __fmul_rn(mom, nb)) : nb;
            w[i] = __fsub_rn(wv, __fmul_rn(lr, dir));
        }
    }
}

/* The cached tables of the last tensor list. */
struct sgd_slot {
    /* key: the list as last uploaded */
    int n;
    ch_sgd_tensor_t *key; /* buffer_started not part of the key */
    /* host staging, then device copy: [tensors | chunks | flags] */
    int64_t *numel;
    unsigned char *blob;
    size_t blob_cap;
    void *dev;
    size_t dev_cap;
    int64_t nchunks;
    size_t off_chunks, off_flags;
    int flags_valid; /* the device flags equal key-order last_flags */
    unsigned char *last_flags;
};

void sgd_slot_destroy(void *st, void *p)
{
    (void)st;
    sgd_slot *s = (sgd_slot *)p;
    if (!s) return;
    if (s->dev) cudaFree(s->dev);
    free(s->key);
    free(s->numel);
    free(s->blob);
    free(s->last_flags);
    free(s);
}

size_t sgd_slot_entries(void *p)
{
    const sgd_slot *s = (const sgd_slot *)p;
    return s && s->dev ? 1 : 0;
}

const ch_cuda_slot_ops_t sgd_slot_ops = {sgd_slot_destroy, sgd_slot_entries};

int same_list(const sgd_slot *s, const ch_sgd_tensor_t *ts, int n)
{
    if (!s->dev || s->n != n) return 0;
    for (int i = 0; i < n; i++)
        if (s->key[i].param != ts[i].param || s->key[i].grad != ts[i].grad ||
            s->key[i].momentum_buffer != ts[i].momentum_buffer ||
            s->key[i].numel != ts[i].numel)
            return 0;
    return 1;
}

size_t align16(size_t x) { return (x + 15) & ~(size_t)15; }

/* Build and upload the tables for ts (stream-ordered after earlier steps). */
ch_status upload_tables(void *st, sgd_slot *s, const ch_sgd_tensor_t *ts, int n)
{
    cudaStream_t stream = ch_cuda_stream(st);
    /* host arrays sized for n */
    ch_sgd_tensor_t *key = (ch_sgd_tensor_t *)realloc(s->key, (size_t)n * sizeof *key);
    if (!key) return CH_ERROR(CH_ERR_NOMEM, "ch_op_sgd_step (cuda): out of host memory");
    s->key = key;
    int64_t *numel = (int64_t *)realloc(s->numel, (size_t)n * sizeof *numel);
    if (!numel) return CH_ERROR(CH_ERR_NOMEM, "ch_op_sgd_step (cuda): out of host memory");
    s->numel = numel;
    unsigned char *lf = (unsigned char *)realloc(s->last_flags, (size_t)n);
    if (!lf) return CH_ERROR(CH_ERR_NOMEM, "ch_op_sgd_step (cuda): out of host memory");
    s->last_flags = lf;
    s->n = 0; /* invalid until the upload is queued */
    for (int i = 0; i < n; i++) numel[i] = ts[i].numel;
    const int64_t m = chk_sgd_count_chunks(numel, n, CHUNK);
    const size_t off_chunks = align16((size_t)n * sizeof(sgd_dev_tensor));
    const size_t off_flags = off_chunks + align16((size_t)m * sizeof(chk_sgd_chunk_t));
    const size_t bytes = off_flags + align16((size_t)n);
    if (bytes > s->blob_cap) {
        unsigned char *b = (unsigned char *)realloc(s->blob, bytes);
        if (!b) return CH_ERROR(CH_ERR_NOMEM, "ch_op_sgd_step (cuda): out of host memory");
        s->blob = b;
        s->blob_cap = bytes;
    }
    memset(s->blob, 0, bytes);
    sgd_dev_tensor *T = (sgd_dev_tensor *)s->blob;
    for (int i = 0; i < n; i++) {
        T[i].param = ts[i].param;
        T[i].grad = ts[i].grad;
        T[i].buf = ts[i].momentum_buffer;
        T[i].numel = ts[i].numel;
    }
    chk_sgd_fill_chunks(numel, n, CHUNK, (chk_sgd_chunk_t *)(s->blob + off_chunks));
    if (bytes > s->dev_cap) {
        /* a queued step may still read the old tables */
        CH_CHECK_CUDA(cudaStreamSynchronize(stream));
        if (s->dev) cudaFree(s->dev);
        s->dev = nullptr;
        s->dev_cap = 0;
        CH_CHECK_CUDA(cudaMalloc(&s->dev, bytes));
        s->dev_cap = bytes;
    }
    /* ordered after earlier kernels that may still read the old tables;
     * the wait makes sure the copy has consumed the (pageable) blob before
     * it is rewritten. Only when the list changes: once per training run. */
    CH_CHECK_CUDA(cudaMemcpyAsync(s->dev, s->blob, off_flags, cudaMemcpyHostToDevice, stream));
    CH_CHECK_CUDA(cudaStreamSynchronize(stream));
    memcpy(s->key, ts, (size_t)n * sizeof *ts);
    s->n = n;
    s->nchunks = m;
    s->off_chunks = off_chunks;
    s->off_flags = off_flags;
    s->flags_valid = 0;
    return CH_OK;
}

ch_status upload_flags(void *st, sgd_slot *s, const ch_sgd_tensor_t *ts, int n)
{
    int same = s->flags_valid;
    for (int i = 0; i < n && same; i++) same = s->last_flags[i] == (ts[i].buffer_started != 0);
    if (same) return CH_OK;
    for (int i = 0; i < n; i++) s->last_flags[i] = ts[i].buffer_started != 0;
    memcpy(s->blob + s->off_flags, s->last_flags, (size_t)n);
    CH_CHECK_CUDA(cudaMemcpyAsync((char *)s->dev + s->off_flags, s->blob + s->off_flags, (size_t)n,
                                  cudaMemcpyHostToDevice, ch_cuda_stream(st)));
    CH_CHECK_CUDA(cudaStreamSynchronize(ch_cuda_stream(st))); /* blob consumed (rare path) */
    s->flags_valid = 1;
    return CH_OK;
}

} // namespace

ch_status ch_cuda_sgd_step(void *st, const ch_sgd_tensor_t *ts, int n, const ch_sgd_hparams_t *h)
{
    if (n == 0) return CH_OK;
    sgd_slot *s = (sgd_slot *)ch_cuda_slot(st, CH_CUDA_SLOT_SGD);
    if (!s) {
        s = (sgd_slot *)calloc(1, sizeof *s);
        if (!s) return CH_ERROR(CH_ERR_NOMEM, "ch_op_sgd_step (cuda): out of host memory");
        ch_cuda_slot_set(st, CH_CUDA_SLOT_SGD, s, &sgd_slot_ops);
    }
    if (!same_list(s, ts, n)) CH_TRY(upload_tables(st, s, ts, n));
    if (s->nchunks == 0) return CH_OK;
    const int use_momentum = h->momentum != 0.0f;
    int started = 0;
    if (use_momentum) {
        int on = 0, off = 0;
        for (int i = 0; i < n; i++) {
            if (ts[i].numel == 0) continue;
            if (ts[i].buffer_started) on++;
            else off++;
        }
        started = off == 0 ? 1 : on == 0 ? 0 : 2;
        if (started == 2) CH_TRY(upload_flags(st, s, ts, n));
    }
    const float damp1 = (float)(1.0 - (double)h->dampening); /* as optim.c */
    const char *base = (const char *)s->dev;
    const int64_t cap = 8LL * (ch_cuda_sm_count(st) > 0 ? ch_cuda_sm_count(st) : 1);
    const unsigned blocks = (unsigned)(s->nchunks < cap ? s->nchunks : cap);
    k_sgd<<<blocks, SGD_THREADS, 0, ch_cuda_stream(st)>>>(
        (const sgd_dev_tensor *)base, (const chk_sgd_chunk_t *)(base + s->off_chunks),
        s->nchunks, (const unsigned char *)(base + s->off_flags), started, h->lr,
        h->weight_decay, h->momentum, damp1, h->nesterov != 0, use_momentum);
    CH_CUDA_CHECK_LAUNCH();
    return CH_OK;
}
