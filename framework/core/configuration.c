/* cohort: job configuration from libconfig files and the command line
 * (see configuration.h). */
#define _GNU_SOURCE /* vasprintf, strndup, open_memstream */
#include "config.h"

#include "framework/core/configuration.h"
#include "framework/core/config_internal.h"
#include "framework/core/config_man.h"

#include <ctype.h>
#include <errno.h>
#include <libconfig.h>
#include <limits.h>
#include <math.h>
#include <mpi.h>
#include <sys/stat.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define NAME_MAX_LEN 256

typedef struct {
    long long i;  /* int, int64, bool */
    double f;     /* float */
    char *s;      /* string */
    char **list;  /* strlist */
    int nlist;
} value_t;

typedef struct {
    const ch_config_key_t *key;
    int set;
    value_t v;
    char *source; /* "default", "FILE:LINE" or "command line (...)" */
} slot_t;

struct ch_config {
    const ch_config_key_t *keys;
    int n;
    slot_t *slots;
    int help;
    ch_config_key_t *owned_keys; /* ch_config_load_tables: the concatenation */
    /* for --help during ch_config_load_tables only (NULL otherwise) */
    const ch_config_table_t *tables;
    int n_tables;
    const char *summary;
};

static const char *const type_names[] = {"int", "int64", "float", "bool", "string", "strlist"};

const char *ch_config_type_name(ch_config_type t)
{
    if ((int)t < 0 || (size_t)t >= sizeof type_names / sizeof type_names[0]) return "?";
    return type_names[t];
}

static void value_free(value_t *v)
{
    free(v->s);
    for (int i = 0; i < v->nlist; i++) free(v->list[i]);
    free(v->list);
    memset(v, 0, sizeof *v);
}

static char *dup_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *dup_printf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *s = NULL;
    if (vasprintf(&s, fmt, ap) < 0) s = NULL;
    va_end(ap);
    return s;
}

static int has_range(const ch_config_key_t *k)
{
    return (k->type == CH_CFG_INT || k->type == CH_CFG_INT64 || k->type == CH_CFG_FLOAT) &&
           !(k->min == 0 && k->max == 0);
}

/* Number for messages: integral values without exponent, infinities as inf. */
static void fmt_num(char *buf, size_t len, double v)
{
    if (isinf(v))
        snprintf(buf, len, "%sinf", v < 0 ? "-" : "");
    else if (v == floor(v) && fabs(v) < 1e15)
        snprintf(buf, len, "%.0f", v);
    else
        snprintf(buf, len, "%g", v);
}

static void fmt_range(char *buf, size_t len, const ch_config_key_t *k)
{
    char a[64], b[64];
    fmt_num(a, sizeof a, k->min);
    fmt_num(b, sizeof b, k->max);
    snprintf(buf, len, "[%s, %s]", a, b);
}

void ch_config_key_describe(const ch_config_key_t *k, char *buf, size_t len)
{
    char def[200], range[160] = "";
    if (!k->def)
        snprintf(def, sizeof def, "required");
    else if (k->type == CH_CFG_STRING || k->type == CH_CFG_STRLIST)
        snprintf(def, sizeof def, "default \"%s\"", k->def);
    else
        snprintf(def, sizeof def, "default %s", k->def);
    if (has_range(k)) {
        char r[140];
        fmt_range(r, sizeof r, k);
        snprintf(range, sizeof range, ", range %s", r);
    }
    snprintf(buf, len, "%s, %s%s", ch_config_type_name(k->type), def, range);
}

/* Range check of a numeric value; `shown` is the value as text. */
static ch_status check_range(const ch_config_key_t *k, double v, const char *shown,
                             ch_status code, const char *where)
{
    if (!has_range(k) || (v >= k->min && v <= k->max)) return CH_OK;
    char r[140];
    fmt_range(r, sizeof r, k);
    return CH_ERROR(code, "%s: %s = %s is out of range %s", where, k->name, shown, r);
}

static int parse_bool_text(const char *t, int *out)
{
    static const char *const yes[] = {"true", "yes", "on", "1"};
    static const char *const no[] = {"false", "no", "off", "0"};
    for (int i = 0; i < 4; i++) {
        if (!strcasecmp(t, yes[i])) { *out = 1; return 1; }
        if (!strcasecmp(t, no[i])) { *out = 0; return 1; }
    }
    return 0;
}

/* Parse command-line style text for key k into *v (replacing nothing: v must
 * be empty). Errors name `where`, the key, the expected type and the text. */
static ch_status parse_text(const ch_config_key_t *k, const char *text, value_t *v,
                            ch_status code, const char *where)
{
    char *end = NULL;
    memset(v, 0, sizeof *v);
    switch (k->type) {
    case CH_CFG_INT:
    case CH_CFG_INT64: {
        errno = 0;
        long long x = strtoll(text, &end, 10);
        /* a size key (name ending in _bytes) takes a binary suffix: 8M is
         * 8 MiB, 1G 1 GiB (K, M, G, T, optionally followed by "iB" or "B") */
        const size_t nl = strlen(k->name);
        const int size_key = nl > 6 && !strcmp(k->name + nl - 6, "_bytes");
        if (size_key && end != text && *end && strchr("KkMGT", *end) &&
            (!end[1] || !strcmp(end + 1, "B") || !strcmp(end + 1, "iB"))) {
            const int shift = *end == 'K' || *end == 'k' ? 10 : *end == 'M' ? 20 : *end == 'G' ? 30 : 40;
            if (x > (LLONG_MAX >> shift) || x < -(LLONG_MAX >> shift)) errno = ERANGE;
            else x *= 1LL << shift;
            end += strlen(end);
        }
        if (!*text || *end || end == text)
            return CH_ERROR(code, "%s: %s: expected %s (a decimal integer%s), got '%s'", where,
                            k->name, ch_config_type_name(k->type),
                            size_key ? ", or with a suffix K, M, G or T" : "", text);
        if (errno == ERANGE || (k->type == CH_CFG_INT && (x < INT_MIN || x > INT_MAX)))
            return CH_ERROR(code, "%s: %s: '%s' does not fit in %s", where, k->name, text,
                            ch_config_type_name(k->type));
        CH_TRY(check_range(k, (double)x, text, code, where));
        v->i = x;
        return CH_OK;
    }
    case CH_CFG_FLOAT: {
        errno = 0;
        double x = strtod(text, &end);
        if (!*text || *end || end == text)
            return CH_ERROR(code, "%s: %s: expected float, got '%s'", where, k->name, text);
        if (!isfinite(x))
            return CH_ERROR(code, "%s: %s: expected a finite float, got '%s'", where, k->name,
                            text);
        CH_TRY(check_range(k, x, text, code, where));
        v->f = x;
        return CH_OK;
    }
    case CH_CFG_BOOL: {
        int b;
        if (!parse_bool_text(text, &b))
            return CH_ERROR(code, "%s: %s: expected bool (true/false, yes/no, on/off, 1/0), got '%s'",
                            where, k->name, text);
        v->i = b;
        return CH_OK;
    }
    case CH_CFG_STRING:
        v->s = strdup(text);
        if (!v->s) return CH_ERROR(CH_ERR_NOMEM, "config: out of memory");
        return CH_OK;
    case CH_CFG_STRLIST: {
        if (!*text) return CH_OK;
        int n = 1;
        for (const char *p = text; *p; p++) n += *p == ',';
        v->list = calloc((size_t)n, sizeof *v->list);
        if (!v->list) return CH_ERROR(CH_ERR_NOMEM, "config: out of memory");
        const char *p = text;
        for (int i = 0; i < n; i++) {
            const char *c = strchr(p, ',');
            size_t len = c ? (size_t)(c - p) : strlen(p);
            v->list[i] = strndup(p, len);
            if (!v->list[i]) {
                value_free(v);
                return CH_ERROR(CH_ERR_NOMEM, "config: out of memory");
            }
            v->nlist = i + 1;
            p = c ? c + 1 : p + len;
        }
        return CH_OK;
    }
    }
    return CH_ERROR(CH_ERR_INTERNAL, "config: key %s has unknown type %d", k->name, (int)k->type);
}

/* ---------------------------------------------------------------- names */

static int valid_component(const char *s, size_t len)
{
    if (len == 0 || !((s[0] >= 'A' && s[0] <= 'Z') || (s[0] >= 'a' && s[0] <= 'z'))) return 0;
    for (size_t i = 1; i < len; i++) {
        char c = s[i];
        if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-'))
            return 0;
    }
    return 1;
}

static int valid_name(const char *name)
{
    if (!name || strlen(name) >= NAME_MAX_LEN) return 0;
    const char *p = name;
    for (;;) {
        const char *d = strchr(p, '.');
        size_t len = d ? (size_t)(d - p) : strlen(p);
        if (!valid_component(p, len)) return 0;
        if (!d) return 1;
        p = d + 1;
    }
}

/* name_b lies inside group name_a ("train" and "train.lr"). */
static int is_prefix_group(const char *a, const char *b)
{
    size_t la = strlen(a);
    return strncmp(a, b, la) == 0 && b[la] == '.';
}

static int find_slot(const ch_config_t *c, const char *name)
{
    for (int i = 0; i < c->n; i++)
        if (!strcmp(c->keys[i].name, name)) return i;
    return -1;
}

static size_t edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la >= NAME_MAX_LEN || lb >= NAME_MAX_LEN) return SIZE_MAX;
    size_t prev[NAME_MAX_LEN + 1], cur[NAME_MAX_LEN + 1];
    for (size_t j = 0; j <= lb; j++) prev[j] = j;
    for (size_t i = 1; i <= la; i++) {
        cur[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t sub = prev[j - 1] + (a[i - 1] != b[j - 1]);
            size_t del = prev[j] + 1, ins = cur[j - 1] + 1;
            cur[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
        }
        memcpy(prev, cur, (lb + 1) * sizeof prev[0]);
    }
    return prev[lb];
}

static const char *last_component(const char *s)
{
    const char *d = strrchr(s, '.');
    return d ? d + 1 : s;
}

/* Closest key name to `name`, or NULL when nothing is close: edit distance
 * at most max(2, len/3), or the same last component ("lr" -> "train.lr"). */
static const char *closest_key(const ch_config_t *c, const char *name)
{
    const char *best = NULL;
    size_t best_d = SIZE_MAX;
    size_t limit = strlen(name) / 3;
    if (limit < 2) limit = 2;
    for (int i = 0; i < c->n; i++) {
        size_t d = edit_distance(name, c->keys[i].name);
        if (d < best_d) { best_d = d; best = c->keys[i].name; }
    }
    if (best && best_d <= limit) return best;
    for (int i = 0; i < c->n; i++)
        if (!strcmp(last_component(name), last_component(c->keys[i].name))) return c->keys[i].name;
    return NULL;
}

static void suggestion(char *buf, size_t len, const ch_config_t *c, const char *name,
                       const char *prefix)
{
    const char *s = closest_key(c, name);
    if (s)
        snprintf(buf, len, " (did you mean '%s%s'?)", prefix, s);
    else
        snprintf(buf, len, " (see --help for the keys)");
}

/* ---------------------------------------------------------------- table */

/* An alias is "--" and a valid name component, or "-" and one letter. */
static int valid_alias(const char *a)
{
    if (a[0] != '-') return 0;
    if (a[1] == '-') return strlen(a + 2) < NAME_MAX_LEN && valid_component(a + 2, strlen(a + 2));
    return ((a[1] >= 'A' && a[1] <= 'Z') || (a[1] >= 'a' && a[1] <= 'z')) && !a[2];
}

/* The alias, implicit value and positional flag of keys[i]: well formed,
 * no clash with an option of ch_config_load, a key's --NAME or another
 * alias; at most one positional key. */
static ch_status check_alias(const ch_config_key_t *keys, int n, int i)
{
    static const char *const reserved[] = {"--config", "--set", "--help", "--help-man", "-h"};
    const ch_config_key_t *k = &keys[i];
    if (k->positional && k->type != CH_CFG_STRING && k->type != CH_CFG_STRLIST)
        return CH_ERROR(CH_ERR_INVALID,
                        "config table: key %s is positional but %s (expected string or strlist)",
                        k->name, ch_config_type_name(k->type));
    for (int j = 0; k->positional && j < i; j++)
        if (keys[j].positional)
            return CH_ERROR(CH_ERR_INVALID,
                            "config table: keys %s and %s are both positional (at most one)",
                            keys[j].name, k->name);
    if (k->implicit && !k->alias)
        return CH_ERROR(CH_ERR_INVALID,
                        "config table: key %s has an implicit value '%s' but no alias", k->name,
                        k->implicit);
    if (!k->alias) return CH_OK;
    if (!valid_alias(k->alias))
        return CH_ERROR(CH_ERR_INVALID,
                        "config table: key %s: invalid alias '%s' (expected --NAME with NAME "
                        "[A-Za-z][-A-Za-z0-9_]*, or -X with one letter X)",
                        k->name, k->alias);
    for (size_t r = 0; r < sizeof reserved / sizeof *reserved; r++)
        if (!strcmp(k->alias, reserved[r]))
            return CH_ERROR(CH_ERR_INVALID, "config table: key %s: alias '%s' is reserved",
                            k->name, k->alias);
    for (int j = 0; j < n; j++) {
        if (k->alias[1] == '-' && !strcmp(k->alias + 2, keys[j].name))
            return CH_ERROR(CH_ERR_INVALID,
                            "config table: alias '%s' of key %s is the option of key %s",
                            k->alias, k->name, keys[j].name);
        if (j < i && keys[j].alias && !strcmp(keys[j].alias, k->alias))
            return CH_ERROR(CH_ERR_INVALID,
                            "config table: alias '%s' is given to keys %s and %s", k->alias,
                            keys[j].name, k->name);
    }
    if (k->implicit) {
        char where[NAME_MAX_LEN + 40];
        snprintf(where, sizeof where, "implicit value of %s", k->name);
        value_t v;
        CH_TRY(parse_text(k, k->implicit, &v, CH_ERR_INVALID, where));
        value_free(&v);
    }
    return CH_OK;
}

static ch_status check_table(const ch_config_key_t *keys, int n)
{
    static const char *const reserved[] = {"config", "set", "help", "help-man"};
    for (int i = 0; i < n; i++) {
        const ch_config_key_t *k = &keys[i];
        if (!valid_name(k->name))
            return CH_ERROR(CH_ERR_INVALID,
                            "config table entry %d: invalid key name '%s' (dotted libconfig "
                            "names [A-Za-z][-A-Za-z0-9_]*, under %d characters)",
                            i, k->name ? k->name : "(null)", NAME_MAX_LEN);
        for (size_t r = 0; r < sizeof reserved / sizeof *reserved; r++)
            if (!strcmp(k->name, reserved[r]))
                return CH_ERROR(CH_ERR_INVALID, "config table: key name '%s' is reserved",
                                k->name);
        if ((int)k->type < CH_CFG_INT || (int)k->type > CH_CFG_STRLIST)
            return CH_ERROR(CH_ERR_INVALID, "config table: key %s has unknown type %d", k->name,
                            (int)k->type);
        if (has_range(k) && !(k->min <= k->max))
            return CH_ERROR(CH_ERR_INVALID, "config table: key %s has min %g > max %g", k->name,
                            k->min, k->max);
        for (int j = 0; j < i; j++) {
            if (!strcmp(keys[j].name, k->name))
                return CH_ERROR(CH_ERR_INVALID, "config table: key %s is declared twice",
                                k->name);
            if (is_prefix_group(keys[j].name, k->name) || is_prefix_group(k->name, keys[j].name))
                return CH_ERROR(CH_ERR_INVALID,
                                "config table: '%s' and '%s': a key cannot also be a group",
                                keys[j].name, k->name);
        }
    }
    /* every name is valid now: aliases may be compared with all of them */
    for (int i = 0; i < n; i++) CH_TRY(check_alias(keys, n, i));
    return CH_OK;
}

/* Replace slot's value and source (takes ownership of v and source). */
static void slot_assign(slot_t *s, value_t *v, char *source)
{
    value_free(&s->v);
    free(s->source);
    s->v = *v;
    s->source = source;
    s->set = 1;
    memset(v, 0, sizeof *v);
}

static ch_status assign_text(slot_t *s, const char *text, ch_status code, const char *where,
                             const char *source)
{
    value_t v;
    CH_TRY(parse_text(s->key, text, &v, code, where));
    char *src = strdup(source);
    if (!src) {
        value_free(&v);
        return CH_ERROR(CH_ERR_NOMEM, "config: out of memory");
    }
    slot_assign(s, &v, src);
    return CH_OK;
}

/* ---------------------------------------------------------------- files */

static void describe_setting(char *buf, size_t len, const config_setting_t *s)
{
    switch (config_setting_type(s)) {
    case CONFIG_TYPE_INT: snprintf(buf, len, "int %d", config_setting_get_int(s)); break;
    case CONFIG_TYPE_INT64:
        snprintf(buf, len, "int64 %lld", config_setting_get_int64(s));
        break;
    case CONFIG_TYPE_FLOAT: snprintf(buf, len, "float %g", config_setting_get_float(s)); break;
    case CONFIG_TYPE_BOOL:
        snprintf(buf, len, "bool %s", config_setting_get_bool(s) ? "true" : "false");
        break;
    case CONFIG_TYPE_STRING:
        snprintf(buf, len, "string \"%.60s\"", config_setting_get_string(s));
        break;
    case CONFIG_TYPE_GROUP: snprintf(buf, len, "a group"); break;
    case CONFIG_TYPE_ARRAY: snprintf(buf, len, "an array"); break;
    case CONFIG_TYPE_LIST: snprintf(buf, len, "a list"); break;
    default: snprintf(buf, len, "type %d", config_setting_type(s)); break;
    }
}

static ch_status wrong_type(const ch_config_key_t *k, const config_setting_t *s,
                            const char *where, const char *detail)
{
    char got[128];
    describe_setting(got, sizeof got, s);
    return CH_ERROR(CH_ERR_CONFIG, "%s: %s: expected %s, got %s%s", where, k->name,
                    ch_config_type_name(k->type), got, detail);
}

static ch_status assign_setting(slot_t *slot, const config_setting_t *s, const char *where)
{
    const ch_config_key_t *k = slot->key;
    int t = config_setting_type(s);
    value_t v;
    memset(&v, 0, sizeof v);
    char shown[64];
    switch (k->type) {
    case CH_CFG_INT:
    case CH_CFG_INT64: {
        /* a size key (*_bytes) also takes the command line's text: "8M" */
        const size_t nl = strlen(k->name);
        if (t == CONFIG_TYPE_STRING && nl > 6 && !strcmp(k->name + nl - 6, "_bytes")) {
            CH_TRY(parse_text(k, config_setting_get_string(s), &v, CH_ERR_CONFIG, where));
            break;
        }
        if (t != CONFIG_TYPE_INT && t != CONFIG_TYPE_INT64)
            return wrong_type(k, s, where, nl > 6 && !strcmp(k->name + nl - 6, "_bytes")
                                               ? " (a number, or a string such as \"8M\")" : "");
        v.i = config_setting_get_int64(s);
        if (k->type == CH_CFG_INT && (v.i < INT_MIN || v.i > INT_MAX))
            return CH_ERROR(CH_ERR_CONFIG, "%s: %s: %lld does not fit in int", where, k->name,
                            v.i);
        snprintf(shown, sizeof shown, "%lld", v.i);
        CH_TRY(check_range(k, (double)v.i, shown, CH_ERR_CONFIG, where));
        break;
    }
    case CH_CFG_FLOAT:
        if (t != CONFIG_TYPE_INT && t != CONFIG_TYPE_INT64 && t != CONFIG_TYPE_FLOAT)
            return wrong_type(k, s, where, "");
        v.f = t == CONFIG_TYPE_FLOAT ? config_setting_get_float(s)
                                     : (double)config_setting_get_int64(s);
        snprintf(shown, sizeof shown, "%g", v.f);
        CH_TRY(check_range(k, v.f, shown, CH_ERR_CONFIG, where));
        break;
    case CH_CFG_BOOL:
        if (t != CONFIG_TYPE_BOOL) return wrong_type(k, s, where, " (write true or false)");
        v.i = config_setting_get_bool(s);
        break;
    case CH_CFG_STRING:
        if (t != CONFIG_TYPE_STRING) return wrong_type(k, s, where, " (strings are quoted)");
        v.s = strdup(config_setting_get_string(s));
        if (!v.s) return CH_ERROR(CH_ERR_NOMEM, "config: out of memory");
        break;
    case CH_CFG_STRLIST: {
        /* a list of strings or numbers (numbers kept as their text, so
         * `mean = [0.5, 0.4, 0.3]` reads as the command line's
         * --data.mean 0.5,0.4,0.3); a single string or number is a list of one */
        const int scalar = t == CONFIG_TYPE_STRING || t == CONFIG_TYPE_INT ||
                           t == CONFIG_TYPE_INT64 || t == CONFIG_TYPE_FLOAT;
        if (t != CONFIG_TYPE_ARRAY && t != CONFIG_TYPE_LIST && !scalar)
            return wrong_type(k, s, where, " (write [\"a\", \"b\"] or [0.5, 0.25])");
        int n = scalar ? 1 : config_setting_length(s);
        if (n > 0) {
            v.list = calloc((size_t)n, sizeof *v.list);
            if (!v.list) return CH_ERROR(CH_ERR_NOMEM, "config: out of memory");
        }
        for (int i = 0; i < n; i++) {
            const config_setting_t *e = scalar ? s : config_setting_get_elem(s, (unsigned)i);
            char num[64];
            const char *text = num;
            switch (config_setting_type(e)) {
            case CONFIG_TYPE_STRING: text = config_setting_get_string(e); break;
            case CONFIG_TYPE_INT:
            case CONFIG_TYPE_INT64:
                snprintf(num, sizeof num, "%lld", config_setting_get_int64(e));
                break;
            case CONFIG_TYPE_FLOAT: {
                const double d = config_setting_get_float(e); /* the shortest text that reads back */
                snprintf(num, sizeof num, "%.15g", d);
                if (strtod(num, NULL) != d) snprintf(num, sizeof num, "%.17g", d);
                break;
            }
            default: {
                char got[128];
                describe_setting(got, sizeof got, e);
                value_free(&v);
                return CH_ERROR(CH_ERR_CONFIG, "%s: %s: element %d: expected a string or a number, "
                                "got %s", where, k->name, i, got);
            }
            }
            v.list[i] = strdup(text);
            if (!v.list[i]) {
                value_free(&v);
                return CH_ERROR(CH_ERR_NOMEM, "config: out of memory");
            }
            v.nlist = i + 1;
        }
        break;
    }
    }
    char *src = strdup(where);
    if (!src) {
        value_free(&v);
        return CH_ERROR(CH_ERR_NOMEM, "config: out of memory");
    }
    slot_assign(slot, &v, src);
    return CH_OK;
}

static int group_is_known(const ch_config_t *c, const char *path)
{
    for (int i = 0; i < c->n; i++)
        if (is_prefix_group(path, c->keys[i].name)) return 1;
    return 0;
}

/* Walk group g whose dotted path is `path` (empty for the root). */
static ch_status walk(ch_config_t *c, const config_setting_t *g, const char *path,
                      const char *fname)
{
    int n = config_setting_length(g);
    for (int i = 0; i < n; i++) {
        const config_setting_t *s = config_setting_get_elem(g, (unsigned)i);
        char full[NAME_MAX_LEN * 2], where[NAME_MAX_LEN * 2 + 32];
        snprintf(full, sizeof full, "%s%s%s", path, *path ? "." : "", config_setting_name(s));
        const char *sf = config_setting_source_file(s);
        snprintf(where, sizeof where, "%s:%u", sf ? sf : fname, config_setting_source_line(s));
        int slot = find_slot(c, full);
        if (slot >= 0) {
            CH_TRY(assign_setting(&c->slots[slot], s, where));
        } else if (config_setting_is_group(s) && (group_is_known(c, full) ||
                                                   config_setting_length(s) > 0)) {
            /* An unknown group with members: report its first member, whose
             * full name gives the better suggestion ("trian.lr" -> "train.lr"). */
            CH_TRY(walk(c, s, full, fname));
        } else if (group_is_known(c, full)) {
            return CH_ERROR(CH_ERR_CONFIG, "%s: '%s' is a group of keys, not a value (write "
                            "%s = { ... };)", where, full, config_setting_name(s));
        } else {
            char sug[NAME_MAX_LEN + 48];
            suggestion(sug, sizeof sug, c, full, "");
            return CH_ERROR(CH_ERR_CONFIG, "%s: unknown key '%s'%s", where, full, sug);
        }
    }
    return CH_OK;
}

/* A lexical pass over a config file before/after libconfig reads it:
 * - libconfig 1.5 reads an integer literal without an L suffix into a 32-bit
 *   int and silently wraps larger ones (5000000000 becomes 705032704): such
 *   literals (outside strings, comments and names) are rejected;
 * - an unterminated string is reported with the line it opens on (libconfig
 *   1.5 also leaks its buffer on that path).
 * Errors name file and line. */
static ch_status check_int_literals(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) return CH_OK; /* libconfig reports unreadable files itself */
    ch_status s = CH_OK;
    int line = 1, prev_sign = 0, string_line = 0;
    enum { CODE, STRING, LINE_COMMENT, BLOCK_COMMENT } st = CODE;
    int c = fgetc(f);
    while (c != EOF && s == CH_OK) {
        int next = fgetc(f);
        if (st == STRING) {
            if (c == '\\' && next != EOF) {
                if (next == '\n') line++;
                next = fgetc(f);
            } else if (c == '"') {
                st = CODE;
            }
        } else if (st == LINE_COMMENT) {
            if (c == '\n') st = CODE;
        } else if (st == BLOCK_COMMENT) {
            if (c == '*' && next == '/') {
                next = fgetc(f);
                st = CODE;
            }
        } else if (c == '"') {
            st = STRING;
            string_line = line;
        } else if (c == '#' || (c == '/' && next == '/')) {
            st = LINE_COMMENT;
        } else if (c == '/' && next == '*') {
            next = fgetc(f);
            st = BLOCK_COMMENT;
        } else if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '*' || c == '@') {
            /* a name (may contain digits and '-') */
            while (next != EOF && ((next >= 'A' && next <= 'Z') || (next >= 'a' && next <= 'z') ||
                                   (next >= '0' && next <= '9') || next == '_' || next == '-' ||
                                   next == '*'))
                next = fgetc(f);
        } else if (c >= '0' && c <= '9') {
            char tok[80];
            size_t n = 0;
            tok[n++] = (char)c;
            int is_float = 0;
            while (next != EOF) {
                int ok = (next >= '0' && next <= '9') || (next >= 'a' && next <= 'f') ||
                         (next >= 'A' && next <= 'F') || next == 'x' || next == 'X' ||
                         next == '.' || ((next == '+' || next == '-') && n > 0 &&
                                         (tok[n - 1] == 'e' || tok[n - 1] == 'E'));
                if (!ok) break;
                if (next == '.') is_float = 1;
                if (n < sizeof tok - 1) tok[n++] = (char)next;
                next = fgetc(f);
            }
            tok[n] = 0;
            int hex = n > 1 && tok[0] == '0' && (tok[1] == 'x' || tok[1] == 'X');
            if (!hex && strpbrk(tok, "eE")) is_float = 1;
            int suffix_l = next == 'L';
            if (!is_float && !suffix_l) {
                errno = 0;
                unsigned long long v = strtoull(tok, NULL, hex ? 16 : 10);
                unsigned long long limit = hex ? 0xFFFFFFFFull
                                               : (prev_sign == '-' ? 2147483648ull : 2147483647ull);
                if (errno == ERANGE || v > limit)
                    s = CH_ERROR(CH_ERR_CONFIG, "%s:%d: integer %s%s does not fit in a 32-bit "
                                 "libconfig int; write %s%sL for a 64-bit value",
                                 path, line, prev_sign == '-' ? "-" : "", tok,
                                 prev_sign == '-' ? "-" : "", tok);
            }
        }
        if (c == '\n') line++;
        if (st == CODE && c != ' ' && c != '\t') prev_sign = (c == '-' || c == '+') ? c : 0;
        c = next;
    }
    fclose(f);
    if (s == CH_OK && st == STRING)
        s = CH_ERROR(CH_ERR_CONFIG, "%s:%d: unterminated string (the quote opens here)", path,
                     string_line);
    return s;
}

static ch_status load_file(ch_config_t *c, const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return CH_ERROR(CH_ERR_IO, "--config %s: cannot open config file: %s", path,
                        strerror(errno));
    struct stat sb;
    const int is_dir = fstat(fileno(f), &sb) == 0 && S_ISDIR(sb.st_mode);
    fclose(f);
    if (is_dir)
        return CH_ERROR(CH_ERR_IO, "--config %s: is a directory (a libconfig file expected)", path);
    config_t lc;
    config_init(&lc);
    /* @include "x.cfg" is relative to the including file's directory */
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) {
        slash[slash == dir ? 1 : 0] = 0;
        config_set_include_dir(&lc, dir);
    }
    ch_status pre = check_int_literals(path);
    if (pre != CH_OK) {
        config_destroy(&lc);
        return pre;
    }
    errno = 0;
    if (config_read_file(&lc, path) != CONFIG_TRUE) {
        ch_status s;
        if (config_error_type(&lc) == CONFIG_ERR_FILE_IO)
            s = CH_ERROR(CH_ERR_IO, "--config %s: cannot read config file%s%s%s%s", path,
                         config_error_file(&lc) ? " " : "",
                         config_error_file(&lc) ? config_error_file(&lc) : "",
                         errno ? ": " : "", errno ? strerror(errno) : "");
        else
            s = CH_ERROR(CH_ERR_CONFIG, "%s:%d: %s", config_error_file(&lc) ? config_error_file(&lc)
                                                                              : path,
                         config_error_line(&lc), config_error_text(&lc));
        config_destroy(&lc);
        return s;
    }
    /* every file read, the main one and its @includes */
    ch_status s = CH_OK;
    for (unsigned i = 0; s == CH_OK && lc.filenames && i < lc.num_filenames; i++)
        s = check_int_literals(lc.filenames[i]);
    if (s == CH_OK) s = walk(c, config_root_setting(&lc), "", path);
    config_destroy(&lc);
    return s;
}

/* ---------------------------------------------------------------- argv */

typedef struct {
    int slot;
    const char *text;
    char *where; /* the option as typed (an alias as --NAME, see parse_args) */
    char *owned; /* the joined positional words (text), or NULL */
} override_t;

static int is_bool_literal(const char *t)
{
    int b;
    return parse_bool_text(t, &b);
}

static ch_status unknown_option(const ch_config_t *c, const char *arg, const char *name)
{
    char sug[NAME_MAX_LEN + 48];
    suggestion(sug, sizeof sug, c, name, "--");
    if (!closest_key(c, name)) {
        if (edit_distance(name, "config") <= 2) snprintf(sug, sizeof sug, " (did you mean '--config'?)");
        else if (edit_distance(name, "help") <= 1) snprintf(sug, sizeof sug, " (did you mean '--help'?)");
    }
    return CH_ERROR(CH_ERR_CONFIG, "unknown option '%s'%s", arg, sug);
}

/* The slot whose alias the word a is (-1: none); *attached gets the value
 * written in the same word (--alias=V, -xV) or NULL. */
static int find_alias(const ch_config_t *c, const char *a, const char **attached)
{
    *attached = NULL;
    for (int i = 0; i < c->n; i++) {
        const char *al = c->keys[i].alias;
        if (!al) continue;
        if (al[1] == '-') {
            size_t len = strlen(al);
            if (!strncmp(a, al, len) && (!a[len] || a[len] == '=')) {
                if (a[len]) *attached = a + len + 1;
                return i;
            }
        } else if (a[0] == '-' && a[1] == al[1]) {
            if (a[2]) *attached = a + 2;
            return i;
        }
    }
    return -1;
}

static int find_positional(const ch_config_t *c)
{
    for (int i = 0; i < c->n; i++)
        if (c->keys[i].positional) return i;
    return -1;
}

/* The value of option argv[*i] for key `slot`: `attached` (--KEY=V), else the
 * next word, else (a bool) true. `opt` is the option as messages show it:
 * "--NAME" for an alias too, so that a value's source and errors read as
 * for the key's own option. With `alias`, the key's implicit value applies
 * (configuration.h). With a positional key a bool takes the next word
 * only when it is true or false: any other word is an argument. */
static ch_status option_value(const ch_config_t *c, int slot, const char *opt,
                              const char *attached, int alias, int has_positional, int argc,
                              char *const *argv, int *i, override_t *ov)
{
    const ch_config_key_t *k = &c->keys[slot];
    const char *next = *i + 1 < argc ? argv[*i + 1] : NULL;
    const char *v;
    char *where;
    if (attached) {
        v = attached;
        where = dup_printf("%s=%s", opt, attached);
    } else if (alias && k->implicit &&
               (k->type == CH_CFG_BOOL || !next || !strncmp(next, "--", 2))) {
        v = k->implicit;
        where = dup_printf("%s=%s", opt, k->implicit);
    } else if (k->type == CH_CFG_BOOL &&
               !(next && (has_positional ? !strcmp(next, "true") || !strcmp(next, "false")
                                         : is_bool_literal(next)))) {
        v = "true";
        where = dup_printf("%s", opt);
    } else {
        if (!next)
            return CH_ERROR(CH_ERR_CONFIG, "%s needs a value (%s)", opt,
                            ch_config_type_name(k->type));
        /* a short option followed by another option (--out --keepdims) is
         * a missing value, not a value that starts with -- */
        if (alias && !strncmp(next, "--", 2))
            return CH_ERROR(CH_ERR_CONFIG,
                            "%s needs a value (%s), not the option '%s' (a value that starts "
                            "with -- goes as %s=VALUE)",
                            opt, ch_config_type_name(k->type), next, opt);
        v = argv[++*i];
        where = dup_printf("%s %s", opt, v);
    }
    if (!where) return CH_ERROR(CH_ERR_NOMEM, "config: out of memory");
    ov->slot = slot;
    ov->text = v;
    ov->where = where;
    ov->owned = NULL;
    return CH_OK;
}

static ch_status parse_args(ch_config_t *c, int argc, char *const *argv, const char **files,
                            int *n_files, override_t *ov, int *n_ov)
{
    const int pos = find_positional(c);
    char *words = NULL; /* the positional words, joined by ',' */
    size_t words_len = 0;
    ch_status st = CH_OK;
    for (int i = 1; st == CH_OK && i < argc; i++) {
        const char *a = argv[i];
        const char *attached;
        int slot;
        if ((slot = find_alias(c, a, &attached)) >= 0) {
            char opt[NAME_MAX_LEN + 2];
            snprintf(opt, sizeof opt, "--%s", c->keys[slot].name);
            st = option_value(c, slot, opt, attached, 1, pos >= 0, argc, argv, &i, &ov[*n_ov]);
            if (st == CH_OK) (*n_ov)++;
            continue;
        }
        if (pos >= 0 && a[0] != '-') {
            size_t len = strlen(a);
            char *w = realloc(words, words_len + len + 2);
            if (!w) {
                st = CH_ERROR(CH_ERR_NOMEM, "config: out of memory");
                break;
            }
            words = w;
            if (words_len) words[words_len++] = ',';
            memcpy(words + words_len, a, len + 1);
            words_len += len;
            continue;
        }
        if (strncmp(a, "--", 2) != 0 || !a[2]) {
            st = CH_ERROR(CH_ERR_CONFIG,
                          "unexpected argument '%s' (options are --config FILE, --set KEY=VALUE, "
                          "--KEY=VALUE; see --help)",
                          a);
            break;
        }
        const char *opt = a + 2;
        const char *eq = strchr(opt, '=');
        size_t nlen = eq ? (size_t)(eq - opt) : strlen(opt);
        char name[NAME_MAX_LEN];
        if (nlen >= sizeof name) {
            st = unknown_option(c, a, "");
            break;
        }
        memcpy(name, opt, nlen);
        name[nlen] = 0;

        if (!strcmp(name, "config")) {
            const char *v = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
            if (!v || !*v) st = CH_ERROR(CH_ERR_CONFIG, "--config needs a file name");
            else files[(*n_files)++] = v;
        } else if (!strcmp(name, "set")) {
            const char *kv = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
            if (!kv) {
                st = CH_ERROR(CH_ERR_CONFIG, "--set needs KEY=VALUE");
                break;
            }
            const char *e = strchr(kv, '=');
            if (!e) {
                st = CH_ERROR(CH_ERR_CONFIG, "--set %s: expected KEY=VALUE", kv);
                break;
            }
            size_t klen = (size_t)(e - kv);
            char key[NAME_MAX_LEN];
            if (klen >= sizeof key) klen = sizeof key - 1;
            memcpy(key, kv, klen);
            key[klen] = 0;
            slot = find_slot(c, key);
            if (slot < 0) {
                char sug[NAME_MAX_LEN + 48];
                suggestion(sug, sizeof sug, c, key, "");
                st = CH_ERROR(CH_ERR_CONFIG, "--set %s: unknown key '%s'%s", kv, key, sug);
                break;
            }
            ov[*n_ov].slot = slot;
            ov[*n_ov].text = e + 1;
            ov[*n_ov].owned = NULL;
            ov[*n_ov].where = dup_printf("--set %s", kv);
            if (!ov[(*n_ov)++].where) st = CH_ERROR(CH_ERR_NOMEM, "config: out of memory");
        } else {
            slot = find_slot(c, name);
            if (slot < 0) {
                st = unknown_option(c, a, name);
                break;
            }
            /* the option as typed: --KEY, or --KEY=... up to the '=' */
            char shown[NAME_MAX_LEN + 2];
            snprintf(shown, sizeof shown, "--%s", name);
            st = option_value(c, slot, shown, eq ? eq + 1 : NULL, 0, pos >= 0, argc, argv, &i,
                              &ov[*n_ov]);
            if (st == CH_OK) (*n_ov)++;
        }
    }
    if (st == CH_OK && words_len > 0)
        for (int j = 0; j < *n_ov; j++)
            if (ov[j].slot == pos) { /* one would silently replace the other */
                st = CH_ERROR(CH_ERR_CONFIG,
                              "%s and the arguments '%s' both give %s: give the values one way "
                              "(arguments, or one option with A,B,...)",
                              ov[j].where, words, c->keys[pos].name);
                break;
            }
    if (st == CH_OK && words_len > 0) {
        /* after every other option, as if given last */
        ov[*n_ov].slot = pos;
        ov[*n_ov].text = words;
        ov[*n_ov].owned = words;
        ov[*n_ov].where = dup_printf("--%s=%s", c->keys[pos].name, words);
        if (!ov[(*n_ov)++].where) st = CH_ERROR(CH_ERR_NOMEM, "config: out of memory");
        words = NULL;
    }
    free(words);
    return st;
}

/* ---------------------------------------------------------------- load */

static int mpi_rank_or_zero(void)
{
    int inited = 0, finalized = 0, rank = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (inited && !finalized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    return rank;
}

/* The program name for --help and --help-man: argv[0] without its
 * directory ("cohort" without argv[0]). */
static const char *prog_name(int argc, char *const *argv)
{
    const char *prog = argc > 0 && argv[0] ? strrchr(argv[0], '/') : NULL;
    return prog ? prog + 1 : (argc > 0 && argv[0] ? argv[0] : "cohort");
}

static ch_status load(ch_config_t *c, int argc, char *const *argv)
{
    if (ch_man_requested(argc, argv)) {
        c->help = 1;
        if (mpi_rank_or_zero() != 0) return CH_OK;
        const char *prog = prog_name(argc, argv);
        /* ch_config_load_tables: the job's tables and summary; ch_config_load:
         * one untitled table */
        const ch_config_table_t all = {NULL, c->keys, c->n};
        const ch_man_page_t page = {.prog = prog, .summary = c->summary,
                                    .tables = c->tables ? c->tables : &all,
                                    .n_tables = c->tables ? c->n_tables : 1};
        ch_status s = ch_man_write(stdout, &page);
        fflush(stdout);
        return s;
    }
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            c->help = 1;
            if (mpi_rank_or_zero() == 0) {
                const char *prog = prog_name(argc, argv);
                if (c->tables)
                    ch_config_print_help_tables(c->tables, c->n_tables, prog, c->summary, stdout);
                else
                    ch_config_print_help(c->keys, c->n, prog, stdout);
                fflush(stdout);
            }
            return CH_OK;
        }

    /* Defaults. A bad default is a bug in the job's table. */
    for (int i = 0; i < c->n; i++) {
        const ch_config_key_t *k = &c->keys[i];
        c->slots[i].key = k;
        if (!k->def) continue;
        char where[NAME_MAX_LEN + 32];
        snprintf(where, sizeof where, "default of %s", k->name);
        CH_TRY(assign_text(&c->slots[i], k->def, CH_ERR_INVALID, where, "default"));
    }

    int cap = argc + 1; /* the options, and the positional words' override */
    const char **files = calloc((size_t)cap, sizeof *files);
    override_t *ov = calloc((size_t)cap, sizeof *ov);
    int n_files = 0, n_ov = 0;
    ch_status s = CH_OK;
    if (!files || !ov) s = CH_ERROR(CH_ERR_NOMEM, "config: out of memory");
    if (!s) s = parse_args(c, argc, argv, files, &n_files, ov, &n_ov);
    for (int i = 0; !s && i < n_files; i++) s = load_file(c, files[i]);
    for (int i = 0; !s && i < n_ov; i++) {
        char *src = dup_printf("command line (%s)", ov[i].where);
        if (!src) {
            s = CH_ERROR(CH_ERR_NOMEM, "config: out of memory");
            break;
        }
        s = assign_text(&c->slots[ov[i].slot], ov[i].text, CH_ERR_CONFIG, ov[i].where, src);
        free(src);
    }
    for (int i = 0; !s && i < c->n; i++)
        if (!c->slots[i].set)
            s = CH_ERROR(CH_ERR_CONFIG,
                         "required key %s (%s) is not set: give it in the --config file or as "
                         "--%s=VALUE",
                         c->keys[i].name, ch_config_type_name(c->keys[i].type), c->keys[i].name);
    for (int i = 0; i < n_ov; i++) {
        free(ov[i].where);
        free(ov[i].owned);
    }
    free(ov);
    free(files);
    return s;
}

ch_status ch_config_load_tables(const ch_config_table_t *tables, int n_tables,
                                const char *summary, int argc, char *const *argv,
                                ch_config_t **out)
{
    CH_REQUIRE(out != NULL, "ch_config_load_tables: out is NULL");
    *out = NULL;
    CH_REQUIRE(n_tables >= 0 && (tables != NULL || n_tables == 0),
               "ch_config_load_tables: bad table list (%d tables)", n_tables);
    CH_REQUIRE(argc >= 0 && (argv != NULL || argc == 0), "ch_config_load_tables: bad argv");
    int n = 0;
    for (int t = 0; t < n_tables; t++) {
        CH_REQUIRE(tables[t].n_keys >= 0 && (tables[t].keys != NULL || tables[t].n_keys == 0),
                   "ch_config_load_tables: table %d (%s) has a bad key list (%d keys)", t,
                   tables[t].title ? tables[t].title : "untitled", tables[t].n_keys);
        CH_REQUIRE(n <= INT_MAX - tables[t].n_keys, "ch_config_load_tables: too many keys");
        n += tables[t].n_keys;
    }
    ch_config_key_t *all = malloc((n > 0 ? (size_t)n : 1) * sizeof *all);
    if (!all) return CH_ERROR(CH_ERR_NOMEM, "config: out of memory");
    n = 0;
    for (int t = 0; t < n_tables; t++) {
        if (tables[t].n_keys > 0)
            memcpy(all + n, tables[t].keys, (size_t)tables[t].n_keys * sizeof *all);
        n += tables[t].n_keys;
    }
    ch_status s = check_table(all, n);
    if (s) {
        free(all);
        return s;
    }
    ch_config_t *c = calloc(1, sizeof *c);
    if (c) c->slots = calloc(n > 0 ? (size_t)n : 1, sizeof *c->slots);
    if (!c || !c->slots) {
        free(c);
        free(all);
        return CH_ERROR(CH_ERR_NOMEM, "config: out of memory");
    }
    c->keys = c->owned_keys = all;
    c->n = n;
    c->tables = tables;
    c->n_tables = n_tables;
    c->summary = summary;
    s = load(c, argc, argv);
    c->tables = NULL;
    c->summary = NULL;
    if (s) {
        ch_config_destroy(c);
        return s;
    }
    *out = c;
    return CH_OK;
}

ch_status ch_config_load(const ch_config_key_t *keys, int n_keys, int argc, char *const *argv,
                         ch_config_t **out)
{
    CH_REQUIRE(out != NULL, "ch_config_load: out is NULL");
    *out = NULL;
    CH_REQUIRE(n_keys >= 0 && (keys != NULL || n_keys == 0),
               "ch_config_load: bad key table (%d keys)", n_keys);
    CH_REQUIRE(argc >= 0 && (argv != NULL || argc == 0), "ch_config_load: bad argv");
    CH_TRY(check_table(keys, n_keys));
    ch_config_t *c = calloc(1, sizeof *c);
    if (!c) return CH_ERROR(CH_ERR_NOMEM, "config: out of memory");
    c->keys = keys;
    c->n = n_keys;
    c->slots = calloc(n_keys > 0 ? (size_t)n_keys : 1, sizeof *c->slots);
    if (!c->slots) {
        free(c);
        return CH_ERROR(CH_ERR_NOMEM, "config: out of memory");
    }
    ch_status s = load(c, argc, argv);
    if (s) {
        ch_config_destroy(c);
        return s;
    }
    *out = c;
    return CH_OK;
}

void ch_config_destroy(ch_config_t *cfg)
{
    if (!cfg) return;
    for (int i = 0; i < cfg->n; i++) {
        value_free(&cfg->slots[i].v);
        free(cfg->slots[i].source);
    }
    free(cfg->slots);
    free(cfg->owned_keys);
    free(cfg);
}

int ch_config_help_requested(const ch_config_t *cfg)
{
    return cfg ? cfg->help : 0;
}

/* ---------------------------------------------------------------- lookups */

static ch_status lookup(const ch_config_t *cfg, const char *name, const slot_t **out,
                        unsigned accepted_types, const char *want)
{
    CH_REQUIRE(cfg != NULL && name != NULL, "config lookup: NULL config or name");
    int i = find_slot(cfg, name);
    if (i < 0) return CH_ERROR(CH_ERR_INVALID, "config key '%s' is not in the job's key table", name);
    if (!(accepted_types & (1u << cfg->keys[i].type)))
        return CH_ERROR(CH_ERR_INVALID, "config key %s is %s; it cannot be read as %s", name,
                        ch_config_type_name(cfg->keys[i].type), want);
    *out = &cfg->slots[i];
    return CH_OK;
}

#define T(x) (1u << (x))

ch_status ch_config_get_int(const ch_config_t *cfg, const char *name, int *out)
{
    const slot_t *s;
    CH_TRY(lookup(cfg, name, &s, T(CH_CFG_INT), "int"));
    *out = (int)s->v.i;
    return CH_OK;
}

ch_status ch_config_get_int64(const ch_config_t *cfg, const char *name, long long *out)
{
    const slot_t *s;
    CH_TRY(lookup(cfg, name, &s, T(CH_CFG_INT) | T(CH_CFG_INT64), "int64"));
    *out = s->v.i;
    return CH_OK;
}

ch_status ch_config_get_double(const ch_config_t *cfg, const char *name, double *out)
{
    const slot_t *s;
    CH_TRY(lookup(cfg, name, &s, T(CH_CFG_INT) | T(CH_CFG_INT64) | T(CH_CFG_FLOAT), "float"));
    *out = s->key->type == CH_CFG_FLOAT ? s->v.f : (double)s->v.i;
    return CH_OK;
}

ch_status ch_config_get_bool(const ch_config_t *cfg, const char *name, int *out)
{
    const slot_t *s;
    CH_TRY(lookup(cfg, name, &s, T(CH_CFG_BOOL), "bool"));
    *out = (int)s->v.i;
    return CH_OK;
}

ch_status ch_config_get_string(const ch_config_t *cfg, const char *name, const char **out)
{
    const slot_t *s;
    CH_TRY(lookup(cfg, name, &s, T(CH_CFG_STRING), "string"));
    *out = s->v.s;
    return CH_OK;
}

ch_status ch_config_get_strlist(const ch_config_t *cfg, const char *name,
                                const char *const **items, int *n)
{
    const slot_t *s;
    CH_TRY(lookup(cfg, name, &s, T(CH_CFG_STRLIST), "strlist"));
    *items = (const char *const *)s->v.list;
    *n = s->v.nlist;
    return CH_OK;
}

ch_status ch_config_get_choice(const ch_config_t *cfg, const char *name,
                               const char *const *choices, int n_choices, int *index)
{
    const slot_t *s;
    CH_TRY(lookup(cfg, name, &s, T(CH_CFG_STRING), "string"));
    for (int i = 0; i < n_choices; i++)
        if (!strcmp(s->v.s, choices[i])) {
            *index = i;
            return CH_OK;
        }
    char list[512] = "";
    size_t used = 0;
    for (int i = 0; i < n_choices && used < sizeof list; i++)
        used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "",
                                 choices[i]);
    return CH_ERROR(CH_ERR_CONFIG, "%s: %s = '%s' is not one of: %s", s->source, name, s->v.s,
                    list);
}

const char *ch_config_source(const ch_config_t *cfg, const char *name)
{
    if (!cfg || !name) return NULL;
    int i = find_slot(cfg, name);
    return i < 0 ? NULL : cfg->slots[i].source;
}

/* ---------------------------------------------------------------- help */

static void print_wrapped(FILE *out, const char *text, int indent, int width)
{
    const char *p = text;
    while (*p) {
        while (*p == ' ') p++;
        if (!*p) break;
        int avail = width - indent;
        const char *end = p, *brk = NULL;
        while (*end && end - p < avail) {
            if (*end == ' ') brk = end;
            end++;
        }
        if (*end && brk) end = brk;
        else if (*end) {
            while (*end && *end != ' ') end++; /* a word longer than the line */
        }
        fprintf(out, "%*s%.*s\n", indent, "", (int)(end - p), p);
        p = end;
    }
}

static int cmp_names(const char *a, const char *b)
{
    /* component-wise, so a group's keys stay together */
    for (;;) {
        size_t la = strcspn(a, "."), lb = strcspn(b, ".");
        size_t l = la < lb ? la : lb;
        int r = strncmp(a, b, l);
        if (r) return r;
        if (la != lb) return la < lb ? -1 : 1;
        if (!a[la] || !b[lb]) return a[la] ? 1 : (b[lb] ? -1 : 0);
        a += la + 1;
        b += lb + 1;
    }
}

static const ch_config_key_t *sort_keys_base;
static int cmp_index(const void *x, const void *y)
{
    return cmp_names(sort_keys_base[*(const int *)x].name, sort_keys_base[*(const int *)y].name);
}

/* Indices 0..n-1 sorted by key name; NULL on allocation failure. */
static int *sorted_order(const ch_config_key_t *keys, int n)
{
    int *idx = malloc((n > 0 ? (size_t)n : 1) * sizeof *idx);
    if (!idx) return NULL;
    for (int i = 0; i < n; i++) idx[i] = i;
    /* qsort has no context argument; the table is read-only and the sort
     * short, so a file-level pointer guarded by a lock is enough. */
    static pthread_mutex_t sort_lock = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&sort_lock);
    sort_keys_base = keys;
    qsort(idx, (size_t)n, sizeof *idx, cmp_index);
    pthread_mutex_unlock(&sort_lock);
    return idx;
}

int *ch_config_sorted_order(const ch_config_key_t *keys, int n)
{
    return sorted_order(keys, n);
}

static void print_usage(FILE *out, const char *prog, const char *summary)
{
    /* a summary with its own "Usage: " line (a job's short form) gives the
     * first line; the generic form follows as the alternative, so there is
     * one Usage line */
    const char *own = summary ? strstr(summary, "Usage: ") : NULL;
    if (own && own != summary && own[-1] != '\n') own = NULL;
    if (own) {
        const char *end = own + strcspn(own, "\n");
        fprintf(out, "%.*s\n", (int)(end - own), own);
        fprintf(out, "   or: %s [--config FILE]... [--set KEY=VALUE]... [--KEY=VALUE]... [--help]\n",
                prog ? prog : "cohort");
        /* the summary without its usage line */
        if (own > summary) fprintf(out, "%.*s\n", (int)(own - summary - 1), summary);
        if (*end == '\n' && end[1]) fprintf(out, "%s\n", end + 1);
    } else {
        fprintf(out, "Usage: %s [--config FILE]... [--set KEY=VALUE]... [--KEY=VALUE]... [--help]\n",
                prog ? prog : "cohort");
        if (summary && *summary) fprintf(out, "%s\n", summary);
    }
    fprintf(out,
            "\nOptions:\n"
            "  --config FILE     Read settings from a libconfig file (may repeat; later\n"
            "                    files win). Keys are nested groups: train.lr is\n"
            "                    train = { lr = 0.1; };\n"
            "  --set KEY=VALUE   Override one key; --KEY=VALUE and --KEY VALUE do the same.\n"
            "  --help, -h        Print this help and exit.\n"
            "  --help-man        Print it as a man page (roff) and exit.\n\n");
}

void ch_config_alias_describe(const ch_config_key_t *k, int positional, char *usage,
                              size_t usage_len, char *meaning, size_t meaning_len)
{
    usage[0] = meaning[0] = 0;
    char meta[NAME_MAX_LEN];
    size_t m = 0;
    for (const char *p = last_component(k->name); *p && m + 1 < sizeof meta; p++)
        meta[m++] = (char)toupper((unsigned char)*p);
    meta[m] = 0;
    if (positional) {
        if (!k->positional) return;
        snprintf(usage, usage_len, "%s...", meta);
        snprintf(meaning, meaning_len, "non-option words, as --%s=A,B,...",
                 k->name);
        return;
    }
    if (!k->alias) return;
    if (k->type == CH_CFG_BOOL)
        snprintf(usage, usage_len, "%s%s", k->alias, k->implicit ? "" : " [true|false]");
    else
        snprintf(usage, usage_len, k->implicit ? "%s [%s]" : "%s %s", k->alias, meta);
    if (k->implicit)
        snprintf(meaning, meaning_len, "alias of --%s; alone: --%s=%s", k->name, k->name,
                 k->implicit);
    else
        snprintf(meaning, meaning_len, "alias of --%s", k->name);
}

/* The keys' aliases and the positional key of tables (in table order), as
 * a section of --help; nothing when there are none. */
static void print_aliases(const ch_config_table_t *tables, int n_tables, FILE *out)
{
    enum { WIDTH = 22 };
    int any = 0;
    for (int t = 0; t < n_tables; t++)
        for (int j = 0; j < 2 * tables[t].n_keys; j++) {
            char usage[NAME_MAX_LEN + 40], meaning[3 * NAME_MAX_LEN];
            ch_config_alias_describe(&tables[t].keys[j / 2], j % 2, usage, sizeof usage, meaning,
                                     sizeof meaning);
            if (!usage[0]) continue;
            if (!any++) fprintf(out, "Short options and arguments:\n");
            if (strlen(usage) <= WIDTH)
                fprintf(out, "  %-*s  %s\n", WIDTH, usage, meaning);
            else
                fprintf(out, "  %s\n  %-*s  %s\n", usage, WIDTH, "", meaning);
        }
    if (any) fputc('\n', out);
}

/* One entry per key, sorted by name. */
static void print_keys(const ch_config_key_t *keys, int n_keys, FILE *out)
{
    int *idx = sorted_order(keys, n_keys);
    for (int j = 0; j < n_keys; j++) {
        const ch_config_key_t *k = &keys[idx ? idx[j] : j];
        char desc[400];
        ch_config_key_describe(k, desc, sizeof desc);
        fprintf(out, "  --%s  (%s)\n", k->name, desc);
        if (k->help && *k->help) print_wrapped(out, k->help, 6, 79);
    }
    free(idx);
}

void ch_config_print_help(const ch_config_key_t *keys, int n_keys, const char *prog, FILE *out)
{
    print_usage(out, prog, NULL);
    const ch_config_table_t all = {NULL, keys, n_keys};
    print_aliases(&all, 1, out);
    fprintf(out, "Keys (command line > --config file > default):\n");
    print_keys(keys, n_keys, out);
}

void ch_config_print_help_tables(const ch_config_table_t *tables, int n_tables, const char *prog,
                                 const char *summary, FILE *out)
{
    print_usage(out, prog, summary);
    print_aliases(tables, n_tables, out);
    fprintf(out, "Keys (command line > --config file > default), by owner:\n");
    const char *last = NULL;
    for (int t = 0; t < n_tables; t++) {
        if (tables[t].n_keys <= 0) continue;
        const char *title = tables[t].title && *tables[t].title ? tables[t].title : "other";
        /* consecutive tables of one owner (SGD's keys, then the optimizer
         * interface's) under one heading */
        if (!last || strcmp(last, title) != 0) fprintf(out, "\n%s:\n", title);
        last = title;
        print_keys(tables[t].keys, tables[t].n_keys, out);
    }
}

/* ---------------------------------------------------------------- dump */

static void put_string(FILE *out, const char *s)
{
    fputc('"', out);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        switch (*p) {
        case '"': fputs("\\\"", out); break;
        case '\\': fputs("\\\\", out); break;
        case '\n': fputs("\\n", out); break;
        case '\r': fputs("\\r", out); break;
        case '\t': fputs("\\t", out); break;
        case '\f': fputs("\\f", out); break;
        default:
            if (*p < 0x20 || *p == 0x7f)
                fprintf(out, "\\x%02x", *p);
            else
                fputc(*p, out);
        }
    }
    fputc('"', out);
}

/* Shortest %.Ng (N = 15..17) that reads back as the same double, always with
 * a '.' or exponent so libconfig reads a float. */
static void put_double(FILE *out, double v)
{
    char buf[64];
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, v);
        if (strtod(buf, NULL) == v) break;
    }
    if (!strpbrk(buf, ".eE")) strcat(buf, ".0");
    fputs(buf, out);
}

static void put_value(FILE *out, const slot_t *s)
{
    switch (s->key->type) {
    case CH_CFG_INT: fprintf(out, "%lld", s->v.i); break;
    case CH_CFG_INT64: fprintf(out, "%lldL", s->v.i); break;
    case CH_CFG_FLOAT: put_double(out, s->v.f); break;
    case CH_CFG_BOOL: fputs(s->v.i ? "true" : "false", out); break;
    case CH_CFG_STRING: put_string(out, s->v.s); break;
    case CH_CFG_STRLIST:
        fputc('[', out);
        for (int i = 0; i < s->v.nlist; i++) {
            fputs(i ? ", " : " ", out);
            put_string(out, s->v.list[i]);
        }
        fputs(s->v.nlist ? " ]" : "]", out);
        break;
    }
}

static void put_comment(FILE *out, const char *text)
{
    fputs("  # ", out);
    for (const unsigned char *p = (const unsigned char *)text; *p; p++)
        fputc(*p < 0x20 || *p == 0x7f ? '?' : *p, out);
    fputc('\n', out);
}

static int quiet_at_default(const slot_t *s, const char *const *quiet, int n_quiet);

/* ch_config_dump, leaving out the keys of quiet[0..n_quiet) that hold their
 * default value (n_quiet 0: every key). */
static ch_status dump_keys(const ch_config_t *cfg, FILE *out, const char *const *quiet,
                          int n_quiet)
{
    CH_REQUIRE(cfg != NULL && out != NULL, "ch_config_dump: NULL config or stream");
    int *idx = sorted_order(cfg->keys, cfg->n);
    if (!idx) return CH_ERROR(CH_ERR_NOMEM, "config dump: out of memory");
    fputs("# cohort effective configuration (libconfig syntax)\n", out);
    const char *open[NAME_MAX_LEN]; /* components of the open groups */
    size_t open_len[NAME_MAX_LEN];
    int depth = 0;
    for (int j = 0; j < cfg->n; j++) {
        const slot_t *s = &cfg->slots[idx[j]];
        if (n_quiet > 0 && quiet_at_default(s, quiet, n_quiet)) continue;
        const char *comp[NAME_MAX_LEN];
        size_t clen[NAME_MAX_LEN];
        int nc = 0;
        for (const char *p = s->key->name;;) {
            size_t l = strcspn(p, ".");
            comp[nc] = p;
            clen[nc++] = l;
            if (!p[l]) break;
            p += l + 1;
        }
        int common = 0;
        while (common < depth && common < nc - 1 && open_len[common] == clen[common] &&
               !strncmp(open[common], comp[common], clen[common]))
            common++;
        while (depth > common) {
            depth--;
            fprintf(out, "%*s};\n", 2 * depth, "");
        }
        for (; depth < nc - 1; depth++) {
            fprintf(out, "%*s%.*s = {\n", 2 * depth, "", (int)clen[depth], comp[depth]);
            open[depth] = comp[depth];
            open_len[depth] = clen[depth];
        }
        fprintf(out, "%*s%.*s = ", 2 * depth, "", (int)clen[nc - 1], comp[nc - 1]);
        put_value(out, s);
        fputc(';', out);
        put_comment(out, s->source ? s->source : "default");
    }
    while (depth > 0) {
        depth--;
        fprintf(out, "%*s};\n", 2 * depth, "");
    }
    free(idx);
    if (ferror(out)) return CH_ERROR(CH_ERR_IO, "config dump: write failed");
    return CH_OK;
}

ch_status ch_config_dump(const ch_config_t *cfg, FILE *out) { return dump_keys(cfg, out, NULL, 0); }

ch_status ch_config_dump_string(const ch_config_t *cfg, char **out)
{
    return ch_config_dump_string_quiet(cfg, NULL, 0, out);
}

ch_status ch_config_dump_string_quiet(const ch_config_t *cfg, const char *const *quiet,
                                      int n_quiet, char **out)
{
    CH_REQUIRE(out != NULL, "ch_config_dump_string: out is NULL");
    CH_REQUIRE(n_quiet == 0 || quiet != NULL, "ch_config_dump_string_quiet: quiet is NULL");
    *out = NULL;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return CH_ERROR(CH_ERR_NOMEM, "config dump: open_memstream failed");
    ch_status s = dump_keys(cfg, f, quiet, n_quiet);
    if (fclose(f) != 0 && !s) s = CH_ERROR(CH_ERR_NOMEM, "config dump: out of memory");
    if (s) {
        free(buf);
        return s;
    }
    *out = buf;
    return CH_OK;
}

/* The dump text of a slot's value ("0.10000000000000001", "\"a\"", ...). */
static char *value_text(const slot_t *s)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return NULL;
    put_value(f, s);
    if (fclose(f) != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

/* 1 when s's key is named in quiet[0..n_quiet) and its value, as dump text,
 * is that of its default (a key without a default, or out of memory: 0, so
 * the key is written). */
/* The dump text of key's default (malloc'd), NULL without a default or on
 * failure. */
static char *default_text(const ch_config_key_t *key)
{
    if (!key->def) return NULL;
    slot_t d;
    memset(&d, 0, sizeof d);
    d.key = key;
    char *text = NULL;
    if (assign_text(&d, key->def, CH_ERR_INVALID, "default", "default") == CH_OK)
        text = value_text(&d);
    else
        ch_error_clear();
    value_free(&d.v);
    free(d.source);
    return text;
}

static int quiet_at_default(const slot_t *s, const char *const *quiet, int n_quiet)
{
    int named = 0;
    for (int i = 0; i < n_quiet && !named; i++) named = quiet[i] && !strcmp(quiet[i], s->key->name);
    if (!named) return 0;
    char *a = default_text(s->key), *b = a ? value_text(s) : NULL;
    int same = a && b && !strcmp(a, b);
    free(a);
    free(b);
    return same;
}

void ch_config_changes_free(ch_config_change_t *changes, int n)
{
    for (int i = 0; i < n; i++) {
        free(changes[i].saved);
        free(changes[i].now);
    }
    free(changes);
}

ch_status ch_config_compare_dump(const ch_config_t *cfg, const char *dump,
                                 ch_config_change_t **out, int *n_out)
{
    CH_REQUIRE(cfg != NULL && dump != NULL && out != NULL && n_out != NULL,
               "ch_config_compare_dump: NULL argument");
    *out = NULL;
    *n_out = 0;
    config_t lc;
    config_init(&lc);
    if (config_read_string(&lc, dump) != CONFIG_TRUE) {
        ch_status e = CH_ERROR(CH_ERR_FORMAT, "saved configuration: line %d: %s",
                               config_error_line(&lc), config_error_text(&lc));
        config_destroy(&lc);
        return e;
    }
    int *idx = sorted_order(cfg->keys, cfg->n);
    ch_config_change_t *ch = calloc(cfg->n > 0 ? (size_t)cfg->n : 1, sizeof *ch);
    ch_status st = idx && ch ? CH_OK : CH_ERROR(CH_ERR_NOMEM, "config compare: out of memory");
    int n = 0;
    for (int j = 0; st == CH_OK && j < cfg->n; j++) {
        const slot_t *now = &cfg->slots[idx[j]];
        const config_setting_t *set = config_lookup(&lc, now->key->name);
        char *now_text = value_text(now), *saved_text = NULL;
        if (!now_text) {
            st = CH_ERROR(CH_ERR_NOMEM, "config compare: out of memory");
            break;
        }
        if (set) {
            slot_t old;
            memset(&old, 0, sizeof old);
            old.key = now->key;
            if (assign_setting(&old, set, "saved configuration") == CH_OK) {
                saved_text = value_text(&old);
            } else {
                char got[128];
                describe_setting(got, sizeof got, set);
                saved_text = strdup(got);
            }
            value_free(&old.v);
            free(old.source);
            if (!saved_text) {
                free(now_text);
                st = CH_ERROR(CH_ERR_NOMEM, "config compare: out of memory");
                break;
            }
        }
        int changed;
        if (saved_text) {
            changed = strcmp(saved_text, now_text) != 0;
        } else {
            /* a key the dump lacks (a newer table's key): the same run while
             * its value is the default, wherever that value was set */
            changed = strcmp(now->source, "default") != 0;
            if (changed && now->key->def) {
                char *def_text = default_text(now->key);
                changed = !def_text || strcmp(def_text, now_text) != 0;
                free(def_text);
            }
        }
        if (changed) {
            ch[n].name = now->key->name;
            ch[n].saved = saved_text;
            ch[n].now = now_text;
            n++;
        } else {
            free(saved_text);
            free(now_text);
        }
    }
    free(idx);
    config_destroy(&lc);
    if (st != CH_OK) {
        ch_config_changes_free(ch, n);
        return st;
    }
    *out = ch;
    *n_out = n;
    return CH_OK;
}
