/* cohort: exercises the PMI2 KVS bootstrap (framework/launch/pmi2.h) the NCCL
 * process group uses to hand out its unique id when MPI is not initialised.
 * Run by tests/test_slurm.sh under `srun --mpi=pmi2` on the local test
 * cluster; needs no GPU and never initialises MPI.
 *
 *   pmi2_kvs_helper            rank 0 broadcasts 128 random bytes (the size
 *                              of an ncclUniqueId) twice under two keys;
 *                              every rank prints
 *                                kvs rank R of W id <hex of 128 bytes> again <same|DIFF>
 *   pmi2_kvs_helper fail [R]   rank R (default 0) reports a local failure
 *                              (CH_ERR_IO) instead of taking part normally;
 *                              every rank prints
 *                                kvs rank R of W status <CH_ERR_...>: <message>
 * Exit status: 0 when the broadcasts did what was asked, 2 when PMI2 is not
 * usable (the message says why: e.g. not started by srun --mpi=pmi2), 1 for
 * any other failure. */
#include "config.h"

#include "framework/launch/pmi2.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define ID_BYTES 128

static void to_hex(const unsigned char *b, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++) sprintf(out + 2 * i, "%02x", b[i]);
}

int main(int argc, char **argv)
{
    int fail_mode = argc > 1 && !strcmp(argv[1], "fail");
    int fail_rank = fail_mode && argc > 2 ? atoi(argv[2]) : 0;
    int rank = -1, size = -1, inited = 0;
    ch_status s = ch_pmi2_init(&rank, &size, &inited);
    if (s != CH_OK) {
        printf("kvs error %s: %s\n", ch_status_name(s), ch_error_message());
        return 2;
    }
    unsigned char id[ID_BYTES], again[ID_BYTES];
    memset(id, 0xee, sizeof id);
    memset(again, 0x11, sizeof again);
    if (rank == 0) {
        /* different in every run: equal output on all ranks cannot be chance */
        uint64_t x = (uint64_t)time(NULL) * 6364136223846793005ULL ^ (uint64_t)getpid();
        for (size_t i = 0; i < sizeof id; i++) {
            x = x * 6364136223846793005ULL + 1442695040888963407ULL;
            id[i] = (unsigned char)(x >> 56);
        }
        memcpy(again, id, sizeof id);
    }
    char hex[2 * ID_BYTES + 1];
    int rc = 0;
    if (fail_mode) {
        ch_status mine = rank == fail_rank
                             ? CH_ERROR(CH_ERR_IO, "rank %d could not take part", rank)
                             : CH_OK;
        s = ch_pmi2_kvs_bcast("cohort-test-fail", rank, size, id, sizeof id, mine);
        printf("kvs rank %d of %d status %s: %s\n", rank, size, ch_status_name(s),
               s == CH_OK ? "ok" : ch_error_message());
        rc = s == CH_OK ? 1 : 0;
    } else {
        s = ch_pmi2_kvs_bcast("cohort-test-id-0", rank, size, id, sizeof id, CH_OK);
        if (s == CH_OK) s = ch_pmi2_kvs_bcast("cohort-test-id-1", rank, size, again, sizeof again, CH_OK);
        if (s != CH_OK) {
            printf("kvs rank %d of %d error %s: %s\n", rank, size, ch_status_name(s),
                   ch_error_message());
            rc = 1;
        } else {
            to_hex(id, sizeof id, hex);
            printf("kvs rank %d of %d id %s again %s\n", rank, size, hex,
                   memcmp(id, again, sizeof id) ? "DIFF" : "same");
        }
    }
    fflush(stdout);
    ch_pmi2_finalize(inited);
    return rc;
}
