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
#include "text/bpe_gguf.h"
#include "train/checkpoint.h"
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
 * naming the key; an id >= n_tokens, a token_type outside the enum and a chat template that is
 * not a string are ignored (the types are ordinary tokens; the template is not exported). */
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
        static const int32_t odd[] = {-7, 0, 1, 2, 5, 6, 7, 99, 1 << 20};
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
    bits_per_byte(&ctx);
    return test_finish("test_lm_gguf", &ctx);
}
