#!/usr/bin/env python3
"""Render every chat template in crates/chat/tests/fixtures/templates for
every test conversation with Python's jinja2, the way Hugging Face
transformers' `apply_chat_template` does it, and write the results to
crates/chat/tests/fixtures/expected.json. The chat crate's tests compare
its own renderings with these byte for byte.

Requires only jinja2 (`pip install jinja2`), not transformers: the
environment below copies transformers' `_compile_jinja_template` and
`render_jinja_template` (src/transformers/utils/chat_template_utils.py):

- ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
  extensions=[AssistantTracker, jinja2.ext.loopcontrols])
- filter `tojson` = json.dumps(x, ensure_ascii=False, indent=..., ...)
  (jinja2's own `tojson` HTML-escapes, transformers replaces it)
- globals `raise_exception(msg)` (raises TemplateError(msg)) and
  `strftime_now(fmt)` (here pinned to NOW so the output is reproducible)
- render(messages=..., tools=None, documents=None,
  add_generation_prompt=..., **special_tokens, **kwargs), where the special
  tokens that are None are left out (so `bos_token is defined` is false).

Usage: python3 scripts/chat-templates/render.py   (from the repo root)
"""

import datetime
import json
import pathlib
import sys

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = pathlib.Path(__file__).resolve().parents[2]
CRATE = ROOT / "crates" / "chat"
TEMPLATES = CRATE / "tests" / "fixtures" / "templates"
OUTPUT = CRATE / "tests" / "fixtures" / "expected.json"

# strftime_now's pinned "now" (naive local time, as datetime.now() gives).
NOW = datetime.datetime(2024, 9, 5, 14, 30, 7)

# Each template with the bos/eos token strings of its model family's
# tokenizer_config.json (None: the tokenizer has no such token).
TEMPLATES_BY_NAME = {
    "smollm2": ("HuggingFaceTB-SmolLM2-135M-Instruct.jinja", "<|im_start|>", "<|im_end|>"),
    "smollm3": ("HuggingFaceTB-SmolLM3-3B.jinja", None, "<|im_end|>"),
    "qwen2.5": ("Qwen-Qwen2.5-7B-Instruct.jinja", None, "<|im_end|>"),
    "gemma-2": ("google-gemma-2-2b-it.jinja", "<bos>", "<eos>"),
    "llama-3.2": ("meta-llama-Llama-3.2-3B-Instruct.jinja", "<|begin_of_text|>", "<|eot_id|>"),
    "phi-3.5": ("microsoft-Phi-3.5-mini-instruct.jinja", "<s>", "<|endoftext|>"),
    "chatml-fallback": ("../../../src/chatml.jinja", None, None),
    "shims": ("cachefit-shims.jinja", "<s>", "</s>"),
    "generation-tag": ("cachefit-generation-tag.jinja", None, None),
    "raise": ("cachefit-raise.jinja", None, None),
}


def msg(role, content):
    return {"role": role, "content": content}


CONVERSATIONS = {
    "single_user": [msg("user", "Hello! What is 2+2?")],
    "system_user": [
        msg("system", "You are a terse assistant."),
        msg("user", "Name a prime number."),
    ],
    "multi_turn": [
        msg("system", "You are a helpful assistant."),
        msg("user", "What is the capital of France?"),
        msg("assistant", "The capital of France is Paris."),
        msg("user", "And of Italy?"),
    ],
    "empty_system": [msg("system", ""), msg("user", "Hi there")],
    "assistant_last": [
        msg("user", "Say hi."),
        msg("assistant", "Hi!"),
    ],
    "user_assistant_user": [
        msg("user", "Count to three."),
        msg("assistant", "One, two, three."),
        msg("user", "Now backwards?"),
    ],
    # Whitespace the templates trim or strip, non-ASCII text, and characters
    # an HTML-escaping engine would mangle.
    "whitespace_unicode": [
        msg("user", "  Tell me about Zürich, 日本語 too?  \n"),
        msg("assistant", "\n\nZürich is a city. <b>&'\"</b>  "),
        msg("user", "Thanks!"),
    ],
    # SmolLM3 switches its reasoning mode on these flags in the system turn.
    "system_no_think": [
        msg("system", "Be brief. /no_think"),
        msg("user", "Hi"),
    ],
    "assistant_first": [msg("assistant", "I speak first."), msg("user", "Ok.")],
}


def tool_call(id, name, arguments):
    # `arguments` a dict, as transformers documents it (the server parses
    # OpenAI's JSON string into one before rendering).
    return {"id": id, "type": "function", "function": {"name": name, "arguments": arguments}}


WEATHER = '{"temperature_c": 18, "condition": "light rain"}'

# Tool turns as OpenAI's clients send them: an assistant turn with
# `tool_calls` and null content, `tool` turns with `tool_call_id` (and
# `name`). Keys a turn does not have are absent, not None.
CONVERSATIONS.update(
    {
        "tool_round_trip": [
            msg("user", "What's the weather in Paris?"),
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [tool_call("call_1", "get_weather", {"city": "Paris"})],
            },
            {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": WEATHER},
        ],
        "tool_text_and_answer": [
            msg("system", "You are a weather bot."),
            msg("user", "Weather in Zürich?"),
            {
                "role": "assistant",
                "content": "Let me check.",
                "tool_calls": [tool_call("call_9", "get_weather", {"city": "Zürich", "unit": "c"})],
            },
            {"role": "tool", "tool_call_id": "call_9", "content": "sunny, 21 °C"},
            msg("assistant", "It is sunny and 21 °C in Zürich."),
            msg("user", "Thanks!"),
        ],
        "parallel_tool_calls": [
            msg("user", "Weather in Paris and Oslo?"),
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    tool_call("call_a", "get_weather", {"city": "Paris"}),
                    tool_call("call_b", "get_weather", {"city": "Oslo"}),
                ],
            },
            {"role": "tool", "tool_call_id": "call_a", "content": "rain"},
            {"role": "tool", "tool_call_id": "call_b", "content": "snow"},
        ],
    }
)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city <now> & 'later'.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "Zürich, 東京, ..."}},
                "required": ["city"],
            },
        },
    }
]

# Extra keyword arguments a case may pass to the template. Key order is
# alphabetical at every level so that it survives a serde_json::Map on the
# Rust side (see the chat crate's `render_with`).
EXTRAS = {
    "tools": {"tools": json.loads(json.dumps(TOOLS, sort_keys=True))},
    # SmolLM3's switch; also shows extras reach templates that ignore them.
    "no_thinking": {"enable_thinking": False},
    # Llama 3.x takes the date from here before calling strftime_now.
    "date_string": {"date_string": "01 Jan 2025"},
}

# Templates that render tools and tool turns (the others are not given
# tool conversations: SmolLM2's, for one, concatenates a None content,
# which Python refuses).
TOOL_TEMPLATES = ("qwen2.5", "llama-3.2")

# (conversation, add_generation_prompt, extra[, templates]) for every
# template, or only the templates listed.
CASES = [
    ("single_user", True, None),
    ("single_user", False, None),
    ("system_user", True, None),
    ("system_user", False, None),
    ("multi_turn", True, None),
    ("multi_turn", False, None),
    ("empty_system", True, None),
    ("empty_system", False, None),
    ("assistant_last", False, None),
    ("user_assistant_user", True, None),
    ("whitespace_unicode", True, None),
    ("whitespace_unicode", False, None),
    ("system_no_think", True, None),
    ("assistant_first", True, None),
    ("single_user", True, "tools"),
    ("multi_turn", True, "tools"),
    ("multi_turn", True, "no_thinking"),
    ("system_user", True, "date_string"),
    ("system_user", True, "tools", TOOL_TEMPLATES),
    ("tool_round_trip", True, "tools", TOOL_TEMPLATES),
    ("tool_round_trip", False, "tools", TOOL_TEMPLATES),
    ("tool_text_and_answer", True, "tools", TOOL_TEMPLATES),
    # Llama 3.2 raises: one call per turn.
    ("parallel_tool_calls", True, "tools", TOOL_TEMPLATES),
]


class AssistantTracker(jinja2.ext.Extension):
    """transformers' `{% generation %}` block, which marks the assistant's
    part of the output; rendering-wise it outputs its body unchanged."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        call = self.call_method("_generation_support")
        return nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _generation_support(self, caller):
        return caller()


def compile_template(source):
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    def strftime_now(format):
        return NOW.strftime(format)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[AssistantTracker, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(source)


def render(template, bos, eos, messages, add_generation_prompt, extra):
    special = {k: v for k, v in (("bos_token", bos), ("eos_token", eos)) if v is not None}
    kwargs = {**special, **(extra or {})}
    tools = kwargs.pop("tools", None)
    documents = kwargs.pop("documents", None)
    return template.render(
        messages=messages,
        tools=tools,
        documents=documents,
        add_generation_prompt=add_generation_prompt,
        **kwargs,
    )


def main():
    templates = {}
    cases = []
    for name, (file, bos, eos) in TEMPLATES_BY_NAME.items():
        path = (TEMPLATES / file).resolve()
        # newline="" keeps the bytes as they are: no \r\n translation.
        with open(path, encoding="utf-8", newline="") as f:
            template = compile_template(f.read())
        templates[name] = {
            "file": str(path.relative_to(CRATE)),
            "bos_token": bos,
            "eos_token": eos,
        }
        for conversation, add_generation_prompt, extra, *only in CASES:
            if only and name not in only[0]:
                continue
            case = {
                "template": name,
                "conversation": conversation,
                "add_generation_prompt": add_generation_prompt,
                "extra": extra,
            }
            try:
                case["output"] = render(
                    template,
                    bos,
                    eos,
                    CONVERSATIONS[conversation],
                    add_generation_prompt,
                    EXTRAS[extra] if extra else None,
                )
            except jinja2.exceptions.TemplateError as e:
                case["error"] = e.message
            cases.append(case)

    expected = {
        "generator": "scripts/chat-templates/render.py",
        "jinja2_version": jinja2.__version__,
        "now": NOW.isoformat(),
        "templates": templates,
        "conversations": CONVERSATIONS,
        "extras": EXTRAS,
        "cases": cases,
    }
    with open(OUTPUT, "w", encoding="utf-8", newline="\n") as f:
        json.dump(expected, f, ensure_ascii=False, indent=2)
        f.write("\n")
    errors = sum("error" in c for c in cases)
    print(f"wrote {len(cases)} cases ({errors} expected errors) to {OUTPUT.relative_to(ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
