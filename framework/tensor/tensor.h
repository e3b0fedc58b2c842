/* cohort: tensors — shape, dtype, memory layout, device and storage.
 *
 * A ch_tensor_t is a plain struct (embed it in modules; it is not opaque).
 * It describes a dense array of up to 4 logical dimensions and points at its
 * storage; it does not know how to compute (see framework/ops/ops.h).
 *
 * Logical shape is always PyTorch's: activations (N,C,H,W), conv weights
 * (O,I,kh,kw), linear weights (out,in), biases and BN vectors (C), labels (N).
 * The *physical* arrangement is given by `layout`:
 *
 *   CH_LAYOUT_PLAIN   row-major in logical dimension order (NCHW, OIHW, (N,K),
 *                     (C)); strides[] hold the element strides. This is the
 *                     layout of every parameter, gradient, buffer, checkpoint
 *                     tensor and all-reduce bucket (what PyTorch's state_dict
 *                     holds).
 *   CH_LAYOUT_NHWC    4-D only: channels last (PyTorch channels_last).
 *   CH_LAYOUT_NCHW8C  4-D only: oneDNN nChw8c: offset(n,c,h,w) =
 *                     ((n*C/8 + c/8)*H*W + h*W + w)*8 + c%8. Requires C % 8 == 0.
 *   CH_LAYOUT_NCHW16C 4-D only: oneDNN nChw16c, same with 16. C % 16 == 0.
 *
 * Activations are kept in the layout the backend prefers
 * (ch_compute_preferred_layout() in ops.h) and converted only at model
 * boundaries with ch_op_reorder(). All layouts above hold exactly numel
 * elements (blocked layouts require C divisible by the block, so there is no
 * padding), hence nbytes = numel * dtype size for every layout.
 *
 * Storage lives on a device: CH_DEV_CPU (host memory, 64-byte aligned) or
 * CH_DEV_CUDA (device memory; allocation goes through hooks a GPU backend
 * registers with ch_tensor_set_device_allocator(); in a CPU-only build none
 * is registered and allocating there fails with CH_ERR_UNSUPPORTED).
 *
 * Storage is either owned (ch_tensor_alloc; ch_tensor_free releases it),
 * borrowed (ch_tensor_wrap over memory the caller keeps alive), or carved
 * from an arena (framework/tensor/arena.h; the arena releases it).
 */
#ifndef COHORT_TENSOR_H
#define COHORT_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#include "framework/core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CH_TENSOR_MAX_DIMS 4

typedef enum {
    CH_F32 = 0, /* float (IEEE binary32): activations, parameters, gradients */
    CH_I64 = 1, /* int64_t: labels, num_batches_tracked, argmax results */
    CH_U8 = 2   /* raw bytes: opaque workspaces */
} ch_dtype_t;

typedef enum {
    CH_LAYOUT_PLAIN = 0,
    CH_LAYOUT_NHWC = 1,
    CH_LAYOUT_NCHW8C = 2,
    CH_LAYOUT_NCHW16C = 3
} ch_layout_t;

typedef enum {
    CH_DEV_CPU = 0,
    CH_DEV_CUDA = 1
} ch_devkind_t;

typedef struct ch_tensor {
    ch_dtype_t dtype;
    int ndim;                             /* 0 only for an empty (unset) tensor; else 1..4 */
    int64_t shape[CH_TENSOR_MAX_DIMS];    /* logical sizes; unused dims are 1 */
    int64_t strides[CH_TENSOR_MAX_DIMS];  /* element strides of the logical dims
                                             for PLAIN and NHWC; 0 for blocked */
    ch_layout_t layout;
    ch_devkind_t dev;                     /* where data lives */
    int dev_index;                        /* GPU ordinal for CH_DEV_CUDA, 0 for CPU */
    void *data;                           /* NULL until allocated / committed */
    size_t nbytes;                        /* bytes of storage = numel * dtype size */
    int owns;                             /* 1 when ch_tensor_free must release data */
    int versioned;                        /* 1: a parameter whose writers all call
                                             ch_tensor_data_changed() (see below);
                                             0 (what init/alloc/wrap/view set): unknown */
} ch_tensor_t;

/* Size in bytes of one element of dtype (4, 8 or 1); 0 for an unknown dtype. */
size_t ch_dtype_size(ch_dtype_t dtype);

/* "float32", "int64", "uint8" ("?" for unknown). */
const char *ch_dtype_name(ch_dtype_t dtype);

/* "plain", "nhwc", "nChw8c", "nChw16c" ("?" for unknown). */
const char *ch_layout_name(ch_layout_t layout);

/* Channel block of a layout: 8 or 16 for the blocked ones, 0 otherwise. */
int ch_layout_block(ch_layout_t layout);

/* Describe a tensor without storage (data = NULL, owns = 0).
 * ndim 1..4, every shape[i] >= 0. Layouts other than PLAIN need ndim == 4
 * and float32; blocked layouts need shape[1] % block == 0; dev_index >= 0
 * for CH_DEV_CUDA (ignored for the CPU). Errors: CH_ERR_INVALID naming the
 * offending dimension / layout. t is fully overwritten on success. */
ch_status ch_tensor_init(ch_tensor_t *t, ch_dtype_t dtype, int ndim,
                         const int64_t *shape, ch_layout_t layout,
                         ch_devkind_t dev, int dev_index);

/* ch_tensor_init + allocate zero-filled owned storage on the device (64-byte
 * aligned on the host). Errors: as ch_tensor_init, CH_ERR_NOMEM,
 * CH_ERR_UNSUPPORTED (no allocator registered for the device). */
ch_status ch_tensor_alloc(ch_tensor_t *t, ch_dtype_t dtype, int ndim,
                          const int64_t *shape, ch_layout_t layout,
                          ch_devkind_t dev, int dev_index);

/* Convenience for the common case: plain float32 on the host. */
ch_status ch_tensor_alloc_f32(ch_tensor_t *t, int ndim, const int64_t *shape);

/* ch_tensor_init + point at caller memory `data` (at least nbytes long, kept
 * alive by the caller; not freed by ch_tensor_free). */
ch_status ch_tensor_wrap(ch_tensor_t *t, void *data, ch_dtype_t dtype, int ndim,
                         const int64_t *shape, ch_layout_t layout,
                         ch_devkind_t dev, int dev_index);

/* Release owned storage (if any) and reset t to empty. Safe on an empty or
 * zero-filled tensor and on NULL. */
void ch_tensor_free(ch_tensor_t *t);

/* Number of elements (product of shape); 0 for an empty tensor (ndim 0). */
int64_t ch_tensor_numel(const ch_tensor_t *t);

/* Bytes a tensor of this description needs (numel * dtype size). Errors as
 * ch_tensor_init (the description is validated). */
ch_status ch_tensor_bytes_for(ch_dtype_t dtype, int ndim, const int64_t *shape,
                              ch_layout_t layout, size_t *bytes);

/* A second header over src's storage with another logical shape of the same
 * numel (not owning it). Allowed when src is PLAIN (any reshape, result
 * PLAIN), or when src is 4-D with H == W == 1 in any layout (all layouts are
 * then byte-identical to plain (N,C,1,1), so it may be viewed as (N,C)).
 * Errors: CH_ERR_INVALID with both shapes in the message. */
ch_status ch_tensor_view(ch_tensor_t *dst, const ch_tensor_t *src, int ndim,
                         const int64_t *shape);

/* 1 when a and b have the same ndim and shape (layout/dtype not compared). */
int ch_tensor_same_shape(const ch_tensor_t *a, const ch_tensor_t *b);

/* Write "float32[64,3,28,28] nChw16c cpu" into buf (always NUL-terminated,
 * truncated to len). Returns buf, for use in error messages. */
char *ch_tensor_describe(const ch_tensor_t *t, char *buf, size_t len);

/* Typed host pointers (no checks; NULL-safe only in that they return data). */
static inline float *ch_tensor_f32(const ch_tensor_t *t) { return (float *)t->data; }
static inline int64_t *ch_tensor_i64(const ch_tensor_t *t) { return (int64_t *)t->data; }

/* Check helpers used by ops and modules: each returns CH_OK or
 * CH_ERR_INVALID with a message "<what>: expected ..., got <describe(t)>". */
ch_status ch_tensor_check(const ch_tensor_t *t, const char *what, ch_dtype_t dtype,
                          int ndim);
ch_status ch_tensor_check_shape(const ch_tensor_t *t, const char *what,
                                ch_dtype_t dtype, int ndim, const int64_t *shape);

/* ---- parameter data version (caches of converted weights)
 *
 * Ops may keep data derived from a weight tensor between calls (the CPU
 * convolution keeps the weights reordered into its kernel's blocked format,
 * framework/ops/cpu/conv.c) only when the tensor has versioned = 1, and tag
 * the derived copy with (data pointer, ch_tensor_data_version()). The
 * version is ONE process-wide counter, not one per tensor: parameters are
 * written through raw pointers that know no tensor header (the optimizer's
 * float pointers, DDP's broadcast of the whole parameter block, state-dict
 * memcpy), so a per-tensor counter would have to be found by every such
 * writer. Any write to any versioned tensor's data makes every cached copy
 * stale; a training step converts each weight once, an evaluation loop with
 * unchanged weights never again.
 *
 * THE RULE: whoever writes the data of a versioned tensor by any path other
 * than a ch_op_* call (which bumps it itself) must call
 * ch_tensor_data_changed() after the write and before the next op that
 * reads the tensor. Inside cohort: ch_op_sgd_step, ch_op_copy/fill/zero/
 * reorder/add/add_inplace/scale/upload_async into a versioned tensor, and in
 * framework/nn every function that writes the parameters (finalize, init,
 * load_state_dict, copy, to_device, sync_to_device) or hands out pointers to
 * them (ch_model_param_block, ch_model_device_param_block, ch_model_param,
 * ch_model_entry, ch_model_find, ch_model_state_dict: the caller may write
 * through them) call it; DDP's broadcast of the parameters and
 * io/state/train_state.c's loads call it too. Code that keeps a parameter pointer
 * and writes through it later must call it itself. Only framework/nn sets
 * versioned = 1 (module weights and biases); every other tensor is never
 * cached. Setting COHORT_WEIGHT_CACHE=0 in the environment turns the cache
 * off; COHORT_WEIGHT_CACHE=check reconverts on every reuse and fails the op
 * (CH_ERR_INTERNAL) when the cached copy differs, i.e. when a writer forgot
 * this call. Thread-safe (atomic). */
void ch_tensor_data_changed(void);

/* The current value of the counter above (starts at 1, only grows). */
uint64_t ch_tensor_data_version(void);

/* ---- device storage hooks (for GPU backends; the host allocator is
 * built in). alloc must return zero-filled memory of `bytes` or an error. */
typedef struct ch_device_allocator {
    ch_status (*alloc)(void *ctx, int dev_index, size_t bytes, void **ptr);
    void (*free)(void *ctx, int dev_index, void *ptr);
    void *ctx;
} ch_device_allocator_t;

/* Register (or with NULL, remove) the allocator used for tensors on dev.
 * CH_ERR_INVALID for CH_DEV_CPU (the host allocator is fixed). Not
 * thread-safe: call at start-up before tensors are allocated. */
ch_status ch_tensor_set_device_allocator(ch_devkind_t dev,
                                         const ch_device_allocator_t *a);

/* Raw storage allocation through the same hooks (used by the arena). Host:
 * 64-byte aligned, zero-filled. Errors: CH_ERR_NOMEM, CH_ERR_UNSUPPORTED. */
ch_status ch_storage_alloc(ch_devkind_t dev, int dev_index, size_t bytes, void **ptr);
void ch_storage_free(ch_devkind_t dev, int dev_index, void *ptr);

#ifdef __cplusplus
}
#endif
#endif /* COHORT_TENSOR_H */
