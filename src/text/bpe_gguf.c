/* The byte-level BPE tokenizer of a GGUF file (llama.cpp's tokenizer.ggml.* metadata): tokens in
 * id order, merges "A B" by rank, the pre-tokenizer by llama.cpp's `pre` name, and the control
 * (token_type 3) and user-defined (4) tokens matched before BPE, as llama-vocab.cpp loads them. */
#include "text/bpe_gguf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int bpe_from_gguf(bpe_tok **out, const moh_gguf *g, const char *path, moh_error *err) {
    *out = NULL;
    const char *model = NULL, *pre = "default";
    size_t ml = 0, pl = 7;
    int rc = moh_gguf_get_str(g, "tokenizer.ggml.model", &model, &ml, err);
    if (rc) return rc;
    if (ml != 4 || memcmp(model, "gpt2", 4))
        return moh_fail(err, MOH_E_CONFIG, "%s: tokenizer.ggml.model is '%.*s', expected 'gpt2' (byte-level BPE; the "
                        "others are not supported yet)", path, (int)(ml < 32 ? ml : 32), model);
    if (moh_gguf_find_key(g, "tokenizer.ggml.pre") >= 0 && (rc = moh_gguf_get_str(g, "tokenizer.ggml.pre", &pre, &pl, err)))
        return rc;
    moh_gguf_type et;
    uint64_t nt = 0, nm = 0, ntt = 0;
    if ((rc = moh_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &nt, err))) return rc;
    if (et != MOH_GGUF_STRING || nt == 0 || nt > (1u << 24))
        return moh_fail(err, MOH_E_FORMAT, "%s: tokenizer.ggml.tokens holds %llu %s, expected 1..2^24 strings", path,
                        (unsigned long long)nt, moh_gguf_type_str(et));
    if ((rc = moh_gguf_get_arr(g, "tokenizer.ggml.merges", &et, &nm, err))) return rc;
    if (et != MOH_GGUF_STRING || nm > (1u << 24))
        return moh_fail(err, MOH_E_FORMAT, "%s: tokenizer.ggml.merges holds %llu %s, expected strings", path,
                        (unsigned long long)nm, moh_gguf_type_str(et));
    const bool typed = moh_gguf_find_key(g, "tokenizer.ggml.token_type") >= 0;
    if (typed && ((rc = moh_gguf_get_arr(g, "tokenizer.ggml.token_type", &et, &ntt, err)) ||
                  (et != MOH_GGUF_I32 || ntt != nt)))
        return rc ? rc : moh_fail(err, MOH_E_FORMAT, "%s: tokenizer.ggml.token_type holds %llu %s, expected %llu i32",
                                  path, (unsigned long long)ntt, moh_gguf_type_str(et), (unsigned long long)nt);
    const char **toks = calloc(nt, sizeof *toks), **merges = calloc(nm ? nm : 1, sizeof *merges);
    int *added = calloc(nt, sizeof *added);
    char *pre_name = malloc(pl + 1);
    int n_added = 0;
    if (!toks || !merges || !added || !pre_name) rc = moh_fail(err, MOH_E_NOMEM, "%s: out of memory", path);
    size_t len;
    for (uint64_t i = 0; !rc && i < nt; i++) {
        rc = moh_gguf_get_arr_str(g, "tokenizer.ggml.tokens", i, &toks[i], &len, err);
        int32_t ty = 1;
        if (!rc && typed) rc = moh_gguf_get_arr_i32(g, "tokenizer.ggml.token_type", i, &ty, err);
        if (!rc && (ty == 3 || ty == 4)) added[n_added++] = (int)i; /* control, user-defined */
    }
    for (uint64_t i = 0; !rc && i < nm; i++) rc = moh_gguf_get_arr_str(g, "tokenizer.ggml.merges", i, &merges[i], &len, err);
    bpe_spec spec = {.tokens = toks, .n_tokens = (int)nt, .merges = merges, .n_merges = (int)nm, .added = added,
                     .n_added = n_added};
    if (!rc) {
        memcpy(pre_name, pre, pl);
        pre_name[pl] = '\0';
        rc = bpe_pre_from_name(pre_name, &spec.pre, &spec.ignore_merges, err);
    }
    if (!rc) rc = bpe_create(out, &spec, err);
    if (rc && err && strncmp(err->msg, path, strlen(path))) { /* name the file */
        char msg[sizeof err->msg];
        memcpy(msg, err->msg, sizeof msg);
        moh_fail(err, rc, "%.200s: %.800s", path, msg);
    }
    free(toks);
    free(merges);
    free(added);
    free(pre_name);
    return rc;
}

bool bpe_is_bytes(const bpe_tok *t) {
    for (int v = 0; v < 256; v++) {
        const uint8_t byte = (uint8_t)v;
        int *ids = NULL;
        size_t n = 0;
        moh_error e;
        const bool same = !bpe_encode(t, &byte, 1, false, &ids, &n, &e) && n == 1 && ids[0] == v;
        free(ids);
        if (!same) return false;
    }
    return true;
}
