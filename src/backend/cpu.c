/* The CPU backend: host memory, the ops of src/ops (oneDNN GEMMs in fp32, or bf16 with fp32
 * accumulation through a bf16_ctx when the context is bf16). Instruction sets are chosen inside
 * those ops and the attention kernels at run time (cpuid); nothing above this seam names one. */
#include <stdlib.h>
#include <string.h>

#include "attn/layer.h"
#include "backend/backend.h"
#include "backend/backends.h"
#include "ops/gemm.h"

static bool cpu_available(char *why, size_t cap) {
    if (why && cap) why[0] = '\0';
    return true;
}

static bool cpu_runs_family(const char *model_type, char *why, size_t cap) {
    (void)model_type;
    if (why && cap) why[0] = '\0';
    return true;
}

static int cpu_alloc(void **p, size_t bytes, moh_error *err) {
    *p = malloc(bytes ? bytes : 1);
    return *p ? MOH_OK : moh_fail(err, MOH_E_NOMEM, "cpu: cannot allocate %zu bytes", bytes);
}

static void cpu_free(void *p) { free(p); }

static int cpu_copy(void *dst, const void *src, size_t bytes, moh_error *err) {
    (void)err;
    if (bytes) memmove(dst, src, bytes);
    return MOH_OK;
}

static int cpu_sync(moh_error *err) {
    (void)err;
    return MOH_OK;
}

static int cpu_ctx_set_weights(be_ctx *cx, const bf16_mirror *w, moh_error *err) {
    bf16_ctx *c = cx->state;
    const int rc = bf16_ctx_use(&c, w, err);
    if (rc) return rc;
    cx->state = c;
    cx->precision = c ? MOH_PRECISION_BF16 : MOH_PRECISION_FP32;
    return MOH_OK;
}

static void cpu_ctx_release(be_ctx *cx) {
    bf16_ctx_free(cx->state);
    cx->state = NULL;
    cx->precision = MOH_PRECISION_FP32;
}

static void cpu_linear_forward(const be_ctx *cx, float *out, const float *inp, const float *w, const float *b,
                               int M, int I, int O) {
    linear_forward_ctx_f32(cx->state, out, inp, w, b, M, I, O);
}

static void cpu_linear_backward(const be_ctx *cx, float *dinp, float beta, float *dw, float *db, const float *dout,
                                const float *inp, const float *w, int M, int I, int O) {
    if (cx->state) {
        bf16_linear_backward_beta(cx->state, dinp, beta, dw, db, dout, inp, w, M, I, O);
    } else if (beta == 1.0f || !dinp) {
        linear_backward_f32(dinp, dw, db, dout, inp, w, M, I, O);
    } else {
        gemm_f32(false, false, M, I, O, 1.0f, dout, O, w, I, beta, dinp, I);
        linear_backward_f32(NULL, dw, db, dout, inp, w, M, I, O);
    }
}

/* Every op of BE_OPS: the float32 op of src/ops (the instruction set chosen inside it). */
#define BE_REAL float
#define CPU_OP(ret, name, params, args)                                                                             \
    static ret cpu_##name BE_WITH_CTX params {                                                                      \
        (void)cx;                                                                                                   \
        return name##_f32 args;                                                                                     \
    }
BE_OPS(CPU_OP)
#undef CPU_OP
#undef BE_REAL

static void cpu_muon_update(const be_ctx *cx, const muon_config *c, float *w, const float *g, float *buf, int rows,
                            int cols, double lr, float *work) {
    muon_step(c, cx->state, w, g, buf, rows, cols, lr, work);
}

const moh_backend backend_cpu = {
    .name = "cpu",
    .device = MOH_DEVICE_CPU,
    .available = cpu_available,
    .runs_family = cpu_runs_family,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .to_device = cpu_copy,
    .to_host = cpu_copy,
    .sync = cpu_sync,
    .ctx_set_weights = cpu_ctx_set_weights,
    .ctx_release = cpu_ctx_release,
    .linear_forward = cpu_linear_forward,
    .linear_backward = cpu_linear_backward,
#define CPU_SET(ret, name, params, args) .name = cpu_##name,
    BE_OPS(CPU_SET)
#undef CPU_SET
    .clip_grad_norm = clip_grad_norm,
    .adamw_update = adamw_step,
    .ema_update = ema_update,
    .muon_update = cpu_muon_update,
    .attn_init = attn_cpu_init,
    .attn_free = attn_cpu_free,
    .attn_forward = attn_cpu_forward,
    .attn_backward = attn_cpu_backward,
    .attn_router = attn_cpu_router,
    .attn_set_compute = attn_cpu_set_compute,
    .attn_phases = attn_cpu_phases,
    .attn_kv = attn_cpu_kv,
    .attn_pairs = attn_cpu_pairs,
};

struct bf16_ctx *be_cpu_bf16(const be_ctx *cx) { return cx->be == &backend_cpu ? cx->state : NULL; }
