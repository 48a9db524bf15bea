/* Byte-level text data (src/data/text.c): train/val split at line starts, prepared directories,
 * every error (min_bytes, empty, binary, missing, bad arguments), batch determinism and offsets,
 * evaluation chunk counts and coverage, order-0 entropy. */
#include <math.h>
#include <stdarg.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/rng.h"
#include "data/text.h"
#include "test_util.h"

/* ---- helpers ---------------------------------------------------------------------------------- */

/* rc must be want and the message one line starting with prefix (if any) holding every word. */
static void expect_err(test_ctx *t, const char *what, int rc, int want, const moh_error *err,
                       const char *prefix, ...) {
    CHECK(t, rc == want, "%s: rc %d, want %d (%s)", what, rc, want, err->msg);
    CHECK(t, err->code == want, "%s: err.code %d, want %d", what, err->code, want);
    CHECK(t, strchr(err->msg, '\n') == NULL, "%s: message not one line: %s", what, err->msg);
    if (prefix)
        CHECK(t, strncmp(err->msg, prefix, strlen(prefix)) == 0, "%s: message does not start with "
              "'%s': %s", what, prefix, err->msg);
    va_list ap;
    va_start(ap, prefix);
    for (const char *w; (w = va_arg(ap, const char *));)
        CHECK(t, strstr(err->msg, w) != NULL, "%s: '%s' not in message: %s", what, w, err->msg);
    va_end(ap);
    printf("  [%s] %s\n", what, err->msg);
}

static int write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = n ? fwrite(data, 1, n, f) : 0;
    return (fclose(f) == 0 && w == n) ? 0 : -1;
}

static int is_empty(const text_data *d) {
    return d->train == NULL && d->val == NULL && d->n_train == 0 && d->n_val == 0;
}

/* The split contract on buf: contents preserved, val at a line start, the largest line start at
 * or before len - ceil(len * f). */
static void check_split(test_ctx *t, const char *what, const text_data *d, const uint8_t *buf,
                        size_t len, double f) {
    CHECK(t, d->n_train + d->n_val == len, "%s: %zu + %zu != %zu", what, d->n_train, d->n_val, len);
    if (d->n_train + d->n_val != len) return;
    CHECK(t, d->val == d->train + d->n_train, "%s: val does not follow train", what);
    CHECK(t, memcmp(d->train, buf, d->n_train) == 0, "%s: train differs", what);
    CHECK(t, memcmp(d->val, buf + d->n_train, d->n_val) == 0, "%s: val differs", what);
    size_t p = d->n_train;
    CHECK(t, p == 0 || buf[p - 1] == '\n', "%s: val starts mid-line at %zu", what, p);
    size_t k = (size_t)ceil((double)len * f);
    if (k == 0) k = 1;
    if (k > len) k = len;
    size_t target = len - k;
    CHECK(t, p <= target, "%s: val start %zu after target %zu", what, p, target);
    for (size_t i = p; i < target; i++)
        if (buf[i] == '\n') {
            CHECK(t, 0, "%s: line start %zu between val start %zu and target %zu", what, i + 1, p,
                  target);
            break;
        }
}

/* ---- split -------------------------------------------------------------------------------------- */

static void test_split_buffer(test_ctx *t) {
    const char *s = "aaaa\nbbbb\ncccc\ndddd\n"; /* 20 bytes, lines of 5 */
    const uint8_t *b = (const uint8_t *)s;
    struct { double f; size_t n_val; } cases[] = {
        {0.25, 5},  /* target 15 is a line start */
        {0.2, 5},   /* target 16 moves back to 15 */
        {0.05, 5},  /* k = 1: the last line */
        {0.3, 10},  /* target 14 moves back to 10 */
        {0.5, 10},  /* target 10 */
        {0.51, 15}, /* k = 11, target 9 moves back to 5 */
        {0.99, 20}, /* everything; train empty */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        text_data d;
        moh_error err = {0};
        int rc = text_data_from_buffer(&d, b, 20, cases[i].f, 0, "lines", &err);
        CHECK(t, rc == MOH_OK, "f=%g: rc %d (%s)", cases[i].f, rc, err.msg);
        if (rc != MOH_OK) continue;
        CHECK(t, d.n_val == cases[i].n_val, "f=%g: n_val %zu, want %zu", cases[i].f, d.n_val,
              cases[i].n_val);
        check_split(t, "lines", &d, b, 20, cases[i].f);
        text_data_free(&d);
        CHECK(t, is_empty(&d), "text_data_free leaves d zeroed");
        text_data_free(&d); /* twice is fine */
    }

    /* No trailing newline: the last (partial) line is val. */
    {
        text_data d;
        moh_error err = {0};
        const char *u = "first line\nsecond line\nthird";
        int rc = text_data_from_buffer(&d, (const uint8_t *)u, strlen(u), 0.1, 1, NULL, &err);
        CHECK(t, rc == MOH_OK && d.n_val == 5 && memcmp(d.val, "third", 5) == 0,
              "no trailing newline: rc %d n_val %zu", rc, d.n_val);
        text_data_free(&d);
    }

    /* Random texts with random line lengths and fractions: the contract holds. */
    test_rng r = {0x1234567ULL};
    for (int it = 0; it < 300; it++) {
        size_t len = 1 + (size_t)(test_rng_u64(&r) % 3000);
        uint8_t *buf = malloc(len);
        int nl_every = 1 + (int)(test_rng_u64(&r) % 120);
        for (size_t i = 0; i < len; i++) {
            uint8_t c = (uint8_t)(1 + test_rng_u64(&r) % 255);
            if (c == '\n' || test_rng_u64(&r) % (uint64_t)nl_every == 0) c = '\n';
            buf[i] = c;
        }
        double f = 0.001 + 0.998 * (test_rng_uniform(&r) * 0.5 + 0.5);
        text_data d;
        moh_error err = {0};
        int rc = text_data_from_buffer(&d, buf, len, f, 0, "rand", &err);
        CHECK(t, rc == MOH_OK, "random %d: rc %d (%s)", it, rc, err.msg);
        if (rc == MOH_OK) check_split(t, "random", &d, buf, len, f);
        text_data_free(&d);
        free(buf);
    }
}

static void test_split_errors(test_ctx *t) {
    const char *s = "aaaa\nbbbb\ncccc\ndddd\n";
    const uint8_t *b = (const uint8_t *)s;
    text_data d;
    moh_error err;
    int rc;

    memset(&err, 0, sizeof err);
    rc = text_data_from_buffer(&d, b, 20, 0.25, 6, "small.txt", &err);
    expect_err(t, "val < min_bytes", rc, MOH_E_FORMAT, &err, "small.txt: ", "validation split",
               "5 bytes", "need at least 6", NULL);
    CHECK(t, is_empty(&d), "d not emptied on error");

    memset(&err, 0, sizeof err);
    rc = text_data_from_buffer(&d, b, 20, 0.9, 6, "small.txt", &err);
    expect_err(t, "train < min_bytes", rc, MOH_E_FORMAT, &err, "small.txt: ", "training split",
               "need at least 6", NULL);

    memset(&err, 0, sizeof err);
    rc = text_data_from_buffer(&d, (const uint8_t *)"one long line", 13, 0.2, 1, "one.txt", &err);
    expect_err(t, "single line", rc, MOH_E_FORMAT, &err, "one.txt: ", "training split has 0 bytes",
               "need at least 1", "begins at byte 0", NULL);
    memset(&err, 0, sizeof err);
    rc = text_data_from_buffer(&d, (const uint8_t *)"one long line", 13, 0.2, 0, "one.txt", &err);
    CHECK(t, rc == MOH_OK && d.n_train == 0 && d.n_val == 13, "single line, min 0: rc %d", rc);
    text_data_free(&d);

    memset(&err, 0, sizeof err);
    rc = text_data_from_buffer(&d, b, 0, 0.1, 0, "empty.txt", &err);
    expect_err(t, "empty", rc, MOH_E_FORMAT, &err, "empty.txt: ", "empty", NULL);
    rc = text_data_from_buffer(&d, NULL, 0, 0.1, 0, NULL, &err);
    expect_err(t, "empty NULL", rc, MOH_E_FORMAT, &err, "<memory>: ", "empty", NULL);

    /* NUL in the first 64 KiB: binary; after it: fine (bytes are bytes). */
    size_t n = 70000;
    uint8_t *big = malloc(n);
    for (size_t i = 0; i < n; i++) big[i] = (i % 50 == 49) ? '\n' : (uint8_t)('a' + i % 26);
    big[1234] = 0;
    memset(&err, 0, sizeof err);
    rc = text_data_from_buffer(&d, big, n, 0.1, 0, "model.bin", &err);
    expect_err(t, "binary", rc, MOH_E_FORMAT, &err, "model.bin: ", "looks binary", "offset 1234",
               NULL);
    big[1234] = 'x';
    big[66000] = 0;
    rc = text_data_from_buffer(&d, big, n, 0.1, 0, "late.txt", &err);
    CHECK(t, rc == MOH_OK, "NUL after 64 KiB accepted: rc %d (%s)", rc, err.msg);
    text_data_free(&d);
    big[66000] = 0xff; /* invalid UTF-8 is fine */
    big[0] = 0xc3;
    rc = text_data_from_buffer(&d, big, n, 0.1, 0, "latin1.txt", &err);
    CHECK(t, rc == MOH_OK, "invalid UTF-8 accepted: rc %d (%s)", rc, err.msg);
    text_data_free(&d);
    free(big);

    const double bad_f[] = {0.0, 1.0, -0.1, 1.5, NAN, INFINITY};
    for (size_t i = 0; i < sizeof bad_f / sizeof bad_f[0]; i++) {
        memset(&err, 0, sizeof err);
        rc = text_data_from_buffer(&d, b, 20, bad_f[i], 0, "f.txt", &err);
        expect_err(t, "bad val_fraction", rc, MOH_E_ARG, &err, "f.txt: ", "val_fraction",
                   "(0, 1)", NULL);
    }
    rc = text_data_from_buffer(NULL, b, 20, 0.1, 0, "x", &err);
    CHECK(t, rc == MOH_E_ARG, "NULL d: rc %d", rc);
    rc = text_data_from_buffer(&d, NULL, 20, 0.1, 0, "x", &err);
    CHECK(t, rc == MOH_E_ARG, "NULL buf: rc %d", rc);
    rc = text_data_from_buffer(&d, b, 20, 0.1, 0, "x", NULL); /* err may be NULL */
    CHECK(t, rc == MOH_OK, "NULL err: rc %d", rc);
    text_data_free(&d);
    text_data_free(NULL);
}

static void test_load_files(test_ctx *t) {
    char dir[] = "/tmp/moh_test_text_XXXXXX";
    if (!mkdtemp(dir)) {
        CHECK(t, 0, "mkdtemp failed");
        return;
    }
    char p_file[256], p_empty[256], p_bin[256], p_split[256], p_tr[256], p_va[256], p_missing[256];
    snprintf(p_file, sizeof p_file, "%s/corpus.txt", dir);
    snprintf(p_empty, sizeof p_empty, "%s/empty.txt", dir);
    snprintf(p_bin, sizeof p_bin, "%s/weights.bin", dir);
    snprintf(p_split, sizeof p_split, "%s/prepared", dir);
    snprintf(p_tr, sizeof p_tr, "%s/prepared/train.txt", dir);
    snprintf(p_va, sizeof p_va, "%s/prepared/val.txt", dir);
    snprintf(p_missing, sizeof p_missing, "%s/nope.txt", dir);

    const char *text = "In the beginning\nwas the word,\nand the word\nwas bytes.\n";
    size_t tn = strlen(text);
    const uint8_t bin[8] = {0x7f, 'E', 'L', 'F', 2, 1, 1, 0};
    CHECK(t, write_file(p_file, text, tn) == 0, "write %s", p_file);
    CHECK(t, write_file(p_empty, "", 0) == 0, "write %s", p_empty);
    CHECK(t, write_file(p_bin, bin, sizeof bin) == 0, "write %s", p_bin);
    CHECK(t, mkdir(p_split, 0755) == 0, "mkdir %s", p_split);

    text_data d, e;
    moh_error err = {0};
    int rc = text_data_load(&d, p_file, 0.2, 4, &err);
    CHECK(t, rc == MOH_OK, "load file: rc %d (%s)", rc, err.msg);
    if (rc == MOH_OK) {
        check_split(t, "file", &d, (const uint8_t *)text, tn, 0.2);
        CHECK(t, d.n_val == 11 && memcmp(d.val, "was bytes.\n", 11) == 0, "file val: %zu bytes",
              d.n_val);
        rc = text_data_from_buffer(&e, (const uint8_t *)text, tn, 0.2, 4, "buf", &err);
        CHECK(t, rc == MOH_OK && e.n_train == d.n_train && e.n_val == d.n_val,
              "file and buffer split alike");
        text_data_free(&e);
    }
    text_data_free(&d);

    memset(&err, 0, sizeof err);
    rc = text_data_load(&d, p_file, 0.2, 100, &err);
    expect_err(t, "file min_bytes", rc, MOH_E_FORMAT, &err, p_file, "need at least 100", NULL);
    CHECK(t, is_empty(&d), "d not emptied on error");

    memset(&err, 0, sizeof err);
    rc = text_data_load(&d, p_missing, 0.1, 0, &err);
    expect_err(t, "missing file", rc, MOH_E_IO, &err, p_missing, "cannot open", NULL);
    memset(&err, 0, sizeof err);
    rc = text_data_load(&d, p_empty, 0.1, 0, &err);
    expect_err(t, "empty file", rc, MOH_E_FORMAT, &err, p_empty, "empty", NULL);
    memset(&err, 0, sizeof err);
    rc = text_data_load(&d, p_bin, 0.1, 0, &err);
    expect_err(t, "binary file", rc, MOH_E_FORMAT, &err, p_bin, "looks binary", NULL);
    memset(&err, 0, sizeof err);
    rc = text_data_load(&d, "/dev/null", 0.1, 0, &err);
    expect_err(t, "device", rc, MOH_E_IO, &err, "/dev/null", "not a regular file", NULL);
    memset(&err, 0, sizeof err);
    rc = text_data_load(&d, p_file, 0.0, 0, &err);
    expect_err(t, "load val_fraction 0", rc, MOH_E_ARG, &err, p_file, "val_fraction", NULL);
    rc = text_data_load(&d, NULL, 0.1, 0, &err);
    CHECK(t, rc == MOH_E_ARG, "NULL path: rc %d", rc);

    /* Prepared directory: missing val.txt, then both files taken as they are. */
    CHECK(t, write_file(p_tr, "train line one\ntrain line two\n", 30) == 0, "write %s", p_tr);
    memset(&err, 0, sizeof err);
    rc = text_data_load(&d, p_split, 0.1, 0, &err);
    expect_err(t, "dir without val.txt", rc, MOH_E_IO, &err, p_va, "cannot open", "val.txt", NULL);
    CHECK(t, write_file(p_va, "val line\n", 9) == 0, "write %s", p_va);
    memset(&err, 0, sizeof err);
    rc = text_data_load(&d, p_split, 0.5, 9, &err);
    CHECK(t, rc == MOH_OK, "load dir: rc %d (%s)", rc, err.msg);
    if (rc == MOH_OK) {
        CHECK(t, d.n_train == 30 && memcmp(d.train, "train line one\ntrain line two\n", 30) == 0,
              "dir train: %zu bytes", d.n_train);
        CHECK(t, d.n_val == 9 && memcmp(d.val, "val line\n", 9) == 0, "dir val: %zu bytes",
              d.n_val);
    }
    text_data_free(&d);
    char slash[300];
    snprintf(slash, sizeof slash, "%s/", p_split);
    rc = text_data_load(&d, slash, 0.5, 9, &err);
    CHECK(t, rc == MOH_OK && d.n_val == 9, "load dir with trailing slash: rc %d (%s)", rc, err.msg);
    text_data_free(&d);
    memset(&err, 0, sizeof err);
    rc = text_data_load(&d, p_split, 0.5, 10, &err);
    expect_err(t, "dir val < min_bytes", rc, MOH_E_FORMAT, &err, p_va, "9 bytes",
               "need at least 10", NULL);
    CHECK(t, write_file(p_va, "", 0) == 0, "truncate %s", p_va);
    memset(&err, 0, sizeof err);
    rc = text_data_load(&d, p_split, 0.5, 0, &err);
    expect_err(t, "dir empty val", rc, MOH_E_FORMAT, &err, p_va, "empty", NULL);
    CHECK(t, write_file(p_tr, bin, sizeof bin) == 0, "write %s", p_tr);
    CHECK(t, write_file(p_va, "v\n", 2) == 0, "write %s", p_va);
    memset(&err, 0, sizeof err);
    rc = text_data_load(&d, p_split, 0.5, 0, &err);
    expect_err(t, "dir binary train", rc, MOH_E_FORMAT, &err, p_tr, "looks binary", NULL);

    unlink(p_tr);
    unlink(p_va);
    rmdir(p_split);
    unlink(p_file);
    unlink(p_empty);
    unlink(p_bin);
    CHECK(t, rmdir(dir) == 0, "temp dir %s left non-empty", dir);

    /* The real corpus when tools/data/fetch.sh has run (CTest runs from the repository root). */
    struct stat sb;
    if (stat("data/kjv/train.txt", &sb) == 0) {
        memset(&err, 0, sizeof err);
        rc = text_data_load(&d, "data/kjv", 0.05, 1025, &err);
        CHECK(t, rc == MOH_OK, "data/kjv: rc %d (%s)", rc, err.msg);
        if (rc == MOH_OK) {
            CHECK(t, d.n_val > 100000 && d.n_train > 15 * d.n_val, "data/kjv sizes %zu/%zu",
                  d.n_train, d.n_val);
            CHECK(t, d.n_val > 14 && memcmp(d.val, "\nColossians 1\n", 14) == 0,
                  "data/kjv val starts with Colossians 1");
            printf("  data/kjv: train %zu bytes (%.4f bits/byte), val %zu bytes (%.4f bits/byte)\n",
                   d.n_train, text_entropy_bits(d.train, d.n_train), d.n_val,
                   text_entropy_bits(d.val, d.n_val));
        }
        text_data_free(&d);
    } else {
        printf("  data/kjv absent (tools/data/fetch.sh not run): skipped\n");
    }
}

/* ---- batches ---------------------------------------------------------------------------------- */

static void test_splitmix(test_ctx *t) {
    /* splitmix64 reference values (Vigna), seed 0. */
    uint64_t s = 0;
    CHECK(t, moh_rng_next(&s) == 0xe220a8397b1dcdafULL, "splitmix64 #1");
    CHECK(t, moh_rng_next(&s) == 0x6e789e6aa1b965f4ULL, "splitmix64 #2");
    CHECK(t, moh_rng_next(&s) == 0x06c45d188009454fULL, "splitmix64 #3");
    CHECK(t, s == 3 * 0x9E3779B97F4A7C15ULL, "state advanced by the increment");
}

static void test_batches(test_ctx *t) {
    enum { N = 200, B = 8, T = 16 };
    uint8_t bytes[N];
    for (int i = 0; i < N; i++) bytes[i] = (uint8_t)i; /* the byte tells its offset */
    int tok1[B * T], tgt1[B * T], tok2[B * T], tgt2[B * T];
    moh_error err = {0};

    uint64_t rng = 42, saved = 42;
    int rc = text_batch(bytes, N, B, T, &rng, tok1, tgt1, &err);
    CHECK(t, rc == MOH_OK, "batch: rc %d (%s)", rc, err.msg);
    uint64_t after = rng;
    rng = saved;
    rc = text_batch(bytes, N, B, T, &rng, tok2, tgt2, &err);
    CHECK(t, rc == MOH_OK && rng == after, "same state, same rng advance");
    CHECK(t, memcmp(tok1, tok2, sizeof tok1) == 0 && memcmp(tgt1, tgt2, sizeof tgt1) == 0,
          "same state, same batch");
    rc = text_batch(bytes, N, B, T, &rng, tok2, tgt2, &err); /* continued stream */
    CHECK(t, rc == MOH_OK && memcmp(tok1, tok2, sizeof tok1) != 0, "next batch differs");
    rng = 43;
    rc = text_batch(bytes, N, B, T, &rng, tok2, tgt2, &err);
    CHECK(t, rc == MOH_OK && memcmp(tok1, tok2, sizeof tok1) != 0, "other state, other batch");

    /* Offsets in [0, N-T-1], windows consecutive, targets shifted by one, and drawn exactly as
     * moh_rng_next(rng) % (N - T) (no rejection happens for so small a range). */
    uint64_t replay = saved;
    for (int b = 0; b < B; b++) {
        int off = tok1[b * T];
        uint64_t want = moh_rng_next(&replay) % (uint64_t)(N - T);
        CHECK(t, off >= 0 && off <= N - T - 1, "offset %d out of range", off);
        CHECK(t, (uint64_t)off == want, "window %d: offset %d, replayed %llu", b, off,
              (unsigned long long)want);
        for (int i = 0; i < T; i++) {
            CHECK(t, tok1[b * T + i] == off + i, "token %d.%d", b, i);
            CHECK(t, tgt1[b * T + i] == off + i + 1, "target %d.%d", b, i);
            if (i + 1 < T) CHECK(t, tgt1[b * T + i] == tok1[b * T + i + 1], "shift %d.%d", b, i);
        }
    }

    /* n == T+1: the only window is the whole text. */
    rng = 7;
    rc = text_batch(bytes, T + 1, 2, T, &rng, tok2, tgt2, &err);
    CHECK(t, rc == MOH_OK && tok2[0] == 0 && tok2[T] == 0 && tgt2[T - 1] == T, "n == T+1");

    /* Uniform offsets: m = 10 positions, 100000 draws, each within 5% of 10000. */
    {
        enum { M = 10, DRAWS = 100000 };
        long count[M] = {0};
        int tk[4], tg[4];
        rng = 99;
        for (int i = 0; i < DRAWS; i++) {
            text_batch(bytes, M + 3, 1, 3, &rng, tk, tg, &err);
            count[tk[0]]++;
        }
        for (int i = 0; i < M; i++)
            CHECK(t, count[i] > 9500 && count[i] < 10500, "offset %d drawn %ld times", i, count[i]);
    }

    /* High bytes come out as 0..255, never negative. */
    uint8_t hi[4] = {0xff, 0x80, 0xc3, 0xa9};
    rng = 1;
    rc = text_batch(hi, 4, 1, 3, &rng, tok2, tgt2, &err);
    CHECK(t, rc == MOH_OK && tok2[0] == 255 && tok2[1] == 128 && tgt2[2] == 0xa9, "byte values");

    /* Errors leave rng untouched. */
    rng = 5;
    memset(&err, 0, sizeof err);
    rc = text_batch(bytes, T, B, T, &rng, tok2, tgt2, &err);
    expect_err(t, "n < T+1", rc, MOH_E_ARG, &err, "text_batch", "need at least T+1 = 17", NULL);
    CHECK(t, rng == 5, "rng advanced on error");
    rc = text_batch(bytes, N, 0, T, &rng, tok2, tgt2, &err);
    expect_err(t, "B = 0", rc, MOH_E_ARG, &err, "text_batch", "B = 0", NULL);
    rc = text_batch(bytes, N, B, 0, &rng, tok2, tgt2, &err);
    expect_err(t, "T = 0", rc, MOH_E_ARG, &err, "text_batch", "T = 0", NULL);
    rc = text_batch(bytes, N, B, T, NULL, tok2, tgt2, &err);
    CHECK(t, rc == MOH_E_ARG, "NULL rng: rc %d", rc);
    rc = text_batch(NULL, N, B, T, &rng, tok2, tgt2, &err);
    CHECK(t, rc == MOH_E_ARG, "NULL bytes: rc %d", rc);
    CHECK(t, rng == 5, "rng advanced on error");
}

/* ---- evaluation chunks ------------------------------------------------------------------------ */

static void test_eval_chunks(test_ctx *t) {
    struct { size_t n; int T; long chunks; } cases[] = {
        {0, 4, 0},  {1, 4, 0},  {2, 4, 1},  {4, 4, 1},  {5, 4, 1},    {6, 4, 1}, /* 5 + 1 dropped */
        {7, 4, 2},  {10, 4, 2}, {11, 4, 2}, {12, 4, 3}, {1, 1, 0},    {2, 1, 1},
        {3, 1, 1},  {4, 1, 2},  {5, 1, 2},  {6, 1, 3},  {100, 9, 10}, {101, 9, 10},
        {102, 9, 11}, {5, 0, 0}, {5, -3, 0}, {1000000, 1023, 977},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        long got = text_eval_num_chunks(cases[i].n, cases[i].T);
        CHECK(t, got == cases[i].chunks, "n=%zu T=%d: %ld chunks, want %ld", cases[i].n,
              cases[i].T, got, cases[i].chunks);
    }

    /* Coverage: every byte except each chunk's first (and a dropped 1-byte tail) is a target
     * exactly once, with the right token before it in the same chunk. */
    enum { NMAX = 80 };
    uint8_t bytes[NMAX];
    for (int i = 0; i < NMAX; i++) bytes[i] = (uint8_t)(i * 7 + 3);
    for (int T = 1; T <= 9; T++) {
        for (size_t n = 0; n <= NMAX; n++) {
            int covered[NMAX] = {0};
            int tok[16], tgt[16];
            long nc = text_eval_num_chunks(n, T);
            long preds = 0;
            size_t pos = 0; /* start of chunk c */
            for (long c = 0; c < nc; c++, pos += (size_t)T + 1) {
                int k = text_eval_chunk(bytes, n, T, c, tok, tgt);
                size_t len = n - pos < (size_t)T + 1 ? n - pos : (size_t)T + 1;
                CHECK(t, k == (int)len - 1 && k >= 1 && k <= T, "n=%zu T=%d c=%ld: %d predictions",
                      n, T, c, k);
                for (int i = 0; i < k; i++) {
                    CHECK(t, tok[i] == bytes[pos + (size_t)i] && tgt[i] == bytes[pos + (size_t)i + 1],
                          "n=%zu T=%d c=%ld i=%d", n, T, c, i);
                    covered[pos + (size_t)i + 1]++;
                }
                preds += k;
            }
            CHECK(t, text_eval_chunk(bytes, n, T, nc, tok, tgt) == 0, "past the end");
            CHECK(t, text_eval_chunk(bytes, n, T, -1, tok, tgt) == 0, "c = -1");
            size_t tail = n % ((size_t)T + 1);
            long want = (long)n - nc - (tail == 1 ? 1 : 0);
            CHECK(t, preds == want, "n=%zu T=%d: %ld predictions, want %ld", n, T, preds, want);
            for (size_t i = 0; i < n; i++) {
                int first = i % ((size_t)T + 1) == 0;
                int dropped = tail == 1 && i == n - 1;
                int expect = (first || dropped) ? 0 : 1;
                CHECK(t, covered[i] == expect, "n=%zu T=%d: byte %zu covered %d times", n, T, i,
                      covered[i]);
            }
        }
    }
    int tok[4], tgt[4];
    CHECK(t, text_eval_chunk(NULL, 10, 3, 0, tok, tgt) == 0, "NULL bytes");
    CHECK(t, text_eval_chunk(bytes, 10, 0, 0, tok, tgt) == 0, "T = 0");
}

/* ---- entropy ---------------------------------------------------------------------------------- */

static void test_entropy(test_ctx *t) {
    uint8_t all[256 * 3];
    for (int i = 0; i < 256 * 3; i++) all[i] = (uint8_t)(i * 37 % 256); /* each byte 3 times */
    CHECK(t, fabs(text_entropy_bits(all, 256 * 3) - 8.0) < 1e-12, "uniform: %.15f",
          text_entropy_bits(all, 256 * 3));
    uint8_t same[100];
    memset(same, 'e', sizeof same);
    CHECK(t, text_entropy_bits(same, 100) == 0.0, "single symbol: %g", text_entropy_bits(same, 100));
    CHECK(t, text_entropy_bits(same, 0) == 0.0, "n = 0");
    CHECK(t, text_entropy_bits(NULL, 0) == 0.0, "NULL");
    CHECK(t, fabs(text_entropy_bits((const uint8_t *)"aabb", 4) - 1.0) < 1e-15, "aabb");
    CHECK(t, fabs(text_entropy_bits((const uint8_t *)"abcd", 4) - 2.0) < 1e-15, "abcd");
    /* -(3/4) log2(3/4) - (1/4) log2(1/4) */
    CHECK(t, fabs(text_entropy_bits((const uint8_t *)"aaab", 4) - 0.8112781244591328) < 1e-14,
          "aaab: %.16f", text_entropy_bits((const uint8_t *)"aaab", 4));
    /* "hello": l 2/5, h e o 1/5 each: 0.4*log2(2.5) + 3*0.2*log2(5) = 1.9219280948873623 */
    CHECK(t, fabs(text_entropy_bits((const uint8_t *)"hello", 5) - 1.9219280948873623) < 1e-14,
          "hello: %.16f", text_entropy_bits((const uint8_t *)"hello", 5));
}

int main(void) {
    test_ctx ctx = {0};
    test_split_buffer(&ctx);
    test_split_errors(&ctx);
    test_load_files(&ctx);
    test_splitmix(&ctx);
    test_batches(&ctx);
    test_eval_chunks(&ctx);
    test_entropy(&ctx);
    return test_finish("test_text", &ctx);
}
