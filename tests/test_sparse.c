/* Head-sparse attention (src/attn/sparse.c) against the reference path (attn_forward_f32 /
 * attn_backward_f32, the definition): forward y, gates, lb_loss and backward dx plus every
 * parameter gradient agree to 1e-5 relative on configs covering N = 1, N not a multiple of the
 * tile sizes, heads no token selects, top_k = E, h_s = 0, GQA, causal and bidirectional, RoPE on
 * and off, all routers, biases and B > 1; the portable kernels agree too; results are bitwise the
 * same for 1 and 2 threads; the cache size is linear in N. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "attn/sparse.h"
#include "test_util.h"

typedef struct sp_case {
    const char *name;
    int C, h, hkv, d, hs, K;
    moh_router router;
    bool causal, qkv_bias, proj_bias;
    double rope, beta;
    int B, N;
    int dead; /* routed head forced to be selected by no token (-1: none) */
} sp_case;

static moh_attn_config make_cfg(const sp_case *sc) {
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
    c.load_balance_coef = sc->beta;
    return c;
}

typedef struct sp_run {
    float *y, *dx, *gw;
    float gates_lb;
} sp_run;

/* Runs the sparse path; returns y, dx, gradients (caller frees) and copies gates into gates. */
static void run_sparse(test_ctx *ctx, const moh_attn_config *cfg, const attn_params_f32 *p,
                       size_t np, const float *x, const float *dy, int B, int N, bool avx,
                       float **y, float **dx, float **gw, float *gates, float *lb) {
    const size_t T = (size_t)B * N, C = (size_t)cfg->hidden_size;
    sparse_cache c;
    moh_error err;
    CHECK(ctx, sparse_cache_init(&c, cfg, B, N, &err) == MOH_OK, "sparse cache: %s", err.msg);
    if (!avx) c.avx512 = false;
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

static double run_case(test_ctx *ctx, const sp_case *sc, uint64_t seed, bool check_threads) {
    moh_attn_config cfg = make_cfg(sc);
    moh_error err;
    CHECK(ctx, moh_attn_config_validate(&cfg, sc->name, &err) == MOH_OK, "%s: invalid: %s", sc->name, err.msg);
    const int B = sc->B, N = sc->N, C = sc->C, h = sc->h;
    const size_t T = (size_t)B * N, np = attn_params_bind_f32(&(attn_params_f32){0}, NULL, &cfg);
    test_rng rng = {seed};
    float *w = malloc(sizeof(float) * np), *gref = calloc(np, sizeof(float));
    float *x = malloc(sizeof(float) * T * C), *dy = malloc(sizeof(float) * T * C);
    float *yref = malloc(sizeof(float) * T * C), *dxref = calloc(T * C, sizeof(float));
    float *gates = malloc(sizeof(float) * T * h);
    attn_params_f32 p, g;
    attn_params_bind_f32(&p, w, &cfg);
    attn_params_bind_f32(&g, gref, &cfg);
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
    attn_forward_f32(&cfg, &p, x, B, N, yref, &rc);
    attn_backward_f32(&cfg, &p, &g, &rc, dy, (float)cfg.load_balance_coef, dxref);

    double worst = 0.0;
    for (int pass = 0; pass < 2; pass++) { /* AVX-512 kernels (when the CPU has them), portable */
        float *y, *dx, *gw, lb;
        run_sparse(ctx, &cfg, &p, np, x, dy, B, N, pass == 0, &y, &dx, &gw, gates, &lb);
        const char *kern = pass == 0 ? "kernels" : "portable";
        double e = test_rel_err_f32(y, yref, (long)(T * C));
        worst = fmax(worst, e);
        CHECK(ctx, e <= 1e-5, "%s (%s): y rel err %.3g", sc->name, kern, e);
        e = test_rel_err_f32(gates, rc.gates, (long)(T * h));
        CHECK(ctx, e == 0.0, "%s (%s): gates differ (rel %.3g)", sc->name, kern, e);
        CHECK(ctx, lb == rc.lb_loss, "%s (%s): lb_loss %g vs %g", sc->name, kern, lb, rc.lb_loss);
        e = test_rel_err_f32(dx, dxref, (long)(T * C));
        worst = fmax(worst, e);
        CHECK(ctx, e <= 1e-5, "%s (%s): dx rel err %.3g", sc->name, kern, e);
        attn_params_f32 gs;
        attn_params_bind_f32(&gs, gw, &cfg);
        const float *a[] = {gs.w_qkv, gs.b_qkv, gs.w_o, gs.b_o, gs.w_r, gs.w_h, gs.w_s};
        const float *r[] = {g.w_qkv, g.b_qkv, g.w_o, g.b_o, g.w_r, g.w_h, g.w_s};
        const char *names[] = {"w_qkv", "b_qkv", "w_o", "b_o", "w_r (wg)", "w_h (wg_0)", "w_s (wg_1)"};
        const size_t C_ = (size_t)C, hd = (size_t)h * sc->d, qd = (size_t)attn_qkv_dim(&cfg);
        const size_t E = (size_t)attn_routed_heads(&cfg);
        const size_t n[] = {qd * C_, qd, C_ * hd, C_, E * C_, 2 * C_, (size_t)sc->hs * C_};
        for (int k = 0; k < 7; k++) {
            if (!r[k]) continue;
            e = test_rel_err_f32(a[k], r[k], (long)n[k]);
            worst = fmax(worst, e);
            CHECK(ctx, e <= 1e-5, "%s (%s): grad %s rel err %.3g", sc->name, kern, names[k], e);
        }
        if (check_threads && pass == 0) { /* same bits with one thread */
            float *y1, *dx1, *gw1, lb1;
            const int nt = omp_get_max_threads();
            omp_set_num_threads(1);
            run_sparse(ctx, &cfg, &p, np, x, dy, B, N, true, &y1, &dx1, &gw1, gates, &lb1);
            omp_set_num_threads(nt);
            CHECK(ctx, !memcmp(y1, y, sizeof(float) * T * C), "%s: y depends on the thread count", sc->name);
            CHECK(ctx, !memcmp(dx1, dx, sizeof(float) * T * C), "%s: dx depends on the thread count", sc->name);
            CHECK(ctx, !memcmp(gw1, gw, sizeof(float) * np), "%s: gradients depend on the thread count", sc->name);
            free(y1);
            free(dx1);
            free(gw1);
        }
        free(y);
        free(dx);
        free(gw);
    }
    if (sc->dead >= 0) { /* the forced head really is unused */
        long used = 0;
        for (size_t t = 0; t < T; t++) used += rc.gates[t * h + sc->hs + sc->dead] != 0.0f;
        CHECK(ctx, used == 0, "%s: head %d was meant to be selected by no token (%ld)", sc->name, sc->hs + sc->dead, used);
    }
    printf("  %-34s worst rel err %.2e\n", sc->name, worst);
    attn_cache_free_f32(&rc);
    free(w);
    free(gref);
    free(x);
    free(dy);
    free(yref);
    free(dxref);
    free(gates);
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
    const int ds[] = {8, 24, 32, 64, 72};
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
            sparse_decode_attend_f32(q, K, V, ld, n, d, 0.7f, sc, out);
            double num = 0.0, den = 0.0;
            for (int e = 0; e < d; e++) {
                num = fmax(num, fabs(out[e] - ref[e]));
                den = fmax(den, fabs(ref[e]));
            }
            const double e = num / fmax(den, 1e-30);
            worst = fmax(worst, e);
            CHECK(ctx, e <= 1e-5, "decode n=%d d=%d: rel err %.3g", n, d, e);
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
    snprintf(cmd, sizeof cmd, "OMP_WAIT_POLICY=passive '%s' bench train --json --configs mha,moh-50 --batch 1 --seq 16 --steps 1 --repeats 1 2>/dev/null", bin);
    out = run_capture(cmd, &st);
    CHECK(ctx, out && st == 0 && count_of(out, "\"tokens_per_s\"") == 4, "moh bench train: status %d", st);
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
        {"learned N=1",                        16, 6, 6,  8, 2, 2, L, false, true, true, 0,     0.01, 1, 1,   -1},
        {"learned causal N=1",                 16, 6, 6,  8, 2, 2, L, true,  true, true, 1e4,   0.01, 1, 1,   -1},
        {"learned bidir N=131 rope",           32, 6, 6, 16, 2, 2, L, false, true, true, 1e4,   0.01, 1, 131, -1},
        {"learned causal N=131 rope",          32, 6, 6, 16, 2, 2, L, true,  true, true, 1e4,   0.01, 1, 131, -1},
        {"learned dead head causal",           24, 6, 6,  8, 1, 2, L, true,  false, true, 0,    0.01, 1, 70,  2},
        {"learned dead head bidir",            24, 6, 6,  8, 2, 1, L, false, true, false, 1e4,  0.01, 2, 50,  1},
        {"learned k=E",                        24, 5, 5,  8, 2, 3, L, false, true, true, 0,     0.01, 1, 77,  -1},
        {"learned h_s=0",                      24, 6, 6,  8, 0, 3, L, true,  true, true, 1e4,   0.01, 1, 97,  -1},
        {"learned h_s=1 top-1",                24, 5, 5,  8, 1, 1, L, false, false, false, 0,  0.01, 1, 65,  -1},
        {"learned GQA causal rope",            32, 8, 2, 16, 2, 3, L, true,  true, true, 1e4,   0.01, 2, 100, -1},
        {"learned GQA bidir hkv=1",            32, 4, 1, 24, 1, 2, L, false, false, true, 1e4,  0.01, 1, 129, -1},
        {"learned K=0 (soft, all shared)",     24, 4, 4,  8, 4, 0, L, false, true, true, 0,     0.01, 1, 40,  -1},
        {"none (dense MHA) bidir",             32, 4, 4, 16, 0, 0, D, false, true, true, 0,     0.01, 2, 67,  -1},
        {"none (dense MHA) causal rope",       32, 4, 2, 16, 0, 0, D, true,  false, false, 1e4, 0.01, 1, 200, -1},
        {"query_norm causal rope",             32, 8, 8,  8, 4, 2, Q, true,  false, false, 1e4, 0.01, 1, 90,  -1},
        {"query_norm bidir B=2 biases",        32, 6, 3,  8, 2, 2, Q, false, true, true, 0,     0.01, 2, 45,  -1},
        {"query_norm beta=0",                  32, 6, 6,  8, 3, 2, Q, true,  true, true, 1e4,   0,    1, 33,  -1},
        {"learned d=64 causal N=300 B=2",      64, 4, 4, 64, 1, 2, L, true,  true, true, 1e4,   0.01, 2, 300, -1},
        {"learned d=64 bidir N=257",           64, 4, 4, 64, 1, 2, L, false, true, true, 0,     0.01, 1, 257, -1},
        {"learned d=72 C=80 causal",           80, 3, 3, 72, 1, 1, L, true,  true, true, 1e4,   0.01, 1, 150, -1},
    };
    const int n = (int)(sizeof cases / sizeof cases[0]);
    double worst = 0.0;
    for (int i = 0; i < n; i++) worst = fmax(worst, run_case(&ctx, &cases[i], 0x9E3779B97F4A7C15ULL + 7919u * (unsigned)i, i % 3 == 0));
    printf("  worst relative error over all cases: %.2e (limit 1e-5)\n", worst);
    memory_test(&ctx);
    decode_test(&ctx);
    cli_bench_test(&ctx);
    return test_finish("test_sparse", &ctx);
}
