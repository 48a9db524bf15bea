/* `moh bench decode --model PATH [--model PATH2 ...]`: prefill and decode tokens/s of loaded
 * language models (a .gguf, a Hugging Face folder or a moh checkpoint: model_open, weights
 * dequantised to float32 once; nothing else holds a copy).
 *
 * Method, per model, context and repeat: the cache is emptied and a prompt of `context` tokens
 * is encoded in one batched forward pass (lm_prefill: the LM family's default attention path,
 * the head-sparse one, which computes only the (token, head) pairs the router selects; K and V
 * land in the KV cache as `moh sample` fills it; the LM head runs on the last token only), then
 * `tokens` new tokens are generated greedily with lm_decode_step (the argmax of each step's
 * logits is the next input). Prefill tokens/s = prompt / prefill seconds; decode tokens/s =
 * tokens / decode seconds. Prompt ids are uniform over the vocabulary from splitmix64(seed)
 * (tools/bench/decode_vs_llamacpp.py draws the same ids for llama.cpp), or a text file's tokens
 * repeated to the length. A context that leaves no room for the new tokens below
 * max_position_embeddings is shortened to max_position_embeddings - tokens (the table shows the
 * prompt run). Models are interleaved repeat by repeat; one untimed warm-up per model first.
 * Medians over repeats; ratios are each model's median over the first model's. */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "bench.h"
#include "core/fsutil.h"
#include "core/rng.h"
#include "models/lm_decode.h"
#include "models/model.h"
#include "text/bpe.h"

typedef struct bdm_run {
    const char *path;
    model m;                             /* the model's first run's; its other precisions borrow it */
    bool have_m, have_kv, have_ws;
    const char *prec;                    /* bdm_opts.prec's */
    quant_table qt;                      /* "q8_0" .. "q6_K": the blocks made here */
    const moh_lm_config *cfg;
    const lm_params_f32 *p;
    lm_kv_cache kv;
    lm_prefill_ws ws;
    float *logits;
    int *prompt;                         /* [max prompt] */
    uint64_t hash[BDM_MAX_CTX];          /* FNV-1a of each context's prompt ids (little-endian u32) */
    int plen[BDM_MAX_CTX];               /* prompt run per context */
    double tp[BDM_MAX_CTX][64], td[BDM_MAX_CTX][64];
    double php[BDM_MAX_CTX][LM_NPHASE];  /* prefill phase seconds, summed over repeats */
    double phd[BDM_MAX_CTX][LM_NPHASE];  /* decode phase seconds, summed over repeats */
    long hrun[BDM_MAX_CTX], htot[BDM_MAX_CTX];
} bdm_run;

static void bdm_free(bdm_run *r) {
    if (r->have_ws) lm_prefill_free(&r->ws);
    if (r->have_kv) lm_kv_free(&r->kv);
    quant_table_free(&r->qt);
    if (r->have_m) model_free(&r->m);
    free(r->logits);
    free(r->prompt);
    memset(r, 0, sizeof *r);
}

/* Prompt ids [n]: from text (the model's tokenizer, or bytes), repeated; or splitmix64(seed) % V. */
static int bdm_prompt(bdm_run *r, const bdm_opts *o, int n, moh_error *err) {
    const int V = r->cfg->vocab_size;
    if (!(r->prompt = malloc(sizeof(int) * (size_t)n))) return moh_fail(err, MOH_E_NOMEM, "out of memory");
    if (o->text) {
        size_t len = 0, nids = 0;
        char *txt = fs_read_file(o->text, (size_t)1 << 30, &len, err);
        if (!txt) return err->code;
        int *ids = NULL;
        int rc = MOH_OK;
        if (r->m.tokenizer) rc = bpe_encode(r->m.tokenizer, (const uint8_t *)txt, len, false, &ids, &nids, err);
        else if (!(ids = malloc(sizeof(int) * (len ? len : 1)))) rc = moh_fail(err, MOH_E_NOMEM, "out of memory");
        else for (size_t i = 0; i < len; i++) ids[nids++] = (unsigned char)txt[i];
        free(txt);
        if (!rc && nids == 0) rc = moh_fail(err, MOH_E_ARG, "--text %s: no tokens", o->text);
        for (int i = 0; !rc && i < n; i++) r->prompt[i] = ids[(size_t)i % nids];
        free(ids);
        if (rc) return rc;
    } else {
        uint64_t s = o->seed;
        for (int i = 0; i < n; i++) r->prompt[i] = (int)(moh_rng_next(&s) % (uint64_t)V);
    }
    for (int c = 0; c < o->nc; c++) {
        uint64_t h = 0xcbf29ce484222325ULL;
        for (int i = 0; i < r->plen[c]; i++)
            for (int k = 0; k < 4; k++) h = (h ^ (((uint32_t)r->prompt[i] >> (8 * k)) & 0xff)) * 0x100000001b3ULL;
        r->hash[c] = h;
    }
    return MOH_OK;
}

/* Opens path (or borrows the model of twin, the same path's first run) and makes the cache and
 * prefill workspace of precision prec (bf16: both bf16; quantised: the blocks, a bf16 cache, an
 * fp32 prefill). */
static int bdm_init(bdm_run *r, const char *path, const bdm_run *twin, const char *prec, const bdm_opts *o,
                    moh_error *err) {
    memset(r, 0, sizeof *r);
    r->path = path;
    r->prec = prec;
    const bool bf16 = !strcmp(prec, "bf16"), gguf = !strcmp(prec, "gguf");
    if (twin) r->m = twin->m;
    else { /* only the file's blocks asked for: no float copy of them (peak RSS as moh chat's) */
        bool blocks_only = true;
        for (int i = 0; i < o->nprec; i++) blocks_only = blocks_only && !strcmp(o->prec[i], "gguf");
        if (model_open_ex(&r->m, path, blocks_only ? MODEL_OPEN_QUANT_ONLY : 0, err)) return err->code;
    }
    r->have_m = !twin;
    if (strcmp(r->m.fam->task, "text-generation"))
        return moh_fail(err, MOH_E_ARG, "%s is a %s (model_type \"%s\"): decode benchmarks text generation only", path,
                        r->m.fam->summary, r->m.fam->model_type);
    r->cfg = r->m.cfg; /* the text-generation family: the decoder LM */
    r->p = r->m.params;
    const int N = r->cfg->max_position_embeddings;
    if (o->tokens >= N)
        return moh_fail(err, MOH_E_ARG, "%s: --tokens %d leaves no room for a prompt in max_position_embeddings %d", path,
                        o->tokens, N);
    int maxp = 1;
    for (int c = 0; c < o->nc; c++) {
        r->plen[c] = o->ctxs[c] < N - o->tokens ? o->ctxs[c] : N - o->tokens;
        if (r->plen[c] < o->ctxs[c])
            fprintf(stderr, "moh bench decode: note: %s: context %d + %d new tokens passes max_position_embeddings %d: "
                            "prompt of %d tokens\n", path, o->ctxs[c], o->tokens, N, r->plen[c]);
        if (r->plen[c] > maxp) maxp = r->plen[c];
    }
    const int T = maxp + o->tokens;
    int type = 0;
    if (gguf && !r->m.quant)
        return moh_fail(err, MOH_E_ARG, "%s: --precision gguf: the file holds no matrices of " QUANT_TYPE_LIST, path);
    if (!bf16 && !gguf && strcmp(prec, "fp32") &&
        (quant_type_parse(prec, &type, err) || lm_quant_table(r->cfg, r->p, type, &r->qt, err)))
        return err->code;
    const quant_table *qt = gguf ? r->m.quant : type ? &r->qt : NULL;
    if (qt ? lm_kv_init_quant(&r->kv, r->cfg, r->p, qt, T, err)
           : bf16 ? lm_kv_init_bf16(&r->kv, r->cfg, r->p, T, err) : lm_kv_init(&r->kv, r->cfg, T, err))
        return err->code;
    r->have_kv = true;
    if (lm_prefill_init(&r->ws, r->cfg, maxp, err)) return err->code;
    r->have_ws = true;
    if (bf16 && lm_prefill_set_bf16(&r->ws, r->cfg, &r->kv, err)) return err->code;
    if (!(r->logits = malloc(sizeof(float) * (size_t)r->cfg->vocab_size)))
        return moh_fail(err, MOH_E_NOMEM, "out of memory");
    return bdm_prompt(r, o, maxp, err);
}

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* One prefill of n prompt tokens and `tokens` greedy decode steps; seconds into *tp, *td and the
 * phase times into php, phd (added) when given. */
static int bdm_once(bdm_run *r, int n, int tokens, double *tp, double *td, double *php, double *phd, moh_error *err) {
    memset(r->kv.phase_s, 0, sizeof r->kv.phase_s);
    const long hr = r->kv.heads_run, ht = r->kv.heads_total;
    const double t0 = omp_get_wtime();
    if (lm_prefill(r->cfg, r->p, &r->kv, &r->ws, r->prompt, n, r->logits, err)) return err->code;
    const double t1 = omp_get_wtime();
    for (int i = 0; php && i < LM_NPHASE; i++) php[i] += r->kv.phase_s[i];
    memset(r->kv.phase_s, 0, sizeof r->kv.phase_s);
    for (int i = 0; i < tokens; i++)
        if (lm_decode_step(r->cfg, r->p, &r->kv, argmax(r->logits, r->cfg->vocab_size), r->logits, err))
            return err->code;
    const double t2 = omp_get_wtime();
    for (int i = 0; phd && i < LM_NPHASE; i++) phd[i] += r->kv.phase_s[i];
    if (!php) { /* warm-up: not counted */
        r->kv.heads_run = hr;
        r->kv.heads_total = ht;
    }
    *tp = t1 - t0;
    *td = t2 - t1;
    return MOH_OK;
}

/* Prints the phase table of run r at context index c (text) or its JSON object. */
static void bdm_phases(const bdm_run *r, int c, int repeats, int tokens, bool json) {
    double sp = 0.0, sd = 0.0;
    for (int i = 0; i < LM_NPHASE; i++) {
        sp += r->php[c][i];
        sd += r->phd[c][i];
    }
    if (json) {
        printf(", \"phases_prefill_s\": {");
        for (int i = 0; i < LM_NPHASE; i++) printf("%s\"%s\": %.6f", i ? ", " : "", lm_phase_name(i), r->php[c][i] / repeats);
        printf("}, \"phases_decode_ms_per_token\": {");
        for (int i = 0; i < LM_NPHASE; i++)
            printf("%s\"%s\": %.5f", i ? ", " : "", lm_phase_name(i), r->phd[c][i] * 1e3 / repeats / tokens);
        printf("}, \"par_work\": %ld, \"team_start_us\": %.2f", r->kv.dc.par_work, r->kv.dc.team_s * 1e6);
        return;
    }
    char split[160];
    attn_decode_describe_split(&r->kv.dc, split, sizeof split);
    printf("  decode %s\n", split);
    printf("  %-10s %14s %7s %16s %7s\n", "phase", "prefill ms", "share", "decode ms/token", "share");
    for (int i = 0; i < LM_NPHASE; i++)
        printf("  %-10s %14.1f %6.1f%% %16.3f %6.1f%%\n", lm_phase_name(i), r->php[c][i] * 1e3 / repeats,
               sp > 0 ? 100.0 * r->php[c][i] / sp : 0.0, r->phd[c][i] * 1e3 / repeats / tokens,
               sd > 0 ? 100.0 * r->phd[c][i] / sd : 0.0);
}

int bench_decode_models(const bdm_opts *o) {
    moh_error err = {0};
    /* run k * npr + i: model k in precision i; the other precisions borrow the first's model */
    const int npr = o->nprec, nr = o->nmodels * npr;
    bdm_run *runs = calloc((size_t)nr, sizeof *runs);
    if (!runs) {
        fprintf(stderr, "moh bench decode: out of memory\n");
        return 1;
    }
    int status = 0;
    for (int i = 0; i < nr && !status; i++) {
        const int k = i / npr, pi = i % npr;
        if (!pi) fprintf(stderr, "[loading %s]\n", o->models[k]);
        status = bdm_init(&runs[i], o->models[k], pi ? &runs[i - pi] : NULL, o->prec[pi], o, &err);
    }
    for (int i = 0; i < nr && !status; i++) { /* one team split per precision for models of the first's width */
        bdm_run *r = &runs[i], *first = &runs[i % npr];
        if (i < npr) status = lm_kv_calibrate(&r->kv, r->cfg, r->p, &err);
        else if (r->cfg->hidden_size == first->cfg->hidden_size) attn_decode_copy_split(&r->kv.dc, &first->kv.dc);
    }
    for (int i = 0; i < nr && !status; i++) { /* warm-up: kernels, page faults */
        double a, b;
        const int n = runs[i].plen[0] < 64 ? runs[i].plen[0] : 64;
        status = bdm_once(&runs[i], n, o->tokens < 2 ? o->tokens : 2, &a, &b, NULL, NULL, &err);
    }
    for (int rep = 0; rep < o->repeats && !status; rep++)
        for (int c = 0; c < o->nc && !status; c++) {
            fprintf(stderr, "[context %d] repeat %d/%d\n", o->ctxs[c], rep + 1, o->repeats);
            for (int j = 0; j < nr && !status; j++) {
                bdm_run *r = &runs[(j + rep) % nr];
                const long hr = r->kv.heads_run, ht = r->kv.heads_total;
                status = bdm_once(r, r->plen[c], o->tokens, &r->tp[c][rep], &r->td[c][rep], r->php[c], r->phd[c], &err);
                r->hrun[c] += r->kv.heads_run - hr;
                r->htot[c] += r->kv.heads_total - ht;
            }
        }
    if (status) {
        fprintf(stderr, "moh bench decode: %s\n", err.msg);
        for (int i = nr - 1; i >= 0; i--) bdm_free(&runs[i]);
        free(runs);
        return 1;
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    const double rss_mb = (double)ru.ru_maxrss / 1024.0;
    char cpu[256], cond[256];
    bench_cpu_model(cpu, sizeof cpu);
    bench_conditions(cond, sizeof cond);
    const bool both = npr > 1;
    if (!o->json) {
        printf("moh bench decode: %s; %s; prompt then %d new tokens (greedy), %d repeats (median); prompt ids: ", cpu,
               cond, o->tokens, o->repeats);
        if (o->text) printf("tokens of %s, repeated\n", o->text);
        else printf("uniform over the vocabulary, splitmix64 seed %llu\n", (unsigned long long)o->seed);
        for (int k = 0; k < o->nmodels; k++) {
            char d[256];
            runs[k * npr].m.fam->describe(runs[k * npr].cfg, runs[k * npr].m.n, d, sizeof d);
            printf("  [%d] %s: %s\n", k + 1, o->models[k], d);
        }
        for (int i = 0; i < npr; i++) {
            char d[400];
            attn_decode_describe(&runs[i].kv.dc, d, sizeof d);
            const bool q = strcmp(o->prec[i], "fp32") && strcmp(o->prec[i], "bf16");
            printf("  %s rows: %s%s\n", o->prec[i], d,
                   !strcmp(o->prec[i], "bf16") ? "; prefill: oneDNN bf16 matmul and bf16 attention tiles"
                   : !q                        ? ""
                   : runs[i].ws.wq16.data ? "; prefill: bf16 matmul on the blocks dequantised one matrix at a time"
                                          : "; prefill: fp32 on the blocks dequantised one matrix at a time");
        }
        printf("%-4s %-5s %6s %26s %26s %9s %7s", "", "prec", "prompt", "prefill tok/s med (min-max)",
               "decode tok/s med (min-max)", "ms/token", "heads");
        if (o->nmodels > 1) printf(" %9s %9s", "prefill/1", "decode/1");
        if (both) printf(" %9s %9s", "pf/prec1", "dec/prec1");
        printf("\n");
    } else printf("[\n");
    bool first = true;
    for (int c = 0; c < o->nc; c++)
        for (int i = 0; i < nr; i++) {
            bdm_run *r = &runs[i], *r0 = &runs[i % npr], *tw = &runs[i - i % npr];
            const int k = i / npr;
            const bench_stats sp = bench_summarise(r->tp[c], o->repeats), sd = bench_summarise(r->td[c], o->repeats);
            const double ptps = r->plen[c] / sp.median, dtps = o->tokens / sd.median;
            const bench_stats sp0 = bench_summarise(r0->tp[c], o->repeats), sd0 = bench_summarise(r0->td[c], o->repeats);
            /* ratio of tokens/s: the first model's (same precision) time over this one's (same
             * context; prompts may differ) */
            const double rp = (r->plen[c] / sp.median) / (r0->plen[c] / sp0.median), rd = sd0.median / sd.median;
            /* the second and later precisions: over the same model's first precision */
            const bool pair = both && r != tw;
            const double bp = pair ? bench_summarise(tw->tp[c], o->repeats).median / sp.median : 1.0;
            const double bd = pair ? bench_summarise(tw->td[c], o->repeats).median / sd.median : 1.0;
            const double share = r->htot[c] ? (double)r->hrun[c] / r->htot[c] : 1.0;
            if (o->json) {
                printf("%s  {\"model\": ", first ? "" : ",\n");
                bench_json_str(stdout, r->path);
                printf(", \"context\": %d, \"prompt\": %d, \"new_tokens\": %d, \"prefill_tokens_per_s\": %.3f, "
                       "\"prefill_tokens_per_s_min\": %.3f, \"prefill_tokens_per_s_max\": %.3f, "
                       "\"decode_tokens_per_s\": %.3f, \"decode_tokens_per_s_min\": %.3f, \"decode_tokens_per_s_max\": "
                       "%.3f, \"prefill_ratio\": %.4f, \"decode_ratio\": %.4f, \"heads_active\": %.4f, \"threads\": %d, "
                       "\"repeats\": %d, \"prompt_ids\": \"%s\", \"seed\": %llu, \"prompt_hash\": \"%016llx\", "
                       "\"peak_rss_mb\": %.1f, \"precision\": \"%s\", \"prefill_vs_first_precision\": %.4f, "
                       "\"decode_vs_first_precision\": %.4f",
                       o->ctxs[c], r->plen[c], o->tokens, ptps, r->plen[c] / sp.max, r->plen[c] / sp.min, dtps,
                       o->tokens / sd.max, o->tokens / sd.min, rp, rd, share, omp_get_max_threads(), o->repeats,
                       o->text ? "text" : "random", (unsigned long long)o->seed, (unsigned long long)r->hash[c], rss_mb,
                       r->prec, bp, bd);
                bdm_phases(r, c, o->repeats, o->tokens, true);
                printf("}");
                first = false;
                continue;
            }
            char a[64], b[64];
            snprintf(a, sizeof a, "%.1f (%.1f-%.1f)", ptps, r->plen[c] / sp.max, r->plen[c] / sp.min);
            snprintf(b, sizeof b, "%.2f (%.2f-%.2f)", dtps, o->tokens / sd.max, o->tokens / sd.min);
            printf("[%d]  %-5s %6d %26s %26s %9.2f %7.3f", k + 1, r->prec, r->plen[c], a, b,
                   sd.median * 1e3 / o->tokens, share);
            if (o->nmodels > 1) printf(" %9.3f %9.3f", rp, rd);
            if (pair) printf(" %9.3f %9.3f", bp, bd);
            printf("\n");
            if (o->profile) bdm_phases(r, c, o->repeats, o->tokens, false);
        }
    if (o->json) printf("\n]\n");
    else printf("peak RSS %.0f MB (weights float32 once per model, plus a bf16 copy or quantised blocks per such "
                "precision; KV caches for %d + %d tokens)\n", rss_mb, runs[0].kv.max_T - o->tokens, o->tokens);
    for (int i = nr - 1; i >= 0; i--) bdm_free(&runs[i]); /* twins before the model they borrow */
    free(runs);
    return 0;
}
