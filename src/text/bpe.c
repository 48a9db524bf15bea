/* Byte-level BPE tokenizer (see bpe.h). Regexes: the GPT-2 pattern of Hugging Face `tokenizers`'
 * ByteLevel pre-tokenizer and the LLaMA-3 pattern of its tokenizer.json; which `pre` names use
 * which follows llama.cpp's llama-vocab.cpp. The merge loop follows the BPE algorithm of
 * Sennrich et al. as `tokenizers` applies it: lowest rank first, leftmost on ties.
 *
 * tokenizer.json is read as `tokenizers` 0.23 reads it (serialization.rs, models/bpe, pre_tokenizers,
 * processors, added_vocabulary.rs; checked with tools/ref/bpe_strict_fixtures.py). Refused, with
 * the reference's reason:
 * - a top-level key other than its nine (its reader fails on one), version other than the string
 *   "1.0" (Unknown tokenizer version), a key given twice in an object (it keeps the last, cJSON
 *   the first);
 * - model: type other than "BPE"; merges missing (Missing vocab/merges), mixing "A B" strings and
 *   pairs (MergeType), a string not two parts split on one space (BadMerges), a part or result not
 *   in the vocab (MergeTokenOutOfVocabulary); "#version" lines are skipped as it does; vocab and
 *   added ids not integer literals in 0..2^32-1 (1.0, 1e0, -0 are floats to serde); booleans
 *   (fuse_unk, byte_fallback, ignore_merges, ByteLevel's, Digits', Split's invert, added-token
 *   flags) not true/false; dropout outside 0..1;
 * - added_tokens: not an array (null too), an entry without all of id, content, single_word,
 *   lstrip, rstrip, normalized, special; ids are the reference's (the vocab's id of the content,
 *   else the next from the vocab size on; "" skipped), so a given id that differs is refused;
 * - pre_tokenizer Split without invert, a behavior it does not know; TemplateProcessing without
 *   pair, with a special token missing from special_tokens (it panics), single using B.
 * Refused because the reference applies them and moh does not (never ignored): a normalizer
 * (NFC, NFKC, Lowercase, Prepend, Replace, ...; NFC needs a Unicode library moh does not link),
 * truncation, padding, dropout > 0, continuing_subword_prefix, end_of_word_suffix (but ""), unk_token or
 * byte_fallback true when a byte has no token (moh drops it), add_prefix_space, Split behaviors
 * other than Isolated and invert true, pre-tokenizers other than ByteLevel / Digits / Split /
 * Sequence, a stage after ByteLevel or no ByteLevel (moh maps bytes last), lstrip / rstrip /
 * single_word, post-processors other than ByteLevel / TemplateProcessing (Roberta, Bert), a
 * decoder other than ByteLevel.
 * Honoured: added tokens with "normalized": true matched in a second pass (the reference's
 * split_normalized_trie), TemplateProcessing's single template (bpe_encode_special), Split
 * {"String"} patterns, \p{L} / \p{N} / \s with Oniguruma's Unicode 16 classes and Digits with
 * Rust's (re_onig).
 * Stricter than the reference, as moh keeps tokens in an array by id: a vocab id at or past the
 * vocab + added count, two tokens with one id, a pair merge part holding a space, a template id
 * that is not a token. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "text/bpe.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
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
    bool *norm;                   /* [n_tokens] added token matched in the second pass */
    int *post;                    /* post-processor ids: n_pre before the text, n_suf after */
    int n_pre, n_suf;
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
    free(t->norm);
    free(t->post);
    free(t);
}

/* ---- Unicode classes as tokenizers has them ----
 * tokenizers matches its regexes with Oniguruma (Unicode 16.0) and splits Digits with Rust's
 * char::is_numeric (Unicode 17.0); PCRE2 10.42 has Unicode 14.0. The code points their \p{L},
 * \p{N} and \s hold beyond PCRE2's (tools/ref/bpe_strict_fixtures.py lists them), and Oniguruma's
 * \s (PCRE2's also holds U+180E): */
#define ONIG_L_MORE                                                                                    \
    "\\x{1C89}-\\x{1C8A}\\x{A7CB}-\\x{A7CD}\\x{A7DA}-\\x{A7DC}\\x{105C0}-\\x{105F3}\\x{10D4A}-\\x{10D65}" \
    "\\x{10D6F}-\\x{10D85}\\x{10EC2}-\\x{10EC4}\\x{1123F}-\\x{11240}\\x{11380}-\\x{11389}\\x{1138B}"     \
    "\\x{1138E}\\x{11390}-\\x{113B5}\\x{113B7}\\x{113D1}\\x{113D3}\\x{11BC0}-\\x{11BE0}\\x{11F02}"       \
    "\\x{11F04}-\\x{11F10}\\x{11F12}-\\x{11F33}\\x{1342F}\\x{13441}-\\x{13446}\\x{13460}-\\x{143FA}"     \
    "\\x{16100}-\\x{1611D}\\x{16D40}-\\x{16D6C}\\x{18CFF}\\x{1B132}\\x{1B155}\\x{1DF25}-\\x{1DF2A}"      \
    "\\x{1E030}-\\x{1E06D}\\x{1E4D0}-\\x{1E4EB}\\x{1E5D0}-\\x{1E5ED}\\x{1E5F0}\\x{2B739}"                \
    "\\x{2EBF0}-\\x{2EE5D}\\x{31350}-\\x{323AF}"
#define ONIG_N_MORE                                                                                    \
    "\\x{10D40}-\\x{10D49}\\x{116D0}-\\x{116E3}\\x{11BF0}-\\x{11BF9}\\x{11F50}-\\x{11F59}"              \
    "\\x{16130}-\\x{16139}\\x{16D70}-\\x{16D79}\\x{1CCF0}-\\x{1CCF9}\\x{1D2C0}-\\x{1D2D3}"              \
    "\\x{1E4F0}-\\x{1E4F9}\\x{1E5F1}-\\x{1E5FA}"
#define RUST_N_MORE "\\x{11DE0}-\\x{11DE9}\\x{16FF4}-\\x{16FF6}" /* Unicode 17 digits */
#define ONIG_S "\\t-\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"

typedef struct sbuf { char *p; size_t n, cap; bool oom; } sbuf;
static void sb_put(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t c = (b->n + n + 1) * 2;
        char *q = realloc(b->p, c);
        if (!q) { b->oom = true; return; }
        b->p = q;
        b->cap = c;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}
static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

/* pat with \p{L}, \p{N}, \s and their negations widened to tokenizers' classes (digits: the Digits
 * pre-tokenizer's, Rust's is_numeric) into *out (malloc'd). A negated one inside a character
 * class cannot be widened there: MOH_E_FORMAT. */
static int re_onig(const char *pat, bool digits, char **out, moh_error *err) {
    sbuf b = {0};
    bool in_class = false;
    char q[96];
    sb_str(&b, "");
    for (const char *s = pat; *s;) {
        if (*s == '[') {
            const char *st = s++;
            if (in_class) { /* a POSIX class [:name:] */
                if (*s == ':') {
                    const char *e = strstr(s, ":]");
                    if (e) s = e + 2;
                }
            } else {
                in_class = true;
                if (*s == '^') s++;
                if (*s == ']') s++; /* a literal ] first */
            }
            sb_put(&b, st, (size_t)(s - st));
            continue;
        }
        if (*s == ']' && in_class) in_class = false;
        if (*s != '\\' || !s[1]) {
            sb_put(&b, s++, 1);
            continue;
        }
        const char c = s[1];
        if (c == 'Q') { /* quoted up to \E */
            const char *e = strstr(s + 2, "\\E");
            size_t n = e ? (size_t)(e + 2 - s) : strlen(s);
            sb_put(&b, s, n);
            s += n;
            continue;
        }
        const char *more = NULL, *name = NULL;
        bool neg = c == 'P' || c == 'S';
        size_t skip = 2;
        if (c == 'p' || c == 'P') {
            char nm[16] = {0};
            if (s[2] == '{') {
                const char *e = strchr(s + 3, '}');
                if (e && e - s - 3 < (long)sizeof nm) {
                    memcpy(nm, s + 3, (size_t)(e - s - 3));
                    skip = (size_t)(e + 1 - s);
                }
            } else if (s[2]) {
                nm[0] = s[2];
                skip = 3;
            }
            const char *n0 = nm;
            if (*n0 == '^') neg = !neg, n0++;
            if (!strcmp(n0, "L") || !strcmp(n0, "Letter")) name = "\\p{L}", more = ONIG_L_MORE;
            else if (!strcmp(n0, "N") || !strcmp(n0, "Number")) name = "\\p{N}", more = digits ? ONIG_N_MORE RUST_N_MORE : ONIG_N_MORE;
        } else if (c == 's' || c == 'S') {
            name = "", more = ONIG_S;
        }
        if (!more) {
            sb_put(&b, s, 2);
            s += 2;
            continue;
        }
        if (neg && in_class) {
            free(b.p);
            return moh_fail(err, MOH_E_FORMAT, "tokenizer regex '%s': a negated \\%c inside [...] cannot take "
                            "tokenizers' Unicode classes (rewrite it as a negated class)",
                            json_quote(q, sizeof q, pat, 64, 16), c);
        }
        if (!in_class) sb_str(&b, neg ? "[^" : "[");
        sb_str(&b, name);
        sb_str(&b, more);
        if (!in_class) sb_str(&b, "]");
        s += skip;
    }
    if (b.oom) {
        free(b.p);
        return moh_fail(err, MOH_E_NOMEM, "tokenizer regex: out of memory");
    }
    *out = b.p;
    return MOH_OK;
}

static int compile_re(bpe_tok *t, const char *pat, moh_error *err) {
    int code;
    PCRE2_SIZE off;
    char *onig = NULL;
    int rc = re_onig(pat, !strcmp(pat, DIGIT_RE) || !strcmp(pat, DIGIT_RE "+"), &onig, err);
    if (rc) return rc;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)onig, PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &code, &off,
                                   NULL);
    free(onig);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(code, msg, sizeof msg);
        char q[96];
        return moh_fail(err, MOH_E_FORMAT, "tokenizer regex '%s': %s", json_quote(q, sizeof q, pat, 64, 16),
                        (const char *)msg);
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
    t->norm = calloc((size_t)n, sizeof *t->norm);
    t->post = malloc(((size_t)spec->n_post_prefix + (size_t)spec->n_post_suffix + 1) * sizeof(int));
    int rc = MOH_OK;
    if (!t->bytes || !t->len || !t->str || !t->by_bytes.slot || !t->by_str.slot || !t->merges ||
        !t->added || !t->norm || !t->post) {
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
        if (spec->added_normalized && spec->added_normalized[i]) t->norm[id] = true;
    }
    if (spec->n_post_prefix < 0 || spec->n_post_suffix < 0) {
        rc = moh_fail(err, MOH_E_ARG, "bpe_create: bad post-processor counts");
        goto fail;
    }
    for (int i = 0; i < spec->n_post_prefix + spec->n_post_suffix; i++) {
        int id = i < spec->n_post_prefix ? spec->post_prefix[i] : spec->post_suffix[i - spec->n_post_prefix];
        if (id < 0 || id >= n || !t->str[id]) {
            rc = moh_fail(err, MOH_E_FORMAT, "tokenizer post-processor: id %d is not a token", id);
            goto fail;
        }
        t->post[i] = id;
    }
    t->n_pre = spec->n_post_prefix;
    t->n_suf = spec->n_post_suffix;
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

/* The added token of pass norm starting at s[0..n) (longest), or -1. */
static int added_at(const bpe_tok *t, bool norm, const uint8_t *s, size_t n) {
    for (int k = t->added_first[s[0]]; k < t->added_first[s[0] + 1]; k++) {
        int id = t->added[k];
        if (t->norm[id] == norm && t->len[id] <= n && memcmp(t->bytes[id], s, t->len[id]) == 0) return id;
    }
    return -1;
}

/* s[0..n) as tokenizers' AddedVocabulary splits it: pass 0 matches the added tokens with
 * "normalized": false (leftmost, then longest), pass 1 those with true in the gaps, pass 2 runs
 * the pre-tokenizer and BPE on what is left. */
static int encode_seg(const bpe_tok *t, work *w, int pass, const uint8_t *s, size_t n, ids_buf *out) {
    if (pass == 2) return n ? pre_split(t, w, 0, s, n, out) : MOH_OK;
    size_t seg = 0;
    for (size_t i = 0; i < n;) {
        int id = added_at(t, pass == 1, s + i, n - i);
        if (id < 0) {
            i++;
            continue;
        }
        int rc = encode_seg(t, w, pass + 1, s + seg, i - seg, out);
        if (rc == MOH_OK) rc = ids_push(out, id);
        if (rc) return rc;
        i += t->len[id];
        seg = i;
    }
    return encode_seg(t, w, pass + 1, s + seg, n - seg, out);
}

int bpe_encode(const bpe_tok *t, const uint8_t *text, size_t len, bool parse_added, int **ids,
               size_t *n_ids, moh_error *err) {
    *ids = NULL;
    *n_ids = 0;
    if (len > INT_MAX) return moh_fail(err, MOH_E_ARG, "bpe_encode: text of %zu bytes (max %d)", len, INT_MAX);
    ids_buf out = {0};
    work w = {0};
    w.md = pcre2_match_data_create(1, NULL);
    int rc = w.md ? encode_seg(t, &w, parse_added && t->n_added ? 0 : 2, text, len, &out) : MOH_E_NOMEM;
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

int bpe_encode_special(const bpe_tok *t, const uint8_t *text, size_t len, int **ids, size_t *n_ids,
                       moh_error *err) {
    int rc = bpe_encode(t, text, len, true, ids, n_ids, err);
    if (rc || t->n_pre + t->n_suf == 0) return rc;
    const size_t n = *n_ids, all = n + (size_t)t->n_pre + (size_t)t->n_suf;
    int *v = malloc(all * sizeof *v);
    if (!v) {
        free(*ids);
        *ids = NULL;
        *n_ids = 0;
        return moh_fail(err, MOH_E_NOMEM, "bpe_encode: out of memory");
    }
    memcpy(v, t->post, (size_t)t->n_pre * sizeof *v);
    if (n) memcpy(v + t->n_pre, *ids, n * sizeof *v);
    memcpy(v + t->n_pre + n, t->post + t->n_pre, (size_t)t->n_suf * sizeof *v);
    free(*ids);
    *ids = v;
    *n_ids = all;
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

typedef struct tj_ctx {
    const char *label;
    moh_error *err;
    bpe_spec *spec;
    char *own[BPE_MAX_REGEX]; /* regexes made here (owned) */
    int n_own;
    bool byte_level;         /* the ByteLevel stage was seen */
    int tpl;                 /* TemplateProcessing post-processors seen */
    int *post;               /* [n_pre + n_suf] their ids (owned) */
    int n_pre, n_suf;
} tj_ctx;

static int tj_err(tj_ctx *c, const char *fmt, ...) {
    char msg[sizeof c->err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return moh_fail(c->err, MOH_E_FORMAT, "%s: %s", c->label, msg);
}

static int tj_fail(const char *label, moh_error *err, const char *what) {
    return moh_fail(err, MOH_E_FORMAT, "%s: %s", label, what);
}

/* Scans text for the next number literal after *p; 1 when it is digits only (what serde reads as
 * an unsigned integer: 1.0, 1e0, -0 are floats to it), 0 otherwise, -1 when none is left. */
static int tj_next_literal(const char **p, const char *end) {
    const char *s = *p;
    while (s < end) {
        if (*s == '"') {
            for (s++; s < end && *s != '"'; s++)
                if (*s == '\\') s++;
            s++;
        } else if (*s == '-' || (*s >= '0' && *s <= '9')) {
            int whole = 1;
            for (; s < end && strchr("+-.eE0123456789", *s); s++)
                if (!(*s >= '0' && *s <= '9')) whole = 0;
            *p = s;
            return whole;
        } else {
            s++;
        }
    }
    *p = s;
    return -1;
}

/* Marks every number of the tree j (cJSON keeps text order) with valueint 1 when its literal is
 * an unsigned integer, else 0 (cJSON keeps only the double). */
static void tj_mark_ints(cJSON *j, const char **p, const char *end) {
    for (; j; j = j->next) {
        if (cJSON_IsNumber(j)) j->valueint = tj_next_literal(p, end) == 1;
        if (j->child) tj_mark_ints(j->child, p, end);
    }
}

/* A u32 as serde reads one: an integer literal in 0..2^32-1. */
static bool tj_is_u32(const cJSON *j) {
    return cJSON_IsNumber(j) && j->valueint == 1 && j->valuedouble >= 0 && j->valuedouble <= 4294967295.0;
}

/* Key key of object o as a bool into *out: req, it must be there; null_ok, null reads as absent
 * (an Option<bool>); absent leaves *out. where names o in the message. */
static int tj_bool(tj_ctx *c, const cJSON *o, const char *where, const char *key, bool req, bool null_ok, bool *out) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    if ((!j && !req) || (cJSON_IsNull(j) && null_ok)) return MOH_OK;
    if (!j) return tj_err(c, "%s: missing field \"%s\" (true or false)", where, key);
    if (!cJSON_IsBool(j)) return tj_err(c, "%s: %s: expected true or false", where, key);
    *out = cJSON_IsTrue(j);
    return MOH_OK;
}

/* A key given twice in object o (tokenizers keeps the last or refuses; cJSON reads the first):
 * refused. */
static int tj_no_dups(tj_ctx *c, const cJSON *o, const char *where) {
    for (const cJSON *a = o ? o->child : NULL; a; a = a->next)
        for (const cJSON *b = a->next; b; b = b->next)
            if (a->string && b->string && !strcmp(a->string, b->string)) {
                char q[96];
                return tj_err(c, "%s: key '%s' given twice", where, json_quote(q, sizeof q, a->string, 64, 16));
            }
    return MOH_OK;
}

/* The "type" string of object j, or NULL. */
static const char *tj_type(const cJSON *j) {
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(j, "type");
    return cJSON_IsString(ty) ? ty->valuestring : NULL;
}

static int tj_add_regex(tj_ctx *c, const char *re, bool own) {
    bpe_spec *spec = c->spec;
    if (spec->n_regex >= BPE_MAX_REGEX) {
        if (own) free((char *)re);
        return tj_err(c, "pre_tokenizer: more than %d splitting stages", BPE_MAX_REGEX);
    }
    if (own) c->own[c->n_own++] = (char *)re;
    spec->pre_regex[spec->n_regex++] = re;
    return MOH_OK;
}

/* Appends the regexes of one pre-tokenizer object j to spec (recursing into a Sequence). */
static int tj_pre(tj_ctx *c, const cJSON *j, int depth) {
    char q[96];
    const char *ty = cJSON_IsObject(j) ? tj_type(j) : NULL;
    int rc;
    if (!ty) return tj_err(c, "pre_tokenizer: expected an object with a string \"type\"");
    if ((rc = tj_no_dups(c, j, "pre_tokenizer"))) return rc;
    if (c->byte_level) /* ByteLevel maps every byte to a character: moh does that last */
        return tj_err(c, "pre_tokenizer: %s after ByteLevel is not applied by moh (expected ByteLevel as the last stage)",
                      json_quote(q, sizeof q, ty, 64, 16));
    if (!strcmp(ty, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(j, "pretokenizers"), *it;
        if (!cJSON_IsArray(list)) return tj_err(c, "pre_tokenizer Sequence: expected an array \"pretokenizers\"");
        if (depth > 8) return tj_err(c, "pre_tokenizer: Sequences nested more than 8 deep");
        cJSON_ArrayForEach(it, list) if ((rc = tj_pre(c, it, depth + 1))) return rc;
        return MOH_OK;
    }
    if (!strcmp(ty, "ByteLevel")) {
        bool aps = false, trim = false, ur = true;
        if ((rc = tj_bool(c, j, "pre_tokenizer ByteLevel", "add_prefix_space", true, false, &aps)) ||
            (rc = tj_bool(c, j, "pre_tokenizer ByteLevel", "trim_offsets", true, false, &trim)) ||
            (rc = tj_bool(c, j, "pre_tokenizer ByteLevel", "use_regex", false, false, &ur)))
            return rc;
        if (aps) return tj_err(c, "pre_tokenizer ByteLevel: add_prefix_space true is not applied by moh (expected false)");
        c->byte_level = true;
        return ur ? tj_add_regex(c, GPT2_RE, false) : MOH_OK;
    }
    if (!strcmp(ty, "Digits")) {
        bool ind = false;
        if ((rc = tj_bool(c, j, "pre_tokenizer Digits", "individual_digits", true, false, &ind))) return rc;
        return tj_add_regex(c, ind ? DIGIT_RE : DIGIT_RE "+", false);
    }
    if (!strcmp(ty, "Split")) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(j, "pattern");
        const cJSON *re = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
        const cJSON *str = cJSON_GetObjectItemCaseSensitive(pat, "String");
        const cJSON *beh = cJSON_GetObjectItemCaseSensitive(j, "behavior");
        bool inv = false;
        if (!cJSON_IsObject(pat) || cJSON_GetArraySize(pat) != 1 || !(cJSON_IsString(re) || cJSON_IsString(str)))
            return tj_err(c, "pre_tokenizer Split: expected \"pattern\": {\"Regex\": \"...\"} or {\"String\": \"...\"}");
        static const char *const behs[] = {"Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
        if (!cJSON_IsString(beh)) return tj_err(c, "pre_tokenizer Split: missing string \"behavior\"");
        if (strcmp(beh->valuestring, "Isolated")) {
            for (int i = 0; i < 4; i++)
                if (!strcmp(beh->valuestring, behs[i]))
                    return tj_err(c, "pre_tokenizer Split: behavior %s is not applied by moh (expected Isolated)", behs[i]);
            return tj_err(c, "pre_tokenizer Split: behavior '%s' is not one of Removed, Isolated, MergedWithPrevious, "
                          "MergedWithNext, Contiguous", json_quote(q, sizeof q, beh->valuestring, 64, 16));
        }
        if ((rc = tj_bool(c, j, "pre_tokenizer Split", "invert", true, false, &inv))) return rc;
        if (inv) return tj_err(c, "pre_tokenizer Split: invert true is not applied by moh (expected false)");
        const char *src = cJSON_IsString(re) ? re->valuestring : str->valuestring;
        if (cJSON_IsString(re) && strcmp(src, DIGIT_RE) && strcmp(src, DIGIT_RE "+")) return tj_add_regex(c, src, false);
        /* a literal String (escaped), or a Regex that reads as Digits' (Oniguruma's \p{N}, not Rust's) */
        char *own = malloc(2 * strlen(src) + 8), *o = own;
        if (!own) return moh_fail(c->err, MOH_E_NOMEM, "%s: out of memory", c->label);
        o += sprintf(o, "(?:");
        for (const char *s = src; *s; s++) {
            if (cJSON_IsString(str) && strchr("\\^$.|?*+()[]{}-#&~ \t\n\r\f\v", *s) && *s) *o++ = '\\';
            if (cJSON_IsString(str) && strchr("\t\n\r\f\v", *s)) { /* \n etc. as escapes */
                static const char esc[] = {'\t', 't', '\n', 'n', '\r', 'r', '\f', 'f', '\v', 'v'};
                for (int e = 0; e < 10; e += 2)
                    if (esc[e] == *s) *o++ = esc[e + 1];
                continue;
            }
            *o++ = *s;
        }
        sprintf(o, ")");
        return tj_add_regex(c, own, true);
    }
    return tj_err(c, "pre_tokenizer type '%s' is not applied by moh (expected ByteLevel, Digits, Split, Sequence)",
                  json_quote(q, sizeof q, ty, 64, 16));
}

/* One Piece of a TemplateProcessing template: *seq 'A' / 'B' for a Sequence, else its special
 * token's entry in specials (*st). */
static int tj_piece(tj_ctx *c, const cJSON *p, const cJSON *specials, char *seq, const cJSON **st) {
    *seq = 0;
    *st = NULL;
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(p, "SpecialToken"), *q = cJSON_GetObjectItemCaseSensitive(p, "Sequence");
    const cJSON *x = s ? s : q;
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(x, "id"), *tid = cJSON_GetObjectItemCaseSensitive(x, "type_id");
    if (!cJSON_IsObject(p) || cJSON_GetArraySize(p) != 1 || !cJSON_IsObject(x) || !cJSON_IsString(id) || !tj_is_u32(tid))
        return tj_err(c, "post_processor TemplateProcessing: expected pieces {\"SpecialToken\" or \"Sequence\": "
                      "{\"id\": \"...\", \"type_id\": n}}");
    if (q) {
        if (strcmp(id->valuestring, "A") && strcmp(id->valuestring, "B"))
            return tj_err(c, "post_processor TemplateProcessing: Sequence id must be A or B");
        *seq = id->valuestring[0];
        return MOH_OK;
    }
    *st = cJSON_GetObjectItemCaseSensitive(specials, id->valuestring);
    char qq[96];
    if (!*st) /* tokenizers panics on it */
        return tj_err(c, "post_processor TemplateProcessing: special token '%s' missing from special_tokens",
                      json_quote(qq, sizeof qq, id->valuestring, 64, 16));
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(*st, "ids"), *toks = cJSON_GetObjectItemCaseSensitive(*st, "tokens"), *it;
    if (!cJSON_IsArray(ids) || !cJSON_IsArray(toks) || cJSON_GetArraySize(ids) != cJSON_GetArraySize(toks) ||
        !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(*st, "id")))
        return tj_err(c, "post_processor TemplateProcessing: special token '%s': expected {\"id\", \"ids\", \"tokens\"} "
                      "with as many ids as tokens", json_quote(qq, sizeof qq, id->valuestring, 64, 16));
    cJSON_ArrayForEach(it, ids) if (!tj_is_u32(it))
        return tj_err(c, "post_processor TemplateProcessing: special token '%s': ids must be integers in 0..2^32-1",
                      json_quote(qq, sizeof qq, id->valuestring, 64, 16));
    cJSON_ArrayForEach(it, toks) if (!cJSON_IsString(it))
        return tj_err(c, "post_processor TemplateProcessing: special token '%s': tokens must be strings",
                      json_quote(qq, sizeof qq, id->valuestring, 64, 16));
    return MOH_OK;
}

/* One post-processor object j (recursing into a Sequence): ByteLevel (offsets only) or
 * TemplateProcessing, whose "single" template gives the ids around one text. */
static int tj_post(tj_ctx *c, const cJSON *j, int depth) {
    char q[96];
    const char *ty = cJSON_IsObject(j) ? tj_type(j) : NULL;
    int rc;
    if (!ty) return tj_err(c, "post_processor: expected an object with a string \"type\"");
    if ((rc = tj_no_dups(c, j, "post_processor"))) return rc;
    if (!strcmp(ty, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(j, "processors"), *it;
        if (!cJSON_IsArray(list)) return tj_err(c, "post_processor Sequence: expected an array \"processors\"");
        if (depth > 8) return tj_err(c, "post_processor: Sequences nested more than 8 deep");
        cJSON_ArrayForEach(it, list) if ((rc = tj_post(c, it, depth + 1))) return rc;
        return MOH_OK;
    }
    if (!strcmp(ty, "ByteLevel")) { /* trims offsets; the ids stay */
        bool b = false;
        if ((rc = tj_bool(c, j, "post_processor ByteLevel", "add_prefix_space", true, false, &b)) ||
            (rc = tj_bool(c, j, "post_processor ByteLevel", "trim_offsets", true, false, &b)) ||
            (rc = tj_bool(c, j, "post_processor ByteLevel", "use_regex", false, false, &b)))
            return rc;
        return MOH_OK;
    }
    if (strcmp(ty, "TemplateProcessing"))
        return tj_err(c, "post_processor type '%s' is not applied by moh (expected null, ByteLevel, TemplateProcessing, "
                      "Sequence)", json_quote(q, sizeof q, ty, 64, 16));
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(j, "single"), *pair = cJSON_GetObjectItemCaseSensitive(j, "pair");
    const cJSON *specials = cJSON_GetObjectItemCaseSensitive(j, "special_tokens"), *it;
    if (!cJSON_IsArray(single) || !cJSON_IsArray(pair) || !cJSON_IsObject(specials))
        return tj_err(c, "post_processor TemplateProcessing: expected arrays \"single\", \"pair\" and an object "
                      "\"special_tokens\"");
    if (c->tpl++) return tj_err(c, "post_processor: a second TemplateProcessing is not applied by moh (expected one)");
    int na = 0, nb = 0;
    cJSON_ArrayForEach(it, pair) {
        char seq;
        const cJSON *st;
        if ((rc = tj_piece(c, it, specials, &seq, &st))) return rc;
        na += seq == 'A';
        nb += seq == 'B';
    }
    if (!na || !nb) return tj_err(c, "post_processor TemplateProcessing: pair must use both sequences A and B");
    int n_ids = 0;
    na = nb = 0;
    cJSON_ArrayForEach(it, single) {
        char seq;
        const cJSON *st;
        if ((rc = tj_piece(c, it, specials, &seq, &st))) return rc;
        na += seq == 'A';
        nb += seq == 'B';
        if (st) n_ids += cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(st, "ids"));
    }
    if (na != 1 || nb) return tj_err(c, "post_processor TemplateProcessing: single must hold sequence A once (moh encodes "
                                     "one text), not %d A and %d B", na, nb);
    if (!(c->post = malloc(((size_t)n_ids + 1) * sizeof(int))))
        return moh_fail(c->err, MOH_E_NOMEM, "%s: out of memory", c->label);
    bool after = false;
    cJSON_ArrayForEach(it, single) {
        char seq;
        const cJSON *st, *id;
        tj_piece(c, it, specials, &seq, &st);
        if (seq) after = true;
        else cJSON_ArrayForEach(id, cJSON_GetObjectItemCaseSensitive(st, "ids")) {
                c->post[c->n_pre + c->n_suf] = id->valuedouble <= INT_MAX ? (int)id->valuedouble : -1;
                if (after) c->n_suf++;
                else c->n_pre++;
            }
    }
    return MOH_OK;
}

/* The normalizer: null, or a Sequence of none (nothing to apply). */
static int tj_normalizer(tj_ctx *c, const cJSON *j) {
    char q[96];
    if (!j || cJSON_IsNull(j)) return MOH_OK;
    const char *ty = cJSON_IsObject(j) ? tj_type(j) : NULL;
    if (!ty) return tj_err(c, "normalizer: expected null or an object with a string \"type\"");
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(j, "normalizers"), *it;
    if (!strcmp(ty, "Sequence") && cJSON_IsArray(list)) {
        cJSON_ArrayForEach(it, list) {
            int rc = cJSON_IsObject(it) ? tj_normalizer(c, it) : tj_err(c, "normalizer Sequence: expected objects");
            if (rc) return rc;
        }
        return MOH_OK;
    }
    return tj_err(c, "normalizer: %s is not applied by moh (expected null)", json_quote(q, sizeof q, ty, 64, 16));
}

/* The decoder: null or ByteLevel (byte-level tokens back to bytes, what bpe_decode does). */
static int tj_decoder(tj_ctx *c, const cJSON *j) {
    char q[96];
    int rc;
    if (!j || cJSON_IsNull(j)) return MOH_OK;
    const char *ty = cJSON_IsObject(j) ? tj_type(j) : NULL;
    if (!ty) return tj_err(c, "decoder: expected null or an object with a string \"type\"");
    if (strcmp(ty, "ByteLevel"))
        return tj_err(c, "decoder: %s is not applied by moh (expected null or ByteLevel)", json_quote(q, sizeof q, ty, 64, 16));
    bool b = false;
    if ((rc = tj_no_dups(c, j, "decoder")) ||
        (rc = tj_bool(c, j, "decoder ByteLevel", "add_prefix_space", true, false, &b)) ||
        (rc = tj_bool(c, j, "decoder ByteLevel", "trim_offsets", true, false, &b)) ||
        (rc = tj_bool(c, j, "decoder ByteLevel", "use_regex", false, false, &b)))
        return rc;
    return MOH_OK;
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

/* The model fields other than vocab and merges (read before them). */
static int tj_model_flags(tj_ctx *c, const cJSON *model, bool *needs_all_bytes) {
    char q[96];
    int rc;
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(model, "type");
    if (ty && (!cJSON_IsString(ty) || strcmp(ty->valuestring, "BPE")))
        return tj_err(c, "model.type: %s is not applied by moh (expected \"BPE\")",
                      cJSON_IsString(ty) ? json_quote(q, sizeof q, ty->valuestring, 64, 16) : "not a string");
    const cJSON *dr = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if (dr && !cJSON_IsNull(dr)) {
        if (!cJSON_IsNumber(dr) || !(dr->valuedouble >= 0 && dr->valuedouble <= 1))
            return tj_err(c, "model.dropout: expected null or a number in 0..1");
        if (dr->valuedouble != 0) /* 0 is no dropout to tokenizers */
            return tj_err(c, "model.dropout: %g is not applied by moh (expected null or 0)", dr->valuedouble);
    }
    static const char *const strs[] = {"continuing_subword_prefix", "end_of_word_suffix", "unk_token"};
    for (int i = 0; i < 3; i++) {
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(model, strs[i]);
        if (!x || cJSON_IsNull(x)) continue;
        if (!cJSON_IsString(x)) return tj_err(c, "model.%s: expected null or a string", strs[i]);
        if (i < 2 && !x->valuestring[0]) continue; /* "" adds nothing (GPT-2's tokenizer.json) */
        if (i < 2) return tj_err(c, "model.%s: '%s' is not applied by moh (expected null or \"\")", strs[i],
                                 json_quote(q, sizeof q, x->valuestring, 64, 16));
        *needs_all_bytes = true; /* unk_token: used only for a byte without a token */
    }
    bool b = false, fallback = false, im = false;
    if ((rc = tj_bool(c, model, "model", "fuse_unk", false, true, &b)) ||
        (rc = tj_bool(c, model, "model", "byte_fallback", false, true, &fallback)) ||
        (rc = tj_bool(c, model, "model", "ignore_merges", false, true, &im)))
        return rc;
    if (fallback) *needs_all_bytes = true; /* likewise */
    c->spec->ignore_merges = im;
    return MOH_OK;
}

static int tj_build(bpe_tok **out, const cJSON *root, const char *label, moh_error *err) {
    static const char *const top[] = {"version", "truncation", "padding", "added_tokens", "normalizer",
                                      "pre_tokenizer", "post_processor", "decoder", "model"};
    bpe_spec spec = {.pre = BPE_PRE_CUSTOM, .source = label};
    tj_ctx cx = {.label = label, .err = err, .spec = &spec}, *c = &cx;
    char q[96];
    const cJSON *it;
    int rc = tj_no_dups(c, root, "top level");
    for (it = root->child; it && !rc; it = it->next) {
        size_t k = 0;
        while (k < 9 && strcmp(it->string, top[k])) k++;
        if (k == 9) /* tokenizers' reader leaves its value unread and fails */
            rc = tj_err(c, "unknown top-level field '%s' (tokenizers refuses it; expected version, truncation, padding, "
                        "added_tokens, normalizer, pre_tokenizer, post_processor, decoder, model)",
                        json_quote(q, sizeof q, it->string, 64, 16));
    }
    if (rc) return rc;
    const cJSON *ver = cJSON_GetObjectItemCaseSensitive(root, "version");
    if (ver && (!cJSON_IsString(ver) || strcmp(ver->valuestring, "1.0")))
        return tj_err(c, "version: %s, expected \"1.0\" (tokenizers knows no other)",
                      cJSON_IsString(ver) ? json_quote(q, sizeof q, ver->valuestring, 64, 16) : "not a string");
    static const char *const nul[] = {"truncation", "padding"};
    for (int i = 0; i < 2; i++) {
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(root, nul[i]);
        if (x && !cJSON_IsNull(x)) return tj_err(c, "%s: not applied by moh (expected null)", nul[i]);
    }
    if ((rc = tj_normalizer(c, cJSON_GetObjectItemCaseSensitive(root, "normalizer")))) return rc;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (!cJSON_IsObject(model)) return tj_fail(label, err, "expected an object \"model\"");
    bool all_bytes = false;
    if ((rc = tj_no_dups(c, model, "model")) || (rc = tj_model_flags(c, model, &all_bytes))) return rc;
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    if (!cJSON_IsObject(vocab)) return tj_fail(label, err, "model.vocab: expected an object {token: id}");
    if (!cJSON_IsArray(merges)) return tj_fail(label, err, "model.merges: expected an array (tokenizers requires it)");
    if (added && !cJSON_IsArray(added)) return tj_fail(label, err, "added_tokens: expected an array");
    /* Ids: the vocab's, all < the vocab size + added count (tokenizers allows any u32; moh keeps
     * an array by id). */
    int n_vocab = cJSON_GetArraySize(vocab), n_add = added ? cJSON_GetArraySize(added) : 0;
    long limit = (long)n_vocab + n_add, n_tok = 0;
    cJSON_ArrayForEach(it, vocab) {
        if (!tj_is_u32(it) || it->valuedouble >= (double)limit)
            return tj_err(c, "model.vocab '%s': id must be an integer in 0..%ld", json_quote(q, sizeof q, it->string, 64, 16),
                          limit - 1);
        if ((long)it->valuedouble + 1 > n_tok) n_tok = (long)it->valuedouble + 1;
    }
    if (n_vocab == 0) return tj_fail(label, err, "model.vocab: empty");
    static const char *const flags[] = {"single_word", "lstrip", "rstrip", "normalized", "special"};
    cJSON_ArrayForEach(it, added) {
        const cJSON *cj = cJSON_GetObjectItemCaseSensitive(it, "content"), *idj = cJSON_GetObjectItemCaseSensitive(it, "id");
        if (!cJSON_IsObject(it) || !cJSON_IsString(cj))
            return tj_fail(label, err, "added_tokens: expected objects with \"id\" and a string \"content\"");
        if (!tj_is_u32(idj))
            return tj_err(c, "added_tokens '%s': id must be an integer in 0..2^32-1", json_quote(q, sizeof q, cj->valuestring, 64, 16));
        if ((rc = tj_no_dups(c, it, "added_tokens"))) return rc;
        for (int f = 0; f < 5; f++) {
            bool v = false;
            if ((rc = tj_bool(c, it, "added_tokens", flags[f], true, false, &v))) return rc;
            if (v && f < 3)
                return tj_err(c, "added token '%s': %s true is not applied by moh (expected false)",
                              json_quote(q, sizeof q, cj->valuestring, 64, 16), flags[f]);
        }
        if ((long)idj->valuedouble + 1 > n_tok) n_tok = (long)idj->valuedouble + 1;
    }
    if (n_tok > limit) n_tok = limit; /* an added id past it is refused below */
    const char **tokens = calloc((size_t)n_tok, sizeof *tokens);
    int n_m = cJSON_GetArraySize(merges);
    char **mstr = calloc((size_t)n_m + 1, sizeof *mstr);
    int *add_ids = malloc(((size_t)n_add + 1) * sizeof(int));
    bool *add_norm = calloc((size_t)n_add + 1, sizeof(bool));
    if (!tokens || !mstr || !add_ids || !add_norm) {
        rc = moh_fail(err, MOH_E_NOMEM, "%s: out of memory", label);
        goto done;
    }
    cJSON_ArrayForEach(it, vocab) {
        long id = (long)it->valuedouble;
        if (tokens[id]) {
            rc = moh_fail(err, MOH_E_FORMAT, "%s: model.vocab: id %ld given twice", label, id);
            goto done;
        }
        tokens[id] = it->string;
    }
    if (all_bytes) /* unk_token / byte_fallback act only on a byte without a token */
        for (int b = 0; b < 256; b++) {
            char sp[4];
            bpe_byte_spelling(b, sp);
            if (!cJSON_GetObjectItemCaseSensitive(vocab, sp)) {
                const cJSON *u = cJSON_GetObjectItemCaseSensitive(model, "unk_token");
                rc = tj_err(c, "model.%s is not applied by moh, which drops byte 0x%02X (it has no token; expected %s)",
                            cJSON_IsString(u) ? "unk_token" : "byte_fallback", b,
                            cJSON_IsString(u) ? "null" : "false");
                goto done;
            }
        }
    /* Added ids as tokenizers assigns them (the "id" given is only checked): the vocab's id of
     * the content, else the id of the same content earlier in the list, else the next one from
     * the vocab's size on. Empty contents are skipped. */
    int na = 0;
    long next = n_vocab;
    cJSON_ArrayForEach(it, added) {
        const char *cont = cJSON_GetObjectItemCaseSensitive(it, "content")->valuestring;
        long given = (long)cJSON_GetObjectItemCaseSensitive(it, "id")->valuedouble, id = -1;
        if (!cont[0]) continue;
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(vocab, cont);
        if (v) id = (long)v->valuedouble;
        for (int k = 0; k < na && id < 0; k++)
            if (!strcmp(tokens[add_ids[k]], cont)) id = add_ids[k];
        if (id < 0) id = next++;
        if (given != id) {
            rc = tj_err(c, "added token '%s': id %ld, but tokenizers gives it id %ld (expected %ld)",
                        json_quote(q, sizeof q, cont, 64, 16), given, id, id);
            goto done;
        }
        if (!v && id < n_tok && tokens[id] && strcmp(tokens[id], cont)) {
            char q2[96];
            rc = tj_err(c, "added token '%s': id %ld is token '%s' in model.vocab", json_quote(q, sizeof q, cont, 64, 16),
                        id, json_quote(q2, sizeof q2, tokens[id], 64, 16));
            goto done;
        }
        bool nz = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(it, "normalized"));
        int k = 0;
        while (k < na && add_ids[k] != id) k++;
        add_norm[k] = nz; /* a repeat: the last flags win */
        if (k < na) continue;
        tokens[id] = cont;
        add_ids[na++] = (int)id;
    }
    int k = 0;
    int n_str = 0, n_pair = 0;
    cJSON_ArrayForEach(it, merges) {
        if (cJSON_IsString(it)) n_str++;
        else n_pair++;
    }
    if (n_str && n_pair) { /* tokenizers reads either form, not both */
        rc = tj_fail(label, err, "model.merges: mixes \"A B\" strings and [\"A\", \"B\"] pairs (expected one form)");
        goto done;
    }
    cJSON_ArrayForEach(it, merges) {
        const char *a = NULL, *b = NULL;
        if (cJSON_IsString(it)) {
            if (!strncmp(it->valuestring, "#version", 8)) continue; /* a merges.txt header: skipped */
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
    spec.tokens = tokens;
    spec.n_tokens = (int)n_tok;
    spec.merges = (const char *const *)mstr;
    spec.n_merges = k;
    spec.added = add_ids;
    spec.n_added = na;
    spec.added_normalized = add_norm;
    const cJSON *pre = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    if (pre && !cJSON_IsNull(pre) && (rc = tj_pre(c, pre, 0))) goto done;
    if (!cx.byte_level) {
        rc = tj_fail(label, err, "pre_tokenizer: no ByteLevel stage; moh's BPE runs on bytes (expected ByteLevel, or a "
                     "Sequence ending in ByteLevel)");
        goto done;
    }
    const cJSON *post = cJSON_GetObjectItemCaseSensitive(root, "post_processor");
    if (post && !cJSON_IsNull(post) && (rc = tj_post(c, post, 0))) goto done;
    if ((rc = tj_decoder(c, cJSON_GetObjectItemCaseSensitive(root, "decoder")))) goto done;
    spec.post_prefix = cx.post;
    spec.n_post_prefix = cx.n_pre;
    spec.post_suffix = cx.post ? cx.post + cx.n_pre : NULL;
    spec.n_post_suffix = cx.n_suf;
    tj_named_pre(&spec);
    rc = bpe_create(out, &spec, err);
    if (rc && err && strncmp(err->msg, label, strlen(label)) != 0) {
        char tmp[sizeof err->msg];
        snprintf(tmp, sizeof tmp, "%s", err->msg);
        moh_fail(err, rc, "%s: %s", label, tmp);
    }
done:
    for (int i = 0; i < n_m; i++) free(mstr ? mstr[i] : NULL);
    for (int i = 0; i < cx.n_own; i++) free(cx.own[i]);
    free(cx.post);
    free(mstr);
    free(tokens);
    free(add_ids);
    free(add_norm);
    return rc;
}

int bpe_from_tokenizer_json(bpe_tok **out, const char *text, size_t len, const char *label,
                            moh_error *err) {
    *out = NULL;
    json_reader rd = {label, JSON_STYLE_VIT, err};
    cJSON *root = NULL;
    int rc = json_parse_text(&rd, text, len, &root);
    if (rc) return rc;
    const char *p = text;
    tj_mark_ints(root, &p, text + len);
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

/* The post-processor ids of t as a TemplateProcessing: each id a special token of its own. */
static cJSON *tj_template_json(const bpe_tok *t) {
    cJSON *o = tj_obj("TemplateProcessing"), *single = cJSON_AddArrayToObject(o, "single");
    cJSON *pair = cJSON_AddArrayToObject(o, "pair"), *sp = cJSON_AddObjectToObject(o, "special_tokens");
    for (int lst = 0; lst < 2; lst++) {
        cJSON *l = lst ? pair : single;
        for (int i = 0; i <= t->n_pre + t->n_suf; i++) {
            const bool seq = i == t->n_pre;
            cJSON *p = cJSON_CreateObject(), *x = cJSON_AddObjectToObject(p, seq ? "Sequence" : "SpecialToken");
            cJSON_AddStringToObject(x, "id", seq ? "A" : t->str[t->post[i - (i > t->n_pre)]]);
            cJSON_AddNumberToObject(x, "type_id", 0);
            cJSON_AddItemToArray(l, p);
        }
    }
    cJSON *b = cJSON_CreateObject(), *x = cJSON_AddObjectToObject(b, "Sequence");
    cJSON_AddStringToObject(x, "id", "B");
    cJSON_AddNumberToObject(x, "type_id", 1);
    cJSON_AddItemToArray(pair, b);
    for (int i = 0; i < t->n_pre + t->n_suf; i++) {
        const char *s = t->str[t->post[i]];
        if (cJSON_GetObjectItemCaseSensitive(sp, s)) continue;
        cJSON *e = cJSON_AddObjectToObject(sp, s);
        cJSON_AddStringToObject(e, "id", s);
        cJSON_AddItemToObject(e, "ids", cJSON_CreateIntArray(&t->post[i], 1));
        cJSON_AddItemToObject(e, "tokens", cJSON_CreateStringArray(&s, 1));
    }
    return o;
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
        cJSON_AddBoolToObject(o, "normalized", t->norm[added[i]]);
        cJSON_AddBoolToObject(o, "special", true);
        cJSON_AddItemToArray(al, o);
    }
    cJSON_AddNullToObject(root, "normalizer");
    cJSON_AddItemToObject(root, "pre_tokenizer", tj_pre_json(t));
    if (t->n_pre + t->n_suf) cJSON_AddItemToObject(root, "post_processor", tj_template_json(t));
    else cJSON_AddNullToObject(root, "post_processor");
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

void bpe_post_ids(const bpe_tok *t, const int **prefix, int *n_prefix, const int **suffix, int *n_suffix) {
    *n_prefix = t->n_pre;
    *n_suffix = t->n_suf;
    *prefix = t->n_pre ? t->post : NULL;
    *suffix = t->n_suf ? t->post + t->n_pre : NULL;
}

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
