/* moh analyze: head statistics of a checkpoint (LM or ViT) over labelled data, spec §6: head load
 * per category, routing-score distributions and their CV, attention/output similarity between
 * heads (and of a dense twin), effective rank of head outputs. Statistics: src/analysis.
 * The models run on the reference attention path (lm_acts_init_f32 / vit_acts_init_f32, not the
 * head-sparse one): its caches hold every head's attention rows and outputs at every token, which
 * the all-token similarities need. */
#include <ctype.h>
#include <dirent.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "analysis/analysis.h"
#include "args.h"
#include "cli.h"
#include "core/fsutil.h"
#include "data/idx.h"
#include "models/lm.h"
#include "models/vit.h"
#include "train/checkpoint.h"
#include "models/model.h"

#define MAX_CATEGORIES 256



/* A loaded checkpoint (model.h) seen as an LM or a ViT, with activations for one batch. */
typedef struct an_model {
    model gm;                 /* owns config and parameters; lc/lp or vc/vp are copies of its views */
    bool vit;
    char dir[PATH_MAX];
    moh_lm_config lc;
    lm_params_f32 lp;
    lm_acts_f32 la;
    moh_vit_config vc;
    vit_params_f32 vp;
    vit_acts_f32 va;
    bool have_p, have_a;
    const moh_attn_config *attn;
    int L;
} an_model;

static const char *router_name(moh_router r) {
    return r == MOH_ROUTER_LEARNED ? "learned" : r == MOH_ROUTER_QUERY_NORM ? "query_norm" : "none";
}

static int am_load(an_model *m, const char *dir, moh_error *err) {
    memset(m, 0, sizeof *m);
    snprintf(m->dir, sizeof m->dir, "%s", dir);
    int rc = model_load(&m->gm, dir, err);
    if (rc) return rc;
    m->vit = !strcmp(m->gm.fam->task, "image-classification");
    if (m->vit) {
        m->vc = *(const moh_vit_config *)m->gm.cfg;
        m->vp = *(const vit_params_f32 *)m->gm.params;
    } else {
        m->lc = *(const moh_lm_config *)m->gm.cfg;
        m->lp = *(const lm_params_f32 *)m->gm.params;
    }
    m->attn = model_attn(&m->gm);
    m->L = model_num_layers(&m->gm);
    m->have_p = true;
    return MOH_OK;
}

static void am_free(an_model *m) {
    if (m->have_a) {
        if (m->vit) vit_acts_free_f32(&m->va);
        else lm_acts_free_f32(&m->la);
    }
    if (m->have_p) model_free(&m->gm);
    m->have_a = m->have_p = false;
}

/* ---- labelled data -------------------------------------------------------------------------- */

typedef struct dataset {
    int C;
    char *names[MAX_CATEGORIES];
    /* LM: the text of each category (capped) */
    uint8_t *text[MAX_CATEGORIES];
    size_t len[MAX_CATEGORIES];
    int T;                 /* LM chunk length */
    /* ViT: images of the t10k split, the selected indices (grouped by class) */
    idx_split split;
    bool have_split;
    int *idx;
    int n_idx;
    char note[512];
} dataset;

static void dataset_free(dataset *d) {
    for (int c = 0; c < d->C; c++) {
        free(d->names[c]);
        free(d->text[c]);
    }
    if (d->have_split) idx_split_free(&d->split);
    free(d->idx);
    memset(d, 0, sizeof *d);
}

static char *dup_str(const char *s, size_t n) {
    char *r = malloc(n + 1);
    if (r) {
        memcpy(r, s, n);
        r[n] = 0;
    }
    return r;
}

/* Removes the lines holding only "%" (fortune separators), keeping an empty line in their place,
 * and caps the result at cap bytes. In place; returns the new length. */
static size_t clean_fortunes(uint8_t *t, size_t n, size_t cap) {
    size_t w = 0, i = 0;
    while (i < n && w < cap) {
        size_t e = i;
        while (e < n && t[e] != '\n') e++;
        const bool sep = (e - i == 1 && t[i] == '%') || (e - i == 2 && t[i] == '%' && t[i + 1] == '\r');
        if (!sep) {
            memmove(t + w, t + i, e - i);
            w += e - i;
        }
        if (e < n && w < cap) t[w++] = '\n';
        i = e + 1;
    }
    return w < cap ? w : cap;
}

static int add_text_category(dataset *d, const char *file, const char *label, size_t cap, moh_error *err) {
    if (d->C >= MAX_CATEGORIES) return moh_fail(err, MOH_E_ARG, "--data: more than %d categories", MAX_CATEGORIES);
    for (int i = 0; i < d->C; i++)
        if (!strcmp(d->names[i], label))
            return moh_fail(err, MOH_E_ARG, "--data/--categories: category '%s' given twice", label);
    size_t n = 0;
    char *t = fs_read_file(file, (size_t)1 << 31, &n, err);
    if (!t) return err->code;
    n = clean_fortunes((uint8_t *)t, n, cap);
    if (n < 2) {
        free(t);
        return moh_fail(err, MOH_E_FORMAT, "%s: category '%s' has fewer than 2 bytes of text", file, label);
    }
    const int c = d->C;
    d->names[c] = dup_str(label, strlen(label));
    d->text[c] = (uint8_t *)t;
    d->len[c] = n;
    d->C++;
    if (!d->names[c]) return moh_fail(err, MOH_E_NOMEM, "out of memory");
    return MOH_OK;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Category names of a directory: its topics.txt (first field of each line), else its *.txt files
 * in name order. */
static int list_topics(const char *dir, char ***out, int *n_out, moh_error *err) {
    char path[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/topics.txt", dir);
    char **names = calloc(MAX_CATEGORIES * 4, sizeof(char *));
    int n = 0;
    if (!names) return moh_fail(err, MOH_E_NOMEM, "out of memory");
    struct stat st;
    if (stat(path, &st) == 0) {
        size_t len = 0;
        char *t = fs_read_file(path, (size_t)1 << 24, &len, err);
        if (!t) {
            free(names);
            return err->code;
        }
        for (char *line = t; *line && n < MAX_CATEGORIES * 4;) {
            char *e = strchr(line, '\n');
            size_t k = 0;
            while (line[k] && line[k] != '\n' && !isspace((unsigned char)line[k])) k++;
            if (k > 0) names[n++] = dup_str(line, k);
            if (!e) break;
            line = e + 1;
        }
        free(t);
    } else {
        DIR *dp = opendir(dir);
        if (!dp) {
            free(names);
            return moh_fail(err, MOH_E_IO, "%s: cannot open the directory", dir);
        }
        struct dirent *de;
        while ((de = readdir(dp)) && n < MAX_CATEGORIES * 4) {
            const size_t k = strlen(de->d_name);
            if (k > 4 && !strcmp(de->d_name + k - 4, ".txt") && strcmp(de->d_name, "topics.txt"))
                names[n++] = dup_str(de->d_name, k - 4);
        }
        closedir(dp);
        qsort(names, (size_t)n, sizeof(char *), cmp_str);
    }
    for (int i = 0; i < n; i++)
        if (!names[i]) {
            for (int j = 0; j < n; j++) free(names[j]);
            free(names);
            return moh_fail(err, MOH_E_NOMEM, "out of memory");
        }
    *out = names;
    *n_out = n;
    return MOH_OK;
}

/* --data DIR [--categories a,b,c] or --data FILE:LABEL[,FILE:LABEL...] for the LM. */
static int load_text_data(dataset *d, const char *data, const char *cats, long max_tokens, int T,
                          moh_error *err) {
    struct stat st;
    const size_t cap = (size_t)max_tokens;
    d->T = T;
    int rc = MOH_OK;
    if (stat(data, &st) == 0 && S_ISDIR(st.st_mode)) {
        char **names = NULL;
        int n = 0;
        if ((rc = list_topics(data, &names, &n, err))) return rc;
        char path[PATH_MAX + 300];
        if (cats) {
            const char *p = cats;
            while (!rc && *p) {
                const char *e = strchr(p, ',');
                const size_t k = e ? (size_t)(e - p) : strlen(p);
                char name[256];
                snprintf(name, sizeof name, "%.*s", (int)(k < 255 ? k : 255), p);
                snprintf(path, sizeof path, "%s/%s.txt", data, name);
                bool known = false;
                for (int i = 0; i < n && !known; i++) known = !strcmp(names[i], name);
                if (k == 0 || k > 255) {
                    rc = moh_fail(err, MOH_E_ARG, "--categories: empty or overlong name in '%s'", cats);
                } else if (!known) {
                    const int near = args_nearest(name, (const char *const *)names, n);
                    rc = moh_fail(err, MOH_E_ARG, "--categories: '%s' is not a topic of %s (%d topics%s%s%s)", name, data,
                                  n, near >= 0 ? "; did you mean '" : "", near >= 0 ? names[near] : "",
                                  near >= 0 ? "'?" : "");
                } else {
                    rc = add_text_category(d, path, name, cap, err);
                }
                p = e ? e + 1 : p + k;
            }
        } else {
            for (int i = 0; !rc && i < n; i++) {
                snprintf(path, sizeof path, "%s/%s.txt", data, names[i]);
                rc = add_text_category(d, path, names[i], cap, err);
            }
        }
        for (int i = 0; i < n; i++) free(names[i]);
        free(names);
        if (!rc && d->C == 0) rc = moh_fail(err, MOH_E_FORMAT, "%s: no categories (no topics.txt, no *.txt)", data);
    } else {
        if (cats) return moh_fail(err, MOH_E_ARG, "--categories applies to a --data directory, not to FILE:LABEL lists");
        const char *p = data;
        while (!rc && *p) {
            const char *e = strchr(p, ',');
            const size_t k = e ? (size_t)(e - p) : strlen(p);
            char item[PATH_MAX + 300];
            snprintf(item, sizeof item, "%.*s", (int)(k < sizeof item - 1 ? k : sizeof item - 1), p);
            char *colon = strrchr(item, ':');
            if (!colon || colon == item || !colon[1])
                rc = moh_fail(err, MOH_E_ARG,
                              "--data '%s': expected a directory of <topic>.txt files or FILE:LABEL[,FILE:LABEL...]", item);
            else {
                *colon = 0;
                rc = add_text_category(d, item, colon + 1, cap, err);
            }
            p = e ? e + 1 : p + k;
        }
    }
    if (!rc)
        snprintf(d->note, sizeof d->note,
                 "byte tokens; per category the first %ld bytes of its text (lines holding only %% removed), "
                 "cut into consecutive chunks of %d tokens (a shorter last chunk included), each run as its "
                 "own sequence from position 0; every token counted", max_tokens, T);
    return rc;
}


/* A ViT config without mean/std (normalisation) gets the training split's, as moh eval does;
 * without a readable training split, unnormalised pixels in [0, 1] (with a note). */
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
static int load_image_data(dataset *d, const moh_vit_config *cfg, const char *data, long max_tokens,
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
        d->names[k] = dup_str(fashion ? fashion[k] : buf, strlen(fashion ? fashion[k] : buf));
        d->C = k + 1;
        if (!d->names[k]) return moh_fail(err, MOH_E_NOMEM, "out of memory");
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

static void add_layers(analysis *an, const an_model *m, const int *layers, int nl, int B, int N,
                       const int *cat, moh_error *err, int *rc) {
    const int E = attn_routed_heads(m->attn);
    for (int s = 0; !*rc && s < nl; s++) {
        const attn_cache_f32 *c = m->vit ? &m->va.attn[layers[s]] : &m->la.attn[layers[s]];
        an_batch b = {B, N, cat, c->gates, E > 0 ? c->p : NULL, c->o, c->att, m->attn->causal};
        *rc = an_add(an, s, &b, err);
    }
}

static int run_model(an_model *m, const dataset *d, int batch, const int *layers, int nl, analysis *an,
                     moh_error *err) {
    const moh_attn_config *a = m->attn;
    const int E = attn_routed_heads(a), h = a->n_heads;
    an_shape s = {nl, h, h - E, E, a->head_dim, d->C, 2.0 * h};
    int rc = an_init(an, &s, err);
    if (rc) return rc;
    int *cat = malloc(sizeof(int) * (size_t)batch);
    if (!cat) return moh_fail(err, MOH_E_NOMEM, "out of memory");
    progress pg;
    if (m->vit) progress_init(&pg, m->dir, "images", d->n_idx);
    else {
        double total = 0;
        for (int c = 0; c < d->C; c++) total += (double)d->len[c];
        progress_init(&pg, m->dir, "tokens", total);
    }
    if (m->vit) {
        const moh_vit_config *cfg = &m->vc;
        const size_t chw = (size_t)cfg->in_chans * cfg->img_size * cfg->img_size;
        float *img = malloc(sizeof(float) * chw * (size_t)batch);
        if (!img) rc = moh_fail(err, MOH_E_NOMEM, "out of memory");
        if (!rc && !(rc = vit_acts_init_f32(&m->va, cfg, batch, err))) m->have_a = true;
        for (int i0 = 0; !rc && i0 < d->n_idx; i0 += batch) {
            const int B = d->n_idx - i0 < batch ? d->n_idx - i0 : batch;
            vit_make_batch(cfg, &d->split, d->idx + i0, B, NULL, 0, 0, img);
            for (int b = 0; b < B; b++) cat[b] = d->split.labels[d->idx[i0 + b]];
            vit_forward_f32(cfg, &m->vp, &m->va, img, NULL, B);
            add_layers(an, m, layers, nl, B, cfg->num_tokens, cat, err, &rc);
            progress_add(&pg, B);
        }
        free(img);
    } else {
        const int T = d->T;
        int *tok = malloc(sizeof(int) * (size_t)batch * T);
        if (!tok) rc = moh_fail(err, MOH_E_NOMEM, "out of memory");
        if (!rc && !(rc = lm_acts_init_f32(&m->la, &m->lc, batch, T, err))) m->have_a = true;
        for (int c = 0; !rc && c < d->C; c++) {
            const size_t n = d->len[c], full = n / (size_t)T;
            for (size_t k0 = 0; !rc && k0 < full; k0 += (size_t)batch) {
                const int B = full - k0 < (size_t)batch ? (int)(full - k0) : batch;
                for (int b = 0; b < B; b++) {
                    cat[b] = c;
                    for (int t = 0; t < T; t++) tok[(size_t)b * T + t] = d->text[c][(k0 + b) * T + t];
                }
                lm_forward_f32(&m->lc, &m->lp, &m->la, tok, NULL, B, T);
                add_layers(an, m, layers, nl, B, T, cat, err, &rc);
                progress_add(&pg, (double)B * T);
            }
            const int tail = (int)(n - full * T);
            if (!rc && tail >= 1) {
                for (int t = 0; t < tail; t++) tok[t] = d->text[c][full * T + t];
                cat[0] = c;
                lm_forward_f32(&m->lc, &m->lp, &m->la, tok, NULL, 1, tail);
                add_layers(an, m, layers, nl, 1, tail, cat, err, &rc);
                progress_add(&pg, tail);
            }
        }
        free(tok);
    }
    progress_end(&pg);
    free(cat);
    return rc;
}

int cmd_analyze(int argc, char **argv) {
    const char *ckpt = NULL, *data = NULL, *out = NULL, *compare = NULL, *which = "all", *cats = NULL;
    long max_tokens = 8192;
    int T = -1, batch = -1; /* -1: the model's default */
    bool no_plots = false;
    const arg_spec specs[] = {
        {"--checkpoint", ARG_STR, &ckpt, "DIR", "checkpoint dir (config.json + model.safetensors), LM or ViT", true, ARG_ANY},
        {"--data", ARG_STR, &data, "SRC", "LM: dir of <topic>.txt files, or FILE:LABEL[,FILE:LABEL...]; ViT: IDX dir (t10k split)", true, ARG_ANY},
        {"--out", ARG_STR, &out, "DIR", "output dir: analysis.json, *.csv, *.png (created)", true, ARG_ANY},
        {"--compare", ARG_STR, &compare, "DIR", "dense MHA twin checkpoint: its similarity and rank numbers too", false, ARG_ANY},
        {"--max-tokens", ARG_LONG, &max_tokens, "N", "tokens per category (default 8192; ViT: rounded up to whole images)", false, ARG_IN(1, 1e12)},
        {"--layers", ARG_CHOICE, &which, "all|last", "layers analysed (default all)", false, ARG_ANY},
        {"--categories", ARG_STR, &cats, "A,B,..", "LM with a --data dir: these topics, in this order (default: all)", false, ARG_ANY},
        {"--seq-len", ARG_INT, &T, "T", "LM chunk length (default: config max_position_embeddings)", false, ARG_GE(1)},
        {"--batch-size", ARG_INT, &batch, "B", "sequences/images per forward (default 8 LM, 64 ViT)", false, ARG_IN(1, 65536)},
        {"--no-plots", ARG_FLAG, &no_plots, NULL, "write only analysis.json and the CSV tables", false, ARG_ANY},
    };
    int rc = args_parse("analyze", argc, argv, specs, (int)(sizeof specs / sizeof specs[0]),
                        "--checkpoint DIR --data SRC --out DIR [--compare DIR] [--max-tokens N] [--layers all|last]",
                        "Categories: LM, the topics of --data (DIR/topics.txt, first field per line, else\n"
                        "DIR/*.txt; fortunes separator lines '%' are dropped); ViT, the classes of the t10k\n"
                        "split (Fashion-MNIST names when the path says 'fashion').\n"
                        "Definitions of every statistic: analysis.json \"estimators\" and docs/analysis.md.\n");
    if (rc) return rc == 1 ? 0 : rc;
    moh_error err = {0};
    an_model m, twin;
    dataset d;
    analysis an, an2;
    an_result res, res2;
    memset(&m, 0, sizeof m);
    memset(&twin, 0, sizeof twin);
    memset(&d, 0, sizeof d);
    memset(&an, 0, sizeof an);
    memset(&an2, 0, sizeof an2);
    memset(&res, 0, sizeof res);
    memset(&res2, 0, sizeof res2);
    int status = 1, layers[1024], nl = 0;
    const bool last = !strcmp(which, "last");
    if (am_load(&m, ckpt, &err)) goto fail;
    if (compare) {
        if (am_load(&twin, compare, &err)) goto fail;
        if (twin.vit != m.vit || twin.L != m.L) {
            moh_fail(&err, MOH_E_CONFIG, "--compare %s: a %s with %d layers, expected a %s with %d layers like %s",
                     compare, twin.vit ? "ViT" : "LM", twin.L, m.vit ? "ViT" : "LM", m.L, ckpt);
            goto fail;
        }
        if (m.vit && (twin.vc.num_tokens != m.vc.num_tokens || twin.vc.num_classes != m.vc.num_classes)) {
            moh_fail(&err, MOH_E_CONFIG, "--compare %s: image tokens/classes differ from %s", compare, ckpt);
            goto fail;
        }
    }
    if (m.L > 1024) {
        moh_fail(&err, MOH_E_CONFIG, "%s: %d layers, at most 1024 supported", ckpt, m.L);
        goto fail;
    }
    for (int l = last ? m.L - 1 : 0; l < m.L; l++) layers[nl++] = l;
    if (m.vit) {
        if (batch < 0) batch = 64;
        if (T > 0) fprintf(stderr, "moh analyze: note: --seq-len does not apply to a ViT; ignored\n");
        if (cats) {
            moh_fail(&err, MOH_E_ARG, "--categories applies to LM topics; a ViT uses every class");
            goto fail;
        }
        fill_norm(&m.vc, ckpt, data);
        if (compare) fill_norm(&twin.vc, compare, data);
        if (load_image_data(&d, &m.vc, data, max_tokens, &err)) goto fail;
        if (compare && vit_check_split(&twin.vc, &d.split, data, &err)) { /* image size, channels */
            char msg[sizeof err.msg];
            snprintf(msg, sizeof msg, "%s", err.msg);
            moh_fail(&err, MOH_E_CONFIG, "--compare %s: %s", compare, msg);
            goto fail;
        }
    } else {
        if (batch < 0) batch = 8;
        if (T < 0) T = m.lc.max_position_embeddings;
        const int ctx = compare && twin.lc.max_position_embeddings < m.lc.max_position_embeddings
                            ? twin.lc.max_position_embeddings
                            : m.lc.max_position_embeddings;
        if (T > ctx) {
            moh_fail(&err, MOH_E_ARG, "--seq-len is %d, expected 1..%d (max_position_embeddings of %s)", T, ctx,
                     ctx == m.lc.max_position_embeddings ? ckpt : compare);
            goto fail;
        }
        if (load_text_data(&d, data, cats, max_tokens, T, &err)) goto fail;
        for (int c = 0; c < d.C; c++) /* a short category weighs less in every statistic: say so */
            if (d.len[c] < (size_t)max_tokens)
                fprintf(stderr, "moh analyze: note: category '%s' has %zu bytes of text, fewer than --max-tokens %ld\n",
                        d.names[c], d.len[c], max_tokens);
    }
    if (fs_mkdir_p(out, &err)) goto fail;
    double t0 = now_s();
    if (run_model(&m, &d, batch, layers, nl, &an, &err)) goto fail;
    double tok = 0;
    for (int c = 0; c < d.C; c++) tok += an.tokens[c];
    if (!(tok > 0)) {
        moh_fail(&err, MOH_E_FORMAT, "%s: no tokens to analyse", data);
        goto fail;
    }
    fprintf(stderr, "moh analyze: %s: %.0f tokens in %d categories, %d layer(s), %.1f s\n", ckpt, tok, d.C, nl,
            now_s() - t0);
    am_free(&m);
    if (an_finish(&an, &res, &err)) goto fail;
    if (compare) {
        t0 = now_s();
        if (run_model(&twin, &d, batch, layers, nl, &an2, &err)) goto fail;
        fprintf(stderr, "moh analyze: %s: same tokens, %.1f s\n", compare, now_s() - t0);
        am_free(&twin);
        if (an_finish(&an2, &res2, &err)) goto fail;
    }
    an_meta meta = {m.vit ? "vit" : "lm", ckpt, router_name(m.attn->router), m.attn->top_k, data, d.note,
                    layers, (const char *const *)d.names};
    an_meta meta2 = {m.vit ? "vit" : "lm", compare, compare ? router_name(twin.attn->router) : "", 0, data,
                     d.note, layers, (const char *const *)d.names};
    if (an_write_outputs(out, &meta, &an, &res, compare ? &meta2 : NULL, compare ? &res2 : NULL, &err)) goto fail;
    if (!no_plots) {
        if (!an_plot_available())
            fprintf(stderr, "moh analyze: note: built without cairo, no PNG plots (install libcairo2-dev and rebuild)\n");
        else if (an_plot_all(out, &meta, &an, &res, compare ? &res2 : NULL, &err))
            goto fail;
    }
    an_print_table(stdout, m.attn->router == MOH_ROUTER_NONE ? "model (dense)" : "model (MoH)", &res, layers);
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
    dataset_free(&d);
    am_free(&m);
    am_free(&twin);
    return status;
}
