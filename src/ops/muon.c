#include "ops/muon.h"

#include <math.h>
#include <string.h>

#include "ops/gemm.h"

/* C[M,N] = op(A) op(B) (beta 0): bf16 inputs with fp32 accumulation when c, else fp32. */
static void mm(bf16_ctx *c, bool ta, bool tb, int M, int N, int K, const float *A, int lda, const float *B, int ldb,
               float *C, int ldc) {
    if (c) bf16_gemm(c, ta, tb, M, N, K, A, lda, B, ldb, 0.0f, C, ldc);
    else gemm_f32(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C, ldc);
}

size_t muon_work_floats(int rows, int cols) {
    const size_t m = (size_t)(rows < cols ? rows : cols);
    return 2 * (size_t)rows * (size_t)cols + 2 * m * m;
}

void muon_orthogonalise(bf16_ctx *bc, float *x, int rows, int cols, int steps, float *work) {
    const float a = 3.4445f, b = -4.7750f, c = 2.0315f;
    const size_t n = (size_t)rows * (size_t)cols;
    const int m = rows < cols ? rows : cols;
    float *y = work, *A = y + n, *B = A + (size_t)m * m;
    double ss = 0.0;
    for (size_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
    const float s = (float)(1.0 / (sqrt(ss) + 1e-7));
    for (size_t i = 0; i < n; i++) x[i] *= s;
    const bool wide = rows <= cols; /* A = x x^T [rows, rows], else x^T x [cols, cols] */
    for (int it = 0; it < steps; it++) {
        if (wide) mm(bc, false, true, m, m, cols, x, cols, x, cols, A, m);
        else mm(bc, true, false, m, m, rows, x, cols, x, cols, A, m);
        mm(bc, false, false, m, m, m, A, m, A, m, B, m);
        for (size_t i = 0; i < (size_t)m * m; i++) B[i] = b * A[i] + c * B[i];
        if (wide) mm(bc, false, false, rows, cols, rows, B, m, x, cols, y, cols);
        else mm(bc, false, false, rows, cols, cols, x, cols, B, m, y, cols);
        for (size_t i = 0; i < n; i++) x[i] = a * x[i] + y[i];
    }
}

void muon_step(const muon_config *c, bf16_ctx *bc, float *w, const float *g, float *buf, int rows, int cols,
               double lr, float *work) {
    const size_t n = (size_t)rows * (size_t)cols;
    const float mu = (float)c->momentum;
    float *u = work, *ws = work + n;
    for (size_t i = 0; i < n; i++) {
        buf[i] = mu * buf[i] + g[i];
        u[i] = g[i] + mu * buf[i];
    }
    muon_orthogonalise(bc, u, rows, cols, c->ns_steps, ws);
    const float k = (float)(lr * 0.2 * sqrt((double)(rows > cols ? rows : cols)));
    const float shrink = (float)(1.0 - lr * c->weight_decay);
    for (size_t i = 0; i < n; i++) w[i] = shrink * w[i] - k * u[i];
}
