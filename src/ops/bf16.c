/* bf16 compute (bf16.h): detection, conversion, weight mirror and the oneDNN bf16 matmul context. */
#define _GNU_SOURCE /* syscall(2) for arch_prctl */
#include "ops/bf16.h"

#include <oneapi/dnnl/dnnl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/ops.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define BF_X86 1
#define BF_TARGET __attribute__((target("avx512bf16,avx512f,avx512bw,avx512vl")))
#else
#define BF_X86 0
#endif

const char *precision_name(moh_precision p) { return p == MOH_PRECISION_BF16 ? "bf16" : "fp32"; }

int precision_parse(const char *s, moh_precision *p, moh_error *err) {
    if (!s || !strcmp(s, "fp32")) *p = MOH_PRECISION_FP32;
    else if (!strcmp(s, "bf16")) *p = MOH_PRECISION_BF16;
    else return moh_fail(err, MOH_E_ARG, "--precision '%s', expected fp32 or bf16", s);
    return MOH_OK;
}

bf16_caps bf16_detect(void) {
    bf16_caps c = {0};
    const char *off = getenv("MOH_NO_BF16"), *amx = getenv("MOH_NO_AMX");
    c.disabled = off && *off && strcmp(off, "0") != 0;
    c.amx_off = amx && *amx && strcmp(amx, "0") != 0;
#if BF_X86
    c.avx512_bf16 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                    __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
    unsigned a, b, cc, d;
    if (__get_cpuid_count(7, 0, &a, &b, &cc, &d)) c.amx_bf16 = (d >> 22 & 1) && (d >> 24 & 1);
    if (c.amx_bf16) { /* Linux: ask for the AMX tile data state (XFEATURE_XTILEDATA = 18) */
        c.amx_permitted = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18) == 0;
    }
#endif
    if (c.disabled) c.avx512_bf16 = c.amx_bf16 = c.amx_permitted = false;
    return c;
}

moh_precision precision_resolve(moh_precision asked, char *why, size_t cap) {
    if (cap) why[0] = 0;
    if (asked != MOH_PRECISION_BF16) return MOH_PRECISION_FP32;
    const bf16_caps c = bf16_detect();
    if (c.avx512_bf16 || c.amx_permitted) return MOH_PRECISION_BF16;
    snprintf(why, cap, "%s",
             c.disabled ? "MOH_NO_BF16 is set"
             : c.amx_bf16 ? "the CPU has AMX-BF16 but the OS refused the tile state and there is no AVX512-BF16"
                          : "this CPU has neither AVX512-BF16 nor AMX-BF16");
    return MOH_PRECISION_FP32;
}

void precision_describe(moh_precision p, char *out, size_t cap) {
    if (p != MOH_PRECISION_BF16) {
        snprintf(out, cap, "fp32");
        return;
    }
    const bf16_caps c = bf16_detect();
    char impl[96];
    bf16_gemm_probe(4096, 768, 768, impl, sizeof impl);
    snprintf(out, cap, "bf16 (fp32 master weights; attention tiles %s; GEMMs oneDNN matmul %s)",
             bf16_amx_tiles(&c) ? "AMX-BF16 tdpbf16ps"
             : c.avx512_bf16    ? (c.amx_permitted ? "AVX512-BF16 vdpbf16ps (MOH_NO_AMX)" : "AVX512-BF16 vdpbf16ps")
                                : "fp32 (no AVX512-BF16)",
             impl);
}

/* ---- conversion ---------------------------------------------------------------------------- */


#if BF_X86
BF_TARGET static void from_f32_avx(uint16_t *dst, const float *src, size_t n) {
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        const __m512bh h = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + i + 16), _mm512_loadu_ps(src + i));
        _mm512_storeu_si512((void *)(dst + i), (__m512i)h);
    }
    for (; i < n; i++) dst[i] = bf16_round(src[i]);
}
#endif

void bf16_from_f32(uint16_t *dst, const float *src, size_t n) {
#if BF_X86
    if (__builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw")) {
        from_f32_avx(dst, src, n);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++) dst[i] = bf16_round(src[i]);
}

void bf16_to_f32(float *dst, const uint16_t *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = bf16_value(src[i]);
}

/* ---- weight mirror ------------------------------------------------------------------------- */

int bf16_mirror_init(bf16_mirror *m, const float *src, size_t n, moh_error *err) {
    memset(m, 0, sizeof *m);
    m->data = malloc(sizeof(uint16_t) * (n ? n : 1));
    if (!m->data) return moh_fail(err, MOH_E_NOMEM, "bf16: cannot allocate the bf16 weight copy (%zu values)", n);
    m->src = src;
    m->n = n;
    return MOH_OK;
}

void bf16_mirror_sync(bf16_mirror *m) {
    const size_t chunk = 1 << 16, nc = (m->n + chunk - 1) / chunk;
#pragma omp parallel for schedule(static) if (nc > 1)
    for (size_t k = 0; k < nc; k++) {
        const size_t i0 = k * chunk, len = i0 + chunk < m->n ? chunk : m->n - i0;
        bf16_from_f32(m->data + i0, m->src + i0, len);
    }
}

void bf16_mirror_free(bf16_mirror *m) {
    free(m->data);
    memset(m, 0, sizeof *m);
}

const uint16_t *bf16_mirror_of(const bf16_mirror *m, const float *p) {
    if (!m || !m->data || p < m->src || p >= m->src + m->n) return NULL;
    return m->data + (p - m->src);
}

/* ---- GEMM context -------------------------------------------------------------------------- */

#define BF_MAX_PRIMS 64

typedef struct bf_prim {
    int ta, tb, M, N, K, lda, ldb, ldc;
    float beta;
    dnnl_primitive_t prim;
    dnnl_memory_t a, b, c;
} bf_prim;

struct bf16_ctx {
    dnnl_engine_t eng;
    dnnl_stream_t st;
    const bf16_mirror *w;
    bf_prim prims[BF_MAX_PRIMS];
    int nprims, next_evict;
    uint16_t *scratch[2];
    size_t scratch_cap[2];
    char impl[96];
    long fallbacks;
};

int bf16_ctx_new(bf16_ctx **out, const bf16_mirror *weights, moh_error *err) {
    bf16_ctx *c = calloc(1, sizeof *c);
    if (!c) return moh_fail(err, MOH_E_NOMEM, "bf16: cannot allocate the GEMM context");
    if (dnnl_engine_create(&c->eng, dnnl_cpu, 0) != dnnl_success ||
        dnnl_stream_create(&c->st, c->eng, dnnl_stream_default_flags) != dnnl_success) {
        bf16_ctx_free(c);
        return moh_fail(err, MOH_E_NOMEM, "bf16: oneDNN could not create a CPU engine and stream");
    }
    c->w = weights;
    snprintf(c->impl, sizeof c->impl, "none");
    *out = c;
    return MOH_OK;
}

static void prim_free(bf_prim *p) {
    if (p->prim) dnnl_primitive_destroy(p->prim);
    if (p->a) dnnl_memory_destroy(p->a);
    if (p->b) dnnl_memory_destroy(p->b);
    if (p->c) dnnl_memory_destroy(p->c);
    memset(p, 0, sizeof *p);
}

void bf16_ctx_free(bf16_ctx *c) {
    if (!c) return;
    for (int i = 0; i < c->nprims; i++) prim_free(&c->prims[i]);
    if (c->st) dnnl_stream_destroy(c->st);
    if (c->eng) dnnl_engine_destroy(c->eng);
    free(c->scratch[0]);
    free(c->scratch[1]);
    free(c);
}

void bf16_ctx_set_weights(bf16_ctx *c, const bf16_mirror *weights) { c->w = weights; }
const char *bf16_ctx_impl(const bf16_ctx *c) { return c->impl; }
long bf16_ctx_fallbacks(const bf16_ctx *c) { return c->fallbacks; }

/* A matmul primitive for bf16 A [M,K] (strides by ta, lda), B [K,N] (tb, ldb) -> f32 C [M,N]
 * (ldc), with a sum post-op when beta != 0. *impl gets oneDNN's implementation name. */
static int prim_make(dnnl_engine_t eng, bf_prim *p, char *impl, size_t cap) {
    dnnl_memory_desc_t amd, bmd, cmd;
    const dnnl_dims_t ad = {p->M, p->K}, bd = {p->K, p->N}, cd = {p->M, p->N};
    const dnnl_dims_t as = {p->ta ? 1 : p->lda, p->ta ? p->lda : 1};
    const dnnl_dims_t bs = {p->tb ? 1 : p->ldb, p->tb ? p->ldb : 1};
    const dnnl_dims_t cs = {p->ldc, 1};
    if (dnnl_memory_desc_init_by_strides(&amd, 2, ad, dnnl_bf16, as) != dnnl_success ||
        dnnl_memory_desc_init_by_strides(&bmd, 2, bd, dnnl_bf16, bs) != dnnl_success ||
        dnnl_memory_desc_init_by_strides(&cmd, 2, cd, dnnl_f32, cs) != dnnl_success)
        return -1;
    dnnl_matmul_desc_t md;
    if (dnnl_matmul_desc_init(&md, &amd, &bmd, NULL, &cmd) != dnnl_success) return -1;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    int rc = -1;
    dnnl_primitive_desc_t pd = NULL;
    if (dnnl_primitive_attr_create(&attr) != dnnl_success) return -1;
    if (p->beta != 0.0f) {
        if (dnnl_post_ops_create(&po) != dnnl_success || dnnl_post_ops_append_sum(po, p->beta) != dnnl_success ||
            dnnl_primitive_attr_set_post_ops(attr, po) != dnnl_success)
            goto done;
    }
    if (dnnl_primitive_desc_create(&pd, &md, attr, eng, NULL) != dnnl_success) goto done;
    const char *name = NULL;
    if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &name) == dnnl_success && name)
        snprintf(impl, cap, "%s", name);
    if (dnnl_primitive_create(&p->prim, pd) != dnnl_success) goto done;
    if (dnnl_memory_create(&p->a, &amd, eng, DNNL_MEMORY_NONE) != dnnl_success ||
        dnnl_memory_create(&p->b, &bmd, eng, DNNL_MEMORY_NONE) != dnnl_success ||
        dnnl_memory_create(&p->c, &cmd, eng, DNNL_MEMORY_NONE) != dnnl_success)
        goto done;
    rc = 0;
done:
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (po) dnnl_post_ops_destroy(po);
    dnnl_primitive_attr_destroy(attr);
    return rc;
}

static bf_prim *prim_get(bf16_ctx *c, bool ta, bool tb, int M, int N, int K, int lda, int ldb, int ldc,
                         float beta) {
    for (int i = 0; i < c->nprims; i++) {
        bf_prim *p = &c->prims[i];
        if (p->ta == ta && p->tb == tb && p->M == M && p->N == N && p->K == K && p->lda == lda && p->ldb == ldb &&
            p->ldc == ldc && p->beta == beta)
            return p;
    }
    bf_prim *p;
    if (c->nprims < BF_MAX_PRIMS) p = &c->prims[c->nprims++];
    else { /* full: replace round-robin */
        p = &c->prims[c->next_evict];
        c->next_evict = (c->next_evict + 1) % BF_MAX_PRIMS;
        prim_free(p);
    }
    *p = (bf_prim){.ta = ta, .tb = tb, .M = M, .N = N, .K = K, .lda = lda, .ldb = ldb, .ldc = ldc, .beta = beta};
    if (prim_make(c->eng, p, c->impl, sizeof c->impl)) {
        prim_free(p);
        return NULL; /* the emptied slot matches no shape (M = 0) and is reused */
    }
    return p;
}

/* The bf16 form of a float32 operand of rows x cols (stride ld): the mirror's copy when it lies
 * in the weights, else rounded into scratch slot k, packed (*ld_out = cols). */
static const uint16_t *operand(bf16_ctx *c, int k, const float *x, int rows, int cols, int ld, int *ld_out) {
    const uint16_t *m = bf16_mirror_of(c->w, x);
    if (m && bf16_mirror_of(c->w, x + (size_t)(rows - 1) * ld + cols - 1)) {
        *ld_out = ld;
        return m;
    }
    const size_t need = (size_t)rows * cols;
    if (need > c->scratch_cap[k]) {
        uint16_t *s = realloc(c->scratch[k], sizeof(uint16_t) * need);
        if (!s) return NULL;
        c->scratch[k] = s;
        c->scratch_cap[k] = need;
    }
    uint16_t *s = c->scratch[k];
    if (ld == cols) bf16_from_f32(s, x, need);
    else
        for (int r = 0; r < rows; r++) bf16_from_f32(s + (size_t)r * cols, x + (size_t)r * ld, (size_t)cols);
    *ld_out = cols;
    return s;
}

/* bf16_gemm on operands already in bf16 (a, b with leading dimensions la, lb; NULL: conversion
 * failed); A and B are their float32 originals for the fp32 fallback. */
static void gemm_conv(bf16_ctx *c, bool ta, bool tb, int M, int N, int K, const uint16_t *a, int la,
                      const uint16_t *b, int lb, const float *A, int lda, const float *B, int ldb, float beta,
                      float *C, int ldc) {
    bf_prim *p = a && b ? prim_get(c, ta, tb, M, N, K, la, lb, ldc, beta) : NULL;
    if (p && dnnl_memory_set_data_handle(p->a, (void *)a) == dnnl_success &&
        dnnl_memory_set_data_handle(p->b, (void *)b) == dnnl_success &&
        dnnl_memory_set_data_handle(p->c, C) == dnnl_success) {
        const dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, p->a}, {DNNL_ARG_WEIGHTS, p->b}, {DNNL_ARG_DST, p->c}};
        if (dnnl_primitive_execute(p->prim, c->st, 3, args) == dnnl_success && dnnl_stream_wait(c->st) == dnnl_success)
            return;
    }
    c->fallbacks++;
    gemm_f32(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
}

void bf16_gemm(bf16_ctx *c, bool ta, bool tb, int M, int N, int K, const float *A, int lda,
               const float *B, int ldb, float beta, float *C, int ldc) {
    if (M <= 0 || N <= 0 || K <= 0) {
        gemm_f32(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    int la = 0, lb = 0;
    const uint16_t *a = operand(c, 0, A, ta ? K : M, ta ? M : K, lda, &la);
    const uint16_t *b = operand(c, 1, B, tb ? N : K, tb ? K : N, ldb, &lb);
    gemm_conv(c, ta, tb, M, N, K, a, la, b, lb, A, lda, B, ldb, beta, C, ldc);
}

void bf16_linear_forward(bf16_ctx *c, float *out, const float *inp, const float *w, const float *b,
                         int M, int I, int O) {
    bf16_gemm(c, false, true, M, O, I, inp, I, w, I, 0.0f, out, O);
    if (!b) return;
#pragma omp parallel for if ((long)M * O >= 65536) schedule(static)
    for (int m = 0; m < M; m++)
        for (int j = 0; j < O; j++) out[(long)m * O + j] += b[j];
}

void bf16_linear_backward_beta(bf16_ctx *c, float *dinp, float beta, float *dw, float *db, const float *dout,
                               const float *inp, const float *w, int M, int I, int O) {
    if (M > 0 && I > 0 && O > 0 && (dinp || dw)) { /* dout in bf16 once, for both products */
        int ld = 0, l1 = 0;
        const uint16_t *d16 = operand(c, 0, dout, M, O, O, &ld);
        if (dinp) {
            const uint16_t *w16 = operand(c, 1, w, O, I, I, &l1);
            gemm_conv(c, false, false, M, I, O, d16, ld, w16, l1, dout, O, w, I, beta, dinp, I);
        }
        if (dw) {
            const uint16_t *x16 = operand(c, 1, inp, M, I, I, &l1);
            gemm_conv(c, true, false, O, I, M, d16, ld, x16, l1, dout, O, inp, I, 1.0f, dw, I);
        }
    } else {
        if (dinp) gemm_f32(false, false, M, I, O, 1.0f, dout, O, w, I, beta, dinp, I);
        if (dw) gemm_f32(true, false, O, I, M, 1.0f, dout, O, inp, I, 1.0f, dw, I);
    }
    if (db) linear_backward_f32(NULL, NULL, db, dout, NULL, NULL, M, I, O);
}

void bf16_linear_backward(bf16_ctx *c, float *dinp, float *dw, float *db, const float *dout,
                          const float *inp, const float *w, int M, int I, int O) {
    bf16_linear_backward_beta(c, dinp, 1.0f, dw, db, dout, inp, w, M, I, O);
}

void linear_forward_ctx_f32(bf16_ctx *c, float *out, const float *inp, const float *w, const float *b,
                            int M, int I, int O) {
    if (c) bf16_linear_forward(c, out, inp, w, b, M, I, O);
    else linear_forward_f32(out, inp, w, b, M, I, O);
}

void linear_backward_ctx_f32(bf16_ctx *c, float *dinp, float *dw, float *db, const float *dout,
                             const float *inp, const float *w, int M, int I, int O) {
    if (c) bf16_linear_backward(c, dinp, dw, db, dout, inp, w, M, I, O);
    else linear_backward_f32(dinp, dw, db, dout, inp, w, M, I, O);
}

void linear_forward_ctx_f64(bf16_ctx *c, double *out, const double *inp, const double *w, const double *b,
                            int M, int I, int O) {
    (void)c; /* float64 has no bf16 path */
    linear_forward_f64(out, inp, w, b, M, I, O);
}

void linear_backward_ctx_f64(bf16_ctx *c, double *dinp, double *dw, double *db, const double *dout,
                             const double *inp, const double *w, int M, int I, int O) {
    (void)c;
    linear_backward_f64(dinp, dw, db, dout, inp, w, M, I, O);
}

int bf16_ctx_use(bf16_ctx **c, const bf16_mirror *w, moh_error *err) {
    if (!w) {
        bf16_ctx_free(*c);
        *c = NULL;
        return MOH_OK;
    }
    if (*c) {
        bf16_ctx_set_weights(*c, w);
        return MOH_OK;
    }
    return bf16_ctx_new(c, w, err);
}

void bf16_gemm_probe(int M, int N, int K, char *out, size_t cap) {
    snprintf(out, cap, "unavailable");
    dnnl_engine_t eng = NULL;
    if (dnnl_engine_create(&eng, dnnl_cpu, 0) != dnnl_success) return;
    bf_prim p = {.ta = 0, .tb = 1, .M = M, .N = N, .K = K, .lda = K, .ldb = K, .ldc = N};
    char impl[96] = "unavailable";
    if (!prim_make(eng, &p, impl, sizeof impl)) snprintf(out, cap, "%s", impl);
    prim_free(&p);
    dnnl_engine_destroy(eng);
}
