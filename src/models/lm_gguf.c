/* LLaMA-architecture models from GGUF files (llama.cpp's format; reader: io/gguf.h): the config
 * from the llama.* metadata, the weights through the tensor registry's GGUF names
 * (lm_tensors_named, MODEL_NAMES_GGUF), dequantised to float32, with the row permutation of
 * attn_q / attn_k that llama.cpp's converter applies for ggml's RoPE layout undone, so the model
 * keeps the Hugging Face rotate-half convention (spec §10). Source: llama.cpp
 * convert_hf_to_gguf.py (LlamaModel.permute, set_gguf_parameters), src/llama-model.cpp (LLM_ARCH_LLAMA
 * hparams and tensors), src/llama-model-loader.cpp (key types, check_tensor_dims, split files).
 * The rules for the llama.* keys, each with llama.cpp's reason, are listed at lm_gguf_config in
 * lm_gguf.h. */
#include "models/lm_gguf.h"

#include "text/bpe_gguf.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* llama.cpp's get_key<uint32_t>: the key is exactly u32 (another type: "key has wrong type");
 * *out = dflt when absent and !required. */
static int key_u32(const moh_gguf *g, const char *path, const char *key, bool required, long dflt, long lo, long hi,
                   long *out, moh_error *err) {
    const int64_t i = moh_gguf_find_key(g, key);
    *out = dflt;
    if (i < 0)
        return required ? moh_fail(err, MOH_E_SHAPE, "%s: metadata key '%s' is missing (a llama model needs it)", path, key)
                        : MOH_OK;
    const moh_gguf_type t = moh_gguf_kv_type(g, i);
    uint32_t u = 0;
    if (t != MOH_GGUF_U32 || moh_gguf_get_u32(g, key, &u, err))
        return moh_fail(err, MOH_E_FORMAT, "%s: metadata key '%s' is %s, expected u32 (llama.cpp refuses another type)",
                        path, key, t == MOH_GGUF_ARRAY ? "an array" : moh_gguf_type_str(t));
    if ((long)u < lo || (long)u > hi)
        return moh_fail(err, MOH_E_CONFIG, "%s: metadata key '%s' is %lu, expected %ld..%ld", path, key, (unsigned long)u, lo, hi);
    *out = (long)u;
    return MOH_OK;
}

/* get_key<float>: exactly f32; *found false and *out = dflt when absent. */
static int key_f32(const moh_gguf *g, const char *path, const char *key, bool required, double dflt, double *out,
                   bool *found, moh_error *err) {
    const int64_t i = moh_gguf_find_key(g, key);
    *out = dflt;
    if (found) *found = i >= 0;
    if (i < 0)
        return required ? moh_fail(err, MOH_E_SHAPE, "%s: metadata key '%s' is missing (a llama model needs it)", path, key)
                        : MOH_OK;
    const moh_gguf_type t = moh_gguf_kv_type(g, i);
    float f = 0;
    if (t != MOH_GGUF_F32 || moh_gguf_get_f32(g, key, &f, err))
        return moh_fail(err, MOH_E_FORMAT, "%s: metadata key '%s' is %s, expected f32 (llama.cpp refuses another type)",
                        path, key, t == MOH_GGUF_ARRAY ? "an array" : moh_gguf_type_str(t));
    *out = f;
    return MOH_OK;
}

/* A key of another scalar type (want), checked only: llama.cpp reads it and refuses another type. */
static int key_type(const moh_gguf *g, const char *path, const char *key, moh_gguf_type want, moh_error *err) {
    const int64_t i = moh_gguf_find_key(g, key);
    if (i < 0 || moh_gguf_kv_type(g, i) == want) return MOH_OK;
    const moh_gguf_type t = moh_gguf_kv_type(g, i);
    return moh_fail(err, MOH_E_FORMAT, "%s: metadata key '%s' is %s, expected %s (llama.cpp refuses another type)", path,
                    key, t == MOH_GGUF_ARRAY ? "an array" : moh_gguf_type_str(t), moh_gguf_type_str(want));
}

/* get_key_or_arr: a u32, or an array of n_layer i32 / u32 / bool (per-layer values). moh has one
 * width for every layer: an array whose values differ is refused. */
static int key_layers(const moh_gguf *g, const char *path, const char *key, bool required, long dflt, long n_layer,
                      long lo, long hi, long *out, moh_error *err) {
    const int64_t i = moh_gguf_find_key(g, key);
    if (i < 0 || moh_gguf_kv_type(g, i) != MOH_GGUF_ARRAY)
        return key_u32(g, path, key, required, dflt, lo, hi, out, err);
    moh_gguf_type et = MOH_GGUF_TYPE_COUNT;
    uint64_t n = 0;
    int rc = moh_gguf_get_arr(g, key, &et, &n, err);
    if (rc) return rc;
    if (et != MOH_GGUF_I32 && et != MOH_GGUF_U32 && et != MOH_GGUF_BOOL)
        return moh_fail(err, MOH_E_FORMAT, "%s: metadata key '%s' is an array of %s, expected u32 or an array of i32 / u32 "
                        "(one per layer)", path, key, moh_gguf_type_str(et));
    if (n != (uint64_t)n_layer)
        return moh_fail(err, MOH_E_FORMAT, "%s: metadata key '%s' has %llu values, expected %ld (llama.block_count)", path,
                        key, (unsigned long long)n, n_layer);
    const uint8_t *d = moh_gguf_arr_data(g, i);
    const size_t es = et == MOH_GGUF_BOOL ? 1 : 4;
    for (uint64_t k = 0; k < n; k++) {
        const uint8_t *p = d + k * es;
        const uint32_t u = es == 1 ? (uint32_t)(p[0] != 0)
                                   : (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
        const long v = et == MOH_GGUF_I32 ? (long)(int32_t)u : (long)u;
        if (k == 0) *out = v;
        if (v != *out)
            return moh_fail(err, MOH_E_CONFIG, "%s: metadata key '%s' is %ld for layer 0 and %ld for layer %llu, expected "
                            "one value for every layer (moh has no per-layer widths)", path, key, *out, v,
                            (unsigned long long)k);
    }
    if (*out < lo || *out > hi)
        return moh_fail(err, MOH_E_CONFIG, "%s: metadata key '%s' is %ld, expected %ld..%ld", path, key, *out, lo, hi);
    return MOH_OK;
}

int lm_gguf_config(const moh_gguf *g, const char *path, moh_lm_config *cfg, moh_error *err) {
    memset(cfg, 0, sizeof *cfg);
    const char *arch = NULL;
    size_t alen = 0;
    int rc = moh_gguf_get_str(g, "general.architecture", &arch, &alen, err);
    if (rc) return rc;
    if (alen != 5 || memcmp(arch, "llama", 5))
        return moh_fail(err, MOH_E_CONFIG, "%s: general.architecture is '%.*s', expected 'llama' (moh runs LLaMA-"
                        "architecture GGUF models)", path, (int)(alen < 64 ? alen : 64), arch);
    if (moh_gguf_find_key(g, "split.count") >= 0) { /* llama-model-loader: a u16; > 1 loads the other files */
        uint16_t n_split = 0;
        if ((rc = key_type(g, path, "split.count", MOH_GGUF_U16, err)) ||
            (rc = moh_gguf_get_u16(g, "split.count", &n_split, err)))
            return rc;
        if (n_split > 1)
            return moh_fail(err, MOH_E_CONFIG, "%s: split.count is %u, expected 1 (a split model: moh reads one file)", path,
                            (unsigned)n_split);
    }
    long L, C, I, h, hkv, ctx, d, dv, rdim, vocab;
    double eps, theta, factor, attn_factor;
    bool has_factor = false;
    static const char *const expert_keys[] = {"llama.expert_count", "llama.expert_used_count",
                                              "llama.expert_group_count", "llama.expert_group_used_count"};
    for (size_t k = 0; k < sizeof expert_keys / sizeof *expert_keys; k++) {
        long n = 0;
        if ((rc = key_u32(g, path, expert_keys[k], false, 0, 0, UINT32_MAX, &n, err))) return rc;
        if (n) /* llama.cpp then builds a mixture-of-experts FFN (ffn_*_exps) */
            return moh_fail(err, MOH_E_CONFIG, "%s: metadata key '%s' is %ld, expected 0 (a mixture-of-experts FFN; moh's "
                            "llama is dense)", path, expert_keys[k], n);
    }
    if ((rc = key_u32(g, path, "llama.block_count", true, 0, 1, 512, &L, err)) || /* LLAMA_MAX_LAYERS */
        (rc = key_u32(g, path, "llama.embedding_length", true, 0, 1, 1 << 20, &C, err)) ||
        (rc = key_u32(g, path, "llama.context_length", true, 0, 1, 1 << 24, &ctx, err)) ||
        (rc = key_layers(g, path, "llama.feed_forward_length", true, 0, L, 1, 1 << 22, &I, err)) ||
        (rc = key_layers(g, path, "llama.attention.head_count", true, 0, L, 1, 4096, &h, err)) ||
        (rc = key_layers(g, path, "llama.attention.head_count_kv", false, h, L, 1, 4096, &hkv, err)) ||
        (rc = key_u32(g, path, "llama.attention.key_length", false, C / h, 1, 1 << 16, &d, err)) ||
        (rc = key_u32(g, path, "llama.attention.value_length", false, C / h, 1, 1 << 16, &dv, err)) ||
        (rc = key_u32(g, path, "llama.rope.dimension_count", false, d, 0, 1 << 16, &rdim, err)) ||
        (rc = key_u32(g, path, "llama.vocab_size", false, -1, 0, UINT32_MAX, &vocab, err)) ||
        (rc = key_f32(g, path, "llama.attention.layer_norm_rms_epsilon", true, 0, &eps, NULL, err)) ||
        (rc = key_f32(g, path, "llama.rope.freq_base", false, 10000.0, &theta, NULL, err)) ||
        (rc = key_f32(g, path, "llama.rope.scaling.factor", false, 0, &factor, &has_factor, err)) ||
        (!has_factor && (rc = key_f32(g, path, "llama.rope.scale_linear", false, 0, &factor, NULL, err))) ||
        (rc = key_f32(g, path, "llama.rope.scaling.attn_factor", false, 1, &attn_factor, NULL, err)) ||
        (rc = key_type(g, path, "llama.rope.scaling.type", MOH_GGUF_STRING, err)) ||
        (rc = key_type(g, path, "llama.rope.scaling.finetuned", MOH_GGUF_BOOL, err)) ||
        (rc = key_type(g, path, "llama.rope.scaling.original_context_length", MOH_GGUF_U32, err)))
        return rc;
    if (rdim != d) /* load_hparams for LLM_ARCH_LLAMA: "invalid n_rot" */
        return moh_fail(err, MOH_E_CONFIG, "%s: llama.rope.dimension_count is %ld, expected %ld (the key length; llama.cpp "
                        "refuses partial RoPE for llama)", path, rdim, d);
    if (dv != d) /* the llama graph asserts n_embd_head_v == n_embd_head_k */
        return moh_fail(err, MOH_E_CONFIG, "%s: llama.attention.value_length is %ld, expected %ld (the key length)", path,
                        dv, d);
    /* RoPE scaling: the type defaults to "linear" and the factor (or the older rope.scale_linear) to
     * 0 = none; "none" never scales (llama_context). */
    char st[16] = "linear";
    if (moh_gguf_find_key(g, "llama.rope.scaling.type") >= 0) {
        const char *s = NULL;
        size_t sl = 0;
        if ((rc = moh_gguf_get_str(g, "llama.rope.scaling.type", &s, &sl, err))) return rc;
        if (!((sl == 4 && !memcmp(s, "none", 4)) || (sl == 6 && !memcmp(s, "linear", 6))))
            return moh_fail(err, MOH_E_CONFIG, "%s: llama.rope.scaling.type is '%.*s', expected none or linear (%s)", path,
                            (int)(sl < 32 ? sl : 32), s,
                            (sl == 4 && !memcmp(s, "yarn", 4)) || (sl == 8 && !memcmp(s, "longrope", 8))
                                ? "moh does not implement this scaling" : "llama.cpp knows none, linear, yarn, longrope");
        memcpy(st, s, sl);
        st[sl] = '\0';
    }
    if (!isfinite(factor) || factor < 0)
        return moh_fail(err, MOH_E_CONFIG, "%s: llama.rope.scaling.factor is %g, expected a finite number >= 0", path, factor);
    if (attn_factor != 1.0)
        return moh_fail(err, MOH_E_CONFIG, "%s: llama.rope.scaling.attn_factor is %g, expected 1 (moh does not scale "
                        "the rotated q and k)", path, attn_factor);
    const moh_gguf_tensor *emb = moh_gguf_find_tensor(g, "token_embd.weight");
    if (!emb || emb->n_dims > 2 || emb->ne[0] != C || emb->ne[1] < 1)
        return moh_fail(err, MOH_E_SHAPE, "%s: tensor 'token_embd.weight' is %s, expected [%ld, vocab] (ggml order)", path,
                        emb ? "of another shape" : "missing", C);
    if (vocab >= 0 && vocab != emb->ne[1]) /* older llama.cpp sized token_embd by it */
        return moh_fail(err, MOH_E_SHAPE, "%s: llama.vocab_size is %ld, expected %lld (the rows of token_embd.weight)",
                        path, vocab, (long long)emb->ne[1]);
    cfg->hidden_size = (int)C;
    cfg->num_hidden_layers = (int)L;
    cfg->num_attention_heads = (int)h;
    cfg->num_key_value_heads = (int)hkv;
    cfg->head_dim = (int)d;
    cfg->intermediate_size = (int)I;
    cfg->vocab_size = (int)emb->ne[1];
    cfg->max_position_embeddings = (int)ctx;
    cfg->rms_norm_eps = eps;
    cfg->rope_theta = theta;
    if (!strcmp(st, "linear") && factor != 0 && factor != 1) /* freq_scale = 1 / factor: HF's "linear" */
        cfg->rope_scaling = (moh_rope_scaling){.type = MOH_ROPE_LINEAR, .factor = factor};
    cfg->tie_word_embeddings = moh_gguf_find_tensor(g, "output.weight") == NULL;
    cfg->router = MOH_ROUTER_NONE; /* a pretrained multi-head model: dense (MHA -> MoH conversion is separate) */
    cfg->load_balance_coef = 0.01;
    return moh_lm_config_finalize(cfg, path, err);
}

/* The rows of one q or k projection [heads * d, cols] between the HF order and ggml's RoPE order:
 * ggml row 2j + s of a head is HF row s d/2 + j (convert_hf_to_gguf.py LlamaModel.permute; to_ggml
 * false inverts it). */
/* 'q' for a ...attn_q.weight tensor name, 'k' for ...attn_k.weight (rows in llama.cpp's RoPE layout
 * in a GGUF, qk_rows), else 0. */
static int qk_tensor(const char *name) {
    static const char qs[] = ".attn_q.weight", ks[] = ".attn_k.weight";
    const size_t len = strlen(name), sl = sizeof qs - 1;
    return len <= sl ? 0 : !strcmp(name + len - sl, qs) ? 'q' : !strcmp(name + len - sl, ks) ? 'k' : 0;
}

static void qk_rows(const float *src, float *dst, int heads, int d, int64_t cols, bool to_ggml) {
    const int half = d / 2;
    for (int hh = 0; hh < heads; hh++)
        for (int j = 0; j < half; j++)
            for (int s = 0; s < 2; s++) {
                const int64_t g = (int64_t)hh * d + 2 * j + s, h = (int64_t)hh * d + s * half + j;
                memcpy(dst + (to_ggml ? g : h) * cols, src + (to_ggml ? h : g) * cols, sizeof(float) * (size_t)cols);
            }
}

/* The file's (ggml order) flat index of element i of tensor e as moh holds it: attn_q / attn_k rows
 * are held in HF order (qk_rows), every other tensor as the file has it. */
static size_t file_index(const model_tensor *e, const moh_lm_config *cfg, size_t i) {
    if (e->ndim != 2 || !qk_tensor(e->name)) return i;
    const size_t cols = (size_t)e->shape[1], d = (size_t)cfg->head_dim, half = d / 2, h = i / cols;
    const size_t hh = h / d, s = h % d / half, j = h % d % half;
    return (hh * d + 2 * j + s) * cols + i % cols;
}

typedef struct qentry {
    const model_tensor *e;
    const moh_gguf_tensor *t;
    bool qk;
} qentry;

static int cmp_qentry(const void *a, const void *b) {
    const size_t x = ((const qentry *)a)->e->offset, y = ((const qentry *)b)->e->offset;
    return (x > y) - (x < y);
}

int lm_gguf_quant_table(const moh_gguf *g, const char *path, const moh_lm_config *cfg, const float *data, size_t n,
                        quant_table *qt, moh_error *err) {
    memset(qt, 0, sizeof *qt);
    int nt = 0;
    model_tensor *ts = lm_tensors_named(cfg, MODEL_NAMES_GGUF, &nt);
    qentry *q = ts ? malloc(sizeof *q * (size_t)(nt > 0 ? nt : 1)) : NULL;
    if (!q) {
        free(ts);
        return moh_fail(err, MOH_E_NOMEM, "%s: out of memory", path);
    }
    int nq = 0;
    for (int i = 0; i < nt; i++) {
        const moh_gguf_tensor *t = moh_gguf_find_tensor(g, ts[i].name);
        if (!t || ts[i].ndim != 2 || !quant_supported(t->type) || t->ne[0] != ts[i].shape[1] ||
            t->ne[1] != ts[i].shape[0])
            continue; /* lm_gguf_weights has checked every shape; float tensors decode fp32 */
        const size_t len = strlen(ts[i].name);
        const bool qk = qk_tensor(ts[i].name) != 0;
        static const char os[] = ".attn_output.weight";
        const size_t ol = sizeof os - 1;
        if (cfg->head_dim % QUANT_BLOCK && len > ol && !strcmp(ts[i].name + len - ol, os))
            continue; /* decode reads W_O per head: whole blocks only (as lm_quant_table) */
        q[nq++] = (qentry){&ts[i], t, qk};
    }
    qsort(q, (size_t)nq, sizeof *q, cmp_qentry);
    size_t own = 0; /* attn_q / attn_k rows are reordered into the table's memory; the rest borrowed */
    for (int i = 0; i < nq; i++) own += q[i].qk ? (size_t)q[i].t->ne[1] * quant_row_bytes(q[i].t->type, q[i].t->ne[0]) : 0;
    int rc = quant_table_init(qt, data, n, nq, own, err);
    for (int i = 0; i < nq && !rc; i++) {
        const moh_gguf_tensor *t = q[i].t;
        uint8_t *room = NULL;
        if ((rc = quant_table_add(qt, q[i].e->offset, t->ne[1], t->ne[0], t->type, q[i].qk ? NULL : t->data, &room, err)))
            break;
        if (!q[i].qk) continue;
        /* HF row hh d + s d/2 + j is ggml row hh d + 2 j + s (qk_rows) */
        const size_t rb = qt->m[qt->n - 1].row_bytes;
        const int d = cfg->head_dim, half = d / 2, heads = (int)(t->ne[1] / d);
        for (int hh = 0; hh < heads; hh++)
            for (int j = 0; j < half; j++)
                for (int sgn = 0; sgn < 2; sgn++)
                    memcpy(room + (size_t)(hh * d + sgn * half + j) * rb, t->data + (size_t)(hh * d + 2 * j + sgn) * rb, rb);
    }
    if (rc) {
        quant_table_free(qt);
        const size_t used = strlen(err->msg);
        snprintf(err->msg + used, sizeof err->msg - used, " (%s)", path);
    }
    free(q);
    free(ts);
    return rc;
}

int lm_gguf_weights(const moh_gguf *g, const char *path, const moh_lm_config *cfg, float *data,
                    const quant_table *held, moh_error *err) {
    int nt = 0;
    model_tensor *ts = lm_tensors_named(cfg, MODEL_NAMES_GGUF, &nt);
    if (!ts) return moh_fail(err, MOH_E_NOMEM, "%s: out of memory", path);
    int rc = MOH_OK;
    float *tmp = NULL;
    for (int i = 0; i < nt && !rc; i++) {
        const model_tensor *e = &ts[i];
        const moh_gguf_tensor *t = moh_gguf_find_tensor(g, e->name);
        if (!t) {
            rc = moh_fail(err, MOH_E_SHAPE, "%s: tensor '%s' is missing (the llama.* metadata needs it)", path, e->name);
            break;
        }
        /* ggml order is the PyTorch shape reversed; all 4 ne compared, trailing 1s allowed
         * (llama_model_loader::check_tensor_dims) */
        bool same = true;
        for (int dd = 0; dd < MOH_GGUF_MAX_DIMS && same; dd++)
            same = t->ne[dd] == (dd < e->ndim ? e->shape[e->ndim - 1 - dd] : 1);
        if (!same) {
            rc = moh_fail(err, MOH_E_SHAPE, "%s: tensor '%s' has %d dims ne [%lld, %lld, %lld, %lld], expected %d dims "
                          "[%lld, %lld] (ggml order) for the llama.* metadata", path, e->name, t->n_dims,
                          (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], (long long)t->ne[3], e->ndim,
                          (long long)e->shape[e->ndim - 1], (long long)(e->ndim > 1 ? e->shape[0] : 1));
            break;
        }
        const bool q = qk_tensor(e->name) == 'q', k = qk_tensor(e->name) == 'k';
        const quant_mat *qm = quant_table_find(held, data + e->offset);
        if (qm && qm->off == e->offset) { /* blocks only: their values checked finite, nothing written */
            free(tmp);
            if (!(tmp = malloc(sizeof(float) * (size_t)qm->cols))) {
                rc = moh_fail(err, MOH_E_NOMEM, "%s: out of memory", path);
                break;
            }
            for (int64_t r = 0; r < qm->rows && !rc; r++) {
                if (quant_blocks_finite(qm->type, qm->data + (size_t)r * qm->row_bytes,
                                        (size_t)(qm->cols / quant_block_size(qm->type))))
                    continue; /* its scales finite: so is every value (the row's values read only to name one) */
                quant_table_row(held, data + qm->off + (size_t)(r * qm->cols), qm->cols, tmp);
                for (int64_t j = 0; j < qm->cols && !rc; j++)
                    if (!isfinite(tmp[j]))
                        rc = moh_fail(err, MOH_E_FORMAT, "%s: tensor '%s' holds a non-finite value at index %zu", path,
                                      e->name, file_index(e, cfg, (size_t)(r * qm->cols + j)));
            }
            continue;
        }
        if (!q && !k) {
            rc = moh_gguf_dequantize(g, t, data + e->offset, err);
            continue;
        }
        free(tmp);
        if (!(tmp = malloc(sizeof(float) * e->numel))) {
            rc = moh_fail(err, MOH_E_NOMEM, "%s: out of memory", path);
            break;
        }
        if (!(rc = moh_gguf_dequantize(g, t, tmp, err)))
            qk_rows(tmp, data + e->offset, q ? cfg->num_attention_heads : cfg->num_key_value_heads, cfg->head_dim,
                    e->shape[1], false);
    }
    /* every tensor of the file is one of the model's (an unknown one would be silently dropped) */
    for (int64_t i = 0; !rc && i < moh_gguf_n_tensors(g); i++) {
        const moh_gguf_tensor *t = moh_gguf_tensor_at(g, i);
        bool known = false;
        for (int j = 0; j < nt && !known; j++) known = !strcmp(t->name, ts[j].name);
        if (!known)
            rc = moh_fail(err, MOH_E_SHAPE, "%s: tensor '%s' is not one moh's llama model has (rope_freqs, biases and "
                          "other extras are not supported)", path, t->name);
    }
    for (size_t i = 0; !rc && i < (size_t)nt; i++) /* finite weights only (the blocks' above) */
        for (size_t j = 0; j < ts[i].numel && !rc && !quant_table_find(held, data + ts[i].offset); j++)
            if (!isfinite(data[ts[i].offset + j]))
                rc = moh_fail(err, MOH_E_FORMAT, "%s: tensor '%s' holds a non-finite value at index %zu", path, ts[i].name,
                              file_index(&ts[i], cfg, j));
    free(tmp);
    free(ts);
    return rc;
}

int lm_gguf_export(const moh_lm_config *cfg, const float *data, const bpe_tok *tok, int eos_id,
                   const char *chat_template, const moh_gguf *from, const char *path, int wtype, moh_error *err) {
    if (cfg->router != MOH_ROUTER_NONE)
        return moh_fail(err, MOH_E_ARG, "%s: the checkpoint routes heads (router %s, %d shared + top-%d of %d): llama.cpp "
                        "runs dense multi-head attention only, so a MoH model cannot be exported to GGUF", path,
                        attn_router_name(cfg->router), cfg->shared_heads, cfg->top_k, cfg->num_attention_heads);
    if (cfg->rope_scaling.type != MOH_ROPE_DEFAULT && cfg->rope_scaling.type != MOH_ROPE_LINEAR)
        return moh_fail(err, MOH_E_ARG, "%s: the checkpoint's rope_scaling is \"%s\": moh writes no "
                        "rope_freqs.weight, so llama.cpp would run it unscaled; expected a model without rope_scaling "
                        "or with linear", path, attn_rope_type_name(cfg->rope_scaling.type));
    const bool bpe = tok && !bpe_is_bytes(tok);
    if (bpe && bpe_n_tokens(tok) != cfg->vocab_size)
        return moh_fail(err, MOH_E_ARG, "%s: the tokenizer has %d tokens, expected vocab_size %d", path, bpe_n_tokens(tok),
                        cfg->vocab_size);
    if (!bpe && cfg->vocab_size < 256)
        return moh_fail(err, MOH_E_ARG, "%s: vocab_size %d, expected >= 256 (the byte vocabulary)", path, cfg->vocab_size);
    moh_gguf_writer *w = NULL;
    int rc = moh_gguf_writer_new(&w, err);
    if (rc) return rc;
    int nt = 0;
    model_tensor *ts = lm_tensors_named(cfg, MODEL_NAMES_GGUF, &nt);
    float **perm = calloc((size_t)(nt > 0 ? nt : 1), sizeof *perm);
    const size_t nb = bpe ? 1 : (size_t)cfg->vocab_size; /* byte vocabulary arrays */
    char (*bt)[16] = calloc(nb, sizeof *bt);
    const char **toks = calloc(nb, sizeof *toks);
    int32_t *types = calloc(nb, sizeof *types);
    if (!ts || !perm || !bt || !toks || !types) rc = moh_fail(err, MOH_E_NOMEM, "%s: out of memory", path);
    if (!rc) { /* the llama.* metadata llama.cpp's loader reads (convert_hf_to_gguf.py LlamaModel) */
        moh_gguf_add_str(w, "general.architecture", "llama");
        moh_gguf_add_str(w, "general.name", "moh");
        /* llama_ftype: ALL_F32 0, MOSTLY_F16 1, Q4_0 2, Q4_1 3, Q8_0 7, Q5_0 8, Q5_1 9, Q4_K_S 14,
         * Q5_K_S 16, Q6_K 18 (llama.h) */
        const uint32_t ftype = wtype == MOH_GGML_F16 ? 1 : wtype == MOH_GGML_Q4_0 ? 2 : wtype == MOH_GGML_Q4_1 ? 3
                             : wtype == MOH_GGML_Q8_0 ? 7 : wtype == MOH_GGML_Q5_0 ? 8 : wtype == MOH_GGML_Q5_1 ? 9
                             : wtype == MOH_GGML_Q4_K ? 14 : wtype == MOH_GGML_Q5_K ? 16 : wtype == MOH_GGML_Q6_K ? 18 : 0;
        moh_gguf_add_u32(w, "general.file_type", ftype);
        if (quant_supported(wtype)) moh_gguf_add_u32(w, "general.quantization_version", 2);
        moh_gguf_add_u32(w, "llama.context_length", (uint32_t)cfg->max_position_embeddings);
        moh_gguf_add_u32(w, "llama.embedding_length", (uint32_t)cfg->hidden_size);
        moh_gguf_add_u32(w, "llama.block_count", (uint32_t)cfg->num_hidden_layers);
        moh_gguf_add_u32(w, "llama.feed_forward_length", (uint32_t)cfg->intermediate_size);
        moh_gguf_add_u32(w, "llama.rope.dimension_count", (uint32_t)cfg->head_dim);
        moh_gguf_add_u32(w, "llama.attention.head_count", (uint32_t)cfg->num_attention_heads);
        moh_gguf_add_u32(w, "llama.attention.head_count_kv", (uint32_t)cfg->num_key_value_heads);
        moh_gguf_add_u32(w, "llama.attention.key_length", (uint32_t)cfg->head_dim);
        moh_gguf_add_u32(w, "llama.attention.value_length", (uint32_t)cfg->head_dim);
        moh_gguf_add_f32(w, "llama.attention.layer_norm_rms_epsilon", (float)cfg->rms_norm_eps);
        moh_gguf_add_f32(w, "llama.rope.freq_base", (float)cfg->rope_theta);
        if (cfg->rope_scaling.type == MOH_ROPE_LINEAR) { /* llama.cpp: freq_scale = 1 / factor */
            moh_gguf_add_str(w, "llama.rope.scaling.type", "linear");
            moh_gguf_add_f32(w, "llama.rope.scaling.factor", (float)cfg->rope_scaling.factor);
        }
        moh_gguf_add_u32(w, "llama.vocab_size", (uint32_t)cfg->vocab_size);
    }
    if (!rc && bpe) rc = bpe_to_gguf(tok, eos_id, chat_template, from, w, err);
    else if (!rc) {
        /* the byte vocabulary as a byte-level BPE without merges: token b is byte b (GPT-2's
         * byte-to-unicode spelling), so llama.cpp's gpt2 tokenizer gives moh's ids */
        for (int v = 0; v < cfg->vocab_size; v++) {
            if (v < 256) bpe_byte_spelling(v, bt[v]);
            else snprintf(bt[v], sizeof bt[v], "<x%d>", v - 256);
            toks[v] = bt[v];
            types[v] = v < 256 ? 1 : 5; /* normal; unused */
        }
        moh_gguf_add_str(w, "tokenizer.ggml.model", "gpt2");
        moh_gguf_add_str(w, "tokenizer.ggml.pre", "default");
        moh_gguf_add_arr_str(w, "tokenizer.ggml.tokens", toks, (uint64_t)cfg->vocab_size);
        moh_gguf_add_arr_i32(w, "tokenizer.ggml.token_type", types, (uint64_t)cfg->vocab_size);
        moh_gguf_add_arr_str(w, "tokenizer.ggml.merges", NULL, 0);
        moh_gguf_add_u32(w, "tokenizer.ggml.bos_token_id", 0);
        moh_gguf_add_u32(w, "tokenizer.ggml.eos_token_id", 0);
        moh_gguf_add_bool(w, "tokenizer.ggml.add_bos_token", false);
    }
    for (int i = 0; !rc && i < nt; i++) {
        const model_tensor *e = &ts[i];
        int64_t ne[2] = {e->shape[e->ndim - 1], e->ndim > 1 ? e->shape[0] : 1};
        const float *src = data + e->offset;
        const bool q = qk_tensor(e->name) == 'q', k = qk_tensor(e->name) == 'k';
        if (q || k) { /* llama.cpp's RoPE layout: HF row s d/2 + j of a head to row 2j + s */
            if (!(perm[i] = malloc(sizeof(float) * e->numel))) {
                rc = moh_fail(err, MOH_E_NOMEM, "%s: out of memory", path);
                break;
            }
            qk_rows(src, perm[i], q ? cfg->num_attention_heads : cfg->num_key_value_heads, cfg->head_dim, ne[0], true);
            src = perm[i];
        }
        /* norms stay F32, as llama.cpp's converter writes them; in a quantised file the embedding
         * and the LM head get more bits (quant_head_type), rows not of a K-quant's 256
         * llama-quantize's fallback and rows not of 32 F16 (quant_fit) */
        int type = e->ndim == 2 ? wtype : MOH_GGML_F32;
        const bool outer = !strcmp(e->name, "token_embd.weight") || !strcmp(e->name, "output.weight");
        if (quant_supported(type)) {
            type = quant_fit(outer ? quant_head_type(wtype) : wtype, ne[0]);
            if (type < 0) type = MOH_GGML_F16;
        }
        rc = moh_gguf_add_tensor(w, e->name, e->ndim, ne, type, src, err);
    }
    if (!rc) rc = moh_gguf_write(w, path, err);
    for (int i = 0; perm && i < nt; i++) free(perm[i]);
    free(perm);
    free(ts);
    free(bt);
    free(toks);
    free(types);
    moh_gguf_writer_free(w);
    return rc;
}
