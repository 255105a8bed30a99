"""`tidal serve` over real HTTP on a loopback port, with the official `openai` package as the client.

The tiny model is random, so outputs are checked for shape and for equality with what the engine
gives in process under the same seed, not for meaning.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from tidal.config.schema import ModelConfig
from tidal.models import load_model, render_prompt
from tidal.rollout import EmbeddedEngine, SamplingParams
from tidal.serve import RunningServer, ServeLimits, build_state, render_messages

KEY = "test-key"
MESSAGES = [{"role": "user", "content": "What is 2 + 2?"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    limits = ServeLimits(max_tokens=64, default_max_tokens=8, max_batch=16, max_queue=32, max_body_bytes=64 * 1024)
    with RunningServer(build_state("tiny", limits, api_key=KEY, device="cpu")) as running:
        yield running


@pytest.fixture(scope="module")
def client(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key=KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def in_process() -> EmbeddedEngine:
    """A second, independent tiny model from the same seed: what a user gets without the server."""
    loaded = load_model(ModelConfig(path="tiny", device="cpu", seed=0))
    return EmbeddedEngine(loaded.model.eval(), loaded.tokenizer)


def raw(server: RunningServer, method: str, path: str, body: bytes | None = None, key: str | None = KEY) -> tuple[int, Any]:
    """One plain HTTP request (no client library): status and decoded JSON body."""
    connection = http.client.HTTPConnection(server.host, server.port, timeout=60)
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    connection.request(method, path, body=body, headers=headers)
    response = connection.getresponse()
    data = response.read()
    connection.close()
    try:
        return response.status, json.loads(data)
    except ValueError:
        return response.status, data.decode()


# ---------------------------------------------------------------- the happy paths


def test_models(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list().data] == ["tiny"]
    assert client.models.retrieve("tiny").owned_by == "tidal"


def test_chat_is_well_formed_and_counts_tokens(client: openai.OpenAI, in_process: EmbeddedEngine) -> None:
    response = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=6)
    assert response.object == "chat.completion" and len(response.choices) == 1
    choice = response.choices[0]
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")
    assert response.usage.prompt_tokens == len(render_prompt(in_process.tokenizer, MESSAGES))
    assert 1 <= response.usage.completion_tokens <= 6


def test_seeded_chat_equals_the_engine_in_process(client: openai.OpenAI, in_process: EmbeddedEngine) -> None:
    kwargs: dict[str, Any] = {"model": "tiny", "messages": MESSAGES, "max_tokens": 12, "n": 3, "temperature": 0.9, "top_p": 0.95, "seed": 1234}
    first = client.chat.completions.create(**kwargs)
    second = client.chat.completions.create(**kwargs)
    texts = [c.message.content for c in first.choices]
    assert texts == [c.message.content for c in second.choices]
    assert [c.index for c in first.choices] == [0, 1, 2]
    assert len(set(texts)) > 1  # three samples, not one copied

    params = SamplingParams(temperature=0.9, top_p=0.95, max_new_tokens=12, seed=1234)
    expected = in_process.generate([render_prompt(in_process.tokenizer, MESSAGES)], n=3, params=params)[0]
    assert texts == [c.text for c in expected]
    assert [c.finish_reason for c in first.choices] == [c.finish_reason for c in expected]


def test_seeded_completions_equal_the_engine_in_process(client: openai.OpenAI, in_process: EmbeddedEngine) -> None:
    prompts = ["Once upon", "a time"]
    response = client.completions.create(model="tiny", prompt=prompts, max_tokens=8, n=2, seed=7, temperature=1.0)
    assert [c.index for c in response.choices] == [0, 1, 2, 3]
    ids = [in_process.tokenizer.encode(p) for p in prompts]
    expected = in_process.generate(ids, n=2, params=SamplingParams(max_new_tokens=8, seed=7))
    assert [c.text for c in response.choices] == [c.text for group in expected for c in group]
    assert response.usage.prompt_tokens == sum(len(i) for i in ids)
    by_ids = client.completions.create(model="tiny", prompt=ids[0], max_tokens=8, n=2, seed=7)
    alone = in_process.generate(ids[:1], n=2, params=SamplingParams(max_new_tokens=8, seed=7))[0]
    assert [c.text for c in by_ids.choices] == [c.text for c in alone]


def test_streaming_sends_the_same_answer(client: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = {"model": "tiny", "messages": MESSAGES, "max_tokens": 16, "n": 2, "seed": 99}
    whole = client.chat.completions.create(**kwargs)
    parts: dict[int, list[str]] = {0: [], 1: []}
    finish: dict[int, str] = {}
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
    assert all(chunk.object == "chat.completion.chunk" for chunk in chunks)
    for chunk in chunks:
        for choice in chunk.choices:
            parts[choice.index].append(choice.delta.content or "")
            if choice.finish_reason:
                finish[choice.index] = choice.finish_reason
    assert sum(1 for chunk in chunks for c in chunk.choices if c.delta.content) > 2  # token by token, not one blob
    assert ["".join(parts[i]) for i in (0, 1)] == [c.message.content for c in whole.choices]
    assert finish == {c.index: c.finish_reason for c in whole.choices}
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == whole.usage.total_tokens

    text_chunks = list(client.completions.create(model="tiny", prompt="abc", max_tokens=8, seed=5, stream=True))
    plain = client.completions.create(model="tiny", prompt="abc", max_tokens=8, seed=5)
    assert "".join(c.choices[0].text for c in text_chunks) == plain.choices[0].text


def test_stop_cuts_the_answer(client: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = {"model": "tiny", "messages": MESSAGES, "max_tokens": 24, "seed": 3, "temperature": 0.8}
    free = client.chat.completions.create(**kwargs).choices[0].message.content
    stop = next(ch for ch in free[3:] if ch.isprintable() and ch != "\ufffd")  # a character the model will write
    cut = client.chat.completions.create(stop=[stop], **kwargs).choices[0]
    assert cut.finish_reason == "stop"
    assert cut.message.content == free[: free.index(stop)]
    streamed = "".join(
        chunk.choices[0].delta.content or ""
        for chunk in client.chat.completions.create(stop=stop, stream=True, **kwargs)
        if chunk.choices
    )
    assert streamed == cut.message.content


def test_logprobs(client: openai.OpenAI, in_process: EmbeddedEngine) -> None:
    greedy = client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3
    ).choices[0]
    content = greedy.logprobs.content
    assert len(content) >= 1 and all(len(entry.top_logprobs) == 3 for entry in content)
    for entry in content:  # greedy: the sampled token is the most likely one, with the same logprob
        assert entry.top_logprobs[0].token == entry.token
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob, abs=1e-4)
        assert entry.logprob <= 0
    expected = in_process.generate(
        [render_prompt(in_process.tokenizer, MESSAGES)], params=SamplingParams(temperature=0, max_new_tokens=6)
    )[0][0]
    assert [bytes(e.bytes) for e in content] == [bytes([t]) for t in expected.token_ids[: len(content)]]  # byte tokens
    assert [e.logprob for e in content] == pytest.approx(expected.logprobs[: len(content)], abs=1e-5)

    text = client.completions.create(model="tiny", prompt="xy", max_tokens=5, logprobs=2, seed=1).choices[0].logprobs
    assert len(text.tokens) == len(text.token_logprobs) == len(text.top_logprobs) == len(text.text_offset)
    assert all(len(top) <= 2 for top in text.top_logprobs)


def test_tools_give_a_well_formed_answer(client: openai.OpenAI, in_process: EmbeddedEngine) -> None:
    response = client.chat.completions.create(
        model="tiny", messages=MESSAGES, tools=[WEATHER], max_tokens=10, seed=11
    )
    choice = response.choices[0]
    if choice.message.tool_calls:  # the random model will almost never, but either way is well formed
        assert choice.finish_reason == "tool_calls"
        assert all(json.loads(call.function.arguments) is not None for call in choice.message.tool_calls)
    else:
        assert isinstance(choice.message.content, str) and choice.finish_reason in ("stop", "length")
    # The tools were shown to the model: the prompt is the rendered one, longer than without them.
    with_tools = render_prompt(in_process.tokenizer, render_messages(MESSAGES, [WEATHER]))
    assert response.usage.prompt_tokens == len(with_tools) > len(render_prompt(in_process.tokenizer, MESSAGES))

    history = [
        *MESSAGES,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "-3C"},
    ]
    short = {"type": "function", "function": {"name": "get_weather"}}  # the tiny model's context is 512 bytes
    follow_up = client.chat.completions.create(model="tiny", messages=history, tools=[short], max_tokens=4, stream=True)
    assert [c for c in follow_up][-1].choices[0].finish_reason in ("stop", "length", "tool_calls")


# ---------------------------------------------------------------- errors


def test_wrong_or_missing_key_is_401(server: RunningServer) -> None:
    wrong = openai.OpenAI(base_url=server.base_url, api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as caught:
        wrong.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2)
    assert caught.value.status_code == 401 and caught.value.code == "invalid_api_key"
    status, body = raw(server, "GET", "/v1/models", key=None)
    assert status == 401 and body["error"]["code"] == "invalid_api_key"
    assert raw(server, "GET", "/health", key=None)[0] == 200  # health and metrics need no key


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"max_tokens": -1}, "max_tokens"),
        ({"max_tokens": 1000}, "max_tokens"),  # above the server's cap
        ({"temperature": 5}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"n": 0}, "n"),
        ({"n": 17}, "n"),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
        ({"messages": []}, "messages"),
        ({"stop": [""]}, "stop"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"seed": "one"}, "seed"),
        ({"seed": 1 << 70}, "seed"),  # more than a torch generator takes
        ({"frobnicate": True}, "frobnicate"),
        ({"tool_choice": "required", "tools": [WEATHER]}, "tool_choice"),
        ({"messages": [{"role": "user", "content": "x" * 5000}]}, "messages"),  # longer than the context
    ],
)
def test_bad_fields_are_400_naming_the_field(client: openai.OpenAI, change: dict[str, Any], param: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:  # extra_body: sent as is, past the client's own checks
        client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2, extra_body=change)
    assert caught.value.status_code == 400
    assert caught.value.param == param


def test_malformed_and_oversized_bodies(server: RunningServer) -> None:
    status, body = raw(server, "POST", "/v1/chat/completions", b'{"model": "tiny", "messages": [')
    assert status == 400 and body["error"]["code"] == "invalid_json"
    status, body = raw(server, "POST", "/v1/chat/completions", b"[1, 2]")
    assert status == 400 and body["error"]["type"] == "invalid_request_error"
    huge = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "x" * 100_000}]}).encode()
    status, body = raw(server, "POST", "/v1/chat/completions", huge)
    assert status == 413 and body["error"]["code"] == "request_too_large"
    status, body = raw(server, "POST", "/v1/chat/completions", json.dumps({"model": "gpt-9", "messages": MESSAGES}).encode())
    assert status == 404 and body["error"]["code"] == "model_not_found"
    status, body = raw(server, "GET", "/v1/nothing-here")
    assert status == 404 and "error" in body
    status, body = raw(server, "POST", "/v1/completions", json.dumps({"model": "tiny", "prompt": [[300000]]}).encode())
    assert status == 400 and body["error"]["param"] == "prompt"


def test_metrics_count_requests_and_tokens(server: RunningServer, client: openai.OpenAI) -> None:
    client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=3)
    status, text = raw(server, "GET", "/metrics")
    assert status == 200
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    ok = samples[("tidal_serve_requests_total", (("endpoint", "/v1/chat/completions"), ("status", "200")))]
    assert ok >= 1
    assert samples[("tidal_serve_completion_tokens_total", ())] >= 3
    assert samples[("tidal_serve_prompt_tokens_total", ())] >= len(MESSAGES[0]["content"])
    assert samples[("tidal_serve_batch_rows_count", ())] >= 1
    assert ("tidal_serve_queue_depth", ()) in samples
    assert samples[("tidal_serve_request_latency_seconds_count", (("endpoint", "/v1/chat/completions"),))] >= 1
