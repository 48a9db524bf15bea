/* JSON helpers: exact number output and the config readers (see json_util.h). */
#include "io/json_util.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn/attn.h"

cJSON *json_exact_number(double v) {
    if (!isfinite(v)) return cJSON_CreateNumber(v);
    char buf[40];
    snprintf(buf, sizeof buf, "%.17g", v);
    return cJSON_CreateRaw(buf);
}

void json_shortest_number(char *buf, size_t cap, double v) {
    for (int p = 1; p <= 17; p++) {
        snprintf(buf, cap, "%.*g", p, v);
        if (strtod(buf, NULL) == v) return;
    }
}

/* Length of buf[0..o) without a trailing UTF-8 sequence that may be incomplete. */
static size_t utf8_trim(const char *buf, size_t o) {
    while (o > 0 && ((unsigned char)buf[o - 1] & 0xC0) == 0x80) o--;
    if (o > 0 && ((unsigned char)buf[o - 1] & 0xC0) == 0xC0) o--;
    return o;
}

const char *json_show_value(const json_reader *rd, char buf[JSON_SHOW_BUF], const cJSON *j) {
    const bool layer = rd->style == JSON_STYLE_LAYER;
    const size_t cap = layer ? JSON_SHOW_BUF : 96;
    if (layer && cJSON_IsNumber(j)) {
        json_shortest_number(buf, cap, j->valuedouble);
        return buf;
    }
    char *s = cJSON_PrintUnformatted(j);
    if (!s) {
        snprintf(buf, cap, "(a value)");
        return buf;
    }
    if (layer) {
        size_t n = strlen(s);
        if (n + 1 > cap) {
            /* cut, without splitting a UTF-8 sequence */
            size_t k = cap - 4;
            while (k > 0 && ((unsigned char)s[k] & 0xC0) == 0x80) k--;
            memcpy(buf, s, k);
            memcpy(buf + k, "...", 4);
        } else {
            snprintf(buf, cap, "%s", s);
        }
    } else {
        size_t o = 0;
        for (size_t i = 0; s[i] && o + 8 < cap; i++) {
            unsigned char ch = (unsigned char)s[i];
            if (ch < 0x20 || ch == 0x7f) o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", ch);
            else buf[o++] = (char)ch;
        }
        if (s[0] && o + 8 >= cap) {
            o = utf8_trim(buf, o);
            memcpy(buf + o, "...", 3);
            o += 3;
        }
        buf[o] = '\0';
    }
    cJSON_free(s);
    return buf;
}

const char *json_quote(char *buf, size_t cap, const char *s, size_t max_in, size_t room) {
    static const char hex[] = "0123456789abcdef";
    size_t o = 0;
    for (size_t i = 0; s[i]; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (i >= max_in || o + room > cap) {
            o = utf8_trim(buf, o);
            memcpy(buf + o, "...", 3);
            o += 3;
            break;
        }
        if (ch < 0x20 || ch == 0x7f || ch == '\\' || ch == '\'') {
            buf[o++] = '\\';
            buf[o++] = 'x';
            buf[o++] = hex[ch >> 4];
            buf[o++] = hex[ch & 15];
        } else {
            buf[o++] = (char)ch;
        }
    }
    buf[o] = '\0';
    return buf;
}

const char *json_safe_key(const json_reader *rd, char buf[JSON_KEY_BUF], const char *s) {
    if (rd->style == JSON_STYLE_LAYER) return json_quote(buf, JSON_KEY_BUF, s, 80, 8);
    const size_t cap = 96; /* VIT: '\\' kept, cut silently */
    size_t o = 0;
    for (size_t i = 0; s[i] && o + 8 < cap; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch < 0x20 || ch == 0x7f || ch == '\'') o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", ch);
        else buf[o++] = (char)ch;
    }
    while (o > 0 && ((unsigned char)buf[o - 1] & 0xC0) == 0xC0) o--;
    buf[o] = '\0';
    return buf;
}

int json_parse_text(const json_reader *rd, const char *text, size_t len, cJSON **root) {
    const char *label = rd->label;
    *root = NULL;
    if (len == 0)
        return moh_fail(rd->err, rd->style == JSON_STYLE_LAYER ? MOH_E_CONFIG : MOH_E_FORMAT,
                        "%s: empty, expected a JSON object", label);
    /* cJSON reads a NUL-terminated private copy: nothing past text + len is ever touched. */
    char *copy = malloc(len + 1);
    if (!copy) return moh_fail(rd->err, MOH_E_NOMEM, "%s: out of memory (%zu bytes)", label, len);
    memcpy(copy, text, len);
    copy[len] = '\0';
    const char *end = NULL;
    cJSON *r = cJSON_ParseWithLengthOpts(copy, len, &end, 0);
    size_t bad = len; /* offset of the first byte after a syntax error, len when none */
    if (!r) {
        bad = end && end >= copy && end <= copy + len ? (size_t)(end - copy) : 0;
    } else {
        for (const char *q = end; q && q < copy + len; q++)
            if (*q != ' ' && *q != '\t' && *q != '\n' && *q != '\r') {
                bad = (size_t)(q - copy);
                break;
            }
    }
    if (bad < len || !r) {
        int line = 1, col = 1;
        for (size_t i = 0; i < bad; i++) {
            if (copy[i] == '\n') line++, col = 1;
            else col++;
        }
        int rc = moh_fail(rd->err, MOH_E_FORMAT, "%s: not valid JSON (%s at line %d, column %d)",
                          label, r ? "unexpected text after the object" : "syntax error", line, col);
        cJSON_Delete(r);
        free(copy);
        return rc;
    }
    free(copy);
    *root = r;
    return MOH_OK;
}

int json_parse_with(const json_reader *rd, const char *text, size_t len, json_from_fn from,
                    void *out) {
    cJSON *root;
    int rc = json_parse_text(rd, text, len, &root);
    if (rc != MOH_OK) return rc;
    rc = from(out, root, rd);
    cJSON_Delete(root);
    return rc;
}

int json_object_fields(const json_reader *rd, const cJSON *root, const char *const *keys, int n,
                       const cJSON **fields, const char *example, const char *expected) {
    char v[JSON_SHOW_BUF], k[JSON_KEY_BUF];
    for (int i = 0; i < n; i++) fields[i] = NULL;
    if (!cJSON_IsObject(root))
        return moh_fail(rd->err, MOH_E_CONFIG, "%s: expected a JSON object %s, got %s", rd->label,
                        example, json_show_value(rd, v, root));
    for (const cJSON *e = root->child; e; e = e->next) {
        const char *key = e->string ? e->string : "";
        if (key[0] == '_' || strncmp(key, "comment", 7) == 0) continue;
        int id = -1;
        for (int i = 0; i < n && id < 0; i++)
            if (strcmp(key, keys[i]) == 0) id = i;
        if (id < 0 && expected)
            return moh_fail(rd->err, MOH_E_CONFIG, "%s: unknown field '%s' (%s)", rd->label,
                            json_safe_key(rd, k, key), expected);
        if (id < 0) {
            char list[1024];
            size_t at = 0;
            for (int i = 0; i < n && at < sizeof list; i++)
                at += (size_t)snprintf(list + at, sizeof list - at, "%s%s", i ? ", " : "", keys[i]);
            return moh_fail(rd->err, MOH_E_CONFIG,
                            "%s: unknown field '%s' (expected one of %s; prefix annotations with '_')", rd->label,
                            json_safe_key(rd, k, key), list);
        }
        if (fields[id])
            return moh_fail(rd->err, MOH_E_CONFIG, "%s: field '%s' appears twice", rd->label,
                            keys[id]);
        fields[id] = e;
    }
    return MOH_OK;
}

int json_get_ints(const json_reader *rd, const cJSON *const *fields, const char *const *keys,
                  const json_int_field *ints, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const json_int_field *x = &ints[i];
        if (!fields[x->id] && x->required)
            return moh_fail(rd->err, MOH_E_CONFIG, "%s: missing field '%s' (an integer in %d..%d)", rd->label,
                            keys[x->id], x->lo, x->hi);
        const int rc = fields[x->id] ? json_get_int(rd, fields[x->id], keys[x->id], x->lo, x->hi, x->dst) : MOH_OK;
        if (rc) return rc;
    }
    return MOH_OK;
}

int json_check_model_type(const json_reader *rd, const cJSON *j, const char *want) {
    char v[JSON_SHOW_BUF];
    if (j && cJSON_IsString(j) && !strcmp(j->valuestring, want)) return MOH_OK;
    return moh_fail(rd->err, MOH_E_CONFIG, "%s: field 'model_type' is %s, expected \"%s\"", rd->label,
                    j ? json_show_value(rd, v, j) : "missing", want);
}

int json_get_int(const json_reader *rd, const cJSON *j, const char *key, int lo, int hi, int *out) {
    char v[JSON_SHOW_BUF];
    const char *label = rd->label;
    const double d = cJSON_IsNumber(j) ? j->valuedouble : 0.5;
    if (rd->style == JSON_STYLE_VIT) {
        if (d != floor(d) || !(d >= lo) || !(d <= hi))
            return moh_fail(rd->err, MOH_E_CONFIG,
                            "%s: field '%s': expected an integer in %d..%d, got %s", label, key, lo,
                            hi, json_show_value(rd, v, j));
        *out = (int)d;
        return MOH_OK;
    }
    if (d != floor(d) || isinf(d))
        return moh_fail(rd->err, MOH_E_CONFIG, "%s: field '%s': expected an integer, got %s", label,
                        key, json_show_value(rd, v, j));
    if (!(d >= (double)INT_MIN && d <= (double)INT_MAX))
        return moh_fail(rd->err, MOH_E_CONFIG,
                        "%s: field '%s': expected an integer in %d..%d, got %s", label, key,
                        INT_MIN, INT_MAX, json_show_value(rd, v, j));
    const int x = (int)d;
    if (x < lo && lo == 1)
        return moh_fail(rd->err, MOH_E_CONFIG, "%s: field '%s': expected an integer > 0, got %d",
                        label, key, x);
    if (x < lo)
        return moh_fail(rd->err, MOH_E_CONFIG, "%s: field '%s': expected an integer >= %d, got %d",
                        label, key, lo, x);
    if (x > hi)
        return moh_fail(rd->err, MOH_E_CONFIG, "%s: field '%s': expected an integer <= %d, got %d",
                        label, key, hi, x);
    *out = x;
    return MOH_OK;
}

int json_get_number(const json_reader *rd, const cJSON *j, const char *key, double *out) {
    char v[JSON_SHOW_BUF];
    if (!cJSON_IsNumber(j) || !isfinite(j->valuedouble))
        return moh_fail(rd->err, MOH_E_CONFIG, "%s: field '%s': expected a finite number, got %s",
                        rd->label, key, json_show_value(rd, v, j));
    *out = j->valuedouble;
    return MOH_OK;
}

int json_get_bool(const json_reader *rd, const cJSON *j, const char *key, bool *out) {
    char v[JSON_SHOW_BUF];
    if (!cJSON_IsBool(j))
        return moh_fail(rd->err, MOH_E_CONFIG, "%s: field '%s': expected true or false, got %s",
                        rd->label, key, json_show_value(rd, v, j));
    *out = cJSON_IsTrue(j);
    return MOH_OK;
}

int json_get_choice(const json_reader *rd, const cJSON *j, const char *key,
                    const char *const *names, int n, const char *expected, int *idx) {
    char v[JSON_SHOW_BUF];
    const char *s = cJSON_IsString(j) ? j->valuestring : NULL;
    for (int i = 0; s && i < n; i++)
        if (strcmp(s, names[i]) == 0) {
            *idx = i;
            return MOH_OK;
        }
    return moh_fail(rd->err, MOH_E_CONFIG, "%s: field '%s': expected %s, got %s", rd->label, key,
                    expected, json_show_value(rd, v, j));
}

int json_get_router(const json_reader *rd, const cJSON *j, const char *key, bool query_norm,
                    const char *expected, moh_router *out) {
    const char *const names[3] = {attn_router_name(MOH_ROUTER_NONE),
                                  attn_router_name(MOH_ROUTER_LEARNED),
                                  attn_router_name(MOH_ROUTER_QUERY_NORM)};
    int i = 0;
    int rc = json_get_choice(rd, j, key, names, query_norm ? 3 : 2, expected, &i);
    if (rc == MOH_OK) *out = (moh_router)i;
    return rc;
}
