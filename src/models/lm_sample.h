/* Next-token sampling from logits, in the order of transformers' generate(): temperature, then
 * top-k, then top-p (nucleus) on the top-k set renormalised, then a draw from what is left.
 * Temperature 0 is greedy (argmax). */
#ifndef MOH_LM_SAMPLE_H
#define MOH_LM_SAMPLE_H

typedef struct lm_cand {
    double p; /* probability within the kept set (the kept p sum to 1) */
    int id;   /* token id */
} lm_cand;

/* The kept set for logits [V] (V >= 1): p_i = softmax(logits / temperature); the top_k most likely
 * (top_k <= 0 or >= V: all); renormalised; then the smallest prefix whose mass reaches top_p
 * (0 < top_p <= 1). Writes it to c[0..n) (c holds V entries), most likely first (ties: lower id
 * first), p renormalised over the kept set, and returns n >= 1. temperature <= 0: n = 1, the
 * argmax (lowest id among ties). */
int lm_sample_keep(const float *logits, int V, double temperature, int top_k, double top_p, lm_cand *c);

/* The token of c[0..n) at the cumulative probability u in [0, 1) (inverse CDF over the kept
 * order): the first i with p_0 + ... + p_i > u; the last one if rounding leaves none. */
int lm_sample_pick(const lm_cand *c, int n, double u);
#endif
