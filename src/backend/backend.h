/* The compute seam (issue 25): a backend is a table of device memory functions and the ops the
 * families call; a registry names them (cpu, cuda) and resolves --device. Families reach compute
 * only through a be_ctx (which backend, which precision) and the attention layer (attn/layer.h);
 * every instruction-set and precision choice lives inside the backend. Style: ggml-backend's
 * registry and one dispatch point per backend, without its graph (moh's backward is by hand).
 * Adding a device: a new table (src/backend/<name>.c) and one line in backend.c's registry. */
#ifndef MOH_BACKEND_H
#define MOH_BACKEND_H
#include <stdbool.h>
#include <stddef.h>

#include "attn/attn.h"
#include "moh.h"
#include "ops/adamw.h"
#include "ops/bf16.h"
#include "ops/muon.h"
#include "ops/ops.h"

/* What --device asks for: auto (CUDA when this build has it, a GPU is present and the backend runs
 * the family; else the CPU), or one device. */
typedef enum moh_device { MOH_DEVICE_AUTO = 0, MOH_DEVICE_CPU = 1, MOH_DEVICE_CUDA = 2 } moh_device;

struct moh_backend;
struct attn_layer_f32;

/* The element-wise and row ops every backend runs, beside the linear layers: X(return type, name,
 * parameters, arguments), shapes and semantics as the float32 op of the same name in ops/ops_decl.h
 * (row-major, M rows of C; n elements). The table gets a member `name` taking the be_ctx first; the
 * families call F(be_name)(cx, ...) (float64: the host op). */
#define BE_OPS(X)                                                                                                   \
    X(void, layernorm_forward, (BE_REAL *out, BE_REAL *mean, BE_REAL *rstd, const BE_REAL *inp, const BE_REAL *w, const BE_REAL *b,   \
                                int M, int C, BE_REAL eps), (out, mean, rstd, inp, w, b, M, C, eps))                    \
    X(void, layernorm_backward, (BE_REAL *dinp, BE_REAL *dw, BE_REAL *db, const BE_REAL *dout, const BE_REAL *inp, const BE_REAL *w,   \
                                 const BE_REAL *mean, const BE_REAL *rstd, int M, int C),                                 \
      (dinp, dw, db, dout, inp, w, mean, rstd, M, C))                                                               \
    X(void, rmsnorm_forward, (BE_REAL *out, BE_REAL *rstd, const BE_REAL *inp, const BE_REAL *w, int M, int C, BE_REAL eps),      \
      (out, rstd, inp, w, M, C, eps))                                                                               \
    X(void, add_rmsnorm_forward, (BE_REAL *sum, BE_REAL *out, BE_REAL *rstd, const BE_REAL *a, const BE_REAL *b, const BE_REAL *w,    \
                                  int M, int C, BE_REAL eps), (sum, out, rstd, a, b, w, M, C, eps))                     \
    X(void, rmsnorm_backward, (BE_REAL *dinp, BE_REAL *dw, const BE_REAL *dout, const BE_REAL *inp, const BE_REAL *w,              \
                               const BE_REAL *rstd, int M, int C), (dinp, dw, dout, inp, w, rstd, M, C))               \
    X(void, gelu_erf_forward, (BE_REAL *out, const BE_REAL *inp, long n), (out, inp, n))                                  \
    X(void, gelu_erf_backward, (BE_REAL *dinp, const BE_REAL *dout, const BE_REAL *inp, long n), (dinp, dout, inp, n))       \
    X(void, gelu_tanh_forward, (BE_REAL *out, const BE_REAL *inp, long n), (out, inp, n))                                 \
    X(void, gelu_tanh_backward, (BE_REAL *dinp, const BE_REAL *dout, const BE_REAL *inp, long n), (dinp, dout, inp, n))      \
    X(void, silu_forward, (BE_REAL *out, const BE_REAL *inp, long n), (out, inp, n))                                      \
    X(void, silu_backward, (BE_REAL *dinp, const BE_REAL *dout, const BE_REAL *inp, long n), (dinp, dout, inp, n))           \
    X(void, swiglu_forward_sig, (BE_REAL *out, BE_REAL *sig, const BE_REAL *gate, const BE_REAL *up, long n),                  \
      (out, sig, gate, up, n))                                                                                      \
    X(void, swiglu_backward_set, (BE_REAL *dgate, BE_REAL *dup, const BE_REAL *dout, const BE_REAL *gate, const BE_REAL *sig,      \
                                  const BE_REAL *up, long n), (dgate, dup, dout, gate, sig, up, n))                    \
    X(BE_REAL, cross_entropy_forward, (BE_REAL *probs, const BE_REAL *logits, const int *targets, int M, int V,             \
                                    BE_REAL label_smoothing), (probs, logits, targets, M, V, label_smoothing))         \
    X(void, cross_entropy_backward, (BE_REAL *dlogits, const BE_REAL *probs, const int *targets, int M, int V,           \
                                     BE_REAL label_smoothing, BE_REAL dloss),                                             \
      (dlogits, probs, targets, M, V, label_smoothing, dloss))                                                      \
    X(void, modulate_forward, (BE_REAL *out, const BE_REAL *x, const BE_REAL *shift, const BE_REAL *scale, int ld,  \
                               int B, int N, int D), (out, x, shift, scale, ld, B, N, D))                           \
    X(void, modulate_backward, (BE_REAL *dx, BE_REAL *dshift, BE_REAL *dscale, const BE_REAL *dout,                 \
                                const BE_REAL *x, const BE_REAL *scale, int ld, int B, int N, int D),               \
      (dx, dshift, dscale, dout, x, scale, ld, B, N, D))                                                            \
    X(void, gated_add_forward, (BE_REAL *x, const BE_REAL *gate, const BE_REAL *y, int ld, int B, int N, int D),    \
      (x, gate, y, ld, B, N, D))                                                                                    \
    X(void, gated_add_backward, (BE_REAL *dy, BE_REAL *dgate, const BE_REAL *g, const BE_REAL *gate,                \
                                 const BE_REAL *y, int ld, int B, int N, int D), (dy, dgate, g, gate, y, ld, B, N, D)) \
    X(void, embedding_forward, (BE_REAL *out, const int *ids, const BE_REAL *table, int M, int C), (out, ids, table, M, C)) \
    X(void, embedding_backward, (BE_REAL *dtable, const BE_REAL *dout, const int *ids, int M, int C),                    \
      (dtable, dout, ids, M, C))

/* The compute context of one set of activations (one shard): its backend and precision. The
 * backend owns state (CPU: the bf16 GEMM context under bf16, else NULL). Zeroed = unset; families
 * call be_ctx_init on their activations. */
typedef struct be_ctx {
    const struct moh_backend *be;
    moh_precision precision;
    void *state;
} be_ctx;

/* One backend. Ops take float32 device pointers, row-major, shapes as ops/ops_decl.h. */
typedef struct moh_backend {
    const char *name;      /* "cpu", "cuda": the --device value */
    moh_device device;
    /* Present in this build and on this machine; else false and why[cap] says why. */
    bool (*available)(char *why, size_t cap);
    /* Runs the family model_type whole (train, eval, sample); else false and why[cap]. */
    bool (*runs_family)(const char *model_type, char *why, size_t cap);
    /* Device memory (host memory on the CPU). MOH_E_NOMEM / MOH_E_DEVICE. */
    int (*alloc)(void **p, size_t bytes, moh_error *err);
    void (*free)(void *p);
    int (*to_device)(void *dst, const void *src, size_t bytes, moh_error *err);
    int (*to_host)(void *dst, const void *src, size_t bytes, moh_error *err);
    int (*sync)(moh_error *err);
    /* Precision of cx: bf16 with w the bf16 copy of the parameter buffer (kept in sync by the
     * caller), fp32 with w == NULL. MOH_OK or MOH_E_NOMEM (cx unchanged). */
    int (*ctx_set_weights)(be_ctx *cx, const bf16_mirror *w, moh_error *err);
    void (*ctx_release)(be_ctx *cx);
    /* nn.Linear: out[M, O] = inp[M, I] w[O, I]^T + b (b may be NULL). */
    void (*linear_forward)(const be_ctx *cx, float *out, const float *inp, const float *w, const float *b,
                           int M, int I, int O);
    /* Its backward: dinp = dout w + beta dinp (beta 1: accumulate; 0: written; dinp may be NULL);
     * dw += dout^T inp, db += column sums of dout (either may be NULL). */
    void (*linear_backward)(const be_ctx *cx, float *dinp, float beta, float *dw, float *db, const float *dout,
                            const float *inp, const float *w, int M, int I, int O);
#define BE_REAL float
#define BE_MEMBER(ret, name, params, args) ret(*name) BE_WITH_CTX params;
#define BE_WITH_CTX(...) (const be_ctx *cx, __VA_ARGS__)
    BE_OPS(BE_MEMBER)
#undef BE_MEMBER
#undef BE_REAL
    /* The update (train/trainer.c), on the whole parameter buffer [n] (float32, device memory):
     * the global gradient norm, clipped to max_norm when max_norm > 0 (ops/adamw.h: fixed summation
     * order); AdamW; the weights' EMA. */
    double (*clip_grad_norm)(float *g, size_t n, double max_norm);
    void (*adamw_update)(const adamw_config *c, float *w, const float *g, float *m, float *v, const bool *decay,
                         size_t n, long t, double lr);
    void (*ema_update)(float *ema, const float *w, size_t n, float decay);
    /* Muon on one hidden matrix w [rows, cols] (ops/muon.h muon_step), its Newton-Schulz products in
     * cx's precision (bf16: a context set to bf16 with no weights). work: muon_work_floats floats. */
    void (*muon_update)(const be_ctx *cx, const muon_config *c, float *w, const float *g, float *buf, int rows,
                        int cols, double lr, float *work);
    /* The MoH attention layer (attn/layer.h, spec §1, §10) on this device, its state in the
     * attn_layer_f32; members as attn_layer_*_f32 (init after the caller zeroed L and set L->be;
     * the router's activations in host memory). NULL attn_init: no attention layer here yet. */
    int (*attn_init)(struct attn_layer_f32 *L, const moh_attn_config *cfg, int B, int N, bool sparse,
                     moh_error *err);
    void (*attn_free)(struct attn_layer_f32 *L);
    void (*attn_forward)(struct attn_layer_f32 *L, const moh_attn_config *cfg, const attn_params_f32 *p,
                         const float *x, int B, int N, float *y);
    void (*attn_backward)(struct attn_layer_f32 *L, const moh_attn_config *cfg, const attn_params_f32 *p,
                          const attn_params_f32 *g, const float *dy, float lb_scale, float *dx);
    const attn_cache_f32 *(*attn_router)(const struct attn_layer_f32 *L);
    int (*attn_set_compute)(struct attn_layer_f32 *L, const moh_attn_config *cfg, const be_ctx *cx, moh_error *err);
    int (*attn_phases)(struct attn_layer_f32 *L, const char **names, double *seconds, int cap, bool reset);
    bool (*attn_kv)(const struct attn_layer_f32 *L, const moh_attn_config *cfg, int g, int N, const float **k,
                    const float **v);
    long (*attn_pairs)(const struct attn_layer_f32 *L, const moh_attn_config *cfg);
} moh_backend;

/* The backend of device d (MOH_DEVICE_CPU or MOH_DEVICE_CUDA; NULL for auto). Every build has
 * both tables; the CUDA one says it is unavailable where moh was built without CUDA. */
const moh_backend *backend_get(moh_device d);
/* Backends in registry order (*n gets the count). */
const moh_backend *const *backend_list(int *n);
/* Parses "auto", "cpu" or "cuda" (NULL: auto). MOH_E_ARG naming the value otherwise. */
int backend_parse_device(const char *s, moh_device *d, moh_error *err);

/* The backend that runs family model_type for a command asking for device `asked`: auto takes
 * CUDA where it is available and runs the family, else the CPU, with note[cap] saying why the CPU
 * ("auto: moh was built without CUDA"); a named device that cannot run is MOH_E_DEVICE with the
 * reason in err ("--device cuda: no CUDA device (...)"). note is "" when nothing fell back. */
int backend_resolve(moh_device asked, const char *model_type, const moh_backend **out, char *note, size_t cap,
                    moh_error *err);

/* cx on backend be in fp32 (be NULL: the CPU). */
void be_ctx_init(be_ctx *cx, const moh_backend *be);
/* Releases cx's backend state (fp32 again). */
void be_ctx_release(be_ctx *cx);
/* bf16 with the weights' bf16 copy w, or fp32 with w == NULL (moh_backend.ctx_set_weights). */
int be_ctx_set_weights(be_ctx *cx, const bf16_mirror *w, moh_error *err);

/* The ops as the model templates call them: F(be_linear_forward)(cx, ...). float32 dispatches
 * through cx's backend; float64 (gradient checks) runs the float64 ops on the host. */
static inline void be_linear_forward_f32(const be_ctx *cx, float *out, const float *inp, const float *w,
                                         const float *b, int M, int I, int O) {
    cx->be->linear_forward(cx, out, inp, w, b, M, I, O);
}
static inline void be_linear_backward_f32(const be_ctx *cx, float *dinp, float beta, float *dw, float *db,
                                          const float *dout, const float *inp, const float *w, int M, int I,
                                          int O) {
    cx->be->linear_backward(cx, dinp, beta, dw, db, dout, inp, w, M, I, O);
}
static inline void be_linear_forward_f64(const be_ctx *cx, double *out, const double *inp, const double *w,
                                         const double *b, int M, int I, int O) {
    (void)cx;
    linear_forward_f64(out, inp, w, b, M, I, O);
}
void be_linear_backward_f64(const be_ctx *cx, double *dinp, double beta, double *dw, double *db,
                            const double *dout, const double *inp, const double *w, int M, int I, int O);

/* F(be_name)(cx, ...) for every op of BE_OPS: float32 through cx's backend, float64 on the host. */
#define BE_DISPATCH_F32(ret, name, params, args)                                                                    \
    static inline ret be_##name##_f32 BE_WITH_CTX params { return cx->be->name BE_ARGS_CTX args; }
#define BE_HOST_F64(ret, name, params, args)                                                                        \
    static inline ret be_##name##_f64 BE_WITH_CTX params {                                                          \
        (void)cx;                                                                                                   \
        return name##_f64 args;                                                                                     \
    }
#define BE_ARGS_CTX(...) (cx, __VA_ARGS__)
#define BE_REAL float
BE_OPS(BE_DISPATCH_F32)
#undef BE_REAL
#define BE_REAL double
BE_OPS(BE_HOST_F64)
#undef BE_REAL
#undef BE_DISPATCH_F32
#undef BE_HOST_F64

/* The CPU backend's bf16 GEMM context of cx (NULL: fp32, or another backend): for the CPU
 * attention paths (attn/layer.c), which run inside this backend. */
struct bf16_ctx *be_cpu_bf16(const be_ctx *cx);

#endif
