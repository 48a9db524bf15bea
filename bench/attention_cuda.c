/* `moh bench attention --device cuda`: the CUDA MoH attention layer (src/cuda/) at the shapes of
 * the paper's models, dense MHA (router none, the same kernels) against MoH at several active-head
 * shares, in the same run, configurations interleaved repeat by repeat. Per row (CUDA events,
 * median of R after W warm-ups, bf16 operands, fp32 accumulation):
 *   core_fwd     the flash attention forward alone (packed q, K, V -> o; gates applied, outputs
 *                scattered): FLOPs 4 d V, V = key visits (sum over computed pairs of the keys
 *                attended: N, or position + 1 when causal), the convention of FlashAttention's
 *                and cuDNN's benchmarks (causal counts the lower triangle);
 *   core_fwdbwd  that plus the backward core (per-pair preprocessing, flash backward, dQ out of
 *                its fp32 accumulator): FLOPs 4 d V + 10 d V (backward = 2.5 x forward);
 *   layer_fwd    the whole layer forward (projections, router, segments, packing, attention, W_O);
 *   layer_fwdbwd the whole layer forward + backward (every gradient).
 * speedup = dense ms / this ms (same kernels, same run); ideal = V(dense) / V(this) for the core
 * rows; eff = speedup / ideal. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../cli/args.h"
#include "attn/attn.h"
#include "bench.h"
#include "cuda/host.h"
#include "ops/bf16.h"

#define BC_MAX_CFG 6
#define BC_REPS 200

typedef struct bc_shape {
    const char *name;
    int B, C, h, hkv, d, N;
    bool causal, bias;
    double rope;
    moh_router router;
} bc_shape;

/* The shapes of the kernels issue: ViT-B/16 at N 4096 and at 197 tokens (224 px), DiT-XL/2 (256
 * latent patches, 16 heads x 72), a LLaMA-3-8B layer (32 x 128, 8 KV heads, causal, RoPE; the
 * query-norm router of MoH-LLaMA3). */
static const bc_shape SHAPES[] = {
    {"vit-b-4096", 8, 768, 12, 12, 64, 4096, false, true, 0.0, MOH_ROUTER_LEARNED},
    {"vit-b-197", 256, 768, 12, 12, 64, 197, false, true, 0.0, MOH_ROUTER_LEARNED},
    {"dit-xl-256", 256, 1152, 16, 16, 72, 256, false, true, 0.0, MOH_ROUTER_LEARNED},
    {"llama-4096", 4, 4096, 32, 8, 128, 4096, true, false, 500000.0, MOH_ROUTER_QUERY_NORM},
};
#define BC_NSHAPES ((int)(sizeof SHAPES / sizeof SHAPES[0]))

enum { W_CORE_FWD, W_CORE_FWDBWD, W_LAYER_FWD, W_LAYER_FWDBWD, W_N };
static const char *const WHAT[W_N] = {"core_fwd", "core_fwdbwd", "layer_fwd", "layer_fwdbwd"};

typedef struct bc_cfg {
    moh_attn_config cfg;
    char label[32];
    moh_cuda_layer *l;
    void *wbuf, *gbuf;
    moh_cuda_weights w;
    moh_cuda_grads g;
    double V;          /* key visits of the computed pairs */
    double active;     /* computed pairs / (T h) */
    double t[W_N][BC_REPS];
} bc_cfg;


static void cfg_free(bc_cfg *c) {
    moh_cuda_layer_free(c->l);
    cu_dev_free(c->wbuf);
    cu_dev_free(c->gbuf);
    memset(c, 0, sizeof *c);
}

/* One configuration of a shape: its layer, weights (std 0.02, as the CPU benchmark) and gradients. */
static int cfg_init(bc_cfg *c, const bc_shape *s, double share, uint64_t seed, moh_error *err) {
    memset(c, 0, sizeof *c);
    moh_attn_config *a = &c->cfg;
    moh_attn_config_default(a);
    a->hidden_size = s->C;
    a->n_heads = s->h;
    a->n_kv_heads = s->hkv;
    a->head_dim = s->d;
    a->causal = s->causal;
    a->rope_theta = s->rope;
    a->qkv_bias = a->proj_bias = s->bias;
    a->load_balance_coef = 0.01;
    if (share >= 1.0) {
        a->router = MOH_ROUTER_NONE;
        snprintf(c->label, sizeof c->label, "dense");
    } else { /* h_s = h / 4 shared, top_k for the share (as the CPU benchmark) */
        a->router = s->router;
        a->shared_heads = s->h / 4;
        const int E = s->h - a->shared_heads;
        int best = 1;
        for (int k = 1; k <= E; k++)
            if (fabs((a->shared_heads + k) - share * s->h) <= fabs((a->shared_heads + best) - share * s->h)) best = k;
        a->top_k = best;
        snprintf(c->label, sizeof c->label, "moh-%d (%d+%d)", (int)lround(100.0 * (a->shared_heads + best) / s->h),
                 a->shared_heads, best);
    }
    const size_t np = attn_params_bind_f32(&(attn_params_f32){0}, NULL, a);
    float *w = malloc(sizeof(float) * (np ? np : 1));
    if (!w) return moh_fail(err, MOH_E_NOMEM, "bench attention: out of host memory");
    uint64_t r = seed;
    for (size_t i = 0; i < np; i++) w[i] = bench_rng_sd(&r, 0.02);
    attn_params_f32 p;
    attn_params_bind_f32(&p, w, a);
    int rc = moh_cuda_layer_new(&c->l, a, s->B, s->N, err);
    if (!rc) rc = cu_weights_upload(a, &p, &c->wbuf, &c->w, err);
    if (!rc) rc = cu_grads_alloc(a, &c->gbuf, &c->g, err);
    free(w);
    return rc;
}

/* Key visits and the active share of the last forward (segments downloaded). */
static int cfg_visits(bc_cfg *c, const bc_shape *s, moh_error *err) {
    const size_t S = (size_t)s->B * s->h;
    int *cnt = malloc(S * sizeof(int)), *pos = malloc(S * s->N * sizeof(int));
    if (!cnt || !pos) {
        free(cnt);
        free(pos);
        return moh_fail(err, MOH_E_NOMEM, "bench attention: out of host memory");
    }
    const int rc = cu_layer_segments(c->l, cnt, pos, err);
    double V = 0, P = 0;
    for (size_t sg = 0; sg < S && !rc; sg++) {
        P += cnt[sg];
        for (int r = 0; r < cnt[sg]; r++) V += s->causal ? pos[sg * s->N + r] + 1 : s->N;
    }
    c->V = V;
    c->active = P / ((double)s->B * s->N * s->h);
    free(cnt);
    free(pos);
    return rc;
}

/* One measurement of what w on c: device milliseconds. */
static int measure(bc_cfg *c, int w, const void *x, const void *dy, void *y, float *dx, const bc_shape *s,
                   cu_timer *tm, double *ms, moh_error *err) {
    int rc = cu_timer_start(tm, err);
    if (rc) return rc;
    switch (w) {
    case W_CORE_FWD: rc = cu_layer_core_forward(c->l, NULL, err); break;
    case W_CORE_FWDBWD:
        rc = cu_layer_core_forward(c->l, NULL, err);
        if (!rc) rc = cu_layer_core_backward(c->l, NULL, err);
        break;
    case W_LAYER_FWD: rc = moh_cuda_layer_forward(c->l, &c->w, x, s->B, s->N, y, NULL, err); break;
    default:
        rc = moh_cuda_layer_forward(c->l, &c->w, x, s->B, s->N, y, NULL, err);
        if (!rc) rc = moh_cuda_layer_backward(c->l, &c->w, &c->g, dy, 0.01f, dx, NULL, err);
    }
    if (rc) return rc;
    if ((rc = cu_timer_stop(tm, ms, err))) return rc;
    return moh_cuda_layer_sync(c->l, NULL, err);
}

static double flops_core(const bc_cfg *c, int w) {
    const double d = c->cfg.head_dim;
    return w == W_CORE_FWD ? 4 * d * c->V : 14 * d * c->V;
}

int bench_attention_cuda(int argc, char **argv) {
    struct {
        bool json, phases;
        const char *shapes, *active, *device;
        int repeats, warmup;
    } a = {false, false, "all", "0.75,0.5", "cuda", 20, 3};
    const arg_spec specs[] = {
        {"--device", ARG_CHOICE, &a.device, "cpu|cuda", "cuda: this benchmark (cpu: `moh bench attention` without it)", false, ARG_ANY},
        {"--json", ARG_FLAG, &a.json, NULL, "print a JSON array of rows instead of the table", false, ARG_ANY},
        {"--shapes", ARG_STR, &a.shapes, "NAME,...", "vit-b-4096 (B 8, 12 x 64, N 4096), vit-b-197 (B 256, N 197), dit-xl-256 (B 256, 16 x 72, N 256), llama-4096 (B 4, 32 x 128, 8 KV heads, N 4096, causal, RoPE, query-norm router), or all (default)", false, ARG_ANY},
        {"--active", ARG_STR, &a.active, "S,S,...", "MoH active-head shares in (0,1) (default 0.75,0.5; dense MHA always runs)", false, ARG_ANY},
        {"--repeats", ARG_INT, &a.repeats, "R", "timed repeats per row, interleaved (default 20)", false, ARG_IN(1, BC_REPS)},
        {"--warmup", ARG_INT, &a.warmup, "W", "untimed runs of each row first (default 3)", false, ARG_IN(0, 100)},
        {"--phases", ARG_FLAG, &a.phases, NULL, "then the layer's forward + backward R more times with events at its phase boundaries: ms per phase (stderr)", false, ARG_ANY},
    };
    int prc = args_parse("bench attention", argc, argv, specs, (int)(sizeof specs / sizeof specs[0]),
                         "--device cuda [--shapes vit-b-4096,...] [--active 0.75,0.5] [--repeats R] [--warmup W] [--json]",
                         "The CUDA MoH attention layer at the paper's shapes: dense MHA (router none) and MoH on the same\n"
                         "kernels, bf16 with fp32 accumulation. Rows: core_fwd, core_fwdbwd (flash attention alone,\n"
                         "TFLOP/s of 4 d V and 14 d V, V = key visits), layer_fwd, layer_fwdbwd (the whole layer);\n"
                         "speedup over dense in the same run, ideal (FLOP ratio), efficiency. Formulas: bench/attention_cuda.c.\n");
    if (prc) return prc == 1 ? 0 : prc;
    double shares[BC_MAX_CFG] = {0};
    const int nS = bench_parse_doubles(a.active, shares, BC_MAX_CFG - 1);
    if (nS < 0) {
        fprintf(stderr, "moh bench attention: --active '%s': expected up to %d shares 0 < S < 1\n", a.active, BC_MAX_CFG - 1);
        return 2;
    }
    bool use[BC_NSHAPES];
    int nuse = 0;
    for (int i = 0; i < BC_NSHAPES; i++) {
        use[i] = !strcmp(a.shapes, "all") || strstr(a.shapes, SHAPES[i].name) != NULL;
        nuse += use[i];
    }
    if (!nuse) {
        fprintf(stderr, "moh bench attention: --shapes '%s': expected vit-b-4096, vit-b-197, dit-xl-256, llama-4096 or all\n", a.shapes);
        return 2;
    }
    char why[256], dev[256];
    moh_error err = {0};
    if (!moh_cuda_available(why, sizeof why)) {
        fprintf(stderr, "moh bench attention: --device cuda: %s\n", why);
        return 1;
    }
    if (moh_cuda_describe(dev, sizeof dev, &err)) snprintf(dev, sizeof dev, "unknown GPU");
    if (a.json) printf("[\n");
    else printf("moh bench attention --device cuda: %s; bf16, fp32 accumulation; median of %d after %d warm-ups;\n"
                "forward kernel: mma.sync (MOH_CUDA_FWD=wgmma|wgmma1 selects a wgmma variant on sm_90a)\n\n"
                "%-11s %-14s %-13s %9s %9s %8s %7s %6s %7s\n", dev, a.repeats, a.warmup, "shape", "config", "what", "ms",
                "TFLOP/s", "speedup", "ideal", "eff", "active");
    bool first = true;
    int status = 0;
    cu_timer *tm = NULL;
    if (cu_timer_new(&tm, &err)) {
        fprintf(stderr, "moh bench attention: %s\n", err.msg);
        return 1;
    }
    for (int si = 0; si < BC_NSHAPES && !status; si++) {
        if (!use[si]) continue;
        const bc_shape *s = &SHAPES[si];
        const size_t T = (size_t)s->B * s->N, TC = T * s->C;
        bc_cfg *cf = calloc(BC_MAX_CFG, sizeof *cf);
        uint16_t *h16 = malloc(TC * sizeof(uint16_t));
        void *x = NULL, *dy = NULL, *y = NULL, *dx = NULL;
        int nc = 0;
        if (!cf || !h16) status = moh_fail(&err, MOH_E_NOMEM, "out of host memory");
        if (!status) status = cu_dev_alloc(&x, TC * 2, &err);
        if (!status) status = cu_dev_alloc(&dy, TC * 2, &err);
        if (!status) status = cu_dev_alloc(&y, TC * 2, &err);
        if (!status) status = cu_dev_alloc(&dx, TC * 4, &err);
        if (!status) {
            uint64_t r = 0x5EEDULL + (uint64_t)si;
            for (size_t i = 0; i < TC; i++) h16[i] = bf16_round(bench_rng_sd(&r, 1.0));
            status = cu_copy_to_dev(x, h16, TC * 2, &err);
            for (size_t i = 0; i < TC && !status; i++) h16[i] = bf16_round(bench_rng_sd(&r, 1.0));
            if (!status) status = cu_copy_to_dev(dy, h16, TC * 2, &err);
            if (!status) status = cu_dev_memset(dx, 0, TC * 4, &err);
        }
        const double group[BC_MAX_CFG] = {1.0, shares[0], shares[1], shares[2], shares[3], shares[4]};
        for (int g = 0; g <= nS && !status; g++) {
            if (g > 0 && !(group[g] > 0.0 && group[g] < 1.0)) continue;
            fprintf(stderr, "[%s] setting up %s\n", s->name, g ? "MoH" : "dense");
            status = cfg_init(&cf[nc], s, group[g], 0xC0FFEEULL + (uint64_t)si, &err);
            nc++;
        }
        /* warm-up (plans, first launches; the whole layer first: the core rows reuse its buffers),
         * then the segments of a forward for the FLOP counts */
        for (int c = 0; c < nc && !status; c++)
            for (int w = W_N - 1; w >= 0 && !status; w--)
                for (int k = 0; k < (a.warmup > 0 ? a.warmup : 1) && !status; k++) {
                    double ms;
                    status = measure(&cf[c], w, x, dy, y, dx, s, tm, &ms, &err);
                }
        for (int c = 0; c < nc && !status; c++) {
            double ms;
            status = measure(&cf[c], W_LAYER_FWD, x, dy, y, dx, s, tm, &ms, &err);
            if (!status) status = cfg_visits(&cf[c], s, &err);
        }
        for (int rep = 0; rep < a.repeats && !status; rep++)
            for (int w = 0; w < W_N && !status; w++)
                for (int k = 0; k < nc && !status; k++) {
                    bc_cfg *c = &cf[(k + rep) % nc]; /* rotate the order every repeat */
                    status = measure(c, w, x, dy, y, dx, s, tm, &c->t[w][rep], &err);
                }
        for (int w = 0; w < W_N && !status; w++) {
            const double dense_ms = bench_summarise(cf[0].t[w], a.repeats).median;
            for (int c = 0; c < nc; c++) {
                const bench_stats st = bench_summarise(cf[c].t[w], a.repeats);
                const bool core = w <= W_CORE_FWDBWD;
                const double tfl = core ? flops_core(&cf[c], w) / (st.median * 1e-3) * 1e-12 : 0.0;
                const double speedup = dense_ms / st.median, ideal = core ? cf[0].V / cf[c].V : 0.0;
                if (a.json) {
                    printf("%s  {\"engine\": \"moh\", \"shape\": \"%s\", \"config\": \"%s\", \"what\": \"%s\", "
                           "\"ms\": %.4f, \"ms_min\": %.4f, \"ms_max\": %.4f, \"tflops\": %.2f, \"speedup\": %.4f, "
                           "\"ideal\": %.4f, \"active\": %.4f, \"shared_heads\": %d, \"top_k\": %d, \"router\": \"%s\", "
                           "\"B\": %d, \"N\": %d, \"heads\": %d, \"kv_heads\": %d, \"head_dim\": %d, \"causal\": %s, "
                           "\"fwd_kernel\": \"%s\"}",
                           first ? "" : ",\n", s->name, cf[c].label, WHAT[w], st.median, st.min, st.max, tfl, speedup,
                           ideal, cf[c].active, cf[c].cfg.shared_heads, cf[c].cfg.top_k,
                           attn_router_name(cf[c].cfg.router), s->B, s->N, s->h, s->hkv, s->d,
                           s->causal ? "true" : "false", cu_layer_forward_kernel(cf[c].l));
                    first = false;
                } else {
                    char tf[16] = "", id[16] = "", ef[16] = "";
                    if (core) {
                        snprintf(tf, sizeof tf, "%.1f", tfl);
                        snprintf(id, sizeof id, "%.3f", ideal);
                        snprintf(ef, sizeof ef, "%.3f", speedup / ideal);
                    }
                    printf("%-11s %-14s %-13s %9.4f %9s %8.3f %7s %6s %7.3f\n", s->name, cf[c].label, WHAT[w], st.median,
                           tf, speedup, id, ef, cf[c].active);
                }
            }
        }
        for (int c = 0; c < nc && !status && a.phases; c++) { /* per-phase breakdown (stderr) */
            double ms[CU_NPHASE], tot = 0;
            status = cu_layer_profile(cf[c].l, true, &err);
            for (int rep = 0; rep < a.repeats && !status; rep++) {
                double t;
                status = measure(&cf[c], W_LAYER_FWDBWD, x, dy, y, dx, s, tm, &t, &err);
            }
            const long n = cu_layer_phase_ms(cf[c].l, ms, true);
            fprintf(stderr, "phases %-11s %-14s", s->name, cf[c].label);
            for (int ph = 0; ph < CU_NPHASE && n > 0; ph++) {
                fprintf(stderr, " %s %.3f", cu_phase_name(ph), ms[ph] / n);
                tot += ms[ph] / n;
            }
            fprintf(stderr, " | total %.3f ms\n", tot);
            if (!status) status = cu_layer_profile(cf[c].l, false, &err);
        }
        if (!a.json) printf("\n");
        fflush(stdout);
        for (int c = 0; c < nc; c++) cfg_free(&cf[c]);
        free(cf);
        free(h16);
        cu_dev_free(x);
        cu_dev_free(dy);
        cu_dev_free(y);
        cu_dev_free(dx);
    }
    cu_timer_free(tm);
    if (a.json) printf("\n]\n");
    if (status) {
        fprintf(stderr, "moh bench attention: %s\n", err.msg);
        return 1;
    }
    return 0;
}
