/* Flash attention forward over packed queries (kernels.h: segments), mma.sync m16n8k16 bf16 with
 * fp32 accumulation (sm_80 and later). One block: CU_FWD_BQ(d) packed queries of one segment
 * (CU_WARPS warps, 16 or 32 rows each), all keys of its KV head in tiles of CU_FWD_BK(d) (causal:
 * up to the tile's last position; keys past a row's position masked), online softmax in fp32 on
 * the raw scores (p = 2^((s - m) scale log2 e): exact near the maximum, as the CPU path).
 * K and V tiles are single-buffered and overlapped: V_j loads while S = Q K_j^T runs, K_{j+1}
 * while O += P V_j runs (FlashAttention-2's pipeline). Epilogue: o = O / l staged through shared
 * memory, written packed (op) and, times the pair's gate, scattered to its token and head (og). */
#include <math.h>

#include "common.cuh"
#include "tiles.cuh"

template <int D, bool CAUSAL>
__global__ void __launch_bounds__(CU_WARPS * 32) flash_fwd_kernel(const cu_attn_params p) {
    constexpr int BQ = CU_FWD_BQ(D), BK = CU_FWD_BK(D), MT = BQ / (16 * CU_WARPS);
    constexpr int SROW = tile_dims<D>::SROW, DK = tile_dims<D>::DK, NT = tile_dims<D>::NT;
    constexpr int KT = tile_dims<D>::KT, NS = BK / 8;
    static_assert(BQ == 2 * BK, "the epilogue stages og in the K and V tiles");
    extern __shared__ __align__(16) unsigned char smem[];
    bf16 *sQ = reinterpret_cast<bf16 *>(smem);
    bf16 *sK = sQ + BQ * SROW;
    bf16 *sV = sK + BK * SROW;
    int *sPos = reinterpret_cast<int *>(sV + BK * SROW);
    float *sGate = reinterpret_cast<float *>(sPos + BQ);

    const qblock qb = qblock_of(p, BQ);
    if (!qb.ok) return;
    const int b = qb.b, head = qb.head, nrows = qb.nrows;
    const long segrow = qb.segrow;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int *pos = p.pos + segrow;

    rows_init(p, pos, nrows, BQ, b, head, sPos, sGate);
    if (DK > D)
        for (int r = tid; r < BQ + 2 * BK; r += blockDim.x)
            for (int c = D; c < DK; c++) sQ[r * SROW + c] = __float2bfloat16(0.f);
    cp_rows<D, SROW>(sQ, reinterpret_cast<const bf16 *>(p.qp) + segrow * D, D, BQ, nrows);
    const krange kr = krange_of<D, CAUSAL>(p, qb, BK);
    const bf16 *kbase = kr.k, *vbase = kr.v;
    const int minpos = kr.minpos, kend = kr.kend, nkt = kr.nkt;
    auto load_tile = [&](bf16 *dst, const bf16 *src, int k0) { cp_rows<D, SROW>(dst, src + (long)k0 * p.qd, p.qd, BK, kend - k0); };
    load_tile(sK, kbase, 0);
    cp_async_commit();

    const float cl2 = p.scale * 1.4426950408889634f;
    float o[MT][NT][4];
    float mrow[MT][2], lsum[MT][2];
    frags_zero(o);
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        mrow[mt][0] = mrow[mt][1] = -INFINITY;
        lsum[mt][0] = lsum[mt][1] = 0.f;
    }
    const int wrow = warp * 16 * MT;

    for (int j = 0; j < nkt; j++) {
        const int k0 = j * BK;
        cp_async_wait<0>();
        __syncthreads();
        load_tile(sV, vbase, k0);
        cp_async_commit();
        float s[MT][NS][4];
        frags_zero(s);
        mma_rows_bt<MT, NS, KT, SROW>(s, sQ, wrow, sK, lane);
        const bool need_mask = k0 + BK > kend || (CAUSAL && k0 + BK - 1 > minpos);
        if (need_mask) {
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int nt = 0; nt < NS; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int row = wrow + mt * 16 + g + (e >= 2 ? 8 : 0);
                        const int key = k0 + nt * 8 + 2 * t4 + (e & 1);
                        if (key >= kend || (CAUSAL && key > sPos[row])) s[mt][nt][e] = -INFINITY;
                    }
        }
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                float mx = mrow[mt][hf];
#pragma unroll
                for (int nt = 0; nt < NS; nt++) mx = fmaxf(mx, fmaxf(s[mt][nt][2 * hf], s[mt][nt][2 * hf + 1]));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                const float ms = mx == -INFINITY ? 0.f : mx;
                const float alpha = exp2f((mrow[mt][hf] - ms) * cl2);
                mrow[mt][hf] = mx;
                float rs = 0.f;
#pragma unroll
                for (int nt = 0; nt < NS; nt++) {
                    const float p0 = exp2f((s[mt][nt][2 * hf] - ms) * cl2);
                    const float p1 = exp2f((s[mt][nt][2 * hf + 1] - ms) * cl2);
                    s[mt][nt][2 * hf] = p0;
                    s[mt][nt][2 * hf + 1] = p1;
                    rs += p0 + p1;
                }
                lsum[mt][hf] = lsum[mt][hf] * alpha + rs;
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    o[mt][nt][2 * hf] *= alpha;
                    o[mt][nt][2 * hf + 1] *= alpha;
                }
            }
        cp_async_wait<0>();
        __syncthreads();
        if (j + 1 < nkt) {
            load_tile(sK, kbase, k0 + BK);
            cp_async_commit();
        }
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++) {
            uint32_t a[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) acc_to_a<NS>(a[mt], s[mt], kk);
            mma_regs_b<MT, NT, SROW>(o, a, sV + kk * 16 * SROW, lane);
        }
    }

    /* epilogue: o into sQ (rows of this warp), gate * o into the K and V tiles */
    __syncthreads();
    bf16 *sO = sQ, *sG = sK;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            float l = lsum[mt][hf];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            const int row = wrow + mt * 16 + g + 8 * hf;
            const float inv = 1.f / l, gate = sGate[row];
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const float v0 = o[mt][nt][2 * hf] * inv, v1 = o[mt][nt][2 * hf + 1] * inv;
                *reinterpret_cast<uint32_t *>(sO + row * SROW + nt * 8 + 2 * t4) = pack_bf16x2(v0, v1);
                *reinterpret_cast<uint32_t *>(sG + row * SROW + nt * 8 + 2 * t4) = pack_bf16x2(gate * v0, gate * v1);
            }
            if (t4 == 0 && row < nrows) {
                p.mrow[segrow + row] = mrow[mt][hf];
                p.lrow[segrow + row] = log2f(l);
            }
        }
    __syncthreads();
    rows_store<D>(p, sO, sG, SROW, segrow, nrows, b, head, sPos);
}

template <int D, bool CAUSAL> static cudaError_t launch_fwd(const cu_attn_params *p, cudaStream_t st) {
    constexpr int BQ = CU_FWD_BQ(D), BK = CU_FWD_BK(D), SROW = tile_dims<D>::SROW;
    const size_t smem = (size_t)(BQ + 2 * BK) * SROW * sizeof(bf16) + (size_t)BQ * (sizeof(int) + sizeof(float));
    cudaError_t e = cudaFuncSetAttribute(flash_fwd_kernel<D, CAUSAL>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    const dim3 grid((p->N + BQ - 1) / BQ, p->B * p->h);
    flash_fwd_kernel<D, CAUSAL><<<grid, CU_WARPS * 32, smem, st>>>(*p);
    return cudaGetLastError();
}

template <int D> static cudaError_t fwd_d(const cu_attn_params *p, cudaStream_t st) {
    return p->causal ? launch_fwd<D, true>(p, st) : launch_fwd<D, false>(p, st);
}

extern "C" bool cu_head_dim_supported(int d) {
    return d == 32 || d == 64 || d == 72 || d == 80 || d == 96 || d == 128;
}

extern "C" cudaError_t cu_flash_forward(const cu_attn_params *p, cudaStream_t st) {
    switch (p->d) {
    case 32: return fwd_d<32>(p, st);
    case 64: return fwd_d<64>(p, st);
    case 72: return fwd_d<72>(p, st);
    case 80: return fwd_d<80>(p, st);
    case 96: return fwd_d<96>(p, st);
    case 128: return fwd_d<128>(p, st);
    default: return cudaErrorInvalidValue;
    }
}
