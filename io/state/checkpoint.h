/* cohort: checkpoint files (model files and resume files).
 *
 * Both are safetensors files (io/formats/safetensors.h) written atomically
 * (io/state/atomic_file.h: temporary file in the same directory, fsync, rename,
 * fsync of the directory), so a writer killed at any point leaves the
 * previous file intact. Only rank 0 writes (SEMANTICS.md); the caller puts
 * the barrier after the write.
 *
 * Model file (model-<epoch>.safetensors): the state dict only, torchvision
 * names and dtypes (F32, num_batches_tracked I64), metadata {"format": "pt"},
 * so PyTorch's load_state_dict takes it unchanged.
 *
 * Resume file: everything needed to continue training bit-for-bit:
 *   tensors   the state dict (parameters and buffers, state-dict names) and
 *             one SGD momentum buffer per parameter that has one, named
 *             "optim.momentum_buffer.<parameter name>" (F32, the parameter's
 *             shape; torch.optim.SGD's state['momentum_buffer'])
 *   metadata  "format": "pt", "cohort.file": "resume",
 *             "cohort.resume_version": "1", and the decimal integers
 *             "epoch", "global_step", "sampler.seed", "sampler.epoch",
 *             "world_size", plus the texts "rng_state" and "config"
 *             (all safetensors metadata values are strings).
 * The reader checks that every required key is present and parses as the
 * expected type and range, and that every momentum buffer belongs to a
 * tensor of the file with the same shape; errors name the file, the key and
 * the offending value.
 */
#ifndef COHORT_IO_CHECKPOINT_H
#define COHORT_IO_CHECKPOINT_H

#include "framework/core/status.h"
#include "io/formats/safetensors.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Prefix of momentum buffer names in a resume file. */
#define CH_CKPT_MOMENTUM_PREFIX "optim.momentum_buffer."
/* Version of the resume-file layout written here. */
#define CH_CKPT_RESUME_VERSION 1

/* Training progress stored in a resume file. */
typedef struct {
    int64_t epoch;         /* epochs completed; training resumes with this epoch index (>= 0) */
    int64_t global_step;   /* optimizer steps taken so far (>= 0) */
    uint64_t sampler_seed; /* DistributedSampler seed */
    int64_t sampler_epoch; /* last value given to the sampler's set_epoch (>= 0) */
    int world_size;        /* world size of the run that wrote it (>= 1) */
    const char *rng_state; /* opaque text of the RNG owner's state ("" allowed, not NULL) */
    const char *config;    /* the effective configuration, libconfig text (not NULL) */
} ch_resume_info_t;

/* Write a model file: views (the state dict, in state-dict order) with
 * metadata {"format": "pt"}. Errors as ch_safetensors_write. */
ch_status ch_checkpoint_write_model(const char *path, const ch_st_view_t *state, size_t n);

/* Write a resume file atomically.
 * state[0..nstate): parameters and buffers with their state-dict names.
 * momentum[0..nmom): momentum buffers, each view named by its PARAMETER
 *   (e.g. "fc.weight"); stored as "optim.momentum_buffer.fc.weight". Each
 *   must match a state entry of the same name, dtype F32 and shape.
 * info: progress (see ch_resume_info_t); extra[0..nextra): more metadata
 *   (NULL/0 for none), keys must differ from the ones above.
 * Errors: CH_ERR_INVALID (bad info, momentum without parameter or with
 * another shape, duplicate names/keys: message names them), CH_ERR_IO
 * naming path (unwritable directory, disk full; the old file is kept),
 * CH_ERR_NOMEM. */
ch_status ch_checkpoint_write_resume(const char *path, const ch_st_view_t *state, size_t nstate,
                                     const ch_st_view_t *momentum, size_t nmom,
                                     const ch_resume_info_t *info, const ch_st_meta_t *extra,
                                     size_t nextra);

/* Open and validate a resume file. *st gets the loaded file (close it with
 * ch_safetensors_destroy); *info the parsed progress, whose strings point into
 * *st. Errors: those of ch_safetensors_open, and CH_ERR_FORMAT naming path
 * and key for a file that is not a cohort resume file, a missing or
 * malformed key, an unsupported version, or a momentum buffer without
 * matching tensor. On error *st is NULL. */
ch_status ch_checkpoint_read_resume(const char *path, ch_safetensors_t **st, ch_resume_info_t *info);

/* The momentum buffer of parameter param_name in a resume file, or NULL
 * when it has none (e.g. saved before the first optimizer step). */
const ch_st_view_t *ch_checkpoint_momentum(const ch_safetensors_t *st, const char *param_name);

/* Nonzero when a tensor name is a momentum buffer name (so state-dict
 * loaders can skip those). */
int ch_checkpoint_is_momentum(const char *name);

/* Check, before training starts, that checkpoints can be written in dir:
 * it exists, is a directory, and a temporary file can be created and
 * removed there. Errors: CH_ERR_IO naming dir and the errno text. */
ch_status ch_checkpoint_check_dir(const char *dir);

#ifdef __cplusplus
}
#endif
#endif /* COHORT_IO_CHECKPOINT_H */
