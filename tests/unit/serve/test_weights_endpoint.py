"""`tidal serve`'s side of weight publication (serve/weights.py), on an in-process server: the
reload endpoint's refusals, reloads by path, prompt logprobs equal to the trainer's canary, and
token ids with logprobs that cover a final eos."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from tidal.pipeline.weights import canary_ids, canary_logprobs
from tidal.rollout.checksum import state_checksum
from tidal.serve import RunningServer, build_state


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _call(url: str, body: Any = None, method: str = "POST") -> tuple[int, dict[str, Any]]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    root = tmp_path_factory.mktemp("weights")
    state = build_state("tiny", device="cpu", allow_weight_updates=True, weights_dir=root)
    with RunningServer(state) as running:
        running.root = root  # type: ignore[attr-defined]
        yield running


def _scaled_state(server: RunningServer, factor: float) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone() * factor for name, tensor in server.state.engine.model.state_dict().items()}


def test_updates_are_off_unless_allowed() -> None:
    with RunningServer(build_state("tiny", device="cpu")) as closed:
        status, body = _call(closed.base_url + "/weights", {"version": 1, "checksum": "0" * 64, "path": "/tmp"})
        assert status == 403 and body["error"]["code"] == "weight_updates_disabled"
        assert _call(closed.base_url + "/weights", method="GET") == (200, {"object": "weights", "version": 0, "checksum": None})


def test_bad_requests_are_refused(server: RunningServer, tmp_path: Path) -> None:
    url = server.base_url + "/weights"
    good = "a" * 64
    assert _call(url, {"version": -1, "checksum": good, "path": str(server.root)})[1]["error"]["param"] == "version"  # type: ignore[attr-defined]
    assert _call(url, {"version": 1, "checksum": "xyz", "path": str(server.root)})[1]["error"]["param"] == "checksum"  # type: ignore[attr-defined]
    status, body = _call(url, {"version": 1, "checksum": good, "path": str(tmp_path)})  # outside --weights-dir
    assert status == 403 and "outside" in body["error"]["message"]
    status, body = _call(url, {"version": 1, "checksum": good, "path": str(server.root / "missing")})  # type: ignore[attr-defined]
    assert status == 400 and body["error"]["code"] == "not_found"
    assert server.state.engine.weight_version == 0  # nothing was loaded


def test_a_reload_by_path_is_verified_and_served(server: RunningServer) -> None:
    folder = server.root / "v1"  # type: ignore[attr-defined]
    folder.mkdir()
    state = _scaled_state(server, 0.9)
    save_file(state, str(folder / "model.safetensors"))
    checksum = state_checksum(state)
    status, body = _call(server.base_url + "/weights", {"version": 1, "checksum": checksum, "path": str(folder)})
    assert (status, body) == (200, {"object": "weights", "version": 1, "checksum": checksum, "tensors": len(state)})
    status, answer = _call(server.base_url + "/completions", {"model": "tiny", "prompt": [5, 6], "max_tokens": 2})
    assert status == 200 and answer["weight_version"] == 1


def test_a_wrong_checksum_stops_generation_until_a_good_reload(server: RunningServer) -> None:
    folder = server.root / "v2"  # type: ignore[attr-defined]
    folder.mkdir()
    state = _scaled_state(server, 1.1)
    save_file(state, str(folder / "model.safetensors"))
    status, body = _call(server.base_url + "/weights", {"version": 2, "checksum": "b" * 64, "path": str(folder)})
    assert status == 409 and body["error"]["code"] == "checksum_mismatch"
    status, body = _call(server.base_url + "/completions", {"model": "tiny", "prompt": [5, 6], "max_tokens": 2})
    assert status == 503 and body["error"]["code"] == "weights_unverified"
    status, body = _call(server.base_url + "/weights", {"version": 2, "checksum": state_checksum(state), "path": str(folder)})
    assert status == 200 and _call(server.base_url + "/weights", method="GET")[1]["version"] == 2


def test_prompt_logprobs_are_the_trainers_canary(server: RunningServer) -> None:
    engine = server.state.engine
    ids = canary_ids(engine.tokenizer)
    status, answer = _call(server.base_url + "/completions",
                           {"model": "tiny", "prompt": ids, "max_tokens": 1, "prompt_logprobs": 2})
    assert status == 200
    entries = answer["choices"][0]["prompt_logprobs"]
    assert entries[0] is None and len(entries) == len(ids)
    got = [entry[str(token)]["logprob"] for entry, token in zip(entries[1:], ids[1:])]
    assert got == pytest.approx(canary_logprobs(engine.model, ids).tolist(), abs=1e-5)
    assert all(2 <= len(entry) <= 3 and entry[str(token)]["rank"] >= 1 for entry, token in zip(entries[1:], ids[1:]))


def test_token_ids_and_their_logprobs_cover_a_final_eos(server: RunningServer) -> None:
    engine = server.state.engine
    eos = engine.eos_ids[0]
    # Make eos the likeliest next token by far, so a greedy completion ends with it at once.
    with server.state.weights.lock, torch.no_grad():
        saved = engine.model.lm_head.weight.detach().clone()
        engine.model.lm_head.weight[eos] += 50.0
    try:
        body = {"model": "tiny", "prompt": [[5, 6]], "max_tokens": 4, "temperature": 0, "logprobs": 0,
                "return_token_ids": True, "return_tokens_as_token_ids": True}
        status, answer = _call(server.base_url + "/completions", body)
        plain = _call(server.base_url + "/completions", {**body, "return_token_ids": False})[1]
    finally:
        with server.state.weights.lock, torch.no_grad():
            engine.model.lm_head.weight.copy_(saved)
    choice = answer["choices"][0]
    assert status == 200 and choice["token_ids"][-1] == eos and choice["prompt_token_ids"] == [5, 6]
    assert choice["finish_reason"] == "stop"
    assert choice["logprobs"]["tokens"] == [f"token_id:{token}" for token in choice["token_ids"]]
    assert len(choice["logprobs"]["token_logprobs"]) == len(choice["token_ids"])
    assert len(plain["choices"][0]["logprobs"]["token_logprobs"]) == len(choice["token_ids"]) - 1  # OpenAI's: no eos


def test_token_ids_are_refused_when_streaming(server: RunningServer) -> None:
    status, body = _call(server.base_url + "/completions",
                         {"model": "tiny", "prompt": [5], "stream": True, "return_token_ids": True})
    assert status == 400 and body["error"]["param"] == "return_token_ids"
