/* Shared-memory geometry of the attention kernels (tile sizes: kernels.h). Rows of a tile hold
 * DK = round16(d) bf16 values (the QK^T reduction runs in steps of 16; columns d..DK-1 are zero)
 * at a stride of an odd number of 16-byte chunks, so that the 8 rows an ldmatrix reads fall in 8
 * different 16-byte bank groups (no conflicts, no swizzle). */
#ifndef MOH_CUDA_TILES_CUH
#define MOH_CUDA_TILES_CUH
#include "common.cuh"
#include "kernels.h"

template <int D> struct tile_dims {
    static constexpr int DK = (D + 15) / 16 * 16;       /* padded reduction length */
    static constexpr int CH = DK / 8;                    /* 16-byte chunks of a padded row */
    static constexpr int SROW = (CH % 2 == 0 ? CH + 1 : CH) * 8; /* row stride in elements */
    static constexpr int NT = D / 8;                     /* n-tiles of 8 output columns */
    static constexpr int KT = DK / 16;                   /* k-steps over the head dim */
    static_assert(D % 8 == 0, "head_dim must be a multiple of 8");
};
/* The warp's products on tiles in shared memory (row-major bf16, row stride SROW elements), in
 * mma.sync fragments (common.cuh). */

/* Zeroes accumulator fragments (4 fp32 registers each): a [C][4] or [R][C][4] array. */
template <int C> static __device__ __forceinline__ void frags_zero(float (&a)[C][4]) {
#pragma unroll
    for (int c = 0; c < C; c++)
#pragma unroll
        for (int e = 0; e < 4; e++) a[c][e] = 0.f;
}
template <int R, int C> static __device__ __forceinline__ void frags_zero(float (&a)[R][C][4]) {
#pragma unroll
    for (int r = 0; r < R; r++) frags_zero(a[r]);
}

/* acc[mt][n] += A B^T over KT k-steps of 16: A is MT m-tiles of 16 rows from row0 of sA, B^T the
 * rows of sB (the N8 x 8 output columns); e.g. S = Q K^T (K rows are keys). */
template <int MT, int N8, int KT, int SROW>
static __device__ __forceinline__ void mma_rows_bt(float (*acc)[N8][4], const bf16 *sA, int row0, const bf16 *sB,
                                                   int lane) {
#pragma unroll
    for (int kk = 0; kk < KT; kk++) {
        uint32_t a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
            ldsm_x4(a[mt][0], a[mt][1], a[mt][2], a[mt][3], sA + (row0 + mt * 16 + (lane & 15)) * SROW + kk * 16 + (lane >> 4) * 8);
#pragma unroll
        for (int np = 0; np < N8 / 2; np++) {
            uint32_t b0, b1, b2, b3;
            ldsm_x4(b0, b1, b2, b3, sB + (np * 16 + (lane & 7) + (lane >> 4) * 8) * SROW + kk * 16 + ((lane >> 3) & 1) * 8);
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                mma_16816(acc[mt][2 * np], a[mt], b0, b1);
                mma_16816(acc[mt][2 * np + 1], a[mt], b2, b3);
            }
        }
    }
}

/* acc[mt][n] += a[mt] B for one k-step: a the A fragments (16 rows x the 16 k of the step), B the
 * step's 16 rows from sBk (k rows, N8 x 8 columns); e.g. O += P V, dQ += dS K. */
template <int MT, int N8, int SROW>
static __device__ __forceinline__ void mma_regs_b(float (*acc)[N8][4], const uint32_t (*a)[4], const bf16 *sBk, int lane) {
    const bf16 *row = sBk + ((lane & 7) + ((lane >> 3) & 1) * 8) * SROW;
#pragma unroll
    for (int dp = 0; dp < N8 / 2; dp++) {
        uint32_t b0, b1, b2, b3;
        ldsm_x4_t(b0, b1, b2, b3, row + dp * 16 + (lane >> 4) * 8);
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            mma_16816(acc[mt][2 * dp], a[mt], b0, b1);
            mma_16816(acc[mt][2 * dp + 1], a[mt], b2, b3);
        }
    }
    if (N8 % 2) {
        uint32_t b0, b1;
        ldsm_x2_t(b0, b1, row + (N8 - 1) * 8);
#pragma unroll
        for (int mt = 0; mt < MT; mt++) mma_16816(acc[mt][N8 - 1], a[mt], b0, b1);
    }
}

/* Two products of one warp row-block at once, their loads interleaved (the key/value-stationary
 * backward: S^T = K Q^T with dP^T = V dO^T, 16 rows from row0, N8 n-tiles, KT k-steps). */
template <int N8, int KT, int SROW>
static __device__ __forceinline__ void mma_rows_bt_pair(float (*c1)[4], const bf16 *sA1, const bf16 *sB1, float (*c2)[4],
                                                        const bf16 *sA2, const bf16 *sB2, int row0, int lane) {
#pragma unroll
    for (int kk = 0; kk < KT; kk++) {
        uint32_t a1[4], a2[4];
        ldsm_x4(a1[0], a1[1], a1[2], a1[3], sA1 + (row0 + (lane & 15)) * SROW + kk * 16 + (lane >> 4) * 8);
        ldsm_x4(a2[0], a2[1], a2[2], a2[3], sA2 + (row0 + (lane & 15)) * SROW + kk * 16 + (lane >> 4) * 8);
#pragma unroll
        for (int np = 0; np < N8 / 2; np++) {
            const int off = (np * 16 + (lane & 7) + (lane >> 4) * 8) * SROW + kk * 16 + ((lane >> 3) & 1) * 8;
            uint32_t b0, b1, b2, b3;
            ldsm_x4(b0, b1, b2, b3, sB1 + off);
            mma_16816(c1[2 * np], a1, b0, b1);
            mma_16816(c1[2 * np + 1], a1, b2, b3);
            ldsm_x4(b0, b1, b2, b3, sB2 + off);
            mma_16816(c2[2 * np], a2, b0, b1);
            mma_16816(c2[2 * np + 1], a2, b2, b3);
        }
    }
}

/* c1 += a1 B1 and c2 += a2 B2 for one k-step, loads interleaved (dV += P^T dO with dK += dS^T Q). */
template <int N8, int SROW>
static __device__ __forceinline__ void mma_regs_b_pair(float (*c1)[4], const uint32_t *a1, const bf16 *sB1k, float (*c2)[4],
                                                       const uint32_t *a2, const bf16 *sB2k, int lane) {
    const int roff = ((lane & 7) + ((lane >> 3) & 1) * 8) * SROW;
#pragma unroll
    for (int dp = 0; dp < N8 / 2; dp++) {
        uint32_t b0, b1, b2, b3;
        ldsm_x4_t(b0, b1, b2, b3, sB1k + roff + dp * 16 + (lane >> 4) * 8);
        mma_16816(c1[2 * dp], a1, b0, b1);
        mma_16816(c1[2 * dp + 1], a1, b2, b3);
        ldsm_x4_t(b0, b1, b2, b3, sB2k + roff + dp * 16 + (lane >> 4) * 8);
        mma_16816(c2[2 * dp], a2, b0, b1);
        mma_16816(c2[2 * dp + 1], a2, b2, b3);
    }
    if (N8 % 2) {
        uint32_t b0, b1;
        ldsm_x2_t(b0, b1, sB1k + roff + (N8 - 1) * 8);
        mma_16816(c1[N8 - 1], a1, b0, b1);
        ldsm_x2_t(b0, b1, sB2k + roff + (N8 - 1) * 8);
        mma_16816(c2[N8 - 1], a2, b0, b1);
    }
}

/* The A fragments of one k-step (columns 16 kk..16 kk + 15) of an accumulator c (the C layout of
 * n-tiles 2 kk and 2 kk + 1), rounded to bf16: P for P V. */
template <int N8> static __device__ __forceinline__ void acc_to_a(uint32_t *a, const float (*c)[4], int kk) {
    a[0] = pack_bf16x2(c[2 * kk][0], c[2 * kk][1]);
    a[1] = pack_bf16x2(c[2 * kk][2], c[2 * kk][3]);
    a[2] = pack_bf16x2(c[2 * kk + 1][0], c[2 * kk + 1][1]);
    a[3] = pack_bf16x2(c[2 * kk + 1][2], c[2 * kk + 1][3]);
}

/* A block of BQ packed queries of one segment (the forward and dQ kernels' grid: x counts the
 * segment's query tiles from the last, heavier when causal; y the segment). ok false: no rows. */
struct qblock {
    int seg, b, head, kvh, row0, nrows;
    long segrow; /* first row's index in the packed arrays */
    bool ok;
};
static __device__ __forceinline__ qblock qblock_of(const cu_attn_params &p, int BQ) {
    qblock q;
    q.seg = blockIdx.y;
    q.b = q.seg / p.h;
    q.head = q.seg % p.h;
    q.kvh = q.head / (p.h / p.hkv);
    const int cnt = p.cnt[q.seg];
    q.row0 = (gridDim.x - 1 - blockIdx.x) * BQ;
    q.ok = q.row0 < cnt;
    q.nrows = q.ok ? min(BQ, cnt - q.row0) : 0;
    q.segrow = (long)q.seg * p.N + q.row0;
    return q;
}

/* The keys a query block attends: K and V rows of its (batch row, KV head) in qkv (row stride qd),
 * keys 0..kend-1 (causal: up to its last position) in nkt tiles of BK; minpos = its first
 * position (tiles past it need the causal mask). */
struct krange {
    const bf16 *k, *v;
    int minpos, kend, nkt;
};
template <int D, bool CAUSAL>
static __device__ __forceinline__ krange krange_of(const cu_attn_params &p, const qblock &q, int BK) {
    krange r;
    r.k = reinterpret_cast<const bf16 *>(p.qkv) + (long)q.b * p.N * p.qd + p.h * D + q.kvh * D;
    r.v = r.k + p.hkv * D;
    r.minpos = p.pos[q.segrow];
    r.kend = CAUSAL ? min(p.N, p.pos[q.segrow + q.nrows - 1] + 1) : p.N;
    r.nkt = (r.kend + BK - 1) / BK;
    return r;
}

/* cp.async of a tile of rows (D columns, row stride ld in the source, SROW in shared memory): rows
 * r < valid from src + r ld, rows valid..rows zero-filled. */
template <int D, int SROW>
static __device__ __forceinline__ void cp_rows(bf16 *dst, const bf16 *src, long ld, int rows, int valid) {
    constexpr int CHD = D / 8;
    for (int i = threadIdx.x; i < rows * CHD; i += blockDim.x) {
        const int r = i / CHD, c = i % CHD;
        const bool ok = r < valid;
        cp_async16(dst + r * SROW + c * 8, src + (long)(ok ? r : 0) * ld + c * 8, ok);
    }
}

/* The forward kernels' block set-up: positions and gates of the block's rows into shared memory
 * (padding rows: the last position, gate 0, never written). */
static __device__ __forceinline__ void rows_init(const cu_attn_params &p, const int *pos, int nrows, int BQ, int b,
                                                 int head, int *sPos, float *sGate) {
    for (int r = threadIdx.x; r < BQ; r += blockDim.x) {
        const int ps = r < nrows ? pos[r] : p.N - 1;
        sPos[r] = ps;
        sGate[r] = r < nrows ? p.gates[((long)b * p.N + ps) * p.h + head] : 0.f;
    }
}

/* The forward kernels' epilogue: rows r < nrows of o (sO) to op packed, of gate * o (sG) to og at
 * their token; both staged row-major with row stride sr, D columns. */
template <int D>
static __device__ __forceinline__ void rows_store(const cu_attn_params &p, const bf16 *sO, const bf16 *sG, int sr, long segrow,
                                                  int nrows, int b, int head, const int *sPos) {
    constexpr int CHD = D / 8;
    bf16 *op = reinterpret_cast<bf16 *>(p.op) + segrow * D;
    bf16 *og = reinterpret_cast<bf16 *>(p.og) + (long)b * p.N * p.h * D + head * D;
    for (int i = threadIdx.x; i < nrows * CHD; i += blockDim.x) {
        const int r = i / CHD, c = i % CHD;
        *reinterpret_cast<uint4 *>(op + (long)r * D + c * 8) = *reinterpret_cast<const uint4 *>(sO + r * sr + c * 8);
        *reinterpret_cast<uint4 *>(og + (long)sPos[r] * p.h * D + c * 8) =
            *reinterpret_cast<const uint4 *>(sG + r * sr + c * 8);
    }
}
#endif
