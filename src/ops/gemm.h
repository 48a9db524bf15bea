/* Row-major GEMM: C[M,N] = alpha * op(A) * op(B) + beta * C, op(X) = X or X^T.
 * A is [M,K] (ta=false, leading dim lda) or [K,M] (ta=true); B is [K,N] or [N,K] (tb=true).
 * gemm_f32 runs oneDNN's dnnl_sgemm (spec-free: a library call); gemm_f64 is a plain loop used
 * only by the float64 instantiation for gradient checks. */
#ifndef MOH_GEMM_H
#define MOH_GEMM_H
#include <stdbool.h>

void gemm_f32(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
              const float *B, int ldb, float beta, float *C, int ldc);
void gemm_f64(bool ta, bool tb, int M, int N, int K, double alpha, const double *A, int lda,
              const double *B, int ldb, double beta, double *C, int ldc);
/* The GEMM library and version in use, for `moh bench` and `moh --version`. */
const char *gemm_library(void);

#endif
