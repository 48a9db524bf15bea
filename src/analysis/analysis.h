/* Head statistics of a MoH (or dense MHA) model over labelled data (spec §6): head load
 * ("density"), routing-score distributions and their coefficient of variation across categories,
 * attention-pattern and head-output similarity between head pairs, and the effective rank of each
 * head's outputs. The accumulator reads the attention caches a forward pass leaves behind
 * (attn_decl.h: gates, p, o, att), so it serves the decoder LM and the ViT alike; the results go
 * to analysis.json and CSV tables (this file) and to PNG plots (plot.c, cairo).
 *
 * Estimators (stated again in analysis.json under "estimators"):
 *  - density[l][i][c]: tokens of category c with gate_i != 0 / tokens of category c (shared
 *    heads: 1).
 *  - routing score: the gate value g_i (spec §1, factors 2, h_s, K included). Shared heads:
 *    a1 * s_i over every token; routed heads:
 *    a2 * r_i over the tokens that select the head (unselected tokens, gate 0, are what density
 *    measures). Also reported for routed heads: the router probability p_i over every token.
 *  - score CV of head i: population std over categories of (mean score of head i in c), divided by
 *    the mean over categories of the same; averaged over shared heads and over routed heads.
 *  - attention similarity of heads i, j at query q: 1 - 0.5 * ||A^i_q - A^j_q||_1, averaged over
 *    the queries that select both heads (every query position, the first included), then over
 *    head pairs (each unordered pair i < j weighs the same), per layer.
 *  - output similarity: cosine of the two heads' outputs o^i_t, o^j_t (before gating) at the same
 *    token, averaged the same way (tokens where either output is zero are skipped).
 *    Both similarities are also computed over every token, selected or not (the heads' attention
 *    and outputs exist at every token in the reference path), for a like-for-like token set with
 *    a dense twin.
 *  - effective rank (Roy & Vetterli 2007) of head i: exp(H(p)), p_k = sigma_k / sum sigma, the
 *    singular values of the uncentred [tokens x d] matrix of o^i over the tokens that select the
 *    head; sigma_k = sqrt(lambda_k) from the eigenvalues of the d x d Gram matrix (float64, cyclic
 *    Jacobi). Also reported, as a secondary number: the same of the centred matrix (each head's
 *    mean output over those tokens subtracted), Gram - n * mean mean^T.
 * No global state; every function is reentrant. */
#ifndef MOH_ANALYSIS_H
#define MOH_ANALYSIS_H
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "moh.h"

/* Bins of the routing-score histograms, over [0, score_max). */
#define AN_SCORE_BINS 1024

/* ---- primitives (exposed for tests) ----------------------------------------------------------- */

/* Eigenvalues of the symmetric n x n matrix A (row-major; destroyed) into w[n], descending, by
 * cyclic Jacobi rotations until the off-diagonal mass is negligible. Returns the sweeps used. */
int an_jacobi_eigenvalues(double *A, int n, double *w);
/* exp(-sum p_k log p_k), p_k = sv_k / sum(sv); negative entries count as 0; 0 if all are 0. */
double an_effective_rank_sv(const double *sv, int n);
/* Effective rank from the Gram matrix G = X^T X (d x d, row-major, not modified): singular
 * values sqrt(max(lambda, 0)) of X. */
double an_effective_rank_gram(const double *G, int d);
/* 1 - 0.5 * sum_k |a_k - b_k| for two probability rows of length n. */
double an_attention_similarity(const float *a, const float *b, int n);
/* Cosine of two vectors; *ok = false (and 0 returned) when either is all zeros. */
double an_cosine(const float *a, const float *b, int n, bool *ok);
/* Population std / mean of x[0..n); 0 for a constant; NaN when n < 1 or the mean is 0. */
double an_cv(const double *x, int n);

/* ---- accumulator ---------------------------------------------------------------------------- */

typedef struct an_shape {
    int layers;        /* L: layers analysed (slots 0..L-1) */
    int heads;         /* h */
    int shared;        /* h_s (0 for a dense model) */
    int routed;        /* E: routed heads, h_s..h-1 (0 for a dense model) */
    int head_dim;      /* d */
    int categories;    /* number of labels */
    double score_max;  /* upper end of the score histograms (gates lie in [0, score_max]) */
} an_shape;

/* One batch of one layer: B rows of N tokens, token t = b * N + n; every row has one category. */
typedef struct an_batch {
    int B, N;
    const int *cat;     /* [B] category of each row, 0..categories-1 */
    const float *gates; /* [T, h] gate of each head, 0 when not selected */
    const float *p;     /* [T, E] router probabilities, or NULL (no router) */
    const float *o;     /* [T, h d] head outputs before gating */
    const float *att;   /* [B, h, N, N] attention probabilities, or NULL (skip attention sim) */
    bool causal;        /* att rows are zero beyond the query (speeds up the L1 distance) */
} an_batch;

typedef struct analysis {
    an_shape s;
    double *tokens;     /* [L, C] tokens seen */
    double *sel;        /* [L, h, C] tokens selecting head i */
    double *score_sum;  /* [L, h, C] sum of gate values over the tokens counted for the score */
    double *p_sum;      /* [L, E, C] sum of router probabilities over all tokens */
    double *hist;       /* [L, h, C, AN_SCORE_BINS] histogram of the score values */
    double *att_sum, *att_cnt; /* [L, h, h] (i < j used) attention similarity sums and counts */
    double *out_sum, *out_cnt; /* [L, h, h] output cosine sums and counts */
    double *att_sum_all, *att_cnt_all, *out_sum_all, *out_cnt_all; /* the same over every token */
    double *gram;       /* [L, h, d, d] Gram matrix of the head outputs */
    double *gram_n;     /* [L, h] rows accumulated into gram */
    double *osum;       /* [L, h, d] sum of those rows (for the centred rank) */
    void *block;        /* the allocation behind the arrays */
} analysis;

/* Allocates a zeroed accumulator. MOH_E_ARG (bad shape) or MOH_E_NOMEM. */
int an_init(analysis *an, const an_shape *s, moh_error *err);
void an_free(analysis *an);
/* Adds one batch of layer slot l. MOH_E_ARG on a category out of range or a bad batch. Parallel
 * over heads and head pairs (OpenMP); deterministic. */
int an_add(analysis *an, int l, const an_batch *b, moh_error *err);

/* ---- results -------------------------------------------------------------------------------- */

/* Group means of a per-pair quantity (NaN where a group has no pair with data). */
typedef struct an_pairs {
    double all, shared_shared, shared_routed, routed_routed;
    int pairs;          /* pairs with data */
} an_pairs;

typedef struct an_layer_result {
    double *density;    /* [h, C] */
    double *score_mean; /* [h, C] mean score (NaN when no token counted) */
    double *score_cv;   /* [h] CV across categories of score_mean (NaN if undefined) */
    double *p_mean;     /* [E, C] mean router probability (NULL without router) */
    double *p_cv;       /* [E] */
    double cv_shared, cv_routed, cv_routed_p; /* means over heads (NaN when none) */
    an_pairs att_sim, out_sim;
    an_pairs att_sim_alltok, out_sim_alltok; /* over every token, selected or not (equal when dense) */
    double *att_pair;   /* [h, h] symmetric per-pair attention similarity (diagonal 1; NaN: no data) */
    double *out_pair;   /* [h, h] likewise for the output cosine */
    double *erank;      /* [h] effective rank (NaN when the head saw no token) */
    double *erank_tokens; /* [h] tokens behind each rank */
    double erank_shared, erank_routed, erank_all; /* means over heads */
    double *erank_c;    /* [h] the same after subtracting the head's mean output (secondary) */
    double erank_c_shared, erank_c_routed, erank_c_all;
} an_layer_result;

typedef struct an_result {
    an_shape s;
    an_layer_result *layer; /* [L] */
    void *block;
} an_result;

/* Computes every statistic from the accumulator. MOH_E_NOMEM. */
int an_finish(const analysis *an, an_result *r, moh_error *err);
void an_result_free(an_result *r);
/* Quantile q in [0, 1] of the score histogram of (layer l, head i, category c), linear inside a
 * bin; NaN when it is empty. */
double an_score_quantile(const analysis *an, int l, int i, int c, double q);

/* ---- output --------------------------------------------------------------------------------- */

/* What the JSON says about the run (strings are copied into the file verbatim, JSON-escaped). */
typedef struct an_meta {
    const char *model_type;   /* "lm" or "vit" */
    const char *checkpoint;
    const char *router;       /* "learned", "none", "query_norm" */
    int top_k;
    const char *data;         /* the --data argument */
    const char *data_note;    /* how tokens were drawn */
    const int *layer_index;   /* [L] model layer of each slot */
    const char *const *categories; /* [C] */
    /* Optional (layers that differ in heads, DiT): shared heads and top-k of each slot's layer [L];
     * NULL: every layer has shared = the shape's, top_k = top_k above. */
    const int *layer_shared, *layer_top_k;
} an_meta;

/* Writes dir/analysis.json and the CSV tables dir/density.csv, dir/scores.csv,
 * dir/effective_rank.csv, dir/similarity.csv (with the twin's numbers when cmp is not NULL;
 * cmp_meta then describes it). MOH_E_IO naming the file. */
int an_write_outputs(const char *dir, const an_meta *meta, const analysis *an, const an_result *r,
                     const an_meta *cmp_meta, const an_result *cmp, moh_error *err);

/* ---- presentation (stdout table, progress, plot axes) --------------------------------------- */

/* The per-layer table of r on f: a header naming the columns, then one row per analysed layer
 * (layer_index[l] = model layer of slot l), values right-aligned in fixed-width columns so signs
 * and decimal points line up: layer, att_sim, out_cos (%.4f), erank (%.2f; shared and routed for
 * MoH), score CV (%.4f; shared and routed for MoH). NaN prints as "nan". */
void an_print_table(FILE *f, const char *label, const an_result *r, const int *layer_index);
/* The legend of an_print_table's columns (meaning, range, unit), a few lines on f; routed: with
 * the shared/routed columns of a MoH table. */
void an_print_legend(FILE *f, bool routed);
/* "DONE/TOTAL UNIT (P %), R UNIT/s, elapsed E, ETA X" into buf (at most cap bytes, always
 * terminated); durations as "12 s", "3m05s" or "2h03m"; rate and ETA "?" before any progress or
 * time. Returns buf. */
char *an_progress_text(char *buf, size_t cap, double done, double total, const char *unit, double elapsed_s);
/* A tick step of 1, 2 or 5 x 10^k giving about n ticks over a span (1 when span <= 0). */
double an_nice_step(double span, int n);
/* The value axis of a bar chart of x[0..n) (non-finite entries skipped): *lo <= min(0, x) and
 * *hi >= max(0, x), widened by pad (a fraction of max - min, room for value labels) on each side
 * holding a non-zero extreme, then rounded outwards to multiples of *step = an_nice_step(., nticks).
 * No non-zero finite value: [0, 1]. */
void an_axis_range(const double *x, int n, double pad, int nticks, double *lo, double *hi, double *step);

/* PNG plots (plot.c, cairo): head load of the final analysed layer, one panel per category (at
 * most 12, in order) "load_final_layer.png"; a head x category heat map of routed-head load per
 * layer "heatmap_layerNN.png"; box plots of the routing scores per head for up to 4 categories
 * per layer "scores_layerNN.png"; attention and output similarity per layer, MoH vs the twin,
 * "similarity.png"; effective rank per layer, shared vs routed (and the twin),
 * "effective_rank.png". cmp (the dense twin) may be NULL. Dense models get no heat map or load
 * chart (every head has load 1). MOH_E_IO naming the file; MOH_E_CONFIG when built without cairo. */
int an_plot_all(const char *dir, const an_meta *meta, const analysis *an, const an_result *r,
                const an_result *cmp, moh_error *err);
/* true when the library was built with cairo. */
bool an_plot_available(void);
/* A PNG of nrows x ncols grey images (image (r, c): H x W bytes at pix + (r ncols + c) H W), each
 * scale times larger (nearest neighbour) on a dark ground, with labels[r] (may be NULL) left of row r.
 * Written aside and renamed. MOH_E_CONFIG without cairo; MOH_E_ARG when cairo cannot make an
 * image that size (a side over 32767 pixels); MOH_E_IO naming path. */
int plot_image_grid(const char *path, const uint8_t *pix, int nrows, int ncols, int H, int W, int scale,
                    const char *const *labels, moh_error *err);
#endif
