/* cohort: rank, world size, local rank, node and GPU discovery (see env.h). */
#include "config.h"

#include "framework/launch/env.h"
#include "framework/tensor/device.h"
#include "framework/core/log.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef HAVE_PMI2
#include <slurm/pmi2.h>
#endif

const char *const ch_device_rule_names[3] = {"auto", "slurm_procid_mod", "local_rank"};

const char *ch_launcher_name(ch_launcher_kind k)
{
    switch (k) {
    case CH_LAUNCHER_NONE: return "none";
    case CH_LAUNCHER_MPI: return "mpi";
    case CH_LAUNCHER_TORCHRUN: return "torchrun";
    case CH_LAUNCHER_SLURM: return "slurm";
    case CH_LAUNCHER_PMI2: return "pmi2";
    }
    return "?";
}

ch_status ch_device_rule_parse(const char *text, ch_device_rule *out)
{
    CH_REQUIRE(out != NULL, "ch_device_rule_parse: out is NULL");
    for (int i = 0; i < 3; i++)
        if (text && !strcmp(text, ch_device_rule_names[i])) {
            *out = (ch_device_rule)i;
            return CH_OK;
        }
    return CH_ERROR(CH_ERR_INVALID, "device rule '%s': expected auto, slurm_procid_mod or local_rank",
                    text ? text : "(null)");
}

static const char *rule_name(ch_device_rule r)
{
    return (int)r >= 0 && (int)r < 3 ? ch_device_rule_names[r] : "?";
}

/* ---------------------------------------------------------------- lookup */

const char *ch_env_lookup_list(const char *name, void *ctx)
{
    const char *const *list = ctx;
    size_t n = strlen(name);
    const char *found = NULL;
    for (; list && *list; list++)
        if (!strncmp(*list, name, n) && (*list)[n] == '=') found = *list + n + 1; /* last wins */
    return found;
}

const char *ch_env_lookup_process(const char *name, void *ctx)
{
    (void)ctx;
    return getenv(name);
}

typedef struct {
    ch_env_lookup_fn fn;
    void *ctx;
} lookup_t;

static const char *get(const lookup_t *l, const char *name)
{
    return l->fn(name, l->ctx);
}

/* A variable holding a non-negative decimal int. *out = -1 when unset. */
static ch_status get_count(const lookup_t *l, const char *name, int *out)
{
    const char *v = get(l, name);
    *out = -1;
    if (!v) return CH_OK;
    char *end = NULL;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (!(v[0] >= '0' && v[0] <= '9') || *end || errno == ERANGE || x > INT_MAX)
        return CH_ERROR(CH_ERR_INVALID, "environment variable %s='%s' is not a non-negative integer",
                        name, v);
    *out = (int)x;
    return CH_OK;
}

static ch_status require_positive(const char *name, int v)
{
    if (v == 0)
        return CH_ERROR(CH_ERR_INVALID, "environment variable %s=0: a world of 0 processes", name);
    return CH_OK;
}

static ch_status check_below(const char *what, const char *what_var, int v, const char *bound,
                             const char *bound_var, int b)
{
    if (v >= 0 && b >= 0 && v >= b)
        return CH_ERROR(CH_ERR_INVALID, "inconsistent environment: %s %s=%d is not below %s %s=%d",
                        what, what_var, v, bound, bound_var, b);
    return CH_OK;
}

/* Tasks on node `node` from a Slurm tasks-per-node list such as "2(x3),1":
 * -1 when the node is past its end (or there is no list or node), -2 when
 * the list is not of that form. */
static int tasks_on_node(const char *list, int node)
{
    if (!list || node < 0) return -1;
    const char *p = list;
    long index = 0;
    int found = -1;
    if (!*p) return -2;
    while (*p) {
        char *end;
        if (*p < '0' || *p > '9') return -2;
        long n = strtol(p, &end, 10);
        if (n > INT_MAX) return -2;
        long rep = 1;
        p = end;
        if (*p == '(') {
            if (p[1] != 'x' || p[2] < '0' || p[2] > '9') return -2;
            rep = strtol(p + 2, &end, 10);
            if (*end != ')' || rep < 1 || rep > INT_MAX) return -2;
            p = end + 1;
        }
        if (found < 0 && node < index + rep) found = (int)n;
        index += rep;
        if (*p == ',' && p[1]) p++;
        else if (*p) return -2;
    }
    return found;
}

static void copy_str(char *dst, size_t len, const char *src)
{
    snprintf(dst, len, "%s", src ? src : "");
}

/* ---------------------------------------------------------------- resolve */

static ch_status read_master(const lookup_t *l, ch_env_t *e)
{
    copy_str(e->master_addr, sizeof e->master_addr, get(l, "MASTER_ADDR"));
    int port;
    CH_TRY(get_count(l, "MASTER_PORT", &port));
    if (port == 0 || port > 65535)
        return CH_ERROR(CH_ERR_INVALID, "environment variable MASTER_PORT='%s' is not a port "
                        "(1..65535)", get(l, "MASTER_PORT"));
    e->master_port = port < 0 ? 0 : port;
    return CH_OK;
}

static ch_status resolve_torchrun(const lookup_t *l, ch_env_t *e)
{
    int rank, world, lrank, lworld, group;
    CH_TRY(get_count(l, "RANK", &rank));
    CH_TRY(get_count(l, "WORLD_SIZE", &world));
    CH_TRY(get_count(l, "LOCAL_RANK", &lrank));
    CH_TRY(get_count(l, "LOCAL_WORLD_SIZE", &lworld));
    CH_TRY(get_count(l, "GROUP_RANK", &group));
    if (rank < 0 || world < 0)
        return CH_ERROR(CH_ERR_INVALID, "torchrun-style environment incomplete: %s is set but %s "
                        "is not (both RANK and WORLD_SIZE are required)",
                        rank >= 0 ? "RANK" : (world >= 0 ? "WORLD_SIZE" : "LOCAL_RANK"),
                        rank < 0 ? "RANK" : "WORLD_SIZE");
    CH_TRY(require_positive("WORLD_SIZE", world));
    if (lworld >= 0) CH_TRY(require_positive("LOCAL_WORLD_SIZE", lworld));
    CH_TRY(check_below("rank", "RANK", rank, "world size", "WORLD_SIZE", world));
    CH_TRY(check_below("local rank", "LOCAL_RANK", lrank, "local world size", "LOCAL_WORLD_SIZE",
                       lworld));
    CH_TRY(check_below("local rank", "LOCAL_RANK", lrank, "world size", "WORLD_SIZE", world));
    if (lworld > world)
        return CH_ERROR(CH_ERR_INVALID, "inconsistent environment: LOCAL_WORLD_SIZE=%d exceeds "
                        "WORLD_SIZE=%d", lworld, world);
    e->launcher = CH_LAUNCHER_TORCHRUN;
    e->rank = rank;
    e->world_size = world;
    e->local_rank = lrank;
    e->local_world_size = lworld;
    e->node_id = group;
    if (lworld > 0 && world % lworld == 0) e->node_count = world / lworld;
    CH_TRY(read_master(l, e));
    snprintf(e->note, sizeof e->note, "torchrun: rank %d of %d (RANK/WORLD_SIZE), local rank %d",
             rank, world, lrank);
    return CH_OK;
}

/* An srun step's variables, with PMI2's view when available. */
static ch_status resolve_slurm(const lookup_t *l, const ch_env_pmi2_t *pmi2, ch_env_t *e)
{
    int procid, ntasks, localid, nodeid, nnodes;
    const char *ntasks_var = "SLURM_STEP_NUM_TASKS";
    CH_TRY(get_count(l, "SLURM_PROCID", &procid));
    CH_TRY(get_count(l, ntasks_var, &ntasks));
    if (ntasks < 0) {
        ntasks_var = "SLURM_NTASKS";
        CH_TRY(get_count(l, ntasks_var, &ntasks));
    }
    if (ntasks < 0) {
        ntasks_var = "SLURM_NPROCS";
        CH_TRY(get_count(l, ntasks_var, &ntasks));
    }
    CH_TRY(get_count(l, "SLURM_LOCALID", &localid));
    CH_TRY(get_count(l, "SLURM_NODEID", &nodeid));
    CH_TRY(get_count(l, "SLURM_STEP_NUM_NODES", &nnodes));
    if (nnodes < 0) CH_TRY(get_count(l, "SLURM_NNODES", &nnodes));
    if (ntasks >= 0) CH_TRY(require_positive(ntasks_var, ntasks));
    if (nnodes >= 0) CH_TRY(require_positive("SLURM_STEP_NUM_NODES", nnodes));
    CH_TRY(check_below("task id", "SLURM_PROCID", procid, "task count", ntasks_var, ntasks));
    CH_TRY(check_below("node id", "SLURM_NODEID", nodeid, "node count", "SLURM_STEP_NUM_NODES",
                       nnodes));

    /* the step's layout; srun also sets SLURM_TASKS_PER_NODE to it (an
     * allocation's layout in a batch script, which is not a step) */
    const char *tpn_var = "SLURM_STEP_TASKS_PER_NODE";
    const char *tpn = get(l, tpn_var);
    if (!tpn) {
        tpn_var = "SLURM_TASKS_PER_NODE";
        tpn = get(l, tpn_var);
    }
    int lsize = tasks_on_node(tpn, nodeid);
    if (tpn && nodeid >= 0 && lsize == -2)
        return CH_ERROR(CH_ERR_INVALID, "environment variable %s='%s' is not a Slurm "
                        "tasks-per-node list (counts with optional repeats, e.g. 2(x3),1)",
                        tpn_var, tpn);
    if (tpn && nodeid >= 0 && lsize < 0)
        return CH_ERROR(CH_ERR_INVALID, "environment variable %s='%s' has no entry for "
                        "SLURM_NODEID=%d", tpn_var, tpn, nodeid);
    if (lsize < 0) lsize = -1;
    CH_TRY(check_below("local task id", "SLURM_LOCALID", localid, "tasks on this node", tpn_var,
                       lsize));

    if (pmi2 && pmi2->available) {
        if (procid >= 0 && procid != pmi2->rank)
            return CH_ERROR(CH_ERR_PMI, "PMI2 says rank %d but SLURM_PROCID=%d", pmi2->rank,
                            procid);
        if (ntasks >= 0 && ntasks != pmi2->size)
            return CH_ERROR(CH_ERR_PMI, "PMI2 says %d processes but %s=%d", pmi2->size,
                            ntasks_var, ntasks);
        procid = pmi2->rank;
        ntasks = pmi2->size;
    }
    if (procid < 0 || ntasks < 0)
        return CH_ERROR(CH_ERR_INVALID, "srun step environment incomplete: %s (need SLURM_PROCID "
                        "and SLURM_STEP_NUM_TASKS or SLURM_NTASKS)",
                        procid < 0 ? "SLURM_PROCID is not set" : "no task count is set");
    CH_TRY(check_below("task id", "SLURM_PROCID", procid, "task count", ntasks_var, ntasks));

    e->launcher = CH_LAUNCHER_SLURM;
    e->rank = procid;
    e->world_size = ntasks;
    e->local_rank = localid;
    e->local_world_size = lsize;
    e->node_id = nodeid;
    e->node_count = nnodes;
    CH_TRY(read_master(l, e));
    snprintf(e->note, sizeof e->note, "srun step%s: rank %d of %d (SLURM_PROCID/%s), local rank "
             "%d, node %d",
             pmi2 && pmi2->available ? " (PMI2)" : "", procid, ntasks, ntasks_var, localid,
             nodeid);
    return CH_OK;
}

static void mismatch_cause(const ch_env_t *e, char *buf, size_t len)
{
    switch (e->launcher) {
    case CH_LAUNCHER_TORCHRUN:
        snprintf(buf, len, "torchrun starts processes without MPI; launch the CPU backend with "
                           "mpiexec or srun --mpi=pmi2 instead");
        break;
    case CH_LAUNCHER_SLURM:
    case CH_LAUNCHER_PMI2:
        snprintf(buf, len, "likely srun --mpi=none (use srun --mpi=pmi2), or an MPI built for "
                           "another PMI than this launcher provides (see srun --mpi=list and "
                           "the MPI's PMI support)");
        break;
    default: snprintf(buf, len, "unknown launcher"); break;
    }
}

ch_status ch_env_resolve(const ch_env_mpi_t *mpi, const ch_env_pmi2_t *pmi2,
                         ch_env_lookup_fn lookup, void *ctx, int needs_mpi_collectives,
                         ch_env_t *out)
{
    CH_REQUIRE(mpi != NULL && lookup != NULL && out != NULL,
               "ch_env_resolve: NULL mpi view, lookup or output");
    ch_env_t e;
    memset(&e, 0, sizeof e);
    e.local_rank = e.local_world_size = e.node_id = e.node_count = -1;
    e.device_count = -1;
    e.device = -1;
    e.mpi_world_size = mpi->initialized ? mpi->size : 0;
    lookup_t l = {lookup, ctx};
    copy_str(e.cuda_visible_devices, sizeof e.cuda_visible_devices,
             get(&l, "CUDA_VISIBLE_DEVICES"));
    /* Slurm's node name when there is one (unique in the cluster, and distinct
     * for nodes simulated on one host), else the host name. */
    if (get(&l, "SLURMD_NODENAME") && get(&l, "SLURMD_NODENAME")[0])
        copy_str(e.node_name, sizeof e.node_name, get(&l, "SLURMD_NODENAME"));
    else if (gethostname(e.node_name, sizeof e.node_name - 1) != 0)
        copy_str(e.node_name, sizeof e.node_name, "?");

    /* Another MPI's launcher (Open MPI's mpirun/prterun, or a PMIx
     * launcher) started this process: the MPI it was built with does not
     * speak that launcher's protocol, so every process is a world of one.
     * Without this check the N copies would each train as "rank 0 of 1"
     * into the same output directory. */
    if (!(mpi->initialized && mpi->size > 1)) {
        int n = 0;
        const char *var = get(&l, "OMPI_COMM_WORLD_SIZE") ? "OMPI_COMM_WORLD_SIZE" : "PMIX_SIZE";
        if (get(&l, var) && get_count(&l, var, &n) == CH_OK && n > 1)
            return CH_ERROR(CH_ERR_MPI, "%s=%d says this process is one of %d started by "
                            "another MPI's launcher (Open MPI / PMIx), but MPI sees a world of "
                            "1: start cohort with the mpiexec of the MPI it was built with "
                            "(MPICH's mpiexec.hydra) or srun --mpi=pmi2", var, n, n);
        ch_error_clear();
    }
    if (mpi->initialized && mpi->size > 1) {
        /* MPI is the truth; launcher variables describe something else
         * (e.g. the Slurm allocation around mpiexec). */
        CH_REQUIRE(mpi->rank >= 0 && mpi->rank < mpi->size, "ch_env_resolve: MPI rank %d of %d",
                   mpi->rank, mpi->size);
        e.launcher = CH_LAUNCHER_MPI;
        e.rank = mpi->rank;
        e.world_size = mpi->size;
        e.local_rank = mpi->local_rank;
        e.local_world_size = mpi->local_size;
        e.node_id = mpi->node_id;
        e.node_count = mpi->node_count;
        copy_str(e.master_addr, sizeof e.master_addr, get(&l, "MASTER_ADDR"));
        int port;
        if (get_count(&l, "MASTER_PORT", &port) == CH_OK && port > 0 && port <= 65535)
            e.master_port = port;
        ch_error_clear();
        snprintf(e.note, sizeof e.note, "MPI: rank %d of %d, local rank %d of %d, node %d of %d",
                 e.rank, e.world_size, e.local_rank, e.local_world_size, e.node_id, e.node_count);
        *out = e;
        return CH_OK;
    }

    int in_step = get(&l, "SLURM_PROCID") &&
                  (get(&l, "SLURM_STEP_NUM_TASKS") || get(&l, "SLURM_STEP_ID") ||
                   get(&l, "SLURM_STEPID"));
    if (get(&l, "RANK") || get(&l, "WORLD_SIZE") || get(&l, "LOCAL_RANK")) {
        CH_TRY(resolve_torchrun(&l, &e));
    } else if (in_step) {
        CH_TRY(resolve_slurm(&l, pmi2, &e));
    } else if (pmi2 && pmi2->available) {
        e.launcher = CH_LAUNCHER_PMI2;
        e.rank = pmi2->rank;
        e.world_size = pmi2->size;
        CH_TRY(read_master(&l, &e));
        snprintf(e.note, sizeof e.note, "PMI2: rank %d of %d (job %.64s)", e.rank, e.world_size,
                 pmi2->jobid);
    } else {
        e.launcher = CH_LAUNCHER_NONE;
        e.rank = 0;
        e.world_size = 1;
        e.local_rank = 0;
        e.local_world_size = 1;
        e.node_id = 0;
        e.node_count = 1;
        const char *job = get(&l, "SLURM_JOB_ID");
        if (job)
            snprintf(e.note, sizeof e.note, "distributed mode off: one process (inside Slurm job "
                     "%.64s but not in an srun step)", job);
        else if (mpi->initialized)
            snprintf(e.note, sizeof e.note, "distributed mode off: one process (an MPI world of "
                     "1; no torchrun or srun step variables)");
        else
            snprintf(e.note, sizeof e.note, "distributed mode off: one process (MPI not "
                     "initialised; no torchrun or srun step variables)");
    }
    if (pmi2 && pmi2->available &&
        (e.launcher == CH_LAUNCHER_SLURM || e.launcher == CH_LAUNCHER_PMI2)) {
        e.pmi2 = 1;
        copy_str(e.pmi2_jobid, sizeof e.pmi2_jobid, pmi2->jobid);
    }

    if (needs_mpi_collectives && e.world_size > 1) {
        char cause[256];
        mismatch_cause(&e, cause, sizeof cause);
        return CH_ERROR(CH_ERR_MPI,
                        "MPI world size is %d but the %s launcher says world size %d (this is "
                        "rank %d): the CPU backend needs MPI collectives and every process would "
                        "run as rank 0 of 1; %s",
                        mpi->initialized ? mpi->size : 0, ch_launcher_name(e.launcher),
                        e.world_size, e.rank, cause);
    }
    *out = e;
    return CH_OK;
}

/* ---------------------------------------------------------------- device */

ch_status ch_env_choose_device(ch_env_t *env, ch_device_rule rule, int device_count)
{
    CH_REQUIRE(env != NULL, "ch_env_choose_device: env is NULL");
    CH_REQUIRE(device_count >= 0, "ch_env_choose_device: device count %d < 0", device_count);
    CH_REQUIRE((int)rule >= 0 && (int)rule < 3, "ch_env_choose_device: unknown rule %d", (int)rule);
    env->device_rule = rule;
    env->device_count = device_count;
    if (device_count == 0) {
        env->device = -1;
        return CH_OK;
    }
    if (device_count == 1) {
        env->device = 0;
        return CH_OK;
    }
    ch_device_rule r = rule;
    if (r == CH_DEVICE_RULE_AUTO)
        r = env->launcher == CH_LAUNCHER_SLURM || env->launcher == CH_LAUNCHER_PMI2
                ? CH_DEVICE_RULE_SLURM_PROCID_MOD
                : CH_DEVICE_RULE_LOCAL_RANK;
    env->device_rule = r; /* the effective rule, for messages */
    if (r == CH_DEVICE_RULE_SLURM_PROCID_MOD) {
        env->device = env->rank % device_count;
        return CH_OK;
    }
    if (env->local_rank < 0)
        return CH_ERROR(CH_ERR_RANGE, "rank %d: device rule local_rank but the local rank is "
                        "unknown (launcher %s did not give LOCAL_RANK / SLURM_LOCALID)",
                        env->rank, ch_launcher_name(env->launcher));
    if (env->local_rank >= device_count)
        return CH_ERROR(CH_ERR_RANGE, "rank %d: local rank %d but only %d GPU(s) visible "
                        "(CUDA_VISIBLE_DEVICES='%s'): more ranks on this node than GPUs",
                        env->rank, env->local_rank, device_count, env->cuda_visible_devices);
    env->device = env->local_rank;
    return CH_OK;
}

/* One rank's choice, as compared between ranks. */
typedef struct {
    int rank;       /* env->rank */
    int device;     /* ordinal, -1 = CPU (or failed) */
    int failed;     /* this rank could not choose */
    char host[64];  /* env->node_name */
    char phys[64];  /* physical GPU: CUDA_VISIBLE_DEVICES entry or ordinal */
} choice_t;

/* The physical GPU behind ordinal `device`: the device-th entry of
 * CUDA_VISIBLE_DEVICES when set (Slurm may give each task a different one, all
 * seen as ordinal 0), else the ordinal itself. */
static void make_choice(const ch_env_t *e, int failed, choice_t *c)
{
    memset(c, 0, sizeof *c);
    c->rank = e->rank;
    c->failed = failed;
    c->device = failed ? -1 : e->device;
    snprintf(c->host, sizeof c->host, "%s", e->node_name[0] ? e->node_name : "?");
    const char *cvd = e->cuda_visible_devices;
    if (c->device >= 0 && cvd[0]) {
        const char *p = cvd;
        for (int i = 0; i < c->device && p; i++) {
            p = strchr(p, ',');
            if (p) p++;
        }
        if (p) {
            size_t len = strcspn(p, ",");
            snprintf(c->phys, sizeof c->phys, "%.*s", (int)(len < 63 ? len : 63), p);
            return;
        }
    }
    snprintf(c->phys, sizeof c->phys, "%d", c->device);
}

static int cmp_choice(const void *x, const void *y)
{
    const choice_t *a = x, *b = y;
    int r = strcmp(a->host, b->host);
    if (!r) r = strcmp(a->phys, b->phys);
    if (!r) r = (a->device >= 0) - (b->device >= 0);
    if (!r) r = (a->rank > b->rank) - (a->rank < b->rank);
    return r;
}

/* First pair of GPU ranks on one node with the same physical GPU (sorts c).
 * Returns 1 and the pair (lower rank first, lowest such rank) when found. */
static int find_duplicate(choice_t *c, int n, choice_t *a, choice_t *b)
{
    qsort(c, (size_t)n, sizeof *c, cmp_choice);
    int found = 0;
    for (int i = 0; i + 1 < n; i++)
        if (c[i].device >= 0 && c[i + 1].device >= 0 && !strcmp(c[i].host, c[i + 1].host) &&
            !strcmp(c[i].phys, c[i + 1].phys) && (!found || c[i].rank < a->rank)) {
            *a = c[i];
            *b = c[i + 1];
            found = 1;
        }
    return found;
}

static ch_status duplicate_error(const ch_env_t *env, const choice_t *a, const choice_t *b)
{
    const char *hint =
        env->device_count == 1
            ? "each rank sees one GPU and these share it: give every task its own GPU "
              "(e.g. srun --gpus-per-task=1 or --gpu-bind, which set CUDA_VISIBLE_DEVICES) or "
              "start no more ranks per node than GPUs"
        : env->device_rule == CH_DEVICE_RULE_LOCAL_RANK
            ? "the local ranks on this node are not distinct: check LOCAL_RANK / SLURM_LOCALID"
            : "the ranks on this node are not a consecutive block (e.g. srun "
              "--distribution=cyclic) or there are more ranks than GPUs; use the local-rank "
              "device rule (local_rank)";
    return CH_ERROR(CH_ERR_INVALID, "ranks %d and %d on node %s both chose GPU %s (device rule "
                    "%s, %d GPU(s) visible): %s",
                    a->rank, b->rank, a->host, a->phys, rule_name(env->device_rule),
                    env->device_count, hint);
}

/* MPI path: the ranks of comm sharing a node gather their choices; the
 * verdicts are then all-reduced over comm. */
static ch_status check_mpi(const ch_env_t *env, int failed, MPI_Comm comm)
{
    MPI_Comm node;
    int nsize;
    CH_CHECK_MPI(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
    MPI_Comm_size(node, &nsize);
    choice_t mine;
    make_choice(env, failed, &mine);
    choice_t *all = malloc((size_t)nsize * sizeof *all);
    int ok = all != NULL, all_ok = 0;
    /* agree on allocation success first so nobody enters the gather alone */
    if (MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, node) != MPI_SUCCESS) all_ok = 0;
    int rc = all_ok ? MPI_Allgather(&mine, (int)sizeof mine, MPI_BYTE, all, (int)sizeof mine,
                                    MPI_BYTE, node)
                    : MPI_ERR_NO_MEM;
    MPI_Comm_free(&node);
    choice_t a, b;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    int local_dup = rc == MPI_SUCCESS && find_duplicate(all, nsize, &a, &b);
    free(all);
    /* [duplicate on some node, lowest failed rank as INT_MAX - rank, error] */
    int mine3[3] = {local_dup, failed ? INT_MAX - env->rank : -1, rc != MPI_SUCCESS}, any[3];
    CH_CHECK_MPI(MPI_Allreduce(mine3, any, 3, MPI_INT, MPI_MAX, comm));
    if (failed) return CH_ERR_INTERNAL; /* caller restores its own status */
    if (rc != MPI_SUCCESS)
        return CH_ERROR(rc == MPI_ERR_NO_MEM ? CH_ERR_NOMEM : CH_ERR_MPI,
                        "device check: gathering the node's choices failed");
    if (local_dup) return duplicate_error(env, &a, &b);
    if (any[0])
        return CH_ERROR(CH_ERR_REMOTE, "rank %d: two ranks chose the same GPU on another node "
                        "(see that node's error)", env->rank);
    if (any[1] >= 0)
        return CH_ERROR(CH_ERR_REMOTE, "rank %d: rank %d failed to choose its GPU", env->rank,
                        INT_MAX - any[1]);
    if (any[2])
        return CH_ERROR(CH_ERR_REMOTE, "rank %d: the device check failed on another rank",
                        env->rank);
    return CH_OK;
}

#ifdef HAVE_PMI2
/* Lowest rank that failed to choose, or -1. */
static int first_failed(const choice_t *c, int n)
{
    int r = -1;
    for (int i = 0; i < n; i++)
        if (c[i].failed && (r < 0 || c[i].rank < r)) r = c[i].rank;
    return r;
}

/* PMI2 path, for a world without MPI (srun without MPI collectives): every
 * rank publishes its choice in the KVS and reads everybody's, so every rank
 * finds the same conflict wherever it is. O(world) gets per rank, once. */
static ch_status check_pmi2(const ch_env_t *env, int failed)
{
    char key[PMI2_MAX_KEYLEN], val[PMI2_MAX_VALLEN];
    choice_t mine;
    make_choice(env, failed, &mine);
    snprintf(key, sizeof key, "cohort-dev-%d", env->rank);
    snprintf(val, sizeof val, "%d|%d|%s|%s", mine.device, mine.failed, mine.host, mine.phys);
    CH_CHECK_PMI2(PMI2_KVS_Put(key, val));
    CH_CHECK_PMI2(PMI2_KVS_Fence());
    choice_t *all = calloc((size_t)env->world_size, sizeof *all);
    if (!all) return CH_ERROR(CH_ERR_NOMEM, "device check: out of memory");
    for (int r = 0; r < env->world_size; r++) {
        int len = 0;
        snprintf(key, sizeof key, "cohort-dev-%d", r);
        int rc = PMI2_KVS_Get(env->pmi2_jobid, PMI2_ID_NULL, key, val, sizeof val, &len);
        if (rc != PMI2_SUCCESS) {
            free(all);
            return CH_ERROR(CH_ERR_PMI, "device check: PMI2_KVS_Get(%s) failed: PMI2 error %d",
                            key, rc);
        }
        all[r].rank = r;
        if (sscanf(val, "%d|%d|%63[^|]|%63s", &all[r].device, &all[r].failed, all[r].host,
                   all[r].phys) != 4) {
            free(all);
            return CH_ERROR(CH_ERR_PMI, "device check: bad PMI2 value '%s' for %s", val, key);
        }
    }
    int failed_rank = first_failed(all, env->world_size);
    choice_t a, b;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    int dup = find_duplicate(all, env->world_size, &a, &b);
    free(all);
    if (failed) return CH_ERR_INTERNAL; /* caller restores its own status */
    if (dup) {
        if (strcmp(a.host, mine.host))
            return CH_ERROR(CH_ERR_REMOTE, "rank %d: ranks %d and %d on node %s both chose GPU "
                            "%s", env->rank, a.rank, b.rank, a.host, a.phys);
        return duplicate_error(env, &a, &b);
    }
    if (failed_rank >= 0)
        return CH_ERROR(CH_ERR_REMOTE, "rank %d: rank %d failed to choose its GPU", env->rank,
                        failed_rank);
    return CH_OK;
}
#endif

ch_status ch_env_check_devices_status(const ch_env_t *env, ch_status my_status, MPI_Comm comm)
{
    char saved[CH_ERROR_MAX] = "";
    if (my_status != CH_OK) snprintf(saved, sizeof saved, "%s", ch_error_message());
    if (!env) return CH_ERROR(CH_ERR_INVALID, "ch_env_check_devices: env is NULL");
    int csize = 1;
    CH_CHECK_MPI(MPI_Comm_size(comm, &csize));
    ch_status s;
#ifdef HAVE_PMI2
    if (csize == 1 && env->pmi2 && env->world_size > 1)
        s = check_pmi2(env, my_status != CH_OK);
    else
#endif
        s = check_mpi(env, my_status != CH_OK, comm);
    if (my_status != CH_OK) return ch_error_adopt(my_status, saved);
    return s;
}

ch_status ch_env_check_devices(const ch_env_t *env, MPI_Comm comm)
{
    return ch_env_check_devices_status(env, CH_OK, comm);
}

/* ---------------------------------------------------------------- queries */

ch_status ch_env_mpi_query(ch_env_mpi_t *out)
{
    CH_REQUIRE(out != NULL, "ch_env_mpi_query: out is NULL");
    memset(out, 0, sizeof *out);
    int inited = 0, finalized = 0;
    CH_CHECK_MPI(MPI_Initialized(&inited));
    CH_CHECK_MPI(MPI_Finalized(&finalized));
    if (!inited || finalized) return CH_OK;
    out->initialized = 1;
    CH_CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &out->rank));
    CH_CHECK_MPI(MPI_Comm_size(MPI_COMM_WORLD, &out->size));
    MPI_Comm node, leaders;
    CH_CHECK_MPI(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, out->rank,
                                     MPI_INFO_NULL, &node));
    MPI_Comm_rank(node, &out->local_rank);
    MPI_Comm_size(node, &out->local_size);
    /* Node ids: number the nodes by their lowest world rank. */
    int rc = MPI_Comm_split(MPI_COMM_WORLD, out->local_rank == 0 ? 0 : MPI_UNDEFINED, out->rank,
                            &leaders);
    int ids[2] = {0, 0};
    if (rc == MPI_SUCCESS && leaders != MPI_COMM_NULL) {
        MPI_Comm_rank(leaders, &ids[0]);
        MPI_Comm_size(leaders, &ids[1]);
        MPI_Comm_free(&leaders);
    }
    if (rc == MPI_SUCCESS) rc = MPI_Bcast(ids, 2, MPI_INT, 0, node);
    MPI_Comm_free(&node);
    if (rc != MPI_SUCCESS) return CH_ERROR(CH_ERR_MPI, "node numbering over MPI failed (%d)", rc);
    out->node_id = ids[0];
    out->node_count = ids[1];
    return CH_OK;
}

ch_status ch_env_pmi2_probe(ch_env_pmi2_t *out)
{
    CH_REQUIRE(out != NULL, "ch_env_pmi2_probe: out is NULL");
    memset(out, 0, sizeof *out);
#ifdef HAVE_PMI2
    int spawned = 0, size = 0, rank = 0, appnum = 0;
    int rc = PMI2_Init(&spawned, &size, &rank, &appnum);
    if (rc != PMI2_SUCCESS) {
        const char *fd = getenv("PMI_FD");
        PMI2_Finalize();
        return CH_ERROR(CH_ERR_PMI, "PMI2_Init failed (PMI2 error %d) with PMI_FD=%s", rc,
                        fd ? fd : "(unset)");
    }
    rc = PMI2_Job_GetId(out->jobid, (int)sizeof out->jobid);
    if (rc != PMI2_SUCCESS) {
        /* A singleton: PMI2_Init works without a launcher, the job id does not. */
        PMI2_Finalize();
        out->jobid[0] = 0;
        return CH_OK;
    }
    if (size < 1 || rank < 0 || rank >= size) {
        PMI2_Finalize();
        return CH_ERROR(CH_ERR_PMI, "PMI2_Init gave rank %d of %d", rank, size);
    }
    out->available = 1;
    out->rank = rank;
    out->size = size;
#endif
    return CH_OK;
}

/* ---------------------------------------------------------------- wrapper */

/* Tasks the launcher says it started: SLURM_STEP_NUM_TASKS (the step),
 * else SLURM_NTASKS / SLURM_NPROCS, else PMI_SIZE; 0 when none is set or
 * readable. */
static long launcher_task_count(void)
{
    const char *names[] = {"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS", "PMI_SIZE"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const char *v = getenv(names[i]);
        if (!v || !*v) continue;
        char *end = NULL;
        long n = strtol(v, &end, 10);
        if (end && *end == 0 && n >= 1) return n;
    }
    return 0;
}

ch_status ch_env_discover(const ch_env_options_t *opt, ch_env_t *out)
{
    CH_REQUIRE(opt != NULL && out != NULL, "ch_env_discover: NULL options or output");
    ch_env_mpi_t mpi;
    CH_TRY(ch_env_mpi_query(&mpi));
    if (!mpi.initialized)
        return CH_ERROR(CH_ERR_INVALID, "ch_env_discover: MPI is not initialised (call "
                        "MPI_Init_thread first)");
    ch_env_pmi2_t pmi2;
    memset(&pmi2, 0, sizeof pmi2);
    /* MPI sees one process but a PMI2 launcher is there: ask it how many
     * tasks it started (an MPI that ignored PMI2 gives N singletons). Not
     * when the launcher's own variables already say one task: MPI has then
     * used PMI_FD itself, and Slurm's PMI2 server rejects a second
     * PMI2_Init on it ("invalid pmi1 command") and cancels the step. */
    if (mpi.size <= 1 && getenv("PMI_FD") && launcher_task_count() != 1) {
        if (ch_env_pmi2_probe(&pmi2) != CH_OK) {
            ch_log_warn("%s; using the Slurm variables", ch_error_message());
            ch_error_clear();
            memset(&pmi2, 0, sizeof pmi2);
        }
    }
    ch_env_t e;
    ch_status s = ch_env_resolve(&mpi, &pmi2, ch_env_lookup_process, NULL,
                                 opt->needs_mpi_collectives, &e);
#ifdef HAVE_PMI2
    if (pmi2.available && (s != CH_OK || !e.pmi2)) PMI2_Finalize();
#endif
    CH_TRY(s);
    ch_log_set_rank(e.rank, e.world_size);
    if (opt->identity_only) {
        if (!opt->quiet) ch_log_info("%s", e.note);
        *out = e;
        return CH_OK;
    }

    int count = 0;
    s = ch_device_count(&count);
    if (!s) s = ch_env_choose_device(&e, opt->device_rule, count);
    /* Every rank takes part in the check, a failed one too, so no rank is left
     * waiting and every rank learns of the failure. */
    s = ch_env_check_devices_status(&e, s, MPI_COMM_WORLD);
    if (s) {
        ch_env_finalize(&e);
        return s;
    }
    if (!opt->quiet && e.device >= 0)
        ch_log_info("%s; GPU %d of %d (rule %s)", e.note, e.device, e.device_count,
                    rule_name(e.device_rule));
    else if (!opt->quiet)
        ch_log_info("%s; CPU", e.note);
    *out = e;
    return CH_OK;
}

void ch_env_finalize(ch_env_t *env)
{
    if (!env) return;
#ifdef HAVE_PMI2
    if (env->pmi2) PMI2_Finalize();
#endif
    env->pmi2 = 0;
}
