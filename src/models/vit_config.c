/* ViT config.json: parsing (cJSON), validation, derived fields and output.
 *
 * Keys follow timm's VisionTransformer arguments (img_size, patch_size, in_chans, num_classes,
 * embed_dim, depth, num_heads, mlp_ratio, class_token, global_pool) plus model_type "vit", the MoH
 * fields (router, shared_heads, top_k, load_balance_coef; spec §1, §2, §10), the training loss's
 * label_smoothing, and the input normalisation mean/std (per channel, of pixel / 255; timm's
 * pretrained_cfg names). Unknown keys are errors so a typo never falls back to a default; keys
 * starting with "_" or "comment" are annotations. Every message names the label (file), the field,
 * the value found and what was expected, on one line. */
#include <cjson/cJSON.h>

#include "io/json_util.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/vit.h"

enum {
    K_MODEL_TYPE, K_IMG, K_PATCH, K_CHANS, K_CLASSES, K_DIM, K_DEPTH, K_HEADS, K_MLP, K_CLS,
    K_POOL, K_SHARED, K_TOPK, K_ROUTER, K_BETA, K_SMOOTH, K_MEAN, K_STD, K_COUNT
};
static const char *const KEYS[K_COUNT] = {
    "model_type", "img_size", "patch_size", "in_chans", "num_classes", "embed_dim", "depth",
    "num_heads", "mlp_ratio", "class_token", "global_pool", "shared_heads", "top_k", "router",
    "load_balance_coef", "label_smoothing", "mean", "std"};

/* Short one-line rendering of a JSON value for messages (control characters escaped). */
static const char *show(char *buf, size_t cap, const cJSON *j) {
    char *s = cJSON_PrintUnformatted(j);
    if (!s) {
        snprintf(buf, cap, "(a value)");
        return buf;
    }
    size_t o = 0;
    for (size_t i = 0; s[i] && o + 8 < cap; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch < 0x20 || ch == 0x7f) o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", ch);
        else buf[o++] = (char)ch;
    }
    if (s[0] && o + 8 >= cap) {
        while (o > 0 && ((unsigned char)buf[o - 1] & 0xC0) == 0x80) o--; /* no split UTF-8 */
        if (o > 0 && ((unsigned char)buf[o - 1] & 0xC0) == 0xC0) o--;
        memcpy(buf + o, "...", 3);
        o += 3;
    }
    buf[o] = '\0';
    cJSON_free(s);
    return buf;
}

/* A key made safe for a one-line message. */
static const char *safe_key(char *buf, size_t cap, const char *s) {
    size_t o = 0;
    for (size_t i = 0; s[i] && o + 8 < cap; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch < 0x20 || ch == 0x7f || ch == '\'') o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", ch);
        else buf[o++] = (char)ch;
    }
    while (o > 0 && ((unsigned char)buf[o - 1] & 0xC0) == 0xC0) o--;
    buf[o] = '\0';
    return buf;
}

static int get_int(const cJSON *j, const char *key, int lo, int hi, int *out, const char *label,
                   moh_error *err) {
    char v[96];
    if (!cJSON_IsNumber(j) || j->valuedouble != floor(j->valuedouble) || !(j->valuedouble >= lo) ||
        !(j->valuedouble <= hi))
        return moh_fail(err, MOH_E_CONFIG, "%s: field '%s': expected an integer in %d..%d, got %s",
                        label, key, lo, hi, show(v, sizeof v, j));
    *out = (int)j->valuedouble;
    return MOH_OK;
}

static int get_num(const cJSON *j, const char *key, double *out, const char *label, moh_error *err) {
    char v[96];
    if (!cJSON_IsNumber(j) || !isfinite(j->valuedouble))
        return moh_fail(err, MOH_E_CONFIG, "%s: field '%s': expected a finite number, got %s",
                        label, key, show(v, sizeof v, j));
    *out = j->valuedouble;
    return MOH_OK;
}

static int get_bool(const cJSON *j, const char *key, bool *out, const char *label, moh_error *err) {
    char v[96];
    if (!cJSON_IsBool(j))
        return moh_fail(err, MOH_E_CONFIG, "%s: field '%s': expected true or false, got %s", label,
                        key, show(v, sizeof v, j));
    *out = cJSON_IsTrue(j);
    return MOH_OK;
}

/* Reads a per-channel array of finite numbers into out (count in *n). */
static int get_chan_array(const cJSON *j, const char *key, double *out, int *n, const char *label,
                          moh_error *err) {
    char v[96];
    const int cnt = cJSON_IsArray(j) ? cJSON_GetArraySize(j) : -1;
    if (cnt < 1 || cnt > VIT_MAX_CHANS)
        return moh_fail(err, MOH_E_CONFIG, "%s: field '%s': expected an array of 1..%d numbers (one "
                        "per input channel), got %s", label, key, VIT_MAX_CHANS, show(v, sizeof v, j));
    int i = 0;
    for (const cJSON *e = j->child; e; e = e->next, i++) {
        if (!cJSON_IsNumber(e) || !isfinite(e->valuedouble))
            return moh_fail(err, MOH_E_CONFIG, "%s: field '%s': element %d is %s, expected a finite number",
                            label, key, i, show(v, sizeof v, e));
        out[i] = e->valuedouble;
    }
    *n = cnt;
    return MOH_OK;
}

static const char *router_name(moh_router r) {
    return r == MOH_ROUTER_LEARNED ? "learned" : r == MOH_ROUTER_QUERY_NORM ? "query_norm" : "none";
}

int moh_vit_config_finalize(moh_vit_config *c, const char *label, moh_error *err) {
    if (!label) label = "<config>";
    const struct { const char *name; int v, lo, hi; } ints[] = {
        {"img_size", c->img_size, 1, 4096},     {"patch_size", c->patch_size, 1, 4096},
        {"in_chans", c->in_chans, 1, VIT_MAX_CHANS}, {"num_classes", c->num_classes, 2, 1 << 20},
        {"embed_dim", c->embed_dim, 1, 65536},  {"depth", c->depth, 1, 1024},
        {"num_heads", c->num_heads, 1, 4096}};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        if (ints[i].v < ints[i].lo || ints[i].v > ints[i].hi)
            return moh_fail(err, MOH_E_CONFIG, "%s: field '%s' is %d, expected an integer in %d..%d",
                            label, ints[i].name, ints[i].v, ints[i].lo, ints[i].hi);
    if (c->img_size % c->patch_size)
        return moh_fail(err, MOH_E_CONFIG, "%s: field 'patch_size' is %d, expected a divisor of "
                        "img_size %d", label, c->patch_size, c->img_size);
    if (c->embed_dim % c->num_heads)
        return moh_fail(err, MOH_E_CONFIG, "%s: field 'num_heads' is %d, expected a divisor of "
                        "embed_dim %d (head_dim = embed_dim / num_heads, as timm)",
                        label, c->num_heads, c->embed_dim);
    const double hidden = (double)c->embed_dim * c->mlp_ratio;
    if (!(c->mlp_ratio > 0) || !(hidden >= 1) || hidden > (double)(1 << 20))
        return moh_fail(err, MOH_E_CONFIG, "%s: field 'mlp_ratio' is %g, expected a number > 0 with "
                        "1 <= int(embed_dim * mlp_ratio) <= 2^20", label, c->mlp_ratio);
    if (c->global_pool != VIT_POOL_TOKEN && c->global_pool != VIT_POOL_AVG)
        return moh_fail(err, MOH_E_CONFIG, "%s: field 'global_pool' is %d, expected \"token\" or "
                        "\"avg\"", label, (int)c->global_pool);
    if (c->global_pool == VIT_POOL_TOKEN && !c->class_token)
        return moh_fail(err, MOH_E_CONFIG, "%s: field 'global_pool' is \"token\" with class_token "
                        "false, expected \"avg\" (token pooling needs the class token, as timm)", label);
    if (!(c->load_balance_coef >= 0) || !isfinite(c->load_balance_coef))
        return moh_fail(err, MOH_E_CONFIG, "%s: field 'load_balance_coef' is %g, expected a finite "
                        "number >= 0", label, c->load_balance_coef);
    if (!(c->label_smoothing >= 0) || !(c->label_smoothing < 1))
        return moh_fail(err, MOH_E_CONFIG, "%s: field 'label_smoothing' is %g, expected a number in "
                        "[0, 1)", label, c->label_smoothing);
    if (c->router != MOH_ROUTER_LEARNED && c->router != MOH_ROUTER_NONE)
        return moh_fail(err, MOH_E_CONFIG, "%s: field 'router' is \"%s\", expected \"learned\" or "
                        "\"none\" (the ViT trains the learned router; none = dense MHA)",
                        label, router_name(c->router));
    if (c->n_norm != 0 && c->n_norm != c->in_chans)
        return moh_fail(err, MOH_E_CONFIG, "%s: fields 'mean'/'std' have %d values, expected "
                        "in_chans = %d", label, c->n_norm, c->in_chans);
    for (int i = 0; i < c->n_norm; i++)
        if (!isfinite(c->mean[i]) || !(c->std[i] > 0) || !isfinite(c->std[i]))
            return moh_fail(err, MOH_E_CONFIG, "%s: field 'std' element %d is %g (mean %g), expected "
                            "a finite number > 0 and a finite mean", label, i, c->std[i], c->mean[i]);
    const long ntok = (long)(c->img_size / c->patch_size) * (c->img_size / c->patch_size) + c->class_token;
    if (ntok > 65536 || (long)c->in_chans * c->patch_size * c->patch_size > (1L << 24))
        return moh_fail(err, MOH_E_CONFIG, "%s: (img_size / patch_size)^2 = %ld tokens or "
                        "in_chans * patch_size^2 too large (expected <= 65536 tokens, <= 2^24 "
                        "values per patch)", label, ntok);
    if (c->router == MOH_ROUTER_NONE) {
        c->shared_heads = 0;
        c->top_k = 0;
    }
    c->grid = c->img_size / c->patch_size;
    c->num_patches = c->grid * c->grid;
    c->num_tokens = c->num_patches + (c->class_token ? 1 : 0);
    c->patch_dim = c->in_chans * c->patch_size * c->patch_size;
    c->mlp_hidden = (int)hidden; /* timm: int(embed_dim * mlp_ratio) */
    moh_attn_config *a = &c->attn;
    moh_attn_config_default(a);
    a->hidden_size = c->embed_dim;
    a->n_heads = c->num_heads;
    a->n_kv_heads = c->num_heads;
    a->head_dim = c->embed_dim / c->num_heads;
    a->shared_heads = c->shared_heads;
    a->top_k = c->top_k;
    a->router = c->router;
    a->causal = false;
    a->qkv_bias = true;
    a->proj_bias = true;
    a->fused_qkv = true;
    a->rope_theta = 0;
    a->load_balance_coef = c->load_balance_coef;
    if (c->router == MOH_ROUTER_LEARNED && c->top_k < 1 && c->shared_heads != c->num_heads)
        return moh_fail(err, MOH_E_CONFIG, "%s: field 'top_k' is %d, expected 1..%d routed heads "
                        "for router \"learned\" (or shared_heads = num_heads %d; router \"none\" "
                        "for dense attention)", label, c->top_k, c->num_heads - c->shared_heads,
                        c->num_heads);
    return moh_attn_config_validate(a, label, err);
}

static void set_defaults(moh_vit_config *c) {
    memset(c, 0, sizeof *c);
    c->img_size = 28;
    c->patch_size = 4;
    c->in_chans = 1;
    c->num_classes = 10;
    c->mlp_ratio = 4.0;
    c->class_token = true;
    c->router = MOH_ROUTER_LEARNED;
    c->load_balance_coef = 0.01;
    c->label_smoothing = 0.1;
}

static int from_json(moh_vit_config *c, const cJSON *root, const char *label, moh_error *err) {
    char v[96], k[96];
    const cJSON *f[K_COUNT] = {0};
    if (!cJSON_IsObject(root))
        return moh_fail(err, MOH_E_CONFIG, "%s: expected a JSON object {\"model_type\": \"vit\", ...}, got %s",
                        label, show(v, sizeof v, root));
    for (const cJSON *e = root->child; e; e = e->next) {
        const char *key = e->string ? e->string : "";
        if (key[0] == '_' || strncmp(key, "comment", 7) == 0) continue;
        int id = -1;
        for (int i = 0; i < K_COUNT; i++)
            if (!strcmp(key, KEYS[i])) id = i;
        if (id < 0)
            return moh_fail(err, MOH_E_CONFIG, "%s: unknown field '%s' (expected one of model_type, "
                            "img_size, patch_size, in_chans, num_classes, embed_dim, depth, "
                            "num_heads, mlp_ratio, class_token, global_pool, router, shared_heads, "
                            "top_k, load_balance_coef, label_smoothing, mean, std; prefix "
                            "annotations with '_')", label, safe_key(k, sizeof k, key));
        if (f[id]) return moh_fail(err, MOH_E_CONFIG, "%s: field '%s' appears twice", label, KEYS[id]);
        f[id] = e;
    }
    set_defaults(c);
    if (!f[K_MODEL_TYPE] || !cJSON_IsString(f[K_MODEL_TYPE]) || strcmp(f[K_MODEL_TYPE]->valuestring, "vit"))
        return moh_fail(err, MOH_E_CONFIG, "%s: field 'model_type' is %s, expected \"vit\"", label,
                        f[K_MODEL_TYPE] ? show(v, sizeof v, f[K_MODEL_TYPE]) : "missing");
    const struct { int id; int *dst; int lo, hi; bool required; } ints[] = {
        {K_IMG, &c->img_size, 1, 4096, false},        {K_PATCH, &c->patch_size, 1, 4096, false},
        {K_CHANS, &c->in_chans, 1, VIT_MAX_CHANS, false}, {K_CLASSES, &c->num_classes, 2, 1 << 20, false},
        {K_DIM, &c->embed_dim, 1, 65536, true},       {K_DEPTH, &c->depth, 1, 1024, true},
        {K_HEADS, &c->num_heads, 1, 4096, true},      {K_SHARED, &c->shared_heads, 0, 4096, false},
        {K_TOPK, &c->top_k, 0, 4096, false}};
    int rc;
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        const cJSON *j = f[ints[i].id];
        if (!j && ints[i].required)
            return moh_fail(err, MOH_E_CONFIG, "%s: missing field '%s' (an integer in %d..%d)", label,
                            KEYS[ints[i].id], ints[i].lo, ints[i].hi);
        if (j && (rc = get_int(j, KEYS[ints[i].id], ints[i].lo, ints[i].hi, ints[i].dst, label, err)))
            return rc;
    }
    if (f[K_MLP] && (rc = get_num(f[K_MLP], "mlp_ratio", &c->mlp_ratio, label, err))) return rc;
    if (f[K_BETA] && (rc = get_num(f[K_BETA], "load_balance_coef", &c->load_balance_coef, label, err))) return rc;
    if (f[K_SMOOTH] && (rc = get_num(f[K_SMOOTH], "label_smoothing", &c->label_smoothing, label, err))) return rc;
    if (f[K_CLS] && (rc = get_bool(f[K_CLS], "class_token", &c->class_token, label, err))) return rc;
    c->global_pool = c->class_token ? VIT_POOL_TOKEN : VIT_POOL_AVG;
    if (f[K_POOL]) {
        const char *s = cJSON_IsString(f[K_POOL]) ? f[K_POOL]->valuestring : NULL;
        if (s && !strcmp(s, "token")) c->global_pool = VIT_POOL_TOKEN;
        else if (s && !strcmp(s, "avg")) c->global_pool = VIT_POOL_AVG;
        else
            return moh_fail(err, MOH_E_CONFIG, "%s: field 'global_pool': expected \"token\" or \"avg\", got %s",
                            label, show(v, sizeof v, f[K_POOL]));
    }
    if (f[K_ROUTER]) {
        const char *s = cJSON_IsString(f[K_ROUTER]) ? f[K_ROUTER]->valuestring : NULL;
        if (s && !strcmp(s, "learned")) c->router = MOH_ROUTER_LEARNED;
        else if (s && !strcmp(s, "none")) c->router = MOH_ROUTER_NONE;
        else
            return moh_fail(err, MOH_E_CONFIG, "%s: field 'router': expected \"learned\" or \"none\", got %s",
                            label, show(v, sizeof v, f[K_ROUTER]));
    }
    if (!f[K_MEAN] != !f[K_STD])
        return moh_fail(err, MOH_E_CONFIG, "%s: field '%s' is missing, expected both 'mean' and 'std' "
                        "or neither", label, f[K_MEAN] ? "std" : "mean");
    if (f[K_MEAN]) {
        int nm = 0, ns = 0;
        if ((rc = get_chan_array(f[K_MEAN], "mean", c->mean, &nm, label, err))) return rc;
        if ((rc = get_chan_array(f[K_STD], "std", c->std, &ns, label, err))) return rc;
        if (nm != ns)
            return moh_fail(err, MOH_E_CONFIG, "%s: fields 'mean' and 'std' have %d and %d values, "
                            "expected the same count (in_chans)", label, nm, ns);
        c->n_norm = nm;
    }
    return moh_vit_config_finalize(c, label, err);
}

/* Parses text[0..len) (not NUL-terminated) into a cJSON tree; syntax errors give line/column. */
static cJSON *parse_text(const char *text, size_t len, const char *label, moh_error *err) {
    if (len == 0) {
        moh_fail(err, MOH_E_FORMAT, "%s: empty, expected a JSON object", label);
        return NULL;
    }
    char *copy = malloc(len + 1);
    if (!copy) {
        moh_fail(err, MOH_E_NOMEM, "%s: out of memory (%zu bytes)", label, len);
        return NULL;
    }
    memcpy(copy, text, len);
    copy[len] = '\0';
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(copy, len, &end, 0);
    size_t bad = len;
    if (!root) bad = end && end >= copy && end <= copy + len ? (size_t)(end - copy) : 0;
    else
        for (const char *q = end; q && q < copy + len; q++)
            if (*q != ' ' && *q != '\t' && *q != '\n' && *q != '\r') {
                bad = (size_t)(q - copy);
                break;
            }
    if (!root || bad < len) {
        int line = 1, col = 1;
        for (size_t i = 0; i < bad && i < len; i++) {
            if (copy[i] == '\n') line++, col = 1;
            else col++;
        }
        moh_fail(err, MOH_E_FORMAT, "%s: not valid JSON (%s at line %d, column %d)", label,
                 root ? "unexpected text after the object" : "syntax error", line, col);
        cJSON_Delete(root);
        root = NULL;
    }
    free(copy);
    return root;
}

int moh_vit_config_parse_json(moh_vit_config *cfg, const char *text, size_t len, const char *label,
                              moh_error *err) {
    if (!label) label = "<config>";
    if (!cfg || (!text && len > 0)) return moh_fail(err, MOH_E_ARG, "%s: config or text is NULL", label);
    cJSON *root = parse_text(text, len, label, err);
    if (!root) return err ? err->code : MOH_E_FORMAT;
    moh_vit_config tmp;
    int rc = from_json(&tmp, root, label, err);
    cJSON_Delete(root);
    if (rc == MOH_OK) *cfg = tmp;
    return rc;
}

char *moh_vit_config_to_json(const moh_vit_config *c) {
    cJSON *j = cJSON_CreateObject();
    if (!j) return NULL;
    cJSON_AddStringToObject(j, "model_type", "vit");
    cJSON_AddNumberToObject(j, "img_size", c->img_size);
    cJSON_AddNumberToObject(j, "patch_size", c->patch_size);
    cJSON_AddNumberToObject(j, "in_chans", c->in_chans);
    cJSON_AddNumberToObject(j, "num_classes", c->num_classes);
    cJSON_AddNumberToObject(j, "embed_dim", c->embed_dim);
    cJSON_AddNumberToObject(j, "depth", c->depth);
    cJSON_AddNumberToObject(j, "num_heads", c->num_heads);
    cJSON_AddItemToObject(j, "mlp_ratio", json_exact_number(c->mlp_ratio));
    cJSON_AddBoolToObject(j, "class_token", c->class_token);
    cJSON_AddStringToObject(j, "global_pool", c->global_pool == VIT_POOL_TOKEN ? "token" : "avg");
    cJSON_AddStringToObject(j, "router", router_name(c->router));
    cJSON_AddNumberToObject(j, "shared_heads", c->shared_heads);
    cJSON_AddNumberToObject(j, "top_k", c->top_k);
    cJSON_AddItemToObject(j, "load_balance_coef", json_exact_number(c->load_balance_coef));
    cJSON_AddItemToObject(j, "label_smoothing", json_exact_number(c->label_smoothing));
    if (c->n_norm > 0) {
        cJSON *m = cJSON_AddArrayToObject(j, "mean"), *s = cJSON_AddArrayToObject(j, "std");
        for (int i = 0; m && s && i < c->n_norm; i++) {
            cJSON_AddItemToArray(m, json_exact_number(c->mean[i]));
            cJSON_AddItemToArray(s, json_exact_number(c->std[i]));
        }
    }
    char *out = cJSON_Print(j);
    cJSON_Delete(j);
    return out;
}
