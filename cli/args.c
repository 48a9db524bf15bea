#include "args.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_NAME 64 /* longer names get no suggestion */

static bool is_integer(arg_kind k) { return k == ARG_INT || k == ARG_LONG || k == ARG_U64; }

static void fmt_bound(char *out, size_t cap, arg_kind k, double v) {
    if (is_integer(k)) snprintf(out, cap, "%.0f", v);
    else snprintf(out, cap, "%.15g", v);
}

/* "0 < P <= 1", "N >= 1", "1 <= B <= 65536"; lo/hi are the printed bounds (NULL = none). */
static void fmt_range(char *out, size_t cap, const char *var, int lo_kind, const char *lo, int hi_kind,
                      const char *hi) {
    const char *lo_op = lo_kind == 2 ? "<" : "<=", *hi_op = hi_kind == 2 ? "<" : "<=";
    if (lo_kind && hi_kind) snprintf(out, cap, "%s %s %s %s %s", lo, lo_op, var, hi_op, hi);
    else if (lo_kind) snprintf(out, cap, "%s %s %s", var, lo_kind == 2 ? ">" : ">=", lo);
    else if (hi_kind) snprintf(out, cap, "%s %s %s", var, hi_op, hi);
    else snprintf(out, cap, "any %s", var);
}

/* The spec's range as text; with type_limits, the missing bounds are the type's (for overflow). */
static void describe_range(char *out, size_t cap, const arg_spec *s, bool type_limits) {
    char lo[32] = "", hi[32] = "";
    int lk = s->range.lo_kind, hk = s->range.hi_kind;
    if (lk) fmt_bound(lo, sizeof lo, s->kind, s->range.lo);
    if (hk) fmt_bound(hi, sizeof hi, s->kind, s->range.hi);
    if (type_limits && !lk && s->kind != ARG_DOUBLE) {
        lk = 1;
        if (s->kind == ARG_INT) snprintf(lo, sizeof lo, "%d", INT_MIN);
        else if (s->kind == ARG_LONG) snprintf(lo, sizeof lo, "%ld", LONG_MIN);
        else snprintf(lo, sizeof lo, "0");
    }
    if (type_limits && !hk && s->kind != ARG_DOUBLE) {
        hk = 1;
        if (s->kind == ARG_INT) snprintf(hi, sizeof hi, "%d", INT_MAX);
        else if (s->kind == ARG_LONG) snprintf(hi, sizeof hi, "%ld", LONG_MAX);
        else snprintf(hi, sizeof hi, "%llu", (unsigned long long)UINT64_MAX);
    }
    fmt_range(out, cap, s->meta ? s->meta : "value", lk, lo, hk, hi);
}

static bool in_range(const arg_range *r, double x) {
    if (r->lo_kind == 1 && !(x >= r->lo)) return false;
    if (r->lo_kind == 2 && !(x > r->lo)) return false;
    if (r->hi_kind == 1 && !(x <= r->hi)) return false;
    if (r->hi_kind == 2 && !(x < r->hi)) return false;
    return true;
}

/* Optimal-string-alignment distance (Levenshtein plus adjacent transpositions) of a[0..la), b[0..lb). */
static int edit_distance(const char *a, int la, const char *b, int lb) {
    int d[MAX_NAME + 1][MAX_NAME + 1];
    for (int i = 0; i <= la; i++) d[i][0] = i;
    for (int j = 0; j <= lb; j++) d[0][j] = j;
    for (int i = 1; i <= la; i++)
        for (int j = 1; j <= lb; j++) {
            const int cost = a[i - 1] != b[j - 1];
            int v = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < v) v = d[i][j - 1] + 1;
            if (d[i - 1][j - 1] + cost < v) v = d[i - 1][j - 1] + cost;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < v)
                v = d[i - 2][j - 2] + 1;
            d[i][j] = v;
        }
    return d[la][lb];
}

/* First letters of the '-'/'_'-separated words of s[0..n): "learning-rate" -> "lr". */
static int initials(const char *s, int n, char *out) {
    int k = 0;
    for (int i = 0; i < n; i++)
        if (s[i] != '-' && s[i] != '_' && (i == 0 || s[i - 1] == '-' || s[i - 1] == '_')) out[k++] = s[i];
    out[k] = 0;
    return k;
}

static const char *skip_dashes(const char *s) {
    return s[0] == '-' ? (s[1] == '-' ? s + 2 : s + 1) : s;
}

/* The nearest of the candidates (names[i] with leading dashes skipped) to key[0..kn), or -1:
 * an exact match (in any case), else the smallest edit distance within 1 (names of <= 4 letters), 2 (<= 8) or
 * 3, else the one name that starts with key (>= 2 letters), else the one name whose initials are
 * key or whose letters are the initials of key's words (--learning-rate -> --lr). */
static int nearest(const char *key, int kn, const char *const *names, int n) {
    if (kn < 1 || kn > MAX_NAME) return -1;
    for (int i = 0; i < n; i++) { /* the same letters in another case (q4_k -> q4_K) first */
        const char *c = skip_dashes(names[i]);
        int j = 0;
        while (j < kn && c[j] && tolower((unsigned char)c[j]) == tolower((unsigned char)key[j])) j++;
        if (j == kn && !c[j]) return i;
    }
    int best = -1, best_d = INT_MAX;
    for (int i = 0; i < n; i++) {
        const char *c = skip_dashes(names[i]);
        const int cn = (int)strlen(c);
        if (cn > MAX_NAME) continue;
        const int d = edit_distance(key, kn, c, cn), limit = cn <= 4 ? 1 : cn <= 8 ? 2 : 3;
        if (d <= limit && d < best_d) {
            best = i;
            best_d = d;
        }
    }
    if (best >= 0) return best;
    int prefix = -1, acro = -1, n_prefix = 0, n_acro = 0;
    char ki[MAX_NAME + 1], ci[MAX_NAME + 1];
    const int kin = initials(key, kn, ki);
    for (int i = 0; i < n; i++) {
        const char *c = skip_dashes(names[i]);
        const int cn = (int)strlen(c);
        if (cn > MAX_NAME) continue;
        if (kn >= 2 && kn < cn && !strncmp(c, key, (size_t)kn)) {
            prefix = i;
            n_prefix++;
        }
        const int cin = initials(c, cn, ci);
        if ((kin >= 2 && cn == kin && !strncmp(c, ki, (size_t)kin)) ||
            (cin >= 2 && kn == cin && !strncmp(key, ci, (size_t)kn))) {
            acro = i;
            n_acro++;
        }
    }
    return n_prefix == 1 ? prefix : n_acro == 1 ? acro : -1;
}

int args_nearest(const char *key, const char *const *names, int n) {
    return nearest(key, (int)strlen(key), names, n);
}

static void unknown_option(const char *cmd, const char *k, const arg_spec *specs, int n) {
    const char *names[128];
    const int m = n < 128 ? n : 128;
    for (int j = 0; j < m; j++) names[j] = specs[j].name;
    const char *key = skip_dashes(k), *eq = strchr(key, '=');
    const int kn = (int)(eq ? eq - key : (ptrdiff_t)strlen(key));
    if (eq) /* --name=value: moh takes the value as the next argument */
        for (int j = 0; j < m; j++)
            if ((int)strlen(names[j] + 2) == kn && !strncmp(names[j] + 2, key, (size_t)kn)) {
                fprintf(stderr, "moh %s: unknown option '%s'; did you mean '%s %s'?\n", cmd, k, names[j], eq + 1);
                return;
            }
    const int j = nearest(key, kn, names, m);
    if (j >= 0) fprintf(stderr, "moh %s: unknown option '%s'; did you mean '%s'?\n", cmd, k, names[j]);
    else fprintf(stderr, "moh %s: unknown option '%s' (see moh %s --help)\n", cmd, k, cmd);
}

/* Checks a CHOICE value against the '|'-separated words of meta; prints the error. */
static bool check_choice(const char *cmd, const arg_spec *s, const char *v) {
    char buf[256];
    const char *words[16];
    snprintf(buf, sizeof buf, "%s", s->meta);
    int n = 0;
    for (char *p = buf; n < 16;) {
        words[n++] = p;
        char *bar = strchr(p, '|');
        if (!bar) break;
        *bar = 0;
        p = bar + 1;
    }
    for (int i = 0; i < n; i++)
        if (!strcmp(words[i], v)) return true;
    const int j = nearest(v, (int)strlen(v), words, n);
    if (j >= 0) fprintf(stderr, "moh %s: %s '%s' is not one of %s; did you mean '%s'?\n", cmd, s->name, v, s->meta, words[j]);
    else fprintf(stderr, "moh %s: %s '%s' is not one of %s\n", cmd, s->name, v, s->meta);
    return false;
}

static void print_help(const char *cmd, const arg_spec *s, int n, const char *synopsis, const char *epilog) {
    printf("usage: moh %s %s\n\n", cmd, synopsis);
    int width = 22; /* the option column fits the longest "--name META" */
    for (int i = 0; i < n; i++) {
        const int w = (int)strlen(s[i].name) + (s[i].meta ? 1 + (int)strlen(s[i].meta) : 0);
        if (w > width && w < 40) width = w;
    }
    for (int i = 0; i < n; i++) {
        char left[64], range[96] = "";
        snprintf(left, sizeof left, "%s%s%s", s[i].name, s[i].meta ? " " : "", s[i].meta ? s[i].meta : "");
        if (s[i].range.lo_kind || s[i].range.hi_kind) {
            char r[88];
            describe_range(r, sizeof r, &s[i], false);
            snprintf(range, sizeof range, " [%s]", r);
        }
        printf("  %-*s %s%s%s\n", width, left, s[i].help, range, s[i].required ? " (required)" : "");
    }
    if (epilog) printf("\n%s", epilog);
}

/* Parses one value v of s into s->dst; prints the error and returns false if it is not valid. */
static bool parse_value(const char *cmd, const arg_spec *s, const char *v) {
    char *end = NULL, want[128];
    errno = 0;
    double x = 0; /* the value, for the range check */
    switch (s->kind) {
    case ARG_STR: *(const char **)s->dst = v; return true;
    case ARG_CHOICE:
        if (!check_choice(cmd, s, v)) return false;
        *(const char **)s->dst = v;
        return true;
    case ARG_FLAG: return true;
    case ARG_INT:
    case ARG_LONG:
    case ARG_U64: {
        long l = 0;
        unsigned long long u = 0;
        if (s->kind == ARG_U64) u = strtoull(v, &end, 10);
        else l = strtol(v, &end, 10);
        if (end == v || *end || isspace((unsigned char)v[0])) { /* strtol skips leading blanks: not here */
            fprintf(stderr, "moh %s: option %s expects an integer, got '%s'\n", cmd, s->name, v);
            return false;
        }
        const bool neg = strchr(v, '-') != NULL;
        if (errno == ERANGE || (s->kind == ARG_INT && (l < INT_MIN || l > INT_MAX)) || (s->kind == ARG_U64 && neg)) {
            describe_range(want, sizeof want, s, true);
            fprintf(stderr, "moh %s: %s %s is out of range: expected %s\n", cmd, s->name, v, want);
            return false;
        }
        if (s->kind == ARG_INT) *(int *)s->dst = (int)l;
        else if (s->kind == ARG_LONG) *(long *)s->dst = l;
        else *(uint64_t *)s->dst = u;
        x = s->kind == ARG_U64 ? (double)u : (double)l;
        break;
    }
    case ARG_DOUBLE: {
        const double d = strtod(v, &end);
        if (end == v || *end || isspace((unsigned char)v[0]) || strpbrk(v, "xX")) { /* decimal only */
            fprintf(stderr, "moh %s: option %s expects a decimal number, got '%s'\n", cmd, s->name, v);
            return false;
        }
        if (!isfinite(d) || (errno == ERANGE && fabs(d) > 1)) { /* nan, inf, 1e999; underflow rounds */
            fprintf(stderr, "moh %s: %s %s is not a finite number\n", cmd, s->name, v);
            return false;
        }
        *(double *)s->dst = d;
        x = d;
        break;
    }
    }
    if (!in_range(&s->range, x)) {
        describe_range(want, sizeof want, s, false);
        fprintf(stderr, "moh %s: %s %s is out of range: expected %s\n", cmd, s->name, v, want);
        return false;
    }
    return true;
}

int args_parse(const char *cmd, int argc, char **argv, const arg_spec *specs, int n,
               const char *synopsis, const char *epilog) {
    bool seen[64] = {false};
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i];
        if (!strcmp(k, "--help") || !strcmp(k, "-h")) {
            print_help(cmd, specs, n, synopsis, epilog);
            return 1;
        }
        int j = 0;
        while (j < n && strcmp(specs[j].name, k)) j++;
        if (j == n) {
            unknown_option(cmd, k, specs, n);
            return 2;
        }
        const arg_spec *s = &specs[j];
        if (j < 64) seen[j] = true;
        if (s->kind == ARG_FLAG) {
            *(bool *)s->dst = true;
            continue;
        }
        int next = 0; /* the value is itself an option name: the value was forgotten */
        while (i + 1 < argc && next < n && strcmp(specs[next].name, argv[i + 1])) next++;
        if (i + 1 >= argc || next < n) {
            fprintf(stderr, "moh %s: option %s needs a value (%s)%s%s\n", cmd, k, s->meta ? s->meta : "value",
                    i + 1 < argc ? " before " : "", i + 1 < argc ? argv[i + 1] : "");
            return 2;
        }
        if (!parse_value(cmd, s, argv[++i])) return 2;
    }
    for (int j = 0; j < n && j < 64; j++)
        if (specs[j].required && !seen[j]) {
            fprintf(stderr, "moh %s: missing required option %s (see moh %s --help)\n", cmd, specs[j].name, cmd);
            return 2;
        }
    return 0;
}

const char *args_value(int argc, char **argv, const char *name) {
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], name)) return argv[i + 1];
    return NULL;
}

int args_check_less(const char *cmd, int argc, char **argv, const char *a, long a_val, const char *b,
                    long b_val) {
    if (!args_value(argc, argv, a) || !args_value(argc, argv, b) || a_val < b_val) return 0;
    fprintf(stderr, "moh %s: %s %ld must be less than %s %ld\n", cmd, a, a_val, b, b_val);
    return 1;
}
