/* Gaussian diffusion of the DiT family: schedule, noising, respacing, DDPM / DDIM samplers with
 * classifier-free guidance (dit_diffusion.h). */
#include "models/dit_diffusion.h"

#include <fenv.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"

int dit_schedule_init(dit_schedule *s, const moh_dit_config *cfg, moh_error *err) {
    const int T = cfg->diffusion_steps;
    s->T = T;
    s->betas = malloc(sizeof(double) * 2 * (size_t)T);
    if (!s->betas) return moh_fail(err, MOH_E_NOMEM, "diffusion: out of memory");
    s->acp = s->betas + T;
    double a = 1.0;
    for (int t = 0; t < T; t++) {
        /* np.linspace(start, end, T): start + t * (end - start) / (T - 1), the last exactly end */
        s->betas[t] = t == T - 1 ? cfg->beta_end
                                 : cfg->beta_start + (double)t * ((cfg->beta_end - cfg->beta_start) / (T - 1));
        a *= 1.0 - s->betas[t];
        s->acp[t] = a;
    }
    return MOH_OK;
}

void dit_schedule_free(dit_schedule *s) {
    free(s->betas);
    memset(s, 0, sizeof *s);
}

int dit_respace(int T, int S, int *use, moh_error *err) {
    if (S < 1 || S > T)
        return moh_fail(err, MOH_E_ARG, "--steps is %d, expected 1..%d (the model's diffusion_steps)", S, T);
    const double stride = S > 1 ? (double)(T - 1) / (S - 1) : 1.0;
    double cur = 0.0;
    const int mode = fegetround();
    fesetround(FE_TONEAREST);
    for (int i = 0; i < S; i++) { /* Python round(): half to even, as nearbyint in FE_TONEAREST */
        use[i] = (int)nearbyint(cur);
        cur += stride;
    }
    fesetround(mode);
    return MOH_OK;
}

/* The per-example stream of (seed, key). */
static uint64_t stream(uint64_t seed, uint64_t key) {
    uint64_t s = seed ^ 0x6469666675736EULL; /* "diffusn" */
    moh_rng_next(&s);
    s ^= key * 0x9E3779B97F4A7C15ULL;
    moh_rng_next(&s);
    return s;
}

void dit_draw(uint64_t seed, uint64_t key, int T, double drop, int n, int *t, float *eps, bool *dropped) {
    uint64_t s = stream(seed, key);
    *t = (int)(moh_rng_uniform01(&s) * T);
    if (*t >= T) *t = T - 1;
    *dropped = moh_rng_uniform01(&s) < drop;
    for (int i = 0; i < n; i++) eps[i] = (float)moh_rng_normal(&s);
}

void dit_q_sample(const dit_schedule *s, int t, const float *eps, float *x, int n) {
    const double a = sqrt(s->acp[t]), b = sqrt(1.0 - s->acp[t]);
    for (int i = 0; i < n; i++) x[i] = (float)(a * x[i] + b * eps[i]);
}

static double clip1(double v) { return v < -1.0 ? -1.0 : v > 1.0 ? 1.0 : v; }

/* the model as a dit_eps_fn: the rows split over n threads, each with its own activations (a
 * row's prediction does not depend on the other rows, so the result does not depend on n) */
#define DIT_SAMPLE_MAX_THREADS 64
typedef struct model_eps {
    const moh_dit_config *cfg;
    const dit_params_f32 *p;
    int n;                                  /* threads (activation sets) */
    dit_acts_f32 a[DIT_SAMPLE_MAX_THREADS];
    bf16_mirror wbf;                        /* bf16: the weights' bf16 copy (the weights are fixed) */
    float *out;                             /* [rows, C, H, W] */
} model_eps;

static const float *model_eps_fn(void *ctx, const float *x, const int *t, const int *y, int m) {
    model_eps *me = ctx;
    const size_t chw = (size_t)me->cfg->in_channels * me->cfg->input_size * me->cfg->input_size;
    const int n = me->n < m ? me->n : m;
#pragma omp parallel for schedule(static, 1) num_threads(n) if (n > 1)
    for (int s = 0; s < n; s++) {
        const int lo = (int)((long)m * s / n), hi = (int)((long)m * (s + 1) / n);
        dit_forward_f32(me->cfg, me->p, &me->a[s], x + (size_t)lo * chw, t + lo, y + lo, NULL, hi - lo);
        memcpy(me->out + (size_t)lo * chw, me->a[s].out, sizeof(float) * chw * (size_t)(hi - lo));
    }
    return me->out;
}

int dit_sample(const moh_dit_config *cfg, const dit_params_f32 *p, const image_gen_request *req, float *out,
               moh_error *err) {
    const bool guided = req->cfg_scale != 1.0;
    const int nb = req->batch < req->n ? req->batch : (req->n > 0 ? req->n : 1), rows = guided ? 2 * nb : nb;
    int nt = omp_get_max_threads();
    if (nt > DIT_SAMPLE_MAX_THREADS) nt = DIT_SAMPLE_MAX_THREADS;
    if (nt > rows) nt = rows;
    if (nt < 1) nt = 1;
    model_eps *me = calloc(1, sizeof *me);
    if (!me) return moh_fail(err, MOH_E_NOMEM, "sample: out of memory");
    *me = (model_eps){.cfg = cfg, .p = p};
    const size_t chw = (size_t)cfg->in_channels * cfg->input_size * cfg->input_size;
    int rc = req->batch < 1 ? moh_fail(err, MOH_E_ARG, "batch %d, expected >= 1", req->batch) : MOH_OK;
    for (; !rc && me->n < nt; me->n++) /* thread s gets at most ceil(rows / nt) rows */
        rc = dit_acts_init_f32(&me->a[me->n], cfg, (rows + nt - 1) / nt, req->sparse, err);
    if (!rc && precision_resolve(req->precision, NULL, 0) == MOH_PRECISION_BF16) {
        rc = bf16_mirror_init(&me->wbf, p->data, p->n, err);
        if (!rc) bf16_mirror_sync(&me->wbf);
        for (int s = 0; !rc && s < me->n; s++) rc = attn_stack_set_weights_f32(&me->a[s].attn, &me->wbf, err);
    }
    if (!rc && !(me->out = malloc(sizeof(float) * chw * (size_t)rows)))
        rc = moh_fail(err, MOH_E_NOMEM, "sample: out of memory");
    if (!rc) rc = dit_sample_with(cfg, model_eps_fn, me, req, out, err);
    for (int s = 0; s < me->n; s++) dit_acts_free_f32(&me->a[s]);
    bf16_mirror_free(&me->wbf);
    free(me->out);
    free(me);
    return rc;
}

int dit_sample_with(const moh_dit_config *cfg, dit_eps_fn eps_fn, void *ctx, const image_gen_request *req, float *out,
                    moh_error *err) {
    const int n = req->n, S = req->steps, K = cfg->num_classes;
    const size_t chw = (size_t)cfg->in_channels * cfg->input_size * cfg->input_size;
    if (!(req->cfg_scale >= 0) || !isfinite(req->cfg_scale))
        return moh_fail(err, MOH_E_ARG, "--cfg is %g, expected a finite number >= 0 (1 = no guidance)", req->cfg_scale);
    if (req->batch < 1) return moh_fail(err, MOH_E_ARG, "batch %d, expected >= 1", req->batch);
    if (req->sampler != 0 && req->sampler != 1) return moh_fail(err, MOH_E_ARG, "sampler %d, expected ddpm or ddim", req->sampler);
    for (int i = 0; i < n; i++)
        if (req->labels[i] < 0 || req->labels[i] > K)
            return moh_fail(err, MOH_E_ARG, "--class %d, expected 0..%d (the model's classes)", req->labels[i], K - 1);
    int *use = malloc(sizeof(int) * (size_t)(S > 0 ? S : 1));
    if (!use) return moh_fail(err, MOH_E_NOMEM, "sample: out of memory");
    int rc = dit_respace(cfg->diffusion_steps, S, use, err);
    dit_schedule sch = {0};
    if (!rc) rc = dit_schedule_init(&sch, cfg, err);
    const bool guided = req->cfg_scale != 1.0;
    const int nb = req->batch < n ? req->batch : (n > 0 ? n : 1), mb = guided ? 2 * nb : nb;
    double *tab = malloc(sizeof(double) * 4 * (size_t)(S > 0 ? S : 1));
    uint64_t *rng = malloc(sizeof(uint64_t) * (size_t)(n > 0 ? n : 1));
    float *xin = malloc(sizeof(float) * chw * (size_t)mb);
    int *tt = malloc(sizeof(int) * 2 * (size_t)mb);
    if (!rc && (!tab || !rng || !xin || !tt)) rc = moh_fail(err, MOH_E_NOMEM, "sample: out of memory");
    if (rc) goto out;
    /* respaced schedule: acp' = acp at the used steps, acp_prev', beta' = 1 - acp'/acp_prev',
     * posterior variance beta' (1 - acp_prev') / (1 - acp') */
    double *acp = tab, *prev = tab + S, *beta = tab + 2 * S, *post = tab + 3 * S;
    for (int k = 0; k < S; k++) {
        acp[k] = sch.acp[use[k]];
        prev[k] = k ? acp[k - 1] : 1.0;
        beta[k] = 1.0 - acp[k] / prev[k];
        post[k] = beta[k] * (1.0 - prev[k]) / (1.0 - acp[k]);
    }
    for (int i = 0; i < n; i++) { /* x_T of image i from (seed, i) alone */
        rng[i] = stream(req->seed, (uint64_t)i);
        for (size_t j = 0; j < chw; j++) out[(size_t)i * chw + j] = (float)moh_rng_normal(&rng[i]);
    }
    int *yy = tt + mb;
    long done = 0;
    for (int c0 = 0; c0 < n; c0 += nb) {
        const int cnt = n - c0 < nb ? n - c0 : nb, m = guided ? 2 * cnt : cnt;
        for (int k = S - 1; k >= 0; k--) {
            for (int j = 0; j < m; j++) {
                const int i = c0 + (j % cnt);
                memcpy(xin + (size_t)j * chw, out + (size_t)i * chw, sizeof(float) * chw);
                tt[j] = use[k]; /* the model sees the original timestep (timestep_map) */
                yy[j] = j < cnt ? req->labels[i] : K;
            }
            const float *eps = eps_fn(ctx, xin, tt, yy, m);
            const double sa = sqrt(1.0 / acp[k]), sb = sqrt(1.0 / acp[k] - 1.0);
            /* fixed large: variance beta' (the first step uses the posterior variance of step 1) */
            const double var = req->variance == 0 ? (k == 0 ? (S > 1 ? post[1] : post[0]) : beta[k]) : post[k];
            const double c1 = beta[k] * sqrt(prev[k]) / (1.0 - acp[k]);
            const double c2 = (1.0 - prev[k]) * sqrt(1.0 - beta[k]) / (1.0 - acp[k]);
            for (int j = 0; j < cnt; j++) {
                float *x = out + (size_t)(c0 + j) * chw;
                const float *ec = eps + (size_t)j * chw, *eu = guided ? eps + (size_t)(cnt + j) * chw : ec;
                for (size_t q = 0; q < chw; q++) {
                    const double e = eu[q] + req->cfg_scale * ((double)ec[q] - eu[q]);
                    const double x0 = clip1(sa * x[q] - sb * e);
                    double v;
                    if (req->sampler == 1) { /* DDIM, eta 0: eps re-derived from the clipped x0 */
                        const double e2 = (sa * x[q] - x0) / sb;
                        v = x0 * sqrt(prev[k]) + sqrt(1.0 - prev[k]) * e2;
                    } else {
                        v = c1 * x0 + c2 * x[q];
                        if (k > 0) v += sqrt(var) * moh_rng_normal(&rng[c0 + j]);
                    }
                    x[q] = (float)v;
                }
            }
            done++;
            if (req->progress) req->progress(req->ctx, done, (long)S * ((n + nb - 1) / nb));
        }
    }
    for (size_t q = 0; q < chw * (size_t)n; q++) out[q] = (float)clip1(out[q]);
out:
    dit_schedule_free(&sch);
    free(use);
    free(tab);
    free(rng);
    free(xin);
    free(tt);
    return rc;
}
