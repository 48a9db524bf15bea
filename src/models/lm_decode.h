/* KV-cache decoding of the decoder LM, one token at a time (float32, or bf16 weights and cache).
 * Per token and layer, K and V are appended for every KV head; for the heads the token's router
 * does not select (gate == 0) there is no q (learned router), no attention and no W_O term: the
 * skipped heads cost nothing (spec §10: what may be skipped). The per-token products, the KV
 * store and the attention are the attention layer's decode side (attn/decode.h); each product goes
 * to the OpenMP team only when it is worth waking it (lm_kv_calibrate). A prompt can instead be
 * encoded in one batched pass (lm_prefill, the head-sparse attention layer) that leaves the same
 * cache.
 *
 * bf16 (lm_kv_init_bf16): the cache owns a bf16 copy of the parameter buffer, made once at init,
 * and keeps K and V in bf16; every matrix-vector product (q/k/v, W_O, MLP, LM head) and the
 * attention read bf16 and accumulate in fp32; embedding, RMSNorm, router, RoPE, softmax, SwiGLU
 * and the residual stream stay fp32. Decode reads about half the bytes per token.
 *
 * Quantised (lm_kv_init_quant): the same products from ggml Q8_0 / Q4_0 / Q4_1 blocks (a GGUF
 * file's own, or lm_quant_table's) times the input quantised per 32 values, as llama.cpp's CPU
 * backend computes them; K and V in bf16. Batched passes (lm_prefill, lm_feed) run on the blocks
 * dequantised one matrix at a time. */
#ifndef MOH_LM_DECODE_H
#define MOH_LM_DECODE_H
#include "attn/decode.h"
#include "attn/layer.h"
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
    attn_decode dc;        /* K and V of the L h_kv heads (head l h_kv + g), the products, the team split */
    attn_cache_f32 router; /* router scratch for one token (B = N = 1) */
    bool have_router;
    float *x, *xn, *qkv, *og, *tmp, *gate, *up, *scores;
    int *task;             /* [h + 2 h_kv]: the selected heads of the current token, then q/k/v tasks */
    long heads_run, heads_total; /* (token, layer, head) attention rows computed / possible */
    double phase_s[LM_NPHASE];   /* wall seconds per phase (LM_PH_*), accumulated */
    void *block;
} lm_kv_cache;

/* Allocates a float32 cache for up to max_T tokens. MOH_OK, MOH_E_NOMEM. */
int lm_kv_init(lm_kv_cache *kv, const moh_lm_config *cfg, int max_T, moh_error *err);
/* A bf16 cache for up to max_T tokens decoding the parameters p (their bf16 copy is made here,
 * once; p must stay unchanged and be the p given to every lm_decode_step / lm_prefill on this
 * cache). Works on any CPU (attn_decode_precision says whether it pays). MOH_OK, MOH_E_NOMEM. */
int lm_kv_init_bf16(lm_kv_cache *kv, const moh_lm_config *cfg, const lm_params_f32 *p, int max_T, moh_error *err);
/* A cache decoding p with the matrices of qt (lm_quant_table, lm_gguf_quant_table: its base is
 * p->data) from their quantised blocks on the integer units, every other product fp32, K and V
 * in bf16 (attn_decode_init_quant). qt is borrowed: it must outlive the cache. MOH_OK, MOH_E_ARG
 * (qt is of another buffer), MOH_E_NOMEM. */
int lm_kv_init_quant(lm_kv_cache *kv, const moh_lm_config *cfg, const lm_params_f32 *p, const quant_table *qt,
                     int max_T, moh_error *err);
/* Quantises p's matrix-vector weights (every layer's W_qkv [qd, C], W_O [C, h d] when head_dim is
 * a multiple of 32, gate and up [I, C], down [C, I]; the LM head [V, C], once when tied, in Q8_0 for
 * a 4-bit type, as llama-quantize keeps it) into ggml blocks of `type` (MOH_GGML_Q8_0 / _Q4_0 /
 * _Q4_1, as ggml's quantize_row_*_ref), held by qt (owned; quant_table_free). A matrix whose width is not a multiple of 32 is left out
 * (decoded fp32). MOH_OK, MOH_E_ARG (type), MOH_E_NOMEM; qt empty on error. */
int lm_quant_table(const moh_lm_config *cfg, const lm_params_f32 *p, int type, quant_table *qt, moh_error *err);
void lm_kv_free(lm_kv_cache *kv);
/* Empties the cache (pos = 0) without freeing it. */
void lm_kv_reset(lm_kv_cache *kv);
/* Writes K and V of KV head g in layer l at positions pos .. pos + n (< max_T): k, v [n, d]
 * float32 rows (keys after RoPE), rounded to bf16 for a bf16 cache. Does not move kv->pos. */
void lm_kv_write(lm_kv_cache *kv, const moh_lm_config *cfg, int l, int g, int pos, int n, const float *k,
                 const float *v);
/* Feeds token (0 <= token < V) at position kv->pos and writes the next-token logits [V].
 * Returns MOH_OK, or MOH_E_ARG when the cache is full, the token is out of range, or (bf16) p is
 * not the parameter buffer the cache was built for. */
int lm_decode_step(const moh_lm_config *cfg, const lm_params_f32 *p, lm_kv_cache *kv, int token,
                   float *logits, moh_error *err);

/* Measures what waking the OpenMP team costs (kv->dc.team_s) against one thread's matrix-vector
 * rate on layer 0's W_qkv (kv->dc.mac_s), and sets kv->dc.par_work, the work from which a decode product
 * is split across the team: under passive waits on a virtual machine, waking a sleeping thread
 * costs tens of microseconds, more than a small model's whole product. The thread count is the team
 * its regions got (one inside another parallel region, or under OMP_THREAD_LIMIT=1: no split),
 * not omp_get_max_threads(). lm_decode_step calls it on a cache's first step when par_work <= 0;
 * a caller comparing models may copy one cache's par_work to the others. Overwrites the cache's
 * activation scratch (not the K/V). ~1 ms (15 team starts: more when each takes milliseconds, as
 * under OMP_WAIT_POLICY=active with the cores busy). Threads do not change results: every row and
 * head is computed by the same code either way. MOH_OK, or MOH_E_ARG (nothing measured) when a bf16
 * cache is given parameters other than those it was built for. */
int lm_kv_calibrate(lm_kv_cache *kv, const moh_lm_config *cfg, const lm_params_f32 *p, moh_error *err);
/* The team split, the precision and what a cache decodes with are the decode side's:
 * attn_decode_copy_split(&dst->dc, &src->dc), attn_decode_describe_split, attn_decode_precision,
 * attn_decode_describe. */

/* Scratch of lm_prefill for prompts of up to max_n tokens: one layer's activations at a time
 * (x, xn, y [max_n, C]; gate, up [max_n, I]; rstd [max_n]), one head-sparse attention layer
 * (attn/layer.h, per-thread scratch for omp_get_max_threads() threads at init) and the compute
 * context of the linear layers (CPU backend; bf16 after lm_prefill_set_bf16). */
typedef struct lm_prefill_ws {
    int max_n;
    float *x, *xn, *y, *gate, *up, *rstd;
    attn_layer_f32 layer;
    be_ctx cx;
    const lm_kv_cache *bf16_kv;  /* lm_prefill_set_bf16: computes in bf16 over this cache's weights */
    float *wq;                   /* a quantised cache's: W_qkv + W_O, or one MLP matrix, dequantised
                                  * (made at first use) */
    size_t nwq;                  /* floats of wq */
    bf16_mirror wq16;            /* lm_prefill_set_quant on bf16 hardware: wq in bf16, the GEMMs' weights */
    void *block;
} lm_prefill_ws;
/* MOH_OK, MOH_E_ARG (max_n < 1), MOH_E_NOMEM. */
int lm_prefill_init(lm_prefill_ws *w, const moh_lm_config *cfg, int max_n, moh_error *err);
/* bf16 prefill into the bf16 cache kv (which must stay at its address): the linear layers and the
 * head-sparse attention in bf16 on kv's bf16 weights (be_ctx_set_weights, attn_layer_set_compute),
 * fp32 accumulation. MOH_OK, MOH_E_ARG (kv is not bf16), MOH_E_NOMEM. */
int lm_prefill_set_bf16(lm_prefill_ws *w, const moh_lm_config *cfg, const lm_kv_cache *kv, moh_error *err);
/* Prefill into the quantised cache kv: the dequantisation scratch, and on a CPU with bf16 GEMMs
 * (precision_resolve: AVX512-BF16 or AMX-BF16) the linear layers and attention tiles in bf16 on
 * the dequantised matrices (rounded to bf16 once per use), else fp32. MOH_OK, MOH_E_ARG (kv is
 * not quantised), MOH_E_NOMEM. */
int lm_prefill_set_quant(lm_prefill_ws *w, const moh_lm_config *cfg, const lm_kv_cache *kv, moh_error *err);
void lm_prefill_free(lm_prefill_ws *w);
/* Batched prefill: empties the cache and encodes tok[0..n) (ids < V) from position 0 in one
 * forward pass over the n tokens, layer by layer: RMSNorm, head-sparse attention
 * (attn_layer_forward_f32: only the (token, head) pairs the router selects), SwiGLU MLP, residuals,
 * as lm_forward_f32 computes them. Each layer's K (after RoPE) and V go into the cache as n
 * lm_decode_step calls would put them; logits [V] are the next-token logits after tok[n-1]
 * (the LM head runs on that token only). Decoding goes on with lm_decode_step at position n.
 * A bf16 cache gets its K and V rounded to bf16; the workspace computes in bf16 when set for
 * this cache (lm_prefill_set_bf16), else in fp32. A quantised cache: the matrices its table holds,
 * dequantised one at a time (lm_prefill_set_quant: bf16 GEMMs where the CPU has them); the float
 * buffer's rows of those matrices are never read; the embedding rows from the table too.
 * Returns MOH_OK, or MOH_E_ARG when n < 1, n > w->max_n, n > kv->max_T, a token is out of range,
 * or w was set to bf16 for another cache. */
int lm_prefill(const moh_lm_config *cfg, const lm_params_f32 *p, lm_kv_cache *kv, lm_prefill_ws *w,
               const int *tok, int n, float *logits, moh_error *err);

/* Runs of at least this many tokens are encoded in one batched pass (lm_feed, lm_encode). */
#define LM_ENCODE_BATCH 8
/* Appends tok[0..n) (ids < V) at kv->pos (kv->pos + n <= kv->max_T), leaving the logits after
 * tok[n-1]. From LM_ENCODE_BATCH tokens in one batched pass with a workspace made for these n
 * (bf16 on a bf16 cache; a quantised one's dequantised matrices, lm_prefill_set_quant): on an
 * empty cache lm_prefill (the head-sparse attention layer), else a pass that runs the projections and the MLP
 * as GEMMs over the n tokens, routes each token as lm_decode_step does, and attends each token's
 * selected heads over the cache up to its position with the decode kernels (a chat turn after the
 * first). Below that, lm_decode_step per token. MOH_OK, MOH_E_ARG (n, a token out of range, or
 * parameters other than a bf16 / quantised cache's), MOH_E_NOMEM. */
int lm_feed(const moh_lm_config *cfg, const lm_params_f32 *p, lm_kv_cache *kv, const int *tok, int n, float *logits,
            moh_error *err);
/* Empties the cache and lm_feeds tok[0..n) (1 <= n <= kv->max_T) from position 0. */
int lm_encode(const moh_lm_config *cfg, const lm_params_f32 *p, lm_kv_cache *kv, const int *tok, int n, float *logits,
              moh_error *err);
#endif
