/* sparse_decode_attend_group per kernel set (tools/bench/micro.sh; docs/benchmarks.md, "Grouped-KV
 * attention on AVX2"): the G query heads of one KV head (default 3, SmolLM2's) over n cached keys
 * (default 2048), head_dim 64, on an fp32 cache and a bf16 one with each bf16 kernel set
 * (portable: the grouped AVX2 kernel where the CPU has AVX2; AVX-512 widen; vdpbf16ps, where the
 * CPU has them). Microseconds per call, best of 7 runs of 200 calls (the cache stays in L2).
 * Usage: decode_group [n G] */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "attn/sparse.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv) {
    enum { D = 64 };
    const int n = argc > 2 ? atoi(argv[1]) : 2048, G = argc > 2 ? atoi(argv[2]) : 3;
    if (n < 1 || G < 1 || G > SPARSE_DECODE_GROUP) {
        fprintf(stderr, "decode_group: n >= 1 and 1 <= G <= %d expected\n", SPARSE_DECODE_GROUP);
        return 2;
    }
    const size_t nv = (size_t)(n + 1) * D;
    uint16_t *Kb = malloc(2 * nv), *Vb = malloc(2 * nv);
    float *Kf = malloc(4 * nv), *Vf = malloc(4 * nv), *sc = malloc(sizeof(float) * (size_t)G * n);
    float q[SPARSE_DECODE_GROUP * D], out[SPARSE_DECODE_GROUP * D], gate[SPARSE_DECODE_GROUP];
    if (!Kb || !Vb || !Kf || !Vf || !sc) return 1;
    uint64_t s = 1;
    for (size_t i = 0; i < nv; i++) {
        s = s * 6364136223846793005ULL + 1;
        Kb[i] = (uint16_t)(0x3F80 ^ (s >> 57)), Vb[i] = (uint16_t)(0x3F00 ^ (s >> 50 & 0x7F));
        Kf[i] = Vf[i] = (float)(s >> 40) / 16777216.0f;
    }
    const float *qs[SPARSE_DECODE_GROUP];
    float *ss[SPARSE_DECODE_GROUP], *os[SPARSE_DECODE_GROUP];
    for (int g = 0; g < G; g++) {
        for (int e = 0; e < D; e++) q[g * D + e] = 0.01f * (float)((g * D + e) % 17);
        qs[g] = q + g * D, ss[g] = sc + (size_t)g * n, os[g] = out + g * D, gate[g] = 1.0f;
    }
    const sparse_bf16_isa best = sparse_bf16_isa_detect();
    for (int b16 = 0; b16 < 2; b16++)
        for (int k = 0; k <= (b16 ? (int)best : 0); k++) {
            const sparse_bf16_isa isa = (sparse_bf16_isa)k;
            double bt = 1e30;
            for (int r = 0; r < 7; r++) {
                const double t0 = now();
                for (int c = 0; c < 200; c++)
                    sparse_decode_attend_group(G, qs, b16 ? (const void *)Kb : Kf, b16 ? (const void *)Vb : Vf, b16, D, n,
                                               D, gate, ss, os, isa);
                const double dt = now() - t0;
                bt = dt < bt ? dt : bt;
            }
            printf("decode_group %s %-17s n=%d G=%d d=%d grouped=%d: %.2f us/call\n", b16 ? "bf16" : "fp32",
                   b16 ? sparse_bf16_isa_name(isa) : "fp32", n, G, D, sparse_decode_groups(D, b16, isa), bt / 200 * 1e6);
        }
    free(Kb), free(Vb), free(Kf), free(Vf), free(sc);
    return 0;
}
