#!/usr/bin/env python3
"""Renders chat templates as Hugging Face transformers' apply_chat_template does (jinja2's
ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks and loopcontrols; tojson as
json.dumps(ensure_ascii=False); raise_exception): the reference that chat_template_test's expected
renders come from, and that chat_template_reference_test compares mer's renderer with.

Input (stdin): a JSON list of cases {"template", "messages", "tools"?, "add_generation_prompt"?,
"enable_thinking"?, "bos_token"?, "eos_token"?}. Output (stdout): a JSON list, per case
{"ok": true, "text": RENDER} or {"ok": false}. Exits 77 when jinja2 is missing.
"""
import json
import sys

try:
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:
    sys.exit(77)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def render(case):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    kwargs = {"bos_token": case.get("bos_token", ""), "eos_token": case.get("eos_token", "")}
    if "enable_thinking" in case:
        kwargs["enable_thinking"] = case["enable_thinking"]
    return env.from_string(case["template"]).render(
        messages=case["messages"], tools=case.get("tools"), documents=None,
        add_generation_prompt=case.get("add_generation_prompt", True), **kwargs)


def main():
    out = []
    for case in json.load(sys.stdin):
        try:
            out.append({"ok": True, "text": render(case)})
        except Exception:  # a template error: the renderer under test must fail too
            out.append({"ok": False})
    json.dump(out, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
