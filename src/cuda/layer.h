/* The CUDA MoH attention layer's internals (moh_cuda.h is its public face): the device views of
 * its one allocation, for the tests and benchmarks that look inside (segments, packed queries,
 * statistics) and time the attention core alone. Shapes: kernels.h; T = B N of the last forward. */
#ifndef MOH_CUDA_LAYER_H
#define MOH_CUDA_LAYER_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "blas.h"
#include "host.h"
#include "kernels.h"
#include "moh_cuda.h"

/* Returns MOH_E_DEVICE naming the call from the enclosing function (its moh_error *err) when a CUDA
 * runtime call fails. */
#define CU_TRY(call, what)                                                                              \
    do {                                                                                                 \
        const cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                         \
            (void)cudaGetLastError(); /* handled here: not blamed on the next launch */                  \
            return moh_fail(err, e_ == cudaErrorMemoryAllocation ? MOH_E_NOMEM : MOH_E_DEVICE,          \
                            "CUDA %s failed: %s", what, cudaGetErrorString(e_));                         \
        }                                                                                                \
    } while (0)

#define CU_MAX_MARKS 32

struct moh_cuda_layer {
    moh_attn_config cfg;
    int maxB, maxN, B, N;
    int E, nz, ldz, hd, qd, kvd;
    cu_blas *blas;
    void *block;          /* the one device allocation */
    size_t bytes;
    size_t poison_off;    /* activations start here (the RoPE tables before them are kept) */
    bool poison;          /* tests: every activation byte 0xFF (NaN) before each forward */
    const uint16_t *x;    /* the last forward's input (borrowed) */
    float *rope_cos, *rope_sin; /* [maxN, d / 2], NULL without RoPE */
    uint16_t *qkv;        /* [T, qd] projections (K after RoPE) */
    float *qf;            /* [T, hd] query_norm: fp32 queries before RoPE, no bias */
    float *z;             /* [T, ldz] learned: router logits */
    float *gates;         /* [T, h] */
    uint8_t *sel;         /* [T, h] */
    float *p;             /* [T, E] */
    uint8_t *mask;        /* [T, E] */
    float *denom, *s, *a, *qn, *qstd; /* [T], [T, h_s], [T, 2], [T, E], [T] */
    float *coef;          /* [T, E] query_norm backward */
    float *lbpart, *f, *lb; /* [ceil(T / 256), 2 E], [E], [1] */
    int *cnt, *pos;       /* [B h], [B h N] */
    uint16_t *qp, *op;    /* [B h N, d] packed queries, outputs */
    float *mrow, *lrow;   /* [B h N] */
    uint16_t *og;         /* [T, hd] */
    uint16_t *vt;         /* [B h_kv, d, round8(N)] V^T (wgmma forward only, else NULL) */
    int fwd_kind;         /* CU_FWD_MMA or CU_FWD_WGMMA (cu_layer_set_forward_kernel) */
    uint16_t *dog, *dop;  /* [T, hd], [B h N, d] */
    float *dsum, *dgates; /* [B h N], [T, h] */
    uint16_t *dqkv;       /* [T, qd] */
    uint16_t *dz;         /* [T, ldz] */
    float *cspart;        /* [ceil(T / 512), max(C, qd)] */
    /* profiling (cu_layer_profile): events at the phase boundaries of forward / backward */
    bool profile;
    int nmark;
    cudaEvent_t ev[CU_MAX_MARKS];
    int mark_phase[CU_MAX_MARKS]; /* the phase that ends at event i (-1: a start) */
    double phase_ms[CU_NPHASE];
    long phase_calls;
};

/* The attention kernels' parameters for the last forward. */
cu_attn_params cu_layer_attn_params(const moh_cuda_layer *l);

#endif
