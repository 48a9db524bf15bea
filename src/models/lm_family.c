/* The decoder LM as a model family (model.h): config, tensor registry, forward/backward on text
 * batches, and the text batch source (data/text.h): bytes, or for a model with a BPE tokenizer
 * the text's token ids (tokenized once per run), with the `moh eval` metric: bits per byte over
 * consecutive chunks of T + 1 tokens (the cross-entropy of the T predicted tokens of each chunk
 * in bits / the UTF-8 bytes those tokens decode to). */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/fsutil.h"
#include "data/text.h"
#include "models/lm.h"
#include "models/lm_gguf.h"
#include "text/bpe_gguf.h"
#include "models/lm_analysis.h"
#include "models/model.h"

extern const model_family lm_family;

static int cfg_parse(void *cfg, const char *text, size_t len, const char *label, moh_error *err) {
    return moh_lm_config_parse_json(cfg, text, len, label, err);
}
static char *cfg_json(const void *cfg) { return moh_lm_config_to_json(cfg); }
static int num_layers(const void *cfg) { return ((const moh_lm_config *)cfg)->num_hidden_layers; }
static const moh_attn_config *attn(const void *cfg) { return &((const moh_lm_config *)cfg)->attn; }
static model_tensor *tensors(const void *cfg, model_naming scheme, int *n) { return lm_tensors_named(cfg, scheme, n); }

static const char *tied_tensor(const void *cfg, const char *name) {
    return ((const moh_lm_config *)cfg)->tie_word_embeddings && !strcmp(name, "lm_head.weight")
               ? "model.embed_tokens.weight" : NULL;
}

MODEL_ADAPTER(lm, sparse ? lm_acts_init_sparse_f32(a, cfg, Bmax, T, err) : lm_acts_init_f32(a, cfg, Bmax, T, err),
              lm_params_init_random(cfg, p, seed, 0.02))

static double forward(const void *cfg, const void *params, void *acts, const moh_batch *b, int first, int count,
                      bool train, double *ce, double *lb) {
    lm_acts_f32 *a = acts;
    const size_t off = (size_t)first * b->T;
    const double loss = lm_forward_f32(cfg, params, a, b->tokens + off, b->targets ? b->targets + off : NULL, count,
                                       b->T); /* no targets: logits only (moh analyze) */
    *ce = a->ce_loss;
    *lb = a->lb_loss;
    return loss;
}
static void backward(const void *cfg, const void *params, void *grads, void *acts, const moh_batch *b, int first,
                     int count) {
    const size_t off = (size_t)first * b->T;
    lm_backward_f32(cfg, params, grads, acts, b->tokens + off, b->targets + off);
}
static int tokens_per_example(const void *cfg, const moh_batch *b) { return b->T; }

static void train_defaults(train_hparams *hp) {
    memset(hp, 0, sizeof *hp);
    *hp = (train_hparams){.lr = 2e-3, .min_lr_ratio = 0.1, .weight_decay = 0.1, .beta1 = 0.9, .beta2 = 0.95,
                          .grad_clip = 1.0, .warmup = -1, .batch_size = 16, .grad_accum = 1, .shards = 1,
                          .seed = 1, .val_fraction = 0.1, .eval_every = 200, .eval_limit = 131072,
                          .log_every = 10};
}

/* ---- text batch source: bytes, or the tokens of the model's BPE tokenizer ----------------- */

typedef struct text_source {
    text_data data;        /* train / val bytes (evaluation of a whole file: val holds it) */
    uint8_t *whole;        /* evaluation of a whole file: its bytes */
    int *tr_ids, *va_ids;  /* BPE: the token ids of each split (NULL: a byte model) */
    size_t n_tr, n_va;
    int *tok_bytes;        /* BPE: [tokens] UTF-8 bytes each token id decodes to */
    int B, T;              /* training micro-batch (all ranks) */
    int *tok, *tgt;        /* [B, T] training batch */
    int *etok, *etgt, *etb;/* [eval_B, T] evaluation batch; etb: bytes of each target (BPE) */
    int eval_B;
    char path[PATH_MAX + 16]; /* the evaluated file */
} text_source;

static void text_source_free(void *self) {
    text_source *s = self;
    text_data_free(&s->data);
    free(s->whole);
    free(s->tr_ids);
    free(s->va_ids);
    free(s->tok_bytes);
    free(s->tok);
    free(s->tgt);
    free(s->etok);
    free(s->etgt);
    free(s->etb);
    free(s);
}

static int text_next(void *self, long step, int micro, int rank, int nranks, uint64_t *data_rng, moh_batch *out,
                     moh_error *err) {
    text_source *s = self;
    /* every rank draws the whole micro-batch (the same data position everywhere) and takes its part */
    int rc = s->tr_ids ? text_batch_ids(s->tr_ids, s->n_tr, s->B, s->T, data_rng, s->tok, s->tgt, err)
                       : text_batch(s->data.train, s->data.n_train, s->B, s->T, data_rng, s->tok, s->tgt, err);
    if (rc) return rc;
    const int lo = (int)((long)s->B * rank / nranks), hi = (int)((long)s->B * (rank + 1) / nranks);
    *out = (moh_batch){.B = hi - lo, .T = s->T, .tokens = s->tok + (size_t)lo * s->T,
                       .targets = s->tgt + (size_t)lo * s->T};
    return MOH_OK;
}

/* Length of the evaluated sequence: tokens (BPE) or bytes. */
static size_t text_eval_len(const text_source *s) { return s->va_ids ? s->n_va : s->data.n_val; }

static long text_eval_items(void *self, long limit) {
    const text_source *s = self;
    const long all = text_eval_num_preds(text_eval_len(s), s->T);
    return limit > 0 && limit < all ? limit : all;
}

/* Consecutive chunks of T + 1 tokens (bytes, or BPE tokens) from *cursor (a chunk index): each
 * predicts its tokens 1..T from those before them in the chunk, so the first token of every chunk
 * is context only (its bytes are not counted). Full-length chunks up to capacity at a time, a
 * shorter last chunk alone; stops once limit predictions are done (whole batches). */
static long text_eval_next(void *self, long *cursor, long limit, int capacity, moh_batch *out) {
    text_source *s = self;
    const int T = s->T;
    const size_t n = text_eval_len(s);
    const long nchunks = text_eval_num_chunks(n, T);
    long c = *cursor;
    if (c >= nchunks || (limit > 0 && c * T >= limit)) return 0;
    if (capacity > s->eval_B) capacity = s->eval_B;
    int rows = 0, len = 0;
    while (rows < capacity && c < nchunks) {
        int *tk = s->etok + (size_t)rows * T, *tg = s->etgt + (size_t)rows * T;
        const int k = s->va_ids ? text_eval_chunk_ids(s->va_ids, n, T, c, tk, tg)
                                : text_eval_chunk(s->data.val, n, T, c, tk, tg);
        if (rows > 0 && k != len) break;
        if (s->va_ids)
            for (int i = 0; i < k; i++) s->etb[(size_t)rows * T + i] = s->tok_bytes[tg[i]];
        len = k;
        rows++;
        c++;
        if (k != T) break;
    }
    if (len < T) /* repack the rows of a short chunk contiguously: [rows, len] */
        for (int b = 1; b < rows; b++) {
            memmove(s->etok + (size_t)b * len, s->etok + (size_t)b * T, sizeof(int) * len);
            memmove(s->etgt + (size_t)b * len, s->etgt + (size_t)b * T, sizeof(int) * len);
            if (s->va_ids) memmove(s->etb + (size_t)b * len, s->etb + (size_t)b * T, sizeof(int) * len);
        }
    *cursor = c;
    *out = (moh_batch){.B = rows, .T = len, .tokens = s->etok, .targets = s->etgt,
                       .target_bytes = s->va_ids ? s->etb : NULL};
    return (long)rows * len;
}

/* The ids of text[0..n) under t (*ids malloc'd, at least one int), special tokens matched as
 * Hugging Face's encode does; a note on stderr when bytes without a token were dropped. */
static int text_tokenize(const bpe_tok *t, const int *tok_bytes, const uint8_t *text, size_t n, const char *label,
                         bool quiet, int **ids, size_t *nids, moh_error *err) {
    int rc = bpe_encode(t, text, n, true, ids, nids, err);
    if (rc) return rc;
    if (!*ids && !(*ids = malloc(sizeof(int)))) return moh_fail(err, MOH_E_NOMEM, "%s: out of memory", label);
    size_t bytes = 0;
    for (size_t i = 0; i < *nids; i++) bytes += (size_t)tok_bytes[(*ids)[i]];
    if (bytes != n && !quiet)
        fprintf(stderr, "note: %s: %zu of its %zu bytes have no token in the vocabulary and were dropped (as Hugging "
                "Face tokenizers does); bits per byte count the bytes of the tokens\n", label, n - bytes, n);
    return MOH_OK;
}

/* The first 4 bytes of a file (0 when shorter or unreadable). */
static unsigned long file_magic(const char *path) {
    unsigned char b[4] = {0};
    FILE *f = fs_fopen_read(path); /* not a FIFO or device: never blocks */
    if (!f) return 0;
    const size_t got = fread(b, 1, 4, f);
    fclose(f);
    return got == 4 ? (unsigned long)b[0] << 24 | (unsigned long)b[1] << 16 | (unsigned long)b[2] << 8 | b[3] : 0;
}

/* true when path is (a directory of) MNIST-style IDX files rather than text: by name, or for a
 * file by content (gzip magic 1f 8b, or the IDX magic 00 00 08 0N of unsigned-byte IDX) */
static bool is_idx_data(const char *path, bool dir) {
    if (!dir) {
        const unsigned long m = file_magic(path);
        return (strstr(path, "-idx") && strstr(path, "-ubyte")) || m >> 16 == 0x1f8b ||
               (m >> 8 == 0x000008 && (m & 0xff) >= 1 && (m & 0xff) <= 4);
    }
    static const char *const names[] = {"t10k-images-idx3-ubyte", "t10k-images-idx3-ubyte.gz",
                                        "train-images-idx3-ubyte", "train-images-idx3-ubyte.gz"};
    char p[PATH_MAX + 32];
    struct stat st;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", path, names[i]);
        if (stat(p, &st) == 0) return true;
    }
    return false;
}

static int open_data(model *m, const data_request *req, batch_source *train, batch_source *eval, moh_error *err) {
    const moh_lm_config *cfg = m->cfg;
    const train_hparams *hp = req->hp;
    const bool bpe = m->tokenizer && !bpe_is_bytes(m->tokenizer); /* else byte ids 0..255 */
    if (!bpe && cfg->vocab_size < 256)
        return moh_fail(err, MOH_E_CONFIG, "%s: field 'vocab_size' is %d, expected >= 256 (moh's text data is "
                        "bytes, token ids 0..255)", req->model_label, cfg->vocab_size);
    int rc0 = model_check_text_vocab(m, req->model_label, err);
    if (rc0) return rc0;
    const int T = hp->seq_len > 0 ? hp->seq_len : cfg->max_position_embeddings;
    if (T > cfg->max_position_embeddings) /* positions the model is not built for */
        return moh_fail(err, MOH_E_ARG, "--seq-len is %d, more than the context of %s (max_position_embeddings %d; "
                        "%s)", T, req->model_label, cfg->max_position_embeddings,
                        req->train ? "raise it in the config to train a longer context"
                                   : "expected --seq-len at most that: the model has no positions beyond it");
    const char *split = req->split ? req->split : "all";
    if (!req->train && strcmp(split, "all") && strcmp(split, "val"))
        return moh_fail(err, MOH_E_ARG, "--split is '%.64s'; a language model evaluates \"all\" (the whole file; a "
                        "prepared dir: its val.txt) or \"val\" (the held-out tail that training validates on, by "
                        "--val-fraction)", split);
    char path[PATH_MAX + 16];
    struct stat st;
    const bool dir = stat(req->path, &st) == 0 && S_ISDIR(st.st_mode);
    if (dir) snprintf(path, sizeof path, "%s/val.txt", req->path);
    else snprintf(path, sizeof path, "%s", req->path);
    if (is_idx_data(req->path, dir) && (!dir || stat(path, &st) != 0))
        return moh_fail(err, MOH_E_ARG, "--data %s holds IDX%s data, but %s is a language model (model_type "
                        "\"llama\"): it needs a plain text file (or a directory with train.txt / val.txt)", req->path,
                        !dir && file_magic(req->path) >> 16 == 0x1f8b ? " or gzip" : "", req->model_label);
    text_source *s = calloc(1, sizeof *s);
    if (!s) return moh_fail(err, MOH_E_NOMEM, "data: out of memory");
    int rc = MOH_OK;
    const bool tail = !req->train && !dir && !strcmp(split, "val"); /* evaluation of the held-out tail */
    snprintf(s->path, sizeof s->path, "%s", req->train || tail ? req->path : path);
    s->T = T;
    s->B = hp->batch_size;
    s->eval_B = req->eval_batch > 0 ? req->eval_batch : hp->batch_size;
    if (req->train || tail) { /* a BPE model's splits are checked in tokens below */
        rc = text_data_load(&s->data, req->path, hp->val_fraction, req->train && !bpe ? (size_t)T + 2 : 2, err);
    } else { /* evaluation of a whole file (a prepared dir: its val.txt) */
        size_t n = 0;
        s->whole = (uint8_t *)fs_read_file(path, (size_t)4 << 30, &n, err);
        if (!s->whole) rc = err ? err->code : MOH_E_IO;
        s->data.val = s->whole;
        s->data.n_val = n;
    }
    if (!rc && !bpe && !req->train && text_eval_num_chunks(s->data.n_val, T) < 1)
        rc = moh_fail(err, MOH_E_FORMAT, "%s: %zu byte%s, fewer than the 2 needed for one prediction", s->path,
                      s->data.n_val, s->data.n_val == 1 ? "" : "s");
    if (!rc && bpe) { /* the text once through the tokenizer: train windows and eval chunks are token ids */
        const int nt = bpe_n_tokens(m->tokenizer);
        if (!(s->tok_bytes = calloc((size_t)nt, sizeof(int)))) rc = moh_fail(err, MOH_E_NOMEM, "data: out of memory");
        for (int i = 0; !rc && i < nt; i++) {
            const uint8_t *b;
            size_t bl = 0;
            moh_error none;
            if (bpe_token_bytes(m->tokenizer, i, &b, &bl, &none) == MOH_OK) s->tok_bytes[i] = (int)bl;
        }
        char label[PATH_MAX + 64];
        snprintf(label, sizeof label, "%s%s", s->path, req->train ? " (training split)" : "");
        if (!rc && req->train)
            rc = text_tokenize(m->tokenizer, s->tok_bytes, s->data.train, s->data.n_train, label, req->quiet,
                               &s->tr_ids, &s->n_tr, err);
        if (!rc && req->train && s->n_tr < (size_t)T + 1)
            rc = moh_fail(err, MOH_E_FORMAT, "%s: the training split is %zu tokens under the model's tokenizer, fewer "
                          "than the T+1 = %d of one window: use a longer file or a smaller --seq-len", req->path,
                          s->n_tr, T + 1);
        snprintf(label, sizeof label, "%s%s", req->train || tail ? req->path : s->path,
                 req->train || tail ? " (validation split)" : "");
        if (!rc)
            rc = text_tokenize(m->tokenizer, s->tok_bytes, s->data.val, s->data.n_val, label, req->quiet, &s->va_ids,
                               &s->n_va, err);
        if (!rc && text_eval_num_chunks(s->n_va, T) < 1)
            rc = moh_fail(err, MOH_E_FORMAT, "%s: %zu token%s under the model's tokenizer, fewer than the 2 needed "
                          "for one prediction", label, s->n_va, s->n_va == 1 ? "" : "s");
    }
    const size_t bt = (size_t)s->B * T, ebt = (size_t)s->eval_B * T;
    if (!rc) {
        s->tok = malloc(sizeof(int) * bt);
        s->tgt = malloc(sizeof(int) * bt);
        s->etok = malloc(sizeof(int) * ebt);
        s->etgt = malloc(sizeof(int) * ebt);
        s->etb = bpe ? malloc(sizeof(int) * ebt) : NULL;
        if (!s->tok || !s->tgt || !s->etok || !s->etgt || (bpe && !s->etb))
            rc = moh_fail(err, MOH_E_NOMEM, "data: out of memory");
    }
    if (rc) {
        text_source_free(s);
        return rc;
    }
    *eval = (batch_source){.self = s, .unit = "tok", .seen_key = "tokens", .eval_unit = "predictions",
                           .examples_per_step = (long)bt, .steps_per_epoch = 0, .warmup_cap = 100,
                           .rng_start = hp->seed * 0x9E3779B97F4A7C15ULL + 0x5EEDULL, .next = text_next,
                           .eval_items = text_eval_items, .eval_next = text_eval_next, .free = text_source_free,
                           .n_train = bpe ? s->n_tr : s->data.n_train, .n_eval = bpe ? s->n_va : s->data.n_val,
                           .what = bpe ? "tokens" : "bytes", .label = s->path, .seq_len = T,
                           .data_crc = text_data_crc(&s->data)};
    if (train) { /* one source serves both: the trainer frees it once (train->free == NULL) */
        *train = *eval;
        train->free = NULL;
    }
    return MOH_OK;
}

static void eval_add(const void *cfg, const void *acts, const moh_batch *b, int first, int count, model_eval *r) {
    const lm_acts_f32 *a = acts;
    const long preds = (long)count * b->T;
    r->ce_sum += (double)a->ce_loss * preds;
    r->n += preds;
    if (!b->target_bytes) r->bytes += (double)preds; /* byte tokens */
    else
        for (long i = 0; i < preds; i++) r->bytes += b->target_bytes[(size_t)first * b->T + i];
}
/* bits per byte = ce_sum / ln 2 / bytes (of the predicted tokens), as loss / ln 2 * (n / bytes):
 * for byte tokens n / bytes is exactly 1, the number moh has always reported. */
static void eval_finish(const void *cfg, model_eval *r) {
    r->loss = r->ce_sum / (double)r->n;
    r->metric = r->loss / log(2.0) * ((double)r->n / r->bytes);
}
static void eval_json(const model_eval *r, char *buf, size_t cap) {
    const int k = snprintf(buf, cap, ", \"val_loss\": %.6f, \"val_bpb\": %.6f, \"val_tokens\": %ld", r->loss,
                           r->metric, r->n);
    if (r->bytes != (double)r->n && k > 0 && (size_t)k < cap) /* BPE tokens */
        snprintf(buf + k, cap - (size_t)k, ", \"val_bytes\": %.0f", r->bytes);
}
static void eval_brief(const model_eval *r, char *buf, size_t cap) { snprintf(buf, cap, " | val %.4f bpb", r->metric); }

static void eval_report(const model *m, const model_eval *r, const eval_context *ctx) {
    const bool bpe = r->bytes != (double)r->n || strcmp(ctx->src->what, "bytes");
    if (ctx->json) {
        printf("{\"val_loss\": %.8f, \"bits_per_byte\": %.8f, \"tokens\": %ld, \"bytes\": %.0f, \"vocab\": \"%s\", "
               "\"split\": \"%s\", \"seq_len\": %d, \"lb_loss\": %.6f, ", r->loss, r->metric, r->n, r->bytes,
               bpe ? "bpe" : "bytes", ctx->split ? ctx->split : "all", ctx->seq_len, r->lb_loss);
        model_print_head_share(m, r, true);
        printf("}\n");
        return;
    }
    printf("checkpoint %s on %s (%zu %s, T=%d)\n", ctx->checkpoint, ctx->src->label, ctx->src->n_eval, ctx->src->what,
           ctx->seq_len);
    if (bpe)
        printf("val_loss %.6f nats/token | %.4f bits/byte | %ld predicted tokens = %.0f bytes\n", r->loss, r->metric,
               r->n, r->bytes);
    else printf("val_loss %.6f nats | %.4f bits/byte | %ld predictions\n", r->loss, r->metric, r->n);
    model_print_head_share(m, r, false);
}

/* tokens, targets, target_bytes [1, len] and logits [1, len, V] of the first evaluation chunk */
/* One sequence: tokens, logits, targets and target bytes (1 per token without byte counts). */
static int dump_entries(const model *m, const moh_batch *b, void *acts, float *ft, moh_st_entry *e) {
    const moh_lm_config *cfg = m->cfg;
    lm_acts_f32 *a = acts;
    const int T = b->T;
    lm_forward_f32(cfg, m->params, a, b->tokens, NULL, 1, T);
    for (int i = 0; i < T; i++) {
        ft[i] = (float)b->tokens[i];
        ft[T + i] = (float)b->targets[i];
        ft[2 * T + i] = b->target_bytes ? (float)b->target_bytes[i] : 1.0f;
    }
    e[0] = (moh_st_entry){"tokens", 2, {1, T}, ft};
    e[1] = (moh_st_entry){"logits", 3, {1, T, cfg->vocab_size}, a->logits};
    e[2] = (moh_st_entry){"targets", 2, {1, T}, ft + T};
    e[3] = (moh_st_entry){"target_bytes", 2, {1, T}, ft + 2 * T};
    return 4;
}

static void describe(const void *cfg, size_t n, char *buf, size_t cap) {
    const moh_lm_config *c = cfg;
    snprintf(buf, cap, "LM %.2fM, hidden %d, %d layers, vocab %d, context %d%s%s", n / 1e6, c->hidden_size,
             c->num_hidden_layers, c->vocab_size, c->max_position_embeddings,
             c->rope_scaling.type != MOH_ROPE_DEFAULT ? ", rope_scaling " : "",
             c->rope_scaling.type != MOH_ROPE_DEFAULT ? attn_rope_type_name(c->rope_scaling.type) : "");
}

static int max_seq_len(const void *cfg) { return ((const moh_lm_config *)cfg)->max_position_embeddings; }

/* Random tokens [B, T] in 0..vocab_size-1 (a 64-bit LCG from seed, top bits) and next-token targets,
 * -1 at the end of each row. */
/* The LM's phases, then (head-sparse path) the attention path's phases summed over layers. */
static int phase_times(void *acts, const char **names, double *seconds, bool *sub, int cap, bool reset) {
    lm_acts_f32 *a = acts;
    int n = 0;
    for (int i = 0; i < LMT_NPHASE && n < cap; i++, n++) {
        names[n] = lm_train_phase_name(i);
        seconds[n] = a->phase_s[i];
        sub[n] = false;
    }
    if (n < cap) {
        for (int k = n; k < cap; k++) seconds[k] = 0.0;
        int m = 0;
        for (int l = 0; l < a->attn.n; l++) m = attn_layer_phases_f32(&a->attn.layer[l], names + n, seconds + n, cap - n, reset);
        for (int k = n; k < n + m; k++) sub[k] = true;
        n += m;
    }
    if (reset) memset(a->phase_s, 0, sizeof a->phase_s);
    return n;
}
static int synthetic_batch(const void *cfg, int B, int T, uint64_t seed, moh_batch *out, void **buf, moh_error *err) {
    const int V = ((const moh_lm_config *)cfg)->vocab_size;
    const size_t n = (size_t)B * T;
    int *tok = malloc(sizeof(int) * 2 * n);
    if (!tok) return moh_fail(err, MOH_E_NOMEM, "synthetic batch: out of memory");
    int *tgt = tok + n;
    uint64_t s = seed;
    for (size_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        tok[i] = (int)((s >> 33) % (uint64_t)V);
    }
    for (size_t i = 0; i < n; i++) tgt[i] = (i + 1) % (size_t)T ? tok[i + 1] : -1;
    *buf = tok;
    *out = (moh_batch){.B = B, .T = T, .tokens = tok, .targets = tgt};
    return MOH_OK;
}

static int num_outputs(const void *cfg) { return ((const moh_lm_config *)cfg)->vocab_size; }
static const float *logits(const void *acts) { return ((const lm_acts_f32 *)acts)->logits; }

static int from_gguf(model *m, const void *gg, const char *path, unsigned flags, moh_error *err) {
    const moh_gguf *g = gg;
    memset(m, 0, sizeof *m);
    m->fam = &lm_family;
    moh_lm_config *cfg = calloc(1, sizeof *cfg);
    if (!cfg) return moh_fail(err, MOH_E_NOMEM, "%s: out of memory", path);
    m->cfg = cfg;
    int rc = lm_gguf_config(g, path, cfg, err);
    if (!rc) rc = model_params_new(&lm_family, cfg, &m->params, &m->data, &m->n, err);
    /* the file's quantised matrices; QUANT_ONLY: those only as blocks, the rest into the buffer */
    quant_table qt = {0};
    if (!rc && !(rc = lm_gguf_quant_table(g, path, cfg, m->data, m->n, &qt, err))) {
        if (qt.n && (m->quant = malloc(sizeof qt))) *m->quant = qt;
        else if (qt.n) rc = moh_fail(err, MOH_E_NOMEM, "%s: out of memory", path);
        if (!m->quant) quant_table_free(&qt);
    }
    m->quant_only = m->quant && (flags & MODEL_OPEN_QUANT_ONLY);
    if (!rc) rc = lm_gguf_weights(g, path, cfg, m->data, m->quant_only ? m->quant : NULL, err);
    if (rc) model_free(m);
    return rc;
}

static int to_gguf(const model *m, const char *path, int wtype, const void *src, moh_error *err) {
    return lm_gguf_export(m->cfg, m->data, m->tokenizer, m->eos_id, m->chat_template, src, path, wtype, err);
}

const model_family lm_family = {
    MODEL_FAMILY_CORE(moh_lm_config, lm_params_f32, lm_acts_f32),
    .model_type = "llama",
    .task = "text-generation",
    .summary = "decoder language model (HF LLaMA layout, byte or BPE tokens)",
    .data_help = "a UTF-8 text file (its last --val-fraction is validation) or a dir with train.txt + val.txt",
    .tied_tensor = tied_tensor,
    .max_seq_len = max_seq_len,
    .num_outputs = num_outputs,
    .logits = logits,
    .unused_keys = "train_limit crop_pad hflip ema_decay",
    .metric_name = "val bits/byte",
    .dump_entries = dump_entries,
    .dump_examples = 1,
    .legacy_optimizer_format = "moh-lm-train-v1",
    .gguf_arch = "llama",
    .from_gguf = from_gguf,
    .to_gguf = to_gguf,
    .default_sparse = true,
    .short_name = "LM",
    .open_analysis = lm_open_analysis,
    .phase_times = phase_times,
};
