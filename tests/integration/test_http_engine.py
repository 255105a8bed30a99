"""The HTTP rollout engine against a real `tidal serve` process (started here on a free port,
stopped at the end): generation equal to the embedded engine's on the same weights and seed,
weight reloads through POST /v1/weights with the trainer's canary check, and a short
`tidal train configs/smoke.yaml` with `rollout.engine=http`."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from tidal.config import load_config
from tidal.config.engine import HttpEngineConfig
from tidal.config.schema import ModelConfig
from tidal.errors import EngineUnavailableError, WeightVerificationError
from tidal.models.io import load_model, save_checkpoint
from tidal.pipeline.weights import canary_ids, check_canary, load_verified, publish
from tidal.rollout import EmbeddedEngine, SamplingParams
from tidal.rollout.checksum import state_checksum
from tidal.rollout.http_engine import HttpEngine, eos_ids_for

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class Served:
    url: str  # the OpenAI base URL, http://127.0.0.1:PORT/v1
    model_id: str
    folder: Path  # the checkpoint it serves


def _start(folder: Path, log: Path) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    command = [sys.executable, "-m", "tidal.cli", "serve", "--model", str(folder), "--port", str(port), "--threads", "1",
               "--device", "cpu", "--allow-weight-updates", "--weights-dir", str(folder.parent)]
    server = subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env)
    url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 180
    while True:
        assert server.poll() is None, log.read_text()
        assert time.monotonic() < deadline, "tidal serve did not come up"
        try:
            with urllib.request.urlopen(url + "/health", timeout=2):
                return server, url + "/v1"
        except OSError:
            time.sleep(0.2)


def _stop(server: subprocess.Popen) -> None:
    server.send_signal(signal.SIGTERM)
    try:
        server.wait(60)
    except subprocess.TimeoutExpired:
        server.kill()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """`tidal serve` over a saved copy of the smoke config's tiny model (the shape a smoke run trains)."""
    root = tmp_path_factory.mktemp("served")
    loaded = load_model(load_config(ROOT / "configs/smoke.yaml").model, torch.device("cpu"))
    save_checkpoint(loaded.model, loaded.tokenizer, root / "policy")
    server, url = _start(root / "policy", root / "serve.log")
    try:
        yield Served(url, "policy", root / "policy")
    finally:
        _stop(server)


def _local(served: Served) -> tuple[EmbeddedEngine, HttpEngine]:
    """An embedded engine on the served checkpoint's weights, and an HTTP engine on the server."""
    loaded = load_model(ModelConfig(path=str(served.folder), device="cpu"), torch.device("cpu"))  # type: ignore[arg-type]
    embedded = EmbeddedEngine(loaded.model, loaded.tokenizer)
    config = HttpEngineConfig(base_url=served.url, model=served.model_id)
    http = HttpEngine(config, loaded.tokenizer, vocab_size=loaded.model.config.vocab_size,
                      eos_ids=eos_ids_for(loaded.model, loaded.tokenizer))
    return embedded, http


def _server_weights(served: Served) -> dict:
    with urllib.request.urlopen(served.url + "/weights", timeout=10) as response:
        return json.loads(response.read())


def _reset(served: Served, embedded: EmbeddedEngine, http: HttpEngine) -> None:
    """Put the served checkpoint's own weights back on the server (tests share one process)."""
    load_verified(http, publish(embedded.model, 0, canary_ids(embedded.tokenizer)), 1e-3)


def test_generation_matches_the_embedded_engine(served: Served) -> None:
    embedded, http = _local(served)
    _reset(served, embedded, http)
    tokenizer = embedded.tokenizer
    prompts = [tokenizer.encode("The capital of France is"), tokenizer.encode("12 + 35 =")]
    for params in (SamplingParams(temperature=1.0, max_new_tokens=12, seed=11), SamplingParams(temperature=0, max_new_tokens=8)):
        mine, theirs = embedded.generate(prompts, 3, params), http.generate(prompts, 3, params)
        assert [len(group) for group in theirs] == [3, 3]  # n > 1
        for group_mine, group_theirs in zip(mine, theirs):
            for a, b in zip(group_mine, group_theirs):
                assert b.token_ids == a.token_ids and b.prompt_ids == a.prompt_ids
                assert b.logprobs == pytest.approx(a.logprobs, abs=1e-4)
                assert (b.text, b.finish_reason, b.weight_version) == (a.text, a.finish_reason, 0)
    sampled = http.generate(prompts[:1], 4, SamplingParams(temperature=1.0, max_new_tokens=12, seed=3))[0]
    assert len({tuple(c.token_ids) for c in sampled}) > 1  # n samples of one seed are not copies


def test_stop_strings_cut_the_text_and_keep_the_tokens(served: Served) -> None:
    embedded, http = _local(served)
    _reset(served, embedded, http)
    prompt = embedded.tokenizer.encode("Count: 1, 2, 3,")
    free = http.generate([prompt], 1, SamplingParams(temperature=0, max_new_tokens=12))[0][0]
    assert len(free.text) > 2
    stop = free.text[1:3]  # a stop string the greedy completion is sure to contain
    params = SamplingParams(temperature=0, max_new_tokens=12, stop=[stop])
    mine, theirs = embedded.generate([prompt], 1, params)[0][0], http.generate([prompt], 1, params)[0][0]
    assert theirs.finish_reason == "stop" and stop not in theirs.text
    assert (theirs.token_ids, theirs.text) == (mine.token_ids, mine.text)
    assert len(theirs.token_ids) < len(free.token_ids)


def test_a_reload_changes_outputs_and_version_and_passes_the_canary(served: Served) -> None:
    embedded, http = _local(served)
    _reset(served, embedded, http)
    prompt = embedded.tokenizer.encode("Once upon a time")
    params = SamplingParams(temperature=0, max_new_tokens=10)
    before = http.generate([prompt], 1, params)[0][0]
    with torch.no_grad():  # the trainer's update
        generator = torch.Generator().manual_seed(0)
        for parameter in embedded.model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.2)
    publication = publish(embedded.model, 5, canary_ids(embedded.tokenizer))
    load_verified(http, publication, 1e-3)  # the server's checksum, then the canary from the server
    assert _server_weights(served) == {"object": "weights", "version": 5, "checksum": publication.checksum}
    after = http.generate([prompt], 1, params)[0][0]
    assert after.weight_version == 5 and http.weight_version == 5
    assert after.logprobs != pytest.approx(before.logprobs, abs=1e-3)
    assert after.token_ids == embedded.generate([prompt], 1, params)[0][0].token_ids
    check_canary(http, publication, 1e-3)  # still holds what was verified

    with torch.no_grad():  # the next update, whose reload is skipped: the server still holds version 5
        for parameter in embedded.model.parameters():
            parameter.mul_(0.5)
    newer = publish(embedded.model, 6, canary_ids(embedded.tokenizer))
    with pytest.raises(WeightVerificationError, match="canary logprobs differ"):
        check_canary(http, newer, 1e-3)
    _reset(served, *_local(served))


def test_a_wrong_checksum_is_refused_and_the_server_stops_serving(served: Served) -> None:
    embedded, http = _local(served)
    publication = publish(embedded.model, 7, canary_ids(embedded.tokenizer))
    with pytest.raises(WeightVerificationError, match="checksum mismatch"):
        http.load_weights(publication.state, 7, "0" * 64)
    assert _server_weights(served)["version"] == -1 and http.weight_version == -1
    with pytest.raises(EngineUnavailableError, match="no verified weights"):  # 503, retried, then raised
        http.generate([[1, 2, 3]], 1, SamplingParams(max_new_tokens=2))
    _reset(served, embedded, http)
    assert _server_weights(served)["version"] == 0


def test_smoke_training_through_the_server(served: Served, tmp_path: Path) -> None:
    """`tidal train configs/smoke.yaml` with rollout.engine=http: every step publishes its weights
    to the server, whose version ends at the step count."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    command = [sys.executable, "-m", "tidal.cli", "train", str(ROOT / "configs/smoke.yaml"), "rollout.engine=http",
               f"rollout.http.base_url={served.url}", f"rollout.http.model={served.model_id}", f"run.dir={tmp_path}"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, check=False)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    run = next(tmp_path.iterdir())
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [row for row in rows if row.get("phase") == "rl"]
    assert [row["step"] for row in steps] == [1, 2] and steps[-1]["http/failures"] == 0
    # What the server holds is the trainer's final weights (the step-2 checkpoint), not just their version.
    final = load_model(ModelConfig(path=str(run / "checkpoints/rl/step-000002/model"), device="cpu"), torch.device("cpu"))  # type: ignore[arg-type]
    assert _server_weights(served) == {"object": "weights", "version": 2, "checksum": state_checksum(final.model.state_dict())}
    assert json.loads((run / "state.json").read_text())["done"] is True


def test_async_training_through_the_server(served: Served, tmp_path: Path) -> None:
    """`pipeline.mode=async` with rollout.engine=http: the rollout worker generates on the server
    ahead of the trainer and reloads each publication it is handed there (verified by checksum
    and canary), the trainer's own publications for evaluation go to the same server, and the run
    ends with the server holding the final weights. Every trained completion's weight version is
    within the staleness bound of the step that trained it."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    command = [sys.executable, "-m", "tidal.cli", "train", str(ROOT / "configs/smoke.yaml"), "rollout.engine=http",
               f"rollout.http.base_url={served.url}", f"rollout.http.model={served.model_id}", f"run.dir={tmp_path}",
               "pipeline.mode=async", "algorithm.max_staleness=1", "trainer.steps=3"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, check=False)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    run = next(tmp_path.iterdir())
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [row for row in rows if row.get("phase") == "rl"]
    assert [row["step"] for row in steps] == [1, 2, 3] and steps[-1]["http/failures"] == 0
    assert steps[-1]["http/reloads"] >= 3  # version 0 at the start, then the trainer's publications
    final = load_model(ModelConfig(path=str(run / "checkpoints/rl/step-000003/model"), device="cpu"), torch.device("cpu"))  # type: ignore[arg-type]
    assert _server_weights(served) == {"object": "weights", "version": 3, "checksum": state_checksum(final.model.state_dict())}
    assert all(row["staleness_max"] <= 1 for row in steps)  # sampled at most max_staleness updates back
    assert json.loads((run / "state.json").read_text())["done"] is True
    _reset(served, *_local(served))
