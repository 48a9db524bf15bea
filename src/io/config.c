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

#include <cjson/cJSON.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
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
    return MOH_OK;
}

/* ---------------------------------------------------------------------------------------------
 * JSON
 * ------------------------------------------------------------------------------------------- */

/* Shortest %g rendering of v that reads back as v (0.1, not 0.10000000000000001). */
static void cfg_num(char *buf, size_t cap, double v) {
    for (int p = 1; p <= 17; p++) {
        snprintf(buf, cap, "%.*g", p, v);
        if (strtod(buf, NULL) == v) return;
    }
}

/* Short rendering of a JSON value for messages. */
static const char *cfg_show(char *buf, size_t cap, const cJSON *j) {
    if (cJSON_IsNumber(j)) {
        cfg_num(buf, cap, j->valuedouble);
        return buf;
    }
    char *s = cJSON_PrintUnformatted(j);
    if (!s) {
        snprintf(buf, cap, "(a value)");
        return buf;
    }
    size_t n = strlen(s);
    if (n + 1 > cap && cap > 4) {
        /* cut, without splitting a UTF-8 sequence */
        size_t k = cap - 4;
        while (k > 0 && ((unsigned char)s[k] & 0xC0) == 0x80) k--;
        memcpy(buf, s, k);
        memcpy(buf + k, "...", 4);
    } else {
        snprintf(buf, cap, "%s", s);
    }
    cJSON_free(s);
    return buf;
}

/* Key name made safe for a one-line message (control characters escaped, long names cut). */
static const char *cfg_key(char *buf, size_t cap, const char *s) {
    static const char hex[] = "0123456789abcdef";
    size_t o = 0;
    for (size_t i = 0; s[i]; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (o + 8 > cap || i >= 80) {
            while (o > 0 && ((unsigned char)buf[o - 1] & 0xC0) == 0x80) o--;
            if (o > 0 && ((unsigned char)buf[o - 1] & 0xC0) == 0xC0) o--;
            memcpy(buf + o, "...", 3);
            o += 3;
            break;
        }
        if (ch < 0x20 || ch == 0x7f || ch == '\\' || ch == '\'') {
            buf[o++] = '\\';
            buf[o++] = 'x';
            buf[o++] = hex[ch >> 4];
            buf[o++] = hex[ch & 15];
        } else {
            buf[o++] = (char)ch;
        }
    }
    buf[o] = '\0';
    return buf;
}

static int cfg_int(const cJSON *j, const char *key, int *out, const char *label, moh_error *err) {
    char v[160];
    if (!cJSON_IsNumber(j))
        return moh_fail(err, MOH_E_CONFIG, "%s: field '%s': expected an integer, got %s", label, key,
                        cfg_show(v, sizeof v, j));
    double d = j->valuedouble;
    if (d != floor(d) || isinf(d))
        return moh_fail(err, MOH_E_CONFIG, "%s: field '%s': expected an integer, got %s", label, key,
                        cfg_show(v, sizeof v, j));
    if (!(d >= (double)INT_MIN && d <= (double)INT_MAX))
        return moh_fail(err, MOH_E_CONFIG,
                        "%s: field '%s': expected an integer in %d..%d, got %s", label, key,
                        INT_MIN, INT_MAX, cfg_show(v, sizeof v, j));
    *out = (int)d;
    return MOH_OK;
}

static int cfg_pos_int(const cJSON *j, const char *key, int *out, const char *label,
                       moh_error *err) {
    int rc = cfg_int(j, key, out, label, err);
    if (rc != MOH_OK) return rc;
    if (*out <= 0)
        return moh_fail(err, MOH_E_CONFIG, "%s: field '%s': expected an integer > 0, got %d", label,
                        key, *out);
    return MOH_OK;
}

static int cfg_bool(const cJSON *j, const char *key, bool *out, const char *label, moh_error *err) {
    char v[160];
    if (!cJSON_IsBool(j))
        return moh_fail(err, MOH_E_CONFIG, "%s: field '%s': expected true or false, got %s", label,
                        key, cfg_show(v, sizeof v, j));
    *out = cJSON_IsTrue(j);
    return MOH_OK;
}

static int cfg_number(const cJSON *j, const char *key, double *out, const char *label,
                      moh_error *err) {
    char v[160];
    if (!cJSON_IsNumber(j) || isnan(j->valuedouble) || isinf(j->valuedouble))
        return moh_fail(err, MOH_E_CONFIG, "%s: field '%s': expected a finite number, got %s",
                        label, key, cfg_show(v, sizeof v, j));
    *out = j->valuedouble;
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
    K_COUNT
};
static const char *const CFG_KEYS[K_COUNT] = {
    "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
    "shared_heads", "top_k", "router", "causal", "qkv_bias", "proj_bias", "rope_theta",
    "load_balance_coef",
};

/* Line and column (1-based) of byte offset at in text. */
static void cfg_line_col(const char *text, size_t at, int *line, int *col) {
    *line = 1;
    *col = 1;
    for (size_t i = 0; i < at; i++) {
        if (text[i] == '\n') {
            ++*line;
            *col = 1;
        } else {
            ++*col;
        }
    }
}

static int cfg_from_json(moh_attn_config *c, const cJSON *root, const char *label,
                         moh_error *err) {
    char v[160], k[120];
    const cJSON *f[K_COUNT] = {0};
    if (!cJSON_IsObject(root))
        return moh_fail(err, MOH_E_CONFIG, "%s: expected a JSON object {\"hidden_size\": ...}, got %s",
                        label, cfg_show(v, sizeof v, root));
    for (const cJSON *e = root->child; e; e = e->next) {
        const char *key = e->string ? e->string : "";
        if (key[0] == '_' || strncmp(key, "comment", 7) == 0) continue;
        int id = -1;
        for (int i = 0; i < K_COUNT; i++)
            if (strcmp(key, CFG_KEYS[i]) == 0) id = i;
        if (id < 0)
            return moh_fail(err, MOH_E_CONFIG,
                            "%s: unknown field '%s' (expected one of hidden_size, "
                            "num_attention_heads, num_key_value_heads, head_dim, shared_heads, "
                            "top_k, router, causal, qkv_bias, proj_bias, rope_theta, "
                            "load_balance_coef; prefix annotations with '_')",
                            label, cfg_key(k, sizeof k, key));
        if (f[id])
            return moh_fail(err, MOH_E_CONFIG, "%s: field '%s' appears twice", label, key);
        f[id] = e;
    }

    int rc;
    moh_attn_config_default(c);
    if (!f[K_HIDDEN])
        return moh_fail(err, MOH_E_CONFIG, "%s: missing field 'hidden_size' (an integer > 0)",
                        label);
    if ((rc = cfg_pos_int(f[K_HIDDEN], "hidden_size", &c->hidden_size, label, err))) return rc;
    if (!f[K_HEADS])
        return moh_fail(err, MOH_E_CONFIG,
                        "%s: missing field 'num_attention_heads' (an integer > 0)", label);
    if ((rc = cfg_pos_int(f[K_HEADS], "num_attention_heads", &c->n_heads, label, err))) return rc;

    c->n_kv_heads = c->n_heads;
    if (f[K_KV]) {
        if ((rc = cfg_pos_int(f[K_KV], "num_key_value_heads", &c->n_kv_heads, label, err)))
            return rc;
        if (c->n_heads % c->n_kv_heads != 0)
            return moh_fail(err, MOH_E_CONFIG,
                            "%s: field 'num_key_value_heads': got %d, expected a divisor of "
                            "num_attention_heads %d",
                            label, c->n_kv_heads, c->n_heads);
    }

    if (f[K_HEAD_DIM]) {
        if ((rc = cfg_pos_int(f[K_HEAD_DIM], "head_dim", &c->head_dim, label, err))) return rc;
    } else {
        if (c->hidden_size % c->n_heads != 0)
            return moh_fail(err, MOH_E_CONFIG,
                            "%s: field 'head_dim' is absent and hidden_size %d is not divisible by "
                            "num_attention_heads %d; expected head_dim given explicitly or "
                            "hidden_size a multiple of num_attention_heads",
                            label, c->hidden_size, c->n_heads);
        c->head_dim = c->hidden_size / c->n_heads;
    }

    if (f[K_SHARED] && (rc = cfg_int(f[K_SHARED], "shared_heads", &c->shared_heads, label, err)))
        return rc;
    if (f[K_TOPK] && (rc = cfg_int(f[K_TOPK], "top_k", &c->top_k, label, err))) return rc;

    if (f[K_ROUTER]) {
        const cJSON *r = f[K_ROUTER];
        const char *s = cJSON_IsString(r) ? r->valuestring : NULL;
        if (s && strcmp(s, "learned") == 0) c->router = MOH_ROUTER_LEARNED;
        else if (s && strcmp(s, "query_norm") == 0) c->router = MOH_ROUTER_QUERY_NORM;
        else if (s && strcmp(s, "none") == 0) c->router = MOH_ROUTER_NONE;
        else
            return moh_fail(err, MOH_E_CONFIG,
                            "%s: field 'router': expected \"learned\", \"query_norm\" or \"none\", "
                            "got %s",
                            label, cfg_show(v, sizeof v, r));
    }

    if (f[K_CAUSAL] && (rc = cfg_bool(f[K_CAUSAL], "causal", &c->causal, label, err))) return rc;
    if (f[K_QKV_BIAS] && (rc = cfg_bool(f[K_QKV_BIAS], "qkv_bias", &c->qkv_bias, label, err)))
        return rc;
    if (f[K_PROJ_BIAS] && (rc = cfg_bool(f[K_PROJ_BIAS], "proj_bias", &c->proj_bias, label, err)))
        return rc;

    if (f[K_ROPE] && !cJSON_IsNull(f[K_ROPE])) {
        if (!cJSON_IsNumber(f[K_ROPE]) || !(f[K_ROPE]->valuedouble > 0) ||
            isinf(f[K_ROPE]->valuedouble))
            return moh_fail(err, MOH_E_CONFIG,
                            "%s: field 'rope_theta': expected a finite number > 0 (or null for no "
                            "RoPE), got %s",
                            label, cfg_show(v, sizeof v, f[K_ROPE]));
        c->rope_theta = f[K_ROPE]->valuedouble;
    }
    if (f[K_BETA]) {
        if ((rc = cfg_number(f[K_BETA], "load_balance_coef", &c->load_balance_coef, label, err)))
            return rc;
        if (c->load_balance_coef < 0)
            return moh_fail(err, MOH_E_CONFIG,
                            "%s: field 'load_balance_coef': expected a number >= 0, got %s", label,
                            cfg_show(v, sizeof v, f[K_BETA]));
    }
    return moh_attn_config_validate(c, label, err);
}

/* Parses text (len bytes, not necessarily NUL-terminated) into *root; syntax errors are
 * MOH_E_FORMAT with line and column. */
static int cfg_parse_root(const char *text, size_t len, const char *label, cJSON **root,
                          moh_error *err) {
    *root = NULL;
    if (len == 0) return moh_fail(err, MOH_E_CONFIG, "%s: empty, expected a JSON object", label);
    /* cJSON reads a NUL-terminated private copy: nothing past text + len is ever touched. */
    char *copy = malloc(len + 1);
    if (!copy) return moh_fail(err, MOH_E_NOMEM, "%s: out of memory (%zu bytes)", label, len);
    memcpy(copy, text, len);
    copy[len] = '\0';
    const char *end = NULL;
    cJSON *r = cJSON_ParseWithLengthOpts(copy, len, &end, 0);
    size_t bad = len; /* offset of the first byte after a syntax error, len when none */
    if (!r) {
        bad = end && end >= copy && end <= copy + len ? (size_t)(end - copy) : 0;
    } else {
        for (const char *q = end; q && q < copy + len; q++)
            if (*q != ' ' && *q != '\t' && *q != '\n' && *q != '\r') {
                bad = (size_t)(q - copy);
                break;
            }
    }
    if (bad < len || !r) {
        int line, col;
        cfg_line_col(copy, bad, &line, &col);
        int rc = moh_fail(err, MOH_E_FORMAT, "%s: not valid JSON (%s at line %d, column %d)", label,
                          r ? "unexpected text after the object" : "syntax error", line, col);
        cJSON_Delete(r);
        free(copy);
        return rc;
    }
    free(copy);
    *root = r;
    return MOH_OK;
}

int moh_attn_config_parse_json(moh_attn_config *c, const char *text, size_t len, const char *label,
                               moh_error *err) {
    if (!label) label = "<config>";
    if (!c || (!text && len > 0))
        return moh_fail(err, MOH_E_ARG, "%s: config or text is NULL", label);
    moh_attn_config_default(c);
    cJSON *root;
    int rc = cfg_parse_root(text, len, label, &root, err);
    if (rc != MOH_OK) return rc;
    moh_attn_config tmp;
    rc = cfg_from_json(&tmp, root, label, err);
    cJSON_Delete(root);
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
};

/* Optional non-negative integer. */
static int cfg_nonneg_int(const cJSON *j, const char *key, int *out, const char *label,
                          moh_error *err) {
    int rc = cfg_int(j, key, out, label, err);
    if (rc != MOH_OK) return rc;
    if (*out < 0)
        return moh_fail(err, MOH_E_CONFIG, "%s: field '%s': expected an integer >= 0, got %d",
                        label, key, *out);
    return MOH_OK;
}

static int lm_from_json(moh_lm_config *c, const cJSON *root, const char *label, moh_error *err) {
    char v[160], k[120];
    const cJSON *f[L_COUNT] = {0};
    if (!cJSON_IsObject(root))
        return moh_fail(err, MOH_E_CONFIG,
                        "%s: expected a JSON object {\"hidden_size\": ...}, got %s", label,
                        cfg_show(v, sizeof v, root));
    for (const cJSON *e = root->child; e; e = e->next) {
        const char *key = e->string ? e->string : "";
        if (key[0] == '_' || strncmp(key, "comment", 7) == 0) continue;
        int id = -1;
        for (int i = 0; i < L_COUNT && id < 0; i++)
            if (strcmp(key, LM_KEYS[i]) == 0) id = i;
        if (id < 0)
            return moh_fail(err, MOH_E_CONFIG,
                            "%s: unknown field '%s' (expected hidden_size, num_hidden_layers, "
                            "num_attention_heads, num_key_value_heads, head_dim, intermediate_size, "
                            "rms_norm_eps, rope_theta, vocab_size, max_position_embeddings, "
                            "tie_word_embeddings, router, shared_heads, top_k, load_balance_coef, "
                            "or a standard HF LlamaConfig key; prefix annotations with '_')",
                            label, cfg_key(k, sizeof k, key));
        if (f[id])
            return moh_fail(err, MOH_E_CONFIG, "%s: field '%s' appears twice", label, key);
        f[id] = e;
    }

    /* HF keys: accepted when they describe what moh computes, refused when they would change it. */
    if (f[L_HIDDEN_ACT] &&
        !(cJSON_IsString(f[L_HIDDEN_ACT]) && strcmp(f[L_HIDDEN_ACT]->valuestring, "silu") == 0))
        return moh_fail(err, MOH_E_CONFIG,
                        "%s: field 'hidden_act': expected \"silu\" (moh's MLP is SwiGLU), got %s",
                        label, cfg_show(v, sizeof v, f[L_HIDDEN_ACT]));
    static const int no_bias[2] = {L_ATTN_BIAS, L_MLP_BIAS};
    for (int i = 0; i < 2; i++) {
        const cJSON *b = f[no_bias[i]];
        if (b && !cJSON_IsFalse(b))
            return moh_fail(err, MOH_E_CONFIG,
                            "%s: field '%s': expected false (moh has no %s biases), got %s", label,
                            LM_KEYS[no_bias[i]], i == 0 ? "attention" : "MLP",
                            cfg_show(v, sizeof v, b));
    }
    if (f[L_ROPE_SCALING] && !cJSON_IsNull(f[L_ROPE_SCALING]))
        return moh_fail(err, MOH_E_CONFIG,
                        "%s: field 'rope_scaling': expected null (moh implements plain RoPE), got %s",
                        label, cfg_show(v, sizeof v, f[L_ROPE_SCALING]));

    int rc;
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
        if ((rc = cfg_pos_int(f[req[i]], LM_KEYS[req[i]], req_out[i], label, err))) return rc;
    }
    /* Optional sizes: absent or null means the default (HF's None). */
    if (f[L_KV] && !cJSON_IsNull(f[L_KV]) &&
        (rc = cfg_pos_int(f[L_KV], "num_key_value_heads", &c->num_key_value_heads, label, err)))
        return rc;
    if (f[L_HEAD_DIM] && !cJSON_IsNull(f[L_HEAD_DIM]) &&
        (rc = cfg_pos_int(f[L_HEAD_DIM], "head_dim", &c->head_dim, label, err)))
        return rc;
    if (f[L_EPS] && (rc = cfg_number(f[L_EPS], "rms_norm_eps", &c->rms_norm_eps, label, err)))
        return rc;
    if (f[L_ROPE] && (rc = cfg_number(f[L_ROPE], "rope_theta", &c->rope_theta, label, err)))
        return rc;
    if (f[L_TIE] &&
        (rc = cfg_bool(f[L_TIE], "tie_word_embeddings", &c->tie_word_embeddings, label, err)))
        return rc;
    if (f[L_ROUTER]) {
        const cJSON *r = f[L_ROUTER];
        const char *s = cJSON_IsString(r) ? r->valuestring : NULL;
        if (s && strcmp(s, "learned") == 0) c->router = MOH_ROUTER_LEARNED;
        else if (s && strcmp(s, "query_norm") == 0) c->router = MOH_ROUTER_QUERY_NORM;
        else if (s && strcmp(s, "none") == 0) c->router = MOH_ROUTER_NONE;
        else
            return moh_fail(err, MOH_E_CONFIG,
                            "%s: field 'router': expected \"learned\", \"none\" or "
                            "\"query_norm\", got %s",
                            label, cfg_show(v, sizeof v, r));
    }
    if (f[L_SHARED] &&
        (rc = cfg_nonneg_int(f[L_SHARED], "shared_heads", &c->shared_heads, label, err)))
        return rc;
    if (f[L_TOPK] && (rc = cfg_nonneg_int(f[L_TOPK], "top_k", &c->top_k, label, err))) return rc;
    if (f[L_BETA]) {
        if ((rc = cfg_number(f[L_BETA], "load_balance_coef", &c->load_balance_coef, label, err)))
            return rc;
        if (c->load_balance_coef < 0)
            return moh_fail(err, MOH_E_CONFIG,
                            "%s: field 'load_balance_coef': expected a number >= 0, got %s", label,
                            cfg_show(v, sizeof v, f[L_BETA]));
    }

    /* Head counts, checked here so that the message names the field at fault (finalize would
     * otherwise report a derived quantity first). */
    const int h = c->num_attention_heads;
    if (c->num_key_value_heads > 0 && h % c->num_key_value_heads != 0)
        return moh_fail(err, MOH_E_CONFIG,
                        "%s: field 'num_key_value_heads': got %d, expected a divisor of "
                        "num_attention_heads %d",
                        label, c->num_key_value_heads, h);
    if (c->router == MOH_ROUTER_LEARNED) {
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
    cJSON *root;
    int rc = cfg_parse_root(text, len, label, &root, err);
    if (rc != MOH_OK) return rc;
    moh_lm_config tmp;
    rc = lm_from_json(&tmp, root, label, err);
    cJSON_Delete(root);
    if (rc == MOH_OK) *cfg = tmp;
    return rc;
}
