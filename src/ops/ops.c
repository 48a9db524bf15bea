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

/* swiglu_forward(_sig) of n elements with vexp_avx512, the same operations as the scalar loop
 * otherwise (den = 1 + e^-g; out = g / den * u; sig = 1 / den); the last partial vector masked. */
static OPS_AVX512 void swiglu_avx512(float *out, float *sig, const float *gate, const float *up, long n) {
    const __m512 one = _mm512_set1_ps(1.0f);
    for (long i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1u);
        const __m512 g = _mm512_maskz_loadu_ps(m, gate + i), u = _mm512_maskz_loadu_ps(m, up + i);
        const __m512 den = _mm512_add_ps(one, vexp_avx512(_mm512_sub_ps(_mm512_setzero_ps(), g)));
        _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(_mm512_div_ps(g, den), u));
        if (sig) _mm512_mask_storeu_ps(sig + i, m, _mm512_div_ps(one, den));
    }
}

/* s[n] = 1 / (1 + e^-g), as swiglu_avx512's sig. */
static OPS_AVX512 void sigmoid_avx512(float *s, const float *gate, long n) {
    const __m512 one = _mm512_set1_ps(1.0f);
    for (long i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1u);
        const __m512 g = _mm512_maskz_loadu_ps(m, gate + i);
        const __m512 den = _mm512_add_ps(one, vexp_avx512(_mm512_sub_ps(_mm512_setzero_ps(), g)));
        _mm512_mask_storeu_ps(s + i, m, _mm512_div_ps(one, den));
    }
}
#endif

/* The float instantiation's vector sigmoid (swiglu_backward): 1 when done, else 0. */
static int sigmoid_vec_f32(float *s, const float *gate, long n) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (__builtin_cpu_supports("avx512f")) {
        sigmoid_avx512(s, gate, n);
        return 1;
    }
#endif
    (void)s, (void)gate, (void)n;
    return 0;
}

/* The float instantiation's vector SwiGLU: 1 when done (AVX-512, checked at run time), else 0. */
static int swiglu_vec_f32(float *out, float *sig, const float *gate, const float *up, long n) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (__builtin_cpu_supports("avx512f")) {
        swiglu_avx512(out, sig, gate, up, n);
        return 1;
    }
#endif
    (void)out, (void)sig, (void)gate, (void)up, (void)n;
    return 0;
}

#define real float
#define F(x) x##_f32
#define OPS_VEC_SWIGLU(o, s, g, u, n) swiglu_vec_f32(o, s, g, u, n)
#define OPS_VEC_SIGMOID(s, g, n) sigmoid_vec_f32(s, g, n)
#include "ops_impl.h"
#undef OPS_VEC_SWIGLU
#undef OPS_VEC_SIGMOID
#undef real
#undef F

/* double: libm's exp (the gradient checks' reference) */
#define real double
#define F(x) x##_f64
#define OPS_VEC_SWIGLU(o, s, g, u, n) ((void)(o), (void)(s), (void)(g), (void)(u), (void)(n), 0)
#define OPS_VEC_SIGMOID(s, g, n) ((void)(s), (void)(g), (void)(n), 0)
#include "ops_impl.h"
#undef OPS_VEC_SWIGLU
#undef OPS_VEC_SIGMOID
#undef real
#undef F
