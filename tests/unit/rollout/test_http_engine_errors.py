"""The HTTP engine on hostile answers, from a small fake server (the real one, `tidal serve`, is in
tests/integration/test_http_engine.py): malformed bodies are typed errors, 5xx is retried, 4xx
is not, cancel stops a call, and the canary parser refuses what is not a logprob."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tidal.config.engine import HttpEngineConfig
from tidal.errors import (
    EngineRequestError,
    EngineResponseError,
    EngineUnavailableError,
    PreemptedError,
    WeightVerificationError,
)
from tidal.rollout.engine import SamplingParams
from tidal.rollout.http_engine import HttpEngine

VOCAB = 100


class _Tokenizer:
    eos_token_id = 2

    def __len__(self) -> int:
        return VOCAB

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return " ".join(str(i) for i in ids)


Answer = Callable[[dict[str, Any], int], tuple[int, Any]]  # (request body, call number) -> (status, body)


class _Fake:
    def __init__(self, answer: Answer) -> None:
        self.answer, self.calls = answer, 0
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", 0))
                raw = self.rfile.read(length)
                body = json.loads(raw) if self.headers.get("content-type") == "application/json" else {}
                fake.calls += 1
                status, reply = fake.answer(body, fake.calls)
                data = reply if isinstance(reply, bytes) else json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def engine(self, **overrides: Any) -> HttpEngine:
        options = {"retries": 2, "backoff_s": 0.0, "timeout_s": 5.0, **overrides}
        config = HttpEngineConfig(base_url=f"http://127.0.0.1:{self.server.server_port}/v1", model="m", **options)
        return HttpEngine(config, _Tokenizer())


@pytest.fixture
def fake() -> Iterator[Callable[[Answer], _Fake]]:
    made: list[_Fake] = []

    def start(answer: Answer) -> _Fake:
        made.append(_Fake(answer))
        return made[-1]

    yield start
    for server in made:
        server.server.shutdown()
        server.server.server_close()


def _choice(index: int = 0, ids: Any = (5, 6, 2), logprobs: Any = (-0.5, -1.0, -0.1), **extra: Any) -> dict[str, Any]:
    return {"index": index, "text": "x", "token_ids": list(ids), "finish_reason": "stop",
            "logprobs": {"token_logprobs": list(logprobs), "tokens": [f"token_id:{i}" for i in ids]}, **extra}


def _ok(*choices: dict[str, Any], **extra: Any) -> Answer:
    return lambda body, call: (200, {"choices": list(choices), **extra})


def test_a_good_answer_becomes_completions(fake: Callable[[Answer], _Fake]) -> None:
    seen: list[dict[str, Any]] = []

    def answer(body: dict[str, Any], call: int) -> tuple[int, Any]:
        seen.append(body)
        return 200, {"weight_version": 4, "choices": [_choice(1, ids=[7], logprobs=[-0.2]), _choice(0)]}

    engine = fake(answer).engine()
    [[first, second]] = engine.generate([[1, 2, 3]], 2, SamplingParams(max_new_tokens=3, seed=9, stop=["7"]))
    assert (first.token_ids, first.logprobs, first.finish_reason, first.weight_version) == ([5, 6, 2], [-0.5, -1.0, -0.1], "stop", 4)
    assert second.token_ids == [7] and second.text == ""  # decoded here, cut at the stop string
    assert seen[0]["prompt"] == [[1, 2, 3]] and seen[0]["n"] == 2 and seen[0]["seed"] == 9
    assert seen[0]["logprobs"] == 0 and seen[0]["return_token_ids"] is True and seen[0]["stop"] == ["7"]


def test_ids_from_vllm_token_strings_when_token_ids_are_missing(fake: Callable[[Answer], _Fake]) -> None:
    choice = _choice()
    del choice["token_ids"]
    [[completion]] = fake(_ok(choice)).engine().generate([[1]], 1, SamplingParams(max_new_tokens=3))
    assert completion.token_ids == [5, 6, 2]


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (lambda body, call: (200, b"not json"), "not JSON"),
        (_ok(), "0 choices for 1 prompt"),
        (_ok(_choice(ids=[5, VOCAB, 2])), "is not a token id"),
        (_ok(_choice(ids=[5, True, 2])), "is not a token id"),
        (_ok(_choice(ids=[5, "6", 2])), "is not a token id"),
        (_ok(_choice(logprobs=[-0.5, -1.0])), "2 logprobs for 3 tokens"),
        (_ok(_choice(logprobs=[-0.5, float("nan"), -0.1])), "not a finite number"),
        (_ok(_choice(logprobs=[-0.5, 3.0, -0.1])), "not a finite number"),
        (_ok(_choice(finish_reason="abort")), "finish_reason 'abort'"),
        (_ok(_choice(index=3)), "outside"),
        (_ok(_choice(prompt_token_ids=[9, 9])), "not the prompt sent"),
        (_ok({**_choice(), "logprobs": None}), "no logprobs object"),
        (_ok(_choice(), weight_version="7"), "not a version number"),
    ],
)
def test_malformed_answers_are_typed_errors(fake: Callable[[Answer], _Fake], answer: Answer, message: str) -> None:
    engine = fake(answer).engine()
    with pytest.raises(EngineResponseError, match=message):
        engine.generate([[1, 2]], 1, SamplingParams(max_new_tokens=3))


def test_a_duplicated_choice_is_refused(fake: Callable[[Answer], _Fake]) -> None:
    engine = fake(_ok(_choice(0), _choice(0))).engine()
    with pytest.raises(EngineResponseError, match="appears twice"):
        engine.generate([[1]], 2, SamplingParams(max_new_tokens=3))


def test_5xx_is_retried_then_raised(fake: Callable[[Answer], _Fake]) -> None:
    flaky = fake(lambda body, call: (503, {"error": {"message": "busy"}}) if call < 3 else (200, {"choices": [_choice()]}))
    engine = flaky.engine()
    assert engine.generate([[1]], 1, SamplingParams(max_new_tokens=3))[0][0].token_ids == [5, 6, 2]
    assert engine.run_metrics() == {"http/requests": 3, "http/retries": 2, "http/failures": 0, "http/reloads": 0,
                                    "http/reloads_skipped": 0}
    down = fake(lambda body, call: (500, {"error": {"message": "boom"}})).engine()
    with pytest.raises(EngineUnavailableError, match="500: boom after 3 attempt"):
        down.generate([[1]], 1, SamplingParams(max_new_tokens=3))


def test_4xx_is_not_retried(fake: Callable[[Answer], _Fake]) -> None:
    server = fake(lambda body, call: (404, {"error": {"message": "The model 'm' does not exist"}}))
    with pytest.raises(EngineRequestError, match="404: The model 'm' does not exist") as caught:
        server.engine().generate([[1]], 1, SamplingParams(max_new_tokens=3))
    assert caught.value.status == 404 and server.calls == 1


def test_no_server_is_unavailable() -> None:
    config = HttpEngineConfig(base_url="http://127.0.0.1:9/v1", model="m", retries=1, backoff_s=0.0, timeout_s=2.0)
    with pytest.raises(EngineUnavailableError, match="no answer"):
        HttpEngine(config, _Tokenizer()).generate([[1]], 1, SamplingParams(max_new_tokens=3))


def test_cancel_stops_before_requests_go_out(fake: Callable[[Answer], _Fake]) -> None:
    server = fake(_ok(_choice()))
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(PreemptedError):
        server.engine(prompts_per_request=1).generate([[1], [2], [3]], 1, SamplingParams(max_new_tokens=3), cancel=cancel)
    assert server.calls == 0


def test_chunks_carry_their_own_seed_and_keep_prompt_order(fake: Callable[[Answer], _Fake]) -> None:
    seeds: dict[int, int] = {}

    def answer(body: dict[str, Any], call: int) -> tuple[int, Any]:
        seeds[body["prompt"][0][0]] = body["seed"]
        return 200, {"choices": [_choice(i, ids=[p[0]], logprobs=[-1.0]) for i, p in enumerate(body["prompt"])]}

    engine = fake(answer).engine(prompts_per_request=2, max_concurrency=3)
    groups = engine.generate([[10], [11], [12], [13], [14]], 1, SamplingParams(max_new_tokens=1, seed=100))
    assert [group[0].token_ids for group in groups] == [[10], [11], [12], [13], [14]]
    assert seeds == {10: 100, 12: 101, 14: 102}


def test_prompt_logprobs_are_checked(fake: Callable[[Answer], _Fake]) -> None:
    good = [None, {"6": {"logprob": -1.5, "rank": 3}}, {"7": -0.25}]
    engine = fake(lambda body, call: (200, {"choices": [{"index": 0, "prompt_logprobs": good}]})).engine()
    assert engine.sequence_logprobs([5, 6, 7]) == [-1.5, -0.25]
    missing = [None, {"8": {"logprob": -1.0}}, {"7": -0.25}]  # not the token asked about
    engine = fake(lambda body, call: (200, {"choices": [{"index": 0, "prompt_logprobs": missing}]})).engine()
    with pytest.raises(EngineResponseError, match="no finite logprob"):
        engine.sequence_logprobs([5, 6, 7])


def test_a_409_on_reload_is_a_verification_error_and_none_is_refused(fake: Callable[[Answer], _Fake]) -> None:
    import torch

    server = fake(lambda body, call: (409, {"error": {"message": "checksum mismatch (loaded abc)", "code": "checksum_mismatch"}}))
    engine = server.engine()
    with pytest.raises(WeightVerificationError, match="checksum mismatch"):
        engine.update_weights({"w": torch.zeros(2)}, 3)
    assert engine.weight_version == -1
    with pytest.raises(TypeError, match="holds its own copy"):
        engine.update_weights(None, 4)


def test_a_reload_waits_for_generations_in_flight_and_a_repeat_is_skipped(fake: Callable[[Answer], _Fake]) -> None:
    """The async loop's threads share one engine: a reload sent while a generation is out reaches
    the server only after its answer; the same version and checksum again is not re-sent."""
    import time

    import torch

    from tidal.rollout.checksum import state_checksum

    order: list[str] = []
    release = threading.Event()

    def answer(body: dict[str, Any], call: int) -> tuple[int, Any]:
        if "prompt" in body:  # a generation: held until the test lets it go
            order.append("generate")
            release.wait(10)
            return 200, {"choices": [_choice(0)]}
        order.append("reload")
        return 200, {"version": 3, "checksum": checksum}

    state = {"w": torch.ones(2)}
    checksum = state_checksum(state)
    engine = fake(answer).engine()
    generating = threading.Thread(target=engine.generate, args=([[1, 2]], 1, SamplingParams(max_new_tokens=3)))
    generating.start()
    while not order:
        time.sleep(0.01)
    reloading = threading.Thread(target=engine.load_weights, args=(state, 3, checksum))
    reloading.start()
    time.sleep(0.3)
    assert order == ["generate"] and reloading.is_alive()  # the reload waits for the answer
    release.set()
    generating.join(10)
    reloading.join(10)
    assert order == ["generate", "reload"] and engine.weight_version == 3
    engine.load_weights(state, 3, checksum)
    assert order == ["generate", "reload"]  # skipped: the server holds it from this engine
    metrics = engine.run_metrics()
    assert (metrics["http/reloads"], metrics["http/reloads_skipped"]) == (1, 1)
