/* moh tokenize: the token ids of a text under a model's vocabulary (a BPE tokenizer from a GGUF
 * file; bytes for moh's byte models), as llama.cpp's tokenizer tool and HF's encode give them. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "cli.h"
#include "core/fsutil.h"
#include "models/model.h"
#include "text/bpe_gguf.h"
#include <sys/stat.h>
#include "train/checkpoint.h"

/* s as a JSON string: valid UTF-8 as it is, control characters escaped, an invalid byte as U+FFFD. */
static void json_utf8(const char *s) {
    const uint8_t *b = (const uint8_t *)s;
    size_t n = strlen(s);
    putchar('"');
    for (size_t i = 0; i < n;) {
        const int l = bpe_utf8_len(b + i, n - i);
        if (l == 0) printf("\\ufffd");
        else if (b[i] == '"' || b[i] == '\\') printf("\\%c", b[i]);
        else if (b[i] < 0x20 || b[i] == 0x7f) printf("\\u%04x", b[i]);
        else fwrite(b + i, 1, (size_t)l, stdout);
        i += l ? (size_t)l : 1;
    }
    putchar('"');
}

int cmd_tokenize(int argc, char **argv) {
    const char *path = NULL, *text = NULL, *file = NULL, *save = NULL;
    bool json = false, no_special = false;
    const arg_spec specs[] = {
        {"--model", ARG_STR, &path, "PATH", "a .gguf file with a tokenizer, a Hugging Face tokenizer.json, or a model folder (its tokenizer.json; bytes without one)", true, ARG_ANY},
        {"--text", ARG_STR, &text, "STR", "the text to tokenize", false, ARG_ANY},
        {"--file", ARG_STR, &file, "FILE", "a file to tokenize (instead of --text)", false, ARG_ANY},
        {"--json", ARG_FLAG, &json, NULL, "one JSON object: ids and their pieces (each token as the vocabulary spells it)", false, ARG_ANY},
        {"--no-special", ARG_FLAG, &no_special, NULL, "encode special-token text (<|im_start|> ...) as ordinary text and add no bos / eos id", false, ARG_ANY},
        {"--save-tokenizer", ARG_STR, &save, "DIR", "write the BPE tokenizer into DIR as Hugging Face's tokenizer.json and tokenizer_config.json (what moh checkpoints hold)", false, ARG_ANY},
    };
    int rc = args_parse("tokenize", argc, argv, specs, (int)(sizeof specs / sizeof specs[0]),
                        "--model PATH (--text STR | --file FILE) [--json] | --model PATH --save-tokenizer DIR",
                        "Prints the ids separated by spaces (--json: {\"ids\": [...], \"pieces\": [...]}). Special\n"
                        "and added tokens are matched before BPE, as Hugging Face's encode does. The pieces are the\n"
                        "tokens as Hugging Face's convert_ids_to_tokens gives them: the vocabulary's byte-level\n"
                        "spelling (GPT-2's bytes_to_unicode: \"Ġthe\" for \" the\"; a byte model's bytes spelled\n"
                        "the same way), added tokens as their text; always valid UTF-8. --save-tokenizer refuses\n"
                        "a DIR that already holds a tokenizer.json.\n");
    if (rc) return rc == 1 ? 0 : rc;
    if ((text && file) || (!text && !file && !save)) {
        fprintf(stderr, "moh tokenize: give exactly one of --text and --file (or --save-tokenizer)\n");
        return 2;
    }
    moh_error err = {0};
    model m = {0};
    m.eos_id = -1; /* (model_open sets a model's own) */
    char *buf = NULL;
    size_t len = 0;
    int *ids = NULL;
    size_t n = 0;
    /* a GGUF's tokenizer alone (a tokenizer-only file works too); else the model (byte models) */
    moh_gguf *g = NULL;
    struct stat sb;
    const size_t pl = strlen(path);
    char tj[PATH_MAX + 32];
    snprintf(tj, sizeof tj, "%s/tokenizer.json", path);
    const bool dir_tok = stat(path, &sb) == 0 && S_ISDIR(sb.st_mode) && stat(tj, &sb) == 0;
    if (dir_tok || (pl >= 5 && !strcmp(path + pl - 5, ".json"))) { /* the tokenizer alone, not the weights */
        const int rc2 = dir_tok ? model_load_tokenizer(&m, path, &err) : bpe_load_tokenizer_json(&m.tokenizer, path, &err);
        if (rc2) {
            fprintf(stderr, "moh tokenize: %s\n", err.msg);
            return 1;
        }
    } else if (stat(path, &sb) == 0 && S_ISREG(sb.st_mode) && moh_gguf_open(&g, path, &err) == MOH_OK &&
        moh_gguf_find_key(g, "tokenizer.ggml.model") >= 0) {
        const int rc2 = bpe_from_gguf(&m.tokenizer, g, path, &err);
        moh_gguf_close(g);
        if (rc2) {
            fprintf(stderr, "moh tokenize: %s\n", err.msg);
            return 1;
        }
    } else {
        moh_gguf_close(g);
        if (model_open(&m, path, &err)) {
            fprintf(stderr, "moh tokenize: %s\n", err.msg);
            return 1;
        }
    }
    if (save) {
        if (!m.tokenizer) {
            moh_fail(&err, MOH_E_ARG, "%s has no BPE tokenizer to save (a byte model)", path);
            goto fail;
        }
        char dst[PATH_MAX + 32];
        for (int i = 0; i < 2; i++) { /* a model's folder: a tokenizer would change how it reads text */
            snprintf(dst, sizeof dst, "%s/%s", save, i ? "checkpoint.json" : "model.safetensors");
            if (stat(dst, &sb) == 0) {
                moh_fail(&err, MOH_E_ARG, "%s holds a model (%s): a tokenizer written there would change how it "
                         "reads text; give a new --save-tokenizer DIR", save, dst);
                goto fail;
            }
        }
        snprintf(dst, sizeof dst, "%s/tokenizer.json", save);
        if (stat(dst, &sb) == 0) {
            moh_fail(&err, MOH_E_ARG, "%s already holds a tokenizer (tokenizer.json): give a new --save-tokenizer DIR",
                     save);
            goto fail;
        }
        if (fs_mkdir_p(save, &err) || checkpoint_save_tokenizer(save, &m, &err)) goto fail;
        if (!text && !file) {
            model_free(&m);
            return 0;
        }
    }
    if (file && !(buf = fs_read_file(file, (size_t)1 << 30, &len, &err))) goto fail;
    const uint8_t *src = file ? (const uint8_t *)buf : (const uint8_t *)text;
    if (!file) len = strlen(text);
    if (m.tokenizer) {
        if (no_special ? bpe_encode(m.tokenizer, src, len, false, &ids, &n, &err)
                       : bpe_encode_special(m.tokenizer, src, len, &ids, &n, &err))
            goto fail;
    } else if (m.fam && !strcmp(m.fam->task, "text-generation")) { /* moh's byte models */
        if (model_check_text_vocab(&m, path, &err)) goto fail;
        if (!(ids = malloc(sizeof(int) * (len ? len : 1)))) {
            moh_fail(&err, MOH_E_NOMEM, "out of memory");
            goto fail;
        }
        for (size_t i = 0; i < len; i++) ids[i] = src[i];
        n = len;
    } else {
        moh_fail(&err, MOH_E_ARG, "%s is a %s (model_type \"%s\"): it has no text vocabulary", path, m.fam->summary,
                 m.fam->model_type);
        goto fail;
    }
    if (json) printf("{\"ids\": [");
    for (size_t i = 0; i < n; i++) printf(json ? "%s%d" : "%s%d", i ? (json ? ", " : " ") : "", ids[i]);
    if (json) {
        printf("], \"pieces\": [");
        for (size_t i = 0; i < n; i++) {
            char one[4];
            const char *piece = m.tokenizer ? bpe_token_str(m.tokenizer, ids[i]) : one;
            if (!m.tokenizer) bpe_byte_spelling(ids[i], one);
            if (i) printf(", ");
            json_utf8(piece ? piece : "");
        }
        printf("]}");
    }
    printf("\n");
    free(ids);
    free(buf);
    model_free(&m);
    return 0;
fail:
    fprintf(stderr, "moh tokenize: %s\n", err.msg);
    free(ids);
    free(buf);
    model_free(&m);
    return 1;
}
