/* cuBLASLt through dlopen (blas.h). A row-major C = op(A) op(B) is the column-major
 * C^T = op(B)^T op(A)^T: cuBLASLt's A is our B and its B our A, with m = N, n = M. */
#include "blas.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include <cublasLt.h>

#define BLAS_PLANS 64
#define BLAS_WORKSPACE ((size_t)32 << 20)

typedef struct blas_plan {
    bool used;
    bool ta, tb, c_f32, bias, beta1;
    int M, N, K, lda, ldb, ldc;
    uint32_t align_a, align_b, align_c; /* bytes, powers of two up to 256 */
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
} blas_plan;

struct cu_blas {
    void *lib;
    __typeof__(cublasLtCreate) *create;
    __typeof__(cublasLtDestroy) *destroy;
    __typeof__(cublasLtMatmulDescCreate) *desc_create;
    __typeof__(cublasLtMatmulDescDestroy) *desc_destroy;
    __typeof__(cublasLtMatmulDescSetAttribute) *desc_set;
    __typeof__(cublasLtMatrixLayoutCreate) *layout_create;
    __typeof__(cublasLtMatrixLayoutDestroy) *layout_destroy;
    __typeof__(cublasLtMatmulPreferenceCreate) *pref_create;
    __typeof__(cublasLtMatmulPreferenceDestroy) *pref_destroy;
    __typeof__(cublasLtMatmulPreferenceSetAttribute) *pref_set;
    __typeof__(cublasLtMatmulAlgoGetHeuristic) *heuristic;
    __typeof__(cublasLtMatmul) *matmul;
    cublasLtHandle_t handle;
    void *workspace;
    blas_plan plans[BLAS_PLANS];
};

static const char *const LIBS[] = {"libcublasLt.so.13", "libcublasLt.so", "/usr/local/cuda/lib64/libcublasLt.so.13"};

int cu_blas_new(cu_blas **out, moh_error *err) {
    *out = NULL;
    cu_blas *bl = calloc(1, sizeof *bl);
    if (!bl) return moh_fail(err, MOH_E_NOMEM, "cuBLASLt: out of host memory");
    for (size_t i = 0; i < sizeof LIBS / sizeof LIBS[0] && !bl->lib; i++) bl->lib = dlopen(LIBS[i], RTLD_NOW | RTLD_LOCAL);
    if (!bl->lib) {
        free(bl);
        return moh_fail(err, MOH_E_DEVICE, "cannot load cuBLASLt (libcublasLt.so.13: %s); add the CUDA 13 "
                        "libraries to LD_LIBRARY_PATH", dlerror());
    }
    struct { void **fn; const char *name; } syms[] = {
        {(void **)&bl->create, "cublasLtCreate"},
        {(void **)&bl->destroy, "cublasLtDestroy"},
        {(void **)&bl->desc_create, "cublasLtMatmulDescCreate"},
        {(void **)&bl->desc_destroy, "cublasLtMatmulDescDestroy"},
        {(void **)&bl->desc_set, "cublasLtMatmulDescSetAttribute"},
        {(void **)&bl->layout_create, "cublasLtMatrixLayoutCreate"},
        {(void **)&bl->layout_destroy, "cublasLtMatrixLayoutDestroy"},
        {(void **)&bl->pref_create, "cublasLtMatmulPreferenceCreate"},
        {(void **)&bl->pref_destroy, "cublasLtMatmulPreferenceDestroy"},
        {(void **)&bl->pref_set, "cublasLtMatmulPreferenceSetAttribute"},
        {(void **)&bl->heuristic, "cublasLtMatmulAlgoGetHeuristic"},
        {(void **)&bl->matmul, "cublasLtMatmul"},
    };
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
        *syms[i].fn = dlsym(bl->lib, syms[i].name);
        if (!*syms[i].fn) {
            dlclose(bl->lib);
            free(bl);
            return moh_fail(err, MOH_E_DEVICE, "cuBLASLt: symbol %s missing", syms[i].name);
        }
    }
    cublasStatus_t s = bl->create(&bl->handle);
    if (s != CUBLAS_STATUS_SUCCESS) {
        dlclose(bl->lib);
        free(bl);
        return moh_fail(err, MOH_E_DEVICE, "cublasLtCreate failed (status %d)", (int)s);
    }
    cudaError_t e = cudaMalloc(&bl->workspace, BLAS_WORKSPACE);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        bl->destroy(bl->handle);
        dlclose(bl->lib);
        free(bl);
        return moh_fail(err, MOH_E_NOMEM, "cuBLASLt workspace: cudaMalloc: %s", cudaGetErrorString(e));
    }
    *out = bl;
    return MOH_OK;
}

static void plan_free(cu_blas *bl, blas_plan *p) {
    if (!p->used) return;
    bl->desc_destroy(p->desc);
    bl->layout_destroy(p->la);
    bl->layout_destroy(p->lb);
    bl->layout_destroy(p->lc);
    p->used = false;
}

void cu_blas_free(cu_blas *bl) {
    if (!bl) return;
    for (int i = 0; i < BLAS_PLANS; i++) plan_free(bl, &bl->plans[i]);
    cudaFree(bl->workspace);
    bl->destroy(bl->handle);
    dlclose(bl->lib);
    free(bl);
}

/* The plan of one GEMM shape: descriptors and the heuristic's first algorithm. */
static int plan_make(cu_blas *bl, blas_plan *p, moh_error *err) {
    cublasStatus_t s;
    const cudaDataType_t ct = p->c_f32 ? CUDA_R_32F : CUDA_R_16BF;
    if ((s = bl->desc_create(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F)) != CUBLAS_STATUS_SUCCESS)
        return moh_fail(err, MOH_E_DEVICE, "cublasLtMatmulDescCreate: status %d", (int)s);
    /* cuBLASLt's A = our B (op: transposed when tb is false, see the top), its B = our A */
    const cublasOperation_t opa = p->tb ? CUBLAS_OP_T : CUBLAS_OP_N, opb = p->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    bl->desc_set(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa);
    bl->desc_set(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb);
    if (p->bias) {
        const cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_BIAS;
        bl->desc_set(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof ep);
    }
    /* stored shapes, column-major: our B [K, N] row-major is [N, K] col-major (ld ldb) */
    p->la = p->lb = p->lc = NULL;
    if ((s = bl->layout_create(&p->la, CUDA_R_16BF, p->tb ? (uint64_t)p->K : (uint64_t)p->N,
                               p->tb ? (uint64_t)p->N : (uint64_t)p->K, p->ldb)) != CUBLAS_STATUS_SUCCESS ||
        (s = bl->layout_create(&p->lb, CUDA_R_16BF, p->ta ? (uint64_t)p->M : (uint64_t)p->K,
                               p->ta ? (uint64_t)p->K : (uint64_t)p->M, p->lda)) != CUBLAS_STATUS_SUCCESS ||
        (s = bl->layout_create(&p->lc, ct, (uint64_t)p->N, (uint64_t)p->M, p->ldc)) != CUBLAS_STATUS_SUCCESS) {
        if (p->la) bl->layout_destroy(p->la);
        if (p->lb) bl->layout_destroy(p->lb);
        bl->desc_destroy(p->desc);
        return moh_fail(err, MOH_E_DEVICE, "cublasLtMatrixLayoutCreate: status %d", (int)s);
    }
    cublasLtMatmulPreference_t pref;
    if ((s = bl->pref_create(&pref)) != CUBLAS_STATUS_SUCCESS) {
        bl->layout_destroy(p->la);
        bl->layout_destroy(p->lb);
        bl->layout_destroy(p->lc);
        bl->desc_destroy(p->desc);
        return moh_fail(err, MOH_E_DEVICE, "cublasLtMatmulPreferenceCreate: status %d", (int)s);
    }
    const size_t ws = BLAS_WORKSPACE;
    bl->pref_set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    bl->pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &p->align_b, sizeof p->align_b);
    bl->pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &p->align_a, sizeof p->align_a);
    bl->pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &p->align_c, sizeof p->align_c);
    bl->pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &p->align_c, sizeof p->align_c);
    cublasLtMatmulHeuristicResult_t res;
    int n = 0;
    s = bl->heuristic(bl->handle, p->desc, p->la, p->lb, p->lc, p->lc, pref, 1, &res, &n);
    bl->pref_destroy(pref);
    p->used = true;
    if (s != CUBLAS_STATUS_SUCCESS || n < 1) {
        plan_free(bl, p);
        return moh_fail(err, MOH_E_DEVICE, "cuBLASLt: no algorithm for %s GEMM %d x %d x %d (status %d)",
                        p->c_f32 ? "bf16 -> fp32" : "bf16", p->M, p->N, p->K, (int)s);
    }
    p->algo = res.algo;
    return MOH_OK;
}

/* The largest power of two up to 256 dividing the address. */
static uint32_t align_of(const void *ptr) {
    const uintptr_t a = (uintptr_t)ptr;
    const uintptr_t low = a & (~a + 1);
    return low == 0 || low > 256 ? 256u : (uint32_t)low;
}

int cu_gemm(cu_blas *bl, cudaStream_t st, bool ta, bool tb, int M, int N, int K, const uint16_t *A, int lda,
            const uint16_t *B, int ldb, void *C, int ldc, bool c_f32, float beta, const uint16_t *bias,
            moh_error *err) {
    if (M <= 0 || N <= 0 || K <= 0) return MOH_OK;
    const blas_plan key = {.used = true, .ta = ta, .tb = tb, .c_f32 = c_f32, .bias = bias != NULL,
                           .beta1 = beta != 0.f, .M = M, .N = N, .K = K, .lda = lda, .ldb = ldb, .ldc = ldc,
                           .align_a = align_of(A), .align_b = align_of(B), .align_c = align_of(C)};
    blas_plan *p = NULL;
    int free_slot = -1;
    for (int i = 0; i < BLAS_PLANS && !p; i++) {
        blas_plan *q = &bl->plans[i];
        if (!q->used) {
            if (free_slot < 0) free_slot = i;
            continue;
        }
        if (q->ta == ta && q->tb == tb && q->c_f32 == c_f32 && q->bias == key.bias && q->beta1 == key.beta1 &&
            q->M == M && q->N == N && q->K == K && q->lda == lda && q->ldb == ldb && q->ldc == ldc &&
            q->align_a == key.align_a && q->align_b == key.align_b && q->align_c == key.align_c)
            p = q;
    }
    if (!p) {
        if (free_slot < 0) { /* full: start over (shapes of a run are few) */
            for (int i = 0; i < BLAS_PLANS; i++) plan_free(bl, &bl->plans[i]);
            free_slot = 0;
        }
        p = &bl->plans[free_slot];
        *p = key;
        p->used = false;
        const int rc = plan_make(bl, p, err);
        if (rc) return rc;
    }
    if (bias) bl->desc_set(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
    const float alpha = 1.f;
    const cublasStatus_t s = bl->matmul(bl->handle, p->desc, &alpha, B, p->la, A, p->lb, &beta, C, p->lc, C, p->lc,
                                        &p->algo, bl->workspace, BLAS_WORKSPACE, st);
    if (s != CUBLAS_STATUS_SUCCESS)
        return moh_fail(err, MOH_E_DEVICE, "cublasLtMatmul %d x %d x %d failed (status %d)", M, N, K, (int)s);
    return MOH_OK;
}
