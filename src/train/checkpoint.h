/* Checkpoint directories of every model family (one module; the family supplies the config JSON
 * and the tensor registry through model.h):
 *   tokenizer.json, tokenizer_config.json
 *                          models with a BPE tokenizer: Hugging Face's format (transformers'
 *                          AutoTokenizer and `tokenizers` load them); byte models have none
 *   config.json            the family's config ("model_type" names the family; HF LlamaConfig
 *                          fields for the LM, timm argument names for the ViT, plus MoH fields)
 *   model.safetensors      F32 weights under the official PyTorch names, registry order: loads
 *                          into transformers / timm unchanged (dense configs)
 *   optimizer.safetensors  for --resume, self-contained: param.<name>, AdamW moments m.<name>,
 *                          v.<name>, with an EMA (train_hparams.ema_decay > 0) ema.<name>, and the
 *                          training state in __metadata__ (TRAIN_KEYS in
 *                          checkpoint.c; format "moh-train-v2"; the 0.1 formats "moh-lm-train-v1"
 *                          and "moh-vit-train-v1" still load)
 *   checkpoint.json        the manifest (io/manifest.h): the save's step and every file's size
 *                          and CRC-32, written last as the save's commit point
 *   metrics.jsonl          appended by the trainer
 * A save stages every file (NAME.next.PID, fsync'ed), commits checkpoint.json, then renames the
 * staged files into place: a crash or kill at any point leaves the previous save or the new one
 * (a reader finishes a committed save), never a mix, and model_load and a resume refuse a file
 * that differs from the manifest (changed, or copied from another checkpoint). */
#ifndef MOH_CHECKPOINT_H
#define MOH_CHECKPOINT_H
#include "models/model.h"

/* Training state saved with the optimizer: where the run is, and every hyperparameter that shapes
 * it (restored on resume). */
typedef struct train_state {
    long step;            /* optimizer steps done */
    long total_steps;     /* schedule length (0 = not yet fixed: a time-fitted run before its fit) */
    long warmup;          /* warmup steps of the schedule */
    long skipped;         /* steps skipped by the non-finite guard */
    long steps_per_epoch; /* of the data the run started on (0 = no epochs) */
    uint64_t data_rng;    /* data position of random-window sources after `step` steps */
    double examples_seen; /* tokens or images */
    double elapsed_s;     /* wall time spent training before this session */
    uint64_t data_crc;    /* CRC-32 of the run's training and validation data (batch_source.data_crc) */
    char data_path[1024]; /* the data as the run first opened it (an absolute path; "" = not recorded) */
    train_hparams hp;     /* the run's hyperparameters */
} train_state;

/* Bits of train_state_keys() present in a loaded checkpoint (older formats lack some). */
typedef uint64_t train_keys_present;

/* One key of the training state: its __metadata__ name and its field in train_state. */
typedef struct train_key {
    const char *key;
    char type;            /* 'l' long, 'i' int, 'u' uint64 (decimal string), 'd' double */
    size_t offset;        /* offsetof(train_state, ...) */
    double lo, hi;        /* accepted range on load */
    const char *flag;     /* the `moh train` option setting it, or NULL */
    char on_resume;       /* a flag contradicting the saved value on resume: 'a' applied with a
                           * note, 'r' refused; 0 for keys without a flag */
} train_key;
/* The table of training-state keys (*n gets the count). */
const train_key *train_state_keys(int *n);
/* Index of key in that table, or -1. */
int train_state_key_index(const char *key);

/* Writes config.json and model.safetensors into dir (created if absent), and, when m1/m2 (AdamW
 * moments, m->n floats each) and st are given, optimizer.safetensors (with st's training state
 * and data path); m's tokenizer files (checkpoint_save_tokenizer), or for a model without a
 * tokenizer removes tokenizer.json and tokenizer_config.json left in dir; all committed together
 * by checkpoint.json (manifest_commit). MOH_OK or MOH_E_IO / MOH_E_NOMEM naming the file; on an
 * error the previous checkpoint in dir is untouched. */
int checkpoint_save(const char *dir, const model *m, const float *m1, const float *m2, const train_state *st,
                    moh_error *err);
/* Writes m's tokenizer (when it has one) into dir as Hugging Face's tokenizer.json (text/bpe.h:
 * bpe_to_tokenizer_json) and tokenizer_config.json (eos_token, chat_template), each atomically.
 * checkpoint_save calls it. MOH_E_IO / MOH_E_NOMEM naming the file. */
int checkpoint_save_tokenizer(const char *dir, const model *m, moh_error *err);
/* Same, with the EMA of the weights (ema [m->n], may be NULL): optimizer.safetensors also holds
 * ema.<name>, and model.safetensors holds the EMA weights instead of m's (what eval and sample
 * use, as DiT evaluates its EMA model). */
int checkpoint_save_ema(const char *dir, const model *m, const float *m1, const float *m2, const float *ema,
                        const train_state *st, moh_error *err);
/* Reads dir/optimizer.safetensors into params, m1, m2 (m->n floats each) and st; *present gets the
 * keys the file holds. MOH_E_IO / MOH_E_FORMAT / MOH_E_SHAPE naming the file and field. */
int checkpoint_load_optimizer(const char *dir, const model *m, float *params, float *m1, float *m2, train_state *st,
                              train_keys_present *present, moh_error *err);
/* Same, also reading ema.<name> into ema (may be NULL: then such tensors are refused) when the file
 * has them (*ema_found says so). */
int checkpoint_load_optimizer_ema(const char *dir, const model *m, float *params, float *m1, float *m2, float *ema,
                                  bool *ema_found, train_state *st, train_keys_present *present, moh_error *err);
/* A resume's check of the checkpoint's other weights file, dir/model.safetensors, against `expect`
 * [m->n] (what the save wrote there beside optimizer.safetensors: the EMA when it has one, else the
 * weights), optimizer.safetensors being at `step`. *state: SAME (it loads for m: every tensor, of
 * its shape, finite, nothing else; and holds exactly expect), MISSING (no such file), or NEWER
 * (it holds other weights and records a later step: a save that ended between writing it and
 * optimizer.safetensors). *model_step: the step it records (-1: none). Errors, naming the file
 * and how to go on without it: MOH_E_IO / MOH_E_FORMAT / MOH_E_SHAPE (damaged), MOH_E_FORMAT
 * naming the first tensor that differs (another save, not a later one), MOH_E_NOMEM. */
typedef enum { CKPT_MODEL_SAME, CKPT_MODEL_MISSING, CKPT_MODEL_NEWER } ckpt_model_state;
int checkpoint_check_model(const char *dir, const model *m, const float *expect, long step, ckpt_model_state *state,
                           long *model_step, moh_error *err);
/* Writes dir/model.safetensors alone: weights [m->n] under m's tensor names (HF / timm / DiT
 * names), __metadata__ {"format": "pt", "step": step} (no step when step < 0: not a training
 * save); atomic (temp file, fsync, rename). MOH_OK, MOH_E_NOMEM, or the writer's MOH_E_IO naming
 * the file. */
int checkpoint_save_model(const char *dir, const model *m, const float *weights, long step, moh_error *err);
#endif
