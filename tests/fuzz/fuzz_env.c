/* Fuzz target for framework/env's decision functions: the bytes are an
 * environment (NUL-separated NAME=VALUE strings; a leading byte picks MPI's and
 * PMI2's view and the device count). Resolution must return a status without
 * crashing, and whatever it accepts must be a consistent identity: 0 <= rank <
 * world size, local rank below local size, and a chosen device in range. */
#include "config.h"

#include "framework/launch/env.h"
#include "tests/fuzz/fuzz.h"

#include <stdlib.h>
#include <string.h>

/* Short names for the variables env reads, so that mutations hit them. */
static const char *const names[] = {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
    "MASTER_PORT", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS",
    "SLURM_LOCALID", "SLURM_NODEID", "SLURM_STEP_NUM_NODES", "SLURM_NNODES",
    "SLURM_STEP_TASKS_PER_NODE", "SLURM_STEP_ID", "SLURM_STEPID", "SLURM_JOB_ID",
    "CUDA_VISIBLE_DEVICES", "SLURMD_NODENAME"};
#define NNAMES (sizeof names / sizeof names[0])

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 4 || size > 4096) return 0;
    uint8_t mode = data[0], count = data[1] % 9, rule = data[2] % 3, mpisz = data[3] % 5;
    data += 4;
    size -= 4;
    /* "NAME=VALUE" entries: a byte choosing the name, then the value up to NUL */
    char *buf = malloc(size * 2 + 64 * (size + 1));
    const char **vars = calloc(size + 2, sizeof *vars);
    if (!buf || !vars) {
        free(buf);
        free(vars);
        return 0;
    }
    size_t used = 0, nv = 0, i = 0;
    while (i < size) {
        const char *name = names[data[i++] % NNAMES];
        size_t start = used;
        size_t nl = strlen(name);
        memcpy(buf + used, name, nl);
        used += nl;
        buf[used++] = '=';
        while (i < size && data[i]) buf[used++] = (char)data[i++];
        buf[used++] = 0;
        i++; /* the NUL */
        vars[nv++] = buf + start;
    }
    vars[nv] = NULL;

    ch_env_mpi_t mpi = {1, 0, 1, 0, 1, 0, 1};
    if (mpisz > 1) { /* an MPI world */
        mpi.size = mpisz;
        mpi.rank = mode % mpisz;
        mpi.local_rank = mpi.rank;
        mpi.local_size = mpisz;
    }
    ch_env_pmi2_t pmi2 = {0};
    if (mode & 0x80) {
        pmi2.available = 1;
        pmi2.size = 1 + (mode & 7);
        pmi2.rank = (mode >> 3) % pmi2.size;
        strcpy(pmi2.jobid, "1.0");
    }
    ch_env_t e;
    ch_status s = ch_env_resolve(&mpi, &pmi2, ch_env_lookup_list, (void *)vars, mode & 0x40, &e);
    if (s == CH_OK) {
        if (e.world_size < 1 || e.rank < 0 || e.rank >= e.world_size) abort();
        if (e.local_rank >= 0 && e.local_world_size >= 0 && e.local_rank >= e.local_world_size)
            abort();
        if (e.master_port < 0 || e.master_port > 65535) abort();
        if ((mode & 0x40) && e.world_size > 1 && !(mpi.size > 1)) abort();
        if (ch_env_choose_device(&e, (ch_device_rule)rule, count) == CH_OK &&
            (e.device < -1 || e.device >= count || (count > 0 && e.device < 0)))
            abort();
    }
    free(buf);
    free(vars);
    return 0;
}
