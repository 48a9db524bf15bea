/* The CUDA kernels' launchers (the .cu files of src/cuda), callable from C (src/cuda/layer.c), and the tile
 * sizes of every attention kernel in one place. Tensors are device arrays, row-major; bf16 values
 * travel as uint16_t bit patterns. Notation as moh.h: T = B N tokens, h query heads, h_kv KV
 * heads, d = head_dim, hd = h d, qd = (h + 2 h_kv) d, E routed heads.
 *
 * Segments: the selected (token, head) pairs of one (batch row b, query head i) form segment
 * s = b h + i; its cnt[s] pairs are rows s N .. s N + cnt[s] - 1 of the packed arrays (queries,
 * outputs, statistics, dO), in ascending position pos[s N + r] (the token is b N + pos). Shared heads
 * and the "none" router select every position. Every launcher returns a cudaError_t (the launch's
 * cudaGetLastError) and enqueues on stream. */
#ifndef MOH_CUDA_KERNELS_H
#define MOH_CUDA_KERNELS_H
#include <stdbool.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- tile sizes (rows of 16 per warp, 4 warps per block) ---------------------------------- */
#define CU_WARPS 4
/* forward: packed queries per block (32 per warp up to d 128, 16 beyond) and keys per tile */
#define CU_FWD_BQ(d) ((d) <= 128 ? 128 : 64)
#define CU_FWD_BK(d) ((d) <= 128 ? 64 : 32)
/* backward, dK dV kernel: keys per block (16 per warp) and packed queries per inner tile */
#define CU_BWD_BK 64
#define CU_BWD_BQ(d) ((d) <= 96 ? 64 : 32)
/* backward, dQ kernel: query rows per warp (16 MT), packed queries per block, keys per tile */
#define CU_DQ_MT(d) ((d) <= 64 ? 2 : 1)
#define CU_DQ_BQ(d) (64 * CU_DQ_MT(d))
#define CU_DQ_BK 64
/* forward on Hopper (sm90/flash_fwd_wgmma.cu): 64 queries per warpgroup; 2 warpgroups with key tiles
 * of 128, or 1 with key tiles of 64 (the kernel's template arguments, chosen in its launcher) */
/* head dims with compiled attention kernels */
#define CU_HEAD_DIMS "32, 64, 72, 80, 96, 128"
bool cu_head_dim_supported(int d);

typedef struct cu_attn_params {
    int B, N, h, hkv, d, qd;
    bool causal;
    float scale;            /* 1 / sqrt(d) */
    const int *cnt;         /* [B h] pairs per segment */
    const int *pos;         /* [B h N] positions per segment */
    const float *gates;     /* [T, h] */
    /* forward */
    const uint16_t *qp;     /* [B h N, d] packed queries after RoPE */
    const uint16_t *qkv;    /* [T, qd]: K at column hd + j d (after RoPE), V at hd + h_kv d + j d */
    const uint16_t *vt;     /* [B h_kv, d, np] V^T (wgmma forward: written by cu_transpose_v) */
    int np;                 /* N rounded up to 8 */
    uint16_t *op;           /* [B h N, d] packed outputs o (before the gate) */
    uint16_t *og;           /* [T, hd] gate * o scattered to its token and head (other pairs untouched) */
    float *mrow;            /* [B h N] row max of the raw scores q.k */
    float *lrow;            /* [B h N] log2 sum_j 2^((q.k_j - m) scale log2 e) */
    /* backward */
    const uint16_t *dop;    /* [B h N, d] dL/do (gate * dL/dog) packed */
    const float *dsum;      /* [B h N] rowsum(dL/do * o) */
    uint16_t *dqkv;         /* [T, qd]: dQ of every pair (after RoPE^-1), dK (before it) and dV */
    const float *rope_cos;  /* [N, d / 2] RoPE tables (dQ's RoPE^-1), NULL without RoPE */
    const float *rope_sin;
} cu_attn_params;

/* Flash attention forward over the packed queries of every segment against all keys of its KV
 * head (causal: keys <= the query's position). */
cudaError_t cu_flash_forward(const cu_attn_params *p, cudaStream_t stream);
/* The same on Hopper's wgmma (sm_90a builds, head_dim cu_wgmma_supported; warpgroups 1 or 2 per
 * block), V read as V^T from
 * p->vt (cu_transpose_v first). cudaErrorNoKernelImageForDevice when built without sm_90a. */
cudaError_t cu_flash_forward_wgmma(const cu_attn_params *p, int warpgroups, cudaStream_t stream);
/* V^T of the V columns of p->qkv into p->vt (keys N..np-1 zero). */
cudaError_t cu_transpose_v(const cu_attn_params *p, cudaStream_t stream);
/* This build holds the sm_90a kernels; the wgmma forward has kernels for head_dim d. */
bool cu_wgmma_built(void);
bool cu_wgmma_supported(int d);

/* Flash attention backward, two kernels, no atomics (the same bits on every run), both after
 * cu_bwd_pre (dop, dsum) and the forward (mrow, lrow): dK (before RoPE^-1) and dV by a
 * key/value-stationary kernel into dqkv's k and v columns; dQ by a query-stationary one, RoPE^-1
 * applied, scattered to dqkv's q columns (which must be zero for the pairs not computed). */
cudaError_t cu_flash_backward_kv(const cu_attn_params *p, cudaStream_t stream);
cudaError_t cu_flash_backward_dq(const cu_attn_params *p, cudaStream_t stream);

/* ---- router (router.cu) ------------------------------------------------------------------ */
typedef struct cu_router_params {
    int T, N, B, h, hs, E, K, router; /* router: moh_router */
    int nz;                 /* row stride of z and dz (>= the logits per token: moh_cuda_router_rows) */
    int d, ldq;             /* query_norm: q row stride of qf */
    bool straight_through;
    const float *z;         /* [T, nz] learned logits: wg x | wg_0 x | wg_1 x */
    const float *qf;        /* [T, ldq] query_norm: fp32 queries before RoPE, without bias */
    const uint16_t *bq;     /* [hd] query bias (bf16) or NULL */
    float *gates;           /* [T, h] */
    uint8_t *sel;           /* [T, h] 1 when the pair is computed */
    float *p;               /* [T, E] router scores */
    uint8_t *mask;          /* [T, E] top-k mask */
    float *denom;           /* [T] learned */
    float *s;               /* [T, hs] learned: softmax(wg_1 x) */
    float *a;               /* [T, 2] learned: softmax(wg_0 x) */
    float *qn;              /* [T, E] query_norm: ||q|| */
    float *qstd;            /* [T] query_norm */
    float *part;            /* [ceil(T / 256), 2 E] load-balance partial sums */
    float *f;               /* [E] fraction of tokens selecting each routed head */
    float *lb;              /* [1] load-balance loss */
    int *cnt, *pos;         /* segments (see top) */
    uint16_t *og;           /* [T, h d]: rows of the pairs not computed are zeroed here */
    /* backward */
    const float *dgates;    /* [T, h] */
    float lb_scale;
    uint16_t *dz;           /* [T, nz] learned: d logits (bf16) */
    uint16_t *dqkv;         /* [T, qd] query_norm: the router's d q added to the q columns */
    float *coef;            /* [T, E] query_norm backward scratch: d q_j = coef q_j */
    int qd;
} cu_router_params;

/* Gates, selection, scores and the load-balance loss of every token; then the segments. */
cudaError_t cu_router_forward(const cu_router_params *p, cudaStream_t stream);
/* d logits (learned) or the query_norm router's d q (into dqkv), from dgates and lb_scale. */
cudaError_t cu_router_backward(const cu_router_params *p, cudaStream_t stream);

/* ---- element-wise and gather kernels (pack.cu) -------------------------------------------- */
/* K columns of qkv rotated by RoPE in place (cos/sin [N, d/2] tables, position t % N). */
cudaError_t cu_rope_k(uint16_t *qkv, int T, int N, int h, int hkv, int d, int qd, const float *cosb,
                      const float *sinb, cudaStream_t stream);
/* Packed queries: qp[s N + r] = RoPE(q[token] (+ bias), pos) for r < cnt[s]; q is bf16 (qf NULL)
 * or fp32 (qf, row stride ldq, bias added here). cos/sin NULL: no RoPE. */
cudaError_t cu_pack_q(uint16_t *qp, const uint16_t *qb, const float *qf, int ldq, const uint16_t *bq,
                      const int *cnt, const int *pos, int B, int N, int h, int d, const float *cosb,
                      const float *sinb, cudaStream_t stream);
/* Backward preprocessing per pair: dgate = <dog, o> into dgates[token, head], dop = bf16(gate dog),
 * dsum = rowsum(dop o). */
cudaError_t cu_bwd_pre(const cu_attn_params *p, const uint16_t *dog, float *dgates, uint16_t *dop,
                       float *dsum, cudaStream_t stream);
/* dK columns of dqkv: RoPE^-1 in place. */
cudaError_t cu_rope_k_backward(uint16_t *dqkv, int T, int N, int h, int hkv, int d, int qd, const float *cosb,
                               const float *sinb, cudaStream_t stream);
/* Column sums of a [rows, cols] bf16 matrix, ADDED to out[cols] (fp32), in a fixed order:
 * part [ceil(rows / 512), cols] scratch. */
cudaError_t cu_colsum_add(const uint16_t *x, int rows, int cols, int ld, float *part, float *out, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
