/* The public one-layer API of include/moh.h (moh_attn_layer_*): an opaque handle over the
 * attention-layer object (attn/layer.h) on the CPU backend, the head-sparse path where it runs the
 * config, else the reference path. */
#include <stdlib.h>
#include <string.h>

#include "attn/layer.h"
#include "moh.h"

struct moh_attn_layer {
    moh_attn_config cfg;
    attn_layer_f32 L;
    be_ctx cx;       /* fp32, or bf16 with an empty weight mirror (every operand rounded on the fly) */
    bf16_mirror none;
    int maxB, maxN;
    bool fwd;        /* a forward has run: backward and the gates read its state */
};

void moh_attn_layer_has(const moh_attn_config *cfg, bool has[7]) {
    has[0] = true;
    has[1] = cfg->qkv_bias;
    has[2] = true;
    has[3] = cfg->proj_bias;
    has[4] = attn_has_wg(cfg);
    has[5] = attn_has_wg0(cfg);
    has[6] = attn_has_wg1(cfg);
}

int moh_attn_layer_new(moh_attn_layer **out, const moh_attn_config *cfg, int max_B, int max_N, moh_error *err) {
    if (!out || !cfg) return moh_fail(err, MOH_E_ARG, "moh_attn_layer_new: NULL argument (out, cfg)");
    *out = NULL;
    int rc = moh_attn_config_validate(cfg, "moh_attn_layer_new", err);
    if (rc) return rc;
    if (max_B < 1 || max_N < 1)
        return moh_fail(err, MOH_E_ARG, "moh_attn_layer_new: max_B=%d max_N=%d, both must be >= 1", max_B, max_N);
    moh_attn_layer *l = calloc(1, sizeof *l);
    if (!l) return moh_fail(err, MOH_E_NOMEM, "moh_attn_layer_new: out of memory");
    l->cfg = *cfg;
    be_ctx_init(&l->cx, NULL);
    l->maxB = max_B;
    l->maxN = max_N;
    rc = attn_layer_init_f32(&l->L, NULL, &l->cfg, max_B, max_N, true, err);
    if (rc == MOH_E_CONFIG) rc = attn_layer_init_f32(&l->L, NULL, &l->cfg, max_B, max_N, false, err);
    if (rc) {
        free(l);
        return rc;
    }
    *out = l;
    return MOH_OK;
}

void moh_attn_layer_free(moh_attn_layer *l) {
    if (!l) return;
    attn_layer_free_f32(&l->L);
    be_ctx_release(&l->cx);
    free(l);
}

/* p's views of w (const dropped: forward and backward only read them). MOH_E_ARG when a tensor
 * the config has is NULL, or one it lacks is given. */
static int bind(const moh_attn_config *cfg, const moh_attn_weights *w, attn_params_f32 *p, const char *fn,
                moh_error *err) {
    static const char *const names[7] = {"qkv.weight", "qkv.bias", "proj.weight", "proj.bias",
                                         "wg.weight",  "wg_0.weight", "wg_1.weight"};
    const float *v[7] = {w->w_qkv, w->b_qkv, w->w_o, w->b_o, w->wg, w->wg_0, w->wg_1};
    bool has[7];
    moh_attn_layer_has(cfg, has);
    for (int i = 0; i < 7; i++)
        if (has[i] != (v[i] != NULL))
            return moh_fail(err, MOH_E_ARG, "%s: %s is %s, expected %s for this config", fn, names[i],
                            v[i] ? "given" : "NULL", has[i] ? "a tensor" : "NULL");
    *p = (attn_params_f32){(float *)w->w_qkv, (float *)w->b_qkv, (float *)w->w_o, (float *)w->b_o,
                           (float *)w->wg,    (float *)w->wg_0,  (float *)w->wg_1};
    return MOH_OK;
}

int moh_attn_layer_forward(moh_attn_layer *l, const moh_attn_weights *w, const float *x, int B, int N, float *y,
                           float *lb, moh_error *err) {
    if (!l || !w || !x || !y) return moh_fail(err, MOH_E_ARG, "moh_attn_layer_forward: NULL argument (l, w, x, y)");
    if (B < 1 || B > l->maxB || N < 1 || N > l->maxN)
        return moh_fail(err, MOH_E_ARG, "moh_attn_layer_forward: B=%d N=%d, expected 1..%d and 1..%d (the layer's capacity)",
                        B, N, l->maxB, l->maxN);
    attn_params_f32 p;
    const int rc = bind(&l->cfg, w, &p, "moh_attn_layer_forward", err);
    if (rc) return rc;
    attn_layer_forward_f32(&l->L, &l->cfg, &p, x, B, N, y);
    l->fwd = true;
    if (lb) *lb = attn_layer_router_f32(&l->L)->lb_loss;
    return MOH_OK;
}

int moh_attn_layer_backward(moh_attn_layer *l, const moh_attn_weights *w, const moh_attn_grads *g,
                            const float *dy, float lb_scale, float *dx, moh_error *err) {
    if (!l || !w || !g || !dy) return moh_fail(err, MOH_E_ARG, "moh_attn_layer_backward: NULL argument (l, w, g, dy)");
    if (!l->fwd) return moh_fail(err, MOH_E_ARG, "moh_attn_layer_backward: no forward before it");
    attn_params_f32 p;
    const int rc = bind(&l->cfg, w, &p, "moh_attn_layer_backward", err);
    if (rc) return rc;
    const attn_params_f32 gp = {g->w_qkv, g->b_qkv, g->w_o, g->b_o, g->wg, g->wg_0, g->wg_1};
    attn_layer_backward_f32(&l->L, &l->cfg, &p, &gp, dy, lb_scale, dx);
    return MOH_OK;
}

int moh_attn_layer_set_bf16(moh_attn_layer *l, bool bf16, moh_error *err) {
    if (!l) return moh_fail(err, MOH_E_ARG, "moh_attn_layer_set_bf16: NULL layer");
    const int rc = be_ctx_set_weights(&l->cx, bf16 ? &l->none : NULL, err);
    return rc ? rc : attn_layer_set_compute_f32(&l->L, &l->cfg, &l->cx, err);
}

const float *moh_attn_layer_gates(const moh_attn_layer *l) {
    return l && l->fwd ? attn_layer_router_f32(&l->L)->gates : NULL;
}
