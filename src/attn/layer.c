/* The attention-layer object (layer.h): float32 calls go to the layer's backend (backend.h); the
 * CPU backend's layer (attn_cpu_*, named in its table) switches between the reference path
 * (attention_impl.h) and the head-sparse path (sparse.c). float64 is the host reference path. */
#include "attn/layer.h"

#include <stdlib.h>
#include <string.h>

#include "attn/sparse.h"

int attn_cpu_init(attn_layer_f32 *L, const moh_attn_config *cfg, int B, int N, bool sparse, moh_error *err) {
    if (!sparse) return attn_cache_init_f32(&L->ref, cfg, B, N, err);
    sparse_cache *sp = calloc(1, sizeof *sp);
    if (!sp) return moh_fail(err, MOH_E_NOMEM, "attention: cannot allocate the head-sparse cache");
    const int rc = sparse_cache_init(sp, cfg, B, N, err);
    if (rc) {
        free(sp);
        return rc;
    }
    L->sp = sp;
    return MOH_OK;
}

int attn_layer_init_f64(attn_layer_f64 *L, const moh_backend *be, const moh_attn_config *cfg, int B, int N,
                        bool sparse, moh_error *err) {
    (void)be; /* the host */
    memset(L, 0, sizeof *L);
    if (sparse) return moh_fail(err, MOH_E_ARG, "attention: the head-sparse path is float32 only");
    return attn_cache_init_f64(&L->ref, cfg, B, N, err);
}

void attn_cpu_free(attn_layer_f32 *L) {
    if (L->sp) {
        sparse_cache_free(L->sp);
        free(L->sp);
    } else {
        attn_cache_free_f32(&L->ref);
    }
}

void attn_layer_free_f64(attn_layer_f64 *L) {
    attn_cache_free_f64(&L->ref);
    memset(L, 0, sizeof *L);
}

void attn_cpu_forward(attn_layer_f32 *L, const moh_attn_config *cfg, const attn_params_f32 *p,
                            const float *x, int B, int N, float *y) {
    if (L->sp) sparse_forward_f32(cfg, p, x, B, N, y, L->sp);
    else attn_forward_f32(cfg, p, x, B, N, y, &L->ref);
}

void attn_layer_forward_f64(attn_layer_f64 *L, const moh_attn_config *cfg, const attn_params_f64 *p,
                            const double *x, int B, int N, double *y) {
    attn_forward_f64(cfg, p, x, B, N, y, &L->ref);
}

void attn_cpu_backward(attn_layer_f32 *L, const moh_attn_config *cfg, const attn_params_f32 *p,
                             const attn_params_f32 *g, const float *dy, float lb_scale, float *dx) {
    if (L->sp) sparse_backward_f32(cfg, p, g, L->sp, dy, lb_scale, dx);
    else attn_backward_f32(cfg, p, g, &L->ref, dy, lb_scale, dx);
}

void attn_layer_backward_f64(attn_layer_f64 *L, const moh_attn_config *cfg, const attn_params_f64 *p,
                             const attn_params_f64 *g, const double *dy, double lb_scale, double *dx) {
    attn_backward_f64(cfg, p, g, &L->ref, dy, lb_scale, dx);
}

const attn_cache_f32 *attn_cpu_router(const attn_layer_f32 *L) { return L->sp ? &L->sp->rc : &L->ref; }
const attn_cache_f64 *attn_layer_router_f64(const attn_layer_f64 *L) { return &L->ref; }

bool attn_cpu_kv(const attn_layer_f32 *L, const moh_attn_config *cfg, int g, int N, const float **k,
                       const float **v) {
    if (!L->sp) return false;
    const size_t off = (size_t)g * N * cfg->head_dim;
    *k = L->sp->kh + off;
    *v = L->sp->vh + off;
    return true;
}

long attn_cpu_pairs(const attn_layer_f32 *L, const moh_attn_config *cfg) {
    return L->sp ? sparse_pairs(cfg, L->sp) : (long)L->ref.B * L->ref.N * cfg->n_heads;
}

int attn_cpu_set_compute(attn_layer_f32 *L, const moh_attn_config *cfg, const be_ctx *cx, moh_error *err) {
    bf16_ctx *ctx = be_cpu_bf16(cx);
    if (L->sp) return sparse_cache_set_bf16(L->sp, cfg, ctx, err);
    L->ref.bf16 = ctx;
    return MOH_OK;
}

#define F(x) x##_f32
#define real float
#include "attn/layer_stack_impl.h"
#undef real
#undef F
#define F(x) x##_f64
#define real double
#include "attn/layer_stack_impl.h"
#undef real
#undef F

int attn_stack_set_weights_f32(attn_stack_f32 *s, const bf16_mirror *w, moh_error *err) {
    int rc = be_ctx_set_weights(&s->cx, w, err);
    for (int l = 0; !rc && l < s->n; l++)
        rc = attn_layer_set_compute_f32(&s->layer[l], &s->cfg[s->per_layer ? l : 0], &s->cx, err);
    return rc;
}

int attn_cpu_phases(attn_layer_f32 *L, const char **names, double *seconds, int cap, bool reset) {
    if (!L->sp) return 0;
    int n = 0;
    for (; n < SPARSE_NPHASE && n < cap; n++) {
        names[n] = sparse_phase_name(n);
        seconds[n] += L->sp->phase_s[n];
    }
    if (reset) memset(L->sp->phase_s, 0, sizeof L->sp->phase_s);
    return n;
}

/* ---- the object: float32 through the layer's backend ---------------------------------------- */

int attn_layer_init_f32(attn_layer_f32 *L, const moh_backend *be, const moh_attn_config *cfg, int B, int N,
                        bool sparse, moh_error *err) {
    memset(L, 0, sizeof *L);
    L->be = be ? be : backend_get(MOH_DEVICE_CPU);
    if (!L->be->attn_init)
        return moh_fail(err, MOH_E_DEVICE, "attention: the %s backend has no attention layer yet", L->be->name);
    const int rc = L->be->attn_init(L, cfg, B, N, sparse, err);
    if (rc) memset(L, 0, sizeof *L);
    return rc;
}

void attn_layer_free_f32(attn_layer_f32 *L) {
    if (L->be) L->be->attn_free(L);
    memset(L, 0, sizeof *L);
}

void attn_layer_forward_f32(attn_layer_f32 *L, const moh_attn_config *cfg, const attn_params_f32 *p,
                            const float *x, int B, int N, float *y) {
    L->be->attn_forward(L, cfg, p, x, B, N, y);
}

void attn_layer_backward_f32(attn_layer_f32 *L, const moh_attn_config *cfg, const attn_params_f32 *p,
                             const attn_params_f32 *g, const float *dy, float lb_scale, float *dx) {
    L->be->attn_backward(L, cfg, p, g, dy, lb_scale, dx);
}

const attn_cache_f32 *attn_layer_router_f32(const attn_layer_f32 *L) { return L->be->attn_router(L); }

bool attn_layer_kv_f32(const attn_layer_f32 *L, const moh_attn_config *cfg, int g, int N, const float **k,
                       const float **v) {
    return L->be->attn_kv(L, cfg, g, N, k, v);
}

long attn_layer_pairs_f32(const attn_layer_f32 *L, const moh_attn_config *cfg) { return L->be->attn_pairs(L, cfg); }

int attn_layer_set_compute_f32(attn_layer_f32 *L, const moh_attn_config *cfg, const be_ctx *cx, moh_error *err) {
    return L->be->attn_set_compute(L, cfg, cx, err);
}

int attn_layer_phases_f32(attn_layer_f32 *L, const char **names, double *seconds, int cap, bool reset) {
    return L->be->attn_phases(L, names, seconds, cap, reset);
}
