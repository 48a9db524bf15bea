/* libFuzzer target: moh_lm_config_parse_json on arbitrary bytes (not NUL-terminated).
 * Invariants checked (trap on violation): an error leaves cfg zeroed, with a one-line,
 * NUL-terminated message that starts with the label; a parsed config has a valid derived attention
 * config, finalizes again to the same struct, and moh_lm_config_to_json parses back to the same
 * struct (doubles within 2 ulps: cJSON prints with %.15g when that is within an ulp or so). */
#include "moh.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int close_to(double a, double b) {
    return a == b || fabs(a - b) <= 4.5e-16 * fmax(fabs(a), fabs(b));
}

static int same_rope(const moh_rope_scaling *a, const moh_rope_scaling *b) {
    return a->type == b->type && close_to(a->factor, b->factor) &&
           close_to(a->low_freq_factor, b->low_freq_factor) &&
           close_to(a->high_freq_factor, b->high_freq_factor) &&
           a->original_max_position_embeddings == b->original_max_position_embeddings;
}

static int same(const moh_lm_config *a, const moh_lm_config *b) {
    const moh_attn_config *x = &a->attn, *y = &b->attn;
    return same_rope(&a->rope_scaling, &b->rope_scaling) && same_rope(&x->rope_scaling, &y->rope_scaling) &&
           a->hidden_size == b->hidden_size && a->num_hidden_layers == b->num_hidden_layers &&
           a->num_attention_heads == b->num_attention_heads &&
           a->num_key_value_heads == b->num_key_value_heads && a->head_dim == b->head_dim &&
           a->intermediate_size == b->intermediate_size && a->vocab_size == b->vocab_size &&
           a->max_position_embeddings == b->max_position_embeddings &&
           close_to(a->rms_norm_eps, b->rms_norm_eps) && close_to(a->rope_theta, b->rope_theta) &&
           a->tie_word_embeddings == b->tie_word_embeddings &&
           a->shared_heads == b->shared_heads && a->top_k == b->top_k && a->router == b->router &&
           close_to(a->load_balance_coef, b->load_balance_coef) &&
           x->hidden_size == y->hidden_size && x->n_heads == y->n_heads &&
           x->n_kv_heads == y->n_kv_heads && x->head_dim == y->head_dim &&
           x->shared_heads == y->shared_heads && x->top_k == y->top_k && x->router == y->router &&
           x->causal == y->causal && x->qkv_bias == y->qkv_bias &&
           x->proj_bias == y->proj_bias && x->fused_qkv == y->fused_qkv &&
           close_to(x->rope_theta, y->rope_theta) &&
           close_to(x->load_balance_coef, y->load_balance_coef);
}

static void check_msg(const moh_error *err, int rc) {
    if (err->code != rc || !memchr(err->msg, '\0', sizeof err->msg)) __builtin_trap();
    if (strchr(err->msg, '\n') || strncmp(err->msg, "fuzz.json: ", 11) != 0) __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const moh_lm_config zero;
    moh_lm_config c;
    moh_error err;
    memset(&err, 0, sizeof err);
    memset(&c, 0x5a, sizeof c);
    int rc = moh_lm_config_parse_json(&c, (const char *)data, size, "fuzz.json", &err);
    if (rc != MOH_OK) {
        if (rc != MOH_E_FORMAT && rc != MOH_E_CONFIG && rc != MOH_E_NOMEM) __builtin_trap();
        check_msg(&err, rc);
        if (!same(&c, &zero) || c.rms_norm_eps != 0.0) __builtin_trap();
        return 0;
    }
    /* the derived attention config */
    if (moh_attn_config_validate(&c.attn, "fuzz.json", &err) != MOH_OK) __builtin_trap();
    if (!c.attn.causal || c.attn.fused_qkv || c.attn.qkv_bias || c.attn.proj_bias) __builtin_trap();
    if (c.head_dim <= 0 || c.num_key_value_heads <= 0 || c.router == MOH_ROUTER_QUERY_NORM)
        __builtin_trap();
    if (c.shared_heads < 0 || c.top_k < 0 || !(c.load_balance_coef >= 0)) __builtin_trap();
    /* finalize is idempotent */
    moh_lm_config again = c;
    if (moh_lm_config_finalize(&again, "fuzz.json", &err) != MOH_OK || !same(&c, &again))
        __builtin_trap();
    /* config.json output parses back */
    char *json = moh_lm_config_to_json(&c);
    if (!json) return 0; /* out of memory */
    moh_lm_config back;
    rc = moh_lm_config_parse_json(&back, json, strlen(json), "fuzz.json", &err);
    if (rc != MOH_OK || !same(&c, &back)) __builtin_trap();
    free(json);
    return 0;
}
