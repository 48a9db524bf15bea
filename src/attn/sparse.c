/* Head-sparse MoH attention, float32 (spec §1, §10): see sparse.h for what is computed.
 *
 * Layout of the work:
 *  - selected pairs are listed per (batch row b, head i) in token order (pair_off / pair_pos);
 *    every per-pair tensor (q, o, og, lse, dQ, dO) is [P, d] in that order, so the rows of one head
 *    are contiguous and a query tile is a slice;
 *  - products run on one register-tile kernel family, C[R x n] (+)= A[R x K] B[K x n] with R <= 6,
 *    n <= 64, where A rows, B rows and C rows are given by pointer arrays: gathers and scatters
 *    cost nothing, and the same kernel serves projections, QK^T, PV and every gradient;
 *  - parallel loops hand out tasks that each own their output rows; sums over tokens run inside
 *    one task in a fixed order. Nothing depends on the thread count.
 * Tile sizes: SPARSE_BK keys per key tile (its K^T block, d x SPARSE_BK, and its V rows stay in
 * L1/L2 while the 6-row groups of a query tile stream past), SPARSE_BQ queries per query tile.
 * Sections: kernels, softmax tiles, decode, cache layout, forward, backward. */
#include "attn/sparse.h"

#include <float.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define SP_X86 1
#define SP_AVX512 __attribute__((target("avx512f,avx512dq,fma")))
#define SP_INLINE static inline __attribute__((always_inline))
#else
#define SP_X86 0
#endif

/* Clock of the phase timers (a build may substitute a CPU-time clock for profiling). */
#ifndef SP_CLOCK
#define SP_CLOCK() omp_get_wtime()
#endif

#define SP_LAZY 8.0f     /* log2 units the running max may lag behind the true max */
#define SP_MR 6          /* rows of a register tile */
#define SP_NR 64         /* columns of a register tile (4 vectors of 16) */
#define SP_TC 96         /* tokens per task when scattering into y / dx rows */
#define SP_KC 256        /* tokens per chunk of a weight-gradient reduction */
#define SP_CB 96         /* output rows per weight-gradient task (multiple of SP_MR) */
#define SP_BWD_TASKS 32  /* target task count of the attention backward: fixes the key split */
#define SP_NPTR 10       /* pointer arrays per thread */

/* exp2 on [-0.5, 0.5]: degree-6 least-max-relative-error fit, 1.1e-7 relative in float. */
#define SP_E0 1.0f
#define SP_E1 0.6931471824645996f
#define SP_E2 0.24022646248340607f
#define SP_E3 0.05550328642129898f
#define SP_E4 0.009618489071726799f
#define SP_E5 0.0013399930903688073f
#define SP_E6 0.0001534581242594868f

static inline int imin(int a, int b) { return a < b ? a : b; }
static inline int imax(int a, int b) { return a > b ? a : b; }
static inline int round16(int v) { return (v + 15) & ~15; }

/* ------------------------------------------------------------------------------------------------
 * Register-tile kernel: C(r, j) = (acc ? C(r, j) : 0) + sum_{k < K} A(r, k) B(k, j), r < R <= 6,
 * j < n <= 64. A(r, k) = a[r][aoff + k] (amode 0: one pointer per row) or a[k][aoff + r] (amode 1:
 * one pointer per k, A stored transposed); B(k, j) = b[k][boff + j]; C(r, j) = c[r][coff + j].
 * Each C element is a chain of fused multiply-adds over k in increasing order (both versions).
 * ---------------------------------------------------------------------------------------------- */

static void mk_ref(int R, int n, int amode, int K, const float *const *a, long aoff,
                   const float *const *b, long boff, float *const *c, long coff, bool acc) {
    float row[SP_NR];
    for (int r = 0; r < R; r++) {
        float *cr = c[r] + coff;
        for (int j = 0; j < n; j++) row[j] = acc ? cr[j] : 0.0f;
        for (int k = 0; k < K; k++) {
            const float av = amode ? a[k][aoff + r] : a[r][aoff + k];
            const float *bk = b[k] + boff;
            for (int j = 0; j < n; j++) row[j] = fmaf(av, bk[j], row[j]);
        }
        for (int j = 0; j < n; j++) cr[j] = row[j];
    }
}

#if SP_X86
SP_INLINE SP_AVX512 void mk_avx(const int R, const int NV, const int amode, const __mmask16 lm,
                                const int K, const float *const *a, const long aoff,
                                const float *const *b, const long boff, float *const *c,
                                const long coff, const bool acc) {
    __m512 t[SP_MR][4];
    const float *ar[SP_MR];
#pragma GCC unroll 6
    for (int r = 0; r < R; r++) {
        ar[r] = amode ? NULL : a[r] + aoff;
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) {
            const float *cp = c[r] + coff + 16 * v;
            t[r][v] = !acc ? _mm512_setzero_ps()
                           : (v == NV - 1 ? _mm512_maskz_loadu_ps(lm, cp) : _mm512_loadu_ps(cp));
        }
    }
    for (int k = 0; k < K; k++) {
        const float *bk = b[k] + boff;
        __m512 bv[4];
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++)
            bv[v] = v == NV - 1 ? _mm512_maskz_loadu_ps(lm, bk + 16 * v) : _mm512_loadu_ps(bk + 16 * v);
        const float *ak = amode ? a[k] + aoff : NULL;
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            const __m512 av = _mm512_set1_ps(amode ? ak[r] : ar[r][k]);
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++) t[r][v] = _mm512_fmadd_ps(av, bv[v], t[r][v]);
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) {
            float *cp = c[r] + coff + 16 * v;
            if (v == NV - 1) _mm512_mask_storeu_ps(cp, lm, t[r][v]);
            else _mm512_storeu_ps(cp, t[r][v]);
        }
}

/* One case per (amode, R, NV): each a fully unrolled register tile. */
#define SP_CASE(M, R_, V)                                                                  \
    case ((M) * 8 + (R_)) * 4 + (V) - 1:                                                   \
        mk_avx(R_, V, M, lm, K, a, aoff, b, boff, c, coff, acc);                            \
        break;
#define SP_CASES_R(M, R_) SP_CASE(M, R_, 1) SP_CASE(M, R_, 2) SP_CASE(M, R_, 3) SP_CASE(M, R_, 4)
#define SP_CASES_M(M)                                                                      \
    SP_CASES_R(M, 1) SP_CASES_R(M, 2) SP_CASES_R(M, 3) SP_CASES_R(M, 4) SP_CASES_R(M, 5)   \
    SP_CASES_R(M, 6)

SP_AVX512 static void mk_avx_any(int R, int n, int amode, int K, const float *const *a, long aoff,
                                 const float *const *b, long boff, float *const *c, long coff,
                                 bool acc) {
    const int NV = (n + 15) >> 4;
    const __mmask16 lm = (n & 15) ? (__mmask16)((1u << (n & 15)) - 1u) : (__mmask16)0xFFFF;
    switch (((amode ? 1 : 0) * 8 + R) * 4 + NV - 1) {
        SP_CASES_M(0)
        SP_CASES_M(1)
    default: break;
    }
}
#undef SP_CASE
#undef SP_CASES_R
#undef SP_CASES_M
#endif

/* C[M x n] (+)= A[M x K] B[K x n] over row groups of SP_MR and column blocks of SP_NR (column
 * block outer: a B block is reused by every row group). Pointer conventions as mk_ref; rows of A
 * and C are a[r] / c[r] for r < M (amode 0) or a[k] + r (amode 1). */
static void sp_mm(bool avx, int amode, int M, int n, int K, const float *const *a, long aoff,
                  const float *const *b, long boff, float *const *c, long coff, bool acc) {
    if (M <= 0 || n <= 0) return;
    for (int j0 = 0; j0 < n; j0 += SP_NR) {
        const int nn = imin(SP_NR, n - j0);
        for (int r0 = 0; r0 < M; r0 += SP_MR) {
            const int R = imin(SP_MR, M - r0);
            const float *const *ap = amode ? a : a + r0;
            const long ao = amode ? aoff + r0 : aoff;
            if (K <= 0) { /* empty product */
                if (!acc)
                    for (int r = 0; r < R; r++) memset(c[r0 + r] + coff + j0, 0, sizeof(float) * (size_t)nn);
                continue;
            }
#if SP_X86
            if (avx) {
                mk_avx_any(R, nn, amode, K, ap, ao, b, boff + j0, c + r0, coff + j0, acc);
                continue;
            }
#endif
            mk_ref(R, nn, amode, K, ap, ao, b, boff + j0, c + r0, coff + j0, acc);
        }
    }
}

/* ------------------------------------------------------------------------------------------------
 * Softmax tiles. Scores s = q.k stay raw (unscaled) and so does the running max m; the exponent is
 * (s - m) * cl2, cl2 = log2(e) / sqrt(d), so p = 2^((s - m) cl2) equals the reference's
 * e^(q.k / sqrt(d) - max). Subtracting BEFORE scaling keeps s - m exact near the max whatever the
 * magnitude of s (s * cl2 - m would round s * cl2 to float first: 1e-2 absolute at |s'| ~ 3e5).
 * ---------------------------------------------------------------------------------------------- */

/* Online-softmax update of R rows of raw scores s[r][0..nk) of which the first nv[r] are valid
 * (causal prefix; <= 0: none): running max m[r] (raw units), running sum l[16 r .. 16 r + 16)
 * (16 partial sums, added up at the end), accumulator row o[r][0..d); s[r] is overwritten with
 * the unnormalised probabilities 2^((s - m) cl2) (0 past nv[r]). The max is lazy: it moves (and
 * l, o are rescaled) only when a score exceeds it by more than SP_LAZY log2 units, so
 * p <= 2^SP_LAZY; the final o = acc / l and (m, log2(l)) are exact either way. */
static void fwd_softmax_ref(int R, int nk, float *const *s, const int *nv, float cl2, float *m,
                            float *l, float *const *o, int d) {
    for (int r = 0; r < R; r++) {
        float *sr = s[r];
        const int v = imin(nv[r], nk);
        if (v <= 0) {
            for (int j = 0; j < nk; j++) sr[j] = 0.0f;
            continue;
        }
        float mx = sr[0];
        for (int j = 1; j < v; j++) mx = sr[j] > mx ? sr[j] : mx;
        if ((mx - m[r]) * cl2 > SP_LAZY) {
            const float alpha = exp2f((m[r] - mx) * cl2);
            m[r] = mx;
            for (int q = 0; q < 16; q++) l[16 * r + q] *= alpha;
            for (int e = 0; e < d; e++) o[r][e] *= alpha;
        }
        float sum = 0.0f;
        for (int j = 0; j < nk; j++) {
            const float p = j < v ? exp2f((sr[j] - m[r]) * cl2) : 0.0f;
            sr[j] = p;
            sum += p;
        }
        l[16 * r] += sum;
    }
}

/* Backward tile: s[r][j] raw scores -> P = 2^((s - smax[r]) cl2 - lse[r]) (the forward's max in
 * raw units and log2 of its sum); dp[r][j] = dO.v -> dS = P (dp - D[r]) / sqrt(d) (both 0 past
 * nv[r]). */
static void bwd_ds_ref(int R, int nk, float *const *s, float *const *dp, const int *nv, float cl2,
                       float scale, const float *smax, const float *lse, const float *D) {
    for (int r = 0; r < R; r++) {
        const int v = imin(nv[r], nk);
        for (int j = 0; j < nk; j++) {
            const float p = j < v ? exp2f(fmaf(s[r][j] - smax[r], cl2, -lse[r])) : 0.0f;
            s[r][j] = p;
            dp[r][j] = j < v ? p * (dp[r][j] - D[r]) * scale : 0.0f;
        }
    }
}

#if SP_X86
/* 2^x for x <= ~SP_LAZY, -inf included (scalef flushes large negative n to 0 or a denormal). */
SP_INLINE SP_AVX512 __m512 exp2_avx(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-FLT_MAX)); /* -inf (s - m overflowed) -> 0, not NaN */
    const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(x, n);
    __m512 p = _mm512_set1_ps(SP_E6);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(SP_E5));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(SP_E4));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(SP_E3));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(SP_E2));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(SP_E1));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(SP_E0));
    return _mm512_scalef_ps(p, n);
}

SP_INLINE __mmask16 lanes_mask(int lanes) {
    return lanes >= 16 ? (__mmask16)0xFFFF : lanes <= 0 ? (__mmask16)0 : (__mmask16)((1u << lanes) - 1u);
}

/* Rescale of row r when its max moves to mx (raw units; see fwd_softmax_ref). */
SP_INLINE SP_AVX512 __m512 fwd_rescale(float mx, float cl2, float *m, __m512 lv, float *orow, int d) {
    const __m512 va = _mm512_set1_ps(exp2f((*m - mx) * cl2));
    *m = mx;
    for (int e = 0; e < d; e += 16) {
        const __mmask16 mm = lanes_mask(d - e);
        _mm512_mask_storeu_ps(orow + e, mm, _mm512_mul_ps(va, _mm512_maskz_loadu_ps(mm, orow + e)));
    }
    return _mm512_mul_ps(lv, va);
}

SP_AVX512 static void fwd_softmax_avx(int R, int nk, float *const *s, const int *nv, float cl2,
                                      float *m, float *l, float *const *o, int d) {
    const int nvec = (nk + 15) >> 4;
    const __m512 vc = _mm512_set1_ps(cl2);
    bool full = nk == SPARSE_BK;
    for (int r = 0; r < R; r++) full = full && nv[r] >= nk;
    if (full) { /* whole tile valid: fixed trip counts, no masks, the rows interleave */
        float mx[SP_MR];
        for (int r = 0; r < R; r++) {
            __m512 vmax = _mm512_loadu_ps(s[r]);
#pragma GCC unroll 16
            for (int q = 1; q < SPARSE_BK / 16; q++) vmax = _mm512_max_ps(vmax, _mm512_loadu_ps(s[r] + 16 * q));
            mx[r] = _mm512_reduce_max_ps(vmax);
        }
        for (int r = 0; r < R; r++) {
            float *sr = s[r];
            __m512 lv = _mm512_loadu_ps(l + 16 * r);
            if ((mx[r] - m[r]) * cl2 > SP_LAZY) lv = fwd_rescale(mx[r], cl2, m + r, lv, o[r], d);
            const __m512 vm = _mm512_set1_ps(m[r]);
#pragma GCC unroll 16
            for (int q = 0; q < SPARSE_BK / 16; q++) {
                const __m512 p = exp2_avx(_mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(sr + 16 * q), vm), vc));
                _mm512_storeu_ps(sr + 16 * q, p);
                lv = _mm512_add_ps(lv, p);
            }
            _mm512_storeu_ps(l + 16 * r, lv);
        }
        return;
    }
    for (int r = 0; r < R; r++) {
        float *sr = s[r];
        const int v = imin(nv[r], nk);
        if (v <= 0) {
            for (int q = 0; q < nvec; q++) _mm512_mask_storeu_ps(sr + 16 * q, lanes_mask(nk - 16 * q), _mm512_setzero_ps());
            continue;
        }
        __m512 vmax = _mm512_set1_ps(-INFINITY);
        for (int q = 0; q < nvec; q++)
            vmax = _mm512_max_ps(vmax, _mm512_mask_loadu_ps(vmax, lanes_mask(v - 16 * q), sr + 16 * q));
        const float mx = _mm512_reduce_max_ps(vmax);
        __m512 lv = _mm512_loadu_ps(l + 16 * r);
        if ((mx - m[r]) * cl2 > SP_LAZY) lv = fwd_rescale(mx, cl2, m + r, lv, o[r], d); /* the max moves */
        const __m512 vm = _mm512_set1_ps(m[r]);
        for (int q = 0; q < nvec; q++) {
            const __mmask16 ok = lanes_mask(v - 16 * q);
            const __m512 sv = _mm512_maskz_loadu_ps(ok, sr + 16 * q);
            /* s - m first (exact near the max: 0 at the max, p = 1), then scaled */
            const __m512 p = _mm512_maskz_mov_ps(ok, exp2_avx(_mm512_mul_ps(_mm512_sub_ps(sv, vm), vc)));
            _mm512_mask_storeu_ps(sr + 16 * q, lanes_mask(nk - 16 * q), p);
            lv = _mm512_add_ps(lv, p);
        }
        _mm512_storeu_ps(l + 16 * r, lv);
    }
}

SP_AVX512 static void bwd_ds_avx(int R, int nk, float *const *s, float *const *dp, const int *nv,
                                 float cl2, float scale, const float *smax, const float *lse,
                                 const float *D) {
    const __m512 vc = _mm512_set1_ps(cl2), vs = _mm512_set1_ps(scale);
    for (int r = 0; r < R; r++) {
        const int v = imin(nv[r], nk);
        const __m512 vm = _mm512_set1_ps(smax[r]), vl = _mm512_set1_ps(lse[r]), vd = _mm512_set1_ps(D[r]);
        for (int q = 0; q < nk; q += 16) {
            const __mmask16 st = lanes_mask(nk - q), ok = lanes_mask(v - q);
            const __m512 sv = _mm512_maskz_loadu_ps(ok, s[r] + q);
            const __m512 p = _mm512_maskz_mov_ps(ok, exp2_avx(_mm512_fmsub_ps(_mm512_sub_ps(sv, vm), vc, vl)));
            const __m512 dv = _mm512_maskz_loadu_ps(ok, dp[r] + q);
            const __m512 ds = _mm512_maskz_mul_ps(ok, _mm512_mul_ps(p, _mm512_sub_ps(dv, vd)), vs);
            _mm512_mask_storeu_ps(s[r] + q, st, p);
            _mm512_mask_storeu_ps(dp[r] + q, st, ds);
        }
    }
}
#endif

static void fwd_softmax(bool avx, int R, int nk, float *const *s, const int *nv, float cl2, float *m,
                        float *l, float *const *o, int d) {
#if SP_X86
    if (avx) {
        fwd_softmax_avx(R, nk, s, nv, cl2, m, l, o, d);
        return;
    }
#endif
    fwd_softmax_ref(R, nk, s, nv, cl2, m, l, o, d);
}

static void bwd_ds(bool avx, int R, int nk, float *const *s, float *const *dp, const int *nv,
                   float cl2, float scale, const float *smax, const float *lse, const float *D) {
#if SP_X86
    if (avx) {
        bwd_ds_avx(R, nk, s, dp, nv, cl2, scale, smax, lse, D);
        return;
    }
#endif
    bwd_ds_ref(R, nk, s, dp, nv, cl2, scale, smax, lse, D);
}

/* ------------------------------------------------------------------------------------------------
 * Decode: one query against the cached keys of one head
 * ---------------------------------------------------------------------------------------------- */

static void decode_ref(const float *q, const float *K, const float *V, long ld, int n, int d,
                       float gate, float *scores, float *out) {
    const float cl2 = (float)(1.4426950408889634 / sqrt((double)d));
    float mx = -INFINITY;
    for (int j = 0; j < n; j++) {
        const float *kj = K + (size_t)j * ld;
        float s = 0.0f;
        for (int e = 0; e < d; e++) s += q[e] * kj[e];
        scores[j] = s; /* raw: the max is subtracted before scaling (see the softmax tiles) */
        mx = s > mx ? s : mx;
    }
    float sum = 0.0f;
    for (int j = 0; j < n; j++) {
        scores[j] = exp2f((scores[j] - mx) * cl2);
        sum += scores[j];
    }
    for (int e = 0; e < d; e++) out[e] = 0.0f;
    for (int j = 0; j < n; j++) {
        const float *vj = V + (size_t)j * ld;
        for (int e = 0; e < d; e++) out[e] += scores[j] * vj[e];
    }
    const float f = gate / sum;
    for (int e = 0; e < d; e++) out[e] *= f;
}

#if SP_X86
/* Lane j of the result = horizontal sum of v[j], j < 16. */
SP_INLINE SP_AVX512 __m512 hsum16(const __m512 *v) {
    __m512 t[8], u[4];
    for (int i = 0; i < 8; i++)
        t[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; i++) {
        const __m512d a = _mm512_castps_pd(t[2 * i]), b = _mm512_castps_pd(t[2 * i + 1]);
        u[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
    }
    const __m512 y0 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                    _mm512_shuffle_f32x4(u[0], u[1], _MM_SHUFFLE(3, 1, 3, 1)));
    const __m512 y1 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                    _mm512_shuffle_f32x4(u[2], u[3], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_add_ps(_mm512_shuffle_f32x4(y0, y1, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(y0, y1, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* d <= 64: scores 16 keys at a time (one reduction tree per block), exp2 over vectors, and the
 * weighted sum of V rows into 4 interleaved accumulators (keys j mod 4), added in a fixed order. */
SP_AVX512 static void decode_avx(const float *q, const float *K, const float *V, long ld, int n,
                                 int d, float gate, float *scores, float *out) {
    const float cl2 = (float)(1.4426950408889634 / sqrt((double)d));
    const int nv = (d + 15) >> 4;
    const __mmask16 lm = lanes_mask(d - 16 * (nv - 1));
    __m512 qv[4];
    for (int v = 0; v < nv; v++) qv[v] = _mm512_maskz_loadu_ps(v == nv - 1 ? lm : (__mmask16)0xFFFF, q + 16 * v);
    const __m512 vc = _mm512_set1_ps(cl2);
    __m512 vmax = _mm512_set1_ps(-INFINITY);
    for (int j0 = 0; j0 < n; j0 += 16) {
        const int jn = imin(16, n - j0);
        __m512 acc[16];
        for (int jj = 0; jj < 16; jj++) {
            acc[jj] = _mm512_setzero_ps();
            if (jj >= jn) continue;
            const float *kj = K + (size_t)(j0 + jj) * ld;
            for (int v = 0; v < nv; v++)
                acc[jj] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(v == nv - 1 ? lm : (__mmask16)0xFFFF, kj + 16 * v), qv[v], acc[jj]);
        }
        const __mmask16 jm = lanes_mask(jn);
        const __m512 sv = hsum16(acc); /* raw scores: scaled after the max is subtracted */
        _mm512_mask_storeu_ps(scores + j0, jm, sv);
        vmax = _mm512_mask_max_ps(vmax, jm, vmax, sv);
    }
    const __m512 vm = _mm512_set1_ps(_mm512_reduce_max_ps(vmax));
    __m512 vsum = _mm512_setzero_ps();
    for (int j0 = 0; j0 < n; j0 += 16) {
        const __mmask16 jm = lanes_mask(n - j0);
        const __m512 sv = _mm512_maskz_loadu_ps(jm, scores + j0);
        const __m512 p = _mm512_maskz_mov_ps(jm, exp2_avx(_mm512_mul_ps(_mm512_sub_ps(sv, vm), vc)));
        _mm512_mask_storeu_ps(scores + j0, jm, p);
        vsum = _mm512_add_ps(vsum, p);
    }
    __m512 o[4][4];
    for (int a = 0; a < 4; a++)
        for (int v = 0; v < 4; v++) o[a][v] = _mm512_setzero_ps();
    int j = 0;
    for (; j + 4 <= n; j += 4)
        for (int a = 0; a < 4; a++) {
            const __m512 pj = _mm512_set1_ps(scores[j + a]);
            const float *vj = V + (size_t)(j + a) * ld;
            for (int v = 0; v < nv; v++)
                o[a][v] = _mm512_fmadd_ps(pj, _mm512_maskz_loadu_ps(v == nv - 1 ? lm : (__mmask16)0xFFFF, vj + 16 * v), o[a][v]);
        }
    for (; j < n; j++) {
        const __m512 pj = _mm512_set1_ps(scores[j]);
        const float *vj = V + (size_t)j * ld;
        for (int v = 0; v < nv; v++)
            o[0][v] = _mm512_fmadd_ps(pj, _mm512_maskz_loadu_ps(v == nv - 1 ? lm : (__mmask16)0xFFFF, vj + 16 * v), o[0][v]);
    }
    const __m512 f = _mm512_set1_ps(gate / _mm512_reduce_add_ps(vsum));
    for (int v = 0; v < nv; v++) {
        const __m512 r = _mm512_add_ps(_mm512_add_ps(o[0][v], o[1][v]), _mm512_add_ps(o[2][v], o[3][v]));
        _mm512_mask_storeu_ps(out + 16 * v, v == nv - 1 ? lm : (__mmask16)0xFFFF, _mm512_mul_ps(r, f));
    }
}
#endif

void sparse_decode_attend_f32(const float *q, const float *K, const float *V, long ld, int n, int d,
                              float gate, float *scores, float *out) {
    if (n <= 0) {
        for (int e = 0; e < d; e++) out[e] = 0.0f;
        return;
    }
#if SP_X86
    if (d <= 64 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq")) {
        decode_avx(q, K, V, ld, n, d, gate, scores, out);
        return;
    }
#endif
    decode_ref(q, K, V, ld, n, d, gate, scores, out);
}

/* ------------------------------------------------------------------------------------------------
 * Cache layout
 * ---------------------------------------------------------------------------------------------- */

int sparse_active_heads(const moh_attn_config *cfg) {
    if (cfg->router == MOH_ROUTER_NONE || attn_routed_heads(cfg) == 0 || cfg->top_k == 0)
        return cfg->n_heads;
    return cfg->shared_heads + cfg->top_k;
}

/* Per-thread scratch: carved from the thread's float slice and pointer slice. */
typedef struct sp_tws {
    float *s, *ds, *oacc, *m, *l, *dkt, *dvt;
    int *nv;
    const float **pa, **pb, **pb2, **pb3, **pa2, **sa, **dsa;
    float **pc, **sc, **dsc;
} sp_tws;

static int sp_dpad(const moh_attn_config *cfg) { return round16(cfg->head_dim); }
static int sp_ncb(const moh_attn_config *cfg) { return (cfg->hidden_size + SP_NR - 1) / SP_NR; }
static int sp_ptr_cap(const moh_attn_config *cfg) {
    int v = imax(cfg->hidden_size, cfg->head_dim);
    v = imax(v, imax(SPARSE_BQ, SPARSE_BK));
    v = imax(v, imax(SP_KC, SP_TC));
    return v + 8;
}
static size_t sp_ws_floats(const moh_attn_config *cfg) {
    const size_t dp = (size_t)sp_dpad(cfg);
    /* s, ds [BQ, BK]; oacc [BQ, dp]; m, nv [BQ]; l [BQ, 16]; dkt, dvt [BK, dp] */
    return 2 * (size_t)SPARSE_BQ * SPARSE_BK + (size_t)SPARSE_BQ * dp + 2 * (size_t)round16(SPARSE_BQ) +
           16 * (size_t)SPARSE_BQ + 2 * (size_t)SPARSE_BK * dp + 64;
}

/* Walks the buffers in a fixed order; assigns pointers when base != NULL. Returns total bytes. */
typedef struct sp_carver {
    char *base;
    size_t off;
} sp_carver;
static void *carve(sp_carver *cv, size_t bytes) {
    cv->off = (cv->off + 63) & ~(size_t)63;
    void *p = cv->base && bytes ? cv->base + cv->off : NULL;
    cv->off += bytes;
    return p;
}

static int sp_nkt(int N) { return (N + SPARSE_BK - 1) / SPARSE_BK; }
static int sp_max_tasks(const moh_attn_config *cfg, int B, int N) {
    return B * cfg->n_heads * ((N + SPARSE_BQ - 1) / SPARSE_BQ);
}
/* Key chunks of the attention backward: a function of B, h_kv, N only (never of the thread
 * count), so dQ's summation order is fixed. */
static int sp_nparts(const moh_attn_config *cfg, int B, int N) {
    const int bk = B * cfg->n_kv_heads;
    int np = (SP_BWD_TASKS + bk - 1) / bk;
    np = imin(np, sp_nkt(N));
    return imax(np, 1);
}

static size_t sp_layout(sparse_cache *c, const moh_attn_config *cfg, int B, int N, int nthreads,
                        char *base) {
    sp_carver cv = {base, 0};
    const size_t T = (size_t)B * N, h = (size_t)cfg->n_heads, d = (size_t)cfg->head_dim;
    const size_t hd = h * d, kvd = (size_t)cfg->n_kv_heads * d, qd = (size_t)attn_qkv_dim(cfg);
    const size_t E = (size_t)attn_routed_heads(cfg), hs = (size_t)cfg->shared_heads;
    const size_t W = (size_t)attn_router_width(cfg);
    const size_t P = T * (size_t)sparse_active_heads(cfg);
    const size_t nkt = (size_t)sp_nkt(N), kvt = (size_t)B * cfg->n_kv_heads * nkt * d * SPARSE_BK;
    const bool qn = cfg->router == MOH_ROUTER_QUERY_NORM, rope = cfg->rope_theta > 0;
    const size_t half = d / 2, F = sizeof(float);
    const size_t wp = h * d * (size_t)sp_ncb(cfg) * SP_NR;
    const size_t nparts = (size_t)sp_nparts(cfg, B, N);
    sparse_cache tmp;
    sparse_cache *o = c ? c : &tmp;
    attn_cache_f32 *rc = &o->rc;
    rc->gates = carve(&cv, T * h * F);
    rc->p = carve(&cv, T * E * F);
    rc->mask = carve(&cv, T * E * F);
    rc->r = carve(&cv, T * E * F);
    rc->denom = carve(&cv, T * F);
    rc->s = carve(&cv, T * hs * F);
    rc->a = carve(&cv, T * 2 * F);
    rc->qn = carve(&cv, T * E * F);
    rc->qstd = carve(&cv, T * F);
    rc->scratch = carve(&cv, T * (E + W + hs + 2) * F);
    rc->q_pre = carve(&cv, qn ? T * hd * F : 0);
    o->dgates = carve(&cv, T * h * F);
    o->pair_off = carve(&cv, ((size_t)B * h + 1) * sizeof(int));
    o->pair_pos = carve(&cv, P * sizeof(int));
    o->tasks = carve(&cv, (size_t)sp_max_tasks(cfg, B, N) * 4 * sizeof(int));
    o->q = carve(&cv, P * d * F);
    o->o = carve(&cv, P * d * F);
    o->og = carve(&cv, P * d * F);
    o->smax = carve(&cv, P * F);
    o->lse = carve(&cv, P * F);
    o->kv = carve(&cv, T * 2 * kvd * F);
    o->kh = carve(&cv, T * kvd * F);
    o->vh = carve(&cv, T * kvd * F);
    o->kt = carve(&cv, kvt * F);
    o->vt = carve(&cv, kvt * F);
    o->qkv = carve(&cv, qn ? T * qd * F : 0);
    o->dqkv = carve(&cv, qn ? T * qd * F : 0);
    o->rope_cos = carve(&cv, rope ? (size_t)N * half * F : 0);
    o->rope_sin = carve(&cv, rope ? (size_t)N * half * F : 0);
    o->wpack1 = carve(&cv, wp * F);
    o->wpack2 = carve(&cv, wp * F);
    o->dq = carve(&cv, nparts * P * d * F);
    o->dout = carve(&cv, P * d * F);
    o->ddot = carve(&cv, P * F);
    o->dkh = carve(&cv, T * kvd * F);
    o->dvh = carve(&cv, T * kvd * F);
    o->ws_floats = sp_ws_floats(cfg);
    o->ws = carve(&cv, (size_t)nthreads * o->ws_floats * F);
    o->ptr_cap = sp_ptr_cap(cfg);
    o->wptr = carve(&cv, (size_t)nthreads * SP_NPTR * (size_t)o->ptr_cap * sizeof(void *));
    return cv.off + 64;
}

size_t sparse_cache_bytes(const moh_attn_config *cfg, int B, int N, int nthreads) {
    return sp_layout(NULL, cfg, B, N, nthreads, NULL);
}

static void rope_tables(sparse_cache *c, const moh_attn_config *cfg, int N) {
    if (!c->rope_cos) return;
    const int d = cfg->head_dim, half = d / 2;
    /* exactly ops' rope: inv_freq_j = 1 / theta^(2j/d) and angle = n * inv_freq_j in float */
    for (int n = 0; n < N; n++)
        for (int j = 0; j < half; j++) {
            const float e = (float)(2 * j) / (float)d;
            const float inv = 1.0f / powf((float)cfg->rope_theta, e);
            const float ang = (float)n * inv;
            c->rope_cos[(size_t)n * half + j] = cosf(ang);
            c->rope_sin[(size_t)n * half + j] = sinf(ang);
        }
}

int sparse_cache_init(sparse_cache *c, const moh_attn_config *cfg, int B, int N, moh_error *err) {
    memset(c, 0, sizeof *c);
    if (B < 1 || N < 1)
        return moh_fail(err, MOH_E_ARG, "sparse attention cache: B=%d N=%d, both must be >= 1", B, N);
    if (cfg->rope_theta > 0 && cfg->head_dim % 2)
        return moh_fail(err, MOH_E_CONFIG, "sparse attention: RoPE needs an even head_dim, got %d", cfg->head_dim);
    if ((double)B * N * cfg->n_heads * imax(cfg->head_dim, 1) > (double)INT32_MAX)
        return moh_fail(err, MOH_E_NOMEM, "sparse attention cache: B=%d N=%d heads=%d is too large", B, N, cfg->n_heads);
    const int nthreads = imax(omp_get_max_threads(), 1);
    const size_t bytes = sp_layout(NULL, cfg, B, N, nthreads, NULL);
    c->block = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    if (!c->block)
        return moh_fail(err, MOH_E_NOMEM, "sparse attention cache: cannot allocate %zu MiB", bytes >> 20);
    sp_layout(c, cfg, B, N, nthreads, c->block);
    c->bytes = bytes;
    c->maxB = B;
    c->maxN = N;
    c->B = B;
    c->N = N;
    c->nthreads = nthreads;
    c->nparts = sp_nparts(cfg, B, N);
#if SP_X86
    c->avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
#endif
    rope_tables(c, cfg, N);
    return MOH_OK;
}

void sparse_cache_free(sparse_cache *c) {
    free(c->block);
    memset(c, 0, sizeof *c);
}

static sp_tws tws_get(const sparse_cache *c, const moh_attn_config *cfg, int tid) {
    sp_tws w;
    const size_t dp = (size_t)sp_dpad(cfg), bq = (size_t)round16(SPARSE_BQ);
    float *f = c->ws + (size_t)tid * c->ws_floats;
    w.s = f;
    f += (size_t)SPARSE_BQ * SPARSE_BK;
    w.ds = f;
    f += (size_t)SPARSE_BQ * SPARSE_BK;
    w.oacc = f;
    f += (size_t)SPARSE_BQ * dp;
    w.m = f;
    f += bq;
    w.l = f;
    f += 16 * (size_t)SPARSE_BQ;
    w.nv = (int *)(void *)f;
    f += bq;
    w.dkt = f;
    f += (size_t)SPARSE_BK * dp;
    w.dvt = f;
    void **p = c->wptr + (size_t)tid * SP_NPTR * c->ptr_cap;
    const size_t cap = (size_t)c->ptr_cap;
    w.pa = (const float **)(void *)(p + 0 * cap);
    w.pb = (const float **)(void *)(p + 1 * cap);
    w.pb2 = (const float **)(void *)(p + 2 * cap);
    w.pb3 = (const float **)(void *)(p + 3 * cap);
    w.pa2 = (const float **)(void *)(p + 4 * cap);
    w.sa = (const float **)(void *)(p + 5 * cap);
    w.dsa = (const float **)(void *)(p + 6 * cap);
    w.pc = (float **)(void *)(p + 7 * cap);
    w.sc = (float **)(void *)(p + 8 * cap);
    w.dsc = (float **)(void *)(p + 9 * cap);
    for (int r = 0; r < SPARSE_BQ; r++) {
        w.sc[r] = w.s + (size_t)r * SPARSE_BK;
        w.sa[r] = w.sc[r];
        w.dsc[r] = w.ds + (size_t)r * SPARSE_BK;
        w.dsa[r] = w.dsc[r];
    }
    return w;
}

/* RoPE of one head row v[d] at position n from the tables (sign -1: the inverse rotation), the
 * same arithmetic as ops' rope_forward / rope_backward. */
static void rope_row(float *v, const sparse_cache *c, int n, int d, int sign) {
    const int half = d / 2;
    const float *cs = c->rope_cos + (size_t)n * half, *sn = c->rope_sin + (size_t)n * half;
    for (int j = 0; j < half; j++) {
        const float co = cs[j], s = sign < 0 ? -sn[j] : sn[j];
        const float x1 = v[j], x2 = v[j + half];
        v[j] = x1 * co + (-x2) * s;
        v[j + half] = x2 * co + x1 * s;
    }
}

/* First index in a[0..n) with a[i] >= v (a ascending). */
static int lower_bound(const int *a, int n, int v) {
    int lo = 0, hi = n;
    while (lo < hi) {
        const int mid = (lo + hi) >> 1;
        if (a[mid] < v) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* ------------------------------------------------------------------------------------------------
 * Forward
 * ---------------------------------------------------------------------------------------------- */

static int cmp_task_desc(const void *pa, const void *pb) {
    const int *a = pa, *b = pb;
    if (a[3] != b[3]) return a[3] > b[3] ? -1 : 1;
    for (int k = 0; k < 3; k++)
        if (a[k] != b[k]) return a[k] < b[k] ? -1 : 1;
    return 0;
}

/* Selected pairs per (b, head) in token order, and the query-tile task list (causal: the most
 * expensive tiles first, for the dynamic schedule; the order never changes any result). */
static void build_pairs(const moh_attn_config *cfg, sparse_cache *c, int B, int N) {
    const int h = cfg->n_heads, hs = cfg->shared_heads, E = attn_routed_heads(cfg);
    const bool masked = E > 0 && cfg->top_k > 0;
    int p = 0, nt = 0;
    for (int b = 0; b < B; b++)
        for (int i = 0; i < h; i++) {
            c->pair_off[b * h + i] = p;
            const int p0 = p;
            for (int n = 0; n < N; n++) {
                const long t = (long)b * N + n;
                if (!masked || i < hs || c->rc.mask[t * E + (i - hs)] != 0.0f) c->pair_pos[p++] = n;
            }
            for (int r0 = 0; r0 < p - p0; r0 += SPARSE_BQ) {
                int *tk = c->tasks + 4 * nt++;
                tk[0] = b;
                tk[1] = i;
                tk[2] = r0;
                tk[3] = cfg->causal ? c->pair_pos[p0 + imin(r0 + SPARSE_BQ, p - p0) - 1] : 0;
            }
        }
    c->pair_off[B * h] = p;
    c->ntasks = nt;
    if (cfg->causal) qsort(c->tasks, (size_t)nt, 4 * sizeof(int), cmp_task_desc);
}

/* K, V rows of all tokens into head-contiguous kh / vh (K after bias and RoPE) and the transposed
 * key tiles kt. src row t: K at src + t*ld + koff, V at + voff; bias (may be NULL): [2 kvd]. */
static void kv_repack(const moh_attn_config *cfg, sparse_cache *c, const float *src, int ld,
                      int koff, int voff, const float *bias, int B, int N, bool vt_too) {
    const int hkv = cfg->n_kv_heads, d = cfg->head_dim, kvd = hkv * d, nkt = sp_nkt(N);
    const bool rope = cfg->rope_theta > 0;
    const int ntask = B * hkv * nkt;
#pragma omp parallel for schedule(static) num_threads(c->nthreads)
    for (int task = 0; task < ntask; task++) {
        const int b = task / (hkv * nkt), g = (task / nkt) % hkv, kt = task % nkt;
        const int j0 = kt * SPARSE_BK, nk = imin(SPARSE_BK, N - j0);
        const size_t hb = ((size_t)b * hkv + g) * N;
        float *ktile = c->kt + (((size_t)b * hkv + g) * nkt + kt) * d * SPARSE_BK;
        float *vtile = c->vt + (((size_t)b * hkv + g) * nkt + kt) * d * SPARSE_BK;
        for (int jj = 0; jj < nk; jj++) {
            const int j = j0 + jj;
            const float *row = src + ((size_t)b * N + j) * ld;
            float *kr = c->kh + (hb + j) * d, *vr = c->vh + (hb + j) * d;
            for (int e = 0; e < d; e++) {
                kr[e] = row[koff + g * d + e] + (bias ? bias[g * d + e] : 0.0f);
                vr[e] = row[voff + g * d + e] + (bias ? bias[kvd + g * d + e] : 0.0f);
            }
            if (rope) rope_row(kr, c, j, d, 1);
            for (int e = 0; e < d; e++) ktile[(size_t)e * SPARSE_BK + jj] = kr[e];
            if (vt_too)
                for (int e = 0; e < d; e++) vtile[(size_t)e * SPARSE_BK + jj] = vr[e];
        }
    }
}

/* One query tile of head i in batch row b: flash-attention forward over the key tiles. */
static void attn_fwd_tile(const moh_attn_config *cfg, sparse_cache *c, const int *task, int N,
                          sp_tws *w) {
    const int h = cfg->n_heads, hkv = cfg->n_kv_heads, d = cfg->head_dim, grp = h / hkv;
    const int b = task[0], i = task[1], r0 = task[2], g = i / grp, nkt = sp_nkt(N);
    const int off = c->pair_off[b * h + i], cnt = c->pair_off[b * h + i + 1] - off;
    const int nr = imin(SPARSE_BQ, cnt - r0), p0 = off + r0, dp = sp_dpad(cfg);
    const int *pos = c->pair_pos + p0;
    const float cl2 = (float)(1.4426950408889634 / sqrt((double)d));
    const size_t hb = (size_t)b * hkv + g;
    const bool avx = c->avx512;
    for (int r = 0; r < nr; r++) {
        w->pa[r] = c->q + (size_t)(p0 + r) * d;
        w->pc[r] = w->oacc + (size_t)r * dp;
        memset(w->pc[r], 0, sizeof(float) * (size_t)d);
        w->m[r] = -INFINITY;
        memset(w->l + 16 * r, 0, 16 * sizeof(float));
    }
    const int nkeys = cfg->causal ? pos[nr - 1] + 1 : N;
    const int ntile = (nkeys + SPARSE_BK - 1) / SPARSE_BK;
    for (int kt = 0; kt < ntile; kt++) {
        const int j0 = kt * SPARSE_BK, nk = imin(SPARSE_BK, N - j0);
        const float *ktile = c->kt + (hb * nkt + kt) * d * SPARSE_BK;
        for (int e = 0; e < d; e++) w->pb[e] = ktile + (size_t)e * SPARSE_BK;
        for (int j = 0; j < nk; j++) w->pb2[j] = c->vh + (hb * N + j0 + j) * d;
        for (int rg = 0; rg < nr; rg += SP_MR) {
            const int R = imin(SP_MR, nr - rg);
            if (cfg->causal && pos[rg + R - 1] < j0) continue;
            for (int r = 0; r < R; r++) w->nv[r] = cfg->causal ? imin(nk, pos[rg + r] - j0 + 1) : nk;
            sp_mm(avx, 0, R, nk, d, w->pa + rg, 0, w->pb, 0, w->sc, 0, false);
            fwd_softmax(avx, R, nk, w->sc, w->nv, cl2, w->m + rg, w->l + 16 * rg, w->pc + rg, d);
            sp_mm(avx, 0, R, d, nk, w->sa, 0, w->pb2, 0, w->pc + rg, 0, true);
        }
    }
    for (int r = 0; r < nr; r++) {
        float lsum = 0.0f; /* the 16 partial sums, pairwise in a fixed order */
        float part[16];
        memcpy(part, w->l + 16 * r, sizeof part);
        for (int width = 8; width >= 1; width /= 2)
            for (int q = 0; q < width; q++) part[q] += part[q + width];
        lsum = part[0];
        const float inv = 1.0f / lsum;
        const float gate = c->rc.gates[((size_t)b * N + pos[r]) * h + i];
        float *orow = c->o + (size_t)(p0 + r) * d, *og = c->og + (size_t)(p0 + r) * d;
        const float *acc = w->pc[r];
        for (int e = 0; e < d; e++) {
            orow[e] = acc[e] * inv;
            og[e] = gate * orow[e];
        }
        c->smax[p0 + r] = w->m[r];
        c->lse[p0 + r] = log2f(lsum);
    }
}

void sparse_forward_f32(const moh_attn_config *cfg, const attn_params_f32 *prm, const float *x,
                        int B, int N, float *y, sparse_cache *c) {
    const int C = cfg->hidden_size, h = cfg->n_heads, hkv = cfg->n_kv_heads, d = cfg->head_dim;
    const int T = B * N, hd = h * d, kvd = hkv * d, qd = attn_qkv_dim(cfg), ncb = sp_ncb(cfg);
    const bool qnorm = cfg->router == MOH_ROUTER_QUERY_NORM, rope = cfg->rope_theta > 0;
    const bool avx = c->avx512;
    c->x = x;
    c->B = B;
    c->N = N;
    c->rc.x = x;
    c->rc.B = B;
    c->rc.N = N;
    double t0 = SP_CLOCK(), t1;
    /* 1. router (query_norm: on the dense pre-RoPE q it needs anyway) */
    if (qnorm) {
        linear_forward_f32(c->qkv, x, prm->w_qkv, prm->b_qkv, T, C, qd);
        for (int t = 0; t < T; t++) memcpy(c->rc.q_pre + (size_t)t * hd, c->qkv + (size_t)t * qd, sizeof(float) * hd);
    }
    router_forward_f32(cfg, prm, x, c->qkv, T, &c->rc);
    build_pairs(cfg, c, B, N);
    t1 = SP_CLOCK();
    c->phase_s[SPARSE_PH_ROUTER] += t1 - t0;
    t0 = t1;
    /* 2. K, V of every token and KV head (dense GEMM), RoPE on K, key tiles */
    if (qnorm) {
        kv_repack(cfg, c, c->qkv, qd, hd, hd + kvd, NULL, B, N, false);
    } else {
        gemm_f32(false, true, T, 2 * kvd, C, 1.0f, x, C, prm->w_qkv + (size_t)hd * C, C, 0.0f, c->kv, 2 * kvd);
        kv_repack(cfg, c, c->kv, 2 * kvd, 0, kvd, prm->b_qkv ? prm->b_qkv + hd : NULL, B, N, false);
    }
    t1 = SP_CLOCK();
    c->phase_s[SPARSE_PH_KV] += t1 - t0;
    t0 = t1;
    /* 3. Q of the selected pairs: gathered rows of x times W_q^i (packed [C, d] per head) */
    if (!qnorm) {
#pragma omp parallel for schedule(static) num_threads(c->nthreads)
        for (int i = 0; i < h; i++)
            for (int k = 0; k < C; k++)
                for (int e = 0; e < d; e++)
                    c->wpack1[((size_t)i * C + k) * d + e] = prm->w_qkv[((size_t)i * d + e) * C + k];
    }
#pragma omp parallel for schedule(dynamic, 1) num_threads(c->nthreads)
    for (int ti = 0; ti < c->ntasks; ti++) {
        sp_tws w = tws_get(c, cfg, omp_get_thread_num());
        const int *tk = c->tasks + 4 * ti;
        const int b = tk[0], i = tk[1], r0 = tk[2];
        const int off = c->pair_off[b * h + i], cnt = c->pair_off[b * h + i + 1] - off;
        const int nr = imin(SPARSE_BQ, cnt - r0), p0 = off + r0;
        for (int r = 0; r < nr; r++) {
            const size_t t = (size_t)b * N + c->pair_pos[p0 + r];
            float *qr = c->q + (size_t)(p0 + r) * d;
            w.pc[r] = qr;
            if (qnorm) memcpy(qr, c->qkv + t * qd + (size_t)i * d, sizeof(float) * d);
            else w.pa[r] = x + t * C;
        }
        if (!qnorm) {
            for (int k = 0; k < C; k++) w.pb[k] = c->wpack1 + ((size_t)i * C + k) * d;
            sp_mm(avx, 0, nr, d, C, w.pa, 0, w.pb, 0, w.pc, 0, false);
        }
        for (int r = 0; r < nr; r++) {
            float *qr = w.pc[r];
            if (!qnorm && prm->b_qkv)
                for (int e = 0; e < d; e++) qr[e] += prm->b_qkv[i * d + e];
            if (rope) rope_row(qr, c, c->pair_pos[p0 + r], d, 1);
        }
    }
    t1 = SP_CLOCK();
    c->phase_s[SPARSE_PH_Q] += t1 - t0;
    t0 = t1;
    /* 4. attention of the selected pairs (flash tiles), o, og = gate * o, lse */
#pragma omp parallel for schedule(dynamic, 1) num_threads(c->nthreads)
    for (int ti = 0; ti < c->ntasks; ti++) {
        sp_tws w = tws_get(c, cfg, omp_get_thread_num());
        attn_fwd_tile(cfg, c, c->tasks + 4 * ti, N, &w);
    }
    t1 = SP_CLOCK();
    c->phase_s[SPARSE_PH_ATTN] += t1 - t0;
    t0 = t1;
    /* 5. y = b_o + sum_i og_i W_O^i, per token chunk, heads in order (W_O^i packed [d, 64] per
     *    column block) */
#pragma omp parallel for schedule(static) num_threads(c->nthreads)
    for (int i = 0; i < h; i++)
        for (int cb = 0; cb < ncb; cb++)
            for (int e = 0; e < d; e++)
                for (int jj = 0; jj < SP_NR; jj++) {
                    const int col = cb * SP_NR + jj;
                    c->wpack2[(((size_t)i * ncb + cb) * d + e) * SP_NR + jj] =
                        col < C ? prm->w_o[(size_t)col * hd + (size_t)i * d + e] : 0.0f;
                }
    const int nch = (N + SP_TC - 1) / SP_TC;
#pragma omp parallel for schedule(dynamic, 1) num_threads(c->nthreads)
    for (int task = 0; task < B * nch; task++) {
        sp_tws w = tws_get(c, cfg, omp_get_thread_num());
        const int b = task / nch, n0 = (task % nch) * SP_TC, n1 = imin(N, n0 + SP_TC);
        for (int n = n0; n < n1; n++) {
            float *yr = y + ((size_t)b * N + n) * C;
            if (prm->b_o) memcpy(yr, prm->b_o, sizeof(float) * C);
            else memset(yr, 0, sizeof(float) * C);
        }
        for (int i = 0; i < h; i++) {
            const int off = c->pair_off[b * h + i], cnt = c->pair_off[b * h + i + 1] - off;
            const int *pp = c->pair_pos + off;
            const int lo = lower_bound(pp, cnt, n0), hi = lower_bound(pp, cnt, n1), m = hi - lo;
            if (m <= 0) continue;
            for (int r = 0; r < m; r++) {
                w.pa[r] = c->og + (size_t)(off + lo + r) * d;
                w.pc[r] = y + ((size_t)b * N + pp[lo + r]) * C;
            }
            for (int cb = 0; cb < ncb; cb++) {
                for (int e = 0; e < d; e++) w.pb[e] = c->wpack2 + (((size_t)i * ncb + cb) * d + e) * SP_NR;
                sp_mm(avx, 0, m, imin(SP_NR, C - cb * SP_NR), d, w.pa, 0, w.pb, 0, w.pc, (long)cb * SP_NR, true);
            }
        }
    }
    c->phase_s[SPARSE_PH_WO] += SP_CLOCK() - t0;
}

/* ------------------------------------------------------------------------------------------------
 * Backward
 * ---------------------------------------------------------------------------------------------- */

/* First key tile of part p out of np (part p covers [bound(p), bound(p + 1))). Bidirectional:
 * equal tile counts; causal: balanced by the queries at or after each tile (~ N - j0). */
static int part_bound(const moh_attn_config *cfg, int N, int p, int np) {
    const int nkt = sp_nkt(N);
    if (p <= 0) return 0;
    if (p >= np) return nkt;
    if (!cfg->causal) return (int)((long)nkt * p / np);
    double total = 0.0;
    for (int kt = 0; kt < nkt; kt++) total += N - kt * SPARSE_BK;
    const double target = total * p / np;
    double acc = 0.0;
    int kt = 0;
    while (kt < nkt && acc + 0.5 * (N - kt * SPARSE_BK) < target) acc += N - (kt++) * SPARSE_BK;
    return kt;
}

/* dK, dV of key tiles [kt0, kt1) of KV head g in batch row b, and the matching part of dQ of every
 * query head of the group (into dq, a [P, d] buffer of this part). */
static void attn_bwd_part(const moh_attn_config *cfg, sparse_cache *c, int b, int g, int kt0,
                          int kt1, float *dq, int N, sp_tws *w) {
    const int h = cfg->n_heads, hkv = cfg->n_kv_heads, d = cfg->head_dim, grp = h / hkv;
    const int nkt = sp_nkt(N), dp = sp_dpad(cfg);
    const float scale = (float)(1.0 / sqrt((double)d));
    const float cl2 = (float)(1.4426950408889634 / sqrt((double)d));
    const size_t hb = (size_t)b * hkv + g;
    const bool avx = c->avx512;
    float *dkrow[SPARSE_BK], *dvrow[SPARSE_BK];
    for (int j = 0; j < SPARSE_BK; j++) {
        dkrow[j] = w->dkt + (size_t)j * dp;
        dvrow[j] = w->dvt + (size_t)j * dp;
    }
    for (int kt = kt0; kt < kt1; kt++) {
        const int j0 = kt * SPARSE_BK, nk = imin(SPARSE_BK, N - j0);
        const float *ktile = c->kt + (hb * nkt + kt) * d * SPARSE_BK;
        const float *vtile = c->vt + (hb * nkt + kt) * d * SPARSE_BK;
        for (int e = 0; e < d; e++) {
            w->pb[e] = ktile + (size_t)e * SPARSE_BK;
            w->pb2[e] = vtile + (size_t)e * SPARSE_BK;
        }
        for (int j = 0; j < nk; j++) {
            w->pb3[j] = c->kh + (hb * N + j0 + j) * d;
            memset(dkrow[j], 0, sizeof(float) * (size_t)d);
            memset(dvrow[j], 0, sizeof(float) * (size_t)d);
        }
        for (int i = g * grp; i < (g + 1) * grp; i++) {
            const int off = c->pair_off[b * h + i], cnt = c->pair_off[b * h + i + 1] - off;
            const int *pos = c->pair_pos + off;
            const int first = cfg->causal ? lower_bound(pos, cnt, j0) : 0;
            for (int rb = first; rb < cnt; rb += SPARSE_BQ) {
                const int nr = imin(SPARSE_BQ, cnt - rb), p0 = off + rb;
                for (int r = 0; r < nr; r++) {
                    w->pa[r] = c->q + (size_t)(p0 + r) * d;
                    w->pa2[r] = c->dout + (size_t)(p0 + r) * d;
                    w->pc[r] = dq + (size_t)(p0 + r) * d;
                    w->nv[r] = cfg->causal ? imin(nk, pos[rb + r] - j0 + 1) : nk;
                }
                /* S = Q K^T, dP = dO V^T, then P and dS in place */
                sp_mm(avx, 0, nr, nk, d, w->pa, 0, w->pb, 0, w->sc, 0, false);
                sp_mm(avx, 0, nr, nk, d, w->pa2, 0, w->pb2, 0, w->dsc, 0, false);
                bwd_ds(avx, nr, nk, w->sc, w->dsc, w->nv, cl2, scale, c->smax + p0, c->lse + p0, c->ddot + p0);
                /* dV += P^T dO, dK += dS^T Q (A transposed: one pointer per query row) */
                sp_mm(avx, 1, nk, d, nr, w->sa, 0, w->pa2, 0, dvrow, 0, true);
                sp_mm(avx, 1, nk, d, nr, w->dsa, 0, w->pa, 0, dkrow, 0, true);
                /* dQ += dS K */
                sp_mm(avx, 0, nr, d, nk, w->dsa, 0, w->pb3, 0, w->pc, 0, true);
            }
        }
        for (int j = 0; j < nk; j++) {
            memcpy(c->dkh + (hb * N + j0 + j) * d, dkrow[j], sizeof(float) * (size_t)d);
            memcpy(c->dvh + (hb * N + j0 + j) * d, dvrow[j], sizeof(float) * (size_t)d);
        }
    }
}

void sparse_backward_f32(const moh_attn_config *cfg, const attn_params_f32 *prm,
                         const attn_params_f32 *g, sparse_cache *c, const float *dy,
                         float lb_scale, float *dx) {
    const int C = cfg->hidden_size, h = cfg->n_heads, hkv = cfg->n_kv_heads, d = cfg->head_dim;
    const int B = c->B, N = c->N, T = B * N, hd = h * d, kvd = hkv * d, qd = attn_qkv_dim(cfg);
    const int ncb = sp_ncb(cfg), nkt = sp_nkt(N), P = c->pair_off[B * h];
    const bool qnorm = cfg->router == MOH_ROUTER_QUERY_NORM, rope = cfg->rope_theta > 0;
    const bool avx = c->avx512;
    const float *x = c->x;
    double t0 = SP_CLOCK(), t1;
    /* 1. b_o, and W_O^i as [C, d] blocks (for d og = dy W_O^i) */
    if (g->b_o) linear_backward_f32(NULL, NULL, g->b_o, dy, NULL, NULL, T, 0, C);
#pragma omp parallel for schedule(static) num_threads(c->nthreads)
    for (int i = 0; i < h; i++)
        for (int k = 0; k < C; k++)
            memcpy(c->wpack1 + ((size_t)i * C + k) * d, prm->w_o + (size_t)k * hd + (size_t)i * d, sizeof(float) * d);
    /* 2. per pair: d og = dy W_O^i; dgate = <d og, o>; dO = gate d og; D = <dO, o> */
    memset(c->dgates, 0, sizeof(float) * (size_t)T * h);
#pragma omp parallel for schedule(dynamic, 1) num_threads(c->nthreads)
    for (int ti = 0; ti < c->ntasks; ti++) {
        sp_tws w = tws_get(c, cfg, omp_get_thread_num());
        const int *tk = c->tasks + 4 * ti;
        const int b = tk[0], i = tk[1], r0 = tk[2];
        const int off = c->pair_off[b * h + i], cnt = c->pair_off[b * h + i + 1] - off;
        const int nr = imin(SPARSE_BQ, cnt - r0), p0 = off + r0;
        for (int r = 0; r < nr; r++) {
            w.pa[r] = dy + ((size_t)b * N + c->pair_pos[p0 + r]) * C;
            w.pc[r] = c->dout + (size_t)(p0 + r) * d;
        }
        for (int k = 0; k < C; k++) w.pb[k] = c->wpack1 + ((size_t)i * C + k) * d;
        sp_mm(avx, 0, nr, d, C, w.pa, 0, w.pb, 0, w.pc, 0, false);
        for (int r = 0; r < nr; r++) {
            const size_t t = (size_t)b * N + c->pair_pos[p0 + r];
            const float gate = c->rc.gates[t * h + i];
            float *dor = w.pc[r];
            const float *orow = c->o + (size_t)(p0 + r) * d;
            float dg = 0.0f, dd = 0.0f;
            for (int e = 0; e < d; e++) { /* D with the kernels' fused multiply-adds in e order: */
                dg += dor[e] * orow[e];      /* when o equals a value row exactly (one key), */
                dor[e] *= gate;              /* dP - D is exactly 0, as in exact arithmetic */
                dd = fmaf(dor[e], orow[e], dd);
            }
            c->dgates[t * h + i] = dg;
            c->ddot[p0 + r] = dd;
        }
    }
    /* 3. dW_O^i [C, d] += sum over the head's pairs of dy^T og (tasks: head x row block) */
    const int ncr = (C + SP_CB - 1) / SP_CB;
    if (g->w_o) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(c->nthreads)
        for (int task = 0; task < h * ncr; task++) {
            sp_tws w = tws_get(c, cfg, omp_get_thread_num());
            const int i = task / ncr, c0 = (task % ncr) * SP_CB, nc = imin(SP_CB, C - c0);
            for (int r = 0; r < nc; r++) w.pc[r] = g->w_o + (size_t)(c0 + r) * hd + (size_t)i * d;
            for (int b = 0; b < B; b++) {
                const int off = c->pair_off[b * h + i], cnt = c->pair_off[b * h + i + 1] - off;
                for (int k0 = 0; k0 < cnt; k0 += SP_KC) {
                    const int kk = imin(SP_KC, cnt - k0);
                    for (int k = 0; k < kk; k++) {
                        w.pa[k] = dy + ((size_t)b * N + c->pair_pos[off + k0 + k]) * C;
                        w.pb[k] = c->og + (size_t)(off + k0 + k) * d;
                    }
                    sp_mm(avx, 1, nc, d, kk, w.pa, c0, w.pb, 0, w.pc, 0, true);
                }
            }
        }
    }
    t1 = SP_CLOCK();
    c->phase_s[SPARSE_PH_B_WO] += t1 - t0;
    t0 = t1;
    /* 4. V^T tiles, then the attention backward per (b, KV head, key part) */
    {
        const int ntask = B * hkv * nkt;
#pragma omp parallel for schedule(static) num_threads(c->nthreads)
        for (int task = 0; task < ntask; task++) {
            const int b = task / (hkv * nkt), gg = (task / nkt) % hkv, kt = task % nkt;
            const int j0 = kt * SPARSE_BK, nk = imin(SPARSE_BK, N - j0);
            const size_t hb = (size_t)b * hkv + gg;
            float *vtile = c->vt + (hb * nkt + kt) * d * SPARSE_BK;
            for (int jj = 0; jj < nk; jj++)
                for (int e = 0; e < d; e++) vtile[(size_t)e * SPARSE_BK + jj] = c->vh[(hb * N + j0 + jj) * d + e];
        }
    }
    const size_t capP = (size_t)c->maxB * c->maxN * sparse_active_heads(cfg);
    int np = sp_nparts(cfg, B, N);
    if ((size_t)np * P > (size_t)c->nparts * capP) np = (int)((size_t)c->nparts * capP / (P ? P : 1));
    np = imax(np, 1);
    memset(c->dq, 0, sizeof(float) * (size_t)np * P * d);
    {
        const int ntask = B * hkv * np;
#pragma omp parallel for schedule(dynamic, 1) num_threads(c->nthreads)
        for (int task = 0; task < ntask; task++) {
            sp_tws w = tws_get(c, cfg, omp_get_thread_num());
            /* part-major order: with causal parts balanced, every part costs about the same */
            const int part = task / (B * hkv), bg = task % (B * hkv);
            const int kt0 = part_bound(cfg, N, part, np), kt1 = part_bound(cfg, N, part + 1, np);
            attn_bwd_part(cfg, c, bg / hkv, bg % hkv, kt0, kt1, c->dq + (size_t)part * P * d, N, &w);
        }
    }
    /* 5. dQ = sum of the parts (in part order), inverse RoPE; dK inverse RoPE; dK|dV rows */
#pragma omp parallel for schedule(static) num_threads(c->nthreads)
    for (int p = 0; p < P; p++) {
        float *dr = c->dq + (size_t)p * d;
        for (int part = 1; part < np; part++) {
            const float *src = c->dq + ((size_t)part * P + p) * d;
            for (int e = 0; e < d; e++) dr[e] += src[e];
        }
        if (rope) rope_row(dr, c, c->pair_pos[p], d, -1);
    }
    float *dkv = qnorm ? c->dqkv : c->kv;
    const int ldk = qnorm ? qd : 2 * kvd, koff = qnorm ? hd : 0, voff = qnorm ? hd + kvd : kvd;
    if (qnorm) memset(c->dqkv, 0, sizeof(float) * (size_t)T * qd);
#pragma omp parallel for schedule(static) num_threads(c->nthreads)
    for (int t = 0; t < T; t++) {
        const int b = t / N, n = t % N;
        for (int gg = 0; gg < hkv; gg++) {
            const size_t src = (((size_t)b * hkv + gg) * N + n) * d;
            float *kr = dkv + (size_t)t * ldk + koff + (size_t)gg * d;
            float *vr = dkv + (size_t)t * ldk + voff + (size_t)gg * d;
            memcpy(kr, c->dkh + src, sizeof(float) * d);
            memcpy(vr, c->dvh + src, sizeof(float) * d);
            if (rope) rope_row(kr, c, n, d, -1);
        }
    }
    t1 = SP_CLOCK();
    c->phase_s[SPARSE_PH_B_ATTN] += t1 - t0;
    t0 = t1;
    /* 6. projections */
    if (qnorm) {
        /* dense q: scatter dQ into the q columns, add the router's d q, one dense backward */
#pragma omp parallel for schedule(static) num_threads(c->nthreads)
        for (int bi = 0; bi < B * h; bi++) {
            const int b = bi / h, i = bi % h;
            for (int p = c->pair_off[bi]; p < c->pair_off[bi + 1]; p++)
                memcpy(c->dqkv + ((size_t)b * N + c->pair_pos[p]) * qd + (size_t)i * d, c->dq + (size_t)p * d, sizeof(float) * d);
        }
        router_backward_f32(cfg, prm, g, &c->rc, c->dgates, lb_scale, dx, c->dqkv, T);
        t1 = SP_CLOCK();
        c->phase_s[SPARSE_PH_B_ROUTER] += t1 - t0;
        t0 = t1;
        linear_backward_f32(dx, g->w_qkv, g->b_qkv, c->dqkv, x, prm->w_qkv, T, C, qd);
        c->phase_s[SPARSE_PH_B_KV] += SP_CLOCK() - t0;
        return;
    }
    linear_backward_f32(dx, g->w_qkv ? g->w_qkv + (size_t)hd * C : NULL, g->b_qkv ? g->b_qkv + hd : NULL,
                        c->kv, x, prm->w_qkv + (size_t)hd * C, T, C, 2 * kvd);
    t1 = SP_CLOCK();
    c->phase_s[SPARSE_PH_B_KV] += t1 - t0;
    t0 = t1;
    if (g->b_qkv) {
#pragma omp parallel for schedule(static) num_threads(c->nthreads)
        for (int i = 0; i < h; i++)
            for (int b = 0; b < B; b++)
                for (int p = c->pair_off[b * h + i]; p < c->pair_off[b * h + i + 1]; p++)
                    for (int e = 0; e < d; e++) g->b_qkv[i * d + e] += c->dq[(size_t)p * d + e];
    }
    if (dx) { /* dx += dQ_i W_q^i, per token chunk, heads in order (W_q^i packed [d, 64] blocks) */
#pragma omp parallel for schedule(static) num_threads(c->nthreads)
        for (int i = 0; i < h; i++)
            for (int cb = 0; cb < ncb; cb++)
                for (int e = 0; e < d; e++)
                    for (int jj = 0; jj < SP_NR; jj++) {
                        const int col = cb * SP_NR + jj;
                        c->wpack2[(((size_t)i * ncb + cb) * d + e) * SP_NR + jj] =
                            col < C ? prm->w_qkv[((size_t)i * d + e) * C + col] : 0.0f;
                    }
        const int nch = (N + SP_TC - 1) / SP_TC;
#pragma omp parallel for schedule(dynamic, 1) num_threads(c->nthreads)
        for (int task = 0; task < B * nch; task++) {
            sp_tws w = tws_get(c, cfg, omp_get_thread_num());
            const int b = task / nch, n0 = (task % nch) * SP_TC, n1 = imin(N, n0 + SP_TC);
            for (int i = 0; i < h; i++) {
                const int off = c->pair_off[b * h + i], cnt = c->pair_off[b * h + i + 1] - off;
                const int *pp = c->pair_pos + off;
                const int lo = lower_bound(pp, cnt, n0), hi = lower_bound(pp, cnt, n1), m = hi - lo;
                if (m <= 0) continue;
                for (int r = 0; r < m; r++) {
                    w.pa[r] = c->dq + (size_t)(off + lo + r) * d;
                    w.pc[r] = dx + ((size_t)b * N + pp[lo + r]) * C;
                }
                for (int cb = 0; cb < ncb; cb++) {
                    for (int e = 0; e < d; e++) w.pb[e] = c->wpack2 + (((size_t)i * ncb + cb) * d + e) * SP_NR;
                    sp_mm(avx, 0, m, imin(SP_NR, C - cb * SP_NR), d, w.pa, 0, w.pb, 0, w.pc, (long)cb * SP_NR, true);
                }
            }
        }
    }
    if (g->w_qkv) { /* dW_q^i [d, C] += dQ_i^T x (tasks: head x column block) */
#pragma omp parallel for schedule(dynamic, 1) num_threads(c->nthreads)
        for (int task = 0; task < h * ncb; task++) {
            sp_tws w = tws_get(c, cfg, omp_get_thread_num());
            const int i = task / ncb, c0 = (task % ncb) * SP_NR, nc = imin(SP_NR, C - c0);
            for (int r = 0; r < d; r++) w.pc[r] = g->w_qkv + ((size_t)i * d + r) * C + c0;
            for (int b = 0; b < B; b++) {
                const int off = c->pair_off[b * h + i], cnt = c->pair_off[b * h + i + 1] - off;
                for (int k0 = 0; k0 < cnt; k0 += SP_KC) {
                    const int kk = imin(SP_KC, cnt - k0);
                    for (int k = 0; k < kk; k++) {
                        w.pa[k] = c->dq + (size_t)(off + k0 + k) * d;
                        w.pb[k] = x + ((size_t)b * N + c->pair_pos[off + k0 + k]) * C + c0;
                    }
                    sp_mm(avx, 1, d, nc, kk, w.pa, 0, w.pb, 0, w.pc, 0, true);
                }
            }
        }
    }
    t1 = SP_CLOCK();
    c->phase_s[SPARSE_PH_B_Q] += t1 - t0;
    t0 = t1;
    router_backward_f32(cfg, prm, g, &c->rc, c->dgates, lb_scale, dx, NULL, T);
    c->phase_s[SPARSE_PH_B_ROUTER] += SP_CLOCK() - t0;
}

const char *sparse_phase_name(int i) {
    static const char *const names[SPARSE_NPHASE] = {"router", "kv_gemm", "q_gather_gemm", "attention",
                                                     "wo_scatter", "bwd_wo", "bwd_attention", "bwd_kv_gemm",
                                                     "bwd_q", "bwd_router"};
    return i >= 0 && i < SPARSE_NPHASE ? names[i] : "?";
}

long sparse_pairs(const moh_attn_config *cfg, const sparse_cache *c) {
    return c->pair_off ? c->pair_off[c->B * cfg->n_heads] : 0;
}

double sparse_key_visits(const moh_attn_config *cfg, const sparse_cache *c) {
    const int h = cfg->n_heads, P = c->pair_off[c->B * h];
    if (!cfg->causal) return (double)P * c->N;
    double v = 0.0;
    for (int p = 0; p < P; p++) v += c->pair_pos[p] + 1.0;
    return v;
}
