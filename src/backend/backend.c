/* The backend registry, --device resolution and the be_ctx helpers (backend.h). */
#include "backend/backend.h"

#include <stdio.h>
#include <string.h>

#include "backend/backends.h"
#include "ops/gemm.h"

static const moh_backend *const BACKENDS[] = {&backend_cpu, &backend_cuda};
enum { N_BACKENDS = (int)(sizeof BACKENDS / sizeof BACKENDS[0]) };

const moh_backend *const *backend_list(int *n) {
    *n = N_BACKENDS;
    return BACKENDS;
}

const moh_backend *backend_get(moh_device d) {
    for (int i = 0; i < N_BACKENDS; i++)
        if (BACKENDS[i]->device == d) return BACKENDS[i];
    return NULL;
}

int backend_parse_device(const char *s, moh_device *d, moh_error *err) {
    if (!s || !strcmp(s, "auto")) {
        *d = MOH_DEVICE_AUTO;
        return MOH_OK;
    }
    for (int i = 0; i < N_BACKENDS; i++)
        if (!strcmp(s, BACKENDS[i]->name)) {
            *d = BACKENDS[i]->device;
            return MOH_OK;
        }
    return moh_fail(err, MOH_E_ARG, "--device '%.40s', expected auto, cpu or cuda", s);
}

int backend_resolve(moh_device asked, const char *model_type, const moh_backend **out, char *note, size_t cap,
                    moh_error *err) {
    if (note && cap) note[0] = '\0';
    char why[200] = "";
    if (asked != MOH_DEVICE_AUTO) {
        const moh_backend *be = backend_get(asked);
        if (!be) return moh_fail(err, MOH_E_ARG, "--device: unknown device %d", (int)asked);
        if (!be->available(why, sizeof why) || !be->runs_family(model_type, why, sizeof why))
            return moh_fail(err, MOH_E_DEVICE, "--device %s: %s", be->name, why);
        *out = be;
        return MOH_OK;
    }
    /* auto: the first backend after the CPU that can run the family, else the CPU */
    for (int i = 0; i < N_BACKENDS; i++) {
        const moh_backend *be = BACKENDS[i];
        if (be == &backend_cpu) continue;
        if (be->available(why, sizeof why) && be->runs_family(model_type, why, sizeof why)) {
            *out = be;
            return MOH_OK;
        }
        if (note && cap) snprintf(note, cap, "auto: %s", why);
    }
    *out = &backend_cpu;
    return MOH_OK;
}

void be_ctx_init(be_ctx *cx, const moh_backend *be) {
    memset(cx, 0, sizeof *cx);
    cx->be = be ? be : &backend_cpu;
    cx->precision = MOH_PRECISION_FP32;
}

void be_ctx_release(be_ctx *cx) {
    if (cx->be && cx->be->ctx_release) cx->be->ctx_release(cx);
}

int be_ctx_set_weights(be_ctx *cx, const bf16_mirror *w, moh_error *err) {
    if (!cx->be->ctx_set_weights)
        return w ? moh_fail(err, MOH_E_DEVICE, "%s: no bf16 compute", cx->be->name) : MOH_OK;
    return cx->be->ctx_set_weights(cx, w, err);
}

void be_linear_backward_f64(const be_ctx *cx, double *dinp, double beta, double *dw, double *db,
                            const double *dout, const double *inp, const double *w, int M, int I, int O) {
    (void)cx;
    if (beta == 1.0 || !dinp) {
        linear_backward_f64(dinp, dw, db, dout, inp, w, M, I, O);
        return;
    }
    gemm_f64(false, false, M, I, O, 1.0, dout, O, w, I, beta, dinp, I);
    linear_backward_f64(NULL, dw, db, dout, inp, w, M, I, O);
}
