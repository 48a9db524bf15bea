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

/* y[n] = e^y[n] in place, the last partial vector masked. */
static OPS_AVX512 void exp_avx512(float *y, long n) {
    for (long i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1u);
        _mm512_mask_storeu_ps(y + i, m, vexp_avx512(_mm512_maskz_loadu_ps(m, y + i)));
    }
}
#endif

/* The float instantiation's vector exp: 1 when done (AVX-512, checked at run time), else 0. */
static int exp_vec_f32(float *y, long n) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (__builtin_cpu_supports("avx512f")) {
        exp_avx512(y, n);
        return 1;
    }
#endif
    (void)y, (void)n;
    return 0;
}

#define real float
#define F(x) x##_f32
#define OPS_VEC_EXP(y, n) exp_vec_f32(y, n)
#include "ops_impl.h"
#undef OPS_VEC_EXP
#undef real
#undef F

/* double: libm's exp (the gradient checks' reference) */
#define real double
#define F(x) x##_f64
#define OPS_VEC_EXP(y, n) ((void)(y), (void)(n), 0)
#include "ops_impl.h"
#undef OPS_VEC_EXP
#undef real
#undef F
