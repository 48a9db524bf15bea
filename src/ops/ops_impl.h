/* Template of the op definitions (prototypes and comments: ops_decl.h). Included twice by ops.c with
 * real = float / F(x) = x##_f32 and real = double / F(x) = x##_f64. No include guard on purpose.
 *
 * Parallelism: OpenMP over rows (or elements / column blocks) only where every output element is
 * written by one thread in a fixed order, so results never depend on the thread count. Sums over
 * rows (dw, db, loss) run in a fixed order: serially per column, or via GEMM. OPS_SERIAL: forward ops
 * that decoding calls on one token skip OpenMP entirely below their threshold, since an if(0) region
 * still sets up a one-thread team in libgomp (0.24-0.34 us: tools/bench/micro.sh; several per layer). */

#ifndef MOH_OPS_IMPL_CONSTANTS
#define MOH_OPS_IMPL_CONSTANTS
/* Inverse RoPE frequencies tabulated per call (the rest are computed per use). */
#define MOH_ROPE_INV_CACHE 512
/* Elements per task of the elementwise ops that run in blocks (their exp on a block at a time). */
#define MOH_OPS_EW_BLOCK 4096
/* Columns per block when dw/db are summed over rows in parallel column blocks. */
#define MOH_OPS_COLBLOCK 64
/* Cross-entropy rows are split into this many fixed chunks; partial losses (in double) are summed
 * in chunk order, so the result does not depend on the thread count. */
#define MOH_CE_CHUNKS 64
/* sqrt(2/pi) and the cubic coefficient of GELU's tanh approximation. */
#define MOH_GELU_K0 0.79788456080286535588
#define MOH_GELU_K1 0.044715
#endif

/* Math in `real` precision: expf/exp etc. chosen at compile time. */
static inline real F(r_exp)(real x) { return sizeof(real) == sizeof(float) ? (real)expf((float)x) : (real)exp((double)x); }
static inline real F(r_log)(real x) { return sizeof(real) == sizeof(float) ? (real)logf((float)x) : (real)log((double)x); }
static inline real F(r_sqrt)(real x) { return sizeof(real) == sizeof(float) ? (real)sqrtf((float)x) : (real)sqrt((double)x); }
static inline real F(r_erf)(real x) { return sizeof(real) == sizeof(float) ? (real)erff((float)x) : (real)erf((double)x); }
static inline real F(r_cos)(real x) { return sizeof(real) == sizeof(float) ? (real)cosf((float)x) : (real)cos((double)x); }
static inline real F(r_sin)(real x) { return sizeof(real) == sizeof(float) ? (real)sinf((float)x) : (real)sin((double)x); }
static inline real F(r_pow)(real x, real y) { return sizeof(real) == sizeof(float) ? (real)powf((float)x, (float)y) : (real)pow((double)x, (double)y); }

/* ---------------------------------------------------------------------------------------------- */

real *F(views_alloc)(real **const *fields, const size_t *sizes, size_t n, size_t *total) {
    *total = 0;
    for (size_t i = 0; i < n; i++) *total += sizes[i];
    real *block = malloc((*total ? *total : 1) * sizeof(real)), *cur = block;
    for (size_t i = 0; block && i < n; i++) {
        *fields[i] = cur;
        cur += sizes[i];
    }
    return block;
}

void F(linear_forward)(real *out, const real *inp, const real *w, const real *b, int M, int I, int O) {
    F(gemm)(false, true, M, O, I, (real)1, inp, I, w, I, (real)0, out, O);
    if (!b) return;
#pragma omp parallel for if ((long)M * O >= 65536) schedule(static)
    for (int m = 0; m < M; m++) {
        real *o = out + (long)m * O;
        for (int j = 0; j < O; j++) o[j] += b[j];
    }
}

void F(linear_backward)(real *dinp, real *dw, real *db, const real *dout, const real *inp,
                        const real *w, int M, int I, int O) {
    if (dinp) F(gemm)(false, false, M, I, O, (real)1, dout, O, w, I, (real)1, dinp, I);
    if (dw) F(gemm)(true, false, O, I, M, (real)1, dout, O, inp, I, (real)1, dw, I);
    if (db) { /* each column summed over rows 0..M-1 in order, blocks of columns in parallel */
        int nb = (O + MOH_OPS_COLBLOCK - 1) / MOH_OPS_COLBLOCK;
#pragma omp parallel for if ((long)M * O >= 65536) schedule(static)
        for (int blk = 0; blk < nb; blk++) {
            int j0 = blk * MOH_OPS_COLBLOCK, j1 = j0 + MOH_OPS_COLBLOCK < O ? j0 + MOH_OPS_COLBLOCK : O;
            for (int m = 0; m < M; m++) {
                const real *g = dout + (long)m * O;
                for (int j = j0; j < j1; j++) db[j] += g[j];
            }
        }
    }
}

/* ---------------------------------------------------------------------------------------------- */

void F(layernorm_forward)(real *out, real *mean, real *rstd, const real *inp, const real *w,
                          const real *b, int M, int C, real eps) {
#pragma omp parallel for if ((long)M * C >= 32768) schedule(static)
    for (int m = 0; m < M; m++) {
        const real *x = inp + (long)m * C;
        real *o = out + (long)m * C;
        real s = 0;
        for (int c = 0; c < C; c++) s += x[c];
        real mu = s / (real)C;
        real v = 0;
        for (int c = 0; c < C; c++) v += (x[c] - mu) * (x[c] - mu);
        v /= (real)C; /* biased variance, as PyTorch */
        real r = (real)1 / F(r_sqrt)(v + eps);
        if (w)
            for (int c = 0; c < C; c++) o[c] = (x[c] - mu) * r * w[c] + b[c];
        else
            for (int c = 0; c < C; c++) o[c] = (x[c] - mu) * r;
        mean[m] = mu;
        rstd[m] = r;
    }
}

void F(layernorm_backward)(real *dinp, real *dw, real *db, const real *dout, const real *inp,
                           const real *w, const real *mean, const real *rstd, int M, int C) {
    if (dinp) {
#pragma omp parallel for if ((long)M * C >= 32768) schedule(static)
        for (int m = 0; m < M; m++) {
            const real *x = inp + (long)m * C, *g = dout + (long)m * C;
            real mu = mean[m], r = rstd[m];
            real sg = 0, sgn = 0; /* sums of dnorm and dnorm * norm */
            for (int c = 0; c < C; c++) {
                real dn = w ? g[c] * w[c] : g[c];
                sg += dn;
                sgn += dn * (x[c] - mu) * r;
            }
            sg /= (real)C;
            sgn /= (real)C;
            real *d = dinp + (long)m * C;
            for (int c = 0; c < C; c++) {
                real n = (x[c] - mu) * r;
                d[c] += ((w ? g[c] * w[c] : g[c]) - sg - n * sgn) * r;
            }
        }
    }
    if (dw || db) { /* each column summed over rows 0..M-1 in order, blocks of columns in parallel */
        int nb = (C + MOH_OPS_COLBLOCK - 1) / MOH_OPS_COLBLOCK;
#pragma omp parallel for if ((long)M * C >= 32768) schedule(static)
        for (int blk = 0; blk < nb; blk++) {
            int c0 = blk * MOH_OPS_COLBLOCK, c1 = c0 + MOH_OPS_COLBLOCK < C ? c0 + MOH_OPS_COLBLOCK : C;
            for (int m = 0; m < M; m++) {
                const real *x = inp + (long)m * C, *g = dout + (long)m * C;
                real mu = mean[m], r = rstd[m];
                for (int c = c0; c < c1; c++) {
                    if (dw) dw[c] += g[c] * (x[c] - mu) * r;
                    if (db) db[c] += g[c];
                }
            }
        }
    }
}

/* ---- adaLN (DiT) ------------------------------------------------------------------------------ */

void F(modulate_forward)(real *out, const real *x, const real *shift, const real *scale, int ld, int B,
                             int N, int D) {
#pragma omp parallel for if ((long)B * N * D >= 65536) schedule(static)
    for (int b = 0; b < B; b++) {
        const real *sh = shift + (size_t)b * ld, *sc = scale + (size_t)b * ld;
        for (int n = 0; n < N; n++) {
            const real *xr = x + ((size_t)b * N + n) * D;
            real *o = out + ((size_t)b * N + n) * D;
            for (int c = 0; c < D; c++) o[c] = xr[c] * (1 + sc[c]) + sh[c];
        }
    }
}

void F(modulate_backward)(real *dx, real *dshift, real *dscale, const real *dout, const real *x,
                              const real *scale, int ld, int B, int N, int D) {
#pragma omp parallel for if ((long)B * N * D >= 65536) schedule(static)
    for (int b = 0; b < B; b++) {
        const real *sc = scale + (size_t)b * ld;
        real *dsh = dshift + (size_t)b * ld, *dsc = dscale + (size_t)b * ld;
        for (int n = 0; n < N; n++) { /* rows summed in order: deterministic */
            const real *g = dout + ((size_t)b * N + n) * D, *xr = x + ((size_t)b * N + n) * D;
            for (int c = 0; c < D; c++) {
                dsh[c] += g[c];
                dsc[c] += g[c] * xr[c];
            }
            if (dx) {
                real *d = dx + ((size_t)b * N + n) * D;
                for (int c = 0; c < D; c++) d[c] += g[c] * (1 + sc[c]);
            }
        }
    }
}

void F(gated_add_forward)(real *x, const real *gate, const real *y, int ld, int B, int N, int D) {
    for (int b = 0; b < B; b++)
        for (int n = 0; n < N; n++) {
            real *xr = x + ((size_t)b * N + n) * D;
            const real *yr = y + ((size_t)b * N + n) * D, *gr = gate + (size_t)b * ld;
            for (int c = 0; c < D; c++) xr[c] += gr[c] * yr[c];
        }
}

void F(gated_add_backward)(real *dy, real *dgate, const real *g, const real *gate, const real *y, int ld, int B,
                           int N, int D) {
    for (int b = 0; b < B; b++)
        for (int n = 0; n < N; n++) {
            const real *gr = g + ((size_t)b * N + n) * D, *yr = y + ((size_t)b * N + n) * D;
            const real *gt = gate + (size_t)b * ld;
            real *dg = dgate + (size_t)b * ld, *d = dy + ((size_t)b * N + n) * D;
            for (int c = 0; c < D; c++) {
                dg[c] += gr[c] * yr[c];
                d[c] = gr[c] * gt[c];
            }
        }
}

/* ---------------------------------------------------------------------------------------------- */

/* One RMSNorm row: o[C] = w * (x * r), r = 1 / sqrt(mean(x^2) + eps); returns r. */
static inline real F(rmsnorm_row)(real *o, const real *x, const real *w, int C, real eps) {
    real s = 0;
    for (int c = 0; c < C; c++) s += x[c] * x[c];
    real r = (real)1 / F(r_sqrt)(s / (real)C + eps);
    for (int c = 0; c < C; c++) o[c] = w[c] * (x[c] * r); /* HF: weight * (x * rsqrt) */
    return r;
}

void F(rmsnorm_forward)(real *out, real *rstd, const real *inp, const real *w, int M, int C, real eps) {
    if ((long)M * C < 32768) { /* below the team's worth: no OpenMP call at all (OPS_SERIAL) */
        for (int m = 0; m < M; m++) rstd[m] = F(rmsnorm_row)(out + (long)m * C, inp + (long)m * C, w, C, eps);
        return;
    }
#pragma omp parallel for schedule(static)
    for (int m = 0; m < M; m++) rstd[m] = F(rmsnorm_row)(out + (long)m * C, inp + (long)m * C, w, C, eps);
}

void F(add_rmsnorm_forward)(real *sum, real *out, real *rstd, const real *a, const real *b, const real *w,
                            int M, int C, real eps) {
#pragma omp parallel for if ((long)M * C >= 32768) schedule(static)
    for (int m = 0; m < M; m++) {
        const real *x = a + (long)m * C, *y = b + (long)m * C;
        real *sr = sum + (long)m * C;
        for (int c = 0; c < C; c++) sr[c] = x[c] + y[c];
        rstd[m] = F(rmsnorm_row)(out + (long)m * C, sr, w, C, eps);
    }
}

void F(rmsnorm_backward)(real *dinp, real *dw, const real *dout, const real *inp, const real *w,
                         const real *rstd, int M, int C) {
    if (dinp) {
        /* y = w * x * r, r = (mean(x^2) + eps)^-1/2: dx = r * (g*w - x * r^2 * mean(g*w*x)) */
#pragma omp parallel for if ((long)M * C >= 32768) schedule(static)
        for (int m = 0; m < M; m++) {
            const real *x = inp + (long)m * C, *g = dout + (long)m * C;
            real r = rstd[m];
            real s = 0;
            for (int c = 0; c < C; c++) s += g[c] * w[c] * x[c];
            real k = s / (real)C * r * r;
            real *d = dinp + (long)m * C;
            for (int c = 0; c < C; c++) d[c] += r * (g[c] * w[c] - x[c] * k);
        }
    }
    if (dw) {
        int nb = (C + MOH_OPS_COLBLOCK - 1) / MOH_OPS_COLBLOCK;
#pragma omp parallel for if ((long)M * C >= 32768) schedule(static)
        for (int blk = 0; blk < nb; blk++) {
            int c0 = blk * MOH_OPS_COLBLOCK, c1 = c0 + MOH_OPS_COLBLOCK < C ? c0 + MOH_OPS_COLBLOCK : C;
            for (int m = 0; m < M; m++) {
                const real *x = inp + (long)m * C, *g = dout + (long)m * C;
                real r = rstd[m];
                for (int c = c0; c < c1; c++) dw[c] += g[c] * (x[c] * r);
            }
        }
    }
}

/* ---------------------------------------------------------------------------------------------- */

/* y[n] = e^y[n] in place: OPS_VEC_EXP's vector exp where the CPU has it (the float instantiation
 * on AVX-512, ops.c: within 2.2e-7 of float64), else libm's, one at a time. */
static inline void F(exp_block)(real *y, long n) {
    if (!OPS_VEC_EXP(y, n))
        for (long i = 0; i < n; i++) y[i] = F(r_exp)(y[i]);
}

/* y[n] = erf(y[n]) in place: OPS_VEC_ERF's vector erf where the CPU has it, else libm's. */
static inline void F(erf_block)(real *y, long n) {
    if (!OPS_VEC_ERF(y, n))
        for (long i = 0; i < n; i++) y[i] = F(r_erf)(y[i]);
}

/* The arrays of a blocked elementwise op (which of them it uses is the op's). */
typedef struct F(ew_args) {
    real *out, *out2;
    const real *a, *b, *c;
} F(ew_args);

/* range(x, i0, i1) over blocks of at most MOH_OPS_EW_BLOCK elements of [0, n): on the team from
 * 65536 elements, else on this thread with no OpenMP call (OPS_SERIAL). */
static void F(ew_blocks)(void (*range)(const F(ew_args) *, long, long), const F(ew_args) *arg, long n) {
    const long nb = (n + MOH_OPS_EW_BLOCK - 1) / MOH_OPS_EW_BLOCK;
    if (n < 65536) {
        for (long b = 0; b < nb; b++) range(arg, b * MOH_OPS_EW_BLOCK, b + 1 < nb ? (b + 1) * MOH_OPS_EW_BLOCK : n);
        return;
    }
#pragma omp parallel for schedule(static)
    for (long b = 0; b < nb; b++) range(arg, b * MOH_OPS_EW_BLOCK, b + 1 < nb ? (b + 1) * MOH_OPS_EW_BLOCK : n);
}

/* c[n] = 1 + erf(x / sqrt 2) of x = inp[0..n) (n <= MOH_OPS_EW_BLOCK): twice the normal cdf. */
static inline void F(gelu_erf_cdf2)(real *c, const real *inp, long n) {
#pragma omp simd
    for (long i = 0; i < n; i++) c[i] = inp[i] * (real)0.70710678118654752440;
    F(erf_block)(c, n);
#pragma omp simd
    for (long i = 0; i < n; i++) c[i] = (real)1 + c[i];
}

/* out = x.a * cdf(x.a) */
static void F(gelu_erf_range)(const F(ew_args) *arg, long i0, long i1) {
    real c[MOH_OPS_EW_BLOCK];
    real *out = arg->out;
    const real *inp = arg->a;
    const long n = i1 - i0;
    F(gelu_erf_cdf2)(c, inp + i0, n);
#pragma omp simd
    for (long i = 0; i < n; i++) out[i0 + i] = inp[i0 + i] * (real)0.5 * c[i];
}

void F(gelu_erf_forward)(real *out, const real *inp, long n) {
    const F(ew_args) arg = {.out = out, .a = inp};
    F(ew_blocks)(F(gelu_erf_range), &arg, n);
}

/* out (dinp) += a (dout) * gelu'(b (inp)) */
static void F(gelu_erf_backward_range)(const F(ew_args) *arg, long i0, long i1) {
    real e[MOH_OPS_EW_BLOCK], c[MOH_OPS_EW_BLOCK];
    real *dinp = arg->out;
    const real *dout = arg->a, *inp = arg->b;
    const long n = i1 - i0;
#pragma omp simd
    for (long i = 0; i < n; i++) e[i] = (real)-0.5 * inp[i0 + i] * inp[i0 + i];
    F(exp_block)(e, n);
    F(gelu_erf_cdf2)(c, inp + i0, n);
#pragma omp simd
    for (long i = 0; i < n; i++) {
        const real x = inp[i0 + i];
        const real cdf = (real)0.5 * c[i];
        const real pdf = e[i] * (real)0.39894228040143267794; /* exp(-x^2 / 2) / sqrt(2 pi) */
        dinp[i0 + i] += dout[i0 + i] * (cdf + x * pdf);
    }
}

void F(gelu_erf_backward)(real *dinp, const real *dout, const real *inp, long n) {
    if (!dinp) return;
    const F(ew_args) arg = {.out = dinp, .a = dout, .b = inp};
    F(ew_blocks)(F(gelu_erf_backward_range), &arg, n);
}

/* GELU-tanh: 0.5 x (1 + tanh(u)) computed as x sigmoid(2u), the same function through exp instead
 * of libm's tanh (which goes through expm1 and took 60% of a DiT forward).
 * e[n] = exp(-2 u(x)), u(x) = K0 (x + K1 x^3), of x = inp[0..n) (n <= MOH_OPS_EW_BLOCK). */
static inline void F(gelu_tanh_exp)(real *e, const real *inp, long n) {
#pragma omp simd
    for (long i = 0; i < n; i++) {
        const real x = inp[i], u = (real)MOH_GELU_K0 * (x + (real)MOH_GELU_K1 * x * x * x);
        e[i] = (real)-2 * u;
    }
    F(exp_block)(e, n);
}

/* out = gelu_tanh(a) */
static void F(gelu_tanh_range)(const F(ew_args) *arg, long i0, long i1) {
    real e[MOH_OPS_EW_BLOCK];
    real *out = arg->out;
    const real *inp = arg->a;
    const long n = i1 - i0;
    F(gelu_tanh_exp)(e, inp + i0, n);
#pragma omp simd
    for (long i = 0; i < n; i++) out[i0 + i] = inp[i0 + i] / ((real)1 + e[i]);
}

void F(gelu_tanh_forward)(real *out, const real *inp, long n) {
    const F(ew_args) arg = {.out = out, .a = inp};
    F(ew_blocks)(F(gelu_tanh_range), &arg, n);
}

/* out (dinp) += a (dout) d/dx [x s(2u)] at b (inp): s + 2 x s (1 - s) u', s = sigmoid(2u) (= (1 +
 * tanh u) / 2). */
static void F(gelu_tanh_backward_range)(const F(ew_args) *arg, long i0, long i1) {
    real e[MOH_OPS_EW_BLOCK];
    real *dinp = arg->out;
    const real *dout = arg->a, *inp = arg->b;
    const long n = i1 - i0;
    F(gelu_tanh_exp)(e, inp + i0, n);
#pragma omp simd
    for (long i = 0; i < n; i++) {
        const real x = inp[i0 + i], sg = (real)1 / ((real)1 + e[i]);
        const real du = (real)MOH_GELU_K0 * ((real)1 + (real)(3 * MOH_GELU_K1) * x * x);
        dinp[i0 + i] += dout[i0 + i] * (sg + (real)2 * x * sg * ((real)1 - sg) * du);
    }
}

void F(gelu_tanh_backward)(real *dinp, const real *dout, const real *inp, long n) {
    if (!dinp) return;
    const F(ew_args) arg = {.out = dinp, .a = dout, .b = inp};
    F(ew_blocks)(F(gelu_tanh_backward_range), &arg, n);
}

/* ---------------------------------------------------------------------------------------------- */

static inline real F(r_sigmoid)(real x) { return (real)1 / ((real)1 + F(r_exp)(-x)); }

void F(silu_forward)(real *out, const real *inp, long n) {
#pragma omp parallel for if (n >= 65536) schedule(static)
    for (long i = 0; i < n; i++) out[i] = inp[i] / ((real)1 + F(r_exp)(-inp[i])); /* as torch */
}

void F(silu_backward)(real *dinp, const real *dout, const real *inp, long n) {
    if (!dinp) return;
#pragma omp parallel for if (n >= 65536) schedule(static)
    for (long i = 0; i < n; i++) {
        real x = inp[i], s = F(r_sigmoid)(x);
        dinp[i] += dout[i] * s * ((real)1 + x * ((real)1 - s));
    }
}

/* out = silu(a (gate)) b (up), out2 (sig, may be NULL) = sigmoid(gate) */
static void F(swiglu_range)(const F(ew_args) *arg, long i0, long i1) {
    real e[MOH_OPS_EW_BLOCK];
    real *out = arg->out, *sig = arg->out2;
    const real *gate = arg->a, *up = arg->b;
    const long n = i1 - i0;
#pragma omp simd
    for (long i = 0; i < n; i++) e[i] = -gate[i0 + i];
    F(exp_block)(e, n);
#pragma omp simd
    for (long i = 0; i < n; i++) {
        const real den = (real)1 + e[i];
        out[i0 + i] = gate[i0 + i] / den * up[i0 + i]; /* torch: silu(g) * u = g / (1 + exp(-g)) * u */
        if (sig) sig[i0 + i] = (real)1 / den;         /* sigmoid(g), for the backward */
    }
}

void F(swiglu_forward)(real *out, const real *gate, const real *up, long n) {
    const F(ew_args) arg = {.out = out, .a = gate, .b = up};
    F(ew_blocks)(F(swiglu_range), &arg, n);
}

void F(swiglu_forward_sig)(real *out, real *sig, const real *gate, const real *up, long n) {
    const F(ew_args) arg = {.out = out, .out2 = sig, .a = gate, .b = up};
    F(ew_blocks)(F(swiglu_range), &arg, n);
}

/* d(silu(x) u) / dx and / du, times g; s = sigmoid(x). */
static inline void F(swiglu_grad)(real *dx, real *du, real g, real x, real s, real u) {
    *dx = g * u * s * ((real)1 + x * ((real)1 - s));
    *du = g * x * s;
}

/* out (dgate) and out2 (dup), each may be NULL, += swiglu's gradients from a (dout) at b (gate), c
 * (up); the sigmoid as swiglu_forward_sig computes it. */
static void F(swiglu_backward_range)(const F(ew_args) *arg, long i0, long i1) {
    real sig[MOH_OPS_EW_BLOCK];
    real *dgate = arg->out, *dup = arg->out2;
    const real *dout = arg->a, *gate = arg->b, *up = arg->c;
    const long n = i1 - i0;
#pragma omp simd
    for (long i = 0; i < n; i++) sig[i] = -gate[i0 + i];
    F(exp_block)(sig, n);
#pragma omp simd
    for (long i = 0; i < n; i++) sig[i] = (real)1 / ((real)1 + sig[i]); /* as swiglu_forward_sig */
    for (long i = 0; i < n; i++) {
        real dx, du;
        F(swiglu_grad)(&dx, &du, dout[i0 + i], gate[i0 + i], sig[i], up[i0 + i]);
        if (dgate) dgate[i0 + i] += dx;
        if (dup) dup[i0 + i] += du;
    }
}

void F(swiglu_backward)(real *dgate, real *dup, const real *dout, const real *gate, const real *up, long n) {
    const F(ew_args) arg = {.out = dgate, .out2 = dup, .a = dout, .b = gate, .c = up};
    F(ew_blocks)(F(swiglu_backward_range), &arg, n);
}

void F(swiglu_backward_set)(real *dgate, real *dup, const real *dout, const real *gate, const real *sig,
                            const real *up, long n) {
#pragma omp parallel for if (n >= 65536) schedule(static)
    for (long i = 0; i < n; i++) F(swiglu_grad)(&dgate[i], &dup[i], dout[i], gate[i], sig[i], up[i]);
}

/* ---------------------------------------------------------------------------------------------- */

/* One softmax row: o[N] = softmax(x[N]) (o may be x). */
static inline void F(softmax_row)(real *o, const real *x, int N) {
    real mx = x[0];
    for (int j = 1; j < N; j++) mx = x[j] > mx ? x[j] : mx;
    for (int j = 0; j < N; j++) o[j] = x[j] - mx;
    F(exp_block)(o, N);
    real s = 0;
    for (int j = 0; j < N; j++) s += o[j];
    real inv = (real)1 / s;
    for (int j = 0; j < N; j++) o[j] *= inv;
}

void F(softmax_forward)(real *out, const real *inp, int M, int N) {
    if ((long)M * N < 32768) { /* OPS_SERIAL */
        for (int m = 0; m < M; m++) F(softmax_row)(out + (long)m * N, inp + (long)m * N, N);
        return;
    }
#pragma omp parallel for schedule(static)
    for (int m = 0; m < M; m++) F(softmax_row)(out + (long)m * N, inp + (long)m * N, N);
}

void F(softmax_backward)(real *dinp, const real *dout, const real *out, int M, int N) {
    if (!dinp) return;
#pragma omp parallel for if ((long)M * N >= 32768) schedule(static)
    for (int m = 0; m < M; m++) {
        const real *g = dout + (long)m * N, *y = out + (long)m * N;
        real s = 0;
        for (int j = 0; j < N; j++) s += g[j] * y[j];
        real *d = dinp + (long)m * N;
        for (int j = 0; j < N; j++) d[j] += y[j] * (g[j] - s);
    }
}

/* ---------------------------------------------------------------------------------------------- */

real F(cross_entropy_forward)(real *probs, const real *logits, const int *targets, int M, int V,
                              real label_smoothing) {
    double part[MOH_CE_CHUNKS] = {0};
    int cnt[MOH_CE_CHUNKS] = {0};
    real eps = label_smoothing;
#pragma omp parallel for if ((long)M * V >= 32768) schedule(static)
    for (int k = 0; k < MOH_CE_CHUNKS; k++) {
        int m0 = (int)((long)M * k / MOH_CE_CHUNKS), m1 = (int)((long)M * (k + 1) / MOH_CE_CHUNKS);
        for (int m = m0; m < m1; m++) {
            const real *x = logits + (long)m * V;
            real *p = probs + (long)m * V;
            real mx = x[0];
            for (int v = 1; v < V; v++) mx = x[v] > mx ? x[v] : mx;
            real s = 0, sx = 0;
            for (int v = 0; v < V; v++) {
                p[v] = F(r_exp)(x[v] - mx);
                s += p[v];
                sx += x[v];
            }
            real inv = (real)1 / s;
            for (int v = 0; v < V; v++) p[v] *= inv;
            int t = targets[m];
            if (t < 0) continue;
            real lse = mx + F(r_log)(s);
            real nll = lse - x[t];
            real smooth = lse - sx / (real)V; /* mean_v(-log p_v) */
            part[k] += (double)(((real)1 - eps) * nll + eps * smooth);
            cnt[k]++;
        }
    }
    double tot = 0.0;
    long n = 0;
    for (int k = 0; k < MOH_CE_CHUNKS; k++) {
        tot += part[k];
        n += cnt[k];
    }
    return n ? (real)(tot / (double)n) : (real)0;
}

void F(cross_entropy_backward)(real *dlogits, const real *probs, const int *targets, int M, int V,
                               real label_smoothing, real dloss) {
    if (!dlogits) return;
    long n = 0;
    for (int m = 0; m < M; m++) n += targets[m] >= 0;
    if (!n) return;
    real scale = dloss / (real)n, eps = label_smoothing, uni = label_smoothing / (real)V;
#pragma omp parallel for if ((long)M * V >= 32768) schedule(static)
    for (int m = 0; m < M; m++) {
        int t = targets[m];
        if (t < 0) continue;
        const real *p = probs + (long)m * V;
        real *d = dlogits + (long)m * V;
        for (int v = 0; v < V; v++) d[v] += scale * (p[v] - uni - (v == t ? (real)1 - eps : (real)0));
    }
}

/* ---------------------------------------------------------------------------------------------- */

void F(embedding_forward)(real *out, const int *ids, const real *table, int M, int C) {
    if ((long)M * C < 65536) { /* OPS_SERIAL */
        for (int m = 0; m < M; m++) memcpy(out + (long)m * C, table + (long)ids[m] * C, sizeof(real) * C);
        return;
    }
#pragma omp parallel for schedule(static)
    for (int m = 0; m < M; m++) {
        const real *row = table + (long)ids[m] * C;
        real *o = out + (long)m * C;
        for (int c = 0; c < C; c++) o[c] = row[c];
    }
}

void F(embedding_backward)(real *dtable, const real *dout, const int *ids, int M, int C) {
    if (!dtable) return;
    /* serial over rows: repeated ids accumulate in a fixed order */
    for (int m = 0; m < M; m++) {
        real *d = dtable + (long)ids[m] * C;
        const real *g = dout + (long)m * C;
        for (int c = 0; c < C; c++) d[c] += g[c];
    }
}

/* ---------------------------------------------------------------------------------------------- */

/* HF's inverse frequencies (modeling_rope_utils.py), each operation in `real` as torch does in
 * float32: inv = 1 / theta ** (2j / d); wavelength = reciprocal(inv) * 2 pi; the Python scalars
 * (factor, the band edges) rounded to `real` as torch rounds them. */
real F(rope_inv_freq)(const moh_attn_config *a, int j) {
    const real e = (real)(2 * j) / (real)a->head_dim;
    const real inv = (real)1 / F(r_pow)((real)a->rope_theta, e);
    const moh_rope_scaling *s = &a->rope_scaling;
    if (s->type == MOH_ROPE_LINEAR) return inv / (real)s->factor;
    if (s->type != MOH_ROPE_LLAMA3) return inv;
    const double old = s->original_max_position_embeddings;
    const real factor = (real)s->factor, wavelen = ((real)1 / inv) * (real)6.283185307179586;
    if (wavelen > (real)(old / s->low_freq_factor)) return inv / factor;  /* low frequency */
    if (wavelen < (real)(old / s->high_freq_factor)) return inv;          /* high frequency */
    const real smooth = (((real)1 / wavelen) * (real)old - (real)s->low_freq_factor) /
                        (real)(s->high_freq_factor - s->low_freq_factor);
    return ((real)1 - smooth) * inv / factor + smooth * inv;
}

/* One row's n_heads heads (head_dim each) rotated by position p: inv[j] the inverse frequency j
 * for j < INV_CACHE (rope_apply's table), the rest computed. */
static inline void F(rope_row)(real *row, real p, int half, int n_heads, const real *inv, const moh_attn_config *a,
                               int sign) {
    for (int j = 0; j < half; j++) {
        real ang = p * (j < MOH_ROPE_INV_CACHE ? inv[j] : F(rope_inv_freq)(a, j));
        real c = F(r_cos)(ang), s = F(r_sin)(ang);
        if (sign < 0) s = -s;
        for (int h = 0; h < n_heads; h++) {
            real *q = row + (long)h * a->head_dim;
            real x1 = q[j], x2 = q[j + half];
            /* q*cos + rotate_half(q)*sin, rotate_half(q) = cat(-x2, x1) */
            q[j] = x1 * c + (-x2) * s;
            q[j + half] = x2 * c + x1 * s;
        }
    }
}

/* sign = +1: forward rotation; -1: its inverse (transpose). */
static void F(rope_apply)(real *x, int T, int row_stride, int n_heads, const int *pos,
                          const moh_attn_config *a, int sign) {
    const int half = a->head_dim / 2;
    real inv[MOH_ROPE_INV_CACHE];
    for (int j = 0; j < half && j < MOH_ROPE_INV_CACHE; j++) inv[j] = F(rope_inv_freq)(a, j);
    if ((long)T * n_heads * a->head_dim < 32768) { /* OPS_SERIAL */
        for (int t = 0; t < T; t++) F(rope_row)(x + (long)t * row_stride, (real)pos[t], half, n_heads, inv, a, sign);
        return;
    }
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++) F(rope_row)(x + (long)t * row_stride, (real)pos[t], half, n_heads, inv, a, sign);
}

void F(rope_forward)(real *x, int T, int row_stride, int n_heads, const int *pos,
                     const moh_attn_config *a) {
    F(rope_apply)(x, T, row_stride, n_heads, pos, a, 1);
}

void F(rope_backward)(real *dx, int T, int row_stride, int n_heads, const int *pos,
                      const moh_attn_config *a) {
    if (!dx) return;
    F(rope_apply)(dx, T, row_stride, n_heads, pos, a, -1);
}
