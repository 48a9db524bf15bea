/* Block-quantised products (src/ops/quant.c): f16 conversion (every half round-trips; floats round
 * to nearest), weight quantisation against the GGUF reader's dequantisation (io/gguf.c, itself
 * checked against gguf-py), and every product kernel this CPU has (AVX512-VNNI, AVX-VNNI, AVX2,
 * portable) against a float64 evaluation of the same blocks and the same quantised activation, on
 * random rows, column blocks and biases; then the quantised product against the float product
 * (the quantisation's own error), and the quantisers against ggml's own bytes, for ggml's Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K. The
 * table's lookups and refusals, type names and llama-quantize's fallback types; the finite check
 * on the scales against the dequantised values. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/gguf.h"
#include "ops/quant.h"
#include "test_util.h"

static void f16_tests(test_ctx *ctx) {
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        const float f = quant_h2f((uint16_t)h);
        if (isnan(f)) continue;
        bad += quant_f2h(f) != h;
    }
    CHECK(ctx, bad == 0, "%d halves do not round-trip", bad);
    test_rng r = {11};
    double worst = 0;
    for (int i = 0; i < 100000; i++) {
        const float x = (float)(test_rng_uniform(&r) * pow(2.0, (double)(i % 30) - 14));
        const float y = quant_h2f(quant_f2h(x));
        if (fabsf(x) >= 6.2e-5f) worst = fmax(worst, fabs((double)y - x) / fabs((double)x));
    }
    CHECK(ctx, worst <= 1.0 / 2048 + 1e-9, "f16 rounding error %.3g > 2^-11", worst);
    CHECK(ctx, quant_f2h(1e6f) == 0x7c00 && quant_f2h(-1e6f) == 0xfc00 && quant_f2h(65504.0f) == 0x7bff,
          "overflow to inf / the largest half");
    CHECK(ctx, quant_f2h(0.0f) == 0 && quant_f2h(-0.0f) == 0x8000 && quant_f2h(1e-9f) == 0, "zeros and underflow");
}

/* float64 value of one row's product from the blocks: the row dequantised by the GGUF reader
 * (float64 of its float32 values) times the quantised activation dx q, sub-block by sub-block; Q4_1
 * and Q5_1 take their min times s as ggml's vec_dot_q4_1_q8_1 does (s = dx sum(q) in f16). |terms|
 * for the tolerance. */
static double ref_row(int type, const uint8_t *w, int K, const quant_act *x, const int *blk, int nblk, int bw,
                      double *mag) {
    float *wd = malloc(sizeof(float) * (size_t)K);
    moh_error err = {0};
    if (!wd || moh_gguf_dequantize_raw(type, w, K, wd, &err)) {
        free(wd);
        *mag = 0;
        return NAN;
    }
    const bool one = type == MOH_GGML_Q4_1 || type == MOH_GGML_Q5_1;
    double acc = 0;
    *mag = 0;
    for (int k = 0; k < nblk; k++)
        for (int j = blk[k] * bw / 32; j < (blk[k] + 1) * bw / 32; j++) {
            double m = 0;
            if (one) {
                uint16_t hm;
                memcpy(&hm, w + (size_t)j * quant_block_bytes(type) + 2, 2);
                m = quant_h2f(hm);
                acc += m * x->s[j];
                *mag += fabs(m * x->s[j]);
            }
            for (int i = 0; i < 32; i++) {
                const double t = ((double)wd[(size_t)j * 32 + i] - m) * x->d[j] * x->q[(size_t)j * 32 + i];
                acc += t;
                *mag += fabs(t);
            }
        }
    free(wd);
    return acc;
}

/* Dequantised weights against the originals: legacy types within half a step of their block (plus
 * the f16 rounding of the scale times the largest level, plus Q4_0 / Q5_0's asymmetric range: the
 * extreme maps to -8 / -16, the other side stops a level short); K-quants (6- or 8-bit scales of
 * an f16 super-scale, fitted by least squares) by their RMS error relative to the weights' RMS. */
static void dequant_check(test_ctx *ctx, int type, const float *W, const float *Wd, size_t n) {
    if (quant_block_size(type) == 256) {
        double e2 = 0, w2 = 0;
        for (size_t i = 0; i < n; i++) {
            e2 += ((double)Wd[i] - W[i]) * ((double)Wd[i] - W[i]);
            w2 += (double)W[i] * W[i];
        }
        /* uniform weights at 4 / 5 / 6 bits: a step over sqrt(12) is 0.067 / 0.032 / 0.016 of their RMS;
         * measured 0.070-0.071 / 0.035-0.036 / 0.018 */
        const double tol = type == MOH_GGML_Q4_K ? 0.08 : type == MOH_GGML_Q5_K ? 0.04 : 0.02;
        CHECK(ctx, sqrt(e2 / w2) <= tol, "%s: dequantised weights' RMS error %.4f of theirs (want <= %.3f)",
              quant_type_name(type), sqrt(e2 / w2), tol);
        return;
    }
    const bool five = type == MOH_GGML_Q5_0 || type == MOH_GGML_Q5_1;
    const bool one = type == MOH_GGML_Q4_1 || type == MOH_GGML_Q5_1;
    double worst = -1; /* the largest error less its bound, in steps */
    for (size_t i = 0; i < n; i += 32) {
        float mn = W[i], mx = W[i], amax = 0;
        for (int j = 0; j < 32; j++) {
            mn = fminf(mn, W[i + j]);
            mx = fmaxf(mx, W[i + j]);
            amax = fmaxf(amax, fabsf(W[i + j]));
        }
        const double step = type == MOH_GGML_Q8_0 ? amax / 127.0
                          : type == MOH_GGML_Q4_0 ? amax / 8.0 : type == MOH_GGML_Q5_0 ? amax / 16.0
                          : (mx - mn) / (five ? 31.0 : 15.0);
        /* plus the min's f16 rounding (Q4_1, Q5_1) */
        const double bound = 0.5 + (type == MOH_GGML_Q8_0 ? 127.0 : five ? 32.0 : 16.0) / 2048 +
                             (type == MOH_GGML_Q4_0 || type == MOH_GGML_Q5_0 ? 0.5 : 0.0) +
                             (one ? fabs(mn) / 2048 / step : 0.0);
        for (int j = 0; j < 32; j++) worst = fmax(worst, fabs((double)Wd[i + j] - W[i + j]) / step - bound);
    }
    CHECK(ctx, worst <= 1e-6, "%s: a dequantised weight %.3f steps past its bound", quant_type_name(type), worst);
}

static void product_tests(test_ctx *ctx) {
    const int types[] = {MOH_GGML_Q8_0, MOH_GGML_Q4_0, MOH_GGML_Q4_1, MOH_GGML_Q5_0,
                         MOH_GGML_Q5_1, MOH_GGML_Q4_K, MOH_GGML_Q5_K, MOH_GGML_Q6_K};
    const int ntypes = (int)(sizeof types / sizeof types[0]);
    const quant_isa top = quant_isa_detect();
    printf("test_quant: kernels up to %s\n", quant_isa_name(top));
    moh_error err = {0};
    test_rng r = {7};
    for (int ti = 0; ti < ntypes; ti++)
        for (int shape = 0; shape < 4; shape++) {
            const int type = types[ti], kq = quant_block_size(type) == 256;
            const int R = (int[]){1, 7, 64, 130}[shape];
            const int K = kq ? (int[]){256, 512, 768, 1536}[shape] : (int[]){32, 96, 256, 576}[shape];
            const size_t rb = quant_row_bytes(type, K);
            float *W = malloc(sizeof(float) * (size_t)R * K), *Wd = malloc(sizeof(float) * (size_t)R * K);
            float *x = malloc(sizeof(float) * (size_t)K), *b = malloc(sizeof(float) * (size_t)R);
            float *out = malloc(sizeof(float) * (size_t)R);
            uint8_t *q = malloc(rb * (size_t)R);
            quant_act xa;
            CHECK(ctx, quant_act_init(&xa, (size_t)K, &err) == MOH_OK, "%s", err.msg);
            for (int i = 0; i < R * K; i++) W[i] = (float)(test_rng_uniform(&r) * (1 + (i % 5)));
            for (int i = 0; i < K; i++) x[i] = (float)(test_rng_uniform(&r) * 3);
            for (int i = 0; i < R; i++) b[i] = (float)test_rng_uniform(&r);
            for (int i = 0; i < R; i++) quant_row(type, W + (size_t)i * K, K, q + (size_t)i * rb);
            /* the blocks dequantise (gguf reader) close to the weights */
            CHECK(ctx, moh_gguf_dequantize_raw(type, q, (int64_t)R * K, Wd, &err) == MOH_OK, "%s", err.msg);
            dequant_check(ctx, type, W, Wd, (size_t)R * K);
            /* column blocks: every block, or every other 64-wide block (inside a K-quant's 256) */
            const int bw = K % 64 == 0 ? 64 : 32, nblk_all = K / bw;
            int blk[32], nblk = 0;
            for (int k = 0; k < nblk_all; k += (shape & 1) + 1) blk[nblk++] = k;
            for (int k = 0; k < nblk; k++) quant_act_set(&xa, x, (size_t)blk[k] * bw, (size_t)bw);
            for (int isa = QUANT_ISA_SCALAR; isa <= (int)top; isa++) {
                if (!quant_isa_supported((quant_isa)isa)) continue;
                for (int i = 0; i < R; i++) out[i] = NAN; /* poisoned */
                quant_gemv(type, q, rb, shape & 2 ? b : NULL, &xa, blk, nblk, bw, R, out, (quant_isa)isa);
                double e = 0;
                for (int i = 0; i < R; i++) {
                    double mag = 0;
                    const double want =
                        ref_row(type, q + (size_t)i * rb, K, &xa, blk, nblk, bw, &mag) + (shape & 2 ? b[i] : 0);
                    e = fmax(e, fabs(out[i] - want) / (mag + 1e-30));
                    if (!isfinite(out[i]) || !isfinite(want)) e = INFINITY;
                }
                CHECK(ctx, e <= 2e-6, "%s %s R %d K %d: %.3g of the terms' magnitude from float64", quant_type_name(type),
                      quant_isa_name((quant_isa)isa), R, K, e);
            }
            /* against the float product: the quantisation's error only */
            double num = 0, den = 0;
            for (int i = 0; i < R; i++) {
                double f = shape & 2 ? b[i] : 0, mag = 0;
                for (int k = 0; k < nblk; k++)
                    for (int c = blk[k] * bw; c < (blk[k] + 1) * bw; c++) {
                        f += (double)W[(size_t)i * K + c] * x[c];
                        mag += fabs((double)W[(size_t)i * K + c] * x[c]);
                    }
                num += fabs(out[i] - f);
                den += mag;
            }
            const double tol = type == MOH_GGML_Q8_0 || type == MOH_GGML_Q6_K ? 0.015 : 0.08;
            CHECK(ctx, num / den < tol, "%s: %.3g relative to the float product (want < %.2g)", quant_type_name(type),
                  num / den, tol);
            quant_act_free(&xa);
            free(W);
            free(Wd);
            free(x);
            free(b);
            free(out);
            free(q);
        }
}

/* quant_row against ggml's own quantisers (tests/fixtures/quant/ggml_quants.gguf, written by
 * tools/ref/quant_fixtures.py through libggml's ggml_quantize_chunk): the same bytes. A block whose
 * bytes differ (float rounding of another compiler could flip a level) must still reconstruct x as
 * well as ggml's within 1 %, and at most 1 in 16 may differ (measured: none, GCC 12). */
static void ggml_bytes_tests(test_ctx *ctx) {
    moh_gguf *g = NULL;
    moh_error err = {0};
    CHECK(ctx, moh_gguf_open(&g, "tests/fixtures/quant/ggml_quants.gguf", &err) == MOH_OK, "%s", err.msg);
    if (!g) return;
    const moh_gguf_tensor *xt = moh_gguf_find_tensor(g, "x");
    CHECK(ctx, xt && xt->type == MOH_GGML_F32 && xt->n_dims == 2, "fixture tensor x: F32 [rows, cols]");
    if (!xt || xt->type != MOH_GGML_F32 || xt->n_dims != 2) {
        moh_gguf_close(g);
        return;
    }
    const int64_t K = xt->ne[0], R = xt->ne[1];
    float *x = malloc(sizeof(float) * (size_t)(R * K)), *a = malloc(sizeof(float) * 256), *b = malloc(sizeof(float) * 256);
    memcpy(x, xt->data, sizeof(float) * (size_t)(R * K)); /* little-endian F32, as this CPU */
    const int types[] = {MOH_GGML_Q8_0, MOH_GGML_Q4_0, MOH_GGML_Q4_1, MOH_GGML_Q5_0,
                         MOH_GGML_Q5_1, MOH_GGML_Q4_K, MOH_GGML_Q5_K, MOH_GGML_Q6_K};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const int type = types[ti], qk = quant_block_size(type);
        const moh_gguf_tensor *t = moh_gguf_find_tensor(g, quant_type_name(type));
        const size_t rb = quant_row_bytes(type, K), bb = quant_block_bytes(type);
        CHECK(ctx, t && t->type == type && t->ne[0] == K && t->ne[1] == R && t->nbytes == rb * (size_t)R,
              "fixture tensor %s: [%lld, %lld] of %s", quant_type_name(type), (long long)R, (long long)K,
              quant_type_name(type));
        if (!t || t->nbytes != rb * (size_t)R) continue;
        uint8_t *mine = malloc(rb * (size_t)R);
        for (int64_t r = 0; r < R; r++) quant_row(type, x + r * K, K, mine + (size_t)r * rb);
        int differ = 0, worse = 0;
        const int nblocks = (int)(rb * (size_t)R / bb);
        for (int k = 0; k < nblocks; k++) {
            if (!memcmp(mine + (size_t)k * bb, t->data + (size_t)k * bb, bb)) continue;
            differ++;
            moh_gguf_dequantize_raw(type, mine + (size_t)k * bb, qk, a, &err);
            moh_gguf_dequantize_raw(type, t->data + (size_t)k * bb, qk, b, &err);
            double ea = 0, eb = 0;
            for (int i = 0; i < qk; i++) {
                const double v = x[(size_t)k * qk + i];
                ea += (a[i] - v) * (a[i] - v);
                eb += (b[i] - v) * (b[i] - v);
            }
            worse += ea > eb * 1.0201 + 1e-12; /* RMS 1 % */
        }
        CHECK(ctx, differ * 16 <= nblocks && worse == 0,
              "%s: %d of %d blocks differ from ggml's quantiser, %d of them reconstructing worse", quant_type_name(type),
              differ, nblocks, worse);
        printf("  %s: %d of %d blocks byte-identical to ggml_quantize_chunk's\n", quant_type_name(type), nblocks - differ,
               nblocks);
        free(mine);
    }
    free(x);
    free(a);
    free(b);
    moh_gguf_close(g);
}

static void table_tests(test_ctx *ctx) {
    float base[4096];
    test_rng r = {3};
    for (int i = 0; i < 4096; i++) base[i] = (float)test_rng_uniform(&r);
    quant_table t;
    moh_error err = {0};
    CHECK(ctx, quant_table_init(&t, base, 4096, 3, 4096, &err) == MOH_OK, "%s", err.msg);
    CHECK(ctx, quant_table_quantize(&t, 64, 4, 64, MOH_GGML_Q4_1, &err) == MOH_OK, "%s", err.msg);
    CHECK(ctx, quant_table_quantize(&t, 1024, 8, 128, MOH_GGML_Q8_0, &err) == MOH_OK, "%s", err.msg);
    CHECK(ctx, quant_table_find(&t, base + 64) == &t.m[0] && quant_table_find(&t, base + 64 + 255) == &t.m[0],
          "lookup of the first matrix");
    CHECK(ctx, !quant_table_find(&t, base + 63) && !quant_table_find(&t, base + 320) &&
               quant_table_find(&t, base + 2047) == &t.m[1] && !quant_table_find(&t, base + 2048),
          "lookup outside the matrices");
    CHECK(ctx, quant_table_quantize(&t, 100, 1, 32, MOH_GGML_Q4_0, &err) == MOH_E_ARG, "an overlap was accepted");
    CHECK(ctx, quant_table_quantize(&t, 3000, 1, 48, MOH_GGML_Q4_0, &err) == MOH_E_ARG, "48 columns were accepted");
    CHECK(ctx, quant_table_quantize(&t, 4090, 1, 32, MOH_GGML_Q4_0, &err) == MOH_E_ARG, "past the end was accepted");
    CHECK(ctx, quant_table_add(&t, 3000, 1, 32, MOH_GGML_Q6_K, NULL, NULL, &err) == MOH_E_ARG,
          "q6_K rows of 32 (not of 256) were accepted");
    CHECK(ctx, quant_table_add(&t, 3000, 1, 256, MOH_GGML_Q8_K, NULL, NULL, &err) == MOH_E_ARG, "q8_K was accepted");
    CHECK(ctx, quant_table_quantize(&t, 3000, 100, 32, MOH_GGML_Q8_0, &err) == MOH_E_ARG, "no room, yet accepted");
    int ty = 0;
    CHECK(ctx, quant_type_parse("q4_1", &ty, &err) == MOH_OK && ty == MOH_GGML_Q4_1 &&
               quant_type_parse("Q4_K", &ty, &err) == MOH_OK && ty == MOH_GGML_Q4_K &&
               quant_type_parse("q6_k", &ty, &err) == MOH_OK && ty == MOH_GGML_Q6_K &&
               quant_type_parse("q8_K", &ty, &err) == MOH_E_ARG && quant_type_parse("q4_K_M", &ty, &err) == MOH_E_ARG,
          "type names");
    CHECK(ctx, quant_fit(MOH_GGML_Q4_K, 1536) == MOH_GGML_Q4_K && quant_fit(MOH_GGML_Q4_K, 576) == MOH_GGML_Q5_0 &&
               quant_fit(MOH_GGML_Q5_K, 576) == MOH_GGML_Q5_1 && quant_fit(MOH_GGML_Q6_K, 576) == MOH_GGML_Q8_0 &&
               quant_fit(MOH_GGML_Q4_1, 576) == MOH_GGML_Q4_1 && quant_fit(MOH_GGML_Q4_K, 48) == -1 &&
               quant_head_type(MOH_GGML_Q4_K) == MOH_GGML_Q6_K && quant_head_type(MOH_GGML_Q4_1) == MOH_GGML_Q8_0,
          "llama-quantize's fallback types");
    quant_table_free(&t);
}

/* quant_blocks_finite against the dequantised values, for every type: random rows (true), each f16
 * scale field of the third block set to +inf, NaN or 65504 (the largest finite half) in turn; the
 * answer must be false exactly where the dequantised row holds a non-finite value. */
static void finite_tests(test_ctx *ctx) {
    static const int types[] = {MOH_GGML_Q8_0, MOH_GGML_Q4_0, MOH_GGML_Q4_1, MOH_GGML_Q5_0,
                                MOH_GGML_Q5_1, MOH_GGML_Q4_K, MOH_GGML_Q5_K, MOH_GGML_Q6_K};
    static const uint16_t pokes[] = {0x7C00, 0x7E01, 0x7BFF};
    test_rng r = {99};
    enum { K = 1024 };
    float x[K], y[K];
    uint8_t blk[K / 32 * 34];
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        const int ty = types[t], qk = quant_block_size(ty);
        const size_t bb = quant_block_bytes(ty), nb = K / (size_t)qk;
        /* the f16 fields: d (Q6_K: at byte 208), and m / dmin at 2 where the type has one */
        const size_t at[2] = {ty == MOH_GGML_Q6_K ? 208 : 0, 2};
        const int nf = ty == MOH_GGML_Q4_1 || ty == MOH_GGML_Q5_1 || ty == MOH_GGML_Q4_K || ty == MOH_GGML_Q5_K ? 2 : 1;
        for (int i = 0; i < K; i++) x[i] = (float)(2 * test_rng_uniform(&r));
        quant_row(ty, x, K, blk);
        moh_error err = {0};
        CHECK(ctx, quant_blocks_finite(ty, blk, nb), "%s: random blocks called non-finite", quant_type_name(ty));
        for (int f = 0; f < nf; f++)
            for (size_t p = 0; p < sizeof pokes / sizeof pokes[0]; p++) {
                uint8_t *field = blk + 2 * bb + at[f], keep[2];
                memcpy(keep, field, 2);
                memcpy(field, &pokes[p], 2);
                bool finite = moh_gguf_dequantize_raw(ty, blk, K, y, &err) == MOH_OK;
                for (int i = 0; i < K && finite; i++) finite = isfinite(y[i]);
                CHECK(ctx, quant_blocks_finite(ty, blk, nb) == finite && finite == (pokes[p] == 0x7BFF),
                      "%s: f16 field %d = 0x%04x: quant_blocks_finite %d, the values finite %d", quant_type_name(ty), f,
                      pokes[p], quant_blocks_finite(ty, blk, nb), finite);
                memcpy(field, keep, 2);
            }
    }
}

/* Non-finite activations reach the product as NaN (a NaN or inf in a block: its scale NaN) in every
 * kernel set and type; a float matrix whose block scale would round to f16 infinity is refused. */
static void nonfinite_tests(test_ctx *ctx) {
    static const int types[] = {MOH_GGML_Q8_0, MOH_GGML_Q4_0, MOH_GGML_Q4_1, MOH_GGML_Q5_0,
                                MOH_GGML_Q5_1, MOH_GGML_Q4_K, MOH_GGML_Q5_K, MOH_GGML_Q6_K};
    static const int whole[1] = {0};
    enum { K = 256, R = 4 };
    test_rng r = {7};
    float w[R * K], x[K], out[R];
    uint8_t blk[R * K / 32 * 34];
    for (int i = 0; i < R * K; i++) w[i] = (float)test_rng_uniform(&r);
    quant_act a;
    moh_error err = {0};
    CHECK(ctx, quant_act_init(&a, K, &err) == MOH_OK, "%s", err.msg);
    for (int isa = QUANT_ISA_SCALAR; isa <= QUANT_ISA_AVX512VNNI; isa++) {
        if (!quant_isa_supported((quant_isa)isa)) continue;
        for (size_t t = 0; t < sizeof types / sizeof types[0]; t++)
            for (int bad = 0; bad < 2; bad++) {
                const int ty = types[t];
                const size_t rb = quant_row_bytes(ty, K);
                for (int i = 0; i < R; i++) quant_row(ty, w + i * K, K, blk + (size_t)i * rb);
                for (int i = 0; i < K; i++) x[i] = (float)test_rng_uniform(&r);
                x[37] = bad ? INFINITY : NAN; /* in the second block of 32 */
                quant_act_set(&a, x, 0, K);
                quant_gemv(ty, blk, rb, NULL, &a, whole, 1, K, R, out, (quant_isa)isa);
                bool all_nan = true;
                for (int i = 0; i < R; i++) all_nan = all_nan && isnan(out[i]);
                CHECK(ctx, all_nan, "%s %s: an input holding %s gave %g, expected NaN", quant_isa_name((quant_isa)isa),
                      quant_type_name(ty), bad ? "inf" : "NaN", out[0]);
            }
    }
    quant_act_free(&a);
    /* 1e7 in a block of 32: Q8_0's scale 1e7 / 127 > 65504 */
    quant_table qt;
    w[5 * 32 + 3] = 1e7f;
    CHECK(ctx, quant_table_init(&qt, w, R * K, 2, sizeof blk, &err) == MOH_OK, "%s", err.msg);
    CHECK(ctx, quant_table_quantize(&qt, 0, R, K, MOH_GGML_Q8_0, &err) == MOH_E_ARG && strstr(err.msg, "1e+07") &&
               strstr(err.msg, "float16"),
          "a Q8_0 scale beyond float16's range was accepted (or the message lacks the value): '%s'", err.msg);
    quant_table_free(&qt);
}

int main(void) {
    test_ctx ctx = {0};
    f16_tests(&ctx);
    product_tests(&ctx);
    ggml_bytes_tests(&ctx);
    table_tests(&ctx);
    finite_tests(&ctx);
    nonfinite_tests(&ctx);
    return test_finish("test_quant", &ctx);
}
