/* DiT: float64 finite differences of the new ops (adaLN modulate, LayerNorm without affine,
 * timestep-embedding MLP) and of the full training loss (eps MSE + beta * mean load-balance loss)
 * against dit_backward for every parameter, dense and MoH with per-layer heads (all-shared layers
 * included); float32 agrees with float64; the head-sparse path agrees with the reference path;
 * patchify / unpatchify are inverse permutations; the tensor table matches the views (official
 * names); the sin-cos table; config.json parsing, per-layer lists, errors and round trip. */
#include <math.h>
#include <string.h>

#include "models/dit.h"
#include "test_util.h"

static moh_dit_config tiny(moh_router router, const int *hs, const int *k) {
    moh_dit_config c;
    memset(&c, 0, sizeof c);
    c.input_size = 8;
    c.patch_size = 4;
    c.in_channels = 2;
    c.num_classes = 3;
    c.hidden_size = 8;
    c.depth = 3;
    c.num_heads = 4;
    c.mlp_ratio = 1.5;
    c.class_dropout_prob = 0.1;
    c.router = router;
    for (int l = 0; l < 3 && hs; l++) {
        c.shared_heads[l] = hs[l];
        c.top_k[l] = k[l];
    }
    c.load_balance_coef = 0.3;
    c.diffusion_steps = 1000;
    c.beta_start = 1e-4;
    c.beta_end = 0.02;
    return c;
}

static void fill(double *x, size_t n, test_rng *r, double s) {
    for (size_t i = 0; i < n; i++) x[i] = test_rng_uniform(r) * s;
}

/* modulate and LN without affine (the ops' LayerNorm with w = b = NULL): loss = sum(w * LN-modulate(x)) against finite differences in
 * x, shift, scale */
static void op_tests(test_ctx *ctx) {
    enum { B = 2, N = 3, D = 5, M = B * N };
    test_rng r = {0xD17ULL};
    double x[M * D], mod[B * 2 * D], w[M * D], n[M * D], h[M * D], mean[M], rstd[M];
    fill(x, M * D, &r, 1.5);
    fill(mod, B * 2 * D, &r, 0.7);
    fill(w, M * D, &r, 1.0);
    double *vars[2] = {x, mod};
    const int sizes[2] = {M * D, B * 2 * D};
    double dx[M * D] = {0}, dmod[B * 2 * D] = {0}, dn[M * D] = {0};
    layernorm_forward_f64(n, mean, rstd, x, NULL, NULL, M, D, DIT_LN_EPS);
    modulate_forward_f64(h, n, mod, mod + D, 2 * D, B, N, D);
    modulate_backward_f64(dn, dmod, dmod + D, w, n, mod + D, 2 * D, B, N, D);
    layernorm_backward_f64(dx, NULL, NULL, dn, x, NULL, mean, rstd, M, D);
    double *grads[2] = {dx, dmod};
    double worst = 0.0;
    for (int v = 0; v < 2; v++)
        for (int i = 0; i < sizes[v]; i++) {
            double loss[2];
            const double keep = vars[v][i];
            for (int s = 0; s < 2; s++) {
                vars[v][i] = keep + (s ? -1e-6 : 1e-6);
                layernorm_forward_f64(n, mean, rstd, x, NULL, NULL, M, D, DIT_LN_EPS);
                modulate_forward_f64(h, n, mod, mod + D, 2 * D, B, N, D);
                loss[s] = 0;
                for (int j = 0; j < M * D; j++) loss[s] += w[j] * h[j];
            }
            vars[v][i] = keep;
            worst = fmax(worst, fabs((loss[0] - loss[1]) / 2e-6 - grads[v][i]));
        }
    CHECK(ctx, worst < 1e-7, "modulate/LN gradient differs from finite differences by %.3g", worst);
    /* LN output: mean 0, variance 1 - eps effect */
    double mu = 0;
    for (int c = 0; c < D; c++) mu += n[c];
    CHECK(ctx, fabs(mu) < 1e-12, "LN row mean %.3g", mu);
    /* timestep frequency table: cos(0) = 1, sin(0) = 0; t = 500 column 1 = cos(500 exp(-ln(1e4)/128)) */
    double fr[2 * DIT_FREQ_DIM];
    const int t[2] = {0, 500};
    dit_timestep_freq_f64(fr, t, 2);
    CHECK(ctx, fr[0] == 1.0 && fr[128] == 0.0, "freq(0) = %g, %g", fr[0], fr[128]);
    CHECK(ctx, fabs(fr[DIT_FREQ_DIM + 1] - cos(500.0 * exp(-log(10000.0) / 128))) < 1e-4, "freq(500)[1] = %g",
          fr[DIT_FREQ_DIM + 1]);
}

/* timestep MLP: loss = sum(w * temb) against finite differences of its four tensors */
static void temb_test(test_ctx *ctx) {
    moh_dit_config cfg = tiny(MOH_ROUTER_NONE, NULL, NULL);
    moh_error err;
    CHECK(ctx, moh_dit_config_finalize(&cfg, "temb", &err) == MOH_OK, "%s", err.msg);
    dit_params_f64 p, g;
    dit_params_init_f64(&p, &cfg, &err);
    dit_params_init_f64(&g, &cfg, &err);
    test_rng r = {0x7E3BULL};
    fill(p.data, p.n, &r, 0.3);
    enum { B = 3 };
    const int D = cfg.hidden_size, t[B] = {3, 417, 999};
    double freq[B * DIT_FREQ_DIM], temb[B * 8], th[B * 8], ts[B * 8], w[B * 8], dth[2 * B * 8];
    fill(w, (size_t)B * D, &r, 1.0);
    dit_timestep_freq_f64(freq, t, B);
    dit_temb_forward_f64(&cfg, &p, NULL, temb, th, ts, freq, B);
    dit_temb_backward_f64(&cfg, &p, &g, NULL, w, th, ts, freq, dth, B);
    double worst = 0, maxg = 0;
    const size_t lo = (size_t)(p.t0_w - p.data), hi = (size_t)(p.y_table - p.data);
    for (size_t i = lo; i < hi; i += 7) {
        double loss[2];
        const double keep = p.data[i];
        for (int s = 0; s < 2; s++) {
            p.data[i] = keep + (s ? -1e-6 : 1e-6);
            dit_temb_forward_f64(&cfg, &p, NULL, temb, th, ts, freq, B);
            loss[s] = 0;
            for (int j = 0; j < B * D; j++) loss[s] += w[j] * temb[j];
        }
        p.data[i] = keep;
        const double num = (loss[0] - loss[1]) / 2e-6;
        worst = fmax(worst, fabs(num - g.data[i]));
        maxg = fmax(maxg, fabs(num));
    }
    CHECK(ctx, maxg > 0 && worst / maxg < 1e-7, "timestep MLP gradient rel err %.3g", worst / maxg);
    dit_params_free_f64(&p);
    dit_params_free_f64(&g);
}

static void run(test_ctx *ctx, const char *name, moh_dit_config cfg) {
    moh_error err;
    CHECK(ctx, moh_dit_config_finalize(&cfg, name, &err) == MOH_OK, "%s: %s", name, err.msg);
    enum { B = 3 };
    const size_t npix = (size_t)B * cfg.in_channels * cfg.input_size * cfg.input_size;
    dit_params_f64 p, g;
    dit_acts_f64 a;
    CHECK(ctx, dit_params_init_f64(&p, &cfg, &err) == MOH_OK, "%s", err.msg);
    CHECK(ctx, dit_params_init_f64(&g, &cfg, &err) == MOH_OK, "%s", err.msg);
    CHECK(ctx, dit_acts_init_f64(&a, &cfg, B, false, &err) == MOH_OK, "%s", err.msg);
    test_rng rng = {0xD175EEDULL + (uint64_t)cfg.router * 5 + (uint64_t)cfg.top_k[0]};
    fill(p.data, p.n, &rng, 0.5); /* random everywhere: the zero-initialised adaLN would hide gradients */
    double *img = malloc(sizeof(double) * npix), *eps = malloc(sizeof(double) * npix);
    float *img32 = malloc(sizeof(float) * npix), *eps32 = malloc(sizeof(float) * npix);
    for (size_t i = 0; i < npix; i++) {
        img32[i] = (float)(test_rng_uniform(&rng) * 1.5);
        eps32[i] = (float)test_rng_uniform(&rng);
        img[i] = img32[i];
        eps[i] = eps32[i];
    }
    const int t[B] = {0, 531, 999}, y[B] = {2, 3, 0}; /* y = 3: the null class */

    int nt = 0;
    model_tensor *ts = dit_tensors(&cfg, &nt);
    size_t total = 0;
    for (int i = 0; i < nt; i++) {
        CHECK(ctx, ts[i].offset == total, "%s: tensor %s offset %zu, expected %zu", name, ts[i].name, ts[i].offset, total);
        total += ts[i].numel;
    }
    CHECK(ctx, total == p.n, "%s: tensors cover %zu values, params have %zu", name, total, p.n);
    CHECK(ctx, !strcmp(ts[0].name, "pos_embed") && p.data + ts[0].offset == p.pos_embed, "%s: pos_embed", name);
    CHECK(ctx, !strcmp(ts[7].name, "y_embedder.embedding_table.weight") && ts[7].shape[0] == 4 &&
               p.data + ts[7].offset == p.y_table, "%s: y table %s", name, ts[7].name);
    CHECK(ctx, !strcmp(ts[10].name, "blocks.0.attn.proj.weight") && p.data + ts[10].offset == p.blocks[0].attn.w_o,
          "%s: blocks.0.attn.proj.weight is %s", name, ts[10].name);
    CHECK(ctx, !strcmp(ts[nt - 1].name, "final_layer.adaLN_modulation.1.bias") && p.data + ts[nt - 1].offset == p.fa_b,
          "%s: last tensor %s", name, ts[nt - 1].name);
    free(ts);

    dit_forward_f64(&cfg, &p, &a, img, t, y, eps, B);
    dit_backward_f64(&cfg, &p, &g, &a, y, eps);
    const double h = 1e-6;
    double maxdiff = 0.0, maxg = 0.0;
    size_t worst = 0;
    const size_t first = (size_t)(p.xe_w - p.data); /* pos_embed is fixed */
    const size_t stride = p.n > 500 ? p.n / 500 | 1 : 1;
    for (size_t i = 0; i < p.n; i += stride) {
        const double v = p.data[i];
        p.data[i] = v + h;
        const double lp = dit_forward_f64(&cfg, &p, &a, img, t, y, eps, B);
        p.data[i] = v - h;
        const double lm = dit_forward_f64(&cfg, &p, &a, img, t, y, eps, B);
        p.data[i] = v;
        const double num = i < first ? 0.0 : (lp - lm) / (2 * h);
        if (fabs(num - g.data[i]) > maxdiff) {
            maxdiff = fabs(num - g.data[i]);
            worst = i;
        }
        maxg = fmax(maxg, fabs(num));
    }
    const double rel = maxdiff / maxg;
    CHECK(ctx, rel < 1e-6, "%s: gradient rel err %.3g vs finite differences (worst index %zu)", name, rel, worst);

    /* float32 agrees; the head-sparse path agrees with the reference path */
    dit_params_f32 p32, g32, gs32;
    dit_acts_f32 a32, as32;
    dit_params_init_f32(&p32, &cfg, &err);
    dit_params_init_f32(&g32, &cfg, &err);
    dit_params_init_f32(&gs32, &cfg, &err);
    CHECK(ctx, dit_acts_init_f32(&a32, &cfg, B, false, &err) == MOH_OK, "%s", err.msg);
    CHECK(ctx, dit_acts_init_f32(&as32, &cfg, B, true, &err) == MOH_OK, "%s", err.msg);
    for (size_t i = 0; i < p.n; i++) p32.data[i] = (float)p.data[i];
    const double l64 = dit_forward_f64(&cfg, &p, &a, img, t, y, eps, B), lb64 = a.lb_loss;
    const double l32 = dit_forward_f32(&cfg, &p32, &a32, img32, t, y, eps32, B);
    dit_backward_f32(&cfg, &p32, &g32, &a32, y, eps32);
    const double ls32 = dit_forward_f32(&cfg, &p32, &as32, img32, t, y, eps32, B);
    dit_backward_f32(&cfg, &p32, &gs32, &as32, y, eps32);
    double gd = 0.0, gs = 0.0;
    for (size_t i = 0; i < p.n; i++) {
        gd = fmax(gd, fabs(g32.data[i] - g.data[i]));
        gs = fmax(gs, fabs(gs32.data[i] - g32.data[i]));
    }
    CHECK(ctx, fabs(l32 - l64) < 1e-5 * fabs(l64) && gd / maxg < 1e-4, "%s: f32 loss %.7g vs %.7g, grad %.2g", name,
          l32, l64, gd / maxg);
    CHECK(ctx, fabs(ls32 - l32) < 1e-5 * fabs(l32) && gs / maxg < 1e-4, "%s: sparse loss %.7g vs %.7g, grad %.2g",
          name, ls32, l32, gs / maxg);
    if (cfg.routing_layers) CHECK(ctx, lb64 > 0, "%s: load-balance loss %g", name, lb64);
    else CHECK(ctx, lb64 == 0, "%s: load-balance loss %g without routing layers", name, lb64);
    printf("  %-22s loss %.5f (lb %.4f)  fd rel err %.2e  f32 grad rel %.1e  sparse %.1e  params %zu\n", name, l64,
           lb64, rel, gd / maxg, gs / maxg, p.n);
    /* unpatchify inverts patchify's gather up to the token order; round trip is the identity */
    double *tok = malloc(sizeof(double) * npix), *back = malloc(sizeof(double) * npix);
    dit_unpatchify_f64(&cfg, img, tok, B, 1);
    dit_unpatchify_f64(&cfg, back, tok, B, 0);
    CHECK(ctx, !memcmp(back, img, sizeof(double) * npix), "%s: unpatchify(patchify^T) is not the identity", name);
    dit_patchify_f64(&cfg, tok, img, B);
    CHECK(ctx, tok[1] == img[1] && tok[cfg.patch_size] == img[cfg.input_size],
          "%s: patch vector order (c, ky, kx)", name);
    free(tok);
    free(back);
    dit_params_free_f32(&p32);
    dit_params_free_f32(&g32);
    dit_params_free_f32(&gs32);
    dit_acts_free_f32(&a32);
    dit_acts_free_f32(&as32);
    dit_params_free_f64(&p);
    dit_params_free_f64(&g);
    dit_acts_free_f64(&a);
    free(img);
    free(img32);
    free(eps);
    free(eps32);
}

static int parse(const char *text, moh_dit_config *c, moh_error *err) {
    return moh_dit_config_parse_json(c, text, strlen(text), "dit.json", err);
}

static void config_tests(test_ctx *ctx) {
    moh_dit_config c, c2;
    moh_error err;
    int rc = parse("{\"model_type\": \"dit\", \"hidden_size\": 24, \"depth\": 3, \"num_heads\": 6, "
                   "\"shared_heads\": [2, 3, 6], \"top_k\": [1, 2, 0]}", &c, &err);
    CHECK(ctx, rc == MOH_OK, "%s", err.msg);
    CHECK(ctx, c.routing_layers == 2 && c.attn[2].shared_heads == 6 && c.attn[2].top_k == 0 && c.attn[0].top_k == 1,
          "per-layer heads: routing %d", c.routing_layers);
    CHECK(ctx, dit_active_head_layers(&c) == 3 + 5 + 6, "active head-layers %d", dit_active_head_layers(&c));
    CHECK(ctx, c.num_patches == 49 && c.patch_dim == 16 && c.mlp_hidden == 96, "derived fields");
    char *json = moh_dit_config_to_json(&c);
    rc = parse(json, &c2, &err);
    CHECK(ctx, rc == MOH_OK && !memcmp(&c, &c2, sizeof c), "round trip: %s", rc ? err.msg : json);
    free(json);
    rc = parse("{\"model_type\": \"dit\", \"hidden_size\": 24, \"depth\": 2, \"num_heads\": 6, \"router\": \"none\"}",
               &c, &err);
    CHECK(ctx, rc == MOH_OK && c.routing_layers == 0 && dit_active_head_layers(&c) == 12, "dense: %s", err.msg);
    const struct { const char *text, *needle; } bad[] = {
        {"{\"model_type\": \"dit\", \"hidden_size\": 24, \"depth\": 3, \"num_heads\": 6, \"shared_heads\": [2, 3], "
         "\"top_k\": 1}", "list of 2 numbers, expected one number or a list of depth = 3"},
        {"{\"model_type\": \"dit\", \"hidden_size\": 24, \"depth\": 2, \"num_heads\": 6, \"shared_heads\": 2, "
         "\"top_k\": 5}", "layer 0: shared_heads 2, top_k 5"},
        {"{\"model_type\": \"dit\", \"hidden_size\": 24, \"depth\": 2, \"num_heads\": 6, \"shared_heads\": 3, "
         "\"top_k\": 0}", "layer 0: shared_heads 3, top_k 0"},
        {"{\"model_type\": \"dit\", \"hidden_size\": 26, \"depth\": 2, \"num_heads\": 2, \"router\": \"none\"}",
         "multiple of 4"},
        {"{\"model_type\": \"dit\", \"hidden_size\": 24, \"depth\": 2, \"num_heads\": 6, \"learn_sigma\": true}",
         "'learn_sigma' is true"},
        {"{\"model_type\": \"dit\", \"hidden_size\": 24, \"depth\": 2, \"num_heads\": 6, \"patch_size\": 3}",
         "divisor of input_size 28"},
        {"{\"model_type\": \"dit\", \"hidden_size\": 24, \"depth\": 2, \"num_heads\": 6, \"noise_schedule\": \"cosine\"}",
         "noise_schedule"},
        {"{\"model_type\": \"dit\", \"hidden_size\": 24, \"depth\": 2, \"num_heads\": 6, \"class_dropout_prob\": 0}",
         "class_dropout_prob"},
        {"{\"model_type\": \"dit\", \"hidden_size\": 24, \"depth\": 2, \"num_heads\": 6, \"embed_dim\": 3}", "embed_dim"},
        {"{\"model_type\": \"vit\", \"hidden_size\": 24, \"depth\": 2, \"num_heads\": 6}", "expected \"dit\""},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        memset(&err, 0, sizeof err);
        rc = parse(bad[i].text, &c, &err);
        CHECK(ctx, rc == MOH_E_CONFIG && strstr(err.msg, bad[i].needle) && !strncmp(err.msg, "dit.json: ", 10) &&
                       !strchr(err.msg, '\n'),
              "bad config %zu: rc %d, message '%s', expected '%s'", i, rc, err.msg, bad[i].needle);
    }
    /* sin-cos table: token (row 0, column 1), first column: sin(1 * omega_0) = sin(1); second half
     * (the row) at row 0: sin(0) = 0, cos(0) = 1 */
    rc = parse("{\"model_type\": \"dit\", \"hidden_size\": 8, \"depth\": 1, \"num_heads\": 2, \"router\": \"none\"}",
               &c, &err);
    float pe[49 * 8];
    dit_pos_embed(&c, pe);
    CHECK(ctx, fabsf(pe[8] - (float)sin(1.0)) < 1e-7f && pe[8 + 4] == 0.0f && pe[8 + 6] == 1.0f &&
                   fabsf(pe[8 + 1] - (float)sin(0.01)) < 1e-7f,
          "pos_embed row 1: %g %g %g %g", pe[8], pe[9], pe[12], pe[14]);
}

int main(void) {
    test_ctx ctx = {0};
    op_tests(&ctx);
    temb_test(&ctx);
    config_tests(&ctx);
    const int hs[3] = {2, 1, 4}, k[3] = {1, 2, 0};
    run(&ctx, "moh_perlayer", tiny(MOH_ROUTER_LEARNED, hs, k));
    const int hs0[3] = {0, 2, 3}, k0[3] = {2, 2, 1};
    run(&ctx, "moh_hs0", tiny(MOH_ROUTER_LEARNED, hs0, k0));
    run(&ctx, "dense", tiny(MOH_ROUTER_NONE, NULL, NULL));
    return test_finish("test_dit", &ctx);
}
