/* One thread's quant_gemv rate per ggml type (tools/bench/micro.sh; docs/benchmarks.md, "K-quant
 * kernels per block of 256"): a R x K matrix (default 4096 x 4096, weights quantised from uniform
 * values, ~9-17 MB per type: from memory) times one activation quantised per 32, best of 15 calls.
 * Prints ms, GB/s of blocks read and billions of weights per second, in the kernels this CPU runs
 * (MOH_NO_VNNI=1: AVX2). Usage: quant_gemv [R K] */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "io/gguf.h"
#include "ops/quant.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv) {
    const int R = argc > 2 ? atoi(argv[1]) : 4096, K = argc > 2 ? atoi(argv[2]) : 4096;
    static const int types[] = {MOH_GGML_Q8_0, MOH_GGML_Q4_0, MOH_GGML_Q4_1, MOH_GGML_Q5_0,
                                MOH_GGML_Q5_1, MOH_GGML_Q4_K, MOH_GGML_Q5_K, MOH_GGML_Q6_K};
    static const int whole[1] = {0};
    if (R < 1 || K < 256 || K % 256) {
        fprintf(stderr, "quant_gemv: R >= 1 and K a multiple of 256 expected\n");
        return 2;
    }
    float *w = malloc(sizeof(float) * (size_t)R * K), *x = malloc(sizeof(float) * K), *out = malloc(sizeof(float) * R);
    uint8_t *q = malloc(quant_row_bytes(MOH_GGML_Q8_0, K) * (size_t)R); /* the largest type */
    quant_act a;
    moh_error err = {0};
    if (!w || !x || !out || !q || quant_act_init(&a, (size_t)K, &err)) return 1;
    uint64_t s = 1;
    for (size_t i = 0; i < (size_t)R * K; i++) w[i] = (float)((s = s * 6364136223846793005ULL + 1) >> 40) / 16777216.0f - 0.5f;
    for (int i = 0; i < K; i++) x[i] = (float)((s = s * 6364136223846793005ULL + 1) >> 40) / 16777216.0f - 0.5f;
    quant_act_set(&a, x, 0, (size_t)K);
    const quant_isa isa = quant_isa_detect();
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        const int ty = types[t];
        const size_t rb = quant_row_bytes(ty, K);
        for (int r = 0; r < R; r++) quant_row(ty, w + (size_t)r * K, K, q + (size_t)r * rb);
        double best = 1e30;
        for (int rep = 0; rep < 15; rep++) {
            const double t0 = now();
            quant_gemv(ty, q, rb, NULL, &a, whole, 1, K, R, out, isa);
            const double dt = now() - t0;
            best = dt < best ? dt : best;
        }
        printf("quant_gemv %-5s %dx%d %s: %7.3f ms  %6.2f GB/s  %6.2f Gweights/s\n", quant_type_name(ty), R, K,
               quant_isa_name(isa), best * 1e3, (double)rb * R / best / 1e9, (double)R * K / best / 1e9);
    }
    quant_act_free(&a);
    free(w), free(x), free(out), free(q);
    return 0;
}
