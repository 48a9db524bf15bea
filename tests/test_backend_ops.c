/* The compute seam (src/backend/backend.h), as llama.cpp's test-backend-ops: the registry and
 * --device resolution; every op of the CPU backend against the float64 ops (fp32, and bf16 where
 * the CPU has it) on random shapes; then every op of every other backend present against the CPU
 * backend (normalised error), with the device memory functions. Without another backend (a CPU-only
 * build, or no GPU) the cross-backend part is skipped with a note. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "test_util.h"

typedef struct lin_case {
    int M, I, O;
    bool bias;
} lin_case;

static void fill(test_rng *r, float *x, double *xd, size_t n) {
    for (size_t i = 0; i < n; i++) {
        x[i] = (float)test_rng_uniform(r);
        if (xd) xd[i] = x[i];
    }
}

static double rel_f32_f64(const float *a, const double *b, size_t n) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        const double d = fabs((double)a[i] - b[i]);
        if (d > num || isnan(d)) num = isnan(d) ? INFINITY : d;
        if (fabs(b[i]) > den) den = fabs(b[i]);
    }
    return num / (den > 1e-30 ? den : 1e-30);
}

/* One linear case on the CPU backend in cx's precision against float64: forward, and the backward
 * with beta 1 (accumulating into random dinp, dw, db) and beta 0 (dinp written). */
static void cpu_linear_case(test_ctx *ctx, const be_ctx *cx, const lin_case *c, double tol, const char *what) {
    const size_t M = (size_t)c->M, I = (size_t)c->I, O = (size_t)c->O;
    float *f = malloc(sizeof(float) * (M * I * 2 + O * I * 2 + O * 2 + M * O * 2));
    double *d = malloc(sizeof(double) * (M * I * 2 + O * I * 2 + O * 2 + M * O * 2));
    float *x = f, *dx = x + M * I, *w = dx + M * I, *dw = w + O * I, *b = dw + O * I, *db = b + O, *y = db + O,
          *dy = y + M * O;
    double *xd = d, *dxd = xd + M * I, *wd = dxd + M * I, *dwd = wd + O * I, *bd = dwd + O * I, *dbd = bd + O,
           *yd = dbd + O, *dyd = yd + M * O;
    test_rng r = {0x9E3779B97F4A7C15ULL ^ (M * 131 + I * 17 + O)};
    fill(&r, x, xd, M * I);
    fill(&r, w, wd, O * I);
    fill(&r, b, bd, O);
    fill(&r, dy, dyd, M * O);
    be_linear_forward_f32(cx, y, x, w, c->bias ? b : NULL, c->M, c->I, c->O);
    be_linear_forward_f64(cx, yd, xd, wd, c->bias ? bd : NULL, c->M, c->I, c->O);
    double e = rel_f32_f64(y, yd, M * O);
    CHECK(ctx, e < tol, "%s linear_forward M=%d I=%d O=%d bias=%d: error %.3g >= %.3g", what, c->M, c->I, c->O,
          c->bias, e, tol);
    for (int beta = 1; beta >= 0; beta--) {
        fill(&r, dx, dxd, M * I); /* random starting values: beta 1 must add to them, beta 0 ignore them */
        fill(&r, dw, dwd, O * I);
        fill(&r, db, dbd, O);
        be_linear_backward_f32(cx, dx, (float)beta, dw, c->bias ? db : NULL, dy, x, w, c->M, c->I, c->O);
        be_linear_backward_f64(cx, dxd, beta, dwd, c->bias ? dbd : NULL, dyd, xd, wd, c->M, c->I, c->O);
        const double ex = rel_f32_f64(dx, dxd, M * I), ew = rel_f32_f64(dw, dwd, O * I);
        const double eb = c->bias ? rel_f32_f64(db, dbd, O) : 0.0;
        CHECK(ctx, ex < tol && ew < tol && eb < tol,
              "%s linear_backward beta=%d M=%d I=%d O=%d: errors dinp %.3g dw %.3g db %.3g >= %.3g", what, beta, c->M,
              c->I, c->O, ex, ew, eb, tol);
        if (beta == 1) printf("  cpu %-5s linear M=%4d I=%4d O=%4d: fwd %.2e, dinp %.2e, dw %.2e, db %.2e\n", what,
                              c->M, c->I, c->O, e, ex, ew, eb);
    }
    free(f);
    free(d);
}

static void test_registry(test_ctx *ctx) {
    int n = 0;
    const moh_backend *const *all = backend_list(&n);
    CHECK(ctx, n >= 2 && all[0] == backend_get(MOH_DEVICE_CPU), "registry: %d backends, the CPU first", n);
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++) CHECK(ctx, strcmp(all[i]->name, all[j]->name), "two backends named %s", all[i]->name);
    CHECK(ctx, backend_get(MOH_DEVICE_AUTO) == NULL, "backend_get(auto) names no table");
    moh_device d = MOH_DEVICE_CPU;
    moh_error err = {0};
    CHECK(ctx, backend_parse_device(NULL, &d, &err) == MOH_OK && d == MOH_DEVICE_AUTO, "NULL parses as auto");
    CHECK(ctx, backend_parse_device("cuda", &d, &err) == MOH_OK && d == MOH_DEVICE_CUDA, "cuda parses");
    CHECK(ctx, backend_parse_device("gpu", &d, &err) == MOH_E_ARG && strstr(err.msg, "'gpu'"), "gpu refused: %s", err.msg);
    const moh_backend *be = NULL;
    char note[224], why[224];
    CHECK(ctx, backend_resolve(MOH_DEVICE_AUTO, "llama", &be, note, sizeof note, &err) == MOH_OK && be &&
                   be->available(why, sizeof why) && be->runs_family("llama", why, sizeof why),
          "auto resolves to a backend that runs llama");
    CHECK(ctx, be != backend_get(MOH_DEVICE_CPU) || note[0], "auto chose the CPU without saying why");
    CHECK(ctx, backend_resolve(MOH_DEVICE_CPU, "vit", &be, note, sizeof note, &err) == MOH_OK &&
                   be == backend_get(MOH_DEVICE_CPU) && !note[0], "--device cpu: the CPU, no note");
    const moh_backend *cu = backend_get(MOH_DEVICE_CUDA);
    if (!cu->available(why, sizeof why) || !cu->runs_family("dit", why, sizeof why)) {
        const int rc = backend_resolve(MOH_DEVICE_CUDA, "dit", &be, note, sizeof note, &err);
        CHECK(ctx, rc == MOH_E_DEVICE && !strncmp(err.msg, "--device cuda: ", 15) && !strchr(err.msg, '\n'),
              "--device cuda where it cannot run: %d '%s'", rc, err.msg);
    }
}

/* Backend be against the CPU backend, same precision: its memory round trip, then each op it has. */
static void test_other(test_ctx *ctx, const moh_backend *be, const lin_case *cases, int nc) {
    moh_error err = {0};
    const size_t n = 4099;
    float *h = malloc(sizeof(float) * n * 2);
    test_rng r = {77};
    fill(&r, h, NULL, n);
    void *dev = NULL;
    CHECK(ctx, be->alloc(&dev, sizeof(float) * n, &err) == MOH_OK, "%s alloc: %s", be->name, err.msg);
    if (dev) {
        CHECK(ctx, be->to_device(dev, h, sizeof(float) * n, &err) == MOH_OK &&
                       be->to_host(h + n, dev, sizeof(float) * n, &err) == MOH_OK && be->sync(&err) == MOH_OK,
              "%s copies: %s", be->name, err.msg);
        CHECK(ctx, !memcmp(h, h + n, sizeof(float) * n), "%s: a round trip through device memory changed the data",
              be->name);
        be->free(dev);
    }
    free(h);
    if (!be->linear_forward || !be->linear_backward) {
        printf("  %s: no linear ops yet (issue 27): memory checked only\n", be->name);
        return;
    }
    be_ctx cpu, dx;
    be_ctx_init(&cpu, backend_get(MOH_DEVICE_CPU));
    be_ctx_init(&dx, be);
    for (int k = 0; k < nc; k++) {
        const lin_case *c = &cases[k];
        const size_t M = (size_t)c->M, I = (size_t)c->I, O = (size_t)c->O;
        const size_t sz[] = {M * I, O * I, O, M * O, M * O, M * I, O * I, O}; /* x w b y dy dx dw db */
        float *hv[8], *dv[8] = {0}, *back[8];
        bool ok = true;
        for (int i = 0; i < 8; i++) {
            hv[i] = malloc(sizeof(float) * sz[i]);
            back[i] = malloc(sizeof(float) * sz[i]);
            fill(&r, hv[i], NULL, sz[i]);
            ok = ok && be->alloc((void **)&dv[i], sizeof(float) * sz[i], &err) == MOH_OK &&
                 be->to_device(dv[i], hv[i], sizeof(float) * sz[i], &err) == MOH_OK;
        }
        CHECK(ctx, ok, "%s: device buffers: %s", be->name, err.msg);
        if (ok) {
            be_linear_forward_f32(&cpu, hv[3], hv[0], hv[1], c->bias ? hv[2] : NULL, c->M, c->I, c->O);
            be_linear_backward_f32(&cpu, hv[5], 1.0f, hv[6], c->bias ? hv[7] : NULL, hv[4], hv[0], hv[1], c->M, c->I,
                                   c->O);
            be_linear_forward_f32(&dx, dv[3], dv[0], dv[1], c->bias ? dv[2] : NULL, c->M, c->I, c->O);
            be_linear_backward_f32(&dx, dv[5], 1.0f, dv[6], c->bias ? dv[7] : NULL, dv[4], dv[0], dv[1], c->M, c->I,
                                   c->O);
            ok = be->sync(&err) == MOH_OK;
            for (int i = 3; ok && i < 8; i++) ok = be->to_host(back[i], dv[i], sizeof(float) * sz[i], &err) == MOH_OK;
            CHECK(ctx, ok, "%s: results back: %s", be->name, err.msg);
            const int outs[] = {3, 5, 6, 7};
            for (int i = 0; ok && i < 4; i++) {
                const double e = test_rel_err_f32(back[outs[i]], hv[outs[i]], (long)sz[outs[i]]);
                CHECK(ctx, e < 2e-2, "%s linear output %d M=%d I=%d O=%d: error %.3g vs the CPU", be->name, outs[i],
                      c->M, c->I, c->O, e);
            }
        }
        for (int i = 0; i < 8; i++) {
            free(hv[i]);
            free(back[i]);
            if (dv[i]) be->free(dv[i]);
        }
    }
    be_ctx_release(&cpu);
    be_ctx_release(&dx);
}

int main(void) {
    test_ctx ctx = {0};
    test_registry(&ctx);
    const lin_case cases[] = {{1, 1, 1, true}, {7, 33, 5, true}, {64, 48, 96, false}, {130, 257, 65, true},
                              {512, 96, 288, true}};
    const int nc = (int)(sizeof cases / sizeof cases[0]);
    be_ctx cx;
    be_ctx_init(&cx, backend_get(MOH_DEVICE_CPU));
    for (int k = 0; k < nc; k++) cpu_linear_case(&ctx, &cx, &cases[k], 1e-5, "fp32");
    char why[160];
    if (precision_resolve(MOH_PRECISION_BF16, why, sizeof why) == MOH_PRECISION_BF16) {
        moh_error err = {0};
        CHECK(&ctx, be_ctx_set_weights(&cx, NULL, &err) == MOH_OK, "fp32 again");
        bf16_mirror none = {0}; /* a mirror of nothing: every operand rounded on the fly */
        CHECK(&ctx, be_ctx_set_weights(&cx, &none, &err) == MOH_OK && cx.precision == MOH_PRECISION_BF16 &&
                        be_cpu_bf16(&cx), "bf16 context: %s", err.msg);
        /* bf16 operands (8 bits of mantissa), fp32 sums: measured about 2e-3 relative */
        for (int k = 0; k < nc; k++) cpu_linear_case(&ctx, &cx, &cases[k], 1e-2, "bf16");
    } else {
        printf("  cpu bf16: not on this CPU (%s)\n", why);
    }
    be_ctx_release(&cx);
    CHECK(&ctx, cx.state == NULL && cx.precision == MOH_PRECISION_FP32, "released context is fp32");
    int n = 0, others = 0;
    const moh_backend *const *all = backend_list(&n);
    for (int i = 0; i < n; i++) {
        if (all[i] == backend_get(MOH_DEVICE_CPU)) continue;
        if (!all[i]->available(why, sizeof why)) {
            printf("  %s: skipped (%s)\n", all[i]->name, why);
            continue;
        }
        others++;
        test_other(&ctx, all[i], cases, nc);
    }
    if (!others) printf("  no backend besides the CPU here: the cross-backend comparisons did not run\n");
    return test_finish("test_backend_ops", &ctx);
}
