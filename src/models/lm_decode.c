#include "models/lm_decode.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int lm_kv_init(lm_kv_cache *kv, const moh_lm_config *cfg, int max_T, moh_error *err) {
    memset(kv, 0, sizeof *kv);
    const moh_attn_config *a = &cfg->attn;
    const size_t L = (size_t)cfg->num_hidden_layers, C = (size_t)cfg->hidden_size;
    const size_t kvd = (size_t)a->n_kv_heads * a->head_dim, hd = (size_t)a->n_heads * a->head_dim;
    const size_t I = (size_t)cfg->intermediate_size, qd = (size_t)attn_qkv_dim(a);
    const size_t sizes[] = {L * max_T * kvd, L * max_T * kvd, C, C, qd, hd, C, I, I, (size_t)max_T};
    float **fields[] = {&kv->k, &kv->v, &kv->x, &kv->xn, &kv->qkv, &kv->og, &kv->tmp, &kv->gate, &kv->up, &kv->scores};
    size_t total = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) total += sizes[i];
    kv->block = malloc(total * sizeof(float));
    if (!kv->block) return moh_fail(err, MOH_E_NOMEM, "KV cache: cannot allocate %zu MiB", (total * 4) >> 20);
    float *cur = kv->block;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        *fields[i] = cur;
        cur += sizes[i];
    }
    if (attn_cache_init_f32(&kv->router, a, 1, 1, err)) {
        free(kv->block);
        kv->block = NULL;
        return err->code;
    }
    kv->max_T = max_T;
    return MOH_OK;
}

void lm_kv_free(lm_kv_cache *kv) {
    if (kv->block) attn_cache_free_f32(&kv->router);
    free(kv->block);
    memset(kv, 0, sizeof *kv);
}

void lm_kv_reset(lm_kv_cache *kv) { kv->pos = 0; }

int lm_decode_step(const moh_lm_config *cfg, const lm_params_f32 *p, lm_kv_cache *kv, int token,
                   float *logits, moh_error *err) {
    const moh_attn_config *a = &cfg->attn;
    const int L = cfg->num_hidden_layers, C = cfg->hidden_size, I = cfg->intermediate_size;
    const int h = a->n_heads, hkv = a->n_kv_heads, d = a->head_dim, grp = h / hkv;
    const int qd = attn_qkv_dim(a), kvd = hkv * d, pos = kv->pos;
    const float eps = (float)cfg->rms_norm_eps, scale = (float)(1.0 / sqrt((double)d));
    if (pos >= kv->max_T)
        return moh_fail(err, MOH_E_ARG, "KV cache full: %d tokens (raise the context)", kv->max_T);
    if (token < 0 || token >= cfg->vocab_size)
        return moh_fail(err, MOH_E_ARG, "token %d out of range [0, %d)", token, cfg->vocab_size);
    embedding_forward_f32(kv->x, &token, p->embed, 1, C);
    float rstd;
    for (int l = 0; l < L; l++) {
        const lm_block_f32 *b = &p->blocks[l];
        float *K = kv->k + ((size_t)l * kv->max_T) * kvd, *V = kv->v + ((size_t)l * kv->max_T) * kvd;
        rmsnorm_forward_f32(kv->xn, &rstd, kv->x, b->ln1, 1, C, eps);
        linear_forward_f32(kv->qkv, kv->xn, b->attn.w_qkv, b->attn.b_qkv, 1, C, qd);
        router_forward_f32(a, &b->attn, kv->xn, kv->qkv, 1, &kv->router);
        if (a->rope_theta > 0) rope_forward_f32(kv->qkv, 1, qd, h + hkv, d, &pos, a->rope_theta);
        memcpy(K + (size_t)pos * kvd, kv->qkv + (size_t)h * d, sizeof(float) * kvd);
        memcpy(V + (size_t)pos * kvd, kv->qkv + (size_t)(h + hkv) * d, sizeof(float) * kvd);
        for (int i = 0; i < h; i++) {
            const float g = kv->router.gates[i];
            float *og = kv->og + (size_t)i * d;
            kv->heads_total++;
            if (g == 0.0f) { /* head not selected: no attention row, no W_O term */
                memset(og, 0, sizeof(float) * d);
                continue;
            }
            kv->heads_run++;
            const float *q = kv->qkv + (size_t)i * d;
            const int kvh = i / grp;
            float mx = -INFINITY;
            for (int j = 0; j <= pos; j++) {
                const float *kj = K + (size_t)j * kvd + (size_t)kvh * d;
                float s = 0.0f;
                for (int e = 0; e < d; e++) s += q[e] * kj[e];
                kv->scores[j] = s * scale;
                mx = kv->scores[j] > mx ? kv->scores[j] : mx;
            }
            float sum = 0.0f;
            for (int j = 0; j <= pos; j++) {
                kv->scores[j] = expf(kv->scores[j] - mx);
                sum += kv->scores[j];
            }
            memset(og, 0, sizeof(float) * d);
            for (int j = 0; j <= pos; j++) {
                const float w = g * kv->scores[j] / sum;
                const float *vj = V + (size_t)j * kvd + (size_t)kvh * d;
                for (int e = 0; e < d; e++) og[e] += w * vj[e];
            }
        }
        linear_forward_f32(kv->tmp, kv->og, b->attn.w_o, b->attn.b_o, 1, h * d, C);
        for (int c = 0; c < C; c++) kv->x[c] += kv->tmp[c];
        rmsnorm_forward_f32(kv->xn, &rstd, kv->x, b->ln2, 1, C, eps);
        linear_forward_f32(kv->gate, kv->xn, b->w_gate, NULL, 1, C, I);
        linear_forward_f32(kv->up, kv->xn, b->w_up, NULL, 1, C, I);
        swiglu_forward_f32(kv->gate, kv->gate, kv->up, I);
        linear_forward_f32(kv->tmp, kv->gate, b->w_down, NULL, 1, I, C);
        for (int c = 0; c < C; c++) kv->x[c] += kv->tmp[c];
    }
    rmsnorm_forward_f32(kv->xn, &rstd, kv->x, p->norm, 1, C, eps);
    linear_forward_f32(logits, kv->xn, p->lm_head, NULL, 1, C, cfg->vocab_size);
    kv->pos++;
    return MOH_OK;
}
