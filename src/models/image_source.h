/* The epoch-batched IDX image source of the image families (ViT, DiT): both splits loaded and
 * checked against the config, a permutation per epoch (the last partial batch dropped), micro-batch
 * g = step * accum + micro, rank r of R taking examples [r B / R, (r + 1) B / R), example keys
 * epoch * n_train + position (so a resume draws the same augmentation and noise), evaluation in
 * split order, and the data CRC of a resume. The family says what a batch is (its `make`: ViT
 * normalises and labels; DiT noises at a random timestep). */
#ifndef MOH_IMAGE_SOURCE_H
#define MOH_IMAGE_SOURCE_H
#include "data/idx.h"
#include "models/model.h"

/* Buffers of one batch (capacity max(B, eval batch) images of side x side, one channel). */
typedef struct image_batch {
    int *idx, *lab, *t;  /* [cap]: items of the split; labels; diffusion timesteps (noise only) */
    float *img, *eps;    /* [cap, 1, side, side]: images; diffusion noise (noise only) */
} image_batch;

typedef struct image_family {
    const char *family;        /* "ViT", "DiT" (messages) */
    int channels, side;        /* the config's channels (IDX: 1) and image side */
    const char *channels_key;  /* their config.json names: "in_chans", "img_size" */
    const char *side_key;
    int num_classes;
    int crop_pad_max;          /* largest --crop-pad (0: any other value refused with crop_refusal) */
    const char *crop_refusal;  /* why --crop-pad must be 0 (crop_pad_max 0) */
    int train_eval_cap;        /* validation images while training (0: the whole split) */
    bool noise;                /* the t and eps buffers */
    /* Fills b->img (and lab, t, eps) for items b->idx[0..cnt) of split sp and out; train: a
     * training batch, example j keyed key_base + j under seed with augmentation aug; else an
     * evaluation batch (aug NULL, key_base the first item's index). */
    void (*make)(void *ctx, const idx_split *sp, int cnt, bool train, uint64_t seed, uint64_t key_base,
                 const idx_augment *aug, image_batch *b, moh_batch *out);
    void *ctx;                 /* make's; owned by the source when ctx_free is set (freed on error too) */
    void (*ctx_free)(void *ctx);
} image_family;

/* Opens req->path (a directory of IDX files) for family f: train (req->train; may be NULL) and
 * evaluation sources as batch_source (model.h). Errors name --data and the expected value:
 * MOH_E_ARG (a file or a text folder, --crop-pad, a batch above the training images), MOH_E_CONFIG
 * (image size, channels or classes against the config), MOH_E_IO / MOH_E_FORMAT (idx.h),
 * MOH_E_NOMEM. */
int image_source_open(const image_family *f, const data_request *req, batch_source *train, batch_source *eval,
                      moh_error *err);
/* The training split of an open source (empty when opened for evaluation). */
const idx_split *image_source_train_split(const batch_source *src);
/* The config check of image_source_open for one split: 1 channel, side x side, labels below
 * num_classes (label names the data). */
int image_check_split(const image_family *f, const idx_split *s, const char *label, moh_error *err);

#endif
