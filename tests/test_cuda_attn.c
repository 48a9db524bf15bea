/* The CUDA MoH attention layer (src/cuda/, moh_cuda.h) against the CPU engine (the head-sparse
 * path sparse_forward_f32 / sparse_backward_f32, itself within 1e-5 of the reference path), on the
 * same inputs: weights, x and dy drawn at random and rounded to bf16, so both sides start from the
 * same values. Checks, per config (every router, causal or not, RoPE, GQA, biases, N not a multiple
 * of any tile, a head no token chooses, every routed head chosen, extreme scores, head_dim 32-128):
 *  - selection: the GPU's segments (positions per (b, head), ascending) equal the CPU's top-k
 *    masks (a mismatch is allowed only at a near-tie of the CPU scores; the case is then redrawn);
 *  - fp32 sums of bf16 inputs within 1e-5: gates and the load-balance loss (router logits from
 *    bf16 x and weights), the row maxima and log-sum-exps of the attention against float64 from
 *    the GPU's own bf16 q, K (in units of the scaled scores);
 *  - bf16 results within 1e-2 of fp32 (max |gpu - cpu| / max |cpu|): y, dx, every weight gradient;
 *    the attention core against float64 from the GPU's own bf16 q, K, V, dO: o, and dQ, dK, dV
 *    (after RoPE^-1). With extreme scores (W_q, W_k scaled up) the layer's y and gradients are
 *    only reported: the bf16 rounding of q and k then moves scores by whole units, a property of
 *    bf16 inputs, not of the kernels; the core checks (exact inputs on both sides) still hold;
 *  - every value finite with the workspace poisoned (0xFF) before each forward;
 *  - a second run gives the same bits (y, dx, gradients: the dQ accumulation's fixed order).
 * Exits 77 (skipped) when moh was built without CUDA or no GPU is present. */
#include <stdio.h>

#ifndef MOH_HAVE_CUDA
int main(void) {
    printf("test_cuda_attn: skipped (moh was built without CUDA)\n");
    return 77;
}
#else
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attn/sparse.h"
#include "cuda/layer.h"
#include "ops/bf16.h"
#include "test_util.h"

typedef struct cu_case {
    const char *name;
    int C, h, hkv, d, hs, K;
    moh_router router;
    bool causal, qkv_bias, proj_bias;
    double rope, beta;
    int B, N;
    int dead;      /* routed head that no token selects (-1: none) */
    bool ste;      /* query_norm: straight-through estimator */
    double qscale; /* W_q and W_k rows scaled by this (extreme scores) */
} cu_case;

static moh_attn_config make_cfg(const cu_case *k) {
    moh_attn_config c;
    moh_attn_config_default(&c);
    c.hidden_size = k->C;
    c.n_heads = k->h;
    c.n_kv_heads = k->hkv;
    c.head_dim = k->d;
    c.shared_heads = k->hs;
    c.top_k = k->K;
    c.router = k->router;
    c.causal = k->causal;
    c.qkv_bias = k->qkv_bias;
    c.proj_bias = k->proj_bias;
    c.rope_theta = k->rope;
    c.load_balance_coef = k->beta;
    c.straight_through = k->ste;
    return c;
}

/* bf16-representable float. */
static float r16(float x) { return bf16_value(bf16_round(x)); }

/* Outputs of one GPU run, on the host. */
typedef struct gpu_out {
    float *y, *dx, *gw, *gates;
    uint16_t *y16;
    float lb;
    int *cnt, *pos;
} gpu_out;

static void gpu_out_free(gpu_out *o) {
    free(o->y);
    free(o->dx);
    free(o->gw);
    free(o->gates);
    free(o->y16);
    free(o->cnt);
    free(o->pos);
    memset(o, 0, sizeof *o);
}

static bool all_finite(const float *a, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(a[i])) return false;
    return true;
}

/* Forward and backward on the GPU; results copied to o. l is the layer (poisoned). */
static int gpu_run(moh_cuda_layer *l, const moh_attn_config *cfg, const moh_cuda_weights *w, void *x16,
                   void *dy16, int B, int N, size_t np, gpu_out *o, moh_error *err) {
    const size_t T = (size_t)B * N, C = (size_t)cfg->hidden_size, h = (size_t)cfg->n_heads;
    void *y16 = NULL, *dx = NULL, *gbuf = NULL;
    moh_cuda_grads g;
    int rc = cu_dev_alloc(&y16, T * C * 2, err);
    if (!rc) rc = cu_dev_alloc(&dx, T * C * 4, err);
    if (!rc) rc = cu_dev_memset(y16, 0xFF, T * C * 2, err);
    if (!rc) rc = cu_dev_memset(dx, 0, T * C * 4, err);
    if (!rc) rc = cu_grads_alloc(cfg, &gbuf, &g, err);
    if (!rc) rc = moh_cuda_layer_forward(l, w, x16, B, N, y16, NULL, err);
    if (!rc) rc = moh_cuda_layer_lb_loss(l, NULL, &o->lb, err);
    o->y16 = malloc(T * C * 2);
    o->y = malloc(T * C * sizeof(float));
    o->gates = malloc(T * h * sizeof(float));
    o->dx = malloc(T * C * sizeof(float));
    o->gw = calloc(np, sizeof(float));
    o->cnt = malloc((size_t)B * h * sizeof(int));
    o->pos = malloc((size_t)B * h * N * sizeof(int));
    if (!rc) rc = cu_copy_to_host(o->y16, y16, T * C * 2, err);
    if (!rc) rc = cu_copy_to_host(o->gates, moh_cuda_layer_gates(l), T * h * sizeof(float), err);
    if (!rc) rc = cu_layer_segments(l, o->cnt, o->pos, err);
    if (!rc) rc = moh_cuda_layer_backward(l, w, &g, dy16, (float)cfg->load_balance_coef, dx, NULL, err);
    if (!rc) rc = moh_cuda_layer_sync(l, NULL, err);
    if (!rc) rc = cu_copy_to_host(o->dx, dx, T * C * sizeof(float), err);
    if (!rc) {
        attn_params_f32 gp;
        attn_params_bind_f32(&gp, o->gw, cfg);
        rc = cu_grads_download(cfg, &g, &gp, err);
    }
    if (!rc)
        for (size_t i = 0; i < T * C; i++) o->y[i] = bf16_value(o->y16[i]);
    cu_dev_free(y16);
    cu_dev_free(dx);
    cu_dev_free(gbuf);
    return rc;
}

/* The k-th and (k+1)-th largest of v[0..n): their gap relative to the k-th (1 when k == n). */
static double topk_gap(const float *v, int n, int k) {
    if (k >= n) return 1.0;
    float *s = malloc(sizeof(float) * n);
    memcpy(s, v, sizeof(float) * n);
    for (int i = 0; i < n; i++) /* partial selection sort, descending */
        for (int j = i + 1; j < n; j++)
            if (s[j] > s[i]) {
                const float t = s[i];
                s[i] = s[j];
                s[j] = t;
            }
    const double g = fabs((double)s[k - 1] - s[k]) / fmax(fabs((double)s[k - 1]), 1e-30);
    free(s);
    return g;
}

/* The attention core against float64 from the GPU's own packed q, K, V (after RoPE): o (1e-2),
 * the row maximum m and log2-sum-exp (1e-5, fp32 sums of bf16 products), on up to 400 pairs. */
static void core_check(test_ctx *ctx, const char *name, moh_cuda_layer *l, const moh_attn_config *cfg,
                       const gpu_out *go) {
    moh_error err;
    const int B = l->B, N = l->N, h = cfg->n_heads, hkv = cfg->n_kv_heads, d = cfg->head_dim, qd = l->qd;
    const size_t T = (size_t)B * N, S = (size_t)B * h * N;
    uint16_t *qkv = malloc(T * qd * 2), *qp = malloc(S * d * 2), *op = malloc(S * d * 2);
    float *mrow = malloc(S * 4), *lrow = malloc(S * 4);
    int rc = cu_copy_to_host(qkv, l->qkv, T * qd * 2, &err);
    if (!rc) rc = cu_copy_to_host(qp, l->qp, S * d * 2, &err);
    if (!rc) rc = cu_copy_to_host(op, l->op, S * d * 2, &err);
    if (!rc) rc = cu_copy_to_host(mrow, l->mrow, S * 4, &err);
    if (!rc) rc = cu_copy_to_host(lrow, l->lrow, S * 4, &err);
    CHECK(ctx, rc == MOH_OK, "%s: core download: %s", name, err.msg);
    if (rc) goto done;
    double *s = malloc(sizeof(double) * N), *ref = malloc(sizeof(double) * d);
    const double scale = 1.0 / sqrt((double)d), l2e = 1.4426950408889634;
    double eo_num = 0, eo_den = 0, em = 0, el = 0;
    long npairs = 0, total = 0;
    char diag[512] = ""; /* the first far-off outputs: (segment, row, position, column) got / want */
    int ndiag = 0;
    for (size_t sg = 0; sg < (size_t)B * h; sg++) total += go->cnt[sg];
    const long stride = total > 400 ? total / 400 : 1;
    long idx = 0;
    for (size_t sg = 0; sg < (size_t)B * h; sg++) {
        const int b = (int)(sg / h), head = (int)(sg % h), kv = head / (h / hkv);
        for (int r = 0; r < go->cnt[sg]; r++, idx++) {
            if (idx % stride) continue;
            const size_t row = sg * N + r;
            const int pos = go->pos[row], nk = cfg->causal ? pos + 1 : N;
            const uint16_t *q = qp + row * d; /* packed, after RoPE */
            double mx = -INFINITY;
            for (int j = 0; j < nk; j++) {
                const uint16_t *k = qkv + ((size_t)b * N + j) * qd + (size_t)h * d + (size_t)kv * d;
                double a = 0;
                for (int e = 0; e < d; e++) a += (double)bf16_value(q[e]) * bf16_value(k[e]);
                s[j] = a;
                mx = fmax(mx, a);
            }
            double sum = 0;
            for (int e = 0; e < d; e++) ref[e] = 0;
            for (int j = 0; j < nk; j++) {
                const double pj = exp2((s[j] - mx) * scale * l2e);
                sum += pj;
                const uint16_t *v = qkv + ((size_t)b * N + j) * qd + (size_t)(h + hkv) * d + (size_t)kv * d;
                for (int e = 0; e < d; e++) ref[e] += pj * bf16_value(v[e]);
            }
            for (int e = 0; e < d; e++) {
                const double got = bf16_value(op[row * d + e]), want = ref[e] / sum;
                eo_num = fmax(eo_num, fabs(got - want));
                eo_den = fmax(eo_den, fabs(want));
                if (fabs(got - want) > 0.05 * fabs(want) + 0.02 && ndiag < 4) {
                    snprintf(diag + strlen(diag), sizeof diag - strlen(diag), " (s%zu r%d p%d c%d) %.4g/%.4g", sg, r, pos,
                             e, got, want);
                    ndiag++;
                }
            }
            /* both in units of the scaled scores: an fp32 sum of bf16 products is off by ~1e-7 |s| */
            const double unit = fmax(fabs(mx) * scale * l2e, 1.0);
            em = fmax(em, fabs(mrow[row] - mx) * scale * l2e / unit);
            el = fmax(el, fabs(lrow[row] - log2(sum)) / unit);
            npairs++;
        }
    }
    const double eo = eo_num / fmax(eo_den, 1e-30);
    CHECK(ctx, eo <= 1e-2, "%s: attention o vs float64 from the GPU's q, K, V: rel err %.3g;%s", name, eo, diag);
    CHECK(ctx, em <= 1e-5, "%s: row max of q.k vs float64: rel err %.3g", name, em);
    CHECK(ctx, el <= 1e-5, "%s: log2-sum-exp vs float64: rel err %.3g", name, el);
    printf("    core (%ld pairs vs float64): o %.2e, max %.2e, lse %.2e\n", npairs, eo, em, el);
    free(s);
    free(ref);
done:
    free(qkv);
    free(qp);
    free(op);
    free(mrow);
    free(lrow);
}

/* The attention core's backward against float64 from the GPU's own packed q, o, dO (bf16), K and V
 * (after RoPE): dV, dK, dQ (and D = dO . o as the GPU defines it), the GPU's dK and dQ read back
 * from dqkv after RoPE^-1 (applied here in float64). dQ is skipped for query_norm, whose router
 * adds to the same columns. Small cases only (O(B h N^2 d)). */
static void core_bwd_check(test_ctx *ctx, const char *name, moh_cuda_layer *l, const moh_attn_config *cfg,
                           const gpu_out *go) {
    moh_error err;
    const int B = l->B, N = l->N, h = cfg->n_heads, hkv = cfg->n_kv_heads, d = cfg->head_dim, qd = l->qd;
    const int grp = h / hkv, half = d / 2;
    const size_t T = (size_t)B * N, S = (size_t)B * h * N;
    uint16_t *qkv = malloc(T * qd * 2), *dqkv = malloc(T * qd * 2), *qp = malloc(S * d * 2), *op = malloc(S * d * 2),
             *dop = malloc(S * d * 2);
    float *cs = NULL;
    int rc = cu_copy_to_host(qkv, l->qkv, T * qd * 2, &err);
    if (!rc) rc = cu_copy_to_host(dqkv, l->dqkv, T * qd * 2, &err);
    if (!rc) rc = cu_copy_to_host(qp, l->qp, S * d * 2, &err);
    if (!rc) rc = cu_copy_to_host(op, l->op, S * d * 2, &err);
    if (!rc) rc = cu_copy_to_host(dop, l->dop, S * d * 2, &err);
    if (!rc && l->rope_cos) {
        cs = malloc(sizeof(float) * 2 * (size_t)N * half);
        rc = cu_copy_to_host(cs, l->rope_cos, sizeof(float) * (size_t)N * half, &err);
        if (!rc) rc = cu_copy_to_host(cs + (size_t)N * half, l->rope_sin, sizeof(float) * (size_t)N * half, &err);
    }
    CHECK(ctx, rc == MOH_OK, "%s: core backward download: %s", name, err.msg);
    double *dk = calloc((size_t)B * hkv * N * d, sizeof(double)), *dv = calloc((size_t)B * hkv * N * d, sizeof(double));
    double *dq = calloc(S * d, sizeof(double)), *pr = malloc(sizeof(double) * N), *dpv = malloc(sizeof(double) * N);
    const double scale = 1.0 / sqrt((double)d);
#define BV(a, i) ((double)bf16_value((a)[i]))
    for (size_t sg = 0; sg < (size_t)B * h && !rc; sg++) {
        const int b = (int)(sg / h), head = (int)(sg % h), kv = head / grp;
        for (int r = 0; r < go->cnt[sg]; r++) {
            const size_t row = sg * N + r;
            const int pos = go->pos[row], nk = cfg->causal ? pos + 1 : N;
            const size_t qr = row * d; /* packed q, after RoPE */
            double mx = -INFINITY, sum = 0, D = 0;
            for (int e = 0; e < d; e++) D += BV(dop, row * d + e) * BV(op, row * d + e);
            for (int j = 0; j < nk; j++) {
                const size_t kr = ((size_t)b * N + j) * qd + (size_t)h * d + (size_t)kv * d;
                const size_t vr = kr + (size_t)hkv * d;
                double a = 0, c = 0;
                for (int e = 0; e < d; e++) {
                    a += BV(qp, qr + e) * BV(qkv, kr + e);
                    c += BV(dop, row * d + e) * BV(qkv, vr + e);
                }
                pr[j] = a * scale;
                dpv[j] = c;
                mx = fmax(mx, pr[j]);
            }
            for (int j = 0; j < nk; j++) sum += (pr[j] = exp(pr[j] - mx));
            for (int j = 0; j < nk; j++) {
                const double P = pr[j] / sum, dS = P * (dpv[j] - D);
                const size_t kr = ((size_t)b * N + j) * qd + (size_t)h * d + (size_t)kv * d;
                double *dkr = dk + (((size_t)b * hkv + kv) * N + j) * d, *dvr = dv + (((size_t)b * hkv + kv) * N + j) * d;
                for (int e = 0; e < d; e++) {
                    dq[row * d + e] += scale * dS * BV(qkv, kr + e);
                    dkr[e] += scale * dS * BV(qp, qr + e);
                    dvr[e] += P * BV(dop, row * d + e);
                }
            }
        }
    }
    /* RoPE^-1 at a position, in float64, then the max-based relative errors */
    double eq[2] = {0, 0}, ek[2] = {0, 0}, ev[2] = {0, 0};
    for (size_t sg = 0; sg < (size_t)B * h && !rc && cfg->router != MOH_ROUTER_QUERY_NORM; sg++) {
        const int b = (int)(sg / h), head = (int)(sg % h);
        for (int r = 0; r < go->cnt[sg]; r++) {
            const size_t row = sg * N + r;
            const int n = go->pos[row];
            for (int j = 0; j < (cs ? half : d); j++) {
                const double *x = dq + row * d;
                double y1 = x[j], y2 = cs ? x[j + half] : 0;
                if (cs) {
                    const double c = cs[(size_t)n * half + j], sn = -(double)cs[(size_t)N * half + (size_t)n * half + j];
                    y1 = x[j] * c - x[j + half] * sn;
                    y2 = x[j + half] * c + x[j] * sn;
                }
                const size_t gpos = ((size_t)b * N + n) * qd + (size_t)head * d;
                eq[0] = fmax(eq[0], fabs(BV(dqkv, gpos + j) - y1));
                eq[1] = fmax(eq[1], fabs(y1));
                if (cs) {
                    eq[0] = fmax(eq[0], fabs(BV(dqkv, gpos + j + half) - y2));
                    eq[1] = fmax(eq[1], fabs(y2));
                }
            }
        }
    }
    for (int b = 0; b < B && !rc; b++)
        for (int kv = 0; kv < hkv; kv++)
            for (int n = 0; n < N; n++) {
                const double *x = dk + (((size_t)b * hkv + kv) * N + n) * d, *v = dv + (((size_t)b * hkv + kv) * N + n) * d;
                const size_t gk = ((size_t)b * N + n) * qd + (size_t)h * d + (size_t)kv * d, gv = gk + (size_t)hkv * d;
                for (int j = 0; j < d; j++) {
                    double y = x[j];
                    if (cs) {
                        const int jj = j < half ? j : j - half;
                        const double c = cs[(size_t)n * half + jj], sn = -(double)cs[(size_t)N * half + (size_t)n * half + jj];
                        y = j < half ? x[j] * c - x[j + half] * sn : x[j] * c + x[j - half] * sn;
                    }
                    ek[0] = fmax(ek[0], fabs(BV(dqkv, gk + j) - y));
                    ek[1] = fmax(ek[1], fabs(y));
                    ev[0] = fmax(ev[0], fabs(BV(dqkv, gv + j) - v[j]));
                    ev[1] = fmax(ev[1], fabs(v[j]));
                }
            }
#undef BV
    /* relative to the largest reference value, floored at 1e-4: where every reference value is ~0
     * (one key: dS = P (dP - D) = 0 exactly), the GPU's fp32 rounding residue (~1e-7) must stay small */
    const double rq = eq[0] / fmax(eq[1], 1e-4), rk = ek[0] / fmax(ek[1], 1e-4), rv = ev[0] / fmax(ev[1], 1e-4);
    if (cfg->router != MOH_ROUTER_QUERY_NORM) CHECK(ctx, rq <= 1e-2, "%s: core dQ vs float64: rel err %.3g", name, rq);
    CHECK(ctx, rk <= 1e-2, "%s: core dK vs float64: rel err %.3g", name, rk);
    CHECK(ctx, rv <= 1e-2, "%s: core dV vs float64: rel err %.3g", name, rv);
    char qs[32];
    if (cfg->router == MOH_ROUTER_QUERY_NORM) snprintf(qs, sizeof qs, "skipped (query_norm)");
    else snprintf(qs, sizeof qs, "%.2e", rq);
    printf("    core backward vs float64: dQ %s, dK %.2e, dV %.2e\n", qs, rk, rv);
    free(qkv);
    free(dqkv);
    free(qp);
    free(op);
    free(dop);
    free(cs);
    free(dk);
    free(dv);
    free(dq);
    free(pr);
    free(dpv);
}

/* The CPU engine's results for a case. */
typedef struct cpu_ref {
    const float *y, *dx;
    const attn_params_f32 *g;
    const sparse_cache *sc;
    size_t np;
} cpu_ref;

/* Every check of the file header on l's current forward kernel. Returns 0 when the selection
 * differed only at near-ties (the caller redraws), else 1. */
static int check_kernel(test_ctx *ctx, const cu_case *k, const moh_attn_config *cfgp, moh_cuda_layer *l,
                        const moh_cuda_weights *cw, void *dx16, void *ddy16, const cpu_ref *ref) {
    const moh_attn_config cfg = *cfgp;
    const int B = k->B, N = k->N, C = k->C, h = k->h, hs = k->hs, E = attn_routed_heads(&cfg);
    const size_t T = (size_t)B * N, np = ref->np;
    const sparse_cache *sc = ref->sc;
    char name[128];
    snprintf(name, sizeof name, "%s [%s]", k->name, cu_layer_forward_kernel(l));
    moh_error err;
    int ran = 1;
    gpu_out o1 = {0}, o2 = {0};
    int rc = gpu_run(l, &cfg, cw, dx16, ddy16, B, N, np, &o1, &err);
    CHECK(ctx, rc == MOH_OK, "%s: GPU run: %s", name, err.msg);
    if (rc) goto done;

    /* selection: segments vs the CPU's masks */
    long mismatch = 0, bad_order = 0, near = 0;
    double worst_gap = 0;
    uint8_t *sel = calloc(T * h, 1);
    for (int b = 0; b < B; b++)
        for (int i = 0; i < h; i++) {
            const size_t sg = (size_t)b * h + i;
            for (int r = 0; r < o1.cnt[sg]; r++) {
                const int ps = o1.pos[sg * N + r];
                if (ps < 0 || ps >= N || (r > 0 && ps <= o1.pos[sg * N + r - 1])) bad_order++;
                else sel[((size_t)b * N + ps) * h + i] = 1;
            }
        }
    CHECK(ctx, bad_order == 0, "%s: %ld segment positions out of range or out of order", name, bad_order);
    const bool routed = (cfg.router == MOH_ROUTER_LEARNED && cfg.top_k > 0) || cfg.router == MOH_ROUTER_QUERY_NORM;
    for (size_t t = 0; t < T; t++) {
        bool tok_bad = false;
        for (int i = 0; i < h; i++) {
            const bool want = !routed || i < hs || sc->rc.mask[t * E + (i - hs)] != 0;
            if (want != (sel[t * h + i] != 0)) tok_bad = true;
        }
        if (!tok_bad) continue;
        mismatch++;
        const float *score = cfg.router == MOH_ROUTER_QUERY_NORM ? sc->rc.qn + t * E : sc->rc.p + t * E;
        const double gap = topk_gap(score, E, cfg.top_k);
        worst_gap = fmax(worst_gap, gap);
        if (gap < 1e-4) near++;
    }
    free(sel);
    if (mismatch && near == mismatch) { /* near-ties only: the CPU and GPU sums round differently */
        printf("  %-38s %ld token(s) chose differently at near-ties (score gap < 1e-4): redrawn\n", name, mismatch);
        ran = 0;
        goto done;
    }
    CHECK(ctx, mismatch == 0, "%s: %ld tokens select other heads than the CPU (largest score gap %.3g)", name,
          mismatch, worst_gap);

    /* values */
    const double eg = test_rel_err_f32(o1.gates, sc->rc.gates, (long)(T * h));
    CHECK(ctx, eg <= 1e-5, "%s: gates rel err %.3g (fp32 router on bf16 inputs)", name, eg);
    const double elb = fabs(o1.lb - sc->rc.lb_loss) / fmax(fabs(sc->rc.lb_loss), 1e-30);
    CHECK(ctx, sc->rc.lb_loss == 0 ? o1.lb == 0 : elb <= 1e-5, "%s: lb_loss %.8g vs %.8g", name, o1.lb, sc->rc.lb_loss);
    CHECK(ctx, all_finite(o1.y, T * C) && all_finite(o1.dx, T * C) && all_finite(o1.gw, np),
          "%s: non-finite outputs (a poisoned buffer read before written?)", name);
    const double ey = test_rel_err_f32(o1.y, ref->y, (long)(T * C)), edx = test_rel_err_f32(o1.dx, ref->dx, (long)(T * C));
    const double tol = k->qscale == 1.0 ? 1e-2 : INFINITY; /* extreme scores: reported (see the top) */
    CHECK(ctx, ey <= tol, "%s: y rel err %.3g", name, ey);
    CHECK(ctx, edx <= tol, "%s: dx rel err %.3g", name, edx);
    attn_params_f32 gg;
    attn_params_bind_f32(&gg, o1.gw, &cfg);
    const attn_params_f32 *g = ref->g;
    const float *ga[] = {gg.w_qkv, gg.b_qkv, gg.w_o, gg.b_o, gg.w_r, gg.w_h, gg.w_s};
    const float *gr[] = {g->w_qkv, g->b_qkv, g->w_o, g->b_o, g->w_r, g->w_h, g->w_s};
    const char *gn[] = {"w_qkv", "b_qkv", "w_o", "b_o", "wg", "wg_0", "wg_1"};
    const size_t hd = (size_t)h * k->d, qd = (size_t)attn_qkv_dim(&cfg);
    const size_t gnum[] = {qd * C, qd, (size_t)C * hd, (size_t)C, (size_t)E * C, 2 * (size_t)C, (size_t)hs * C};
    char line[512] = "";
    for (int i = 0; i < 7; i++) {
        if (!gr[i]) continue;
        const double e = test_rel_err_f32(ga[i], gr[i], (long)gnum[i]);
        snprintf(line + strlen(line), sizeof line - strlen(line), " %s %.1e", gn[i], e);
        CHECK(ctx, e <= tol, "%s: grad %s rel err %.3g", name, gn[i], e);
    }
    printf("  %-38s y %.1e dx %.1e gates %.1e lb %.1e | grads%s\n", name, ey, edx, eg, elb, line);
    core_check(ctx, name, l, &cfg, &o1);
    if ((double)B * h * N * N * k->d <= 4e8) core_bwd_check(ctx, name, l, &cfg, &o1);

    /* a second run: the same bits */
    rc = gpu_run(l, &cfg, cw, dx16, ddy16, B, N, np, &o2, &err);
    CHECK(ctx, rc == MOH_OK, "%s: GPU run 2: %s", name, err.msg);
    if (!rc) {
        CHECK(ctx, !memcmp(o1.y16, o2.y16, T * C * 2), "%s: y differs between two runs", name);
        CHECK(ctx, !memcmp(o1.dx, o2.dx, T * C * 4), "%s: dx differs between two runs", name);
        CHECK(ctx, !memcmp(o1.gw, o2.gw, np * 4), "%s: gradients differ between two runs", name);
    }
    if (k->dead >= 0) {
        long used = 0;
        for (size_t t = 0; t < T; t++) used += o1.gates[t * h + hs + k->dead] != 0.0f;
        CHECK(ctx, used == 0, "%s: head %d was meant to be selected by no token (%ld)", name, hs + k->dead, used);
    }
done:
    gpu_out_free(&o1);
    gpu_out_free(&o2);
    return ran;
}

/* One config: CPU engine vs GPU. Returns 1 when it ran, 0 when a near-tie made it redraw. */
static int run_case(test_ctx *ctx, const cu_case *k, uint64_t seed) {
    moh_attn_config cfg = make_cfg(k);
    moh_error err;
    CHECK(ctx, moh_attn_config_validate(&cfg, k->name, &err) == MOH_OK, "%s: invalid: %s", k->name, err.msg);
    const int B = k->B, N = k->N, C = k->C, h = k->h;
    const size_t T = (size_t)B * N, np = attn_params_bind_f32(&(attn_params_f32){0}, NULL, &cfg);
    test_rng rng = {seed};
    float *w = malloc(sizeof(float) * np), *x = malloc(sizeof(float) * T * C), *dy = malloc(sizeof(float) * T * C);
    attn_params_f32 p;
    attn_params_bind_f32(&p, w, &cfg);
    const double ws = 1.0 / sqrt((double)C);
    for (size_t i = 0; i < np; i++) w[i] = (float)(test_rng_uniform(&rng) * 2.0 * ws);
    for (size_t i = 0; i < T * C; i++) x[i] = (float)test_rng_uniform(&rng);
    for (size_t i = 0; i < T * C; i++) dy[i] = (float)test_rng_uniform(&rng);
    if (k->qscale != 1.0) /* W_q and W_k rows: large scores */
        for (size_t i = 0; i < (size_t)(h + cfg.n_kv_heads) * k->d * C; i++) w[i] *= (float)k->qscale;
    if (k->dead >= 0 && p.w_r) { /* x[:, 0] = 1 and a large negative router weight */
        for (size_t t = 0; t < T; t++) x[t * C] = 1.0f;
        p.w_r[(size_t)k->dead * C] = -60.0f;
    }
    for (size_t i = 0; i < np; i++) w[i] = r16(w[i]);
    uint16_t *x16 = malloc(T * C * 2), *dy16 = malloc(T * C * 2);
    for (size_t i = 0; i < T * C; i++) {
        x[i] = r16(x[i]);
        dy[i] = r16(dy[i]);
        x16[i] = bf16_round(x[i]);
        dy16[i] = bf16_round(dy[i]);
    }

    /* CPU engine */
    sparse_cache sc;
    CHECK(ctx, sparse_cache_init(&sc, &cfg, B, N, &err) == MOH_OK, "%s: sparse cache: %s", k->name, err.msg);
    float *y = malloc(sizeof(float) * T * C), *dx = calloc(T * C, sizeof(float)), *gw = calloc(np, sizeof(float));
    attn_params_f32 g;
    attn_params_bind_f32(&g, gw, &cfg);
    sparse_forward_f32(&cfg, &p, x, B, N, y, &sc);
    sparse_backward_f32(&cfg, &p, &g, &sc, dy, (float)cfg.load_balance_coef, dx);

    /* GPU: the checks for each forward kernel this GPU runs */
    int ran = 1;
    moh_cuda_layer *l = NULL;
    void *wbuf = NULL, *dx16 = NULL, *ddy16 = NULL;
    moh_cuda_weights cw;
    int rc = moh_cuda_layer_new(&l, &cfg, B, N, &err);
    if (!rc) rc = cu_weights_upload(&cfg, &p, &wbuf, &cw, &err);
    if (!rc) rc = cu_dev_alloc(&dx16, T * C * 2, &err);
    if (!rc) rc = cu_dev_alloc(&ddy16, T * C * 2, &err);
    if (!rc) rc = cu_copy_to_dev(dx16, x16, T * C * 2, &err);
    if (!rc) rc = cu_copy_to_dev(ddy16, dy16, T * C * 2, &err);
    CHECK(ctx, rc == MOH_OK, "%s: GPU setup: %s", k->name, err.msg);
    const cpu_ref ref = {y, dx, &g, &sc, np};
    for (int kind = CU_FWD_MMA; kind <= CU_FWD_WGMMA1 && !rc && ran; kind++) {
        moh_error e2;
        if (cu_layer_set_forward_kernel(l, kind, &e2)) continue; /* not on this GPU / head_dim */
        cu_layer_set_poison(l, true);
        ran = check_kernel(ctx, k, &cfg, l, &cw, dx16, ddy16, &ref);
    }
    moh_cuda_layer_free(l);
    cu_dev_free(wbuf);
    cu_dev_free(dx16);
    cu_dev_free(ddy16);
    sparse_cache_free(&sc);
    free(w);
    free(x);
    free(dy);
    free(x16);
    free(dy16);
    free(y);
    free(dx);
    free(gw);
    return ran;
}

/* Bad shapes and arguments: one-line errors, nothing launched. */
static void error_cases(test_ctx *ctx) {
    const cu_case k = {"errors", 64, 2, 2, 40, 0, 0, MOH_ROUTER_NONE, false, false, false, 0.0, 0.0, 1, 8, -1, false, 1.0};
    moh_attn_config c = make_cfg(&k);
    moh_error err = {0};
    moh_cuda_layer *l = NULL;
    CHECK(ctx, moh_cuda_layer_new(&l, &c, 1, 8, &err) == MOH_E_CONFIG && !l, "head_dim 40 accepted");
    CHECK(ctx, strstr(err.msg, "head_dim 40") != NULL, "message names head_dim: %s", err.msg);
    c.head_dim = 32;
    CHECK(ctx, moh_cuda_layer_new(&l, &c, 0, 8, &err) == MOH_E_ARG && !l, "max_B 0 accepted");
    CHECK(ctx, moh_cuda_layer_new(&l, &c, 2, 8, &err) == MOH_OK, "layer: %s", err.msg);
    moh_cuda_weights w = {0};
    CHECK(ctx, moh_cuda_layer_forward(l, &w, (const uint16_t *)1, 1, 8, (uint16_t *)1, NULL, &err) == MOH_E_ARG,
          "missing weights accepted");
    CHECK(ctx, moh_cuda_layer_forward(l, &w, (const uint16_t *)1, 3, 8, (uint16_t *)1, NULL, &err) == MOH_E_ARG,
          "B 3 > max_B 2 accepted");
    moh_cuda_layer_free(l);
}

/* Shapes the kernels cannot launch, refused by moh_cuda_layer_new before it touches a GPU (so
 * these run on machines without one). */
static void limit_cases(test_ctx *ctx) {
    const cu_case k = {"limits", 128, 4, 4, 32, 1, 2, MOH_ROUTER_LEARNED, false, false, false, 0.0, 0.01, 1, 4, -1, false, 1.0};
    moh_attn_config c = make_cfg(&k);
    moh_error err = {0};
    moh_cuda_layer *l = NULL;
    /* B x heads segments on gridDim.y (<= 65535): 16384 x 4 = 65536 */
    CHECK(ctx, moh_cuda_layer_new(&l, &c, 16384, 4, &err) == MOH_E_ARG && !l, "max_B 16384 x 4 heads accepted");
    CHECK(ctx, strstr(err.msg, "65535") != NULL, "message names the limit: %s", err.msg);
    /* 769 routed heads: the load-balance kernel's shared memory */
    c.n_heads = c.n_kv_heads = 770;
    c.hidden_size = 770 * 32;
    CHECK(ctx, moh_cuda_layer_new(&l, &c, 1, 4, &err) == MOH_E_CONFIG && !l, "769 routed heads accepted");
    CHECK(ctx, strstr(err.msg, "768") != NULL, "message names the limit: %s", err.msg);
}

int main(void) {
    test_ctx ctx = {0};
    limit_cases(&ctx);
    char why[256];
    if (!moh_cuda_available(why, sizeof why)) {
        if (ctx.failures) return test_finish("test_cuda_attn", &ctx);
        printf("test_cuda_attn: %d limit checks passed; the rest skipped (%s)\n", ctx.checks, why);
        return 77;
    }
    char dev[256];
    moh_error err;
    if (moh_cuda_describe(dev, sizeof dev, &err) == MOH_OK) printf("device: %s\n", dev);
    const moh_router L = MOH_ROUTER_LEARNED, Q = MOH_ROUTER_QUERY_NORM, D = MOH_ROUTER_NONE;
    const cu_case cases[] = {
        /* name                         C    h hkv  d   hs K  router causal qb    pb    rope     beta  B  N    dead ste  qscale */
        {"learned vit-like d64",        128, 4, 4, 64, 1, 2, L, false, true, true, 0.0, 0.01, 2, 150, -1, false, 1.0},
        {"learned causal rope d64",     128, 6, 6, 64, 2, 2, L, true, false, false, 10000.0, 0.01, 2, 203, -1, false, 1.0},
        {"learned gqa causal rope d128", 256, 8, 2, 128, 2, 3, L, true, false, false, 500000.0, 0.01, 1, 333, -1, false, 1.0},
        {"learned hs0 d72 biases",      144, 4, 4, 72, 0, 2, L, false, true, true, 0.0, 0.01, 2, 97, -1, false, 1.0},
        {"learned dead head d96",       192, 5, 5, 96, 1, 2, L, false, true, false, 0.0, 0.01, 2, 130, 1, false, 1.0},
        {"learned all chosen d32",      64, 4, 4, 32, 1, 3, L, true, false, true, 10000.0, 0.01, 3, 77, -1, false, 1.0},
        {"learned all shared d80",      160, 3, 3, 80, 3, 0, L, false, true, true, 0.0, 0.01, 2, 65, -1, false, 1.0},
        {"query_norm gqa ste d64",      128, 8, 2, 64, 2, 3, Q, true, false, false, 10000.0, 0.01, 2, 161, -1, true, 1.0},
        {"query_norm bias d128",        256, 4, 4, 128, 1, 2, Q, false, true, false, 0.0, 0.01, 1, 200, -1, false, 1.0},
        {"none (dense) d64",            128, 4, 4, 64, 0, 0, D, false, true, true, 0.0, 0.0, 2, 129, -1, false, 1.0},
        {"none causal gqa d128",        256, 4, 2, 128, 0, 0, D, true, false, false, 10000.0, 0.0, 1, 257, -1, false, 1.0},
        {"extreme scores causal d64",   128, 4, 4, 64, 1, 2, L, true, false, false, 10000.0, 0.01, 1, 140, -1, false, 12.0},
        {"extreme scores bidir d128",   256, 4, 4, 128, 1, 2, L, false, true, true, 0.0, 0.01, 1, 100, -1, false, 10.0},
        {"single token",                128, 4, 4, 64, 1, 2, L, true, true, true, 10000.0, 0.01, 3, 1, -1, false, 1.0},
        {"long causal d64",             128, 4, 4, 64, 1, 2, L, true, false, false, 10000.0, 0.01, 1, 1100, -1, false, 1.0},
        {"long bidir gqa d96",          192, 6, 3, 96, 2, 2, L, false, true, true, 0.0, 0.01, 1, 700, -1, false, 1.0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int ran = 0;
        for (uint64_t s = 1; s <= 3 && !ran; s++) ran = run_case(&ctx, &cases[i], 1000 * (i + 1) + s);
        CHECK(&ctx, ran, "%s: three draws in a row had near-ties", cases[i].name);
    }
    error_cases(&ctx);
    return test_finish("test_cuda_attn", &ctx);
}
#endif
