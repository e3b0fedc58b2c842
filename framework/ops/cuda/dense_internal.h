/* cohort: CUDA dense ops — internals shared by dense.cu, conv.cu,
 * linear.cu and pool.cu (layout / precision conversion kernels, bias and
 * per-channel reductions, argument checks). Not installed; CUDA only.
 *
 * Every launcher queues its kernels on the compute stream ch_cuda_stream(st)
 * (grid-stride loops, 64-bit indices) and returns CH_ERR_CUDA if a launch
 * fails. None synchronizes the host. None takes workspace itself: callers
 * carve what a launcher needs out of their one ch_cuda_workspace block.
 */
#ifndef COHORT_OPS_CUDA_DENSE_INTERNAL_H
#define COHORT_OPS_CUDA_DENSE_INTERNAL_H

#include "framework/ops/cuda/cuda_internal.h"
#include "framework/ops/cuda/dense_plan.h"

/* Element type of a device buffer the dense ops convert between. */
typedef enum { CH_CD_F32 = 0, CH_CD_BF16 = 1 } ch_cd_type;

static inline size_t ch_cd_type_size(ch_cd_type t) { return t == CH_CD_F32 ? 4 : 2; }

/* dst = src for an activation-shaped buffer (N,C,HW) (HW = H*W), changing
 * layout (PLAIN <-> NHWC: a tiled transpose) and/or element type (fp32 <->
 * bf16, round-to-nearest-even). Same layout and type: a device copy (nothing
 * when src == dst). Weights use it too: OIHW is PLAIN (N=O, C=I, HW=kh*kw)
 * and OHWI (cuDNN's NHWC filter) is NHWC of the same. Layouts must be PLAIN
 * or NHWC. */
ch_status ch_cd_convert(void *st, const void *src, ch_cd_type st_type, ch_layout_t sl, void *dst,
                        ch_cd_type dt_type, ch_layout_t dl, int64_t N, int64_t C, int64_t HW);

/* y[n,c,hw] += b[c] for an fp32 (N,C,HW) activation in layout l. */
ch_status ch_cd_bias_add(void *st, float *y, const float *b, ch_layout_t l, int64_t N, int64_t C,
                         int64_t HW);

/* out[c] = sum over n, hw of x[n,c,hw] (fp32 (N,C,HW) in layout l), in fp32
 * partial sums over slices combined in double; deterministic (no atomics).
 * `partial` is device scratch of ch_cd_chansum_scratch(st, N, C, HW, l)
 * bytes. With N*HW == 0, out becomes 0. */
size_t ch_cd_chansum_scratch(void *st, int64_t N, int64_t C, int64_t HW, ch_layout_t l);
ch_status ch_cd_chansum(void *st, const float *x, ch_layout_t l, int64_t N, int64_t C, int64_t HW,
                        float *out, void *partial);

/* CH_ERR_UNSUPPORTED when t's layout is not PLAIN or NHWC (the GPU holds no
 * blocked layouts), CH_ERR_INVALID when a device tensor lives on another GPU
 * than the context's. `op`/`arg` name the call in the message. */
ch_status ch_cd_check_tensor(void *st, const char *op, const char *arg, const ch_tensor_t *t);

/* N, C, H*W of a 4-D activation (2-D (N,C): HW = 1). */
static inline void ch_cd_nchw(const ch_tensor_t *t, int64_t *N, int64_t *C, int64_t *HW)
{
    *N = t->shape[0];
    *C = t->ndim >= 2 ? t->shape[1] : 1;
    *HW = t->ndim == 4 ? t->shape[2] * t->shape[3] : 1;
}

/* table fillers of the other dense files */
void ch_cuda_table_conv(ch_ops_backend_t *t);   /* conv.cu */
void ch_cuda_table_linear(ch_ops_backend_t *t); /* linear.cu */
void ch_cuda_table_pool(ch_ops_backend_t *t);   /* pool.cu */
void ch_cuda_table_eltwise(ch_ops_backend_t *t); /* eltwise.cu: activations, LayerNorm2d */
void ch_cuda_table_dropout(ch_ops_backend_t *t); /* dropout.cu */
void ch_cuda_table_channel(ch_ops_backend_t *t); /* channel.cu: SE scale, channel concat */

#define CH_CD_THREADS 256

#endif /* COHORT_OPS_CUDA_DENSE_INTERNAL_H */
