"""The rollout scheduler on plain-Python workers: priorities, preemption at chunk boundaries,
holds, splitting a job across workers, retries with backoff, health checks and replacements,
and the retrying scorer."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from tidal.errors import WorkerLostError
from tidal.pipeline.scheduler import (
    EVAL_PRIORITY,
    TRAIN_PRIORITY,
    Chunk,
    RetryingScorer,
    RetryPolicy,
    Scheduler,
)
from tidal.types import Outcome, Score

WAIT = 30.0  # generous bound for an event that should come at once


class Worker:
    """Records what it ran (worker name, label) in a shared log."""

    def __init__(self, name: str, log: list[tuple[str, str]]) -> None:
        self.name, self.log = name, log
        self.checks = 0

    def check(self) -> None:
        self.checks += 1


def record(label: str, gate: threading.Event | None = None, started: threading.Event | None = None) -> Chunk:
    def run(worker: Worker) -> str:
        if started is not None:
            started.set()
        if gate is not None:
            assert gate.wait(WAIT)
        worker.log.append((worker.name, label))
        return f"{label}@{worker.name}"

    return Chunk(run, label=label)


@pytest.fixture
def log() -> list[tuple[str, str]]:
    return []


def test_eval_jobs_go_first_then_older_batches_then_higher_priority_chunks(log: list[tuple[str, str]]) -> None:
    """One busy worker; queued behind it: batch 1, batch 0 (with a high-priority chunk last) and
    an evaluation. Once free, it runs the evaluation, then batch 0 (priority chunk first), then 1."""
    scheduler = Scheduler([Worker("w0", log)])
    gate, started = threading.Event(), threading.Event()
    blocker = scheduler.submit("blocker", TRAIN_PRIORITY, [record("blocker", gate, started)], order=-1)
    assert started.wait(WAIT)
    late = scheduler.submit("batch 1", TRAIN_PRIORITY, [record("b1c0"), record("b1c1")], order=1)
    early = scheduler.submit("batch 0", TRAIN_PRIORITY,
                             [record("b0c0"), Chunk(record("b0c1").run, priority=5, label="b0c1")], order=0)
    evaluation = scheduler.submit("eval", EVAL_PRIORITY, [record("e0"), record("e1")])
    gate.set()
    assert late.wait() == ["b1c0@w0", "b1c1@w0"]
    assert early.wait() == ["b0c0@w0", "b0c1@w0"]  # results keep chunk order whatever ran first
    assert evaluation.wait() == ["e0@w0", "e1@w0"] and blocker.wait() == ["blocker@w0"]
    assert [label for _, label in log] == ["blocker", "e0", "e1", "b0c1", "b0c0", "b1c0", "b1c1"]
    scheduler.close()


def test_a_started_low_priority_job_is_preempted_at_its_next_chunk_boundary(log: list[tuple[str, str]]) -> None:
    scheduler = Scheduler([Worker("w0", log)])
    gate, started = threading.Event(), threading.Event()
    train = scheduler.submit("batch 0", TRAIN_PRIORITY,
                             [record("t0", gate, started), record("t1"), record("t2")])
    assert started.wait(WAIT)
    evaluation = scheduler.submit("eval", EVAL_PRIORITY, [record("e0")])
    gate.set()
    assert train.wait() == ["t0@w0", "t1@w0", "t2@w0"] and evaluation.wait() == ["e0@w0"]
    assert [label for _, label in log] == ["t0", "e0", "t1", "t2"]  # t0 ran to its end; t1 waited
    assert scheduler.metrics()["scheduler/preempted"] == 1
    scheduler.close()


def test_a_hold_keeps_lower_priority_chunks_from_starting_until_it_ends(log: list[tuple[str, str]]) -> None:
    scheduler = Scheduler([Worker("w0", log)])
    gate, started = threading.Event(), threading.Event()
    train = scheduler.submit("batch 0", TRAIN_PRIORITY, [record("t0", gate, started), record("t1")])
    assert started.wait(WAIT)
    with scheduler.hold(EVAL_PRIORITY, "eval on the trainer"):
        gate.set()  # the running chunk finishes...
        deadline = time.monotonic() + WAIT
        while [label for _, label in log] != ["t0"] and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.3)  # ...and the next one does not start while held
        assert [label for _, label in log] == ["t0"]
        assert not train.done.is_set()
    assert train.wait() == ["t0@w0", "t1@w0"]
    metrics = scheduler.metrics()
    assert metrics["scheduler/holds"] == 1 and metrics["scheduler/preempted"] == 1
    scheduler.close()


def test_one_job_is_split_across_free_workers(log: list[tuple[str, str]]) -> None:
    """Each chunk waits until two chunks are running at once: only two workers sharing the job
    get past it."""
    scheduler = Scheduler([Worker("w0", log), Worker("w1", log)])
    running = threading.Barrier(2, timeout=WAIT)

    def chunk(label: str) -> Chunk:
        def run(worker: Worker) -> str:
            running.wait()
            worker.log.append((worker.name, label))
            return worker.name
        return Chunk(run, label=label)

    job = scheduler.submit("batch 0", TRAIN_PRIORITY, [chunk(f"c{i}") for i in range(4)])
    results = job.wait()
    assert results is not None and set(results) == {"w0", "w1"}
    assert sorted(job.workers) == [0, 0, 1, 1]  # type: ignore[type-var]
    scheduler.close()


def test_a_lost_worker_chunk_is_retried_with_doubling_backoff_after_a_health_check(log: list[tuple[str, str]]) -> None:
    worker = Worker("w0", log)
    attempts: list[float] = []

    def flaky(w: Worker) -> str:
        attempts.append(time.monotonic())
        if len(attempts) < 3:
            raise WorkerLostError("the actor died")
        return "done"

    policy = RetryPolicy(retries=3, backoff_s=0.1, max_backoff_s=10)
    scheduler = Scheduler([worker], policy, check=lambda i: scheduler.workers[i].check())
    assert scheduler.run("batch 0", TRAIN_PRIORITY, [Chunk(flaky)]) == ["done"]
    assert len(attempts) == 3
    assert attempts[1] - attempts[0] >= 0.1 and attempts[2] - attempts[1] >= 0.2  # delay(1), delay(2)
    assert worker.checks == 2  # checked after each failure, before it took the chunk again
    metrics = scheduler.metrics()
    assert metrics["scheduler/retries"] == 2 and metrics["scheduler/health_checks"] == 2
    assert metrics["scheduler/health_failures"] == 0
    scheduler.close()


def test_retries_run_out_and_other_errors_are_not_retried(log: list[tuple[str, str]]) -> None:
    calls = {"lost": 0, "bug": 0}

    def lost(w: Worker) -> None:
        calls["lost"] += 1
        raise WorkerLostError("gone again")

    def bug(w: Worker) -> None:
        calls["bug"] += 1
        raise ValueError("a bug in the chunk")

    scheduler = Scheduler([Worker("w0", log)], RetryPolicy(retries=2, backoff_s=0.01))
    with pytest.raises(WorkerLostError, match=r"chunk 0 failed 3 time\(s\).*gone again.*pipeline.retries=2"):
        scheduler.run("batch 0", TRAIN_PRIORITY, [Chunk(lost)])
    with pytest.raises(ValueError, match="a bug in the chunk"):
        scheduler.run("batch 1", TRAIN_PRIORITY, [Chunk(bug), record("after the bug")])
    assert calls == {"lost": 3, "bug": 1}
    assert scheduler.run("batch 2", TRAIN_PRIORITY, [record("still works")]) == ["still works@w0"]
    scheduler.close()


def test_periodic_health_checks_replace_a_failing_worker(log: list[tuple[str, str]]) -> None:
    class Sick(Worker):
        def check(self) -> None:
            raise RuntimeError("canary logprobs differ")

    replaced: list[int] = []

    def replace(index: int) -> Worker:
        replaced.append(index)
        return Worker(f"w{index}-new", log)

    scheduler = Scheduler([Sick("w0", log)], check=lambda i: scheduler.workers[i].check(), replace=replace,
                          health_every_s=0.05)
    deadline = time.monotonic() + WAIT
    while not replaced and time.monotonic() < deadline:
        time.sleep(0.02)
    assert replaced == [0]
    assert scheduler.run("batch 0", TRAIN_PRIORITY, [record("c0")]) == ["c0@w0-new"]
    metrics = scheduler.metrics()
    assert metrics["scheduler/replaced"] == 1 and metrics["scheduler/health_failures"] >= 1
    scheduler.close()


def test_without_a_replacement_a_failed_worker_takes_no_work_and_the_last_one_fails_the_jobs(
    log: list[tuple[str, str]],
) -> None:
    class Dead(Worker):
        def check(self) -> None:
            raise WorkerLostError("no answer within 1 s")

    def lost(w: Worker) -> None:
        raise WorkerLostError("the actor died")

    scheduler = Scheduler([Dead("w0", log)], RetryPolicy(retries=3, backoff_s=0.01),
                          check=lambda i: scheduler.workers[i].check())
    with pytest.raises(WorkerLostError, match="every worker failed its health check.*no answer within 1 s"):
        scheduler.run("batch 0", TRAIN_PRIORITY, [Chunk(lost)])
    with pytest.raises(WorkerLostError, match="no worker left"):
        scheduler.submit("batch 1", TRAIN_PRIORITY, [record("never")])
    assert scheduler.metrics()["scheduler/lost"] == 1
    scheduler.close()


def test_waiting_returns_none_when_the_run_stops_and_close_fails_what_is_pending(log: list[tuple[str, str]]) -> None:
    scheduler = Scheduler([Worker("w0", log)])
    gate, started = threading.Event(), threading.Event()
    scheduler.submit("blocker", TRAIN_PRIORITY, [record("blocker", gate, started)])
    assert started.wait(WAIT)
    pending = scheduler.submit("batch 1", TRAIN_PRIORITY, [record("never")], order=1)
    stop = threading.Event()
    stop.set()
    assert pending.wait(stop) is None
    gate.set()
    scheduler.close()
    with pytest.raises(RuntimeError, match="closed"):
        scheduler.submit("batch 2", TRAIN_PRIORITY, [record("too late")])


def test_retry_delays_double_up_to_the_cap() -> None:
    policy = RetryPolicy(retries=6, backoff_s=0.5, max_backoff_s=3.0)
    assert [policy.delay(n) for n in range(1, 7)] == [0.5, 1.0, 2.0, 3.0, 3.0, 3.0]


class FlakyScorer:
    """Scores 'ok' answers 1.0; an answer named in `infra` is an infra error for its first
    `infra[answer]` scorings; `lost` calls fail with WorkerLostError first."""

    def __init__(self, infra: dict[str, int], lost: int = 0) -> None:
        self.infra, self.lost, self.calls = dict(infra), lost, []  # type: ignore[var-annotated]

    def score_many(self, items: list[tuple[Any, str]]) -> list[Score]:
        self.calls.append([answer for _, answer in items])
        if self.lost:
            self.lost -= 1
            raise WorkerLostError("scorer actor died")
        scores = []
        for _, answer in items:
            if self.infra.get(answer, 0) > 0:
                self.infra[answer] -= 1
                scores.append(Score(0.0, Outcome.INFRA_ERROR, detail="sandbox did not start"))
            else:
                scores.append(Score(1.0, Outcome.PASSED))
        return scores


def test_the_retrying_scorer_rescores_infra_errors_and_keeps_the_ones_that_stay() -> None:
    flaky = FlakyScorer({"b": 1, "c": 5}, lost=1)
    scorer = RetryingScorer(flaky, RetryPolicy(retries=2, backoff_s=0.01))
    scores = scorer.score_many([(None, "a"), (None, "b"), (None, "c")])
    assert [s.outcome for s in scores] == [Outcome.PASSED, Outcome.PASSED, Outcome.INFRA_ERROR]
    assert flaky.calls == [["a", "b", "c"], ["a", "b", "c"], ["b", "c"], ["c"]]  # lost call, then 2 re-scores
    assert scorer.metrics() == {"retries/infra_scores": 3.0, "retries/scoring_calls": 1.0}
