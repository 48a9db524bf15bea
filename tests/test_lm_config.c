/* Decoder-LM config.json: every configs/ JSON file and LM fixture parses, defaults, accepted HF keys,
 * each invalid case's one-line message, and moh_lm_config_to_json -> parse round trips. */
#include "moh.h"
#include "test_util.h"

#include <dirent.h>
#include <stdarg.h>
#include <string.h>

#define LABEL "config.json"

static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long k = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc(k > 0 ? (size_t)k + 1 : 1);
    *n = fread(b, 1, k > 0 ? (size_t)k : 0, f);
    b[*n] = '\0';
    fclose(f);
    return b;
}

/* A config built from a valid base (moh-75-like, 8 heads of 32): overrides is a NULL-terminated
 * list of key, value pairs; a value replaces the base's, NULL deletes the key, a new key is
 * appended. */
static const char *const BASE[] = {
    "hidden_size", "256",          "num_hidden_layers", "2",        "num_attention_heads", "8",
    "intermediate_size", "688",    "vocab_size", "256",             "max_position_embeddings", "64",
    "router", "\"learned\"",       "shared_heads", "2",             "top_k", "4",
    NULL,
};

static void build(char *out, size_t cap, va_list *ap) {
    const char *ov[64];
    int n_ov = 0;
    for (const char *k; (k = va_arg(*ap, const char *)) && n_ov < 62;) {
        ov[n_ov++] = k;
        ov[n_ov++] = va_arg(*ap, const char *);
    }
    int used[64] = {0};
    size_t o = 0;
    o += (size_t)snprintf(out + o, cap - o, "{");
    int first = 1;
    for (int i = 0; BASE[i]; i += 2) {
        const char *v = BASE[i + 1];
        for (int j = 0; j < n_ov; j += 2)
            if (strcmp(ov[j], BASE[i]) == 0) {
                v = ov[j + 1];
                used[j] = 1;
            }
        if (!v) continue;
        o += (size_t)snprintf(out + o, cap - o, "%s\"%s\": %s", first ? "" : ", ", BASE[i], v);
        first = 0;
    }
    for (int j = 0; j < n_ov; j += 2)
        if (!used[j] && ov[j + 1]) {
            o += (size_t)snprintf(out + o, cap - o, "%s\"%s\": %s", first ? "" : ", ", ov[j],
                                  ov[j + 1]);
            first = 0;
        }
    snprintf(out + o, cap - o, "}");
}

static int parse(moh_lm_config *c, const char *json, moh_error *err) {
    return moh_lm_config_parse_json(c, json, strlen(json), LABEL, err);
}

/* The base with overrides (key, value, ..., NULL) must parse. */
static void expect_ok(test_ctx *t, moh_lm_config *c, ...) {
    char json[4096];
    va_list ap;
    va_start(ap, c);
    build(json, sizeof json, &ap);
    va_end(ap);
    moh_error err = {0};
    int rc = parse(c, json, &err);
    CHECK(t, rc == MOH_OK, "%s -> rc %d: %s", json, rc, err.msg);
}

static void check_msg(test_ctx *t, const char *what, int rc, int code, const moh_error *err,
                      const char *const *words) {
    CHECK(t, rc == code, "%s -> rc %d, expected %d (%s)", what, rc, code, err->msg);
    CHECK(t, err->code == rc, "%s: err.code %d", what, err->code);
    CHECK(t, strncmp(err->msg, LABEL ": ", strlen(LABEL) + 2) == 0, "label missing: %s", err->msg);
    CHECK(t, strchr(err->msg, '\n') == NULL, "message not one line: %s", err->msg);
    for (int i = 0; words[i]; i++)
        CHECK(t, strstr(err->msg, words[i]) != NULL, "%s: '%s' not in message: %s", what, words[i],
              err->msg);
}

/* Raw text must fail with code and every key word (NULL-terminated) in the message. */
static void expect_bad_text(test_ctx *t, int code, const char *json, ...) {
    const char *words[16];
    int n = 0;
    va_list ap;
    va_start(ap, json);
    for (const char *w; (w = va_arg(ap, const char *)) && n < 15;) words[n++] = w;
    va_end(ap);
    words[n] = NULL;
    moh_lm_config c;
    memset(&c, 0x5a, sizeof c);
    moh_error err = {0};
    int rc = parse(&c, json, &err);
    check_msg(t, json, rc, code, &err, words);
    CHECK(t, c.hidden_size == 0 && c.attn.hidden_size == 0 && c.router == 0, "cfg not zeroed: %s",
          json);
    printf("  %s\n", err.msg);
}

/* The base with overrides must fail: expect_bad(t, code, {key, value,} NULL, {word,} NULL). */
static void expect_bad(test_ctx *t, int code, ...) {
    char json[4096];
    va_list ap;
    va_start(ap, code);
    build(json, sizeof json, &ap);
    const char *words[16];
    int n = 0;
    for (const char *w; (w = va_arg(ap, const char *)) && n < 15;) words[n++] = w;
    words[n] = NULL;
    va_end(ap);
    moh_lm_config c;
    moh_error err = {0};
    int rc = parse(&c, json, &err);
    check_msg(t, json, rc, code, &err, words);
    printf("  %s\n", err.msg);
}

static int same_attn(const moh_attn_config *a, const moh_attn_config *b) {
    return a->hidden_size == b->hidden_size && a->n_heads == b->n_heads &&
           a->n_kv_heads == b->n_kv_heads && a->head_dim == b->head_dim &&
           a->shared_heads == b->shared_heads && a->top_k == b->top_k && a->router == b->router &&
           a->causal == b->causal && a->qkv_bias == b->qkv_bias && a->proj_bias == b->proj_bias &&
           a->fused_qkv == b->fused_qkv && a->rope_theta == b->rope_theta &&
           !memcmp(&a->rope_scaling, &b->rope_scaling, sizeof a->rope_scaling) &&
           a->load_balance_coef == b->load_balance_coef && a->straight_through == b->straight_through;
}

static int same_cfg(const moh_lm_config *a, const moh_lm_config *b) {
    return a->hidden_size == b->hidden_size && a->num_hidden_layers == b->num_hidden_layers &&
           a->num_attention_heads == b->num_attention_heads &&
           a->num_key_value_heads == b->num_key_value_heads && a->head_dim == b->head_dim &&
           a->intermediate_size == b->intermediate_size && a->vocab_size == b->vocab_size &&
           a->max_position_embeddings == b->max_position_embeddings &&
           a->rms_norm_eps == b->rms_norm_eps && a->rope_theta == b->rope_theta &&
           !memcmp(&a->rope_scaling, &b->rope_scaling, sizeof a->rope_scaling) &&
           a->tie_word_embeddings == b->tie_word_embeddings && a->shared_heads == b->shared_heads &&
           a->top_k == b->top_k && a->router == b->router &&
           a->load_balance_coef == b->load_balance_coef &&
           a->straight_through == b->straight_through && same_attn(&a->attn, &b->attn);
}

/* moh_lm_config_to_json(c) parses back to an identical struct. */
static void check_round_trip(test_ctx *t, const moh_lm_config *c, const char *what) {
    char *json = moh_lm_config_to_json(c);
    CHECK(t, json != NULL, "%s: to_json failed", what);
    if (!json) return;
    moh_lm_config back;
    moh_error err = {0};
    int rc = parse(&back, json, &err);
    CHECK(t, rc == MOH_OK, "%s: to_json output does not parse: %s\n%s", what, err.msg, json);
    CHECK(t, rc != MOH_OK || same_cfg(c, &back), "%s: round trip differs:\n%s", what, json);
    free(json);
}

/* ---- valid configs ---------------------------------------------------------------------------- */

/* 1 when path is an LM config that parsed (c filled), 0 otherwise (another family's: skipped) */
static int parse_file(test_ctx *t, const char *path, moh_lm_config *c) {
    size_t n = 0;
    char *text = slurp(path, &n);
    CHECK(t, text != NULL, "cannot read %s", path);
    if (!text) return 0;
    if (strstr(text, "\"model_type\": \"vit\"") || strstr(text, "\"model_type\": \"dit\"")) {
        free(text); /* other families: tests/test_vit.c, tests/test_dit.c */
        return 0;
    }
    moh_error err = {0};
    int rc = moh_lm_config_parse_json(c, text, n, path, &err);
    CHECK(t, rc == MOH_OK, "%s: %s", path, err.msg);
    free(text);
    if (rc == MOH_OK) check_round_trip(t, c, path);
    return rc == MOH_OK;
}

static void test_repo_configs(test_ctx *t) {
    DIR *d = opendir("configs");
    CHECK(t, d != NULL, "no configs/ directory (run from the repository root)");
    if (!d) return;
    int count = 0;
    for (struct dirent *e; (e = readdir(d));) {
        size_t l = strlen(e->d_name);
        if (l < 6 || strcmp(e->d_name + l - 5, ".json") != 0) continue;
        char path[512];
        snprintf(path, sizeof path, "configs/%s", e->d_name);
        moh_lm_config c;
        if (!parse_file(t, path, &c)) continue;
        count++;
        /* what every shipped config shares */
        CHECK(t, c.hidden_size == 256 && c.num_attention_heads == 8 && c.head_dim == 32 &&
                     c.num_key_value_heads == 8 && c.vocab_size == 256,
              "%s: sizes", path);
        CHECK(t, c.attn.causal && !c.attn.fused_qkv && c.attn.rope_theta == 10000.0 &&
                     c.attn.head_dim == 32 && c.attn.n_kv_heads == 8,
              "%s: derived attn", path);
        if (strcmp(e->d_name, "mha.json") == 0)
            CHECK(t, c.router == MOH_ROUTER_NONE && c.attn.router == MOH_ROUTER_NONE &&
                         c.attn.top_k == 0 && c.attn.shared_heads == 0,
                  "mha.json: dense");
        if (strcmp(e->d_name, "moh-75.json") == 0)
            CHECK(t, c.router == MOH_ROUTER_LEARNED && c.shared_heads == 2 && c.top_k == 4 &&
                         c.attn.top_k == 4 && c.attn.shared_heads == 2 && c.rms_norm_eps == 1e-5 &&
                         c.load_balance_coef == 0.01 && c.attn.load_balance_coef == 0.01,
                  "moh-75.json: fields");
    }
    closedir(d);
    CHECK(t, count >= 4, "only %d configs/*.json parsed", count);
    printf("  configs/*.json: %d parsed\n", count);

    /* the LM fixtures' config.json, written by transformers-style tooling */
    d = opendir("tests/fixtures/lm");
    count = 0;
    for (struct dirent *e; d && (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char path[512];
        snprintf(path, sizeof path, "tests/fixtures/lm/%s/config.json", e->d_name);
        FILE *f = fopen(path, "rb");
        if (!f) continue;
        fclose(f);
        moh_lm_config c;
        count += parse_file(t, path, &c);
    }
    if (d) closedir(d);
    printf("  tests/fixtures/lm/*/config.json: %d parsed\n", count);
}

static void test_defaults(test_ctx *t) {
    moh_lm_config c;
    const char *json = "{\"hidden_size\": 64, \"num_hidden_layers\": 1, \"num_attention_heads\": 4,"
                       " \"intermediate_size\": 128, \"vocab_size\": 256,"
                       " \"max_position_embeddings\": 32, \"top_k\": 2}";
    moh_error err = {0};
    CHECK(t, parse(&c, json, &err) == MOH_OK, "minimal: %s", err.msg);
    CHECK(t, c.num_key_value_heads == 4 && c.head_dim == 16, "kv %d head_dim %d",
          c.num_key_value_heads, c.head_dim);
    CHECK(t, c.rms_norm_eps == 1e-6 && c.rope_theta == 10000.0 && !c.tie_word_embeddings,
          "eps %g theta %g", c.rms_norm_eps, c.rope_theta);
    CHECK(t, c.router == MOH_ROUTER_LEARNED && c.shared_heads == 0 && c.top_k == 2 &&
                 c.load_balance_coef == 0.01,
          "router defaults");
    CHECK(t, c.attn.hidden_size == 64 && c.attn.n_heads == 4 && c.attn.n_kv_heads == 4 &&
                 c.attn.head_dim == 16 && c.attn.causal && c.attn.router == MOH_ROUTER_LEARNED &&
                 c.attn.top_k == 2 && c.attn.rope_theta == 10000.0 && !c.attn.qkv_bias &&
                 !c.attn.proj_bias,
          "derived attn");
    check_round_trip(t, &c, "minimal");

    /* every optional field given, GQA, head_dim != C / h */
    expect_ok(t, &c, "num_key_value_heads", "2", "head_dim", "16", "rms_norm_eps", "1e-5",
              "rope_theta", "500000", "tie_word_embeddings", "true", "load_balance_coef", "0",
              "router", "\"learned\"", "shared_heads", "0", "top_k", "8", NULL);
    CHECK(t, c.num_key_value_heads == 2 && c.head_dim == 16 && c.attn.head_dim == 16 &&
                 c.rms_norm_eps == 1e-5 && c.rope_theta == 500000.0 && c.tie_word_embeddings &&
                 c.load_balance_coef == 0.0 && c.top_k == 8 && c.attn.n_kv_heads == 2,
          "all fields");
    check_round_trip(t, &c, "all fields");
    /* null means the HF default for the optional sizes */
    expect_ok(t, &c, "num_key_value_heads", "null", "head_dim", "null", NULL);
    CHECK(t, c.num_key_value_heads == 8 && c.head_dim == 32, "null sizes -> defaults");
    /* router none ignores shared_heads / top_k for the attention */
    expect_ok(t, &c, "router", "\"none\"", "shared_heads", "3", "top_k", "0", NULL);
    CHECK(t, c.router == MOH_ROUTER_NONE && c.attn.shared_heads == 0 && c.attn.top_k == 0,
          "router none");
    check_round_trip(t, &c, "router none");
    /* all heads routed, top_k = E */
    expect_ok(t, &c, "shared_heads", "0", "top_k", "8", NULL);
    expect_ok(t, &c, "shared_heads", "7", "top_k", "1", NULL);
    CHECK(t, c.attn.shared_heads == 7 && c.attn.top_k == 1, "7 shared + 1 routed");
}

static void test_hf_keys(test_ctx *t) {
    moh_lm_config c;
    expect_ok(t, &c, "architectures", "[\"LlamaForCausalLM\"]", "model_type", "\"llama\"",
              "hidden_act", "\"silu\"", "torch_dtype", "\"bfloat16\"", "attention_bias", "false",
              "mlp_bias", "false", "attention_dropout", "0.0", "initializer_range", "0.02",
              "bos_token_id", "1", "eos_token_id", "[2, 3]", "pad_token_id", "null",
              "pretraining_tp", "1", "rope_scaling", "null", "use_cache", "true",
              "transformers_version", "\"4.46.0\"", "_name_or_path", "\"meta-llama/x\"",
              "_comment", "{\"any\": [1]}", "comment_2", "\"free text\"", NULL);
    CHECK(t, c.hidden_size == 256 && c.top_k == 4, "HF keys ignored");
}

/* HF rope_scaling: llama3, linear, default and null parse (with "rope_type" or the older "type")
 * and round trip; every malformed one is a one-line error naming the field. */
static void test_rope_scaling(test_ctx *t) {
    const int C = MOH_E_CONFIG;
    moh_lm_config c;
    const char *l3 = "{\"factor\": 8.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, "
                     "\"original_max_position_embeddings\": 8192, \"rope_type\": \"llama3\"}";
    expect_ok(t, &c, "rope_theta", "500000.0", "rope_scaling", l3, NULL);
    CHECK(t, c.rope_scaling.type == MOH_ROPE_LLAMA3 && c.rope_scaling.factor == 8.0 &&
                 c.rope_scaling.low_freq_factor == 1.0 && c.rope_scaling.high_freq_factor == 4.0 &&
                 c.rope_scaling.original_max_position_embeddings == 8192 &&
                 !memcmp(&c.attn.rope_scaling, &c.rope_scaling, sizeof c.rope_scaling),
          "llama3 fields and the derived attn config");
    check_round_trip(t, &c, "llama3");
    char *json = moh_lm_config_to_json(&c);
    CHECK(t, json && strstr(json, "\"rope_type\":\t\"llama3\"") && strstr(json, "\"original_max_position_embeddings\":\t8192"),
          "to_json writes HF's rope_scaling keys: %s", json ? json : "(null)");
    free(json);
    expect_ok(t, &c, "rope_scaling", "{\"type\": \"linear\", \"factor\": 2.5}", NULL);
    CHECK(t, c.rope_scaling.type == MOH_ROPE_LINEAR && c.rope_scaling.factor == 2.5, "linear via 'type'");
    check_round_trip(t, &c, "linear");
    expect_ok(t, &c, "rope_scaling", "{\"rope_type\": \"linear\", \"type\": \"linear\", \"factor\": 4}", NULL);
    CHECK(t, c.rope_scaling.type == MOH_ROPE_LINEAR && c.rope_scaling.factor == 4.0, "both keys, same type");
    expect_ok(t, &c, "rope_scaling", "{\"rope_type\": \"default\"}", NULL);
    CHECK(t, c.rope_scaling.type == MOH_ROPE_DEFAULT, "default");
    json = moh_lm_config_to_json(&c);
    CHECK(t, json && !strstr(json, "rope_scaling"), "no rope_scaling key without scaling");
    free(json);
    expect_ok(t, &c, "rope_scaling", "null", NULL);
    CHECK(t, c.rope_scaling.type == MOH_ROPE_DEFAULT && c.attn.rope_scaling.type == MOH_ROPE_DEFAULT, "null");

    /* transformers 5 writes rope_parameters, rope_theta inside */
    expect_ok(t, &c, "rope_parameters", "{\"rope_theta\": 100000.0, \"rope_type\": \"default\"}", NULL);
    CHECK(t, c.rope_theta == 100000.0 && c.attn.rope_theta == 100000.0 && c.rope_scaling.type == MOH_ROPE_DEFAULT,
          "rope_parameters default: theta %g", c.rope_theta);
    expect_ok(t, &c, "rope_theta", "500000", "rope_parameters",
              "{\"factor\": 8.0, \"high_freq_factor\": 4.0, \"low_freq_factor\": 1.0, "
              "\"original_max_position_embeddings\": 8192, \"rope_theta\": 500000.0, \"rope_type\": \"llama3\"}", NULL);
    CHECK(t, c.rope_theta == 500000.0 && c.rope_scaling.type == MOH_ROPE_LLAMA3 && c.rope_scaling.factor == 8.0,
          "rope_parameters llama3");
    check_round_trip(t, &c, "rope_parameters llama3");
    expect_bad(t, C, "rope_theta", "10000", "rope_parameters", "{\"rope_theta\": 500000, \"rope_type\": \"default\"}",
               NULL, "field 'rope_parameters.rope_theta'", "5e+05", "10000", NULL);
    expect_bad(t, C, "rope_parameters", "{\"rope_theta\": 500000, \"rope_type\": \"yarn\", \"factor\": 4}", NULL,
               "field 'rope_parameters.rope_type'", "\"yarn\"", "\"llama3\"", NULL);
    expect_bad(t, C, "rope_parameters", "{\"rope_theta\": 500000, \"rope_type\": \"default\", "
               "\"partial_rotary_factor\": 0.5}", NULL, "unknown field 'partial_rotary_factor'", "rope_parameters", NULL);
    expect_bad(t, C, "rope_scaling", "{\"rope_type\": \"linear\", \"factor\": 2}", "rope_parameters",
               "{\"rope_type\": \"default\"}", NULL, "'rope_scaling' and 'rope_parameters'", NULL);

    /* types moh does not implement: config.json, the field, the accepted values */
    static const char *const other[] = {"dynamic", "yarn", "longrope", "su", "mrope", "LLAMA3"};
    for (size_t i = 0; i < sizeof other / sizeof other[0]; i++) {
        char v[128], got[32];
        snprintf(v, sizeof v, "{\"rope_type\": \"%s\", \"factor\": 2.0}", other[i]);
        snprintf(got, sizeof got, "\"%s\"", other[i]);
        expect_bad(t, C, "rope_scaling", v, NULL, "field 'rope_scaling.rope_type'", got, "\"default\"",
                   "\"linear\"", "\"llama3\"", NULL);
    }
    expect_bad(t, C, "rope_scaling", "{\"type\": \"dynamic\", \"factor\": 2.0}", NULL,
               "field 'rope_scaling.type'", "\"dynamic\"", "\"llama3\"", NULL);
    expect_bad(t, C, "rope_scaling", "{\"rope_type\": 3}", NULL, "field 'rope_scaling.rope_type'", "3", NULL);
    expect_bad(t, C, "rope_scaling", "{\"factor\": 2.0}", NULL, "missing field 'rope_scaling.rope_type'", NULL);
    expect_bad(t, C, "rope_scaling", "{\"rope_type\": \"linear\", \"type\": \"llama3\", \"factor\": 2}",
               NULL, "'rope_scaling.rope_type'", "'rope_scaling.type'", "disagree", NULL);
    expect_bad(t, C, "rope_scaling", "\"linear\"", NULL, "field 'rope_scaling'", "\"linear\"", NULL);
    expect_bad(t, C, "rope_scaling", "[1]", NULL, "field 'rope_scaling'", NULL);
    expect_bad(t, C, "rope_scaling", "{\"rope_type\": \"linear\"}", NULL,
               "missing field 'rope_scaling.factor'", "\"linear\"", NULL);
    expect_bad(t, C, "rope_scaling", "{\"rope_type\": \"linear\", \"factor\": 2, \"beta_fast\": 32}", NULL,
               "unknown field 'beta_fast'", "rope_scaling", NULL);
    expect_bad(t, C, "rope_scaling", "{\"rope_type\": \"linear\", \"factor\": 2, \"low_freq_factor\": 1}",
               NULL, "field 'rope_scaling.low_freq_factor'", "\"linear\"", NULL);
    expect_bad(t, C, "rope_scaling", "{\"rope_type\": \"default\", \"factor\": 2}", NULL,
               "field 'rope_scaling.factor'", "\"default\"", NULL);
    expect_bad(t, C, "rope_scaling", "{\"rope_type\": \"linear\", \"factor\": \"2\"}", NULL,
               "field 'rope_scaling.factor'", "finite number", NULL);
    expect_bad(t, C, "rope_scaling", "{\"rope_type\": \"linear\", \"factor\": -2}", NULL,
               "field 'rope_scaling.factor'", "> 0", "-2", NULL);
    expect_bad(t, C, "rope_scaling", "{\"rope_type\": \"linear\", \"factor\": 0}", NULL,
               "field 'rope_scaling.factor'", "> 0", NULL);
    expect_bad(t, C, "rope_scaling", "{\"rope_type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": 1, "
               "\"high_freq_factor\": 4}", NULL, "missing field 'rope_scaling.original_max_position_embeddings'",
               "\"llama3\"", NULL);
    /* llama3 parameters out of range: low, high, original -> the field and what it expects */
    static const struct { const char *low, *high, *orig, *field, *want; } l3_bad[] = {
        {"4", "4", "8192", "field 'rope_scaling.high_freq_factor'", "> low_freq_factor 4"},
        {"0", "4", "8192", "field 'rope_scaling.low_freq_factor'", "> 0"},
        {"1", "4", "0", "field 'rope_scaling.original_max_position_embeddings'", "> 0"},
        {"1", "4", "81.5", "field 'rope_scaling.original_max_position_embeddings'", "integer"},
    };
    for (size_t i = 0; i < sizeof l3_bad / sizeof l3_bad[0]; i++) {
        char v[256];
        snprintf(v, sizeof v, "{\"rope_type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": %s, "
                 "\"high_freq_factor\": %s, \"original_max_position_embeddings\": %s}", l3_bad[i].low, l3_bad[i].high,
                 l3_bad[i].orig);
        expect_bad(t, C, "rope_scaling", v, NULL, l3_bad[i].field, l3_bad[i].want, NULL);
    }

    /* a struct built in code is validated too */
    moh_attn_config a;
    moh_attn_config_default(&a);
    a.hidden_size = 64;
    a.n_heads = a.n_kv_heads = 4;
    a.head_dim = 16;
    a.rope_scaling.type = MOH_ROPE_LINEAR;
    a.rope_scaling.factor = 2;
    moh_error err = {0};
    CHECK(t, moh_attn_config_validate(&a, LABEL, &err) == MOH_E_CONFIG && strstr(err.msg, "rope_theta"),
          "scaling without RoPE: %s", err.msg);
    a.rope_theta = 10000;
    CHECK(t, moh_attn_config_validate(&a, LABEL, &err) == MOH_OK, "linear: %s", err.msg);
    a.rope_scaling.type = (moh_rope_type)7;
    CHECK(t, moh_attn_config_validate(&a, LABEL, &err) == MOH_E_CONFIG && strstr(err.msg, "rope_scaling.rope_type"),
          "unknown enum value: %s", err.msg);
}

static void test_invalid(test_ctx *t) {
    const int F = MOH_E_FORMAT, C = MOH_E_CONFIG;
    /* syntax and shape of the document */
    expect_bad_text(t, F, "{\"hidden_size\": 64,", "not valid JSON", "line 1", NULL);
    expect_bad_text(t, F, "{\n  \"hidden_size\": 64\n}\n}", "unexpected text", "line 4", NULL);
    expect_bad_text(t, C, "", "empty", NULL);
    expect_bad_text(t, C, "[1, 2]", "expected a JSON object", NULL);
    expect_bad_text(t, C, "{}", "missing field 'hidden_size'", NULL);
    /* unknown and repeated keys */
    expect_bad(t, C, "hiden_size", "64", NULL, "unknown field 'hiden_size'", NULL);
    expect_bad(t, C, "rope_type", "\"default\"", NULL, "unknown field 'rope_type'", NULL);
    expect_bad_text(t, C,
                    "{\"hidden_size\": 64, \"num_hidden_layers\": 1, \"num_attention_heads\": 4, "
                    "\"hidden_size\": 32}",
                    "'hidden_size' appears twice", NULL);
    /* required sizes: missing, type, sign, range */
    expect_bad(t, C, "vocab_size", NULL, NULL, "missing field 'vocab_size'", NULL);
    expect_bad(t, C, "max_position_embeddings", NULL, NULL, "missing field 'max_position_embeddings'",
               NULL);
    expect_bad(t, C, "hidden_size", "-256", NULL, "field 'hidden_size'", "> 0", "-256", NULL);
    expect_bad(t, C, "num_hidden_layers", "0", NULL, "field 'num_hidden_layers'", "> 0", NULL);
    expect_bad(t, C, "intermediate_size", "-1", NULL, "field 'intermediate_size'", NULL);
    expect_bad(t, C, "vocab_size", "-5", NULL, "field 'vocab_size'", NULL);
    expect_bad(t, C, "max_position_embeddings", "-64", NULL, "field 'max_position_embeddings'",
               NULL);
    expect_bad(t, C, "num_hidden_layers", "1.5", NULL, "field 'num_hidden_layers'",
               "expected an integer", "1.5", NULL);
    expect_bad(t, C, "hidden_size", "\"256\"", NULL, "field 'hidden_size'", "expected an integer",
               "\"256\"", NULL);
    expect_bad(t, C, "hidden_size", "3e9", NULL, "field 'hidden_size'", "3e+09", NULL);
    /* lm_config.c's limit message lists every limit rather than naming the field */
    expect_bad(t, C, "num_hidden_layers", "100000", NULL, "limits", "layers <= 1024", NULL);
    expect_bad(t, C, "vocab_size", "20000000", NULL, "limits", "vocab_size <= 2^24", NULL);
    /* heads */
    expect_bad(t, C, "num_attention_heads", "-8", NULL, "field 'num_attention_heads'", NULL);
    expect_bad(t, C, "hidden_size", "250", NULL, "field 'num_attention_heads'", "8",
               "hidden_size 250", NULL);
    expect_bad(t, C, "num_key_value_heads", "3", NULL, "field 'num_key_value_heads'", "3",
               "divisor", NULL);
    expect_bad(t, C, "num_key_value_heads", "0", NULL, "field 'num_key_value_heads'", "> 0", NULL);
    expect_bad(t, C, "num_key_value_heads", "-2", NULL, "field 'num_key_value_heads'", NULL);
    expect_bad(t, C, "head_dim", "-4", NULL, "field 'head_dim'", "> 0", NULL);
    expect_bad(t, C, "head_dim", "7", NULL, "field 'head_dim'", "even", NULL);
    /* routing */
    expect_bad(t, C, "top_k", "7", NULL, "field 'top_k'", "7", "1..6", "shared_heads 2", NULL);
    expect_bad(t, C, "top_k", "0", NULL, "field 'top_k'", "router \"learned\"", NULL);
    expect_bad(t, C, "top_k", "-1", NULL, "field 'top_k'", ">= 0", NULL);
    expect_bad(t, C, "top_k", "2.5", NULL, "field 'top_k'", "expected an integer", NULL);
    expect_bad(t, C, "shared_heads", "8", "top_k", "1", NULL, "field 'shared_heads'", "0..7",
               NULL);
    expect_bad(t, C, "shared_heads", "-1", NULL, "field 'shared_heads'", ">= 0", NULL);
    expect_bad(t, C, "router", "\"mixture\"", NULL, "field 'router'", "\"mixture\"", "learned",
               NULL);
    expect_bad(t, C, "router", "1", NULL, "field 'router'", NULL);
    expect_bad(t, C, "router", "\"query_norm\"", "top_k", "0", NULL, "field 'top_k'", "query_norm", NULL);
    expect_bad(t, C, "router", "\"query_norm\"", "shared_heads", "8", "top_k", "1", NULL,
               "field 'shared_heads'", "0..7", NULL);
    expect_bad(t, C, "straight_through", "true", NULL, "field 'straight_through'", "query_norm", NULL);
    expect_bad(t, C, "router", "\"query_norm\"", "straight_through", "1", NULL, "field 'straight_through'", NULL);
    /* numbers */
    expect_bad(t, C, "rms_norm_eps", "0", NULL, "field 'rms_norm_eps'", NULL);
    expect_bad(t, C, "rms_norm_eps", "2", NULL, "field 'rms_norm_eps'", NULL);
    expect_bad(t, C, "rms_norm_eps", "\"1e-5\"", NULL, "field 'rms_norm_eps'", "finite number",
               NULL);
    expect_bad(t, C, "rope_theta", "0", NULL, "field 'rope_theta'", NULL);
    expect_bad(t, C, "rope_theta", "-10000", NULL, "field 'rope_theta'", NULL);
    expect_bad(t, C, "rope_theta", "null", NULL, "field 'rope_theta'", "null", NULL);
    expect_bad(t, C, "load_balance_coef", "-0.1", NULL, "field 'load_balance_coef'", ">= 0", NULL);
    expect_bad(t, C, "load_balance_coef", "true", NULL, "field 'load_balance_coef'", NULL);
    expect_bad(t, C, "tie_word_embeddings", "1", NULL, "field 'tie_word_embeddings'",
               "true or false", NULL);
    /* HF keys that would change the model */
    expect_bad(t, C, "hidden_act", "\"gelu\"", NULL, "field 'hidden_act'", "\"silu\"", "\"gelu\"",
               NULL);
    expect_bad(t, C, "hidden_act", "null", NULL, "field 'hidden_act'", NULL);
    expect_bad(t, C, "attention_bias", "true", NULL, "field 'attention_bias'", "false", NULL);
    expect_bad(t, C, "mlp_bias", "true", NULL, "field 'mlp_bias'", "false", NULL);
    expect_bad(t, C, "mlp_bias", "\"no\"", NULL, "field 'mlp_bias'", NULL);

    /* arguments */
    moh_lm_config c;
    moh_error err = {0};
    CHECK(t, moh_lm_config_parse_json(NULL, "{}", 2, LABEL, &err) == MOH_E_ARG, "NULL cfg");
    CHECK(t, moh_lm_config_parse_json(&c, NULL, 5, LABEL, &err) == MOH_E_ARG, "NULL text");
    /* not NUL-terminated: only len bytes are read */
    const char *json = "{\"hidden_size\": 64}garbage";
    CHECK(t, moh_lm_config_parse_json(&c, json, 19, NULL, &err) == MOH_E_CONFIG &&
                 strstr(err.msg, "num_hidden_layers") && strncmp(err.msg, "<config>: ", 10) == 0,
          "length honoured: %s", err.msg);
}

static void test_round_trip_struct(test_ctx *t) {
    moh_lm_config c;
    memset(&c, 0, sizeof c);
    c.hidden_size = 96;
    c.num_hidden_layers = 3;
    c.num_attention_heads = 6;
    c.num_key_value_heads = 2;
    c.head_dim = 20;
    c.intermediate_size = 250;
    c.vocab_size = 300;
    c.max_position_embeddings = 77;
    c.rms_norm_eps = 1.0 / 3.0 * 1e-5; /* not a short decimal */
    c.rope_theta = 12345.678901234567;
    c.tie_word_embeddings = true;
    c.shared_heads = 1;
    c.top_k = 3;
    c.router = MOH_ROUTER_LEARNED;
    /* Not 0.1 + 0.2: cJSON prints numbers with %.15g unless that is more than an ulp away, so a
     * value one ulp from a short decimal (0.30000000000000004) comes back as 0.3. */
    c.load_balance_coef = 0.0625;
    moh_error err = {0};
    CHECK(t, moh_lm_config_finalize(&c, "struct", &err) == MOH_OK, "finalize: %s", err.msg);
    check_round_trip(t, &c, "odd values");
}

/* The config.json of HuggingFaceTB/SmolLM2-135M-Instruct as published (keys and values), which
 * moh must load as the dense model; rope_interleaved true is refused. */
static void test_smollm2_hf(test_ctx *t) {
    static const char *cfg =
        "{\"architectures\": [\"LlamaForCausalLM\"], \"attention_bias\": false, \"attention_dropout\": 0.0, "
        "\"bos_token_id\": 1, \"eos_token_id\": 2, \"hidden_act\": \"silu\", \"hidden_size\": 576, "
        "\"initializer_range\": 0.041666666666666664, \"intermediate_size\": 1536, \"is_llama_config\": true, "
        "\"max_position_embeddings\": 8192, \"mlp_bias\": false, \"model_type\": \"llama\", "
        "\"num_attention_heads\": 9, \"num_hidden_layers\": 30, \"num_key_value_heads\": 3, "
        "\"pad_token_id\": 2, \"pretraining_tp\": 1, \"rms_norm_eps\": 1e-05, \"rope_interleaved\": false, "
        "\"rope_scaling\": null, \"rope_theta\": 100000, \"tie_word_embeddings\": true, "
        "\"torch_dtype\": \"bfloat16\", \"transformers.js_config\": {\"kv_cache_dtype\": {\"q4f16\": \"float16\", "
        "\"fp16\": \"float16\"}}, \"transformers_version\": \"4.42.3\", \"use_cache\": true, \"vocab_size\": 49152}";
    moh_lm_config c;
    moh_error err = {0};
    int rc = parse(&c, cfg, &err);
    CHECK(t, rc == MOH_OK && c.router == MOH_ROUTER_NONE && c.num_key_value_heads == 3 && c.head_dim == 64 &&
          c.tie_word_embeddings && c.rope_theta == 100000, "SmolLM2's HF config: rc %d %s", rc, err.msg);
    char bad[2048];
    snprintf(bad, sizeof bad, "%s", cfg);
    char *p = strstr(bad, "\"rope_interleaved\": false");
    memcpy(p + strlen("\"rope_interleaved\": "), "true ", 5);
    const char *const words[] = {"field 'rope_interleaved'", "rotate", NULL};
    check_msg(t, "rope_interleaved true", parse(&c, bad, &err), MOH_E_CONFIG, &err, words);
    rc = parse(&c, "{\"hidden_size\": 64, \"num_hidden_layers\": 1, \"num_attention_heads\": 4, \"intermediate_size\": 8, "
                   "\"vocab_size\": 256, \"max_position_embeddings\": 8, \"dtype\": \"float32\"}", &err);
    CHECK(t, rc == MOH_OK, "transformers 5's 'dtype' key: %s", err.msg);
}

/* Query-norm router (converted pretrained models, issue 11): straight-through by default,
 * switchable, carried into the attention config and through config.json. */
static void test_query_norm(test_ctx *t) {
    moh_lm_config c;
    expect_ok(t, &c, "router", "\"query_norm\"", "num_key_value_heads", "2", NULL);
    CHECK(t, c.router == MOH_ROUTER_QUERY_NORM && c.attn.router == MOH_ROUTER_QUERY_NORM &&
          c.straight_through && c.attn.straight_through && c.attn.shared_heads == 2 && c.attn.top_k == 4,
          "query_norm: router %d ste %d/%d hs %d K %d", c.router, c.straight_through, c.attn.straight_through,
          c.attn.shared_heads, c.attn.top_k);
    check_round_trip(t, &c, "query_norm");
    expect_ok(t, &c, "router", "\"query_norm\"", "straight_through", "false", NULL);
    CHECK(t, !c.straight_through && !c.attn.straight_through, "straight_through false is kept");
    check_round_trip(t, &c, "query_norm without STE");
    expect_ok(t, &c, NULL);
    CHECK(t, !c.straight_through && !c.attn.straight_through, "learned router: no STE");
    /* a plain HF LlamaConfig (no MoH key) is the dense model; top_k alone means the learned router */
    expect_ok(t, &c, "router", NULL, "shared_heads", NULL, "top_k", NULL, NULL);
    CHECK(t, c.router == MOH_ROUTER_NONE && c.attn.router == MOH_ROUTER_NONE, "no MoH key: router %d, want none", c.router);
    expect_ok(t, &c, "router", NULL, "shared_heads", NULL, NULL);
    CHECK(t, c.router == MOH_ROUTER_LEARNED, "top_k without router: router %d, want learned", c.router);
}

int main(void) {
    test_ctx t = {0, 0};
    test_repo_configs(&t);
    test_defaults(&t);
    test_hf_keys(&t);
    test_invalid(&t);
    test_rope_scaling(&t);
    test_round_trip_struct(&t);
    test_query_norm(&t);
    test_smollm2_hf(&t);
    return test_finish("test_lm_config", &t);
}
