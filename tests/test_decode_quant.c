/* Quantised KV-cache decoding (lm_kv_init_quant: ggml Q8_0 / Q4_0 / Q4_1 / Q5_0 / Q5_1 and K-quant
 * Q4_K / Q5_K / Q6_K weights (rows not of 256 in llama-quantize's fallback type), each product's
 * input quantised per 32 values, integer sums; bf16 K/V) on random weights, in each kernel set this
 * CPU has (AVX512-VNNI, AVX-VNNI, AVX2, portable):
 *  1. against fp32 decoding of the *dequantised* weights (each table matrix replaced by what its
 *     blocks hold): what is left is the activations' 8-bit rounding (relative step 1/254 of a
 *     block's largest value) and the bf16 K/V (2^-8), measured 2.7e-2 .. 4.3e-2 of the logits'
 *     largest magnitude (the worst logit of 256, after the ~9 chained products of two layers and
 *     the head); bound 6e-2. A wrong block, row order or scale gives errors of order 1;
 *  2. Q8_0 against fp32 decoding of the float weights: the weights' own rounding on top (bound
 *     0.1; 4-bit blocks of uniform random weights are ~7 % off each and carry no such bound);
 *  3. every product on the OpenMP team gives the same bits as every product on one thread;
 *  4. a model whose head_dim is not a multiple of 32 (W_O over heads runs fp32 on the float rows)
 *     and one whose layers are all in the table go through the same checks;
 *  5. parameters other than the table's are refused;
 *  6. GGUF: a dense GQA model written as a Q8_0 / Q4_1 / Q4_K / Q5_K GGUF (lm_gguf_export: attn_q / attn_k rows in
 *     ggml's RoPE order) and read back (model_open, lm_gguf_quant_table: rows put back in HF order)
 *     holds, row for row, the very blocks lm_quant_table makes from the float weights (quantisation
 *     is per row, so any row order mistake shows as a byte difference), and decodes from them
 *     within check 1's bound of fp32 decoding of the file's (dequantised) floats; opened for its
 *     blocks only (MODEL_OPEN_QUANT_ONLY: those matrices' float rows never written) it decodes,
 *     prefills (lm_encode) and extends a filled cache (lm_feed) to the same bits; the batched
 *     passes (bf16 GEMMs on the dequantised blocks where the CPU has them, else fp32; bf16 K/V) agree
 *     with fp32 decoding to 3e-2 (measured 1.0e-2 .. 1.4e-2 with bf16 GEMMs).
 * Routed tokens whose heads differ between the runs (a near tie flipped by rounding) are held to
 * 0.5 only; at most a fifth may flip. */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <unistd.h>

#include "io/gguf.h"
#include "models/lm_decode.h"
#include "models/lm_gguf.h"
#include "models/model.h"
#include "test_util.h"

typedef struct model_case {
    const char *name;
    moh_router router;
    int L, C, h, hkv, I;
    bool tied;
} model_case;

static unsigned selected(const float *gates, int h) {
    unsigned m = 0;
    for (int i = 0; i < h; i++)
        if (gates[i] != 0.0f) m |= 1u << i;
    return m;
}

/* Each matrix of t, dequantised, over its float rows in data (a copy of t's base). */
static int dequantise_table(const quant_table *t, float *data, moh_error *err) {
    for (int i = 0; i < t->n; i++) {
        const quant_mat *e = &t->m[i];
        for (int64_t r = 0; r < e->rows; r++)
            if (moh_gguf_dequantize_raw(e->type, e->data + (size_t)r * e->row_bytes, e->cols,
                                        data + e->off + (size_t)(r * e->cols), err))
                return err->code;
    }
    return MOH_OK;
}

static void model_check(test_ctx *ctx, const model_case *mc, int type, quant_isa isa) {
    moh_lm_config c = {0};
    c.hidden_size = mc->C;
    c.num_hidden_layers = mc->L;
    c.num_attention_heads = mc->h;
    c.num_key_value_heads = mc->hkv;
    c.intermediate_size = mc->I;
    c.vocab_size = 256;
    c.max_position_embeddings = 64;
    c.rms_norm_eps = 1e-5;
    c.rope_theta = 10000;
    c.tie_word_embeddings = mc->tied;
    c.router = mc->router;
    c.shared_heads = 1;
    c.top_k = mc->h / 2 - 1;
    c.load_balance_coef = 0.01;
    moh_error err = {0};
    CHECK(ctx, moh_lm_config_finalize(&c, mc->name, &err) == MOH_OK, "%s", err.msg);
    const int T = 29, V = 256;
    lm_params_f32 p, pd;
    lm_kv_cache kf, kd, kq, kt;
    quant_table qt;
    CHECK(ctx, lm_params_init_f32(&p, &c, &err) == MOH_OK, "%s", err.msg);
    CHECK(ctx, lm_params_init_f32(&pd, &c, &err) == MOH_OK, "%s", err.msg);
    lm_params_init_random(&c, &p, 5, 1.0 / sqrt((double)mc->C));
    CHECK(ctx, lm_quant_table(&c, &p, type, &qt, &err) == MOH_OK, "%s", err.msg);
    memcpy(pd.data, p.data, sizeof(float) * p.n);
    CHECK(ctx, dequantise_table(&qt, pd.data, &err) == MOH_OK, "%s", err.msg);
    /* every matrix-vector weight is in the table: 5 per layer (W_O only when read in whole blocks
     * per head) and the head (once when tied) */
    const int want = (mc->C / mc->h % 32 ? 4 : 5) * mc->L + 1;
    CHECK(ctx, qt.n == want, "%s: %d matrices in the table, expected %d", mc->name, qt.n, want);
    CHECK(ctx, lm_kv_init(&kf, &c, T, &err) == MOH_OK, "%s", err.msg);
    CHECK(ctx, lm_kv_init(&kd, &c, T, &err) == MOH_OK, "%s", err.msg);
    CHECK(ctx, lm_kv_init_quant(&kq, &c, &p, &qt, T, &err) == MOH_OK, "%s", err.msg);
    CHECK(ctx, lm_kv_init_quant(&kt, &c, &pd, &qt, T, &err) == MOH_E_ARG, "%s: a table of other parameters accepted",
          mc->name);
    CHECK(ctx, lm_kv_init_quant(&kt, &c, &p, &qt, T, &err) == MOH_OK, "%s", err.msg);
    kq.dc.qisa = kt.dc.qisa = isa;
    kq.dc.par_work = LONG_MAX; /* every product on this thread; kt: every product on the team */
    kt.dc.par_work = 1;
    int tok[29];
    test_rng rng = {99};
    for (int t = 0; t < T; t++) tok[t] = (int)(test_rng_u64(&rng) % V);
    float lf[256], ld[256], lq[256], lt[256];
    double wd = 0, wf = 0, wflip = 0;
    int flips = 0, team_differ = 0;
    const bool routed = mc->router != MOH_ROUTER_NONE;
    for (int t = 0; t < T; t++) {
        CHECK(ctx, lm_decode_step(&c, &p, &kf, tok[t], lf, &err) == MOH_OK, "%s", err.msg);
        CHECK(ctx, lm_decode_step(&c, &pd, &kd, tok[t], ld, &err) == MOH_OK, "%s", err.msg);
        CHECK(ctx, lm_decode_step(&c, &p, &kq, tok[t], lq, &err) == MOH_OK, "%s", err.msg);
        CHECK(ctx, lm_decode_step(&c, &p, &kt, tok[t], lt, &err) == MOH_OK, "%s", err.msg);
        team_differ += memcmp(lt, lq, sizeof lq) != 0;
        const double ed = test_rel_err_f32(lq, ld, V), ef = test_rel_err_f32(lq, lf, V);
        if (routed && selected(kq.router.gates, mc->h) != selected(kd.router.gates, mc->h)) {
            flips++;
            wflip = ed > wflip ? ed : wflip;
            continue;
        }
        wd = ed > wd ? ed : wd;
        wf = ef > wf ? ef : wf;
    }
    const double bound_d = 6e-2, bound_f = 0.1;
    const char *tn = quant_type_name(type), *in = quant_isa_name(isa);
    CHECK(ctx, team_differ == 0, "%s %s %s: %d of %d tokens' logits change on the team", mc->name, tn, in, team_differ, T);
    CHECK(ctx, flips <= T / 5, "%s %s %s: %d of %d tokens route differently", mc->name, tn, in, flips, T);
    CHECK(ctx, wd < bound_d, "%s %s %s: vs fp32 on the dequantised weights rel err %.3g > %.3g", mc->name, tn, in, wd,
          bound_d);
    if (type == MOH_GGML_Q8_0)
        CHECK(ctx, wf < bound_f, "%s %s %s: vs fp32 on the float weights rel err %.3g > %.3g", mc->name, tn, in, wf, bound_f);
    CHECK(ctx, wd > 1e-6, "%s %s %s: logits equal fp32 (%.3g): quantised products not used?", mc->name, tn, in, wd);
    CHECK(ctx, wflip < 0.5, "%s %s %s: a token routed differently is off by %.3g", mc->name, tn, in, wflip);
    lm_params_f32 q = p;
    q.data = p.data + 1;
    CHECK(ctx, lm_decode_step(&c, &q, &kq, tok[0], lq, &err) == MOH_E_ARG, "%s: foreign parameters not refused", mc->name);
    printf("  %-16s %s %-20s vs fp32 on dequantised weights %.2e, on float weights %.2e, %d flipped (worst %.2e)\n",
           mc->name, tn, in, wd, wf, flips, wflip);
    lm_kv_free(&kt);
    lm_kv_free(&kq);
    lm_kv_free(&kd);
    lm_kv_free(&kf);
    quant_table_free(&qt);
    lm_params_free_f32(&pd);
    lm_params_free_f32(&p);
}

/* Each row of every entry of a holds the same bytes in b (the entry there may span other rows). */
static int rows_differ(const quant_table *a, const quant_table *b, int *compared) {
    int bad = 0;
    for (int i = 0; i < a->n; i++) {
        const quant_mat *e = &a->m[i];
        for (int64_t r = 0; r < e->rows; r++) {
            const float *w = b->base + e->off + (size_t)(r * e->cols);
            const quant_mat *f = quant_table_find(b, w);
            if (!f || f->type != e->type || f->cols != e->cols) {
                bad++;
                continue;
            }
            const size_t fr = ((size_t)(w - b->base) - f->off) / (size_t)f->cols;
            bad += memcmp(e->data + (size_t)r * e->row_bytes, f->data + fr * f->row_bytes, e->row_bytes) != 0;
            (*compared)++;
        }
    }
    return bad;
}

/* The GGUF at path with one f16 scale (d) of tensor name's second row made NaN: opening it for its
 * blocks only (the scales checked, not the values) is refused naming the tensor and the row's first
 * value in the file's order (attn_q / attn_k rows are held in another), as a fully read file is. */
static void nan_scale_check(test_ctx *ctx, const char *path, int wtype, const char *name) {
    const char *tn = quant_type_name(wtype);
    FILE *f = fopen(path, "rb");
    long len = f && !fseek(f, 0, SEEK_END) ? ftell(f) : -1;
    uint8_t *buf = len > 0 ? malloc((size_t)len) : NULL;
    bool got = buf && !fseek(f, 0, SEEK_SET) && fread(buf, 1, (size_t)len, f) == (size_t)len;
    if (f) fclose(f);
    moh_gguf *g = NULL;
    moh_error err = {0};
    const moh_gguf_tensor *t = got && !moh_gguf_parse(&g, buf, (size_t)len, path, &err)
                                   ? moh_gguf_find_tensor(g, name) : NULL;
    CHECK(ctx, t && quant_supported(t->type), "%s: %s not found quantised (%s)", tn, name, err.msg);
    if (t && quant_supported(t->type)) { /* (its type: wtype, or llama-quantize's fallback for its width) */
        const size_t row = quant_row_bytes(t->type, t->ne[0]), at = t->type == MOH_GGML_Q6_K ? 208 : 0;
        const long long first = (long long)t->ne[0]; /* row 1, value 0 */
        uint8_t *d = buf + (t->data - buf) + row + at; /* (the parse reads buf in place) */
        d[0] = 0x00, d[1] = 0x7E; /* f16 NaN, little-endian */
        char bad[112], want[128];
        snprintf(bad, sizeof bad, "%s.nan", path);
        snprintf(want, sizeof want, "tensor '%s' holds a non-finite value at index %lld", name, first);
        FILE *o = fopen(bad, "wb");
        const bool put = o && fwrite(buf, 1, (size_t)len, o) == (size_t)len;
        if (o) fclose(o);
        model mq = {0}, mf = {0};
        const int rq = put ? model_open_ex(&mq, bad, MODEL_OPEN_QUANT_ONLY, &err) : -1;
        CHECK(ctx, rq == MOH_E_FORMAT && strstr(err.msg, want), "%s: a NaN scale, blocks only: rc %d, '%s'", tn, rq,
              err.msg);
        const int rf = put ? model_open(&mf, bad, &err) : -1;
        CHECK(ctx, rf != MOH_OK && strstr(err.msg, want), "%s: a NaN scale, fully read: rc %d, '%s'", tn, rf, err.msg);
        model_free(&mq);
        model_free(&mf);
        remove(bad);
    }
    moh_gguf_close(g);
    free(buf);
}

static void gguf_check(test_ctx *ctx, int wtype, int C, int I) {
    moh_lm_config c = {0};
    c.hidden_size = C;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.intermediate_size = I;
    c.vocab_size = 256;
    c.max_position_embeddings = 64;
    c.rms_norm_eps = 1e-5;
    c.rope_theta = 10000;
    c.tie_word_embeddings = true;
    c.router = MOH_ROUTER_NONE;
    moh_error err = {0};
    CHECK(ctx, moh_lm_config_finalize(&c, "gguf", &err) == MOH_OK, "%s", err.msg);
    lm_params_f32 p;
    CHECK(ctx, lm_params_init_f32(&p, &c, &err) == MOH_OK, "%s", err.msg);
    lm_params_init_random(&c, &p, 11, 1.0 / sqrt((double)c.hidden_size));
    char path[96];
    snprintf(path, sizeof path, "/tmp/moh_test_decode_quant_%d.gguf", (int)getpid());
    model m = {0};
    quant_table qt = {0};
    const char *tn = quant_type_name(wtype);
    model mq = {0}; /* the same file for its blocks only */
    int rc = lm_gguf_export(&c, p.data, NULL, -1, NULL, NULL, path, wtype, &err);
    if (!rc) rc = model_open(&m, path, &err);
    if (!rc) rc = model_open_ex(&mq, path, MODEL_OPEN_QUANT_ONLY, &err);
    if (!rc) nan_scale_check(ctx, path, wtype, "blk.1.ffn_down.weight");
    if (!rc) nan_scale_check(ctx, path, wtype, "blk.0.attn_q.weight");
    remove(path); /* (still mapped: the tables borrow the blocks) */
    CHECK(ctx, rc == MOH_OK, "%s: %s", tn, err.msg);
    if (rc) {
        model_free(&m);
        lm_params_free_f32(&p);
        return;
    }
    /* 7 matrices per layer and the tied embedding, every one in the file's own type (4-bit: the
     * embedding Q8_0) */
    CHECK(ctx, m.quant && m.quant->n == 7 * c.num_hidden_layers + 1, "%s: %d quantised matrices read, expected %d", tn,
          m.quant ? m.quant->n : 0, 7 * c.num_hidden_layers + 1);
    CHECK(ctx, lm_quant_table(&c, &p, wtype, &qt, &err) == MOH_OK, "%s", err.msg);
    int compared = 0, bad = 0;
    if (m.quant) { /* the same float offsets in both buffers: compare through a table over m's */
        quant_table mine = qt;
        mine.base = m.data;
        bad = rows_differ(&mine, m.quant, &compared);
    }
    /* (4-bit: the tied embedding is Q8_0 in both, as llama-quantize keeps it) */
    int64_t rows = 0;
    for (int i = 0; i < qt.n; i++) rows += qt.m[i].rows;
    CHECK(ctx, bad == 0 && compared == rows && rows > 0, "%s: %d of %d rows differ from lm_quant_table's (%lld rows)", tn,
          bad, compared + bad, (long long)rows);
    const moh_lm_config *mc = m.cfg;
    const lm_params_f32 *mp = m.params;
    lm_kv_cache kf, kq;
    CHECK(ctx, lm_kv_init(&kf, mc, 29, &err) == MOH_OK, "%s", err.msg);
    CHECK(ctx, lm_kv_init_quant(&kq, mc, mp, m.quant, 29, &err) == MOH_OK, "%s", err.msg);
    float lf[256], lq[256];
    double wd = 0;
    test_rng rng = {5};
    for (int t = 0; t < 29; t++) {
        const int tok = (int)(test_rng_u64(&rng) % 256);
        CHECK(ctx, lm_decode_step(mc, mp, &kf, tok, lf, &err) == MOH_OK, "%s", err.msg);
        CHECK(ctx, lm_decode_step(mc, mp, &kq, tok, lq, &err) == MOH_OK, "%s", err.msg);
        const double e = test_rel_err_f32(lq, lf, 256);
        wd = e > wd ? e : wd;
    }
    CHECK(ctx, wd < 6e-2 && wd > 1e-6, "%s GGUF: decoding from the file's blocks vs fp32 on its floats rel err %.3g", tn, wd);
    /* blocks only: the matrices' float rows are zero (never written), the norms are there, and
     * decoding and a batched prefill give the bits of the fully read model */
    const lm_params_f32 *qp = mq.params;
    bool zero = mq.quant_only && mq.quant && mq.quant->n == m.quant->n, norms = true;
    for (int i = 0; zero && i < mq.quant->n; i++)
        for (size_t j = 0; j < (size_t)(mq.quant->m[i].rows * mq.quant->m[i].cols) && zero; j++)
            zero = mq.data[mq.quant->m[i].off + j] == 0.0f;
    for (int j = 0; j < c.hidden_size; j++) norms = norms && qp->norm[j] == mp->norm[j];
    CHECK(ctx, zero && norms, "%s: blocks-only model: quantised rows written (%d) or norms missing (%d)", tn, !zero, !norms);
    lm_kv_cache ka, kb;
    CHECK(ctx, lm_kv_init_quant(&ka, mc, mp, m.quant, 29, &err) == MOH_OK, "%s", err.msg);
    CHECK(ctx, lm_kv_init_quant(&kb, mq.cfg, qp, mq.quant, 29, &err) == MOH_OK, "%s", err.msg);
    int toks[20];
    for (int t = 0; t < 20; t++) toks[t] = (int)(test_rng_u64(&rng) % 256);
    float la[256], lb[256];
    CHECK(ctx, lm_encode(mc, mp, &ka, toks, 12, la, &err) == MOH_OK, "%s", err.msg);
    CHECK(ctx, lm_encode(mq.cfg, qp, &kb, toks, 12, lb, &err) == MOH_OK, "%s", err.msg);
    int differ = memcmp(la, lb, sizeof la) != 0;
    /* the prefill runs on the dequantised blocks (bf16 or fp32 GEMMs, bf16 K/V): fp32 decoding of the file's
     * floats (the same values) agrees to the bf16 cache's rounding */
    lm_kv_cache k32;
    float l32[256];
    CHECK(ctx, lm_kv_init(&k32, mc, 29, &err) == MOH_OK, "%s", err.msg);
    for (int t = 0; t < 12; t++) CHECK(ctx, lm_decode_step(mc, mp, &k32, toks[t], l32, &err) == MOH_OK, "%s", err.msg);
    const double epf = test_rel_err_f32(la, l32, 256);
    CHECK(ctx, epf < 3e-2 && epf > 0, "%s: prefill on the blocks vs fp32 decode rel err %.3g", tn, epf);
    /* a second run into the filled cache (lm_feed's batched extension), then single steps */
    CHECK(ctx, lm_feed(mc, mp, &ka, toks + 12, 8, la, &err) == MOH_OK, "%s", err.msg);
    CHECK(ctx, lm_feed(mq.cfg, qp, &kb, toks + 12, 8, lb, &err) == MOH_OK, "%s", err.msg);
    differ += memcmp(la, lb, sizeof la) != 0;
    for (int t = 12; t < 20; t++) CHECK(ctx, lm_decode_step(mc, mp, &k32, toks[t], l32, &err) == MOH_OK, "%s", err.msg);
    const double efe = test_rel_err_f32(la, l32, 256);
    CHECK(ctx, efe < 3e-2 && efe > 0, "%s: lm_feed into a filled cache on the blocks vs fp32 decode rel err %.3g", tn, efe);
    for (int t = 0; t < 3; t++) {
        CHECK(ctx, lm_decode_step(mc, mp, &ka, toks[t], la, &err) == MOH_OK, "%s", err.msg);
        CHECK(ctx, lm_decode_step(mq.cfg, qp, &kb, toks[t], lb, &err) == MOH_OK, "%s", err.msg);
        differ += memcmp(la, lb, sizeof la) != 0;
    }
    lm_kv_free(&k32);
    CHECK(ctx, differ == 0, "%s: blocks-only model: %d of 5 logit vectors differ from the full model's", tn, differ);
    lm_kv_free(&kb);
    lm_kv_free(&ka);
    model_free(&mq);
    printf("  gguf %s: %d rows the same blocks as lm_quant_table, %d differ; decode vs fp32 on the file's floats %.2e; "
           "prefill vs fp32 decode %.2e, then lm_feed %.2e\n", tn, compared, bad, wd, epf, efe);
    lm_kv_free(&kq);
    lm_kv_free(&kf);
    quant_table_free(&qt);
    model_free(&m);
    lm_params_free_f32(&p);
}

int main(void) {
    test_ctx ctx = {0};
    const quant_isa best = quant_isa_detect();
    static const model_case cases[] = {
        {"dense_d64", MOH_ROUTER_NONE, 2, 128, 2, 2, 96, false},
        {"moh_gqa_tied_d32", MOH_ROUTER_LEARNED, 2, 128, 4, 2, 96, true},
        {"moh_d20", MOH_ROUTER_LEARNED, 2, 160, 8, 8, 64, false},
        {"dense_gqa_c256", MOH_ROUTER_NONE, 2, 256, 4, 2, 256, true}, /* K-quant rows of 256 */
    };
    static const int types[] = {MOH_GGML_Q8_0, MOH_GGML_Q4_0, MOH_GGML_Q4_1, MOH_GGML_Q5_0,
                                MOH_GGML_Q5_1, MOH_GGML_Q4_K, MOH_GGML_Q5_K, MOH_GGML_Q6_K};
    for (int isa = best; isa >= QUANT_ISA_SCALAR; isa--) {
        if (!quant_isa_supported((quant_isa)isa)) continue; /* (AVX512-VNNI without AVX-VNNI) */
        for (size_t t = 0; t < sizeof types / sizeof types[0]; t++)
            for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
                model_check(&ctx, &cases[i], types[t], (quant_isa)isa);
    }
    gguf_check(&ctx, MOH_GGML_Q8_0, 128, 96);
    gguf_check(&ctx, MOH_GGML_Q4_1, 128, 96);
    gguf_check(&ctx, MOH_GGML_Q4_K, 256, 512); /* Q4_K matrices, the head Q6_K */
    gguf_check(&ctx, MOH_GGML_Q5_K, 256, 96);  /* w_down's rows of 96: llama-quantize's Q5_1 */
    return test_finish("test_decode_quant", &ctx);
}
