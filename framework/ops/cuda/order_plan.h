/* cohort: CUDA backend — host-side ordering and choice rules that need no
 * GPU to check: which cuDNN convolution algorithms a context may run
 * (compute.deterministic, the math type of a timed search), and the
 * bookkeeping that orders an async upload after the compute stream's last
 * read of its destination (ch_op_upload_async).
 *
 * Not installed. Plain C, compiled in every build (framework/ops/ops.am), so
 * tests/test_cuda_order.c checks it on any machine; conv.cu and dense.cu
 * turn its answers into cuDNN and CUDA calls.
 */
#ifndef COHORT_OPS_CUDA_ORDER_PLAN_H
#define COHORT_OPS_CUDA_ORDER_PLAN_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------ convolution algorithms */

/* Why the convolution algorithm a cuDNN query returned (with status
 * success) is passed over, or NULL when it may run:
 *  - want_deterministic (compute.deterministic, torch.backends.cudnn.
 *    deterministic) and the entry's determinism is not CUDNN_DETERMINISTIC
 *    (algo_deterministic 0): "not deterministic";
 *  - a timed search (timed != 0) whose runs are pinned to FMA math
 *    (run_fma_only: fp32 with TF32 off) and an entry timed with another
 *    math type (algo_math_fma 0): "timed with tensor-op math, runs with FMA"
 *    — its time says nothing about the run (cudnnFind* reports entries of
 *    every math type; PyTorch's cudnn/Conv_v7.cpp skips them the same way).
 * Heuristic rankings (timed 0) keep such entries: they are not timings,
 * and the run pins FMA math anyway. */
const char *ch_gp_conv_algo_refusal(int want_deterministic, int algo_deterministic, int timed,
                                    int run_fma_only, int algo_math_fma);

/* ------------------------------------------------------ async uploads */

/* Destination buffers tracked per context; more in flight at once are
 * ordered conservatively (see ch_gp_upload_before). */
#define CH_GP_UPLOAD_TRACK 32

/* What the copy stream must wait for before an upload writes its
 * destination. */
typedef enum {
    CH_GP_WAIT_NONE = 0,    /* nothing: only copies touched it since the last wait */
    CH_GP_WAIT_FREED = 1,   /* the entry's "freed" event (recorded on the compute stream) */
    CH_GP_WAIT_COMPUTE = 2  /* everything the compute stream has queued so far */
} ch_gp_upload_wait;

/* Entry states. */
enum {
    CH_GP_UP_UNUSED = 0,
    CH_GP_UP_PENDING = 1, /* uploaded into since the last wait_upload */
    CH_GP_UP_IN_USE = 2,  /* made visible to the compute stream by a wait_upload;
                             its readers are queued there, their end not marked */
    CH_GP_UP_FREED = 3    /* its freed event marks the end of those readers */
};

typedef struct {
    const char *ptr;
    size_t bytes;
    int state;
} ch_gp_upload_entry_t;

typedef struct {
    ch_gp_upload_entry_t e[CH_GP_UPLOAD_TRACK];
} ch_gp_upload_tracker_t;

/* The rule (a batch slot reused every other step, as io/data/batch_feed.c
 * does): a destination becomes IN_USE at the wait_upload that hands it to
 * the compute stream; at the NEXT wait_upload everything its step queued is
 * on the compute stream, so its freed event is recorded there, before the
 * compute stream waits for the new copies. An upload into a FREED
 * destination waits for that event (the previous step's reads; the current
 * step keeps running), into an IN_USE one for all compute queued so far
 * (its readers are still being queued), into a PENDING one for nothing
 * (copies are ordered on the copy stream). A destination seen for the first
 * time, or one that overlaps a tracked one without being it, waits for all
 * queued compute. *entry receives the tracked entry (its event index), or
 * -1 when the table is full (the upload then waits for all queued compute). */
ch_gp_upload_wait ch_gp_upload_before(ch_gp_upload_tracker_t *t, const void *ptr, size_t bytes,
                                      int *entry);

/* At wait_upload, before the compute stream waits for the copies: the
 * entries whose freed event must be recorded on the compute stream now
 * (IN_USE -> FREED) go into record[] (at most CH_GP_UPLOAD_TRACK), and
 * PENDING entries become IN_USE. Returns how many were written. */
int ch_gp_upload_at_wait(ch_gp_upload_tracker_t *t, int *record);

#ifdef __cplusplus
}
#endif
#endif /* COHORT_OPS_CUDA_ORDER_PLAN_H */
