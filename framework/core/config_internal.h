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

#endif
