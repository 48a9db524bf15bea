/* Flash attention backward over packed queries, mma.sync m16n8k16 bf16 with fp32 accumulation, in
 * two kernels, neither with atomics (the same bits on every run):
 *  - key/value-stationary (dK, dV; FlashAttention-2's loop): one block holds CU_BWD_BK keys of one
 *    (batch row, KV head) (16 per warp) and walks the query tiles (CU_BWD_BQ(d) packed rows) of every
 *    query head of its group, the next tile's q, dO and row statistics loaded while the current one
 *    computes: S^T = K Q^T, P^T = 2^((S^T - m) scale log2 e - lse) (recomputed from the forward's raw
 *    maximum and log-sum-exp: exact near the maximum), dP^T = V dO^T, dS^T = P^T (dP^T - rowsum(dO o)),
 *    dV += P^T dO, dK += dS^T Q in registers, written once (dK times the score scale);
 *  - query-stationary (dQ): one block holds CU_DQ_BQ(d) packed queries and streams the keys and values
 *    of its KV head as the forward does: S = Q K^T, P, dP = dO V^T, dS, dQ += dS K; then
 *    dQ times the scale, RoPE^-1 at the query's position, scattered to dqkv's q columns.
 * Against FlashAttention-2's single kernel (dQ by fp32 atomics, order-dependent), this recomputes
 * Q K^T and dO V^T once more (7 products per tile pair instead of 5) and needs no dQ accumulator. */
#include <math.h>

#include "common.cuh"
#include "tiles.cuh"

template <int D, bool CAUSAL>
__global__ void __launch_bounds__(CU_WARPS * 32) flash_bwd_kv_kernel(const cu_attn_params p) {
    constexpr int BK = CU_BWD_BK, BQ = CU_BWD_BQ(D);
    constexpr int SROW = tile_dims<D>::SROW, DK = tile_dims<D>::DK, NT = tile_dims<D>::NT;
    constexpr int KT = tile_dims<D>::KT, QT = BQ / 8;
    static_assert(BK == 16 * CU_WARPS, "one warp per 16 keys");
    extern __shared__ __align__(16) unsigned char smem[];
    bf16 *sK = reinterpret_cast<bf16 *>(smem);
    bf16 *sV = sK + BK * SROW;
    bf16 *sQb = sV + BK * SROW;         /* [2][BQ][SROW] */
    bf16 *sdOb = sQb + 2 * BQ * SROW;   /* [2][BQ][SROW] */
    float *sMb = reinterpret_cast<float *>(sdOb + 2 * BQ * SROW); /* [2][BQ] each: m, lse, dsum */
    float *sLb = sMb + 2 * BQ, *sDb = sLb + 2 * BQ;
    int *sPb = reinterpret_cast<int *>(sDb + 2 * BQ);

    const int nkb = (p.N + BK - 1) / BK;
    const int jb = nkb - 1 - blockIdx.x; /* heavy (causal: early) key blocks last */
    const int b = blockIdx.y / p.hkv, kvh = blockIdx.y % p.hkv, grp = p.h / p.hkv;
    const int k0 = jb * BK;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int hd = p.h * D;
    const float cl2 = p.scale * 1.4426950408889634f;

    if (DK > D)
        for (int r = tid; r < 2 * BK + 4 * BQ; r += blockDim.x)
            for (int c = D; c < DK; c++) sK[r * SROW + c] = __float2bfloat16(0.f);
    const bf16 *kbase = reinterpret_cast<const bf16 *>(p.qkv) + (long)b * p.N * p.qd + hd + kvh * D;
    const bf16 *vbase = kbase + p.hkv * D;
    cp_rows<D, SROW>(sK, kbase + (long)k0 * p.qd, p.qd, BK, p.N - k0);
    cp_rows<D, SROW>(sV, vbase + (long)k0 * p.qd, p.qd, BK, p.N - k0);
    cp_async_commit();

    /* the query tiles this block visits: (gi, tq) in order, causal ones ending before k0 skipped */
    auto advance = [&](int &gi, int &tq) {
        for (;;) {
            tq++;
            const int seg = b * p.h + kvh * grp + gi;
            const int cnt = p.cnt[seg];
            if (tq * BQ >= cnt) {
                if (++gi >= grp) return false;
                tq = -1;
                continue;
            }
            if (!CAUSAL) return true;
            const int last = min(BQ, cnt - tq * BQ) - 1;
            if (p.pos[(long)seg * p.N + tq * BQ + last] >= k0) return true;
        }
    };
    auto load = [&](int gi, int tq, int buf) {
        const int seg = b * p.h + kvh * grp + gi, r0 = tq * BQ;
        const int nrows = min(BQ, p.cnt[seg] - r0);
        const long base = (long)seg * p.N + r0;
        const bf16 *qsrc = reinterpret_cast<const bf16 *>(p.qp) + base * D;
        const bf16 *dosrc = reinterpret_cast<const bf16 *>(p.dop) + base * D;
        cp_rows<D, SROW>(sQb + buf * BQ * SROW, qsrc, D, BQ, nrows);
        cp_rows<D, SROW>(sdOb + buf * BQ * SROW, dosrc, D, BQ, nrows);
        for (int r = tid; r < BQ; r += blockDim.x) {
            const bool ok = r < nrows;
            sMb[buf * BQ + r] = ok ? p.mrow[base + r] : 0.f;
            sLb[buf * BQ + r] = ok ? p.lrow[base + r] : INFINITY; /* padding rows: P = 0 */
            sDb[buf * BQ + r] = ok ? p.dsum[base + r] : 0.f;
            sPb[buf * BQ + r] = ok ? p.pos[base + r] : -1;
        }
    };

    float dk[NT][4], dv[NT][4];
    frags_zero(dk);
    frags_zero(dv);
    const int krow = warp * 16;

    int gi = 0, tq = -1, buf = 0;
    bool have = advance(gi, tq);
    if (have) load(gi, tq, 0);
    cp_async_commit();
    while (have) {
        int ngi = gi, ntq = tq;
        const bool next = advance(ngi, ntq);
        __syncthreads(); /* everyone is done with buffer buf ^ 1 (the tile before) */
        if (next) load(ngi, ntq, buf ^ 1);
        cp_async_commit();
        cp_async_wait<1>(); /* this tile's (and the K, V) copies are in */
        __syncthreads();
        const bf16 *sQ = sQb + buf * BQ * SROW, *sdO = sdOb + buf * BQ * SROW;
        const float *sM = sMb + buf * BQ, *sL = sLb + buf * BQ, *sD = sDb + buf * BQ;
        const int *sPos = sPb + buf * BQ;
        const int minpos = sPos[0];

        float st[QT][4], dpt[QT][4];
        frags_zero(st);
        frags_zero(dpt);
        mma_rows_bt_pair<QT, KT, SROW>(st, sK, sQ, dpt, sV, sdO, krow, lane); /* S^T = K Q^T, dP^T = V dO^T */
        const bool need_mask = k0 + BK > p.N || (CAUSAL && k0 + BK - 1 > minpos);
#pragma unroll
        for (int nt = 0; nt < QT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int q = nt * 8 + 2 * t4 + (e & 1);
                const int key = k0 + krow + g + (e >= 2 ? 8 : 0);
                float pv = exp2f((st[nt][e] - sM[q]) * cl2 - sL[q]);
                if (need_mask && (key >= p.N || (CAUSAL && key > sPos[q]))) pv = 0.f;
                st[nt][e] = pv;
                dpt[nt][e] = pv * (dpt[nt][e] - sD[q]);
            }
#pragma unroll
        for (int kq = 0; kq < BQ / 16; kq++) {
            uint32_t ap[4], as[4];
            acc_to_a<QT>(ap, st, kq);
            acc_to_a<QT>(as, dpt, kq);
            mma_regs_b_pair<NT, SROW>(dv, ap, sdO + kq * 16 * SROW, dk, as, sQ + kq * 16 * SROW, lane); /* dV += P^T dO, dK += dS^T Q */
        }
        gi = ngi;
        tq = ntq;
        have = next;
        buf ^= 1;
    }
    cp_async_wait<0>(); /* a block with no query tile still waits for its K and V copies */

    bf16 *dkbase = reinterpret_cast<bf16 *>(p.dqkv) + (long)b * p.N * p.qd + hd + kvh * D;
    bf16 *dvbase = dkbase + p.hkv * D;
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        const int key = k0 + krow + g + 8 * hf;
        if (key >= p.N) continue;
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            *reinterpret_cast<uint32_t *>(dkbase + (long)key * p.qd + nt * 8 + 2 * t4) =
                pack_bf16x2(dk[nt][2 * hf] * p.scale, dk[nt][2 * hf + 1] * p.scale);
            *reinterpret_cast<uint32_t *>(dvbase + (long)key * p.qd + nt * 8 + 2 * t4) =
                pack_bf16x2(dv[nt][2 * hf], dv[nt][2 * hf + 1]);
        }
    }
}

template <int D, bool CAUSAL>
__global__ void __launch_bounds__(CU_WARPS * 32) flash_bwd_dq_kernel(const cu_attn_params p) {
    constexpr int MT = CU_DQ_MT(D), BQ = CU_DQ_BQ(D), BK = CU_DQ_BK, NS = BK / 8;
    constexpr int SROW = tile_dims<D>::SROW, DK = tile_dims<D>::DK, NT = tile_dims<D>::NT;
    constexpr int KT = tile_dims<D>::KT;
    static_assert(BQ == 16 * MT * CU_WARPS, "one warp per 16 MT queries");
    static_assert((2 * BQ + 3 * BK) * SROW * 2 >= BQ * D * 4, "the dQ tile is staged over the q, dO, K and V tiles");
    extern __shared__ __align__(16) unsigned char smem[];
    bf16 *sQ = reinterpret_cast<bf16 *>(smem);
    bf16 *sdO = sQ + BQ * SROW;
    bf16 *sKb = sdO + BQ * SROW; /* [2][BK][SROW]: K_j and K_{j+1} */
    bf16 *sV = sKb + 2 * BK * SROW;
    float *sM = reinterpret_cast<float *>(sV + BK * SROW);
    float *sL = sM + BQ, *sD = sL + BQ;
    int *sPos = reinterpret_cast<int *>(sD + BQ);

    const qblock qb = qblock_of(p, BQ);
    if (!qb.ok) return;
    const int b = qb.b, head = qb.head, nrows = qb.nrows;
    const long segrow = qb.segrow;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const float cl2 = p.scale * 1.4426950408889634f;

    for (int r = tid; r < BQ; r += blockDim.x) {
        const bool ok = r < nrows;
        sM[r] = ok ? p.mrow[segrow + r] : 0.f;
        sL[r] = ok ? p.lrow[segrow + r] : INFINITY; /* padding rows: P = 0 */
        sD[r] = ok ? p.dsum[segrow + r] : 0.f;
        sPos[r] = ok ? p.pos[segrow + r] : p.N - 1;
    }
    if (DK > D)
        for (int r = tid; r < 2 * BQ + 3 * BK; r += blockDim.x)
            for (int c = D; c < DK; c++) sQ[r * SROW + c] = __float2bfloat16(0.f);
    cp_rows<D, SROW>(sQ, reinterpret_cast<const bf16 *>(p.qp) + segrow * D, D, BQ, nrows);
    cp_rows<D, SROW>(sdO, reinterpret_cast<const bf16 *>(p.dop) + segrow * D, D, BQ, nrows);
    const krange kr = krange_of<D, CAUSAL>(p, qb, BK);
    const bf16 *kbase = kr.k, *vbase = kr.v;
    const int minpos = kr.minpos, kend = kr.kend, nkt = kr.nkt;
    auto load_tile = [&](bf16 *dst, const bf16 *src, int k0) { cp_rows<D, SROW>(dst, src + (long)k0 * p.qd, p.qd, BK, kend - k0); };
    load_tile(sKb, kbase, 0);
    cp_async_commit();

    float dq[MT][NT][4];
    frags_zero(dq);
    const int wrow = warp * 16 * MT;

    for (int j = 0; j < nkt; j++) {
        const int k0 = j * BK;
        const bf16 *sK = sKb + (j & 1) * BK * SROW;
        cp_async_wait<0>();
        __syncthreads(); /* K_j in; every warp is done with V_{j-1} and K_{j-1} */
        load_tile(sV, vbase, k0);
        cp_async_commit();
        float s[MT][NS][4], dp[MT][NS][4];
        frags_zero(s);
        frags_zero(dp);
        mma_rows_bt<MT, NS, KT, SROW>(s, sQ, wrow, sK, lane); /* S = Q K^T */
        const bool need_mask = k0 + BK > kend || (CAUSAL && k0 + BK - 1 > minpos);
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int nt = 0; nt < NS; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int row = wrow + mt * 16 + g + (e >= 2 ? 8 : 0);
                    const int key = k0 + nt * 8 + 2 * t4 + (e & 1);
                    float pv = exp2f((s[mt][nt][e] - sM[row]) * cl2 - sL[row]);
                    if (need_mask && (key >= kend || (CAUSAL && key > sPos[row]))) pv = 0.f;
                    s[mt][nt][e] = pv;
                }
        cp_async_wait<0>();
        __syncthreads(); /* V_j in */
        if (j + 1 < nkt) {
            load_tile(sKb + ((j + 1) & 1) * BK * SROW, kbase, k0 + BK);
            cp_async_commit();
        }
        mma_rows_bt<MT, NS, KT, SROW>(dp, sdO, wrow, sV, lane); /* dP = dO V^T */
        /* dS = P (dP - rowsum(dO o)); dQ += dS K_j */
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++) {
            uint32_t a[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                const float d0 = sD[wrow + mt * 16 + g], d1 = sD[wrow + mt * 16 + g + 8];
                const float(*sp)[4] = s[mt];
                const float(*pp)[4] = dp[mt];
                a[mt][0] = pack_bf16x2(sp[2 * kk][0] * (pp[2 * kk][0] - d0), sp[2 * kk][1] * (pp[2 * kk][1] - d0));
                a[mt][1] = pack_bf16x2(sp[2 * kk][2] * (pp[2 * kk][2] - d1), sp[2 * kk][3] * (pp[2 * kk][3] - d1));
                a[mt][2] = pack_bf16x2(sp[2 * kk + 1][0] * (pp[2 * kk + 1][0] - d0), sp[2 * kk + 1][1] * (pp[2 * kk + 1][1] - d0));
                a[mt][3] = pack_bf16x2(sp[2 * kk + 1][2] * (pp[2 * kk + 1][2] - d1), sp[2 * kk + 1][3] * (pp[2 * kk + 1][3] - d1));
            }
            mma_regs_b<MT, NT, SROW>(dq, a, sK + kk * 16 * SROW, lane);
        }
    }

    /* dQ (times the scale) staged over the q, dO, K and V tiles, then RoPE^-1 and the scatter */
    __syncthreads();
    float *sdq = reinterpret_cast<float *>(smem);
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const int row = wrow + mt * 16 + g + 8 * hf;
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
                *reinterpret_cast<float2 *>(sdq + row * D + nt * 8 + 2 * t4) =
                    make_float2(dq[mt][nt][2 * hf] * p.scale, dq[mt][nt][2 * hf + 1] * p.scale);
        }
    __syncthreads();
    constexpr int HALF = D / 2;
    bf16 *dst = reinterpret_cast<bf16 *>(p.dqkv) + (long)b * p.N * p.qd + head * D;
    for (int i = tid; i < nrows * HALF; i += blockDim.x) {
        const int r = i / HALF, jj = i % HALF, n = sPos[r];
        float x1 = sdq[r * D + jj], x2 = sdq[r * D + jj + HALF];
        if (p.rope_cos) {
            const float c = p.rope_cos[(long)n * HALF + jj], sn = -p.rope_sin[(long)n * HALF + jj];
            const float y1 = x1 * c - x2 * sn, y2 = x2 * c + x1 * sn;
            x1 = y1;
            x2 = y2;
        }
        dst[(long)n * p.qd + jj] = __float2bfloat16(x1);
        dst[(long)n * p.qd + jj + HALF] = __float2bfloat16(x2);
    }
}

template <int D, bool CAUSAL> static cudaError_t launch_kv(const cu_attn_params *p, cudaStream_t st) {
    constexpr int BK = CU_BWD_BK, BQ = CU_BWD_BQ(D), SROW = tile_dims<D>::SROW;
    const size_t smem = (size_t)(2 * BK + 4 * BQ) * SROW * sizeof(bf16) + (size_t)2 * BQ * (3 * sizeof(float) + sizeof(int));
    cudaError_t e = cudaFuncSetAttribute(flash_bwd_kv_kernel<D, CAUSAL>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    flash_bwd_kv_kernel<D, CAUSAL><<<dim3((p->N + BK - 1) / BK, p->B * p->hkv), CU_WARPS * 32, smem, st>>>(*p);
    return cudaGetLastError();
}

template <int D, bool CAUSAL> static cudaError_t launch_dq(const cu_attn_params *p, cudaStream_t st) {
    constexpr int QB = CU_DQ_BQ(D), KB = CU_DQ_BK, SROW = tile_dims<D>::SROW;
    const size_t smem = (size_t)(2 * QB + 3 * KB) * SROW * sizeof(bf16) + (size_t)QB * (3 * sizeof(float) + sizeof(int));
    cudaError_t e = cudaFuncSetAttribute(flash_bwd_dq_kernel<D, CAUSAL>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    flash_bwd_dq_kernel<D, CAUSAL><<<dim3((p->N + QB - 1) / QB, p->B * p->h), CU_WARPS * 32, smem, st>>>(*p);
    return cudaGetLastError();
}

template <int D> static cudaError_t bwd_d(const cu_attn_params *p, bool dq, cudaStream_t st) {
    if (dq) return p->causal ? launch_dq<D, true>(p, st) : launch_dq<D, false>(p, st);
    return p->causal ? launch_kv<D, true>(p, st) : launch_kv<D, false>(p, st);
}

static cudaError_t bwd(const cu_attn_params *p, bool dq, cudaStream_t st) {
    switch (p->d) {
    case 32: return bwd_d<32>(p, dq, st);
    case 64: return bwd_d<64>(p, dq, st);
    case 72: return bwd_d<72>(p, dq, st);
    case 80: return bwd_d<80>(p, dq, st);
    case 96: return bwd_d<96>(p, dq, st);
    case 128: return bwd_d<128>(p, dq, st);
    default: return cudaErrorInvalidValue;
    }
}

extern "C" cudaError_t cu_flash_backward_kv(const cu_attn_params *p, cudaStream_t st) { return bwd(p, false, st); }
extern "C" cudaError_t cu_flash_backward_dq(const cu_attn_params *p, cudaStream_t st) { return bwd(p, true, st); }
