/* Template of the DiT prototypes: included twice by dit.h (_f32 engine, _f64 gradient checks).
 * No include guard on purpose. Layout and notation: dit.h. Shorthands: D = hidden_size,
 * L = depth, N = num_patches, P = patch_dim, Hm = mlp_hidden, BN = B * N tokens. */

/* Views of one block's parameters (official DiTBlock names). */
typedef struct F(dit_block) {
    F(attn_params) attn;   /* blocks.i.attn.{qkv,proj}.{weight,bias}, wg, wg_0, wg_1 (attn.h) */
    real *fc1_w, *fc1_b;   /* blocks.i.mlp.fc1.weight [Hm, D], bias [Hm] */
    real *fc2_w, *fc2_b;   /* blocks.i.mlp.fc2.weight [D, Hm], bias [D] */
    real *ada_w, *ada_b;   /* blocks.i.adaLN_modulation.1.weight [6D, D], bias [6D] */
} F(dit_block);

/* All parameters as views into one contiguous buffer (data, n values), in dit_tensors order. */
typedef struct F(dit_params) {
    real *data;
    size_t n;
    real *pos_embed;       /* pos_embed [1, N, D] (fixed sin-cos, never updated: no gradient) */
    real *xe_w, *xe_b;     /* x_embedder.proj.weight [D, C, p, p] == [D, P], bias [D] */
    real *t0_w, *t0_b;     /* t_embedder.mlp.0.weight [D, 256], bias [D] */
    real *t2_w, *t2_b;     /* t_embedder.mlp.2.weight [D, D], bias [D] */
    real *y_table;         /* y_embedder.embedding_table.weight [num_classes + 1, D] */
    F(dit_block) *blocks;  /* [L] */
    real *fl_w, *fl_b;     /* final_layer.linear.weight [P, D], bias [P] */
    real *fa_w, *fa_b;     /* final_layer.adaLN_modulation.1.weight [2D, D], bias [2D] */
} F(dit_params);

/* Activations of one forward pass for up to Bmax images, kept for backward. */
typedef struct F(dit_acts) {
    F(attn_stack) attn;    /* first, for models/model.c: the attention layers (either path) and the
                            * backend and precision of every op, and the block behind the arrays
                            * below (attn/layer.h) */
    int B, Bmax;
    real *patches;         /* [BN, P] flattened input patches */
    real *tfreq;           /* [B, 256] timestep frequency embedding */
    real *th, *ts;         /* [B, D] t_embedder.mlp.0 output, its SiLU */
    real *cond, *csilu;    /* [B, D] c = t_emb + y_emb, SiLU(c) (input of every adaLN) */
    real *mod;             /* [L, B, 6D] adaLN outputs: shift1, scale1, gate1, shift2, scale2, gate2 */
    real *fmod;            /* [B, 2D] final adaLN: shift, scale */
    real *resid;           /* [L + 1, BN, D] input of each block, then the final residual */
    real *mid;             /* [L, BN, D] residual after the attention branch */
    real *n1, *mean1, *rstd1; /* [L, BN, D], [L, BN], [L, BN]: LN(x), its mean and 1/std */
    real *h1;              /* [L, BN, D] modulated attention input (the attention caches borrow it) */
    real *ao;              /* [L, BN, D] attention output */
    real *n2, *mean2, *rstd2, *h2; /* [L, BN, D], [L, BN], [L, BN], [L, BN, D] */
    real *fc1, *act, *f2;  /* [L, BN, Hm], [L, BN, Hm], [L, BN, D]: fc1, GELU(tanh), fc2 outputs */
    real *nf, *meanf, *rstdf, *hf; /* [BN, D], [BN], [BN], [BN, D] final LN, mean, 1/std, modulated */
    real *out_tok;         /* [BN, P] final linear output */
    real *out;             /* [B, C, H, W] eps prediction (unpatchified) */
    real *dres, *dtmp, *dh;/* [BN, D] each: backward scratch */
    real *dff;             /* [2, BN, Hm] backward scratch */
    real *dtok;            /* [BN, P] backward scratch */
    real *dmod;            /* [B, 6D] backward scratch */
    real *dsc, *dcond, *dth; /* [B, D], [B, D], [2, B, D]: backward scratch */
    real mse;              /* mean squared error of the last forward with targets */
    real lb_loss;          /* mean over routing layers of the load-balance loss (spec §2) */
} F(dit_acts);

/* Allocates zeroed params for cfg (finalized) and binds the views. MOH_OK or MOH_E_NOMEM. */
int F(dit_params_init)(F(dit_params) *p, const moh_dit_config *cfg, moh_error *err);
void F(dit_params_free)(F(dit_params) *p);
/* Activations for batches of up to Bmax images; sparse = the head-sparse attention path (float32
 * only, MOH_E_ARG in float64). MOH_OK, MOH_E_ARG (Bmax < 1) or MOH_E_NOMEM. */
int F(dit_acts_init)(F(dit_acts) *a, const moh_dit_config *cfg, int Bmax, bool sparse, moh_error *err);
void F(dit_acts_free)(F(dit_acts) *a);

/* Forward: x [B, C, H, W] (noised images), t [B] (0..diffusion_steps-1; may be fractional in
 * principle, integers here), y [B] (0..num_classes, num_classes = null) -> a->out [B, C, H, W]
 * eps prediction; B <= a->Bmax. Always fills a->lb_loss. With noise [B, C, H, W] (the target eps)
 * also a->mse and returns mse + load_balance_coef * lb_loss; else returns 0. */
real F(dit_forward)(const moh_dit_config *cfg, const F(dit_params) *p, F(dit_acts) *a, const real *x,
                    const int *t, const int *y, const real *noise, int B);
/* Backward of mse + load_balance_coef * lb_loss after a forward with noise: ACCUMULATES into grads
 * (same layout as p; pos_embed gets no gradient). */
void F(dit_backward)(const moh_dit_config *cfg, const F(dit_params) *p, const F(dit_params) *grads,
                     F(dit_acts) *a, const int *y, const real *noise);

/* ---- the DiT ops (exported for the finite-difference tests) ---------------------------------- */
/* TimestepEmbedder.timestep_embedding(t, 256): out [B, 256] = [cos(t w), sin(t w)], w_i =
 * exp(-ln(10000) i / 128) computed in float32 as PyTorch does. */
void F(dit_timestep_freq)(real *out, const int *t, int B);
/* Timestep embedder forward: t_emb [B, D] = mlp.2(SiLU(mlp.0(freq))); th, ts [B, D] saved. cx: the
 * backend and precision of the two GEMMs (float64: ignored, may be NULL). */
void F(dit_temb_forward)(const moh_dit_config *cfg, const F(dit_params) *p, const be_ctx *cx, real *temb,
                         real *th, real *ts, const real *freq, int B);
/* Its backward from dtemb [B, D]: ACCUMULATES the four weight/bias gradients (dth scratch [2, B, D]). */
void F(dit_temb_backward)(const moh_dit_config *cfg, const F(dit_params) *p, const F(dit_params) *g,
                          const be_ctx *cx, const real *dtemb, const real *th, const real *ts, const real *freq,
                          real *dth, int B);
/* Patchify (x_embedder im2col): patches [B N, P] in (c, ky, kx) order from img [B, C, H, W]. */
void F(dit_patchify)(const moh_dit_config *cfg, real *patches, const real *img, int B);
/* Unpatchify (models.py unpatchify): img [B, C, H, W] from tok [B N, P] in (ky, kx, c) order;
 * inverse = 1: the adjoint, tok from img (gathers the gradient). */
void F(dit_unpatchify)(const moh_dit_config *cfg, real *img, real *tok, int B, int inverse);
