/* Block-quantised products (src/ops/quant.c): f16 conversion (every half round-trips; floats round
 * to nearest), weight quantisation against the GGUF reader's dequantisation (io/gguf.c, itself
 * checked against gguf-py), and every product kernel this CPU has (AVX512-VNNI, AVX-VNNI, AVX2,
 * portable) against a float64 evaluation of the same blocks and the same quantised activation, on
 * random rows, column blocks and biases; then the quantised product against the float product
 * (the quantisation's own error). The table's lookups and refusals. */
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

/* float64 value of one row's product from the blocks: sum over blocks of dw dx sum(qw qx) (+ the
 * Q4_0 offset, the Q4_1 min times s) and |terms| for the tolerance. */
static double ref_row(int type, const uint8_t *w, const quant_act *x, const int *blk, int nblk, int bw,
                      double *mag) {
    const size_t bb = quant_block_bytes(type);
    double acc = 0;
    *mag = 0;
    for (int k = 0; k < nblk; k++)
        for (int j = blk[k] * bw / 32; j < (blk[k] + 1) * bw / 32; j++) {
            const uint8_t *p = w + (size_t)j * bb;
            uint16_t h, hm;
            memcpy(&h, p, 2);
            memcpy(&hm, p + 2, 2);
            const double dw = quant_h2f(h), dx = x->d[j];
            for (int i = 0; i < 32; i++) {
                int qw;
                if (type == MOH_GGML_Q8_0) qw = (int8_t)p[2 + i];
                else {
                    const uint8_t *qs = p + (type == MOH_GGML_Q4_1 ? 4 : 2);
                    qw = i < 16 ? qs[i] & 15 : qs[i - 16] >> 4;
                    if (type == MOH_GGML_Q4_0) qw -= 8;
                }
                const double t = dw * dx * qw * x->q[(size_t)j * 32 + i];
                acc += t;
                *mag += fabs(t);
            }
            if (type == MOH_GGML_Q4_1) {
                acc += (double)quant_h2f(hm) * x->s[j];
                *mag += fabs((double)quant_h2f(hm) * x->s[j]);
            }
        }
    return acc;
}

static void product_tests(test_ctx *ctx) {
    const int types[] = {MOH_GGML_Q8_0, MOH_GGML_Q4_0, MOH_GGML_Q4_1};
    const quant_isa top = quant_isa_detect();
    printf("test_quant: kernels up to %s\n", quant_isa_name(top));
    moh_error err = {0};
    test_rng r = {7};
    for (int ti = 0; ti < 3; ti++)
        for (int shape = 0; shape < 4; shape++) {
            const int type = types[ti];
            const int R = (int[]){1, 7, 64, 130}[shape], K = (int[]){32, 96, 256, 576}[shape];
            const size_t bb = quant_block_bytes(type), rb = (size_t)K / 32 * bb;
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
            /* the blocks dequantise (gguf reader) to within half a step of the weights */
            CHECK(ctx, moh_gguf_dequantize_raw(type, q, (int64_t)R * K, Wd, &err) == MOH_OK, "%s", err.msg);
            double worst = 0;
            for (int i = 0; i < R * K; i += 32) {
                float mn = W[i], mx = W[i], amax = 0;
                for (int j = 0; j < 32; j++) {
                    mn = fminf(mn, W[i + j]);
                    mx = fmaxf(mx, W[i + j]);
                    amax = fmaxf(amax, fabsf(W[i + j]));
                }
                const double step = type == MOH_GGML_Q8_0 ? amax / 127.0 : type == MOH_GGML_Q4_0 ? amax / 8.0 : (mx - mn) / 15.0;
                for (int j = 0; j < 32; j++) worst = fmax(worst, fabs((double)Wd[i + j] - W[i + j]) / step);
            }
            /* half a step, plus the f16 rounding of the scale times the largest q (127 or 15), plus
             * Q4_0's asymmetric range (the extreme value maps to -8, the other side stops at 7) */
            const double bound = 0.5 + (type == MOH_GGML_Q8_0 ? 127.0 : 16.0) / 2048 + (type == MOH_GGML_Q4_0 ? 0.5 : 0.0);
            CHECK(ctx, worst <= bound + 1e-6, "%s: dequantised weight off by %.3f steps",
                  quant_type_name(type), worst);
            /* column blocks: every block, or every other 64-wide block */
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
                    const double want = ref_row(type, q + (size_t)i * rb, &xa, blk, nblk, bw, &mag) + (shape & 2 ? b[i] : 0);
                    e = fmax(e, fabs(out[i] - want) / (mag + 1e-30));
                    if (!isfinite(out[i])) e = INFINITY;
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
            const double tol = type == MOH_GGML_Q8_0 ? 0.01 : 0.08;
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
    CHECK(ctx, quant_table_add(&t, 3000, 1, 32, MOH_GGML_Q6_K, NULL, NULL, &err) == MOH_E_ARG, "q6_K was accepted");
    CHECK(ctx, quant_table_quantize(&t, 3000, 100, 32, MOH_GGML_Q8_0, &err) == MOH_E_ARG, "no room, yet accepted");
    int ty = 0;
    CHECK(ctx, quant_type_parse("q4_1", &ty, &err) == MOH_OK && ty == MOH_GGML_Q4_1 &&
               quant_type_parse("q5_0", &ty, &err) == MOH_E_ARG,
          "type names");
    quant_table_free(&t);
}

int main(void) {
    test_ctx ctx = {0};
    f16_tests(&ctx);
    product_tests(&ctx);
    table_tests(&ctx);
    return test_finish("test_quant", &ctx);
}
