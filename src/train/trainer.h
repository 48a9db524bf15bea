/* The language-model trainer behind `moh train` and the metric behind `moh eval`. */
#ifndef MOH_TRAINER_H
#define MOH_TRAINER_H
#include "models/lm.h"
#include "train/train_util.h"

typedef struct lm_train_options {
    const char *config_path; /* model config JSON (ignored with resume: the checkpoint's is used) */
    const char *data_path;   /* text file (last val_fraction held out) or dir with train/val.txt */
    const char *out_dir;     /* checkpoint directory, written during and after training */
    long steps;              /* total optimizer steps; 0 = fit the schedule into max_minutes */
    double max_minutes;      /* wall-clock budget for this run, final validation included (0 = none) */
    uint64_t seed;
    int batch_size;          /* sequences per micro-batch */
    int seq_len;             /* T; 0 = config max_position_embeddings */
    int grad_accum;          /* micro-batches per optimizer step */
    double lr, min_lr_ratio, weight_decay, beta1, beta2, grad_clip;
    long warmup;             /* -1 = auto: min(100, steps / 10) */
    long eval_every;         /* steps between validations (0 = only at the end) */
    long eval_tokens;        /* cap on predictions per periodic validation (0 = whole split) */
    long save_every;         /* steps between checkpoints (0 = at validations and the end) */
    long log_every;
    double val_fraction;     /* held-out tail of a single text file */
    long stop_at_step;       /* stop (checkpoint saved) after this step, as if interrupted; 0 = off */
    bool resume;
    bool reference_attention; /* every head computed then gated (the definition), not head-sparse */
    bool quiet;
    const char *dump_grads;  /* debug: write the first step's gradient + batch + initial weights */
} lm_train_options;

/* Fills o with the defaults documented in `moh train --help`. */
void lm_train_defaults(lm_train_options *o);
/* Runs training. Returns 0, 130 after SIGINT (checkpoint saved), or a negative moh_status. */
int lm_train(const lm_train_options *o, moh_error *err);

typedef struct lm_eval_result {
    double val_loss;       /* mean cross-entropy in nats over all predictions */
    double bits_per_byte;  /* val_loss / ln 2 */
    long tokens;           /* number of predictions */
    double *head_share;    /* [L, h]: share of tokens whose gate for head i is non-zero (malloc'd) */
    double lb_loss;        /* mean over batches of the layer-mean load-balance loss (not added) */
} lm_eval_result;

/* `moh eval` metric: bytes cut into consecutive chunks of T + 1 bytes (a last chunk shorter than
 * 2 bytes dropped), each chunk predicting its bytes 1..len-1 from those before; mean CE in nats.
 * max_tokens > 0 stops after about that many predictions (whole chunks). acts must hold B x T.
 * progress (may be NULL) hears of each batch, in predictions. MOH_E_FORMAT when n gives no
 * prediction, MOH_E_NOMEM. */
int lm_evaluate(const moh_lm_config *cfg, const lm_params_f32 *p, lm_acts_f32 *acts, int B, int T,
                const uint8_t *bytes, size_t n, long max_tokens, const train_progress *progress,
                lm_eval_result *r, moh_error *err);
#endif
