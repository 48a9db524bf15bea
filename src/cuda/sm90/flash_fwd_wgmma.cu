/* Flash attention forward over packed queries for Hopper (sm_90a): the products on wgmma, the
 * warpgroup-wide asynchronous tensor-core instruction (PTX ISA "Asynchronous Warpgroup Level Matrix
 * Multiply-Accumulate"), which the mma.sync kernel (../flash_fwd.cu) cannot reach. Same contract as
 * cu_flash_forward (kernels.h), head_dim 64 and 128.
 *
 * One block: NWG warpgroups (2: 128 queries, key tiles of 128, one block per SM; 1: 64 queries, key
 * tiles of 64, two blocks per SM), 64 queries each. S = Q K^T is one chain of m64nBKk16 wgmmas per warpgroup with both operands in
 * shared memory; the online softmax (fp32, raw-score maxima as the mma.sync kernel) runs on the
 * accumulators; O += P V takes P from registers (the accumulator layout is the A-fragment layout)
 * and V^T from shared memory. All operands are K-major in the no-swizzle ("interleaved") canonical
 * layout: 8 x 16-byte core matrices, 128 contiguous bytes each; LBO = 128 bytes between the two
 * core matrices of a 16-wide k step, SBO = the bytes of one 8-row group. V is read as V^T, written
 * once per forward by cu_transpose_v, so that both products use the same layout. K and V^T tiles
 * are double-buffered with cp.async (the next tile loads during this one's products); written
 * shared memory is handed to the tensor cores with fence.proxy.async. No warp specialisation or
 * TMA yet (FlashAttention-3's further steps). */
#include <math.h>

#include "../common.cuh"
#include "../tiles.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MOH_WGMMA_DEVICE 1
#endif

#ifdef MOH_WGMMA_DEVICE
/* d[64] = A B (scale_d 0) or d + A B (1): A 64 x 16 and B 16 x 128 from shared memory (descriptors,
 * both K-major). */
static __device__ __forceinline__ void wgmma_m64n128k16_ss(float *d, uint64_t da, uint64_t db, int scale_d) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "l"(da), "l"(db), "r"(scale_d));
}
/* d[32] = A B (scale_d 0) or d + A B (1): A 64 x 16 and B 16 x 64 from shared memory (descriptors,
 * both K-major). */
static __device__ __forceinline__ void wgmma_m64n64k16_ss(float *d, uint64_t da, uint64_t db, int scale_d) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "l"(da), "l"(db), "r"(scale_d));
}
/* d[32] += A B: A 64 x 16 from registers (each warp's 16 rows as the mma.sync A fragment),
 * B 16 x 64 from shared memory (descriptor, K-major). */
static __device__ __forceinline__ void wgmma_m64n64k16_rs(float *d, const uint32_t *a, uint64_t db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
/* d[64] += A B: A 64 x 16 from registers (each warp's 16 rows as the mma.sync A fragment),
 * B 16 x 128 from shared memory (descriptor, K-major). */
static __device__ __forceinline__ void wgmma_m64n128k16_rs(float *d, const uint32_t *a, uint64_t db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}

static __device__ __forceinline__ void wg_fence(void) { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
static __device__ __forceinline__ void wg_commit(void) { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
static __device__ __forceinline__ void wg_wait0(void) { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
static __device__ __forceinline__ void fence_proxy_async(void) {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
/* Matrix descriptor of a K-major no-swizzle operand at p: start address, LBO 128 bytes (the next
 * core matrix along K), SBO sbo bytes (the next 8-row group), base offset 0, layout 0. */
static __device__ __forceinline__ uint64_t desc_k(const void *p, uint32_t sbo) {
    const uint32_t a = smem_addr(p);
    return (uint64_t)((a & 0x3FFFFu) >> 4) | ((uint64_t)(128u >> 4) << 16) | ((uint64_t)(sbo >> 4) << 32);
}
template <int N> static __device__ __forceinline__ void wg_ss(float *d, uint64_t da, uint64_t db, int acc);
template <> __device__ __forceinline__ void wg_ss<128>(float *d, uint64_t da, uint64_t db, int acc) {
    wgmma_m64n128k16_ss(d, da, db, acc);
}
template <> __device__ __forceinline__ void wg_ss<64>(float *d, uint64_t da, uint64_t db, int acc) {
    wgmma_m64n64k16_ss(d, da, db, acc);
}
template <int N> static __device__ __forceinline__ void wg_rs(float *d, const uint32_t *a, uint64_t db);
template <> __device__ __forceinline__ void wg_rs<64>(float *d, const uint32_t *a, uint64_t db) { wgmma_m64n64k16_rs(d, a, db); }
template <> __device__ __forceinline__ void wg_rs<128>(float *d, const uint32_t *a, uint64_t db) { wgmma_m64n128k16_rs(d, a, db); }
/* Byte offset of element (r, c) of a K-major no-swizzle tile whose 8-row groups are sbo bytes. */
static __device__ __forceinline__ uint32_t kofs(int r, int c, int sbo) {
    return (uint32_t)((r >> 3) * sbo + (c >> 3) * 128 + (r & 7) * 16 + (c & 7) * 2);
}
#endif


template <int D, int NWG, int BK, bool CAUSAL>
__global__ void __launch_bounds__(NWG * 128, NWG == 1 ? 2 : 1) flash_fwd_wgmma_kernel(const cu_attn_params p) {
#ifdef MOH_WGMMA_DEVICE
    constexpr int BQ = NWG * 64, CHD = D / 8, CHK = BK / 8;
    constexpr int SBO_Q = D * 16, SBO_V = BK * 16; /* bytes of one 8-row group: Q and K tiles, V^T tile */
    constexpr int NS = BK / 8, NT = D / 8;
    constexpr int QB = BQ * D * 2, KB = BK * D * 2; /* tile bytes (V^T: D x BK, the same) */
    extern __shared__ __align__(128) unsigned char smem[];
    unsigned char *sQ = smem, *sK = smem + QB, *sV = sK + 2 * KB;
    int *sPos = reinterpret_cast<int *>(sV + 2 * KB);
    float *sGate = reinterpret_cast<float *>(sPos + BQ);

    const qblock qb = qblock_of(p, BQ);
    if (!qb.ok) return;
    const int b = qb.b, head = qb.head, nrows = qb.nrows, kvh = qb.kvh;
    const long segrow = qb.segrow;
    const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int *pos = p.pos + segrow;

    rows_init(p, pos, nrows, BQ, b, head, sPos, sGate);
    const bf16 *qsrc = reinterpret_cast<const bf16 *>(p.qp) + segrow * D;
    for (int i = tid; i < BQ * CHD; i += blockDim.x) { /* 8 consecutive threads: one core matrix */
        const int rr = i & 7, c = (i >> 3) % CHD, r = ((i >> 3) / CHD) * 8 + rr;
        const bool ok = r < nrows;
        cp_async16(sQ + kofs(r, c * 8, SBO_Q), qsrc + (long)(ok ? r : 0) * D + c * 8, ok);
    }
    const krange kr = krange_of<D, CAUSAL>(p, qb, BK);
    const bf16 *kbase = kr.k, *vtb = reinterpret_cast<const bf16 *>(p.vt) + ((long)b * p.hkv + kvh) * D * p.np;
    const int minpos = kr.minpos, kend = kr.kend, nkt = kr.nkt;
    auto load_kv = [&](int stage, int k0) {
        unsigned char *dk = sK + stage * KB, *dv = sV + stage * KB;
        for (int i = tid; i < BK * CHD; i += blockDim.x) {
            const int rr = i & 7, c = (i >> 3) % CHD, r = ((i >> 3) / CHD) * 8 + rr, key = k0 + r;
            const bool ok = key < kend;
            cp_async16(dk + kofs(r, c * 8, SBO_Q), kbase + (long)(ok ? key : 0) * p.qd + c * 8, ok);
        }
        for (int i = tid; i < D * CHK; i += blockDim.x) {
            const int rr = i & 7, c = (i >> 3) % CHK, dim = ((i >> 3) / CHK) * 8 + rr, key0 = k0 + c * 8;
            const bool ok = key0 < kend;
            cp_async16(dv + kofs(dim, c * 8, SBO_V), vtb + (long)dim * p.np + (ok ? key0 : 0), ok);
        }
    };
    load_kv(0, 0);
    cp_async_commit();

    const float cl2 = p.scale * 1.4426950408889634f;
    float o[NT * 4];
#pragma unroll
    for (int i = 0; i < NT * 4; i++) o[i] = 0.f;
    float mrow[2] = {-INFINITY, -INFINITY}, lsum[2] = {0.f, 0.f};
    const int wrow = wg * 64 + warp * 16; /* this warp's first row in the block */

    for (int j = 0; j < nkt; j++) {
        const int k0 = j * BK, stage = j & 1;
        if (j + 1 < nkt) {
            load_kv(stage ^ 1, k0 + BK);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        fence_proxy_async(); /* this thread's cp.async writes, to the tensor cores' proxy */
        __syncthreads();
        float s[NS * 4];
#pragma unroll
        for (int i = 0; i < NS * 4; i++) s[i] = 0.f;
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++)
            wg_ss<BK>(s, desc_k(sQ + wg * 8 * SBO_Q + kk * 256, SBO_Q), desc_k(sK + stage * KB + kk * 256, SBO_Q), kk > 0);
        wg_commit();
        wg_wait0();
        const bool need_mask = k0 + BK > kend || (CAUSAL && k0 + BK - 1 > minpos);
        if (need_mask) {
#pragma unroll
            for (int i = 0; i < NS * 4; i++) {
                const int row = wrow + g + ((i & 2) ? 8 : 0);
                const int key = k0 + (i >> 2) * 8 + 2 * t4 + (i & 1);
                if (key >= kend || (CAUSAL && key > sPos[row])) s[i] = -INFINITY;
            }
        }
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            float mx = mrow[hf];
#pragma unroll
            for (int n = 0; n < NS; n++) mx = fmaxf(mx, fmaxf(s[n * 4 + 2 * hf], s[n * 4 + 2 * hf + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float ms = mx == -INFINITY ? 0.f : mx;
            const float alpha = exp2f((mrow[hf] - ms) * cl2);
            mrow[hf] = mx;
            float rs = 0.f;
#pragma unroll
            for (int n = 0; n < NS; n++) {
                const float p0 = exp2f((s[n * 4 + 2 * hf] - ms) * cl2), p1 = exp2f((s[n * 4 + 2 * hf + 1] - ms) * cl2);
                s[n * 4 + 2 * hf] = p0;
                s[n * 4 + 2 * hf + 1] = p1;
                rs += p0 + p1;
            }
            lsum[hf] = lsum[hf] * alpha + rs;
#pragma unroll
            for (int n = 0; n < NT; n++) {
                o[n * 4 + 2 * hf] *= alpha;
                o[n * 4 + 2 * hf + 1] *= alpha;
            }
        }
        uint32_t a[BK / 16][4];
#pragma unroll
        for (int kp = 0; kp < BK / 16; kp++) {
            a[kp][0] = pack_bf16x2(s[8 * kp + 0], s[8 * kp + 1]);
            a[kp][1] = pack_bf16x2(s[8 * kp + 2], s[8 * kp + 3]);
            a[kp][2] = pack_bf16x2(s[8 * kp + 4], s[8 * kp + 5]);
            a[kp][3] = pack_bf16x2(s[8 * kp + 6], s[8 * kp + 7]);
        }
        wg_fence();
#pragma unroll
        for (int kp = 0; kp < BK / 16; kp++) wg_rs<D>(o, a[kp], desc_k(sV + stage * KB + kp * 256, SBO_V));
        wg_commit();
        wg_wait0();
        __syncthreads(); /* every warpgroup is done with this stage before it is refilled */
    }

    /* epilogue: o = O / l into the K tiles (row-major, stride D + 8), gate * o into the V tiles */
    constexpr int SR = D + 8;
    bf16 *sO = reinterpret_cast<bf16 *>(sK), *sG = reinterpret_cast<bf16 *>(sV);
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        float l = lsum[hf];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        const int row = wrow + g + 8 * hf;
        const float inv = 1.f / l, gate = sGate[row];
#pragma unroll
        for (int n = 0; n < NT; n++) {
            const float v0 = o[n * 4 + 2 * hf] * inv, v1 = o[n * 4 + 2 * hf + 1] * inv;
            *reinterpret_cast<uint32_t *>(sO + row * SR + n * 8 + 2 * t4) = pack_bf16x2(v0, v1);
            *reinterpret_cast<uint32_t *>(sG + row * SR + n * 8 + 2 * t4) = pack_bf16x2(gate * v0, gate * v1);
        }
        if (t4 == 0 && row < nrows) {
            p.mrow[segrow + row] = mrow[hf];
            p.lrow[segrow + row] = log2f(l);
        }
    }
    __syncthreads();
    rows_store<D>(p, sO, sG, SR, segrow, nrows, b, head, sPos);
#else
    __trap(); /* built without sm_90a: cu_flash_forward_wgmma refuses before launching */
#endif
}

/* V^T: vt[(b h_kv + j) d + e][n] = V[b N + n][j d + e] (keys N..np-1 zero), 32 x 32 tiles. */
__global__ void transpose_v_kernel(bf16 *vt, const bf16 *qkv, int N, int np, int h, int hkv, int d, int qd) {
    __shared__ bf16 tile[32][34];
    const int bk = blockIdx.z, b = bk / hkv, kv = bk % hkv;
    const int n0 = blockIdx.x * 32, e0 = blockIdx.y * 32;
    const bf16 *src = qkv + (long)b * N * qd + (h + hkv) * d + kv * d;
    for (int r = threadIdx.y; r < 32; r += blockDim.y) {
        const int n = n0 + r;
        tile[r][threadIdx.x] = n < N ? src[(long)n * qd + e0 + threadIdx.x] : __float2bfloat16(0.f);
    }
    __syncthreads();
    bf16 *dst = vt + ((long)bk * d + e0) * np + n0;
    for (int r = threadIdx.y; r < 32; r += blockDim.y)
        if (n0 + threadIdx.x < np) dst[(long)r * np + threadIdx.x] = tile[threadIdx.x][r];
}

extern "C" bool cu_wgmma_built(void) {
#ifdef MOH_CUDA_SM90A
    return true;
#else
    return false;
#endif
}

extern "C" bool cu_wgmma_supported(int d) { return d == 64 || d == 128; }

extern "C" cudaError_t cu_transpose_v(const cu_attn_params *p, cudaStream_t st) {
    const dim3 grid((p->np + 31) / 32, p->d / 32, p->B * p->hkv);
    transpose_v_kernel<<<grid, dim3(32, 8), 0, st>>>(reinterpret_cast<bf16 *>(const_cast<uint16_t *>(p->vt)),
                                                     reinterpret_cast<const bf16 *>(p->qkv), p->N, p->np, p->h,
                                                     p->hkv, p->d, p->qd);
    return cudaGetLastError();
}

template <int D, int NWG, int BK, bool CAUSAL> static cudaError_t launch_wg(const cu_attn_params *p, cudaStream_t st) {
    constexpr int BQ = NWG * 64;
    const size_t smem = (size_t)BQ * D * 2 + 4 * (size_t)BK * D * 2 + (size_t)BQ * 8;
    cudaError_t e = cudaFuncSetAttribute(flash_fwd_wgmma_kernel<D, NWG, BK, CAUSAL>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    const dim3 grid((p->N + BQ - 1) / BQ, p->B * p->h);
    flash_fwd_wgmma_kernel<D, NWG, BK, CAUSAL><<<grid, NWG * 128, smem, st>>>(*p);
    return cudaGetLastError();
}

template <int D, int NWG, int BK> static cudaError_t wg_causal(const cu_attn_params *p, cudaStream_t st) {
    return p->causal ? launch_wg<D, NWG, BK, true>(p, st) : launch_wg<D, NWG, BK, false>(p, st);
}

extern "C" cudaError_t cu_flash_forward_wgmma(const cu_attn_params *p, int nwg, cudaStream_t st) {
    if (!cu_wgmma_built()) return cudaErrorNoKernelImageForDevice;
    if (p->d == 64) return nwg == 1 ? wg_causal<64, 1, 64>(p, st) : wg_causal<64, 2, 128>(p, st);
    if (p->d == 128) return nwg == 1 ? wg_causal<128, 1, 64>(p, st) : wg_causal<128, 2, 128>(p, st);
    return cudaErrorInvalidValue;
}
