/* Fuzz target: cohort-farm's journal reader (ch_journal_scan,
 * framework/farm/journal.c). Input: a mode byte, then up to 8 journal files
 * separated by the byte 0x1e (written as DIR/journal/NN.log; mode bit 3
 * adds a file that does not end in .log, which the reader must skip).
 *   mode bit 0: "seal": every line of the files gets its " *CRC" appended
 *               here (a torn last line too), so that the mutations reach
 *               the record parser; else the bytes are taken as they are
 *               (the checksum checks).
 *   mode bit 1: the task count and checksum passed are those of the first
 *               file's header (when it has one), else 4 and 0x0123456789abcdef.
 * A failure must come with a message; a state that scans must be
 * consistent: n_files, every record's id in range and attempt >= 1, each
 * task's attempts >= its starts' and ends' attempts, done only with an exit
 * 0, open only after a start, last_end of the task itself, torn set only
 * when a file's last line lacks its newline. Never a crash, leak or hang. */
#include "config.h"

#include "framework/farm/journal.h"
#include "tests/fuzz/fuzz.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#define MAX_FILES 8
#define MAX_TASKS 100000

static char dir[64], jdir[80];

static int write_file(const char *path, const uint8_t *data, size_t size, int seal)
{
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    int ok = 1;
    if (!seal) {
        ok = !size || fwrite(data, 1, size, f) == size;
    } else {
        size_t pos = 0;
        while (pos < size && ok) {
            const uint8_t *nl = memchr(data + pos, '\n', size - pos);
            size_t n = nl ? (size_t)(nl - (data + pos)) : size - pos;
            uLong crc = crc32(0L, data + pos, (uInt)n) & 0xffffffffUL;
            ok = (!n || fwrite(data + pos, 1, n, f) == n) &&
                 fprintf(f, " *%08lx%s", crc, nl ? "\n" : "") > 0;
            pos += n + (nl ? 1 : 0);
        }
    }
    return fclose(f) == 0 && ok ? 0 : -1;
}

static void check(const ch_journal_state_t *st, int64_t n_tasks, int n_files, int torn)
{
    if (st->n_tasks != n_tasks || st->n_files != n_files) abort();
    if (st->n_starts < 0 || st->n_ends < 0) abort();
    if (!torn && st->torn) abort();
    if (st->torn && !strstr(st->torn, "torn")) abort();
    for (int64_t i = 0; i < st->n_starts; i++) {
        const ch_journal_start_t *r = &st->starts[i];
        if (r->id < 0 || r->id >= n_tasks || r->attempt < 1) abort();
        if (st->tasks[r->id].attempts < r->attempt) abort();
        if (memchr(r->host, 0, sizeof r->host) == NULL) abort();
    }
    for (int64_t i = 0; i < st->n_ends; i++) {
        const ch_journal_end_t *r = &st->ends[i];
        if (r->id < 0 || r->id >= n_tasks || r->attempt < 1) abort();
        if (r->kind < 0 || r->kind >= CH_END_KIND_COUNT_) abort();
        const ch_journal_task_t *t = &st->tasks[r->id];
        if (t->attempts < r->attempt || !t->has_end || t->last_end.attempt < r->attempt) abort();
    }
    for (int64_t i = 0; i < n_tasks; i++) {
        const ch_journal_task_t *t = &st->tasks[i];
        if (t->attempts < 0 || t->failures < 0 || t->interrupted < 0) abort();
        if (t->has_end && (t->last_end.id != i || t->last_end.attempt > t->attempts)) abort();
        if (!t->has_end && (t->done || t->failures || t->interrupted)) abort();
        if (t->open && (t->attempts < 1 || t->last_start.id != i)) abort();
        if (t->done) {
            int found = 0;
            for (int64_t k = 0; k < st->n_ends && !found; k++)
                found = st->ends[k].id == i && st->ends[k].kind == CH_END_EXIT &&
                        st->ends[k].code == 0;
            if (!found) abort();
        }
    }
}

static void cleanup(void)
{
    rmdir(jdir);
    rmdir(dir);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/cohort-fuzz-journal-%d", (int)getpid());
        snprintf(jdir, sizeof jdir, "%s/journal", dir);
        mkdir(dir, 0777);
        mkdir(jdir, 0777);
        atexit(cleanup);
    }
    if (size == 0 || size > 1 << 18) return 0;
    uint8_t mode = data[0];
    data++;
    size--;
    int64_t n_tasks = 4;
    uint64_t checksum = 0x0123456789abcdefull;
    if (mode & 2) {
        long long nt;
        unsigned long long ck;
        char head[128];
        size_t hl = size < sizeof head - 1 ? size : sizeof head - 1;
        memcpy(head, data, hl);
        head[hl] = 0;
        if (sscanf(head, "#cohort-farm-journal 1 tasks=%lld checksum=%llx", &nt, &ck) == 2 &&
            nt >= 0 && nt <= MAX_TASKS) {
            n_tasks = nt;
            checksum = ck;
        }
    }
    char path[128];
    int n_files = 0, torn = 0;
    size_t pos = 0;
    while (pos <= size && n_files < MAX_FILES) {
        const uint8_t *sep = memchr(data + pos, 0x1e, size - pos);
        size_t n = sep ? (size_t)(sep - (data + pos)) : size - pos;
        snprintf(path, sizeof path, "%s/%02d.log", jdir, n_files);
        if (write_file(path, data + pos, n, mode & 1)) goto out;
        n_files++;
        if (n && data[pos + n - 1] != '\n') torn = 1;
        if (!sep) break;
        pos += n + 1;
    }
    if (mode & 8) {
        snprintf(path, sizeof path, "%s/notes.txt", jdir);
        if (write_file(path, (const uint8_t *)"not a journal\n", 14, 0)) goto out;
    }
    ch_journal_state_t *st = NULL;
    if (ch_journal_scan(dir, checksum, n_tasks, &st) != CH_OK) {
        if (st || !ch_error_message()[0]) abort();
        ch_error_clear();
    } else {
        check(st, n_tasks, n_files, torn);
        ch_journal_state_destroy(st);
    }
out:
    for (int i = 0; i < n_files; i++) {
        snprintf(path, sizeof path, "%s/%02d.log", jdir, i);
        unlink(path);
    }
    snprintf(path, sizeof path, "%s/notes.txt", jdir);
    unlink(path);
    return 0;
}
