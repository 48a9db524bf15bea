/* ViT: float64 finite-difference check of the full training loss (label-smoothed cross-entropy +
 * beta * mean load-balance loss) against vit_backward for every parameter, for dense and MoH
 * attention, class-token and mean pooling; float32 agrees with float64; the tensor table matches
 * the parameter views (timm names); config.json parsing, errors and round trip. */
#include <math.h>
#include <string.h>

#include "models/vit.h"
#include "test_util.h"

static moh_vit_config tiny(moh_router router, bool cls, vit_pool pool, int hs, int k) {
    moh_vit_config c;
    memset(&c, 0, sizeof c);
    c.img_size = 8;
    c.patch_size = 4;
    c.in_chans = 2;
    c.num_classes = 5;
    c.embed_dim = 8;
    c.depth = 2;
    c.num_heads = 4;
    c.mlp_ratio = 1.5;
    c.class_token = cls;
    c.global_pool = pool;
    c.shared_heads = hs;
    c.top_k = k;
    c.router = router;
    c.load_balance_coef = 0.3;
    c.label_smoothing = 0.1;
    return c;
}

static void run(test_ctx *ctx, const char *name, moh_vit_config cfg) {
    moh_error err;
    CHECK(ctx, moh_vit_config_finalize(&cfg, name, &err) == MOH_OK, "%s: %s", name, err.msg);
    enum { B = 3 };
    const size_t npix = (size_t)B * cfg.in_chans * cfg.img_size * cfg.img_size;
    vit_params_f64 p, g;
    vit_acts_f64 a;
    CHECK(ctx, vit_params_init_f64(&p, &cfg, &err) == MOH_OK, "%s", err.msg);
    CHECK(ctx, vit_params_init_f64(&g, &cfg, &err) == MOH_OK, "%s", err.msg);
    CHECK(ctx, vit_acts_init_f64(&a, &cfg, B, &err) == MOH_OK, "%s", err.msg);
    test_rng rng = {0x51ED5EEDULL + (uint64_t)cfg.router * 7 + (uint64_t)cfg.class_token * 3 + (uint64_t)cfg.global_pool};
    for (size_t i = 0; i < p.n; i++) p.data[i] = test_rng_uniform(&rng) * 0.5;
    double *img = malloc(sizeof(double) * npix);
    float *img32 = malloc(sizeof(float) * npix);
    for (size_t i = 0; i < npix; i++) {
        img32[i] = (float)(test_rng_uniform(&rng) * 1.5);
        img[i] = img32[i];
    }
    const int labels[B] = {3, -1, 0}; /* one ignored label */

    /* tensor table: covers the buffer, timm names, offsets match the views */
    int nt = 0;
    vit_tensor *ts = vit_tensors(&cfg, &nt);
    size_t total = 0;
    for (int i = 0; i < nt; i++) {
        CHECK(ctx, ts[i].offset == total, "%s: tensor %s offset %zu, expected %zu", name, ts[i].name, ts[i].offset, total);
        total += ts[i].numel;
    }
    CHECK(ctx, total == p.n, "%s: tensors cover %zu values, params have %zu", name, total, p.n);
    const int first = cfg.class_token ? 1 : 0;
    CHECK(ctx, !strcmp(ts[first].name, "pos_embed") && p.data + ts[first].offset == p.pos_embed, "%s: pos_embed", name);
    CHECK(ctx, !strcmp(ts[first + 1].name, "patch_embed.proj.weight") && ts[first + 1].ndim == 4 &&
               p.data + ts[first + 1].offset == p.pe_w, "%s: patch_embed", name);
    CHECK(ctx, !strcmp(ts[first + 7].name, "blocks.0.attn.proj.weight") && p.data + ts[first + 7].offset == p.blocks[0].attn.w_o,
          "%s: blocks.0.attn.proj.weight is %s", name, ts[first + 7].name);
    CHECK(ctx, !strcmp(ts[nt - 4].name, cfg.global_pool == VIT_POOL_TOKEN ? "norm.weight" : "fc_norm.weight") &&
               p.data + ts[nt - 4].offset == p.norm_w, "%s: final norm name %s", name, ts[nt - 4].name);
    CHECK(ctx, !strcmp(ts[nt - 2].name, "head.weight") && p.data + ts[nt - 2].offset == p.head_w, "%s: head", name);
    free(ts);

    vit_forward_f64(&cfg, &p, &a, img, labels, B);
    vit_backward_f64(&cfg, &p, &g, &a, labels);
    const double eps = 1e-6;
    double maxdiff = 0.0, maxg = 0.0;
    size_t worst = 0;
    /* about 400 probes spread over the whole buffer (every tensor is hit): a stride coprime-ish
     * with the tensor sizes keeps the sanitizer runs short */
    const size_t stride = p.n > 400 ? p.n / 400 | 1 : 1;
    for (size_t i = 0; i < p.n; i += stride) {
        const double v = p.data[i];
        p.data[i] = v + eps;
        const double lp = vit_forward_f64(&cfg, &p, &a, img, labels, B);
        p.data[i] = v - eps;
        const double lm = vit_forward_f64(&cfg, &p, &a, img, labels, B);
        p.data[i] = v;
        const double num = (lp - lm) / (2 * eps);
        if (fabs(num - g.data[i]) > maxdiff) {
            maxdiff = fabs(num - g.data[i]);
            worst = i;
        }
        maxg = fmax(maxg, fabs(num));
    }
    const double rel = maxdiff / maxg;
    CHECK(ctx, rel < 1e-6, "%s: gradient rel err %.3g vs finite differences (worst index %zu)", name, rel, worst);

    /* float32 instantiation agrees */
    vit_params_f32 p32, g32;
    vit_acts_f32 a32;
    vit_params_init_f32(&p32, &cfg, &err);
    vit_params_init_f32(&g32, &cfg, &err);
    vit_acts_init_f32(&a32, &cfg, B, &err);
    for (size_t i = 0; i < p.n; i++) p32.data[i] = (float)p.data[i];
    const double l64 = vit_forward_f64(&cfg, &p, &a, img, labels, B);
    const double lb64 = a.lb_loss;
    const double l32 = vit_forward_f32(&cfg, &p32, &a32, img32, labels, B);
    vit_backward_f32(&cfg, &p32, &g32, &a32, labels);
    double gd = 0.0;
    for (size_t i = 0; i < p.n; i++) gd = fmax(gd, fabs(g32.data[i] - g.data[i]));
    CHECK(ctx, fabs(l32 - l64) < 1e-5 * fabs(l64) && gd / maxg < 1e-4, "%s: f32 loss %.7g vs %.7g, grad %.2g",
          name, l32, l64, gd / maxg);
    if (cfg.router == MOH_ROUTER_LEARNED) CHECK(ctx, lb64 > 0, "%s: load-balance loss %g", name, lb64);
    printf("  %-22s loss %.5f (lb %.4f)  fd rel err %.2e  f32 grad rel %.1e  params %zu\n", name, l64,
           lb64, rel, gd / maxg, p.n);
    vit_params_free_f32(&p32);
    vit_params_free_f32(&g32);
    vit_acts_free_f32(&a32);
    vit_params_free_f64(&p);
    vit_params_free_f64(&g);
    vit_acts_free_f64(&a);
    free(img);
    free(img32);
}

static int parse(const char *text, moh_vit_config *c, moh_error *err) {
    return moh_vit_config_parse_json(c, text, strlen(text), "cfg.json", err);
}

static void config_tests(test_ctx *ctx) {
    moh_vit_config c;
    moh_error err;
    const char *ok = "{\"model_type\": \"vit\", \"embed_dim\": 96, \"depth\": 4, \"num_heads\": 8, "
                     "\"mlp_ratio\": 2, \"router\": \"learned\", \"shared_heads\": 2, \"top_k\": 4, "
                     "\"_comment\": \"x\", \"mean\": [0.286], \"std\": [0.353]}";
    CHECK(ctx, parse(ok, &c, &err) == MOH_OK, "%s", err.msg);
    CHECK(ctx, c.img_size == 28 && c.patch_size == 4 && c.num_tokens == 50 && c.mlp_hidden == 192 &&
               c.global_pool == VIT_POOL_TOKEN && c.attn.head_dim == 12 && c.attn.qkv_bias &&
               c.attn.fused_qkv && !c.attn.causal && c.label_smoothing == 0.1 && c.n_norm == 1,
          "defaults/derived fields");
    char *json = moh_vit_config_to_json(&c);
    moh_vit_config c2;
    CHECK(ctx, json && parse(json, &c2, &err) == MOH_OK, "round trip: %s", err.msg);
    CHECK(ctx, !memcmp(&c, &c2, sizeof c), "round trip changes the config");
    free(json);
    const model_family *fam = NULL;
    CHECK(ctx, model_family_of_json(ok, strlen(ok), "t", &fam, &err) == MOH_OK && fam && !strcmp(fam->model_type, "vit"),
          "model_type vit: %s", err.msg);
    CHECK(ctx, model_family_of_json("{\"hidden_size\": 8}", 18, "t", &fam, &err) == MOH_OK && fam &&
          !strcmp(fam->model_type, "llama"), "no model_type: the LM");
    CHECK(ctx, model_family_of_json("{\"model_type\": \"gpt\"}", 21, "t.json", &fam, &err) == MOH_E_CONFIG &&
          strstr(err.msg, "t.json: field 'model_type' is 'gpt', expected one of \"llama\", \"vit\", \"dit\""),
          "unknown type: %s", err.msg);
    const char *avg = "{\"model_type\": \"vit\", \"embed_dim\": 8, \"depth\": 1, \"num_heads\": 2, "
                      "\"class_token\": false, \"router\": \"none\"}";
    CHECK(ctx, parse(avg, &c, &err) == MOH_OK && c.global_pool == VIT_POOL_AVG && c.num_tokens == 49,
          "avg default: %s", err.msg);
    struct { const char *text; const char *needle; int code; } bad[] = {
        {"{\"embed_dim\": 8, \"depth\": 1, \"num_heads\": 2}", "'model_type' is missing", MOH_E_CONFIG},
        {"{\"model_type\": \"llama\", \"embed_dim\": 8, \"depth\": 1, \"num_heads\": 2}", "expected \"vit\"", MOH_E_CONFIG},
        {"{\"model_type\": \"vit\", \"embed_dim\": 8, \"depth\": 1, \"num_heads\": 2, \"dropout\": 0}", "unknown field 'dropout'", MOH_E_CONFIG},
        {"{\"model_type\": \"vit\", \"embed_dim\": 8, \"depth\": 1, \"num_heads\": 3}", "'num_heads' is 3", MOH_E_CONFIG},
        {"{\"model_type\": \"vit\", \"embed_dim\": 8, \"depth\": 1, \"num_heads\": 2, \"patch_size\": 5}", "divisor of img_size 28", MOH_E_CONFIG},
        {"{\"model_type\": \"vit\", \"embed_dim\": 8, \"depth\": 1, \"num_heads\": 2, \"router\": \"none\", \"class_token\": false, \"global_pool\": \"token\"}", "needs the class token", MOH_E_CONFIG},
        {"{\"model_type\": \"vit\", \"embed_dim\": 8, \"depth\": 1, \"num_heads\": 4, \"shared_heads\": 1, \"top_k\": 4}", "'top_k'", MOH_E_CONFIG},
        {"{\"model_type\": \"vit\", \"embed_dim\": 8, \"depth\": 1, \"num_heads\": 4}", "'top_k' is 0", MOH_E_CONFIG},
        {"{\"model_type\": \"vit\", \"embed_dim\": 8, \"depth\": 1, \"num_heads\": 2, \"router\": \"none\", \"mean\": [0.5]}", "'std' is missing", MOH_E_CONFIG},
        {"{\"model_type\": \"vit\", \"embed_dim\": 8, \"depth\": 1, \"num_heads\": 2, \"router\": \"none\", \"mean\": [0.5], \"std\": [0]}", "'std' element 0", MOH_E_CONFIG},
        {"{\"model_type\": \"vit\", \"embed_dim\": 8, \"depth\": 1, \"num_heads\": 2, \"router\": \"none\", \"label_smoothing\": 1}", "'label_smoothing' is 1", MOH_E_CONFIG},
        {"{\"model_type\": \"vit\", \"embed_dim\": 8, \"depth\": 1, \"num_heads\": 2, \"router\": \"query_norm\"}", "'router'", MOH_E_CONFIG},
        {"{\"model_type\": \"vit\", \"embed_dim\": 8.5, \"depth\": 1, \"num_heads\": 2}", "'embed_dim'", MOH_E_CONFIG},
        {"{\"model_type\": \"vit\", \"embed_dim\": 8, \"depth\": 1, \"num_heads\": 2, \"depth\": 2}", "appears twice", MOH_E_CONFIG},
        {"{\"model_type\": \"vit\",", "not valid JSON", MOH_E_FORMAT},
        {"[1, 2]", "expected a JSON object", MOH_E_CONFIG},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        memset(&err, 0, sizeof err);
        const int rc = parse(bad[i].text, &c, &err);
        CHECK(ctx, rc == bad[i].code && strstr(err.msg, bad[i].needle) && !strncmp(err.msg, "cfg.json: ", 10) &&
                       !strchr(err.msg, '\n'),
              "bad config %zu: rc %d, message '%s' (wanted '%s')", i, rc, err.msg, bad[i].needle);
    }
}

int main(void) {
    test_ctx ctx = {0};
    config_tests(&ctx);
    run(&ctx, "moh_token_hs2_k1", tiny(MOH_ROUTER_LEARNED, true, VIT_POOL_TOKEN, 2, 1));
    run(&ctx, "moh_avg_hs1_k2", tiny(MOH_ROUTER_LEARNED, false, VIT_POOL_AVG, 1, 2));
    run(&ctx, "moh_cls_avg_hs0_k2", tiny(MOH_ROUTER_LEARNED, true, VIT_POOL_AVG, 0, 2));
    run(&ctx, "dense_token", tiny(MOH_ROUTER_NONE, true, VIT_POOL_TOKEN, 0, 0));
    run(&ctx, "dense_avg", tiny(MOH_ROUTER_NONE, false, VIT_POOL_AVG, 0, 0));
    return test_finish("test_vit", &ctx);
}
