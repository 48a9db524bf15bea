/* KV-cache decoding of the decoder LM, one token at a time (float32). Per token and layer, K and
 * V are appended for every KV head; for the heads the token's router does not select (gate == 0)
 * there is no q (learned router), no attention and no W_O term: the skipped heads cost nothing
 * (spec §10: what may be skipped). Selected heads run in parallel (sparse_decode_attend_f32).
 * A prompt can instead be encoded in one batched pass (lm_prefill, head-sparse attention) that
 * leaves the same cache. */
#ifndef MOH_LM_DECODE_H
#define MOH_LM_DECODE_H
#include "attn/sparse.h"
#include "models/lm.h"

/* Phases of decode steps and prefills, timed into lm_kv_cache.phase_s (wall seconds,
 * accumulated; zero them to restart). */
enum {
    LM_PH_QKV,   /* router, q/k/v projections, RoPE, cache write (prefill: sparse router/kv/q) */
    LM_PH_ATTN,  /* attention of the selected heads over the cache */
    LM_PH_WO,    /* output projection W_O of the selected heads */
    LM_PH_MLP,   /* SwiGLU MLP: gate and up projections, silu * up, down projection */
    LM_PH_HEAD,  /* final RMSNorm and the LM head [V, C] (prefill: the last token only) */
    LM_PH_OTHER, /* embedding lookup, the two RMSNorms per layer, residual adds */
    LM_NPHASE
};
/* Short name of phase i ("qkv", "attention", ...). */
const char *lm_phase_name(int i);

typedef struct lm_kv_cache {
    int max_T;             /* capacity in tokens */
    int pos;               /* tokens already in the cache = position of the next token */
    float *k, *v;          /* [L, h_kv, max_T, d] (head-major), keys after RoPE */
    attn_cache_f32 router; /* router scratch for one token (B = N = 1) */
    float *x, *xn, *qkv, *og, *tmp, *gate, *up, *scores;
    int *task;             /* [h + 2 h_kv]: the selected heads of the current token, then q/k/v tasks */
    long heads_run, heads_total; /* (token, layer, head) attention rows computed / possible */
    double phase_s[LM_NPHASE];   /* wall seconds per phase (LM_PH_*), accumulated */
    void *block;
} lm_kv_cache;

/* Allocates a cache for up to max_T tokens. MOH_OK, MOH_E_NOMEM. */
int lm_kv_init(lm_kv_cache *kv, const moh_lm_config *cfg, int max_T, moh_error *err);
void lm_kv_free(lm_kv_cache *kv);
/* Empties the cache (pos = 0) without freeing it. */
void lm_kv_reset(lm_kv_cache *kv);
/* Feeds token (0 <= token < V) at position kv->pos and writes the next-token logits [V].
 * Returns MOH_OK, or MOH_E_ARG when the cache is full or the token is out of range. */
int lm_decode_step(const moh_lm_config *cfg, const lm_params_f32 *p, lm_kv_cache *kv, int token,
                   float *logits, moh_error *err);

/* Scratch of lm_prefill for prompts of up to max_n tokens: one layer's activations at a time
 * (x, xn, y [max_n, C]; gate, up [max_n, I]; rstd [max_n]) and one head-sparse attention cache (sparse.h,
 * per-thread scratch for omp_get_max_threads() threads at init). */
typedef struct lm_prefill_ws {
    int max_n;
    float *x, *xn, *y, *gate, *up, *rstd;
    sparse_cache sc;
    void *block;
} lm_prefill_ws;
/* MOH_OK, MOH_E_ARG (max_n < 1), MOH_E_NOMEM. */
int lm_prefill_init(lm_prefill_ws *w, const moh_lm_config *cfg, int max_n, moh_error *err);
void lm_prefill_free(lm_prefill_ws *w);
/* Batched prefill: empties the cache and encodes tok[0..n) (ids < V) from position 0 in one
 * forward pass over the n tokens, layer by layer: RMSNorm, head-sparse attention
 * (sparse_forward_f32: only the (token, head) pairs the router selects), SwiGLU MLP, residuals,
 * as lm_forward_f32 computes them. Each layer's K (after RoPE) and V go into the cache as n
 * lm_decode_step calls would put them; logits [V] are the next-token logits after tok[n-1]
 * (the LM head runs on that token only). Decoding goes on with lm_decode_step at position n.
 * Returns MOH_OK, or MOH_E_ARG when n < 1, n > w->max_n, n > kv->max_T or a token is out of
 * range. */
int lm_prefill(const moh_lm_config *cfg, const lm_params_f32 *p, lm_kv_cache *kv, lm_prefill_ws *w,
               const int *tok, int n, float *logits, moh_error *err);
#endif
