/* MoH-DiT as a model family (model.h): config, tensor registry, forward/backward on diffusion
 * batches, the IDX batch source that noises each image (random timestep, Gaussian eps, label
 * dropout, all from (seed, example key) so a resume draws the same), the eps-MSE metric and image
 * generation for `moh sample`. Pixels are scaled to [-1, 1] (pixel / 127.5 - 1); the image side
 * must equal the config's input_size (Fashion-MNIST: 28 with patch 4 or 2, no padding). */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "data/idx.h"
#include "models/dit.h"
#include "models/dit_analysis.h"
#include "models/dit_diffusion.h"
#include "models/image_source.h"
#include "models/model.h"

#define DIT_EVAL_SEED 0x5EEDE7A1ULL /* the fixed noise of every validation (comparable across runs) */
#define DIT_TRAIN_VAL 2000          /* validation during training: the first 2000 test images (moh eval: all) */

static int cfg_parse(void *cfg, const char *text, size_t len, const char *label, moh_error *err) {
    return moh_dit_config_parse_json(cfg, text, len, label, err);
}
static char *cfg_json(const void *cfg) { return moh_dit_config_to_json(cfg); }
static int num_layers(const void *cfg) { return ((const moh_dit_config *)cfg)->depth; }
static const moh_attn_config *attn_layer(const void *cfg, int l) { return &((const moh_dit_config *)cfg)->attn[l]; }
/* the first routing layer's config (router, n_heads and layout are those of every layer) */
static const moh_attn_config *attn(const void *cfg) {
    const moh_dit_config *c = cfg;
    for (int l = 0; l < c->depth; l++)
        if (c->attn[l].top_k > 0) return &c->attn[l];
    return &c->attn[0];
}
static model_tensor *tensors(const void *cfg, model_naming scheme, int *n) {
    return scheme == MODEL_NAMES_CHECKPOINT ? dit_tensors(cfg, n) : NULL;
}

MODEL_ADAPTER(dit, dit_acts_init_f32(a, cfg, Bmax, sparse, err),
              dit_params_init_random(cfg, p, seed))

static size_t chw_of(const moh_dit_config *c) { return (size_t)c->in_channels * c->input_size * c->input_size; }

static double forward(const void *cfg, const void *params, void *acts, const moh_batch *b, int first, int count,
                      bool train, double *ce, double *lb) {
    const moh_dit_config *c = cfg;
    dit_acts_f32 *a = acts;
    const size_t chw = chw_of(c);
    const double loss = dit_forward_f32(c, params, a, b->images + (size_t)first * chw, b->timesteps + first,
                                        b->labels + first, b->noise ? b->noise + (size_t)first * chw : NULL, count);
    *ce = a->mse;
    *lb = a->lb_loss;
    return loss;
}
static void backward(const void *cfg, const void *params, void *grads, void *acts, const moh_batch *b, int first,
                     int count) {
    dit_backward_f32(cfg, params, grads, acts, b->labels + first, b->noise + (size_t)first * chw_of(cfg));
}
static int tokens_per_example(const void *cfg, const moh_batch *b) { return ((const moh_dit_config *)cfg)->num_patches; }

static void train_defaults(train_hparams *hp) {
    memset(hp, 0, sizeof *hp);
    *hp = (train_hparams){.lr = 1e-3, .min_lr_ratio = 1.0, .weight_decay = 0.0, .beta1 = 0.9, .beta2 = 0.999,
                          .grad_clip = 1.0, .warmup = -1, .batch_size = 64, .grad_accum = 1, .shards = 0,
                          .seed = 1, .crop_pad = 0, .hflip = 1, .epochs = 10, .eval_every = 0, .eval_limit = 1000,
                          .log_every = 50, .ema_decay = 0.999};
}

/* ---- IDX diffusion batch source (image_source.h) -------------------------------------------- */

/* Noised images x_t, their noise eps, timesteps t and labels (class label dropped with probability
 * class_dropout_prob while training, to num_classes), from (seed, example key) alone; evaluation:
 * the fixed noise DIT_EVAL_SEED keyed by the item's index, no dropout, no augmentation. */
typedef struct dit_noiser {
    const moh_dit_config *cfg;
    dit_schedule sch;
} dit_noiser;

static void dit_make(void *ctx, const idx_split *sp, int cnt, bool train, uint64_t seed, uint64_t key_base,
                     const idx_augment *aug, image_batch *b, moh_batch *out) {
    const dit_noiser *nz = ctx;
    const moh_dit_config *c = nz->cfg;
    const int hw = c->input_size * c->input_size;
    const double drop = train ? c->class_dropout_prob : 0.0;
    if (!train) seed = DIT_EVAL_SEED;
#pragma omp parallel for schedule(static) if (cnt >= 16)
    for (int j = 0; j < cnt; j++) {
        float *x = b->img + (size_t)j * hw, *e = b->eps + (size_t)j * hw;
        idx_image_to_float(sp, b->idx[j], 0.5, 0.5, aug, seed, key_base + (uint64_t)j, x);
        bool dropped = false;
        dit_draw(seed, key_base + (uint64_t)j, c->diffusion_steps, drop, hw, &b->t[j], e, &dropped);
        b->lab[j] = dropped ? c->num_classes : sp->labels[b->idx[j]];
        dit_q_sample(&nz->sch, b->t[j], e, x, hw);
    }
    *out = (moh_batch){.B = cnt, .images = b->img, .C = 1, .H = c->input_size, .W = c->input_size, .labels = b->lab,
                       .timesteps = b->t, .noise = b->eps};
}

static void dit_noiser_free(void *ctx) {
    dit_noiser *nz = ctx;
    if (!nz) return;
    dit_schedule_free(&nz->sch);
    free(nz);
}

static int open_data(model *m, const data_request *req, batch_source *train, batch_source *eval, moh_error *err) {
    const moh_dit_config *cfg = m->cfg;
    dit_noiser *nz = calloc(1, sizeof *nz);
    if (!nz) return moh_fail(err, MOH_E_NOMEM, "data: out of memory");
    nz->cfg = cfg;
    const int rc = dit_schedule_init(&nz->sch, cfg, err);
    if (rc) {
        free(nz);
        return rc;
    }
    const image_family f = {
        .family = "DiT", .channels = cfg->in_channels, .side = cfg->input_size, .channels_key = "in_channels",
        .side_key = "input_size", .num_classes = cfg->num_classes, .crop_pad_max = 0,
        .crop_refusal = "random crops would shift the images it learns to generate; --no-flip turns off the one "
                        "augmentation",
        .train_eval_cap = DIT_TRAIN_VAL, .noise = true, .make = dit_make, .ctx = nz, .ctx_free = dit_noiser_free};
    return image_source_open(&f, req, train, eval, err);
}

/* ---- metric: eps MSE at fixed (timestep, noise) per test image ------------------------------- */

static void eval_add(const void *cfg, const void *acts, const moh_batch *b, int first, int count, model_eval *r) {
    r->ce_sum += (double)((const dit_acts_f32 *)acts)->mse * count;
    r->n += count;
}
static void eval_finish(const void *cfg, model_eval *r) {
    r->loss = r->ce_sum / (double)r->n;
    r->metric = r->loss;
}
static void eval_json(const model_eval *r, char *buf, size_t cap) {
    snprintf(buf, cap, ", \"val_mse\": %.6f, \"val_n\": %ld", r->loss, r->n);
}
static void eval_brief(const model_eval *r, char *buf, size_t cap) {
    snprintf(buf, cap, " | val mse %.4f (%ld)", r->metric, r->n);
}

static void eval_report(const model *m, const model_eval *r, const eval_context *ctx) {
    if (ctx->json) {
        printf("{\"val_mse\": %.6f, \"n\": %ld, \"lb_loss\": %.6f, \"split\": \"%s\", ", r->loss, r->n, r->lb_loss,
               ctx->split);
        model_print_head_share(m, r, true);
        printf("}\n");
        return;
    }
    printf("checkpoint %s on %s (%ld images)\n", ctx->checkpoint, ctx->src->label, r->n);
    printf("noise-prediction MSE %.5f (one fixed timestep and noise per image) | lb %.3f (monitoring, not added)\n",
           r->loss, r->lb_loss);
    model_print_head_share(m, r, false);
}

static void describe(const void *cfg, size_t n, char *buf, size_t cap) {
    const moh_dit_config *c = cfg;
    snprintf(buf, cap, "DiT %.2fM, %dx%d patch %d, D %d, %d blocks", n / 1e6, c->input_size, c->input_size,
             c->patch_size, c->hidden_size, c->depth);
}

/* Random x_t [B, C, H, W] in [-2, 2), labels in 0..num_classes (null included), timesteps, noise. */
static int synthetic_batch(const void *cfg, int B, int T, uint64_t seed, moh_batch *out, void **buf, moh_error *err) {
    const moh_dit_config *c = cfg;
    (void)T;
    return model_synthetic_images(B, c->in_channels, c->input_size, c->input_size, c->num_classes + 1,
                                  c->diffusion_steps, seed, out, buf, err);
}

static void image_shape(const void *cfg, int *C, int *H, int *W) {
    const moh_dit_config *c = cfg;
    *C = c->in_channels;
    *H = *W = c->input_size;
}
static void image_norm(const void *cfg, int ch, double *mean, double *std) {
    *mean = 0.5; /* pixel / 255 -> [-1, 1] */
    *std = 0.5;
}

static int generate(const model *m, const image_gen_request *req, float *out, moh_error *err) {
    return dit_sample(m->cfg, m->params, req, out, err);
}

const model_family dit_family = {
    MODEL_FAMILY_CORE(moh_dit_config, dit_params_f32, dit_acts_f32),
    .model_type = "dit",
    .task = "image-generation",
    .summary = "class-conditional diffusion transformer (official DiT / MoH-DiT layout)",
    .data_help = "a dir of MNIST-style IDX files: train-images-idx3-ubyte[.gz], train-labels-..., t10k-...; "
                 "validation in training: the first 2000 t10k images (eval-limit of them each time, all at the end)",
    .attn_layer = attn_layer,
    .unused_keys = "seq_len val_fraction",
    .metric_name = "val eps MSE",
    .default_sparse = false,
    .image_shape = image_shape,
    .image_norm = image_norm,
    .short_name = "DiT",
    .open_analysis = dit_open_analysis,
    .generate = generate,
};
