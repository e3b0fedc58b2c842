/* cohort: backend-neutral compute operations (ch_op_*).
 *
 * Every op takes a compute context (ch_compute_t) and tensors (tensor.h).
 * The backend is chosen at run time from the tensors' device: CH_DEV_CPU
 * runs framework/ops/cpu (oneDNN 2.x C API, plain C loops where oneDNN has
 * nothing); CH_DEV_CUDA runs framework/ops/cuda when that backend is built,
 * else the op fails with CH_ERR_UNSUPPORTED. All tensors of one call must be
 * on the same device (CH_ERR_INVALID otherwise).
 *
 * Conventions for every op below:
 *  - Shapes are logical PyTorch shapes: activations (N,C,H,W), conv weight
 *    (O,C,kh,kw) = OIHW, linear weight (M,K) = (out_features,in_features),
 *    vectors (C). Outputs are preallocated by the caller (arena or
 *    ch_tensor_alloc) with exactly the documented shape; ops never allocate
 *    tensor storage.
 *  - Layouts: activations (x, y, dx, dy) may be in any ch_layout_t; conv
 *    accepts mixed layouts between x and y; elementwise / per-channel ops
 *    (batch norm, relu, add, pooling) require x, y, dx, dy of one call to
 *    share a layout (CH_ERR_INVALID otherwise) except where noted. The output
 *    tensor's layout decides the layout the result is written in.
 *    Parameters, gradients and per-channel vectors must be PLAIN (OIHW for
 *    conv weights) — they are what optimizers, checkpoints and all-reduce see.
 *  - Every tensor must have storage (data != NULL) and float32 dtype unless
 *    noted (labels and argmax are int64).
 *  - Gradient outputs are OVERWRITTEN (not accumulated); accumulate with
 *    ch_op_add_inplace.
 *  - Errors: CH_ERR_INVALID with a message naming the op, the argument and
 *    its description (ch_tensor_describe) versus what was expected;
 *    CH_ERR_DNNL for oneDNN failures; CH_ERR_UNSUPPORTED for a device with no
 *    backend; CH_ERR_NOMEM when a primitive cache / scratchpad cannot grow.
 *  - Memory: primitives are created once per (op, shapes, layouts,
 *    parameters) and cached in the context; the context also owns one
 *    scratchpad that grows to the largest primitive's need. Both grow only
 *    the first time a shape is seen, so a training step at a fixed batch
 *    size does no allocation after the first step.
 *  - Threads: CPU ops use oneDNN's threading runtime (OpenMP in Debian's
 *    build) and the same number of threads for plain C loops. The context
 *    is not thread-safe: one thread calls ops on a context at a time.
 *  - Numerics follow PyTorch 1.13 (function named per op); tests compare
 *    against PyTorch itself (tests/test_ops.c).
 */
#ifndef COHORT_OPS_H
#define COHORT_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "framework/core/configuration.h"
#include "framework/core/status.h"
#include "framework/tensor/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ context */

typedef struct ch_compute ch_compute_t;

typedef struct ch_compute_options {
    /* Threads for CPU ops. 0: leave the runtime's default (OMP_NUM_THREADS,
     * else all cores). >0: set it (omp_set_num_threads for the whole
     * process). */
    int num_threads;
    /* Preferred activation layout override for CPU (ch_compute_preferred_layout).
     * -1: automatic (nhwc with bf16 on a bf16 ISA, where oneDNN has its AMX
     * bf16 kernels; else nChw16c with AVX-512, nChw8c with AVX2, else
     * plain); otherwise a ch_layout_t value. */
    int cpu_layout;
    /* ---- GPU backend (framework/ops/cuda; ignored by the CPU backend) ----
     * CUDA ordinal the context's GPU state (streams, cuDNN and cuBLAS
     * handles) lives on; -1: the device current when the first GPU op runs. */
    int gpu_device;
    /* 1 (default): cuDNN convolutions may use TF32 tensor cores
     * (torch.backends.cudnn.allow_tf32 = True, PyTorch's default); 0: full
     * fp32. Linear layers never use TF32 (torch.backends.cuda.matmul.allow_tf32
     * defaults to False in PyTorch >= 1.12). */
    int allow_tf32;
    /* 1: bf16 autocast for convolutions and linear layers (inputs and weights
     * cast to bfloat16, fp32 accumulation, fp32 master weights, gradients and
     * batch-norm statistics; torch.autocast(dtype=torch.bfloat16)). 0
     * (default): fp32. GPU: cuDNN/cuBLAS bf16 (outputs rounded to bf16).
     * CPU: oneDNN's bf16 kernels with fp32 outputs (y, dx, dw); needs an
     * effective oneDNN ISA with bf16 (ch_compute_cpu_has_bf16), else
     * ch_compute_create fails with CH_ERR_UNSUPPORTED naming the ISA. */
    int bf16;
    /* Convolution algorithm choice: 0 (default) cuDNN's heuristics
     * (cudnnGetConvolution*Algorithm_v7, first algorithm whose workspace fits),
     * 1 timed search (cudnnFindConvolution*Algorithm, torch.backends.cudnn.
     * benchmark = True). Cached per (shape, layout, precision). */
    int conv_search;
    /* 1: only deterministic convolution algorithms (cuDNN's
     * CUDNN_DETERMINISTIC ones, torch.backends.cudnn.deterministic = True):
     * the same inputs give bitwise the same results run after run, at some
     * cost in speed (PyTorch's "Reproducibility" notes); no such algorithm
     * within the workspace cap is an error naming the convolution. 0
     * (default): cuDNN may pick algorithms whose floating-point sums depend
     * on scheduling (atomics), as PyTorch's default. The CPU backend is
     * deterministic either way. */
    int deterministic;
    /* Cap on the cuDNN workspace in bytes; 0: default 1 GiB. */
    size_t gpu_workspace_bytes;
    /* ---- CPU backend (ignored by the GPU backend) ----
     * Algorithm of the 3x3 stride-1 convolutions (CH_CPU_CONV_*):
     * DIRECT (default) oneDNN's direct kernels, the algorithm PyTorch's CPU
     * path (mkldnn_convolution, convolution_direct) runs, so results agree
     * with PyTorch's to fp32 rounding; AUTO oneDNN's choice
     * (dnnl_convolution_auto: Winograd F(4x4,3x3) where oneDNN 2.x has it,
     * AVX-512 only, and judges it faster, else direct); WINOGRAD Winograd
     * wherever oneDNN has it (forward, backward data and backward weights;
     * Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks",
     * CVPR 2016), direct elsewhere. Winograd's transforms round differently:
     * differences to the direct result of about 1e-6 of the largest value
     * per convolution (tests/test_ops: 32 channels, 3x3). Other convolutions
     * (1x1, strided, the stem, kernels cropped on small maps, which may go
     * through cohort's GEMM path) are computed as with DIRECT. */
    int cpu_conv_algorithm;
} ch_compute_options_t;

/* Values of ch_compute_options_t.cpu_conv_algorithm (compute.cpu_conv_algorithm). */
enum { CH_CPU_CONV_DIRECT = 0, CH_CPU_CONV_AUTO = 1, CH_CPU_CONV_WINOGRAD = 2 };

/* Default options: num_threads 0, cpu_layout -1, gpu_device -1,
 * allow_tf32 1, bf16 0, conv_search 0, deterministic 0,
 * gpu_workspace_bytes 0 (1 GiB),
 * cpu_conv_algorithm CH_CPU_CONV_DIRECT. */
void ch_compute_options_default(ch_compute_options_t *o);

/* The compute context's config keys, titled "compute" (list it in a job's
 * tables): compute.allow_tf32 (bool, true), compute.precision (fp32 | bf16,
 * default fp32: bf16 = 1 for bf16), compute.bf16 (bool, false: its older
 * spelling; true also sets bf16 = 1),
 * compute.conv_search (heuristics | timed, default heuristics),
 * compute.deterministic (bool, false),
 * compute.gpu_workspace_mb (int MiB, 1024, range [1, 1048576]), which set
 * the GPU fields of ch_compute_options_t below, and
 * compute.cpu_conv_algorithm (direct | auto | winograd, default direct:
 * cpu_conv_algorithm). */
ch_config_table_t ch_compute_config_table(void);

/* Values of compute.precision: "fp32" (bf16 = 0), "bf16" (bf16 = 1). */
extern const char *const ch_compute_precision_names[2];

/* oneDNN's effective CPU instruction set (after ONEDNN_MAX_CPU_ISA), lower
 * case as oneDNN names it: "sse41", "avx2", "avx512_core",
 * "avx512_core_bf16", "avx512_core_amx", ...; "other" if unknown. */
const char *ch_compute_cpu_isa(void);

/* 1 when the effective oneDNN ISA has bf16 instructions (avx512_core_bf16,
 * avx512_core_amx and above), so compute.precision = bf16 can run on CPU;
 * else 0. */
int ch_compute_cpu_has_bf16(void);

/* Values of compute.conv_search, indexed by ch_compute_options_t.conv_search. */
extern const char *const ch_compute_conv_search_names[2];
/* Values of compute.cpu_conv_algorithm, indexed by CH_CPU_CONV_*. */
extern const char *const ch_compute_cpu_conv_algorithm_names[3];

/* *o = the defaults (ch_compute_options_default) with the compute.* keys of
 * cfg applied (cfg was loaded with ch_compute_config_table among its
 * tables). num_threads, cpu_layout and gpu_device keep their defaults: the
 * caller sets them (the device is chosen by the job runtime). Errors:
 * CH_ERR_INVALID when a key is not in cfg's tables, CH_ERR_CONFIG naming
 * the source, key and accepted values for an unknown conv_search or
 * cpu_conv_algorithm. *o is
 * untouched on error. */
ch_status ch_compute_from_config(const ch_config_t *cfg, ch_compute_options_t *o);

/* Create a context: the oneDNN CPU engine and stream, empty primitive cache.
 * opts may be NULL (defaults). Errors: CH_ERR_DNNL, CH_ERR_NOMEM,
 * CH_ERR_INVALID (bad option). */
ch_status ch_compute_create(const ch_compute_options_t *opts, ch_compute_t **cx);

/* Destroy cached primitives, scratchpad, engine and stream. NULL-safe. */
void ch_compute_destroy(ch_compute_t *cx);

/* Set the CPU thread count (> 0) for the whole process (OpenMP runtime). */
ch_status ch_compute_set_num_threads(ch_compute_t *cx, int n);

/* Threads CPU ops will use now (omp_get_max_threads). */
int ch_compute_num_threads(const ch_compute_t *cx);

/* The layout activations with `channels` channels should have on `dev`
 * for the fastest ops: the context's CPU choice when channels is divisible
 * by its block; with nChw16c, nChw8c when channels is a multiple of 8 only
 * (24, 40, ...); else CH_LAYOUT_PLAIN (e.g. the 1-channel input image).
 * Modules allocate their output activations with this layout. */
ch_layout_t ch_compute_preferred_layout(const ch_compute_t *cx, ch_devkind_t dev,
                                        int64_t channels);

/* One line: "oneDNN 2.6.3 (cpu runtime OpenMP, isa avx512_core), 1 threads,
 * layout nChw16c". On a context for a GPU (gpu_device >= 0, CUDA build) the
 * GPU backend's details come first ("CUDA GPU 0 NVIDIA H200 (132 SMs),
 * cuDNN 9.x.y, cuBLAS ..., fp32 (TF32 convs), conv algos by heuristics"),
 * then "; host " and the CPU line; the GPU state is created for it if no
 * GPU op did yet ("GPU N: backend not set up (why)" when that fails).
 * Truncated to len. Returns buf. */
char *ch_compute_describe(const ch_compute_t *cx, char *buf, size_t len);

/* Number of cached primitives and current scratchpad bytes (for tests and
 * the "no growth after the first step" check). */
size_t ch_compute_cache_entries(const ch_compute_t *cx);
size_t ch_compute_scratchpad_bytes(const ch_compute_t *cx);

/* Convolution weight conversions since the context was created (for tests
 * and benchmarks): a convolution whose kernel wants its weights in another
 * format than plain OIHW (oneDNN's blocked formats, or the dense matrix of
 * the small-map GEMM path) either converts them (*converted) or reuses a
 * copy it converted earlier from the same versioned tensor at the same
 * ch_tensor_data_version() (*reused; framework/tensor/tensor.h). Calls
 * whose kernel takes plain OIHW count in neither. Backends that do not
 * convert (CUDA) count nothing. Either pointer may be NULL; a NULL context
 * gives zeros. */
void ch_compute_weight_conversions(const ch_compute_t *cx, int64_t *converted, int64_t *reused);

/* Number of convolution primitives the context created with a Winograd
 * kernel (oneDNN's jit_wino_*; only with cpu_conv_algorithm AUTO or
 * WINOGRAD on an ISA that has one), for tests and benchmarks. 0 for a NULL
 * context and for backends that never use one (CUDA: cuDNN's own choice). */
int64_t ch_compute_winograd_primitives(const ch_compute_t *cx);

/* Wait for all queued work on the context (no-op for the CPU backend,
 * whose ops complete before returning) and report what the device found
 * in it: CH_ERR_RANGE for an out-of-range cross-entropy label (see
 * ch_op_cross_entropy). */
ch_status ch_compute_sync(ch_compute_t *cx);

/* The CUDA stream (a cudaStream_t, as void*) GPU ops of this context are
 * queued on, creating the GPU state if needed; NULL for CH_DEV_CPU or in a
 * build without CUDA. Used to order collectives (ch_pg_stream_wait) and
 * host copies against compute. */
void *ch_compute_stream(ch_compute_t *cx, ch_devkind_t dev);

/* Host -> device copy of a batch on the context's COPY stream (overlaps
 * with compute). src: CH_DEV_CPU tensor, ideally in page-locked memory
 * (ch_host_alloc with want_pinned); dst: CH_DEV_CUDA tensor of the same
 * dtype and shape (layouts may differ only as ch_op_reorder allows: the
 * layout change runs on the compute stream after the copy). Returns after
 * queueing; src must stay unchanged until ch_compute_wait_upload returns.
 * The copy is NOT ordered after work already queued on the compute stream
 * (that is what lets it overlap a step): when dst has the same layout as
 * src it is written directly by the copy stream, so the caller must know
 * that no queued compute work still reads or writes dst (cohort-train: two
 * device slots, each step ends with a device-wide wait).
 * CPU-only builds: CH_ERR_UNSUPPORTED. */
ch_status ch_op_upload_async(ch_compute_t *cx, const ch_tensor_t *src, ch_tensor_t *dst);

/* Make the compute stream wait (on the device, not the host) for every copy
 * queued by ch_op_upload_async so far; then block the host until those copies
 * have finished reading their host buffers, so the loader may reuse them.
 * No-op when nothing was uploaded. */
ch_status ch_compute_wait_upload(ch_compute_t *cx);

/* ------------------------------------------------------------- data motion */

/* dst = src converted to dst's layout (same dtype, same logical shape, any
 * layouts). The model-boundary conversion: e.g. the input batch PLAIN ->
 * preferred layout, or an activation -> PLAIN for inspection.
 * Cross-device copies are done by the backend of the non-CPU side. */
ch_status ch_op_reorder(ch_compute_t *cx, const ch_tensor_t *src, ch_tensor_t *dst);

/* Same as ch_op_reorder with dst required PLAIN. */
ch_status ch_tensor_to_plain(ch_compute_t *cx, const ch_tensor_t *src, ch_tensor_t *dst);

/* Fill every element with zero (any dtype/layout). */
ch_status ch_op_zero(ch_compute_t *cx, ch_tensor_t *t);

/* Fill a float32 tensor with value. */
ch_status ch_op_fill(ch_compute_t *cx, ch_tensor_t *t, float value);

/* dst = src elementwise copy; same dtype, shape AND layout. */
ch_status ch_op_copy(ch_compute_t *cx, const ch_tensor_t *src, ch_tensor_t *dst);

/* -------------------------------------------------------------- convolution */

/* 2-D convolution parameters (torch.nn.Conv2d). The last three fields
 * were added later: 0 there means PyTorch's default (dilation 1, groups 1),
 * so a caller that sets only stride and padding gets a plain convolution. */
typedef struct ch_conv2d_params {
    int stride_h, stride_w; /* >= 1 */
    int pad_h, pad_w;       /* >= 0, zero padding on both sides */
    /* spacing of the kernel taps (torch dilation; 0 or 1 = adjacent taps;
     * oneDNN's dilation is this minus 1) */
    int dilation_h, dilation_w;
    /* channel groups (torch groups; 0 or 1 = one group): input channels C
     * and output channels O are split into `groups` equal parts, output part
     * g sees only input part g; groups == C is a depthwise convolution. The
     * weight is (O, C/groups, kh, kw), PyTorch's layout. */
    int groups;
} ch_conv2d_params_t;

/* The effective dilation / group count of p (0 read as 1). */
static inline int ch_conv2d_dilation_h(const ch_conv2d_params_t *p)
{
    return p->dilation_h > 1 ? p->dilation_h : 1;
}
static inline int ch_conv2d_dilation_w(const ch_conv2d_params_t *p)
{
    return p->dilation_w > 1 ? p->dilation_w : 1;
}
static inline int ch_conv2d_groups(const ch_conv2d_params_t *p)
{
    return p->groups > 1 ? p->groups : 1;
}

/* Output extent of a dilated convolution along one axis
 * (torch.nn.Conv2d's formula): floor((in + 2*pad - dilation*(kernel-1) - 1)
 * / stride) + 1; returns <= 0 when the dilated window does not fit. */
int64_t ch_conv_out_size_dilated(int64_t in, int64_t kernel, int64_t stride, int64_t pad,
                                 int64_t dilation);

/* Output extent of a convolution / pooling along one axis:
 * floor((in + 2*pad - kernel) / stride) + 1; returns <= 0 when the window
 * does not fit (callers treat that as an error). */
int64_t ch_conv_out_size(int64_t in, int64_t kernel, int64_t stride, int64_t pad);

/* y = conv2d(x, w) + b  (torch.nn.functional.conv2d).
 * x (N,C,H,W) any layout; w (O,C/groups,kh,kw) PLAIN; b (O) PLAIN or NULL;
 * y (N,O,Ho,Wo) any layout, Ho = ch_conv_out_size_dilated(H,kh,stride_h,
 * pad_h,dilation_h), same W; O and C divisible by groups.
 * Grouped (depthwise) and dilated convolutions run oneDNN's grouped /
 * dilated primitives (weights as oneDNN's (G, O/G, C/G, kh, kw), the same
 * bytes as PyTorch's (O, C/G, kh, kw)), without the kernel cropping and
 * small-map GEMM paths below.
 * N may be 0 (no-op).
 * CPU: oneDNN direct convolution with the kernel cropped to the taps that
 * can touch the input; when every output window covers the whole input map
 * (small maps, e.g. resnet18's last stages on 28x28 images) one sgemm
 * (with compute.precision = bf16 one oneDNN bf16 matmul).
 * Both compute exactly the non-padding products (docs/perf-ops.md). */
ch_status ch_op_conv2d_forward(ch_compute_t *cx, const ch_tensor_t *x,
                               const ch_tensor_t *w, const ch_tensor_t *b,
                               const ch_conv2d_params_t *p, ch_tensor_t *y);

/* dx = gradient of the convolution w.r.t. its input, given dy (N,O,Ho,Wo).
 * w (O,C/groups,kh,kw) PLAIN; dx (N,C,H,W) any layout (H, W needed because stride 2
 * is ambiguous). Overwrites dx. (torch.nn.grad.conv2d_input) */
ch_status ch_op_conv2d_backward_data(ch_compute_t *cx, const ch_tensor_t *dy,
                                     const ch_tensor_t *w,
                                     const ch_conv2d_params_t *p, ch_tensor_t *dx);

/* dw (O,C/groups,kh,kw) PLAIN and db (O) PLAIN or NULL = gradients of the
 * convolution w.r.t. weight and bias, from the forward input x and dy.
 * Overwrites dw and db; with N == 0 both become zero.
 * (torch.nn.grad.conv2d_weight; db = dy summed over N,H,W) */
ch_status ch_op_conv2d_backward_weights(ch_compute_t *cx, const ch_tensor_t *x,
                                        const ch_tensor_t *dy,
                                        const ch_conv2d_params_t *p,
                                        ch_tensor_t *dw, ch_tensor_t *db);

/* Both backward ops of one convolution: ch_op_conv2d_backward_weights(x, dy
 * -> dw, db) then ch_op_conv2d_backward_data(dy, w -> dx), with the same
 * results; a backend may share work between them (CPU with compute.precision
 * = bf16: dy is rounded to bf16 once instead of once per op). dx must not
 * alias x, dy, w, dw or db. */
ch_status ch_op_conv2d_backward(ch_compute_t *cx, const ch_tensor_t *x, const ch_tensor_t *dy,
                                const ch_tensor_t *w, const ch_conv2d_params_t *p,
                                ch_tensor_t *dx, ch_tensor_t *dw, ch_tensor_t *db);

/* --------------------------------------------------------------- batch norm
 * Per-channel statistics over (N,H,W) (torch.nn.BatchNorm2d, eps usually
 * 1e-5). x and y may also be 2-D (N,C) PLAIN (BatchNorm1d-style).
 * weight/bias (C) PLAIN may be NULL (affine=False: weight 1, bias 0).
 * mean/var/invstd/sum vectors are (C) PLAIN float32.
 * "var" is always the BIASED variance (divide by count) unless named
 * otherwise; count = N*H*W per rank.
 *
 * Plain BatchNorm2d training step:
 *   forward_train(x -> y, mean, var)
 *   update_running(running_mean, running_var, mean, var, count, 0.1)
 *   backward(x, dy, mean, var -> dx, dweight, dbias)
 * SyncBatchNorm (SEMANTICS.md) composes the pieces around collectives:
 *   stats(x -> mean_r, var_r); all-gather (mean_r, var_r, count_r);
 *   gather_stats(-> mean, var, total count); update_running(..., total, 0.1);
 *   apply(x, mean, var -> y);
 *   backward_reduce(x, dy, mean -> sum_dy, sum_dy_xmu); all-reduce both;
 *   backward_elemt(x, dy, mean, var, weight, sum_dy, sum_dy_xmu, total -> dx);
 *   param_grads(sum_dy, sum_dy_xmu, var -> dweight, dbias) from the
 *   all-reduced sums (dweight = sum_dy_xmu * invstd, dbias = sum_dy).
 * All use invstd = 1 / sqrt(var + eps) (PyTorch's batch_norm_cpu). */

/* mean, var (biased) of x per channel; count = N*H*W must be >= 1.
 * (torch.batch_norm_stats, two-pass: mean first, then sum of (x-mean)^2) */
ch_status ch_op_batchnorm_stats(ch_compute_t *cx, const ch_tensor_t *x,
                                ch_tensor_t *mean, ch_tensor_t *var);

/* y = (x - mean) * invstd * weight + bias with the given mean/var (C).
 * Eval mode passes running_mean/running_var; SyncBN passes global stats.
 * y may alias x. (torch.batch_norm_elemt / F.batch_norm(training=False)) */
ch_status ch_op_batchnorm_apply(ch_compute_t *cx, const ch_tensor_t *x,
                                const ch_tensor_t *mean, const ch_tensor_t *var,
                                const ch_tensor_t *weight, const ch_tensor_t *bias,
                                float eps, ch_tensor_t *y);

/* Training forward on the local batch: mean, var (biased) = stats(x), then
 * apply. mean/var are outputs for the caller (update_running, backward).
 * y must not alias x. count N*H*W must be > 1 (PyTorch: "Expected more than
 * 1 value per channel when training"). (F.batch_norm(training=True)) */
ch_status ch_op_batchnorm_forward_train(ch_compute_t *cx, const ch_tensor_t *x,
                                        const ch_tensor_t *weight,
                                        const ch_tensor_t *bias, float eps,
                                        ch_tensor_t *y, ch_tensor_t *mean,
                                        ch_tensor_t *var);

/* Eval forward: apply with running statistics (alias of ch_op_batchnorm_apply). */
ch_status ch_op_batchnorm_forward_eval(ch_compute_t *cx, const ch_tensor_t *x,
                                       const ch_tensor_t *weight,
                                       const ch_tensor_t *bias,
                                       const ch_tensor_t *running_mean,
                                       const ch_tensor_t *running_var, float eps,
                                       ch_tensor_t *y);

/* Running statistics update (PyTorch _BatchNorm / SyncBatchNorm):
 *   running_mean = (1-momentum)*running_mean + momentum*mean
 *   running_var  = (1-momentum)*running_var  + momentum*var*count/(count-1)
 * var is the biased batch variance over `count` values (global count for
 * SyncBN); count must be > 1. All vectors (C) PLAIN float32; host or device. */
ch_status ch_op_batchnorm_update_running(ch_compute_t *cx, ch_tensor_t *running_mean,
                                         ch_tensor_t *running_var,
                                         const ch_tensor_t *mean,
                                         const ch_tensor_t *var, int64_t count,
                                         float momentum);

/* Combine per-rank statistics into global ones (SyncBN forward).
 * means, vars: (R,C) PLAIN float32 = per-rank mean and biased var gathered
 * from R ranks; counts: R host int64 values (N*H*W per rank, may be 0 — such
 * a rank contributes nothing). Outputs mean, var (C) biased over the total;
 * *total = sum of counts (must be >= 1). Uses Chan et al.'s pairwise
 * combination in double precision (same result as
 * torch.batch_norm_gather_stats_with_counts to float tolerance). */
ch_status ch_op_batchnorm_gather_stats(ch_compute_t *cx, const ch_tensor_t *means,
                                       const ch_tensor_t *vars,
                                       const int64_t *counts, int nranks,
                                       ch_tensor_t *mean, ch_tensor_t *var,
                                       int64_t *total);

/* Local backward reductions (torch.batch_norm_backward_reduce):
 *   sum_dy[c]     = sum over n,h,w of dy
 *   sum_dy_xmu[c] = sum over n,h,w of dy * (x - mean[c])
 * x, dy same shape and layout; outputs (C) PLAIN. With N == 0 both are 0. */
ch_status ch_op_batchnorm_backward_reduce(ch_compute_t *cx, const ch_tensor_t *x,
                                          const ch_tensor_t *dy,
                                          const ch_tensor_t *mean,
                                          ch_tensor_t *sum_dy,
                                          ch_tensor_t *sum_dy_xmu);

/* dweight = sum_dy_xmu * invstd, dbias = sum_dy (either output may be NULL).
 * Call with the (all-reduced, for SyncBN) sums. */
ch_status ch_op_batchnorm_param_grads(ch_compute_t *cx, const ch_tensor_t *sum_dy,
                                      const ch_tensor_t *sum_dy_xmu,
                                      const ch_tensor_t *var, float eps,
                                      ch_tensor_t *dweight, ch_tensor_t *dbias);

/* Elementwise backward (SEMANTICS.md, torch.batch_norm_backward_elemt):
 *   dx = (dy - sum_dy/total - (x-mean) * invstd^2 * sum_dy_xmu/total)
 *        * invstd * weight
 * with the GLOBAL sums and count `total` (>= 1). weight NULL means 1.
 * dx may alias dy. */
ch_status ch_op_batchnorm_backward_elemt(ch_compute_t *cx, const ch_tensor_t *x,
                                         const ch_tensor_t *dy,
                                         const ch_tensor_t *mean,
                                         const ch_tensor_t *var, float eps,
                                         const ch_tensor_t *weight,
                                         const ch_tensor_t *sum_dy,
                                         const ch_tensor_t *sum_dy_xmu,
                                         int64_t total, ch_tensor_t *dx);

/* Full local (non-synchronized) training backward: backward_reduce with the
 * local batch, param_grads, backward_elemt with total = N*H*W.
 * dweight, dbias may be NULL (not wanted / affine=False); dx may be NULL
 * (input needs no gradient). dx may alias dy. mean/var are those returned by
 * forward_train. (torch.ops.aten.native_batch_norm_backward) */
ch_status ch_op_batchnorm_backward(ch_compute_t *cx, const ch_tensor_t *x,
                                   const ch_tensor_t *dy, const ch_tensor_t *mean,
                                   const ch_tensor_t *var, float eps,
                                   const ch_tensor_t *weight, ch_tensor_t *dx,
                                   ch_tensor_t *dweight, ch_tensor_t *dbias);

/* --------------------------------------------------------------------- relu */

/* y = max(x, 0) (torch.relu). Any shape/layout (x, y same layout); y may be x. */
ch_status ch_op_relu_forward(ch_compute_t *cx, const ch_tensor_t *x, ch_tensor_t *y);

/* dx = dy where y > 0 else 0, from the forward OUTPUT y (works with an
 * in-place forward; y > 0 exactly where x > 0). dx may alias dy.
 * (torch threshold_backward(dy, y, 0)) */
ch_status ch_op_relu_backward(ch_compute_t *cx, const ch_tensor_t *y,
                              const ch_tensor_t *dy, ch_tensor_t *dx);

/* ------------------------------------------------------------------ pooling */

typedef struct ch_pool2d_params {
    int kernel_h, kernel_w; /* >= 1 */
    int stride_h, stride_w; /* >= 1 */
    int pad_h, pad_w;       /* >= 0 and <= kernel/2 (PyTorch's rule) */
    /* added later (0 = the earlier behaviour): */
    int ceil_mode;          /* 1: output size rounds up (ch_pool_out_size) */
    /* average pooling only (ch_op_avgpool2d_*): 1 divides by the window
     * clipped to the padded input (torch count_include_pad=True, PyTorch's
     * default), 0 by the number of input elements in the window */
    int count_include_pad;
} ch_pool2d_params_t;

/* Output extent of a pooling window along one axis, torch's
 * pooling_output_shape (dilation 1): floor or, with ceil_mode, ceil of
 * (in + 2*pad - kernel) / stride, plus 1; with ceil_mode the last window
 * is dropped when it would start at or after in + pad (it must start
 * inside the input or the left padding). <= 0 when the window does not fit. */
int64_t ch_pool_out_size(int64_t in, int64_t kernel, int64_t stride, int64_t pad, int ceil_mode);

/* Max pooling (torch.nn.MaxPool2d, dilation 1, padding is -inf, ceil_mode
 * as p->ceil_mode). x (N,C,H,W), y (N,C,Ho,Wo) with ch_pool_out_size; same
 * layout. The ResNet stem uses kernel 3, stride 2, pad 1. */
ch_status ch_op_maxpool2d_forward(ch_compute_t *cx, const ch_tensor_t *x,
                                  const ch_pool2d_params_t *p, ch_tensor_t *y);

/* dx = dy routed to the argmax of each window (the first maximum in row-major
 * window order, as PyTorch's CPU kernel; NaN counts as maximum). The argmax
 * is recomputed from the forward input x, so no workspace is kept.
 * x, dx (N,C,H,W), dy (N,C,Ho,Wo), one layout. Overwrites dx. */
ch_status ch_op_maxpool2d_backward(ch_compute_t *cx, const ch_tensor_t *x,
                                   const ch_tensor_t *dy,
                                   const ch_pool2d_params_t *p, ch_tensor_t *dx);

/* Adaptive average pooling to 1x1 (torch.nn.AdaptiveAvgPool2d((1,1))):
 * y[n,c] = mean over h,w of x[n,c,h,w]. x (N,C,H,W) any layout;
 * y (N,C,1,1) any layout, or (N,C) PLAIN (ready for linear). */
ch_status ch_op_avgpool_global_forward(ch_compute_t *cx, const ch_tensor_t *x,
                                       ch_tensor_t *y);

/* dx[n,c,h,w] = dy[n,c] / (H*W). dy (N,C,1,1) or (N,C) PLAIN;
 * dx (N,C,H,W) any layout. */
ch_status ch_op_avgpool_global_backward(ch_compute_t *cx, const ch_tensor_t *dy,
                                        ch_tensor_t *dx);

/* Average pooling (torch.nn.AvgPool2d(kernel, stride, padding, ceil_mode,
 * count_include_pad); divisor_override not offered). x (N,C,H,W), y
 * (N,C,Ho,Wo) with ch_pool_out_size, one layout. Output (oh, ow) averages
 * the input over rows [oh*s - p, oh*s - p + k) clipped to the input; its
 * divisor (PyTorch's AvgPoolKernel) is, with count_include_pad, the window
 * clipped to [-p, H + p) (so the windows that ceil_mode adds past the right
 * padding count only their part inside it), else the number of input
 * elements it covers. CPU: plain C per (sample, channel block) plane (oneDNN's
 * pooling_avg_include_padding counts the whole kernel on ceil_mode's extra
 * windows, which is not PyTorch's divisor); CUDA: own kernels. */
ch_status ch_op_avgpool2d_forward(ch_compute_t *cx, const ch_tensor_t *x,
                                  const ch_pool2d_params_t *p, ch_tensor_t *y);

/* dx[n,c,h,w] = sum over the windows containing (h, w) of dy / divisor
 * (the divisor of the forward). dy (N,C,Ho,Wo), dx (N,C,H,W), one layout.
 * Overwrites dx. (torch avg_pool2d_backward) */
ch_status ch_op_avgpool2d_backward(ch_compute_t *cx, const ch_tensor_t *dy,
                                   const ch_pool2d_params_t *p, ch_tensor_t *dx);

/* Adaptive average pooling to (Ho, Wo) (torch.nn.AdaptiveAvgPool2d((Ho,Wo))):
 * output row oh averages input rows [floor(oh*H/Ho), ceil((oh+1)*H/Ho)),
 * columns likewise (bins may overlap and differ in size). x (N,C,H,W), y
 * (N,C,Ho,Wo) with Ho, Wo >= 1, one layout. Ho = Wo = 1 runs
 * ch_op_avgpool_global_forward (y may then also be (N,C) PLAIN). */
ch_status ch_op_adaptive_avgpool2d_forward(ch_compute_t *cx, const ch_tensor_t *x,
                                           ch_tensor_t *y);

/* dx[n,c,h,w] = sum over the bins containing (h, w) of dy / bin size
 * (torch adaptive_avg_pool2d_backward). dy (N,C,Ho,Wo), dx (N,C,H,W);
 * Ho = Wo = 1 runs ch_op_avgpool_global_backward. Overwrites dx. */
ch_status ch_op_adaptive_avgpool2d_backward(ch_compute_t *cx, const ch_tensor_t *dy,
                                            ch_tensor_t *dx);

/* ------------------------------------------------------------------- linear */

/* y = x w^T + b (torch.nn.functional.linear). x (N,K), w (M,K), b (M) or
 * NULL, y (N,M); all PLAIN. */
ch_status ch_op_linear_forward(ch_compute_t *cx, const ch_tensor_t *x,
                               const ch_tensor_t *w, const ch_tensor_t *b,
                               ch_tensor_t *y);

/* dx (N,K) = dy (N,M) w (M,K). Overwrites dx. */
ch_status ch_op_linear_backward_data(ch_compute_t *cx, const ch_tensor_t *dy,
                                     const ch_tensor_t *w, ch_tensor_t *dx);

/* dw (M,K) = dy^T x; db (M) = sum over N of dy (db may be NULL).
 * Overwrites both. */
ch_status ch_op_linear_backward_weights(ch_compute_t *cx, const ch_tensor_t *x,
                                        const ch_tensor_t *dy, ch_tensor_t *dw,
                                        ch_tensor_t *db);

/* ---------------------------------------------------------------- elementwise */

/* out = a + b (residual add). Same shape; a, b, out one layout; out may
 * alias a or b. */
ch_status ch_op_add(ch_compute_t *cx, const ch_tensor_t *a, const ch_tensor_t *b,
                    ch_tensor_t *out);

/* acc += x (gradient accumulation). Same shape and layout. */
ch_status ch_op_add_inplace(ch_compute_t *cx, ch_tensor_t *acc, const ch_tensor_t *x);

/* t *= alpha (float32). */
ch_status ch_op_scale(ch_compute_t *cx, ch_tensor_t *t, float alpha);

/* ------------------------------------------------------------ channel ops */

/* Squeeze-excitation scale (torchvision.ops.SqueezeExcitation: scale * input):
 * y[n,c,h,w] = x[n,c,h,w] * s[n,c], s broadcast over H, W (torch's x * s
 * with s (N, C, 1, 1)). x, y (N, C, H, W) float32, any layouts (may
 * differ); s (N, C) or (N, C, 1, 1) float32, any layout (with H = W = 1
 * every layout stores element (n, c) at n*C + c). Errors: CH_ERR_INVALID
 * on shapes; CH_ERR_UNSUPPORTED on a backend without the op. */
ch_status ch_op_mul_channel(ch_compute_t *cx, const ch_tensor_t *x, const ch_tensor_t *s,
                            ch_tensor_t *y);

/* Backward of ch_op_mul_channel for the output gradient dy (x's shape):
 * dx = dy * s (broadcast as forward) and ds[n,c] = sum over (h, w) of
 * dy * x, summed in h, w order (autograd of torch's x * s). dx (x's shape,
 * any layout) or ds (s's shape) may be NULL: not computed. Overwrites
 * both. Errors as ch_op_mul_channel. */
ch_status ch_op_mul_channel_backward(ch_compute_t *cx, const ch_tensor_t *x, const ch_tensor_t *s,
                                     const ch_tensor_t *dy, ch_tensor_t *dx, ch_tensor_t *ds);

/* Channel concat (torch.cat(xs, dim=1)): xs[i] (N, C_i, H, W) float32,
 * y (N, sum C_i, H, W); any layouts. n >= 1. Errors: CH_ERR_INVALID on
 * shapes; CH_ERR_UNSUPPORTED on a backend without the op. */
ch_status ch_op_concat_channels(ch_compute_t *cx, const ch_tensor_t *const *xs, int n,
                                ch_tensor_t *y);

/* Backward of ch_op_concat_channels: dxs[i] = dy[:, c_i : c_i + C_i] with
 * c_i the sum of the C_j before i (dy (N, sum C_i, H, W)). Same checks. */
ch_status ch_op_split_channels(ch_compute_t *cx, const ch_tensor_t *dy, ch_tensor_t *const *dxs,
                               int n);

/* ------------------------------------------------------------ graph ops
 * Multi-input and channel-rearranging ops of DAG graphs (framework/nn
 * CH_NN_ADD, _MUL, _NARROW, _CHANNEL_SHUFFLE, _AFFINE). CPU backend: plain C
 * over the channel view of every layout, each (n, c) plane (or channel) by
 * one thread in h, w order, so bitwise the same for any thread count.
 * CUDA backend (framework/ops/cuda/channel.cu): PLAIN and NHWC, one thread
 * per element, sums one thread per output element in the CPU's order. */

typedef enum { CH_BINARY_ADD = 0, CH_BINARY_MUL = 1 } ch_binary_op_t;

/* y = a + b or a * b (torch broadcasting restricted to what CNN graphs
 * use): a, y (N, C, H, W) float32, any layouts (may differ); b either a's
 * shape (any layout) or broadcast over H, W from (N, C, 1, 1) / (N, C), or
 * over N, H, W from (1, C, 1, 1) / (1, C). y may alias a when a and y have
 * one layout. Errors: CH_ERR_INVALID on shapes naming both;
 * CH_ERR_UNSUPPORTED on a backend without the op. */
ch_status ch_op_binary(ch_compute_t *cx, ch_binary_op_t op, const ch_tensor_t *a,
                       const ch_tensor_t *b, ch_tensor_t *y);

/* Backward of ch_op_binary for dy (a's shape): da = dy (add) or dy * b
 * (mul, b broadcast as forward); db = dy (add) or dy * a (mul), summed over
 * the broadcast dimensions (h, w in order, then n) into b's shape. da (a's
 * shape, any layout) or db (b's shape) may be NULL: not computed; neither
 * may alias a, b or dy. Overwrites both. Errors as ch_op_binary. */
ch_status ch_op_binary_backward(ch_compute_t *cx, ch_binary_op_t op, const ch_tensor_t *a,
                                const ch_tensor_t *b, const ch_tensor_t *dy, ch_tensor_t *da,
                                ch_tensor_t *db);

/* dst[:, dst_c0 : dst_c0 + n] = src[:, src_c0 : src_c0 + n] (torch.narrow
 * on dim 1 and its backward): (N, C, H, W) float32, same N, H, W, any
 * layouts; the other channels of dst are left as they are. n >= 0 and both
 * ranges inside their tensors (CH_ERR_INVALID otherwise); src and dst must
 * not alias. */
ch_status ch_op_copy_channels(ch_compute_t *cx, const ch_tensor_t *src, int64_t src_c0,
                              ch_tensor_t *dst, int64_t dst_c0, int64_t n);

/* torchvision's channel_shuffle(x, groups) (shufflenetv2.py: view(N, g,
 * C/g, H, W), transpose(1, 2), view(N, C, H, W)): y[:, j] = x[:, (j % g) *
 * (C / g) + j / g]. x, y (N, C, H, W) float32, any layouts, not aliased;
 * groups >= 1 dividing C (CH_ERR_INVALID otherwise). The inverse (the
 * backward) is the shuffle with groups C / groups. */
ch_status ch_op_channel_shuffle(ch_compute_t *cx, const ch_tensor_t *x, int groups,
                                ch_tensor_t *y);

/* y = alpha * x + beta elementwise ((N, F) or (N, C, H, W); x, y one shape, any layouts
 * of the channel view; y may alias x). Padding channels of blocked layouts
 * are not written. Backward: dx = alpha * dy (ch_op_scale). */
ch_status ch_op_affine(ch_compute_t *cx, const ch_tensor_t *x, float alpha, float beta,
                       ch_tensor_t *y);

/* -------------------------------------------------------------- dropout */

/* Which mask a dropout call draws (framework/ops/dropout_mask.h): local
 * sample n of the batch is the sample with global index
 * g = sample_base + n * sample_stride (the trainer passes the position in
 * the epoch's global sampler order: step * batch * world + rank, stride
 * world, so the masks do not depend on the world size). */
typedef struct {
    uint64_t seed;         /* the run's seed (train.seed) */
    uint64_t stream;       /* which dropout layer (its ordinal in the model) */
    uint64_t epoch;        /* the epoch (a sample is drawn once per epoch) */
    int64_t sample_base;   /* >= 0 */
    int64_t sample_stride; /* >= 1 */
} ch_dropout_key_t;

/* y = x * mask / (1 - p) (torch.nn.functional.dropout, training): each
 * element is zeroed with probability p, the others multiplied by the
 * float32 scale 1 / (float)(1 - p) (torch 1.13: noise.div_(1 - p)); p = 1 gives
 * zeros. The mask is a function of (key, element) only (not PyTorch's
 * generator: its statistics match, not its bits), so the backward is the
 * same call on dy with the same key: dx = dy * mask / (1 - p). x and y:
 * float32 PLAIN, same shape, 2-D (N, F) or 4-D (N, C, H, W) (F = C*H*W,
 * row-major), on one device; y may be x. Errors: CH_ERR_INVALID (p
 * outside [0, 1], bad key, shapes or layouts). */
ch_status ch_op_dropout(ch_compute_t *cx, const ch_tensor_t *x, float p,
                        const ch_dropout_key_t *key, ch_tensor_t *y);

/* --------------------------------------------------------------------- loss */

/* Softmax cross-entropy with mean reduction over the batch
 * (torch.nn.CrossEntropyLoss(), no weights, no ignore_index, no smoothing).
 * logits (N,K) PLAIN float32, labels (N) int64 with 0 <= label < K (else
 * CH_ERR_RANGE naming the sample and label; on a GPU the check runs on the
 * device without a host wait, its row's loss is NaN, and the error comes
 * from the next ch_op_cross_entropy or ch_compute_sync on the context,
 * which ch_model_loss_value runs); N >= 1.
 * loss: a 1-element float32 tensor (shape (1)) receiving
 *   mean_n [ logsumexp(logits[n]) - logits[n, label[n]] ].
 * dlogits (N,K) PLAIN or NULL: gradient of that mean loss,
 *   (softmax(logits[n]) - onehot(label[n])) / N. */
ch_status ch_op_cross_entropy(ch_compute_t *cx, const ch_tensor_t *logits,
                              const ch_tensor_t *labels, ch_tensor_t *loss,
                              ch_tensor_t *dlogits);

/* Softmax cross-entropy with label smoothing and mean reduction
 * (torch.nn.CrossEntropyLoss(label_smoothing=e), no weights, no
 * ignore_index; PyTorch 1.13 aten/src/ATen/native/LossNLL.cpp
 * cross_entropy_loss_label_smoothing):
 *   loss = mean_n [ (1 - e) * (lse_n - x[n, label[n]])
 *                   + (e / K) * sum_k (lse_n - x[n, k]) ]
 * i.e. (1 - e) * nll + e * mean over classes of -log_softmax, lse_n =
 * logsumexp(x[n]); computed in double per row, the mean rounded to float
 * once. dlogits (N,K) or NULL: (softmax(x[n]) - (1 - e) * onehot - e / K) / N,
 * each element rounded to float once. Shapes, dtypes and label errors as
 * ch_op_cross_entropy; e must lie in [0, 1] (CH_ERR_INVALID naming it).
 * e == 0 is exactly ch_op_cross_entropy (bitwise the same results). */
ch_status ch_op_cross_entropy_smooth(ch_compute_t *cx, const ch_tensor_t *logits,
                                     const ch_tensor_t *labels, double label_smoothing,
                                     ch_tensor_t *loss, ch_tensor_t *dlogits);

/* out[n] = argmax_k logits[n,k] (first maximum; torch.argmax). logits (N,K)
 * PLAIN float32, out (N) int64. */
ch_status ch_op_argmax(ch_compute_t *cx, const ch_tensor_t *logits, ch_tensor_t *out);

/* *correct = number of n with argmax(logits[n]) == labels[n] (host value).
 * logits (N,K) PLAIN float32, labels (N) int64. */
ch_status ch_op_count_correct(ch_compute_t *cx, const ch_tensor_t *logits,
                              const ch_tensor_t *labels, int64_t *correct);

/* ---------------------------------------------------------------- optimizer */

/* One parameter of a fused SGD step. All pointers on the same device as the
 * step (host memory for CH_DEV_CPU, device memory for CH_DEV_CUDA); numel
 * float32 values each. momentum_buffer may be NULL when momentum == 0.
 * buffer_started: 0 means "first step": the buffer is set to g (PyTorch's
 * torch.clone(g)), 1 means buf = momentum*buf + (1-dampening)*g. */
typedef struct ch_sgd_tensor {
    float *param;
    const float *grad;
    float *momentum_buffer;
    int64_t numel;
    int buffer_started;
} ch_sgd_tensor_t;

typedef struct ch_sgd_hparams {
    float lr, momentum, dampening, weight_decay;
    int nesterov;
} ch_sgd_hparams_t;

/* torch.optim.SGD's update (PyTorch 1.13 _single_tensor_sgd; see
 * framework/train/optim.h for the formula) applied to n parameters in ONE fused
 * pass: on the GPU a single multi-tensor kernel launch over a chunk table
 * (like torch._foreach / apex multi_tensor_apply), float32 arithmetic per
 * element. dev/dev_index say where the pointers live. The tensor list
 * (pointers, numel) is cached by content, so calling it every step with the
 * same list uploads nothing. cx may be NULL for CH_DEV_CPU (the CPU loop
 * keeps no state). Errors: CH_ERR_INVALID (n < 0, NULL pointers,
 * momentum buffer missing with momentum != 0), CH_ERR_UNSUPPORTED (GPU
 * pointers in a CPU-only build), CH_ERR_CUDA. */
ch_status ch_op_sgd_step(ch_compute_t *cx, ch_devkind_t dev, int dev_index,
                         const ch_sgd_tensor_t *ts, int n, const ch_sgd_hparams_t *h);

/* One parameter of a fused AdamW step (torch.optim.AdamW). Pointers as in
 * ch_sgd_tensor_t (all on the step's device, numel float32 values each);
 * max_exp_avg_sq only with amsgrad (else may be NULL). */
typedef struct ch_adamw_tensor {
    float *param;
    const float *grad;
    float *exp_avg, *exp_avg_sq, *max_exp_avg_sq;
    int64_t numel;
} ch_adamw_tensor_t;

/* The float32 scalars of one AdamW step, computed by the caller in double
 * exactly as PyTorch 1.13's _single_tensor_adamw computes its Python floats
 * and then rounded once to float32 (what ATen's value.to<float>() does):
 *   decay = 1 - lr * weight_decay, beta1, one_minus_beta1 = 1 - beta1,
 *   beta2, one_minus_beta2 = 1 - beta2,
 *   bias_correction2_sqrt = sqrt(1 - beta2^step),
 *   neg_step_size = -(lr / (1 - beta1^step)), eps. */
typedef struct ch_adamw_hparams {
    float decay, beta1, one_minus_beta1, beta2, one_minus_beta2;
    float bias_correction2_sqrt, neg_step_size, eps;
    int amsgrad;
} ch_adamw_hparams_t;

/* torch.optim.AdamW's update (PyTorch 1.13 _single_tensor_adamw, the CPU
 * path with ATen's AVX2 kernels), per element in float32, in this order
 * (fma = one rounding, as ATen's vec::fmadd in add_(x, alpha) and addcmul_):
 *   p  = p * decay                                 param.mul_(1 - lr*wd)
 *   m  = fma(g, one_minus_beta1, m * beta1)        exp_avg.mul_(b1).add_(g, alpha=1-b1)
 *   v  = fma(one_minus_beta2 * g, g, v * beta2)    exp_avg_sq.mul_(b2).addcmul_(g, g, value=1-b2)
 *   amsgrad: vmax = maximum(vmax, v) (NaN wins, torch.maximum); u = vmax, else u = v
 *   d  = sqrt(u) / bias_correction2_sqrt + eps     (sqrt() / bc2_sqrt).add_(eps)
 *   p  = p + (neg_step_size * m) / d               param.addcdiv_(m, d, value=-step_size)
 * The GPU kernel does the same operations with round-to-nearest intrinsics:
 * CPU and GPU results are bitwise equal. CPU: threaded over elements
 * (bitwise the same for any thread count). Errors as ch_op_sgd_step
 * (CH_ERR_INVALID for NULL pointers, a missing max_exp_avg_sq with amsgrad). */
ch_status ch_op_adamw_step(ch_compute_t *cx, ch_devkind_t dev, int dev_index,
                           const ch_adamw_tensor_t *ts, int n, const ch_adamw_hparams_t *h);

/* One parameter of a fused RMSprop step (torch.optim.RMSprop). grad_avg
 * only when centered, momentum_buffer only when momentum > 0 (else NULL). */
typedef struct ch_rmsprop_tensor {
    float *param;
    const float *grad;
    float *square_avg, *grad_avg, *momentum_buffer;
    int64_t numel;
} ch_rmsprop_tensor_t;

/* Float32 scalars of one RMSprop step (doubles rounded once, as ATen):
 * neg_lr = -lr, alpha, one_minus_alpha = 1 - alpha, eps, weight_decay,
 * momentum; centered 0/1. */
typedef struct ch_rmsprop_hparams {
    float neg_lr, alpha, one_minus_alpha, eps, weight_decay, momentum;
    int centered;
} ch_rmsprop_hparams_t;

/* torch.optim.RMSprop's update (PyTorch 1.13 _single_tensor_rmsprop, CPU
 * path), per element in float32:
 *   weight_decay != 0: g = fma(p, weight_decay, g)      grad.add(p, alpha=wd)
 *   v   = fma(one_minus_alpha * g, g, v * alpha)        square_avg.mul_(a).addcmul_(g, g, value=1-a)
 *   centered: ga = fma(g, one_minus_alpha, ga * alpha)  grad_avg.mul_(a).add_(g, alpha=1-a)
 *             avg = sqrt(fma(-ga, ga, v))                square_avg.addcmul(ga, ga, value=-1).sqrt_()
 *   else      avg = sqrt(v)
 *   avg = avg + eps
 *   momentum > 0: buf = buf * momentum + g / avg; p = fma(buf, neg_lr, p)
 *   else:         p = p + (neg_lr * g) / avg
 * GPU bitwise equal to CPU; CPU threaded over elements (bitwise the same
 * for any thread count). Errors as ch_op_adamw_step. */
ch_status ch_op_rmsprop_step(ch_compute_t *cx, ch_devkind_t dev, int dev_index,
                             const ch_rmsprop_tensor_t *ts, int n, const ch_rmsprop_hparams_t *h);

/* ------------------------------------------------------ activations (eltwise)
 * The element-wise activations of torch.nn beyond ReLU, forward and
 * backward, with PyTorch 1.13's formulas (CPU kernels of
 * aten/src/ATen/native/cpu/Activation.cpp, UnaryOpsKernel.cpp,
 * BinaryOpsKernel.cpp; the backward is autograd's derivatives.yaml).
 * x is the forward input, y = f(x) the forward output, dy the gradient of
 * y, dx = dy * f'(x):
 *
 *  CH_ACT_HARDTANH   y = min(max(x, alpha), beta)  (nn.Hardtanh(min_val =
 *                    alpha, max_val = beta); nn.ReLU6 is alpha 0, beta 6);
 *                    dx = dy where alpha < x < beta, else 0 (0 at both
 *                    breakpoints: hardtanh_backward)
 *  CH_ACT_LEAKY_RELU y = x > 0 ? x : alpha * x (negative_slope alpha);
 *                    dx = x > 0 ? dy : alpha * dy (alpha * dy at x = 0)
 *  CH_ACT_SILU       y = x / (1 + exp(-x)); dx = dy * s * (1 + x * (1 - s)),
 *                    s = 1 / (1 + exp(-x))
 *  CH_ACT_SIGMOID    y = 1 / (1 + exp(-x)); dx = dy * (1 - y) * y
 *  CH_ACT_TANH       y = tanh(x); dx = dy * (1 - y * y)  (y = f(x))
 *  CH_ACT_GELU_ERF   y = x * 0.5 * (1 + erf(x / sqrt(2)))  (approximate='none');
 *                    dx = dy * (Phi(x) + x * exp(-x^2 / 2) / sqrt(2 pi))
 *  CH_ACT_GELU_TANH  y = 0.5 * x * (1 + tanh(k * (x + 0.044715 x^3))),
 *                    k = sqrt(2 / pi)  (approximate='tanh');
 *                    dx = dy * (0.5 * (1 + t) + 0.5 * x * (1 - t^2) * k *
 *                    (1 + 3 * 0.044715 * x^2)), t the tanh above
 *  CH_ACT_HARDSWISH  y = x * min(max(x + 3, 0), 6) / 6; dx = 0 for x < -3,
 *                    dy * (x / 3 + 0.5) for -3 <= x < 3, dy for x >= 3:
 *                    -0.5 dy at -3 and dy at 3, as the vectorised CPU
 *                    hardswish_backward of PyTorch 1.13 gives for all
 *                    elements of a tensor but a tail of fewer than one
 *                    vector (its scalar tail and its CUDA kernel give
 *                    1.5 dy at 3: PyTorch disagrees with itself there)
 *  CH_ACT_HARDSIGMOID y = min(max(x + 3, 0), 6) / 6; dx = dy * (1/6) for
 *                    -3 < x < 3, else 0 (0 at both breakpoints)
 *
 * alpha / beta are used by HARDTANH (alpha < beta or equal) and LEAKY_RELU
 * (alpha) and ignored otherwise. Shapes: any float32 tensor (activations
 * (N,C,H,W) in any layout, or (N,C)); x, y, dy, dx of one call share shape
 * and layout.
 * CPU: oneDNN eltwise primitives (clip_v2, relu with alpha, swish with
 * alpha 1, logistic, tanh, gelu_erf, gelu_tanh, hardswish forward) with
 * oneDNN's vectorised exp/tanh/erf, within a few ulp of PyTorch's; plain C
 * (framework/ops/act_math.h) where oneDNN 2.6 has no algorithm or its
 * derivative differs from autograd's at a breakpoint (Hardsigmoid; the
 * Hardswish backward, where oneDNN gives 0 at -3), and wherever oneDNN
 * would only offer a reference kernel. NaN: clip_v2 maps a NaN input to
 * alpha where torch.clamp keeps it. CUDA: own kernels with act_math.h's
 * formulas. Elementwise, so bitwise the same for any thread count.
 * Tests: tests/test_nn_act (vs PyTorch), tests/gpu/test_gpu_ops;
 * docs/nn-numerics.md. */
typedef enum {
    CH_ACT_HARDTANH = 0,
    CH_ACT_LEAKY_RELU,
    CH_ACT_SILU,
    CH_ACT_SIGMOID,
    CH_ACT_TANH,
    CH_ACT_GELU_ERF,
    CH_ACT_GELU_TANH,
    CH_ACT_HARDSWISH,
    CH_ACT_HARDSIGMOID,
    CH_ACT_COUNT_
} ch_act_kind_t;

typedef struct ch_act_params {
    ch_act_kind_t kind;
    float alpha; /* HARDTANH min_val, LEAKY_RELU negative_slope */
    float beta;  /* HARDTANH max_val */
} ch_act_params_t;

/* The PyTorch module name of an activation kind ("Hardtanh", "GELU", ...). */
const char *ch_act_name(ch_act_kind_t kind);

/* y = f(x). y may alias x (in place). CH_ERR_INVALID for an unknown kind or
 * alpha > beta (HARDTANH). */
ch_status ch_op_act_forward(ch_compute_t *cx, const ch_act_params_t *p, const ch_tensor_t *x,
                            ch_tensor_t *y);

/* dx = dy * f'(x) from the forward input x (SIGMOID and TANH recompute
 * y = f(x) from it exactly as the forward does, so the forward may run in
 * place only where x is kept elsewhere). dx may alias dy, not x.
 * Overwrites dx. */
ch_status ch_op_act_backward(ch_compute_t *cx, const ch_act_params_t *p, const ch_tensor_t *x,
                             const ch_tensor_t *dy, ch_tensor_t *dx);

/* ------------------------------------------------- layer norm over channels
 * ConvNeXt's LayerNorm2d ("channels_first"; torchvision's
 * models.convnext.LayerNorm2d = F.layer_norm over C of x.permute(0,2,3,1)):
 * at every (n, h, w), over the C channels,
 *   mean = sum_c x / C,  var = sum_c (x - mean)^2 / C  (biased),
 *   rstd = 1 / sqrt(var + eps),
 *   y = (x - mean) * rstd * weight[c] + bias[c].
 * Backward (torch native_layer_norm_backward), xhat = (x - mean) * rstd,
 * g = dy * weight:
 *   dx = rstd * (g - mean_c(g) - xhat * mean_c(g * xhat))
 *   dweight[c] = sum_{n,h,w} dy * xhat,  dbias[c] = sum_{n,h,w} dy.
 * x, y, dy, dx (N,C,H,W) one layout (any); weight, bias, dweight, dbias (C)
 * PLAIN, weight/bias NULL = 1/0 (elementwise_affine=False); mean, rstd
 * (N*H*W) PLAIN float32 at position (n*H + h)*W + w, written by the forward
 * and read by the backward. eps > 0 (ConvNeXt: 1e-6). Sums over C run in
 * double per position, sums over positions in double per channel, each by
 * one thread in a fixed order: bitwise the same for any thread count.
 * y must not alias x; dx may alias dy; dx, dweight, dbias may be NULL. */
ch_status ch_op_layernorm2d_forward(ch_compute_t *cx, const ch_tensor_t *x,
                                    const ch_tensor_t *weight, const ch_tensor_t *bias,
                                    float eps, ch_tensor_t *y, ch_tensor_t *mean,
                                    ch_tensor_t *rstd);
ch_status ch_op_layernorm2d_backward(ch_compute_t *cx, const ch_tensor_t *x,
                                     const ch_tensor_t *dy, const ch_tensor_t *mean,
                                     const ch_tensor_t *rstd, const ch_tensor_t *weight,
                                     ch_tensor_t *dx, ch_tensor_t *dweight,
                                     ch_tensor_t *dbias);

#ifdef __cplusplus
}
#endif
#endif /* COHORT_OPS_H */
