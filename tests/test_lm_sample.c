/* The sampler (src/models/lm_sample.c): temperature, then top-k, then top-p on the top-k set
 * renormalised. A case where measuring top-p on the full distribution keeps another set, one
 * where the temperature decides top-p, random logits against a direct reference, greedy ties, and
 * the inverse-CDF pick. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "models/lm_sample.h"
#include "test_util.h"

/* Reference kept set: softmax of logits / t over all V (double), ids sorted by probability (ties:
 * lower id), the first k, renormalised, then the shortest prefix with mass >= top_p. */
static int ref_keep(const float *logits, int V, double t, int k, double top_p, int *ids, double *p) {
    double *q = malloc(sizeof(double) * V), mx = -INFINITY;
    for (int i = 0; i < V; i++) mx = fmax(mx, logits[i]);
    for (int i = 0; i < V; i++) q[i] = exp((logits[i] - mx) / t);
    for (int i = 0; i < V; i++) ids[i] = i;
    for (int i = 1; i < V; i++) /* insertion sort, stable: ties keep the lower id first */
        for (int j = i; j > 0 && q[ids[j]] > q[ids[j - 1]]; j--) {
            int x = ids[j];
            ids[j] = ids[j - 1];
            ids[j - 1] = x;
        }
    int n = k > 0 && k < V ? k : V;
    double sk = 0, cum = 0;
    for (int i = 0; i < n; i++) sk += q[ids[i]];
    for (int i = 0; i < n; i++)
        if ((cum += q[ids[i]] / sk) >= top_p) {
            n = i + 1;
            break;
        }
    double sn = 0;
    for (int i = 0; i < n; i++) sn += q[ids[i]];
    for (int i = 0; i < n; i++) p[i] = q[ids[i]] / sn;
    free(q);
    return n;
}

/* Logits of V tokens: id a at 1.0, id b at 1 - ln(5/3) (so a : b = 5 : 3 at temperature 1), the
 * others random in [-3, 0.4] (below b, holding enough mass that a alone is < 0.6 of all). */
static void two_leaders(float *l, int V, int a, int b, test_rng *rng) {
    for (int i = 0; i < V; i++) l[i] = (float)(-1.3 + 1.7 * test_rng_uniform(rng));
    l[a] = 1.0f;
    l[b] = (float)(1.0 - log(5.0 / 3.0));
}

int main(void) {
    test_ctx ctx = {0};
    test_rng rng = {0x5A3C11D2E4F60789ULL};
    enum { V = 8, VR = 256 };
    float l[VR];
    lm_cand c[VR];
    for (int rep = 0; rep < 20; rep++) {
        const int a = (int)(test_rng_u64(&rng) % V), b = (a + 1 + (int)(test_rng_u64(&rng) % (V - 1))) % V;
        two_leaders(l, V, a, b, &rng);
        double full = 0;
        for (int i = 0; i < V; i++) full += exp(l[i] - 1.0);
        CHECK(&ctx, 1.0 / full < 0.6, "setup: a has %.3f of the full distribution, want < 0.6", 1.0 / full);
        /* top-k 2, top-p 0.6: the top-2 set renormalised gives a 0.625 >= 0.6, so a alone is kept;
         * against the full distribution (a < 0.6) both would be */
        int n = lm_sample_keep(l, V, 1.0, 2, 0.6, c);
        CHECK(&ctx, n == 1 && c[0].id == a && fabs(c[0].p - 1.0) < 1e-12,
              "top-k 2 top-p 0.6 keeps %d tokens (first %d), want only %d", n, c[0].id, a);
        int off = 0;
        for (int j = 0; j < 50; j++)
            off += lm_sample_pick(c, n, (double)(test_rng_u64(&rng) >> 11) / 9007199254740992.0) != a;
        CHECK(&ctx, off == 0, "%d of 50 draws were not token %d", off, a);
        /* temperature comes first: at 2 the top-2 ratio is sqrt(5/3), a has 0.563 < 0.6 of it */
        n = lm_sample_keep(l, V, 2.0, 2, 0.6, c);
        const double pa = sqrt(5.0 / 3.0) / (sqrt(5.0 / 3.0) + 1.0);
        CHECK(&ctx, n == 2 && c[0].id == a && c[1].id == b && fabs(c[0].p - pa) < 1e-6,
              "temperature 2: kept %d (p0 %.4f), want %d and %d with p0 %.4f", n, c[0].p, a, b, pa);
        /* top-p 1 keeps the whole top-k set */
        n = lm_sample_keep(l, V, 1.0, 2, 1.0, c);
        CHECK(&ctx, n == 2 && fabs(c[0].p - 0.625) < 1e-6, "top-p 1: kept %d, p0 %.4f, want 2 and 0.625", n, c[0].p);
    }
    /* random logits against the reference, over temperatures, top-k and top-p */
    const int ks[] = {0, 1, 3, 40, 255, 256, 1000};
    const double ps[] = {0.05, 0.3, 0.6, 0.9, 0.99, 1.0};
    int ids[VR];
    double p[VR];
    long worst_n = 0;
    double worst_p = 0;
    for (int rep = 0; rep < 40; rep++) {
        const double scale = 1.0 + 4.0 * (test_rng_uniform(&rng) + 1.0);
        for (int i = 0; i < VR; i++) l[i] = (float)(scale * test_rng_uniform(&rng));
        const double t = 0.2 + 1.5 * (test_rng_uniform(&rng) + 1.0);
        const int k = ks[rep % 7];
        const double tp = ps[rep % 6];
        const int n = lm_sample_keep(l, VR, t, k, tp, c), rn = ref_keep(l, VR, t, k, tp, ids, p);
        if (n != rn) worst_n++;
        double s = 0;
        for (int i = 0; i < n && i < rn; i++) {
            if (c[i].id != ids[i]) worst_n++;
            worst_p = fmax(worst_p, fabs(c[i].p - p[i]));
            s += c[i].p;
        }
        CHECK(&ctx, fabs(s - 1.0) < 1e-9, "kept probabilities sum to %.12f", s);
        CHECK(&ctx, n >= 1 && n <= (k > 0 && k < VR ? k : VR), "kept %d with top-k %d", n, k);
    }
    CHECK(&ctx, worst_n == 0, "%ld kept sets or orders differ from the reference", worst_n);
    CHECK(&ctx, worst_p < 1e-9, "kept probabilities differ from the reference by %.3g", worst_p);
    /* temperature 0: argmax, the lowest id among ties, whatever top-k / top-p say */
    for (int i = 0; i < V; i++) l[i] = (float)test_rng_uniform(&rng);
    l[5] = l[2] = 3.0f;
    CHECK(&ctx, lm_sample_keep(l, V, 0.0, 3, 0.1, c) == 1 && c[0].id == 2, "greedy gave %d, want 2", c[0].id);
    /* pick: inverse CDF over the kept order */
    const lm_cand q[3] = {{0.5, 7}, {0.3, 1}, {0.2, 4}};
    CHECK(&ctx, lm_sample_pick(q, 3, 0.0) == 7 && lm_sample_pick(q, 3, 0.49) == 7, "pick below 0.5");
    CHECK(&ctx, lm_sample_pick(q, 3, 0.5) == 1 && lm_sample_pick(q, 3, 0.79) == 1, "pick in [0.5, 0.8)");
    CHECK(&ctx, lm_sample_pick(q, 3, 0.81) == 4 && lm_sample_pick(q, 3, 0.999999) == 4, "pick above 0.8");
    return test_finish("test_lm_sample", &ctx);
}
