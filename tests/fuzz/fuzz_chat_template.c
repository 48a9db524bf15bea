/* libFuzzer target: chat_template_render (src/text/chat_template.c) on arbitrary templates (the
 * input up to its first NUL) over a fixed three-message conversation. Invariants (trap on
 * violation): success gives a NUL-terminated text of the reported length; a refusal gives no text
 * and one NUL-terminated line starting with the label. */
#include <stdlib.h>
#include <string.h>

#include "text/chat_template.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *tmpl = malloc(size + 1);
    if (!tmpl) return 0;
    memcpy(tmpl, data, size);
    tmpl[size] = '\0';
    static const chat_msg msgs[] = {{"system", "Be brief."}, {"user", "héllo"}, {"assistant", "hi\nthere"}};
    moh_error err;
    memset(&err, 0, sizeof err);
    char *out = NULL;
    size_t len = 0;
    const int rc = chat_template_render(tmpl, msgs, 3, size & 1, "<s>", "</s>", "fuzz.jinja", &out, &len, &err);
    if (rc == MOH_OK) {
        if (!out || strlen(out) > len || out[len] != '\0') __builtin_trap();
    } else {
        if (out || err.code != rc || !memchr(err.msg, '\0', sizeof err.msg)) __builtin_trap();
        if (rc != MOH_E_NOMEM && (strchr(err.msg, '\n') || strncmp(err.msg, "fuzz.jinja: ", 12) != 0)) __builtin_trap();
    }
    free(out);
    free(tmpl);
    return 0;
}
