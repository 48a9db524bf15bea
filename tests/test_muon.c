/* Muon (src/ops/muon.c) against PyTorch float32 results in tests/fixtures/muon.safetensors
 * (tools/ref/gen_muon_fixture.py: K. Jordan's zeropower_via_newtonschulz5 and Liu et al. 2025's
 * update; the constants below must match that script), the bf16 Newton-Schulz products against
 * fp32, and what the iteration is for: singular values pulled into about [0.7, 1.2]. */
#include "moh.h"
#include "ops/bf16.h"
#include "test_util.h"
#include "ops/muon.h"

#include <string.h>

#define TOL 1e-5
#define FIXTURE "tests/fixtures/muon.safetensors"
static const double MU = 0.95, LR = 0.02, WD = 0.1;
enum { STEPS = 5 };

static test_ctx T;
static moh_safetensors ST;

static float *get(const char *name, int r, int c) {
    int64_t shape[2] = {r, c};
    float *buf = calloc((size_t)r * c, sizeof(float));
    moh_error err = {0};
    int rc = buf ? moh_st_read_f32(&ST, name, 2, shape, buf, &err) : MOH_E_NOMEM;
    CHECK(&T, rc == MOH_OK, "read %s: %s", name, err.msg);
    if (rc != MOH_OK) {
        free(buf);
        return NULL;
    }
    return buf;
}

static void report(const char *what, double err, double tol) {
    printf("  %-34s %9.2e  (<= %.0e)\n", what, err, tol);
    CHECK(&T, err <= tol, "%s: error %.3e > %.0e", what, err, tol);
}

/* One shape of the fixture: the orthogonalisation and two Muon steps, fp32 vs torch. */
static void test_shape(const char *s, int r, int c) {
    char n[64];
    const size_t numel = (size_t)r * c;
    float *x, *ns, *w, *g1, *g2, *w2, *buf2;
    snprintf(n, sizeof n, "%s.x", s), x = get(n, r, c);
    snprintf(n, sizeof n, "%s.ns", s), ns = get(n, r, c);
    snprintf(n, sizeof n, "%s.w0", s), w = get(n, r, c);
    snprintf(n, sizeof n, "%s.g1", s), g1 = get(n, r, c);
    snprintf(n, sizeof n, "%s.g2", s), g2 = get(n, r, c);
    snprintf(n, sizeof n, "%s.w2", s), w2 = get(n, r, c);
    snprintf(n, sizeof n, "%s.buf2", s), buf2 = get(n, r, c);
    float *work = malloc(sizeof(float) * muon_work_floats(r, c)), *buf = calloc(numel, sizeof(float));
    if (x && ns && w && g1 && g2 && w2 && buf2 && work && buf) {
        muon_orthogonalise(NULL, x, r, c, STEPS, work);
        snprintf(n, sizeof n, "%s [%d, %d] orthogonalise", s, r, c);
        report(n, test_rel_err_f32(x, ns, (long)numel), TOL);
        const muon_config mc = {.momentum = MU, .weight_decay = WD, .ns_steps = STEPS};
        muon_step(&mc, NULL, w, g1, buf, r, c, LR, work);
        muon_step(&mc, NULL, w, g2, buf, r, c, LR, work);
        snprintf(n, sizeof n, "%s two steps: weights", s);
        report(n, test_rel_err_f32(w, w2, (long)numel), TOL);
        snprintf(n, sizeof n, "%s two steps: momentum", s);
        report(n, test_rel_err_f32(buf, buf2, (long)numel), TOL);
    }
    free(x), free(ns), free(w), free(g1), free(g2), free(w2), free(buf2), free(work), free(buf);
}

/* The squared singular values of x [r, c] seen from 16 random directions: |x^T v|^2 (v a unit
 * vector of length r) when r <= c, else |x v|^2 (length c), into [*lo, *hi]; returns the mean
 * squared singular value |x|_F^2 / min(r, c). */
static double spread(const float *x, int r, int c, test_rng *rng, double *v, double *lo, double *hi) {
    const bool wide = r <= c;
    const int nv = wide ? r : c, no = wide ? c : r;
    double fro = 0.0;
    for (size_t i = 0; i < (size_t)r * c; i++) fro += (double)x[i] * x[i];
    *lo = 1e30, *hi = 0.0;
    for (int t = 0; t < 16; t++) {
        double vv = 0.0, q = 0.0;
        for (int i = 0; i < nv; i++) v[i] = test_rng_uniform(rng), vv += v[i] * v[i];
        for (int j = 0; j < no; j++) {
            double s = 0.0;
            for (int i = 0; i < nv; i++) s += v[i] * (wide ? x[(size_t)i * c + j] : x[(size_t)j * c + i]);
            q += s * s;
        }
        q /= vv;
        *lo = q < *lo ? q : *lo;
        *hi = q > *hi ? q : *hi;
    }
    return fro / (wide ? r : c);
}

/* x [r, c] random with a wide spread of scales: after 5 steps the mean squared singular value and
 * the squared singular values seen from random directions lie in [0.5, 1.3] (fp32 and bf16
 * products); bf16 within 0.1 of fp32 (the roundings grow over the 5 steps; a CPU without
 * AVX512-BF16 only says so). */
static void test_properties(int r, int c) {
    test_rng rng = {0x9e3779b97f4a7c15ULL ^ (uint64_t)(r * 131 + c)};
    const size_t numel = (size_t)r * c;
    float *x = malloc(sizeof(float) * numel), *x16 = malloc(sizeof(float) * numel);
    float *work = malloc(sizeof(float) * muon_work_floats(r, c));
    double *v = malloc(sizeof(double) * (size_t)(r > c ? r : c));
    if (!x || !x16 || !work || !v) {
        CHECK(&T, false, "out of memory");
        free(x), free(x16), free(work), free(v);
        return;
    }
    for (size_t i = 0; i < numel; i++) x[i] = (float)test_rng_uniform(&rng) * (i % 7 == 0 ? 5.0f : 1.0f);
    memcpy(x16, x, sizeof(float) * numel);
    double before_lo, before_hi, lo, hi;
    const double before = spread(x, r, c, &rng, v, &before_lo, &before_hi);
    muon_orthogonalise(NULL, x, r, c, STEPS, work);
    double ms = spread(x, r, c, &rng, v, &lo, &hi);
    printf("  [%d, %d] fp32: squared singular values: mean %.3f (input %.3f), seen %.3f-%.3f (input %.3f-%.3f)\n",
           r, c, ms, before, lo, hi, before_lo, before_hi);
    CHECK(&T, ms >= 0.5 && ms <= 1.3 && lo >= 0.5 && hi <= 1.3, "[%d, %d] fp32: mean %.3f, seen %.3f-%.3f", r, c, ms, lo, hi);
    char why[160];
    if (precision_resolve(MOH_PRECISION_BF16, why, sizeof why) != MOH_PRECISION_BF16) {
        printf("  bf16 Newton-Schulz not checked: %s\n", why);
    } else {
        bf16_ctx *bc = NULL;
        moh_error err = {0};
        const int rc = bf16_ctx_new(&bc, NULL, &err);
        CHECK(&T, rc == MOH_OK, "bf16_ctx_new: %s", err.msg);
        if (rc == MOH_OK) {
            muon_orthogonalise(bc, x16, r, c, STEPS, work);
            ms = spread(x16, r, c, &rng, v, &lo, &hi);
            printf("  [%d, %d] bf16: squared singular values: mean %.3f, seen %.3f-%.3f\n", r, c, ms, lo, hi);
            CHECK(&T, ms >= 0.5 && ms <= 1.3 && lo >= 0.5 && hi <= 1.3, "[%d, %d] bf16: mean %.3f, seen %.3f-%.3f", r, c,
                  ms, lo, hi);
            char n[64];
            snprintf(n, sizeof n, "[%d, %d] bf16 vs fp32 products", r, c);
            report(n, test_rel_err_f32(x16, x, (long)numel), 1e-1);
            bf16_ctx_free(bc);
        }
    }
    free(x), free(x16), free(work), free(v);
}

int main(void) {
    moh_error err = {0};
    int rc = moh_st_open(&ST, FIXTURE, &err);
    CHECK(&T, rc == MOH_OK, "open %s: %s (regenerate: python3 tools/ref/gen_muon_fixture.py)", FIXTURE, err.msg);
    if (rc == MOH_OK) {
        test_shape("wide", 6, 10);
        test_shape("tall", 10, 6);
        moh_st_close(&ST);
    }
    test_properties(64, 160);
    test_properties(160, 64);
    return test_finish("test_muon", &T);
}
