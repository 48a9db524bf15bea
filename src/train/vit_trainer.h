/* The ViT image-classifier trainer behind `moh train --config vit-*` and the metric behind
 * `moh eval` on a ViT checkpoint. Data: an MNIST-style IDX directory (data/idx.h). */
#ifndef MOH_VIT_TRAINER_H
#define MOH_VIT_TRAINER_H
#include "data/idx.h"
#include "models/vit.h"
#include "train/train_util.h"

typedef struct vit_train_options {
    const char *config_path; /* ViT config JSON (ignored with resume: the checkpoint's is used) */
    const char *data_dir;    /* train-images-idx3-ubyte[.gz], train-labels-..., t10k-... */
    const char *out_dir;     /* checkpoint directory, written during and after training */
    double epochs;           /* passes over the training split (default 25) */
    long steps;              /* total optimizer steps; > 0 overrides epochs */
    double max_minutes;      /* stop (with a checkpoint) after this much training time; 0 = none */
    long stop_at_step;       /* stop (checkpoint saved) after this step, as if interrupted; 0 = off */
    uint64_t seed;           /* init, data order and augmentation */
    int batch_size;          /* images per step (default 128) */
    int shards;              /* data-parallel shards per batch (vit_shards); 0 = threads */
    bool sparse_attn;        /* attention on the head-sparse path (sparse.h), not the reference */
    double lr, min_lr_ratio, weight_decay, beta1, beta2, grad_clip;
    long warmup;             /* linear warmup steps; -1 = auto (one epoch, at most 10% of steps) */
    long eval_every;         /* steps between test-set evaluations; 0 = every epoch */
    long eval_limit;         /* images per periodic evaluation (0 = the whole test split) */
    long log_every;          /* progress line every N steps */
    long train_limit;        /* use only the first N training images (0 = all; smoke tests) */
    int crop_pad;            /* random-crop padding (default 1; 0 = no crop) */
    bool hflip;              /* random horizontal flip (default on) */
    bool resume;
    bool quiet;
    const char *dump_grads;  /* debug: write the first step's batch, initial weights, gradient */
} vit_train_options;

/* Fills o with the defaults documented in `moh train --help` (ViT section). */
void vit_train_defaults(vit_train_options *o);
/* Runs training. Returns 0, 130 after SIGINT (checkpoint saved), or a negative moh_status. */
int vit_train(const vit_train_options *o, moh_error *err);

/* A batch split into n shards that run forward and backward in parallel, one OpenMP thread per
 * shard (single-threaded ops inside: one fork/join per step instead of one per op). Shard s holds
 * images [s*B/n, (s+1)*B/n). Like n data-parallel GPUs (DDP), each shard computes its own
 * load-balance statistics over its tokens (spec §2: per GPU, not all-reduced); the step's loss
 * and gradient are the shard-size-weighted means, so the cross-entropy part equals the whole-batch
 * mean exactly. Results depend on n, not on the thread count. */
typedef struct vit_shards {
    int n;                  /* number of shards */
    int Bmax;               /* capacity of each shard (images) */
    vit_acts_f32 *acts;     /* [n] */
    vit_params_f32 *grads;  /* [n] per-shard gradients (NULL: evaluation only) */
    bool sparse;            /* attention on the head-sparse path (vit_acts_init_attn) */
    int count[256];         /* images in each shard of the last batch */
} vit_shards;

/* Allocates n shards (1..256) for batches of up to batch images; with_grads for training; sparse
 * selects the head-sparse attention path. MOH_OK, MOH_E_ARG or MOH_E_NOMEM. */
int vit_shards_init(vit_shards *w, const moh_vit_config *cfg, int batch, int n, bool with_grads,
                    bool sparse, moh_error *err);
void vit_shards_free(vit_shards *w);
/* Forward on images [B, 1, H, W] with labels [B] (B <= n * Bmax; labels may be NULL: no loss).
 * With g (allocated for cfg), also backward, and g = sum_s (B_s / B) grad_s (overwritten).
 * Returns the weighted training loss; *ce and *lb (may be NULL) get the weighted cross-entropy
 * and load-balance loss. Logits of image j: shard_logits(w, j). */
double vit_shards_step(const moh_vit_config *cfg, const vit_params_f32 *p, vit_shards *w,
                       const float *images, const int *labels, int B, vit_params_f32 *g, double *ce,
                       double *lb);
/* Pointer to the K logits of image j of the last vit_shards_step batch. */
const float *vit_shards_logits(const moh_vit_config *cfg, const vit_shards *w, int j);
/* Default shard count: omp_get_max_threads(), at most batch. */
int vit_default_shards(int batch);

typedef struct vit_eval_result {
    long n;              /* images evaluated */
    long correct;        /* top-1 hits */
    double accuracy;     /* correct / n, in [0, 1] */
    double loss;         /* mean plain cross-entropy, no label smoothing (nats) */
    double lb_loss;      /* mean over batches of the load-balance loss (monitoring, not added) */
    long *confusion;     /* [K, K]: row = true class, column = predicted (malloc'd) */
    double *head_share;  /* [L, h]: share of tokens whose gate for head i is non-zero (malloc'd) */
} vit_eval_result;

/* Evaluates images 0..limit-1 (0 = all) of s, normalised with cfg's mean/std (no augmentation),
 * in batches of w->n * w->Bmax; r->loss is the plain cross-entropy (cfg's label smoothing is for
 * training only). progress (may be NULL) hears of each batch, in images. The split's image size
 * must match cfg (MOH_E_CONFIG otherwise).
 * Free r with vit_eval_result_free. */
int vit_evaluate(const moh_vit_config *cfg, const vit_params_f32 *p, vit_shards *w,
                 const idx_split *s, long limit, const train_progress *progress, vit_eval_result *r,
                 moh_error *err);
void vit_eval_result_free(vit_eval_result *r);
/* Checks that the split's images fit the config: 1 channel (IDX files are grey-scale),
 * rows = cols = img_size, labels < num_classes. label names the data. MOH_OK or MOH_E_CONFIG. */
int vit_check_split(const moh_vit_config *cfg, const idx_split *s, const char *label, moh_error *err);
/* Normalised float images [count, 1, H, W] of split items idx[0..count) (no augmentation when aug
 * is NULL); key_base + j is the augmentation key of item j. Parallel over images (OpenMP). */
void vit_make_batch(const moh_vit_config *cfg, const idx_split *s, const int *idx, int count,
                    const idx_augment *aug, uint64_t seed, uint64_t key_base, float *out);
#endif
