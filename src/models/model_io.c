/* Loading a model for inference or as a run's start (model.h): a checkpoint folder (config.json,
 * model.safetensors or Hugging Face shards, tokenizer files; checked against checkpoint.json), a
 * model.safetensors file, or a GGUF file. The training state (optimizer.safetensors) is
 * train/checkpoint.c's. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "core/fsutil.h"
#include "io/gguf.h"
#include "ops/quant.h"
#include "io/manifest.h"
#include "models/model.h"
#include "text/bpe.h"
#include "text/bpe_gguf.h"

static void join(char *out, size_t cap, const char *dir, const char *file) { snprintf(out, cap, "%s/%s", dir, file); }

int model_load_tokenizer(model *m, const char *dir, moh_error *err) {
    char path[4200];
    struct stat sb;
    join(path, sizeof path, dir, "tokenizer.json");
    if (stat(path, &sb) != 0) return MOH_OK; /* a byte model */
    bpe_free(m->tokenizer);
    free(m->chat_template);
    m->tokenizer = NULL;
    m->chat_template = NULL;
    m->eos_id = -1;
    int rc = bpe_load_tokenizer_json(&m->tokenizer, path, err);
    const int V = !rc && m->fam && m->fam->num_outputs ? m->fam->num_outputs(m->cfg) : 0;
    if (!rc && m->fam && bpe_n_tokens(m->tokenizer) > V) /* HF pads embeddings beyond the vocabulary, never less */
        rc = moh_fail(err, MOH_E_SHAPE, "%s: %d tokens, expected at most %d (the model's vocab_size)", path,
                      bpe_n_tokens(m->tokenizer), V);
    join(path, sizeof path, dir, "tokenizer_config.json");
    if (!rc && stat(path, &sb) == 0) {
        size_t len = 0;
        char *text = fs_read_file(path, (size_t)16 << 20, &len, err);
        if (!text) rc = err ? err->code : MOH_E_IO;
        else rc = bpe_read_tokenizer_config(m->tokenizer, text, len, path, &m->eos_id, &m->chat_template, err);
        free(text);
    }
    if (rc) {
        bpe_free(m->tokenizer);
        m->tokenizer = NULL;
        m->eos_id = -1;
    }
    return rc;
}

int model_read_tensors(const moh_safetensors *st, const model_tensor *ts, int nt, const char *prefix, float *buf,
                        moh_error *err) {
    char name[160];
    for (int i = 0; i < nt; i++) {
        snprintf(name, sizeof name, "%s%s", prefix, ts[i].name);
        int rc = moh_st_read_f32(st, name, ts[i].ndim, ts[i].shape, buf + ts[i].offset, err);
        if (!rc) rc = model_check_finite(st->path, name, buf + ts[i].offset, ts[i].numel, err);
        if (rc) return rc;
    }
    return MOH_OK;
}

/* An extra tensor `name` of st that the family ties to a registry tensor (model_family.tied_tensor):
 * it must hold that tensor's values in m->data (HF ignores it and ties the two; a different one
 * would be a silent change of the model). MOH_OK, or MOH_E_SHAPE / MOH_E_FORMAT naming both. */
static int check_tied(const model *m, const moh_safetensors *st, const model_tensor *ts, int nt, const char *name,
                      const char *twin, moh_error *err) {
    const model_tensor *t = NULL;
    for (int j = 0; j < nt && !t; j++)
        if (!strcmp(ts[j].name, twin)) t = &ts[j];
    if (!t) return moh_fail(err, MOH_E_SHAPE, "%s: tensor '%s' ties to '%s', which the model lacks", st->path, name, twin);
    float *buf = malloc(sizeof(float) * (t->numel ? t->numel : 1));
    if (!buf) return moh_fail(err, MOH_E_NOMEM, "%s: out of memory", st->path);
    int rc = moh_st_read_f32(st, name, t->ndim, t->shape, buf, err);
    if (!rc && memcmp(buf, m->data + t->offset, sizeof(float) * t->numel))
        rc = moh_fail(err, MOH_E_FORMAT, "%s: tensor '%s' differs from '%s', but config.json ties them "
                      "(tie_word_embeddings true): expected no '%s', or the same values (or set tie_word_embeddings "
                      "false)", st->path, name, twin, name);
    free(buf);
    return rc;
}

int model_weights_from(model *m, const moh_safetensors *st, moh_error *err) {
    int nt = 0, rc = MOH_OK;
    model_tensor *ts = model_tensors(m, &nt);
    if (!ts) rc = moh_fail(err, MOH_E_NOMEM, "%s: out of memory", st->path);
    if (!rc) rc = model_read_tensors(st, ts, nt, "", m->data, err);
    for (int i = 0; !rc && i < st->n_tensors; i++) {
        bool known = false;
        for (int j = 0; j < nt && !known; j++) known = !strcmp(st->tensors[i].name, ts[j].name);
        const char *twin = !known && m->fam->tied_tensor ? m->fam->tied_tensor(m->cfg, st->tensors[i].name) : NULL;
        if (twin) {
            rc = check_tied(m, st, ts, nt, st->tensors[i].name, twin, err);
            continue;
        }
        char shown[200];
        if (!known)
            rc = moh_fail(err, MOH_E_SHAPE, "%s: unexpected tensor '%s' for config.json (its router, shared_heads, "
                          "top_k and layout fields decide which tensors exist)", st->path,
                          moh_st_quote(shown, sizeof shown, st->tensors[i].name));
    }
    free(ts);
    return rc;
}

int model_load_weights(model *m, const char *path, moh_error *err) {
    moh_safetensors st;
    if (moh_st_open(&st, path, err)) return err ? err->code : MOH_E_IO;
    const int rc = model_weights_from(m, &st, err);
    moh_st_close(&st);
    return rc;
}

/* The weights of a Hugging Face sharded checkpoint: dir/model.safetensors.index.json maps every
 * tensor name to a shard file in dir ({"weight_map": {name: "model-0000k-of-0000n.safetensors"}},
 * transformers' modeling_utils.load_sharded_checkpoint); each shard is read once. */
static int load_sharded(model *m, const char *dir, const char *index, moh_error *err) {
    size_t len = 0;
    char *text = fs_read_file(index, (size_t)64 << 20, &len, err);
    if (!text) return err ? err->code : MOH_E_IO;
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    const cJSON *map = root ? cJSON_GetObjectItemCaseSensitive(root, "weight_map") : NULL;
    int rc = MOH_OK, nt = 0;
    if (!cJSON_IsObject(map)) {
        cJSON_Delete(root);
        return moh_fail(err, MOH_E_FORMAT, "%s: %s, expected a JSON object with a \"weight_map\" object", index,
                        root ? "no \"weight_map\" object" : "not JSON");
    }
    model_tensor *ts = model_tensors(m, &nt);
    const int nmap = cJSON_GetArraySize(map);
    moh_safetensors *shards = calloc((size_t)(nmap > 0 ? nmap : 1), sizeof *shards);
    char (*names)[256] = calloc((size_t)(nmap > 0 ? nmap : 1), sizeof *names);
    int nshards = 0;
    char shown[200], path[4400];
    if (!ts || !shards || !names) rc = moh_fail(err, MOH_E_NOMEM, "%s: out of memory", index);
    for (const cJSON *e = map->child; !rc && e; e = e->next) /* one entry per tensor (JSON readers differ on repeats) */
        for (const cJSON *f = e->next; !rc && f; f = f->next)
            if (!strcmp(e->string, f->string))
                rc = moh_fail(err, MOH_E_FORMAT, "%s: weight_map names '%s' twice, expected each tensor once", index,
                              moh_st_quote(shown, sizeof shown, e->string));
    for (const cJSON *e = map->child; !rc && e; e = e->next) { /* every entry names a registry tensor */
        bool known = m->fam->tied_tensor && m->fam->tied_tensor(m->cfg, e->string); /* (checked below) */
        for (int j = 0; j < nt && !known; j++) known = !strcmp(e->string, ts[j].name);
        if (!known)
            rc = moh_fail(err, MOH_E_SHAPE, "%s: unexpected tensor '%s' for config.json", index,
                          moh_st_quote(shown, sizeof shown, e->string));
        else if (!cJSON_IsString(e) || !*e->valuestring || strchr(e->valuestring, '/') ||
                 !strcmp(e->valuestring, "..") || strlen(e->valuestring) >= sizeof names[0])
            rc = moh_fail(err, MOH_E_FORMAT, "%s: weight_map entry '%s' is not a shard file name in the folder", index,
                          moh_st_quote(shown, sizeof shown, e->string));
    }
    for (int i = 0; !rc && i < nt; i++) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(map, ts[i].name);
        if (!f) {
            rc = moh_fail(err, MOH_E_SHAPE, "%s: tensor '%s' is not in the weight_map", index, ts[i].name);
            break;
        }
        int k = 0;
        while (k < nshards && strcmp(names[k], f->valuestring)) k++;
        if (k == nshards) { /* a shard not opened yet */
            snprintf(names[k], sizeof names[k], "%s", f->valuestring);
            join(path, sizeof path, dir, f->valuestring);
            if ((rc = moh_st_open(&shards[k], path, err))) break;
            nshards++;
        }
        rc = moh_st_read_f32(&shards[k], ts[i].name, ts[i].ndim, ts[i].shape, m->data + ts[i].offset, err);
        if (!rc) rc = model_check_finite(shards[k].path, ts[i].name, m->data + ts[i].offset, ts[i].numel, err);
    }
    for (const cJSON *e = map->child; !rc && e; e = e->next) { /* tied duplicates hold their twin's values */
        bool reg = false;
        for (int j = 0; j < nt && !reg; j++) reg = !strcmp(e->string, ts[j].name);
        const char *twin = !reg && m->fam->tied_tensor ? m->fam->tied_tensor(m->cfg, e->string) : NULL;
        if (!twin) continue;
        int k = 0;
        while (k < nshards && strcmp(names[k], e->valuestring)) k++;
        if (k == nshards) {
            snprintf(names[k], sizeof names[k], "%s", e->valuestring);
            join(path, sizeof path, dir, e->valuestring);
            if ((rc = moh_st_open(&shards[k], path, err))) break;
            nshards++;
        }
        rc = check_tied(m, &shards[k], ts, nt, e->string, twin, err);
    }
    for (int k = 0; k < nshards; k++) moh_st_close(&shards[k]);
    free(shards);
    free(names);
    free(ts);
    cJSON_Delete(root);
    return rc;
}

int model_load(model *m, const char *dir, moh_error *err) {
    char path[4200];
    bool found = false;
    int rc = manifest_check(dir, false, &found, NULL, NULL, err); /* one save's files, never a mix */
    if (rc) {
        memset(m, 0, sizeof *m);
        return rc;
    }
    join(path, sizeof path, dir, "config.json");
    rc = model_from_config_file(m, path, err);
    if (rc) return rc;
    join(path, sizeof path, dir, "model.safetensors");
    struct stat sb;
    char index[4200];
    join(index, sizeof index, dir, "model.safetensors.index.json");
    if (stat(path, &sb) != 0 && stat(index, &sb) == 0) rc = load_sharded(m, dir, index, err); /* HF shards */
    else rc = model_load_weights(m, path, err);
    if (!rc) rc = model_load_tokenizer(m, dir, err);
    if (rc) model_free(m);
    return rc;
}

int model_open(model *m, const char *path, moh_error *err) { return model_open_ex(m, path, 0, err); }

int model_open_ex(model *m, const char *path, unsigned flags, moh_error *err) {
    memset(m, 0, sizeof *m);
    struct stat sb;
    const bool found = stat(path, &sb) == 0;
    if (!found && fs_has_suffix(path, ".gguf")) return moh_fail(err, MOH_E_IO, "%s: no such file", path);
    if (!found)
        return moh_fail(err, MOH_E_IO, "'%s': no such file or folder (expected a checkpoint folder or a .gguf file)", path);
    if (S_ISDIR(sb.st_mode)) return model_load(m, path, err); /* names config.json */
    if (!S_ISREG(sb.st_mode)) /* a FIFO or a device would block or never end */
        return moh_fail(err, MOH_E_FORMAT, "%s: not a regular file (expected a checkpoint folder or a .gguf file)", path);
    if (!fs_has_suffix(path, ".gguf")) { /* a file that is not a GGUF: neither of the two forms */
        char magic[4] = {0};
        FILE *f = fopen(path, "rb");
        const bool gguf = f && fread(magic, 1, 4, f) == 4 && !memcmp(magic, "GGUF", 4);
        if (f) fclose(f);
        if (!gguf)
            return moh_fail(err, MOH_E_FORMAT, "%s: not a checkpoint folder or .gguf file (expected a folder with "
                            "config.json and model.safetensors, or a GGUF model file)", path);
    }
    moh_gguf *g = NULL;
    int rc = moh_gguf_open(&g, path, err);
    if (rc) return rc;
    const char *arch = NULL;
    size_t alen = 0;
    rc = moh_gguf_get_str(g, "general.architecture", &arch, &alen, err);
    const model_family *fam = NULL;
    int nf = 0;
    const model_family *const *fams = model_families(&nf);
    for (int i = 0; !rc && i < nf && !fam; i++)
        if (fams[i]->gguf_arch && strlen(fams[i]->gguf_arch) == alen && !memcmp(fams[i]->gguf_arch, arch, alen))
            fam = fams[i];
    if (!rc && !fam)
        rc = moh_fail(err, MOH_E_CONFIG, "%s: general.architecture is '%.*s', expected one moh runs (llama)", path,
                      (int)(alen < 64 ? alen : 64), arch);
    if (!rc) rc = fam->from_gguf(m, g, path, flags, err);
    m->eos_id = -1;
    if (!rc && moh_gguf_find_key(g, "tokenizer.ggml.model") >= 0) { /* the vocabulary, as llama.cpp reads it */
        rc = bpe_from_gguf(&m->tokenizer, g, path, err);
        const int V = m->fam->num_outputs ? m->fam->num_outputs(m->cfg) : 0;
        if (!rc && bpe_n_tokens(m->tokenizer) != V)
            rc = moh_fail(err, MOH_E_SHAPE, "%s: tokenizer.ggml.tokens holds %d tokens, expected %d (the rows of "
                          "token_embd.weight)", path, bpe_n_tokens(m->tokenizer), V);
        uint32_t eos = 0;
        moh_error ignore;
        if (!rc && moh_gguf_get_u32(g, "tokenizer.ggml.eos_token_id", &eos, &ignore) == MOH_OK &&
            (int64_t)eos < bpe_n_tokens(m->tokenizer))
            m->eos_id = (int)eos;
        const char *ct = NULL;
        size_t ctl = 0;
        if (!rc && moh_gguf_find_key(g, "tokenizer.chat_template") >= 0 &&
            moh_gguf_get_str(g, "tokenizer.chat_template", &ct, &ctl, &ignore) == MOH_OK) {
            if ((m->chat_template = malloc(ctl + 1))) {
                memcpy(m->chat_template, ct, ctl);
                m->chat_template[ctl] = '\0';
            } else rc = moh_fail(err, MOH_E_NOMEM, "%s: out of memory", path);
        }
        if (rc) model_free(m);
    }
    if (!rc && m->quant && m->quant->borrows) m->gguf = g; /* its blocks stay mapped: decode reads them */
    else moh_gguf_close(g); /* the weights were dequantised into the model's buffer */
    return rc;
}


int model_check_finite(const char *path, const char *name, const float *x, size_t n, moh_error *err) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return moh_fail(err, MOH_E_FORMAT, "%s: tensor '%s' holds %g at index %zu, expected finite values "
                            "(a diverged or damaged checkpoint)", path, name, (double)x[i], i);
    return MOH_OK;
}
