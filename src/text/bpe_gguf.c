/* The byte-level BPE tokenizer of a GGUF file (llama.cpp's tokenizer.ggml.* metadata): tokens in
 * id order, merges "A B" by rank, the pre-tokenizer by llama.cpp's `pre` name, and the unknown
 * (token_type 2), control (3) and user-defined (4) tokens matched before BPE, as llama-vocab.cpp
 * loads them (the rules, each with llama.cpp's reason: bpe_gguf.h); and the same metadata
 * written back (bpe_to_gguf). */
#include "text/bpe_gguf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The special-token id keys llama-vocab.cpp reads as u32 (impl::load, special_token_types). */
static const char *const ID_KEYS[] = {
    "tokenizer.ggml.bos_token_id",     "tokenizer.ggml.eos_token_id",     "tokenizer.ggml.eot_token_id",
    "tokenizer.ggml.eom_token_id",     "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.seperator_token_id",
    "tokenizer.ggml.padding_token_id", "tokenizer.ggml.mask_token_id",    "tokenizer.ggml.fim_pre_token_id",
    "tokenizer.ggml.fim_suf_token_id", "tokenizer.ggml.fim_mid_token_id", "tokenizer.ggml.fim_pad_token_id",
    "tokenizer.ggml.fim_rep_token_id", "tokenizer.ggml.fim_sep_token_id", "tokenizer.ggml.prefix_token_id",
    "tokenizer.ggml.suffix_token_id",  "tokenizer.ggml.middle_token_id", "tokenizer.ggml.token_type_count"};
/* The flags it reads as bool. */
static const char *const BOOL_KEYS[] = {"tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token",
                                        "tokenizer.ggml.add_sep_token", "tokenizer.ggml.add_space_prefix",
                                        "tokenizer.ggml.remove_extra_whitespaces"};

/* llama.cpp's get_key refuses a key of another type ("key has wrong type"): the same here. An id
 * >= n_tokens it ignores with a warning (keeping its default), and so does moh (the eos id is
 * dropped where it is read). */
static int check_key_types(const moh_gguf *g, const char *path, moh_error *err) {
    for (int k = 0; k < 2; k++) {
        const char *const *keys = k ? BOOL_KEYS : ID_KEYS;
        const size_t n = k ? sizeof BOOL_KEYS / sizeof *BOOL_KEYS : sizeof ID_KEYS / sizeof *ID_KEYS;
        const moh_gguf_type want = k ? MOH_GGUF_BOOL : MOH_GGUF_U32;
        for (size_t i = 0; i < n; i++) {
            const int64_t at = moh_gguf_find_key(g, keys[i]);
            if (at >= 0 && moh_gguf_kv_type(g, at) != want)
                return moh_fail(err, MOH_E_FORMAT, "%s: %s is %s, expected %s (%s, as llama.cpp reads it)", path, keys[i],
                                moh_gguf_type_str(moh_gguf_kv_type(g, at)), moh_gguf_type_str(want),
                                k ? "a flag" : strstr(keys[i], "_count") ? "a count" : "a token id 0..n_tokens-1");
        }
    }
    const int64_t at = moh_gguf_find_key(g, "tokenizer.ggml.pre");
    if (at >= 0 && moh_gguf_kv_type(g, at) != MOH_GGUF_STRING)
        return moh_fail(err, MOH_E_FORMAT, "%s: tokenizer.ggml.pre is %s, expected a string (a pre-tokenizer name)", path,
                        moh_gguf_type_str(moh_gguf_kv_type(g, at)));
    /* scores: unused by BPE, but llama.cpp refuses them unless i32 / f32 and one per token */
    const int64_t sc = moh_gguf_find_key(g, "tokenizer.ggml.scores");
    uint64_t ns = 0, nt = 0;
    moh_gguf_type et = moh_gguf_arr_type(g, sc);
    if (sc >= 0 && (et != MOH_GGUF_I32 && et != MOH_GGUF_F32))
        return moh_fail(err, MOH_E_FORMAT, "%s: tokenizer.ggml.scores is %s%s, expected an array of f32 or i32", path,
                        moh_gguf_kv_type(g, sc) == MOH_GGUF_ARRAY ? "an array of " : "",
                        moh_gguf_type_str(moh_gguf_kv_type(g, sc) == MOH_GGUF_ARRAY ? et : moh_gguf_kv_type(g, sc)));
    if (sc >= 0 && !moh_gguf_get_arr(g, "tokenizer.ggml.scores", &et, &ns, err) &&
        !moh_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &nt, err) && ns < nt)
        return moh_fail(err, MOH_E_FORMAT, "%s: tokenizer.ggml.scores holds %llu values, expected >= %llu (one per token)",
                        path, (unsigned long long)ns, (unsigned long long)nt);
    return MOH_OK;
}

/* The flags llama.cpp's BPE tokenizer acts on when a prompt is tokenized with add_special
 * (llama_vocab::impl::tokenize): add_bos (default true for llama-bpe / llama3) puts the bos id
 * before the text and add_eos the eos id after it, both honoured (*bos / *eos: the id, -1 when
 * the flag is off; the ids default to 11 as llama.cpp's gpt2 vocab does, and an id key >= n_tokens
 * keeps that default). add_sep_token and add_space_prefix true are refused: moh adds no separator
 * and strips no space prefix. */
static int read_flags(const moh_gguf *g, const char *path, bool llama3, uint64_t n_tokens, int *bos, int *eos,
                      moh_error *err) {
    static const char *const keys[] = {"tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token",
                                       "tokenizer.ggml.add_sep_token", "tokenizer.ggml.add_space_prefix"};
    static const char *const ids[] = {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"};
    int *out[2] = {bos, eos};
    for (size_t k = 0; k < sizeof keys / sizeof *keys; k++) {
        bool v = k == 0 && llama3;
        const bool present = moh_gguf_find_key(g, keys[k]) >= 0;
        if (present && moh_gguf_get_bool(g, keys[k], &v, err)) return err ? err->code : MOH_E_FORMAT;
        if (k < 2) {
            uint32_t id = 11;
            if (moh_gguf_find_key(g, ids[k]) >= 0 && moh_gguf_get_u32(g, ids[k], &id, err))
                return err ? err->code : MOH_E_FORMAT;
            if (id >= n_tokens) id = 11;
            if (v && id >= n_tokens)
                return moh_fail(err, MOH_E_CONFIG, "%s: %s is true but %s names no token (expected an id < %llu)", path,
                                keys[k], ids[k], (unsigned long long)n_tokens);
            *out[k] = v ? (int)id : -1;
        } else if (v) {
            return moh_fail(err, MOH_E_CONFIG, "%s: %s is true, expected false (moh %s)", path, keys[k],
                            k == 3 ? "adds no space prefix" : "adds no separator token");
        }
    }
    return MOH_OK;
}

/* llama.cpp's pre-tokenizer "default" (also when tokenizer.ggml.pre is absent): llm_tokenizer_bpe's
 * default regex list, applied in order (the second is the GPT-2 regex, which llama.cpp splits with
 * its own code, as Hugging Face does: GPT-2's regex with the trailing \s+). */
static const char *const DEFAULT_RE[4] = {
    "[\\p{P}\\$\\+<=>\\^~\\|]+",
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+", "\\p{N}+",
    "[0-9][0-9][0-9]"};

int bpe_from_gguf(bpe_tok **out, const moh_gguf *g, const char *path, moh_error *err) {
    *out = NULL;
    const char *model = NULL, *pre = "default";
    size_t ml = 0, pl = 7;
    int rc = moh_gguf_get_str(g, "tokenizer.ggml.model", &model, &ml, err);
    if (rc) return rc;
    if (ml != 4 || memcmp(model, "gpt2", 4))
        return moh_fail(err, MOH_E_CONFIG, "%s: tokenizer.ggml.model is '%.*s', expected 'gpt2' (byte-level BPE; the "
                        "others are not supported yet)", path, (int)(ml < 32 ? ml : 32), model);
    if ((rc = check_key_types(g, path, err))) return rc;
    if (moh_gguf_find_key(g, "tokenizer.ggml.pre") >= 0 && (rc = moh_gguf_get_str(g, "tokenizer.ggml.pre", &pre, &pl, err)))
        return rc;
    if (pl == 4 && !memcmp(pre, "gpt2", 4)) /* bpe_pre_from_name's alias; llama.cpp's name is gpt-2 */
        return moh_fail(err, MOH_E_CONFIG, "%s: tokenizer.ggml.pre is 'gpt2', expected a name llama.cpp knows (gpt-2, "
                        "smollm, starcoder, refact, llama-bpe, llama3, default)", path);
    const bool llama3 = (pl == 9 && !memcmp(pre, "llama-bpe", 9)) || (pl == 6 && !memcmp(pre, "llama3", 6));
    moh_gguf_type et;
    uint64_t nt = 0, nm = 0, ntt = 0;
    if ((rc = moh_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &nt, err))) return rc;
    if (et != MOH_GGUF_STRING || nt == 0 || nt > (1u << 24))
        return moh_fail(err, MOH_E_FORMAT, "%s: tokenizer.ggml.tokens holds %llu %s, expected 1..2^24 strings", path,
                        (unsigned long long)nt, moh_gguf_type_str(et));
    int bos = -1, eos = -1;
    if ((rc = read_flags(g, path, llama3, nt, &bos, &eos, err))) return rc;
    if ((rc = moh_gguf_get_arr(g, "tokenizer.ggml.merges", &et, &nm, err))) return rc;
    if (et != MOH_GGUF_STRING || nm > (1u << 24))
        return moh_fail(err, MOH_E_FORMAT, "%s: tokenizer.ggml.merges holds %llu %s, expected strings", path,
                        (unsigned long long)nm, moh_gguf_type_str(et));
    const bool typed = moh_gguf_find_key(g, "tokenizer.ggml.token_type") >= 0;
    if (typed && ((rc = moh_gguf_get_arr(g, "tokenizer.ggml.token_type", &et, &ntt, err)) ||
                  (et != MOH_GGUF_I32 || ntt < nt))) /* llama.cpp: i32, n_toktypes >= n_tokens */
        return rc ? rc : moh_fail(err, MOH_E_FORMAT, "%s: tokenizer.ggml.token_type holds %llu %s, expected >= %llu i32",
                                  path, (unsigned long long)ntt, moh_gguf_type_str(et), (unsigned long long)nt);
    const char **toks = calloc(nt, sizeof *toks), **merges = calloc(nm ? nm : 1, sizeof *merges);
    int *added = calloc(nt, sizeof *added);
    char *pre_name = malloc(pl + 1);
    char (*empty)[32] = NULL;
    int n_added = 0;
    uint64_t n_empty = 0;
    size_t len;
    const char *tk = NULL;
    for (uint64_t i = 0; i < nt && !moh_gguf_get_arr_str(g, "tokenizer.ggml.tokens", i, &tk, &len, NULL); i++)
        n_empty += len == 0;
    if (!toks || !merges || !added || !pre_name || !(empty = calloc(n_empty + 1, sizeof *empty)))
        rc = moh_fail(err, MOH_E_NOMEM, "%s: out of memory", path);
    for (uint64_t i = 0, e = 0; !rc && i < nt; i++) {
        rc = moh_gguf_get_arr_str(g, "tokenizer.ggml.tokens", i, &toks[i], &len, err);
        if (!rc && len == 0) { /* llama.cpp names an empty token "[EMPTY_<id>]" */
            snprintf(empty[e], sizeof empty[e], "[EMPTY_%llu]", (unsigned long long)i);
            toks[i] = empty[e++];
        }
        int32_t ty = 1;
        if (!rc && typed) rc = moh_gguf_get_arr_i32(g, "tokenizer.ggml.token_type", i, &ty, err);
        /* llama.cpp's special-token cache: unknown (2), control (3), user-defined (4) */
        if (!rc && (ty == 2 || ty == 3 || ty == 4)) added[n_added++] = (int)i;
    }
    for (uint64_t i = 0; !rc && i < nm; i++) rc = moh_gguf_get_arr_str(g, "tokenizer.ggml.merges", i, &merges[i], &len, err);
    bpe_spec spec = {.tokens = toks, .n_tokens = (int)nt, .merges = merges, .n_merges = (int)nm, .added = added,
                     .n_added = n_added, .post_prefix = &bos, .n_post_prefix = bos >= 0, .post_suffix = &eos,
                     .n_post_suffix = eos >= 0};
    if (!rc && pl == 7 && !memcmp(pre, "default", 7)) { /* llama.cpp's default regex list */
        spec.pre = BPE_PRE_CUSTOM;
        spec.n_regex = 4;
        for (int k = 0; k < 4; k++) spec.pre_regex[k] = DEFAULT_RE[k];
    } else if (!rc) {
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
    free(empty);
    return rc;
}

/* Copies key from src to w when src has it as a u32, i32, bool or string (other types: left out). */
static int copy_key(const moh_gguf *src, moh_gguf_writer *w, const char *key, moh_error *err) {
    const int64_t i = moh_gguf_find_key(src, key);
    if (i < 0) return MOH_OK;
    int rc = MOH_OK;
    switch (moh_gguf_kv_type(src, i)) {
    case MOH_GGUF_U32: {
        uint32_t v = 0;
        if (!(rc = moh_gguf_get_u32(src, key, &v, err))) moh_gguf_add_u32(w, key, v);
        break;
    }
    case MOH_GGUF_I32: {
        int32_t v = 0;
        if (!(rc = moh_gguf_get_i32(src, key, &v, err))) moh_gguf_add_i32(w, key, v);
        break;
    }
    case MOH_GGUF_BOOL: {
        bool v = false;
        if (!(rc = moh_gguf_get_bool(src, key, &v, err))) moh_gguf_add_bool(w, key, v);
        break;
    }
    case MOH_GGUF_STRING: {
        const char *v = NULL;
        size_t n = 0;
        if ((rc = moh_gguf_get_str(src, key, &v, &n, err))) break;
        char *z = malloc(n + 1);
        if (!z) return moh_fail(err, MOH_E_NOMEM, "tokenizer export: out of memory");
        memcpy(z, v, n);
        z[n] = '\0';
        moh_gguf_add_str(w, key, z);
        free(z);
        break;
    }
    default: break;
    }
    return rc;
}

int bpe_to_gguf(const bpe_tok *t, int eos_id, const char *chat_template, const moh_gguf *src, moh_gguf_writer *w,
                moh_error *err) {
    static const char *const pre_names[] = {[BPE_PRE_GPT2] = "gpt-2", [BPE_PRE_SMOLLM] = "smollm",
                                            [BPE_PRE_LLAMA3] = "llama-bpe", [BPE_PRE_CUSTOM] = NULL};
    const bool src_pre = src && moh_gguf_find_key(src, "tokenizer.ggml.pre") >= 0;
    const bpe_pre kind = bpe_pre_kind(t);
    if (!src && !pre_names[kind])
        return moh_fail(err, MOH_E_ARG, "%s: the pre_tokenizer is a regex list of its own; llama.cpp knows pre-tokenizers by "
                        "name only (gpt-2: ByteLevel; smollm: Digits individual_digits + ByteLevel; llama-bpe: Split with "
                        "the LLaMA-3 regex + ByteLevel use_regex false, ignore_merges)",
                        bpe_source(t) ? bpe_source(t) : "tokenizer export");
    const int *pre_ids, *suf_ids;
    int n_pre = 0, n_suf = 0;
    bpe_post_ids(t, &pre_ids, &n_pre, &suf_ids, &n_suf);
    if (!src && (n_pre > 1 || n_suf > 1 || (n_suf == 1 && eos_id >= 0 && suf_ids[0] != eos_id)))
        return moh_fail(err, MOH_E_ARG, "%s: the post_processor puts %d id(s) before and %d after a text; llama.cpp "
                        "adds at most the bos id before (add_bos_token) and the eos id after (add_eos_token)%s",
                        bpe_source(t) ? bpe_source(t) : "tokenizer export", n_pre, n_suf,
                        n_suf == 1 && n_pre <= 1 ? ", and the eos id appended must be the end-of-turn id" : "");
    const int n = bpe_n_tokens(t);
    const bool src_types = src && moh_gguf_find_key(src, "tokenizer.ggml.token_type") >= 0;
    uint64_t nst = 0;
    moh_gguf_type et = MOH_GGUF_U8;
    if (src_types && moh_gguf_get_arr(src, "tokenizer.ggml.token_type", &et, &nst, err)) return err->code;
    const char **toks = calloc((size_t)n, sizeof *toks);
    char (*unused)[24] = NULL;
    int32_t *types = calloc((size_t)n, sizeof *types);
    int *ml = NULL, *mr = NULL, nm = 0, rc = MOH_OK, n_unused = 0;
    const char **merges = NULL;
    char *mbuf = NULL;
    for (int i = 0; i < n; i++) n_unused += bpe_token_str(t, i) == NULL;
    if (!toks || !types || !(unused = calloc((size_t)n_unused + 1, sizeof *unused)))
        rc = moh_fail(err, MOH_E_NOMEM, "tokenizer export: out of memory");
    for (int i = 0, u = 0; !rc && i < n; i++) {
        toks[i] = bpe_token_str(t, i);
        types[i] = 1; /* LLAMA_TOKEN_TYPE_NORMAL */
        if (!toks[i]) { /* no token with this id: a placeholder llama.cpp never produces */
            snprintf(unused[u], sizeof unused[u], "[UNUSED_%d]", i);
            toks[i] = unused[u++];
            types[i] = 5; /* UNUSED */
        } else if (bpe_is_added(t, i)) {
            int32_t st = 3;
            if (src_types && et == MOH_GGUF_I32 && (uint64_t)i < nst &&
                (rc = moh_gguf_get_arr_i32(src, "tokenizer.ggml.token_type", (uint64_t)i, &st, err)))
                break;
            types[i] = st == 4 ? 4 : 3; /* USER_DEFINED as given, else CONTROL */
        }
    }
    if (!rc) rc = bpe_merge_ids(t, &ml, &mr, &nm, err);
    size_t mbytes = 0;
    for (int i = 0; !rc && i < nm; i++) mbytes += strlen(toks[ml[i]]) + strlen(toks[mr[i]]) + 2;
    if (!rc && (!(merges = calloc((size_t)nm + 1, sizeof *merges)) || !(mbuf = malloc(mbytes + 1))))
        rc = moh_fail(err, MOH_E_NOMEM, "tokenizer export: out of memory");
    for (int i = 0, off = 0; !rc && i < nm; i++) {
        merges[i] = mbuf + off;
        off += sprintf(mbuf + off, "%s %s", toks[ml[i]], toks[mr[i]]) + 1;
    }
    if (!rc) {
        moh_gguf_add_str(w, "tokenizer.ggml.model", "gpt2");
        if (src_pre) rc = copy_key(src, w, "tokenizer.ggml.pre", err);
        else if (src) moh_gguf_add_str(w, "tokenizer.ggml.pre", "default"); /* what llama.cpp read it as */
        else moh_gguf_add_str(w, "tokenizer.ggml.pre", pre_names[kind]);
        moh_gguf_add_arr_str(w, "tokenizer.ggml.tokens", toks, (uint64_t)n);
        moh_gguf_add_arr_i32(w, "tokenizer.ggml.token_type", types, (uint64_t)n);
        moh_gguf_add_arr_str(w, "tokenizer.ggml.merges", merges, (uint64_t)nm);
    }
    static const char *const extras[] = {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                                         "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.seperator_token_id",
                                         "tokenizer.ggml.padding_token_id", "tokenizer.ggml.add_bos_token",
                                         "tokenizer.ggml.add_eos_token", "tokenizer.ggml.add_space_prefix",
                                         "tokenizer.chat_template"};
    for (size_t k = 0; !rc && src && k < sizeof extras / sizeof extras[0]; k++) {
        const int64_t at = moh_gguf_find_key(src, extras[k]);
        const bool ct = !strcmp(extras[k], "tokenizer.chat_template"); /* text only (another type: dropped) */
        if (at >= 0 && (!ct || moh_gguf_kv_type(src, at) == MOH_GGUF_STRING)) rc = copy_key(src, w, extras[k], err);
    }
    if (!rc && !src) {
        if (n_suf) eos_id = suf_ids[0];
        if (eos_id >= 0 && eos_id < n) moh_gguf_add_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)eos_id);
        if (n_pre) moh_gguf_add_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)pre_ids[0]);
        moh_gguf_add_bool(w, "tokenizer.ggml.add_bos_token", n_pre == 1); /* the post_processor's ids */
        moh_gguf_add_bool(w, "tokenizer.ggml.add_eos_token", n_suf == 1);
        if (chat_template) moh_gguf_add_str(w, "tokenizer.chat_template", chat_template);
    }
    free(toks);
    free(unused);
    free(types);
    free(ml);
    free(mr);
    free(merges);
    free(mbuf);
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
