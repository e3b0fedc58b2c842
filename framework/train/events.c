/* cohort: TensorBoard event files (see events.h). */
#include "config.h"

#include "framework/train/events.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---------------------------------------------------------------- CRC32C */

static uint32_t crc_table[256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_table[i] = c;
    }
}

uint32_t ch_crc32c(uint32_t crc, const void *data, size_t size)
{
    const unsigned char *p = data;
    pthread_once(&crc_once, crc_init);
    crc = ~crc;
    while (size--) crc = crc_table[(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return ~crc;
}

uint32_t ch_crc32c_mask(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

/* ---------------------------------------------------------------- protobuf encoding */

typedef struct {
    unsigned char *p;
    size_t len, cap;
} buf_t;

static int buf_reserve(buf_t *b, size_t more)
{
    if (b->len + more <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + more) cap *= 2;
    unsigned char *np = realloc(b->p, cap);
    if (!np) return -1;
    b->p = np;
    b->cap = cap;
    return 0;
}

/* The encoders assume space was reserved. */
static void put_varint(buf_t *b, uint64_t v)
{
    while (v >= 0x80) {
        b->p[b->len++] = (unsigned char)(v | 0x80);
        v >>= 7;
    }
    b->p[b->len++] = (unsigned char)v;
}

static void put_fixed(buf_t *b, const void *v, size_t n)
{
    memcpy(b->p + b->len, v, n); /* little-endian host (checked below) */
    b->len += n;
}

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "framework/train/events.c writes protobuf fixed-width fields as in memory: little-endian hosts only"
#endif

static size_t varint_len(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

enum { WT_VARINT = 0, WT_FIXED64 = 1, WT_LEN = 2, WT_FIXED32 = 5 };
#define KEY(field, wt) ((uint64_t)(((field) << 3) | (wt)))

/* Event{wall_time, step, [file_version | summary{value{tag, simple_value}} |
 * session_log{status: START}]} (session_start != 0: the last form) */
static int encode_event(buf_t *b, double wall_time, int64_t step, const char *file_version,
                        const char *tag, float value, int session_start)
{
    size_t tlen = tag ? strlen(tag) : 0, vlen, slen;
    b->len = 0;
    if (buf_reserve(b, 64 + tlen + (file_version ? strlen(file_version) : 0))) return -1;
    put_varint(b, KEY(1, WT_FIXED64));
    put_fixed(b, &wall_time, 8);
    if (step != 0) { /* proto3: default values are not written */
        put_varint(b, KEY(2, WT_VARINT));
        put_varint(b, (uint64_t)step);
    }
    if (session_start) {
        put_varint(b, KEY(7, WT_LEN));                /* Event.session_log */
        put_varint(b, 2);
        put_varint(b, KEY(1, WT_VARINT));             /* SessionLog.status */
        put_varint(b, 1);                             /* START */
        return 0;
    }
    if (file_version) {
        put_varint(b, KEY(3, WT_LEN));
        put_varint(b, strlen(file_version));
        put_fixed(b, file_version, strlen(file_version));
        return 0;
    }
    vlen = 1 + varint_len(tlen) + tlen + 1 + 4;      /* Value */
    slen = 1 + varint_len(vlen) + vlen;              /* Summary */
    put_varint(b, KEY(5, WT_LEN));
    put_varint(b, slen);
    put_varint(b, KEY(1, WT_LEN));                   /* Summary.value */
    put_varint(b, vlen);
    put_varint(b, KEY(1, WT_LEN));                   /* Value.tag */
    put_varint(b, tlen);
    put_fixed(b, tag, tlen);
    put_varint(b, KEY(2, WT_FIXED32));               /* Value.simple_value */
    put_fixed(b, &value, 4);
    return 0;
}

/* ---------------------------------------------------------------- writer */

struct ch_events {
    FILE *f;
    char *path;
    buf_t buf;
};

static atomic_int file_counter;

double ch_events_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* mkdir -p */
static ch_status make_dirs(const char *dir)
{
    char *p = strdup(dir);
    struct stat sb;
    if (!p) return CH_ERROR(CH_ERR_NOMEM, "out of memory");
    for (char *s = p + 1; ; s++) {
        if (*s == '/' || *s == 0) {
            char c = *s;
            *s = 0;
            if (mkdir(p, 0777) != 0 && errno != EEXIST) {
                ch_status st = CH_ERROR(CH_ERR_IO, "cannot create event directory '%s': %s", p,
                                        strerror(errno));
                free(p);
                return st;
            }
            *s = c;
            if (!c) break;
        }
    }
    free(p);
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return CH_ERROR(CH_ERR_IO, "event directory '%s' is not a directory", dir);
    return CH_OK;
}

static ch_status write_record(ch_events_t *ev)
{
    unsigned char head[12];
    uint64_t len = ev->buf.len;
    uint32_t c1, c2;
    memcpy(head, &len, 8);
    c1 = ch_crc32c_mask(ch_crc32c(0, head, 8));
    memcpy(head + 8, &c1, 4);
    c2 = ch_crc32c_mask(ch_crc32c(0, ev->buf.p, ev->buf.len));
    if (fwrite(head, 1, 12, ev->f) != 12 || fwrite(ev->buf.p, 1, ev->buf.len, ev->f) != ev->buf.len ||
        fwrite(&c2, 1, 4, ev->f) != 4)
        return CH_ERROR(CH_ERR_IO, "writing event file '%s' failed: %s", ev->path, strerror(errno));
    return CH_OK;
}

ch_status ch_events_open(const char *logdir, ch_events_t **out)
{
    ch_events_t *ev;
    char host[256];
    size_t len;
    int fd;
    ch_status s;

    *out = NULL;
    if (!logdir || !logdir[0]) return CH_ERROR(CH_ERR_INVALID, "event files: empty log directory");
    CH_TRY(make_dirs(logdir));
    if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "localhost");
    host[sizeof host - 1] = 0;
    for (char *c = host; *c; c++)
        if (*c == '/') *c = '_';
    ev = calloc(1, sizeof *ev);
    len = strlen(logdir) + strlen(host) + 96;
    if (!ev || !(ev->path = malloc(len))) {
        free(ev);
        return CH_ERROR(CH_ERR_NOMEM, "out of memory");
    }
    snprintf(ev->path, len, "%s/events.out.tfevents.%010lld.%s.%d.%d", logdir, (long long)time(NULL), host,
             (int)getpid(), atomic_fetch_add(&file_counter, 1));
    fd = open(ev->path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 || !(ev->f = fdopen(fd, "w"))) {
        s = CH_ERROR(CH_ERR_IO, "cannot create event file '%s': %s", ev->path, strerror(errno));
        if (fd >= 0) close(fd);
        free(ev->path);
        free(ev);
        return s;
    }
    if (encode_event(&ev->buf, ch_events_now(), 0, "brain.Event:2", NULL, 0, 0) != 0) {
        s = CH_ERROR(CH_ERR_NOMEM, "out of memory");
    } else {
        s = write_record(ev);
    }
    if (!s) s = ch_events_flush(ev);
    if (s) {
        fclose(ev->f);
        unlink(ev->path);
        free(ev->buf.p);
        free(ev->path);
        free(ev);
        return s;
    }
    *out = ev;
    return CH_OK;
}

const char *ch_events_path(const ch_events_t *ev) { return ev->path; }

ch_status ch_events_add_scalar(ch_events_t *ev, const char *tag, float value, int64_t step,
                               double wall_time)
{
    if (!tag || !tag[0]) return CH_ERROR(CH_ERR_INVALID, "event file '%s': empty scalar tag", ev->path);
    if (encode_event(&ev->buf, wall_time < 0 ? ch_events_now() : wall_time, step, NULL, tag, value, 0) != 0)
        return CH_ERROR(CH_ERR_NOMEM, "event file '%s': out of memory", ev->path);
    return write_record(ev);
}

ch_status ch_events_add_session_start(ch_events_t *ev, int64_t step, double wall_time)
{
    if (encode_event(&ev->buf, wall_time < 0 ? ch_events_now() : wall_time, step, NULL, NULL, 0, 1) != 0)
        return CH_ERROR(CH_ERR_NOMEM, "event file '%s': out of memory", ev->path);
    return write_record(ev);
}

ch_status ch_events_flush(ch_events_t *ev)
{
    if (fflush(ev->f) != 0)
        return CH_ERROR(CH_ERR_IO, "writing event file '%s' failed: %s", ev->path, strerror(errno));
    return CH_OK;
}

ch_status ch_events_destroy(ch_events_t *ev)
{
    ch_status s = CH_OK;
    if (!ev) return CH_OK;
    if (fflush(ev->f) != 0 || fsync(fileno(ev->f)) != 0)
        s = CH_ERROR(CH_ERR_IO, "writing event file '%s' failed: %s", ev->path, strerror(errno));
    if (fclose(ev->f) != 0 && !s)
        s = CH_ERROR(CH_ERR_IO, "closing event file '%s' failed: %s", ev->path, strerror(errno));
    free(ev->buf.p);
    free(ev->path);
    free(ev);
    return s;
}
