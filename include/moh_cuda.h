/* moh on NVIDIA GPUs: one MoH attention layer (spec §1-3, §10) on device memory, forward and
 * backward, bf16 operands with fp32 accumulation (the CUDA backend, src/cuda/). Conventions as
 * moh.h; in addition every tensor argument is a DEVICE pointer, bf16 values are uint16_t bit
 * patterns (the upper half of the float32), and work is enqueued on the caller's CUDA stream
 * (a cudaStream_t passed as void *, NULL = the legacy default stream). A moh built without CUDA
 * has these functions too: they fail with MOH_E_DEVICE ("built without CUDA").
 *
 * What runs: the K and V projections dense (cuBLASLt, bf16, fp32 accumulation); the router (every
 * router of moh.h) on the GPU; for each (batch row, head) the positions of the tokens that
 * selected it, in order ("segments"); the queries of the selected pairs packed with RoPE; flash
 * attention of each head's packed queries against all keys of its KV head (causal by position);
 * the gate applied in the epilogue, outputs scattered into [T, h d]; W_O one GEMM. Backward:
 * flash backward (dK, dV key-stationary, dQ query-stationary: no atomics, bitwise repeatable), the
 * gate and router gradients, the projections' gradients. No [B, h, N, N] tensor exists. Source: src/cuda/layer.c. */
#ifndef MOH_CUDA_H
#define MOH_CUDA_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <moh.h>

/* true when moh was built with CUDA and a device is usable; else false with the reason in
 * why[cap] (may be NULL): "moh was built without CUDA", "no CUDA device (...)". */
bool moh_cuda_available(char *why, size_t cap);
/* "NVIDIA H200 (sm_90, 132 SMs, 139 GiB)" of the current device into out[cap]. MOH_OK or
 * MOH_E_DEVICE. */
int moh_cuda_describe(char *out, size_t cap, moh_error *err);

/* Weights of one layer on the device, bf16 (names: spec §10): w_qkv [(h + 2 h_kv) d, C] (q rows,
 * then k, then v), b_qkv [(h + 2 h_kv) d] or NULL, w_o [C, h d], b_o [C] or NULL, w_router
 * [moh_cuda_router_rows(cfg), C]: the learned router's rows stacked, wg [E, C] then wg_0 [2, C]
 * (h_s >= 1) then wg_1 [h_s, C] (h_s >= 2); with top_k == 0 only wg_1; NULL without them. */
typedef struct moh_cuda_weights {
    const uint16_t *w_qkv, *b_qkv, *w_o, *b_o, *w_router;
} moh_cuda_weights;
/* Gradients, fp32, same shapes; ACCUMULATED into (+=); NULL fields skipped. */
typedef struct moh_cuda_grads {
    float *w_qkv, *b_qkv, *w_o, *b_o, *w_router;
} moh_cuda_grads;

/* Rows of w_router for cfg (0 without a learned router). */
int moh_cuda_router_rows(const moh_attn_config *cfg);

typedef struct moh_cuda_layer moh_cuda_layer;

/* A layer for batches of up to max_B x max_N tokens: one device allocation (moh_cuda_layer_bytes),
 * a cuBLASLt handle, the RoPE tables. cfg must validate; head_dim one of 32, 64, 72, 80, 96, 128;
 * at most 768 routed heads; max_B x n_heads <= 65535 and every tensor under 2^31 elements.
 * MOH_E_CONFIG (unsupported head_dim or head count, named), MOH_E_ARG (max_B, max_N out of those
 * bounds), MOH_E_NOMEM (device memory), MOH_E_DEVICE (no GPU, no cuBLASLt, CUDA error; the message
 * names the call). The shape checks come before any GPU work. */
int moh_cuda_layer_new(moh_cuda_layer **out, const moh_attn_config *cfg, int max_B, int max_N, moh_error *err);
void moh_cuda_layer_free(moh_cuda_layer *l);
/* Device bytes the layer holds. */
size_t moh_cuda_layer_bytes(const moh_cuda_layer *l);

/* Forward: x [B, N, C] -> y [B, N, C] (bf16, device), B <= max_B, N <= max_N. Keeps the
 * activations for backward. Errors: MOH_E_ARG (shape), MOH_E_DEVICE (a launch failed). Kernel
 * faults surface at the next synchronising call (moh_cuda_layer_sync). */
int moh_cuda_layer_forward(moh_cuda_layer *l, const moh_cuda_weights *w, const uint16_t *x, int B, int N,
                           uint16_t *y, void *stream, moh_error *err);
/* Backward of L = sum(y * dy) + lb_scale * lb_loss after forward on the same x (still valid):
 * dy [B, N, C] bf16; dx [B, N, C] fp32 (may be NULL) and g are accumulated (+=): zero them before
 * the first call. MOH_E_ARG without a successful forward before it, MOH_E_DEVICE (a launch). */
int moh_cuda_layer_backward(moh_cuda_layer *l, const moh_cuda_weights *w, const moh_cuda_grads *g,
                            const uint16_t *dy, float lb_scale, float *dx, void *stream, moh_error *err);
/* Device pointer to the gates [B N, h] (fp32) of the last forward (0 for pairs not computed). */
const float *moh_cuda_layer_gates(const moh_cuda_layer *l);
/* Device pointer to the load-balance loss [1] (fp32) of the last forward, written on its stream
 * (no synchronisation); NULL when the config has no learned routing (the loss is 0) or without
 * CUDA. For bindings that keep the loss on the device (python/moh/torch.py). */
const float *moh_cuda_layer_lb_device(const moh_cuda_layer *l);
/* Waits for the layer's work on stream, then reports any CUDA error. MOH_OK or MOH_E_DEVICE. */
int moh_cuda_layer_sync(moh_cuda_layer *l, void *stream, moh_error *err);
/* The load-balance loss of the last forward (spec §2), copied to the host (synchronises). */
int moh_cuda_layer_lb_loss(moh_cuda_layer *l, void *stream, float *lb, moh_error *err);

#endif
