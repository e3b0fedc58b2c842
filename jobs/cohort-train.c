/* cohort-train: data-parallel training of ResNets (PyTorch DDP recipe).
 *
 *   mpiexec -n W jobs/cohort-train [--config FILE] [--key=value ...] [--resume [PATH]]
 *   srun --mpi=pmi2 jobs/cohort-train ...
 *
 * The recipe (SEMANTICS.md): DistributedSampler + BatchSampler(drop_last)
 * order, ResNet with torchvision's structure and init, SyncBatchNorm when
 * asked, SGD(momentum, weight decay) with lr x world size and the cosine
 * LambdaLR schedule, DDP gradient averaging with buckets overlapped with
 * backward, evaluation with all-reduced correct counts, rank-0 checkpoints
 * (safetensors with torchvision names) and a resume file.
 *
 * GPU ranks (a GPU visible and chosen by dist.device_rule; all ranks or
 * none): the model, its gradients, BN buffers, SyncBN statistics and the
 * SGD momentum live on the device (ch_model_to_device); gradients and
 * SyncBN go over an NCCL group built over MPI whose compute stream is the
 * compute context's; batches are copied from the loader's page-locked slots
 * on the copy stream, the next one while the current step computes;
 * checkpoints and resume go through the host mirror. compute.* keys set
 * TF32, bf16 autocast, the convolution algorithm search and the workspace.
 *
 * Exit status: 0 success on every rank; 1 a runtime error; 2 bad
 * configuration or input detected before training; 3 stopped by a
 * preemption signal after writing the resume file (requeued if asked).
 */
#include "config.h"

#include "framework/core/configuration.h"
#include "framework/train/ddp.h"
#include "framework/tensor/device.h"
#include "framework/dist/dist.h"
#include "framework/launch/env.h"
#include "framework/core/log.h"
#include "framework/train/lr_schedule.h"
#include "framework/train/metrics.h"
#include "framework/nn/nn.h"
#include "framework/nn/nn_exec.h"
#include "framework/ops/ops.h"
#include "framework/train/optim.h"
#include "framework/runtime/profiler.h"
#include "framework/launch/signals.h"
#include "framework/core/status.h"
#include "framework/tensor/tensor.h"
#include "io/atomic_file.h"
#include "io/checkpoint.h"
#include "io/dataset.h"
#include "io/loader.h"
#include "io/safetensors.h"
#include "models/models.h"

#include <errno.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------------ keys */

static const ch_config_key_t keys[] = {
    {"data.path", CH_CFG_STRING, "/usr/share/datasets/fashion-mnist", CH_CFG_NO_RANGE,
     "Dataset directory (IDX files for idx, data_batch_*.bin for cifar10, class folders "
     "for imagefolder)."},
    {"data.format", CH_CFG_STRING, "idx", CH_CFG_NO_RANGE,
     "Dataset format: idx (MNIST/Fashion-MNIST), cifar10, or imagefolder."},
    {"data.val_path", CH_CFG_STRING, "", CH_CFG_NO_RANGE,
     "imagefolder only: validation folder; empty splits data.path by data.val_fraction."},
    {"data.val_fraction", CH_CFG_FLOAT, "0.2", 0, 1,
     "imagefolder without val_path: fraction held out for validation (random_split)."},
    {"data.image_size", CH_CFG_INT, "0", 0, 4096,
     "Resize + center crop images to this size (0: keep the dataset's size)."},
    {"data.train_subset", CH_CFG_INT64, "0", 0, 1e12,
     "Use only the first N training samples (0: all)."},
    {"data.test_subset", CH_CFG_INT64, "0", 0, 1e12,
     "Use only the first N test samples (0: all)."},
    {"data.workers", CH_CFG_INT, "2", 0, 256, "Loader worker threads per rank (0: load in the "
                                              "training thread)."},
    {"data.prefetch", CH_CFG_INT, "4", 1, 1024, "Batch slots in the loader's ring."},
    {"data.mean", CH_CFG_STRLIST, "0.2860", CH_CFG_NO_RANGE,
     "Normalize mean per channel (one value or one per channel)."},
    {"data.std", CH_CFG_STRLIST, "0.3530", CH_CFG_NO_RANGE,
     "Normalize std per channel (one value or one per channel)."},
    {"data.random_crop_padding", CH_CFG_INT, "0", 0, 1024,
     "Train augmentation: RandomCrop(size, padding=P); 0 turns it off."},
    {"data.hflip", CH_CFG_BOOL, "false", CH_CFG_NO_RANGE,
     "Train augmentation: RandomHorizontalFlip(0.5)."},
    {"model.arch", CH_CFG_STRING, "resnet18", CH_CFG_NO_RANGE,
     "Architecture: resnet18, resnet34, resnet50, smallcnn."},
    {"model.num_classes", CH_CFG_INT, "10", 1, 1e6, "Classes (fc outputs)."},
    {"model.in_channels", CH_CFG_INT, "1", 1, 4, "Input image channels (1 for Fashion-MNIST)."},
    {"model.weights", CH_CFG_STRING, "", CH_CFG_NO_RANGE,
     "Pretrained safetensors state dict; entries whose name and element count match are "
     "loaded, the rest reported and skipped."},
    {"model.freeze_layers", CH_CFG_BOOL, "false", CH_CFG_NO_RANGE,
     "Train only parameters whose name contains 'fc'."},
    {"model.sync_bn", CH_CFG_BOOL, "true", CH_CFG_NO_RANGE,
     "Convert BatchNorm to SyncBatchNorm (ignored with freeze_layers or one rank)."},
    {"optimizer.lr", CH_CFG_FLOAT, "0.01", 0, 1e3,
     "Base learning rate per rank; the job uses lr x world size."},
    {"optimizer.momentum", CH_CFG_FLOAT, "0.9", 0, 1e3, "SGD momentum."},
    {"optimizer.dampening", CH_CFG_FLOAT, "0", 0, 1, "SGD dampening."},
    {"optimizer.weight_decay", CH_CFG_FLOAT, "0.005", 0, 1e3, "SGD weight decay (L2)."},
    {"optimizer.nesterov", CH_CFG_BOOL, "false", CH_CFG_NO_RANGE, "Nesterov momentum."},
    {"schedule.epochs", CH_CFG_INT, "5", 1, 1e6, "Epochs to train."},
    {"schedule.lrf", CH_CFG_FLOAT, "0.1", 0, 1,
     "Cosine schedule's final learning-rate fraction."},
    {"train.batch_size", CH_CFG_INT, "64", 1, 1e6, "Batch size per rank."},
    {"train.seed", CH_CFG_INT64, "0", 0, 4294967295.0,
     "Seed of the sampler, the augmentations and the model's initialisation."},
    {"train.threads", CH_CFG_INT, "1", 0, 1024,
     "Compute threads per rank (0: OMP_NUM_THREADS or all cores)."},
    {"train.max_steps", CH_CFG_INT64, "0", 0, 1e12,
     "Stop each epoch after N steps (0: whole epoch); for quick tests."},
    {"train.stop_after", CH_CFG_INT, "0", 0, 1e6,
     "Stop this run after N epochs (0: run to schedule.epochs); resume later with --resume."},
    {"train.log_every", CH_CFG_INT, "100", 1, 1e9,
     "Steps between progress lines when stderr is not a terminal."},
    {"train.eval", CH_CFG_BOOL, "true", CH_CFG_NO_RANGE, "Evaluate on the test set each epoch."},
    {"output.dir", CH_CFG_STRING, "runs/fashion-mnist", CH_CFG_NO_RANGE,
     "Directory for checkpoints, the resume file, TensorBoard events and the CSV log "
     "(created by rank 0)."},
    {"output.save_every", CH_CFG_INT, "1", 0, 1e6,
     "Write model-<epoch>.safetensors every N epochs (0: only at the end)."},
    {"output.resume", CH_CFG_STRING, "", CH_CFG_NO_RANGE,
     "Resume file to continue from; 'auto' = <output.dir>/resume.safetensors when present."},
    {"dist.device_rule", CH_CFG_STRING, "auto", CH_CFG_NO_RANGE,
     "GPU choice: auto (Slurm: SLURM_PROCID mod devices; else local rank), slurm, local_rank."},
    {"dist.bucket_mb", CH_CFG_FLOAT, "25", 0.001, 1e6, "DDP gradient bucket size in MiB."},
    {"dist.broadcast_buffers", CH_CFG_BOOL, "true", CH_CFG_NO_RANGE,
     "Broadcast rank 0's BN buffers before each forward (when SyncBN is off)."},
    {"dist.warning_signal", CH_CFG_STRING, "USR2", CH_CFG_NO_RANGE,
     "Signal announcing preemption (besides SIGTERM), e.g. from #SBATCH --signal=B:USR2@120."},
    {"dist.requeue", CH_CFG_BOOL, "false", CH_CFG_NO_RANGE,
     "On preemption, run 'scontrol requeue $SLURM_JOB_ID' after writing the resume file."},
    {"compute.allow_tf32", CH_CFG_BOOL, "true", CH_CFG_NO_RANGE,
     "GPU: cuDNN convolutions may use TF32 tensor cores (torch.backends.cudnn.allow_tf32); "
     "linear layers stay fp32. Ignored on CPU ranks."},
    {"compute.bf16", CH_CFG_BOOL, "false", CH_CFG_NO_RANGE,
     "GPU: bf16 autocast for convolutions and linear layers (fp32 master weights, gradients "
     "and BN statistics; torch.autocast(dtype=torch.bfloat16)). An error on a CPU rank."},
    {"compute.conv_search", CH_CFG_STRING, "heuristics", CH_CFG_NO_RANGE,
     "GPU: convolution algorithm choice: heuristics (cuDNN's ranking) or timed "
     "(cudnnFind*, torch.backends.cudnn.benchmark = True). Ignored on CPU ranks."},
    {"compute.gpu_workspace_mb", CH_CFG_INT, "1024", 1, 1048576,
     "GPU: cap on the cuDNN convolution workspace in MiB. Ignored on CPU ranks."},
};
#define N_KEYS ((int)(sizeof keys / sizeof keys[0]))

/* On GPU ranks forward/backward/optimizer time the host queueing kernels;
 * the device's own time shows up as "gpu wait" (the end-of-step wait for the
 * loss value). */
enum { PH_DATA, PH_FORWARD, PH_BACKWARD, PH_ALLREDUCE, PH_OPTIM, PH_EVAL, PH_CKPT, PH_GPU_WAIT,
       PH_N };
static const char *const phase_names[PH_N] = {"data wait", "forward",    "backward",
                                               "all-reduce wait", "optimizer", "eval",
                                               "checkpoint", "gpu wait"};

enum { EXIT_OK = 0, EXIT_ERROR = 1, EXIT_BAD_INPUT = 2, EXIT_PREEMPTED = 3 };

/* ------------------------------------------------------------------ job */

typedef struct {
    /* configuration */
    ch_config_t *cfg;
    const char *data_path, *data_format, *val_path, *weights, *out_dir, *resume_arg;
    const char *arch, *device_rule_text, *warning_signal_text;
    double val_fraction, lr, momentum, dampening, weight_decay, lrf, bucket_mb;
    long long train_subset, test_subset, seed, max_steps;
    int image_size, workers, prefetch, crop_padding, hflip, num_classes, in_channels;
    int freeze, sync_bn, nesterov, epochs, batch_size, threads, log_every, do_eval;
    int save_every, broadcast_buffers, requeue, warning_signal, stop_after;
    int allow_tf32, bf16, conv_search, gpu_workspace_mb;
    const char *conv_search_text;
    float mean[3], stdv[3];

    /* runtime */
    ch_env_t env;
    int rank, world;
    ch_pg_t *pg;
    ch_compute_t *cx;
    /* GPU ranks (env.device >= 0): the model, gradients and SyncBN live on
     * the device, collectives on them go through the NCCL group; the loss
     * and accuracy all-reduces stay on the MPI group (host values) */
    int on_gpu;
    ch_pg_t *nccl;
    ch_tensor_t x_dev[2], y_dev[2]; /* device input slots (double buffer) */
    ch_dataset_t *train_base, *test_base, *train_ds, *test_ds;
    ch_loader_t *train_loader, *test_loader;
    ch_model_t *model;
    ch_sgd_t *sgd;
    ch_ddp_t *ddp;
    ch_lr_cosine_t sched;
    ch_prof_t *prof;
    ch_metrics_t *metrics;
    char resume_path[4096];
    int start_epoch;
    int64_t start_step_in_epoch, global_step;
    double resumed_loss_sum;
    int64_t resumed_loss_steps;
    int converted_sync_bn;
    int is_tty;
} job_t;

/* Every rank learns whether any rank failed. On failure the failing ranks
 * print their own message and rank 0 names the first failing rank. Returns
 * 1 if some rank failed. */
static int agree(job_t *j, ch_status s, const char *what)
{
    int failed_rank = -1;
    if (s != CH_OK) ch_log_error("%s: %s", what, ch_error_message());
    if (!j->pg) return s != CH_OK;
    ch_status all = ch_pg_check_all(j->pg, s, &failed_rank);
    if (all == CH_OK) return 0;
    if (j->rank == 0 && s == CH_OK)
        ch_log_error("%s failed on rank %d (see its message above)", what, failed_rank);
    return 1;
}

static ch_status read_floats(job_t *j, const char *key, float out[3], int channels)
{
    const char *const *items;
    int n;
    CH_TRY(ch_config_get_strlist(j->cfg, key, &items, &n));
    if (n != 1 && n != channels)
        return CH_ERROR(CH_ERR_CONFIG, "%s: %d values given, expected %s%d (one per input "
                        "channel, model.in_channels = %d)", key, n, channels > 1 ? "1 or " : "",
                        channels, channels);
    for (int c = 0; c < channels; c++) {
        char *end;
        errno = 0;
        double v = strtod(items[n == 1 ? 0 : c], &end);
        if (errno || *end || end == items[n == 1 ? 0 : c] || !isfinite(v))
            return CH_ERROR(CH_ERR_CONFIG, "%s: '%s' is not a number", key, items[n == 1 ? 0 : c]);
        out[c] = (float)v;
    }
    return CH_OK;
}

static ch_status read_config(job_t *j)
{
    ch_config_t *c = j->cfg;
    CH_TRY(ch_config_get_string(c, "data.path", &j->data_path));
    CH_TRY(ch_config_get_string(c, "data.format", &j->data_format));
    CH_TRY(ch_config_get_string(c, "data.val_path", &j->val_path));
    CH_TRY(ch_config_get_double(c, "data.val_fraction", &j->val_fraction));
    CH_TRY(ch_config_get_int(c, "data.image_size", &j->image_size));
    CH_TRY(ch_config_get_int64(c, "data.train_subset", &j->train_subset));
    CH_TRY(ch_config_get_int64(c, "data.test_subset", &j->test_subset));
    CH_TRY(ch_config_get_int(c, "data.workers", &j->workers));
    CH_TRY(ch_config_get_int(c, "data.prefetch", &j->prefetch));
    CH_TRY(ch_config_get_int(c, "data.random_crop_padding", &j->crop_padding));
    CH_TRY(ch_config_get_bool(c, "data.hflip", &j->hflip));
    CH_TRY(ch_config_get_string(c, "model.arch", &j->arch));
    CH_TRY(ch_config_get_int(c, "model.num_classes", &j->num_classes));
    CH_TRY(ch_config_get_int(c, "model.in_channels", &j->in_channels));
    CH_TRY(ch_config_get_string(c, "model.weights", &j->weights));
    CH_TRY(ch_config_get_bool(c, "model.freeze_layers", &j->freeze));
    CH_TRY(ch_config_get_bool(c, "model.sync_bn", &j->sync_bn));
    CH_TRY(ch_config_get_double(c, "optimizer.lr", &j->lr));
    CH_TRY(ch_config_get_double(c, "optimizer.momentum", &j->momentum));
    CH_TRY(ch_config_get_double(c, "optimizer.dampening", &j->dampening));
    CH_TRY(ch_config_get_double(c, "optimizer.weight_decay", &j->weight_decay));
    CH_TRY(ch_config_get_bool(c, "optimizer.nesterov", &j->nesterov));
    CH_TRY(ch_config_get_int(c, "schedule.epochs", &j->epochs));
    CH_TRY(ch_config_get_double(c, "schedule.lrf", &j->lrf));
    CH_TRY(ch_config_get_int(c, "train.batch_size", &j->batch_size));
    CH_TRY(ch_config_get_int64(c, "train.seed", &j->seed));
    CH_TRY(ch_config_get_int(c, "train.threads", &j->threads));
    CH_TRY(ch_config_get_int64(c, "train.max_steps", &j->max_steps));
    CH_TRY(ch_config_get_int(c, "train.log_every", &j->log_every));
    CH_TRY(ch_config_get_int(c, "train.stop_after", &j->stop_after));
    CH_TRY(ch_config_get_bool(c, "train.eval", &j->do_eval));
    CH_TRY(ch_config_get_string(c, "output.dir", &j->out_dir));
    CH_TRY(ch_config_get_int(c, "output.save_every", &j->save_every));
    CH_TRY(ch_config_get_string(c, "output.resume", &j->resume_arg));
    CH_TRY(ch_config_get_string(c, "dist.device_rule", &j->device_rule_text));
    CH_TRY(ch_config_get_double(c, "dist.bucket_mb", &j->bucket_mb));
    CH_TRY(ch_config_get_bool(c, "dist.broadcast_buffers", &j->broadcast_buffers));
    CH_TRY(ch_config_get_string(c, "dist.warning_signal", &j->warning_signal_text));
    CH_TRY(ch_config_get_bool(c, "dist.requeue", &j->requeue));
    CH_TRY(ch_config_get_bool(c, "compute.allow_tf32", &j->allow_tf32));
    CH_TRY(ch_config_get_bool(c, "compute.bf16", &j->bf16));
    CH_TRY(ch_config_get_string(c, "compute.conv_search", &j->conv_search_text));
    CH_TRY(ch_config_get_int(c, "compute.gpu_workspace_mb", &j->gpu_workspace_mb));
    static const char *const conv_search_names[] = {"heuristics", "timed"};
    CH_TRY(ch_config_get_choice(c, "compute.conv_search", conv_search_names, 2, &j->conv_search));
    CH_TRY(read_floats(j, "data.mean", j->mean, j->in_channels));
    CH_TRY(read_floats(j, "data.std", j->stdv, j->in_channels));
    for (int ch = 0; ch < j->in_channels; ch++)
        if (!(j->stdv[ch] > 0))
            return CH_ERROR(CH_ERR_CONFIG, "data.std: value %g for channel %d must be > 0",
                            (double)j->stdv[ch], ch);
    if (ch_signal_parse(j->warning_signal_text, &j->warning_signal) != CH_OK)
        return ch_error_context("%s: dist.warning_signal", ch_config_source(c, "dist.warning_signal"));
    static const char *const format_names[] = {"idx", "cifar10", "imagefolder"};
    int format_index;
    CH_TRY(ch_config_get_choice(c, "data.format", format_names, 3, &format_index));
    if (j->nesterov && (j->momentum <= 0 || j->dampening != 0))
        return CH_ERROR(CH_ERR_CONFIG, "optimizer.nesterov needs momentum > 0 and dampening 0 "
                        "(got momentum %g, dampening %g)", j->momentum, j->dampening);
    return CH_OK;
}

/* --resume [PATH] is shorthand for --output.resume=PATH (default auto). */
static char **rewrite_args(int argc, char **argv, int *out_argc)
{
    char **v = calloc((size_t)argc + 2, sizeof *v);
    int n = 0;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--resume")) {
            if (i + 1 < argc && strncmp(argv[i + 1], "--", 2)) {
                v[n++] = "--output.resume";
                v[n++] = argv[++i];
            } else {
                v[n++] = "--output.resume=auto";
            }
        } else if (!strncmp(argv[i], "--resume=", 9)) {
            static char buf[4200];
            snprintf(buf, sizeof buf, "--output.resume=%s", argv[i] + 9);
            v[n++] = buf;
        } else {
            v[n++] = argv[i];
        }
    }
    *out_argc = n;
    return v;
}

/* ------------------------------------------------------------------ data */

static ch_status first_n_subset(ch_dataset_t *base, long long n, ch_dataset_t **out)
{
    int64_t len = (base)->length;
    if (n <= 0 || n >= len) {
        *out = NULL;
        return CH_OK;
    }
    int64_t *idx = malloc((size_t)n * sizeof *idx);
    if (!idx) return CH_ERROR(CH_ERR_NOMEM, "subset of %lld samples", n);
    for (int64_t i = 0; i < n; i++) idx[i] = i;
    ch_status s = ch_dataset_subset_create(out, base, idx, n);
    free(idx);
    return s;
}

static ch_status open_datasets(job_t *j)
{
    if (!strcmp(j->data_format, "idx")) {
        CH_TRY(ch_dataset_fashion_mnist_open(&j->train_base, j->data_path, 1));
        CH_TRY(ch_dataset_fashion_mnist_open(&j->test_base, j->data_path, 0));
    } else if (!strcmp(j->data_format, "cifar10")) {
        CH_TRY(ch_dataset_cifar10_open(&j->train_base, j->data_path, 1));
        CH_TRY(ch_dataset_cifar10_open(&j->test_base, j->data_path, 0));
    } else {
        CH_TRY(ch_dataset_imagefolder_open(&j->train_base, j->data_path, j->in_channels));
        if (j->val_path[0]) {
            CH_TRY(ch_dataset_imagefolder_open(&j->test_base, j->val_path, j->in_channels));
        } else {
            ch_dataset_t *tr = NULL, *va = NULL;
            CH_TRY(ch_dataset_random_split(j->train_base, j->val_fraction, (uint64_t)j->seed,
                                           &tr, &va));
            j->train_ds = tr;
            j->test_ds = va;
        }
    }
    if (!j->train_ds) {
        ch_dataset_t *sub = NULL;
        CH_TRY(first_n_subset(j->train_base, j->train_subset, &sub));
        j->train_ds = sub ? sub : j->train_base;
    }
    if (!j->test_ds) {
        ch_dataset_t *sub = NULL;
        CH_TRY(first_n_subset(j->test_base, j->test_subset, &sub));
        j->test_ds = sub ? sub : j->test_base;
    }
    int c = j->train_ds->channels;
    if (c != j->in_channels)
        return CH_ERROR(CH_ERR_CONFIG, "model.in_channels is %d but %s has %d-channel images",
                        j->in_channels, j->data_path, c);
    int classes = j->train_ds->num_classes;
    if (classes > j->num_classes)
        return CH_ERROR(CH_ERR_CONFIG, "model.num_classes is %d but %s has %d classes",
                        j->num_classes, j->data_path, classes);
    return CH_OK;
}

static ch_status make_loaders(job_t *j)
{
    ch_transform_t train_tf[CH_TRANSFORMS_MAX], test_tf[CH_TRANSFORMS_MAX];
    int ntr = 0, nte = 0, h, w;
    memset(train_tf, 0, sizeof train_tf);
    memset(test_tf, 0, sizeof test_tf);
    h = j->train_ds->height;
    w = j->train_ds->width;
    if (j->image_size > 0) {
        ch_transform_t r = {.kind = CH_TF_RESIZE, .size = {j->image_size, 0}};
        ch_transform_t cc = {.kind = CH_TF_CENTER_CROP, .size = {j->image_size, j->image_size}};
        train_tf[ntr++] = r;
        train_tf[ntr++] = cc;
        test_tf[nte++] = r;
        test_tf[nte++] = cc;
        h = w = j->image_size;
    }
    if (j->crop_padding > 0) {
        ch_transform_t rc = {.kind = CH_TF_RANDOM_CROP, .size = {h, w}, .padding = j->crop_padding};
        train_tf[ntr++] = rc;
    }
    if (j->hflip) {
        ch_transform_t f = {.kind = CH_TF_RANDOM_HFLIP, .p = 0.5};
        train_tf[ntr++] = f;
    }
    ch_transform_t norm = {.kind = CH_TF_NORMALIZE};
    memcpy(norm.mean, j->mean, sizeof norm.mean);
    memcpy(norm.std, j->stdv, sizeof norm.std);
    train_tf[ntr++] = norm;
    test_tf[nte++] = norm;

    ch_loader_options_t lc;
    ch_loader_options_default(&lc);
    lc.batch_size = j->batch_size;
    lc.num_workers = j->workers;
    lc.prefetch = j->prefetch;
    lc.pinned = j->env.device >= 0;
    lc.world_size = j->world;
    lc.rank = j->rank;
    lc.seed = (uint64_t)j->seed;
    /* seed recipe: BatchSampler(DistributedSampler(train), drop_last=True) */
    lc.shuffle = 1;
    lc.drop_last = 1;
    lc.sampler_drop_last = 0;
    lc.transforms = train_tf;
    lc.n_transforms = ntr;
    CH_TRY(ch_loader_create(&j->train_loader, j->train_ds, &lc));
    if (j->do_eval) {
        /* DataLoader(val, batch_size, sampler=DistributedSampler(val)):
         * padded to a multiple of the world size, no batch dropped */
        lc.shuffle = 0;
        lc.drop_last = 0;
        lc.transforms = test_tf;
        lc.n_transforms = nte;
        CH_TRY(ch_loader_create(&j->test_loader, j->test_ds, &lc));
    }
    return CH_OK;
}

/* ------------------------------------------------------------------ model */

static void report_skip(void *arg, const char *name, const char *reason)
{
    (void)arg;
    ch_log_info("pretrained weights: skipped %s (%s)", name, reason);
}

/* Convert between the model's state-dict views and safetensors views. */
static ch_status model_state(job_t *j, ch_nn_view_t **views, ch_st_view_t **st, int *n)
{
    int ne = ch_model_num_entries(j->model);
    *views = calloc((size_t)ne, sizeof **views);
    *st = calloc((size_t)ne, sizeof **st);
    if (!*views || !*st) return CH_ERROR(CH_ERR_NOMEM, "state dict of %d entries", ne);
    CH_TRY(ch_model_state_dict(j->model, *views, ne, n));
    for (int i = 0; i < *n; i++) {
        const ch_nn_view_t *v = &(*views)[i];
        ch_st_view_t *s = &(*st)[i];
        s->name = v->name;
        s->dtype = v->dtype == CH_I64 ? CH_ST_I64 : CH_ST_F32;
        s->ndim = v->ndim;
        for (int d = 0; d < v->ndim; d++) s->shape[d] = v->shape[d];
        s->data = v->data;
        s->nbytes = v->numel * (v->dtype == CH_I64 ? sizeof(int64_t) : sizeof(float));
    }
    return CH_OK;
}

static ch_status load_pretrained(job_t *j)
{
    ch_safetensors_t *st = NULL;
    ch_status s = ch_safetensors_open(&st, j->weights);
    if (s) return ch_error_context("model.weights");
    size_t n = ch_safetensors_count(st);
    ch_nn_view_t *views = calloc(n ? n : 1, sizeof *views);
    void **copies = calloc(n ? n : 1, sizeof *copies);
    int nv = 0, loaded = 0;
    if (!views || !copies) {
        s = CH_ERROR(CH_ERR_NOMEM, "pretrained weights");
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        const ch_st_view_t *t = ch_safetensors_at(st, i);
        if (t->ndim > CH_NN_MAX_DIMS) {
            report_skip(NULL, t->name, "more than 4 dimensions");
            continue;
        }
        copies[nv] = malloc(t->nbytes ? t->nbytes : 1);
        if (!copies[nv]) {
            s = CH_ERROR(CH_ERR_NOMEM, "pretrained tensor %s", t->name);
            goto done;
        }
        memcpy(copies[nv], t->data, t->nbytes);
        ch_nn_view_t *v = &views[nv];
        v->name = t->name;
        v->dtype = t->dtype == CH_ST_I64 ? CH_I64 : CH_F32;
        v->ndim = t->ndim;
        v->numel = 1;
        for (int d = 0; d < t->ndim; d++) {
            v->shape[d] = t->shape[d];
            v->numel *= (size_t)t->shape[d];
        }
        v->data = copies[nv];
        nv++;
    }
    s = ch_model_load_state_dict(j->model, views, nv, 0, report_skip, NULL, &loaded);
    /* Fine-tuning skips a few entries (fc when num_classes differs); a file
     * where most entries do not fit is the wrong file. */
    int ne = ch_model_num_entries(j->model);
    if (s == CH_OK && 2 * loaded < ne)
        s = CH_ERROR(CH_ERR_FORMAT, "model.weights: %s matches only %d of the %d tensors of %s "
                     "(name and element count): no tensor matching most of the model; is it a "
                     "state dict of this architecture?", j->weights, loaded, ne, j->arch);
    if (s == CH_OK)
        ch_log_info("pretrained weights: loaded %d of %zu tensors from %s", loaded, n, j->weights);
done:
    for (int i = 0; i < nv; i++) free(copies[i]);
    free(copies);
    free(views);
    ch_safetensors_destroy(st);
    return s;
}

static ch_status sync_allreduce(void *ctx, float *data, size_t n)
{
    return ch_pg_allreduce((ch_pg_t *)ctx, data, data, (int64_t)n, CH_DIST_FLOAT32, CH_REDUCE_SUM);
}

static ch_status sync_allgather(void *ctx, const float *in, float *out, size_t n)
{
    return ch_pg_allgather((ch_pg_t *)ctx, in, out, (int64_t)n, CH_DIST_FLOAT32);
}

/* SyncBN on a GPU: the per-rank element counts travel on the host. */
static ch_status sync_count_gather(void *ctx, int64_t local, int64_t *all)
{
    return ch_pg_allgather((ch_pg_t *)ctx, &local, all, 1, CH_DIST_INT64);
}

static ch_status build_model(job_t *j)
{
    ch_model_options_t mo;
    ch_model_options_default(&mo);
    mo.num_classes = j->num_classes;
    mo.in_channels = j->in_channels;
    mo.seed = (uint64_t)j->seed;
    CH_TRY(ch_model_create(j->arch, &mo, &j->model));
    if (j->weights[0]) CH_TRY(load_pretrained(j));
    if (j->freeze) {
        int nf = 0;
        CH_TRY(ch_model_freeze(j->model, "fc", &nf));
        ch_log_info("freeze_layers: %d parameters frozen, training only 'fc'", nf);
    }
    /* GPU: parameters, gradients and buffers to the device (the host blocks
     * stay as the mirror for checkpoints); collectives on device memory go
     * through the NCCL group */
    ch_pg_t *grad_pg = j->pg;
    if (j->on_gpu) {
        CH_TRY(ch_model_to_device(j->model, CH_DEV_CUDA, j->env.device));
        grad_pg = j->nccl;
    }
    if (j->sync_bn && !j->freeze && j->world > 1) {
        ch_nn_sync_t sync = {sync_allreduce, sync_allgather, grad_pg, j->rank, j->world};
        CH_TRY(ch_model_convert_sync_bn(j->model, &sync, &j->converted_sync_bn));
        if (j->on_gpu) CH_TRY(ch_model_set_sync_count_gather(j->model, sync_count_gather, j->pg));
    }
    ch_ddp_options_t dopt;
    ch_ddp_options_default(&dopt);
    dopt.bucket_cap_bytes = (size_t)(j->bucket_mb * 1048576.0);
    dopt.broadcast_buffers = j->broadcast_buffers && !j->converted_sync_bn;
    CH_TRY(ch_ddp_create(j->model, grad_pg, &dopt, &j->ddp));
    CH_TRY(ch_ddp_set_compute(j->ddp, j->cx));
    ch_sgd_options_t so = {.lr = j->lr * j->world,
                           .momentum = j->momentum,
                           .dampening = j->dampening,
                           .weight_decay = j->weight_decay,
                           .nesterov = j->nesterov};
    CH_TRY(ch_sgd_create(&so, &j->sgd));
    ch_sgd_set_compute(j->sgd, j->cx);
    CH_TRY(ch_sgd_add_model(j->sgd, j->model));
    CH_TRY(ch_lr_cosine_init(&j->sched, j->lr * j->world, j->lrf, j->epochs));
    return CH_OK;
}

/* ------------------------------------------------------------------ checkpoints */

static ch_status save_model_file(job_t *j, const char *path)
{
    ch_nn_view_t *views = NULL;
    ch_st_view_t *st = NULL;
    int n = 0;
    ch_status s = model_state(j, &views, &st, &n);
    if (s == CH_OK) s = ch_checkpoint_write_model(path, st, (size_t)n);
    free(views);
    free(st);
    return s;
}

static ch_status save_resume(job_t *j, int epoch, int64_t global_step, double loss_sum,
                             int64_t loss_steps)
{
    ch_nn_view_t *views = NULL;
    ch_st_view_t *st = NULL, *mom = NULL;
    int n = 0;
    size_t nmom = 0;
    char *cfg_text = NULL;
    ch_status s = model_state(j, &views, &st, &n);
    int np = ch_model_num_params(j->model);
    mom = calloc((size_t)np + 1, sizeof *mom);
    if (s == CH_OK && !mom) s = CH_ERROR(CH_ERR_NOMEM, "resume file");
    for (int i = 0; s == CH_OK; i++) {
        const char *name;
        const float *buf;
        size_t numel;
        int has;
        if (ch_sgd_buffer(j->sgd, i, &name, &buf, &numel, &has) != CH_OK) {
            ch_error_clear(); /* past the last optimizer parameter */
            break;
        }
        ch_param_t *p = ch_model_find(j->model, name);
        if (!has || !p) continue;
        /* named by the parameter; the writer adds "optim.momentum_buffer." */
        mom[nmom].name = p->name;
        mom[nmom].dtype = CH_ST_F32;
        mom[nmom].ndim = p->ndim;
        for (int d = 0; d < p->ndim; d++) mom[nmom].shape[d] = p->shape[d];
        mom[nmom].data = buf;
        mom[nmom].nbytes = numel * sizeof(float);
        nmom++;
    }
    if (s == CH_OK) s = ch_config_dump_string(j->cfg, &cfg_text);
    if (s == CH_OK) {
        char lsum[64], lsteps[64];
        snprintf(lsum, sizeof lsum, "%.17g", loss_sum);
        snprintf(lsteps, sizeof lsteps, "%lld", (long long)loss_steps);
        ch_st_meta_t extra[2] = {{"epoch_loss_sum", lsum}, {"epoch_loss_steps", lsteps}};
        ch_resume_info_t info = {.epoch = epoch,
                                 .global_step = global_step,
                                 .sampler_seed = (uint64_t)j->seed,
                                 .sampler_epoch = epoch,
                                 .world_size = j->world,
                                 .rng_state = "augmentation streams keyed by (seed, epoch, index)",
                                 .config = cfg_text};
        s = ch_checkpoint_write_resume(j->resume_path, st, (size_t)n, mom, nmom, &info, extra, 2);
    }
    free(mom);
    free(views);
    free(st);
    free(cfg_text);
    return s;
}

static ch_status load_resume(job_t *j, const char *path)
{
    ch_safetensors_t *st = NULL;
    ch_resume_info_t info;
    CH_TRY(ch_checkpoint_read_resume(path, &st, &info));
    ch_status s = CH_OK;
    int ne = ch_model_num_entries(j->model);
    for (int i = 0; i < ne && s == CH_OK; i++) {
        ch_param_t *e = ch_model_entry(j->model, i);
        size_t bytes = e->numel * (e->dtype == CH_I64 ? sizeof(int64_t) : sizeof(float));
        s = ch_safetensors_read_into(st, e->name, e->dtype == CH_I64 ? CH_ST_I64 : CH_ST_F32,
                                     e->ndim, e->shape, e->data, bytes);
    }
    int np = ch_model_num_params(j->model);
    for (int i = 0; i < np && s == CH_OK; i++) {
        ch_param_t *p = ch_model_param(j->model, i);
        const ch_st_view_t *m = ch_checkpoint_momentum(st, p->name);
        if (!m) continue;
        float *tmp = malloc(m->nbytes ? m->nbytes : 1);
        if (!tmp) {
            s = CH_ERROR(CH_ERR_NOMEM, "momentum of %s", p->name);
            break;
        }
        memcpy(tmp, m->data, m->nbytes);
        s = ch_sgd_load_buffer(j->sgd, p->name, tmp, m->nbytes / sizeof(float));
        free(tmp);
    }
    const char *lsum = ch_safetensors_meta_get(st, "epoch_loss_sum");
    const char *lsteps = ch_safetensors_meta_get(st, "epoch_loss_steps");
    j->resumed_loss_sum = lsum ? strtod(lsum, NULL) : 0;
    j->resumed_loss_steps = lsteps ? strtoll(lsteps, NULL, 10) : 0;
    int64_t steps_per_epoch = ch_loader_num_batches(j->train_loader);
    if (j->max_steps > 0 && j->max_steps < steps_per_epoch) steps_per_epoch = j->max_steps;
    if (s == CH_OK) {
        j->start_epoch = (int)info.epoch;
        j->global_step = info.global_step;
        j->start_step_in_epoch = info.global_step - info.epoch * steps_per_epoch;
        if (j->start_step_in_epoch < 0 || j->start_step_in_epoch >= steps_per_epoch)
            s = CH_ERROR(CH_ERR_FORMAT, "%s: global step %lld does not fall in epoch %lld with "
                         "%lld steps per epoch (batch size or data changed?)", path,
                         (long long)info.global_step, (long long)info.epoch,
                         (long long)steps_per_epoch);
        else if (info.world_size != j->world && j->start_step_in_epoch != 0)
            s = CH_ERROR(CH_ERR_INVALID, "%s was written mid-epoch by %d ranks; resuming it "
                         "with %d ranks would change the data order (use %d ranks)", path,
                         info.world_size, j->world, info.world_size);
        else if ((uint64_t)j->seed != info.sampler_seed)
            s = CH_ERROR(CH_ERR_INVALID, "%s used train.seed %llu but this run has %lld", path,
                         (unsigned long long)info.sampler_seed, j->seed);
    }
    ch_safetensors_destroy(st);
    /* read into the host mirror: on to the device */
    if (s == CH_OK) s = ch_model_sync_to_device(j->model);
    return s;
}

static const char *resolve_resume(job_t *j)
{
    if (!j->resume_arg[0]) return NULL;
    if (strcmp(j->resume_arg, "auto")) return j->resume_arg;
    if (access(j->resume_path, R_OK) == 0) return j->resume_path;
    return NULL;
}

/* ------------------------------------------------------------------ training */

static void progress(job_t *j, int epoch, int64_t step, int64_t steps, double loss_step,
                     double loss_mean, double t_epoch, int64_t images, int final)
{
    if (j->rank != 0) return;
    double ips = t_epoch > 0 ? (double)images / t_epoch : 0;
    double eta = step > 0 ? t_epoch / (double)step * (double)(steps - step) : 0;
    if (j->is_tty) {
        int width = 30, filled = steps ? (int)(width * step / steps) : width;
        char bar[64];
        for (int i = 0; i < width; i++) bar[i] = i < filled ? '#' : '.';
        bar[width] = 0;
        fprintf(stderr, "\repoch %d [%s] %lld/%lld  %.0f img/s  ETA %.0fs  loss %.4f%s", epoch,
                bar, (long long)step, (long long)steps, ips, eta, loss_mean, final ? "\n" : "");
        fflush(stderr);
    } else if (!final && (step % j->log_every == 0)) {
        fprintf(stderr, "epoch %d step %lld/%lld  %.0f img/s  ETA %.0fs  loss %.7f (mean %.4f)\n",
                epoch, (long long)step, (long long)steps, ips, eta, loss_step, loss_mean);
        fflush(stderr);
    }
}

typedef struct {
    double loss;      /* running mean of the all-reduced loss */
    double images_per_s;
    double seconds;
    int preempted;    /* signal number agreed by all ranks, 0 if none */
    int64_t steps_done;
    double loss_sum;
    int64_t loss_steps;
} epoch_result_t;

/* Forward, loss, backward (DDP buckets all-reduced as gradients become
 * ready), the wait for the buckets, and the SGD update, each timed in the
 * profile. *loss receives the local loss on CPU ranks; GPU ranks pass NULL
 * (read later with ch_model_loss_value, so the step is not stalled). */
static void train_step(job_t *j, const ch_tensor_t *x, const ch_tensor_t *y, float *loss)
{
    const ch_tensor_t *logits = NULL;
    ch_prof_begin(j->prof, PH_FORWARD);
    ch_check_fatal(ch_ddp_before_forward(j->ddp), "DDP");
    ch_check_fatal(ch_model_forward(j->model, j->cx, x, &logits), "forward");
    ch_check_fatal(ch_model_loss(j->model, j->cx, y, loss), "loss");
    ch_prof_end(j->prof, PH_FORWARD);
    ch_prof_begin(j->prof, PH_BACKWARD);
    ch_check_fatal(ch_model_backward(j->model, j->cx, NULL), "backward");
    ch_prof_end(j->prof, PH_BACKWARD);
    double wait = 0;
    ch_check_fatal(ch_ddp_finish(j->ddp, &wait), "gradient all-reduce");
    ch_prof_add(j->prof, PH_ALLREDUCE, wait);
    ch_prof_begin(j->prof, PH_OPTIM);
    ch_check_fatal(ch_sgd_step(j->sgd), "optimizer");
    ch_prof_end(j->prof, PH_OPTIM);
}

/* After a step's optimizer update: the loss for logging (mean over ranks)
 * and the preemption flag in one all-reduce, so every rank stops at the
 * same step; a non-finite loss ends every rank; the progress line. Returns
 * 1 when the job is being preempted (stop the epoch here). */
static int end_step(job_t *j, int epoch, int64_t step, int64_t steps, float loss, double t0,
                    int64_t images, epoch_result_t *r)
{
    double v[2] = {loss, ch_preempt_pending() ? 1.0 : 0.0}, out[2];
    ch_prof_begin(j->prof, PH_ALLREDUCE);
    ch_check_fatal(ch_pg_allreduce(j->pg, v, out, 2, CH_DIST_FLOAT64, CH_REDUCE_SUM),
                   "loss all-reduce");
    ch_prof_end(j->prof, PH_ALLREDUCE);
    double lmean = out[0] / j->world;
    if (!isfinite(lmean)) {
        if (j->rank == 0)
            ch_log_error("non-finite loss %g at epoch %d, step %lld of %lld (global step "
                         "%lld): stopping every rank", lmean, epoch, (long long)step + 1,
                         (long long)steps, (long long)j->global_step);
        ch_prof_destroy(j->prof);
        MPI_Finalize();
        exit(EXIT_ERROR);
    }
    r->loss_sum += lmean;
    r->loss_steps++;
    r->steps_done = step + 1;
    progress(j, epoch, step + 1, steps, lmean, r->loss_sum / (double)r->loss_steps,
             ch_time_now() - t0, images * j->world, 0);
    if (out[1] > 0) {
        r->preempted = ch_preempt_pending() ? ch_preempt_pending() : 1;
        return 1;
    }
    return 0;
}

/* Epoch totals and the epoch's last progress line. */
static void end_epoch(job_t *j, int epoch, int64_t first_step, int64_t steps, double t0,
                      int64_t images, epoch_result_t *r)
{
    r->seconds = ch_time_now() - t0;
    r->loss = r->loss_steps ? r->loss_sum / (double)r->loss_steps : 0;
    r->images_per_s = r->seconds > 0 ? (double)(images * j->world) / r->seconds : 0;
    if (r->steps_done == 0) r->steps_done = first_step;
    if (!r->preempted)
        progress(j, epoch, r->steps_done, steps, r->loss, r->loss, r->seconds, images * j->world, 1);
}

/* GPU ranks: queue the host -> device copy of batch b (page-locked loader
 * slot) into device input slot `slot` on the copy stream, and describe the
 * device views in *x / *y (the first b->n samples of the slot). */
static ch_status upload_batch(job_t *j, const ch_batch_t *b, int slot, ch_tensor_t *x,
                              ch_tensor_t *y)
{
    int64_t xs[4] = {b->n, b->c, b->h, b->w}, ys[1] = {b->n};
    ch_tensor_t hx, hy;
    const int64_t need = b->n * b->c * b->h * b->w;
    if (need > ch_tensor_numel(&j->x_dev[slot]) || b->n > ch_tensor_numel(&j->y_dev[slot]))
        return CH_ERROR(CH_ERR_INTERNAL, "batch of %lld x %dx%dx%d does not fit the device input "
                        "slot of %lld floats", (long long)b->n, b->c, b->h, b->w,
                        (long long)ch_tensor_numel(&j->x_dev[slot]));
    CH_TRY(ch_tensor_wrap(&hx, b->images, CH_F32, 4, xs, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    CH_TRY(ch_tensor_wrap(&hy, b->labels, CH_I64, 1, ys, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    CH_TRY(ch_tensor_wrap(x, j->x_dev[slot].data, CH_F32, 4, xs, CH_LAYOUT_PLAIN, CH_DEV_CUDA,
                          j->env.device));
    CH_TRY(ch_tensor_wrap(y, j->y_dev[slot].data, CH_I64, 1, ys, CH_LAYOUT_PLAIN, CH_DEV_CUDA,
                          j->env.device));
    if (b->n == 0) return CH_OK;
    CH_TRY(ch_op_upload_async(j->cx, &hx, x));
    return ch_op_upload_async(j->cx, &hy, y);
}

/* Device input slots for the larger of the train and test batches. */
static ch_status alloc_device_inputs(job_t *j)
{
    int c, h, w;
    ch_loader_sample_shape(j->train_loader, &c, &h, &w);
    int64_t per = (int64_t)c * h * w;
    if (j->test_loader) {
        ch_loader_sample_shape(j->test_loader, &c, &h, &w);
        if ((int64_t)c * h * w > per) per = (int64_t)c * h * w;
    }
    int64_t nx = (int64_t)j->batch_size * per, ny = j->batch_size;
    for (int k = 0; k < 2; k++) {
        CH_TRY(ch_tensor_alloc(&j->x_dev[k], CH_F32, 1, &nx, CH_LAYOUT_PLAIN, CH_DEV_CUDA,
                               j->env.device));
        CH_TRY(ch_tensor_alloc(&j->y_dev[k], CH_I64, 1, &ny, CH_LAYOUT_PLAIN, CH_DEV_CUDA,
                               j->env.device));
    }
    return CH_OK;
}

/* One training epoch on a GPU rank. Batch k+1 is fetched from the loader
 * and its copy queued on the copy stream right after step k's kernels are
 * queued, so the copy overlaps step k's compute. The device slot it
 * overwrites was read by step k-1, which has finished: every step ends with
 * ch_model_loss_value, a host wait for all queued work. At the top of each
 * step ch_compute_wait_upload makes the compute stream wait for the copy
 * and the host for the reads of the pinned slot, which then goes back to
 * the loader. Errors end the whole job (ch_fatal). */
static void train_epoch_gpu(job_t *j, int epoch, int64_t first_step, int64_t steps,
                            epoch_result_t *r)
{
    double t0 = ch_time_now();
    int64_t images = 0;
    ch_batch_t *next = NULL;
    ch_tensor_t xv[2], yv[2];
    int slot = 0;
    if (first_step < steps) {
        ch_prof_begin(j->prof, PH_DATA);
        if (ch_loader_next(j->train_loader, &next)) ch_fatal("reading training data", EXIT_ERROR);
        if (next) ch_check_fatal(upload_batch(j, next, slot, &xv[slot], &yv[slot]), "batch upload");
        ch_prof_end(j->prof, PH_DATA);
    }
    for (int64_t step = first_step; step < steps; step++) {
        ch_batch_t *b = next;
        next = NULL;
        if (!b) break;
        ch_prof_begin(j->prof, PH_DATA);
        ch_check_fatal(ch_compute_wait_upload(j->cx), "batch upload");
        const int64_t n = b->n;
        ch_loader_release(j->train_loader, b);
        ch_prof_end(j->prof, PH_DATA);
        train_step(j, &xv[slot], &yv[slot], NULL);
        /* the next batch's copy overlaps this step's kernels */
        if (step + 1 < steps) {
            ch_prof_begin(j->prof, PH_DATA);
            if (ch_loader_next(j->train_loader, &next))
                ch_fatal("reading training data", EXIT_ERROR);
            if (next)
                ch_check_fatal(upload_batch(j, next, slot ^ 1, &xv[slot ^ 1], &yv[slot ^ 1]),
                               "batch upload");
            ch_prof_end(j->prof, PH_DATA);
        }
        /* waits for the step (and thereby frees slot `slot` for step k+2) */
        float loss = 0;
        ch_prof_begin(j->prof, PH_GPU_WAIT);
        ch_check_fatal(ch_model_loss_value(j->model, j->cx, &loss), "loss");
        ch_prof_end(j->prof, PH_GPU_WAIT);
        slot ^= 1;
        images += n;
        j->global_step++;
        if (end_step(j, epoch, step, steps, loss, t0, images, r)) break;
    }
    if (next) {
        /* fetched and uploading but not trained on (preemption): let the
         * copy finish reading the slot before it goes back */
        ch_check_fatal(ch_compute_wait_upload(j->cx), "batch upload");
        ch_loader_release(j->train_loader, next);
    }
    end_epoch(j, epoch, first_step, steps, t0, images, r);
}

/* One training epoch. Errors inside the step loop end the whole job
 * (ch_fatal): other ranks would otherwise wait in a collective. */
static void train_epoch(job_t *j, int epoch, int64_t first_step, epoch_result_t *r)
{
    int64_t steps = ch_loader_num_batches(j->train_loader);
    if (j->max_steps > 0 && j->max_steps < steps) steps = j->max_steps;
    memset(r, 0, sizeof *r);
    r->loss_sum = first_step ? j->resumed_loss_sum : 0;
    r->loss_steps = first_step ? j->resumed_loss_steps : 0;
    ch_model_train(j->model, 1);
    /* resuming mid-epoch: the same batches from first_step on, the skipped
     * ones not even loaded */
    ch_check_fatal(ch_loader_start_epoch_at(j->train_loader, epoch, first_step), "loader");
    if (j->on_gpu) {
        train_epoch_gpu(j, epoch, first_step, steps, r);
        return;
    }
    double t0 = ch_time_now();
    int64_t images = 0;
    for (int64_t step = first_step; step < steps; step++) {
        ch_batch_t *b = NULL;
        ch_prof_begin(j->prof, PH_DATA);
        ch_status s = ch_loader_next(j->train_loader, &b);
        ch_prof_end(j->prof, PH_DATA);
        if (s) ch_fatal("reading training data", EXIT_ERROR);
        if (!b) break;
        int64_t xs[4] = {b->n, b->c, b->h, b->w}, ys[1] = {b->n};
        ch_tensor_t x, y;
        ch_check_fatal(ch_tensor_wrap(&x, b->images, CH_F32, 4, xs, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0),
                       "batch");
        ch_check_fatal(ch_tensor_wrap(&y, b->labels, CH_I64, 1, ys, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0),
                       "batch");
        float loss = 0;
        train_step(j, &x, &y, &loss);
        images += b->n;
        ch_loader_release(j->train_loader, b);
        j->global_step++;
        if (end_step(j, epoch, step, steps, loss, t0, images, r)) break;
    }
    end_epoch(j, epoch, first_step, steps, t0, images, r);
}

/* Evaluation: correct counts all-reduced. Returns the seed's accuracy
 * (correct over total_size, padded duplicates included) and the exact one
 * (over the n real samples). */
static void evaluate(job_t *j, int epoch, double *acc_seed, double *acc_exact)
{
    double counts[2] = {0, 0}, total[2];
    ch_model_train(j->model, 0);
    ch_check_fatal(ch_loader_start_epoch(j->test_loader, epoch), "loader");
    for (;;) {
        ch_batch_t *b = NULL;
        if (ch_loader_next(j->test_loader, &b)) ch_fatal("reading test data", EXIT_ERROR);
        if (!b) break;
        int64_t xs[4] = {b->n, b->c, b->h, b->w};
        ch_tensor_t x;
        const ch_tensor_t *logits = NULL;
        if (j->on_gpu) {
            /* accuracy on the device: count_correct returns host values */
            ch_tensor_t y, lr, yr;
            ch_check_fatal(upload_batch(j, b, 0, &x, &y), "batch upload");
            ch_check_fatal(ch_compute_wait_upload(j->cx), "batch upload");
            const int64_t n = b->n, n_real = b->n_real;
            ch_loader_release(j->test_loader, b);
            if (n == 0) continue;
            int64_t all = 0, real = 0;
            ch_check_fatal(ch_model_forward(j->model, j->cx, &x, &logits), "eval forward");
            ch_check_fatal(ch_op_count_correct(j->cx, logits, &y, &all), "accuracy");
            real = all;
            if (n_real < n) {
                /* the first n_real rows are the real samples */
                int64_t ls[2] = {n_real, logits->shape[1]}, ys1[1] = {n_real};
                real = 0;
                if (n_real > 0) {
                    ch_check_fatal(ch_tensor_wrap(&lr, logits->data, CH_F32, 2, ls, CH_LAYOUT_PLAIN,
                                                  logits->dev, logits->dev_index), "accuracy");
                    ch_check_fatal(ch_tensor_wrap(&yr, y.data, CH_I64, 1, ys1, CH_LAYOUT_PLAIN,
                                                  y.dev, y.dev_index), "accuracy");
                    ch_check_fatal(ch_op_count_correct(j->cx, &lr, &yr, &real), "accuracy");
                }
            }
            counts[0] += (double)all;
            counts[1] += (double)real;
            continue;
        }
        ch_check_fatal(ch_tensor_wrap(&x, b->images, CH_F32, 4, xs, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0),
                       "batch");
        ch_check_fatal(ch_model_forward(j->model, j->cx, &x, &logits), "eval forward");
        const float *lg = ch_tensor_f32(logits);
        int k = j->num_classes;
        for (int64_t i = 0; i < b->n; i++) {
            int best = 0;
            for (int c = 1; c < k; c++)
                if (lg[i * k + c] > lg[i * k + best]) best = c;
            if (best == b->labels[i]) {
                counts[0] += 1;
                if (i < b->n_real) counts[1] += 1;
            }
        }
        ch_loader_release(j->test_loader, b);
    }
    ch_check_fatal(ch_pg_allreduce(j->pg, counts, total, 2, CH_DIST_FLOAT64, CH_REDUCE_SUM),
                   "accuracy all-reduce");
    const ch_sampler_t *smp = ch_loader_sampler(j->test_loader);
    *acc_seed = total[0] / (double)ch_sampler_total_size(smp);
    *acc_exact = total[1] / (double)ch_sampler_dataset_length(smp);
}

/* Rank 0 writes, then everyone meets at a barrier (readers may follow). */
static void checkpoint(job_t *j, int model_epoch, int resume_epoch, int64_t global_step,
                       int write_model, double loss_sum, int64_t loss_steps)
{
    ch_status s = CH_OK;
    ch_prof_begin(j->prof, PH_CKPT);
    if (j->rank == 0) {
        /* GPU: the state dict views point into the host mirror */
        s = ch_model_sync_to_host(j->model);
        if (s == CH_OK && write_model) {
            char path[4200];
            snprintf(path, sizeof path, "%s/model-%d.safetensors", j->out_dir, model_epoch);
            s = save_model_file(j, path);
        }
        if (s == CH_OK) s = save_resume(j, resume_epoch, global_step, loss_sum, loss_steps);
    }
    if (agree(j, s, "writing checkpoint")) {
        MPI_Finalize();
        exit(EXIT_ERROR);
    }
    ch_prof_end(j->prof, PH_CKPT);
}

/* ------------------------------------------------------------------ main */

/* mkdir -p: create dir and every missing parent (mode 0777 & ~umask). */
static ch_status make_dirs(const char *dir)
{
    char path[4096];
    size_t n = strlen(dir);
    if (n == 0 || n >= sizeof path) return CH_ERROR(CH_ERR_IO, "'%s': empty or too long", dir);
    memcpy(path, dir, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (path[i] != '/' && path[i] != 0) continue;
        char c = path[i];
        path[i] = 0;
        if (mkdir(path, 0777) && errno != EEXIST)
            return CH_ERROR(CH_ERR_IO, "cannot create '%s': %s", path, strerror(errno));
        path[i] = c;
    }
    return CH_OK;
}

static int setup(job_t *j)
{
    ch_status s;
    /* device choice and the per-node duplicate check */
    ch_device_rule rule;
    s = ch_device_rule_parse(j->device_rule_text, &rule);
    if (s == CH_OK) {
        int ndev = 0;
        s = ch_device_count(&ndev);
        if (s == CH_OK) s = ch_env_choose_device(&j->env, rule, ndev);
    }
    /* every rank takes part, also one whose own choice failed */
    s = ch_env_check_devices_status(&j->env, s, MPI_COMM_WORLD);
    if (agree(j, s, "device selection")) return EXIT_BAD_INPUT;

    /* GPU ranks: all or none (the gradient collectives are NCCL or MPI for
     * the whole world) */
    j->on_gpu = j->env.device >= 0;
    {
        int mine[2] = {j->on_gpu, -j->on_gpu}, red[2] = {0, 0};
        s = CH_OK;
        if (MPI_Allreduce(mine, red, 2, MPI_INT, MPI_MIN, ch_pg_mpi_comm(j->pg)) != MPI_SUCCESS)
            s = CH_ERROR(CH_ERR_MPI, "MPI_Allreduce of the GPU flags failed");
        else if (red[0] != -red[1])
            s = CH_ERROR(CH_ERR_INVALID, "some ranks have a GPU and others do not (this rank: %s); "
                         "run every rank on GPUs or every rank on CPUs",
                         j->on_gpu ? "GPU" : "no GPU");
        if (s == CH_OK && j->bf16 && !j->on_gpu)
            s = CH_ERROR(CH_ERR_CONFIG, "compute.bf16 = true needs a GPU, but this rank has none "
                         "(%s); bf16 autocast is implemented by the GPU backend only",
                         ch_device_backend_compiled() ? "no GPU visible"
                                                      : "cohort was built without CUDA");
        if (s == CH_OK && j->on_gpu) s = ch_device_set(j->env.device);
    }
    if (agree(j, s, "compute device")) return EXIT_BAD_INPUT;

    ch_compute_options_t co;
    ch_compute_options_default(&co);
    co.num_threads = j->threads;
    co.gpu_device = j->on_gpu ? j->env.device : -1;
    co.allow_tf32 = j->allow_tf32;
    co.bf16 = j->bf16;
    co.conv_search = j->conv_search;
    co.gpu_workspace_bytes = (size_t)j->gpu_workspace_mb << 20;
    s = ch_compute_create(&j->cx, &co);
    /* GPU state now (streams, handles), so failures show up here */
    if (s == CH_OK && j->on_gpu) {
        ch_error_clear();
        if (!ch_compute_stream(j->cx, CH_DEV_CUDA))
            s = ch_error_code() != CH_OK
                    ? ch_error_context("GPU %d: setting up the compute backend", j->env.device)
                    : CH_ERROR(CH_ERR_CUDA, "GPU %d: the compute backend could not set up its "
                               "streams and handles", j->env.device);
    }
    if (agree(j, s, "compute backend")) return EXIT_ERROR;
    if (j->on_gpu) {
        /* NCCL over the MPI world for gradients and SyncBN; a failure may
         * leave peers inside ncclCommInitRank, so it is fatal */
        ch_check_fatal(ch_pg_create_nccl(j->pg, j->env.device, &j->nccl), "NCCL process group");
        s = ch_pg_nccl_set_stream(j->nccl, ch_compute_stream(j->cx, CH_DEV_CUDA));
        if (agree(j, s, "NCCL compute stream")) return EXIT_ERROR;
    }

    /* output directory: rank 0 creates and probes it */
    s = CH_OK;
    snprintf(j->resume_path, sizeof j->resume_path, "%s/resume.safetensors", j->out_dir);
    if (j->rank == 0) {
        s = make_dirs(j->out_dir);
        if (s == CH_OK) s = ch_checkpoint_check_dir(j->out_dir);
        /* temp files of a writer killed in an earlier run (the files
         * themselves are intact: writes are atomic) */
        int removed = 0;
        if (s == CH_OK) s = ch_atomic_file_remove_stale(j->resume_path, &removed);
        if (s == CH_OK && removed)
            ch_log_info("removed %d stale temporary file%s of %s", removed, removed == 1 ? "" : "s",
                        j->resume_path);
        if (s) ch_error_context("output.dir");
    }
    if (agree(j, s, "output directory")) return EXIT_BAD_INPUT;

    s = open_datasets(j);
    if (s == CH_OK) s = make_loaders(j);
    if (agree(j, s, "data")) return EXIT_BAD_INPUT;
    if (j->on_gpu) {
        s = alloc_device_inputs(j);
        if (agree(j, s, "device input buffers")) return EXIT_ERROR;
    }

    s = build_model(j);
    if (agree(j, s, "model")) return EXIT_BAD_INPUT;

    const char *resume = resolve_resume(j);
    s = CH_OK;
    if (resume) s = load_resume(j, resume);
    else if (j->resume_arg[0] && strcmp(j->resume_arg, "auto"))
        s = CH_ERROR(CH_ERR_IO, "output.resume: '%s' not found", j->resume_arg);
    if (agree(j, s, "resume")) return EXIT_BAD_INPUT;
    /* all ranks start identical: rank 0's parameters and buffers */
    s = ch_ddp_broadcast_state(j->ddp);
    if (agree(j, s, "broadcast of initial state")) return EXIT_ERROR;
    if (resume)
        ch_log_info("resumed from %s at epoch %d, step %lld of the epoch (global step %lld)",
                    resume, j->start_epoch, (long long)j->start_step_in_epoch,
                    (long long)j->global_step);
    else if (!strcmp(j->resume_arg, "auto"))
        ch_log_info("no resume file %s yet: starting from epoch 0", j->resume_path);

    if (j->rank == 0) {
        const char *cols[] = {"loss", "accuracy", "accuracy_exact", "learning_rate",
                              "images_per_sec", "seconds"};
        s = ch_metrics_open(&j->metrics, j->out_dir, "metrics.csv", cols, 6, j->start_epoch);
    }
    if (agree(j, s, "metrics files")) return EXIT_BAD_INPUT;
    s = ch_preempt_install(j->warning_signal);
    if (agree(j, s, "signal handlers")) return EXIT_ERROR;
    return EXIT_OK;
}

static void describe(job_t *j)
{
    if (j->rank != 0) return;
    char cxd[256];
    ch_compute_describe(j->cx, cxd, sizeof cxd);
    ch_log_info("cohort-train: %s, %d rank%s (%s), %s", j->arch, j->world, j->world == 1 ? "" : "s",
                j->env.note, j->env.device >= 0 ? "GPU" : "CPU");
    ch_log_info("compute: %s; %d thread%s per rank", cxd, ch_compute_num_threads(j->cx),
                ch_compute_num_threads(j->cx) == 1 ? "" : "s");
    if (j->on_gpu) {
        char name[256] = "?";
        if (ch_device_name(j->env.device, name, sizeof name) != CH_OK) ch_error_clear();
        ch_log_info("GPU: rank 0 on device %d (%s); %s, TF32 convolutions %s, conv algorithms by "
                    "%s, workspace cap %d MiB; gradients and SyncBN over NCCL",
                    j->env.device, name, j->bf16 ? "bf16 autocast" : "fp32",
                    j->allow_tf32 ? "on" : "off", j->conv_search_text, j->gpu_workspace_mb);
    }
    ch_log_info("data: %s (%s): %lld train / %lld test samples, batch %d per rank (%d global), "
                "%lld steps per epoch, %d workers",
                j->data_path, j->data_format, (long long)(j->train_ds)->length,
                (long long)(j->test_ds)->length, j->batch_size, j->batch_size * j->world,
                (long long)ch_loader_num_batches(j->train_loader), j->workers);
    ch_log_info("model: %zu parameters (%zu trainable), SyncBN %s, DDP %d bucket%s",
                ch_model_param_numel(j->model), ch_model_trainable_numel(j->model),
                j->converted_sync_bn ? "on" : "off", ch_ddp_num_buckets(j->ddp),
                ch_ddp_num_buckets(j->ddp) == 1 ? "" : "s");
    ch_log_info("optimizer: SGD lr %g x %d ranks = %g, momentum %g, weight decay %g%s; cosine "
                "schedule over %d epochs, lrf %g",
                j->lr, j->world, j->lr * j->world, j->momentum, j->weight_decay,
                j->nesterov ? ", nesterov" : "", j->epochs, j->lrf);
}

static void requeue_self(void)
{
    const char *id = getenv("SLURM_JOB_ID");
    if (!id || !*id) {
        ch_log_warn("dist.requeue: SLURM_JOB_ID is not set, not requeueing");
        return;
    }
    for (const char *p = id; *p; p++)
        if (*p < '0' || *p > '9') {
            ch_log_warn("dist.requeue: SLURM_JOB_ID '%s' is not a number", id);
            return;
        }
    char cmd[128];
    snprintf(cmd, sizeof cmd, "scontrol requeue %s", id);
    int rc = system(cmd);
    if (rc) ch_log_warn("dist.requeue: '%s' failed (status %d)", cmd, rc);
    else ch_log_info("requeued job %s", id);
}

static void cleanup(job_t *j)
{
    /* The preemption handlers stay installed (they only set a flag): a
     * warning signal that arrives during the final cleanup must not kill a
     * job that has finished its work. */
    if (j->metrics) (void)ch_metrics_destroy(j->metrics);
    ch_ddp_destroy(j->ddp);
    ch_sgd_destroy(j->sgd);
    ch_model_destroy(j->model);
    ch_loader_destroy(j->train_loader);
    ch_loader_destroy(j->test_loader);
    if (j->train_ds != j->train_base) ch_dataset_destroy(j->train_ds);
    if (j->test_ds != j->test_base) ch_dataset_destroy(j->test_ds);
    ch_dataset_destroy(j->train_base);
    ch_dataset_destroy(j->test_base);
    for (int k = 0; k < 2; k++) {
        ch_tensor_free(&j->x_dev[k]);
        ch_tensor_free(&j->y_dev[k]);
    }
    ch_compute_destroy(j->cx);
    ch_prof_destroy(j->prof);
    ch_pg_destroy(j->nccl);
    ch_pg_destroy(j->pg);
    ch_config_destroy(j->cfg);
}

int main(int argc, char **argv)
{
    job_t job, *j = &job;
    int provided = 0, rc = EXIT_OK, stopped_early = 0;
    memset(j, 0, sizeof *j);
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);

    /* identity first, so that every message carries the right rank */
    /* rank and world only: the GPU is chosen after the config is read
     * (dist.device_rule) */
    ch_env_options_t eo = {.needs_mpi_collectives = 1, .device_rule = CH_DEVICE_RULE_AUTO,
                           .identity_only = 1};
    ch_status s = ch_env_discover(&eo, &j->env);
    if (s) {
        fprintf(stderr, "cohort-train: %s\n", ch_error_message());
        MPI_Finalize();
        return EXIT_BAD_INPUT;
    }
    j->rank = j->env.rank;
    j->world = j->env.world_size;
    ch_log_set_rank(j->rank, j->world);
    /* COHORT_LOG_LEVEL=debug: every rank states who it is (and what Slurm
     * told it), to check a launch. */
    {
        const char *procid = getenv("SLURM_PROCID"), *ntasks = getenv("SLURM_NTASKS");
        ch_log_debug("identity: %s; node %s; SLURM_PROCID %s, SLURM_NTASKS %s", j->env.note,
                     j->env.node_name, procid ? procid : "-", ntasks ? ntasks : "-");
    }
    s = ch_pg_create_mpi(MPI_COMM_WORLD, &j->pg);
    if (s) ch_fatal("process group", EXIT_ERROR);

    int nargc = 0;
    char **nargv = rewrite_args(argc, argv, &nargc);
    s = ch_config_load(keys, N_KEYS, nargc, nargv, &j->cfg);
    free(nargv);
    if (s == CH_OK && ch_config_help_requested(j->cfg)) {
        /* ch_config_load printed the table (on rank 0) */
        cleanup(j);
        MPI_Finalize();
        return EXIT_OK;
    }
    if (s == CH_OK) s = read_config(j);
    if (s) {
        /* the same on every rank: rank 0 reports it once */
        if (j->rank == 0) fprintf(stderr, "cohort-train: %s\n", ch_error_message());
        cleanup(j);
        MPI_Finalize();
        return EXIT_BAD_INPUT;
    }
    j->is_tty = isatty(STDERR_FILENO);
    if (ch_prof_create(phase_names, PH_N, &j->prof)) ch_fatal("profiler", EXIT_ERROR);

    rc = setup(j);
    if (rc != EXIT_OK) {
        cleanup(j);
        MPI_Finalize();
        return rc;
    }
    describe(j);

    for (int epoch = j->start_epoch; epoch < j->epochs; epoch++) {
        ch_check_fatal(ch_lr_cosine_set_epoch(&j->sched, epoch), "schedule");
        double lr = ch_lr_cosine_get(&j->sched);
        ch_sgd_set_lr(j->sgd, lr);
        if (epoch == j->start_epoch)
            ch_log_info("epoch %d: learning rate %.8g", epoch, lr);
        epoch_result_t r;
        int64_t first = epoch == j->start_epoch ? j->start_step_in_epoch : 0;
        train_epoch(j, epoch, first, &r);
        /* A stop agreed at the epoch's last step: the epoch is trained, so
         * finish it (evaluation, model file, resume file at the next epoch's
         * step 0) and stop after it; a resume file at "step == steps per
         * epoch" would not be resumable. */
        int64_t epoch_steps = ch_loader_num_batches(j->train_loader);
        if (j->max_steps > 0 && j->max_steps < epoch_steps) epoch_steps = j->max_steps;
        int stop_after_epoch = r.preempted && r.steps_done >= epoch_steps;
        if (r.preempted && !stop_after_epoch) {
            ch_log_info("preemption signal %d: stopping at epoch %d step %lld (global step %lld); "
                        "writing %s", r.preempted, epoch, (long long)r.steps_done,
                        (long long)j->global_step, j->resume_path);
            checkpoint(j, epoch, epoch, j->global_step, 0, r.loss_sum, r.loss_steps);
            if (j->requeue && j->rank == 0) requeue_self();
            rc = EXIT_PREEMPTED;
            break;
        }
        double acc = NAN, acc_exact = NAN;
        if (j->do_eval) {
            ch_prof_begin(j->prof, PH_EVAL);
            evaluate(j, epoch, &acc, &acc_exact);
            ch_prof_end(j->prof, PH_EVAL);
        }
        if (j->do_eval)
            ch_log_info("epoch %d: loss %.4f  accuracy %.4f (exact %.4f over the %lld real test "
                        "samples)  lr %.6g  %.0f images/s  %.1f s",
                        epoch, r.loss, acc, acc_exact, (long long)j->test_ds->length, lr,
                        r.images_per_s, r.seconds);
        else
            ch_log_info("epoch %d: loss %.4f  lr %.6g  %.0f images/s  %.1f s", epoch, r.loss, lr,
                        r.images_per_s, r.seconds);
        if (j->rank == 0) {
            double vals[6] = {r.loss, acc, acc_exact, lr, r.images_per_s, r.seconds};
            if (ch_metrics_log_epoch(j->metrics, epoch, j->global_step, -1, vals))
                ch_log_warn("metrics: %s", ch_error_message());
        }
        int last = epoch + 1 == j->epochs;
        int save = last || (j->save_every > 0 && (epoch + 1) % j->save_every == 0);
        checkpoint(j, epoch, epoch + 1, j->global_step, save, 0, 0);
        if (save) ch_log_info("saved %s/model-%d.safetensors", j->out_dir, epoch);
        if (stop_after_epoch && !last) {
            ch_log_info("preemption signal %d at the end of epoch %d (global step %lld): "
                        "stopping; %s continues at epoch %d", r.preempted, epoch,
                        (long long)j->global_step, j->resume_path, epoch + 1);
            if (j->requeue && j->rank == 0) requeue_self();
            rc = EXIT_PREEMPTED;
            break;
        }
        if (j->stop_after > 0 && epoch + 1 - j->start_epoch >= j->stop_after && !last) {
            ch_log_info("stopping after %d epoch%s as train.stop_after asks; continue with "
                        "--resume", j->stop_after, j->stop_after == 1 ? "" : "s");
            stopped_early = 1;
            break;
        }
    }
    if (rc == EXIT_OK && !stopped_early) ch_log_info("training finished: %d epochs", j->epochs);
    ch_prof_report(j->prof, MPI_COMM_WORLD, stdout);
    cleanup(j);
    MPI_Finalize();
    return rc;
}
