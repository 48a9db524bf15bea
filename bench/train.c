/* `moh bench train`: decoder-LM training tokens/s (forward + backward + gradient clipping + AdamW,
 * random byte tokens) for the LM configs (default mha, moh-90, moh-75, moh-50), through two
 * attention paths:
 *  - reference: the LM with the reference attention (every head computed, then gated; `moh train
 *    --reference-attention`);
 *  - sparse: the same step with activations from lm_acts_init_sparse_f32, so each layer's
 *    attention runs the head-sparse path (what `moh train` uses by default); before timing, its
 *    loss and gradients are checked against the reference path on the same batch (relative
 *    1e-4), and the run stops if they disagree. */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../cli/args.h"
#include "../cli/cli.h"
#include "attn/sparse.h"
#include "bench.h"
#include "core/fsutil.h"
#include "models/lm.h"
#include "train/adamw.h"

#define BT_MAX_CFG 8

typedef struct bt_run {
    char name[64];
    moh_lm_config cfg;
    lm_params_f32 p, g;
    lm_acts_f32 acts[2]; /* [path]: reference, sparse */
    float *m, *v;
    bool *decay;
    bool have_p, have_g, have_acts[2];
    double t[2][64]; /* [path][repeat] seconds per step */
    double loss[2];
} bt_run;

static void bt_free(bt_run *r) {
    for (int k = 0; k < 2; k++)
        if (r->have_acts[k]) lm_acts_free_f32(&r->acts[k]);
    if (r->have_p) lm_params_free_f32(&r->p);
    if (r->have_g) lm_params_free_f32(&r->g);
    free(r->m);
    free(r->v);
    free(r->decay);
    memset(r, 0, sizeof *r);
}

static int bt_init(bt_run *r, const char *name, int B, int *T, moh_error *err) {
    memset(r, 0, sizeof *r);
    snprintf(r->name, sizeof r->name, "%.63s", name);
    char path[4096];
    if (!cli_resolve_config(name, path, sizeof path))
        return moh_fail(err, MOH_E_IO, "config '%s' not found (a file, or configs/%s.json)", name, name);
    size_t len = 0;
    char *text = fs_read_file(path, 1 << 20, &len, err);
    if (!text) return err->code;
    int rc = moh_lm_config_parse_json(&r->cfg, text, len, path, err);
    free(text);
    if (rc) return rc;
    if (*T <= 0) *T = r->cfg.max_position_embeddings;
    if ((rc = lm_params_init_f32(&r->p, &r->cfg, err))) return rc;
    r->have_p = true;
    if ((rc = lm_params_init_f32(&r->g, &r->cfg, err))) return rc;
    r->have_g = true;
    lm_params_init_random(&r->cfg, &r->p, 7, 0.02);
    if ((rc = lm_acts_init_f32(&r->acts[0], &r->cfg, B, *T, err))) return rc;
    r->have_acts[0] = true;
    if ((rc = lm_acts_init_sparse_f32(&r->acts[1], &r->cfg, B, *T, err))) return rc;
    r->have_acts[1] = true;
    r->m = calloc(r->p.n, sizeof(float));
    r->v = calloc(r->p.n, sizeof(float));
    r->decay = calloc(r->p.n, sizeof(bool));
    if (!r->m || !r->v || !r->decay) return moh_fail(err, MOH_E_NOMEM, "bench train: out of memory");
    int nt = 0;
    lm_tensor *ts = lm_tensors(&r->cfg, &nt);
    if (!ts) return moh_fail(err, MOH_E_NOMEM, "bench train: out of memory");
    for (int i = 0; i < nt; i++)
        for (size_t j = 0; j < ts[i].numel; j++) r->decay[ts[i].offset + j] = ts[i].decay;
    free(ts);
    return MOH_OK;
}

/* One optimizer step on (tok, tgt) through path 0 (reference) or 1 (sparse); returns the loss. */
static float bt_step(bt_run *r, int path, const int *tok, const int *tgt, int B, int T, long step) {
    static const adamw_config ac = {0.9, 0.95, 1e-8, 0.1};
    memset(r->g.data, 0, sizeof(float) * r->g.n);
    const float loss = lm_forward_f32(&r->cfg, &r->p, &r->acts[path], tok, tgt, B, T);
    lm_backward_f32(&r->cfg, &r->p, &r->g, &r->acts[path], tok, tgt);
    clip_grad_norm(r->g.data, r->g.n, 1.0);
    adamw_step(&ac, r->p.data, r->g.data, r->m, r->v, r->decay, r->p.n, step, 1e-4);
    return loss;
}

/* The sparse-path LM step against the reference path on one batch: loss and every gradient. */
static double bt_check(bt_run *r, const int *tok, const int *tgt, int B, int T, double *loss_err) {
    const size_t n = r->g.n;
    float *g0 = malloc(sizeof(float) * n);
    *loss_err = INFINITY;
    if (!g0) return INFINITY;
    memset(r->g.data, 0, sizeof(float) * n);
    const float l0 = lm_forward_f32(&r->cfg, &r->p, &r->acts[0], tok, tgt, B, T);
    lm_backward_f32(&r->cfg, &r->p, &r->g, &r->acts[0], tok, tgt);
    memcpy(g0, r->g.data, sizeof(float) * n);
    memset(r->g.data, 0, sizeof(float) * n);
    const float l1 = lm_forward_f32(&r->cfg, &r->p, &r->acts[1], tok, tgt, B, T);
    lm_backward_f32(&r->cfg, &r->p, &r->g, &r->acts[1], tok, tgt);
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        num = fmax(num, fabs((double)r->g.data[i] - g0[i]));
        den = fmax(den, fabs((double)g0[i]));
    }
    free(g0);
    *loss_err = fabs((double)l1 - l0) / fmax(fabs((double)l0), 1e-30);
    return num / fmax(den, 1e-30);
}

int bench_train(int argc, char **argv) {
    struct {
        bool json;
        const char *configs, *path;
        int batch, seq, steps, repeats;
    } a = {false, "mha,moh-90,moh-75,moh-50", "both", 16, 0, 2, 3};
    const arg_spec specs[] = {
        {"--json", ARG_FLAG, &a.json, NULL, "print a JSON array of rows instead of the table", false, ARG_ANY},
        {"--configs", ARG_STR, &a.configs, "A,B,...", "LM configs, names in configs/ or paths; the first is the baseline (default mha,moh-90,moh-75,moh-50)", false, ARG_ANY},
        {"--path", ARG_CHOICE, &a.path, "sparse|reference|both", "attention path of the step (default both)", false, ARG_ANY},
        {"--batch", ARG_INT, &a.batch, "B", "sequences per step (default 16, as moh train)", false, ARG_GE(1)},
        {"--seq", ARG_INT, &a.seq, "T", "sequence length (default: the first config's max_position_embeddings)", false, ARG_GE(1)},
        {"--steps", ARG_INT, &a.steps, "S", "timed optimizer steps per repeat (default 2)", false, ARG_GE(1)},
        {"--repeats", ARG_INT, &a.repeats, "R", "repeats, interleaved over configs and paths (default 3, max 64)", false, ARG_IN(1, 64)},
    };
    int prc = args_parse("bench train", argc, argv, specs, (int)(sizeof specs / sizeof specs[0]),
                         "[--json] [--configs mha,moh-75] [--path sparse|reference|both] [--batch B] [--seq T] [--steps S] [--repeats R]",
                         "LM training tokens/s: forward + backward + clipping + AdamW on random bytes, dense MHA vs MoH\nconfigs, with the LM's reference attention and with the head-sparse attention path.\n");
    if (prc) return prc == 1 ? 0 : prc;
    const bool p_ref = !strcmp(a.path, "reference") || !strcmp(a.path, "both");
    const bool p_sp = !strcmp(a.path, "sparse") || !strcmp(a.path, "both");
    char names[BT_MAX_CFG][64];
    int nn = 0;
    for (const char *s = a.configs; *s && nn < BT_MAX_CFG;) {
        const size_t k = strcspn(s, ",");
        snprintf(names[nn++], sizeof names[0], "%.*s", (int)(k < 63 ? k : 63), s);
        s += k;
        if (*s == ',') s++;
    }
    bt_run *runs = calloc((size_t)nn, sizeof *runs);
    if (!runs || nn < 1) {
        free(runs);
        fprintf(stderr, "moh bench train: no configs\n");
        return nn < 1 ? 2 : 1;
    }
    moh_error err = {0};
    int T = a.seq, status = 0;
    for (int i = 0; i < nn && !status; i++) {
        fprintf(stderr, "[bench train] loading %s\n", names[i]);
        status = bt_init(&runs[i], names[i], a.batch, &T, &err);
    }
    const int B = a.batch;
    int *tok = malloc(sizeof(int) * (size_t)B * T), *tgt = malloc(sizeof(int) * (size_t)B * T);
    if (!status && (!tok || !tgt)) status = moh_fail(&err, MOH_E_NOMEM, "bench train: out of memory");
    uint64_t s = 99;
    for (int i = 0; !status && i < B * T; i++) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        tok[i] = (int)((s >> 33) % (uint64_t)runs[0].cfg.vocab_size);
    }
    for (int i = 0; !status && i < B * T; i++) tgt[i] = (i + 1) % T ? tok[i + 1] : -1;
    /* both paths must compute the same model */
    for (int i = 0; i < nn && !status && p_sp; i++) {
        double lerr = INFINITY;
        const double gerr = bt_check(&runs[i], tok, tgt, B, T, &lerr);
        fprintf(stderr, "[bench train] %s: sparse vs reference attention step: loss rel err %.2e, gradient rel err %.2e\n",
                runs[i].name, lerr, gerr);
        if (!(lerr < 1e-4 && gerr < 1e-4))
            status = moh_fail(&err, MOH_E_ARG, "%s: the sparse-path LM step disagrees with the reference path (loss %.3g, gradients %.3g)", runs[i].name, lerr, gerr);
    }
    long step = 1;
    const int paths[2] = {p_ref ? 0 : -1, p_sp ? 1 : -1};
    for (int g = 0; g < nn && !status; g++) /* warm-up */
        for (int pi = 0; pi < 2; pi++)
            if (paths[pi] >= 0) bt_step(&runs[g], pi, tok, tgt, B, T, step++);
    for (int rep = 0; rep < a.repeats && !status; rep++) {
        fprintf(stderr, "[bench train] repeat %d/%d\n", rep + 1, a.repeats);
        for (int k = 0; k < nn; k++) {
            bt_run *r = &runs[(k + rep) % nn];
            for (int pi = 0; pi < 2; pi++) {
                const int path = (pi + rep) % 2;
                if (paths[path] < 0) continue;
                const double t0 = omp_get_wtime();
                for (int st = 0; st < a.steps; st++) r->loss[path] = bt_step(r, path, tok, tgt, B, T, step++);
                r->t[path][rep] = (omp_get_wtime() - t0) / a.steps;
            }
        }
    }
    if (status) {
        fprintf(stderr, "moh bench train: %s\n", err.msg);
    } else {
        char cpu[256];
        bench_cpu_model(cpu, sizeof cpu);
        const int threads = omp_get_max_threads();
        const double tokens = (double)B * T;
        if (a.json) printf("[\n");
        else {
            char cond[256];
            bench_conditions(cond, sizeof cond);
            printf("moh bench train: %s; %s; B=%d T=%d (%.0f tokens/step), %d steps x %d repeats\n",
                   cpu, cond, B, T, tokens, a.steps, a.repeats);
            printf("%-10s %-10s %8s %28s %10s %9s\n", "config", "path", "active", "tokens/s median (min-max)", "ms/step", "speedup");
        }
        bool first = true;
        for (int path = 0; path < 2; path++) {
            if (paths[path] < 0) continue;
            double base = 0.0;
            for (int i = 0; i < nn; i++) {
                bt_run *r = &runs[i];
                const bench_stats st = bench_summarise(r->t[path], a.repeats);
                const double tps = tokens / st.median;
                if (i == 0) base = tps;
                const moh_attn_config *ac = &r->cfg.attn;
                const int act = ac->router == MOH_ROUTER_NONE || ac->top_k == 0 ? ac->n_heads : ac->shared_heads + ac->top_k;
                const double share = (double)act / ac->n_heads;
                const char *pname = path ? "sparse" : "reference";
                if (a.json) {
                    printf("%s  {\"config\": ", first ? "" : ",\n");
                    first = false;
                    bench_json_str(stdout, r->name);
                    printf(", \"path\": \"%s\", \"active\": %.4f, \"tokens_per_s\": %.2f, \"tokens_per_s_min\": %.2f, "
                           "\"tokens_per_s_max\": %.2f, \"ms_per_step\": %.2f, \"speedup\": %.4f, \"batch\": %d, "
                           "\"seq\": %d, \"steps\": %d, \"repeats\": %d, \"threads\": %d, \"loss\": %.4f}",
                           pname, share, tps, tokens / st.max, tokens / st.min, st.median * 1e3, tps / base, B, T,
                           a.steps, a.repeats, threads, r->loss[path]);
                } else {
                    char tp[64];
                    snprintf(tp, sizeof tp, "%.0f (%.0f-%.0f)", tps, tokens / st.max, tokens / st.min);
                    printf("%-10s %-10s %8.3f %28s %10.1f %9.3f\n", r->name, pname, share, tp, st.median * 1e3, tps / base);
                }
            }
        }
        if (a.json) printf("\n]\n");
    }
    for (int i = 0; i < nn; i++) bt_free(&runs[i]);
    free(runs);
    free(tok);
    free(tgt);
    return status ? 1 : 0;
}
