/* Chat templates: the Jinja subset that the chat templates of instruct models use (the GGUF key
 * tokenizer.chat_template, tokenizer_config.json's "chat_template"), rendered as transformers'
 * apply_chat_template renders them (jinja2 with trim_blocks and lstrip_blocks).
 *
 * Rendered exactly: text; {{ expr }}; {# comments #}; whitespace control ({%- -%} {{- -}}); the
 * tags if / elif / else / endif, for NAME in EXPR [if COND] / else / endfor (loop.index,
 * loop.index0, loop.first, loop.last, loop.length, loop.revindex, loop.revindex0), set NAME = EXPR;
 * expressions with string ('..', "..", Python escapes), integer, true/false/none literals, names,
 * attribute and subscript access (message.role, message['content'], messages[0], messages[1:],
 * messages[-1]), + - ~ on strings and integers, * // % on integers, == != < > <= >=, in / not in, and / or / not,
 * the tests defined, undefined, none, string, number, true, false, the filters trim, length,
 * lower and upper (ASCII text), string, the string methods strip(), lstrip(), rstrip(), startswith(), endswith(),
 * and raise_exception(message). Variables: messages (role, content), add_generation_prompt,
 * bos_token, eos_token; anything else is undefined (tools, documents: falsy).
 * Anything else that the template executes (another tag, filter, function or method, a list or
 * dict literal, namespace()) is refused with MOH_E_FORMAT naming it and its byte offset: moh never
 * feeds a template it did not render to a model. */
#ifndef MOH_CHAT_TEMPLATE_H
#define MOH_CHAT_TEMPLATE_H
#include <stdbool.h>
#include <stddef.h>

#include "moh.h"

typedef struct chat_msg {
    const char *role;     /* "system", "user", "assistant" */
    const char *content;  /* UTF-8 */
} chat_msg;

/* Renders template tmpl (NUL-terminated) for msgs[n] into *out (malloc'd, NUL-terminated; *len
 * bytes). bos / eos: the tokenizer's special tokens' text (may be NULL: undefined). label names the
 * template in messages. MOH_OK; MOH_E_FORMAT ("LABEL: byte N: ..." for a syntax error, an
 * unsupported construct, or the template's own raise_exception); MOH_E_NOMEM. */
int chat_template_render(const char *tmpl, const chat_msg *msgs, int n, bool add_generation_prompt,
                         const char *bos, const char *eos, const char *label, char **out, size_t *len,
                         moh_error *err);
#endif
