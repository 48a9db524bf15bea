/* JSON helpers: exact number output, and the readers every config parser (layer, LM, ViT) uses:
 * parse with line/column errors, reject unknown keys, read typed fields. Every failure is
 * moh_fail(err, MOH_E_CONFIG or MOH_E_FORMAT, "LABEL: ...") on one line. */
#ifndef MOH_JSON_UTIL_H
#define MOH_JSON_UTIL_H
#include <cjson/cJSON.h>

#include "moh.h"

/* A number item printed with 17 significant digits, so that it parses back to the same double
 * (cJSON's own printer may drop the last bit). Non-finite values fall back to cJSON's. */
cJSON *json_exact_number(double v);

/* Shortest %g rendering of v (at most 17 digits) that reads back as v: 0.1, not
 * 0.10000000000000001. */
void json_shortest_number(char *buf, size_t cap, double v);

/* How messages render values, keys and integer errors. The layer/LM parsers and the ViT parser
 * grew apart and tests pin both, so both are kept:
 *   LAYER: numbers as json_shortest_number, other values as cJSON prints them cut to 155 bytes
 *          + "..."; keys with control characters, DEL, '\\' and '\'' as \xNN, cut at 80 characters
 *          (or ~112 bytes) + "..."; integers checked in steps ("expected an integer", then
 *          "in INT_MIN..INT_MAX", then "> 0" / ">= LO" / "<= HI").
 *   VIT:   every value as cJSON prints it, control characters and DEL as \xNN, cut near 88 bytes
 *          + "..."; keys with control characters, DEL and '\'' as \xNN, cut near 88 bytes with no
 *          marker; integers in one message "expected an integer in LO..HI".
 * An empty text is MOH_E_CONFIG for LAYER, MOH_E_FORMAT for VIT. */
typedef enum json_style { JSON_STYLE_LAYER, JSON_STYLE_VIT } json_style;

/* What every reader needs to report: label (the file, first word of every message; not NULL),
 * style, err (may be NULL). */
typedef struct json_reader {
    const char *label;
    json_style style;
    moh_error *err;
} json_reader;

/* Buffer sizes for json_show_value and json_safe_key. */
#define JSON_SHOW_BUF 160
#define JSON_KEY_BUF 120

/* Copies s into buf (cap bytes) for quoting in a one-line message: control bytes, DEL, '\\' and
 * '\'' as \xNN; cut with "..." (never inside a UTF-8 sequence) at byte max_in of s or when fewer
 * than room (>= 8) bytes of buf are left. Returns buf. */
const char *json_quote(char *buf, size_t cap, const char *s, size_t max_in, size_t room);

/* j rendered short, on one line, for a message (into buf; returns buf). */
const char *json_show_value(const json_reader *rd, char buf[JSON_SHOW_BUF], const cJSON *j);
/* Key s made safe for a one-line message (into buf; returns buf). */
const char *json_safe_key(const json_reader *rd, char buf[JSON_KEY_BUF], const char *s);

/* Parses text[0..len) (not necessarily NUL-terminated; nothing past len is read) into *root
 * (caller cJSON_Delete's it; NULL on error). Errors: empty text (MOH_E_CONFIG for LAYER,
 * MOH_E_FORMAT for VIT), syntax errors and trailing text MOH_E_FORMAT with line and column
 * (1-based), MOH_E_NOMEM. */
int json_parse_text(const json_reader *rd, const char *text, size_t len, cJSON **root);

/* Reads a parsed tree into out (e.g. a config struct); errors as for json_object_fields. */
typedef int (*json_from_fn)(void *out, const cJSON *root, const json_reader *rd);
/* json_parse_text, then from(out, root, rd); the tree is freed before returning. Returns the
 * first error. */
int json_parse_with(const json_reader *rd, const char *text, size_t len, json_from_fn from,
                    void *out);

/* Checks that root is an object whose keys are all in keys[0..n) (each at most once) and sets
 * fields[i] to the item of keys[i] or NULL. Keys starting with "_" or "comment" are annotations
 * and skipped. example (e.g. {"hidden_size": ...}) is shown when root is not an object, expected
 * (e.g. "expected one of a, b; prefix annotations with '_'") in parentheses after an unknown key;
 * NULL: that sentence over keys. Errors: MOH_E_CONFIG. */
int json_object_fields(const json_reader *rd, const cJSON *root, const char *const *keys, int n,
                       const cJSON **fields, const char *example, const char *expected);

/* An integer field of a config: fields[id] (keys[id]) into *dst, in lo..hi, refused when missing
 * and required. */
typedef struct json_int_field {
    int id;
    int *dst;
    int lo, hi;
    bool required;
} json_int_field;
/* Reads ints[0..n) from fields (json_object_fields) with json_get_int; a missing required one is
 * "<label>: missing field '<key>' (an integer in lo..hi)". MOH_OK or MOH_E_CONFIG. */
int json_get_ints(const json_reader *rd, const cJSON *const *fields, const char *const *keys,
                  const json_int_field *ints, size_t n);
/* The model_type field j is the string want: else "<label>: field 'model_type' is <j or missing>,
 * expected \"want\"". MOH_OK or MOH_E_CONFIG. */
int json_check_model_type(const json_reader *rd, const cJSON *j, const char *want);

/* Field key (item j) as an integer in lo..hi (messages per rd->style) into *out. MOH_E_CONFIG. */
int json_get_int(const json_reader *rd, const cJSON *j, const char *key, int lo, int hi, int *out);
/* Field key as a finite number. MOH_E_CONFIG. */
int json_get_number(const json_reader *rd, const cJSON *j, const char *key, double *out);
/* Field key as true or false. MOH_E_CONFIG. */
int json_get_bool(const json_reader *rd, const cJSON *j, const char *key, bool *out);
/* Field key as one of the strings names[0..n): its index in *idx. expected is the message's
 * wording of the choices, e.g. "\"token\" or \"avg\"". MOH_E_CONFIG. */
int json_get_choice(const json_reader *rd, const cJSON *j, const char *key,
                    const char *const *names, int n, const char *expected, int *idx);
/* Field key as a router name (attn_router_name): "none", "learned", and "query_norm" when
 * query_norm is true. expected as for json_get_choice. MOH_E_CONFIG. */
int json_get_router(const json_reader *rd, const cJSON *j, const char *key, bool query_norm,
                    const char *expected, moh_router *out);
#endif
