/* `moh bench attention`: one MoH attention layer, head-sparse path (src/attn/sparse.c), dense MHA
 * (router "none": every head, same engine) against MoH at several active-head shares.
 *
 * FLOPs counted (only the work that must be done; B = 1, P = selected (token, head) pairs, P = N h
 * for dense MHA; V = key visits = sum over selected pairs of the keys attended: P N bidirectional,
 * sum of (position + 1) causal; E routed heads, h_s shared):
 *   forward  F = 2 N C (2 h_kv d)           K and V projections (every token, every KV head)
 *              + 2 P C d                     Q projection of the selected pairs
 *              + 4 d V                       Q K^T and P V of the selected pairs
 *              + 2 P d C                     W_O of the selected pairs
 *              + 2 N C (E + h_s' + 2')       router linears (learned router; h_s' = h_s if h_s >= 2,
 *                                            2' = 2 if h_s >= 1; 0 for dense MHA)
 *   backward = 2 x (projection and router terms) + 8 d V   (dS K, dS^T Q, P^T dO, dO V^T)
 *   train    = forward + backward.
 * Not counted: softmax and exp, RoPE, biases, gathers, and the Q K^T recomputation of the
 * flash-attention backward (2 d V, a choice that keeps memory linear in N).
 * ideal = F(dense) / F(MoH) for the same pass; efficiency = speedup / ideal. */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../cli/args.h"
#include "attn/sparse.h"
#include "bench.h"
#include "ops/bf16.h"

#define BA_MAX_N 16
#define BA_MAX_ACT 8

typedef struct ba_model {
    const char *name;
    int C, h, d;
    bool causal;
    double rope;
} ba_model;

static const ba_model MODELS[] = {
    {"vit-b", 768, 12, 64, false, 0.0},   /* ViT-B/16 attention: bidirectional, no RoPE */
    {"llm", 1024, 16, 64, true, 10000.0}, /* decoder LM layer: causal, RoPE */
};

/* One configuration of a group (dense or MoH at one share), with its buffers. */
typedef struct ba_run {
    moh_attn_config cfg;
    double target;           /* requested active share (1 = dense) */
    float *w, *gw, *x, *y, *dy, *dx;
    size_t np;
    attn_params_f32 p, g;
    sparse_cache cache;
    attn_cache_f32 ref;      /* --reference: the reference path's cache ([h, N, N] matrices) */
    bool ok, have_ref;
    bool bf16;               /* bf16 compute: the K/V GEMM through oneDNN bf16, bf16 attention tiles */
    bf16_mirror mw;          /* its bf16 copy of the weights (converted once: the weights never change) */
    bf16_ctx *b16;
    double tref[64];
    double t[64];            /* seconds per repeat */
    double cpu[64];          /* process CPU seconds per repeat */
    double phase[SPARSE_NPHASE];
} ba_run;


/* MoH split for a target share of h heads: h_s = h / 4 shared, top_k routed, h_s + top_k as near
 * share * h as possible (ties toward more heads). */
static void pick_split(const ba_model *m, double share, int *hs, int *k) {
    *hs = m->h / 4;
    const int E = m->h - *hs;
    int best = 1;
    for (int kk = 1; kk <= E; kk++)
        if (fabs((*hs + kk) - share * m->h) <= fabs((*hs + best) - share * m->h)) best = kk;
    *k = best;
}

static double layer_flops(const moh_attn_config *cfg, double N, double P, double V, bool train) {
    const double C = cfg->hidden_size, d = cfg->head_dim, hkv = cfg->n_kv_heads;
    const double proj = 2 * N * C * 2 * hkv * d + 2 * P * C * d + 2 * P * d * C;
    double router = 0.0;
    if (cfg->router == MOH_ROUTER_LEARNED && cfg->top_k > 0) {
        const int hs = cfg->shared_heads;
        router = 2 * N * C * (attn_routed_heads(cfg) + (hs >= 2 ? hs : 0) + (hs >= 1 ? 2 : 0));
    }
    const double fwd = proj + router + 4 * d * V;
    return train ? fwd + 2 * (proj + router) + 8 * d * V : fwd;
}

static void run_free(ba_run *r) {
    if (r->ok) sparse_cache_free(&r->cache);
    bf16_ctx_free(r->b16);
    bf16_mirror_free(&r->mw);
    if (r->have_ref) attn_cache_free_f32(&r->ref);
    free(r->w);
    free(r->gw);
    free(r->x);
    free(r->y);
    free(r->dy);
    free(r->dx);
    memset(r, 0, sizeof *r);
}

static int run_init(ba_run *r, const ba_model *m, int N, double share, bool train, bool ref, bool bf16,
                    uint64_t seed, moh_error *err) {
    memset(r, 0, sizeof *r);
    moh_attn_config *c = &r->cfg;
    moh_attn_config_default(c);
    c->hidden_size = m->C;
    c->n_heads = c->n_kv_heads = m->h;
    c->head_dim = m->d;
    c->causal = m->causal;
    c->rope_theta = m->rope;
    c->qkv_bias = c->proj_bias = true;
    c->load_balance_coef = 0.01;
    r->target = share;
    if (share >= 1.0) {
        c->router = MOH_ROUTER_NONE;
    } else {
        c->router = MOH_ROUTER_LEARNED;
        pick_split(m, share, &c->shared_heads, &c->top_k);
    }
    r->np = attn_params_bind_f32(&(attn_params_f32){0}, NULL, c);
    const size_t TC = (size_t)N * m->C;
    r->w = malloc(sizeof(float) * r->np);
    r->x = malloc(sizeof(float) * TC);
    r->y = malloc(sizeof(float) * TC);
    if (train) {
        r->gw = calloc(r->np, sizeof(float));
        r->dy = malloc(sizeof(float) * TC);
        r->dx = calloc(TC, sizeof(float));
    }
    if (!r->w || !r->x || !r->y || (train && (!r->gw || !r->dy || !r->dx)))
        return moh_fail(err, MOH_E_NOMEM, "bench attention: out of memory at N=%d", N);
    attn_params_bind_f32(&r->p, r->w, c);
    if (train) attn_params_bind_f32(&r->g, r->gw, c);
    /* ViT-style init: every weight (router included) std 0.02; unit-variance inputs. The router
     * logits are then small and uneven, so top-k spreads the tokens over the routed heads. */
    uint64_t s = seed;
    for (size_t i = 0; i < r->np; i++) r->w[i] = bench_rng_sd(&s, 0.02);
    for (size_t i = 0; i < TC; i++) r->x[i] = bench_rng_sd(&s, 1.0);
    if (train)
        for (size_t i = 0; i < TC; i++) r->dy[i] = bench_rng_sd(&s, 1.0);
    if (sparse_cache_init(&r->cache, c, 1, N, err)) return err->code;
    r->ok = true;
    if (bf16) {
        r->bf16 = true;
        if (bf16_mirror_init(&r->mw, r->w, r->np, err) || bf16_ctx_new(&r->b16, &r->mw, err) ||
            sparse_cache_set_bf16(&r->cache, c, r->b16, err))
            return err->code;
        bf16_mirror_sync(&r->mw);
    }
    if (ref) {
        if (attn_cache_init_f32(&r->ref, c, 1, N, err)) return err->code;
        r->have_ref = true;
    }
    return MOH_OK;
}

static void run_ref(ba_run *r, int N, bool train) {
    attn_forward_f32(&r->cfg, &r->p, r->x, 1, N, r->y, &r->ref);
    if (train) attn_backward_f32(&r->cfg, &r->p, &r->g, &r->ref, r->dy, 0.01f, r->dx);
}

static void run_once(ba_run *r, int N, bool train) {
    sparse_forward_f32(&r->cfg, &r->p, r->x, 1, N, r->y, &r->cache);
    if (train) sparse_backward_f32(&r->cfg, &r->p, &r->g, &r->cache, r->dy, 0.01f, r->dx);
}

int bench_attention(int argc, char **argv) {
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--device") && !strcmp(argv[i + 1], "cuda")) return bench_attention_cuda(argc, argv);
    /* sgemm_fraction: GFLOP/s of a row over the median rate of a 4096x2304x768 gemm_f32 timed once
     * per repeat between the configurations, so both see the same machine conditions */
    struct {
        bool json, phases, reference;
        const char *model, *n, *active, *pass, *precision, *device;
        int repeats;
    } a = {false, false, false, "all", "256,512,1024,2048,4096,8192", "0.9,0.75,0.5", "all", "fp32", "cpu", 5};
    const arg_spec specs[] = {
        {"--device", ARG_CHOICE, &a.device, "cpu|cuda", "cpu (default): this CPU benchmark; cuda: the GPU kernels at the paper's shapes (`moh bench attention --device cuda --help`)", false, ARG_ANY},
        {"--json", ARG_FLAG, &a.json, NULL, "print a JSON array of rows instead of the table", false, ARG_ANY},
        {"--model", ARG_CHOICE, &a.model, "vit-b|llm|all", "vit-b: d_model 768, 12 heads, bidirectional; llm: 1024, 16 heads, causal, RoPE (default all)", false, ARG_ANY},
        {"--n", ARG_STR, &a.n, "N,N,...", "sequence lengths (default 256,512,1024,2048,4096,8192)", false, ARG_ANY},
        {"--active", ARG_STR, &a.active, "S,S,...", "MoH active-head shares in (0,1] (default 0.9,0.75,0.5; dense MHA always runs)", false, ARG_ANY},
        {"--pass", ARG_CHOICE, &a.pass, "forward|train|all", "forward only, forward + backward, or both (default all)", false, ARG_ANY},
        {"--precision", ARG_CHOICE, &a.precision, "fp32|bf16|both", "compute precision (bf16: K/V GEMM through oneDNN bf16, QK^T and PV tiles with vdpbf16ps, fp32 accumulation and softmax); both: every row in each, interleaved, with the fp32/bf16 time ratio (default fp32)", false, ARG_ANY},
        {"--repeats", ARG_INT, &a.repeats, "R", "timed repeats per configuration, interleaved (default 5, max 64)", false, ARG_IN(1, 64)},
        {"--phases", ARG_FLAG, &a.phases, NULL, "also print the per-phase breakdown under each row of the table", false, ARG_ANY},
        {"--reference", ARG_FLAG, &a.reference, NULL, "also time the reference path (every head computed, then gated, as the official code) for N <= 4096; extra rows with path \"reference\"", false, ARG_ANY},
    };
    int prc = args_parse("bench attention", argc, argv, specs, (int)(sizeof specs / sizeof specs[0]),
                         "[--json] [--model vit-b|llm|all] [--n 1024,4096] [--active 0.75,0.5] [--pass forward|train|all] [--precision fp32|bf16|both] [--repeats R]",
                         "One attention layer, B = 1, through the head-sparse engine: dense MHA (router none) and MoH\n(learned router, h_s = h/4 shared heads, top_k chosen for the share). Per row: median ms\n(min-max), GFLOP/s of the FLOPs that must be done (formula: bench/attention.c, docs/benchmarks.md),\nspeedup over dense MHA in the same run, ideal speedup (FLOP ratio), efficiency = speedup/ideal,\nfraction of the machine's 4096x2304x768 sgemm rate, and the memory of the path.\n");
    if (prc) return prc == 1 ? 0 : prc;
    int Ns[BA_MAX_N];
    double shares[BA_MAX_ACT];
    const int nN = bench_parse_ints(a.n, Ns, BA_MAX_N);
    const int nS = bench_parse_doubles(a.active, shares, BA_MAX_ACT - 1);
    if (nN < 1) {
        fprintf(stderr, "moh bench attention: --n '%s': expected up to %d comma-separated integers 1..16777216\n", a.n, BA_MAX_N);
        return 2;
    }
    if (nS < 0) {
        fprintf(stderr, "moh bench attention: --active '%s': expected up to %d comma-separated shares 0 < S <= 1\n", a.active, BA_MAX_ACT - 1);
        return 2;
    }
    const bool fwd = !strcmp(a.pass, "forward") || !strcmp(a.pass, "all");
    const bool trn = !strcmp(a.pass, "train") || !strcmp(a.pass, "all");
    const int nmodels = (int)(sizeof MODELS / sizeof MODELS[0]);
    bool use_model[2] = {false, false};
    for (int i = 0; i < nmodels; i++) use_model[i] = !strcmp(a.model, "all") || !strcmp(a.model, MODELS[i].name);
    /* the group: dense first, then the MoH shares (a share of 1 is the dense row itself) */
    double group[BA_MAX_ACT];
    int ng = 0;
    group[ng++] = 1.0;
    for (int i = 0; i < nS; i++)
        if (shares[i] < 1.0) group[ng++] = shares[i];
    /* precisions: the group in fp32, then (both) the same group in bf16: runs[g + ng] */
    bool pr_fp32, pr_bf16;
    char bfline[256];
    bench_precisions("attention", a.precision, &pr_fp32, &pr_bf16, bfline, sizeof bfline);
    const int npr = pr_fp32 && pr_bf16 ? 2 : 1, nrun = ng * npr;

    char cpu[256], gemm[256];
    bench_cpu_model(cpu, sizeof cpu);
    bench_gemm_line(gemm, sizeof gemm);
    fprintf(stderr, "moh bench attention: measuring the sgemm reference (4096x2304x768)...\n");
    const double sgemm0 = bench_sgemm_gflops(4096, 2304, 768, 8);
    const int threads = omp_get_max_threads();
    if (a.json) {
        printf("[\n");
    } else {
        char cond[256];
        bench_conditions(cond, sizeof cond);
        printf("moh bench attention: %s; %s\n", cpu, cond);
        printf("GEMM: %s; sgemm 4096x2304x768: %.1f GFLOP/s (best of 8 at start; sgemm%% below uses the\n"
               "median of one sgemm per repeat, timed in the same rotation as the rows)\n", gemm, sgemm0);
        if (pr_bf16) printf("bf16 rows: %s\n", bfline);
        printf("kernels: %s\n\n", __builtin_cpu_supports("avx512f") ? "moh AVX-512 register tiles (6 x 64) for every per-head product; oneDNN for the dense K/V GEMM" : "portable C loops (no AVX-512) for per-head products; oneDNN for the dense K/V GEMM");
        printf("%-6s %6s %-8s %-13s %22s %8s %8s %6s %5s %7s %9s %9s %5s\n", "model", "N", "pass", "active(hs+k)",
               "ms median (min-max)", "GFLOP/s", "speedup", "ideal", "eff", "sgemm%", "mem MiB", "cpu-ms", "eff/c");
    }
    bool first = true;
    moh_error err = {0};
    for (int mi = 0; mi < nmodels; mi++) {
        if (!use_model[mi]) continue;
        const ba_model *m = &MODELS[mi];
        for (int ni = 0; ni < nN; ni++) {
            const int N = Ns[ni];
            for (int pi = 0; pi < 2; pi++) {
                const bool train = pi == 1;
                if ((train && !trn) || (!train && !fwd)) continue;
                ba_run runs[2 * BA_MAX_ACT];
                memset(runs, 0, sizeof runs);
                int status = 0;
                for (int g = 0; g < nrun && !status; g++)
                    status = run_init(&runs[g], m, N, group[g % ng], train, a.reference && N <= 4096 && g < ng,
                                      pr_bf16 && (g >= ng || !pr_fp32), 0x5EEDULL + (uint64_t)N, &err);
                if (status) {
                    fprintf(stderr, "moh bench attention: %s\n", err.msg);
                    for (int g = 0; g < nrun; g++) run_free(&runs[g]);
                    if (a.json) printf("]\n");
                    return 1;
                }
                fprintf(stderr, "[%s N=%d %s] warm-up\n", m->name, N, train ? "train" : "forward");
                for (int g = 0; g < nrun; g++) run_once(&runs[g], N, train);
                for (int g = 0; g < nrun; g++) memset(runs[g].cache.phase_s, 0, sizeof runs[g].cache.phase_s);
                double tsg[64];
                for (int rep = 0; rep < a.repeats; rep++) {
                    tsg[rep] = bench_sgemm_gflops(4096, 2304, 768, 1); /* same conditions as the rows */
                    fprintf(stderr, "[%s N=%d %s] repeat %d/%d\n", m->name, N, train ? "train" : "forward", rep + 1, a.repeats);
                    for (int k = 0; k < nrun; k++) { /* rotate the order every repeat */
                        ba_run *r = &runs[(k + rep) % nrun];
                        const double t0 = omp_get_wtime(), c0 = bench_cpu_seconds();
                        run_once(r, N, train);
                        r->t[rep] = omp_get_wtime() - t0;
                        r->cpu[rep] = bench_cpu_seconds() - c0;
                        if (r->have_ref) {
                            const double t1 = omp_get_wtime();
                            run_ref(r, N, train);
                            r->tref[rep] = omp_get_wtime() - t1;
                        }
                    }
                }
                double dense_ms = 0.0, dense_flops = 0.0, dense_cpu = 0.0;
                const double sgemm = bench_summarise(tsg, a.repeats).median;
                for (int g = 0; g < nrun; g++) {
                    ba_run *r = &runs[g];
                    const bench_stats st = bench_summarise(r->t, a.repeats);
                    /* both precisions: the fp32 row's median time over this row's */
                    const double vs_fp32 =
                        npr == 2 && g >= ng ? bench_summarise(runs[g - ng].t, a.repeats).median / st.median : 0.0;
                    const bench_stats cst = bench_summarise(r->cpu, a.repeats);
                    const double P = (double)sparse_pairs(&r->cfg, &r->cache);
                    const double V = sparse_key_visits(&r->cfg, &r->cache);
                    const double fl = layer_flops(&r->cfg, N, P, V, train);
                    const double active = P / ((double)N * m->h);
                    if (g % ng == 0) { /* each precision's MoH rows against its own dense row */
                        dense_ms = st.median * 1e3;
                        dense_flops = fl;
                        dense_cpu = cst.median;
                    }
                    /* spread of the router: the least and most chosen routed head */
                    double rmin = 1.0, rmax = 0.0;
                    for (int i = r->cfg.shared_heads; i < m->h && r->cfg.router == MOH_ROUTER_LEARNED; i++) {
                        const double sh = (double)(r->cache.pair_off[i + 1] - r->cache.pair_off[i]) / N;
                        rmin = sh < rmin ? sh : rmin;
                        rmax = sh > rmax ? sh : rmax;
                    }
                    if (r->cfg.router != MOH_ROUTER_LEARNED) rmin = rmax = 1.0;
                    const double ms = st.median * 1e3, gfl = fl / st.median * 1e-9;
                    const double speedup = dense_ms / ms, ideal = dense_flops / fl;
                    size_t mem = r->cache.bytes + sizeof(float) * (r->np + 2 * (size_t)N * m->C);
                    if (train) mem += sizeof(float) * (r->np + 2 * (size_t)N * m->C);
                    char split[32];
                    if (r->cfg.router == MOH_ROUTER_NONE) snprintf(split, sizeof split, "dense");
                    else snprintf(split, sizeof split, "%d+%d", r->cfg.shared_heads, r->cfg.top_k);
                    if (a.json) {
                        printf("%s  {\"model\": ", first ? "" : ",\n");
                        first = false;
                        bench_json_str(stdout, m->name);
                        printf(", \"n\": %d, \"active\": %.4f, \"active_target\": %.4f, \"shared_heads\": %d, "
                               "\"top_k\": %d, \"router\": \"%s\", \"causal\": %s, \"pass\": \"%s\", \"ms\": %.3f, "
                               "\"ms_min\": %.3f, \"ms_max\": %.3f, \"repeats\": %d, \"gflop\": %.4f, \"gflops\": %.2f, "
                               "\"speedup\": %.4f, \"ideal\": %.4f, \"efficiency\": %.4f, \"sgemm_gflops\": %.2f, "
                               "\"sgemm_fraction\": %.4f, \"mem_bytes\": %zu, \"routed_head_share_min\": %.4f, "
                               "\"routed_head_share_max\": %.4f, \"threads\": %d, \"cpu_ms\": %.3f, "
                               "\"speedup_cpu\": %.4f, \"efficiency_cpu\": %.4f, \"precision\": \"%s\", "
                               "\"speedup_vs_fp32\": %.4f, \"phase_ms\": {",
                               N, active, r->target, r->cfg.shared_heads, r->cfg.top_k,
                               r->cfg.router == MOH_ROUTER_NONE ? "none" : "learned", m->causal ? "true" : "false",
                               train ? "train" : "forward", ms, st.min * 1e3, st.max * 1e3, a.repeats, fl * 1e-9,
                               gfl, speedup, ideal, speedup / ideal, sgemm, gfl / sgemm, mem, rmin, rmax, threads,
                               cst.median * 1e3, dense_cpu / cst.median, dense_cpu / cst.median / ideal,
                               r->bf16 ? "bf16" : "fp32", vs_fp32 > 0 ? vs_fp32 : 1.0);
                        bool pf = true;
                        for (int k = 0; k < SPARSE_NPHASE; k++) {
                            if (!train && k >= SPARSE_PH_B_WO) break;
                            printf("%s\"%s\": %.3f", pf ? "" : ", ", sparse_phase_name(k), r->cache.phase_s[k] * 1e3 / a.repeats);
                            pf = false;
                        }
                        printf("}}");
                    } else {
                        char act[400], tms[96];
                        snprintf(act, sizeof act, "%.3f %s%s", active, split, r->bf16 ? " bf16" : "");
                        snprintf(tms, sizeof tms, "%.2f (%.2f-%.2f)", ms, st.min * 1e3, st.max * 1e3);
                        printf("%-6s %6d %-8s %-13s %22s %8.1f %8.3f %6.3f %5.2f %6.1f%% %9.1f %9.1f %5.2f\n", m->name, N,
                               train ? "train" : "forward", act, tms, gfl, speedup, ideal, speedup / ideal,
                               100.0 * gfl / sgemm, mem / 1048576.0, cst.median * 1e3, dense_cpu / cst.median / ideal);
                        if (vs_fp32 > 0) printf("%8s bf16: %.3fx the speed of the fp32 row\n", "", vs_fp32);
                        if (a.phases) {
                            printf("%8s", "");
                            for (int k = 0; k < SPARSE_NPHASE; k++) {
                                if (!train && k >= SPARSE_PH_B_WO) break;
                                printf(" %s %.1f", sparse_phase_name(k), r->cache.phase_s[k] * 1e3 / a.repeats);
                            }
                            printf(" (ms, mean)\n");
                        }
                    }
                    fflush(stdout);
                }
                for (int g = 0; g < ng && runs[0].have_ref; g++) {
                    ba_run *r = &runs[g];
                    const bench_stats st = bench_summarise(r->tref, a.repeats);
                    const double P = (double)N * m->h, V = m->causal ? (double)m->h * N * (N + 1) / 2 : P * N;
                    const double fl = layer_flops(&r->cfg, N, P, V, train); /* it computes every head */
                    const double ms = st.median * 1e3, gfl = fl / st.median * 1e-9;
                    if (a.json) {
                        printf(",\n  {\"model\": \"%s\", \"n\": %d, \"path\": \"reference\", \"active_target\": %.4f, "
                               "\"shared_heads\": %d, \"top_k\": %d, \"causal\": %s, \"pass\": \"%s\", \"ms\": %.3f, "
                               "\"ms_min\": %.3f, \"ms_max\": %.3f, \"gflops\": %.2f, \"speedup\": %.4f, \"sgemm_fraction\": %.4f, "
                               "\"mem_bytes\": %zu}",
                               m->name, N, r->target, r->cfg.shared_heads, r->cfg.top_k, m->causal ? "true" : "false",
                               train ? "train" : "forward", ms, st.min * 1e3, st.max * 1e3, gfl, dense_ms / ms,
                               gfl / sgemm, (size_t)(2.0 * m->h * N * N * sizeof(float)));
                    } else {
                        char tms[96], lab[48];
                        snprintf(tms, sizeof tms, "%.2f (%.2f-%.2f)", ms, st.min * 1e3, st.max * 1e3);
                        if (r->cfg.router == MOH_ROUTER_NONE) snprintf(lab, sizeof lab, "ref dense");
                        else snprintf(lab, sizeof lab, "ref %d+%d", r->cfg.shared_heads, r->cfg.top_k);
                        printf("%-6s %6d %-8s %-13s %22s %8.1f %8.3f   (reference path: every head, then gated)\n",
                               m->name, N, train ? "train" : "forward", lab, tms, gfl, dense_ms / ms);
                    }
                }
                for (int g = 0; g < nrun; g++) run_free(&runs[g]);
            }
        }
    }
    if (a.json) printf("\n]\n");
    else {
        char cond[256];
        bench_conditions(cond, sizeof cond);
        printf("\nat the end: %s\n", cond);
        printf("cpu-ms: process CPU time per run (all threads); eff/c: efficiency computed from it\n");
    }
    return 0;
}
