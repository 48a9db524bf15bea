#include "train/optim.h"

#include <omp.h>
#include <stdlib.h>

#include "backend/backend.h"

int optim_init(optim *o, const model *m, int kind, bool bf16, moh_error *err) {
    *o = (optim){.kind = kind, .n = m->n, .be = backend_get(MOH_DEVICE_CPU)};
    o->ts = model_tensors(m, &o->nt);
    o->decay = calloc(m->n, sizeof(bool));
    if (!o->ts || !o->decay) return moh_fail(err, MOH_E_NOMEM, "optimizer: out of memory");
    size_t work = 0;
    int nh = 0;
    for (int i = 0; i < o->nt; i++) {
        const model_tensor *e = &o->ts[i];
        for (size_t j = 0; j < e->numel; j++) o->decay[e->offset + j] = e->decay;
        if (e->hidden && e->ndim == 2) {
            const size_t w = muon_work_floats((int)e->shape[0], (int)e->shape[1]);
            work = w > work ? w : work;
            nh++;
        }
    }
    if (kind != OPTIM_MUON) return MOH_OK;
    if (!work)
        return moh_fail(err, MOH_E_ARG, "--optimizer muon: a %s (model_type \"%s\") marks no hidden weight matrices "
                        "for Muon; expected --optimizer adamw", m->fam->summary, m->fam->model_type);
    const int nth = omp_get_max_threads();
    o->nctx = nth < nh ? nth : nh;
    o->work_floats = work;
    o->work = malloc(sizeof(float) * work * (size_t)o->nctx);
    o->bc = calloc((size_t)o->nctx, sizeof *o->bc);
    if (!o->work || !o->bc) return moh_fail(err, MOH_E_NOMEM, "Muon: out of memory");
    for (int t = 0; bf16 && t < o->nctx; t++) {
        const int rc = bf16_ctx_new(&o->bc[t], NULL, err);
        if (rc) return rc;
    }
    return MOH_OK;
}

void optim_free(optim *o) {
    free(o->ts);
    free(o->decay);
    free(o->work);
    for (int t = 0; o->bc && t < o->nctx; t++) bf16_ctx_free(o->bc[t]);
    free(o->bc);
    *o = (optim){0};
}

void optim_step(const optim *o, const adamw_config *ac, const muon_config *mc, float *w, const float *g,
                float *m1, float *m2, long t, double lr, double muon_lr) {
    if (o->kind != OPTIM_MUON) {
        o->be->adamw_update(ac, w, g, m1, m2, o->decay, o->n, t, lr);
        return;
    }
    for (int i = 0; i < o->nt; i++) {
        const model_tensor *e = &o->ts[i];
        const size_t k = e->offset;
        if (!(e->hidden && e->ndim == 2))
            o->be->adamw_update(ac, w + k, g + k, m1 + k, m2 + k, o->decay + k, e->numel, t, lr);
    }
    /* whole matrices per thread, each with its own scratch and bf16 context (single-threaded GEMMs:
     * these matrices are too small for a GEMM to scale over threads); a matrix's result does not
     * depend on which thread takes it */
#pragma omp parallel for schedule(dynamic, 1) num_threads(o->nctx)
    for (int i = 0; i < o->nt; i++) {
        const model_tensor *e = &o->ts[i];
        const size_t k = e->offset;
        const int th = omp_get_thread_num();
        if (e->hidden && e->ndim == 2)
            muon_step(mc, o->bc[th], w + k, g + k, m1 + k, (int)e->shape[0], (int)e->shape[1], muon_lr,
                      o->work + (size_t)th * o->work_floats);
    }
}
