/* Layer config: defaults, JSON parsing of every key, router rules, and each invalid case's message. */
#include "moh.h"
#include "test_util.h"

#include <stdarg.h>
#include <string.h>

static int parse(moh_attn_config *c, const char *json, moh_error *err) {
    return moh_attn_config_parse_json(c, json, strlen(json), "layer.json", err);
}

static void expect_ok(test_ctx *t, const char *json, moh_attn_config *c) {
    moh_error err = {0};
    int rc = parse(c, json, &err);
    CHECK(t, rc == MOH_OK, "%s -> rc %d: %s", json, rc, err.msg);
}

/* Expects code and every key word (NULL-terminated list) in the message. */
static void expect_bad(test_ctx *t, int code, const char *json, ...) {
    moh_attn_config c;
    moh_error err = {0};
    int rc = parse(&c, json, &err);
    CHECK(t, rc == code, "%s -> rc %d, expected %d (%s)", json, rc, code, err.msg);
    CHECK(t, strncmp(err.msg, "layer.json: ", 12) == 0, "label missing: %s", err.msg);
    CHECK(t, strchr(err.msg, '\n') == NULL, "message not one line: %s", err.msg);
    va_list ap;
    va_start(ap, json);
    for (const char *w; (w = va_arg(ap, const char *));)
        CHECK(t, strstr(err.msg, w) != NULL, "%s: '%s' not in message: %s", json, w, err.msg);
    va_end(ap);
    printf("  %-70.70s -> %s\n", json, err.msg);
}

static void test_defaults(test_ctx *t) {
    moh_attn_config c;
    memset(&c, 0x5a, sizeof c);
    moh_attn_config_default(&c);
    CHECK(t, c.router == MOH_ROUTER_NONE && c.shared_heads == 0 && c.top_k == 0, "router defaults");
    CHECK(t, !c.causal && !c.qkv_bias && !c.proj_bias && !c.fused_qkv, "bool defaults");
    CHECK(t, c.rope_theta == 0.0 && c.load_balance_coef == 0.0, "number defaults");
    CHECK(t, c.hidden_size == 0 && c.n_heads == 0 && c.n_kv_heads == 0 && c.head_dim == 0,
          "sizes unset");
    moh_error err = {0};
    CHECK(t, moh_attn_config_validate(&c, "d", &err) == MOH_E_CONFIG &&
                 strstr(err.msg, "hidden_size"),
          "defaults need sizes: %s", err.msg);
    c.hidden_size = 32;
    c.n_heads = 4;
    c.n_kv_heads = 4;
    c.head_dim = 8;
    CHECK(t, moh_attn_config_validate(&c, "d", &err) == MOH_OK, "defaults + sizes: %s", err.msg);
    moh_attn_config_default(NULL); /* no crash */
    CHECK(t, moh_attn_config_validate(NULL, "d", &err) == MOH_E_ARG, "NULL config");
}

static void test_valid(test_ctx *t) {
    moh_attn_config c;
    expect_ok(t, "{\"hidden_size\": 64, \"num_attention_heads\": 4}", &c);
    CHECK(t, c.hidden_size == 64 && c.n_heads == 4 && c.n_kv_heads == 4 && c.head_dim == 16,
          "minimal sizes");
    CHECK(t, c.router == MOH_ROUTER_NONE && !c.causal && !c.qkv_bias && !c.proj_bias &&
                 !c.fused_qkv && c.rope_theta == 0.0 && c.load_balance_coef == 0.0,
          "minimal defaults");

    expect_ok(t,
              "{\"_doc\": \"MoH-LLaMA layer\", \"comment\": \"x\", \"comments\": [1, 2],\n"
              " \"hidden_size\": 64, \"num_attention_heads\": 8, \"num_key_value_heads\": 2,\n"
              " \"head_dim\": 8, \"shared_heads\": 2, \"top_k\": 3, \"router\": \"learned\",\n"
              " \"causal\": true, \"qkv_bias\": true, \"proj_bias\": true, \"rope_theta\": 10000,\n"
              " \"load_balance_coef\": 0.01}\n",
              &c);
    CHECK(t, c.n_heads == 8 && c.n_kv_heads == 2 && c.head_dim == 8 && c.shared_heads == 2 &&
                 c.top_k == 3 && c.router == MOH_ROUTER_LEARNED && c.causal && c.qkv_bias &&
                 c.proj_bias && c.rope_theta == 10000.0 && c.load_balance_coef == 0.01 &&
                 !c.fused_qkv,
          "full learned config");

    /* official soft reweighting: every head shared, no top-k */
    expect_ok(t,
              "{\"hidden_size\": 32, \"num_attention_heads\": 4, \"router\": \"learned\", "
              "\"shared_heads\": 4, \"top_k\": 0}",
              &c);
    CHECK(t, c.shared_heads == 4 && c.top_k == 0, "all shared");
    /* query-norm router */
    expect_ok(t,
              "{\"hidden_size\": 32, \"num_attention_heads\": 4, \"router\": \"query_norm\", "
              "\"shared_heads\": 3, \"top_k\": 1}",
              &c);
    CHECK(t, c.router == MOH_ROUTER_QUERY_NORM, "query_norm");
    /* none: values in range are kept and ignored */
    expect_ok(t,
              "{\"hidden_size\": 32, \"num_attention_heads\": 4, \"router\": \"none\", "
              "\"shared_heads\": 1, \"top_k\": 3}",
              &c);
    /* rope null, head_dim given with non-divisible hidden size, odd head_dim without RoPE,
     * float-typed integers, -0 */
    expect_ok(t, "{\"hidden_size\": 100, \"num_attention_heads\": 3, \"head_dim\": 33, "
                 "\"rope_theta\": null, \"load_balance_coef\": 0}",
              &c);
    CHECK(t, c.head_dim == 33 && c.rope_theta == 0.0, "explicit head_dim");
    expect_ok(t, "{\"hidden_size\": 64.0, \"num_attention_heads\": 4e0, \"top_k\": -0}", &c);
    CHECK(t, c.hidden_size == 64 && c.n_heads == 4 && c.top_k == 0, "integral floats");
    expect_ok(t, "  {\"hidden_size\": 8, \"num_attention_heads\": 1, \"rope_theta\": 0.5}  \n\t",
              &c);
    CHECK(t, c.head_dim == 8 && c.rope_theta == 0.5, "whitespace around, small theta");
}

/* Every (router, shared_heads, top_k) for h = 4 against the rules written out independently. */
static void test_all_combinations(test_ctx *t) {
    const char *routers[] = {"none", "learned", "query_norm"};
    const int h = 4;
    int n_ok = 0;
    for (int r = 0; r < 3; r++)
        for (int hs = -1; hs <= h + 1; hs++)
            for (int k = -1; k <= h + 1; k++) {
                char json[256];
                snprintf(json, sizeof json,
                         "{\"hidden_size\": 16, \"num_attention_heads\": %d, \"router\": \"%s\", "
                         "\"shared_heads\": %d, \"top_k\": %d}",
                         h, routers[r], hs, k);
                int E = h - hs;
                int in_range = hs >= 0 && hs <= h && k >= 0 && k <= E;
                int want;
                if (r == 0) want = in_range;
                else if (r == 1) want = in_range && (k == 0 ? hs == h : E >= k);
                else want = in_range && E >= 1 && k >= 1 && k <= E;
                moh_attn_config c;
                moh_error err = {0};
                int rc = parse(&c, json, &err);
                CHECK(t, (rc == MOH_OK) == want, "%s -> rc %d (%s), expected %s", json, rc, err.msg,
                      want ? "ok" : "error");
                if (rc != MOH_OK) {
                    CHECK(t, rc == MOH_E_CONFIG, "rc %d", rc);
                    CHECK(t, strstr(err.msg, "'shared_heads'") || strstr(err.msg, "'top_k'"),
                          "names the field: %s", err.msg);
                } else {
                    n_ok++;
                    CHECK(t, c.shared_heads == hs && c.top_k == k && (int)c.router == r,
                          "values kept");
                }
            }
    printf("  %d of %d router combinations valid\n", n_ok, 3 * 7 * 7);
}

static void test_invalid(test_ctx *t) {
    const int C = MOH_E_CONFIG;
    /* syntax */
    expect_bad(t, MOH_E_FORMAT, "{\"hidden_size\": 64,\n \"num_attention_heads\": }", "not valid JSON",
               "line 2", NULL);
    expect_bad(t, MOH_E_FORMAT, "{\"hidden_size\": 64, \"num_attention_heads\": 4} x",
               "not valid JSON", "after the object", NULL);
    expect_bad(t, MOH_E_FORMAT, "{\"hidden_size\": 64, \"num_attention_heads\": 4,}",
               "not valid JSON", NULL);
    expect_bad(t, C, "[64, 4]", "expected a JSON object", NULL);
    expect_bad(t, C, "", "empty", NULL);
    /* required fields */
    expect_bad(t, C, "{\"num_attention_heads\": 4}", "missing field 'hidden_size'", NULL);
    expect_bad(t, C, "{\"hidden_size\": 64}", "missing field 'num_attention_heads'", NULL);
    /* integers */
    expect_bad(t, C, "{\"hidden_size\": 0, \"num_attention_heads\": 4}", "field 'hidden_size'",
               "> 0", "got 0", NULL);
    expect_bad(t, C, "{\"hidden_size\": -64, \"num_attention_heads\": 4}", "field 'hidden_size'",
               "-64", NULL);
    expect_bad(t, C, "{\"hidden_size\": 4.5, \"num_attention_heads\": 4}", "field 'hidden_size'",
               "integer", "4.5", NULL);
    expect_bad(t, C, "{\"hidden_size\": 1e10, \"num_attention_heads\": 4}", "field 'hidden_size'",
               "integer in", "1e+10", NULL);
    expect_bad(t, C, "{\"hidden_size\": \"64\", \"num_attention_heads\": 4}",
               "field 'hidden_size'", "expected an integer", "\"64\"", NULL);
    expect_bad(t, C, "{\"hidden_size\": true, \"num_attention_heads\": 4}", "field 'hidden_size'",
               "true", NULL);
    expect_bad(t, C, "{\"hidden_size\": 64, \"num_attention_heads\": 0}",
               "field 'num_attention_heads'", "> 0", NULL);
    expect_bad(t, C, "{\"hidden_size\": 64, \"num_attention_heads\": null}",
               "field 'num_attention_heads'", "null", NULL);
    expect_bad(t, C, "{\"hidden_size\": 64, \"num_attention_heads\": 8, \"num_key_value_heads\": 3}",
               "field 'num_key_value_heads'", "got 3", "divisor of num_attention_heads 8", NULL);
    expect_bad(t, C, "{\"hidden_size\": 64, \"num_attention_heads\": 8, \"num_key_value_heads\": 0}",
               "field 'num_key_value_heads'", NULL);
    expect_bad(t, C, "{\"hidden_size\": 100, \"num_attention_heads\": 3}", "field 'head_dim'",
               "hidden_size 100", "num_attention_heads 3", NULL);
    expect_bad(t, C, "{\"hidden_size\": 64, \"num_attention_heads\": 4, \"head_dim\": 0}",
               "field 'head_dim'", NULL);
    expect_bad(t, C,
               "{\"hidden_size\": 64, \"num_attention_heads\": 4, \"head_dim\": 15, "
               "\"rope_theta\": 10000}",
               "field 'head_dim'", "got 15", "even", "RoPE", NULL);
    expect_bad(t, C, "{\"hidden_size\": 63, \"num_attention_heads\": 3, \"rope_theta\": 10000}",
               "field 'head_dim'", "got 21", "even", NULL);
    expect_bad(t, C,
               "{\"hidden_size\": 64, \"num_attention_heads\": 65536, \"head_dim\": 65536}",
               "field 'head_dim'", "too large", NULL);
    /* ranges */
    expect_bad(t, C, "{\"hidden_size\": 64, \"num_attention_heads\": 4, \"shared_heads\": 5}",
               "field 'shared_heads'", "got 5", "0..4", NULL);
    expect_bad(t, C, "{\"hidden_size\": 64, \"num_attention_heads\": 4, \"shared_heads\": -1}",
               "field 'shared_heads'", "got -1", NULL);
    expect_bad(t, C,
               "{\"hidden_size\": 64, \"num_attention_heads\": 4, \"shared_heads\": 1, "
               "\"top_k\": 4}",
               "field 'top_k'", "got 4", "0..3", NULL);
    expect_bad(t, C, "{\"hidden_size\": 64, \"num_attention_heads\": 4, \"top_k\": 2.5}",
               "field 'top_k'", "2.5", NULL);
    /* router */
    expect_bad(t, C, "{\"hidden_size\": 64, \"num_attention_heads\": 4, \"router\": \"topk\"}",
               "field 'router'", "\"learned\", \"query_norm\" or \"none\"", "\"topk\"", NULL);
    expect_bad(t, C, "{\"hidden_size\": 64, \"num_attention_heads\": 4, \"router\": 1}",
               "field 'router'", "got 1", NULL);
    expect_bad(t, C,
               "{\"hidden_size\": 64, \"num_attention_heads\": 4, \"router\": \"learned\", "
               "\"shared_heads\": 2}",
               "field 'top_k'", "learned", "shared_heads 2", NULL);
    expect_bad(t, C,
               "{\"hidden_size\": 64, \"num_attention_heads\": 4, \"router\": \"query_norm\", "
               "\"shared_heads\": 4}",
               "field 'shared_heads'", "query_norm", NULL);
    expect_bad(t, C,
               "{\"hidden_size\": 64, \"num_attention_heads\": 4, \"router\": \"query_norm\", "
               "\"shared_heads\": 1}",
               "field 'top_k'", "query_norm", "1..3", NULL);
    expect_bad(t, C,
               "{\"hidden_size\": 64, \"num_attention_heads\": 4, \"router\": \"none\", "
               "\"top_k\": 7}",
               "field 'top_k'", "got 7", NULL);
    /* booleans */
    {
        moh_attn_config c;
        moh_error err = {0};
        const char *j = "{\"hidden_size\": 64, \"num_attention_heads\": 4, \"causal\": \"yes\"}";
        int rc = parse(&c, j, &err);
        CHECK(t, rc == C && strcmp(err.msg,
                                   "layer.json: field 'causal': expected true or false, got \"yes\"") ==
                                0,
              "causal message: %s", err.msg);
        printf("  %-70.70s -> %s\n", j, err.msg);
    }
    expect_bad(t, C, "{\"hidden_size\": 64, \"num_attention_heads\": 4, \"qkv_bias\": 1}",
               "field 'qkv_bias'", "true or false", "got 1", NULL);
    expect_bad(t, C, "{\"hidden_size\": 64, \"num_attention_heads\": 4, \"proj_bias\": null}",
               "field 'proj_bias'", "null", NULL);
    /* numbers */
    expect_bad(t, C, "{\"hidden_size\": 64, \"num_attention_heads\": 4, \"rope_theta\": 0}",
               "field 'rope_theta'", "> 0", "null", NULL);
    expect_bad(t, C, "{\"hidden_size\": 64, \"num_attention_heads\": 4, \"rope_theta\": -1}",
               "field 'rope_theta'", "-1", NULL);
    expect_bad(t, C, "{\"hidden_size\": 64, \"num_attention_heads\": 4, \"rope_theta\": \"1e4\"}",
               "field 'rope_theta'", "\"1e4\"", NULL);
    expect_bad(t, C, "{\"hidden_size\": 64, \"num_attention_heads\": 4, \"rope_theta\": 1e999}",
               "field 'rope_theta'", NULL);
    expect_bad(t, C,
               "{\"hidden_size\": 64, \"num_attention_heads\": 4, \"load_balance_coef\": -0.1}",
               "field 'load_balance_coef'", ">= 0", "-0.1", NULL);
    expect_bad(t, C,
               "{\"hidden_size\": 64, \"num_attention_heads\": 4, \"load_balance_coef\": [0.1]}",
               "field 'load_balance_coef'", "number", NULL);
    /* unknown and repeated keys */
    expect_bad(t, C, "{\"hidden_size\": 64, \"num_attention_heads\": 4, \"top-k\": 2}",
               "unknown field 'top-k'", NULL);
    expect_bad(t, C, "{\"hidden_size\": 64, \"num_attention_heads\": 4, \"fused_qkv\": true}",
               "unknown field 'fused_qkv'", NULL);
    expect_bad(t, C, "{\"hidden_size\": 64, \"num_attention_heads\": 4, \"Causal\": true}",
               "unknown field 'Causal'", NULL);
    expect_bad(t, C, "{\"hidden_size\": 64, \"num_attention_heads\": 4, \"hidden_size\": 32}",
               "field 'hidden_size' appears twice", NULL);
}

static void test_validate_struct(test_ctx *t) {
    moh_attn_config c;
    moh_error err = {0};
    moh_attn_config_default(&c);
    c.hidden_size = 32;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.head_dim = 8;
    c.fused_qkv = true;
    CHECK(t, moh_attn_config_validate(&c, "s", &err) == MOH_OK, "%s", err.msg);
    c.rope_theta = -1.0; /* <= 0 in the struct: no RoPE */
    CHECK(t, moh_attn_config_validate(&c, "s", &err) == MOH_OK, "%s", err.msg);
    c.rope_theta = NAN;
    CHECK(t, moh_attn_config_validate(&c, "s", &err) == MOH_E_CONFIG &&
                 strstr(err.msg, "rope_theta"),
          "nan theta: %s", err.msg);
    c.rope_theta = 0;
    c.load_balance_coef = NAN;
    CHECK(t, moh_attn_config_validate(&c, "s", &err) == MOH_E_CONFIG &&
                 strstr(err.msg, "load_balance_coef"),
          "nan beta: %s", err.msg);
    c.load_balance_coef = INFINITY;
    CHECK(t, moh_attn_config_validate(&c, "s", &err) == MOH_E_CONFIG, "inf beta");
    c.load_balance_coef = 0;
    c.router = (moh_router)7;
    CHECK(t, moh_attn_config_validate(&c, "s", &err) == MOH_E_CONFIG && strstr(err.msg, "router"),
          "bad enum: %s", err.msg);
    c.router = MOH_ROUTER_NONE;
    c.n_kv_heads = 3;
    CHECK(t, moh_attn_config_validate(&c, NULL, &err) == MOH_E_CONFIG &&
                 strstr(err.msg, "num_key_value_heads"),
          "kv: %s", err.msg);
    CHECK(t, moh_attn_config_validate(&c, NULL, NULL) == MOH_E_CONFIG, "NULL err allowed");

    /* parse failure leaves defaults, NULL arguments */
    c.hidden_size = 99;
    CHECK(t, parse(&c, "{\"hidden_size\": 8}", &err) == MOH_E_CONFIG && c.hidden_size == 0,
          "failed parse resets the config");
    CHECK(t, moh_attn_config_parse_json(&c, NULL, 5, "x", &err) == MOH_E_ARG, "NULL text");
    CHECK(t, moh_attn_config_parse_json(NULL, "{}", 2, "x", &err) == MOH_E_ARG, "NULL config");
    /* length is honoured: text past len is ignored */
    const char *j = "{\"hidden_size\": 8, \"num_attention_heads\": 2}GARBAGE";
    CHECK(t, moh_attn_config_parse_json(&c, j, strlen(j) - 7, NULL, &err) == MOH_OK,
          "len honoured: %s", err.msg);
}

int main(void) {
    test_ctx t = {0, 0};
    test_defaults(&t);
    test_valid(&t);
    test_all_combinations(&t);
    test_invalid(&t);
    test_validate_struct(&t);
    return test_finish("test_config", &t);
}
