/* Head-sparse MoH attention (float32): forward and backward of one layer computing only the
 * (token, head) pairs the router selects (spec §1 "What depends on routing", §10 "What the
 * head-sparse path may skip"). Same semantics and outputs as attn_forward_f32 / attn_backward_f32
 * (the reference: every head computed, then gated; attention_impl.h) to ~1e-5 relative.
 *
 * What is computed (T = B N tokens, P = number of selected (token, head) pairs):
 *  - the router first, by router_forward_f32 (gates, lb_loss); a pair (t, i) is selected when i is
 *    a shared head, or the router is "none" / all-shared, or the top-k mask picks i;
 *  - K and V for every token and KV head by one dense GEMM (x W_k^T, x W_v^T), RoPE on K;
 *  - Q only for the selected pairs (learned router: gathered-row GEMM per head, + bias, + RoPE at
 *    the gathered positions; query_norm router: the dense q it needs to choose anyway, §3/§10);
 *  - attention for the selected pairs against all keys (causal: keys <= the query's position),
 *    tiled with an online softmax (flash attention): no N x N buffer exists; per pair the
 *    max score (raw units) and the log-sum-exp relative to it are saved for backward;
 *  - y = b_o + sum over selected pairs of gate * o W_O^i (per-head GEMM scatter-added into y in a
 *    fixed head order: deterministic, no atomics);
 *  - backward (FlashAttention-2 style, probabilities recomputed tile by tile from the saved
 *    log-sum-exp): gradients of q, W_q rows, W_O, gates and router only from selected pairs; dK
 *    and dV accumulated from every selecting query; then router_backward_f32 and the K/V/Q
 *    projection gradients.
 * Every sum of moh's kernels runs in an order fixed by the data layout, never by the thread count
 * (oneDNN's sgemm, behind the dense projections, can change last bits with it on some CPUs:
 * tests/test_sparse.c sgemm_thread_invariant). Memory is
 * linear in N (sparse_cache_bytes). Inner products run on AVX-512 register-tile kernels when the
 * CPU has AVX-512F, else on AVX2 + FMA ones, else on portable C loops (checked at run time:
 * sp_vec_detect), with the same results up to rounding; the large dense K/V projections go
 * through gemm_f32 (oneDNN). */
#ifndef MOH_ATTN_SPARSE_H
#define MOH_ATTN_SPARSE_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "attn/attn.h"

/* Tile sizes. SPARSE_BK keys per key tile (the transposed-key layout is blocked by it);
 * SPARSE_BQ selected queries per query tile (forward) and per query block (backward). */
#define SPARSE_BK 128
#define SPARSE_BQ 96

/* Phases timed into sparse_cache.phase_s (accumulated over calls; zero it to restart). */
enum {
    SPARSE_PH_ROUTER,    /* forward: router (query_norm: with the dense q it reads) */
    SPARSE_PH_KV,        /* forward: dense K/V GEMM, RoPE, key tiles */
    SPARSE_PH_Q,         /* forward: gathered-row Q GEMM per head, bias, RoPE */
    SPARSE_PH_ATTN,      /* forward: flash attention of the selected pairs */
    SPARSE_PH_WO,        /* forward: gate-weighted W_O, scatter-add into y */
    SPARSE_PH_B_WO,      /* backward: b_o, d og, dgates, dW_O */
    SPARSE_PH_B_ATTN,    /* backward: flash attention backward (dQ, dK, dV) */
    SPARSE_PH_B_KV,      /* backward: dense K/V projection gradients */
    SPARSE_PH_B_Q,       /* backward: dx and dW_q from the selected pairs */
    SPARSE_PH_B_ROUTER,  /* backward: router_backward */
    SPARSE_NPHASE
};
/* Short name of phase i ("router", "kv_gemm", ...). */
const char *sparse_phase_name(int i);

/* Instruction sets of the fp32 tile kernels (sparse_kernels.h), picked at run time. */
typedef enum sp_vec { SP_VEC_PORTABLE = 0, SP_VEC_AVX2 = 1, SP_VEC_AVX512 = 2 } sp_vec;
/* The best this CPU has (cpuid at run time; no errors): SP_VEC_AVX512 with AVX-512 F + DQ, else
 * SP_VEC_AVX2 with AVX2 + FMA, else SP_VEC_PORTABLE. */
int sp_vec_detect(void);

/* Forward activations kept for backward, plus all scratch of both passes: one allocation.
 * Shapes (T = B N, P = T * active heads per token, kvd = h_kv d, nkt = ceil(N / SPARSE_BK)): */
typedef struct sparse_cache {
    int maxB, maxN;      /* capacity given to sparse_cache_init */
    int B, N;            /* shapes of the last forward */
    int nthreads;        /* OpenMP threads the per-thread scratch was sized for */
    int vec;             /* kernels of the fp32 tiles (sp_vec: portable, AVX2 + FMA, AVX-512; set at
                          * init from the CPU, tests may lower it) */
    struct bf16_ctx *bf16; /* bf16 compute (ops/bf16.h, borrowed; NULL: fp32): dense projections
                          * through its bf16 GEMMs, attention tiles in bf16 when bf16_tiles */
    bool bf16_tiles;     /* QK^T and PV tiles with bf16 inputs, fp32 accumulation (vdpbf16ps;
                          * set with bf16 when the CPU has AVX512-BF16) */
    int tiles_isa;       /* bf16_tiles: how their products run (sparse_kernels.h sp_tiles): AMX-BF16
                          * where permitted and MOH_NO_AMX is unset, else vdpbf16ps; tests may set it */
    bool bf16_vec;       /* bf16_tiles: the conversions around them on AVX512-BF16 (else portable) */
    const float *x;      /* [T, C] input of the last forward, borrowed from the caller */
    attn_cache_f32 rc;   /* router activations only: gates [T, h], p, mask, r, ... (att == NULL) */
    float *dgates;       /* [T, h] backward: dL/dgate, 0 for pairs not selected */
    float *rdz;          /* [T, E + 2 + h_s] backward (bf16 compute): d router logits (wg x | wg_0 x |
                          * wg_1 x) */
    float *lbv;          /* [E] backward (bf16 compute): d lb / d p per routed head */
    int *pair_off;       /* [B h + 1] selected pairs of (b, head i): pair_off[b h + i] .. next */
    int *pair_pos;       /* [P] position n of each selected pair, ascending within (b, i) */
    int *tasks;          /* [ntasks_max, 4] (b, head, first pair row, causal cost key) per query
                          * tile; ntasks_max = B h ceil(N / SPARSE_BQ) */
    int ntasks;
    float *q;            /* [P, d] queries of the selected pairs, after bias and RoPE */
    float *o;            /* [P, d] attention output of each selected pair (before the gate) */
    float *og;           /* [P, d] gate * o (the input of W_O) */
    float *smax;         /* [P] the pair's (lazy) running max of its raw scores q.k at the end */
    float *lse;          /* [P] log2 sum_j 2^((q.k_j - smax) cl2), cl2 = log2(e) / sqrt(d): backward
                          * recomputes p_j = 2^((q.k_j - smax) cl2 - lse), exact near the max */
    float *kv;           /* [T, 2 kvd] K|V projections (row layout); backward: dK|dV rows */
    float *kh, *vh;      /* [B, h_kv, N, d] keys (after RoPE) and values, head-contiguous */
    float *kt;           /* [B, h_kv, nkt, d, SPARSE_BK] keys transposed, one block per key tile */
    float *vt;           /* same layout for values (backward) */
    float *qkv;          /* query_norm only: [T, (h + 2 h_kv) d] dense projections; else NULL */
    float *dqkv;         /* query_norm only: [T, (h + 2 h_kv) d] backward scratch; else NULL */
    float *rope_cos;     /* [maxN, d / 2] cos(n inv_freq_j), as ops' rope (NULL without RoPE) */
    float *rope_sin;     /* [maxN, d / 2] */
    float *wpack1;       /* [h d C] packed weights: W_q^i transposed (fwd) / W_O^i columns (bwd) */
    float *wpack2;       /* [h d C] packed weights: W_O^i transposed (fwd) / W_q^i rows (bwd) */
    float *dq;           /* [nparts, P, d] dQ (partial sums per key chunk, reduced into part 0) */
    int nparts;          /* key chunks of the attention backward (fixed by B, h_kv, N only) */
    float *dout;         /* [P, d] backward: dL/d(og), then dL/do */
    float *ddot;         /* [P] backward: rowsum(dL/do * o) */
    float *dkh, *dvh;    /* [B, h_kv, N, d] backward: dK (after RoPE), dV */
    float *ws;           /* [nthreads, ws_floats] per-thread tiles */
    size_t ws_floats;
    void **wptr;         /* [nthreads, 3, ptr_cap] per-thread pointer arrays of the kernels */
    int ptr_cap;
    uint16_t *ktb;       /* bf16_tiles: [B, h_kv, nkt, ceil(d/2), SPARSE_BK, 2] keys of each tile,
                          * pairs of dimensions interleaved (bf16) */
    uint16_t *vtb;       /* bf16_tiles: [B, h_kv, nkt, SPARSE_BK / 2, round16(d), 2] values, pairs
                          * of keys interleaved (bf16) */
    uint16_t *vtbt;      /* bf16_tiles: values in ktb's layout (pairs of dimensions): dO V^T */
    uint16_t *ktbk;      /* bf16_tiles: keys in vtb's layout (pairs of keys): dS K */
    uint16_t *qb16, *dob16; /* bf16_tiles, backward: [P, 2 ceil(d/2)] q and dL/do rows in bf16 */
    uint16_t *qt16, *dot16; /* bf16_tiles, backward: the same per (b, head) transposed: element
                          * (e, r) of the block of pairs off .. off + cnt at off d + e cnt + r */
    uint16_t *wqb;       /* bf16_tiles: [h, ceil(C/2), d, 2] W_q^i, pairs of inputs interleaved */
    uint16_t *wob;       /* bf16_tiles: [h, ceil(d/2), C, 2] W_O^i, pairs of head dims interleaved */
    uint16_t *wob2;      /* bf16_tiles, backward: [h, ceil(C/2), d, 2] W_O^i (d og = dy W_O^i) */
    uint16_t *wqb2;      /* bf16_tiles, backward: [h, ceil(d/2), C, 2] W_q^i (dx += dQ W_q^i) */
    uint16_t *dqt16, *ogt16; /* bf16_tiles, backward: dQ and og per (b, head) transposed, as qt16
                          * (the A operands of dW_q and dW_O) */
    uint16_t *tok16;     /* bf16_tiles: [2, maxB maxN, 2 ceil(C/2)] x (forward, kept for dW_q), then
                          * dy (backward) in bf16 */
    uint16_t *bws;       /* bf16_tiles: [nthreads, bws_n] per-thread probabilities and operand rows */
    size_t bws_n;
    void *bblock;        /* the bf16 buffers' allocation (sparse_cache_set_bf16) */
    double phase_s[SPARSE_NPHASE]; /* wall seconds per phase, accumulated (sparse_phase_name) */
    size_t bytes;        /* total bytes allocated (sparse_cache_bytes) */
    void *block;
} sparse_cache;

/* Pairs per token: the number of heads each token runs (spec §1, §10: h for the "none" router and
 * for a learned router with top_k == 0, whose gates are all non-zero; else h_s + top_k). */
int sparse_active_heads(const moh_attn_config *cfg);

/* The learned router's logits per token (top_k >= 1): nz = E + 2 (h_s >= 1: wg_0) + h_s (h_s >= 2:
 * wg_1) rows of C weights; sparse_router_row gives row j < nz (wg [E, C], then wg_0 [2, C], then
 * wg_1 [h_s, C], row-major) of p (parameters or gradients), whether attn_params_bind left the three
 * adjacent or not. Source: the official MoH code's routers (spec §1). */
int sparse_router_nz(const moh_attn_config *cfg);
float *sparse_router_row(const moh_attn_config *cfg, const attn_params_f32 *p, int j);

/* Bytes sparse_cache_init allocates for batch B, sequence N and nthreads threads: affine in B*N
 * for fixed B (every buffer is O(B N) or O(N) plus per-thread tiles); the reference cache holds
 * two [B, h, N, N] matrices instead. */
size_t sparse_cache_bytes(const moh_attn_config *cfg, int B, int N, int nthreads);

/* Allocates a cache for batches of up to B x N tokens (per-thread scratch for
 * omp_get_max_threads() threads; forward/backward never use more) and fills the RoPE tables.
 * Returns MOH_OK, MOH_E_ARG (B or N < 1), MOH_E_CONFIG (odd head_dim with RoPE) or MOH_E_NOMEM
 * (allocation failed, or B N h d beyond 2^31). cfg must be valid (moh_attn_config_validate). */
int sparse_cache_init(sparse_cache *c, const moh_attn_config *cfg, int B, int N, moh_error *err);
void sparse_cache_free(sparse_cache *c);
/* bf16 compute on c with the GEMM context ctx (NULL: fp32 again): the dense projections through
 * ctx, and, when the CPU has AVX512-BF16, the forward's gathered Q projection, QK^T and PV tiles
 * and W_O scatter on bf16 copies of x, W_q, q, K, V, the probabilities, o and W_O, and the
 * backward's products (d og = dy W_O^i; Q K^T, dO V^T, dV^T += dO^T P, dK^T += Q^T dS, dQ += dS K;
 * dx += dQ W_q^i; dW_O^i += dy^T og, dW_q^i += dQ^T x) on bf16 copies of their operands
 * (head_dim <= SPARSE_BK), all with fp32 accumulation (softmax, max, sums, P and dS computed in
 * fp32; the backward recomputes P from the forward's max and log-sum-exp); the learned router
 * (fp32) split over tokens. MOH_OK or MOH_E_NOMEM (c unchanged). */
int sparse_cache_set_bf16(sparse_cache *c, const moh_attn_config *cfg, struct bf16_ctx *ctx, moh_error *err);
/* The same with the tile products' kind given (sp_tiles; < 0: as sparse_cache_set_bf16 detects):
 * a kind >= 0 turns the bf16 tiles on even on a CPU without AVX512-BF16, with portable kernels
 * around them (tests: the AMX emulation through whole layers on any CPU). */
int sparse_cache_set_bf16_tiles(sparse_cache *c, const moh_attn_config *cfg, struct bf16_ctx *ctx, int tiles_isa,
                                moh_error *err);

/* Head-sparse forward (spec §1): x [B, N, C] -> y [B, N, C]; fills c (gates in c->rc.gates [T, h],
 * c->rc.lb_loss). B <= c->maxB, N <= c->maxN. Same results as attn_forward_f32. */
void sparse_forward_f32(const moh_attn_config *cfg, const attn_params_f32 *prm, const float *x,
                        int B, int N, float *y, sparse_cache *c);

/* Head-sparse backward of L = sum(y * dy) + lb_scale * lb_loss after sparse_forward_f32:
 * ACCUMULATES dx [B, N, C] (may be NULL) and every parameter gradient into g (same layout as
 * prm; NULL fields skipped). Same results as attn_backward_f32. */
void sparse_backward_f32(const moh_attn_config *cfg, const attn_params_f32 *prm,
                         const attn_params_f32 *g, sparse_cache *c, const float *dy,
                         float lb_scale, float *dx);

/* Selected pairs in the last forward (P), and the sum over them of the keys each attends to
 * (N per pair, or position + 1 when causal): the work that must be done, for FLOP counts. */
long sparse_pairs(const moh_attn_config *cfg, const sparse_cache *c);
double sparse_key_visits(const moh_attn_config *cfg, const sparse_cache *c);

/* Attention of one query over n cached keys of one head (KV-cache decode; callers skip the heads
 * a token does not select, spec §10): out[d] = gate * sum_j softmax_j(q.k_j / sqrt(d)) v_j, with
 * key and value rows j at K + j*ld and V + j*ld (RoPE already applied to q and K). scores: [n]
 * scratch. AVX-512 kernels when the CPU has them and d <= 64, else portable loops. */
void sparse_decode_attend_f32(const float *q, const float *K, const float *V, long ld, int n, int d,
                              float gate, float *scores, float *out);

/* Matrix-vector product over column blocks, for one decoded token: out[r] = b[r] +
 * sum_{k < nblk} W[r, blk[k] d : blk[k] d + d] . x[blk[k] d : blk[k] d + d] for r0 <= r < r1.
 * W row-major with row stride ldw floats; b may be NULL. Uses: W_O of the selected heads (blk =
 * their indices, x = og [h, d]: spec §10, skipped heads' W_O columns are never read), and plain rows
 * of W_qkv (blk = {0}, d = C). AVX-512 (4 rows per pass, x loaded once per 4 rows) when the CPU has
 * it, else portable loops. No threads: callers split the rows. */
void sparse_decode_gemv_f32(const float *w, long ldw, const float *b, const float *x, const int *blk,
                            int nblk, int d, int r0, int r1, float *out);

/* bf16 twins of the two decode kernels (bf16 weights and KV cache, fp32 accumulation), in one of
 * three instruction sets picked at run time:
 *  - SPARSE_BF16_DP: vdpbf16ps (AVX512-BF16): the other operand (x, q, probabilities) is rounded
 *    to bf16 too, products of pairs accumulate in fp32;
 *  - SPARSE_BF16_AVX512: AVX-512F/BW without BF16: bf16 widened to fp32 in registers, fp32 FMA
 *    against the fp32 operand;
 *  - SPARSE_BF16_PORTABLE: the same as AVX512 in C loops (any CPU; the slow reference). */
typedef enum sparse_bf16_isa { SPARSE_BF16_PORTABLE = 0, SPARSE_BF16_AVX512 = 1, SPARSE_BF16_DP = 2 } sparse_bf16_isa;
/* The best this CPU has (cpuid at run time; MOH_NO_BF16=1 rules out DP, as bf16_detect). */
sparse_bf16_isa sparse_bf16_isa_detect(void);
/* "vdpbf16ps", "avx512 widen+fma", "portable". */
const char *sparse_bf16_isa_name(sparse_bf16_isa isa);

/* sparse_decode_attend_f32 on a bf16 cache: out[d] = gate * sum_j softmax_j(q.k_j / sqrt(d)) v_j
 * over n keys, q fp32 [d]. Key j: K[j ld .. j ld + d) (bf16, row-major); value j, element e:
 * V[(j / 2) 2 ld + 2 e + j % 2] (bf16, pairs of positions interleaved: vdpbf16ps' layout for
 * P V). Scores and softmax fp32 (scores [n] scratch); DP also rounds q and the probabilities to
 * bf16. AVX-512 kernels for d <= 128, else the portable loops. */
void sparse_decode_attend_bf16(const float *q, const uint16_t *K, const uint16_t *V, long ld, int n, int d,
                               float gate, float *scores, float *out, sparse_bf16_isa isa);

/* Query heads one call takes over one KV head (grouped-query attention's group). */
#define SPARSE_DECODE_GROUP 8
/* Whether sparse_decode_attend_group reads K and V once for all its heads on this CPU for this store
 * (fp32, or bf16 with isa): AVX2 + FMA, d a multiple of 8 up to 64, and no AVX-512 kernel for it
 * (those per-head kernels measured faster where they run: tools/bench/decode_group.c). */
bool sparse_decode_groups(int d, bool b16, sparse_bf16_isa isa);
/* The G (1 .. SPARSE_DECODE_GROUP) query heads of one KV head (grouped-query attention; decode of
 * spec §10's selected heads), as sparse_decode_attend_f32 (b16 false: K, V float [n, ld]) or _bf16 (true, isa: K, V
 * in its layouts) for each head i: out[i] [d] = gate[i] sum_j softmax_j(q[i].k_j / sqrt(d)) v_j,
 * q[i] [d] fp32, scores[i] [n] scratch. Where sparse_decode_groups, each tile of 64 keys and
 * values is read from memory once for all G (then from L1; the same arithmetic per head as one
 * head's call with G = 1); else head by head. No errors (G and n checked by the caller). */
void sparse_decode_attend_group(int G, const float *const *q, const void *K, const void *V, bool b16, long ld, int n,
                                int d, const float *gate, float *const *scores, float *const *out,
                                sparse_bf16_isa isa);

/* sparse_decode_gemv_f32 with bf16 weights: out[r] = b[r] + sum_k W[r, blk[k] d ..+ d] . x[..]
 * (r0 <= r < r1), W bf16 row-major (row stride ldw), b fp32 (may be NULL), x fp32; xb = bf16(x)
 * of the same length, read by SPARSE_BF16_DP only (may be NULL otherwise). 4 rows per pass. */
void sparse_decode_gemv_bf16(const uint16_t *w, long ldw, const float *b, const float *x, const uint16_t *xb,
                             const int *blk, int nblk, int d, int r0, int r1, float *out, sparse_bf16_isa isa);

#endif
