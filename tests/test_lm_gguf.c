/* LLaMA models from GGUF (src/models/lm_gguf.c via model_open): the tiny model of
 * tests/fixtures/gguf_llama (tools/ref/gguf_llama_fixture.py: written as llama.cpp's converter
 * writes it, q/k rows permuted, tied output, one Q8_0 tensor) loads to exactly the Hugging Face
 * layout weights of the same fixture's moh checkpoint, with the config from the llama.* metadata,
 * gives the same logits, and bad files are one-line errors; a BPE model's bits per byte equal a
 * hand computation. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/fsutil.h"
#include "core/rng.h"
#include "models/lm.h"
#include "models/lm_gguf.h"
#include "text/bpe_gguf.h"
#include "models/model.h"
#include "test_util.h"

#define DIR "tests/fixtures/gguf_llama"

static void same_model(test_ctx *ctx) {
    moh_error err = {0};
    model g = {0}, h = {0};
    int rc = model_open(&g, DIR "/tiny-llama.gguf", &err);
    CHECK(ctx, rc == MOH_OK, "open gguf: %s", err.msg);
    rc = rc ? rc : model_open(&h, DIR, &err);
    CHECK(ctx, rc == MOH_OK, "open checkpoint dir: %s", err.msg);
    if (rc) {
        model_free(&g);
        return;
    }
    CHECK(ctx, !strcmp(g.fam->model_type, "llama"), "family %s", g.fam->model_type);
    const moh_lm_config *a = g.cfg, *b = h.cfg;
    CHECK(ctx, a->hidden_size == 32 && a->num_hidden_layers == 2 && a->num_attention_heads == 4 &&
          a->num_key_value_heads == 2 && a->head_dim == 8 && a->intermediate_size == 64 && a->vocab_size == 260 &&
          a->max_position_embeddings == 64 && a->tie_word_embeddings && a->router == MOH_ROUTER_NONE,
          "config from llama.* metadata");
    CHECK(ctx, fabs(a->rope_theta - 100000.0) < 1e-9 && fabs(a->rms_norm_eps - 1e-5) < 1e-12, "rope %g eps %g",
          a->rope_theta, a->rms_norm_eps);
    CHECK(ctx, g.n == h.n, "parameter counts %zu vs %zu", g.n, h.n);
    if (g.n == h.n) {
        /* every weight bit-exact: F32 copied, q/k rows back in HF order, Q8_0 dequantised as gguf-py */
        size_t bad = 0;
        for (size_t i = 0; i < g.n; i++) bad += memcmp(&g.data[i], &h.data[i], sizeof(float)) != 0;
        CHECK(ctx, bad == 0, "%zu of %zu weights differ from the HF layout", bad, g.n);
        /* the premise: the permutation matters (the raw GGUF rows of attn_q differ from HF's) */
        int nt = 0;
        model_tensor *ts = lm_tensors(a, &nt);
        const model_tensor *q = NULL;
        for (int i = 0; ts && i < nt && !q; i++)
            if (!strcmp(ts[i].name, "model.layers.0.self_attn.q_proj.weight")) q = &ts[i];
        CHECK(ctx, q != NULL, "q_proj in the registry");
        if (q) { /* HF row 1 of head 0 is ggml row 2: they hold different values */
            const float *r1 = h.data + q->offset + 1 * 32, *r2 = h.data + q->offset + 2 * 32;
            CHECK(ctx, memcmp(r1, r2, 32 * sizeof(float)) != 0, "rows 1 and 2 of q_proj should differ");
        }
        free(ts);
        /* the same logits on random tokens */
        lm_acts_f32 aa, ab;
        const int B = 2, T = 16;
        int tok[32], tgt[32];
        test_rng r = {7};
        for (int i = 0; i < B * T; i++) {
            tok[i] = (int)(test_rng_u64(&r) % 260);
            tgt[i] = (int)(test_rng_u64(&r) % 260);
        }
        if (!lm_acts_init_f32(&aa, a, B, T, &err) && !lm_acts_init_f32(&ab, b, B, T, &err)) {
            const float la = lm_forward_f32(a, g.params, &aa, tok, tgt, B, T);
            const float lb = lm_forward_f32(b, h.params, &ab, tok, tgt, B, T);
            CHECK(ctx, la == lb && isfinite(la) && la > 4.0f && la < 7.0f, "loss %g vs %g (about ln 260 = 5.56)", la, lb);
            CHECK(ctx, !memcmp(aa.logits, ab.logits, sizeof(float) * (size_t)B * T * 260), "logits differ");
            lm_acts_free_f32(&aa);
            lm_acts_free_f32(&ab);
        }
    }
    model_free(&g);
    model_free(&h);
}

/* A copy of the fixture cut at `keep` bytes, or with byte `at` set to `v`. */
static int bad_copy(const char *out, long keep, long at, int v) {
    FILE *f = fopen(DIR "/tiny-llama.gguf", "rb");
    if (!f) return -1;
    static unsigned char buf[1 << 18];
    const size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    if (at >= 0 && (size_t)at < n) buf[at] = (unsigned char)v;
    FILE *o = fopen(out, "wb");
    if (!o) return -1;
    fwrite(buf, 1, keep >= 0 && (size_t)keep < n ? (size_t)keep : n, o);
    fclose(o);
    return 0;
}

static void errors(test_ctx *ctx) {
    moh_error err = {0};
    model m = {0};
    char path[64];
    snprintf(path, sizeof path, "/tmp/moh_test_lm_gguf_%d.gguf", (int)getpid());
    CHECK(ctx, bad_copy(path, 5000, -1, 0) == 0, "write truncated copy");
    int rc = model_open(&m, path, &err);
    CHECK(ctx, rc != MOH_OK && strstr(err.msg, path) && !strchr(err.msg, '\n'), "truncated: %s", err.msg);
    CHECK(ctx, bad_copy(path, -1, 0, 'X') == 0, "write bad-magic copy");
    rc = model_open(&m, path, &err);
    CHECK(ctx, rc == MOH_E_FORMAT && strstr(err.msg, path), "bad magic: %s", err.msg);
    remove(path);
    rc = model_open(&m, "/nonexistent/x.gguf", &err);
    CHECK(ctx, rc == MOH_E_IO && strstr(err.msg, "x.gguf"), "missing: %s", err.msg);
    /* a GGUF of another kind: the gguf reader's fixture has no llama architecture */
    rc = model_open(&m, "tests/fixtures/gguf/types.gguf", &err);
    CHECK(ctx, rc != MOH_OK && strstr(err.msg, "general.architecture"), "not a llama gguf: %s", err.msg);
}

/* The fixture's HF checkpoint split into two shards + model.safetensors.index.json (as
 * transformers writes large models) loads to the same weights; a bad index is a one-line error. */
static void sharded(test_ctx *ctx) {
    moh_error err = {0};
    model h = {0}, s = {0};
    char dir[64], path[128];
    snprintf(dir, sizeof dir, "/tmp/moh_test_shards_%d", (int)getpid());
    if (model_open(&h, DIR, &err)) {
        CHECK(ctx, 0, "open: %s", err.msg);
        return;
    }
    CHECK(ctx, fs_mkdir_p(dir, &err) == MOH_OK, "mkdir: %s", err.msg);
    int nt = 0;
    model_tensor *ts = model_tensors(&h, &nt);
    moh_st_entry e[64];
    FILE *f;
    for (int part = 0; part < 2 && ts && nt <= 64; part++) { /* tensors alternate between the shards */
        int n = 0;
        for (int i = part; i < nt; i += 2) {
            e[n] = (moh_st_entry){.name = ts[i].name, .ndim = ts[i].ndim, .data = h.data + ts[i].offset};
            for (int d = 0; d < ts[i].ndim; d++) e[n].shape[d] = ts[i].shape[d];
            n++;
        }
        snprintf(path, sizeof path, "%s/model-0000%d-of-00002.safetensors", dir, part + 1);
        CHECK(ctx, moh_st_write(path, e, n, &err) == MOH_OK, "write shard: %s", err.msg);
    }
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    if ((f = fopen(path, "w"))) {
        fprintf(f, "{\"metadata\": {\"total_size\": %zu}, \"weight_map\": {", h.n * 4);
        for (int i = 0; i < nt; i++)
            fprintf(f, "%s\"%s\": \"model-0000%d-of-00002.safetensors\"", i ? ", " : "", ts[i].name, i % 2 + 1);
        fprintf(f, "}}\n");
        fclose(f);
    }
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *json = h.fam->config_to_json(h.cfg);
    if (json && (f = fopen(path, "w"))) {
        fputs(json, f);
        fclose(f);
    }
    free(json);
    int rc = model_open(&s, dir, &err);
    CHECK(ctx, rc == MOH_OK, "sharded load: %s", err.msg);
    if (!rc) {
        CHECK(ctx, s.n == h.n && !memcmp(s.data, h.data, sizeof(float) * h.n), "sharded weights differ");
        model_free(&s);
    }
    /* an index that misses a tensor, or points outside the folder */
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    if ((f = fopen(path, "w"))) {
        fprintf(f, "{\"weight_map\": {\"%s\": \"model-00001-of-00002.safetensors\"}}", ts ? ts[0].name : "x");
        fclose(f);
    }
    rc = model_open(&s, dir, &err);
    CHECK(ctx, rc == MOH_E_SHAPE && strstr(err.msg, "is not in the weight_map") && !strchr(err.msg, '\n'),
          "incomplete index: %s", err.msg);
    if ((f = fopen(path, "w"))) {
        fprintf(f, "{\"weight_map\": {\"%s\": \"../etc/x.safetensors\"}}", ts ? ts[0].name : "x");
        fclose(f);
    }
    rc = model_open(&s, dir, &err);
    CHECK(ctx, rc == MOH_E_FORMAT && strstr(err.msg, "is not a shard file name in the folder"), "path in index: %s",
          err.msg);
    for (int part = 1; part <= 2; part++) {
        snprintf(path, sizeof path, "%s/model-0000%d-of-00002.safetensors", dir, part);
        remove(path);
    }
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    remove(path);
    snprintf(path, sizeof path, "%s/config.json", dir);
    remove(path);
    rmdir(dir);
    free(ts);
    model_free(&h);
}

/* ---- llama GGUFs built byte by byte (any key type): one layer, C 8, 2 heads, FFN 16, vocab 4 ---- */
typedef struct kvs { /* a metadata key: type -1 drops a base key; arrays: arr_type, n, v */
    const char *key;
    int type, arr_type;
    uint64_t n;
    const void *v; /* scalar bytes, a C string, or n array elements */
} kvs;
typedef struct buf { uint8_t *b; size_t n, cap; } buf;
static void put(buf *w, const void *p, size_t n) {
    if (w->n + n > w->cap) {
        w->cap = 2 * (w->n + n) + 256;
        w->b = realloc(w->b, w->cap);
    }
    memcpy(w->b + w->n, p, n);
    w->n += n;
}
static void put32(buf *w, uint32_t v) { put(w, &v, 4); } /* little-endian hosts (x86, arm64) */
static void put64(buf *w, uint64_t v) { put(w, &v, 8); }
static void putstr(buf *w, const char *s) {
    put64(w, strlen(s));
    put(w, s, strlen(s));
}
static size_t vsize(int t) {
    static const size_t sz[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return t >= 0 && t < 13 ? sz[t] : 0;
}
static void putkv(buf *w, const kvs *k) {
    putstr(w, k->key);
    put32(w, (uint32_t)k->type);
    if (k->type == MOH_GGUF_STRING) {
        putstr(w, k->v);
    } else if (k->type == MOH_GGUF_ARRAY) {
        put32(w, (uint32_t)k->arr_type);
        put64(w, k->n);
        if (k->arr_type == MOH_GGUF_STRING)
            for (uint64_t i = 0; i < k->n; i++) putstr(w, ((const char *const *)k->v)[i]);
        else put(w, k->v, vsize(k->arr_type) * k->n);
    } else {
        put(w, k->v, vsize(k->type));
    }
}
static const uint32_t U1 = 1, U2 = 2, U4 = 4, U8 = 8, U16 = 16;
static const float EPS = 1e-5f;
/* The file: base keys (unless extra names them) then extra, the 11 tensors in F32; norm2d writes
 * output_norm.weight as [8, 1]. */
static buf llama_file(const kvs *extra, int n_extra, bool norm2d) {
    const kvs base[] = {{"general.architecture", MOH_GGUF_STRING, 0, 0, "llama"},
                        {"llama.block_count", MOH_GGUF_U32, 0, 0, &U1},
                        {"llama.embedding_length", MOH_GGUF_U32, 0, 0, &U8},
                        {"llama.context_length", MOH_GGUF_U32, 0, 0, &U16},
                        {"llama.feed_forward_length", MOH_GGUF_U32, 0, 0, &U16},
                        {"llama.attention.head_count", MOH_GGUF_U32, 0, 0, &U2},
                        {"llama.attention.head_count_kv", MOH_GGUF_U32, 0, 0, &U2},
                        {"llama.attention.layer_norm_rms_epsilon", MOH_GGUF_F32, 0, 0, &EPS}};
    static const struct { const char *name; int nd; int64_t ne[2]; } ts[] = {
        {"token_embd.weight", 2, {8, 4}},        {"output_norm.weight", 1, {8, 1}},
        {"blk.0.attn_norm.weight", 1, {8, 1}},   {"blk.0.attn_q.weight", 2, {8, 8}},
        {"blk.0.attn_k.weight", 2, {8, 8}},      {"blk.0.attn_v.weight", 2, {8, 8}},
        {"blk.0.attn_output.weight", 2, {8, 8}}, {"blk.0.ffn_norm.weight", 1, {8, 1}},
        {"blk.0.ffn_gate.weight", 2, {8, 16}},   {"blk.0.ffn_up.weight", 2, {8, 16}},
        {"blk.0.ffn_down.weight", 2, {16, 8}}};
    const int nb = (int)(sizeof base / sizeof *base), nt = (int)(sizeof ts / sizeof *ts);
    int n_kv = n_extra;
    for (int i = 0; i < nb; i++) {
        bool over = false;
        for (int j = 0; j < n_extra; j++) over |= !strcmp(base[i].key, extra[j].key);
        n_kv += !over;
    }
    for (int j = 0; j < n_extra; j++) n_kv -= extra[j].type < 0;
    buf w = {0};
    put(&w, "GGUF", 4);
    put32(&w, 3);
    put64(&w, (uint64_t)nt);
    put64(&w, (uint64_t)n_kv);
    for (int i = 0; i < nb; i++) {
        bool over = false;
        for (int j = 0; j < n_extra; j++) over |= !strcmp(base[i].key, extra[j].key);
        if (!over) putkv(&w, &base[i]);
    }
    for (int j = 0; j < n_extra; j++)
        if (extra[j].type >= 0) putkv(&w, &extra[j]);
    uint64_t off = 0;
    for (int i = 0; i < nt; i++) {
        putstr(&w, ts[i].name);
        const int nd = i == 1 && norm2d ? 2 : ts[i].nd;
        put32(&w, (uint32_t)nd);
        for (int d = 0; d < nd; d++) put64(&w, (uint64_t)ts[i].ne[d]);
        put32(&w, MOH_GGML_F32);
        put64(&w, off);
        off += (uint64_t)(ts[i].ne[0] * ts[i].ne[1] * 4 + 31) / 32 * 32;
    }
    while (w.n % 32) put(&w, "", 1);
    for (int i = 0; i < nt; i++) {
        const int64_t n = ts[i].ne[0] * ts[i].ne[1];
        for (int64_t k = 0; k < n; k++) {
            const float f = (float)((k * 7 + i) % 13) / 13.0f - 0.5f;
            put(&w, &f, 4);
        }
        while (w.n % 32) put(&w, "", 1);
    }
    return w;
}

/* lm_gguf_config of the built file: rc, and when refused a one-line message naming the file and
 * `word`; *cfg out. */
static int cfg_of(test_ctx *ctx, const char *what, const kvs *extra, int n, int want, const char *word,
                  moh_lm_config *cfg) {
    buf w = llama_file(extra, n, false);
    moh_gguf *g = NULL;
    moh_error err = {0};
    int rc = moh_gguf_parse(&g, w.b, w.n, "x.gguf", &err);
    CHECK(ctx, rc == MOH_OK, "%s: parse: %s", what, err.msg);
    if (!rc) rc = lm_gguf_config(g, "x.gguf", cfg, &err);
    CHECK(ctx, rc == want, "%s: rc %d (expected %d): %s", what, rc, want, rc ? err.msg : "accepted");
    if (rc && want)
        CHECK(ctx, !strncmp(err.msg, "x.gguf: ", 8) && !strchr(err.msg, '\n') && (!word || strstr(err.msg, word)),
              "%s: message '%s' (expected the file and '%s')", what, err.msg, word ? word : "");
    if (rc) printf("  [%s] %s\n", what, err.msg);
    moh_gguf_close(g);
    free(w.b);
    return rc;
}

/* The llama.* keys as llama.cpp's load_hparams reads them for LLM_ARCH_LLAMA (exact types, the
 * required epsilon, RoPE scaling, experts, per-layer arrays, vocab_size, split.count), each
 * honoured or refused in one line naming the key. */
static void llama_keys(test_ctx *ctx) {
    moh_lm_config c;
    const int32_t i8 = 8;
    const double f64 = 1e-5;
    const float f4 = 4.0f, f2 = 2.0f, fm1 = -1.0f;
    const uint32_t u0 = 0, u3 = 3, u5 = 5, u513 = 513;
    const uint16_t s1 = 1, s2 = 2;
    const int32_t ff1[1] = {16}, ff2[2] = {16, 16};
    const uint32_t hh1[1] = {2};
    const uint8_t bb1[1] = {1};
    /* the base file loads */
    CHECK(ctx, cfg_of(ctx, "base", NULL, 0, MOH_OK, NULL, &c) == MOH_OK && c.rope_scaling.type == MOH_ROPE_DEFAULT &&
          c.head_dim == 4 && c.vocab_size == 4, "base config");
    /* exact types (GKV::get_kv: "key has wrong type") */
    kvs k1[] = {{"llama.block_count", MOH_GGUF_I32, 0, 0, &(int32_t){1}}};
    cfg_of(ctx, "block_count i32", k1, 1, MOH_E_FORMAT, "'llama.block_count' is i32, expected u32", &c);
    kvs k2[] = {{"llama.attention.layer_norm_rms_epsilon", MOH_GGUF_F64, 0, 0, &f64}};
    cfg_of(ctx, "epsilon f64", k2, 1, MOH_E_FORMAT, "layer_norm_rms_epsilon' is f64, expected f32", &c);
    kvs k3[] = {{"llama.rope.freq_base", MOH_GGUF_F64, 0, 0, &f64}};
    cfg_of(ctx, "freq_base f64", k3, 1, MOH_E_FORMAT, "llama.rope.freq_base", &c);
    kvs k4[] = {{"llama.attention.key_length", MOH_GGUF_I32, 0, 0, &(int32_t){4}}};
    cfg_of(ctx, "key_length i32", k4, 1, MOH_E_FORMAT, "llama.attention.key_length", &c);
    kvs k5[] = {{"llama.vocab_size", MOH_GGUF_I32, 0, 0, &(int32_t){4}}};
    cfg_of(ctx, "vocab_size i32", k5, 1, MOH_E_FORMAT, "llama.vocab_size", &c);
    /* the epsilon is required for llama (get_key(LLM_KV_ATTENTION_LAYERNORM_RMS_EPS)) */
    kvs k6[] = {{"llama.attention.layer_norm_rms_epsilon", -1, 0, 0, NULL}};
    cfg_of(ctx, "no epsilon", k6, 1, MOH_E_SHAPE, "llama.attention.layer_norm_rms_epsilon", &c);
    /* RoPE scaling: the type defaults to linear, so a factor alone scales; the old key too; none never */
    kvs k7[] = {{"llama.rope.scaling.factor", MOH_GGUF_F32, 0, 0, &f4}};
    CHECK(ctx, !cfg_of(ctx, "factor, no type", k7, 1, MOH_OK, NULL, &c) && c.rope_scaling.type == MOH_ROPE_LINEAR &&
          c.rope_scaling.factor == 4.0, "factor alone: linear 4 (type %d)", c.rope_scaling.type);
    kvs k8[] = {{"llama.rope.scale_linear", MOH_GGUF_F32, 0, 0, &f2}};
    CHECK(ctx, !cfg_of(ctx, "scale_linear", k8, 1, MOH_OK, NULL, &c) && c.rope_scaling.type == MOH_ROPE_LINEAR &&
          c.rope_scaling.factor == 2.0, "rope.scale_linear: linear 2 (type %d)", c.rope_scaling.type);
    kvs k9[] = {{"llama.rope.scaling.type", MOH_GGUF_STRING, 0, 0, "linear"}, {"llama.rope.scaling.factor", MOH_GGUF_F32, 0, 0, &f2}};
    CHECK(ctx, !cfg_of(ctx, "linear 2", k9, 2, MOH_OK, NULL, &c) && c.rope_scaling.type == MOH_ROPE_LINEAR &&
          c.rope_scaling.factor == 2.0, "linear 2 (type %d)", c.rope_scaling.type);
    kvs k10[] = {{"llama.rope.scaling.type", MOH_GGUF_STRING, 0, 0, "none"}, {"llama.rope.scaling.factor", MOH_GGUF_F32, 0, 0, &f4}};
    CHECK(ctx, !cfg_of(ctx, "none + factor", k10, 2, MOH_OK, NULL, &c) && c.rope_scaling.type == MOH_ROPE_DEFAULT,
          "none: unscaled");
    kvs k11[] = {{"llama.rope.scaling.type", MOH_GGUF_STRING, 0, 0, "yarn"}};
    cfg_of(ctx, "yarn", k11, 1, MOH_E_CONFIG, "llama.rope.scaling.type is 'yarn'", &c);
    kvs k12[] = {{"llama.rope.scaling.type", MOH_GGUF_STRING, 0, 0, "cubic"}};
    cfg_of(ctx, "unknown scaling", k12, 1, MOH_E_CONFIG, "llama.rope.scaling.type is 'cubic'", &c);
    kvs k13[] = {{"llama.rope.scaling.factor", MOH_GGUF_F32, 0, 0, &fm1}};
    cfg_of(ctx, "negative factor", k13, 1, MOH_E_CONFIG, "llama.rope.scaling.factor", &c);
    kvs k14[] = {{"llama.rope.scaling.attn_factor", MOH_GGUF_F32, 0, 0, &f2}};
    cfg_of(ctx, "attn_factor", k14, 1, MOH_E_CONFIG, "llama.rope.scaling.attn_factor", &c);
    /* head dims: n_rot == key_length, value_length == key_length */
    kvs k15[] = {{"llama.rope.dimension_count", MOH_GGUF_U32, 0, 0, &U2}};
    cfg_of(ctx, "partial rope", k15, 1, MOH_E_CONFIG, "llama.rope.dimension_count is 2", &c);
    kvs k16[] = {{"llama.attention.value_length", MOH_GGUF_U32, 0, 0, &U2}};
    cfg_of(ctx, "value_length", k16, 1, MOH_E_CONFIG, "llama.attention.value_length is 2", &c);
    kvs k16b[] = {{"llama.attention.key_length", MOH_GGUF_U32, 0, 0, &U8}};
    cfg_of(ctx, "key_length != C/h", k16b, 1, MOH_E_CONFIG, "llama.attention.value_length is 4, expected 8", &c);
    /* experts: llama.cpp builds a mixture-of-experts FFN */
    kvs k17[] = {{"llama.expert_count", MOH_GGUF_U32, 0, 0, &U8}, {"llama.expert_used_count", MOH_GGUF_U32, 0, 0, &U2}};
    cfg_of(ctx, "experts", k17, 2, MOH_E_CONFIG, "llama.expert_count", &c);
    kvs k18[] = {{"llama.expert_used_count", MOH_GGUF_U32, 0, 0, &U2}};
    cfg_of(ctx, "experts used", k18, 1, MOH_E_CONFIG, "llama.expert_used_count", &c);
    kvs k19[] = {{"llama.expert_count", MOH_GGUF_U32, 0, 0, &u0}};
    cfg_of(ctx, "expert_count 0", k19, 1, MOH_OK, NULL, &c);
    /* layers: LLAMA_MAX_LAYERS 512 */
    kvs k20[] = {{"llama.block_count", MOH_GGUF_U32, 0, 0, &u513}};
    cfg_of(ctx, "513 layers", k20, 1, MOH_E_CONFIG, "llama.block_count", &c);
    /* per-layer arrays (get_key_or_arr): n_layer values of i32 / u32 / bool, one width for moh */
    kvs k21[] = {{"llama.feed_forward_length", MOH_GGUF_ARRAY, MOH_GGUF_I32, 1, ff1},
                 {"llama.attention.head_count", MOH_GGUF_ARRAY, MOH_GGUF_U32, 1, hh1},
                 {"llama.attention.head_count_kv", MOH_GGUF_ARRAY, MOH_GGUF_BOOL, 1, bb1}};
    CHECK(ctx, !cfg_of(ctx, "per-layer arrays", k21, 3, MOH_OK, NULL, &c) && c.intermediate_size == 16 &&
          c.num_attention_heads == 2 && c.num_key_value_heads == 1, "per-layer arrays: I %d h %d hkv %d", c.intermediate_size,
          c.num_attention_heads, c.num_key_value_heads);
    kvs k22[] = {{"llama.feed_forward_length", MOH_GGUF_ARRAY, MOH_GGUF_I32, 2, ff2}};
    cfg_of(ctx, "array length", k22, 1, MOH_E_FORMAT, "llama.feed_forward_length' has 2 values, expected 1", &c);
    kvs k23[] = {{"llama.block_count", MOH_GGUF_U32, 0, 0, &U2}, {"llama.feed_forward_length", MOH_GGUF_ARRAY, MOH_GGUF_I32, 2,
                 (const int32_t[]){16, 32}}};
    cfg_of(ctx, "per-layer widths", k23, 2, MOH_E_CONFIG, "for layer 1", &c);
    kvs k24[] = {{"llama.attention.head_count", MOH_GGUF_ARRAY, MOH_GGUF_F32, 1, &f2}};
    cfg_of(ctx, "array of f32", k24, 1, MOH_E_FORMAT, "llama.attention.head_count", &c);
    /* llama.vocab_size must be the rows of token_embd */
    kvs k25[] = {{"llama.vocab_size", MOH_GGUF_U32, 0, 0, &u5}};
    cfg_of(ctx, "vocab_size 5", k25, 1, MOH_E_SHAPE, "llama.vocab_size is 5, expected 4", &c);
    kvs k26[] = {{"llama.vocab_size", MOH_GGUF_U32, 0, 0, &U4}};
    cfg_of(ctx, "vocab_size 4", k26, 1, MOH_OK, NULL, &c);
    /* split files */
    kvs k27[] = {{"split.count", MOH_GGUF_U16, 0, 0, &s2}};
    cfg_of(ctx, "split 2", k27, 1, MOH_E_CONFIG, "split.count is 2", &c);
    kvs k28[] = {{"split.count", MOH_GGUF_U16, 0, 0, &s1}};
    cfg_of(ctx, "split 1", k28, 1, MOH_OK, NULL, &c);
    kvs k29[] = {{"split.count", MOH_GGUF_U32, 0, 0, &u3}};
    cfg_of(ctx, "split u32", k29, 1, MOH_E_FORMAT, "split.count", &c);
    (void)i8;
}

/* check_tensor_dims compares all 4 ne: a norm stored as [8, 1] (2 dims) is the same [8]; the
 * weights load, and the linear RoPE scaling survives export and re-reading. */
static void tensor_dims(test_ctx *ctx) {
    buf w = llama_file(NULL, 0, true);
    moh_gguf *g = NULL;
    moh_error err = {0};
    moh_lm_config c;
    float *data = NULL;
    int rc = moh_gguf_parse(&g, w.b, w.n, "n.gguf", &err);
    if (!rc) rc = lm_gguf_config(g, "n.gguf", &c, &err);
    model_tensor *ts = NULL;
    int nt = 0;
    if (!rc && (ts = lm_tensors(&c, &nt)) && nt > 0) {
        size_t total = 0;
        for (int i = 0; i < nt; i++)
            if (ts[i].offset + ts[i].numel > total) total = ts[i].offset + ts[i].numel;
        data = calloc(total, sizeof *data);
        rc = lm_gguf_weights(g, "n.gguf", &c, data, NULL, &err);
    }
    CHECK(ctx, rc == MOH_OK && data, "norm as [8, 1]: %s", err.msg);
    if (!rc && data) {
        char path[] = "/tmp/moh_ropelin_XXXXXX";
        const int fd = mkstemp(path);
        if (fd >= 0) close(fd);
        c.rope_scaling = (moh_rope_scaling){.type = MOH_ROPE_LINEAR, .factor = 2.0};
        static const char *const tk[] = {"a", "b", "c", "d"};
        bpe_tok *tok = NULL;
        const bpe_spec sp = {.tokens = tk, .n_tokens = 4, .pre = BPE_PRE_GPT2};
        rc = bpe_create(&tok, &sp, &err);
        if (!rc) rc = lm_gguf_export(&c, data, tok, -1, NULL, NULL, path, MOH_GGML_F32, &err);
        bpe_free(tok);
        moh_gguf *h = NULL;
        moh_lm_config d;
        if (!rc) rc = moh_gguf_open(&h, path, &err);
        if (!rc) rc = lm_gguf_config(h, path, &d, &err);
        CHECK(ctx, rc == MOH_OK && d.rope_scaling.type == MOH_ROPE_LINEAR && d.rope_scaling.factor == 2.0,
              "linear RoPE export: %s", rc ? err.msg : "type or factor lost");
        moh_gguf_close(h);
        remove(path);
    }
    free(ts);
    free(data);
    moh_gguf_close(g);
    free(w.b);
}

/* The tokenizer from GGUF metadata (text/bpe_gguf.c) equals the one from the same vocabulary's
 * tokenizer.json (tests/fixtures/bpe, checked against Hugging Face tokenizers by test_bpe): the
 * same ids on the stress text, special tokens included. */
static void tokenizer(test_ctx *ctx) {
    moh_error err = {0};
    moh_gguf *g = NULL;
    bpe_tok *a = NULL, *b = NULL;
    int rc = moh_gguf_open(&g, "tests/fixtures/bpe/smollm.gguf", &err);
    if (!rc) rc = bpe_from_gguf(&a, g, "smollm.gguf", &err);
    CHECK(ctx, rc == MOH_OK, "tokenizer from gguf: %s", err.msg);
    rc = bpe_load_tokenizer_json(&b, "tests/fixtures/bpe/smollm.json", &err);
    CHECK(ctx, rc == MOH_OK, "tokenizer.json: %s", err.msg);
    size_t len = 0;
    char *text = fs_read_file("tests/fixtures/bpe/case_stress.txt", 1 << 20, &len, &err);
    CHECK(ctx, text != NULL, "stress text: %s", err.msg);
    if (a && b && text) {
        int *ia = NULL, *ib = NULL;
        size_t na = 0, nb = 0;
        static const char special[] = "<|im_start|>user 12 + 34<|im_end|>";
        for (int k = 0; k < 2; k++) {
            const char *s = k ? special : text;
            const size_t n = k ? strlen(special) : len;
            CHECK(ctx, !bpe_encode(a, (const uint8_t *)s, n, true, &ia, &na, &err) &&
                  !bpe_encode(b, (const uint8_t *)s, n, true, &ib, &nb, &err), "encode: %s", err.msg);
            CHECK(ctx, na == nb && na > 0 && !memcmp(ia, ib, sizeof(int) * na), "case %d: %zu vs %zu ids", k, na, nb);
            if (k) CHECK(ctx, na > 2 && ia[0] == 1 && ia[na - 1] == 2, "special tokens first and last: %d .. %d", ia[0],
                         ia[na - 1]);
            free(ia);
            free(ib);
            ia = ib = NULL;
        }
    }
    free(text);
    bpe_free(a);
    bpe_free(b);
    moh_gguf_close(g);
}

/* Tokenizer metadata as llama.cpp's loader takes it (llama-vocab.cpp impl::load): a special-token
 * id that is not u32, a flag that is not bool, a pre that is not a string are refused in one line
 * naming the key; an id >= n_tokens, a token_type other than unknown / control / user-defined and
 * a chat template that is not a string are ignored (the types are ordinary tokens; the template
 * is not exported). */
static void tokenizer_metadata(test_ctx *ctx) {
    static const char *const toks[] = {"a", "b", "ab", "<s>"}, *const merges[] = {"a b"};
    enum { OK_RANGE, OK_TEMPLATE, BAD_EOS, BAD_PAD, BAD_FLAG, BAD_PRE, N_CASES };
    char path[] = "/tmp/moh_tokmeta_XXXXXX";
    const int fd = mkstemp(path);
    CHECK(ctx, fd >= 0, "mkstemp");
    if (fd < 0) return;
    close(fd);
    uint64_t rng = 91;
    for (int c = 0; c < N_CASES; c++) {
        moh_error err = {0};
        moh_gguf_writer *w = NULL;
        if (moh_gguf_writer_new(&w, &err)) break;
        /* types of a, b, ab: random values outside CONTROL / USER_DEFINED (in the enum or not) */
        static const int32_t odd[] = {-7, 0, 1, 5, 6, 7, 99, 1 << 20}; /* 2 (unknown) is literal: tokenizer_rules */
        int32_t types[4] = {0, 0, 0, 3};
        for (int i = 0; i < 3; i++) types[i] = odd[moh_rng_next(&rng) % (sizeof odd / sizeof *odd)];
        moh_gguf_add_str(w, "tokenizer.ggml.model", "gpt2");
        if (c == BAD_PRE) moh_gguf_add_u32(w, "tokenizer.ggml.pre", 2);
        else moh_gguf_add_str(w, "tokenizer.ggml.pre", "smollm");
        moh_gguf_add_arr_str(w, "tokenizer.ggml.tokens", toks, 4);
        moh_gguf_add_arr_i32(w, "tokenizer.ggml.token_type", types, 4);
        moh_gguf_add_arr_str(w, "tokenizer.ggml.merges", merges, 1);
        if (c == OK_RANGE) {
            moh_gguf_add_u32(w, "tokenizer.ggml.bos_token_id", 4);
            moh_gguf_add_u32(w, "tokenizer.ggml.eos_token_id", 1u << 31);
        }
        if (c == OK_TEMPLATE) moh_gguf_add_u32(w, "tokenizer.chat_template", 7);
        if (c == BAD_EOS) moh_gguf_add_i32(w, "tokenizer.ggml.eos_token_id", 3);
        if (c == BAD_PAD) moh_gguf_add_str(w, "tokenizer.ggml.padding_token_id", "3");
        if (c == BAD_FLAG) moh_gguf_add_u32(w, "tokenizer.ggml.add_bos_token", 1);
        int rc = moh_gguf_write(w, path, &err);
        moh_gguf_writer_free(w);
        moh_gguf *g = NULL;
        bpe_tok *t = NULL;
        if (!rc) rc = moh_gguf_open(&g, path, &err);
        CHECK(ctx, rc == MOH_OK, "case %d: write / open: %s", c, err.msg);
        if (rc) break;
        rc = bpe_from_gguf(&t, g, "meta.gguf", &err);
        if (c < BAD_EOS) {
            CHECK(ctx, rc == MOH_OK, "case %d: %s", c, err.msg);
            int *ids = NULL;
            size_t n = 0;
            CHECK(ctx, t && !bpe_encode(t, (const uint8_t *)"ab<s>a", 6, true, &ids, &n, &err) && n == 3 && ids[0] == 2 &&
                  ids[1] == 3 && ids[2] == 0, "case %d (types %d %d %d): ids %zu", c, types[0], types[1], types[2], n);
            free(ids);
            moh_gguf_writer *w2 = NULL; /* the export keeps the out-of-range ids, drops a non-text template */
            if (t && !moh_gguf_writer_new(&w2, &err)) {
                CHECK(ctx, bpe_to_gguf(t, -1, NULL, g, w2, &err) == MOH_OK && moh_gguf_write(w2, path, &err) == MOH_OK,
                      "case %d: export: %s", c, err.msg);
                moh_gguf_writer_free(w2);
                moh_gguf *g2 = NULL;
                uint32_t eos = 0;
                if (!moh_gguf_open(&g2, path, &err)) {
                    CHECK(ctx, moh_gguf_find_key(g2, "tokenizer.chat_template") < 0, "case %d: template exported", c);
                    CHECK(ctx, c != OK_RANGE || (!moh_gguf_get_u32(g2, "tokenizer.ggml.eos_token_id", &eos, &err) &&
                                                 eos == 1u << 31), "case %d: eos id not kept", c);
                    moh_gguf_close(g2);
                }
            }
        } else {
            static const char *const key[] = {[BAD_EOS] = "tokenizer.ggml.eos_token_id u32",
                                              [BAD_PAD] = "tokenizer.ggml.padding_token_id u32",
                                              [BAD_FLAG] = "tokenizer.ggml.add_bos_token bool",
                                              [BAD_PRE] = "tokenizer.ggml.pre string"};
            char k[64], ty[16];
            sscanf(key[c], "%63s %15s", k, ty);
            CHECK(ctx, rc == MOH_E_FORMAT && !t && !strncmp(err.msg, "meta.gguf: ", 11) && strstr(err.msg, k) &&
                  strstr(err.msg, ty) && !strchr(err.msg, '\n'), "case %d: rc %d: %s", c, rc, err.msg);
        }
        bpe_free(t);
        moh_gguf_close(g);
    }
    remove(path);
}

/* A tokenizer-only GGUF: base keys (gpt2, smollm, tokens t[nt], merges m[nm]) unless extra names
 * them, then extra; bpe_from_gguf's rc, *out the tokenizer (or NULL). */
static int tok_of(test_ctx *ctx, const char *what, const char *const *t, int nt, const char *const *m, int nm,
                  const kvs *extra, int n_extra, int want, const char *word, bpe_tok **out) {
    const kvs base[] = {{"tokenizer.ggml.model", MOH_GGUF_STRING, 0, 0, "gpt2"},
                        {"tokenizer.ggml.pre", MOH_GGUF_STRING, 0, 0, "smollm"},
                        {"tokenizer.ggml.tokens", MOH_GGUF_ARRAY, MOH_GGUF_STRING, (uint64_t)nt, t},
                        {"tokenizer.ggml.merges", MOH_GGUF_ARRAY, MOH_GGUF_STRING, (uint64_t)nm, m}};
    int n_kv = 0;
    buf w = {0};
    for (int pass = 0; pass < 2; pass++) {
        if (pass) {
            put(&w, "GGUF", 4);
            put32(&w, 3);
            put64(&w, 0);
            put64(&w, (uint64_t)n_kv);
        }
        for (int i = 0; i < 4; i++) {
            bool over = false;
            for (int j = 0; j < n_extra; j++) over |= !strcmp(base[i].key, extra[j].key);
            if (!over) pass ? putkv(&w, &base[i]) : (void)n_kv++;
        }
        for (int j = 0; j < n_extra; j++)
            if (extra[j].type >= 0) pass ? putkv(&w, &extra[j]) : (void)n_kv++;
    }
    moh_gguf *g = NULL;
    moh_error err = {0};
    *out = NULL;
    int rc = moh_gguf_parse(&g, w.b, w.n, "t.gguf", &err);
    CHECK(ctx, rc == MOH_OK, "%s: parse: %s", what, err.msg);
    if (!rc) rc = bpe_from_gguf(out, g, "t.gguf", &err);
    CHECK(ctx, rc == want, "%s: rc %d (expected %d): %s", what, rc, want, rc ? err.msg : "accepted");
    if (rc && want)
        CHECK(ctx, !strncmp(err.msg, "t.gguf: ", 8) && !strchr(err.msg, '\n') && (!word || strstr(err.msg, word)),
              "%s: message '%s' (expected the file and '%s')", what, err.msg, word ? word : "");
    if (rc) printf("  [%s] %s\n", what, err.msg);
    moh_gguf_close(g);
    free(w.b);
    return rc;
}

/* The ids of text with t (parse_added), as "a b c" into s. */
static const char *ids_of(const bpe_tok *t, const char *text, char *s, size_t cap) {
    int *ids = NULL;
    size_t n = 0, o = 0;
    moh_error err;
    s[0] = '\0';
    if (t && !bpe_encode(t, (const uint8_t *)text, strlen(text), true, &ids, &n, &err))
        for (size_t i = 0; i < n && o + 12 < cap; i++) o += (size_t)snprintf(s + o, cap - o, "%s%d", i ? " " : "", ids[i]);
    free(ids);
    return s;
}

/* The ids of text with t and its post-processor (bpe_encode_special), as "a b c" into s. */
static const char *special_ids_of(const bpe_tok *t, const char *text, char *s, size_t cap) {
    int *ids = NULL;
    size_t n = 0, o = 0;
    moh_error err;
    s[0] = '\0';
    if (t && !bpe_encode_special(t, (const uint8_t *)text, strlen(text), &ids, &n, &err))
        for (size_t i = 0; i < n && o + 12 < cap; i++) o += (size_t)snprintf(s + o, cap - o, "%s%d", i ? " " : "", ids[i]);
    free(ids);
    return s;
}

/* tokenizer.ggml.* as llama-vocab.cpp's load takes them: the pre-tokenizer by llama.cpp's names
 * ("default" or none: its default regex list; "gpt2" unknown), the flags (add_bos / add_eos
 * honoured, add_bos true by default for llama-bpe; add_sep / add_space_prefix true refused), token_type (>= n_tokens i32; unknown = 2 matched literally as control), scores
 * (f32 / i32, >= n_tokens), empty tokens named "[EMPTY_<id>]". */
static void tokenizer_rules(test_ctx *ctx) {
    static const char *const t[] = {"1", "2", "3", "4", "12", "123", "1234", "a", "<u>"},
                             *const m[] = {"1 2", "12 3", "123 4"};
    const int32_t types[10] = {1, 1, 1, 1, 1, 1, 1, 1, 2, 1};
    const float scores[9] = {0};
    const bool yes = true, no = false;
    char s[128];
    bpe_tok *k = NULL;
    /* gpt-2: "1234" is one piece; llama.cpp's default list splits digits by 3: 123 | 4 */
    kvs p1[] = {{"tokenizer.ggml.pre", MOH_GGUF_STRING, 0, 0, "gpt-2"}};
    tok_of(ctx, "gpt-2", t, 9, m, 3, p1, 1, MOH_OK, NULL, &k);
    CHECK(ctx, !strcmp(ids_of(k, "1234", s, sizeof s), "6"), "gpt-2 1234: %s", s);
    bpe_free(k);
    kvs p2[] = {{"tokenizer.ggml.pre", MOH_GGUF_STRING, 0, 0, "default"}};
    tok_of(ctx, "default", t, 9, m, 3, p2, 1, MOH_OK, NULL, &k);
    CHECK(ctx, !strcmp(ids_of(k, "1234", s, sizeof s), "5 3"), "default 1234: '%s' (expected 5 3)", s);
    bpe_free(k);
    kvs p3[] = {{"tokenizer.ggml.pre", -1, 0, 0, NULL}};
    tok_of(ctx, "no pre", t, 9, m, 3, p3, 1, MOH_OK, NULL, &k);
    CHECK(ctx, !strcmp(ids_of(k, "1234", s, sizeof s), "5 3"), "no pre 1234: '%s' (expected 5 3)", s);
    bpe_free(k);
    { /* exported from a GGUF without pre: "default", what llama.cpp read it as */
        char path[] = "/tmp/moh_nopre_XXXXXX";
        const int fd = mkstemp(path);
        if (fd >= 0) close(fd);
        moh_error err = {0};
        moh_gguf_writer *w = NULL, *w2 = NULL;
        moh_gguf *g = NULL, *g2 = NULL;
        const char *pre = NULL;
        int rc = moh_gguf_writer_new(&w, &err);
        if (!rc) {
            moh_gguf_add_str(w, "tokenizer.ggml.model", "gpt2");
            moh_gguf_add_arr_str(w, "tokenizer.ggml.tokens", t, 9);
            moh_gguf_add_arr_str(w, "tokenizer.ggml.merges", m, 3);
            rc = moh_gguf_write(w, path, &err);
        }
        if (!rc) rc = moh_gguf_open(&g, path, &err);
        if (!rc) rc = bpe_from_gguf(&k, g, path, &err);
        if (!rc) rc = moh_gguf_writer_new(&w2, &err);
        if (!rc) rc = bpe_to_gguf(k, -1, NULL, g, w2, &err);
        if (!rc) rc = moh_gguf_write(w2, path, &err);
        if (!rc) rc = moh_gguf_open(&g2, path, &err);
        if (!rc) rc = moh_gguf_get_str(g2, "tokenizer.ggml.pre", &pre, NULL, &err);
        CHECK(ctx, rc == MOH_OK && !strcmp(pre, "default"), "export without pre: %s", rc ? err.msg : pre);
        bpe_free(k);
        moh_gguf_writer_free(w);
        moh_gguf_writer_free(w2);
        moh_gguf_close(g);
        moh_gguf_close(g2);
        remove(path);
    }
    kvs p4[] = {{"tokenizer.ggml.pre", MOH_GGUF_STRING, 0, 0, "gpt2"}};
    tok_of(ctx, "pre gpt2", t, 9, m, 3, p4, 1, MOH_E_CONFIG, "tokenizer.ggml.pre is 'gpt2'", &k);
    kvs p5[] = {{"tokenizer.ggml.pre", MOH_GGUF_STRING, 0, 0, "qwen2"}};
    tok_of(ctx, "pre qwen2", t, 9, m, 3, p5, 1, MOH_E_CONFIG, "qwen2", &k);
    /* flags: add_bos / add_eos put the bos / eos id around a prompt (bpe_encode_special, as
     * llama_tokenize with add_special); add_bos is true by default for llama-bpe; the ids default
     * to 11 (no such token among 9: refused); add_sep / add_space_prefix true refused */
    const uint32_t id8 = 8, id7 = 7, id99 = 99;
    kvs f1[] = {{"tokenizer.ggml.add_bos_token", MOH_GGUF_BOOL, 0, 0, &yes},
                {"tokenizer.ggml.bos_token_id", MOH_GGUF_U32, 0, 0, &id8}};
    tok_of(ctx, "add_bos", t, 9, m, 3, f1, 2, MOH_OK, NULL, &k);
    CHECK(ctx, !strcmp(special_ids_of(k, "12a", s, sizeof s), "8 0 1 7"), "add_bos: '%s' (expected 8 0 1 7: smollm digits)", s);
    CHECK(ctx, !strcmp(ids_of(k, "12a", s, sizeof s), "0 1 7"), "add_bos, no specials: '%s' (expected 0 1 7)", s);
    bpe_free(k);
    kvs f1b[] = {{"tokenizer.ggml.add_bos_token", MOH_GGUF_BOOL, 0, 0, &yes}};
    tok_of(ctx, "add_bos, no bos id", t, 9, m, 3, f1b, 1, MOH_E_CONFIG, "bos_token_id names no token", &k);
    kvs f1c[] = {{"tokenizer.ggml.add_bos_token", MOH_GGUF_BOOL, 0, 0, &yes},
                 {"tokenizer.ggml.bos_token_id", MOH_GGUF_U32, 0, 0, &id99}};
    tok_of(ctx, "add_bos, bos id 99", t, 9, m, 3, f1c, 2, MOH_E_CONFIG, "bos_token_id names no token", &k);
    kvs f2[] = {{"tokenizer.ggml.add_eos_token", MOH_GGUF_BOOL, 0, 0, &yes},
                {"tokenizer.ggml.eos_token_id", MOH_GGUF_U32, 0, 0, &id7}};
    tok_of(ctx, "add_eos", t, 9, m, 3, f2, 2, MOH_OK, NULL, &k);
    CHECK(ctx, !strcmp(special_ids_of(k, "1", s, sizeof s), "0 7"), "add_eos: '%s' (expected 0 7)", s);
    bpe_free(k);
    kvs f3[] = {{"tokenizer.ggml.add_space_prefix", MOH_GGUF_BOOL, 0, 0, &yes}};
    tok_of(ctx, "add_space_prefix", t, 9, m, 3, f3, 1, MOH_E_CONFIG, "tokenizer.ggml.add_space_prefix is true", &k);
    kvs f4[] = {{"tokenizer.ggml.add_sep_token", MOH_GGUF_BOOL, 0, 0, &yes}};
    tok_of(ctx, "add_sep", t, 9, m, 3, f4, 1, MOH_E_CONFIG, "tokenizer.ggml.add_sep_token is true", &k);
    kvs f5[] = {{"tokenizer.ggml.pre", MOH_GGUF_STRING, 0, 0, "llama-bpe"}};
    tok_of(ctx, "llama-bpe, add_bos absent", t, 9, m, 3, f5, 1, MOH_E_CONFIG, "add_bos_token is true but", &k);
    kvs f5b[] = {{"tokenizer.ggml.pre", MOH_GGUF_STRING, 0, 0, "llama-bpe"},
                 {"tokenizer.ggml.bos_token_id", MOH_GGUF_U32, 0, 0, &id8}};
    tok_of(ctx, "llama-bpe, add_bos absent, bos id", t, 9, m, 3, f5b, 2, MOH_OK, NULL, &k);
    CHECK(ctx, !strcmp(special_ids_of(k, "a", s, sizeof s), "8 7"), "llama-bpe default bos: '%s' (expected 8 7)", s);
    bpe_free(k);
    kvs f6[] = {{"tokenizer.ggml.pre", MOH_GGUF_STRING, 0, 0, "llama-bpe"},
                {"tokenizer.ggml.add_bos_token", MOH_GGUF_BOOL, 0, 0, &no},
                {"tokenizer.ggml.add_space_prefix", MOH_GGUF_BOOL, 0, 0, &no}};
    tok_of(ctx, "llama-bpe, add_bos false", t, 9, m, 3, f6, 3, MOH_OK, NULL, &k);
    CHECK(ctx, !strcmp(special_ids_of(k, "a", s, sizeof s), "7"), "llama-bpe, add_bos false: '%s' (expected 7)", s);
    bpe_free(k);
    /* a tokenizer.json post-processor exported as add_bos / add_eos with the ids, and read back to
     * the same ids; two ids before a text (GGUF cannot say it) or an eos other than the
     * end-of-turn id refused */
    for (int c = 0; c < 4; c++) {
        const int pre1[1] = {8}, pre2[2] = {8, 7}, suf[1] = {6};
        const int added[1] = {8};
        bpe_spec sp = {.tokens = t, .n_tokens = 9, .merges = m, .n_merges = 3, .added = added, .n_added = 1,
                       .pre = BPE_PRE_SMOLLM, .post_prefix = c == 2 ? pre2 : pre1, .n_post_prefix = c == 2 ? 2 : 1,
                       .post_suffix = suf, .n_post_suffix = c == 1 || c == 3};
        bpe_tok *a = NULL, *b = NULL;
        moh_error err = {0};
        moh_gguf_writer *w = NULL;
        moh_gguf *g = NULL;
        char path[] = "/tmp/moh_post_XXXXXX", s2[128];
        const int fd = mkstemp(path);
        if (fd >= 0) close(fd);
        int rc = bpe_create(&a, &sp, &err);
        if (!rc) rc = moh_gguf_writer_new(&w, &err);
        if (!rc) rc = bpe_to_gguf(a, c == 3 ? 7 : -1, NULL, NULL, w, &err);
        if (c >= 2) {
            CHECK(ctx, rc == MOH_E_ARG && strstr(err.msg, "post_processor") && strstr(err.msg, "add_bos_token"),
                  "export post-processor case %d: rc %d: %s", c, rc, err.msg);
        } else {
            if (!rc) rc = moh_gguf_write(w, path, &err);
            if (!rc) rc = moh_gguf_open(&g, path, &err);
            if (!rc) rc = bpe_from_gguf(&b, g, path, &err);
            CHECK(ctx, rc == MOH_OK, "export post-processor case %d: %s", c, err.msg);
            bool add_eos = !c;
            if (!rc) rc = moh_gguf_get_bool(g, "tokenizer.ggml.add_eos_token", &add_eos, &err);
            CHECK(ctx, rc == MOH_OK && add_eos == (c == 1), "case %d: add_eos_token %d", c, add_eos);
            CHECK(ctx, !strcmp(special_ids_of(a, "a1", s, sizeof s), special_ids_of(b, "a1", s2, sizeof s2)) &&
                           !strcmp(s, c ? "8 7 0 6" : "8 7 0"), "case %d: ids '%s' then '%s'", c, s, s2);
        }
        bpe_free(a);
        bpe_free(b);
        moh_gguf_writer_free(w);
        moh_gguf_close(g);
        remove(path);
    }
    /* token types: longer than the tokens is fine, shorter not; unknown (2) is matched literally */
    kvs y1[] = {{"tokenizer.ggml.token_type", MOH_GGUF_ARRAY, MOH_GGUF_I32, 10, types}};
    tok_of(ctx, "types 10 of 9", t, 9, m, 3, y1, 1, MOH_OK, NULL, &k);
    CHECK(ctx, !strcmp(ids_of(k, "1<u>a", s, sizeof s), "0 8 7"), "unknown-type token literal: '%s' (expected 0 8 7)", s);
    bpe_free(k);
    kvs y2[] = {{"tokenizer.ggml.token_type", MOH_GGUF_ARRAY, MOH_GGUF_I32, 8, types}};
    tok_of(ctx, "types 8 of 9", t, 9, m, 3, y2, 1, MOH_E_FORMAT, "tokenizer.ggml.token_type holds 8", &k);
    /* scores */
    kvs c1[] = {{"tokenizer.ggml.scores", MOH_GGUF_ARRAY, MOH_GGUF_F32, 9, scores}};
    tok_of(ctx, "scores f32", t, 9, m, 3, c1, 1, MOH_OK, NULL, &k);
    bpe_free(k);
    kvs c2[] = {{"tokenizer.ggml.scores", MOH_GGUF_ARRAY, MOH_GGUF_F32, 8, scores}};
    tok_of(ctx, "scores short", t, 9, m, 3, c2, 1, MOH_E_FORMAT, "tokenizer.ggml.scores holds 8", &k);
    kvs c3[] = {{"tokenizer.ggml.scores", MOH_GGUF_ARRAY, MOH_GGUF_STRING, 3, m}};
    tok_of(ctx, "scores str", t, 9, m, 3, c3, 1, MOH_E_FORMAT, "tokenizer.ggml.scores is an array of str", &k);
    kvs c4[] = {{"tokenizer.ggml.token_type_count", MOH_GGUF_I32, 0, 0, &(int32_t){2}}};
    tok_of(ctx, "token_type_count i32", t, 9, m, 3, c4, 1, MOH_E_FORMAT, "tokenizer.ggml.token_type_count", &k);
    /* empty tokens: "[EMPTY_<id>]", so two of them are not duplicates */
    static const char *const te[] = {"a", "", "b", ""};
    tok_of(ctx, "empty tokens", te, 4, NULL, 0, NULL, 0, MOH_OK, NULL, &k);
    CHECK(ctx, k && bpe_token_str(k, 1) && !strcmp(bpe_token_str(k, 1), "[EMPTY_1]") && bpe_token_str(k, 3) &&
          !strcmp(bpe_token_str(k, 3), "[EMPTY_3]"), "empty tokens named: %s", k ? bpe_token_str(k, 1) : "(none)");
    bpe_free(k);
}

/* Bits per byte of a BPE model, as moh eval computes it (open_data's token chunks, model_evaluate
 * over shards of 2 rows), equals a hand computation: the text tokenized once, cut into chunks of
 * T + 1 ids, each chunk's predictions scored from its own forward's logits with a float64
 * log-softmax, the cross-entropy in bits over the bytes of the predicted tokens only (the first
 * token of each chunk is context). The text: random words, multi-byte characters and special
 * tokens, so tokens decode to 1..many bytes. */
static void bits_per_byte(test_ctx *ctx) {
    static const char *const words[] = {" the", " beginning", " God", " ½", " café", " 😀", "<|im_end|>", " 1234",
                                        "\n", " Ελληνικά", " and", ",", " earth."};
    char path[] = "/tmp/moh_bpb_XXXXXX";
    const int fd = mkstemp(path);
    CHECK(ctx, fd >= 0, "mkstemp");
    if (fd < 0) return;
    char text[4096];
    size_t len = 0;
    uint64_t rng = 77;
    while (len < 1500) {
        const char *w = words[moh_rng_next(&rng) % (sizeof words / sizeof words[0])];
        memcpy(text + len, w, strlen(w));
        len += strlen(w);
    }
    CHECK(ctx, write(fd, text, len) == (ssize_t)len, "write %s", path);
    close(fd);
    moh_error err = {0};
    model m = {0};
    int rc = model_open(&m, DIR "/tiny-chat.gguf", &err);
    CHECK(ctx, rc == MOH_OK && m.tokenizer, "open tiny-chat.gguf: %s", err.msg);
    const int T = 16;
    train_hparams hp;
    batch_source src = {0};
    model_shards w = {0};
    model_eval r = {0};
    if (!rc) {
        m.fam->train_defaults(&hp);
        hp.seq_len = T;
        hp.batch_size = 3;
        const data_request req = {.path = path, .hp = &hp, .eval_batch = 3, .train = false, .model_label = "tiny"};
        rc = m.fam->open_data(&m, &req, NULL, &src, &err);
        if (!rc) rc = model_shards_init(&w, &m, 3, T, 2, false, true, &err);
        if (!rc) rc = model_evaluate(&m, &w, &src, 0, NULL, &r, &err);
        CHECK(ctx, rc == MOH_OK, "evaluate: %s", err.msg);
    }
    int *ids = NULL;
    size_t n = 0;
    lm_acts_f32 a = {0};
    const moh_lm_config *cfg = m.cfg;
    if (!rc) rc = bpe_encode(m.tokenizer, (const uint8_t *)text, len, true, &ids, &n, &err);
    if (!rc) rc = lm_acts_init_f32(&a, cfg, 1, T, &err);
    CHECK(ctx, rc == MOH_OK, "hand computation: %s", err.msg);
    if (!rc) {
        double ce = 0.0, bytes = 0.0;
        long preds = 0, chunks = 0;
        for (size_t start = 0; start + 1 < n; start += (size_t)T + 1, chunks++) {
            const int k = (int)(n - start < (size_t)T + 1 ? n - start : (size_t)T + 1) - 1; /* predictions */
            lm_forward_f32(cfg, m.params, &a, ids + start, NULL, 1, k);
            for (int i = 0; i < k; i++) {
                const float *z = a.logits + (size_t)i * cfg->vocab_size;
                double mx = z[0], sum = 0.0;
                for (int v = 1; v < cfg->vocab_size; v++) mx = z[v] > mx ? z[v] : mx;
                for (int v = 0; v < cfg->vocab_size; v++) sum += exp(z[v] - mx);
                const int tgt = ids[start + (size_t)i + 1];
                ce += mx + log(sum) - z[tgt];
                const uint8_t *b;
                size_t bl = 0;
                bpe_token_bytes(m.tokenizer, tgt, &b, &bl, &err);
                bytes += (double)bl;
                preds++;
            }
        }
        const double bpb = ce / log(2.0) / bytes;
        CHECK(ctx, r.n == preds && r.bytes == bytes, "%ld predictions of %.0f bytes, by hand %ld of %.0f", r.n, r.bytes,
              preds, bytes);
        CHECK(ctx, fabs(r.metric - bpb) <= 1e-5 * bpb, "bits per byte %.8f, by hand %.8f", r.metric, bpb);
        CHECK(ctx, chunks > 3 && bytes > 1.5 * (double)preds && bytes < (double)len, "%ld chunks, %ld tokens of %.0f "
              "bytes (text %zu)", chunks, preds, bytes, len);
        printf("  bits per byte %.6f = by hand %.6f (%ld chunks, %ld predicted tokens, %.0f bytes)\n", r.metric, bpb,
               chunks, preds, bytes);
    }
    lm_acts_free_f32(&a);
    free(ids);
    model_eval_free(&r);
    if (m.fam) model_shards_free(&w, &m);
    batch_source_free(&src);
    model_free(&m);
    unlink(path);
}

int main(void) {
    test_ctx ctx = {0};
    same_model(&ctx);
    errors(&ctx);
    sharded(&ctx);
    tokenizer(&ctx);
    tokenizer_metadata(&ctx);
    llama_keys(&ctx);
    tensor_dims(&ctx);
    tokenizer_rules(&ctx);
    bits_per_byte(&ctx);
    return test_finish("test_lm_gguf", &ctx);
}
