/* bf16 compute with fp32 master weights (issue 15 item 1): the precision setting, run-time
 * detection of the CPU's bf16 hardware, fp32 <-> bf16 conversion, a bf16 mirror of a parameter
 * buffer, and a GEMM context whose products run oneDNN's bf16 matmul (bf16 A and B, fp32
 * accumulation and output). The fp32 path never touches any of this.
 *
 * bf16 here is the upper half of an IEEE float32 (1 sign, 8 exponent, 7 mantissa bits), rounded to
 * nearest even; NaN stays NaN. Stored as uint16_t. */
#ifndef MOH_OPS_BF16_H
#define MOH_OPS_BF16_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "moh.h"

/* What a command computes in: fp32 everywhere, or the big GEMMs and attention tiles in bf16 with
 * fp32 accumulation (softmax, norms, router, losses and the optimizer stay fp32). */
/* AUTO: chosen by measurement (model_shards_auto_precision); never what runs. */
typedef enum moh_precision { MOH_PRECISION_FP32 = 0, MOH_PRECISION_BF16 = 1, MOH_PRECISION_AUTO = 2 } moh_precision;

/* "fp32" / "bf16". */
const char *precision_name(moh_precision p);
/* Parses "fp32" or "bf16" (NULL: fp32). MOH_E_ARG naming the value otherwise. */
int precision_parse(const char *s, moh_precision *p, moh_error *err);

/* bf16 hardware of this CPU, read from cpuid at run time (never from compile flags). */
typedef struct bf16_caps {
    bool avx512_bf16;   /* vdpbf16ps / vcvtne2ps2bf16 (AVX512-BF16, with AVX512F/BW/VL) */
    bool amx_bf16;      /* AMX-BF16 tiles in the CPU */
    bool amx_permitted; /* ... and the OS granted this process the tile state (Linux
                         * arch_prctl(ARCH_REQ_XCOMP_PERM)); false when amx_bf16 is */
    bool disabled;      /* MOH_NO_BF16=1 in the environment: act as a CPU without bf16 (tests) */
    bool amx_off;       /* MOH_NO_AMX=1: moh's attention tiles use vdpbf16ps even where AMX is
                         * permitted (comparisons; oneDNN picks its own kernels) */
} bf16_caps;
bf16_caps bf16_detect(void);
/* Whether moh's bf16 attention tiles run on AMX-BF16: permitted by the OS, AVX512-BF16 present
 * for the conversions around them, and not turned off by MOH_NO_AMX. */
static inline bool bf16_amx_tiles(const bf16_caps *c) { return c->amx_permitted && c->avx512_bf16 && !c->amx_off; }

/* The precision a command runs given what it asked for: bf16 only when the CPU has AVX512-BF16
 * or permitted AMX-BF16, else fp32 with why[cap] saying why (else why = ""). */
moh_precision precision_resolve(moh_precision asked, char *why, size_t cap);
/* One line for a start line: "bf16 (AVX512-BF16 tiles; GEMMs oneDNN <impl>)" or "fp32". */
void precision_describe(moh_precision p, char *out, size_t cap);

/* fp32 -> bf16 (round to nearest even) and back, n values. */
void bf16_from_f32(uint16_t *dst, const float *src, size_t n);
void bf16_to_f32(float *dst, const uint16_t *src, size_t n);
/* One value, rounded to nearest even (the scalar reference of bf16_from_f32). */
static inline uint16_t bf16_round(float x) {
    union { float f; uint32_t u; } v = {.f = x};
    if ((v.u & 0x7F800000u) == 0x7F800000u && (v.u & 0x007FFFFFu)) return (uint16_t)(v.u >> 16 | 0x0040u); /* NaN */
    return (uint16_t)((v.u + 0x7FFFu + (v.u >> 16 & 1u)) >> 16);
}
static inline float bf16_value(uint16_t h) {
    union { uint32_t u; float f; } v = {.u = (uint32_t)h << 16};
    return v.f;
}

/* A bf16 copy of a float32 buffer src[n] (a model's parameters): converted by bf16_mirror_sync,
 * once per optimizer step / micro-batch, so every bf16 GEMM reads the same rounded weights. */
typedef struct bf16_mirror {
    uint16_t *data;   /* [n] */
    const float *src; /* [n], borrowed */
    size_t n;
} bf16_mirror;
int bf16_mirror_init(bf16_mirror *m, const float *src, size_t n, moh_error *err); /* MOH_E_NOMEM */
void bf16_mirror_sync(bf16_mirror *m); /* data = bf16(src), OpenMP over the buffer */
void bf16_mirror_free(bf16_mirror *m);
/* The bf16 copy of src[i..] when p = src + i lies in the buffer, else NULL. */
const uint16_t *bf16_mirror_of(const bf16_mirror *m, const float *p);

/* A bf16 GEMM context: oneDNN engine and stream, matmul primitives cached by shape, scratch for
 * operands converted on the fly. One per thread of use (each shard's activations own one); the
 * weights come from a shared mirror (may be NULL: every operand converted). */
typedef struct bf16_ctx bf16_ctx;
int bf16_ctx_new(bf16_ctx **c, const bf16_mirror *weights, moh_error *err); /* MOH_E_NOMEM */
void bf16_ctx_free(bf16_ctx *c);
void bf16_ctx_set_weights(bf16_ctx *c, const bf16_mirror *weights);
/* Row-major C[M,N] = op(A) op(B) + beta C as gemm_f32 (gemm.h; alpha 1), A and B float32:
 * each is read from the weight mirror when it lies in it, else rounded to bf16 into scratch;
 * products accumulate in fp32 (oneDNN matmul, bf16 x bf16 -> f32). If oneDNN refuses the
 * shape, gemm_f32 computes it (counted in bf16_ctx_fallbacks). */
void bf16_gemm(bf16_ctx *c, bool ta, bool tb, int M, int N, int K, const float *A, int lda,
               const float *B, int ldb, float beta, float *C, int ldc);
/* nn.Linear in bf16 (ops_decl.h linear_forward_f32 / linear_backward_f32, same shapes and
 * accumulation): out[M,O] = bf16(inp)[M,I] bf16(w)[O,I]^T + b; backward ACCUMULATES dinp += dout
 * w and dw += dout^T inp (dout, inp rounded to bf16, fp32 accumulation), db in fp32. */
void bf16_linear_forward(bf16_ctx *c, float *out, const float *inp, const float *w, const float *b,
                         int M, int I, int O);
void bf16_linear_backward(bf16_ctx *c, float *dinp, float *dw, float *db, const float *dout,
                          const float *inp, const float *w, int M, int I, int O);
/* The linear layer of a model's float32 path: bf16_linear_forward / bf16_linear_backward when c
 * is non-NULL, else linear_forward_f32 / linear_backward_f32 (the fp32 path, bit for bit). Same
 * shapes and accumulation as those. The _f64 forms (gradient checks) take c == NULL only and run
 * the float64 ops, so model templates call F(linear_forward_ctx) in both instantiations. */
void linear_forward_ctx_f32(bf16_ctx *c, float *out, const float *inp, const float *w, const float *b,
                            int M, int I, int O);
void linear_backward_ctx_f32(bf16_ctx *c, float *dinp, float *dw, float *db, const float *dout,
                             const float *inp, const float *w, int M, int I, int O);
void linear_forward_ctx_f64(bf16_ctx *c, double *out, const double *inp, const double *w, const double *b,
                            int M, int I, int O);
void linear_backward_ctx_f64(bf16_ctx *c, double *dinp, double *dw, double *db, const double *dout,
                             const double *inp, const double *w, int M, int I, int O);
/* Points *c at the weights w: w == NULL frees *c (fp32 again, *c = NULL); else *c is made (NULL
 * before) or re-pointed at w. For a backend compute context (backend/cpu.c). MOH_OK or MOH_E_NOMEM. */
int bf16_ctx_use(bf16_ctx **c, const bf16_mirror *w, moh_error *err);
/* The same with dinp = dout w + beta dinp (beta 0: written, no zeroing pass first). dout is
 * rounded to bf16 once for both products. */
void bf16_linear_backward_beta(bf16_ctx *c, float *dinp, float beta, float *dw, float *db, const float *dout,
                               const float *inp, const float *w, int M, int I, int O);
/* oneDNN's implementation of the last matmul primitive made ("brg:avx512_core_amx",
 * "brg:avx512_core_bf16", ...; "none" before the first), and GEMMs that fell back to fp32. */
const char *bf16_ctx_impl(const bf16_ctx *c);
long bf16_ctx_fallbacks(const bf16_ctx *c);
/* The implementation oneDNN picks for a bf16 matmul of M x N x K on this CPU (a throwaway
 * primitive; "unavailable" when it refuses), into out[cap]. For `moh bench` and start lines. */
void bf16_gemm_probe(int M, int N, int K, char *out, size_t cap);

#endif
