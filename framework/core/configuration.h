/* cohort: job configuration — libconfig files, command-line overrides of any
 * key, typed lookups, and --help generated from one table of keys.
 *
 * (This is framework/core/configuration.h, not framework/config.h: a header named
 * config.h next to the framework sources would shadow autoconf's config.h for every
 * `#include "config.h"` in framework/.)
 *
 * A job declares every key it understands once, in a static table:
 *
 *     static const ch_config_key_t keys[] = {
 *         {"train.lr",     CH_CFG_FLOAT, "0.01", 0, 10,
 *          "Base learning rate before scaling by world size."},
 *         {"train.epochs", CH_CFG_INT,   "90",   1, 100000, "Number of epochs."},
 *         {"data.root",    CH_CFG_STRING, NULL,  CH_CFG_NO_RANGE,
 *          "Dataset directory (required)."},
 *     };
 *     ch_config_t *cfg;
 *     CH_TRY(ch_config_load(keys, 3, argc, argv, &cfg));
 *     if (ch_config_help_requested(cfg)) { ch_config_destroy(cfg); return 0; }
 *     double lr; CH_TRY(ch_config_get_double(cfg, "train.lr", &lr));
 *
 * Names are dotted paths; each dot is a libconfig group, so "train.lr" is
 *     train = { lr = 0.02; };
 * in a file (a top-level `train.lr` is not libconfig syntax). Each component
 * must be a valid libconfig name ([A-Za-z][-A-Za-z0-9_]*).
 *
 * Command line (argv[0] is the program name and is skipped):
 *     --config FILE | --config=FILE   read a libconfig file (may repeat; later
 *                                     files override earlier ones)
 *     --set KEY=VALUE | --set=KEY=VALUE   override KEY
 *     --KEY=VALUE | --KEY VALUE       the same, for every key in the table;
 *                                     a bool key alone (--train.nesterov)
 *                                     means true; followed by a bool word
 *                                     it takes that word (where a key is
 *                                     positional: only "true" or "false",
 *                                     any other word is an argument)
 *     ALIAS [VALUE] | ALIAS=VALUE     a key's short option (ch_config_key_t.alias,
 *                                     e.g. --resume for output.resume), with the
 *                                     key's implicit value when given alone
 *     WORD...                         words that are not options: the value of the
 *                                     positional key (ch_config_key_t.positional),
 *                                     joined by ','; an error without one
 *     --help | -h                     print the key table, files are not read
 *     --help-man                      print the same as a man page (roff,
 *                                     framework/core/config_man.h)
 * Anything else is an error (with the closest option suggested).
 *
 * Precedence: command line > file(s) > table default. Every value, whatever
 * its source, is checked for type and range:
 *   int     C int, decimal ("-3", "+12")
 *   int64   long long, decimal (file: plain or L-suffixed integers)
 *   float   double; a file's integer literal is accepted ("lr = 1;"); on the
 *           command line anything strtod takes except nan
 *   bool    file: true/false; command line / default: true false yes no
 *           on off 1 0 (any case)
 *   string  file: a string; command line: the text as given
 *   strlist file: ["a", "b"] or ("a", "b"); command line / default:
 *           comma-separated "a,b" ("" = empty list)
 * Range [min, max] (inclusive) applies to int, int64 and float keys unless
 * min == max == 0 (CH_CFG_NO_RANGE); use -INFINITY / INFINITY for a one-sided
 * range. Ranges are compared as doubles (exact for |v| <= 2^53).
 *
 * Errors are one line and name the place: "FILE:LINE: ..." for a file value,
 * the option as typed for a command-line value, "default of KEY" for a bad
 * table. All are CH_ERR_CONFIG, except a missing/unreadable file (CH_ERR_IO)
 * and misuse of the API (CH_ERR_INVALID).
 */
#ifndef COHORT_CONFIGURATION_H
#define COHORT_CONFIGURATION_H

#include "framework/core/status.h"

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    CH_CFG_INT,     /* int */
    CH_CFG_INT64,   /* long long */
    CH_CFG_FLOAT,   /* double */
    CH_CFG_BOOL,    /* int, 0 or 1 */
    CH_CFG_STRING,  /* const char * */
    CH_CFG_STRLIST, /* list of const char * */
} ch_config_type;

/* Expands to the (min, max) pair meaning "no range check". */
#define CH_CFG_NO_RANGE 0, 0

/* One key of a job's table. The table (and its strings) must outlive every
 * ch_config_t loaded from it. */
typedef struct {
    const char *name;     /* dotted name, e.g. "train.lr" */
    ch_config_type type;
    const char *def;      /* default as command-line text, e.g. "0.01", "true",
                             "a,b"; NULL: required (no default), an unset
                             required key is an error at load */
    double min, max;      /* inclusive range for numeric keys; 0, 0 = none */
    const char *help;     /* one sentence, shown by --help */
    /* The fields below are optional (a positional initializer may stop at
     * help; they are then NULL / 0). */
    const char *alias;    /* NULL, or a short option standing for --NAME on the
                             command line, spelled as typed: "--resume" (then
                             --resume V and --resume=V) or a dash and one
                             letter, "-b" (then -b V and -bV). Not in files
                             nor after --set. */
    const char *implicit; /* with alias: the value of the alias given alone
                             (no =V): "auto" makes --resume mean --NAME=auto;
                             a non-bool alias then takes the next word as its
                             value only when it does not start with "--", a
                             bool alias never takes it. NULL: the alias works
                             exactly as --NAME. */
    int positional;       /* 1: the words of argv that are not options (do not
                             start with '-') are this key's value, joined by
                             ',' ("a.npy b.npy" -> "a.npy,b.npy"), applied
                             after every other option. At most one key;
                             string or strlist. */
} ch_config_key_t;

typedef struct ch_config ch_config_t;

/* A named key table: the keys of one owner (the job, or an object it uses:
 * compute, ddp, sgd, ...). title groups them in --help ("train",
 * "compute", "runtime", ...). The keys (and strings) must outlive every
 * ch_config_t loaded from them. */
typedef struct {
    const char *title;
    const ch_config_key_t *keys;
    int n_keys;
} ch_config_table_t;

/* Name of a type as used in messages and --help ("int", "float", ...). */
const char *ch_config_type_name(ch_config_type t);

/* Parse argv against the table keys[0..n_keys-1] and store the effective
 * configuration in *out (NULL on error).
 * With --help / -h anywhere in argv: prints the key table (ch_config_print_help)
 * on stdout — on MPI rank 0 only when MPI is initialised — reads no file,
 * returns CH_OK with ch_config_help_requested(*out) == 1; the caller should
 * destroy the config and exit 0.
 * Errors: CH_ERR_INVALID (bad table: duplicate or malformed name, a name that
 * is both a key and a group, a reserved name config/set/help, a default that
 * does not parse or is out of range; an alias that is malformed, reserved
 * (--config, --set, --help, --help-man, -h), another key's --NAME or given
 * twice; an implicit value without an alias or that does not parse; more
 * than one positional key, or one that is not a string or strlist), CH_ERR_IO (--config file missing or
 * unreadable: names the file and strerror), CH_ERR_CONFIG (malformed file:
 * libconfig's file:line: text; unknown key in a file: file:line, key and the
 * closest known key; unknown option or override key; wrong type;
 * out-of-range value; missing value after an option; required key unset). */
ch_status ch_config_load(const ch_config_key_t *keys, int n_keys, int argc,
                         char *const *argv, ch_config_t **out);

/* The same against the concatenation of tables[0..n_tables-1] (a job's
 * table, then those of the objects it uses): keys must be unique across
 * the tables (a duplicate is CH_ERR_INVALID naming it). --help prints
 * ch_config_print_help_tables (the keys grouped by table, in the given
 * order) with `summary` (may be NULL) under the usage line. The tables
 * array itself is only read during the call; the keys must outlive *out.
 * Errors: those of ch_config_load, CH_ERR_NOMEM. */
ch_status ch_config_load_tables(const ch_config_table_t *tables, int n_tables,
                                const char *summary, int argc, char *const *argv,
                                ch_config_t **out);

/* Free a config and every string it returned. NULL is a no-op. */
void ch_config_destroy(ch_config_t *cfg);

/* 1 when --help or --help-man was given (the help text or man page has been
 * printed), else 0. */
int ch_config_help_requested(const ch_config_t *cfg);

/* Print the generated help: usage line for prog, the options, the keys'
 * aliases and positional arguments ("Short options and arguments:", one
 * line each, only when there are any), then one entry per key (name, type,
 * default, range, sentence), sorted by name. */
void ch_config_print_help(const ch_config_key_t *keys, int n_keys, const char *prog,
                          FILE *out);

/* Help for a list of tables: usage line, summary (if not NULL), the
 * options, the aliases and positional arguments of every table (as
 * ch_config_print_help, in table order), then for each table with keys a "<title>:" heading and its
 * keys sorted by name. */
void ch_config_print_help_tables(const ch_config_table_t *tables, int n_tables,
                                 const char *prog, const char *summary, FILE *out);

/* Typed lookups: the effective value of key `name` (command line > file >
 * default). CH_ERR_INVALID when the key is not in the table or has another
 * type; widening is allowed (int64 getter on an int key, double getter on
 * int/int64 keys). Strings stay valid until ch_config_destroy. */
ch_status ch_config_get_int(const ch_config_t *cfg, const char *name, int *out);
ch_status ch_config_get_int64(const ch_config_t *cfg, const char *name, long long *out);
ch_status ch_config_get_double(const ch_config_t *cfg, const char *name, double *out);
ch_status ch_config_get_bool(const ch_config_t *cfg, const char *name, int *out);
ch_status ch_config_get_string(const ch_config_t *cfg, const char *name, const char **out);
/* *items is an array of *n strings (NULL when *n == 0). */
ch_status ch_config_get_strlist(const ch_config_t *cfg, const char *name,
                                const char *const **items, int *n);

/* A string key whose value must be one of choices[0..n_choices-1] (exact
 * match): *index gets its position. CH_ERR_CONFIG naming the source (file:line
 * or option), key, value and the accepted values otherwise. */
ch_status ch_config_get_choice(const ch_config_t *cfg, const char *name,
                               const char *const *choices, int n_choices, int *index);

/* Where the effective value of `name` came from, for messages: "FILE:LINE",
 * "command line (--set train.lr=0.2)" (the option as typed) or "default".
 * NULL when the key is not in the table. Valid until ch_config_destroy. */
const char *ch_config_source(const ch_config_t *cfg, const char *name);

/* Write the effective configuration in libconfig syntax (nested groups, every
 * key of the table, each followed by a comment naming its source). Floats are
 * written with 17 significant digits so reading the dump back gives the same
 * doubles. Errors: CH_ERR_IO when the stream fails. */
ch_status ch_config_dump(const ch_config_t *cfg, FILE *out);

/* The same into a malloc'd NUL-terminated string (*out; caller frees).
 * Errors: CH_ERR_NOMEM. */
ch_status ch_config_dump_string(const ch_config_t *cfg, char **out);

/* As ch_config_dump_string, but each key named in quiet[0..n_quiet) is left
 * out while its value is its default (compared as dump text, wherever it
 * was set). For keys added to a table after dumps of it were saved: the
 * dump of a run that does not use them stays byte for byte what it was,
 * and ch_config_compare_dump takes a key the dump lacks as its default.
 * Errors: CH_ERR_NOMEM; CH_ERR_INVALID for quiet NULL with n_quiet > 0. */
ch_status ch_config_dump_string_quiet(const ch_config_t *cfg, const char *const *quiet,
                                      int n_quiet, char **out);

/* One key whose value differs between a saved dump and a configuration. */
typedef struct {
    const char *name; /* the key's name (a string of cfg's table) */
    char *saved;      /* its value in the dump as dump text ("0.02", "\"a\"");
                         NULL when the dump lacks the key */
    char *now;        /* its effective value in cfg, as dump text */
} ch_config_change_t;

/* Compare cfg with `dump`, the text ch_config_dump wrote for an earlier
 * run (e.g. the "config" text of a resume file): *changes gets, in key
 * order, every key of cfg whose value differs (values compared as dump
 * text, so floats by their 17 digits), and every key the dump lacks whose
 * value in cfg is not its default (a key the dump lacks with its default
 * value, left unset or set to it in a file or option, is the same run: a
 * newer table's key). Keys of the dump that cfg does not know
 * are ignored. *n the count (0: the same configuration, *changes still to
 * be freed). Errors: CH_ERR_FORMAT "saved configuration: line L: <text>"
 * for a dump libconfig cannot parse, CH_ERR_NOMEM; then *changes is NULL. */
ch_status ch_config_compare_dump(const ch_config_t *cfg, const char *dump,
                                 ch_config_change_t **changes, int *n);

/* Free what ch_config_compare_dump returned (NULL is a no-op). */
void ch_config_changes_free(ch_config_change_t *changes, int n);

#ifdef __cplusplus
}
#endif
#endif /* COHORT_CONFIGURATION_H */
