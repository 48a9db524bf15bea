/* One decode GEMV over W_qkv rows as one call vs one call per head (tools/bench/micro.sh): six layers
 * of W_qkv [768, 256] fp32 (the small model), 16 MB read between repeats so the weights come from L3,
 * as in decoding. Prints microseconds per token for: all 768 rows in one call per layer; 22 of the 24
 * heads in 32-row calls; all 24 heads in 32-row calls. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#include "attn/sparse.h"

int main(void) {
    enum { L = 6, R = 768, C = 256, D = 32, REPS = 200 };
    const size_t nbig = (size_t)4 << 20;
    float *w = malloc(sizeof(float) * L * R * C), *x = malloc(sizeof(float) * C), *out = malloc(sizeof(float) * R);
    float *big = malloc(sizeof(float) * nbig);
    if (!w || !x || !out || !big) return 1;
    for (size_t i = 0; i < (size_t)L * R * C; i++) w[i] = (float)(i % 13) * 0.01f;
    for (int i = 0; i < C; i++) x[i] = 0.1f * (float)(i % 5);
    for (size_t i = 0; i < nbig; i++) big[i] = 1.0f;
    static const int whole[1] = {0};
    int sel[24], ns = 0;
    for (int i = 0; i < 24; i++)
        if (i != 3 && i != 6) sel[ns++] = i;
    double t[3] = {0, 0, 0};
    float sink = 0;
    for (int rep = 0; rep < REPS; rep++)
        for (int mode = 0; mode < 3; mode++) {
            for (size_t i = 0; i < nbig; i += 16) sink += big[i];
            const double t0 = omp_get_wtime();
            for (int l = 0; l < L; l++) {
                const float *wl = w + (size_t)l * R * C;
                if (mode == 0) sparse_decode_gemv_f32(wl, C, NULL, x, whole, 1, C, 0, R, out);
                else if (mode == 1)
                    for (int k = 0; k < ns; k++) sparse_decode_gemv_f32(wl, C, NULL, x, whole, 1, C, sel[k] * D, sel[k] * D + D, out);
                else
                    for (int k = 0; k < 24; k++) sparse_decode_gemv_f32(wl, C, NULL, x, whole, 1, C, k * D, k * D + D, out);
            }
            t[mode] += omp_get_wtime() - t0;
        }
    printf("768 rows, one call per layer: %.1f us/token; 22 heads in 32-row calls: %.1f; 24 heads in 32-row calls: %.1f "
           "(check %g)\n", t[0] / REPS * 1e6, t[1] / REPS * 1e6, t[2] / REPS * 1e6, (double)sink);
    free(w), free(x), free(out), free(big);
    return 0;
}
