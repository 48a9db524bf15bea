/* safetensors reader and writer.
 *
 * File layout (https://huggingface.co/docs/safetensors): u64 little-endian header length n, n bytes
 * of UTF-8 JSON {name: {"dtype", "shape", "data_offsets": [begin, end)}, "__metadata__": {...}},
 * then the data buffer that the offsets index.
 *
 * The reader accepts what the reference reader accepts (huggingface/safetensors 0.8,
 * SafeTensors::read_metadata + Metadata::validate, checked against the Python package with
 * tools/ref/st_strict_verdicts.py) and refuses the rest, with the reference's reason:
 * - file shorter than 8 bytes (HeaderTooSmall); n above 100000000 (HeaderTooLarge); n past the
 *   end of the file (InvalidHeaderLength); header not UTF-8 (InvalidHeader);
 * - header not JSON as serde_json reads it into the reference's structs (InvalidHeader-
 *   Deserialization): strict JSON grammar, JSON whitespace (space, tab, CR, LF) allowed before and
 *   after the object, nesting at most 127 deep, no number out of double range, strings without
 *   raw control bytes and with only JSON's escapes (\uXXXX with 4 hex digits); the top level an
 *   object; "__metadata__" at most once, null or an object of strings (a repeated key: the last
 *   one wins); each tensor an object with dtype, shape and data_offsets once each (unknown fields
 *   ignored), or serde's equivalent 3-element array [dtype, shape, data_offsets]; dtype one of the
 *   format's names (or serde's {"F32": null} form); shape and data_offsets integer literals >= 0
 *   (1.0, 1e0 and -0 are floats to serde and refused); a repeated tensor name: the last one wins;
 * - the tensors, sorted by (begin, end), tile the data buffer: the first begins at 0, each begins
 *   where the previous ends, so no gaps, no overlaps, zero-size tensors only at a boundary
 *   (InvalidOffset); numel and bits computed with overflow checks dim by dim (ValidationOverflow);
 *   a whole number of bytes (MisalignedSlice); end - begin == numel * itemsize
 *   (TensorInvalidInfo); the last tensor ends exactly at the end of the file, no trailing bytes
 *   (MetadataIncompleteBuffer).
 * moh is stricter in three cases the reference accepts, each because moh's tensor struct would
 * otherwise carry a wrong value: a \u0000 escape in a name or metadata string (C strings: cJSON
 * would cut "a\u0000b" to "a", so a lookup could return another tensor), more than
 * MOH_ST_MAX_DIMS dims (fixed-size shape array) and a dim above INT64_MAX (int64_t shape; the
 * reference can only accept one in a tensor with a zero dim).
 *
 * Writing produces F32 tensors in entry order, after the optional __metadata__ object, header
 * padded with spaces to a multiple of 8 like the reference implementation, atomically (temp file,
 * fsync, rename, fsync of the directory).
 */
#include "moh.h"

#include "io/json_util.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#define ST_MAX_HEADER 100000000ull       /* same limit as the reference implementation */
#define ST_MAX_JSON_INT 9007199254740992.0 /* 2^53: larger integers are not exact in a double */
#define ST_NAME_SHOWN 160                 /* longest tensor name quoted in full in a message */

/* ---------------------------------------------------------------------------------------------
 * Small helpers
 * ------------------------------------------------------------------------------------------- */

typedef struct st_dtype_info {
    const char *name;
    moh_dtype dt;
    unsigned bits; /* bits per element */
} st_dtype_info;

/* Every dtype of the safetensors format (as of 0.8); only the first four are readable as float. */
static const st_dtype_info ST_DTYPES[] = {
    {"F32", MOH_DT_F32, 32},      {"F64", MOH_DT_F64, 64},      {"BF16", MOH_DT_BF16, 16},
    {"F16", MOH_DT_F16, 16},      {"I64", MOH_DT_OTHER, 64},    {"U64", MOH_DT_OTHER, 64},
    {"I32", MOH_DT_OTHER, 32},    {"U32", MOH_DT_OTHER, 32},    {"I16", MOH_DT_OTHER, 16},
    {"U16", MOH_DT_OTHER, 16},    {"I8", MOH_DT_OTHER, 8},      {"U8", MOH_DT_OTHER, 8},
    {"BOOL", MOH_DT_OTHER, 8},    {"F8_E4M3", MOH_DT_OTHER, 8}, {"F8_E5M2", MOH_DT_OTHER, 8},
    {"F8_E8M0", MOH_DT_OTHER, 8}, {"C64", MOH_DT_OTHER, 64},    {"F6_E2M3", MOH_DT_OTHER, 6},
    {"F6_E3M2", MOH_DT_OTHER, 6}, {"F4", MOH_DT_OTHER, 4},        {"F8_E4M3FNUZ", MOH_DT_OTHER, 8},
    {"F8_E5M2FNUZ", MOH_DT_OTHER, 8},
};

static const st_dtype_info *st_dtype_lookup(const char *name) {
    for (size_t i = 0; i < sizeof ST_DTYPES / sizeof ST_DTYPES[0]; i++)
        if (strcmp(ST_DTYPES[i].name, name) == 0) return &ST_DTYPES[i];
    return NULL;
}

/* Copies s into buf (cap >= 8) for quoting in a one-line message: control bytes, quote and
 * backslash escaped, long names cut at ST_NAME_SHOWN bytes with "...". Returns buf. */
const char *moh_st_quote(char *buf, size_t cap, const char *s) {
    return json_quote(buf, cap, s ? s : "(null)", ST_NAME_SHOWN, 9); /* "...\0" + one escape */
}

/* "[4, 8]" ("[]" for a scalar); cut with "...]" when the buffer is short. */
static const char *st_shape_str(char *buf, size_t cap, int ndim, const int64_t *shape) {
    size_t o = 0;
    buf[o++] = '[';
    for (int i = 0; i < ndim; i++) {
        char num[32];
        int k = snprintf(num, sizeof num, "%s%" PRId64, i ? ", " : "", shape[i]);
        if (k < 0 || o + (size_t)k + 5 > cap) {
            memcpy(buf + o, "...", 3);
            o += 3;
            break;
        }
        memcpy(buf + o, num, (size_t)k);
        o += (size_t)k;
    }
    buf[o++] = ']';
    buf[o] = '\0';
    return buf;
}

static const char *st_json_type(const cJSON *j) {
    if (!j) return "nothing";
    if (cJSON_IsObject(j)) return "an object";
    if (cJSON_IsArray(j)) return "an array";
    if (cJSON_IsString(j)) return "a string";
    if (cJSON_IsNumber(j)) return "a number";
    if (cJSON_IsBool(j)) return "a boolean";
    if (cJSON_IsNull(j)) return "null";
    return "an invalid value";
}

static uint64_t st_le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}
static uint32_t st_le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint16_t st_le16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

static float st_bits_f32(uint32_t b) {
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}

/* IEEE binary16 -> binary32, exact for every input: zeros, subnormals (renormalised), normals,
 * infinities, NaNs (payload kept in the top mantissa bits, quiet bit preserved). */
static float st_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31;
    uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    if (exp == 0) {
        if (mant == 0) return st_bits_f32(sign);
        int e = -1;
        do {
            e++;
            mant <<= 1;
        } while (!(mant & 0x400u));
        mant &= 0x3ffu;
        return st_bits_f32(sign | (uint32_t)(112 - e) << 23 | mant << 13);
    }
    if (exp == 31) return st_bits_f32(sign | 0x7f800000u | mant << 13);
    return st_bits_f32(sign | (exp + 112u) << 23 | mant << 13);
}

/* bfloat16 is the top half of a binary32: exact, including subnormals, inf and NaN. */
static float st_bf16_to_f32(uint16_t h) { return st_bits_f32((uint32_t)h << 16); }

/* Well-formed UTF-8 (no overlongs, surrogates or code points above U+10FFFF) and, unless
 * allow_control, no JSON-illegal control bytes. Returns the offset of the first bad byte, or len
 * when all is well. */
static size_t st_check_text(const uint8_t *s, size_t len, int allow_control, int *is_control) {
    size_t i = 0;
    *is_control = 0;
    while (i < len) {
        uint8_t c = s[i];
        if (c < 0x80) {
            if (c < 0x20 && !allow_control && c != '\t' && c != '\n' && c != '\r') {
                *is_control = 1;
                return i;
            }
            i++;
            continue;
        }
        size_t n;
        uint32_t cp, min;
        if (c >= 0xC2 && c <= 0xDF) n = 1, cp = c & 0x1fu, min = 0x80;
        else if (c >= 0xE0 && c <= 0xEF) n = 2, cp = c & 0x0fu, min = 0x800;
        else if (c >= 0xF0 && c <= 0xF4) n = 3, cp = c & 0x07u, min = 0x10000;
        else return i;
        if (len - i <= n) return i;
        for (size_t k = 1; k <= n; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return i;
            cp = cp << 6 | (s[i + k] & 0x3fu);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
        i += n + 1;
    }
    return len;
}

/* serde_json's string rules, which cJSON does not enforce: inside a JSON string no raw control
 * byte (0x00-0x1F), and a backslash only before one of " \\ / b f n r t, or u and 4 hex digits.
 * Returns the offset of the first offending byte, or len; *what gets the reason. */
static size_t st_check_strings(const uint8_t *s, size_t len, const char **what) {
    bool in = false;
    for (size_t i = 0; i < len; i++) {
        const uint8_t c = s[i];
        if (!in) {
            in = c == '"';
            continue;
        }
        if (c == '"') {
            in = false;
        } else if (c < 0x20) {
            *what = "control character (\\u0000-\\u001F) found while parsing a string";
            return i;
        } else if (c == '\\') {
            const uint8_t e = i + 1 < len ? s[i + 1] : 0;
            if (e && strchr("\"\\/bfnrt", e)) {
                i++;
            } else if (e == 'u') {
                for (size_t k = 2; k < 6; k++)
                    if (i + k >= len || !isxdigit(s[i + k])) {
                        *what = "invalid \\u escape (expected 4 hex digits)";
                        return i;
                    }
                i += 5;
            } else {
                *what = "invalid escape";
                return i;
            }
        }
    }
    return len;
}

/* Short rendering of a JSON value for messages ("-3", "\"x\"", "[1, 2]"...). */
static const char *st_json_show(char *buf, size_t cap, const cJSON *j) {
    if (!j) {
        snprintf(buf, cap, "nothing");
        return buf;
    }
    if (cJSON_IsNumber(j)) {
        json_shortest_number(buf, cap, j->valuedouble);
        return buf;
    }
    char *s = cJSON_PrintUnformatted(j);
    if (!s) {
        snprintf(buf, cap, "%s", st_json_type(j));
        return buf;
    }
    moh_st_quote(buf, cap, s);
    cJSON_free(s);
    return buf;
}

static int st_cmp_begin(const void *a, const void *b) {
    const moh_st_tensor *x = *(const moh_st_tensor *const *)a, *y = *(const moh_st_tensor *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

static int st_cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static char *st_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

#define ST_MAX_DEPTH 127 /* serde_json's recursion limit: 128 nested arrays/objects fail */

/* One JSON number of the header, in text order: is_uint when it is an integer literal (no '-',
 * fraction or exponent) that fits 64 bits, which is what serde_json hands to a usize field. */
typedef struct st_number {
    uint64_t u;
    int is_uint;
} st_number;

/* What the header scan found: the numbers in text order, or the first problem cJSON does not
 * report itself (a number outside the JSON grammar, nesting over ST_MAX_DEPTH, \u0000). */
typedef struct st_scan {
    st_number *num;
    size_t n_num, cap;
    size_t bad_at; /* byte offset of the problem, when why != NULL */
    const char *why;
} st_scan;

/* Scans the JSON text (already accepted by cJSON) outside strings: number grammar (RFC 8259:
 * -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?, cJSON's strtod also takes "01" and "1."),
 * nesting depth, and \u0000 escapes inside strings. Returns 0 when out of memory. */
static int st_scan_json(const char *t, size_t n, st_scan *sc) {
    int depth = 0;
    for (size_t i = 0; i < n && !sc->why; i++) {
        char c = t[i];
        if (c == '"') {
            for (i++; i < n && t[i] != '"'; i++)
                if (t[i] == '\\') {
                    if (i + 5 < n && t[i + 1] == 'u' && memcmp(t + i + 2, "0000", 4) == 0) {
                        sc->bad_at = i;
                        sc->why = "a \\u0000 escape in a string (NUL is not supported in "
                                  "tensor names or metadata)";
                    }
                    i++; /* the escaped character, \" in particular */
                }
        } else if (c == '[' || c == '{') {
            if (++depth > ST_MAX_DEPTH) {
                sc->bad_at = i;
                sc->why = "not valid JSON (nested deeper than 127 levels, the reference "
                          "parser's recursion limit)";
            }
        } else if (c == ']' || c == '}') {
            depth--;
        } else if (c == '-' || (c >= '0' && c <= '9')) {
            size_t s = i, k = i + (c == '-');
            int ok = k < n && t[k] >= '0' && t[k] <= '9', is_int = c != '-', over = 0;
            uint64_t u = 0;
            if (ok && t[k] == '0' && k + 1 < n && t[k + 1] >= '0' && t[k + 1] <= '9') ok = 0;
            for (; ok && k < n && t[k] >= '0' && t[k] <= '9'; k++)
                if (__builtin_mul_overflow(u, 10u, &u) ||
                    __builtin_add_overflow(u, (uint64_t)(t[k] - '0'), &u))
                    over = 1;
            if (ok && k < n && t[k] == '.') {
                is_int = 0;
                ok = ++k < n && t[k] >= '0' && t[k] <= '9';
                while (k < n && t[k] >= '0' && t[k] <= '9') k++;
            }
            if (ok && k < n && (t[k] == 'e' || t[k] == 'E')) {
                is_int = 0;
                k++;
                if (k < n && (t[k] == '+' || t[k] == '-')) k++;
                ok = k < n && t[k] >= '0' && t[k] <= '9';
                while (k < n && t[k] >= '0' && t[k] <= '9') k++;
            }
            if (!ok) {
                sc->bad_at = s;
                sc->why = "not valid JSON (malformed number)";
                break;
            }
            if (sc->n_num == sc->cap) {
                size_t cap = sc->cap ? 2 * sc->cap : 64;
                st_number *q = realloc(sc->num, cap * sizeof *q);
                if (!q) return 0;
                sc->num = q;
                sc->cap = cap;
            }
            sc->num[sc->n_num].u = u;
            sc->num[sc->n_num++].is_uint = is_int && !over;
            i = k - 1;
        }
    }
    return 1;
}

/* Tags every number node of the tree with its index in text order (in valueint, which nothing
 * here reads otherwise): cJSON keeps members and elements in text order and keys are strings, so
 * a pre-order walk meets the numbers in the order st_scan_json found them. Returns the first
 * number node that is out of double range (serde_json refuses 1e400), else NULL; *k counts. */
static const cJSON *st_tag_numbers(cJSON *j, size_t *k) {
    for (; j; j = j->next) {
        if (cJSON_IsNumber(j)) {
            j->valueint = *k <= INT_MAX ? (int)*k : -1;
            ++*k;
            if (isinf(j->valuedouble)) return j;
        }
        const cJSON *bad = st_tag_numbers(j->child, k);
        if (bad) return bad;
    }
    return NULL;
}

/* A JSON number written as an integer literal >= 0 that fits 64 bits (serde's usize); its exact
 * value, from the text (cJSON's double is exact only up to 2^53). */
static int st_json_uint(const st_scan *sc, const cJSON *j, uint64_t *out) {
    if (!cJSON_IsNumber(j) || j->valueint < 0 || (size_t)j->valueint >= sc->n_num) return 0;
    const st_number *x = &sc->num[j->valueint];
    if (!x->is_uint) return 0;
    *out = x->u;
    return 1;
}

/* ---------------------------------------------------------------------------------------------
 * Parsing
 * ------------------------------------------------------------------------------------------- */

void moh_st_close(moh_safetensors *st) {
    if (!st) return;
    if (st->tensors)
        for (int i = 0; i < st->n_tensors; i++) free(st->tensors[i].name);
    free(st->tensors);
    if (st->meta)
        for (int i = 0; i < 2 * st->n_meta; i++) free(st->meta[i]);
    free(st->meta);
    free(st->path);
    free(st->file);
    memset(st, 0, sizeof *st);
}

/* keep[i] = 0 for each of the n keys (keys[i * stride]) that appears again later, else 1: the
 * reference reads the header into a HashMap, where the last of repeated keys wins. Returns 0
 * when out of memory. */
typedef struct st_key {
    const char *k;
    int i;
} st_key;
static int st_cmp_key(const void *a, const void *b) {
    const st_key *x = a, *y = b;
    int c = strcmp(x->k, y->k);
    return c ? c : (x->i > y->i) - (x->i < y->i);
}
static int st_last_wins(const char *const *keys, size_t stride, int n, unsigned char *keep) {
    st_key *v = malloc((size_t)n * sizeof *v);
    if (!v) return 0;
    for (int i = 0; i < n; i++) {
        v[i].k = keys[(size_t)i * stride];
        v[i].i = i;
        keep[i] = 1;
    }
    qsort(v, (size_t)n, sizeof *v, st_cmp_key);
    for (int i = 1; i < n; i++)
        if (strcmp(v[i - 1].k, v[i].k) == 0) keep[v[i - 1].i] = 0;
    free(v);
    return 1;
}

/* Keeps the __metadata__ object (string -> string; null is no metadata; of a repeated key the last
 * value) in st->meta, in file order. */
static int st_parse_metadata(moh_safetensors *st, const cJSON *meta, const char *label,
                             moh_error *err) {
    char v[200], k[200];
    if (cJSON_IsNull(meta)) return MOH_OK;
    if (!cJSON_IsObject(meta))
        return moh_fail(err, MOH_E_FORMAT,
                        "%s: __metadata__: expected null or an object of strings, got %s", label,
                        st_json_show(v, sizeof v, meta));
    int count = 0;
    for (const cJSON *m = meta->child; m; m = m->next) {
        if (!m->string)
            return moh_fail(err, MOH_E_FORMAT, "%s: __metadata__: entry without a key", label);
        if (!cJSON_IsString(m) || !m->valuestring)
            return moh_fail(err, MOH_E_FORMAT,
                            "%s: __metadata__: value of '%s' must be a string, got %s", label,
                            moh_st_quote(k, sizeof k, m->string), st_json_show(v, sizeof v, m));
        if (count == INT_MAX / 2)
            return moh_fail(err, MOH_E_FORMAT, "%s: __metadata__: too many entries", label);
        count++;
    }
    if (count == 0) return MOH_OK;
    st->meta = calloc(2 * (size_t)count, sizeof *st->meta);
    unsigned char *keep = malloc((size_t)count);
    if (!st->meta || !keep) {
        free(keep);
        return moh_fail(err, MOH_E_NOMEM, "%s: out of memory for %d metadata entries", label,
                        count);
    }
    for (const cJSON *m = meta->child; m; m = m->next) {
        char **kv = st->meta + 2 * st->n_meta;
        kv[0] = st_strdup(m->string);
        kv[1] = kv[0] ? st_strdup(m->valuestring) : NULL;
        if (!kv[1]) {
            free(kv[0]);
            kv[0] = NULL;
            free(keep);
            return moh_fail(err, MOH_E_NOMEM, "%s: out of memory", label);
        }
        st->n_meta++;
    }
    if (!st_last_wins((const char *const *)st->meta, 2, count, keep)) {
        free(keep);
        return moh_fail(err, MOH_E_NOMEM, "%s: out of memory", label);
    }
    int w = 0;
    for (int i = 0; i < count; i++) {
        if (keep[i]) {
            st->meta[2 * w] = st->meta[2 * i];
            st->meta[2 * w + 1] = st->meta[2 * i + 1];
            w++;
        } else {
            free(st->meta[2 * i]);
            free(st->meta[2 * i + 1]);
        }
    }
    st->n_meta = w;
    free(keep);
    return MOH_OK;
}

const char *moh_st_meta(const moh_safetensors *st, const char *key) {
    if (!st || !key || !st->meta) return NULL;
    for (int i = 0; i < st->n_meta; i++)
        if (strcmp(st->meta[2 * i], key) == 0) return st->meta[2 * i + 1];
    return NULL;
}

/* Fills dtype, shape and offsets of t from the header entry j (the name is already set): the
 * checks of deserialising the reference's TensorInfo. Offsets and sizes: st_validate. */
static int st_parse_entry(moh_st_tensor *t, const cJSON *j, const st_scan *sc, const char *label,
                          moh_error *err) {
    char nm[200], v[200];
    moh_st_quote(nm, sizeof nm, t->name);
    const cJSON *jd, *js, *jo;
    if (cJSON_IsArray(j) && cJSON_GetArraySize(j) == 3) { /* serde reads a struct from a sequence */
        jd = j->child;
        js = jd->next;
        jo = js->next;
    } else if (cJSON_IsObject(j)) {
        /* Unknown keys are ignored like the reference does; a repeated field is an error there. */
        static const char *const fields[3] = {"dtype", "shape", "data_offsets"};
        int seen[3] = {0, 0, 0};
        for (const cJSON *a = j->child; a; a = a->next)
            for (int f = 0; f < 3; f++)
                if (a->string && strcmp(a->string, fields[f]) == 0 && seen[f]++)
                    return moh_fail(err, MOH_E_FORMAT,
                                    "%s: tensor '%s': field '%s' appears twice", label, nm,
                                    fields[f]);
        jd = cJSON_GetObjectItemCaseSensitive(j, "dtype");
        js = cJSON_GetObjectItemCaseSensitive(j, "shape");
        jo = cJSON_GetObjectItemCaseSensitive(j, "data_offsets");
        const char *miss = !jd ? "dtype" : !js ? "shape" : !jo ? "data_offsets" : NULL;
        if (miss)
            return moh_fail(err, MOH_E_FORMAT, "%s: tensor '%s': missing field '%s'", label, nm,
                            miss);
    } else {
        return moh_fail(err, MOH_E_FORMAT,
                        "%s: tensor '%s': expected an object with dtype, shape and data_offsets "
                        "(or the array [dtype, shape, data_offsets]), got %s",
                        label, nm, st_json_show(v, sizeof v, j));
    }

    /* dtype: a name, or serde's map form of a unit variant {"F32": null} */
    const char *dn = NULL;
    if (cJSON_IsString(jd)) dn = jd->valuestring;
    else if (cJSON_IsObject(jd) && jd->child && !jd->child->next && cJSON_IsNull(jd->child))
        dn = jd->child->string;
    if (!dn)
        return moh_fail(err, MOH_E_FORMAT,
                        "%s: tensor '%s': field 'dtype': expected a string such as \"F32\", got %s",
                        label, nm, st_json_show(v, sizeof v, jd));
    const st_dtype_info *di = st_dtype_lookup(dn);
    if (!di) {
        char names[300];
        size_t o = 0;
        for (size_t i = 0; i < sizeof ST_DTYPES / sizeof ST_DTYPES[0] && o < sizeof names; i++)
            o += (size_t)snprintf(names + o, sizeof names - o, "%s%s", i ? ", " : "",
                                  ST_DTYPES[i].name);
        return moh_fail(err, MOH_E_FORMAT,
                        "%s: tensor '%s': field 'dtype': unknown dtype '%s', expected one of %s",
                        label, nm, moh_st_quote(v, sizeof v, dn), names);
    }
    t->dtype = di->dt;
    snprintf(t->dtype_name, sizeof t->dtype_name, "%s", di->name);

    /* shape */
    if (!cJSON_IsArray(js))
        return moh_fail(err, MOH_E_FORMAT,
                        "%s: tensor '%s': field 'shape': expected an array of non-negative "
                        "integers, got %s",
                        label, nm, st_json_show(v, sizeof v, js));
    t->ndim = 0;
    for (const cJSON *d = js->child; d; d = d->next) {
        uint64_t x;
        if (!st_json_uint(sc, d, &x))
            return moh_fail(err, MOH_E_FORMAT,
                            "%s: tensor '%s': field 'shape': dim %d is %s, expected an integer "
                            "literal >= 0 below 2^64 (a fraction, exponent or '-' makes a float)",
                            label, nm, t->ndim, st_json_show(v, sizeof v, d));
        if (t->ndim == MOH_ST_MAX_DIMS)
            return moh_fail(err, MOH_E_FORMAT,
                            "%s: tensor '%s': field 'shape' has %d dims, at most %d are supported",
                            label, nm, cJSON_GetArraySize(js), MOH_ST_MAX_DIMS);
        if (x > (uint64_t)INT64_MAX)
            return moh_fail(err, MOH_E_FORMAT,
                            "%s: tensor '%s': field 'shape': dim %d is %" PRIu64
                            ", above the %" PRId64 " that moh supports",
                            label, nm, t->ndim, x, INT64_MAX);
        t->shape[t->ndim++] = (int64_t)x;
    }

    /* data_offsets */
    uint64_t off[2];
    if (!cJSON_IsArray(jo) || cJSON_GetArraySize(jo) != 2 || !st_json_uint(sc, jo->child, &off[0]) ||
        !st_json_uint(sc, jo->child->next, &off[1]))
        return moh_fail(err, MOH_E_FORMAT,
                        "%s: tensor '%s': field 'data_offsets': expected [begin, end] with two "
                        "integer literals >= 0 below 2^64 (a fraction, exponent or '-' makes a "
                        "float), got %s",
                        label, nm, st_json_show(v, sizeof v, jo));
    t->begin = off[0] < SIZE_MAX ? (size_t)off[0] : SIZE_MAX;
    t->end = off[1] < SIZE_MAX ? (size_t)off[1] : SIZE_MAX;
    return MOH_OK;
}

/* The reference's Metadata::validate and its last check: the tensors, sorted by (begin, end),
 * tile the data buffer from byte 0 to its end; each holds exactly numel * itemsize bytes. */
static int st_validate(moh_safetensors *st, const char *label, moh_error *err) {
    int n = st->n_tensors;
    moh_st_tensor **p = n ? malloc((size_t)n * sizeof *p) : NULL;
    if (n && !p) return moh_fail(err, MOH_E_NOMEM, "%s: out of memory checking %d tensors", label, n);
    for (int i = 0; i < n; i++) p[i] = &st->tensors[i];
    if (n > 1) qsort(p, (size_t)n, sizeof *p, st_cmp_begin);
    char nm[200], a[200], sh[200];
    int rc = MOH_OK;
    size_t start = 0;
    for (int i = 0; i < n && rc == MOH_OK; i++) {
        moh_st_tensor *t = p[i];
        moh_st_quote(nm, sizeof nm, t->name);
        st_shape_str(sh, sizeof sh, t->ndim, t->shape);
        if (t->end < t->begin) {
            rc = moh_fail(err, MOH_E_FORMAT,
                          "%s: tensor '%s': invalid offsets: data_offsets [%zu, %zu) begin after "
                          "their end",
                          label, nm, t->begin, t->end);
        } else if (t->begin < start) {
            rc = moh_fail(err, MOH_E_FORMAT,
                          "%s: tensor '%s': invalid offsets: data_offsets [%zu, %zu) overlap "
                          "tensor '%s' [%zu, %zu) (tensors must tile the data buffer)",
                          label, nm, t->begin, t->end, moh_st_quote(a, sizeof a, p[i - 1]->name),
                          p[i - 1]->begin, p[i - 1]->end);
        } else if (t->begin > start) {
            rc = moh_fail(err, MOH_E_FORMAT,
                          "%s: tensor '%s': invalid offsets: data_offsets [%zu, %zu) leave bytes "
                          "[%zu, %zu) of the data buffer unused, expected it to begin at %zu "
                          "(tensors must tile the data buffer from byte 0, without gaps)",
                          label, nm, t->begin, t->end, start, t->begin, start);
        }
        if (rc != MOH_OK) break;
        start = t->end;
        const st_dtype_info *di = st_dtype_lookup(t->dtype_name);
        uint64_t numel = 1, bits = 0;
        int over = 0;
        for (int d = 0; d < t->ndim && !over; d++)
            over = __builtin_mul_overflow(numel, (uint64_t)t->shape[d], &numel);
        if (over || __builtin_mul_overflow(numel, (uint64_t)di->bits, &bits) ||
            numel > (uint64_t)INT64_MAX)
            rc = moh_fail(err, MOH_E_FORMAT,
                          "%s: tensor '%s': dtype %s with shape %s overflows 64 bits computing "
                          "its byte size",
                          label, nm, di->name, sh);
        else if (bits % 8 != 0)
            rc = moh_fail(err, MOH_E_FORMAT,
                          "%s: tensor '%s': dtype %s with shape %s is %" PRIu64
                          " bits, not a whole number of bytes",
                          label, nm, di->name, sh, bits);
        else if (bits / 8 != (uint64_t)(t->end - t->begin))
            rc = moh_fail(err, MOH_E_FORMAT,
                          "%s: tensor '%s': data_offsets [%zu, %zu) hold %zu bytes but dtype %s "
                          "with shape %s needs %" PRIu64,
                          label, nm, t->begin, t->end, t->end - t->begin, di->name, sh, bits / 8);
        t->numel = (int64_t)numel;
    }
    free(p);
    if (rc != MOH_OK) return rc;
    if (start > st->data_size)
        return moh_fail(err, MOH_E_FORMAT,
                        "%s: the tensors end at byte %zu of the data buffer but the file holds "
                        "only %zu data bytes (file truncated?)",
                        label, start, st->data_size);
    if (start < st->data_size)
        return moh_fail(err, MOH_E_FORMAT,
                        "%s: %zu bytes after the last tensor (which ends at byte %zu of the data "
                        "buffer), expected the file to end there",
                        label, st->data_size - start, start);
    return MOH_OK;
}

int moh_st_parse(moh_safetensors *st, const uint8_t *buf, size_t len, const char *label,
                 moh_error *err) {
    if (!st) return moh_fail(err, MOH_E_ARG, "moh_st_parse: st is NULL");
    memset(st, 0, sizeof *st);
    if (!label) label = "<memory>";
    if (!buf && len > 0) return moh_fail(err, MOH_E_ARG, "%s: buffer is NULL", label);
    if (len < 8)
        return moh_fail(err, MOH_E_FORMAT,
                        "%s: file is %zu bytes, shorter than the 8-byte header length", label, len);

    uint64_t hlen = st_le64(buf);
    if (hlen > ST_MAX_HEADER)
        return moh_fail(err, MOH_E_FORMAT,
                        "%s: header length %" PRIu64
                        " exceeds the %llu-byte limit of the safetensors format",
                        label, hlen, ST_MAX_HEADER);
    if (hlen > len - 8)
        return moh_fail(err, MOH_E_FORMAT,
                        "%s: header length %" PRIu64
                        " is larger than the file (%zu bytes after the 8-byte length)",
                        label, hlen, len - 8);
    const uint8_t *hdr = buf + 8;
    size_t hn = (size_t)hlen;

    int is_control;
    size_t bad = st_check_text(hdr, hn, 0, &is_control);
    if (bad < hn)
        return moh_fail(err, MOH_E_FORMAT,
                        is_control ? "%s: header has control byte 0x%02x at byte %zu (not valid "
                                     "JSON)"
                                   : "%s: header is not valid UTF-8 (byte 0x%02x at byte %zu)",
                        label, hdr[bad], bad);

    const char *why = NULL;
    bad = st_check_strings(hdr, hn, &why);
    if (bad < hn)
        return moh_fail(err, MOH_E_FORMAT, "%s: header is not valid JSON: %s (byte %zu)", label, why, bad);

    if (hn >= 3 && memcmp(hdr, "\xef\xbb\xbf", 3) == 0) /* cJSON would skip it, serde does not */
        return moh_fail(err, MOH_E_FORMAT,
                        "%s: header is not valid JSON (it starts with a UTF-8 byte order mark)",
                        label);

    /* cJSON gets a NUL-terminated private copy: nothing past the header can ever be read. */
    char *text = malloc(hn + 1);
    if (!text) return moh_fail(err, MOH_E_NOMEM, "%s: out of memory for a %zu-byte header", label, hn);
    memcpy(text, hdr, hn);
    text[hn] = '\0';
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, hn, &end, 0);
    if (!root) {
        size_t at = end && end >= text && end <= text + hn ? (size_t)(end - text) : 0;
        free(text);
        return moh_fail(err, MOH_E_FORMAT, "%s: header is not valid JSON (error near byte %zu of %zu)",
                        label, at, hn);
    }
    for (const char *q = end; q && q < text + hn; q++)
        if (*q != ' ' && *q != '\t' && *q != '\n' && *q != '\r') {
            size_t at = (size_t)(q - text);
            free(text);
            cJSON_Delete(root);
            return moh_fail(err, MOH_E_FORMAT,
                            "%s: header is not valid JSON (unexpected text after the object at "
                            "byte %zu of %zu)",
                            label, at, hn);
        }
    st_scan sc = {0};
    int scanned = st_scan_json(text, hn, &sc);
    free(text);
    int rc = MOH_OK;
    char v[200];
    size_t tagged = 0;
    const cJSON *inf = NULL;
    if (!scanned) {
        rc = moh_fail(err, MOH_E_NOMEM, "%s: out of memory scanning the header", label);
        goto done;
    }
    if (sc.why) {
        rc = moh_fail(err, MOH_E_FORMAT, "%s: header at byte %zu: %s", label, sc.bad_at, sc.why);
        goto done;
    }
    inf = st_tag_numbers(root, &tagged);
    if (inf) {
        rc = moh_fail(err, MOH_E_FORMAT,
                      "%s: header is not valid JSON (number out of range: beyond a double)", label);
        goto done;
    }
    if (tagged != sc.n_num) { /* cannot happen when cJSON and the scan agree on the text */
        rc = moh_fail(err, MOH_E_FORMAT, "%s: header is not valid JSON (%zu numbers parsed, %zu "
                      "scanned)", label, tagged, sc.n_num);
        goto done;
    }
    if (!cJSON_IsObject(root)) {
        rc = moh_fail(err, MOH_E_FORMAT, "%s: header is not a JSON object (got %s)", label,
                      st_json_show(v, sizeof v, root));
        goto done;
    }

    st->path = st_strdup(label);
    if (!st->path) {
        rc = moh_fail(err, MOH_E_NOMEM, "%s: out of memory", label);
        goto done;
    }
    st->data = hdr + hn;
    st->data_size = len - 8 - hn;

    int count = 0, seen_meta = 0;
    for (const cJSON *e = root->child; e; e = e->next) {
        if (!e->string) {
            rc = moh_fail(err, MOH_E_FORMAT, "%s: header entry without a name", label);
            goto done;
        }
        if (strcmp(e->string, "__metadata__") == 0) {
            if (seen_meta++) {
                rc = moh_fail(err, MOH_E_FORMAT, "%s: __metadata__ appears twice in the header",
                              label);
                goto done;
            }
            if ((rc = st_parse_metadata(st, e, label, err)) != MOH_OK) goto done;
            continue;
        }
        if (count == INT_MAX) {
            rc = moh_fail(err, MOH_E_FORMAT, "%s: too many tensors", label);
            goto done;
        }
        count++;
    }

    if (count > 0) {
        st->tensors = calloc((size_t)count, sizeof *st->tensors);
        if (!st->tensors) {
            rc = moh_fail(err, MOH_E_NOMEM, "%s: out of memory for %d tensors", label, count);
            goto done;
        }
    }
    for (const cJSON *e = root->child; e; e = e->next) {
        if (strcmp(e->string, "__metadata__") == 0) continue;
        moh_st_tensor *t = &st->tensors[st->n_tensors];
        t->name = st_strdup(e->string);
        if (!t->name) {
            rc = moh_fail(err, MOH_E_NOMEM, "%s: out of memory", label);
            goto done;
        }
        st->n_tensors++; /* counted now so that close frees the name */
        if ((rc = st_parse_entry(t, e, &sc, label, err)) != MOH_OK) goto done;
    }
    if (count > 1) { /* a repeated name: the last entry wins, like the reference's HashMap */
        const char **names = malloc((size_t)count * sizeof *names);
        unsigned char *keep = malloc((size_t)count);
        int ok = names && keep;
        for (int i = 0; ok && i < count; i++) names[i] = st->tensors[i].name;
        ok = ok && st_last_wins(names, 1, count, keep);
        free(names);
        if (!ok) {
            free(keep);
            rc = moh_fail(err, MOH_E_NOMEM, "%s: out of memory checking %d tensors", label, count);
            goto done;
        }
        int w = 0;
        for (int i = 0; i < count; i++) {
            if (keep[i]) st->tensors[w++] = st->tensors[i];
            else free(st->tensors[i].name);
        }
        st->n_tensors = w;
        free(keep);
    }
    rc = st_validate(st, label, err);

done:
    free(sc.num);
    cJSON_Delete(root);
    if (rc != MOH_OK) moh_st_close(st);
    return rc;
}

static void st_errno_str(int e, char *buf, size_t cap) {
    if (strerror_r(e, buf, cap) != 0) snprintf(buf, cap, "errno %d", e);
}

int moh_st_open(moh_safetensors *st, const char *path, moh_error *err) {
    if (!st) return moh_fail(err, MOH_E_ARG, "moh_st_open: st is NULL");
    memset(st, 0, sizeof *st);
    if (!path) return moh_fail(err, MOH_E_ARG, "moh_st_open: path is NULL");
    char es[128];
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC); /* never block on a FIFO */
    if (fd < 0) {
        st_errno_str(errno, es, sizeof es);
        return moh_fail(err, MOH_E_IO, "%s: cannot open: %s", path, es);
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        st_errno_str(errno, es, sizeof es);
        close(fd);
        return moh_fail(err, MOH_E_IO, "%s: cannot stat: %s", path, es);
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return moh_fail(err, MOH_E_IO, "%s: not a regular file", path);
    }
    if (sb.st_size < 0 || (uint64_t)sb.st_size > (uint64_t)SIZE_MAX - 1) {
        close(fd);
        return moh_fail(err, MOH_E_IO, "%s: file too large to read", path);
    }
    size_t size = (size_t)sb.st_size;
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf) {
        close(fd);
        return moh_fail(err, MOH_E_NOMEM, "%s: out of memory reading %zu bytes", path, size);
    }
    size_t got = 0;
    while (got < size) {
        ssize_t k = read(fd, buf + got, size - got);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) {
            st_errno_str(errno, es, sizeof es);
            free(buf);
            close(fd);
            return moh_fail(err, MOH_E_IO, "%s: read failed after %zu of %zu bytes: %s", path, got,
                            size, es);
        }
        if (k == 0) {
            free(buf);
            close(fd);
            return moh_fail(err, MOH_E_IO, "%s: file shrank while reading (%zu of %zu bytes)", path,
                            got, size);
        }
        got += (size_t)k;
    }
    close(fd);
    int rc = moh_st_parse(st, buf, size, path, err);
    if (rc != MOH_OK) {
        free(buf);
        return rc;
    }
    st->file = buf;
    return MOH_OK;
}

const moh_st_tensor *moh_st_find(const moh_safetensors *st, const char *name) {
    if (!st || !name) return NULL;
    for (int i = 0; i < st->n_tensors; i++)
        if (strcmp(st->tensors[i].name, name) == 0) return &st->tensors[i];
    return NULL;
}

int moh_st_read_f32(const moh_safetensors *st, const char *name, int ndim, const int64_t *shape,
                    float *out, moh_error *err) {
    char nm[200], a[200], b[200];
    if (!st || !name) return moh_fail(err, MOH_E_ARG, "moh_st_read_f32: st or name is NULL");
    const char *label = st->path ? st->path : "<memory>";
    moh_st_quote(nm, sizeof nm, name);
    if (ndim < 0 || ndim > MOH_ST_MAX_DIMS || (ndim > 0 && !shape))
        return moh_fail(err, MOH_E_ARG, "%s: tensor '%s': bad expected shape (ndim %d)", label, nm,
                        ndim);
    const moh_st_tensor *t = moh_st_find(st, name);
    if (!t)
        return moh_fail(err, MOH_E_SHAPE, "%s: missing tensor '%s' (expected shape %s)", label, nm,
                        st_shape_str(b, sizeof b, ndim, shape));
    int same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = t->shape[i] == shape[i];
    if (!same)
        return moh_fail(err, MOH_E_SHAPE, "%s: tensor '%s': shape %s in the file, expected %s",
                        label, nm, st_shape_str(a, sizeof a, t->ndim, t->shape),
                        st_shape_str(b, sizeof b, ndim, shape));
    size_t isz;
    switch (t->dtype) {
    case MOH_DT_F32: isz = 4; break;
    case MOH_DT_F64: isz = 8; break;
    case MOH_DT_BF16:
    case MOH_DT_F16: isz = 2; break;
    default:
        return moh_fail(err, MOH_E_SHAPE,
                        "%s: tensor '%s': dtype %s cannot be read as float32 (readable: F32, F64, "
                        "BF16, F16)",
                        label, nm, t->dtype_name);
    }
    /* Parse guaranteed end - begin == numel * isz and end <= data_size; re-check defensively in
     * case the caller edited the struct. */
    if ((uint64_t)t->numel > SIZE_MAX / isz || t->end < t->begin || t->end > st->data_size ||
        t->end - t->begin != (size_t)t->numel * isz)
        return moh_fail(err, MOH_E_FORMAT, "%s: tensor '%s': inconsistent offsets", label, nm);
    if (t->numel > 0 && !out)
        return moh_fail(err, MOH_E_ARG, "%s: tensor '%s': output buffer is NULL", label, nm);
    const uint8_t *p = st->data + t->begin;
    size_t n = (size_t)t->numel;
    switch (t->dtype) {
    case MOH_DT_F32:
        for (size_t i = 0; i < n; i++) out[i] = st_bits_f32(st_le32(p + 4 * i));
        break;
    case MOH_DT_F64:
        for (size_t i = 0; i < n; i++) {
            uint64_t u = st_le64(p + 8 * i);
            double d;
            memcpy(&d, &u, sizeof d);
            out[i] = (float)d; /* IEEE rounding; out-of-range values become +-inf */
        }
        break;
    case MOH_DT_BF16:
        for (size_t i = 0; i < n; i++) out[i] = st_bf16_to_f32(st_le16(p + 2 * i));
        break;
    case MOH_DT_F16:
        for (size_t i = 0; i < n; i++) out[i] = st_f16_to_f32(st_le16(p + 2 * i));
        break;
    default: break;
    }
    return MOH_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Writing
 * ------------------------------------------------------------------------------------------- */

typedef struct st_buf {
    char *p;
    size_t n, cap;
    int oom;
} st_buf;

static void sb_put(st_buf *b, const char *s, size_t k) {
    if (b->oom) return;
    if (b->n + k + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + k + 1) {
            if (cap > SIZE_MAX / 2) {
                b->oom = 1;
                return;
            }
            cap *= 2;
        }
        char *q = realloc(b->p, cap);
        if (!q) {
            b->oom = 1;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, k);
    b->n += k;
    b->p[b->n] = '\0';
}
static void sb_str(st_buf *b, const char *s) { sb_put(b, s, strlen(s)); }

/* JSON string literal: quote, backslash and control characters escaped, UTF-8 kept as is. */
static void sb_json_string(st_buf *b, const char *s) {
    static const char hex[] = "0123456789abcdef";
    sb_put(b, "\"", 1);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        char e[7];
        if (c == '"') sb_put(b, "\\\"", 2);
        else if (c == '\\') sb_put(b, "\\\\", 2);
        else if (c == '\n') sb_put(b, "\\n", 2);
        else if (c == '\t') sb_put(b, "\\t", 2);
        else if (c == '\r') sb_put(b, "\\r", 2);
        else if (c < 0x20) {
            memcpy(e, "\\u00", 4);
            e[4] = hex[c >> 4];
            e[5] = hex[c & 15];
            sb_put(b, e, 6);
        } else sb_put(b, (const char *)&c, 1);
    }
    sb_put(b, "\"", 1);
}

/* Sorts n strings and returns the first one that is repeated, or NULL; *oom set on failure. */
static const char *st_first_dup(const char *const *s, int n, size_t stride, int *oom) {
    *oom = 0;
    if (n < 2) return NULL;
    const char **v = malloc((size_t)n * sizeof *v);
    if (!v) {
        *oom = 1;
        return NULL;
    }
    for (int i = 0; i < n; i++) v[i] = s[(size_t)i * stride];
    qsort(v, (size_t)n, sizeof *v, st_cmp_str);
    const char *dup = NULL;
    for (int i = 1; i < n && !dup; i++)
        if (strcmp(v[i - 1], v[i]) == 0) dup = v[i];
    free(v);
    return dup;
}

/* Checks the metadata pairs and appends "__metadata__":{...} to the header. */
static int st_build_meta(const char *path, const char *const *meta, int n_meta, st_buf *hb,
                         moh_error *err) {
    char k[200];
    for (int i = 0; i < 2 * n_meta; i++) {
        const char *what = i % 2 ? "value" : "key";
        if (!meta[i])
            return moh_fail(err, MOH_E_ARG, "%s: metadata entry %d: %s is NULL", path, i / 2, what);
        int ctl;
        size_t len = strlen(meta[i]);
        if (st_check_text((const uint8_t *)meta[i], len, 1, &ctl) != len)
            return moh_fail(err, MOH_E_ARG, "%s: metadata entry %d ('%s'): %s is not valid UTF-8",
                            path, i / 2, moh_st_quote(k, sizeof k, meta[i - i % 2]), what);
    }
    int oom;
    const char *dup = st_first_dup(meta, n_meta, 2, &oom);
    if (oom) return moh_fail(err, MOH_E_NOMEM, "%s: out of memory", path);
    if (dup)
        return moh_fail(err, MOH_E_ARG, "%s: metadata key '%s' given twice", path,
                        moh_st_quote(k, sizeof k, dup));
    sb_str(hb, "\"__metadata__\":{");
    for (int i = 0; i < n_meta; i++) {
        if (i) sb_str(hb, ",");
        sb_json_string(hb, meta[2 * i]);
        sb_str(hb, ":");
        sb_json_string(hb, meta[2 * i + 1]);
    }
    sb_str(hb, "}");
    return MOH_OK;
}

/* Checks entries and metadata and builds the padded header (metadata first, like the reference);
 * *total = bytes of the data buffer. */
static int st_build_header(const char *path, const moh_st_entry *entries, int n,
                           const char *const *meta, int n_meta, st_buf *hb, uint64_t *total,
                           moh_error *err) {
    char nm[200], sh[200];
    uint64_t off = 0;
    sb_str(hb, "{");
    if (n_meta > 0) {
        int rc = st_build_meta(path, meta, n_meta, hb, err);
        if (rc != MOH_OK) return rc;
    }
    for (int i = 0; i < n; i++) {
        const moh_st_entry *e = &entries[i];
        if (!e->name)
            return moh_fail(err, MOH_E_ARG, "%s: entry %d: name is NULL", path, i);
        moh_st_quote(nm, sizeof nm, e->name);
        int ctl;
        size_t nl = strlen(e->name);
        if (st_check_text((const uint8_t *)e->name, nl, 1, &ctl) != nl)
            return moh_fail(err, MOH_E_ARG, "%s: tensor '%s': name is not valid UTF-8", path, nm);
        if (strcmp(e->name, "__metadata__") == 0)
            return moh_fail(err, MOH_E_ARG, "%s: '__metadata__' is reserved, not a tensor name",
                            path);
        if (e->ndim < 0 || e->ndim > MOH_ST_MAX_DIMS)
            return moh_fail(err, MOH_E_ARG, "%s: tensor '%s': ndim %d, expected 0..%d", path, nm,
                            e->ndim, MOH_ST_MAX_DIMS);
        uint64_t numel = 1;
        for (int d = 0; d < e->ndim; d++)
            if (e->shape[d] < 0 || (double)e->shape[d] > ST_MAX_JSON_INT)
                return moh_fail(err, MOH_E_ARG, "%s: tensor '%s': shape %s: dim %d is out of range",
                                path, nm, st_shape_str(sh, sizeof sh, e->ndim, e->shape), d);
        for (int d = 0; d < e->ndim; d++)
            if (e->shape[d] == 0) numel = 0;
        for (int d = 0; d < e->ndim && numel; d++)
            if (__builtin_mul_overflow(numel, (uint64_t)e->shape[d], &numel))
                numel = UINT64_MAX;
        uint64_t bytes;
        if (numel > (uint64_t)INT64_MAX || __builtin_mul_overflow(numel, (uint64_t)4, &bytes) ||
            __builtin_add_overflow(off, bytes, &bytes) || (double)bytes > ST_MAX_JSON_INT ||
            bytes > (uint64_t)SIZE_MAX)
            return moh_fail(err, MOH_E_ARG, "%s: tensor '%s': shape %s is too large", path, nm,
                            st_shape_str(sh, sizeof sh, e->ndim, e->shape));
        if (numel > 0 && !e->data)
            return moh_fail(err, MOH_E_ARG,
                            "%s: tensor '%s': data is NULL but shape %s has %" PRIu64 " elements",
                            path, nm, st_shape_str(sh, sizeof sh, e->ndim, e->shape), numel);
        char num[96];
        if (i || n_meta > 0) sb_str(hb, ",");
        sb_json_string(hb, e->name);
        sb_str(hb, ":{\"dtype\":\"F32\",\"shape\":[");
        for (int d = 0; d < e->ndim; d++) {
            snprintf(num, sizeof num, "%s%" PRId64, d ? "," : "", e->shape[d]);
            sb_str(hb, num);
        }
        snprintf(num, sizeof num, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", off, bytes);
        sb_str(hb, num);
        off = bytes;
    }
    sb_str(hb, "}");
    while (!hb->oom && hb->n % 8 != 0) sb_str(hb, " ");
    if (hb->oom) return moh_fail(err, MOH_E_NOMEM, "%s: out of memory building the header", path);
    if (hb->n > ST_MAX_HEADER)
        return moh_fail(err, MOH_E_ARG,
                        "%s: header would be %zu bytes, over the %llu-byte limit of the "
                        "safetensors format",
                        path, hb->n, ST_MAX_HEADER);

    if (n > 1) { /* duplicate names */
        const char **names = malloc((size_t)n * sizeof *names);
        if (!names) return moh_fail(err, MOH_E_NOMEM, "%s: out of memory", path);
        for (int i = 0; i < n; i++) names[i] = entries[i].name;
        int oom;
        const char *dup = st_first_dup(names, n, 1, &oom);
        if (dup) moh_st_quote(nm, sizeof nm, dup);
        free(names);
        if (oom) return moh_fail(err, MOH_E_NOMEM, "%s: out of memory", path);
        if (dup) return moh_fail(err, MOH_E_ARG, "%s: tensor '%s' given twice", path, nm);
    }
    *total = off;
    return MOH_OK;
}

static int st_write_all(FILE *f, const void *p, size_t n) { return fwrite(p, 1, n, f) == n; }

/* Writes the float data little-endian, whatever the host byte order. */
static int st_write_f32(FILE *f, const float *x, size_t n) {
    uint8_t chunk[4096];
    while (n > 0) {
        size_t k = n < sizeof chunk / 4 ? n : sizeof chunk / 4;
        for (size_t i = 0; i < k; i++) {
            uint32_t u;
            memcpy(&u, &x[i], 4);
            chunk[4 * i] = (uint8_t)u;
            chunk[4 * i + 1] = (uint8_t)(u >> 8);
            chunk[4 * i + 2] = (uint8_t)(u >> 16);
            chunk[4 * i + 3] = (uint8_t)(u >> 24);
        }
        if (!st_write_all(f, chunk, 4 * k)) return 0;
        x += k;
        n -= k;
    }
    return 1;
}

/* fsync of the directory holding path, so that the rename itself is durable. Returns 0 on
 * success, else the errno (ENOMEM when the directory name cannot be built). */
static int st_sync_dir(const char *path) {
    const char *slash = strrchr(path, '/');
    char *dir;
    if (!slash) {
        dir = st_strdup(".");
    } else {
        size_t k = slash == path ? 1 : (size_t)(slash - path);
        dir = malloc(k + 1);
        if (dir) {
            memcpy(dir, path, k);
            dir[k] = '\0';
        }
    }
    if (!dir) return ENOMEM;
    int fd = open(dir, O_RDONLY | O_CLOEXEC);
    free(dir);
    if (fd < 0) return errno;
    int e = fsync(fd) == 0 ? 0 : errno;
    close(fd);
    return e;
}

/* errno values meaning "this filesystem cannot fsync a directory": nothing more can be done, the
 * data itself is already synced. */
static int st_dir_sync_unsupported(int e) {
    if (e == EINVAL) return 1;
#ifdef ENOTSUP
    if (e == ENOTSUP) return 1;
#endif
#ifdef EOPNOTSUPP
    if (e == EOPNOTSUPP) return 1;
#endif
    return 0;
}

int moh_st_write(const char *path, const moh_st_entry *entries, int n, moh_error *err) {
    return moh_st_write_meta(path, entries, n, NULL, 0, err);
}

int moh_st_write_meta(const char *path, const moh_st_entry *entries, int n,
                      const char *const *meta, int n_meta, moh_error *err) {
    if (!path || !*path) return moh_fail(err, MOH_E_ARG, "moh_st_write: path is NULL or empty");
    if (n < 0 || (n > 0 && !entries))
        return moh_fail(err, MOH_E_ARG, "%s: bad entry list (n = %d, entries %s)", path, n,
                        entries ? "given" : "NULL");
    if (n_meta < 0 || n_meta > INT_MAX / 2 || (n_meta > 0 && !meta))
        return moh_fail(err, MOH_E_ARG, "%s: bad metadata list (n_meta = %d, meta %s)", path,
                        n_meta, meta ? "given" : "NULL");
    st_buf hb = {0};
    uint64_t total = 0;
    int rc = st_build_header(path, entries, n, meta, n_meta, &hb, &total, err);
    if (rc != MOH_OK) {
        free(hb.p);
        return rc;
    }

    char es[128];
    size_t tl = strlen(path) + 32;
    char *tmp = malloc(tl);
    if (!tmp) {
        free(hb.p);
        return moh_fail(err, MOH_E_NOMEM, "%s: out of memory", path);
    }
    snprintf(tmp, tl, "%s.tmp.%ld", path, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && errno == EEXIST) { /* left over by a crashed process that had our pid */
        unlink(tmp);
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    }
    if (fd < 0) {
        st_errno_str(errno, es, sizeof es);
        rc = moh_fail(err, MOH_E_IO, "%s: cannot create temporary file %s: %s", path, tmp, es);
        free(tmp);
        free(hb.p);
        return rc;
    }
    FILE *f = fdopen(fd, "wb");
    if (!f) {
        st_errno_str(errno, es, sizeof es);
        close(fd);
        rc = moh_fail(err, MOH_E_IO, "%s: cannot write %s: %s", path, tmp, es);
        goto fail;
    }

    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)hb.n >> (8 * i));
    int ok = st_write_all(f, len8, 8) && st_write_all(f, hb.p, hb.n);
    for (int i = 0; ok && i < n; i++) {
        size_t numel = 1;
        for (int d = 0; d < entries[i].ndim; d++) numel *= (size_t)entries[i].shape[d];
        ok = st_write_f32(f, entries[i].data, numel);
    }
    if (!ok || fflush(f) != 0 || fsync(fileno(f)) != 0) {
        st_errno_str(errno, es, sizeof es);
        fclose(f);
        rc = moh_fail(err, MOH_E_IO, "%s: writing %s failed: %s", path, tmp, es);
        goto fail;
    }
    if (fclose(f) != 0) {
        st_errno_str(errno, es, sizeof es);
        rc = moh_fail(err, MOH_E_IO, "%s: closing %s failed: %s", path, tmp, es);
        goto fail;
    }
    if (rename(tmp, path) != 0) {
        st_errno_str(errno, es, sizeof es);
        rc = moh_fail(err, MOH_E_IO, "%s: cannot rename %s over it: %s", path, tmp, es);
        goto fail;
    }
    free(tmp);
    free(hb.p);
    /* From here on the new file is in place and its bytes are durable; only the rename's own
     * durability is at stake. */
    int e = st_sync_dir(path);
    if (e == 0 || st_dir_sync_unsupported(e)) return MOH_OK;
    st_errno_str(e, es, sizeof es);
    return moh_fail(err, MOH_E_IO,
                    "%s: the new file is in place (%" PRIu64 " data bytes, synced), but syncing "
                    "its directory failed (%s), so the rename may not survive a crash",
                    path, total, es);

fail:
    unlink(tmp);
    free(tmp);
    free(hb.p);
    return rc;
}

int moh_st_meta_number(const moh_safetensors *st, const char *key, double lo, double hi, bool integer,
                       double *out, moh_error *err) {
    const char *s = moh_st_meta(st, key);
    char *end = NULL;
    /* a decimal number as moh writes it ("%ld", "%.17g"): no hex, no sign but '-', no spaces */
    const bool decimal = s && (s[0] == '-' || (s[0] >= '0' && s[0] <= '9')) && !strpbrk(s, "xXpP \t");
    errno = 0;
    const double v = decimal ? strtod(s, &end) : NAN;
    /* ERANGE: past a double's range, or so small that it reads as 0 or a subnormal ("1e-400") */
    if (!s || !decimal || end == s || *end || errno == ERANGE || !isfinite(v) || v < lo || v > hi ||
        (integer && v != floor(v)))
        return moh_fail(err, MOH_E_FORMAT, "%s: __metadata__ field '%s' is %s, expected %s in [%.17g, %.17g]",
                        st->path ? st->path : "<memory>", key, s ? s : "missing",
                        integer ? "an integer" : "a finite number", lo, hi);
    *out = v;
    return MOH_OK;
}
