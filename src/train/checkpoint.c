/* Checkpoint directories of every model family (layout in checkpoint.h). */
#include "train/checkpoint.h"

#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fsutil.h"
#include "io/gguf.h"
#include "text/bpe_gguf.h"
#include "io/manifest.h"
#include "train/train_util.h"

#define CKPT_FORMAT "moh-train-v2"
#define CKPT_FORMAT_LM_V1 "moh-lm-train-v1"   /* moh 0.1 LM: no hyperparameters */
#define CKPT_FORMAT_VIT_V1 "moh-vit-train-v1" /* moh 0.1 ViT */

#define ST(f) offsetof(train_state, f)
#define HP(f) (offsetof(train_state, hp) + offsetof(train_hparams, f))
/* The training state in optimizer.safetensors __metadata__ (all keys of moh-train-v2). */
static const train_key TRAIN_KEYS[] = {
    {"step", 'l', ST(step), 0, 1e15, NULL, 0},
    {"total_steps", 'l', ST(total_steps), 0, 1e15, "--steps", 'a'},
    {"warmup", 'l', ST(warmup), 0, 1e15, "--warmup", 'a'},
    {"skipped", 'l', ST(skipped), 0, 1e15, NULL, 0},
    {"steps_per_epoch", 'l', ST(steps_per_epoch), 0, 1e15, NULL, 0},
    {"data_rng", 'u', ST(data_rng), 0, 0, NULL, 0},
    {"examples_seen", 'd', ST(examples_seen), 0, 1e18, NULL, 0},
    {"elapsed_s", 'd', ST(elapsed_s), 0, 1e12, NULL, 0},
    {"data_crc", 'u', ST(data_crc), 0, 0, NULL, 0},
    {"lr", 'd', HP(lr), 1e-30, 1e3, "--lr", 'a'},
    {"min_lr_ratio", 'd', HP(min_lr_ratio), 0, 1, "--min-lr-ratio", 'a'},
    {"weight_decay", 'd', HP(weight_decay), 0, 1e3, "--weight-decay", 'a'},
    {"beta1", 'd', HP(beta1), 0, 0.999999999, "--beta1", 'a'},
    {"beta2", 'd', HP(beta2), 0, 0.999999999, "--beta2", 'a'},
    {"grad_clip", 'd', HP(grad_clip), 0, 1e30, "--grad-clip", 'a'},
    {"batch_size", 'i', HP(batch_size), 1, 65536, "--batch-size", 'r'},
    {"seq_len", 'i', HP(seq_len), 0, 1 << 30, "--seq-len", 'r'},
    {"grad_accum", 'i', HP(grad_accum), 1, 65536, "--grad-accum", 'r'},
    {"shards", 'i', HP(shards), 1, 256, "--shards", 'r'},
    {"seed", 'u', HP(seed), 0, 0, "--seed", 'r'},
    {"val_fraction", 'd', HP(val_fraction), 0, 1, "--val-fraction", 'r'},
    {"train_limit", 'l', HP(train_limit), 0, 1e15, "--train-limit", 'r'},
    {"crop_pad", 'i', HP(crop_pad), 0, 64, "--crop-pad", 'r'},
    {"hflip", 'i', HP(hflip), 0, 1, "--no-flip", 'r'},
    {"eval_every", 'l', HP(eval_every), 0, 1e15, "--eval-every", 'a'},
    {"eval_limit", 'l', HP(eval_limit), 0, 1e15, "--eval-limit", 'a'},
    {"attention", 'i', HP(attention), 1, 2, "--sparse-attn|--reference-attention", 'a'}, /* 1 sparse, 2 ref */
    {"ema_decay", 'd', HP(ema_decay), 0, 0.999999999, "--ema-decay", 'a'},
    {"optimizer", 'i', HP(optimizer), 0, 1, "--optimizer", 'r'}, /* 0 adamw, 1 muon */
    {"muon_lr", 'd', HP(muon_lr), 0, 1e3, "--muon-lr", 'a'}, /* 0: the same as lr */
    {"save_every", 'l', HP(save_every), 0, 1e15, "--save-every", 'a'},
    {"precision", 'i', HP(precision), 0, 1, "--precision", 'a'}, /* 0 fp32, 1 bf16 */
};
enum { NUM_KEYS = (int)(sizeof TRAIN_KEYS / sizeof TRAIN_KEYS[0]) };

const train_key *train_state_keys(int *n) {
    *n = NUM_KEYS;
    return TRAIN_KEYS;
}

int train_state_key_index(const char *key) {
    for (int i = 0; i < NUM_KEYS; i++)
        if (!strcmp(TRAIN_KEYS[i].key, key)) return i;
    return -1;
}

/* The 0.1 formats' names of v2 keys (the rest are the same or absent). */
static const char *v1_name(const char *format, const char *key) {
    if (!strcmp(format, CKPT_FORMAT_LM_V1)) {
        static const char *const lm[] = {"step", "total_steps", "warmup", "elapsed_s"};
        if (!strcmp(key, "data_rng")) return "rng_state";
        if (!strcmp(key, "examples_seen")) return "tokens_seen";
        for (size_t i = 0; i < sizeof lm / sizeof lm[0]; i++)
            if (!strcmp(key, lm[i])) return key;
        return NULL;
    }
    static const char *const vit[] = {"step", "total_steps", "warmup", "steps_per_epoch", "batch_size", "shards",
                                      "seed", "elapsed_s", "lr", "min_lr_ratio", "weight_decay", "beta1", "beta2",
                                      "grad_clip"};
    if (!strcmp(key, "examples_seen")) return "images_seen";
    for (size_t i = 0; i < sizeof vit / sizeof vit[0]; i++)
        if (!strcmp(key, vit[i])) return key;
    return NULL;
}

static void join(char *out, size_t cap, const char *dir, const char *file) { snprintf(out, cap, "%s/%s", dir, file); }

/* Entries for every tensor of the registry under prefix, with data from buf. */
static void make_entries(moh_st_entry *e, char (*names)[112], const model_tensor *ts, int nt, const char *prefix,
                         const float *buf) {
    for (int i = 0; i < nt; i++) {
        snprintf(names[i], sizeof names[i], "%s%s", prefix, ts[i].name);
        e[i] = (moh_st_entry){.name = names[i], .ndim = ts[i].ndim, .data = buf + ts[i].offset};
        for (int d = 0; d < ts[i].ndim; d++) e[i].shape[d] = ts[i].shape[d];
    }
}

static void format_key(const train_key *k, const train_state *st, char *out, size_t cap) {
    const char *p = (const char *)st + k->offset;
    switch (k->type) {
    case 'l': snprintf(out, cap, "%ld", *(const long *)p); break;
    case 'i': snprintf(out, cap, "%d", *(const int *)p); break;
    case 'u': snprintf(out, cap, "%" PRIu64, *(const uint64_t *)p); break;
    default: snprintf(out, cap, "%.17g", *(const double *)p); break;
    }
}

/* dir/name, or its staged name (manifest.h) for a save that commits through checkpoint.json. */
static void target(char *out, size_t cap, const char *dir, const char *name, bool staged) {
    if (staged) manifest_staged_path(out, cap, dir, name);
    else join(out, cap, dir, name);
}

static int write_tokenizer(const char *dir, const model *m, bool staged, moh_error *err) {
    if (!m->tokenizer) return MOH_OK;
    char path[4200], *json = NULL;
    size_t len = 0;
    int rc = bpe_to_tokenizer_json(m->tokenizer, &json, &len, err);
    if (!rc) {
        target(path, sizeof path, dir, "tokenizer.json", staged);
        rc = fs_write_atomic(path, json, len, err);
        free(json);
    }
    if (!rc && !(json = bpe_tokenizer_config_json(m->tokenizer, m->eos_id, m->chat_template)))
        rc = moh_fail(err, MOH_E_NOMEM, "%s: out of memory writing tokenizer_config.json", dir);
    if (!rc) {
        target(path, sizeof path, dir, "tokenizer_config.json", staged);
        rc = fs_write_atomic(path, json, strlen(json), err);
        free(json);
    }
    return rc;
}

int checkpoint_save_tokenizer(const char *dir, const model *m, moh_error *err) {
    return write_tokenizer(dir, m, false, err);
}

static int write_model(const char *dir, const model *m, const float *weights, long step, bool staged,
                       moh_error *err);

int checkpoint_save(const char *dir, const model *m, const float *m1, const float *m2, const train_state *st,
                    moh_error *err) {
    return checkpoint_save_ema(dir, m, m1, m2, NULL, st, err);
}

int checkpoint_save_ema(const char *dir, const model *m, const float *m1, const float *m2, const float *ema,
                        const train_state *st, moh_error *err) {
    if (fs_mkdir_p(dir, err)) return err ? err->code : MOH_E_IO;
    int nt = 0;
    model_tensor *ts = model_tensors(m, &nt);
    moh_st_entry *e = calloc((size_t)nt * 4 + 1, sizeof *e);
    char (*names)[112] = calloc((size_t)nt * 4 + 1, sizeof *names);
    const char *files[CKPT_MAX_FILES];
    int nf = 0, rc = MOH_OK;
    char path[4200];
    if (!ts || !e || !names) {
        rc = moh_fail(err, MOH_E_NOMEM, "%s: out of memory while saving", dir);
        goto out;
    }
    /* every file staged, then committed together by checkpoint.json (manifest.h) */
    if ((rc = write_tokenizer(dir, m, true, err))) goto out;
    if (m->tokenizer) {
        files[nf++] = "tokenizer.json";
        files[nf++] = "tokenizer_config.json";
    }
    {
        char *json = m->fam->config_to_json(m->cfg);
        if (!json) {
            rc = moh_fail(err, MOH_E_NOMEM, "%s: out of memory writing config.json", dir);
            goto out;
        }
        target(path, sizeof path, dir, "config.json", true);
        rc = fs_write_atomic(path, json, strlen(json), err);
        free(json);
        if (rc) goto out;
        files[nf++] = "config.json";
    }
    /* the EMA weights are the model's */
    if ((rc = write_model(dir, m, ema ? ema : m->data, st ? st->step : -1, true, err))) goto out;
    files[nf++] = "model.safetensors";
    if (m1 && m2 && st) {
        /* one self-contained file for --resume: weights, moments and training state together */
        make_entries(e, names, ts, nt, "param.", m->data);
        make_entries(e + nt, names + nt, ts, nt, "m.", m1);
        make_entries(e + 2 * nt, names + 2 * nt, ts, nt, "v.", m2);
        if (ema) make_entries(e + 3 * nt, names + 3 * nt, ts, nt, "ema.", ema);
        char vals[NUM_KEYS][48];
        const char *meta[2 * (NUM_KEYS + 3)];
        meta[0] = "format";
        meta[1] = CKPT_FORMAT;
        meta[2] = "model_type";
        meta[3] = m->fam->model_type;
        for (int i = 0; i < NUM_KEYS; i++) {
            format_key(&TRAIN_KEYS[i], st, vals[i], sizeof vals[i]);
            meta[2 * i + 4] = TRAIN_KEYS[i].key;
            meta[2 * i + 5] = vals[i];
        }
        int nm = NUM_KEYS + 2;
        if (st->data_path[0]) { /* where --resume finds the data without --data */
            meta[2 * nm] = "data";
            meta[2 * nm + 1] = st->data_path;
            nm++;
        }
        target(path, sizeof path, dir, "optimizer.safetensors", true);
        if ((rc = moh_st_write_meta(path, e, (ema ? 4 : 3) * nt, meta, nm, err))) goto out;
        files[nf++] = "optimizer.safetensors";
    }
    rc = manifest_commit(dir, files, nf, st ? st->step : -1, err);
out:
    if (rc) manifest_discard(dir);
    free(ts);
    free(e);
    free(names);
    return rc;
}

int checkpoint_check_model(const char *dir, const model *m, const float *expect, long step, ckpt_model_state *state,
                           long *model_step, moh_error *err) {
    static const char *const fix = "to resume from optimizer.safetensors, move it away: the next save writes it again";
    char path[4200], msg[sizeof err->msg];
    join(path, sizeof path, dir, "model.safetensors");
    *state = CKPT_MODEL_SAME;
    *model_step = -1;
    struct stat sb;
    if (lstat(path, &sb) != 0 && errno == ENOENT) {
        *state = CKPT_MODEL_MISSING;
        return MOH_OK;
    }
    model tmp = *m; /* the same family and config, its own buffer */
    if (!(tmp.data = malloc(sizeof(float) * (m->n ? m->n : 1))))
        return moh_fail(err, MOH_E_NOMEM, "%s: out of memory", path);
    moh_safetensors st;
    int rc = moh_st_open(&st, path, err) ? (err ? err->code : MOH_E_IO) : MOH_OK;
    if (!rc) {
        rc = model_weights_from(&tmp, &st, err);
        const char *sv = moh_st_meta(&st, "step");
        char *end = NULL;
        const long v = sv ? strtol(sv, &end, 10) : -1;
        if (sv && *sv && !*end && v >= 0) *model_step = v;
        moh_st_close(&st);
    }
    if (rc) { /* damaged: say how to go on without it */
        snprintf(msg, sizeof msg, "%s", err->msg);
        rc = moh_fail(err, rc, "%s (%s)", msg, fix);
    } else if (memcmp(tmp.data, expect, sizeof(float) * m->n)) {
        if (*model_step > step) { /* written by a save that ended before its optimizer.safetensors */
            *state = CKPT_MODEL_NEWER;
        } else {
            int nt = 0;
            model_tensor *ts = model_tensors(m, &nt);
            const char *name = "?";
            for (int i = 0; ts && i < nt && !strcmp(name, "?"); i++)
                if (memcmp(tmp.data + ts[i].offset, expect + ts[i].offset, sizeof(float) * ts[i].numel))
                    name = ts[i].name;
            char shown[200], at[48] = "no step recorded";
            if (*model_step >= 0) snprintf(at, sizeof at, "step %ld", *model_step);
            rc = moh_fail(err, MOH_E_FORMAT, "%s: tensor '%s' differs from the weights in optimizer.safetensors (%s "
                          "there, step %ld in optimizer.safetensors): one of the two files is damaged or from another "
                          "save; %s", path, moh_st_quote(shown, sizeof shown, name), at, step, fix);
            free(ts);
        }
    }
    free(tmp.data);
    return rc;
}

static int write_model(const char *dir, const model *m, const float *weights, long step, bool staged,
                       moh_error *err) {
    int nt = 0;
    model_tensor *ts = model_tensors(m, &nt);
    moh_st_entry *e = calloc((size_t)nt + 1, sizeof *e);
    char (*names)[112] = calloc((size_t)nt + 1, sizeof *names);
    int rc = MOH_OK;
    if (!ts || !e || !names) rc = moh_fail(err, MOH_E_NOMEM, "%s: out of memory while saving", dir);
    if (!rc) {
        char path[4200], sv[32];
        snprintf(sv, sizeof sv, "%ld", step);
        const char *meta[] = {"format", "pt", "step", sv};
        make_entries(e, names, ts, nt, "", weights);
        target(path, sizeof path, dir, "model.safetensors", staged);
        rc = moh_st_write_meta(path, e, nt, meta, step >= 0 ? 2 : 1, err);
    }
    free(ts);
    free(e);
    free(names);
    return rc;
}

int checkpoint_save_model(const char *dir, const model *m, const float *weights, long step, moh_error *err) {
    return write_model(dir, m, weights, step, false, err);
}

int checkpoint_load_optimizer(const char *dir, const model *m, float *params, float *m1, float *m2, train_state *st,
                              train_keys_present *present, moh_error *err) {
    return checkpoint_load_optimizer_ema(dir, m, params, m1, m2, NULL, NULL, st, present, err);
}

int checkpoint_load_optimizer_ema(const char *dir, const model *m, float *params, float *m1, float *m2, float *ema,
                                  bool *ema_found, train_state *st, train_keys_present *present, moh_error *err) {
    if (ema_found) *ema_found = false;
    char path[4200];
    join(path, sizeof path, dir, "optimizer.safetensors");
    moh_safetensors sf;
    if (moh_st_open(&sf, path, err)) return err ? err->code : MOH_E_IO;
    *present = 0;
    int nt = 0, rc = MOH_OK;
    model_tensor *ts = model_tensors(m, &nt);
    const char *fmt = moh_st_meta(&sf, "format"), *type = moh_st_meta(&sf, "model_type");
    const char *v1 = m->fam->legacy_optimizer_format;
    const bool is_lm = v1 && !strcmp(v1, CKPT_FORMAT_LM_V1);
    const bool old = fmt && v1 && !strcmp(fmt, v1);
    if (!ts) rc = moh_fail(err, MOH_E_NOMEM, "%s: out of memory", path);
    else if (!fmt || (!old && strcmp(fmt, CKPT_FORMAT)))
        rc = moh_fail(err, MOH_E_FORMAT, "%s: __metadata__ field 'format' is %s, expected \"%s\"%s%s%s", path,
                      fmt ? fmt : "missing", CKPT_FORMAT, v1 ? " (or moh 0.1's \"" : "", v1 ? v1 : "", v1 ? "\")" : "");
    else if (!old && (!type || strcmp(type, m->fam->model_type)))
        rc = moh_fail(err, MOH_E_FORMAT, "%s: __metadata__ field 'model_type' is %s, expected \"%s\" (as config.json)",
                      path, type ? type : "missing", m->fam->model_type);
    if (!rc) rc = model_read_tensors(&sf, ts, nt, "param.", params, err);
    if (!rc) rc = model_read_tensors(&sf, ts, nt, "m.", m1, err);
    if (!rc) rc = model_read_tensors(&sf, ts, nt, "v.", m2, err);
    char first_ema[120];
    snprintf(first_ema, sizeof first_ema, "ema.%s", ts ? ts[0].name : "");
    const bool has_ema = ts && moh_st_find(&sf, first_ema) != NULL;
    if (!rc && ema && has_ema) { /* all of them, or an error naming the missing one */
        rc = model_read_tensors(&sf, ts, nt, "ema.", ema, err);
        if (!rc && ema_found) *ema_found = true;
    }
    for (size_t i = 0; !rc && i < m->n; i++) /* second moments are averages of squares */
        if (m2[i] < 0.0f)
            rc = moh_fail(err, MOH_E_FORMAT, "%s: the second moments (v.*) hold %g at offset %zu, expected >= 0", path,
                          (double)m2[i], i);
    for (int i = 0; !rc && i < sf.n_tensors; i++) { /* param., m., v. of the registry and nothing else */
        const char *name = sf.tensors[i].name, *dot = strchr(name, '.');
        bool known = false;
        if (dot && (!strncmp(name, "param.", 6) || !strncmp(name, "m.", 2) || !strncmp(name, "v.", 2) ||
                    (ema && !strncmp(name, "ema.", 4))))
            for (int j = 0; j < nt && !known; j++) known = !strcmp(dot + 1, ts[j].name);
        char shown[200];
        if (!known)
            rc = moh_fail(err, MOH_E_SHAPE, "%s: unexpected tensor '%s' (expected param.*, m.* and v.* of the model's "
                          "tensors%s)", path, moh_st_quote(shown, sizeof shown, name), ema ? ", and ema.*" : "");
    }
    for (int i = 0; i < NUM_KEYS && !rc; i++) {
        const train_key *k = &TRAIN_KEYS[i];
        const char *name = old ? v1_name(fmt, k->key) : k->key;
        char *p = (char *)st + k->offset;
        if (k->offset == HP(optimizer) || k->offset == HP(muon_lr)) {
            /* a checkpoint from before Muon lacks both: it was trained by AdamW (muon_lr 0 = lr) */
            if (!name || !moh_st_meta(&sf, name)) {
                if (k->type == 'i') *(int *)p = 0;
                else *(double *)p = 0.0;
                *present |= (train_keys_present)1 << i;
                continue;
            }
        }
        if (!name) continue;
        /* keys added after moh-train-v2 first shipped: absent in its earlier files (then not present) */
        if (!moh_st_meta(&sf, name) && (k->offset == ST(data_crc) || k->offset == HP(save_every) ||
                                         k->offset == HP(precision)))
            continue;
        if (k->type == 'u') {
            const char *s = moh_st_meta(&sf, name);
            char *end = NULL;
            errno = 0;
            const unsigned long long u = s ? strtoull(s, &end, 10) : 0;
            if (!s || end == s || *end || *s < '0' || *s > '9' || errno == ERANGE)
                rc = moh_fail(err, MOH_E_FORMAT, "%s: __metadata__ field '%s' is %s, expected an unsigned integer", path,
                              name, s ? s : "missing");
            else *(uint64_t *)p = u;
        } else {
            double x = 0;
            rc = moh_st_meta_number(&sf, name, k->lo, k->hi, k->type != 'd', &x, err);
            if (!rc && k->type == 'l') *(long *)p = (long)x;
            else if (!rc && k->type == 'i') *(int *)p = (int)x;
            else if (!rc) *(double *)p = x;
        }
        if (!rc) *present |= (train_keys_present)1 << i;
    }
    const char *data = moh_st_meta(&sf, "data");
    st->data_path[0] = '\0';
    if (!rc && data && (!*data || strlen(data) >= sizeof st->data_path))
        rc = moh_fail(err, MOH_E_FORMAT, "%s: __metadata__ field 'data' is %s, expected a path of 1 to %zu bytes",
                      path, *data ? "too long" : "empty", sizeof st->data_path - 1);
    else if (!rc && data) snprintf(st->data_path, sizeof st->data_path, "%s", data);
    if (!rc && old && !is_lm) { /* moh-vit-train-v1 keeps the augmentation as "PAD FLIP" */
        const char *aug = moh_st_meta(&sf, "augment");
        int pad = 0, flip = 0, used = 0;
        if (!aug || sscanf(aug, "%d %d%n", &pad, &flip, &used) != 2 || aug[used] || pad < 0 || pad > 64 ||
            (flip != 0 && flip != 1))
            rc = moh_fail(err, MOH_E_FORMAT, "%s: __metadata__ field 'augment' is %s, expected \"PAD FLIP\" (PAD 0..64, "
                          "FLIP 0 or 1)", path, aug ? aug : "missing");
        st->hp.crop_pad = pad;
        st->hp.hflip = flip;
        st->hp.grad_accum = 1;
        *present |= (train_keys_present)1 << train_state_key_index("crop_pad");
        *present |= (train_keys_present)1 << train_state_key_index("hflip");
        *present |= (train_keys_present)1 << train_state_key_index("grad_accum");
    }
    if (!rc && st->hp.optimizer == 0 && st->hp.muon_lr != 0.0) /* AdamW leaves muon_lr 0 */
        rc = moh_fail(err, MOH_E_FORMAT, "%s: __metadata__ field 'muon_lr' is %.17g with optimizer 0 (AdamW), expected 0",
                      path, st->hp.muon_lr);
    const train_hparams *hp = &st->hp;
    const bool has_bs = *present >> train_state_key_index("batch_size") & 1;
    const bool has_sh = *present >> train_state_key_index("shards") & 1;
    if (!rc && (st->step > st->total_steps && st->total_steps > 0))
        rc = moh_fail(err, MOH_E_FORMAT, "%s: __metadata__ training state is inconsistent (step %ld, total_steps %ld), "
                      "expected step <= total_steps", path, st->step, st->total_steps);
    if (!rc && has_bs && has_sh && hp->shards > hp->batch_size)
        rc = moh_fail(err, MOH_E_FORMAT, "%s: __metadata__ training state is inconsistent (shards %d, batch_size %d), "
                      "expected 1 <= shards <= batch_size", path, hp->shards, hp->batch_size);
    moh_st_close(&sf);
    free(ts);
    return rc;
}
