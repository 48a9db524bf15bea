/* A small cache of measurements that depend on the machine (e.g. `--precision auto`'s step times):
 * one text file per kind, a line per key: "<key>\t<v0>\t<v1>...\n" (finite decimals, at most
 * CALIB_MAX_VALUES). Lives in $XDG_CACHE_HOME/moh/<kind>.tsv, else $HOME/.cache/moh/<kind>.tsv;
 * MOH_CACHE_DIR names the folder instead ("" or "off": no cache). A cache is only ever a shortcut:
 * a missing, unreadable or malformed file reads as empty, a failed write is ignored. */
#ifndef MOH_CORE_CALIB_CACHE_H
#define MOH_CORE_CALIB_CACHE_H

#include <stdbool.h>
#include <stddef.h>

enum { CALIB_MAX_VALUES = 8, CALIB_MAX_KEY = 512 };

/* The CPU as a cache key: /proc/cpuinfo's "model name", "cpu family" and "model" of the first CPU
 * ("unknown" without it) into out[cap], e.g. "Intel(R) Xeon(R) Processor (6/207)". */
void calib_cpu_id(char *out, size_t cap);
/* /proc/cpuinfo's "model name" alone (or "unknown"). */
void calib_cpu_model(char *out, size_t cap);
/* The cache file of kind into path[cap]; false when there is none (no folder, or turned off). */
bool calib_cache_path(const char *kind, char *path, size_t cap);
/* The n values stored under key in the file text[0..len) (calib_cache_parse's format): true and
 * v[0..n) set when a well-formed line with exactly n values has that key (the last such line wins). */
bool calib_cache_parse(const char *text, size_t len, const char *key, double *v, int n);
/* calib_cache_parse over kind's file. */
bool calib_cache_get(const char *kind, const char *key, double *v, int n);
/* Stores v[0..n) under key (a key without tab or newline, < CALIB_MAX_KEY bytes), replacing an
 * older line of that key; the file is rewritten whole (temp file and rename). Returns true when
 * written. */
bool calib_cache_put(const char *kind, const char *key, const double *v, int n);

#endif
