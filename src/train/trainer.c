/* The language-model trainer: data -> forward -> loss -> backward -> clip -> AdamW -> checkpoint,
 * with periodic validation, a progress line and metrics.jsonl. */
#include "train/trainer.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/fsutil.h"
#include "data/text.h"
#include "train/adamw.h"
#include "train/train_util.h"
#include "train/checkpoint.h"

void lm_train_defaults(lm_train_options *o) {
    memset(o, 0, sizeof *o);
    o->seed = 1;
    o->batch_size = 16;
    o->grad_accum = 1;
    o->lr = 2e-3;
    o->min_lr_ratio = 0.1;
    o->weight_decay = 0.1;
    o->beta1 = 0.9;
    o->beta2 = 0.95;
    o->grad_clip = 1.0;
    o->warmup = -1;
    o->eval_every = 200;
    o->eval_tokens = 131072;
    o->log_every = 10;
    o->val_fraction = 0.1;
}

int lm_evaluate(const moh_lm_config *cfg, const lm_params_f32 *p, lm_acts_f32 *acts, int B, int T,
                const uint8_t *bytes, size_t n, long max_tokens, const train_progress *progress,
                lm_eval_result *r, moh_error *err) {
    const int L = cfg->num_hidden_layers, h = cfg->num_attention_heads;
    memset(r, 0, sizeof *r);
    r->head_share = calloc((size_t)L * h, sizeof(double));
    int *tok = malloc(sizeof(int) * (size_t)B * T), *tgt = malloc(sizeof(int) * (size_t)B * T);
    if (!r->head_share || !tok || !tgt) {
        free(tok);
        free(tgt);
        return moh_fail(err, MOH_E_NOMEM, "eval: out of memory");
    }
    const long nchunks = text_eval_num_chunks(n, T), all = text_eval_num_preds(n, T);
    const long total = max_tokens > 0 && max_tokens < all ? max_tokens : all;
    double ce_sum = 0.0, lb_sum = 0.0;
    long batches = 0;
    for (long c = 0; c < nchunks;) {
        /* full-length chunks are batched B at a time; a shorter last chunk runs alone */
        int rows = 0, len = 0;
        while (rows < B && c < nchunks) {
            int *tk = tok + (size_t)rows * T, *tg = tgt + (size_t)rows * T;
            int k = text_eval_chunk(bytes, n, T, c, tk, tg);
            if (rows > 0 && k != len) break;
            len = k;
            rows++;
            c++;
            if (k != T) break;
        }
        if (len < T) /* repack the rows of a short chunk contiguously: [rows, len] */
            for (int b = 1; b < rows; b++) {
                memmove(tok + (size_t)b * len, tok + (size_t)b * T, sizeof(int) * len);
                memmove(tgt + (size_t)b * len, tgt + (size_t)b * T, sizeof(int) * len);
            }
        lm_forward_f32(cfg, p, acts, tok, tgt, rows, len);
        const long preds = (long)rows * len;
        ce_sum += (double)acts->ce_loss * preds;
        lb_sum += acts->lb_loss;
        batches++;
        r->tokens += preds;
        for (int l = 0; l < L; l++) {
            const float *g = lm_router_f32(acts, l)->gates;
            for (long t = 0; t < preds; t++)
                for (int i = 0; i < h; i++) r->head_share[(size_t)l * h + i] += g[t * h + i] != 0.0f;
        }
        if (progress && progress->fn) progress->fn(progress->ctx, r->tokens < total ? r->tokens : total, total);
        if (max_tokens > 0 && r->tokens >= max_tokens) break;
    }
    free(tok);
    free(tgt);
    if (r->tokens == 0) {
        free(r->head_share);
        r->head_share = NULL;
        return moh_fail(err, MOH_E_FORMAT, "eval: the data has %zu bytes, fewer than the 2 needed for one prediction", n);
    }
    for (size_t i = 0; i < (size_t)L * h; i++) r->head_share[i] /= (double)r->tokens;
    r->val_loss = ce_sum / (double)r->tokens;
    r->bits_per_byte = r->val_loss / log(2.0);
    r->lb_loss = lb_sum / (double)batches;
    return MOH_OK;
}

/* Min and max over layers and routed heads of the share of tokens selecting the head. */
static void routed_share(const moh_lm_config *cfg, const lm_acts_f32 *a, double *mn, double *mx) {
    const int E = attn_routed_heads(&cfg->attn), T = a->B * a->T;
    *mn = 1.0;
    *mx = 0.0;
    if (E == 0 || cfg->attn.top_k == 0) {
        *mn = *mx = 1.0;
        return;
    }
    for (int l = 0; l < cfg->num_hidden_layers; l++)
        for (int i = 0; i < E; i++) {
            double f = 0.0;
            for (int t = 0; t < T; t++) f += lm_router_f32(a, l)->mask[(size_t)t * E + i];
            f /= T;
            *mn = f < *mn ? f : *mn;
            *mx = f > *mx ? f : *mx;
        }
}

typedef struct trainer {
    const lm_train_options *o;
    moh_lm_config cfg;
    text_data data;
    lm_params_f32 p, g;
    lm_acts_f32 acts;
    float *m, *v;
    bool *decay;
    int T, B;
    lm_train_state st;
    long total, warmup;
    FILE *metrics;
} trainer;

static int save(trainer *tr, moh_error *err) {
    return lm_checkpoint_save(tr->o->out_dir, &tr->cfg, &tr->p, tr->m, tr->v, &tr->st, err);
}

static int dump_grads(trainer *tr, const int *tok, const int *tgt, const float *init, moh_error *err) {
    int nt = 0;
    lm_tensor *ts = lm_tensors(&tr->cfg, &nt);
    const size_t BT = (size_t)tr->B * tr->T;
    float *ft = malloc(sizeof(float) * BT * 2);
    moh_st_entry *e = calloc((size_t)nt * 2 + 2, sizeof *e);
    char (*names)[112] = calloc((size_t)nt * 2, sizeof *names);
    int rc = MOH_OK;
    if (!ts || !ft || !e || !names) rc = moh_fail(err, MOH_E_NOMEM, "dump-grads: out of memory");
    if (!rc) {
        for (size_t i = 0; i < BT; i++) {
            ft[i] = (float)tok[i];
            ft[BT + i] = (float)tgt[i];
        }
        int n = 0;
        e[n++] = (moh_st_entry){"tokens", 2, {tr->B, tr->T}, ft};
        e[n++] = (moh_st_entry){"targets", 2, {tr->B, tr->T}, ft + BT};
        for (int i = 0; i < nt; i++) {
            snprintf(names[2 * i], sizeof names[0], "grad.%s", ts[i].name);
            snprintf(names[2 * i + 1], sizeof names[0], "init.%s", ts[i].name);
            e[n++] = (moh_st_entry){names[2 * i], ts[i].ndim, {ts[i].shape[0], ts[i].shape[1]}, tr->g.data + ts[i].offset};
            e[n++] = (moh_st_entry){names[2 * i + 1], ts[i].ndim, {ts[i].shape[0], ts[i].shape[1]}, init + ts[i].offset};
        }
        rc = moh_st_write(tr->o->dump_grads, e, n, err);
    }
    free(ts);
    free(ft);
    free(e);
    free(names);
    return rc;
}

static int setup(trainer *tr, moh_error *err) {
    const lm_train_options *o = tr->o;
    char path[4200];
    size_t len = 0;
    if (o->resume) snprintf(path, sizeof path, "%s/config.json", o->out_dir);
    else snprintf(path, sizeof path, "%s", o->config_path);
    char *text = fs_read_file(path, 1 << 20, &len, err);
    if (!text) return err->code;
    int rc = moh_lm_config_parse_json(&tr->cfg, text, len, path, err);
    free(text);
    if (!rc) rc = lm_check_byte_vocab(&tr->cfg, path, err);
    if (rc) return rc;
    tr->T = o->seq_len > 0 ? o->seq_len : tr->cfg.max_position_embeddings;
    tr->B = o->batch_size;
    if (tr->B < 1 || tr->T < 1 || o->grad_accum < 1)
        return moh_fail(err, MOH_E_ARG, "--batch-size, --seq-len and --grad-accum must be >= 1");
    if (tr->T > tr->cfg.max_position_embeddings) /* positions the model is not built for */
        return moh_fail(err, MOH_E_ARG, "--seq-len is %d, more than %s's max_position_embeddings %d (raise it in the "
                        "config to train a longer context)", tr->T, path, tr->cfg.max_position_embeddings);
    if ((rc = text_data_load(&tr->data, o->data_path, o->val_fraction, (size_t)tr->T + 2, err))) return rc;
    if ((rc = lm_params_init_f32(&tr->p, &tr->cfg, err))) return rc;
    if ((rc = lm_params_init_f32(&tr->g, &tr->cfg, err))) return rc;
    rc = o->reference_attention ? lm_acts_init_f32(&tr->acts, &tr->cfg, tr->B, tr->T, err)
                                : lm_acts_init_sparse_f32(&tr->acts, &tr->cfg, tr->B, tr->T, err);
    if (rc) return rc;
    tr->m = calloc(tr->p.n, sizeof(float));
    tr->v = calloc(tr->p.n, sizeof(float));
    tr->decay = calloc(tr->p.n, sizeof(bool));
    if (!tr->m || !tr->v || !tr->decay) return moh_fail(err, MOH_E_NOMEM, "optimizer state: out of memory");
    int nt = 0;
    lm_tensor *ts = lm_tensors(&tr->cfg, &nt);
    if (!ts) return moh_fail(err, MOH_E_NOMEM, "out of memory");
    for (int i = 0; i < nt; i++)
        for (size_t j = 0; j < ts[i].numel; j++) tr->decay[ts[i].offset + j] = ts[i].decay;
    free(ts);
    if (o->resume) {
        rc = lm_checkpoint_load_optimizer(o->out_dir, &tr->cfg, tr->p.data, tr->m, tr->v, tr->p.n, &tr->st, err);
        if (rc) return rc;
    } else {
        lm_params_init_random(&tr->cfg, &tr->p, o->seed, 0.02);
        tr->st.rng_state = o->seed * 0x9E3779B97F4A7C15ULL + 0x5EEDULL;
    }
    return MOH_OK;
}

static void teardown(trainer *tr) {
    text_data_free(&tr->data);
    lm_params_free_f32(&tr->p);
    lm_params_free_f32(&tr->g);
    lm_acts_free_f32(&tr->acts);
    free(tr->m);
    free(tr->v);
    free(tr->decay);
    if (tr->metrics) fclose(tr->metrics);
}

static int validate(trainer *tr, long max_tokens, lm_eval_result *r, moh_error *err) {
    return lm_evaluate(&tr->cfg, &tr->p, &tr->acts, tr->B, tr->T, tr->data.val, tr->data.n_val,
                       max_tokens, NULL, r, err);
}

/* Wall time of this session, split into training and the rest (validation, checkpoints), with
 * what the rest cost so far: the inputs of the --max-minutes fit and the tokens/s figures. */
typedef struct run_clock {
    double t0, over_s;      /* session start (train_now_s); seconds in validation and checkpoints */
    double val_s;           /* seconds of the periodic validations, over val_preds predictions */
    long val_preds;
    double eval_s;          /* seconds of the periodic validations with their checkpoints */
    long evals;
    double save_s;          /* seconds of all checkpoints */
    long saves;
    double base_s;          /* training seconds before base_step (the session's first 3 steps, */
    long start_step, base_step; /* slower than the rest: left out of the step time once possible) */
} run_clock;

static double training_s(const run_clock *c, double now) { return now - c->t0 - c->over_s; }

/* The cost model of the rest of the run (train_util.h) from what this session measured. Not yet
 * measured: a validation prediction costs a third of a training token (forward only, no backward
 * or optimizer), a checkpoint 0 s; the first validations and saves replace these guesses. */
static train_cost_model cost_model(const trainer *tr, const run_clock *c, long step, double now) {
    const lm_train_options *o = tr->o;
    train_cost_model m = {0};
    const double train_s = training_s(c, now);
    if (step - c->base_step >= 3) m.step_s = (train_s - c->base_s) / (double)(step - c->base_step);
    else if (step > c->start_step) m.step_s = train_s / (double)(step - c->start_step);
    const double tokens_per_step = (double)tr->B * tr->T * o->grad_accum;
    const double pred_s = c->val_preds > 0 ? c->val_s / (double)c->val_preds : m.step_s / tokens_per_step / 3.0;
    const double save_s = c->saves > 0 ? c->save_s / (double)c->saves : 0.0;
    const double full = (double)text_eval_num_preds(tr->data.n_val, tr->T);
    double periodic = full; /* predictions of a periodic validation: whole batches up to eval_tokens */
    const double bt = (double)tr->B * tr->T;
    if (o->eval_tokens > 0 && ceil((double)o->eval_tokens / bt) * bt < full) periodic = ceil((double)o->eval_tokens / bt) * bt;
    m.eval_s = c->evals > 0 ? c->eval_s / (double)c->evals : periodic * pred_s + save_s;
    m.save_s = save_s;
    m.final_s = full * pred_s + save_s;
    m.eval_every = o->eval_every;
    m.save_every = o->save_every;
    return m;
}

int lm_train(const lm_train_options *o, moh_error *err) {
    trainer tr;
    memset(&tr, 0, sizeof tr);
    tr.o = o;
    int rc = setup(&tr, err);
    int *tok = NULL, *tgt = NULL;
    float *init = NULL;
    if (rc) goto out;
    /* The schedule length: --steps, or (resume) what the interrupted run had when it saved, or
     * fitted to --max-minutes. A resume of a time-fitted run thus keeps the saved length (the lr
     * curve goes on from where it stopped) and --max-minutes only caps that session. Checked before
     * --out is touched. */
    long total = o->steps;
    if (o->resume && tr.st.total_steps > 0 && total == 0) total = tr.st.total_steps;
    const bool auto_total = total <= 0;
    if (auto_total && o->max_minutes <= 0) {
        rc = moh_fail(err, MOH_E_ARG, "give --steps or --max-minutes");
        goto out;
    }
    if (o->resume && !auto_total && tr.st.step > total) {
        rc = moh_fail(err, MOH_E_ARG, "--steps is %ld, but the checkpoint in %s is already at step %ld (expected "
                      "--steps above it to train on)", total, o->out_dir, tr.st.step);
        goto out;
    }
    if (o->resume && !auto_total && tr.st.step == total) { /* nothing to train: touch nothing else */
        fs_remove_stale_tmp(o->out_dir); /* (train_metrics_open does it for a run that trains) */
        if (!o->quiet)
            printf("moh train: the checkpoint in %s is already at step %ld of its %ld-step run: nothing to train "
                   "(give a larger --steps to continue)\n", o->out_dir, tr.st.step, total);
        goto out;
    }
    if (!o->resume && (rc = train_check_fresh_out(o->out_dir, err))) goto out;
    if ((rc = fs_mkdir_p(o->out_dir, err))) goto out;
    if ((rc = train_metrics_open(o->out_dir, o->resume, tr.st.step, &tr.metrics, err))) goto out;
    tok = malloc(sizeof(int) * (size_t)tr.B * tr.T);
    tgt = malloc(sizeof(int) * (size_t)tr.B * tr.T);
    if (!tok || !tgt) {
        rc = moh_fail(err, MOH_E_NOMEM, "out of memory");
        goto out;
    }
    if (o->dump_grads && !(init = malloc(sizeof(float) * tr.p.n))) {
        rc = moh_fail(err, MOH_E_NOMEM, "out of memory");
        goto out;
    }
    if (init) memcpy(init, tr.p.data, sizeof(float) * tr.p.n);

    const adamw_config ac = {o->beta1, o->beta2, 1e-8, o->weight_decay};
    const long tokens_per_step = (long)tr.B * tr.T * o->grad_accum;
    long warmup = o->warmup >= 0 ? o->warmup : 100;
    if (!auto_total && o->warmup < 0 && warmup > total / 10) warmup = total / 10;
    if (o->resume && tr.st.warmup >= 0 && tr.st.total_steps > 0) warmup = tr.st.warmup;
    if (auto_total) total = 1L << 40; /* provisional, fitted after the first timed steps */
    tr.st.total_steps = auto_total ? 0 : total;
    tr.st.warmup = warmup;
    bool fitted = !auto_total;

    struct sigaction old_sa;
    train_sigint_install(&old_sa);

    const double elapsed0 = tr.st.elapsed_s, max_s = o->max_minutes * 60.0;
    run_clock clk = {.t0 = train_now_s(), .start_step = tr.st.step, .base_step = tr.st.step};
    const double t0 = clk.t0;
    const long start_step = tr.st.step;
    double last_log_train_s = 0.0, last_val_bpb = NAN;
    long last_log_step = start_step;
    int status = 0;
    if (!o->quiet)
        printf("moh train: %s, %zu parameters (%.2fM), router %s, %d/%d heads active per token, "
               "B=%d T=%d accum=%d, %s steps, %s attention, data %zu train / %zu val bytes\n",
               o->resume ? "resuming" : "starting", tr.p.n, tr.p.n / 1e6,
               tr.cfg.router == MOH_ROUTER_NONE ? "none (dense MHA)" : "learned",
               tr.cfg.router == MOH_ROUTER_NONE ? tr.cfg.num_attention_heads : tr.cfg.shared_heads + tr.cfg.top_k,
               tr.cfg.num_attention_heads, tr.B, tr.T, o->grad_accum,
               auto_total ? "time-fitted" : "fixed", o->reference_attention ? "reference" : "head-sparse",
               tr.data.n_train, tr.data.n_val);
    /* predictions of a whole-split validation (the moh eval metric) */
    const long whole_split_preds = text_eval_num_preds(tr.data.n_val, tr.T);
    while (tr.st.step < total) {
        const long step = tr.st.step;
        const double t_top = train_now_s();
        if (step - start_step == 3) { /* the first 3 steps are slower: the step time leaves them out */
            clk.base_s = training_s(&clk, t_top);
            clk.base_step = step;
        }
        if (auto_total && step - start_step >= 6) {
            /* --max-minutes without --steps: before every step, total = this step + the steps that
             * still fit in the budget at the measured training step time, with the periodic
             * validations and checkpoints still due and the final whole-split validation costed in
             * (never below step + 1). lr(step) is the cosine over the current total; a refit by d
             * steps moves it by at most ~1.6 d / (total - warmup) of the lr range, and a refit only
             * follows the drift of the measured times since the last step (the step time is a mean
             * over the session), so the curve stays close to one cosine and reaches its minimum at
             * the last step, as the budget ends. The first fit comes after 6 steps (3 timed
             * after the 3 slow first ones); the warmup (unless given) is min(100, total / 10) of that
             * fit, and then kept. Until then the lr ramps as with a warmup of 100 (or the given one). */
            const train_cost_model cm = cost_model(&tr, &clk, step, t_top);
            const long n = train_fit_steps(&cm, step, max_s - (t_top - t0));
            tr.st.total_steps = total = step + (n > 1 ? n : 1);
            if (!fitted) {
                fitted = true;
                if (o->warmup < 0) tr.st.warmup = warmup = total / 10 < 100 ? total / 10 : 100;
                if (!o->quiet)
                    printf("schedule fitted to %g min: %ld steps (%.3f s/step; refitted as training goes), "
                           "warmup %ld\n", o->max_minutes, total, cm.step_s, warmup);
            }
        }
        const double lr = lr_schedule(step, warmup, fitted ? total : 1L << 40, o->lr, o->lr * o->min_lr_ratio);
        memset(tr.g.data, 0, sizeof(float) * tr.g.n);
        double loss = 0.0, ce = 0.0, lb = 0.0;
        for (int micro = 0; micro < o->grad_accum; micro++) {
            if ((rc = text_batch(tr.data.train, tr.data.n_train, tr.B, tr.T, &tr.st.rng_state, tok, tgt, err)))
                goto stop;
            loss += lm_forward_f32(&tr.cfg, &tr.p, &tr.acts, tok, tgt, tr.B, tr.T);
            ce += tr.acts.ce_loss;
            lb += tr.acts.lb_loss;
            lm_backward_f32(&tr.cfg, &tr.p, &tr.g, &tr.acts, tok, tgt);
        }
        if (o->grad_accum > 1)
            for (size_t i = 0; i < tr.g.n; i++) tr.g.data[i] /= (float)o->grad_accum;
        loss /= o->grad_accum;
        ce /= o->grad_accum;
        lb /= o->grad_accum;
        if (!isfinite(loss)) {
            rc = moh_fail(err, MOH_E_ARG, "step %ld: loss is %g; lower --lr (now %g)", step + 1, loss, o->lr);
            goto stop;
        }
        if (init) {
            rc = dump_grads(&tr, tok, tgt, init, err);
            free(init);
            init = NULL;
            if (rc) goto stop;
        }
        const double gnorm = clip_grad_norm(tr.g.data, tr.g.n, o->grad_clip);
        adamw_step(&ac, tr.p.data, tr.g.data, tr.m, tr.v, tr.decay, tr.p.n, step + 1, lr);
        tr.st.step++;
        tr.st.tokens_seen += (double)tokens_per_step;
        double smin, smax;
        routed_share(&tr.cfg, &tr.acts, &smin, &smax);
        const double t = train_now_s(), run_s = t - t0, step_s = t - t_top, train_s = training_s(&clk, t);
        tr.st.elapsed_s = elapsed0 + run_s;
        const bool pause = o->stop_at_step > 0 && tr.st.step >= o->stop_at_step;
        /* out of time when one more step and the final validation no longer fit; during the
         * first 3 steps (too slow to predict from) only when the budget is spent */
        const train_cost_model cm = cost_model(&tr, &clk, tr.st.step, t);
        bool time_up = max_s > 0 && (run_s >= max_s || (tr.st.step - start_step >= 3 &&
                                                        train_fit_steps(&cm, tr.st.step, max_s - run_s) == 0));
        /* read once: a Ctrl-C after this point is handled at the next step, never without a save */
        const bool intr = train_interrupted();
        bool last = tr.st.step >= total || time_up || intr || pause;
        const bool do_eval = last || (o->eval_every > 0 && tr.st.step % o->eval_every == 0);
        lm_eval_result ev = {0};
        double val_s = 0.0;
        if (do_eval) {
            if ((rc = validate(&tr, last ? 0 : o->eval_tokens, &ev, err))) goto stop;
            val_s = train_now_s() - t;
            clk.over_s += val_s;
            if (!last) {
                clk.val_s += val_s;
                clk.val_preds += ev.tokens;
            }
            /* a periodic validation that used up the budget (one more step and the final
             * validation no longer fit) ends the run here: it is the final one when it covered
             * the whole split; otherwise the whole split is validated only if time is left */
            const double t2 = train_now_s();
            if (!last && max_s > 0 && (t2 - t0 >= max_s ||
                                       train_fit_steps(&cm, tr.st.step, max_s - (t2 - t0)) == 0)) {
                time_up = last = true;
                if (ev.tokens < whole_split_preds && t2 - t0 < max_s) {
                    free(ev.head_share);
                    if ((rc = validate(&tr, 0, &ev, err))) goto stop;
                    val_s = train_now_s() - t;
                    clk.over_s += train_now_s() - t2;
                } else if (ev.tokens < whole_split_preds && !o->quiet) {
                    printf("note: the time budget ran out in the validation at step %ld: it covered %ld of the "
                           "split's %ld predictions (moh eval gives the whole split)\n",
                           tr.st.step, ev.tokens, whole_split_preds);
                }
            }
            last_val_bpb = ev.bits_per_byte;
            free(ev.head_share);
        }
        fprintf(tr.metrics,
                "{\"step\": %ld, \"loss\": %.6f, \"ce\": %.6f, \"lb_loss\": %.6f, \"lr\": %.6g, "
                "\"grad_norm\": %.4f, \"tokens\": %.0f, \"elapsed_s\": %.2f, \"step_s\": %.4f, "
                "\"train_tok_s\": %.1f, \"routed_share_min\": %.4f, \"routed_share_max\": %.4f",
                tr.st.step, loss, ce, lb, lr, gnorm, tr.st.tokens_seen, tr.st.elapsed_s, step_s,
                (double)(tr.st.step - start_step) * tokens_per_step / train_s, smin, smax);
        if (fitted) fprintf(tr.metrics, ", \"total_steps\": %ld", total);
        if (do_eval)
            fprintf(tr.metrics, ", \"val_loss\": %.6f, \"val_bpb\": %.6f, \"val_tokens\": %ld, \"val_s\": %.3f",
                    ev.val_loss, ev.bits_per_byte, ev.tokens, val_s);
        fprintf(tr.metrics, "}\n");
        fflush(tr.metrics);
        if (!o->quiet && (tr.st.step % o->log_every == 0 || do_eval || tr.st.step == start_step + 1)) {
            /* training tokens per second since the last progress line, validation and checkpoints
             * excluded */
            const double rate = (double)(tr.st.step - last_log_step) * tokens_per_step / (train_s - last_log_train_s);
            double eta = fitted ? train_cost_of(&cm, tr.st.step, total - tr.st.step) : max_s - run_s;
            if (max_s > 0 && eta > max_s - run_s) eta = max_s - run_s;
            char el[32], et[32], share[64] = "";
            train_fmt_time(el, sizeof el, tr.st.elapsed_s);
            train_fmt_time(et, sizeof et, eta);
            if (tr.cfg.router != MOH_ROUTER_NONE)
                snprintf(share, sizeof share, " | head share %.2f-%.2f", smin, smax);
            char val[48] = "";
            if (do_eval) snprintf(val, sizeof val, " | val %.4f bpb", ev.bits_per_byte);
            char tot[24] = "?"; /* not known until the --max-minutes fit */
            if (fitted) snprintf(tot, sizeof tot, "%ld", total);
            printf("step %6ld/%-6s | loss %.4f | lb %.3f | lr %.2e | %6.0f tok/s | %s, ETA %s%s%s\n",
                   tr.st.step, tot, ce, lb, lr, rate, el, et, share, val);
            fflush(stdout);
            last_log_train_s = train_s;
            last_log_step = tr.st.step;
        }
        const bool do_save = last || do_eval || (o->save_every > 0 && tr.st.step % o->save_every == 0);
        if (do_save) {
            const double ts = train_now_s();
            if ((rc = save(&tr, err))) goto stop;
            const double sv = train_now_s() - ts;
            clk.over_s += sv;
            clk.save_s += sv;
            clk.saves++;
            if (do_eval && !last) {
                clk.eval_s += val_s + sv;
                clk.evals++;
            }
        }
        if (intr) {
            if (!o->quiet) printf("interrupted: checkpoint saved to %s at step %ld\n", o->out_dir, tr.st.step);
            status = 130;
            break;
        }
        if (pause && tr.st.step < total) {
            if (!o->quiet) printf("stopped at step %ld as asked; continue with --resume\n", tr.st.step);
            break;
        }
        if (time_up) {
            if (tr.st.step < total && !o->quiet) {
                if (fitted) printf("time budget of %g min reached at step %ld of %ld\n", o->max_minutes, tr.st.step, total);
                else printf("time budget of %g min reached at step %ld, before the schedule was fitted\n", o->max_minutes, tr.st.step);
            }
            break;
        }
    }
    if (!o->quiet && status == 0) {
        const double now = train_now_s();
        char wall[32], tr_s[32], ov[32];
        train_fmt_time(wall, sizeof wall, now - t0);
        train_fmt_time(tr_s, sizeof tr_s, training_s(&clk, now));
        train_fmt_time(ov, sizeof ov, clk.over_s);
        printf("done: %ld steps, %.0f tokens, final val %.4f bits/byte, checkpoint in %s (this session: %s "
               "wall = %s training + %s validation and checkpoints)\n",
               tr.st.step, tr.st.tokens_seen, last_val_bpb, o->out_dir, wall, tr_s, ov);
    }
    rc = status;
stop:
    train_sigint_restore(&old_sa);
out:
    free(tok);
    free(tgt);
    free(init);
    teardown(&tr);
    return rc;
}
