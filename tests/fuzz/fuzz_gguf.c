/* libFuzzer target: moh_gguf_parse on arbitrary bytes, then every getter on every key, a lookup of
 * every tensor by name, and moh_gguf_dequantize of every tensor (up to 2^16 elements) whose type
 * moh supports. Seed corpus: tests/fuzz/corpus/gguf (tools/ref/gguf_fixtures.py).
 * Invariants checked (trap on violation): a successful parse yields tensors whose data lie inside
 * the buffer at aligned, increasing offsets, unique keys and names that look themselves up; every
 * error message is one NUL-terminated line starting with the label; unsupported types are refused;
 * the LLaMA loader (models/lm_gguf.h) reads a config or refuses in one line, and loads finite weights. */
#include "io/gguf.h"
#include "models/lm_gguf.h"
#include "text/bpe_gguf.h"
#include "moh.h"

#include <math.h>

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_msg(const moh_error *err, int rc) {
    if (err->code != rc) __builtin_trap();
    if (!memchr(err->msg, '\0', sizeof err->msg)) __builtin_trap();
    if (strchr(err->msg, '\n')) __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    moh_gguf *g = NULL;
    moh_error err;
    memset(&err, 0, sizeof err);
    int rc = moh_gguf_parse(&g, data, size, "fuzz.gguf", &err);
    if (rc != MOH_OK) {
        check_msg(&err, rc);
        if (strncmp(err.msg, "fuzz.gguf: ", 11) != 0 || g != NULL) __builtin_trap();
        return 0;
    }
    uint32_t al = moh_gguf_alignment(g);
    if (al == 0 || (al & (al - 1)) || moh_gguf_data_offset(g) > size) __builtin_trap();
    for (int64_t i = 0; i < moh_gguf_n_kv(g); i++) {
        const char *k = moh_gguf_key(g, i);
        if (!k) __builtin_trap();
        int64_t j = moh_gguf_find_key(g, k);
        /* a key with a NUL byte inside is found by its C string only if a shorter key is that */
        if (j >= 0 && strcmp(moh_gguf_key(g, j), k) != 0) __builtin_trap();
        if (j != i) continue;
        moh_gguf_type ty = moh_gguf_kv_type(g, i);
        union { uint32_t u32; int32_t i32; float f32; uint64_t u64; int64_t i64; double f64; bool b; } v;
        const char *s;
        size_t sl;
        int r[8] = {moh_gguf_get_u32(g, k, &v.u32, &err), moh_gguf_get_i32(g, k, &v.i32, &err),
                    moh_gguf_get_f32(g, k, &v.f32, &err), moh_gguf_get_u64(g, k, &v.u64, &err),
                    moh_gguf_get_i64(g, k, &v.i64, &err), moh_gguf_get_f64(g, k, &v.f64, &err),
                    moh_gguf_get_bool(g, k, &v.b, &err), moh_gguf_get_str(g, k, &s, &sl, &err)};
        const moh_gguf_type want[8] = {MOH_GGUF_U32, MOH_GGUF_I32, MOH_GGUF_F32, MOH_GGUF_U64,
                                       MOH_GGUF_I64, MOH_GGUF_F64, MOH_GGUF_BOOL, MOH_GGUF_STRING};
        for (int m = 0; m < 8; m++)
            if ((r[m] == MOH_OK) != (ty == want[m])) __builtin_trap();
        if (ty == MOH_GGUF_STRING && strlen(s) > sl) __builtin_trap();
        moh_gguf_type et;
        uint64_t n;
        rc = moh_gguf_get_arr(g, k, &et, &n, &err);
        if ((rc == MOH_OK) != (ty == MOH_GGUF_ARRAY)) __builtin_trap();
        if (rc != MOH_OK) { check_msg(&err, rc); continue; }
        if (n > size) __builtin_trap();
        for (uint64_t e = 0; e < n && e < 64; e++) {
            if (et == MOH_GGUF_STRING) {
                if (moh_gguf_get_arr_str(g, k, e, &s, &sl, &err) != MOH_OK || strlen(s) > sl) __builtin_trap();
            } else if (et == MOH_GGUF_I32) {
                if (moh_gguf_get_arr_i32(g, k, e, &v.i32, &err) != MOH_OK) __builtin_trap();
            } else if (et == MOH_GGUF_F32) {
                if (moh_gguf_get_arr_f32(g, k, e, &v.f32, &err) != MOH_OK) __builtin_trap();
            }
        }
        rc = moh_gguf_get_arr_str(g, k, n, &s, &sl, &err);
        if (rc == MOH_OK) __builtin_trap();
        check_msg(&err, rc);
    }
    uint64_t prev_end = 0;
    for (int64_t i = 0; i < moh_gguf_n_tensors(g); i++) {
        const moh_gguf_tensor *t = moh_gguf_tensor_at(g, i);
        if (!t || moh_gguf_find_tensor(g, t->name) != t) __builtin_trap();
        if (t->offset % al || t->offset < prev_end) __builtin_trap();
        if (t->data < data || t->nbytes > size || (size_t)(t->data - data) > size - t->nbytes) __builtin_trap();
        prev_end = t->offset + t->nbytes;
        if (t->numel > (1 << 16)) continue;
        float *out = malloc(((size_t)t->numel + 1) * sizeof *out);
        if (!out) continue;
        rc = moh_gguf_dequantize(g, t, out, &err);
        if ((rc == MOH_OK) != moh_gguf_can_dequantize(t->type)) __builtin_trap();
        if (rc != MOH_OK) check_msg(&err, rc);
        free(out);
    }
    /* the LLaMA loader on whatever parsed: config from llama.* metadata, then (small models) the
     * weights; every failure a one-line error, a success a model with finite weights */
    moh_lm_config cfg;
    rc = lm_gguf_config(g, "fuzz.gguf", &cfg, &err);
    if (rc != MOH_OK) check_msg(&err, rc);
    else {
        int nt = 0;
        size_t total = 0;
        model_tensor *ts = lm_tensors(&cfg, &nt); /* the size first: metadata can ask for anything */
        for (int i = 0; ts && i < nt; i++) total += ts[i].numel;
        free(ts);
        lm_params_f32 p;
        if (total <= (1 << 20) && lm_params_init_f32(&p, &cfg, &err) == MOH_OK) {
            {
                rc = lm_gguf_weights(g, "fuzz.gguf", &cfg, p.data, NULL, &err);
                if (rc != MOH_OK) check_msg(&err, rc);
                for (size_t i = 0; rc == MOH_OK && i < p.n; i++)
                    if (!isfinite(p.data[i])) __builtin_trap();
                /* the file's quantised blocks: a table whose rows dequantise to the weights read */
                quant_table qt;
                if (rc == MOH_OK && (rc = lm_gguf_quant_table(g, "fuzz.gguf", &cfg, p.data, p.n, &qt, &err)) != MOH_OK)
                    check_msg(&err, rc);
                for (int i = 0; rc == MOH_OK && i < qt.n; i++) {
                    float row[4096];
                    const quant_mat *e = &qt.m[i];
                    if (e->cols > 4096) continue;
                    for (int64_t r = 0; r < e->rows; r++)
                        if (!quant_table_row(&qt, p.data + e->off + (size_t)(r * e->cols), e->cols, row) ||
                            memcmp(row, p.data + e->off + (size_t)(r * e->cols), sizeof(float) * (size_t)e->cols))
                            __builtin_trap();
                }
                /* the same file read for its blocks only: the other weights the same, held ones unwritten */
                lm_params_f32 p2;
                if (rc == MOH_OK && qt.n && lm_params_init_f32(&p2, &cfg, &err) == MOH_OK) {
                    qt.base = p2.data; /* (the same offsets over the second buffer) */
                    if (lm_gguf_weights(g, "fuzz.gguf", &cfg, p2.data, &qt, &err) != MOH_OK) __builtin_trap();
                    for (size_t i = 0; i < p.n; i++)
                        if (p2.data[i] != (quant_table_find(&qt, p2.data + i) ? 0.0f : p.data[i])) __builtin_trap();
                    qt.base = p.data;
                    lm_params_free_f32(&p2);
                }
                if (rc == MOH_OK) quant_table_free(&qt);
            }
            lm_params_free_f32(&p);
        }
    }
    /* the tokenizer front end: a tokenizer or a one-line error; a tokenizer encodes and decodes */
    bpe_tok *tok = NULL;
    rc = bpe_from_gguf(&tok, g, "fuzz.gguf", &err);
    if (rc != MOH_OK) check_msg(&err, rc);
    else {
        int *ids = NULL;
        size_t n = 0;
        static const uint8_t text[] = "Hello, world 123 \xc3\xa9\xf0\x9f\x99\x82 <|im_end|>";
        if (bpe_encode(tok, text, sizeof text - 1, true, &ids, &n, &err) == MOH_OK) {
            uint8_t *back = NULL;
            size_t bl = 0;
            if (bpe_decode(tok, ids, n, &back, &bl, &err) != MOH_OK) __builtin_trap();
            free(back);
        }
        free(ids);
        /* the export with g as the source: its extras copied (any types) or a one-line error */
        moh_gguf_writer *w = NULL;
        if (moh_gguf_writer_new(&w, &err) == MOH_OK) {
            rc = bpe_to_gguf(tok, 0, "t", g, w, &err);
            if (rc != MOH_OK) check_msg(&err, rc);
            moh_gguf_writer_free(w);
        }
        bpe_free(tok);
    }
    moh_gguf_close(g);
    return 0;
}
