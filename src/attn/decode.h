/* The decode side of the attention layer (spec §10, KV-cache decoding one token at a time): the KV
 * store of a model's KV heads, the one-token matrix-vector products over its parameter buffer,
 * the attention of the heads a token selects over their cached keys, and the learned router of
 * one token. Heads a token does not select cost nothing: no q rows, no attention, no W_O columns.
 *
 * Precision is chosen once, at init: fp32, or bf16 (a bf16 copy of the parameter buffer and a
 * bf16 KV store, fp32 accumulation; the instruction set, vdpbf16ps or widened AVX-512 or portable
 * loops, picked at run time inside), or quantised (attn_decode_init_quant: the matrices of a
 * quant_table in ggml's Q8_0 / Q4_0 / Q4_1 blocks times an activation quantised per 32 values, on
 * the integer units; a bf16 KV store; a matrix the table lacks runs fp32). Each product goes to the
 * OpenMP team only when it is worth waking it (attn_decode_calibrate). Callers (models/lm_decode.c)
 * name no kernel or instruction set. */
#ifndef MOH_ATTN_DECODE_H
#define MOH_ATTN_DECODE_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "attn/attn.h"
#include "attn/sparse.h"
#include "ops/bf16.h"
#include "ops/quant.h"

typedef struct attn_decode {
    int max_T;             /* capacity in positions */
    int d;                 /* head_dim */
    int nkv;               /* KV heads stored (layers x n_kv_heads) */
    size_t hstride;        /* elements per stored head: fp32 max_T d; bf16 Tp d, Tp = max_T rounded up to even */
    float *k, *v;          /* fp32: [nkv, max_T, d] keys (after RoPE) and values; bf16, quant: NULL */
    bool bf16;             /* bf16 weights (w16) and a bf16 KV store */
    uint16_t *kb;          /* bf16, quant: [nkv, Tp, d] keys */
    uint16_t *vb;          /* bf16, quant: [nkv, Tp / 2, d, 2] values, positions 2t and 2t + 1 interleaved */
    uint16_t *xb;          /* bf16: [max_in] the current product's input in bf16 (vdpbf16ps) */
    bf16_mirror w16;       /* bf16: copy of the parameter buffer given at init (owned) */
    sparse_bf16_isa isa;   /* bf16 kernels (detected at init; tests may lower it) */
    const quant_table *qt; /* quant: the quantised matrices (borrowed: outlives dc), else NULL */
    quant_act xa;          /* quant: [max_in] the current product's input, quantised per 32 */
    quant_isa qisa;        /* quant kernels (detected at init; tests may lower it) */
    int *ranges;           /* row ranges of head tasks (attn_decode_head_rows) */
    /* Team split (attn_decode_calibrate; 0 until then): a product of at least par_work
     * multiply-adds (attention: ATTN_DECODE_WORK per head, key and element) runs on the OpenMP team,
     * a smaller one on the calling thread. team_s: seconds to start and join the team (median of
     * empty regions); mac_s: seconds per multiply-add of a matrix-vector product on one thread;
     * team_size: threads the calibration's regions got. */
    long par_work;
    double team_s, mac_s;
    int team_size;
} attn_decode;

/* Attention's cost per (head, key, element) in multiply-adds of a matrix-vector product (par_work's
 * unit): measured 2.2x (bf16, `moh bench decode --profile`, small model at context 512). */
#define ATTN_DECODE_WORK 4L

/* A store of nkv heads of head_dim d for max_T positions, products with inputs of up to max_in
 * values and up to max_tasks head tasks per call; bf16 when params (the parameter buffer, n floats,
 * copied to bf16 here once; it must stay unchanged) is given, else fp32. MOH_OK, MOH_E_ARG (a size
 * < 1), MOH_E_NOMEM; nothing allocated on error. */
int attn_decode_init(attn_decode *dc, int nkv, int d, int max_T, size_t max_in, int max_tasks, const float *params,
                     size_t n, moh_error *err);
/* As attn_decode_init with the matrices of qt (its base: the parameter buffer) run from their
 * blocks, every other product fp32, K and V in bf16. qt is borrowed and must outlive dc. MOH_OK,
 * MOH_E_ARG, MOH_E_NOMEM; nothing allocated on error. */
int attn_decode_init_quant(attn_decode *dc, int nkv, int d, int max_T, size_t max_in, int max_tasks,
                           const quant_table *qt, moh_error *err);
void attn_decode_free(attn_decode *dc);
/* A bf16 or quantised store runs only the parameter buffer it was built for: MOH_E_ARG otherwise. */
int attn_decode_check(const attn_decode *dc, const float *params, size_t n, moh_error *err);

/* Stores n positions pos .. pos + n (< max_T) of head (layer l, KV head g: l n_kv_heads + g): k,
 * v [n, d] float32 rows, rounded to bf16 in a bf16 store. */
void attn_decode_write(attn_decode *dc, int head, int pos, int n, const float *k, const float *v);

/* out[O] = W x + b for W [O, I] (nn.Linear, one token; W in the parameter buffer). b may be NULL. */
void attn_decode_linear(attn_decode *dc, float *out, const float *x, const float *w, const float *b, int I, int O);
/* out[R] = b + sum over the nblk column blocks blk of W[:, blk d .. blk d + d] x[blk d ..]: W [R,
 * ldw] row-major. W_O of the selected heads (x = og [h d]: the columns of skipped heads are never
 * read). b may be NULL. */
void attn_decode_blocks(attn_decode *dc, float *out, const float *w, long ldw, const float *b, const float *x,
                        const int *blk, int nblk, int d, int R);
/* The d rows of every task head t (task[0..ntask), ascending) of W [*, C] times x [C] plus b into
 * out (row t d .. t d + d); rows of other heads untouched. Adjacent heads' rows go in one product. */
void attn_decode_head_rows(attn_decode *dc, float *out, const float *w, const float *b, const float *x,
                           const int *task, int ntask, int d, int C);

/* Attention of the nsel query heads sel[] of one token over positions 0 .. pos of layer l (its
 * n_kv_heads KV heads from head l n_kv_heads; grp query heads per KV head): head i reads q [i d ..],
 * writes gates[i] times its output to og [i d ..]; scores [h, max_T] scratch. */
void attn_decode_attend(attn_decode *dc, int l, int n_kv_heads, int grp, const int *sel, int nsel, int pos,
                        const float *q, const float *gates, float *scores, float *og);

/* The learned router's gates of one token x [C] into r->gates [h] (spec §1, §10): logits by fp32
 * dot products on this thread, then router_learned_rows; top_k = 0 goes through router_forward_f32.
 * The logits can differ from the batched router's GEMM in the last bit (another summation order),
 * so a near tie may select another head. No load-balance loss. r: an attn_cache for B = N = 1. */
void attn_decode_route(const moh_attn_config *a, const attn_params_f32 *p, const float *x, attn_cache_f32 *r);

/* Measures what waking the OpenMP team costs against one thread's rate on W [rows, C] (x [C], out
 * [rows] scratch) and sets the team split: split when W mac_s (1 - 1 / n) > team_s. ~1 ms. */
void attn_decode_calibrate(attn_decode *dc, const float *w, int rows, int C, float *x, float *out);
/* dst splits as src does (benches comparing models on one rule). */
void attn_decode_copy_split(attn_decode *dst, const attn_decode *src);
/* "team of N: start-up X us, one thread Y GMAC/s: split from W multiply-adds", or not calibrated. */
void attn_decode_describe_split(const attn_decode *dc, char *out, size_t cap);
/* "fp32", "bf16 weights and KV cache, <kernels> kernels, fp32 accumulation (...)", or the
 * quantised matrices, their kernels and the bf16 KV cache. */
void attn_decode_describe(const attn_decode *dc, char *out, size_t cap);
/* The precision decoding runs when `asked` is asked for: bf16 on a CPU with AVX-512F/BW, else fp32
 * with why[cap] saying so ("" when nothing was refused). */
moh_precision attn_decode_precision(moh_precision asked, char *why, size_t cap);
#endif
