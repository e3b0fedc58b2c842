/* cohort: the trainer — cohort-train's whole training loop as a library
 * service, for a model built by name (models/models.h: a built-in one or a
 * network the program registered) or handed over by the caller.
 *
 * A program that trains its own network gets cohort-train's whole command
 * line (every key of `cohort-train --help`, --config, --resume, ...):
 *
 *   static ch_status mycnn(ch_module_t *root, const ch_model_options_t *o, void *arg)
 *   {
 *       CH_TRY(ch_nn_conv2d(root, NULL, o->in_channels, 16, 3, 1, 1, 1, NULL));
 *       ...                                   // "0", "1", ... as nn.Sequential
 *       return ch_nn_linear(root, NULL, 128, o->num_classes, 1, NULL);
 *   }
 *   int main(int argc, char **argv)
 *   {
 *       ch_model_register("mycnn", mycnn, NULL);
 *       ch_trainer_main_options_t o;
 *       ch_trainer_main_options_default(&o);
 *       o.name = "mycnn-train";
 *       o.default_arch = "mycnn";              // --model.arch mycnn without saying so
 *       return ch_trainer_main(argc, argv, &o);
 *   }
 *
 * What the trainer does (the loop that was jobs/cohort-train.c): per epoch
 * the learning rate of schedule.name (cosine, step, multistep,
 * cosine_annealing, with an optional warmup; x world size, the linear
 * scaling rule), the DistributedSampler order of train.seed + epoch, each
 * step forward, the loss (cross-entropy with loss.label_smoothing),
 * backward with DDP buckets all-reduced while backward runs, the
 * optimizer.name update (SGD, AdamW, RMSprop); after
 * each step one all-reduce of the loss (logging: running mean over the
 * epoch) and of the stop flags (preemption signal, STOP file, non-finite
 * loss), so every rank stops at the same step; progress; evaluation over
 * the test set with all-reduced correct counts (accuracy over the sampler's
 * total_size, as the recipe, and exactly over the real samples); rank-0
 * model files, the resume file (config text, progress, partial-epoch loss)
 * and metrics.csv + TensorBoard scalars; resume with the configuration
 * compared; train.stop_after and requeue after a preemption; freezing,
 * SyncBN conversion, pretrained weights; on GPU ranks the model on the
 * device, NCCL, pinned loader slots. Its own keys (model.*, train.*) are
 * ch_trainer_config_table(); ch_trainer_tables() lists every table it reads.
 *
 * Exit status (framework/runtime/job.h): 0 success on every rank; 1 a
 * runtime error (a non-finite loss, a failed checkpoint); 2 bad
 * configuration or input detected before training; 3 stopped by a
 * preemption signal or the stop file after writing the resume file
 * (requeued if asked); 4 a peer rank died.
 */
#ifndef COHORT_TRAINER_H
#define COHORT_TRAINER_H

#include "framework/core/configuration.h"
#include "framework/core/status.h"
#include "framework/nn/nn.h"
#include "framework/runtime/job.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ch_trainer ch_trainer_t;

/* The trainer's own keys, titled "train": model.arch, model.num_classes,
 * model.in_channels, model.weights, model.weights_reshape,
 * model.freeze_layers, model.sync_bn, train.batch_size, train.seed,
 * train.threads, train.max_steps, train.stop_after, train.log_every,
 * train.eval (`cohort-train --help` describes each). */
ch_config_table_t ch_trainer_config_table(void);

/* Every key table the trainer reads, its own first (then data, optimizer
 * (SGD's keys, then optimizer.name and AdamW's / RMSprop's), schedule (the
 * cosine's, then schedule.name and the others'), loss, ddp, output,
 * runtime, compute), for ch_job_options_t.tables.
 * Fills tables[0 .. min(n, capacity)) and returns n (at most
 * CH_TRAINER_MAX_TABLES). */
#define CH_TRAINER_MAX_TABLES 16
int ch_trainer_tables(ch_config_table_t *tables, int capacity);

/* The profile's phases (data wait, forward, backward, all-reduce wait,
 * optimizer, eval, checkpoint, gpu wait, SyncBN comm fwd/bwd), for
 * ch_job_options_t.phase_names; *n (may be NULL) receives the count. */
const char *const *ch_trainer_phase_names(int *n);

/* Build everything for a job started by ch_job_init with the trainer's
 * tables, its phases, compute = 1, output_dir_key "output.dir",
 * threads_key "train.threads" and preemption (ch_trainer_main does
 * exactly that): data, batch feed, the model, DDP, optimizer, schedule, resume,
 * the initial broadcast of rank 0's state, metrics files; then logs the
 * run's description. model: NULL builds model.arch through the registry
 * (ch_model_create with model.num_classes, model.in_channels, train.seed);
 * otherwise a finalized CPU model the caller built, which the trainer
 * takes over (destroyed by ch_job_finalize, also on failure). *out is
 * destroyed by ch_job_finalize. Returns CH_JOB_CONTINUE, or the exit code
 * for ch_job_finalize (CH_EXIT_BAD_INPUT for config, data, model or resume
 * errors, CH_EXIT_ERROR for runtime failures), the error printed once. */
int ch_trainer_setup(ch_job_t *job, ch_model_t *model, ch_trainer_t **out);

/* Train from the start (or resumed) epoch to schedule.epochs, or until
 * train.stop_after epochs or an agreed stop. Returns the exit code for
 * ch_job_finalize (CH_EXIT_OK, CH_EXIT_ERROR, CH_EXIT_PREEMPTED). */
int ch_trainer_fit(ch_trainer_t *trainer);

/* The model being trained (on the device on GPU ranks). */
ch_model_t *ch_trainer_model(const ch_trainer_t *trainer);

typedef struct {
    const char *name;         /* program name for --help, messages, the man page
                                 (default "cohort-train") */
    const char *summary;      /* one line for --help */
    const char *default_arch; /* NULL: resnet18; else model.arch's default */
} ch_trainer_main_options_t;

void ch_trainer_main_options_default(ch_trainer_main_options_t *o);

/* A whole training program: ch_job_init with ch_trainer_tables, then
 * ch_trainer_setup (model from model.arch), ch_trainer_fit and
 * ch_job_finalize. Returns the process exit status (job.h). opts may be
 * NULL (cohort-train's). Call it once per process. */
int ch_trainer_main(int argc, char **argv, const ch_trainer_main_options_t *opts);

#ifdef __cplusplus
}
#endif
#endif /* COHORT_TRAINER_H */
