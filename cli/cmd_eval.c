/* moh eval: validation loss and bits per byte of a checkpoint on a text file (metric defined in
 * src/train/trainer.h, lm_evaluate), per-layer head-activation shares. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "args.h"
#include "cli.h"
#include "cmd_vit.h"
#include "core/fsutil.h"
#include "data/text.h"
#include "train/checkpoint.h"
#include "train/train_util.h"
#include "train/trainer.h"

void eval_progress_start(eval_progress *pg, const char *unit) {
    memset(pg, 0, sizeof *pg);
    pg->t0 = pg->last = train_now_s();
    pg->tty = isatty(2);
    pg->unit = unit;
}

void eval_progress_update(eval_progress *pg, long done, long total) {
    const double t = train_now_s(), el = t - pg->t0;
    if (pg->tty ? t - pg->last < 0.25 : el < 2.0 || (pg->shown && t - pg->last < 10.0)) return;
    char eta[32];
    const double rate = el > 0 ? (double)done / el : 0.0;
    train_fmt_time(eta, sizeof eta, rate > 0 ? (double)(total - done) / rate : 0.0);
    fprintf(stderr, "%smoh eval: %3.0f%% (%ld / %ld %s), %.0f %s/s, ETA %s%s", pg->tty ? "\r" : "",
            total ? 100.0 * (double)done / (double)total : 100.0, done, total, pg->unit, rate, pg->unit, eta,
            pg->tty ? "\033[K" : "\n");
    fflush(stderr);
    pg->shown = true;
    pg->last = t;
}

void eval_progress_report(void *pg, long done, long total) { eval_progress_update(pg, done, total); }

void eval_progress_end(eval_progress *pg, long total) {
    if (!pg->shown) return;
    if (pg->tty || total < 0) {
        if (pg->tty) fputs("\r\033[K", stderr);
        return;
    }
    char el[32];
    train_fmt_time(el, sizeof el, train_now_s() - pg->t0);
    fprintf(stderr, "moh eval: 100%% (%ld %s) in %s\n", total, pg->unit, el);
}

/* The first 4 bytes of a file (0 when shorter or unreadable). */
static unsigned long file_magic(const char *path) {
    unsigned char b[4] = {0};
    FILE *f = fopen(path, "rb");
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

static int dump_logits(const char *path, const moh_lm_config *cfg, const lm_params_f32 *p,
                       lm_acts_f32 *acts, const uint8_t *bytes, size_t n, int T, moh_error *err) {
    int *tok = malloc(sizeof(int) * T), *tgt = malloc(sizeof(int) * T);
    float *ft = malloc(sizeof(float) * T);
    int rc = MOH_OK;
    if (!tok || !tgt || !ft) rc = moh_fail(err, MOH_E_NOMEM, "out of memory");
    const long len = rc ? 0 : text_eval_chunk(bytes, n, T, 0, tok, tgt);
    if (!rc && len < 1) rc = moh_fail(err, MOH_E_FORMAT, "%s: too short for one prediction", path);
    if (!rc) {
        lm_forward_f32(cfg, p, acts, tok, NULL, 1, (int)len);
        for (long i = 0; i < len; i++) ft[i] = (float)tok[i];
        moh_st_entry e[2] = {{"tokens", 2, {1, len}, ft}, {"logits", 3, {1, len, cfg->vocab_size}, acts->logits}};
        rc = moh_st_write(path, e, 2, err);
    }
    free(tok);
    free(tgt);
    free(ft);
    return rc;
}

int cmd_eval(int argc, char **argv) {
    if (cmd_is_vit(argc, argv, true)) return cmd_eval_vit(argc, argv); /* "model_type": "vit" */
    const char *ckpt = NULL, *data = NULL, *dump = NULL;
    int T = 0, B = 8;
    bool json = false;
    const arg_spec specs[] = {
        {"--checkpoint", ARG_STR, &ckpt, "DIR", "checkpoint dir (config.json + model.safetensors)", true, ARG_ANY},
        {"--data", ARG_STR, &data, "FILE|DIR", "text file evaluated whole (a prepared dir: its val.txt)", true, ARG_ANY},
        {"--seq-len", ARG_INT, &T, "T", "context per chunk, at most the config's max_position_embeddings (the default)", false, ARG_GE(1)},
        {"--batch-size", ARG_INT, &B, "B", "chunks per forward pass (default 8; does not change the result)", false, ARG_IN(1, 65536)},
        {"--json", ARG_FLAG, &json, NULL, "print one JSON object: val_loss, bits_per_byte, tokens, head_share", false, ARG_ANY},
        {"--dump-logits", ARG_STR, &dump, "FILE", "debug: write tokens [1,T] and logits [1,T,V] of the first chunk", false, ARG_ANY},
    };
    int rc = args_parse("eval", argc, argv, specs, (int)(sizeof specs / sizeof specs[0]),
                        "--checkpoint DIR --data FILE [--seq-len T] [--json]",
                        "Metric: the file's bytes are cut into consecutive chunks of T + 1 bytes (a last\n"
                        "chunk shorter than 2 bytes is dropped); each chunk predicts its bytes 1..len-1\n"
                        "from the bytes before them; val_loss is the mean cross-entropy in nats over all\n"
                        "predictions (no load-balance term); bits_per_byte = val_loss / ln 2.\n"
                        "Long runs print progress (rate, ETA) to stderr; stdout holds only the result.\n"
                        "These are the LM options. A ViT checkpoint (model_type \"vit\") takes an IDX\n"
                        "folder and other options: moh eval --checkpoint VIT_DIR --help lists them.\n");
    if (rc) return rc == 1 ? 0 : rc;
    moh_error err = {0};
    moh_lm_config cfg;
    lm_params_f32 p;
    lm_acts_f32 acts;
    lm_eval_result r = {0};
    char *text = NULL;
    size_t n = 0;
    bool have_p = false, have_acts = false;
    int status = 1;
    char path[PATH_MAX + 16];
    struct stat st;
    const bool dir = stat(data, &st) == 0 && S_ISDIR(st.st_mode);
    if (dir) snprintf(path, sizeof path, "%s/val.txt", data);
    else snprintf(path, sizeof path, "%s", data);
    if (is_idx_data(data, dir) && (!dir || stat(path, &st) != 0)) {
        moh_fail(&err, MOH_E_ARG, "--data %s holds IDX%s data, but %s is a language model checkpoint: it "
                 "needs a plain text file (or a directory with val.txt)", data,
                 !dir && file_magic(data) >> 16 == 0x1f8b ? " or gzip" : "", ckpt);
        goto fail;
    }
    if (lm_checkpoint_load(ckpt, &cfg, &p, &err)) goto fail;
    have_p = true;
    if (T <= 0) T = cfg.max_position_embeddings;
    if (T > cfg.max_position_embeddings) { /* positions past the trained context */
        moh_fail(&err, MOH_E_ARG, "--seq-len is %d, more than the context of %s (max_position_embeddings %d)",
                 T, ckpt, cfg.max_position_embeddings);
        goto fail;
    }
    if (!(text = fs_read_file(path, (size_t)4 << 30, &n, &err))) goto fail;
    if (text_eval_num_chunks(n, T) < 1) {
        moh_fail(&err, MOH_E_FORMAT, "%s: %zu byte%s, fewer than the 2 needed for one prediction", path, n, n == 1 ? "" : "s");
        goto fail;
    }
    if (lm_acts_init_sparse_f32(&acts, &cfg, B, T, &err)) goto fail;
    have_acts = true;
    if (dump && dump_logits(dump, &cfg, &p, &acts, (const uint8_t *)text, n, T, &err)) goto fail;
    eval_progress pg;
    eval_progress_start(&pg, "predictions");
    const train_progress report = {eval_progress_report, &pg};
    rc = lm_evaluate(&cfg, &p, &acts, B, T, (const uint8_t *)text, n, 0, &report, &r, &err);
    eval_progress_end(&pg, rc ? -1 : r.tokens);
    if (rc) goto fail;
    if (!isfinite(r.val_loss)) { /* finite weights can still overflow: never print nan as a result */
        moh_fail(&err, MOH_E_FORMAT, "%s: val_loss is %g on %s: the model's outputs overflow", ckpt, r.val_loss, path);
        goto fail;
    }
    const int L = cfg.num_hidden_layers, h = cfg.num_attention_heads;
    if (json) {
        printf("{\"val_loss\": %.8f, \"bits_per_byte\": %.8f, \"tokens\": %ld, \"seq_len\": %d, "
               "\"lb_loss\": %.6f, \"head_share\": [", r.val_loss, r.bits_per_byte, r.tokens, T, r.lb_loss);
        for (int l = 0; l < L; l++) {
            printf("%s[", l ? ", " : "");
            for (int i = 0; i < h; i++) printf("%s%.6f", i ? ", " : "", r.head_share[(size_t)l * h + i]);
            printf("]");
        }
        printf("]}\n");
    } else {
        printf("checkpoint %s on %s (%zu bytes, T=%d)\n", ckpt, path, n, T);
        printf("val_loss %.6f nats | %.4f bits/byte | %ld predictions\n", r.val_loss, r.bits_per_byte, r.tokens);
        printf("head-activation share per layer (heads 0..%d; shared heads first):\n", h - 1);
        for (int l = 0; l < L; l++) {
            printf("  layer %2d:", l);
            for (int i = 0; i < h; i++) printf(" %.2f", r.head_share[(size_t)l * h + i]);
            printf("\n");
        }
    }
    status = 0;
    goto done;
fail:
    fprintf(stderr, "moh eval: %s\n", err.msg);
done:
    free(r.head_share);
    free(text);
    if (have_acts) lm_acts_free_f32(&acts);
    if (have_p) lm_params_free_f32(&p);
    return status;
}
