/* GGUF reader: parsing and validation (format and rules in io/gguf.h), typed getters, and
 * dequantisation to float32 (block layouts: ggml-common.h; arithmetic as ggml-quants.c and
 * gguf-py's gguf/quants.py, in float32, no fused multiply-add, so results are bit-exact). */
#include "io/gguf.h"

#include "ops/quant.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF /* gcc -std=c11 does not contract; clang would by default */
#endif

#define GGUF_MAX_STR (1ull << 30)  /* GGUF_MAX_STRING_LENGTH in gguf.cpp */
#define GGUF_MAX_ARR (1ull << 30)  /* GGUF_MAX_ARRAY_ELEMENTS */
#define GGUF_MAX_NAME 64           /* GGML_MAX_NAME: names must be shorter */
#define GGUF_MIN_KV_BYTES 14       /* u64 len + 1 byte key + i32 type + 1 byte value */
#define GGUF_MIN_TI_BYTES 24       /* u64 len + u32 n_dims + i32 type + u64 offset */

typedef struct gg_str { const char *s; size_t len; } gg_str;

typedef struct gg_kv {
    uint64_t key;          /* index into strs */
    int type;              /* value type; MOH_GGUF_ARRAY for arrays */
    int arr_type;          /* element type of an array */
    uint64_t n;            /* array length (1 for scalars) */
    const uint8_t *raw;    /* numeric scalar / array bytes in the buffer */
    uint64_t str0;         /* first string value in strs (string scalars and arrays) */
} gg_kv;

struct moh_gguf {
    const uint8_t *buf;
    size_t len;
    void *map;
    size_t map_len;
    char label[512];
    uint32_t version, alignment;
    uint64_t data_off;
    int64_t n_kv, n_tensors;
    gg_kv *kv;
    gg_str *strs;
    uint64_t n_strs, cap_strs;
    char *arena;
    moh_gguf_tensor *t;
    char (*names)[GGUF_MAX_NAME];
    int64_t *kv_sorted, *t_sorted; /* indices sorted by key / name */
};

/* ---- type tables (ggml.c type_traits; block size 0: removed type) ---------------------------- */
static const struct { const char *name; int64_t blck; size_t size; } GG_TYPES[MOH_GGML_TYPE_COUNT] = {
    {"f32", 1, 4},         {"f16", 1, 2},        {"q4_0", 32, 18},      {"q4_1", 32, 20},
    {"q4_2 (removed)", 0, 0}, {"q4_3 (removed)", 0, 0}, {"q5_0", 32, 22}, {"q5_1", 32, 24},
    {"q8_0", 32, 34},      {"q8_1", 32, 40},     {"q2_K", 256, 84},     {"q3_K", 256, 110},
    {"q4_K", 256, 144},    {"q5_K", 256, 176},   {"q6_K", 256, 210},    {"q8_K", 256, 292},
    {"iq2_xxs", 256, 66},  {"iq2_xs", 256, 74},  {"iq3_xxs", 256, 98},  {"iq1_s", 256, 50},
    {"iq4_nl", 32, 18},    {"iq3_s", 256, 110},  {"iq2_s", 256, 82},    {"iq4_xs", 256, 136},
    {"i8", 1, 1},          {"i16", 1, 2},        {"i32", 1, 4},         {"i64", 1, 8},
    {"f64", 1, 8},         {"iq1_m", 256, 56},   {"bf16", 1, 2},        {"q4_0_4_4 (removed)", 0, 0},
    {"q4_0_4_8 (removed)", 0, 0}, {"q4_0_8_8 (removed)", 0, 0}, {"tq1_0", 256, 54},
    {"tq2_0", 256, 66},    {"iq4_nl_4_4 (removed)", 0, 0}, {"iq4_nl_4_8 (removed)", 0, 0},
    {"iq4_nl_8_8 (removed)", 0, 0}, {"mxfp4", 32, 17}, {"nvfp4", 64, 36}, {"q1_0", 128, 18},
};

static const char *const GG_VTYPE_NAME[MOH_GGUF_TYPE_COUNT] = {
    "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "str", "arr", "u64", "i64", "f64"};
static const size_t GG_VTYPE_SIZE[MOH_GGUF_TYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

const char *moh_gguf_ggml_type_name(int type) {
    return type >= 0 && type < MOH_GGML_TYPE_COUNT ? GG_TYPES[type].name : "?";
}
int64_t moh_gguf_block_size(int type) {
    return type >= 0 && type < MOH_GGML_TYPE_COUNT ? GG_TYPES[type].blck : 0;
}
size_t moh_gguf_type_size(int type) {
    return type >= 0 && type < MOH_GGML_TYPE_COUNT ? GG_TYPES[type].size : 0;
}
const char *moh_gguf_type_str(moh_gguf_type t) {
    return (int)t >= 0 && t < MOH_GGUF_TYPE_COUNT ? GG_VTYPE_NAME[t] : "?";
}

/* ---- errors ------------------------------------------------------------------------------- */

/* A name quoted for a one-line message: printable ASCII kept, other bytes as \xNN, cut at 80. */
static const char *esc(char out[400], const char *s, size_t n) {
    size_t o = 0;
    for (size_t i = 0; i < n && o < 390; i++) {
        unsigned char c = (unsigned char)s[i];
        if (i >= 80) { memcpy(out + o, "...", 3); o += 3; break; }
        if (c >= 0x20 && c < 0x7f && c != '\\') out[o++] = (char)c;
        else o += (size_t)snprintf(out + o, 400 - o, "\\x%02x", c);
    }
    out[o] = '\0';
    return out;
}

#if defined(__GNUC__)
__attribute__((format(printf, 4, 5)))
#endif
static int gfail(moh_error *err, const char *label, int code, const char *fmt, ...) {
    char msg[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return moh_fail(err, code, "%s: %s", label, msg);
}

/* ---- little-endian reads ------------------------------------------------------------------ */
static uint16_t le16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static uint64_t le64(const uint8_t *p) { return (uint64_t)le32(p) | ((uint64_t)le32(p + 4) << 32); }
static float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

typedef struct rd { const uint8_t *p; size_t len, pos; } rd;
static size_t rem(const rd *r) { return r->len - r->pos; }

/* ---- parsing ------------------------------------------------------------------------------ */

static int push_str(moh_gguf *g, const uint8_t *s, size_t n) {
    if (g->n_strs == g->cap_strs) {
        uint64_t cap = g->cap_strs ? 2 * g->cap_strs : 64;
        gg_str *ns = realloc(g->strs, cap * sizeof *ns);
        if (!ns) return -1;
        g->strs = ns;
        g->cap_strs = cap;
    }
    g->strs[g->n_strs].s = (const char *)s;
    g->strs[g->n_strs++].len = n;
    return 0;
}

/* Reads a string (u64 length + bytes) into strs; what names the field in messages. */
static int rd_str(moh_gguf *g, rd *r, const char *what, moh_error *err) {
    if (rem(r) < 8)
        return gfail(err, g->label, MOH_E_FORMAT, "%s: length truncated at byte %zu (expected 8 bytes, file has %zu)", what, r->pos, rem(r));
    uint64_t n = le64(r->p + r->pos);
    r->pos += 8;
    if (n > GGUF_MAX_STR)
        return gfail(err, g->label, MOH_E_FORMAT, "%s: string length %" PRIu64 " exceeds the maximum 2^30", what, n);
    if (n > rem(r))
        return gfail(err, g->label, MOH_E_FORMAT, "%s: string of %" PRIu64 " bytes at byte %zu runs past the end of the file (%zu bytes left)", what, n, r->pos, rem(r));
    if (push_str(g, r->p + r->pos, (size_t)n)) return moh_fail(err, MOH_E_NOMEM, "%s: out of memory", g->label);
    r->pos += (size_t)n;
    return MOH_OK;
}

static int rd_fixed(moh_gguf *g, rd *r, size_t n, const char *what, const uint8_t **out, moh_error *err) {
    if (rem(r) < n)
        return gfail(err, g->label, MOH_E_FORMAT, "%s: truncated at byte %zu (expected %zu bytes, file has %zu)", what, r->pos, n, rem(r));
    *out = r->p + r->pos;
    r->pos += n;
    return MOH_OK;
}

typedef struct sort_item { const char *s; size_t n; int64_t i; } sort_item;
static int cmp_item(const void *a, const void *b) {
    const sort_item *x = a, *y = b;
    size_t m = x->n < y->n ? x->n : y->n;
    int c = memcmp(x->s, y->s, m);
    if (c) return c;
    if (x->n != y->n) return x->n < y->n ? -1 : 1;
    return x->i < y->i ? -1 : x->i > y->i;
}

/* Sorts n (s, len) items; *sorted gets their indices in order; returns the index of the later
 * of the first equal pair (by file order of the second), or -1; -2 on allocation failure. */
static int64_t sort_names(sort_item *it, int64_t n, int64_t **sorted, int64_t *dup_first) {
    if (n > 0) qsort(it, (size_t)n, sizeof *it, cmp_item);
    *sorted = malloc((size_t)(n ? n : 1) * sizeof **sorted);
    if (!*sorted) return -2;
    int64_t dup = -1;
    for (int64_t k = 0; k < n; k++) {
        (*sorted)[k] = it[k].i;
        if (k > 0 && it[k].n == it[k - 1].n && memcmp(it[k].s, it[k - 1].s, it[k].n) == 0 &&
            (dup < 0 || it[k].i < dup)) {
            dup = it[k].i;
            *dup_first = it[k - 1].i;
        }
    }
    return dup;
}

static void gg_free(moh_gguf *g) {
    if (!g) return;
    free(g->kv);
    free(g->strs);
    free(g->arena);
    free(g->t);
    free(g->names);
    free(g->kv_sorted);
    free(g->t_sorted);
    if (g->map) munmap(g->map, g->map_len);
    free(g);
}

void moh_gguf_close(moh_gguf *g) { gg_free(g); }

static int parse_kv(moh_gguf *g, rd *r, moh_error *err) {
    char what[128], nm[400];
    for (int64_t i = 0; i < g->n_kv; i++) {
        gg_kv *kv = &g->kv[i];
        snprintf(what, sizeof what, "key %" PRId64, i);
        int rc = rd_str(g, r, what, err);
        if (rc) return rc;
        kv->key = g->n_strs - 1;
        const gg_str *k = &g->strs[kv->key];
        if (k->len == 0) return gfail(err, g->label, MOH_E_FORMAT, "key %" PRId64 " is empty (expected a name)", i);
        esc(nm, k->s, k->len);
        const uint8_t *p = NULL;
        snprintf(what, sizeof what, "key '%.40s' type", nm);
        if ((rc = rd_fixed(g, r, 4, what, &p, err))) return rc;
        int32_t ty = (int32_t)le32(p);
        kv->n = 1;
        kv->arr_type = -1;
        if (ty == MOH_GGUF_ARRAY) {
            snprintf(what, sizeof what, "key '%.40s' array type", nm);
            if ((rc = rd_fixed(g, r, 4, what, &p, err))) return rc;
            kv->arr_type = (int32_t)le32(p);
            snprintf(what, sizeof what, "key '%.40s' array length", nm);
            if ((rc = rd_fixed(g, r, 8, what, &p, err))) return rc;
            kv->n = le64(p);
        }
        kv->type = ty;
        int et = ty == MOH_GGUF_ARRAY ? kv->arr_type : ty;
        if (et < 0 || et >= MOH_GGUF_TYPE_COUNT || et == MOH_GGUF_ARRAY)
            return gfail(err, g->label, MOH_E_FORMAT, "key '%s' has value type %d%s (expected 0..12 except 9 inside an array)",
                         nm, et, ty == MOH_GGUF_ARRAY ? " in an array" : "");
        if (ty == MOH_GGUF_ARRAY && kv->n > GGUF_MAX_ARR)
            return gfail(err, g->label, MOH_E_FORMAT, "key '%s': array length %" PRIu64 " exceeds the maximum 2^30", nm, kv->n);
        if (et == MOH_GGUF_STRING) {
            if (ty == MOH_GGUF_ARRAY && kv->n * 8 > rem(r))
                return gfail(err, g->label, MOH_E_FORMAT, "key '%s': %" PRIu64 " strings cannot fit in the %zu bytes left", nm, kv->n, rem(r));
            kv->str0 = g->n_strs;
            for (uint64_t j = 0; j < kv->n; j++) {
                snprintf(what, sizeof what, "key '%.40s' string %" PRIu64, nm, j);
                if ((rc = rd_str(g, r, what, err))) return rc;
            }
        } else {
            uint64_t bytes = kv->n * GG_VTYPE_SIZE[et]; /* n <= 2^30: no overflow */
            if (bytes > rem(r))
                return gfail(err, g->label, MOH_E_FORMAT, "key '%s': value of %" PRIu64 " bytes at byte %zu runs past the end of the file (%zu bytes left)", nm, bytes, r->pos, rem(r));
            kv->raw = r->p + r->pos;
            r->pos += (size_t)bytes;
        }
    }
    return MOH_OK;
}

static int parse_tensors(moh_gguf *g, rd *r, moh_error *err) {
    char what[128], nm[400];
    for (int64_t i = 0; i < g->n_tensors; i++) {
        moh_gguf_tensor *t = &g->t[i];
        snprintf(what, sizeof what, "tensor %" PRId64 " name", i);
        int rc = rd_str(g, r, what, err);
        if (rc) return rc;
        const gg_str *s = &g->strs[--g->n_strs]; /* names are copied below, not kept in strs */
        if (s->len >= GGUF_MAX_NAME)
            return gfail(err, g->label, MOH_E_FORMAT, "tensor %" PRId64 " name '%s' is %zu bytes (expected < %d)", i, esc(nm, s->s, s->len), s->len, GGUF_MAX_NAME);
        size_t nl = strnlen(s->s, s->len); /* ggml keeps the name up to its first NUL */
        memcpy(g->names[i], s->s, nl);
        g->names[i][nl] = '\0';
        t->name = g->names[i];
        esc(nm, t->name, nl);
        const uint8_t *p = NULL;
        snprintf(what, sizeof what, "tensor '%.40s' n_dims", nm);
        if ((rc = rd_fixed(g, r, 4, what, &p, err))) return rc;
        uint32_t nd = le32(p);
        if (nd > MOH_GGUF_MAX_DIMS)
            return gfail(err, g->label, MOH_E_FORMAT, "tensor '%s' has n_dims %" PRIu32 " (expected <= 4)", nm, nd);
        t->n_dims = (int)nd;
        for (int j = 0; j < MOH_GGUF_MAX_DIMS; j++) {
            t->ne[j] = 1;
            if ((uint32_t)j >= nd) continue;
            snprintf(what, sizeof what, "tensor '%.40s' ne[%d]", nm, j);
            if ((rc = rd_fixed(g, r, 8, what, &p, err))) return rc;
            t->ne[j] = (int64_t)le64(p);
            if (t->ne[j] < 0)
                return gfail(err, g->label, MOH_E_FORMAT, "tensor '%s' ne[%d] = %" PRId64 " (expected >= 0)", nm, j, t->ne[j]);
        }
        const int64_t *ne = t->ne;
        if (ne[0] > 0 && ne[1] > 0 && ne[2] > 0 && ne[3] > 0) {
            /* gguf.cpp's test, evaluated without overflow */
            if (INT64_MAX / ne[1] <= ne[0] || INT64_MAX / ne[2] <= ne[0] * ne[1] ||
                INT64_MAX / ne[3] <= ne[0] * ne[1] * ne[2])
                return gfail(err, g->label, MOH_E_FORMAT, "tensor '%s' shape (%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 ") has too many elements (expected < 2^63)",
                             nm, ne[0], ne[1], ne[2], ne[3]);
            t->numel = ne[0] * ne[1] * ne[2] * ne[3];
        } else {
            t->numel = 0;
        }
        snprintf(what, sizeof what, "tensor '%.40s' type", nm);
        if ((rc = rd_fixed(g, r, 4, what, &p, err))) return rc;
        int32_t ty = (int32_t)le32(p);
        if (ty < 0 || ty >= MOH_GGML_TYPE_COUNT)
            return gfail(err, g->label, MOH_E_FORMAT, "tensor '%s' has ggml type %" PRId32 " (expected 0..%d)", nm, ty, MOH_GGML_TYPE_COUNT - 1);
        t->type = ty;
        int64_t blck = GG_TYPES[ty].blck;
        if (blck == 0) /* as gguf.cpp: a removed type is refused */
            return gfail(err, g->label, MOH_E_FORMAT, "tensor '%s' has type %s, which ggml no longer has (expected a "
                         "current ggml type)", nm, GG_TYPES[ty].name);
        if (ne[0] % blck != 0)
            return gfail(err, g->label, MOH_E_FORMAT, "tensor '%s' of type %s has ne[0] = %" PRId64 " (expected a multiple of the block size %" PRId64 ")",
                         nm, GG_TYPES[ty].name, ne[0], blck);
        uint64_t nblk = (uint64_t)(t->numel / blck);
        if (nblk > SIZE_MAX / GG_TYPES[ty].size)
            return gfail(err, g->label, MOH_E_FORMAT, "tensor '%s' has a byte size past SIZE_MAX", nm);
        t->nbytes = nblk * GG_TYPES[ty].size;
        snprintf(what, sizeof what, "tensor '%.40s' offset", nm);
        if ((rc = rd_fixed(g, r, 8, what, &p, err))) return rc;
        t->offset = le64(p);
    }
    return MOH_OK;
}

int moh_gguf_parse(moh_gguf **out, const uint8_t *buf, size_t len, const char *label, moh_error *err) {
    if (!out) return moh_fail(err, MOH_E_ARG, "moh_gguf_parse: out is NULL");
    *out = NULL;
    if (!label) label = "<gguf>";
    if (!buf && len) return moh_fail(err, MOH_E_ARG, "%s: buffer is NULL", label);
    moh_gguf *g = calloc(1, sizeof *g);
    if (!g) return moh_fail(err, MOH_E_NOMEM, "%s: out of memory", label);
    snprintf(g->label, sizeof g->label, "%s", label);
    g->buf = buf;
    g->len = len;
    rd r = {buf, len, 0};
    const uint8_t *p = NULL;
    int rc;
    char nm[400];
    if ((rc = rd_fixed(g, &r, 4, "magic", &p, err))) goto fail;
    if (memcmp(p, "GGUF", 4) != 0) {
        rc = gfail(err, g->label, MOH_E_FORMAT, "magic is '%s' (expected 'GGUF')", esc(nm, (const char *)p, 4));
        goto fail;
    }
    if ((rc = rd_fixed(g, &r, 4, "version", &p, err))) goto fail;
    g->version = le32(p);
    if (g->version == 0 || (g->version & 0xFFFF) == 0 || g->version == 1 || g->version > 3) {
        rc = gfail(err, g->label, MOH_E_FORMAT, "version %" PRIu32 " (expected 2 or 3%s)", g->version,
                   g->version && (g->version & 0xFFFF) == 0 ? "; a big-endian file?" : "");
        goto fail;
    }
    if ((rc = rd_fixed(g, &r, 8, "tensor count", &p, err))) goto fail;
    int64_t nt = (int64_t)le64(p);
    if ((rc = rd_fixed(g, &r, 8, "metadata key count", &p, err))) goto fail;
    int64_t nk = (int64_t)le64(p);
    /* each record needs a minimum number of bytes: bound the counts before allocating */
    if (nt < 0 || (uint64_t)nt > rem(&r) / GGUF_MIN_TI_BYTES) {
        rc = gfail(err, g->label, MOH_E_FORMAT, "tensor count %" PRId64 " (expected 0..%zu, what the file's size can hold)", nt, rem(&r) / GGUF_MIN_TI_BYTES);
        goto fail;
    }
    if (nk < 0 || (uint64_t)nk > rem(&r) / GGUF_MIN_KV_BYTES) {
        rc = gfail(err, g->label, MOH_E_FORMAT, "metadata key count %" PRId64 " (expected 0..%zu, what the file's size can hold)", nk, rem(&r) / GGUF_MIN_KV_BYTES);
        goto fail;
    }
    g->n_tensors = nt;
    g->n_kv = nk;
    g->kv = calloc((size_t)(nk ? nk : 1), sizeof *g->kv);
    g->t = calloc((size_t)(nt ? nt : 1), sizeof *g->t);
    g->names = calloc((size_t)(nt ? nt : 1), sizeof *g->names);
    if (!g->kv || !g->t || !g->names) { rc = moh_fail(err, MOH_E_NOMEM, "%s: out of memory", label); goto fail; }
    if ((rc = parse_kv(g, &r, err))) goto fail;

    /* keys: unique (checked on the raw bytes, as gguf.cpp compares std::strings) */
    sort_item *it = malloc((size_t)(nk > nt ? (nk ? nk : 1) : nt) * sizeof *it);
    if (!it) { rc = moh_fail(err, MOH_E_NOMEM, "%s: out of memory", label); goto fail; }
    for (int64_t i = 0; i < nk; i++) {
        const gg_str *k = &g->strs[g->kv[i].key];
        it[i] = (sort_item){k->s, k->len, i};
    }
    int64_t d0 = -1, dup = sort_names(it, nk, &g->kv_sorted, &d0);
    if (dup != -1) {
        free(it);
        if (dup == -2) { rc = moh_fail(err, MOH_E_NOMEM, "%s: out of memory", label); goto fail; }
        const gg_str *k = &g->strs[g->kv[dup].key];
        rc = gfail(err, g->label, MOH_E_FORMAT, "key '%s' appears twice (keys %" PRId64 " and %" PRId64 "; expected unique keys)", esc(nm, k->s, k->len), d0, dup);
        goto fail;
    }
    g->alignment = 32;
    for (int64_t i = 0; i < nk; i++) {
        const gg_str *k = &g->strs[g->kv[i].key];
        if (k->len == 17 && memcmp(k->s, "general.alignment", 17) == 0) {
            if (g->kv[i].type != MOH_GGUF_U32) {
                free(it);
                rc = gfail(err, g->label, MOH_E_FORMAT, "key 'general.alignment' has type %s (expected u32)", moh_gguf_type_str((moh_gguf_type)g->kv[i].type));
                goto fail;
            }
            g->alignment = le32(g->kv[i].raw);
            if (g->alignment == 0 || (g->alignment & (g->alignment - 1))) {
                free(it);
                rc = gfail(err, g->label, MOH_E_FORMAT, "general.alignment is %" PRIu32 " (expected a power of 2)", g->alignment);
                goto fail;
            }
        }
    }
    if ((rc = parse_tensors(g, &r, err))) { free(it); goto fail; }
    for (int64_t i = 0; i < nt; i++) it[i] = (sort_item){g->t[i].name, strlen(g->t[i].name), i};
    dup = sort_names(it, nt, &g->t_sorted, &d0);
    free(it);
    if (dup != -1) {
        if (dup == -2) { rc = moh_fail(err, MOH_E_NOMEM, "%s: out of memory", label); goto fail; }
        rc = gfail(err, g->label, MOH_E_FORMAT, "tensor name '%s' appears twice (tensors %" PRId64 " and %" PRId64 "; expected unique names)",
                   esc(nm, g->t[dup].name, strlen(g->t[dup].name)), d0, dup);
        goto fail;
    }
    /* data section: aligned start (only when there are tensors), offsets the running padded sum */
    uint64_t start = r.pos;
    if (nt > 0) {
        uint64_t a = g->alignment;
        start = (r.pos + a - 1) / a * a; /* r.pos < 2^63 */
        if (start > len) {
            rc = gfail(err, g->label, MOH_E_FORMAT, "data section starts at byte %" PRIu64 " (aligned to %" PRIu32 "), past the end of the file (%zu bytes)", start, g->alignment, len);
            goto fail;
        }
    }
    g->data_off = start;
    uint64_t expect = 0, avail = len - start;
    for (int64_t i = 0; i < nt; i++) {
        moh_gguf_tensor *t = &g->t[i];
        esc(nm, t->name, strlen(t->name));
        if (t->offset != expect) {
            rc = gfail(err, g->label, MOH_E_FORMAT, "tensor '%s' has offset %" PRIu64 " (expected %" PRIu64 ", the padded end of the previous tensor)", nm, t->offset, expect);
            goto fail;
        }
        if (t->nbytes > avail || t->offset > avail - t->nbytes) {
            rc = gfail(err, g->label, MOH_E_FORMAT, "tensor '%s' data [%" PRIu64 ", %" PRIu64 ") of the data section at byte %" PRIu64 " runs past the end of the file (%zu bytes)",
                       nm, t->offset, t->offset + t->nbytes, start, len);
            goto fail;
        }
        uint64_t a = g->alignment, padded = (t->nbytes + a - 1) / a * a; /* nbytes <= len */
        expect += padded;
        t->data = buf + start + t->offset;
    }
    /* copy the metadata strings (keys and values) into one arena, NUL-terminated */
    size_t total = 0;
    for (uint64_t i = 0; i < g->n_strs; i++) total += g->strs[i].len + 1;
    g->arena = malloc(total ? total : 1);
    if (!g->arena) { rc = moh_fail(err, MOH_E_NOMEM, "%s: out of memory", label); goto fail; }
    char *a = g->arena;
    for (uint64_t i = 0; i < g->n_strs; i++) {
        if (g->strs[i].len) memcpy(a, g->strs[i].s, g->strs[i].len);
        a[g->strs[i].len] = '\0';
        g->strs[i].s = a;
        a += g->strs[i].len + 1;
    }
    *out = g;
    return MOH_OK;
fail:
    gg_free(g);
    return rc;
}

int moh_gguf_open(moh_gguf **out, const char *path, moh_error *err) {
    if (!out || !path) return moh_fail(err, MOH_E_ARG, "moh_gguf_open: NULL argument");
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return moh_fail(err, MOH_E_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        int e = errno;
        close(fd);
        return moh_fail(err, MOH_E_IO, "%s: %s", path, S_ISREG(st.st_mode) ? strerror(e) : "not a regular file");
    }
    size_t len = (size_t)st.st_size;
    void *map = NULL;
    if (len > 0) {
        map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            int e = errno;
            close(fd);
            return moh_fail(err, MOH_E_IO, "%s: cannot mmap %zu bytes: %s", path, len, strerror(e));
        }
    }
    close(fd);
    static const uint8_t empty[1] = {0};
    int rc = moh_gguf_parse(out, map ? (const uint8_t *)map : empty, len, path, err);
    if (rc != MOH_OK) {
        if (map) munmap(map, len);
        return rc;
    }
    (*out)->map = map;
    (*out)->map_len = len;
    return MOH_OK;
}

/* ---- accessors ---------------------------------------------------------------------------- */
uint32_t moh_gguf_version(const moh_gguf *g) { return g->version; }
uint32_t moh_gguf_alignment(const moh_gguf *g) { return g->alignment; }
uint64_t moh_gguf_data_offset(const moh_gguf *g) { return g->data_off; }
int64_t moh_gguf_n_kv(const moh_gguf *g) { return g->n_kv; }
int64_t moh_gguf_n_tensors(const moh_gguf *g) { return g->n_tensors; }

static int64_t bsearch_name(const int64_t *sorted, int64_t n, const char *key, size_t kl,
                            const moh_gguf *g, int keys) {
    int64_t lo = 0, hi = n;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2, i = sorted[mid];
        const char *s = keys ? g->strs[g->kv[i].key].s : g->t[i].name;
        size_t sl = keys ? g->strs[g->kv[i].key].len : strlen(s);
        size_t m = sl < kl ? sl : kl;
        int c = memcmp(s, key, m);
        if (c == 0) c = sl < kl ? -1 : sl > kl;
        if (c == 0) return i;
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return -1;
}

int64_t moh_gguf_find_key(const moh_gguf *g, const char *key) {
    if (!g || !key) return -1;
    return bsearch_name(g->kv_sorted, g->n_kv, key, strlen(key), g, 1);
}
const char *moh_gguf_key(const moh_gguf *g, int64_t i) {
    return i >= 0 && i < g->n_kv ? g->strs[g->kv[i].key].s : NULL;
}
moh_gguf_type moh_gguf_kv_type(const moh_gguf *g, int64_t i) {
    return i >= 0 && i < g->n_kv ? (moh_gguf_type)g->kv[i].type : MOH_GGUF_TYPE_COUNT;
}
moh_gguf_type moh_gguf_arr_type(const moh_gguf *g, int64_t i) {
    return i >= 0 && i < g->n_kv && g->kv[i].type == MOH_GGUF_ARRAY ? (moh_gguf_type)g->kv[i].arr_type
                                                                    : MOH_GGUF_TYPE_COUNT;
}
const uint8_t *moh_gguf_arr_data(const moh_gguf *g, int64_t i) {
    return i >= 0 && i < g->n_kv && g->kv[i].type == MOH_GGUF_ARRAY ? g->kv[i].raw : NULL;
}

/* The kv of key with (array: element) type want; MOH_E_SHAPE naming both types otherwise. */
static int get_kv(const moh_gguf *g, const char *key, int arr, int want, const gg_kv **out, moh_error *err) {
    if (!g || !key) return moh_fail(err, MOH_E_ARG, "moh_gguf getter: NULL argument");
    int64_t i = moh_gguf_find_key(g, key);
    char nm[400];
    if (i < 0) return gfail(err, g->label, MOH_E_SHAPE, "metadata key '%s' is missing", esc(nm, key, strlen(key)));
    const gg_kv *kv = &g->kv[i];
    int is_arr = kv->type == MOH_GGUF_ARRAY;
    int t = is_arr ? kv->arr_type : kv->type;
    if (is_arr != arr || (want >= 0 && t != want))
        return gfail(err, g->label, MOH_E_SHAPE, "metadata key '%s' is %s%s (expected %s%s)", esc(nm, key, strlen(key)),
                     is_arr ? "an array of " : "", GG_VTYPE_NAME[t], arr ? "an array of " : "",
                     want >= 0 ? GG_VTYPE_NAME[want] : "anything");
    *out = kv;
    return MOH_OK;
}

#define GG_GETTER(fn, ctype, code, expr)                                                      \
    int fn(const moh_gguf *g, const char *key, ctype *out, moh_error *err) {                  \
        const gg_kv *kv;                                                                      \
        int rc = get_kv(g, key, 0, code, &kv, err);                                           \
        if (rc) return rc;                                                                    \
        const uint8_t *p = kv->raw;                                                           \
        *out = (expr);                                                                        \
        return MOH_OK;                                                                        \
    }
GG_GETTER(moh_gguf_get_u16, uint16_t, MOH_GGUF_U16, le16(p))
GG_GETTER(moh_gguf_get_u32, uint32_t, MOH_GGUF_U32, le32(p))
GG_GETTER(moh_gguf_get_i32, int32_t, MOH_GGUF_I32, (int32_t)le32(p))
GG_GETTER(moh_gguf_get_f32, float, MOH_GGUF_F32, bits_f32(le32(p)))
GG_GETTER(moh_gguf_get_u64, uint64_t, MOH_GGUF_U64, le64(p))
GG_GETTER(moh_gguf_get_i64, int64_t, MOH_GGUF_I64, (int64_t)le64(p))
GG_GETTER(moh_gguf_get_bool, bool, MOH_GGUF_BOOL, p[0] != 0)

int moh_gguf_get_f64(const moh_gguf *g, const char *key, double *out, moh_error *err) {
    const gg_kv *kv;
    int rc = get_kv(g, key, 0, MOH_GGUF_F64, &kv, err);
    if (rc) return rc;
    uint64_t u = le64(kv->raw);
    memcpy(out, &u, 8);
    return MOH_OK;
}

int moh_gguf_get_str(const moh_gguf *g, const char *key, const char **out, size_t *len, moh_error *err) {
    const gg_kv *kv;
    int rc = get_kv(g, key, 0, MOH_GGUF_STRING, &kv, err);
    if (rc) return rc;
    *out = g->strs[kv->str0].s;
    if (len) *len = g->strs[kv->str0].len;
    return MOH_OK;
}

int moh_gguf_get_arr(const moh_gguf *g, const char *key, moh_gguf_type *elem_type, uint64_t *len, moh_error *err) {
    const gg_kv *kv;
    int rc = get_kv(g, key, 1, -1, &kv, err);
    if (rc) return rc;
    if (elem_type) *elem_type = (moh_gguf_type)kv->arr_type;
    if (len) *len = kv->n;
    return MOH_OK;
}

static int arr_elem(const moh_gguf *g, const char *key, uint64_t idx, int want, const gg_kv **kv, moh_error *err) {
    int rc = get_kv(g, key, 1, want, kv, err);
    if (rc) return rc;
    if (idx >= (*kv)->n) {
        char nm[400];
        return gfail(err, g->label, MOH_E_ARG, "metadata key '%s': index %" PRIu64 " (expected < %" PRIu64 ")", esc(nm, key, strlen(key)), idx, (*kv)->n);
    }
    return MOH_OK;
}

int moh_gguf_get_arr_str(const moh_gguf *g, const char *key, uint64_t idx, const char **out, size_t *len, moh_error *err) {
    const gg_kv *kv;
    int rc = arr_elem(g, key, idx, MOH_GGUF_STRING, &kv, err);
    if (rc) return rc;
    *out = g->strs[kv->str0 + idx].s;
    if (len) *len = g->strs[kv->str0 + idx].len;
    return MOH_OK;
}
int moh_gguf_get_arr_i32(const moh_gguf *g, const char *key, uint64_t idx, int32_t *out, moh_error *err) {
    const gg_kv *kv;
    int rc = arr_elem(g, key, idx, MOH_GGUF_I32, &kv, err);
    if (rc) return rc;
    *out = (int32_t)le32(kv->raw + 4 * idx);
    return MOH_OK;
}
int moh_gguf_get_arr_f32(const moh_gguf *g, const char *key, uint64_t idx, float *out, moh_error *err) {
    const gg_kv *kv;
    int rc = arr_elem(g, key, idx, MOH_GGUF_F32, &kv, err);
    if (rc) return rc;
    *out = bits_f32(le32(kv->raw + 4 * idx));
    return MOH_OK;
}

const moh_gguf_tensor *moh_gguf_tensor_at(const moh_gguf *g, int64_t i) {
    return g && i >= 0 && i < g->n_tensors ? &g->t[i] : NULL;
}
const moh_gguf_tensor *moh_gguf_find_tensor(const moh_gguf *g, const char *name) {
    if (!g || !name) return NULL;
    int64_t i = bsearch_name(g->t_sorted, g->n_tensors, name, strlen(name), g, 0);
    return i >= 0 ? &g->t[i] : NULL;
}

/* ---- dequantisation ----------------------------------------------------------------------- */

/* IEEE half to float, exact (NaN payloads kept, as numpy's conversion does): ops/quant.h. */
static float h2f(uint16_t h) { return quant_h2f(h); }

int moh_gguf_can_dequantize(int type) {
    switch (type) {
    case MOH_GGML_F32: case MOH_GGML_F16: case MOH_GGML_BF16: case MOH_GGML_Q8_0:
    case MOH_GGML_Q4_0: case MOH_GGML_Q4_1: case MOH_GGML_Q5_0: case MOH_GGML_Q5_1:
    case MOH_GGML_Q4_K: case MOH_GGML_Q5_K: case MOH_GGML_Q6_K: case MOH_GGML_Q8_K:
        return 1;
    default:
        return 0;
    }
}

/* Q4_K / Q5_K 6-bit scale j and min j of the 12 packed bytes q (ggml's get_scale_min_k4). */
static void scale_min_k4(int j, const uint8_t *q, uint8_t *d, uint8_t *m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

static void dq_block(int type, const uint8_t *b, float *y) {
    switch (type) {
    case MOH_GGML_Q8_0: { /* f16 d | i8 qs[32] */
        float d = h2f(le16(b));
        for (int j = 0; j < 32; j++) y[j] = (float)(int8_t)b[2 + j] * d;
        break;
    }
    case MOH_GGML_Q4_0: { /* f16 d | u8 qs[16]: low nibbles 0..15, high 16..31; q - 8 */
        float d = h2f(le16(b));
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)((b[2 + j] & 0xF) - 8);
            y[j + 16] = d * (float)((b[2 + j] >> 4) - 8);
        }
        break;
    }
    case MOH_GGML_Q4_1: { /* f16 d | f16 m | u8 qs[16]; d*q + m */
        float d = h2f(le16(b)), m = h2f(le16(b + 2));
        for (int j = 0; j < 16; j++) {
            float lo = d * (float)(b[4 + j] & 0xF), hi = d * (float)(b[4 + j] >> 4);
            y[j] = lo + m;
            y[j + 16] = hi + m;
        }
        break;
    }
    case MOH_GGML_Q5_0: { /* f16 d | u32 qh | u8 qs[16]; bit j of qh is bit 4 of element j; q - 16 */
        float d = h2f(le16(b));
        uint32_t qh = le32(b + 2);
        for (int j = 0; j < 16; j++) {
            int lo = (b[6 + j] & 0xF) | (int)(((qh >> j) & 1) << 4);
            int hi = (b[6 + j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
            y[j] = d * (float)(lo - 16);
            y[j + 16] = d * (float)(hi - 16);
        }
        break;
    }
    case MOH_GGML_Q5_1: { /* f16 d | f16 m | u32 qh | u8 qs[16]; d*q + m */
        float d = h2f(le16(b)), m = h2f(le16(b + 2));
        uint32_t qh = le32(b + 4);
        for (int j = 0; j < 16; j++) {
            int lo = (b[8 + j] & 0xF) | (int)(((qh >> j) & 1) << 4);
            int hi = (b[8 + j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
            float a = d * (float)lo, c = d * (float)hi;
            y[j] = a + m;
            y[j + 16] = c + m;
        }
        break;
    }
    case MOH_GGML_Q4_K: { /* f16 d | f16 dmin | u8 scales[12] | u8 qs[128] */
        float d = h2f(le16(b)), dmin = h2f(le16(b + 2));
        const uint8_t *sc = b + 4, *q = b + 16;
        for (int c = 0; c < 4; c++) {
            uint8_t s0, m0, s1, m1;
            scale_min_k4(2 * c, sc, &s0, &m0);
            scale_min_k4(2 * c + 1, sc, &s1, &m1);
            float d0 = d * (float)s0, dm0 = dmin * (float)m0, d1 = d * (float)s1, dm1 = dmin * (float)m1;
            for (int l = 0; l < 32; l++) {
                float a = d0 * (float)(q[32 * c + l] & 0xF), e = d1 * (float)(q[32 * c + l] >> 4);
                y[64 * c + l] = a - dm0;
                y[64 * c + 32 + l] = e - dm1;
            }
        }
        break;
    }
    case MOH_GGML_Q5_K: { /* f16 d | f16 dmin | u8 scales[12] | u8 qh[32] | u8 qs[128] */
        float d = h2f(le16(b)), dmin = h2f(le16(b + 2));
        const uint8_t *sc = b + 4, *qh = b + 16, *q = b + 48;
        for (int s = 0; s < 8; s++) {
            uint8_t sv, mv;
            scale_min_k4(s, sc, &sv, &mv);
            float ds = d * (float)sv, dm = dmin * (float)mv;
            for (int l = 0; l < 32; l++) {
                int lo = (s & 1) ? (q[32 * (s / 2) + l] >> 4) : (q[32 * (s / 2) + l] & 0xF);
                int v = lo | (((qh[l] >> s) & 1) << 4);
                float a = ds * (float)v;
                y[32 * s + l] = a - dm;
            }
        }
        break;
    }
    case MOH_GGML_Q6_K: { /* u8 ql[128] | u8 qh[64] | i8 scales[16] | f16 d */
        const uint8_t *ql = b, *qh = b + 128;
        const int8_t *sc = (const int8_t *)(b + 192);
        float d = h2f(le16(b + 208));
        for (int h = 0; h < 2; h++)
            for (int j = 0; j < 4; j++)
                for (int l = 0; l < 32; l++) {
                    int lo = (ql[64 * h + 32 * (j & 1) + l] >> (4 * (j >> 1))) & 0xF;
                    int hi = (qh[32 * h + l] >> (2 * j)) & 3;
                    int e = 128 * h + 32 * j + l;
                    float ds = d * (float)sc[e / 16];
                    y[e] = ds * (float)((lo | (hi << 4)) - 32);
                }
        break;
    }
    case MOH_GGML_Q8_K: { /* f32 d | i8 qs[256] | i16 bsums[16] */
        float d = bits_f32(le32(b));
        for (int j = 0; j < 256; j++) y[j] = d * (float)(int8_t)b[4 + j];
        break;
    }
    default:
        break;
    }
}

int moh_gguf_dequantize_raw(int type, const uint8_t *src, int64_t n, float *out, moh_error *err) {
    if (!moh_gguf_can_dequantize(type))
        return moh_fail(err, MOH_E_ARG, "dequantize: type %d (%s) is not supported (expected f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_K, q5_K, q6_K, q8_K)",
                        type, moh_gguf_ggml_type_name(type));
    int64_t bs = GG_TYPES[type].blck;
    size_t ts = GG_TYPES[type].size;
    if (n < 0 || n % bs)
        return moh_fail(err, MOH_E_ARG, "dequantize: %" PRId64 " elements of %s (expected a multiple of %" PRId64 ")", n, GG_TYPES[type].name, bs);
    switch (type) {
    case MOH_GGML_F32:
        for (int64_t i = 0; i < n; i++) out[i] = bits_f32(le32(src + 4 * i));
        return MOH_OK;
    case MOH_GGML_F16:
        for (int64_t i = 0; i < n; i++) out[i] = h2f(le16(src + 2 * i));
        return MOH_OK;
    case MOH_GGML_BF16:
        for (int64_t i = 0; i < n; i++) out[i] = bits_f32((uint32_t)le16(src + 2 * i) << 16);
        return MOH_OK;
    default:
        for (int64_t k = 0; k < n / bs; k++) dq_block(type, src + (size_t)k * ts, out + k * bs);
        return MOH_OK;
    }
}

int moh_gguf_dequantize(const moh_gguf *g, const moh_gguf_tensor *t, float *out, moh_error *err) {
    if (!g || !t || (!out && t->numel)) return moh_fail(err, MOH_E_ARG, "moh_gguf_dequantize: NULL argument");
    if (!moh_gguf_can_dequantize(t->type)) {
        char nm[400];
        return gfail(err, g->label, MOH_E_SHAPE, "tensor '%s' has type %s, which moh cannot dequantise (expected f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_K, q5_K, q6_K or q8_K)",
                     esc(nm, t->name, strlen(t->name)), moh_gguf_ggml_type_name(t->type));
    }
    return moh_gguf_dequantize_raw(t->type, t->data, t->numel, out, err);
}
