/* The ViT image classifier as a model family (model.h): config, tensor registry, forward/backward
 * on image batches, and the IDX batch source (data/idx.h) with augmentation and the top-1
 * accuracy metric. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fsutil.h"
#include "core/rng.h"
#include "data/idx.h"
#include "models/model.h"
#include "models/vit.h"
#include "models/vit_analysis.h"

int vit_check_split(const moh_vit_config *cfg, const idx_split *s, const char *label, moh_error *err) {
    if (cfg->in_chans != 1)
        return moh_fail(err, MOH_E_CONFIG, "%s: IDX images have 1 channel, config in_chans is %d "
                        "(expected 1)", label, cfg->in_chans);
    if (s->rows != cfg->img_size || s->cols != cfg->img_size)
        return moh_fail(err, MOH_E_CONFIG, "%s: images are %dx%d, config img_size is %d (expected "
                        "square images of that side)", label, s->rows, s->cols, cfg->img_size);
    if (s->num_classes > cfg->num_classes)
        return moh_fail(err, MOH_E_CONFIG, "%s: labels checked against %d classes, config "
                        "num_classes is %d", label, s->num_classes, cfg->num_classes);
    return MOH_OK;
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

static int params_new(const void *cfg, void **params, float **data, size_t *n, moh_error *err) {
    vit_params_f32 *p = calloc(1, sizeof *p);
    if (!p) return moh_fail(err, MOH_E_NOMEM, "model: out of memory");
    int rc = vit_params_init_f32(p, cfg, err);
    if (rc) {
        free(p);
        return rc;
    }
    *params = p;
    *data = p->data;
    *n = p->n;
    return MOH_OK;
}
static void params_free(void *p) {
    if (!p) return;
    vit_params_free_f32(p);
    free(p);
}
static void init_random(const void *cfg, void *p, uint64_t seed) { vit_params_init_random(cfg, p, seed); }

static int acts_new(const void *cfg, int Bmax, int T, bool sparse, void **acts, moh_error *err) {
    vit_acts_f32 *a = calloc(1, sizeof *a);
    if (!a) return moh_fail(err, MOH_E_NOMEM, "model: out of memory");
    int rc = vit_acts_init_attn_f32(a, cfg, Bmax, sparse, err);
    if (rc) {
        free(a);
        return rc;
    }
    *acts = a;
    return MOH_OK;
}
static void acts_free(void *a) {
    if (!a) return;
    vit_acts_free_f32(a);
    free(a);
}
static int acts_set_bf16(const void *cfg, void *acts, const bf16_mirror *w, moh_error *err) {
    return vit_acts_set_bf16_f32(acts, cfg, w, err);
}

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
static const attn_cache_f32 *router(const void *acts, int l) { return vit_router_cache_f32(acts, l); }
static int tokens_per_example(const void *cfg, const moh_batch *b) { return ((const moh_vit_config *)cfg)->num_tokens; }

static void train_defaults(train_hparams *hp) {
    memset(hp, 0, sizeof *hp);
    *hp = (train_hparams){.lr = 2e-3, .min_lr_ratio = 0.01, .weight_decay = 0.05, .beta1 = 0.9, .beta2 = 0.999,
                          .grad_clip = 1.0, .warmup = -1, .batch_size = 128, .grad_accum = 1, .shards = 0,
                          .seed = 1, .crop_pad = 1, .hflip = 1, .epochs = 25, .eval_every = 0, .eval_limit = 0,
                          .log_every = 50};
}

/* ---- IDX batch source ---------------------------------------------------------------------- */

typedef struct idx_source {
    const moh_vit_config *cfg; /* the model's (mean/std filled by open_data) */
    idx_split train, eval;
    int n_train;               /* training images used (--train-limit) */
    int B;                     /* micro-batch (all ranks) */
    int accum;                 /* micro-batches per optimizer step */
    long micro_per_epoch;      /* micro-batches per pass over the n_train images */
    uint64_t seed;
    idx_augment aug;
    int *perm;                 /* [n_train] order of perm_epoch */
    long perm_epoch;
    int *idx, *lab;            /* [max(B, eval_B)] */
    float *img;                /* [max(B, eval_B), H, W] */
    int eval_B;
    char label[PATH_MAX + 16];
} idx_source;

static void idx_source_free(void *self) {
    idx_source *s = self;
    idx_split_free(&s->train);
    idx_split_free(&s->eval);
    free(s->perm);
    free(s->idx);
    free(s->lab);
    free(s->img);
    free(s);
}

/* Micro-batch `micro` of step `step`: global micro-batch g = step * accum + micro in the epoch order
 * (a permutation per epoch; the last partial batch of an epoch dropped). */
static int idx_next(void *self, long step, int micro, int rank, int nranks, uint64_t *data_rng, moh_batch *out,
                    moh_error *err) {
    idx_source *s = self;
    const int B = s->B;
    const long g = step * s->accum + micro, epoch = g / s->micro_per_epoch, pos = g % s->micro_per_epoch;
    if (epoch != s->perm_epoch) {
        idx_epoch_order(s->perm, s->n_train, s->seed, epoch);
        s->perm_epoch = epoch;
    }
    const int lo = (int)((long)B * rank / nranks), hi = (int)((long)B * (rank + 1) / nranks);
    for (int j = lo; j < hi; j++) {
        s->idx[j - lo] = s->perm[pos * B + j];
        s->lab[j - lo] = s->train.labels[s->idx[j - lo]];
    }
    const uint64_t key = (uint64_t)epoch * (uint64_t)s->n_train + (uint64_t)(pos * B + lo);
    vit_make_batch(s->cfg, &s->train, s->idx, hi - lo, &s->aug, s->seed, key, s->img);
    *out = (moh_batch){.B = hi - lo, .images = s->img, .C = 1, .H = s->cfg->img_size, .W = s->cfg->img_size,
                       .labels = s->lab};
    return MOH_OK;
}

static long idx_eval_items(void *self, long limit) {
    const idx_source *s = self;
    return limit > 0 && limit < s->eval.n ? limit : s->eval.n;
}

static long idx_eval_next(void *self, long *cursor, long limit, int capacity, moh_batch *out) {
    idx_source *s = self;
    const long n = idx_eval_items(self, limit), i0 = *cursor;
    if (i0 >= n) return 0;
    if (capacity > s->eval_B) capacity = s->eval_B;
    const int cnt = (int)(n - i0 < capacity ? n - i0 : capacity);
    for (int j = 0; j < cnt; j++) {
        s->idx[j] = (int)(i0 + j);
        s->lab[j] = s->eval.labels[i0 + j];
    }
    vit_make_batch(s->cfg, &s->eval, s->idx, cnt, NULL, 0, 0, s->img);
    *cursor = i0 + cnt;
    *out = (moh_batch){.B = cnt, .images = s->img, .C = 1, .H = s->cfg->img_size, .W = s->cfg->img_size,
                       .labels = s->lab};
    return cnt;
}

/* true when dir holds a file named name */
static bool has_file(const char *dir, const char *name) {
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return access(path, F_OK) == 0;
}

static int open_data(model *m, const data_request *req, batch_source *train, batch_source *eval, moh_error *err) {
    moh_vit_config *cfg = m->cfg;
    const train_hparams *hp = req->hp;
    const char *data = req->path;
    struct stat st;
    if (stat(data, &st) == 0 && !S_ISDIR(st.st_mode))
        return moh_fail(err, MOH_E_ARG, "--data %s is a file, but %s is a ViT (image) model: it needs a directory of "
                        "IDX files (train-images-idx3-ubyte[.gz], t10k-images-idx3-ubyte[.gz], ...)", data,
                        req->model_label);
    if (stat(data, &st) == 0 && (has_file(data, "val.txt") || has_file(data, "train.txt")) &&
        !has_file(data, "t10k-images-idx3-ubyte") && !has_file(data, "t10k-images-idx3-ubyte.gz"))
        return moh_fail(err, MOH_E_ARG, "--data %s holds text (val.txt / train.txt), but %s is a ViT (image) model: it "
                        "needs a directory of IDX files (t10k-images-idx3-ubyte[.gz], ...)", data, req->model_label);
    if (hp->crop_pad < 0 || hp->crop_pad > 64)
        return moh_fail(err, MOH_E_ARG, "--crop-pad is %d, expected 0..64", hp->crop_pad);
    idx_source *s = calloc(1, sizeof *s);
    if (!s) return moh_fail(err, MOH_E_NOMEM, "data: out of memory");
    s->cfg = cfg;
    s->perm_epoch = -1;
    s->B = hp->batch_size;
    s->accum = hp->grad_accum > 0 ? hp->grad_accum : 1;
    s->eval_B = req->eval_batch > 0 ? req->eval_batch : hp->batch_size;
    s->seed = hp->seed;
    s->aug = (idx_augment){hp->crop_pad, hp->hflip != 0};
    const char *split = req->train ? "t10k" : (req->split ? req->split : "t10k");
    snprintf(s->label, sizeof s->label, "%s/%s", data, split);
    int rc = MOH_OK;
    if (req->train) {
        rc = idx_split_load(&s->train, data, "train", cfg->num_classes, err);
        if (!rc) rc = vit_check_split(cfg, &s->train, data, err);
    }
    if (!rc) rc = idx_split_load(&s->eval, data, split, cfg->num_classes, err);
    if (!rc) rc = vit_check_split(cfg, &s->eval, data, err);
    if (!rc && cfg->n_norm == 0) { /* normalisation statistics of the whole training split */
        if (req->train) {
            idx_mean_std(&s->train, &cfg->mean[0], &cfg->std[0]);
            if (!(cfg->std[0] > 0))
                rc = moh_fail(err, MOH_E_FORMAT, "%s: every training pixel has the same value; expected images with "
                              "some contrast (std > 0)", data);
        } else {
            rc = idx_train_mean_std(data, cfg->num_classes, &cfg->mean[0], &cfg->std[0], err);
            if (!rc && !req->quiet)
                fprintf(stderr, "moh eval: note: the checkpoint's config.json has no mean/std; using the training "
                        "split's (%.4f, %.4f)\n", cfg->mean[0], cfg->std[0]);
        }
        if (!rc) cfg->n_norm = 1;
    }
    if (!rc && req->train) {
        s->n_train = hp->train_limit > 0 && hp->train_limit < s->train.n ? (int)hp->train_limit : s->train.n;
        s->micro_per_epoch = s->n_train / s->B;
        if (s->micro_per_epoch / s->accum < 1)
            rc = moh_fail(err, MOH_E_ARG, "--batch-size %d x --grad-accum %d is more than the %d training images",
                          s->B, s->accum, s->n_train);
    }
    if (!req->train && s->eval_B > s->eval.n && s->eval.n > 0) s->eval_B = s->eval.n; /* result does not change */
    const int cap = s->B > s->eval_B ? s->B : s->eval_B;
    const size_t hw = (size_t)cfg->img_size * cfg->img_size;
    if (!rc) {
        s->perm = malloc(sizeof(int) * (size_t)(s->n_train > 0 ? s->n_train : 1));
        s->idx = malloc(sizeof(int) * (size_t)cap);
        s->lab = malloc(sizeof(int) * (size_t)cap);
        s->img = malloc(sizeof(float) * hw * (size_t)cap);
        if (!s->perm || !s->idx || !s->lab || !s->img) rc = moh_fail(err, MOH_E_NOMEM, "data: out of memory");
    }
    if (rc) {
        idx_source_free(s);
        return rc;
    }
    const long spe = s->micro_per_epoch / s->accum;
    *eval = (batch_source){.self = s, .unit = "img", .seen_key = "images", .eval_unit = "images", .what = "images",
                           .label = s->label, .examples_per_step = s->B, .steps_per_epoch = spe,
                           .warmup_cap = spe, .next = idx_next, .eval_items = idx_eval_items,
                           .eval_next = idx_eval_next, .free = idx_source_free, .n_train = (size_t)s->n_train,
                           .n_eval = (size_t)s->eval.n,
                           .data_crc = idx_split_crc(&s->eval, s->eval.n, idx_split_crc(&s->train, s->n_train, 0))};
    if (train) {
        *train = *eval;
        train->free = NULL;
    }
    return MOH_OK;
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
static int dump_logits(const model *m, batch_source *src, const char *path, moh_error *err) {
    const moh_vit_config *cfg = m->cfg;
    long cursor = 0;
    moh_batch b;
    const idx_source *s = src->self;
    const long n = src->eval_next(src->self, &cursor, 0, s->eval_B, &b);
    if (n <= 0) return moh_fail(err, MOH_E_FORMAT, "%s: no images to dump", path);
    void *acts = NULL;
    int rc = acts_new(cfg, b.B, 0, false, &acts, err);
    float *lab = rc ? NULL : malloc(sizeof(float) * (size_t)b.B);
    if (!rc && !lab) rc = moh_fail(err, MOH_E_NOMEM, "dump-logits: out of memory");
    if (!rc) {
        const int H = cfg->img_size, K = cfg->num_classes;
        vit_acts_f32 *a = acts;
        vit_forward_f32(cfg, m->params, a, b.images, NULL, b.B);
        for (int j = 0; j < b.B; j++) lab[j] = (float)b.labels[j];
        moh_st_entry e[3] = {{"images", 4, {b.B, 1, H, H}, b.images}, {"labels", 1, {b.B}, lab},
                             {"logits", 2, {b.B, K}, a->logits}};
        rc = moh_st_write(path, e, 3, err);
    }
    free(lab);
    acts_free(acts);
    return rc;
}

static void describe(const void *cfg, size_t n, char *buf, size_t cap) {
    const moh_vit_config *c = cfg;
    snprintf(buf, cap, "ViT %.2fM, %dx%d patch %d, D %d, %d blocks", n / 1e6, c->img_size, c->img_size,
             c->patch_size, c->embed_dim, c->depth);
}

/* Random images [B, C, H, W] uniform in [-2, 2) (about the range of normalised pixels) and labels
 * [B] in 0..num_classes-1, from splitmix64 at seed; T is ignored. */
static int synthetic_batch(const void *cfg, int B, int T, uint64_t seed, moh_batch *out, void **buf, moh_error *err) {
    const moh_vit_config *c = cfg;
    const size_t n = (size_t)B * c->in_chans * c->img_size * c->img_size;
    float *img = malloc(sizeof(float) * n + sizeof(int) * (size_t)B);
    if (!img) return moh_fail(err, MOH_E_NOMEM, "synthetic batch: out of memory");
    int *lab = (int *)(img + n);
    uint64_t s = seed;
    for (size_t i = 0; i < n; i++) img[i] = (float)(4.0 * moh_rng_uniform01(&s) - 2.0);
    for (int j = 0; j < B; j++) lab[j] = (int)(moh_rng_next(&s) % (uint64_t)c->num_classes);
    *buf = img;
    *out = (moh_batch){.B = B, .images = img, .C = c->in_chans, .H = c->img_size, .W = c->img_size, .labels = lab};
    return MOH_OK;
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
    .model_type = "vit",
    .task = "image-classification",
    .summary = "ViT image classifier (timm VisionTransformer layout)",
    .data_help = "a dir of MNIST-style IDX files: train-images-idx3-ubyte[.gz], train-labels-..., t10k-...",
    .config_size = sizeof(moh_vit_config),
    .describe = describe,
    .config_parse = cfg_parse,
    .config_to_json = cfg_json,
    .num_layers = num_layers,
    .attn = attn,
    .tensors = tensors,
    .params_new = params_new,
    .params_free = params_free,
    .init_random = init_random,
    .acts_new = acts_new,
    .acts_free = acts_free,
    .acts_set_bf16 = acts_set_bf16,
    .forward = forward,
    .backward = backward,
    .router = router,
    .tokens_per_example = tokens_per_example,
    .train_defaults = train_defaults,
    .unused_keys = "seq_len val_fraction ema_decay",
    .open_data = open_data,
    .eval_add = eval_add,
    .eval_finish = eval_finish,
    .eval_json = eval_json,
    .eval_brief = eval_brief,
    .metric_name = "test accuracy",
    .train_json = train_json,
    .eval_report = eval_report,
    .dump_logits = dump_logits,
    .legacy_optimizer_format = "moh-vit-train-v1",
    .default_sparse = false,
    .num_outputs = num_outputs,
    .logits = logits,
    .features = features,
    .image_shape = image_shape,
    .image_norm = image_norm,
    .short_name = "ViT",
    .open_analysis = vit_open_analysis,
    .synthetic_batch = synthetic_batch,
};
