/* LM checkpoint directories: config.json (HF LlamaConfig + MoH fields), model.safetensors (F32
 * weights under HF LlamaForCausalLM names, lm_tensors order; loads into transformers unchanged),
 * optimizer.safetensors (for --resume, self-contained: param.<name>, AdamW moments m.<name>,
 * v.<name>, and the training state in __metadata__), and metrics.jsonl (appended by the
 * trainer). Every file is written atomically (temp, fsync, rename): a crash mid-save leaves the
 * previous file intact, and resume reads one file, so it never mixes two saves. */
#ifndef MOH_CHECKPOINT_H
#define MOH_CHECKPOINT_H
#include "models/lm.h"

/* Training state saved with the optimizer so --resume continues bit-for-bit. */
typedef struct lm_train_state {
    long step;            /* optimizer steps done */
    uint64_t rng_state;   /* data sampler RNG after `step` steps */
    double tokens_seen;
    double elapsed_s;     /* wall time spent training before this session */
    long total_steps;     /* schedule length chosen by the run (0 = not yet fixed) */
    long warmup;          /* warmup steps of the schedule */
} lm_train_state;

/* Writes config.json and model.safetensors into dir (created if absent), and, when m and v are
 * given (each p->n floats), optimizer.safetensors with st. MOH_OK or MOH_E_IO naming the file. */
int lm_checkpoint_save(const char *dir, const moh_lm_config *cfg, const lm_params_f32 *p,
                       const float *m, const float *v, const lm_train_state *st, moh_error *err);
/* Reads dir/config.json into cfg and dir/model.safetensors into freshly allocated params p
 * (caller frees with lm_params_free_f32). Errors name the file and tensor. */
/* The byte-level data of moh (text files, prompts) has tokens 0..255: MOH_E_CONFIG naming label
 * and 'vocab_size' unless cfg->vocab_size >= 256. */
int lm_check_byte_vocab(const moh_lm_config *cfg, const char *label, moh_error *err);
int lm_checkpoint_load(const char *dir, moh_lm_config *cfg, lm_params_f32 *p, moh_error *err);
/* Reads dir/optimizer.safetensors into params, m and v (n floats each, lm_params layout) and
 * state. MOH_E_IO / MOH_E_FORMAT / MOH_E_SHAPE naming the file and field. */
int lm_checkpoint_load_optimizer(const char *dir, const moh_lm_config *cfg, float *params,
                                 float *m, float *v, size_t n, lm_train_state *state,
                                 moh_error *err);
#endif
