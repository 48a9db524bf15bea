/* bf16 compute (src/ops/bf16.c, the bf16 tiles of src/attn/sparse.c): rounding to nearest even;
 * the oneDNN bf16 GEMM against gemm_f32 on random matrices (every transpose, beta 0 and 1, weights
 * from a mirror); the vdpbf16ps register tile against its portable twin; the head-sparse layer
 * in bf16 against fp32 (y and dx within 1e-2 / 2e-2, each gradient block within 3e-2; causal and
 * bidirectional, GQA, odd head_dim); a
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
#include "train/adamw.h"

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
 * row-pair interleaving likewise. */
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
        sp_mm_bf16(true, R, n, K2, a, lda, b, ldb, rows1, acc);
        sp_mm_bf16(false, R, n, K2, a, lda, b, ldb, rows2, acc);
        const double e = test_rel_err_f32(c1, c2, (long)R * n);
        CHECK(ctx, e <= 1e-5, "vdpbf16ps tile vs portable (acc %d): rel %.3g", acc, e);
    }
    /* pair interleaving of rows (the backward's P and dS): vector against portable, odd sizes */
    const int PR = 7, PN = 37, ld = 2 * 40;
    float *src = malloc(sizeof(float) * PR * PN);
    float *prow[7];
    uint16_t *i1 = calloc((size_t)4 * ld, sizeof(uint16_t)), *i2 = calloc((size_t)4 * ld, sizeof(uint16_t));
    fill(&r, src, (size_t)PR * PN, 3.0f);
    for (int i = 0; i < PR; i++) prow[i] = src + i * PN;
    sp_bf16_row_pairs(true, PR, PN, prow, i1, ld);
    sp_bf16_row_pairs(false, PR, PN, prow, i2, ld);
    CHECK(ctx, !memcmp(i1, i2, sizeof(uint16_t) * 4 * ld), "row pairs: vector and portable differ");
    CHECK(ctx, i2[2 * 5 + 1] == bf16_round(prow[1][5]) && i2[ld + 2 * 36] == bf16_round(prow[2][36]) &&
               i2[3 * ld + 2 * 9 + 1] == 0, "row pairs: wrong layout");
    free(src);
    free(i1);
    free(i2);
    free(a);
    free(b);
    free(c1);
    free(c2);
}

typedef struct lay_case {
    const char *name;
    int C, h, hkv, d, hs, K;
    bool causal;
    int B, N;
} lay_case;

/* One head-sparse layer in bf16 (forward tiles, bf16 GEMMs) against fp32: y, dx and every
 * gradient block. */
static void test_layer(test_ctx *ctx, const lay_case *lc) {
    moh_attn_config cfg;
    moh_attn_config_default(&cfg);
    cfg.hidden_size = lc->C;
    cfg.n_heads = lc->h;
    cfg.n_kv_heads = lc->hkv;
    cfg.head_dim = lc->d;
    cfg.shared_heads = lc->hs;
    cfg.top_k = lc->K;
    cfg.router = MOH_ROUTER_LEARNED;
    cfg.causal = lc->causal;
    cfg.rope_theta = lc->d % 2 ? 0.0 : 10000.0;
    cfg.qkv_bias = cfg.proj_bias = true;
    moh_error err;
    CHECK(ctx, moh_attn_config_validate(&cfg, "test", &err) == MOH_OK, "%s: %s", lc->name, err.msg);
    const size_t np = attn_params_bind_f32(&(attn_params_f32){0}, NULL, &cfg);
    const size_t T = (size_t)lc->B * lc->N, C = (size_t)lc->C;
    test_rng r = {77};
    float *w = malloc(sizeof(float) * np), *x = malloc(sizeof(float) * T * C), *dy = malloc(sizeof(float) * T * C);
    fill(&r, w, np, 0.3f);
    fill(&r, x, T * C, 1.0f);
    fill(&r, dy, T * C, 1.0f);
    attn_params_f32 p;
    attn_params_bind_f32(&p, w, &cfg);
    bf16_mirror mw;
    CHECK(ctx, bf16_mirror_init(&mw, w, np, &err) == MOH_OK, "%s", err.msg);
    bf16_mirror_sync(&mw);
    float *y[2], *dx[2], *g[2];
    for (int k = 0; k < 2; k++) { /* 0 fp32, 1 bf16 */
        sparse_cache c;
        bf16_ctx *b = NULL;
        CHECK(ctx, sparse_cache_init(&c, &cfg, lc->B, lc->N, &err) == MOH_OK, "%s", err.msg);
        if (k) {
            CHECK(ctx, bf16_ctx_new(&b, &mw, &err) == MOH_OK, "%s", err.msg);
            CHECK(ctx, sparse_cache_set_bf16(&c, &cfg, b, &err) == MOH_OK, "%s", err.msg);
            CHECK(ctx, c.bf16_tiles, "%s: bf16 tiles not enabled on a CPU with AVX512-BF16", lc->name);
        }
        y[k] = malloc(sizeof(float) * T * C);
        dx[k] = calloc(T * C, sizeof(float));
        g[k] = calloc(np, sizeof(float));
        attn_params_f32 gp;
        attn_params_bind_f32(&gp, g[k], &cfg);
        sparse_forward_f32(&cfg, &p, x, lc->B, lc->N, y[k], &c);
        sparse_backward_f32(&cfg, &p, &gp, &c, dy, 0.01f, dx[k]);
        sparse_cache_free(&c);
        bf16_ctx_free(b);
    }
    double e = test_rel_err_f32(y[1], y[0], (long)(T * C));
    CHECK(ctx, e > 0 && e <= 1e-2, "%s: y bf16 vs fp32 rel %.3g, expected (0, 1e-2]", lc->name, e);
    printf("%-28s y rel %.2e", lc->name, e);
    e = test_rel_err_f32(dx[1], dx[0], (long)(T * C));
    CHECK(ctx, e > 0 && e <= 2e-2, "%s: dx bf16 vs fp32 rel %.3g, expected (0, 2e-2]", lc->name, e);
    printf("  dx %.2e", e);
    /* every gradient block on its own: W_q, W_k, W_v rows (dQ, dK, dV), their biases, W_O, b_O, router */
    attn_params_f32 g0, g1;
    attn_params_bind_f32(&g0, g[0], &cfg);
    attn_params_bind_f32(&g1, g[1], &cfg);
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
    e = test_rel_err_f32(g[1], g[0], (long)np);
    CHECK(ctx, e > 0, "%s: bf16 gradients equal fp32 bitwise (bf16 not used?)", lc->name);
    printf("  grads (worst block) %.2e\n", worst);
    for (int k = 0; k < 2; k++) {
        free(y[k]);
        free(dx[k]);
        free(g[k]);
    }
    bf16_mirror_free(&mw);
    free(w);
    free(x);
    free(dy);
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
        CHECK(ctx, m.fam->params_new(m.cfg, &g, &gd, &gn, &err) == MOH_OK, "%s", err.msg);
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
        m.fam->params_free(g);
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
        CHECK(ctx, m.fam->params_new(m.cfg, &g, &gd, &n, &err) == MOH_OK, "%s", err.msg);
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
            const bf16_ctx *c = !strcmp(m.fam->model_type, "vit") ? ((vit_acts_f32 *)w.acts[0])->bf16
                                                                    : ((dit_acts_f32 *)w.acts[0])->bf16;
            snprintf(impl, sizeof impl, "%s", c ? bf16_ctx_impl(c) : "none"); /* the context dies below */
            fallbacks = c ? bf16_ctx_fallbacks(c) : -1;
        }
        free(buf);
        m.fam->params_free(g);
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
    test_round(&ctx); /* portable: runs everywhere */
    if (precision_resolve(MOH_PRECISION_BF16, why, sizeof why) != MOH_PRECISION_BF16 ||
        !bf16_detect().avx512_bf16) {
        printf("test_bf16: skipped the bf16 compute checks: %s\n",
               *why ? why : "no AVX512-BF16 (the bf16 attention tiles need it)");
        return ctx.failures ? 1 : 77;
    }
    test_gemm(&ctx);
    test_tile(&ctx);
    const lay_case cases[] = {
        {"causal MoH, N 300", 64, 4, 4, 16, 1, 2, true, 2, 300},
        {"bidirectional MoH, N 200", 48, 6, 6, 8, 2, 2, false, 1, 200},
        {"causal GQA, d 32, N 130", 128, 4, 2, 32, 2, 1, true, 2, 130},
        {"odd d 7, no RoPE, N 77", 28, 4, 4, 7, 1, 2, false, 1, 77},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) test_layer(&ctx, &cases[i]);
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
