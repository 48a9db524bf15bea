/* moh eval --classifier on an image-generation checkpoint (DiT): sample quality under an image
 * classifier trained by moh (a ViT). N samples balanced over the classes (sample i has class
 * floor(i K / N), seeded: image i draws from (seed, i) alone) are drawn with the family's sampler,
 * rounded to bytes as `moh sample --out-idx` writes them, and classified:
 *   class_accuracy  share of samples the classifier puts in the class they were drawn for
 *   fid             squared Fréchet distance (analysis/frechet.h) between the classifier's
 *                   penultimate features (model_family.features) of the samples and of every
 *                   image of the test split (DIR/t10k)
 * --real gives the floor of both: the first N test images (their own labels) against the
 * training split (DIR/train) instead of samples against the test split. Nothing is written. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "analysis/frechet.h"
#include "args.h"
#include "cli.h"
#include "data/idx.h"
#include "models/image_quality.h"
#include "models/model.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Features and top-1 predictions of n images under clf with a progress line, then mean [d] and
 * covariance [d, d] (malloc'd into *mean, *cov). */
static int feature_stats(const model *clf, const uint8_t *px, long n, int batch, const char *what, int *pred,
                         double **mean, double **cov, int *dim, moh_error *err) {
    eval_progress pg;
    eval_progress_start(&pg, "images");
    pg.cmd = what;
    const moh_progress report = {eval_progress_report, &pg};
    float *feat = NULL;
    int rc = iq_classify(clf, px, n, batch, &feat, dim, pred, &report, err);
    eval_progress_end(&pg, rc ? -1 : n);
    const int d = *dim;
    if (!rc) {
        *mean = malloc(sizeof(double) * (size_t)d);
        *cov = malloc(sizeof(double) * (size_t)d * d);
        if (!*mean || !*cov) rc = moh_fail(err, MOH_E_NOMEM, "feature statistics: out of memory");
    }
    if (!rc) rc = fd_moments(feat, n, d, *mean, *cov, err);
    free(feat);
    return rc;
}

int cmd_eval_image(int argc, char **argv) {
    const char *ckpt = NULL, *data = NULL, *clf_dir = NULL, *sampler = "ddpm", *sigma = "large", *precision = NULL, *device = NULL;
    int n = 5000, steps = 0, batch = 64, clf_batch = 256;
    double cfg = 4.0;
    uint64_t seed = 1;
    bool json = false, real = false, sparse = false, reference = false;
    const arg_spec specs[] = {
        {"--checkpoint", ARG_STR, &ckpt, "DIR", "DiT checkpoint dir (model.safetensors: the EMA weights)", true, ARG_ANY},
        {"--data", ARG_STR, &data, "DIR", "IDX dir: its t10k split is the reference of the samples (--real: train)", true, ARG_ANY},
        {"--classifier", ARG_STR, &clf_dir, "DIR", "image classifier checkpoint trained by moh (a ViT, e.g. moh train --config vit-mha): its penultimate features and top-1 class", false, ARG_ANY},
        {"--samples", ARG_INT, &n, "N", "images generated, balanced over the classes (default 5000; --real: the first N test images)", false, ARG_IN(1, 1000000)},
        {"--steps", ARG_INT, &steps, "S", "sampling steps (default 250 ddpm, 50 ddim, as moh sample)", false, ARG_IN(1, 100000)},
        {"--cfg", ARG_DOUBLE, &cfg, "W", "classifier-free guidance scale (default 4, as moh sample; 1 = none)", false, ARG_IN(0, 1000)},
        {"--sampler", ARG_CHOICE, &sampler, "ddpm|ddim", "DDPM ancestral (default) or DDIM with eta 0", false, ARG_ANY},
        {"--sigma", ARG_CHOICE, &sigma, "large|small", "DDPM variance (default large, as moh sample)", false, ARG_ANY},
        {"--seed", ARG_U64, &seed, "S", "noise seed (default 1); image i draws from (S, i) alone", false, ARG_ANY},
        {"--batch", ARG_INT, &batch, "B", "images per DiT forward pass (default 64; x2 with guidance)", false, ARG_IN(1, 4096)},
        {"--real", ARG_FLAG, &real, NULL, "the floor: the first N real test images against the training split, no sampling", false, ARG_ANY},
        {"--sparse-attn", ARG_FLAG, &sparse, NULL, "DiT attention on the head-sparse path", false, ARG_ANY},
        {"--reference-attention", ARG_FLAG, &reference, NULL, "every head computed then gated (the default)", false, ARG_ANY},
        CLI_PRECISION_SPEC(&precision),
        CLI_DEVICE_SPEC(&device),
        {"--json", ARG_FLAG, &json, NULL, "print one JSON object: class_accuracy, fid, samples, steps, cfg, sampler, seed, per_class_accuracy, feature_dim, reference, reference_images, images_per_s", false, ARG_ANY},
    };
    int rc = args_parse("eval", argc, argv, specs, (int)(sizeof specs / sizeof specs[0]),
                        "--checkpoint DIT --data DIR --classifier CLF [--samples N] [--steps S] [--cfg W]\n"
                        "                [--sampler ddpm|ddim] [--seed S] [--real] [--json] [--precision fp32|bf16]",
                        "Sample quality of a DiT under an image classifier trained by moh (without\n"
                        "--classifier, moh eval on a DiT reports the noise-prediction MSE instead).\n"
                        "Samples are rounded to bytes as moh sample --out-idx writes them, then fed to the\n"
                        "classifier like real IDX images. class_accuracy: share of samples classified as\n"
                        "the class they were drawn for. fid: squared Fréchet distance between the\n"
                        "classifier's penultimate features (ViT: the normed pooled token) of the samples and\n"
                        "of the whole test split: |mu1 - mu2|^2 + tr(S1 + S2 - 2 (S1^1/2 S2 S1^1/2)^1/2),\n"
                        "covariances with divisor N - 1 (an FID in a small feature space, not comparable\n"
                        "with Inception FIDs; biased upward for small N). --real: the floor, real test\n"
                        "images against the training split.\n");
    if (rc) return rc == 1 ? 0 : rc;
    if (!clf_dir) {
        fprintf(stderr, "moh eval: sample quality needs --classifier DIR, an image classifier trained by moh (moh "
                        "train --config vit-mha --data DIR --out DIR); without the sampling options moh eval on a DiT "
                        "reports the noise-prediction MSE\n");
        return 2;
    }
    if (sparse && reference) {
        fprintf(stderr, "moh eval: --sparse-attn and --reference-attention exclude each other\n");
        return 2;
    }
    const bool ddim = !strcmp(sampler, "ddim");
    if (steps == 0) steps = ddim ? 50 : 250;
    moh_error err = {0};
    const moh_precision prec = cli_precision_run("eval", precision); /* the DiT's sampling; the classifier: fp32 */
    model m = {0}, clf = {0};
    idx_split ref = {0}, test = {0};
    uint8_t *px = NULL;
    int *labels = NULL, *pred = NULL, status = 1, dim = 0, dim2 = 0;
    float *img = NULL;
    double *mu1 = NULL, *S1 = NULL, *mu2 = NULL, *S2 = NULL, fid = NAN, secs = 0;
    char what[PATH_MAX + 64], clabel[PATH_MAX + 32];
    if (model_load(&m, ckpt, &err)) goto fail;
    const struct moh_backend *be = NULL;
    if (cli_device("eval", device, m.fam->model_type, &be)) goto done;
    if (strcmp(m.fam->task, "image-generation") || !m.fam->generate) {
        moh_fail(&err, MOH_E_ARG, "--classifier applies to image-generation checkpoints (DiT); %s is a %s (task %s)",
                 ckpt, m.fam->short_name, m.fam->task);
        goto fail;
    }
    int C = 0, H = 0, W = 0;
    m.fam->image_shape(m.cfg, &C, &H, &W);
    const int K = cli_image_classes(&m);
    snprintf(what, sizeof what, "the %s %s (%dx%dx%d, %d classes)", m.fam->short_name, ckpt, H, W, C, K);
    snprintf(clabel, sizeof clabel, "--classifier %s", clf_dir);
    if (model_load(&clf, clf_dir, &err)) goto fail;
    if (iq_check_classifier(&clf, C, H, W, K, clabel, what, &err)) goto fail;
    if (C != 1) {
        moh_fail(&err, MOH_E_CONFIG, "%s: IDX data holds 1-channel images, the model has %d", ckpt, C);
        goto fail;
    }
    if (idx_split_load(&test, data, "t10k", K, &err)) goto fail;
    if (test.rows != H || test.cols != W) {
        moh_fail(&err, MOH_E_CONFIG, "--data %s: images are %dx%d, %s makes %dx%d", data, test.rows, test.cols, what, H, W);
        goto fail;
    }
    const size_t chw = (size_t)H * W;
    if (real) {
        if (idx_split_load(&ref, data, "train", K, &err)) goto fail;
        if (ref.rows != H || ref.cols != W) {
            moh_fail(&err, MOH_E_CONFIG, "--data %s: training images are %dx%d, expected %dx%d", data, ref.rows, ref.cols, H, W);
            goto fail;
        }
        if (n > test.n) n = test.n;
    }
    if (n < 2) {
        moh_fail(&err, MOH_E_ARG, "--samples %d: the covariance needs at least 2 images", n);
        goto fail;
    }
    labels = malloc(sizeof(int) * (size_t)n);
    const int nref = real ? ref.n : test.n;
    pred = malloc(sizeof(int) * (size_t)(n > nref ? n : nref));
    if (!labels || !pred) {
        moh_fail(&err, MOH_E_NOMEM, "%d samples: out of memory", n);
        goto fail;
    }
    const idx_split *rs = real ? &ref : &test; /* the reference set */
    if (real) {
        px = test.images; /* borrowed */
        for (int i = 0; i < n; i++) labels[i] = test.labels[i];
    } else {
        for (int i = 0; i < n; i++) labels[i] = (int)((long)i * K / n);
        img = malloc(sizeof(float) * chw * (size_t)n);
        px = malloc(chw * (size_t)n);
        if (!img || !px) {
            moh_fail(&err, MOH_E_NOMEM, "%d samples: out of memory", n);
            goto fail;
        }
        eval_progress pg;
        char detail[96];
        eval_progress_start(&pg, "steps");
        pg.cmd = "moh eval: sampling";
        pg.detail = cli_sampling_detail(detail, sizeof detail, steps, n, batch);
        const image_gen_request req = {.labels = labels, .n = n, .steps = steps, .cfg_scale = cfg,
                                       .sampler = ddim ? 1 : 0, .variance = !strcmp(sigma, "small"), .seed = seed,
                                       .batch = batch, .sparse = sparse, .precision = prec, .progress = eval_progress_report, .ctx = &pg};
        const double t0 = now_s();
        rc = m.fam->generate(&m, &req, img, &err);
        secs = now_s() - t0;
        eval_progress_end(&pg, rc ? -1 : (long)steps * ((n + batch - 1) / batch));
        if (rc) goto fail;
        for (size_t q = 0; q < chw * (size_t)n; q++) px[q] = cli_pixel_byte(img[q]);
        free(img);
        img = NULL;
    }
    if (feature_stats(&clf, px, n, clf_batch, real ? "moh eval: test images" : "moh eval: samples", pred, &mu1, &S1,
                      &dim, &err))
        goto fail;
    long hits = 0, per_n[256] = {0}, per_hit[256] = {0};
    for (int i = 0; i < n; i++) {
        hits += pred[i] == labels[i];
        if (labels[i] < 256) {
            per_n[labels[i]]++;
            per_hit[labels[i]] += pred[i] == labels[i];
        }
    }
    if (feature_stats(&clf, rs->images, rs->n, clf_batch, real ? "moh eval: training images" : "moh eval: test images",
                      pred, &mu2, &S2, &dim2, &err))
        goto fail;
    if (fd_distance(mu1, S1, mu2, S2, dim, &fid, &err)) goto fail;
    const double acc = (double)hits / n;
    const char *refname = real ? "train" : "t10k";
    if (json) {
        printf("{\"class_accuracy\": %.6f, \"fid\": %.6f, \"samples\": %d, ", acc, fid, n);
        if (real) printf("\"steps\": null, \"cfg\": null, \"real\": true, ");
        else
            printf("\"steps\": %d, \"cfg\": %g, \"sampler\": \"%s\", \"seed\": %llu, \"images_per_s\": %.3f, \"real\": false, ",
                   steps, cfg, ddim ? "ddim" : "ddpm", (unsigned long long)seed, n / secs);
        printf("\"feature_dim\": %d, \"reference\": \"%s\", \"reference_images\": %d, \"classifier\": \"%s\", "
               "\"per_class_accuracy\": [", dim, refname, rs->n, clf_dir);
        for (int k = 0; k < K && k < 256; k++)
            printf("%s%.6f", k ? ", " : "", per_n[k] ? (double)per_hit[k] / per_n[k] : 0.0);
        printf("]}\n");
    } else {
        if (real)
            printf("floor: the first %d real test images of %s (no sampling) against %d training images\n", n, data,
                   rs->n);
        else
            printf("%s: %d samples (%s %d steps, cfg %g, seed %llu) in %.1f s (%.2f img/s)\n", ckpt, n,
                   ddim ? "DDIM" : "DDPM", steps, cfg, (unsigned long long)seed, secs, n / secs);
        printf("class accuracy %.4f (%ld / %d) under %s\n", acc, hits, n, clf_dir);
        printf("per class:");
        for (int k = 0; k < K && k < 256; k++) printf(" %.3f", per_n[k] ? (double)per_hit[k] / per_n[k] : 0.0);
        printf("\nFID %.4f (squared Fréchet distance of the classifier's %d-d penultimate features; reference: %d "
               "images of %s/%s)\n", fid, dim, rs->n, data, refname);
    }
    status = 0;
    goto done;
fail:
    fprintf(stderr, "moh eval: %s\n", err.msg);
done:
    if (!real) free(px);
    free(img);
    free(labels);
    free(pred);
    free(mu1);
    free(S1);
    free(mu2);
    free(S2);
    idx_split_free(&test);
    idx_split_free(&ref);
    model_free(&clf);
    model_free(&m);
    return status;
}
