/* Pieces every trainer shares: the Ctrl-C flag, clocks, and time formatting for progress lines. */
#ifndef MOH_TRAIN_UTIL_H
#define MOH_TRAIN_UTIL_H
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>

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
#endif
