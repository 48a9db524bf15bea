/* Head statistics (spec §6): accumulation over batches, results, JSON and CSV output.
 * Definitions: analysis.h. */
#include "analysis/analysis.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- primitives ----------------------------------------------------------------------------- */

int an_jacobi_eigenvalues(double *A, int n, double *w) {
    int sweep = 0;
    double total = 0.0;
    for (int i = 0; i < n * n; i++) total += A[i] * A[i];
    for (; sweep < 100; sweep++) {
        double off = 0.0;
        for (int p = 0; p < n; p++)
            for (int q = p + 1; q < n; q++) off += A[p * n + q] * A[p * n + q];
        if (off <= 1e-30 * total || off == 0.0) break;
        for (int p = 0; p < n; p++) {
            for (int q = p + 1; q < n; q++) {
                const double apq = A[p * n + q];
                if (apq == 0.0) continue;
                const double app = A[p * n + p], aqq = A[q * n + q];
                /* rotation angle that zeroes A[p][q] (Golub & Van Loan, symmetric Schur) */
                const double theta = (aqq - app) / (2.0 * apq);
                const double t = (theta >= 0 ? 1.0 : -1.0) / (fabs(theta) + sqrt(theta * theta + 1.0));
                const double c = 1.0 / sqrt(t * t + 1.0), s = t * c;
                for (int k = 0; k < n; k++) { /* columns p, q */
                    const double akp = A[k * n + p], akq = A[k * n + q];
                    A[k * n + p] = c * akp - s * akq;
                    A[k * n + q] = s * akp + c * akq;
                }
                for (int k = 0; k < n; k++) { /* rows p, q */
                    const double apk = A[p * n + k], aqk = A[q * n + k];
                    A[p * n + k] = c * apk - s * aqk;
                    A[q * n + k] = s * apk + c * aqk;
                }
                A[p * n + q] = A[q * n + p] = 0.0;
            }
        }
    }
    for (int i = 0; i < n; i++) w[i] = A[i * n + i];
    for (int i = 1; i < n; i++) { /* insertion sort, descending */
        const double v = w[i];
        int j = i - 1;
        while (j >= 0 && w[j] < v) {
            w[j + 1] = w[j];
            j--;
        }
        w[j + 1] = v;
    }
    return sweep;
}

double an_effective_rank_sv(const double *sv, int n) {
    double sum = 0.0;
    for (int k = 0; k < n; k++)
        if (sv[k] > 0) sum += sv[k];
    if (!(sum > 0)) return 0.0;
    double H = 0.0;
    for (int k = 0; k < n; k++) {
        if (!(sv[k] > 0)) continue;
        const double pk = sv[k] / sum;
        H -= pk * log(pk);
    }
    return exp(H);
}

double an_effective_rank_gram(const double *G, int d) {
    double *A = malloc(sizeof(double) * ((size_t)d * d + d));
    if (!A) return NAN;
    double *w = A + (size_t)d * d;
    memcpy(A, G, sizeof(double) * (size_t)d * d);
    an_jacobi_eigenvalues(A, d, w);
    /* eigenvalues below the float64 round-off of the largest are noise of a zero singular value */
    const double floor_ = w[0] > 0 ? w[0] * 1e-14 * d : 0.0;
    for (int k = 0; k < d; k++) w[k] = w[k] > floor_ ? sqrt(w[k]) : 0.0;
    const double r = an_effective_rank_sv(w, d);
    free(A);
    return r;
}

double an_attention_similarity(const float *a, const float *b, int n) {
    double l1 = 0.0;
    for (int k = 0; k < n; k++) l1 += fabs((double)a[k] - (double)b[k]);
    return 1.0 - 0.5 * l1;
}

double an_cosine(const float *a, const float *b, int n, bool *ok) {
    double ab = 0.0, aa = 0.0, bb = 0.0;
    for (int k = 0; k < n; k++) {
        ab += (double)a[k] * b[k];
        aa += (double)a[k] * a[k];
        bb += (double)b[k] * b[k];
    }
    *ok = aa > 0 && bb > 0;
    return *ok ? ab / sqrt(aa * bb) : 0.0;
}

double an_cv(const double *x, int n) {
    if (n < 1) return NAN;
    double m = 0.0;
    for (int i = 0; i < n; i++) m += x[i];
    m /= n;
    double v = 0.0;
    for (int i = 0; i < n; i++) v += (x[i] - m) * (x[i] - m);
    v /= n;
    if (v == 0.0) return 0.0;
    if (m == 0.0) return NAN;
    return sqrt(v) / fabs(m);
}

/* ---- accumulator ---------------------------------------------------------------------------- */

int an_init(analysis *an, const an_shape *s, moh_error *err) {
    memset(an, 0, sizeof *an);
    if (s->layers < 1 || s->heads < 1 || s->shared < 0 || s->routed < 0 ||
        s->shared + s->routed != s->heads || s->head_dim < 1 || s->categories < 1 ||
        !(s->score_max > 0))
        return moh_fail(err, MOH_E_ARG,
                        "analysis shape: layers %d, heads %d = shared %d + routed %d, head_dim %d, "
                        "categories %d, score_max %g: expected positive sizes and heads = shared + routed",
                        s->layers, s->heads, s->shared, s->routed, s->head_dim, s->categories, s->score_max);
    const size_t L = (size_t)s->layers, h = (size_t)s->heads, C = (size_t)s->categories;
    const size_t E = (size_t)s->routed, d = (size_t)s->head_dim;
    const size_t n_tok = L * C, n_sel = L * h * C, n_p = L * E * C, n_hist = L * h * C * AN_SCORE_BINS;
    const size_t n_pair = L * h * h, n_gram = L * h * d * d, n_gn = L * h, n_os = L * h * d;
    const size_t total = n_tok + 2 * n_sel + n_p + n_hist + 8 * n_pair + n_gram + n_gn + n_os;
    double *buf = calloc(total, sizeof(double));
    if (!buf)
        return moh_fail(err, MOH_E_NOMEM, "analysis: out of memory (%zu MiB of statistics)",
                        total * sizeof(double) >> 20);
    an->s = *s;
    an->block = buf;
    an->tokens = buf;
    buf += n_tok;
    an->sel = buf;
    buf += n_sel;
    an->score_sum = buf;
    buf += n_sel;
    an->p_sum = buf;
    buf += n_p;
    an->hist = buf;
    buf += n_hist;
    an->att_sum = buf;
    buf += n_pair;
    an->att_cnt = buf;
    buf += n_pair;
    an->out_sum = buf;
    buf += n_pair;
    an->out_cnt = buf;
    buf += n_pair;
    an->att_sum_all = buf;
    buf += n_pair;
    an->att_cnt_all = buf;
    buf += n_pair;
    an->out_sum_all = buf;
    buf += n_pair;
    an->out_cnt_all = buf;
    buf += n_pair;
    an->gram = buf;
    buf += n_gram;
    an->gram_n = buf;
    buf += n_gn;
    an->osum = buf;
    return MOH_OK;
}

void an_free(analysis *an) {
    if (!an) return;
    free(an->block);
    memset(an, 0, sizeof *an);
}

int an_add(analysis *an, int l, const an_batch *b, moh_error *err) {
    const an_shape *s = &an->s;
    if (l < 0 || l >= s->layers)
        return moh_fail(err, MOH_E_ARG, "analysis: layer slot %d outside 0..%d", l, s->layers - 1);
    if (b->B < 1 || b->N < 1 || !b->cat || !b->gates || !b->o)
        return moh_fail(err, MOH_E_ARG, "analysis: empty batch or missing gates/outputs");
    for (int r = 0; r < b->B; r++)
        if (b->cat[r] < 0 || b->cat[r] >= s->categories)
            return moh_fail(err, MOH_E_ARG, "analysis: row %d has category %d, expected 0..%d", r,
                            b->cat[r], s->categories - 1);
    const int h = s->heads, hs = s->shared, E = s->routed, d = s->head_dim, C = s->categories;
    const int N = b->N, hd = h * d;
    const long T = (long)b->B * N;
    for (int r = 0; r < b->B; r++) an->tokens[(size_t)l * C + b->cat[r]] += N;
    if (b->p)
        for (long t = 0; t < T; t++) {
            const int c = b->cat[t / N];
            for (int e = 0; e < E; e++) an->p_sum[((size_t)l * E + e) * C + c] += b->p[t * E + e];
        }
    const double bin_scale = AN_SCORE_BINS / s->score_max;
#pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < h; i++) {
        double *sel = an->sel + ((size_t)l * h + i) * C;
        double *ssum = an->score_sum + ((size_t)l * h + i) * C;
        double *hist = an->hist + ((size_t)l * h + i) * C * AN_SCORE_BINS;
        double *G = an->gram + ((size_t)l * h + i) * d * d;
        double *gn = an->gram_n + (size_t)l * h + i;
        double *os = an->osum + ((size_t)l * h + i) * d;
        for (long t = 0; t < T; t++) {
            const double g = b->gates[t * h + i];
            const int c = b->cat[t / N];
            if (g != 0.0) sel[c] += 1;
            if (g != 0.0 || i < hs) {
                ssum[c] += g;
                long k = (long)(g * bin_scale);
                if (k < 0) k = 0;
                if (k >= AN_SCORE_BINS) k = AN_SCORE_BINS - 1;
                hist[(size_t)c * AN_SCORE_BINS + k] += 1;
            }
            if (g == 0.0) continue;
            const float *o = b->o + t * hd + (long)i * d;
            for (int u = 0; u < d; u++) {
                const double ou = o[u];
                double *row = G + (size_t)u * d;
                os[u] += ou;
                for (int v = u; v < d; v++) row[v] += ou * o[v];
            }
            *gn += 1;
        }
        for (int u = 0; u < d; u++) /* keep the lower triangle in step for an_finish */
            for (int v = 0; v < u; v++) G[(size_t)u * d + v] = G[(size_t)v * d + u];
    }
    const int n_pairs = h * (h - 1) / 2;
#pragma omp parallel for schedule(dynamic, 1)
    for (int q = 0; q < n_pairs; q++) {
        int i = 0, rem = q;
        while (rem >= h - 1 - i) {
            rem -= h - 1 - i;
            i++;
        }
        const int j = i + 1 + rem;
        double as = 0, ac = 0, os = 0, oc = 0, as2 = 0, ac2 = 0, os2 = 0, oc2 = 0;
        for (long t = 0; t < T; t++) {
            const bool both = b->gates[t * h + i] != 0.0f && b->gates[t * h + j] != 0.0f;
            const long row = t / N, n = t % N;
            if (b->att) {
                const float *Ai = b->att + (((size_t)row * h + i) * N + n) * N;
                const float *Aj = b->att + (((size_t)row * h + j) * N + n) * N;
                const double v = an_attention_similarity(Ai, Aj, b->causal ? (int)n + 1 : N);
                as2 += v;
                ac2 += 1;
                if (both) {
                    as += v;
                    ac += 1;
                }
            }
            bool ok;
            const double cs = an_cosine(b->o + t * hd + (long)i * d, b->o + t * hd + (long)j * d, d, &ok);
            if (ok) {
                os2 += cs;
                oc2 += 1;
                if (both) {
                    os += cs;
                    oc += 1;
                }
            }
        }
        const size_t k = ((size_t)l * h + i) * h + j;
        an->att_sum[k] += as;
        an->att_cnt[k] += ac;
        an->out_sum[k] += os;
        an->out_cnt[k] += oc;
        an->att_sum_all[k] += as2;
        an->att_cnt_all[k] += ac2;
        an->out_sum_all[k] += os2;
        an->out_cnt_all[k] += oc2;
    }
    return MOH_OK;
}

/* ---- results -------------------------------------------------------------------------------- */

static double mean_finite(const double *x, int n, int stride) {
    double s = 0;
    int k = 0;
    for (int i = 0; i < n; i++)
        if (isfinite(x[(size_t)i * stride])) {
            s += x[(size_t)i * stride];
            k++;
        }
    return k ? s / k : NAN;
}

/* CV across categories of row x[0..C), categories with a finite mean only (at least 2). */
static double cv_row(const double *x, int C, double *tmp) {
    int k = 0;
    for (int c = 0; c < C; c++)
        if (isfinite(x[c])) tmp[k++] = x[c];
    return k >= 2 ? an_cv(tmp, k) : NAN;
}

/* Means over the head pairs i < j of one layer, overall and by group (shared-shared,
 * shared-routed, routed-routed). Pair (i, j) is val[base + i*h + j], or with cnt the mean
 * val / cnt of its accumulated sums; NaN values and pairs with cnt 0 are skipped. */
static an_pairs group_means(const double *val, const double *cnt, size_t base, int h, int hs) {
    double sum[4] = {0}, n[4] = {0};
    for (int i = 0; i < h; i++)
        for (int j = i + 1; j < h; j++) {
            const size_t k = base + (size_t)i * h + j;
            if (cnt && !(cnt[k] > 0)) continue;
            const double v = cnt ? val[k] / cnt[k] : val[k];
            if (!isfinite(v)) continue;
            const int g = 1 + (i >= hs) + (j >= hs); /* 1 ss, 2 sr, 3 rr */
            sum[0] += v;
            n[0] += 1;
            sum[g] += v;
            n[g] += 1;
        }
    an_pairs r;
    r.all = n[0] ? sum[0] / n[0] : NAN;
    r.shared_shared = n[1] ? sum[1] / n[1] : NAN;
    r.shared_routed = n[2] ? sum[2] / n[2] : NAN;
    r.routed_routed = n[3] ? sum[3] / n[3] : NAN;
    r.pairs = (int)n[0];
    return r;
}

static an_pairs pair_groups(const double *pair, int h, int hs) { return group_means(pair, NULL, 0, h, hs); }

/* pair_groups of sums / counts [L, h, h] (upper triangle) of layer l. */
static an_pairs pair_groups_raw(const double *sum, const double *cnt, int l, int h, int hs) {
    return group_means(sum, cnt, (size_t)l * h * h, h, hs);
}

int an_finish(const analysis *an, an_result *r, moh_error *err) {
    memset(r, 0, sizeof *r);
    const an_shape *s = &an->s;
    const int L = s->layers, h = s->heads, hs = s->shared, E = s->routed, C = s->categories, d = s->head_dim;
    const size_t per = (size_t)h * C * 2 + h + (size_t)E * C + E + (size_t)h * h * 2 + h * 3;
    const size_t total = per * L + C + (size_t)d * d;
    double *buf = malloc(sizeof(double) * total);
    an_layer_result *layers = calloc((size_t)L, sizeof *layers);
    if (!buf || !layers) {
        free(buf);
        free(layers);
        return moh_fail(err, MOH_E_NOMEM, "analysis: out of memory for the results");
    }
    r->s = *s;
    r->layer = layers;
    r->block = buf;
    double *tmp = buf + per * L, *gc = tmp + C;
    for (int l = 0; l < L; l++) {
        an_layer_result *y = &layers[l];
        double *b = buf + per * l;
        y->density = b;
        b += (size_t)h * C;
        y->score_mean = b;
        b += (size_t)h * C;
        y->score_cv = b;
        b += h;
        y->p_mean = E ? b : NULL;
        b += (size_t)E * C;
        y->p_cv = E ? b : NULL;
        b += E;
        y->att_pair = b;
        b += (size_t)h * h;
        y->out_pair = b;
        b += (size_t)h * h;
        y->erank = b;
        b += h;
        y->erank_tokens = b;
        b += h;
        y->erank_c = b;
        const double *tok = an->tokens + (size_t)l * C;
        for (int i = 0; i < h; i++) {
            const double *sel = an->sel + ((size_t)l * h + i) * C;
            const double *ss = an->score_sum + ((size_t)l * h + i) * C;
            for (int c = 0; c < C; c++) {
                const double cnt = i < hs ? tok[c] : sel[c];
                y->density[(size_t)i * C + c] = tok[c] > 0 ? sel[c] / tok[c] : NAN;
                y->score_mean[(size_t)i * C + c] = cnt > 0 ? ss[c] / cnt : NAN;
            }
            y->score_cv[i] = cv_row(y->score_mean + (size_t)i * C, C, tmp);
        }
        for (int e = 0; e < E; e++) {
            const double *ps = an->p_sum + ((size_t)l * E + e) * C;
            for (int c = 0; c < C; c++) y->p_mean[(size_t)e * C + c] = tok[c] > 0 ? ps[c] / tok[c] : NAN;
            y->p_cv[e] = cv_row(y->p_mean + (size_t)e * C, C, tmp);
        }
        y->cv_shared = hs ? mean_finite(y->score_cv, hs, 1) : NAN;
        y->cv_routed = E ? mean_finite(y->score_cv + hs, E, 1) : NAN;
        y->cv_routed_p = E ? mean_finite(y->p_cv, E, 1) : NAN;
        for (int i = 0; i < h; i++)
            for (int j = 0; j < h; j++) {
                const size_t k = (size_t)i * h + j;
                if (i == j) {
                    y->att_pair[k] = y->out_pair[k] = 1.0;
                    continue;
                }
                const int a = i < j ? i : j, c = i < j ? j : i;
                const size_t src = ((size_t)l * h + a) * h + c;
                y->att_pair[k] = an->att_cnt[src] > 0 ? an->att_sum[src] / an->att_cnt[src] : NAN;
                y->out_pair[k] = an->out_cnt[src] > 0 ? an->out_sum[src] / an->out_cnt[src] : NAN;
            }
        y->att_sim = pair_groups(y->att_pair, h, hs);
        y->out_sim = pair_groups(y->out_pair, h, hs);
        y->att_sim_alltok = pair_groups_raw(an->att_sum_all, an->att_cnt_all, l, h, hs);
        y->out_sim_alltok = pair_groups_raw(an->out_sum_all, an->out_cnt_all, l, h, hs);
        for (int i = 0; i < h; i++) {
            const double n = an->gram_n[(size_t)l * h + i];
            y->erank_tokens[i] = n;
            const double *G = an->gram + ((size_t)l * h + i) * d * d, *os = an->osum + ((size_t)l * h + i) * d;
            y->erank[i] = n > 0 ? an_effective_rank_gram(G, d) : NAN;
            for (int u = 0; u < d; u++)
                for (int v = 0; v < d; v++) gc[(size_t)u * d + v] = n > 0 ? G[(size_t)u * d + v] - os[u] * os[v] / n : 0;
            y->erank_c[i] = n > 1 ? an_effective_rank_gram(gc, d) : NAN;
        }
        y->erank_c_shared = hs ? mean_finite(y->erank_c, hs, 1) : NAN;
        y->erank_c_routed = E ? mean_finite(y->erank_c + hs, E, 1) : NAN;
        y->erank_c_all = mean_finite(y->erank_c, h, 1);
        y->erank_shared = hs ? mean_finite(y->erank, hs, 1) : NAN;
        y->erank_routed = E ? mean_finite(y->erank + hs, E, 1) : NAN;
        y->erank_all = mean_finite(y->erank, h, 1);
    }
    return MOH_OK;
}

void an_result_free(an_result *r) {
    if (!r) return;
    free(r->block);
    free(r->layer);
    memset(r, 0, sizeof *r);
}

double an_score_quantile(const analysis *an, int l, int i, int c, double q) {
    const an_shape *s = &an->s;
    const double *hist = an->hist + (((size_t)l * s->heads + i) * s->categories + c) * AN_SCORE_BINS;
    double total = 0;
    for (int k = 0; k < AN_SCORE_BINS; k++) total += hist[k];
    if (!(total > 0)) return NAN;
    const double target = q * total, w = s->score_max / AN_SCORE_BINS;
    double cum = 0;
    for (int k = 0; k < AN_SCORE_BINS; k++) {
        if (hist[k] > 0 && cum + hist[k] >= target) {
            const double f = (target - cum) / hist[k];
            return (k + (f < 0 ? 0 : f)) * w;
        }
        cum += hist[k];
    }
    return s->score_max;
}

/* ---- output --------------------------------------------------------------------------------- */

static void jnum(FILE *f, double v) {
    if (isfinite(v)) fprintf(f, "%.6g", v);
    else fputs("null", f);
}

static void jstr(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
        if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
        else if (*p < 0x20) fprintf(f, "\\u%04x", *p);
        else fputc(*p, f);
    }
    fputc('"', f);
}

static void jarr(FILE *f, const double *x, int n, int stride) {
    fputc('[', f);
    for (int i = 0; i < n; i++) {
        if (i) fputs(", ", f);
        jnum(f, x[(size_t)i * stride]);
    }
    fputc(']', f);
}

static void jmat(FILE *f, const double *x, int rows, int cols, const char *indent) {
    fputc('[', f);
    for (int i = 0; i < rows; i++) {
        fprintf(f, "%s\n%s", i ? "," : "", indent);
        jarr(f, x + (size_t)i * cols, cols, 1);
    }
    fputc(']', f);
}

static void jpairs(FILE *f, const an_pairs *p) {
    fputs("{\"all\": ", f);
    jnum(f, p->all);
    fputs(", \"shared_shared\": ", f);
    jnum(f, p->shared_shared);
    fputs(", \"shared_routed\": ", f);
    jnum(f, p->shared_routed);
    fputs(", \"routed_routed\": ", f);
    jnum(f, p->routed_routed);
    fprintf(f, ", \"pairs\": %d}", p->pairs);
}

/* Output files are written as PATH.tmp, fsynced and renamed over PATH by close_out, so an error
 * (a full disk) never leaves a truncated table in place of an earlier good one. */
static FILE *open_out(const char *dir, const char *name, char *path, size_t cap, moh_error *err) {
    snprintf(path, cap, "%s/%s", dir, name);
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) moh_fail(err, MOH_E_IO, "%s: cannot write: %s", tmp, strerror(errno));
    return f;
}

static int close_out(FILE *f, const char *path, moh_error *err) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    bool bad = fflush(f) != 0 || ferror(f) != 0 || fsync(fileno(f)) != 0;
    int e = errno;
    if (fclose(f) != 0 && !bad) {
        bad = true;
        e = errno;
    }
    if (!bad && rename(tmp, path) != 0) {
        bad = true;
        e = errno;
    }
    if (bad) {
        remove(tmp);
        return moh_fail(err, MOH_E_IO, "%s: write failed: %s", path, strerror(e));
    }
    return MOH_OK;
}

/* Mean over layers of a per-layer number (NaN entries skipped). */
static double layer_mean(const an_result *r, size_t offset) {
    double s = 0;
    int n = 0;
    for (int l = 0; l < r->s.layers; l++) {
        const double v = *(const double *)((const char *)&r->layer[l] + offset);
        if (isfinite(v)) {
            s += v;
            n++;
        }
    }
    return n ? s / n : NAN;
}

static void jsummary(FILE *f, const an_result *r, bool routed) {
    const an_layer_result *fin = &r->layer[r->s.layers - 1];
    fputs("{\"mean_over_layers\": {\"attention_similarity\": ", f);
    jnum(f, layer_mean(r, offsetof(an_layer_result, att_sim.all)));
    fputs(", \"output_similarity\": ", f);
    jnum(f, layer_mean(r, offsetof(an_layer_result, out_sim.all)));
    if (routed) {
        fputs(", \"attention_similarity_all_tokens\": ", f);
        jnum(f, layer_mean(r, offsetof(an_layer_result, att_sim_alltok.all)));
        fputs(", \"output_similarity_all_tokens\": ", f);
        jnum(f, layer_mean(r, offsetof(an_layer_result, out_sim_alltok.all)));
    }
    fputs(", \"effective_rank\": ", f);
    jnum(f, layer_mean(r, offsetof(an_layer_result, erank_all)));
    fputs(", \"effective_rank_centred\": ", f);
    jnum(f, layer_mean(r, offsetof(an_layer_result, erank_c_all)));
    if (routed) {
        fputs(", \"effective_rank_shared\": ", f);
        jnum(f, layer_mean(r, offsetof(an_layer_result, erank_shared)));
        fputs(", \"effective_rank_routed\": ", f);
        jnum(f, layer_mean(r, offsetof(an_layer_result, erank_routed)));
        fputs(", \"effective_rank_centred_shared\": ", f);
        jnum(f, layer_mean(r, offsetof(an_layer_result, erank_c_shared)));
        fputs(", \"effective_rank_centred_routed\": ", f);
        jnum(f, layer_mean(r, offsetof(an_layer_result, erank_c_routed)));
        fputs(", \"score_cv_shared\": ", f);
        jnum(f, layer_mean(r, offsetof(an_layer_result, cv_shared)));
        fputs(", \"score_cv_routed\": ", f);
        jnum(f, layer_mean(r, offsetof(an_layer_result, cv_routed)));
        fputs(", \"score_cv_routed_p\": ", f);
        jnum(f, layer_mean(r, offsetof(an_layer_result, cv_routed_p)));
    }
    fputs("}, \"final_layer\": {\"attention_similarity\": ", f);
    jnum(f, fin->att_sim.all);
    fputs(", \"output_similarity\": ", f);
    jnum(f, fin->out_sim.all);
    fputs(", \"effective_rank\": ", f);
    jnum(f, fin->erank_all);
    if (routed) {
        fputs(", \"effective_rank_shared\": ", f);
        jnum(f, fin->erank_shared);
        fputs(", \"effective_rank_routed\": ", f);
        jnum(f, fin->erank_routed);
        fputs(", \"score_cv_shared\": ", f);
        jnum(f, fin->cv_shared);
        fputs(", \"score_cv_routed\": ", f);
        jnum(f, fin->cv_routed);
    }
    fputs("}}", f);
}

static const char *head_kind(const an_shape *s, int i) {
    if (s->routed == 0) return "dense";
    return i < s->shared ? "shared" : "routed";
}

static int write_json(const char *dir, const an_meta *m, const analysis *an, const an_result *r,
                      const an_meta *cm, const an_result *cmp, moh_error *err) {
    char path[4096];
    FILE *f = open_out(dir, "analysis.json", path, sizeof path, err);
    if (!f) return MOH_E_IO;
    const an_shape *s = &r->s;
    const int L = s->layers, h = s->heads, C = s->categories;
    const bool routed = s->routed > 0;
    fputs("{\n  \"model\": {\"type\": ", f);
    jstr(f, m->model_type);
    fputs(", \"checkpoint\": ", f);
    jstr(f, m->checkpoint);
    fputs(", \"router\": ", f);
    jstr(f, m->router);
    fprintf(f, ", \"heads\": %d, \"shared_heads\": %d, \"routed_heads\": %d, \"top_k\": %d, \"head_dim\": %d},\n",
            h, s->shared, s->routed, m->top_k, s->head_dim);
    if (m->layer_shared && m->layer_top_k) { /* per analysed layer (the model line has the widest) */
        fputs("  \"layer_heads\": [", f);
        for (int l = 0; l < L; l++)
            fprintf(f, "%s{\"layer\": %d, \"shared_heads\": %d, \"top_k\": %d}", l ? ", " : "", m->layer_index[l],
                    m->layer_shared[l], m->layer_top_k[l]);
        fputs("],\n", f);
    }
    fputs("  \"data\": {\"source\": ", f);
    jstr(f, m->data);
    fputs(", \"note\": ", f);
    jstr(f, m->data_note);
    fputs(", \"tokens_per_category\": ", f);
    double *tok = malloc(sizeof(double) * (size_t)C);
    if (tok) {
        for (int c = 0; c < C; c++) tok[c] = an->tokens[(size_t)(L - 1) * C + c];
        jarr(f, tok, C, 1);
        free(tok);
    } else {
        fputs("null", f);
    }
    fputs("},\n", f);
    fputs("  \"estimators\": {\n"
          "    \"density\": \"tokens of the category whose gate for the head is non-zero / tokens of the category (shared heads: 1)\",\n"
          "    \"score\": \"gate value g_i of spec 1 (factors 2, h_s, K included): shared heads a1*s_i over every token; routed heads a2*r_i over the tokens that select the head; also routed_p_mean: router probability p_i over every token\",\n"
          "    \"score_cv\": \"per head: population std over categories of the mean score in the category / mean over categories; averaged over shared heads and over routed heads (routed_p: the same for p)\",\n"
          "    \"attention_similarity\": \"1 - 0.5*||A_i[q] - A_j[q]||_1, mean over the query tokens that select both heads (all positions), then mean over unordered head pairs\",\n"
          "    \"output_similarity\": \"cosine of the head outputs o_i[t], o_j[t] (before gating) at the same token, mean over tokens selecting both heads, then over head pairs\",\n"
          "    \"similarity_all_tokens\": \"the same two similarities over every token, selected or not (the reference path computes every head at every token); equal to the above for a dense model\",\n"
          "    \"effective_rank\": \"Roy & Vetterli 2007: exp(entropy of sigma/sum(sigma)) of the uncentred [tokens x head_dim] matrix of the head's outputs over the tokens that select it; sigma = sqrt(eigenvalues of the head_dim x head_dim Gram matrix), float64 cyclic Jacobi; effective_rank_centred: the same after subtracting the head's mean output\"\n"
          "  },\n",
          f);
    fputs("  \"categories\": [", f);
    for (int c = 0; c < C; c++) {
        if (c) fputs(", ", f);
        jstr(f, m->categories[c]);
    }
    fputs("],\n  \"layers\": [", f);
    for (int l = 0; l < L; l++) {
        const an_layer_result *y = &r->layer[l];
        fprintf(f, "%s\n    {\"layer\": %d,\n     \"density\": ", l ? "," : "", m->layer_index[l]);
        jmat(f, y->density, h, C, "       ");
        fputs(",\n     \"score_mean\": ", f);
        jmat(f, y->score_mean, h, C, "       ");
        if (routed) {
            fputs(",\n     \"routed_p_mean\": ", f);
            jmat(f, y->p_mean, s->routed, C, "       ");
            fputs(",\n     \"score_cv\": {\"shared\": ", f);
            jnum(f, y->cv_shared);
            fputs(", \"routed\": ", f);
            jnum(f, y->cv_routed);
            fputs(", \"routed_p\": ", f);
            jnum(f, y->cv_routed_p);
            fputs(", \"per_head\": ", f);
            jarr(f, y->score_cv, h, 1);
            fputs(", \"per_routed_head_p\": ", f);
            jarr(f, y->p_cv, s->routed, 1);
            fputs("}", f);
        } else {
            fputs(",\n     \"score_cv\": {\"shared\": null, \"routed\": null, \"note\": \"no router: every gate is 1\"}", f);
        }
        fputs(",\n     \"attention_similarity\": ", f);
        jnum(f, y->att_sim.all);
        fputs(", \"attention_similarity_groups\": ", f);
        jpairs(f, &y->att_sim);
        fputs(",\n     \"output_similarity\": ", f);
        jnum(f, y->out_sim.all);
        fputs(", \"output_similarity_groups\": ", f);
        jpairs(f, &y->out_sim);
        fputs(",\n     \"attention_similarity_all_tokens\": ", f);
        jpairs(f, &y->att_sim_alltok);
        fputs(",\n     \"output_similarity_all_tokens\": ", f);
        jpairs(f, &y->out_sim_alltok);
        fputs(",\n     \"effective_rank\": ", f);
        jarr(f, y->erank, h, 1);
        fputs(", \"effective_rank_mean\": {\"all\": ", f);
        jnum(f, y->erank_all);
        fputs(", \"shared\": ", f);
        jnum(f, y->erank_shared);
        fputs(", \"routed\": ", f);
        jnum(f, y->erank_routed);
        fputs("}, \"effective_rank_tokens\": ", f);
        jarr(f, y->erank_tokens, h, 1);
        fputs(",\n     \"effective_rank_centred\": ", f);
        jarr(f, y->erank_c, h, 1);
        fputs(", \"effective_rank_centred_mean\": {\"all\": ", f);
        jnum(f, y->erank_c_all);
        fputs(", \"shared\": ", f);
        jnum(f, y->erank_c_shared);
        fputs(", \"routed\": ", f);
        jnum(f, y->erank_c_routed);
        fputs("}", f);
        fputs("}", f);
    }
    fputs("\n  ],\n  \"summary\": ", f);
    jsummary(f, r, routed);
    if (cmp) {
        fputs(",\n  \"compare\": {\"checkpoint\": ", f);
        jstr(f, cm->checkpoint);
        fputs(", \"router\": ", f);
        jstr(f, cm->router);
        fprintf(f, ", \"heads\": %d, \"layers\": [", cmp->s.heads);
        for (int l = 0; l < cmp->s.layers; l++) {
            const an_layer_result *y = &cmp->layer[l];
            fprintf(f, "%s\n    {\"layer\": %d, \"attention_similarity\": ", l ? "," : "", cm->layer_index[l]);
            jnum(f, y->att_sim.all);
            fputs(", \"output_similarity\": ", f);
            jnum(f, y->out_sim.all);
            fputs(", \"effective_rank\": ", f);
            jarr(f, y->erank, cmp->s.heads, 1);
            fputs(", \"effective_rank_mean\": ", f);
            jnum(f, y->erank_all);
            fputs(", \"effective_rank_centred_mean\": ", f);
            jnum(f, y->erank_c_all);
            fputs("}", f);
        }
        fputs("\n  ], \"summary\": ", f);
        jsummary(f, cmp, cmp->s.routed > 0);
        fputs("}", f);
    }
    fputs("\n}\n", f);
    return close_out(f, path, err);
}

static void csv_field(FILE *f, const char *s) {
    bool quote = strpbrk(s, ",\"\n") != NULL;
    if (!quote) {
        fputs(s, f);
        return;
    }
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"') fputc('"', f);
        fputc(*s, f);
    }
    fputc('"', f);
}

static void cnum(FILE *f, double v) {
    if (isfinite(v)) fprintf(f, "%.6g", v);
}

static int write_csv(const char *dir, const an_meta *m, const analysis *an, const an_result *r,
                     const an_meta *cm, const an_result *cmp, moh_error *err) {
    char path[4096];
    const an_shape *s = &r->s;
    const int L = s->layers, h = s->heads, C = s->categories;
    FILE *f = open_out(dir, "density.csv", path, sizeof path, err);
    if (!f) return MOH_E_IO;
    fputs("layer,head,kind", f);
    for (int c = 0; c < C; c++) {
        fputc(',', f);
        csv_field(f, m->categories[c]);
    }
    fputc('\n', f);
    for (int l = 0; l < L; l++)
        for (int i = 0; i < h; i++) {
            fprintf(f, "%d,%d,%s", m->layer_index[l], i, head_kind(s, i));
            for (int c = 0; c < C; c++) {
                fputc(',', f);
                cnum(f, r->layer[l].density[(size_t)i * C + c]);
            }
            fputc('\n', f);
        }
    if (close_out(f, path, err)) return MOH_E_IO;

    if (!(f = open_out(dir, "scores.csv", path, sizeof path, err))) return MOH_E_IO;
    fputs("layer,head,kind,category,density,score_mean,score_q05,score_q25,score_q50,score_q75,score_q95,router_p_mean\n", f);
    static const double qs[5] = {0.05, 0.25, 0.5, 0.75, 0.95};
    for (int l = 0; l < L; l++)
        for (int i = 0; i < h; i++)
            for (int c = 0; c < C; c++) {
                fprintf(f, "%d,%d,%s,", m->layer_index[l], i, head_kind(s, i));
                csv_field(f, m->categories[c]);
                fputc(',', f);
                cnum(f, r->layer[l].density[(size_t)i * C + c]);
                fputc(',', f);
                cnum(f, r->layer[l].score_mean[(size_t)i * C + c]);
                for (int k = 0; k < 5; k++) {
                    fputc(',', f);
                    cnum(f, an_score_quantile(an, l, i, c, qs[k]));
                }
                fputc(',', f);
                if (i >= s->shared && s->routed > 0)
                    cnum(f, r->layer[l].p_mean[(size_t)(i - s->shared) * C + c]);
                fputc('\n', f);
            }
    if (close_out(f, path, err)) return MOH_E_IO;

    if (!(f = open_out(dir, "effective_rank.csv", path, sizeof path, err))) return MOH_E_IO;
    fputs("model,layer,head,kind,effective_rank,tokens,effective_rank_centred\n", f);
    for (int k = 0; k < (cmp ? 2 : 1); k++) {
        const an_result *x = k ? cmp : r;
        const an_meta *mm = k ? cm : m;
        for (int l = 0; l < x->s.layers; l++)
            for (int i = 0; i < x->s.heads; i++) {
                fprintf(f, "%s,%d,%d,%s,", k ? "compare" : "model", mm->layer_index[l], i, head_kind(&x->s, i));
                cnum(f, x->layer[l].erank[i]);
                fprintf(f, ",%.0f,", x->layer[l].erank_tokens[i]);
                cnum(f, x->layer[l].erank_c[i]);
                fputc('\n', f);
            }
    }
    if (close_out(f, path, err)) return MOH_E_IO;

    if (!(f = open_out(dir, "similarity.csv", path, sizeof path, err))) return MOH_E_IO;
    fputs("model,layer,attention_similarity,output_similarity,att_shared_shared,att_shared_routed,"
          "att_routed_routed,out_shared_shared,out_shared_routed,out_routed_routed,"
          "attention_similarity_all_tokens,output_similarity_all_tokens\n", f);
    for (int k = 0; k < (cmp ? 2 : 1); k++) {
        const an_result *x = k ? cmp : r;
        const an_meta *mm = k ? cm : m;
        for (int l = 0; l < x->s.layers; l++) {
            const an_layer_result *y = &x->layer[l];
            fprintf(f, "%s,%d,", k ? "compare" : "model", mm->layer_index[l]);
            const double v[10] = {y->att_sim.all, y->out_sim.all, y->att_sim.shared_shared,
                                  y->att_sim.shared_routed, y->att_sim.routed_routed,
                                  y->out_sim.shared_shared, y->out_sim.shared_routed, y->out_sim.routed_routed,
                                  y->att_sim_alltok.all, y->out_sim_alltok.all};
            for (int q = 0; q < 10; q++) {
                if (q) fputc(',', f);
                cnum(f, v[q]);
            }
            fputc('\n', f);
        }
    }
    if (close_out(f, path, err)) return MOH_E_IO;

    if (!(f = open_out(dir, "head_pairs.csv", path, sizeof path, err))) return MOH_E_IO;
    fputs("model,layer,head_i,head_j,kind,attention_similarity,output_similarity\n", f);
    for (int k = 0; k < (cmp ? 2 : 1); k++) {
        const an_result *x = k ? cmp : r;
        const an_meta *mm = k ? cm : m;
        const int hh = x->s.heads;
        for (int l = 0; l < x->s.layers; l++)
            for (int i = 0; i < hh; i++)
                for (int j = i + 1; j < hh; j++) {
                    fprintf(f, "%s,%d,%d,%d,%s-%s,", k ? "compare" : "model", mm->layer_index[l], i, j,
                            head_kind(&x->s, i), head_kind(&x->s, j));
                    cnum(f, x->layer[l].att_pair[(size_t)i * hh + j]);
                    fputc(',', f);
                    cnum(f, x->layer[l].out_pair[(size_t)i * hh + j]);
                    fputc('\n', f);
                }
    }
    return close_out(f, path, err);
}

int an_write_outputs(const char *dir, const an_meta *meta, const analysis *an, const an_result *r,
                     const an_meta *cmp_meta, const an_result *cmp, moh_error *err) {
    int rc = write_json(dir, meta, an, r, cmp_meta, cmp, err);
    if (!rc) rc = write_csv(dir, meta, an, r, cmp_meta, cmp, err);
    return rc;
}

/* ---- presentation --------------------------------------------------------------------------- */

void an_print_table(FILE *f, const char *label, const an_result *r, const int *layer_index) {
    const bool routed = r->s.routed > 0;
    fprintf(f, "%s, per layer:\n  %5s %9s %9s", label, "layer", "att_sim", "out_cos");
    if (routed) fprintf(f, " %9s %9s %9s %9s\n", "erank_sh", "erank_rt", "cv_sh", "cv_rt");
    else fprintf(f, " %9s\n", "erank");
    for (int l = 0; l < r->s.layers; l++) {
        const an_layer_result *y = &r->layer[l];
        fprintf(f, "  %5d %9.4f %9.4f", layer_index[l], y->att_sim.all, y->out_sim.all);
        if (routed)
            fprintf(f, " %9.2f %9.2f %9.4f %9.4f\n", y->erank_shared, y->erank_routed, y->cv_shared, y->cv_routed);
        else fprintf(f, " %9.2f\n", y->erank_all);
    }
}

void an_print_legend(FILE *f, bool routed) {
    fputs("columns: att_sim  attention-pattern similarity of head pairs, 1 - 0.5 E|A - A'|_1 (0..1, 1 = same)\n"
          "         out_cos  cosine of head outputs before gating (-1..1, 0 = orthogonal)\n"
          "                  (both: mean over the tokens selecting both heads, then over head pairs)\n"
          "         erank    effective rank of head outputs (dimensions, 1..head_dim), mean over heads\n",
          f);
    if (routed)
        fputs("                  (_sh / _rt: over shared / routed heads)\n"
              "         cv       CV across categories of a head's mean routing score (std / mean, no unit)\n"
              "                  (_sh / _rt: mean over shared / routed heads)\n",
              f);
}

/* "12 s", "3m05s", "2h03m"; "?" when not finite or negative. */
static void fmt_duration(char *buf, size_t cap, double s) {
    if (!(s >= 0) || !isfinite(s)) snprintf(buf, cap, "?");
    else if (s < 99.5) snprintf(buf, cap, "%.0f s", s);
    else if (s < 3600) snprintf(buf, cap, "%dm%02ds", (int)(s + 0.5) / 60, (int)(s + 0.5) % 60);
    else if (s < 1e8) snprintf(buf, cap, "%dh%02dm", (int)(s / 3600), (int)(s / 60) % 60);
    else snprintf(buf, cap, "?");
}

char *an_progress_text(char *buf, size_t cap, double done, double total, const char *unit, double elapsed_s) {
    char el[32], eta[32], rate[48];
    const bool moving = done > 0 && elapsed_s > 0;
    fmt_duration(el, sizeof el, elapsed_s);
    fmt_duration(eta, sizeof eta, moving ? (total - done) * elapsed_s / done : NAN);
    if (moving) snprintf(rate, sizeof rate, "%.0f %s/s", done / elapsed_s, unit);
    else snprintf(rate, sizeof rate, "? %s/s", unit);
    snprintf(buf, cap, "%.0f/%.0f %s (%.0f %%), %s, elapsed %s, ETA %s", done, total, unit,
             total > 0 ? 100 * done / total : 0, rate, el, eta);
    return buf;
}

double an_nice_step(double span, int n) {
    if (!(span > 0) || !isfinite(span) || n < 1) return 1;
    const double raw = span / n, p = pow(10, floor(log10(raw))), m = raw / p;
    return (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10) * p;
}

void an_axis_range(const double *x, int n, double pad, int nticks, double *lo, double *hi, double *step) {
    double mn = 0, mx = 0;
    for (int i = 0; i < n; i++)
        if (isfinite(x[i])) {
            if (x[i] < mn) mn = x[i];
            if (x[i] > mx) mx = x[i];
        }
    if (!(mx > mn)) {
        *lo = 0;
        *hi = 1;
        *step = an_nice_step(1, nticks);
        return;
    }
    const double span = mx - mn;
    if (mx > 0) mx += pad * span;
    if (mn < 0) mn -= pad * span;
    const double st = an_nice_step(mx - mn, nticks);
    *step = st;
    *lo = st * floor(mn / st + 1e-9);
    *hi = st * ceil(mx / st - 1e-9);
}
