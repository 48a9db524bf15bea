/* The compute seam (src/backend/backend.h), as llama.cpp's test-backend-ops: the registry and
 * --device resolution; every op of the CPU backend against the float64 ops (fp32, and bf16 where
 * the CPU has it) on random shapes; then every op of every other backend present against the CPU
 * backend (normalised error), with the device memory functions. Without another backend (a CPU-only
 * build, or no GPU) the CPU checks still run and must pass; the test then exits 77 (CTest: skipped),
 * since what it exists for, the comparison across backends, did not run. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn/layer.h"
#include "backend/backend.h"
#include "test_util.h"

typedef struct lin_case {
    int M, I, O;
    bool bias;
} lin_case;

static void fill(test_rng *r, float *x, double *xd, size_t n) {
    for (size_t i = 0; i < n; i++) {
        x[i] = (float)test_rng_uniform(r);
        if (xd) xd[i] = x[i];
    }
}

static double rel_f32_f64(const float *a, const double *b, size_t n) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        const double d = fabs((double)a[i] - b[i]);
        if (d > num || isnan(d)) num = isnan(d) ? INFINITY : d;
        if (fabs(b[i]) > den) den = fabs(b[i]);
    }
    return num / (den > 1e-30 ? den : 1e-30);
}

/* One linear case on the CPU backend in cx's precision against float64: forward, and the backward
 * with beta 1 (accumulating into random dinp, dw, db) and beta 0 (dinp written). */
static void cpu_linear_case(test_ctx *ctx, const be_ctx *cx, const lin_case *c, double tol, const char *what) {
    const size_t M = (size_t)c->M, I = (size_t)c->I, O = (size_t)c->O;
    float *f = malloc(sizeof(float) * (M * I * 2 + O * I * 2 + O * 2 + M * O * 2));
    double *d = malloc(sizeof(double) * (M * I * 2 + O * I * 2 + O * 2 + M * O * 2));
    float *x = f, *dx = x + M * I, *w = dx + M * I, *dw = w + O * I, *b = dw + O * I, *db = b + O, *y = db + O,
          *dy = y + M * O;
    double *xd = d, *dxd = xd + M * I, *wd = dxd + M * I, *dwd = wd + O * I, *bd = dwd + O * I, *dbd = bd + O,
           *yd = dbd + O, *dyd = yd + M * O;
    test_rng r = {0x9E3779B97F4A7C15ULL ^ (M * 131 + I * 17 + O)};
    fill(&r, x, xd, M * I);
    fill(&r, w, wd, O * I);
    fill(&r, b, bd, O);
    fill(&r, dy, dyd, M * O);
    be_linear_forward_f32(cx, y, x, w, c->bias ? b : NULL, c->M, c->I, c->O);
    be_linear_forward_f64(cx, yd, xd, wd, c->bias ? bd : NULL, c->M, c->I, c->O);
    double e = rel_f32_f64(y, yd, M * O);
    CHECK(ctx, e < tol, "%s linear_forward M=%d I=%d O=%d bias=%d: error %.3g >= %.3g", what, c->M, c->I, c->O,
          c->bias, e, tol);
    for (int beta = 1; beta >= 0; beta--) {
        fill(&r, dx, dxd, M * I); /* random starting values: beta 1 must add to them, beta 0 ignore them */
        fill(&r, dw, dwd, O * I);
        fill(&r, db, dbd, O);
        be_linear_backward_f32(cx, dx, (float)beta, dw, c->bias ? db : NULL, dy, x, w, c->M, c->I, c->O);
        be_linear_backward_f64(cx, dxd, beta, dwd, c->bias ? dbd : NULL, dyd, xd, wd, c->M, c->I, c->O);
        const double ex = rel_f32_f64(dx, dxd, M * I), ew = rel_f32_f64(dw, dwd, O * I);
        const double eb = c->bias ? rel_f32_f64(db, dbd, O) : 0.0;
        CHECK(ctx, ex < tol && ew < tol && eb < tol,
              "%s linear_backward beta=%d M=%d I=%d O=%d: errors dinp %.3g dw %.3g db %.3g >= %.3g", what, beta, c->M,
              c->I, c->O, ex, ew, eb, tol);
        if (beta == 1) printf("  cpu %-5s linear M=%4d I=%4d O=%4d: fwd %.2e, dinp %.2e, dw %.2e, db %.2e\n", what,
                              c->M, c->I, c->O, e, ex, ew, eb);
    }
    free(f);
    free(d);
}

/* Buffers of one op case: nb float32 arrays of n random values and their float64 copies. */
enum { NB = 10 };
typedef struct op_bufs {
    float *f[NB];
    double *d[NB];
    size_t n;
} op_bufs;

static void bufs_fill(op_bufs *b, test_rng *r) {
    for (int k = 0; k < NB; k++) fill(r, b->f[k], b->d[k], b->n);
}

/* The float32 result f[k] against the float64 d[k] over len values (worst of the case into *worst). */
static void cmp(test_ctx *ctx, const op_bufs *b, int k, size_t len, const char *op, int M, int C, double *worst) {
    const double e = rel_f32_f64(b->f[k], b->d[k], len);
    CHECK(ctx, e < 2e-5, "cpu %s M=%d C=%d: output %d error %.3g vs float64", op, M, C, k, e);
    *worst = e > *worst ? e : *worst;
}

/* Every op of BE_OPS through the CPU backend's table against the float64 op, on M rows of C. */
static void cpu_ops_case(test_ctx *ctx, const be_ctx *cx, int M, int C) {
    op_bufs b = {.n = (size_t)M * C};
    for (int k = 0; k < NB; k++) {
        b.f[k] = malloc(sizeof(float) * b.n);
        b.d[k] = malloc(sizeof(double) * b.n);
    }
    int *ids = malloc(sizeof(int) * (size_t)M);
    test_rng r = {0xB5AD4ECEDA1CE2A9ULL ^ (uint64_t)(M * 1000 + C)};
    for (int i = 0; i < M; i++) ids[i] = (int)(test_rng_u64(&r) % (uint64_t)(M < C ? M : C)); /* < rows, < V */
    float **f = b.f;
    double **d = b.d, worst = 0;
    const long n = (long)b.n;
    bufs_fill(&b, &r);
    be_layernorm_forward_f32(cx, f[0], f[1], f[2], f[3], f[4], f[5], M, C, 1e-5f);
    layernorm_forward_f64(d[0], d[1], d[2], d[3], d[4], d[5], M, C, 1e-5);
    cmp(ctx, &b, 0, b.n, "layernorm_forward", M, C, &worst);
    cmp(ctx, &b, 1, (size_t)M, "layernorm_forward mean", M, C, &worst);
    cmp(ctx, &b, 2, (size_t)M, "layernorm_forward rstd", M, C, &worst);
    for (int i = 0; i < M; i++) d[1][i] = f[1][i], d[2][i] = f[2][i]; /* the same statistics for backward */
    be_layernorm_backward_f32(cx, f[6], f[7], f[8], f[9], f[3], f[4], f[1], f[2], M, C);
    layernorm_backward_f64(d[6], d[7], d[8], d[9], d[3], d[4], d[1], d[2], M, C);
    cmp(ctx, &b, 6, b.n, "layernorm_backward dinp", M, C, &worst);
    cmp(ctx, &b, 7, (size_t)C, "layernorm_backward dw", M, C, &worst);
    cmp(ctx, &b, 8, (size_t)C, "layernorm_backward db", M, C, &worst);
    bufs_fill(&b, &r); /* without affine (w = b = NULL: the DiT's) */
    be_layernorm_forward_f32(cx, f[0], f[1], f[2], f[3], NULL, NULL, M, C, 1e-6f);
    layernorm_forward_f64(d[0], d[1], d[2], d[3], NULL, NULL, M, C, 1e-6);
    cmp(ctx, &b, 0, b.n, "layernorm_forward (no affine)", M, C, &worst);
    for (int i = 0; i < M; i++) d[1][i] = f[1][i], d[2][i] = f[2][i];
    be_layernorm_backward_f32(cx, f[6], NULL, NULL, f[9], f[3], NULL, f[1], f[2], M, C);
    layernorm_backward_f64(d[6], NULL, NULL, d[9], d[3], NULL, d[1], d[2], M, C);
    cmp(ctx, &b, 6, b.n, "layernorm_backward (no affine) dinp", M, C, &worst);
    bufs_fill(&b, &r);
    be_rmsnorm_forward_f32(cx, f[0], f[1], f[2], f[3], M, C, 1e-6f);
    rmsnorm_forward_f64(d[0], d[1], d[2], d[3], M, C, 1e-6);
    cmp(ctx, &b, 0, b.n, "rmsnorm_forward", M, C, &worst);
    for (int i = 0; i < M; i++) d[1][i] = f[1][i];
    be_rmsnorm_backward_f32(cx, f[4], f[5], f[6], f[2], f[3], f[1], M, C);
    rmsnorm_backward_f64(d[4], d[5], d[6], d[2], d[3], d[1], M, C);
    cmp(ctx, &b, 4, b.n, "rmsnorm_backward dinp", M, C, &worst);
    cmp(ctx, &b, 5, (size_t)C, "rmsnorm_backward dw", M, C, &worst);
    be_add_rmsnorm_forward_f32(cx, f[7], f[8], f[9], f[2], f[3], f[4], M, C, 1e-6f);
    add_rmsnorm_forward_f64(d[7], d[8], d[9], d[2], d[3], d[4], M, C, 1e-6);
    cmp(ctx, &b, 7, b.n, "add_rmsnorm_forward sum", M, C, &worst);
    cmp(ctx, &b, 8, b.n, "add_rmsnorm_forward out", M, C, &worst);
    /* element-wise: forward into 0, backward (dinp from dout 2 at inp 1) into 3 */
#define ELEMENTWISE(op)                                                                                             \
    bufs_fill(&b, &r);                                                                                              \
    be_##op##_forward_f32(cx, f[0], f[1], n);                                                                       \
    op##_forward_f64(d[0], d[1], n);                                                                                \
    cmp(ctx, &b, 0, b.n, #op "_forward", M, C, &worst);                                                             \
    be_##op##_backward_f32(cx, f[3], f[2], f[1], n);                                                                \
    op##_backward_f64(d[3], d[2], d[1], n);                                                                         \
    cmp(ctx, &b, 3, b.n, #op "_backward", M, C, &worst);
    ELEMENTWISE(gelu_erf)
    ELEMENTWISE(gelu_tanh)
    ELEMENTWISE(silu)
#undef ELEMENTWISE
    bufs_fill(&b, &r);
    be_swiglu_forward_sig_f32(cx, f[0], f[1], f[2], f[3], n);
    swiglu_forward_sig_f64(d[0], d[1], d[2], d[3], n);
    cmp(ctx, &b, 0, b.n, "swiglu_forward_sig", M, C, &worst);
    cmp(ctx, &b, 1, b.n, "swiglu_forward_sig sig", M, C, &worst);
    be_swiglu_backward_set_f32(cx, f[4], f[5], f[6], f[2], f[1], f[3], n);
    swiglu_backward_set_f64(d[4], d[5], d[6], d[2], d[1], d[3], n);
    cmp(ctx, &b, 4, b.n, "swiglu_backward_set dgate", M, C, &worst);
    cmp(ctx, &b, 5, b.n, "swiglu_backward_set dup", M, C, &worst);
    for (int ls = 0; ls < 2; ls++) {
        bufs_fill(&b, &r);
        const float loss = be_cross_entropy_forward_f32(cx, f[0], f[1], ids, M, C, ls ? 0.1f : 0.0f);
        const double lossd = cross_entropy_forward_f64(d[0], d[1], ids, M, C, ls ? 0.1 : 0.0);
        CHECK(ctx, fabs(loss - lossd) <= 2e-5 * fabs(lossd), "cpu cross_entropy_forward M=%d C=%d: loss %.8g vs %.8g",
              M, C, loss, lossd);
        cmp(ctx, &b, 0, b.n, "cross_entropy_forward probs", M, C, &worst);
        for (size_t i = 0; i < b.n; i++) d[0][i] = f[0][i];
        be_cross_entropy_backward_f32(cx, f[2], f[0], ids, M, C, ls ? 0.1f : 0.0f, 0.5f);
        cross_entropy_backward_f64(d[2], d[0], ids, M, C, ls ? 0.1 : 0.0, 0.5);
        cmp(ctx, &b, 2, b.n, "cross_entropy_backward", M, C, &worst);
    }
    bufs_fill(&b, &r); /* adaLN: B = M rows of N = 1 token, shift and scale rows of stride C */
    be_modulate_forward_f32(cx, f[0], f[1], f[2], f[3], C, M, 1, C);
    modulate_forward_f64(d[0], d[1], d[2], d[3], C, M, 1, C);
    cmp(ctx, &b, 0, b.n, "modulate_forward", M, C, &worst);
    be_modulate_backward_f32(cx, f[4], f[5], f[6], f[7], f[1], f[3], C, M, 1, C);
    modulate_backward_f64(d[4], d[5], d[6], d[7], d[1], d[3], C, M, 1, C);
    cmp(ctx, &b, 4, b.n, "modulate_backward dx", M, C, &worst);
    cmp(ctx, &b, 5, b.n, "modulate_backward dshift", M, C, &worst);
    cmp(ctx, &b, 6, b.n, "modulate_backward dscale", M, C, &worst);
    be_gated_add_forward_f32(cx, f[8], f[2], f[1], C, M, 1, C);
    gated_add_forward_f64(d[8], d[2], d[1], C, M, 1, C);
    cmp(ctx, &b, 8, b.n, "gated_add_forward", M, C, &worst);
    be_gated_add_backward_f32(cx, f[9], f[3], f[7], f[2], f[1], C, M, 1, C);
    gated_add_backward_f64(d[9], d[3], d[7], d[2], d[1], C, M, 1, C);
    cmp(ctx, &b, 9, b.n, "gated_add_backward dy", M, C, &worst);
    cmp(ctx, &b, 3, b.n, "gated_add_backward dgate", M, C, &worst);
    bufs_fill(&b, &r); /* table: the first min(M, C) rows of buffer 1 */
    be_embedding_forward_f32(cx, f[0], ids, f[1], M, C);
    embedding_forward_f64(d[0], ids, d[1], M, C);
    cmp(ctx, &b, 0, b.n, "embedding_forward", M, C, &worst);
    be_embedding_backward_f32(cx, f[2], f[3], ids, M, C);
    embedding_backward_f64(d[2], d[3], ids, M, C);
    cmp(ctx, &b, 2, b.n, "embedding_backward", M, C, &worst);
    printf("  cpu ops M=%4d C=%4d: %d ops against float64, worst error %.2e\n", M, C, 21, worst);
    for (int k = 0; k < NB; k++) {
        free(b.f[k]);
        free(b.d[k]);
    }
    free(ids);
}

/* The update members (clip_grad_norm, adamw_update, ema_update) against float64 arithmetic. */
static void cpu_update_case(test_ctx *ctx, const moh_backend *be, size_t n) {
    float *w = malloc(sizeof(float) * n * 5), *g = w + n, *m = g + n, *v = m + n, *e = v + n;
    double *wd = malloc(sizeof(double) * n * 5), *gd = wd + n, *md = gd + n, *vd = md + n, *ed = vd + n;
    bool *decay = malloc(n);
    test_rng r = {0x5EED0000ULL + n};
    fill(&r, w, wd, n);
    fill(&r, g, gd, n);
    fill(&r, e, ed, n);
    for (size_t i = 0; i < n; i++) {
        m[i] = (float)(0.1 * test_rng_uniform(&r));
        v[i] = (float)(0.01 * (1.0 + test_rng_uniform(&r)));
        md[i] = m[i];
        vd[i] = v[i];
        decay[i] = i % 3 != 0;
    }
    double ss = 0;
    for (size_t i = 0; i < n; i++) ss += gd[i] * gd[i];
    const double norm = be->clip_grad_norm(g, n, 0.5), scale = 0.5 / (sqrt(ss) + 1e-6);
    CHECK(ctx, fabs(norm - sqrt(ss)) <= 1e-9 * sqrt(ss), "cpu clip_grad_norm n=%zu: %.12g vs %.12g", n, norm, sqrt(ss));
    for (size_t i = 0; i < n; i++) gd[i] *= scale;
    double eg = rel_f32_f64(g, gd, n);
    CHECK(ctx, eg < 1e-6, "cpu clip_grad_norm n=%zu: clipped gradient error %.3g", n, eg);
    const adamw_config c = {0.9, 0.95, 1e-8, 0.1};
    const long t = 3;
    be->adamw_update(&c, w, g, m, v, decay, n, t, 1e-3);
    for (size_t i = 0; i < n; i++) {
        md[i] = 0.9 * md[i] + 0.1 * gd[i];
        vd[i] = 0.95 * vd[i] + 0.05 * gd[i] * gd[i];
        const double u = (md[i] / (1 - pow(0.9, t))) / (sqrt(vd[i] / (1 - pow(0.95, t))) + 1e-8);
        wd[i] -= 1e-3 * (u + (decay[i] ? 0.1 * wd[i] : 0.0));
    }
    const double ew = rel_f32_f64(w, wd, n), em = rel_f32_f64(m, md, n), ev = rel_f32_f64(v, vd, n);
    CHECK(ctx, ew < 1e-6 && em < 1e-6 && ev < 1e-6, "cpu adamw_update n=%zu: errors w %.3g m %.3g v %.3g", n, ew, em, ev);
    be->ema_update(e, w, n, 0.75f);
    for (size_t i = 0; i < n; i++) ed[i] = 0.75 * ed[i] + 0.25 * w[i];
    const double ee = rel_f32_f64(e, ed, n);
    CHECK(ctx, ee < 1e-6, "cpu ema_update n=%zu: error %.3g", n, ee);
    printf("  cpu update n=%7zu: clip %.2e, adamw w %.2e, ema %.2e\n", n, eg, ew, ee);
    free(w);
    free(wd);
    free(decay);
}

/* The attention layer through backend be (both paths) against the float64 layer (reference path) on
 * the same random weights and input: y, and the gradients of x and every parameter for a random dy. */
static void attn_layer_case(test_ctx *ctx, const moh_backend *be, bool sparse, bool causal, double tol) {
    moh_attn_config c;
    moh_attn_config_default(&c);
    c.hidden_size = 48;
    c.n_heads = 6;
    c.n_kv_heads = 3;
    c.head_dim = 8;
    c.router = MOH_ROUTER_LEARNED;
    c.shared_heads = 2;
    c.top_k = 2;
    c.causal = causal;
    c.rope_theta = causal ? 10000.0 : 0.0;
    c.qkv_bias = true;
    c.proj_bias = true;
    const int B = 2, N = 9, C = c.hidden_size;
    const size_t T = (size_t)B * N, np = attn_params_bind_f32(&(attn_params_f32){0}, NULL, &c);
    float *pf = malloc(sizeof(float) * np * 2), *x = malloc(sizeof(float) * T * C * 4);
    double *pd = malloc(sizeof(double) * np * 2), *xd = malloc(sizeof(double) * T * C * 4);
    attn_params_f32 p, g;
    attn_params_f64 q, h;
    attn_params_bind_f32(&p, pf, &c);
    attn_params_bind_f32(&g, pf + np, &c);
    attn_params_bind_f64(&q, pd, &c);
    attn_params_bind_f64(&h, pd + np, &c);
    test_rng r = {0xA77E17ULL + (uint64_t)sparse * 2 + causal};
    fill(&r, pf, pd, np);
    for (size_t i = 0; i < np; i++) pf[i] *= 0.3f, pd[i] = pf[i];
    memset(pf + np, 0, sizeof(float) * np);
    memset(pd + np, 0, sizeof(double) * np);
    float *y = x + T * C, *dy = y + T * C, *dx = dy + T * C;
    double *yd = xd + T * C, *dyd = yd + T * C, *dxd = dyd + T * C;
    fill(&r, x, xd, T * C);
    fill(&r, dy, dyd, T * C);
    memset(dx, 0, sizeof(float) * T * C);
    memset(dxd, 0, sizeof(double) * T * C);
    attn_layer_f32 L;
    attn_layer_f64 Ld;
    moh_error err = {0};
    const bool ok = attn_layer_init_f32(&L, be, &c, B, N, sparse, &err) == MOH_OK;
    CHECK(ctx, ok, "%s attention layer init: %s", be->name, err.msg);
    CHECK(ctx, attn_layer_init_f64(&Ld, NULL, &c, B, N, false, &err) == MOH_OK, "float64 layer: %s", err.msg);
    if (ok) {
        attn_layer_forward_f32(&L, &c, &p, x, B, N, y);
        attn_layer_forward_f64(&Ld, &c, &q, xd, B, N, yd);
        attn_layer_backward_f32(&L, &c, &p, &g, dy, 0.5f, dx);
        attn_layer_backward_f64(&Ld, &c, &q, &h, dyd, 0.5, dxd);
        const double ey = rel_f32_f64(y, yd, T * C), ex = rel_f32_f64(dx, dxd, T * C), eg = rel_f32_f64(pf + np, pd + np, np);
        const double elb = fabs(attn_layer_router_f32(&L)->lb_loss - attn_layer_router_f64(&Ld)->lb_loss);
        CHECK(ctx, ey < tol && ex < tol && eg < tol && elb < tol,
              "%s attention layer (%s, %s): y %.3g, dx %.3g, dparams %.3g, lb %.3g >= %.3g", be->name,
              sparse ? "head-sparse" : "reference", causal ? "causal RoPE GQA" : "bidirectional GQA", ey, ex, eg, elb, tol);
        printf("  %s attention layer %-11s %-17s: y %.2e, dx %.2e, dparams %.2e\n", be->name,
               sparse ? "head-sparse" : "reference", causal ? "causal RoPE GQA" : "bidirectional GQA", ey, ex, eg);
        attn_layer_free_f32(&L);
    }
    attn_layer_free_f64(&Ld);
    free(pf);
    free(pd);
    free(x);
    free(xd);
}

static void test_registry(test_ctx *ctx) {
    int n = 0;
    const moh_backend *const *all = backend_list(&n);
    CHECK(ctx, n >= 2 && all[0] == backend_get(MOH_DEVICE_CPU), "registry: %d backends, the CPU first", n);
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++) CHECK(ctx, strcmp(all[i]->name, all[j]->name), "two backends named %s", all[i]->name);
    CHECK(ctx, backend_get(MOH_DEVICE_AUTO) == NULL, "backend_get(auto) names no table");
    moh_device d = MOH_DEVICE_CPU;
    moh_error err = {0};
    CHECK(ctx, backend_parse_device(NULL, &d, &err) == MOH_OK && d == MOH_DEVICE_AUTO, "NULL parses as auto");
    CHECK(ctx, backend_parse_device("cuda", &d, &err) == MOH_OK && d == MOH_DEVICE_CUDA, "cuda parses");
    CHECK(ctx, backend_parse_device("gpu", &d, &err) == MOH_E_ARG && strstr(err.msg, "'gpu'"), "gpu refused: %s", err.msg);
    const moh_backend *be = NULL;
    char note[224], why[224];
    CHECK(ctx, backend_resolve(MOH_DEVICE_AUTO, "llama", &be, note, sizeof note, &err) == MOH_OK && be &&
                   be->available(why, sizeof why) && be->runs_family("llama", why, sizeof why),
          "auto resolves to a backend that runs llama");
    CHECK(ctx, be != backend_get(MOH_DEVICE_CPU) || note[0], "auto chose the CPU without saying why");
    CHECK(ctx, backend_resolve(MOH_DEVICE_CPU, "vit", &be, note, sizeof note, &err) == MOH_OK &&
                   be == backend_get(MOH_DEVICE_CPU) && !note[0], "--device cpu: the CPU, no note");
    const moh_backend *cu = backend_get(MOH_DEVICE_CUDA);
    if (!cu->available(why, sizeof why) || !cu->runs_family("dit", why, sizeof why)) {
        const int rc = backend_resolve(MOH_DEVICE_CUDA, "dit", &be, note, sizeof note, &err);
        CHECK(ctx, rc == MOH_E_DEVICE && !strncmp(err.msg, "--device cuda: ", 15) && !strchr(err.msg, '\n'),
              "--device cuda where it cannot run: %d '%s'", rc, err.msg);
    }
}

/* Backend be against the CPU backend, same precision: its memory round trip, then each op it has. */
static void test_other(test_ctx *ctx, const moh_backend *be, const lin_case *cases, int nc) {
    moh_error err = {0};
    const size_t n = 4099;
    float *h = malloc(sizeof(float) * n * 2);
    test_rng r = {77};
    fill(&r, h, NULL, n);
    void *dev = NULL;
    CHECK(ctx, be->alloc(&dev, sizeof(float) * n, &err) == MOH_OK, "%s alloc: %s", be->name, err.msg);
    if (dev) {
        CHECK(ctx, be->to_device(dev, h, sizeof(float) * n, &err) == MOH_OK &&
                       be->to_host(h + n, dev, sizeof(float) * n, &err) == MOH_OK && be->sync(&err) == MOH_OK,
              "%s copies: %s", be->name, err.msg);
        CHECK(ctx, !memcmp(h, h + n, sizeof(float) * n), "%s: a round trip through device memory changed the data",
              be->name);
        be->free(dev);
    }
    free(h);
    if (!be->linear_forward || !be->linear_backward) {
        printf("  %s: no linear ops yet (issue 27): memory checked only\n", be->name);
        return;
    }
    be_ctx cpu, dx;
    be_ctx_init(&cpu, backend_get(MOH_DEVICE_CPU));
    be_ctx_init(&dx, be);
    for (int k = 0; k < nc; k++) {
        const lin_case *c = &cases[k];
        const size_t M = (size_t)c->M, I = (size_t)c->I, O = (size_t)c->O;
        const size_t sz[] = {M * I, O * I, O, M * O, M * O, M * I, O * I, O}; /* x w b y dy dx dw db */
        float *hv[8], *dv[8] = {0}, *back[8];
        bool ok = true;
        for (int i = 0; i < 8; i++) {
            hv[i] = malloc(sizeof(float) * sz[i]);
            back[i] = malloc(sizeof(float) * sz[i]);
            fill(&r, hv[i], NULL, sz[i]);
            ok = ok && be->alloc((void **)&dv[i], sizeof(float) * sz[i], &err) == MOH_OK &&
                 be->to_device(dv[i], hv[i], sizeof(float) * sz[i], &err) == MOH_OK;
        }
        CHECK(ctx, ok, "%s: device buffers: %s", be->name, err.msg);
        if (ok) {
            be_linear_forward_f32(&cpu, hv[3], hv[0], hv[1], c->bias ? hv[2] : NULL, c->M, c->I, c->O);
            be_linear_backward_f32(&cpu, hv[5], 1.0f, hv[6], c->bias ? hv[7] : NULL, hv[4], hv[0], hv[1], c->M, c->I,
                                   c->O);
            be_linear_forward_f32(&dx, dv[3], dv[0], dv[1], c->bias ? dv[2] : NULL, c->M, c->I, c->O);
            be_linear_backward_f32(&dx, dv[5], 1.0f, dv[6], c->bias ? dv[7] : NULL, dv[4], dv[0], dv[1], c->M, c->I,
                                   c->O);
            ok = be->sync(&err) == MOH_OK;
            for (int i = 3; ok && i < 8; i++) ok = be->to_host(back[i], dv[i], sizeof(float) * sz[i], &err) == MOH_OK;
            CHECK(ctx, ok, "%s: results back: %s", be->name, err.msg);
            const int outs[] = {3, 5, 6, 7};
            for (int i = 0; ok && i < 4; i++) {
                const double e = test_rel_err_f32(back[outs[i]], hv[outs[i]], (long)sz[outs[i]]);
                CHECK(ctx, e < 2e-2, "%s linear output %d M=%d I=%d O=%d: error %.3g vs the CPU", be->name, outs[i],
                      c->M, c->I, c->O, e);
            }
        }
        for (int i = 0; i < 8; i++) {
            free(hv[i]);
            free(back[i]);
            if (dv[i]) be->free(dv[i]);
        }
    }
    be_ctx_release(&cpu);
    be_ctx_release(&dx);
}

int main(void) {
    test_ctx ctx = {0};
    test_registry(&ctx);
    const lin_case cases[] = {{1, 1, 1, true}, {7, 33, 5, true}, {64, 48, 96, false}, {130, 257, 65, true},
                              {512, 96, 288, true}};
    const int nc = (int)(sizeof cases / sizeof cases[0]);
    be_ctx cx;
    be_ctx_init(&cx, backend_get(MOH_DEVICE_CPU));
    for (int k = 0; k < nc; k++) cpu_linear_case(&ctx, &cx, &cases[k], 1e-5, "fp32");
    const int shapes[][2] = {{1, 1}, {3, 7}, {17, 64}, {64, 257}, {130, 96}};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) cpu_ops_case(&ctx, &cx, shapes[k][0], shapes[k][1]);
    for (int k = 0; k < 4; k++) attn_layer_case(&ctx, backend_get(MOH_DEVICE_CPU), k & 1, k >> 1, 1e-5);
    cpu_update_case(&ctx, backend_get(MOH_DEVICE_CPU), 5);
    cpu_update_case(&ctx, backend_get(MOH_DEVICE_CPU), 200003);
    char why[160];
    if (precision_resolve(MOH_PRECISION_BF16, why, sizeof why) == MOH_PRECISION_BF16) {
        moh_error err = {0};
        CHECK(&ctx, be_ctx_set_weights(&cx, NULL, &err) == MOH_OK, "fp32 again");
        bf16_mirror none = {0}; /* a mirror of nothing: every operand rounded on the fly */
        CHECK(&ctx, be_ctx_set_weights(&cx, &none, &err) == MOH_OK && cx.precision == MOH_PRECISION_BF16 &&
                        be_cpu_bf16(&cx), "bf16 context: %s", err.msg);
        /* bf16 operands (8 bits of mantissa), fp32 sums: measured about 2e-3 relative */
        for (int k = 0; k < nc; k++) cpu_linear_case(&ctx, &cx, &cases[k], 1e-2, "bf16");
    } else {
        printf("  cpu bf16: not on this CPU (%s)\n", why);
    }
    be_ctx_release(&cx);
    CHECK(&ctx, cx.state == NULL && cx.precision == MOH_PRECISION_FP32, "released context is fp32");
    int n = 0, others = 0;
    const moh_backend *const *all = backend_list(&n);
    for (int i = 0; i < n; i++) {
        if (all[i] == backend_get(MOH_DEVICE_CPU)) continue;
        if (!all[i]->available(why, sizeof why)) {
            printf("  %s: skipped (%s)\n", all[i]->name, why);
            continue;
        }
        others++;
        test_other(&ctx, all[i], cases, nc);
    }
    const int rc = test_finish("test_backend_ops", &ctx);
    if (!rc && !others) {
        printf("  no backend besides the CPU here: the cross-backend comparisons did not run (skipped, 77)\n");
        return 77;
    }
    return rc;
}
