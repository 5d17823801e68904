"""Issue 21, part 3, through the official `openai` client: logprobs (chat
and completions, streamed too), logit_bias, n choices, and unknown fields
answered with a 400 naming them while what the client sends is accepted."""

import math

import openai
import pytest

from test_server import MODEL, QUESTION, metric


def test_chat_logprobs_whole_and_streamed(client):
    kw = dict(model=MODEL, messages=QUESTION, max_tokens=8, temperature=0, logprobs=True, top_logprobs=3)
    r = client.chat.completions.create(**kw)
    choice = r.choices[0]
    content = choice.logprobs.content
    assert len(content) == r.usage.completion_tokens
    assert "".join(t.token for t in content) == choice.message.content
    for t in content:
        assert bytes(t.bytes).decode("utf-8", "replace") == t.token
        assert len(t.top_logprobs) == 3
        lps = [a.logprob for a in t.top_logprobs]
        assert lps == sorted(lps, reverse=True)
        assert t.top_logprobs[0].token == t.token and t.logprob == lps[0]  # greedy
        assert sum(math.exp(lp) for lp in lps) <= 1 + 1e-6
    chunks = list(client.chat.completions.create(stream=True, **kw))
    streamed = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert [(t.token, t.logprob) for t in streamed] == [(t.token, t.logprob) for t in content]
    # Not asked for: none.
    r = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=2, temperature=0)
    assert r.choices[0].logprobs is None


def test_completion_logprobs(client):
    r = client.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=6, temperature=0, logprobs=2
    )
    lp = r.choices[0].logprobs
    assert "".join(lp.tokens) == r.choices[0].text
    assert len(lp.token_logprobs) == len(lp.tokens) == len(lp.top_logprobs) == len(lp.text_offset)
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    for tok, alts in zip(lp.tokens, lp.top_logprobs):
        assert len(alts) == 2 and tok in alts
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt="x", logprobs=6)
    assert e.value.body["param"] == "logprobs"


def test_logit_bias(server, client):
    kw = dict(model=MODEL, prompt="The capital of France is", max_tokens=4, temperature=0)
    greedy = client.completions.create(**kw).choices[0].text
    assert greedy.startswith(" Paris")
    # SmolLM2's ids (`cachefit tokenize --ids`): " Paris" 7042, " banana" 21285.
    paris, banana = 7042, 21285
    banned = client.completions.create(logit_bias={str(paris): -100}, **kw).choices[0].text
    assert not banned.startswith(" Paris"), banned
    forced = client.completions.create(logit_bias={str(banana): 100}, **kw).choices[0].text
    assert forced == " banana" * 4
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(logit_bias={"paris": 1}, **kw)
    assert e.value.body["param"] == "logit_bias"


def test_n_choices_share_the_prompt(server, client):
    messages = [{"role": "user", "content": "Write a short poem about a lighthouse keeper's cat."}]
    kw = dict(model=MODEL, messages=messages, max_tokens=10, temperature=1.0, seed=21)
    evaluated = metric(server, "cachefit_prompt_tokens_evaluated_total")
    r = client.chat.completions.create(n=3, **kw)
    assert [c.index for c in r.choices] == [0, 1, 2]
    # The prompt (but what a slot had cached) was evaluated once, not 3 times.
    fresh = r.usage.prompt_tokens - r.usage.prompt_tokens_details.cached_tokens
    assert metric(server, "cachefit_prompt_tokens_evaluated_total") - evaluated == fresh
    texts = [c.message.content for c in r.choices]
    assert len(set(texts)) > 1, texts
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    # Streamed, with usage: chunks carry their index; same texts.
    chunks = list(client.chat.completions.create(n=3, stream=True, stream_options={"include_usage": True}, **kw))
    got = ["", "", ""]
    for c in chunks[:-1]:
        assert len(c.choices) == 1 and c.usage is None
        got[c.choices[0].index] += c.choices[0].delta.content or ""
    assert got == texts
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens == r.usage.prompt_tokens
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens


def test_unknown_fields_are_named_and_client_defaults_pass(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=2, extra_body={"mirostat": 2})
    assert e.value.body["param"] == "mirostat"
    assert "mirostat" in e.value.body["message"]
    # Everything the client has a keyword for that we implement or accept.
    r = client.chat.completions.create(
        model=MODEL,
        messages=QUESTION,
        max_tokens=3,
        max_completion_tokens=3,
        temperature=0,
        top_p=1,
        n=1,
        stop=["\n\n"],
        seed=1,
        frequency_penalty=0,
        presence_penalty=0,
        logit_bias={},
        logprobs=False,
        user="someone",
        metadata={"k": "v"},
        store=False,
        service_tier="auto",
        stream=False,
    )
    assert r.choices[0].message.content
