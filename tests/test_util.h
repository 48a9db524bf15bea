/* Minimal assertion helpers for moh's C tests (each test is one executable run by CTest). */
#ifndef MOH_TEST_UTIL_H
#define MOH_TEST_UTIL_H
#include <math.h>
#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct test_ctx {
    int failures;
    int checks;
} test_ctx;

#define CHECK(ctx, cond, ...)                                                        \
    do {                                                                             \
        (ctx)->checks++;                                                             \
        if (!(cond)) {                                                               \
            (ctx)->failures++;                                                       \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                            \
            fprintf(stderr, "\n");                                                   \
        }                                                                            \
    } while (0)

/* Deterministic xorshift64* generator for test inputs (never zeros: uniform in [-1, 1]). */
typedef struct test_rng { uint64_t s; } test_rng;
static inline uint64_t test_rng_u64(test_rng *r) {
    r->s ^= r->s >> 12; r->s ^= r->s << 25; r->s ^= r->s >> 27;
    return r->s * 2685821657736338717ULL;
}
static inline double test_rng_uniform(test_rng *r) { /* [-1, 1) */
    return (double)(test_rng_u64(r) >> 11) * (2.0 / 9007199254740992.0) - 1.0;
}

/* max |a-b| / max(max|b|, tiny): relative error of a whole tensor against reference b. */
static inline double test_rel_err_f64(const double *a, const double *b, long n) {
    double num = 0.0, den = 0.0;
    for (long i = 0; i < n; i++) {
        double d = fabs(a[i] - b[i]);
        if (d > num || isnan(d)) num = isnan(d) ? INFINITY : d;
        if (fabs(b[i]) > den) den = fabs(b[i]);
    }
    return num / (den > 1e-30 ? den : 1e-30);
}
static inline double test_rel_err_f32(const float *a, const float *b, long n) {
    double num = 0.0, den = 0.0;
    for (long i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (d > num || isnan(d)) num = isnan(d) ? INFINITY : d;
        if (fabs((double)b[i]) > den) den = fabs((double)b[i]);
    }
    return num / (den > 1e-30 ? den : 1e-30);
}

static inline int test_finish(const char *name, test_ctx *ctx) {
    printf("%s: %d checks, %d failed\n", name, ctx->checks, ctx->failures);
    return ctx->failures ? 1 : 0;
}
/* The oracle of UTF-8 validity of the BPE tests and fuzz target: strict (no overlongs, surrogates,
 * code points above U+10FFFF). */
static inline bool utf8_valid(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        int l = c < 0x80                  ? 1
                : (c >= 0xC2 && c <= 0xDF) ? 2
                : (c >= 0xE0 && c <= 0xEF) ? 3
                : (c >= 0xF0 && c <= 0xF4) ? 4
                                           : 0;
        if (!l || i + (size_t)l > n) return false;
        uint32_t v = l == 1 ? c : (uint32_t)(c & (0x7F >> l));
        for (int k = 1; k < l; k++) {
            if ((s[i + (size_t)k] & 0xC0) != 0x80) return false;
            v = (v << 6) | (s[i + (size_t)k] & 0x3Fu);
        }
        if ((l == 3 && v < 0x800) || (l == 4 && (v < 0x10000 || v > 0x10FFFF)) ||
            (v >= 0xD800 && v <= 0xDFFF))
            return false;
        i += (size_t)l;
    }
    return true;
}

#endif
