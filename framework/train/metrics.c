/* cohort: per-epoch metrics to TensorBoard and CSV (see metrics.h). */
#include "config.h"

#include "framework/train/metrics.h"
#include "framework/train/events.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct ch_metrics {
    ch_events_t *ev;
    FILE *csv;
    char *csv_path;
    char **columns;
    size_t ncolumns;
};

static int valid_column(const char *c)
{
    if (!c || !c[0]) return 0;
    for (; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
              *c == '_' || *c == '.' || *c == '/' || *c == '-'))
            return 0;
    return 1;
}

static void destroy(ch_metrics_t *m)
{
    if (!m) return;
    if (m->csv) fclose(m->csv);
    if (m->ev) ch_events_destroy(m->ev);
    for (size_t i = 0; m->columns && i < m->ncolumns; i++) free(m->columns[i]);
    free(m->columns);
    free(m->csv_path);
    free(m);
}

/* Read all of path into a NUL-terminated buffer. ENOENT -> *out NULL, OK. */
static ch_status slurp(const char *path, char **out, size_t *size)
{
    FILE *f = fopen(path, "rb");
    char *b = NULL;
    size_t cap = 0, len = 0;
    *out = NULL;
    *size = 0;
    if (!f) {
        if (errno == ENOENT) return CH_OK;
        return CH_ERROR(CH_ERR_IO, "cannot read '%s': %s", path, strerror(errno));
    }
    for (;;) {
        size_t r;
        if (len + 4096 + 1 > cap) {
            char *nb;
            cap = cap ? cap * 2 : 65536;
            nb = realloc(b, cap);
            if (!nb) {
                free(b);
                fclose(f);
                return CH_ERROR(CH_ERR_NOMEM, "out of memory reading '%s'", path);
            }
            b = nb;
        }
        r = fread(b + len, 1, cap - len - 1, f);
        len += r;
        if (r == 0) break;
    }
    if (ferror(f)) {
        free(b);
        fclose(f);
        return CH_ERROR(CH_ERR_IO, "reading '%s' failed", path);
    }
    fclose(f);
    b[len] = 0;
    *out = b;
    *size = len;
    return CH_OK;
}

/* Byte offset where a resumed CSV continues (after the header and the rows
 * of epochs < first_epoch). */
static ch_status csv_keep(const char *path, const char *text, size_t size, const char *header,
                          int64_t first_epoch, size_t *keep)
{
    size_t hlen = strlen(header), pos;
    int line = 1;
    if (size == 0) {
        *keep = 0;
        return CH_OK;
    }
    if (size < hlen + 1 || memcmp(text, header, hlen) != 0 || text[hlen] != '\n') {
        const char *nl = memchr(text, '\n', size);
        int shown = nl ? (int)(nl - text) : (int)(size < 200 ? size : 200);
        return CH_ERROR(CH_ERR_FORMAT, "'%s' has header '%.*s', expected '%s' (the columns differ: use another output directory)",
                        path, shown > 300 ? 300 : shown, text, header);
    }
    pos = hlen + 1;
    while (pos < size) {
        const char *nl = memchr(text + pos, '\n', size - pos);
        char *end;
        long long e;
        line++;
        if (!nl) break; /* torn last line: dropped */
        errno = 0;
        e = strtoll(text + pos, &end, 10);
        if (end == text + pos || *end != ',' || errno || e < 0)
            return CH_ERROR(CH_ERR_FORMAT, "'%s' line %d: expected an epoch number in the first column", path,
                            line);
        if (e >= first_epoch) break;
        pos = (size_t)(nl - text) + 1;
    }
    *keep = pos;
    return CH_OK;
}

ch_status ch_metrics_open(const char *dir, const char *csv_name,
                          const char *const *columns, size_t ncolumns, int64_t first_epoch, ch_metrics_t **out)
{
    ch_metrics_t *m;
    char *header = NULL, *text = NULL;
    size_t hcap, size = 0, keep = 0, len;
    ch_status s;

    *out = NULL;
    if (!dir || !csv_name || !csv_name[0] || strchr(csv_name, '/'))
        return CH_ERROR(CH_ERR_INVALID, "metrics: need a directory and a plain CSV file name (got '%s')",
                        csv_name ? csv_name : "(null)");
    if (ncolumns < 1 || ncolumns > CH_METRICS_MAX_COLUMNS || !columns)
        return CH_ERROR(CH_ERR_INVALID, "metrics: %zu columns, expected 1..%d", ncolumns,
                        CH_METRICS_MAX_COLUMNS);
    if (first_epoch < 0) return CH_ERROR(CH_ERR_INVALID, "metrics: first epoch %" PRId64 " < 0", first_epoch);
    hcap = 32;
    for (size_t i = 0; i < ncolumns; i++) {
        if (!valid_column(columns[i]))
            return CH_ERROR(CH_ERR_INVALID, "metrics: column %zu '%s' must be non-empty and made of letters, digits, _ . / -",
                            i, columns[i] ? columns[i] : "(null)");
        for (size_t j = 0; j < i; j++)
            if (!strcmp(columns[i], columns[j]))
                return CH_ERROR(CH_ERR_INVALID, "metrics: column '%s' given twice", columns[i]);
        hcap += strlen(columns[i]) + 1;
    }
    m = calloc(1, sizeof *m);
    if (!m) return CH_ERROR(CH_ERR_NOMEM, "out of memory");
    m->columns = calloc(ncolumns, sizeof *m->columns);
    header = malloc(hcap);
    len = strlen(dir) + strlen(csv_name) + 2;
    m->csv_path = malloc(len);
    if (!m->columns || !header || !m->csv_path) {
        s = CH_ERROR(CH_ERR_NOMEM, "out of memory");
        goto fail;
    }
    m->ncolumns = ncolumns;
    for (size_t i = 0; i < ncolumns; i++)
        if (!(m->columns[i] = strdup(columns[i]))) {
            s = CH_ERROR(CH_ERR_NOMEM, "out of memory");
            goto fail;
        }
    snprintf(m->csv_path, len, "%s/%s", dir, csv_name);
    strcpy(header, "epoch,step,wall_time");
    for (size_t i = 0; i < ncolumns; i++) {
        strcat(header, ",");
        strcat(header, columns[i]);
    }

    s = ch_events_open(dir, &m->ev); /* also creates dir */
    if (s) goto fail;
    /* TensorBoard drops older points of epochs >= first_epoch (see events.h),
     * as the CSV below drops their rows. */
    s = ch_events_add_session_start(m->ev, first_epoch, -1);
    if (!s) s = ch_events_flush(m->ev);
    if (s) goto fail;
    s = slurp(m->csv_path, &text, &size);
    if (s) goto fail;
    if (text) {
        s = csv_keep(m->csv_path, text, size, header, first_epoch, &keep);
        if (s) goto fail;
        if (keep < size && truncate(m->csv_path, (off_t)keep) != 0) {
            s = CH_ERROR(CH_ERR_IO, "cannot truncate '%s' for resuming: %s", m->csv_path, strerror(errno));
            goto fail;
        }
    }
    m->csv = fopen(m->csv_path, keep ? "ae" : "we");
    if (!m->csv) {
        s = CH_ERROR(CH_ERR_IO, "cannot write metrics file '%s': %s", m->csv_path, strerror(errno));
        goto fail;
    }
    if (!keep && (fprintf(m->csv, "%s\n", header) < 0 || fflush(m->csv) != 0)) {
        s = CH_ERROR(CH_ERR_IO, "writing '%s' failed: %s", m->csv_path, strerror(errno));
        goto fail;
    }
    free(text);
    free(header);
    *out = m;
    return CH_OK;
fail:
    if (m->ev) {
        /* an event file with only its version record is useless: remove it */
        char *p = strdup(ch_events_path(m->ev));
        ch_events_destroy(m->ev);
        m->ev = NULL;
        if (p) unlink(p);
        free(p);
    }
    free(text);
    free(header);
    destroy(m);
    return s;
}

ch_status ch_metrics_log_epoch(ch_metrics_t *m, int64_t epoch, int64_t step, double wall_time,
                               const double *values)
{
    int bad = 0;
    if (!values) return CH_ERROR(CH_ERR_INVALID, "metrics: NULL values");
    if (wall_time < 0) wall_time = ch_events_now();
    for (size_t i = 0; i < m->ncolumns; i++)
        CH_TRY(ch_events_add_scalar(m->ev, m->columns[i], (float)values[i], epoch, wall_time));
    CH_TRY(ch_events_flush(m->ev));
    bad |= fprintf(m->csv, "%" PRId64 ",%" PRId64 ",%.3f", epoch, step, wall_time) < 0;
    for (size_t i = 0; i < m->ncolumns; i++) bad |= fprintf(m->csv, ",%.9g", values[i]) < 0;
    bad |= fputc('\n', m->csv) == EOF;
    bad |= fflush(m->csv) != 0;
    if (bad) return CH_ERROR(CH_ERR_IO, "writing metrics file '%s' failed: %s", m->csv_path, strerror(errno));
    return CH_OK;
}

const char *ch_metrics_csv_path(const ch_metrics_t *m) { return m->csv_path; }
const char *ch_metrics_events_path(const ch_metrics_t *m) { return ch_events_path(m->ev); }

ch_status ch_metrics_destroy(ch_metrics_t *m)
{
    ch_status s = CH_OK;
    if (!m) return CH_OK;
    if (m->csv) {
        if (fclose(m->csv) != 0)
            s = CH_ERROR(CH_ERR_IO, "closing metrics file '%s' failed: %s", m->csv_path, strerror(errno));
        m->csv = NULL;
    }
    if (m->ev) {
        ch_status e = ch_events_destroy(m->ev);
        m->ev = NULL;
        if (!s) s = e;
    }
    destroy(m);
    return s;
}
