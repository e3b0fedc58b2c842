/* cohort: tensor descriptions and storage (see tensor.h). */
#include "config.h"

#include "framework/tensor/tensor.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static ch_device_allocator_t g_dev_alloc[2];
static int g_dev_alloc_set[2];

size_t ch_dtype_size(ch_dtype_t dtype)
{
    switch (dtype) {
    case CH_F32: return 4;
    case CH_I64: return 8;
    case CH_U8: return 1;
    }
    return 0;
}

const char *ch_dtype_name(ch_dtype_t dtype)
{
    switch (dtype) {
    case CH_F32: return "float32";
    case CH_I64: return "int64";
    case CH_U8: return "uint8";
    }
    return "?";
}

const char *ch_layout_name(ch_layout_t layout)
{
    switch (layout) {
    case CH_LAYOUT_PLAIN: return "plain";
    case CH_LAYOUT_NHWC: return "nhwc";
    case CH_LAYOUT_NCHW8C: return "nChw8c";
    case CH_LAYOUT_NCHW16C: return "nChw16c";
    }
    return "?";
}

int ch_layout_block(ch_layout_t layout)
{
    switch (layout) {
    case CH_LAYOUT_NCHW8C: return 8;
    case CH_LAYOUT_NCHW16C: return 16;
    default: return 0;
    }
}

static const char *dev_name(ch_devkind_t d)
{
    switch (d) {
    case CH_DEV_CPU: return "cpu";
    case CH_DEV_CUDA: return "cuda";
    }
    return "?";
}

static ch_status validate(ch_dtype_t dtype, int ndim, const int64_t *shape,
                          ch_layout_t layout, ch_devkind_t dev, size_t *bytes)
{
    size_t es = ch_dtype_size(dtype);
    if (es == 0) return CH_ERROR(CH_ERR_INVALID, "tensor: unknown dtype %d", (int)dtype);
    if (ndim < 1 || ndim > CH_TENSOR_MAX_DIMS)
        return CH_ERROR(CH_ERR_INVALID, "tensor: ndim %d outside 1..%d", ndim,
                        CH_TENSOR_MAX_DIMS);
    if (!shape) return CH_ERROR(CH_ERR_INVALID, "tensor: shape is NULL");
    if (dev != CH_DEV_CPU && dev != CH_DEV_CUDA)
        return CH_ERROR(CH_ERR_INVALID, "tensor: unknown device kind %d", (int)dev);
    if (layout != CH_LAYOUT_PLAIN && layout != CH_LAYOUT_NHWC &&
        layout != CH_LAYOUT_NCHW8C && layout != CH_LAYOUT_NCHW16C)
        return CH_ERROR(CH_ERR_INVALID, "tensor: unknown layout %d", (int)layout);
    uint64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return CH_ERROR(CH_ERR_INVALID, "tensor: shape[%d] = %lld is negative", i,
                            (long long)shape[i]);
        if (shape[i] > 0 && n > (UINT64_MAX / 16) / (uint64_t)shape[i])
            return CH_ERROR(CH_ERR_INVALID, "tensor: shape[%d] = %lld overflows the size",
                            i, (long long)shape[i]);
        n *= (uint64_t)shape[i];
    }
    if (layout != CH_LAYOUT_PLAIN) {
        if (ndim != 4)
            return CH_ERROR(CH_ERR_INVALID,
                            "tensor: layout %s needs 4 dimensions (N,C,H,W), got %d",
                            ch_layout_name(layout), ndim);
        if (dtype != CH_F32)
            return CH_ERROR(CH_ERR_INVALID, "tensor: layout %s needs float32, got %s",
                            ch_layout_name(layout), ch_dtype_name(dtype));
        int b = ch_layout_block(layout);
        if (b && shape[1] % b != 0)
            return CH_ERROR(CH_ERR_INVALID,
                            "tensor: layout %s needs channels divisible by %d, got C=%lld",
                            ch_layout_name(layout), b, (long long)shape[1]);
    }
    if (bytes) *bytes = (size_t)n * es;
    return CH_OK;
}

ch_status ch_tensor_bytes_for(ch_dtype_t dtype, int ndim, const int64_t *shape,
                              ch_layout_t layout, size_t *bytes)
{
    CH_REQUIRE(bytes, "ch_tensor_bytes_for: bytes is NULL");
    return validate(dtype, ndim, shape, layout, CH_DEV_CPU, bytes);
}

ch_status ch_tensor_init(ch_tensor_t *t, ch_dtype_t dtype, int ndim,
                         const int64_t *shape, ch_layout_t layout,
                         ch_devkind_t dev, int dev_index)
{
    CH_REQUIRE(t, "ch_tensor_init: tensor is NULL");
    size_t bytes = 0;
    CH_TRY(validate(dtype, ndim, shape, layout, dev, &bytes));
    if (dev == CH_DEV_CUDA && dev_index < 0)
        return CH_ERROR(CH_ERR_INVALID, "tensor: GPU index %d < 0", dev_index);
    memset(t, 0, sizeof *t);
    t->dtype = dtype;
    t->ndim = ndim;
    for (int i = 0; i < CH_TENSOR_MAX_DIMS; i++) t->shape[i] = i < ndim ? shape[i] : 1;
    if (layout == CH_LAYOUT_PLAIN) {
        int64_t s = 1;
        for (int i = ndim - 1; i >= 0; i--) {
            t->strides[i] = s;
            s *= shape[i];
        }
    } else if (layout == CH_LAYOUT_NHWC) {
        int64_t C = shape[1], H = shape[2], W = shape[3];
        t->strides[0] = H * W * C;
        t->strides[1] = 1;
        t->strides[2] = W * C;
        t->strides[3] = C;
    }
    t->layout = layout;
    t->dev = dev;
    t->dev_index = dev == CH_DEV_CPU ? 0 : dev_index;
    t->nbytes = bytes;
    return CH_OK;
}

ch_status ch_storage_alloc(ch_devkind_t dev, int dev_index, size_t bytes, void **ptr)
{
    CH_REQUIRE(ptr, "ch_storage_alloc: ptr is NULL");
    *ptr = NULL;
    if (dev == CH_DEV_CPU) {
        size_t rounded = (bytes + 63) / 64 * 64;
        if (rounded < bytes)
            return CH_ERROR(CH_ERR_NOMEM, "cannot allocate %zu bytes of host memory", bytes);
        void *p = aligned_alloc(64, rounded ? rounded : 64);
        if (!p) return CH_ERROR(CH_ERR_NOMEM, "cannot allocate %zu bytes of host memory", bytes);
        memset(p, 0, rounded ? rounded : 64);
        *ptr = p;
        return CH_OK;
    }
    if (dev != CH_DEV_CUDA)
        return CH_ERROR(CH_ERR_INVALID, "ch_storage_alloc: unknown device kind %d", (int)dev);
    if (!g_dev_alloc_set[dev])
        return CH_ERROR(CH_ERR_UNSUPPORTED,
                        "cannot allocate %zu bytes on %s:%d: no allocator registered for "
                        "that device (GPU backend not built or not initialised)",
                        bytes, dev_name(dev), dev_index);
    return g_dev_alloc[dev].alloc(g_dev_alloc[dev].ctx, dev_index, bytes, ptr);
}

void ch_storage_free(ch_devkind_t dev, int dev_index, void *ptr)
{
    if (!ptr) return;
    if (dev == CH_DEV_CPU) {
        free(ptr);
    } else if (dev == CH_DEV_CUDA && g_dev_alloc_set[dev]) {
        g_dev_alloc[dev].free(g_dev_alloc[dev].ctx, dev_index, ptr);
    }
}

ch_status ch_tensor_set_device_allocator(ch_devkind_t dev, const ch_device_allocator_t *a)
{
    if (dev != CH_DEV_CUDA)
        return CH_ERROR(CH_ERR_INVALID,
                        "ch_tensor_set_device_allocator: only CH_DEV_CUDA takes hooks "
                        "(got device kind %d)", (int)dev);
    if (a && (!a->alloc || !a->free))
        return CH_ERROR(CH_ERR_INVALID, "ch_tensor_set_device_allocator: alloc and free "
                        "must both be set");
    if (a) {
        g_dev_alloc[dev] = *a;
        g_dev_alloc_set[dev] = 1;
    } else {
        memset(&g_dev_alloc[dev], 0, sizeof g_dev_alloc[dev]);
        g_dev_alloc_set[dev] = 0;
    }
    return CH_OK;
}

ch_status ch_tensor_alloc(ch_tensor_t *t, ch_dtype_t dtype, int ndim,
                          const int64_t *shape, ch_layout_t layout,
                          ch_devkind_t dev, int dev_index)
{
    CH_TRY(ch_tensor_init(t, dtype, ndim, shape, layout, dev, dev_index));
    void *p = NULL;
    ch_status s = ch_storage_alloc(dev, dev_index, t->nbytes, &p);
    if (s != CH_OK) {
        memset(t, 0, sizeof *t);
        return s;
    }
    t->data = p;
    t->owns = 1;
    return CH_OK;
}

ch_status ch_tensor_alloc_f32(ch_tensor_t *t, int ndim, const int64_t *shape)
{
    return ch_tensor_alloc(t, CH_F32, ndim, shape, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0);
}

ch_status ch_tensor_wrap(ch_tensor_t *t, void *data, ch_dtype_t dtype, int ndim,
                         const int64_t *shape, ch_layout_t layout,
                         ch_devkind_t dev, int dev_index)
{
    CH_TRY(ch_tensor_init(t, dtype, ndim, shape, layout, dev, dev_index));
    if (!data && t->nbytes > 0) {
        memset(t, 0, sizeof *t);
        return CH_ERROR(CH_ERR_INVALID, "ch_tensor_wrap: data is NULL for a non-empty tensor");
    }
    t->data = data;
    return CH_OK;
}

void ch_tensor_free(ch_tensor_t *t)
{
    if (!t) return;
    if (t->owns && t->data) ch_storage_free(t->dev, t->dev_index, t->data);
    memset(t, 0, sizeof *t);
}

int64_t ch_tensor_numel(const ch_tensor_t *t)
{
    if (!t || t->ndim < 1) return 0;
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

int ch_tensor_same_shape(const ch_tensor_t *a, const ch_tensor_t *b)
{
    if (!a || !b || a->ndim != b->ndim) return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return 0;
    return 1;
}

char *ch_tensor_describe(const ch_tensor_t *t, char *buf, size_t len)
{
    if (!buf || len == 0) return buf;
    if (!t) {
        snprintf(buf, len, "(null tensor)");
        return buf;
    }
    if (t->ndim < 1) {
        snprintf(buf, len, "(empty tensor)");
        return buf;
    }
    size_t o = 0;
    int w = snprintf(buf, len, "%s[", ch_dtype_name(t->dtype));
    o = w > 0 ? (size_t)w : 0;
    for (int i = 0; i < t->ndim && o < len; i++) {
        w = snprintf(buf + o, len - o, "%s%lld", i ? "," : "", (long long)t->shape[i]);
        if (w > 0) o += (size_t)w;
    }
    if (o < len)
        snprintf(buf + o, len - o, "] %s %s%s", ch_layout_name(t->layout), dev_name(t->dev),
                 t->data ? "" : " (no storage)");
    return buf;
}

ch_status ch_tensor_view(ch_tensor_t *dst, const ch_tensor_t *src, int ndim,
                         const int64_t *shape)
{
    CH_REQUIRE(dst && src, "ch_tensor_view: NULL tensor");
    char d[128];
    int ok_src = src->layout == CH_LAYOUT_PLAIN ||
                 (src->ndim == 4 && src->shape[2] == 1 && src->shape[3] == 1);
    if (!ok_src)
        return CH_ERROR(CH_ERR_INVALID,
                        "ch_tensor_view: cannot view %s with another shape (only plain "
                        "tensors, or 4-D tensors with H == W == 1)",
                        ch_tensor_describe(src, d, sizeof d));
    ch_tensor_t v;
    CH_TRY(ch_tensor_init(&v, src->dtype, ndim, shape, CH_LAYOUT_PLAIN, src->dev,
                          src->dev_index));
    if (ch_tensor_numel(&v) != ch_tensor_numel(src)) {
        char e[128];
        return CH_ERROR(CH_ERR_INVALID,
                        "ch_tensor_view: %s has %lld elements, the view %s has %lld",
                        ch_tensor_describe(src, d, sizeof d), (long long)ch_tensor_numel(src),
                        ch_tensor_describe(&v, e, sizeof e), (long long)ch_tensor_numel(&v));
    }
    v.data = src->data;
    v.owns = 0;
    *dst = v;
    return CH_OK;
}

ch_status ch_tensor_check(const ch_tensor_t *t, const char *what, ch_dtype_t dtype, int ndim)
{
    char d[128];
    if (!t) return CH_ERROR(CH_ERR_INVALID, "%s: tensor is NULL", what);
    if (t->ndim < 1) return CH_ERROR(CH_ERR_INVALID, "%s: tensor is empty (not initialised)", what);
    if (t->dtype != dtype || (ndim > 0 && t->ndim != ndim))
        return CH_ERROR(CH_ERR_INVALID, "%s: expected %s with %d dimensions, got %s", what,
                        ch_dtype_name(dtype), ndim, ch_tensor_describe(t, d, sizeof d));
    if (!t->data && t->nbytes > 0)
        return CH_ERROR(CH_ERR_INVALID, "%s: %s has no storage", what,
                        ch_tensor_describe(t, d, sizeof d));
    return CH_OK;
}

ch_status ch_tensor_check_shape(const ch_tensor_t *t, const char *what, ch_dtype_t dtype,
                                int ndim, const int64_t *shape)
{
    CH_TRY(ch_tensor_check(t, what, dtype, ndim));
    for (int i = 0; i < ndim; i++) {
        if (t->shape[i] != shape[i]) {
            char d[128], e[128];
            size_t o = 0;
            e[0] = 0;
            for (int j = 0; j < ndim && o < sizeof e; j++) {
                int w = snprintf(e + o, sizeof e - o, "%s%lld", j ? "," : "",
                                 (long long)shape[j]);
                if (w > 0) o += (size_t)w;
            }
            return CH_ERROR(CH_ERR_INVALID, "%s: expected shape [%s], got %s", what, e,
                            ch_tensor_describe(t, d, sizeof d));
        }
    }
    return CH_OK;
}

/* ------------------------------------------------ parameter data version */

static uint64_t g_data_version = 1;

void ch_tensor_data_changed(void) { __atomic_add_fetch(&g_data_version, 1, __ATOMIC_SEQ_CST); }

uint64_t ch_tensor_data_version(void) { return __atomic_load_n(&g_data_version, __ATOMIC_SEQ_CST); }
