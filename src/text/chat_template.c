/* Chat templates: a Jinja-subset renderer (the subset and its rules in chat_template.h). The
 * template is cut into tokens once; the interpreter walks them, running a block or only parsing it
 * (exec false) to find its end, and replays a for-loop's body per item. */
#include "text/chat_template.h"

#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 64      /* nesting of blocks and parentheses */
#define MAX_VARS 256      /* live variables */
#define MAX_OUT ((size_t)64 << 20)

enum { T_TEXT, T_VAR_BEGIN, T_VAR_END, T_BLOCK_BEGIN, T_BLOCK_END, T_NAME, T_STR, T_INT, T_OP, T_EOF };

typedef struct tok {
    int kind;
    const char *s;  /* text, name, operator, decoded string (arena) */
    size_t n;
    long v;         /* T_INT */
    size_t at;      /* byte offset in the template */
} tok;

enum { V_UNDEF, V_NONE, V_BOOL, V_INT, V_STR, V_LIST, V_DICT, V_LOOP };

typedef struct jv {
    int k;
    long i;                /* bool / int; loop: index0 */
    const char *s;         /* string */
    size_t n;              /* string length; list length; loop length */
    const chat_msg *m;     /* list start / the dict */
} jv;

typedef struct var { const char *name; size_t len; jv v; } var;

typedef struct ctx {
    const char *label;
    moh_error *err;
    int rc;
    tok *t;
    int nt, cap_t, pos;
    char **arena;          /* every allocation of the render */
    int na, cap_a;
    var vars[MAX_VARS];
    int nv;
    char *out;
    size_t len, cap;
    int depth;
} ctx;

static int fail(ctx *c, size_t at, const char *fmt, ...) {
    if (c->rc) return c->rc;
    char msg[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    char shown[4 * sizeof msg]; /* template text quoted in msg, control bytes as \xNN: one line */
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)msg; *p; p++)
        o += (size_t)snprintf(shown + o, sizeof shown - o, *p < 0x20 || *p == 0x7f ? "\\x%02x" : "%c", *p);
    c->rc = moh_fail(c->err, MOH_E_FORMAT, "%s: byte %zu: %s", c->label, at, shown);
    return c->rc;
}

static void *alloc(ctx *c, size_t n) {
    if (c->rc) return NULL;
    if (c->na == c->cap_a) {
        const int cap = c->cap_a ? 2 * c->cap_a : 64;
        char **a = realloc(c->arena, sizeof *a * (size_t)cap);
        if (!a) {
            c->rc = moh_fail(c->err, MOH_E_NOMEM, "%s: out of memory", c->label);
            return NULL;
        }
        c->arena = a;
        c->cap_a = cap;
    }
    char *p = malloc(n ? n : 1);
    if (!p) {
        c->rc = moh_fail(c->err, MOH_E_NOMEM, "%s: out of memory", c->label);
        return NULL;
    }
    c->arena[c->na++] = p;
    return p;
}

/* ---- lexer ------------------------------------------------------------------------------------ */

static void push_tok(ctx *c, tok t) {
    if (c->rc) return;
    if (c->nt == c->cap_t) {
        const int cap = c->cap_t ? 2 * c->cap_t : 256;
        tok *n = realloc(c->t, sizeof *n * (size_t)cap);
        if (!n) {
            c->rc = moh_fail(c->err, MOH_E_NOMEM, "%s: out of memory", c->label);
            return;
        }
        c->t = n;
        c->cap_t = cap;
    }
    c->t[c->nt++] = t;
}

static bool is_space(char ch) { return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\f' || ch == '\v'; }
static bool is_alpha(char ch) { return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_'; }
static bool is_digit(char ch) { return ch >= '0' && ch <= '9'; }

/* A string literal at p (quote q); decoded into the arena. Returns the byte after it. */
static const char *lex_string(ctx *c, const char *base, const char *p, const char *end) {
    const char q = *p++;
    char *d = alloc(c, (size_t)(end - p) + 1);
    if (!d) return end;
    size_t n = 0;
    const size_t at = (size_t)(p - 1 - base);
    for (; p < end && *p != q; p++) {
        if (*p != '\\') {
            d[n++] = *p;
            continue;
        }
        if (++p >= end) break;
        switch (*p) {
        case 'n': d[n++] = '\n'; break;
        case 't': d[n++] = '\t'; break;
        case 'r': d[n++] = '\r'; break;
        case '\\': d[n++] = '\\'; break;
        case '\'': d[n++] = '\''; break;
        case '"': d[n++] = '"'; break;
        case '\n': break; /* a line continuation */
        default: d[n++] = '\\'; d[n++] = *p; break; /* Python keeps unknown escapes */
        }
    }
    if (p >= end) {
        fail(c, at, "unterminated string literal");
        return end;
    }
    d[n] = '\0';
    push_tok(c, (tok){T_STR, d, n, 0, at});
    return p + 1;
}

/* The tokens of a tag's inside [p, end). */
static void lex_inside(ctx *c, const char *base, const char *p, const char *end) {
    static const char *const ops2[] = {"==", "!=", "<=", ">=", "//", "**"};
    while (p < end && !c->rc) {
        const size_t at = (size_t)(p - base);
        if (is_space(*p)) {
            p++;
        } else if (*p == '\'' || *p == '"') {
            p = lex_string(c, base, p, end);
        } else if (is_alpha(*p)) {
            const char *s = p;
            while (p < end && (is_alpha(*p) || is_digit(*p))) p++;
            push_tok(c, (tok){T_NAME, s, (size_t)(p - s), 0, at});
        } else if (is_digit(*p)) {
            long v = 0;
            while (p < end && is_digit(*p)) {
                if (v > (INT32_MAX - 9) / 10) {
                    fail(c, at, "integer literal too large");
                    return;
                }
                v = v * 10 + (*p++ - '0');
            }
            if (p < end && (*p == '.' || is_alpha(*p))) {
                fail(c, at, "only integer literals are rendered");
                return;
            }
            push_tok(c, (tok){T_INT, NULL, 0, v, at});
        } else {
            size_t n = 1;
            for (size_t i = 0; i < sizeof ops2 / sizeof ops2[0]; i++)
                if (p + 1 < end && p[0] == ops2[i][0] && p[1] == ops2[i][1]) n = 2;
            if (!strchr("=!<>+-~|.,:()[]{}*/%", *p)) {
                fail(c, at, "unexpected character '%c'", *p);
                return;
            }
            push_tok(c, (tok){T_OP, p, n, 0, at});
            p += n;
        }
    }
}

static void lex(ctx *c, const char *src) {
    const char *p = src;
    bool trim_next = false;   /* -%} / -}}: strip the whitespace that starts the next text */
    bool trim_newline = false; /* trim_blocks: drop one newline after a block tag */
    while (!c->rc) {
        const char *open = NULL;
        for (const char *q = p; *q && !open; q++)
            if (q[0] == '{' && (q[1] == '{' || q[1] == '%' || q[1] == '#')) open = q;
        const char *text_end = open ? open : p + strlen(p);
        const char *s = p;
        if (trim_next)
            while (s < text_end && is_space(*s)) s++;
        else if (trim_newline && s < text_end && *s == '\n') s++;
        else if (trim_newline && s + 1 < text_end && s[0] == '\r' && s[1] == '\n') s += 2;
        const char *e = text_end;
        if (open) {
            const bool minus = open[2] == '-', plus = open[2] == '+';
            if (minus) {
                while (e > s && is_space(e[-1])) e--;
            } else if (open[1] != '{' && !plus) { /* lstrip_blocks: blanks from the line start */
                const char *b = e;
                while (b > s && (b[-1] == ' ' || b[-1] == '\t')) b--;
                /* at a line start: the template's start, or after a newline (in this text or the
                 * one trim_blocks dropped); not after a tag on the same line */
                if (b == src || b[-1] == '\n') e = b;
            }
        }
        if (e > s) push_tok(c, (tok){T_TEXT, s, (size_t)(e - s), 0, (size_t)(s - src)});
        if (!open) break;
        const char kind = open[1];
        const char *in = open + 2 + (open[2] == '-' || open[2] == '+');
        const char close = kind == '{' ? '}' : kind == '%' ? '%' : '#';
        const char *q = in;
        if (kind == '#') {
            while (*q && !(q[0] == '#' && q[1] == '}')) q++;
        } else { /* the closing delimiter outside string literals */
            char quote = 0;
            for (; *q; q++) {
                if (quote) {
                    if (*q == '\\' && q[1]) q++;
                    else if (*q == quote) quote = 0;
                } else if (*q == '\'' || *q == '"') quote = *q;
                else if (q[0] == close && q[1] == '}') break;
                else if (q[0] == '-' && q[1] == close && q[2] == '}') break;
            }
        }
        if (!*q) {
            fail(c, (size_t)(open - src), "'%.2s' is never closed", open);
            return;
        }
        const bool minus_close = q[0] == '-';
        if (kind != '#') {
            push_tok(c, (tok){kind == '{' ? T_VAR_BEGIN : T_BLOCK_BEGIN, open, 2, 0, (size_t)(open - src)});
            lex_inside(c, src, in, q);
            push_tok(c, (tok){kind == '{' ? T_VAR_END : T_BLOCK_END, q, 2, 0, (size_t)(q - src)});
        }
        p = q + (minus_close ? 3 : 2);
        trim_next = minus_close;
        trim_newline = kind != '{';
    }
    push_tok(c, (tok){T_EOF, NULL, 0, 0, strlen(src)});
}

/* ---- values ----------------------------------------------------------------------------------- */

static jv mk_str(const char *s, size_t n) { return (jv){.k = V_STR, .s = s, .n = n}; }
static jv mk_int(long i) { return (jv){.k = V_INT, .i = i}; }
static jv mk_bool(bool b) { return (jv){.k = V_BOOL, .i = b}; }

static bool truthy(jv v) {
    switch (v.k) {
    case V_BOOL: case V_INT: return v.i != 0;
    case V_STR: case V_LIST: return v.n > 0;
    case V_DICT: case V_LOOP: return true;
    default: return false;
    }
}

static bool equal(jv a, jv b) {
    if ((a.k == V_INT || a.k == V_BOOL) && (b.k == V_INT || b.k == V_BOOL)) return a.i == b.i;
    if (a.k != b.k) return false;
    switch (a.k) {
    case V_STR: return a.n == b.n && !memcmp(a.s, b.s, a.n);
    case V_LIST: return a.n == b.n && a.m == b.m;
    case V_DICT: return a.m == b.m;
    default: return true; /* none, undefined */
    }
}

static const char *kind_name(int k) {
    static const char *const names[] = {"undefined", "none", "a boolean", "an integer", "a string", "a list",
                                        "a dict", "loop"};
    return names[k];
}

/* The text of a value as {{ }} prints it (Python's str). */
static jv to_str(ctx *c, jv v, size_t at) {
    char buf[32];
    switch (v.k) {
    case V_STR: return v;
    case V_UNDEF: return mk_str("", 0);
    case V_NONE: return mk_str("None", 4);
    case V_BOOL: return v.i ? mk_str("True", 4) : mk_str("False", 5);
    case V_INT: {
        const int n = snprintf(buf, sizeof buf, "%ld", v.i);
        char *d = alloc(c, (size_t)n + 1);
        if (!d) return mk_str("", 0);
        memcpy(d, buf, (size_t)n + 1);
        return mk_str(d, (size_t)n);
    }
    default: fail(c, at, "printing %s is not rendered by moh", kind_name(v.k)); return mk_str("", 0);
    }
}

static jv concat(ctx *c, jv a, jv b) {
    char *d = alloc(c, a.n + b.n + 1);
    if (!d) return mk_str("", 0);
    memcpy(d, a.s, a.n);
    memcpy(d + a.n, b.s, b.n);
    d[a.n + b.n] = '\0';
    return mk_str(d, a.n + b.n);
}

static void emit(ctx *c, const char *s, size_t n) {
    if (c->rc) return;
    if (c->len + n + 1 > MAX_OUT) {
        fail(c, c->t[c->pos < c->nt ? c->pos : c->nt - 1].at, "the rendering passes %zu bytes", MAX_OUT);
        return;
    }
    if (c->len + n + 1 > c->cap) {
        size_t cap = c->cap ? c->cap : 256;
        while (cap < c->len + n + 1) cap *= 2;
        char *o = realloc(c->out, cap);
        if (!o) {
            c->rc = moh_fail(c->err, MOH_E_NOMEM, "%s: out of memory", c->label);
            return;
        }
        c->out = o;
        c->cap = cap;
    }
    memcpy(c->out + c->len, s, n);
    c->len += n;
    c->out[c->len] = '\0';
}

/* ---- expressions ------------------------------------------------------------------------------- */

static tok *cur(ctx *c) { return &c->t[c->pos]; }
static bool is_op(const tok *t, const char *op) { return t->kind == T_OP && t->n == strlen(op) && !memcmp(t->s, op, t->n); }
static bool is_name(const tok *t, const char *w) {
    return t->kind == T_NAME && t->n == strlen(w) && !memcmp(t->s, w, t->n);
}
static void expect_op(ctx *c, const char *op) {
    if (is_op(cur(c), op)) c->pos++;
    else fail(c, cur(c)->at, "expected '%s'", op);
}

static jv expr(ctx *c, bool ev);

static jv lookup(ctx *c, const tok *name) {
    for (int i = c->nv - 1; i >= 0; i--)
        if (c->vars[i].len == name->n && !memcmp(c->vars[i].name, name->s, name->n)) return c->vars[i].v;
    return (jv){.k = V_UNDEF};
}

static void bind(ctx *c, const char *name, size_t len, jv v, size_t at) {
    if (c->nv == MAX_VARS) {
        fail(c, at, "more than %d variables", MAX_VARS);
        return;
    }
    c->vars[c->nv++] = (var){name, len, v};
}

/* Arguments of a call at '(' (already consumed): up to max, into args; the count. */
static int call_args(ctx *c, bool ev, jv *args, int max) {
    int n = 0;
    while (!c->rc && !is_op(cur(c), ")")) {
        if (cur(c)->kind == T_NAME && is_op(&c->t[c->pos + 1], "=")) {
            fail(c, cur(c)->at, "keyword arguments are not rendered by moh");
            return n;
        }
        const jv v = expr(c, ev);
        if (n < max) args[n] = v;
        n++;
        if (!is_op(cur(c), ",")) break;
        c->pos++;
    }
    expect_op(c, ")");
    return n;
}

static bool space_in(char ch, jv chars) { return chars.k == V_STR ? memchr(chars.s, ch, chars.n) != NULL : is_space(ch); }

/* A string method call (the name at tok m, '(' next). */
static jv method(ctx *c, bool ev, jv obj, const tok *m) {
    c->pos++; /* '(' */
    jv args[2] = {{0}, {0}};
    const int n = call_args(c, ev, args, 2);
    if (!ev || c->rc) return (jv){.k = V_UNDEF};
    if (obj.k != V_STR) {
        fail(c, m->at, "method '%.*s' of %s is not rendered by moh", (int)m->n, m->s, kind_name(obj.k));
        return (jv){.k = V_UNDEF};
    }
    const bool l = is_name(m, "strip") || is_name(m, "lstrip"), r = is_name(m, "strip") || is_name(m, "rstrip");
    if ((l || r) && n <= 1) {
        const jv chars = n ? args[0] : (jv){.k = V_NONE};
        size_t a = 0, b = obj.n;
        while (l && a < b && space_in(obj.s[a], chars)) a++;
        while (r && b > a && space_in(obj.s[b - 1], chars)) b--;
        return mk_str(obj.s + a, b - a);
    }
    if ((is_name(m, "startswith") || is_name(m, "endswith")) && n == 1 && args[0].k == V_STR) {
        const jv p = args[0];
        if (p.n > obj.n) return mk_bool(false);
        return mk_bool(!memcmp(m->s[0] == 's' ? obj.s : obj.s + obj.n - p.n, p.s, p.n));
    }
    fail(c, m->at, "method '%.*s' (%d arguments) is not rendered by moh", (int)m->n, m->s, n);
    return (jv){.k = V_UNDEF};
}

static jv attribute(ctx *c, jv obj, const char *name, size_t n, size_t at) {
    if (obj.k == V_DICT) {
        if (n == 4 && !memcmp(name, "role", 4)) return mk_str(obj.m->role, strlen(obj.m->role));
        if (n == 7 && !memcmp(name, "content", 7)) return mk_str(obj.m->content, strlen(obj.m->content));
        return (jv){.k = V_UNDEF};
    }
    if (obj.k == V_LOOP) {
        const long i = obj.i, len = (long)obj.n;
        static const char *const keys[] = {"index", "index0", "first", "last", "length", "revindex", "revindex0"};
        const long vals[] = {i + 1, i, i == 0, i == len - 1, len, len - i, len - i - 1};
        for (int k = 0; k < 7; k++)
            if (strlen(keys[k]) == n && !memcmp(keys[k], name, n)) return k == 2 || k == 3 ? mk_bool(vals[k]) : mk_int(vals[k]);
        fail(c, at, "loop.%.*s is not rendered by moh", (int)n, name);
        return (jv){.k = V_UNDEF};
    }
    if (obj.k == V_UNDEF) fail(c, at, "'%.*s' of an undefined value", (int)n, name);
    else if (obj.k != V_STR && obj.k != V_LIST) fail(c, at, "'%.*s' of %s", (int)n, name, kind_name(obj.k));
    return (jv){.k = V_UNDEF}; /* a string's or list's attribute: none that a template reads */
}

static long norm_index(long i, long n) { return i < 0 ? i + n : i; }

static size_t utf8_len(const char *s, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += ((unsigned char)s[i] & 0xC0) != 0x80;
    return k;
}

/* The byte offset of code point k of s[0..n) (n when k is past the end). */
static size_t utf8_offset(const char *s, size_t n, long k) {
    size_t i = 0;
    for (long seen = -1; i < n; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80 && ++seen == k) return i;
    return n;
}

/* obj[...] after '[' */
static jv subscript(ctx *c, bool ev, jv obj, size_t at) {
    jv a = {.k = V_NONE}, b = {.k = V_NONE};
    bool slice = false;
    if (!is_op(cur(c), ":")) a = expr(c, ev);
    if (is_op(cur(c), ":")) {
        slice = true;
        c->pos++;
        if (!is_op(cur(c), "]")) b = expr(c, ev);
        if (is_op(cur(c), ":")) {
            fail(c, cur(c)->at, "slice steps are not rendered by moh");
            return (jv){.k = V_UNDEF};
        }
    }
    expect_op(c, "]");
    if (!ev || c->rc) return (jv){.k = V_UNDEF};
    if (slice) {
        if ((obj.k != V_LIST && obj.k != V_STR) || (a.k != V_NONE && a.k != V_INT) || (b.k != V_NONE && b.k != V_INT)) {
            fail(c, at, "slicing %s is not rendered by moh", kind_name(obj.k));
            return (jv){.k = V_UNDEF};
        }
        const long n = obj.k == V_STR ? (long)utf8_len(obj.s, obj.n) : (long)obj.n; /* code points, as Python */
        long lo = a.k == V_INT ? norm_index(a.i, n) : 0, hi = b.k == V_INT ? norm_index(b.i, n) : n;
        lo = lo < 0 ? 0 : lo > n ? n : lo;
        hi = hi < lo ? lo : hi > n ? n : hi;
        jv r = obj;
        if (obj.k == V_LIST) {
            r.m = obj.m + lo;
            r.n = (size_t)(hi - lo);
        } else {
            const size_t bl = utf8_offset(obj.s, obj.n, lo), bh = utf8_offset(obj.s, obj.n, hi);
            r.s = obj.s + bl;
            r.n = bh - bl;
        }
        return r;
    }
    if (a.k == V_INT && obj.k == V_STR) { /* one code point */
        const long n = (long)utf8_len(obj.s, obj.n), i = norm_index(a.i, n);
        if (i < 0 || i >= n) {
            fail(c, at, "string index %ld out of range", a.i);
            return (jv){.k = V_UNDEF};
        }
        const size_t bl = utf8_offset(obj.s, obj.n, i), bh = utf8_offset(obj.s, obj.n, i + 1);
        return mk_str(obj.s + bl, bh - bl);
    }
    if (a.k == V_STR) return attribute(c, obj, a.s, a.n, at);
    if (a.k == V_INT && obj.k == V_LIST) {
        const long i = norm_index(a.i, (long)obj.n);
        if (i < 0 || i >= (long)obj.n) return (jv){.k = V_UNDEF};
        return (jv){.k = V_DICT, .m = obj.m + i};
    }
    fail(c, at, "%s[%s] is not rendered by moh", kind_name(obj.k), kind_name(a.k));
    return (jv){.k = V_UNDEF};
}

static jv filter(ctx *c, bool ev, jv v) {
    const tok *f = cur(c);
    if (f->kind != T_NAME) {
        fail(c, f->at, "expected a filter name");
        return v;
    }
    c->pos++;
    jv args[1];
    int n = 0;
    if (is_op(cur(c), "(")) {
        c->pos++;
        n = call_args(c, ev, args, 1);
    }
    if (!ev || c->rc) return (jv){.k = V_UNDEF};
    if (is_name(f, "trim") && n == 0 && v.k == V_STR) {
        size_t a = 0, b = v.n;
        while (a < b && is_space(v.s[a])) a++;
        while (b > a && is_space(v.s[b - 1])) b--;
        return mk_str(v.s + a, b - a);
    }
    if (is_name(f, "length") && n == 0 && (v.k == V_STR || v.k == V_LIST))
        return mk_int(v.k == V_STR ? (long)utf8_len(v.s, v.n) : (long)v.n);
    if (is_name(f, "string") && n == 0) return to_str(c, v, f->at);
    bool ascii = v.k == V_STR; /* (Python maps every script's case; moh ASCII only) */
    for (size_t i = 0; ascii && i < v.n; i++) ascii = (unsigned char)v.s[i] < 0x80;
    if ((is_name(f, "lower") || is_name(f, "upper")) && n == 0 && ascii) {
        char *d = alloc(c, v.n + 1);
        if (!d) return v;
        for (size_t i = 0; i < v.n; i++) {
            const char ch = v.s[i];
            d[i] = f->s[0] == 'l' ? (ch >= 'A' && ch <= 'Z' ? (char)(ch + 32) : ch)
                                  : (ch >= 'a' && ch <= 'z' ? (char)(ch - 32) : ch);
        }
        d[v.n] = '\0';
        return mk_str(d, v.n);
    }
    fail(c, f->at, "filter '%.*s' on %s is not rendered by moh", (int)f->n, f->s, kind_name(v.k));
    return (jv){.k = V_UNDEF};
}

static jv primary(ctx *c, bool ev) {
    tok *t = cur(c);
    const size_t at = t->at;
    if (++c->depth > MAX_DEPTH) {
        fail(c, at, "nested deeper than %d", MAX_DEPTH);
        return (jv){.k = V_UNDEF};
    }
    jv v = {.k = V_UNDEF};
    if (t->kind == T_STR) {
        c->pos++;
        v = mk_str(t->s, t->n);
        while (cur(c)->kind == T_STR) { /* adjacent literals join, as in Python */
            v = concat(c, v, mk_str(cur(c)->s, cur(c)->n));
            c->pos++;
        }
    } else if (t->kind == T_INT) {
        c->pos++;
        v = mk_int(t->v);
    } else if (is_op(t, "(")) {
        c->pos++;
        v = expr(c, ev);
        expect_op(c, ")");
    } else if (t->kind == T_NAME) {
        c->pos++;
        if (is_name(t, "true") || is_name(t, "True")) v = mk_bool(true);
        else if (is_name(t, "false") || is_name(t, "False")) v = mk_bool(false);
        else if (is_name(t, "none") || is_name(t, "None")) v = (jv){.k = V_NONE};
        else if (is_op(cur(c), "(")) { /* a function */
            c->pos++;
            jv args[1] = {{0}};
            const int n = call_args(c, ev, args, 1);
            if (ev && !c->rc && is_name(t, "raise_exception") && n == 1 && args[0].k == V_STR)
                fail(c, at, "the template raised: %.*s", (int)(args[0].n < 120 ? args[0].n : 120), args[0].s);
            else if (ev) fail(c, at, "function '%.*s' is not rendered by moh", (int)t->n, t->s);
        } else v = ev ? lookup(c, t) : (jv){.k = V_UNDEF};
    } else {
        fail(c, at, "unexpected '%.*s'%s", (int)(t->n ? t->n : 3), t->n ? t->s : "end",
             is_op(t, "[") || is_op(t, "{") ? " (list and dict literals are not rendered by moh)" : "");
    }
    for (;;) { /* postfix */
        tok *p = cur(c);
        if (is_op(p, ".") && c->t[c->pos + 1].kind == T_NAME) {
            tok *name = &c->t[c->pos + 1];
            c->pos += 2;
            if (is_op(cur(c), "(")) v = method(c, ev, v, name);
            else v = ev ? attribute(c, v, name->s, name->n, name->at) : v;
        } else if (is_op(p, "[")) {
            c->pos++;
            v = subscript(c, ev, v, p->at);
        } else if (is_op(p, "|")) {
            c->pos++;
            v = filter(c, ev, v);
        } else break;
        if (c->rc) break;
    }
    c->depth--;
    return v;
}

static jv unary(ctx *c, bool ev) {
    if (is_op(cur(c), "-")) {
        const size_t at = cur(c)->at;
        c->pos++;
        const jv v = unary(c, ev);
        if (!ev) return v;
        if (v.k != V_INT || v.i == LONG_MIN) fail(c, at, "'-' of %s", kind_name(v.k));
        return mk_int(-v.i);
    }
    return primary(c, ev);
}

/* * // % on integers (Python's floor division and modulo) */
static jv mul_expr(ctx *c, bool ev) {
    jv v = unary(c, ev);
    while (!c->rc && (is_op(cur(c), "*") || is_op(cur(c), "//") || is_op(cur(c), "%"))) {
        const tok *op = cur(c);
        c->pos++;
        const jv r = unary(c, ev);
        if (!ev) continue;
        long out = 0;
        if (v.k != V_INT || r.k != V_INT || (op->s[0] != '*' && r.i == 0) ||
            (op->s[0] == '*' && __builtin_mul_overflow(v.i, r.i, &out))) {
            fail(c, op->at, "'%.*s' of %s and %s is not rendered by moh", (int)op->n, op->s, kind_name(v.k),
                 kind_name(r.k));
            break;
        }
        if (op->s[0] != '*') {
            long q = v.i / r.i, m = v.i % r.i;
            if (m != 0 && ((m < 0) != (r.i < 0))) {
                q--;
                m += r.i;
            }
            out = op->s[0] == '%' ? m : q;
        }
        v = mk_int(out);
    }
    return v;
}

static jv concat_expr(ctx *c, bool ev) {
    jv v = mul_expr(c, ev);
    while (!c->rc && is_op(cur(c), "~")) {
        const size_t at = cur(c)->at;
        c->pos++;
        const jv r = mul_expr(c, ev);
        if (ev) v = concat(c, to_str(c, v, at), to_str(c, r, at));
    }
    return v;
}

static jv add_expr(ctx *c, bool ev) {
    jv v = concat_expr(c, ev);
    while (!c->rc && (is_op(cur(c), "+") || is_op(cur(c), "-"))) {
        const bool plus = cur(c)->s[0] == '+';
        const size_t at = cur(c)->at;
        c->pos++;
        const jv r = concat_expr(c, ev);
        if (!ev) continue;
        long out = 0;
        if (plus && v.k == V_STR && r.k == V_STR) v = concat(c, v, r);
        else if (v.k == V_INT && r.k == V_INT &&
                 !(plus ? __builtin_add_overflow(v.i, r.i, &out) : __builtin_sub_overflow(v.i, r.i, &out)))
            v = mk_int(out);
        else fail(c, at, "'%c' of %s and %s is not rendered by moh", plus ? '+' : '-', kind_name(v.k), kind_name(r.k));
    }
    return v;
}

static jv test_expr(ctx *c, bool ev, jv v) {
    c->pos++; /* is */
    bool neg = false;
    if (is_name(cur(c), "not")) {
        neg = true;
        c->pos++;
    }
    const tok *t = cur(c);
    if (t->kind != T_NAME) {
        fail(c, t->at, "expected a test name after 'is'");
        return v;
    }
    c->pos++;
    bool r = false;
    if (is_name(t, "defined")) r = v.k != V_UNDEF;
    else if (is_name(t, "undefined")) r = v.k == V_UNDEF;
    else if (is_name(t, "none")) r = v.k == V_NONE;
    else if (is_name(t, "string")) r = v.k == V_STR;
    else if (is_name(t, "number")) r = v.k == V_INT;
    else if (is_name(t, "true")) r = v.k == V_BOOL && v.i;
    else if (is_name(t, "false")) r = v.k == V_BOOL && !v.i;
    else if (ev) fail(c, t->at, "test '%.*s' is not rendered by moh", (int)t->n, t->s);
    return mk_bool(r != neg);
}

static jv compare(ctx *c, bool ev) {
    jv v = add_expr(c, ev);
    for (;;) {
        tok *t = cur(c);
        if (c->rc) return v;
        if (is_name(t, "is")) {
            v = test_expr(c, ev, v);
            continue;
        }
        const bool not_in = is_name(t, "not") && is_name(&c->t[c->pos + 1], "in");
        if (!(is_op(t, "==") || is_op(t, "!=") || is_op(t, "<") || is_op(t, ">") || is_op(t, "<=") || is_op(t, ">=") ||
              is_name(t, "in") || not_in))
            return v;
        c->pos += not_in ? 2 : 1;
        const jv r = add_expr(c, ev);
        if (!ev) continue;
        if (is_op(t, "==") || is_op(t, "!=")) {
            v = mk_bool(equal(v, r) == (t->s[0] == '='));
        } else if (is_name(t, "in") || not_in) {
            bool in = false;
            if (v.k == V_STR && r.k == V_STR)
                for (size_t i = 0; i + v.n <= r.n && !in; i++) in = !memcmp(r.s + i, v.s, v.n);
            else if (v.k == V_STR && r.k == V_DICT)
                in = (v.n == 4 && !memcmp(v.s, "role", 4)) || (v.n == 7 && !memcmp(v.s, "content", 7));
            else fail(c, t->at, "'in' of %s and %s is not rendered by moh", kind_name(v.k), kind_name(r.k));
            v = mk_bool(in != not_in);
        } else {
            int cmp = 0;
            if ((v.k == V_INT || v.k == V_BOOL) && (r.k == V_INT || r.k == V_BOOL)) cmp = (v.i > r.i) - (v.i < r.i);
            else if (v.k == V_STR && r.k == V_STR) {
                const int m = memcmp(v.s, r.s, v.n < r.n ? v.n : r.n);
                cmp = m ? m : (v.n > r.n) - (v.n < r.n);
            } else fail(c, t->at, "comparing %s and %s is not rendered by moh", kind_name(v.k), kind_name(r.k));
            const bool eq = t->n == 2;
            v = mk_bool(t->s[0] == '<' ? (cmp < 0 || (eq && cmp == 0)) : (cmp > 0 || (eq && cmp == 0)));
        }
    }
}

static jv not_expr(ctx *c, bool ev) {
    if (is_name(cur(c), "not")) {
        c->pos++;
        const jv v = not_expr(c, ev);
        return mk_bool(!truthy(v));
    }
    return compare(c, ev);
}

static jv and_expr(ctx *c, bool ev) {
    jv v = not_expr(c, ev);
    while (!c->rc && is_name(cur(c), "and")) {
        c->pos++;
        const bool go = ev && truthy(v);
        const jv r = not_expr(c, go);
        if (go) v = r;
    }
    return v;
}

static jv or_expr(ctx *c, bool ev) {
    jv v = and_expr(c, ev);
    while (!c->rc && is_name(cur(c), "or")) {
        c->pos++;
        const bool go = ev && !truthy(v);
        const jv r = and_expr(c, go);
        if (go) v = r;
    }
    return v;
}

static jv expr(ctx *c, bool ev) {
    if (++c->depth > MAX_DEPTH) {
        fail(c, cur(c)->at, "nested deeper than %d", MAX_DEPTH);
        return (jv){.k = V_UNDEF};
    }
    jv v = or_expr(c, ev);
    if (!c->rc && is_name(cur(c), "if")) { /* A if COND else B */
        c->pos++;
        const jv cond = or_expr(c, ev);
        const bool take = truthy(cond);
        jv other = {.k = V_UNDEF};
        if (is_name(cur(c), "else")) {
            c->pos++;
            other = expr(c, ev && !take);
        }
        if (ev && !take) v = other;
    }
    c->depth--;
    return v;
}

/* ---- statements --------------------------------------------------------------------------------- */

static void expect_block_end(ctx *c) {
    if (cur(c)->kind == T_BLOCK_END) c->pos++;
    else fail(c, cur(c)->at, "expected '%%}'");
}

/* Runs (exec) or skips tokens up to a tag this block does not own: elif, else, endif, endfor, or
 * the end. Returns that tag's name token (the position after it), or NULL at the end. */
static const tok *block(ctx *c, bool exec);

static void stmt_if(ctx *c, bool exec) {
    bool done = false;
    for (;;) {
        const jv cond = expr(c, exec && !done);
        expect_block_end(c);
        const bool take = exec && !done && truthy(cond);
        const tok *stop = block(c, take);
        done |= take;
        if (c->rc) return;
        if (stop && is_name(stop, "elif")) continue;
        if (stop && is_name(stop, "else")) {
            expect_block_end(c);
            stop = block(c, exec && !done);
            if (c->rc) return;
        }
        if (!stop || !is_name(stop, "endif")) {
            fail(c, stop ? stop->at : cur(c)->at, "'if' without its 'endif'");
            return;
        }
        expect_block_end(c);
        return;
    }
}

static void stmt_for(ctx *c, bool exec, size_t at) {
    const tok *name = cur(c);
    if (name->kind != T_NAME || is_op(&c->t[c->pos + 1], ",")) {
        fail(c, name->at, "expected 'for NAME in' (one name)");
        return;
    }
    c->pos++;
    if (!is_name(cur(c), "in")) {
        fail(c, cur(c)->at, "expected 'in'");
        return;
    }
    c->pos++;
    const jv seq = or_expr(c, exec); /* (not expr: its 'if' is the loop's filter) */
    int cond_pos = -1;
    if (is_name(cur(c), "if")) { /* for x in xs if COND */
        c->pos++;
        cond_pos = c->pos;
        expr(c, false);
    }
    if (is_name(cur(c), "recursive")) {
        fail(c, cur(c)->at, "recursive loops are not rendered by moh");
        return;
    }
    expect_block_end(c);
    if (c->rc) return;
    const int body = c->pos, base = c->nv;
    if (exec && seq.k != V_LIST && seq.k != V_UNDEF && seq.k != V_NONE) {
        fail(c, at, "a loop over %s is not rendered by moh", kind_name(seq.k));
        return;
    }
    /* the items (the condition filters them first: loop.* counts the kept ones) */
    const size_t n = exec && seq.k == V_LIST ? seq.n : 0;
    const chat_msg **items = NULL;
    size_t kept = 0;
    if (n) {
        items = alloc(c, sizeof *items * n);
        if (!items) return;
    }
    for (size_t i = 0; i < n && !c->rc; i++) {
        bool keep = true;
        if (cond_pos >= 0) {
            const int save = c->pos;
            bind(c, name->s, name->n, (jv){.k = V_DICT, .m = seq.m + i}, name->at);
            c->pos = cond_pos;
            keep = truthy(expr(c, true));
            c->pos = save;
            c->nv = base;
        }
        if (keep) items[kept++] = seq.m + i;
    }
    const tok *stop = NULL;
    for (size_t i = 0; i < kept && !c->rc; i++) {
        c->pos = body;
        c->nv = base;
        bind(c, "loop", 4, (jv){.k = V_LOOP, .i = (long)i, .n = kept}, at);
        bind(c, name->s, name->n, (jv){.k = V_DICT, .m = items[i]}, name->at);
        stop = block(c, true);
    }
    c->nv = base;
    if (!kept) {
        c->pos = body;
        stop = block(c, false);
    }
    if (c->rc) return;
    if (stop && is_name(stop, "else")) { /* runs when nothing was iterated */
        expect_block_end(c);
        stop = block(c, exec && !kept);
        if (c->rc) return;
    }
    if (!stop || !is_name(stop, "endfor")) {
        fail(c, stop ? stop->at : at, "'for' without its 'endfor'");
        return;
    }
    expect_block_end(c);
}

static const tok *block(ctx *c, bool exec) {
    if (++c->depth > MAX_DEPTH) {
        fail(c, cur(c)->at, "blocks nested deeper than %d", MAX_DEPTH);
        return NULL;
    }
    const tok *stop = NULL;
    while (!c->rc) {
        tok *t = cur(c);
        if (t->kind == T_EOF) break;
        if (t->kind == T_TEXT) {
            if (exec) emit(c, t->s, t->n);
            c->pos++;
        } else if (t->kind == T_VAR_BEGIN) {
            c->pos++;
            const jv v = expr(c, exec);
            if (exec) {
                const jv s = to_str(c, v, t->at);
                emit(c, s.s, s.n);
            }
            if (cur(c)->kind == T_VAR_END) c->pos++;
            else fail(c, cur(c)->at, "expected '}}'");
        } else if (t->kind == T_BLOCK_BEGIN) {
            c->pos++;
            tok *name = cur(c);
            c->pos++;
            if (is_name(name, "if")) stmt_if(c, exec);
            else if (is_name(name, "for")) stmt_for(c, exec, name->at);
            else if (is_name(name, "set")) {
                const tok *lhs = cur(c);
                if (lhs->kind != T_NAME || !is_op(&c->t[c->pos + 1], "=")) {
                    fail(c, lhs->at, "expected 'set NAME = EXPR' (block sets, tuples and attributes are not rendered "
                         "by moh)");
                    break;
                }
                c->pos += 2;
                const jv v = expr(c, exec);
                expect_block_end(c);
                if (exec) bind(c, lhs->s, lhs->n, v, lhs->at);
            } else if (is_name(name, "elif") || is_name(name, "else") || is_name(name, "endif") ||
                       is_name(name, "endfor")) {
                stop = name;
                break;
            } else {
                fail(c, name->at, "tag '%.*s' is not rendered by moh", (int)(name->n < 40 ? name->n : 40),
                     name->n ? name->s : "");
            }
        } else {
            fail(c, t->at, "unexpected '%.*s'", (int)(t->n < 40 ? t->n : 40), t->s ? t->s : "");
        }
    }
    c->depth--;
    return stop;
}

int chat_template_render(const char *tmpl, const chat_msg *msgs, int n, bool add_generation_prompt,
                         const char *bos, const char *eos, const char *label, char **out, size_t *len,
                         moh_error *err) {
    *out = NULL;
    *len = 0;
    ctx c = {.label = label ? label : "chat template", .err = err};
    lex(&c, tmpl);
    if (!c.rc) {
        bind(&c, "messages", 8, (jv){.k = V_LIST, .m = msgs, .n = (size_t)(n > 0 ? n : 0)}, 0);
        bind(&c, "add_generation_prompt", 21, mk_bool(add_generation_prompt), 0);
        if (bos) bind(&c, "bos_token", 9, mk_str(bos, strlen(bos)), 0);
        if (eos) bind(&c, "eos_token", 9, mk_str(eos, strlen(eos)), 0);
        const tok *stop = block(&c, true);
        if (stop) fail(&c, stop->at, "'%.*s' without its opening tag", (int)stop->n, stop->s);
    }
    if (!c.rc && !c.out) emit(&c, "", 0);
    for (int i = 0; i < c.na; i++) free(c.arena[i]);
    free(c.arena);
    free(c.t);
    if (c.rc) {
        free(c.out);
        return c.rc;
    }
    *out = c.out;
    *len = c.len;
    return MOH_OK;
}
