"""The LLM judge against a real `tidal serve` process (the built-in tiny model): the request is
what an OpenAI-compatible server accepts, the key comes from the environment variable the task
names, and a reply without a valid grade (a random tiny model's) is an infra error, never a 0."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tidal.config.schema import TinyModelConfig
from tidal.models.io import save_checkpoint
from tidal.models.tiny import build_tiny_model
from tidal.models.tokenizer import build_tiny_tokenizer
from tidal.reward import ScoringContext, get_verifier
from tidal.types import Outcome, Task


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _healthy(port: int) -> bool:
    try:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        connection.request("GET", "/health")
        return connection.getresponse().status == 200
    except OSError:
        return False


def _model_id(port: int) -> str:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    connection.request("GET", "/v1/models", headers={"Authorization": "Bearer judge-secret"})
    return json.loads(connection.getresponse().read())["data"][0]["id"]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(endpoint, model id) of `tidal serve` over a tiny random model saved with a 4096-token
    context (the built-in tiny model's 512 byte-tokens hold no rubric prompt)."""
    port = _free_port()
    folder = tmp_path_factory.mktemp("serve")
    tokenizer = build_tiny_tokenizer()
    shape = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64,
                            max_position=4096)
    save_checkpoint(build_tiny_model(shape, tokenizer, seed=0), tokenizer, folder / "judge-model")
    log_path = folder / "serve.log"
    command = [sys.executable, "-m", "tidal.cli", "serve", "--model", str(folder / "judge-model"), "--port", str(port),
               "--threads", "1", "--device", "cpu"]
    with log_path.open("w+") as log:
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                  env={**os.environ, "TIDAL_API_KEY": "judge-secret"})
        try:
            deadline = time.monotonic() + 180
            while not _healthy(port):
                assert server.poll() is None, log_path.read_text()
                assert time.monotonic() < deadline, "tidal serve did not come up"
                time.sleep(0.2)
            yield f"http://127.0.0.1:{port}/v1", _model_id(port)
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(60)


def _task(served: tuple[str, str], cache: Path, **extra: object) -> Task:
    endpoint, model = served
    return Task(id="essay", domain="general", prompt="Name a colour.", verifier={
        "name": "llm_judge", "endpoint": endpoint, "model": model, "rubric": "Names a colour.", "max_tokens": 8,
        "retries": 0, "timeout_s": 60, "cache_dir": str(cache), **extra})


def test_a_real_server_reply_without_a_grade_is_an_infra_error(served: tuple[str, str], tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("JUDGE_API_KEY", "judge-secret")
    score = get_verifier("llm_judge")(_task(served, tmp_path, api_key_env="JUDGE_API_KEY"), "blue", ScoringContext("local"))
    assert score.outcome is Outcome.INFRA_ERROR, score
    assert score.info["judge_reply_error"] is True and "judge judge-model: the judge's" in score.detail  # the server answered, no grade
    assert not list(tmp_path.rglob("*.json"))  # nothing cached: asked again next time


def test_an_unknown_model_name_is_an_infra_error(served: tuple[str, str], tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("JUDGE_API_KEY", "judge-secret")
    task = _task((served[0], "no-such-model"), tmp_path, api_key_env="JUDGE_API_KEY")
    score = get_verifier("llm_judge")(task, "blue", ScoringContext("local"))
    assert score.outcome is Outcome.INFRA_ERROR and "HTTP 404" in score.detail


def test_a_wrong_or_missing_key_is_an_infra_error_not_retried(served: tuple[str, str], tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("JUDGE_API_KEY", "wrong")
    for extra in ({"api_key_env": "JUDGE_API_KEY"}, {}):
        score = get_verifier("llm_judge")(_task(served, tmp_path, retries=3, **extra), "blue", ScoringContext("local"))
        assert score.outcome is Outcome.INFRA_ERROR and "HTTP 401" in score.detail and score.info["attempts"] == 1
