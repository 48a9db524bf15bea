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

/* Reads a per-channel array of finite numbers into out (count in *n). */
static int get_chan_array(const json_reader *rd, const cJSON *j, const char *key, double *out,
                          int *n) {
    const char *label = rd->label;
    moh_error *err = rd->err;
    char v[JSON_SHOW_BUF];
    const int cnt = cJSON_IsArray(j) ? cJSON_GetArraySize(j) : -1;
    if (cnt < 1 || cnt > VIT_MAX_CHANS)
        return moh_fail(err, MOH_E_CONFIG, "%s: field '%s': expected an array of 1..%d numbers (one "
                        "per input channel), got %s", label, key, VIT_MAX_CHANS, json_show_value(rd, v, j));
    int i = 0;
    for (const cJSON *e = j->child; e; e = e->next, i++) {
        if (!cJSON_IsNumber(e) || !isfinite(e->valuedouble))
            return moh_fail(err, MOH_E_CONFIG, "%s: field '%s': element %d is %s, expected a finite number",
                            label, key, i, json_show_value(rd, v, e));
        out[i] = e->valuedouble;
    }
    *n = cnt;
    return MOH_OK;
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
                        label, attn_router_name(c->router));
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

static int from_json(void *out, const cJSON *root, const json_reader *rd) {
    moh_vit_config *c = out;
    const char *label = rd->label;
    moh_error *err = rd->err;
    const cJSON *f[K_COUNT];
    int rc = json_object_fields(rd, root, KEYS, K_COUNT, f, "{\"model_type\": \"vit\", ...}", NULL);
    if (rc != MOH_OK) return rc;
    set_defaults(c);
    if ((rc = json_check_model_type(rd, f[K_MODEL_TYPE], "vit"))) return rc;
    const json_int_field ints[] = {
        {K_IMG, &c->img_size, 1, 4096, false},        {K_PATCH, &c->patch_size, 1, 4096, false},
        {K_CHANS, &c->in_chans, 1, VIT_MAX_CHANS, false}, {K_CLASSES, &c->num_classes, 2, 1 << 20, false},
        {K_DIM, &c->embed_dim, 1, 65536, true},       {K_DEPTH, &c->depth, 1, 1024, true},
        {K_HEADS, &c->num_heads, 1, 4096, true},      {K_SHARED, &c->shared_heads, 0, 4096, false},
        {K_TOPK, &c->top_k, 0, 4096, false}};
    if ((rc = json_get_ints(rd, f, KEYS, ints, sizeof ints / sizeof ints[0]))) return rc;
    if (f[K_MLP] && (rc = json_get_number(rd, f[K_MLP], "mlp_ratio", &c->mlp_ratio))) return rc;
    if (f[K_BETA] && (rc = json_get_number(rd, f[K_BETA], "load_balance_coef", &c->load_balance_coef))) return rc;
    if (f[K_SMOOTH] && (rc = json_get_number(rd, f[K_SMOOTH], "label_smoothing", &c->label_smoothing))) return rc;
    if (f[K_CLS] && (rc = json_get_bool(rd, f[K_CLS], "class_token", &c->class_token))) return rc;
    c->global_pool = c->class_token ? VIT_POOL_TOKEN : VIT_POOL_AVG;
    if (f[K_POOL]) {
        static const char *const pools[2] = {"token", "avg"};
        int pool = 0;
        if ((rc = json_get_choice(rd, f[K_POOL], "global_pool", pools, 2, "\"token\" or \"avg\"",
                                  &pool)))
            return rc;
        c->global_pool = pool == 0 ? VIT_POOL_TOKEN : VIT_POOL_AVG;
    }
    if (f[K_ROUTER] && (rc = json_get_router(rd, f[K_ROUTER], "router", false,
                                             "\"learned\" or \"none\"", &c->router)))
        return rc;
    if (!f[K_MEAN] != !f[K_STD])
        return moh_fail(err, MOH_E_CONFIG, "%s: field '%s' is missing, expected both 'mean' and 'std' "
                        "or neither", label, f[K_MEAN] ? "std" : "mean");
    if (f[K_MEAN]) {
        int nm = 0, ns = 0;
        if ((rc = get_chan_array(rd, f[K_MEAN], "mean", c->mean, &nm))) return rc;
        if ((rc = get_chan_array(rd, f[K_STD], "std", c->std, &ns))) return rc;
        if (nm != ns)
            return moh_fail(err, MOH_E_CONFIG, "%s: fields 'mean' and 'std' have %d and %d values, "
                            "expected the same count (in_chans)", label, nm, ns);
        c->n_norm = nm;
    }
    return moh_vit_config_finalize(c, label, err);
}

int moh_vit_config_parse_json(moh_vit_config *cfg, const char *text, size_t len, const char *label,
                              moh_error *err) {
    if (!label) label = "<config>";
    if (!cfg || (!text && len > 0)) return moh_fail(err, MOH_E_ARG, "%s: config or text is NULL", label);
    const json_reader rd = {label, JSON_STYLE_VIT, err};
    moh_vit_config tmp;
    int rc = json_parse_with(&rd, text, len, from_json, &tmp);
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
    cJSON_AddStringToObject(j, "router", attn_router_name(c->router));
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
