/* cohort: cohort-farm's task file parser (see taskfile.h for the format). */
#include "framework/farm/taskfile.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

typedef struct {
    char **items; /* "NAME=VALUE", owned */
    int n;
} env_set_t;

struct ch_taskfile {
    char *name;
    ch_task_t *tasks;
    int64_t n_tasks, cap_tasks;
    char **strings; /* owned command and cwd strings */
    size_t n_strings, cap_strings;
    env_set_t *envs;
    int n_envs, cap_envs;
    int barriers;
    uint64_t checksum;
};

static ch_status keep_string(ch_taskfile_t *tf, char *s)
{
    if (tf->n_strings == tf->cap_strings) {
        size_t cap = tf->cap_strings ? tf->cap_strings * 2 : 64;
        char **p = realloc(tf->strings, cap * sizeof *p);
        if (!p) {
            free(s);
            return CH_ERROR(CH_ERR_NOMEM, "%s: out of memory for the task list", tf->name);
        }
        tf->strings = p;
        tf->cap_strings = cap;
    }
    tf->strings[tf->n_strings++] = s;
    return CH_OK;
}

/* A new string a + b + c kept by tf. */
static ch_status concat3(ch_taskfile_t *tf, const char *a, const char *b, size_t lb,
                         const char *c, char **out)
{
    size_t la = strlen(a), lc = strlen(c);
    char *s = malloc(la + lb + lc + 1);
    if (!s) return CH_ERROR(CH_ERR_NOMEM, "%s: out of memory for the task list", tf->name);
    memcpy(s, a, la);
    memcpy(s + la, b, lb);
    memcpy(s + la + lb, c, lc);
    s[la + lb + lc] = 0;
    CH_TRY(keep_string(tf, s));
    *out = s;
    return CH_OK;
}

static ch_status add_task(ch_taskfile_t *tf, const char *command, const char *cwd, int env,
                          int line, int64_t repeat_index)
{
    if (tf->n_tasks >= CH_TASKFILE_MAX_TASKS)
        return CH_ERROR(CH_ERR_FORMAT, "%s:%d: more than %lld tasks (the farm's limit on a task "
                        "file, docs/farm.md)", tf->name, line, (long long)CH_TASKFILE_MAX_TASKS);
    if (tf->n_tasks == tf->cap_tasks) {
        int64_t cap = tf->cap_tasks ? tf->cap_tasks * 2 : 256;
        ch_task_t *p = realloc(tf->tasks, (size_t)cap * sizeof *p);
        if (!p) return CH_ERROR(CH_ERR_NOMEM, "%s: out of memory for the task list", tf->name);
        tf->tasks = p;
        tf->cap_tasks = cap;
    }
    ch_task_t *t = &tf->tasks[tf->n_tasks++];
    t->command = command;
    t->cwd = cwd;
    t->env = env;
    t->line = line;
    t->barrier = tf->barriers;
    t->repeat_index = repeat_index;
    return CH_OK;
}

/* Environment set = current set with `item` ("NAME=VALUE") set, or with NAME
 * removed when remove != 0 (item is then "NAME"). Returns the new index. */
static ch_status env_derive(ch_taskfile_t *tf, int cur, const char *item, int remove, int *out)
{
    if (tf->n_envs == tf->cap_envs) {
        int cap = tf->cap_envs ? tf->cap_envs * 2 : 8;
        env_set_t *p = realloc(tf->envs, (size_t)cap * sizeof *p);
        if (!p) return CH_ERROR(CH_ERR_NOMEM, "%s: out of memory for ENV", tf->name);
        tf->envs = p;
        tf->cap_envs = cap;
    }
    const env_set_t *src = &tf->envs[cur];
    size_t name_len = remove ? strlen(item) : (size_t)(strchr(item, '=') - item);
    env_set_t dst = {calloc((size_t)src->n + 1, sizeof(char *)), 0};
    if (!dst.items) return CH_ERROR(CH_ERR_NOMEM, "%s: out of memory for ENV", tf->name);
    for (int i = 0; i < src->n; i++) {
        const char *e = src->items[i];
        if (strncmp(e, item, name_len) == 0 && e[name_len] == '=') continue;
        if (!(dst.items[dst.n] = strdup(e))) goto nomem;
        dst.n++;
    }
    if (!remove) {
        if (!(dst.items[dst.n] = strdup(item))) goto nomem;
        dst.n++;
    }
    tf->envs[tf->n_envs] = dst;
    *out = tf->n_envs++;
    return CH_OK;
nomem:
    for (int i = 0; i < dst.n; i++) free(dst.items[i]);
    free(dst.items);
    return CH_ERROR(CH_ERR_NOMEM, "%s: out of memory for ENV", tf->name);
}

static int valid_env_name(const char *s, size_t n)
{
    if (n == 0 || !(isalpha((unsigned char)s[0]) || s[0] == '_')) return 0;
    for (size_t i = 1; i < n; i++)
        if (!(isalnum((unsigned char)s[i]) || s[i] == '_')) return 0;
    return 1;
}

/* Parse a decimal int64 word; *end past it. */
static int parse_i64(const char *s, const char **end, int64_t *v)
{
    errno = 0;
    char *e;
    long long x = strtoll(s, &e, 10);
    if (e == s || errno || (*e && !isspace((unsigned char)*e))) return 0;
    *v = x;
    *end = e;
    return 1;
}

static const char *skip_blank(const char *s)
{
    while (*s == ' ' || *s == '\t') s++;
    return s;
}

static uint64_t fnv1a(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 1099511628211ULL;
    }
    return h;
}

static void compute_checksum(ch_taskfile_t *tf)
{
    uint64_t h = 14695981039346656037ULL;
    for (int64_t i = 0; i < tf->n_tasks; i++) {
        const ch_task_t *t = &tf->tasks[i];
        h = fnv1a(h, t->command, strlen(t->command) + 1);
        h = fnv1a(h, t->cwd ? t->cwd : "", strlen(t->cwd ? t->cwd : "") + 1);
        const env_set_t *e = &tf->envs[t->env];
        for (int k = 0; k < e->n; k++) h = fnv1a(h, e->items[k], strlen(e->items[k]) + 1);
        h = fnv1a(h, &t->repeat_index, sizeof t->repeat_index);
        h = fnv1a(h, &t->barrier, sizeof t->barrier);
    }
    tf->checksum = h;
}

#define FMT_ERR(...) CH_ERROR(CH_ERR_FORMAT, __VA_ARGS__)

/* A task's full command (PREFIX + text + SUFFIX) must fit in one argument of
 * execve ("sh -c COMMAND"): the kernel refuses longer ones with E2BIG. */
static ch_status check_command(const ch_taskfile_t *tf, int line, const char *cmd)
{
    size_t n = strlen(cmd);
    if (n > CH_TASKFILE_MAX_COMMAND)
        return FMT_ERR("%s:%d: the task's command (after PREFIX and SUFFIX) is %zu bytes, more "
                       "than the kernel's limit of %d bytes on one argument of /bin/sh -c "
                       "(MAX_ARG_STRLEN)", tf->name, line, n, CH_TASKFILE_MAX_COMMAND);
    return CH_OK;
}

#define KNOWN_DIRECTIVES "PREFIX, SUFFIX, CWD, ENV, REPEAT, BARRIER"

/* One "#COHORT ..." line (text after "#COHORT", NUL-terminated). */
static ch_status directive(ch_taskfile_t *tf, int line, const char *rest, const char **prefix,
                           const char **suffix, const char **cwd, int *env)
{
    const char *w = skip_blank(rest);
    size_t wl = 0;
    while (w[wl] && w[wl] != ' ' && w[wl] != '\t') wl++;
    const char *arg = skip_blank(w + wl);
    const char *name = tf->name;
#define IS(word) (wl == sizeof(word) - 1 && memcmp(w, word, wl) == 0)
    if (IS("PREFIX") || IS("SUFFIX")) {
        char *s;
        /* the text is verbatim after exactly one blank */
        const char *text = w[wl] ? w + wl + 1 : w + wl;
        CH_TRY(concat3(tf, "", text, strlen(text), "", &s));
        *(IS("PREFIX") ? prefix : suffix) = s;
    } else if (IS("CWD")) {
        if (!*arg) {
            *cwd = NULL;
        } else {
            char *s;
            CH_TRY(concat3(tf, "", arg, strlen(arg), "", &s));
            *cwd = s;
        }
    } else if (IS("ENV")) {
        int remove = arg[0] == '-';
        const char *item = arg + remove;
        const char *eq = strchr(item, '=');
        size_t nl = remove ? strlen(item) : (eq ? (size_t)(eq - item) : 0);
        if ((remove && eq) || (!remove && !eq) || !valid_env_name(item, nl))
            return FMT_ERR("%s:%d: #COHORT ENV wants NAME=VALUE or -NAME (NAME of letters, "
                           "digits and '_'), got '%s'", name, line, arg);
        CH_TRY(env_derive(tf, *env, item, remove, env));
    } else if (IS("BARRIER")) {
        if (*arg) return FMT_ERR("%s:%d: #COHORT BARRIER takes no arguments, got '%s'", name, line, arg);
        tf->barriers++;
    } else if (IS("REPEAT")) {
        int64_t n, start = 0, step = 1;
        const char *p = arg;
        if (!parse_i64(p, &p, &n) || n < 1)
            return FMT_ERR("%s:%d: #COHORT REPEAT wants a count >= 1 first, got '%s'", name, line, arg);
        if (n > CH_TASKFILE_MAX_TASKS - tf->n_tasks)
            return FMT_ERR("%s:%d: #COHORT REPEAT %" PRId64 ": more than the farm's limit of "
                           "%lld tasks in a task file (%" PRId64 " before this line; docs/farm.md)",
                           name, line, n, (long long)CH_TASKFILE_MAX_TASKS, tf->n_tasks);
        for (;;) {
            p = skip_blank(p);
            int is_start = strncmp(p, "start", 5) == 0 && (p[5] == ' ' || p[5] == '\t');
            int is_step = strncmp(p, "step", 4) == 0 && (p[4] == ' ' || p[4] == '\t');
            if (!is_start && !is_step) break;
            const char *q = skip_blank(p + (is_start ? 5 : 4));
            if (!parse_i64(q, &p, is_start ? &start : &step))
                return FMT_ERR("%s:%d: #COHORT REPEAT: '%s' wants an integer", name, line,
                               is_start ? "start" : "step");
        }
        /* the last index start + (n-1)*step fits in int64, then so does every one */
        int64_t last;
        if (__builtin_mul_overflow(n - 1, step, &last) || __builtin_add_overflow(start, last, &last))
            return FMT_ERR("%s:%d: #COHORT REPEAT %" PRId64 " start %" PRId64 " step %" PRId64
                           ": the last COHORT_REPEAT_INDEX overflows a 64-bit integer", name, line,
                           n, start, step);
        char *cmd;
        CH_TRY(concat3(tf, *prefix, p, strlen(p), *suffix, &cmd));
        CH_TRY(check_command(tf, line, cmd));
        for (int64_t i = 0; i < n; i++)
            CH_TRY(add_task(tf, cmd, *cwd, *env, line, start + i * step));
    } else {
        static const char *known[] = {"PREFIX", "SUFFIX", "CWD", "ENV", "REPEAT", "BARRIER"};
        for (size_t k = 0; k < sizeof known / sizeof known[0]; k++)
            if (wl == strlen(known[k]) && strncasecmp(w, known[k], wl) == 0)
                return FMT_ERR("%s:%d: unknown directive '#COHORT %.*s': directive names are "
                               "upper case ('#COHORT %s')", name, line, (int)wl, w, known[k]);
        return FMT_ERR("%s:%d: unknown directive '#COHORT %.*s' (known: " KNOWN_DIRECTIVES ")",
                       name, line, (int)wl, w);
    }
#undef IS
    return CH_OK;
}

ch_status ch_taskfile_parse(const char *name, const char *text, size_t len, ch_taskfile_t **out)
{
    CH_REQUIRE(name && (text || len == 0) && out, "ch_taskfile_parse: NULL argument");
    *out = NULL;
    ch_taskfile_t *tf = calloc(1, sizeof *tf);
    if (!tf || !(tf->name = strdup(name))) {
        free(tf);
        return CH_ERROR(CH_ERR_NOMEM, "%s: out of memory", name);
    }
    tf->envs = calloc(8, sizeof *tf->envs);
    tf->cap_envs = 8;
    tf->n_envs = 1; /* set 0: nothing added */
    ch_status s = CH_OK;
    if (!tf->envs) {
        s = CH_ERROR(CH_ERR_NOMEM, "%s: out of memory", name);
        goto fail;
    }
    const char *prefix = "", *suffix = "", *cwd = NULL;
    int env = 0, line = 0;
    char *buf = NULL;
    size_t buf_cap = 0;
    for (size_t pos = 0; pos < len;) {
        line++;
        const char *nl = memchr(text + pos, '\n', len - pos);
        size_t end = nl ? (size_t)(nl - text) : len;
        size_t n = end - pos;
        if (memchr(text + pos, 0, n)) {
            s = FMT_ERR("%s:%d: NUL byte in the task file (not a text file?)", name, line);
            break;
        }
        if (n && text[pos + n - 1] == '\r') n--;
        if (n + 1 > buf_cap) {
            buf_cap = n + 1 > 2 * buf_cap ? n + 1 : 2 * buf_cap;
            char *b = realloc(buf, buf_cap);
            if (!b) {
                s = CH_ERROR(CH_ERR_NOMEM, "%s: out of memory", name);
                break;
            }
            buf = b;
        }
        memcpy(buf, text + pos, n);
        buf[n] = 0;
        pos = nl ? end + 1 : len;
        const char *b = skip_blank(buf);
        if (!*b) continue;
        if (*b == '#') {
            /* a first word starting with "#cohort" in any case is a directive line,
             * never a comment: a typo there must not silently drop a directive */
            if (strncasecmp(b, "#COHORT", 7) == 0) {
                size_t wl = 0;
                while (b[wl] && b[wl] != ' ' && b[wl] != '\t') wl++;
                if (wl != 7 || strncmp(b, "#COHORT", 7) != 0) {
                    s = FMT_ERR("%s:%d: '%.*s' is not a directive: a directive line starts with "
                                "'#COHORT' (upper case) and a blank (known: " KNOWN_DIRECTIVES
                                "); a comment must not start with '#cohort' in any case",
                                name, line, (int)(wl > 40 ? 40 : wl), b);
                    break;
                }
                if (!*skip_blank(b + 7)) {
                    s = FMT_ERR("%s:%d: '#COHORT' without a directive (known: " KNOWN_DIRECTIVES
                                ")", name, line);
                    break;
                }
                if ((s = directive(tf, line, b + 7, &prefix, &suffix, &cwd, &env))) break;
            }
            continue;
        }
        char *cmd;
        if ((s = concat3(tf, prefix, buf, n, suffix, &cmd))) break;
        if ((s = check_command(tf, line, cmd))) break;
        if ((s = add_task(tf, cmd, cwd, env, line, INT64_MIN))) break;
    }
    free(buf);
    if (!s && tf->n_tasks == 0)
        s = FMT_ERR("%s: no tasks (%d lines, all blank, comments or directives)", name, line);
    if (s) goto fail;
    compute_checksum(tf);
    *out = tf;
    return CH_OK;
fail:
    ch_taskfile_destroy(tf);
    return s;
}

ch_status ch_taskfile_load(const char *path, ch_taskfile_t **out)
{
    CH_REQUIRE(path && out, "ch_taskfile_load: NULL argument");
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return CH_ERROR(CH_ERR_IO, "task file %s: %s", path, strerror(errno));
    char *text = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (cap - len < 65536) {
            cap = cap ? cap * 2 : 65536;
            char *p = realloc(text, cap);
            if (!p) {
                free(text);
                fclose(f);
                return CH_ERROR(CH_ERR_NOMEM, "task file %s: out of memory", path);
            }
            text = p;
        }
        size_t got = fread(text + len, 1, cap - len, f);
        len += got;
        if (got == 0) break;
    }
    int err = ferror(f) ? errno : 0;
    fclose(f);
    if (err) {
        free(text);
        return CH_ERROR(CH_ERR_IO, "task file %s: read: %s", path, strerror(err));
    }
    ch_status s = ch_taskfile_parse(path, text, len, out);
    free(text);
    return s;
}

void ch_taskfile_destroy(ch_taskfile_t *tf)
{
    if (!tf) return;
    for (size_t i = 0; i < tf->n_strings; i++) free(tf->strings[i]);
    free(tf->strings);
    for (int k = 0; k < tf->n_envs; k++) {
        for (int i = 0; i < tf->envs[k].n; i++) free(tf->envs[k].items[i]);
        free(tf->envs[k].items);
    }
    free(tf->envs);
    free(tf->tasks);
    free(tf->name);
    free(tf);
}

int64_t ch_taskfile_count(const ch_taskfile_t *tf) { return tf->n_tasks; }

const ch_task_t *ch_taskfile_task(const ch_taskfile_t *tf, int64_t i)
{
    return i >= 0 && i < tf->n_tasks ? &tf->tasks[i] : NULL;
}

int ch_taskfile_barriers(const ch_taskfile_t *tf) { return tf->barriers; }

const char *const *ch_taskfile_env(const ch_taskfile_t *tf, int k, int *n)
{
    if (k < 0 || k >= tf->n_envs) {
        *n = 0;
        return NULL;
    }
    *n = tf->envs[k].n;
    return tf->envs[k].n ? (const char *const *)tf->envs[k].items : NULL;
}

uint64_t ch_taskfile_checksum(const ch_taskfile_t *tf) { return tf->checksum; }

const char *ch_taskfile_name(const ch_taskfile_t *tf) { return tf->name; }
