#include "models/lm_sample.h"

#include <math.h>
#include <stdlib.h>

static int cmp_cand(const void *a, const void *b) {
    const lm_cand *x = a, *y = b;
    return x->p < y->p ? 1 : x->p > y->p ? -1 : x->id - y->id;
}

int lm_sample_keep(const float *logits, int V, double temperature, int top_k, double top_p, lm_cand *c) {
    int best = 0;
    for (int i = 1; i < V; i++) best = logits[i] > logits[best] ? i : best;
    if (temperature <= 0) {
        c[0] = (lm_cand){1.0, best};
        return 1;
    }
    for (int i = 0; i < V; i++) c[i] = (lm_cand){exp(((double)logits[i] - logits[best]) / temperature), i};
    qsort(c, (size_t)V, sizeof *c, cmp_cand);
    int n = top_k > 0 && top_k < V ? top_k : V;
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += c[i].p;
    /* top-p over the top-k set renormalised */
    double kept = 0.0;
    for (int i = 0; i < n; i++) {
        kept += c[i].p / sum;
        if (kept >= top_p) {
            n = i + 1;
            break;
        }
    }
    double tot = 0.0;
    for (int i = 0; i < n; i++) tot += c[i].p;
    for (int i = 0; i < n; i++) c[i].p /= tot;
    return n;
}

int lm_sample_pick(const lm_cand *c, int n, double u) {
    double cum = 0.0;
    for (int i = 0; i < n; i++) {
        cum += c[i].p;
        if (cum > u) return c[i].id;
    }
    return c[n - 1].id;
}
