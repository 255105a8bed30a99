"""A local model's single-turn answers go through the engine as one batched stream: many rows share
each engine step, and every record and answer is the one the one-at-a-time path gives for the
same seed. pass@k is unbiased, with a task-clustered interval, and pass@1 only when greedy."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tidal.agent.local import LocalPolicy
from tidal.agent.policy import OraclePolicy
from tidal.config.schema import ModelConfig, TinyModelConfig
from tidal.eval.harness import default_concurrency, run_eval
from tidal.eval.metrics import summarize
from tidal.eval.settings import EvalSettings, with_flag_sampling
from tidal.eval.stats import pass_at_k
from tidal.eval.stream import streams
from tidal.models import load_model
from tidal.rollout import EmbeddedEngine
from tidal.sandbox import get_backend
from tidal.tasks import generate_tasks
from tidal.types import Task


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class CountingEngine:
    """The real engine, with the rows running in each step written down."""

    def __init__(self, engine: EmbeddedEngine) -> None:
        self.engine, self.rows = engine, []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def step(self) -> Any:
        scheduler = self.engine._scheduler
        self.rows.append(len([*scheduler.decoding, *scheduler.prefilling]))
        return self.engine.step()


class OneAtATime:
    """The same policy seen as a generic one (no tokenizer to render a stream's prompts with): the
    harness answers through `answer_task`, one by one. Its engine gives the context window."""

    def __init__(self, policy: LocalPolicy) -> None:
        self.policy, self.name, self.engine = policy, policy.name, policy.engine

    def start(self, *args: Any, **kwargs: Any) -> Any:
        return self.policy.start(*args, **kwargs)


def _policy(temperature: float) -> tuple[LocalPolicy, CountingEngine]:
    loaded = load_model(ModelConfig(path="tiny", device="cpu", seed=5, tiny=TinyModelConfig(
        hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=128, max_position=256)))
    engine = CountingEngine(EmbeddedEngine(loaded.model.eval(), loaded.tokenizer))
    return LocalPolicy(engine, loaded.tokenizer, name="tiny", temperature=temperature), engine


def _answers(out: Path) -> dict[tuple[str, int], tuple[Any, ...]]:
    found = {}
    for record in (json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()):
        trace = json.loads((out / record["trace"]).read_text())
        found[(record["task_id"], record["epoch"])] = (record["outcome"], record["tokens_in"], record["tokens_out"],
                                                       record["termination"], trace["answer"])
    return found


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_stream_matches_one_at_a_time(tmp_path: Path, temperature: float) -> None:
    tasks = generate_tasks("math", 5, "eval", seed=3, min_difficulty=1, max_difficulty=2)
    too_long = Task(id="long", domain="math", prompt="one two three " * 120, verifier={"name": "math", "answer": "1"})
    settings = with_flag_sampling(EvalSettings(backend="unsafe_local"), temperature, 12)
    backend = get_backend("unsafe_local")
    policy, engine = _policy(temperature)
    assert streams(policy) and not streams(OneAtATime(policy)) and not streams(OraclePolicy())
    run = run_eval(policy, [*tasks, too_long], tmp_path / "stream", backend, settings, epochs=2)
    assert run.ran == 12 and max(engine.rows) >= len(tasks), "the answers share engine steps"
    run_eval(OneAtATime(policy), [*tasks, too_long], tmp_path / "alone", backend, settings, epochs=2, model="tiny")
    streamed, alone = _answers(tmp_path / "stream"), _answers(tmp_path / "alone")
    assert streamed == alone
    assert streamed[("long", 0)][0] == "context_exceeded"
    if temperature > 0:  # the seeded epochs of a task differ, and each is reproduced exactly
        assert any(streamed[(t.id, 0)][4] != streamed[(t.id, 1)][4] for t in tasks)
    policy.close()


def test_default_concurrency_by_model_kind() -> None:
    policy, _ = _policy(0.0)
    assert default_concurrency(policy) == policy.max_batch
    assert default_concurrency(OraclePolicy()) == 8


def _records(passes: dict[str, list[bool]]) -> list[dict[str, Any]]:
    return [{"task_id": task, "epoch": e, "outcome": "pass" if p else "fail", "passed": p, "domain": "d"}
            for task, results in passes.items() for e, p in enumerate(results)]


def test_pass_at_k_unbiased_with_clustered_interval() -> None:
    passes = {"a": [True, False, False, False], "b": [True, True, False, False], "c": [False] * 4,
              "d": [True] * 4}
    summary = summarize(_records(passes), epochs=4, temperature=0.8)
    assert set(summary["pass_at_k"]) == {"1", "2", "3", "4"}
    expected = sum(pass_at_k(4, sum(v), 2) for v in passes.values()) / 4
    assert summary["pass_at_k"]["2"] == pytest.approx(expected)  # (0.5 + 5/6 + 0 + 1) / 4
    for k, value in summary["pass_at_k"].items():
        low, high = summary["pass_at_k_ci"][k]
        assert 0.0 <= low < value < high <= 1.0
    # the interval is over 4 tasks, not 16 samples: as wide as the Wilson interval at n = 4
    low, high = summary["pass_at_k_ci"]["1"]
    assert high - low > 0.5
    greedy = summarize(_records({t: v[:1] * 3 for t, v in passes.items()}), epochs=3, temperature=0.0)
    assert list(greedy["pass_at_k"]) == ["1"]
