/* bf16 KV-cache decoding (lm_kv_init_bf16: bf16 weights and K/V, fp32 accumulation) against fp32,
 * on random weights, in each kernel set this CPU has (vdpbf16ps, AVX-512 widening, portable):
 *  1. kernels: sparse_decode_attend_bf16 / sparse_decode_gemv_bf16 against the fp32 kernels fed
 *     the same bf16-rounded keys, values and weights (odd key counts, head dims with tails, column
 *     blocks): the widening and portable kernels differ only in the order of the sums (1e-5); the
 *     vdpbf16ps kernels also round q, x and the probabilities (bound 2u, u = 2^-8);
 *  2. models (dense, MoH, MoH with GQA and a tied head, query-norm router): the next-token logits of
 *     token-by-token bf16 decoding against fp32 decoding (the head-sparse decode path) and against
 *     the full fp32 forward on the reference attention path (every head, then gated), and after a
 *     bf16 prefill (head-sparse attention with bf16 tiles) against fp32; bf16 decoding with every
 *     product on the OpenMP team gives the same bits as with every product on one thread.
 * Bound for the logits, relative to their largest magnitude: 8u = 3.1e-2. Every weight (and for
 * vdpbf16ps every product input) is rounded once, relative error <= u each, so one product term is
 * off by <= 2u and a dot product of random-sign terms by ~2u of its magnitude; the residual stream
 * adds (not multiplies) the errors of the ~9 chained products of two layers and the head, ~3 x 2u.
 * A wrong layout or a dropped term gives errors of order 1.
 * A token whose bf16 run selects other heads than fp32 in the last layer (a near-tie of the router
 * flipped by rounding) is held to 0.5 only; at most a fifth of the tokens may flip. With a learned
 * router the first layer routes on the embedding in fp32 in both runs, so the last (second)
 * layer's gates (kv.router) show every flip; the query-norm model has one layer (its router reads
 * the bf16 q).
 * Exit 77 when this CPU has no AVX-512 (only the portable kernels could be checked). */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "models/lm_decode.h"
#include "test_util.h"

#define U (1.0 / 256.0) /* bf16 unit roundoff: 8 significant bits */

static void rand_fill(float *x, size_t n, test_rng *r, double scale) {
    for (size_t i = 0; i < n; i++) x[i] = (float)(scale * test_rng_uniform(r));
}
/* x rounded to bf16, in place (fp32 copy), and its bf16 form into h (may be NULL). */
static void round16(float *x, uint16_t *h, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const uint16_t b = bf16_round(x[i]);
        if (h) h[i] = b;
        x[i] = bf16_value(b);
    }
}

static void kernels(test_ctx *ctx, sparse_bf16_isa isa) {
    const double tol = isa == SPARSE_BF16_DP ? 2 * U : 1e-5;
    test_rng r = {7 + (uint64_t)isa};
    static const int ds[] = {16, 20, 40, 64, 128, 130}, ns[] = {1, 2, 17, 33, 100};
    double worst_a = 0, worst_g = 0;
    for (size_t di = 0; di < sizeof ds / sizeof ds[0]; di++)
        for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
            const int d = ds[di], n = ns[ni], ld = d + 3, np = (n + 1) / 2;
            float *q = malloc(sizeof(float) * d), *K = malloc(sizeof(float) * (size_t)n * ld);
            float *V = malloc(sizeof(float) * (size_t)n * ld), *sc = malloc(sizeof(float) * n);
            float *o32 = malloc(sizeof(float) * d), *o16 = malloc(sizeof(float) * d);
            uint16_t *Kb = malloc(sizeof(uint16_t) * (size_t)n * ld), *Vb = malloc(sizeof(uint16_t) * (size_t)np * 2 * ld);
            rand_fill(q, (size_t)d, &r, 2.0);
            rand_fill(K, (size_t)n * ld, &r, 1.0);
            rand_fill(V, (size_t)n * ld, &r, 1.0);
            round16(K, Kb, (size_t)n * ld);
            round16(V, NULL, (size_t)n * ld);
            for (size_t i = 0; i < (size_t)np * 2 * ld; i++) Vb[i] = 0x7FC0; /* NaN: unread slots must stay unread */
            for (int j = 0; j < n; j++)
                for (int e = 0; e < d; e++) Vb[(size_t)(j / 2) * 2 * ld + 2 * e + j % 2] = bf16_round(V[(size_t)j * ld + e]);
            sparse_decode_attend_f32(q, K, V, ld, n, d, 0.7f, sc, o32);
            sparse_decode_attend_bf16(q, Kb, Vb, ld, n, d, 0.7f, sc, o16, isa);
            const double ea = test_rel_err_f32(o16, o32, d);
            worst_a = ea > worst_a ? ea : worst_a;
            CHECK(ctx, ea < tol, "%s attend d %d n %d: rel err %.3g > %.3g", sparse_bf16_isa_name(isa), d, n, ea, tol);
            /* W [rows, 4 d] times the column blocks {3, 1} of x [4 d], rows 1 .. n + 5 */
            const int R = n + 6, W = 4 * d;
            const int blk[2] = {3, 1};
            float *w = malloc(sizeof(float) * (size_t)R * W), *x = malloc(sizeof(float) * W), *b = malloc(sizeof(float) * R);
            float *g32 = malloc(sizeof(float) * R), *g16 = malloc(sizeof(float) * R);
            uint16_t *wb = malloc(sizeof(uint16_t) * (size_t)R * W), *xb = malloc(sizeof(uint16_t) * W);
            rand_fill(w, (size_t)R * W, &r, 1.0);
            rand_fill(x, (size_t)W, &r, 1.0);
            rand_fill(b, (size_t)R, &r, 1.0);
            round16(w, wb, (size_t)R * W);
            for (int i = 0; i < W; i++) xb[i] = bf16_round(x[i]);
            g32[0] = g16[0] = 12345.0f;
            sparse_decode_gemv_f32(w, W, b, x, blk, 2, d, 1, R, g32);
            sparse_decode_gemv_bf16(wb, W, b, x, xb, blk, 2, d, 1, R, g16, isa);
            const double eg = test_rel_err_f32(g16 + 1, g32 + 1, R - 1);
            worst_g = eg > worst_g ? eg : worst_g;
            CHECK(ctx, eg < tol, "%s gemv d %d rows %d: rel err %.3g > %.3g", sparse_bf16_isa_name(isa), d, R - 1, eg, tol);
            CHECK(ctx, g16[0] == 12345.0f, "%s gemv wrote row 0, outside r0 .. r1", sparse_bf16_isa_name(isa));
            free(q), free(K), free(V), free(sc), free(o32), free(o16), free(Kb), free(Vb);
            free(w), free(x), free(b), free(g32), free(g16), free(wb), free(xb);
        }
    printf("  kernels %-17s attend worst rel err %.2e, gemv %.2e (bound %.1e)\n", sparse_bf16_isa_name(isa), worst_a,
           worst_g, tol);
}

typedef struct model_case {
    const char *name;
    moh_router router;
    int L, C, h, hkv, I;
    bool tied;
} model_case;

/* The heads with a non-zero gate among gates[0..h), as a bit mask. */
static unsigned selected(const float *gates, int h) {
    unsigned m = 0;
    for (int i = 0; i < h; i++)
        if (gates[i] != 0.0f) m |= 1u << i;
    return m;
}

static void model_check(test_ctx *ctx, const model_case *mc, sparse_bf16_isa isa) {
    moh_lm_config c = {0};
    c.hidden_size = mc->C;
    c.num_hidden_layers = mc->L;
    c.num_attention_heads = mc->h;
    c.num_key_value_heads = mc->hkv;
    c.intermediate_size = mc->I;
    c.vocab_size = 256;
    c.max_position_embeddings = 64;
    c.rms_norm_eps = 1e-5;
    c.rope_theta = 10000;
    c.tie_word_embeddings = mc->tied;
    c.router = mc->router;
    c.shared_heads = 1;
    c.top_k = mc->h / 2 - 1;
    c.load_balance_coef = 0.01;
    moh_error err;
    CHECK(ctx, moh_lm_config_finalize(&c, mc->name, &err) == MOH_OK, "%s", err.msg);
    const int T = 37, n0 = 21, V = 256; /* odd: the last value pair of the bf16 cache is half full */
    lm_params_f32 p;
    lm_acts_f32 a;
    lm_kv_cache k32, k16, k16p, k16t;
    lm_prefill_ws ws;
    CHECK(ctx, lm_params_init_f32(&p, &c, &err) == MOH_OK, "%s", err.msg);
    lm_params_init_random(&c, &p, 5, 1.0 / sqrt((double)mc->C)); /* about unit gain per product */
    CHECK(ctx, lm_acts_init_f32(&a, &c, 1, T, &err) == MOH_OK, "%s", err.msg); /* reference attention path */
    CHECK(ctx, lm_kv_init(&k32, &c, T, &err) == MOH_OK, "%s", err.msg);
    CHECK(ctx, lm_kv_init_bf16(&k16, &c, &p, T, &err) == MOH_OK, "%s", err.msg);
    CHECK(ctx, lm_kv_init_bf16(&k16p, &c, &p, T, &err) == MOH_OK, "%s", err.msg);
    CHECK(ctx, lm_kv_init_bf16(&k16t, &c, &p, T, &err) == MOH_OK, "%s", err.msg);
    k16.dc.par_work = LONG_MAX; /* every product on this thread; k16t: every product on the team */
    k16t.dc.par_work = 1;
    CHECK(ctx, lm_prefill_init(&ws, &c, n0, &err) == MOH_OK, "%s", err.msg);
    CHECK(ctx, lm_prefill_set_bf16(&ws, &c, &k16p, &err) == MOH_OK, "%s", err.msg);
    CHECK(ctx, k16.dc.bf16 && !k16.dc.k && k16.dc.kb && !k32.dc.bf16, "%s: cache precision flags", mc->name);
    k16.dc.isa = k16p.dc.isa = k16t.dc.isa = isa;
    int tok[37];
    test_rng rng = {1234};
    for (int t = 0; t < T; t++) tok[t] = (int)(test_rng_u64(&rng) % V);
    lm_forward_f32(&c, &p, &a, tok, NULL, 1, T);
    float l32[256], l16[256], lp[256];
    double w32 = 0, wref = 0, wpre = 0, wflip = 0;
    int flips = 0, compared = 0, team_differ = 0;
    unsigned sel32[37]; /* the last layer's heads of each token in fp32 */
    const bool routed = mc->router != MOH_ROUTER_NONE;
    for (int t = 0; t < T; t++) {
        CHECK(ctx, lm_decode_step(&c, &p, &k32, tok[t], l32, &err) == MOH_OK, "%s", err.msg);
        CHECK(ctx, lm_decode_step(&c, &p, &k16, tok[t], l16, &err) == MOH_OK, "%s", err.msg);
        CHECK(ctx, lm_decode_step(&c, &p, &k16t, tok[t], lp, &err) == MOH_OK, "%s", err.msg);
        team_differ += memcmp(lp, l16, sizeof l16) != 0;
        sel32[t] = selected(k32.router.gates, mc->h);
        const double e = test_rel_err_f32(l16, l32, V), er = test_rel_err_f32(l16, a.logits + (size_t)t * V, V);
        if (routed && selected(k16.router.gates, mc->h) != sel32[t]) {
            flips++;
            wflip = e > wflip ? e : wflip;
            continue;
        }
        w32 = e > w32 ? e : w32;
        wref = er > wref ? er : wref;
        compared++;
    }
    /* bf16 prefill of tok[0..n0) (into a used cache: prefill empties it), then decoding; the
     * prefill's last-layer gates are attn_layer_router_f32(&ws.layer)->gates [n0, h] */
    CHECK(ctx, lm_decode_step(&c, &p, &k16p, tok[5], lp, &err) == MOH_OK, "%s", err.msg);
    CHECK(ctx, lm_prefill(&c, &p, &k16p, &ws, tok, n0, lp, &err) == MOH_OK, "%s", err.msg);
    if (!routed || selected(attn_layer_router_f32(&ws.layer)->gates + (size_t)(n0 - 1) * mc->h, mc->h) == sel32[n0 - 1])
        wpre = test_rel_err_f32(lp, a.logits + (size_t)(n0 - 1) * V, V);
    for (int t = n0; t < T; t++) {
        CHECK(ctx, lm_decode_step(&c, &p, &k16p, tok[t], lp, &err) == MOH_OK, "%s", err.msg);
        if (routed && selected(k16p.router.gates, mc->h) != sel32[t]) continue;
        const double e = test_rel_err_f32(lp, a.logits + (size_t)t * V, V);
        wpre = e > wpre ? e : wpre;
    }
    const double bound = 8 * U;
    CHECK(ctx, team_differ == 0, "%s %s: %d of %d tokens' logits change when the products run on the team", mc->name,
          sparse_bf16_isa_name(isa), team_differ, T);
    CHECK(ctx, compared >= T - T / 5, "%s %s: %d of %d tokens route differently in bf16", mc->name,
          sparse_bf16_isa_name(isa), flips, T);
    CHECK(ctx, w32 < bound, "%s %s: bf16 vs fp32 decode logits rel err %.3g > %.3g", mc->name, sparse_bf16_isa_name(isa), w32, bound);
    CHECK(ctx, wref < bound, "%s %s: bf16 decode vs fp32 reference forward rel err %.3g > %.3g", mc->name,
          sparse_bf16_isa_name(isa), wref, bound);
    CHECK(ctx, wflip < 0.5, "%s %s: a token routed differently is off by %.3g", mc->name, sparse_bf16_isa_name(isa), wflip);
    CHECK(ctx, w32 > 1e-6, "%s %s: bf16 logits equal fp32 (%.3g): bf16 not used?", mc->name, sparse_bf16_isa_name(isa), w32);
    CHECK(ctx, k16.heads_run == k32.heads_run && k16.heads_total == k32.heads_total, "%s: heads run %ld/%ld vs %ld/%ld",
          mc->name, k16.heads_run, k16.heads_total, k32.heads_run, k32.heads_total);
    CHECK(ctx, wpre < bound, "%s %s: bf16 prefill + decode vs fp32 reference forward rel err %.3g > %.3g", mc->name,
          sparse_bf16_isa_name(isa), wpre, bound);
    /* lm_feed into a filled bf16 cache (bf16 GEMMs, decode attention kernels): the logits after a
     * second run of 9 tokens, against the fp32 forward (a routed model may flip a near tie: 0.5) */
    lm_kv_cache k16f;
    CHECK(ctx, lm_kv_init_bf16(&k16f, &c, &p, T, &err) == MOH_OK, "%s", err.msg);
    k16f.dc.isa = isa;
    CHECK(ctx, lm_feed(&c, &p, &k16f, tok, n0, lp, &err) == MOH_OK, "%s", err.msg);
    CHECK(ctx, lm_feed(&c, &p, &k16f, tok + n0, 9, lp, &err) == MOH_OK, "%s", err.msg);
    const double wfeed = test_rel_err_f32(lp, a.logits + (size_t)(n0 + 8) * V, V);
    CHECK(ctx, wfeed < (routed ? 0.5 : bound), "%s %s: bf16 lm_feed into a filled cache vs fp32 forward rel err %.3g",
          mc->name, sparse_bf16_isa_name(isa), wfeed);
    lm_kv_free(&k16f);
    /* another parameter buffer than the cache's copy is refused */
    lm_params_f32 q = p;
    q.data = p.data + 1;
    CHECK(ctx, lm_decode_step(&c, &q, &k16, tok[0], l16, &err) == MOH_E_ARG, "%s: foreign parameters not refused", mc->name);
    CHECK(ctx, lm_kv_calibrate(&k16, &c, &q, &err) == MOH_E_ARG, "%s: calibration on foreign parameters not refused",
          mc->name);
    printf("  %-15s %-17s vs fp32 decode %.2e, vs fp32 reference forward %.2e, bf16 prefill + decode %.2e, "
           "%d flipped tokens (worst %.2e)\n", mc->name, sparse_bf16_isa_name(isa), w32, wref, wpre, flips, wflip);
    lm_prefill_free(&ws);
    lm_kv_free(&k16p);
    lm_kv_free(&k16t);
    lm_kv_free(&k16);
    lm_kv_free(&k32);
    lm_acts_free_f32(&a);
    lm_params_free_f32(&p);
}

int main(void) {
    test_ctx ctx = {0};
    const sparse_bf16_isa best = sparse_bf16_isa_detect();
    static const model_case cases[] = {
        {"dense_d128", MOH_ROUTER_NONE, 2, 256, 2, 2, 72, false},
        {"moh_d20", MOH_ROUTER_LEARNED, 2, 160, 8, 8, 72, false},
        {"moh_gqa_tied_d40", MOH_ROUTER_LEARNED, 2, 160, 4, 2, 72, true},
        {"query_norm_d20", MOH_ROUTER_QUERY_NORM, 1, 160, 8, 4, 72, true},
    };
    for (int isa = best; isa >= SPARSE_BF16_PORTABLE; isa--) {
        kernels(&ctx, (sparse_bf16_isa)isa);
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) model_check(&ctx, &cases[i], (sparse_bf16_isa)isa);
    }
    const int rc = test_finish("test_decode_bf16", &ctx);
    if (!rc && best == SPARSE_BF16_PORTABLE) {
        printf("test_decode_bf16: no AVX-512 here: only the portable kernels were checked\n");
        return 77;
    }
    if (!rc && best == SPARSE_BF16_AVX512) printf("test_decode_bf16: no AVX512-BF16 here: vdpbf16ps not checked\n");
    return rc;
}
