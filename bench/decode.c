/* `moh bench decode`: tokens/s of KV-cache generation. With --model PATH, a loaded model's prefill
 * and decode (bench/decode_model.c); without, synthetic models as follows.
 *
 * Synthetic models: tokens/s of KV-cache generation (src/models/lm_decode.c: per token, K and V
 * appended for every KV head, attention only for the heads the token's router selects), dense MHA
 * against MoH at 75 % and 50 % active heads, at several context lengths.
 *
 * Method: random weights (HF init, std 0.02); the cache is filled with random keys and values up to
 * context - tokens, then `tokens` decode steps are timed, so the measured steps attend to about
 * `context` cached positions. The content of the cache does not change the work: every selected
 * head reads all cached keys and values. Configurations are interleaved repeat by repeat. cpu-ms/tok:
 * process CPU seconds (all threads) per timed token, the contention-robust companion of the wall
 * time; --profile adds the mean wall time per phase (LM_PH_*). */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../cli/args.h"
#include "../cli/cli.h"
#include "bench.h"
#include "core/rng.h"
#include "models/lm_decode.h"
#include "models/model.h"

typedef struct bd_model {
    const char *name;
    int C, L, h, d, I, V;
    int hs, k75, k50;
} bd_model;

static const bd_model BD_MODELS[] = {
    /* configs/moh-75.json and moh-50.json geometry (and their dense twin mha.json) */
    {"small", 256, 6, 8, 32, 688, 256, 2, 4, 2},
    /* a larger decoder: the llm layer of `moh bench attention`, 4 layers */
    {"llm", 1024, 4, 16, 64, 2816, 256, 4, 8, 4},
};

typedef struct bd_run {
    moh_lm_config cfg;
    lm_params_f32 p;
    lm_kv_cache kv;
    float *logits;
    bool have_p, have_kv;
    double t[64];
    long run0, total0;
    double cpu; /* process CPU seconds over the timed steps (all threads) */
} bd_run;

/* A synthetic model with router k (0: none, else learned hs + k) and its cache for ctx tokens,
 * fp32 or bf16 (weights and cache), the cache filled with random keys and values. */
static int bd_init(bd_run *r, const bd_model *m, int hs, int k, int ctx, bool bf16, moh_error *err) {
    memset(r, 0, sizeof *r);
    moh_lm_config *c = &r->cfg;
    c->hidden_size = m->C;
    c->num_hidden_layers = m->L;
    c->num_attention_heads = m->h;
    c->num_key_value_heads = m->h;
    c->head_dim = m->d;
    c->intermediate_size = m->I;
    c->vocab_size = m->V;
    c->max_position_embeddings = ctx;
    c->rms_norm_eps = 1e-5;
    c->rope_theta = 10000.0;
    c->router = k > 0 ? MOH_ROUTER_LEARNED : MOH_ROUTER_NONE;
    c->shared_heads = k > 0 ? hs : 0;
    c->top_k = k;
    c->load_balance_coef = 0.01;
    if (moh_lm_config_finalize(c, "bench decode", err)) return err->code;
    if (lm_params_init_f32(&r->p, c, err)) return err->code;
    r->have_p = true;
    lm_params_init_random(c, &r->p, 1234, 0.02);
    if (bf16 ? lm_kv_init_bf16(&r->kv, c, &r->p, ctx, err) : lm_kv_init(&r->kv, c, ctx, err)) return err->code;
    r->have_kv = true;
    const size_t rows = (size_t)ctx * m->d;
    r->logits = malloc(sizeof(float) * ((size_t)m->V > 2 * rows ? (size_t)m->V : 2 * rows));
    if (!r->logits) return moh_fail(err, MOH_E_NOMEM, "bench decode: out of memory");
    uint64_t s = 42;
    for (int l = 0; l < m->L; l++)
        for (int g = 0; g < c->attn.n_kv_heads; g++) { /* K and V rows of one head, through logits */
            for (size_t i = 0; i < 2 * rows; i++)
                r->logits[i] = (float)((int64_t)(moh_rng_next(&s) >> 40) - (1 << 23)) * (1.0f / (1 << 23));
            lm_kv_write(&r->kv, c, l, g, 0, ctx, r->logits, r->logits + rows);
        }
    return MOH_OK;
}

/* The geometry of config `name` (--config) as a bd_model: MoH variants with the config's shared
 * heads (h / 4 when it has none) plus routed heads up to 75 % and 50 % of h. Refuses a family whose
 * task is not text generation (decoding is generating text), in one line. */
static int bd_from_config(bd_model *out, const char *name, moh_error *err) {
    char path[4096];
    if (!cli_resolve_config(name, path, sizeof path))
        return moh_fail(err, MOH_E_IO, "config '%s' not found (a file, or configs/%s.json)", name, name);
    model m;
    int rc = model_from_config_file(&m, path, err);
    if (rc) return rc;
    if (strcmp(m.fam->task, "text-generation")) {
        rc = moh_fail(err, MOH_E_ARG, "%s is a %s model (model_type \"%s\", task %s): decode benchmarks text generation "
                      "only", name, m.fam->short_name, m.fam->model_type, m.fam->task);
        model_free(&m);
        return rc;
    }
    const moh_lm_config *c = m.cfg; /* the text-generation family: the decoder LM */
    const int h = c->num_attention_heads;
    const int hs = c->attn.router != MOH_ROUTER_NONE && c->shared_heads > 0 ? c->shared_heads : (h / 4 > 0 ? h / 4 : 1);
    *out = (bd_model){name, c->hidden_size, c->num_hidden_layers, h, c->head_dim, c->intermediate_size, c->vocab_size,
                      hs, 3 * h / 4 - hs, h / 2 - hs};
    model_free(&m);
    if (out->k50 < 1)
        return moh_fail(err, MOH_E_CONFIG, "%s: %d heads with %d shared leave no routed head at 50 %% active", name, h, hs);
    return MOH_OK;
}

static void bd_free(bd_run *r) {
    if (r->have_kv) lm_kv_free(&r->kv);
    if (r->have_p) lm_params_free_f32(&r->p);
    free(r->logits);
    memset(r, 0, sizeof *r);
}

/* tokens decode steps from position ctx - tokens. */
static int bd_steps(bd_run *r, int ctx, int tokens, moh_error *err) {
    r->kv.pos = ctx - tokens;
    int tok = 65;
    for (int i = 0; i < tokens; i++) {
        if (lm_decode_step(&r->cfg, &r->p, &r->kv, tok, r->logits, err)) return err->code;
        tok = (tok * 31 + 7) % r->cfg.vocab_size;
    }
    return MOH_OK;
}

/* --precision's comma list into o->prec (both = fp32,bf16; a name given twice is an error, one both
 * also gives runs once); *quant when a quantised one is asked. bf16 on a CPU that cannot: dropped with a note (fp32 in its place if nothing is left).
 * 0, or 2 after a one-line error. */
static int bd_precisions(const char *value, bdm_opts *o, bool *quant) {
    static const char *const names[] = {"fp32", "bf16", "gguf", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_K", "q5_K", "q6_K"};
    _Static_assert(sizeof names / sizeof names[0] <= BDM_MAX_PREC, "bdm_opts.prec holds each name once");
    char why[160];
    const bool no16 = attn_decode_precision(MOH_PRECISION_BF16, why, sizeof why) != MOH_PRECISION_BF16;
    const size_t vl = strlen(value);
    if (!vl || value[vl - 1] == ',') {
        fprintf(stderr, "moh bench decode: --precision '%s': an empty item, expected a comma list of fp32, bf16, both, "
                        "gguf, " QUANT_TYPE_LIST "\n", value);
        return 2;
    }
    unsigned named = 0; /* the names given by name (both may overlap them) */
    for (const char *p = value; *p;) {
        const size_t len = strcspn(p, ",");
        const bool both = len == 4 && !strncmp(p, "both", 4);
        bool known = both;
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
            const bool hit = both ? i < 2 : strlen(names[i]) == len && !strncmp(p, names[i], len);
            known = known || hit;
            bool dup = false;
            for (int j = 0; j < o->nprec; j++) dup = dup || o->prec[j] == names[i];
            if (hit && !both && (named >> i & 1u)) {
                fprintf(stderr, "moh bench decode: --precision '%s': '%s' given twice, expected each precision once\n",
                        value, names[i]);
                return 2;
            }
            if (hit && !both) named |= 1u << i;
            if (!hit || dup) continue;
            if (i == 1 && no16) {
                fprintf(stderr, "moh bench decode: --precision bf16 dropped: %s\n", why);
                continue;
            }
            *quant = *quant || i >= 2;
            o->prec[o->nprec++] = names[i];
        }
        if (!known || !len) {
            fprintf(stderr, "moh bench decode: --precision '%s': %s '%.*s', expected a comma list of fp32, bf16, both, "
                            "gguf, " QUANT_TYPE_LIST " (each once)\n", value, len ? "item" : "an empty item", (int)len, p);
            return 2;
        }
        p += len + (p[len] == ',');
    }
    if (!o->nprec) o->prec[o->nprec++] = names[0];
    return 0;
}

static bool bd_synthetic_name(const char *s) { return !strcmp(s, "small") || !strcmp(s, "llm") || !strcmp(s, "all"); }

int bench_decode(int argc, char **argv) {
    struct {
        bool json, profile;
        const char *model, *context, *config, *text, *precision;
        int tokens, repeats, threads;
        uint64_t seed;
    } a = {false, false, "all", NULL, NULL, NULL, "fp32", -1, 3, 0, 1};
    const arg_spec specs[] = {
        {"--json", ARG_FLAG, &a.json, NULL, "print a JSON array of rows instead of the table", false, ARG_ANY},
        {"--model", ARG_STR, &a.model, "small|llm|all|PATH", "small: configs/moh-75 geometry (256 wide, 6 layers, 8 heads); llm: 1024 wide, 4 layers, 16 heads (default all); or a model to load: a .gguf, a Hugging Face folder, a moh checkpoint (up to 4 --model PATH: ratios to the first)", false, ARG_ANY},
        {"--context", ARG_STR, &a.context, "N,N,...", "context lengths (default 512,2048,8192; with --model PATH: prompt lengths, default 512,2048)", false, ARG_ANY},
        {"--config", ARG_STR, &a.config, "NAME|FILE", "an LM config (configs/ name or path): decode its geometry instead of --model", false, ARG_ANY},
        {"--tokens", ARG_INT, &a.tokens, "T", "timed decode steps per repeat (default 32; with --model PATH: new tokens after each prompt, default 128)", false, ARG_GE(1)},
        {"--repeats", ARG_INT, &a.repeats, "R", "repeats, interleaved over the configurations or models (default 3, max 64)", false, ARG_IN(1, 64)},
        {"--threads", ARG_INT, &a.threads, "N", "OpenMP threads (default: OMP_NUM_THREADS, else every core)", false, ARG_IN(1, 1024)},
        {"--seed", ARG_U64, &a.seed, "S", "--model PATH: prompt ids uniform over the vocabulary from splitmix64(S) (default 1)", false, ARG_ANY},
        {"--text", ARG_STR, &a.text, "FILE", "--model PATH: the prompt is FILE's tokens (the model's tokenizer, or bytes), repeated", false, ARG_ANY},
        {"--precision", ARG_STR, &a.precision, "P[,P...]", "decode (and prefill) in fp32, in bf16 (bf16 weights and KV cache, fp32 accumulation: vdpbf16ps, or widened to fp32 without AVX512-BF16; a CPU without AVX-512 runs fp32 and says so), both (fp32,bf16); with --model PATH also gguf (the file's own quantised blocks, as moh sample and chat decode a quantised .gguf) and q8_0, q4_0, q4_1, q5_0, q5_1, q4_K, q5_K, q6_K (quantised here from the float weights, as moh convert --outtype); a list runs interleaved, each later precision with its ratio to the first (default fp32)", false, ARG_ANY},
        {"--profile", ARG_FLAG, &a.profile, NULL, "time per phase (qkv, attention, wo, mlp, lm_head, other) of decode (--model PATH: and prefill), and the team split: 'team of N: start-up X us, one thread Y GMAC/s: split from W multiply-adds' means a decode product of W or more multiply-adds runs on the N threads, a smaller one on one thread (measured on the first token: the smallest product whose time saved on N threads exceeds the start-up)", false, ARG_ANY},
    };
    int prc = args_parse("bench decode", argc, argv, specs, (int)(sizeof specs / sizeof specs[0]),
                         "[--json] [--model small|llm|all | --config NAME] [--context 512,2048,8192] [--tokens T] [--repeats R]\n"
                         "                        [--threads N] [--precision fp32|bf16|both] [--profile]\n"
                         "       moh bench decode --model PATH [--model PATH2 ...] [--context 512,2048] [--tokens 128] [--repeats R]\n"
                         "                        [--threads N] [--precision fp32,bf16,gguf,q8_0,...,q6_K] [--seed S | --text FILE]\n"
                         "                        [--profile] [--json]",
                         "Synthetic models: KV-cache decoding tokens/s, dense MHA (router none) vs MoH with 75% and\n"
                         "50% of the heads active (learned router; skipped heads run no attention and no W_O term).\n"
                         "--model PATH: a loaded model (weights dequantised to float32 once). Per prompt length:\n"
                         "prefill tokens/s (the prompt in one batched forward on the head-sparse attention path,\n"
                         "filling the KV cache) and decode tokens/s (T new tokens, greedy, KV-cache steps). With\n"
                         "several --model, the runs are interleaved and each is also given as a ratio to the first.\n"
                         "--precision bf16: the weights (a copy made once per model) and the KV cache in bf16, every\n"
                         "product accumulating in fp32; both: fp32 and bf16 runs interleaved, each bf16 row with its\n"
                         "bf16/fp32 tokens/s ratio. gguf (--model PATH: a quantised .gguf's own blocks, as moh sample and\n"
                         "moh chat decode it by default) and " QUANT_TYPE_LIST " (the weights quantised so):\n"
                         "decoding from ggml blocks on the integer units, bf16 KV cache; the prefill runs bf16 GEMMs\n"
                         "(fp32 on a CPU without bf16) on the blocks dequantised one matrix at a time.\n");
    if (prc) return prc == 1 ? 0 : prc;
    if (a.threads > 0) omp_set_num_threads(a.threads);
    bdm_opts mo = {.tokens = a.tokens > 0 ? a.tokens : 128, .repeats = a.repeats, .seed = a.seed, .text = a.text,
                   .json = a.json, .profile = a.profile};
    bool quant = false;
    if (bd_precisions(a.precision, &mo, &quant)) return 2;
    bool prec[2] = {false, false}; /* the synthetic models' fp32, bf16 */
    for (int i = 0; i < mo.nprec; i++) prec[!strcmp(mo.prec[i], "bf16")] = true;
    for (int i = 1; i + 1 < argc; i++) { /* every --model value (args_parse keeps the last) */
        if (strcmp(argv[i], "--model")) continue;
        if (mo.nmodels == BDM_MAX_MODELS) {
            fprintf(stderr, "moh bench decode: --model given more than %d times\n", BDM_MAX_MODELS);
            return 2;
        }
        mo.models[mo.nmodels++] = argv[++i];
    }
    int nsyn = 0;
    const char *syn = NULL;
    for (int i = 0; i < mo.nmodels; i++)
        if (bd_synthetic_name(mo.models[i])) {
            nsyn++;
            syn = mo.models[i];
        }
    if (nsyn && mo.nmodels > 1) {
        fprintf(stderr, "moh bench decode: --model %s is a synthetic model: give it once, or give only paths "
                        "(a folder named like it: ./%s)\n", syn, syn);
        return 2;
    }
    const bool loaded = mo.nmodels > 0 && !nsyn;
    if (loaded && a.config) {
        fprintf(stderr, "moh bench decode: --config and --model %s: give one (a config's geometry, or a model to load)\n",
                mo.models[0]);
        return 2;
    }
    if (!loaded && quant) {
        fprintf(stderr, "moh bench decode: --precision %s: quantised decoding needs --model PATH (a loaded model)\n",
                a.precision);
        return 2;
    }
    if (!loaded && (a.text || args_value(argc, argv, "--seed"))) {
        fprintf(stderr, "moh bench decode: %s applies to --model PATH (a loaded model) only\n",
                a.text ? "--text" : "--seed");
        return 2;
    }
    if (!a.context) a.context = loaded ? "512,2048" : "512,2048,8192";
    if (a.tokens < 0) a.tokens = 32;
    int ctxs[BDM_MAX_CTX];
    const int nc = bench_parse_ints(a.context, ctxs, BDM_MAX_CTX);
    if (nc < 1) {
        fprintf(stderr, "moh bench decode: --context '%s': expected up to %d comma-separated integers 1..16777216\n", a.context, BDM_MAX_CTX);
        return 2;
    }
    if (loaded) {
        memcpy(mo.ctxs, ctxs, sizeof ctxs);
        mo.nc = nc;
        return bench_decode_models(&mo);
    }
    bd_model models[2] = {BD_MODELS[0], BD_MODELS[1]};
    int nm = (int)(sizeof BD_MODELS / sizeof BD_MODELS[0]);
    bool use[2];
    for (int i = 0; i < nm; i++) use[i] = !strcmp(a.model, "all") || !strcmp(a.model, BD_MODELS[i].name);
    moh_error err = {0};
    if (a.config) {
        if (bd_from_config(&models[0], a.config, &err)) {
            fprintf(stderr, "moh bench decode: %s\n", err.msg);
            return 1;
        }
        nm = 1;
        use[0] = true;
    }
    char cpu[256];
    bench_cpu_model(cpu, sizeof cpu);
    const int threads = omp_get_max_threads();
    if (a.json) printf("[\n");
    else {
        char cond[256];
        bench_conditions(cond, sizeof cond);
        printf("moh bench decode: %s; %s; %d timed tokens per repeat, %d repeats\n", cpu, cond, a.tokens, a.repeats);
        if (prec[1]) printf("bf16 rows: bf16 weights and KV cache, %s kernels, fp32 accumulation\n",
                            sparse_bf16_isa_name(sparse_bf16_isa_detect()));
        printf("%-6s %7s %-14s %-5s %8s %24s %9s %8s %10s%s\n", "model", "context", "router", "prec", "active",
               "tokens/s median (min-max)", "ms/token", "speedup", "cpu-ms/tok", prec[0] && prec[1] ? "  bf16/fp32" : "");
    }
    bool first = true;
    for (int mi = 0; mi < nm; mi++) {
        if (!use[mi]) continue;
        const bd_model *m = &models[mi];
        for (int ci = 0; ci < nc; ci++) {
            const int ctx = ctxs[ci] > a.tokens ? ctxs[ci] : a.tokens + 1;
            bd_run runs[6]; /* [precision (fp32, bf16) * 3 + router (dense, 75 %, 50 %)] */
            const int ks[3] = {0, m->k75, m->k50};
            memset(runs, 0, sizeof runs);
            int status = 0, order[6], nrun = 0;
            for (int g = 0; g < 6; g++)
                if (prec[g / 3]) order[nrun++] = g;
            for (int i = 0; i < nrun && !status; i++)
                status = bd_init(&runs[order[i]], m, m->hs, ks[order[i] % 3], ctx, order[i] >= 3, &err);
            for (int g = 0; g < 6 && !status; g++) /* one team split per precision: rows differ only in heads run */
                if (prec[g / 3]) {
                    bd_run *r = &runs[g];
                    if (g % 3 == 0) status = lm_kv_calibrate(&r->kv, &r->cfg, &r->p, &err);
                    else attn_decode_copy_split(&r->kv.dc, &runs[g - g % 3].kv.dc);
                }
            for (int i = 0; i < nrun && !status; i++) status = bd_steps(&runs[order[i]], ctx, a.tokens < 4 ? a.tokens : 4, &err);
            for (int g = 0; g < 6; g++) {
                runs[g].run0 = runs[g].kv.heads_run;
                runs[g].total0 = runs[g].kv.heads_total;
                memset(runs[g].kv.phase_s, 0, sizeof runs[g].kv.phase_s);
            }
            for (int rep = 0; rep < a.repeats && !status; rep++) {
                fprintf(stderr, "[%s context %d] repeat %d/%d\n", m->name, ctx, rep + 1, a.repeats);
                for (int k = 0; k < nrun && !status; k++) {
                    bd_run *r = &runs[order[(k + rep) % nrun]];
                    const double t0 = omp_get_wtime(), c0 = bench_cpu_seconds();
                    status = bd_steps(r, ctx, a.tokens, &err);
                    r->t[rep] = omp_get_wtime() - t0;
                    r->cpu += bench_cpu_seconds() - c0;
                }
            }
            if (status) {
                fprintf(stderr, "moh bench decode: %s\n", err.msg);
                for (int g = 0; g < 6; g++) bd_free(&runs[g]);
                if (a.json) printf("]\n");
                return 1;
            }
            for (int i = 0; i < nrun; i++) {
                const int g = order[i];
                bd_run *r = &runs[g];
                const bench_stats st = bench_summarise(r->t, a.repeats);
                const double tps = a.tokens / st.median;
                const double dense_tps = a.tokens / bench_summarise(runs[g - g % 3].t, a.repeats).median;
                const bool pair = g >= 3 && prec[0]; /* a bf16 row with its fp32 twin */
                const double vs = pair ? bench_summarise(runs[g - 3].t, a.repeats).median / st.median : 1.0;
                const long hr = r->kv.heads_run - r->run0, ht = r->kv.heads_total - r->total0;
                const double active = ht ? (double)hr / ht : 1.0;
                const double per_tok = 1e3 / ((double)a.repeats * a.tokens), cpu_ms = r->cpu * per_tok;
                const int k = ks[g % 3];
                char router[32];
                if (k == 0) snprintf(router, sizeof router, "none (dense)");
                else snprintf(router, sizeof router, "learned %d+%d", m->hs, k);
                if (a.json) {
                    printf("%s  {\"model\": \"%s\", \"context\": %d, \"router\": \"%s\", \"shared_heads\": %d, "
                           "\"top_k\": %d, \"active\": %.4f, \"tokens_per_s\": %.3f, \"tokens_per_s_min\": %.3f, "
                           "\"tokens_per_s_max\": %.3f, \"ms_per_token\": %.4f, \"speedup\": %.4f, \"tokens\": %d, "
                           "\"repeats\": %d, \"threads\": %d, \"cpu_ms_per_token\": %.4f, \"precision\": \"%s\", "
                           "\"speedup_vs_fp32\": %.4f",
                           first ? "" : ",\n", m->name, ctx, k ? "learned" : "none", k ? m->hs : 0, k, active, tps,
                           a.tokens / st.max, a.tokens / st.min, st.median * 1e3 / a.tokens, tps / dense_tps, a.tokens,
                           a.repeats, threads, cpu_ms, g >= 3 ? "bf16" : "fp32", vs);
                    if (a.profile) {
                        printf(", \"phases_ms_per_token\": {");
                        for (int j = 0; j < LM_NPHASE; j++)
                            printf("%s\"%s\": %.5f", j ? ", " : "", lm_phase_name(j), r->kv.phase_s[j] * per_tok);
                        printf("}, \"par_work\": %ld, \"team_start_us\": %.2f", r->kv.dc.par_work, r->kv.dc.team_s * 1e6);
                    }
                    printf("}");
                    first = false;
                } else {
                    char tp[64];
                    snprintf(tp, sizeof tp, "%.1f (%.1f-%.1f)", tps, a.tokens / st.max, a.tokens / st.min);
                    printf("%-6s %7d %-14s %-5s %8.3f %24s %9.3f %8.3f %10.3f", m->name, ctx, router,
                           g >= 3 ? "bf16" : "fp32", active, tp, st.median * 1e3 / a.tokens, tps / dense_tps, cpu_ms);
                    if (pair) printf(" %10.3f", vs);
                    printf("\n");
                    if (a.profile) {
                        printf("       phases ms/token (mean):");
                        for (int j = 0; j < LM_NPHASE; j++) printf(" %s %.3f", lm_phase_name(j), r->kv.phase_s[j] * per_tok);
                        char split[160];
                        attn_decode_describe_split(&r->kv.dc, split, sizeof split);
                        printf("\n       %s\n", split);
                    }
                }
                fflush(stdout);
            }
            for (int g = 0; g < 6; g++) bd_free(&runs[g]);
        }
    }
    if (a.json) printf("\n]\n");
    return 0;
}
