/* cohort: cohort-farm's journal (see journal.h for the format and rules). */
#include "framework/farm/journal.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

static const char *const kind_names[CH_END_KIND_COUNT_] = {
    "exit", "signal", "timeout", "interrupted", "spawn-failed",
};

const char *ch_end_kind_name(int kind)
{
    return kind >= 0 && kind < CH_END_KIND_COUNT_ ? kind_names[kind] : "unknown";
}

int ch_end_is_failure(int kind, int code)
{
    if (kind == CH_END_EXIT) return code != 0;
    return kind != CH_END_INTERRUPTED;
}

uint64_t ch_proc_start_time(int64_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%" PRId64 "/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = 0;
    /* field 2 (comm) is in parentheses and may hold blanks: start after the last ')' */
    char *p = strrchr(buf, ')');
    if (!p) return 0;
    p++;
    /* fields 3.. follow; starttime is field 22 */
    for (int field = 3; field < 22; field++) {
        p = strchr(p + 1, ' ');
        if (!p) return 0;
    }
    /* a zombie has exited: it is not running the task any more */
    char state = 0;
    sscanf(strrchr(buf, ')') + 2, "%c", &state);
    if (state == 'Z' || state == 'X') return 0;
    return strtoull(p + 1, NULL, 10);
}

/* ---------------------------------------------------------------- writing */

struct ch_journal {
    int fd;
    ch_journal_sync sync;
    char *path;
    /* batch mode */
    pthread_t thread;
    int thread_started, dirty, stop;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

/* Batch mode: sync what was written, then wait CH_JOURNAL_BATCH_MS so that
 * the records of that time share one fdatasync. */
static void *sync_main(void *arg)
{
    ch_journal_t *j = arg;
    pthread_mutex_lock(&j->mu);
    for (;;) {
        while (!j->dirty && !j->stop) pthread_cond_wait(&j->cv, &j->mu);
        if (!j->dirty) break;
        j->dirty = 0;
        pthread_mutex_unlock(&j->mu);
        if (fdatasync(j->fd) != 0)
            fprintf(stderr, "journal %s: fdatasync: %s\n", j->path, strerror(errno));
        struct timespec ts = {0, CH_JOURNAL_BATCH_MS * 1000000L};
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&j->mu);
    }
    pthread_mutex_unlock(&j->mu);
    return NULL;
}

static ch_status mkdir_p(const char *path)
{
    char *p = strdup(path);
    if (!p) return CH_ERROR(CH_ERR_NOMEM, "out of memory");
    for (char *s = p + 1;; s++) {
        if (*s == '/' || *s == 0) {
            char c = *s;
            *s = 0;
            if (mkdir(p, 0777) != 0 && errno != EEXIST) {
                ch_status st = CH_ERROR(CH_ERR_IO, "cannot create directory %s: %s", p,
                                        strerror(errno));
                free(p);
                return st;
            }
            *s = c;
            if (!c) break;
        }
    }
    free(p);
    return CH_OK;
}

/* Append " *CRC\n" to line[0..n) (buffer of size cap) and return the new length. */
static size_t seal(char *line, size_t n, size_t cap)
{
    uLong crc = crc32(0L, (const Bytef *)line, (uInt)n);
    int k = snprintf(line + n, cap - n, " *%08lx\n", crc & 0xffffffffUL);
    return n + (size_t)k;
}

static ch_status append(ch_journal_t *j, char *line, size_t n, size_t cap, int sync)
{
    if (n + 12 >= cap) return CH_ERROR(CH_ERR_INTERNAL, "%s: record too long", j->path);
    n = seal(line, n, cap);
    ssize_t w;
    do w = write(j->fd, line, n);
    while (w < 0 && errno == EINTR);
    if (w != (ssize_t)n)
        return CH_ERROR(CH_ERR_IO, "journal %s: write: %s", j->path,
                        w < 0 ? strerror(errno) : "short write");
    if (sync && fdatasync(j->fd) != 0)
        return CH_ERROR(CH_ERR_IO, "journal %s: fdatasync: %s", j->path, strerror(errno));
    if (j->thread_started) {
        pthread_mutex_lock(&j->mu);
        j->dirty = 1;
        pthread_cond_signal(&j->cv);
        pthread_mutex_unlock(&j->mu);
    }
    return CH_OK;
}

ch_status ch_journal_open(const char *dir, uint64_t checksum, int64_t n_tasks,
                          const char *taskfile, ch_journal_sync sync, ch_journal_t **out)
{
    CH_REQUIRE(dir && taskfile && out, "ch_journal_open: NULL argument");
    *out = NULL;
    size_t dl = strlen(dir) + 16;
    char *jdir = malloc(dl);
    if (!jdir) return CH_ERROR(CH_ERR_NOMEM, "out of memory");
    snprintf(jdir, dl, "%s/journal", dir);
    ch_status s = mkdir_p(jdir);
    if (s) {
        free(jdir);
        return s;
    }
    char host[CH_JOURNAL_HOST_MAX] = "localhost";
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = 0;
    for (char *c = host; *c; c++)
        if (*c == ' ' || *c == '/') *c = '_';
    ch_journal_t *j = calloc(1, sizeof *j);
    size_t pl = dl + strlen(host) + 64;
    if (!j || !(j->path = malloc(pl))) {
        free(j);
        free(jdir);
        return CH_ERROR(CH_ERR_NOMEM, "out of memory");
    }
    static int seq; /* several journals of one process (tests) get their own files */
    snprintf(j->path, pl, "%s/%s-%ld-%" PRIu64 "-%d.log", jdir, host, (long)getpid(),
             ch_proc_start_time(getpid()), __atomic_fetch_add(&seq, 1, __ATOMIC_RELAXED));
    j->sync = sync;
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    j->fd = open(j->path, O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0666);
    if (j->fd < 0) {
        s = CH_ERROR(CH_ERR_IO, "journal %s: %s", j->path, strerror(errno));
        free(j->path);
        free(j);
        free(jdir);
        return s;
    }
    char line[4096 + 128];
    int n = snprintf(line, sizeof line, "#cohort-farm-journal 1 tasks=%" PRId64
                     " checksum=%016" PRIx64 " taskfile=%.4096s", n_tasks, checksum, taskfile);
    s = append(j, line, (size_t)n, sizeof line, sync != CH_JOURNAL_SYNC_NONE);
    if (!s && sync != CH_JOURNAL_SYNC_NONE) {
        int dfd = open(jdir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0 || fsync(dfd) != 0)
            s = CH_ERROR(CH_ERR_IO, "journal directory %s: fsync: %s", jdir, strerror(errno));
        if (dfd >= 0) close(dfd);
    }
    free(jdir);
    if (!s && sync == CH_JOURNAL_SYNC_BATCH) {
        if (pthread_create(&j->thread, NULL, sync_main, j) != 0)
            s = CH_ERROR(CH_ERR_IO, "journal %s: cannot start its sync thread", j->path);
        else
            j->thread_started = 1;
    }
    if (s) {
        ch_journal_close(j);
        return s;
    }
    *out = j;
    return CH_OK;
}

ch_status ch_journal_write_start(ch_journal_t *j, const ch_journal_start_t *r)
{
    char line[512];
    int n = snprintf(line, sizeof line,
                     "S %" PRId64 " %d %d %d %s %" PRId64 " %" PRIu64 " %" PRId64 " %" PRIu64
                     " %" PRId64, r->id, r->attempt, r->rank, r->slot,
                     r->host[0] ? r->host : "-", r->sup_pid, r->sup_start, r->task_pid,
                     r->task_start, r->start_ns);
    return append(j, line, (size_t)n, sizeof line, j->sync == CH_JOURNAL_SYNC_ALL);
}

ch_status ch_journal_write_end(ch_journal_t *j, const ch_journal_end_t *r)
{
    char line[512];
    int n = snprintf(line, sizeof line,
                     "E %" PRId64 " %d %d %d %d %d %" PRId64 " %" PRId64 " %" PRId64 " %" PRId64,
                     r->id, r->attempt, r->rank, r->slot, r->kind, r->code, r->start_ns,
                     r->end_ns, r->out_bytes, r->err_bytes);
    return append(j, line, (size_t)n, sizeof line,
                  j->sync == CH_JOURNAL_SYNC_ALL || j->sync == CH_JOURNAL_SYNC_END);
}

const char *ch_journal_path(const ch_journal_t *j) { return j->path; }

void ch_journal_close(ch_journal_t *j)
{
    if (!j) return;
    if (j->thread_started) { /* it syncs what is pending, then ends */
        pthread_mutex_lock(&j->mu);
        j->stop = 1;
        pthread_cond_signal(&j->cv);
        pthread_mutex_unlock(&j->mu);
        pthread_join(j->thread, NULL);
    }
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    if (j->fd >= 0) close(j->fd);
    free(j->path);
    free(j);
}

/* ---------------------------------------------------------------- reading */

typedef struct {
    ch_journal_state_t *st;
    int64_t cap_starts, cap_ends;
    size_t torn_len;
} scan_t;

static ch_status add_torn(scan_t *sc, const char *file, int line, size_t bytes)
{
    char msg[1200];
    int n = snprintf(msg, sizeof msg,
                     "%s:%d: torn last record (%zu bytes, no newline: its writer was killed "
                     "mid-write or the disk was full); ignored, the rest of the file is kept\n",
                     file, line, bytes);
    char *p = realloc(sc->st->torn, sc->torn_len + (size_t)n + 1);
    if (!p) return CH_ERROR(CH_ERR_NOMEM, "out of memory");
    memcpy(p + sc->torn_len, msg, (size_t)n + 1);
    sc->torn_len += (size_t)n;
    sc->st->torn = p;
    return CH_OK;
}

#define BAD(...) CH_ERROR(CH_ERR_FORMAT, __VA_ARGS__)

/* Append one record of size bytes to a growing array. */
static ch_status push(void **arr, int64_t *n, int64_t *cap, const void *rec, size_t size,
                      const char *file)
{
    if (*n == *cap) {
        int64_t c = *cap ? 2 * *cap : 1024;
        void *p = realloc(*arr, (size_t)c * size);
        if (!p) return CH_ERROR(CH_ERR_NOMEM, "out of memory reading %s", file);
        *arr = p;
        *cap = c;
    }
    memcpy((char *)*arr + (size_t)*n * size, rec, size);
    (*n)++;
    return CH_OK;
}

static ch_status check_crc(const char *file, int ln, char *line)
{
    char *star = strrchr(line, '*');
    if (!star || star == line || star[-1] != ' ' || strlen(star + 1) != 8)
        return BAD("%s:%d: corrupt journal record (no checksum): '%.80s'", file, ln, line);
    char *end;
    unsigned long want = strtoul(star + 1, &end, 16);
    uLong got = crc32(0L, (const Bytef *)line, (uInt)(star - 1 - line)) & 0xffffffffUL;
    if (*end || want != got)
        return BAD("%s:%d: corrupt journal record (checksum %08lx, expected %08lx): '%.80s'",
                   file, ln, (unsigned long)got, want, line);
    star[-1] = 0;
    return CH_OK;
}

/* Fields of a record, separated by blanks (what sscanf's %lld/%llu/%s read,
 * but range-checked: a number out of [lo, hi] or beyond long long is a bad
 * record, not undefined behaviour). Each returns 1 and advances *p, or 0. */
static int field_ll(const char **p, long long lo, long long hi, long long *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(*p, &end, 10);
    if (end == *p || errno == ERANGE || v < lo || v > hi) return 0;
    *p = end;
    *out = v;
    return 1;
}
static int field_ull(const char **p, unsigned long long *out)
{
    const char *q = *p;
    while (isspace((unsigned char)*q)) q++;
    if (*q == '-') return 0;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(q, &end, 10);
    if (end == q || errno == ERANGE) return 0;
    *p = end;
    *out = v;
    return 1;
}
static int field_word(const char **p, char *out, size_t size)
{
    const char *q = *p;
    while (isspace((unsigned char)*q)) q++;
    size_t n = 0;
    while (q[n] && !isspace((unsigned char)q[n])) n++;
    if (n == 0) return 0;
    if (n >= size) n = size - 1; /* as %63s: the rest is the next field */
    memcpy(out, q, n);
    out[n] = 0;
    *p = q + n;
    return 1;
}

static ch_status parse_line(scan_t *sc, const char *file, int ln, char *line, uint64_t checksum)
{
    ch_journal_state_t *st = sc->st;
    CH_TRY(check_crc(file, ln, line));
    if (ln == 1) {
        long long nt;
        unsigned long long ck;
        int off = 0;
        if (sscanf(line, "#cohort-farm-journal 1 tasks=%lld checksum=%llx taskfile=%n", &nt, &ck,
                   &off) != 2 || off == 0)
            return BAD("%s:1: not a cohort-farm journal header: '%.80s'", file, line);
        if ((int64_t)nt != st->n_tasks || (uint64_t)ck != checksum)
            return BAD("%s:1: journal of another task list (%lld tasks, checksum %016llx, "
                       "task file %s); this task file has %" PRId64 " tasks, checksum %016"
                       PRIx64 ": use another farm.dir, or the task file the journal was "
                       "written for", file, nt, ck, line + off, st->n_tasks, checksum);
        return CH_OK;
    }
    if (line[0] == 'S' && line[1] == ' ') {
        ch_journal_start_t r = {0};
        const char *p = line + 2;
        long long v[4], sp, tp, t0;
        unsigned long long ss, ts;
        int ok = field_ll(&p, 0, st->n_tasks - 1, &v[0]) && field_ll(&p, 1, INT_MAX, &v[1]) &&
                 field_ll(&p, INT_MIN, INT_MAX, &v[2]) && field_ll(&p, INT_MIN, INT_MAX, &v[3]) &&
                 field_word(&p, r.host, sizeof r.host) && field_ll(&p, LLONG_MIN, LLONG_MAX, &sp) &&
                 field_ull(&p, &ss) && field_ll(&p, LLONG_MIN, LLONG_MAX, &tp) &&
                 field_ull(&p, &ts) && field_ll(&p, LLONG_MIN, LLONG_MAX, &t0);
        if (!ok) return BAD("%s:%d: bad start record: '%.80s'", file, ln, line);
        r.id = v[0];
        r.attempt = (int)v[1];
        r.rank = (int)v[2];
        r.slot = (int)v[3];
        r.sup_pid = sp;
        r.sup_start = ss;
        r.task_pid = tp;
        r.task_start = ts;
        r.start_ns = t0;
        return push((void **)&st->starts, &st->n_starts, &sc->cap_starts, &r, sizeof r, file);
    }
    if (line[0] == 'E' && line[1] == ' ') {
        ch_journal_end_t r = {0};
        const char *p = line + 2;
        long long v[6], t0, t1, ob, eb;
        int ok = field_ll(&p, 0, st->n_tasks - 1, &v[0]) && field_ll(&p, 1, INT_MAX, &v[1]) &&
                 field_ll(&p, INT_MIN, INT_MAX, &v[2]) && field_ll(&p, INT_MIN, INT_MAX, &v[3]) &&
                 field_ll(&p, 0, CH_END_KIND_COUNT_ - 1, &v[4]) &&
                 field_ll(&p, INT_MIN, INT_MAX, &v[5]) && field_ll(&p, LLONG_MIN, LLONG_MAX, &t0) &&
                 field_ll(&p, LLONG_MIN, LLONG_MAX, &t1) && field_ll(&p, LLONG_MIN, LLONG_MAX, &ob) &&
                 field_ll(&p, LLONG_MIN, LLONG_MAX, &eb);
        if (!ok) return BAD("%s:%d: bad end record: '%.80s'", file, ln, line);
        r.id = v[0];
        r.attempt = (int)v[1];
        r.rank = (int)v[2];
        r.slot = (int)v[3];
        r.kind = (int)v[4];
        r.code = (int)v[5];
        r.start_ns = t0;
        r.end_ns = t1;
        r.out_bytes = ob;
        r.err_bytes = eb;
        return push((void **)&st->ends, &st->n_ends, &sc->cap_ends, &r, sizeof r, file);
    }
    return BAD("%s:%d: unknown journal record: '%.80s'", file, ln, line);
}

static ch_status scan_file(scan_t *sc, const char *path, uint64_t checksum)
{
    FILE *f = fopen(path, "rb");
    if (!f) return CH_ERROR(CH_ERR_IO, "journal %s: %s", path, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    int ln = 0;
    ch_status s = CH_OK;
    while ((n = getline(&line, &cap, f)) > 0) {
        ln++;
        if (line[n - 1] != '\n') {
            /* only possible on the last line: getline stops at EOF */
            s = add_torn(sc, path, ln, (size_t)n);
            break;
        }
        line[n - 1] = 0;
        if ((s = parse_line(sc, path, ln, line, checksum))) break;
    }
    if (!s && ferror(f)) s = CH_ERROR(CH_ERR_IO, "journal %s: read: %s", path, strerror(errno));
    free(line);
    fclose(f);
    return s;
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

ch_status ch_journal_scan(const char *dir, uint64_t checksum, int64_t n_tasks,
                          ch_journal_state_t **out)
{
    CH_REQUIRE(dir && out && n_tasks >= 0, "ch_journal_scan: bad argument");
    *out = NULL;
    ch_journal_state_t *st = calloc(1, sizeof *st);
    if (!st) return CH_ERROR(CH_ERR_NOMEM, "out of memory");
    st->n_tasks = n_tasks;
    st->tasks = calloc((size_t)(n_tasks ? n_tasks : 1), sizeof *st->tasks);
    if (!st->tasks) {
        free(st);
        return CH_ERROR(CH_ERR_NOMEM, "out of memory for %" PRId64 " tasks", n_tasks);
    }
    scan_t sc = {st, 0, 0, 0};
    size_t dl = strlen(dir) + 16;
    char *jdir = malloc(dl);
    if (!jdir) {
        ch_journal_state_destroy(st);
        return CH_ERROR(CH_ERR_NOMEM, "out of memory");
    }
    snprintf(jdir, dl, "%s/journal", dir);
    ch_status s = CH_OK;
    DIR *d = opendir(jdir);
    char **names = NULL;
    size_t n_names = 0, cap_names = 0;
    if (!d) {
        if (errno != ENOENT) s = CH_ERROR(CH_ERR_IO, "journal directory %s: %s", jdir, strerror(errno));
    } else {
        struct dirent *e;
        while (!s && (e = readdir(d))) {
            size_t l = strlen(e->d_name);
            if (l < 5 || strcmp(e->d_name + l - 4, ".log") != 0 || e->d_name[0] == '.') continue;
            if (n_names == cap_names) {
                cap_names = cap_names ? 2 * cap_names : 64;
                char **p = realloc(names, cap_names * sizeof *p);
                if (!p) {
                    s = CH_ERROR(CH_ERR_NOMEM, "out of memory");
                    break;
                }
                names = p;
            }
            if (!(names[n_names] = malloc(dl + l + 2))) {
                s = CH_ERROR(CH_ERR_NOMEM, "out of memory");
                break;
            }
            snprintf(names[n_names++], dl + l + 2, "%s/%s", jdir, e->d_name);
        }
        closedir(d);
    }
    if (names) qsort(names, n_names, sizeof *names, cmp_name);
    for (size_t i = 0; !s && i < n_names; i++) s = scan_file(&sc, names[i], checksum);
    for (size_t i = 0; i < n_names; i++) free(names[i]);
    free(names);
    free(jdir);
    st->n_files = (int)n_names;
    if (s) {
        ch_journal_state_destroy(st);
        return s;
    }
    /* per-task summaries */
    for (int64_t i = 0; i < st->n_starts; i++) {
        const ch_journal_start_t *r = &st->starts[i];
        ch_journal_task_t *t = &st->tasks[r->id];
        if (r->attempt > t->attempts) {
            t->attempts = r->attempt;
            t->last_start = *r;
        }
    }
    for (int64_t i = 0; i < st->n_ends; i++) {
        const ch_journal_end_t *r = &st->ends[i];
        ch_journal_task_t *t = &st->tasks[r->id];
        if (r->kind == CH_END_EXIT && r->code == 0) t->done = 1;
        if (ch_end_is_failure(r->kind, r->code)) t->failures++;
        if (r->kind == CH_END_INTERRUPTED) t->interrupted++;
        if (!t->has_end || r->attempt > t->last_end.attempt) {
            t->last_end = *r;
            t->has_end = 1;
        }
        /* an end without its start (torn S record): the attempt still counts */
        if (r->attempt > t->attempts) t->attempts = r->attempt;
    }
    for (int64_t i = 0; i < n_tasks; i++) {
        ch_journal_task_t *t = &st->tasks[i];
        t->open = t->attempts > 0 && (!t->has_end || t->last_end.attempt < t->attempts) &&
                  t->last_start.attempt == t->attempts;
    }
    *out = st;
    return CH_OK;
}

void ch_journal_state_destroy(ch_journal_state_t *st)
{
    if (!st) return;
    free(st->tasks);
    free(st->starts);
    free(st->ends);
    free(st->torn);
    free(st);
}
