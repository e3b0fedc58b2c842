/* cohort: ONNX reader (io/formats/onnx.h).
 *
 * Three passes: (1) a wire-format scan of the bytes, iterative, guided by
 * the generated protobuf-c descriptors, that checks every field lies inside
 * its parent and bounds the nesting depth (protobuf-c's unpacker recurses
 * without a limit, so a deeply nested file would overflow the stack);
 * (2) protobuf-c unpacks ModelProto; (3) the message is converted into the
 * plain structs of onnx.h, pointing into the message where its data already
 * has the right type, and the graph is checked (names defined before use,
 * no name produced twice, outputs). The model owns the unpacked message
 * and frees it in ch_onnx_free. */
#include "config.h"

#include "io/formats/onnx.h"
#include "io/formats/onnx.pb-c.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdalign.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* ------------------------------------------------------------ model and arena */

typedef struct blk {
    struct blk *next;
    max_align_t data[];
} blk_t;

typedef struct {
    const char **key; /* NULL = empty slot */
    int *val;
    size_t cap;       /* power of two */
} names_t;

typedef struct {
    ch_onnx_model_t pub;     /* first: the public part */
    Onnx__ModelProto *pb;    /* the unpacked message the model points into */
    blk_t *blocks;           /* everything else allocated for the model */
    names_t init_names;      /* initializer name -> index in pub.init */
} model_t;

static void *arena(model_t *m, size_t n)
{
    if (n > SIZE_MAX - sizeof(blk_t) - 16) return NULL;
    blk_t *b = calloc(1, sizeof(blk_t) + (n ? n : 1));
    if (!b) return NULL;
    b->next = m->blocks;
    m->blocks = b;
    return b->data;
}

/* n elements of size sz, with overflow check. */
static void *arena_n(model_t *m, size_t n, size_t sz)
{
    if (sz && n > SIZE_MAX / sz) return NULL;
    return arena(m, n * sz);
}

static const char *S(const char *s) { return s ? s : ""; }

/* ------------------------------------------------------------ name sets */

static uint64_t hash_str(const char *s)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static int names_init(model_t *m, names_t *t, size_t n)
{
    size_t cap = 16;
    while (cap < 2 * n + 1) {
        if (cap > SIZE_MAX / 4) return -1;
        cap *= 2;
    }
    t->key = arena_n(m, cap, sizeof *t->key);
    t->val = arena_n(m, cap, sizeof *t->val);
    t->cap = cap;
    return t->key && t->val ? 0 : -1;
}

/* Index of key, or -1. */
static int names_get(const names_t *t, const char *key)
{
    if (!t->cap) return -1;
    for (size_t i = hash_str(key) & (t->cap - 1);; i = (i + 1) & (t->cap - 1)) {
        if (!t->key[i]) return -1;
        if (!strcmp(t->key[i], key)) return t->val[i];
    }
}

/* Insert key -> val; returns 1 if it was new, 0 if present (unchanged). The
 * table is sized for every insertion at names_init. */
static int names_put(names_t *t, const char *key, int val)
{
    for (size_t i = hash_str(key) & (t->cap - 1);; i = (i + 1) & (t->cap - 1)) {
        if (!t->key[i]) {
            t->key[i] = key;
            t->val[i] = val;
            return 1;
        }
        if (!strcmp(t->key[i], key)) return 0;
    }
}

/* ------------------------------------------------------------ wire scan */

/* Read a varint at *p (< end); returns 0, or -1 if it runs past end or is
 * longer than 10 bytes. */
static int varint(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
    uint64_t x = 0;
    for (int k = 0; k < 10; k++) {
        if (*p >= end) return -1;
        uint8_t b = *(*p)++;
        x |= (uint64_t)(b & 0x7f) << (7 * k);
        if (!(b & 0x80)) {
            *v = x;
            return 0;
        }
    }
    return -1;
}

/* Is tag (field number, wire type) a field of ModelProto with that wire type? */
static int modelproto_field(uint64_t field, unsigned wt)
{
    const ProtobufCFieldDescriptor *f =
        field <= INT_MAX ? protobuf_c_message_descriptor_get_field(&onnx__model_proto__descriptor,
                                                                   (unsigned)field)
                         : NULL;
    if (!f) return 0;
    switch (f->type) {
    case PROTOBUF_C_TYPE_STRING: case PROTOBUF_C_TYPE_BYTES: case PROTOBUF_C_TYPE_MESSAGE:
        return wt == 2;
    default:
        return wt == 0 || wt == 2; /* varints (ModelProto has only int64s), packed or not */
    }
}

/* Check the wire structure of buf: tags, varints and lengths inside their
 * parent; messages (per the descriptors) nested at most CH_ONNX_MAX_DEPTH.
 * Sets the error message. */
static ch_status wire_scan(const uint8_t *buf, size_t len, const char *what)
{
    struct frame {
        const uint8_t *end;
        const ProtobufCMessageDescriptor *d;
    } st[CH_ONNX_MAX_DEPTH + 1];
    int depth = 0;
    const uint8_t *p = buf;
    st[0].end = buf + len;
    st[0].d = &onnx__model_proto__descriptor;
    int first = 1;
    for (;;) {
        while (depth > 0 && p == st[depth].end) depth--;
        if (p == st[depth].end) break; /* depth 0: done */
        size_t at = (size_t)(p - buf);
        uint64_t tag, v;
        if (varint(&p, st[depth].end, &tag) || (tag >> 3) == 0) goto bad;
        unsigned wt = (unsigned)(tag & 7);
        uint64_t field = tag >> 3;
        if (first) {
            if (!modelproto_field(field, wt))
                return CH_ERROR(CH_ERR_FORMAT, "%s: not an ONNX model (protobuf ModelProto expected)", what);
            first = 0;
        }
        size_t left = (size_t)(st[depth].end - p);
        switch (wt) {
        case 0:
            if (varint(&p, st[depth].end, &v)) goto cut;
            break;
        case 1:
            if (left < 8) goto cut;
            p += 8;
            break;
        case 5:
            if (left < 4) goto cut;
            p += 4;
            break;
        case 2: {
            if (varint(&p, st[depth].end, &v)) goto cut;
            left = (size_t)(st[depth].end - p);
            if (v > left) {
                if (st[depth].end == buf + len) goto cut;
                return CH_ERROR(CH_ERR_FORMAT,
                                "%s: corrupt ONNX file: the field at byte %zu (%llu bytes) runs past the end "
                                "of the message holding it", what, at, (unsigned long long)v);
            }
            const ProtobufCFieldDescriptor *f =
                st[depth].d && field <= INT_MAX
                    ? protobuf_c_message_descriptor_get_field(st[depth].d, (unsigned)field)
                    : NULL;
            if (f && f->type == PROTOBUF_C_TYPE_MESSAGE) {
                if (depth == CH_ONNX_MAX_DEPTH)
                    return CH_ERROR(CH_ERR_FORMAT, "%s: ONNX messages nested deeper than %d (at byte %zu)",
                                    what, CH_ONNX_MAX_DEPTH, at);
                depth++;
                st[depth].end = p + v;
                st[depth].d = f->descriptor;
            } else {
                p += v;
            }
            break;
        }
        default: /* groups (3, 4) are not used by onnx.proto; 6, 7 do not exist */
            goto bad;
        }
        continue;
    cut:
        return CH_ERROR(CH_ERR_FORMAT,
                        "%s: truncated ONNX file: the field at byte %zu runs past the end (%zu bytes)",
                        what, at, len);
    bad:
        return CH_ERROR(CH_ERR_FORMAT,
                        "%s: corrupt ONNX file: bad protobuf field at byte %zu (ModelProto expected)", what, at);
    }
    return CH_OK;
}

/* ------------------------------------------------------------ tensors */

const char *ch_onnx_type_name(int t)
{
    static const char *const n[] = {"undefined", "float", "uint8", "int8", "uint16", "int16",
                                    "int32", "int64", "string", "bool", "float16", "double",
                                    "uint32", "uint64", "complex64", "complex128", "bfloat16",
                                    "float8e4m3fn", "float8e4m3fnuz", "float8e5m2", "float8e5m2fnuz"};
    return t >= 0 && t < (int)(sizeof n / sizeof n[0]) ? n[t] : "?";
}

/* Bytes per element in raw_data; 0 for types cohort does not read. */
static size_t elem_size(int t)
{
    switch (t) {
    case ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT: case ONNX__TENSOR_PROTO__DATA_TYPE__INT32:
    case ONNX__TENSOR_PROTO__DATA_TYPE__UINT32:
        return 4;
    case ONNX__TENSOR_PROTO__DATA_TYPE__UINT8: case ONNX__TENSOR_PROTO__DATA_TYPE__INT8:
    case ONNX__TENSOR_PROTO__DATA_TYPE__BOOL:
        return 1;
    case ONNX__TENSOR_PROTO__DATA_TYPE__UINT16: case ONNX__TENSOR_PROTO__DATA_TYPE__INT16:
    case ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16: case ONNX__TENSOR_PROTO__DATA_TYPE__BFLOAT16:
        return 2;
    case ONNX__TENSOR_PROTO__DATA_TYPE__INT64: case ONNX__TENSOR_PROTO__DATA_TYPE__DOUBLE:
    case ONNX__TENSOR_PROTO__DATA_TYPE__UINT64:
        return 8;
    default:
        return 0;
    }
}

/* IEEE binary16 bits -> binary32 value, exact (NaN payloads kept in the
 * high mantissa bits, as c10's fp16_ieee_to_fp32_value). */
static float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ffu, bits;
    if (e == 0x1f) {
        bits = sign | 0x7f800000u | (m << 13);
    } else if (e == 0) {
        if (!m) {
            bits = sign;
        } else { /* subnormal: normalize */
            int k = -1;
            do {
                k++;
                m <<= 1;
            } while (!(m & 0x400u));
            bits = sign | ((uint32_t)(127 - 15 - k) << 23) | ((m & 0x3ffu) << 13);
        }
    } else {
        bits = sign | ((e + 127 - 15) << 23) | (m << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static float bf16_to_float(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Little-endian loads from unaligned bytes. */
static uint64_t le(const uint8_t *p, size_t n)
{
    uint64_t x = 0;
    for (size_t k = 0; k < n; k++) x |= (uint64_t)p[k] << (8 * k);
    return x;
}

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define HOST_LE 1
#else
#define HOST_LE 0
#endif

/* Element k of a tensor of type t given as raw little-endian bytes. */
static void raw_elem(int t, const uint8_t *p, double *fv, int64_t *iv, uint64_t *uv)
{
    uint64_t x = le(p, elem_size(t));
    switch (t) {
    case ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT: { uint32_t b = (uint32_t)x; float f; memcpy(&f, &b, 4); *fv = f; break; }
    case ONNX__TENSOR_PROTO__DATA_TYPE__DOUBLE: memcpy(fv, &x, 8); break;
    case ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16: *fv = half_to_float((uint16_t)x); break;
    case ONNX__TENSOR_PROTO__DATA_TYPE__BFLOAT16: *fv = bf16_to_float((uint16_t)x); break;
    case ONNX__TENSOR_PROTO__DATA_TYPE__INT8: *iv = (int8_t)(uint8_t)x; break;
    case ONNX__TENSOR_PROTO__DATA_TYPE__INT16: *iv = (int16_t)(uint16_t)x; break;
    case ONNX__TENSOR_PROTO__DATA_TYPE__INT32: *iv = (int32_t)(uint32_t)x; break;
    case ONNX__TENSOR_PROTO__DATA_TYPE__INT64: *iv = (int64_t)x; break;
    case ONNX__TENSOR_PROTO__DATA_TYPE__UINT64: *uv = x; break;
    default: *iv = (int64_t)x; break; /* uint8, uint16, uint32, bool */
    }
}

static int is_float_type(int t)
{
    return t == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT || t == ONNX__TENSOR_PROTO__DATA_TYPE__DOUBLE ||
           t == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16 || t == ONNX__TENSOR_PROTO__DATA_TYPE__BFLOAT16;
}

/* Convert tp into *o. ctx: "initializer 'x'" style text for messages. */
static ch_status convert_tensor(model_t *m, const char *what, const char *ctx, const Onnx__TensorProto *tp,
                                ch_onnx_tensor_t *o)
{
    memset(o, 0, sizeof *o);
    o->name = S(tp->name);
    int t = tp->has_data_type ? tp->data_type : 0;
    o->onnx_type = t;
    if ((tp->has_data_location && tp->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL) ||
        tp->n_external_data)
        return CH_ERROR(CH_ERR_UNSUPPORTED,
                        "%s: %s: external data not supported: save with all tensors inside the file", what, ctx);
    if (tp->segment)
        return CH_ERROR(CH_ERR_UNSUPPORTED, "%s: %s: segmented tensors are not supported", what, ctx);
    size_t es = elem_size(t);
    if (!es)
        return CH_ERROR(CH_ERR_UNSUPPORTED,
                        "%s: %s: element type %s (%d) not supported (expected a float or integer type)", what,
                        ctx, ch_onnx_type_name(t), t);
    if (tp->n_dims > CH_ONNX_MAX_DIMS)
        return CH_ERROR(CH_ERR_FORMAT, "%s: %s: %zu dimensions, at most %d expected", what, ctx, tp->n_dims,
                        CH_ONNX_MAX_DIMS);
    o->ndim = (int)tp->n_dims;
    size_t numel = 1;
    for (int d = 0; d < o->ndim; d++) {
        int64_t v = tp->dims[d];
        if (v < 0)
            return CH_ERROR(CH_ERR_FORMAT, "%s: %s: dimension %d is %lld, expected >= 0", what, ctx, d,
                            (long long)v);
        o->dims[d] = v;
        if (v && numel > (SIZE_MAX / 8) / (uint64_t)v)
            return CH_ERROR(CH_ERR_FORMAT, "%s: %s: element count overflows", what, ctx);
        numel *= (size_t)v;
    }
    o->numel = numel;
    int fl = is_float_type(t);
    o->dtype = fl ? CH_F32 : CH_I64;

    if (tp->has_raw_data) {
        const uint8_t *r = tp->raw_data.data;
        if (tp->raw_data.len != numel * es)
            return CH_ERROR(CH_ERR_FORMAT, "%s: %s: raw_data has %zu bytes, expected %zu (%zu %s elements)",
                            what, ctx, tp->raw_data.len, numel * es, numel, ch_onnx_type_name(t));
        if (HOST_LE && numel && ((t == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT &&
                                  (uintptr_t)r % alignof(float) == 0) ||
                                 (t == ONNX__TENSOR_PROTO__DATA_TYPE__INT64 &&
                                  (uintptr_t)r % alignof(int64_t) == 0))) {
            o->data = (void *)r; /* protobuf-c's own copy: aligned, lives with the message */
            return CH_OK;
        }
        o->data = arena_n(m, numel, 8);
        if (!o->data) return CH_ERROR(CH_ERR_NOMEM, "%s: %s", what, ctx);
        float *of = o->data;
        int64_t *oi = o->data;
        for (size_t k = 0; k < numel; k++) {
            double fv = 0;
            int64_t iv = 0;
            uint64_t uv = 0;
            raw_elem(t, r + k * es, &fv, &iv, &uv);
            if (t == ONNX__TENSOR_PROTO__DATA_TYPE__UINT64) {
                if (uv > INT64_MAX)
                    return CH_ERROR(CH_ERR_UNSUPPORTED, "%s: %s: uint64 value %llu above the int64 range",
                                    what, ctx, (unsigned long long)uv);
                iv = (int64_t)uv;
            }
            if (fl) of[k] = (float)fv;
            else oi[k] = iv;
        }
        return CH_OK;
    }

    /* typed fields: which one onnx.proto assigns to the type */
    size_t have;
    const char *field;
    switch (t) {
    case ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT: have = tp->n_float_data; field = "float_data"; break;
    case ONNX__TENSOR_PROTO__DATA_TYPE__INT64: have = tp->n_int64_data; field = "int64_data"; break;
    case ONNX__TENSOR_PROTO__DATA_TYPE__DOUBLE: have = tp->n_double_data; field = "double_data"; break;
    case ONNX__TENSOR_PROTO__DATA_TYPE__UINT32: case ONNX__TENSOR_PROTO__DATA_TYPE__UINT64:
        have = tp->n_uint64_data; field = "uint64_data"; break;
    default: have = tp->n_int32_data; field = "int32_data"; break;
    }
    if (have != numel)
        return CH_ERROR(CH_ERR_FORMAT, "%s: %s: %s has %zu values, expected %zu (the product of the dims)", what,
                        ctx, field, have, numel);
    if (!numel) {
        o->data = arena(m, 8);
        return o->data ? CH_OK : CH_ERROR(CH_ERR_NOMEM, "%s: %s", what, ctx);
    }
    if (t == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT) {
        o->data = tp->float_data;
        return CH_OK;
    }
    if (t == ONNX__TENSOR_PROTO__DATA_TYPE__INT64) {
        o->data = tp->int64_data;
        return CH_OK;
    }
    o->data = arena_n(m, numel, 8);
    if (!o->data) return CH_ERROR(CH_ERR_NOMEM, "%s: %s", what, ctx);
    float *of = o->data;
    int64_t *oi = o->data;
    for (size_t k = 0; k < numel; k++) {
        switch (t) {
        case ONNX__TENSOR_PROTO__DATA_TYPE__DOUBLE: of[k] = (float)tp->double_data[k]; break;
        case ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16: of[k] = half_to_float((uint16_t)tp->int32_data[k]); break;
        case ONNX__TENSOR_PROTO__DATA_TYPE__BFLOAT16: of[k] = bf16_to_float((uint16_t)tp->int32_data[k]); break;
        case ONNX__TENSOR_PROTO__DATA_TYPE__UINT32: case ONNX__TENSOR_PROTO__DATA_TYPE__UINT64:
            if (tp->uint64_data[k] > INT64_MAX)
                return CH_ERROR(CH_ERR_UNSUPPORTED, "%s: %s: uint64 value %llu above the int64 range", what,
                                ctx, (unsigned long long)tp->uint64_data[k]);
            oi[k] = (int64_t)tp->uint64_data[k];
            break;
        default: oi[k] = tp->int32_data[k]; break;
        }
    }
    return CH_OK;
}

/* ------------------------------------------------------------ attributes, value infos */

static char *dup_bytes(model_t *m, const ProtobufCBinaryData *b)
{
    char *s = arena(m, b->len + 1);
    if (s && b->len) memcpy(s, b->data, b->len);
    return s;
}

static ch_status convert_attr(model_t *m, const char *what, int k, const Onnx__NodeProto *np,
                              const Onnx__AttributeProto *ap, ch_onnx_attr_t *o)
{
    const char *nn = S(np->name), *op = S(np->op_type);
    o->name = S(ap->name);
    if (!o->name[0])
        return CH_ERROR(CH_ERR_FORMAT, "%s: node %d '%s' (%s): an attribute without a name", what, k, nn, op);
    if (ap->ref_attr_name && ap->ref_attr_name[0])
        return CH_ERROR(CH_ERR_FORMAT,
                        "%s: node %d '%s' (%s): attribute '%s' refers to a function attribute outside a function",
                        what, k, nn, op, o->name);
    if (!ap->has_type)
        return CH_ERROR(CH_ERR_FORMAT, "%s: node %d '%s' (%s): attribute '%s' has no type", what, k, nn, op,
                        o->name);
    o->type = (ch_onnx_attr_type_t)ap->type;
    switch ((int)ap->type) {
    case CH_ONNX_ATTR_FLOAT: o->f = ap->f; break;
    case CH_ONNX_ATTR_INT: o->i = ap->i; break;
    case CH_ONNX_ATTR_STRING:
        o->s = dup_bytes(m, &ap->s);
        if (!o->s) return CH_ERROR(CH_ERR_NOMEM, "%s", what);
        break;
    case CH_ONNX_ATTR_TENSOR: {
        if (!ap->t)
            return CH_ERROR(CH_ERR_FORMAT, "%s: node %d '%s' (%s): attribute '%s' of type TENSOR has no tensor",
                            what, k, nn, op, o->name);
        ch_onnx_tensor_t *t = arena(m, sizeof *t);
        if (!t) return CH_ERROR(CH_ERR_NOMEM, "%s", what);
        char ctx[512];
        snprintf(ctx, sizeof ctx, "node %d '%.150s' (%.100s) attribute '%.150s'", k, nn, op, o->name);
        CH_TRY(convert_tensor(m, what, ctx, ap->t, t));
        o->t = t;
        break;
    }
    case CH_ONNX_ATTR_FLOATS:
        if (ap->n_floats > INT_MAX) return CH_ERROR(CH_ERR_FORMAT, "%s: attribute '%s' too long", what, o->name);
        o->n = (int)ap->n_floats;
        if (ap->n_floats) {
            o->floats = ap->floats;
        } else {
            o->floats = arena(m, 8);
            if (!o->floats) return CH_ERROR(CH_ERR_NOMEM, "%s", what);
        }
        break;
    case CH_ONNX_ATTR_INTS:
        if (ap->n_ints > INT_MAX) return CH_ERROR(CH_ERR_FORMAT, "%s: attribute '%s' too long", what, o->name);
        o->n = (int)ap->n_ints;
        if (ap->n_ints) {
            o->ints = ap->ints;
        } else {
            o->ints = arena(m, 8);
            if (!o->ints) return CH_ERROR(CH_ERR_NOMEM, "%s", what);
        }
        break;
    case CH_ONNX_ATTR_STRINGS: {
        if (ap->n_strings > INT_MAX) return CH_ERROR(CH_ERR_FORMAT, "%s: attribute '%s' too long", what, o->name);
        o->n = (int)ap->n_strings;
        const char **v = arena_n(m, ap->n_strings + 1, sizeof *v);
        if (!v) return CH_ERROR(CH_ERR_NOMEM, "%s", what);
        for (size_t j = 0; j < ap->n_strings; j++)
            if (!(v[j] = dup_bytes(m, &ap->strings[j]))) return CH_ERROR(CH_ERR_NOMEM, "%s", what);
        o->strings = v;
        break;
    }
    default: break; /* kept with its type number and no value */
    }
    return CH_OK;
}

static ch_status convert_vi(const char *what, const char *kind, const Onnx__ValueInfoProto *vp,
                            ch_onnx_value_info_t *o)
{
    memset(o, 0, sizeof *o);
    o->name = S(vp->name);
    if (!o->name[0]) return CH_ERROR(CH_ERR_FORMAT, "%s: a graph %s without a name", what, kind);
    o->ndim = -1;
    const Onnx__TypeProto *tp = vp->type;
    if (!tp) return CH_OK; /* no type given: elem_type 0, rank unknown */
    if (tp->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE || !tp->tensor_type)
        return CH_ERROR(CH_ERR_UNSUPPORTED, "%s: graph %s '%s' is not a tensor (sequence, map, ...)", what,
                        kind, o->name);
    const Onnx__TypeProto__Tensor *tt = tp->tensor_type;
    o->elem_type = tt->has_elem_type ? tt->elem_type : 0;
    if (!tt->shape) return CH_OK;
    if (tt->shape->n_dim > CH_ONNX_MAX_DIMS)
        return CH_ERROR(CH_ERR_FORMAT, "%s: graph %s '%s' has %zu dimensions, at most %d expected", what, kind,
                        o->name, tt->shape->n_dim, CH_ONNX_MAX_DIMS);
    o->ndim = (int)tt->shape->n_dim;
    for (int d = 0; d < o->ndim; d++) {
        const Onnx__TensorShapeProto__Dimension *dm = tt->shape->dim[d];
        o->dims[d] = dm->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE && dm->dim_value >= 0
                         ? dm->dim_value
                         : -1;
    }
    return CH_OK;
}

/* ------------------------------------------------------------ model */

static int default_domain(const char *d) { return !d || !d[0] || !strcmp(d, "ai.onnx"); }

static ch_status convert(model_t *m, const char *what)
{
    const Onnx__ModelProto *mp = m->pb;
    ch_onnx_model_t *pub = &m->pub;
    const Onnx__GraphProto *g = mp->graph;
    if (!g) return CH_ERROR(CH_ERR_FORMAT, "%s: not an ONNX model (protobuf ModelProto expected): no graph", what);
    pub->ir_version = mp->has_ir_version ? mp->ir_version : 0;
    pub->producer_name = S(mp->producer_name);
    pub->producer_version = S(mp->producer_version);
    pub->graph_name = S(g->name);

    int have_opset = 0;
    for (size_t k = 0; k < mp->n_opset_import; k++) {
        const Onnx__OperatorSetIdProto *os = mp->opset_import[k];
        if (!default_domain(os->domain)) continue;
        if (have_opset && pub->opset != os->version)
            return CH_ERROR(CH_ERR_FORMAT, "%s: two opsets for the default domain (%lld and %lld)", what,
                            (long long)pub->opset, (long long)os->version);
        pub->opset = os->version;
        have_opset = 1;
    }
    if (!have_opset)
        return CH_ERROR(CH_ERR_FORMAT, "%s: no opset_import for the default domain (\"\" / ai.onnx)", what);
    if (pub->opset < CH_ONNX_OPSET_MIN || pub->opset > CH_ONNX_OPSET_MAX)
        return CH_ERROR(CH_ERR_UNSUPPORTED,
                        "%s: opset %lld of the default domain not supported (expected %d..%d: re-export with "
                        "opset_version in that range)", what, (long long)pub->opset, CH_ONNX_OPSET_MIN,
                        CH_ONNX_OPSET_MAX);

    if (g->n_node > INT_MAX / 2 || g->n_initializer > INT_MAX / 2 || g->n_input > INT_MAX / 2 ||
        g->n_output > INT_MAX / 2)
        return CH_ERROR(CH_ERR_FORMAT, "%s: graph too large", what);

    /* initializers */
    ch_onnx_tensor_t *init = arena_n(m, g->n_initializer, sizeof *init);
    if (!init || names_init(m, &m->init_names, g->n_initializer)) return CH_ERROR(CH_ERR_NOMEM, "%s", what);
    for (size_t k = 0; k < g->n_initializer; k++) {
        char ctx[256];
        const char *nm = S(g->initializer[k]->name);
        snprintf(ctx, sizeof ctx, "initializer '%.200s'", nm);
        if (!nm[0]) return CH_ERROR(CH_ERR_FORMAT, "%s: initializer %zu has no name", what, k);
        CH_TRY(convert_tensor(m, what, ctx, g->initializer[k], &init[k]));
        if (!names_put(&m->init_names, init[k].name, (int)k))
            return CH_ERROR(CH_ERR_FORMAT, "%s: initializer '%s' appears twice", what, nm);
    }
    pub->init = init;
    pub->n_init = (int)g->n_initializer;

    /* every name defined so far: graph inputs, initializers, node outputs */
    size_t n_names = g->n_input + g->n_initializer;
    for (size_t k = 0; k < g->n_node; k++) n_names += g->node[k]->n_output;
    names_t def = {0};
    if (names_init(m, &def, n_names)) return CH_ERROR(CH_ERR_NOMEM, "%s", what);
    for (size_t k = 0; k < g->n_initializer; k++) names_put(&def, init[k].name, 1);

    /* inputs (not initializers) */
    ch_onnx_value_info_t *in = arena_n(m, g->n_input, sizeof *in);
    if (!in) return CH_ERROR(CH_ERR_NOMEM, "%s", what);
    int n_in = 0;
    names_t seen_in = {0};
    if (names_init(m, &seen_in, g->n_input)) return CH_ERROR(CH_ERR_NOMEM, "%s", what);
    for (size_t k = 0; k < g->n_input; k++) {
        ch_onnx_value_info_t vi;
        CH_TRY(convert_vi(what, "input", g->input[k], &vi));
        if (!names_put(&seen_in, vi.name, 1))
            return CH_ERROR(CH_ERR_FORMAT, "%s: graph input '%s' appears twice", what, vi.name);
        if (names_get(&m->init_names, vi.name) >= 0) continue; /* a weight listed as input */
        if (vi.elem_type != ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT)
            return CH_ERROR(CH_ERR_UNSUPPORTED, "%s: graph input '%s' has element type %s (%d), expected float",
                            what, vi.name, ch_onnx_type_name(vi.elem_type), vi.elem_type);
        names_put(&def, vi.name, 1);
        in[n_in++] = vi;
    }
    pub->inputs = in;
    pub->n_inputs = n_in;

    /* nodes, in order: inputs defined before, outputs new */
    ch_onnx_node_t *nodes = arena_n(m, g->n_node, sizeof *nodes);
    if (!nodes) return CH_ERROR(CH_ERR_NOMEM, "%s", what);
    for (size_t k = 0; k < g->n_node; k++) {
        const Onnx__NodeProto *np = g->node[k];
        ch_onnx_node_t *n = &nodes[k];
        n->name = S(np->name);
        n->op_type = S(np->op_type);
        n->domain = default_domain(np->domain) ? "" : np->domain;
        if (!n->op_type[0]) return CH_ERROR(CH_ERR_FORMAT, "%s: node %zu '%s' has no op_type", what, k, n->name);
        if (np->n_input > INT_MAX / 2 || np->n_output > INT_MAX / 2 || np->n_attribute > INT_MAX / 2)
            return CH_ERROR(CH_ERR_FORMAT, "%s: node %zu '%s' (%s) too large", what, k, n->name, n->op_type);
        static const char *const none[1] = {""};
        n->n_in = (int)np->n_input;
        n->n_out = (int)np->n_output;
        n->in = np->n_input ? (const char *const *)np->input : none;
        n->out = np->n_output ? (const char *const *)np->output : none;
        for (size_t j = 0; j < np->n_input; j++) {
            const char *v = np->input[j];
            if (v[0] && names_get(&def, v) < 0)
                return CH_ERROR(CH_ERR_FORMAT,
                                "%s: node %zu '%s' (%s) input %zu '%s': missing initializer or input (not a graph "
                                "input, an initializer nor an output of an earlier node)",
                                what, k, n->name, n->op_type, j, v);
        }
        for (size_t j = 0; j < np->n_output; j++) {
            const char *v = np->output[j];
            if (v[0] && !names_put(&def, v, 1))
                return CH_ERROR(CH_ERR_FORMAT,
                                "%s: node %zu '%s' (%s) output '%s': duplicate output name (already an input, "
                                "initializer or earlier output)", what, k, n->name, n->op_type, v);
        }
        ch_onnx_attr_t *at = arena_n(m, np->n_attribute, sizeof *at);
        if (!at) return CH_ERROR(CH_ERR_NOMEM, "%s", what);
        for (size_t j = 0; j < np->n_attribute; j++) {
            CH_TRY(convert_attr(m, what, (int)k, np, np->attribute[j], &at[j]));
            for (size_t i = 0; i < j; i++)
                if (!strcmp(at[i].name, at[j].name))
                    return CH_ERROR(CH_ERR_FORMAT, "%s: node %zu '%s' (%s): attribute '%s' appears twice", what,
                                    k, n->name, n->op_type, at[j].name);
        }
        n->attr = at;
        n->n_attr = (int)np->n_attribute;
    }
    pub->nodes = nodes;
    pub->n_nodes = (int)g->n_node;

    /* outputs */
    if (!g->n_output) return CH_ERROR(CH_ERR_FORMAT, "%s: the graph has no output (at least one expected)", what);
    ch_onnx_value_info_t *outv = arena_n(m, g->n_output, sizeof *outv);
    if (!outv) return CH_ERROR(CH_ERR_NOMEM, "%s", what);
    for (size_t k = 0; k < g->n_output; k++) {
        CH_TRY(convert_vi(what, "output", g->output[k], &outv[k]));
        if (names_get(&def, outv[k].name) < 0)
            return CH_ERROR(CH_ERR_FORMAT, "%s: graph output '%s' is produced by no node, input or initializer",
                            what, outv[k].name);
    }
    pub->outputs = outv;
    pub->n_outputs = (int)g->n_output;
    return CH_OK;
}

void ch_onnx_free(ch_onnx_model_t *pm)
{
    if (!pm) return;
    model_t *m = (model_t *)pm;
    if (m->pb) protobuf_c_message_free_unpacked(&m->pb->base, NULL);
    for (blk_t *b = m->blocks, *nx; b; b = nx) {
        nx = b->next;
        free(b);
    }
    free(m);
}

ch_status ch_onnx_parse(const void *buf, size_t len, const char *what, ch_onnx_model_t **out)
{
    *out = NULL;
    if (!what) what = "<memory>";
    if (!buf && len) return CH_ERROR(CH_ERR_INVALID, "%s: NULL buffer", what);
    if (!len) return CH_ERROR(CH_ERR_FORMAT, "%s: empty file: not an ONNX model (protobuf ModelProto expected)", what);
    CH_TRY(wire_scan(buf, len, what));
    model_t *m = calloc(1, sizeof *m);
    if (!m) return CH_ERROR(CH_ERR_NOMEM, "%s", what);
    m->pb = onnx__model_proto__unpack(NULL, len, buf);
    if (!m->pb) {
        free(m);
        return CH_ERROR(CH_ERR_FORMAT, "%s: not an ONNX model (protobuf ModelProto expected)", what);
    }
    ch_status s = convert(m, what);
    if (s != CH_OK) {
        ch_onnx_free(&m->pub);
        return s;
    }
    *out = &m->pub;
    return CH_OK;
}

ch_status ch_onnx_load(const char *path, ch_onnx_model_t **out)
{
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return CH_ERROR(CH_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) || !S_ISREG(sb.st_mode)) {
        close(fd);
        return CH_ERROR(CH_ERR_IO, "'%s' is not a regular file", path);
    }
    size_t size = (size_t)sb.st_size;
    if (!size) {
        close(fd);
        return ch_onnx_parse("", 0, path, out);
    }
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    unsigned char *copy = NULL;
    if (map == MAP_FAILED) { /* no mmap: read it */
        size_t got = 0;
        copy = malloc(size);
        while (copy && got < size) {
            ssize_t r = pread(fd, copy + got, size - got, (off_t)got);
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) break;
            got += (size_t)r;
        }
        if (!copy || got != size) {
            close(fd);
            free(copy);
            return copy ? CH_ERROR(CH_ERR_IO, "reading '%s' failed", path)
                        : CH_ERROR(CH_ERR_NOMEM, "reading '%s'", path);
        }
    } else {
        (void)madvise(map, size, MADV_SEQUENTIAL);
    }
    close(fd);
    ch_status s = ch_onnx_parse(copy ? (const void *)copy : map, size, path, out);
    if (copy) free(copy);
    else munmap(map, size);
    return s;
}

const ch_onnx_tensor_t *ch_onnx_find_init(const ch_onnx_model_t *pm, const char *name)
{
    if (!pm || !name) return NULL;
    const model_t *m = (const model_t *)pm;
    int k = names_get(&m->init_names, name);
    return k >= 0 ? &pm->init[k] : NULL;
}

const ch_onnx_attr_t *ch_onnx_node_attr(const ch_onnx_node_t *n, const char *name)
{
    if (!n || !name) return NULL;
    for (int k = 0; k < n->n_attr; k++)
        if (!strcmp(n->attr[k].name, name)) return &n->attr[k];
    return NULL;
}
