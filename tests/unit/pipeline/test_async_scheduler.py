"""The scheduler inside real async runs (smoke config): a batch split across rollout workers,
a lost worker replaced after its health check, on each backend, and the held-out evaluation
holding the workers. Checked from the run folder and its trajectory store."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

from tidal.errors import WorkerLostError
from tidal.pipeline.backends.local import LocalRollout
from tidal.pipeline.stages import plan_chunks
from tidal.storage.run import RunFolder
from tidal.trainer.trainer import Trainer
from tidal.types import Task

from .test_async_loop import (
    STEPS,
    _assert_exactly_once,
    _latest,
    _ray_actor,
    _run,
    _store,
)


def _task(i: int, domain: str, agent: bool = False) -> Task:
    return Task(id=f"t{i}", domain=domain, prompt="q", verifier={"name": "exact_match"},
                **({"max_steps": 3} if agent else {}))


def test_plan_chunks_cuts_single_turn_tasks_by_priority_and_keeps_agent_tasks_together() -> None:
    tasks = [_task(0, "math"), _task(1, "code"), _task(2, "agent", agent=True), _task(3, "math"), _task(4, "code")]
    assert plan_chunks(tasks, 2) == [[0, 1], [3, 4], [2]]
    code_first = {"code": 5, "math": 0, "agent": 0}
    assert plan_chunks(tasks, 2, lambda t: code_first[t.domain]) == [[1, 4], [0, 3], [2]]
    assert plan_chunks(tasks, 64) == [[0, 1, 3, 4], [2]]


def test_a_batch_split_across_two_workers_matches_the_one_worker_run(tmp_path: Path) -> None:
    """batch_prompts=1 cuts each batch into one chunk per task; two workers generate them at once,
    and the run trains on exactly what the one-worker run trains on (same tokens, same ids)."""
    common = ["pipeline.mode=async", "algorithm.max_staleness=0", "rollout.batch_prompts=1"]
    one = _run(tmp_path, "one", *common)
    two = _run(tmp_path, "two", *common, "pipeline.rollout_workers=2")
    a, b = _latest(_store(one)), _latest(_store(two))
    strip = lambda rows: {i.split("/", 1)[1]: r["token_ids"] for i, r in rows.items()}  # the run name differs
    assert strip(a) == strip(b)
    rows = [m for m in two.read_metrics() if m.get("phase") == "rl"]
    assert any(m["rollout_workers_used"] == 2 for m in rows)
    groups = {i.rsplit("/", 1)[0] for i in b}  # one chunk per task of each batch
    assert rows[-1]["scheduler/chunks"] == len(groups)
    _assert_exactly_once(_store(two), bound=0)


def test_a_lost_local_worker_is_checked_replaced_and_its_chunk_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original_sample, original_check = LocalRollout.sample, LocalRollout.check
    broken: list[int] = []

    def sample(self: LocalRollout, *args: Any, **kwargs: Any) -> Any:
        if not broken and args[1] == 1:  # batch 1, on the first worker that gets it
            broken.append(id(self))
            raise WorkerLostError("simulated: the worker's device fell off the bus")
        return original_sample(self, *args, **kwargs)

    def check(self: LocalRollout) -> None:
        if id(self) in broken:
            raise WorkerLostError("simulated: no answer")
        original_check(self)

    monkeypatch.setattr(LocalRollout, "sample", sample)
    monkeypatch.setattr(LocalRollout, "check", check)
    run = _run(tmp_path, "lost", "pipeline.mode=async", "algorithm.max_staleness=1", "pipeline.retry_backoff_s=0.05")
    rows = [m for m in run.read_metrics() if m.get("phase") == "rl"]
    assert [m["step"] for m in rows] == list(range(1, STEPS + 1))
    last = rows[-1]
    assert last["scheduler/retries"] == 1 and last["scheduler/replaced"] == 1
    assert last["scheduler/health_failures"] >= 1 and last["restarts/rollout"] == 1
    _assert_exactly_once(_store(run), bound=1)


def test_a_ray_rollout_actor_dead_past_its_restarts_is_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ray_cluster: str
) -> None:
    """With no Ray restarts allowed, SIGKILL of the rollout actor before the second update loses
    it for good: its next call fails, the scheduler checks it (dead), starts a new actor in its
    slot and retries the chunk there; every kept id still trains once."""
    import ray

    original = Trainer.rl_step
    killed: list[int] = []

    def kill_before_second_update(self: Trainer, batch: Any, replay: Any = None) -> dict[str, float]:
        if self.updates == 1:
            pid = ray.get(_ray_actor("dead", "rollout-0").pid.remote(), timeout=60)
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        return original(self, batch, replay)

    monkeypatch.setattr(Trainer, "rl_step", kill_before_second_update)
    run = _run(tmp_path, "dead", "pipeline.mode=async", "algorithm.max_staleness=1", "pipeline.backend=ray",
               f"pipeline.ray_address={ray_cluster}", "pipeline.worker_restarts=0", "pipeline.retry_backoff_s=0.2")
    assert len(killed) == 1
    rows = [m for m in run.read_metrics() if m.get("phase") == "rl"]
    assert [m["step"] for m in rows] == list(range(1, STEPS + 1))
    assert rows[-1]["scheduler/replaced"] == 1 and rows[-1]["restarts/rollout"] >= 1
    _assert_exactly_once(_store(run), bound=1)


def test_the_held_out_evaluation_holds_the_rollout_workers(tmp_path: Path) -> None:
    run = _run(tmp_path, "evals", "pipeline.mode=async", "algorithm.max_staleness=1", "eval.every=1")
    rows = [m for m in RunFolder.open(run.path).read_metrics() if m.get("phase") == "rl"]
    evals = [m for m in run.read_metrics() if m.get("phase") == "eval"]
    assert [m["step"] for m in evals] == list(range(1, STEPS))  # after every step but the last
    # Step s's row is written before the evaluation after it: it counts the s - 1 holds before.
    assert [m["scheduler/holds"] for m in rows] == list(range(STEPS))


def test_evaluations_preempt_running_rollouts_and_the_run_trains_what_an_unpreempted_run_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With an evaluation after every step and staleness 0, each next batch's chunk starts as the
    evaluation's hold begins. Each batch's first attempt is made to wait (up to 20 s) for its
    `cancel` before it generates, so the hold preempts it mid-chunk; it runs again after the
    evaluation. The run trains exactly the tokens and ids of the same run without preemption."""
    common = ["pipeline.mode=async", "algorithm.max_staleness=0"]
    plain = _run(tmp_path, "plain", *common, "eval.every=0")  # no evaluation: nothing to preempt for
    assert [m for m in plain.read_metrics() if m.get("phase") == "rl"][-1]["scheduler/preempted_chunks"] == 0
    original = LocalRollout.sample
    first_attempts: set[int] = set()
    waited: list[bool] = []

    def sample(self: LocalRollout, tasks: Any, step: int, publication: Any, indices: Any = None,
               cancel: Any = None, kept: Any = None) -> Any:
        if cancel is not None and step >= 1 and step not in first_attempts:
            first_attempts.add(step)
            waited.append(cancel.wait(20.0))
        return original(self, tasks, step, publication, indices, cancel, kept)

    monkeypatch.setattr(LocalRollout, "sample", sample)
    preempted = _run(tmp_path, "preempted", *common, "eval.every=1")
    assert any(waited)  # some first attempt was preempted
    rows = [m for m in preempted.read_metrics() if m.get("phase") == "rl"]
    assert [m["step"] for m in rows] == list(range(1, STEPS + 1))
    assert rows[-1]["scheduler/preempted_chunks"] == sum(waited) >= 1
    assert rows[-1]["scheduler/retries"] == 0 and rows[-1]["scheduler/preempted_work_s"] > 0
    a, b = _latest(_store(plain)), _latest(_store(preempted))
    strip = lambda rows: {i.split("/", 1)[1]: r["token_ids"] for i, r in rows.items()}  # the run name differs
    assert strip(a) == strip(b)
    _assert_exactly_once(_store(preempted), bound=0)
