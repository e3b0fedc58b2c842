/* cohort: a stand-alone driver for libFuzzer-style fuzz targets, built with
 * the regular compiler for `make check` (and under ASan/UBSan in CI).
 *
 * It replays every file of the target's seed corpus, then feeds random
 * mutations of them (bit flips, byte changes, truncation, extension,
 * duplicated or deleted spans, boundary integers) for a fixed time. Any
 * crash, sanitizer report or hang fails the test; the coverage-guided search
 * is `make fuzz` (clang + libFuzzer).
 *
 * Usage: fuzz_<name> [CORPUS_DIR] ; env FUZZ_SECONDS (default 3),
 * FUZZ_SEED (default 1). CORPUS_DIR defaults to
 * $COHORT_SRCDIR/tests/fuzz/corpus/<name> where <name> is the program name
 * without the "fuzz_" prefix. Prints TAP (1 test).
 */
#include "config.h"

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "tests/fuzz/fuzz.h"

typedef struct {
    uint8_t *data;
    size_t size;
} input_t;

static uint64_t rng_state;

static uint64_t next_rand(void)
{ /* splitmix64 */
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static size_t rnd(size_t n) { return n ? (size_t)(next_rand() % n) : 0; }

static int read_file(const char *path, input_t *in)
{
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    if (n < 0) {
        fclose(f);
        return -1;
    }
    in->size = (size_t)n;
    in->data = malloc(in->size ? in->size : 1);
    if (!in->data || fread(in->data, 1, in->size, f) != in->size) {
        fclose(f);
        free(in->data);
        return -1;
    }
    fclose(f);
    return 0;
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Mutate src into a new buffer of at most max_size bytes. */
static size_t mutate(const input_t *src, uint8_t *out, size_t max_size)
{
    size_t n = src->size < max_size ? src->size : max_size;
    memcpy(out, src->data, n);
    int rounds = 1 + (int)rnd(4);
    for (int r = 0; r < rounds; r++) {
        switch (rnd(8)) {
        case 0: /* flip a bit */
            if (n) out[rnd(n)] ^= (uint8_t)(1u << rnd(8));
            break;
        case 1: /* random byte */
            if (n) out[rnd(n)] = (uint8_t)next_rand();
            break;
        case 2: /* truncate */
            n = rnd(n + 1);
            break;
        case 3: /* extend with random bytes */
        {
            size_t add = rnd(64);
            if (n + add > max_size) add = max_size - n;
            for (size_t i = 0; i < add; i++) out[n + i] = (uint8_t)next_rand();
            n += add;
            break;
        }
        case 4: /* boundary integer (LE 32-bit) */
            if (n >= 4) {
                static const uint32_t vals[] = {0, 1, 0x7f, 0xff, 0x7fffffff,
                                                0x80000000u, 0xffffffffu, 0x10000};
                uint32_t v = vals[rnd(8)];
                memcpy(out + rnd(n - 3), &v, 4);
            }
            break;
        case 5: /* boundary integer (BE 32-bit), IDX headers are big-endian */
            if (n >= 4) {
                size_t at = rnd(n - 3);
                uint32_t v = (uint32_t)next_rand() >> rnd(32);
                out[at] = (uint8_t)(v >> 24);
                out[at + 1] = (uint8_t)(v >> 16);
                out[at + 2] = (uint8_t)(v >> 8);
                out[at + 3] = (uint8_t)v;
            }
            break;
        case 6: /* delete a span */
            if (n) {
                size_t at = rnd(n), len = rnd(n - at) + 1;
                memmove(out + at, out + at + len, n - at - len);
                n -= len;
            }
            break;
        default: /* duplicate a span */
            if (n) {
                size_t at = rnd(n), len = rnd(n - at) + 1;
                if (n + len > max_size) len = max_size - n;
                memmove(out + at + len, out + at, n - at);
                n += len;
            }
            break;
        }
    }
    return n;
}

int main(int argc, char **argv)
{
    char dir[4096];
    const char *prog = strrchr(argv[0], '/');
    prog = prog ? prog + 1 : argv[0];
    if (!strncmp(prog, "lt-", 3)) prog += 3;
    const char *name = strncmp(prog, "fuzz_", 5) ? prog : prog + 5;
    if (argc > 1)
        snprintf(dir, sizeof dir, "%s", argv[1]);
    else {
        const char *src = getenv("COHORT_SRCDIR");
        snprintf(dir, sizeof dir, "%s/tests/fuzz/corpus/%s", src && *src ? src : ".", name);
    }
    double seconds = getenv("FUZZ_SECONDS") ? atof(getenv("FUZZ_SECONDS")) : 3.0;
    rng_state = getenv("FUZZ_SEED") ? strtoull(getenv("FUZZ_SEED"), NULL, 10) : 1;

    printf("1..1\n");
    fflush(stdout);
    DIR *d = opendir(dir);
    if (!d) {
        printf("not ok 1 - fuzz %s: cannot open corpus directory %s\n", name, dir);
        return 0;
    }
    char **names = NULL;
    size_t n_names = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        names = realloc(names, (n_names + 1) * sizeof *names);
        names[n_names++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, n_names, sizeof *names, cmp_names);
    input_t *corpus = calloc(n_names ? n_names : 1, sizeof *corpus);
    size_t n_corpus = 0, max_size = 64;
    for (size_t i = 0; i < n_names; i++) {
        char path[8192];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        struct stat st;
        if (stat(path, &st) || !S_ISREG(st.st_mode)) continue;
        if (read_file(path, &corpus[n_corpus]) == 0) {
            LLVMFuzzerTestOneInput(corpus[n_corpus].data, corpus[n_corpus].size);
            if (corpus[n_corpus].size + 256 > max_size) max_size = corpus[n_corpus].size + 256;
            n_corpus++;
        }
        free(names[i]);
    }
    free(names);
    if (n_corpus == 0) {
        printf("not ok 1 - fuzz %s: empty corpus in %s\n", name, dir);
        free(corpus);
        return 0;
    }
    uint8_t *buf = malloc(max_size);
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    unsigned long runs = 0;
    for (;;) {
        for (int k = 0; k < 64; k++, runs++) {
            size_t len = mutate(&corpus[rnd(n_corpus)], buf, max_size);
            /* copy to an exact-size heap block so ASan sees overreads */
            uint8_t *exact = malloc(len ? len : 1);
            memcpy(exact, buf, len);
            LLVMFuzzerTestOneInput(exact, len);
            free(exact);
        }
        clock_gettime(CLOCK_MONOTONIC, &t);
        if ((double)(t.tv_sec - t0.tv_sec) + 1e-9 * (double)(t.tv_nsec - t0.tv_nsec) >= seconds) break;
    }
    free(buf);
    for (size_t i = 0; i < n_corpus; i++) free(corpus[i].data);
    free(corpus);
    printf("ok 1 - fuzz %s: %zu corpus files, %lu mutated inputs in %.1f s\n", name,
           n_corpus, runs, seconds);
    return 0;
}
