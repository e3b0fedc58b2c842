/* cohort: configuration internals shared by configuration.c (--help) and
 * config_man.c (man pages), so both describe keys the same way. Not
 * installed. */
#ifndef COHORT_CONFIG_INTERNAL_H
#define COHORT_CONFIG_INTERNAL_H

#include "framework/core/configuration.h"

#include <stddef.h>

/* "TYPE, default VALUE[, range [MIN, MAX]]" (or "TYPE, required[...]") for
 * key k into buf (always NUL-terminated, truncated to len), as --help shows
 * it in parentheses; string defaults are quoted. */
void ch_config_key_describe(const ch_config_key_t *k, char *buf, size_t len);

/* Indices 0..n-1 of keys sorted by name component-wise (a group's keys stay
 * together), the order of --help; malloc'd (free it), NULL when out of
 * memory. */
int *ch_config_sorted_order(const ch_config_key_t *keys, int n);

/* The short form of key k, as --help and the man page show it: with
 * positional == 0 its alias, with positional == 1 its positional role
 * (both "" when k has none). `usage` gets how it is written ("--resume
 * [RESUME]", "-b MIN-BYTES", "--keepdims [true|false]", "FILES..."; the
 * metavariable is the key's last name component in capitals), `meaning`
 * what it stands for ("alias of --output.resume; alone:
 * --output.resume=auto", "non-option words, as
 * --input.files=A,B,..."); both NUL-terminated, truncated to their len. */
void ch_config_alias_describe(const ch_config_key_t *k, int positional, char *usage,
                              size_t usage_len, char *meaning, size_t meaning_len);

#endif
