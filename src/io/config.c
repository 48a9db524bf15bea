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
#include <stdio.h>
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

/* The rope_scaling fields its type uses (moh.h; transformers' rope_config_validation, with its
 * warnings made errors). */
static int rope_scaling_validate(const moh_attn_config *c, const char *label, moh_error *err) {
    const moh_rope_scaling *s = &c->rope_scaling;
    if (s->type == MOH_ROPE_DEFAULT) return MOH_OK;
    const char *name = attn_rope_type_name(s->type);
    if (!name)
        return moh_fail(err, MOH_E_CONFIG, "%s: field 'rope_scaling.rope_type': got %d, expected "
                        "\"default\", \"linear\" or \"llama3\"", label, (int)s->type);
    if (!(c->rope_theta > 0))
        return moh_fail(err, MOH_E_CONFIG, "%s: field 'rope_scaling': rope_type \"%s\" needs RoPE, but "
                        "rope_theta is %g (expected > 0)", label, name, c->rope_theta);
    if (!(s->factor > 0) || isinf(s->factor))
        return moh_fail(err, MOH_E_CONFIG, "%s: field 'rope_scaling.factor': got %g, expected a finite "
                        "number > 0", label, s->factor);
    if (s->type != MOH_ROPE_LLAMA3) return MOH_OK;
    if (!(s->low_freq_factor > 0) || isinf(s->low_freq_factor))
        return moh_fail(err, MOH_E_CONFIG, "%s: field 'rope_scaling.low_freq_factor': got %g, expected a "
                        "finite number > 0", label, s->low_freq_factor);
    if (!(s->high_freq_factor > s->low_freq_factor) || isinf(s->high_freq_factor))
        return moh_fail(err, MOH_E_CONFIG, "%s: field 'rope_scaling.high_freq_factor': got %g, expected a "
                        "finite number > low_freq_factor %g", label, s->high_freq_factor, s->low_freq_factor);
    if (s->original_max_position_embeddings <= 0)
        return moh_fail(err, MOH_E_CONFIG, "%s: field 'rope_scaling.original_max_position_embeddings': "
                        "got %d, expected an integer > 0", label, s->original_max_position_embeddings);
    return MOH_OK;
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
    const int rrc = rope_scaling_validate(c, label, err);
    if (rrc != MOH_OK) return rrc;
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
    L_ROPE_PARAMS,
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
    L_DTYPE,
    L_IS_LLAMA,
    L_ROPE_INTERLEAVED,
    L_TFJS,
    L_STE,
    L_COUNT
};
static const char *const LM_KEYS[L_COUNT] = {
    "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
    "intermediate_size", "rms_norm_eps", "rope_theta", "vocab_size", "max_position_embeddings",
    "tie_word_embeddings", "router", "shared_heads", "top_k", "load_balance_coef",
    /* HF LlamaConfig keys that moh does not use */
    "hidden_act", "attention_bias", "mlp_bias", "rope_scaling", "rope_parameters", "architectures", "model_type",
    "torch_dtype", "attention_dropout", "initializer_range", "bos_token_id", "eos_token_id",
    "pad_token_id", "pretraining_tp", "use_cache", "transformers_version", "dtype",
    "is_llama_config", "rope_interleaved", "transformers.js_config",
    /* moh, after the HF keys so that the enum above stays in file order */
    "straight_through",
};

/* HF rope_scaling, or transformers 5's rope_parameters (the same keys plus rope_theta); obj names
 * which. Absent or null: no scaling. The type comes from "rope_type" or the older "type" (the
 * two must agree); each type takes exactly its own keys. A rope_theta inside the object replaces
 * *theta (transformers 5's order); one that contradicts a top-level rope_theta (theta_given) is
 * refused. Ranges are checked by moh_attn_config_validate. */
static int rope_scaling_from_json(const json_reader *rd, const cJSON *j, const char *obj,
                                  bool theta_given, moh_rope_scaling *s, double *theta) {
    enum { R_TYPE, R_OLD_TYPE, R_THETA, R_FACTOR, R_LOW, R_HIGH, R_ORIG, R_COUNT };
    static const char *const keys[R_COUNT] = {"rope_type", "type", "rope_theta", "factor", "low_freq_factor",
                                              "high_freq_factor", "original_max_position_embeddings"};
    static const char *const types[3] = {"default", "linear", "llama3"};
    /* the keys each type needs, in keys[] order from R_FACTOR */
    static const bool used[3][R_COUNT - R_FACTOR] = {{0, 0, 0, 0}, {1, 0, 0, 0}, {1, 1, 1, 1}};
    char v[JSON_SHOW_BUF], w[JSON_SHOW_BUF], example[128], expected[200], field[R_COUNT][80];
    const cJSON *f[R_COUNT];
    memset(s, 0, sizeof *s);
    if (!j || cJSON_IsNull(j)) return MOH_OK;
    snprintf(example, sizeof example, "(or null) for field '%s', e.g. {\"rope_type\": \"llama3\", ...}", obj);
    snprintf(expected, sizeof expected, "in '%s': expected rope_type (or type), rope_theta, factor, "
             "low_freq_factor, high_freq_factor, original_max_position_embeddings", obj);
    int rc = json_object_fields(rd, j, keys, R_COUNT, f, example, expected);
    if (rc != MOH_OK) return rc;
    for (int k = 0; k < R_COUNT; k++) snprintf(field[k], sizeof field[k], "%s.%s", obj, keys[k]);
    const int tk = f[R_OLD_TYPE] ? R_OLD_TYPE : R_TYPE;
    if (!f[tk])
        return moh_fail(rd->err, MOH_E_CONFIG, "%s: missing field '%s' (expected \"default\", \"linear\" "
                        "or \"llama3\")", rd->label, field[R_TYPE]);
    if (f[R_TYPE] && f[R_OLD_TYPE] &&
        !(cJSON_IsString(f[R_TYPE]) && cJSON_IsString(f[R_OLD_TYPE]) &&
          strcmp(f[R_TYPE]->valuestring, f[R_OLD_TYPE]->valuestring) == 0))
        return moh_fail(rd->err, MOH_E_CONFIG, "%s: fields '%s' %s and '%s' %s disagree, expected one type",
                        rd->label, field[R_TYPE], json_show_value(rd, v, f[R_TYPE]), field[R_OLD_TYPE],
                        json_show_value(rd, w, f[R_OLD_TYPE]));
    int t = 0;
    if ((rc = json_get_choice(rd, f[tk], field[tk], types, 3,
                              "\"default\", \"linear\" or \"llama3\" (the RoPE scalings moh implements)", &t)))
        return rc;
    for (int k = R_FACTOR; k < R_COUNT; k++) {
        if (!used[t][k - R_FACTOR] && f[k])
            return moh_fail(rd->err, MOH_E_CONFIG, "%s: field '%s': not a parameter of rope_type "
                            "\"%s\" (expected it absent)", rd->label, field[k], types[t]);
        if (used[t][k - R_FACTOR] && !f[k])
            return moh_fail(rd->err, MOH_E_CONFIG, "%s: missing field '%s', which rope_type \"%s\" "
                            "needs", rd->label, field[k], types[t]);
    }
    if (f[R_THETA]) {
        double th = 0;
        if ((rc = json_get_number(rd, f[R_THETA], field[R_THETA], &th))) return rc;
        if (theta_given && th != *theta)
            return moh_fail(rd->err, MOH_E_CONFIG, "%s: field '%s' is %s but rope_theta is %g, expected "
                            "one value", rd->label, field[R_THETA], json_show_value(rd, v, f[R_THETA]), *theta);
        *theta = th;
    }
    s->type = (moh_rope_type)t;
    double *const num[3] = {&s->factor, &s->low_freq_factor, &s->high_freq_factor};
    for (int k = R_FACTOR; k < R_ORIG; k++)
        if (f[k] && (rc = json_get_number(rd, f[k], field[k], num[k - R_FACTOR]))) return rc;
    if (f[R_ORIG] && (rc = json_get_int(rd, f[R_ORIG], field[R_ORIG], 1, INT_MAX,
                                        &s->original_max_position_embeddings)))
        return rc;
    return MOH_OK;
}

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
    if (f[L_ROPE_INTERLEAVED] && !cJSON_IsFalse(f[L_ROPE_INTERLEAVED]))
        return moh_fail(err, MOH_E_CONFIG,
                        "%s: field 'rope_interleaved': expected false (moh's RoPE rotates halves, as HF "
                        "LLaMA; interleaved pairs are not implemented), got %s",
                        label, json_show_value(rd, v, f[L_ROPE_INTERLEAVED]));
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
    memset(c, 0, sizeof *c);
    c->rms_norm_eps = 1e-6;
    c->rope_theta = 10000.0;
    c->tie_word_embeddings = false;
    /* A plain HF LlamaConfig (no MoH key) is the dense model it describes; MoH keys without a
     * router mean moh's default learned router. */
    c->router = f[L_SHARED] || f[L_TOPK] ? MOH_ROUTER_LEARNED : MOH_ROUTER_NONE;
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
    const bool scaling = f[L_ROPE_SCALING] && !cJSON_IsNull(f[L_ROPE_SCALING]);
    if (scaling && f[L_ROPE_PARAMS] && !cJSON_IsNull(f[L_ROPE_PARAMS]))
        return moh_fail(err, MOH_E_CONFIG, "%s: fields 'rope_scaling' and 'rope_parameters' are both given, "
                        "expected one of them", label);
    if ((rc = rope_scaling_from_json(rd, f[scaling ? L_ROPE_SCALING : L_ROPE_PARAMS],
                                     scaling ? "rope_scaling" : "rope_parameters", f[L_ROPE] != NULL,
                                     &c->rope_scaling, &c->rope_theta)))
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
