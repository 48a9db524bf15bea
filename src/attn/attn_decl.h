/* Template of the attention-layer prototypes: included twice by attn.h (float: _f32, double:
 * _f64). No include guard on purpose. Shapes: see attn.h. */

/* Parameters of one layer, views into a caller-owned buffer. Absent tensors are NULL. */
typedef struct F(attn_params) {
    real *w_qkv; /* [(h + 2 h_kv) d, C]: q rows (head i: rows i*d..), then k rows, then v rows */
    real *b_qkv; /* [(h + 2 h_kv) d] when qkv_bias */
    real *w_o;   /* [C, h d] */
    real *b_o;   /* [C] when proj_bias */
    real *w_r;   /* wg   [E, C]   learned router with top_k >= 1 */
    real *w_h;   /* wg_0 [2, C]   learned router with top_k >= 1 and h_s >= 1 */
    real *w_s;   /* wg_1 [h_s, C] learned router with h_s >= 2 */
} F(attn_params);

/* Activations saved by forward for backward; owns its memory (one allocation). */
typedef struct F(attn_cache) {
    int B, N;
    const real *x; /* [T, C], borrowed from the caller, must outlive backward */
    real *qkv;     /* [T, (h + 2 h_kv) d] projections; q and k after RoPE */
    real *q_pre;   /* [T, h d] queries before RoPE (query_norm router only, else NULL) */
    real *att;     /* [B, h, N, N] attention probabilities (reference path) */
    real *o;       /* [T, h d] head outputs before gating */
    real *og;      /* [T, h d] gated head outputs (input of W_o) */
    real *gates;   /* [T, h] gate of each head (0 when not selected) */
    real *p;       /* [T, E] router scores: softmax(wg x) or softmax(||q|| / std) */
    real *mask;    /* [T, E] 1 for the top_k selected routed heads, else 0 */
    real *r;       /* [T, E] learned: K * p * mask / sum(p * mask) */
    real *denom;   /* [T] learned: max(sum(p * mask), eps) */
    real *s;       /* [T, h_s] softmax(wg_1 x) (not yet scaled by h_s) */
    real *a;       /* [T, 2] softmax(wg_0 x) (not yet scaled by 2) */
    real *qn;      /* [T, E] query norms (query_norm router) */
    real *qstd;    /* [T] unbiased std of qn across routed heads */
    real *scratch; /* [T, E + W + h_s + 2], W = max(E, h_s, 2): router backward */
    real *datt;    /* [B, h, N, N] backward scratch (reference path) */
    real *dog;     /* [T, h d] backward scratch: d og, then d o */
    real *dqkv;    /* [T, (h + 2 h_kv) d] backward scratch */
    real *dgates;  /* [T, h] backward scratch */
    int *pos;      /* [T] RoPE position of each token (n for token (b, n)) */
    real lb_loss;  /* E * sum_i P_i f_i (spec §2); 0 when no routing */
    struct bf16_ctx *bf16; /* float32 only (NULL in float64): the qkv and W_O projections as bf16
                            * GEMMs through this context (ops/bf16.h, borrowed; the per-head
                            * scores and P V stay fp32); NULL (attn_cache_init): all fp32 */
    void *block;   /* the single allocation behind the arrays above */
} F(attn_cache);

/* Points p's fields into buf (may be NULL to only count) in the order w_qkv, b_qkv, w_o, b_o,
 * w_r, w_h, w_s, skipping absent ones. Returns the number of values the layer has. */
size_t F(attn_params_bind)(F(attn_params) *p, real *buf, const moh_attn_config *cfg);

/* Allocates a cache for batch B and sequence length N. Returns MOH_OK or MOH_E_NOMEM. */
int F(attn_cache_init)(F(attn_cache) *c, const moh_attn_config *cfg, int B, int N, moh_error *err);
void F(attn_cache_free)(F(attn_cache) *c);

/* Router forward (spec §1 steps 1-4, §2, §3): gates [T,h], lb_loss and router activations, from
 * x [T, C] and the pre-RoPE projections qkv [T, (h+2h_kv) d] (query_norm reads ||q||). */
void F(router_forward)(const moh_attn_config *cfg, const F(attn_params) *prm, const real *x,
                       const real *qkv, int T, F(attn_cache) *c);
/* Router backward: from dgates [T, h] and the load-balance loss weight lb_scale (= beta),
 * accumulates dx [T, C], router weight grads into g, and (query_norm) d q_pre into dqkv's q
 * columns [T, (h+2h_kv) d]. Query-norm gates are constants (spec §10): only the
 * load-balance term reaches q. */
void F(router_backward)(const moh_attn_config *cfg, const F(attn_params) *prm,
                        const F(attn_params) *g, const F(attn_cache) *c, const real *dgates,
                        real lb_scale, real *dx, real *dqkv, int T);

/* Pieces of the learned router (top_k >= 1) by rows, for callers that split the work (the
 * head-sparse path in bf16): router_learned_rows: rows [t0, t1) of p, s, a, mask, r, denom and
 * the gates from the logits z [T, E + nh + ns] (row t: wg x_t | wg_0 x_t | wg_1 x_t; nh = 2 when
 * h_s >= 1, ns = h_s when h_s >= 2), the same values router_forward computes;
 * router_load_balance: lb (spec §2) of p, mask [T, E]; router_lb_dp: d lb_scale lb / d p[t, i]
 * (the same for every t); router_learned_grad_rows: rows [t0, t1) of router_backward's dp [T, E]
 * (ADDED to: the caller sets the load-balance term first), ds [T, h_s], da [T, 2] from dgates. */
void F(router_learned_rows)(const moh_attn_config *cfg, F(attn_cache) *c, const real *z, int t0, int t1);
real F(router_load_balance)(const real *p, const real *mask, int T, int E);
real F(router_lb_dp)(const F(attn_cache) *c, real lb_scale, int T, int E, int i);
void F(router_learned_grad_rows)(const moh_attn_config *cfg, const F(attn_cache) *c, const real *dgates,
                                 real *dp, real *ds, real *da, int t0, int t1);

/* Reference MoH attention forward (spec §1 step 5: every head computed, then gated):
 * x [B, N, C] -> y [B, N, C]; fills c (gates, lb_loss, activations). */
void F(attn_forward)(const moh_attn_config *cfg, const F(attn_params) *prm, const real *x,
                     int B, int N, real *y, F(attn_cache) *c);
/* Reference backward of L = sum(y * dy) + lb_scale * lb_loss: accumulates dx [B, N, C] (may be
 * NULL) and every parameter gradient into g (same layout as prm; NULL fields skipped). */
void F(attn_backward)(const moh_attn_config *cfg, const F(attn_params) *prm,
                      const F(attn_params) *g, const F(attn_cache) *c, const real *dy,
                      real lb_scale, real *dx);
