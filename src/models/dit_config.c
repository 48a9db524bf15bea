/* DiT config.json: parsing (cJSON), validation, derived fields and output.
 *
 * Keys follow the official DiT constructor (input_size, patch_size, in_channels, hidden_size,
 * depth, num_heads, mlp_ratio, class_dropout_prob, num_classes, learn_sigma) plus model_type
 * "dit", the MoH fields (router, shared_heads, top_k as in MoH-DiT's per-layer shared_head /
 * routed_head lists, load_balance_coef) and the Gaussian diffusion's (diffusion_steps,
 * noise_schedule, beta_start, beta_end). Unknown keys are errors; keys starting with "_" or
 * "comment" are annotations. Every message names the label, the field, the value and what was
 * expected, on one line. */
#include <cjson/cJSON.h>
#include <math.h>
#include <string.h>

#include "io/json_util.h"
#include "models/dit.h"

enum {
    K_MODEL_TYPE, K_INPUT, K_PATCH, K_CHANS, K_CLASSES, K_HIDDEN, K_DEPTH, K_HEADS, K_MLP, K_DROP,
    K_SIGMA, K_ROUTER, K_SHARED, K_TOPK, K_BETA, K_STEPS, K_SCHED, K_BSTART, K_BEND, K_COUNT
};
static const char *const KEYS[K_COUNT] = {
    "model_type", "input_size", "patch_size", "in_channels", "num_classes", "hidden_size", "depth",
    "num_heads", "mlp_ratio", "class_dropout_prob", "learn_sigma", "router", "shared_heads", "top_k",
    "load_balance_coef", "diffusion_steps", "noise_schedule", "beta_start", "beta_end"};

int moh_dit_config_finalize(moh_dit_config *c, const char *label, moh_error *err) {
    if (!label) label = "<config>";
    const struct { const char *name; int v, lo, hi; } ints[] = {
        {"input_size", c->input_size, 1, 4096},    {"patch_size", c->patch_size, 1, 4096},
        {"in_channels", c->in_channels, 1, DIT_MAX_CHANS}, {"num_classes", c->num_classes, 1, 1 << 20},
        {"hidden_size", c->hidden_size, 4, 65536}, {"depth", c->depth, 1, DIT_MAX_DEPTH},
        {"num_heads", c->num_heads, 1, 4096},      {"diffusion_steps", c->diffusion_steps, 2, 100000}};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        if (ints[i].v < ints[i].lo || ints[i].v > ints[i].hi)
            return moh_fail(err, MOH_E_CONFIG, "%s: field '%s' is %d, expected an integer in %d..%d", label,
                            ints[i].name, ints[i].v, ints[i].lo, ints[i].hi);
    if (c->input_size % c->patch_size)
        return moh_fail(err, MOH_E_CONFIG, "%s: field 'patch_size' is %d, expected a divisor of input_size %d", label,
                        c->patch_size, c->input_size);
    if (c->hidden_size % 4)
        return moh_fail(err, MOH_E_CONFIG, "%s: field 'hidden_size' is %d, expected a multiple of 4 (the 2-D sin-cos "
                        "position embedding)", label, c->hidden_size);
    if (c->hidden_size % c->num_heads)
        return moh_fail(err, MOH_E_CONFIG, "%s: field 'num_heads' is %d, expected a divisor of hidden_size %d", label,
                        c->num_heads, c->hidden_size);
    const double hidden = (double)c->hidden_size * c->mlp_ratio;
    if (!(c->mlp_ratio > 0) || !(hidden >= 1) || hidden > (double)(1 << 20))
        return moh_fail(err, MOH_E_CONFIG, "%s: field 'mlp_ratio' is %g, expected a number > 0 with 1 <= "
                        "int(hidden_size * mlp_ratio) <= 2^20", label, c->mlp_ratio);
    if (!(c->class_dropout_prob > 0) || !(c->class_dropout_prob < 1))
        return moh_fail(err, MOH_E_CONFIG, "%s: field 'class_dropout_prob' is %g, expected a number in (0, 1) (the "
                        "null class of classifier-free guidance needs label dropout)", label, c->class_dropout_prob);
    if (!(c->load_balance_coef >= 0) || !isfinite(c->load_balance_coef))
        return moh_fail(err, MOH_E_CONFIG, "%s: field 'load_balance_coef' is %g, expected a finite number >= 0", label,
                        c->load_balance_coef);
    if (!(c->beta_start > 0) || !(c->beta_end >= c->beta_start) || !(c->beta_end < 1))
        return moh_fail(err, MOH_E_CONFIG, "%s: fields 'beta_start'/'beta_end' are %g/%g, expected 0 < beta_start <= "
                        "beta_end < 1", label, c->beta_start, c->beta_end);
    if (c->router != MOH_ROUTER_LEARNED && c->router != MOH_ROUTER_NONE)
        return moh_fail(err, MOH_E_CONFIG, "%s: field 'router' is \"%s\", expected \"learned\" or \"none\" (none = "
                        "dense DiT)", label, attn_router_name(c->router));
    const long ntok = (long)(c->input_size / c->patch_size) * (c->input_size / c->patch_size);
    if (ntok > 65536 || (long)c->in_channels * c->patch_size * c->patch_size > (1L << 24))
        return moh_fail(err, MOH_E_CONFIG, "%s: (input_size / patch_size)^2 = %ld tokens or in_channels * "
                        "patch_size^2 too large (expected <= 65536 tokens, <= 2^24 values per patch)", label, ntok);
    c->grid = c->input_size / c->patch_size;
    c->num_patches = c->grid * c->grid;
    c->patch_dim = c->in_channels * c->patch_size * c->patch_size;
    c->mlp_hidden = (int)hidden;
    c->routing_layers = 0;
    for (int l = 0; l < DIT_MAX_DEPTH; l++) {
        if (l >= c->depth || c->router == MOH_ROUTER_NONE) { /* unused entries are 0: configs compare equal */
            c->shared_heads[l] = c->top_k[l] = 0;
            memset(&c->attn[l], 0, sizeof c->attn[l]);
            if (l >= c->depth) continue;
        }
        const int hs = c->shared_heads[l], k = c->top_k[l], h = c->num_heads;
        if (c->router == MOH_ROUTER_LEARNED && (hs < 0 || hs > h || k < 0 || k > h - hs || (k == 0 && hs != h)))
            return moh_fail(err, MOH_E_CONFIG, "%s: layer %d: shared_heads %d, top_k %d, expected 0 <= shared_heads <= "
                            "num_heads %d and 1 <= top_k <= num_heads - shared_heads (or top_k 0 with shared_heads = "
                            "num_heads: all heads shared)", label, l, hs, k, h);
        moh_attn_config *a = &c->attn[l];
        moh_attn_config_default(a);
        a->hidden_size = c->hidden_size;
        a->n_heads = a->n_kv_heads = h;
        a->head_dim = c->hidden_size / h;
        a->shared_heads = hs;
        a->top_k = k;
        a->router = c->router;
        a->qkv_bias = a->proj_bias = a->fused_qkv = true;
        a->load_balance_coef = c->load_balance_coef;
        int rc = moh_attn_config_validate(a, label, err);
        if (rc) return rc;
        c->routing_layers += attn_routed_heads(a) > 0 && k > 0;
    }
    return MOH_OK;
}

static void set_defaults(moh_dit_config *c) {
    memset(c, 0, sizeof *c);
    c->input_size = 28;
    c->patch_size = 4;
    c->in_channels = 1;
    c->num_classes = 10;
    c->mlp_ratio = 4.0;
    c->class_dropout_prob = 0.1;
    c->router = MOH_ROUTER_LEARNED;
    c->load_balance_coef = 0.01;
    c->diffusion_steps = 1000;
    c->beta_start = 1e-4;
    c->beta_end = 0.02;
}

/* A number for every layer, or a list of depth numbers, into out[0..depth). */
static int get_layer_ints(const json_reader *rd, const cJSON *j, const char *key, int depth, int hi, int *out) {
    char v[JSON_SHOW_BUF];
    if (!cJSON_IsArray(j)) {
        int x = 0, rc = json_get_int(rd, j, key, 0, hi, &x);
        for (int l = 0; !rc && l < depth; l++) out[l] = x;
        return rc;
    }
    if (cJSON_GetArraySize(j) != depth)
        return moh_fail(rd->err, MOH_E_CONFIG, "%s: field '%s' is a list of %d numbers, expected one number or a list "
                        "of depth = %d numbers (one per layer)", rd->label, key, cJSON_GetArraySize(j), depth);
    int l = 0;
    for (const cJSON *e = j->child; e; e = e->next, l++) {
        if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble) || e->valuedouble < 0 || e->valuedouble > hi)
            return moh_fail(rd->err, MOH_E_CONFIG, "%s: field '%s' element %d is %s, expected an integer in 0..%d", rd->label,
                            key, l, json_show_value(rd, v, e), hi);
        out[l] = (int)e->valuedouble;
    }
    return MOH_OK;
}

static int from_json(void *out, const cJSON *root, const json_reader *rd) {
    moh_dit_config *c = out;
    const char *label = rd->label;
    moh_error *err = rd->err;
    const cJSON *f[K_COUNT];
    int rc = json_object_fields(rd, root, KEYS, K_COUNT, f, "{\"model_type\": \"dit\", ...}", NULL);
    if (rc != MOH_OK) return rc;
    set_defaults(c);
    if ((rc = json_check_model_type(rd, f[K_MODEL_TYPE], "dit"))) return rc;
    const json_int_field ints[] = {
        {K_INPUT, &c->input_size, 1, 4096, false},     {K_PATCH, &c->patch_size, 1, 4096, false},
        {K_CHANS, &c->in_channels, 1, DIT_MAX_CHANS, false}, {K_CLASSES, &c->num_classes, 1, 1 << 20, false},
        {K_HIDDEN, &c->hidden_size, 4, 65536, true},   {K_DEPTH, &c->depth, 1, DIT_MAX_DEPTH, true},
        {K_HEADS, &c->num_heads, 1, 4096, true},       {K_STEPS, &c->diffusion_steps, 2, 100000, false}};
    if ((rc = json_get_ints(rd, f, KEYS, ints, sizeof ints / sizeof ints[0]))) return rc;
    const struct { int id; double *dst; } nums[] = {{K_MLP, &c->mlp_ratio}, {K_DROP, &c->class_dropout_prob},
                                                     {K_BETA, &c->load_balance_coef}, {K_BSTART, &c->beta_start},
                                                     {K_BEND, &c->beta_end}};
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++)
        if (f[nums[i].id] && (rc = json_get_number(rd, f[nums[i].id], KEYS[nums[i].id], nums[i].dst))) return rc;
    if (f[K_SIGMA]) {
        bool sigma = false;
        if ((rc = json_get_bool(rd, f[K_SIGMA], "learn_sigma", &sigma))) return rc;
        if (sigma)
            return moh_fail(err, MOH_E_CONFIG, "%s: field 'learn_sigma' is true, expected false (moh's DiT predicts "
                            "the noise only and trains the plain epsilon MSE)", label);
    }
    if (f[K_SCHED]) {
        static const char *const scheds[1] = {"linear"};
        int s = 0;
        if ((rc = json_get_choice(rd, f[K_SCHED], "noise_schedule", scheds, 1, "\"linear\"", &s))) return rc;
    }
    if (f[K_ROUTER] && (rc = json_get_router(rd, f[K_ROUTER], "router", false, "\"learned\" or \"none\"", &c->router)))
        return rc;
    if (f[K_SHARED] && (rc = get_layer_ints(rd, f[K_SHARED], "shared_heads", c->depth, 4096, c->shared_heads)))
        return rc;
    if (f[K_TOPK] && (rc = get_layer_ints(rd, f[K_TOPK], "top_k", c->depth, 4096, c->top_k))) return rc;
    return moh_dit_config_finalize(c, label, err);
}

int moh_dit_config_parse_json(moh_dit_config *cfg, const char *text, size_t len, const char *label, moh_error *err) {
    if (!label) label = "<config>";
    if (!cfg || (!text && len > 0)) return moh_fail(err, MOH_E_ARG, "%s: config or text is NULL", label);
    const json_reader rd = {label, JSON_STYLE_VIT, err};
    moh_dit_config tmp;
    int rc = json_parse_with(&rd, text, len, from_json, &tmp);
    if (rc == MOH_OK) *cfg = tmp;
    return rc;
}

/* v[0..n) as one number when all equal, else a list */
static cJSON *layer_ints(const int *v, int n) {
    bool same = true;
    for (int l = 1; l < n; l++) same = same && v[l] == v[0];
    if (same) return cJSON_CreateNumber(v[0]);
    return cJSON_CreateIntArray(v, n);
}

char *moh_dit_config_to_json(const moh_dit_config *c) {
    cJSON *j = cJSON_CreateObject();
    if (!j) return NULL;
    cJSON_AddStringToObject(j, "model_type", "dit");
    cJSON_AddNumberToObject(j, "input_size", c->input_size);
    cJSON_AddNumberToObject(j, "patch_size", c->patch_size);
    cJSON_AddNumberToObject(j, "in_channels", c->in_channels);
    cJSON_AddNumberToObject(j, "num_classes", c->num_classes);
    cJSON_AddNumberToObject(j, "hidden_size", c->hidden_size);
    cJSON_AddNumberToObject(j, "depth", c->depth);
    cJSON_AddNumberToObject(j, "num_heads", c->num_heads);
    cJSON_AddItemToObject(j, "mlp_ratio", json_exact_number(c->mlp_ratio));
    cJSON_AddItemToObject(j, "class_dropout_prob", json_exact_number(c->class_dropout_prob));
    cJSON_AddBoolToObject(j, "learn_sigma", false);
    cJSON_AddStringToObject(j, "router", attn_router_name(c->router));
    cJSON_AddItemToObject(j, "shared_heads", layer_ints(c->shared_heads, c->depth));
    cJSON_AddItemToObject(j, "top_k", layer_ints(c->top_k, c->depth));
    cJSON_AddItemToObject(j, "load_balance_coef", json_exact_number(c->load_balance_coef));
    cJSON_AddNumberToObject(j, "diffusion_steps", c->diffusion_steps);
    cJSON_AddStringToObject(j, "noise_schedule", "linear");
    cJSON_AddItemToObject(j, "beta_start", json_exact_number(c->beta_start));
    cJSON_AddItemToObject(j, "beta_end", json_exact_number(c->beta_end));
    char *out = cJSON_Print(j);
    cJSON_Delete(j);
    return out;
}
