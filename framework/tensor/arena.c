/* cohort: two-phase arena (see arena.h). */
#include "config.h"

#include "framework/tensor/arena.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    ch_tensor_t *tensor; /* either tensor ... */
    void **slot;         /* ... or raw slot */
    size_t offset;
    size_t bytes;
} arena_item;

struct ch_arena {
    ch_devkind_t dev;
    int dev_index;
    arena_item *items;
    size_t n, cap;
    size_t planned;
    void *block;
    size_t block_bytes;
    int committed;
};

ch_status ch_arena_create(ch_devkind_t dev, int dev_index, ch_arena_t **a)
{
    CH_REQUIRE(a, "ch_arena_create: arena pointer is NULL");
    CH_REQUIRE(dev == CH_DEV_CPU || dev == CH_DEV_CUDA,
               "ch_arena_create: unknown device kind %d", (int)dev);
    ch_arena_t *r = calloc(1, sizeof *r);
    if (!r) return CH_ERROR(CH_ERR_NOMEM, "ch_arena_create: out of memory");
    r->dev = dev;
    r->dev_index = dev == CH_DEV_CPU ? 0 : dev_index;
    *a = r;
    return CH_OK;
}

static ch_status add_item(ch_arena_t *a, ch_tensor_t *t, void **slot, size_t bytes)
{
    if (a->committed)
        return CH_ERROR(CH_ERR_INVALID,
                        "ch_arena: cannot reserve %zu bytes after commit (reset first)",
                        bytes);
    if (a->n == a->cap) {
        size_t nc = a->cap ? a->cap * 2 : 64;
        arena_item *ni = realloc(a->items, nc * sizeof *ni);
        if (!ni) return CH_ERROR(CH_ERR_NOMEM, "ch_arena: out of memory for bookkeeping");
        a->items = ni;
        a->cap = nc;
    }
    size_t off = (a->planned + CH_ARENA_ALIGN - 1) / CH_ARENA_ALIGN * CH_ARENA_ALIGN;
    size_t end = off + (bytes + CH_ARENA_ALIGN - 1) / CH_ARENA_ALIGN * CH_ARENA_ALIGN;
    if (end < off || off < a->planned)
        return CH_ERROR(CH_ERR_NOMEM, "ch_arena: reservation of %zu bytes overflows", bytes);
    a->items[a->n++] = (arena_item){t, slot, off, bytes};
    a->planned = end;
    return CH_OK;
}

ch_status ch_arena_reserve_tensor(ch_arena_t *a, ch_tensor_t *t)
{
    CH_REQUIRE(a && t, "ch_arena_reserve_tensor: NULL argument");
    char d[128];
    if (t->ndim < 1)
        return CH_ERROR(CH_ERR_INVALID, "ch_arena_reserve_tensor: tensor not described "
                        "(call ch_tensor_init first)");
    if (t->data)
        return CH_ERROR(CH_ERR_INVALID, "ch_arena_reserve_tensor: %s already has storage",
                        ch_tensor_describe(t, d, sizeof d));
    if (t->dev != a->dev || t->dev_index != a->dev_index)
        return CH_ERROR(CH_ERR_INVALID,
                        "ch_arena_reserve_tensor: %s is on device %d:%d, the arena on %d:%d",
                        ch_tensor_describe(t, d, sizeof d), (int)t->dev, t->dev_index,
                        (int)a->dev, a->dev_index);
    for (size_t i = 0; i < a->n; i++)
        if (a->items[i].tensor == t)
            return CH_ERROR(CH_ERR_INVALID, "ch_arena_reserve_tensor: %s is already reserved "
                            "in this arena", ch_tensor_describe(t, d, sizeof d));
    t->owns = 0;
    return add_item(a, t, NULL, t->nbytes);
}

ch_status ch_arena_reserve(ch_arena_t *a, size_t bytes, void **slot)
{
    CH_REQUIRE(a && slot, "ch_arena_reserve: NULL argument");
    *slot = NULL;
    return add_item(a, NULL, slot, bytes);
}

size_t ch_arena_planned_bytes(const ch_arena_t *a) { return a ? a->planned : 0; }

ch_status ch_arena_commit(ch_arena_t *a)
{
    CH_REQUIRE(a, "ch_arena_commit: arena is NULL");
    if (a->committed) return CH_ERROR(CH_ERR_INVALID, "ch_arena_commit: already committed");
    void *block = NULL;
    if (a->planned > 0) {
        ch_status s = ch_storage_alloc(a->dev, a->dev_index, a->planned, &block);
        if (s != CH_OK)
            return ch_error_context("ch_arena_commit: arena of %zu bytes", a->planned);
    }
    a->block = block;
    a->block_bytes = a->planned;
    for (size_t i = 0; i < a->n; i++) {
        arena_item *it = &a->items[i];
        void *p = it->bytes ? (char *)block + it->offset : NULL;
        if (it->tensor) {
            it->tensor->data = p;
            it->tensor->owns = 0;
        } else {
            *it->slot = p;
        }
    }
    a->committed = 1;
    return CH_OK;
}

int ch_arena_committed(const ch_arena_t *a) { return a ? a->committed : 0; }

size_t ch_arena_bytes(const ch_arena_t *a) { return a ? a->block_bytes : 0; }

void ch_arena_reset(ch_arena_t *a)
{
    if (!a) return;
    for (size_t i = 0; i < a->n; i++) {
        arena_item *it = &a->items[i];
        if (it->tensor) it->tensor->data = NULL;
        else *it->slot = NULL;
    }
    ch_storage_free(a->dev, a->dev_index, a->block);
    a->block = NULL;
    a->block_bytes = 0;
    a->n = 0;
    a->planned = 0;
    a->committed = 0;
}

void ch_arena_destroy(ch_arena_t *a)
{
    if (!a) return;
    ch_arena_reset(a);
    free(a->items);
    free(a);
}
