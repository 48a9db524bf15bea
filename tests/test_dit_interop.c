/* DiT against PyTorch: the checkpoints in tests/fixtures/dit/<case>/ (written from
 * tools/ref/dit_ref.py, the official DiT / MoH-DiT forward; see tools/ref/gen_dit_fixtures.py)
 * load through model_load; moh's q_sample reproduces x_t, and the float32 engine reproduces the
 * float64 eps prediction, the training loss (eps MSE + beta * mean load-balance loss) and the
 * gradient of every weight (the first training step's) to <= 1e-4 relative (per tensor:
 * max |a - b| / max |b|), on the reference attention path and on the head-sparse path. The
 * respacing is respace.py's, and DDPM / DDIM with an exact noise predictor return the data. */
#include <string.h>

#include "models/dit.h"
#include "models/dit_diffusion.h"
#include "models/model.h"
#include "test_util.h"

static float *read_tensor(test_ctx *ctx, const moh_safetensors *st, const char *name, int ndim, const int64_t *shape,
                          size_t numel) {
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
    snprintf(dir, sizeof dir, "tests/fixtures/dit/%s", name);
    snprintf(path, sizeof path, "%s/io.safetensors", dir);
    moh_error err;
    model m;
    int rc = model_load(&m, dir, &err);
    CHECK(ctx, rc == MOH_OK, "%s: %s", name, err.msg);
    if (rc) return;
    const moh_dit_config cfg = *(const moh_dit_config *)m.cfg;
    const dit_params_f32 p = *(const dit_params_f32 *)m.params;
    moh_safetensors st;
    rc = moh_st_open(&st, path, &err);
    CHECK(ctx, rc == MOH_OK, "%s", err.msg);
    if (rc) {
        model_free(&m);
        return;
    }
    const moh_st_tensor *tx = moh_st_find(&st, "x_t");
    const int B = tx ? (int)tx->shape[0] : 0, C = cfg.in_channels, H = cfg.input_size;
    const size_t npix = (size_t)B * C * H * H;
    const int64_t ishape[4] = {B, C, H, H}, bshape[1] = {B}, one[1] = {1};
    float *x0 = read_tensor(ctx, &st, "x0", 4, ishape, npix), *noise = read_tensor(ctx, &st, "noise", 4, ishape, npix);
    float *xt = read_tensor(ctx, &st, "x_t", 4, ishape, npix), *out = read_tensor(ctx, &st, "out", 4, ishape, npix);
    float *ft = read_tensor(ctx, &st, "t", 1, bshape, (size_t)B), *fy = read_tensor(ctx, &st, "y", 1, bshape, (size_t)B);
    float *loss = read_tensor(ctx, &st, "loss", 1, one, 1), *lb = read_tensor(ctx, &st, "lb", 1, one, 1);
    dit_params_f32 g;
    dit_acts_f32 a;
    CHECK(ctx, dit_params_init_f32(&g, &cfg, &err) == MOH_OK, "%s", err.msg);
    CHECK(ctx, dit_acts_init_f32(&a, &cfg, B, sparse, &err) == MOH_OK, "%s", err.msg);
    if (x0 && noise && xt && out && ft && fy && loss && lb && B <= 16) {
        int t[16], y[16];
        for (int i = 0; i < B; i++) {
            t[i] = (int)ft[i];
            y[i] = (int)fy[i];
        }
        /* the forward process: x_t = sqrt(acp_t) x0 + sqrt(1 - acp_t) eps */
        dit_schedule sch;
        CHECK(ctx, dit_schedule_init(&sch, &cfg, &err) == MOH_OK, "%s", err.msg);
        const size_t per = npix / (size_t)B;
        for (int i = 0; i < B; i++) dit_q_sample(&sch, t[i], noise + i * per, x0 + i * per, (int)per);
        dit_schedule_free(&sch);
        const double qerr = test_rel_err_f32(x0, xt, (long)npix);
        CHECK(ctx, qerr <= 1e-6, "%s: q_sample rel err %.3g", name, qerr);
        const double l = dit_forward_f32(&cfg, &p, &a, xt, t, y, noise, B);
        const double oerr = test_rel_err_f32(a.out, out, (long)npix);
        CHECK(ctx, oerr <= 1e-4, "%s: eps prediction rel err %.3g", name, oerr);
        CHECK(ctx, fabs(l - loss[0]) <= 1e-4 * fabs(loss[0]), "%s: loss %.7f vs %.7f", name, l, loss[0]);
        CHECK(ctx, fabs(a.lb_loss - lb[0]) <= 1e-4 * fmax(1.0, fabs(lb[0])), "%s: lb %.6f vs %.6f", name, a.lb_loss,
              lb[0]);
        dit_backward_f32(&cfg, &p, &g, &a, y, noise);
        int nt = 0;
        model_tensor *ts = dit_tensors(&cfg, &nt);
        double worst = 0.0;
        const char *wname = "";
        for (int i = 1; i < nt; i++) { /* [0] is pos_embed: fixed, no gradient */
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
        printf("  %-6s %-9s loss %.6f (lb %.4f) eps rel err %.2e, worst gradient %.2e (%s), %d tensors\n", name,
               sparse ? "sparse" : "reference", l, a.lb_loss, oerr, worst, wname, nt);
        free(ts);
    }
    free(x0);
    free(noise);
    free(xt);
    free(out);
    free(ft);
    free(fy);
    free(loss);
    free(lb);
    dit_acts_free_f32(&a);
    dit_params_free_f32(&g);
    model_free(&m);
    moh_st_close(&st);
}

/* Respacing as respace.py: 250 of 1000 steps and 50 of 1000 (DDIM) */
static void respace_tests(test_ctx *ctx) {
    int use[250];
    moh_error err;
    CHECK(ctx, dit_respace(1000, 250, use, &err) == MOH_OK, "%s", err.msg);
    /* stride 999/249 = 4.0120...: round(i * stride); i = 1 -> 4, i = 249 -> 999 */
    CHECK(ctx, use[0] == 0 && use[1] == 4 && use[125] == 502 && use[249] == 999, "250 steps: %d %d %d %d", use[0],
          use[1], use[125], use[249]);
    CHECK(ctx, dit_respace(1000, 50, use, &err) == MOH_OK && use[1] == 20 && use[49] == 999, "50 steps: %d %d",
          use[1], use[49]);
    CHECK(ctx, dit_respace(1000, 0, use, &err) == MOH_E_ARG && strstr(err.msg, "--steps is 0"), "steps 0: %s", err.msg);
    CHECK(ctx, dit_respace(1000, 1001, use, &err) == MOH_E_ARG, "steps 1001 accepted");
}

/* The exact noise predictor of data that is one image x*_y per class: eps = (x_t - sqrt(acp_t) x*)
 * / sqrt(1 - acp_t). With it DDPM and DDIM must return x*_y (the last DDPM step is its x0 exactly;
 * DDIM is deterministic), with and without guidance, for any respacing. */
typedef struct oracle {
    dit_schedule sch;
    const float *star; /* [K + 1, n] the image of each class (the null class: class 0's) */
    int n;
    float buf[64 * 32];
} oracle;

static const float *oracle_eps(void *ctx, const float *x, const int *t, const int *y, int m) {
    oracle *o = ctx;
    for (int j = 0; j < m; j++) {
        const double a = sqrt(o->sch.acp[t[j]]), b = sqrt(1.0 - o->sch.acp[t[j]]);
        for (int q = 0; q < o->n; q++)
            o->buf[j * o->n + q] = (float)((x[j * o->n + q] - a * o->star[y[j] * o->n + q]) / b);
    }
    return o->buf;
}

static void sampler_tests(test_ctx *ctx) {
    moh_dit_config cfg;
    moh_error err;
    const char *js = "{\"model_type\": \"dit\", \"input_size\": 4, \"patch_size\": 2, \"num_classes\": 2, "
                     "\"hidden_size\": 8, \"depth\": 1, \"num_heads\": 2, \"router\": \"none\"}";
    CHECK(ctx, moh_dit_config_parse_json(&cfg, js, strlen(js), "o.json", &err) == MOH_OK, "%s", err.msg);
    float star[3 * 16];
    test_rng r = {0x0AC1EULL};
    for (int i = 0; i < 32; i++) star[i] = (float)(0.9 * test_rng_uniform(&r));
    memcpy(star + 32, star, sizeof(float) * 16); /* null = class 0: guidance changes nothing */
    oracle o = {.star = star, .n = 16};
    dit_schedule_init(&o.sch, &cfg, &err);
    const int labels[5] = {0, 1, 1, 0, 1}, zeros[5] = {0}; /* guided runs: class 0 = null, exact */
    float out[5 * 16];
    const struct { int sampler, steps, variance; double w; } runs[] = {{0, 250, 0, 1.0}, {0, 7, 1, 1.0}, {1, 50, 0, 1.0},
                                                                       {1, 1000, 0, 1.0}, {0, 20, 0, 3.0}};
    for (size_t k = 0; k < sizeof runs / sizeof runs[0]; k++) {
        const int *lab = runs[k].w != 1.0 ? zeros : labels;
        const image_gen_request req = {.labels = lab, .n = 5, .steps = runs[k].steps, .cfg_scale = runs[k].w,
                                       .sampler = runs[k].sampler, .variance = runs[k].variance, .seed = 3, .batch = 2};
        int rc = dit_sample_with(&cfg, oracle_eps, &o, &req, out, &err);
        CHECK(ctx, rc == MOH_OK, "%s", err.msg);
        double worst = 0;
        for (int i = 0; i < 5; i++)
            for (int q = 0; q < 16; q++) worst = fmax(worst, fabs(out[i * 16 + q] - star[lab[i] * 16 + q]));
        CHECK(ctx, worst < 1e-4, "sampler %d, %d steps, cfg %g: |x - x*| up to %.3g", runs[k].sampler, runs[k].steps,
              runs[k].w, worst);
    }
    const int bad[1] = {3};
    const image_gen_request req = {.labels = bad, .n = 1, .steps = 5, .cfg_scale = 1, .batch = 1};
    CHECK(ctx, dit_sample_with(&cfg, oracle_eps, &o, &req, out, &err) == MOH_E_ARG, "label 3 of 2 classes accepted");
    image_gen_request neg = req;
    neg.labels = labels;
    neg.cfg_scale = -0.5;
    CHECK(ctx, dit_sample_with(&cfg, oracle_eps, &o, &neg, out, &err) == MOH_E_ARG && strstr(err.msg, "--cfg"),
          "cfg < 0: %s", err.msg);
    dit_schedule_free(&o.sch);
}

int main(void) {
    test_ctx ctx = {0};
    respace_tests(&ctx);
    sampler_tests(&ctx);
    run_case(&ctx, "dense", false);
    run_case(&ctx, "moh", false);
    run_case(&ctx, "moh", true);
    return test_finish("test_dit_interop", &ctx);
}
