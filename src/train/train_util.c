#include "train/train_util.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>
#include <time.h>

#include "core/fsutil.h"

/* SIGUSR2 sent by train_signals_end to the thread itself: the way out of sigwait. */
static void *signal_thread(void *arg) {
    train_signals *s = arg;
    for (;;) {
        int sig = 0;
        if (sigwait(&s->set, &sig)) continue;
        if (sig == SIGUSR2) return NULL;
        if (atomic_fetch_add(&s->count, 1) >= 1) {
            static const char msg[] = "moh train: interrupted twice: stopping now (checkpoints already saved are intact)\n";
            if (write(2, msg, sizeof msg - 1) < 0) { /* nothing more to do */
            }
            _exit(130);
        }
    }
}

/* pthread_sigmask in every thread of the OpenMP pool, then in the caller. */
static void mask_all(int how, const sigset_t *set) {
#pragma omp parallel
    pthread_sigmask(how, set, NULL);
    pthread_sigmask(how, set, NULL);
}

int train_signals_start(train_signals *s, moh_error *err) {
    memset(s, 0, sizeof *s);
    atomic_init(&s->count, 0);
    sigemptyset(&s->set);
    sigaddset(&s->set, SIGINT);
    sigaddset(&s->set, SIGUSR1); /* mpirun forwards SIGUSR1 to every rank (its own Ctrl-C kills the job) */
    sigaddset(&s->set, SIGUSR2);
    pthread_sigmask(SIG_SETMASK, NULL, &s->old);
    mask_all(SIG_BLOCK, &s->set);
    if (pthread_create(&s->thread, NULL, signal_thread, s)) {
        mask_all(SIG_SETMASK, &s->old);
        return moh_fail(err, MOH_E_NOMEM, "cannot start the signal thread");
    }
    s->on = true;
    return MOH_OK;
}

void train_signals_end(train_signals *s) {
    if (!s->on) return;
    pthread_kill(s->thread, SIGUSR2);
    pthread_join(s->thread, NULL);
    s->on = false;
    /* a Ctrl-C that arrives from now on acts as usual (ends the process) */
    mask_all(SIG_SETMASK, &s->old);
}

bool train_interrupted(train_signals *s) { return atomic_load(&s->count) > 0; }

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

int train_check_fresh_out(const char *out_dir, moh_error *err) {
    static const char *const files[] = {"model.safetensors", "optimizer.safetensors"};
    char path[4200];
    struct stat sb;
    for (int i = 1; i >= 0; i--) {
        snprintf(path, sizeof path, "%s/%s", out_dir, files[i]);
        if (stat(path, &sb) == 0 && i == 1)
            return moh_fail(err, MOH_E_ARG, "%s already holds a checkpoint (%s): continue it with --resume, "
                            "or give a new --out (or remove it)", out_dir, files[i]);
        if (stat(path, &sb) == 0) /* weights without optimizer state: nothing --resume can continue */
            return moh_fail(err, MOH_E_ARG, "%s already holds a model (%s, no optimizer.safetensors to resume "
                            "from): give a new --out (or remove it)", out_dir, files[i]);
    }
    return MOH_OK;
}

/* The step of a metrics line ({"step": N, ...}), or -1. */
static long line_step(const char *line, const char *end) {
    static const char key[] = "\"step\":";
    const char *k = strstr(line, key);
    if (!k || k >= end) return -1;
    char *e = NULL;
    const long v = strtol(k + sizeof key - 1, &e, 10);
    return e == k + sizeof key - 1 ? -1 : v;
}

int train_metrics_open(const char *out_dir, bool resume, long step, FILE **out, moh_error *err) {
    char path[4200];
    snprintf(path, sizeof path, "%s/metrics.jsonl", out_dir);
    *out = NULL;
    fs_remove_stale_tmp(out_dir); /* left by a kill -9 during a save */
    if (resume) {
        struct stat sb;
        if (stat(path, &sb) == 0) {
            size_t len = 0;
            char *text = fs_read_file(path, (size_t)1 << 31, &len, err);
            if (!text) return err->code;
            size_t keep = 0; /* lines up to the checkpoint's step, in order */
            for (size_t i = 0; i < len;) {
                const char *nl = memchr(text + i, '\n', len - i);
                const size_t e = nl ? (size_t)(nl - text) + 1 : len;
                const long s = line_step(text + i, text + e);
                if (s < 0 || s > step) break;
                keep = e;
                i = e;
            }
            const int rc = keep < len ? fs_write_atomic(path, text, keep, err) : MOH_OK;
            free(text);
            if (rc) return rc;
        }
    }
    *out = fopen(path, resume ? "a" : "w");
    if (!*out) return moh_fail(err, MOH_E_IO, "%s: cannot open: %s", path, strerror(errno));
    return MOH_OK;
}

/* How many multiples of every (> 0) lie in step+1 .. step+n-1. */
static long multiples(long every, long step, long n) {
    if (every <= 0 || n <= 1) return 0;
    return (step + n - 1) / every - step / every;
}

double train_cost_of(const train_cost_model *m, long step, long n) {
    if (n <= 0) return 0.0;
    const long ev = multiples(m->eval_every, step, n);
    long sv = multiples(m->save_every, step, n);
    if (m->eval_every > 0 && m->save_every > 0) { /* a step that validates also saves: count it once */
        long g = m->eval_every, b = m->save_every;
        while (b) {
            const long r = g % b;
            g = b;
            b = r;
        }
        const double lcm = (double)m->eval_every / (double)g * (double)m->save_every;
        if (lcm < 9e18) sv -= multiples((long)lcm, step, n);
    }
    const double step_s = m->step_s > 1e-9 ? m->step_s : 1e-9;
    return (double)n * step_s + (double)ev * m->eval_s + (double)sv * m->save_s + m->final_s;
}

long train_fit_steps(const train_cost_model *m, long step, double left_s) {
    if (!(left_s > 0.0) || train_cost_of(m, step, 1) > left_s) return 0;
    const double step_s = m->step_s > 1e-9 ? m->step_s : 1e-9;
    const double cap = left_s / step_s + 1.0; /* every step costs at least step_s */
    long lo = 1, hi = cap < 1e15 ? (long)cap + 1 : (long)1e15; /* cost(lo) fits; cost(hi) does not */
    while (hi - lo > 1) {
        const long mid = lo + (hi - lo) / 2;
        if (train_cost_of(m, step, mid) <= left_s) lo = mid;
        else hi = mid;
    }
    return lo;
}

