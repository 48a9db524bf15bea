/* Core ops, forward and backward, in float32 (engine) and float64 (gradient checks).
 * Implementations: ops_impl.h, instantiated twice by ops.c. */
#ifndef MOH_OPS_H
#define MOH_OPS_H
#include "gemm.h"
#include "moh.h"

#define real float
#define F(x) x##_f32
#include "ops_decl.h"
#undef real
#undef F

#define real double
#define F(x) x##_f64
#include "ops_decl.h"
#undef real
#undef F

/* The float ops' vector exp and erf, in place on y[n] (fn OPS_FN_EXP / OPS_FN_ERF): isa
 * OPS_ISA_BEST picks AVX-512 or AVX2 + FMA from the CPU at run time, OPS_ISA_AVX2 the AVX2 code
 * on any CPU with it (tests); 1 when done, 0 when the CPU has neither (the ops then loop over
 * libm's expf / erff). Within 2 ulp of expf over [-104, 89]; erf within 1.2e-7 (tests/test_ops.c). */
enum { OPS_FN_EXP = 0, OPS_FN_ERF = 1 };
enum { OPS_ISA_BEST = 0, OPS_ISA_AVX2 = 1 };
int ops_vec_f32(int isa, int fn, float *y, long n);

#endif
