/* cohort: a restricted Python unpickler for PyTorch state dicts.
 *
 * It reads the pickles torch.save writes (pickle protocol 2, the default of
 * torch.save; 4 and 5 also accepted) into a tree of inert values and NEVER
 * calls anything: a global is only a name checked against a fixed
 * allowlist, a REDUCE only records "call F with ARGS" for the pth layer to
 * interpret (io/formats/pth.c). This is the semantics of PyTorch's own
 * `torch.load(weights_only=True)` (torch/_weights_only_unpickler.py), with
 * a shorter allowlist:
 *
 *   collections.OrderedDict                (state dicts, backward hooks)
 *   torch._utils._rebuild_tensor_v2       (every tensor)
 *   torch._utils._rebuild_parameter       (an nn.Parameter around a tensor)
 *   torch.{Float,Half,BFloat16,Double,Long,Int,Short,Char,Byte,Bool}Storage
 *
 * Any other global (os.system, builtins.eval, a pickled nn.Module class...)
 * is refused BY NAME when the GLOBAL / STACK_GLOBAL opcode is read, before
 * anything else happens; nothing is imported or executed.
 *
 * Opcodes (Python's Lib/pickletools.py names). What torch.save writes for a
 * state dict or a checkpoint dict: PROTO STOP MARK EMPTY_DICT EMPTY_LIST
 * EMPTY_TUPLE TUPLE TUPLE1 TUPLE2 TUPLE3 APPEND APPENDS SETITEM SETITEMS
 * BINPUT LONG_BINPUT BINGET LONG_BINGET BININT BININT1 BININT2 LONG1 NONE
 * NEWTRUE NEWFALSE BINFLOAT BINUNICODE SHORT_BINSTRING BINSTRING GLOBAL
 * REDUCE BUILD BINPERSID; protocol 4/5 framing and naming: FRAME MEMOIZE
 * SHORT_BINUNICODE BINUNICODE8 STACK_GLOBAL SHORT_BINBYTES BINBYTES. Every
 * other opcode (INST, OBJ, NEWOBJ, NEWOBJ_EX, EXT*, PERSID text, the text
 * protocol-0 opcodes, DUP, POP, ...) is refused with its name.
 *
 * Rules beyond the opcodes:
 *  - SETITEM/SETITEMS only on a dict, APPEND/APPENDS only on a list;
 *  - REDUCE only of an allowlisted global; OrderedDict() with no
 *    arguments yields an empty dict (so SETITEMS can fill it); any other
 *    call is kept as a CH_PK_CALL node;
 *  - BUILD only on a dict with a dict state (the state dict's `_metadata`
 *    attribute) or on a CALL (ignored there: torch's tensor state);
 *  - bounded: opcodes executed, stack depth, memo index and the bytes
 *    allocated for values (ch_pk_limits_t); a limit reached is an error
 *    naming the limit, never an unbounded allocation;
 *  - the value graph may contain cycles (memo references); walkers must
 *    bound their depth. All values live in one arena freed at once.
 * Errors name the label, the byte offset of the opcode and the opcode.
 */
#ifndef COHORT_IO_PICKLE_H
#define COHORT_IO_PICKLE_H

#include "framework/core/status.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    CH_PK_NONE,
    CH_PK_BOOL,   /* i: 0 / 1 */
    CH_PK_INT,    /* i: fits in int64 */
    CH_PK_BIGINT, /* s/len: LONG1 little-endian two's complement bytes (> 8 bytes) */
    CH_PK_FLOAT,  /* f */
    CH_PK_STR,    /* s/len: UTF-8 (NUL-terminated copy) */
    CH_PK_BYTES,  /* s/len */
    CH_PK_TUPLE,  /* items[0..n) */
    CH_PK_LIST,   /* items[0..n) */
    CH_PK_DICT,   /* items[2k] key, items[2k+1] value, k < n; state: BUILD's state or NULL */
    CH_PK_GLOBAL, /* i: a ch_pk_global_t */
    CH_PK_CALL,   /* a: the global called, b: the argument tuple (REDUCE) */
    CH_PK_PERSID, /* a: the persistent id (BINPERSID) */
    CH_PK_MARK    /* only on the stack while loading */
} ch_pk_kind_t;

/* The allowlisted globals. */
typedef enum {
    CH_PK_G_ORDERED_DICT,
    CH_PK_G_REBUILD_TENSOR_V2,
    CH_PK_G_REBUILD_PARAMETER,
    CH_PK_G_FLOAT_STORAGE,
    CH_PK_G_HALF_STORAGE,
    CH_PK_G_BFLOAT16_STORAGE,
    CH_PK_G_DOUBLE_STORAGE,
    CH_PK_G_LONG_STORAGE,
    CH_PK_G_INT_STORAGE,
    CH_PK_G_SHORT_STORAGE,
    CH_PK_G_CHAR_STORAGE,
    CH_PK_G_BYTE_STORAGE,
    CH_PK_G_BOOL_STORAGE,
    CH_PK_G_COUNT
} ch_pk_global_t;

typedef struct ch_pk_value ch_pk_value_t;
struct ch_pk_value {
    ch_pk_kind_t kind;
    int64_t i;
    double f;
    const char *s;
    size_t len;
    ch_pk_value_t **items;
    size_t n, cap; /* dict: n pairs, items holds 2n pointers */
    ch_pk_value_t *a, *b, *state;
};

/* Bounds of one load. */
typedef struct {
    uint64_t max_ops;    /* opcodes executed */
    size_t max_stack;    /* values on the stack (marks included) */
    size_t max_memo;     /* largest memo index + 1 */
    size_t max_bytes;    /* bytes allocated for values, strings and arrays */
} ch_pk_limits_t;

/* Defaults: 64 M opcodes, 1 M stack entries, 1 M memo entries, 1 GiB. */
void ch_pk_limits_default(ch_pk_limits_t *l);

/* The values of one or more loads (an arena). */
typedef struct ch_pk ch_pk_t;

/* Create an empty arena with limits l (NULL: defaults). label names the
 * source in error messages (copied). */
ch_status ch_pk_create(const char *label, const ch_pk_limits_t *l, ch_pk_t **out);
void ch_pk_destroy(ch_pk_t *p);

/* Unpickle one pickle starting at buf[0] (size bytes available; it ends at
 * its STOP opcode) into *root, allocated in p. *consumed (may be NULL) gets
 * the pickle's length in bytes (through STOP). Errors: CH_ERR_FORMAT (a
 * truncated or malformed pickle, an opcode or global outside the allowlist:
 * the message names it, and for a global that is a torch.nn / torchvision
 * model class or __main__ it adds "save model.state_dict() instead"),
 * CH_ERR_RANGE (a limit reached), CH_ERR_NOMEM. Error messages start with
 * the label and give the byte offset (base_offset + position in buf). */
ch_status ch_pk_load(ch_pk_t *p, const void *buf, size_t size, size_t base_offset,
                     ch_pk_value_t **root, size_t *consumed);

/* Every persistent id (CH_PK_PERSID) loaded into p so far, in file order:
 * *out[0..return). Valid until the next load or ch_pk_destroy. */
size_t ch_pk_persids(const ch_pk_t *p, ch_pk_value_t *const **out);

/* The value of dict key (a str) or NULL (the last one where a key repeats). */
const ch_pk_value_t *ch_pk_dict_get(const ch_pk_value_t *dict, const char *key);

/* "dict", "str", ... (for messages). */
const char *ch_pk_kind_name(ch_pk_kind_t k);

/* "torch.FloatStorage", ... for g < CH_PK_G_COUNT; "?" otherwise. */
const char *ch_pk_global_name(ch_pk_global_t g);

#ifdef __cplusplus
}
#endif
#endif /* COHORT_IO_PICKLE_H */
