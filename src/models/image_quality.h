/* Sample quality of an image generator under an image classifier of moh (`moh eval
 * --classifier`): class accuracy of images under the classifier, and the classifier's penultimate
 * features (model_family.features) for the Fréchet distance (analysis/frechet.h). Images enter as
 * bytes, as IDX files and PNG grids hold them, so generated and real images take the same path:
 * byte / 255, then the classifier's input normalisation (image_norm). */
#ifndef MOH_IMAGE_QUALITY_H
#define MOH_IMAGE_QUALITY_H
#include <stdint.h>

#include "models/model.h"

/* Checks that clf is an image classifier of images [C, H, W] with K classes whose features moh
 * can read (a family with features and num_outputs). label names clf in messages ("--classifier
 * DIR"), what names the images ("the DiT DIR (28x28x1, 10 classes)"). MOH_E_ARG (not a classifier
 * with features), MOH_E_CONFIG (image shape or classes differ), each one line naming both. */
int iq_check_classifier(const model *clf, int C, int H, int W, int K, const char *label, const char *what,
                        moh_error *err);

/* Runs clf over n images px [n, C, H, W] (bytes 0..255, checked by iq_check_classifier) in
 * batches of up to `batch` images (forward only, the family's default attention path, shards over
 * the OpenMP threads): *feat [n, *dim] (malloc'd, the caller frees; *dim = the family's feature
 * size) and pred [n] the top-1 class. progress (may be NULL) gets images done / n. MOH_E_ARG
 * (n < 1, batch < 1), MOH_E_NOMEM; on error *feat is NULL. */
int iq_classify(const model *clf, const uint8_t *px, long n, int batch, float **feat, int *dim, int *pred,
                const moh_progress *progress, moh_error *err);
#endif
