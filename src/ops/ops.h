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

#endif
