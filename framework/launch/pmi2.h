/* cohort: Slurm's PMI2 client as a bootstrap channel without MPI.
 *
 * When a job is started by `srun --mpi=pmi2`, every task can reach the
 * launcher's key-value space (KVS). cohort uses it to hand the NCCL unique id
 * (128 bytes) from rank 0 to the other ranks when MPI is not initialised
 * (framework/dist/dist.h ch_pg_create_nccl_pmi2); the functions are generic byte
 * broadcasts, so tests exercise them on a CPU-only machine under a real
 * slurmd (tests/test_slurm.sh).
 *
 * Built against Slurm's libpmi2 (Debian: libpmi2-0-dev) when configure found
 * it; otherwise every function returns CH_ERR_UNSUPPORTED saying so.
 */
#ifndef COHORT_PMI2_H
#define COHORT_PMI2_H

#include <stddef.h>

#include "framework/core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Largest payload ch_pmi2_kvs_bcast can carry, bytes (values are hex text
 * in one PMI2 value of PMI2_MAX_VALLEN = 1024 characters). */
#define CH_PMI2_BCAST_MAX 500

/* Join the PMI2 job (PMI2_Init unless already initialised) and report this
 * task's rank and the job's size. *inited_here (may be NULL) is 1 when this
 * call initialised PMI2, so the caller owes a ch_pmi2_finalize.
 * Errors: CH_ERR_UNSUPPORTED (built without libpmi2); CH_ERR_PMI when there
 * is no PMI2 launcher: PMI2_Init then "succeeds" as a size-1 singleton but
 * PMI2_Job_GetId fails — reported as "not started by srun --mpi=pmi2". */
ch_status ch_pmi2_init(int *rank, int *size, int *inited_here);

/* PMI2_Finalize (only if ch_pmi2_init initialised it: pass its inited_here). */
void ch_pmi2_finalize(int inited_here);

/* Collective over all `size` tasks of the PMI2 job: rank 0's `n` bytes at
 * buf (1 <= n <= CH_PMI2_BCAST_MAX) reach every rank's buf, unless some rank
 * failed. local_status is each rank's own state before the exchange (e.g.
 * whether it could select its GPU). Two rounds through the KVS:
 *   1. every rank puts its status under "<key>-s<rank>"; PMI2_KVS_Fence;
 *   2. rank 0 reads all statuses and puts under "<key>" either its data (as
 *      hex) or "fail:" + the lowest failed rank and its status; fence; the
 *      other ranks read "<key>".
 * So a failure on ANY rank reaches every rank, and no rank waits for data
 * or peers that will never come (e.g. in ncclCommInitRank). Rank 0 does
 * size - 1 gets, the others one. key: unique per use, the same on every
 * rank, at most 40 characters. Every rank must call it, also after a local
 * failure. Returns CH_OK, the rank's own local_status when it failed itself,
 * CH_ERR_REMOTE naming the failed rank and its status, CH_ERR_INVALID
 * (arguments), or CH_ERR_PMI (a PMI2 call failed, or a value is malformed). */
ch_status ch_pmi2_kvs_bcast(const char *key, int rank, int size, void *buf, size_t n,
                            ch_status local_status);

#ifdef __cplusplus
}
#endif
#endif /* COHORT_PMI2_H */
