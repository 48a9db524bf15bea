/* Template of the decoder-LM prototypes: included twice by lm.h (_f32 engine, _f64 checks).
 * No include guard on purpose. Layout and shapes: lm.h. */

/* Views of one decoder block's parameters inside the model's parameter buffer. */
typedef struct F(lm_block) {
    real *ln1;        /* input_layernorm.weight [C] */
    F(attn_params) attn;
    real *ln2;        /* post_attention_layernorm.weight [C] */
    real *w_gate;     /* mlp.gate_proj.weight [I, C] */
    real *w_up;       /* mlp.up_proj.weight [I, C] */
    real *w_down;     /* mlp.down_proj.weight [C, I] */
} F(lm_block);

/* All parameters as views into one contiguous buffer (params.data, n values). */
typedef struct F(lm_params) {
    real *data;
    size_t n;
    real *embed;      /* model.embed_tokens.weight [V, C] */
    F(lm_block) *blocks; /* [L] */
    real *norm;       /* model.norm.weight [C] */
    real *lm_head;    /* lm_head.weight [V, C]; == embed when tied */
} F(lm_params);

/* Activations of one forward pass for a [B, T] batch, kept for backward. */
typedef struct F(lm_acts) {
    F(attn_stack) attn;    /* first, for models/model.c: the attention layers (either path) and the
                            * backend and precision of every op, and the block behind the arrays
                            * below (attn/layer.h) */
    int B, T;
    real *resid;      /* [L + 1, BT, C]: input of each block, then the final residual */
    real *mid;        /* [L, BT, C]: residual after the attention branch (input of ln2) */
    real *ln1, *ln1_rstd; /* [L, BT, C], [L, BT] */
    real *attn_out;   /* [L, BT, C] */
    real *ln2, *ln2_rstd; /* [L, BT, C], [L, BT] */
    real *gate, *up, *act; /* [L, BT, I] each */
    real *sig;        /* [L, BT, I] sigmoid(gate), saved for the SwiGLU backward */
    real *lnf, *lnf_rstd; /* [BT, C], [BT] */
    real *logits;     /* [BT, V] */
    real *probs;      /* [BT, V] softmax of the logits (filled when targets are given) */
    real *dres, *dtmp, *dff; /* backward scratch: [BT, C] x2, [3, BT, I] (dff) */
    real *dlogits;    /* [BT, V] */
    real ce_loss;     /* mean cross-entropy (nats) of the last forward with targets */
    real lb_loss;     /* mean over routing layers of the load-balance loss (spec §2) */
    double phase_s[LMT_NPHASE]; /* wall seconds per phase (lm_train_phase_name), accumulated */
} F(lm_acts);

/* Allocates params (zeroed) for cfg and binds the views. MOH_OK or MOH_E_NOMEM. */
int F(lm_params_init)(F(lm_params) *p, const moh_lm_config *cfg, moh_error *err);
void F(lm_params_free)(F(lm_params) *p);
/* Allocates activations for batches of up to B x T tokens. MOH_OK or MOH_E_NOMEM. */
int F(lm_acts_init)(F(lm_acts) *a, const moh_lm_config *cfg, int B, int T, moh_error *err);
void F(lm_acts_free)(F(lm_acts) *a);

/* Forward: tokens [B, T] (ids < V) -> a->logits [B*T, V]. With targets [B, T] (may be NULL; -1 =
 * ignore) also a->ce_loss and a->probs. Always fills
 * a->lb_loss. Returns the training loss ce + beta * lb (0 without targets). */
real F(lm_forward)(const moh_lm_config *cfg, const F(lm_params) *p, F(lm_acts) *a,
                   const int *tokens, const int *targets, int B, int T);
/* Backward of ce_loss + beta * lb_loss after a forward with targets: ACCUMULATES into grads
 * (same layout as p; a tied head accumulates into embed). */
void F(lm_backward)(const moh_lm_config *cfg, const F(lm_params) *p, const F(lm_params) *grads,
                    F(lm_acts) *a, const int *tokens, const int *targets);
