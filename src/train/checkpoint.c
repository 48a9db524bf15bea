/* LM checkpoint directories (layout in checkpoint.h). */
#include "train/checkpoint.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fsutil.h"
#include "train/train_util.h"

#define CKPT_FORMAT "moh-lm-train-v1"

static void join(char *out, size_t cap, const char *dir, const char *file) {
    snprintf(out, cap, "%s/%s", dir, file);
}

/* Entries for every tensor of the model under prefix, with data from buf. names: storage. */
static int make_entries(moh_st_entry *e, char (*names)[112], const lm_tensor *ts, int nt,
                        const char *prefix, const float *buf) {
    for (int i = 0; i < nt; i++) {
        snprintf(names[i], sizeof names[i], "%s%s", prefix, ts[i].name);
        e[i] = (moh_st_entry){names[i], ts[i].ndim, {ts[i].shape[0], ts[i].shape[1]}, buf + ts[i].offset};
    }
    return nt;
}

int lm_checkpoint_save(const char *dir, const moh_lm_config *cfg, const lm_params_f32 *p,
                       const float *m, const float *v, const lm_train_state *st, moh_error *err) {
    if (fs_mkdir_p(dir, err)) return err->code;
    int nt = 0;
    lm_tensor *ts = lm_tensors(cfg, &nt);
    moh_st_entry *e = calloc((size_t)nt * 3 + 1, sizeof *e);
    char (*names)[112] = calloc((size_t)nt * 3 + 1, sizeof *names);
    int rc = MOH_OK;
    char path[4200];
    if (!ts || !e || !names) {
        rc = moh_fail(err, MOH_E_NOMEM, "%s: out of memory while saving", dir);
        goto out;
    }
    if (m && v) {
        /* One self-contained file for --resume: weights, moments and training state together,
         * so a crash between two file renames can never pair weights with foreign moments. */
        int n = make_entries(e, names, ts, nt, "param.", p->data);
        n += make_entries(e + n, names + n, ts, nt, "m.", m);
        n += make_entries(e + n, names + n, ts, nt, "v.", v);
        char step[32], rng[32], tok[48], el[48], tot[32], wu[32];
        snprintf(tot, sizeof tot, "%ld", st->total_steps);
        snprintf(wu, sizeof wu, "%ld", st->warmup);
        snprintf(step, sizeof step, "%ld", st->step);
        snprintf(rng, sizeof rng, "%" PRIu64, st->rng_state);
        snprintf(tok, sizeof tok, "%.17g", st->tokens_seen);
        snprintf(el, sizeof el, "%.17g", st->elapsed_s);
        const char *meta[] = {"format", CKPT_FORMAT, "step", step, "rng_state", rng,
                              "tokens_seen", tok, "elapsed_s", el, "total_steps", tot,
                              "warmup", wu};
        join(path, sizeof path, dir, "optimizer.safetensors");
        if ((rc = moh_st_write_meta(path, e, n, meta, 7, err))) goto out;
    }
    {
        const char *meta[] = {"format", "pt"};
        int n = make_entries(e, names, ts, nt, "", p->data);
        join(path, sizeof path, dir, "model.safetensors");
        if ((rc = moh_st_write_meta(path, e, n, meta, 1, err))) goto out;
    }
    {
        char *json = moh_lm_config_to_json(cfg);
        if (!json) {
            rc = moh_fail(err, MOH_E_NOMEM, "%s: out of memory writing config.json", dir);
            goto out;
        }
        join(path, sizeof path, dir, "config.json");
        rc = fs_write_atomic(path, json, strlen(json), err);
        free(json);
    }
out:
    free(ts);
    free(e);
    free(names);
    return rc;
}

int lm_check_byte_vocab(const moh_lm_config *cfg, const char *label, moh_error *err) {
    if (cfg->vocab_size < 256)
        return moh_fail(err, MOH_E_CONFIG, "%s: field 'vocab_size' is %d, expected >= 256 (moh's text data "
                        "is bytes, token ids 0..255)", label, cfg->vocab_size);
    return MOH_OK;
}

static int read_config(const char *dir, moh_lm_config *cfg, moh_error *err) {
    char path[4200];
    join(path, sizeof path, dir, "config.json");
    size_t len = 0;
    char *text = fs_read_file(path, 1 << 20, &len, err);
    if (!text) return err->code;
    int rc = moh_lm_config_parse_json(cfg, text, len, path, err);
    free(text);
    if (!rc) rc = lm_check_byte_vocab(cfg, path, err);
    return rc;
}

/* Reads every model tensor, named prefix + name, from file into buf. */
static int read_tensors(const moh_safetensors *st, const lm_tensor *ts, int nt, const char *prefix,
                        float *buf, moh_error *err) {
    char name[160];
    for (int i = 0; i < nt; i++) {
        snprintf(name, sizeof name, "%s%s", prefix, ts[i].name);
        int rc = moh_st_read_f32(st, name, ts[i].ndim, ts[i].shape, buf + ts[i].offset, err);
        if (!rc) rc = train_check_finite(st->path, name, buf + ts[i].offset, ts[i].numel, err);
        if (rc) return rc;
    }
    return MOH_OK;
}

int lm_checkpoint_load(const char *dir, moh_lm_config *cfg, lm_params_f32 *p, moh_error *err) {
    memset(p, 0, sizeof *p);
    if (read_config(dir, cfg, err)) return err->code;
    char path[4200];
    join(path, sizeof path, dir, "model.safetensors");
    moh_safetensors st;
    if (moh_st_open(&st, path, err)) return err->code;
    int nt = 0, rc = MOH_OK;
    lm_tensor *ts = lm_tensors(cfg, &nt);
    if (!ts) rc = moh_fail(err, MOH_E_NOMEM, "%s: out of memory", path);
    if (!rc) rc = lm_params_init_f32(p, cfg, err);
    if (!rc) rc = read_tensors(&st, ts, nt, "", p->data, err);
    /* a tied checkpoint may still carry lm_head.weight (HF writes it for tied models): ignore it */
    for (int i = 0; !rc && i < st.n_tensors; i++) {
        bool known = cfg->tie_word_embeddings && !strcmp(st.tensors[i].name, "lm_head.weight");
        for (int j = 0; j < nt && !known; j++) known = !strcmp(st.tensors[i].name, ts[j].name);
        char shown[200];
        if (!known)
            rc = moh_fail(err, MOH_E_SHAPE, "%s: unexpected tensor '%s' for config.json (router, "
                          "shared_heads, top_k, tie_word_embeddings decide which tensors exist)",
                          path, moh_st_quote(shown, sizeof shown, st.tensors[i].name));
    }
    moh_st_close(&st);
    free(ts);
    if (rc) lm_params_free_f32(p);
    return rc;
}

int lm_checkpoint_load_optimizer(const char *dir, const moh_lm_config *cfg, float *params,
                                 float *m, float *v, size_t n, lm_train_state *state,
                                 moh_error *err) {
    char path[4200];
    join(path, sizeof path, dir, "optimizer.safetensors");
    moh_safetensors st;
    if (moh_st_open(&st, path, err)) return err->code;
    int nt = 0, rc = MOH_OK;
    lm_tensor *ts = lm_tensors(cfg, &nt);
    size_t total = 0;
    for (int i = 0; ts && i < nt; i++) total += ts[i].numel;
    const char *fmt = moh_st_meta(&st, "format");
    if (!ts) rc = moh_fail(err, MOH_E_NOMEM, "%s: out of memory", path);
    else if (total != n) rc = moh_fail(err, MOH_E_ARG, "%s: model has %zu values, buffer %zu", path, total, n);
    else if (!fmt || strcmp(fmt, CKPT_FORMAT))
        rc = moh_fail(err, MOH_E_FORMAT, "%s: __metadata__ field 'format' is %s, expected \"%s\"",
                      path, fmt ? fmt : "missing", CKPT_FORMAT);
    if (!rc) rc = read_tensors(&st, ts, nt, "param.", params, err);
    if (!rc) rc = read_tensors(&st, ts, nt, "m.", m, err);
    if (!rc) rc = read_tensors(&st, ts, nt, "v.", v, err);
    double step = 0, tok = 0, el = 0, tot = 0, wu = 0;
    if (!rc) rc = moh_st_meta_number(&st, "step", 0, 1e15, true, &step, err);
    if (!rc) rc = moh_st_meta_number(&st, "total_steps", 0, 1e15, true, &tot, err);
    if (!rc) rc = moh_st_meta_number(&st, "warmup", 0, 1e15, true, &wu, err);
    if (!rc) rc = moh_st_meta_number(&st, "tokens_seen", 0, 1e18, false, &tok, err);
    if (!rc) rc = moh_st_meta_number(&st, "elapsed_s", 0, 1e12, false, &el, err);
    if (!rc) {
        const char *r = moh_st_meta(&st, "rng_state");
        char *end = NULL;
        unsigned long long u = r ? strtoull(r, &end, 10) : 0;
        if (!r || end == r || *end)
            rc = moh_fail(err, MOH_E_FORMAT, "%s: __metadata__ field 'rng_state' is %s, expected an integer",
                          path, r ? r : "missing");
        state->rng_state = u;
        state->step = (long)step;
        state->tokens_seen = tok;
        state->elapsed_s = el;
        state->total_steps = (long)tot;
        state->warmup = (long)wu;
    }
    moh_st_close(&st);
    free(ts);
    return rc;
}
