/* Decoder LM: float64 finite-difference check of the full training loss (cross-entropy +
 * beta * mean load-balance loss) against lm_backward for every parameter, dense and MoH, tied and
 * untied; float32 agrees with float64; checkpoint tensor offsets match the parameter views. */
#include <math.h>
#include <string.h>

#include "models/lm.h"
#include "test_util.h"

static moh_lm_config tiny(moh_router router, bool tied, int hkv) {
    moh_lm_config c = {0};
    c.hidden_size = 8;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = hkv;
    c.intermediate_size = 12;
    c.vocab_size = 11;
    c.max_position_embeddings = 16;
    c.rms_norm_eps = 1e-5;
    c.rope_theta = 10000;
    c.tie_word_embeddings = tied;
    c.shared_heads = 1;
    c.top_k = 2;
    c.router = router;
    c.load_balance_coef = 0.3;
    return c;
}

static void run(test_ctx *ctx, const char *name, moh_lm_config cfg) {
    moh_error err;
    CHECK(ctx, moh_lm_config_finalize(&cfg, name, &err) == MOH_OK, "%s: %s", name, err.msg);
    const int B = 2, T = 5, BT = B * T;
    lm_params_f64 p, g;
    lm_acts_f64 a;
    CHECK(ctx, lm_params_init_f64(&p, &cfg, &err) == MOH_OK, "%s", err.msg);
    CHECK(ctx, lm_params_init_f64(&g, &cfg, &err) == MOH_OK, "%s", err.msg);
    CHECK(ctx, lm_acts_init_f64(&a, &cfg, B, T, &err) == MOH_OK, "%s", err.msg);
    test_rng rng = {0x1234567ULL + (uint64_t)cfg.router * 7 + cfg.tie_word_embeddings};
    for (size_t i = 0; i < p.n; i++) p.data[i] = test_rng_uniform(&rng) * 0.5;
    int tokens[10], targets[10];
    for (int i = 0; i < BT; i++) {
        tokens[i] = (int)(test_rng_u64(&rng) % 11);
        targets[i] = i == 3 ? -1 : (int)(test_rng_u64(&rng) % 11); /* one ignored target */
    }
    /* tensor table matches the views */
    int nt = 0;
    lm_tensor *ts = lm_tensors(&cfg, &nt);
    size_t total = 0;
    for (int i = 0; i < nt; i++) total += ts[i].numel;
    CHECK(ctx, total == p.n, "%s: tensors cover %zu values, params have %zu", name, total, p.n);
    CHECK(ctx, p.data + ts[nt - 1].offset == (cfg.tie_word_embeddings ? p.norm : p.lm_head), "%s: last tensor offset", name);
    CHECK(ctx, p.data + ts[2].offset == p.blocks[0].attn.w_qkv, "%s: q_proj offset", name);
    free(ts);

    lm_forward_f64(&cfg, &p, &a, tokens, targets, B, T);
    lm_backward_f64(&cfg, &p, &g, &a, tokens, targets);
    const double eps = 1e-6;
    double maxdiff = 0.0, maxg = 0.0;
    /* every third parameter (all tensors are probed; about 400 entries per model) */
    for (size_t i = 1; i < p.n; i += 3) {
        const double v = p.data[i];
        p.data[i] = v + eps;
        const double lp = lm_forward_f64(&cfg, &p, &a, tokens, targets, B, T);
        p.data[i] = v - eps;
        const double lm = lm_forward_f64(&cfg, &p, &a, tokens, targets, B, T);
        p.data[i] = v;
        const double num = (lp - lm) / (2 * eps);
        maxdiff = fmax(maxdiff, fabs(num - g.data[i]));
        maxg = fmax(maxg, fabs(num));
    }
    const double rel = maxdiff / maxg;
    CHECK(ctx, rel < 1e-6, "%s: gradient rel err %.3g vs finite differences", name, rel);

    /* float32 instantiation agrees */
    lm_params_f32 p32, g32;
    lm_acts_f32 a32;
    lm_params_init_f32(&p32, &cfg, &err);
    lm_params_init_f32(&g32, &cfg, &err);
    lm_acts_init_f32(&a32, &cfg, B, T, &err);
    for (size_t i = 0; i < p.n; i++) p32.data[i] = (float)p.data[i];
    const double l64 = lm_forward_f64(&cfg, &p, &a, tokens, targets, B, T);
    const double l32 = lm_forward_f32(&cfg, &p32, &a32, tokens, targets, B, T);
    lm_backward_f32(&cfg, &p32, &g32, &a32, tokens, targets);
    double gd = 0.0;
    for (size_t i = 0; i < p.n; i++) gd = fmax(gd, fabs(g32.data[i] - g.data[i]));
    CHECK(ctx, fabs(l32 - l64) < 1e-5 * fabs(l64) && gd / maxg < 1e-5, "%s: f32 loss %.7g vs %.7g, grad %.2g", name, l32, l64, gd / maxg);
    /* the head-sparse attention path gives the same loss and gradients */
    lm_params_f32 gs;
    lm_acts_f32 as;
    lm_params_init_f32(&gs, &cfg, &err);
    CHECK(ctx, lm_acts_init_sparse_f32(&as, &cfg, B, T, &err) == MOH_OK, "%s: %s", name, err.msg);
    const double ls = lm_forward_f32(&cfg, &p32, &as, tokens, targets, B, T);
    lm_backward_f32(&cfg, &p32, &gs, &as, tokens, targets);
    double sd = 0.0;
    for (size_t i = 0; i < p.n; i++) sd = fmax(sd, fabs(gs.data[i] - g32.data[i]));
    CHECK(ctx, fabs(ls - l32) < 1e-5 * fabs(l32) && sd / maxg < 1e-5 && fabs(as.lb_loss - a32.lb_loss) < 1e-6,
          "%s: sparse path: loss %.7g vs %.7g, grad %.2g", name, ls, l32, sd / maxg);
    lm_params_free_f32(&gs);
    lm_acts_free_f32(&as);
    printf("  %-18s loss %.5f (lb %.4f)  fd rel err %.2e  f32 grad rel %.1e  sparse grad rel %.1e  params %zu\n", name, l64, a.lb_loss, rel, gd / maxg, sd / maxg, p.n);
    lm_params_free_f32(&p32);
    lm_params_free_f32(&g32);
    lm_acts_free_f32(&a32);
    lm_params_free_f64(&p);
    lm_params_free_f64(&g);
    lm_acts_free_f64(&a);
}

int main(void) {
    test_ctx ctx = {0};
    run(&ctx, "moh_untied", tiny(MOH_ROUTER_LEARNED, false, 4));
    run(&ctx, "moh_tied_gqa", tiny(MOH_ROUTER_LEARNED, true, 2));
    run(&ctx, "dense_untied", tiny(MOH_ROUTER_NONE, false, 4));
    run(&ctx, "dense_tied_gqa", tiny(MOH_ROUTER_NONE, true, 1));
    return test_finish("test_lm", &ctx);
}
