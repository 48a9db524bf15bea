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
    const moh_backend *be;    /* the device the layer runs on (its table's attn_* members) */
    /* the CPU backend's state (attn_cpu_*): */
    attn_cache_f32 ref;       /* reference path: activations kept for backward (zero when sparse) */
    struct sparse_cache *sp;  /* head-sparse path (owned), or NULL: the reference path */
    void *dev;                /* another backend's state */
} attn_layer_f32;

/* The float64 twin (reference path only). */
typedef struct attn_layer_f64 {
    attn_cache_f64 ref;
} attn_layer_f64;

/* Allocates the layer's state on backend be (NULL: the CPU; float64: the host, be ignored) for
 * batches of up to B x N tokens on the head-sparse path (sparse) or the reference one. MOH_OK;
 * MOH_E_ARG (B or N < 1; sparse in float64), MOH_E_CONFIG (odd head_dim with RoPE, sparse),
 * MOH_E_NOMEM, or MOH_E_DEVICE (a backend without the layer), with nothing allocated. */
int attn_layer_init_f32(attn_layer_f32 *L, const moh_backend *be, const moh_attn_config *cfg, int B, int N,
                        bool sparse, moh_error *err);
int attn_layer_init_f64(attn_layer_f64 *L, const moh_backend *be, const moh_attn_config *cfg, int B, int N,
                        bool sparse, moh_error *err);
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

/* Keys (after RoPE) and values of KV head g from the last forward of one sequence (B = 1) of N
 * tokens: [N, head_dim] rows each, valid until the next forward. Head-sparse path only (it keeps
 * them head-major); false on the reference path. For prefilling a KV cache. */
bool attn_layer_kv_f32(const attn_layer_f32 *L, const moh_attn_config *cfg, int g, int N, const float **k,
                       const float **v);
/* (token, head) pairs the last forward computed: the selected ones on the head-sparse path, every
 * one (T h) on the reference path. */
long attn_layer_pairs_f32(const attn_layer_f32 *L, const moh_attn_config *cfg);

/* Compute as cx says (backend.h; borrowed until the next call or free): in bf16, the dense
 * projections as bf16 GEMMs on either path, and on the head-sparse path the attention tiles in
 * bf16 where the CPU has AVX512-BF16 or AMX-BF16 (sparse_cache_set_bf16); fp32 otherwise.
 * MOH_OK or MOH_E_NOMEM. */
int attn_layer_set_compute_f32(attn_layer_f32 *L, const moh_attn_config *cfg, const be_ctx *cx, moh_error *err);

/* The CPU backend's attention layer (its table's attn_* members; layer.c). */
int attn_cpu_init(attn_layer_f32 *L, const moh_attn_config *cfg, int B, int N, bool sparse, moh_error *err);
void attn_cpu_free(attn_layer_f32 *L);
void attn_cpu_forward(attn_layer_f32 *L, const moh_attn_config *cfg, const attn_params_f32 *p, const float *x, int B,
                      int N, float *y);
void attn_cpu_backward(attn_layer_f32 *L, const moh_attn_config *cfg, const attn_params_f32 *p,
                       const attn_params_f32 *g, const float *dy, float lb_scale, float *dx);
const attn_cache_f32 *attn_cpu_router(const attn_layer_f32 *L);
bool attn_cpu_kv(const attn_layer_f32 *L, const moh_attn_config *cfg, int g, int N, const float **k, const float **v);
long attn_cpu_pairs(const attn_layer_f32 *L, const moh_attn_config *cfg);
int attn_cpu_set_compute(attn_layer_f32 *L, const moh_attn_config *cfg, const be_ctx *cx, moh_error *err);
int attn_cpu_phases(attn_layer_f32 *L, const char **names, double *seconds, int cap, bool reset);

/* A model's attention layers and the compute context its ops share. Every family's activations
 * begin with one (the f32 twin in the float32 instantiation), so generic code (models/model.c)
 * reaches the gates, the load-balance loss and the compute settings of any family through it. */
typedef struct attn_stack_f32 {
    be_ctx cx;                  /* backend and precision of the model's ops (backend.h) */
    attn_layer_f32 *layer;      /* [n] */
    int n;                      /* layers made (all of them after a successful init) */
    const moh_attn_config *cfg; /* layer l's config: cfg[per_layer ? l : 0] (borrowed from the model) */
    bool per_layer;
    float *acts;                /* the family's activation block, its views set by attn_stack_init_acts */
} attn_stack_f32;
typedef struct attn_stack_f64 {
    be_ctx cx;                  /* (float64 runs the host ops; kept for the templates' calls) */
    attn_layer_f64 *layer;
    int n;
    const moh_attn_config *cfg;
    bool per_layer;
    double *acts;
} attn_stack_f64;

/* L layers for batches of up to B x N tokens on the CPU backend in fp32, layer l configured by
 * cfg[per_layer ? l : 0] (cfg must outlive s), on the head-sparse path when sparse. MOH_OK or
 * attn_layer_init's errors; on error the layers made so far stay for attn_stack_free. */
int attn_stack_init_f32(attn_stack_f32 *s, int L, const moh_attn_config *cfg, bool per_layer, int B, int N,
                        bool sparse, moh_error *err);
int attn_stack_init_f64(attn_stack_f64 *s, int L, const moh_attn_config *cfg, bool per_layer, int B, int N,
                        bool sparse, moh_error *err);
/* A family's activations: one block of sizes[i] values per view *fields[i] (i < n, row-major as
 * the family lays them out), owned by s, then attn_stack_init's L layers for B x N tokens. what
 * names the family in the error. MOH_OK, MOH_E_NOMEM ("<what>: cannot allocate activations ...")
 * or attn_layer_init's errors; on error everything is freed again (attn_stack_free). */
int attn_stack_init_acts_f32(attn_stack_f32 *s, float **const *fields, const size_t *sizes, size_t n, int L,
                             const moh_attn_config *cfg, bool per_layer, int B, int N, bool sparse,
                             const char *what, moh_error *err);
int attn_stack_init_acts_f64(attn_stack_f64 *s, double **const *fields, const size_t *sizes, size_t n, int L,
                             const moh_attn_config *cfg, bool per_layer, int B, int N, bool sparse,
                             const char *what, moh_error *err);
/* Frees the layers, then the compute context they borrow, then the activation block (a zeroed s
 * is fine). */
void attn_stack_free_f32(attn_stack_f32 *s);
void attn_stack_free_f64(attn_stack_f64 *s);
/* Precision of the stack's ops and layers: bf16 with w (the bf16 copy of the parameter buffer,
 * kept in sync by the caller), fp32 with w == NULL (be_ctx_set_weights, attn_layer_set_compute).
 * MOH_OK or MOH_E_NOMEM. */
int attn_stack_set_weights_f32(attn_stack_f32 *s, const bf16_mirror *w, moh_error *err);
/* Layer l's router activations of the last forward (attn_layer_router). */
static inline const attn_cache_f32 *attn_stack_router_f32(const attn_stack_f32 *s, int l) {
    return attn_layer_router_f32(&s->layer[l]);
}

/* The path's own phases (head-sparse: router, kv_gemm, ...; the reference path times none):
 * ADDS the seconds accumulated since the last reset into seconds[0 .. n) and sets names[0 .. n),
 * n = the returned count (<= cap); reset zeroes the layer's counters afterwards. */
int attn_layer_phases_f32(attn_layer_f32 *L, const char **names, double *seconds, int cap, bool reset);

#endif
