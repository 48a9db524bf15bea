/* bf16 compute (src/ops/bf16.c, the bf16 tiles of src/attn/sparse.c): rounding to nearest even;
 * the oneDNN bf16 GEMM against gemm_f32 on random matrices (every transpose, beta 0 and 1, weights
 * from a mirror); the vdpbf16ps register tile against its portable twin; the head-sparse layer
 * in bf16 against fp32 (y and dx within 1e-2 / 2e-2, each gradient block within 3e-2; causal and
 * bidirectional, GQA, odd head_dim); the backward products run in bf16 (d og, dW_O, dW_q, dx)
 * against float64 from the layer's own operands, elementwise within the bf16 rounding bound; a
 * few AdamW steps of a small LM whose bf16 losses track fp32; and one training step of a small ViT
 * and DiT (reference and head-sparse attention) whose bf16 loss and gradient match fp32. Skipped (exit 77, CTest "skipped")
 * with the reason printed when the CPU has no AVX512-BF16 / AMX-BF16 (or MOH_NO_BF16 is set). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn/sparse.h"
#include "attn/sparse_kernels.h"
#include "models/dit.h"
#include "models/model.h"
#include "models/vit.h"
#include "ops/bf16.h"
#include "ops/gemm.h"
#include "test_util.h"
#include "ops/adamw.h"

static void fill(test_rng *r, float *x, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) x[i] = scale * (float)test_rng_uniform(r);
}

static void test_round(test_ctx *ctx) {
    /* 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1.0) */
    CHECK(ctx, bf16_round(1.0f + 0x1p-8f) == 0x3F80, "tie rounds to even: %#x", bf16_round(1.0f + 0x1p-8f));
    CHECK(ctx, bf16_round(1.0f + 0x1p-7f + 0x1p-8f) == 0x3F82, "tie up to even: %#x",
          bf16_round(1.0f + 0x1p-7f + 0x1p-8f));
    CHECK(ctx, bf16_round(1.0f + 0x1p-8f + 0x1p-20f) == 0x3F81, "above the tie rounds up: %#x",
          bf16_round(1.0f + 0x1p-8f + 0x1p-20f));
    CHECK(ctx, isnan(bf16_value(bf16_round(NAN))), "NaN stays NaN");
    CHECK(ctx, bf16_value(bf16_round(-3.0f)) == -3.0f, "exact values are kept");
    test_rng r = {11};
    float x[77], y[77];
    uint16_t h[77];
    fill(&r, x, 77, 100.0f);
    bf16_from_f32(h, x, 77);
    int bad = 0;
    for (int i = 0; i < 77; i++) bad += h[i] != bf16_round(x[i]);
    CHECK(ctx, bad == 0, "bf16_from_f32 (vector) differs from bf16_round on %d of 77", bad);
    bf16_to_f32(y, h, 77);
    double e = test_rel_err_f32(y, x, 77);
    CHECK(ctx, e > 0 && e <= 0x1p-8, "bf16 round trip rel err %.3g, expected (0, 2^-8]", e);
}

/* bf16_gemm against gemm_f32 on the bf16-rounded inputs (the products are exact in fp32, so
 * only the summation order differs: 1e-5) and on the fp32 inputs (bf16 rounding: 1e-2). */
static void test_gemm(test_ctx *ctx) {
    moh_error err;
    test_rng r = {5};
    const int M = 67, N = 45, K = 131;
    float *A = malloc(sizeof(float) * M * K), *B = malloc(sizeof(float) * K * N), *C0 = malloc(sizeof(float) * M * N);
    float *Ar = malloc(sizeof(float) * M * K), *Br = malloc(sizeof(float) * K * N);
    float *C1 = malloc(sizeof(float) * M * N), *C2 = malloc(sizeof(float) * M * N);
    fill(&r, A, (size_t)M * K, 1.0f);
    fill(&r, B, (size_t)K * N, 1.0f);
    fill(&r, C0, (size_t)M * N, 1.0f);
    for (size_t i = 0; i < (size_t)M * K; i++) Ar[i] = bf16_value(bf16_round(A[i]));
    for (size_t i = 0; i < (size_t)K * N; i++) Br[i] = bf16_value(bf16_round(B[i]));
    bf16_mirror mw;
    CHECK(ctx, bf16_mirror_init(&mw, B, (size_t)K * N, &err) == MOH_OK, "%s", err.msg);
    bf16_mirror_sync(&mw);
    for (int use_mirror = 0; use_mirror < 2; use_mirror++) {
        bf16_ctx *c = NULL;
        CHECK(ctx, bf16_ctx_new(&c, use_mirror ? &mw : NULL, &err) == MOH_OK, "%s", err.msg);
        for (int t = 0; t < 8; t++) {
            const bool ta = t & 1, tb = t >> 1 & 1;
            const float beta = (t >> 2) ? 1.0f : 0.0f;
            const int lda = ta ? M : K, ldb = tb ? K : N;
            memcpy(C1, C0, sizeof(float) * M * N);
            memcpy(C2, C0, sizeof(float) * M * N);
            bf16_gemm(c, ta, tb, M, N, K, A, lda, B, ldb, beta, C1, N);
            gemm_f32(ta, tb, M, N, K, 1.0f, Ar, lda, Br, ldb, beta, C2, N);
            double e = test_rel_err_f32(C1, C2, (long)M * N);
            CHECK(ctx, e <= 1e-5, "gemm ta %d tb %d beta %g mirror %d: vs fp32 on rounded inputs rel %.3g", ta, tb,
                  beta, use_mirror, e);
            memcpy(C2, C0, sizeof(float) * M * N);
            gemm_f32(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C2, N);
            e = test_rel_err_f32(C1, C2, (long)M * N);
            CHECK(ctx, e <= 1e-2 && e > 0, "gemm ta %d tb %d beta %g: vs fp32 rel %.3g, expected (0, 1e-2]", ta, tb, beta,
                  e);
        }
        CHECK(ctx, bf16_ctx_fallbacks(c) == 0, "%ld GEMMs fell back to fp32", bf16_ctx_fallbacks(c));
        CHECK(ctx, strcmp(bf16_ctx_impl(c), "none") != 0, "no oneDNN implementation recorded");
        if (use_mirror) printf("oneDNN bf16 matmul: %s\n", bf16_ctx_impl(c));
        bf16_ctx_free(c);
    }
    bf16_mirror_free(&mw);
    free(A);
    free(B);
    free(C0);
    free(Ar);
    free(Br);
    free(C1);
    free(C2);
}

/* The vdpbf16ps tile against the portable loop, odd sizes (rows 1..13, columns past 64), and the
 * row-pair interleaving and the transposed rounding likewise. */
static void test_tile(test_ctx *ctx) {
    test_rng r = {9};
    const int R = 13, n = 77, K2 = 19, lda = 2 * K2 + 4, ldb = 2 * n + 6;
    uint16_t *a = malloc(sizeof(uint16_t) * R * lda), *b = malloc(sizeof(uint16_t) * K2 * ldb);
    float *c1 = malloc(sizeof(float) * R * n), *c2 = malloc(sizeof(float) * R * n);
    float *rows1[13], *rows2[13];
    for (int i = 0; i < R * lda; i++) a[i] = bf16_round((float)test_rng_uniform(&r));
    for (int i = 0; i < K2 * ldb; i++) b[i] = bf16_round((float)test_rng_uniform(&r));
    for (int acc = 0; acc < 2; acc++) {
        fill(&r, c1, (size_t)R * n, 1.0f);
        memcpy(c2, c1, sizeof(float) * R * n);
        for (int i = 0; i < R; i++) {
            rows1[i] = c1 + i * n;
            rows2[i] = c2 + i * n;
        }
        sp_mm_bf16(SP_TILES_DP, R, n, K2, a, lda, b, ldb, rows1, acc);
        sp_mm_bf16(SP_TILES_PORTABLE, R, n, K2, a, lda, b, ldb, rows2, acc);
        const double e = test_rel_err_f32(c1, c2, (long)R * n);
        CHECK(ctx, e <= 1e-5, "vdpbf16ps tile vs portable (acc %d): rel %.3g", acc, e);
    }
    /* pair interleaving of rows (the backward's P and dS): vector against portable, odd sizes */
    const int PR = 7, PN = 37, ld = 2 * 40;
    float *src = malloc(sizeof(float) * PR * PN);
    const float *prow[7];
    uint16_t *i1 = calloc((size_t)4 * ld, sizeof(uint16_t)), *i2 = calloc((size_t)4 * ld, sizeof(uint16_t));
    fill(&r, src, (size_t)PR * PN, 3.0f);
    for (int i = 0; i < PR; i++) prow[i] = src + i * PN;
    sp_bf16_row_pairs(true, PR, PN, prow, i1, ld);
    sp_bf16_row_pairs(false, PR, PN, prow, i2, ld);
    CHECK(ctx, !memcmp(i1, i2, sizeof(uint16_t) * 4 * ld), "row pairs: vector and portable differ");
    CHECK(ctx, i2[2 * 5 + 1] == bf16_round(prow[1][5]) && i2[ld + 2 * 36] == bf16_round(prow[2][36]) &&
               i2[3 * ld + 2 * 9 + 1] == 0, "row pairs: wrong layout");
    /* pairs of bf16 rows (the gathered token rows of dW_q, dW_O): vector against portable, the
     * bf16 rows of the same floats against the fp32 interleaving */
    uint16_t *r16 = malloc(sizeof(uint16_t) * PR * PN);
    const uint16_t *r16p[7];
    for (int i = 0; i < PR; i++) {
        bf16_from_f32(r16 + i * PN, prow[i], PN);
        r16p[i] = r16 + i * PN;
    }
    memset(i2, 0, sizeof(uint16_t) * 4 * ld);
    sp_bf16_row_pairs16(true, PR, PN, r16p, i2, ld);
    CHECK(ctx, !memcmp(i1, i2, sizeof(uint16_t) * 4 * ld), "row pairs of bf16 rows differ from those of fp32 rows");
    memset(i2, 0, sizeof(uint16_t) * 4 * ld);
    sp_bf16_row_pairs16(false, PR, PN, r16p, i2, ld);
    CHECK(ctx, !memcmp(i1, i2, sizeof(uint16_t) * 4 * ld), "row pairs of bf16 rows: portable differs");
    free(r16);
    /* transposed rounding (dQ^T, og^T, q^T, dO^T): vector against portable, rows past a multiple of 16 */
    const int TR = 21, TN = 9, tld = TR + 3; /* src rows of 11 floats: 21 * 11 <= 7 * 37 */
    uint16_t *t1 = calloc((size_t)TN * tld, sizeof(uint16_t)), *t2 = calloc((size_t)TN * tld, sizeof(uint16_t));
    sp_bf16_transpose(true, TR, TN, src, 11, t1, tld);
    sp_bf16_transpose(false, TR, TN, src, 11, t2, tld);
    CHECK(ctx, !memcmp(t1, t2, sizeof(uint16_t) * TN * tld), "transpose: vector and portable differ");
    CHECK(ctx, t2[4 * tld + 17] == bf16_round(src[17 * 11 + 4]) && t2[8 * tld + TR] == 0, "transpose: wrong layout");
    free(t1);
    free(t2);
    free(src);
    free(i1);
    free(i2);
    free(a);
    free(b);
    free(c1);
    free(c2);
}

/* The AMX tile blocking (16-row A tiles, 16 x 16 C tiles, 64 columns per pass, zero-padded edge
 * tiles) against the portable loop: the C emulation of the tile instructions on every CPU, the
 * real tdpbf16ps where the CPU has AMX-BF16 and the OS grants it. Shapes past every block edge
 * (rows 1..40, columns 1..150, pairs 1..40), strided A and A by row pointers, both acc modes. */
static void test_amx(test_ctx *ctx) {
    test_rng r = {21};
    const bool real = sp_tiles_detect() == SP_TILES_AMX;
    static const int shp[][3] = {{1, 1, 1}, {16, 16, 16}, {40, 77, 19}, {17, 150, 33}, {33, 64, 32},
                                 {5, 130, 40}, {32, 16, 1}, {96, 128, 32}};
    double worst[2] = {0, 0};
    for (size_t s = 0; s < sizeof shp / sizeof shp[0]; s++) {
        const int R = shp[s][0], n = shp[s][1], K2 = shp[s][2], lda = 2 * K2 + 6, ldb = 2 * n + 10;
        uint16_t *a = malloc(sizeof(uint16_t) * R * lda), *b = malloc(sizeof(uint16_t) * K2 * ldb);
        float *c0 = malloc(sizeof(float) * R * n), *c1 = malloc(sizeof(float) * R * n);
        float **r0 = malloc(sizeof(float *) * R), **r1 = malloc(sizeof(float *) * R);
        const uint16_t **ap = malloc(sizeof(uint16_t *) * R);
        for (int i = 0; i < R * lda; i++) a[i] = bf16_round((float)test_rng_uniform(&r));
        for (int i = 0; i < K2 * ldb; i++) b[i] = bf16_round((float)test_rng_uniform(&r));
        for (int i = 0; i < R; i++) {
            r0[i] = c0 + (size_t)i * n;
            r1[i] = c1 + (size_t)i * n;
            ap[i] = a + (size_t)(R - 1 - i) * lda; /* rows by pointer, in another order */
        }
        for (int kind = 0; kind < (real ? 2 : 1); kind++) {
            const sp_tiles isa = kind ? SP_TILES_AMX : SP_TILES_AMX_EMU;
            for (int acc = 0; acc < 2; acc++)
                for (int rows = 0; rows < 2; rows++) {
                    fill(&r, c0, (size_t)R * n, 1.0f);
                    memcpy(c1, c0, sizeof(float) * R * n);
                    if (rows) {
                        sp_mm_bf16_rows(isa, R, n, K2, ap, b, ldb, r1, acc);
                        sp_mm_bf16_rows(SP_TILES_PORTABLE, R, n, K2, ap, b, ldb, r0, acc);
                    } else {
                        sp_mm_bf16(isa, R, n, K2, a, lda, b, ldb, r1, acc);
                        sp_mm_bf16(SP_TILES_PORTABLE, R, n, K2, a, lda, b, ldb, r0, acc);
                    }
                    const double e = test_rel_err_f32(c1, c0, (long)R * n);
                    worst[kind] = fmax(worst[kind], e);
                    CHECK(ctx, e <= 1e-5, "%s tiles vs portable, R %d n %d K2 %d acc %d rows %d: rel %.3g",
                          sp_tiles_name(isa), R, n, K2, acc, rows, e);
                }
        }
        free(a);
        free(b);
        free(c0);
        free(c1);
        free(r0);
        free(r1);
        free(ap);
    }
    printf("AMX tiles vs portable: emulation rel %.2e; %s\n", worst[0],
           real ? "tdpbf16ps ran on this CPU" : "no permitted AMX-BF16 here: the emulation only");
    if (real) printf("  tdpbf16ps rel %.2e\n", worst[1]);
}

typedef struct lay_case {
    const char *name;
    int C, h, hkv, d, hs, K;
    bool causal;
    int B, N;
} lay_case;

/* One head-sparse layer of case lc with router `router` (learned: lc's h_s and top_k; none),
 * random weights and inputs from seed, run forward and backward in fp32 (k = 0) and in bf16
 * (k = 1; its tile products as `tiles` (sp_tiles), or as detected when tiles < 0); the caches are kept
 * for inspection. */
typedef struct lay_run {
    moh_attn_config cfg;
    size_t np, T;
    float *w, *x, *dy, *y[2], *dx[2], *g[2];
    attn_params_f32 p;
    bf16_mirror mw;
    bf16_ctx *b;
    sparse_cache c[2];
} lay_run;
static void lay_run_init(test_ctx *ctx, lay_run *L, const lay_case *lc, moh_router router, uint64_t seed, int tiles) {
    memset(L, 0, sizeof *L);
    moh_attn_config *cfg = &L->cfg;
    moh_attn_config_default(cfg);
    cfg->hidden_size = lc->C;
    cfg->n_heads = lc->h;
    cfg->n_kv_heads = lc->hkv;
    cfg->head_dim = lc->d;
    cfg->router = router;
    cfg->shared_heads = router == MOH_ROUTER_NONE ? 0 : lc->hs;
    cfg->top_k = router == MOH_ROUTER_NONE ? 0 : lc->K;
    cfg->causal = lc->causal;
    cfg->rope_theta = lc->d % 2 ? 0.0 : 10000.0;
    cfg->qkv_bias = cfg->proj_bias = true;
    moh_error err;
    CHECK(ctx, moh_attn_config_validate(cfg, "test", &err) == MOH_OK, "%s: %s", lc->name, err.msg);
    L->np = attn_params_bind_f32(&(attn_params_f32){0}, NULL, cfg);
    L->T = (size_t)lc->B * lc->N;
    const size_t T = L->T, C = (size_t)lc->C;
    test_rng r = {seed};
    L->w = malloc(sizeof(float) * L->np);
    L->x = malloc(sizeof(float) * T * C);
    L->dy = malloc(sizeof(float) * T * C);
    fill(&r, L->w, L->np, 0.3f);
    fill(&r, L->x, T * C, 1.0f);
    fill(&r, L->dy, T * C, 1.0f);
    attn_params_bind_f32(&L->p, L->w, cfg);
    CHECK(ctx, bf16_mirror_init(&L->mw, L->w, L->np, &err) == MOH_OK, "%s", err.msg);
    bf16_mirror_sync(&L->mw);
    for (int k = 0; k < 2; k++) { /* 0 fp32, 1 bf16 */
        sparse_cache *c = &L->c[k];
        CHECK(ctx, sparse_cache_init(c, cfg, lc->B, lc->N, &err) == MOH_OK, "%s", err.msg);
        if (k) {
            CHECK(ctx, bf16_ctx_new(&L->b, &L->mw, &err) == MOH_OK, "%s", err.msg);
            CHECK(ctx, sparse_cache_set_bf16_tiles(c, cfg, L->b, tiles, &err) == MOH_OK, "%s", err.msg);
            CHECK(ctx, c->bf16_tiles, "%s: bf16 tiles not enabled on a CPU with AVX512-BF16", lc->name);
        }
        L->y[k] = malloc(sizeof(float) * T * C);
        L->dx[k] = calloc(T * C, sizeof(float));
        L->g[k] = calloc(L->np, sizeof(float));
        attn_params_f32 gp;
        attn_params_bind_f32(&gp, L->g[k], cfg);
        sparse_forward_f32(cfg, &L->p, L->x, lc->B, lc->N, L->y[k], c);
        sparse_backward_f32(cfg, &L->p, &gp, c, L->dy, 0.01f, L->dx[k]);
    }
}
static void lay_run_free(lay_run *L) {
    for (int k = 0; k < 2; k++) {
        sparse_cache_free(&L->c[k]);
        free(L->y[k]);
        free(L->dx[k]);
        free(L->g[k]);
    }
    bf16_ctx_free(L->b);
    bf16_mirror_free(&L->mw);
    free(L->w);
    free(L->x);
    free(L->dy);
}

/* One head-sparse layer in bf16 (forward tiles, bf16 GEMMs) against fp32: y, dx and every
 * gradient block. */
static void test_layer(test_ctx *ctx, const lay_case *lc) {
    lay_run L;
    lay_run_init(ctx, &L, lc, MOH_ROUTER_LEARNED, 77, -1);
    const size_t T = L.T, C = (size_t)lc->C;
    float *const *y = L.y, *const *dx = L.dx, *const *g = L.g;
    double e = test_rel_err_f32(y[1], y[0], (long)(T * C));
    CHECK(ctx, e > 0 && e <= 1e-2, "%s: y bf16 vs fp32 rel %.3g, expected (0, 1e-2]", lc->name, e);
    printf("%-28s y rel %.2e", lc->name, e);
    e = test_rel_err_f32(dx[1], dx[0], (long)(T * C));
    CHECK(ctx, e > 0 && e <= 2e-2, "%s: dx bf16 vs fp32 rel %.3g, expected (0, 2e-2]", lc->name, e);
    printf("  dx %.2e", e);
    /* every gradient block on its own: W_q, W_k, W_v rows (dQ, dK, dV), their biases, W_O, b_O, router */
    attn_params_f32 g0, g1;
    attn_params_bind_f32(&g0, g[0], &L.cfg);
    attn_params_bind_f32(&g1, g[1], &L.cfg);
    const size_t hd = (size_t)lc->h * lc->d, kvd = (size_t)lc->hkv * lc->d;
    const float *blk0[] = {g0.w_qkv, g0.w_qkv + hd * C, g0.w_qkv + (hd + kvd) * C, g0.b_qkv, g0.b_qkv + hd,
                           g0.b_qkv + hd + kvd, g0.w_o, g0.b_o, g0.w_r, g0.w_h, g0.w_s};
    const float *blk1[] = {g1.w_qkv, g1.w_qkv + hd * C, g1.w_qkv + (hd + kvd) * C, g1.b_qkv, g1.b_qkv + hd,
                           g1.b_qkv + hd + kvd, g1.w_o, g1.b_o, g1.w_r, g1.w_h, g1.w_s};
    const size_t len[] = {hd * C, kvd * C, kvd * C, hd, kvd, kvd, C * hd, C,
                          (size_t)(lc->h - lc->hs) * C, 2 * C, (size_t)lc->hs * C};
    const char *nm[] = {"W_q", "W_k", "W_v", "b_q", "b_k", "b_v", "W_O", "b_O", "wg", "wg_0", "wg_1"};
    double worst = 0.0;
    for (int k = 0; k < 11; k++) {
        if (!blk0[k] || !len[k] || k == 4) continue; /* b_k: softmax ignores it, its gradient is 0 (+ rounding) */
        e = test_rel_err_f32(blk1[k], blk0[k], (long)len[k]);
        worst = fmax(worst, e);
        CHECK(ctx, e <= 3e-2, "%s: gradient %s bf16 vs fp32 rel %.3g, expected <= 3e-2", lc->name, nm[k], e);
    }
    e = test_rel_err_f32(g[1], g[0], (long)L.np);
    CHECK(ctx, e > 0, "%s: bf16 gradients equal fp32 bitwise (bf16 not used?)", lc->name);
    printf("  grads (worst block) %.2e\n", worst);
    lay_run_free(&L);
}

/* The same layer with its tile products on AMX (emulated, or real where permitted) against the
 * portable tile loops, tiles forced on (any CPU): the forward with whole 16-row tiles
 * (attn_fwd_block_bf16) and every backward product. Only summation orders differ, so y, dx and the
 * gradients agree far inside bf16's error. */
static void test_layer_amx(test_ctx *ctx, const lay_case *lc, sp_tiles isa) {
    lay_run L0, L1;
    lay_run_init(ctx, &L0, lc, MOH_ROUTER_LEARNED, 77, SP_TILES_PORTABLE);
    lay_run_init(ctx, &L1, lc, MOH_ROUTER_LEARNED, 77, isa);
    const size_t T = L0.T, C = (size_t)lc->C;
    const double ey = test_rel_err_f32(L1.y[1], L0.y[1], (long)(T * C));
    const double ex = test_rel_err_f32(L1.dx[1], L0.dx[1], (long)(T * C));
    const double eg = test_rel_err_f32(L1.g[1], L0.g[1], (long)L0.np);
    const double e0 = test_rel_err_f32(L1.y[1], L1.y[0], (long)(T * C));
    CHECK(ctx, ey <= 1e-4 && ex <= 1e-3 && eg <= 1e-3,
          "%s: %s tiles vs portable: y rel %.3g (<= 1e-4), dx %.3g, grads %.3g (<= 1e-3)", lc->name,
          sp_tiles_name(isa), ey, ex, eg);
    CHECK(ctx, e0 > 0 && e0 <= 1e-2, "%s: %s tiles: y vs fp32 rel %.3g, expected (0, 1e-2]", lc->name,
          sp_tiles_name(isa), e0);
    printf("%-28s %s vs portable tiles: y rel %.2e  dx %.2e  grads %.2e (y vs fp32 %.2e)\n", lc->name,
           sp_tiles_name(isa), ey, ex, eg, e0);
    lay_run_free(&L0);
    lay_run_free(&L1);
}

/* Elementwise check of a bf16 product against float64: |got - sum a_k b_k| <= eb * sum |a_k b_k|,
 * eb = (1 + u)^2 - 1 + (K + 4) u32 (1 + u)^2: each operand rounded to bf16 (u = 2^-8), the
 * products exact in fp32, K fp32 additions (u32 = 2^-24) and a few more roundings of the
 * caller's (a gate, adding a partial sum). Accumulates the worst |err| / bound and the worst
 * |err| / sum |a b| (which must exceed fp32's: the product did run in bf16). */
typedef struct prod_chk {
    double worst_bound, worst_rel;
    long n;
} prod_chk;
static void prod_elem_u(prod_chk *pc, double got, double exact, double absum, long K, double u) {
    const double u32 = 0x1p-24;
    const double eb = (1 + u) * (1 + u) - 1 + (double)(K + 4) * u32 * (1 + u) * (1 + u);
    const double err = fabs(got - exact), den = absum > 1e-30 ? absum : 1e-30;
    pc->worst_bound = fmax(pc->worst_bound, isnan(err) ? INFINITY : err / (eb * den));
    pc->worst_rel = fmax(pc->worst_rel, err / den);
    pc->n++;
}
static void prod_elem(prod_chk *pc, double got, double exact, double absum, long K) {
    prod_elem_u(pc, got, exact, absum, K, 0x1p-8);
}
static void prod_report(test_ctx *ctx, const char *layer, const char *what, const prod_chk *pc) {
    CHECK(ctx, pc->n > 0 && pc->worst_bound <= 1.0, "%s: %s beyond its bf16 bound: worst err / bound %.3g (%ld values)",
          layer, what, pc->worst_bound, pc->n);
    CHECK(ctx, pc->worst_rel > 0x1p-16, "%s: %s within %.3g of float64: not computed in bf16?", layer, what,
          pc->worst_rel);
    printf("  %-5s err/bound %.3f  err/sum|ab| %.2e\n", what, pc->worst_bound, pc->worst_rel);
}

/* The backward products the head-sparse path runs in bf16 against float64 recomputed from the
 * layer's own fp32 operands (sparse_cache after the backward), elementwise within the bf16 bound
 * (prod_elem): d og = dy W_O^i (seen in dO = gate d og), dW_O = sum dy^T og, dW_q = sum dQ^T x
 * per head; with the router "none" (no router term in dx) also dx = sum_i dQ_i W_q^i + [dK|dV]
 * W_{k|v}. And the same tensors against the fp32 layer (relative, as test_layer). The learned
 * router, split over tokens in bf16 mode but fp32 throughout: gates as the fp32 layer's (1e-5,
 * only the logits' summation order differs) and its weight gradient dz^T x within fp32's bound. */
static void test_products(test_ctx *ctx, const lay_case *lc, moh_router router, int tiles) {
    lay_run L;
    lay_run_init(ctx, &L, lc, router, 91, tiles);
    const int B = lc->B, N = lc->N, C = lc->C, h = lc->h, d = lc->d, hd = h * d, kvd = lc->hkv * d;
    const size_t T = L.T;
    const float *x = L.x, *dy = L.dy;
    float *const *dx = L.dx;
    const attn_params_f32 p = L.p;
    const sparse_cache *c = L.c;
    const sparse_cache *cb = &c[1];
    float *dout[2] = {c[0].dout, c[1].dout};
    char layer[96];
    snprintf(layer, sizeof layer, "%s, %s", router == MOH_ROUTER_NONE ? "router none" : lc->name,
             sp_tiles_name((sp_tiles)cb->tiles_isa));
    printf("%s: bf16 products vs float64\n", layer);
    attn_params_f32 gb, gf;
    attn_params_bind_f32(&gb, L.g[1], &L.cfg);
    attn_params_bind_f32(&gf, L.g[0], &L.cfg);
    prod_chk dO = {0}, dwo = {0}, dwq = {0}, dxc = {0};
    double *acc = calloc((size_t)C * d, sizeof(double)), *aab = calloc((size_t)C * d, sizeof(double));
    for (int i = 0; i < h; i++) {
        long K = 0;
        memset(acc, 0, sizeof(double) * C * d);
        memset(aab, 0, sizeof(double) * C * d);
        double *acq = calloc((size_t)C * d, sizeof(double)), *aaq = calloc((size_t)C * d, sizeof(double));
        for (int bb = 0; bb < B; bb++)
            for (int pp = cb->pair_off[bb * h + i]; pp < cb->pair_off[bb * h + i + 1]; pp++, K++) {
                const size_t t = (size_t)bb * N + cb->pair_pos[pp];
                const float gate = cb->rc.gates[t * h + i];
                for (int e = 0; e < d; e++) { /* dO = gate dy W_O^i */
                    double s = 0.0, sa = 0.0;
                    for (int cc = 0; cc < C; cc++) {
                        const double v = (double)dy[t * C + cc] * p.w_o[(size_t)cc * hd + (size_t)i * d + e];
                        s += v;
                        sa += fabs(v);
                    }
                    prod_elem(&dO, cb->dout[(size_t)pp * d + e], gate * s, fabs(gate) * sa, C + 1);
                }
                for (int cc = 0; cc < C; cc++)
                    for (int e = 0; e < d; e++) {
                        const double vo = (double)dy[t * C + cc] * cb->og[(size_t)pp * d + e];
                        const double vq = (double)cb->dq[(size_t)pp * d + e] * x[t * C + cc];
                        acc[(size_t)cc * d + e] += vo;
                        aab[(size_t)cc * d + e] += fabs(vo);
                        acq[(size_t)cc * d + e] += vq;
                        aaq[(size_t)cc * d + e] += fabs(vq);
                    }
            }
        for (int cc = 0; cc < C; cc++)
            for (int e = 0; e < d; e++) {
                prod_elem(&dwo, gb.w_o[(size_t)cc * hd + (size_t)i * d + e], acc[(size_t)cc * d + e],
                          aab[(size_t)cc * d + e], K + 1);
                prod_elem(&dwq, gb.w_qkv[((size_t)i * d + e) * C + cc], acq[(size_t)cc * d + e],
                          aaq[(size_t)cc * d + e], K + 1);
            }
        free(acq);
        free(aaq);
    }
    if (router == MOH_ROUTER_NONE) /* dx = dQ W_q + [dK|dV] W_{k|v}: cb->kv holds dK|dV rows */
        for (size_t t = 0; t < T; t++)
            for (int cc = 0; cc < C; cc++) {
                double s = 0.0, sa = 0.0;
                const int bb = (int)(t / N), n = (int)(t % N);
                for (int i = 0; i < h; i++) {
                    const int off = cb->pair_off[bb * h + i];
                    const int pp = off + n; /* every pair selected: the pair of token n is the n-th */
                    for (int e = 0; e < d; e++) {
                        const double v = (double)cb->dq[(size_t)pp * d + e] * p.w_qkv[((size_t)i * d + e) * C + cc];
                        s += v;
                        sa += fabs(v);
                    }
                }
                for (int j = 0; j < 2 * kvd; j++) {
                    const double v = (double)cb->kv[t * 2 * kvd + j] * p.w_qkv[((size_t)hd + j) * C + cc];
                    s += v;
                    sa += fabs(v);
                }
                prod_elem(&dxc, dx[1][t * C + cc], s, sa, hd + 2 * kvd + h + 1);
            }
    if (router == MOH_ROUTER_LEARNED) { /* the router, split over tokens in bf16 mode, stays fp32 */
        const int E = lc->h - lc->hs, nz = E + (lc->hs >= 1 ? 2 : 0) + (lc->hs >= 2 ? lc->hs : 0);
        const double eg = test_rel_err_f32(cb->rc.gates, c[0].rc.gates, (long)T * h);
        CHECK(ctx, eg <= 1e-5, "%s: gates in bf16 mode vs fp32 rel %.3g, expected <= 1e-5 (fp32 router)", layer, eg);
        prod_chk dwr = {0}; /* d(wg | wg_0 | wg_1) = dz^T x in fp32 from the cache's dz */
        for (int j = 0; j < nz; j++)
            for (int cc = 0; cc < C; cc++) {
                double s = 0.0, sa = 0.0;
                for (size_t t = 0; t < T; t++) {
                    const double v = (double)cb->rdz[t * nz + j] * x[t * C + cc];
                    s += v;
                    sa += fabs(v);
                }
                prod_elem_u(&dwr, gb.w_r[(size_t)j * C + cc], s, sa, (long)T, 0.0);
            }
        CHECK(ctx, dwr.worst_bound <= 1.0, "%s: router weight gradient beyond its fp32 bound: %.3g", layer,
              dwr.worst_bound);
        printf("  dW_router (fp32) err/bound %.3f\n", dwr.worst_bound);
    }
    prod_report(ctx, layer, "dO", &dO);
    prod_report(ctx, layer, "dW_O", &dwo);
    prod_report(ctx, layer, "dW_q", &dwq);
    if (router == MOH_ROUTER_NONE) prod_report(ctx, layer, "dx", &dxc);
    /* against the fp32 layer (its operands differ by the upstream bf16 roundings: as test_layer) */
    const size_t P = (size_t)cb->pair_off[B * h];
    double e = test_rel_err_f32(dout[1], dout[0], (long)(P * d));
    CHECK(ctx, e > 0 && e <= 2e-2, "%s: dO bf16 vs fp32 rel %.3g, expected (0, 2e-2]", layer, e);
    e = test_rel_err_f32(gb.w_o, gf.w_o, (long)C * hd);
    CHECK(ctx, e > 0 && e <= 3e-2, "%s: dW_O bf16 vs fp32 rel %.3g, expected (0, 3e-2]", layer, e);
    e = test_rel_err_f32(gb.w_qkv, gf.w_qkv, (long)hd * C);
    CHECK(ctx, e > 0 && e <= 3e-2, "%s: dW_q bf16 vs fp32 rel %.3g, expected (0, 3e-2]", layer, e);
    e = test_rel_err_f32(dx[1], dx[0], (long)(T * C));
    CHECK(ctx, e > 0 && e <= 2e-2, "%s: dx bf16 vs fp32 rel %.3g, expected (0, 2e-2]", layer, e);
    free(acc);
    free(aab);
    lay_run_free(&L);
}

/* A small MoH LM trained 8 AdamW steps on one random batch in fp32 and in bf16 from the same
 * weights: every step's loss within 1e-2 relative, and both runs learn. */
static void test_lm_train(test_ctx *ctx) {
    static const char cfg[] = "{\"hidden_size\": 64, \"num_hidden_layers\": 2, \"num_attention_heads\": 4,"
                              " \"num_key_value_heads\": 4, \"intermediate_size\": 160, \"vocab_size\": 256,"
                              " \"max_position_embeddings\": 64, \"rms_norm_eps\": 1e-5, \"rope_theta\": 10000,"
                              " \"router\": \"learned\", \"shared_heads\": 1, \"top_k\": 2,"
                              " \"load_balance_coef\": 0.01}";
    moh_error err;
    double loss[2][8];
    for (int k = 0; k < 2; k++) {
        model m;
        CHECK(ctx, model_from_config_text(&m, cfg, sizeof cfg - 1, "test", &err) == MOH_OK, "%s", err.msg);
        m.fam->init_random(m.cfg, m.params, 3);
        model_shards w;
        void *g = NULL, *buf = NULL;
        float *gd = NULL;
        size_t gn = 0;
        moh_batch b;
        CHECK(ctx, model_shards_init(&w, &m, 4, 64, 2, true, true, &err) == MOH_OK, "%s", err.msg);
        CHECK(ctx, model_params_new(m.fam, m.cfg, &g, &gd, &gn, &err) == MOH_OK, "%s", err.msg);
        CHECK(ctx, m.fam->synthetic_batch(m.cfg, 4, 64, 5, &b, &buf, &err) == MOH_OK, "%s", err.msg);
        char why[160];
        CHECK(ctx, model_shards_set_precision(&w, &m, k ? MOH_PRECISION_BF16 : MOH_PRECISION_FP32, why, sizeof why,
                                              &err) == MOH_OK, "%s", err.msg);
        CHECK(ctx, w.precision == (k ? MOH_PRECISION_BF16 : MOH_PRECISION_FP32), "precision %d runs %d (%s)", k,
              w.precision, why);
        float *mom = calloc(m.n, sizeof(float)), *vel = calloc(m.n, sizeof(float));
        const adamw_config ac = {0.9, 0.95, 1e-8, 0.1};
        for (int s = 0; s < 8; s++) {
            memset(gd, 0, sizeof(float) * m.n);
            double ce, lb;
            loss[k][s] = model_shards_step(&m, &w, &b, true, g, gd, &ce, &lb);
            clip_grad_norm(gd, m.n, 1.0);
            adamw_step(&ac, m.data, gd, mom, vel, NULL, m.n, s + 1, 3e-3);
        }
        free(mom);
        free(vel);
        free(buf);
        model_params_free(m.fam, g);
        model_shards_free(&w, &m);
        model_free(&m);
    }
    double worst = 0.0;
    for (int s = 0; s < 8; s++) worst = fmax(worst, fabs(loss[1][s] - loss[0][s]) / loss[0][s]);
    printf("LM 8 steps: loss fp32 %.4f -> %.4f, bf16 %.4f -> %.4f, worst step rel diff %.2e\n", loss[0][0],
           loss[0][7], loss[1][0], loss[1][7], worst);
    CHECK(ctx, worst > 0 && worst <= 1e-2, "bf16 losses vs fp32: worst rel %.3g, expected (0, 1e-2]", worst);
    CHECK(ctx, loss[1][7] < 0.9 * loss[1][0], "bf16 run does not learn: %g -> %g", loss[1][0], loss[1][7]);
    CHECK(ctx, loss[0][7] < 0.9 * loss[0][0], "fp32 run does not learn: %g -> %g", loss[0][0], loss[0][7]);
}

/* One training step (forward + backward, 2 shards, B 6) of a small image model in fp32 and in
 * bf16 from the same weights on one random batch (synthetic_batch: random pixels, labels, and for
 * the DiT timesteps and noise), on the reference or head-sparse attention path. The weights are
 * the family's initialisation plus uniform noise of +-0.05, so the DiT's zero-initialised adaLN
 * gates open and every branch carries gradient. Checks: the bf16 run used oneDNN's bf16 matmul
 * (no fp32 fallback), its loss is within loss_tol and its gradient within grad_tol of fp32 (max
 * abs difference over the max abs fp32 value, the whole buffer), and it differs from fp32.
 * Bounds: each GEMM operand is rounded to bf16 (relative error <= 2^-9 each, ~2^-8 per product),
 * accumulation is fp32; the gradient of the embeddings passes ~4 L + 3 such GEMMs (forward and
 * backward), whose rounding errors add mostly at random: 5 x 2^-8 ~ 2e-2 (measured: ViT 0.85-1.03e-2,
 * DiT 3.4e-3). The loss is a mean over examples and outputs, where those errors average out:
 * 2e-3 ~ 2^-9 (measured <= 1.3e-4). */
static void test_image_step(test_ctx *ctx, const char *name, const char *cfg, bool sparse, double loss_tol,
                            double grad_tol) {
    moh_error err;
    double loss[2];
    float *grad[2] = {NULL, NULL};
    size_t n = 0;
    char impl[96] = "none";
    long fallbacks = -1;
    for (int k = 0; k < 2; k++) {
        model m;
        CHECK(ctx, model_from_config_text(&m, cfg, strlen(cfg), "test", &err) == MOH_OK, "%s: %s", name, err.msg);
        m.fam->init_random(m.cfg, m.params, 3);
        test_rng r = {29};
        for (size_t i = 0; i < m.n; i++) m.data[i] += 0.05f * (float)test_rng_uniform(&r);
        model_shards w;
        void *g = NULL, *buf = NULL;
        float *gd = NULL;
        moh_batch b;
        CHECK(ctx, model_shards_init(&w, &m, 6, 0, 2, true, sparse, &err) == MOH_OK, "%s", err.msg);
        CHECK(ctx, model_params_new(m.fam, m.cfg, &g, &gd, &n, &err) == MOH_OK, "%s", err.msg);
        CHECK(ctx, m.fam->synthetic_batch(m.cfg, 6, 0, 5, &b, &buf, &err) == MOH_OK, "%s", err.msg);
        char why[160];
        CHECK(ctx, model_shards_set_precision(&w, &m, k ? MOH_PRECISION_BF16 : MOH_PRECISION_FP32, why, sizeof why,
                                              &err) == MOH_OK, "%s", err.msg);
        CHECK(ctx, w.precision == (k ? MOH_PRECISION_BF16 : MOH_PRECISION_FP32), "%s: precision %d runs %d (%s)", name,
              k, w.precision, why);
        memset(gd, 0, sizeof(float) * n);
        double ce, lb;
        loss[k] = model_shards_step(&m, &w, &b, true, g, gd, &ce, &lb);
        grad[k] = malloc(sizeof(float) * n);
        memcpy(grad[k], gd, sizeof(float) * n);
        if (k) { /* the shards' GEMM contexts (the first field that differs between the families) */
            const bf16_ctx *c = be_cpu_bf16(&((const attn_stack_f32 *)w.acts[0])->cx);
            snprintf(impl, sizeof impl, "%s", c ? bf16_ctx_impl(c) : "none"); /* the context dies below */
            fallbacks = c ? bf16_ctx_fallbacks(c) : -1;
        }
        free(buf);
        model_params_free(m.fam, g);
        model_shards_free(&w, &m);
        model_free(&m);
    }
    const double el = fabs(loss[1] - loss[0]) / fabs(loss[0]);
    const double eg = test_rel_err_f32(grad[1], grad[0], (long)n);
    printf("%s, %s attention: bf16 loss %.6f vs fp32 %.6f (rel %.2e), gradient rel %.2e; GEMMs %s\n", name,
           sparse ? "head-sparse" : "reference", loss[1], loss[0], el, eg, impl);
    CHECK(ctx, strcmp(impl, "none") && fallbacks == 0, "%s: bf16 GEMMs not used (impl %s, %ld fp32 fallbacks)", name,
          impl, fallbacks);
    CHECK(ctx, el <= loss_tol, "%s: bf16 loss %.6f vs fp32 %.6f: rel %.3g > %.3g", name, loss[1], loss[0], el,
          loss_tol);
    CHECK(ctx, eg > 0 && eg <= grad_tol, "%s: bf16 gradient vs fp32 rel %.3g, expected (0, %.3g]", name, eg, grad_tol);
    free(grad[0]);
    free(grad[1]);
}

int main(void) {
    test_ctx ctx = {0};
    char why[160];
    const lay_case cases[] = {
        {"causal MoH, N 300", 64, 4, 4, 16, 1, 2, true, 2, 300},
        {"bidirectional MoH, N 200", 48, 6, 6, 8, 2, 2, false, 1, 200},
        {"causal GQA, d 32, N 130", 128, 4, 2, 32, 2, 1, true, 2, 130},
        {"odd d 7, no RoPE, N 77", 28, 4, 4, 7, 1, 2, false, 1, 77},
    };
    const size_t ncases = sizeof cases / sizeof cases[0];
    test_round(&ctx); /* portable: runs everywhere */
    test_amx(&ctx);   /* the emulation runs everywhere */
    /* the AMX blocking through whole layers, tiles forced on: on any CPU (without AVX512-BF16 the
     * conversions run portable and oneDNN's bf16 GEMMs, if absent, fp32) */
    for (size_t i = 0; i < ncases; i++) test_layer_amx(&ctx, &cases[i], SP_TILES_AMX_EMU);
    test_products(&ctx, &cases[0], MOH_ROUTER_LEARNED, SP_TILES_AMX_EMU);
    test_products(&ctx, &cases[2], MOH_ROUTER_NONE, SP_TILES_AMX_EMU);
    if (precision_resolve(MOH_PRECISION_BF16, why, sizeof why) != MOH_PRECISION_BF16 ||
        !bf16_detect().avx512_bf16) {
        printf("test_bf16: the checks above ran; skipped the bf16 compute checks: %s\n",
               *why ? why : "no AVX512-BF16 (the bf16 attention tiles need it)");
        return test_finish("test_bf16", &ctx);
    }
    test_gemm(&ctx);
    test_tile(&ctx);
    for (size_t i = 0; i < ncases; i++) test_layer(&ctx, &cases[i]);
    test_products(&ctx, &cases[0], MOH_ROUTER_LEARNED, -1);
    test_products(&ctx, &cases[3], MOH_ROUTER_LEARNED, -1);
    test_products(&ctx, &cases[2], MOH_ROUTER_NONE, -1);
    if (sp_tiles_detect() == SP_TILES_AMX) { /* the real tdpbf16ps where permitted */
        for (size_t i = 0; i < ncases; i++) test_layer_amx(&ctx, &cases[i], SP_TILES_AMX);
        test_products(&ctx, &cases[0], MOH_ROUTER_LEARNED, SP_TILES_AMX);
    }
    test_lm_train(&ctx);
    static const char vit[] = "{\"model_type\": \"vit\", \"img_size\": 16, \"patch_size\": 4, \"in_chans\": 1,"
                              " \"num_classes\": 10, \"embed_dim\": 48, \"depth\": 2, \"num_heads\": 4,"
                              " \"mlp_ratio\": 2.0, \"router\": \"learned\", \"shared_heads\": 1, \"top_k\": 2,"
                              " \"load_balance_coef\": 0.01}";
    static const char dit[] = "{\"model_type\": \"dit\", \"input_size\": 16, \"patch_size\": 2, \"in_channels\": 1,"
                              " \"num_classes\": 4, \"hidden_size\": 48, \"depth\": 2, \"num_heads\": 4,"
                              " \"mlp_ratio\": 2.0, \"router\": \"learned\", \"shared_heads\": [1, 4],"
                              " \"top_k\": [2, 0], \"load_balance_coef\": 0.01}";
    for (int sp = 0; sp < 2; sp++) {
        test_image_step(&ctx, "ViT", vit, sp, 2e-3, 2e-2);
        test_image_step(&ctx, "DiT", dit, sp, 2e-3, 2e-2);
    }
    return test_finish("test_bf16", &ctx);
}
