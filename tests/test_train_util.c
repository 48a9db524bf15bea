/* The --max-minutes cost model (src/train/train_util.c): train_cost_of against a step-by-step sum,
 * train_fit_steps as the largest count that fits, on random costs, intervals and budgets. */
#include <math.h>

#include "test_util.h"
#include "train/train_util.h"

/* The cost of n more steps after `step`, one step at a time. */
static double brute_cost(const train_cost_model *m, long step, long n) {
    if (n <= 0) return 0.0;
    double s = 0.0;
    for (long k = step + 1; k <= step + n; k++) {
        s += m->step_s;
        if (k == step + n) s += m->final_s;
        else if (m->eval_every > 0 && k % m->eval_every == 0) s += m->eval_s;
        else if (m->save_every > 0 && k % m->save_every == 0) s += m->save_s;
    }
    return s;
}

int main(void) {
    test_ctx t = {0, 0};
    test_rng r = {0x5C4EDULL};
    for (int it = 0; it < 400; it++) {
        train_cost_model m;
        m.step_s = 0.01 + 0.5 * (1.0 + test_rng_uniform(&r));
        m.eval_s = 5.0 * (1.0 + test_rng_uniform(&r));
        m.save_s = 0.3 * (1.0 + test_rng_uniform(&r));
        m.final_s = 10.0 * (1.0 + test_rng_uniform(&r));
        m.eval_every = (long)(test_rng_u64(&r) % 30); /* 0 = none */
        m.save_every = (long)(test_rng_u64(&r) % 12);
        const long step = (long)(test_rng_u64(&r) % 500);
        const double left = 200.0 * (1.0 + test_rng_uniform(&r));
        for (long n = 0; n < 60; n += 1 + it % 7) {
            const double a = train_cost_of(&m, step, n), b = brute_cost(&m, step, n);
            CHECK(&t, fabs(a - b) <= 1e-9 * (1.0 + b), "cost_of(step %ld, n %ld) = %.12g, step by step %.12g "
                  "(eval_every %ld, save_every %ld)", step, n, a, b, m.eval_every, m.save_every);
        }
        const long n = train_fit_steps(&m, step, left);
        CHECK(&t, n >= 0, "fit %ld < 0", n);
        if (n > 0) CHECK(&t, brute_cost(&m, step, n) <= left + 1e-9, "fit %ld costs %.6g > %.6g", n, brute_cost(&m, step, n), left);
        CHECK(&t, brute_cost(&m, step, n + 1) > left, "fit %ld: %ld steps still fit in %.6g s", n, n + 1, left);
    }
    /* edge cases: no time, a budget below one step + the final pass, zero step time */
    const train_cost_model m = {0.5, 2.0, 0.1, 3.0, 10, 0};
    CHECK(&t, train_fit_steps(&m, 7, 0.0) == 0, "no time left must fit 0 steps");
    CHECK(&t, train_fit_steps(&m, 7, -4.0) == 0, "negative time must fit 0 steps");
    CHECK(&t, train_fit_steps(&m, 7, 3.4) == 0, "3.4 s < 0.5 + 3 must fit 0 steps");
    CHECK(&t, train_fit_steps(&m, 7, 3.5) == 1, "3.5 s fits exactly 1 step");
    /* 10 steps after step 7: evaluations at 10 (one, 17 is the final) -> 5 + 2 + 3 = 10 s */
    CHECK(&t, fabs(train_cost_of(&m, 7, 10) - 10.0) < 1e-12, "cost_of(7, 10) = %g, want 10", train_cost_of(&m, 7, 10));
    const train_cost_model z = {0.0, 0.0, 0.0, 0.0, 0, 0};
    const long big = train_fit_steps(&z, 0, 1.0);
    CHECK(&t, big > 0 && big <= 1000000001L, "zero step time: fit %ld, want a finite positive count", big);
    printf("test_train_util: %d checks, %d failures\n", t.checks, t.failures);
    return t.failures != 0;
}
