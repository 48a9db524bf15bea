/* Decoder-LM config: validation, the derived attention config, and config.json output. */
#include <cjson/cJSON.h>

#include "io/json_util.h"
#include <stdlib.h>
#include <string.h>

#include "models/lm.h"

int moh_lm_config_finalize(moh_lm_config *c, const char *label, moh_error *err) {
    const struct { const char *name; int v; } pos[] = {
        {"hidden_size", c->hidden_size}, {"num_hidden_layers", c->num_hidden_layers},
        {"num_attention_heads", c->num_attention_heads}, {"intermediate_size", c->intermediate_size},
        {"vocab_size", c->vocab_size}, {"max_position_embeddings", c->max_position_embeddings}};
    for (size_t i = 0; i < sizeof pos / sizeof pos[0]; i++)
        if (pos[i].v <= 0)
            return moh_fail(err, MOH_E_CONFIG, "%s: field '%s' is %d, expected a positive integer",
                            label, pos[i].name, pos[i].v);
    if (c->num_hidden_layers > 1024 || c->hidden_size > 65536 || c->intermediate_size > 1 << 20 ||
        c->vocab_size > 1 << 24 || c->max_position_embeddings > 1 << 20)
        return moh_fail(err, MOH_E_CONFIG, "%s: sizes beyond this engine's limits (layers <= 1024, "
                        "hidden_size <= 65536, intermediate_size <= 2^20, vocab_size <= 2^24, "
                        "max_position_embeddings <= 2^20)", label);
    if (!(c->rms_norm_eps > 0) || c->rms_norm_eps > 1)
        return moh_fail(err, MOH_E_CONFIG, "%s: field 'rms_norm_eps' is %g, expected a number in (0, 1]",
                        label, c->rms_norm_eps);
    if (!(c->rope_theta > 0))
        return moh_fail(err, MOH_E_CONFIG, "%s: field 'rope_theta' is %g, expected a positive number",
                        label, c->rope_theta);
    moh_attn_config *a = &c->attn;
    moh_attn_config_default(a);
    a->hidden_size = c->hidden_size;
    a->n_heads = c->num_attention_heads;
    a->n_kv_heads = c->num_key_value_heads > 0 ? c->num_key_value_heads : c->num_attention_heads;
    c->num_key_value_heads = a->n_kv_heads;
    if (c->head_dim <= 0) {
        if (c->hidden_size % c->num_attention_heads)
            return moh_fail(err, MOH_E_CONFIG, "%s: field 'num_attention_heads' is %d, which does not "
                            "divide hidden_size %d (or give head_dim)", label, c->num_attention_heads, c->hidden_size);
        c->head_dim = c->hidden_size / c->num_attention_heads;
    }
    a->head_dim = c->head_dim;
    a->shared_heads = c->router == MOH_ROUTER_NONE ? 0 : c->shared_heads;
    a->top_k = c->router == MOH_ROUTER_NONE ? 0 : c->top_k;
    a->router = c->router;
    a->causal = true;
    a->fused_qkv = false;
    a->rope_theta = c->rope_theta;
    a->rope_scaling = c->rope_scaling;
    a->load_balance_coef = c->load_balance_coef;
    a->straight_through = c->straight_through;
    if (c->router != MOH_ROUTER_NONE && c->top_k < 1)
        return moh_fail(err, MOH_E_CONFIG, "%s: field 'top_k' is %d, expected 1..%d routed heads for "
                        "router \"%s\" (use router \"none\" for dense attention)",
                        label, c->top_k, c->num_attention_heads - c->shared_heads, attn_router_name(c->router));
    return moh_attn_config_validate(a, label, err);
}

char *moh_lm_config_to_json(const moh_lm_config *c) {
    cJSON *j = cJSON_CreateObject();
    if (!j) return NULL;
    cJSON *arch = cJSON_AddArrayToObject(j, "architectures");
    cJSON_AddItemToArray(arch, cJSON_CreateString("LlamaForCausalLM"));
    cJSON_AddStringToObject(j, "model_type", "llama");
    cJSON_AddStringToObject(j, "hidden_act", "silu");
    cJSON_AddNumberToObject(j, "hidden_size", c->hidden_size);
    cJSON_AddNumberToObject(j, "num_hidden_layers", c->num_hidden_layers);
    cJSON_AddNumberToObject(j, "num_attention_heads", c->num_attention_heads);
    cJSON_AddNumberToObject(j, "num_key_value_heads", c->num_key_value_heads);
    cJSON_AddNumberToObject(j, "head_dim", c->head_dim);
    cJSON_AddNumberToObject(j, "intermediate_size", c->intermediate_size);
    cJSON_AddNumberToObject(j, "vocab_size", c->vocab_size);
    cJSON_AddNumberToObject(j, "max_position_embeddings", c->max_position_embeddings);
    cJSON_AddItemToObject(j, "rms_norm_eps", json_exact_number(c->rms_norm_eps));
    cJSON_AddItemToObject(j, "rope_theta", json_exact_number(c->rope_theta));
    const moh_rope_scaling *rs = &c->rope_scaling;
    if (rs->type != MOH_ROPE_DEFAULT) { /* HF's keys for the type; none: no rope_scaling key */
        cJSON *r = cJSON_AddObjectToObject(j, "rope_scaling");
        cJSON_AddStringToObject(r, "rope_type", attn_rope_type_name(rs->type));
        cJSON_AddItemToObject(r, "factor", json_exact_number(rs->factor));
        if (rs->type == MOH_ROPE_LLAMA3) {
            cJSON_AddItemToObject(r, "low_freq_factor", json_exact_number(rs->low_freq_factor));
            cJSON_AddItemToObject(r, "high_freq_factor", json_exact_number(rs->high_freq_factor));
            cJSON_AddNumberToObject(r, "original_max_position_embeddings", rs->original_max_position_embeddings);
        }
    }
    cJSON_AddBoolToObject(j, "tie_word_embeddings", c->tie_word_embeddings);
    cJSON_AddBoolToObject(j, "attention_bias", false);
    cJSON_AddBoolToObject(j, "mlp_bias", false);
    cJSON_AddStringToObject(j, "torch_dtype", "float32");
    cJSON_AddStringToObject(j, "router", attn_router_name(c->router));
    cJSON_AddNumberToObject(j, "shared_heads", c->shared_heads);
    cJSON_AddNumberToObject(j, "top_k", c->top_k);
    cJSON_AddItemToObject(j, "load_balance_coef", json_exact_number(c->load_balance_coef));
    if (c->router == MOH_ROUTER_QUERY_NORM) cJSON_AddBoolToObject(j, "straight_through", c->straight_through);
    char *s = cJSON_Print(j);
    cJSON_Delete(j);
    return s;
}
