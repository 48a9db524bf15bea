/* MoH attention layer (reference path): float64 finite-difference gradient checks of every input
 * and parameter, for every router and layer option; float32 vs float64 agreement; invariants of
 * the gates (spec §1: groups sum to their size, unselected heads exactly 0). */
#include <math.h>
#include <string.h>

#include "attn/attn.h"
#include "test_util.h"

typedef struct layer_case {
    const char *name;
    int C, h, hkv, d, hs, K;
    moh_router router;
    bool causal, qkv_bias, proj_bias;
    double rope, beta;
    int B, N;
} layer_case;

static moh_attn_config make_cfg(const layer_case *lc) {
    moh_attn_config c;
    moh_attn_config_default(&c);
    c.hidden_size = lc->C;
    c.n_heads = lc->h;
    c.n_kv_heads = lc->hkv;
    c.head_dim = lc->d;
    c.shared_heads = lc->hs;
    c.top_k = lc->K;
    c.router = lc->router;
    c.causal = lc->causal;
    c.qkv_bias = lc->qkv_bias;
    c.proj_bias = lc->proj_bias;
    c.rope_theta = lc->rope;
    c.load_balance_coef = lc->beta;
    return c;
}

/* L = sum(y * dy) + beta * lb_loss in float64. */
static double loss_f64(const moh_attn_config *cfg, const attn_params_f64 *p, const double *x,
                       const double *dy, int B, int N, double *y, attn_cache_f64 *c) {
    attn_forward_f64(cfg, p, x, B, N, y, c);
    double L = 0.0;
    for (long i = 0; i < (long)B * N * cfg->hidden_size; i++) L += y[i] * dy[i];
    return L + cfg->load_balance_coef * c->lb_loss;
}

static double fd_check(test_ctx *ctx, const char *what, const moh_attn_config *cfg,
                       const attn_params_f64 *p, double *vals, const double *grad, long n,
                       const double *x, const double *dy, int B, int N, double *y,
                       attn_cache_f64 *c) {
    const double eps = 1e-6;
    double *num = malloc(sizeof(double) * (size_t)n);
    /* at most 96 entries per tensor, spread deterministically over it; the rest keep the
     * analytic value so the comparison below covers exactly the probed entries */
    const long stride = n > 96 ? n / 96 + (n % 96 != 0) : 1;
    for (long i = 0; i < n; i++) num[i] = grad[i];
    for (long i = (long)(n * 0.37) % stride; i < n; i += stride) {
        const double v = vals[i];
        vals[i] = v + eps;
        const double lp = loss_f64(cfg, p, x, dy, B, N, y, c);
        vals[i] = v - eps;
        const double lm = loss_f64(cfg, p, x, dy, B, N, y, c);
        vals[i] = v;
        num[i] = (lp - lm) / (2 * eps);
    }
    double scale = 0.0;
    for (long i = 0; i < n; i++) scale = fabs(num[i]) > scale ? fabs(num[i]) : scale;
    /* a gradient that is exactly zero (e.g. top-1 gates r = p/p = 1) is checked absolutely */
    double err = test_rel_err_f64(grad, num, n);
    if (scale < 1e-9) {
        err = 0.0;
        for (long i = 0; i < n; i++) err = fmax(err, fabs(grad[i] - num[i]));
    }
    CHECK(ctx, err < 1e-6, "%s: gradient of %s: rel err %.3g vs finite differences", cfg->router == MOH_ROUTER_NONE ? "none" : "routed", what, err);
    free(num);
    return err;
}

static void run_case(test_ctx *ctx, const layer_case *lc, uint64_t seed) {
    moh_attn_config cfg = make_cfg(lc);
    moh_error err;
    CHECK(ctx, moh_attn_config_validate(&cfg, lc->name, &err) == MOH_OK, "%s: invalid: %s", lc->name, err.msg);
    const int B = lc->B, N = lc->N, C = lc->C, h = lc->h;
    const long T = (long)B * N, np = (long)attn_params_bind_f64(&(attn_params_f64){0}, NULL, &cfg);
    test_rng rng = {seed};
    double *w = malloc(sizeof(double) * np), *gw = calloc(np, sizeof(double));
    double *x = malloc(sizeof(double) * T * C), *dy = malloc(sizeof(double) * T * C);
    double *dx = calloc(T * C, sizeof(double)), *y = malloc(sizeof(double) * T * C);
    attn_params_f64 p, g;
    attn_params_bind_f64(&p, w, &cfg);
    attn_params_bind_f64(&g, gw, &cfg);
    for (long i = 0; i < np; i++) w[i] = test_rng_uniform(&rng) * 0.6;
    for (long i = 0; i < T * C; i++) x[i] = test_rng_uniform(&rng);
    for (long i = 0; i < T * C; i++) dy[i] = test_rng_uniform(&rng);
    attn_cache_f64 c;
    CHECK(ctx, attn_cache_init_f64(&c, &cfg, B, N, &err) == MOH_OK, "cache: %s", err.msg);

    loss_f64(&cfg, &p, x, dy, B, N, y, &c);
    attn_backward_f64(&cfg, &p, &g, &c, dy, cfg.load_balance_coef, dx);

    /* gate invariants (spec §1) */
    const int E = attn_routed_heads(&cfg), hs = cfg.shared_heads;
    for (long t = 0; t < T; t++) {
        const double *gt = c.gates + t * h;
        int active = 0;
        double rsum = 0.0;
        for (int i = 0; i < h; i++) active += gt[i] != 0.0;
        for (int j = 0; j < E; j++) rsum += gt[hs + j];
        if (cfg.router == MOH_ROUTER_NONE) {
            CHECK(ctx, active == h && gt[0] == 1.0, "%s: dense gates must all be 1", lc->name);
        } else if (cfg.router == MOH_ROUTER_QUERY_NORM) {
            CHECK(ctx, active == hs + cfg.top_k && fabs(rsum - cfg.top_k) < 1e-12, "%s: query_norm gates binary, %d active", lc->name, active);
        } else if (cfg.top_k > 0) {
            CHECK(ctx, active == hs + cfg.top_k, "%s: token %ld has %d active heads, want %d", lc->name, t, active, hs + cfg.top_k);
            if (hs == 0) CHECK(ctx, fabs(rsum - cfg.top_k) < 1e-9, "%s: routed gates sum %g, want K", lc->name, rsum);
        }
    }
    if (E > 0 && cfg.top_k > 0)
        CHECK(ctx, c.lb_loss > 0 && c.lb_loss <= (double)E * cfg.top_k + 1e-9, "%s: lb_loss %g out of (0, E*K]", lc->name, c.lb_loss);

    double worst = 0.0, e;
    e = fd_check(ctx, "x", &cfg, &p, x, dx, T * C, x, dy, B, N, y, &c);
    worst = e > worst ? e : worst;
    double *pw[] = {p.w_qkv, p.b_qkv, p.w_o, p.b_o, p.w_r, p.w_h, p.w_s};
    double *pg[] = {g.w_qkv, g.b_qkv, g.w_o, g.b_o, g.w_r, g.w_h, g.w_s};
    const char *pn[] = {"w_qkv", "b_qkv", "w_o", "b_o", "wg", "wg_0", "wg_1"};
    for (int k = 0; k < 7; k++) {
        if (!pw[k]) continue;
        /* blocks are contiguous and in this order: the length runs to the next present one */
        double *next = w + np;
        for (int j = k + 1; j < 7; j++)
            if (pw[j]) { next = pw[j]; break; }
        const long len = next - pw[k];
        e = fd_check(ctx, pn[k], &cfg, &p, pw[k], pg[k], len, x, dy, B, N, y, &c);
        worst = e > worst ? e : worst;
    }

    /* float32 instantiation agrees with float64 */
    float *w32 = malloc(sizeof(float) * np), *gw32 = calloc(np, sizeof(float));
    float *x32 = malloc(sizeof(float) * T * C), *dy32 = malloc(sizeof(float) * T * C);
    float *y32 = malloc(sizeof(float) * T * C), *dx32 = calloc(T * C, sizeof(float));
    for (long i = 0; i < np; i++) w32[i] = (float)w[i];
    for (long i = 0; i < T * C; i++) { x32[i] = (float)x[i]; dy32[i] = (float)dy[i]; }
    attn_params_f32 p32, g32;
    attn_params_bind_f32(&p32, w32, &cfg);
    attn_params_bind_f32(&g32, gw32, &cfg);
    attn_cache_f32 c32;
    attn_cache_init_f32(&c32, &cfg, B, N, &err);
    attn_forward_f32(&cfg, &p32, x32, B, N, y32, &c32);
    attn_backward_f32(&cfg, &p32, &g32, &c32, dy32, (float)cfg.load_balance_coef, dx32);
    double *tmp = malloc(sizeof(double) * (np > T * C ? np : T * C));
    loss_f64(&cfg, &p, x, dy, B, N, y, &c); /* restore y after the perturbations */
    for (long i = 0; i < T * C; i++) tmp[i] = y32[i];
    const double ey = test_rel_err_f64(tmp, y, T * C);
    for (long i = 0; i < T * C; i++) tmp[i] = dx32[i];
    const double edx = test_rel_err_f64(tmp, dx, T * C);
    for (long i = 0; i < np; i++) tmp[i] = gw32[i];
    const double egw = test_rel_err_f64(tmp, gw, np);
    CHECK(ctx, ey < 1e-5 && edx < 1e-5 && egw < 1e-5, "%s: f32 vs f64: y %.2g dx %.2g dw %.2g", lc->name, ey, edx, egw);
    printf("  %-28s fd worst %.2e   f32/f64: y %.1e dx %.1e dw %.1e   lb %.4f\n", lc->name, worst, ey, edx, egw, c.lb_loss);

    attn_cache_free_f32(&c32);
    attn_cache_free_f64(&c);
    free(w); free(gw); free(x); free(dy); free(dx); free(y);
    free(w32); free(gw32); free(x32); free(dy32); free(y32); free(dx32); free(tmp);
}

/* Query-norm router zero-std guard (spec §10): when every routed query norm of a token is equal
 * (identical q rows for the routed heads; and E == 1), scores are uniform 1/E, the K lowest
 * routed indices are selected, lb_loss = K, every output is finite, and no gradient flows through
 * the scores (dx equals the dx of beta = 0). */
static void zero_std_case(test_ctx *ctx, int E, int K, uint64_t seed) {
    const int C = 8, d = 4, hs = 2, h = hs + E, B = 1, N = 5;
    const layer_case lc = {"query_norm_zero_std", C, h, h, d, hs, K, MOH_ROUTER_QUERY_NORM,
                           true, false, false, 10000, 0.5, B, N};
    moh_attn_config cfg = make_cfg(&lc);
    moh_error err;
    CHECK(ctx, moh_attn_config_validate(&cfg, lc.name, &err) == MOH_OK, "zero std: invalid: %s", err.msg);
    const long T = (long)B * N, np = (long)attn_params_bind_f64(&(attn_params_f64){0}, NULL, &cfg);
    test_rng rng = {seed};
    double *w = malloc(sizeof(double) * np), *gw = calloc(np, sizeof(double)), *gw0 = calloc(np, sizeof(double));
    double *x = malloc(sizeof(double) * T * C), *dy = malloc(sizeof(double) * T * C);
    double *dx = calloc(T * C, sizeof(double)), *dx0 = calloc(T * C, sizeof(double)), *y = malloc(sizeof(double) * T * C);
    attn_params_f64 p, g, g0;
    attn_params_bind_f64(&p, w, &cfg);
    attn_params_bind_f64(&g, gw, &cfg);
    attn_params_bind_f64(&g0, gw0, &cfg);
    for (long i = 0; i < np; i++) w[i] = test_rng_uniform(&rng) * 0.6;
    for (long i = 0; i < T * C; i++) x[i] = test_rng_uniform(&rng);
    for (long i = 0; i < T * C; i++) dy[i] = test_rng_uniform(&rng);
    /* every routed head's q rows are a copy of the first routed head's: equal norms per token */
    for (int j = 1; j < E; j++)
        memcpy(p.w_qkv + (long)(hs + j) * d * C, p.w_qkv + (long)hs * d * C, sizeof(double) * d * C);
    attn_cache_f64 c;
    CHECK(ctx, attn_cache_init_f64(&c, &cfg, B, N, &err) == MOH_OK, "cache: %s", err.msg);
    attn_forward_f64(&cfg, &p, x, B, N, y, &c);
    bool finite = true;
    for (long i = 0; i < T * C; i++) finite = finite && isfinite(y[i]);
    for (long t = 0; t < T; t++) {
        CHECK(ctx, c.qstd[t] == 0.0, "zero std E=%d: token %ld std %g, want 0", E, t, c.qstd[t]);
        for (int j = 0; j < E; j++) {
            CHECK(ctx, c.p[t * E + j] == 1.0 / E, "zero std E=%d: score %g, want 1/E", E, c.p[t * E + j]);
            CHECK(ctx, c.mask[t * E + j] == (j < K ? 1.0 : 0.0), "zero std E=%d: token %ld head %d mask %g (ties go to the lower index)", E, t, j, c.mask[t * E + j]);
        }
    }
    CHECK(ctx, fabs(c.lb_loss - K) < 1e-12, "zero std E=%d: lb_loss %.17g, want K = %d", E, c.lb_loss, K);
    attn_backward_f64(&cfg, &p, &g, &c, dy, cfg.load_balance_coef, dx);
    attn_backward_f64(&cfg, &p, &g0, &c, dy, 0.0, dx0);
    for (long i = 0; i < T * C; i++) finite = finite && isfinite(dx[i]);
    for (long i = 0; i < np; i++) finite = finite && isfinite(gw[i]);
    CHECK(ctx, finite, "zero std E=%d: non-finite output or gradient", E);
    CHECK(ctx, memcmp(dx, dx0, sizeof(double) * T * C) == 0 && memcmp(gw, gw0, sizeof(double) * np) == 0,
          "zero std E=%d: the load-balance term must pass no gradient through uniform scores", E);
    printf("  %-28s E=%d K=%d: uniform scores, lower-index selection, lb %.3f\n", lc.name, E, K, c.lb_loss);
    attn_cache_free_f64(&c);
    free(w); free(gw); free(gw0); free(x); free(dy); free(dx); free(dx0); free(y);
}

/* Straight-through estimator of the query-norm router (spec §10), float64. Its gradient is the
 * exact gradient of the surrogate S = <y, dy> + beta lb + sum_{t,j} c_tj p_tj, with the binary
 * gates held at their values and c = mask * dL/dg fixed at the base point: the forward gate
 * m + m (p - sg(p)) has value m and derivative m dp. Checked by central differences of S over x
 * and the projection weights (no perturbation may change a selection); the STE gradient must
 * differ from the constant-gate one, and only in d x and d w_qkv (the router reads q only). */
static void ste_case(test_ctx *ctx, const layer_case *lc, uint64_t seed) {
    moh_attn_config cfg = make_cfg(lc), cst = make_cfg(lc);
    cfg.straight_through = true;
    moh_error err;
    CHECK(ctx, moh_attn_config_validate(&cfg, lc->name, &err) == MOH_OK, "%s STE: invalid: %s", lc->name, err.msg);
    const int B = lc->B, N = lc->N, C = lc->C, h = lc->h, hs = lc->hs, E = lc->h - lc->hs;
    const long T = (long)B * N, np = (long)attn_params_bind_f64(&(attn_params_f64){0}, NULL, &cfg);
    test_rng rng = {seed};
    double *w = malloc(sizeof(double) * np), *gw = calloc(np, sizeof(double)), *gw0 = calloc(np, sizeof(double));
    double *x = malloc(sizeof(double) * T * C), *dy = malloc(sizeof(double) * T * C), *y = malloc(sizeof(double) * T * C);
    double *dx = calloc(T * C, sizeof(double)), *dx0 = calloc(T * C, sizeof(double));
    double *cw = malloc(sizeof(double) * T * E), *m0 = malloc(sizeof(double) * T * E);
    attn_params_f64 p, g, g0;
    attn_params_bind_f64(&p, w, &cfg);
    attn_params_bind_f64(&g, gw, &cfg);
    attn_params_bind_f64(&g0, gw0, &cfg);
    for (long i = 0; i < np; i++) w[i] = test_rng_uniform(&rng) * 0.6;
    for (long i = 0; i < T * C; i++) x[i] = test_rng_uniform(&rng);
    for (long i = 0; i < T * C; i++) dy[i] = test_rng_uniform(&rng);
    attn_cache_f64 c;
    CHECK(ctx, attn_cache_init_f64(&c, &cfg, B, N, &err) == MOH_OK, "cache: %s", err.msg);
    loss_f64(&cfg, &p, x, dy, B, N, y, &c);
    attn_backward_f64(&cst, &p, &g0, &c, dy, cfg.load_balance_coef, dx0);
    attn_backward_f64(&cfg, &p, &g, &c, dy, cfg.load_balance_coef, dx);
    for (long t = 0; t < T; t++)
        for (int j = 0; j < E; j++) {
            m0[t * E + j] = c.mask[t * E + j];
            cw[t * E + j] = c.mask[t * E + j] * c.dgates[t * h + hs + j];
        }
    /* the STE term is really there, and touches x and w_qkv only */
    double diff_x = 0.0, diff_q = 0.0, diff_other = 0.0;
    const long nq = (long)attn_qkv_dim(&cfg) * C;
    for (long i = 0; i < T * C; i++) diff_x = fmax(diff_x, fabs(dx[i] - dx0[i]));
    const long q0 = p.w_qkv - w, b0 = p.b_qkv ? p.b_qkv - w : -1, nb = p.b_qkv ? attn_qkv_dim(&cfg) : 0;
    for (long i = 0; i < np; i++) {
        const double dd = fabs(gw[i] - gw0[i]);
        if (i >= q0 && i < q0 + nq) diff_q = fmax(diff_q, dd);
        else if (!(i >= b0 && i < b0 + nb)) diff_other = fmax(diff_other, dd);
    }
    CHECK(ctx, diff_x > 1e-6 && diff_q > 1e-6, "%s STE: gradient equals the constant-gate one (dx %.2g, dw_qkv %.2g)", lc->name, diff_x, diff_q);
    CHECK(ctx, diff_other == 0.0, "%s STE: changed a gradient other than x / qkv (%.2g)", lc->name, diff_other);
    /* central differences of the surrogate */
    const double eps = 1e-6;
    int flips = 0;
    double worst = 0.0;
    struct { double *v; const double *gr; long n; const char *name; } probes[] = {
        {x, dx, T * C, "x"}, {p.w_qkv, g.w_qkv, nq, "w_qkv"}};
    for (int k = 0; k < 2; k++) {
        const long n = probes[k].n, stride = n > 96 ? n / 96 + 1 : 1;
        double *num = malloc(sizeof(double) * n), *ana = malloc(sizeof(double) * n);
        long cnt = 0;
        for (long i = 0; i < n; i += stride) {
            double S[2];
            const double v = probes[k].v[i];
            for (int s = 0; s < 2; s++) {
                probes[k].v[i] = v + (s ? -eps : eps);
                S[s] = loss_f64(&cfg, &p, x, dy, B, N, y, &c);
                for (long q = 0; q < T * E; q++) {
                    S[s] += cw[q] * c.p[q];
                    flips += c.mask[q] != m0[q];
                }
            }
            probes[k].v[i] = v;
            num[cnt] = (S[0] - S[1]) / (2 * eps);
            ana[cnt++] = probes[k].gr[i];
        }
        const double e = test_rel_err_f64(ana, num, cnt);
        CHECK(ctx, e < 1e-6, "%s STE: gradient of %s: rel err %.3g vs finite differences of the surrogate", lc->name, probes[k].name, e);
        worst = fmax(worst, e);
        free(num);
        free(ana);
    }
    CHECK(ctx, flips == 0, "%s STE: %d selections changed under the perturbations (pick another seed)", lc->name, flips);
    printf("  %-28s STE surrogate fd worst %.2e   |dSTE - dconst| x %.2e qkv %.2e\n", lc->name, worst, diff_x, diff_q);
    attn_cache_free_f64(&c);
    free(w); free(gw); free(gw0); free(x); free(dy); free(y); free(dx); free(dx0); free(cw); free(m0);
}

int main(void) {
    test_ctx ctx = {0};
    const layer_case cases[] = {
        /* name                 C  h hkv d hs K  router                 causal qb    pb    rope    beta  B N */
        {"dense",              12, 3, 3, 4, 0, 0, MOH_ROUTER_NONE,       false, true,  true,  0,      0,    2, 5},
        {"dense_causal_rope",  12, 3, 3, 4, 0, 0, MOH_ROUTER_NONE,       true,  false, false, 10000,  0,    1, 6},
        {"learned_hs0",        16, 4, 4, 4, 0, 2, MOH_ROUTER_LEARNED,    false, true,  false, 0,      0.3,  2, 4},
        {"learned_hs1",        16, 4, 4, 4, 1, 2, MOH_ROUTER_LEARNED,    true,  false, true,  0,      0.3,  1, 5},
        {"learned_hs2_gqa",    16, 6, 2, 4, 2, 2, MOH_ROUTER_LEARNED,    true,  true,  true,  10000,  0.5,  2, 4},
        {"learned_hs3_kE",     12, 5, 5, 4, 3, 2, MOH_ROUTER_LEARNED,    false, false, false, 0,      0.1,  1, 5},
        {"learned_k1_d6",      10, 4, 2, 6, 2, 1, MOH_ROUTER_LEARNED,    false, true,  true,  500000, 0.2,  2, 3},
        {"learned_all_shared", 12, 3, 3, 4, 3, 0, MOH_ROUTER_LEARNED,    false, true,  false, 0,      0,    1, 4},
        {"learned_n1",         12, 4, 4, 4, 1, 1, MOH_ROUTER_LEARNED,    true,  true,  true,  10000,  0.3,  3, 1},
        {"query_norm",         16, 8, 8, 4, 4, 2, MOH_ROUTER_QUERY_NORM, true,  true,  false, 10000,  0.4,  2, 4},
        {"query_norm_gqa",     16, 8, 2, 4, 4, 3, MOH_ROUTER_QUERY_NORM, false, false, true,  0,      0.2,  1, 5},
        {"query_norm_beta0",   12, 6, 3, 4, 2, 2, MOH_ROUTER_QUERY_NORM, true,  false, false, 10000,  0,    1, 4},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&ctx, &cases[i], 0x9E3779B97F4A7C15ULL + i);
    const layer_case ste[] = {
        {"query_norm_ste",     16, 8, 8, 4, 4, 2, MOH_ROUTER_QUERY_NORM, true,  true,  false, 10000,  0.4,  2, 4},
        {"query_norm_ste_gqa", 18, 9, 3, 4, 3, 4, MOH_ROUTER_QUERY_NORM, true,  false, false, 10000,  0.01, 1, 6},
        {"query_norm_ste_b0",  12, 6, 3, 4, 2, 2, MOH_ROUTER_QUERY_NORM, false, true,  true,  0,      0,    1, 5},
    };
    for (size_t i = 0; i < sizeof ste / sizeof ste[0]; i++) ste_case(&ctx, &ste[i], 0xC0FFEEULL + i);
    zero_std_case(&ctx, 4, 2, 77);
    zero_std_case(&ctx, 1, 1, 78);
    return test_finish("test_attention", &ctx);
}
