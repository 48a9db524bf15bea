/* safetensors reader/writer: reference fixtures (tools/ref/gen_st_fixtures.py), exhaustive F16/BF16
 * conversion, round trips, every malformed header, shape mismatches, atomic writes, __metadata__
 * (read, write, round trip, Python interop when python3 has safetensors). */
#include "moh.h"
#include "test_util.h"

#include <dirent.h>
#include <stdarg.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define FIX_DIR "tests/fixtures/st/"

/* ---- helpers ---------------------------------------------------------------------------------- */

/* A file image: 8-byte little-endian hlen, the header text, then dlen data bytes. */
static uint8_t *mk_raw(uint64_t hlen, const char *hdr, size_t hdr_bytes, const uint8_t *data,
                       size_t dlen, size_t *out_len) {
    size_t n = 8 + hdr_bytes + dlen;
    uint8_t *b = malloc(n ? n : 1);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(hlen >> (8 * i));
    memcpy(b + 8, hdr, hdr_bytes);
    if (dlen) {
        if (data) memcpy(b + 8 + hdr_bytes, data, dlen);
        else memset(b + 8 + hdr_bytes, 0, dlen);
    }
    *out_len = n;
    return b;
}
static uint8_t *mk_st(const char *hdr, size_t dlen, size_t *out_len) {
    return mk_raw(strlen(hdr), hdr, strlen(hdr), NULL, dlen, out_len);
}

/* Parses hdr + dlen zero bytes; expects MOH_E_FORMAT and a message holding every key word. */
static void expect_bad(test_ctx *t, const char *what, const char *hdr, size_t dlen, ...) {
    size_t n;
    uint8_t *b = mk_st(hdr, dlen, &n);
    moh_safetensors st;
    moh_error err = {0};
    int rc = moh_st_parse(&st, b, n, "bad.safetensors", &err);
    CHECK(t, rc == MOH_E_FORMAT, "%s: rc %d (%s)", what, rc, err.msg);
    CHECK(t, st.n_tensors == 0 && st.tensors == NULL && st.path == NULL, "%s: st not emptied", what);
    CHECK(t, strncmp(err.msg, "bad.safetensors: ", 17) == 0, "%s: label missing: %s", what, err.msg);
    CHECK(t, strchr(err.msg, '\n') == NULL, "%s: message not one line: %s", what, err.msg);
    va_list ap;
    va_start(ap, dlen);
    for (const char *w; (w = va_arg(ap, const char *));)
        CHECK(t, strstr(err.msg, w) != NULL, "%s: '%s' not in message: %s", what, w, err.msg);
    va_end(ap);
    printf("  [%s] %s\n", what, err.msg);
    free(b);
}

static int same_bits(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

static uint8_t *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long k = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc(k > 0 ? (size_t)k : 1);
    *n = fread(b, 1, (size_t)k, f);
    fclose(f);
    return b;
}

static int count_tmp_files(const char *dir) {
    DIR *d = opendir(dir);
    int c = 0;
    if (!d) return -1;
    for (struct dirent *e; (e = readdir(d));)
        if (strstr(e->d_name, ".tmp")) c++;
    closedir(d);
    return c;
}

/* ---- reference fixtures ---------------------------------------------------------------------- */

static void check_vals(test_ctx *t, const char *name, const float *got, const float *want, int n) {
    for (int i = 0; i < n; i++) {
        int ok = isnan(want[i]) ? isnan(got[i]) : same_bits(got[i], want[i]);
        CHECK(t, ok, "%s[%d] = %.9g, expected %.9g", name, i, got[i], want[i]);
    }
}

static void test_fixture_mixed(test_ctx *t) {
    moh_safetensors st;
    moh_error err = {0};
    int rc = moh_st_open(&st, FIX_DIR "mixed.safetensors", &err);
    CHECK(t, rc == MOH_OK, "open mixed: %s", err.msg);
    if (rc) return;
    CHECK(t, st.n_tensors == 7, "n_tensors %d", st.n_tensors);
    CHECK(t, st.file != NULL, "open keeps an owned copy");

    float out[16];
    int64_t s23[] = {2, 3}, s4[] = {4}, s22[] = {2, 2}, s8[] = {8}, s03[] = {0, 3}, s3[] = {3};
    const float f32[] = {0.0f, -1.5f, 3.25f, 65504.0f, 0x1p-149f, -INFINITY};
    rc = moh_st_read_f32(&st, "f32", 2, s23, out, &err);
    CHECK(t, rc == MOH_OK, "f32: %s", err.msg);
    check_vals(t, "f32", out, f32, 6);

    const float f64[] = {(float)(1.0 / 3.0), -2.5f, INFINITY, 0x1p-130f};
    rc = moh_st_read_f32(&st, "f64", 1, s4, out, &err);
    CHECK(t, rc == MOH_OK, "f64: %s", err.msg);
    check_vals(t, "f64", out, f64, 4);

    const float bf16[] = {1.0f, -2.0f, 0x1p-130f, INFINITY};
    rc = moh_st_read_f32(&st, "bf16", 2, s22, out, &err);
    CHECK(t, rc == MOH_OK, "bf16: %s", err.msg);
    check_vals(t, "bf16", out, bf16, 4);

    const float f16[] = {1.0f, -0.0f, 65504.0f, 0x1p-24f, 0x1p-14f, 0.333251953125f, NAN, -INFINITY};
    rc = moh_st_read_f32(&st, "f16", 1, s8, out, &err);
    CHECK(t, rc == MOH_OK, "f16: %s", err.msg);
    check_vals(t, "f16", out, f16, 8);
    CHECK(t, signbit(out[1]), "f16 -0 keeps its sign");

    rc = moh_st_read_f32(&st, "scalar", 0, NULL, out, &err);
    CHECK(t, rc == MOH_OK && out[0] == 7.0f, "scalar: rc %d %s", rc, err.msg);
    rc = moh_st_read_f32(&st, "empty", 2, s03, NULL, &err);
    CHECK(t, rc == MOH_OK, "empty: %s", err.msg);

    const moh_st_tensor *ti = moh_st_find(&st, "layers.0.attn.i64");
    CHECK(t, ti && ti->dtype == MOH_DT_OTHER && strcmp(ti->dtype_name, "I64") == 0 &&
                 ti->numel == 3 && ti->end - ti->begin == 24,
          "i64 entry kept");
    rc = moh_st_read_f32(&st, "layers.0.attn.i64", 1, s3, out, &err);
    CHECK(t, rc == MOH_E_SHAPE && strstr(err.msg, "I64") && strstr(err.msg, "layers.0.attn.i64") &&
                 strstr(err.msg, FIX_DIR "mixed.safetensors"),
          "i64 refused: rc %d %s", rc, err.msg);
    printf("  [dtype refused] %s\n", err.msg);

    /* shape mismatch and missing tensor */
    int64_t s32[] = {3, 2};
    rc = moh_st_read_f32(&st, "f32", 2, s32, out, &err);
    CHECK(t, rc == MOH_E_SHAPE && strstr(err.msg, "'f32'") && strstr(err.msg, "[2, 3]") &&
                 strstr(err.msg, "[3, 2]"),
          "shape mismatch: %s", err.msg);
    printf("  [shape mismatch] %s\n", err.msg);
    rc = moh_st_read_f32(&st, "f32", 1, s4, out, &err);
    CHECK(t, rc == MOH_E_SHAPE && strstr(err.msg, "[4]"), "ndim mismatch: %s", err.msg);
    CHECK(t, moh_st_find(&st, "nope") == NULL, "find absent");
    CHECK(t, moh_st_find(&st, "__metadata__") == NULL, "metadata is not a tensor");
    moh_st_close(&st);
    CHECK(t, st.tensors == NULL && st.file == NULL && st.path == NULL, "close empties");
    moh_st_close(&st); /* idempotent */
}

static void test_missing_tensor_message(test_ctx *t) {
    size_t n;
    uint8_t *b = mk_st("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, &n);
    moh_safetensors st;
    moh_error err = {0};
    CHECK(t, moh_st_parse(&st, b, n, "W.safetensors", &err) == MOH_OK, "%s", err.msg);
    CHECK(t, st.file == NULL, "parse borrows the buffer");
    int64_t shp[] = {4, 32};
    float out[1];
    int rc = moh_st_read_f32(&st, "wg.weight", 2, shp, out, &err);
    CHECK(t, rc == MOH_E_SHAPE, "rc %d", rc);
    CHECK(t, strcmp(err.msg, "W.safetensors: missing tensor 'wg.weight' (expected shape [4, 32])") ==
                 0,
          "message: %s", err.msg);
    printf("  [missing] %s\n", err.msg);
    moh_st_close(&st);
    free(b);
}

/* moh_st_write gives the reference implementation's exact bytes for the same tensors. */
static void test_write_matches_reference(test_ctx *t, const char *dir) {
    moh_safetensors st;
    moh_error err = {0};
    int rc = moh_st_open(&st, FIX_DIR "f32_ref.safetensors", &err);
    CHECK(t, rc == MOH_OK, "open f32_ref: %s", err.msg);
    if (rc) return;
    float a[6], bw[4];
    int64_t sa[] = {2, 3}, sb[] = {4};
    CHECK(t, moh_st_read_f32(&st, "a", 2, sa, a, &err) == MOH_OK, "%s", err.msg);
    CHECK(t, moh_st_read_f32(&st, "b.weight", 1, sb, bw, &err) == MOH_OK, "%s", err.msg);
    for (int i = 0; i < 6; i++) CHECK(t, a[i] == (float)i * 0.5f - 1.0f, "a[%d] = %g", i, a[i]);
    CHECK(t, bw[0] == 1.0f && bw[1] == -2.0f && bw[2] == 0.125f && bw[3] == 1e-3f, "b.weight");
    moh_st_close(&st);

    moh_st_entry e[2] = {{"a", 2, {2, 3}, a}, {"b.weight", 1, {4}, bw}};
    char path[512];
    snprintf(path, sizeof path, "%s/ref_copy.safetensors", dir);
    rc = moh_st_write(path, e, 2, &err);
    CHECK(t, rc == MOH_OK, "write: %s", err.msg);
    size_t n1 = 0, n2 = 0;
    uint8_t *b1 = slurp(FIX_DIR "f32_ref.safetensors", &n1), *b2 = slurp(path, &n2);
    CHECK(t, b1 && b2 && n1 == n2 && memcmp(b1, b2, n1) == 0,
          "moh_st_write output differs from the reference file (%zu vs %zu bytes)", n2, n1);
    free(b1);
    free(b2);
}

/* ---- conversions ------------------------------------------------------------------------------ */

static void test_exhaustive_half(test_ctx *t) {
    /* every F16 and BF16 bit pattern, each at an odd (unaligned) offset from the buffer start
     * (after a 1-byte tensor: the tensors must tile the buffer from byte 0) */
    const char *hdr = "{\"pad\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                      "\"h\":{\"dtype\":\"F16\",\"shape\":[65536],\"data_offsets\":[1,131073]},"
                      "\"b\":{\"dtype\":\"BF16\",\"shape\":[256,256],\"data_offsets\":[131073,"
                      "262145]}}";
    size_t n;
    uint8_t *buf = mk_st(hdr, 262145, &n);
    uint8_t *d = buf + 8 + strlen(hdr);
    for (uint32_t i = 0; i < 65536; i++) {
        d[1 + 2 * i] = (uint8_t)i;
        d[2 + 2 * i] = (uint8_t)(i >> 8);
        d[131073 + 2 * i] = (uint8_t)i;
        d[131074 + 2 * i] = (uint8_t)(i >> 8);
    }
    moh_safetensors st;
    moh_error err = {0};
    int rc = moh_st_parse(&st, buf, n, "half", &err);
    CHECK(t, rc == MOH_OK, "%s", err.msg);
    if (rc) {
        free(buf);
        return;
    }
    float *out = malloc(65536 * sizeof *out);
    int64_t sh[] = {65536}, sb[] = {256, 256};
    CHECK(t, moh_st_read_f32(&st, "h", 1, sh, out, &err) == MOH_OK, "%s", err.msg);
    int bad = 0;
    for (uint32_t i = 0; i < 65536; i++) {
        /* independent definition: (-1)^s * 2^(e-15) * (1 + m/1024), subnormals 2^-14 * m/1024 */
        int s = i >> 15, e = (i >> 10) & 31, m = i & 1023;
        double v;
        if (e == 0) v = ldexp((double)m, -24);
        else if (e == 31) v = m ? NAN : INFINITY;
        else v = ldexp(1024.0 + m, e - 25);
        if (s) v = -v;
        float want = (float)v;
        int ok = isnan(want) ? (isnan(out[i]) && !!signbit(out[i]) == s) : same_bits(out[i], want);
        if (!ok && bad++ < 5) CHECK(t, 0, "F16 0x%04x -> %.9g, expected %.9g", i, out[i], want);
    }
    CHECK(t, bad == 0, "%d F16 conversions wrong", bad);
    CHECK(t, moh_st_read_f32(&st, "b", 2, sb, out, &err) == MOH_OK, "%s", err.msg);
    bad = 0;
    for (uint32_t i = 0; i < 65536; i++) {
        int s = i >> 15, e = (i >> 7) & 255, m = i & 127;
        double v;
        if (e == 0) v = ldexp((double)m, -133);
        else if (e == 255) v = m ? NAN : INFINITY;
        else v = ldexp(128.0 + m, e - 134);
        if (s) v = -v;
        float want = (float)v;
        int ok = isnan(want) ? (isnan(out[i]) && !!signbit(out[i]) == s) : same_bits(out[i], want);
        if (!ok && bad++ < 5) CHECK(t, 0, "BF16 0x%04x -> %.9g, expected %.9g", i, out[i], want);
    }
    CHECK(t, bad == 0, "%d BF16 conversions wrong", bad);
    free(out);
    moh_st_close(&st);
    free(buf);
}

/* ---- round trip ------------------------------------------------------------------------------- */

static void test_round_trip(test_ctx *t, const char *dir) {
    test_rng r = {0x1234567ULL};
    float w1[4 * 8], w2[3], w3[2 * 3 * 4], scalar = -0.0f;
    for (int i = 0; i < 32; i++) w1[i] = (float)test_rng_uniform(&r);
    w2[0] = NAN;
    w2[1] = INFINITY;
    w2[2] = 0x1p-149f;
    for (int i = 0; i < 24; i++) w3[i] = (float)test_rng_uniform(&r) * 1e30f;
    const char *odd = "odd \"name\" \\ with\ttab\nnewline \xc3\xbc \x01";
    moh_st_entry e[] = {
        {"qkv.weight", 2, {4, 8}, w1},
        {odd, 1, {3}, w2},
        {"blocks.0.x", 3, {2, 3, 4}, w3},
        {"scalar", 0, {0}, &scalar},
        {"empty", 2, {0, 5}, NULL}, /* zero elements: NULL data allowed */
    };
    char path[512];
    snprintf(path, sizeof path, "%s/rt.safetensors", dir);
    moh_error err = {0};
    int rc = moh_st_write(path, e, 5, &err);
    CHECK(t, rc == MOH_OK, "write: %s", err.msg);
    CHECK(t, count_tmp_files(dir) == 0, "temp file left behind");

    size_t n;
    uint8_t *raw = slurp(path, &n);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = hl << 8 | raw[i];
    CHECK(t, hl % 8 == 0, "header length %llu not a multiple of 8", (unsigned long long)hl);
    CHECK(t, n == 8 + hl + 4 * (32 + 3 + 24 + 1), "file size %zu", n);
    free(raw);

    moh_safetensors st;
    rc = moh_st_open(&st, path, &err);
    CHECK(t, rc == MOH_OK, "reopen: %s", err.msg);
    if (rc) return;
    CHECK(t, st.n_tensors == 5, "n %d", st.n_tensors);
    for (int i = 0; i < 5; i++) {
        CHECK(t, strcmp(st.tensors[i].name, e[i].name) == 0, "entry order / name %d: %s", i,
              st.tensors[i].name);
        CHECK(t, st.tensors[i].dtype == MOH_DT_F32, "dtype");
    }
    CHECK(t, st.tensors[0].begin == 0 && st.tensors[1].begin == 128, "contiguous data");
    float out[64];
    for (int i = 0; i < 5; i++) {
        int64_t numel = 1;
        for (int k = 0; k < e[i].ndim; k++) numel *= e[i].shape[k];
        rc = moh_st_read_f32(&st, e[i].name, e[i].ndim, e[i].shape, out, &err);
        CHECK(t, rc == MOH_OK, "read %d: %s", i, err.msg);
        CHECK(t, numel == 0 || memcmp(out, e[i].data, (size_t)numel * 4) == 0,
              "tensor %d not bit-identical", i);
    }
    moh_st_close(&st);
}

/* ---- malformed files -------------------------------------------------------------------------- */

static void test_malformed(test_ctx *t) {
    moh_safetensors st;
    moh_error err = {0};
    size_t n;
    uint8_t *b;
    int rc;

    /* length prefix */
    rc = moh_st_parse(&st, (const uint8_t *)"\x02\0\0", 3, "bad.safetensors", &err);
    CHECK(t, rc == MOH_E_FORMAT && strstr(err.msg, "shorter than the 8-byte"), "short: %s", err.msg);
    printf("  [short] %s\n", err.msg);
    b = mk_raw(1000, "{}", 2, NULL, 0, &n);
    rc = moh_st_parse(&st, b, n, "bad.safetensors", &err);
    CHECK(t, rc == MOH_E_FORMAT && strstr(err.msg, "larger than the file") &&
                 strstr(err.msg, "1000"),
          "hlen > file: %s", err.msg);
    printf("  [hlen] %s\n", err.msg);
    free(b);
    b = mk_raw(0xffffffffffffffffULL, "{}", 2, NULL, 0, &n);
    rc = moh_st_parse(&st, b, n, "bad.safetensors", &err);
    CHECK(t, rc == MOH_E_FORMAT && strstr(err.msg, "header length 18446744073709551615 exceeds the "
                                                   "100000000-byte limit of the safetensors format"),
          "over the cap: %s", err.msg);
    printf("  [cap] %s\n", err.msg);
    free(b);
    b = mk_raw(100000001ULL, "{}", 2, NULL, 0, &n);
    rc = moh_st_parse(&st, b, n, "bad.safetensors", &err);
    CHECK(t, rc == MOH_E_FORMAT && strstr(err.msg, "100000001 exceeds the 100000000-byte limit"),
          "100MB+1: %s", err.msg);
    free(b);
    /* header shorter than its text: the rest is data that no tensor covers (was accepted) */
    b = mk_raw(4, "{}  xx", 6, NULL, 0, &n);
    rc = moh_st_parse(&st, b, n, "bad.safetensors", &err);
    CHECK(t, rc == MOH_E_FORMAT && strstr(err.msg, "2 bytes after the last tensor"),
          "empty object + data: %s", err.msg);
    free(b);

    /* JSON */
    expect_bad(t, "not json", "{\"a\":", 0, "not valid JSON", NULL);
    expect_bad(t, "empty header", "", 0, "not valid JSON", NULL);
    expect_bad(t, "trailing", "{} {}", 0, "not valid JSON", "after the object", NULL);
    expect_bad(t, "array", "[1,2]", 0, "not a JSON object", NULL);
    expect_bad(t, "string", "\"hi\"", 0, "not a JSON object", NULL);
    expect_bad(t, "bad utf8", "{\"\xff\":1}", 0, "UTF-8", NULL);
    expect_bad(t, "overlong utf8", "{\"\xc0\xaf\":1}", 0, "UTF-8", NULL);
    expect_bad(t, "surrogate", "{\"\xed\xa0\x80\":1}", 0, "UTF-8", NULL);
    expect_bad(t, "control", "{\"a\x01\":1}", 0, "control byte 0x01", NULL);
    {
        const char h[] = "{\"a\":{}}\0   "; /* NUL inside the header */
        b = mk_raw(sizeof h - 1, h, sizeof h - 1, NULL, 0, &n);
        rc = moh_st_parse(&st, b, n, "bad.safetensors", &err);
        CHECK(t, rc == MOH_E_FORMAT && strstr(err.msg, "control byte 0x00"), "nul: %s", err.msg);
        free(b);
    }

    /* entries */
    expect_bad(t, "entry not object", "{\"w\":[1]}", 0, "tensor 'w'", "expected an object", NULL);
    expect_bad(t, "no dtype", "{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "tensor 'w'",
               "missing field 'dtype'", NULL);
    expect_bad(t, "no shape", "{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4,
               "missing field 'shape'", NULL);
    expect_bad(t, "no offsets", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4,
               "missing field 'data_offsets'", NULL);
    expect_bad(t, "dtype number", "{\"w\":{\"dtype\":32,\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
               "field 'dtype'", "expected a string", "32", NULL);
    expect_bad(t, "shape object", "{\"w\":{\"dtype\":\"F32\",\"shape\":{},\"data_offsets\":[0,4]}}",
               4, "field 'shape'", "expected an array", NULL);
    expect_bad(t, "shape negative",
               "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,-3],\"data_offsets\":[0,4]}}", 4,
               "field 'shape'", "dim 1", "-3", "integer literal >= 0", NULL);
    expect_bad(t, "shape fraction",
               "{\"w\":{\"dtype\":\"F32\",\"shape\":[2.5],\"data_offsets\":[0,4]}}", 4, "dim 0",
               "2.5", NULL);
    expect_bad(t, "shape string",
               "{\"w\":{\"dtype\":\"F32\",\"shape\":[\"2\"],\"data_offsets\":[0,4]}}", 4, "dim 0",
               "\"2\"", NULL);
    expect_bad(t, "shape huge",
               "{\"w\":{\"dtype\":\"F32\",\"shape\":[1e300],\"data_offsets\":[0,4]}}", 4, "dim 0",
               "1e+300", "below 2^64", NULL);
    expect_bad(t, "too many dims",
               "{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4,
               "9 dims", "at most 8", NULL);
    expect_bad(t, "offsets one", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4,
               "field 'data_offsets'", "[begin, end]", NULL);
    expect_bad(t, "offsets three",
               "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 8,
               "field 'data_offsets'", NULL);
    expect_bad(t, "offsets negative",
               "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", 4,
               "field 'data_offsets'", NULL);
    expect_bad(t, "offsets string",
               "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":\"0-4\"}}", 4,
               "field 'data_offsets'", NULL);
    expect_bad(t, "begin > end", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}",
               8, "tensor 'w'", "[8, 4)", "begin after their end", NULL);
    expect_bad(t, "truncated", "{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}",
               12, "tensors end at byte 16", "only 12 data bytes", "truncated", NULL);
    expect_bad(t, "size mismatch F16",
               "{\"w\":{\"dtype\":\"F16\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8,
               "hold 8 bytes", "dtype F16 with shape [3] needs 6", NULL);
    expect_bad(t, "size mismatch I8 scalar",
               "{\"w\":{\"dtype\":\"I8\",\"shape\":[],\"data_offsets\":[0,0]}}", 0,
               "hold 0 bytes", "needs 1", NULL);
    expect_bad(t, "F4 odd numel", "{\"w\":{\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,2]}}",
               2, "12 bits, not a whole number of bytes", NULL);
    expect_bad(t, "numel overflow",
               "{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],"
               "\"data_offsets\":[0,4]}}",
               4, "overflows 64 bits", "[4294967296, 4294967296, 4294967296]", NULL);
    expect_bad(t, "bytes overflow",
               "{\"w\":{\"dtype\":\"F64\",\"shape\":[2147483648,1073741824],"
               "\"data_offsets\":[0,4]}}",
               4, "overflows", "F64", NULL);
    expect_bad(t, "overlap",
               "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}",
               24, "tensor 'b'", "[8, 24) overlap tensor 'a' [0, 16)", NULL);
    expect_bad(t, "overlap contained",
               "{\"big\":{\"dtype\":\"F32\",\"shape\":[8],\"data_offsets\":[0,32]},"
               "\"s1\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]},"
               "\"s2\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[20,24]}}",
               32, "'big'", "overlap", NULL);
    expect_bad(t, "same range",
               "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
               "\"b\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
               4, "overlap", NULL);
    /* a repeated name: the last entry wins (the reference's HashMap), leaving [0, 4) unused */
    expect_bad(t, "duplicate",
               "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
               "\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
               8, "tensor 'w'", "leave bytes [0, 4)", NULL);
    expect_bad(t, "field twice",
               "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"dtype\":\"F16\"}}",
               4, "tensor 'w'", "field 'dtype' appears twice", NULL);
    expect_bad(t, "metadata not object", "{\"__metadata__\":[\"x\"]}", 0, "__metadata__",
               "object of strings", NULL);
    expect_bad(t, "metadata value", "{\"__metadata__\":{\"epoch\":3}}", 0, "__metadata__",
               "'epoch'", "must be a string", NULL);
    expect_bad(t, "metadata twice", "{\"__metadata__\":{},\"__metadata__\":{}}", 0, "twice", NULL);
    expect_bad(t, "name escaped", "{\"a\\nb'c\":5}", 0, "tensor 'a\\x0ab\\x27c'", NULL);

    /* the example message, exactly */
    b = mk_st("{\"qkv.weight\":{\"dtype\":\"F32\",\"shape\":[4,8],\"data_offsets\":[0,96]}}", 96, &n);
    rc = moh_st_parse(&st, b, n, "x.safetensors", &err);
    CHECK(t, rc == MOH_E_FORMAT &&
                 strcmp(err.msg, "x.safetensors: tensor 'qkv.weight': data_offsets [0, 96) hold 96 "
                                 "bytes but dtype F32 with shape [4, 8] needs 128") == 0,
          "example message: %s", err.msg);
    printf("  [size] %s\n", err.msg);
    free(b);
}

static void test_allowed(test_ctx *t) {
    moh_safetensors st;
    moh_error err = {0};
    size_t n;
    uint8_t *b;
    int rc;
    /* metadata, zero-size tensors at boundaries, an unknown field, padding spaces, every dtype */
    b = mk_st("{\"__metadata__\":{\"format\":\"pt\"},"
              "\"z\":{\"dtype\":\"F32\",\"shape\":[0,7],\"data_offsets\":[8,8],\"extra\":1},"
              "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
              "\"q\":{\"dtype\":\"U16\",\"shape\":[2],\"data_offsets\":[8,12]},"
              "\"b\":{\"dtype\":\"BOOL\",\"shape\":[1],\"data_offsets\":[12,13]},"
              "\"f8\":{\"dtype\":\"F8_E4M3\",\"shape\":[1],\"data_offsets\":[13,14]},"
              "\"f8b\":{\"dtype\":\"F8_E5M2\",\"shape\":[1],\"data_offsets\":[14,15]},"
              "\"u8\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[15,16]},"
              "\"i16\":{\"dtype\":\"I16\",\"shape\":[2],\"data_offsets\":[16,20]},"
              "\"i32\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[20,24]},"
              "\"i64\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[24,32]},"
              "\"f64\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[32,40]},"
              "\"i8\":{\"dtype\":\"I8\",\"shape\":[2],\"data_offsets\":[40,42]},"
              "\"f4\":{\"dtype\":\"F4\",\"shape\":[2],\"data_offsets\":[42,43]},"
              "\"fz\":{\"dtype\":\"F8_E4M3FNUZ\",\"shape\":[1],\"data_offsets\":[43,44]},"
              "\"fy\":{\"dtype\":\"F8_E5M2FNUZ\",\"shape\":[4],\"data_offsets\":[44,48]},"
              "\"end\":{\"dtype\":\"F16\",\"shape\":[0],\"data_offsets\":[48,48]}}        ",
              48, &n);
    rc = moh_st_parse(&st, b, n, "ok.safetensors", &err);
    CHECK(t, rc == MOH_OK, "allowed file: %s", err.msg);
    if (rc == MOH_OK) {
        CHECK(t, st.n_tensors == 16, "n %d", st.n_tensors);
        const moh_st_tensor *q = moh_st_find(&st, "q");
        CHECK(t, q && q->dtype == MOH_DT_OTHER && strcmp(q->dtype_name, "U16") == 0, "U16 kept");
        const moh_st_tensor *fz = moh_st_find(&st, "fz");
        CHECK(t, fz && strcmp(fz->dtype_name, "F8_E4M3FNUZ") == 0, "FNUZ kept");
        int64_t s2[] = {2}, s07[] = {0, 7};
        float out[8];
        rc = moh_st_read_f32(&st, "q", 1, s2, out, &err);
        CHECK(t, rc == MOH_E_SHAPE && strstr(err.msg, "dtype U16") && strstr(err.msg, "'q'"),
              "U16 refused: %s", err.msg);
        rc = moh_st_read_f32(&st, "z", 2, s07, out, &err);
        CHECK(t, rc == MOH_OK, "zero-size read: %s", err.msg);
        rc = moh_st_read_f32(&st, "a", 1, NULL, out, &err);
        CHECK(t, rc == MOH_E_ARG, "NULL expected shape with ndim 1: rc %d", rc);
        rc = moh_st_read_f32(&st, "a", 1, s2, NULL, &err);
        CHECK(t, rc == MOH_E_ARG, "NULL out: rc %d", rc);
    }
    moh_st_close(&st);
    free(b);

    /* unaligned start of the data buffer (header length not a multiple of 8) */
    const char *h = "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    float v[2] = {1.25f, -3.5f};
    uint8_t le[8];
    for (int i = 0; i < 2; i++) {
        uint32_t u;
        memcpy(&u, &v[i], 4);
        for (int k = 0; k < 4; k++) le[4 * i + k] = (uint8_t)(u >> (8 * k));
    }
    b = mk_raw(strlen(h), h, strlen(h), le, 8, &n);
    rc = moh_st_parse(&st, b, n, "ok", &err);
    CHECK(t, rc == MOH_OK, "%s", err.msg);
    if (rc == MOH_OK) {
        float out[2];
        int64_t s2[] = {2};
        rc = moh_st_read_f32(&st, "w", 1, s2, out, &err);
        CHECK(t, rc == MOH_OK && out[0] == 1.25f && out[1] == -3.5f, "unaligned read: %s", err.msg);
    }
    moh_st_close(&st);
    free(b);
}

/* ---- the reference reader's rules (tools/ref/st_strict_verdicts.py: safetensors 0.8) ---------- */

/* Parses hdr (hlen = its length) + dlen random data bytes; expects MOH_OK; returns n_tensors. */
static int expect_ok(test_ctx *t, const char *what, const char *hdr, size_t hdr_bytes, size_t dlen,
                     moh_safetensors *keep) {
    test_rng r = {0x5eed0000ULL + dlen};
    uint8_t *data = malloc(dlen ? dlen : 1);
    for (size_t i = 0; i < dlen; i++) data[i] = (uint8_t)test_rng_u64(&r);
    size_t n;
    uint8_t *b = mk_raw(hdr_bytes, hdr, hdr_bytes, data, dlen, &n);
    moh_safetensors st;
    moh_error err = {0};
    int rc = moh_st_parse(&st, b, n, "ok.safetensors", &err);
    CHECK(t, rc == MOH_OK, "%s: rc %d (%s)", what, rc, err.msg);
    int nt = rc == MOH_OK ? st.n_tensors : -1;
    if (keep && rc == MOH_OK) {
        *keep = st; /* borrows b: the caller only looks at the header fields */
        keep->data = NULL;
    } else {
        moh_st_close(&st);
    }
    free(data);
    free(b);
    return nt;
}
#define OK_HDR(t, what, hdr, dlen) expect_ok(t, what, hdr, strlen(hdr), dlen, NULL)
#define W1 "\"dtype\":\"F32\",\"shape\":[1]"

static void test_reference_rules(test_ctx *t) {
    /* the tensors must tile the data buffer: from 0, no gaps, no trailing bytes (all were
     * accepted before) */
    expect_bad(t, "trailing byte", "{\"a\":{" W1 ",\"data_offsets\":[0,4]}}", 5,
               "1 bytes after the last tensor", "ends at byte 4", NULL);
    expect_bad(t, "no tensors, trailing bytes", "{}", 3, "3 bytes after the last tensor", NULL);
    expect_bad(t, "gap",
               "{\"a\":{" W1 ",\"data_offsets\":[0,4]},\"b\":{" W1 ",\"data_offsets\":[8,12]}}", 12,
               "tensor 'b'", "leave bytes [4, 8)", "begin at 4", NULL);
    expect_bad(t, "not from 0", "{\"a\":{" W1 ",\"data_offsets\":[4,8]}}", 8, "tensor 'a'",
               "leave bytes [0, 4)", NULL);
    expect_bad(t, "zero-size inside a tensor",
               "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
               "\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]}}",
               8, "tensor 'z'", "overlap tensor 'a' [0, 8)", NULL);
    expect_bad(t, "zero-size past the end",
               "{\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,8]}}", 0, "tensor 'z'",
               "begin at 0", NULL);
    /* dtypes: only the format's names */
    expect_bad(t, "unknown dtype", "{\"a\":{\"dtype\":\"Q7\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
               "tensor 'a'", "unknown dtype 'Q7'", "F8_E5M2FNUZ", NULL);
    expect_bad(t, "lower-case dtype",
               "{\"a\":{\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
               "unknown dtype 'f32'", NULL);
    /* integers must be integer literals: serde reads 1.0, 1e0 and -0 as floats */
    expect_bad(t, "shape 1.0", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1.0],\"data_offsets\":[0,4]}}", 4,
               "field 'shape'", "dim 0", "integer literal", NULL);
    expect_bad(t, "shape 1e0", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1e0],\"data_offsets\":[0,4]}}", 4,
               "field 'shape'", "dim 0", NULL);
    expect_bad(t, "shape -0", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1,-0],\"data_offsets\":[0,0]}}", 0,
               "dim 1", "-0", NULL);
    expect_bad(t, "offsets 4.0", "{\"a\":{" W1 ",\"data_offsets\":[0,4.0]}}", 4,
               "field 'data_offsets'", NULL);
    expect_bad(t, "offsets 2^64", "{\"a\":{" W1 ",\"data_offsets\":[0,18446744073709551616]}}", 4,
               "field 'data_offsets'", NULL);
    /* numel overflows dim by dim, even when a later dim is 0 */
    expect_bad(t, "overflow before a zero dim",
               "{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,0],\"data_offsets\":[0,0]}}",
               0, "tensor 'a'", "overflows 64 bits", NULL);
    /* JSON as serde_json reads it */
    for (int arrays = 125; arrays <= 126; arrays++) { /* + 2 objects: depth 127 ok, 128 not */
        char h[600];
        int k = snprintf(h, sizeof h, "{\"a\":{" W1 ",\"data_offsets\":[0,4],\"x\":");
        for (int i = 0; i < arrays; i++) h[k++] = '[';
        for (int i = 0; i < arrays; i++) h[k++] = ']';
        snprintf(h + k, sizeof h - (size_t)k, "}}");
        if (arrays == 126) expect_bad(t, "nesting 128", h, 4, "nested deeper than 127", NULL);
        else CHECK(t, OK_HDR(t, "nesting 127", h, 4) == 1, "nesting 127");
    }
    expect_bad(t, "number out of range", "{\"a\":{" W1 ",\"data_offsets\":[0,4],\"x\":1e400}}", 4,
               "number out of range", NULL);
    expect_bad(t, "leading zero", "{\"a\":{\"dtype\":\"F32\",\"shape\":[01],\"data_offsets\":[0,4]}}",
               4, "malformed number", NULL);
    expect_bad(t, "byte order mark", "\xef\xbb\xbf{}", 0, "byte order mark", NULL);
    /* strings as serde_json reads them (cJSON accepts all of these) */
    expect_bad(t, "tab in a metadata key", "{\"__metadata__\":{\"a\tb\":\"c\"}}", 0, "control character", NULL);
    expect_bad(t, "newline in a tensor name", "{\"a\nb\":{" W1 ",\"data_offsets\":[0,4]}}", 4,
               "control character", NULL);
    expect_bad(t, "\\u with non-hex digits", "{\"\\uzzzz\":{" W1 ",\"data_offsets\":[0,4]}}", 4,
               "invalid \\u escape", NULL);
    expect_bad(t, "short \\u", "{\"__metadata__\":{\"k\":\"\\u0-0e\"}}", 0, "invalid \\u escape", NULL);
    expect_bad(t, "unknown escape", "{\"__metadata__\":{\"k\":\"\\q\"}}", 0, "invalid escape", NULL);
    CHECK(t, OK_HDR(t, "every escape", "{\"__metadata__\":{\"k\":\"\\\"\\\\\\/\\b\\f\\n\\r\\t\\u00e9\\uD83D\\uDE00\"},\"a\":{"
          W1 ",\"data_offsets\":[0,4]}}", 4) == 1, "every valid escape in a metadata value is accepted");
    CHECK(t, OK_HDR(t, "whitespace between tokens", "{ \"a\" :\t{\n" W1 ",\r\"data_offsets\":[0,4]} }", 4) == 1,
          "tab, newline and CR between tokens are accepted");
    expect_bad(t, "array of 4", "{\"a\":[\"F32\",[1],[0,4],5]}", 4, "tensor 'a'",
               "[dtype, shape, data_offsets]", NULL);
    expect_bad(t, "dtype map with a value",
               "{\"a\":{\"dtype\":{\"F32\":1},\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
               "field 'dtype'", NULL);
    expect_bad(t, "metadata null value", "{\"__metadata__\":{\"k\":null}}", 0, "'k'",
               "must be a string", NULL);

    /* accepted by the reference (each was refused before) */
    CHECK(t, OK_HDR(t, "metadata null", "{\"__metadata__\":null}", 0) == 0, "metadata null");
    CHECK(t, OK_HDR(t, "tensor as [dtype, shape, offsets]", "{\"a\":[\"F32\",[1],[0,4]]}", 4) == 1,
          "array form");
    CHECK(t, OK_HDR(t, "dtype {\"F32\": null}",
                    "{\"a\":{\"dtype\":{\"F32\":null},\"shape\":[1],\"data_offsets\":[0,4]}}", 4) == 1,
          "dtype map form");
    moh_safetensors st;
    /* exact integers above 2^53 (a double would round this one to 2^53) */
    const char *big = "{\"a\":{\"dtype\":\"F32\",\"shape\":[0,9007199254740993],\"data_offsets\":[0,0]}}";
    if (expect_ok(t, "dim above 2^53 with a zero dim", big, strlen(big), 0, &st) == 1) {
        CHECK(t, st.tensors[0].shape[1] == 9007199254740993LL && st.tensors[0].numel == 0,
              "dim read as %lld", (long long)st.tensors[0].shape[1]);
        moh_st_close(&st);
    }
    const char *dup = "{\"a\":{" W1 ",\"data_offsets\":[9,4]},\"b\":{\"dtype\":\"U8\",\"shape\":[2],"
                      "\"data_offsets\":[4,6]},\"a\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[0,4]}}";
    if (expect_ok(t, "repeated name: the last wins", dup, strlen(dup), 6, &st) == 2) {
        const moh_st_tensor *a = moh_st_find(&st, "a");
        CHECK(t, a && strcmp(a->dtype_name, "I32") == 0 && a->begin == 0 && a->end == 4,
              "last 'a' kept");
        CHECK(t, strcmp(st.tensors[0].name, "b") == 0, "file order of the kept entries");
        moh_st_close(&st);
    }
    const char *md = "{\"__metadata__\":{\"format\":\"pt\",\"step\":\"1\",\"format\":\"np\"}}";
    if (expect_ok(t, "repeated metadata key: the last wins", md, strlen(md), 0, &st) == 0) {
        const char *f = moh_st_meta(&st, "format");
        CHECK(t, st.n_meta == 2 && f && strcmp(f, "np") == 0, "n_meta %d format %s", st.n_meta,
              f ? f : "NULL");
        moh_st_close(&st);
    }
    /* leading and trailing JSON whitespace (writers may pad) */
    CHECK(t, OK_HDR(t, "whitespace", " \t\r\n{\"a\":{" W1 ",\"data_offsets\":[0,4]}} \t\r\n", 4) == 1,
          "whitespace");

    /* moh is stricter than the reference here, on purpose (see the top of safetensors.c) */
    expect_bad(t, "dim above INT64_MAX",
               "{\"a\":{\"dtype\":\"F32\",\"shape\":[0,9223372036854775808],\"data_offsets\":[0,0]}}",
               0, "dim 1", "9223372036854775808", NULL);
}

/* ---- open errors and atomic writes ------------------------------------------------------------ */

static void test_open_errors(test_ctx *t, const char *dir) {
    moh_safetensors st;
    moh_error err = {0};
    char path[512];
    snprintf(path, sizeof path, "%s/does_not_exist.safetensors", dir);
    int rc = moh_st_open(&st, path, &err);
    CHECK(t, rc == MOH_E_IO && strstr(err.msg, path) && strstr(err.msg, "cannot open"),
          "missing file: %s", err.msg);
    printf("  [missing file] %s\n", err.msg);
    rc = moh_st_open(&st, dir, &err);
    CHECK(t, rc == MOH_E_IO && strstr(err.msg, "not a regular file"), "directory: %s", err.msg);
    snprintf(path, sizeof path, "%s/trunc.safetensors", dir);
    FILE *f = fopen(path, "wb");
    fwrite("\x40\0\0\0\0\0\0\0{}", 1, 10, f);
    fclose(f);
    rc = moh_st_open(&st, path, &err);
    CHECK(t, rc == MOH_E_FORMAT && strstr(err.msg, path) && strstr(err.msg, "larger than the file"),
          "truncated file: %s", err.msg);
    CHECK(t, st.file == NULL && st.path == NULL, "st empty after failed open");
    CHECK(t, moh_st_parse(NULL, NULL, 0, NULL, &err) == MOH_E_ARG, "NULL st");
    CHECK(t, moh_st_open(&st, NULL, &err) == MOH_E_ARG, "NULL path");
}

static void test_atomic_write(test_ctx *t, const char *dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    float w[6] = {1, 2, 3, 4, 5, 6};
    moh_st_entry good[] = {{"w", 2, {2, 3}, w}};
    moh_error err = {0};
    CHECK(t, moh_st_write(path, good, 1, &err) == MOH_OK, "first write: %s", err.msg);
    size_t n0, n1;
    uint8_t *before = slurp(path, &n0);

    /* NULL data with numel > 0 */
    moh_st_entry bad[] = {{"w", 2, {2, 3}, w}, {"v", 1, {2}, NULL}};
    int rc = moh_st_write(path, bad, 2, &err);
    CHECK(t, rc == MOH_E_ARG && strstr(err.msg, "'v'") && strstr(err.msg, "NULL"), "NULL data: %s",
          err.msg);
    printf("  [NULL data] %s\n", err.msg);
    /* duplicate names */
    moh_st_entry dup[] = {{"w", 2, {2, 3}, w}, {"w", 1, {2}, w}};
    rc = moh_st_write(path, dup, 2, &err);
    CHECK(t, rc == MOH_E_ARG && strstr(err.msg, "'w'") && strstr(err.msg, "twice"),
          "duplicate: %s", err.msg);
    printf("  [duplicate] %s\n", err.msg);
    /* other bad arguments */
    moh_st_entry neg[] = {{"w", 2, {2, -3}, w}};
    CHECK(t, moh_st_write(path, neg, 1, &err) == MOH_E_ARG, "negative dim");
    moh_st_entry nd[] = {{"w", 9, {1}, w}};
    CHECK(t, moh_st_write(path, nd, 1, &err) == MOH_E_ARG, "ndim 9");
    moh_st_entry meta[] = {{"__metadata__", 1, {1}, w}};
    CHECK(t, moh_st_write(path, meta, 1, &err) == MOH_E_ARG, "reserved name");
    moh_st_entry nul[] = {{NULL, 1, {1}, w}};
    CHECK(t, moh_st_write(path, nul, 1, &err) == MOH_E_ARG, "NULL name");
    moh_st_entry utf[] = {{"bad\xff", 1, {1}, w}};
    CHECK(t, moh_st_write(path, utf, 1, &err) == MOH_E_ARG, "invalid UTF-8 name");
    moh_st_entry huge[] = {{"h", 3, {1LL << 40, 1LL << 40, 1LL << 40}, w}};
    CHECK(t, moh_st_write(path, huge, 1, &err) == MOH_E_ARG, "huge shape: %s", err.msg);
    CHECK(t, moh_st_write(path, NULL, 1, &err) == MOH_E_ARG, "NULL entries");
    CHECK(t, moh_st_write(NULL, good, 1, &err) == MOH_E_ARG, "NULL path");

    uint8_t *after = slurp(path, &n1);
    CHECK(t, before && after && n0 == n1 && memcmp(before, after, n0) == 0,
          "old file changed by a failed write");
    free(after);
    CHECK(t, count_tmp_files(dir) == 0, "temp file left behind after argument errors");

    /* failure after the temp file exists: renaming a file over a directory fails */
    char dpath[512];
    snprintf(dpath, sizeof dpath, "%s/isdir", dir);
    mkdir(dpath, 0700);
    rc = moh_st_write(dpath, good, 1, &err);
    CHECK(t, rc == MOH_E_IO && strstr(err.msg, "rename"), "rename over dir: rc %d %s", rc, err.msg);
    printf("  [rename fails] %s\n", err.msg);
    CHECK(t, count_tmp_files(dir) == 0, "temp file left behind after a failed rename");
    rmdir(dpath);

    /* missing directory */
    snprintf(dpath, sizeof dpath, "%s/no/such/dir/x.safetensors", dir);
    rc = moh_st_write(dpath, good, 1, &err);
    CHECK(t, rc == MOH_E_IO && strstr(err.msg, "cannot create"), "missing dir: %s", err.msg);

    /* a successful overwrite replaces the file */
    w[0] = 42.0f;
    CHECK(t, moh_st_write(path, good, 1, &err) == MOH_OK, "overwrite: %s", err.msg);
    moh_safetensors st;
    float out[6];
    int64_t s23[] = {2, 3};
    CHECK(t, moh_st_open(&st, path, &err) == MOH_OK &&
                 moh_st_read_f32(&st, "w", 2, s23, out, &err) == MOH_OK && out[0] == 42.0f,
          "overwrite read: %s", err.msg);
    moh_st_close(&st);
    /* no entries at all: header "{}" padded */
    CHECK(t, moh_st_write(path, NULL, 0, &err) == MOH_OK, "empty write: %s", err.msg);
    CHECK(t, moh_st_open(&st, path, &err) == MOH_OK && st.n_tensors == 0, "empty read: %s",
          err.msg);
    moh_st_close(&st);
    free(before);
}

/* ---- __metadata__ ---------------------------------------------------------------------------- */

/* Python's safetensors (when installed) reads moh's metadata, and writes the same bytes as
 * moh_st_write_meta for a single-key metadata object (several keys come out in HashMap order). */
static void test_meta_python(test_ctx *t, const char *dir, const char *multi, const char *single) {
    char script[600], cmd[2400];
    snprintf(script, sizeof script, "%s/check_meta.py", dir);
    FILE *f = fopen(script, "w");
    if (!f) {
        CHECK(t, 0, "cannot write %s", script);
        return;
    }
    fputs("import sys\n"
          "try:\n"
          "    import numpy as np\n"
          "    from safetensors import safe_open\n"
          "    from safetensors.numpy import save_file\n"
          "except ImportError:\n"
          "    sys.exit(77)\n"
          "multi, single, out = sys.argv[1:4]\n"
          "with safe_open(multi, framework='np') as g:\n"
          "    md = g.metadata()\n"
          "    want = {'format': 'pt', 'step': '12', 'odd \"k\" \\\\ \\n': 'v\\t\\u00fc\\u4e2d\\U0001f600',"
          " 'empty': ''}\n"
          "    if md != want:\n"
          "        print('metadata read by Python:', md); sys.exit(1)\n"
          "    if sorted(g.keys()) != ['a', 'b.weight']:\n"
          "        print('keys', list(g.keys())); sys.exit(1)\n"
          "a = (np.arange(6, dtype=np.float32) * 0.5 - 1.0).reshape(2, 3)\n"
          "b = np.array([1.0, -2.0, 0.125, 1e-3], dtype=np.float32)\n"
          "save_file({'a': a, 'b.weight': b}, out, metadata={'format': 'pt'})\n"
          "if open(out, 'rb').read() != open(single, 'rb').read():\n"
          "    print('bytes differ from Python save_file'); sys.exit(1)\n",
          f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "python3 '%s' '%s' '%s' '%s/py_meta.safetensors'", script, multi,
             single, dir);
    int rc = system(cmd);
    int code = rc != -1 && WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
    if (code == 77 || code == 127) {
        printf("  [python] safetensors/numpy not available: interop check skipped\n");
        return;
    }
    CHECK(t, code == 0, "Python check of moh-written metadata failed (exit %d)", code);
    if (code == 0) printf("  [python] safe_open().metadata() reads moh's metadata; bytes match\n");
}

static void test_metadata(test_ctx *t, const char *dir) {
    moh_safetensors st;
    moh_error err = {0};
    /* written by Python (tools/ref/gen_st_fixtures.py) */
    int rc = moh_st_open(&st, FIX_DIR "mixed.safetensors", &err);
    CHECK(t, rc == MOH_OK, "open mixed: %s", err.msg);
    if (rc == MOH_OK) {
        CHECK(t, st.n_meta == 2, "n_meta %d", st.n_meta);
        const char *fmt = moh_st_meta(&st, "format"), *note = moh_st_meta(&st, "note");
        CHECK(t, fmt && strcmp(fmt, "pt") == 0, "format %s", fmt ? fmt : "NULL");
        CHECK(t, note && strcmp(note, "moh fixture") == 0, "note %s", note ? note : "NULL");
        CHECK(t, moh_st_meta(&st, "nope") == NULL && moh_st_meta(&st, NULL) == NULL &&
                     moh_st_meta(NULL, "format") == NULL,
              "absent key / NULL arguments");
        moh_st_close(&st);
        CHECK(t, st.meta == NULL && st.n_meta == 0, "close frees the metadata");
    }
    rc = moh_st_open(&st, FIX_DIR "f32_ref.safetensors", &err);
    CHECK(t, rc == MOH_OK && st.n_meta == 0 && moh_st_meta(&st, "format") == NULL,
          "no __metadata__: %s", err.msg);
    moh_st_close(&st);

    /* round trip, with keys and values that need escaping */
    float a[6], bw[4] = {1.0f, -2.0f, 0.125f, 1e-3f};
    for (int i = 0; i < 6; i++) a[i] = (float)i * 0.5f - 1.0f;
    moh_st_entry e[2] = {{"a", 2, {2, 3}, a}, {"b.weight", 1, {4}, bw}};
    const char *meta[] = {"format", "pt", "step", "12", "odd \"k\" \\ \n",
                          "v\t\xc3\xbc\xe4\xb8\xad\xf0\x9f\x98\x80", "empty", ""};
    char multi[512], single[512];
    snprintf(multi, sizeof multi, "%s/meta.safetensors", dir);
    rc = moh_st_write_meta(multi, e, 2, meta, 4, &err);
    CHECK(t, rc == MOH_OK, "write_meta: %s", err.msg);
    rc = moh_st_open(&st, multi, &err);
    CHECK(t, rc == MOH_OK, "reopen: %s", err.msg);
    if (rc == MOH_OK) {
        CHECK(t, st.n_meta == 4 && st.n_tensors == 2, "n_meta %d n_tensors %d", st.n_meta,
              st.n_tensors);
        for (int i = 0; i < 4; i++) {
            const char *v = moh_st_meta(&st, meta[2 * i]);
            CHECK(t, v && strcmp(v, meta[2 * i + 1]) == 0, "meta %d: %s", i, v ? v : "NULL");
            CHECK(t, st.n_meta == 4 && strcmp(st.meta[2 * i], meta[2 * i]) == 0, "order %d", i);
        }
        float out[6];
        int64_t s23[] = {2, 3};
        CHECK(t, moh_st_read_f32(&st, "a", 2, s23, out, &err) == MOH_OK &&
                     memcmp(out, a, sizeof a) == 0,
              "tensor after metadata: %s", err.msg);
        CHECK(t, moh_st_find(&st, "__metadata__") == NULL, "metadata is not a tensor");
        moh_st_close(&st);
    }
    /* single key: the reference's exact bytes (checked against Python below) */
    snprintf(single, sizeof single, "%s/meta1.safetensors", dir);
    CHECK(t, moh_st_write_meta(single, e, 2, meta, 1, &err) == MOH_OK, "%s", err.msg);
    /* metadata without tensors; and n_meta 0 is exactly moh_st_write */
    char path[512];
    snprintf(path, sizeof path, "%s/meta_only.safetensors", dir);
    CHECK(t, moh_st_write_meta(path, NULL, 0, meta, 2, &err) == MOH_OK, "%s", err.msg);
    CHECK(t, moh_st_open(&st, path, &err) == MOH_OK && st.n_tensors == 0 && st.n_meta == 2,
          "metadata only: %s", err.msg);
    moh_st_close(&st);
    CHECK(t, moh_st_write_meta(path, e, 2, NULL, 0, &err) == MOH_OK, "%s", err.msg);
    size_t n1 = 0, n2 = 0;
    uint8_t *b1 = slurp(FIX_DIR "f32_ref.safetensors", &n1), *b2 = slurp(path, &n2);
    CHECK(t, b1 && b2 && n1 == n2 && memcmp(b1, b2, n1) == 0, "n_meta 0 differs from reference");
    free(b1);
    free(b2);

    test_meta_python(t, dir, multi, single);

    /* bad metadata arguments: MOH_E_ARG, the existing file untouched */
    size_t n0;
    uint8_t *before = slurp(multi, &n0);
    const char *dup[] = {"format", "pt", "step", "1", "format", "np"};
    rc = moh_st_write_meta(multi, e, 2, dup, 3, &err);
    CHECK(t, rc == MOH_E_ARG && strstr(err.msg, "'format'") && strstr(err.msg, "twice") &&
                 strstr(err.msg, multi),
          "duplicate key: rc %d %s", rc, err.msg);
    printf("  [duplicate key] %s\n", err.msg);
    const char *nullv[] = {"format", NULL};
    rc = moh_st_write_meta(multi, e, 2, nullv, 1, &err);
    CHECK(t, rc == MOH_E_ARG && strstr(err.msg, "value is NULL"), "NULL value: %s", err.msg);
    const char *nullk[] = {NULL, "x"};
    rc = moh_st_write_meta(multi, e, 2, nullk, 1, &err);
    CHECK(t, rc == MOH_E_ARG && strstr(err.msg, "key is NULL"), "NULL key: %s", err.msg);
    const char *badk[] = {"k\xff", "x"}, *badv[] = {"k", "\xc0\x80"};
    rc = moh_st_write_meta(multi, e, 2, badk, 1, &err);
    CHECK(t, rc == MOH_E_ARG && strstr(err.msg, "key is not valid UTF-8"), "bad key: %s", err.msg);
    rc = moh_st_write_meta(multi, e, 2, badv, 1, &err);
    CHECK(t, rc == MOH_E_ARG && strstr(err.msg, "value is not valid UTF-8") &&
                 strstr(err.msg, "'k'"),
          "bad value: %s", err.msg);
    printf("  [bad value] %s\n", err.msg);
    CHECK(t, moh_st_write_meta(multi, e, 2, NULL, 1, &err) == MOH_E_ARG, "NULL meta, n_meta 1");
    CHECK(t, moh_st_write_meta(multi, e, 2, meta, -1, &err) == MOH_E_ARG, "n_meta -1");
    uint8_t *after = slurp(multi, &n2);
    CHECK(t, before && after && n0 == n2 && memcmp(before, after, n0) == 0,
          "old file changed by a failed write_meta");
    CHECK(t, count_tmp_files(dir) == 0, "temp file left behind");
    free(before);
    free(after);

    /* bad __metadata__ in a file: MOH_E_FORMAT */
    const char *tail = ",\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}";
    char hdr[512];
    snprintf(hdr, sizeof hdr, "{\"__metadata__\":{\"step\":12}%s", tail);
    expect_bad(t, "metadata number value", hdr, 4, "__metadata__", "'step'", "string", "12", NULL);
    snprintf(hdr, sizeof hdr, "{\"__metadata__\":[\"pt\"]%s", tail);
    expect_bad(t, "metadata array", hdr, 4, "__metadata__", "object", NULL);
    snprintf(hdr, sizeof hdr, "{\"__metadata__\":{\"k\":\"a\\u0000b\"}%s", tail);
    expect_bad(t, "metadata NUL", hdr, 4, "\\u0000", NULL);
    expect_bad(t, "name NUL", "{\"x\\u0000y\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
               4, "\\u0000", NULL);
    /* an escaped backslash before u0000 is not a NUL */
    size_t n;
    uint8_t *b = mk_st("{\"__metadata__\":{\"k\":\"a\\\\u0000\"}}", 0, &n);
    rc = moh_st_parse(&st, b, n, "ok", &err);
    CHECK(t, rc == MOH_OK && strcmp(moh_st_meta(&st, "k"), "a\\u0000") == 0, "escaped backslash: %s",
          err.msg);
    moh_st_close(&st);
    free(b);
    /* empty metadata object */
    b = mk_st("{\"__metadata__\":{}}", 0, &n);
    rc = moh_st_parse(&st, b, n, "ok", &err);
    CHECK(t, rc == MOH_OK && st.n_meta == 0 && moh_st_meta(&st, "k") == NULL, "empty: %s", err.msg);
    moh_st_close(&st);
    free(b);
}

static void rm_tree_files(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    char p[1024];
    for (struct dirent *e; (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (unlink(p) != 0) rmdir(p);
    }
    closedir(d);
    rmdir(dir);
}

int main(void) {
    test_ctx t = {0, 0};
    char dir[] = "/tmp/moh_test_st_XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_fixture_mixed(&t);
    test_missing_tensor_message(&t);
    test_write_matches_reference(&t, dir);
    test_exhaustive_half(&t);
    test_round_trip(&t, dir);
    test_malformed(&t);
    test_allowed(&t);
    test_reference_rules(&t);
    test_open_errors(&t, dir);
    test_atomic_write(&t, dir);
    test_metadata(&t, dir);
    rm_tree_files(dir);
    return test_finish("test_safetensors", &t);
}
