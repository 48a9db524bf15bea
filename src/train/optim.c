#include "train/optim.h"

#include <omp.h>
#include <stdlib.h>


int optim_init(optim *o, const model *m, int kind, bool bf16, const moh_backend *be, moh_error *err) {
    *o = (optim){.kind = kind, .n = m->n, .be = be ? be : backend_get(MOH_DEVICE_CPU)};
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
    o->cx = calloc((size_t)o->nctx, sizeof *o->cx);
    if (!o->work || !o->cx) return moh_fail(err, MOH_E_NOMEM, "Muon: out of memory");
    static const bf16_mirror no_weights = {0}; /* bf16 products, every operand rounded on the fly */
    for (int t = 0; t < o->nctx; t++) {
        be_ctx_init(&o->cx[t], o->be);
        const int rc = bf16 ? be_ctx_set_weights(&o->cx[t], &no_weights, err) : MOH_OK;
        if (rc) return rc;
    }
    return MOH_OK;
}

void optim_free(optim *o) {
    free(o->ts);
    free(o->decay);
    free(o->work);
    for (int t = 0; o->cx && t < o->nctx; t++) be_ctx_release(&o->cx[t]);
    free(o->cx);
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
            o->be->muon_update(&o->cx[th], mc, w + k, g + k, m1 + k, (int)e->shape[0], (int)e->shape[1], muon_lr,
                               o->work + (size_t)th * o->work_floats);
    }
}
