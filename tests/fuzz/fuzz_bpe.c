/* libFuzzer target: the byte-level BPE tokenizer (src/text/bpe.c) on arbitrary bytes.
 * Byte 0 % 4 == 0: the rest is a tokenizer.json; a failure must leave no tokenizer and a one-line
 * message starting with the label; a success must encode the same bytes (or give up with
 * MOH_E_FORMAT when PCRE2 does on a fuzzed regex), decode them, and the streaming decoder must
 * give exactly the decoded bytes, and moh's tokenizer.json of it must read back to the same ids.
 * Byte 0 % 4 == 1 also reads the rest as a tokenizer_config.json. Otherwise the rest is text for the
 * committed fixture tokenizer tests/fixtures/bpe/{smollm,gpt2,llama3}.json (byte 0 % 4 - 1; run
 * from the repository root): decode(encode(x)) == x with and without added tokens, and the stream
 * gives the same bytes without splitting a character of valid UTF-8. Violations trap. */
#include <stdlib.h>
#include <string.h>

#include "text/bpe.h"
#include "../test_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* Read-only after LLVMFuzzerInitialize. */
static bpe_tok *fixture[3];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    static const char *const names[] = {"tests/fixtures/bpe/smollm.json", "tests/fixtures/bpe/gpt2.json",
                                        "tests/fixtures/bpe/llama3.json"};
    for (int i = 0; i < 3; i++) {
        moh_error err = {0};
        if (bpe_load_tokenizer_json(&fixture[i], names[i], &err) != MOH_OK) __builtin_trap();
    }
    return 0;
}


/* Encodes x; returns the decoded bytes (malloc'd) after checking the stream against them. */
static uint8_t *encode_decode(const bpe_tok *t, const uint8_t *x, size_t n, bool parse_added,
                              size_t *dl) {
    moh_error err = {0};
    int *ids = NULL;
    size_t ni = 0;
    int rc = bpe_encode(t, x, n, parse_added, &ids, &ni, &err);
    /* only a regex from the fuzzed tokenizer.json may give up (PCRE2's match limit) */
    if (rc == MOH_E_FORMAT && t != fixture[0] && t != fixture[1] && t != fixture[2] && !ids &&
        !strchr(err.msg, '\n'))
        return NULL;
    if (rc != MOH_OK) __builtin_trap();
    if ((ni == 0) != (ids == NULL)) __builtin_trap();
    uint8_t *d = NULL;
    if (bpe_decode(t, ids, ni, &d, dl, &err) != MOH_OK) __builtin_trap();
    size_t cap = bpe_max_token_bytes(t) + 3, k = 0;
    uint8_t *chunk = malloc(cap);
    bpe_stream s = {0};
    bool valid = utf8_valid(d, *dl);
    for (size_t i = 0; i < ni; i++) {
        size_t c;
        if (bpe_stream_push(t, &s, ids[i], chunk, cap, &c, &err) != MOH_OK) __builtin_trap();
        if (k + c > *dl || memcmp(chunk, d + k, c) != 0) __builtin_trap();
        if (valid && !utf8_valid(chunk, c)) __builtin_trap();
        k += c;
    }
    uint8_t tail[4];
    size_t c = bpe_stream_flush(&s, tail);
    if (c > 3 || (valid && c) || k + c != *dl || memcmp(tail, d + k, c) != 0) __builtin_trap();
    free(chunk);
    free(ids);
    return d;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const uint8_t *x = data + 1;
    size_t n = size - 1;
    int mode = data[0] % 4;
    size_t dl;
    if (mode == 0) {
        moh_error err = {0};
        bpe_tok *t = NULL;
        int rc = bpe_from_tokenizer_json(&t, (const char *)x, n, "fuzz.json", &err);
        if (rc != MOH_OK) {
            if (t || err.code != rc || strchr(err.msg, '\n') || strncmp(err.msg, "fuzz.json", 9))
                __builtin_trap();
            return 0;
        }
        free(encode_decode(t, x, n, true, &dl));
        /* moh's tokenizer.json of it reads back to a tokenizer with the same ids */
        char *js = NULL;
        size_t jl = 0;
        bpe_tok *back = NULL;
        if (bpe_to_tokenizer_json(t, &js, &jl, &err) != MOH_OK ||
            bpe_from_tokenizer_json(&back, js, jl, "written.json", &err) != MOH_OK ||
            bpe_n_tokens(back) > bpe_n_tokens(t))
            __builtin_trap();
        int *a = NULL, *b = NULL;
        size_t na = 0, nb = 0;
        const int ra = bpe_encode(t, x, n, true, &a, &na, &err), rb = bpe_encode(back, x, n, true, &b, &nb, &err);
        if (ra != rb || na != nb || (na && memcmp(a, b, na * sizeof(int)))) __builtin_trap();
        free(a);
        free(b);
        free(js);
        bpe_free(back);
        bpe_free(t);
        return 0;
    }
    if (mode == 1) { /* tokenizer_config.json for the smollm fixture: a result or one error line */
        moh_error err = {0};
        int eos = -2;
        char *ct = NULL;
        const int rc = bpe_read_tokenizer_config(fixture[0], (const char *)x, n, "tc.json", &eos, &ct, &err);
        if (rc != MOH_OK && (ct || eos != -1 || strchr(err.msg, '\n') || strncmp(err.msg, "tc.json", 7)))
            __builtin_trap();
        if (eos < -1 || eos >= bpe_n_tokens(fixture[0])) __builtin_trap();
        free(ct);
    }
    const bpe_tok *t = fixture[mode - 1];
    for (int pa = 0; pa < 2; pa++) {
        uint8_t *d = encode_decode(t, x, n, pa, &dl);
        if (!d || dl != n || (n && memcmp(d, x, n) != 0)) __builtin_trap();
        free(d);
    }
    return 0;
}
