/* cohort: index arithmetic of the CUDA kernels (batch norm, loss, fused
 * SGD) in plain C that compiles both as host C (unit-tested in
 * tests/test_cuda_index.c on machines without a GPU) and as CUDA device
 * code (framework/ops/cuda/{batchnorm,loss,sgd}.cu). Not installed.
 *
 * Activation views used by the per-channel kernels (64-bit indices):
 *   channel-first (PLAIN NCHW): element (n,c,p), p < HW, at (n*C + c)*HW + p
 *   channel-last  (NHWC, and 2-D (N,C) PLAIN = HW 1): element (r,c), r < N*HW,
 *                 at r*C + c
 * Both are "flat index i has channel (i / inner) % C" with inner = HW for
 * channel-first and inner = 1 for channel-last.
 */
#ifndef COHORT_OPS_CUDA_KERNEL_INDEX_H
#define COHORT_OPS_CUDA_KERNEL_INDEX_H

#include <stdint.h>

#ifdef __CUDACC__
#define CHK_HD static inline __host__ __device__
#else
#define CHK_HD static inline
#endif

/* ------------------------------------------------ channel of a flat index
 * A grid-stride loop visits i, i+stride, i+2*stride, ... The tracker keeps
 * (p = i % inner, c = (i / inner) % C) up to date with additions only (no
 * 64-bit division per element): two divisions at the start of the loop. */
typedef struct {
    int64_t inner, C;
    int64_t r;  /* stride % inner */
    int64_t qc; /* (stride / inner) % C */
} chk_chan_step_t;

typedef struct {
    int64_t p; /* position inside the inner run, i % inner */
    int64_t c; /* channel, (i / inner) % C */
} chk_chan_t;

CHK_HD chk_chan_step_t chk_chan_step(int64_t inner, int64_t C, int64_t stride)
{
    chk_chan_step_t s;
    s.inner = inner;
    s.C = C;
    s.r = stride % inner;
    s.qc = (stride / inner) % C;
    return s;
}

CHK_HD chk_chan_t chk_chan_at(const chk_chan_step_t *s, int64_t i)
{
    chk_chan_t t;
    t.p = i % s->inner;
    t.c = (i / s->inner) % s->C;
    return t;
}

/* Advance by one stride: p + r may carry one into the quotient; c + qc +
 * carry <= 2C - 1, so one subtraction brings it back into [0, C). */
CHK_HD void chk_chan_next(const chk_chan_step_t *s, chk_chan_t *t)
{
    int64_t carry = 0;
    t->p += s->r;
    if (t->p >= s->inner) {
        t->p -= s->inner;
        carry = 1;
    }
    t->c += s->qc + carry;
    if (t->c >= s->C) t->c -= s->C;
}

/* ------------------------------------- one channel's values, channel-first
 * Channel c of an (N,C,HW) channel-first tensor holds count = N*HW values;
 * its j-th value (j = n*HW + p) is at element n*C*HW + c*HW + p. A thread
 * walking j, j+step, ... keeps (p, off) with additions only. */
typedef struct {
    int64_t HW, CHW;
    int64_t r;    /* step % HW */
    int64_t doff; /* (step / HW) * CHW + r: offset change without a carry */
} chk_plane_step_t;

typedef struct {
    int64_t p;   /* j % HW */
    int64_t off; /* element offset of value j of the channel */
} chk_plane_t;

CHK_HD chk_plane_step_t chk_plane_step(int64_t HW, int64_t C, int64_t step)
{
    chk_plane_step_t s;
    s.HW = HW;
    s.CHW = C * HW;
    s.r = step % HW;
    s.doff = (step / HW) * s.CHW + s.r;
    return s;
}

CHK_HD chk_plane_t chk_plane_at(const chk_plane_step_t *s, int64_t c, int64_t j)
{
    chk_plane_t t;
    t.p = j % s->HW;
    t.off = (j / s->HW) * s->CHW + c * s->HW + t.p;
    return t;
}

CHK_HD void chk_plane_next(const chk_plane_step_t *s, chk_plane_t *t)
{
    t->p += s->r;
    t->off += s->doff;
    if (t->p >= s->HW) { /* crossed into the next sample: skip the other channels */
        t->p -= s->HW;
        t->off += s->CHW - s->HW;
    }
}

/* ------------------------------------------------------ partition of work
 * Part s of `parts` equal contiguous parts of [0, total): [*b, *e), the last
 * ones possibly shorter or empty. Every index lies in exactly one part. */
CHK_HD void chk_split(int64_t total, int64_t parts, int64_t s, int64_t *b, int64_t *e)
{
    int64_t len = (total + parts - 1) / parts;
    int64_t lo = s * len, hi = lo + len;
    if (lo > total) lo = total;
    if (hi > total) hi = total;
    *b = lo;
    *e = hi;
}

/* Number of slices a per-channel reduction splits each of `groups` channel
 * groups into: enough blocks to fill the GPU (target_blocks in all), but no
 * slice smaller than min_work values (so the second-stage combine stays
 * small), at least 1 and at most max_slices. Depends only on the shape and
 * the device, so a given shape reduces in the same order on every run. */
CHK_HD int64_t chk_reduce_slices(int64_t groups, int64_t work, int64_t target_blocks,
                                 int64_t min_work, int64_t max_slices)
{
    if (groups < 1) groups = 1;
    int64_t s = (target_blocks + groups - 1) / groups;
    int64_t by_work = min_work > 0 ? (work + min_work - 1) / min_work : work;
    if (s > by_work) s = by_work;
    if (s > max_slices) s = max_slices;
    if (s < 1) s = 1;
    return s;
}

/* ------------------------------------------------------------------ argmax
 * torch.argmax order (as framework/ops/cpu/kernels.c row_argmax): NaN is
 * the maximum; among equal values (or among NaNs) the lower index wins.
 * Returns nonzero when candidate (v, k) beats the current best (bv, bk);
 * associative and commutative, so any reduction tree gives the same answer
 * as the left-to-right scan. */
CHK_HD int chk_argmax_better(float v, int64_t k, float bv, int64_t bk)
{
    int vn = v != v, bn = bv != bv;
    if (vn != bn) return vn;
    if (!vn && v != bv) return v > bv;
    return k < bk;
}

/* --------------------------------------------------- fused SGD chunk table
 * The n parameters of ch_op_sgd_step are cut into chunks of at most
 * `chunk` elements; one thread block of the fused kernel updates one chunk
 * at a time (grid-stride over the chunk list). Tensors with numel 0 get no
 * chunk. Chunk order: tensor order, then ascending start. */
typedef struct {
    int32_t tensor; /* index into the tensor list */
    int32_t pad_;
    int64_t start;  /* first element */
    int64_t len;    /* 1..chunk elements */
} chk_sgd_chunk_t;

/* Number of chunks for tensors of the given sizes (numel[i] >= 0). */
CHK_HD int64_t chk_sgd_count_chunks(const int64_t *numel, int n, int64_t chunk)
{
    int64_t m = 0;
    for (int i = 0; i < n; i++) m += (numel[i] + chunk - 1) / chunk;
    return m;
}

/* Fill out[0 .. chk_sgd_count_chunks()) ; returns the number written. */
CHK_HD int64_t chk_sgd_fill_chunks(const int64_t *numel, int n, int64_t chunk,
                                   chk_sgd_chunk_t *out)
{
    int64_t m = 0;
    for (int i = 0; i < n; i++)
        for (int64_t s = 0; s < numel[i]; s += chunk) {
            out[m].tensor = i;
            out[m].pad_ = 0;
            out[m].start = s;
            out[m].len = numel[i] - s < chunk ? numel[i] - s : chunk;
            m++;
        }
    return m;
}

#undef CHK_HD
#endif /* COHORT_OPS_CUDA_KERNEL_INDEX_H */
