/* cohort: PMI2 KVS bootstrap (see pmi2.h). */
#include "config.h"

#include "framework/launch/pmi2.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef HAVE_PMI2
#include <slurm/pmi2.h>

/* rank and size from our own PMI2_Init (PMI2 gives them only there) */
static int cached_rank = -1, cached_size = -1;

ch_status ch_pmi2_init(int *rank, int *size, int *inited_here)
{
    CH_REQUIRE(rank && size, "ch_pmi2_init: rank or size pointer is NULL");
    if (inited_here) *inited_here = 0;
    int here = 0;
    if (PMI2_Initialized()) {
        if (cached_size < 1)
            return CH_ERROR(CH_ERR_PMI, "PMI2 was initialised outside cohort: its rank and "
                            "size are unknown here");
    } else {
        int spawned = 0, psize = 0, prank = 0, appnum = 0;
        CH_CHECK_PMI2(PMI2_Init(&spawned, &psize, &prank, &appnum));
        here = 1;
        cached_rank = prank;
        cached_size = psize;
    }
    char jobid[PMI2_MAX_VALLEN];
    int pr = PMI2_Job_GetId(jobid, (int)sizeof jobid);
    if (pr != PMI2_SUCCESS) {
        if (here) ch_pmi2_finalize(1);
        return CH_ERROR(CH_ERR_PMI, "PMI2 has no job (PMI2_Job_GetId error %d): this process "
                        "was not started by `srun --mpi=pmi2` (or another PMI2 launcher)", pr);
    }
    *rank = cached_rank;
    *size = cached_size;
    if (inited_here) *inited_here = here;
    return CH_OK;
}

void ch_pmi2_finalize(int inited_here)
{
    if (!inited_here || !PMI2_Initialized()) return;
    PMI2_Finalize();
    cached_rank = cached_size = -1;
}

static void hex_encode(const unsigned char *in, size_t n, char *out)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[in[i] >> 4];
        out[2 * i + 1] = digits[in[i] & 15];
    }
    out[2 * n] = 0;
}

static int hex_digit(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

static int hex_decode(const char *in, unsigned char *out, size_t n)
{
    if (strlen(in) != 2 * n) return -1;
    for (size_t i = 0; i < n; i++) {
        int hi = hex_digit(in[2 * i]), lo = hex_digit(in[2 * i + 1]);
        if (hi < 0 || lo < 0) return -1;
        out[i] = (unsigned char)(hi << 4 | lo);
    }
    return 0;
}

static ch_status kvs_put(const char *key, const char *val)
{
    int pr = PMI2_KVS_Put(key, val);
    if (pr != PMI2_SUCCESS)
        return CH_ERROR(CH_ERR_PMI, "PMI2_KVS_Put(%s) failed: PMI2 error %d", key, pr);
    return CH_OK;
}

static ch_status kvs_fence(int rank)
{
    int pr = PMI2_KVS_Fence();
    if (pr != PMI2_SUCCESS)
        return CH_ERROR(CH_ERR_PMI, "PMI2_KVS_Fence failed on rank %d: PMI2 error %d", rank, pr);
    return CH_OK;
}

static ch_status kvs_get(const char *key, int rank, char *val, int len)
{
    int got = 0;
    int pr = PMI2_KVS_Get(NULL, PMI2_ID_NULL, key, val, len, &got);
    if (pr != PMI2_SUCCESS)
        return CH_ERROR(CH_ERR_PMI, "PMI2_KVS_Get(%s) failed on rank %d: PMI2 error %d", key,
                        rank, pr);
    return CH_OK;
}

ch_status ch_pmi2_kvs_bcast(const char *key, int rank, int size, void *buf, size_t n,
                            ch_status local_status)
{
    CH_REQUIRE(key && *key && strlen(key) <= 40,
               "ch_pmi2_kvs_bcast: key must be 1..40 characters, got '%s'", key ? key : "(null)");
    CH_REQUIRE(buf, "ch_pmi2_kvs_bcast: buffer is NULL");
    CH_REQUIRE(n >= 1 && n <= CH_PMI2_BCAST_MAX,
               "ch_pmi2_kvs_bcast: %zu bytes, expected 1..%d", n, CH_PMI2_BCAST_MAX);
    CH_REQUIRE(size >= 1 && rank >= 0 && rank < size,
               "ch_pmi2_kvs_bcast: rank %d of %d is not valid", rank, size);
    char skey[64], val[PMI2_MAX_VALLEN];
    /* round 1: every rank's status */
    snprintf(skey, sizeof skey, "%s-s%d", key, rank);
    ch_status s = kvs_put(skey, local_status == CH_OK ? "ok" : ch_status_name(local_status));
    ch_status f = kvs_fence(rank);
    if (s == CH_OK) s = f;
    /* round 2: rank 0's verdict (data, or the lowest failed rank) */
    if (rank == 0) {
        int failed = local_status != CH_OK ? 0 : -1;
        char why[64] = "";
        if (failed == 0) snprintf(why, sizeof why, "%s", ch_status_name(local_status));
        for (int r = 1; r < size && failed < 0 && s == CH_OK; r++) {
            snprintf(skey, sizeof skey, "%s-s%d", key, r);
            s = kvs_get(skey, rank, val, (int)sizeof val);
            if (s == CH_OK && strcmp(val, "ok")) {
                failed = r;
                snprintf(why, sizeof why, "%.60s", val);
            }
        }
        if (s != CH_OK) snprintf(val, sizeof val, "fail:0:%s", ch_status_name(s));
        else if (failed >= 0) snprintf(val, sizeof val, "fail:%d:%s", failed, why);
        else hex_encode((const unsigned char *)buf, n, val);
        ch_status p = kvs_put(key, val);
        if (s == CH_OK) s = p;
        f = kvs_fence(rank);
        if (s == CH_OK) s = f;
        if (local_status != CH_OK) return local_status;
        if (s == CH_OK && failed > 0)
            s = CH_ERROR(CH_ERR_REMOTE, "rank %d failed before the exchange of '%s' (%s)", failed,
                         key, why);
        return s;
    }
    f = kvs_fence(rank);
    if (s == CH_OK) s = f;
    if (s == CH_OK) s = kvs_get(key, rank, val, (int)sizeof val);
    if (local_status != CH_OK) return local_status;
    if (s != CH_OK) return s;
    if (!strncmp(val, "fail:", 5)) {
        int r = atoi(val + 5);
        const char *why = strchr(val + 5, ':');
        return CH_ERROR(CH_ERR_REMOTE, "rank %d failed before the exchange of '%s' (%s)", r, key,
                        why ? why + 1 : "?");
    }
    if (hex_decode(val, (unsigned char *)buf, n))
        return CH_ERROR(CH_ERR_PMI, "PMI2 key %s holds '%.40s...', not %zu bytes of hex", key,
                        val, n);
    return CH_OK;
}

#else /* !HAVE_PMI2 */

#define NO_PMI2                                                                          \
    "cohort was built without Slurm's PMI2 client (configure found no slurm/pmi2.h + "  \
    "libpmi2; Debian: libpmi2-0-dev)"

ch_status ch_pmi2_init(int *rank, int *size, int *inited_here)
{
    if (rank) *rank = -1;
    if (size) *size = -1;
    if (inited_here) *inited_here = 0;
    return CH_ERROR(CH_ERR_UNSUPPORTED, "ch_pmi2_init: " NO_PMI2);
}

void ch_pmi2_finalize(int inited_here) { (void)inited_here; }

ch_status ch_pmi2_kvs_bcast(const char *key, int rank, int size, void *buf, size_t n,
                            ch_status local_status)
{
    (void)key;
    (void)rank;
    (void)size;
    (void)buf;
    (void)n;
    (void)local_status;
    return CH_ERROR(CH_ERR_UNSUPPORTED, "ch_pmi2_kvs_bcast: " NO_PMI2);
}

#endif
