/* ViT checkpoint directories (layout in vit_checkpoint.h). */
#include "train/vit_checkpoint.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fsutil.h"

#define VIT_CKPT_FORMAT "moh-vit-train-v1"

static void join(char *out, size_t cap, const char *dir, const char *file) {
    snprintf(out, cap, "%s/%s", dir, file);
}

int vit_config_load(const char *path, moh_vit_config *cfg, moh_error *err) {
    size_t len = 0;
    char *text = fs_read_file(path, 1 << 20, &len, err);
    if (!text) return err ? err->code : MOH_E_IO;
    int rc = moh_vit_config_parse_json(cfg, text, len, path, err);
    free(text);
    return rc;
}

/* Entries for every model tensor, named prefix + name, with data from buf. */
static void make_entries(moh_st_entry *e, char (*names)[112], const vit_tensor *ts, int nt,
                         const char *prefix, const float *buf) {
    for (int i = 0; i < nt; i++) {
        snprintf(names[i], sizeof names[i], "%s%s", prefix, ts[i].name);
        e[i].name = names[i];
        e[i].ndim = ts[i].ndim;
        for (int d = 0; d < MOH_ST_MAX_DIMS; d++) e[i].shape[d] = d < ts[i].ndim ? ts[i].shape[d] : 0;
        e[i].data = buf + ts[i].offset;
    }
}

int vit_checkpoint_save(const char *dir, const moh_vit_config *cfg, const vit_params_f32 *p,
                        const float *m, const float *v, const vit_train_state *st, moh_error *err) {
    if (fs_mkdir_p(dir, err)) return err ? err->code : MOH_E_IO;
    int nt = 0;
    vit_tensor *ts = vit_tensors(cfg, &nt);
    moh_st_entry *e = calloc((size_t)nt * 3 + 1, sizeof *e);
    char (*names)[112] = calloc((size_t)nt * 3 + 1, sizeof *names);
    int rc = MOH_OK;
    char path[4200];
    if (!ts || !e || !names) {
        rc = moh_fail(err, MOH_E_NOMEM, "%s: out of memory while saving", dir);
        goto out;
    }
    if (m && v && st) {
        make_entries(e, names, ts, nt, "param.", p->data);
        make_entries(e + nt, names + nt, ts, nt, "m.", m);
        make_entries(e + 2 * nt, names + 2 * nt, ts, nt, "v.", v);
        char step[32], tot[32], wu[32], spe[32], bs[32], sh[32], seed[32], img[48], el[48];
        snprintf(step, sizeof step, "%ld", st->step);
        snprintf(tot, sizeof tot, "%ld", st->total_steps);
        snprintf(wu, sizeof wu, "%ld", st->warmup);
        snprintf(spe, sizeof spe, "%ld", st->steps_per_epoch);
        snprintf(bs, sizeof bs, "%d", st->batch_size);
        snprintf(sh, sizeof sh, "%d", st->shards);
        snprintf(seed, sizeof seed, "%" PRIu64, st->seed);
        snprintf(img, sizeof img, "%.17g", st->images_seen);
        snprintf(el, sizeof el, "%.17g", st->elapsed_s);
        const char *meta[] = {"format", VIT_CKPT_FORMAT, "step", step, "total_steps", tot,
                              "warmup", wu, "steps_per_epoch", spe, "batch_size", bs, "shards", sh, "seed", seed,
                              "images_seen", img, "elapsed_s", el};
        join(path, sizeof path, dir, "optimizer.safetensors");
        if ((rc = moh_st_write_meta(path, e, 3 * nt, meta, 10, err))) goto out;
    }
    {
        const char *meta[] = {"format", "pt"};
        make_entries(e, names, ts, nt, "", p->data);
        join(path, sizeof path, dir, "model.safetensors");
        if ((rc = moh_st_write_meta(path, e, nt, meta, 1, err))) goto out;
    }
    {
        char *json = moh_vit_config_to_json(cfg);
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

/* Reads every model tensor, named prefix + name, from st into buf. */
static int read_tensors(const moh_safetensors *st, const vit_tensor *ts, int nt, const char *prefix,
                        float *buf, moh_error *err) {
    char name[160];
    for (int i = 0; i < nt; i++) {
        snprintf(name, sizeof name, "%s%s", prefix, ts[i].name);
        int rc = moh_st_read_f32(st, name, ts[i].ndim, ts[i].shape, buf + ts[i].offset, err);
        if (rc) return rc;
    }
    return MOH_OK;
}

int vit_weights_load(const char *path, const moh_vit_config *cfg, vit_params_f32 *p, moh_error *err) {
    moh_safetensors st;
    if (moh_st_open(&st, path, err)) return err ? err->code : MOH_E_IO;
    int nt = 0, rc = MOH_OK;
    vit_tensor *ts = vit_tensors(cfg, &nt);
    if (!ts) rc = moh_fail(err, MOH_E_NOMEM, "%s: out of memory", path);
    if (!rc) rc = read_tensors(&st, ts, nt, "", p->data, err);
    for (int i = 0; !rc && i < st.n_tensors; i++) {
        bool known = false;
        for (int j = 0; j < nt && !known; j++) known = !strcmp(st.tensors[i].name, ts[j].name);
        if (!known)
            rc = moh_fail(err, MOH_E_SHAPE, "%s: unexpected tensor '%s' for config.json (router, "
                          "shared_heads, top_k, class_token and global_pool decide which tensors "
                          "exist)", path, st.tensors[i].name);
    }
    moh_st_close(&st);
    free(ts);
    return rc;
}

int vit_checkpoint_load(const char *dir, moh_vit_config *cfg, vit_params_f32 *p, moh_error *err) {
    memset(p, 0, sizeof *p);
    char path[4200];
    join(path, sizeof path, dir, "config.json");
    if (vit_config_load(path, cfg, err)) return err ? err->code : MOH_E_IO;
    int rc = vit_params_init_f32(p, cfg, err);
    if (rc) return rc;
    join(path, sizeof path, dir, "model.safetensors");
    if ((rc = vit_weights_load(path, cfg, p, err))) vit_params_free_f32(p);
    return rc;
}

static int meta_num(const moh_safetensors *st, const char *path, const char *key, double *out,
                    moh_error *err) {
    const char *s = moh_st_meta(st, key);
    char *end = NULL;
    if (s) *out = strtod(s, &end);
    if (!s || end == s || *end)
        return moh_fail(err, MOH_E_FORMAT, "%s: __metadata__ field '%s' is %s, expected a number",
                        path, key, s ? s : "missing");
    return MOH_OK;
}

int vit_checkpoint_load_optimizer(const char *dir, const moh_vit_config *cfg, float *params,
                                  float *m, float *v, size_t n, vit_train_state *state,
                                  moh_error *err) {
    char path[4200];
    join(path, sizeof path, dir, "optimizer.safetensors");
    moh_safetensors st;
    if (moh_st_open(&st, path, err)) return err ? err->code : MOH_E_IO;
    int nt = 0, rc = MOH_OK;
    vit_tensor *ts = vit_tensors(cfg, &nt);
    size_t total = 0;
    for (int i = 0; ts && i < nt; i++) total += ts[i].numel;
    const char *fmt = moh_st_meta(&st, "format");
    if (!ts) rc = moh_fail(err, MOH_E_NOMEM, "%s: out of memory", path);
    else if (total != n) rc = moh_fail(err, MOH_E_ARG, "%s: model has %zu values, buffer %zu", path, total, n);
    else if (!fmt || strcmp(fmt, VIT_CKPT_FORMAT))
        rc = moh_fail(err, MOH_E_FORMAT, "%s: __metadata__ field 'format' is %s, expected \"%s\"",
                      path, fmt ? fmt : "missing", VIT_CKPT_FORMAT);
    if (!rc) rc = read_tensors(&st, ts, nt, "param.", params, err);
    if (!rc) rc = read_tensors(&st, ts, nt, "m.", m, err);
    if (!rc) rc = read_tensors(&st, ts, nt, "v.", v, err);
    double step = 0, tot = 0, wu = 0, spe = 0, bs = 0, sh = 0, img = 0, el = 0;
    if (!rc) rc = meta_num(&st, path, "step", &step, err);
    if (!rc) rc = meta_num(&st, path, "total_steps", &tot, err);
    if (!rc) rc = meta_num(&st, path, "warmup", &wu, err);
    if (!rc) rc = meta_num(&st, path, "steps_per_epoch", &spe, err);
    if (!rc) rc = meta_num(&st, path, "batch_size", &bs, err);
    if (!rc) rc = meta_num(&st, path, "shards", &sh, err);
    if (!rc) rc = meta_num(&st, path, "images_seen", &img, err);
    if (!rc) rc = meta_num(&st, path, "elapsed_s", &el, err);
    if (!rc) {
        const char *s = moh_st_meta(&st, "seed");
        char *end = NULL;
        const unsigned long long u = s ? strtoull(s, &end, 10) : 0;
        if (!s || end == s || *end)
            rc = moh_fail(err, MOH_E_FORMAT, "%s: __metadata__ field 'seed' is %s, expected an integer",
                          path, s ? s : "missing");
        if (!rc && (step < 0 || tot < step || spe < 1 || bs < 1 || wu < 0 || sh < 1 || sh > 256 || sh > bs))
            rc = moh_fail(err, MOH_E_FORMAT, "%s: __metadata__ training state is inconsistent (step %g, "
                          "total_steps %g, steps_per_epoch %g, batch_size %g, shards %g, warmup %g), expected "
                          "0 <= step <= total_steps, steps_per_epoch >= 1, 1 <= shards <= min(256, batch_size)",
                          path, step, tot, spe, bs, sh, wu);
        state->seed = u;
        state->step = (long)step;
        state->total_steps = (long)tot;
        state->warmup = (long)wu;
        state->steps_per_epoch = (long)spe;
        state->batch_size = (int)bs;
        state->shards = (int)sh;
        state->images_seen = img;
        state->elapsed_s = el;
    }
    moh_st_close(&st);
    free(ts);
    return rc;
}
