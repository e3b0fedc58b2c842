/* Fuzz target: the tar shard member scan and the shard index file reader
 * (io/formats/shards.h), from memory. Input: byte 0 even = the rest is a tar
 * shard (scanned into samples), odd = the rest is an index file (parsed;
 * an index that parses is encoded again and must parse to the same bytes). */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "io/formats/shards.h"
#include "tests/fuzz/fuzz.h"

typedef struct {
    const uint8_t *p;
    size_t n;
} mem_t;

static int64_t mem_read(void *ctx, uint64_t off, void *buf, size_t len)
{
    const mem_t *m = ctx;
    if (off >= m->n) return 0;
    size_t k = m->n - (size_t)off < len ? m->n - (size_t)off : len;
    memcpy(buf, m->p + off, k);
    return (int64_t)k;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    mem_t m = {data + 1, size - 1};
    if (!(data[0] & 1)) {
        ch_shard_entry_t e;
        if (ch_tar_scan(mem_read, &m, m.n, "fuzz.tar", &e) == CH_OK) {
            for (int64_t i = 0; i < e.n; i++) /* every sample lies inside the file */
                if (e.samples[i].offset + e.samples[i].size > m.n) abort();
            ch_shard_entry_free(&e);
        }
        return 0;
    }
    ch_shard_index_t idx;
    if (ch_shard_index_parse(m.p, m.n, "fuzz.index", &idx) == CH_OK) {
        uint8_t *buf;
        size_t len;
        if (ch_shard_index_encode(&idx, &buf, &len) == CH_OK) {
            if (len != m.n || memcmp(buf, m.p, len)) abort(); /* round trip */
            free(buf);
        }
        if (idx.total > 0) (void)ch_shard_index_find(&idx, idx.total - 1);
        ch_shard_index_free(&idx);
    }
    return 0;
}
