/* Head-sparse attention (src/attn/sparse.c) against the reference path (attn_forward_f32 /
 * attn_backward_f32, the definition): forward y, gates, lb_loss and backward dx plus every
 * parameter gradient agree to 1e-5 relative on configs covering N = 1, N not a multiple of the
 * tile sizes, heads no token selects, top_k = E, h_s = 0, GQA, causal and bidirectional, RoPE on
 * and off (and with rope_scaling llama3 / linear), all routers, biases and B > 1; the portable kernels agree too; results are bitwise the
 * same for 1 and 2 threads (within 1e-6 on CPUs where oneDNN's sgemm itself is not: see
 * sgemm_thread_invariant); the cache size is linear in N. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "attn/sparse.h"
#include "attn/sparse_kernels.h"
#include "ops/bf16.h"
#include "ops/gemm.h"
#include "test_util.h"

typedef struct sp_case {
    const char *name;
    int C, h, hkv, d, hs, K;
    moh_router router;
    bool causal, qkv_bias, proj_bias;
    double rope, beta;
    int B, N;
    int dead; /* routed head forced to be selected by no token (-1: none) */
    bool ste; /* query_norm: straight-through estimator (spec §10) */
} sp_case;

static moh_attn_config make_cfg(const sp_case *sc, const moh_rope_scaling *scaling) {
    moh_attn_config c;
    moh_attn_config_default(&c);
    c.hidden_size = sc->C;
    c.n_heads = sc->h;
    c.n_kv_heads = sc->hkv;
    c.head_dim = sc->d;
    c.shared_heads = sc->hs;
    c.top_k = sc->K;
    c.router = sc->router;
    c.causal = sc->causal;
    c.qkv_bias = sc->qkv_bias;
    c.proj_bias = sc->proj_bias;
    c.rope_theta = sc->rope;
    if (scaling) c.rope_scaling = *scaling;
    c.load_balance_coef = sc->beta;
    c.straight_through = sc->ste;
    return c;
}

typedef struct sp_run {
    float *y, *dx, *gw;
    float gates_lb;
} sp_run;

/* Runs the sparse path on the kernels `vec` (sp_vec, at most what the CPU has; < 0: as detected);
 * returns y, dx, gradients (caller frees) and copies gates into gates. */
static void run_sparse(test_ctx *ctx, const moh_attn_config *cfg, const attn_params_f32 *p,
                       size_t np, const float *x, const float *dy, int B, int N, int vec,
                       float **y, float **dx, float **gw, float *gates, float *lb) {
    const size_t T = (size_t)B * N, C = (size_t)cfg->hidden_size;
    sparse_cache c;
    moh_error err;
    CHECK(ctx, sparse_cache_init(&c, cfg, B, N, &err) == MOH_OK, "sparse cache: %s", err.msg);
    if (vec >= 0) c.vec = vec;
    *y = malloc(sizeof(float) * T * C);
    *dx = calloc(T * C, sizeof(float));
    *gw = calloc(np ? np : 1, sizeof(float));
    attn_params_f32 g;
    attn_params_bind_f32(&g, *gw, cfg);
    sparse_forward_f32(cfg, p, x, B, N, *y, &c);
    memcpy(gates, c.rc.gates, sizeof(float) * T * cfg->n_heads);
    *lb = c.rc.lb_loss;
    sparse_backward_f32(cfg, p, &g, &c, dy, (float)cfg->load_balance_coef, *dx);
    sparse_cache_free(&c);
}

/* Whether oneDNN's sgemm (gemm_f32: the sparse path's dense K/V projection and its gradients)
 * gives the same bits with one thread as with all at shapes like the layers' below. It does not on
 * every CPU: on an AVX2-only AMD EPYC, rows at the edges of its per-thread row blocks differed in
 * the last bits (1e-5 relative). moh's own kernels never depend on the thread count. */
static bool sgemm_thread_invariant(void) {
    static const int shp[][3] = {{200, 64, 32}, {64, 32, 200}, {100, 64, 32}, {134, 32, 64}, {90, 48, 32}};
    const int nt = omp_get_max_threads();
    bool same = true;
    test_rng r = {5};
    for (size_t s = 0; s < sizeof shp / sizeof shp[0] && same; s++) {
        const int M = shp[s][0], N = shp[s][1], K = shp[s][2];
        float *a = malloc(sizeof(float) * M * K), *b = malloc(sizeof(float) * K * N);
        float *c1 = malloc(sizeof(float) * M * N), *c2 = malloc(sizeof(float) * M * N);
        for (int i = 0; i < M * K; i++) a[i] = (float)test_rng_uniform(&r);
        for (int i = 0; i < K * N; i++) b[i] = (float)test_rng_uniform(&r);
        for (int t = 0; t < 4 && same; t++) {
            const bool ta = t & 1, tb = t & 2;
            gemm_f32(ta, tb, M, N, K, 1.0f, a, ta ? M : K, b, tb ? K : N, 0.0f, c1, N);
            omp_set_num_threads(1);
            gemm_f32(ta, tb, M, N, K, 1.0f, a, ta ? M : K, b, tb ? K : N, 0.0f, c2, N);
            omp_set_num_threads(nt);
            same = !memcmp(c1, c2, sizeof(float) * M * N);
        }
        free(a);
        free(b);
        free(c1);
        free(c2);
    }
    return same;
}

/* Runs the reference path into rc (initialised by the caller, B x N) and the sparse path, both
 * kernel families, on weights w [np], input x and upstream gradient dy; checks y, gates,
 * lb_loss, dx and every gradient to 1e-5 relative; with one thread instead of all, check_threads 2:
 * bitwise equal, 1: within 1e-6 (sgemm_thread_invariant false), 0: not run. Returns the worst
 * relative error. */
static double compare_paths(test_ctx *ctx, const char *name, const moh_attn_config *cfg, float *w,
                            size_t np, const float *x, const float *dy, int B, int N,
                            int check_threads, attn_cache_f32 *rc) {
    const int C = cfg->hidden_size, h = cfg->n_heads, d = cfg->head_dim;
    const size_t T = (size_t)B * N;
    float *gref = calloc(np, sizeof(float));
    float *yref = malloc(sizeof(float) * T * C), *dxref = calloc(T * C, sizeof(float));
    float *gates = malloc(sizeof(float) * T * h);
    attn_params_f32 p, g;
    attn_params_bind_f32(&p, w, cfg);
    attn_params_bind_f32(&g, gref, cfg);
    attn_forward_f32(cfg, &p, x, B, N, yref, rc);
    attn_backward_f32(cfg, &p, &g, rc, dy, (float)cfg->load_balance_coef, dxref);

    double worst = 0.0;
    for (int pass = 0; pass < 3; pass++) { /* as detected, portable, and AVX2 on an AVX-512 CPU */
        if (pass == 2 && sp_vec_detect() != SP_VEC_AVX512) continue;
        float *y, *dx, *gw, lb;
        run_sparse(ctx, cfg, &p, np, x, dy, B, N, pass == 0 ? -1 : pass == 1 ? SP_VEC_PORTABLE : SP_VEC_AVX2, &y, &dx,
                   &gw, gates, &lb);
        const char *kern = pass == 0 ? "kernels" : pass == 1 ? "portable" : "avx2";
        double e = test_rel_err_f32(y, yref, (long)(T * C));
        worst = fmax(worst, e);
        CHECK(ctx, e <= 1e-5, "%s (%s): y rel err %.3g", name, kern, e);
        e = test_rel_err_f32(gates, rc->gates, (long)(T * h));
        CHECK(ctx, e == 0.0, "%s (%s): gates differ (rel %.3g)", name, kern, e);
        CHECK(ctx, lb == rc->lb_loss, "%s (%s): lb_loss %g vs %g", name, kern, lb, rc->lb_loss);
        e = test_rel_err_f32(dx, dxref, (long)(T * C));
        worst = fmax(worst, e);
        CHECK(ctx, e <= 1e-5, "%s (%s): dx rel err %.3g", name, kern, e);
        attn_params_f32 gs;
        attn_params_bind_f32(&gs, gw, cfg);
        const float *a[] = {gs.w_qkv, gs.b_qkv, gs.w_o, gs.b_o, gs.w_r, gs.w_h, gs.w_s};
        const float *r[] = {g.w_qkv, g.b_qkv, g.w_o, g.b_o, g.w_r, g.w_h, g.w_s};
        const char *names[] = {"w_qkv", "b_qkv", "w_o", "b_o", "w_r (wg)", "w_h (wg_0)", "w_s (wg_1)"};
        const size_t C_ = (size_t)C, hd = (size_t)h * d, qd = (size_t)attn_qkv_dim(cfg);
        const size_t E = (size_t)attn_routed_heads(cfg);
        const size_t n[] = {qd * C_, qd, C_ * hd, C_, E * C_, 2 * C_, (size_t)cfg->shared_heads * C_};
        for (int k = 0; k < 7; k++) {
            if (!r[k]) continue;
            e = test_rel_err_f32(a[k], r[k], (long)n[k]);
            worst = fmax(worst, e);
            CHECK(ctx, e <= 1e-5, "%s (%s): grad %s rel err %.3g", name, kern, names[k], e);
        }
        if (check_threads && pass == 0) { /* same bits with one thread (within 1e-6 where oneDNN's
                                              * sgemm itself is not thread-count invariant) */
            const bool bitwise = check_threads == 2;
            float *y1, *dx1, *gw1, lb1;
            const int nt = omp_get_max_threads();
            omp_set_num_threads(1);
            run_sparse(ctx, cfg, &p, np, x, dy, B, N, -1, &y1, &dx1, &gw1, gates, &lb1);
            omp_set_num_threads(nt);
            if (bitwise) {
                CHECK(ctx, !memcmp(y1, y, sizeof(float) * T * C), "%s: y depends on the thread count", name);
                CHECK(ctx, !memcmp(dx1, dx, sizeof(float) * T * C), "%s: dx depends on the thread count", name);
                CHECK(ctx, !memcmp(gw1, gw, sizeof(float) * np), "%s: gradients depend on the thread count", name);
            } else {
                const double ey = test_rel_err_f32(y1, y, (long)(T * C)), ex = test_rel_err_f32(dx1, dx, (long)(T * C));
                const double eg = test_rel_err_f32(gw1, gw, (long)np);
                CHECK(ctx, ey <= 1e-6 && ex <= 1e-6 && eg <= 1e-6,
                      "%s: 1 vs %d threads: y rel %.3g, dx %.3g, grads %.3g (expected <= 1e-6)", name, nt, ey, ex, eg);
            }
            free(y1);
            free(dx1);
            free(gw1);
        }
        free(y);
        free(dx);
        free(gw);
    }
    free(gref);
    free(yref);
    free(dxref);
    free(gates);
    return worst;
}

static double run_case(test_ctx *ctx, const sp_case *sc, uint64_t seed, int check_threads,
                       const moh_rope_scaling *scaling) {
    moh_attn_config cfg = make_cfg(sc, scaling);
    moh_error err;
    CHECK(ctx, moh_attn_config_validate(&cfg, sc->name, &err) == MOH_OK, "%s: invalid: %s", sc->name, err.msg);
    const int B = sc->B, N = sc->N, C = sc->C, h = sc->h;
    const size_t T = (size_t)B * N, np = attn_params_bind_f32(&(attn_params_f32){0}, NULL, &cfg);
    test_rng rng = {seed};
    float *w = malloc(sizeof(float) * np);
    float *x = malloc(sizeof(float) * T * C), *dy = malloc(sizeof(float) * T * C);
    attn_params_f32 p;
    attn_params_bind_f32(&p, w, &cfg);
    const double ws = 1.0 / sqrt((double)C);
    for (size_t i = 0; i < np; i++) w[i] = (float)(test_rng_uniform(&rng) * 2.0 * ws);
    for (size_t i = 0; i < T * C; i++) x[i] = (float)test_rng_uniform(&rng);
    for (size_t i = 0; i < T * C; i++) dy[i] = (float)test_rng_uniform(&rng);
    if (sc->dead >= 0 && p.w_r) { /* x[:, 0] = 1 and a large negative weight: never selected */
        for (size_t t = 0; t < T; t++) x[t * C] = 1.0f;
        p.w_r[(size_t)sc->dead * C] = -60.0f;
    }

    attn_cache_f32 rc;
    CHECK(ctx, attn_cache_init_f32(&rc, &cfg, B, N, &err) == MOH_OK, "ref cache: %s", err.msg);
    const double worst = compare_paths(ctx, sc->name, &cfg, w, np, x, dy, B, N, check_threads, &rc);
    if (sc->dead >= 0) { /* the forced head really is unused */
        long used = 0;
        for (size_t t = 0; t < T; t++) used += rc.gates[t * h + sc->hs + sc->dead] != 0.0f;
        CHECK(ctx, used == 0, "%s: head %d was meant to be selected by no token (%ld)", sc->name, sc->hs + sc->dead, used);
    }
    printf("  %-34s worst rel err %.2e\n", sc->name, worst);
    attn_cache_free_f32(&rc);
    free(w);
    free(x);
    free(dy);
    return worst;
}

static void memory_test(test_ctx *ctx) {
    moh_attn_config cfg;
    moh_attn_config_default(&cfg);
    cfg.hidden_size = 768;
    cfg.n_heads = cfg.n_kv_heads = 12;
    cfg.head_dim = 64;
    cfg.router = MOH_ROUTER_LEARNED;
    cfg.shared_heads = 3;
    cfg.top_k = 6;
    cfg.qkv_bias = cfg.proj_bias = true;
    const double b1 = (double)sparse_cache_bytes(&cfg, 1, 1024, 2);
    const double b2 = (double)sparse_cache_bytes(&cfg, 1, 2048, 2);
    const double b4 = (double)sparse_cache_bytes(&cfg, 1, 4096, 2);
    /* affine in N: equal increments per doubling step (up to 64-byte buffer alignment) */
    const double inc1 = b2 - b1, inc2 = b4 - b2;
    CHECK(ctx, fabs(inc2 - 2 * inc1) <= 4096, "cache bytes not linear in N: %.0f %.0f %.0f", b1, b2, b4);
    CHECK(ctx, b4 <= 4.0 * b1, "cache at N=4096 (%.0f B) more than 4x N=1024 (%.0f B)", b4, b1);
    /* the reference holds att and datt [B, h, N, N] alone: */
    const double ref4 = 2.0 * 12 * 4096.0 * 4096.0 * sizeof(float);
    CHECK(ctx, b4 < ref4 / 4, "sparse cache %.0f B not far below the reference's N^2 part %.0f B", b4, ref4);
    printf("  cache bytes: N=1024 %.1f MiB, N=2048 %.1f MiB, N=4096 %.1f MiB (reference N^2 part at 4096: %.0f MiB)\n",
           b1 / 1048576, b2 / 1048576, b4 / 1048576, ref4 / 1048576);
}

/* sparse_decode_attend_f32 (KV-cache decode of one head) against a float64 softmax. */
static void decode_test(test_ctx *ctx) {
    const int ns[] = {1, 15, 16, 17, 100, 1000};
    const int ds[] = {7, 8, 20, 24, 32, 64, 72};
    test_rng rng = {12345};
    double worst = 0.0;
    for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++)
        for (size_t b = 0; b < sizeof ds / sizeof ds[0]; b++) {
            const int n = ns[a], d = ds[b];
            const long ld = d + 3; /* rows with a stride */
            float *K = malloc(sizeof(float) * (size_t)n * ld), *V = malloc(sizeof(float) * (size_t)n * ld);
            float *q = malloc(sizeof(float) * d), *out = malloc(sizeof(float) * d), *sc = malloc(sizeof(float) * n);
            double *w = malloc(sizeof(double) * n), *ref = calloc((size_t)d, sizeof(double));
            for (long i = 0; i < n * ld; i++) {
                K[i] = (float)(3 * test_rng_uniform(&rng));
                V[i] = (float)test_rng_uniform(&rng);
            }
            for (int e = 0; e < d; e++) q[e] = (float)test_rng_uniform(&rng);
            double mx = -INFINITY, sum = 0.0;
            for (int j = 0; j < n; j++) {
                double s = 0.0;
                for (int e = 0; e < d; e++) s += (double)q[e] * K[(long)j * ld + e];
                w[j] = s / sqrt((double)d);
                mx = fmax(mx, w[j]);
            }
            for (int j = 0; j < n; j++) sum += (w[j] = exp(w[j] - mx));
            for (int j = 0; j < n; j++)
                for (int e = 0; e < d; e++) ref[e] += 0.7 * w[j] / sum * V[(long)j * ld + e];
            for (int kern = 0; kern < 2; kern++) { /* the dispatched kernel; the AVX2 one on any CPU with it */
                if (kern == 0) sparse_decode_attend_f32(q, K, V, ld, n, d, 0.7f, sc, out);
                else if (!sp_decode_attend_avx2(q, K, V, ld, n, d, 0.7f, sc, out)) continue;
                double num = 0.0, den = 0.0;
                for (int e = 0; e < d; e++) {
                    num = fmax(num, fabs(out[e] - ref[e]));
                    den = fmax(den, fabs(ref[e]));
                }
                const double e = num / fmax(den, 1e-30);
                worst = fmax(worst, e);
                CHECK(ctx, e <= 1e-5, "decode n=%d d=%d (%s): rel err %.3g", n, d, kern ? "avx2" : "dispatched", e);
            }
            free(K);
            free(V);
            free(q);
            free(out);
            free(sc);
            free(w);
            free(ref);
        }
    printf("  decode (one query, one head): worst rel err %.2e\n", worst);
}

/* sparse_decode_attend_group (the query heads of one KV head, K and V read once for all of them
 * where the CPU runs the grouped kernel) against a float64 softmax per head, on an fp32 cache (rows
 * with a stride) and a bf16 one (keys in rows, values pair-interleaved; the unused half of an odd
 * last pair holds NaN bits, which must never reach an output): group sizes 1, 3 and 8, key counts
 * around the 64-key tiles, head widths the grouped kernel takes (multiples of 8 up to 64) and two
 * it leaves to the per-head kernels. */
static void decode_group_test(test_ctx *ctx) {
    const int ns[] = {1, 7, 64, 65, 130, 257}, ds[] = {8, 24, 40, 64, 6, 72}, Gs[] = {1, 3, 8};
    test_rng rng = {4242};
    double worst = 0.0;
    int grouped = 0, total = 0;
    const int best = (int)sparse_bf16_isa_detect();
    for (int b16 = 0, cases = 0; b16 < 2; b16++)
        for (int k = b16 ? best : 0; k >= 0; k--) /* a bf16 cache in every kernel set this CPU has */
        for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++)
            for (size_t b = 0; b < sizeof ds / sizeof ds[0]; b++)
                for (size_t c = 0; c < sizeof Gs / sizeof Gs[0]; c++, total = ++cases) {
                    const int n = ns[a], d = ds[b], G = Gs[c], np = n + (n & 1);
                    const long ld = b16 ? d : d + 3;
                    const sparse_bf16_isa isa = (sparse_bf16_isa)k;
                    const bool grp = sparse_decode_groups(d, b16, isa);
                    /* vdpbf16ps (per head) also rounds q and the probabilities: 2u, as test_decode_bf16 */
                    const double tol = b16 && isa == SPARSE_BF16_DP && !grp ? 2.0 / 256 : 1e-5;
                    grouped += grp;
                    float *Kf = malloc(sizeof(float) * (size_t)np * ld), *Vf = malloc(sizeof(float) * (size_t)np * ld);
                    uint16_t *Kb = malloc(sizeof(uint16_t) * (size_t)np * ld), *Vb = malloc(sizeof(uint16_t) * (size_t)np * ld);
                    float *q = malloc(sizeof(float) * (size_t)G * d), *out = malloc(sizeof(float) * (size_t)G * d);
                    float *sc = malloc(sizeof(float) * (size_t)G * n), gate[8];
                    double *w = malloc(sizeof(double) * n);
                    for (long i = 0; i < (long)np * ld; i++) {
                        Kf[i] = (float)(3 * test_rng_uniform(&rng));
                        Vf[i] = (float)test_rng_uniform(&rng);
                    }
                    if (b16) /* round to bf16: the reference reads what the cache holds */
                        for (int j = 0; j < np; j++)
                            for (int e = 0; e < d; e++) {
                                const uint16_t kb = bf16_round(Kf[(long)j * ld + e]), vb = bf16_round(Vf[(long)j * ld + e]);
                                Kf[(long)j * ld + e] = bf16_value(kb);
                                Vf[(long)j * ld + e] = bf16_value(vb);
                                Kb[(long)j * ld + e] = kb;
                                Vb[(long)(j >> 1) * 2 * ld + 2 * e + (j & 1)] = j < n ? vb : 0x7FC1; /* NaN past n */
                            }
                    for (int i = 0; i < G * d; i++) q[i] = (float)test_rng_uniform(&rng);
                    const float *qs[8];
                    float *ss[8], *os[8];
                    for (int g = 0; g < G; g++) {
                        qs[g] = q + (size_t)g * d;
                        ss[g] = sc + (size_t)g * n;
                        os[g] = out + (size_t)g * d;
                        gate[g] = 0.3f + 0.1f * (float)g;
                        for (int e = 0; e < d; e++) os[g][e] = NAN; /* poisoned */
                    }
                    sparse_decode_attend_group(G, qs, b16 ? (const void *)Kb : Kf, b16 ? (const void *)Vb : Vf, b16, ld,
                                               n, d, gate, ss, os, isa);
                    double err = 0.0;
                    for (int g = 0; g < G; g++) {
                        double mx = -INFINITY, sum = 0.0, num = 0.0, den = 0.0;
                        for (int j = 0; j < n; j++) {
                            double s = 0.0;
                            for (int e = 0; e < d; e++) s += (double)qs[g][e] * Kf[(long)j * ld + e];
                            w[j] = s / sqrt((double)d);
                            mx = fmax(mx, w[j]);
                        }
                        for (int j = 0; j < n; j++) sum += (w[j] = exp(w[j] - mx));
                        for (int e = 0; e < d; e++) {
                            double r = 0.0;
                            for (int j = 0; j < n; j++) r += gate[g] * w[j] / sum * Vf[(long)j * ld + e];
                            num = fmax(num, fabs(os[g][e] - r));
                            den = fmax(den, fabs(r));
                            if (!isfinite(os[g][e])) num = INFINITY;
                        }
                        err = fmax(err, num / fmax(den, 1e-30));
                    }
                    if (tol == 1e-5) worst = fmax(worst, err);
                    CHECK(ctx, err <= tol, "decode group %s (%s) n=%d d=%d G=%d: rel err %.3g > %.3g",
                          b16 ? "bf16" : "fp32", b16 ? sparse_bf16_isa_name(isa) : "fp32", n, d, G, err, tol);
                    free(Kf);
                    free(Vf);
                    free(Kb);
                    free(Vb);
                    free(q);
                    free(out);
                    free(sc);
                    free(w);
                }
    printf("  decode group (G query heads, one KV head): worst rel err %.2e (kernels without vdpbf16ps), %d of %d "
           "cases on the grouped kernel\n",
           worst, grouped, total);
}

/* sparse_decode_gemv_f32 (decode: W_O of the selected heads, q/k/v rows) against float64 sums:
 * head widths with and without a 16-lane tail, row ranges that are not multiples of 4, a row
 * stride past the last head, with and without bias; plain rows (one block of width C). */
static void decode_gemv_test(test_ctx *ctx) {
    const int ds[] = {4, 20, 24, 32, 64, 72}, h = 7, C = 37;
    const int sels[][7] = {{0, 1, 2, 3, 4, 5, 6}, {0, 2, 5}, {6}, {1, 3, 4, 6}};
    const int nsels[] = {7, 3, 1, 4};
    test_rng rng = {777};
    double worst = 0.0;
    for (size_t a = 0; a < sizeof ds / sizeof ds[0]; a++)
        for (size_t b = 0; b < sizeof nsels / sizeof nsels[0]; b++)
            for (int bias = 0; bias < 2; bias++) {
                const int d = ds[a], ldw = h * d + 5, r0 = (int)b, r1 = C - (int)a;
                float *w = malloc(sizeof(float) * (size_t)C * ldw), *x = malloc(sizeof(float) * (size_t)h * d);
                float *bv = malloc(sizeof(float) * C), *out = malloc(sizeof(float) * C);
                for (long i = 0; i < (long)C * ldw; i++) w[i] = (float)test_rng_uniform(&rng);
                for (int i = 0; i < h * d; i++) x[i] = (float)test_rng_uniform(&rng);
                for (int i = 0; i < C; i++) {
                    bv[i] = (float)test_rng_uniform(&rng);
                    out[i] = 1234.0f; /* rows outside [r0, r1) must stay */
                }
                static const int whole[1] = {0};
                for (int kern = 0; kern < 2; kern++) { /* the dispatched kernel; the AVX2 one on any CPU with it */
                    const char *kn = kern ? "avx2" : "dispatched";
                    for (int r = 0; r < C; r++) out[r] = 1234.0f;
                    if (kern == 0) sparse_decode_gemv_f32(w, ldw, bias ? bv : NULL, x, sels[b], nsels[b], d, r0, r1, out);
                    else if (!sp_decode_gemv_avx2(w, ldw, bias ? bv : NULL, x, sels[b], nsels[b], d, r0, r1, out))
                        continue;
                    for (int r = 0; r < C; r++) {
                        if (r < r0 || r >= r1) {
                            CHECK(ctx, out[r] == 1234.0f, "decode gemv d=%d (%s): row %d outside [%d, %d) written", d,
                                  kn, r, r0, r1);
                            continue;
                        }
                        double ref = bias ? bv[r] : 0.0, mag = fabs(ref);
                        for (int k = 0; k < nsels[b]; k++)
                            for (int e = 0; e < d; e++) {
                                const double t = (double)w[(long)r * ldw + sels[b][k] * d + e] * x[sels[b][k] * d + e];
                                ref += t;
                                mag += fabs(t);
                            }
                        const double err = fabs(out[r] - ref) / mag;
                        worst = fmax(worst, err);
                        CHECK(ctx, err <= 1e-6, "decode gemv d=%d sel %zu row %d (%s): %.9g vs %.9g", d, b, r, kn,
                              out[r], ref);
                    }
                    /* the same rows as one block of width h d: a plain product */
                    if (kern == 0) sparse_decode_gemv_f32(w, ldw, NULL, x, whole, 1, h * d, 0, C, out);
                    else sp_decode_gemv_avx2(w, ldw, NULL, x, whole, 1, h * d, 0, C, out);
                    for (int r = 0; r < C; r++) {
                        double ref = 0.0, mag = 0.0;
                        for (int e = 0; e < h * d; e++) {
                            ref += (double)w[(long)r * ldw + e] * x[e];
                            mag += fabs((double)w[(long)r * ldw + e] * x[e]);
                        }
                        CHECK(ctx, fabs(out[r] - ref) <= 1e-6 * mag, "decode gemv whole row %d (%s): %.9g vs %.9g", r,
                              kn, out[r], ref);
                    }
                }
                free(w);
                free(x);
                free(bv);
                free(out);
            }
    printf("  decode gemv (selected heads' W_O columns, q/k/v rows): worst err %.2e of the sum of |terms|\n", worst);
}

/* Huge scores (issue 14): raw scores s_j = sign_j round(sqrt(d) base) + off_j with
 * off_j = round(sqrt(d) j rise / 128) + a random integer in [0, jitter), sign_j = -1 for j < flip.
 * rise = 128, jitter = 0, base = -2e5, d = 16 or 64: scaled scores exactly [-2e5, -2e5+1, ...]. */
typedef struct big_case {
    const char *name;
    int d, n;
    bool causal;
    double base;
    int rise, jitter, flip;
} big_case;

static long big_offset(const big_case *bc, int j, test_rng *rng) {
    const double sd = sqrt((double)bc->d);
    return lround(sd * j * bc->rise / 128.0) + (bc->jitter ? (long)(test_rng_u64(rng) % (uint64_t)bc->jitter) : 0);
}

/* Random integer in [-2, 2] as a float. */
static float small_int(test_rng *rng) { return (float)((int)(test_rng_u64(rng) % 5) - 2); }

/* Layer at huge scores against the reference: integer x and W_Q, W_K make every q.k exact in
 * float in both paths (and scale * q.k exact: sqrt(d) is a power of 2), so only the softmax can
 * differ. C = 3d, 4 heads on one KV head, head 0 shared (every token selects it), learned router:
 *  - head 0: q_t = x_t[0:d], x_t[0] = +-sqrt(d) base + small (every token's scores are huge);
 *    heads 1..3: q = a signed permutation of x_t[2d:3d];
 *  - k_j = x_j[d:2d], k_j[0] = sign_j, k_j[1] solved so that the last query's head-0 raw scores are
 *    exactly those of big_offset; other entries random integers;
 *  - V, W_O, b_o, the router and dy random; W_V and the router skip the columns 0 and d+1 (huge or
 *    solved values). No q/k/v bias: its k part has a zero gradient (softmax shift) that both paths
 *    compute as noise proportional to the scores. */
static void big_layer_case(test_ctx *ctx, const big_case *bc, uint64_t seed) {
    const int d = bc->d, N = bc->n, C = 3 * d, h = 4, t0 = N - 1;
    moh_attn_config cfg;
    moh_attn_config_default(&cfg);
    cfg.hidden_size = C;
    cfg.n_heads = h;
    cfg.n_kv_heads = 1;
    cfg.head_dim = d;
    cfg.shared_heads = 1;
    cfg.top_k = 1;
    cfg.router = MOH_ROUTER_LEARNED;
    cfg.causal = bc->causal;
    cfg.qkv_bias = false;
    cfg.proj_bias = true;
    cfg.rope_theta = 0;
    cfg.load_balance_coef = 0.01;
    moh_error err;
    CHECK(ctx, moh_attn_config_validate(&cfg, bc->name, &err) == MOH_OK, "%s: invalid: %s", bc->name, err.msg);
    const size_t np = attn_params_bind_f32(&(attn_params_f32){0}, NULL, &cfg), T = (size_t)N;
    test_rng rng = {seed};
    float *w = malloc(sizeof(float) * np), *x = malloc(sizeof(float) * T * C), *dy = malloc(sizeof(float) * T * C);
    attn_params_f32 p;
    attn_params_bind_f32(&p, w, &cfg);
    const double ws = 1.0 / sqrt((double)C);
    for (size_t i = 0; i < np; i++) w[i] = (float)(test_rng_uniform(&rng) * 2.0 * ws);
    for (size_t i = 0; i < T * C; i++) dy[i] = (float)test_rng_uniform(&rng);
    for (size_t i = 0; i < T * C; i++) x[i] = small_int(&rng);
    float *wq = p.w_qkv, *wk = p.w_qkv + (size_t)h * d * C, *wv = wk + (size_t)d * C;
    for (int i = 0; i < h; i++)
        for (int e = 0; e < d; e++) {
            float *row = wq + ((size_t)i * d + e) * C;
            memset(row, 0, sizeof(float) * C);
            if (i == 0) row[e] = 1.0f;
            else row[2 * d + (e * 5 + i) % d] = test_rng_u64(&rng) & 1 ? 1.0f : -1.0f;
        }
    for (int e = 0; e < d; e++) {
        memset(wk + (size_t)e * C, 0, sizeof(float) * C);
        wk[(size_t)e * C + d + e] = 1.0f;
        wv[(size_t)e * C] = wv[(size_t)e * C + d + 1] = 0.0f;
    }
    float *rw[] = {p.w_r, p.w_h, p.w_s}; /* router weights, NULL when the config has none */
    const int rrows[] = {attn_routed_heads(&cfg), 2, cfg.shared_heads};
    for (int k = 0; k < 3; k++)
        for (int r = 0; rw[k] && r < rrows[k]; r++) rw[k][(size_t)r * C] = rw[k][(size_t)r * C + d + 1] = 0.0f;
    const float big = (float)lround(sqrt((double)d) * bc->base);
    for (int t = 0; t < N; t++) /* alternating signs: dW_K[:, 0] = sum_j dK_j x_j[0] must not cancel */
        x[(size_t)t * C] = t == t0 ? big : ((t0 - t) % 2 ? -big : big) + small_int(&rng);
    float *xq = x + (size_t)t0 * C;
    xq[1] = 1.0f;
    for (int j = 0; j < N; j++) {
        float *xk = x + (size_t)j * C + d;
        xk[0] = j < bc->flip ? -1.0f : 1.0f;
        float rest = 0.0f;
        for (int e = 2; e < d; e++) rest += xq[e] * xk[e];
        xk[1] = (float)(big_offset(bc, j, &rng) - lround(rest));
    }
    attn_cache_f32 rc;
    CHECK(ctx, attn_cache_init_f32(&rc, &cfg, 1, N, &err) == MOH_OK, "ref cache: %s", err.msg);
    const double worst = compare_paths(ctx, bc->name, &cfg, w, np, x, dy, 1, N, 0, &rc);
    if (bc->rise == 128 && bc->jitter == 0 && bc->flip == 0 && N == 3 && (d == 16 || d == 64)) {
        /* the construction: the reference's head-0 weights of the last query are softmax(0, 1, 2) */
        const float *a = rc.att + (size_t)t0 * N;
        const double want[3] = {0.0900305731703805, 0.2447284710547976, 0.6652409557748219};
        for (int j = 0; j < 3; j++)
            CHECK(ctx, fabs(a[j] - want[j]) <= 1e-6, "%s: reference weight %d = %.8f, want %.8f", bc->name, j, a[j], want[j]);
    }
    printf("  %-34s worst rel err %.2e\n", bc->name, worst);
    attn_cache_free_f32(&rc);
    free(w);
    free(x);
    free(dy);
}

/* sparse_decode_attend_f32 at huge scores against a float64 softmax: integer q and K make every
 * q.k exact. The 3-key cases read the weights directly (V rows e_j, gate 1). */
static void decode_big_test(test_ctx *ctx, const big_case *bc, uint64_t seed) {
    const int d = bc->d, n = bc->n;
    test_rng rng = {seed};
    float *K = malloc(sizeof(float) * (size_t)n * d), *V = malloc(sizeof(float) * (size_t)n * d);
    float *q = malloc(sizeof(float) * d), *out = malloc(sizeof(float) * d), *sc = malloc(sizeof(float) * n);
    double *wt = malloc(sizeof(double) * n), *ref = calloc((size_t)d, sizeof(double));
    const bool onehot = n == 3;
    for (int e = 0; e < d; e++) q[e] = small_int(&rng);
    q[0] = (float)lround(sqrt((double)d) * bc->base);
    q[1] = 1.0f;
    double mx = -INFINITY, sum = 0.0;
    for (int j = 0; j < n; j++) {
        float *kj = K + (size_t)j * d;
        double rest = 0.0;
        for (int e = 0; e < d; e++) {
            kj[e] = small_int(&rng);
            V[(size_t)j * d + e] = onehot ? (float)(e == j) : (float)test_rng_uniform(&rng);
            if (e >= 2) rest += (double)q[e] * kj[e];
        }
        kj[0] = j < bc->flip ? -1.0f : 1.0f;
        kj[1] = (float)(big_offset(bc, j, &rng) - lround(rest));
        double s = 0.0;
        for (int e = 0; e < d; e++) s += (double)q[e] * kj[e];
        wt[j] = s / sqrt((double)d);
        mx = fmax(mx, wt[j]);
    }
    for (int j = 0; j < n; j++) sum += (wt[j] = exp(wt[j] - mx));
    const float gate = onehot ? 1.0f : 0.7f;
    for (int j = 0; j < n; j++)
        for (int e = 0; e < d; e++) ref[e] += gate * wt[j] / sum * V[(size_t)j * d + e];
    sparse_decode_attend_f32(q, K, V, d, n, d, gate, sc, out);
    double num = 0.0, den = 0.0;
    for (int e = 0; e < d; e++) {
        num = fmax(num, fabs(out[e] - ref[e]));
        den = fmax(den, fabs(ref[e]));
    }
    const double err = num / fmax(den, 1e-30);
    CHECK(ctx, err <= 1e-5, "decode %s: rel err %.3g (weights %.6f %.6f %.6f)", bc->name, err, out[0], out[1], out[2]);
    if (onehot && bc->rise == 128 && (d == 16 || d == 64))
        CHECK(ctx, fabs(out[0] - 0.090031) < 1e-6 && fabs(out[1] - 0.244728) < 1e-6 && fabs(out[2] - 0.665241) < 1e-6,
              "decode %s: weights %.6f %.6f %.6f, want 0.090031 0.244728 0.665241", bc->name, out[0], out[1], out[2]);
    printf("  decode %-27s rel err %.2e\n", bc->name, err);
    free(K);
    free(V);
    free(q);
    free(out);
    free(sc);
    free(wt);
    free(ref);
}

static void big_score_tests(test_ctx *ctx) {
    const big_case cases[] = {
        /* name                             d    n causal  base    rise jitter flip */
        {"big: scores -2e5 + {0,1,2}",      16,  3, false, -2e5,   128, 0,     0},
        {"big: scores -2e5 + {0,1,2} d=64", 64,  3, true,  -2e5,   128, 0,     0},
        {"big: positive 3e5, d=64 causal",  64,  20, true, 3e5,    16,  16,    0},
        {"big: +-1.5e5 keys, lazy max",     16,  300, false, 1.5e5, 7,  8,     40},
        {"big: +-1e5 keys, lazy max causal", 64, 300, true, -1e5,   9,  16,    150},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        big_layer_case(ctx, &cases[i], 0xB16B00B5ULL + 977u * (unsigned)i);
    const big_case dec[] = {
        {"-2e5 + {0,1,2} d=16",  16, 3,   false, -2e5,  128, 0,  0},
        {"-2e5 + {0,1,2} d=64",  64, 3,   false, -2e5,  128, 0,  0},
        {"-2e5 + ~{0,1,2} d=72", 72, 3,   false, -2e5,  128, 0,  0},
        {"3e5 n=40 d=64",        64, 40,  false, 3e5,   16,  16, 0},
        {"+-1.5e5 n=100 d=16",   16, 100, false, 1.5e5, 40,  8,  30},
        {"-1e5 n=100 d=72",      72, 100, false, -1e5,  40,  16, 30},
    };
    for (size_t i = 0; i < sizeof dec / sizeof dec[0]; i++) decode_big_test(ctx, &dec[i], 0xDEC0DEULL + 31u * (unsigned)i);
}

/* Runs cmd, returns its stdout (malloc'd) or NULL; *status gets the exit status. */
static char *run_capture(const char *cmd, int *status) {
    FILE *f = popen(cmd, "r");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    size_t got;
    while (buf && (got = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += got;
        if (n + 1 >= cap) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
        }
    }
    *status = pclose(f);
    if (buf) buf[n] = 0;
    return buf;
}

static int count_of(const char *s, const char *needle) {
    int c = 0;
    for (const char *p = strstr(s, needle); p; p = strstr(p + 1, needle)) c++;
    return c;
}

/* `moh bench` smoke test: the JSON rows carry the documented keys (no timing is asserted). */
static void cli_bench_test(test_ctx *ctx) {
    const char *bin = getenv("MOH_BIN");
    if (!bin) {
        printf("  MOH_BIN unset: moh bench smoke test skipped\n");
        return;
    }
    char cmd[2048];
    int st = -1;
    snprintf(cmd, sizeof cmd, "OMP_WAIT_POLICY=passive '%s' bench attention --json --model vit-b --n 64 --repeats 1 2>/dev/null", bin);
    char *out = run_capture(cmd, &st);
    CHECK(ctx, out && st == 0, "moh bench attention failed (status %d)", st);
    if (out) {
        const char *keys[] = {"\"model\": \"vit-b\"", "\"n\": 64", "\"active\"", "\"causal\": false", "\"pass\": \"forward\"",
                              "\"pass\": \"train\"", "\"ms\"", "\"gflops\"", "\"speedup\"", "\"ideal\"", "\"efficiency\"",
                              "\"sgemm_fraction\"", "\"mem_bytes\"", "\"phase_ms\""};
        for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
            CHECK(ctx, strstr(out, keys[k]) != NULL, "bench attention JSON lacks %s", keys[k]);
        CHECK(ctx, count_of(out, "\"model\"") == 8, "bench attention: %d rows, want 8 (4 shares x 2 passes)", count_of(out, "\"model\""));
        free(out);
    }
    snprintf(cmd, sizeof cmd, "OMP_WAIT_POLICY=passive '%s' bench decode --json --model small --context 40 --tokens 4 --repeats 1 2>/dev/null", bin);
    out = run_capture(cmd, &st);
    CHECK(ctx, out && st == 0 && count_of(out, "\"tokens_per_s\"") == 3, "moh bench decode: status %d", st);
    free(out);
    snprintf(cmd, sizeof cmd, "OMP_WAIT_POLICY=passive '%s' bench train --json --phases --configs mha,moh-50 --batch 1 --seq 16 --steps 1 --repeats 1 2>/dev/null", bin);
    out = run_capture(cmd, &st);
    CHECK(ctx, out && st == 0 && count_of(out, "\"tokens_per_s\"") == 4, "moh bench train: status %d", st);
    /* --phases: per row the LM phases, the attention path's own (sparse rows only), the total */
    CHECK(ctx, out && count_of(out, "\"phase_ms\"") == 4 && count_of(out, "\"bwd_attn\"") == 4 &&
               count_of(out, "\"attn.bwd_router\"") == 2 && count_of(out, "\"total\"") == 4,
          "moh bench train --phases --json: phase_ms objects missing");
    free(out);
    snprintf(cmd, sizeof cmd, "OMP_WAIT_POLICY=passive '%s' bench train --json --phases --optimizer muon --configs moh-50 --path sparse --precision both --batch 1 --seq 16 --steps 1 --repeats 1 2>/dev/null", bin);
    out = run_capture(cmd, &st);
    /* the optimizer phase is named after it; bf16 rows run where the CPU has bf16 (else fp32, twice) */
    CHECK(ctx, out && st == 0 && count_of(out, "\"muon\"") >= 1 && count_of(out, "\"adamw\"") == 0,
          "moh bench train --optimizer muon --phases: status %d, no muon phase", st);
    free(out);
    snprintf(cmd, sizeof cmd, "'%s' bench attention --pass sideways >/dev/null 2>&1", bin);
    free(run_capture(cmd, &st));
    CHECK(ctx, WIFEXITED(st) && WEXITSTATUS(st) == 2, "moh bench attention --pass sideways: want exit 2");
    printf("  moh bench attention / decode / train: JSON rows present\n");
}

int main(void) {
    test_ctx ctx = {0};
    const moh_router L = MOH_ROUTER_LEARNED, Q = MOH_ROUTER_QUERY_NORM, D = MOH_ROUTER_NONE;
    const sp_case cases[] = {
        /* name                                C   h hkv  d hs  K  router causal qb    pb    rope   beta  B  N   dead */
        {"learned N=1",                        16, 6, 6,  8, 2, 2, L, false, true, true, 0,     0.01, 1, 1,   -1, false},
        {"learned causal N=1",                 16, 6, 6,  8, 2, 2, L, true,  true, true, 1e4,   0.01, 1, 1,   -1, false},
        {"learned bidir N=131 rope",           32, 6, 6, 16, 2, 2, L, false, true, true, 1e4,   0.01, 1, 131, -1, false},
        {"learned causal N=131 rope",          32, 6, 6, 16, 2, 2, L, true,  true, true, 1e4,   0.01, 1, 131, -1, false},
        {"learned dead head causal",           24, 6, 6,  8, 1, 2, L, true,  false, true, 0,    0.01, 1, 70,  2, false},
        {"learned dead head bidir",            24, 6, 6,  8, 2, 1, L, false, true, false, 1e4,  0.01, 2, 50,  1, false},
        {"learned k=E",                        24, 5, 5,  8, 2, 3, L, false, true, true, 0,     0.01, 1, 77,  -1, false},
        {"learned h_s=0",                      24, 6, 6,  8, 0, 3, L, true,  true, true, 1e4,   0.01, 1, 97,  -1, false},
        {"learned h_s=1 top-1",                24, 5, 5,  8, 1, 1, L, false, false, false, 0,  0.01, 1, 65,  -1, false},
        {"learned GQA causal rope",            32, 8, 2, 16, 2, 3, L, true,  true, true, 1e4,   0.01, 2, 100, -1, false},
        {"learned GQA bidir hkv=1",            32, 4, 1, 24, 1, 2, L, false, false, true, 1e4,  0.01, 1, 129, -1, false},
        {"learned K=0 (soft, all shared)",     24, 4, 4,  8, 4, 0, L, false, true, true, 0,     0.01, 1, 40,  -1, false},
        {"none (dense MHA) bidir",             32, 4, 4, 16, 0, 0, D, false, true, true, 0,     0.01, 2, 67,  -1, false},
        {"none (dense MHA) causal rope",       32, 4, 2, 16, 0, 0, D, true,  false, false, 1e4, 0.01, 1, 200, -1, false},
        {"query_norm causal rope",             32, 8, 8,  8, 4, 2, Q, true,  false, false, 1e4, 0.01, 1, 90,  -1, false},
        {"query_norm bidir B=2 biases",        32, 6, 3,  8, 2, 2, Q, false, true, true, 0,     0.01, 2, 45,  -1, false},
        {"query_norm beta=0",                  32, 6, 6,  8, 3, 2, Q, true,  true, true, 1e4,   0,    1, 33,  -1, false},
        {"query_norm STE causal GQA rope",     32, 9, 3,  8, 3, 4, Q, true,  false, false, 1e4, 0.01, 2, 70,  -1, true},
        {"query_norm STE bidir beta=0",        32, 6, 6,  8, 2, 2, Q, false, true, true, 0,     0,    1, 45,  -1, true},
        {"learned d=64 causal N=300 B=2",      64, 4, 4, 64, 1, 2, L, true,  true, true, 1e4,   0.01, 2, 300, -1, false},
        {"learned d=64 bidir N=257",           64, 4, 4, 64, 1, 2, L, false, true, true, 0,     0.01, 1, 257, -1, false},
        {"learned d=72 C=80 causal",           80, 3, 3, 72, 1, 1, L, true,  true, true, 1e4,   0.01, 1, 150, -1, false},
    };
    const int n = (int)(sizeof cases / sizeof cases[0]);
    double worst = 0.0;
    const int thr = sgemm_thread_invariant() ? 2 : 1;
    if (thr == 1)
        printf("oneDNN's sgemm gives other last bits with 1 thread than with %d on this CPU (rows at its partition "
               "edges): the thread-count checks compare within 1e-6, not bitwise\n", omp_get_max_threads());
    for (int i = 0; i < n; i++) worst = fmax(worst, run_case(&ctx, &cases[i], 0x9E3779B97F4A7C15ULL + 7919u * (unsigned)i, i % 3 == 0 ? thr : 0, NULL));
    /* HF rope_scaling: d = 16, original context 32, so llama3 has pairs in all three bands */
    const moh_rope_scaling scalings[2] = {{MOH_ROPE_LLAMA3, 4.0, 1.0, 4.0, 32}, {MOH_ROPE_LINEAR, 2.5, 0, 0, 0}};
    const sp_case scaled[2] = {
        {"learned GQA causal rope llama3",     32, 8, 2, 16, 2, 3, L, true,  true, true, 1e4,   0.01, 2, 100, -1, false},
        {"none causal rope linear",            32, 4, 2, 16, 0, 0, D, true,  false, false, 1e4, 0.01, 1, 200, -1, false},
    };
    for (int i = 0; i < 2; i++) worst = fmax(worst, run_case(&ctx, &scaled[i], 0x51ED270B27ULL + (unsigned)i, i == 0 ? thr : 0, &scalings[i]));
    printf("  worst relative error over all cases: %.2e (limit 1e-5)\n", worst);
    memory_test(&ctx);
    decode_test(&ctx);
    decode_group_test(&ctx);
    decode_gemv_test(&ctx);
    big_score_tests(&ctx);
    cli_bench_test(&ctx);
    return test_finish("test_sparse", &ctx);
}
