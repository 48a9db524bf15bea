/* Class accuracy and classifier features of images (image_quality.h). */
#include "models/image_quality.h"

#include <stdlib.h>
#include <string.h>

int iq_check_classifier(const model *clf, int C, int H, int W, int K, const char *label, const char *what,
                        moh_error *err) {
    const model_family *f = clf->fam;
    if (!f->features || !f->num_outputs || !f->image_shape || !f->logits)
        return moh_fail(err, MOH_E_ARG, "%s is a %s (model_type \"%s\", task %s), expected an image classifier whose "
                        "features moh reads (a ViT: moh train --config vit-mha --data DIR)", label, f->short_name,
                        f->model_type, f->task);
    int c = 0, h = 0, w = 0;
    f->image_shape(clf->cfg, &c, &h, &w);
    const int k = f->num_outputs(clf->cfg);
    if (c != C || h != H || w != W)
        return moh_fail(err, MOH_E_CONFIG, "%s takes %dx%dx%d images, %s makes %dx%dx%d (expected the same size)", label,
                        h, w, c, what, H, W, C);
    if (k != K)
        return moh_fail(err, MOH_E_CONFIG, "%s has %d classes, %s has %d (expected the same classes)", label, k, what, K);
    return MOH_OK;
}

int iq_classify(const model *clf, const uint8_t *px, long n, int batch, float **feat, int *dim, int *pred,
                const moh_progress *progress, moh_error *err) {
    *feat = NULL;
    if (n < 1 || batch < 1)
        return moh_fail(err, MOH_E_ARG, "classifier pass: %ld images in batches of %d, expected >= 1 of each", n, batch);
    const model_family *f = clf->fam;
    int C = 0, H = 0, W = 0;
    f->image_shape(clf->cfg, &C, &H, &W);
    const int K = f->num_outputs(clf->cfg);
    const size_t chw = (size_t)C * H * W;
    if (C > 16) return moh_fail(err, MOH_E_ARG, "classifier pass: %d image channels, at most 16 supported", C);
    if (batch > n) batch = (int)n;
    double mean[16], std[16];
    for (int c = 0; c < C; c++) f->image_norm(clf->cfg, c, &mean[c], &std[c]);
    float *img = malloc(sizeof(float) * chw * (size_t)batch);
    int *lab = calloc((size_t)batch, sizeof(int));
    model_shards w = {0};
    int rc = !img || !lab ? moh_fail(err, MOH_E_NOMEM, "classifier pass: out of memory") : MOH_OK;
    if (!rc) rc = model_shards_init(&w, clf, batch, 0, model_default_shards(batch), false, f->default_sparse, err);
    int d = 0;
    for (long i0 = 0; !rc && i0 < n; i0 += batch) {
        const int B = n - i0 < batch ? (int)(n - i0) : batch;
        for (size_t q = 0; q < chw * (size_t)B; q++) {
            const int c = (int)(q / ((size_t)H * W) % (size_t)C);
            img[q] = (float)((px[(size_t)i0 * chw + q] / 255.0 - mean[c]) / std[c]);
        }
        const moh_batch b = {.B = B, .images = img, .C = C, .H = H, .W = W, .labels = lab};
        double ce, lb;
        model_shards_step(clf, &w, &b, false, NULL, NULL, &ce, &lb);
        for (int s = 0; !rc && s < w.n; s++) {
            if (w.count[s] == 0) continue;
            const float *fs = f->features(clf->cfg, w.acts[s], &d), *ls = f->logits(w.acts[s]);
            if (!*feat && !(*feat = malloc(sizeof(float) * (size_t)d * (size_t)n))) {
                rc = moh_fail(err, MOH_E_NOMEM, "classifier features of %ld images: out of memory", n);
                break;
            }
            const long r0 = i0 + w.first[s];
            memcpy(*feat + (size_t)r0 * d, fs, sizeof(float) * (size_t)d * w.count[s]);
            for (int j = 0; j < w.count[s]; j++) {
                int best = 0;
                for (int k = 1; k < K; k++)
                    if (ls[(size_t)j * K + k] > ls[(size_t)j * K + best]) best = k;
                pred[r0 + j] = best;
            }
        }
        if (progress && progress->fn) progress->fn(progress->ctx, i0 + B, n);
    }
    if (w.acts) model_shards_free(&w, clf);
    free(img);
    free(lab);
    if (rc) {
        free(*feat);
        *feat = NULL;
    }
    *dim = d;
    return rc;
}
