/* MoH-DiT: float32 and float64 instantiations of dit_impl.h, the official tensor-name table, the
 * official initialisation and the 2-D sin-cos position table. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/dit.h"

#include "core/rng.h"

#define real float
#define F(x) x##_f32
#include "dit_impl.h"
#undef real
#undef F

#define real double
#define F(x) x##_f64
#include "dit_impl.h"
#undef real
#undef F


int dit_active_head_layers(const moh_dit_config *cfg) {
    int n = 0;
    for (int l = 0; l < cfg->depth; l++) {
        const moh_attn_config *a = &cfg->attn[l];
        n += a->router == MOH_ROUTER_NONE || a->top_k == 0 ? a->n_heads : a->shared_heads + a->top_k;
    }
    return n;
}

void dit_pos_embed(const moh_dit_config *cfg, float *out) {
    const int D = cfg->hidden_size, G = cfg->grid, q = D / 4;
    for (int gy = 0; gy < G; gy++)
        for (int gx = 0; gx < G; gx++) {
            float *row = out + ((size_t)gy * G + gx) * D;
            /* emb_h of MAE's code reads grid[0] = the column index (meshgrid(w, h)), emb_w the row */
            const double pos[2] = {gx, gy};
            for (int half = 0; half < 2; half++)
                for (int i = 0; i < q; i++) {
                    const double omega = 1.0 / pow(10000.0, (double)i / (D / 4.0)), v = pos[half] * omega;
                    row[half * 2 * q + i] = (float)sin(v);
                    row[half * 2 * q + q + i] = (float)cos(v);
                }
        }
}

/* kind of initialisation of one tensor (dit_params_init_random) */
enum { INIT_ZERO, INIT_XAVIER, INIT_N002, INIT_POS };

#define SHAPE(...) ((const int64_t[]){__VA_ARGS__})

static model_tensor *build(const moh_dit_config *cfg, int *n, unsigned char **init_out) {
    const int Ln = cfg->depth;
    const int64_t D = cfg->hidden_size, Hm = cfg->mlp_hidden, P = cfg->patch_dim, p = cfg->patch_size;
    const int cap = Ln * 16 + 16;
    model_tensor_list L;
    if (model_tensor_list_init(&L, cap)) return NULL;
    model_tensor_push(&L, false, INIT_POS, 3, SHAPE(1, cfg->num_patches, D), "pos_embed", 0);
    model_tensor_push(&L, true, INIT_XAVIER, 4, SHAPE(D, cfg->in_channels, p, p), "x_embedder.proj.weight", 0);
    model_tensor_push(&L, false, INIT_ZERO, 1, SHAPE(D), "x_embedder.proj.bias", 0);
    model_tensor_push(&L, true, INIT_N002, 2, SHAPE(D, DIT_FREQ_DIM), "t_embedder.mlp.0.weight", 0);
    model_tensor_push(&L, false, INIT_ZERO, 1, SHAPE(D), "t_embedder.mlp.0.bias", 0);
    model_tensor_push(&L, true, INIT_N002, 2, SHAPE(D, D), "t_embedder.mlp.2.weight", 0);
    model_tensor_push(&L, false, INIT_ZERO, 1, SHAPE(D), "t_embedder.mlp.2.bias", 0);
    model_tensor_push(&L, true, INIT_N002, 2, SHAPE(cfg->num_classes + 1, D), "y_embedder.embedding_table.weight", 0);
    for (int l = 0; l < Ln; l++) {
        model_tensor_push_timm_attn(&L, &cfg->attn[l], D, INIT_XAVIER, INIT_ZERO, l);
        model_tensor_push_timm_mlp(&L, D, Hm, INIT_XAVIER, INIT_ZERO, l);
        model_tensor_push(&L, true, INIT_ZERO, 2, SHAPE(6 * D, D), "blocks.%d.adaLN_modulation.1.weight", l);
        model_tensor_push(&L, false, INIT_ZERO, 1, SHAPE(6 * D), "blocks.%d.adaLN_modulation.1.bias", l);
    }
    model_tensor_push(&L, true, INIT_ZERO, 2, SHAPE(P, D), "final_layer.linear.weight", 0);
    model_tensor_push(&L, false, INIT_ZERO, 1, SHAPE(P), "final_layer.linear.bias", 0);
    model_tensor_push(&L, true, INIT_ZERO, 2, SHAPE(2 * D, D), "final_layer.adaLN_modulation.1.weight", 0);
    model_tensor_push(&L, false, INIT_ZERO, 1, SHAPE(2 * D), "final_layer.adaLN_modulation.1.bias", 0);
    return model_tensor_list_done(&L, n, init_out);
}

model_tensor *dit_tensors(const moh_dit_config *cfg, int *n) { return build(cfg, n, NULL); }

void dit_params_init_random(const moh_dit_config *cfg, dit_params_f32 *p, uint64_t seed) {
    static const model_init laws[] = {[INIT_ZERO] = {MODEL_INIT_ZERO, 0}, [INIT_XAVIER] = {MODEL_INIT_XAVIER, 0},
                                      [INIT_N002] = {MODEL_INIT_NORMAL, 0.02}, [INIT_POS] = {MODEL_INIT_FAMILY, 0}};
    int nt = 0;
    unsigned char *kind = NULL;
    model_tensor *ts = build(cfg, &nt, &kind);
    model_init_random(ts, kind, nt, laws, p->data, seed ^ 0x646974ULL /* "dit" */);
    for (int i = 0; ts && i < nt; i++)
        if (kind[i] == INIT_POS) dit_pos_embed(cfg, p->data + ts[i].offset);
    free(ts);
    free(kind);
}
