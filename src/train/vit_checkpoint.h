/* ViT checkpoint directories, the layout of the LM's (checkpoint.h):
 *   config.json           the ViT config (vit.h keys; includes the input mean/std used in training)
 *   model.safetensors     F32 weights under timm VisionTransformer state_dict names (vit_tensors
 *                         order): loads into timm with load_state_dict unchanged (dense configs)
 *   optimizer.safetensors for --resume, self-contained: param.<name>, AdamW moments m.<name>,
 *                         v.<name>, and the training state in __metadata__ (format
 *                         "moh-vit-train-v1")
 *   metrics.jsonl         appended by the trainer
 * Every file is written atomically (temp, fsync, rename), so a crash mid-save leaves the previous
 * file intact and resume reads one self-consistent file. */
#ifndef MOH_VIT_CHECKPOINT_H
#define MOH_VIT_CHECKPOINT_H
#include "models/vit.h"

/* Training state saved with the optimizer so --resume continues the same run. */
typedef struct vit_train_state {
    long step;            /* optimizer steps done */
    long total_steps;     /* schedule length */
    long warmup;          /* warmup steps */
    long steps_per_epoch; /* batches per pass over the training split (last partial one dropped) */
    int batch_size;
    int shards;           /* data-parallel shards of each batch (vit_shards) */
    uint64_t seed;        /* data order and augmentation seed */
    double images_seen;
    double elapsed_s;     /* wall time spent training before this session */
    /* optimisation hyper-parameters of the run (a resumed run keeps them) */
    double lr, min_lr_ratio, weight_decay, beta1, beta2, grad_clip;
    int crop_pad;         /* augmentation: random-crop padding */
    int hflip;            /* augmentation: horizontal flip (0/1) */
} vit_train_state;

/* Reads and parses a ViT config.json file. MOH_E_IO / MOH_E_FORMAT / MOH_E_CONFIG naming path. */
int vit_config_load(const char *path, moh_vit_config *cfg, moh_error *err);
/* Writes config.json and model.safetensors into dir (created if absent), and, when m and v are
 * given (p->n floats each), optimizer.safetensors with st. MOH_OK or MOH_E_IO / MOH_E_NOMEM. */
int vit_checkpoint_save(const char *dir, const moh_vit_config *cfg, const vit_params_f32 *p,
                        const float *m, const float *v, const vit_train_state *st, moh_error *err);
/* Reads dir/config.json into cfg and dir/model.safetensors into freshly allocated params p (caller
 * frees with vit_params_free_f32). A missing or misshapen tensor, or one the config does not
 * have (e.g. router weights in a dense config), is MOH_E_SHAPE naming the file and tensor. */
int vit_checkpoint_load(const char *dir, moh_vit_config *cfg, vit_params_f32 *p, moh_error *err);
/* Reads the weights of a model.safetensors file at path into p (allocated by the caller for cfg)
 * with the same checks. */
int vit_weights_load(const char *path, const moh_vit_config *cfg, vit_params_f32 *p, moh_error *err);
/* Reads dir/optimizer.safetensors into params, m and v (n floats each, vit_params layout) and st.
 * MOH_E_IO / MOH_E_FORMAT / MOH_E_SHAPE naming the file and field. */
int vit_checkpoint_load_optimizer(const char *dir, const moh_vit_config *cfg, float *params,
                                  float *m, float *v, size_t n, vit_train_state *st, moh_error *err);
#endif
