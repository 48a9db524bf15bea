/* Layer configuration: defaults, validation and LAYER.json parsing; the decoder LM's config.json
 * parser (moh_lm_config_parse_json; moh_lm_config_finalize in src/models/lm_config.c validates).
 *
 * JSON keys follow Hugging Face names (hidden_size, num_attention_heads, num_key_value_heads,
 * head_dim, rope_theta) plus the MoH ones (shared_heads, top_k, router, load_balance_coef).
 * Unknown keys are errors so that a typo never silently falls back to a default; keys starting with
 * "_" or "comment" are free-form annotations and skipped. Every message names the label (file), the
 * field, the value found and what was expected.
 */
#include "moh.h"

#include "attn/attn.h"
#include "io/json_util.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <math.h>
#include <string.h>

void moh_attn_config_default(moh_attn_config *c) {
    if (!c) return;
    memset(c, 0, sizeof *c);
    /* hidden_size, n_heads, n_kv_heads, head_dim stay 0: there is no sensible default size, the
     * caller (or the JSON) must give them; validate rejects 0. */
    c->router = MOH_ROUTER_NONE;
    c->shared_heads = 0;
    c->top_k = 0;
    c->causal = false;
    c->qkv_bias = false;
    c->proj_bias = false;
    c->fused_qkv = false;
    c->rope_theta = 0.0;
    c->load_balance_coef = 0.0;
    c->straight_through = false;
}

int moh_attn_config_validate(const moh_attn_config *c, const char *label, moh_error *err) {
    if (!label) label = "<config>";
    if (!c) return moh_fail(err, MOH_E_ARG, "%s: config is NULL", label);
    const int h = c->n_heads;
    if (c->hidden_size <= 0)
        return moh_fail(err, MOH_E_CONFIG, "%s: field 'hidden_size': got %d, expected an integer > 0",
                        label, c->hidden_size);
    if (h <= 0)
        return moh_fail(err, MOH_E_CONFIG,
                        "%s: field 'num_attention_heads': got %d, expected an integer > 0", label, h);
    if (c->n_kv_heads <= 0 || h % c->n_kv_heads != 0)
        return moh_fail(err, MOH_E_CONFIG,
                        "%s: field 'num_key_value_heads': got %d, expected an integer > 0 that "
                        "divides num_attention_heads %d",
                        label, c->n_kv_heads, h);
    if (c->head_dim <= 0)
        return moh_fail(err, MOH_E_CONFIG, "%s: field 'head_dim': got %d, expected an integer > 0",
                        label, c->head_dim);
    if ((long long)h * c->head_dim > INT_MAX)
        return moh_fail(err, MOH_E_CONFIG,
                        "%s: field 'head_dim': num_attention_heads %d * head_dim %d is too large "
                        "(expected at most %d)",
                        label, h, c->head_dim, INT_MAX);
    if (isnan(c->rope_theta) || isinf(c->rope_theta))
        return moh_fail(err, MOH_E_CONFIG,
                        "%s: field 'rope_theta': got %g, expected a finite number > 0 (or null for "
                        "no RoPE)",
                        label, c->rope_theta);
    if (c->rope_theta > 0 && c->head_dim % 2 != 0)
        return moh_fail(err, MOH_E_CONFIG,
                        "%s: field 'head_dim': got %d, expected an even number because RoPE is on "
                        "(rope_theta %g)",
                        label, c->head_dim, c->rope_theta);
    if (!(c->load_balance_coef >= 0.0) || isinf(c->load_balance_coef))
        return moh_fail(err, MOH_E_CONFIG,
                        "%s: field 'load_balance_coef': got %g, expected a finite number >= 0",
                        label, c->load_balance_coef);
    if (c->router != MOH_ROUTER_NONE && c->router != MOH_ROUTER_LEARNED &&
        c->router != MOH_ROUTER_QUERY_NORM)
        return moh_fail(err, MOH_E_CONFIG,
                        "%s: field 'router': got %d, expected \"learned\", \"query_norm\" or \"none\"",
                        label, (int)c->router);
    if (c->shared_heads < 0 || c->shared_heads > h)
        return moh_fail(err, MOH_E_CONFIG,
                        "%s: field 'shared_heads': got %d, expected 0..%d (num_attention_heads)",
                        label, c->shared_heads, h);
    const int E = h - c->shared_heads; /* routed heads */
    if (c->top_k < 0 || c->top_k > E)
        return moh_fail(err, MOH_E_CONFIG,
                        "%s: field 'top_k': got %d, expected 0..%d (num_attention_heads %d - "
                        "shared_heads %d)",
                        label, c->top_k, E, h, c->shared_heads);
    switch (c->router) {
    case MOH_ROUTER_NONE: break; /* dense: shared_heads/top_k unused */
    case MOH_ROUTER_LEARNED:
        if (c->top_k == 0 && c->shared_heads != h)
            return moh_fail(err, MOH_E_CONFIG,
                            "%s: field 'top_k': got 0 with router \"learned\" and shared_heads %d, "
                            "expected top_k >= 1, or shared_heads = num_attention_heads %d (all "
                            "heads shared, soft reweighting)",
                            label, c->shared_heads, h);
        break;
    case MOH_ROUTER_QUERY_NORM:
        if (E < 1)
            return moh_fail(err, MOH_E_CONFIG,
                            "%s: field 'shared_heads': got %d with router \"query_norm\", expected "
                            "at most %d so that at least one head is routed",
                            label, c->shared_heads, h - 1);
        if (c->top_k < 1)
            return moh_fail(err, MOH_E_CONFIG,
                            "%s: field 'top_k': got %d with router \"query_norm\", expected 1..%d",
                            label, c->top_k, E);
        break;
    }
    if (c->straight_through && c->router != MOH_ROUTER_QUERY_NORM)
        return moh_fail(err, MOH_E_CONFIG,
                        "%s: field 'straight_through': true with router \"%s\", expected false "
                        "(the straight-through estimator is for router \"query_norm\")",
                        label, attn_router_name(c->router));
    return MOH_OK;
}

/* ---------------------------------------------------------------------------------------------
 * JSON (readers in io/json_util.c)
 * ------------------------------------------------------------------------------------------- */

/* Optional field key: a finite number >= 0. */
static int get_nonneg_number(const json_reader *rd, const cJSON *j, const char *key, double *out) {
    char v[JSON_SHOW_BUF];
    int rc = json_get_number(rd, j, key, out);
    if (rc != MOH_OK) return rc;
    if (*out < 0)
        return moh_fail(rd->err, MOH_E_CONFIG, "%s: field '%s': expected a number >= 0, got %s",
                        rd->label, key, json_show_value(rd, v, j));
    return MOH_OK;
}

enum {
    K_HIDDEN,
    K_HEADS,
    K_KV,
    K_HEAD_DIM,
    K_SHARED,
    K_TOPK,
    K_ROUTER,
    K_CAUSAL,
    K_QKV_BIAS,
    K_PROJ_BIAS,
    K_ROPE,
    K_BETA,
    K_STE,
    K_COUNT
};
static const char *const CFG_KEYS[K_COUNT] = {
    "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
    "shared_heads", "top_k", "router", "causal", "qkv_bias", "proj_bias", "rope_theta",
    "load_balance_coef", "straight_through",
};

static int cfg_from_json(void *out, const cJSON *root, const json_reader *rd) {
    moh_attn_config *c = out;
    const char *label = rd->label;
    moh_error *err = rd->err;
    char v[JSON_SHOW_BUF];
    const cJSON *f[K_COUNT];
    int rc = json_object_fields(
        rd, root, CFG_KEYS, K_COUNT, f, "{\"hidden_size\": ...}",
        "expected one of hidden_size, num_attention_heads, num_key_value_heads, head_dim, "
        "shared_heads, top_k, router, causal, qkv_bias, proj_bias, rope_theta, load_balance_coef, "
        "straight_through; prefix annotations with '_'");
    if (rc != MOH_OK) return rc;

    moh_attn_config_default(c);
    if (!f[K_HIDDEN])
        return moh_fail(err, MOH_E_CONFIG, "%s: missing field 'hidden_size' (an integer > 0)",
                        label);
    if ((rc = json_get_int(rd, f[K_HIDDEN], "hidden_size", 1, INT_MAX, &c->hidden_size))) return rc;
    if (!f[K_HEADS])
        return moh_fail(err, MOH_E_CONFIG,
                        "%s: missing field 'num_attention_heads' (an integer > 0)", label);
    if ((rc = json_get_int(rd, f[K_HEADS], "num_attention_heads", 1, INT_MAX, &c->n_heads)))
        return rc;

    c->n_kv_heads = c->n_heads;
    if (f[K_KV]) {
        if ((rc = json_get_int(rd, f[K_KV], "num_key_value_heads", 1, INT_MAX, &c->n_kv_heads)))
            return rc;
        if (c->n_heads % c->n_kv_heads != 0)
            return moh_fail(err, MOH_E_CONFIG,
                            "%s: field 'num_key_value_heads': got %d, expected a divisor of "
                            "num_attention_heads %d",
                            label, c->n_kv_heads, c->n_heads);
    }

    if (f[K_HEAD_DIM]) {
        if ((rc = json_get_int(rd, f[K_HEAD_DIM], "head_dim", 1, INT_MAX, &c->head_dim))) return rc;
    } else {
        if (c->hidden_size % c->n_heads != 0)
            return moh_fail(err, MOH_E_CONFIG,
                            "%s: field 'head_dim' is absent and hidden_size %d is not divisible by "
                            "num_attention_heads %d; expected head_dim given explicitly or "
                            "hidden_size a multiple of num_attention_heads",
                            label, c->hidden_size, c->n_heads);
        c->head_dim = c->hidden_size / c->n_heads;
    }

    /* Any int here: validate reports the range with the head counts. */
    if (f[K_SHARED] &&
        (rc = json_get_int(rd, f[K_SHARED], "shared_heads", INT_MIN, INT_MAX, &c->shared_heads)))
        return rc;
    if (f[K_TOPK] && (rc = json_get_int(rd, f[K_TOPK], "top_k", INT_MIN, INT_MAX, &c->top_k)))
        return rc;
    if (f[K_ROUTER] &&
        (rc = json_get_router(rd, f[K_ROUTER], "router", true,
                              "\"learned\", \"query_norm\" or \"none\"", &c->router)))
        return rc;

    if (f[K_CAUSAL] && (rc = json_get_bool(rd, f[K_CAUSAL], "causal", &c->causal))) return rc;
    if (f[K_QKV_BIAS] && (rc = json_get_bool(rd, f[K_QKV_BIAS], "qkv_bias", &c->qkv_bias)))
        return rc;
    if (f[K_PROJ_BIAS] && (rc = json_get_bool(rd, f[K_PROJ_BIAS], "proj_bias", &c->proj_bias)))
        return rc;

    if (f[K_ROPE] && !cJSON_IsNull(f[K_ROPE])) {
        if (!cJSON_IsNumber(f[K_ROPE]) || !(f[K_ROPE]->valuedouble > 0) ||
            isinf(f[K_ROPE]->valuedouble))
            return moh_fail(err, MOH_E_CONFIG,
                            "%s: field 'rope_theta': expected a finite number > 0 (or null for no "
                            "RoPE), got %s",
                            label, json_show_value(rd, v, f[K_ROPE]));
        c->rope_theta = f[K_ROPE]->valuedouble;
    }
    if (f[K_BETA] &&
        (rc = get_nonneg_number(rd, f[K_BETA], "load_balance_coef", &c->load_balance_coef)))
        return rc;
    if (f[K_STE] && (rc = json_get_bool(rd, f[K_STE], "straight_through", &c->straight_through)))
        return rc;
    return moh_attn_config_validate(c, label, err);
}

int moh_attn_config_parse_json(moh_attn_config *c, const char *text, size_t len, const char *label,
                               moh_error *err) {
    if (!label) label = "<config>";
    if (!c || (!text && len > 0))
        return moh_fail(err, MOH_E_ARG, "%s: config or text is NULL", label);
    moh_attn_config_default(c);
    const json_reader rd = {label, JSON_STYLE_LAYER, err};
    moh_attn_config tmp;
    int rc = json_parse_with(&rd, text, len, cfg_from_json, &tmp);
    if (rc == MOH_OK) *c = tmp;
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * Decoder-LM config.json
 * ------------------------------------------------------------------------------------------- */

enum {
    L_HIDDEN,
    L_LAYERS,
    L_HEADS,
    L_KV,
    L_HEAD_DIM,
    L_INTER,
    L_EPS,
    L_ROPE,
    L_VOCAB,
    L_MAXPOS,
    L_TIE,
    L_ROUTER,
    L_SHARED,
    L_TOPK,
    L_BETA,
    L_MOH_COUNT, /* the keys above are used; the ones below are HF keys that are checked/ignored */
    L_HIDDEN_ACT = L_MOH_COUNT,
    L_ATTN_BIAS,
    L_MLP_BIAS,
    L_ROPE_SCALING,
    L_ARCH,
    L_MODEL_TYPE,
    L_TORCH_DTYPE,
    L_ATTN_DROPOUT,
    L_INIT_RANGE,
    L_BOS,
    L_EOS,
    L_PAD,
    L_PRETRAINING_TP,
    L_USE_CACHE,
    L_TF_VERSION,
    L_STE,
    L_COUNT
};
static const char *const LM_KEYS[L_COUNT] = {
    "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
    "intermediate_size", "rms_norm_eps", "rope_theta", "vocab_size", "max_position_embeddings",
    "tie_word_embeddings", "router", "shared_heads", "top_k", "load_balance_coef",
    /* HF LlamaConfig keys that moh does not use */
    "hidden_act", "attention_bias", "mlp_bias", "rope_scaling", "architectures", "model_type",
    "torch_dtype", "attention_dropout", "initializer_range", "bos_token_id", "eos_token_id",
    "pad_token_id", "pretraining_tp", "use_cache", "transformers_version",
    /* moh, after the HF keys so that the enum above stays in file order */
    "straight_through",
};

static int lm_from_json(void *out, const cJSON *root, const json_reader *rd) {
    moh_lm_config *c = out;
    const char *label = rd->label;
    moh_error *err = rd->err;
    char v[JSON_SHOW_BUF];
    const cJSON *f[L_COUNT];
    int rc = json_object_fields(
        rd, root, LM_KEYS, L_COUNT, f, "{\"hidden_size\": ...}",
        "expected hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads, "
        "head_dim, intermediate_size, rms_norm_eps, rope_theta, vocab_size, "
        "max_position_embeddings, tie_word_embeddings, router, shared_heads, top_k, "
        "load_balance_coef, straight_through, or a standard HF LlamaConfig key; prefix annotations "
        "with '_'");
    if (rc != MOH_OK) return rc;

    /* HF keys: accepted when they describe what moh computes, refused when they would change it. */
    if (f[L_HIDDEN_ACT] &&
        !(cJSON_IsString(f[L_HIDDEN_ACT]) && strcmp(f[L_HIDDEN_ACT]->valuestring, "silu") == 0))
        return moh_fail(err, MOH_E_CONFIG,
                        "%s: field 'hidden_act': expected \"silu\" (moh's MLP is SwiGLU), got %s",
                        label, json_show_value(rd, v, f[L_HIDDEN_ACT]));
    static const int no_bias[2] = {L_ATTN_BIAS, L_MLP_BIAS};
    for (int i = 0; i < 2; i++) {
        const cJSON *b = f[no_bias[i]];
        if (b && !cJSON_IsFalse(b))
            return moh_fail(err, MOH_E_CONFIG,
                            "%s: field '%s': expected false (moh has no %s biases), got %s", label,
                            LM_KEYS[no_bias[i]], i == 0 ? "attention" : "MLP",
                            json_show_value(rd, v, b));
    }
    if (f[L_ROPE_SCALING] && !cJSON_IsNull(f[L_ROPE_SCALING]))
        return moh_fail(err, MOH_E_CONFIG,
                        "%s: field 'rope_scaling': expected null (moh implements plain RoPE), got %s",
                        label, json_show_value(rd, v, f[L_ROPE_SCALING]));

    memset(c, 0, sizeof *c);
    c->rms_norm_eps = 1e-6;
    c->rope_theta = 10000.0;
    c->tie_word_embeddings = false;
    c->router = MOH_ROUTER_LEARNED;
    c->load_balance_coef = 0.01;

    /* Required sizes. */
    static const int req[6] = {L_HIDDEN, L_LAYERS, L_HEADS, L_INTER, L_VOCAB, L_MAXPOS};
    int *req_out[6] = {&c->hidden_size,       &c->num_hidden_layers, &c->num_attention_heads,
                       &c->intermediate_size, &c->vocab_size,        &c->max_position_embeddings};
    for (int i = 0; i < 6; i++) {
        if (!f[req[i]])
            return moh_fail(err, MOH_E_CONFIG, "%s: missing field '%s' (an integer > 0)", label,
                            LM_KEYS[req[i]]);
        if ((rc = json_get_int(rd, f[req[i]], LM_KEYS[req[i]], 1, INT_MAX, req_out[i]))) return rc;
    }
    /* Optional sizes: absent or null means the default (HF's None). */
    if (f[L_KV] && !cJSON_IsNull(f[L_KV]) &&
        (rc = json_get_int(rd, f[L_KV], "num_key_value_heads", 1, INT_MAX,
                           &c->num_key_value_heads)))
        return rc;
    if (f[L_HEAD_DIM] && !cJSON_IsNull(f[L_HEAD_DIM]) &&
        (rc = json_get_int(rd, f[L_HEAD_DIM], "head_dim", 1, INT_MAX, &c->head_dim)))
        return rc;
    if (f[L_EPS] && (rc = json_get_number(rd, f[L_EPS], "rms_norm_eps", &c->rms_norm_eps)))
        return rc;
    if (f[L_ROPE] && (rc = json_get_number(rd, f[L_ROPE], "rope_theta", &c->rope_theta)))
        return rc;
    if (f[L_TIE] &&
        (rc = json_get_bool(rd, f[L_TIE], "tie_word_embeddings", &c->tie_word_embeddings)))
        return rc;
    if (f[L_ROUTER] &&
        (rc = json_get_router(rd, f[L_ROUTER], "router", true,
                              "\"learned\", \"none\" or \"query_norm\"", &c->router)))
        return rc;
    if (f[L_SHARED] &&
        (rc = json_get_int(rd, f[L_SHARED], "shared_heads", 0, INT_MAX, &c->shared_heads)))
        return rc;
    if (f[L_TOPK] && (rc = json_get_int(rd, f[L_TOPK], "top_k", 0, INT_MAX, &c->top_k)))
        return rc;
    if (f[L_BETA] &&
        (rc = get_nonneg_number(rd, f[L_BETA], "load_balance_coef", &c->load_balance_coef)))
        return rc;
    c->straight_through = c->router == MOH_ROUTER_QUERY_NORM;
    if (f[L_STE] && (rc = json_get_bool(rd, f[L_STE], "straight_through", &c->straight_through)))
        return rc;

    /* Head counts, checked here so that the message names the field at fault (finalize would
     * otherwise report a derived quantity first). */
    const int h = c->num_attention_heads;
    if (c->num_key_value_heads > 0 && h % c->num_key_value_heads != 0)
        return moh_fail(err, MOH_E_CONFIG,
                        "%s: field 'num_key_value_heads': got %d, expected a divisor of "
                        "num_attention_heads %d",
                        label, c->num_key_value_heads, h);
    if (c->router != MOH_ROUTER_NONE) {
        if (c->shared_heads >= h)
            return moh_fail(err, MOH_E_CONFIG,
                            "%s: field 'shared_heads': got %d, expected 0..%d so that at least one "
                            "of the num_attention_heads %d heads is routed",
                            label, c->shared_heads, h - 1, h);
        if (c->top_k > h - c->shared_heads)
            return moh_fail(err, MOH_E_CONFIG,
                            "%s: field 'top_k': got %d, expected 1..%d (num_attention_heads %d - "
                            "shared_heads %d routed heads)",
                            label, c->top_k, h - c->shared_heads, h, c->shared_heads);
    }
    return moh_lm_config_finalize(c, label, err);
}

int moh_lm_config_parse_json(moh_lm_config *cfg, const char *text, size_t len, const char *label,
                             moh_error *err) {
    if (!label) label = "<config>";
    if (!cfg || (!text && len > 0))
        return moh_fail(err, MOH_E_ARG, "%s: config or text is NULL", label);
    memset(cfg, 0, sizeof *cfg);
    const json_reader rd = {label, JSON_STYLE_LAYER, err};
    moh_lm_config tmp;
    int rc = json_parse_with(&rd, text, len, lm_from_json, &tmp);
    if (rc == MOH_OK) *cfg = tmp;
    return rc;
}
