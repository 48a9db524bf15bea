/* Byte-level BPE tokenizer (see bpe.h). Regexes: the GPT-2 pattern of Hugging Face `tokenizers`'
 * ByteLevel pre-tokenizer and the LLaMA-3 pattern of its tokenizer.json; which `pre` names use
 * which follows llama.cpp's llama-vocab.cpp. The merge loop follows the BPE algorithm of
 * Sennrich et al. as `tokenizers` applies it: lowest rank first, leftmost on ties. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "text/bpe.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <pcre2.h>
#include <stdlib.h>
#include <string.h>

#include "core/fsutil.h"
#include "io/json_util.h"

#define GPT2_RE "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
#define LLAMA3_RE                                                                        \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+" \
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define DIGIT_RE "\\p{N}"

/* Hash of byte strings -> id (open addressing; capacity a power of two). */
typedef struct str_map {
    int *slot; /* token id or -1 */
    size_t cap;
} str_map;

/* Hash of (left id, right id) -> merge rank and result. */
typedef struct merge_ent {
    uint64_t key; /* (left << 32 | right) + 1; 0 = empty */
    int rank, result;
} merge_ent;

struct bpe_tok {
    int n_tokens;
    uint8_t **bytes; /* [n_tokens] decoded bytes (NULL: no token) */
    size_t *len;
    char **str; /* [n_tokens] strings as given */
    size_t max_len;
    str_map by_bytes; /* decoded bytes of byte-level tokens -> id */
    str_map by_str;   /* given string -> id */
    merge_ent *merges;
    size_t merge_cap;
    int byte_id[256]; /* id of each single byte, -1 if absent */
    int *added;       /* added ids, longest content first */
    int n_added;
    int added_first[257]; /* added[added_first[b]..added_first[b+1]) start with byte b */
    pcre2_code *re[BPE_MAX_REGEX];
    int n_re;
    bool ignore_merges;
    bpe_pre pre;                  /* the pre-tokenizer as given (written back by the writer) */
    char *pattern[BPE_MAX_REGEX]; /* BPE_PRE_CUSTOM: the regexes as given (owned) */
    char *source;                 /* spec.source (owned), or NULL */
};

/* ---- GPT-2 byte <-> unicode table ---- */

/* Code point of byte b: printable Latin-1 bytes stand for themselves, the other 68 take 256.. */
static unsigned byte_to_cp(int b) {
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255))
        return (unsigned)b;
    int n = 0;
    for (int c = 0; c < b; c++)
        if (!((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255))) n++;
    return 256u + (unsigned)n;
}

void bpe_byte_spelling(int b, char out[4]) {
    const unsigned cp = byte_to_cp(b & 0xFF);
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = '\0';
    } else { /* < 0x800: two bytes */
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        out[2] = '\0';
    }
}

/* Decodes one UTF-8 character of s[0..n); its length, or 0 when invalid. */
static int utf8_next(const uint8_t *s, size_t n, unsigned *cp) {
    if (n == 0) return 0;
    uint8_t c = s[0];
    int len;
    unsigned v, min;
    if (c < 0x80) { *cp = c; return 1; }
    else if ((c & 0xE0) == 0xC0) { len = 2; v = c & 0x1Fu; min = 0x80; }
    else if ((c & 0xF0) == 0xE0) { len = 3; v = c & 0x0Fu; min = 0x800; }
    else if ((c & 0xF8) == 0xF0) { len = 4; v = c & 0x07u; min = 0x10000; }
    else return 0;
    if ((size_t)len > n) return 0;
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        v = (v << 6) | (s[i] & 0x3Fu);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
    *cp = v;
    return len;
}

int bpe_utf8_len(const uint8_t *s, size_t n) {
    unsigned cp;
    return utf8_next(s, n, &cp);
}

/* Bytes of a byte-level token string s (each character one byte of the table) into out (room for
 * strlen(s)); their count, or -1 when s has a character outside the table. */
static long byte_level_decode(const uint8_t cp_to_byte[324], const char *s, uint8_t *out) {
    const uint8_t *p = (const uint8_t *)s;
    size_t n = strlen(s);
    long k = 0;
    while (n > 0) {
        unsigned cp;
        int l = utf8_next(p, n, &cp);
        if (l == 0 || cp >= 324 || (cp_to_byte[cp] == 0 && byte_to_cp(0) != cp)) return -1;
        out[k++] = cp_to_byte[cp];
        p += l;
        n -= (size_t)l;
    }
    return k;
}

/* ---- hashing ---- */

static uint64_t hash_bytes(const uint8_t *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

static size_t pow2_at_least(size_t n) {
    size_t c = 16;
    while (c < n * 2) c *= 2;
    return c;
}

/* Finds s in m using keys(id) = (key[id], klen[id]); the slot index. */
static size_t map_find(const str_map *m, uint8_t *const *key, const size_t *klen, const uint8_t *s,
                       size_t n) {
    size_t i = (size_t)hash_bytes(s, n) & (m->cap - 1);
    while (m->slot[i] >= 0) {
        int id = m->slot[i];
        if (klen[id] == n && memcmp(key[id], s, n) == 0) return i;
        i = (i + 1) & (m->cap - 1);
    }
    return i;
}

static uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

static const merge_ent *merge_find(const bpe_tok *t, int a, int b) {
    uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    size_t i = (size_t)mix64(key) & (t->merge_cap - 1);
    while (t->merges[i].key) {
        if (t->merges[i].key == key) return &t->merges[i];
        i = (i + 1) & (t->merge_cap - 1);
    }
    return NULL;
}

/* ---- creation ---- */

int bpe_pre_from_name(const char *name, bpe_pre *pre, bool *ignore_merges, moh_error *err) {
    *ignore_merges = false;
    if (!strcmp(name, "gpt-2") || !strcmp(name, "gpt2") || !strcmp(name, "default")) *pre = BPE_PRE_GPT2;
    else if (!strcmp(name, "smollm") || !strcmp(name, "starcoder") || !strcmp(name, "refact"))
        *pre = BPE_PRE_SMOLLM;
    else if (!strcmp(name, "llama-bpe") || !strcmp(name, "llama3")) {
        *pre = BPE_PRE_LLAMA3;
        *ignore_merges = true;
    } else {
        char q[96];
        return moh_fail(err, MOH_E_CONFIG,
                        "tokenizer pre-tokenizer '%s' not supported (expected gpt-2, smollm, "
                        "starcoder, refact, llama-bpe)",
                        json_quote(q, sizeof q, name, 64, 16));
    }
    return MOH_OK;
}

void bpe_free(bpe_tok *t) {
    if (!t) return;
    for (int i = 0; i < t->n_tokens; i++) {
        if (t->bytes) free(t->bytes[i]);
        if (t->str) free(t->str[i]);
    }
    free(t->bytes);
    free(t->len);
    free(t->str);
    free(t->by_bytes.slot);
    free(t->by_str.slot);
    free(t->merges);
    free(t->added);
    for (int i = 0; i < t->n_re; i++) pcre2_code_free(t->re[i]);
    for (int i = 0; i < BPE_MAX_REGEX; i++) free(t->pattern[i]);
    free(t->source);
    free(t);
}

static int compile_re(bpe_tok *t, const char *pat, moh_error *err) {
    int code;
    PCRE2_SIZE off;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &code, &off,
                                   NULL);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(code, msg, sizeof msg);
        char q[96];
        return moh_fail(err, MOH_E_FORMAT, "tokenizer regex '%s': %s at offset %zu",
                        json_quote(q, sizeof q, pat, 64, 16), (const char *)msg, (size_t)off);
    }
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* optional speed-up; falls back if absent */
    t->re[t->n_re++] = re;
    return MOH_OK;
}

static int cmp_added(const void *a, const void *b, const bpe_tok *t) {
    int x = *(const int *)a, y = *(const int *)b;
    int bx = t->len[x] ? t->bytes[x][0] : -1, by = t->len[y] ? t->bytes[y][0] : -1;
    if (bx != by) return bx < by ? -1 : 1;
    if (t->len[x] != t->len[y]) return t->len[x] > t->len[y] ? -1 : 1;
    return x < y ? -1 : (x > y);
}

/* Insertion sort (the added list is short) by first byte, then longest first. */
static void sort_added(bpe_tok *t) {
    for (int i = 1; i < t->n_added; i++)
        for (int j = i; j > 0 && cmp_added(&t->added[j - 1], &t->added[j], t) > 0; j--) {
            int tmp = t->added[j];
            t->added[j] = t->added[j - 1];
            t->added[j - 1] = tmp;
        }
}

int bpe_create(bpe_tok **out, const bpe_spec *spec, moh_error *err) {
    *out = NULL;
    if (spec->n_tokens <= 0 || spec->n_merges < 0 || spec->n_added < 0 || spec->n_regex < 0 ||
        spec->n_regex > BPE_MAX_REGEX)
        return moh_fail(err, MOH_E_ARG, "bpe_create: bad counts (tokens %d, merges %d, added %d)",
                        spec->n_tokens, spec->n_merges, spec->n_added);
    bpe_tok *t = calloc(1, sizeof *t);
    if (!t) return moh_fail(err, MOH_E_NOMEM, "bpe_create: out of memory");
    int n = spec->n_tokens;
    t->n_tokens = n;
    t->bytes = calloc((size_t)n, sizeof *t->bytes);
    t->len = calloc((size_t)n, sizeof *t->len);
    t->str = calloc((size_t)n, sizeof *t->str);
    t->by_bytes.cap = t->by_str.cap = pow2_at_least((size_t)n);
    t->by_bytes.slot = malloc(t->by_bytes.cap * sizeof(int));
    t->by_str.slot = malloc(t->by_str.cap * sizeof(int));
    t->merge_cap = pow2_at_least((size_t)spec->n_merges + 1);
    t->merges = calloc(t->merge_cap, sizeof *t->merges);
    t->added = malloc(((size_t)spec->n_added + 1) * sizeof(int));
    int rc = MOH_OK;
    if (!t->bytes || !t->len || !t->str || !t->by_bytes.slot || !t->by_str.slot || !t->merges ||
        !t->added) {
        rc = moh_fail(err, MOH_E_NOMEM, "bpe_create: out of memory for %d tokens", n);
        goto fail;
    }
    memset(t->by_bytes.slot, 0xff, t->by_bytes.cap * sizeof(int));
    memset(t->by_str.slot, 0xff, t->by_str.cap * sizeof(int));
    uint8_t cp_to_byte[324];
    memset(cp_to_byte, 0, sizeof cp_to_byte);
    for (int b = 0; b < 256; b++) cp_to_byte[byte_to_cp(b)] = (uint8_t)b;

    char q[96];
    for (int i = 0; i < n; i++) {
        const char *s = spec->tokens[i];
        if (!s) continue;
        size_t sl = strlen(s);
        t->str[i] = malloc(sl + 1);
        t->bytes[i] = malloc(sl + 1);
        if (!t->str[i] || !t->bytes[i]) {
            rc = moh_fail(err, MOH_E_NOMEM, "bpe_create: out of memory");
            goto fail;
        }
        memcpy(t->str[i], s, sl + 1);
        long k = byte_level_decode(cp_to_byte, s, t->bytes[i]);
        bool byte_level = k >= 0;
        if (!byte_level) { /* not in the byte-level form: its bytes are the string itself */
            memcpy(t->bytes[i], s, sl);
            k = (long)sl;
        }
        t->len[i] = (size_t)k;
        if ((size_t)k > t->max_len) t->max_len = (size_t)k;
        /* by_str: keyed by the given strings (kept in t->str, length strlen). */
        {
            size_t j = (size_t)hash_bytes((const uint8_t *)s, sl) & (t->by_str.cap - 1);
            while (t->by_str.slot[j] >= 0) {
                if (!strcmp(t->str[t->by_str.slot[j]], s)) {
                    rc = moh_fail(err, MOH_E_FORMAT, "tokenizer: token '%s' appears twice (ids %d and %d)",
                                  json_quote(q, sizeof q, s, 64, 16), t->by_str.slot[j], i);
                    goto fail;
                }
                j = (j + 1) & (t->by_str.cap - 1);
            }
            t->by_str.slot[j] = i;
        }
        if (byte_level) {
            size_t j = map_find(&t->by_bytes, t->bytes, t->len, t->bytes[i], t->len[i]);
            if (t->by_bytes.slot[j] < 0) t->by_bytes.slot[j] = i; /* first id wins */
        }
    }
    for (int b = 0; b < 256; b++) {
        uint8_t c = (uint8_t)b;
        size_t j = map_find(&t->by_bytes, t->bytes, t->len, &c, 1);
        t->byte_id[b] = t->by_bytes.slot[j];
    }
    for (int r = 0; r < spec->n_merges; r++) {
        const char *m = spec->merges[r];
        const char *sp = m ? strchr(m, ' ') : NULL;
        if (!sp || sp == m || !sp[1] || strchr(sp + 1, ' ')) {
            rc = moh_fail(err, MOH_E_FORMAT, "tokenizer merge %d '%s': expected \"A B\"", r,
                          m ? json_quote(q, sizeof q, m, 64, 16) : "(null)");
            goto fail;
        }
        size_t la = (size_t)(sp - m), lb = strlen(sp + 1);
        char *buf = malloc(la + lb + 1);
        if (!buf) {
            rc = moh_fail(err, MOH_E_NOMEM, "bpe_create: out of memory");
            goto fail;
        }
        int ids[3];
        memcpy(buf, m, la);
        buf[la] = 0;
        ids[0] = bpe_token_id(t, buf);
        ids[1] = bpe_token_id(t, sp + 1);
        memcpy(buf + la, sp + 1, lb + 1);
        ids[2] = bpe_token_id(t, buf);
        free(buf);
        if (ids[0] < 0 || ids[1] < 0 || ids[2] < 0) {
            rc = moh_fail(err, MOH_E_FORMAT, "tokenizer merge %d '%s': %s is not a token", r,
                          json_quote(q, sizeof q, m, 64, 16),
                          ids[0] < 0 ? "the left part" : ids[1] < 0 ? "the right part" : "the result");
            goto fail;
        }
        uint64_t key = (((uint64_t)(uint32_t)ids[0] << 32) | (uint32_t)ids[1]) + 1;
        size_t i = (size_t)mix64(key) & (t->merge_cap - 1);
        while (t->merges[i].key && t->merges[i].key != key) i = (i + 1) & (t->merge_cap - 1);
        if (!t->merges[i].key) { /* a repeated merge keeps its first (lowest) rank */
            t->merges[i].key = key;
            t->merges[i].rank = r;
            t->merges[i].result = ids[2];
        }
    }
    for (int i = 0; i < spec->n_added; i++) {
        int id = spec->added[i];
        if (id < 0 || id >= n || !t->str[id] || !t->str[id][0]) {
            rc = moh_fail(err, MOH_E_FORMAT, "tokenizer added token %d: id %d is not a token", i, id);
            goto fail;
        }
        /* matched and decoded as the literal content, not through the byte table */
        size_t sl = strlen(t->str[id]);
        memcpy(t->bytes[id], t->str[id], sl);
        t->len[id] = sl;
        if (sl > t->max_len) t->max_len = sl;
        t->added[t->n_added++] = id;
    }
    sort_added(t);
    for (int b = 0, k = 0; b <= 256; b++) {
        while (k < t->n_added && t->bytes[t->added[k]][0] < b) k++;
        t->added_first[b] = k;
    }
    t->ignore_merges = spec->ignore_merges;
    t->pre = spec->pre;
    if (spec->source && !(t->source = strdup(spec->source))) {
        rc = moh_fail(err, MOH_E_NOMEM, "bpe_create: out of memory");
        goto fail;
    }
    switch (spec->pre) {
    case BPE_PRE_GPT2: rc = compile_re(t, GPT2_RE, err); break;
    case BPE_PRE_SMOLLM:
        rc = compile_re(t, DIGIT_RE, err);
        if (rc == MOH_OK) rc = compile_re(t, GPT2_RE, err);
        break;
    case BPE_PRE_LLAMA3: rc = compile_re(t, LLAMA3_RE, err); break;
    case BPE_PRE_CUSTOM:
        for (int i = 0; i < spec->n_regex && rc == MOH_OK; i++) {
            if (!spec->pre_regex[i]) {
                rc = moh_fail(err, MOH_E_ARG, "bpe_create: pre_regex[%d] is NULL", i);
                break;
            }
            rc = compile_re(t, spec->pre_regex[i], err);
            if (rc == MOH_OK && !(t->pattern[i] = strdup(spec->pre_regex[i])))
                rc = moh_fail(err, MOH_E_NOMEM, "bpe_create: out of memory");
        }
        break;
    default: rc = moh_fail(err, MOH_E_ARG, "bpe_create: unknown pre-tokenizer %d", (int)spec->pre);
    }
    if (rc != MOH_OK) goto fail;
    *out = t;
    return MOH_OK;
fail:
    bpe_free(t);
    return rc;
}

int bpe_n_tokens(const bpe_tok *t) { return t->n_tokens; }
size_t bpe_max_token_bytes(const bpe_tok *t) { return t->max_len; }

int bpe_token_id(const bpe_tok *t, const char *s) {
    size_t sl = strlen(s);
    size_t j = (size_t)hash_bytes((const uint8_t *)s, sl) & (t->by_str.cap - 1);
    while (t->by_str.slot[j] >= 0) {
        if (!strcmp(t->str[t->by_str.slot[j]], s)) return t->by_str.slot[j];
        j = (j + 1) & (t->by_str.cap - 1);
    }
    return -1;
}

const char *bpe_token_str(const bpe_tok *t, int id) {
    return id >= 0 && id < t->n_tokens ? t->str[id] : NULL;
}

int bpe_token_bytes(const bpe_tok *t, int id, const uint8_t **bytes, size_t *len, moh_error *err) {
    if (id < 0 || id >= t->n_tokens || !t->bytes[id])
        return moh_fail(err, MOH_E_ARG, "token id %d: not a token (vocabulary of %d)", id,
                        t->n_tokens);
    *bytes = t->bytes[id];
    *len = t->len[id];
    return MOH_OK;
}

/* ---- encoding ---- */

typedef struct ids_buf {
    int *v;
    size_t n, cap;
} ids_buf;

static int ids_push(ids_buf *b, int id) {
    if (b->n == b->cap) {
        size_t c = b->cap ? b->cap * 2 : 256;
        int *v = realloc(b->v, c * sizeof *v);
        if (!v) return MOH_E_NOMEM;
        b->v = v;
        b->cap = c;
    }
    b->v[b->n++] = id;
    return MOH_OK;
}

/* Scratch for the merge loop of one piece. */
typedef struct sym { int id, prev, next; } sym;
typedef struct cand { int rank, left, a, b; } cand;
typedef struct work {
    sym *s;
    cand *h;
    size_t cap, hn;
    pcre2_match_data *md;
    int match_rc; /* PCRE2's error when a match failed (e.g. its match limit) */
} work;

static bool cand_less(const cand *x, const cand *y) {
    return x->rank < y->rank || (x->rank == y->rank && x->left < y->left);
}
static void heap_push(work *w, cand c) {
    size_t i = w->hn++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!cand_less(&c, &w->h[p])) break;
        w->h[i] = w->h[p];
        i = p;
    }
    w->h[i] = c;
}
static cand heap_pop(work *w) {
    cand top = w->h[0], last = w->h[--w->hn];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, m = i;
        if (l >= w->hn) break;
        if (l + 1 < w->hn && cand_less(&w->h[l + 1], &w->h[l])) l++;
        if (!cand_less(&w->h[l], &last)) break;
        w->h[i] = w->h[l];
        i = l;
        (void)m;
    }
    if (w->hn) w->h[i] = last;
    return top;
}

static void try_pair(const bpe_tok *t, work *w, int left) {
    int right = w->s[left].next;
    if (right < 0) return;
    const merge_ent *m = merge_find(t, w->s[left].id, w->s[right].id);
    if (m) heap_push(w, (cand){m->rank, left, w->s[left].id, w->s[right].id});
}

/* BPE of one piece p[0..n) appended to out. */
static int bpe_piece(const bpe_tok *t, work *w, const uint8_t *p, size_t n, ids_buf *out) {
    if (n == 0) return MOH_OK;
    if (t->ignore_merges) {
        size_t j = map_find(&t->by_bytes, t->bytes, t->len, p, n);
        if (t->by_bytes.slot[j] >= 0) return ids_push(out, t->by_bytes.slot[j]);
    }
    if (n > w->cap) {
        size_t c = n * 2;
        sym *s = realloc(w->s, c * sizeof *s);
        if (!s) return MOH_E_NOMEM;
        w->s = s;
        cand *h = realloc(w->h, 3 * c * sizeof *h);
        if (!h) return MOH_E_NOMEM;
        w->h = h;
        w->cap = c;
    }
    /* Bytes without a token are dropped (what `tokenizers` does without an unk token). */
    int m = 0;
    for (size_t i = 0; i < n; i++) {
        int id = t->byte_id[p[i]];
        if (id < 0) continue;
        w->s[m] = (sym){id, m - 1, m + 1};
        m++;
    }
    if (m == 0) return MOH_OK;
    w->s[m - 1].next = -1;
    w->hn = 0;
    for (int i = 0; i + 1 < m; i++) try_pair(t, w, i);
    /* n - 1 first candidates, then at most 2 per merge (n - 1 merges): the heap stays < 3n. */
    while (w->hn) {
        cand c = heap_pop(w);
        sym *l = &w->s[c.left];
        if (l->id != c.a || l->next < 0 || w->s[l->next].id != c.b) continue; /* stale */
        const merge_ent *me = merge_find(t, c.a, c.b);
        int r = l->next;
        l->id = me->result;
        l->next = w->s[r].next;
        if (l->next >= 0) w->s[l->next].prev = c.left;
        w->s[r].id = -1;
        if (l->prev >= 0) try_pair(t, w, l->prev);
        try_pair(t, w, c.left);
    }
    for (int i = 0; i >= 0; i = w->s[i].next)
        if (ids_push(out, w->s[i].id)) return MOH_E_NOMEM;
    return MOH_OK;
}

/* Splits s[0..n) with regex level k and its matches/gaps further with level k + 1. */
static int pre_split(const bpe_tok *t, work *w, int k, const uint8_t *s, size_t n, ids_buf *out) {
    if (k == t->n_re) return bpe_piece(t, w, s, n, out);
    size_t pos = 0;
    while (pos < n) {
        int rc = pcre2_match(t->re[k], (PCRE2_SPTR)s, n, pos, 0, w->md, NULL);
        size_t ms, me;
        if (rc >= 0) {
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(w->md);
            ms = ov[0];
            me = ov[1];
            if (me <= ms) { /* no pattern here matches empty; guard anyway */
                me = ms + 1;
                while (me < n && (s[me] & 0xC0) == 0x80) me++;
            }
        } else if (rc == PCRE2_ERROR_NOMATCH) {
            ms = me = n;
        } else {
            w->match_rc = rc;
            return MOH_E_FORMAT;
        }
        if (ms > pos && (rc = pre_split(t, w, k + 1, s + pos, ms - pos, out))) return rc;
        if (me > ms && (rc = pre_split(t, w, k + 1, s + ms, me - ms, out))) return rc;
        pos = me;
    }
    return MOH_OK;
}

/* The added token starting at s[0..n) (longest), or -1. */
static int added_at(const bpe_tok *t, const uint8_t *s, size_t n) {
    for (int k = t->added_first[s[0]]; k < t->added_first[s[0] + 1]; k++) {
        int id = t->added[k];
        if (t->len[id] <= n && memcmp(t->bytes[id], s, t->len[id]) == 0) return id;
    }
    return -1;
}

int bpe_encode(const bpe_tok *t, const uint8_t *text, size_t len, bool parse_added, int **ids,
               size_t *n_ids, moh_error *err) {
    *ids = NULL;
    *n_ids = 0;
    if (len > INT_MAX) return moh_fail(err, MOH_E_ARG, "bpe_encode: text of %zu bytes (max %d)", len, INT_MAX);
    ids_buf out = {0};
    work w = {0};
    w.md = pcre2_match_data_create(1, NULL);
    int rc = w.md ? MOH_OK : MOH_E_NOMEM;
    size_t seg = 0, i = 0;
    while (rc == MOH_OK && i <= len) {
        int id = -1;
        if (i < len && parse_added && t->n_added) id = added_at(t, text + i, len - i);
        if (id < 0 && i < len) {
            i++;
            continue;
        }
        if (i > seg) rc = pre_split(t, &w, 0, text + seg, i - seg, &out);
        if (rc == MOH_OK && id >= 0) {
            rc = ids_push(&out, id);
            i += t->len[id];
            seg = i;
        } else if (id < 0) {
            break; /* i == len */
        }
    }
    free(w.s);
    free(w.h);
    pcre2_match_data_free(w.md);
    if (rc != MOH_OK) {
        free(out.v);
        if (rc == MOH_E_NOMEM) return moh_fail(err, rc, "bpe_encode: out of memory");
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(w.match_rc, msg, sizeof msg);
        return moh_fail(err, rc, "bpe_encode: pre-tokenizer regex failed: %s", (const char *)msg);
    }
    if (out.n == 0) free(out.v);
    *ids = out.n ? out.v : NULL;
    *n_ids = out.n;
    return MOH_OK;
}

/* ---- decoding ---- */

int bpe_decode(const bpe_tok *t, const int *ids, size_t n, uint8_t **out, size_t *out_len,
               moh_error *err) {
    *out = NULL;
    *out_len = 0;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_tokens || !t->bytes[ids[i]])
            return moh_fail(err, MOH_E_ARG, "decode: id %d at position %zu is not a token (vocabulary of %d)",
                            ids[i], i, t->n_tokens);
        total += t->len[ids[i]];
    }
    uint8_t *b = malloc(total + 1);
    if (!b) return moh_fail(err, MOH_E_NOMEM, "decode: out of memory for %zu bytes", total);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        memcpy(b + k, t->bytes[ids[i]], t->len[ids[i]]);
        k += t->len[ids[i]];
    }
    b[k] = 0;
    *out = b;
    *out_len = k;
    return MOH_OK;
}

/* Expected length of a UTF-8 sequence starting with lead byte c (0: not a lead byte). */
static int utf8_lead_len(uint8_t c) {
    if (c >= 0xC2 && c <= 0xDF) return 2;
    if (c >= 0xE0 && c <= 0xEF) return 3;
    if (c >= 0xF0 && c <= 0xF4) return 4;
    return 0;
}

int bpe_stream_push(const bpe_tok *t, bpe_stream *s, int id, uint8_t *out, size_t cap,
                    size_t *n_out, moh_error *err) {
    *n_out = 0;
    const uint8_t *b = NULL;
    size_t bl = 0;
    int rc = bpe_token_bytes(t, id, &b, &bl, err);
    if (rc) return rc;
    if (cap < (size_t)s->n_held + bl)
        return moh_fail(err, MOH_E_ARG, "stream decode: buffer of %zu bytes < %zu", cap,
                        (size_t)s->n_held + bl);
    size_t n = (size_t)s->n_held;
    memcpy(out, s->held, n);
    memcpy(out + n, b, bl);
    n += bl;
    /* Hold back a lead byte + continuation bytes at the end if the character is incomplete. */
    size_t keep = 0;
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        uint8_t c = out[n - back];
        if ((c & 0xC0) == 0x80) continue;
        int want = utf8_lead_len(c);
        if (want > 0 && (size_t)want > back) keep = back;
        break;
    }
    memcpy(s->held, out + n - keep, keep);
    s->n_held = (int)keep;
    *n_out = n - keep;
    return MOH_OK;
}

size_t bpe_stream_flush(bpe_stream *s, uint8_t out[4]) {
    size_t n = (size_t)s->n_held;
    memcpy(out, s->held, n);
    s->n_held = 0;
    return n;
}

/* ---- tokenizer.json ---- */

static int tj_fail(const char *label, moh_error *err, const char *what) {
    return moh_fail(err, MOH_E_FORMAT, "%s: %s", label, what);
}

/* Appends the regexes of one pre-tokenizer object j to spec (recursing into a Sequence). */
static int tj_pre(const cJSON *j, bpe_spec *spec, const char *label, moh_error *err) {
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(j, "type");
    if (!cJSON_IsString(type)) return tj_fail(label, err, "pre_tokenizer: expected an object with a string \"type\"");
    const char *ty = type->valuestring;
    char q[96];
    if (!strcmp(ty, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(j, "pretokenizers"), *it;
        if (!cJSON_IsArray(list)) return tj_fail(label, err, "pre_tokenizer Sequence: expected an array \"pretokenizers\"");
        cJSON_ArrayForEach(it, list) {
            int rc = tj_pre(it, spec, label, err);
            if (rc) return rc;
        }
        return MOH_OK;
    }
    if (!strcmp(ty, "ByteLevel")) {
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "add_prefix_space")))
            return tj_fail(label, err, "pre_tokenizer ByteLevel: add_prefix_space true is not supported (expected false)");
        const cJSON *ur = cJSON_GetObjectItemCaseSensitive(j, "use_regex");
        if (ur && !cJSON_IsTrue(ur)) return MOH_OK; /* the byte mapping alone: no split */
    }
    if (spec->n_regex >= BPE_MAX_REGEX)
        return moh_fail(err, MOH_E_FORMAT, "%s: pre_tokenizer: more than %d splitting stages", label, BPE_MAX_REGEX);
    if (!strcmp(ty, "ByteLevel")) {
        spec->pre_regex[spec->n_regex++] = GPT2_RE;
        return MOH_OK;
    }
    if (!strcmp(ty, "Digits")) {
        bool ind = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "individual_digits"));
        spec->pre_regex[spec->n_regex++] = ind ? DIGIT_RE : DIGIT_RE "+";
        return MOH_OK;
    }
    if (!strcmp(ty, "Split")) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(j, "pattern");
        const cJSON *re = pat ? cJSON_GetObjectItemCaseSensitive(pat, "Regex") : NULL;
        const cJSON *beh = cJSON_GetObjectItemCaseSensitive(j, "behavior");
        if (!cJSON_IsString(re))
            return tj_fail(label, err, "pre_tokenizer Split: expected \"pattern\": {\"Regex\": \"...\"}");
        if (!cJSON_IsString(beh) || strcmp(beh->valuestring, "Isolated"))
            return tj_fail(label, err, "pre_tokenizer Split: only \"behavior\": \"Isolated\" is supported");
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "invert")))
            return tj_fail(label, err, "pre_tokenizer Split: \"invert\": true is not supported");
        spec->pre_regex[spec->n_regex++] = re->valuestring;
        return MOH_OK;
    }
    return moh_fail(err, MOH_E_FORMAT,
                    "%s: pre_tokenizer type '%s' not supported (expected ByteLevel, Digits, Split, Sequence)",
                    label, json_quote(q, sizeof q, ty, 64, 16));
}

/* A regex list that is one of the named pre-tokenizers (what llama.cpp knows by name) becomes
 * that name: gpt2 = ByteLevel(use_regex); smollm = Digits(individual) + ByteLevel(use_regex);
 * llama-bpe = Split(LLaMA-3 regex) + ByteLevel(use_regex false) with ignore_merges. The regexes
 * compiled are the same either way. */
static void tj_named_pre(bpe_spec *spec) {
    const char *const *r = spec->pre_regex;
    const int n = spec->n_regex;
    if (spec->ignore_merges) {
        if (n == 1 && !strcmp(r[0], LLAMA3_RE)) spec->pre = BPE_PRE_LLAMA3;
    } else if (n == 1 && !strcmp(r[0], GPT2_RE)) spec->pre = BPE_PRE_GPT2;
    else if (n == 2 && !strcmp(r[0], DIGIT_RE) && !strcmp(r[1], GPT2_RE)) spec->pre = BPE_PRE_SMOLLM;
    if (spec->pre != BPE_PRE_CUSTOM) spec->n_regex = 0;
}

static int tj_build(bpe_tok **out, const cJSON *root, const char *label, moh_error *err) {
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (!cJSON_IsObject(model)) return tj_fail(label, err, "expected an object \"model\"");
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(model, "type");
    if (ty && (!cJSON_IsString(ty) || strcmp(ty->valuestring, "BPE")))
        return tj_fail(label, err, "model.type: expected \"BPE\"");
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "byte_fallback")))
        return tj_fail(label, err, "model.byte_fallback: true is not supported (expected false)");
    const char *must_null[] = {"continuing_subword_prefix", "end_of_word_suffix", "dropout"};
    for (int i = 0; i < 3; i++) {
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(model, must_null[i]);
        if (x && !cJSON_IsNull(x))
            return moh_fail(err, MOH_E_FORMAT, "%s: model.%s: expected null", label, must_null[i]);
    }
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    if (norm && !cJSON_IsNull(norm)) return tj_fail(label, err, "normalizer: expected null (normalizers are not supported)");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    if (!cJSON_IsObject(vocab)) return tj_fail(label, err, "model.vocab: expected an object {token: id}");
    if (merges && !cJSON_IsArray(merges)) return tj_fail(label, err, "model.merges: expected an array");
    if (added && !cJSON_IsArray(added) && !cJSON_IsNull(added)) return tj_fail(label, err, "added_tokens: expected an array");
    const cJSON *it;
    /* Ids: the vocab's and the added tokens', all < the vocab size + added count. */
    int n_vocab = cJSON_GetArraySize(vocab), n_add = added ? cJSON_GetArraySize(added) : 0;
    long limit = (long)n_vocab + n_add;
    long n_tok = 0;
    const cJSON *groups[2] = {vocab, added};
    for (int g = 0; g < 2; g++) {
        if (!groups[g]) continue;
        cJSON_ArrayForEach(it, groups[g]) {
            const cJSON *idj = g == 0 ? it : cJSON_GetObjectItemCaseSensitive(it, "id");
            const cJSON *cj = g == 0 ? NULL : cJSON_GetObjectItemCaseSensitive(it, "content");
            if (g == 1 && !cJSON_IsString(cj))
                return tj_fail(label, err, "added_tokens: expected objects with \"id\" and a string \"content\"");
            if (!cJSON_IsNumber(idj) || !(idj->valuedouble >= 0 && idj->valuedouble < (double)limit) ||
                idj->valuedouble != (double)(long)idj->valuedouble) {
                char q[96];
                return moh_fail(err, MOH_E_FORMAT, "%s: %s '%s': id must be an integer in 0..%ld",
                                label, g == 0 ? "model.vocab" : "added_tokens",
                                json_quote(q, sizeof q, g == 0 ? it->string : cj->valuestring, 64, 16),
                                limit - 1);
            }
            if ((long)idj->valuedouble + 1 > n_tok) n_tok = (long)idj->valuedouble + 1;
        }
    }
    if (n_tok == 0) return tj_fail(label, err, "model.vocab: empty");
    const char **tokens = calloc((size_t)n_tok, sizeof *tokens);
    int n_m = merges ? cJSON_GetArraySize(merges) : 0;
    char **mstr = calloc((size_t)n_m + 1, sizeof *mstr);
    int *add_ids = malloc(((size_t)n_add + 1) * sizeof(int));
    int rc = MOH_OK;
    if (!tokens || !mstr || !add_ids) {
        rc = moh_fail(err, MOH_E_NOMEM, "%s: out of memory", label);
        goto done;
    }
    char q[96];
    cJSON_ArrayForEach(it, vocab) {
        long id = (long)it->valuedouble;
        if (tokens[id]) {
            rc = moh_fail(err, MOH_E_FORMAT, "%s: model.vocab: id %ld given twice", label, id);
            goto done;
        }
        tokens[id] = it->string;
    }
    int na = 0;
    if (added) cJSON_ArrayForEach(it, added) {
        long id = (long)cJSON_GetObjectItemCaseSensitive(it, "id")->valuedouble;
        const char *c = cJSON_GetObjectItemCaseSensitive(it, "content")->valuestring;
        const char *flags[] = {"lstrip", "rstrip", "single_word"};
        for (int f = 0; f < 3; f++)
            if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(it, flags[f]))) {
                rc = moh_fail(err, MOH_E_FORMAT, "%s: added token '%s': %s true is not supported",
                              label, json_quote(q, sizeof q, c, 64, 16), flags[f]);
                goto done;
            }
        if (tokens[id] && strcmp(tokens[id], c)) {
            char q2[96];
            rc = moh_fail(err, MOH_E_FORMAT, "%s: added token '%s': id %ld is token '%s' in model.vocab",
                          label, json_quote(q, sizeof q, c, 64, 16), id,
                          json_quote(q2, sizeof q2, tokens[id], 64, 16));
            goto done;
        }
        tokens[id] = c;
        add_ids[na++] = (int)id;
    }
    int k = 0;
    if (merges) cJSON_ArrayForEach(it, merges) {
        const char *a = NULL, *b = NULL;
        if (cJSON_IsString(it)) {
            mstr[k] = strdup(it->valuestring);
        } else if (cJSON_IsArray(it) && cJSON_GetArraySize(it) == 2 &&
                   cJSON_IsString(cJSON_GetArrayItem(it, 0)) && cJSON_IsString(cJSON_GetArrayItem(it, 1))) {
            a = cJSON_GetArrayItem(it, 0)->valuestring;
            b = cJSON_GetArrayItem(it, 1)->valuestring;
            if (strchr(a, ' ') || strchr(b, ' ')) {
                rc = moh_fail(err, MOH_E_FORMAT, "%s: model.merges[%d]: a part contains a space", label, k);
                goto done;
            }
            mstr[k] = malloc(strlen(a) + strlen(b) + 2);
            if (mstr[k]) sprintf(mstr[k], "%s %s", a, b);
        } else {
            rc = moh_fail(err, MOH_E_FORMAT, "%s: model.merges[%d]: expected \"A B\" or [\"A\", \"B\"]", label, k);
            goto done;
        }
        if (!mstr[k]) {
            rc = moh_fail(err, MOH_E_NOMEM, "%s: out of memory", label);
            goto done;
        }
        k++;
    }
    bpe_spec spec = {.tokens = tokens, .n_tokens = (int)n_tok, .merges = (const char *const *)mstr,
                     .n_merges = k, .added = add_ids, .n_added = na, .pre = BPE_PRE_CUSTOM};
    const cJSON *im = cJSON_GetObjectItemCaseSensitive(model, "ignore_merges");
    spec.ignore_merges = cJSON_IsTrue(im);
    const cJSON *pre = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    if (pre && !cJSON_IsNull(pre) && (rc = tj_pre(pre, &spec, label, err))) goto done;
    tj_named_pre(&spec);
    spec.source = label;
    rc = bpe_create(out, &spec, err);
    if (rc && err && strncmp(err->msg, label, strlen(label)) != 0) {
        char tmp[sizeof err->msg];
        snprintf(tmp, sizeof tmp, "%s", err->msg);
        moh_fail(err, rc, "%s: %s", label, tmp);
    }
done:
    for (int i = 0; i < n_m; i++) free(mstr[i]);
    free(mstr);
    free(tokens);
    free(add_ids);
    return rc;
}

int bpe_from_tokenizer_json(bpe_tok **out, const char *text, size_t len, const char *label,
                            moh_error *err) {
    *out = NULL;
    json_reader rd = {label, JSON_STYLE_VIT, err};
    cJSON *root = NULL;
    int rc = json_parse_text(&rd, text, len, &root);
    if (rc) return rc;
    if (!cJSON_IsObject(root)) rc = tj_fail(label, err, "expected a JSON object");
    else rc = tj_build(out, root, label, err);
    cJSON_Delete(root);
    return rc;
}

int bpe_load_tokenizer_json(bpe_tok **out, const char *path, moh_error *err) {
    *out = NULL;
    size_t len;
    char *text = fs_read_file(path, (size_t)1 << 30, &len, err);
    if (!text) return MOH_E_IO;
    int rc = bpe_from_tokenizer_json(out, text, len, path, err);
    free(text);
    return rc;
}

/* ---- tokenizer.json writer ---- */

static cJSON *tj_obj(const char *type) {
    cJSON *o = cJSON_CreateObject();
    if (o) cJSON_AddStringToObject(o, "type", type);
    return o;
}

static cJSON *tj_byte_level(bool use_regex) {
    cJSON *o = tj_obj("ByteLevel");
    cJSON_AddBoolToObject(o, "add_prefix_space", false);
    cJSON_AddBoolToObject(o, "trim_offsets", true);
    cJSON_AddBoolToObject(o, "use_regex", use_regex);
    return o;
}

/* The pre-tokenizer of t as tokenizers writes it: each regex stage in order (Digits for the digit
 * patterns, Split Isolated otherwise), then ByteLevel, which splits with the GPT-2 regex itself
 * when that is the last stage (it maps bytes, so no stage may follow it); a Sequence when more
 * than one. tj_pre reads each form back to the same regexes. */
static cJSON *tj_pre_json(const bpe_tok *t) {
    const char *st[BPE_MAX_REGEX + 1];
    int n = 0;
    switch (t->pre) {
    case BPE_PRE_GPT2: st[n++] = GPT2_RE; break;
    case BPE_PRE_SMOLLM: st[n++] = DIGIT_RE; st[n++] = GPT2_RE; break;
    case BPE_PRE_LLAMA3: st[n++] = LLAMA3_RE; break;
    default:
        for (int i = 0; i < BPE_MAX_REGEX && t->pattern[i]; i++) st[n++] = t->pattern[i];
    }
    cJSON *list = cJSON_CreateArray();
    const bool last_gpt2 = n > 0 && !strcmp(st[n - 1], GPT2_RE);
    for (int i = 0; i < n - (last_gpt2 ? 1 : 0); i++) {
        cJSON *o;
        if (!strcmp(st[i], DIGIT_RE) || !strcmp(st[i], DIGIT_RE "+")) {
            o = tj_obj("Digits");
            cJSON_AddBoolToObject(o, "individual_digits", !strcmp(st[i], DIGIT_RE));
        } else {
            o = tj_obj("Split");
            cJSON *pat = cJSON_AddObjectToObject(o, "pattern");
            cJSON_AddStringToObject(pat, "Regex", st[i]);
            cJSON_AddStringToObject(o, "behavior", "Isolated");
            cJSON_AddBoolToObject(o, "invert", false);
        }
        cJSON_AddItemToArray(list, o);
    }
    cJSON_AddItemToArray(list, tj_byte_level(last_gpt2));
    if (cJSON_GetArraySize(list) == 1) {
        cJSON *one = cJSON_DetachItemFromArray(list, 0);
        cJSON_Delete(list);
        return one;
    }
    cJSON *seq = tj_obj("Sequence");
    cJSON_AddItemToObject(seq, "pretokenizers", list);
    return seq;
}

typedef struct merge_rec { int rank, a, b; } merge_rec;
static int cmp_merge_rec(const void *x, const void *y) {
    const merge_rec *p = x, *q = y;
    return (p->rank > q->rank) - (p->rank < q->rank);
}
static int cmp_int(const void *x, const void *y) {
    const int a = *(const int *)x, b = *(const int *)y;
    return (a > b) - (a < b);
}

int bpe_to_tokenizer_json(const bpe_tok *t, char **json, size_t *len, moh_error *err) {
    *json = NULL;
    *len = 0;
    size_t nm = 0;
    for (size_t i = 0; i < t->merge_cap; i++) nm += t->merges[i].key != 0;
    merge_rec *mr = malloc((nm + 1) * sizeof *mr);
    int *added = malloc(((size_t)t->n_added + 1) * sizeof(int));
    cJSON *root = cJSON_CreateObject();
    char *buf = NULL, *out = NULL;
    if (!mr || !added || !root) goto nomem;
    nm = 0;
    for (size_t i = 0; i < t->merge_cap; i++)
        if (t->merges[i].key) {
            const uint64_t k = t->merges[i].key - 1;
            mr[nm++] = (merge_rec){t->merges[i].rank, (int)(uint32_t)(k >> 32), (int)(uint32_t)k};
        }
    qsort(mr, nm, sizeof *mr, cmp_merge_rec);
    memcpy(added, t->added, (size_t)t->n_added * sizeof(int));
    qsort(added, (size_t)t->n_added, sizeof(int), cmp_int);

    cJSON_AddStringToObject(root, "version", "1.0");
    cJSON_AddNullToObject(root, "truncation");
    cJSON_AddNullToObject(root, "padding");
    cJSON *al = cJSON_AddArrayToObject(root, "added_tokens");
    for (int i = 0; i < t->n_added; i++) { /* all special: matched first, leftmost-longest, as moh does */
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "id", added[i]);
        cJSON_AddStringToObject(o, "content", t->str[added[i]]);
        cJSON_AddBoolToObject(o, "single_word", false);
        cJSON_AddBoolToObject(o, "lstrip", false);
        cJSON_AddBoolToObject(o, "rstrip", false);
        cJSON_AddBoolToObject(o, "normalized", false);
        cJSON_AddBoolToObject(o, "special", true);
        cJSON_AddItemToArray(al, o);
    }
    cJSON_AddNullToObject(root, "normalizer");
    cJSON_AddItemToObject(root, "pre_tokenizer", tj_pre_json(t));
    cJSON_AddNullToObject(root, "post_processor");
    cJSON *dec = tj_obj("ByteLevel");
    cJSON_AddBoolToObject(dec, "add_prefix_space", true);
    cJSON_AddBoolToObject(dec, "trim_offsets", true);
    cJSON_AddBoolToObject(dec, "use_regex", true);
    cJSON_AddItemToObject(root, "decoder", dec);
    cJSON *model = cJSON_AddObjectToObject(root, "model");
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON_AddNullToObject(model, "dropout");
    cJSON_AddNullToObject(model, "unk_token");
    cJSON_AddNullToObject(model, "continuing_subword_prefix");
    cJSON_AddNullToObject(model, "end_of_word_suffix");
    cJSON_AddBoolToObject(model, "fuse_unk", false);
    cJSON_AddBoolToObject(model, "byte_fallback", false);
    cJSON_AddBoolToObject(model, "ignore_merges", t->ignore_merges);
    cJSON *vocab = cJSON_AddObjectToObject(model, "vocab");
    for (int i = 0; i < t->n_tokens; i++)
        if (t->str[i]) cJSON_AddItemToObject(vocab, t->str[i], cJSON_CreateNumber(i));
    cJSON *ml = cJSON_AddArrayToObject(model, "merges");
    size_t cap = 0;
    for (size_t i = 0; i < nm; i++) {
        const size_t need = strlen(t->str[mr[i].a]) + strlen(t->str[mr[i].b]) + 2;
        if (need > cap) {
            free(buf);
            cap = need * 2;
            if (!(buf = malloc(cap))) goto nomem;
        }
        snprintf(buf, cap, "%s %s", t->str[mr[i].a], t->str[mr[i].b]);
        cJSON_AddItemToArray(ml, cJSON_CreateString(buf));
    }
    if (!al || !model || !vocab || !ml || (size_t)cJSON_GetArraySize(ml) != nm)
        goto nomem;
    if (!(out = cJSON_PrintUnformatted(root))) goto nomem;
    *json = out;
    *len = strlen(out);
    free(buf);
    free(mr);
    free(added);
    cJSON_Delete(root);
    return MOH_OK;
nomem:
    free(buf);
    free(mr);
    free(added);
    cJSON_Delete(root);
    return moh_fail(err, MOH_E_NOMEM, "tokenizer.json: out of memory");
}

/* ---- tokenizer_config.json ---- */

int bpe_read_tokenizer_config(const bpe_tok *t, const char *text, size_t len, const char *label, int *eos_id,
                              char **chat_template, moh_error *err) {
    *eos_id = -1;
    *chat_template = NULL;
    json_reader rd = {label, JSON_STYLE_VIT, err};
    cJSON *root = NULL;
    int rc = json_parse_text(&rd, text, len, &root);
    if (rc) return rc;
    char q[96];
    if (!cJSON_IsObject(root)) rc = tj_fail(label, err, "expected a JSON object");
    const cJSON *eos = rc ? NULL : cJSON_GetObjectItemCaseSensitive(root, "eos_token");
    if (cJSON_IsObject(eos)) eos = cJSON_GetObjectItemCaseSensitive(eos, "content"); /* an AddedToken */
    if (cJSON_IsString(eos) && (*eos_id = bpe_token_id(t, eos->valuestring)) < 0)
        rc = moh_fail(err, MOH_E_FORMAT, "%s: eos_token '%s' is not a token of the tokenizer", label,
                      json_quote(q, sizeof q, eos->valuestring, 64, 16));
    const cJSON *ct = rc ? NULL : cJSON_GetObjectItemCaseSensitive(root, "chat_template"), *it;
    if (cJSON_IsArray(ct)) /* named templates: [{"name": "default", "template": "..."}, ...] */
        cJSON_ArrayForEach(it, ct) {
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(it, "name");
            if (cJSON_IsString(name) && !strcmp(name->valuestring, "default")) {
                ct = cJSON_GetObjectItemCaseSensitive(it, "template");
                break;
            }
        }
    if (cJSON_IsString(ct) && !(*chat_template = strdup(ct->valuestring)))
        rc = moh_fail(err, MOH_E_NOMEM, "%s: out of memory", label);
    if (rc) *eos_id = -1;
    cJSON_Delete(root);
    return rc;
}

char *bpe_tokenizer_config_json(const bpe_tok *t, int eos_id, const char *chat_template) {
    cJSON *j = cJSON_CreateObject();
    if (!j) return NULL;
    cJSON_AddStringToObject(j, "tokenizer_class", "PreTrainedTokenizerFast");
    cJSON_AddBoolToObject(j, "clean_up_tokenization_spaces", false);
    const char *eos = bpe_token_str(t, eos_id);
    if (eos) cJSON_AddStringToObject(j, "eos_token", eos);
    if (chat_template) cJSON_AddStringToObject(j, "chat_template", chat_template);
    char *s = cJSON_Print(j);
    cJSON_Delete(j);
    return s;
}

/* ---- accessors for writers ---- */

bpe_pre bpe_pre_kind(const bpe_tok *t) { return t->pre; }

const char *bpe_source(const bpe_tok *t) { return t->source; }

bool bpe_is_added(const bpe_tok *t, int id) {
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i] == id) return true;
    return false;
}

int bpe_merge_ids(const bpe_tok *t, int **left, int **right, int *n, moh_error *err) {
    *left = *right = NULL;
    *n = 0;
    /* ranks are < the spec's merge count and unique (a repeat keeps its first rank): place each
     * entry at its rank, then close the gaps */
    int max_rank = -1;
    for (size_t i = 0; i < t->merge_cap; i++)
        if (t->merges[i].key && t->merges[i].rank > max_rank) max_rank = t->merges[i].rank;
    if (max_rank < 0) return MOH_OK;
    int *l = malloc(sizeof(int) * (size_t)(max_rank + 1)), *r = malloc(sizeof(int) * (size_t)(max_rank + 1));
    if (!l || !r) {
        free(l);
        free(r);
        return moh_fail(err, MOH_E_NOMEM, "tokenizer merges: out of memory");
    }
    for (int k = 0; k <= max_rank; k++) l[k] = -1;
    for (size_t i = 0; i < t->merge_cap; i++)
        if (t->merges[i].key) {
            const uint64_t key = t->merges[i].key - 1;
            l[t->merges[i].rank] = (int)(uint32_t)(key >> 32);
            r[t->merges[i].rank] = (int)(uint32_t)key;
        }
    int m = 0;
    for (int k = 0; k <= max_rank; k++)
        if (l[k] >= 0) {
            l[m] = l[k];
            r[m++] = r[k];
        }
    *left = l;
    *right = r;
    *n = m;
    return MOH_OK;
}
