/* cohort: DistributedDataParallel — gradient buckets all-reduced while
 * backward runs (torch.nn.parallel.DistributedDataParallel).
 *
 * Buckets: the trainable parameters, taken in REVERSE parameter order (the
 * order backward finishes them), are grouped into buckets of at most
 * bucket_cap_bytes (default 25 MiB, torch's bucket_cap_mb=25; a parameter
 * larger than the cap gets a bucket of its own). Because the model keeps all
 * gradients in one contiguous block in parameter order (framework/nn/nn.h), a
 * bucket is a contiguous slice of that block: it is all-reduced in place,
 * with no copy (torch's gradient_as_bucket_view=True). A bucket is split at
 * a frozen parameter so that frozen gradients are never touched.
 *
 * During ch_model_backward the model's gradient-ready hook (installed by
 * ch_ddp_create) counts the parameters of each bucket; when a bucket's last
 * gradient is final its non-blocking SUM all-reduce starts at once
 * (ch_pg_iallreduce), so communication overlaps the rest of backward. Each
 * hook call also tests the in-flight all-reduces, which drives MPI progress.
 * ch_ddp_finish waits for every bucket and divides by the world size, so
 * afterwards every rank holds the mean gradient over ranks (SEMANTICS.md:
 * "after backward every gradient is averaged over ranks (sum / W)").
 *
 * All ranks must launch buckets in the same order: backward visits
 * parameters in the same order on every rank, so they do.
 *
 * broadcast_buffers (torch's default True): ch_ddp_before_forward
 * broadcasts rank 0's buffers (BN running mean/var, num_batches_tracked) to
 * every rank before each training forward; the training job turns it off
 * with SyncBN (whose running stats are identical on all ranks).
 *
 * World size 1: no communication, ch_ddp_finish returns at once.
 *
 * On a GPU (model moved with ch_model_to_device before ch_ddp_create): the
 * buckets are slices of the DEVICE gradient block (ch_model_device_grad_block)
 * and the group must be an NCCL one (ch_pg_create_nccl) whose compute stream
 * is the context's (ch_ddp_set_compute sets it). Ordering, all on the
 * device, none on the host:
 *   - a full bucket's ch_pg_iallreduce (from the gradient-ready hook)
 *     records an event on the compute stream after the kernels that wrote
 *     its gradients and makes the NCCL comm stream wait for it, then queues
 *     the SUM all-reduce on the comm stream; backward goes on queueing
 *     kernels on the compute stream meanwhile;
 *   - ch_ddp_finish makes the compute stream wait for every bucket's
 *     completion event (ch_work_wait) and queues the division by the world
 *     size (ch_op_scale, x * (1/W) as on the CPU) on the compute stream;
 *     the optimizer step queued after it sees the averaged gradients.
 * broadcast_buffers broadcasts the float buffer block on the device; the
 * int64 num_batches_tracked counters are host values that every rank
 * advances identically, so they are not sent. `wait_seconds` is then the
 * host time to queue the waits, not the communication time.
 */
#ifndef COHORT_DDP_H
#define COHORT_DDP_H

#include "framework/core/configuration.h"
#include "framework/dist/dist.h"
#include "framework/nn/nn.h"
#include "framework/ops/ops.h"
#include "framework/core/status.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ch_ddp ch_ddp_t;

typedef struct {
    size_t bucket_cap_bytes; /* bytes of float32 gradients per bucket (0: 25 MiB) */
    int broadcast_buffers;   /* 1: broadcast rank 0's buffers before each forward */
} ch_ddp_options_t;

void ch_ddp_options_default(ch_ddp_options_t *o);

/* The DDP's config keys (a job lists them as its "ddp" table):
 *   dist.bucket_mb          float, MiB per gradient bucket (default 25,
 *                           torch's bucket_cap_mb), range [0.001, 1e6]
 *   dist.broadcast_buffers  bool (default true, torch's broadcast_buffers)
 */
ch_config_table_t ch_ddp_config_table(void);

/* Options from those keys (PETSc's set-from-options): bucket_cap_bytes =
 * dist.bucket_mb * 2^20 (rounded down), broadcast_buffers =
 * dist.broadcast_buffers. cfg must have been loaded with
 * ch_ddp_config_table among its tables. Errors: CH_ERR_INVALID (a key missing
 * from cfg's table). */
ch_status ch_ddp_options_from_config(const ch_config_t *cfg, ch_ddp_options_t *o);

/* Build buckets over `model`'s trainable parameters and install the
 * gradient-ready hook on the model (replacing any other hook). The model
 * must be finalized; freeze parameters BEFORE creating the DDP. `pg` must
 * outlive the DDP. CH_ERR_INVALID for a NULL argument or a model without
 * trainable parameters; CH_ERR_NOMEM. */
ch_status ch_ddp_create(ch_model_t *model, ch_pg_t *pg, const ch_ddp_options_t *opts,
                        ch_ddp_t **out);

/* The compute context of a GPU DDP: its compute stream becomes the NCCL
 * group's compute stream (ch_pg_nccl_set_stream), and ch_ddp_finish queues
 * the averaging there. Required before the first backward on a GPU; a no-op
 * apart from remembering cx on the CPU. CH_ERR_UNSUPPORTED when the context
 * has no GPU stream. */
ch_status ch_ddp_set_compute(ch_ddp_t *ddp, ch_compute_t *cx);

/* torch.nn.SyncBatchNorm.convert_sync_batchnorm over process groups: every
 * BatchNorm2d of model becomes a SyncBatchNorm (framework/nn/nn_exec.h)
 * whose statistics go over pg (the group the gradients use: an NCCL group
 * for a GPU model, whose buffers are then device memory, else an MPI one)
 * and, on a GPU model, whose per-rank element counts go over host_pg (an
 * MPI group; may be pg on the CPU). pg and host_pg must outlive the model.
 * Call after ch_model_to_device and before ch_ddp_create. *n_converted (may
 * be NULL) receives the number of layers converted. Errors: those of
 * ch_model_convert_sync_bn and ch_model_set_sync_count_gather. */
ch_status ch_ddp_convert_sync_bn(ch_model_t *model, ch_pg_t *pg, ch_pg_t *host_pg,
                                 int *n_converted);

/* Remove the hook, wait for anything in flight, free. NULL is a no-op. */
void ch_ddp_destroy(ch_ddp_t *ddp);

/* Broadcast every parameter and buffer from rank 0 (what DDP's constructor
 * does), so all ranks start identical. Collective. */
ch_status ch_ddp_broadcast_state(ch_ddp_t *ddp);

/* Before a training forward: broadcast rank 0's buffers when
 * broadcast_buffers is on (collective), and arm the buckets for the next
 * backward. Call it before every training forward, even with
 * broadcast_buffers off. */
ch_status ch_ddp_before_forward(ch_ddp_t *ddp);

/* After ch_model_backward: wait for every bucket's all-reduce and divide the
 * gradients by the world size. CH_ERR_INTERNAL naming the parameter when a
 * trainable parameter received no gradient in this backward (its bucket
 * would never be launched; torch raises the same error without
 * find_unused_parameters). `wait_seconds` (may be NULL) receives the time
 * spent waiting here (the all-reduce time not hidden behind backward). */
ch_status ch_ddp_finish(ch_ddp_t *ddp, double *wait_seconds);

/* Introspection (tests, logs): number of buckets; bucket b's parameter range
 * in parameter order [*first, *last] and its size in floats. */
int ch_ddp_num_buckets(const ch_ddp_t *ddp);
ch_status ch_ddp_bucket_info(const ch_ddp_t *ddp, int b, int *first, int *last, size_t *numel);

#ifdef __cplusplus
}
#endif
#endif /* COHORT_DDP_H */
