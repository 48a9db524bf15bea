/* ViT classifier: float32 and float64 instantiations of vit_impl.h, the timm tensor-name table
 * and timm's initialisation. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/vit.h"

#include "core/rng.h"

#define real float
#define F(x) x##_f32
#include "vit_impl.h"
#undef real
#undef F

#define real double
#define F(x) x##_f64
#include "vit_impl.h"
#undef real
#undef F


/* kind of initialisation of one tensor (vit_params_init_random) */
enum { INIT_ZERO, INIT_ONE, INIT_TRUNC02, INIT_CLS, INIT_CONV };

#define SHAPE(...) ((const int64_t[]){__VA_ARGS__})

/* Builds the table; init (may be NULL) receives the INIT_* kind of every tensor. */
static vit_tensor *build(const moh_vit_config *cfg, int *n, unsigned char **init_out) {
    const moh_attn_config *a = &cfg->attn;
    const int Ln = cfg->depth;
    const int64_t D = cfg->embed_dim, Hm = cfg->mlp_hidden, K = cfg->num_classes, p = cfg->patch_size;
    const int cap = Ln * 16 + 8;
    model_tensor_list L;
    if (model_tensor_list_init(&L, cap)) return NULL;
    if (cfg->class_token) model_tensor_push(&L, false, INIT_CLS, 3, SHAPE(1, 1, D), "cls_token", 0);
    model_tensor_push(&L, false, INIT_TRUNC02, 3, SHAPE(1, cfg->num_tokens, D), "pos_embed", 0);
    model_tensor_push(&L, true, INIT_CONV, 4, SHAPE(D, cfg->in_chans, p, p), "patch_embed.proj.weight", 0);
    model_tensor_push(&L, false, INIT_CONV, 1, SHAPE(D), "patch_embed.proj.bias", 0);
    for (int l = 0; l < Ln; l++) {
        model_tensor_push(&L, false, INIT_ONE, 1, SHAPE(D), "blocks.%d.norm1.weight", l);
        model_tensor_push(&L, false, INIT_ZERO, 1, SHAPE(D), "blocks.%d.norm1.bias", l);
        model_tensor_push_timm_attn(&L, a, D, INIT_TRUNC02, INIT_ZERO, l);
        model_tensor_push(&L, false, INIT_ONE, 1, SHAPE(D), "blocks.%d.norm2.weight", l);
        model_tensor_push(&L, false, INIT_ZERO, 1, SHAPE(D), "blocks.%d.norm2.bias", l);
        model_tensor_push_timm_mlp(&L, D, Hm, INIT_TRUNC02, INIT_ZERO, l);
    }
    const bool tok = cfg->global_pool == VIT_POOL_TOKEN;
    model_tensor_push(&L, false, INIT_ONE, 1, SHAPE(D), tok ? "norm.weight" : "fc_norm.weight", 0);
    model_tensor_push(&L, false, INIT_ZERO, 1, SHAPE(D), tok ? "norm.bias" : "fc_norm.bias", 0);
    model_tensor_push(&L, true, INIT_TRUNC02, 2, SHAPE(K, D), "head.weight", 0);
    model_tensor_push(&L, false, INIT_ZERO, 1, SHAPE(K), "head.bias", 0);
    return model_tensor_list_done(&L, n, init_out);
}

vit_tensor *vit_tensors(const moh_vit_config *cfg, int *n) { return build(cfg, n, NULL); }

void vit_params_init_random(const moh_vit_config *cfg, vit_params_f32 *p, uint64_t seed) {
    const model_init laws[] = {[INIT_ZERO] = {MODEL_INIT_ZERO, 0}, [INIT_ONE] = {MODEL_INIT_ONE, 0},
                               [INIT_TRUNC02] = {MODEL_INIT_TRUNC_NORMAL, 0.02}, [INIT_CLS] = {MODEL_INIT_NORMAL, 1e-6},
                               [INIT_CONV] = {MODEL_INIT_UNIFORM, 1.0 / sqrt((double)cfg->patch_dim)}};
    int nt = 0;
    unsigned char *kind = NULL;
    vit_tensor *ts = build(cfg, &nt, &kind);
    model_init_random(ts, kind, nt, laws, p->data, seed ^ 0x766974ULL /* "vit" */);
    free(ts);
    free(kind);
}
