/* cohort: who am I — rank, world size, local rank, node and GPU discovery.
 *
 * Implements SEMANTICS.md "Ranks and devices":
 *   1. MPI (initialised first by the caller). MPI world size > 1: MPI's rank
 *      and size are the truth, whatever other variables say; local rank and
 *      local size come from MPI_Comm_split_type(MPI_COMM_TYPE_SHARED), the node
 *      id from the order of the nodes' lowest ranks.
 *   2. MPI singleton: the launcher's variables —
 *        torchrun:  RANK, WORLD_SIZE (both required), LOCAL_RANK,
 *                   LOCAL_WORLD_SIZE, GROUP_RANK (node), MASTER_ADDR/PORT;
 *        srun step: SLURM_PROCID, SLURM_STEP_NUM_TASKS (else SLURM_NTASKS,
 *                   else SLURM_NPROCS), SLURM_LOCALID, SLURM_NODEID,
 *                   SLURM_STEP_TASKS_PER_NODE (else SLURM_TASKS_PER_NODE;
 *                   local size, from a list such as "2(x3),1"); a step is
 *                   recognised by SLURM_STEP_NUM_TASKS or SLURM_STEP_ID /
 *                   SLURM_STEPID (a batch script has SLURM_JOB_ID but is not
 *                   a step). With PMI_FD set and libpmi2 compiled in, PMI2's
 *                   rank and size are used and cross-checked against
 *                   SLURM_PROCID and the task count.
 *      torchrun wins over Slurm (torchrun inside an allocation inherits the
 *      allocation's Slurm variables).
 *   3. Nothing: world size 1, and one info line "distributed mode off" (an
 *      MPI world of one process, a singleton or mpiexec -n 1, is this case).
 * Every variable that is read is validated: non-numeric or negative values,
 * RANK >= WORLD_SIZE, LOCAL_RANK >= LOCAL_WORLD_SIZE, SLURM_PROCID >= number
 * of tasks, ... are errors naming the variable and its value.
 *
 * The mismatch check: when the job needs MPI collectives (CPU backend) and MPI
 * is a singleton while the launcher says the world is larger, discovery fails
 * naming both counts and the likely cause (srun --mpi=none, an MPI built for
 * another PMI, torchrun without mpiexec) — otherwise every process would
 * believe it is "rank 0 of 1".
 *
 * Nodes are told apart (for the PMI2 device check and in messages) by
 * SLURMD_NODENAME when set, else the host name.
 *
 * GPU rule (ch_device_rule): AUTO = SLURM_PROCID % device_count for a Slurm
 * launch (the classic rule; in a Slurm launch rank == SLURM_PROCID), local rank
 * for torchrun and MPI launches; or either rule explicitly. device_count 1
 * (Slurm restricted CUDA_VISIBLE_DEVICES to one GPU per task) -> device 0;
 * device_count 0 -> CPU (device -1). After choosing, ranks on the same node
 * compare devices (ch_env_check_devices); two ranks on one GPU is an error on
 * every rank naming both ranks and suggesting the local-rank rule.
 *
 * Testability: the decision functions are pure. ch_env_resolve takes MPI's
 * view and PMI2's view as structs and reads variables through a lookup
 * callback (ch_env_lookup_list reads a "NAME=VALUE" array, ch_env_lookup_process
 * the real environment); ch_env_choose_device takes the device count as a
 * parameter. ch_env_discover is the convenience wrapper for jobs.
 */
#ifndef COHORT_ENV_H
#define COHORT_ENV_H

#include "framework/core/status.h"

#include <mpi.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    CH_LAUNCHER_NONE = 0, /* single process, distributed mode off */
    CH_LAUNCHER_MPI,      /* MPI world size > 1 (mpiexec, or srun --mpi=pmi2 with MPI) */
    CH_LAUNCHER_TORCHRUN, /* RANK / WORLD_SIZE variables */
    CH_LAUNCHER_SLURM,    /* srun step variables (and PMI2 when available) */
    CH_LAUNCHER_PMI2,     /* PMI2 job without Slurm variables */
} ch_launcher_kind;

/* "none", "mpi", "torchrun", "slurm", "pmi2". */
const char *ch_launcher_name(ch_launcher_kind k);

typedef enum {
    CH_DEVICE_RULE_AUTO = 0,         /* Slurm launch: procid % count; else local rank */
    CH_DEVICE_RULE_SLURM_PROCID_MOD, /* rank (== SLURM_PROCID under srun) % count */
    CH_DEVICE_RULE_LOCAL_RANK,       /* local rank; error when >= count */
} ch_device_rule;

/* Names for config keys, indexed by ch_device_rule: "auto",
 * "slurm_procid_mod", "local_rank" (use with ch_config_get_choice). */
extern const char *const ch_device_rule_names[3];

/* Parse a rule name (exact, as in ch_device_rule_names). CH_ERR_INVALID
 * naming the text and the accepted names otherwise. */
ch_status ch_device_rule_parse(const char *text, ch_device_rule *out);

/* This process's place in the job. Unknown integer fields are -1. */
typedef struct {
    int rank;             /* 0 <= rank < world_size */
    int world_size;       /* >= 1 */
    int local_rank;       /* rank among the processes on this node, or -1 */
    int local_world_size; /* processes on this node, or -1 */
    int node_id;          /* 0-based node index, or -1 */
    int node_count;       /* number of nodes, or -1 */
    ch_launcher_kind launcher;
    int mpi_world_size;   /* MPI_COMM_WORLD size; 0 when MPI is not initialised */
    int pmi2;             /* 1: identity confirmed by PMI2 (PMI2 stays initialised
                             until ch_env_finalize, for KVS use) */
    char pmi2_jobid[256]; /* PMI2 job id when pmi2, else "" */
    char master_addr[256];/* MASTER_ADDR or "" */
    int master_port;      /* MASTER_PORT (1..65535) or 0 */
    char cuda_visible_devices[256]; /* CUDA_VISIBLE_DEVICES as seen, or "" (unset) */
    char node_name[64];   /* SLURMD_NODENAME, else the host name */
    ch_device_rule device_rule;     /* rule ch_env_choose_device applied (AUTO resolved
                                       to the rule it stood for when >1 GPU) */
    int device_count;     /* GPUs visible (set by ch_env_discover), or -1 */
    int device;           /* chosen GPU, -1 = CPU */
    char note[256];       /* one line describing the discovery, for the log */
} ch_env_t;

/* ---- environment lookup callbacks */

/* Returns the value of variable `name` or NULL when unset. */
typedef const char *(*ch_env_lookup_fn)(const char *name, void *ctx);

/* ctx is a NULL-terminated array of "NAME=VALUE" strings (const char **). */
const char *ch_env_lookup_list(const char *name, void *ctx);

/* ctx is ignored; getenv(). */
const char *ch_env_lookup_process(const char *name, void *ctx);

/* ---- pure decision functions */

/* MPI's view of the job (fill with ch_env_mpi_query, or by hand in tests). */
typedef struct {
    int initialized;      /* MPI_Init done */
    int rank, size;       /* MPI_COMM_WORLD */
    int local_rank, local_size; /* in the MPI_COMM_TYPE_SHARED communicator */
    int node_id, node_count;
} ch_env_mpi_t;

/* PMI2's view (fill with ch_env_pmi2_probe, or by hand in tests). */
typedef struct {
    int available;        /* PMI2 initialised and a job id obtained */
    int rank, size;
    char jobid[256];
} ch_env_pmi2_t;

/* Decide rank, world size, local rank, node and launcher from MPI's view,
 * PMI2's view (may be NULL) and the variables read through lookup(name, ctx).
 * needs_mpi_collectives != 0 enables the singleton-vs-launcher mismatch check.
 * Fills *out (device fields: device_count -1, device -1) and out->note.
 * Errors: CH_ERR_INVALID naming the variable and value (non-numeric,
 * negative, zero world size, rank >= world size, local rank >= local size,
 * missing RANK or WORLD_SIZE when the other is set, MASTER_PORT outside
 * 1..65535); CH_ERR_PMI when PMI2 disagrees with the Slurm variables;
 * CH_ERR_MPI for the singleton-vs-launcher mismatch. */
ch_status ch_env_resolve(const ch_env_mpi_t *mpi, const ch_env_pmi2_t *pmi2,
                         ch_env_lookup_fn lookup, void *ctx, int needs_mpi_collectives,
                         ch_env_t *out);

/* Choose the GPU for env's rank: -1 (CPU) when device_count is 0, 0 when it is
 * 1, else by rule (see the top of this file). Sets env->device, device_count
 * and device_rule too. Errors: CH_ERR_INVALID (device_count < 0), CH_ERR_RANGE
 * (local-rank rule with an unknown local rank, or local rank >= device_count:
 * more ranks on the node than visible GPUs). */
ch_status ch_env_choose_device(ch_env_t *env, ch_device_rule rule, int device_count);

/* ---- collective checks and queries (need MPI initialised) */

/* Collective: every rank of the job calls it, including a rank whose own
 * device choice failed (pass that status as my_status). Ranks on the same node
 * compare env->device (as physical GPUs: the CUDA_VISIBLE_DEVICES entry when
 * set, so tasks that each see "GPU 0" of a different GPU do not conflict).
 * Over MPI: comm's ranks sharing a node (MPI_COMM_TYPE_SHARED), verdicts
 * all-reduced over comm. When comm has one rank but the world is a PMI2 world
 * (env->pmi2, world_size > 1; srun without MPI), through the PMI2 KVS instead,
 * nodes told apart by env->node_name. Without either (torchrun world, MPI
 * singleton, no PMI2) only this rank is checked.
 * Returns: my_status with its message when it failed; CH_ERR_INVALID on the
 * ranks of a node where two ranks chose one GPU, naming both ranks (env->rank
 * values), the GPU, the node and suggesting the local-rank rule; CH_ERR_REMOTE
 * on every other rank when some rank had a conflict or a failure; CH_ERR_MPI /
 * CH_ERR_PMI when the exchange fails. CPU ranks (device -1) never conflict. */
ch_status ch_env_check_devices_status(const ch_env_t *env, ch_status my_status, MPI_Comm comm);

/* ch_env_check_devices_status(env, CH_OK, comm). */
ch_status ch_env_check_devices(const ch_env_t *env, MPI_Comm comm);

/* MPI's view: world rank/size, the shared-memory split and node numbering
 * (collective over MPI_COMM_WORLD when size > 1). Not initialised -> view
 * with initialized 0, size 0. Errors: CH_ERR_MPI. */
ch_status ch_env_mpi_query(ch_env_mpi_t *out);

/* PMI2's view: PMI2_Init then PMI2_Job_GetId. A PMI2 that initialises as a
 * size-1 singleton but has no job id (no launcher) gives available 0, CH_OK,
 * and is finalised again. Without libpmi2 compiled in: available 0, CH_OK.
 * Errors: CH_ERR_PMI when PMI2_Init fails (message names PMI_FD's value). On
 * success with available 1, PMI2 stays initialised (ch_env_finalize). */
ch_status ch_env_pmi2_probe(ch_env_pmi2_t *out);

/* ---- the wrapper jobs use */

typedef struct {
    int needs_mpi_collectives; /* CPU backend: collectives go through MPI */
    ch_device_rule device_rule;
    int identity_only;         /* 1: rank/world only; no GPU choice or check
                                  (device_count and device stay -1). For jobs
                                  that read the device rule from their config
                                  after discovery: they then call
                                  ch_device_count, ch_env_choose_device and
                                  ch_env_check_devices themselves. */
    int quiet;                 /* 1: do not log env->note (the caller logs it
                                  when it wants, e.g. not before --help) */
} ch_env_options_t;

/* Discover this process's identity and GPU from the real environment:
 * ch_env_mpi_query, ch_env_pmi2_probe (only when MPI is a singleton and PMI_FD
 * is set; a failing PMI2 is a warning and the Slurm variables are used),
 * ch_env_resolve with ch_env_lookup_process, ch_device_count,
 * ch_env_choose_device, and ch_env_check_devices over MPI_COMM_WORLD (MPI
 * world > 1) — the GPU steps are skipped with opt->identity_only. Tells the
 * logger the rank (ch_log_set_rank) and, unless opt->quiet, logs env->note
 * (with the GPU choice) as one info line ("distributed mode off ..." for a
 * single process).
 * Requires MPI to be initialised (CH_ERR_INVALID otherwise). Errors: those of
 * the functions above. */
ch_status ch_env_discover(const ch_env_options_t *opt, ch_env_t *out);

/* Release what discovery holds (PMI2_Finalize when env->pmi2). Idempotent. */
void ch_env_finalize(ch_env_t *env);

#ifdef __cplusplus
}
#endif
#endif /* COHORT_ENV_H */
