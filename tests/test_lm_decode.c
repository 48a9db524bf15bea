/* KV-cache decoding (lm_decode_step, which skips unselected heads) gives the same next-token
 * logits as the full causal forward pass at every position, dense and MoH, with GQA. A batched
 * prefill (lm_prefill: head-sparse attention) of a prompt leaves the cache as token-by-token
 * decoding does, and decoding after it gives the same logits; so does lm_feed, run after run into
 * a filled cache (a chat turn after the first in one batched pass). Every product on the calling thread
 * and every product on the OpenMP team (lm_kv_cache.par_work) give the same bits, and the first
 * step calibrates the split (never split where the team is one thread). */
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "models/lm_decode.h"
#include "test_util.h"

static void run(test_ctx *ctx, const char *name, moh_router router, int hkv, bool tied) {
    moh_lm_config c = {0};
    c.hidden_size = 32;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 8;
    c.num_key_value_heads = hkv;
    c.intermediate_size = 48;
    c.vocab_size = 256;
    c.max_position_embeddings = 160;
    c.rms_norm_eps = 1e-5;
    c.rope_theta = 10000;
    c.tie_word_embeddings = tied;
    c.router = router;
    c.shared_heads = 2;
    c.top_k = 3;
    c.load_balance_coef = 0.01;
    moh_error err;
    CHECK(ctx, moh_lm_config_finalize(&c, name, &err) == MOH_OK, "%s", err.msg);
    lm_params_f32 p;
    lm_acts_f32 a;
    lm_kv_cache kv;
    const int T = 150; /* > SPARSE_BK: the prefill's key tiles and query tiles span several blocks */
    CHECK(ctx, lm_params_init_f32(&p, &c, &err) == MOH_OK, "%s", err.msg);
    lm_params_init_random(&c, &p, 11, 0.2);
    CHECK(ctx, lm_acts_init_f32(&a, &c, 1, T, &err) == MOH_OK, "%s", err.msg);
    CHECK(ctx, lm_kv_init(&kv, &c, T, &err) == MOH_OK, "%s", err.msg);
    int tok[150];
    test_rng rng = {99};
    for (int t = 0; t < T; t++) tok[t] = (int)(test_rng_u64(&rng) % 256);
    lm_forward_f32(&c, &p, &a, tok, NULL, 1, T);
    float logits[256];
    double worst = 0.0;
    /* every product on this thread here, every product on the OpenMP team in kv3: the same bits */
    lm_kv_cache kv3;
    CHECK(ctx, lm_kv_init(&kv3, &c, T, &err) == MOH_OK, "%s", err.msg);
    kv.dc.par_work = LONG_MAX;
    kv3.dc.par_work = 1;
    float *serial = malloc(sizeof(float) * (size_t)T * 256);
    CHECK(ctx, serial != NULL, "out of memory");
    for (int t = 0; t < T; t++) {
        CHECK(ctx, lm_decode_step(&c, &p, &kv, tok[t], serial + (size_t)t * 256, &err) == MOH_OK, "%s", err.msg);
        const double e = test_rel_err_f32(serial + (size_t)t * 256, a.logits + (size_t)t * 256, 256);
        worst = e > worst ? e : worst;
    }
    int differ = 0;
    for (int t = 0; t < T; t++) {
        CHECK(ctx, lm_decode_step(&c, &p, &kv3, tok[t], logits, &err) == MOH_OK, "%s", err.msg);
        differ += memcmp(logits, serial + (size_t)t * 256, sizeof logits) != 0;
    }
    CHECK(ctx, differ == 0, "%s: %d of %d tokens' logits change when the products run on the team", name, differ, T);
    CHECK(ctx, kv3.heads_run == kv.heads_run, "%s: the team ran %ld heads, one thread %ld", name, kv3.heads_run, kv.heads_run);
    lm_kv_free(&kv3);
    free(serial);
    CHECK(ctx, worst < 1e-4, "%s: decode logits differ from the full forward: rel %.3g", name, worst);
    const double share = (double)kv.heads_run / (double)kv.heads_total;
    if (router == MOH_ROUTER_NONE) CHECK(ctx, share == 1.0, "%s: dense must run every head", name);
    else CHECK(ctx, fabs(share - 5.0 / 8.0) < 1e-12, "%s: ran %.3f of heads, want 5/8", name, share);
    /* prefill of the first n0 tokens, then decoding: the same cache and logits */
    const int n0 = 133;
    lm_kv_cache kv2;
    lm_prefill_ws ws;
    CHECK(ctx, lm_kv_init(&kv2, &c, T, &err) == MOH_OK, "%s", err.msg);
    CHECK(ctx, lm_prefill_init(&ws, &c, n0, &err) == MOH_OK, "%s", err.msg);
    CHECK(ctx, lm_decode_step(&c, &p, &kv2, tok[0], logits, &err) == MOH_OK, "%s", err.msg); /* emptied by prefill */
    CHECK(ctx, kv2.dc.par_work > 0 && kv2.dc.team_s > 0 && kv2.dc.mac_s > 0 && kv2.dc.team_size >= 1,
          "%s: the first step did not calibrate the team split (par_work %ld, team %.3g s, %.3g s/MAC, %d threads)", name,
          kv2.dc.par_work, kv2.dc.team_s, kv2.dc.mac_s, kv2.dc.team_size);
    /* called where its regions get one thread (inside a parallel region, nesting off): no split,
     * whatever omp_get_max_threads() says */
    lm_kv_cache kv4;
    int rc4 = MOH_E_ARG;
    CHECK(ctx, lm_kv_init(&kv4, &c, T, &err) == MOH_OK, "%s", err.msg);
    omp_set_max_active_levels(1);
#pragma omp parallel num_threads(2)
#pragma omp master
    {
        omp_set_num_threads(2);
        rc4 = lm_kv_calibrate(&kv4, &c, &p, &err);
    }
    CHECK(ctx, rc4 == MOH_OK, "%s: calibrate: %s", name, err.msg);
    CHECK(ctx, kv4.dc.team_size == 1 && kv4.dc.par_work >= (long)1e15,
          "%s: a team of %d thread(s) split from %ld multiply-adds (want never: one thread saves nothing)", name,
          kv4.dc.team_size, kv4.dc.par_work);
    lm_kv_free(&kv4);
    CHECK(ctx, lm_prefill(&c, &p, &kv2, &ws, tok, n0, logits, &err) == MOH_OK, "%s", err.msg);
    double pworst = test_rel_err_f32(logits, a.logits + (size_t)(n0 - 1) * 256, 256);
    CHECK(ctx, kv2.pos == n0, "%s: prefill left pos %d, want %d", name, kv2.pos, n0);
    const int kvd = c.num_key_value_heads * c.head_dim;
    double cworst = 0.0;
    for (int l = 0; l < c.num_hidden_layers; l++)
        for (int g = 0; g < c.num_key_value_heads; g++) {
            const size_t off = ((size_t)l * T * kvd) + (size_t)g * T * c.head_dim, len = (size_t)n0 * c.head_dim;
            const double ek = test_rel_err_f32(kv2.dc.k + off, kv.dc.k + off, (long)len);
            const double ev = test_rel_err_f32(kv2.dc.v + off, kv.dc.v + off, (long)len);
            cworst = ek > cworst ? ek : cworst;
            cworst = ev > cworst ? ev : cworst;
        }
    for (int t = n0; t < T; t++) {
        CHECK(ctx, lm_decode_step(&c, &p, &kv2, tok[t], logits, &err) == MOH_OK, "%s", err.msg);
        const double e = test_rel_err_f32(logits, a.logits + (size_t)t * 256, 256);
        pworst = e > pworst ? e : pworst;
    }
    CHECK(ctx, cworst < 1e-5, "%s: prefill K/V differ from token-by-token decoding: rel %.3g", name, cworst);
    CHECK(ctx, pworst < 1e-4, "%s: logits after prefill differ from the full forward: rel %.3g", name, pworst);
    const double pshare = (double)kv2.heads_run / (double)kv2.heads_total;
    CHECK(ctx, fabs(pshare - share) < 1e-12, "%s: prefill + decode ran %.4f of heads, decode %.4f", name, pshare, share);
    /* lm_feed in runs: the first on the empty cache (prefill), then extending a filled cache in one
     * batched pass (9, 40, 70 tokens: the chat turn after the first), or token by token (3): the
     * logits after each run and the cache agree with token-by-token decoding */
    static const int runs[] = {20, 9, 3, 40, 70};
    lm_kv_cache kv5;
    CHECK(ctx, lm_kv_init(&kv5, &c, T, &err) == MOH_OK, "%s", err.msg);
    double fworst = 0.0, fcache = 0.0;
    for (size_t r = 0, at = 0; r < sizeof runs / sizeof runs[0]; at += (size_t)runs[r++]) {
        CHECK(ctx, lm_feed(&c, &p, &kv5, tok + at, runs[r], logits, &err) == MOH_OK, "%s", err.msg);
        const double e = test_rel_err_f32(logits, a.logits + (at + (size_t)runs[r] - 1) * 256, 256);
        fworst = e > fworst ? e : fworst;
    }
    CHECK(ctx, kv5.pos == 142, "%s: lm_feed left pos %d, want 142", name, kv5.pos);
    for (int l = 0; l < c.num_hidden_layers; l++)
        for (int g = 0; g < c.num_key_value_heads; g++) {
            const size_t off = ((size_t)l * T * kvd) + (size_t)g * T * c.head_dim, len = (size_t)142 * c.head_dim;
            fcache = fmax(fcache, fmax(test_rel_err_f32(kv5.dc.k + off, kv.dc.k + off, (long)len),
                                       test_rel_err_f32(kv5.dc.v + off, kv.dc.v + off, (long)len)));
        }
    CHECK(ctx, fworst < 1e-4 && fcache < 1e-5, "%s: lm_feed logits rel %.3g, cache rel %.3g vs token by token", name,
          fworst, fcache);
    CHECK(ctx, fabs((double)kv5.heads_run / (double)kv5.heads_total - share) < 1e-12, "%s: lm_feed ran %.4f of heads",
          name, (double)kv5.heads_run / (double)kv5.heads_total);
    CHECK(ctx, lm_feed(&c, &p, &kv5, tok, 9, logits, &err) == MOH_E_ARG, "%s: lm_feed past the cache must refuse", name);
    lm_kv_free(&kv5);
    CHECK(ctx, lm_prefill(&c, &p, &kv2, &ws, tok, n0 + 1, logits, &err) == MOH_E_ARG, "%s: prefill past the workspace must refuse", name);
    tok[3] = 256;
    CHECK(ctx, lm_prefill(&c, &p, &kv2, &ws, tok, n0, logits, &err) == MOH_E_ARG, "%s: prefill of a token out of range must refuse", name);
    lm_prefill_free(&ws);
    lm_kv_free(&kv2);
    CHECK(ctx, lm_decode_step(&c, &p, &kv, 1, logits, &err) == MOH_E_ARG, "%s: a full cache must refuse", name);
    CHECK(ctx, (lm_kv_reset(&kv), lm_decode_step(&c, &p, &kv, 300, logits, &err)) == MOH_E_ARG, "%s: token out of range must refuse", name);
    printf("  %-14s worst rel err %.2e (after prefill %.2e, cache %.2e; lm_feed %.2e, cache %.2e), heads run %.3f\n",
           name, worst, pworst, cworst, fworst, fcache, share);
    lm_kv_free(&kv);
    lm_acts_free_f32(&a);
    lm_params_free_f32(&p);
}

int main(void) {
    test_ctx ctx = {0};
    run(&ctx, "dense", MOH_ROUTER_NONE, 8, false);
    run(&ctx, "moh", MOH_ROUTER_LEARNED, 8, false);
    run(&ctx, "moh_gqa_tied", MOH_ROUTER_LEARNED, 2, true);
    run(&ctx, "query_norm_gqa", MOH_ROUTER_QUERY_NORM, 2, true);
    return test_finish("test_lm_decode", &ctx);
}
