/* `moh analyze` data of the DiT (dit_analysis.c): noised test images per class or per timestep
 * range. */
#ifndef MOH_DIT_ANALYSIS_H
#define MOH_DIT_ANALYSIS_H
#include "models/model.h"

/* model_family.open_analysis of the DiT. req->data: an IDX dir (its t10k split). req->categories:
 * NULL or "class" = the classes (Fashion-MNIST names when the path says "fashion"), each image
 * noised at a timestep uniform in 0..diffusion_steps-1; "timestep" or "timestep:R" = R equal
 * ranges of t (default 4, at most 64: [0, 250), [250, 500), ... for 1000 steps), images in file
 * order, each noised at a timestep uniform in its range. Per category ceil(req->max_tokens /
 * num_patches) images; timestep, noise and nothing else drawn from (a fixed seed, the image's
 * position), so a run and its twin see the same inputs; the label is the image's true class
 * (conditional, no dropout). Batches of req->batch images (default 64). Errors: MOH_E_ARG
 * (--categories neither form, --seq-len given), MOH_E_CONFIG (twin or images not matching the
 * config), MOH_E_IO / MOH_E_FORMAT (IDX files), MOH_E_NOMEM. */
int dit_open_analysis(const analysis_request *req, analysis_data *out, moh_error *err);
#endif
