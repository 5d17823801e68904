"""Structured output through the openai client: 50 seeded random JSON
schemas, each decoded greedily and sampled on SmolLM2; every output must
parse and validate (the `jsonschema` package). Then the other ways in
(`json_object`, llama-server's `json_schema` and `grammar` fields),
streaming, and the 400s for bad schemas and grammars."""

import concurrent.futures
import json
import random

import jsonschema
import openai
import pytest

from conftest import API_KEY

N_SCHEMAS = 50
# Every schema below bounds its output well under this (strings, arrays
# and numbers are bounded), so a `length` finish is a failure too.
MAX_TOKENS = 440

WORDS = ["name", "city", "kind", "color", "id", "size", "tags", "owner", "price", "notes",
         "level", "active", "score", "items", "title", "status", "count", "meta", "when", "ok"]
ENUM_WORDS = ["red", "green", "blue", "small", "large", "yes", "no", "alpha", "beta", "north"]


def random_schema(rng: random.Random, depth: int = 0) -> dict:
    """A schema whose every instance is short: strings have a maxLength,
    arrays a maxItems, numbers bounds (and a multipleOf for floats, so the
    digits end), objects no extra properties."""
    kinds = ["string", "integer", "number", "boolean", "enum"]
    if depth < 3:
        kinds += ["object", "array"] * (3 - depth)
    kind = rng.choice(kinds)
    if kind == "string":
        s = {"type": "string", "maxLength": rng.randint(3, 12)}
        if rng.random() < 0.3:
            s["minLength"] = rng.randint(1, 3)
        return s
    if kind == "integer":
        lo = rng.randint(-50, 50)
        s = {"type": "integer", "minimum": lo, "maximum": lo + rng.randint(0, 1000)}
        if rng.random() < 0.2:
            s["exclusiveMinimum"] = s.pop("minimum")
        return s
    if kind == "number":
        lo = rng.choice([-10, 0, 0.5, 1, 100])
        return {"type": "number", "minimum": lo, "maximum": lo + rng.choice([1, 10, 1000]),
                "multipleOf": rng.choice([0.5, 0.25, 0.1, 1])}
    if kind == "boolean":
        return {"type": "boolean"}
    if kind == "enum":
        values = rng.sample(ENUM_WORDS, rng.randint(1, 4))
        if rng.random() < 0.3:
            values.append(rng.randint(0, 9))
        return {"enum": values}
    if kind == "array":
        lo = rng.randint(0, 1)
        return {"type": "array", "items": random_schema(rng, depth + 1),
                "minItems": lo, "maxItems": lo + rng.randint(1, 3 if depth < 2 else 1)}
    return random_object(rng, depth)


def random_object(rng: random.Random, depth: int) -> dict:
    keys = rng.sample(WORDS, rng.randint(1, 5 if depth == 0 else 3))
    props = {k: random_schema(rng, depth + 1) for k in keys}
    required = [k for k in keys if rng.random() < 0.7]
    return {"type": "object", "properties": props, "required": required,
            "additionalProperties": False}


def longest(s: dict) -> int:
    """Characters of the longest instance of `s`, whitespace left out."""
    if "enum" in s:
        return max(len(json.dumps(v)) for v in s["enum"])
    t = s["type"]
    if t == "string":
        return 2 + 6 * s["maxLength"]  # each a \uXXXX escape at worst
    if t in ("integer", "number"):
        return 12
    if t == "boolean":
        return 5
    if t == "array":
        return 2 + s["maxItems"] * (longest(s["items"]) + 1)
    return 2 + sum(len(k) + 4 + longest(v) for k, v in s["properties"].items())


def top_schema(seed: int) -> dict:
    """Objects with nested objects and arrays, as OpenAI's strict mode
    takes them; every fifth seed any schema. Redrawn until its longest
    instance leaves room for whitespace within MAX_TOKENS."""
    rng = random.Random(seed)
    while True:
        s = random_schema(rng, 1) if seed % 5 == 0 else random_object(rng, 0)
        if longest(s) <= 400:
            return s


def ask(client, schema, greedy: bool, seed: int):
    r = client.chat.completions.create(
        model="test",
        messages=[{"role": "user", "content": "Reply with JSON only."}],
        response_format={"type": "json_schema",
                         "json_schema": {"name": f"s{seed}", "strict": True, "schema": schema}},
        max_tokens=MAX_TOKENS,
        temperature=0 if greedy else 0.9,
        seed=seed,
    )
    return r.choices[0]


def test_fifty_random_schemas_greedy_and_sampled_all_validate(client):
    cases = [(seed, greedy) for seed in range(N_SCHEMAS) for greedy in (True, False)]
    failures = []

    def one(case):
        seed, greedy = case
        schema = top_schema(seed)
        jsonschema.Draft202012Validator.check_schema(schema)
        choice = ask(client, schema, greedy, seed)
        text = choice.message.content
        try:
            value = json.loads(text)
            jsonschema.validate(value, schema)
        except (json.JSONDecodeError, jsonschema.ValidationError) as e:
            return f"seed {seed} {'greedy' if greedy else 'sampled'}: {e}\n  schema {json.dumps(schema)}\n  output {text!r}"
        if choice.finish_reason != "stop":
            return f"seed {seed}: finish_reason {choice.finish_reason}: {text!r}"
        return None

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        for failure in pool.map(one, cases):
            if failure:
                failures.append(failure)
    assert not failures, f"{len(failures)} of {len(cases)} outputs invalid:\n" + "\n".join(failures)


def test_greedy_is_reproducible_and_streaming_matches(client):
    schema = top_schema(7)
    a = ask(client, schema, True, 1).message.content
    b = ask(client, schema, True, 2).message.content
    assert a == b
    stream = client.chat.completions.create(
        model="test",
        messages=[{"role": "user", "content": "Reply with JSON only."}],
        response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": schema}},
        max_tokens=MAX_TOKENS,
        temperature=0,
        stream=True,
    )
    text, reasons = "", []
    for chunk in stream:
        for c in chunk.choices:
            text += c.delta.content or ""
            if c.finish_reason:
                reasons.append(c.finish_reason)
    assert text == a
    assert reasons == ["stop"]


def test_json_object_and_llama_server_fields(server, client):
    r = client.chat.completions.create(
        model="test",
        messages=[{"role": "user", "content": "A JSON object with one key."}],
        response_format={"type": "json_object"},
        max_tokens=200,
        temperature=0,
    )
    text = r.choices[0].message.content
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)
    else:
        assert text.lstrip().startswith("{")
    # llama-server's top-level `json_schema` and `grammar` (GBNF) fields.
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    r = client.completions.create(model="test", prompt="Is water wet?", max_tokens=50,
                                  temperature=0, extra_body={"json_schema": schema})
    jsonschema.validate(json.loads(r.choices[0].text), schema)
    assert r.choices[0].finish_reason == "stop"
    gbnf = 'root ::= answer "."\nanswer ::= "yes" | "no"\n'
    r = client.completions.create(model="test", prompt="Is water wet?", max_tokens=50,
                                  temperature=0.9, seed=3, extra_body={"grammar": gbnf})
    assert r.choices[0].text in ("yes.", "no.")
    assert r.choices[0].finish_reason == "stop"
    lark = '%llguidance {}\nstart: "A" /[0-9]{3}/'
    r = client.completions.create(model="test", prompt="Code:", max_tokens=50, temperature=0,
                                  extra_body={"grammar": lark})
    text = r.choices[0].text
    assert len(text) == 4 and text[0] == "A" and text[1:].isdigit(), text


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"response_format": {"type": "json_schema",
                              "json_schema": {"name": "x", "schema": {"type": "strng"}}}},
         "response_format.json_schema.schema"),
        ({"response_format": {"type": "json_schema",
                              "json_schema": {"name": "x", "schema": {"$ref": "#/$defs/missing"}}}},
         "response_format.json_schema.schema"),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"json_schema": {"type": "integer", "minimum": 3, "maximum": 1}}, "json_schema"),
        ({"grammar": "root ::= undefined"}, "grammar"),
        ({"grammar": "root ::= (\"a\""}, "grammar"),
        ({"grammar": "%llguidance {}\nstart: nothing"}, "grammar"),
    ],
)
def test_400_bad_schema_or_grammar_names_the_field(client, extra, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model="test",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=5,
            extra_body=extra,
        )
    err = e.value.body
    assert err["param"] == param, err
    assert param.split(".")[0] in err["message"] or "invalid" in err["message"].lower(), err
