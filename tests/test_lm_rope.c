/* Hugging Face rope_scaling against transformers: tests/fixtures/lm_rope/{llama3,linear} (written by
 * tools/ref/rope_scaling_fixtures.py) are HF LLaMA folders with rope_scaling in config.json and the
 * logits LlamaForCausalLM computes for them. Each loads with model_load and gives those logits
 * within 1e-4 relative (max|a-b| / max|b|) through the reference attention, the head-sparse path
 * and KV-cache decoding; the same model without rope_scaling misses them by far (the scaling is
 * exercised); and the config survives moh_lm_config_to_json. */
#include <string.h>

#include "models/lm_decode.h"
#include "models/model.h"
#include "test_util.h"

#define FIXDIR "tests/fixtures/lm_rope"
#define TOL 1e-4

/* Logits [B*T, V] of the full forward, reference (sparse = false) or head-sparse path. */
static int forward(test_ctx *ctx, const moh_lm_config *cfg, const lm_params_f32 *p, const int *tok, int B,
                   int T, bool sparse, float *out) {
    lm_acts_f32 a;
    moh_error err;
    const int rc = sparse ? lm_acts_init_sparse_f32(&a, cfg, B, T, &err) : lm_acts_init_f32(&a, cfg, B, T, &err);
    CHECK(ctx, rc == MOH_OK, "acts: %s", err.msg);
    if (rc != MOH_OK) return rc;
    lm_forward_f32(cfg, p, &a, tok, NULL, B, T);
    memcpy(out, a.logits, sizeof(float) * (size_t)B * T * cfg->vocab_size);
    lm_acts_free_f32(&a);
    return MOH_OK;
}

static void check_fixture(test_ctx *ctx, const char *fix, moh_rope_type type) {
    char dir[256], path[300];
    snprintf(dir, sizeof dir, FIXDIR "/%s", fix);
    model m = {0};
    moh_safetensors want = {0};
    moh_error err;
    int rc = model_load(&m, dir, &err);
    CHECK(ctx, rc == MOH_OK, "%s: model_load: %s", fix, err.msg);
    if (rc != MOH_OK) return;
    const moh_lm_config cfg = *(const moh_lm_config *)m.cfg;
    const lm_params_f32 *p = m.params;
    CHECK(ctx, cfg.rope_scaling.type == type && cfg.attn.rope_scaling.type == type, "%s: rope_scaling type %d",
          fix, (int)cfg.attn.rope_scaling.type);
    snprintf(path, sizeof path, "%s/expected.safetensors", dir);
    rc = moh_st_open(&want, path, &err);
    CHECK(ctx, rc == MOH_OK, "%s", err.msg);
    const moh_st_tensor *tt = rc == MOH_OK ? moh_st_find(&want, "tokens") : NULL;
    CHECK(ctx, tt && tt->ndim == 2, "%s: no 2-D tokens", fix);
    if (!tt || tt->ndim != 2) {
        moh_st_close(&want);
        model_free(&m);
        return;
    }
    const int B = (int)tt->shape[0], T = (int)tt->shape[1], V = cfg.vocab_size;
    const size_t n = (size_t)B * T * V;
    float *tf = malloc(sizeof(float) * (size_t)B * T), *exp = malloc(sizeof(float) * n);
    float *got = malloc(sizeof(float) * n), *dec = malloc(sizeof(float) * n);
    int *tok = malloc(sizeof(int) * (size_t)B * T);
    const int64_t lshape[3] = {B, T, V};
    CHECK(ctx, moh_st_read_f32(&want, "tokens", 2, tt->shape, tf, &err) == MOH_OK, "%s", err.msg);
    CHECK(ctx, moh_st_read_f32(&want, "logits", 3, lshape, exp, &err) == MOH_OK, "%s", err.msg);
    for (int i = 0; i < B * T; i++) tok[i] = (int)tf[i];

    double e_ref = 1, e_sparse = 1, e_dec = 0, e_plain = 0, e_back = 1;
    if (forward(ctx, &cfg, p, tok, B, T, false, got) == MOH_OK) e_ref = test_rel_err_f32(got, exp, (long)n);
    if (forward(ctx, &cfg, p, tok, B, T, true, got) == MOH_OK) e_sparse = test_rel_err_f32(got, exp, (long)n);
    lm_kv_cache kv;
    rc = lm_kv_init(&kv, &cfg, T, &err);
    CHECK(ctx, rc == MOH_OK, "%s: %s", fix, err.msg);
    for (int b = 0; rc == MOH_OK && b < B; b++) {
        lm_kv_reset(&kv);
        for (int t = 0; t < T; t++)
            CHECK(ctx, lm_decode_step(&cfg, p, &kv, tok[b * T + t], dec + ((size_t)b * T + t) * V, &err) == MOH_OK,
                  "%s", err.msg);
    }
    if (rc == MOH_OK) {
        e_dec = test_rel_err_f32(dec, exp, (long)n);
        lm_kv_free(&kv);
    } else e_dec = 1;
    /* without the scaling the logits are far off: the fixture exercises it */
    moh_lm_config plain = cfg;
    memset(&plain.rope_scaling, 0, sizeof plain.rope_scaling);
    CHECK(ctx, moh_lm_config_finalize(&plain, fix, &err) == MOH_OK, "%s", err.msg);
    if (forward(ctx, &plain, p, tok, B, T, false, got) == MOH_OK) e_plain = test_rel_err_f32(got, exp, (long)n);
    /* config.json written by moh (a saved checkpoint) reads back to the same scaling and logits */
    char *json = moh_lm_config_to_json(&cfg);
    moh_lm_config back;
    rc = json ? moh_lm_config_parse_json(&back, json, strlen(json), fix, &err) : MOH_E_NOMEM;
    CHECK(ctx, rc == MOH_OK, "%s: written config.json: %s", fix, err.msg);
    if (rc == MOH_OK) {
        CHECK(ctx, !memcmp(&back.attn.rope_scaling, &cfg.attn.rope_scaling, sizeof back.attn.rope_scaling),
              "%s: rope_scaling changed through config.json", fix);
        if (forward(ctx, &back, p, tok, B, T, false, dec) == MOH_OK) e_back = test_rel_err_f32(dec, exp, (long)n);
    }
    free(json);
    CHECK(ctx, e_ref <= TOL, "%s: reference path rel err %.3g > %g", fix, e_ref, TOL);
    CHECK(ctx, e_sparse <= TOL, "%s: head-sparse path rel err %.3g > %g", fix, e_sparse, TOL);
    CHECK(ctx, e_dec <= TOL, "%s: KV-cache decode rel err %.3g > %g", fix, e_dec, TOL);
    CHECK(ctx, e_back <= TOL, "%s: after the config.json round trip rel err %.3g > %g", fix, e_back, TOL);
    CHECK(ctx, e_plain > 1e-2, "%s: without rope_scaling the logits still match (%.3g): not exercised", fix, e_plain);
    printf("  %-7s B=%d T=%d: rel err reference %.2e, head-sparse %.2e, decode %.2e; unscaled RoPE %.2e\n", fix, B,
           T, e_ref, e_sparse, e_dec, e_plain);
    free(tf), free(exp), free(got), free(dec), free(tok);
    moh_st_close(&want);
    model_free(&m);
}

int main(void) {
    test_ctx ctx = {0};
    check_fixture(&ctx, "llama3", MOH_ROPE_LLAMA3);
    check_fixture(&ctx, "linear", MOH_ROPE_LINEAR);
    return test_finish("test_lm_rope", &ctx);
}
