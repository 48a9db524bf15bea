/* The ViT image classifier as a model family (model.h): config, tensor registry, forward/backward
 * on image batches, and the IDX batch source (data/idx.h) with augmentation and the top-1
 * accuracy metric. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fsutil.h"
#include "core/rng.h"
#include "data/idx.h"
#include "models/image_source.h"
#include "models/model.h"
#include "models/vit.h"
#include "models/vit_analysis.h"

extern const model_family vit_family;

/* The IDX source's view of a ViT config (image_source.h). */
static void vit_make(void *ctx, const idx_split *sp, int cnt, bool train, uint64_t seed, uint64_t key_base,
                     const idx_augment *aug, image_batch *b, moh_batch *out);
static image_family vit_images(const moh_vit_config *cfg) {
    return (image_family){.family = "ViT", .channels = cfg->in_chans, .side = cfg->img_size, .channels_key = "in_chans",
                          .side_key = "img_size", .num_classes = cfg->num_classes, .crop_pad_max = 64,
                          .make = vit_make, .ctx = (void *)cfg};
}

int vit_check_split(const moh_vit_config *cfg, const idx_split *s, const char *label, moh_error *err) {
    const image_family f = vit_images(cfg);
    return image_check_split(&f, s, label, err);
}

void vit_make_batch(const moh_vit_config *cfg, const idx_split *s, const int *idx, int count,
                    const idx_augment *aug, uint64_t seed, uint64_t key_base, float *out) {
    const size_t hw = (size_t)cfg->img_size * cfg->img_size;
    const double mean = cfg->n_norm ? cfg->mean[0] : 0.0, sd = cfg->n_norm ? cfg->std[0] : 1.0;
#pragma omp parallel for schedule(static) if (count >= 16)
    for (int j = 0; j < count; j++)
        idx_image_to_float(s, idx[j], mean, sd, aug, seed, key_base + (uint64_t)j, out + (size_t)j * hw);
}

static int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

static int cfg_parse(void *cfg, const char *text, size_t len, const char *label, moh_error *err) {
    return moh_vit_config_parse_json(cfg, text, len, label, err);
}
static char *cfg_json(const void *cfg) { return moh_vit_config_to_json(cfg); }
static int num_layers(const void *cfg) { return ((const moh_vit_config *)cfg)->depth; }
static const moh_attn_config *attn(const void *cfg) { return &((const moh_vit_config *)cfg)->attn; }
static model_tensor *tensors(const void *cfg, model_naming scheme, int *n) {
    return scheme == MODEL_NAMES_CHECKPOINT ? vit_tensors(cfg, n) : NULL;
}

MODEL_ADAPTER(vit, vit_acts_init_attn_f32(a, cfg, Bmax, sparse, err),
              vit_params_init_random(cfg, p, seed))

static double forward(const void *cfg, const void *params, void *acts, const moh_batch *b, int first, int count,
                      bool train, double *ce, double *lb) {
    const moh_vit_config *c = cfg;
    moh_vit_config plain;
    if (!train) { /* the reported loss is the plain cross-entropy: smoothing is for training */
        plain = *c;
        plain.label_smoothing = 0.0;
        c = &plain;
    }
    vit_acts_f32 *a = acts;
    const size_t chw = (size_t)c->in_chans * c->img_size * c->img_size;
    const double loss = vit_forward_f32(c, params, a, b->images + (size_t)first * chw,
                                        b->labels ? b->labels + first : NULL, count);
    *ce = a->ce_loss;
    *lb = a->lb_loss;
    return loss;
}
static void backward(const void *cfg, const void *params, void *grads, void *acts, const moh_batch *b, int first,
                     int count) {
    vit_backward_f32(cfg, params, grads, acts, b->labels + first);
}
static int tokens_per_example(const void *cfg, const moh_batch *b) { return ((const moh_vit_config *)cfg)->num_tokens; }

static void train_defaults(train_hparams *hp) {
    memset(hp, 0, sizeof *hp);
    *hp = (train_hparams){.lr = 2e-3, .min_lr_ratio = 0.01, .weight_decay = 0.05, .beta1 = 0.9, .beta2 = 0.999,
                          .grad_clip = 1.0, .warmup = -1, .batch_size = 128, .grad_accum = 1, .shards = 0,
                          .seed = 1, .crop_pad = 1, .hflip = 1, .epochs = 25, .eval_every = 0, .eval_limit = 0,
                          .log_every = 50};
}

/* ---- IDX batch source (image_source.h) ------------------------------------------------------ */

/* Normalised images and their labels; evaluation batches are not augmented (keys unused). */
static void vit_make(void *ctx, const idx_split *sp, int cnt, bool train, uint64_t seed, uint64_t key_base,
                     const idx_augment *aug, image_batch *b, moh_batch *out) {
    const moh_vit_config *cfg = ctx;
    for (int j = 0; j < cnt; j++) b->lab[j] = sp->labels[b->idx[j]];
    if (train) vit_make_batch(cfg, sp, b->idx, cnt, aug, seed, key_base, b->img);
    else vit_make_batch(cfg, sp, b->idx, cnt, NULL, 0, 0, b->img);
    *out = (moh_batch){.B = cnt, .images = b->img, .C = 1, .H = cfg->img_size, .W = cfg->img_size, .labels = b->lab};
}

static int open_data(model *m, const data_request *req, batch_source *train, batch_source *eval, moh_error *err) {
    moh_vit_config *cfg = m->cfg;
    const image_family f = vit_images(cfg);
    batch_source ev;
    int rc = image_source_open(&f, req, train, &ev, err);
    if (!rc && cfg->n_norm == 0) { /* normalisation statistics of the whole training split */
        if (req->train) {
            idx_mean_std(image_source_train_split(&ev), &cfg->mean[0], &cfg->std[0]);
            if (!(cfg->std[0] > 0))
                rc = moh_fail(err, MOH_E_FORMAT, "%s: every training pixel has the same value; expected images with "
                              "some contrast (std > 0)", req->path);
        } else {
            rc = idx_train_mean_std(req->path, cfg->num_classes, &cfg->mean[0], &cfg->std[0], err);
            if (!rc && !req->quiet)
                fprintf(stderr, "moh eval: note: the checkpoint's config.json has no mean/std; using the training "
                        "split's (%.4f, %.4f)\n", cfg->mean[0], cfg->std[0]);
        }
        if (!rc) cfg->n_norm = 1;
        if (rc) {
            batch_source_free(&ev);
            if (train) memset(train, 0, sizeof *train);
        }
    }
    if (!rc) *eval = ev;
    return rc;
}

static void eval_add(const void *cfg, const void *acts, const moh_batch *b, int first, int count, model_eval *r) {
    const moh_vit_config *c = cfg;
    const vit_acts_f32 *a = acts;
    const int K = c->num_classes;
    if (!r->confusion) r->confusion = calloc((size_t)K * K, sizeof(long));
    for (int j = 0; j < count; j++) {
        const int pred = argmax(a->logits + (size_t)j * K, K), y = b->labels[first + j];
        if (r->confusion) r->confusion[(size_t)y * K + pred]++;
        r->correct += pred == y;
    }
    r->ce_sum += (double)a->ce_loss * count;
    r->n += count;
}
static void eval_finish(const void *cfg, model_eval *r) {
    r->loss = r->ce_sum / (double)r->n;
    r->metric = (double)r->correct / (double)r->n;
}
static void eval_json(const model_eval *r, char *buf, size_t cap) {
    snprintf(buf, cap, ", \"test_loss\": %.6f, \"test_acc\": %.6f, \"test_n\": %ld", r->loss, r->metric, r->n);
}
static void eval_brief(const model_eval *r, char *buf, size_t cap) {
    snprintf(buf, cap, " | test acc %.4f (%ld)", r->metric, r->n);
}

static void train_json(const void *cfg, void *const *acts, const int *count, int nshards, const moh_batch *b,
                       char *buf, size_t cap) {
    const int K = ((const moh_vit_config *)cfg)->num_classes;
    long hits = 0, first = 0;
    for (int s = 0; s < nshards; s++) {
        const vit_acts_f32 *a = acts[s];
        for (int j = 0; j < count[s]; j++) hits += argmax(a->logits + (size_t)j * K, K) == b->labels[first + j];
        first += count[s];
    }
    snprintf(buf, cap, ", \"batch_acc\": %.4f", b->B ? (double)hits / b->B : 0.0);
}

static void json_string(const char *s) {
    putchar('"');
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') putchar('\\');
        putchar(*s);
    }
    putchar('"');
}

static void eval_report(const model *m, const model_eval *r, const eval_context *ctx) {
    const moh_vit_config *cfg = m->cfg;
    const int K = cfg->num_classes;
    const char *const *names = idx_fashion_names(ctx->data_path, K);
    char cname[32];
    if (ctx->json) {
        printf("{\"accuracy\": %.6f, \"correct\": %ld, \"n\": %ld, \"ce_loss\": %.6f, \"lb_loss\": %.6f, "
               "\"split\": ", r->metric, r->correct, r->n, r->loss, r->lb_loss);
        json_string(ctx->split);
        printf(", \"classes\": [");
        for (int k = 0; k < K; k++) {
            snprintf(cname, sizeof cname, "%d", k);
            printf("%s", k ? ", " : "");
            json_string(names ? names[k] : cname);
        }
        printf("], \"per_class\": [");
        for (int k = 0; k < K; k++) {
            long row = 0;
            for (int j = 0; j < K; j++) row += r->confusion[(size_t)k * K + j];
            printf("%s%.6f", k ? ", " : "", row ? (double)r->confusion[(size_t)k * K + k] / row : 0.0);
        }
        printf("], \"confusion\": [");
        for (int k = 0; k < K; k++) {
            printf("%s[", k ? ", " : "");
            for (int j = 0; j < K; j++) printf("%s%ld", j ? ", " : "", r->confusion[(size_t)k * K + j]);
            printf("]");
        }
        printf("], ");
        model_print_head_share(m, r, true);
        printf("}\n");
        return;
    }
    printf("checkpoint %s on %s (%ld images)\n", ctx->checkpoint, ctx->src->label, r->n);
    printf("top-1 accuracy %.4f (%ld / %ld) | cross-entropy %.4f nats (no label smoothing) | lb %.3f "
           "(monitoring, not added)\n", r->metric, r->correct, r->n, r->loss, r->lb_loss);
    printf("per-class accuracy:\n");
    for (int k = 0; k < K; k++) {
        long row = 0;
        for (int j = 0; j < K; j++) row += r->confusion[(size_t)k * K + j];
        snprintf(cname, sizeof cname, "class %d", k);
        printf("  %2d %-12s %.4f (%ld)\n", k, names ? names[k] : cname,
               row ? (double)r->confusion[(size_t)k * K + k] / row : 0.0, row);
    }
    printf("confusion matrix (rows: true class, columns: predicted):\n     ");
    for (int j = 0; j < K; j++) printf(" %5d", j);
    printf("\n");
    for (int k = 0; k < K; k++) {
        printf("  %2d:", k);
        for (int j = 0; j < K; j++) printf(" %5ld", r->confusion[(size_t)k * K + j]);
        printf("\n");
    }
    model_print_head_share(m, r, false);
}

/* images [n, 1, H, W] (normalised, the model input), labels [n] and logits [n, K] of the first
 * evaluation batch */
/* The batch's images, labels and logits. */
static int dump_entries(const model *m, const moh_batch *b, void *acts, float *lab, moh_st_entry *e) {
    const moh_vit_config *cfg = m->cfg;
    vit_acts_f32 *a = acts;
    const int H = cfg->img_size, B = b->B;
    vit_forward_f32(cfg, m->params, a, b->images, NULL, B);
    for (int j = 0; j < B; j++) lab[j] = (float)b->labels[j];
    e[0] = (moh_st_entry){"images", 4, {B, 1, H, H}, b->images};
    e[1] = (moh_st_entry){"labels", 1, {B}, lab};
    e[2] = (moh_st_entry){"logits", 2, {B, cfg->num_classes}, a->logits};
    return 3;
}

static void describe(const void *cfg, size_t n, char *buf, size_t cap) {
    const moh_vit_config *c = cfg;
    snprintf(buf, cap, "ViT %.2fM, %dx%d patch %d, D %d, %d blocks", n / 1e6, c->img_size, c->img_size,
             c->patch_size, c->embed_dim, c->depth);
}

/* Random images and labels (model_synthetic_images); T is ignored. */
static int synthetic_batch(const void *cfg, int B, int T, uint64_t seed, moh_batch *out, void **buf, moh_error *err) {
    const moh_vit_config *c = cfg;
    (void)T;
    return model_synthetic_images(B, c->in_chans, c->img_size, c->img_size, c->num_classes, 0, seed, out, buf, err);
}

static int num_outputs(const void *cfg) { return ((const moh_vit_config *)cfg)->num_classes; }
static const float *logits(const void *acts) { return ((const vit_acts_f32 *)acts)->logits; }
static const float *features(const void *cfg, const void *acts, int *dim) {
    *dim = ((const moh_vit_config *)cfg)->embed_dim;
    return ((const vit_acts_f32 *)acts)->fnorm;
}
static void image_shape(const void *cfg, int *C, int *H, int *W) {
    const moh_vit_config *c = cfg;
    *C = c->in_chans;
    *H = *W = c->img_size;
}
static void image_norm(const void *cfg, int ch, double *mean, double *std) {
    const moh_vit_config *c = cfg;
    *mean = c->n_norm > ch ? c->mean[ch] : 0.0;
    *std = c->n_norm > ch ? c->std[ch] : 1.0;
}

const model_family vit_family = {
    MODEL_FAMILY_CORE(moh_vit_config, vit_params_f32, vit_acts_f32),
    .model_type = "vit",
    .task = "image-classification",
    .summary = "ViT image classifier (timm VisionTransformer layout)",
    .data_help = "a dir of MNIST-style IDX files: train-images-idx3-ubyte[.gz], train-labels-..., t10k-...",
    .unused_keys = "seq_len val_fraction ema_decay",
    .metric_name = "test accuracy",
    .train_json = train_json,
    .dump_entries = dump_entries,
    .legacy_optimizer_format = "moh-vit-train-v1",
    .default_sparse = false,
    .num_outputs = num_outputs,
    .logits = logits,
    .features = features,
    .image_shape = image_shape,
    .image_norm = image_norm,
    .short_name = "ViT",
    .open_analysis = vit_open_analysis,
};
