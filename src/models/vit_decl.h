/* Template of the ViT prototypes: included twice by vit.h (_f32 engine, _f64 gradient checks).
 * No include guard on purpose. Layout and notation: vit.h. Shorthands: D = embed_dim,
 * L = depth, Np = num_patches, Ntok = num_tokens, P = patch_dim, Hm = mlp_hidden,
 * K = num_classes, BT = B * Ntok tokens. */

/* Views of one block's parameters inside the model's parameter buffer (timm Block names). */
typedef struct F(vit_block) {
    real *ln1_w, *ln1_b;   /* blocks.i.norm1.weight/bias [D] */
    F(attn_params) attn;   /* blocks.i.attn.{qkv,proj}.{weight,bias}, wg, wg_0, wg_1 (attn.h) */
    real *ln2_w, *ln2_b;   /* blocks.i.norm2.weight/bias [D] */
    real *fc1_w, *fc1_b;   /* blocks.i.mlp.fc1.weight [Hm, D], bias [Hm] */
    real *fc2_w, *fc2_b;   /* blocks.i.mlp.fc2.weight [D, Hm], bias [D] */
} F(vit_block);

/* All parameters as views into one contiguous buffer (data, n values), in vit_tensors order. */
typedef struct F(vit_params) {
    real *data;
    size_t n;
    real *cls_token;       /* cls_token [1, 1, D]; NULL without a class token */
    real *pos_embed;       /* pos_embed [1, Ntok, D] */
    real *pe_w;            /* patch_embed.proj.weight [D, in_chans, p, p] == [D, P] */
    real *pe_b;            /* patch_embed.proj.bias [D] */
    F(vit_block) *blocks;  /* [L] */
    real *norm_w, *norm_b; /* norm.weight/bias [D] (pool "token") or fc_norm.* (pool "avg") */
    real *head_w;          /* head.weight [K, D] */
    real *head_b;          /* head.bias [K] */
} F(vit_params);

/* Activations of one forward pass for up to Bmax images, kept for backward. */
typedef struct F(vit_acts) {
    F(attn_stack) attn;    /* first, for models/model.c: the attention layers (either path) and the
                            * backend and precision of every op, and the block behind the arrays
                            * below (attn/layer.h) */
    int B, Bmax;           /* images in the last forward; capacity */
    real *patches;         /* [B * Np, P] flattened patches (input of patch_embed) */
    real *resid;           /* [L + 1, BT, D]: input of each block, then the final residual */
    real *mid;             /* [L, BT, D]: residual after the attention branch */
    real *ln1, *ln1_mean, *ln1_rstd; /* [L, BT, D], [L, BT], [L, BT] */
    real *attn_out;        /* [L, BT, D] */
    real *ln2, *ln2_mean, *ln2_rstd; /* [L, BT, D], [L, BT], [L, BT] */
    real *fc1;             /* [L, BT, Hm] fc1 output (GELU input) */
    real *act;             /* [L, BT, Hm] GELU output (fc2 input) */
    real *pooled;          /* [B, D] class token (token) or patch-token mean (avg) */
    real *fnorm, *fnorm_mean, *fnorm_rstd; /* [B, D], [B], [B]: norm / fc_norm of pooled */
    real *logits;          /* [B, K] */
    real *probs;           /* [B, K] softmax of logits (filled when labels are given) */
    real *dres, *dtmp;     /* [BT, D] each: backward scratch (dtmp also holds forward temps) */
    real *dff;             /* [2, BT, Hm] backward scratch: d act, d fc1 */
    real *dlogits, *dfnorm, *dpooled; /* [B, K], [B, D], [B, D] */
    real ce_loss;          /* mean label-smoothed cross-entropy (nats) of the last forward */
    real lb_loss;          /* mean over routing layers of the load-balance loss (spec §2) */
} F(vit_acts);

/* Allocates zeroed params for cfg (a finalized config) and binds the views.
 * MOH_OK or MOH_E_NOMEM. */
int F(vit_params_init)(F(vit_params) *p, const moh_vit_config *cfg, moh_error *err);
void F(vit_params_free)(F(vit_params) *p);
/* Allocates activations for batches of up to Bmax images, attention on the reference path
 * (every head, then gates; attention_impl.h). MOH_OK, MOH_E_ARG (Bmax < 1) or MOH_E_NOMEM (the
 * message gives the size). */
int F(vit_acts_init)(F(vit_acts) *a, const moh_vit_config *cfg, int Bmax, moh_error *err);
/* Same, choosing the attention path: sparse = the head-sparse path (src/attn/sparse.h: only the
 * routed (token, head) pairs, flash-style tiles, same results to ~1e-5; float32 only, MOH_E_ARG
 * in float64). */
int F(vit_acts_init_attn)(F(vit_acts) *a, const moh_vit_config *cfg, int Bmax, bool sparse,
                          moh_error *err);
void F(vit_acts_free)(F(vit_acts) *a);

/* Forward: images [B, in_chans, img_size, img_size] (NCHW, already normalised) -> a->logits
 * [B, K]; B <= a->Bmax. Always fills a->lb_loss (monitoring). With labels [B] (0..K-1; -1 =
 * ignore) also a->probs and a->ce_loss (label smoothing cfg->label_smoothing), and returns the
 * training loss ce + load_balance_coef * lb (spec §2); returns 0 without labels. */
real F(vit_forward)(const moh_vit_config *cfg, const F(vit_params) *p, F(vit_acts) *a,
                    const real *images, const int *labels, int B);
/* Backward of ce_loss + load_balance_coef * lb_loss after a forward with labels: ACCUMULATES
 * into grads (same layout as p). */
void F(vit_backward)(const moh_vit_config *cfg, const F(vit_params) *p, const F(vit_params) *grads,
                     F(vit_acts) *a, const int *labels);
