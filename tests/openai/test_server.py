"""`cachefit serve` through the official `openai` client (and raw HTTP for
what the client will not send), on SmolLM2-135M Q4_1 with small budgets."""

import concurrent.futures
import json
import time
import urllib.error
import urllib.request

import openai
import pytest

from conftest import API_KEY, MAX_BODY, N_CTX

MODEL = "smollm2"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def raw(server, path, body=None, key=API_KEY, method=None):
    """(status, headers, parsed JSON or text) for a raw request."""
    data = body if isinstance(body, (bytes, type(None))) else body.encode()
    req = urllib.request.Request(server.base + path, data=data, method=method)
    if key is not None:
        req.add_header("Authorization", f"Bearer {key}")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            status, headers, text = r.status, r.headers, r.read().decode()
    except urllib.error.HTTPError as e:
        status, headers, text = e.code, e.headers, e.read().decode()
    try:
        return status, headers, json.loads(text)
    except ValueError:
        return status, headers, text


def assert_openai_error(body, status_type="invalid_request_error"):
    err = body["error"]
    assert set(err) >= {"message", "type", "param", "code"}, body
    assert err["type"] == status_type, body
    return err


def metric(server, name):
    _, _, text = raw(server, "/metrics")
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{name} not in /metrics")


def test_chat_non_streaming(client):
    r = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=12, temperature=0)
    choice = r.choices[0]
    assert r.object == "chat.completion"
    assert choice.message.role == "assistant"
    assert choice.message.content
    assert choice.finish_reason in ("stop", "length")
    u = r.usage
    assert u.prompt_tokens > 5 and 1 <= u.completion_tokens <= 12
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens
    assert u.prompt_tokens_details.cached_tokens >= 0


def test_chat_streaming_equals_non_streaming(client):
    kw = dict(model=MODEL, messages=QUESTION, max_tokens=12, temperature=0)
    whole = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(stream=True, **kw))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == whole.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    assert all(c.usage is None for c in chunks)
    assert all(c.object == "chat.completion.chunk" for c in chunks)


def test_completions_and_length(client):
    r = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=6, temperature=0)
    assert r.object == "text_completion"
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 6
    assert r.choices[0].text
    chunks = list(
        client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=6, temperature=0, stream=True)
    )
    assert "".join(c.choices[0].text for c in chunks) == r.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "length"
    # Token ids work as a prompt too.
    ids = client.completions.create(model=MODEL, prompt=[1, 2, 3], max_tokens=2, temperature=0)
    assert ids.usage.prompt_tokens == 3


def test_max_completion_tokens_wins(client):
    r = client.chat.completions.create(
        model=MODEL, messages=QUESTION, max_tokens=20, max_completion_tokens=3, temperature=0
    )
    assert r.usage.completion_tokens == 3
    assert r.choices[0].finish_reason == "length"


def test_include_usage_and_cached_tokens(client):
    messages = [{"role": "user", "content": "Name three colours of the rainbow, please."}]
    kw = dict(model=MODEL, messages=messages, max_tokens=5, temperature=0)
    client.chat.completions.create(**kw)  # warms a slot with this prompt
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    last = chunks[-1]
    assert last.choices == []
    assert last.usage.completion_tokens == 5
    assert last.usage.prompt_tokens > 10
    # Everything but the prompt's last token was already in the slot.
    assert last.usage.prompt_tokens_details.cached_tokens == last.usage.prompt_tokens - 1
    assert all(c.usage is None for c in chunks[:-1])


def test_stop_strings(client):
    kw = dict(model=MODEL, prompt="Once upon a time", max_tokens=24, temperature=0)
    full = client.completions.create(**kw).choices[0].text
    words = full.split()
    assert len(words) > 3, full
    stop = words[2]
    cut = full.index(stop)
    r = client.completions.create(stop=stop, **kw)
    assert r.choices[0].text == full[:cut]
    assert r.choices[0].finish_reason == "stop"
    # As a list, and streamed: the same text, no part of the stop string.
    chunks = list(client.completions.create(stop=["zzz-never", stop], stream=True, **kw))
    assert "".join(c.choices[0].text for c in chunks) == full[:cut]
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_seed_reproducibility(client):
    kw = dict(model=MODEL, messages=QUESTION, max_tokens=16, temperature=1.0, top_p=1.0)
    a = client.chat.completions.create(seed=1234, **kw).choices[0].message.content
    b = client.chat.completions.create(seed=1234, **kw).choices[0].message.content
    assert a == b
    others = {client.chat.completions.create(seed=s, **kw).choices[0].message.content for s in (1, 2, 3)}
    assert others != {a}


def test_penalties_are_accepted(client):
    r = client.chat.completions.create(
        model=MODEL, messages=QUESTION, max_tokens=8, temperature=0, frequency_penalty=1.0, presence_penalty=0.5
    )
    assert r.usage.completion_tokens >= 1


def test_models_and_health(server, client):
    models = client.models.list()
    assert len(models.data) == 1 and models.data[0].id.endswith(".gguf")
    status, _, body = raw(server, "/health", key=None)
    assert status == 200 and body["status"] == "ok"


def test_401_wrong_or_missing_key(server):
    bad = server.client(api_key="wrong")
    with pytest.raises(openai.AuthenticationError) as e:
        bad.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=2)
    assert e.value.status_code == 401
    status, _, body = raw(server, "/v1/chat/completions", json.dumps({"messages": QUESTION}), key=None)
    assert status == 401
    assert assert_openai_error(body)["code"] == "invalid_api_key"


def test_400_malformed_and_wrong_types(server, client):
    status, _, body = raw(server, "/v1/chat/completions", '{"messages": [')
    assert status == 400
    assert_openai_error(body)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=QUESTION, temperature="hot")
    assert e.value.body["param"] == "temperature"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=-1)
    assert e.value.body["param"] == "max_tokens"
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt={"not": "a prompt"})


def test_400_prompt_longer_than_the_context(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt="hello " * (N_CTX + 10), max_tokens=2)
    assert e.value.body["code"] == "context_length_exceeded"
    assert str(N_CTX) in e.value.body["message"]


def test_413_body_too_large(server):
    body = json.dumps({"prompt": "x" * (MAX_BODY + 1000)})
    status, _, parsed = raw(server, "/v1/completions", body)
    assert status == 413
    assert assert_openai_error(parsed)["code"] == "request_too_large"


def test_disconnect_mid_stream_cancels_and_the_server_carries_on(server, client):
    cancelled = metric(server, "cachefit_generations_cancelled_total")
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Write a very long story about a dragon."}],
        max_tokens=N_CTX - 60,
        temperature=0,
        stream=True,
    )
    got = 0
    for chunk in stream:
        got += bool(chunk.choices and chunk.choices[0].delta.content)
        if got >= 3:
            break
    stream.close()
    # The slot is freed within moments, long before 450 tokens could be made.
    deadline = time.monotonic() + 10
    while metric(server, "cachefit_generations_cancelled_total") <= cancelled:
        assert time.monotonic() < deadline, "the generation was not cancelled"
        time.sleep(0.05)
    while metric(server, "cachefit_slots_busy") != 0:
        assert time.monotonic() < deadline, "the slot was not freed"
        time.sleep(0.05)
    for _ in range(3):
        r = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=4, temperature=0)
        assert r.usage.completion_tokens >= 1


def test_16_concurrent_clients_equal_one_at_a_time(server, client):
    topics = [
        "the sea", "a mountain", "bread", "a violin", "winter", "a train", "bees", "the moon",
        "a library", "rain", "a garden", "coffee", "a lighthouse", "snow", "a river", "chess",
    ]

    def ask(topic):
        r = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"Write one sentence about {topic}."}],
            max_tokens=20,
            temperature=0,
        )
        return r.choices[0].message.content, r.choices[0].finish_reason, r.usage.completion_tokens

    passes = metric(server, "cachefit_forward_passes_total")
    tokens = metric(server, "cachefit_batch_tokens_total")
    with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
        together = list(pool.map(ask, topics))
    # Passes carried several slots' tokens at once.
    per_pass = (metric(server, "cachefit_batch_tokens_total") - tokens) / (
        metric(server, "cachefit_forward_passes_total") - passes
    )
    assert per_pass > 2, per_pass
    alone = [ask(t) for t in topics]
    assert together == alone
