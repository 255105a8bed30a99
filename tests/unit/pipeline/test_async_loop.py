"""The asynchronous loop on the smoke config, on each backend (`local`, and `ray` on a real local
Ray cluster): staleness bound, exactly once, on-policy at bound 0, resume after a crash, overlap.
Checked from the run folder and its trajectory store, never from timings."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tidal.pipeline import async_source
from tidal.pipeline import quickstart as qs
from tidal.pipeline import run as pipeline_run
from tidal.pipeline.weights import WeightTimeoutError
from tidal.storage.run import RunFolder
from tidal.storage.store import TrajectoryStore, existing_run_store
from tidal.trainer.trainer import Trainer

# Keep every sample (the smoke model's groups are mostly zero-variance), so that every step trains.
KEEP_ALL = ["gate.drop_zero_variance=false", "gate.drop_truncated=false", "gate.drop_empty=false",
            "gate.max_repetition=1.0", "audit.watch.enabled=false"]
STEPS = 4


def _run(tmp_path: Path, name: str, *overrides: str) -> RunFolder:
    qs.run_quickstart(qs.find_config("smoke"), [f"trainer.steps={STEPS}", *KEEP_ALL, *overrides], tmp_path, name)
    return RunFolder.open(tmp_path / name)


def _store(run: RunFolder) -> TrajectoryStore:
    store = existing_run_store(run)
    assert store is not None
    return store


def _latest(store: TrajectoryStore) -> dict[str, dict[str, Any]]:
    table = store.table(["id", "step", "weight_version", "keep", "task_id", "token_ids", "attempt"])
    return {row["id"]: row for row in table.to_pylist()}


def _assert_exactly_once(store: TrajectoryStore, bound: int) -> dict[str, int]:
    """Every kept id trained exactly once (the ledger), none older than `bound`. Returns the
    staleness histogram of the trained samples."""
    latest, trained = _latest(store), store.trained()
    kept = {i for i, row in latest.items() if row["keep"]}
    assert kept and set(trained) == kept
    assert store.unconsumed() == []
    ledger = store.files.read_all("ledger", True, ["event", "id"])
    trained_rows = [i for _, part in ledger for e, i in zip(*(part.column(c).to_pylist() for c in ("event", "id"))) if e == "trained"]
    histogram: dict[int, int] = {}
    for id_, step in trained.items():
        assert latest[id_]["step"] == step  # batch b is trained at step b
        staleness = step - latest[id_]["weight_version"]
        assert 0 <= staleness <= bound, (id_, staleness)
        histogram[staleness] = histogram.get(staleness, 0) + 1
    if not any(e == "rollback" for _, part in store.files.read_all("ledger", True, ["event"]) for e in part.column("event").to_pylist()):
        assert len(trained_rows) == len(set(trained_rows))  # no resume: not even a voided duplicate
    return histogram


def _force_rollout_ahead(monkeypatch: pytest.MonkeyPatch, bound: int) -> list[tuple[int, int]]:
    """Hold update `s` until the rollout thread has gone as far as it may: batch `s + bound`
    started and batch `s + bound + 1` refused admission (or started, if admission is broken).
    Records (step, weight version) of each batch started."""
    started: list[tuple[int, int]] = []
    refused: list[int] = []
    changed = threading.Condition()
    original_generate, original_step, original_wait = async_source._Sampler._generate, Trainer.rl_step, async_source.WeightChannel.wait

    def generate(self: Any, tasks: Any, step: int, publication: Any) -> Any:
        with changed:
            started.append((step, publication.version))
            changed.notify_all()
        return original_generate(self, tasks, step, publication)

    def wait(self: async_source.WeightChannel, timeout: float) -> None:
        with changed:  # the rollout thread waits for weights only when admission refused its next batch
            refused.append(max((s for s, _ in started), default=-1) + 1)
            changed.notify_all()
        original_wait(self, timeout)

    def went_far_enough(target: int) -> bool:
        if target == STEPS - 1:
            return any(s >= target for s, _ in started)
        return target + 1 in refused or any(s > target for s, _ in started)

    def rl_step(self: Trainer, batch: Any, replay: Any = None) -> dict[str, float]:
        target = min(self.updates + bound, STEPS - 1)
        with changed:
            assert changed.wait_for(lambda: went_far_enough(target), timeout=120)
        return original_step(self, batch, replay)

    monkeypatch.setattr(async_source._Sampler, "_generate", generate)
    monkeypatch.setattr(async_source.WeightChannel, "wait", wait)
    monkeypatch.setattr(Trainer, "rl_step", rl_step)
    return started


def test_async_run_respects_the_staleness_bound_and_trains_each_id_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: list[str]
) -> None:
    started = _force_rollout_ahead(monkeypatch, bound=2)
    run = _run(tmp_path, "async", "pipeline.mode=async", "algorithm.max_staleness=2", "pipeline.queue_size=4",
               "algorithm.loss=decoupled_ppo", *backend)

    # Admission control: no batch was started with weights older than the bound allows.
    assert sorted(s for s, _ in started) == list(range(STEPS))
    assert all(step - version <= 2 for step, version in started)
    # Held back as far as the bound allows, batch b was made with version max(b - 2, 0).
    assert sorted(started) == [(b, max(b - 2, 0)) for b in range(STEPS)]
    histogram = _assert_exactly_once(_store(run), bound=2)
    assert histogram.get(2), "the held-back trainer must have trained samples 2 updates stale"

    for name in ("summary.json", "report.html", "state.json", "config.yaml", "eval/before.jsonl", "eval/after.jsonl"):
        assert (run.path / name).is_file(), name
    assert (run.checkpoints_dir / "rl" / f"step-{STEPS:06d}").is_dir()
    rows = [m for m in run.read_metrics() if m.get("phase") == "rl"]
    assert [m["step"] for m in rows] == list(range(1, STEPS + 1))
    for m in rows:
        assert {"trainer_idle_s", "sampler_idle_s", "queue_depth", "staleness_max", "trained_samples"} <= set(m)
        assert m["staleness_max"] <= 2
        assert sum(v for k, v in m.items() if k.startswith("staleness/")) == m["trained_samples"]
        assert "is_weight_mean" in m  # the decoupled PPO loss ran


@pytest.fixture(scope="module")
def sync_run(tmp_path_factory: pytest.TempPathFactory) -> RunFolder:
    """The synchronous loop's run, once for the module."""
    return _run(tmp_path_factory.mktemp("sync"), "sync")


def test_bound_zero_is_on_policy_and_matches_the_sync_loop(tmp_path: Path, sync_run: RunFolder, backend: list[str]) -> None:
    sync = sync_run
    on_policy = _run(tmp_path, "async0", "pipeline.mode=async", "algorithm.max_staleness=0", *backend)
    _assert_exactly_once(_store(on_policy), bound=0)
    sync_rows, async_rows = _latest(_store(sync)), _latest(_store(on_policy))
    rename = {i: i.replace("async0/", "sync/", 1) for i in async_rows}
    assert sorted(rename.values()) == sorted(sync_rows)
    for id_, row in async_rows.items():
        twin = sync_rows[rename[id_]]
        assert row["weight_version"] == row["step"] == twin["weight_version"]
        # Same weights, same seed: the same samples as the synchronous loop, token for token.
        assert (row["task_id"], row["token_ids"]) == (twin["task_id"], twin["token_ids"])
    files = lambda run: sorted(str(p.relative_to(run.path)) for p in run.path.iterdir())
    assert files(sync) == files(on_policy)
    rows = [json.loads(line) for line in (sync.path / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rl_rows = [row for row in rows if row.get("phase") == "rl"]
    # The engine's own counters reach every row: the paged engine prefilled each step's prompts;
    # in the async run, the rollout workers' engines (on either backend).
    async_rl_rows = [row for row in on_policy.read_metrics() if row.get("phase") == "rl"]
    for row in rl_rows + async_rl_rows:
        assert row["engine/prompt_tokens"] > 0 and 0 <= row["engine/reuse_rate"] <= 1, row["step"]


def test_resume_after_a_crash_trains_every_id_exactly_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: list[str]
) -> None:
    original = Trainer.rl_step
    calls = {"n": 0}

    def crash_on_third(self: Trainer, batch: Any, replay: Any = None) -> dict[str, float]:
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("simulated trainer crash")
        return original(self, batch, replay)

    monkeypatch.setattr(Trainer, "rl_step", crash_on_third)
    overrides = ["pipeline.mode=async", "algorithm.max_staleness=1", *backend]
    with pytest.raises(RuntimeError, match="simulated trainer crash"):
        _run(tmp_path, "crash", *overrides)
    run = RunFolder.open(tmp_path / "crash")
    before = _store(run).table(["id", "task_id"], all_versions=True).to_pylist()
    first_tasks = {row["id"]: row["task_id"] for row in before}

    monkeypatch.setattr(Trainer, "rl_step", original)
    pipeline_run.run_training(run.path, [])
    store = _store(run)
    _assert_exactly_once(store, bound=1)
    steps = [m["step"] for m in run.read_metrics() if m.get("phase") == "rl"]
    assert steps == [1, 2, 3, 4]  # resumed from the step-2 checkpoint
    # The checkpoint held the mixer as of step 2, not the rollout thread's (ahead) state: the
    # redone batches used the tasks the crashed attempt had drawn for them.
    for id_, row in _latest(store).items():
        if id_ in first_tasks:
            assert row["task_id"] == first_tasks[id_], id_
    assert any(row["attempt"] > 0 for row in _latest(store).values())


def test_the_next_batch_is_generated_while_this_one_is_scored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: list[str]
) -> None:
    """Scoring batch b waits until batch b + 1 has started generating: a loop that samples and
    scores in turn on one thread would never get there (and the wait would time out). Two
    scorers share each batch."""
    started: set[int] = set()
    overlapped: list[tuple[int, bool]] = []
    changed = threading.Condition()
    original_generate, original_score = async_source._Sampler._generate, async_source._Scoring.run

    def generate(self: Any, tasks: Any, step: int, publication: Any) -> Any:
        with changed:
            started.add(step)
            changed.notify_all()
        return original_generate(self, tasks, step, publication)

    def score(self: async_source._Scoring) -> None:
        step = self.sampled.step
        if step + 1 < STEPS:
            with changed:
                overlapped.append((step, changed.wait_for(lambda: step + 1 in started, timeout=30)))
        original_score(self)

    monkeypatch.setattr(async_source._Sampler, "_generate", generate)
    monkeypatch.setattr(async_source._Scoring, "run", score)
    run = _run(tmp_path, "overlap", "pipeline.mode=async", "algorithm.max_staleness=1", "pipeline.scorer_workers=2", *backend)
    assert overlapped == [(step, True) for step in range(STEPS - 1)]
    _assert_exactly_once(_store(run), bound=1)
    rows = [m for m in run.read_metrics() if m.get("phase") == "rl"]
    assert all(m["scorer_idle_s"] >= 0 and m["sampler_idle_s"] >= 0 for m in rows)


def _score_with_depth(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: list[str], depth: int) -> None:
    """Scoring batch b waits (up to 30 s, or 1 s at depth 1) until batch b + 1's scoring has
    started; then the run must have trained every batch in step order, each id once."""
    scoring: set[int] = set()
    overlapped: list[tuple[int, bool]] = []
    changed = threading.Condition()
    original_score = async_source._Scoring.run

    def score(self: async_source._Scoring) -> None:
        step = self.sampled.step
        with changed:
            scoring.add(step)
            changed.notify_all()
            if step + 1 < STEPS:
                overlapped.append((step, changed.wait_for(lambda: step + 1 in scoring, timeout=30 if depth > 1 else 1)))
        original_score(self)

    monkeypatch.setattr(async_source._Scoring, "run", score)
    run = _run(tmp_path, f"depth-{depth}", "pipeline.mode=async", "algorithm.max_staleness=1",
               f"pipeline.scoring_depth={depth}", *backend)
    assert overlapped == [(step, depth > 1) for step in range(STEPS - 1)]
    _assert_exactly_once(_store(run), bound=1)
    rows = [m for m in run.read_metrics() if m.get("phase") == "rl"]
    assert [m["step"] for m in rows] == list(range(1, STEPS + 1))


def test_the_next_batch_is_scored_while_this_one_still_is_and_both_train_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: list[str]
) -> None:
    """`pipeline.scoring_depth: 2` (the default): batch b + 1's scoring starts while batch b's
    runs (one batch scored after another would never get there, and the wait would time out)."""
    _score_with_depth(tmp_path, monkeypatch, backend, depth=2)


def test_at_scoring_depth_one_batches_are_scored_one_after_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _score_with_depth(tmp_path, monkeypatch, ["pipeline.backend=local"], depth=1)


def test_a_trainer_that_stops_publishing_times_the_sampler_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On-policy, batch 1 needs weight version 1; the trainer takes longer than
    `pipeline.weight_timeout_s` to publish it, so the run fails with WeightTimeoutError, not a hang."""
    original = Trainer.rl_step

    def slow(self: Trainer, batch: Any, replay: Any = None) -> dict[str, float]:
        time.sleep(4.0)
        return original(self, batch, replay)

    monkeypatch.setattr(Trainer, "rl_step", slow)
    with pytest.raises(WeightTimeoutError, match=r"waited 1 s for weight version 1 or newer; version 0 was published"):
        _run(tmp_path, "timeout", "pipeline.mode=async", "algorithm.max_staleness=0", "pipeline.weight_timeout_s=1")
    steps = [m["step"] for m in RunFolder.open(tmp_path / "timeout").read_metrics() if m.get("phase") == "rl"]
    assert steps == [1]  # the update that was running finished; none came after it


def test_two_rollout_workers_share_the_batches_which_still_train_in_order_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: list[str]
) -> None:
    """Worker 0 holds batch 0 until batch 1 has started, so batch 1 can only have been claimed by
    worker 1: both generate, the trainer still trains batch b at step b, each sample keeps the
    weight version its worker generated it with, and every kept id is trained exactly once."""
    started: list[tuple[int, int, int]] = []  # (step, worker, weight version)
    changed = threading.Condition()
    original_chunk = async_source._chunk_sampler

    def chunk_sampler(tasks: Any, step: int, publication: Any, positions: list[int]) -> Any:
        run = original_chunk(tasks, step, publication, positions)

        def hooked(worker: Any, cancel: Any) -> Any:
            with changed:
                started.append((step, worker.index, publication.version))
                changed.notify_all()
                if step == 0:
                    assert changed.wait_for(lambda: any(s == 1 for s, _, _ in started), timeout=120)
            return run(worker, cancel)

        return hooked

    monkeypatch.setattr(async_source, "_chunk_sampler", chunk_sampler)
    run = _run(tmp_path, "workers", "pipeline.mode=async", "algorithm.max_staleness=1", "pipeline.rollout_workers=2",
               *backend)

    assert sorted(s for s, _, _ in started) == list(range(STEPS))  # each batch generated once
    by_step = {step: (worker, version) for step, worker, version in started}
    assert by_step[0][0] != by_step[1][0] and {w for w, _ in by_step.values()} == {0, 1}
    store = _store(run)
    _assert_exactly_once(store, bound=1)
    for row in _latest(store).values():
        assert row["weight_version"] == by_step[row["step"]][1], row["id"]
    rows = [m for m in run.read_metrics() if m.get("phase") == "rl"]
    assert [m["step"] for m in rows] == list(range(1, STEPS + 1))
    assert [m["rollout_worker"] for m in rows] == [by_step[b][0] for b in range(STEPS)]


def test_ratio_control_reports_its_window_within_bounds_and_narrows_it_for_a_slow_trainer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A trainer much slower than the rollout side never waits for a batch while the queue is
    full, so ratio control lowers the in-flight window (from the bound's 3) and says so."""
    original = Trainer.rl_step

    def slow(self: Trainer, batch: Any, replay: Any = None) -> dict[str, float]:
        time.sleep(4.0)  # the smoke run scores a batch in about 2 s
        return original(self, batch, replay)

    monkeypatch.setattr(Trainer, "rl_step", slow)
    caplog.set_level("INFO", logger="tidal.pipeline.async_source")
    run = _run(tmp_path, "ratio", "pipeline.mode=async", "algorithm.max_staleness=2", "pipeline.queue_size=1",
               "pipeline.ratio_control=true")
    rows = [m for m in run.read_metrics() if m.get("phase") == "rl"]
    windows = [m["ratio/in_flight"] for m in rows]
    assert len(windows) == STEPS and all(1 <= w <= 3 for w in windows), windows
    assert windows[0] == 3 and min(windows) < 3, windows
    changes = [r.getMessage() for r in caplog.records if "batches in flight ahead of the trainer:" in r.getMessage()]
    assert len(changes) == sum(a != b for a, b in itertools.pairwise(windows)) + (windows[0] != 3)
    _assert_exactly_once(_store(run), bound=2)


# Kill -9 of each part of a run. The Ray actors are killed by their process ids (`ray.kill` would
# be a polite stop, not a crash); the trainer is the driver process itself.


def _ray_actor(run_name: str, role: str) -> Any:
    """The live Ray actor of run `run_name` in `role` (rollout, scorer-0, ...)."""
    import ray

    from tidal.pipeline.backends.ray import NAMESPACE

    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
             if a["name"].startswith(f"{run_name}/") and a["name"].endswith(f"/{role}")]
    assert len(names) == 1, names
    return ray.get_actor(names[0], namespace=NAMESPACE)


@pytest.mark.parametrize("role", ["rollout-0", "scorer-0"])
def test_a_ray_worker_killed_mid_run_is_restarted_and_every_id_trains_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ray_cluster: str, role: str
) -> None:
    """The trainer, before its second update, kills the actor with SIGKILL; Ray restarts it, the
    call in flight is retried, the rollout actor reloads and re-verifies the weights, and the run
    finishes with every kept id trained exactly once."""
    import ray

    original = Trainer.rl_step
    killed: list[int] = []

    def kill_before_second_update(self: Trainer, batch: Any, replay: Any = None) -> dict[str, float]:
        if self.updates == 1:
            pid = ray.get(_ray_actor("kill", role).pid.remote(), timeout=60)
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        return original(self, batch, replay)

    monkeypatch.setattr(Trainer, "rl_step", kill_before_second_update)
    run = _run(tmp_path, "kill", "pipeline.mode=async", "algorithm.max_staleness=1", "pipeline.backend=ray",
               f"pipeline.ray_address={ray_cluster}", "pipeline.worker_restarts=1")
    assert len(killed) == 1
    rows = [m for m in run.read_metrics() if m.get("phase") == "rl"]
    assert [m["step"] for m in rows] == list(range(1, STEPS + 1))
    kind = role.split("-")[0]
    assert rows[-1][f"restarts/{kind}"] == 1  # a new process answered after the kill
    _assert_exactly_once(_store(run), bound=1)


def test_a_trainer_killed_mid_run_resumes_from_its_folder(tmp_path: Path, backend: list[str]) -> None:
    """SIGKILL the driver (trainer) process after its second update; `tidal train RUN` resumes it
    from the run folder and every kept id is trained exactly once."""
    overrides = [f"trainer.steps={STEPS}", *KEEP_ALL, "pipeline.mode=async", "algorithm.max_staleness=1", *backend]
    script = (
        "import sys; from pathlib import Path; from tidal.pipeline import quickstart as qs; "
        "qs.run_quickstart(qs.find_config('smoke'), sys.argv[2:], Path(sys.argv[1]), 'killed')"
    )
    log = (tmp_path / "driver.log").open("w")
    driver = subprocess.Popen([sys.executable, "-c", script, str(tmp_path), *overrides], stdout=log, stderr=log)
    metrics, deadline = tmp_path / "killed" / "metrics.jsonl", time.monotonic() + 600
    while driver.poll() is None and time.monotonic() < deadline:
        if metrics.exists() and any(json.loads(line).get("phase") == "rl" and json.loads(line)["step"] >= 2
                                    for line in metrics.read_text().splitlines() if line.strip()):
            break
        time.sleep(0.2)
    assert driver.poll() is None, f"the run ended before it could be killed:\n{(tmp_path / 'driver.log').read_text()[-3000:]}"
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait(timeout=60)
    run = RunFolder.open(tmp_path / "killed")
    assert max(m["step"] for m in run.read_metrics() if m.get("phase") == "rl") < STEPS

    pipeline_run.run_training(run.path, [])
    steps = [m["step"] for m in run.read_metrics() if m.get("phase") == "rl"]
    assert set(steps) == set(range(1, STEPS + 1)) and steps[-1] == STEPS
    _assert_exactly_once(_store(run), bound=1)
