/* cohort: running a model — forward, loss, backward with gradient-ready
 * hooks, and synchronized batch norm.
 *
 * One training step (PyTorch equivalent on the right):
 *
 *   ch_model_forward(model, cx, &x, &logits);     logits = model(x)
 *   ch_model_loss(model, cx, &labels, &loss);      loss = F.cross_entropy(logits, y)
 *   ch_model_backward(model, cx, NULL);            loss.backward()
 *   ch_sgd_step(sgd);                              optimizer.step()
 *
 * Memory: activations, their gradients, the logits' gradient and the loss
 * live in one arena (framework/tensor/arena.h) planned for the input's shape
 * (N, C, H, W) and layout. The first forward at a new shape plans and
 * allocates (once); later steps at the same shape allocate nothing. A
 * different batch size (e.g. the last evaluation batch) plans again.
 *
 * Backward writes (does not accumulate) every gradient of a parameter with
 * requires_grad; gradients of frozen parameters are not computed, and
 * layers before the first trainable one do no backward work at all. The
 * gradient-ready hook is called for each trainable parameter as soon as its
 * gradient is final, in reverse parameter order (exactly the reverse of
 * model.parameters()), which is what DDP's buckets need.
 *
 * Activations use the layout the compute context prefers; ReLU is in place
 * (torch.nn.ReLU(inplace=True), as torchvision's ResNet), inside a DAG
 * graph only under the in-place rule of nn.h ("DAG graphs"). Graphs are
 * planned, run and differentiated by the same functions: a value read by
 * several nodes sums its gradient contributions (nn.h).
 *
 * Devices: everything below runs where the model lives (ch_model_device,
 * nn.h). A model moved with ch_model_to_device(CH_DEV_CUDA, g) takes its
 * inputs (x, labels, dlogits) as CH_DEV_CUDA tensors on GPU g, keeps its
 * activations in a device arena and returns device logits; the GPU ops are
 * queued on the compute context's stream (ch_compute_stream) and return
 * before they finish, so the host sees results only through calls that
 * synchronise (ch_model_loss with a non-NULL loss, ch_model_loss_value,
 * ch_op_count_correct, ch_model_sync_to_host).
 */
#ifndef COHORT_NN_EXEC_H
#define COHORT_NN_EXEC_H

#include <stddef.h>
#include <stdint.h>

#include "framework/nn/nn.h"
#include "framework/ops/ops.h"
#include "framework/core/status.h"
#include "framework/tensor/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Plan (and allocate) the activations for an input of shape `shape`
 * (N, C, H, W) float32 in `layout` on the model's device (a GPU model makes
 * sure the context's GPU state exists, so the preferred layouts are the
 * GPU's; CH_ERR_UNSUPPORTED when the context has no GPU backend). Done automatically by
 * ch_model_forward; call it ahead to allocate before timing or to learn the
 * size (*arena_bytes may be NULL). CH_ERR_INVALID when C differs from the
 * model's input channels or the spatial size shrinks to nothing. */
ch_status ch_model_plan(ch_model_t *model, ch_compute_t *cx, const int64_t shape[4],
                        ch_layout_t layout, size_t *arena_bytes);

/* Forward pass. x: (N, C, H, W) float32 on the model's device
 * (CH_ERR_INVALID otherwise), any layout, kept alive and unchanged until
 * backward (on a GPU: until the backward's kernels have run). *logits: (N, num_classes) PLAIN float32,
 * owned by the model, valid until the next forward/plan. Training mode
 * (ch_model_train) uses batch statistics and updates running stats and
 * num_batches_tracked; eval mode uses running stats. */
ch_status ch_model_forward(ch_model_t *model, ch_compute_t *cx, const ch_tensor_t *x,
                           const ch_tensor_t **logits);

/* Cross-entropy loss (torch.nn.CrossEntropyLoss(label_smoothing=e) with the
 * model's e, ch_model_set_label_smoothing; mean over the N samples
 * of the last forward) and its gradient w.r.t. the logits, kept for
 * ch_model_backward. labels: (N) int64 on the model's device,
 * 0 <= label < num_classes (CH_ERR_RANGE otherwise). *loss (may be NULL)
 * receives the value; on a GPU model reading it waits for the queued work
 * (pass NULL and call ch_model_loss_value after queueing backward and the
 * optimizer step to keep the GPU busy). */
ch_status ch_model_loss(ch_model_t *model, ch_compute_t *cx, const ch_tensor_t *labels,
                        float *loss);

/* The label smoothing e of ch_model_loss from now on: loss = (1 - e) nll +
 * e mean over classes of -log_softmax (ch_op_cross_entropy_smooth, on the
 * CPU and CUDA backends). e = 0 (a new model's) is the plain
 * ch_op_cross_entropy, bitwise. CH_ERR_INVALID for e outside [0, 1] or
 * not finite. */
ch_status ch_model_set_label_smoothing(ch_model_t *model, double e);

/* The value of the last ch_model_loss (valid until the next forward or
 * plan; backward and optimizer steps do not change it). CPU: read at once.
 * GPU: a synchronous 4-byte device -> host copy (ch_device_memcpy: waits
 * for all work queued on the GPU). CH_ERR_INVALID without a loss since the
 * last forward. */
ch_status ch_model_loss_value(ch_model_t *model, ch_compute_t *cx, float *loss);

/* Backward pass from dlogits (N, num_classes) PLAIN float32 on the model's
 * device, or with
 * dlogits == NULL from the gradient of the last ch_model_loss. Needs a
 * training-mode forward (CH_ERR_INVALID otherwise). Writes ->grad of every
 * parameter with requires_grad and calls the gradient-ready hook; a hook
 * error stops the backward and is returned. */
ch_status ch_model_backward(ch_model_t *model, ch_compute_t *cx, const ch_tensor_t *dlogits);

/* Called once per trainable parameter per backward, right after its
 * gradient (p->grad, p->numel floats) is final. Returning non-OK aborts the
 * backward. */
typedef ch_status (*ch_nn_grad_hook_fn)(void *arg, ch_param_t *p);

/* Install (or with fn == NULL remove) the gradient-ready hook. */
void ch_model_set_grad_hook(ch_model_t *model, ch_nn_grad_hook_fn fn, void *arg);

/* The activation of the last forward at the output of a module (for tests
 * and debugging), e.g. "layer1.0" or "fc"; NULL if unknown / no forward. */
const ch_tensor_t *ch_model_activation(ch_model_t *model, const char *module_path);

/* Bytes of the activation arena of the current plan (0 before). */
size_t ch_model_arena_bytes(const ch_model_t *model);

/* ------------------------------------------------------------ SyncBN */

/* The process group as SyncBN needs it: a sum all-reduce of float32 host
 * vectors in place, and optionally an all-gather (NULL: emulated by an
 * all-reduce of a zero-padded world_size-times longer vector). Every rank
 * must call with the same n; ranks with an empty batch still call.
 * With framework/dist/dist.h's MPI-backend process group (host buffers):
 *
 *   static ch_status pg_sum(void *pg, float *d, size_t n)
 *   { return ch_pg_allreduce(pg, d, d, (int64_t)n, CH_DIST_FLOAT32, CH_REDUCE_SUM); }
 *   static ch_status pg_gather(void *pg, const float *in, float *out, size_t n)
 *   { return ch_pg_allgather(pg, in, out, (int64_t)n, CH_DIST_FLOAT32); }
 *   ch_nn_sync_t s = {pg_sum, pg_gather, pg, ch_pg_rank(pg), ch_pg_size(pg), NULL, NULL, NULL};
 */
typedef struct {
    ch_status (*allreduce_sum)(void *ctx, float *data, size_t n);
    /* all-gather n floats from every rank into out[world_size * n], rank order */
    ch_status (*allgather)(void *ctx, const float *in, float *out, size_t n);
    void *ctx;
    int rank;
    int world_size;
    /* Optional non-blocking forms (NULL: the blocking ones above), used by
     * a CPU model. iallreduce_sum starts a sum all-reduce of n host floats
     * in place, iallgather an all-gather as allgather does (it needs
     * allgather too), each giving a handle in *req; wait completes one (and
     * sets *req = NULL). Buffers stay untouched in between. wait is needed
     * with either. With iallreduce_sum, SyncBN's backward starts the
     * all-reduce of (sum_dy, sum_dy_xmu) and, while it is in flight,
     * computes the weight gradient of the convolution that consumed the
     * layer's output (deferred for that: the convolution's input gradient
     * goes first), so the wait hides behind compute; the forward's
     * statistics go through iallgather (or, without allgather, through
     * iallreduce_sum) and wait. The results are bitwise those of the
     * blocking forms; what changes is how the rank waits: wait may poll and
     * yield the core (ch_ddp_convert_sync_bn's does), where a blocking MPI
     * call spins and, on an oversubscribed node, takes the core from the
     * rank it is waiting for. With the MPI process group: ch_pg_iallreduce,
     * ch_pg_iallgather, ch_work_test. */
    ch_status (*iallreduce_sum)(void *ctx, float *data, size_t n, void **req);
    ch_status (*iallgather)(void *ctx, const float *in, float *out, size_t n, void **req);
    ch_status (*wait)(void *ctx, void **req);
} ch_nn_sync_t;

/* torch.nn.SyncBatchNorm.convert_sync_batchnorm: every BatchNorm2d becomes
 * a SyncBatchNorm (same entries and names) over the process group `sync`
 * (copied). In training mode its forward all-gathers per-rank (mean,
 * biased var, count) and combines them weighted by count (ranks with 0
 * samples take part and contribute nothing); running stats are updated
 * with the global unbiased variance. Its backward reduces sum(dy) and
 * sum(dy * (x - mean)) locally, all-reduces both and computes
 * dx = (dy - sum_dy/N - (x-mean) * invstd^2 * sum_dy_xmu/N) * invstd * weight
 * with N the global count; weight and bias gradients come from the LOCAL
 * sums (as torch.nn.SyncBatchNorm: DDP's gradient averaging then gives the
 * global-batch gradient). Eval mode uses running stats, no communication.
 * Errors: CH_ERR_INVALID for a bad process group (no allreduce_sum,
 * rank outside [0, world_size)). *n_converted (may be NULL) = layers changed. */
ch_status ch_model_convert_sync_bn(ch_model_t *model, const ch_nn_sync_t *sync,
                                   int *n_converted);

/* SyncBN on a GPU model. The buffers passed to sync's allreduce_sum /
 * allgather are then DEVICE memory of the model's GPU (give it an NCCL
 * process group whose compute stream is the context's, ch_pg_nccl_set_stream
 * with ch_compute_stream(cx, CH_DEV_CUDA), so every collective is ordered
 * after the kernels that produce its input and before those that consume
 * its output). In training the statistics are all-gathered as two in-place
 * gathers of C floats (per-rank means, then biased variances; without
 * allgather, one all-reduce of a zero-padded 2*R*C vector), while the
 * per-rank element counts (N*H*W, host values that
 * ch_op_batchnorm_gather_stats needs) come from this host callback: every
 * rank passes its own count and receives all[0..world_size) in rank order,
 * e.g. with the MPI process group
 *
 *   static ch_status counts(void *pg, int64_t local, int64_t *all)
 *   { return ch_pg_allgather(pg, &local, all, 1, CH_DIST_INT64); }
 *
 * Needed for a GPU model with world_size > 1 (the forward fails with
 * CH_ERR_INVALID without it); unused on the CPU. fn NULL removes it. */
typedef ch_status (*ch_nn_count_gather_fn)(void *ctx, int64_t local, int64_t *all);
ch_status ch_model_set_sync_count_gather(ch_model_t *model, ch_nn_count_gather_fn fn, void *ctx);

/* Host seconds (CLOCK_MONOTONIC) this model has spent inside SyncBN
 * collectives since it was created: the statistics all-gather / all-reduce
 * of each training forward and the gradient-sum all-reduce (or, with
 * iallreduce_sum, the wait for it) of each backward. This is the time that
 * plain BN does not have: latency, the other ranks' lateness (skew), and
 * whatever progress of other in-flight collectives MPI does meanwhile. On a
 * GPU model it is only the host time of queueing. 0 without SyncBN. */
double ch_model_sync_bn_seconds(const ch_model_t *model);

#ifdef __cplusplus
}
#endif
#endif /* COHORT_NN_EXEC_H */
