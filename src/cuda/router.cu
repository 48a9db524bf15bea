/* MoH routers on the GPU (spec §1-3, §10; the CPU definition: src/attn/router_impl.h): one warp
 * per token computes the softmaxes, the top-k mask (ties to the lower index), the gates and the
 * selection of (token, head) pairs; the load-balance loss is reduced in a fixed order (partial
 * sums per 256 tokens, then one block); the segments (kernels.h) are built per (batch row, head)
 * by a block-wide scan in token order. Backward: one warp per token, the derivative of the
 * gates through the softmaxes into the logits (learned) or into q (query_norm). */
#include <float.h>
#include <math.h>

#include "common.cuh"
#include "kernels.h"

#define LB_CHUNK 256

/* Lane-strided softmax of v[0..n) (global memory, in place): max, exp, sum over the warp. */
static __device__ void warp_softmax(float *v, int n, int lane) {
    float mx = -INFINITY;
    for (int j = lane; j < n; j += 32) mx = fmaxf(mx, v[j]);
    mx = warp_max(mx);
    float s = 0.f;
    for (int j = lane; j < n; j += 32) {
        const float e = expf(v[j] - mx);
        v[j] = e;
        s += e;
    }
    s = warp_sum(s);
    __syncwarp();
    for (int j = lane; j < n; j += 32) v[j] /= s;
    __syncwarp();
}

/* Marks the k largest of v[0..n) (ties to the lower index) in mask[0..n) (1/0). */
static __device__ void warp_topk(const float *v, uint8_t *mask, int n, int k, int lane) {
    for (int j = lane; j < n; j += 32) mask[j] = 0;
    __syncwarp();
    for (int sel = 0; sel < k; sel++) {
        float best = -INFINITY;
        int bi = 0x7fffffff;
        for (int j = lane; j < n; j += 32)
            if (!mask[j] && (v[j] > best || bi == 0x7fffffff)) {
                best = v[j];
                bi = j;
            }
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, best, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (oi != 0x7fffffff && (bi == 0x7fffffff || ov > best || (ov == best && oi < bi))) {
                best = ov;
                bi = oi;
            }
        }
        if (lane == 0) mask[bi] = 1;
        __syncwarp();
    }
}

/* The attention never writes og for a pair it does not compute: zero those rows of token t. */
static __device__ void zero_unselected(const cu_router_params &p, int t, const uint8_t *m, int lane) {
    __syncwarp();
    const int c8 = p.d / 8;
    for (int j = 0; j < p.E; j++) {
        if (m[j]) continue;
        uint4 *row = reinterpret_cast<uint4 *>(p.og + (long)t * p.h * p.d + (long)(p.hs + j) * p.d);
        for (int c = lane; c < c8; c += 32) row[c] = make_uint4(0, 0, 0, 0);
    }
}

__global__ void router_fwd_kernel(const cu_router_params p) {
    const int t = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (t >= p.T) return;
    const int h = p.h, hs = p.hs, E = p.E, K = p.K;
    float *g = p.gates + (long)t * h;
    uint8_t *sel = p.sel + (long)t * h;
    if (p.router == 0 || (p.router == 1 && K == 0)) { /* none, or all heads shared */
        if (p.router == 1 && hs >= 2) {
            float *s = p.s + (long)t * hs;
            for (int i = lane; i < hs; i += 32) s[i] = p.z[(long)t * p.nz + i];
            __syncwarp();
            warp_softmax(s, hs, lane);
            for (int i = lane; i < h; i += 32) g[i] = s[i] * hs;
        } else {
            for (int i = lane; i < h; i += 32) g[i] = 1.f;
        }
        for (int i = lane; i < h; i += 32) sel[i] = 1;
        return;
    }
    float *pr = p.p + (long)t * E;
    uint8_t *m = p.mask + (long)t * E;
    if (p.router == 2) { /* query_norm: ||q|| of the routed heads, std, softmax, top-k on the norms */
        float *qn = p.qn + (long)t * E;
        const float *q = p.qf + (long)t * p.ldq;
        for (int j = 0; j < E; j++) {
            const int c0 = (hs + j) * p.d;
            float ss = 0.f;
            for (int e = lane; e < p.d; e += 32) {
                float v = q[c0 + e];
                if (p.bq) v += __bfloat162float(reinterpret_cast<const bf16 *>(p.bq)[c0 + e]);
                ss += v * v;
            }
            ss = warp_sum(ss);
            if (lane == 0) qn[j] = sqrtf(ss);
        }
        __syncwarp();
        double mean = 0.0, var = 0.0;
        for (int j = 0; j < E; j++) mean += qn[j];
        mean /= E;
        for (int j = 0; j < E; j++) var += ((double)qn[j] - mean) * ((double)qn[j] - mean);
        const float sd = E > 1 ? (float)sqrt(var / (E - 1)) : 0.f;
        if (lane == 0) p.qstd[t] = sd;
        if (sd > 0.f) {
            for (int j = lane; j < E; j += 32) pr[j] = qn[j] / sd;
            __syncwarp();
            warp_softmax(pr, E, lane);
        } else {
            for (int j = lane; j < E; j += 32) pr[j] = 1.f / E;
        }
        warp_topk(qn, m, E, K, lane);
        for (int i = lane; i < hs; i += 32) {
            g[i] = 1.f;
            sel[i] = 1;
        }
        for (int j = lane; j < E; j += 32) {
            g[hs + j] = m[j] ? 1.f : 0.f;
            sel[hs + j] = m[j];
        }
        zero_unselected(p, t, m, lane);
        return;
    }
    /* learned, K >= 1: z = wg x | wg_0 x | wg_1 x */
    const float *z = p.z + (long)t * p.nz;
    for (int j = lane; j < E; j += 32) pr[j] = z[j];
    float a0 = 1.f, a1 = 1.f;
    if (hs >= 1) {
        float *a = p.a + 2L * t;
        if (lane == 0) {
            const float z0 = z[E], z1 = z[E + 1], mx = fmaxf(z0, z1);
            const float e0 = expf(z0 - mx), e1 = expf(z1 - mx);
            a[0] = e0 / (e0 + e1);
            a[1] = e1 / (e0 + e1);
        }
        if (hs >= 2) {
            float *s = p.s + (long)t * hs;
            for (int i = lane; i < hs; i += 32) s[i] = z[E + 2 + i];
        }
    }
    __syncwarp();
    warp_softmax(pr, E, lane);
    if (hs >= 2) warp_softmax(p.s + (long)t * hs, hs, lane);
    warp_topk(pr, m, E, K, lane);
    float sum = 0.f;
    for (int j = 0; j < E; j++) sum += m[j] ? pr[j] : 0.f; /* fixed order, as the CPU */
    const float den = sum > FLT_EPSILON ? sum : FLT_EPSILON;
    if (lane == 0) p.denom[t] = den;
    if (hs >= 1) {
        a0 = 2.f * p.a[2L * t];
        a1 = 2.f * p.a[2L * t + 1];
    }
    for (int i = lane; i < hs; i += 32) {
        g[i] = a0 * (hs >= 2 ? hs * p.s[(long)t * hs + i] : 1.f);
        sel[i] = 1;
    }
    for (int j = lane; j < E; j += 32) {
        const float r = K * (m[j] ? pr[j] : 0.f) / den;
        g[hs + j] = hs == 0 ? r : a1 * r;
        sel[hs + j] = m[j];
    }
    zero_unselected(p, t, m, lane);
}

/* part[c, i] = sum of p[t, i] and part[c, E + i] = sum of mask[t, i] over the LB_CHUNK tokens of
 * chunk c: a thread per token, warp sums, then the 8 warps in order (dynamic shared: 2 x 8 x E). */
__global__ void lb_partial_kernel(const cu_router_params p) {
    extern __shared__ float lbw[];
    const int c = blockIdx.x, t = c * LB_CHUNK + threadIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nw = blockDim.x >> 5;
    for (int i = 0; i < p.E; i++) {
        float vp = t < p.T ? p.p[(long)t * p.E + i] : 0.f, vm = t < p.T ? (float)p.mask[(long)t * p.E + i] : 0.f;
        vp = warp_sum(vp);
        vm = warp_sum(vm);
        if (lane == 0) {
            lbw[warp * p.E + i] = vp;
            lbw[(nw + warp) * p.E + i] = vm;
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < p.E; i += blockDim.x) {
        float sp = 0.f, sm = 0.f;
        for (int w = 0; w < nw; w++) {
            sp += lbw[w * p.E + i];
            sm += lbw[(nw + w) * p.E + i];
        }
        p.part[(long)c * 2 * p.E + i] = sp;
        p.part[(long)c * 2 * p.E + p.E + i] = sm;
    }
}

/* f[i] = mean_t mask, lb = E sum_i P_i f_i (spec §2): one block, fixed order. */
__global__ void lb_final_kernel(const cu_router_params p, int nchunks) {
    extern __shared__ double lbs[];
    for (int i = threadIdx.x; i < p.E; i += blockDim.x) {
        double sp = 0.0, sm = 0.0;
        for (int c = 0; c < nchunks; c++) {
            sp += p.part[(long)c * 2 * p.E + i];
            sm += p.part[(long)c * 2 * p.E + p.E + i];
        }
        p.f[i] = (float)(sm / p.T);
        lbs[i] = (sp / p.T) * (sm / p.T);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        double lb = 0.0;
        for (int i = 0; i < p.E; i++) lb += lbs[i];
        p.lb[0] = (float)(p.E * lb);
    }
}

/* Segment of (b, head): the positions of the tokens that selected the head, in order. */
__global__ void segments_kernel(const cu_router_params p) {
    __shared__ int wsum[32];
    __shared__ int base;
    const int seg = blockIdx.x, b = seg / p.h, head = seg % p.h;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nw = blockDim.x >> 5;
    if (tid == 0) base = 0;
    __syncthreads();
    int *pos = p.pos + (long)seg * p.N;
    for (int n0 = 0; n0 < p.N; n0 += blockDim.x) {
        const int n = n0 + tid;
        const bool f = n < p.N && p.sel[((long)b * p.N + n) * p.h + head];
        const unsigned bal = __ballot_sync(0xffffffffu, f);
        const int before = __popc(bal & ((1u << lane) - 1));
        if (lane == 0) wsum[warp] = __popc(bal);
        __syncthreads();
        int off = base;
        for (int w = 0; w < warp; w++) off += wsum[w];
        if (f) pos[off + before] = n;
        __syncthreads();
        if (tid == 0) {
            int s = 0;
            for (int w = 0; w < nw; w++) s += wsum[w];
            base += s;
        }
        __syncthreads();
    }
    if (tid == 0) p.cnt[seg] = base;
}

extern "C" cudaError_t cu_router_forward(const cu_router_params *p, cudaStream_t st) {
    const int wpb = 8;
    router_fwd_kernel<<<(p->T + wpb - 1) / wpb, wpb * 32, 0, st>>>(*p);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    if (p->E > 0 && p->router != 0 && p->K > 0) {
        const int nchunks = (p->T + LB_CHUNK - 1) / LB_CHUNK;
        lb_partial_kernel<<<nchunks, LB_CHUNK, 2 * (LB_CHUNK / 32) * p->E * sizeof(float), st>>>(*p);
        if ((e = cudaGetLastError()) != cudaSuccess) return e;
        lb_final_kernel<<<1, 256, sizeof(double) * p->E, st>>>(*p, nchunks);
        if ((e = cudaGetLastError()) != cudaSuccess) return e;
    }
    segments_kernel<<<p->B * p->h, 256, 0, st>>>(*p);
    return cudaGetLastError();
}

/* Learned router backward for token t (router_learned_grad_rows + softmax backward, CPU). */
__global__ void router_bwd_kernel(const cu_router_params p) {
    const int t = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (t >= p.T) return;
    const int h = p.h, hs = p.hs, E = p.E, K = p.K;
    const float *dg = p.dgates + (long)t * h;
    if (p.router == 1 && K == 0) { /* all shared: gates = hs softmax(wg_1 x) */
        const float *s = p.s + (long)t * hs;
        float dot = 0.f;
        for (int i = lane; i < hs; i += 32) dot += s[i] * dg[i] * hs;
        dot = warp_sum(dot);
        for (int i = lane; i < hs; i += 32)
            p.dz[(long)t * p.nz + i] = __bfloat16_as_ushort(__float2bfloat16(s[i] * (dg[i] * hs - dot)));
        return;
    }
    const float *pr = p.p + (long)t * E;
    const uint8_t *m = p.mask + (long)t * E;
    const float lbk = p.lb_scale * E / (float)p.T;
    if (p.router == 2) { /* query_norm: straight-through and load-balance terms, as coefficients of q */
        const float sd = p.qstd[t];
        if (!(sd > 0.f)) { /* uniform scores: no gradient */
            for (int j = lane; j < E; j += 32) p.coef[(long)t * E + j] = 0.f;
            return;
        }
        const float *qn = p.qn + (long)t * E;
        float pdp = 0.f;
        for (int j = lane; j < E; j += 32) {
            const float dp = lbk * p.f[j] + (p.straight_through && m[j] ? dg[hs + j] : 0.f);
            pdp += pr[j] * dp;
        }
        pdp = warp_sum(pdp);
        float mean = 0.f, zdot = 0.f;
        for (int j = 0; j < E; j++) {
            const float dp = lbk * p.f[j] + (p.straight_through && m[j] ? dg[hs + j] : 0.f);
            const float dz = pr[j] * (dp - pdp);
            mean += qn[j];
            zdot += dz * qn[j];
        }
        mean /= E;
        for (int j = lane; j < E; j += 32) {
            const float dp = lbk * p.f[j] + (p.straight_through && m[j] ? dg[hs + j] : 0.f);
            const float dz = pr[j] * (dp - pdp);
            const float dn = dz / sd - zdot / (sd * sd) * ((qn[j] - mean) / ((E - 1) * sd));
            p.coef[(long)t * E + j] = qn[j] > 0.f ? dn / qn[j] : 0.f; /* d q_j += coef q_j (cu qnorm_dq_kernel) */
        }
        return;
    }
    /* learned, K >= 1 */
    uint16_t *dz = p.dz + (long)t * p.nz;
    const float D = p.denom[t];
    const bool clamped = !(D > FLT_EPSILON);
    float a1 = 1.f, da0 = 0.f, da1 = 0.f;
    if (hs >= 1) {
        const float *a = p.a + 2L * t;
        const float a0 = 2.f * a[0];
        a1 = 2.f * a[1];
        const float *s = p.s + (long)t * hs;
        float dsdot = 0.f;
        for (int i = lane; i < hs; i += 32) {
            da0 += dg[i] * (hs >= 2 ? hs * s[i] : 1.f);
            if (hs >= 2) dsdot += s[i] * (dg[i] * a0 * hs);
        }
        da0 = warp_sum(da0);
        dsdot = warp_sum(dsdot);
        if (hs >= 2)
            for (int i = lane; i < hs; i += 32)
                dz[E + 2 + i] = __bfloat16_as_ushort(__float2bfloat16(s[i] * (dg[i] * a0 * hs - dsdot)));
    }
    float rdot = 0.f;
    for (int j = lane; j < E; j += 32) {
        const float r = K * (m[j] ? pr[j] : 0.f) / D;
        da1 += dg[hs + j] * r;
        rdot += dg[hs + j] * a1 * r;
    }
    da1 = warp_sum(da1);
    rdot = warp_sum(rdot);
    if (hs >= 1 && lane == 0) {
        const float *a = p.a + 2L * t;
        const float d0 = 2.f * da0, d1 = 2.f * da1, adot = a[0] * d0 + a[1] * d1;
        dz[E] = __bfloat16_as_ushort(__float2bfloat16(a[0] * (d0 - adot)));
        dz[E + 1] = __bfloat16_as_ushort(__float2bfloat16(a[1] * (d1 - adot)));
    }
    float pdp = 0.f;
    for (int j = lane; j < E; j += 32) {
        float dp = lbk * p.f[j];
        if (m[j]) dp += K / D * (dg[hs + j] * a1 - (clamped ? 0.f : rdot / K));
        pdp += pr[j] * dp;
    }
    pdp = warp_sum(pdp);
    for (int j = lane; j < E; j += 32) {
        float dp = lbk * p.f[j];
        if (m[j]) dp += K / D * (dg[hs + j] * a1 - (clamped ? 0.f : rdot / K));
        dz[j] = __bfloat16_as_ushort(__float2bfloat16(pr[j] * (dp - pdp)));
    }
}

/* query_norm: dqkv's routed q columns += coef[t, j] (qf + bias), 8 values per thread. */
__global__ void qnorm_dq_kernel(const cu_router_params p) {
    const int c8 = p.d / 8;
    const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long)p.T * p.E * c8) return;
    const long tj = i / c8;
    const int c = (int)(i % c8) * 8, j = (int)(tj % p.E);
    const long t = tj / p.E;
    const float cf = p.coef[tj];
    if (cf == 0.f) return;
    const int col = (p.hs + j) * p.d + c;
    const float *q = p.qf + t * p.ldq + col;
    uint4 *dst = reinterpret_cast<uint4 *>(p.dqkv + t * p.qd + col);
    uint4 v = *dst;
    uint32_t *w = reinterpret_cast<uint32_t *>(&v);
    for (int k = 0; k < 4; k++) {
        float2 d2 = unpack_bf16x2(w[k]);
        float q0 = q[2 * k], q1 = q[2 * k + 1];
        if (p.bq) {
            q0 += __bfloat162float(reinterpret_cast<const bf16 *>(p.bq)[col + 2 * k]);
            q1 += __bfloat162float(reinterpret_cast<const bf16 *>(p.bq)[col + 2 * k + 1]);
        }
        w[k] = pack_bf16x2(d2.x + cf * q0, d2.y + cf * q1);
    }
    *dst = v;
}

extern "C" cudaError_t cu_router_backward(const cu_router_params *p, cudaStream_t st) {
    if (p->router == 0 || (p->router == 1 && p->K == 0 && p->hs < 2)) return cudaSuccess;
    if (p->router == 2 && p->lb_scale == 0.f && !p->straight_through) return cudaSuccess; /* binary gates: constants */
    const int wpb = 8;
    router_bwd_kernel<<<(p->T + wpb - 1) / wpb, wpb * 32, 0, st>>>(*p);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess || p->router != 2) return e;
    const long n = (long)p->T * p->E * (p->d / 8);
    qnorm_dq_kernel<<<(unsigned)((n + 255) / 256), 256, 0, st>>>(*p);
    return cudaGetLastError();
}
