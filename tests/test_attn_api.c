/* The public one-layer API (moh.h moh_attn_layer_*, what python/moh/torch.py calls) against the
 * float64 reference layer (attn/attn.h attn_forward_f64 / attn_backward_f64) on random configs,
 * weights and inputs: forward, load-balance loss, dx and every weight gradient; bf16 compute
 * close to it; reuse of one handle for a smaller batch; the argument checks. */
#include <string.h>

#include "attn/attn.h"
#include "moh.h"
#include "test_util.h"

static void fill(test_rng *r, float *f, double *d, size_t n, double scale) {
    for (size_t i = 0; i < n; i++) {
        f[i] = (float)(scale * test_rng_uniform(r));
        d[i] = f[i];
    }
}

/* One config: B x N tokens through a handle made for maxB x maxN. */
static void run_case(test_ctx *t, const char *name, moh_attn_config cfg, int maxB, int maxN, int B, int N,
                     uint64_t seed) {
    test_rng r = {seed};
    moh_error err;
    const int C = cfg.hidden_size;
    const size_t np = attn_params_bind_f32(&(attn_params_f32){0}, NULL, &cfg);
    const size_t nx = (size_t)B * N * C;
    float *wf = malloc(np * sizeof *wf), *gf = calloc(np, sizeof *gf);
    double *wd = malloc(np * sizeof *wd), *gd = calloc(np, sizeof *gd);
    float *x = malloc(nx * sizeof *x), *dy = malloc(nx * sizeof *dy), *y = malloc(nx * sizeof *y);
    float *dx = calloc(nx, sizeof *dx);
    double *xd = malloc(nx * sizeof *xd), *dyd = malloc(nx * sizeof *dyd), *yd = malloc(nx * sizeof *yd);
    double *dxd = calloc(nx, sizeof *dxd);
    fill(&r, wf, wd, np, 0.3);
    fill(&r, x, xd, nx, 1.0);
    fill(&r, dy, dyd, nx, 1.0);
    attn_params_f32 pf, gpf;
    attn_params_f64 pd, gpd;
    attn_params_bind_f32(&pf, wf, &cfg);
    attn_params_bind_f32(&gpf, gf, &cfg);
    attn_params_bind_f64(&pd, wd, &cfg);
    attn_params_bind_f64(&gpd, gd, &cfg);

    attn_cache_f64 c;
    CHECK(t, attn_cache_init_f64(&c, &cfg, B, N, &err) == MOH_OK, "%s: cache", name);
    attn_forward_f64(&cfg, &pd, xd, B, N, yd, &c);
    const double beta = 0.37;
    attn_backward_f64(&cfg, &pd, &gpd, &c, dyd, beta, dxd);

    moh_attn_layer *l = NULL;
    CHECK(t, moh_attn_layer_new(&l, &cfg, maxB, maxN, &err) == MOH_OK, "%s: new: %s", name, err.msg);
    const moh_attn_weights w = {pf.w_qkv, pf.b_qkv, pf.w_o, pf.b_o, pf.w_r, pf.w_h, pf.w_s};
    const moh_attn_grads g = {gpf.w_qkv, gpf.b_qkv, gpf.w_o, gpf.b_o, gpf.w_r, gpf.w_h, gpf.w_s};
    float lb = -1.f;
    CHECK(t, moh_attn_layer_forward(l, &w, x, B, N, y, &lb, &err) == MOH_OK, "%s: forward: %s", name, err.msg);
    CHECK(t, moh_attn_layer_backward(l, &w, &g, dy, (float)beta, dx, &err) == MOH_OK, "%s: backward: %s", name,
          err.msg);
    double *tmp = malloc((np > nx ? np : nx) * sizeof *tmp);
    for (size_t i = 0; i < nx; i++) tmp[i] = y[i];
    double e = test_rel_err_f64(tmp, yd, (long)nx);
    CHECK(t, e < 2e-5, "%s: y rel err %.2e", name, e);
    CHECK(t, fabs(lb - c.lb_loss) <= 1e-5 * fmax(1.0, fabs(c.lb_loss)), "%s: lb %g vs %g", name, lb, c.lb_loss);
    for (size_t i = 0; i < nx; i++) tmp[i] = dx[i];
    e = test_rel_err_f64(tmp, dxd, (long)nx);
    CHECK(t, e < 2e-5, "%s: dx rel err %.2e", name, e);
    for (size_t i = 0; i < np; i++) tmp[i] = gf[i];
    e = test_rel_err_f64(tmp, gd, (long)np);
    CHECK(t, e < 2e-5, "%s: weight gradients rel err %.2e", name, e);
    const float *gates = moh_attn_layer_gates(l);
    CHECK(t, gates != NULL, "%s: gates", name);
    if (gates) {
        double ge = 0;
        for (long i = 0; i < (long)B * N * cfg.n_heads; i++) ge = fmax(ge, fabs(gates[i] - c.gates[i]));
        CHECK(t, ge < 1e-5, "%s: gates max err %.2e", name, ge);
    }

    /* bf16 compute: same shapes, close to float64 */
    CHECK(t, moh_attn_layer_set_bf16(l, true, &err) == MOH_OK, "%s: set_bf16: %s", name, err.msg);
    CHECK(t, moh_attn_layer_forward(l, &w, x, B, N, y, NULL, &err) == MOH_OK, "%s: bf16 forward", name);
    for (size_t i = 0; i < nx; i++) tmp[i] = y[i];
    e = test_rel_err_f64(tmp, yd, (long)nx);
    CHECK(t, e < 3e-2, "%s: bf16 y rel err %.2e", name, e);
    CHECK(t, moh_attn_layer_set_bf16(l, false, &err) == MOH_OK, "%s: back to fp32", name);
    CHECK(t, moh_attn_layer_forward(l, &w, x, B, N, y, NULL, &err) == MOH_OK, "%s: fp32 forward", name);
    for (size_t i = 0; i < nx; i++) tmp[i] = y[i];
    e = test_rel_err_f64(tmp, yd, (long)nx);
    CHECK(t, e < 2e-5, "%s: fp32 again: y rel err %.2e", name, e);

    printf("%s: checked (B=%d N=%d in a %dx%d layer)\n", name, B, N, maxB, maxN);
    moh_attn_layer_free(l);
    attn_cache_free_f64(&c);
    free(tmp);
    free(wf), free(gf), free(wd), free(gd), free(x), free(dy), free(y), free(dx), free(xd), free(dyd), free(yd);
    free(dxd);
}

static moh_attn_config vit_like(int C, int h, int d, int hs, int k, moh_router router) {
    moh_attn_config c;
    moh_attn_config_default(&c);
    c.hidden_size = C, c.n_heads = h, c.n_kv_heads = h, c.head_dim = d;
    c.shared_heads = hs, c.top_k = k, c.router = router;
    c.qkv_bias = c.proj_bias = c.fused_qkv = true;
    return c;
}

static void errors(test_ctx *t) {
    moh_error err;
    moh_attn_layer *l = NULL;
    moh_attn_config bad = vit_like(32, 4, 8, 1, 5, MOH_ROUTER_LEARNED); /* top_k 5 > 3 routed heads */
    CHECK(t, moh_attn_layer_new(&l, &bad, 1, 4, &err) == MOH_E_CONFIG && l == NULL, "bad config: %s", err.msg);
    moh_attn_config cfg = vit_like(32, 4, 8, 1, 2, MOH_ROUTER_LEARNED);
    CHECK(t, moh_attn_layer_new(&l, &cfg, 0, 4, &err) == MOH_E_ARG, "max_B 0");
    CHECK(t, moh_attn_layer_new(&l, &cfg, 2, 4, &err) == MOH_OK, "new");
    float buf[(4 + 2 * 4) * 8 * 32] = {0}; /* the largest tensor: w_qkv [(h + 2 h_kv) d, C]; also x, y */
    test_rng r = {7};
    for (size_t i = 0; i < sizeof buf / sizeof *buf; i++) buf[i] = (float)test_rng_uniform(&r);
    float y[2 * 4 * 32];
    moh_attn_weights w = {buf, buf, buf, buf, buf, buf, NULL}; /* this config has no wg_1 */
    moh_attn_grads g = {0};
    CHECK(t, moh_attn_layer_backward(l, &w, &g, y, 0.f, NULL, &err) == MOH_E_ARG && strstr(err.msg, "no forward"),
          "backward first: %s", err.msg);
    CHECK(t, moh_attn_layer_forward(l, &w, buf, 3, 4, y, NULL, &err) == MOH_E_ARG && strstr(err.msg, "capacity"),
          "B over capacity: %s", err.msg);
    w.wg = NULL;
    CHECK(t, moh_attn_layer_forward(l, &w, buf, 1, 4, y, NULL, &err) == MOH_E_ARG && strstr(err.msg, "wg.weight"),
          "missing wg: %s", err.msg);
    w.wg = buf, w.wg_1 = buf;
    CHECK(t, moh_attn_layer_forward(l, &w, buf, 1, 4, y, NULL, &err) == MOH_E_ARG && strstr(err.msg, "wg_1.weight"),
          "extra wg_1: %s", err.msg);
    w.wg_1 = NULL;
    CHECK(t, moh_attn_layer_forward(l, &w, NULL, 1, 4, y, NULL, &err) == MOH_E_ARG, "NULL x");
    CHECK(t, moh_attn_layer_forward(l, &w, buf, 1, 4, y, NULL, &err) == MOH_OK, "forward: %s", err.msg);
    moh_attn_layer_free(l);
    moh_attn_layer_free(NULL);
    CHECK(t, moh_attn_layer_gates(NULL) == NULL, "gates of NULL");
}

int main(void) {
    test_ctx t = {0};
    run_case(&t, "learned h8 s2 k3", vit_like(64, 8, 8, 2, 3, MOH_ROUTER_LEARNED), 2, 40, 2, 37, 1);
    run_case(&t, "learned h6 s1 k2 (smaller batch)", vit_like(48, 6, 8, 1, 2, MOH_ROUTER_LEARNED), 3, 64, 2, 29, 2);
    run_case(&t, "learned h4 s0 k2", vit_like(32, 4, 8, 0, 2, MOH_ROUTER_LEARNED), 1, 50, 1, 50, 3);
    run_case(&t, "shared only", vit_like(32, 4, 8, 4, 0, MOH_ROUTER_LEARNED), 2, 20, 2, 20, 4);
    run_case(&t, "dense", vit_like(32, 4, 8, 0, 0, MOH_ROUTER_NONE), 2, 20, 2, 17, 5);
    moh_attn_config lm = vit_like(64, 8, 8, 2, 3, MOH_ROUTER_QUERY_NORM);
    lm.causal = true, lm.rope_theta = 10000.0, lm.n_kv_heads = 2, lm.qkv_bias = lm.proj_bias = false;
    lm.fused_qkv = false;
    run_case(&t, "query_norm GQA causal RoPE", lm, 1, 33, 1, 33, 6);
    errors(&t);
    return test_finish("test_attn_api", &t);
}
