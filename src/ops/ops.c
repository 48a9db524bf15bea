/* Core ops: the template ops_impl.h instantiated for float (engine) and double (gradient checks). */
#include "ops.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define OPS_AVX512 __attribute__((target("avx512f")))

/* Coefficients shared by the AVX-512 and AVX2 kernels, highest power first (Horner). e^r: Taylor
 * to r^7; erf, |x| < 0.5: its series in x^2 (times x 2 / sqrt(pi)); erfc: Numerical Recipes' P(t). */
static const float OPS_EXP_TAYLOR[8] = {1.0f / 5040, 1.0f / 720, 1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f};
static const float OPS_ERF_SERIES[7] = {1.0f / 9360, -1.0f / 1320, 1.0f / 216, -1.0f / 42, 1.0f / 10, -1.0f / 3, 1.0f};
static const float OPS_ERFC_NR[9] = {0.17087277f,  -0.82215223f, 1.48851587f, -1.13520398f, 0.27886807f,
                                     -0.18628806f, 0.09678418f,  0.37409196f, 1.00002368f};
/* sum T[k] x^(n-1-k), k < n, by Horner's rule on 16 lanes. */
static inline OPS_AVX512 __m512 horner_avx512(const float *T, int n, __m512 x) {
    __m512 p = _mm512_set1_ps(T[0]);
#pragma GCC unroll 16
    for (int k = 1; k < n; k++) p = _mm512_fmadd_ps(p, x, _mm512_set1_ps(T[k]));
    return p;
}

/* e^x on 16 lanes: x = n ln2 + r with n = round(x / ln2) and ln2 in two parts (Cody-Waite, |r| <=
 * ln2 / 2), e^r by its Taylor polynomial to r^7 (truncation < 1e-8 relative), then 2^n by scalef.
 * Within 2 ulp of libm's expf over [-104, 89] (test_ops); overflow gives inf, underflow 0 or a
 * subnormal, NaN stays NaN (max/min keep their second operand when one is NaN). */
static inline OPS_AVX512 __m512 vexp_avx512(__m512 x) {
    x = _mm512_min_ps(_mm512_set1_ps(89.0f), _mm512_max_ps(_mm512_set1_ps(-104.0f), x));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x); /* ln2 = 0.693359375 - 2.12194440e-4 */
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    return _mm512_scalef_ps(horner_avx512(OPS_EXP_TAYLOR, 8, r), n);
}

/* erf on 16 lanes: for |x| < 0.5 its Taylor series to x^13 (truncation < 1e-9 relative), else
 * 1 - erfc(|x|) with Numerical Recipes' erfc (t e^(-z^2 - 1.26551223 + t P(t)), t = 1 / (1 + z / 2):
 * relative error < 1.2e-7 of erfc, so of erf from z = 0.5 on), the sign restored; +-inf -> +-1,
 * NaN stays NaN. Measured against float64 in test_ops. */
static inline OPS_AVX512 __m512 verf_avx512(__m512 x) {
    const __m512 ax = _mm512_abs_ps(x), x2 = _mm512_mul_ps(x, x);
    const __m512 s = horner_avx512(OPS_ERF_SERIES, 7, x2);
    const __m512 small = _mm512_mul_ps(_mm512_mul_ps(s, x), _mm512_set1_ps(1.12837916709551257f)); /* 2 / sqrt(pi) */
    const __m512 t = _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_fmadd_ps(ax, _mm512_set1_ps(0.5f), _mm512_set1_ps(1.0f)));
    const __m512 p = horner_avx512(OPS_ERFC_NR, 9, t);
    const __m512 arg = _mm512_fmadd_ps(p, t, _mm512_sub_ps(_mm512_set1_ps(-1.26551223f), _mm512_mul_ps(ax, ax)));
    const __m512 big = _mm512_sub_ps(_mm512_set1_ps(1.0f), _mm512_mul_ps(t, vexp_avx512(arg)));
    const __m512 signed_big = _mm512_castsi512_ps(_mm512_or_si512(
        _mm512_castps_si512(big), _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32((int)0x80000000u))));
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(ax, _mm512_set1_ps(0.5f), _CMP_LT_OQ), signed_big, small);
}

/* y[n] = erf(y[n]) in place, the last partial vector masked. */
static OPS_AVX512 void erf_avx512(float *y, long n) {
    for (long i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1u);
        _mm512_mask_storeu_ps(y + i, m, verf_avx512(_mm512_maskz_loadu_ps(m, y + i)));
    }
}

/* y[n] = e^y[n] in place, the last partial vector masked. */
static OPS_AVX512 void exp_avx512(float *y, long n) {
    for (long i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1u);
        _mm512_mask_storeu_ps(y + i, m, vexp_avx512(_mm512_maskz_loadu_ps(m, y + i)));
    }
}
#endif

#if defined(__x86_64__) && defined(__GNUC__)
#define OPS_AVX2 __attribute__((target("avx2,fma")))

/* horner_avx512 on 8 lanes. */
static inline OPS_AVX2 __m256 horner_avx2(const float *T, int n, __m256 x) {
    __m256 p = _mm256_set1_ps(T[0]);
#pragma GCC unroll 16
    for (int k = 1; k < n; k++) p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(T[k]));
    return p;
}

/* 2^n for integer-valued n in [-252, 254], as two normal factors (their product may round to a
 * subnormal, as scalef does). */
static inline OPS_AVX2 __m256 pow2_avx2(__m256 n, __m256 *second) {
    const __m256i ni = _mm256_cvtps_epi32(n), h = _mm256_srai_epi32(ni, 1);
    const __m256i b = _mm256_set1_epi32(127);
    *second = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(ni, h), b), 23));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(h, b), 23));
}

/* vexp_avx512 on 8 lanes: the same reduction and polynomial, 2^n applied as two normal factors. */
static inline OPS_AVX2 __m256 vexp_avx2(__m256 x) {
    x = _mm256_min_ps(_mm256_set1_ps(89.0f), _mm256_max_ps(_mm256_set1_ps(-104.0f), x));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    const __m256 p = horner_avx2(OPS_EXP_TAYLOR, 8, r);
    __m256 s2;
    const __m256 s1 = pow2_avx2(n, &s2);
    return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}

/* verf_avx512 on 8 lanes (the same series, erfc and blend). */
static inline OPS_AVX2 __m256 verf_avx2(__m256 x) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 ax = _mm256_andnot_ps(sign, x), x2 = _mm256_mul_ps(x, x);
    const __m256 s = horner_avx2(OPS_ERF_SERIES, 7, x2);
    const __m256 small = _mm256_mul_ps(_mm256_mul_ps(s, x), _mm256_set1_ps(1.12837916709551257f));
    const __m256 t = _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_fmadd_ps(ax, _mm256_set1_ps(0.5f), _mm256_set1_ps(1.0f)));
    const __m256 p = horner_avx2(OPS_ERFC_NR, 9, t);
    const __m256 arg = _mm256_fmadd_ps(p, t, _mm256_sub_ps(_mm256_set1_ps(-1.26551223f), _mm256_mul_ps(ax, ax)));
    const __m256 big = _mm256_sub_ps(_mm256_set1_ps(1.0f), _mm256_mul_ps(t, vexp_avx2(arg)));
    const __m256 signed_big = _mm256_or_ps(big, _mm256_and_ps(x, sign));
    return _mm256_blendv_ps(signed_big, small, _mm256_cmp_ps(ax, _mm256_set1_ps(0.5f), _CMP_LT_OQ));
}

/* y[n] = exp or erf of y[n] in place on 8 lanes, the last partial vector masked. */
static OPS_AVX2 void fn_avx2(int fn, float *y, long n) {
    for (long i = 0; i < n; i += 8) {
        const int m = n - i >= 8 ? 8 : (int)(n - i);
        const __m256i lm = _mm256_cmpgt_epi32(_mm256_set1_epi32(m), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        const __m256 v = _mm256_maskload_ps(y + i, lm);
        _mm256_maskstore_ps(y + i, lm, fn == OPS_FN_EXP ? vexp_avx2(v) : verf_avx2(v));
    }
}
#endif

int ops_vec_f32(int isa, int fn, float *y, long n) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (isa == OPS_ISA_BEST && __builtin_cpu_supports("avx512f")) {
        if (fn == OPS_FN_EXP) exp_avx512(y, n);
        else erf_avx512(y, n);
        return 1;
    }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        fn_avx2(fn, y, n);
        return 1;
    }
#endif
    (void)isa, (void)fn, (void)y, (void)n;
    return 0;
}

#define real float
#define F(x) x##_f32
#define OPS_VEC_EXP(y, n) ops_vec_f32(OPS_ISA_BEST, OPS_FN_EXP, y, n)
#define OPS_VEC_ERF(y, n) ops_vec_f32(OPS_ISA_BEST, OPS_FN_ERF, y, n)
#include "ops_impl.h"
#undef OPS_VEC_EXP
#undef OPS_VEC_ERF
#undef real
#undef F

/* double: libm's exp (the gradient checks' reference) */
#define real double
#define F(x) x##_f64
#define OPS_VEC_EXP(y, n) ((void)(y), (void)(n), 0)
#define OPS_VEC_ERF(y, n) ((void)(y), (void)(n), 0)
#include "ops_impl.h"
#undef OPS_VEC_EXP
#undef OPS_VEC_ERF
#undef real
#undef F
