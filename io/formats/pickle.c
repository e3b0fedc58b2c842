/* cohort: a restricted unpickler (see pickle.h). */
#include "config.h"

#include "io/formats/pickle.h"

#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ arena */

typedef struct chunk {
    struct chunk *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
} chunk_t;

struct ch_pk {
    char *label;
    ch_pk_limits_t lim;
    chunk_t *chunks;
    size_t bytes;
    /* per load */
    ch_pk_value_t **stack;
    size_t sp, stack_cap;
    ch_pk_value_t **memo;
    size_t memo_cap;
    ch_pk_value_t **persids; /* every BINPERSID value, in file order (all loads) */
    size_t npersid, persid_cap;
    ch_pk_value_t none_v, true_v, false_v, mark_v;
};

#define CHUNK_SIZE ((size_t)64 << 10)

void ch_pk_limits_default(ch_pk_limits_t *l)
{
    l->max_ops = (uint64_t)64 << 20;
    l->max_stack = (size_t)1 << 20;
    l->max_memo = (size_t)1 << 20;
    l->max_bytes = (size_t)1 << 30;
}

static void *arena_alloc(ch_pk_t *p, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    if (n > p->lim.max_bytes || p->bytes > p->lim.max_bytes - n) return NULL;
    chunk_t *c = p->chunks;
    if (!c || c->cap - c->used < n) {
        size_t cap = n > CHUNK_SIZE / 4 ? n : CHUNK_SIZE;
        c = malloc(sizeof *c + cap);
        if (!c) return NULL;
        c->cap = cap;
        c->used = 0;
        if (n > CHUNK_SIZE / 4 && p->chunks) { /* a big block: keep the current chunk first */
            c->next = p->chunks->next;
            p->chunks->next = c;
        } else {
            c->next = p->chunks;
            p->chunks = c;
        }
    }
    void *r = c->data + c->used;
    c->used += n;
    p->bytes += n;
    memset(r, 0, n);
    return r;
}

ch_status ch_pk_create(const char *label, const ch_pk_limits_t *l, ch_pk_t **out)
{
    *out = NULL;
    ch_pk_t *p = calloc(1, sizeof *p);
    if (!p || !(p->label = strdup(label ? label : "<pickle>"))) {
        free(p);
        return CH_ERROR(CH_ERR_NOMEM, "unpickler for %s", label ? label : "<pickle>");
    }
    if (l) p->lim = *l;
    else ch_pk_limits_default(&p->lim);
    p->none_v.kind = CH_PK_NONE;
    p->true_v.kind = p->false_v.kind = CH_PK_BOOL;
    p->true_v.i = 1;
    p->mark_v.kind = CH_PK_MARK;
    *out = p;
    return CH_OK;
}

void ch_pk_destroy(ch_pk_t *p)
{
    if (!p) return;
    for (chunk_t *c = p->chunks, *n; c; c = n) {
        n = c->next;
        free(c);
    }
    free(p->stack);
    free(p->memo);
    free(p->persids);
    free(p->label);
    free(p);
}

/* ------------------------------------------------------------ names */

static const struct {
    const char *module, *name;
} allow[CH_PK_G_COUNT] = {
    {"collections", "OrderedDict"},   {"torch._utils", "_rebuild_tensor_v2"},
    {"torch._utils", "_rebuild_parameter"}, {"torch", "FloatStorage"},
    {"torch", "HalfStorage"},         {"torch", "BFloat16Storage"},
    {"torch", "DoubleStorage"},       {"torch", "LongStorage"},
    {"torch", "IntStorage"},          {"torch", "ShortStorage"},
    {"torch", "CharStorage"},         {"torch", "ByteStorage"},
    {"torch", "BoolStorage"},
};

const char *ch_pk_global_name(ch_pk_global_t g)
{
    static const char *const full[CH_PK_G_COUNT] = {
        "collections.OrderedDict", "torch._utils._rebuild_tensor_v2",
        "torch._utils._rebuild_parameter", "torch.FloatStorage", "torch.HalfStorage",
        "torch.BFloat16Storage", "torch.DoubleStorage", "torch.LongStorage", "torch.IntStorage",
        "torch.ShortStorage", "torch.CharStorage", "torch.ByteStorage", "torch.BoolStorage"};
    return (unsigned)g < CH_PK_G_COUNT ? full[g] : "?";
}

const char *ch_pk_kind_name(ch_pk_kind_t k)
{
    static const char *const n[] = {"None", "bool", "int", "int", "float", "str", "bytes",
                                    "tuple", "list", "dict", "global", "call", "persistent id",
                                    "mark"};
    return (unsigned)k <= CH_PK_MARK ? n[k] : "?";
}

static const char *opname(unsigned char op)
{
    switch (op) {
    case 'i': return "INST";
    case 'o': return "OBJ";
    case 0x81: return "NEWOBJ";
    case 0x92: return "NEWOBJ_EX";
    case 0x82: case 0x83: case 0x84: return "EXT";
    case 'P': return "PERSID";
    case '2': return "DUP";
    case '0': return "POP";
    case '1': return "POP_MARK";
    case 'I': return "INT";
    case 'L': return "LONG";
    case 'F': return "FLOAT";
    case 'S': return "STRING";
    case 'V': return "UNICODE";
    case 'p': return "PUT";
    case 'g': return "GET";
    case 'l': return "LIST";
    case 'd': return "DICT";
    case 0x8b: return "LONG4";
    case 0x8f: return "EMPTY_SET";
    case 0x90: return "ADDITEMS";
    case 0x91: return "FROZENSET";
    case 0x96: return "BYTEARRAY8";
    case 0x97: return "NEXT_BUFFER";
    case 0x98: return "READONLY_BUFFER";
    default: return "unknown";
    }
}

/* A global outside the allowlist: a whole pickled model gets its own hint. */
static ch_status refuse_global(ch_pk_t *p, size_t at, const char *mod, size_t ml, const char *name,
                               size_t nl)
{
    int model = (ml >= 8 && !strncmp(mod, "torch.nn", 8)) ||
                (ml >= 17 && !strncmp(mod, "torchvision.models", 17)) ||
                (ml == 8 && !strncmp(mod, "__main__", 8));
    if (model)
        return CH_ERROR(CH_ERR_FORMAT,
                        "%s: byte %zu: the file holds a whole pickled model (global %.*s.%.*s), "
                        "not a state dict: save model.state_dict() instead (torch.save(model."
                        "state_dict(), path)); cohort runs no code from a file",
                        p->label, at, (int)(ml > 200 ? 200 : ml), mod, (int)(nl > 200 ? 200 : nl),
                        name);
    return CH_ERROR(CH_ERR_FORMAT,
                    "%s: byte %zu: refused global %.*s.%.*s: only the globals of a state dict "
                    "(collections.OrderedDict, torch._utils._rebuild_tensor_v2 and "
                    "_rebuild_parameter, torch.*Storage) are allowed, as torch.load(weights_only="
                    "True); nothing from the file is executed",
                    p->label, at, (int)(ml > 200 ? 200 : ml), mod, (int)(nl > 200 ? 200 : nl), name);
}

static ch_status lookup_global(ch_pk_t *p, size_t at, const char *mod, size_t ml,
                               const char *name, size_t nl, ch_pk_global_t *g)
{
    for (int k = 0; k < CH_PK_G_COUNT; k++)
        if (strlen(allow[k].module) == ml && !memcmp(allow[k].module, mod, ml) &&
            strlen(allow[k].name) == nl && !memcmp(allow[k].name, name, nl)) {
            *g = (ch_pk_global_t)k;
            return CH_OK;
        }
    return refuse_global(p, at, mod, ml, name, nl);
}

/* ------------------------------------------------------------ values */

static ch_pk_value_t *new_value(ch_pk_t *p, ch_pk_kind_t k)
{
    ch_pk_value_t *v = arena_alloc(p, sizeof *v);
    if (v) v->kind = k;
    return v;
}

static ch_pk_value_t *new_bytes(ch_pk_t *p, ch_pk_kind_t k, const unsigned char *s, size_t n)
{
    ch_pk_value_t *v = new_value(p, k);
    if (!v || n == SIZE_MAX) return NULL;
    char *c = arena_alloc(p, n + 1);
    if (!c) return NULL;
    memcpy(c, s, n);
    v->s = c;
    v->len = n;
    return v;
}

/* Append m pointers to v's items (doubling growth inside the arena). */
static int push_items(ch_pk_t *p, ch_pk_value_t *v, ch_pk_value_t *const *src, size_t m)
{
    size_t have = v->kind == CH_PK_DICT ? 2 * v->n : v->n;
    if (!m) return 0;
    if (m > SIZE_MAX / 2 - have) return -1;
    if (have + m > v->cap) {
        size_t cap = v->cap ? v->cap : 8;
        while (cap < have + m) cap *= 2;
        if (cap > SIZE_MAX / sizeof *v->items) return -1;
        ch_pk_value_t **it = arena_alloc(p, cap * sizeof *it);
        if (!it) return -1;
        if (have) memcpy(it, v->items, have * sizeof *it);
        v->items = it;
        v->cap = cap;
    }
    memcpy(v->items + have, src, m * sizeof *src);
    v->n += v->kind == CH_PK_DICT ? m / 2 : m;
    return 0;
}

size_t ch_pk_persids(const ch_pk_t *p, ch_pk_value_t *const **out)
{
    *out = p->persids;
    return p->npersid;
}

const ch_pk_value_t *ch_pk_dict_get(const ch_pk_value_t *d, const char *key)
{
    if (!d || d->kind != CH_PK_DICT) return NULL;
    size_t kl = strlen(key);
    for (size_t k = d->n; k-- > 0;) {
        const ch_pk_value_t *kv = d->items[2 * k];
        if (kv->kind == CH_PK_STR && kv->len == kl && !memcmp(kv->s, key, kl))
            return d->items[2 * k + 1];
    }
    return NULL;
}

/* ------------------------------------------------------------ the machine */

#define FAIL(code, ...) return CH_ERROR(code, __VA_ARGS__)

static ch_status push(ch_pk_t *p, ch_pk_value_t *v, size_t at)
{
    if (!v) FAIL(CH_ERR_RANGE, "%s: byte %zu: values exceed the limit of %zu bytes", p->label, at,
                 p->lim.max_bytes);
    if (p->sp >= p->lim.max_stack)
        FAIL(CH_ERR_RANGE, "%s: byte %zu: stack deeper than the limit of %zu", p->label, at,
             p->lim.max_stack);
    if (p->sp == p->stack_cap) {
        size_t cap = p->stack_cap ? 2 * p->stack_cap : 256;
        if (cap > p->lim.max_stack) cap = p->lim.max_stack;
        ch_pk_value_t **s = realloc(p->stack, cap * sizeof *s);
        if (!s) FAIL(CH_ERR_NOMEM, "%s: unpickler stack", p->label);
        p->stack = s;
        p->stack_cap = cap;
    }
    p->stack[p->sp++] = v;
    return CH_OK;
}

/* Index of the topmost mark. */
static ch_status find_mark(ch_pk_t *p, size_t at, const char *op, size_t *m)
{
    for (size_t k = p->sp; k-- > 0;)
        if (p->stack[k]->kind == CH_PK_MARK) {
            *m = k;
            return CH_OK;
        }
    FAIL(CH_ERR_FORMAT, "%s: byte %zu: %s without a MARK", p->label, at, op);
}

static ch_status memo_put(ch_pk_t *p, size_t idx, size_t at)
{
    if (!p->sp || p->stack[p->sp - 1]->kind == CH_PK_MARK)
        FAIL(CH_ERR_FORMAT, "%s: byte %zu: memo put of %s", p->label, at,
             p->sp ? "a MARK" : "an empty stack");
    if (idx >= p->lim.max_memo)
        FAIL(CH_ERR_RANGE, "%s: byte %zu: memo index %zu exceeds the limit of %zu", p->label, at,
             idx, p->lim.max_memo);
    if (idx >= p->memo_cap) {
        size_t cap = p->memo_cap ? p->memo_cap : 256;
        while (cap <= idx) cap *= 2;
        if (cap > p->lim.max_memo) cap = p->lim.max_memo;
        ch_pk_value_t **m = realloc(p->memo, cap * sizeof *m);
        if (!m) FAIL(CH_ERR_NOMEM, "%s: unpickler memo", p->label);
        memset(m + p->memo_cap, 0, (cap - p->memo_cap) * sizeof *m);
        p->memo = m;
        p->memo_cap = cap;
    }
    p->memo[idx] = p->stack[p->sp - 1];
    return CH_OK;
}

static uint64_t le(const unsigned char *b, int n)
{
    uint64_t v = 0;
    for (int k = n; k-- > 0;) v = v << 8 | b[k];
    return v;
}

ch_status ch_pk_load(ch_pk_t *p, const void *buf, size_t size, size_t base_offset,
                     ch_pk_value_t **root, size_t *consumed)
{
    const unsigned char *b = buf;
    size_t pos = 0, memo_next = 0;
    uint64_t ops = 0;
    p->sp = 0;
    if (p->memo) memset(p->memo, 0, p->memo_cap * sizeof *p->memo);
    *root = NULL;
#define NEED(n)                                                                           \
    do {                                                                                  \
        if (size - pos < (size_t)(n))                                                     \
            FAIL(CH_ERR_FORMAT, "%s: byte %zu: pickle truncated (opcode 0x%02x needs %zu more " \
                 "bytes)", p->label, at, op, (size_t)(n));                                \
    } while (0)
#define POP(v)                                                                            \
    do {                                                                                  \
        if (p->sp <= 0 || p->stack[p->sp - 1]->kind == CH_PK_MARK)                        \
            FAIL(CH_ERR_FORMAT, "%s: byte %zu: opcode 0x%02x pops an empty stack", p->label, \
                 at, op);                                                                 \
        (v) = p->stack[--p->sp];                                                          \
    } while (0)
    for (;;) {
        size_t at = base_offset + pos;
        if (pos >= size)
            FAIL(CH_ERR_FORMAT, "%s: byte %zu: pickle ends without STOP", p->label, at);
        unsigned char op = b[pos++];
        if (++ops > p->lim.max_ops)
            FAIL(CH_ERR_RANGE, "%s: byte %zu: more than %llu opcodes", p->label, at,
                 (unsigned long long)p->lim.max_ops);
        ch_pk_value_t *v = NULL, *x = NULL, *y = NULL;
        size_t m = 0, n = 0;
        switch (op) {
        case 0x80: /* PROTO */
            NEED(1);
            if (b[pos] < 2 || b[pos] > 5)
                FAIL(CH_ERR_FORMAT, "%s: byte %zu: pickle protocol %d (2 to 5 are read)", p->label,
                     at, b[pos]);
            pos++;
            break;
        case 0x95: /* FRAME: a length hint only */
            NEED(8);
            pos += 8;
            break;
        case '.': /* STOP */
            POP(v);
            if (p->sp)
                FAIL(CH_ERR_FORMAT, "%s: byte %zu: STOP with %zu values left on the stack",
                     p->label, at, p->sp);
            *root = v;
            if (consumed) *consumed = pos;
            return CH_OK;
        case '(': CH_TRY(push(p, &p->mark_v, at)); break;
        case '}': CH_TRY(push(p, new_value(p, CH_PK_DICT), at)); break;
        case ']': CH_TRY(push(p, new_value(p, CH_PK_LIST), at)); break;
        case ')': CH_TRY(push(p, new_value(p, CH_PK_TUPLE), at)); break;
        case 'N': CH_TRY(push(p, &p->none_v, at)); break;
        case 0x88: CH_TRY(push(p, &p->true_v, at)); break;
        case 0x89: CH_TRY(push(p, &p->false_v, at)); break;
        case 't': /* TUPLE */
            CH_TRY(find_mark(p, at, "TUPLE", &m));
            v = new_value(p, CH_PK_TUPLE);
            if (v && push_items(p, v, p->stack + m + 1, p->sp - m - 1)) v = NULL;
            p->sp = m;
            CH_TRY(push(p, v, at));
            break;
        case 0x85: case 0x86: case 0x87: /* TUPLE1..3 */
            n = (size_t)(op - 0x84);
            if (p->sp < n)
                FAIL(CH_ERR_FORMAT, "%s: byte %zu: TUPLE%zu with %zu values on the stack",
                     p->label, at, n, p->sp);
            for (size_t k = p->sp - n; k < p->sp; k++)
                if (p->stack[k]->kind == CH_PK_MARK)
                    FAIL(CH_ERR_FORMAT, "%s: byte %zu: TUPLE%zu over a MARK", p->label, at, n);
            v = new_value(p, CH_PK_TUPLE);
            if (v && push_items(p, v, p->stack + p->sp - n, n)) v = NULL;
            p->sp -= n;
            CH_TRY(push(p, v, at));
            break;
        case 'a': /* APPEND */
            POP(x);
            if (!p->sp || p->stack[p->sp - 1]->kind != CH_PK_LIST)
                FAIL(CH_ERR_FORMAT, "%s: byte %zu: APPEND to a %s (only lists)", p->label, at,
                     p->sp ? ch_pk_kind_name(p->stack[p->sp - 1]->kind) : "empty stack");
            if (push_items(p, p->stack[p->sp - 1], &x, 1)) CH_TRY(push(p, NULL, at));
            break;
        case 'e': /* APPENDS */
            CH_TRY(find_mark(p, at, "APPENDS", &m));
            if (m == 0 || p->stack[m - 1]->kind != CH_PK_LIST)
                FAIL(CH_ERR_FORMAT, "%s: byte %zu: APPENDS to a %s (only lists)", p->label, at,
                     m ? ch_pk_kind_name(p->stack[m - 1]->kind) : "empty stack");
            if (push_items(p, p->stack[m - 1], p->stack + m + 1, p->sp - m - 1))
                CH_TRY(push(p, NULL, at));
            p->sp = m;
            break;
        case 's': /* SETITEM */
            POP(y);
            POP(x);
            if (!p->sp || p->stack[p->sp - 1]->kind != CH_PK_DICT)
                FAIL(CH_ERR_FORMAT, "%s: byte %zu: SETITEM on a %s (only dicts)", p->label, at,
                     p->sp ? ch_pk_kind_name(p->stack[p->sp - 1]->kind) : "empty stack");
            {
                ch_pk_value_t *kv[2] = {x, y};
                if (push_items(p, p->stack[p->sp - 1], kv, 2)) CH_TRY(push(p, NULL, at));
            }
            break;
        case 'u': /* SETITEMS */
            CH_TRY(find_mark(p, at, "SETITEMS", &m));
            if (m == 0 || p->stack[m - 1]->kind != CH_PK_DICT)
                FAIL(CH_ERR_FORMAT, "%s: byte %zu: SETITEMS on a %s (only dicts)", p->label, at,
                     m ? ch_pk_kind_name(p->stack[m - 1]->kind) : "empty stack");
            if ((p->sp - m - 1) % 2)
                FAIL(CH_ERR_FORMAT, "%s: byte %zu: SETITEMS with an odd number of values",
                     p->label, at);
            if (push_items(p, p->stack[m - 1], p->stack + m + 1, p->sp - m - 1))
                CH_TRY(push(p, NULL, at));
            p->sp = m;
            break;
        case 'q': NEED(1); CH_TRY(memo_put(p, b[pos], at)); pos += 1; break;        /* BINPUT */
        case 'r': NEED(4); CH_TRY(memo_put(p, (size_t)le(b + pos, 4), at)); pos += 4; break;
        case 0x94: CH_TRY(memo_put(p, memo_next++, at)); break; /* MEMOIZE */
        case 'h': case 'j': /* BINGET, LONG_BINGET */
            n = op == 'h' ? 1 : 4;
            NEED(n);
            m = (size_t)le(b + pos, (int)n);
            pos += n;
            if (m >= p->memo_cap || !p->memo[m])
                FAIL(CH_ERR_FORMAT, "%s: byte %zu: memo entry %zu was never stored", p->label,
                     at, m);
            CH_TRY(push(p, p->memo[m], at));
            break;
        case 'K': case 'M': case 'J': /* BININT1, BININT2, BININT */
            n = op == 'K' ? 1 : op == 'M' ? 2 : 4;
            NEED(n);
            v = new_value(p, CH_PK_INT);
            if (v) v->i = op == 'J' ? (int64_t)(int32_t)(uint32_t)le(b + pos, 4)
                                    : (int64_t)le(b + pos, (int)n);
            pos += n;
            CH_TRY(push(p, v, at));
            break;
        case 0x8a: /* LONG1 */
            NEED(1);
            n = b[pos++];
            NEED(n);
            if (n <= 8) {
                v = new_value(p, CH_PK_INT);
                if (v && n) {
                    uint64_t u = le(b + pos, (int)n);
                    if (n < 8 && (b[pos + n - 1] & 0x80)) u |= ~(uint64_t)0 << (8 * n);
                    v->i = (int64_t)u;
                }
            } else {
                v = new_bytes(p, CH_PK_BIGINT, b + pos, n);
            }
            pos += n;
            CH_TRY(push(p, v, at));
            break;
        case 'G': /* BINFLOAT: big-endian double */
            NEED(8);
            v = new_value(p, CH_PK_FLOAT);
            if (v) {
                uint64_t u = 0;
                for (int k = 0; k < 8; k++) u = u << 8 | b[pos + k];
                memcpy(&v->f, &u, sizeof u);
            }
            pos += 8;
            CH_TRY(push(p, v, at));
            break;
        case 'X': case 0x8c: case 0x8d: /* BINUNICODE, SHORT_BINUNICODE, BINUNICODE8 */
        case 'T': case 'U': /* BINSTRING, SHORT_BINSTRING (protocol 2's str of Python 2) */
        case 'B': case 'C': case 0x8e: /* BINBYTES, SHORT_BINBYTES, BINBYTES8 */
            n = (op == 0x8c || op == 'U' || op == 'C') ? 1 : (op == 0x8d || op == 0x8e) ? 8 : 4;
            NEED(n);
            {
                uint64_t len = le(b + pos, (int)n);
                pos += n;
                if (op == 'T' && (len >> 31))
                    FAIL(CH_ERR_FORMAT, "%s: byte %zu: BINSTRING with negative length", p->label, at);
                NEED(len);
                v = new_bytes(p, (op == 'B' || op == 'C' || op == 0x8e) ? CH_PK_BYTES : CH_PK_STR,
                              b + pos, (size_t)len);
                pos += (size_t)len;
            }
            CH_TRY(push(p, v, at));
            break;
        case 'c': { /* GLOBAL "module\nname\n" */
            const unsigned char *e1 = memchr(b + pos, '\n', size - pos);
            const unsigned char *e2 = e1 ? memchr(e1 + 1, '\n', size - (size_t)(e1 + 1 - b)) : NULL;
            if (!e2) FAIL(CH_ERR_FORMAT, "%s: byte %zu: GLOBAL without two lines", p->label, at);
            ch_pk_global_t g;
            CH_TRY(lookup_global(p, at, (const char *)b + pos, (size_t)(e1 - (b + pos)),
                                 (const char *)e1 + 1, (size_t)(e2 - e1 - 1), &g));
            pos = (size_t)(e2 + 1 - b);
            v = new_value(p, CH_PK_GLOBAL);
            if (v) v->i = g;
            CH_TRY(push(p, v, at));
            break;
        }
        case 0x93: /* STACK_GLOBAL */
            POP(y);
            POP(x);
            if (x->kind != CH_PK_STR || y->kind != CH_PK_STR)
                FAIL(CH_ERR_FORMAT, "%s: byte %zu: STACK_GLOBAL of a %s and a %s (two strs)",
                     p->label, at, ch_pk_kind_name(x->kind), ch_pk_kind_name(y->kind));
            {
                ch_pk_global_t g;
                CH_TRY(lookup_global(p, at, x->s, x->len, y->s, y->len, &g));
                v = new_value(p, CH_PK_GLOBAL);
                if (v) v->i = g;
            }
            CH_TRY(push(p, v, at));
            break;
        case 'R': /* REDUCE */
            POP(y);
            POP(x);
            if (x->kind != CH_PK_GLOBAL || y->kind != CH_PK_TUPLE)
                FAIL(CH_ERR_FORMAT, "%s: byte %zu: REDUCE of a %s with a %s (an allowed global "
                     "and a tuple)", p->label, at, ch_pk_kind_name(x->kind),
                     ch_pk_kind_name(y->kind));
            if (x->i == CH_PK_G_ORDERED_DICT) {
                if (y->n)
                    FAIL(CH_ERR_FORMAT, "%s: byte %zu: OrderedDict called with %zu arguments "
                         "(state dicts use OrderedDict())", p->label, at, y->n);
                v = new_value(p, CH_PK_DICT);
            } else if (x->i == CH_PK_G_REBUILD_TENSOR_V2 || x->i == CH_PK_G_REBUILD_PARAMETER) {
                v = new_value(p, CH_PK_CALL);
                if (v) {
                    v->a = x;
                    v->b = y;
                }
            } else {
                FAIL(CH_ERR_FORMAT, "%s: byte %zu: REDUCE calls %s (not a function)", p->label, at,
                     ch_pk_global_name((ch_pk_global_t)x->i));
            }
            CH_TRY(push(p, v, at));
            break;
        case 'b': /* BUILD */
            POP(y);
            if (!p->sp) FAIL(CH_ERR_FORMAT, "%s: byte %zu: BUILD on an empty stack", p->label, at);
            x = p->stack[p->sp - 1];
            if (x->kind == CH_PK_DICT && y->kind == CH_PK_DICT) x->state = y;
            else if (x->kind != CH_PK_CALL)
                FAIL(CH_ERR_FORMAT, "%s: byte %zu: BUILD on a %s with a %s state (only a dict's "
                     "attributes, e.g. _metadata)", p->label, at, ch_pk_kind_name(x->kind),
                     ch_pk_kind_name(y->kind));
            break;
        case 'Q': /* BINPERSID */
            POP(x);
            v = new_value(p, CH_PK_PERSID);
            if (v) v->a = x;
            if (v && p->npersid == p->persid_cap) {
                size_t cap = p->persid_cap ? 2 * p->persid_cap : 64;
                ch_pk_value_t **q = realloc(p->persids, cap * sizeof *q);
                if (!q) FAIL(CH_ERR_NOMEM, "%s: unpickler persistent ids", p->label);
                p->persids = q;
                p->persid_cap = cap;
            }
            if (v) p->persids[p->npersid++] = v;
            CH_TRY(push(p, v, at));
            break;
        default:
            FAIL(CH_ERR_FORMAT, "%s: byte %zu: opcode %s (0x%02x) is not one a state dict uses; "
                 "refused", p->label, at, opname(op), op);
        }
    }
#undef NEED
#undef POP
}
