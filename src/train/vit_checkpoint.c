/* ViT checkpoint directories (layout in vit_checkpoint.h). */
#include "train/vit_checkpoint.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fsutil.h"
#include "train/train_util.h"

#define VIT_CKPT_FORMAT "moh-vit-train-v1"

/* __metadata__ keys of optimizer.safetensors besides "format", in this order. */
enum { NUM_META = 16 };
static const char *const META_KEYS[NUM_META] = {
    "step", "total_steps", "warmup", "steps_per_epoch", "batch_size", "shards", "seed",
    "images_seen", "elapsed_s", "lr", "min_lr_ratio", "weight_decay", "beta1", "beta2",
    "grad_clip", "augment"};
/* Accepted values of the numeric keys on load: {lo, hi, integer}. */
static const double META_RANGE[NUM_META][3] = {
    {0, 1e15, 1}, {0, 1e15, 1}, {0, 1e15, 1}, {1, 1e15, 1}, {1, 1 << 30, 1}, {1, 256, 1}, {0, 0, 0},
    {0, 1e18, 0}, {0, 1e12, 0}, {1e-30, 1e3, 0}, {0, 1, 0}, {0, 1e3, 0}, {0, 1, 0}, {0, 1, 0},
    {0, 1e30, 0}, {0, 0, 0}};

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
        char v_[NUM_META][48];
        snprintf(v_[0], 48, "%ld", st->step);
        snprintf(v_[1], 48, "%ld", st->total_steps);
        snprintf(v_[2], 48, "%ld", st->warmup);
        snprintf(v_[3], 48, "%ld", st->steps_per_epoch);
        snprintf(v_[4], 48, "%d", st->batch_size);
        snprintf(v_[5], 48, "%d", st->shards);
        snprintf(v_[6], 48, "%" PRIu64, st->seed);
        snprintf(v_[7], 48, "%.17g", st->images_seen);
        snprintf(v_[8], 48, "%.17g", st->elapsed_s);
        snprintf(v_[9], 48, "%.17g", st->lr);
        snprintf(v_[10], 48, "%.17g", st->min_lr_ratio);
        snprintf(v_[11], 48, "%.17g", st->weight_decay);
        snprintf(v_[12], 48, "%.17g", st->beta1);
        snprintf(v_[13], 48, "%.17g", st->beta2);
        snprintf(v_[14], 48, "%.17g", st->grad_clip);
        snprintf(v_[15], 48, "%d %d", st->crop_pad, st->hflip);
        const char *meta[2 * (NUM_META + 1)];
        meta[0] = "format";
        meta[1] = VIT_CKPT_FORMAT;
        for (int i = 0; i < NUM_META; i++) {
            meta[2 * i + 2] = META_KEYS[i];
            meta[2 * i + 3] = v_[i];
        }
        join(path, sizeof path, dir, "optimizer.safetensors");
        if ((rc = moh_st_write_meta(path, e, 3 * nt, meta, NUM_META + 1, err))) goto out;
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
        if (!rc) rc = train_check_finite(st->path, name, buf + ts[i].offset, ts[i].numel, err);
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
        char shown[200];
        if (!known)
            rc = moh_fail(err, MOH_E_SHAPE, "%s: unexpected tensor '%s' for config.json (router, "
                          "shared_heads, top_k, class_token and global_pool decide which tensors "
                          "exist)", path, moh_st_quote(shown, sizeof shown, st.tensors[i].name));
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
    double num[NUM_META] = {0};
    for (int i = 0; i < NUM_META && !rc; i++) {
        if (i == 6 || i == 15) continue; /* seed, augment: parsed below */
        rc = moh_st_meta_number(&st, META_KEYS[i], META_RANGE[i][0], META_RANGE[i][1], META_RANGE[i][2] != 0,
                                &num[i], err);
    }
    const char *seed = moh_st_meta(&st, "seed"), *aug = moh_st_meta(&st, "augment");
    char *end = NULL;
    unsigned long long u = 0;
    int pad = 0, flip = 0, used = 0;
    if (!rc) {
        u = seed ? strtoull(seed, &end, 10) : 0;
        if (!seed || end == seed || *end)
            rc = moh_fail(err, MOH_E_FORMAT, "%s: __metadata__ field 'seed' is %s, expected an integer",
                          path, seed ? seed : "missing");
    }
    if (!rc && (!aug || sscanf(aug, "%d %d%n", &pad, &flip, &used) != 2 || aug[used] || pad < 0 ||
                pad > 64 || (flip != 0 && flip != 1)))
        rc = moh_fail(err, MOH_E_FORMAT, "%s: __metadata__ field 'augment' is %s, expected \"PAD FLIP\" "
                      "(PAD 0..64, FLIP 0 or 1)", path, aug ? aug : "missing");
    const double step = num[0], tot = num[1], wu = num[2], spe = num[3], bs = num[4], sh = num[5];
    if (!rc && (step < 0 || tot < step || spe < 1 || bs < 1 || wu < 0 || sh < 1 || sh > 256 || sh > bs ||
                !(num[9] > 0) || num[12] < 0 || num[12] >= 1 || num[13] < 0 || num[13] >= 1))
        rc = moh_fail(err, MOH_E_FORMAT, "%s: __metadata__ training state is inconsistent (step %g, "
                      "total_steps %g, steps_per_epoch %g, batch_size %g, shards %g, warmup %g, lr %g, "
                      "beta1 %g, beta2 %g), expected 0 <= step <= total_steps, steps_per_epoch >= 1, "
                      "1 <= shards <= min(256, batch_size), lr > 0, betas in [0, 1)",
                      path, step, tot, spe, bs, sh, wu, num[9], num[12], num[13]);
    if (!rc) {
        state->step = (long)step;
        state->total_steps = (long)tot;
        state->warmup = (long)wu;
        state->steps_per_epoch = (long)spe;
        state->batch_size = (int)bs;
        state->shards = (int)sh;
        state->seed = u;
        state->images_seen = num[7];
        state->elapsed_s = num[8];
        state->lr = num[9];
        state->min_lr_ratio = num[10];
        state->weight_decay = num[11];
        state->beta1 = num[12];
        state->beta2 = num[13];
        state->grad_clip = num[14];
        state->crop_pad = pad;
        state->hflip = flip;
    }
    moh_st_close(&st);
    free(ts);
    return rc;
}
