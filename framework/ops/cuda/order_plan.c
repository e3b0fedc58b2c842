/* cohort: CUDA backend — host-side ordering and choice rules (order_plan.h). */
#include "config.h"

#include "framework/ops/cuda/order_plan.h"

#include <string.h>

const char *ch_gp_conv_algo_refusal(int want_deterministic, int algo_deterministic, int timed,
                                    int run_fma_only, int algo_math_fma)
{
    if (want_deterministic && !algo_deterministic) return "not deterministic";
    if (timed && run_fma_only && !algo_math_fma) return "timed with tensor-op math, runs with FMA";
    return NULL;
}

static int overlaps(const ch_gp_upload_entry_t *e, const char *p, size_t n)
{
    return e->state != CH_GP_UP_UNUSED && p < e->ptr + e->bytes && e->ptr < p + n;
}

ch_gp_upload_wait ch_gp_upload_before(ch_gp_upload_tracker_t *t, const void *ptr, size_t bytes,
                                      int *entry)
{
    const char *p = (const char *)ptr;
    size_t n = bytes ? bytes : 1;
    *entry = -1;
    int hit = -1, other = 0;
    for (int i = 0; i < CH_GP_UPLOAD_TRACK; i++) {
        if (!overlaps(&t->e[i], p, n)) continue;
        if (t->e[i].ptr == p && t->e[i].bytes >= n && hit < 0)
            hit = i;
        else
            other = 1;
    }
    if (hit >= 0 && !other) {
        ch_gp_upload_entry_t *e = &t->e[hit];
        int was = e->state;
        e->state = CH_GP_UP_PENDING;
        *entry = hit;
        if (was == CH_GP_UP_PENDING) return CH_GP_WAIT_NONE;
        if (was == CH_GP_UP_FREED) return CH_GP_WAIT_FREED;
        return CH_GP_WAIT_COMPUTE;
    }
    /* new, grown or overlapping another: forget the overlapping entries
     * (the wait below covers their readers) and track this range */
    for (int i = 0; i < CH_GP_UPLOAD_TRACK; i++)
        if (overlaps(&t->e[i], p, n) && t->e[i].state != CH_GP_UP_PENDING)
            t->e[i].state = CH_GP_UP_UNUSED;
    int pick = -1;
    for (int i = 0; i < CH_GP_UPLOAD_TRACK && pick < 0; i++)
        if (t->e[i].state == CH_GP_UP_UNUSED) pick = i;
    for (int i = 0; i < CH_GP_UPLOAD_TRACK && pick < 0; i++)
        if (t->e[i].state == CH_GP_UP_FREED) pick = i; /* oldest knowledge goes first */
    if (pick >= 0) {
        t->e[pick].ptr = p;
        t->e[pick].bytes = n;
        t->e[pick].state = CH_GP_UP_PENDING;
        *entry = pick;
    }
    return CH_GP_WAIT_COMPUTE;
}

int ch_gp_upload_at_wait(ch_gp_upload_tracker_t *t, int *record)
{
    int k = 0;
    for (int i = 0; i < CH_GP_UPLOAD_TRACK; i++)
        if (t->e[i].state == CH_GP_UP_IN_USE) {
            t->e[i].state = CH_GP_UP_FREED;
            record[k++] = i;
        }
    for (int i = 0; i < CH_GP_UPLOAD_TRACK; i++)
        if (t->e[i].state == CH_GP_UP_PENDING) t->e[i].state = CH_GP_UP_IN_USE;
    return k;
}
