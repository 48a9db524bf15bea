/* host.h on the CUDA runtime: device memory, copies, timers, segment download. */
#include <stdlib.h>

#include <cuda_runtime_api.h>

#include "layer.h"

bool cu_built(void) { return true; }

int cu_dev_alloc(void **p, size_t bytes, moh_error *err) {
    *p = NULL;
    const cudaError_t e = cudaMalloc(p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        *p = NULL;
        return moh_fail(err, e == cudaErrorMemoryAllocation ? MOH_E_NOMEM : MOH_E_DEVICE,
                        "cudaMalloc of %.1f MiB failed: %s", (double)bytes / 1048576.0, cudaGetErrorString(e));
    }
    return MOH_OK;
}
void cu_dev_free(void *p) {
    if (p) cudaFree(p);
}
int cu_copy_to_dev(void *dst, const void *src, size_t bytes, moh_error *err) {
    CU_TRY(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy (to the device)");
    return MOH_OK;
}
int cu_copy_to_host(void *dst, const void *src, size_t bytes, moh_error *err) {
    CU_TRY(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy (to the host)");
    return MOH_OK;
}
int cu_dev_memset(void *p, int byte, size_t bytes, moh_error *err) {
    CU_TRY(cudaMemset(p, byte, bytes), "cudaMemset");
    return MOH_OK;
}
int cu_dev_sync(moh_error *err) {
    CU_TRY(cudaDeviceSynchronize(), "kernel (at cudaDeviceSynchronize)");
    return MOH_OK;
}

struct cu_timer {
    cudaEvent_t a, b;
};
int cu_timer_new(cu_timer **t, moh_error *err) {
    *t = calloc(1, sizeof **t);
    if (!*t) return moh_fail(err, MOH_E_NOMEM, "out of host memory");
    cudaError_t e = cudaEventCreate(&(*t)->a);
    if (e == cudaSuccess) {
        e = cudaEventCreate(&(*t)->b);
        if (e != cudaSuccess) cudaEventDestroy((*t)->a);
    }
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        free(*t);
        *t = NULL;
        return moh_fail(err, MOH_E_DEVICE, "cudaEventCreate: %s", cudaGetErrorString(e));
    }
    return MOH_OK;
}
void cu_timer_free(cu_timer *t) {
    if (!t) return;
    cudaEventDestroy(t->a);
    cudaEventDestroy(t->b);
    free(t);
}
int cu_timer_start(cu_timer *t, moh_error *err) {
    CU_TRY(cudaEventRecord(t->a, 0), "cudaEventRecord");
    return MOH_OK;
}
int cu_timer_stop(cu_timer *t, double *ms, moh_error *err) {
    CU_TRY(cudaEventRecord(t->b, 0), "cudaEventRecord");
    CU_TRY(cudaEventSynchronize(t->b), "kernel (at cudaEventSynchronize)");
    float f = 0.f;
    CU_TRY(cudaEventElapsedTime(&f, t->a, t->b), "cudaEventElapsedTime");
    *ms = f;
    return MOH_OK;
}

int cu_layer_segments(const moh_cuda_layer *l, int *cnt, int *pos, moh_error *err) {
    const size_t S = (size_t)l->B * l->cfg.n_heads;
    CU_TRY(cudaMemcpy(cnt, l->cnt, S * sizeof(int), cudaMemcpyDeviceToHost), "cudaMemcpy");
    if (pos) CU_TRY(cudaMemcpy(pos, l->pos, S * l->N * sizeof(int), cudaMemcpyDeviceToHost), "cudaMemcpy");
    return MOH_OK;
}
void cu_layer_shape(const moh_cuda_layer *l, int *B, int *N) {
    *B = l->B;
    *N = l->N;
}
