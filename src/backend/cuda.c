/* The CUDA backend's table. Device memory goes through src/cuda (cudaMalloc and copies; a build
 * without CUDA links src/cuda/stub.c, whose functions fail with "moh was built without CUDA"). The
 * head-sparse attention layer runs on the GPU (src/cuda, `moh layer --device cuda`); the other ops
 * of whole models are issue 27's, so runs_family is false and the ops are not set yet. */
#include <stdio.h>

#include "backend/backends.h"
#include "cuda/host.h"

static bool cuda_available(char *why, size_t cap) { return moh_cuda_available(why, cap); }

static bool cuda_runs_family(const char *model_type, char *why, size_t cap) {
    if (why && cap)
        snprintf(why, cap, "the CUDA backend runs single attention layers (moh layer --device cuda), not yet whole "
                 "%s models", model_type ? model_type : "");
    return false;
}

static int cuda_alloc(void **p, size_t bytes, moh_error *err) { return cu_dev_alloc(p, bytes, err); }
static void cuda_free(void *p) { cu_dev_free(p); }
static int cuda_to_device(void *dst, const void *src, size_t bytes, moh_error *err) {
    return cu_copy_to_dev(dst, src, bytes, err);
}
static int cuda_to_host(void *dst, const void *src, size_t bytes, moh_error *err) {
    return cu_copy_to_host(dst, src, bytes, err);
}
static int cuda_sync(moh_error *err) { return cu_dev_sync(err); }

const moh_backend backend_cuda = {
    .name = "cuda",
    .device = MOH_DEVICE_CUDA,
    .available = cuda_available,
    .runs_family = cuda_runs_family,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .to_device = cuda_to_device,
    .to_host = cuda_to_host,
    .sync = cuda_sync,
};
