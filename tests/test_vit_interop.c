/* ViT against PyTorch: the checkpoints in tests/fixtures/vit/<case>/ (written from timm's
 * VisionTransformer, and for MoH from tools/ref/vit_ref.py; see tools/ref/gen_vit_fixtures.py) load
 * through model_load, and the float32 engine reproduces the float64 logits, loss and the
 * gradient of every weight to <= 1e-4 relative (per tensor: max |a - b| / max |b|), on the
 * reference attention path and on the head-sparse path. */
#include <string.h>

#include "models/vit.h"
#include "models/model.h"
#include "test_util.h"

static const char *const CASES[] = {"dense_token", "dense_avg", "moh_token", "moh_avg"};

static float *read_tensor(test_ctx *ctx, const moh_safetensors *st, const char *name, int ndim,
                          const int64_t *shape, size_t numel) {
    moh_error err;
    float *buf = malloc(sizeof(float) * (numel ? numel : 1));
    int rc = moh_st_read_f32(st, name, ndim, shape, buf, &err);
    CHECK(ctx, rc == MOH_OK, "%s", err.msg);
    if (rc) {
        free(buf);
        return NULL;
    }
    return buf;
}

static void run_case(test_ctx *ctx, const char *name, bool sparse) {
    char dir[256], path[300];
    snprintf(dir, sizeof dir, "tests/fixtures/vit/%s", name);
    snprintf(path, sizeof path, "%s/io.safetensors", dir);
    moh_error err;
    model m;
    vit_params_f32 g;
    int rc = model_load(&m, dir, &err);
    CHECK(ctx, rc == MOH_OK, "%s: %s", name, err.msg);
    if (rc) return;
    const moh_vit_config cfg = *(const moh_vit_config *)m.cfg;
    const vit_params_f32 p = *(const vit_params_f32 *)m.params;
    moh_safetensors st;
    rc = moh_st_open(&st, path, &err);
    CHECK(ctx, rc == MOH_OK, "%s", err.msg);
    if (rc) {
        model_free(&m);
        return;
    }
    const moh_st_tensor *ti = moh_st_find(&st, "images");
    const int B = ti ? (int)ti->shape[0] : 0, K = cfg.num_classes, H = cfg.img_size;
    const int64_t ishape[4] = {B, 1, H, H}, lshape[1] = {B}, oshape[2] = {B, K}, one[1] = {1};
    float *img = read_tensor(ctx, &st, "images", 4, ishape, (size_t)B * H * H);
    float *flab = read_tensor(ctx, &st, "labels", 1, lshape, (size_t)B);
    float *logits = read_tensor(ctx, &st, "logits", 2, oshape, (size_t)B * K);
    float *loss = read_tensor(ctx, &st, "loss", 1, one, 1);
    float *lb = read_tensor(ctx, &st, "lb", 1, one, 1);
    vit_acts_f32 a;
    CHECK(ctx, vit_params_init_f32(&g, &cfg, &err) == MOH_OK, "%s", err.msg);
    CHECK(ctx, vit_acts_init_attn_f32(&a, &cfg, B, sparse, &err) == MOH_OK, "%s", err.msg);
    if (img && flab && logits && loss && lb) {
        int lab[64];
        for (int i = 0; i < B && i < 64; i++) lab[i] = (int)flab[i];
        const double l = vit_forward_f32(&cfg, &p, &a, img, lab, B);
        const double lerr = test_rel_err_f32(a.logits, logits, (long)B * K);
        CHECK(ctx, lerr <= 1e-4, "%s: logits rel err %.3g", name, lerr);
        CHECK(ctx, fabs(l - loss[0]) <= 1e-4 * fabs(loss[0]), "%s: loss %.7f vs %.7f", name, l, loss[0]);
        CHECK(ctx, fabs(a.lb_loss - lb[0]) <= 1e-4 * fmax(1.0, fabs(lb[0])), "%s: lb %.6f vs %.6f", name, a.lb_loss, lb[0]);
        vit_backward_f32(&cfg, &p, &g, &a, lab);
        int nt = 0;
        vit_tensor *ts = vit_tensors(&cfg, &nt);
        double worst = 0.0;
        const char *wname = "";
        for (int i = 0; i < nt; i++) {
            char gname[128];
            snprintf(gname, sizeof gname, "grad.%s", ts[i].name);
            float *ref = read_tensor(ctx, &st, gname, ts[i].ndim, ts[i].shape, ts[i].numel);
            if (!ref) continue;
            const double e = test_rel_err_f32(g.data + ts[i].offset, ref, (long)ts[i].numel);
            CHECK(ctx, e <= 1e-4, "%s: gradient of %s rel err %.3g", name, ts[i].name, e);
            if (e > worst) {
                worst = e;
                wname = ts[i].name;
            }
            free(ref);
        }
        printf("  %-12s %-9s loss %.6f (lb %.4f) logits rel err %.2e, worst gradient %.2e (%s), %d tensors\n",
               name, sparse ? "sparse" : "reference", l, a.lb_loss, lerr, worst, wname, nt);
        free(ts);
    }
    free(img);
    free(flab);
    free(logits);
    free(loss);
    free(lb);
    vit_acts_free_f32(&a);
    vit_params_free_f32(&g);
    model_free(&m);
    moh_st_close(&st);
}

/* A checkpoint with an extra or missing tensor is rejected with the tensor's name. */
static void load_errors(test_ctx *ctx) {
    moh_error err;
    model m;
    /* the MoH weights under the dense config: the router tensors are unexpected */
    int rc = model_from_config_file(&m, "tests/fixtures/vit/dense_token/config.json", &err);
    CHECK(ctx, rc == MOH_OK, "%s", err.msg);
    if (rc) return;
    rc = model_load_weights(&m, "tests/fixtures/vit/moh_token/model.safetensors", &err);
    CHECK(ctx, rc == MOH_E_SHAPE && strstr(err.msg, "unexpected tensor 'blocks.0.attn.wg.weight'"),
          "dense config, MoH weights: %s", err.msg);
    model_free(&m);
    /* token-pool weights under an avg-pool config: fc_norm.weight is missing */
    rc = model_from_config_file(&m, "tests/fixtures/vit/dense_avg/config.json", &err);
    CHECK(ctx, rc == MOH_OK, "%s", err.msg);
    if (rc) return;
    rc = model_load_weights(&m, "tests/fixtures/vit/dense_token/model.safetensors", &err);
    CHECK(ctx, rc == MOH_E_SHAPE && strstr(err.msg, "pos_embed"), "avg config, token weights: %s", err.msg);
    model_free(&m);
}

int main(void) {
    test_ctx ctx = {0};
    for (int sparse = 0; sparse < 2; sparse++)
        for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) run_case(&ctx, CASES[i], sparse);
    load_errors(&ctx);
    return test_finish("test_vit_interop", &ctx);
}
