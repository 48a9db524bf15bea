/* One MoH attention layer: router and reference path, float32 and float64 instantiations.
 * Notation as in moh.h: T = B*N tokens, E = h - h_s routed heads, QKVD = (h + 2 h_kv) d. */
#ifndef MOH_ATTN_H
#define MOH_ATTN_H
#include "moh.h"
#include "ops/ops.h"

/* Number of routed heads E, 0 for the "none" router. */
int attn_routed_heads(const moh_attn_config *c);
/* Which router tensors exist for this config (spec §1, §10). */
bool attn_has_wg(const moh_attn_config *c);
bool attn_has_wg0(const moh_attn_config *c);
bool attn_has_wg1(const moh_attn_config *c);
/* max(E, h_s, 2): width of the router's scratch rows. */
int attn_router_width(const moh_attn_config *c);
/* Row width of the fused projection output, (h + 2 h_kv) d. */
int attn_qkv_dim(const moh_attn_config *c);
/* The router's config-file name: "none", "learned" or "query_norm" ("none" for any other value). */
const char *attn_router_name(moh_router r);
/* The rope_scaling type's config-file name: "default", "linear" or "llama3" (NULL for any other). */
const char *attn_rope_type_name(moh_rope_type t);

/* A named float32 tensor of a layer, as it appears in a checkpoint (spec §10 names). */
#define ATTN_MAX_TENSORS 16
typedef struct attn_tensor {
    char name[160];
    int ndim;
    int64_t shape[2];
    float *data; /* view into the layer's parameter (or gradient) buffer */
} attn_tensor;

#define real float
#define F(x) x##_f32
#include "attn_decl.h"
#undef real
#undef F

#define real double
#define F(x) x##_f64
#include "attn_decl.h"
#undef real
#undef F

/* The checkpoint tensors of one layer, named prefix + official name (fused: qkv.weight,
 * qkv.bias, proj.weight, proj.bias; split: q_proj/k_proj/v_proj/o_proj .weight/.bias; router:
 * wg.weight, wg_0.weight, wg_1.weight), each a view into p. Split q/k/v are consecutive row
 * blocks of w_qkv. Returns the count (<= ATTN_MAX_TENSORS). */
int attn_tensors_f32(const moh_attn_config *cfg, const attn_params_f32 *p, const char *prefix,
                     attn_tensor *out);

/* Loads a layer's weights from the safetensors file at path (no name prefix). Sets
 * cfg->fused_qkv from the names found (qkv.weight or q_proj.weight), allocates *buf (caller
 * frees) and binds p into it. Missing, misshapen or unexpected tensors: MOH_E_SHAPE naming the
 * tensor; unreadable or malformed file: MOH_E_IO / MOH_E_FORMAT. */
int attn_weights_load_f32(moh_attn_config *cfg, const char *path, float **buf,
                          attn_params_f32 *p, moh_error *err);

#endif
