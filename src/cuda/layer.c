/* The CUDA MoH attention layer (moh_cuda.h): one device allocation with views (layer.h), the
 * sequence of GEMMs and kernels of a forward and a backward. */
#include "layer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "attn/attn.h"
#include "attn/sparse.h"
#include "ops/bf16.h"

bool moh_cuda_available(char *why, size_t cap) {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n < 1) {
        if (why && cap)
            snprintf(why, cap, "no CUDA device (cudaGetDeviceCount: %s)",
                     e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        return false;
    }
    if (why && cap) why[0] = 0;
    return true;
}

int moh_cuda_describe(char *out, size_t cap, moh_error *err) {
    int dev = 0;
    struct cudaDeviceProp pr;
    CU_TRY(cudaGetDevice(&dev), "cudaGetDevice");
    CU_TRY(cudaGetDeviceProperties(&pr, dev), "cudaGetDeviceProperties");
    snprintf(out, cap, "%s (sm_%d%d, %d SMs, %.0f GiB)", pr.name, pr.major, pr.minor, pr.multiProcessorCount,
             (double)pr.totalGlobalMem / (1024.0 * 1024.0 * 1024.0));
    return MOH_OK;
}

int moh_cuda_router_rows(const moh_attn_config *cfg) {
    if (cfg->router != MOH_ROUTER_LEARNED) return 0;
    const int hs = cfg->shared_heads;
    if (cfg->top_k == 0) return hs >= 2 ? hs : 0;
    return attn_routed_heads(cfg) + (hs >= 1 ? 2 : 0) + (hs >= 2 ? hs : 0);
}

/* Carves the views of l's allocation at base (NULL: only counts). Returns the bytes needed. */
static size_t layout(moh_cuda_layer *l, char *base) {
    const moh_attn_config *c = &l->cfg;
    const size_t T = (size_t)l->maxB * l->maxN, S = (size_t)l->maxB * c->n_heads * l->maxN;
    const size_t h = (size_t)c->n_heads, d = (size_t)c->head_dim, E = (size_t)l->E, hs = (size_t)c->shared_heads;
    const bool qnorm = c->router == MOH_ROUTER_QUERY_NORM, learned = c->router == MOH_ROUTER_LEARNED;
    const size_t half = d / 2, nchunk = (T + 255) / 256, cschunk = (T + 511) / 512;
    const size_t csw = (size_t)(c->hidden_size > l->qd ? c->hidden_size : l->qd);
    size_t off = 0;
#define CARVE(field, type, count)                                                     \
    do {                                                                              \
        const size_t n_ = (size_t)(count);                                            \
        if (base) l->field = n_ ? (type *)(void *)(base + off) : NULL;                \
        off += (n_ * sizeof(type) + 255) & ~(size_t)255;                              \
    } while (0)
    CARVE(rope_cos, float, c->rope_theta > 0 ? (size_t)l->maxN * half : 0);
    CARVE(rope_sin, float, c->rope_theta > 0 ? (size_t)l->maxN * half : 0);
    l->poison_off = off;
    CARVE(qkv, uint16_t, T * l->qd);
    CARVE(qf, float, qnorm ? T * l->hd : 0);
    CARVE(z, float, learned ? T * l->ldz : 0);
    CARVE(gates, float, T * h);
    CARVE(sel, uint8_t, T * h);
    CARVE(p, float, T * E);
    CARVE(mask, uint8_t, T * E);
    CARVE(denom, float, learned ? T : 0);
    CARVE(s, float, learned ? T * hs : 0);
    CARVE(a, float, learned ? T * 2 : 0);
    CARVE(qn, float, qnorm ? T * E : 0);
    CARVE(qstd, float, qnorm ? T : 0);
    CARVE(coef, float, qnorm ? T * E : 0);
    CARVE(lbpart, float, nchunk * 2 * E);
    CARVE(f, float, E);
    CARVE(lb, float, 1);
    CARVE(cnt, int, (size_t)l->maxB * h);
    CARVE(pos, int, S);
    CARVE(qp, uint16_t, S * d);
    CARVE(op, uint16_t, S * d);
    CARVE(mrow, float, S);
    CARVE(lrow, float, S);
    CARVE(og, uint16_t, T * l->hd);
    CARVE(vt, uint16_t, cu_wgmma_supported(c->head_dim) ? (size_t)l->maxB * c->n_kv_heads * d * (((size_t)l->maxN + 7) / 8 * 8) : 0);
    CARVE(dog, uint16_t, T * l->hd);
    CARVE(dop, uint16_t, S * d);
    CARVE(dsum, float, S);
    CARVE(dgates, float, T * h);
    CARVE(dqkv, uint16_t, T * l->qd);
    CARVE(dz, uint16_t, learned ? T * l->ldz : 0);
    CARVE(cspart, float, cschunk * csw);
#undef CARVE
    return off;
}

void cu_layer_set_poison(moh_cuda_layer *l, bool on) {
    if (l) l->poison = on;
}

int moh_cuda_layer_new(moh_cuda_layer **out, const moh_attn_config *cfg, int max_B, int max_N, moh_error *err) {
    *out = NULL;
    char why[256];
    int rc = moh_attn_config_validate(cfg, "CUDA attention layer", err);
    if (rc) return rc;
    if (!cu_head_dim_supported(cfg->head_dim))
        return moh_fail(err, MOH_E_CONFIG, "CUDA attention layer: head_dim %d has no CUDA kernels (expected one of %s)",
                        cfg->head_dim, CU_HEAD_DIMS);
    if (max_B < 1 || max_N < 1)
        return moh_fail(err, MOH_E_ARG, "CUDA attention layer: max_B %d, max_N %d: expected >= 1", max_B, max_N);
    const double qd_wide = ((double)cfg->n_heads + 2.0 * cfg->n_kv_heads) * cfg->head_dim;
    if ((double)max_B * cfg->n_heads * max_N * cfg->head_dim >= 2147483647.0 ||
        (double)max_B * max_N * qd_wide >= 2147483647.0)
        return moh_fail(err, MOH_E_ARG, "CUDA attention layer: B %d x N %d x heads is too large (2^31 elements per tensor)",
                        max_B, max_N);
    /* one CUDA block row per (image, head) segment: gridDim.y <= 65535 */
    if ((long)max_B * cfg->n_heads > 65535)
        return moh_fail(err, MOH_E_ARG, "CUDA attention layer: max_B %d x n_heads %d = %ld: expected <= 65535 (split the batch)",
                        max_B, cfg->n_heads, (long)max_B * cfg->n_heads);
    /* the load-balance kernel keeps 64 bytes per routed head in 48 KiB of shared memory */
    if (attn_routed_heads(cfg) > 768)
        return moh_fail(err, MOH_E_CONFIG, "CUDA attention layer: %d routed heads: expected <= 768",
                        attn_routed_heads(cfg));
    if (!moh_cuda_available(why, sizeof why)) return moh_fail(err, MOH_E_DEVICE, "%s", why);
    moh_cuda_layer *l = calloc(1, sizeof *l);
    if (!l) return moh_fail(err, MOH_E_NOMEM, "CUDA attention layer: out of host memory");
    l->cfg = *cfg;
    l->maxB = max_B;
    l->maxN = max_N;
    l->E = attn_routed_heads(cfg);
    l->nz = moh_cuda_router_rows(cfg);
    l->ldz = (l->nz + 7) / 8 * 8;
    l->hd = cfg->n_heads * cfg->head_dim;
    l->qd = attn_qkv_dim(cfg);
    l->kvd = cfg->n_kv_heads * cfg->head_dim;
    l->bytes = layout(l, NULL);
    cudaError_t e = cudaMalloc(&l->block, l->bytes);
    if (e != cudaSuccess) {
        const double mib = (double)l->bytes / 1048576.0;
        (void)cudaGetLastError();
        free(l);
        return moh_fail(err, MOH_E_NOMEM, "CUDA attention layer: cudaMalloc of %.1f MiB failed: %s", mib,
                        cudaGetErrorString(e));
    }
    layout(l, l->block);
    if ((rc = cu_blas_new(&l->blas, err))) {
        moh_cuda_layer_free(l);
        return rc;
    }
    /* the forward kernel: mma.sync, or a wgmma variant on request (MOH_CUDA_FWD; host.h says why) */
    const char *fk = getenv("MOH_CUDA_FWD");
    l->fwd_kind = CU_FWD_MMA;
    if (fk && *fk && strcmp(fk, "mma")) {
        const int kind = !strcmp(fk, "wgmma") ? CU_FWD_WGMMA : !strcmp(fk, "wgmma1") ? CU_FWD_WGMMA1 : -1;
        if (kind < 0) {
            moh_cuda_layer_free(l);
            return moh_fail(err, MOH_E_CONFIG, "MOH_CUDA_FWD=%s: expected mma, wgmma or wgmma1", fk);
        }
        if ((rc = cu_layer_set_forward_kernel(l, kind, err))) {
            moh_cuda_layer_free(l);
            return rc;
        }
    }
    if (l->rope_cos) {
        const int half = cfg->head_dim / 2;
        const size_t n = (size_t)max_N * half;
        float *cs = malloc(2 * n * sizeof(float));
        if (!cs) {
            moh_cuda_layer_free(l);
            return moh_fail(err, MOH_E_NOMEM, "CUDA attention layer: out of host memory");
        }
        for (int j = 0; j < half; j++) { /* exactly the CPU path's tables (sparse.c rope_tables) */
            const float inv = rope_inv_freq_f32(cfg, j);
            for (int n2 = 0; n2 < max_N; n2++) {
                const float ang = (float)n2 * inv;
                cs[(size_t)n2 * half + j] = cosf(ang);
                cs[n + (size_t)n2 * half + j] = sinf(ang);
            }
        }
        e = cudaMemcpy(l->rope_cos, cs, n * sizeof(float), cudaMemcpyHostToDevice);
        if (e == cudaSuccess) e = cudaMemcpy(l->rope_sin, cs + n, n * sizeof(float), cudaMemcpyHostToDevice);
        free(cs);
        if (e != cudaSuccess) {
            moh_cuda_layer_free(l);
            return moh_fail(err, MOH_E_DEVICE, "CUDA attention layer: RoPE tables: %s", cudaGetErrorString(e));
        }
    }
    *out = l;
    return MOH_OK;
}

static const char *const PHASES[CU_NPHASE] = {"qkv_gemm", "router", "rope_pack", "attention", "wo_gemm", "b_wo",
                                                "b_pre",    "b_kv",   "b_dq",      "b_router",  "b_qkv"};
const char *cu_phase_name(int ph) { return ph >= 0 && ph < CU_NPHASE ? PHASES[ph] : "?"; }

/* Records the end of phase ph (-1: a start) on st when profiling. */
static void mark(moh_cuda_layer *l, int ph, cudaStream_t st) {
    if (!l->profile || l->nmark >= CU_MAX_MARKS) return;
    if (cudaEventRecord(l->ev[l->nmark], st) != cudaSuccess) return;
    l->mark_phase[l->nmark++] = ph;
}

int cu_layer_profile(moh_cuda_layer *l, bool on, moh_error *err) {
    if (on && !l->profile) {
        for (int i = 0; i < CU_MAX_MARKS; i++) {
            const cudaError_t e = cudaEventCreate(&l->ev[i]);
            if (e != cudaSuccess) {
                (void)cudaGetLastError();
                while (i-- > 0) cudaEventDestroy(l->ev[i]);
                return moh_fail(err, MOH_E_DEVICE, "CUDA cudaEventCreate failed: %s", cudaGetErrorString(e));
            }
        }
        memset(l->phase_ms, 0, sizeof l->phase_ms);
        l->phase_calls = 0;
        l->nmark = 0;
    } else if (!on && l->profile) {
        for (int i = 0; i < CU_MAX_MARKS; i++) cudaEventDestroy(l->ev[i]);
    }
    l->profile = on;
    return MOH_OK;
}

long cu_layer_phase_ms(moh_cuda_layer *l, double *ms, bool reset) {
    memcpy(ms, l->phase_ms, sizeof l->phase_ms);
    const long n = l->phase_calls;
    if (reset) {
        memset(l->phase_ms, 0, sizeof l->phase_ms);
        l->phase_calls = 0;
    }
    return n;
}

void moh_cuda_layer_free(moh_cuda_layer *l) {
    if (!l) return;
    cu_layer_profile(l, false, NULL);
    cu_blas_free(l->blas);
    cudaFree(l->block);
    free(l);
}

size_t moh_cuda_layer_bytes(const moh_cuda_layer *l) { return l ? l->bytes : 0; }

int cu_layer_set_forward_kernel(moh_cuda_layer *l, int kind, moh_error *err) {
    if (kind == CU_FWD_MMA) {
        l->fwd_kind = kind;
        return MOH_OK;
    }
    if (kind != CU_FWD_WGMMA && kind != CU_FWD_WGMMA1)
        return moh_fail(err, MOH_E_ARG, "forward kernel %d: expected mma.sync, wgmma or wgmma1", kind);
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess)
        return moh_fail(err, MOH_E_DEVICE, "wgmma forward: cannot read the device's compute capability");
    if (!cu_wgmma_built())
        return moh_fail(err, MOH_E_CONFIG, "wgmma forward: this moh was built without sm_90a (MOH_CUDA_GENCODE)");
    if (major != 9) return moh_fail(err, MOH_E_CONFIG, "wgmma forward: needs a Hopper GPU (sm_90), this one is sm_%d", major * 10);
    if (!cu_wgmma_supported(l->cfg.head_dim))
        return moh_fail(err, MOH_E_CONFIG, "wgmma forward: head_dim %d has no wgmma kernel (64, 128)", l->cfg.head_dim);
    l->fwd_kind = kind;
    return MOH_OK;
}

const char *cu_layer_forward_kernel(const moh_cuda_layer *l) {
    return l->fwd_kind == CU_FWD_WGMMA ? "wgmma" : l->fwd_kind == CU_FWD_WGMMA1 ? "wgmma1" : "mma.sync";
}
const float *moh_cuda_layer_gates(const moh_cuda_layer *l) { return l ? l->gates : NULL; }

cu_attn_params cu_layer_attn_params(const moh_cuda_layer *l) {
    const moh_attn_config *c = &l->cfg;
    cu_attn_params p = {
        .B = l->B, .N = l->N, .np = (l->N + 7) / 8 * 8, .vt = l->vt, .h = c->n_heads, .hkv = c->n_kv_heads, .d = c->head_dim, .qd = l->qd,
        .causal = c->causal, .scale = (float)(1.0 / sqrt((double)c->head_dim)),
        .cnt = l->cnt, .pos = l->pos, .gates = l->gates,
        .qp = l->qp, .qkv = l->qkv, .op = l->op, .og = l->og, .mrow = l->mrow, .lrow = l->lrow,
        .dop = l->dop, .dsum = l->dsum, .dqkv = l->dqkv, .rope_cos = l->rope_cos, .rope_sin = l->rope_sin,
    };
    return p;
}

static cu_router_params router_params(const moh_cuda_layer *l, const moh_cuda_weights *w) {
    const moh_attn_config *c = &l->cfg;
    cu_router_params r = {
        .T = l->B * l->N, .N = l->N, .B = l->B, .h = c->n_heads, .hs = c->shared_heads, .E = l->E,
        .K = c->top_k, .router = (int)c->router, .nz = l->ldz, .d = c->head_dim, .ldq = l->hd,
        .straight_through = c->straight_through, .z = l->z, .qf = l->qf, .bq = w ? w->b_qkv : NULL,
        .gates = l->gates, .sel = l->sel, .p = l->p, .mask = l->mask, .denom = l->denom, .s = l->s, .a = l->a,
        .qn = l->qn, .qstd = l->qstd, .part = l->lbpart, .f = l->f, .lb = l->lb, .cnt = l->cnt, .pos = l->pos,
        .og = l->og, .coef = l->coef, .dgates = l->dgates, .dz = l->dz, .dqkv = l->dqkv, .qd = l->qd,
    };
    return r;
}

/* The weights cfg needs are present. */
static int check_weights(const moh_cuda_layer *l, const moh_cuda_weights *w, moh_error *err) {
    const moh_attn_config *c = &l->cfg;
    if (!w || !w->w_qkv || !w->w_o)
        return moh_fail(err, MOH_E_ARG, "CUDA attention layer: w_qkv and w_o are required");
    if (c->qkv_bias && !w->b_qkv) return moh_fail(err, MOH_E_ARG, "CUDA attention layer: qkv_bias set but b_qkv is NULL");
    if (c->proj_bias && !w->b_o) return moh_fail(err, MOH_E_ARG, "CUDA attention layer: proj_bias set but b_o is NULL");
    if (l->nz > 0 && !w->w_router)
        return moh_fail(err, MOH_E_ARG, "CUDA attention layer: the learned router needs w_router [%d, %d]", l->nz,
                        c->hidden_size);
    return MOH_OK;
}

int moh_cuda_layer_forward(moh_cuda_layer *l, const moh_cuda_weights *w, const uint16_t *x, int B, int N,
                           uint16_t *y, void *stream, moh_error *err) {
    if (!l || !x || !y) return moh_fail(err, MOH_E_ARG, "moh_cuda_layer_forward: NULL argument");
    if (B < 1 || B > l->maxB || N < 1 || N > l->maxN)
        return moh_fail(err, MOH_E_ARG, "moh_cuda_layer_forward: B %d, N %d: expected 1..%d, 1..%d", B, N, l->maxB,
                        l->maxN);
    int rc = check_weights(l, w, err);
    if (rc) return rc;
    const moh_attn_config *c = &l->cfg;
    cudaStream_t st = (cudaStream_t)stream;
    const int T = B * N, C = c->hidden_size, hd = l->hd, qd = l->qd;
    const bool qnorm = c->router == MOH_ROUTER_QUERY_NORM;
    const uint16_t *bq = c->qkv_bias ? w->b_qkv : NULL, *bo = c->proj_bias ? w->b_o : NULL;
    l->B = B;
    l->N = N;
    l->x = NULL; /* set when the whole forward was queued: backward needs all of it */
    if (l->poison) CU_TRY(cudaMemsetAsync((char *)l->block + l->poison_off, 0xFF, l->bytes - l->poison_off, st), "poison");
    mark(l, -1, st);
    if (qnorm) {
        if ((rc = cu_gemm(l->blas, st, false, true, T, hd, C, x, C, w->w_qkv, C, l->qf, hd, true, 0.f, NULL, err))) return rc;
        if ((rc = cu_gemm(l->blas, st, false, true, T, 2 * l->kvd, C, x, C, w->w_qkv + (size_t)hd * C, C, l->qkv + hd, qd,
                          false, 0.f, bq ? bq + hd : NULL, err)))
            return rc;
    } else if ((rc = cu_gemm(l->blas, st, false, true, T, qd, C, x, C, w->w_qkv, C, l->qkv, qd, false, 0.f, bq, err))) {
        return rc;
    }
    mark(l, CU_PH_QKV, st);
    if (l->nz > 0 &&
        (rc = cu_gemm(l->blas, st, false, true, T, l->nz, C, x, C, w->w_router, C, l->z, l->ldz, true, 0.f, NULL, err)))
        return rc;
    cu_router_params rp = router_params(l, w);
    rp.bq = bq;
    CU_TRY(cu_router_forward(&rp, st), "router forward");
    mark(l, CU_PH_ROUTER, st);
    if (l->rope_cos)
        CU_TRY(cu_rope_k(l->qkv, T, N, c->n_heads, c->n_kv_heads, c->head_dim, qd, l->rope_cos, l->rope_sin, st), "RoPE");
    CU_TRY(cu_pack_q(l->qp, qnorm ? NULL : l->qkv, qnorm ? l->qf : NULL, qnorm ? hd : qd, qnorm ? bq : NULL, l->cnt,
                     l->pos, B, N, c->n_heads, c->head_dim, l->rope_cos, l->rope_sin, st),
           "query packing");
    mark(l, CU_PH_PACK, st);
    if ((rc = cu_layer_core_forward(l, stream, err))) return rc;
    mark(l, CU_PH_ATTN, st);
    rc = cu_gemm(l->blas, st, false, true, T, C, hd, l->og, hd, w->w_o, hd, y, C, false, 0.f, bo, err);
    mark(l, CU_PH_WO, st);
    if (!rc) l->x = x;
    return rc;
}

int moh_cuda_layer_backward(moh_cuda_layer *l, const moh_cuda_weights *w, const moh_cuda_grads *g,
                            const uint16_t *dy, float lb_scale, float *dx, void *stream, moh_error *err) {
    if (!l || !g || !dy) return moh_fail(err, MOH_E_ARG, "moh_cuda_layer_backward: NULL argument");
    if (!l->x) return moh_fail(err, MOH_E_ARG, "moh_cuda_layer_backward: no successful forward before it");
    int rc = check_weights(l, w, err);
    if (rc) return rc;
    const moh_attn_config *c = &l->cfg;
    cudaStream_t st = (cudaStream_t)stream;
    const int B = l->B, N = l->N, T = B * N, C = c->hidden_size, hd = l->hd, qd = l->qd;
    const uint16_t *x = l->x;
    mark(l, -1, st);
    /* W_O: d og, dW_O, db_O */
    if ((rc = cu_gemm(l->blas, st, false, false, T, hd, C, dy, C, w->w_o, hd, l->dog, hd, false, 0.f, NULL, err))) return rc;
    if (g->w_o && (rc = cu_gemm(l->blas, st, true, false, C, hd, T, dy, C, l->og, hd, g->w_o, hd, true, 1.f, NULL, err)))
        return rc;
    if (c->proj_bias && g->b_o) CU_TRY(cu_colsum_add(dy, T, C, C, l->cspart, g->b_o, st), "bias gradient");
    mark(l, CU_PH_B_WO, st);
    /* attention */
    CU_TRY(cudaMemsetAsync(l->dgates, 0, (size_t)T * c->n_heads * sizeof(float), st), "cudaMemsetAsync");
    CU_TRY(cudaMemsetAsync(l->dqkv, 0, (size_t)T * qd * sizeof(uint16_t), st), "cudaMemsetAsync");
    if ((rc = cu_layer_core_backward(l, stream, err))) return rc;
    if (l->rope_cos)
        CU_TRY(cu_rope_k_backward(l->dqkv, T, N, c->n_heads, c->n_kv_heads, c->head_dim, qd, l->rope_cos, l->rope_sin, st),
               "RoPE backward");
    cu_router_params rp = router_params(l, w);
    rp.bq = c->qkv_bias ? w->b_qkv : NULL;
    rp.lb_scale = lb_scale;
    CU_TRY(cu_router_backward(&rp, st), "router backward");
    mark(l, CU_PH_B_ROUTER, st);
    /* projections */
    if (dx && (rc = cu_gemm(l->blas, st, false, false, T, C, qd, l->dqkv, qd, w->w_qkv, C, dx, C, true, 1.f, NULL, err)))
        return rc;
    if (g->w_qkv && (rc = cu_gemm(l->blas, st, true, false, qd, C, T, l->dqkv, qd, x, C, g->w_qkv, C, true, 1.f, NULL, err)))
        return rc;
    if (c->qkv_bias && g->b_qkv) CU_TRY(cu_colsum_add(l->dqkv, T, qd, qd, l->cspart, g->b_qkv, st), "bias gradient");
    if (l->nz > 0) {
        if (dx && (rc = cu_gemm(l->blas, st, false, false, T, C, l->nz, l->dz, l->ldz, w->w_router, C, dx, C, true, 1.f,
                                NULL, err)))
            return rc;
        if (g->w_router && (rc = cu_gemm(l->blas, st, true, false, l->nz, C, T, l->dz, l->ldz, x, C, g->w_router, C, true,
                                         1.f, NULL, err)))
            return rc;
    }
    mark(l, CU_PH_B_QKV, st);
    return MOH_OK;
}

int cu_layer_core_forward(moh_cuda_layer *l, void *stream, moh_error *err) {
    const cu_attn_params ap = cu_layer_attn_params(l);
    if (l->fwd_kind != CU_FWD_MMA) {
        CU_TRY(cu_transpose_v(&ap, (cudaStream_t)stream), "V transpose");
        CU_TRY(cu_flash_forward_wgmma(&ap, l->fwd_kind == CU_FWD_WGMMA1 ? 1 : 2, (cudaStream_t)stream),
               "flash attention forward (wgmma)");
    } else {
        CU_TRY(cu_flash_forward(&ap, (cudaStream_t)stream), "flash attention forward");
    }
    return MOH_OK;
}

int cu_layer_core_backward(moh_cuda_layer *l, void *stream, moh_error *err) {
    cudaStream_t st = (cudaStream_t)stream;
    const cu_attn_params ap = cu_layer_attn_params(l);
    CU_TRY(cu_bwd_pre(&ap, l->dog, l->dgates, l->dop, l->dsum, st), "backward preprocessing");
    mark(l, CU_PH_B_PRE, st);
    CU_TRY(cu_flash_backward_kv(&ap, st), "flash attention backward (dK, dV)");
    mark(l, CU_PH_B_KV, st);
    CU_TRY(cu_flash_backward_dq(&ap, st), "flash attention backward (dQ)");
    mark(l, CU_PH_B_DQ, st);
    return MOH_OK;
}

int moh_cuda_layer_sync(moh_cuda_layer *l, void *stream, moh_error *err) {
    if (!l) return moh_fail(err, MOH_E_ARG, "moh_cuda_layer_sync: NULL layer");
    CU_TRY(cudaStreamSynchronize((cudaStream_t)stream), "kernel (at cudaStreamSynchronize)");
    if (l->profile && l->nmark > 0) {
        for (int i = 1; i < l->nmark; i++) {
            float ms = 0.f;
            if (l->mark_phase[i] < 0) continue;
            if (cudaEventElapsedTime(&ms, l->ev[i - 1], l->ev[i]) == cudaSuccess)
                l->phase_ms[l->mark_phase[i]] += ms;
            else
                (void)cudaGetLastError(); /* a mark that was not recorded: the phase goes uncounted */
        }
        l->phase_calls++;
        l->nmark = 0;
    }
    return MOH_OK;
}

const float *moh_cuda_layer_lb_device(const moh_cuda_layer *l) {
    return l && l->E > 0 && l->cfg.top_k > 0 ? l->lb : NULL;
}

int moh_cuda_layer_lb_loss(moh_cuda_layer *l, void *stream, float *lb, moh_error *err) {
    int rc = moh_cuda_layer_sync(l, stream, err);
    if (rc) return rc;
    *lb = 0.f;
    if (l->E > 0 && l->cfg.top_k > 0) CU_TRY(cudaMemcpy(lb, l->lb, sizeof *lb, cudaMemcpyDeviceToHost), "cudaMemcpy");
    return MOH_OK;
}

/* ---- host <-> device weights ---------------------------------------------------------------- */

/* Sizes (elements) of the device tensors w_qkv, b_qkv, w_o, b_o, w_router, and their offsets in
 * one buffer with each tensor starting at a multiple of align elements; returns the total. */
static size_t dev_layout(const moh_attn_config *c, size_t n[5], size_t off[5], size_t align) {
    const size_t C = (size_t)c->hidden_size, qd = (size_t)attn_qkv_dim(c), hd = (size_t)c->n_heads * c->head_dim;
    n[0] = qd * C;
    n[1] = c->qkv_bias ? qd : 0;
    n[2] = C * hd;
    n[3] = c->proj_bias ? C : 0;
    n[4] = (size_t)moh_cuda_router_rows(c) * C;
    size_t tot = 0;
    for (int i = 0; i < 5; i++) {
        off[i] = tot;
        tot += (n[i] + align - 1) / align * align;
    }
    return tot;
}

/* Host source rows of the stacked router: row j of wg | wg_0 | wg_1 (K >= 1) or wg_1 (K == 0). */
static const float *router_row(const moh_attn_config *c, const attn_params_f32 *p, int j) {
    if (c->top_k == 0) return p->w_s + (size_t)j * c->hidden_size;
    return sparse_router_row(c, p, j);
}

int cu_weights_upload(const moh_attn_config *cfg, const struct attn_params_f32 *p, void **buf, moh_cuda_weights *w,
                      moh_error *err) {
    size_t n[5], off[5];
    const size_t tot = dev_layout(cfg, n, off, 128);
    uint16_t *h = malloc(tot * sizeof(uint16_t) + 2);
    if (!h) return moh_fail(err, MOH_E_NOMEM, "CUDA weights: out of host memory");
    const float *src[4] = {p->w_qkv, p->b_qkv, p->w_o, p->b_o};
    for (int i = 0; i < 4; i++)
        for (size_t k = 0; k < n[i]; k++) h[off[i] + k] = bf16_round(src[i][k]);
    const int C = cfg->hidden_size, nz = moh_cuda_router_rows(cfg);
    for (int j = 0; j < nz; j++) {
        const float *r = router_row(cfg, p, j);
        for (int k = 0; k < C; k++) h[off[4] + (size_t)j * C + k] = bf16_round(r[k]);
    }
    uint16_t *d = NULL;
    cudaError_t e = cudaMalloc((void **)&d, tot * sizeof(uint16_t) + 2);
    if (e == cudaSuccess) e = cudaMemcpy(d, h, tot * sizeof(uint16_t), cudaMemcpyHostToDevice);
    free(h);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        cudaFree(d);
        return moh_fail(err, e == cudaErrorMemoryAllocation ? MOH_E_NOMEM : MOH_E_DEVICE, "CUDA weights: %s",
                        cudaGetErrorString(e));
    }
    *buf = d;
    w->w_qkv = d + off[0];
    w->b_qkv = n[1] ? d + off[1] : NULL;
    w->w_o = d + off[2];
    w->b_o = n[3] ? d + off[3] : NULL;
    w->w_router = n[4] ? d + off[4] : NULL;
    return MOH_OK;
}

int cu_grads_alloc(const moh_attn_config *cfg, void **buf, moh_cuda_grads *g, moh_error *err) {
    size_t n[5], off[5];
    const size_t tot = dev_layout(cfg, n, off, 64);
    float *d = NULL;
    CU_TRY(cudaMalloc((void **)&d, tot * sizeof(float) + 4), "cudaMalloc (gradients)");
    const cudaError_t e = cudaMemset(d, 0, tot * sizeof(float));
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        cudaFree(d);
        return moh_fail(err, MOH_E_DEVICE, "CUDA gradients: %s", cudaGetErrorString(e));
    }
    *buf = d;
    g->w_qkv = d + off[0];
    g->b_qkv = n[1] ? d + off[1] : NULL;
    g->w_o = d + off[2];
    g->b_o = n[3] ? d + off[3] : NULL;
    g->w_router = n[4] ? d + off[4] : NULL;
    return MOH_OK;
}

int cu_grads_download(const moh_attn_config *cfg, const moh_cuda_grads *g, const struct attn_params_f32 *out,
                      moh_error *err) {
    size_t n[5], off[5];
    dev_layout(cfg, n, off, 1);
    float *dst[4] = {out->w_qkv, out->b_qkv, out->w_o, out->b_o};
    const float *src[4] = {g->w_qkv, g->b_qkv, g->w_o, g->b_o};
    for (int i = 0; i < 4; i++)
        if (n[i] && dst[i] && src[i])
            CU_TRY(cudaMemcpy(dst[i], src[i], n[i] * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy (gradients)");
    const int C = cfg->hidden_size, nz = moh_cuda_router_rows(cfg);
    for (int j = 0; j < nz && g->w_router; j++) {
        float *r = (float *)router_row(cfg, out, j);
        if (r) CU_TRY(cudaMemcpy(r, g->w_router + (size_t)j * C, (size_t)C * sizeof(float), cudaMemcpyDeviceToHost),
                      "cudaMemcpy (gradients)");
    }
    return MOH_OK;
}
