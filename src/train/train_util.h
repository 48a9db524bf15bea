/* Pieces every trainer shares: the Ctrl-C flag, clocks, and time formatting for progress lines. */
#ifndef MOH_TRAIN_UTIL_H
#define MOH_TRAIN_UTIL_H
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "moh.h"

/* Installs the SIGINT handler (saving the previous one in *old) and clears the flag. */
void train_sigint_install(struct sigaction *old);
/* Restores the handler saved by train_sigint_install. */
void train_sigint_restore(const struct sigaction *old);
/* True once SIGINT arrived since the last install. */
bool train_interrupted(void);

/* Monotonic wall clock and this process's CPU time (all threads), in seconds. */
double train_now_s(void);
double train_cpu_s(void);
/* "12m05s" or "1h02m"; negative or non-finite values print as 0. */
void train_fmt_time(char *buf, size_t cap, double seconds);

/* A fresh (not --resume) run must not write over a checkpoint: MOH_E_ARG naming out_dir when it
 * holds model.safetensors or optimizer.safetensors. */
int train_check_fresh_out(const char *out_dir, moh_error *err);
/* Opens OUT/metrics.jsonl for the run's progress lines: truncated for a fresh run; for a resume,
 * first rewritten (atomically) without the lines of steps after `step`, the checkpoint's step, which
 * a kill or failed save can leave behind, then opened for appending. MOH_E_IO naming the file. */
int train_metrics_open(const char *out_dir, bool resume, long step, FILE **out, moh_error *err);
#endif
