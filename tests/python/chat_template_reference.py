"""FailSafe's chat templates against Debian's python3-jinja2, rendered the way
Hugging Face's apply_chat_template renders them (a sandboxed environment with
trim_blocks, lstrip_blocks and loop controls; its tojson; raise_exception and
strftime_now; messages, tools=None, documents=None, add_generation_prompt and
the special tokens as variables).

For every template and every conversation (with and without a generation
prompt) the output must be byte-identical; where jinja2 raises, FailSafe must
fail too (with the same message for raise_exception).

  python3 chat_template_reference.py --failsafe PATH TEMPLATE[:SPECIALS]...

TEMPLATE is a .jinja file or a tokenizer_config.json; SPECIALS is a JSON
object {"bos": ..., "eos": ..., "unk": ..., "pad": ...}.
"""
import argparse
import datetime
import json
import os
import subprocess
import sys

from jinja2 import nodes
from jinja2.exceptions import TemplateError
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def raise_exception(message):
    raise TemplateError(message)


def strftime_now(fmt):
    return datetime.datetime.now().strftime(fmt)


class Generation(Extension):
    """{% generation %}...{% endgeneration %}: renders its body."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def conversations():
    u = lambda c: {"role": "user", "content": c}  # noqa: E731
    a = lambda c: {"role": "assistant", "content": c}  # noqa: E731
    s = lambda c: {"role": "system", "content": c}  # noqa: E731
    tool_call = {"id": "call12345", "type": "function",
                 "function": {"name": "get_weather",
                              "arguments": {"city": "Zürich", "unit": "celsius", "days": 3}}}
    chats = [
        [u("Hello!")],
        [s("You are a helpful assistant."), u("Tell me a story.")],
        [s("Be brief."), u("Hi"), a("Hello! How can I help?"), u("What is 2+2?")],
        [u("Write a haiku."), a("Autumn moonlight—\na worm digs silently\ninto the chestnut.")],
        [u("")],
        [s(""), u("empty system")],
        [u("Ünïcödé 日本語 🚀 \"quotes\" 'apostrophes' \\backslash\\ and\nnew\nlines\ttabs")],
        [u("a"), a("b"), u("c"), a("d"), u("e")],
        [u("first"), u("second in a row")],
        [a("assistant first"), u("then user")],
        [u("  leading and trailing whitespace  \n\n")],
        [u("{{ not a template }} {% neither %} [INST] <|eot_id|> <s>")],
        [s("only a system message")],
        [u("Weather in Zürich?"),
         {"role": "assistant", "content": "", "tool_calls": [tool_call]},
         {"role": "tool", "content": "22", "tool_call_id": "call12345"},
         a("It is 22 degrees.")],
        [u([{"type": "text", "text": "content as text blocks"}])],
        [s("sys"), u("q1"), a("a1"), u("q2"), a("a2")],
    ]
    out = []
    for c in chats:
        for gen in (True, False):
            out.append({"messages": c, "add_generation_prompt": gen})
    # With tools, as an OpenAI request gives them.
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "The weather of a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "Its name"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer"}}, "required": ["city"]}}},
        {"type": "function", "function": {"name": "now", "description": "The time.",
                                          "parameters": {"type": "object", "properties": {}}}}]
    for c in (chats[0], chats[1], chats[13]):
        out.append({"messages": c, "add_generation_prompt": True, "tools": tools})
    return out


def reference(template, convo, specials):
    kw = {k + "_token": v for k, v in specials.items()}
    try:
        return {"text": template.render(messages=convo["messages"], tools=convo.get("tools"),
                                        documents=None,
                                        add_generation_prompt=convo["add_generation_prompt"], **kw)}
    except TemplateError as e:
        return {"error": str(e), "raised": isinstance(e.__class__, type) and
                type(e).__name__ == "TemplateError"}
    except Exception as e:  # noqa: BLE001 (a template bug surfaces as any exception)
        return {"error": f"{type(e).__name__}: {e}", "raised": False}


def check(failsafe, path, specials):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    source = json.loads(text)["chat_template"] if path.endswith(".json") else text
    template = environment().from_string(source)
    convos = conversations()
    for attempt in range(2):  # again if the date changed (strftime_now) in between
        day = datetime.date.today()
        want = [reference(template, c, specials) for c in convos]
        lines = "".join(json.dumps(dict(c, special=specials)) + "\n" for c in convos)
        out = subprocess.run([failsafe, "chat-template", "--template", path, "--jsonl", "-"],
                             input=lines.encode(), capture_output=True)
        if out.returncode != 0:
            print(f"FAIL {path}: failsafe exited {out.returncode}: {out.stderr.decode()[:2000]}")
            return 1
        got = [json.loads(l) for l in out.stdout.decode().splitlines()]
        if day == datetime.date.today():
            break
    bad = []
    rendered = errors = 0
    for c, w, g in zip(convos, want, got):
        if "text" in w:
            rendered += 1
            if g.get("text") != w["text"]:
                bad.append({"conversation": c, "want": w["text"], "got": g})
        else:
            errors += 1
            if "error" not in g or (w["raised"] and w["error"] not in g["error"]):
                bad.append({"conversation": c, "want error": w["error"], "got": g})
    name = os.path.basename(path)
    print(f"{'ok  ' if not bad else 'FAIL'} {name}: {len(convos) - len(bad)}/{len(convos)} identical "
          f"({rendered} rendered, {errors} refused by the template)")
    for b in bad[:3]:
        print("     ", json.dumps(b, ensure_ascii=False)[:1500])
    return 1 if bad else 0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--failsafe", required=True)
    p.add_argument("templates", nargs="+")
    a = p.parse_args()
    failures = 0
    for spec in a.templates:
        path, _, specials = spec.partition(":")
        failures += check(a.failsafe, path, json.loads(specials) if specials else {})
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
