/* The decode team split (attn_decode.par_work) never changes a bit: every product on the OpenMP team
 * (par_work = 1), every product on the calling thread (LONG_MAX) and the calibrated split give the
 * same logits at every step, in fp32 and bf16 with each kernel set this CPU has, on shapes the other
 * decode tests do not reach: head_dim 6 .. 160 (runs of q/k/v rows shorter and longer than the
 * team's 64-row pieces), GQA, shared heads 0 .. 4, top_k 1 .. h, all heads shared (top_k 0 on the
 * attention config), query-norm router, one layer, hidden size 8. The learned router's weights
 * moved apart (not attn_params_bind's layout) give the same bits as adjacent ones. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/lm_decode.h"
#include "test_util.h"

typedef struct split_case {
    const char *name;
    moh_router router;
    int L, C, h, hkv, d, I, hs, k;
} split_case;

/* s's LM config, finalized (all heads shared: top_k 0 set on the attention config, which the LM
 * config refuses). */
static moh_lm_config split_config(test_ctx *ctx, const split_case *s) {
    moh_lm_config c = {0};
    c.hidden_size = s->C;
    c.num_hidden_layers = s->L;
    c.num_attention_heads = s->h;
    c.num_key_value_heads = s->hkv;
    c.head_dim = s->d;
    c.intermediate_size = s->I;
    c.vocab_size = 97;
    c.max_position_embeddings = 64;
    c.rms_norm_eps = 1e-5;
    c.rope_theta = 10000;
    c.router = s->router;
    c.top_k = s->k ? s->k : 1;
    c.shared_heads = s->k ? s->hs : 0;
    c.load_balance_coef = 0.01;
    moh_error err;
    CHECK(ctx, moh_lm_config_finalize(&c, s->name, &err) == MOH_OK, "%s", err.msg);
    if (s->k == 0) {
        c.attn.top_k = 0;
        c.attn.shared_heads = s->h;
    }
    return c;
}

static void one(test_ctx *ctx, const split_case *s, int prec, int isa) {
    const moh_lm_config c = split_config(ctx, s);
    moh_error err;
    lm_params_f32 p;
    lm_acts_f32 a;
    CHECK(ctx, lm_params_init_f32(&p, &c, &err) == MOH_OK, "%s", err.msg);
    lm_params_init_random(&c, &p, 7, 1.0 / sqrt((double)s->C));
    const int T = 33;
    CHECK(ctx, lm_acts_init_f32(&a, &c, 1, T, &err) == MOH_OK, "%s", err.msg);
    lm_kv_cache k1, kt, kc;
    if (prec) {
        CHECK(ctx, lm_kv_init_bf16(&k1, &c, &p, T, &err) == MOH_OK, "%s", err.msg);
        CHECK(ctx, lm_kv_init_bf16(&kt, &c, &p, T, &err) == MOH_OK, "%s", err.msg);
        CHECK(ctx, lm_kv_init_bf16(&kc, &c, &p, T, &err) == MOH_OK, "%s", err.msg);
        k1.dc.isa = kt.dc.isa = kc.dc.isa = (sparse_bf16_isa)isa;
    } else {
        CHECK(ctx, lm_kv_init(&k1, &c, T, &err) == MOH_OK, "%s", err.msg);
        CHECK(ctx, lm_kv_init(&kt, &c, T, &err) == MOH_OK, "%s", err.msg);
        CHECK(ctx, lm_kv_init(&kc, &c, T, &err) == MOH_OK, "%s", err.msg);
    }
    k1.dc.par_work = LONG_MAX;
    kt.dc.par_work = 1;
    int tok[33];
    test_rng rng = {4321};
    for (int t = 0; t < T; t++) tok[t] = (int)(test_rng_u64(&rng) % 97);
    lm_forward_f32(&c, &p, &a, tok, NULL, 1, T);
    float l1[97], lt[97], lc[97];
    int differ = 0;
    double worst = 0;
    for (int t = 0; t < T; t++) {
        CHECK(ctx, lm_decode_step(&c, &p, &k1, tok[t], l1, &err) == MOH_OK, "%s", err.msg);
        CHECK(ctx, lm_decode_step(&c, &p, &kt, tok[t], lt, &err) == MOH_OK, "%s", err.msg);
        CHECK(ctx, lm_decode_step(&c, &p, &kc, tok[t], lc, &err) == MOH_OK, "%s", err.msg);
        differ += memcmp(l1, lt, sizeof l1) != 0;
        differ += memcmp(l1, lc, sizeof l1) != 0;
        const double e = test_rel_err_f32(l1, a.logits + (size_t)t * 97, 97);
        worst = e > worst ? e : worst;
    }
    CHECK(ctx, differ == 0, "%s prec %d isa %d: %d differ", s->name, prec, isa, differ);
    CHECK(ctx, k1.heads_run == kt.heads_run, "%s: heads", s->name);
    /* bf16 against the fp32 forward: test_decode_bf16 (with its routing flips) */
    if (!prec) CHECK(ctx, worst < 1e-4, "%s: fp32 decode vs the forward: rel err %.3g", s->name, worst);
    printf("  %-16s %s %-16s: %d of %d steps differ; vs forward %.2e; calibrated split from %ld\n", s->name,
           prec ? "bf16" : "fp32", prec ? sparse_bf16_isa_name((sparse_bf16_isa)isa) : "", differ, 2 * T, worst,
           kc.dc.par_work);
    lm_kv_free(&k1);
    lm_kv_free(&kt);
    lm_kv_free(&kc);
    lm_acts_free_f32(&a);
    lm_params_free_f32(&p);
}

/* The router's wg / wg_0 / wg_1 moved apart (not attn_params_bind's layout): the same bits. */
static void nonadjacent(test_ctx *ctx, int hs) {
    const split_case s = {"nonadjacent", MOH_ROUTER_LEARNED, 2, 48, 8, 2, 6, 40, hs, 3};
    const moh_lm_config c = split_config(ctx, &s);
    moh_error err;
    lm_params_f32 p, q;
    CHECK(ctx, lm_params_init_f32(&p, &c, &err) == MOH_OK, "%s", err.msg);
    lm_params_init_random(&c, &p, 3, 0.3);
    q = p;
    lm_block_f32 blocks[2];
    memcpy(blocks, p.blocks, sizeof blocks);
    q.blocks = blocks;
    const int C = 48, E = 8 - hs;
    float *sep = malloc(sizeof(float) * 2 * (size_t)(E + 2 + hs) * C);
    CHECK(ctx, sep != NULL, "out of memory");
    if (!sep) return;
    for (int l = 0; l < 2; l++) { /* wg_1, wg_0, wg in that order in their own buffer */
        const attn_params_f32 *a = &p.blocks[l].attn;
        attn_params_f32 *b = &blocks[l].attn;
        float *o = sep + (size_t)l * (E + 2 + hs) * C;
        if (hs >= 2) memcpy(b->w_s = o, a->w_s, sizeof(float) * hs * C);
        if (hs >= 1) memcpy(b->w_h = o + (size_t)(hs >= 2 ? hs : 0) * C, a->w_h, sizeof(float) * 2 * C);
        memcpy(b->w_r = o + (size_t)(hs >= 2 ? hs : 0) * C + (hs >= 1 ? 2 : 0) * C, a->w_r, sizeof(float) * E * C);
    }
    lm_kv_cache k1, k2;
    CHECK(ctx, lm_kv_init(&k1, &c, 20, &err) == MOH_OK, "%s", err.msg);
    CHECK(ctx, lm_kv_init(&k2, &c, 20, &err) == MOH_OK, "%s", err.msg);
    int differ = 0;
    float l1[97], l2[97];
    for (int t = 0; t < 20; t++) {
        CHECK(ctx, lm_decode_step(&c, &p, &k1, (t * 31) % 97, l1, &err) == MOH_OK, "%s", err.msg);
        CHECK(ctx, lm_decode_step(&c, &q, &k2, (t * 31) % 97, l2, &err) == MOH_OK, "%s", err.msg);
        differ += memcmp(l1, l2, sizeof l1) != 0;
    }
    CHECK(ctx, differ == 0, "nonadjacent hs %d: %d differ", hs, differ);
    lm_kv_free(&k1);
    lm_kv_free(&k2);
    free(sep);
    lm_params_free_f32(&p);
}

int main(void) {
    test_ctx ctx = {0};
    for (int hs = 0; hs <= 3; hs++) nonadjacent(&ctx, hs);
    static const split_case cases[] = {
        {"dense_d4_C8", MOH_ROUTER_NONE, 1, 8, 2, 2, 4, 12, 0, 0},
        {"moh_C8", MOH_ROUTER_LEARNED, 1, 8, 4, 2, 2, 12, 1, 2},
        {"moh_d6", MOH_ROUTER_LEARNED, 2, 14, 6, 3, 6, 12, 2, 2},
        {"moh_d20_gqa", MOH_ROUTER_LEARNED, 2, 40, 8, 2, 20, 24, 2, 3},
        {"moh_d96", MOH_ROUTER_LEARNED, 2, 64, 6, 3, 96, 40, 1, 2},
        {"moh_d128_hs0", MOH_ROUTER_LEARNED, 1, 64, 4, 4, 128, 40, 0, 2},
        {"moh_d160_hs3", MOH_ROUTER_LEARNED, 2, 48, 6, 2, 160, 40, 3, 1},
        {"moh_d34_k0_hs4", MOH_ROUTER_LEARNED, 1, 48, 4, 4, 34, 40, 4, 0},
        {"moh_d18_k0_hs1", MOH_ROUTER_LEARNED, 1, 48, 1, 1, 18, 40, 1, 0},
        {"moh_d24_all", MOH_ROUTER_LEARNED, 1, 48, 8, 1, 24, 40, 0, 8},
        {"moh_d64_k1", MOH_ROUTER_LEARNED, 2, 32, 8, 8, 64, 40, 0, 1},
        {"qn_d12_gqa", MOH_ROUTER_QUERY_NORM, 1, 24, 6, 2, 12, 40, 2, 2},
        {"qn_d72", MOH_ROUTER_QUERY_NORM, 2, 24, 4, 1, 72, 40, 1, 1},
    };
    const int best = sparse_bf16_isa_detect();
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        one(&ctx, &cases[i], 0, 0);
        for (int isa = best; isa >= SPARSE_BF16_PORTABLE; isa--) one(&ctx, &cases[i], 1, isa);
    }
    return test_finish("test_decode_split", &ctx);
}
