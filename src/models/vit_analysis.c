/* `moh analyze` data of the ViT (vit_analysis.h): the classes of an IDX t10k split. */
#include "models/vit_analysis.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/idx.h"
#include "models/vit.h"

#define MAX_CATEGORIES 256

typedef struct image_cats {
    int C;
    char *names[MAX_CATEGORIES];
    idx_split split;   /* the t10k split */
    bool have_split;
    int *idx;          /* [n_idx] the selected images, grouped by class */
    int n_idx;
    int batch;         /* images per batch */
    float *img;        /* [batch, C, H, W] */
    char note[512];
} image_cats;

static void image_cats_free(void *self) {
    image_cats *d = self;
    if (!d) return;
    for (int c = 0; c < d->C; c++) free(d->names[c]);
    if (d->have_split) idx_split_free(&d->split);
    free(d->idx);
    free(d->img);
    free(d);
}

/* A config without mean/std (normalisation) gets the training split's, as moh eval does; without
 * a readable training split, unnormalised pixels in [0, 1] (with a note). */
static void fill_norm(moh_vit_config *cfg, const char *ckpt, const char *data) {
    if (cfg->n_norm) return;
    moh_error e2 = {0};
    if (idx_train_mean_std(data, cfg->num_classes, &cfg->mean[0], &cfg->std[0], &e2)) {
        fprintf(stderr, "moh analyze: note: %s/config.json has no mean/std and the training split cannot be "
                "read (%s); pixels in [0, 1] are used unnormalised\n", ckpt, e2.msg);
        return;
    }
    cfg->n_norm = 1;
    fprintf(stderr, "moh analyze: note: %s/config.json has no mean/std; using the training split's (%.4f, %.4f)\n",
            ckpt, cfg->mean[0], cfg->std[0]);
}

/* The t10k split of an IDX dir; per class the first ceil(max_tokens / Ntok) images in file order. */
static int load_image_data(image_cats *d, const moh_vit_config *cfg, const char *data, long max_tokens,
                           moh_error *err) {
    int rc = idx_split_load(&d->split, data, "t10k", cfg->num_classes, err);
    if (rc) return rc;
    d->have_split = true;
    if ((rc = vit_check_split(cfg, &d->split, data, err))) return rc;
    const int K = cfg->num_classes;
    if (K > MAX_CATEGORIES) return moh_fail(err, MOH_E_CONFIG, "%d classes: at most %d supported", K, MAX_CATEGORIES);
    const long per = (max_tokens + cfg->num_tokens - 1) / cfg->num_tokens;
    d->idx = malloc(sizeof(int) * (size_t)d->split.n);
    if (!d->idx) return moh_fail(err, MOH_E_NOMEM, "out of memory");
    const char *const *fashion = idx_fashion_names(data, K);
    for (int k = 0; k < K; k++) {
        char buf[32];
        snprintf(buf, sizeof buf, "%d", k);
        const char *name = fashion ? fashion[k] : buf;
        d->names[k] = malloc(strlen(name) + 1);
        d->C = k + 1;
        if (!d->names[k]) return moh_fail(err, MOH_E_NOMEM, "out of memory");
        memcpy(d->names[k], name, strlen(name) + 1);
        long taken = 0;
        for (int i = 0; i < d->split.n && taken < per; i++)
            if (d->split.labels[i] == k) {
                d->idx[d->n_idx++] = i;
                taken++;
            }
    }
    snprintf(d->note, sizeof d->note,
             "%s/t10k split: per class the first %ld images in file order (fewer if the class has fewer), "
             "all %d tokens of each image (class token included) counted", data, per, cfg->num_tokens);
    return MOH_OK;
}

/* The cursor is an index into the selected images: the next `batch` of them (classes may mix in a
 * batch), normalised with m's mean/std. */
static long image_cats_next(void *self, const model *m, long *cursor, moh_batch *out, int *cat) {
    image_cats *d = self;
    const moh_vit_config *cfg = m->cfg;
    const long i0 = *cursor;
    if (i0 >= d->n_idx) return 0;
    const int B = d->n_idx - i0 < d->batch ? (int)(d->n_idx - i0) : d->batch;
    vit_make_batch(cfg, &d->split, d->idx + i0, B, NULL, 0, 0, d->img);
    for (int b = 0; b < B; b++) cat[b] = d->split.labels[d->idx[i0 + b]];
    *cursor = i0 + B;
    *out = (moh_batch){.B = B, .images = d->img, .C = cfg->in_chans, .H = cfg->img_size, .W = cfg->img_size};
    return B;
}

int vit_open_analysis(const analysis_request *req, analysis_data *out, moh_error *err) {
    moh_vit_config *mc = req->m->cfg, *tc = req->twin ? req->twin->cfg : NULL;
    if (tc && (tc->num_tokens != mc->num_tokens || tc->num_classes != mc->num_classes))
        return moh_fail(err, MOH_E_CONFIG, "--compare %s: image tokens/classes differ from %s", req->twin_label,
                        req->model_label);
    const int batch = req->batch > 0 ? req->batch : 64;
    if (req->seq_len > 0) fprintf(stderr, "moh analyze: note: --seq-len does not apply to a ViT; ignored\n");
    if (req->categories) return moh_fail(err, MOH_E_ARG, "--categories applies to LM topics; a ViT uses every class");
    fill_norm(mc, req->model_label, req->data);
    if (tc) fill_norm(tc, req->twin_label, req->data);
    image_cats *d = calloc(1, sizeof *d);
    if (!d) return moh_fail(err, MOH_E_NOMEM, "out of memory");
    d->batch = batch;
    int rc = load_image_data(d, mc, req->data, req->max_tokens, err);
    if (!rc && tc && vit_check_split(tc, &d->split, req->data, err)) { /* image size, channels */
        char msg[sizeof err->msg];
        snprintf(msg, sizeof msg, "%s", err->msg);
        rc = moh_fail(err, MOH_E_CONFIG, "--compare %s: %s", req->twin_label, msg);
    }
    if (!rc) {
        d->img = malloc(sizeof(float) * (size_t)mc->in_chans * mc->img_size * mc->img_size * (size_t)batch);
        if (!d->img) rc = moh_fail(err, MOH_E_NOMEM, "out of memory");
    }
    if (rc) {
        image_cats_free(d);
        return rc;
    }
    *out = (analysis_data){.self = d, .type = "vit", .C = d->C, .names = d->names, .note = d->note,
                           .unit = "images", .items = d->n_idx, .batch = batch, .T = 0, .next = image_cats_next,
                           .free = image_cats_free};
    return MOH_OK;
}
