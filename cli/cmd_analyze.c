/* moh analyze: head statistics of a checkpoint of any family with an open_analysis hook (LM, ViT, DiT)
 * over labelled data, spec §6: head load per category, routing-score distributions and their CV,
 * attention/output similarity between heads (and of a dense twin), effective rank of head outputs.
 * Statistics: src/analysis. The family opens the labelled data (model.h analysis_data; LM:
 * lm_analysis.c, ViT: vit_analysis.c, DiT: dit_analysis.c); the models run on the reference attention path
 * (acts_new(sparse = false), not the head-sparse one): its caches hold every head's attention rows
 * and outputs at every token, which the all-token similarities need. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "analysis/analysis.h"
#include "args.h"
#include "cli.h"
#include "core/fsutil.h"
#include "models/model.h"

static const char *router_name(moh_router r) {
    return r == MOH_ROUTER_LEARNED ? "learned" : r == MOH_ROUTER_QUERY_NORM ? "query_norm" : "none";
}

static void analysis_data_free(analysis_data *d) {
    if (d->free && d->self) d->free(d->self);
    memset(d, 0, sizeof *d);
}

/* ---- running a model over the data ---------------------------------------------------------- */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Progress of one model's pass, on stderr only: rewritten in place (\r) at most 4 times a second
 * when stderr is a terminal, else one line at each quarter of the work. */
typedef struct progress {
    const char *name, *unit;
    double total, done, t0, last;
    bool tty, shown;
    int quarters; /* quarters reported (not a terminal) */
} progress;

static void progress_init(progress *p, const char *name, const char *unit, double total) {
    memset(p, 0, sizeof *p);
    p->name = name;
    p->unit = unit;
    p->total = total;
    p->t0 = p->last = now_s();
    p->tty = isatty(fileno(stderr));
}

static void progress_add(progress *p, double n) {
    p->done += n;
    if (!(p->total > 0)) return;
    const double t = now_s();
    char buf[256];
    if (p->tty) {
        if (t - p->last < 0.25 && p->done < p->total) return;
        p->last = t;
        fprintf(stderr, "\rmoh analyze: %s: %s\033[K", p->name,
                an_progress_text(buf, sizeof buf, p->done, p->total, p->unit, t - p->t0));
        p->shown = true;
    } else {
        const int q = (int)(4 * p->done / p->total);
        if (q <= p->quarters) return;
        p->quarters = q;
        fprintf(stderr, "moh analyze: %s: %s\n", p->name,
                an_progress_text(buf, sizeof buf, p->done, p->total, p->unit, t - p->t0));
    }
}

/* Ends an in-place line, so later messages start on their own line. */
static void progress_end(progress *p) {
    if (p->tty && p->shown) fputc('\n', stderr);
    p->shown = false;
}

/* Routed heads of the analysis: the most of any analysed layer (layers may differ, DiT); the
 * others are shared heads in every layer. */
static int analysed_routed(const model *m, const int *layers, int nl) {
    int E = 0;
    for (int s = 0; s < nl; s++) {
        const int e = attn_routed_heads(model_attn_layer(m, layers[s]));
        if (e > E) E = e;
    }
    return E;
}

/* Adds the layers' caches of the last forward of b (B examples of N tokens) to an. A layer with
 * fewer routed heads (E_l) than the analysis (E) has its router probabilities moved to the last
 * E_l of the E slots (its routed heads are the last E_l heads); the slots of heads shared in that
 * layer get probability 0 (their load is 1 from the gates). pbuf: scratch [B N, E]. */
static int add_layers(analysis *an, const model *m, const void *acts, const int *layers, int nl, int B, int N,
                      const int *cat, float *pbuf, moh_error *err) {
    const int E = an->s.routed;
    int rc = MOH_OK;
    for (int s = 0; !rc && s < nl; s++) {
        const moh_attn_config *a = model_attn_layer(m, layers[s]);
        const int El = attn_routed_heads(a);
        const attn_cache_f32 *c = model_router(acts, layers[s]); /* the whole cache: reference path */
        const float *p = El > 0 ? c->p : NULL;
        if (E > 0 && El != E) {
            const size_t T = (size_t)B * N;
            memset(pbuf, 0, sizeof(float) * T * (size_t)E);
            for (size_t t = 0; El > 0 && t < T; t++)
                memcpy(pbuf + t * E + (E - El), c->p + t * El, sizeof(float) * (size_t)El);
            p = pbuf;
        }
        an_batch b = {B, N, cat, c->gates, E > 0 ? p : NULL, c->o, c->att, a->causal};
        rc = an_add(an, s, &b, err);
    }
    return rc;
}

/* One pass of model m (checkpoint dir) over the data d, accumulated into an (initialised here). */
static int run_model(const model *m, const char *dir, analysis_data *d, const int *layers, int nl, analysis *an,
                     moh_error *err) {
    const model_family *fam = m->fam;
    const moh_attn_config *a = model_attn(m);
    const int E = analysed_routed(m, layers, nl), h = a->n_heads;
    an_shape s = {nl, h, h - E, E, a->head_dim, d->C, 2.0 * h};
    int rc = an_init(an, &s, err);
    if (rc) return rc;
    int *cat = malloc(sizeof(int) * (size_t)d->batch);
    void *acts = NULL;
    rc = model_acts_new(fam, m->cfg, d->batch, d->T, false, &acts, err);
    float *pbuf = NULL;
    if (!rc) { /* tokens of the largest batch: d->batch examples */
        moh_batch probe = {.B = 1, .T = d->T};
        const size_t T = (size_t)d->batch * fam->tokens_per_example(m->cfg, &probe);
        pbuf = malloc(sizeof(float) * T * (size_t)(E > 0 ? E : 1));
    }
    if (!rc && (!cat || !pbuf)) rc = moh_fail(err, MOH_E_NOMEM, "out of memory");
    progress pg;
    progress_init(&pg, dir, d->unit, d->items);
    long cursor = 0, items;
    moh_batch b;
    while (!rc && (items = d->next(d->self, m, &cursor, &b, cat)) > 0) {
        double ce, lb;
        fam->forward(m->cfg, m->params, acts, &b, 0, b.B, false, &ce, &lb);
        rc = add_layers(an, m, acts, layers, nl, b.B, fam->tokens_per_example(m->cfg, &b), cat, pbuf, err);
        progress_add(&pg, (double)items);
    }
    progress_end(&pg);
    if (acts) model_acts_free(fam, acts);
    free(cat);
    free(pbuf);
    return rc;
}

int cmd_analyze(int argc, char **argv) {
    const char *ckpt = NULL, *data = NULL, *out = NULL, *compare = NULL, *which = "all", *cats = NULL, *device = NULL;
    long max_tokens = 8192;
    int T = -1, batch = -1; /* -1: the model's default */
    bool no_plots = false;
    const arg_spec specs[] = {
        {"--checkpoint", ARG_STR, &ckpt, "DIR", "checkpoint dir (config.json + model.safetensors), LM, ViT or DiT", true, ARG_ANY},
        {"--data", ARG_STR, &data, "SRC", "LM: dir of <topic>.txt files, or FILE:LABEL[,FILE:LABEL...]; ViT, DiT: IDX dir (t10k split)", true, ARG_ANY},
        {"--out", ARG_STR, &out, "DIR", "output dir: analysis.json, *.csv, *.png (created)", true, ARG_ANY},
        {"--compare", ARG_STR, &compare, "DIR", "dense MHA twin checkpoint: its similarity and rank numbers too", false, ARG_ANY},
        {"--max-tokens", ARG_LONG, &max_tokens, "N", "tokens per category (default 8192; ViT: rounded up to whole images)", false, ARG_IN(1, 1e12)},
        {"--layers", ARG_CHOICE, &which, "all|last", "layers analysed (default all)", false, ARG_ANY},
        {"--categories", ARG_STR, &cats, "A,B,..", "LM with a --data dir: these topics, in this order (default: all); DiT: class (default) or timestep[:R] (R ranges of t, default 4)", false, ARG_ANY},
        {"--seq-len", ARG_INT, &T, "T", "LM chunk length (default: config max_position_embeddings)", false, ARG_GE(1)},
        {"--batch-size", ARG_INT, &batch, "B", "sequences/images per forward (default 8 LM, 64 ViT)", false, ARG_IN(1, 65536)},
        {"--no-plots", ARG_FLAG, &no_plots, NULL, "write only analysis.json and the CSV tables", false, ARG_ANY},
        CLI_DEVICE_SPEC(&device),
    };
    int rc = args_parse("analyze", argc, argv, specs, (int)(sizeof specs / sizeof specs[0]),
                        "--checkpoint DIR --data SRC --out DIR [--compare DIR] [--max-tokens N] [--layers all|last]",
                        "Categories: LM, the topics of --data (DIR/topics.txt, first field per line, else\n"
                        "DIR/*.txt; fortunes separator lines '%' are dropped); ViT, the classes of the t10k\n"
                        "split (Fashion-MNIST names when the path says 'fashion'); DiT, the classes or (--categories\n"
                        "timestep[:R]) R equal ranges of the diffusion timestep, test images noised at a\n"
                        "seeded t (uniform over all steps, or over the image's range) with their true label.\n"
                        "Definitions of every statistic: analysis.json \"estimators\" and docs/analysis.md.\n");
    if (rc) return rc == 1 ? 0 : rc;
    moh_error err = {0};
    model m, twin;
    analysis_data d;
    analysis an, an2;
    an_result res, res2;
    memset(&m, 0, sizeof m);
    memset(&twin, 0, sizeof twin);
    memset(&d, 0, sizeof d);
    memset(&an, 0, sizeof an);
    memset(&an2, 0, sizeof an2);
    memset(&res, 0, sizeof res);
    memset(&res2, 0, sizeof res2);
    int status = 1, layers[1024], nl = 0, layer_shared[1024], layer_top_k[1024];
    const bool last = !strcmp(which, "last");
    if (model_load(&m, ckpt, &err)) goto fail;
    const struct moh_backend *be = NULL;
    if (cli_device("analyze", device, m.fam->model_type, &be)) goto done;
    const model_family *fam = m.fam;
    const int L = model_num_layers(&m);
    if (!fam->open_analysis) {
        moh_fail(&err, MOH_E_ARG, "%s is a %s model (model_type \"%s\"), which does not support analyze", ckpt,
                 fam->short_name, fam->model_type);
        goto fail;
    }
    if (compare) {
        if (model_load(&twin, compare, &err)) goto fail;
        const int L2 = model_num_layers(&twin);
        if (twin.fam != fam || L2 != L) {
            moh_fail(&err, MOH_E_CONFIG, "--compare %s: a %s with %d layers, expected a %s with %d layers like %s",
                     compare, twin.fam->short_name, L2, fam->short_name, L, ckpt);
            goto fail;
        }
    }
    if (L > 1024) {
        moh_fail(&err, MOH_E_CONFIG, "%s: %d layers, at most 1024 supported", ckpt, L);
        goto fail;
    }
    for (int l = last ? L - 1 : 0; l < L; l++) layers[nl++] = l;
    const analysis_request req = {.data = data, .categories = cats, .max_tokens = max_tokens, .seq_len = T,
                                  .batch = batch, .m = &m, .twin = compare ? &twin : NULL, .model_label = ckpt,
                                  .twin_label = compare, .nearest = args_nearest};
    if (fam->open_analysis(&req, &d, &err)) goto fail;
    if (fs_mkdir_p(out, &err)) goto fail;
    const moh_attn_config *ma = model_attn(&m);
    bool per_layer = false; /* layers differ in shared / top-k heads (DiT): the plots say each layer's */
    for (int s = 0; s < nl; s++) {
        const moh_attn_config *al = model_attn_layer(&m, layers[s]);
        layer_shared[s] = al->router == MOH_ROUTER_NONE ? 0 : al->shared_heads;
        layer_top_k[s] = al->top_k;
        per_layer = per_layer || al->shared_heads != ma->shared_heads || al->top_k != ma->top_k;
    }
    const moh_router router = ma->router;
    const int top_k = ma->top_k;
    const char *router2 = compare ? router_name(model_attn(&twin)->router) : "";
    double t0 = now_s();
    if (run_model(&m, ckpt, &d, layers, nl, &an, &err)) goto fail;
    double tok = 0;
    for (int c = 0; c < d.C; c++) tok += an.tokens[c];
    if (!(tok > 0)) {
        moh_fail(&err, MOH_E_FORMAT, "%s: no tokens to analyse", data);
        goto fail;
    }
    fprintf(stderr, "moh analyze: %s: %.0f tokens in %d categories, %d layer(s), %.1f s\n", ckpt, tok, d.C, nl,
            now_s() - t0);
    model_free(&m); /* its config and parameters are not needed any more */
    if (an_finish(&an, &res, &err)) goto fail;
    if (compare) {
        t0 = now_s();
        if (run_model(&twin, compare, &d, layers, nl, &an2, &err)) goto fail;
        fprintf(stderr, "moh analyze: %s: same tokens, %.1f s\n", compare, now_s() - t0);
        model_free(&twin);
        if (an_finish(&an2, &res2, &err)) goto fail;
    }
    an_meta meta = {d.type, ckpt, router_name(router), top_k, data, d.note, layers, (const char *const *)d.names,
                    per_layer ? layer_shared : NULL, per_layer ? layer_top_k : NULL};
    an_meta meta2 = {d.type, compare, router2, 0, data, d.note, layers, (const char *const *)d.names, NULL, NULL};
    if (an_write_outputs(out, &meta, &an, &res, compare ? &meta2 : NULL, compare ? &res2 : NULL, &err)) goto fail;
    if (!no_plots) {
        if (!an_plot_available())
            fprintf(stderr, "moh analyze: note: built without cairo, no PNG plots (install libcairo2-dev and rebuild)\n");
        else if (an_plot_all(out, &meta, &an, &res, compare ? &res2 : NULL, &err))
            goto fail;
    }
    an_print_table(stdout, router == MOH_ROUTER_NONE ? "model (dense)" : "model (MoH)", &res, layers);
    if (compare) an_print_table(stdout, "compare (twin)", &res2, layers);
    an_print_legend(stdout, res.s.routed > 0);
    printf("wrote %s/analysis.json, CSV tables%s\n", out, !no_plots && an_plot_available() ? " and PNG plots" : "");
    status = 0;
    goto done;
fail:
    fprintf(stderr, "moh analyze: %s\n", err.msg);
done:
    an_result_free(&res);
    an_result_free(&res2);
    an_free(&an);
    an_free(&an2);
    analysis_data_free(&d);
    model_free(&twin);
    model_free(&m);
    return status;
}
