/* cohort: the files of a training run — a model and its SGD state to and
 * from safetensors (model files, resume files), pretrained weights, and the
 * checks that decide whether a resume file can continue this run.
 *
 * File layouts are io/state/checkpoint.h's (torchvision state-dict names, resume
 * metadata); this layer converts between them and ch_model_t / ch_sgd_t.
 * Every function here reads or writes the model's HOST storage and keeps a
 * GPU model's device copy in step (ch_model_sync_to_host before a write,
 * ch_model_sync_to_device after a read), so callers need not.
 *
 * Resume metadata added by this layer (besides io/state/checkpoint.h's):
 *   "epoch_step"       steps of `epoch` already taken (0 at an epoch boundary)
 *   "epoch_steps"      steps per epoch of the run that wrote the file
 *   "epoch_loss_sum", "epoch_loss_steps"  the partial epoch's running loss
 * Files written before "epoch_step" existed are read too (see
 * ch_train_resume_check).
 */
#ifndef COHORT_IO_TRAIN_STATE_H
#define COHORT_IO_TRAIN_STATE_H

#include "framework/core/configuration.h"
#include "framework/core/status.h"
#include "framework/nn/nn.h"
#include "framework/train/optim.h"
#include "framework/train/optimizer.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------ output.* keys */

/* The checkpoint writer's options (output.* keys). Strings point into the
 * config. */
typedef struct {
    const char *dir;    /* output.dir: checkpoints, resume file, metrics */
    int save_every;     /* output.save_every: model file every N epochs (0: only the last) */
    const char *resume; /* output.resume: "" (none), "auto" or a resume file path */
    const char *format; /* output.format: "safetensors" (default; NULL means it) or "pth":
                           the model files' format (ch_train_output_model_path's extension;
                           ch_train_state_write_model writes by extension) */
} ch_train_output_options_t;
/* output.resume_allow (a string list) is read by ch_train_resume_config_check. */

ch_config_table_t ch_train_output_config_table(void);

/* Options from the output.* keys. CH_ERR_INVALID for a key missing from
 * cfg's table; CH_ERR_CONFIG for an output.format other than "safetensors"
 * or "pth". */
ch_status ch_train_output_options_from_config(const ch_config_t *cfg,
                                              ch_train_output_options_t *o);

/* "<dir>/resume.safetensors" and "<dir>/model-<epoch>.safetensors" (".pth"
 * with output.format = pth) into buf.
 * CH_ERR_RANGE when buf (len bytes) is too small. */
ch_status ch_train_output_resume_path(const ch_train_output_options_t *o, char *buf, size_t len);
ch_status ch_train_output_model_path(const ch_train_output_options_t *o, int epoch, char *buf,
                                     size_t len);

/* Whether epoch (0-based) of a run of `epochs` writes a model file: the last
 * epoch always, else every save_every-th (epoch + 1 divisible by it). */
int ch_train_output_saves_model(const ch_train_output_options_t *o, int epoch, int epochs);

/* The resume file to continue from: *path = NULL for output.resume "" and
 * for "auto" when <dir>/resume.safetensors is not readable (a fresh start);
 * the auto path (copied into buf) or output.resume itself otherwise.
 * CH_ERR_IO "output.resume: 'PATH' not found" for an explicit path that is
 * not readable; CH_ERR_RANGE when buf is too small. */
ch_status ch_train_output_resume_source(const ch_train_output_options_t *o, char *buf,
                                        size_t len, const char **path);

/* ------------------------------------------------------------ model files */

/* Write model's state dict as a model file (io/state/checkpoint.h; torchvision
 * names, load_state_dict(strict=True) takes it), atomically: a zip .pth
 * (io/formats/pth.h ch_pth_write) when path ends in ".pth" or ".pt", else
 * safetensors. Errors: those of ch_model_sync_to_host and
 * ch_checkpoint_write_model / ch_pth_write (CH_ERR_IO naming path),
 * CH_ERR_NOMEM. */
ch_status ch_train_state_write_model(ch_model_t *model, const char *path);

/* ------------------------------------------------------------ resume files */

/* Where a training run is; what a resume file stores besides the tensors. */
typedef struct {
    int epoch;                /* epoch to continue with (>= 0) */
    int64_t global_step;      /* optimizer steps taken so far (>= 0) */
    int64_t epoch_step;       /* steps of `epoch` already taken; -1 on read: not in the file */
    int64_t epoch_steps;      /* steps per epoch of the writer; -1 on read: not in the file */
    uint64_t seed;            /* train.seed (sampler, augmentation) */
    int world_size;           /* ranks of the writer */
    double epoch_loss_sum;    /* sum of the logged (all-reduced) losses of the partial epoch */
    int64_t epoch_loss_steps; /* and their count */
} ch_train_progress_t;

/* Write a resume file (atomically): model's parameters and buffers, sgd's
 * momentum buffers (those that exist: none before the first step), p, and
 * config_text (the effective configuration, libconfig syntax; may be ""),
 * with rng_state describing the augmentation streams. Requires 0 <=
 * p->epoch_step < p->epoch_steps or p->epoch_step == 0 (CH_ERR_INVALID).
 * Errors: those of ch_checkpoint_write_resume (CH_ERR_IO naming path; the
 * previous file stays intact), CH_ERR_NOMEM. */
ch_status ch_train_state_write_resume(ch_model_t *model, const ch_sgd_t *sgd, const char *path,
                                      const ch_train_progress_t *p, const char *config_text);

/* Read a resume file into model (every entry: exact name, dtype and shape)
 * and sgd (each momentum buffer the file has; sgd may be NULL to skip
 * them), and its progress into *p (epoch_step / epoch_steps -1 when the
 * file predates them). Errors: those of ch_checkpoint_read_resume
 * (CH_ERR_FORMAT naming the file and key), CH_ERR_INVALID naming the file
 * and tensor for a missing tensor or another shape (not this model),
 * CH_ERR_FORMAT for a malformed epoch_* value. On error the model may be
 * partly overwritten. */
ch_status ch_train_state_read_resume(ch_model_t *model, ch_sgd_t *sgd, const char *path,
                                     ch_train_progress_t *p);

/* A resume file for any optimizer (framework/train/optimizer.h).
 * kind sgd: exactly ch_train_state_write_resume's file (byte for byte).
 * adamw / rmsprop: the model as there, and each state tensor a parameter
 * has (none before the first step), under PyTorch's state_dict() names:
 *   "optim.momentum_buffer.<param>"  (rmsprop with momentum; as SGD's)
 *   "optim.<state>.<param>"          exp_avg, exp_avg_sq, max_exp_avg_sq,
 *                                    square_avg, grad_avg (F32, the
 *                                    parameter's shape)
 * and metadata "optim.name" (adamw | rmsprop) and "optim.step" (decimal
 * steps taken, PyTorch's state['step']). A GPU optimizer's state is copied
 * to the host first. Errors: as ch_train_state_write_resume; CH_ERR_CUDA. */
ch_status ch_train_state_write_resume_optimizer(ch_model_t *model, const ch_optimizer_t *opt,
                                                const char *path, const ch_train_progress_t *p,
                                                const char *config_text);

/* Read such a file into model, opt (may be NULL: model and progress only)
 * and *p, as ch_train_state_read_resume; then every state tensor the file
 * has for opt's parameters and the step counter (sgd: global_step). After
 * this, steps continue bit for bit as if never interrupted. Errors: those
 * of ch_train_state_read_resume; CH_ERR_INVALID naming the file when it
 * holds another optimizer's state ("... holds adamw state, this run uses
 * optimizer.name = rmsprop") or a state of another length; CH_ERR_FORMAT
 * for a state tensor that is not F32 or a malformed optim.step. */
ch_status ch_train_state_read_resume_optimizer(ch_model_t *model, ch_optimizer_t *opt,
                                               const char *path, ch_train_progress_t *p);

/* Can `saved` (read from path, for messages) continue a run of world_size
 * ranks with steps_per_epoch steps per epoch and this seed? On CH_OK
 * *start_step is the step of saved->epoch to continue at.
 *  - At an epoch boundary (epoch_step 0) any world size and any steps per
 *    epoch continue: the next epoch's data order is defined for every world
 *    size (DistributedSampler(num_replicas=W, seed, epoch)).
 *  - Mid-epoch the world size and the steps per epoch must be the writer's
 *    (else the rest of the epoch's data order is not the one the first part
 *    was drawn from): CH_ERR_INVALID naming both world sizes, or both step
 *    counts ("batch size or data changed?").
 *  - A file without epoch_step (older cohort): the step in the epoch is
 *    global_step - epoch x steps_per_epoch when the world size is the
 *    writer's; CH_ERR_FORMAT when it falls outside the epoch; CH_ERR_INVALID
 *    for another world size (the writer's steps per epoch are unknown).
 *  - Another seed: CH_ERR_INVALID naming both.
 * Messages start with path. */
ch_status ch_train_resume_check(const char *path, const ch_train_progress_t *saved,
                                int world_size, int64_t steps_per_epoch, uint64_t seed,
                                int64_t *start_step);

/* The effective configuration a resume file saved (ch_config_dump text;
 * "" from files of older cohorts) into *config (malloc'd, caller frees).
 * Errors: those of ch_checkpoint_read_resume (naming path), CH_ERR_NOMEM. */
ch_status ch_train_state_read_config(const char *path, char **config);

/* Can the run configured by cfg continue the one whose configuration
 * saved_config (ch_config_dump text of the resume file `path`) is? Every
 * key that differs (ch_config_compare_dump) must be
 *  - in free_keys[0..n_free): keys that do not change the result (logging,
 *    loader workers, threads, checkpoint cadence, the launch's keys); an
 *    entry ending in '.' names a whole group ("compute.");
 *  - or in cfg's output.resume_allow list: changes the user intends
 *    (a key, or a group ending in '.'); logged, one line.
 * Anything else is refused: CH_ERR_INVALID "<path>: this run's configuration
 * differs from the saved one in keys that change the result: optimizer.lr
 * (saved 0.01, now 0.02), ...", each key with both values. An empty
 * saved_config (an older file) is not compared (a warning says so).
 * Errors also: CH_ERR_CONFIG for an output.resume_allow entry that is not a
 * key of cfg, CH_ERR_FORMAT (naming path) for a saved text that does not
 * parse, CH_ERR_NOMEM. The world size is not a key: ch_train_resume_check
 * decides about it. */
ch_status ch_train_resume_config_check(const char *path, const char *saved_config,
                                       const ch_config_t *cfg, const char *const *free_keys,
                                       int n_free);

/* ------------------------------------------------------------ pretrained */

typedef struct {
    int reshape;         /* 1: also load a tensor with the model's name and element count
                            but another shape (the seed recipe's rule), warning once per
                            tensor; 0 (default): exact shapes only */
    double min_fraction; /* refuse a file that loads fewer than this fraction of the
                            model's entries (default 0.5: the wrong file) */
    const char *weights_key; /* model.weights_key: in a .pth checkpoint dict, the key of the
                                state dict (NULL / "": the top level, else "model",
                                "state_dict" or "model_state_dict"; io/formats/pth.h) */
} ch_pretrained_options_t;

void ch_pretrained_options_default(ch_pretrained_options_t *o);

typedef struct {
    int n_tensors;       /* tensors in the file */
    int loaded;          /* copied into the model */
    int reshaped;        /* of which with another shape (reshape = 1) */
    int not_in_model;    /* skipped: no model entry of that name */
    int other_shape;     /* skipped: another shape (or element count) or dtype */
    int optimizer_state; /* skipped: optimizer state of a resume file ("optim.*") */
    int prefix_stripped; /* 1: every name began with "module." and one was removed */
    int not_in_file;     /* model entries the file does not name: left as they were
                            (a warning names the first few; PyTorch's missing_keys) */
} ch_pretrained_report_t;

/* Load pretrained weights from a safetensors state dict (a cohort model or
 * resume file, or PyTorch's save_file(model.state_dict())) or a PyTorch
 * .pth/.pt file (torch.save(model.state_dict()) or a checkpoint dict, zip or
 * legacy, read by io/formats/pth.h with weights_only semantics: nothing in
 * it is executed), the format decided by the file's content, non-strictly:
 *  - names: when EVERY tensor name starts with "module." (a state dict saved
 *    from a DistributedDataParallel-wrapped model) one leading "module." is
 *    removed (torch.nn.modules.utils.consume_prefix_in_state_dict_if_present);
 *  - a tensor is loaded when the model has an entry of that name, the same
 *    dtype and the same shape; with o->reshape also with the same element
 *    count and another shape (logged as a warning per tensor);
 *  - the rest is skipped, summarised in at most one line per reason with the
 *    first few names (e.g. "fc.weight [10, 512] vs model [1000, 512]"), not
 *    one line per tensor. Log lines are printed by rank 0 (ch_log_rank).
 * Model entries the file does not name keep their values; a warning counts
 * them with the first few names (rep->not_in_file). o may be NULL
 * (defaults); rep may be NULL. Errors: those of ch_safetensors_open /
 * ch_pth_open (naming path), CH_ERR_FORMAT "... matches only L of the N tensors ...: no tensor
 * matching most of the model ..." when fewer than o->min_fraction of the
 * model's entries load (the model is then unchanged), CH_ERR_NOMEM. */
ch_status ch_train_state_load_pretrained(ch_model_t *model, const char *path,
                                         const ch_pretrained_options_t *o,
                                         ch_pretrained_report_t *rep);

#ifdef __cplusplus
}
#endif
#endif /* COHORT_IO_TRAIN_STATE_H */
