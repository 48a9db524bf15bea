/* `moh bench train`: training tokens/s of any model family with a synthetic_batch hook (model.h)
 * (forward + backward + gradient clipping + AdamW on a random batch) for configs of one family
 * (default the LM's mha, moh-90, moh-75, moh-50), through two attention paths:
 *  - reference: activations from acts_new(sparse = false), every head computed, then gated (`moh
 *    train --reference-attention`);
 *  - sparse: the same step with acts_new(sparse = true), so each layer's attention runs the
 *    head-sparse path (`moh train --sparse-attn`); before timing, its loss and gradients are checked
 *    against the reference path on the same batch (relative 1e-4), and the run stops if they
 *    disagree.
 * With --precision bf16 or both, each path also runs in bf16 (attn_stack_set_weights_f32: GEMMs and attention
 * tiles in bf16, fp32 master weights whose bf16 copy is converted every step, inside the timing).
 * Tokens are attention tokens: B T for text, B num_tokens (tokens_per_example) for images. */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../cli/args.h"
#include "../cli/cli.h"
#include "bench.h"
#include "models/model.h"
#include "train/optim.h"

#define BT_MAX_CFG 8
#define BT_MAX_PH 48

typedef struct bt_run {
    char name[64];
    model m;           /* config and parameters (m.data [m.n]) */
    void *g;           /* gradient views (model_params_new) over gdata [m.n] */
    float *gdata;
    void *acts[4];     /* [path + 2 precision]: reference, sparse; in fp32, then bf16 */
    bf16_mirror mw;    /* bf16: the weights' bf16 copy, converted every step (as model_shards) */
    moh_batch batch;   /* the synthetic batch (arrays in batch_buf) */
    void *batch_buf;
    float *mom, *vel;
    optim opt[2];      /* [precision]: AdamW or Muon (Newton-Schulz in fp32, in bf16) */
    double t[4][64];   /* [path + 2 precision][repeat] seconds per step */
    double cpu[4][64]; /* [path + 2 precision][repeat] process CPU seconds per step (bench_cpu_seconds) */
    double loss[4];
    double t_clip[4], t_opt[4]; /* [path + 2 precision] seconds in clip_grad_norm and the optimizer, accumulated */
} bt_run;

static void bt_free(bt_run *r) {
    const model_family *fam = r->m.fam;
    for (int k = 0; fam && k < 4; k++)
        if (r->acts[k]) model_acts_free(fam, r->acts[k]);
    bf16_mirror_free(&r->mw);
    if (fam && r->g) model_params_free(fam, r->g);
    model_free(&r->m);
    free(r->batch_buf);
    free(r->mom);
    free(r->vel);
    optim_free(&r->opt[0]);
    optim_free(&r->opt[1]);
    memset(r, 0, sizeof *r);
}

/* Loads config `name`, random weights (seed 7), gradients, both activations and the batch of B
 * examples of *T tokens (*T <= 0: the config's longest sequence; images ignore it). Family and
 * tokens per example must be those of first when given (the first config's run). */
static int bt_init(bt_run *r, const char *name, int B, int *T, const bt_run *first, const bool want[4], int optimizer,
                   moh_error *err) {
    memset(r, 0, sizeof *r);
    snprintf(r->name, sizeof r->name, "%.63s", name);
    char path[4096];
    if (!cli_resolve_config(name, path, sizeof path))
        return moh_fail(err, MOH_E_IO, "config '%s' not found (a file, or configs/%s.json)", name, name);
    int rc = model_from_config_file(&r->m, path, err);
    if (rc) return rc;
    const model_family *fam = r->m.fam, *fam0 = first ? first->m.fam : NULL;
    if (fam0 && fam != fam0)
        return moh_fail(err, MOH_E_ARG, "--configs: %s is a %s (model_type \"%s\"), the first config a %s (\"%s\"); "
                        "expected configs of one family", name, fam->short_name, fam->model_type, fam0->short_name,
                        fam0->model_type);
    if (!fam->synthetic_batch)
        return moh_fail(err, MOH_E_ARG, "%s is a %s model (model_type \"%s\"), which does not support bench train",
                        name, fam->short_name, fam->model_type);
    if (*T <= 0) *T = fam->max_seq_len ? fam->max_seq_len(r->m.cfg) : 0;
    size_t gn = 0;
    if ((rc = model_params_new(fam, r->m.cfg, &r->g, &r->gdata, &gn, err))) return rc;
    fam->init_random(r->m.cfg, r->m.params, 7);
    for (int k = 0; k < 4; k++) {
        if (!want[k] && !(k == 0 && want[1])) continue; /* the sparse path's check needs the reference */
        if ((rc = model_acts_new(fam, r->m.cfg, B, *T, k % 2 == 1, &r->acts[k], err))) return rc;
        if (k < 2) continue;
        if (!r->mw.data && (rc = bf16_mirror_init(&r->mw, r->m.data, r->m.n, err))) return rc;
        if ((rc = attn_stack_set_weights_f32(r->acts[k], &r->mw, err))) return rc;
    }
    if ((rc = fam->synthetic_batch(r->m.cfg, B, *T, 99, &r->batch, &r->batch_buf, err))) return rc;
    if (first && fam->tokens_per_example(r->m.cfg, &r->batch) != fam->tokens_per_example(first->m.cfg, &first->batch))
        return moh_fail(err, MOH_E_ARG, "--configs: %s has %d tokens per example, the first config %d; expected the "
                        "same (tokens/s compared)", name, fam->tokens_per_example(r->m.cfg, &r->batch),
                        fam->tokens_per_example(first->m.cfg, &first->batch));
    r->mom = calloc(r->m.n, sizeof(float));
    r->vel = calloc(r->m.n, sizeof(float));
    if (!r->mom || !r->vel) return moh_fail(err, MOH_E_NOMEM, "bench train: out of memory");
    if ((rc = optim_init(&r->opt[0], &r->m, optimizer, false, NULL, err))) return rc;
    return optim_init(&r->opt[1], &r->m, optimizer, r->mw.data != NULL, NULL, err);
}

/* Forward + backward of the batch through path 0 (reference) or 1 (sparse), + 2 in bf16, into
 * zeroed gradients; returns the loss. */
static double bt_grad(bt_run *r, int path) {
    const model_family *fam = r->m.fam;
    double ce, lb;
    memset(r->gdata, 0, sizeof(float) * r->m.n);
    if (path >= 2) bf16_mirror_sync(&r->mw);
    const double loss = fam->forward(r->m.cfg, r->m.params, r->acts[path], &r->batch, 0, r->batch.B, true, &ce, &lb);
    fam->backward(r->m.cfg, r->m.params, r->g, r->acts[path], &r->batch, 0, r->batch.B);
    return loss;
}

/* One optimizer step on the batch through path 0 (reference) or 1 (sparse), + 2 in bf16;
 * returns the loss. */
static double bt_step(bt_run *r, int path, long step) {
    static const adamw_config ac = {0.9, 0.95, 1e-8, 0.1};
    static const muon_config mc = {.momentum = 0.95, .weight_decay = 0.1, .ns_steps = 5};
    const double loss = bt_grad(r, path);
    const double t0 = omp_get_wtime();
    clip_grad_norm(r->gdata, r->m.n, 1.0);
    const double t1 = omp_get_wtime();
    optim_step(&r->opt[path >= 2], &ac, &mc, r->m.data, r->gdata, r->mom, r->vel, step, 1e-4, 1e-4);
    r->t_clip[path] += t1 - t0;
    r->t_opt[path] += omp_get_wtime() - t1;
    return loss;
}

/* The sparse-path step against the reference path on one batch: loss and every gradient. */
static double bt_check(bt_run *r, double *loss_err) {
    const size_t n = r->m.n;
    float *g0 = malloc(sizeof(float) * n);
    *loss_err = INFINITY;
    if (!g0) return INFINITY;
    const double l0 = bt_grad(r, 0);
    memcpy(g0, r->gdata, sizeof(float) * n);
    const double l1 = bt_grad(r, 1);
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        num = fmax(num, fabs((double)r->gdata[i] - g0[i]));
        den = fmax(den, fabs((double)g0[i]));
    }
    free(g0);
    *loss_err = fabs(l1 - l0) / fmax(fabs(l0), 1e-30);
    return num / fmax(den, 1e-30);
}

/* The phases of r's steps on path: ms per timed step (nsteps), then clip, the optimizer ("adamw",
 * or "muon": Muon and AdamW on the rest) and their total (the top-level phases plus those two) into nm/sec/sub [BT_MAX_PH + 3]; returns the count,
 * 0 when the family does not time its phases. */
static int bt_phases(bt_run *r, int path, int nsteps, const char **nm, double *sec, bool *sub) {
    if (!r->m.fam->phase_times) return 0;
    const int nph = r->m.fam->phase_times(r->acts[path], nm, sec, sub, BT_MAX_PH, false);
    double top = 0.0;
    for (int k = 0; k < nph; k++) {
        sec[k] *= 1e3 / nsteps;
        if (!sub[k]) top += sec[k];
    }
    nm[nph] = "clip";
    nm[nph + 1] = r->opt[0].kind == OPTIM_MUON ? "muon" : "adamw";
    nm[nph + 2] = "total";
    sec[nph] = r->t_clip[path] * 1e3 / nsteps;
    sec[nph + 1] = r->t_opt[path] * 1e3 / nsteps;
    sec[nph + 2] = top + sec[nph] + sec[nph + 1];
    sub[nph] = sub[nph + 1] = sub[nph + 2] = false;
    return nph + 3;
}

/* `--phases --json`: `, "phase_ms": {...}` inside a row (the attention path's phases as "attn.X"). */
static void bt_json_phases(bt_run *r, int path, int nsteps) {
    const char *nm[BT_MAX_PH + 3];
    double sec[BT_MAX_PH + 3];
    bool sub[BT_MAX_PH + 3];
    const int n = bt_phases(r, path, nsteps, nm, sec, sub);
    if (!n) return;
    printf(", \"phase_ms\": {");
    for (int k = 0; k < n; k++) printf("%s\"%s%s\": %.3f", k ? ", " : "", sub[k] ? "attn." : "", nm[k], sec[k]);
    printf("}");
}

/* `--phases` (text): ms per step of each phase, one column per (config, path), with its share of
 * the steps' total (the top-level phases plus clipping and AdamW). */
static void bt_print_phases(bt_run *runs, int nn, const bool want[4], int nsteps) {
    const char *nm[BT_MAX_PH + 3];
    double sec[4 * BT_MAX_CFG][BT_MAX_PH + 3];
    bool sub[BT_MAX_PH + 3];
    const char *col[4 * BT_MAX_CFG], *colpath[4 * BT_MAX_CFG];
    int ncol = 0, n = 0;
    static const char *const pshort[4] = {"ref", "sparse", "ref-bf16", "sp-bf16"};
    for (int path = 0; path < 4; path++)
        for (int i = 0; i < nn && want[path]; i++) {
            if (!(n = bt_phases(&runs[i], path, nsteps, nm, sec[ncol], sub))) continue;
            col[ncol] = runs[i].name;
            colpath[ncol++] = pshort[path];
        }
    if (!ncol) {
        fprintf(stderr, "moh bench train: --phases: this family does not time its phases\n");
        return;
    }
    printf("\nphases, ms per step (mean over %d timed steps; indented: the attention path's own phases, "
           "part of attn / bwd_attn)\n%-16s", nsteps, "phase");
    for (int c = 0; c < ncol; c++) {
        char lab[80];
        snprintf(lab, sizeof lab, "%.40s/%s", col[c], colpath[c]);
        printf(" %14s", lab);
    }
    printf("\n");
    for (int k = 0; k < n; k++) {
        if (k == n - 1) printf("%-16s\n", "");
        printf("%s%-*s", sub[k] ? "  " : "", sub[k] ? 14 : 16, nm[k]);
        for (int c = 0; c < ncol; c++) {
            const double tot = sec[c][n - 1];
            printf(" %7.1f %5.1f%%", sec[c][k], tot > 0 ? 100.0 * sec[c][k] / tot : 0.0);
        }
        printf("\n");
    }
}

int bench_train(int argc, char **argv) {
    struct {
        bool json, phases;
        const char *configs, *path, *precision, *optimizer;
        int batch, seq, steps, repeats;
    } a = {false, false, "mha,moh-90,moh-75,moh-50", "both", "fp32", "adamw", 16, 0, 2, 3};
    const arg_spec specs[] = {
        {"--json", ARG_FLAG, &a.json, NULL, "print a JSON array of rows instead of the table", false, ARG_ANY},
        {"--configs", ARG_STR, &a.configs, "A,B,...", "configs of one model family, names in configs/ or paths; the first is the baseline (default mha,moh-90,moh-75,moh-50)", false, ARG_ANY},
        {"--path", ARG_CHOICE, &a.path, "sparse|reference|both", "attention path of the step (default both)", false, ARG_ANY},
        {"--precision", ARG_CHOICE, &a.precision, "fp32|bf16|both", "compute precision of the step (bf16: GEMMs and attention tiles in bf16, fp32 master weights); both: every row in each, interleaved, with the bf16/fp32 ratio (default fp32)", false, ARG_ANY},
        {"--optimizer", ARG_CHOICE, &a.optimizer, "adamw|muon", "the update of each step (moh train --optimizer; muon: Muon on the hidden matrices, AdamW on the rest; default adamw)", false, ARG_ANY},
        {"--batch", ARG_INT, &a.batch, "B", "examples (sequences, images) per step (default 16)", false, ARG_GE(1)},
        {"--seq", ARG_INT, &a.seq, "T", "text: sequence length (default: the first config's max_position_embeddings)", false, ARG_GE(1)},
        {"--steps", ARG_INT, &a.steps, "S", "timed optimizer steps per repeat (default 2)", false, ARG_GE(1)},
        {"--repeats", ARG_INT, &a.repeats, "R", "repeats, interleaved over configs and paths (default 3, max 64)", false, ARG_IN(1, 64)},
        {"--phases", ARG_FLAG, &a.phases, NULL, "also print ms per step of each phase of the timed steps (forward, backward, clipping, the optimizer; families that time them: the LM); with --json a phase_ms object per row", false, ARG_ANY},
    };
    int prc = args_parse("bench train", argc, argv, specs, (int)(sizeof specs / sizeof specs[0]),
                         "[--json] [--configs mha,moh-75] [--path sparse|reference|both] [--precision fp32|bf16|both] [--optimizer adamw|muon] [--batch B] [--seq T] [--steps S] [--repeats R] [--phases]",
                         "Training tokens/s of any model family: forward + backward + clipping + AdamW (or Muon) on a random batch\n(random bytes for the LM, random pixels for the ViT), dense MHA vs MoH configs, with the reference\nattention and with the head-sparse attention path. Image tokens: patches (+ class token).\n");
    if (prc) return prc == 1 ? 0 : prc;
    const bool p_ref = !strcmp(a.path, "reference") || !strcmp(a.path, "both");
    const bool p_sp = !strcmp(a.path, "sparse") || !strcmp(a.path, "both");
    bool pr_fp32, pr_bf16;
    char bfline[256];
    bench_precisions("train", a.precision, &pr_fp32, &pr_bf16, bfline, sizeof bfline);
    const bool want[4] = {p_ref && pr_fp32, p_sp && pr_fp32, p_ref && pr_bf16, p_sp && pr_bf16};
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
        status = bt_init(&runs[i], names[i], a.batch, &T, i ? &runs[0] : NULL, want, !strcmp(a.optimizer, "muon"), &err);
    }
    const int B = a.batch;
    /* both paths must compute the same model */
    for (int i = 0; i < nn && !status && p_sp && pr_fp32; i++) {
        double lerr = INFINITY;
        const double gerr = bt_check(&runs[i], &lerr);
        fprintf(stderr, "[bench train] %s: sparse vs reference attention step: loss rel err %.2e, gradient rel err %.2e\n",
                runs[i].name, lerr, gerr);
        if (!(lerr < 1e-4 && gerr < 1e-4))
            status = moh_fail(&err, MOH_E_ARG, "%s: the sparse-path step disagrees with the reference path (loss %.3g, gradients %.3g)", runs[i].name, lerr, gerr);
    }
    for (int i = 0; i < nn && !status && pr_bf16; i++) { /* bf16 against fp32 on one batch */
        const int p = p_sp ? 1 : 0;
        double lf = 0.0;
        if (!runs[i].acts[p]) {
            fprintf(stderr, "[bench train] %s: bf16 step loss %.6f\n", runs[i].name, bt_grad(&runs[i], p + 2));
            continue;
        }
        lf = bt_grad(&runs[i], p);
        const double lb = bt_grad(&runs[i], p + 2);
        fprintf(stderr, "[bench train] %s: bf16 vs fp32 step: loss %.6f vs %.6f (rel %.2e)\n", runs[i].name, lb, lf,
                fabs(lb - lf) / fmax(fabs(lf), 1e-30));
    }
    long step = 1;
    for (int g = 0; g < nn && !status; g++) /* warm-up */
        for (int pi = 0; pi < 4; pi++)
            if (want[pi]) bt_step(&runs[g], pi, step++);
    for (int g = 0; g < nn && !status; g++) { /* phase timers: the timed steps only */
        bt_run *r = &runs[g];
        const char *nm[BT_MAX_PH];
        double sec[BT_MAX_PH];
        bool sub[BT_MAX_PH];
        for (int pi = 0; pi < 4 && r->m.fam->phase_times; pi++)
            if (r->acts[pi]) r->m.fam->phase_times(r->acts[pi], nm, sec, sub, BT_MAX_PH, true);
        memset(r->t_clip, 0, sizeof r->t_clip);
        memset(r->t_opt, 0, sizeof r->t_opt);
    }
    for (int rep = 0; rep < a.repeats && !status; rep++) {
        fprintf(stderr, "[bench train] repeat %d/%d\n", rep + 1, a.repeats);
        for (int k = 0; k < nn; k++) {
            bt_run *r = &runs[(k + rep) % nn];
            for (int pi = 0; pi < 4; pi++) {
                const int path = (pi + rep) % 4;
                if (!want[path]) continue;
                const double t0 = omp_get_wtime(), c0 = bench_cpu_seconds();
                for (int st = 0; st < a.steps; st++) r->loss[path] = bt_step(r, path, step++);
                r->t[path][rep] = (omp_get_wtime() - t0) / a.steps;
                r->cpu[path][rep] = (bench_cpu_seconds() - c0) / a.steps;
            }
        }
    }
    if (status) {
        fprintf(stderr, "moh bench train: %s\n", err.msg);
    } else {
        char cpu[256];
        bench_cpu_model(cpu, sizeof cpu);
        const int threads = omp_get_max_threads();
        /* attention tokens per step: B T (text), B num_tokens (images) */
        const int N = runs[0].m.fam->tokens_per_example(runs[0].m.cfg, &runs[0].batch);
        const double tokens = (double)B * N;
        if (a.json) printf("[\n");
        else {
            char cond[256];
            bench_conditions(cond, sizeof cond);
            printf("moh bench train: %s; %s; B=%d T=%d (%.0f tokens/step), %d steps x %d repeats, optimizer %s\n",
                   cpu, cond, B, N, tokens, a.steps, a.repeats, a.optimizer);
            if (pr_bf16) printf("compute (bf16 rows): %s\n", bfline);
            printf("%-10s %-16s %8s %28s %10s %9s %12s%s\n", "config", "path", "active", "tokens/s median (min-max)",
                   "ms/step", "speedup", "cpu-ms/step", pr_bf16 && pr_fp32 ? "   bf16/fp32" : "");
        }
        bool first = true;
        for (int path = 0; path < 4; path++) {
            if (!want[path]) continue;
            double base = 0.0;
            for (int i = 0; i < nn; i++) {
                bt_run *r = &runs[i];
                const bench_stats st = bench_summarise(r->t[path], a.repeats);
                const double cpu_ms = bench_summarise(r->cpu[path], a.repeats).median * 1e3;
                const double tps = tokens / st.median;
                if (i == 0) base = tps;
                const double share = model_active_heads(&r->m) / model_attn(&r->m)->n_heads; /* mean over layers */
                static const char *const pnames[4] = {"reference", "sparse", "reference bf16", "sparse bf16"};
                const char *pname = pnames[path];
                const bool pair = path >= 2 && want[path - 2];
                const double vs = pair ? bench_summarise(r->t[path - 2], a.repeats).median / st.median : 0.0;
                if (a.json) {
                    printf("%s  {\"config\": ", first ? "" : ",\n");
                    first = false;
                    bench_json_str(stdout, r->name);
                    printf(", \"path\": \"%s\", \"active\": %.4f, \"tokens_per_s\": %.2f, \"tokens_per_s_min\": %.2f, "
                           "\"tokens_per_s_max\": %.2f, \"ms_per_step\": %.2f, \"speedup\": %.4f, \"batch\": %d, "
                           "\"seq\": %d, \"steps\": %d, \"repeats\": %d, \"threads\": %d, \"loss\": %.4f, "
                           "\"cpu_ms_per_step\": %.2f, \"precision\": \"%s\", \"optimizer\": \"%s\", \"speedup_vs_fp32\": %.4f",
                           pname, share, tps, tokens / st.max, tokens / st.min, st.median * 1e3, tps / base, B, N,
                           a.steps, a.repeats, threads, r->loss[path], cpu_ms, path >= 2 ? "bf16" : "fp32",
                           a.optimizer, pair ? vs : 1.0);
                    if (a.phases) bt_json_phases(r, path, a.repeats * a.steps);
                    printf("}");
                } else {
                    char tp[64];
                    snprintf(tp, sizeof tp, "%.0f (%.0f-%.0f)", tps, tokens / st.max, tokens / st.min);
                    printf("%-10s %-16s %8.3f %28s %10.1f %9.3f %12.1f", r->name, pname, share, tp, st.median * 1e3,
                           tps / base, cpu_ms);
                    if (pair) printf(" %11.3f", vs);
                    printf("\n");
                }
            }
        }
        if (a.json) printf("\n]\n");
        if (a.phases && !a.json) bt_print_phases(runs, nn, want, a.repeats * a.steps);
    }
    for (int i = 0; i < nn; i++) bt_free(&runs[i]);
    free(runs);
    return status ? 1 : 0;
}
