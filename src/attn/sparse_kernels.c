/* Head-sparse attention kernels, float32 (see sparse_kernels.h): the register-tile product, the
 * softmax tiles of the flash forward / backward, and the one-query decode. No threading, no
 * timers, no cache bookkeeping: every function works on the slice its caller hands it. */
#include "attn/sparse_kernels.h"

#include "ops/bf16.h"

#include <float.h>
#include <math.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define SP_X86 1
#define SP_AVX512 __attribute__((target("avx512f,avx512dq,fma")))
#define SP_INLINE static inline __attribute__((always_inline))
#else
#define SP_X86 0
#endif

#define SP_PF_KEYS 32 /* decode: keys ahead that are prefetched (the hardware prefetcher alone
                       * leaves the K and V streams at a quarter of the memory bandwidth) */
#define SP_LAZY 8.0f /* log2 units the running max may lag behind the true max */

/* exp2 on [-0.5, 0.5]: degree-6 least-max-relative-error fit, 1.1e-7 relative in float. */
#define SP_E0 1.0f
#define SP_E1 0.6931471824645996f
#define SP_E2 0.24022646248340607f
#define SP_E3 0.05550328642129898f
#define SP_E4 0.009618489071726799f
#define SP_E5 0.0013399930903688073f
#define SP_E6 0.0001534581242594868f

static inline int imin(int a, int b) { return a < b ? a : b; }

#if SP_X86
/* AVX2 + FMA (CPUs without AVX-512): 8-lane helpers. */
#define SP_AVX2 __attribute__((target("avx2,fma")))

static bool cpu_avx2_fma(void) { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }

/* Lanes 0 .. lanes-1 set (maskload / maskstore mask). */
SP_INLINE SP_AVX2 __m256i lanes8(int lanes) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(lanes), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
/* Lane i = horizontal sum of v[i], i < 8. */
SP_INLINE SP_AVX2 __m256 hsum8(const __m256 *v) {
    const __m256 a0 = _mm256_hadd_ps(v[0], v[1]), a1 = _mm256_hadd_ps(v[2], v[3]);
    const __m256 a2 = _mm256_hadd_ps(v[4], v[5]), a3 = _mm256_hadd_ps(v[6], v[7]);
    const __m256 b0 = _mm256_hadd_ps(a0, a1), b1 = _mm256_hadd_ps(a2, a3); /* per 128 bits: 0 1 2 3 | 4 5 6 7 */
    return _mm256_add_ps(_mm256_permute2f128_ps(b0, b1, 0x20), _mm256_permute2f128_ps(b0, b1, 0x31));
}
/* 2^x for x <= 127 (the SP_E* polynomial on the fraction, the exponent added to the bits);
 * x < -126 gives 0. */
SP_INLINE SP_AVX2 __m256 exp2_avx2(__m256 x) {
    const __m256 ok = _mm256_cmp_ps(x, _mm256_set1_ps(-126.0f), _CMP_GE_OQ);
    x = _mm256_max_ps(x, _mm256_set1_ps(-126.0f));
    const __m256 n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256 f = _mm256_sub_ps(x, n);
    __m256 p = _mm256_set1_ps(SP_E6);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(SP_E5));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(SP_E4));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(SP_E3));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(SP_E2));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(SP_E1));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(SP_E0));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), ok);
}

#endif

int sp_vec_detect(void) {
#if SP_X86
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq")) return SP_VEC_AVX512;
    if (cpu_avx2_fma()) return SP_VEC_AVX2;
#endif
    return SP_VEC_PORTABLE;
}

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

#if SP_X86
/* The register tile on AVX2: R <= 6 rows x NV <= 2 vectors of 8 (12 accumulators of the 16 ymm
 * registers), the last vector's lanes in lm; the same FMA chain per element as mk_ref. */
SP_INLINE SP_AVX2 void mk_avx2(const int R, const int NV, const int amode, const __m256i lm, const int K,
                               const float *const *a, const long aoff, const float *const *b, const long boff,
                               float *const *c, const long coff, const bool acc) {
    __m256 t[SP_MR][2];
    const float *ar[SP_MR];
#pragma GCC unroll 6
    for (int r = 0; r < R; r++) {
        ar[r] = amode ? NULL : a[r] + aoff;
#pragma GCC unroll 2
        for (int v = 0; v < NV; v++) {
            const float *cp = c[r] + coff + 8 * v;
            t[r][v] = !acc ? _mm256_setzero_ps() : (v == NV - 1 ? _mm256_maskload_ps(cp, lm) : _mm256_loadu_ps(cp));
        }
    }
    for (int k = 0; k < K; k++) {
        const float *bk = b[k] + boff;
        __m256 bv[2];
#pragma GCC unroll 2
        for (int v = 0; v < NV; v++) bv[v] = v == NV - 1 ? _mm256_maskload_ps(bk + 8 * v, lm) : _mm256_loadu_ps(bk + 8 * v);
        const float *ak = amode ? a[k] + aoff : NULL;
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            const __m256 av = _mm256_set1_ps(amode ? ak[r] : ar[r][k]);
#pragma GCC unroll 2
            for (int v = 0; v < NV; v++) t[r][v] = _mm256_fmadd_ps(av, bv[v], t[r][v]);
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < R; r++)
#pragma GCC unroll 2
        for (int v = 0; v < NV; v++) {
            float *cp = c[r] + coff + 8 * v;
            if (v == NV - 1) _mm256_maskstore_ps(cp, lm, t[r][v]);
            else _mm256_storeu_ps(cp, t[r][v]);
        }
}

#define SP_CASE2(M, R_, V)                                                                                   \
    case ((M) * 8 + (R_)) * 2 + (V) - 1:                                                                     \
        mk_avx2(R_, V, M, lm, K, a, aoff, b, boff + j0, c, coff + j0, acc);                                  \
        break;
#define SP_CASES2_R(M, R_) SP_CASE2(M, R_, 1) SP_CASE2(M, R_, 2)
#define SP_CASES2_M(M)                                                                                       \
    SP_CASES2_R(M, 1) SP_CASES2_R(M, 2) SP_CASES2_R(M, 3) SP_CASES2_R(M, 4) SP_CASES2_R(M, 5) SP_CASES2_R(M, 6)

/* R <= 6 rows x n <= 64 columns in column blocks of 16. */
SP_AVX2 static void mk_avx2_any(int R, int n, int amode, int K, const float *const *a, long aoff,
                                const float *const *b, long boff, float *const *c, long coff, bool acc) {
    for (int j0 = 0; j0 < n; j0 += 16) {
        const int nn = imin(16, n - j0), NV = (nn + 7) >> 3;
        const __m256i lm = lanes8(nn - 8 * (NV - 1));
        switch (((amode ? 1 : 0) * 8 + R) * 2 + NV - 1) {
            SP_CASES2_M(0)
            SP_CASES2_M(1)
        default: break;
        }
    }
}
#undef SP_CASE2
#undef SP_CASES2_R
#undef SP_CASES2_M
#endif

void sp_mm(int vec, int amode, int M, int n, int K, const float *const *a, long aoff,
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
            if (vec == SP_VEC_AVX512) {
                mk_avx_any(R, nn, amode, K, ap, ao, b, boff + j0, c + r0, coff + j0, acc);
                continue;
            }
            if (vec == SP_VEC_AVX2) {
                mk_avx2_any(R, nn, amode, K, ap, ao, b, boff + j0, c + r0, coff + j0, acc);
                continue;
            }
#endif
            mk_ref(R, nn, amode, K, ap, ao, b, boff + j0, c + r0, coff + j0, acc);
        }
    }
}

/* ------------------------------------------------------------------------------------------------
 * bf16 register tiles: C(r, j) (+)= sum_k A(r, k) B(k, j), A rows of bf16 pairs, B pair-interleaved;
 * vdpbf16ps multiplies the pairs exactly and accumulates in fp32.
 * ---------------------------------------------------------------------------------------------- */

static void mkb_ref(int R, int n, int K2, const uint16_t *const *a, const uint16_t *b, long ldb,
                    float *const *c, bool acc) {
    for (int r = 0; r < R; r++) {
        const uint16_t *ar = a[r];
        for (int j = 0; j < n; j++) {
            float s = acc ? c[r][j] : 0.0f;
            for (int k = 0; k < K2; k++) {
                const uint16_t *bk = b + (long)k * ldb + 2 * j;
                s += bf16_value(ar[2 * k]) * bf16_value(bk[0]) + bf16_value(ar[2 * k + 1]) * bf16_value(bk[1]);
            }
            c[r][j] = s;
        }
    }
}

#if SP_X86
#define SP_BF16 __attribute__((target("avx512bf16,avx512f,avx512bw,avx512vl")))
SP_INLINE SP_BF16 void mkb_avx(const int R, const int NV, const __mmask16 lm, const int K2,
                               const uint16_t *const *a, const uint16_t *b, const long ldb,
                               float *const *c, const long coff, const bool acc) {
    __m512 t[SP_MR][4];
#pragma GCC unroll 6
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) {
            const float *cp = c[r] + coff + 16 * v;
            t[r][v] = !acc ? _mm512_setzero_ps()
                           : (v == NV - 1 ? _mm512_maskz_loadu_ps(lm, cp) : _mm512_loadu_ps(cp));
        }
    for (int k = 0; k < K2; k++) {
        const uint16_t *bk = b + (long)k * ldb + 2 * coff;
        __m512bh bv[4];
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++)
            bv[v] = (__m512bh)(v == NV - 1 ? _mm512_maskz_loadu_epi32(lm, bk + 32 * v)
                                           : _mm512_loadu_si512((const void *)(bk + 32 * v)));
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            int32_t pair;
            memcpy(&pair, a[r] + 2 * k, sizeof pair);
            const __m512bh av = (__m512bh)_mm512_set1_epi32(pair);
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++) t[r][v] = _mm512_dpbf16_ps(t[r][v], av, bv[v]);
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

#define SPB_CASE(R_, V)                                                                    \
    case (R_) * 4 + (V) - 1:                                                               \
        mkb_avx(R_, V, lm, K2, a, b, ldb, c, coff, acc);                                   \
        break;
#define SPB_CASES_R(R_) SPB_CASE(R_, 1) SPB_CASE(R_, 2) SPB_CASE(R_, 3) SPB_CASE(R_, 4)

SP_BF16 static void mkb_avx_any(int R, int n, int K2, const uint16_t *const *a, const uint16_t *b, long ldb,
                                float *const *c, long coff, bool acc) {
    const int NV = (n + 15) >> 4;
    const __mmask16 lm = (n & 15) ? (__mmask16)((1u << (n & 15)) - 1u) : (__mmask16)0xFFFF;
    switch (R * 4 + NV - 1) {
        SPB_CASES_R(1) SPB_CASES_R(2) SPB_CASES_R(3) SPB_CASES_R(4) SPB_CASES_R(5) SPB_CASES_R(6)
    default: break;
    }
}
#undef SPB_CASE
#undef SPB_CASES_R
#endif

#if SP_X86
SP_BF16 static void row_pairs_avx(int R, int n, const float *const *rows, uint16_t *dst, long ldd) {
    /* vpermw index: [a0 b0 a1 b1 ...] from [a0..a15 b0..b15] */
    const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                         21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    for (int r = 0; r < R; r += 2) {
        const float *a = rows[r], *b = r + 1 < R ? rows[r + 1] : NULL;
        uint16_t *o = dst + (long)(r / 2) * ldd;
        for (int j = 0; j < n; j += 16) {
            const int m = n - j < 16 ? n - j : 16;
            const __mmask16 lm = (__mmask16)((1u << m) - 1u);
            const __m512 va = _mm512_maskz_loadu_ps(lm, a + j);
            const __m512 vb = b ? _mm512_maskz_loadu_ps(lm, b + j) : _mm512_setzero_ps();
            const __m512i v = _mm512_permutexvar_epi16(idx, (__m512i)_mm512_cvtne2ps_pbh(vb, va));
            _mm512_mask_storeu_epi32(o + 2 * j, lm, v);
        }
    }
}
#endif

void sp_bf16_row_pairs(bool avx512bf16, int R, int n, const float *const *rows, uint16_t *dst, long ldd) {
#if SP_X86
    if (avx512bf16) {
        row_pairs_avx(R, n, rows, dst, ldd);
        return;
    }
#endif
    for (int r = 0; r < R + (R & 1); r++)
        for (int j = 0; j < n; j++) dst[(long)(r / 2) * ldd + 2 * j + (r & 1)] = r < R ? bf16_round(rows[r][j]) : 0;
}

#if SP_X86
SP_BF16 static void row_pairs16_avx(int R, int n, const uint16_t *const *rows, uint16_t *dst, long ldd) {
    __m512i lo_idx, hi_idx; /* [a0 b0 a1 b1 ...] from a (0..31) and b (32..63) */
    uint16_t il[32], ih[32];
    for (int q = 0; q < 16; q++) {
        il[2 * q] = (uint16_t)q, il[2 * q + 1] = (uint16_t)(32 + q);
        ih[2 * q] = (uint16_t)(16 + q), ih[2 * q + 1] = (uint16_t)(48 + q);
    }
    lo_idx = _mm512_loadu_si512((const void *)il);
    hi_idx = _mm512_loadu_si512((const void *)ih);
    for (int r = 0; r < R; r += 2) {
        const uint16_t *a = rows[r], *b = r + 1 < R ? rows[r + 1] : NULL;
        uint16_t *o = dst + (long)(r / 2) * ldd;
        for (int j = 0; j < n; j += 32) {
            const int m = n - j < 32 ? n - j : 32;
            const __mmask32 lm = m == 32 ? 0xFFFFFFFFu : (__mmask32)((1u << m) - 1u);
            const __m512i va = _mm512_maskz_loadu_epi16(lm, a + j);
            const __m512i vb = b ? _mm512_maskz_loadu_epi16(lm, b + j) : _mm512_setzero_si512();
            const int m0 = m < 16 ? m : 16, m1 = m - m0;
            const __mmask32 s0 = m0 == 16 ? 0xFFFFFFFFu : (__mmask32)((1u << (2 * m0)) - 1u);
            _mm512_mask_storeu_epi16(o + 2 * j, s0, _mm512_permutex2var_epi16(va, lo_idx, vb));
            if (m1 > 0) {
                const __mmask32 s1 = m1 == 16 ? 0xFFFFFFFFu : (__mmask32)((1u << (2 * m1)) - 1u);
                _mm512_mask_storeu_epi16(o + 2 * j + 32, s1, _mm512_permutex2var_epi16(va, hi_idx, vb));
            }
        }
    }
}
#endif

void sp_bf16_row_pairs16(bool avx512bf16, int R, int n, const uint16_t *const *rows, uint16_t *dst, long ldd) {
#if SP_X86
    if (avx512bf16) {
        row_pairs16_avx(R, n, rows, dst, ldd);
        return;
    }
#endif
    for (int r = 0; r < R + (R & 1); r++)
        for (int j = 0; j < n; j++) dst[(long)(r / 2) * ldd + 2 * j + (r & 1)] = r < R ? rows[r][j] : 0;
}

#if SP_X86
SP_BF16 static void transpose_bf16_avx(int R, int n, const float *src, long lds, uint16_t *dst, long ldd) {
    const __m512i step = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                            _mm512_set1_epi32((int)lds));
    for (int r0 = 0; r0 < R; r0 += 16) {
        const int m = R - r0 < 16 ? R - r0 : 16;
        const __mmask16 lm = (__mmask16)((1u << m) - 1u);
        const float *s0 = src + (long)r0 * lds;
        for (int j = 0; j < n; j++) {
            const __m512 v = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), lm, step, s0 + j, 4);
            _mm256_mask_storeu_epi16(dst + (long)j * ldd + r0, lm, (__m256i)_mm512_cvtneps_pbh(v));
        }
    }
}
#endif

void sp_bf16_transpose(bool avx512bf16, int R, int n, const float *src, long lds, uint16_t *dst, long ldd) {
#if SP_X86
    if (avx512bf16 && (long)(R > 16 ? 16 : R) * lds < INT32_MAX) {
        transpose_bf16_avx(R, n, src, lds, dst, ldd);
        return;
    }
#endif
    for (int r = 0; r < R; r++)
        for (int j = 0; j < n; j++) dst[(long)j * ldd + r] = bf16_round(src[(long)r * lds + j]);
}

sp_tiles sp_tiles_detect(void) {
    const bf16_caps caps = bf16_detect();
    if (bf16_amx_tiles(&caps)) return SP_TILES_AMX;
    return caps.avx512_bf16 ? SP_TILES_DP : SP_TILES_PORTABLE;
}

const char *sp_tiles_name(sp_tiles isa) {
    static const char *const names[] = {"portable", "AVX512-BF16 vdpbf16ps", "AMX-BF16 tdpbf16ps",
                                        "AMX-BF16 (C emulation)"};
    return names[isa >= SP_TILES_PORTABLE && isa <= SP_TILES_AMX_EMU ? isa : SP_TILES_PORTABLE];
}

void sp_mm_bf16_rows(sp_tiles isa, int R, int n, int K2, const uint16_t *const *a, const uint16_t *b, long ldb,
                     float *const *c, bool acc) {
    if (R <= 0 || n <= 0) return;
    if (K2 <= 0) {
        if (!acc)
            for (int r = 0; r < R; r++) memset(c[r], 0, sizeof(float) * (size_t)n);
        return;
    }
    if (isa == SP_TILES_AMX || isa == SP_TILES_AMX_EMU) {
        sp_amx_mm_bf16(isa == SP_TILES_AMX_EMU, R, n, K2, a, NULL, 0, b, ldb, c, acc);
        return;
    }
#if SP_X86
    if (isa == SP_TILES_DP) {
        for (int j0 = 0; j0 < n; j0 += SP_NR)
            for (int r0 = 0; r0 < R; r0 += SP_MR)
                mkb_avx_any(imin(SP_MR, R - r0), imin(SP_NR, n - j0), K2, a + r0, b, ldb, c + r0, j0, acc);
        return;
    }
#endif
    mkb_ref(R, n, K2, a, b, ldb, c, acc);
}

void sp_mm_bf16(sp_tiles isa, int R, int n, int K2, const uint16_t *a, long lda, const uint16_t *b, long ldb,
                float *const *c, bool acc) {
    if (isa == SP_TILES_AMX || isa == SP_TILES_AMX_EMU) {
        sp_amx_mm_bf16(isa == SP_TILES_AMX_EMU, R, n, K2, NULL, a, lda, b, ldb, c, acc);
        return;
    }
    for (int r0 = 0; r0 < R; r0 += SP_MR) { /* row groups: the same tiles as one call over all rows */
        const uint16_t *ap[SP_MR];
        const int m = imin(SP_MR, R - r0);
        for (int r = 0; r < m; r++) ap[r] = a + (long)(r0 + r) * lda;
        sp_mm_bf16_rows(isa, m, n, K2, ap, b, ldb, c + r0, acc);
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

#if SP_X86
/* fwd_softmax_ref on AVX2: the 16 partial sums of a row as two vectors (even and odd vectors of
 * the row), lanes past nv[r] zero. */
SP_AVX2 static void fwd_softmax_avx2(int R, int nk, float *const *s, const int *nv, float cl2, float *m, float *l,
                                     float *const *o, int d) {
    const __m256 vc = _mm256_set1_ps(cl2);
    for (int r = 0; r < R; r++) {
        float *sr = s[r];
        const int v = imin(nv[r], nk);
        if (v <= 0) {
            for (int j = 0; j < nk; j++) sr[j] = 0.0f;
            continue;
        }
        __m256 vmax = _mm256_set1_ps(-INFINITY);
        int j = 0;
        for (; j + 8 <= v; j += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(sr + j));
        float lm8[8], mx;
        _mm256_storeu_ps(lm8, vmax);
        mx = lm8[0];
        for (int i = 1; i < 8; i++) mx = lm8[i] > mx ? lm8[i] : mx;
        for (; j < v; j++) mx = sr[j] > mx ? sr[j] : mx;
        if ((mx - m[r]) * cl2 > SP_LAZY) { /* the max moves */
            const float alpha = exp2f((m[r] - mx) * cl2);
            m[r] = mx;
            for (int q = 0; q < 16; q++) l[16 * r + q] *= alpha;
            for (int e = 0; e < d; e++) o[r][e] *= alpha;
        }
        const __m256 vm = _mm256_set1_ps(m[r]);
        __m256 lv[2] = {_mm256_loadu_ps(l + 16 * r), _mm256_loadu_ps(l + 16 * r + 8)};
        for (int q = 0; 8 * q < nk; q++) {
            const int j0 = 8 * q;
            const __m256i st = lanes8(nk - j0), ok = lanes8(v - j0);
            const __m256 sv = _mm256_maskload_ps(sr + j0, ok);
            /* s - m first (exact near the max), then scaled; lanes past nv[r] zero */
            const __m256 p = _mm256_and_ps(exp2_avx2(_mm256_mul_ps(_mm256_sub_ps(sv, vm), vc)), _mm256_castsi256_ps(ok));
            _mm256_maskstore_ps(sr + j0, st, p);
            lv[q & 1] = _mm256_add_ps(lv[q & 1], p);
        }
        _mm256_storeu_ps(l + 16 * r, lv[0]);
        _mm256_storeu_ps(l + 16 * r + 8, lv[1]);
    }
}

/* bwd_ds_ref on AVX2. */
SP_AVX2 static void bwd_ds_avx2(int R, int nk, float *const *s, float *const *dp, const int *nv, float cl2,
                                float scale, const float *smax, const float *lse, const float *D) {
    const __m256 vc = _mm256_set1_ps(cl2), vs = _mm256_set1_ps(scale);
    for (int r = 0; r < R; r++) {
        const int v = imin(nv[r], nk);
        const __m256 vm = _mm256_set1_ps(smax[r]), vl = _mm256_set1_ps(lse[r]), vd = _mm256_set1_ps(D[r]);
        for (int q = 0; q < nk; q += 8) {
            const __m256i st = lanes8(nk - q), ok = lanes8(v - q);
            const __m256 okf = _mm256_castsi256_ps(ok);
            const __m256 sv = _mm256_maskload_ps(s[r] + q, ok);
            const __m256 p = _mm256_and_ps(exp2_avx2(_mm256_fmsub_ps(_mm256_sub_ps(sv, vm), vc, vl)), okf);
            const __m256 dv = _mm256_maskload_ps(dp[r] + q, ok);
            const __m256 ds = _mm256_and_ps(_mm256_mul_ps(_mm256_mul_ps(p, _mm256_sub_ps(dv, vd)), vs), okf);
            _mm256_maskstore_ps(s[r] + q, st, p);
            _mm256_maskstore_ps(dp[r] + q, st, ds);
        }
    }
}
#endif

void sp_fwd_softmax(int vec, int R, int nk, float *const *s, const int *nv, float cl2, float *m,
                    float *l, float *const *o, int d) {
#if SP_X86
    if (vec == SP_VEC_AVX512) {
        fwd_softmax_avx(R, nk, s, nv, cl2, m, l, o, d);
        return;
    }
    if (vec == SP_VEC_AVX2) {
        fwd_softmax_avx2(R, nk, s, nv, cl2, m, l, o, d);
        return;
    }
#endif
    fwd_softmax_ref(R, nk, s, nv, cl2, m, l, o, d);
}

void sp_bwd_ds(int vec, int R, int nk, float *const *s, float *const *dp, const int *nv,
               float cl2, float scale, const float *smax, const float *lse, const float *D) {
#if SP_X86
    if (vec == SP_VEC_AVX512) {
        bwd_ds_avx(R, nk, s, dp, nv, cl2, scale, smax, lse, D);
        return;
    }
    if (vec == SP_VEC_AVX2) {
        bwd_ds_avx2(R, nk, s, dp, nv, cl2, scale, smax, lse, D);
        return;
    }
#endif
    bwd_ds_ref(R, nk, s, dp, nv, cl2, scale, smax, lse, D);
}

/* ------------------------------------------------------------------------------------------------
 * Decode: one query against the cached keys of one head
 * ---------------------------------------------------------------------------------------------- */

/* scores[0..n) raw, their max mx -> 2^((s - mx) cl2) in place; returns the sum. */
static float decode_exp_ref(float *scores, int n, float mx, float cl2) {
    float sum = 0.0f;
    for (int j = 0; j < n; j++) {
        scores[j] = exp2f((scores[j] - mx) * cl2);
        sum += scores[j];
    }
    return sum;
}

/* Key (value = false) or value (true) j, element e of a decode cache with row stride ld: fp32
 * rows (b16 = 0), or bf16 (b16 = 1: keys in rows, values pair-interleaved as
 * sparse_decode_attend_bf16 reads them). */
static inline float kv_at(const int b16, const void *P, long ld, int j, int e, bool value) {
    if (!b16) return ((const float *)P)[(size_t)j * ld + e];
    const uint16_t *h = P;
    return bf16_value(value ? h[(size_t)(j >> 1) * 2 * ld + 2 * (size_t)e + (j & 1)] : h[(size_t)j * ld + e]);
}

/* The portable decode of either cache (kv_at). */
static inline void decode_ref(const int b16, const float *q, const void *K, const void *V, long ld, int n, int d,
                              float gate, float *scores, float *out) {
    const float cl2 = (float)(1.4426950408889634 / sqrt((double)d));
    float mx = -INFINITY;
    for (int j = 0; j < n; j++) {
        float s = 0.0f;
        for (int e = 0; e < d; e++) s += q[e] * kv_at(b16, K, ld, j, e, false);
        scores[j] = s; /* raw: the max is subtracted before scaling (see the softmax tiles) */
        mx = s > mx ? s : mx;
    }
    const float sum = decode_exp_ref(scores, n, mx, cl2);
    for (int e = 0; e < d; e++) out[e] = 0.0f;
    for (int j = 0; j < n; j++)
        for (int e = 0; e < d; e++) out[e] += scores[j] * kv_at(b16, V, ld, j, e, true);
    const float f = gate / sum;
    for (int e = 0; e < d; e++) out[e] *= f;
}

#if SP_X86
#define SP_AVX512BW __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma")))
#define SP_BF16DQ __attribute__((target("avx512bf16,avx512f,avx512bw,avx512vl,avx512dq,fma")))

/* The decode kernels' AVX-512 subset (F, DQ, BW, VL: every AVX-512 CPU but the Xeon Phis). */
static bool decode_avx512(void) {
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
}

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

/* The softmax pass of the decode kernels: scores[0..n) raw, vmax lanes whose max is theirs ->
 * 2^((s - max) cl2) in place; returns the sum. */
SP_INLINE SP_AVX512 float decode_exp_avx(float *scores, int n, __m512 vmax, float cl2) {
    const __m512 vm = _mm512_set1_ps(_mm512_reduce_max_ps(vmax)), vc = _mm512_set1_ps(cl2);
    __m512 vsum = _mm512_setzero_ps();
    for (int j0 = 0; j0 < n; j0 += 16) {
        const __mmask16 jm = lanes_mask(n - j0);
        const __m512 sv = _mm512_maskz_loadu_ps(jm, scores + j0);
        const __m512 p = _mm512_maskz_mov_ps(jm, exp2_avx(_mm512_mul_ps(_mm512_sub_ps(sv, vm), vc)));
        _mm512_mask_storeu_ps(scores + j0, jm, p);
        vsum = _mm512_add_ps(vsum, p);
    }
    return _mm512_reduce_add_ps(vsum);
}

SP_INLINE __mmask32 lanes_mask32(int lanes) {
    return lanes >= 32 ? (__mmask32)0xFFFFFFFFu : lanes <= 0 ? (__mmask32)0 : (__mmask32)((1u << lanes) - 1u);
}
/* 16 bf16 (lanes of m) widened to fp32. */
SP_INLINE SP_AVX512BW __m512 widen16(const uint16_t *p, __mmask16 m) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}
/* The four horizontal sums of a[0..4) (lane i = sum of a[i]), in one reduction tree. */
SP_INLINE SP_AVX512BW __m128 hsum4(const __m512 *a) {
    const __m512 s01 = _mm512_add_ps(_mm512_unpacklo_ps(a[0], a[1]), _mm512_unpackhi_ps(a[0], a[1]));
    const __m512 s23 = _mm512_add_ps(_mm512_unpacklo_ps(a[2], a[3]), _mm512_unpackhi_ps(a[2], a[3]));
    const __m512d d01 = _mm512_castps_pd(s01), d23 = _mm512_castps_pd(s23);
    const __m512 s = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(d01, d23)),
                                   _mm512_castpd_ps(_mm512_unpackhi_pd(d01, d23))); /* per 128 bits: 0 1 2 3 */
    const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(s), _mm512_extractf32x8_ps(s, 1));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}
/* out[r .. r + R) = b[..] (or 0) + the sums of a[0..R), R <= 4. */
SP_INLINE SP_AVX512BW void store_rows(float *out, const float *b, int r, int R, const __m512 *a) {
    const __mmask8 m = (__mmask8)((1u << R) - 1u);
    __m128 v = hsum4(a);
    if (b) v = _mm_add_ps(v, _mm_maskz_loadu_ps(m, b + r));
    _mm_mask_storeu_ps(out + r, m, v);
}
/* 16 weights at w + o (lanes of m) as fp32: fp32 (b16 = 0) or bf16 widened (b16 = 1). */
SP_INLINE SP_AVX512BW __m512 load16(const int b16, const void *w, size_t o, __mmask16 m) {
    return b16 ? widen16((const uint16_t *)w + o, m) : _mm512_maskz_loadu_ps(m, (const float *)w + o);
}
/* The even (lo) and odd (hi) bf16 of 16 pairs, as fp32. */
SP_INLINE SP_AVX512BW __m512 pair_lo(__m512i x) { return _mm512_castsi512_ps(_mm512_slli_epi32(x, 16)); }
SP_INLINE SP_AVX512BW __m512 pair_hi(__m512i x) {
    return _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32((int)0xFFFF0000u)));
}
/* Prefetches the lines of [p, p + bytes). */
SP_INLINE void prefetch_span(const void *p, size_t bytes) {
    for (size_t o = 0; o < bytes; o += 64) _mm_prefetch((const char *)p + o, _MM_HINT_T0);
}

/* Raw scores q.k_j of n keys into scores[0..n), 16 keys per reduction tree; key j at K + j ld,
 * fp32 (b16 = 0) or bf16 widened (b16 = 1); software prefetch SP_PF_KEYS keys ahead. NV (a
 * compile-time 2, 4 or 8, so that the accumulators stay in registers) vectors of 16 cover d <= 16
 * NV, lanes past d masked. Returns lanes whose max is the scores' max. */
SP_INLINE SP_AVX512BW __m512 scores_avx(const int b16, const int NV, const float *q, const void *K, long ld, int n,
                                        int d, float *scores) {
    const size_t es = b16 ? sizeof(uint16_t) : sizeof(float);
    __mmask16 mk[8];
    __m512 qv[8];
#pragma GCC unroll 16
    for (int v = 0; v < NV; v++) {
        mk[v] = lanes_mask(d - 16 * v);
        qv[v] = _mm512_maskz_loadu_ps(mk[v], q + 16 * v);
    }
    __m512 vmax = _mm512_set1_ps(-INFINITY);
    for (int j0 = 0; j0 < n; j0 += 16) {
        const int jn = imin(16, n - j0);
        for (int jj = j0 + SP_PF_KEYS; jj < imin(j0 + SP_PF_KEYS + 16, n); jj++)
            prefetch_span((const char *)K + (size_t)jj * ld * es, (size_t)d * es);
        __m512 acc[16];
#pragma GCC unroll 16
        for (int jj = 0; jj < 16; jj++) {
            acc[jj] = _mm512_setzero_ps();
            if (jj >= jn) continue;
            const size_t kj = (size_t)(j0 + jj) * ld;
#pragma GCC unroll 16
            for (int v = 0; v < NV; v++)
                acc[jj] = _mm512_fmadd_ps(load16(b16, K, kj + 16 * (size_t)v, mk[v]), qv[v], acc[jj]);
        }
        const __mmask16 jm = lanes_mask(jn);
        const __m512 sv = hsum16(acc); /* raw scores: scaled after the max is subtracted */
        _mm512_mask_storeu_ps(scores + j0, jm, sv);
        vmax = _mm512_mask_max_ps(vmax, jm, vmax, sv);
    }
    return vmax;
}

/* d <= 16 NV (NV = 2, 4): scores 16 keys at a time (one reduction tree per block), exp2 over
 * vectors, and the weighted sum of V rows into 4 interleaved accumulators (keys j mod 4), added
 * in a fixed order. */
SP_INLINE SP_AVX512BW void decode_avx_nv(const int NV, const float *q, const float *K, const float *V, long ld,
                                         int n, int d, float gate, float *scores, float *out) {
    const float cl2 = (float)(1.4426950408889634 / sqrt((double)d));
    const int lines = (int)((d * sizeof(float) + 63) / 64); /* cache lines per row */
    const float sum = decode_exp_avx(scores, n, scores_avx(0, NV, q, K, ld, n, d, scores), cl2);
    __mmask16 mk[4];
    __m512 o[4][4];
#pragma GCC unroll 16
    for (int v = 0; v < NV; v++) {
        mk[v] = lanes_mask(d - 16 * v);
#pragma GCC unroll 16
        for (int a = 0; a < 4; a++) o[a][v] = _mm512_setzero_ps();
    }
    int j = 0;
    for (; j + 4 <= n; j += 4) {
        for (int jj = j + SP_PF_KEYS; jj < imin(j + SP_PF_KEYS + 4, n); jj++)
            for (int l = 0; l < lines; l++) _mm_prefetch((const char *)(V + (size_t)jj * ld) + 64 * l, _MM_HINT_T0);
#pragma GCC unroll 16
        for (int a = 0; a < 4; a++) {
            const __m512 pj = _mm512_set1_ps(scores[j + a]);
            const float *vj = V + (size_t)(j + a) * ld;
#pragma GCC unroll 16
            for (int v = 0; v < NV; v++) o[a][v] = _mm512_fmadd_ps(pj, _mm512_maskz_loadu_ps(mk[v], vj + 16 * v), o[a][v]);
        }
    }
    for (; j < n; j++) {
        const __m512 pj = _mm512_set1_ps(scores[j]);
        const float *vj = V + (size_t)j * ld;
#pragma GCC unroll 16
        for (int v = 0; v < NV; v++) o[0][v] = _mm512_fmadd_ps(pj, _mm512_maskz_loadu_ps(mk[v], vj + 16 * v), o[0][v]);
    }
    const __m512 f = _mm512_set1_ps(gate / sum);
#pragma GCC unroll 16
    for (int v = 0; v < NV; v++) {
        const __m512 r = _mm512_add_ps(_mm512_add_ps(o[0][v], o[1][v]), _mm512_add_ps(o[2][v], o[3][v]));
        _mm512_mask_storeu_ps(out + 16 * v, mk[v], _mm512_mul_ps(r, f));
    }
}

SP_AVX512BW static void decode_avx(const float *q, const float *K, const float *V, long ld, int n, int d, float gate,
                                   float *scores, float *out) {
    if (d <= 32) decode_avx_nv(2, q, K, V, ld, n, d, gate, scores, out);
    else decode_avx_nv(4, q, K, V, ld, n, d, gate, scores, out);
}
#endif

#if SP_X86
/* ------------------------------------------------------------------------------------------------
 * Decode on AVX2 + FMA (CPUs without AVX-512: the portable loops' float sums are one serial chain
 * each, ~1 GMAC/s). fp32 only: without AVX-512 decoding runs fp32 (attn_decode_precision).
 * ---------------------------------------------------------------------------------------------- */
/* d <= 8 NV (NV = 4 or 8): scores 8 keys per reduction tree, exp2 over vectors, the weighted sum
 * of V rows into NA interleaved accumulator sets (keys j mod NA; NA = 2 for NV 4, 1 for NV 8),
 * added in a fixed order. */
SP_INLINE SP_AVX2 void decode_avx2_nv(const int NV, const float *q, const float *K, const float *V, long ld, int n,
                                      int d, float gate, float *scores, float *out) {
    const float cl2 = (float)(1.4426950408889634 / sqrt((double)d));
    __m256i mk[8];
    __m256 qv[8];
#pragma GCC unroll 8
    for (int v = 0; v < NV; v++) {
        mk[v] = lanes8(d - 8 * v);
        qv[v] = _mm256_maskload_ps(q + 8 * v, mk[v]);
    }
    __m256 vmax = _mm256_set1_ps(-INFINITY);
    for (int j0 = 0; j0 < n; j0 += 8) {
        const int jn = imin(8, n - j0);
        for (int jj = j0 + SP_PF_KEYS; jj < imin(j0 + SP_PF_KEYS + 8, n); jj++)
            prefetch_span(K + (size_t)jj * ld, (size_t)d * sizeof(float));
        __m256 acc[8];
#pragma GCC unroll 8
        for (int jj = 0; jj < 8; jj++) {
            acc[jj] = _mm256_setzero_ps();
            if (jj >= jn) continue;
            const float *kj = K + (size_t)(j0 + jj) * ld;
#pragma GCC unroll 8
            for (int v = 0; v < NV; v++) acc[jj] = _mm256_fmadd_ps(_mm256_maskload_ps(kj + 8 * v, mk[v]), qv[v], acc[jj]);
        }
        const __m256i jm = lanes8(jn);
        const __m256 sv = hsum8(acc); /* raw scores: scaled after the max is subtracted */
        _mm256_maskstore_ps(scores + j0, jm, sv);
        vmax = _mm256_blendv_ps(vmax, _mm256_max_ps(vmax, sv), _mm256_castsi256_ps(jm));
    }
    float mx = -INFINITY, lm[8];
    _mm256_storeu_ps(lm, vmax);
    for (int i = 0; i < 8; i++) mx = lm[i] > mx ? lm[i] : mx;
    const __m256 vm = _mm256_set1_ps(mx), vc = _mm256_set1_ps(cl2);
    __m256 vsum = _mm256_setzero_ps();
    for (int j0 = 0; j0 < n; j0 += 8) {
        const __m256i jm = lanes8(n - j0);
        const __m256 sv = _mm256_maskload_ps(scores + j0, jm);
        const __m256 p = _mm256_and_ps(exp2_avx2(_mm256_mul_ps(_mm256_sub_ps(sv, vm), vc)), _mm256_castsi256_ps(jm));
        _mm256_maskstore_ps(scores + j0, jm, p);
        vsum = _mm256_add_ps(vsum, p);
    }
    float ls[8], sum = 0.0f;
    _mm256_storeu_ps(ls, vsum);
    for (int i = 0; i < 8; i++) sum += ls[i];
    const int NA = NV == 8 ? 1 : 2; /* accumulator sets: 8 chains of FMAs either way */
    const int lines = (int)((d * sizeof(float) + 63) / 64);
    __m256 o[2][8];
#pragma GCC unroll 8
    for (int v = 0; v < NV; v++) o[0][v] = o[1][v] = _mm256_setzero_ps();
    int j = 0;
    for (; j + NA <= n; j += NA) {
        for (int jj = j + SP_PF_KEYS; jj < imin(j + SP_PF_KEYS + NA, n); jj++)
            for (int l = 0; l < lines; l++) _mm_prefetch((const char *)(V + (size_t)jj * ld) + 64 * l, _MM_HINT_T0);
#pragma GCC unroll 2
        for (int a = 0; a < NA; a++) {
            const __m256 pj = _mm256_set1_ps(scores[j + a]);
            const float *vj = V + (size_t)(j + a) * ld;
#pragma GCC unroll 8
            for (int v = 0; v < NV; v++) o[a][v] = _mm256_fmadd_ps(pj, _mm256_maskload_ps(vj + 8 * v, mk[v]), o[a][v]);
        }
    }
    for (; j < n; j++) {
        const __m256 pj = _mm256_set1_ps(scores[j]);
        const float *vj = V + (size_t)j * ld;
#pragma GCC unroll 8
        for (int v = 0; v < NV; v++) o[0][v] = _mm256_fmadd_ps(pj, _mm256_maskload_ps(vj + 8 * v, mk[v]), o[0][v]);
    }
    const __m256 f = _mm256_set1_ps(gate / sum);
#pragma GCC unroll 8
    for (int v = 0; v < NV; v++) _mm256_maskstore_ps(out + 8 * v, mk[v], _mm256_mul_ps(_mm256_add_ps(o[0][v], o[1][v]), f));
}

SP_AVX2 static void decode_attend_avx2(const float *q, const float *K, const float *V, long ld, int n, int d,
                                       float gate, float *scores, float *out) {
    if (d <= 32) decode_avx2_nv(4, q, K, V, ld, n, d, gate, scores, out);
    else decode_avx2_nv(8, q, K, V, ld, n, d, gate, scores, out);
}

/* The GEMV of sparse_decode_gemv_f32: 4 rows per pass (a last group of fewer rows repeats its last
 * row and writes only its own), two accumulators per row (8 chains of FMAs), 16 columns per step,
 * adjacent column blocks (consecutive heads) as one span. */
SP_AVX2 static void decode_gemv_avx2(const float *w, long ldw, const float *b, const float *x, const int *blk,
                                     int nblk, int d, int r0, int r1, float *out) {
    for (int r = r0; r < r1; r += 4) {
        const int R = imin(4, r1 - r);
        const float *row[4];
        for (int i = 0; i < 4; i++) row[i] = w + (size_t)(r + imin(i, R - 1)) * ldw;
        __m256 a[4], c[4];
        for (int i = 0; i < 4; i++) a[i] = c[i] = _mm256_setzero_ps();
        for (int k = 0, run = 1; k < nblk; k += run) { /* runs of adjacent blocks as one span */
            for (run = 1; k + run < nblk && blk[k + run] == blk[k] + run;) run++;
            const size_t off = (size_t)blk[k] * d;
            const int span = run * d;
            int e = 0;
            for (; e + 16 <= span; e += 16) {
                const size_t o = off + (size_t)e;
                const __m256 x0 = _mm256_loadu_ps(x + o), x1 = _mm256_loadu_ps(x + o + 8);
                if (r + 8 <= r1)
                    for (int i = 0; i < 4; i++) _mm_prefetch((const char *)(row[i] + 4 * (size_t)ldw + o), _MM_HINT_T0);
#pragma GCC unroll 4
                for (int i = 0; i < 4; i++) {
                    a[i] = _mm256_fmadd_ps(_mm256_loadu_ps(row[i] + o), x0, a[i]);
                    c[i] = _mm256_fmadd_ps(_mm256_loadu_ps(row[i] + o + 8), x1, c[i]);
                }
            }
            for (; e < span; e += 8) {
                const size_t o = off + (size_t)e;
                const __m256i m = lanes8(span - e);
                const __m256 x0 = _mm256_maskload_ps(x + o, m);
#pragma GCC unroll 4
                for (int i = 0; i < 4; i++) a[i] = _mm256_fmadd_ps(_mm256_maskload_ps(row[i] + o, m), x0, a[i]);
            }
        }
        __m256 t[8];
        for (int i = 0; i < 4; i++) t[i] = _mm256_add_ps(a[i], c[i]), t[4 + i] = _mm256_setzero_ps();
        float sums[8];
        _mm256_storeu_ps(sums, hsum8(t));
        for (int i = 0; i < R; i++) out[r + i] = (b ? b[r + i] : 0.0f) + sums[i];
    }
}
#endif

#if SP_X86
#define SP_GROUP_TILE 64 /* keys per tile of the grouped decode: K and V tiles (8-16 KB) stay in L1 across the heads */

/* Key or value row j of a decode cache widened to fp32: nv vectors of 8 (d = 8 nv). fp32 rows, or
 * bf16: keys in rows, values pair-interleaved (sparse_decode_attend_bf16's layout; this takes the
 * half of position j). */
SP_INLINE SP_AVX2 void kv_row_avx2(const int b16, const int NV, const void *P, long ld, int j, bool value, __m256 *r) {
    if (!b16) {
        const float *row = (const float *)P + (size_t)j * ld;
#pragma GCC unroll 8
        for (int v = 0; v < NV; v++) r[v] = _mm256_loadu_ps(row + 8 * v);
        return;
    }
    const uint16_t *h = P;
    if (!value) {
        const uint16_t *row = h + (size_t)j * ld;
#pragma GCC unroll 8
        for (int v = 0; v < NV; v++)
            r[v] = _mm256_castsi256_ps(
                _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(row + 8 * v))), 16));
        return;
    }
    const uint16_t *pair = h + (size_t)(j >> 1) * 2 * ld;
#pragma GCC unroll 8
    for (int v = 0; v < NV; v++) {
        const __m256i x = _mm256_loadu_si256((const __m256i *)(pair + 16 * v)); /* 8 elements, both positions */
        r[v] = _mm256_castsi256_ps(j & 1 ? _mm256_and_si256(x, _mm256_set1_epi32((int)0xFFFF0000u))
                                         : _mm256_slli_epi32(x, 16));
    }
}

/* G heads (1 .. SPARSE_DECODE_GROUP) over one KV head, d = 8 NV: each tile of SP_GROUP_TILE keys
 * and values is read from memory once for all G (then from L1). Per head as decode_avx2_nv: raw
 * scores 8 keys per reduction tree, the max, exp2, the sum, then the weighted sum of the values
 * (one accumulator set, in key order) scaled by gate / sum. */
SP_INLINE SP_AVX2 void decode_group_avx2_nv(const int b16, const int NV, int G, const float *const *q, const void *K,
                                            const void *V, long ld, int n, int d, const float *gate,
                                            float *const *scores, float *const *out) {
    const float cl2 = (float)(1.4426950408889634 / sqrt((double)d));
    float mx[SPARSE_DECODE_GROUP], sum[SPARSE_DECODE_GROUP];
    for (int i = 0; i < G; i++) mx[i] = -INFINITY;
    for (int t0 = 0; t0 < n; t0 += SP_GROUP_TILE) {
        const int t1 = imin(n, t0 + SP_GROUP_TILE);
        const size_t es = b16 ? 2 : 4;
        for (int jj = t1; jj < imin(t1 + SP_GROUP_TILE, n); jj++) /* the next tile, while this one runs */
            prefetch_span((const char *)K + (size_t)jj * ld * es, (size_t)d * es);
        for (int i = 0; i < G; i++) {
            __m256 qv[8], vmax = _mm256_set1_ps(-INFINITY);
#pragma GCC unroll 8
            for (int v = 0; v < NV; v++) qv[v] = _mm256_loadu_ps(q[i] + 8 * v);
            for (int j0 = t0; j0 < t1; j0 += 8) {
                const int jn = imin(8, t1 - j0);
                __m256 acc[8];
#pragma GCC unroll 8
                for (int jj = 0; jj < 8; jj++) {
                    acc[jj] = _mm256_setzero_ps();
                    if (jj >= jn) continue;
                    __m256 kv[8];
                    kv_row_avx2(b16, NV, K, ld, j0 + jj, false, kv);
#pragma GCC unroll 8
                    for (int v = 0; v < NV; v++) acc[jj] = _mm256_fmadd_ps(kv[v], qv[v], acc[jj]);
                }
                const __m256i jm = lanes8(jn);
                const __m256 sv = hsum8(acc); /* raw scores: scaled after the max is subtracted */
                _mm256_maskstore_ps(scores[i] + j0, jm, sv);
                vmax = _mm256_blendv_ps(vmax, _mm256_max_ps(vmax, sv), _mm256_castsi256_ps(jm));
            }
            float lm[8];
            _mm256_storeu_ps(lm, vmax);
            for (int l = 0; l < 8; l++) mx[i] = lm[l] > mx[i] ? lm[l] : mx[i];
        }
    }
    for (int i = 0; i < G; i++) {
        const __m256 vm = _mm256_set1_ps(mx[i]), vc = _mm256_set1_ps(cl2);
        __m256 vsum = _mm256_setzero_ps();
        for (int j0 = 0; j0 < n; j0 += 8) {
            const __m256i jm = lanes8(n - j0);
            const __m256 sv = _mm256_maskload_ps(scores[i] + j0, jm);
            const __m256 p = _mm256_and_ps(exp2_avx2(_mm256_mul_ps(_mm256_sub_ps(sv, vm), vc)), _mm256_castsi256_ps(jm));
            _mm256_maskstore_ps(scores[i] + j0, jm, p);
            vsum = _mm256_add_ps(vsum, p);
        }
        float ls[8];
        _mm256_storeu_ps(ls, vsum);
        sum[i] = 0.0f;
        for (int l = 0; l < 8; l++) sum[i] += ls[l];
    }
    float acc_o[SPARSE_DECODE_GROUP][64];
    for (int t0 = 0; t0 < n; t0 += SP_GROUP_TILE) {
        const int t1 = imin(n, t0 + SP_GROUP_TILE);
        const size_t es = b16 ? 2 : 4; /* values: rows, or pairs of rows of 2 ld */
        for (int jj = t1; jj < imin(t1 + SP_GROUP_TILE, n); jj += 1 + b16)
            prefetch_span((const char *)V + (size_t)(b16 ? jj >> 1 : jj) * (1 + b16) * ld * es, (size_t)d * es * (1 + b16));
        for (int i = 0; i < G; i++) {
            __m256 o[8];
            const float *p = scores[i];
#pragma GCC unroll 8
            for (int v = 0; v < NV; v++) o[v] = t0 ? _mm256_loadu_ps(acc_o[i] + 8 * v) : _mm256_setzero_ps();
            for (int j = t0; j < t1; j++) {
                __m256 vv[8];
                kv_row_avx2(b16, NV, V, ld, j, true, vv);
                const __m256 pj = _mm256_set1_ps(p[j]);
#pragma GCC unroll 8
                for (int v = 0; v < NV; v++) o[v] = _mm256_fmadd_ps(pj, vv[v], o[v]);
            }
#pragma GCC unroll 8
            for (int v = 0; v < NV; v++) _mm256_storeu_ps(acc_o[i] + 8 * v, o[v]);
        }
    }
    for (int i = 0; i < G; i++) {
        const __m256 f = _mm256_set1_ps(gate[i] / sum[i]);
#pragma GCC unroll 8
        for (int v = 0; v < NV; v++) _mm256_storeu_ps(out[i] + 8 * v, _mm256_mul_ps(_mm256_loadu_ps(acc_o[i] + 8 * v), f));
    }
}

SP_AVX2 static void decode_group_avx2(const int b16, int G, const float *const *q, const void *K, const void *V,
                                      long ld, int n, int d, const float *gate, float *const *scores,
                                      float *const *out) {
    switch (d / 8) { /* exactly d / 8 vectors: a row is never read past its d values */
    case 1: decode_group_avx2_nv(b16, 1, G, q, K, V, ld, n, d, gate, scores, out); break;
    case 2: decode_group_avx2_nv(b16, 2, G, q, K, V, ld, n, d, gate, scores, out); break;
    case 3: decode_group_avx2_nv(b16, 3, G, q, K, V, ld, n, d, gate, scores, out); break;
    case 4: decode_group_avx2_nv(b16, 4, G, q, K, V, ld, n, d, gate, scores, out); break;
    case 5: decode_group_avx2_nv(b16, 5, G, q, K, V, ld, n, d, gate, scores, out); break;
    case 6: decode_group_avx2_nv(b16, 6, G, q, K, V, ld, n, d, gate, scores, out); break;
    case 7: decode_group_avx2_nv(b16, 7, G, q, K, V, ld, n, d, gate, scores, out); break;
    default: decode_group_avx2_nv(b16, 8, G, q, K, V, ld, n, d, gate, scores, out); break;
    }
}
#endif

bool sparse_decode_groups(int d, bool b16, sparse_bf16_isa isa) {
#if SP_X86
    /* where no AVX-512 kernel runs this store (those read one head at a time) */
    const bool avx512 = b16 ? d <= 128 && isa >= SPARSE_BF16_AVX512 : d <= 64 && decode_avx512();
    return !avx512 && d % 8 == 0 && d <= 64 && cpu_avx2_fma();
#else
    (void)d, (void)b16, (void)isa;
    return false;
#endif
}

void sparse_decode_attend_group(int G, const float *const *q, const void *K, const void *V, bool b16, long ld, int n,
                                int d, const float *gate, float *const *scores, float *const *out,
                                sparse_bf16_isa isa) {
#if SP_X86
    if (n >= 1 && G >= 1 && G <= SPARSE_DECODE_GROUP && sparse_decode_groups(d, b16, isa)) {
        decode_group_avx2(b16, G, q, K, V, ld, n, d, gate, scores, out);
        return;
    }
#endif
    for (int i = 0; i < G; i++) {
        if (b16) sparse_decode_attend_bf16(q[i], K, V, ld, n, d, gate[i], scores[i], out[i], isa);
        else sparse_decode_attend_f32(q[i], K, V, ld, n, d, gate[i], scores[i], out[i]);
    }
}

bool sp_decode_attend_avx2(const float *q, const float *K, const float *V, long ld, int n, int d, float gate,
                           float *scores, float *out) {
#if SP_X86
    if (n >= 1 && d <= 64 && cpu_avx2_fma()) {
        decode_attend_avx2(q, K, V, ld, n, d, gate, scores, out);
        return true;
    }
#endif
    return false;
}

bool sp_decode_gemv_avx2(const float *w, long ldw, const float *b, const float *x, const int *blk, int nblk, int d,
                         int r0, int r1, float *out) {
#if SP_X86
    if (cpu_avx2_fma()) {
        decode_gemv_avx2(w, ldw, b, x, blk, nblk, d, r0, r1, out);
        return true;
    }
#endif
    return false;
}

void sparse_decode_attend_f32(const float *q, const float *K, const float *V, long ld, int n, int d,
                              float gate, float *scores, float *out) {
    if (n <= 0) {
        for (int e = 0; e < d; e++) out[e] = 0.0f;
        return;
    }
#if SP_X86
    if (d <= 64 && decode_avx512()) {
        decode_avx(q, K, V, ld, n, d, gate, scores, out);
        return;
    }
    if (d <= 64 && cpu_avx2_fma()) {
        decode_attend_avx2(q, K, V, ld, n, d, gate, scores, out);
        return;
    }
#endif
    decode_ref(0, q, K, V, ld, n, d, gate, scores, out);
}

/* ------------------------------------------------------------------------------------------------
 * Decode: matrix-vector products over column blocks (q/k/v rows, W_O of the selected heads)
 * ---------------------------------------------------------------------------------------------- */

/* The portable GEMV on fp32 (b16 = 0) or bf16 (b16 = 1) weights. */
static inline void decode_gemv_ref(const int b16, const void *w, long ldw, const float *b, const float *x,
                                   const int *blk, int nblk, int d, int r0, int r1, float *out) {
    for (int r = r0; r < r1; r++) {
        const size_t wr = (size_t)r * ldw;
        float s = 0.0f;
        for (int k = 0; k < nblk; k++) {
            const size_t off = wr + (size_t)blk[k] * d;
            float t = 0.0f;
            for (int e = 0; e < d; e++)
                t += (b16 ? bf16_value(((const uint16_t *)w)[off + e]) : ((const float *)w)[off + e]) * x[off - wr + e];
            s += t;
        }
        out[r] = (b ? b[r] : 0.0f) + s;
    }
}

#if SP_X86
/* 4 rows per pass (a last group of fewer rows repeats its last row and writes only its own): one
 * accumulator vector per row over every block's d columns, 16 per step (x loaded once per 4
 * rows), one reduction per row; weights fp32 (b16 = 0) or bf16 widened (b16 = 1). */
SP_INLINE SP_AVX512BW void gemv_avx(const int b16, const void *w, long ldw, const float *b, const float *x,
                                    const int *blk, int nblk, int d, int r0, int r1, float *out) {
    const int nv = (d + 15) >> 4;
    const __mmask16 lm = lanes_mask(d - 16 * (nv - 1));
    for (int r = r0; r < r1; r += 4) {
        const int R = imin(4, r1 - r);
        size_t row[4];
        for (int i = 0; i < 4; i++) row[i] = (size_t)(r + imin(i, R - 1)) * ldw;
        __m512 a[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
        for (int k = 0; k < nblk; k++) {
            const size_t off = (size_t)blk[k] * d;
            for (int v = 0; v < nv; v++) {
                const __mmask16 m = v == nv - 1 ? lm : (__mmask16)0xFFFF;
                const size_t o = off + 16 * (size_t)v;
                const __m512 xv = _mm512_maskz_loadu_ps(m, x + o);
                if (r + 8 <= r1 && (!b16 || !(v & 1))) /* the same columns of the next 4 rows, a line each */
                    for (int i = 0; i < 4; i++)
                        _mm_prefetch((const char *)w + (row[i] + 4 * (size_t)ldw + o) * (b16 ? 2 : 4), _MM_HINT_T0);
                a[0] = _mm512_fmadd_ps(load16(b16, w, row[0] + o, m), xv, a[0]); /* unrolled: a[] in registers */
                a[1] = _mm512_fmadd_ps(load16(b16, w, row[1] + o, m), xv, a[1]);
                a[2] = _mm512_fmadd_ps(load16(b16, w, row[2] + o, m), xv, a[2]);
                a[3] = _mm512_fmadd_ps(load16(b16, w, row[3] + o, m), xv, a[3]);
            }
        }
        store_rows(out, b, r, R, a);
    }
}

SP_AVX512BW static void decode_gemv_avx(const float *w, long ldw, const float *b, const float *x, const int *blk,
                                        int nblk, int d, int r0, int r1, float *out) {
    gemv_avx(0, w, ldw, b, x, blk, nblk, d, r0, r1, out);
}
#endif

void sparse_decode_gemv_f32(const float *w, long ldw, const float *b, const float *x, const int *blk,
                            int nblk, int d, int r0, int r1, float *out) {
#if SP_X86
    if (decode_avx512()) {
        decode_gemv_avx(w, ldw, b, x, blk, nblk, d, r0, r1, out);
        return;
    }
    if (cpu_avx2_fma()) {
        decode_gemv_avx2(w, ldw, b, x, blk, nblk, d, r0, r1, out);
        return;
    }
#endif
    decode_gemv_ref(0, w, ldw, b, x, blk, nblk, d, r0, r1, out);
}

/* ------------------------------------------------------------------------------------------------
 * Decode on bf16 weights and a bf16 KV cache (sparse.h: sparse_decode_*_bf16). bf16 -> fp32 is
 * exact (the upper half of a float), so the portable and the widening kernels differ from fp32
 * kernels on the same rounded data only by the order of the sums.
 * ---------------------------------------------------------------------------------------------- */

sparse_bf16_isa sparse_bf16_isa_detect(void) {
#if SP_X86
    if (decode_avx512()) return bf16_detect().avx512_bf16 ? SPARSE_BF16_DP : SPARSE_BF16_AVX512;
#endif
    return SPARSE_BF16_PORTABLE;
}

const char *sparse_bf16_isa_name(sparse_bf16_isa isa) {
    return isa == SPARSE_BF16_DP ? "vdpbf16ps" : isa == SPARSE_BF16_AVX512 ? "avx512 widen+fma" : "portable";
}

#if SP_X86
/* out[d] = f (o0 + o1): the two accumulator sets of the bf16 P V. */
SP_INLINE SP_AVX512BW void store_pairs(const int NV, float *out, const __m512 *o0, const __m512 *o1, int d, float f) {
#pragma GCC unroll 16
    for (int v = 0; v < NV; v++)
        _mm512_mask_storeu_ps(out + 16 * v, lanes_mask(d - 16 * v),
                              _mm512_mul_ps(_mm512_add_ps(o0[v], o1[v]), _mm512_set1_ps(f)));
}

/* The widening kernel, d <= 16 NV: scores as decode_avx with the keys widened to fp32 in
 * registers; values in pairs of positions (sparse_decode_attend_bf16), each 32-lane load split
 * into its two positions (pair_lo, pair_hi), two accumulator sets. The last pair of an odd n
 * holds one position: the other half is masked, never read. */
SP_INLINE SP_AVX512BW void decode_bf16_avx_nv(const int NV, const float *q, const uint16_t *K, const uint16_t *V,
                                              long ld, int n, int d, float gate, float *scores, float *out) {
    const float cl2 = (float)(1.4426950408889634 / sqrt((double)d));
    const float sum = decode_exp_avx(scores, n, scores_avx(1, NV, q, K, ld, n, d, scores), cl2);
    __mmask32 mp[8];
    __m512 o0[8], o1[8];
#pragma GCC unroll 16
    for (int v = 0; v < NV; v++) {
        mp[v] = lanes_mask32(2 * (d - 16 * v));
        o0[v] = o1[v] = _mm512_setzero_ps();
    }
    const int np = (n + 1) >> 1;
    const __mmask32 half = n & 1 ? 0x55555555u : 0xFFFFFFFFu;
    for (int t = 0; t < np; t++) {
        const uint16_t *vt = V + (size_t)t * 2 * ld;
        if (2 * t + SP_PF_KEYS < n) prefetch_span(vt + (size_t)SP_PF_KEYS * ld, sizeof(uint16_t) * 2 * (size_t)d);
        const __m512 p0 = _mm512_set1_ps(scores[2 * t]);
        const __m512 p1 = _mm512_set1_ps(2 * t + 1 < n ? scores[2 * t + 1] : 0.0f);
        const __mmask32 h = t == np - 1 ? half : 0xFFFFFFFFu;
#pragma GCC unroll 16
        for (int v = 0; v < NV; v++) {
            const __m512i x = _mm512_maskz_loadu_epi16(mp[v] & h, vt + 32 * v);
            o0[v] = _mm512_fmadd_ps(pair_lo(x), p0, o0[v]);
            o1[v] = _mm512_fmadd_ps(pair_hi(x), p1, o1[v]);
        }
    }
    store_pairs(NV, out, o0, o1, d, gate / sum);
}

SP_AVX512BW static void decode_bf16_avx(const float *q, const uint16_t *K, const uint16_t *V, long ld, int n, int d,
                                        float gate, float *scores, float *out) {
    if (d <= 32) decode_bf16_avx_nv(2, q, K, V, ld, n, d, gate, scores, out);
    else if (d <= 64) decode_bf16_avx_nv(4, q, K, V, ld, n, d, gate, scores, out);
    else decode_bf16_avx_nv(8, q, K, V, ld, n, d, gate, scores, out);
}

/* The vdpbf16ps kernel, d <= 16 NV: q rounded to bf16, each score one vdpbf16ps chain over pairs
 * of dimensions (16 keys per reduction tree); probabilities rounded to bf16 in pairs of positions,
 * times the pair-interleaved values, two pairs per step into two accumulator sets. */
SP_INLINE SP_BF16DQ void decode_bf16_dp_nv(const int NV, const float *q, const uint16_t *K, const uint16_t *V,
                                           long ld, int n, int d, float gate, float *scores, float *out) {
    const float cl2 = (float)(1.4426950408889634 / sqrt((double)d));
    const int NB = NV / 2; /* vectors of 32 bf16 per key */
    __mmask32 mb[4], mp[8];
    __m512bh qb[4];
#pragma GCC unroll 16
    for (int v = 0; v < NB; v++) {
        mb[v] = lanes_mask32(d - 32 * v);
        qb[v] = _mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(lanes_mask(d - 32 * v - 16), q + 32 * v + 16),
                                    _mm512_maskz_loadu_ps(lanes_mask(d - 32 * v), q + 32 * v));
    }
    __m512 vmax = _mm512_set1_ps(-INFINITY);
    for (int j0 = 0; j0 < n; j0 += 16) {
        const int jn = imin(16, n - j0);
        for (int jj = j0 + SP_PF_KEYS; jj < imin(j0 + SP_PF_KEYS + 16, n); jj++)
            prefetch_span(K + (size_t)jj * ld, sizeof(uint16_t) * (size_t)d);
        __m512 acc[16];
#pragma GCC unroll 16
        for (int jj = 0; jj < 16; jj++) {
            acc[jj] = _mm512_setzero_ps();
            if (jj >= jn) continue;
            const uint16_t *kj = K + (size_t)(j0 + jj) * ld;
#pragma GCC unroll 16
            for (int v = 0; v < NB; v++)
                acc[jj] = _mm512_dpbf16_ps(acc[jj], (__m512bh)_mm512_maskz_loadu_epi16(mb[v], kj + 32 * v), qb[v]);
        }
        const __mmask16 jm = lanes_mask(jn);
        const __m512 sv = hsum16(acc);
        _mm512_mask_storeu_ps(scores + j0, jm, sv);
        vmax = _mm512_mask_max_ps(vmax, jm, vmax, sv);
    }
    const float sum = decode_exp_avx(scores, n, vmax, cl2);
    __m512 o0[8], o1[8];
#pragma GCC unroll 16
    for (int v = 0; v < NV; v++) {
        mp[v] = lanes_mask32(2 * (d - 16 * v));
        o0[v] = o1[v] = _mm512_setzero_ps();
    }
    const int np = (n + 1) >> 1;
    const __mmask32 half = n & 1 ? 0x55555555u : 0xFFFFFFFFu; /* the last pair of an odd n: one position */
    uint32_t pp[16]; /* 16 pairs of probabilities (bf16, even position in the low half) */
    for (int t0 = 0; t0 < np; t0 += 16) {
        const int j = 2 * t0, tn = imin(16, np - t0);
        const __m512 lo = _mm512_maskz_loadu_ps(lanes_mask(n - j), scores + j);
        const __m512 hi = _mm512_maskz_loadu_ps(lanes_mask(n - j - 16), scores + j + 16);
        _mm512_storeu_si512((void *)pp, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
        for (int tt = 0; tt < tn; tt += 2) {
            const int t = t0 + tt;
            const bool two = tt + 1 < tn;
            const uint16_t *va = V + (size_t)t * 2 * ld, *vb = va + 2 * ld;
            if (2 * t + SP_PF_KEYS < n) prefetch_span(va + (size_t)SP_PF_KEYS * ld, sizeof(uint16_t) * 4 * (size_t)d);
            const __m512bh pa = (__m512bh)_mm512_set1_epi32((int)pp[tt]);
            const __m512bh pb = (__m512bh)_mm512_set1_epi32(two ? (int)pp[tt + 1] : 0);
            const __mmask32 ha = t == np - 1 ? half : 0xFFFFFFFFu;
            const __mmask32 hb = !two ? 0u : t + 1 == np - 1 ? half : 0xFFFFFFFFu;
#pragma GCC unroll 16
            for (int v = 0; v < NV; v++) {
                o0[v] = _mm512_dpbf16_ps(o0[v], (__m512bh)_mm512_maskz_loadu_epi16(mp[v] & ha, va + 32 * v), pa);
                o1[v] = _mm512_dpbf16_ps(o1[v], (__m512bh)_mm512_maskz_loadu_epi16(mp[v] & hb, vb + 32 * v), pb);
            }
        }
    }
    store_pairs(NV, out, o0, o1, d, gate / sum);
}

SP_BF16DQ static void decode_bf16_dp(const float *q, const uint16_t *K, const uint16_t *V, long ld, int n, int d,
                                     float gate, float *scores, float *out) {
    if (d <= 32) decode_bf16_dp_nv(2, q, K, V, ld, n, d, gate, scores, out);
    else if (d <= 64) decode_bf16_dp_nv(4, q, K, V, ld, n, d, gate, scores, out);
    else decode_bf16_dp_nv(8, q, K, V, ld, n, d, gate, scores, out);
}

SP_AVX512BW static void gemv_bf16_avx(const uint16_t *w, long ldw, const float *b, const float *x, const int *blk,
                                      int nblk, int d, int r0, int r1, float *out) {
    gemv_avx(1, w, ldw, b, x, blk, nblk, d, r0, r1, out);
}

/* vdpbf16ps GEMV: as gemv_avx with 32 columns (one line of each row) per step and x in bf16. */
SP_BF16DQ static void gemv_bf16_dp(const uint16_t *w, long ldw, const float *b, const uint16_t *xb, const int *blk,
                                   int nblk, int d, int r0, int r1, float *out) {
    const int nb = (d + 31) >> 5;
    const __mmask32 lb = lanes_mask32(d - 32 * (nb - 1));
    for (int r = r0; r < r1; r += 4) {
        const int R = imin(4, r1 - r);
        const uint16_t *row[4];
        for (int i = 0; i < 4; i++) row[i] = w + (size_t)(r + imin(i, R - 1)) * ldw;
        __m512 a[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
        for (int k = 0; k < nblk; k++) {
            const size_t off = (size_t)blk[k] * d;
            for (int v = 0; v < nb; v++) {
                const __mmask32 m = v == nb - 1 ? lb : (__mmask32)0xFFFFFFFFu;
                const size_t o = off + 32 * (size_t)v;
                const __m512bh xv = (__m512bh)_mm512_maskz_loadu_epi16(m, xb + o);
                if (r + 8 <= r1)
                    for (int i = 0; i < 4; i++) _mm_prefetch((const char *)(row[i] + 4 * (size_t)ldw + o), _MM_HINT_T0);
                a[0] = _mm512_dpbf16_ps(a[0], (__m512bh)_mm512_maskz_loadu_epi16(m, row[0] + o), xv);
                a[1] = _mm512_dpbf16_ps(a[1], (__m512bh)_mm512_maskz_loadu_epi16(m, row[1] + o), xv);
                a[2] = _mm512_dpbf16_ps(a[2], (__m512bh)_mm512_maskz_loadu_epi16(m, row[2] + o), xv);
                a[3] = _mm512_dpbf16_ps(a[3], (__m512bh)_mm512_maskz_loadu_epi16(m, row[3] + o), xv);
            }
        }
        store_rows(out, b, r, R, a);
    }
}
#endif

void sparse_decode_attend_bf16(const float *q, const uint16_t *K, const uint16_t *V, long ld, int n, int d,
                               float gate, float *scores, float *out, sparse_bf16_isa isa) {
    if (n <= 0) {
        for (int e = 0; e < d; e++) out[e] = 0.0f;
        return;
    }
#if SP_X86
    if (d <= 128 && isa == SPARSE_BF16_DP) {
        decode_bf16_dp(q, K, V, ld, n, d, gate, scores, out);
        return;
    }
    if (d <= 128 && isa == SPARSE_BF16_AVX512) {
        decode_bf16_avx(q, K, V, ld, n, d, gate, scores, out);
        return;
    }
#endif
    decode_ref(1, q, K, V, ld, n, d, gate, scores, out);
}

void sparse_decode_gemv_bf16(const uint16_t *w, long ldw, const float *b, const float *x, const uint16_t *xb,
                             const int *blk, int nblk, int d, int r0, int r1, float *out, sparse_bf16_isa isa) {
#if SP_X86
    if (isa == SPARSE_BF16_DP && xb) {
        gemv_bf16_dp(w, ldw, b, xb, blk, nblk, d, r0, r1, out);
        return;
    }
    if (isa >= SPARSE_BF16_AVX512) {
        gemv_bf16_avx(w, ldw, b, x, blk, nblk, d, r0, r1, out);
        return;
    }
#endif
    decode_gemv_ref(1, w, ldw, b, x, blk, nblk, d, r0, r1, out);
}
