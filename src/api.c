/* The public model API of include/moh.h (moh_model_*): an opaque handle over the model interface
 * (models/model.h) with the checkpoint module (train/checkpoint.h) and AdamW (ops/adamw.h).
 * One data-parallel shard (results do not depend on the thread count; the ops inside use OpenMP),
 * the family's default attention path. Family-specific reads (logits, image shape) go through the
 * families' public headers. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "models/model.h"
#include "moh.h"
#include "ops/adamw.h"
#include "train/checkpoint.h"

_Static_assert(MOH_MODEL_MAX_DIMS == MODEL_MAX_DIMS, "moh.h and model.h tensor ranks differ");

struct moh_model {
    model m;
    model_tensor *ts;      /* the checkpoint registry [nt] */
    int nt;
    model_shards w;        /* one shard of activations, for wB examples of wT tokens */
    bool have_w;
    int wB, wT;
    moh_batch last;        /* shape of the last forward (pointers cleared); last.B == 0: none */
    void *g;               /* gradient (family params struct), data gdata [m.n] */
    float *gdata;
    float *m1, *m2;        /* AdamW moments [m.n] */
    bool *decay;           /* [m.n] */
    long steps;
    int *no_targets;       /* [cap] of -1: the targets of a text forward without targets */
    size_t no_targets_cap;
};

static bool is_text(const moh_model *h) { return h->m.fam->max_seq_len != NULL; }
static bool is_image(const moh_model *h) { return h->m.fam->image_shape != NULL; }

/* Takes ownership of a loaded or new model: the tensor registry, the handle. */
static int wrap(moh_model **out, model *m, moh_error *err) {
    moh_model *h = calloc(1, sizeof *h);
    if (!h) {
        model_free(m);
        return moh_fail(err, MOH_E_NOMEM, "moh_model: out of memory");
    }
    h->m = *m;
    if (!(h->ts = model_tensors(&h->m, &h->nt))) {
        moh_model_free(h);
        return moh_fail(err, MOH_E_NOMEM, "moh_model: out of memory");
    }
    *out = h;
    return MOH_OK;
}

int moh_model_load(moh_model **out, const char *checkpoint_dir, moh_error *err) {
    if (!out || !checkpoint_dir) return moh_fail(err, MOH_E_ARG, "moh_model_load: NULL argument (out, checkpoint_dir)");
    *out = NULL;
    model m;
    const int rc = model_open(&m, checkpoint_dir, err);
    return rc ? rc : wrap(out, &m, err);
}

int moh_model_new(moh_model **out, const char *config_json_path, uint64_t seed, moh_error *err) {
    if (!out || !config_json_path) return moh_fail(err, MOH_E_ARG, "moh_model_new: NULL argument (out, config_json_path)");
    *out = NULL;
    model m;
    const int rc = model_from_config_file(&m, config_json_path, err);
    if (rc) return rc;
    m.fam->init_random(m.cfg, m.params, seed);
    return wrap(out, &m, err);
}

void moh_model_free(moh_model *h) {
    if (!h) return;
    if (h->have_w) model_shards_free(&h->w, &h->m);
    if (h->g) model_params_free(h->m.fam, h->g);
    model_free(&h->m);
    free(h->ts);
    free(h->m1);
    free(h->m2);
    free(h->decay);
    free(h->no_targets);
    free(h);
}

/* ---- getters ------------------------------------------------------------------------------- */

const char *moh_model_type(const moh_model *h) { return h ? h->m.fam->model_type : NULL; }
size_t moh_model_num_params(const moh_model *h) { return h ? h->m.n : 0; }
int moh_model_num_layers(const moh_model *h) { return h ? model_num_layers(&h->m) : 0; }
int moh_model_num_heads(const moh_model *h) { return h ? model_attn(&h->m)->n_heads : 0; }
const moh_attn_config *moh_model_attn(const moh_model *h) { return h ? model_attn(&h->m) : NULL; }
float *moh_model_params(moh_model *h) { return h ? h->m.data : NULL; }
char *moh_model_config_json(const moh_model *h) { return h ? h->m.fam->config_to_json(h->m.cfg) : NULL; }
int moh_model_num_tensors(const moh_model *h) { return h ? h->nt : 0; }
long moh_model_steps(const moh_model *h) { return h ? h->steps : 0; }

int moh_model_num_outputs(const moh_model *h) {
    if (!h) return 0;
    return h->m.fam->num_outputs ? h->m.fam->num_outputs(h->m.cfg) : 0;
}

int moh_model_max_seq_len(const moh_model *h) { return h && is_text(h) ? h->m.fam->max_seq_len(h->m.cfg) : 0; }

void moh_model_image_shape(const moh_model *h, int *C, int *H, int *W) {
    if (!h) {
        if (C) *C = 0;
        if (H) *H = 0;
        if (W) *W = 0;
        return;
    }
    int c = 0, y = 0, x = 0;
    if (is_image(h)) h->m.fam->image_shape(h->m.cfg, &c, &y, &x);
    if (C) *C = c;
    if (H) *H = y;
    if (W) *W = x;
}

int moh_model_image_norm(const moh_model *h, int c, double *mean, double *std, moh_error *err) {
    if (!h) return moh_fail(err, MOH_E_ARG, "moh_model_image_norm: the model is NULL");
    if (!is_image(h)) return moh_fail(err, MOH_E_ARG, "moh_model_image_norm: a %s model takes no images", moh_model_type(h));
    int C = 0;
    moh_model_image_shape(h, &C, NULL, NULL);
    if (c < 0 || c >= C) return moh_fail(err, MOH_E_ARG, "moh_model_image_norm: channel %d, expected 0..%d", c, C - 1);
    double mu = 0.0, sd = 1.0;
    h->m.fam->image_norm(h->m.cfg, c, &mu, &sd);
    if (mean) *mean = mu;
    if (std) *std = sd;
    return MOH_OK;
}

int moh_model_tensor(const moh_model *h, int i, moh_tensor_info *out, moh_error *err) {
    if (!h || !out) return moh_fail(err, MOH_E_ARG, "moh_model_tensor: the model or out is NULL");
    if (i < 0 || i >= h->nt) return moh_fail(err, MOH_E_ARG, "moh_model_tensor: index %d, expected 0..%d", i, h->nt - 1);
    const model_tensor *t = &h->ts[i];
    memset(out, 0, sizeof *out);
    out->name = t->name;
    out->ndim = t->ndim;
    for (int d = 0; d < t->ndim; d++) out->shape[d] = t->shape[d];
    out->offset = t->offset;
    out->numel = t->numel;
    out->decay = t->decay;
    return MOH_OK;
}

int moh_model_find_tensor(const moh_model *h, const char *name) {
    if (!h) return -1;
    for (int i = 0; name && i < h->nt; i++)
        if (!strcmp(h->ts[i].name, name)) return i;
    return -1;
}

/* ---- forward -------------------------------------------------------------------------------- */

size_t moh_model_logits_count(const moh_model *h, const moh_input *in) {
    if (!h) return 0;
    if (!in || in->B < 1) return 0;
    const size_t per = is_text(h) ? (size_t)(in->T > 0 ? in->T : 0) : 1;
    return (size_t)in->B * per * (size_t)moh_model_num_outputs(h);
}

/* Index of the first value of x[0..n) outside [lo, hi), or -1. */
static long first_outside(const int *x, size_t n, int lo, int hi) {
    for (size_t i = 0; i < n; i++)
        if (x[i] < lo || x[i] >= hi) return (long)i;
    return -1;
}

/* Checks in against the model and fills the engine's batch b. need_loss: targets / labels required. */
static int make_batch(moh_model *h, const moh_input *in, bool need_loss, moh_batch *b, moh_error *err) {
    memset(b, 0, sizeof *b);
    if (!in) return moh_fail(err, MOH_E_ARG, "moh_input: NULL");
    if (!h->m.fam->logits || !h->m.fam->num_outputs || (!is_text(h) && !is_image(h)))
        return moh_fail(err, MOH_E_ARG, "moh_model: family '%s' has no public forward yet", moh_model_type(h));
    if (in->B < 1) return moh_fail(err, MOH_E_ARG, "moh_input: B is %d, expected >= 1", in->B);
    const int V = moh_model_num_outputs(h);
    b->B = in->B;
    if (is_text(h)) {
        const int Tmax = moh_model_max_seq_len(h);
        if (in->T < 1 || in->T > Tmax)
            return moh_fail(err, MOH_E_ARG, "moh_input: T is %d, expected 1..%d (max_position_embeddings)", in->T, Tmax);
        if (!in->tokens) return moh_fail(err, MOH_E_ARG, "moh_input: tokens is NULL, expected [B, T] ids (a %s model)", moh_model_type(h));
        if (need_loss && !in->targets) return moh_fail(err, MOH_E_ARG, "moh_input: targets is NULL, expected [B, T] ids for a training step");
        const size_t n = (size_t)in->B * (size_t)in->T;
        long i = first_outside(in->tokens, n, 0, V);
        if (i >= 0)
            return moh_fail(err, MOH_E_ARG, "moh_input: tokens[%ld] (example %ld, position %ld) is %d, expected 0..%d",
                            i, i / in->T, i % in->T, in->tokens[i], V - 1);
        if (in->targets && (i = first_outside(in->targets, n, -1, V)) >= 0)
            return moh_fail(err, MOH_E_ARG, "moh_input: targets[%ld] (example %ld, position %ld) is %d, expected -1..%d",
                            i, i / in->T, i % in->T, in->targets[i], V - 1);
        b->T = in->T;
        b->tokens = in->tokens;
        b->targets = in->targets;
        if (!b->targets) { /* the LM always reads targets: all -1 (no prediction counted) */
            if (n > h->no_targets_cap) {
                free(h->no_targets);
                h->no_targets_cap = 0;
                if (!(h->no_targets = malloc(n * sizeof(int)))) return moh_fail(err, MOH_E_NOMEM, "moh_model_forward: out of memory");
                h->no_targets_cap = n;
            }
            for (size_t j = 0; j < n; j++) h->no_targets[j] = -1;
            b->targets = h->no_targets;
        }
    } else {
        int C, H, W;
        moh_model_image_shape(h, &C, &H, &W);
        if (in->C != C || in->H != H || in->W != W)
            return moh_fail(err, MOH_E_ARG, "moh_input: images [B, %d, %d, %d], expected [B, %d, %d, %d] (in_chans, img_size)",
                            in->C, in->H, in->W, C, H, W);
        if (!in->images) return moh_fail(err, MOH_E_ARG, "moh_input: images is NULL, expected [B, C, H, W] (a %s model)", moh_model_type(h));
        if (need_loss && !in->labels) return moh_fail(err, MOH_E_ARG, "moh_input: labels is NULL, expected [B] classes for a training step");
        long i;
        if (in->labels && (i = first_outside(in->labels, (size_t)in->B, -1, V)) >= 0)
            return moh_fail(err, MOH_E_ARG, "moh_input: labels[%ld] is %d, expected -1..%d", i, in->labels[i], V - 1);
        b->images = in->images;
        b->C = C;
        b->H = H;
        b->W = W;
        b->labels = in->labels;
    }
    return MOH_OK;
}

/* Activations for b: one shard of at least b->B examples (text: of exactly b->T tokens). */
static int ensure_acts(moh_model *h, const moh_batch *b, moh_error *err) {
    const int T = is_text(h) ? b->T : 0;
    if (h->have_w && b->B <= h->wB && T == h->wT) return MOH_OK;
    if (h->have_w) model_shards_free(&h->w, &h->m);
    h->have_w = false;
    h->last.B = 0;
    const int rc = model_shards_init(&h->w, &h->m, b->B, T, 1, false, h->m.fam->default_sparse, err);
    if (rc) return rc;
    h->have_w = true;
    h->wB = b->B;
    h->wT = T;
    return MOH_OK;
}

/* The engine's logits of the last forward: [B T, V] (text) or [B, K] (images). */
static const float *acts_logits(const moh_model *h) {
    return h->m.fam->logits(h->w.acts[0]);
}

/* Plain mean cross-entropy (float64 log-softmax of the logits) over the counted targets of b. */
static double plain_ce(const moh_model *h, const moh_batch *b, long *count) {
    const float *logits = acts_logits(h);
    const int V = moh_model_num_outputs(h);
    const int *tgt = is_text(h) ? b->targets : b->labels;
    const long M = is_text(h) ? (long)b->B * b->T : b->B;
    double sum = 0.0;
    long n = 0;
    for (long r = 0; tgt && r < M; r++) {
        if (tgt[r] < 0) continue;
        const float *x = logits + (size_t)r * V;
        double mx = x[0], s = 0.0;
        for (int v = 1; v < V; v++) mx = x[v] > mx ? x[v] : mx;
        for (int v = 0; v < V; v++) s += exp((double)x[v] - mx);
        sum += mx + log(s) - (double)x[tgt[r]];
        n++;
    }
    *count = n;
    return n ? sum / (double)n : NAN;
}

/* Forward of b on the handle's shard; with g also backward into g. Fills losses. */
static void run(moh_model *h, const moh_batch *b, bool backward, moh_losses *out) {
    double ce = 0.0, lb = 0.0;
    const double loss = model_shards_step(&h->m, &h->w, b, true, backward ? h->g : NULL,
                                          backward ? h->gdata : NULL, &ce, &lb);
    h->last = (moh_batch){.B = b->B, .T = b->T, .C = b->C, .H = b->H, .W = b->W};
    long n = 0;
    out->ce = plain_ce(h, b, &n);
    out->n = n;
    out->lb = lb;
    out->loss = n ? loss : NAN;
    out->grad_norm = NAN;
}

int moh_model_forward(moh_model *h, const moh_input *in, float *logits, moh_losses *losses, moh_error *err) {
    if (!h) return moh_fail(err, MOH_E_ARG, "moh_model_forward: the model is NULL");
    moh_batch b;
    int rc = make_batch(h, in, false, &b, err);
    if (!rc) rc = ensure_acts(h, &b, err);
    if (rc) return rc;
    moh_losses l;
    run(h, &b, false, &l);
    if (logits) memcpy(logits, acts_logits(h), moh_model_logits_count(h, in) * sizeof(float));
    if (losses) *losses = l;
    return MOH_OK;
}

static int check_layer(const moh_model *h, int l, const char *fn, moh_error *err) {
    if (!h->have_w || h->last.B == 0) return moh_fail(err, MOH_E_ARG, "%s: no forward has run on this model yet", fn);
    const int L = moh_model_num_layers(h);
    if (l < 0 || l >= L) return moh_fail(err, MOH_E_ARG, "%s: layer %d, expected 0..%d", fn, l, L - 1);
    return MOH_OK;
}

int moh_model_router_gates(const moh_model *h, int l, const float **gates, long *tokens, moh_error *err) {
    if (!h || !gates || !tokens) return moh_fail(err, MOH_E_ARG, "moh_model_router_gates: the model, gates or tokens is NULL");
    const int rc = check_layer(h, l, "moh_model_router_gates", err);
    if (rc) return rc;
    if (gates) *gates = model_router(h->w.acts[0], l)->gates;
    if (tokens) *tokens = (long)h->last.B * h->m.fam->tokens_per_example(h->m.cfg, &h->last);
    return MOH_OK;
}

int moh_model_head_share(const moh_model *h, int l, double *share, moh_error *err) {
    if (!h || !share) return moh_fail(err, MOH_E_ARG, "moh_model_head_share: the model or share is NULL");
    const float *g = NULL;
    long T = 0;
    const int rc = moh_model_router_gates(h, l, &g, &T, err);
    if (rc) return rc;
    const int H = moh_model_num_heads(h);
    for (int i = 0; i < H; i++) {
        long on = 0;
        for (long t = 0; t < T; t++) on += g[(size_t)t * H + i] != 0.0f;
        share[i] = T ? (double)on / (double)T : 0.0;
    }
    return MOH_OK;
}

/* ---- training ------------------------------------------------------------------------------- */

void moh_optim_defaults(const moh_model *h, moh_optim *opt) {
    if (!opt) return;
    if (!h) { /* no family: AdamW's usual values */
        *opt = (moh_optim){.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.0, .grad_clip = 1.0};
        return;
    }
    train_hparams hp;
    h->m.fam->train_defaults(&hp);
    *opt = (moh_optim){.lr = hp.lr, .beta1 = hp.beta1, .beta2 = hp.beta2, .eps = 1e-8,
                       .weight_decay = hp.weight_decay, .grad_clip = hp.grad_clip};
}

static int check_optim(const moh_optim *o, moh_error *err) {
    if (!o) return moh_fail(err, MOH_E_ARG, "moh_optim: NULL");
    if (!(o->lr > 0 && isfinite(o->lr))) return moh_fail(err, MOH_E_ARG, "moh_optim: lr is %g, expected a finite value > 0", o->lr);
    if (!(o->beta1 >= 0 && o->beta1 < 1)) return moh_fail(err, MOH_E_ARG, "moh_optim: beta1 is %g, expected [0, 1)", o->beta1);
    if (!(o->beta2 >= 0 && o->beta2 < 1)) return moh_fail(err, MOH_E_ARG, "moh_optim: beta2 is %g, expected [0, 1)", o->beta2);
    if (!(o->eps > 0 && isfinite(o->eps))) return moh_fail(err, MOH_E_ARG, "moh_optim: eps is %g, expected a finite value > 0", o->eps);
    if (!(o->weight_decay >= 0 && isfinite(o->weight_decay)))
        return moh_fail(err, MOH_E_ARG, "moh_optim: weight_decay is %g, expected a finite value >= 0", o->weight_decay);
    if (!(o->grad_clip >= 0 && isfinite(o->grad_clip)))
        return moh_fail(err, MOH_E_ARG, "moh_optim: grad_clip is %g, expected a finite value >= 0 (0 = no clipping)", o->grad_clip);
    return MOH_OK;
}

/* Gradient, moments and decay mask, on the first training step. */
static int ensure_optimizer(moh_model *h, moh_error *err) {
    if (h->m1) return MOH_OK;
    const size_t n = h->m.n;
    size_t gn = 0;
    if (!h->g) {
        const int rc = model_params_new(h->m.fam, h->m.cfg, &h->g, &h->gdata, &gn, err);
        if (rc) return rc;
    }
    if (!h->decay && !(h->decay = calloc(n, sizeof(bool)))) return moh_fail(err, MOH_E_NOMEM, "moh_model_train_step: out of memory");
    for (int i = 0; i < h->nt; i++)
        for (size_t j = 0; j < h->ts[i].numel; j++) h->decay[h->ts[i].offset + j] = h->ts[i].decay;
    float *m1 = calloc(n, sizeof(float)), *m2 = calloc(n, sizeof(float));
    if (!m1 || !m2) {
        free(m1);
        free(m2);
        return moh_fail(err, MOH_E_NOMEM, "moh_model_train_step: out of memory for the AdamW moments (%zu floats each)", n);
    }
    h->m1 = m1;
    h->m2 = m2;
    return MOH_OK;
}

int moh_model_train_step(moh_model *h, const moh_input *in, const moh_optim *opt, moh_losses *losses,
                         moh_error *err) {
    if (!h) return moh_fail(err, MOH_E_ARG, "moh_model_train_step: the model is NULL");
    moh_batch b;
    int rc = check_optim(opt, err);
    if (!rc) rc = make_batch(h, in, true, &b, err);
    if (!rc) rc = ensure_acts(h, &b, err);
    if (!rc) rc = ensure_optimizer(h, err);
    if (rc) return rc;
    memset(h->gdata, 0, sizeof(float) * h->m.n);
    moh_losses l;
    run(h, &b, true, &l);
    if (l.n == 0) {
        if (losses) *losses = l;
        return moh_fail(err, MOH_E_ARG, "moh_model_train_step: every %s is -1, nothing to train on",
                        is_text(h) ? "target" : "label");
    }
    l.grad_norm = clip_grad_norm(h->gdata, h->m.n, opt->grad_clip);
    if (losses) *losses = l;
    /* non-finite guard (as train/trainer.c): such a step is never applied */
    if (!isfinite(l.loss) || !isfinite(l.grad_norm))
        return moh_fail(err, MOH_E_NONFINITE, "moh_model_train_step: loss %g, gradient norm %g: not finite, step "
                        "not applied (weights and moments unchanged); lower lr (now %g)", l.loss, l.grad_norm, opt->lr);
    const adamw_config ac = {opt->beta1, opt->beta2, opt->eps, opt->weight_decay};
    adamw_step(&ac, h->m.data, h->gdata, h->m1, h->m2, h->decay, h->m.n, h->steps + 1, opt->lr);
    h->steps++;
    return MOH_OK;
}

/* ---- save ----------------------------------------------------------------------------------- */

int moh_model_save(const moh_model *h, const char *dir, moh_error *err) {
    if (!h) return moh_fail(err, MOH_E_ARG, "moh_model_save: the model is NULL");
    if (!dir) return moh_fail(err, MOH_E_ARG, "moh_model_save: dir is NULL");
    char path[4200];
    struct stat sb;
    snprintf(path, sizeof path, "%s/optimizer.safetensors", dir);
    if (stat(path, &sb) == 0)
        return moh_fail(err, MOH_E_ARG, "%s holds optimizer.safetensors of a training run (its --resume would restore "
                        "those weights instead): save into another directory", dir);
    return checkpoint_save(dir, &h->m, NULL, NULL, NULL, err);
}
