#include "args.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void print_help(const char *cmd, const arg_spec *s, int n, const char *synopsis, const char *epilog) {
    printf("usage: moh %s %s\n\n", cmd, synopsis);
    for (int i = 0; i < n; i++) {
        char left[64];
        snprintf(left, sizeof left, "%s%s%s", s[i].name, s[i].meta ? " " : "", s[i].meta ? s[i].meta : "");
        printf("  %-22s %s%s\n", left, s[i].help, s[i].required ? " (required)" : "");
    }
    if (epilog) printf("\n%s", epilog);
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
            fprintf(stderr, "moh %s: unknown option '%s' (see moh %s --help)\n", cmd, k, cmd);
            return 2;
        }
        const arg_spec *s = &specs[j];
        if (j < 64) seen[j] = true;
        if (s->kind == ARG_FLAG) {
            *(bool *)s->dst = true;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "moh %s: option %s needs a value (%s)\n", cmd, k, s->meta ? s->meta : "value");
            return 2;
        }
        const char *v = argv[++i];
        char *end = NULL;
        errno = 0;
        switch (s->kind) {
        case ARG_STR: *(const char **)s->dst = v; break;
        case ARG_INT:
        case ARG_LONG: {
            long x = strtol(v, &end, 10);
            if (end == v || *end || errno || (s->kind == ARG_INT && (x < INT_MIN || x > INT_MAX))) {
                fprintf(stderr, "moh %s: option %s expects an integer, got '%s'\n", cmd, k, v);
                return 2;
            }
            if (s->kind == ARG_INT) *(int *)s->dst = (int)x;
            else *(long *)s->dst = x;
            break;
        }
        case ARG_U64: {
            unsigned long long x = strtoull(v, &end, 10);
            if (end == v || *end || errno || v[0] == '-') {
                fprintf(stderr, "moh %s: option %s expects a non-negative integer, got '%s'\n", cmd, k, v);
                return 2;
            }
            *(uint64_t *)s->dst = x;
            break;
        }
        case ARG_DOUBLE: {
            double x = strtod(v, &end);
            if (end == v || *end || errno) {
                fprintf(stderr, "moh %s: option %s expects a number, got '%s'\n", cmd, k, v);
                return 2;
            }
            *(double *)s->dst = x;
            break;
        }
        case ARG_FLAG: break;
        }
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

int args_check_train(int argc, char **argv, long steps, long log_every, double lr, double epochs) {
    if (args_value(argc, argv, "--steps") && steps < 1) {
        fprintf(stderr, "moh train: --steps is %ld, expected >= 1\n", steps);
        return 1;
    }
    if (log_every < 1) {
        fprintf(stderr, "moh train: --log-every is %ld, expected >= 1\n", log_every);
        return 1;
    }
    if (!(lr > 0 && lr <= 1e3)) { /* also NaN */
        fprintf(stderr, "moh train: --lr is %g, expected a number in (0, 1000]\n", lr);
        return 1;
    }
    if (!(epochs > 0 && epochs <= 1e6)) {
        fprintf(stderr, "moh train: --epochs is %g, expected a number in (0, 1000000]\n", epochs);
        return 1;
    }
    return 0;
}
