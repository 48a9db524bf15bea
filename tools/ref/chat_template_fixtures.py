#!/usr/bin/env python3
"""Renders chat templates with jinja2 as transformers' apply_chat_template does (sandboxed,
trim_blocks, lstrip_blocks, raise_exception) and writes tests/fixtures/chat_templates.json, which
tests/test_chat_template.c compares moh's renderer (src/text/chat_template.c) against.

    python3 -m venv /tmp/jenv && /tmp/jenv/bin/pip install jinja2
    /tmp/jenv/bin/python tools/ref/chat_template_fixtures.py

"templates": {name: text}; each case: the template's name, messages, add_generation_prompt, bos, eos, and either "expect" (jinja2's
text), "error" (jinja2 raised: moh must refuse too) or "moh_refuses" (jinja2 renders it, moh's
subset does not: moh must refuse with "not rendered by moh", never render something else)."""
import json
import os

from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

SMOLLM2 = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
           "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}"
           "{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
           "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")

QWEN25 = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""

LLAMA3 = ("{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
          "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + "
          "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")

ZEPHYR = """{% for message in messages %}
{% if message['role'] == 'user' %}
{{ '<|user|>
' + message['content'] + eos_token }}
{% elif message['role'] == 'system' %}
{{ '<|system|>
' + message['content'] + eos_token }}
{% elif message['role'] == 'assistant' %}
{{ '<|assistant|>
'  + message['content'] + eos_token }}
{% endif %}
{% if loop.last and add_generation_prompt %}
{{ '<|assistant|>' }}
{% endif %}
{% endfor %}"""

# a system prompt built in Jinja, and escaped literals (what the old cut-out guess got wrong)
BUILT_SYSTEM = ("{%- set default_system = \"You are \" ~ 'a \\\"careful\\\" assistant' -%}\n"
                "{%- if messages[0].role != 'system' %}{{ '<|im_start|>system\\n' + default_system + '<|im_end|>\\n' }}"
                "{%- endif %}\n{%- for m in messages %}{{ '<|im_start|>' ~ m.role ~ '\\n' ~ m.content ~ '<|im_end|>\\n' }}"
                "{%- endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")

# Mistral-style: raise_exception when roles do not alternate
ALTERNATE = ("{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
             "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
             "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] "
             "== 'assistant' %}{{ message['content'] + eos_token}}{% endif %}{% endfor %}")

SMALL = [
    "a {{- ' b ' -}} c\n  {%- if true %} d {% endif -%}  \n e",
    "line\n  {% if true %}\nyes\n  {% endif %}\nend {# a comment #}\n  {# indented comment #}\nx",
    "{% for m in messages %}{{ loop.index }}/{{ loop.length }}{{ '!' if loop.last else ',' }}{{ loop.revindex0 }}{% endfor %}",
    "{% for m in messages if m.role != 'system' %}{{ loop.index0 }}{{ m.role[0] }}{% else %}none{% endfor %}",
    "{% for m in messages[1:] %}{{ m.content | length }} {{ m.content | upper }}|{% endfor %}{{ messages[-1].role }}",
    "{% set x = 1 %}{% for m in messages %}{% set x = x + 1 %}{{ x }}{% endfor %}{{ x }}",
    "{{ messages[0].content.strip() }}|{{ messages[0].content.startswith('  h') }}|{{ (messages | length) > 1 }}",
    "{% if messages[0].nothing is defined %}d{% elif 'ell' in messages[0].content %}in{% else %}e{% endif %}",
    "{{ 'a' ~ 1 ~ none ~ true }}{{ 3 - 5 + 1 }}{{ 'x' if none is none }}{{ 'b' < 'a' }}",
    "{{ \"tab\\there\" }}{{ 'q\\'s' }}{{ 'unknown \\d escape' }}",
    "{%+ if true %}kept {% endif %}",
    "{% for m in messages %}{% if not loop.first %}, {% endif %}{{ m['role'] }}{% endfor %}",
    "{% for m in messages %}[{{ m.content[1:4] }}|{{ m.content[-1] }}|{{ m.content | length }}]{% endfor %}",
    "{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 3 * 4 }}{% for m in messages %}{{ loop.index0 % 2 }}{% endfor %}",
]

REFUSED = [  # jinja2 renders these; moh's subset does not, and must say so
    "{{ messages | tojson }}",
    "{% set ns = namespace(found=false) %}{{ ns.found }}",
    "{% for i in range(3) %}{{ i }}{% endfor %}",
    "{% macro f() %}x{% endmacro %}{{ f() }}",
    "{{ [1, 2] | length }}",
    "{{ messages[0].content.split(' ') | length }}",
    "{{ 'ünï' | upper }}",
]

CONVERSATIONS = [
    [{"role": "user", "content": "  hello there  "}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
     {"role": "user", "content": "Tell me a joke\nin two lines"}],
    [{"role": "user", "content": "ünïcödé ✓"}, {"role": "user", "content": "two users in a row"}],
]


def main():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

    def raise_exception(message):
        raise TemplateError(message)

    env.globals["raise_exception"] = raise_exception
    cases, templates = [], {}
    named = [("smollm2", SMOLLM2), ("qwen2.5", QWEN25), ("llama3", LLAMA3), ("zephyr", ZEPHYR),
             ("built_system", BUILT_SYSTEM), ("alternate", ALTERNATE)]
    named += [("small%d" % i, t) for i, t in enumerate(SMALL)]
    for name, tmpl in named:
        templates[name] = tmpl
        for ci, msgs in enumerate(CONVERSATIONS):
            for gen in (False, True):
                case = {"name": "%s/conv%d/%s" % (name, ci, "gen" if gen else "nogen"), "template": name,
                        "messages": msgs, "add_generation_prompt": gen, "bos": "<s>", "eos": "</s>"}
                try:
                    case["expect"] = env.from_string(tmpl).render(messages=msgs, add_generation_prompt=gen,
                                                                  bos_token="<s>", eos_token="</s>")
                except TemplateError as e:
                    case["error"] = str(e)
                cases.append(case)
    for i, tmpl in enumerate(REFUSED):
        env.from_string(tmpl).render(messages=CONVERSATIONS[1], add_generation_prompt=True)  # renders in jinja2
        templates["refused%d" % i] = tmpl
        cases.append({"name": "refused%d" % i, "template": "refused%d" % i, "messages": CONVERSATIONS[1],
                      "add_generation_prompt": True, "bos": "<s>", "eos": "</s>", "moh_refuses": True})
    out = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures", "chat_templates.json")
    with open(out, "w", encoding="utf-8") as f:
        json.dump({"source": "tools/ref/chat_template_fixtures.py (jinja2 %s)" % __import__("jinja2").__version__,
                   "templates": templates, "cases": cases}, f, ensure_ascii=False, indent=0)
        f.write("\n")
    print("wrote %d cases to %s" % (len(cases), os.path.normpath(out)))


if __name__ == "__main__":
    main()
