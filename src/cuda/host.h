/* Host-side helpers of the CUDA backend that need no CUDA header (the CLI, benchmarks and tests
 * include this in every build; a build without CUDA links src/cuda/stub.c, where each fails with
 * MOH_E_DEVICE "moh was built without CUDA"). Device pointers are void *; streams are void *
 * (NULL: the default stream). */
#ifndef MOH_CUDA_HOST_H
#define MOH_CUDA_HOST_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "moh_cuda.h"

/* true when this moh was built with the CUDA backend. */
bool cu_built(void);

/* Device memory: allocate (cudaMalloc), free, copy, set. MOH_E_NOMEM / MOH_E_DEVICE. */
int cu_dev_alloc(void **p, size_t bytes, moh_error *err);
void cu_dev_free(void *p);
int cu_copy_to_dev(void *dst, const void *src, size_t bytes, moh_error *err);
int cu_copy_to_host(void *dst, const void *src, size_t bytes, moh_error *err);
int cu_dev_memset(void *p, int byte, size_t bytes, moh_error *err);
/* Waits for all device work; reports a pending CUDA error. */
int cu_dev_sync(moh_error *err);

/* Elapsed device time between two points of the default stream, in milliseconds. */
typedef struct cu_timer cu_timer;
int cu_timer_new(cu_timer **t, moh_error *err);
void cu_timer_free(cu_timer *t);
int cu_timer_start(cu_timer *t, moh_error *err);
int cu_timer_stop(cu_timer *t, double *ms, moh_error *err);

/* Tests: poison (0xFF) the activations before every forward. */
void cu_layer_set_poison(moh_cuda_layer *l, bool on);
/* The attention core alone, on the last forward's (and backward's) buffers, for timing:
 * forward = flash forward (q, K, V -> o, og, statistics); backward = per-pair preprocessing, flash
 * backward, dQ out of its accumulator. MOH_OK or MOH_E_DEVICE. */
int cu_layer_core_forward(moh_cuda_layer *l, void *stream, moh_error *err);
int cu_layer_core_backward(moh_cuda_layer *l, void *stream, moh_error *err);

/* Host float32 weights of a layer (attn_params_f32 layout, moh's names) to the device bf16 layout
 * of moh_cuda_weights: one device allocation *buf (cu_dev_free it), w's pointers into it.
 * Source of the stacking: sparse_router_row. MOH_OK, MOH_E_NOMEM, MOH_E_DEVICE. */
struct attn_params_f32;
int cu_weights_upload(const moh_attn_config *cfg, const struct attn_params_f32 *p, void **buf,
                      moh_cuda_weights *w, moh_error *err);
/* Zeroed fp32 gradients on the device in the same layout (one allocation *buf), and a copy of
 * them back to host attn_params_f32 g (fields absent in cfg skipped). */
int cu_grads_alloc(const moh_attn_config *cfg, void **buf, moh_cuda_grads *g, moh_error *err);
int cu_grads_download(const moh_attn_config *cfg, const moh_cuda_grads *g, const struct attn_params_f32 *out,
                      moh_error *err);

/* The flash-attention forward kernels: mma.sync (sm_80 and later, every head_dim; the default) and
 * two wgmma variants (Hopper sm_90a builds, head_dim 64 and 128): wgmma (2 warpgroups, 128 queries,
 * key tiles of 128) and wgmma1 (1 warpgroup, 64 queries, key tiles of 64, several blocks per SM).
 * Both are correct (tests/test_cuda_attn.c runs every kernel); without warp specialisation they were
 * measured slower than mma.sync on an H200 (tools/gpu/runs/), hence opt-in: MOH_CUDA_FWD=wgmma or
 * wgmma1 at moh_cuda_layer_new (an error where it cannot run). */
enum { CU_FWD_MMA = 0, CU_FWD_WGMMA = 1, CU_FWD_WGMMA1 = 2 };
/* Switches l's forward kernel: MOH_E_CONFIG (named) where kind cannot run. */
int cu_layer_set_forward_kernel(moh_cuda_layer *l, int kind, moh_error *err);
/* "mma.sync", "wgmma" or "wgmma1". */
const char *cu_layer_forward_kernel(const moh_cuda_layer *l);

/* Phases of a forward and a backward, timed by cu_layer_profile. */
enum {
    CU_PH_QKV,      /* forward: QKV projections (cuBLASLt) */
    CU_PH_ROUTER,   /* forward: router logits GEMM, router, load balance, segments */
    CU_PH_PACK,     /* forward: RoPE on K, the packed queries */
    CU_PH_ATTN,     /* forward: flash attention */
    CU_PH_WO,       /* forward: W_O GEMM */
    CU_PH_B_WO,     /* backward: d og, dW_O, db_O */
    CU_PH_B_PRE,    /* backward: clears, per-pair preprocessing (dgates, dO, rowsum(dO o)) */
    CU_PH_B_KV,     /* backward: flash backward, dK and dV */
    CU_PH_B_DQ,     /* backward: flash backward, dQ */
    CU_PH_B_ROUTER, /* backward: RoPE^-1 on dK, router backward */
    CU_PH_B_QKV,    /* backward: dx, dW_qkv, db_qkv, router weight gradients */
    CU_NPHASE
};
/* "qkv_gemm", "router", ... */
const char *cu_phase_name(int ph);
/* Profiling on (events at every phase boundary; their times are summed at each
 * moh_cuda_layer_sync) or off. MOH_OK or MOH_E_DEVICE. */
int cu_layer_profile(moh_cuda_layer *l, bool on, moh_error *err);
/* Milliseconds per phase summed since the last reset into ms[CU_NPHASE], and the number of
 * synchronised calls they cover; reset zeroes them. */
long cu_layer_phase_ms(moh_cuda_layer *l, double *ms, bool reset);

/* Pairs per segment of the last forward, copied to the host: cnt[B h] and, when pos is not NULL,
 * pos[B h N] (the first cnt[s] entries of each segment s are set). */
int cu_layer_segments(const moh_cuda_layer *l, int *cnt, int *pos, moh_error *err);
/* B, N of the last forward. */
void cu_layer_shape(const moh_cuda_layer *l, int *B, int *N);

#endif
