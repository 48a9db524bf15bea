/* The model registry, model objects, data-parallel shards and the generic evaluation loop
 * (model.h). */
#include "models/model.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "core/calib_cache.h"
#include "core/fsutil.h"
#include "core/rng.h"
#include "io/gguf.h"
#include "ops/quant.h"
#include "text/bpe.h"

extern const model_family lm_family;  /* lm_family.c */
extern const model_family vit_family; /* vit_family.c */
extern const model_family dit_family; /* dit_family.c */

/* The registry: one entry per family. */
static const model_family *const FAMILIES[] = {&lm_family, &vit_family, &dit_family};
enum { NUM_FAMILIES = (int)(sizeof FAMILIES / sizeof FAMILIES[0]) };

const model_family *const *model_families(int *n) {
    *n = NUM_FAMILIES;
    return FAMILIES;
}

const model_family *model_family_find(const char *model_type) {
    for (int i = 0; model_type && i < NUM_FAMILIES; i++)
        if (!strcmp(FAMILIES[i]->model_type, model_type)) return FAMILIES[i];
    return NULL;
}

/* model_family_of_json; *typed: the text names its model_type */
static int family_of_json(const char *text, size_t len, const char *label, const model_family **fam, bool *typed,
                          moh_error *err) {
    *fam = NULL;
    *typed = false;
    cJSON *j = cJSON_ParseWithLength(text, len);
    if (!j || !cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return moh_fail(err, MOH_E_FORMAT, "%s: not a JSON object (expected a model config.json)", label);
    }
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "model_type");
    *typed = t != NULL;
    int rc = MOH_OK;
    if (!t) *fam = &lm_family; /* moh's LM configs name no type: HF LLaMA */
    else if (cJSON_IsString(t)) *fam = model_family_find(t->valuestring);
    if (!*fam) {
        char known[256] = "";
        for (int i = 0; i < NUM_FAMILIES; i++)
            snprintf(known + strlen(known), sizeof known - strlen(known), "%s\"%s\"", i ? ", " : "",
                     FAMILIES[i]->model_type);
        char shown[128];
        if (cJSON_IsString(t))
            rc = moh_fail(err, MOH_E_CONFIG, "%s: field 'model_type' is '%s', expected one of %s", label,
                          moh_st_quote(shown, sizeof shown, t->valuestring), known);
        else
            rc = moh_fail(err, MOH_E_CONFIG, "%s: field 'model_type' is not a string, expected one of %s", label, known);
    }
    cJSON_Delete(j);
    return rc;
}

int model_family_of_json(const char *text, size_t len, const char *label, const model_family **fam,
                         moh_error *err) {
    bool typed;
    return family_of_json(text, len, label, fam, &typed, err);
}

int model_family_of_dir(const char *dir, const model_family **fam, moh_error *err) {
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    size_t len = 0;
    *fam = NULL;
    char *text = fs_read_file(path, 1 << 20, &len, err);
    if (!text) return err ? err->code : MOH_E_IO;
    int rc = model_family_of_json(text, len, path, fam, err);
    free(text);
    return rc;
}

int model_check_text_vocab(const model *m, const char *label, moh_error *err) {
    if (m->tokenizer || !m->fam || strcmp(m->fam->task, "text-generation") || !m->fam->num_outputs) return MOH_OK;
    const int V = m->fam->num_outputs(m->cfg);
    if (V == 256) return MOH_OK;
    const bool gguf = fs_has_suffix(label, ".gguf");
    return moh_fail(err, MOH_E_CONFIG, "%s: vocab_size %d needs a tokenizer (%s; a byte model has 256 tokens)", label, V,
                    gguf ? "tokenizer.ggml.* metadata" : "tokenizer.json");
}

void model_free(model *m) {
    if (m->quant) quant_table_free(m->quant);
    free(m->quant);
    moh_gguf_close(m->gguf); /* after the table that borrows from it */
    bpe_free(m->tokenizer);
    free(m->chat_template);
    if (m->fam && m->params) model_params_free(m->fam, m->params);
    free(m->cfg);
    memset(m, 0, sizeof *m);
}

int model_from_config_text(model *m, const char *text, size_t len, const char *label, moh_error *err) {
    memset(m, 0, sizeof *m);
    m->eos_id = -1;
    const model_family *fam = NULL;
    bool typed = false;
    int rc = family_of_json(text, len, label, &fam, &typed, err);
    if (rc) return rc;
    m->fam = fam;
    if (!(m->cfg = calloc(1, fam->config_size))) return moh_fail(err, MOH_E_NOMEM, "%s: out of memory", label);
    if (!rc) rc = fam->config_parse(m->cfg, text, len, label, err);
    if (rc == MOH_E_CONFIG && err && !typed) { /* say how the family was chosen */
        const size_t used = strlen(err->msg);
        snprintf(err->msg + used, sizeof err->msg - used, " (no \"model_type\" field: read as \"%s\"; other "
                 "families need theirs, e.g. \"model_type\": \"vit\")", fam->model_type);
    }
    if (!rc) rc = model_params_new(fam, m->cfg, &m->params, &m->data, &m->n, err);
    if (rc) model_free(m);
    return rc;
}

int model_from_config_file(model *m, const char *path, moh_error *err) {
    memset(m, 0, sizeof *m);
    size_t len = 0;
    char *text = fs_read_file(path, 1 << 20, &len, err);
    if (!text) return err ? err->code : MOH_E_IO;
    int rc = model_from_config_text(m, text, len, path, err);
    free(text);
    return rc;
}

int model_convert_routing(model *src, const model_routing *r, model *dst, moh_error *err) {
    memset(dst, 0, sizeof *dst);
    dst->eos_id = -1;
    if (model_attn(src)->router != MOH_ROUTER_NONE)
        return moh_fail(err, MOH_E_ARG, "the model already routes its heads (router \"%s\"): convert a dense "
                        "model (router \"none\")", attn_router_name(model_attn(src)->router));
    char *text = src->fam->config_to_json(src->cfg);
    cJSON *j = text ? cJSON_Parse(text) : NULL;
    free(text);
    text = NULL;
    if (j) {
        cJSON_DeleteItemFromObject(j, "router");
        cJSON_DeleteItemFromObject(j, "shared_heads");
        cJSON_DeleteItemFromObject(j, "top_k");
        cJSON_DeleteItemFromObject(j, "straight_through");
        cJSON_AddStringToObject(j, "router", attn_router_name(r->router));
        cJSON_AddNumberToObject(j, "shared_heads", r->shared_heads);
        cJSON_AddNumberToObject(j, "top_k", r->top_k);
        if (r->router == MOH_ROUTER_QUERY_NORM) cJSON_AddBoolToObject(j, "straight_through", r->straight_through);
        text = cJSON_PrintUnformatted(j);
        cJSON_Delete(j);
    }
    if (!text) return moh_fail(err, MOH_E_NOMEM, "model conversion: out of memory");
    int rc = model_from_config_text(dst, text, strlen(text), "the converted config", err);
    free(text);
    if (rc) return rc;
    int ns = 0, nd = 0;
    model_tensor *ts = model_tensors(src, &ns), *td = model_tensors(dst, &nd);
    uint64_t rng = r->seed;
    for (int i = 0; !rc && ts && td && i < nd; i++) {
        float *out = dst->data + td[i].offset;
        int k = 0;
        while (k < ns && strcmp(ts[k].name, td[i].name)) k++;
        if (k < ns && ts[k].numel == td[i].numel) {
            memcpy(out, src->data + ts[k].offset, sizeof(float) * td[i].numel);
        } else if (k == ns && fs_has_suffix(td[i].name, "wg.weight")) {
            for (size_t e = 0; e < td[i].numel; e++) out[e] = (float)(r->router_std * moh_rng_normal(&rng));
        } else if (k == ns && (fs_has_suffix(td[i].name, "wg_0.weight") || fs_has_suffix(td[i].name, "wg_1.weight"))) {
            memset(out, 0, sizeof(float) * td[i].numel);
        } else {
            rc = moh_fail(err, MOH_E_SHAPE, "model conversion: tensor %s %s", td[i].name,
                          k < ns ? "changed size" : "is new and not a router tensor");
        }
    }
    if (!rc && (!ts || !td)) rc = moh_fail(err, MOH_E_NOMEM, "model conversion: out of memory");
    free(ts);
    free(td);
    if (rc) {
        model_free(dst);
        return rc;
    }
    dst->tokenizer = src->tokenizer;
    dst->eos_id = src->eos_id;
    dst->chat_template = src->chat_template;
    src->tokenizer = NULL;
    src->chat_template = NULL;
    return MOH_OK;
}

model_tensor *model_tensors(const model *m, int *n) {
    return m->fam->tensors(m->cfg, MODEL_NAMES_CHECKPOINT, n);
}

int model_num_layers(const model *m) { return m->fam->num_layers(m->cfg); }
const moh_attn_config *model_attn(const model *m) { return m->fam->attn(m->cfg); }
const moh_attn_config *model_attn_layer(const model *m, int l) {
    return m->fam->attn_layer ? m->fam->attn_layer(m->cfg, l) : m->fam->attn(m->cfg);
}

double model_active_heads(const model *m) {
    const int L = model_num_layers(m);
    double n = 0.0;
    for (int l = 0; l < L; l++) {
        const moh_attn_config *a = model_attn_layer(m, l);
        n += a->router == MOH_ROUTER_NONE || a->top_k == 0 ? a->n_heads : a->shared_heads + a->top_k;
    }
    return L > 0 ? n / L : 0.0;
}

void model_print_head_share(const model *m, const model_eval *r, bool json) {
    const int L = model_num_layers(m), h = model_attn(m)->n_heads;
    if (json) printf("\"head_share\": [");
    else printf("head-activation share per layer (heads 0..%d; shared heads first | share of the layer's heads "
                "computed):\n", h - 1);
    for (int l = 0; l < L; l++) {
        if (json) printf("%s[", l ? ", " : "");
        else printf("  layer %2d:", l);
        double sum = 0.0;
        for (int i = 0; i < h; i++) {
            printf(json ? "%s%.6f" : "%s%.2f", json ? (i ? ", " : "") : " ", r->head_share[(size_t)l * h + i]);
            sum += r->head_share[(size_t)l * h + i];
        }
        if (json) printf("]");
        else printf(" | %.4f\n", sum / h);
    }
    if (!json) return;
    printf("], \"layer_head_share\": [");
    for (int l = 0; l < L; l++) {
        double sum = 0.0;
        for (int i = 0; i < h; i++) sum += r->head_share[(size_t)l * h + i];
        printf("%s%.6f", l ? ", " : "", sum / h);
    }
    printf("]");
}

void model_eval_free(model_eval *r) {
    free(r->confusion);
    free(r->head_share);
    memset(r, 0, sizeof *r);
}

int model_tensor_list_init(model_tensor_list *L, int cap) {
    memset(L, 0, sizeof *L);
    L->t = calloc((size_t)cap, sizeof *L->t);
    L->init = calloc((size_t)cap, 1);
    if (!L->t || !L->init) {
        free(L->t);
        free(L->init);
        memset(L, 0, sizeof *L);
        return MOH_E_NOMEM;
    }
    L->cap = cap;
    return MOH_OK;
}

void model_tensor_push(model_tensor_list *L, int decay, int init, int ndim, const int64_t *shape, const char *fmt,
                       int layer) {
    if (L->n >= L->cap) return;
    model_tensor *e = &L->t[L->n];
    L->init[L->n] = (unsigned char)init;
    L->n++;
    snprintf(e->name, sizeof e->name, fmt, layer);
    e->ndim = ndim;
    e->numel = 1;
    for (int i = 0; i < MODEL_MAX_DIMS; i++) {
        e->shape[i] = i < ndim ? shape[i] : 0;
        if (i < ndim) e->numel *= (size_t)shape[i];
    }
    e->offset = L->off;
    e->decay = decay > 0;
    e->hidden = decay == 2;
    L->off += e->numel;
}

void model_tensor_push_timm_attn(model_tensor_list *L, const moh_attn_config *a, int64_t D, int init, int zero,
                                  int layer) {
    model_tensor_push(L, 2, init, 2, (const int64_t[]){3 * D, D}, "blocks.%d.attn.qkv.weight", layer);
    model_tensor_push(L, false, zero, 1, (const int64_t[]){3 * D}, "blocks.%d.attn.qkv.bias", layer);
    model_tensor_push(L, 2, init, 2, (const int64_t[]){D, D}, "blocks.%d.attn.proj.weight", layer);
    model_tensor_push(L, false, zero, 1, (const int64_t[]){D}, "blocks.%d.attn.proj.bias", layer);
    if (attn_has_wg(a))
        model_tensor_push(L, true, init, 2, (const int64_t[]){attn_routed_heads(a), D}, "blocks.%d.attn.wg.weight",
                          layer);
    if (attn_has_wg0(a)) model_tensor_push(L, true, init, 2, (const int64_t[]){2, D}, "blocks.%d.attn.wg_0.weight", layer);
    if (attn_has_wg1(a))
        model_tensor_push(L, true, init, 2, (const int64_t[]){a->shared_heads, D}, "blocks.%d.attn.wg_1.weight",
                          layer);
}

void model_tensor_push_timm_mlp(model_tensor_list *L, int64_t D, int64_t Hm, int init, int zero, int layer) {
    model_tensor_push(L, 2, init, 2, (const int64_t[]){Hm, D}, "blocks.%d.mlp.fc1.weight", layer);
    model_tensor_push(L, false, zero, 1, (const int64_t[]){Hm}, "blocks.%d.mlp.fc1.bias", layer);
    model_tensor_push(L, 2, init, 2, (const int64_t[]){D, Hm}, "blocks.%d.mlp.fc2.weight", layer);
    model_tensor_push(L, false, zero, 1, (const int64_t[]){D}, "blocks.%d.mlp.fc2.bias", layer);
}

model_tensor *model_tensor_list_done(model_tensor_list *L, int *n, unsigned char **init_out) {
    *n = L->n;
    if (init_out) *init_out = L->init;
    else free(L->init);
    return L->t;
}

int model_synthetic_images(int B, int C, int H, int W, int n_labels, int steps, uint64_t seed, moh_batch *out,
                           void **buf, moh_error *err) {
    const size_t n = (size_t)B * C * H * W, nf = steps > 0 ? 2 * n : n, ni = steps > 0 ? 2 * (size_t)B : (size_t)B;
    float *img = malloc(sizeof(float) * nf + sizeof(int) * ni);
    if (!img) return moh_fail(err, MOH_E_NOMEM, "synthetic batch: out of memory");
    float *eps = steps > 0 ? img + n : NULL;
    int *lab = (int *)(img + nf), *t = steps > 0 ? lab + B : NULL;
    uint64_t s = seed;
    for (size_t i = 0; i < n; i++) {
        img[i] = (float)(4.0 * moh_rng_uniform01(&s) - 2.0);
        if (eps) eps[i] = (float)moh_rng_normal(&s);
    }
    for (int j = 0; j < B; j++) {
        lab[j] = (int)(moh_rng_next(&s) % (uint64_t)n_labels);
        if (t) t[j] = (int)(moh_rng_next(&s) % (uint64_t)steps);
    }
    *buf = img;
    *out = (moh_batch){.B = B, .images = img, .C = C, .H = H, .W = W, .labels = lab, .timesteps = t, .noise = eps};
    return MOH_OK;
}

/* *out = obj when rc is MOH_OK, else obj freed; returns rc. */
static int hand_over(void *obj, int rc, void **out) {
    if (rc) free(obj);
    else *out = obj;
    return rc;
}

/* release(obj), then obj's memory (NULL: nothing). */
static void release_free(void (*release)(void *), void *obj) {
    if (!obj) return;
    release(obj);
    free(obj);
}

int model_params_new(const model_family *f, const void *cfg, void **params, float **data, size_t *n,
                     moh_error *err) {
    void *p = calloc(1, f->params_size);
    if (!p) return moh_fail(err, MOH_E_NOMEM, "model: out of memory");
    return hand_over(p, f->params_init(p, cfg, data, n, err), params);
}

void model_params_free(const model_family *f, void *params) { release_free(f->params_release, params); }

int model_acts_new(const model_family *f, const void *cfg, int Bmax, int T, bool sparse, void **acts,
                   moh_error *err) {
    void *a = calloc(1, f->acts_size);
    if (!a) return moh_fail(err, MOH_E_NOMEM, "model: out of memory");
    return hand_over(a, f->acts_init(a, cfg, Bmax, T, sparse, err), acts);
}

void model_acts_free(const model_family *f, void *acts) { release_free(f->acts_release, acts); }

void batch_source_free(batch_source *s) {
    if (s->free && s->self) s->free(s->self);
    memset(s, 0, sizeof *s);
}

/* ---- shards ------------------------------------------------------------------------------ */

int model_default_shards(int batch) {
    int n = omp_get_max_threads();
    if (n > batch) n = batch;
    if (n > MODEL_MAX_SHARDS) n = MODEL_MAX_SHARDS;
    return n < 1 ? 1 : n;
}

void model_shards_free(model_shards *w, const model *m) {
    for (int s = 0; w->acts && s < w->n; s++)
        if (w->acts[s]) model_acts_free(m->fam, w->acts[s]);
    for (int s = 0; w->grads && s < w->n; s++)
        if (w->grads[s]) model_params_free(m->fam, w->grads[s]);
    free(w->acts);
    free(w->grads);
    free(w->gdata);
    bf16_mirror_free(&w->wbf16);
    memset(w, 0, sizeof *w);
}

int model_shards_set_precision(model_shards *w, const model *m, moh_precision p, char *note, size_t cap,
                               moh_error *err) {
    char why[160];
    const moh_precision run = precision_resolve(p, why, sizeof why);
    if (cap) snprintf(note, cap, "%s", p == MOH_PRECISION_BF16 && run != p ? why : "");
    const bool bf = run == MOH_PRECISION_BF16;
    if (bf && !w->wbf16.data) {
        const int rc = bf16_mirror_init(&w->wbf16, m->data, m->n, err);
        if (rc) return rc;
    }
    for (int s = 0; s < w->n; s++) {
        const int rc = attn_stack_set_weights_f32(w->acts[s], bf ? &w->wbf16 : NULL, err);
        if (rc) return rc;
    }
    if (!bf) bf16_mirror_free(&w->wbf16);
    w->precision = run;
    return MOH_OK;
}

/* The cache key of a precision choice: the CPU, its bf16 kernels and the model (family and config).
 * Not the batch shape, mode, path or threads: the first measurement for a model decides for all
 * its later runs on this machine, so its training, evaluation and resumes compute alike. */
static void precision_key(const model *m, char *key, size_t cap) {
    char cpu[128], kernels[128];
    calib_cpu_id(cpu, sizeof cpu);
    precision_describe(MOH_PRECISION_BF16, kernels, sizeof kernels);
    char *json = m->fam->config_to_json(m->cfg);
    uint64_t h = 0xcbf29ce484222325ULL; /* FNV-1a of the config */
    for (const char *p = json ? json : ""; *p; p++) h = (h ^ (unsigned char)*p) * 0x100000001b3ULL;
    free(json);
    snprintf(key, cap, "%s|%s|%s %016llx", cpu, kernels, m->fam->model_type, (unsigned long long)h);
    key[strcspn(key, "\t\n")] = 0;
}

int model_shards_auto_precision(model_shards *w, const model *m, int B, int T, bool train, void *g, float *gdata,
                                model_sum_fn sum, void *sum_ctx, precision_choice *out, moh_error *err) {
    memset(out, 0, sizeof *out);
    char why[160], key[CALIB_MAX_KEY];
    double ms[3] = {0.0, 0.0, 1.0}; /* fp32, bf16, processes (summed) */
    const bool has_bf16 = precision_resolve(MOH_PRECISION_BF16, why, sizeof why) == MOH_PRECISION_BF16;
    if (has_bf16) {
        precision_key(m, key, sizeof key);
        out->cached = calib_cache_get("precision", key, ms, 2) && ms[0] > 0 && ms[1] > 0;
    }
    if (has_bf16 && !out->cached) {
        moh_batch b;
        void *buf = NULL;
        int rc = m->fam->synthetic_batch(m->cfg, B, T, 1, &b, &buf, err);
        for (int r = 0; !rc && r < 3; r++) /* round 0 warms both up */
            for (int p = 0; !rc && p < 2; p++) {
                rc = model_shards_set_precision(w, m, (moh_precision)p, NULL, 0, err);
                const double t0 = omp_get_wtime();
                if (!rc) model_shards_step(m, w, &b, train, train ? g : NULL, gdata, NULL, NULL);
                const double dt = (omp_get_wtime() - t0) * 1e3;
                if (r > 0) ms[p] = r == 1 || dt < ms[p] ? dt : ms[p];
            }
        free(buf);
        if (rc) return rc;
        calib_cache_put("precision", key, ms, 2);
    }
    if (sum) sum(sum_ctx, ms, 3); /* every rank, cached or not: a collective */
    out->ms[0] = ms[0] / ms[2];
    out->ms[1] = ms[1] / ms[2];
    out->run = has_bf16 && ms[1] < ms[0] ? MOH_PRECISION_BF16 : MOH_PRECISION_FP32;
    if (!has_bf16) snprintf(out->note, sizeof out->note, "fp32 (%s)", why);
    else if (out->cached)
        snprintf(out->note, sizeof out->note, "%s (cached for this CPU and model: fp32 %.0f ms, bf16 %.0f ms per step "
                 "when first measured)", out->run == MOH_PRECISION_BF16 ? "bf16" : "fp32", out->ms[0], out->ms[1]);
    else
        snprintf(out->note, sizeof out->note, "%s (measured: fp32 %.0f ms, bf16 %.0f ms per %s of %d x %d)",
                 out->run == MOH_PRECISION_BF16 ? "bf16" : "fp32", out->ms[0], out->ms[1],
                 train ? "training step" : "forward", B, T);
    return model_shards_set_precision(w, m, out->run, NULL, 0, err);
}

int model_shards_init(model_shards *w, const model *m, int batch, int T, int n, bool with_grads,
                      bool sparse, moh_error *err) {
    memset(w, 0, sizeof *w);
    if (n < 1 || n > MODEL_MAX_SHARDS || batch < n)
        return moh_fail(err, MOH_E_ARG, "shards %d for batch %d, expected 1..min(256, batch)", n, batch);
    w->Bmax = (batch + n - 1) / n;
    w->n = n;
    w->acts = calloc((size_t)n, sizeof *w->acts);
    const bool g = with_grads && n > 1; /* one shard backpropagates into the caller's gradient */
    w->grads = g ? calloc((size_t)n, sizeof *w->grads) : NULL;
    w->gdata = g ? calloc((size_t)n, sizeof *w->gdata) : NULL;
    if (!w->acts || (g && (!w->grads || !w->gdata))) {
        model_shards_free(w, m);
        return moh_fail(err, MOH_E_NOMEM, "shards: out of memory");
    }
    for (int s = 0; s < n; s++) {
        int rc = model_acts_new(m->fam, m->cfg, w->Bmax, T, sparse, &w->acts[s], err);
        size_t np = 0;
        if (!rc && g) rc = model_params_new(m->fam, m->cfg, &w->grads[s], &w->gdata[s], &np, err);
        if (rc) {
            model_shards_free(w, m);
            return rc;
        }
    }
    return MOH_OK;
}

double model_shards_step(const model *m, model_shards *w, const moh_batch *b, bool train, void *g,
                         float *gdata, double *ce, double *lb) {
    const int n = w->n, B = b->B;
    const model_family *f = m->fam;
    double loss_s[MODEL_MAX_SHARDS], ce_s[MODEL_MAX_SHARDS], lb_s[MODEL_MAX_SHARDS];
    for (int s = 0; s <= n; s++) w->first[s] = (int)((long)B * s / n);
    for (int s = 0; s < n; s++) w->count[s] = w->first[s + 1] - w->first[s];
    const bool back = train && g;
    if (w->precision == MOH_PRECISION_BF16) bf16_mirror_sync(&w->wbf16);
#pragma omp parallel for schedule(static, 1) num_threads(n) if (n > 1)
    for (int s = 0; s < n; s++) {
        loss_s[s] = ce_s[s] = lb_s[s] = 0.0;
        if (w->count[s] == 0) continue;
        loss_s[s] = f->forward(m->cfg, m->params, w->acts[s], b, w->first[s], w->count[s], train, &ce_s[s], &lb_s[s]);
        if (back) {
            void *gs = n > 1 ? w->grads[s] : g;
            if (n > 1) memset(w->gdata[s], 0, sizeof(float) * m->n);
            f->backward(m->cfg, m->params, gs, w->acts[s], b, w->first[s], w->count[s]);
        }
    }
    double loss = 0.0, c = 0.0, l = 0.0;
    for (int s = 0; s < n; s++) {
        const double wt = (double)w->count[s] / B;
        loss += wt * loss_s[s];
        c += wt * ce_s[s];
        l += wt * lb_s[s];
    }
    if (back && n > 1) {
        float wt[MODEL_MAX_SHARDS];
        for (int s = 0; s < n; s++) wt[s] = (float)((double)w->count[s] / B);
        const size_t np = m->n;
        float *const *gd = w->gdata;
#pragma omp parallel for schedule(static) if (np >= 65536)
        for (size_t i = 0; i < np; i++) {
            float acc = 0.0f;
            for (int s = 0; s < n; s++) acc += wt[s] * gd[s][i];
            gdata[i] += acc;
        }
    }
    if (ce) *ce = c;
    if (lb) *lb = l;
    return loss;
}

void model_shards_routed_share(const model *m, const model_shards *w, const moh_batch *b, double *mn,
                               double *mx) {
    const int L = model_num_layers(m);
    const int per = m->fam->tokens_per_example(m->cfg, b);
    *mn = *mx = 1.0;
    bool any = false;
    for (int l = 0; l < L; l++) {
        const moh_attn_config *a = model_attn_layer(m, l);
        const int E = attn_routed_heads(a);
        if (E == 0 || a->top_k == 0) continue; /* no routed heads in this layer */
        if (!any) *mx = 0.0;
        any = true;
        for (int i = 0; i < E; i++) {
            double f = 0.0, T = 0.0;
            for (int s = 0; s < w->n; s++) {
                const long Ts = (long)w->count[s] * per;
                const float *mask = model_router(w->acts[s], l)->mask;
                for (long t = 0; t < Ts; t++) f += mask[(size_t)t * E + i];
                T += (double)Ts;
            }
            f /= T > 0 ? T : 1.0;
            *mn = f < *mn ? f : *mn;
            *mx = f > *mx ? f : *mx;
        }
    }
}

/* ---- evaluation -------------------------------------------------------------------------- */

int model_evaluate(const model *m, model_shards *w, batch_source *src, long limit,
                   const moh_progress *progress, model_eval *r, moh_error *err) {
    return model_evaluate_split(m, w, src, limit, progress, NULL, r, err);
}

/* Sums r's counts over the ranks of split (integers as doubles: exact below 2^53). */
static int eval_reduce(const model *m, const eval_split *split, model_eval *r, moh_error *err) {
    const int L = model_num_layers(m), h = model_attn(m)->n_heads;
    double has = r->confusion != NULL;
    split->sum(split->ctx, &has, 1);
    const size_t K = has > 0 && m->fam->num_outputs ? (size_t)m->fam->num_outputs(m->cfg) : 0;
    if (K && !r->confusion && !(r->confusion = calloc(K * K, sizeof(long))))
        return moh_fail(err, MOH_E_NOMEM, "eval: out of memory");
    const size_t nh = (size_t)L * h, nv = 7 + nh + K * K;
    double *v = malloc(sizeof(double) * nv);
    if (!v) return moh_fail(err, MOH_E_NOMEM, "eval: out of memory");
    v[0] = (double)r->n, v[1] = r->ce_sum, v[2] = (double)r->correct, v[3] = r->lb_loss, v[4] = (double)r->batches;
    v[5] = r->tokens, v[6] = r->bytes;
    for (size_t i = 0; i < nh; i++) v[7 + i] = r->head_share[i];
    for (size_t i = 0; i < K * K; i++) v[7 + nh + i] = (double)r->confusion[i];
    split->sum(split->ctx, v, nv);
    r->n = (long)v[0], r->ce_sum = v[1], r->correct = (long)v[2], r->lb_loss = v[3], r->batches = (long)v[4];
    r->tokens = v[5], r->bytes = v[6];
    for (size_t i = 0; i < nh; i++) r->head_share[i] = v[7 + i];
    for (size_t i = 0; i < K * K; i++) r->confusion[i] = (long)v[7 + nh + i];
    free(v);
    return MOH_OK;
}

int model_evaluate_split(const model *m, model_shards *w, batch_source *src, long limit,
                         const moh_progress *progress, const eval_split *split, model_eval *r, moh_error *err) {
    const model_family *f = m->fam;
    const int L = model_num_layers(m), h = model_attn(m)->n_heads;
    const int rank = split ? split->rank : 0, nranks = split ? split->nranks : 1;
    memset(r, 0, sizeof *r);
    if (!(r->head_share = calloc((size_t)L * h, sizeof(double))))
        return moh_fail(err, MOH_E_NOMEM, "eval: out of memory");
    const long total = src->eval_items(src->self, limit);
    long cursor = 0, done = 0;
    moh_batch b;
    for (long k = 0;; k++) {
        const long items = src->eval_next(src->self, &cursor, limit, w->n * w->Bmax, &b);
        if (items <= 0) break;
        done += items;
        if (k % nranks != rank) continue; /* another rank's batch */
        double lb = 0.0;
        model_shards_step(m, w, &b, false, NULL, NULL, NULL, &lb);
        const int per = f->tokens_per_example(m->cfg, &b);
        for (int s = 0; s < w->n; s++) {
            if (w->count[s] == 0) continue;
            f->eval_add(m->cfg, w->acts[s], &b, w->first[s], w->count[s], r);
            const long Ts = (long)w->count[s] * per;
            for (int l = 0; l < L; l++) {
                const float *g = model_router(w->acts[s], l)->gates;
                for (long t = 0; t < Ts; t++)
                    for (int i = 0; i < h; i++) r->head_share[(size_t)l * h + i] += g[t * h + i] != 0.0f;
            }
            r->tokens += (double)Ts;
        }
        r->lb_loss += lb;
        r->batches++;
        if (progress && progress->fn) progress->fn(progress->ctx, done < total ? done : total, total);
    }
    if (nranks > 1) {
        const int rc = eval_reduce(m, split, r, err);
        if (rc) {
            model_eval_free(r);
            return rc;
        }
    }
    if (r->n == 0) {
        model_eval_free(r);
        return moh_fail(err, MOH_E_FORMAT, "eval: the data gives no %s to evaluate", src->eval_unit);
    }
    for (size_t i = 0; i < (size_t)L * h; i++) r->head_share[i] /= r->tokens > 0 ? r->tokens : 1.0;
    r->lb_loss /= (double)r->batches;
    f->eval_finish(m->cfg, r);
    return MOH_OK;
}

int model_dump_logits(const model *m, batch_source *src, const char *path, moh_error *err) {
    const model_family *f = m->fam;
    if (!f->dump_entries)
        return moh_fail(err, MOH_E_ARG, "--dump-logits %s: a %s has no logits to dump (expected model_type with "
                        "logits: llama or vit)", path, f->short_name);
    long cursor = 0;
    moh_batch b;
    const int want = f->dump_examples > 0 ? (int)f->dump_examples : INT_MAX; /* INT_MAX: one batch, its full size */
    if (src->eval_next(src->self, &cursor, 0, want, &b) <= 0)
        return moh_fail(err, MOH_E_FORMAT, "--dump-logits %s: the evaluation data holds no example", path);
    void *acts = NULL;
    int rc = model_acts_new(f, m->cfg, b.B, b.T, f->default_sparse, &acts, err);
    float *scratch = rc ? NULL : malloc(sizeof(float) * 3 * ((size_t)b.B + (size_t)b.T));
    if (!rc && !scratch) rc = moh_fail(err, MOH_E_NOMEM, "--dump-logits: out of memory");
    if (!rc) {
        moh_st_entry e[4];
        const int n = f->dump_entries(m, &b, acts, scratch, e);
        rc = moh_st_write(path, e, n, err);
    }
    free(scratch);
    model_acts_free(f, acts);
    return rc;
}

void model_init_random(const model_tensor *ts, const unsigned char *kind, int nt, const model_init *laws,
                       float *data, uint64_t seed) {
    uint64_t s = seed;
    for (int i = 0; ts && i < nt; i++) {
        const model_tensor *t = &ts[i];
        const model_init *law = &laws[kind[i]];
        float *x = data + t->offset;
        double bound = law->scale;
        if (law->law == MODEL_INIT_FAMILY) continue;
        if (law->law == MODEL_INIT_XAVIER) {
            const double fan_out = (double)t->shape[0], fan_in = (double)t->numel / fan_out;
            bound = sqrt(6.0 / (fan_in + fan_out));
        }
        for (size_t j = 0; j < t->numel; j++) {
            double v = 0.0;
            switch (law->law) {
            case MODEL_INIT_ONE: v = 1.0; break;
            case MODEL_INIT_UNIFORM:
            case MODEL_INIT_XAVIER: v = bound * (2.0 * moh_rng_uniform01(&s) - 1.0); break;
            case MODEL_INIT_NORMAL: v = law->scale * moh_rng_normal(&s); break;
            case MODEL_INIT_TRUNC_NORMAL:
                do v = law->scale * moh_rng_normal(&s);
                while (v < -2.0 || v > 2.0);
                break;
            default: break;
            }
            x[j] = (float)v;
        }
    }
}
