"""Preemption of running chunks: a preemptible chunk of lower priority is stopped partway when
higher-priority work needs its worker (a submitted job, a hold, closing), queued again at its old
place with no retry counted, and run again from its start."""

from __future__ import annotations

import threading
import time

import pytest

from tidal.errors import PreemptedError
from tidal.pipeline.scheduler import EVAL_PRIORITY, TRAIN_PRIORITY, Chunk, Scheduler

WAIT = 30.0  # generous bound for an event that should come at once


class Worker:
    def __init__(self, name: str) -> None:
        self.name = name


class Log:
    """What ran, as (event, label) pairs: `start`, `preempted`, `done`."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def add(self, event: str, label: str) -> None:
        with self.lock:
            self.events.append((event, label))

    def done(self) -> list[str]:
        return [label for event, label in self.events if event == "done"]


def spin(log: Log, label: str, finish: threading.Event, started: threading.Event | None = None) -> Chunk:
    """A preemptible chunk that works until `finish` is set, looking at `cancel` as it goes."""

    def run(worker: Worker, cancel: threading.Event) -> str:
        log.add("start", label)
        if started is not None:
            started.set()
        deadline = time.monotonic() + WAIT
        while not finish.is_set():
            if cancel.is_set():
                log.add("preempted", label)
                raise PreemptedError(f"{label} stopped")
            assert time.monotonic() < deadline, f"{label} was never finished nor preempted"
            time.sleep(0.005)
        log.add("done", label)
        return f"{label}@{worker.name}"

    return Chunk(run, label=label, preemptible=True)


def quick(log: Log, label: str) -> Chunk:
    def run(worker: Worker) -> str:
        log.add("done", label)
        return f"{label}@{worker.name}"

    return Chunk(run, label=label)


def wait_until(condition: object, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


@pytest.fixture
def log() -> Log:
    return Log()


def test_an_evaluation_preempts_a_running_training_chunk_which_runs_again_after_it(log: Log) -> None:
    checks: list[int] = []
    scheduler = Scheduler([Worker("w0")], check=checks.append)
    finish, started = threading.Event(), threading.Event()
    train = scheduler.submit("batch 0", TRAIN_PRIORITY, [spin(log, "t0", finish, started), quick(log, "t1")])
    assert started.wait(WAIT)
    evaluation = scheduler.submit("eval", EVAL_PRIORITY, [quick(log, "e0")])
    assert evaluation.wait() == ["e0@w0"]  # it did not wait for t0 to finish
    wait_until(lambda: log.events.count(("start", "t0")) == 2, "t0 to start again")
    finish.set()
    assert train.wait() == ["t0@w0", "t1@w0"]
    assert log.events == [("start", "t0"), ("preempted", "t0"), ("done", "e0"), ("start", "t0"), ("done", "t0"),
                          ("done", "t1")]  # t0 went back to its place: before t1
    metrics = scheduler.metrics()
    assert metrics["scheduler/preempted_chunks"] == 1 and metrics["scheduler/preempted"] == 1
    assert metrics["scheduler/retries"] == 0 and metrics["scheduler/preempted_work_s"] > 0
    assert checks == []  # a preempted worker is not suspect: no health check
    scheduler.close()


def test_only_as_many_chunks_as_the_new_job_needs_are_preempted_the_newest_batch_first(log: Log) -> None:
    scheduler = Scheduler([Worker("w0"), Worker("w1")])
    finish = threading.Event()
    started = [threading.Event(), threading.Event()]
    older = scheduler.submit("batch 0", TRAIN_PRIORITY, [spin(log, "b0", finish, started[0])], order=0)
    assert started[0].wait(WAIT)
    newer = scheduler.submit("batch 1", TRAIN_PRIORITY, [spin(log, "b1", finish, started[1])], order=1)
    assert started[1].wait(WAIT)
    evaluation = scheduler.submit("eval", EVAL_PRIORITY, [quick(log, "e0")])
    assert evaluation.wait() is not None
    assert ("preempted", "b1") in log.events and ("preempted", "b0") not in log.events
    finish.set()
    assert older.wait() is not None and newer.wait() is not None
    assert scheduler.metrics()["scheduler/preempted_chunks"] == 1
    scheduler.close()


def test_equal_priority_work_and_free_workers_preempt_nothing(log: Log) -> None:
    scheduler = Scheduler([Worker("w0"), Worker("w1")])
    finish, started = threading.Event(), threading.Event()
    first = scheduler.submit("batch 0", TRAIN_PRIORITY, [spin(log, "b0", finish, started)], order=0)
    assert started.wait(WAIT)
    (second,) = scheduler.submit("batch 1", TRAIN_PRIORITY, [quick(log, "b1")], order=1).wait()
    free = second.split("@")[1]  # whichever worker b0 did not take
    assert scheduler.submit("eval", EVAL_PRIORITY, [quick(log, "e0")]).wait() == [f"e0@{free}"]  # it was free
    finish.set()
    assert first.wait() == [f"b0@{({'w0', 'w1'} - {free}).pop()}"]  # b0 ran to its end where it started
    assert ("preempted", "b0") not in log.events and scheduler.metrics()["scheduler/preempted_chunks"] == 0
    scheduler.close()


def test_a_hold_preempts_running_chunks_below_it_and_they_restart_when_it_ends(log: Log) -> None:
    scheduler = Scheduler([Worker("w0"), Worker("w1")])
    finish = threading.Event()
    started = [threading.Event(), threading.Event()]
    train = scheduler.submit("batch 0", TRAIN_PRIORITY,
                             [spin(log, "t0", finish, started[0]), spin(log, "t1", finish, started[1])])
    assert started[0].wait(WAIT) and started[1].wait(WAIT)
    with scheduler.hold(EVAL_PRIORITY, "eval on the trainer"):
        wait_until(lambda: {("preempted", "t0"), ("preempted", "t1")} <= set(log.events), "both to stop")
        time.sleep(0.2)
        assert log.events.count(("start", "t0")) == 1  # not started again while held
    finish.set()
    results = train.wait()
    assert results is not None and [r.split("@")[0] for r in results] == ["t0", "t1"]  # either may rerun on either
    assert sorted(log.done()) == ["t0", "t1"]
    assert scheduler.metrics()["scheduler/preempted_chunks"] == 2
    scheduler.close()


def test_a_chunk_that_is_not_preemptible_runs_to_its_end(log: Log) -> None:
    scheduler = Scheduler([Worker("w0")])
    gate, started = threading.Event(), threading.Event()

    def run(worker: Worker) -> str:
        started.set()
        assert gate.wait(WAIT)
        log.add("done", "t0")
        return "t0"

    train = scheduler.submit("batch 0", TRAIN_PRIORITY, [Chunk(run, label="t0")])
    assert started.wait(WAIT)
    evaluation = scheduler.submit("eval", EVAL_PRIORITY, [quick(log, "e0")])
    time.sleep(0.2)
    assert log.done() == []  # the evaluation waits for the running chunk
    gate.set()
    assert train.wait() == ["t0"] and evaluation.wait() == ["e0@w0"]
    assert log.done() == ["t0", "e0"] and scheduler.metrics()["scheduler/preempted_chunks"] == 0
    scheduler.close()


def test_a_preempted_error_nobody_asked_for_fails_the_job(log: Log) -> None:
    scheduler = Scheduler([Worker("w0")])

    def run(worker: Worker, cancel: threading.Event) -> str:
        raise PreemptedError("raised on its own")

    job = scheduler.submit("batch 0", TRAIN_PRIORITY, [Chunk(run, preemptible=True)])
    with pytest.raises(PreemptedError, match="on its own"):
        job.wait()
    assert scheduler.metrics()["scheduler/preempted_chunks"] == 0
    scheduler.close()


def test_close_preempts_the_running_chunk_and_fails_its_job(log: Log) -> None:
    scheduler = Scheduler([Worker("w0")])
    finish, started = threading.Event(), threading.Event()
    job = scheduler.submit("batch 0", TRAIN_PRIORITY, [spin(log, "t0", finish, started)])
    assert started.wait(WAIT)
    began = time.monotonic()
    scheduler.close()  # does not wait for `finish`, which nobody sets
    assert time.monotonic() - began < WAIT
    with pytest.raises(RuntimeError, match="closed while batch 0 ran"):
        job.wait()
    assert ("preempted", "t0") in log.events
