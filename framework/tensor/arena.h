/* cohort: arena — one allocation holding all activations and workspaces of a
 * model at one batch size.
 *
 * Two phases, so the training step never calls malloc:
 *
 *   ch_arena_t *a;
 *   ch_arena_create(CH_DEV_CPU, 0, &a);
 *   // planning: describe each activation tensor, then reserve it
 *   ch_tensor_init(&m->out, CH_F32, 4, shape, layout, CH_DEV_CPU, 0);
 *   ch_arena_reserve_tensor(a, &m->out);       // m->out.data still NULL
 *   ch_arena_reserve(a, ws_bytes, &m->ws);     // raw workspace pointer slot
 *   ch_arena_commit(a);                        // ONE allocation; every reserved
 *                                              // tensor's data / slot is set
 *   ... steps ...
 *   ch_arena_reset(a);   // batch size changed: storage freed, tensors' data
 *                        // set to NULL, reservations forgotten; plan again
 *   ch_arena_destroy(a);
 *
 * Each reservation is 64-byte aligned (cache line, AVX-512 vector). The
 * tensors / slots passed to reserve must stay at the same address until
 * commit (they are patched in place) and until reset/destroy (which sets them
 * back to NULL). Reserved tensors are marked owns = 0: ch_tensor_free on them
 * only clears the header.
 *
 * Sizing a batch size before building: ch_arena_planned_bytes() after the
 * reservations tells the total without allocating.
 *
 * Not thread-safe; one arena per model instance.
 */
#ifndef COHORT_ARENA_H
#define COHORT_ARENA_H

#include <stddef.h>

#include "framework/core/status.h"
#include "framework/tensor/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ch_arena ch_arena_t;

/* Alignment of every reservation, bytes. */
#define CH_ARENA_ALIGN 64

/* Create an empty arena whose storage will live on (dev, dev_index).
 * Errors: CH_ERR_NOMEM. */
ch_status ch_arena_create(ch_devkind_t dev, int dev_index, ch_arena_t **a);

/* Release storage (tensors' data set to NULL) and the arena. NULL-safe. */
void ch_arena_destroy(ch_arena_t *a);

/* Reserve storage for t (already described by ch_tensor_init with the same
 * device as the arena; data must be NULL). Errors: CH_ERR_INVALID (device
 * mismatch, data already set, arena committed), CH_ERR_NOMEM (bookkeeping). */
ch_status ch_arena_reserve_tensor(ch_arena_t *a, ch_tensor_t *t);

/* Reserve `bytes` of raw workspace; *slot receives the pointer at commit
 * (NULL until then; bytes == 0 gives a NULL slot). Errors as above. */
ch_status ch_arena_reserve(ch_arena_t *a, size_t bytes, void **slot);

/* Total bytes the reservations so far need (with alignment padding). */
size_t ch_arena_planned_bytes(const ch_arena_t *a);

/* Allocate one block of ch_arena_planned_bytes() (zero-filled) and patch all
 * reserved tensors and slots. Committing twice is CH_ERR_INVALID; reserving
 * after commit is CH_ERR_INVALID. Errors: CH_ERR_NOMEM naming the size. */
ch_status ch_arena_commit(ch_arena_t *a);

/* 1 after a successful commit, 0 before or after reset. */
int ch_arena_committed(const ch_arena_t *a);

/* Bytes allocated by the last commit (0 before). */
size_t ch_arena_bytes(const ch_arena_t *a);

/* Free the storage, set every reserved tensor's data and slot back to NULL,
 * forget the reservations: ready to plan again (e.g. new batch size). */
void ch_arena_reset(ch_arena_t *a);

#ifdef __cplusplus
}
#endif
#endif /* COHORT_ARENA_H */
