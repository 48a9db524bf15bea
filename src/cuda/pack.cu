/* Element-wise and gather kernels around the attention: RoPE on the keys, the packed queries (the
 * selected pairs' q rows, RoPE applied, contiguous per segment: the attention kernels re-read them
 * many times, and packed rows measured faster than rows gathered from qkv), the backward's per-pair
 * preprocessing, column sums, conversions.
 * RoPE is rotate-half (pairs j, j + d/2) with the [N, d/2] cos / sin tables of the CPU path
 * (rope_inv_freq_f32 of src/ops: spec §10). */
#include "common.cuh"
#include "kernels.h"

static __device__ __forceinline__ void rot(float &x1, float &x2, float c, float s) {
    const float y1 = x1 * c - x2 * s, y2 = x2 * c + x1 * s;
    x1 = y1;
    x2 = y2;
}

/* sign +1: rotate nh heads of d columns from col0 of rows [T, ld] by their position; -1: the inverse. */
__global__ void rope_k_kernel(bf16 *x, int T, int N, int col0, int nh, int d, int ld, const float *cosb,
                              const float *sinb, float sign) {
    const int half = d / 2;
    const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long)T * nh * half) return;
    const int j = (int)(i % half);
    const long th = i / half;
    const int hh = (int)(th % nh);
    const long t = th / nh;
    const int n = (int)(t % N);
    bf16 *row = x + t * ld + col0 + hh * d;
    float x1 = __bfloat162float(row[j]), x2 = __bfloat162float(row[j + half]);
    rot(x1, x2, cosb[(long)n * half + j], sign * sinb[(long)n * half + j]);
    row[j] = __float2bfloat16(x1);
    row[j + half] = __float2bfloat16(x2);
}

extern "C" cudaError_t cu_rope_k(uint16_t *qkv, int T, int N, int h, int hkv, int d, int qd, const float *cosb,
                                 const float *sinb, cudaStream_t st) {
    const long n = (long)T * hkv * (d / 2);
    rope_k_kernel<<<(unsigned)((n + 255) / 256), 256, 0, st>>>(reinterpret_cast<bf16 *>(qkv), T, N, h * d, hkv, d, qd,
                                                               cosb, sinb, 1.f);
    return cudaGetLastError();
}

extern "C" cudaError_t cu_rope_k_backward(uint16_t *dqkv, int T, int N, int h, int hkv, int d, int qd,
                                          const float *cosb, const float *sinb, cudaStream_t st) {
    const long n = (long)T * hkv * (d / 2);
    rope_k_kernel<<<(unsigned)((n + 255) / 256), 256, 0, st>>>(reinterpret_cast<bf16 *>(dqkv), T, N, h * d, hkv, d,
                                                               qd, cosb, sinb, -1.f);
    return cudaGetLastError();
}

/* Packed queries: one thread per (segment row, 4 rotation pairs j..j+3 / j+d/2..j+d/2+3), 8-byte
 * bf16 (or 16-byte fp32) loads and stores. */
__global__ void pack_q_kernel(bf16 *qp, const bf16 *qb, const float *qf, int ldq, const bf16 *bq, const int *cnt,
                              const int *pos, int N, int h, int d, const float *cosb, const float *sinb) {
    const int half = d / 2, q4 = half / 4, seg = blockIdx.y, b = seg / h, head = seg % h;
    const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    const int r = (int)(i / q4), j = (int)(i % q4) * 4;
    if (r >= cnt[seg]) return;
    const int n = pos[(long)seg * N + r];
    const long tok = (long)b * N + n;
    const int c = head * d + j;
    float x1[4], x2[4];
    if (qf) {
        const float4 a = *reinterpret_cast<const float4 *>(qf + tok * ldq + c);
        const float4 e = *reinterpret_cast<const float4 *>(qf + tok * ldq + c + half);
        x1[0] = a.x, x1[1] = a.y, x1[2] = a.z, x1[3] = a.w;
        x2[0] = e.x, x2[1] = e.y, x2[2] = e.z, x2[3] = e.w;
        if (bq)
            for (int k = 0; k < 4; k++) {
                x1[k] += __bfloat162float(bq[c + k]);
                x2[k] += __bfloat162float(bq[c + half + k]);
            }
    } else {
        const uint2 a = *reinterpret_cast<const uint2 *>(qb + tok * ldq + c);
        const uint2 e = *reinterpret_cast<const uint2 *>(qb + tok * ldq + c + half);
        float2 f = unpack_bf16x2(a.x);
        x1[0] = f.x, x1[1] = f.y;
        f = unpack_bf16x2(a.y);
        x1[2] = f.x, x1[3] = f.y;
        f = unpack_bf16x2(e.x);
        x2[0] = f.x, x2[1] = f.y;
        f = unpack_bf16x2(e.y);
        x2[2] = f.x, x2[3] = f.y;
    }
    if (cosb)
        for (int k = 0; k < 4; k++) rot(x1[k], x2[k], cosb[(long)n * half + j + k], sinb[(long)n * half + j + k]);
    bf16 *dst = qp + ((long)seg * N + r) * d;
    *reinterpret_cast<uint2 *>(dst + j) = make_uint2(pack_bf16x2(x1[0], x1[1]), pack_bf16x2(x1[2], x1[3]));
    *reinterpret_cast<uint2 *>(dst + j + half) = make_uint2(pack_bf16x2(x2[0], x2[1]), pack_bf16x2(x2[2], x2[3]));
}

extern "C" cudaError_t cu_pack_q(uint16_t *qp, const uint16_t *qb, const float *qf, int ldq, const uint16_t *bq,
                                 const int *cnt, const int *pos, int B, int N, int h, int d, const float *cosb,
                                 const float *sinb, cudaStream_t st) {
    const long n = (long)N * (d / 8);
    const dim3 grid((unsigned)((n + 255) / 256), B * h);
    pack_q_kernel<<<grid, 256, 0, st>>>(reinterpret_cast<bf16 *>(qp), reinterpret_cast<const bf16 *>(qb), qf, ldq,
                                        reinterpret_cast<const bf16 *>(bq), cnt, pos, N, h, d, cosb, sinb);
    return cudaGetLastError();
}

/* One warp per segment row: dgate = <dog, o>, dop = bf16(gate dog), dsum = <dop, o>. */
__global__ void bwd_pre_kernel(const cu_attn_params p, const bf16 *dog, float *dgates, bf16 *dop, float *dsum) {
    const int seg = blockIdx.y, b = seg / p.h, head = seg % p.h;
    const int r = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (r >= p.cnt[seg]) return;
    const long row = (long)seg * p.N + r;
    const long tok = (long)b * p.N + p.pos[row];
    const float gate = p.gates[tok * p.h + head];
    const uint32_t *dg = reinterpret_cast<const uint32_t *>(dog + tok * p.h * p.d + head * p.d);
    const uint32_t *o = reinterpret_cast<const uint32_t *>(p.op + row * p.d);
    uint32_t *dst = reinterpret_cast<uint32_t *>(dop + row * p.d);
    float dot = 0.f, ds = 0.f;
    for (int e = lane; e < p.d / 2; e += 32) {
        const float2 a = unpack_bf16x2(dg[e]), ov = unpack_bf16x2(o[e]);
        dot += a.x * ov.x + a.y * ov.y;
        const uint32_t gd = pack_bf16x2(gate * a.x, gate * a.y);
        const float2 gv = unpack_bf16x2(gd);
        ds += gv.x * ov.x + gv.y * ov.y;
        dst[e] = gd;
    }
    dot = warp_sum(dot);
    ds = warp_sum(ds);
    if (lane == 0) {
        dgates[tok * p.h + head] = dot;
        dsum[row] = ds;
    }
}

extern "C" cudaError_t cu_bwd_pre(const cu_attn_params *p, const uint16_t *dog, float *dgates, uint16_t *dop,
                                  float *dsum, cudaStream_t st) {
    const int wpb = 8;
    const dim3 grid((p->N + wpb - 1) / wpb, p->B * p->h);
    bwd_pre_kernel<<<grid, wpb * 32, 0, st>>>(*p, reinterpret_cast<const bf16 *>(dog), dgates,
                                              reinterpret_cast<bf16 *>(dop), dsum);
    return cudaGetLastError();
}

#define COLSUM_ROWS 512
__global__ void colsum_part_kernel(const bf16 *x, int rows, int cols, int ld, float *part) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x, r0 = blockIdx.y * COLSUM_ROWS;
    if (c >= cols) return;
    const int r1 = min(rows, r0 + COLSUM_ROWS);
    float s = 0.f;
    for (int r = r0; r < r1; r++) s += __bfloat162float(x[(long)r * ld + c]);
    part[(long)blockIdx.y * cols + c] = s;
}
__global__ void colsum_final_kernel(const float *part, int nchunks, int cols, float *out) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    float s = 0.f;
    for (int k = 0; k < nchunks; k++) s += part[(long)k * cols + c];
    out[c] += s;
}

extern "C" cudaError_t cu_colsum_add(const uint16_t *x, int rows, int cols, int ld, float *part, float *out,
                                     cudaStream_t st) {
    const int nchunks = (rows + COLSUM_ROWS - 1) / COLSUM_ROWS;
    colsum_part_kernel<<<dim3((cols + 127) / 128, nchunks), 128, 0, st>>>(reinterpret_cast<const bf16 *>(x), rows,
                                                                          cols, ld, part);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    colsum_final_kernel<<<(cols + 127) / 128, 128, 0, st>>>(part, nchunks, cols, out);
    return cudaGetLastError();
}
