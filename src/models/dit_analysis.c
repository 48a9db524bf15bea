/* `moh analyze` data of the DiT (dit_analysis.h): t10k images noised per class or timestep range. */
#include "models/dit_analysis.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/idx.h"
#include "models/dit.h"
#include "models/dit_diffusion.h"

#define DIT_AN_SEED 0xA7A1F5E5ULL /* the fixed draw of every analysis (a run and its twin alike) */
#define DIT_AN_MAX_CAT 256

typedef struct dit_cats {
    int C;                       /* categories */
    int ranges;                  /* timestep ranges (0: categories are the classes) */
    char *names[DIT_AN_MAX_CAT];
    idx_split split;
    dit_schedule sch;
    int *idx, *cat;              /* [n_idx] selected images and their category */
    int n_idx, batch, T;         /* T: diffusion steps */
    float *img, *eps;            /* [batch, H W] */
    int *lab, *t;                /* [batch] */
    char note[512];
} dit_cats;

static void dit_cats_free(void *self) {
    dit_cats *d = self;
    if (!d) return;
    for (int c = 0; c < d->C; c++) free(d->names[c]);
    idx_split_free(&d->split);
    dit_schedule_free(&d->sch);
    free(d->idx);
    free(d->cat);
    free(d->img);
    free(d->eps);
    free(d->lab);
    free(d->t);
    free(d);
}

static int set_name(dit_cats *d, int c, const char *name, moh_error *err) {
    d->names[c] = strdup(name);
    d->C = c + 1;
    return d->names[c] ? MOH_OK : moh_fail(err, MOH_E_NOMEM, "out of memory");
}

/* "class" (or NULL) -> 0; "timestep" -> 4; "timestep:R" -> R (1..64); else -1 */
static int parse_ranges(const char *s) {
    if (!s || !strcmp(s, "class")) return 0;
    if (!strcmp(s, "timestep")) return 4;
    if (strncmp(s, "timestep:", 9)) return -1;
    char *end = NULL;
    const long r = strtol(s + 9, &end, 10);
    return s[9] && !*end && r >= 1 && r <= 64 ? (int)r : -1;
}

/* Noises the next batch of selected images: x_t, eps, t (uniform over all steps, or over the
 * image's range), the true label. */
static long dit_cats_next(void *self, const model *m, long *cursor, moh_batch *out, int *cat) {
    dit_cats *d = self;
    const moh_dit_config *cfg = m->cfg;
    const long i0 = *cursor;
    if (i0 >= d->n_idx) return 0;
    const int B = d->n_idx - i0 < d->batch ? (int)(d->n_idx - i0) : d->batch, hw = cfg->input_size * cfg->input_size;
    for (int j = 0; j < B; j++) {
        const long i = i0 + j;
        float *x = d->img + (size_t)j * hw, *e = d->eps + (size_t)j * hw;
        idx_image_to_float(&d->split, d->idx[i], 0.5, 0.5, NULL, 0, 0, x); /* [-1, 1] */
        const int lo = d->ranges ? (int)((long)d->T * d->cat[i] / d->ranges) : 0;
        const int hi = d->ranges ? (int)((long)d->T * (d->cat[i] + 1) / d->ranges) : d->T;
        bool dropped = false;
        dit_draw(DIT_AN_SEED, (uint64_t)i, hi - lo, 0.0, hw, &d->t[j], e, &dropped);
        d->t[j] += lo;
        dit_q_sample(&d->sch, d->t[j], e, x, hw);
        d->lab[j] = d->split.labels[d->idx[i]];
        cat[j] = d->cat[i];
    }
    *cursor = i0 + B;
    *out = (moh_batch){.B = B, .images = d->img, .C = 1, .H = cfg->input_size, .W = cfg->input_size,
                       .labels = d->lab, .timesteps = d->t, .noise = d->eps};
    return B;
}

static int check_twin(const moh_dit_config *a, const moh_dit_config *b, const char *label, moh_error *err) {
    if (a->input_size != b->input_size || a->num_patches != b->num_patches || a->num_classes != b->num_classes ||
        a->diffusion_steps != b->diffusion_steps || a->in_channels != b->in_channels)
        return moh_fail(err, MOH_E_CONFIG, "--compare %s: image size, patches, classes or diffusion steps differ", label);
    return MOH_OK;
}

int dit_open_analysis(const analysis_request *req, analysis_data *out, moh_error *err) {
    const moh_dit_config *cfg = req->m->cfg;
    const int ranges = parse_ranges(req->categories);
    if (ranges < 0)
        return moh_fail(err, MOH_E_ARG, "--categories %s: a DiT takes class (the default) or timestep[:R] (R ranges of "
                        "t, 1..64, default 4)", req->categories);
    if (req->seq_len > 0) return moh_fail(err, MOH_E_ARG, "--seq-len %d does not apply to a DiT", req->seq_len);
    if (req->twin && check_twin(cfg, req->twin->cfg, req->twin_label, err)) return err->code;
    if (cfg->in_channels != 1)
        return moh_fail(err, MOH_E_CONFIG, "%s: IDX images have 1 channel, the config has %d", req->model_label,
                        cfg->in_channels);
    dit_cats *d = calloc(1, sizeof *d);
    if (!d) return moh_fail(err, MOH_E_NOMEM, "out of memory");
    d->ranges = ranges;
    d->T = cfg->diffusion_steps;
    d->batch = req->batch > 0 ? req->batch : 64;
    const int K = cfg->num_classes, ncat = ranges ? ranges : K;
    int rc = ncat > DIT_AN_MAX_CAT ? moh_fail(err, MOH_E_CONFIG, "%d classes: at most %d supported", K, DIT_AN_MAX_CAT)
                                   : idx_split_load(&d->split, req->data, "t10k", K, err);
    if (!rc && (d->split.rows != cfg->input_size || d->split.cols != cfg->input_size))
        rc = moh_fail(err, MOH_E_CONFIG, "%s: images are %dx%d, config input_size is %d", req->data, d->split.rows,
                      d->split.cols, cfg->input_size);
    if (!rc) rc = dit_schedule_init(&d->sch, cfg, err);
    const long per = (req->max_tokens + cfg->num_patches - 1) / cfg->num_patches;
    const size_t hw = (size_t)cfg->input_size * cfg->input_size;
    if (!rc) {
        d->idx = malloc(sizeof(int) * (size_t)d->split.n);
        d->cat = malloc(sizeof(int) * (size_t)d->split.n);
        d->img = malloc(sizeof(float) * hw * (size_t)d->batch);
        d->eps = malloc(sizeof(float) * hw * (size_t)d->batch);
        d->lab = malloc(sizeof(int) * (size_t)d->batch);
        d->t = malloc(sizeof(int) * (size_t)d->batch);
        if (!d->idx || !d->cat || !d->img || !d->eps || !d->lab || !d->t) rc = moh_fail(err, MOH_E_NOMEM, "out of memory");
    }
    const char *const *fashion = idx_fashion_names(req->data, K);
    for (int c = 0; !rc && c < ncat; c++) {
        char buf[64];
        if (ranges) snprintf(buf, sizeof buf, "t %ld-%ld", (long)d->T * c / ranges, (long)d->T * (c + 1) / ranges - 1);
        else snprintf(buf, sizeof buf, "%d", c);
        rc = set_name(d, c, ranges || !fashion ? buf : fashion[c], err);
        long taken = 0; /* per category: the next `per` images in file order (of its class) */
        for (int i = 0; !rc && i < d->split.n && taken < per; i++) {
            if (ranges ? i < (long)c * per : d->split.labels[i] != c) continue;
            d->idx[d->n_idx] = i;
            d->cat[d->n_idx++] = c;
            taken++;
        }
    }
    if (rc) {
        dit_cats_free(d);
        return rc;
    }
    if (ranges)
        snprintf(d->note, sizeof d->note, "%s/t10k split: %d timestep ranges of %ld images each (file order), each "
                 "image noised at a t uniform in its range with its true label; all %d patch tokens counted",
                 req->data, ranges, per, cfg->num_patches);
    else
        snprintf(d->note, sizeof d->note, "%s/t10k split: per class the first %ld images in file order, each noised at "
                 "a t uniform in 0..%d with its true label; all %d patch tokens counted", req->data, per, d->T - 1,
                 cfg->num_patches);
    *out = (analysis_data){.self = d, .type = "dit", .C = d->C, .names = d->names, .note = d->note, .unit = "images",
                           .items = d->n_idx, .batch = d->batch, .T = 0, .next = dit_cats_next, .free = dit_cats_free};
    return MOH_OK;
}
