/* Head statistics (src/analysis): effective rank of matrices with known spectra (rank 1, d
 * orthonormal columns, a given spectrum under a rotation), the Jacobi eigen solver, attention
 * similarity (identical rows 1, disjoint one-hot rows 0, a half overlap 0.5), cosine, CV, and the
 * accumulator on a hand-made batch (density, score means, CV, pair similarity, rank token counts,
 * quantiles), then the JSON/CSV outputs and, when built with cairo, the plots; the families'
 * analysis hooks (open_analysis: batches, categories, tokens, pixels); last, `moh analyze`
 * end to end (MOH_BIN) on tiny random LM and ViT checkpoints with dense twins, and its errors. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "analysis/analysis.h"
#include "core/fsutil.h"
#include "models/lm.h"
#include "models/vit.h"
#include "test_util.h"
#include "train/checkpoint.h"

/* G = X^T X of an n x d matrix X. */
static void gram(const double *X, int n, int d, double *G) {
    for (int u = 0; u < d; u++)
        for (int v = 0; v < d; v++) {
            double s = 0;
            for (int t = 0; t < n; t++) s += X[t * d + u] * X[t * d + v];
            G[u * d + v] = s;
        }
}

/* A random orthogonal d x d matrix Q (Gram-Schmidt of a random matrix). */
static void random_orthogonal(double *Q, int d, test_rng *rng) {
    for (int i = 0; i < d * d; i++) Q[i] = test_rng_uniform(rng);
    for (int i = 0; i < d; i++) { /* rows */
        for (int j = 0; j < i; j++) {
            double dot = 0;
            for (int k = 0; k < d; k++) dot += Q[i * d + k] * Q[j * d + k];
            for (int k = 0; k < d; k++) Q[i * d + k] -= dot * Q[j * d + k];
        }
        double nrm = 0;
        for (int k = 0; k < d; k++) nrm += Q[i * d + k] * Q[i * d + k];
        nrm = sqrt(nrm);
        for (int k = 0; k < d; k++) Q[i * d + k] /= nrm;
    }
}

static void test_rank(test_ctx *ctx) {
    test_rng rng = {0x9e3779b97f4a7c15ULL};
    enum { D = 8, NT = 40 };
    double X[NT * D], G[D * D], Q[D * D];
    /* rank 1: x_t = a_t * v */
    double v[D];
    for (int k = 0; k < D; k++) v[k] = test_rng_uniform(&rng);
    for (int t = 0; t < NT; t++) {
        const double a = test_rng_uniform(&rng);
        for (int k = 0; k < D; k++) X[t * D + k] = a * v[k];
    }
    gram(X, NT, D, G);
    double r = an_effective_rank_gram(G, D);
    CHECK(ctx, fabs(r - 1.0) < 1e-6, "rank-1 matrix: effective rank %.9f, expected 1", r);
    /* d orthonormal columns (the first D rows of a rotation, other rows 0): every sigma is 1 */
    random_orthogonal(Q, D, &rng);
    memset(X, 0, sizeof X);
    memcpy(X, Q, sizeof Q);
    gram(X, NT, D, G);
    r = an_effective_rank_gram(G, D);
    CHECK(ctx, fabs(r - D) < 1e-9, "orthonormal columns: effective rank %.12f, expected %d", r, D);
    /* known spectrum sigma = (3, 1, 0, ..., 0) rotated: X = diag(sigma) Q */
    memset(X, 0, sizeof X);
    for (int k = 0; k < D; k++) {
        X[0 * D + k] = 3 * Q[0 * D + k];
        X[1 * D + k] = 1 * Q[1 * D + k];
    }
    gram(X, NT, D, G);
    const double expect = exp(-(0.75 * log(0.75) + 0.25 * log(0.25)));
    r = an_effective_rank_gram(G, D);
    CHECK(ctx, fabs(r - expect) < 1e-6, "spectrum (3, 1): effective rank %.9f, expected %.9f", r, expect);
    /* the same spectrum straight from singular values; zeros and negatives ignored */
    const double sv[4] = {3, 1, 0, -1};
    r = an_effective_rank_sv(sv, 4);
    CHECK(ctx, fabs(r - expect) < 1e-12, "an_effective_rank_sv: %.12f, expected %.12f", r, expect);
    const double sv4[4] = {2, 2, 2, 2};
    CHECK(ctx, fabs(an_effective_rank_sv(sv4, 4) - 4) < 1e-12, "flat spectrum of 4: rank 4");
    const double zero[3] = {0, 0, 0};
    CHECK(ctx, an_effective_rank_sv(zero, 3) == 0, "all-zero spectrum: rank 0");
    /* Jacobi eigenvalues: [[2,1],[1,2]] -> 3, 1; a rotated diag(5, 2, -1, 0.5) */
    double A2[4] = {2, 1, 1, 2}, w2[2];
    an_jacobi_eigenvalues(A2, 2, w2);
    CHECK(ctx, fabs(w2[0] - 3) < 1e-12 && fabs(w2[1] - 1) < 1e-12, "eig [[2,1],[1,2]] = %g, %g", w2[0], w2[1]);
    enum { M = 4 };
    const double lam[M] = {5, 2, -1, 0.5};
    double R[M * M], A4[M * M], w4[M];
    random_orthogonal(R, M, &rng);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < M; j++) {
            double s = 0;
            for (int k = 0; k < M; k++) s += R[k * M + i] * lam[k] * R[k * M + j];
            A4[i * M + j] = s;
        }
    an_jacobi_eigenvalues(A4, M, w4);
    const double sorted[M] = {5, 2, 0.5, -1};
    double e = 0;
    for (int k = 0; k < M; k++) e = fmax(e, fabs(w4[k] - sorted[k]));
    CHECK(ctx, e < 1e-10, "eig of R^T diag(5,2,-1,0.5) R: max error %g", e);
}

static void test_primitives(test_ctx *ctx) {
    const float a[4] = {0.1f, 0.2f, 0.3f, 0.4f};
    CHECK(ctx, fabs(an_attention_similarity(a, a, 4) - 1) < 1e-12, "identical rows: similarity 1");
    const float e0[3] = {1, 0, 0}, e2[3] = {0, 0, 1};
    CHECK(ctx, fabs(an_attention_similarity(e0, e2, 3)) < 1e-12, "disjoint one-hot rows: similarity 0");
    const float h1[3] = {0.5f, 0.5f, 0}, h2[3] = {0, 0.5f, 0.5f};
    CHECK(ctx, fabs(an_attention_similarity(h1, h2, 3) - 0.5) < 1e-7, "half overlap: similarity 0.5");
    bool ok;
    const float x[3] = {1, 2, 3}, y[3] = {-2, -4, -6}, z[3] = {0, 0, 0}, o[3] = {3, 0, -1};
    CHECK(ctx, fabs(an_cosine(x, y, 3, &ok) + 1) < 1e-12 && ok, "cosine of opposite vectors -1");
    CHECK(ctx, fabs(an_cosine(x, o, 3, &ok)) < 1e-12 && ok, "cosine of orthogonal vectors 0");
    an_cosine(x, z, 3, &ok);
    CHECK(ctx, !ok, "cosine with a zero vector is undefined");
    const double c5[5] = {0.7, 0.7, 0.7, 0.7, 0.7}, c2[2] = {1, 3}, zm[2] = {-1, 1};
    CHECK(ctx, an_cv(c5, 5) == 0, "CV of a constant is 0");
    CHECK(ctx, fabs(an_cv(c2, 2) - 0.5) < 1e-12, "CV of (1, 3): population std 1 / mean 2 = 0.5");
    CHECK(ctx, isnan(an_cv(zm, 2)), "CV with mean 0 is undefined");
    CHECK(ctx, isnan(an_cv(c2, 0)), "CV of nothing is undefined");
}

/* Hand-made batch: h = 3 heads (head 0 shared, heads 1-2 routed, top-1), d = 2, 2 categories,
 * B = 2 rows (row 0 category 0, row 1 category 1) of N = 2 tokens. */
static void test_accumulator(test_ctx *ctx) {
    enum { H = 3, D = 2, C = 2, B = 2, N = 2, T = B * N, E = 2 };
    an_shape s = {1, H, 1, E, D, C, 2.0 * H};
    analysis an;
    moh_error err = {0};
    CHECK(ctx, an_init(&an, &s, &err) == MOH_OK, "an_init: %s", err.msg);
    an_shape bad = s;
    bad.shared = 2;
    analysis an_bad;
    CHECK(ctx, an_init(&an_bad, &bad, &err) == MOH_E_ARG && strstr(err.msg, "heads = shared + routed"),
          "heads != shared + routed rejected: %s", err.msg);
    const int cat[B] = {0, 1};
    /* gates [T, h]: shared gate varies; row 0 selects head 1 twice; row 1 selects head 1 then head 2 */
    const float gates[T * H] = {1.0f, 2.0f, 0.0f, /* t0 cat 0 */
                                3.0f, 1.0f, 0.0f, /* t1 cat 0 */
                                2.0f, 0.0f, 4.0f, /* t2 cat 1 */
                                2.0f, 1.5f, 0.0f}; /* t3 cat 1 */
    const float p[T * E] = {0.9f, 0.1f, 0.8f, 0.2f, 0.3f, 0.7f, 0.6f, 0.4f};
    /* head outputs [T, h d] */
    const float o[T * H * D] = {1, 0, 1, 0, 5, 5,   /* t0: heads 0,1 parallel */
                                0, 1, 1, 0, 5, 5,   /* t1: heads 0,1 orthogonal */
                                1, 1, 7, 7, -1, -1, /* t2: heads 0,2 opposite */
                                2, 0, 0, 3, 9, 9};  /* t3: heads 0,1 orthogonal */
    /* attention [B, h, N, N] (causal rows) */
    float att[B * H * N * N];
    for (int b = 0; b < B; b++)
        for (int i = 0; i < H; i++) {
            float *A = att + ((b * H + i) * N) * N;
            A[0] = 1;
            A[1] = 0;
            /* row 1: head 0 (0.5, 0.5), head 1 (1, 0), head 2 (0, 1) */
            A[2] = i == 0 ? 0.5f : i == 1 ? 1.0f : 0.0f;
            A[3] = 1 - A[2];
        }
    an_batch b = {B, N, cat, gates, p, o, att, true};
    CHECK(ctx, an_add(&an, 0, &b, &err) == MOH_OK, "an_add: %s", err.msg);
    const int badcat[B] = {0, 2};
    an_batch bb = b;
    bb.cat = badcat;
    CHECK(ctx, an_add(&an, 0, &bb, &err) == MOH_E_ARG && strstr(err.msg, "category 2"), "bad category: %s", err.msg);
    an_result r;
    CHECK(ctx, an_finish(&an, &r, &err) == MOH_OK, "an_finish: %s", err.msg);
    const an_layer_result *y = &r.layer[0];
    /* density [h, C] */
    const double dens[H * C] = {1, 1, 1, 0.5, 0, 0.5};
    for (int k = 0; k < H * C; k++)
        CHECK(ctx, fabs(y->density[k] - dens[k]) < 1e-12, "density[%d][%d] = %g, expected %g", k / C, k % C,
              y->density[k], dens[k]);
    /* scores: shared mean over all tokens; routed over selecting tokens (head 2 in cat 0: none) */
    const double sm[H * C] = {2.0, 2.0, 1.5, 1.5, NAN, 4.0};
    for (int k = 0; k < H * C; k++)
        CHECK(ctx, isnan(sm[k]) ? isnan(y->score_mean[k]) : fabs(y->score_mean[k] - sm[k]) < 1e-12,
              "score_mean[%d][%d] = %g, expected %g", k / C, k % C, y->score_mean[k], sm[k]);
    CHECK(ctx, y->score_cv[0] == 0 && y->score_cv[1] == 0, "constant mean scores: CV 0 (%g, %g)", y->score_cv[0],
          y->score_cv[1]);
    CHECK(ctx, isnan(y->score_cv[2]), "head seen in one category only: CV undefined");
    CHECK(ctx, y->cv_shared == 0 && y->cv_routed == 0, "group CVs %g %g", y->cv_shared, y->cv_routed);
    /* p means: head 1 cat 0 (0.9+0.8)/2, cat 1 (0.3+0.6)/2 */
    CHECK(ctx, fabs(y->p_mean[0] - 0.85) < 1e-6 && fabs(y->p_mean[1] - 0.45) < 1e-6, "p_mean %g %g", y->p_mean[0],
          y->p_mean[1]);
    const double pcv = (0.2) / 0.65; /* means 0.85, 0.45: std 0.2, mean 0.65 */
    CHECK(ctx, fabs(y->p_cv[0] - pcv) < 1e-6, "p_cv[0] = %g, expected %g", y->p_cv[0], pcv);
    /* attention similarity: pair (0,1) at t0 (both rows [1,0]) 1, t1 ([.5,.5] vs [1,0]) 0.5,
     * t3 0.5 -> mean 2/3; pair (0,2) at t2 (row 0 of b=1): 1; pair (1,2): never both */
    CHECK(ctx, fabs(y->att_pair[0 * H + 1] - 2.0 / 3) < 1e-7, "att sim (0,1) = %g, expected 2/3", y->att_pair[1]);
    CHECK(ctx, fabs(y->att_pair[1 * H + 0] - 2.0 / 3) < 1e-7, "att sim is symmetric");
    CHECK(ctx, fabs(y->att_pair[0 * H + 2] - 1) < 1e-7, "att sim (0,2) = %g, expected 1", y->att_pair[2]);
    CHECK(ctx, isnan(y->att_pair[1 * H + 2]), "pair (1,2) never co-selected: no value");
    CHECK(ctx, fabs(y->att_sim.all - (2.0 / 3 + 1) / 2) < 1e-7 && y->att_sim.pairs == 2,
          "mean over pairs with data: %g (%d pairs)", y->att_sim.all, y->att_sim.pairs);
    CHECK(ctx, fabs(y->att_sim.shared_routed - y->att_sim.all) < 1e-12 && isnan(y->att_sim.routed_routed) &&
                   isnan(y->att_sim.shared_shared),
          "pair groups");
    /* over every token: (0,1) (1 + .5 + 1 + .5)/4, (0,2) (1 + .5 + 1 + .5)/4, (1,2) (1 + 0 + 1 + 0)/4 */
    CHECK(ctx, fabs(y->att_sim_alltok.all - (0.75 + 0.75 + 0.5) / 3) < 1e-7 && y->att_sim_alltok.pairs == 3,
          "all-token attention similarity %g", y->att_sim_alltok.all);
    CHECK(ctx, fabs(y->att_sim_alltok.routed_routed - 0.5) < 1e-7, "all-token routed pair %g",
          y->att_sim_alltok.routed_routed);
    /* output cosine: (0,1): t0 1, t1 0, t3 0 -> 1/3; (0,2): t2 -1 */
    CHECK(ctx, fabs(y->out_pair[0 * H + 1] - 1.0 / 3) < 1e-7, "out cos (0,1) = %g, expected 1/3", y->out_pair[1]);
    CHECK(ctx, fabs(y->out_pair[0 * H + 2] + 1) < 1e-7, "out cos (0,2) = %g, expected -1", y->out_pair[2]);
    /* rank inputs: head 0 all 4 tokens, head 1 three, head 2 one (rank 1) */
    CHECK(ctx, y->erank_tokens[0] == 4 && y->erank_tokens[1] == 3 && y->erank_tokens[2] == 1, "rank token counts");
    CHECK(ctx, fabs(y->erank[2] - 1) < 1e-6, "one token: rank %g, expected 1", y->erank[2]);
    /* head 0 outputs (1,0),(0,1),(1,1),(2,0): Gram [[6,1],[1,2]] */
    const double G0[4] = {6, 1, 1, 2};
    CHECK(ctx, fabs(y->erank[0] - an_effective_rank_gram(G0, 2)) < 1e-12, "head 0 rank from its Gram matrix");
    const double G0c[4] = {2, -1, -1, 1}; /* mean (1, 0.5) removed */
    CHECK(ctx, fabs(y->erank_c[0] - an_effective_rank_gram(G0c, 2)) < 1e-12, "head 0 centred rank %g",
          y->erank_c[0]);
    CHECK(ctx, isnan(y->erank_c[2]), "one token: no centred rank");
    /* quantiles of head 0 in category 0: values 1 and 3 */
    const double q0 = an_score_quantile(&an, 0, 0, 0, 0.0), q1 = an_score_quantile(&an, 0, 0, 0, 1.0);
    const double bw = s.score_max / AN_SCORE_BINS;
    CHECK(ctx, fabs(q0 - 1) <= 1.01 * bw && fabs(q1 - 3) <= 1.01 * bw, "quantiles %g %g, expected about 1 and 3", q0, q1);
    CHECK(ctx, isnan(an_score_quantile(&an, 0, 2, 0, 0.5)), "empty histogram: NaN quantile");

    /* outputs */
    char dir[] = "/tmp/moh-test-analysis-XXXXXX";
    CHECK(ctx, mkdtemp(dir) != NULL, "mkdtemp");
    const int li[1] = {5};
    const char *names[C] = {"cat \"zero\"", "one,two"};
    an_meta meta = {"lm", "ckpt", "learned", 1, "data", "note", li, names, NULL, NULL};
    CHECK(ctx, an_write_outputs(dir, &meta, &an, &r, &meta, &r, &err) == MOH_OK, "an_write_outputs: %s", err.msg);
    const char *files[] = {"analysis.json", "density.csv", "scores.csv", "effective_rank.csv", "similarity.csv",
                           "head_pairs.csv", "load_final_layer.png", "heatmap_layer05.png", "scores_layer05.png",
                           "similarity.png", "effective_rank.png"};
    const int n_files = an_plot_available() ? 11 : 6;
    if (an_plot_available())
        CHECK(ctx, an_plot_all(dir, &meta, &an, &r, &r, &err) == MOH_OK, "an_plot_all: %s", err.msg);
    char path[512];
    for (int k = 0; k < n_files; k++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[k]);
        struct stat st;
        CHECK(ctx, stat(path, &st) == 0 && st.st_size > 0, "%s written", files[k]);
    }
    snprintf(path, sizeof path, "%s/analysis.json", dir);
    size_t len = 0;
    char *json = fs_read_file(path, 1 << 20, &len, &err);
    CHECK(ctx, json && strstr(json, "\"categories\": [\"cat \\\"zero\\\"\", \"one,two\"]"), "categories escaped");
    CHECK(ctx, json && strstr(json, "\"layer\": 5"), "model layer index");
    CHECK(ctx, json && strstr(json, "\"compare\""), "compare section");
    free(json);
    snprintf(path, sizeof path, "%s/density.csv", dir);
    json = fs_read_file(path, 1 << 20, &len, &err);
    CHECK(ctx, json && strstr(json, "layer,head,kind,\"cat \"\"zero\"\"\",\"one,two\"\n5,0,shared,1,1\n"),
          "density.csv header and first row: %s", json ? json : "(none)");
    free(json);
    for (int k = 0; k < n_files; k++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[k]);
        unlink(path);
    }
    rmdir(dir);
    an_result_free(&r);
    an_free(&an);
}

/* The stdout table, its legend, the progress line and the bar-chart value axis. */
static void test_presentation(test_ctx *ctx) {
    test_rng rng = {0x5eed1234abcdULL};
    /* axis: all values near -0.02 get an axis of their own scale that ends at 0, not 0..1 */
    const double neg[4] = {-0.0213 + 0.001 * test_rng_uniform(&rng), -0.0187, -0.0021, NAN};
    double lo, hi, step;
    an_axis_range(neg, 4, 0.05, 5, &lo, &hi, &step);
    CHECK(ctx, hi == 0 && lo <= -0.0223 && lo >= -0.04, "all-negative axis [%g, %g], expected [-0.04.., 0]", lo, hi);
    CHECK(ctx, step > 0 && step <= 0.01, "step %g for a span of 0.02", step);
    an_axis_range(neg, 0, 0.05, 5, &lo, &hi, &step);
    CHECK(ctx, lo == 0 && hi == 1, "no data: [0, 1], got [%g, %g]", lo, hi);
    for (int trial = 0; trial < 200; trial++) {
        double x[7];
        const double scale = pow(10, 4 * test_rng_uniform(&rng)), shift = test_rng_uniform(&rng);
        double mn = 0, mx = 0;
        for (int i = 0; i < 7; i++) {
            x[i] = scale * (test_rng_uniform(&rng) + shift);
            if (x[i] < mn) mn = x[i];
            if (x[i] > mx) mx = x[i];
        }
        const double pad = 0.1 * (1 + test_rng_uniform(&rng));
        an_axis_range(x, 7, pad, 5, &lo, &hi, &step);
        const double span = mx - mn, n_lo = lo / step, n_hi = hi / step, ticks = (hi - lo) / step;
        CHECK(ctx, lo <= mn - (mn < 0 ? pad * span * (1 - 1e-9) : 0) && hi >= mx + (mx > 0 ? pad * span * (1 - 1e-9) : 0),
              "trial %d: axis [%g, %g] misses data [%g, %g] + pad %g", trial, lo, hi, mn, mx, pad);
        CHECK(ctx, fabs(n_lo - round(n_lo)) < 1e-6 && fabs(n_hi - round(n_hi)) < 1e-6,
              "trial %d: ends %g, %g not multiples of the step %g", trial, lo, hi, step);
        CHECK(ctx, ticks >= 2.5 && ticks <= 13, "trial %d: %g steps on the axis", trial, ticks);
        CHECK(ctx, (hi - lo) <= span * (1 + 2 * pad) + 2 * step + 1e-12, "trial %d: axis [%g, %g] too wide for [%g, %g]",
              trial, lo, hi, mn, mx);
    }
    CHECK(ctx, an_nice_step(1, 5) == 0.2 && an_nice_step(0.026, 5) == 0.005 && an_nice_step(16, 5) == 2,
          "nice steps %g %g %g", an_nice_step(1, 5), an_nice_step(0.026, 5), an_nice_step(16, 5));

    /* table: a header, right-aligned columns whatever the signs, the values as given */
    enum { L = 3 };
    an_layer_result lay[L];
    memset(lay, 0, sizeof lay);
    double want[L][6];
    for (int l = 0; l < L; l++) {
        an_layer_result *y = &lay[l];
        y->att_sim.all = want[l][0] = 0.5 + 0.5 * test_rng_uniform(&rng);
        y->out_sim.all = want[l][1] = (l == 1 ? 0.02 : 0.4) * test_rng_uniform(&rng) - (l == 2 ? 0.5 : 0);
        y->erank_shared = want[l][2] = 8 + 7.9 * test_rng_uniform(&rng);
        y->erank_routed = want[l][3] = 4 + 3 * test_rng_uniform(&rng);
        y->cv_shared = want[l][4] = 0.1 + 0.09 * test_rng_uniform(&rng);
        y->cv_routed = want[l][5] = 0.2 + 0.19 * test_rng_uniform(&rng);
    }
    lay[1].out_sim.all = want[1][1] = -fabs(want[1][1]) - 0.001; /* one negative cosine, one positive */
    lay[0].out_sim.all = want[0][1] = fabs(want[0][1]) + 0.001;
    an_result r;
    memset(&r, 0, sizeof r);
    r.s.layers = L;
    r.s.heads = 4;
    r.s.shared = 1;
    r.s.routed = 3;
    r.layer = lay;
    const int idx[L] = {0, 7, 11};
    FILE *f = tmpfile();
    CHECK(ctx, f != NULL, "tmpfile");
    if (!f) return;
    an_print_table(f, "model (MoH)", &r, idx);
    an_print_legend(f, true);
    rewind(f);
    char lines[16][256];
    int n = 0;
    while (n < 16 && fgets(lines[n], sizeof lines[n], f)) n++;
    fclose(f);
    CHECK(ctx, n >= 2 + L + 3, "%d lines printed", n);
    if (n < 2 + L + 3) return;
    CHECK(ctx, strstr(lines[0], "model (MoH)") != NULL, "label line: %s", lines[0]);
    const char *cols[7] = {"layer", "att_sim", "out_cos", "erank_sh", "erank_rt", "cv_sh", "cv_rt"};
    for (int k = 0; k < 7; k++) CHECK(ctx, strstr(lines[1], cols[k]) != NULL, "header names %s: %s", cols[k], lines[1]);
    for (int l = 0; l < L; l++) {
        const char *row = lines[2 + l];
        CHECK(ctx, strlen(row) == strlen(lines[1]), "row %d is %zu chars, header %zu: '%s' vs '%s'", l, strlen(row),
              strlen(lines[1]), row, lines[1]);
        /* every column ends where its header name ends, '.' at the same place in every row */
        for (size_t c = 0; c < strlen(lines[1]); c++) {
            const bool hend = lines[1][c] != ' ' && lines[1][c] != '\n' && (lines[1][c + 1] == ' ' || lines[1][c + 1] == '\n');
            const bool rend = row[c] != ' ' && row[c] != '\n' && (row[c + 1] == ' ' || row[c + 1] == '\n');
            CHECK(ctx, hend == rend, "row %d: column edge at %zu differs from the header: '%s' vs '%s'", l, c, row,
                  lines[1]);
            if (l > 0) CHECK(ctx, (row[c] == '.') == (lines[2][c] == '.'), "row %d: '.' not aligned at %zu", l, c);
        }
        int li = -1;
        double v[6] = {NAN, NAN, NAN, NAN, NAN, NAN};
        CHECK(ctx, sscanf(row, "%d %lf %lf %lf %lf %lf %lf", &li, &v[0], &v[1], &v[2], &v[3], &v[4], &v[5]) == 7,
              "row %d parses: %s", l, row);
        CHECK(ctx, li == idx[l], "row %d: layer %d, expected %d", l, li, idx[l]);
        for (int k = 0; k < 6; k++)
            CHECK(ctx, fabs(v[k] - want[l][k]) <= (k == 2 || k == 3 ? 0.005 : 0.00005) + 1e-12,
                  "row %d column %d: %g, expected %g", l, k, v[k], want[l][k]);
    }
    bool legend_cos = false, legend_rank = false, legend_cv = false;
    for (int i = 2 + L; i < n; i++) {
        if (strstr(lines[i], "out_cos") && strstr(lines[i], "cosine") && strstr(lines[i], "-1..1")) legend_cos = true;
        if (strstr(lines[i], "erank") && strstr(lines[i], "dimensions")) legend_rank = true;
        if (strstr(lines[i], "cv") && strstr(lines[i], "std / mean")) legend_cv = true;
    }
    CHECK(ctx, legend_cos && legend_rank && legend_cv, "legend explains out_cos, erank, cv with units");

    /* progress line: counts, percentage, rate, elapsed and ETA */
    char buf[200];
    an_progress_text(buf, sizeof buf, 250, 1000, "tokens", 5);
    CHECK(ctx, strstr(buf, "250/1000 tokens (25 %)") && strstr(buf, "50 tokens/s") && strstr(buf, "elapsed 5 s") &&
                   strstr(buf, "ETA 15 s"),
          "progress: %s", buf);
    an_progress_text(buf, sizeof buf, 0, 640, "images", 0);
    CHECK(ctx, strstr(buf, "0/640 images (0 %)") && strstr(buf, "? images/s") && strstr(buf, "ETA ?"), "progress at 0: %s",
          buf);
    an_progress_text(buf, sizeof buf, 1, 3, "tokens", 3725);
    CHECK(ctx, strstr(buf, "elapsed 1h02m") && strstr(buf, "ETA 2h04m"), "progress hours: %s", buf);
    an_progress_text(buf, sizeof buf, 600, 900, "tokens", 200);
    CHECK(ctx, strstr(buf, "elapsed 3m20s") && strstr(buf, "ETA 100 s") == NULL && strstr(buf, "ETA 1m40s"),
          "progress minutes: %s", buf);
    char tiny[16];
    an_progress_text(tiny, sizeof tiny, 600, 900, "tokens", 200);
    CHECK(ctx, strlen(tiny) == sizeof tiny - 1, "truncated to the buffer: '%s'", tiny);
}

static bool write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return false;
    const bool ok = fwrite(data, 1, n, f) == n;
    return fclose(f) == 0 && ok;
}

static int run_cmd(const char *cmd) {
    const int st = system(cmd);
    return st == -1 ? -1 : WEXITSTATUS(st);
}

static bool file_has(const char *path, const char *needle) {
    size_t n = 0;
    moh_error err;
    char *t = fs_read_file(path, 1 << 24, &n, &err);
    const bool ok = t && strstr(t, needle);
    free(t);
    return ok;
}

/* Writes a checkpoint (weights only) of config json with random weights, through the model interface. */
static void save_model(test_ctx *ctx, const char *dir, const char *json) {
    model m;
    moh_error err;
    CHECK(ctx, model_from_config_text(&m, json, strlen(json), "test", &err) == MOH_OK, "%s", err.msg);
    if (!m.fam) return;
    if (!strcmp(m.fam->model_type, "llama")) lm_params_init_random(m.cfg, m.params, 7, 0.3);
    else m.fam->init_random(m.cfg, m.params, 7);
    CHECK(ctx, checkpoint_save(dir, &m, NULL, NULL, NULL, &err) == MOH_OK, "%s", err.msg);
    model_free(&m);
}
static void save_lm(test_ctx *ctx, const char *dir, const char *json) { save_model(ctx, dir, json); }
static void save_vit(test_ctx *ctx, const char *dir, const char *json) { save_model(ctx, dir, json); }

/* The analysis hooks of the families (model.h open_analysis): the LM's chunks and batches of
 * labelled text (order, lengths, categories, bytes), its errors, the reference-path caches the
 * statistics read; the ViT's images per class. */
static long drain(analysis_data *d, const model *m, int *shape, int max_batches, int *cats, int *ncat) {
    long cursor = 0, items = 0, got;
    moh_batch b;
    int nb = 0, *cat = malloc(sizeof(int) * (size_t)d->batch);
    *ncat = 0;
    while (cat && (got = d->next(d->self, m, &cursor, &b, cat)) > 0 && nb < max_batches) {
        shape[2 * nb] = b.B;
        shape[2 * nb + 1] = b.T;
        nb++;
        for (int j = 0; j < b.B; j++) cats[(*ncat)++] = cat[j];
        items += got;
    }
    free(cat);
    return nb * 1000000L + items;
}

static void test_hooks(test_ctx *ctx) {
    char dir[] = "/tmp/moh-test-hooks-XXXXXX", path[700], spec[1500];
    CHECK(ctx, mkdtemp(dir) != NULL, "mkdtemp");
    test_rng rng = {0x1234567ULL};
    uint8_t ta[30], tb[20]; /* random letters, no line breaks: nothing removed */
    for (size_t i = 0; i < sizeof ta; i++) ta[i] = (uint8_t)('a' + (int)(13 + 12.9 * test_rng_uniform(&rng)));
    for (size_t i = 0; i < sizeof tb; i++) tb[i] = (uint8_t)('A' + (int)(13 + 12.9 * test_rng_uniform(&rng)));
    snprintf(path, sizeof path, "%s/a.txt", dir);
    CHECK(ctx, write_file(path, ta, sizeof ta), "%s", path);
    snprintf(path, sizeof path, "%s/b.txt", dir);
    CHECK(ctx, write_file(path, tb, sizeof tb), "%s", path);
    const char *lm = "{\"hidden_size\": 16, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"intermediate_size\": "
                     "24, \"vocab_size\": 256, \"max_position_embeddings\": 12, \"router\": \"learned\", "
                     "\"shared_heads\": 1, \"top_k\": 2}";
    model m;
    moh_error err = {0};
    CHECK(ctx, model_from_config_text(&m, lm, strlen(lm), "test", &err) == MOH_OK, "%s", err.msg);
    if (!m.fam) return;
    CHECK(ctx, m.fam->open_analysis != NULL, "the LM supports analyze");
    m.fam->init_random(m.cfg, m.params, 3);
    snprintf(spec, sizeof spec, "%s/a.txt:x,%s/b.txt:y", dir, dir);
    analysis_request req = {.data = spec, .max_tokens = 25, .seq_len = 8, .batch = 2, .m = &m,
                            .model_label = "lm"};
    analysis_data d = {0};
    CHECK(ctx, m.fam->open_analysis(&req, &d, &err) == MOH_OK, "LM open_analysis: %s", err.msg);
    if (d.self) {
        CHECK(ctx, d.C == 2 && !strcmp(d.names[0], "x") && !strcmp(d.names[1], "y") && !strcmp(d.type, "lm"),
              "LM categories x, y");
        CHECK(ctx, d.items == 45 && d.T == 8 && d.batch == 2, "LM items %.0f (25 + 20), T %d, batch %d", d.items, d.T,
              d.batch);
        /* 25 bytes: chunks 8, 8, 8, 1; 20 bytes: 8, 8, 4; full chunks in batches of 2, a short one alone */
        int shape[32], cats[32], nc = 0;
        const int expect[10] = {2, 8, 1, 8, 1, 1, 2, 8, 1, 4}, ecat[7] = {0, 0, 0, 0, 1, 1, 1};
        const long r = drain(&d, &m, shape, 16, cats, &nc);
        CHECK(ctx, r == 5 * 1000000L + 45, "LM: 5 batches, 45 tokens (got %ld)", r);
        CHECK(ctx, r / 1000000L != 5 || !memcmp(shape, expect, sizeof expect), "LM batch shapes [B, T]");
        CHECK(ctx, nc == 7 && !memcmp(cats, ecat, sizeof ecat), "LM categories of the chunks");
        /* the tokens are the bytes in order; the reference path keeps every head's attention rows */
        long cursor = 0;
        moh_batch b;
        int cat[2];
        bool same = true;
        for (int k = 0; k < 2 && d.next(d.self, &m, &cursor, &b, cat) > 0; k++)
            for (int i = 0; i < b.B * b.T; i++) same &= b.tokens[i] == ta[k * 16 + i];
        CHECK(ctx, same, "LM chunk tokens are the bytes of a.txt in order");
        void *acts = NULL;
        CHECK(ctx, model_acts_new(m.fam, m.cfg, d.batch, d.T, false, &acts, &err) == MOH_OK, "%s", err.msg);
        if (acts) {
            double ce, lb;
            m.fam->forward(m.cfg, m.params, acts, &b, 0, b.B, false, &ce, &lb);
            const attn_cache_f32 *c = model_router(acts, 1);
            CHECK(ctx, c && c->att && c->o && c->gates && c->p, "reference-path cache holds att, o, gates, p");
            CHECK(ctx, c && c->att && fabsf(c->att[0] - 1.0f) < 1e-6f, "causal first row attends to itself only");
            model_acts_free(m.fam, acts);
        }
        d.free(d.self);
    }
    req.seq_len = 13;
    CHECK(ctx, m.fam->open_analysis(&req, &d, &err) == MOH_E_ARG && strstr(err.msg, "max_position_embeddings"),
          "--seq-len beyond the context refused: %s", err.msg);
    req.seq_len = 8;
    req.categories = "x";
    CHECK(ctx, m.fam->open_analysis(&req, &d, &err) == MOH_E_ARG && strstr(err.msg, "FILE:LABEL"),
          "--categories with FILE:LABEL refused: %s", err.msg);
    model_free(&m);

    /* ViT: 8x8 images, 5 tokens, 3 classes of 4 images; 15 tokens = 3 images per class */
    enum { NI = 12 };
    uint8_t img[16 + NI * 64], lab[8 + NI];
    const uint8_t ih[16] = {0, 0, 8, 3, 0, 0, 0, NI, 0, 0, 0, 8, 0, 0, 0, 8}, lh[8] = {0, 0, 8, 1, 0, 0, 0, NI};
    memcpy(img, ih, 16);
    memcpy(lab, lh, 8);
    for (int i = 0; i < NI; i++) {
        lab[8 + i] = (uint8_t)((i * 7) % 3);
        for (int k = 0; k < 64; k++) img[16 + i * 64 + k] = (uint8_t)(128 + 127 * test_rng_uniform(&rng));
    }
    snprintf(path, sizeof path, "%s/t10k-images-idx3-ubyte", dir);
    CHECK(ctx, write_file(path, img, sizeof img), "%s", path);
    snprintf(path, sizeof path, "%s/t10k-labels-idx1-ubyte", dir);
    CHECK(ctx, write_file(path, lab, sizeof lab), "%s", path);
    const char *vit = "{\"model_type\": \"vit\", \"img_size\": 8, \"patch_size\": 4, \"num_classes\": 3, \"embed_dim\": "
                      "16, \"depth\": 2, \"num_heads\": 4, \"mlp_ratio\": 2, \"mean\": [0.5], \"std\": [0.25], "
                      "\"router\": \"learned\", \"shared_heads\": 1, \"top_k\": 2}";
    CHECK(ctx, model_from_config_text(&m, vit, strlen(vit), "test", &err) == MOH_OK, "%s", err.msg);
    if (!m.fam) return;
    req = (analysis_request){.data = dir, .max_tokens = 15, .seq_len = -1, .batch = 4, .m = &m, .model_label = "vit"};
    CHECK(ctx, m.fam->open_analysis(&req, &d, &err) == MOH_OK, "ViT open_analysis: %s", err.msg);
    if (d.self) {
        CHECK(ctx, d.C == 3 && !strcmp(d.names[2], "2") && !strcmp(d.type, "vit") && d.items == 9,
              "ViT: 3 classes, 9 images (got %d, %.0f)", d.C, d.items);
        int shape[32], cats[32], nc = 0;
        const long r = drain(&d, &m, shape, 16, cats, &nc);
        const int ecat[9] = {0, 0, 0, 1, 1, 1, 2, 2, 2};
        CHECK(ctx, r == 3 * 1000000L + 9 && shape[0] == 4 && shape[2] == 4 && shape[4] == 1, "ViT batches 4, 4, 1");
        CHECK(ctx, nc == 9 && !memcmp(cats, ecat, sizeof ecat), "ViT: images grouped by class in file order");
        long cursor = 0;
        moh_batch b;
        int cat[4];
        d.next(d.self, &m, &cursor, &b, cat);
        const float want = (float)((img[16] / 255.0 - 0.5) / 0.25); /* image 0 (class 0), pixel 0 */
        CHECK(ctx, b.images && fabsf(b.images[0] - want) < 1e-5f && b.H == 8 && b.W == 8,
              "ViT pixel normalised with the config's mean/std: %g, expected %g", b.images ? b.images[0] : 0.0f, want);
        d.free(d.self);
    }
    req.categories = "a";
    CHECK(ctx, m.fam->open_analysis(&req, &d, &err) == MOH_E_ARG && strstr(err.msg, "--categories"),
          "ViT refuses --categories: %s", err.msg);
    model_free(&m);
    char cmd[800];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (ctx->failures == 0) run_cmd(cmd);
}

static void test_cli(test_ctx *ctx) {
    const char *bin = getenv("MOH_BIN") ? getenv("MOH_BIN") : "build/moh";
    if (access(bin, X_OK) != 0) {
        printf("test_analysis: note: %s not found, moh analyze end-to-end checks skipped\n", bin);
        return;
    }
    char dir[] = "/tmp/moh-test-analyze-XXXXXX";
    CHECK(ctx, mkdtemp(dir) != NULL, "mkdtemp");
    char a[600], b[600], cmd[4096], path[700];
    /* LM: MoH (1 shared + top-2 of 3) and its dense twin; two labelled text files */
    const char *lm = "{\"hidden_size\": 16, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
                     "\"intermediate_size\": 24, \"vocab_size\": 256, \"max_position_embeddings\": 12, "
                     "\"router\": \"%s\", \"shared_heads\": %d, \"top_k\": %d}";
    char js[512];
    snprintf(a, sizeof a, "%s/lm-moh", dir);
    snprintf(b, sizeof b, "%s/lm-mha", dir);
    snprintf(js, sizeof js, lm, "learned", 1, 2);
    save_lm(ctx, a, js);
    snprintf(js, sizeof js, lm, "none", 0, 0);
    save_lm(ctx, b, js);
    snprintf(path, sizeof path, "%s/one.txt", dir);
    const char t1[] = "first entry\n%\nsecond entry, a bit longer than the context\n%\nthird\n";
    CHECK(ctx, write_file(path, t1, sizeof t1 - 1), "write %s", path);
    snprintf(path, sizeof path, "%s/two.txt", dir);
    const char t2[] = "{}[]()<>;;;;::::////////\\\\||||\n%\n0123456789012345678901234567890\n";
    CHECK(ctx, write_file(path, t2, sizeof t2 - 1), "write %s", path);
    snprintf(cmd, sizeof cmd,
             "OMP_NUM_THREADS=1 %s analyze --checkpoint %s --compare %s --data %s/one.txt:prose,%s/two.txt:symbols "
             "--out %s/out-lm --max-tokens 40 > %s/lm.log 2>&1",
             bin, a, b, dir, dir, dir, dir);
    int rc = run_cmd(cmd);
    CHECK(ctx, rc == 0, "moh analyze (LM) exit %d (log %s/lm.log)", rc, dir);
    snprintf(path, sizeof path, "%s/out-lm/analysis.json", dir);
    CHECK(ctx, file_has(path, "\"categories\": [\"prose\", \"symbols\"]"), "LM categories in %s", path);
    CHECK(ctx, file_has(path, "\"compare\": {\"checkpoint\""), "LM compare section");
    CHECK(ctx, file_has(path, "\"tokens_per_category\": [40, 40]"), "LM token cap: 40 per category");
    snprintf(path, sizeof path, "%s/out-lm/similarity.csv", dir);
    CHECK(ctx, file_has(path, "\ncompare,1,"), "twin rows in similarity.csv");
    /* progress on stderr only: stdout and analysis.json are the same whether stderr is a file (one
     * line per quarter) or a terminal (rewritten in place, through script(1) when installed) */
    const char *run = "OMP_NUM_THREADS=1 %s analyze --checkpoint %s --compare %s --data %s/one.txt:prose,"
                      "%s/two.txt:symbols --out %s/out-p --max-tokens 40 --no-plots > %s/p%d.out";
    snprintf(cmd, sizeof cmd, run, bin, a, b, dir, dir, dir, dir, 1);
    snprintf(cmd + strlen(cmd), sizeof cmd - strlen(cmd), " 2> %s/p1.err && cp %s/out-p/analysis.json %s/p1.json",
             dir, dir, dir);
    CHECK(ctx, run_cmd(cmd) == 0, "moh analyze, stderr to a file");
    snprintf(path, sizeof path, "%s/p1.err", dir);
    CHECK(ctx, file_has(path, "moh analyze: ") && file_has(path, "80/80 tokens (100 %)") && file_has(path, "ETA") &&
                   file_has(path, "tokens/s") && !file_has(path, "\r"),
          "progress lines in %s", path);
    snprintf(path, sizeof path, "%s/p1.out", dir);
    CHECK(ctx, file_has(path, "  layer   att_sim   out_cos  erank_sh") && file_has(path, "columns: att_sim") &&
                   !file_has(path, "tokens/s"),
          "stdout: table header and legend, no progress (%s)", path);
    snprintf(cmd, sizeof cmd, run, bin, a, b, dir, dir, dir, dir, 2);
    snprintf(cmd + strlen(cmd), sizeof cmd - strlen(cmd), " 2> /dev/null && cmp -s %s/p1.out %s/p2.out && "
             "cmp -s %s/p1.json %s/out-p/analysis.json", dir, dir, dir, dir);
    CHECK(ctx, run_cmd(cmd) == 0, "stdout and analysis.json identical with stderr to a file and to /dev/null");
    if (run_cmd("command -v script > /dev/null") == 0) {
        char inner[2048];
        snprintf(inner, sizeof inner, run, bin, a, b, dir, dir, dir, dir, 3);
        snprintf(cmd, sizeof cmd, "script -qec '%s' /dev/null > %s/p3.tty < /dev/null && cmp -s %s/p1.out %s/p3.out && "
                 "cmp -s %s/p1.json %s/out-p/analysis.json", inner, dir, dir, dir, dir, dir);
        CHECK(ctx, run_cmd(cmd) == 0, "stdout and analysis.json identical with stderr on a terminal (%s/p3.tty)", dir);
        snprintf(path, sizeof path, "%s/p3.tty", dir);
        CHECK(ctx, file_has(path, "\rmoh analyze: ") && file_has(path, "80/80 tokens (100 %)"),
              "progress rewritten in place on a terminal (%s)", path);
    } else printf("test_analysis: note: script(1) not installed, terminal progress check skipped\n");
    if (an_plot_available()) {
        snprintf(path, sizeof path, "%s/out-lm/load_final_layer.png", dir);
        CHECK(ctx, access(path, R_OK) == 0, "%s", path);
    }
    /* --layers last: one layer, the model's last */
    snprintf(cmd, sizeof cmd,
             "OMP_NUM_THREADS=1 %s analyze --checkpoint %s --data %s/one.txt:prose --out %s/out-last "
             "--layers last --no-plots > %s/last.log 2>&1", bin, a, dir, dir, dir);
    CHECK(ctx, run_cmd(cmd) == 0, "moh analyze --layers last (log %s/last.log)", dir);
    snprintf(path, sizeof path, "%s/out-last/analysis.json", dir);
    CHECK(ctx, file_has(path, "{\"layer\": 1,") && !file_has(path, "{\"layer\": 0,"), "only layer 1 analysed");
    /* a directory of topics with topics.txt and --categories */
    snprintf(path, sizeof path, "%s/topics.txt", dir);
    CHECK(ctx, write_file(path, "one\t10\t3\ntwo\t5\t2\n", 17), "topics.txt");
    snprintf(cmd, sizeof cmd,
             "OMP_NUM_THREADS=1 %s analyze --checkpoint %s --data %s --categories two,one --out %s/out-dir "
             "--no-plots > %s/dir.log 2>&1", bin, a, dir, dir, dir);
    CHECK(ctx, run_cmd(cmd) == 0, "moh analyze on a topics dir (log %s/dir.log)", dir);
    snprintf(path, sizeof path, "%s/out-dir/analysis.json", dir);
    CHECK(ctx, file_has(path, "\"categories\": [\"two\", \"one\"]"), "--categories order kept");
    /* errors: usage (2), runtime (1) with a one-line message */
    snprintf(cmd, sizeof cmd, "%s analyze --checkpoint %s --data x:y --out %s/o --layers some 2>/dev/null", bin, a, dir);
    CHECK(ctx, run_cmd(cmd) == 2, "--layers some is a usage error");
    snprintf(cmd, sizeof cmd, "%s analyze --checkpoint %s/nope --data x:y --out %s/o 2> %s/err.log", bin, dir, dir, dir);
    CHECK(ctx, run_cmd(cmd) == 1, "missing checkpoint: exit 1");
    snprintf(path, sizeof path, "%s/err.log", dir);
    CHECK(ctx, file_has(path, "moh analyze: ") && file_has(path, "nope/config.json"), "error names the file");
    snprintf(cmd, sizeof cmd, "%s analyze --checkpoint %s --data %s/one.txt --out %s/o 2> %s/err.log", bin, a, dir, dir, dir);
    CHECK(ctx, run_cmd(cmd) == 1 && file_has(path, "FILE:LABEL"), "--data FILE without a label is explained");
    snprintf(cmd, sizeof cmd, "%s analyze --checkpoint %s --compare %s/nope --data x:y --out %s/o 2> %s/err.log", bin, a,
             dir, dir, dir);
    CHECK(ctx, run_cmd(cmd) == 1, "missing twin: exit 1");

    /* ViT: 8x8 images, patch 4 (4 patches + class token), 3 classes, t10k IDX files */
    const char *vit = "{\"model_type\": \"vit\", \"img_size\": 8, \"patch_size\": 4, \"num_classes\": 3, "
                      "\"embed_dim\": 16, \"depth\": 2, \"num_heads\": 4, \"mlp_ratio\": 2, \"router\": \"%s\", "
                      "\"shared_heads\": %d, \"top_k\": %d}";
    snprintf(a, sizeof a, "%s/vit-moh", dir);
    snprintf(b, sizeof b, "%s/vit-mha", dir);
    snprintf(js, sizeof js, vit, "learned", 1, 2);
    save_vit(ctx, a, js);
    snprintf(js, sizeof js, vit, "none", 0, 0);
    save_vit(ctx, b, js);
    enum { NI = 12 };
    uint8_t img[16 + NI * 64], lab[8 + NI];
    const uint8_t ih[16] = {0, 0, 8, 3, 0, 0, 0, NI, 0, 0, 0, 8, 0, 0, 0, 8}, lh[8] = {0, 0, 8, 1, 0, 0, 0, NI};
    memcpy(img, ih, 16);
    memcpy(lab, lh, 8);
    for (int i = 0; i < NI; i++) {
        lab[8 + i] = (uint8_t)(i % 3);
        for (int k = 0; k < 64; k++) img[16 + i * 64 + k] = (uint8_t)((i * 37 + k * (1 + i % 3) * 11) & 255);
    }
    snprintf(path, sizeof path, "%s/idx", dir);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/idx/t10k-images-idx3-ubyte", dir);
    CHECK(ctx, write_file(path, img, sizeof img), "%s", path);
    snprintf(path, sizeof path, "%s/idx/t10k-labels-idx1-ubyte", dir);
    CHECK(ctx, write_file(path, lab, sizeof lab), "%s", path);
    snprintf(cmd, sizeof cmd,
             "OMP_NUM_THREADS=1 %s analyze --checkpoint %s --compare %s --data %s/idx --out %s/out-vit "
             "--max-tokens 15 --batch-size 4 > %s/vit.log 2>&1", bin, a, b, dir, dir, dir);
    CHECK(ctx, run_cmd(cmd) == 0, "moh analyze (ViT) (log %s/vit.log)", dir);
    snprintf(path, sizeof path, "%s/out-vit/analysis.json", dir);
    CHECK(ctx, file_has(path, "\"categories\": [\"0\", \"1\", \"2\"]"), "ViT classes as categories");
    CHECK(ctx, file_has(path, "\"tokens_per_category\": [15, 15, 15]"), "3 images x 5 tokens per class");
    CHECK(ctx, file_has(path, "\"type\": \"vit\""), "model type vit");
    snprintf(cmd, sizeof cmd, "%s analyze --checkpoint %s --compare %s/lm-mha --data %s/idx --out %s/o 2> %s/err.log", bin,
             a, dir, dir, dir, dir);
    CHECK(ctx, run_cmd(cmd) == 1, "ViT against an LM twin: exit 1");
    snprintf(path, sizeof path, "%s/err.log", dir);
    CHECK(ctx, file_has(path, "expected a ViT"), "mismatched twin explained");
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (ctx->failures == 0) run_cmd(cmd);
}

int main(void) {
    test_ctx ctx = {0, 0};
    test_rank(&ctx);
    test_primitives(&ctx);
    test_accumulator(&ctx);
    test_presentation(&ctx);
    test_hooks(&ctx);
    test_cli(&ctx);
    return test_finish("test_analysis", &ctx);
}
