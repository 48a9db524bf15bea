/* Row-major bf16 GEMMs on cuBLASLt (fp32 accumulation), the library loaded at run time (dlopen of
 * libcublasLt.so.13), so that a moh built with CUDA still starts where the CUDA libraries are
 * absent. Each distinct GEMM shape gets its algorithm once (cuBLASLt's heuristic) and keeps it:
 * the same algorithm, the same bits, on every call. */
#ifndef MOH_CUDA_BLAS_H
#define MOH_CUDA_BLAS_H
#include <stdbool.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "moh.h"

typedef struct cu_blas cu_blas;

/* Loads cuBLASLt, creates its handle and a 32 MiB workspace. MOH_E_DEVICE naming what failed. */
int cu_blas_new(cu_blas **out, moh_error *err);
void cu_blas_free(cu_blas *bl);

/* C[M, N] = op(A) op(B) + beta C (+ bias[N] per column, bf16 C only), row-major:
 * op(A) [M, K] is A [M, K] (row stride lda) or, with ta, A^T of A [K, M]; op(B) [K, N] is B [K, N]
 * (ldb) or, with tb, B^T of B [N, K]. A, B bf16; C bf16 (c_f32 false) or fp32 (row stride ldc).
 * M, N or K == 0: nothing (beta C kept). MOH_OK or MOH_E_DEVICE. */
int cu_gemm(cu_blas *bl, cudaStream_t st, bool ta, bool tb, int M, int N, int K, const uint16_t *A, int lda,
            const uint16_t *B, int ldb, void *C, int ldc, bool c_f32, float beta, const uint16_t *bias,
            moh_error *err);

#endif
