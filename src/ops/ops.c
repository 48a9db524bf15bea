/* Core ops: the template ops_impl.h instantiated for float (engine) and double (gradient checks). */
#include "ops.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define OPS_AVX512 __attribute__((target("avx512f")))

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
    __m512 p = _mm512_set1_ps(1.0f / 5040);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* erf on 16 lanes: for |x| < 0.5 its Taylor series to x^13 (truncation < 1e-9 relative), else
 * 1 - erfc(|x|) with Numerical Recipes' erfc (t e^(-z^2 - 1.26551223 + t P(t)), t = 1 / (1 + z / 2):
 * relative error < 1.2e-7 of erfc, so of erf from z = 0.5 on), the sign restored; +-inf -> +-1,
 * NaN stays NaN. Measured against float64 in test_ops. */
static inline OPS_AVX512 __m512 verf_avx512(__m512 x) {
    const __m512 ax = _mm512_abs_ps(x), x2 = _mm512_mul_ps(x, x);
    __m512 s = _mm512_set1_ps(1.0f / 9360);
    s = _mm512_fmadd_ps(s, x2, _mm512_set1_ps(-1.0f / 1320));
    s = _mm512_fmadd_ps(s, x2, _mm512_set1_ps(1.0f / 216));
    s = _mm512_fmadd_ps(s, x2, _mm512_set1_ps(-1.0f / 42));
    s = _mm512_fmadd_ps(s, x2, _mm512_set1_ps(1.0f / 10));
    s = _mm512_fmadd_ps(s, x2, _mm512_set1_ps(-1.0f / 3));
    s = _mm512_fmadd_ps(s, x2, _mm512_set1_ps(1.0f));
    const __m512 small = _mm512_mul_ps(_mm512_mul_ps(s, x), _mm512_set1_ps(1.12837916709551257f)); /* 2 / sqrt(pi) */
    const __m512 t = _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_fmadd_ps(ax, _mm512_set1_ps(0.5f), _mm512_set1_ps(1.0f)));
    __m512 p = _mm512_set1_ps(0.17087277f);
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-0.82215223f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.48851587f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-1.13520398f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(0.27886807f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-0.18628806f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(0.09678418f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(0.37409196f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.00002368f));
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

/* The float instantiation's vector functions, in place on y[n]: 1 when done (AVX-512, checked at
 * run time), else 0 (the caller loops over libm's). */
enum { OPS_VEC_FN_EXP, OPS_VEC_FN_ERF };
static int vec_f32(int fn, float *y, long n) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (__builtin_cpu_supports("avx512f")) {
        if (fn == OPS_VEC_FN_EXP) exp_avx512(y, n);
        else erf_avx512(y, n);
        return 1;
    }
#endif
    (void)fn, (void)y, (void)n;
    return 0;
}

#define real float
#define F(x) x##_f32
#define OPS_VEC_EXP(y, n) vec_f32(OPS_VEC_FN_EXP, y, n)
#define OPS_VEC_ERF(y, n) vec_f32(OPS_VEC_FN_ERF, y, n)
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
