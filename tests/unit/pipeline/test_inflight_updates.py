"""`pipeline.inflight_updates`: a local rollout worker loads a publication that arrives while it
generates, between two decode steps, and the run still trains every id once within the bound,
per token."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tidal.config.schema import PipelineConfig
from tidal.pipeline import loop
from tidal.pipeline import quickstart as qs
from tidal.pipeline import run as pipeline_run
from tidal.pipeline.backends import local
from tidal.storage.run import RunFolder
from tidal.storage.store import existing_run_store
from tidal.trainer.trainer import Trainer
from tidal.types import Completion, Episode

from .test_async_loop import _assert_exactly_once

KEEP_ALL = ["gate.drop_zero_variance=false", "gate.drop_truncated=false", "gate.drop_empty=false",
            "gate.max_repetition=1.0", "audit.watch.enabled=false"]
STEPS = 3


def test_a_publication_arriving_mid_generation_is_loaded_in_flight(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Batch 1 is admitted with version 0 (bound 1); its generation waits, between two steps, for
    version 1 (the trainer's update on batch 0) and goes on with it: its samples span versions 0 and 1."""
    original_sample, original_catch_up = local.LocalRollout.sample, local.LocalRollout._catch_up
    waited: list[int] = []

    def sample(self: local.LocalRollout, tasks: Any, step: int, *args: Any, **kwargs: Any) -> Any:
        self.step_now, self.calls = step, 0
        return original_sample(self, tasks, step, *args, **kwargs)

    def catch_up(self: local.LocalRollout) -> None:
        engine = self.sampler.engine
        self.calls += 1
        if self.step_now == 1 and self.calls == 4 and not waited and engine.weight_version == 0:  # 3 tokens sampled
            deadline = time.monotonic() + 120
            while self.newest().version == 0:  # type: ignore[misc, union-attr]
                assert time.monotonic() < deadline, "version 1 was never published"
                time.sleep(0.01)
            waited.append(1)
        original_catch_up(self)

    monkeypatch.setattr(local.LocalRollout, "sample", sample)
    monkeypatch.setattr(local.LocalRollout, "_catch_up", catch_up)
    qs.run_quickstart(qs.find_config("smoke"), [f"trainer.steps={STEPS}", *KEEP_ALL, "pipeline.mode=async",
                                                "algorithm.max_staleness=1", "pipeline.inflight_updates=true",
                                                "algorithm.loss=decoupled_ppo"], tmp_path, "inflight")
    run = RunFolder.open(tmp_path / "inflight")
    assert waited
    rows = [m for m in run.read_metrics() if m.get("phase") == "rl"]
    assert [m["step"] for m in rows] == list(range(1, STEPS + 1))
    assert rows[-1]["engine/inflight_loads"] >= 1
    mixed = rows[1]  # batch 1, trained at step 1: its tokens were sampled under versions 0 then 1
    assert mixed["staleness_mixed_samples"] > 0
    assert 0 < mixed["staleness_token_mean"] < 1
    assert mixed["staleness_max"] == 1
    store = existing_run_store(run)
    assert store is not None
    latest = {row["id"]: row for row in store.table(["id", "keep"]).to_pylist()}
    assert set(store.trained()) == {i for i, row in latest.items() if row["keep"]}  # each kept id trained once


def _episode(versions: list[int] | None, weight_version: int) -> Episode:
    completion = Completion([1], [2, 3, 4], [-1.0] * 3, "x", "length", weight_version, token_versions=versions)
    return Episode("r/step-000005/g000/s00", "t", "code", "g", completion)


def test_the_staleness_bound_is_checked_per_token() -> None:
    loop.check_staleness([_episode([3, 4, 5], 3)], step=5, bound=2)
    with pytest.raises(loop.StalenessError, match="tokens older than algorithm.max_staleness=1"):
        loop.check_staleness([_episode([3, 4, 5], 3)], step=5, bound=1)
    metrics = loop.staleness_metrics([_episode([3, 4, 5], 3), _episode(None, 4)], step=5)
    assert metrics["staleness/2"] == 1 and metrics["staleness/1"] == 1
    assert metrics["staleness_token_mean"] == pytest.approx((2 + 1 + 0 + 1 * 3) / 6)
    assert metrics["staleness_mixed_samples"] == 1
    assert "staleness_token_mean" not in loop.staleness_metrics([_episode(None, 4)], step=5)  # the flag off: as before


def test_inflight_updates_need_the_async_local_loop() -> None:
    with pytest.raises(ValueError, match="inflight_updates runs with mode=async and backend=local"):
        PipelineConfig(inflight_updates=True)
    with pytest.raises(ValueError, match="inflight_updates runs with mode=async and backend=local"):
        PipelineConfig(inflight_updates=True, mode="async", backend="ray")
    assert PipelineConfig(inflight_updates=True, mode="async").inflight_updates


def test_a_crash_and_resume_with_inflight_updates_trains_every_id_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    original = Trainer.rl_step
    calls = {"n": 0}

    def crash_on_third(self: Trainer, batch: Any, replay: Any = None) -> dict[str, float]:
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("simulated trainer crash")
        return original(self, batch, replay)

    monkeypatch.setattr(Trainer, "rl_step", crash_on_third)
    overrides = [f"trainer.steps={STEPS + 1}", *KEEP_ALL, "pipeline.mode=async", "algorithm.max_staleness=1",
                 "pipeline.inflight_updates=true", "rollout.inflight_kv=recompute"]
    with pytest.raises(RuntimeError, match="simulated trainer crash"):
        qs.run_quickstart(qs.find_config("smoke"), overrides, tmp_path, "crash")
    run = RunFolder.open(tmp_path / "crash")
    monkeypatch.setattr(Trainer, "rl_step", original)
    pipeline_run.run_training(run.path, [])
    store = existing_run_store(run)
    assert store is not None
    _assert_exactly_once(store, bound=1)
    assert [m["step"] for m in run.read_metrics() if m.get("phase") == "rl"] == list(range(1, STEPS + 2))
