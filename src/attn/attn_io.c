/* Loading one layer's weights from a safetensors file under the official names (spec §10). */
#include <stdlib.h>
#include <string.h>

#include "attn/attn.h"

/* Loads the layer weights; sets cfg->fused_qkv from the names; rejects missing/extra tensors. */
int attn_weights_load_f32(moh_attn_config *cfg, const char *path, float **buf_out,
                          attn_params_f32 *p, moh_error *err) {
    moh_safetensors st;
    if (moh_st_open(&st, path, err)) return err->code;
    const bool fused = moh_st_find(&st, "qkv.weight") != NULL;
    const bool split = moh_st_find(&st, "q_proj.weight") != NULL;
    int rc = MOH_OK;
    float *buf = NULL;
    if (fused == split) {
        rc = moh_fail(err, MOH_E_SHAPE, "%s: %s", path,
                      fused ? "holds both 'qkv.weight' and 'q_proj.weight': use one projection style"
                            : "missing tensor 'qkv.weight' (fused) or 'q_proj.weight' (split)");
        goto out;
    }
    cfg->fused_qkv = fused;
    const size_t n = attn_params_bind_f32(p, NULL, cfg);
    buf = malloc(sizeof(float) * (n ? n : 1));
    if (!buf) {
        rc = moh_fail(err, MOH_E_NOMEM, "%s: out of memory for %zu weights", path, n);
        goto out;
    }
    attn_params_bind_f32(p, buf, cfg);
    attn_tensor ts[ATTN_MAX_TENSORS];
    const int nt = attn_tensors_f32(cfg, p, "", ts);
    for (int i = 0; i < nt && rc == MOH_OK; i++)
        rc = moh_st_read_f32(&st, ts[i].name, ts[i].ndim, ts[i].shape, ts[i].data, err);
    for (int i = 0; i < st.n_tensors && rc == MOH_OK; i++) {
        bool known = false;
        for (int j = 0; j < nt; j++) known |= !strcmp(st.tensors[i].name, ts[j].name);
        char shown[200];
        if (!known)
            rc = moh_fail(err, MOH_E_SHAPE,
                          "%s: unexpected tensor '%s' for this config (router, shared_heads, top_k, "
                          "qkv_bias, proj_bias decide which tensors exist)",
                          path, moh_st_quote(shown, sizeof shown, st.tensors[i].name));
    }
out:
    moh_st_close(&st);
    if (rc) {
        free(buf);
        buf = NULL;
    }
    *buf_out = buf;
    return rc;
}

