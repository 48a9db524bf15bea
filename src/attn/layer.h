/* One MoH attention layer behind one interface: the router and either compute path, chosen when
 * the layer is made (spec §1; §10 for the head-sparse path):
 *  - reference: every head computed, then gated (attention_impl.h; the definition);
 *  - head-sparse: only the (token, head) pairs the router selects (sparse.h).
 * Both give the same results (tests/test_sparse.c). float32 runs either; float64 (the gradient
 * checks) the reference only. Families hold one per block and call nothing path-specific.
 * Shapes: x, y, dx, dy [B, N, C] row-major (T = B N tokens), parameters as attn_params. */
#ifndef MOH_ATTN_LAYER_H
#define MOH_ATTN_LAYER_H
#include <stdbool.h>

#include "attn/attn.h"
#include "backend/backend.h"

struct sparse_cache;

/* The compute state of one float32 layer for batches of up to maxB x maxN tokens. */
typedef struct attn_layer_f32 {
    attn_cache_f32 ref;       /* reference path: activations kept for backward (zero when sparse) */
    struct sparse_cache *sp;  /* head-sparse path (owned), or NULL: the reference path */
} attn_layer_f32;

/* The float64 twin (reference path only). */
typedef struct attn_layer_f64 {
    attn_cache_f64 ref;
} attn_layer_f64;

/* Allocates the layer's state for batches of up to B x N tokens on the head-sparse path (sparse)
 * or the reference one. MOH_OK; MOH_E_ARG (B or N < 1; sparse in float64), MOH_E_CONFIG (odd
 * head_dim with RoPE, sparse) or MOH_E_NOMEM, with nothing allocated. cfg must be valid. */
int attn_layer_init_f32(attn_layer_f32 *L, const moh_attn_config *cfg, int B, int N, bool sparse, moh_error *err);
int attn_layer_init_f64(attn_layer_f64 *L, const moh_attn_config *cfg, int B, int N, bool sparse, moh_error *err);
void attn_layer_free_f32(attn_layer_f32 *L);
void attn_layer_free_f64(attn_layer_f64 *L);

/* Forward (spec §1): x [B, N, C] -> y [B, N, C] (written); keeps what backward needs (x is
 * borrowed until then). B, N within the capacity given to init. */
void attn_layer_forward_f32(attn_layer_f32 *L, const moh_attn_config *cfg, const attn_params_f32 *p,
                            const float *x, int B, int N, float *y);
void attn_layer_forward_f64(attn_layer_f64 *L, const moh_attn_config *cfg, const attn_params_f64 *p,
                            const double *x, int B, int N, double *y);

/* Backward of sum(y * dy) + lb_scale * lb_loss after forward: ACCUMULATES dx [B, N, C] (may be
 * NULL) and every parameter gradient into g (same layout as p; NULL fields skipped). */
void attn_layer_backward_f32(attn_layer_f32 *L, const moh_attn_config *cfg, const attn_params_f32 *p,
                             const attn_params_f32 *g, const float *dy, float lb_scale, float *dx);
void attn_layer_backward_f64(attn_layer_f64 *L, const moh_attn_config *cfg, const attn_params_f64 *p,
                             const attn_params_f64 *g, const double *dy, double lb_scale, double *dx);

/* The router's activations of the last forward, whichever path ran: gates [T, h] (0 for a head
 * not selected), p and mask [T, E], lb_loss (spec §2). */
const attn_cache_f32 *attn_layer_router_f32(const attn_layer_f32 *L);
const attn_cache_f64 *attn_layer_router_f64(const attn_layer_f64 *L);

/* Compute as cx says (backend.h; borrowed until the next call or free): in bf16, the dense
 * projections as bf16 GEMMs on either path, and on the head-sparse path the attention tiles in
 * bf16 where the CPU has AVX512-BF16 or AMX-BF16 (sparse_cache_set_bf16); fp32 otherwise.
 * MOH_OK or MOH_E_NOMEM. */
int attn_layer_set_compute_f32(attn_layer_f32 *L, const moh_attn_config *cfg, const be_ctx *cx, moh_error *err);

/* The path's own phases (head-sparse: router, kv_gemm, ...; the reference path times none):
 * ADDS the seconds accumulated since the last reset into seconds[0 .. n) and sets names[0 .. n),
 * n = the returned count (<= cap); reset zeroes the layer's counters afterwards. */
int attn_layer_phases_f32(attn_layer_f32 *L, const char **names, double *seconds, int cap, bool reset);

#endif
