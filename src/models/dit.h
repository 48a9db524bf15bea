/* MoH-DiT: class-conditional diffusion transformer (Peebles & Xie, DiT) with MoH attention, laid
 * out exactly as the official DiT / MoH-DiT PyTorch code (SkyworkAI/MoH MoH-DiT/models.py: DiT,
 * DiTBlock, FinalLayer, TimestepEmbedder, LabelEmbedder, MoHAttention; spec §1, §2, §4 MoH-DiT):
 *
 *   x_t [B, C, H, W] (pixels in [-1, 1] plus noise), t [B] (0..diffusion_steps-1), y [B]
 *   (0..num_classes; num_classes = the null class of classifier-free guidance)
 *   -> x_embedder.proj: Conv2d(C, D, k=p, stride=p) == a linear over flattened patches (patch
 *      pixels in (channel, ky, kx) order, patches row-major) -> [B, N, D], + pos_embed [1, N, D]
 *      (fixed 2-D sin-cos, MAE get_2d_sincos_pos_embed: first D/2 columns encode the patch column,
 *      the last D/2 the row; each half [sin, cos]; not trained)
 *   -> c = t_embedder(t) + y_embedder(y): t_embedder.mlp.2(SiLU(t_embedder.mlp.0(freq(t)))) with
 *      freq(t) = [cos(t w_i), sin(t w_i)], w_i = exp(-ln(10000) i / 128), i < 128 (256 values);
 *      y_embedder.embedding_table [num_classes + 1, D]
 *   -> L x DiTBlock (adaLN-Zero): [shift1, scale1, gate1, shift2, scale2, gate2] =
 *      adaLN_modulation.1(SiLU(c)) [B, 6D];
 *      x += gate1 * attn(LN(x) (1 + scale1) + shift1); x += gate2 * mlp(LN(x) (1 + scale2) + shift2)
 *      (LN without affine, eps 1e-6; attention bidirectional, fused qkv with bias, proj with bias,
 *      learned router wg / wg_0 / wg_1 reading the modulated input, per-layer shared_heads/top_k,
 *      or "none" = dense MHA; MLP fc1 -> GELU(tanh) -> fc2)
 *   -> final_layer: [shift, scale] = final_layer.adaLN_modulation.1(SiLU(c)) [B, 2D];
 *      final_layer.linear(LN(x) (1 + scale) + shift) [B, N, p p C] (vector in (ky, kx, c) order)
 *   -> unpatchify -> eps prediction [B, C, H, W]
 *
 * learn_sigma is false (out_channels = C): the output is the noise prediction only, trained with
 * the plain epsilon MSE (DiT's learned-sigma variant and its VLB term are not implemented).
 * Training loss = mean over all B C H W values of (eps_pred - eps)^2 + load_balance_coef * mean over
 * the routing layers (top_k >= 1) of the load-balance loss (spec §2; MoH-DiT train.py:219).
 * Parameters live in one contiguous buffer in the official state_dict order (dit_tensors). */
#ifndef MOH_DIT_H
#define MOH_DIT_H
#include "attn/attn.h"
#include "attn/layer.h"
#include "data/idx.h"
#include "models/model.h"
#include "moh.h"

#define DIT_MAX_DEPTH 64
#define DIT_MAX_CHANS 16
#define DIT_FREQ_DIM 256 /* TimestepEmbedder.frequency_embedding_size */
#define DIT_LN_EPS 1e-6   /* the blocks' and the final layer's nn.LayerNorm(elementwise_affine=False, eps=1e-6) */

/* config.json of a DiT (the official DiT constructor's argument names plus the MoH and diffusion
 * fields). */
typedef struct moh_dit_config {
    int input_size;          /* H = W (pixels), default 28 */
    int patch_size;          /* p, divides input_size, default 4 */
    int in_channels;         /* C, default 1 */
    int num_classes;         /* default 10 (the label table has num_classes + 1 rows) */
    int hidden_size;         /* D, divisible by 4 (2-D sin-cos) and by num_heads */
    int depth;               /* L (1..DIT_MAX_DEPTH) */
    int num_heads;           /* h (head_dim = D / h) */
    double mlp_ratio;        /* MLP hidden = int(D * mlp_ratio), default 4 */
    double class_dropout_prob; /* label dropout in training, default 0.1 (> 0: the null class) */
    moh_router router;       /* learned (MoH-DiT) or none (dense DiT) */
    int shared_heads[DIT_MAX_DEPTH]; /* h_s of each layer (config: a number for all, or a list) */
    int top_k[DIT_MAX_DEPTH];        /* K of each layer (0 with shared_heads = h: soft reweighting) */
    double load_balance_coef;/* beta, default 0.01 */
    int diffusion_steps;     /* T of the Gaussian diffusion, default 1000 */
    double beta_start, beta_end; /* linear beta schedule (DiT: 1e-4, 0.02 for 1000 steps) */
    /* derived by moh_dit_config_finalize */
    int grid, num_patches;   /* input_size / p, grid^2 = N tokens */
    int patch_dim;           /* C p p (input and output patch vector) */
    int mlp_hidden;          /* int(D * mlp_ratio) */
    int routing_layers;      /* layers with top_k >= 1 (the load-balance mean's denominator) */
    moh_attn_config attn[DIT_MAX_DEPTH]; /* per layer: bidirectional, fused qkv, biases, no RoPE */
} moh_dit_config;

/* Parses and validates config.json (keys: model_type "dit" (required), input_size, patch_size,
 * in_channels, num_classes, hidden_size, depth, num_heads, mlp_ratio, class_dropout_prob,
 * learn_sigma (false only), router, shared_heads, top_k (a number or a list of depth numbers),
 * load_balance_coef, diffusion_steps, noise_schedule ("linear" only), beta_start, beta_end; keys
 * starting with "_" or "comment" are annotations; any other key is an error). Fills the derived
 * fields. Errors (one line naming label, field, value and expectation): MOH_E_FORMAT (not JSON),
 * MOH_E_CONFIG. On error cfg is unchanged. */
int moh_dit_config_parse_json(moh_dit_config *cfg, const char *text, size_t len, const char *label,
                              moh_error *err);
/* Checks the fields of a config built in code and derives grid, num_patches, patch_dim,
 * mlp_hidden, routing_layers and attn[]. MOH_OK or MOH_E_CONFIG. */
int moh_dit_config_finalize(moh_dit_config *cfg, const char *label, moh_error *err);
/* config.json text (malloc'd; NULL on OOM) that moh_dit_config_parse_json reads back to the same
 * config (shared_heads / top_k as one number when every layer has the same). */
char *moh_dit_config_to_json(const moh_dit_config *cfg);
/* Heads active per token summed over the layers (h per dense layer, h_s + K per routed layer,
 * h per all-shared layer); the share of all heads is this / (L h). */
int dit_active_head_layers(const moh_dit_config *cfg);

#define real float
#define F(x) x##_f32
#include "dit_decl.h"
#undef real
#undef F

#define real double
#define F(x) x##_f64
#include "dit_decl.h"
#undef real
#undef F


/* The model's tensors in buffer order (official DiT state_dict order, pos_embed included: it is a
 * state_dict entry although not trained); *n gets the count. Caller frees. NULL on OOM. */
model_tensor *dit_tensors(const moh_dit_config *cfg, int *n);
/* Official DiT initialisation (DiT.initialize_weights): xavier_uniform on every Linear weight
 * (routers included, spec §8) and on x_embedder.proj viewed as [D, C p p], biases 0; pos_embed the
 * 2-D sin-cos table; label table and t_embedder.mlp.0/2 weights ~ N(0, 0.02^2); every
 * adaLN_modulation.1 and final_layer.linear zero (adaLN-Zero). Deterministic in seed. */
void dit_params_init_random(const moh_dit_config *cfg, dit_params_f32 *p, uint64_t seed);
/* The fixed 2-D sin-cos position table [N, D] (MAE get_2d_sincos_pos_embed, float64 then rounded
 * like numpy's .float()). */
void dit_pos_embed(const moh_dit_config *cfg, float *out);
#endif
