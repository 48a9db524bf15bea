/* KV-cache decoding of the decoder LM, one token at a time (float32). Per token and layer, K and
 * V are appended for every KV head; for the heads the token's router does not select (gate == 0)
 * there is no q (learned router), no attention and no W_O term: the skipped heads cost nothing
 * (spec §10: what may be skipped). Selected heads run in parallel (sparse_decode_attend_f32). */
#ifndef MOH_LM_DECODE_H
#define MOH_LM_DECODE_H
#include "models/lm.h"

typedef struct lm_kv_cache {
    int max_T;             /* capacity in tokens */
    int pos;               /* tokens already in the cache = position of the next token */
    float *k, *v;          /* [L, h_kv, max_T, d] (head-major), keys after RoPE */
    attn_cache_f32 router; /* router scratch for one token (B = N = 1) */
    float *x, *xn, *qkv, *og, *tmp, *gate, *up, *scores;
    long heads_run, heads_total; /* (token, layer, head) attention rows computed / possible */
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
#endif
