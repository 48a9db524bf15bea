/* The CUDA backend's entry points in a build without CUDA (MOH_CUDA=OFF or no nvcc): each fails
 * with one line, so that `--device cuda` says why instead of failing to link. */
#include <stdio.h>

#include "cuda/host.h"

#define NO_CUDA "moh was built without CUDA (configure with nvcc on the PATH, or -DMOH_CUDA=ON)"

bool cu_built(void) { return false; }
bool moh_cuda_available(char *why, size_t cap) {
    if (why && cap) snprintf(why, cap, "%s", NO_CUDA);
    return false;
}
int moh_cuda_describe(char *out, size_t cap, moh_error *err) {
    if (out && cap) out[0] = 0;
    return moh_fail(err, MOH_E_DEVICE, NO_CUDA);
}
int moh_cuda_router_rows(const moh_attn_config *cfg) {
    (void)cfg;
    return 0;
}
int moh_cuda_layer_new(moh_cuda_layer **out, const moh_attn_config *cfg, int max_B, int max_N, moh_error *err) {
    *out = NULL;
    return moh_fail(err, MOH_E_DEVICE, NO_CUDA);
}
void moh_cuda_layer_free(moh_cuda_layer *l) { (void)l; }
size_t moh_cuda_layer_bytes(const moh_cuda_layer *l) { return 0; }
int moh_cuda_layer_forward(moh_cuda_layer *l, const moh_cuda_weights *w, const uint16_t *x, int B, int N,
                           uint16_t *y, void *stream, moh_error *err) {
    return moh_fail(err, MOH_E_DEVICE, NO_CUDA);
}
int moh_cuda_layer_backward(moh_cuda_layer *l, const moh_cuda_weights *w, const moh_cuda_grads *g,
                            const uint16_t *dy, float lb_scale, float *dx, void *stream, moh_error *err) {
    return moh_fail(err, MOH_E_DEVICE, NO_CUDA);
}
const float *moh_cuda_layer_gates(const moh_cuda_layer *l) { return NULL; }
int moh_cuda_layer_sync(moh_cuda_layer *l, void *stream, moh_error *err) { return moh_fail(err, MOH_E_DEVICE, NO_CUDA); }
const float *moh_cuda_layer_lb_device(const moh_cuda_layer *l) {
    (void)l;
    return NULL;
}

int moh_cuda_layer_lb_loss(moh_cuda_layer *l, void *stream, float *lb, moh_error *err) {
    return moh_fail(err, MOH_E_DEVICE, NO_CUDA);
}

int cu_dev_alloc(void **p, size_t bytes, moh_error *err) {
    *p = NULL;
    return moh_fail(err, MOH_E_DEVICE, NO_CUDA);
}
void cu_dev_free(void *p) { (void)p; }
int cu_copy_to_dev(void *dst, const void *src, size_t bytes, moh_error *err) { return moh_fail(err, MOH_E_DEVICE, NO_CUDA); }
int cu_copy_to_host(void *dst, const void *src, size_t bytes, moh_error *err) { return moh_fail(err, MOH_E_DEVICE, NO_CUDA); }
int cu_dev_memset(void *p, int byte, size_t bytes, moh_error *err) { return moh_fail(err, MOH_E_DEVICE, NO_CUDA); }
int cu_dev_sync(moh_error *err) { return moh_fail(err, MOH_E_DEVICE, NO_CUDA); }
int cu_timer_new(cu_timer **t, moh_error *err) {
    *t = NULL;
    return moh_fail(err, MOH_E_DEVICE, NO_CUDA);
}
void cu_timer_free(cu_timer *t) { (void)t; }
int cu_timer_start(cu_timer *t, moh_error *err) { return moh_fail(err, MOH_E_DEVICE, NO_CUDA); }
int cu_timer_stop(cu_timer *t, double *ms, moh_error *err) { return moh_fail(err, MOH_E_DEVICE, NO_CUDA); }
void cu_layer_set_poison(moh_cuda_layer *l, bool on) { (void)l; (void)on; }
int cu_layer_core_forward(moh_cuda_layer *l, void *stream, moh_error *err) { return moh_fail(err, MOH_E_DEVICE, NO_CUDA); }
int cu_layer_core_backward(moh_cuda_layer *l, void *stream, moh_error *err) { return moh_fail(err, MOH_E_DEVICE, NO_CUDA); }
int cu_weights_upload(const moh_attn_config *cfg, const struct attn_params_f32 *p, void **buf,
                      moh_cuda_weights *w, moh_error *err) {
    *buf = NULL;
    return moh_fail(err, MOH_E_DEVICE, NO_CUDA);
}
int cu_grads_alloc(const moh_attn_config *cfg, void **buf, moh_cuda_grads *g, moh_error *err) {
    *buf = NULL;
    return moh_fail(err, MOH_E_DEVICE, NO_CUDA);
}
int cu_grads_download(const moh_attn_config *cfg, const moh_cuda_grads *g, const struct attn_params_f32 *out,
                      moh_error *err) {
    return moh_fail(err, MOH_E_DEVICE, NO_CUDA);
}
const char *cu_phase_name(int ph) { return "?"; }
int cu_layer_set_forward_kernel(moh_cuda_layer *l, int kind, moh_error *err) { return moh_fail(err, MOH_E_DEVICE, NO_CUDA); }
const char *cu_layer_forward_kernel(const moh_cuda_layer *l) { return "none"; }
int cu_layer_profile(moh_cuda_layer *l, bool on, moh_error *err) { return moh_fail(err, MOH_E_DEVICE, NO_CUDA); }
long cu_layer_phase_ms(moh_cuda_layer *l, double *ms, bool reset) { return 0; }
int cu_layer_segments(const moh_cuda_layer *l, int *cnt, int *pos, moh_error *err) { return moh_fail(err, MOH_E_DEVICE, NO_CUDA); }
void cu_layer_shape(const moh_cuda_layer *l, int *B, int *N) {
    *B = 0;
    *N = 0;
}
