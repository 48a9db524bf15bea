#include "train/train_util.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

/* Set by the SIGINT handler: the one piece of global state, as a signal handler can reach no
 * other. */
static volatile sig_atomic_t interrupted;

static void on_sigint(int sig) {
    (void)sig;
    interrupted = 1;
}

void train_sigint_install(struct sigaction *old) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    interrupted = 0;
    sigaction(SIGINT, &sa, old);
}

void train_sigint_restore(const struct sigaction *old) { sigaction(SIGINT, old, NULL); }

bool train_interrupted(void) { return interrupted != 0; }

static double clock_s(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double train_now_s(void) { return clock_s(CLOCK_MONOTONIC); }
double train_cpu_s(void) { return clock_s(CLOCK_PROCESS_CPUTIME_ID); }

void train_fmt_time(char *buf, size_t cap, double s) {
    if (s < 0 || !isfinite(s)) s = 0;
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(buf, cap, "%ldh%02ldm", t / 3600, (t / 60) % 60);
    else snprintf(buf, cap, "%ldm%02lds", t / 60, t % 60);
}
