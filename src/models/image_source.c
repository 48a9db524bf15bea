/* The image families' IDX batch source (image_source.h). */
#include "models/image_source.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct image_source {
    image_family f;
    idx_split train, eval;
    int n_train;               /* training images used (--train-limit) */
    int B;                     /* micro-batch (all ranks) */
    int accum;                 /* micro-batches per optimizer step */
    int eval_B;
    long micro_per_epoch;      /* micro-batches per pass over the n_train images */
    uint64_t seed;
    idx_augment aug;
    int *perm;                 /* [n_train] order of perm_epoch */
    long perm_epoch;
    image_batch b;
    char label[PATH_MAX + 16];
} image_source;

static void source_free(void *self) {
    image_source *s = self;
    if (s->f.ctx_free) s->f.ctx_free(s->f.ctx);
    idx_split_free(&s->train);
    idx_split_free(&s->eval);
    free(s->perm);
    free(s->b.idx);
    free(s->b.lab);
    free(s->b.t);
    free(s->b.img);
    free(s->b.eps);
    free(s);
}

static int source_next(void *self, long step, int micro, int rank, int nranks, uint64_t *data_rng, moh_batch *out,
                       moh_error *err) {
    (void)data_rng;
    (void)err;
    image_source *s = self;
    const int B = s->B;
    const long g = step * s->accum + micro, epoch = g / s->micro_per_epoch, pos = g % s->micro_per_epoch;
    if (epoch != s->perm_epoch) {
        idx_epoch_order(s->perm, s->n_train, s->seed, epoch);
        s->perm_epoch = epoch;
    }
    const int lo = (int)((long)B * rank / nranks), hi = (int)((long)B * (rank + 1) / nranks);
    for (int j = lo; j < hi; j++) s->b.idx[j - lo] = s->perm[pos * B + j];
    const uint64_t key = (uint64_t)epoch * (uint64_t)s->n_train + (uint64_t)(pos * B + lo);
    s->f.make(s->f.ctx, &s->train, hi - lo, true, s->seed, key, &s->aug, &s->b, out);
    return MOH_OK;
}

static long source_eval_items(void *self, long limit) {
    const image_source *s = self;
    return limit > 0 && limit < s->eval.n ? limit : s->eval.n;
}

static long source_eval_next(void *self, long *cursor, long limit, int capacity, moh_batch *out) {
    image_source *s = self;
    const long n = source_eval_items(self, limit), i0 = *cursor;
    if (i0 >= n) return 0;
    if (capacity > s->eval_B) capacity = s->eval_B;
    const int cnt = (int)(n - i0 < capacity ? n - i0 : capacity);
    for (int j = 0; j < cnt; j++) s->b.idx[j] = (int)(i0 + j);
    s->f.make(s->f.ctx, &s->eval, cnt, false, 0, (uint64_t)i0, NULL, &s->b, out);
    *cursor = i0 + cnt;
    return cnt;
}

int image_check_split(const image_family *f, const idx_split *s, const char *label, moh_error *err) {
    if (f->channels != 1)
        return moh_fail(err, MOH_E_CONFIG, "%s: IDX images have 1 channel, config %s is %d (expected 1)", label,
                        f->channels_key, f->channels);
    if (s->rows != f->side || s->cols != f->side)
        return moh_fail(err, MOH_E_CONFIG, "%s: images are %dx%d, config %s is %d (expected square images of that "
                        "side)", label, s->rows, s->cols, f->side_key, f->side);
    if (s->num_classes > f->num_classes)
        return moh_fail(err, MOH_E_CONFIG, "%s: labels checked against %d classes, config num_classes is %d", label,
                        s->num_classes, f->num_classes);
    return MOH_OK;
}

/* true when dir holds a file named name */
static bool has_file(const char *dir, const char *name) {
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return access(path, F_OK) == 0;
}

static int check_request(const image_family *f, const data_request *req, moh_error *err) {
    const char *data = req->path;
    const int crop = req->hp->crop_pad;
    struct stat st;
    if (stat(data, &st) == 0 && !S_ISDIR(st.st_mode))
        return moh_fail(err, MOH_E_ARG, "--data %s is a file, but %s is a %s (image) model: it needs a directory of "
                        "IDX files (train-images-idx3-ubyte[.gz], t10k-images-idx3-ubyte[.gz], ...)", data,
                        req->model_label, f->family);
    if (stat(data, &st) == 0 && (has_file(data, "val.txt") || has_file(data, "train.txt")) &&
        !has_file(data, "t10k-images-idx3-ubyte") && !has_file(data, "t10k-images-idx3-ubyte.gz"))
        return moh_fail(err, MOH_E_ARG, "--data %s holds text (val.txt / train.txt), but %s is a %s (image) model: it "
                        "needs a directory of IDX files (t10k-images-idx3-ubyte[.gz], ...)", data, req->model_label,
                        f->family);
    if (f->crop_pad_max == 0 && crop != 0)
        return moh_fail(err, MOH_E_ARG, "--crop-pad is %d, expected 0 for a %s (%s)", crop, f->family, f->crop_refusal);
    if (crop < 0 || crop > f->crop_pad_max)
        return moh_fail(err, MOH_E_ARG, "--crop-pad is %d, expected 0..%d", crop, f->crop_pad_max);
    return MOH_OK;
}

int image_source_open(const image_family *f, const data_request *req, batch_source *train, batch_source *eval,
                      moh_error *err) {
    int rc = check_request(f, req, err);
    image_source *s = rc ? NULL : calloc(1, sizeof *s);
    if (!rc && !s) rc = moh_fail(err, MOH_E_NOMEM, "data: out of memory");
    if (rc) {
        if (f->ctx_free) f->ctx_free(f->ctx);
        return rc;
    }
    const train_hparams *hp = req->hp;
    const char *data = req->path;
    s->f = *f;
    s->perm_epoch = -1;
    s->B = hp->batch_size;
    s->accum = hp->grad_accum > 0 ? hp->grad_accum : 1;
    s->eval_B = req->eval_batch > 0 ? req->eval_batch : hp->batch_size;
    s->seed = hp->seed;
    s->aug = (idx_augment){hp->crop_pad, hp->hflip != 0};
    const char *split = req->train ? "t10k" : (req->split ? req->split : "t10k");
    snprintf(s->label, sizeof s->label, "%s/%s", data, split);
    if (req->train) {
        rc = idx_split_load(&s->train, data, "train", f->num_classes, err);
        if (!rc) rc = image_check_split(f, &s->train, data, err);
    }
    if (!rc) rc = idx_split_load(&s->eval, data, split, f->num_classes, err);
    if (!rc) rc = image_check_split(f, &s->eval, data, err);
    if (!rc && req->train) {
        s->n_train = hp->train_limit > 0 && hp->train_limit < s->train.n ? (int)hp->train_limit : s->train.n;
        s->micro_per_epoch = s->n_train / s->B;
        if (s->micro_per_epoch / s->accum < 1)
            rc = moh_fail(err, MOH_E_ARG, "--batch-size %d x --grad-accum %d is more than the %d training images", s->B,
                          s->accum, s->n_train);
    }
    if (!rc && req->train && f->train_eval_cap > 0 && s->eval.n > f->train_eval_cap)
        s->eval.n = f->train_eval_cap; /* (the arrays keep their size) */
    if (!req->train && s->eval_B > s->eval.n && s->eval.n > 0) s->eval_B = s->eval.n; /* result does not change */
    const size_t cap = (size_t)(s->B > s->eval_B ? s->B : s->eval_B), hw = (size_t)f->side * f->side;
    if (!rc) {
        s->perm = malloc(sizeof(int) * (size_t)(s->n_train > 0 ? s->n_train : 1));
        s->b.idx = malloc(sizeof(int) * cap);
        s->b.lab = malloc(sizeof(int) * cap);
        s->b.img = malloc(sizeof(float) * hw * cap);
        if (f->noise) {
            s->b.t = malloc(sizeof(int) * cap);
            s->b.eps = malloc(sizeof(float) * hw * cap);
        }
        if (!s->perm || !s->b.idx || !s->b.lab || !s->b.img || (f->noise && (!s->b.t || !s->b.eps)))
            rc = moh_fail(err, MOH_E_NOMEM, "data: out of memory");
    }
    if (rc) {
        source_free(s);
        return rc;
    }
    const long spe = s->micro_per_epoch / s->accum;
    *eval = (batch_source){.self = s, .unit = "img", .seen_key = "images", .eval_unit = "images", .what = "images",
                           .label = s->label, .examples_per_step = s->B, .steps_per_epoch = spe,
                           .warmup_cap = spe, .next = source_next, .eval_items = source_eval_items,
                           .eval_next = source_eval_next, .free = source_free, .n_train = (size_t)s->n_train,
                           .n_eval = (size_t)s->eval.n,
                           .data_crc = idx_split_crc(&s->eval, s->eval.n, idx_split_crc(&s->train, s->n_train, 0))};
    if (train) {
        *train = *eval;
        train->free = NULL;
    }
    return MOH_OK;
}

const idx_split *image_source_train_split(const batch_source *src) {
    return &((const image_source *)src->self)->train;
}
