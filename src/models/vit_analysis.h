/* `moh analyze` data of the ViT (vit_analysis.c): labelled images. */
#ifndef MOH_VIT_ANALYSIS_H
#define MOH_VIT_ANALYSIS_H
#include "models/model.h"

/* model_family.open_analysis of the ViT. req->data: an IDX dir; categories: the classes of its
 * t10k split (Fashion-MNIST names when the path says "fashion", else "0", "1", ...); per class the
 * first ceil(req->max_tokens / num_tokens) images in file order; batches of req->batch (default 64)
 * images in that order, normalised with the running model's mean/std (a config without them gets
 * the training split's, with a note on stderr). Errors: MOH_E_ARG (--categories given), MOH_E_CONFIG
 * (twin or images not matching the config), MOH_E_IO / MOH_E_FORMAT (IDX files), MOH_E_NOMEM. */
int vit_open_analysis(const analysis_request *req, analysis_data *out, moh_error *err);
#endif
