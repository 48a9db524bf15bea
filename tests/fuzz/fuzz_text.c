/* libFuzzer target: the text data pipeline (src/data/text.c) on arbitrary bytes.
 * Input: byte 0 -> val_fraction = (b0 + 1) / 257, byte 1 -> min_bytes, byte 2 -> T = 1 + b2 % 64,
 * byte 3 -> B = 1 + b3 % 4; the rest is the text. Invariants (trap on violation): an error leaves d
 * empty with a one-line message starting with the label; a split preserves the bytes, starts val
 * at a line start (the last one at or before len - ceil(len * val_fraction)) and honours
 * min_bytes; entropy is in [0, 8]; batches replay from a saved rng state, match the windows drawn
 * by moh_rng_next, and refuse short splits; eval chunks cover every byte but each chunk's first. */
#include "core/rng.h"
#include "data/text.h"

#include <math.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_T 64
#define MAX_B 4

static void check_batch(const uint8_t *bytes, size_t n, int B, int T, uint64_t seed) {
    static const int zero[MAX_B * MAX_T];
    int tok[MAX_B * MAX_T], tgt[MAX_B * MAX_T], tok2[MAX_B * MAX_T], tgt2[MAX_B * MAX_T];
    memset(tok, 0, sizeof tok);
    memset(tgt, 0, sizeof tgt);
    moh_error err;
    memset(&err, 0, sizeof err);
    uint64_t rng = seed;
    int rc = text_batch(bytes, n, B, T, &rng, tok, tgt, &err);
    if (n < (size_t)T + 1) {
        if (rc != MOH_E_ARG || rng != seed || strchr(err.msg, '\n')) __builtin_trap();
        if (memcmp(tok, zero, sizeof tok) != 0) __builtin_trap(); /* nothing written */
        return;
    }
    if (rc != MOH_OK) __builtin_trap();
    uint64_t rng2 = seed;
    if (text_batch(bytes, n, B, T, &rng2, tok2, tgt2, &err) != MOH_OK || rng2 != rng)
        __builtin_trap();
    size_t cnt = (size_t)B * (size_t)T;
    if (memcmp(tok, tok2, cnt * sizeof(int)) != 0 || memcmp(tgt, tgt2, cnt * sizeof(int)) != 0)
        __builtin_trap();
    /* Replay the draws: offset = r % m for the first r >= 2^64 mod m. */
    uint64_t replay = seed, m = (uint64_t)(n - (size_t)T), below = (0 - m) % m;
    for (int b = 0; b < B; b++) {
        uint64_t r;
        do r = moh_rng_next(&replay);
        while (r < below);
        const uint8_t *w = bytes + (size_t)(r % m);
        for (int t = 0; t < T; t++)
            if (tok[b * T + t] != w[t] || tgt[b * T + t] != w[t + 1]) __builtin_trap();
    }
    if (replay != rng) __builtin_trap();
}

static void check_eval(const uint8_t *bytes, size_t n, int T) {
    int tok[MAX_T], tgt[MAX_T];
    long nc = text_eval_num_chunks(n, T);
    size_t L = (size_t)T + 1;
    if (nc != (long)(n / L + (n % L >= 2))) __builtin_trap();
    long preds = 0;
    for (long c = 0; c < nc; c++) {
        int k = text_eval_chunk(bytes, n, T, c, tok, tgt);
        if (k < 1 || k > T) __builtin_trap();
        size_t start = (size_t)c * L;
        if (start + (size_t)k > n - 1) __builtin_trap(); /* targets stay inside the text */
        if (k < T && start + (size_t)k + 1 != n) __builtin_trap(); /* only the last chunk is short */
        for (int i = 0; i < k; i++)
            if (tok[i] != bytes[start + (size_t)i] || tgt[i] != bytes[start + (size_t)i + 1])
                __builtin_trap();
        preds += k;
    }
    if (text_eval_chunk(bytes, n, T, nc, tok, tgt) != 0) __builtin_trap();
    if (preds != (long)n - nc - (n % L == 1)) __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 4) return 0;
    double f = (data[0] + 1) / 257.0;
    size_t min_bytes = data[1] < 192 ? (size_t)(data[1] % 32) : (size_t)(data[1] - 191) * 64;
    int T = 1 + data[2] % MAX_T;
    int B = 1 + data[3] % MAX_B;
    const uint8_t *text = data + 4;
    size_t len = size - 4;

    text_data d;
    moh_error err;
    memset(&err, 0, sizeof err);
    int rc = text_data_from_buffer(&d, len ? text : NULL, len, f, min_bytes, "fuzz.txt", &err);
    if (rc != MOH_OK) {
        if (rc != MOH_E_FORMAT || err.code != rc) __builtin_trap();
        if (d.train || d.val || d.n_train || d.n_val) __builtin_trap();
        if (!memchr(err.msg, '\0', sizeof err.msg) || strchr(err.msg, '\n')) __builtin_trap();
        if (strncmp(err.msg, "fuzz.txt: ", 10) != 0) __builtin_trap();
        return 0;
    }
    /* The split contract. */
    size_t p = d.n_train;
    if (len == 0 || p + d.n_val != len || d.val != d.train + p) __builtin_trap();
    if (memcmp(d.train, text, p) != 0 || memcmp(d.val, text + p, d.n_val) != 0) __builtin_trap();
    if (p > 0 && text[p - 1] != '\n') __builtin_trap();
    size_t k = (size_t)ceil((double)len * f);
    if (k < 1) k = 1;
    if (k > len) k = len;
    size_t target = len - k;
    if (p > target || memchr(text + p, '\n', target - p)) __builtin_trap();
    if (d.n_train < min_bytes || d.n_val < min_bytes) __builtin_trap();
    if (memchr(text, 0, len < TEXT_BINARY_SCAN ? len : TEXT_BINARY_SCAN)) __builtin_trap();

    double ht = text_entropy_bits(d.train, d.n_train), hv = text_entropy_bits(d.val, d.n_val);
    if (!(ht >= 0.0 && ht <= 8.0 + 1e-9 && hv >= 0.0 && hv <= 8.0 + 1e-9)) __builtin_trap();

    uint64_t seed = (uint64_t)len * 0x9E3779B97F4A7C15ull ^ data[0];
    check_batch(d.train, d.n_train, B, T, seed);
    check_batch(d.val, d.n_val, B, T, ~seed);
    check_eval(d.train, d.n_train, T);
    check_eval(d.val, d.n_val, T);
    text_data_free(&d);
    if (d.train || d.n_train) __builtin_trap();
    return 0;
}
