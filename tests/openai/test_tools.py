"""Tool calls through the openai client on Qwen2.5-Coder-0.5B-Instruct
(a real tool-calling model, `scripts/fetch-models.sh`), greedy so every
answer is reproducible: `tool_choice` auto, none, required and named,
parallel calls, the whole loop (call, `tool` result, final answer), and
streaming that reassembles to the same calls."""

import json

import jsonschema
import openai
import pytest

from conftest import API_KEY, Server, model_path

MODEL = "qwen2.5-coder"
QWEN = "Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf"

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city name"}},
            "required": ["city"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Get the local time in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
TOOLS = [WEATHER, TIME]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
PARIS = [{"role": "user", "content": "What's the weather like in Paris today?"}]


@pytest.fixture(scope="module")
def qwen():
    s = Server(
        ["-c", "2048", "--parallel", "2", "--api-key", API_KEY, "-t", "2"],
        model=model_path(QWEN),
    )
    yield s
    code = s.stop()
    assert code == 0, "".join(s.log)


@pytest.fixture
def client(qwen):
    return qwen.client()


def ask(client, messages, **kw):
    kw.setdefault("temperature", 0)
    kw.setdefault("max_tokens", 120)
    return client.chat.completions.create(model=MODEL, messages=messages, **kw)


def calls_of(message):
    """[(name, parsed arguments)] of a message; arguments must be JSON
    valid against the tool's schema."""
    out = []
    for call in message.tool_calls or []:
        assert call.type == "function"
        assert call.id.startswith("call_") and len(call.id) > 8
        args = json.loads(call.function.arguments)
        jsonschema.validate(args, SCHEMAS[call.function.name])
        out.append((call.function.name, args))
    return out


def streamed(client, messages, **kw):
    """(content, [(name, arguments text)], finish_reason) of a streamed
    answer, reassembled the way OpenAI's streams are: each call's id, type
    and name in its first chunk, its arguments in pieces after."""
    kw.setdefault("temperature", 0)
    kw.setdefault("max_tokens", 120)
    content, calls, finish = "", {}, None
    for chunk in client.chat.completions.create(model=MODEL, messages=messages, stream=True, **kw):
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        delta = choice.delta
        content += delta.content or ""
        for t in delta.tool_calls or []:
            if t.index not in calls:
                assert t.id and t.id.startswith("call_") and t.type == "function", t
                assert t.function.name, t
                calls[t.index] = [t.function.name, ""]
            else:
                assert t.id is None and not t.function.name, t
            calls[t.index][1] += t.function.arguments or ""
        finish = choice.finish_reason or finish
    assert "<tool_call" not in content, content
    return content, [tuple(calls[i]) for i in sorted(calls)], finish


def test_auto_calls_the_tool(client):
    r = ask(client, PARIS, tools=TOOLS)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.content is None
    assert calls_of(choice.message) == [("get_weather", {"city": "Paris"})]


def test_the_whole_loop(client):
    """Call, send the result back as a `tool` turn, get an answer that uses
    it. With the tools still shown, this 0.5B model calls the tool again
    rather than answer, so the follow-up says `tool_choice: none` (the
    tools are then not shown, and nothing is parsed), as a client does to
    force a text answer."""
    system = {"role": "system", "content": "You are a helpful assistant. Use the tool results to answer the user's question in one sentence."}
    first = ask(client, [system, *PARIS], tools=TOOLS)
    message = first.choices[0].message
    [(name, args)] = calls_of(message)
    assert (name, args) == ("get_weather", {"city": "Paris"})
    result = {"temperature_c": 18, "condition": "light rain"}
    history = [
        system,
        *PARIS,
        message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": json.dumps(result)},
    ]
    final = ask(client, history, tools=TOOLS, tool_choice="none")
    answer = final.choices[0]
    assert answer.finish_reason == "stop", answer
    assert answer.message.tool_calls is None
    text = answer.message.content
    assert "18" in text and "rain" in text, text
    # With the tools shown the reply is read for calls: whatever the model
    # does, the answer is well formed.
    again = ask(client, history, tools=TOOLS)
    assert again.choices[0].finish_reason in ("tool_calls", "stop", "length")
    calls_of(again.choices[0].message)


def test_prose_when_no_tool_fits(client):
    r = ask(client, [{"role": "user", "content": "Hi! Who are you?"}], tools=TOOLS)
    choice = r.choices[0]
    assert choice.finish_reason == "stop"
    assert choice.message.tool_calls is None
    # The template's system prompt says "You are Qwen, created by Alibaba
    # Cloud"; greedy text names one or the other depending on the last bits
    # of the arithmetic (attention's fused multiply-adds changed "I'm Qwen,
    # ..." into "I'm an Alibaba Cloud AI assistant ...").
    assert "Qwen" in choice.message.content or "Alibaba" in choice.message.content
    content, calls, finish = streamed(client, [{"role": "user", "content": "Hi! Who are you?"}], tools=TOOLS)
    assert (content, calls, finish) == (choice.message.content, [], "stop")


def test_tool_choice_none_answers_in_text(client):
    r = ask(client, PARIS, tools=TOOLS, tool_choice="none", max_tokens=40)
    choice = r.choices[0]
    assert choice.message.tool_calls is None
    assert choice.finish_reason in ("stop", "length")
    assert choice.message.content


@pytest.mark.parametrize(
    "question",
    ["Hi! Who are you?", "Write a haiku about the sea.", "What's the weather like in Paris today?"],
)
def test_required_always_calls(client, question):
    r = ask(client, [{"role": "user", "content": question}], tools=TOOLS, tool_choice="required")
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert len(calls_of(choice.message)) >= 1


def test_a_named_function_is_called(client):
    named = {"type": "function", "function": {"name": "get_time"}}
    r = ask(client, PARIS, tools=TOOLS, tool_choice=named)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = calls_of(choice.message)
    assert calls and all(name == "get_time" for name, _ in calls), calls


def test_parallel_calls_and_parallel_false(client):
    both = [{"role": "user", "content": "What's the weather in Paris and in Oslo?"}]
    r = ask(client, both, tools=TOOLS, tool_choice="required")
    assert calls_of(r.choices[0].message) == [
        ("get_weather", {"city": "Paris"}),
        ("get_weather", {"city": "Oslo"}),
    ]
    r = ask(client, both, tools=TOOLS, tool_choice="required", parallel_tool_calls=False)
    assert calls_of(r.choices[0].message) == [("get_weather", {"city": "Paris"})]


@pytest.mark.parametrize(
    "messages,kw",
    [
        (PARIS, {}),
        ([{"role": "user", "content": "What time is it in Tokyo?"}], {}),
        ([{"role": "user", "content": "What's the weather in Paris and in Oslo?"}], {"tool_choice": "required"}),
        (PARIS, {"tool_choice": {"type": "function", "function": {"name": "get_weather"}}}),
    ],
)
def test_streaming_reassembles_to_the_same_calls(client, messages, kw):
    whole = ask(client, messages, tools=TOOLS, **kw).choices[0]
    content, calls, finish = streamed(client, messages, tools=TOOLS, **kw)
    assert finish == whole.finish_reason == "tool_calls"
    assert content == (whole.message.content or "")
    assert calls == [(c.function.name, c.function.arguments) for c in whole.message.tool_calls]


def test_bad_tools_are_400s_naming_the_field(client):
    cases = [
        ({"tools": [{"type": "retrieval"}]}, "tools[0].type"),
        ({"tools": [{"type": "function", "function": {"name": "no spaces allowed"}}]}, "tools[0].function.name"),
        ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name"),
        ({"tools": TOOLS, "tool_choice": "always"}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ]
    for kw, param in cases:
        with pytest.raises(openai.BadRequestError) as e:
            ask(client, PARIS, **kw)
        assert e.value.body["param"] == param, (kw, e.value.body)
    bad_turns = [
        ([*PARIS, {"role": "tool", "content": "18 C"}], "messages[1].tool_call_id"),
        (
            [*PARIS, {"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"arguments": "{}"}}]}],
            "messages[1].tool_calls[0].function.name",
        ),
    ]
    for messages, param in bad_turns:
        with pytest.raises(openai.BadRequestError) as e:
            ask(client, messages, tools=TOOLS)
        assert e.value.body["param"] == param, (messages, e.value.body)
