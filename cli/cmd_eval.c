/* moh eval: validation loss and bits per byte of a checkpoint on a text file (metric defined in
 * src/train/trainer.h, lm_evaluate), per-layer head-activation shares. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "args.h"
#include "cli.h"
#include "cmd_vit.h"
#include "core/fsutil.h"
#include "data/text.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

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
        {"--seq-len", ARG_INT, &T, "T", "context per chunk (default: config max_position_embeddings)", false, ARG_GE(1)},
        {"--batch-size", ARG_INT, &B, "B", "chunks per forward pass (default 8; does not change the result)", false, ARG_IN(1, 65536)},
        {"--json", ARG_FLAG, &json, NULL, "print one JSON object: val_loss, bits_per_byte, tokens, head_share", false, ARG_ANY},
        {"--dump-logits", ARG_STR, &dump, "FILE", "debug: write tokens [1,T] and logits [1,T,V] of the first chunk", false, ARG_ANY},
    };
    int rc = args_parse("eval", argc, argv, specs, (int)(sizeof specs / sizeof specs[0]),
                        "--checkpoint DIR --data FILE [--seq-len T] [--json]",
                        "Metric: the file's bytes are cut into consecutive chunks of T + 1 bytes (a last\n"
                        "chunk shorter than 2 bytes is dropped); each chunk predicts its bytes 1..len-1\n"
                        "from the bytes before them; val_loss is the mean cross-entropy in nats over all\n"
                        "predictions (no load-balance term); bits_per_byte = val_loss / ln 2.\n");
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
    if (stat(data, &st) == 0 && S_ISDIR(st.st_mode)) snprintf(path, sizeof path, "%s/val.txt", data);
    else snprintf(path, sizeof path, "%s", data);
    if (lm_checkpoint_load(ckpt, &cfg, &p, &err)) goto fail;
    have_p = true;
    if (T <= 0) T = cfg.max_position_embeddings;
    if (!(text = fs_read_file(path, (size_t)4 << 30, &n, &err))) goto fail;
    if (lm_acts_init_sparse_f32(&acts, &cfg, B, T, &err)) goto fail;
    have_acts = true;
    if (dump && dump_logits(dump, &cfg, &p, &acts, (const uint8_t *)text, n, T, &err)) goto fail;
    if (lm_evaluate(&cfg, &p, &acts, B, T, (const uint8_t *)text, n, 0, &r, &err)) goto fail;
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
