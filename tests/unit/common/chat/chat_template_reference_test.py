#!/usr/bin/env python3
"""mer's chat-template renderer (chat_render) against jinja2 as transformers configures it
(reference_render.py), case by case, byte for byte: the Qwen3 template on fixed and random
conversations, and small templates for the rest of the supported Jinja subset (whitespace control,
loops, filters, tests, methods, errors). Usage: chat_template_reference_test.py CHAT_RENDER.
Exits 77 (skipped) when jinja2 is not installed."""
import json
import os
import random
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
try:
    import jinja2  # noqa: F401
except ImportError:
    print("jinja2 is not installed: skipped")
    sys.exit(77)


def qwen3_template(root):
    src = open(os.path.join(root, "common/chat/chat_template.cc"), encoding="utf-8").read()
    return src[src.index('R"TPL(') + 6:src.index(')TPL"')]


FEATURES = [
    # whitespace control: trim_blocks, lstrip_blocks, "-" and "+"
    "  {% if true %}\n  x\n  {% endif %}\n  {{ 'y' }}\n{# c #}\nz",
    "a  {%- if true -%}  b  {%- endif -%}  c\n{{- ' d ' -}}\n e",
    "{% for i in [1, 2] %}\n    {{ i }}\n{% endfor %}\n",
    "  {%+ if true %}x{% endif %}\n\t{% if 1 %}\ty\n{%- endif %}",
    "{# lead #}  \n  {#- c -#}  v {{ 1 }} \n   {% set a = 2 %}\n{{ a }}",
    "x{% if true %}\n\n{% endif %}y\r\n{% if true %}z{% endif %}",
    # expressions
    "{{ 1 + 2 * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 7 / 2 }} {{ 1 - 2 - 3 }}",
    "{{ 'a' ~ 1 ~ none ~ true }} {{ 'ab' * 3 }} {{ [1, 2] + [3] }} {{ 1.5 + 1 }} {{ 0.1 + 0.2 }} {{ 1e20 }} {{ 1e-5 }} {{ 10.0 }}",
    "{{ none }} {{ true }} {{ [1, 'a', none, true, 1.0] }} {{ {'k': 'v', 'n': [1]} }} {{ undefined_var }}|{{ \"it's\" }}",
    "{{ 1 if false }}|{{ 1 if false else 2 }}|{{ 'x' if 'a' in 'cat' else 'y' }}|{{ not 1 == 2 }}|{{ 3 not in [1, 2] }}",
    "{{ 1 < 2 < 3 }} {{ 'b' > 'a' }} {{ 1 == 1.0 }} {{ none == none }} {{ [1, [2]] == [1, [2]] }} {{ 2 >= 2 }}",
    "{{ (1, 2) }} {{ 0 or 'x' }} {{ '' and 1 }} {{ 'a' 'b' }} {{ -(3) }} {{ +4 }}",
    # slices and subscripts
    "{{ [1,2,3,4,5][::-1] }} {{ [1,2,3,4,5][1:3] }} {{ [1,2,3,4,5][::2] }} {{ 'hello'[1:] }} {{ 'héllo'[::-1] }} {{ [1,2][-1] }} {{ [1,2][5] }}|{{ 'abc'[-2] }}",
    # string methods
    "{{ '  a b  '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ '\\n\\na\\n'.lstrip('\\n') }}|{{ 'a\\n\\n'.rstrip() }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a,b,c'.split(',', 1) }}|{{ 'a,b,c'.rsplit(',', 1) }}",
    "{{ 'Hello'.startswith('He') }} {{ 'Hello'.endswith(('x', 'lo')) }} {{ 'abc'.upper() }} {{ 'ABC'.lower() }} {{ 'hello world'.title() }} {{ 'hELLO'.capitalize() }} {{ 'aXbX'.replace('X', '-') }} {{ 'abcb'.find('b') }} {{ 'abcb'.count('b') }} {{ '-'.join(['a', 'b']) }} {{ 'a\\nb\\r\\nc'.splitlines() }}",
    # dicts
    "{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}{{ {'a': 1}.keys()|list }}{{ {'a': 1}.values()|list }}{{ {'a': 1}.get('b', 'd') }}{{ {'a': 1}.get('a') }}{{ {'a': 1}['a'] }}{{ {'a': 1}.a }}",
    # loops
    "{% for x in [1, 2, 3] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.first }}{{ loop.last }}{{ loop.length }}|{% endfor %}",
    "{% for x in [] %}a{% else %}empty{% endfor %}{% for x in [1,2,3,4] if x is even %}{{ x }}{{ loop.length }}{% endfor %}",
    "{% for x in [1, 2, 3, 4] %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}",
    "{% for x in [1, 2] %}{% for y in 'ab' %}{{ x }}{{ y }}{{ loop.index }}{% endfor %}{{ loop.index }}{% endfor %}",
    "{% for x in [1,2] %}{{ loop.previtem }}-{{ loop.nextitem }};{% endfor %}",
    # scopes, namespace, set blocks
    "{% set x = 1 %}{% for i in [1, 2] %}{% set x = x + i %}{{ x }}{% endfor %}{{ x }}",
    "{% set ns = namespace(n=0) %}{% for i in [1, 2, 3] %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}",
    "{% set b %}in {{ 1 + 1 }}{% endset %}[{{ b }}]",
    "{% if false %}a{% elif none %}b{% elif 'x' %}c{% else %}d{% endif %}",
    # filters
    "{{ [1, 2, 3]|length }} {{ 'héllo'|length }} {{ {'a': 1}|length }} {{ '  x  '|trim }} {{ 'x'|upper }} {{ [3, 1, 2]|sort }} {{ [3, 1, 2]|sort(reverse=true) }} {{ [1, 2]|first }} {{ [1, 2]|last }} {{ [1, 2]|join(', ') }}",
    "{{ undefined_x|default('d') }} {{ ''|default('d') }} {{ ''|default('d', true) }} {{ '3'|int + 1 }} {{ '2.5'|float }} {{ -3|abs }} {{ [1, 1, 2]|unique|list }} {{ 'abc'|reverse }} {{ [1, 2]|reverse|list }} {{ 42|string }}",
    "{{ {'b': [1, 2.5, none, true, 'x\"y'], 'a': {}}|tojson }} {{ [1, {'k': 'ü'}]|tojson(indent=2) }} {{ 'a\\nb'|tojson }} {{ []|tojson }}",
    "{{ [{'n': 'a', 'r': 1}, {'n': 'b'}]|map(attribute='n')|join(',') }} {{ [{'n': 'a', 'r': 1}, {'n': 'b'}]|selectattr('r')|list }} {{ [{'r': 'x'}, {'r': 'y'}]|selectattr('r', 'equalto', 'y')|list }} {{ [{'r': 'x'}, {'r': 'y'}]|rejectattr('r', 'equalto', 'y')|list }} {{ ['a', 'B']|map('upper')|list }} {{ [1, 0, 2]|select|list }}",
    "{{ {'a': 1}|items|list }} {{ 'x <&> y'|e }} {{ 'abc'|replace('b', 'B') }}",
    # tests
    "{{ x is defined }} {{ none is none }} {{ 'a' is string }} {{ 1 is number }} {{ 1 is integer }} {{ 1.0 is float }} {{ {} is mapping }} {{ [] is iterable }} {{ false is false }} {{ 0 is false }} {{ true is true }} {{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby(3) }} {{ 1 is eq 1 }} {{ 'x' is not none }} {{ 'ab' is lower }}",
    # errors: both must fail
    "{{ raise_exception('no') }}",
    "{{ undefined_var.attr }}",
    "{{ 'a' + 1 }}",
    "{% if %}",
    "{% for x in 5 %}{% endfor %}",
    "{{ 1 / 0 }}",
    "{% endif %}",
    "{% if true %}never closed",
]

ROLES = ["system", "user", "assistant", "tool"]
SNIPPETS = ["Hello", "Hi there!", "", "line1\nline2", "\n\nleading", "trailing\n\n", "<think>\nplan\n</think>\n\nanswer",
            "<think>only open", "x</think>y", "ünïcödé ✓ 你好", "<tool_response>\nr\n</tool_response>", "  spaced  ",
            "a'b\"c\\d", "tab\there", "<|im_end|> inside"]


def random_conversation(rng):
    messages = []
    if rng.random() < 0.4:
        messages.append({"role": "system", "content": rng.choice(SNIPPETS)})
    for _ in range(rng.randint(1, 6)):
        role = rng.choice(ROLES[1:])
        m = {"role": role, "content": rng.choice(SNIPPETS)}
        if role == "assistant":
            r = rng.random()
            if r < 0.2:
                m["reasoning_content"] = rng.choice(SNIPPETS)
            elif r < 0.3:
                m["content"] = None
            if rng.random() < 0.25:
                args = rng.choice([{"q": "x", "n": 3, "f": 1.25, "ok": True, "none": None}, '{"raw": 1}'])
                m["tool_calls"] = [{"type": "function", "function": {"name": "lookup", "arguments": args}}]
        messages.append(m)
    return messages


def main():
    chat_render = sys.argv[1]
    root = os.path.abspath(os.path.join(HERE, "../../../.."))
    qwen3 = qwen3_template(root)
    rng = random.Random(19)
    cases = []
    for t in FEATURES:
        cases.append({"template": t, "messages": []})
    for i in range(300):
        case = {"template": qwen3, "messages": random_conversation(rng),
                "add_generation_prompt": rng.random() < 0.7}
        if rng.random() < 0.6:
            case["enable_thinking"] = rng.random() < 0.5
        if rng.random() < 0.2:
            case["tools"] = [{"type": "function", "function": {"name": "lookup", "description": "Looks up ü",
                                                                "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}]
        cases.append(case)
    data = json.dumps(cases, ensure_ascii=False)
    ref = json.loads(subprocess.run([sys.executable, os.path.join(HERE, "reference_render.py")], input=data,
                                    capture_output=True, text=True, check=True).stdout)
    got = json.loads(subprocess.run([chat_render], input=data, capture_output=True, text=True, check=True).stdout)
    failures = 0
    renders = errors = 0
    for case, r, g in zip(cases, ref, got):
        same = r["ok"] == g["ok"] and (not r["ok"] or r["text"] == g["text"])
        renders += r["ok"]
        errors += not r["ok"]
        if not same:
            failures += 1
            if failures <= 10:
                print("MISMATCH\n template: %r\n messages: %s\n reference: %r\n mer:       %r" %
                      (case["template"][:200], json.dumps(case["messages"], ensure_ascii=False), r, g))
    print("%d cases (%d renders, %d errors in both): %d mismatches" % (len(cases), renders, errors, failures))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
