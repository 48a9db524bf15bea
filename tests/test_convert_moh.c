/* MHA -> MoH conversion (model_convert_routing, issue 11): the converted model keeps every weight
 * and only changes the routing. With top_k = all routed heads, the query-norm router (and the
 * learned router with zero-initialised wg) gives the dense model's logits (<= 1e-5 relative) on
 * both attention paths; with fewer heads the logits move; the config, KV layout and tensors are
 * what the recipe says; a routed model, a bad head split and a family check are refused. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/lm.h"
#include "models/model.h"
#include "test_util.h"

#define DENSE "tests/fixtures/lm/dense_tied_gqa" /* 4 query heads on 2 KV heads, tied head */
#define ROUTED "tests/fixtures/lm/moh_75"

/* Logits [B, T, V] of m on tokens through the reference (sparse = false) or head-sparse path. */
static float *logits_of(test_ctx *ctx, const model *m, const int *tokens, int B, int T, bool sparse) {
    const moh_lm_config *cfg = m->cfg;
    lm_acts_f32 a = {0};
    moh_error err;
    int rc = sparse ? lm_acts_init_sparse_f32(&a, cfg, B, T, &err) : lm_acts_init_f32(&a, cfg, B, T, &err);
    CHECK(ctx, rc == MOH_OK, "acts: %s", err.msg);
    if (rc) return NULL;
    lm_forward_f32(cfg, m->params, &a, tokens, NULL, B, T);
    const size_t n = (size_t)B * T * cfg->vocab_size;
    float *out = malloc(sizeof(float) * n);
    memcpy(out, a.logits, sizeof(float) * n);
    lm_acts_free_f32(&a);
    return out;
}

static void check_equal_logits(test_ctx *ctx, const char *what, const model *dense, const model *moh,
                               const int *tokens, int B, int T, double tol, bool want_equal) {
    const long n = (long)B * T * ((const moh_lm_config *)dense->cfg)->vocab_size;
    float *ref = logits_of(ctx, dense, tokens, B, T, false);
    for (int sparse = 0; sparse < 2 && ref; sparse++) {
        float *got = logits_of(ctx, moh, tokens, B, T, sparse);
        if (!got) continue;
        const double e = test_rel_err_f32(got, ref, n);
        if (want_equal)
            CHECK(ctx, e <= tol, "%s (%s path): logits differ from the dense model by %.3g > %g", what,
                  sparse ? "sparse" : "reference", e, tol);
        else
            CHECK(ctx, e > 1e-3, "%s (%s path): logits equal the dense model's (%.3g): routing had no effect", what,
                  sparse ? "sparse" : "reference", e);
        printf("  %-40s %-9s rel diff vs dense %.2e\n", what, sparse ? "sparse" : "reference", e);
        free(got);
    }
    free(ref);
}

static void convert_case(test_ctx *ctx, model *dense, moh_router router, int hs, int K, double std,
                         const int *tokens, int B, int T, bool want_equal, const char *what) {
    model conv;
    moh_error err;
    const model_routing r = {.router = router, .shared_heads = hs, .top_k = K, .straight_through = true,
                             .router_std = std, .seed = 7};
    int rc = model_convert_routing(dense, &r, &conv, &err);
    CHECK(ctx, rc == MOH_OK, "%s: %s", what, err.msg);
    if (rc) return;
    const moh_lm_config *c = conv.cfg, *d = dense->cfg;
    CHECK(ctx, c->router == router && c->attn.shared_heads == hs && c->attn.top_k == K &&
          c->attn.n_kv_heads == d->attn.n_kv_heads && c->hidden_size == d->hidden_size &&
          c->attn.straight_through == (router == MOH_ROUTER_QUERY_NORM),
          "%s: converted config (router %d, hs %d, K %d, kv %d, ste %d)", what, c->router, c->attn.shared_heads,
          c->attn.top_k, c->attn.n_kv_heads, c->attn.straight_through);
    /* every dense tensor copied bit for bit; the learned router adds wg (random), wg_0/wg_1 (zero) */
    int nd = 0, nc = 0;
    model_tensor *td = model_tensors(dense, &nd), *tc = model_tensors(&conv, &nc);
    int copied = 0, router_t = 0;
    for (int i = 0; i < nc; i++) {
        int k = 0;
        while (k < nd && strcmp(td[k].name, tc[i].name)) k++;
        if (k < nd) {
            copied += !memcmp(dense->data + td[k].offset, conv.data + tc[i].offset, sizeof(float) * tc[i].numel);
            continue;
        }
        router_t++;
        double ss = 0.0;
        for (size_t e = 0; e < tc[i].numel; e++) ss += (double)conv.data[tc[i].offset + e] * conv.data[tc[i].offset + e];
        const bool wg = strstr(tc[i].name, "wg.weight") != NULL;
        CHECK(ctx, wg ? (std > 0 ? ss > 0 : ss == 0) : ss == 0, "%s: router tensor %s init (sum sq %g)", what,
              tc[i].name, ss);
    }
    CHECK(ctx, copied == nd, "%s: %d of %d dense tensors copied exactly", what, copied, nd);
    const int L = d->num_hidden_layers;
    const int want_router = router == MOH_ROUTER_LEARNED ? L * (1 + (hs >= 1) + (hs >= 2)) : 0;
    CHECK(ctx, router_t == want_router, "%s: %d router tensors, want %d", what, router_t, want_router);
    free(td);
    free(tc);
    check_equal_logits(ctx, what, dense, &conv, tokens, B, T, 1e-5, want_equal);
    model_free(&conv);
}

int main(void) {
    test_ctx ctx = {0};
    model dense, routed;
    moh_error err;
    int rc = model_load(&dense, DENSE, &err);
    CHECK(&ctx, rc == MOH_OK, "%s: %s", DENSE, err.msg);
    if (rc) return test_finish("test_convert_moh", &ctx);
    const moh_lm_config *dc = dense.cfg;
    const int B = 2, T = 24, h = dc->num_attention_heads;
    int *tokens = malloc(sizeof(int) * B * T);
    test_rng rng = {0x5EED};
    for (int i = 0; i < B * T; i++) tokens[i] = (int)(test_rng_u64(&rng) % (uint64_t)dc->vocab_size);

    /* all routed heads selected: nothing but the routing changes */
    convert_case(&ctx, &dense, MOH_ROUTER_QUERY_NORM, 1, h - 1, 0, tokens, B, T, true, "query_norm hs=1 K=all");
    convert_case(&ctx, &dense, MOH_ROUTER_QUERY_NORM, 2, h - 2, 0, tokens, B, T, true, "query_norm hs=2 K=all");
    convert_case(&ctx, &dense, MOH_ROUTER_LEARNED, 2, h - 2, 0, tokens, B, T, true, "learned std=0 hs=2 K=all");
    /* fewer heads: the model changes */
    convert_case(&ctx, &dense, MOH_ROUTER_QUERY_NORM, 2, 1, 0, tokens, B, T, false, "query_norm hs=2 K=1 (75%)");
    convert_case(&ctx, &dense, MOH_ROUTER_LEARNED, 1, 2, 1e-3, tokens, B, T, false, "learned hs=1 K=2");

    /* refusals: an already routed model; a split the config check rejects (names the field) */
    model conv;
    const model_routing ok = {.router = MOH_ROUTER_QUERY_NORM, .shared_heads = 1, .top_k = 1};
    rc = model_load(&routed, ROUTED, &err);
    CHECK(&ctx, rc == MOH_OK, "%s: %s", ROUTED, err.msg);
    if (!rc) {
        rc = model_convert_routing(&routed, &ok, &conv, &err);
        CHECK(&ctx, rc == MOH_E_ARG && strstr(err.msg, "already routes"), "routed source: rc %d '%s'", rc, err.msg);
        model_free(&routed);
    }
    const model_routing bad = {.router = MOH_ROUTER_QUERY_NORM, .shared_heads = 1, .top_k = h};
    rc = model_convert_routing(&dense, &bad, &conv, &err);
    CHECK(&ctx, rc == MOH_E_CONFIG && strstr(err.msg, "top_k"), "top_k > routed heads: rc %d '%s'", rc, err.msg);
    CHECK(&ctx, conv.data == NULL && conv.cfg == NULL, "a failed conversion leaves dst empty");
    free(tokens);
    model_free(&dense);
    return test_finish("test_convert_moh", &ctx);
}
