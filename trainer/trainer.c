/* cohort: the trainer (trainer/trainer.h) — the data-parallel training loop
 * of the PyTorch DDP recipe, for a model built by name from the registry
 * (models/models.h: the built-in ResNets and what a program registered with
 * ch_model_register) or handed over by the caller.
 *
 * The recipe (SEMANTICS.md): DistributedSampler + BatchSampler(drop_last)
 * order, the model's init (torchvision's for the built-in ResNets, PyTorch's
 * reset_parameters for registered networks), SyncBatchNorm when asked,
 * the optimizer (SGD(momentum, weight decay), AdamW or RMSprop) with lr x
 * world size and the schedule (the seed's cosine LambdaLR, StepLR,
 * MultiStepLR, CosineAnnealingLR, after a LinearLR / ConstantLR warmup),
 * cross-entropy with label smoothing, DDP gradient averaging with buckets overlapped with backward,
 * evaluation with all-reduced correct counts, rank-0 checkpoints
 * (safetensors with torchvision names) and a resume file.
 *
 * Where the pieces live: the program's life (MPI, identity, config and
 * --help, device, compute, NCCL, output directory, profiler, preemption,
 * the agreed stop, progress, requeue, exit codes) framework/runtime/job.h;
 * datasets and loaders io/data/data.h, batches on the compute device
 * io/data/batch_feed.h, model and resume files io/state/train_state.h, DDP
 * framework/train/ddp.h, optimizers optimizer.h (SGD optim.h), schedules
 * schedule.h (cosine lr_schedule.h), the loss criterion.h; each brings
 * its own config keys. This file holds the recipe, the epoch loop and the
 * evaluation; jobs/cohort-train.c is ch_trainer_main.
 *
 * GPU ranks (a GPU visible and chosen by dist.device_rule; all ranks or
 * none): the model, its gradients, BN buffers, SyncBN statistics and the
 * optimizer state live on the device (ch_model_to_device); gradients and
 * SyncBN go over an NCCL group built over MPI whose compute stream is the
 * compute context's; the batch feed copies batches on the copy stream, the
 * next one while the current step computes; checkpoints and resume go
 * through the host mirror.
 */
#include "config.h"

#include "framework/core/configuration.h"
#include "framework/core/log.h"
#include "framework/core/status.h"
#include "framework/dist/dist.h"
#include "framework/launch/env.h"
#include "framework/nn/nn.h"
#include "framework/nn/nn_exec.h"
#include "framework/ops/ops.h"
#include "framework/runtime/job.h"
#include "framework/core/profiler.h"
#include "framework/tensor/device.h"
#include "framework/tensor/tensor.h"
#include "framework/train/ddp.h"
#include "framework/train/lr_schedule.h"
#include "framework/train/metrics.h"
#include "framework/train/optim.h"
#include "framework/train/criterion.h"
#include "framework/train/optimizer.h"
#include "framework/train/schedule.h"
#include "io/data/batch_feed.h"
#include "io/data/data.h"
#include "io/state/train_state.h"
#include "models/models.h"
#include "models/onnx_model.h"
#include "trainer/trainer.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zlib.h>

/* ------------------------------------------------------------------ keys */

/* The trainer's own keys; the objects bring theirs (io/data/data.h data.*,
 * framework/train/optim.h optimizer.*, lr_schedule.h schedule.*, ddp.h
 * dist.bucket_mb / dist.broadcast_buffers, io/state/train_state.h output.*). */
static ch_config_key_t train_keys[] = {
    {"model.arch", CH_CFG_STRING, "resnet18", CH_CFG_NO_RANGE,
     "Architecture: resnet18, resnet34, resnet50, smallcnn, or a network the program "
     "registered (ch_model_register)."},
    {"model.onnx", CH_CFG_STRING, "", CH_CFG_NO_RANGE,
     "An ONNX file to train instead of model.arch (which is then ignored): a graph exported "
     "by torch.onnx.export(model, x, path, training=torch.onnx.TrainingMode.TRAINING, "
     "do_constant_folding=False), built for the data's input shape from cohort's modules, "
     "starting from the file's weights, with the exporter's state-dict names (docs/onnx.md)."},
    {"model.num_classes", CH_CFG_INT, "10", 1, 1e6, "Classes (fc outputs)."},
    {"model.in_channels", CH_CFG_INT, "1", 1, 4, "Input image channels (1 for Fashion-MNIST)."},
    {"model.weights", CH_CFG_STRING, "", CH_CFG_NO_RANGE,
     "Pretrained state dict: safetensors, or PyTorch .pth/.pt (zip or legacy, read safely: "
     "nothing in it is executed), told apart by content (a leading 'module.' on every name is "
     "removed); entries whose name and shape match are loaded, the rest summarised and skipped."},
    {"model.weights_key", CH_CFG_STRING, "", CH_CFG_NO_RANGE,
     "In a .pth checkpoint dict, the key holding the state dict ('': the top level, else "
     "'model', 'state_dict' or 'model_state_dict', whichever holds one)."},
    {"model.weights_reshape", CH_CFG_BOOL, "false", CH_CFG_NO_RANGE,
     "Also load pretrained entries whose element count matches but whose shape differs "
     "(the seed's rule), warning once per reshaped tensor."},
    {"model.freeze_layers", CH_CFG_BOOL, "false", CH_CFG_NO_RANGE,
     "Train only parameters whose name contains 'fc'."},
    {"model.sync_bn", CH_CFG_BOOL, "true", CH_CFG_NO_RANGE,
     "Convert BatchNorm to SyncBatchNorm (ignored with freeze_layers or one rank)."},
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
};
#define N_TRAIN_KEYS ((int)(sizeof train_keys / sizeof train_keys[0]))

ch_config_table_t ch_trainer_config_table(void)
{
    ch_config_table_t t = {"train", train_keys, N_TRAIN_KEYS};
    return t;
}

/* On GPU ranks forward/backward/optimizer time the host queueing kernels;
 * the device's own time shows up as "gpu wait" (the end-of-step wait for the
 * loss value). */
/* "SyncBN comm fwd" ("bwd") is the part of forward (backward) spent inside
 * SyncBN's collectives (ch_model_sync_bn_seconds), not a phase of its own. */
enum { PH_DATA, PH_FORWARD, PH_BACKWARD, PH_ALLREDUCE, PH_OPTIM, PH_EVAL, PH_CKPT, PH_GPU_WAIT,
       PH_SYNCBN_F, PH_SYNCBN_B, PH_STAGE, PH_N };
static const char *const phase_names[PH_N + 1] = {"data wait", "forward",    "backward",
                                               "all-reduce wait", "optimizer", "eval",
                                               "checkpoint", "gpu wait", "SyncBN comm fwd",
                                               "SyncBN comm bwd", "data staging", NULL};

const char *const *ch_trainer_phase_names(int *n)
{
    if (n) *n = PH_N;
    return phase_names;
}

/* ------------------------------------------------------------------ trainer */

struct ch_trainer {
    /* configuration: the job's keys and the objects' options */
    ch_config_t *cfg;
    const char *arch, *weights, *onnx;
    uint32_t onnx_crc;   /* CRC-32 of model.onnx's bytes (the resume file records it) */
    int num_classes, in_channels, weights_reshape, freeze, sync_bn;
    int batch_size, log_every, stop_after, do_eval;
    long long seed, max_steps;
    ch_data_options_t data_opt;
    ch_optimizer_options_t opt_opt;
    ch_loss_options_t loss_opt;
    ch_ddp_options_t ddp_opt;
    ch_train_output_options_t out;
    /* the runtime's (ch_job accessors, cached). GPU ranks: the model,
     * gradients and SyncBN live on the device, collectives on them go
     * through the NCCL group; the loss and accuracy all-reduces stay on the
     * MPI group (host values) */
    ch_job_t *job;
    int rank, world, on_gpu, device;
    ch_pg_t *pg, *nccl;
    ch_compute_t *cx;
    ch_prof_t *prof;
    /* training */
    ch_data_t *data;
    ch_batch_feed_t *feed;
    ch_model_t *model;
    ch_optimizer_t *opt;
    ch_ddp_t *ddp;
    ch_lr_schedule_t sched;
    ch_metrics_t *metrics;
    char resume_path[4096];
    int start_epoch;
    int64_t steps_per_epoch, start_step_in_epoch, global_step;
    double resumed_loss_sum;
    int64_t resumed_loss_steps;
    int converted_sync_bn;
};
typedef struct ch_trainer trainer_t;

static ch_status read_config(trainer_t *j)
{
    ch_config_t *c = j->cfg;
    CH_TRY(ch_config_get_string(c, "model.arch", &j->arch));
    CH_TRY(ch_config_get_string(c, "model.onnx", &j->onnx));
    CH_TRY(ch_config_get_int(c, "model.num_classes", &j->num_classes));
    CH_TRY(ch_config_get_int(c, "model.in_channels", &j->in_channels));
    CH_TRY(ch_config_get_string(c, "model.weights", &j->weights));
    CH_TRY(ch_config_get_bool(c, "model.weights_reshape", &j->weights_reshape));
    CH_TRY(ch_config_get_bool(c, "model.freeze_layers", &j->freeze));
    CH_TRY(ch_config_get_bool(c, "model.sync_bn", &j->sync_bn));
    CH_TRY(ch_config_get_int(c, "train.batch_size", &j->batch_size));
    CH_TRY(ch_config_get_int64(c, "train.seed", &j->seed));
    CH_TRY(ch_config_get_int64(c, "train.max_steps", &j->max_steps));
    CH_TRY(ch_config_get_int(c, "train.log_every", &j->log_every));
    CH_TRY(ch_config_get_int(c, "train.stop_after", &j->stop_after));
    CH_TRY(ch_config_get_bool(c, "train.eval", &j->do_eval));
    CH_TRY(ch_data_options_from_config(c, &j->data_opt));
    CH_TRY(ch_data_options_check_channels(&j->data_opt, j->in_channels));
    CH_TRY(ch_optimizer_options_from_config(c, &j->opt_opt));
    CH_TRY(ch_loss_options_from_config(c, &j->loss_opt));
    CH_TRY(ch_ddp_options_from_config(c, &j->ddp_opt));
    CH_TRY(ch_train_output_options_from_config(c, &j->out));
    CH_TRY(ch_train_output_resume_path(&j->out, j->resume_path, sizeof j->resume_path));
    return CH_OK;
}

/* ------------------------------------------------------------------ model */

/* The resume file's configuration text ends with this line for a model
 * from model.onnx: the file's contents, not its path, identify the network
 * (model.onnx itself is a free key: a moved or relative path resumes). */
#define ONNX_CRC_MARK "# cohort: model.onnx CRC-32 "

static ch_status file_crc32(const char *path, uint32_t *crc)
{
    FILE *f = fopen(path, "rb");
    if (!f) return CH_ERROR(CH_ERR_IO, "model.onnx %s: %s", path, strerror(errno));
    unsigned char buf[1 << 16];
    uLong c = crc32(0L, Z_NULL, 0);
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) c = crc32(c, buf, (uInt)n);
    int bad = ferror(f);
    fclose(f);
    if (bad) return CH_ERROR(CH_ERR_IO, "model.onnx %s: read failed", path);
    *crc = (uint32_t)c;
    return CH_OK;
}

/* The model (pretrained weights, freezing, device, SyncBN), its DDP, the
 * optimizer (optimizer.name) with lr x world size, its loss's label
 * smoothing and the schedule (schedule.name). */
static ch_status build_model(trainer_t *j)
{
    ch_model_options_t mo;
    ch_model_options_default(&mo);
    mo.num_classes = j->num_classes;
    mo.in_channels = j->in_channels;
    mo.seed = (uint64_t)j->seed;
    if (!j->model && j->onnx[0]) {
        /* the graph of the file, for the batches the loader makes */
        int c = 0, h = 0, w = 0;
        ch_loader_sample_shape(j->data->train_loader, &c, &h, &w);
        int64_t shape[4] = {j->batch_size, c, h, w};
        ch_onnx_map_options_t oo;
        ch_onnx_map_options_default(&oo);
        oo.num_classes = j->num_classes;
        CH_TRY(ch_onnx_model_load(j->onnx, shape, &oo, &j->model));
        CH_TRY(file_crc32(j->onnx, &j->onnx_crc));
        ch_log_info("model.onnx: %s, %d state-dict entries (model.arch '%s' not used)", j->onnx,
                    ch_model_num_entries(j->model), j->arch);
    }
    if (!j->model) CH_TRY(ch_model_create(j->arch, &mo, &j->model));
    if (j->weights[0]) {
        ch_pretrained_options_t po;
        ch_pretrained_options_default(&po);
        po.reshape = j->weights_reshape;
        CH_TRY(ch_config_get_string(j->cfg, "model.weights_key", &po.weights_key));
        CH_TRY(ch_train_state_load_pretrained(j->model, j->weights, &po, NULL));
    }
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
        CH_TRY(ch_model_to_device(j->model, CH_DEV_CUDA, j->device));
        grad_pg = j->nccl;
    }
    if (j->sync_bn && !j->freeze && j->world > 1)
        CH_TRY(ch_ddp_convert_sync_bn(j->model, grad_pg, j->pg, &j->converted_sync_bn));
    ch_ddp_options_t dopt = j->ddp_opt;
    dopt.broadcast_buffers = dopt.broadcast_buffers && !j->converted_sync_bn;
    CH_TRY(ch_ddp_create(j->model, grad_pg, &dopt, &j->ddp));
    CH_TRY(ch_ddp_set_compute(j->ddp, j->cx));
    CH_TRY(ch_model_set_label_smoothing(j->model, j->loss_opt.label_smoothing));
    ch_optimizer_options_t oo = j->opt_opt;
    oo.lr = j->opt_opt.lr * j->world; /* linear scaling rule */
    CH_TRY(ch_optimizer_create(&oo, &j->opt));
    ch_optimizer_set_compute(j->opt, j->cx);
    CH_TRY(ch_optimizer_add_model(j->opt, j->model));
    ch_lr_schedule_options_t so;
    CH_TRY(ch_lr_schedule_options_from_config(j->cfg, oo.lr, &so));
    return ch_lr_schedule_init(&j->sched, &so);
}

/* Keys that may differ between a run and the one it resumes: they do not
 * change the trained parameters beyond fp32 rounding (logging, evaluation,
 * loader parallelism, threads, the CPU convolution algorithm — like the
 * ISA of the node a requeued job lands on —, checkpoint cadence and place,
 * the launch's signal and requeue settings, the device rule). Every other
 * key, present or added later, must match or be listed in
 * output.resume_allow. */
static const char *const resume_free_keys[] = {
    "train.threads", "train.log_every", "train.stop_after", "train.eval", "data.workers",
    "data.prefetch", "output.", "dist.device_rule", "dist.requeue", "dist.warning_signal",
    "compute.cpu_conv_algorithm", "model.onnx", /* the file's CRC-32 is compared instead;
                                                   last: resume() leaves it out by count */
};

/* Continue from a resume file: the saved configuration compared with this
 * run's, then model, momentum, progress; at an epoch boundary any world
 * size, mid-epoch only the writer's. */
static ch_status resume(trainer_t *j, const char *path)
{
    char *saved_cfg = NULL;
    CH_TRY(ch_train_state_read_config(path, &saved_cfg));
    /* an ONNX network: the same file contents as the resumed run's (checked
     * first: the configuration check below logs a changed model.onnx path
     * as a change that does not matter, which holds only for the same bytes) */
    ch_status s = CH_OK;
    const char *mark = saved_cfg ? strstr(saved_cfg, ONNX_CRC_MARK) : NULL;
    unsigned saved_crc = 0;
    const int saved_onnx = mark && sscanf(mark + strlen(ONNX_CRC_MARK), "%8x", &saved_crc) == 1;
    const int n_free = (int)(sizeof resume_free_keys / sizeof resume_free_keys[0]);
    if (s == CH_OK && j->onnx[0] && saved_onnx && saved_crc != j->onnx_crc) {
        /* the other keys that differ are named in the same line (the
         * configuration compared with model.onnx, the list's last entry,
         * not free) */
        char other[CH_ERROR_MAX] = "";
        if (ch_train_resume_config_check(path, saved_cfg, j->cfg, resume_free_keys, n_free - 1)) {
            const char *m = ch_error_message();
            size_t pl = strlen(path);
            if (!strncmp(m, path, pl) && !strncmp(m + pl, ": ", 2)) m += pl + 2;
            snprintf(other, sizeof other, "; also, %s", m);
        }
        s = CH_ERROR(CH_ERR_INVALID, "%s: model.onnx %s is another network than the resumed run's "
                     "(its bytes have CRC-32 %08x, the resumed run's file had %08x)%s", path,
                     j->onnx, (unsigned)j->onnx_crc, saved_crc, other);
    } else if (s == CH_OK && j->onnx[0] != 0 && !saved_onnx && saved_cfg && saved_cfg[0])
        s = CH_ERROR(CH_ERR_INVALID, "%s: the resumed run did not train a model.onnx network; this "
                     "run's model is %s", path, j->onnx);
    else if (s == CH_OK && !j->onnx[0] && saved_onnx)
        s = CH_ERROR(CH_ERR_INVALID, "%s: the resumed run trained a model.onnx network; give "
                     "--model.onnx with that file", path);
    if (s == CH_OK)
        s = ch_train_resume_config_check(path, saved_cfg, j->cfg, resume_free_keys, n_free);
    free(saved_cfg);
    CH_TRY(s);
    ch_train_progress_t saved;
    CH_TRY(ch_train_state_read_resume_optimizer(j->model, j->opt, path, &saved));
    CH_TRY(ch_train_resume_check(path, &saved, j->world, j->steps_per_epoch, (uint64_t)j->seed,
                                 &j->start_step_in_epoch));
    j->start_epoch = saved.epoch;
    j->global_step = saved.global_step;
    j->resumed_loss_sum = saved.epoch_loss_sum;
    j->resumed_loss_steps = saved.epoch_loss_steps;
    if (saved.world_size != j->world)
        ch_log_info("resume: %s was written by %d rank%s, this run has %d: epoch %d starts with "
                    "its data order for %d rank%s, learning rate rescaled to the new world "
                    "(%g x %d = %g, was %g)", path, saved.world_size,
                    saved.world_size == 1 ? "" : "s", j->world, j->start_epoch, j->world,
                    j->world == 1 ? "" : "s", j->opt_opt.lr, j->world,
                    j->opt_opt.lr * j->world, j->opt_opt.lr * saved.world_size);
    return CH_OK;
}

/* The effective configuration for the resume file. The keys of the tables
 * newer than resume files (optimizer.name and AdamW's / RMSprop's keys,
 * schedule.name and its keys, loss.*) are written only when they differ
 * from their defaults: a run that does not use them writes the file of
 * old, byte for byte, and ch_config_compare_dump takes a key the file
 * lacks as its default. */
static ch_status dump_config_text(const ch_config_t *cfg, char **text);

static ch_status dump_config(const trainer_t *j, char **text)
{
    CH_TRY(dump_config_text(j->cfg, text));
    if (!j->onnx[0]) return CH_OK;
    size_t l = strlen(*text);
    char *t = realloc(*text, l + sizeof ONNX_CRC_MARK + 16);
    if (!t) return CH_ERROR(CH_ERR_NOMEM, "configuration text");
    snprintf(t + l, sizeof ONNX_CRC_MARK + 16, "%s%08x\n", ONNX_CRC_MARK, (unsigned)j->onnx_crc);
    *text = t;
    return CH_OK;
}

static ch_status dump_config_text(const ch_config_t *cfg, char **text)
{
    const ch_config_table_t t[] = {ch_optimizer_config_table(), ch_lr_schedule_config_table(),
                                   ch_loss_config_table()};
    const char *names[64];
    int n = 0;
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        for (int k = 0; k < t[i].n_keys && n < 64; k++) names[n++] = t[i].keys[k].name;
    return ch_config_dump_string_quiet(cfg, names, n, text);
}

/* Rank 0 writes, then everyone learns the verdict (readers may follow). A
 * model file for model_epoch when write_model; the resume file at
 * (resume_epoch, epoch_step). Returns 1 when the write failed (on every
 * rank). */
static int checkpoint(trainer_t *j, int model_epoch, int resume_epoch, int64_t epoch_step,
                      int write_model, double loss_sum, int64_t loss_steps)
{
    ch_status s = CH_OK;
    ch_prof_begin(j->prof, PH_CKPT);
    if (j->rank == 0) {
        char path[4200], *cfg_text = NULL;
        if (write_model) {
            s = ch_train_output_model_path(&j->out, model_epoch, path, sizeof path);
            if (s == CH_OK) s = ch_train_state_write_model(j->model, path);
        }
        if (s == CH_OK) s = dump_config(j, &cfg_text);
        ch_train_progress_t p = {.epoch = resume_epoch, .global_step = j->global_step,
                                 .epoch_step = epoch_step, .epoch_steps = j->steps_per_epoch,
                                 .seed = (uint64_t)j->seed, .world_size = j->world,
                                 .epoch_loss_sum = loss_sum, .epoch_loss_steps = loss_steps};
        if (s == CH_OK)
            s = ch_train_state_write_resume_optimizer(j->model, j->opt, j->resume_path, &p,
                                                      cfg_text);
        free(cfg_text);
    }
    int failed = ch_job_agree(j->job, s, "writing checkpoint");
    ch_prof_end(j->prof, PH_CKPT);
    return failed;
}

/* ------------------------------------------------------------------ training */

typedef struct {
    double loss;      /* running mean of the all-reduced loss */
    double images_per_s;
    double seconds;
    int stop;         /* 1: a stop agreed by all ranks (ch_job_stop_reasons says why) */
    int64_t steps_done;
    double loss_sum;
    int64_t loss_steps;
} epoch_result_t;

/* A step's collective failed (status s). MPI errors return (the runtime
 * sets that up), and a failed MPI collective means a peer rank is gone: the
 * runtime's own agreement then fails too, says in one line which rank it
 * was, and ch_job_finalize ends with CH_EXIT_PEER_LOST; returns 1. Any
 * other failure ends every rank now (ch_fatal): the others would wait in a
 * collective. */
static int step_failed(trainer_t *j, ch_status s, const char *what)
{
    if (s == CH_ERR_MPI && (ch_job_stop_agree(j->job, 0) & CH_STOP_PEER_LOST)) return 1;
    ch_fatal(what, CH_EXIT_ERROR);
}

/* Forward, loss, backward (DDP buckets all-reduced as gradients become
 * ready), the wait for the buckets, and the optimizer update, each timed in the
 * profile. On a GPU this queues kernels; the loss is read afterwards
 * (ch_model_loss_value), so the step is not stalled. Returns 1 when a peer
 * rank is gone (step_failed); other errors end the whole job (ch_fatal). */
static int train_step(trainer_t *j, const ch_tensor_t *x, const ch_tensor_t *y)
{
    const ch_tensor_t *logits = NULL;
    ch_status s;
    double sync0 = ch_model_sync_bn_seconds(j->model);
    ch_prof_begin(j->prof, PH_FORWARD);
    if ((s = ch_ddp_before_forward(j->ddp))) return step_failed(j, s, "DDP buffer broadcast");
    ch_check_fatal(ch_model_forward(j->model, j->cx, x, &logits), "forward");
    ch_check_fatal(ch_model_loss(j->model, j->cx, y, NULL), "loss");
    ch_prof_end(j->prof, PH_FORWARD);
    double sync1 = ch_model_sync_bn_seconds(j->model);
    if (j->converted_sync_bn) ch_prof_add(j->prof, PH_SYNCBN_F, sync1 - sync0);
    ch_prof_begin(j->prof, PH_BACKWARD);
    ch_check_fatal(ch_model_backward(j->model, j->cx, NULL), "backward");
    ch_prof_end(j->prof, PH_BACKWARD);
    if (j->converted_sync_bn)
        ch_prof_add(j->prof, PH_SYNCBN_B, ch_model_sync_bn_seconds(j->model) - sync1);
    double wait = 0;
    if ((s = ch_ddp_finish(j->ddp, &wait))) return step_failed(j, s, "gradient all-reduce");
    ch_prof_add(j->prof, PH_ALLREDUCE, wait);
    ch_prof_begin(j->prof, PH_OPTIM);
    ch_check_fatal(ch_optimizer_step(j->opt), "optimizer");
    ch_prof_end(j->prof, PH_OPTIM);
    return 0;
}

/* After a step's optimizer update: the loss for logging (mean over ranks)
 * and the runtime's stop flag (ch_job_stop_local: preemption, stop file) in
 * one all-reduce, so every rank stops at the same step; a non-finite mean
 * loss adds CH_STOP_NONFINITE; the agreed reasons go to ch_job_stop_set;
 * the progress line. Returns 1 when the epoch stops here (the same on every
 * rank). */
enum { STOP_BITS = 8 };
static int end_step(trainer_t *j, int epoch, int64_t step, int64_t steps, float loss, double t0,
                    int64_t images, epoch_result_t *r)
{
    /* the loss, then one 0/1 value per stop bit: summed, > 0 means some
     * rank set it (an OR over ranks inside the SUM all-reduce) */
    double v[1 + STOP_BITS], out[1 + STOP_BITS];
    ch_job_heartbeat(j->job); /* dist.timeout: a step boundary */
    ch_job_test_hold(j->job, "step", (long long)j->global_step); /* tests only */
    int local = ch_job_stop_local(j->job, 0), agreed = 0;
    v[0] = loss;
    for (int k = 0; k < STOP_BITS; k++) v[1 + k] = (local >> k) & 1;
    ch_prof_begin(j->prof, PH_ALLREDUCE);
    ch_status s = ch_pg_allreduce(j->pg, v, out, 1 + STOP_BITS, CH_DIST_FLOAT64, CH_REDUCE_SUM);
    ch_prof_end(j->prof, PH_ALLREDUCE);
    if (s) return r->stop = step_failed(j, s, "loss all-reduce");
    for (int k = 0; k < STOP_BITS; k++)
        if (out[1 + k] > 0) agreed |= 1 << k;
    double lmean = out[0] / j->world;
    if (!isfinite(lmean)) agreed |= CH_STOP_NONFINITE;
    ch_job_stop_set(j->job, agreed);
    r->stop = agreed != 0;
    r->steps_done = step + 1;
    if (!isfinite(lmean)) {
        if (j->rank == 0)
            ch_log_error("non-finite loss %g at epoch %d, step %lld of %lld (global step "
                         "%lld): stopping every rank", lmean, epoch, (long long)step + 1,
                         (long long)steps, (long long)j->global_step);
        return 1;
    }
    r->loss_sum += lmean;
    r->loss_steps++;
    char what[48], text[128];
    double t = ch_time_now() - t0;
    snprintf(what, sizeof what, "epoch %d step", epoch);
    snprintf(text, sizeof text, "%.0f img/s  loss %.7f (mean %.4f)",
             t > 0 ? (double)(images * j->world) / t : 0, lmean,
             r->loss_sum / (double)r->loss_steps);
    ch_job_progress(j->job, what, step + 1, steps, j->log_every, text);
    return r->stop;
}

/* One training epoch from step first_step, on CPU and GPU ranks alike: the
 * batch feed hands each step its tensors on the compute device and, on a
 * GPU, copies the next batch while the step computes (the step's loss read
 * is the host wait that frees the other device slot). */
static void train_epoch(trainer_t *j, int epoch, int64_t first_step, epoch_result_t *r)
{
    const int64_t steps = j->steps_per_epoch;
    memset(r, 0, sizeof *r);
    r->loss_sum = first_step ? j->resumed_loss_sum : 0;
    r->loss_steps = first_step ? j->resumed_loss_steps : 0;
    r->steps_done = first_step;
    ch_model_train(j->model, 1);
    ch_loader_t *loader = j->data->train_loader;
    /* resuming mid-epoch: the same batches from first_step on, the skipped
     * ones not even loaded */
    ch_prof_begin(j->prof, PH_DATA);
    ch_check_fatal(ch_loader_start_epoch_at(loader, epoch, first_step), "loader");
    ch_check_fatal(ch_batch_feed_start(j->feed, loader, steps - first_step), "reading training data");
    ch_prof_end(j->prof, PH_DATA);
    double t0 = ch_time_now();
    int64_t images = 0;
    for (int64_t step = first_step; step < steps; step++) {
        ch_step_batch_t b;
        ch_prof_begin(j->prof, PH_DATA);
        ch_check_fatal(ch_batch_feed_next(j->feed, &b), "reading training data");
        ch_prof_end(j->prof, PH_DATA);
        if (!b.x.data) break;
        /* Dropout masks: a function of (seed, layer, epoch, the sample's
         * position in the epoch's global order), not of the world size */
        ch_check_fatal(ch_model_set_dropout_key(j->model, (uint64_t)j->seed, (uint64_t)epoch,
                                                (step * j->batch_size) * j->world + j->rank,
                                                j->world), "dropout");
        if (train_step(j, &b.x, &b.y)) {
            r->stop = 1;
            break;
        }
        /* the next batch's copy overlaps this step's kernels */
        ch_prof_begin(j->prof, PH_DATA);
        ch_check_fatal(ch_batch_feed_prefetch(j->feed), "reading training data");
        ch_prof_end(j->prof, PH_DATA);
        float loss = 0;
        /* timed on a GPU only: on the CPU the loss is already there, and a
         * row of zeros would only clutter the profile */
        if (j->on_gpu) ch_prof_begin(j->prof, PH_GPU_WAIT);
        ch_check_fatal(ch_model_loss_value(j->model, j->cx, &loss), "loss");
        if (j->on_gpu) ch_prof_end(j->prof, PH_GPU_WAIT);
        images += b.x.shape[0];
        j->global_step++;
        if (end_step(j, epoch, step, steps, loss, t0, images, r)) break;
    }
    ch_check_fatal(ch_batch_feed_stop(j->feed), "batch upload");
    r->seconds = ch_time_now() - t0;
    r->loss = r->loss_steps ? r->loss_sum / (double)r->loss_steps : 0;
    r->images_per_s = r->seconds > 0 ? (double)(images * j->world) / r->seconds : 0;
}

/* Evaluation: correct counts all-reduced. Returns the seed's accuracy
 * (correct over total_size, padded duplicates included) and the exact one
 * (over the n real samples: the first n_real rows of each batch). */
static void evaluate(trainer_t *j, int epoch, double *acc_seed, double *acc_exact)
{
    double counts[2] = {0, 0}, total[2];
    ch_loader_t *loader = j->data->test_loader;
    ch_model_train(j->model, 0);
    ch_check_fatal(ch_loader_start_epoch(loader, epoch), "loader");
    ch_check_fatal(ch_batch_feed_start(j->feed, loader, -1), "reading test data");
    for (;;) {
        ch_step_batch_t b;
        ch_job_heartbeat(j->job);
        ch_check_fatal(ch_batch_feed_next(j->feed, &b), "reading test data");
        if (!b.x.data) break;
        const int64_t n = b.x.shape[0];
        if (n == 0) continue;
        const ch_tensor_t *logits = NULL;
        int64_t all = 0, real = 0;
        ch_check_fatal(ch_model_forward(j->model, j->cx, &b.x, &logits), "eval forward");
        ch_check_fatal(ch_batch_feed_prefetch(j->feed), "reading test data");
        ch_check_fatal(ch_op_count_correct(j->cx, logits, &b.y, &all), "accuracy");
        real = all;
        if (b.n_real < n) {
            ch_tensor_t lr, yr;
            int64_t ls[2] = {b.n_real, logits->shape[1]}, ys[1] = {b.n_real};
            real = 0;
            if (b.n_real > 0) {
                ch_check_fatal(ch_tensor_wrap(&lr, logits->data, CH_F32, 2, ls, CH_LAYOUT_PLAIN,
                                              logits->dev, logits->dev_index), "accuracy");
                ch_check_fatal(ch_tensor_wrap(&yr, b.y.data, CH_I64, 1, ys, CH_LAYOUT_PLAIN,
                                              b.y.dev, b.y.dev_index), "accuracy");
                ch_check_fatal(ch_op_count_correct(j->cx, &lr, &yr, &real), "accuracy");
            }
        }
        counts[0] += (double)all;
        counts[1] += (double)real;
    }
    ch_check_fatal(ch_batch_feed_stop(j->feed), "batch upload");
    ch_check_fatal(ch_pg_allreduce(j->pg, counts, total, 2, CH_DIST_FLOAT64, CH_REDUCE_SUM),
                   "accuracy all-reduce");
    const ch_sampler_t *smp = ch_loader_sampler(loader);
    *acc_seed = total[0] / (double)ch_sampler_total_size(smp);
    *acc_exact = total[1] / (double)ch_sampler_dataset_length(smp);
}

/* One epoch with its evaluation, log line, metrics and checkpoints.
 * Returns CH_JOB_CONTINUE to go on, or the exit code to end with
 * (CH_EXIT_OK after train.stop_after epochs). */
static int run_epoch(trainer_t *j, int epoch)
{
    int epochs = j->sched.o.epochs;
    ch_check_fatal(ch_lr_schedule_set_epoch(&j->sched, epoch), "schedule");
    double lr = ch_lr_schedule_get(&j->sched);
    ch_optimizer_set_lr(j->opt, lr);
    if (epoch == j->start_epoch) ch_log_info("epoch %d: learning rate %.8g", epoch, lr);
    epoch_result_t r;
    train_epoch(j, epoch, epoch == j->start_epoch ? j->start_step_in_epoch : 0, &r);
    int why = ch_job_stop_reasons(j->job);
    if (why & (CH_STOP_NONFINITE | CH_STOP_PEER_LOST)) return CH_EXIT_ERROR;
    char reason[64];
    /* the signal number is this rank's: the loss all-reduce carries only
     * the reason bits, and the signal may have reached another rank */
    if ((why & CH_STOP_PREEMPT) && ch_job_stop_signal(j->job) > 0)
        snprintf(reason, sizeof reason, "preemption signal %d", ch_job_stop_signal(j->job));
    else if (why & CH_STOP_PREEMPT)
        snprintf(reason, sizeof reason, "preemption signal (received by another rank)");
    else snprintf(reason, sizeof reason, "%s", why & CH_STOP_FILE ? "stop file" : "stop request");
    /* A stop agreed at the epoch's last step: the epoch is trained, so
     * finish it (evaluation, model file, resume file at the next epoch's
     * step 0) and stop after it. */
    int stop_after_epoch = r.stop && r.steps_done >= j->steps_per_epoch;
    if (r.stop && !stop_after_epoch) {
        ch_log_info("%s: stopping at epoch %d step %lld (global step %lld); writing %s", reason, epoch,
                    (long long)r.steps_done, (long long)j->global_step, j->resume_path);
        if (checkpoint(j, epoch, epoch, r.steps_done, 0, r.loss_sum, r.loss_steps))
            return CH_EXIT_ERROR;
        if (why & CH_STOP_PREEMPT) ch_job_requeue(j->job); /* not after the user's stop */
        return CH_EXIT_PREEMPTED;
    }
    double acc = NAN, acc_exact = NAN;
    if (j->do_eval) {
        ch_prof_begin(j->prof, PH_EVAL);
        evaluate(j, epoch, &acc, &acc_exact);
        ch_prof_end(j->prof, PH_EVAL);
        ch_log_info("epoch %d: loss %.4f  accuracy %.4f (exact %.4f over the %lld real test "
                    "samples)  lr %.6g  %.0f images/s  %.1f s", epoch, r.loss, acc, acc_exact,
                    (long long)j->data->test->length, lr, r.images_per_s, r.seconds);
    } else {
        ch_log_info("epoch %d: loss %.4f  lr %.6g  %.0f images/s  %.1f s", epoch, r.loss, lr,
                    r.images_per_s, r.seconds);
    }
    if (j->rank == 0) {
        double vals[6] = {r.loss, acc, acc_exact, lr, r.images_per_s, r.seconds};
        if (ch_metrics_log_epoch(j->metrics, epoch, j->global_step, -1, vals))
            ch_log_warn("metrics: %s", ch_error_message());
    }
    int last = epoch + 1 == epochs;
    int save = ch_train_output_saves_model(&j->out, epoch, epochs);
    if (checkpoint(j, epoch, epoch + 1, 0, save, 0, 0)) return CH_EXIT_ERROR;
    char saved[4200];
    if (save && ch_train_output_model_path(&j->out, epoch, saved, sizeof saved) == CH_OK)
        ch_log_info("saved %s", saved); /* model-E.safetensors or model-E.pth (output.format) */
    if (stop_after_epoch && !last) {
        ch_log_info("%s at the end of epoch %d (global step %lld): stopping; %s continues at "
                    "epoch %d", reason, epoch, (long long)j->global_step, j->resume_path, epoch + 1);
        if (why & CH_STOP_PREEMPT) ch_job_requeue(j->job); /* not after the user's stop */
        return CH_EXIT_PREEMPTED;
    }
    if (j->stop_after > 0 && epoch + 1 - j->start_epoch >= j->stop_after && !last) {
        ch_log_info("stopping after %d epoch%s as train.stop_after asks; continue with --resume",
                    j->stop_after, j->stop_after == 1 ? "" : "s");
        return CH_EXIT_OK;
    }
    return CH_JOB_CONTINUE;
}

/* Everything the recipe builds, each step's verdict agreed by every rank.
 * Returns CH_JOB_CONTINUE or the exit code. */
static int setup(trainer_t *j)
{
    ch_status s = read_config(j);
    if (ch_job_agree(j->job, s, "configuration")) return CH_EXIT_BAD_INPUT;
    ch_data_setup_t du = {.in_channels = j->in_channels, .num_classes = j->num_classes,
                          .batch_size = j->batch_size, .seed = (uint64_t)j->seed,
                          .rank = j->rank, .world_size = j->world, .pinned = j->on_gpu,
                          .eval = j->do_eval, .pg = j->pg};
    s = ch_data_create(&j->data_opt, &du, &j->data);
    if (s == CH_OK && j->data_opt.stage[0])
        ch_prof_add(j->prof, PH_STAGE, j->data->stage_stats.seconds); /* copy or verify, once */
    if (ch_job_agree(j->job, s, "data")) return CH_EXIT_BAD_INPUT;
    j->steps_per_epoch = ch_loader_num_batches(j->data->train_loader);
    if (j->max_steps > 0 && j->max_steps < j->steps_per_epoch) j->steps_per_epoch = j->max_steps;
    ch_loader_t *loaders[2] = {j->data->train_loader, j->data->test_loader};
    s = ch_batch_feed_create(j->cx, j->on_gpu ? CH_DEV_CUDA : CH_DEV_CPU, j->device, loaders,
                             2, &j->feed);
    if (ch_job_agree(j->job, s, "device input buffers")) return CH_EXIT_ERROR;

    s = build_model(j);
    if (ch_job_agree(j->job, s, "model")) return CH_EXIT_BAD_INPUT;

    char auto_path[4096];
    const char *from = NULL;
    s = ch_train_output_resume_source(&j->out, auto_path, sizeof auto_path, &from);
    if (s == CH_OK && from) s = resume(j, from);
    if (ch_job_agree(j->job, s, "resume")) return CH_EXIT_BAD_INPUT;
    /* A run starting afresh into a directory that holds an earlier run's
     * resume file (a preempted run started again without --resume): that
     * file is kept under another name, not overwritten by this run's first
     * checkpoint. */
    if ((!from || strcmp(from, j->resume_path)) && j->rank == 0 && access(j->resume_path, F_OK) == 0) {
        /* resume-earlier.safetensors, else -2, -3, ...: never over another kept file */
        char kept[4200];
        snprintf(kept, sizeof kept, "%s/resume-earlier.safetensors", j->out.dir);
        for (int k = 2; access(kept, F_OK) == 0 && k < 10000; k++)
            snprintf(kept, sizeof kept, "%s/resume-earlier-%d.safetensors", j->out.dir, k);
        if (rename(j->resume_path, kept) == 0)
            ch_log_warn("output.dir %s holds the resume file of an earlier run and this run %s: "
                        "that file is kept as %s (--resume %s continues that run if it had not "
                        "finished)", j->out.dir, from ? "resumes another file" : "starts afresh "
                        "(no --resume)", kept, kept);
        else
            s = CH_ERROR(CH_ERR_IO, "output.dir %s: keeping the earlier run's %s as %s: %s",
                         j->out.dir, j->resume_path, kept, strerror(errno));
    }
    if (ch_job_agree(j->job, s, "resume")) return CH_EXIT_BAD_INPUT;
    /* all ranks start identical: rank 0's parameters and buffers */
    s = ch_ddp_broadcast_state(j->ddp);
    if (ch_job_agree(j->job, s, "broadcast of initial state")) return CH_EXIT_ERROR;
    if (from)
        ch_log_info("resumed from %s at epoch %d, step %lld of the epoch (global step %lld)",
                    from, j->start_epoch, (long long)j->start_step_in_epoch,
                    (long long)j->global_step);
    else if (!strcmp(j->out.resume, "auto"))
        ch_log_info("no resume file %s yet: starting from epoch 0", j->resume_path);

    if (j->rank == 0) {
        const char *cols[] = {"loss", "accuracy", "accuracy_exact", "learning_rate",
                              "images_per_sec", "seconds"};
        s = ch_metrics_open(j->out.dir, "metrics.csv", cols, 6, j->start_epoch, &j->metrics);
    }
    if (ch_job_agree(j->job, s, "metrics files")) return CH_EXIT_BAD_INPUT;
    return CH_JOB_CONTINUE;
}

/* "SGD lr 0.01 x 2 ranks = 0.02, momentum 0.9, weight decay 0.005", and
 * AdamW's / RMSprop's own hyper-parameters. */
static void describe_optimizer(const trainer_t *j, char *buf, size_t len)
{
    const ch_optimizer_options_t *o = &j->opt_opt;
    int n = snprintf(buf, len, "%s lr %g x %d rank%s = %g",
                     o->kind == CH_OPTIM_ADAMW ? "AdamW" : o->kind == CH_OPTIM_RMSPROP ? "RMSprop"
                                                                                     : "SGD",
                     o->lr, j->world, j->world == 1 ? "" : "s", o->lr * j->world);
    if (n < 0 || (size_t)n >= len) return;
    if (o->kind == CH_OPTIM_SGD)
        snprintf(buf + n, len - (size_t)n, ", momentum %g, weight decay %g%s", o->momentum,
                 o->weight_decay, o->nesterov ? ", nesterov" : "");
    else if (o->kind == CH_OPTIM_ADAMW)
        snprintf(buf + n, len - (size_t)n, ", betas (%g, %g), eps %g, weight decay %g%s", o->beta1,
                 o->beta2, o->eps, o->weight_decay, o->amsgrad ? ", amsgrad" : "");
    else
        snprintf(buf + n, len - (size_t)n, ", alpha %g, eps %g, momentum %g, weight decay %g%s",
                 o->alpha, o->eps, o->momentum, o->weight_decay, o->centered ? ", centered" : "");
}

/* "cosine schedule over 5 epochs, lrf 0.1" (SGD's line of old), the other
 * schedules with their parameters, and the warmup. */
static void describe_schedule(const ch_lr_schedule_options_t *o, char *buf, size_t len)
{
    char ms[256] = "";
    int m = 0;
    for (int i = 0; i < o->n_milestones && m >= 0 && (size_t)m < sizeof ms; i++)
        m += snprintf(ms + m, sizeof ms - (size_t)m, "%s%d", i ? "," : "", o->milestones[i]);
    int n;
    switch (o->kind) {
    case CH_LR_STEP:
        n = snprintf(buf, len, "step schedule (StepLR step_size %d, gamma %g)", o->step_size,
                     o->gamma);
        break;
    case CH_LR_MULTISTEP:
        n = snprintf(buf, len, "multistep schedule (MultiStepLR milestones %s, gamma %g)", ms,
                     o->gamma);
        break;
    case CH_LR_COSINE_ANNEALING:
        n = snprintf(buf, len, "cosine_annealing schedule (eta_min %g)", o->lr_min);
        break;
    default: n = snprintf(buf, len, "cosine schedule"); break;
    }
    if (n < 0 || (size_t)n >= len) return;
    n += snprintf(buf + n, len - (size_t)n, " over %d epoch%s", o->epochs, o->epochs == 1 ? "" : "s");
    if (n < 0 || (size_t)n >= len) return;
    if (o->kind == CH_LR_COSINE) n += snprintf(buf + n, len - (size_t)n, ", lrf %g", o->lrf);
    if (n < 0 || (size_t)n >= len) return;
    if (o->warmup_epochs > 0)
        snprintf(buf + n, len - (size_t)n, ", after %d epoch%s of %s warmup from factor %g",
                 o->warmup_epochs, o->warmup_epochs == 1 ? "" : "s",
                 o->warmup_method == CH_LR_WARMUP_LINEAR ? "linear" : "constant", o->warmup_factor);
}

static void describe(trainer_t *j)
{
    if (j->rank != 0) return;
    char cxd[256];
    ch_compute_options_t co;
    ch_compute_options_default(&co);
    if (ch_compute_from_config(j->cfg, &co)) ch_error_clear(); /* read at init already */
    ch_compute_describe(j->cx, cxd, sizeof cxd);
    ch_log_info("%s: %s, %d rank%s, %s", ch_job_name(j->job), ch_model_arch(j->model), j->world, j->world == 1 ? "" : "s",
                j->on_gpu ? "GPU" : "CPU");
    ch_log_info("compute: %s; %d thread%s per rank", cxd, ch_compute_num_threads(j->cx),
                ch_compute_num_threads(j->cx) == 1 ? "" : "s");
    if (j->on_gpu) {
        char name[256] = "?";
        if (ch_device_name(j->device, name, sizeof name) != CH_OK) ch_error_clear();
        ch_log_info("GPU: rank 0 on device %d (%s); %s, TF32 convolutions %s, conv algorithms by "
                    "%s, workspace cap %d MiB; gradients and SyncBN over NCCL",
                    j->device, name, co.bf16 ? "bf16 autocast" : "fp32",
                    co.allow_tf32 ? "on" : "off", ch_compute_conv_search_names[co.conv_search],
                    (int)(co.gpu_workspace_bytes >> 20));
    }
    ch_log_info("data: %s (%s): %lld train / %lld test samples, batch %d per rank (%d global), "
                "%lld step%s per epoch, %d worker%s",
                j->data_opt.path, j->data_opt.format_name, (long long)j->data->train->length,
                (long long)j->data->test->length, j->batch_size, j->batch_size * j->world,
                (long long)ch_loader_num_batches(j->data->train_loader),
                ch_loader_num_batches(j->data->train_loader) == 1 ? "" : "s", j->data_opt.workers,
                j->data_opt.workers == 1 ? "" : "s");
    if (j->data_opt.mean_auto || j->data_opt.std_auto) {
        char text[256];
        int len = 0;
        for (int c = 0; c < j->in_channels; c++)
            len += snprintf(text + len, sizeof text - (size_t)len, "%s%.9g/%.9g", c ? ", " : "",
                            (double)j->data->mean[c], (double)j->data->std[c]);
        ch_log_info("data: Normalize mean/std per channel %s (%s%s%s of the %lld training images: "
                    "ToTensor values x/255, population std)", text,
                    j->data_opt.mean_auto ? "mean" : "", j->data_opt.mean_auto && j->data_opt.std_auto
                    ? " and " : "", j->data_opt.std_auto ? "std" : "",
                    (long long)j->data->train->length);
    }
    ch_log_info("model: %zu parameters (%zu trainable), SyncBN %s, DDP %d bucket%s",
                ch_model_param_numel(j->model), ch_model_trainable_numel(j->model),
                j->converted_sync_bn ? "on" : "off", ch_ddp_num_buckets(j->ddp),
                ch_ddp_num_buckets(j->ddp) == 1 ? "" : "s");
    char od[256], sd[512];
    describe_optimizer(j, od, sizeof od);
    describe_schedule(&j->sched.o, sd, sizeof sd);
    ch_log_info("optimizer: %s; %s", od, sd);
    if (j->loss_opt.label_smoothing > 0)
        ch_log_info("loss: cross-entropy with label smoothing %g", j->loss_opt.label_smoothing);
}

/* Destroys what setup built (and the model, the caller's included). */
static void cleanup(void *arg)
{
    trainer_t *j = arg;
    if (j->metrics && ch_metrics_destroy(j->metrics)) ch_log_warn("metrics: %s", ch_error_message());
    ch_ddp_destroy(j->ddp);
    ch_optimizer_destroy(j->opt);
    ch_model_destroy(j->model);
    ch_batch_feed_destroy(j->feed);
    ch_data_destroy(j->data);
}

/* Registered with ch_job_on_finalize by ch_trainer_setup. */
static void trainer_finalize(void *arg)
{
    trainer_t *j = arg;
    cleanup(j);
    free(j);
}

int ch_trainer_setup(ch_job_t *job, ch_model_t *model, ch_trainer_t **out)
{
    if (out) *out = NULL;
    trainer_t *j = calloc(1, sizeof *j);
    if (!j || !out) {
        free(j);
        ch_model_destroy(model);
        ch_log_error("ch_trainer_setup: %s", out ? "out of memory" : "NULL argument");
        return CH_EXIT_ERROR;
    }
    j->model = model;
    if (ch_job_on_finalize(job, trainer_finalize, j)) {
        trainer_finalize(j);
        return CH_EXIT_ERROR;
    }
    j->job = job;
    j->cfg = ch_job_config(job);
    j->rank = ch_job_rank(job);
    j->world = ch_job_world_size(job);
    j->pg = ch_job_pg(job);
    j->nccl = ch_job_nccl(job);
    j->cx = ch_job_compute(job);
    j->on_gpu = ch_job_on_gpu(job);
    j->device = ch_job_env(job)->device;
    j->prof = ch_job_profiler(job);
    *out = j;
    int rc = setup(j);
    if (rc == CH_JOB_CONTINUE) describe(j);
    return rc;
}

int ch_trainer_fit(ch_trainer_t *j)
{
    int rc = CH_JOB_CONTINUE;
    for (int epoch = j->start_epoch; rc == CH_JOB_CONTINUE && epoch < j->sched.o.epochs; epoch++) {
        rc = run_epoch(j, epoch);
        /* tests only: after the epoch's checkpoints */
        if (rc == CH_JOB_CONTINUE) ch_job_test_hold(j->job, "epoch", epoch);
    }
    if (rc == CH_JOB_CONTINUE) {
        ch_log_info("training finished: %d epochs", j->sched.o.epochs);
        rc = CH_EXIT_OK;
        /* a completed run removes its staged copies (a stopped one keeps
         * them for the requeue) */
        if (j->data_opt.stage[0] && !j->data_opt.stage_keep &&
            ch_data_unstage(j->data, ch_job_pg(j->job)) != CH_OK)
            ch_log_warn("data.stage: %s", ch_error_message());
    }
    return rc;
}

ch_model_t *ch_trainer_model(const ch_trainer_t *t) { return t->model; }

int ch_trainer_tables(ch_config_table_t *tables, int capacity)
{
    const ch_config_table_t all[] = {
        ch_trainer_config_table(),
        ch_data_config_table(),
        ch_sgd_config_table(),
        ch_optimizer_config_table(),
        ch_lr_cosine_config_table(),
        ch_lr_schedule_config_table(),
        ch_loss_config_table(),
        ch_ddp_config_table(),
        ch_train_output_config_table(),
        ch_job_runtime_table(),
        ch_compute_config_table(),
    };
    const int n = (int)(sizeof all / sizeof all[0]);
    for (int i = 0; i < n && i < capacity; i++) tables[i] = all[i];
    return n;
}

void ch_trainer_main_options_default(ch_trainer_main_options_t *o)
{
    memset(o, 0, sizeof *o);
    o->name = "cohort-train";
    o->summary = "data-parallel training of ResNets (the PyTorch DDP recipe)";
}

int ch_trainer_main(int argc, char **argv, const ch_trainer_main_options_t *mo)
{
    ch_trainer_main_options_t d;
    if (!mo) {
        ch_trainer_main_options_default(&d);
        mo = &d;
    }
    /* a program's own default architecture: the key table is the trainer's
     * (static), its default the program's */
    if (mo->default_arch)
        for (int i = 0; i < N_TRAIN_KEYS; i++)
            if (!strcmp(train_keys[i].name, "model.arch")) train_keys[i].def = mo->default_arch;
    ch_config_table_t tables[CH_TRAINER_MAX_TABLES];
    const int n = ch_trainer_tables(tables, CH_TRAINER_MAX_TABLES);
    ch_job_options_t o;
    ch_job_options_default(&o, mo->name, mo->summary);
    o.tables = tables;
    o.n_tables = n;
    o.compute = 1;
    o.threads_key = "train.threads";
    o.output_dir_key = "output.dir";
    o.phase_names = ch_trainer_phase_names(&o.n_phases);
    o.preemption = 1;
    ch_job_t *job = NULL;
    int rc = ch_job_init(&o, argc, argv, &job);
    if (rc != CH_JOB_CONTINUE) return ch_job_finalize(job, rc);
    ch_trainer_t *t = NULL;
    rc = ch_trainer_setup(job, NULL, &t);
    if (rc == CH_JOB_CONTINUE) rc = ch_trainer_fit(t);
    return ch_job_finalize(job, rc);
}
