"""Concurrent local episodes share engine steps: with four episodes at once several turns run in
one step of the engine's batch, and every episode is token for token the one it is alone."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tidal.agent.local import LocalPolicy
from tidal.config.schema import ModelConfig, TinyModelConfig
from tidal.errors import SandboxUnavailableError
from tidal.eval.harness import run_eval
from tidal.eval.settings import Budgets, EvalSettings
from tidal.models import load_model
from tidal.rollout import EmbeddedEngine
from tidal.sandbox import get_backend
from tidal.sandbox.base import SandboxBackend
from tidal.tasks import generate_tasks

SETTINGS = EvalSettings(temperature=0.0, budgets=Budgets(max_steps=3, max_tokens=4096, max_new_tokens=16))


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def bwrap() -> SandboxBackend:
    try:
        return get_backend("bwrap")
    except SandboxUnavailableError as error:
        pytest.skip(f"bwrap sandbox unavailable on this host: {error}")


class CountingEngine:
    """The real engine, with the turns submitted and the turns running in each step written down."""

    def __init__(self, engine: EmbeddedEngine) -> None:
        self.engine, self.submitted, self.shared = engine, 0, []  # requests running per step

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def submit(self, request: Any) -> Any:
        self.submitted += 1
        return self.engine.submit(request)

    def step(self) -> Any:
        scheduler = self.engine._scheduler
        running = [*scheduler.decoding, *scheduler.prefilling, *scheduler.waiting]
        self.shared.append(len({id(sequence.handle) for sequence in running}))
        return self.engine.step()


def _policy(max_batch: int) -> tuple[LocalPolicy, CountingEngine]:
    loaded = load_model(ModelConfig(path="tiny", device="cpu", seed=5, tiny=TinyModelConfig(
        hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=128, max_position=4096)))
    engine = CountingEngine(EmbeddedEngine(loaded.model.eval(), loaded.tokenizer))
    return LocalPolicy(engine, loaded.tokenizer, temperature=0.0, max_batch=max_batch), engine


def _episodes(out: Path) -> dict[str, tuple[Any, ...]]:
    episodes = {}
    for record in (json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()):
        trace = json.loads((out / record["trace"]).read_text())
        episodes[record["task_id"]] = (record["outcome"], record["steps"], record["tokens_in"], record["tokens_out"],
                                       [s["validity"] for s in trace["steps"]], trace["trace"]["token_ids"])
    return episodes


def test_concurrent_turns_share_engine_steps_and_change_nothing(bwrap: SandboxBackend, tmp_path: Path) -> None:
    tasks = generate_tasks("agent", 4, "eval", seed=11, min_difficulty=1, max_difficulty=2)
    alone, alone_engine = _policy(max_batch=1)
    run_eval(alone, tasks, tmp_path / "alone", bwrap, SETTINGS, concurrency=4)
    batched, batched_engine = _policy(max_batch=4)
    run_eval(batched, tasks, tmp_path / "batched", bwrap, SETTINGS, concurrency=4)
    turns = sum(episode[1] for episode in _episodes(tmp_path / "batched").values())
    assert turns == 12  # four episodes of three turns
    assert alone_engine.submitted == batched_engine.submitted == turns
    assert set(alone_engine.shared) == {1}
    assert max(batched_engine.shared) > 1, "concurrent turns share engine steps"
    assert _episodes(tmp_path / "batched") == _episodes(tmp_path / "alone")
    alone.close()
    batched.close()
