/* Core ops (src/ops): for every op, a float64 central-difference gradient check of the analytic
 * _f64 backward, agreement of the _f32 instantiation with _f64 (forward and backward), exact known
 * values, accumulation (+=) and NULL gradients. Prints the error achieved by every check. */
#include "attn/attn.h"
#include "ops/ops.h"
#include "test_util.h"

#include <float.h>
#include <omp.h>
#include <string.h>

#define FD_H 1e-6      /* central-difference step */
#define TOL_FD 1e-6    /* analytic f64 backward vs finite differences */
#define TOL_F32 1e-5   /* f32 instantiation vs f64 */
#define TOL_ACC 1e-12  /* backward twice == 2 x backward once (f64) */

static test_ctx T;
static test_rng R = {0x9E3779B97F4A7C15ULL};

/* ---- small helpers: every allocation is freed at exit by free_all() ---- */
static void *allocs[1024];
static int n_allocs;
static void *talloc(size_t bytes) {
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p || n_allocs == 1024) {
        fprintf(stderr, "test_ops: out of memory\n");
        exit(2);
    }
    allocs[n_allocs++] = p;
    return p;
}
static void free_all(void) {
    for (int i = 0; i < n_allocs; i++) free(allocs[i]);
    n_allocs = 0;
}
static double *zeros(long n) { return talloc((size_t)n * sizeof(double)); }
/* uniform in [lo, hi), rounded to float so both instantiations see the same inputs */
static double *rnd(long n, double lo, double hi) {
    double *a = zeros(n);
    for (long i = 0; i < n; i++) {
        a[i] = (double)(float)(lo + (hi - lo) * 0.5 * (test_rng_uniform(&R) + 1.0));
        if (a[i] == 0.0) a[i] = 0.5 * hi;
    }
    return a;
}
static float *f32(const double *a, long n) {
    float *b = talloc((size_t)n * sizeof(float));
    for (long i = 0; i < n; i++) b[i] = (float)a[i];
    return b;
}
static float *zeros32(long n) { return talloc((size_t)n * sizeof(float)); }
static double *copy(const double *a, long n) {
    double *b = zeros(n);
    memcpy(b, a, (size_t)n * sizeof(double));
    return b;
}
static double dot(const double *a, const double *b, long n) {
    double s = 0.0;
    for (long i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}
/* relative error of a float tensor against a double reference */
static double rel32(const float *a, const double *ref, long n) {
    double *d = zeros(n);
    for (long i = 0; i < n; i++) d[i] = (double)a[i];
    return test_rel_err_f64(d, ref, n);
}
/* error of (gradient after a second backward) against 2 x (gradient after one) */
static double acc_err(const double *twice, const double *once, long n) {
    double *t = zeros(n);
    for (long i = 0; i < n; i++) t[i] = 2.0 * once[i];
    return test_rel_err_f64(twice, t, n);
}

/* Records one check and prints its achieved error next to its bound. */
static void report(const char *op, const char *what, double err, double tol) {
    printf("  %-22s %-42s %9.2e  (<= %.0e)\n", op, what, err, tol);
    CHECK(&T, err <= tol, "%s %s: error %.3e > %.0e", op, what, err, tol);
}

typedef double (*loss_fn)(void *ctx);

/* Central differences of loss(ctx) w.r.t. every element of p, compared with analytic. */
static double fd_err(loss_fn loss, void *ctx, double *p, long n, const double *analytic) {
    double *num = zeros(n);
    for (long i = 0; i < n; i++) {
        double save = p[i];
        p[i] = save + FD_H;
        double lp = loss(ctx);
        p[i] = save - FD_H;
        double lm = loss(ctx);
        p[i] = save;
        num[i] = (lp - lm) / (2.0 * FD_H);
    }
    return test_rel_err_f64(analytic, num, n);
}

/* ============================================ gemm ============================================ */

static void test_gemm(void) {
    const int M = 5, N = 7, K = 9;
    for (int ta = 0; ta < 2; ta++) {
        for (int tb = 0; tb < 2; tb++) {
            int lda = (ta ? M : K) + 2, ldb = (tb ? K : N) + 3, ldc = N + 1;
            long na = (long)(ta ? K : M) * lda, nb = (long)(tb ? N : K) * ldb, nc = (long)M * ldc;
            double *A = rnd(na, -1, 1), *B = rnd(nb, -1, 1), *C = rnd(nc, -1, 1);
            float *A32 = f32(A, na), *B32 = f32(B, nb), *C32 = f32(C, nc);
            double c0 = C[0];
            gemm_f64(ta, tb, M, N, K, 0.75, A, lda, B, ldb, 0.5, C, ldc);
            gemm_f32(ta, tb, M, N, K, 0.75f, A32, lda, B32, ldb, 0.5f, C32, ldc);
            char what[64];
            snprintf(what, sizeof what, "f32 vs f64, ta=%d tb=%d", ta, tb);
            report("gemm", what, rel32(C32, C, nc), TOL_F32);
            /* the f64 loop against a direct sum for C[0,0] */
            double c00 = 0.0;
            for (int k = 0; k < K; k++)
                c00 += (ta ? A[(long)k * lda] : A[k]) * (tb ? B[k] : B[(long)k * ldb]);
            snprintf(what, sizeof what, "f64 C[0,0] direct sum, ta=%d tb=%d", ta, tb);
            report("gemm", what, fabs(C[0] - (0.75 * c00 + 0.5 * c0)) / fabs(C[0]), 1e-14);
        }
    }
    /* exact small case: [[1,2],[3,4]] @ [[5,6],[7,8]] = [[19,22],[43,50]] */
    double a[4] = {1, 2, 3, 4}, b[4] = {5, 6, 7, 8}, c[4] = {0}, want[4] = {19, 22, 43, 50};
    gemm_f64(false, false, 2, 2, 2, 1.0, a, 2, b, 2, 0.0, c, 2);
    report("gemm", "f64 known 2x2 product", test_rel_err_f64(c, want, 4), 0.0);
    float a32[4] = {1, 2, 3, 4}, b32[4] = {5, 6, 7, 8}, c32[4] = {0};
    gemm_f32(false, false, 2, 2, 2, 1.0f, a32, 2, b32, 2, 0.0f, c32, 2);
    report("gemm", "f32 known 2x2 product", rel32(c32, want, 4), 0.0);
}

/* =========================================== linear =========================================== */

typedef struct lin_ctx { double *inp, *w, *b, *out, *rw; int M, I, O; } lin_ctx;
static double lin_loss(void *p) {
    lin_ctx *c = p;
    linear_forward_f64(c->out, c->inp, c->w, c->b, c->M, c->I, c->O);
    return dot(c->out, c->rw, (long)c->M * c->O);
}

static void test_linear(int with_bias) {
    const int M = 5, I = 7, O = 3;
    const char *op = with_bias ? "linear" : "linear (b=NULL)";
    lin_ctx c = {rnd((long)M * I, -1, 1), rnd((long)O * I, -1, 1), with_bias ? rnd(O, -1, 1) : NULL,
                 zeros((long)M * O), rnd((long)M * O, -1, 1), M, I, O};
    double *dinp = zeros((long)M * I), *dw = zeros((long)O * I), *db = zeros(O);
    linear_backward_f64(dinp, dw, db, c.rw, c.inp, c.w, M, I, O);
    report(op, "fd dinp", fd_err(lin_loss, &c, c.inp, (long)M * I, dinp), TOL_FD);
    report(op, "fd dw", fd_err(lin_loss, &c, c.w, (long)O * I, dw), TOL_FD);
    if (with_bias) report(op, "fd db", fd_err(lin_loss, &c, c.b, O, db), TOL_FD);

    /* known value: out[0,0] = sum_i inp[0,i] w[0,i] + b[0] */
    lin_loss(&c);
    double o00 = with_bias ? c.b[0] : 0.0;
    for (int i = 0; i < I; i++) o00 += c.inp[i] * c.w[i];
    report(op, "f64 out[0,0] vs direct sum", fabs(c.out[0] - o00) / fabs(o00), 1e-15);

    float *out32 = zeros32((long)M * O), *dinp32 = zeros32((long)M * I), *dw32 = zeros32((long)O * I),
          *db32 = zeros32(O);
    linear_forward_f32(out32, f32(c.inp, (long)M * I), f32(c.w, (long)O * I),
                       with_bias ? f32(c.b, O) : NULL, M, I, O);
    report(op, "f32 vs f64 forward", rel32(out32, c.out, (long)M * O), TOL_F32);
    linear_backward_f32(dinp32, dw32, db32, f32(c.rw, (long)M * O), f32(c.inp, (long)M * I),
                        f32(c.w, (long)O * I), M, I, O);
    report(op, "f32 vs f64 dinp", rel32(dinp32, dinp, (long)M * I), TOL_F32);
    report(op, "f32 vs f64 dw", rel32(dw32, dw, (long)O * I), TOL_F32);
    report(op, "f32 vs f64 db", rel32(db32, db, O), TOL_F32);

    double *dinp2 = copy(dinp, (long)M * I), *dw2 = copy(dw, (long)O * I), *db2 = copy(db, O);
    linear_backward_f64(dinp2, dw2, db2, c.rw, c.inp, c.w, M, I, O);
    double e = acc_err(dinp2, dinp, (long)M * I);
    double e2 = acc_err(dw2, dw, (long)O * I), e3 = acc_err(db2, db, O);
    report(op, "backward accumulates (x2)", fmax(e, fmax(e2, e3)), TOL_ACC);
    double *dw3 = zeros((long)O * I);
    linear_backward_f64(NULL, dw3, NULL, c.rw, c.inp, c.w, M, I, O);
    report(op, "NULL dinp/db, dw still right", test_rel_err_f64(dw3, dw, (long)O * I), 0.0);
}

/* ========================================= layernorm ========================================== */

typedef struct ln_ctx { double *inp, *w, *b, *out, *mean, *rstd, *rw; int M, C; double eps; } ln_ctx;
static double ln_loss(void *p) {
    ln_ctx *c = p;
    layernorm_forward_f64(c->out, c->mean, c->rstd, c->inp, c->w, c->b, c->M, c->C, c->eps);
    return dot(c->out, c->rw, (long)c->M * c->C);
}

static void test_layernorm(void) {
    const int M = 5, C = 7;
    const long n = (long)M * C;
    const char *op = "layernorm";
    ln_ctx c = {rnd(n, -0.5, 1.5), rnd(C, -1, 1), rnd(C, -1, 1), zeros(n), zeros(M), zeros(M),
                rnd(n, -1, 1), M, C, 1e-5};
    ln_loss(&c);
    double *dinp = zeros(n), *dw = zeros(C), *db = zeros(C);
    layernorm_backward_f64(dinp, dw, db, c.rw, c.inp, c.w, c.mean, c.rstd, M, C);
    report(op, "fd dinp", fd_err(ln_loss, &c, c.inp, n, dinp), TOL_FD);
    report(op, "fd dw", fd_err(ln_loss, &c, c.w, C, dw), TOL_FD);
    report(op, "fd db", fd_err(ln_loss, &c, c.b, C, db), TOL_FD);
    ln_loss(&c);

    float *out32 = zeros32(n), *mean32 = zeros32(M), *rstd32 = zeros32(M);
    float *inp32 = f32(c.inp, n), *w32 = f32(c.w, C);
    layernorm_forward_f32(out32, mean32, rstd32, inp32, w32, f32(c.b, C), M, C, 1e-5f);
    report(op, "f32 vs f64 forward", rel32(out32, c.out, n), TOL_F32);
    report(op, "f32 vs f64 mean", rel32(mean32, c.mean, M), TOL_F32);
    report(op, "f32 vs f64 rstd", rel32(rstd32, c.rstd, M), TOL_F32);
    float *dinp32 = zeros32(n), *dw32 = zeros32(C), *db32 = zeros32(C);
    layernorm_backward_f32(dinp32, dw32, db32, f32(c.rw, n), inp32, w32, mean32, rstd32, M, C);
    report(op, "f32 vs f64 dinp", rel32(dinp32, dinp, n), TOL_F32);
    report(op, "f32 vs f64 dw", rel32(dw32, dw, C), TOL_F32);
    report(op, "f32 vs f64 db", rel32(db32, db, C), TOL_F32);

    /* known: with w = 1, b = 0 each row has mean 0 and biased variance var / (var + eps) */
    double *ones = zeros(C), *zc = zeros(C), *o = zeros(n), err = 0.0;
    for (int i = 0; i < C; i++) ones[i] = 1.0;
    layernorm_forward_f64(o, c.mean, c.rstd, c.inp, ones, zc, M, C, 1e-5);
    for (int m = 0; m < M; m++) {
        double mu = 0.0, var = 0.0, s = 0.0, s2 = 0.0;
        for (int i = 0; i < C; i++) mu += c.inp[m * C + i] / C;
        for (int i = 0; i < C; i++) var += (c.inp[m * C + i] - mu) * (c.inp[m * C + i] - mu) / C;
        for (int i = 0; i < C; i++) s += o[m * C + i] / C;
        for (int i = 0; i < C; i++) s2 += o[m * C + i] * o[m * C + i] / C;
        err = fmax(err, fmax(fabs(s), fabs(s2 - var / (var + 1e-5))));
        err = fmax(err, fabs(c.mean[m] - mu) + fabs(c.rstd[m] - 1.0 / sqrt(var + 1e-5)) / c.rstd[m]);
    }
    report(op, "known: row mean 0, var/(var+eps)", err, 1e-14);
    ln_loss(&c);

    double *dinp2 = copy(dinp, n), *dw2 = copy(dw, C), *db2 = copy(db, C);
    layernorm_backward_f64(dinp2, dw2, db2, c.rw, c.inp, c.w, c.mean, c.rstd, M, C);
    double e = fmax(acc_err(dinp2, dinp, n), fmax(acc_err(dw2, dw, C), acc_err(db2, db, C)));
    report(op, "backward accumulates (x2)", e, TOL_ACC);
    double *dw3 = zeros(C), *db3 = zeros(C);
    layernorm_backward_f64(NULL, dw3, NULL, c.rw, c.inp, c.w, c.mean, c.rstd, M, C);
    layernorm_backward_f64(NULL, NULL, db3, c.rw, c.inp, c.w, c.mean, c.rstd, M, C);
    report(op, "NULL grads skipped, others right",
           fmax(test_rel_err_f64(dw3, dw, C), test_rel_err_f64(db3, db, C)), 0.0);
}

/* ========================================== rmsnorm =========================================== */

typedef struct rms_ctx { double *inp, *w, *out, *rstd, *rw; int M, C; double eps; } rms_ctx;
static double rms_loss(void *p) {
    rms_ctx *c = p;
    rmsnorm_forward_f64(c->out, c->rstd, c->inp, c->w, c->M, c->C, c->eps);
    return dot(c->out, c->rw, (long)c->M * c->C);
}

static void test_rmsnorm(void) {
    const int M = 5, C = 7;
    const long n = (long)M * C;
    const char *op = "rmsnorm";
    rms_ctx c = {rnd(n, -1, 1), rnd(C, -1.5, 1.5), zeros(n), zeros(M), rnd(n, -1, 1), M, C, 1e-6};
    rms_loss(&c);
    double *dinp = zeros(n), *dw = zeros(C);
    rmsnorm_backward_f64(dinp, dw, c.rw, c.inp, c.w, c.rstd, M, C);
    report(op, "fd dinp", fd_err(rms_loss, &c, c.inp, n, dinp), TOL_FD);
    report(op, "fd dw", fd_err(rms_loss, &c, c.w, C, dw), TOL_FD);
    rms_loss(&c);

    /* known: HF formula written out */
    double err = 0.0;
    for (int m = 0; m < M; m++) {
        double ms = 0.0;
        for (int i = 0; i < C; i++) ms += c.inp[m * C + i] * c.inp[m * C + i] / C;
        double r = 1.0 / sqrt(ms + 1e-6);
        for (int i = 0; i < C; i++) err = fmax(err, fabs(c.out[m * C + i] - c.w[i] * c.inp[m * C + i] * r));
        err = fmax(err, fabs(c.rstd[m] - r) / r);
    }
    report(op, "known: w * x * rsqrt(mean(x^2)+eps)", err, 1e-15);

    float *out32 = zeros32(n), *rstd32 = zeros32(M), *inp32 = f32(c.inp, n), *w32 = f32(c.w, C);
    rmsnorm_forward_f32(out32, rstd32, inp32, w32, M, C, 1e-6f);
    report(op, "f32 vs f64 forward", rel32(out32, c.out, n), TOL_F32);
    report(op, "f32 vs f64 rstd", rel32(rstd32, c.rstd, M), TOL_F32);
    float *dinp32 = zeros32(n), *dw32 = zeros32(C);
    rmsnorm_backward_f32(dinp32, dw32, f32(c.rw, n), inp32, w32, rstd32, M, C);
    report(op, "f32 vs f64 dinp", rel32(dinp32, dinp, n), TOL_F32);
    report(op, "f32 vs f64 dw", rel32(dw32, dw, C), TOL_F32);

    double *dinp2 = copy(dinp, n), *dw2 = copy(dw, C);
    rmsnorm_backward_f64(dinp2, dw2, c.rw, c.inp, c.w, c.rstd, M, C);
    report(op, "backward accumulates (x2)", fmax(acc_err(dinp2, dinp, n), acc_err(dw2, dw, C)), TOL_ACC);
    double *dinp3 = zeros(n);
    rmsnorm_backward_f64(dinp3, NULL, c.rw, c.inp, c.w, c.rstd, M, C);
    report(op, "NULL dw skipped, dinp right", test_rel_err_f64(dinp3, dinp, n), 0.0);
}

/* ===================================== elementwise (1 input) ================================== */

typedef void (*ew_fwd64)(double *, const double *, long);
typedef void (*ew_bwd64)(double *, const double *, const double *, long);
typedef void (*ew_fwd32)(float *, const float *, long);
typedef void (*ew_bwd32)(float *, const float *, const float *, long);
typedef struct ew_ctx { ew_fwd64 fwd; double *inp, *out, *rw; long n; } ew_ctx;
static double ew_loss(void *p) {
    ew_ctx *c = p;
    c->fwd(c->out, c->inp, c->n);
    return dot(c->out, c->rw, c->n);
}

static void test_elementwise(const char *op, ew_fwd64 f64, ew_bwd64 b64, ew_fwd32 f32f, ew_bwd32 b32,
                             double x_known, double y_known) {
    const long n = 13;
    ew_ctx c = {f64, rnd(n, -4, 4), zeros(n), rnd(n, -1, 1), n};
    double *d = zeros(n);
    b64(d, c.rw, c.inp, n);
    report(op, "fd dinp", fd_err(ew_loss, &c, c.inp, n, d), TOL_FD);
    ew_loss(&c);
    float *out32 = zeros32(n), *d32 = zeros32(n), *inp32 = f32(c.inp, n);
    f32f(out32, inp32, n);
    report(op, "f32 vs f64 forward", rel32(out32, c.out, n), TOL_F32);
    b32(d32, f32(c.rw, n), inp32, n);
    report(op, "f32 vs f64 dinp", rel32(d32, d, n), TOL_F32);
    double *d2 = copy(d, n);
    b64(d2, c.rw, c.inp, n);
    report(op, "backward accumulates (x2)", acc_err(d2, d, n), TOL_ACC);
    b64(NULL, c.rw, c.inp, n); /* must not crash */
    double y = 0.0;
    f64(&y, &x_known, 1);
    char what[64];
    snprintf(what, sizeof what, "known f64 f(%g) = %.16f", x_known, y_known);
    report(op, what, fabs(y - y_known) / fabs(y_known), 4e-16);
    float x32 = (float)x_known, y32 = 0.0f;
    f32f(&y32, &x32, 1);
    snprintf(what, sizeof what, "known f32 f(%g)", x_known);
    report(op, what, fabs((double)y32 - y_known) / fabs(y_known), 2e-7);
}

/* ========================================== swiglu ============================================ */

typedef struct sw_ctx { double *gate, *up, *out, *rw; long n; } sw_ctx;
static double sw_loss(void *p) {
    sw_ctx *c = p;
    swiglu_forward_f64(c->out, c->gate, c->up, c->n);
    return dot(c->out, c->rw, c->n);
}

static void test_swiglu(void) {
    const long n = 13;
    const char *op = "swiglu";
    sw_ctx c = {rnd(n, -4, 4), rnd(n, -2, 2), zeros(n), rnd(n, -1, 1), n};
    double *dg = zeros(n), *du = zeros(n);
    swiglu_backward_f64(dg, du, c.rw, c.gate, c.up, n);
    report(op, "fd dgate", fd_err(sw_loss, &c, c.gate, n, dg), TOL_FD);
    report(op, "fd dup", fd_err(sw_loss, &c, c.up, n, du), TOL_FD);
    sw_loss(&c);
    /* known: swiglu(g, u) = silu(g) * u */
    double *s = zeros(n), err = 0.0;
    silu_forward_f64(s, c.gate, n);
    for (long i = 0; i < n; i++) err = fmax(err, fabs(c.out[i] - s[i] * c.up[i]));
    report(op, "known: silu(gate) * up", err, 1e-15);
    float *out32 = zeros32(n), *dg32 = zeros32(n), *du32 = zeros32(n);
    float *g32 = f32(c.gate, n), *u32 = f32(c.up, n);
    swiglu_forward_f32(out32, g32, u32, n);
    report(op, "f32 vs f64 forward", rel32(out32, c.out, n), TOL_F32);
    swiglu_backward_f32(dg32, du32, f32(c.rw, n), g32, u32, n);
    report(op, "f32 vs f64 dgate", rel32(dg32, dg, n), TOL_F32);
    report(op, "f32 vs f64 dup", rel32(du32, du, n), TOL_F32);
    double *dg2 = copy(dg, n), *du2 = copy(du, n);
    swiglu_backward_f64(dg2, du2, c.rw, c.gate, c.up, n);
    report(op, "backward accumulates (x2)", fmax(acc_err(dg2, dg, n), acc_err(du2, du, n)), TOL_ACC);
    double *du3 = zeros(n);
    swiglu_backward_f64(NULL, du3, c.rw, c.gate, c.up, n);
    report(op, "NULL dgate skipped, dup right", test_rel_err_f64(du3, du, n), 0.0);
}

/* The fused float32 variants the LM step uses give bitwise the results of the unfused ops:
 * add_rmsnorm_forward = add, then rmsnorm_forward; swiglu_forward_sig = swiglu_forward plus the
 * sigmoid; swiglu_backward_set = swiglu_backward into zeroed buffers. Sizes past the ops'
 * OpenMP thresholds, so the parallel loops run. */
static int n_diff32(const float *a, const float *b, long n) {
    int d = 0;
    for (long i = 0; i < n; i++) d += memcmp(&a[i], &b[i], sizeof(float)) != 0;
    return d;
}

static void test_fused_variants(void) {
    const int M = 301, C = 256;
    const long n = (long)M * C;
    float *a = f32(rnd(n, -3, 3), n), *b = f32(rnd(n, -3, 3), n), *w = f32(rnd(C, 0.5, 1.5), C);
    float *sum = zeros32(n), *out = zeros32(n), *rstd = zeros32(M);
    float *sum2 = zeros32(n), *out2 = zeros32(n), *rstd2 = zeros32(M);
    add_rmsnorm_forward_f32(sum, out, rstd, a, b, w, M, C, 1e-5f);
    for (long i = 0; i < n; i++) sum2[i] = a[i] + b[i];
    rmsnorm_forward_f32(out2, rstd2, sum2, w, M, C, 1e-5f);
    const int dn = n_diff32(sum, sum2, n) + n_diff32(out, out2, n) + n_diff32(rstd, rstd2, M);
    CHECK(&T, dn == 0, "add_rmsnorm_forward: %d values differ from add + rmsnorm_forward", dn);
    printf("  fused add_rmsnorm_forward == add + rmsnorm_forward: %d of %ld values differ\n", dn, 2 * n + M);

    const long m = 70001; /* > 65536: parallel */
    float *g = f32(rnd(m, -9, 9), m), *u = f32(rnd(m, -2, 2), m), *dout = f32(rnd(m, -1, 1), m);
    float *act = zeros32(m), *sig = zeros32(m), *act2 = zeros32(m);
    swiglu_forward_sig_f32(act, sig, g, u, m);
    swiglu_forward_f32(act2, g, u, m);
    /* sig: the sigmoid (float32: through the vector exp on AVX-512), within 4 ulp of float64's */
    int ds = 0;
    double sworst = 0.0;
    for (long i = 0; i < m; i++) {
        const double want = 1.0 / (1.0 + exp(-(double)g[i])), e = fabs(sig[i] - want) / want;
        sworst = e > sworst ? e : sworst;
        ds += e > 4 * FLT_EPSILON / 2;
    }
    const int da = n_diff32(act, act2, m);
    CHECK(&T, da == 0 && ds == 0, "swiglu_forward_sig: %d outputs differ from swiglu_forward, %d sigmoids off by > 4 "
          "ulp (worst %.3g)", da, ds, sworst);
    float *dg = zeros32(m), *du = zeros32(m), *dg2 = zeros32(m), *du2 = zeros32(m);
    for (long i = 0; i < m; i++) dg[i] = du[i] = 7.0f; /* overwritten, not accumulated into */
    swiglu_backward_set_f32(dg, du, dout, g, sig, u, m);
    swiglu_backward_f32(dg2, du2, dout, g, u, m);
    const int db = n_diff32(dg, dg2, m) + n_diff32(du, du2, m);
    CHECK(&T, db == 0, "swiglu_backward_set: %d gradients differ from swiglu_backward", db);
    printf("  fused swiglu_forward_sig / swiglu_backward_set == unfused: %d, %d values differ; sigmoid within %.2g "
           "(relative)\n", da, db, sworst);
    /* the float32 exp at its edges, through swiglu with up = 1 (out = g sigmoid(g)): every g from
     * -104 to 104 in steps of 1/64 within 4 ulp of float64 (where the result is a normal float),
     * +-inf and NaN as libm's expf gives them */
    const long ne = 2 * 104 * 64 + 1;
    float *ge = zeros32(ne + 3), *ue = zeros32(ne + 3), *oe = zeros32(ne + 3), *se = zeros32(ne + 3);
    for (long i = 0; i < ne; i++) {
        ge[i] = -104.0f + (float)i / 64.0f;
        ue[i] = 1.0f;
    }
    ge[ne] = INFINITY, ge[ne + 1] = -INFINITY, ge[ne + 2] = NAN;
    ue[ne] = ue[ne + 1] = ue[ne + 2] = 1.0f;
    swiglu_forward_sig_f32(oe, se, ge, ue, ne + 3);
    double eworst = 0.0;
    int eoff = 0;
    for (long i = 0; i < ne; i++) {
        const double sg = 1.0 / (1.0 + exp(-(double)ge[i])), want = ge[i] * sg;
        if (fabs(want) < FLT_MIN || sg < FLT_MIN) continue;
        const double e = fmax(fabs(oe[i] - want) / fabs(want), fabs(se[i] - sg) / sg);
        eworst = e > eworst ? e : eworst;
        eoff += e > 4 * FLT_EPSILON / 2;
    }
    CHECK(&T, eoff == 0, "swiglu over g in [-104, 104]: %d values off by > 4 ulp (worst %.3g)", eoff, eworst);
    CHECK(&T, isinf(oe[ne]) && oe[ne] > 0 && se[ne] == 1.0f, "swiglu(+inf): %g, sigmoid %g (want inf, 1)",
          (double)oe[ne], (double)se[ne]);
    CHECK(&T, isnan(oe[ne + 1]) && se[ne + 1] == 0.0f, "swiglu(-inf): %g, sigmoid %g (want nan as -inf / inf, 0)",
          (double)oe[ne + 1], (double)se[ne + 1]);
    CHECK(&T, isnan(oe[ne + 2]) && isnan(se[ne + 2]), "swiglu(nan): %g, sigmoid %g (want nan)", (double)oe[ne + 2],
          (double)se[ne + 2]);
    printf("  swiglu / sigmoid over g in [-104, 104]: worst %.2g relative to float64; +-inf and nan as expf\n", eworst);
    /* GELU (erf): x in [-12, 12] in steps of 1/64 against float64, the error relative to |x| (the
     * op's scale: near cdf = 0 both float32 erf's cancel in 1 + erf); +-inf, nan */
    const long ng = 2 * 12 * 64 + 1;
    float *xg = zeros32(ng + 3), *yg = zeros32(ng + 3);
    for (long i = 0; i < ng; i++) xg[i] = -12.0f + (float)i / 64.0f;
    xg[ng] = INFINITY, xg[ng + 1] = -INFINITY, xg[ng + 2] = NAN;
    gelu_erf_forward_f32(yg, xg, ng + 3);
    double gworst = 0.0;
    for (long i = 0; i < ng; i++) {
        const double x = xg[i], want = 0.5 * x * (1.0 + erf(x / sqrt(2.0)));
        const double e = x != 0.0 ? fabs(yg[i] - want) / fabs(x) : fabs(yg[i]);
        gworst = e > gworst ? e : gworst;
    }
    CHECK(&T, gworst <= 4 * FLT_EPSILON / 2, "gelu_erf over [-12, 12]: worst error %.3g of |x| (want <= 4 ulp)", gworst);
    CHECK(&T, isinf(yg[ng]) && yg[ng] > 0 && isnan(yg[ng + 1]) && isnan(yg[ng + 2]),
          "gelu_erf(+inf, -inf, nan) = %g, %g, %g (want inf, nan as -inf * 0, nan)", (double)yg[ng], (double)yg[ng + 1],
          (double)yg[ng + 2]);
    printf("  gelu_erf over x in [-12, 12]: worst %.2g of |x| against float64; +-inf and nan as erff\n", gworst);
}

/* ========================================== softmax =========================================== */

typedef struct sm_ctx { double *inp, *out, *rw; int M, N; } sm_ctx;
static double sm_loss(void *p) {
    sm_ctx *c = p;
    softmax_forward_f64(c->out, c->inp, c->M, c->N);
    return dot(c->out, c->rw, (long)c->M * c->N);
}

static void test_softmax(void) {
    const int M = 5, N = 11;
    const long n = (long)M * N;
    const char *op = "softmax";
    sm_ctx c = {rnd(n, -3, 3), zeros(n), rnd(n, -1, 1), M, N};
    sm_loss(&c);
    double *d = zeros(n);
    softmax_backward_f64(d, c.rw, c.out, M, N);
    report(op, "fd dinp", fd_err(sm_loss, &c, c.inp, n, d), TOL_FD);
    sm_loss(&c);
    float *out32 = zeros32(n), *d32 = zeros32(n);
    softmax_forward_f32(out32, f32(c.inp, n), M, N);
    report(op, "f32 vs f64 forward", rel32(out32, c.out, n), TOL_F32);
    softmax_backward_f32(d32, f32(c.rw, n), out32, M, N);
    report(op, "f32 vs f64 dinp", rel32(d32, d, n), TOL_F32);
    double err = 0.0, err32 = 0.0;
    for (int m = 0; m < M; m++) {
        double s = 0.0, s32 = 0.0;
        for (int j = 0; j < N; j++) s += c.out[m * N + j], s32 += out32[m * N + j];
        err = fmax(err, fabs(s - 1.0));
        err32 = fmax(err32, fabs(s32 - 1.0));
    }
    report(op, "known: f64 rows sum to 1", err, 1e-15);
    report(op, "known: f32 rows sum to 1", err32, 1e-6);
    /* max subtraction: softmax(x + 1000) == softmax(x), finite */
    double *big = copy(c.inp, n), *ob = zeros(n);
    for (long i = 0; i < n; i++) big[i] += 1000.0;
    softmax_forward_f64(ob, big, M, N);
    report(op, "known: softmax(x + 1000) = softmax(x)", test_rel_err_f64(ob, c.out, n), 1e-12);
    double *d2 = copy(d, n);
    softmax_backward_f64(d2, c.rw, c.out, M, N);
    report(op, "backward accumulates (x2)", acc_err(d2, d, n), TOL_ACC);
    softmax_backward_f64(NULL, c.rw, c.out, M, N);
}

/* ======================================= cross-entropy ======================================== */

typedef struct ce_ctx { double *logits, *probs; const int *tg; int M, V; double eps; } ce_ctx;
static double ce_loss(void *p) {
    ce_ctx *c = p;
    return cross_entropy_forward_f64(c->probs, c->logits, c->tg, c->M, c->V, c->eps);
}

/* PyTorch's formula written out: mean over non-ignored rows of (1-eps)*nll + eps*mean_v(-log p_v). */
static double ce_reference(const double *x, const int *tg, int M, int V, double eps) {
    double tot = 0.0;
    int n = 0;
    for (int m = 0; m < M; m++) {
        if (tg[m] < 0) continue;
        double mx = -INFINITY, s = 0.0, sl = 0.0;
        for (int v = 0; v < V; v++) mx = fmax(mx, x[m * V + v]);
        for (int v = 0; v < V; v++) s += exp(x[m * V + v] - mx);
        for (int v = 0; v < V; v++) sl += -(x[m * V + v] - mx - log(s));
        tot += (1.0 - eps) * -(x[m * V + tg[m]] - mx - log(s)) + eps * sl / V;
        n++;
    }
    return n ? tot / n : 0.0;
}

static void test_cross_entropy(double eps) {
    const int M = 6, V = 11;
    const long n = (long)M * V;
    static const int tg[6] = {3, -1, 0, 10, -100, 7}; /* two ignored rows */
    char op[40];
    snprintf(op, sizeof op, "cross_entropy ls=%.1f", eps);
    ce_ctx c = {rnd(n, -3, 3), zeros(n), tg, M, V, eps};
    double loss = ce_loss(&c);
    report(op, "loss vs written-out formula", fabs(loss - ce_reference(c.logits, tg, M, V, eps)) / loss, 1e-14);
    double *d = zeros(n);
    cross_entropy_backward_f64(d, c.probs, tg, M, V, eps, 1.0);
    report(op, "fd dlogits (L = loss)", fd_err(ce_loss, &c, c.logits, n, d), TOL_FD);
    double err = 0.0;
    for (int v = 0; v < V; v++) err = fmax(err, fabs(d[1 * V + v]) + fabs(d[4 * V + v]));
    report(op, "ignored rows get zero grad", err, 0.0);
    ce_loss(&c);

    float *p32 = zeros32(n), *d32 = zeros32(n);
    float loss32 = cross_entropy_forward_f32(p32, f32(c.logits, n), tg, M, V, (float)eps);
    report(op, "f32 vs f64 loss", fabs((double)loss32 - loss) / loss, TOL_F32);
    report(op, "f32 vs f64 probs", rel32(p32, c.probs, n), TOL_F32);
    cross_entropy_backward_f32(d32, p32, tg, M, V, (float)eps, 1.0f);
    report(op, "f32 vs f64 dlogits", rel32(d32, d, n), TOL_F32);

    double *d2 = copy(d, n);
    cross_entropy_backward_f64(d2, c.probs, tg, M, V, eps, 1.0);
    report(op, "backward accumulates (x2)", acc_err(d2, d, n), TOL_ACC);
    double *d3 = zeros(n);
    cross_entropy_backward_f64(d3, c.probs, tg, M, V, eps, 2.0);
    report(op, "dloss scales the gradient", acc_err(d3, d, n), TOL_ACC);
    cross_entropy_backward_f64(NULL, c.probs, tg, M, V, eps, 1.0);

    /* known: equal logits give loss log(V) for any smoothing */
    double *flat = zeros(n);
    for (long i = 0; i < n; i++) flat[i] = 0.25;
    double lf = cross_entropy_forward_f64(c.probs, flat, tg, M, V, eps);
    report(op, "known: equal logits -> log(V)", fabs(lf - log((double)V)) / log((double)V), 1e-15);
    /* known: all rows ignored -> loss 0, no gradient */
    static const int none[6] = {-1, -1, -1, -1, -1, -1};
    double l0 = cross_entropy_forward_f64(c.probs, c.logits, none, M, V, eps);
    double *d4 = zeros(n);
    cross_entropy_backward_f64(d4, c.probs, none, M, V, eps, 1.0);
    double z = 0.0;
    for (long i = 0; i < n; i++) z = fmax(z, fabs(d4[i]));
    report(op, "known: all ignored -> loss 0, grad 0", fabs(l0) + z, 0.0);
}

/* ========================================= embedding ========================================== */

typedef struct emb_ctx { double *table, *out, *rw; const int *ids; int M, C; } emb_ctx;
static double emb_loss(void *p) {
    emb_ctx *c = p;
    embedding_forward_f64(c->out, c->ids, c->table, c->M, c->C);
    return dot(c->out, c->rw, (long)c->M * c->C);
}

static void test_embedding(void) {
    const int V = 11, C = 7, M = 6;
    static const int ids[6] = {4, 0, 10, 4, 7, 4}; /* repeats accumulate */
    const char *op = "embedding";
    emb_ctx c = {rnd((long)V * C, -1, 1), zeros((long)M * C), rnd((long)M * C, -1, 1), ids, M, C};
    double *dt = zeros((long)V * C);
    embedding_backward_f64(dt, c.rw, ids, M, C);
    report(op, "fd dtable", fd_err(emb_loss, &c, c.table, (long)V * C, dt), TOL_FD);
    emb_loss(&c);
    double err = 0.0;
    for (int m = 0; m < M; m++)
        for (int i = 0; i < C; i++) err = fmax(err, fabs(c.out[m * C + i] - c.table[ids[m] * C + i]));
    report(op, "known: out rows are table rows", err, 0.0);
    float *out32 = zeros32((long)M * C), *dt32 = zeros32((long)V * C);
    embedding_forward_f32(out32, ids, f32(c.table, (long)V * C), M, C);
    report(op, "f32 vs f64 forward", rel32(out32, c.out, (long)M * C), 0.0);
    embedding_backward_f32(dt32, f32(c.rw, (long)M * C), ids, M, C);
    report(op, "f32 vs f64 dtable", rel32(dt32, dt, (long)V * C), TOL_F32);
    double *dt2 = copy(dt, (long)V * C);
    embedding_backward_f64(dt2, c.rw, ids, M, C);
    report(op, "backward accumulates (x2)", acc_err(dt2, dt, (long)V * C), TOL_ACC);
    embedding_backward_f64(NULL, c.rw, ids, M, C);
}

/* ============================================ rope ============================================ */

typedef struct rope_ctx { double *x, *y, *rw; const int *pos; int T, stride, H; const moh_attn_config *a; long n; } rope_ctx;
static double rope_loss(void *p) {
    rope_ctx *c = p;
    memcpy(c->y, c->x, (size_t)c->n * sizeof(double));
    rope_forward_f64(c->y, c->T, c->stride, c->H, c->pos, c->a);
    return dot(c->y, c->rw, c->n);
}

/* transformers' inverse frequency of pair j, written out in double (modeling_rope_utils.py) */
static double hf_inv_freq(const moh_attn_config *a, int j) {
    const double inv = 1.0 / pow(a->rope_theta, 2.0 * j / a->head_dim);
    const moh_rope_scaling *s = &a->rope_scaling;
    if (s->type == MOH_ROPE_LINEAR) return inv / s->factor;
    if (s->type != MOH_ROPE_LLAMA3) return inv;
    const double wl = 2 * 3.14159265358979323846 / inv, old = s->original_max_position_embeddings;
    const double scaled = wl > old / s->low_freq_factor ? inv / s->factor : inv;
    if (wl < old / s->high_freq_factor || wl > old / s->low_freq_factor) return scaled;
    const double sm = (old / wl - s->low_freq_factor) / (s->high_freq_factor - s->low_freq_factor);
    return (1 - sm) * scaled / s->factor + sm * scaled;
}

/* D = 16, theta 10000: wavelengths 6.3, 19.9, 62.8, ... so with original 32 and factors 1 / 4
 * (band edges 8 and 32) pair 0 is high frequency, pair 1 in the smooth band, pairs 2+ low. */
static moh_attn_config rope_cfg(int D, moh_rope_type type) {
    moh_attn_config a;
    moh_attn_config_default(&a);
    a.head_dim = D;
    a.rope_theta = 10000.0;
    a.rope_scaling.type = type;
    a.rope_scaling.factor = type == MOH_ROPE_LINEAR ? 2.5 : 4.0;
    a.rope_scaling.low_freq_factor = 1.0;
    a.rope_scaling.high_freq_factor = 4.0;
    a.rope_scaling.original_max_position_embeddings = 32;
    return a;
}

static void test_rope(int D, moh_rope_type type) {
    const int Tn = 5, H = 3, stride = H * D + 5; /* 5 untouched values after each row's heads */
    static const int pos[5] = {0, 7, 3, 40, 1};
    const long n = (long)Tn * stride;
    const moh_attn_config a = rope_cfg(D, type);
    char op[48];
    snprintf(op, sizeof op, "rope %s head_dim=%d", attn_rope_type_name(type), D);
    rope_ctx c = {rnd(n, -1, 1), zeros(n), rnd(n, -1, 1), pos, Tn, stride, H, &a, n};
    double *g = copy(c.rw, n);
    rope_backward_f64(g, Tn, stride, H, pos, &a); /* in place: dx = R^T dy */
    report(op, "fd dx (whole buffer, gaps too)", fd_err(rope_loss, &c, c.x, n, g), TOL_FD);
    rope_loss(&c);

    /* known: pos 0 row and the gaps are untouched; pairs keep their norm; explicit HF formula */
    double err = 0.0;
    for (long i = 0; i < stride; i++) err = fmax(err, fabs(c.y[i] - c.x[i]));
    for (int t = 0; t < Tn; t++)
        for (int i = H * D; i < stride; i++) err = fmax(err, fabs(c.y[(long)t * stride + i] - c.x[(long)t * stride + i]));
    report(op, "known: pos=0 and gaps untouched", err, 0.0);
    err = 0.0;
    for (int j = 0; j < D / 2; j++) err = fmax(err, fabs(rope_inv_freq_f64(&a, j) / hf_inv_freq(&a, j) - 1));
    report(op, "known: f64 inv_freq = HF's formula", err, 1e-15);
    err = 0.0;
    for (int j = 0; j < D / 2; j++) err = fmax(err, fabs(rope_inv_freq_f32(&a, j) / hf_inv_freq(&a, j) - 1));
    report(op, "f32 inv_freq vs HF's formula", err, 2e-6);
    err = 0.0;
    for (int t = 0; t < Tn; t++)
        for (int h = 0; h < H; h++)
            for (int j = 0; j < D / 2; j++) {
                const double *x = c.x + (long)t * stride + h * D, *y = c.y + (long)t * stride + h * D;
                double ang = pos[t] * hf_inv_freq(&a, j);
                double y1 = x[j] * cos(ang) - x[j + D / 2] * sin(ang);
                double y2 = x[j + D / 2] * cos(ang) + x[j] * sin(ang);
                err = fmax(err, fmax(fabs(y[j] - y1), fabs(y[j + D / 2] - y2)));
            }
    report(op, "known: f64 = x*cos + rotate_half(x)*sin", err, 1e-14);
    double *back = copy(c.y, n);
    rope_backward_f64(back, Tn, stride, H, pos, &a);
    report(op, "backward(forward(x)) = x", test_rel_err_f64(back, c.x, n), 1e-15);

    float *y32 = f32(c.x, n), *g32 = f32(c.rw, n);
    rope_forward_f32(y32, Tn, stride, H, pos, &a);
    report(op, "f32 vs f64 forward", rel32(y32, c.y, n), TOL_F32);
    rope_backward_f32(g32, Tn, stride, H, pos, &a);
    report(op, "f32 vs f64 backward", rel32(g32, g, n), TOL_F32);
    rope_backward_f64(NULL, Tn, stride, H, pos, &a);
}

/* The three llama3 bands at D = 16 (rope_cfg): pair 0 keeps the default frequency, pair 1 lies
 * strictly between inv / factor and inv, pairs 2..7 are inv / factor; linear is inv / factor. */
static void test_rope_bands(void) {
    const moh_attn_config d = rope_cfg(16, MOH_ROPE_DEFAULT), l3 = rope_cfg(16, MOH_ROPE_LLAMA3),
                          lin = rope_cfg(16, MOH_ROPE_LINEAR);
    double err = fabs(rope_inv_freq_f64(&l3, 0) - rope_inv_freq_f64(&d, 0));
    for (int j = 2; j < 8; j++) err = fmax(err, fabs(rope_inv_freq_f64(&l3, j) - rope_inv_freq_f64(&d, j) / 4.0));
    for (int j = 0; j < 8; j++) err = fmax(err, fabs(rope_inv_freq_f64(&lin, j) - rope_inv_freq_f64(&d, j) / 2.5));
    report("rope llama3/linear", "known: bands (pair 0 kept, 2+ and linear /f)", err, 1e-18);
    const double m = rope_inv_freq_f64(&l3, 1), lo = rope_inv_freq_f64(&d, 1) / 4.0, hi = rope_inv_freq_f64(&d, 1);
    report("rope llama3", "known: pair 1 strictly inside (inv/4, inv)", m > lo * 1.01 && m < hi * 0.99 ? 0.0 : 1.0, 0.0);
}

/* ================================ large sizes: OpenMP paths =================================== */
/* Sizes above every op's OpenMP threshold (odd, so column blocks and row chunks are ragged). The f32
 * results must be bitwise identical for 1 and 3 threads, and agree with f64 (GEMM-based linear is
 * left out of the bitwise check: oneDNN's own threading is not ours to promise). */
enum { PM = 301, PC = 263, PV = 50, PH = 4, PD = 64, PSTRIDE = PH * PD + 2, NSEC = 27 };
static const char *sec_name[NSEC] = {
    "layernorm out", "layernorm mean", "layernorm rstd", "layernorm dinp", "layernorm dw",
    "layernorm db", "rmsnorm out", "rmsnorm rstd", "rmsnorm dinp", "rmsnorm dw", "gelu_erf out",
    "gelu_erf dinp", "gelu_tanh out", "gelu_tanh dinp", "silu out", "silu dinp", "swiglu out",
    "swiglu dgate", "swiglu dup", "softmax out", "softmax dinp", "cross_entropy probs",
    "cross_entropy loss", "cross_entropy dlogits", "embedding out", "embedding dtable", "rope fwd+bwd"};
static long sec_off[NSEC + 1];
static int par_tg[PM], par_ids[PM], par_pos[PM];

static void par_layout(void) {
    const long MC = (long)PM * PC;
    const long size[NSEC] = {MC, PM, PM, MC, PC, PC, MC, PM, MC, PC, MC, MC, MC, MC, MC, MC, MC, MC,
                             MC, MC, MC, MC, 1, MC, MC, (long)PV * PC, 2L * PM * PSTRIDE};
    for (int k = 0; k < NSEC; k++) sec_off[k + 1] = sec_off[k] + size[k];
    for (int m = 0; m < PM; m++) {
        par_tg[m] = m % 7 == 3 ? -1 : (m * 37) % PC;
        par_ids[m] = (m * 13) % PV;
        par_pos[m] = (m * 11) % 50;
    }
}

/* Runs every non-GEMM op once on x, x2 [PM*PC], w, b [PC] with upstream gradient g [PM*PC]. */
#define DEFINE_RUN_ALL(real, sfx)                                                                   \
    static void run_all_##sfx(real *o, const real *x, const real *x2, const real *w, const real *b, \
                              const real *g) {                                                      \
        const long *s = sec_off, n = (long)PM * PC;                                                 \
        const moh_attn_config par_rope = rope_cfg(PD, MOH_ROPE_LLAMA3);                             \
        layernorm_forward_##sfx(o + s[0], o + s[1], o + s[2], x, w, b, PM, PC, (real)1e-5);         \
        layernorm_backward_##sfx(o + s[3], o + s[4], o + s[5], g, x, w, o + s[1], o + s[2], PM, PC); \
        rmsnorm_forward_##sfx(o + s[6], o + s[7], x, w, PM, PC, (real)1e-6);                        \
        rmsnorm_backward_##sfx(o + s[8], o + s[9], g, x, w, o + s[7], PM, PC);                      \
        gelu_erf_forward_##sfx(o + s[10], x, n);                                                    \
        gelu_erf_backward_##sfx(o + s[11], g, x, n);                                                \
        gelu_tanh_forward_##sfx(o + s[12], x, n);                                                   \
        gelu_tanh_backward_##sfx(o + s[13], g, x, n);                                               \
        silu_forward_##sfx(o + s[14], x, n);                                                        \
        silu_backward_##sfx(o + s[15], g, x, n);                                                    \
        swiglu_forward_##sfx(o + s[16], x, x2, n);                                                  \
        swiglu_backward_##sfx(o + s[17], o + s[18], g, x, x2, n);                                   \
        softmax_forward_##sfx(o + s[19], x, PM, PC);                                                \
        softmax_backward_##sfx(o + s[20], g, o + s[19], PM, PC);                                    \
        o[s[22]] = cross_entropy_forward_##sfx(o + s[21], x, par_tg, PM, PC, (real)0.1);            \
        cross_entropy_backward_##sfx(o + s[23], o + s[21], par_tg, PM, PC, (real)0.1, (real)1);     \
        embedding_forward_##sfx(o + s[24], par_ids, x, PM, PC);                                     \
        embedding_backward_##sfx(o + s[25], g, par_ids, PM, PC);                                    \
        real *rf = o + s[26], *rb = rf + (long)PM * PSTRIDE;                                        \
        memcpy(rf, x, (size_t)PM * PSTRIDE * sizeof(real));                                         \
        memcpy(rb, g, (size_t)PM * PSTRIDE * sizeof(real));                                         \
        rope_forward_##sfx(rf, PM, PSTRIDE, PH, par_pos, &par_rope);                                \
        rope_backward_##sfx(rb, PM, PSTRIDE, PH, par_pos, &par_rope);                               \
    }
DEFINE_RUN_ALL(float, f32)
DEFINE_RUN_ALL(double, f64)

static void test_parallel(void) {
    par_layout();
    const long n = (long)PM * PC, tot = sec_off[NSEC];
    double *x = rnd(n, -3, 3), *x2 = rnd(n, -2, 2), *w = rnd(PC, -1.5, 1.5), *b = rnd(PC, -1, 1),
           *g = rnd(n, -1, 1), *o64 = zeros(tot);
    float *x32 = f32(x, n), *x232 = f32(x2, n), *w32 = f32(w, PC), *b32 = f32(b, PC), *g32 = f32(g, n);
    float *o1 = zeros32(tot), *o3 = zeros32(tot);
    int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    run_all_f32(o1, x32, x232, w32, b32, g32);
    omp_set_num_threads(3);
    run_all_f32(o3, x32, x232, w32, b32, g32);
    run_all_f64(o64, x, x2, w, b, g);
    omp_set_num_threads(saved);
    long diff = 0;
    for (long i = 0; i < tot; i++) diff += memcmp(&o1[i], &o3[i], sizeof(float)) != 0;
    report("large (M=301,C=263)", "f32 values differing, 1 vs 3 threads", (double)diff, 0.0);
    for (int k = 0; k < NSEC; k++) {
        char what[64];
        snprintf(what, sizeof what, "%s f32 vs f64", sec_name[k]);
        report("large (M=301,C=263)", what, rel32(o3 + sec_off[k], o64 + sec_off[k], sec_off[k + 1] - sec_off[k]),
               TOL_F32);
    }
    /* bias add in linear_forward above its threshold */
    const int LI = 3, LO = 263;
    float *lo = zeros32((long)PM * LO);
    double *lo64 = zeros((long)PM * LO);
    linear_forward_f32(lo, x32, x232, b32, PM, LI, LO); /* w [LO, LI] = head of x2 */
    linear_forward_f64(lo64, x, x2, b, PM, LI, LO);
    report("large (M=301,C=263)", "linear out f32 vs f64 (I=3)", rel32(lo, lo64, (long)PM * LO), TOL_F32);
    /* linear db (column blocks, no GEMM): bitwise across thread counts, and vs f64 */
    float *db1 = zeros32(LO), *db3 = zeros32(LO);
    double *db64 = zeros(LO);
    omp_set_num_threads(1);
    linear_backward_f32(NULL, NULL, db1, g32, x32, x232, PM, LI, LO);
    omp_set_num_threads(3);
    linear_backward_f32(NULL, NULL, db3, g32, x32, x232, PM, LI, LO);
    omp_set_num_threads(saved);
    linear_backward_f64(NULL, NULL, db64, g, x, x2, PM, LI, LO);
    report("large (M=301,C=263)", "linear db 1 vs 3 threads (differing)",
           (double)(memcmp(db1, db3, LO * sizeof(float)) != 0), 0.0);
    report("large (M=301,C=263)", "linear db f32 vs f64", rel32(db3, db64, LO), TOL_F32);
}

/* The vector exp and erf directly, in each instruction set this CPU has (the dispatched one and
 * the AVX2 code, which an AVX-512 CPU would otherwise never run): exp over [-104, 89] in steps of
 * 1/128 within 2.5e-7 relative of float64 where the result is normal, erf over [-12, 12] within
 * 2e-7 absolute and 1.5e-7 relative (below |x| 0.5: the series), specials as libm's. */
static void test_vec_fns(void) {
    const long ne = (104 + 89) * 128 + 1, nf = 24 * 128 + 1;
    float *y = malloc(sizeof(float) * (size_t)(ne > nf ? ne : nf));
    for (int isa = OPS_ISA_BEST; isa <= OPS_ISA_AVX2; isa++) {
        const char *name = isa == OPS_ISA_BEST ? "dispatched" : "avx2";
        for (long i = 0; i < ne; i++) y[i] = -104.0f + (float)i / 128.0f;
        if (!ops_vec_f32(isa, OPS_FN_EXP, y, ne)) {
            printf("  vector exp/erf (%s): not on this CPU\n", name);
            continue;
        }
        double we = 0.0, wf = 0.0;
        for (long i = 0; i < ne; i++) {
            const double x = -104.0 + (double)i / 128.0, r = exp(x);
            if (r < FLT_MIN || r > FLT_MAX) continue;
            we = fmax(we, fabs(y[i] - r) / r);
        }
        CHECK(&T, we <= 2.5e-7, "vector exp (%s) over [-104, 89]: worst rel %.3g > 2.5e-7", name, we);
        for (long i = 0; i < nf; i++) y[i] = -12.0f + (float)i / 128.0f;
        ops_vec_f32(isa, OPS_FN_ERF, y, nf);
        for (long i = 0; i < nf; i++) {
            const double x = -12.0 + (double)i / 128.0, r = erf(x), e = fabs(y[i] - r);
            wf = fmax(wf, e);
            CHECK(&T, e <= 2e-7 && (fabs(x) >= 0.5 || e <= 1.5e-7 * fabs(r)), "vector erf (%s) at %g: %.9g vs %.9g", name,
                  x, (double)y[i], r);
        }
        float sp[6] = {INFINITY, -INFINITY, NAN, 100.0f, -200.0f, 0.0f};
        ops_vec_f32(isa, OPS_FN_EXP, sp, 6);
        CHECK(&T, sp[0] == INFINITY && sp[1] == 0.0f && isnan(sp[2]) && sp[3] == INFINITY && sp[4] == 0.0f && sp[5] == 1.0f,
              "vector exp (%s) of inf, -inf, nan, 100, -200, 0: %g %g %g %g %g %g", name, (double)sp[0], (double)sp[1],
              (double)sp[2], (double)sp[3], (double)sp[4], (double)sp[5]);
        float sq[4] = {INFINITY, -INFINITY, NAN, -0.0f};
        ops_vec_f32(isa, OPS_FN_ERF, sq, 4);
        CHECK(&T, sq[0] == 1.0f && sq[1] == -1.0f && isnan(sq[2]) && sq[3] == 0.0f,
              "vector erf (%s) of inf, -inf, nan, -0: %g %g %g %g", name, (double)sq[0], (double)sq[1], (double)sq[2],
              (double)sq[3]);
        printf("  vector exp/erf (%s): exp worst rel %.2e, erf worst abs %.2e; specials as libm\n", name, we, wf);
    }
    free(y);
}

int main(void) {
    printf("  %-22s %-42s %9s\n", "op", "check", "error");
    test_gemm();
    test_linear(1);
    test_linear(0);
    test_layernorm();
    test_rmsnorm();
    test_elementwise("gelu_erf", gelu_erf_forward_f64, gelu_erf_backward_f64, gelu_erf_forward_f32,
                     gelu_erf_backward_f32, 1.0, 0.8413447460685429);
    test_elementwise("gelu_tanh", gelu_tanh_forward_f64, gelu_tanh_backward_f64, gelu_tanh_forward_f32,
                     gelu_tanh_backward_f32, 1.0, 0.8411919906082768);
    test_elementwise("silu", silu_forward_f64, silu_backward_f64, silu_forward_f32, silu_backward_f32,
                     1.0, 0.7310585786300049);
    test_swiglu();
    test_fused_variants();
    test_softmax();
    test_cross_entropy(0.0);
    test_cross_entropy(0.1);
    test_embedding();
    test_rope(6, MOH_ROPE_DEFAULT);
    test_rope(8, MOH_ROPE_DEFAULT);
    test_rope(16, MOH_ROPE_LINEAR);
    test_rope(16, MOH_ROPE_LLAMA3);
    test_rope_bands();
    test_parallel();
    test_vec_fns();
    free_all();
    return test_finish("test_ops", &T);
}
