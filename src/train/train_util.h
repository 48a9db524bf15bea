/* Pieces the trainer uses: Ctrl-C, clocks, and time formatting for progress lines. */
#ifndef MOH_TRAIN_UTIL_H
#define MOH_TRAIN_UTIL_H
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "core/progress.h"
#include "moh.h"

/* Ctrl-C (SIGINT) and SIGUSR1 during training, taken by a thread of their own: both signals are
 * blocked in every other thread (the caller's and OpenMP's), so no signal ever lands inside a
 * kernel (oneDNN's JIT code may keep data below the stack pointer, which a handler frame would
 * overwrite). The first signal asks for a save at the end of the step; a second one ends the
 * process at once (exit 130, one line on stderr; the last checkpoint intact). */
typedef struct train_signals {
    pthread_t thread;
    sigset_t set, old;     /* the signals taken; the caller's mask before */
    atomic_int count;      /* signals received */
    bool on;
} train_signals;
/* Starts the signal thread. MOH_OK, or MOH_E_NOMEM when no thread can be made. */
int train_signals_start(train_signals *s, moh_error *err);
/* Stops the thread and restores the signal masks. */
void train_signals_end(train_signals *s);
/* True once a stop was asked for. */
bool train_interrupted(train_signals *s);

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


/* What the rest of a run costs, in wall seconds, as measured (or estimated) so far. */
typedef struct train_cost_model {
    double step_s;               /* one optimizer step, validation and checkpoints excluded */
    double eval_s;               /* one periodic validation with its checkpoint */
    double save_s;               /* one checkpoint alone (a --save-every step that is no validation step) */
    double final_s;              /* the last step's validation (whole split) with its checkpoint */
    long eval_every, save_every; /* steps between validations / checkpoints; 0 = none */
} train_cost_model;

/* Seconds that n more steps after step `step` cost: n * step_s, the periodic validations and
 * checkpoints at the multiples of eval_every / save_every among steps step+1 .. step+n-1, and
 * final_s after step step+n (0 when n <= 0). */
double train_cost_of(const train_cost_model *m, long step, long n);
/* The largest n >= 0 with train_cost_of(m, step, n) <= left_s: how many more steps fit in left_s
 * seconds (0 when not even one does; step_s <= 0 counts as 1e-9 s). */
long train_fit_steps(const train_cost_model *m, long step, double left_s);
#endif
