/* Decoder LM: float32 and float64 instantiations of lm_impl.h, and the tensor names. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/lm.h"

#include "core/rng.h"

#include "ops/gemm.h"

const char *lm_train_phase_name(int i) {
    static const char *const names[LMT_NPHASE] = {
        "embed", "norm", "attn", "mlp_in", "swiglu", "mlp_down", "head", "loss",
        "bwd_loss", "bwd_head", "bwd_mlp_down", "bwd_swiglu", "bwd_mlp_in", "bwd_norm", "bwd_attn",
        "bwd_embed"};
    return i >= 0 && i < LMT_NPHASE ? names[i] : "?";
}

/* Adds the wall time since t0 to acc[ph]; returns now (the start of the next phase). */
static double lm_lap(double *acc, int ph, double t0) {
    const double now = omp_get_wtime();
    acc[ph] += now - t0;
    return now;
}

#define real float
#define F(x) x##_f32
#include "lm_impl.h"
#undef real
#undef F

#define real double
#define F(x) x##_f64
#include "lm_impl.h"
#undef real
#undef F

int lm_acts_init_sparse_f32(lm_acts_f32 *a, const moh_lm_config *cfg, int B, int T, moh_error *err) {
    return lm_acts_alloc_f32(a, cfg, B, T, true, err);
}

/* decay: 0 none, 1 AdamW weight decay, 2 decay and a hidden matrix (model_tensor.hidden) */
static void push(lm_tensor *t, int *n, size_t *off, int decay, int64_t r, int64_t c, const char *fmt, int layer) {
    lm_tensor *e = &t[(*n)++];
    snprintf(e->name, sizeof e->name, fmt, layer);
    e->ndim = c > 0 ? 2 : 1;
    e->shape[0] = r;
    e->shape[1] = c > 0 ? c : 0;
    e->numel = (size_t)r * (size_t)(c > 0 ? c : 1);
    e->offset = *off;
    e->decay = decay > 0;
    e->hidden = decay == 2;
    *off += e->numel;
}

lm_tensor *lm_tensors_named(const moh_lm_config *cfg, model_naming scheme, int *n) {
    if (scheme != MODEL_NAMES_CHECKPOINT && scheme != MODEL_NAMES_GGUF) return NULL;
    const bool g = scheme == MODEL_NAMES_GGUF;
    const moh_attn_config *a = &cfg->attn;
    const int L = cfg->num_hidden_layers;
    const int64_t C = cfg->hidden_size, I = cfg->intermediate_size, V = cfg->vocab_size;
    const int64_t hd = (int64_t)a->n_heads * a->head_dim, kvd = (int64_t)a->n_kv_heads * a->head_dim;
    lm_tensor *t = calloc((size_t)L * 12 + 3, sizeof *t);
    if (!t) return NULL;
    size_t off = 0;
    *n = 0;
    /* HF LlamaForCausalLM names, or llama.cpp's (LLM_TN; the MoH routers as blk.N.moh_wg*) */
    push(t, n, &off, 1, V, C, g ? "token_embd.weight" : "model.embed_tokens.weight", 0);
    for (int l = 0; l < L; l++) {
        push(t, n, &off, 0, C, 0, g ? "blk.%d.attn_norm.weight" : "model.layers.%d.input_layernorm.weight", l);
        push(t, n, &off, 2, hd, C, g ? "blk.%d.attn_q.weight" : "model.layers.%d.self_attn.q_proj.weight", l);
        push(t, n, &off, 2, kvd, C, g ? "blk.%d.attn_k.weight" : "model.layers.%d.self_attn.k_proj.weight", l);
        push(t, n, &off, 2, kvd, C, g ? "blk.%d.attn_v.weight" : "model.layers.%d.self_attn.v_proj.weight", l);
        push(t, n, &off, 2, C, hd, g ? "blk.%d.attn_output.weight" : "model.layers.%d.self_attn.o_proj.weight", l);
        if (attn_has_wg(a))
            push(t, n, &off, 1, attn_routed_heads(a), C, g ? "blk.%d.moh_wg.weight" : "model.layers.%d.self_attn.wg.weight", l);
        if (attn_has_wg0(a))
            push(t, n, &off, 1, 2, C, g ? "blk.%d.moh_wg_0.weight" : "model.layers.%d.self_attn.wg_0.weight", l);
        if (attn_has_wg1(a))
            push(t, n, &off, 1, a->shared_heads, C, g ? "blk.%d.moh_wg_1.weight" : "model.layers.%d.self_attn.wg_1.weight", l);
        push(t, n, &off, 0, C, 0, g ? "blk.%d.ffn_norm.weight" : "model.layers.%d.post_attention_layernorm.weight", l);
        push(t, n, &off, 2, I, C, g ? "blk.%d.ffn_gate.weight" : "model.layers.%d.mlp.gate_proj.weight", l);
        push(t, n, &off, 2, I, C, g ? "blk.%d.ffn_up.weight" : "model.layers.%d.mlp.up_proj.weight", l);
        push(t, n, &off, 2, C, I, g ? "blk.%d.ffn_down.weight" : "model.layers.%d.mlp.down_proj.weight", l);
    }
    push(t, n, &off, 0, C, 0, g ? "output_norm.weight" : "model.norm.weight", 0);
    if (!cfg->tie_word_embeddings) push(t, n, &off, 1, V, C, g ? "output.weight" : "lm_head.weight", 0);
    return t;
}

lm_tensor *lm_tensors(const moh_lm_config *cfg, int *n) { return lm_tensors_named(cfg, MODEL_NAMES_CHECKPOINT, n); }

void lm_params_init_random(const moh_lm_config *cfg, lm_params_f32 *p, uint64_t seed, double std) {
    int nt = 0;
    lm_tensor *ts = lm_tensors(cfg, &nt);
    uint64_t s = seed ^ 0x6D6F68ULL;
    for (int i = 0; ts && i < nt; i++) {
        float *x = p->data + ts[i].offset;
        for (size_t j = 0; j < ts[i].numel; j++) x[j] = ts[i].ndim == 2 ? (float)(std * moh_rng_normal(&s)) : 1.0f;
    }
    free(ts);
}
