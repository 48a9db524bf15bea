/* The chat-template renderer (src/text/chat_template.c) against jinja2 as transformers runs it
 * (tests/fixtures/chat_templates.json from tools/ref/chat_template_fixtures.py): every case renders
 * byte for byte, raises where jinja2 raises, and refuses by name what its subset does not render.
 * Then crafted templates: syntax errors and limits give one-line errors naming the byte. */
#include <string.h>

#include <cjson/cJSON.h>

#include "core/fsutil.h"
#include "test_util.h"
#include "text/chat_template.h"

#define FIXTURE "tests/fixtures/chat_templates.json"

static void fixture_cases(test_ctx *ctx) {
    moh_error err = {0};
    size_t len = 0;
    char *text = fs_read_file(FIXTURE, (size_t)1 << 24, &len, &err);
    CHECK(ctx, text, "%s", err.msg);
    cJSON *root = text ? cJSON_Parse(text) : NULL;
    free(text);
    const cJSON *templates = cJSON_GetObjectItem(root, "templates"), *cases = cJSON_GetObjectItem(root, "cases");
    CHECK(ctx, cJSON_IsObject(templates) && cJSON_GetArraySize(cases) >= 100, "fixture lacks its cases");
    int rendered = 0, raised = 0, refused = 0;
    const cJSON *c = NULL;
    cJSON_ArrayForEach(c, cases) {
        const char *name = cJSON_GetObjectItem(c, "name")->valuestring;
        const char *tmpl = cJSON_GetObjectItem(templates, cJSON_GetObjectItem(c, "template")->valuestring)->valuestring;
        const cJSON *msgs = cJSON_GetObjectItem(c, "messages");
        chat_msg m[8];
        int n = 0;
        const cJSON *e = NULL;
        cJSON_ArrayForEach(e, msgs) {
            if (n < 8) m[n++] = (chat_msg){cJSON_GetObjectItem(e, "role")->valuestring,
                                           cJSON_GetObjectItem(e, "content")->valuestring};
        }
        const bool gen = cJSON_IsTrue(cJSON_GetObjectItem(c, "add_generation_prompt"));
        char *out = NULL;
        size_t olen = 0;
        memset(&err, 0, sizeof err);
        const int rc = chat_template_render(tmpl, m, n, gen, cJSON_GetObjectItem(c, "bos")->valuestring,
                                            cJSON_GetObjectItem(c, "eos")->valuestring, "tmpl", &out, &olen, &err);
        const cJSON *expect = cJSON_GetObjectItem(c, "expect"), *error = cJSON_GetObjectItem(c, "error");
        if (expect) {
            const bool same = rc == MOH_OK && olen == strlen(expect->valuestring) && !memcmp(out, expect->valuestring, olen);
            CHECK(ctx, same, "%s: rc %d (%s), got [%s], want [%s]", name, rc, err.msg, out ? out : "",
                  expect->valuestring);
            rendered += same;
        } else if (error) {
            const bool ok = rc == MOH_E_FORMAT && strstr(err.msg, "the template raised: ") &&
                            strstr(err.msg, error->valuestring) && !strchr(err.msg, '\n');
            CHECK(ctx, ok, "%s: rc %d, message '%s', want the template's '%s'", name, rc, err.msg, error->valuestring);
            raised += ok;
        } else {
            const bool ok = rc == MOH_E_FORMAT && strstr(err.msg, "not rendered by moh") && !out;
            CHECK(ctx, ok, "%s: rc %d, message '%s': expected a refusal naming the construct", name, rc, err.msg);
            refused += ok;
        }
        free(out);
    }
    CHECK(ctx, rendered >= 100 && raised >= 2 && refused >= 5, "rendered %d, raised %d, refused %d", rendered, raised,
          refused);
    cJSON_Delete(root);
}

static void crafted(test_ctx *ctx) {
    const chat_msg m[] = {{"user", "hi"}};
    static const struct { const char *tmpl, *want; } bad[] = {
        {"{{ 'open", "byte 0: '{{' is never closed"},
        {"{% if true %}x", "'if' without its 'endif'"},
        {"{% endfor %}", "'endfor' without its opening tag"},
        {"x {{ messages[0].role ", "byte 2: '{{' is never closed"},
        {"{% for a, b in messages %}{% endfor %}", "one name"},
        {"{{ 1 + 'a' }}", "'+' of an integer and a string"},
        {"{{ 99999999999 }}", "integer literal too large"},
        {"{{ 1.5 }}", "only integer literals"},
        {"{{ a.b }}", "'b' of an undefined value"},
        {"{% include 'x' %}", "tag 'include' is not rendered by moh"},
        {"{{ messages[0] }}", "printing a dict is not rendered by moh"},
        {"{{ ((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((1)))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))) }}",
         "nested deeper than 64"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        moh_error err = {0};
        char *out = NULL;
        size_t len = 0;
        const int rc = chat_template_render(bad[i].tmpl, m, 1, true, NULL, NULL, "T.jinja", &out, &len, &err);
        CHECK(ctx, rc == MOH_E_FORMAT && !out && strstr(err.msg, bad[i].want) && !strncmp(err.msg, "T.jinja: byte ", 14) &&
                       !strchr(err.msg, '\n'),
              "template %zu (%s): rc %d, message '%s', want '%s'", i, bad[i].tmpl, rc, err.msg, bad[i].want);
        free(out);
    }
    /* an unexecuted branch may hold what moh does not render: it is only parsed */
    moh_error err = {0};
    char *out = NULL;
    size_t len = 0;
    int rc = chat_template_render("{% if tools %}{{ tools | tojson }}{% endif %}ok", m, 1, false, NULL, NULL, "T", &out,
                                  &len, &err);
    CHECK(ctx, rc == MOH_OK && len == 2 && !strcmp(out, "ok"), "rc %d %s", rc, err.msg);
    free(out);
    /* undefined bos_token prints nothing (jinja2's Undefined) */
    rc = chat_template_render("[{{ bos_token }}]", m, 1, false, NULL, NULL, "T", &out, &len, &err);
    CHECK(ctx, rc == MOH_OK && !strcmp(out, "[]"), "rc %d %s", rc, err.msg);
    free(out);
}

int main(void) {
    test_ctx ctx = {0};
    fixture_cases(&ctx);
    crafted(&ctx);
    return test_finish("test_chat_template", &ctx);
}
