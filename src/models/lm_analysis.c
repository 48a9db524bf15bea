/* `moh analyze` data of the decoder LM (lm_analysis.h): categories of byte text, from a directory
 * of topics or FILE:LABEL lists, cut into chunks that each run as their own sequence. */
#include "models/lm_analysis.h"

#include <ctype.h>
#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/fsutil.h"
#include "models/lm.h"

#define MAX_CATEGORIES 256

typedef struct text_cats {
    int C;
    char *names[MAX_CATEGORIES];
    uint8_t *text[MAX_CATEGORIES]; /* the text of each category (capped) */
    size_t len[MAX_CATEGORIES];
    int T;                         /* chunk length */
    int batch;                     /* chunks per batch */
    int *tok;                      /* [batch, T] */
    char note[512];
} text_cats;

static void text_cats_free(void *self) {
    text_cats *d = self;
    if (!d) return;
    for (int c = 0; c < d->C; c++) {
        free(d->names[c]);
        free(d->text[c]);
    }
    free(d->tok);
    free(d);
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

static int add_text_category(text_cats *d, const char *file, const char *label, size_t cap, moh_error *err) {
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

/* --data DIR [--categories a,b,c] or --data FILE:LABEL[,FILE:LABEL...]. */
static int load_text_data(text_cats *d, const analysis_request *req, moh_error *err) {
    const char *data = req->data, *cats = req->categories;
    struct stat st;
    const size_t cap = (size_t)req->max_tokens;
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
                    const int near = req->nearest ? req->nearest(name, (const char *const *)names, n) : -1;
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
                 "own sequence from position 0; every token counted", req->max_tokens, d->T);
    return rc;
}

/* Chunks are numbered per category (its full chunks, then the shorter last one if any) and the
 * cursor counts them over the categories in order: up to `batch` full chunks of one category at a
 * time, the shorter last chunk alone. */
static long text_cats_next(void *self, const model *m, long *cursor, moh_batch *out, int *cat) {
    text_cats *d = self;
    const int T = d->T;
    long k = *cursor;
    for (int c = 0; c < d->C; c++) {
        const size_t n = d->len[c], full = n / (size_t)T;
        const int tail = (int)(n - full * T);
        const long chunks = (long)full + (tail >= 1);
        if (k >= chunks) {
            k -= chunks;
            continue;
        }
        if ((size_t)k < full) {
            const int B = full - (size_t)k < (size_t)d->batch ? (int)(full - (size_t)k) : d->batch;
            for (int b = 0; b < B; b++) {
                cat[b] = c;
                for (int t = 0; t < T; t++) d->tok[(size_t)b * T + t] = d->text[c][((size_t)k + b) * T + t];
            }
            *cursor += B;
            *out = (moh_batch){.B = B, .T = T, .tokens = d->tok};
            return (long)B * T;
        }
        for (int t = 0; t < tail; t++) d->tok[t] = d->text[c][full * T + t];
        cat[0] = c;
        *cursor += 1;
        *out = (moh_batch){.B = 1, .T = tail, .tokens = d->tok};
        return tail;
    }
    return 0;
}

int lm_open_analysis(const analysis_request *req, analysis_data *out, moh_error *err) {
    const moh_lm_config *mc = req->m->cfg, *tc = req->twin ? req->twin->cfg : NULL;
    const int batch = req->batch > 0 ? req->batch : 8;
    const int T = req->seq_len > 0 ? req->seq_len : mc->max_position_embeddings;
    const int ctx = tc && tc->max_position_embeddings < mc->max_position_embeddings ? tc->max_position_embeddings
                                                                                     : mc->max_position_embeddings;
    if (T > ctx)
        return moh_fail(err, MOH_E_ARG, "--seq-len is %d, expected 1..%d (max_position_embeddings of %s)", T, ctx,
                        ctx == mc->max_position_embeddings ? req->model_label : req->twin_label);
    text_cats *d = calloc(1, sizeof *d);
    if (!d) return moh_fail(err, MOH_E_NOMEM, "out of memory");
    d->T = T;
    d->batch = batch;
    int rc = load_text_data(d, req, err);
    if (!rc) {
        d->tok = malloc(sizeof(int) * (size_t)batch * T);
        if (!d->tok) rc = moh_fail(err, MOH_E_NOMEM, "out of memory");
    }
    if (rc) {
        text_cats_free(d);
        return rc;
    }
    double total = 0;
    for (int c = 0; c < d->C; c++) { /* a short category weighs less in every statistic: say so */
        if (d->len[c] < (size_t)req->max_tokens)
            fprintf(stderr, "moh analyze: note: category '%s' has %zu bytes of text, fewer than --max-tokens %ld\n",
                    d->names[c], d->len[c], req->max_tokens);
        total += (double)d->len[c];
    }
    *out = (analysis_data){.self = d, .type = "lm", .C = d->C, .names = d->names, .note = d->note,
                           .unit = "tokens", .items = total, .batch = batch, .T = T, .next = text_cats_next,
                           .free = text_cats_free};
    return MOH_OK;
}
