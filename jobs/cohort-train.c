/* cohort-train: data-parallel training of ResNets (PyTorch DDP recipe).
 *
 *   mpiexec -n W jobs/cohort-train [--config FILE] [--key=value ...] [--resume [PATH]]
 *                                  [--resume-allow KEY,...]
 *   srun --mpi=pmi2 jobs/cohort-train ...
 *
 * The whole job is the library's trainer (trainer/trainer.h: the epoch
 * loop, evaluation, checkpoints, resume, metrics, devices) on the job
 * runtime (framework/runtime/job.h); a program with a network of its own
 * registers it (ch_model_register) and calls ch_trainer_main the same way.
 * Exit status: framework/runtime/job.h.
 */
#include "config.h"

#include "trainer/trainer.h"

int main(int argc, char **argv) { return ch_trainer_main(argc, argv, NULL); }
