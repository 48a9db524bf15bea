/* The ViT trainer: IDX images -> augmentation -> forward -> loss -> backward -> clip -> AdamW ->
 * checkpoint, with test-set evaluation every epoch, a progress line and metrics.jsonl. */
#include "train/vit_trainer.h"

#include <errno.h>
#include <math.h>
#include <omp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/fsutil.h"
#include "train/adamw.h"
#include "train/train_util.h"
#include "train/vit_checkpoint.h"

void vit_train_defaults(vit_train_options *o) {
    memset(o, 0, sizeof *o);
    o->epochs = 25;
    o->seed = 1;
    o->batch_size = 128;
    o->lr = 2e-3;
    o->min_lr_ratio = 0.01;
    o->weight_decay = 0.05;
    o->beta1 = 0.9;
    o->beta2 = 0.999;
    o->grad_clip = 1.0;
    o->warmup = -1;
    o->log_every = 50;
    o->crop_pad = 1;
    o->hflip = true;
}

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

void vit_eval_result_free(vit_eval_result *r) {
    free(r->confusion);
    free(r->head_share);
    memset(r, 0, sizeof *r);
}

int vit_default_shards(int batch) {
    int n = omp_get_max_threads();
    if (n > batch) n = batch;
    if (n > 256) n = 256;
    return n < 1 ? 1 : n;
}

void vit_shards_free(vit_shards *w) {
    for (int s = 0; w->acts && s < w->n; s++) vit_acts_free_f32(&w->acts[s]);
    for (int s = 0; w->grads && s < w->n; s++) vit_params_free_f32(&w->grads[s]);
    free(w->acts);
    free(w->grads);
    memset(w, 0, sizeof *w);
}

int vit_shards_init(vit_shards *w, const moh_vit_config *cfg, int batch, int n, bool with_grads,
                    bool sparse, moh_error *err) {
    memset(w, 0, sizeof *w);
    if (n < 1 || n > 256 || batch < n)
        return moh_fail(err, MOH_E_ARG, "shards %d for batch %d, expected 1..min(256, batch)", n, batch);
    w->Bmax = (batch + n - 1) / n;
    w->sparse = sparse;
    w->acts = calloc((size_t)n, sizeof *w->acts);
    w->grads = with_grads ? calloc((size_t)n, sizeof *w->grads) : NULL;
    if (!w->acts || (with_grads && !w->grads)) {
        vit_shards_free(w);
        return moh_fail(err, MOH_E_NOMEM, "shards: out of memory");
    }
    for (int s = 0; s < n; s++) {
        w->n = s + 1;
        int rc = vit_acts_init_attn_f32(&w->acts[s], cfg, w->Bmax, sparse, err);
        if (!rc && with_grads) rc = vit_params_init_f32(&w->grads[s], cfg, err);
        if (rc) {
            vit_shards_free(w);
            return rc;
        }
    }
    return MOH_OK;
}

const float *vit_shards_logits(const moh_vit_config *cfg, const vit_shards *w, int j) {
    int s = 0, off = 0;
    while (s < w->n - 1 && j >= off + w->count[s]) off += w->count[s++];
    return w->acts[s].logits + (size_t)(j - off) * cfg->num_classes;
}

double vit_shards_step(const moh_vit_config *cfg, const vit_params_f32 *p, vit_shards *w,
                       const float *images, const int *labels, int B, vit_params_f32 *g, double *ce,
                       double *lb) {
    const int n = w->n;
    const size_t chw = (size_t)cfg->in_chans * cfg->img_size * cfg->img_size;
    double loss_s[256], ce_s[256], lb_s[256];
    int first[257];
    for (int s = 0; s <= n; s++) first[s] = (int)((long)B * s / n);
    for (int s = 0; s < n; s++) w->count[s] = first[s + 1] - first[s];
#pragma omp parallel for schedule(static, 1) num_threads(n) if (n > 1)
    for (int s = 0; s < n; s++) {
        loss_s[s] = ce_s[s] = lb_s[s] = 0.0;
        if (w->count[s] == 0) continue;
        const int *lab = labels ? labels + first[s] : NULL;
        loss_s[s] = vit_forward_f32(cfg, p, &w->acts[s], images + (size_t)first[s] * chw, lab, w->count[s]);
        ce_s[s] = w->acts[s].ce_loss;
        lb_s[s] = w->acts[s].lb_loss;
        if (g && lab) {
            memset(w->grads[s].data, 0, sizeof(float) * w->grads[s].n);
            vit_backward_f32(cfg, p, &w->grads[s], &w->acts[s], lab);
        }
    }
    double loss = 0.0, c = 0.0, l = 0.0;
    for (int s = 0; s < n; s++) {
        const double wt = (double)w->count[s] / B;
        loss += wt * loss_s[s];
        c += wt * ce_s[s];
        l += wt * lb_s[s];
    }
    if (g && labels) {
        float wt[256];
        for (int s = 0; s < n; s++) wt[s] = (float)((double)w->count[s] / B);
        const size_t np = g->n;
#pragma omp parallel for schedule(static) if (np >= 65536)
        for (size_t i = 0; i < np; i++) {
            float acc = 0.0f;
            for (int s = 0; s < n; s++) acc += wt[s] * w->grads[s].data[i];
            g->data[i] = acc;
        }
    }
    if (ce) *ce = c;
    if (lb) *lb = l;
    return loss;
}

int vit_evaluate(const moh_vit_config *cfg, const vit_params_f32 *p, vit_shards *w,
                 const idx_split *s, long limit, const train_progress *progress, vit_eval_result *r,
                 moh_error *err) {
    memset(r, 0, sizeof *r);
    int rc = vit_check_split(cfg, s, "eval data", err);
    if (rc) return rc;
    const int K = cfg->num_classes, L = cfg->depth, h = cfg->num_heads, B = w->n * w->Bmax;
    const long n = limit > 0 && limit < s->n ? limit : s->n;
    const size_t hw = (size_t)cfg->img_size * cfg->img_size;
    r->confusion = calloc((size_t)K * K, sizeof(long));
    r->head_share = calloc((size_t)L * h, sizeof(double));
    float *img = malloc(sizeof(float) * hw * (size_t)B);
    int *idx = malloc(sizeof(int) * (size_t)B), *lab = malloc(sizeof(int) * (size_t)B);
    if (!r->confusion || !r->head_share || !img || !idx || !lab) {
        rc = moh_fail(err, MOH_E_NOMEM, "eval: out of memory");
        goto out;
    }
    moh_vit_config plain = *cfg; /* the reported loss is the plain cross-entropy */
    plain.label_smoothing = 0.0;
    double loss_sum = 0.0, lb_sum = 0.0, tokens = 0.0;
    long batches = 0;
    for (long i0 = 0; i0 < n; i0 += B) {
        const int cnt = (int)(n - i0 < B ? n - i0 : B);
        for (int j = 0; j < cnt; j++) {
            idx[j] = (int)(i0 + j);
            lab[j] = s->labels[i0 + j];
        }
        vit_make_batch(cfg, s, idx, cnt, NULL, 0, 0, img);
        double ce = 0.0, lb = 0.0;
        vit_shards_step(&plain, p, w, img, lab, cnt, NULL, &ce, &lb);
        loss_sum += ce * cnt;
        lb_sum += lb;
        batches++;
        for (int j = 0; j < cnt; j++) {
            const int pred = argmax(vit_shards_logits(cfg, w, j), K);
            r->confusion[(size_t)lab[j] * K + pred]++;
            r->correct += pred == lab[j];
        }
        for (int sh = 0; sh < w->n; sh++) {
            const long T = (long)w->count[sh] * cfg->num_tokens;
            for (int l = 0; l < L; l++) {
                const float *g = vit_router_cache_f32(&w->acts[sh], l)->gates;
                for (long t = 0; t < T; t++)
                    for (int i = 0; i < h; i++) r->head_share[(size_t)l * h + i] += g[t * h + i] != 0.0f;
            }
            tokens += (double)T;
        }
        if (progress && progress->fn) progress->fn(progress->ctx, i0 + cnt, n);
    }
    r->n = n;
    r->accuracy = n ? (double)r->correct / (double)n : 0.0;
    r->loss = n ? loss_sum / (double)n : 0.0;
    r->lb_loss = batches ? lb_sum / (double)batches : 0.0;
    for (size_t i = 0; i < (size_t)L * h; i++) r->head_share[i] /= tokens > 0 ? tokens : 1.0;
out:
    free(img);
    free(idx);
    free(lab);
    if (rc) vit_eval_result_free(r);
    return rc;
}

/* Min and max over layers and routed heads of the share of tokens selecting the head (all
 * shards of the last batch). */
static void routed_share(const moh_vit_config *cfg, const vit_shards *w, double *mn, double *mx) {
    const int E = attn_routed_heads(&cfg->attn);
    *mn = *mx = 1.0;
    if (E == 0 || cfg->attn.top_k == 0) return;
    *mx = 0.0;
    for (int l = 0; l < cfg->depth; l++)
        for (int i = 0; i < E; i++) {
            double f = 0.0, T = 0.0;
            for (int s = 0; s < w->n; s++) {
                const int Ts = w->count[s] * cfg->num_tokens;
                const float *mask = vit_router_cache_f32(&w->acts[s], l)->mask;
                for (int t = 0; t < Ts; t++) f += mask[(size_t)t * E + i];
                T += Ts;
            }
            f /= T > 0 ? T : 1.0;
            *mn = f < *mn ? f : *mn;
            *mx = f > *mx ? f : *mx;
        }
}

typedef struct vtrainer {
    const vit_train_options *o;
    moh_vit_config cfg;
    idx_split train, test;
    int n_train;
    vit_params_f32 p, g;
    vit_shards w;
    float *m, *v, *img;
    bool *decay;
    int *perm, *idx, *lab;
    long perm_epoch;
    vit_train_state st;
    FILE *metrics;
} vtrainer;

static int setup(vtrainer *tr, moh_error *err) {
    const vit_train_options *o = tr->o;
    char path[4200];
    if (o->resume) snprintf(path, sizeof path, "%s/config.json", o->out_dir);
    else snprintf(path, sizeof path, "%s", o->config_path);
    int rc = vit_config_load(path, &tr->cfg, err);
    if (rc) return rc;
    if (o->batch_size < 1) return moh_fail(err, MOH_E_ARG, "--batch-size is %d, expected >= 1", o->batch_size);
    if (!(o->lr > 0) || !(o->beta1 >= 0 && o->beta1 < 1) || !(o->beta2 >= 0 && o->beta2 < 1) ||
        !(o->weight_decay >= 0) || !(o->min_lr_ratio >= 0) || !(o->grad_clip >= 0))
        return moh_fail(err, MOH_E_ARG, "--lr %g, betas %g/%g, --weight-decay %g, --min-lr-ratio %g, "
                        "--grad-clip %g: expected lr > 0, betas in [0, 1), the others >= 0",
                        o->lr, o->beta1, o->beta2, o->weight_decay, o->min_lr_ratio, o->grad_clip);
    if (o->crop_pad < 0 || o->crop_pad > 64)
        return moh_fail(err, MOH_E_ARG, "--crop-pad is %d, expected 0..64", o->crop_pad);
    if ((rc = idx_split_load(&tr->train, o->data_dir, "train", tr->cfg.num_classes, err))) return rc;
    if ((rc = idx_split_load(&tr->test, o->data_dir, "t10k", tr->cfg.num_classes, err))) return rc;
    if ((rc = vit_check_split(&tr->cfg, &tr->train, o->data_dir, err))) return rc;
    if ((rc = vit_check_split(&tr->cfg, &tr->test, o->data_dir, err))) return rc;
    if (tr->cfg.n_norm == 0) { /* normalisation statistics of the whole training split */
        idx_mean_std(&tr->train, &tr->cfg.mean[0], &tr->cfg.std[0]);
        if (!(tr->cfg.std[0] > 0))
            return moh_fail(err, MOH_E_FORMAT, "%s: every training pixel has the same value; expected "
                            "images with some contrast (std > 0)", o->data_dir);
        tr->cfg.n_norm = 1;
    }
    tr->n_train = o->train_limit > 0 && o->train_limit < tr->train.n ? (int)o->train_limit : tr->train.n;
    vit_train_state *st = &tr->st;
    const int B = o->batch_size;
    if ((rc = vit_params_init_f32(&tr->p, &tr->cfg, err))) return rc;
    if ((rc = vit_params_init_f32(&tr->g, &tr->cfg, err))) return rc;
    tr->m = calloc(tr->p.n, sizeof(float));
    tr->v = calloc(tr->p.n, sizeof(float));
    tr->decay = calloc(tr->p.n, sizeof(bool));
    if (!tr->m || !tr->v || !tr->decay) return moh_fail(err, MOH_E_NOMEM, "optimizer state: out of memory");
    int nt = 0;
    vit_tensor *ts = vit_tensors(&tr->cfg, &nt);
    if (!ts) return moh_fail(err, MOH_E_NOMEM, "out of memory");
    for (int i = 0; i < nt; i++)
        for (size_t j = 0; j < ts[i].numel; j++) tr->decay[ts[i].offset + j] = ts[i].decay;
    free(ts);
    if (o->resume) {
        if ((rc = vit_checkpoint_load_optimizer(o->out_dir, &tr->cfg, tr->p.data, tr->m, tr->v, tr->p.n, st, err)))
            return rc;
        if (st->batch_size != B && !o->quiet)
            printf("note: resuming with the checkpoint's batch size %d (--batch-size %d ignored)\n", st->batch_size, B);
        if (st->steps_per_epoch != tr->n_train / st->batch_size)
            return moh_fail(err, MOH_E_ARG, "%s: the checkpoint has %ld steps per epoch, this data gives "
                            "%d (expected the same training split and --train-limit as the original run)",
                            o->out_dir, st->steps_per_epoch, tr->n_train / st->batch_size);
    } else {
        vit_params_init_random(&tr->cfg, &tr->p, o->seed);
        st->seed = o->seed;
        st->lr = o->lr;
        st->min_lr_ratio = o->min_lr_ratio;
        st->weight_decay = o->weight_decay;
        st->beta1 = o->beta1;
        st->beta2 = o->beta2;
        st->grad_clip = o->grad_clip;
        st->crop_pad = o->crop_pad;
        st->hflip = o->hflip;
        st->batch_size = B;
        if (o->shards > B) /* shards set the load-balance statistics: never change them silently */
            return moh_fail(err, MOH_E_ARG, "--shards is %d, more than --batch-size %d (each shard needs at least "
                            "one image)", o->shards, B);
        st->shards = o->shards > 0 ? o->shards : vit_default_shards(B);
        st->steps_per_epoch = tr->n_train / B;
        if (st->steps_per_epoch < 1)
            return moh_fail(err, MOH_E_ARG, "--batch-size %d is larger than the %d training images", B, tr->n_train);
        st->total_steps = o->steps > 0 ? o->steps : (long)llround(o->epochs * (double)st->steps_per_epoch);
        if (st->total_steps < 1)
            return moh_fail(err, MOH_E_ARG, "--epochs %g gives %ld steps, expected at least 1", o->epochs, st->total_steps);
        st->warmup = o->warmup >= 0 ? o->warmup
                                     : (st->steps_per_epoch < st->total_steps / 10 ? st->steps_per_epoch
                                                                                   : st->total_steps / 10);
    }
    const int Bt = st->batch_size;
    if ((rc = vit_shards_init(&tr->w, &tr->cfg, Bt, st->shards, true, o->sparse_attn, err))) return rc;
    const size_t hw = (size_t)tr->cfg.img_size * tr->cfg.img_size;
    tr->img = malloc(sizeof(float) * hw * (size_t)Bt);
    tr->perm = malloc(sizeof(int) * (size_t)tr->n_train);
    tr->idx = malloc(sizeof(int) * (size_t)Bt);
    tr->lab = malloc(sizeof(int) * (size_t)Bt);
    if (!tr->img || !tr->perm || !tr->idx || !tr->lab) return moh_fail(err, MOH_E_NOMEM, "batch buffers: out of memory");
    tr->perm_epoch = -1;
    return MOH_OK;
}

static void teardown(vtrainer *tr) {
    idx_split_free(&tr->train);
    idx_split_free(&tr->test);
    vit_params_free_f32(&tr->p);
    vit_params_free_f32(&tr->g);
    vit_shards_free(&tr->w);
    free(tr->m);
    free(tr->v);
    free(tr->decay);
    free(tr->img);
    free(tr->perm);
    free(tr->idx);
    free(tr->lab);
    if (tr->metrics) fclose(tr->metrics);
}

/* Fills tr->img / tr->lab with the batch of optimizer step `step` (0-based). */
static void make_train_batch(vtrainer *tr, long step) {
    const vit_train_state *st = &tr->st;
    const int B = st->batch_size;
    const long epoch = step / st->steps_per_epoch, pos = step % st->steps_per_epoch;
    if (epoch != tr->perm_epoch) {
        idx_epoch_order(tr->perm, tr->n_train, st->seed, epoch);
        tr->perm_epoch = epoch;
    }
    for (int j = 0; j < B; j++) {
        tr->idx[j] = tr->perm[pos * B + j];
        tr->lab[j] = tr->train.labels[tr->idx[j]];
    }
    const idx_augment aug = {st->crop_pad, st->hflip != 0};
    const uint64_t key = (uint64_t)epoch * (uint64_t)tr->n_train + (uint64_t)(pos * B);
    vit_make_batch(&tr->cfg, &tr->train, tr->idx, B, &aug, st->seed, key, tr->img);
}

static int dump_grads(vtrainer *tr, const float *init, moh_error *err) {
    int nt = 0;
    vit_tensor *ts = vit_tensors(&tr->cfg, &nt);
    const int B = tr->st.batch_size, H = tr->cfg.img_size;
    float *lab = malloc(sizeof(float) * (size_t)B);
    moh_st_entry *e = calloc((size_t)nt * 2 + 2, sizeof *e);
    char (*names)[112] = calloc((size_t)nt * 2, sizeof *names);
    int rc = MOH_OK;
    if (!ts || !lab || !e || !names) rc = moh_fail(err, MOH_E_NOMEM, "dump-grads: out of memory");
    if (!rc) {
        for (int j = 0; j < B; j++) lab[j] = (float)tr->lab[j];
        int n = 0;
        e[n++] = (moh_st_entry){"images", 4, {B, 1, H, H}, tr->img};
        e[n++] = (moh_st_entry){"labels", 1, {B}, lab};
        for (int i = 0; i < nt; i++) {
            snprintf(names[2 * i], sizeof names[0], "grad.%s", ts[i].name);
            snprintf(names[2 * i + 1], sizeof names[0], "init.%s", ts[i].name);
            moh_st_entry a = {names[2 * i], ts[i].ndim, {0}, tr->g.data + ts[i].offset};
            for (int d = 0; d < ts[i].ndim; d++) a.shape[d] = ts[i].shape[d];
            e[n++] = a;
            a.name = names[2 * i + 1];
            a.data = init + ts[i].offset;
            e[n++] = a;
        }
        rc = moh_st_write(tr->o->dump_grads, e, n, err);
    }
    free(ts);
    free(lab);
    free(e);
    free(names);
    return rc;
}

int vit_train(const vit_train_options *o, moh_error *err) {
    vtrainer tr;
    memset(&tr, 0, sizeof tr);
    tr.o = o;
    float *init = NULL;
    int rc = setup(&tr, err);
    if (rc) goto out;
    if (!o->resume && (rc = train_check_fresh_out(o->out_dir, err))) goto out;
    if ((rc = fs_mkdir_p(o->out_dir, err))) goto out;
    if ((rc = train_metrics_open(o->out_dir, o->resume, tr.st.step, &tr.metrics, err))) goto out;
    if (o->dump_grads) {
        if (!(init = malloc(sizeof(float) * tr.p.n))) {
            rc = moh_fail(err, MOH_E_NOMEM, "out of memory");
            goto out;
        }
        memcpy(init, tr.p.data, sizeof(float) * tr.p.n);
    }
    vit_train_state *st = &tr.st;
    const adamw_config ac = {st->beta1, st->beta2, 1e-8, st->weight_decay};
    const int B = st->batch_size, K = tr.cfg.num_classes;
    const long total = st->total_steps, spe = st->steps_per_epoch;
    const long eval_every = o->eval_every > 0 ? o->eval_every : spe;

    struct sigaction old_sa;
    train_sigint_install(&old_sa);

    const double t0 = train_now_s(), c0 = train_cpu_s(), elapsed0 = st->elapsed_s, max_s = o->max_minutes * 60.0;
    const long start_step = st->step;
    double last_log_t = t0, last_acc = NAN;
    long last_log_step = start_step;
    int status = 0;
    if (!o->quiet) {
        const moh_vit_config *c = &tr.cfg;
        printf("moh train (vit): %s, %zu parameters (%.2fM), D=%d L=%d heads=%d, router %s, %d/%d heads "
               "active per token, %d tokens, pool %s, %s attention\n", o->resume ? "resuming" : "starting", tr.p.n,
               tr.p.n / 1e6, c->embed_dim, c->depth, c->num_heads,
               c->router == MOH_ROUTER_NONE ? "none (dense MHA)" : "learned",
               c->router == MOH_ROUTER_NONE ? c->num_heads : c->shared_heads + c->top_k, c->num_heads,
               c->num_tokens, c->global_pool == VIT_POOL_TOKEN ? "token" : "avg",
               o->sparse_attn ? "head-sparse" : "reference");
        printf("data %s: %d train images (of %d) / %d test, mean %.4f std %.4f, augment crop-pad %d%s; "
               "B=%d in %d shards, %ld steps (%.2f epochs of %ld), warmup %ld, lr %g\n", o->data_dir, tr.n_train,
               tr.train.n, tr.test.n, c->mean[0], c->std[0], st->crop_pad, st->hflip ? " + hflip" : "",
               B, st->shards, total, (double)total / spe, spe, st->warmup, st->lr);
        if (o->resume)
            printf("resuming at step %ld with the run's saved schedule and hyper-parameters (lr %g, "
                   "min-lr-ratio %g, weight decay %g, betas %g/%g, clip %g, seed %llu)\n", st->step,
                   st->lr, st->min_lr_ratio, st->weight_decay, st->beta1, st->beta2, st->grad_clip,
                   (unsigned long long)st->seed);
        fflush(stdout);
    }
    while (st->step < total) {
        const long step = st->step;
        const double lr = lr_schedule(step, st->warmup, total, st->lr, st->lr * st->min_lr_ratio);
        make_train_batch(&tr, step);
        double ce = 0.0, lb = 0.0;
        const double loss = vit_shards_step(&tr.cfg, &tr.p, &tr.w, tr.img, tr.lab, B, &tr.g, &ce, &lb);
        int hits = 0;
        for (int j = 0; j < B; j++) hits += argmax(vit_shards_logits(&tr.cfg, &tr.w, j), K) == tr.lab[j];
        if (!isfinite(loss)) {
            rc = moh_fail(err, MOH_E_ARG, "step %ld: loss is %g; lower --lr (now %g)", step + 1, loss, st->lr);
            goto stop;
        }
        if (init) {
            rc = dump_grads(&tr, init, err);
            free(init);
            init = NULL;
            if (rc) goto stop;
        }
        const double gnorm = clip_grad_norm(tr.g.data, tr.g.n, st->grad_clip);
        adamw_step(&ac, tr.p.data, tr.g.data, tr.m, tr.v, tr.decay, tr.p.n, step + 1, lr);
        st->step++;
        st->images_seen += B;
        double smin, smax;
        routed_share(&tr.cfg, &tr.w, &smin, &smax);
        double t = train_now_s(), run_s = t - t0;
        const bool pause = o->stop_at_step > 0 && st->step >= o->stop_at_step;
        /* read once: a Ctrl-C after this point is handled at the next step, never without a save */
        const bool intr = train_interrupted();
        const bool last = st->step >= total || (max_s > 0 && run_s >= max_s) || intr || pause;
        const bool do_eval = last || st->step % eval_every == 0;
        vit_eval_result ev;
        memset(&ev, 0, sizeof ev);
        if (do_eval) {
            if ((rc = vit_evaluate(&tr.cfg, &tr.p, &tr.w, &tr.test, last ? 0 : o->eval_limit, NULL, &ev, err))) goto stop;
            last_acc = ev.accuracy;
            t = train_now_s();
            run_s = t - t0;
        }
        st->elapsed_s = elapsed0 + run_s;
        fprintf(tr.metrics,
                "{\"step\": %ld, \"epoch\": %.4f, \"loss\": %.6f, \"ce\": %.6f, \"lb_loss\": %.6f, "
                "\"lr\": %.6g, \"grad_norm\": %.4f, \"batch_acc\": %.4f, \"images\": %.0f, "
                "\"elapsed_s\": %.2f, \"cpu_s\": %.2f, \"routed_share_min\": %.4f, \"routed_share_max\": %.4f",
                st->step, (double)st->step / spe, loss, ce, lb, lr, gnorm, (double)hits / B,
                st->images_seen, st->elapsed_s, train_cpu_s() - c0, smin, smax);
        if (do_eval)
            fprintf(tr.metrics, ", \"test_loss\": %.6f, \"test_acc\": %.6f, \"test_n\": %ld", ev.loss,
                    ev.accuracy, ev.n);
        fprintf(tr.metrics, "}\n");
        fflush(tr.metrics);
        if (!o->quiet && (st->step % o->log_every == 0 || do_eval || st->step == start_step + 1)) {
            const double rate = (double)(st->step - last_log_step) * B / (t - last_log_t);
            double eta = (double)(total - st->step) * (run_s / (double)(st->step - start_step));
            if (max_s > 0 && eta > max_s - run_s) eta = max_s - run_s;
            char el[32], et[32], share[48] = "", val[48] = "";
            train_fmt_time(el, sizeof el, st->elapsed_s);
            train_fmt_time(et, sizeof et, eta);
            if (tr.cfg.router != MOH_ROUTER_NONE) snprintf(share, sizeof share, " | head share %.2f-%.2f", smin, smax);
            if (do_eval) snprintf(val, sizeof val, " | test acc %.4f (%ld)", ev.accuracy, ev.n);
            printf("step %6ld/%ld | ep %5.2f | loss %.4f | lb %.3f | lr %.2e | %5.0f img/s | %s, ETA %s%s%s\n",
                   st->step, total, (double)st->step / spe, ce, lb, lr, rate, el, et, share, val);
            fflush(stdout);
            last_log_t = train_now_s();
            last_log_step = st->step;
        }
        vit_eval_result_free(&ev);
        if ((last || do_eval) &&
            (rc = vit_checkpoint_save(o->out_dir, &tr.cfg, &tr.p, tr.m, tr.v, st, err)))
            goto stop;
        if (intr) {
            if (!o->quiet) printf("interrupted: checkpoint saved to %s at step %ld\n", o->out_dir, st->step);
            status = 130;
            break;
        }
        if (pause && st->step < total) {
            if (!o->quiet) printf("stopped at step %ld (--stop-at-step; checkpoint saved, --resume continues)\n", st->step);
            break;
        }
        if (max_s > 0 && run_s >= max_s) {
            if (st->step < total && !o->quiet)
                printf("time budget of %g min reached at step %ld of %ld (checkpoint saved; --resume "
                       "continues)\n", o->max_minutes, st->step, total);
            break;
        }
    }
    if (!o->quiet && status == 0) {
        char el[32];
        train_fmt_time(el, sizeof el, train_now_s() - t0);
        printf("done: %ld steps (%.2f epochs), %.0f images, %s, final test accuracy %.4f, checkpoint in %s "
               "(this session: %s wall, %.0f CPU s)\n", st->step, (double)st->step / spe, st->images_seen,
               st->step >= total ? "schedule complete" : "stopped early", last_acc, o->out_dir, el,
               train_cpu_s() - c0);
    }
    rc = status;
stop:
    train_sigint_restore(&old_sa);
out:
    free(init);
    teardown(&tr);
    return rc;
}
