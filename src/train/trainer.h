/* The one trainer of every model family (model.h): batch source -> model shards forward/backward
 * -> gradient accumulation -> non-finite guard -> global-norm clip -> AdamW (or Muon) with warmup +
 * cosine -> checkpoint (checkpoint.h), with periodic validation, a progress line, metrics.jsonl, time-fitted
 * schedules, Ctrl-C saves and resume. */
#ifndef MOH_TRAINER_H
#define MOH_TRAINER_H
#include "backend/backend.h"
#include "models/model.h"
#include "train/checkpoint.h"

typedef struct train_options {
    const char *config_path;  /* model config JSON (fresh runs; a resume uses out_dir's) */
    const char *init_path;    /* fresh run from pretrained weights instead (model_open: a moh / HF
                               * folder or a .gguf): its config and tokenizer, a fresh optimizer
                               * and schedule from step 0; NULL = random init from config_path */
    const char *data_path;
    const char *out_dir;      /* checkpoint directory */
    /* Hyperparameters given on the command line; the rest come from the family's defaults (fresh
     * run) or the checkpoint (resume). Unset fields hold train_hparams_unset's markers. */
    train_hparams flags;
    bool seed_given;
    bool no_augment;          /* --no-augment set crop_pad and hflip (named so in messages) */
    long steps;               /* total optimizer steps (0 = --epochs, fitted to max_minutes, or the
                               * family's default epochs) */
    double max_minutes;       /* wall-clock budget of this session, final validation included */
    long stop_at_step;        /* save and stop after this step, as if interrupted (0 = off) */
    int max_bad_steps;        /* consecutive non-finite steps skipped before the run stops */
    double comm_timeout;      /* multi-process: end the job when no step finishes for this long (s) */
    bool resume, quiet;
    moh_device device;        /* --device (backend.h): auto (default), cpu or cuda */
    const char *dump_grads;   /* debug: the first step's batch, initial weights and gradient */
    long nan_step;            /* test hook: a NaN in one gradient element at steps nan_step .. */
    int nan_count;            /* .. nan_step + nan_count - 1 (0 = off) */
} train_options;

/* Marks every field of h as not given (NAN for reals, INT_MIN / LONG_MIN for integers). */
void train_hparams_unset(train_hparams *h);
/* Fills o with no flags given and the documented defaults of the other options. */
void train_options_defaults(train_options *o);
/* Runs training, in one process or (started by mpirun, built with MPI: train/dist.h) as one of R
 * ranks that each take their part of every micro-batch and sum the gradients. Returns 0, 130
 * after SIGINT (checkpoint saved), or a negative moh_status (err->msg empty on a rank that leaves
 * the report to another). */
int train_run(const train_options *o, moh_error *err);
#endif
