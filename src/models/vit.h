/* ViT image classifier with MoH attention, laid out exactly as timm's VisionTransformer
 * (timm/models/vision_transformer.py: VisionTransformer, Block, Attention, Mlp, PatchEmbed) with
 * pre-norm blocks and MoH attention (spec §1, §2, §4 MoH-ViT, §8, §10):
 *
 *   img [B, in_chans, H, W] (NCHW, normalised)
 *   -> patch_embed.proj: Conv2d(in_chans, D, k=p, stride=p) == a linear over flattened patches
 *      (patch pixels in (channel, ky, kx) order, patches row-major) -> [B, Np, D]
 *   -> class token prepended when class_token (timm _pos_embed, no_embed_class=False), + pos_embed
 *      [1, Ntok, D], Ntok = Np + class_token
 *   -> L x [x += attn(norm1(x)); x += mlp.fc2(gelu_erf(mlp.fc1(norm2(x))))]
 *      (LayerNorm eps 1e-6; attention bidirectional, fused qkv with bias, proj with bias, learned
 *      router wg/wg_0/wg_1 or "none" = dense MHA)
 *   -> global_pool "token": norm(x)[:, 0]  (timm: forward_features applies `norm`, pool takes the
 *      class token, fc_norm is Identity)
 *      global_pool "avg":   fc_norm(mean over the Np patch tokens of x) (timm: `norm` is Identity
 *      when use_fc_norm, pooling excludes prefix tokens, fc_norm after the pool)
 *   -> head [num_classes, D] + bias -> logits [B, num_classes]
 *
 * Training loss = label-smoothed cross-entropy (PyTorch label_smoothing) + load_balance_coef *
 * mean over the routing layers of the load-balance loss (spec §2). Parameters live in one
 * contiguous buffer in timm state_dict order (vit_tensors). */
#ifndef MOH_VIT_H
#define MOH_VIT_H
#include "attn/attn.h"
#include "attn/layer.h"
#include "data/idx.h"
#include "models/model.h"
#include "moh.h"

#define VIT_MAX_CHANS 16

typedef enum vit_pool { VIT_POOL_TOKEN = 0, VIT_POOL_AVG = 1 } vit_pool;

/* config.json of a ViT (timm argument names plus the MoH fields). */
typedef struct moh_vit_config {
    int img_size;            /* H = W (pixels), default 28 */
    int patch_size;          /* p, divides img_size, default 4 */
    int in_chans;            /* default 1 */
    int num_classes;         /* default 10 */
    int embed_dim;           /* D */
    int depth;               /* L */
    int num_heads;           /* h, divides D (head_dim = D / h) */
    double mlp_ratio;        /* MLP hidden = int(D * mlp_ratio), as timm */
    bool class_token;        /* default true */
    vit_pool global_pool;    /* default "token" with a class token, else "avg" (timm rule) */
    int shared_heads;        /* h_s (router learned) */
    int top_k;               /* K routed heads per token (router learned) */
    moh_router router;       /* learned or none (dense MHA twin) */
    double load_balance_coef;/* beta, default 0.01 */
    double label_smoothing;  /* default 0.1 */
    int n_norm;              /* 0, or in_chans: per-channel input normalisation below is set */
    double mean[VIT_MAX_CHANS], std[VIT_MAX_CHANS]; /* of pixel/255, from the training set */
    /* derived by moh_vit_config_finalize */
    int grid;                /* img_size / patch_size */
    int num_patches;         /* Np = grid^2 */
    int num_tokens;          /* Ntok = Np + class_token */
    int patch_dim;           /* in_chans * p * p */
    int mlp_hidden;          /* int(D * mlp_ratio) */
    moh_attn_config attn;    /* bidirectional, fused qkv, qkv/proj bias, no RoPE */
} moh_vit_config;

/* Parses and validates config.json (keys: model_type "vit" (required), img_size, patch_size,
 * in_chans, num_classes, embed_dim, depth, num_heads, mlp_ratio, class_token, global_pool,
 * shared_heads, top_k, router, load_balance_coef, label_smoothing, mean, std; keys starting with
 * "_" or "comment" are annotations; any other key is an error). Fills the derived fields.
 * Errors (one line naming label, field, value and expectation): MOH_E_FORMAT (not JSON),
 * MOH_E_CONFIG (bad field), MOH_E_NOMEM. On error cfg is unchanged. */
int moh_vit_config_parse_json(moh_vit_config *cfg, const char *text, size_t len, const char *label,
                              moh_error *err);
/* Checks the fields of a config built in code and derives grid, num_patches, num_tokens,
 * patch_dim, mlp_hidden and attn. MOH_OK or MOH_E_CONFIG. */
int moh_vit_config_finalize(moh_vit_config *cfg, const char *label, moh_error *err);
/* config.json text (malloc'd; caller frees; NULL on OOM) that moh_vit_config_parse_json reads
 * back to the same config. */
char *moh_vit_config_to_json(const moh_vit_config *cfg);

#define real float
#define F(x) x##_f32
#include "vit_decl.h"
#undef real
#undef F

#define real double
#define F(x) x##_f64
#include "vit_decl.h"
#undef real
#undef F


/* One named checkpoint tensor (timm state_dict name and shape): the model interface's type. */
typedef model_tensor vit_tensor;

/* The model's tensors in buffer order (timm state_dict order); *n gets the count. Caller frees.
 * NULL on OOM. */
vit_tensor *vit_tensors(const moh_vit_config *cfg, int *n);
/* timm initialisation (VisionTransformer.init_weights, mode ''): every Linear weight (routers
 * included, spec §8) and pos_embed ~ N(0, 0.02^2) truncated to [-2, 2]; Linear biases 0;
 * cls_token ~ N(0, 1e-6^2); patch_embed Conv2d keeps PyTorch's default, weight and bias
 * U(-1/sqrt(fan_in), 1/sqrt(fan_in)) with fan_in = in_chans * p * p; LayerNorm weight 1, bias 0.
 * Deterministic in seed. */
void vit_params_init_random(const moh_vit_config *cfg, vit_params_f32 *p, uint64_t seed);
/* Checks that the split's images fit the config: 1 channel (IDX files are grey-scale),
 * rows = cols = img_size, labels < num_classes. label names the data. MOH_OK or MOH_E_CONFIG. */
int vit_check_split(const moh_vit_config *cfg, const idx_split *s, const char *label, moh_error *err);
/* Normalised float images [count, 1, H, W] of split items idx[0..count) (no augmentation when aug
 * is NULL); key_base + j is the augmentation key of item j. Parallel over images (OpenMP). */
void vit_make_batch(const moh_vit_config *cfg, const idx_split *s, const int *idx, int count,
                    const idx_augment *aug, uint64_t seed, uint64_t key_base, float *out);
#endif
