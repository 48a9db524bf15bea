/* MoH attention layer, reference path: float32 and float64 instantiations of
 * attention_impl.h, plus the config helpers shared by both. */
#include <float.h>
#include <stdio.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attn/attn.h"
#include "ops/bf16.h"

int attn_routed_heads(const moh_attn_config *c) {
    return c->router == MOH_ROUTER_NONE ? 0 : c->n_heads - c->shared_heads;
}
bool attn_has_wg(const moh_attn_config *c) {
    return c->router == MOH_ROUTER_LEARNED && c->top_k >= 1;
}
bool attn_has_wg0(const moh_attn_config *c) { return attn_has_wg(c) && c->shared_heads >= 1; }
bool attn_has_wg1(const moh_attn_config *c) {
    return c->router == MOH_ROUTER_LEARNED && c->shared_heads >= 2;
}
int attn_qkv_dim(const moh_attn_config *c) { return (c->n_heads + 2 * c->n_kv_heads) * c->head_dim; }
int attn_router_width(const moh_attn_config *c) {
    int w = attn_routed_heads(c);
    if (c->shared_heads > w) w = c->shared_heads;
    return w > 2 ? w : 2;
}

#define real float
#define F(x) x##_f32
#include "attention_impl.h"
#undef real
#undef F

#define real double
#define F(x) x##_f64
#include "attention_impl.h"
#undef real
#undef F

static void add_tensor(attn_tensor *out, int *n, const char *prefix, const char *name, float *data,
                       int64_t rows, int64_t cols) {
    if (!data) return;
    attn_tensor *t = &out[(*n)++];
    snprintf(t->name, sizeof t->name, "%s%s", prefix, name);
    t->ndim = cols > 0 ? 2 : 1;
    t->shape[0] = rows;
    t->shape[1] = cols > 0 ? cols : 0;
    t->data = data;
}

int attn_tensors_f32(const moh_attn_config *cfg, const attn_params_f32 *p, const char *prefix,
                     attn_tensor *out) {
    const int64_t C = cfg->hidden_size, d = cfg->head_dim, hd = (int64_t)cfg->n_heads * d;
    const int64_t kvd = (int64_t)cfg->n_kv_heads * d, qd = hd + 2 * kvd;
    int n = 0;
    if (cfg->fused_qkv) {
        add_tensor(out, &n, prefix, "qkv.weight", p->w_qkv, qd, C);
        add_tensor(out, &n, prefix, "qkv.bias", p->b_qkv, qd, 0);
        add_tensor(out, &n, prefix, "proj.weight", p->w_o, C, hd);
        add_tensor(out, &n, prefix, "proj.bias", p->b_o, C, 0);
    } else {
        add_tensor(out, &n, prefix, "q_proj.weight", p->w_qkv, hd, C);
        add_tensor(out, &n, prefix, "k_proj.weight", p->w_qkv + hd * C, kvd, C);
        add_tensor(out, &n, prefix, "v_proj.weight", p->w_qkv + (hd + kvd) * C, kvd, C);
        if (p->b_qkv) {
            add_tensor(out, &n, prefix, "q_proj.bias", p->b_qkv, hd, 0);
            add_tensor(out, &n, prefix, "k_proj.bias", p->b_qkv + hd, kvd, 0);
            add_tensor(out, &n, prefix, "v_proj.bias", p->b_qkv + hd + kvd, kvd, 0);
        }
        add_tensor(out, &n, prefix, "o_proj.weight", p->w_o, C, hd);
        add_tensor(out, &n, prefix, "o_proj.bias", p->b_o, C, 0);
    }
    add_tensor(out, &n, prefix, "wg.weight", p->w_r, attn_routed_heads(cfg), C);
    add_tensor(out, &n, prefix, "wg_0.weight", p->w_h, 2, C);
    add_tensor(out, &n, prefix, "wg_1.weight", p->w_s, cfg->shared_heads, C);
    return n;
}
