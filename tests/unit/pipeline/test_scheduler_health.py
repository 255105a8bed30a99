"""The scheduler's periodic health checks on plain-Python workers: every worker that ran a chunk
is checked even in a run far shorter than the interval, a worker that never idles is checked
between its chunks, and a check never overlaps a chunk on the same worker."""

from __future__ import annotations

import threading
import time

from tidal.pipeline.scheduler import TRAIN_PRIORITY, Chunk, Scheduler

WAIT = 30.0  # generous bound for an event that should come at once


class Worker:
    """A rollout worker (`check()` is its part of the protocol) that records what it did, and
    whether a check ever came while it ran a chunk."""

    def __init__(self, name: str, events: list[tuple[str, str]], healthy: bool = True) -> None:
        self.name, self.events, self.healthy = name, events, healthy
        self.running = False
        self.overlaps = 0

    def check(self) -> None:
        if self.running:
            self.overlaps += 1
        self.events.append((self.name, "check"))
        if not self.healthy:
            raise RuntimeError("canary logprobs differ")


def work(label: str, seconds: float = 0.0, both_started: threading.Barrier | None = None) -> Chunk:
    def run(worker: Worker) -> str:
        worker.running = True
        try:
            if both_started is not None:
                both_started.wait(WAIT)  # one chunk on each worker
            time.sleep(seconds)
            worker.events.append((worker.name, label))
        finally:
            worker.running = False
        return label

    return Chunk(run, label=label)


def wait_for(condition, timeout: float = WAIT) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_a_run_shorter_than_the_interval_checks_each_worker_after_its_first_chunk() -> None:
    """The async loop's default interval is 30 s; a quickstart-sized run can be over before."""
    events: list[tuple[str, str]] = []
    workers = [Worker("w0", events), Worker("w1", events)]
    scheduler = Scheduler(workers, check=lambda i: scheduler.workers[i].check(), health_every_s=3600.0)
    both = threading.Barrier(2)
    assert scheduler.run("batch 0", TRAIN_PRIORITY, [work("c0", both_started=both), work("c1", both_started=both)])
    assert wait_for(lambda: scheduler.metrics()["scheduler/health_checks"] == 2)
    for name in ("w0", "w1"):
        mine = [what for who, what in events if who == name]
        assert mine[0].startswith("c") and mine[1] == "check"  # after its first chunk, not before

    assert scheduler.run("batch 1", TRAIN_PRIORITY, [work("c2"), work("c3")])
    time.sleep(0.2)
    assert scheduler.metrics()["scheduler/health_checks"] == 2  # then not again before the interval
    assert sum(w.overlaps for w in workers) == 0
    scheduler.close()


def test_a_worker_that_never_idles_is_checked_between_its_chunks() -> None:
    """One worker with a queue of chunks: it is never idle when the monitor looks, so it is
    checked by its own thread, between two chunks, each time the interval has passed."""
    events: list[tuple[str, str]] = []
    worker = Worker("w0", events)
    scheduler = Scheduler([worker], check=lambda i: scheduler.workers[i].check(), health_every_s=0.1)
    began = time.monotonic()
    assert scheduler.run("batch 0", TRAIN_PRIORITY, [work(f"c{i}", 0.05) for i in range(20)])
    elapsed = time.monotonic() - began
    checks = scheduler.metrics()["scheduler/health_checks"]
    assert checks >= 3, (checks, elapsed)  # about one per 0.1 s of a run of 1 s or more
    assert checks <= elapsed / 0.1 + 2  # and not after every chunk
    assert worker.overlaps == 0
    scheduler.close()


def test_a_replaced_worker_is_checked_after_its_first_chunk() -> None:
    events: list[tuple[str, str]] = []
    replaced: list[int] = []

    def replace(index: int) -> Worker:
        replaced.append(index)
        return Worker(f"w{index}-new", events)

    scheduler = Scheduler([Worker("w0", events, healthy=False)], check=lambda i: scheduler.workers[i].check(),
                          replace=replace, health_every_s=3600.0)
    assert scheduler.run("batch 0", TRAIN_PRIORITY, [work("c0")]) == ["c0"]
    assert wait_for(lambda: replaced == [0])
    assert scheduler.run("batch 1", TRAIN_PRIORITY, [work("c1")]) == ["c1"]
    assert wait_for(lambda: ("w0-new", "check") in events)
    assert events == [("w0", "c0"), ("w0", "check"), ("w0-new", "c1"), ("w0-new", "check")]
    metrics = scheduler.metrics()
    assert metrics["scheduler/health_failures"] == 1 and metrics["scheduler/replaced"] == 1
    scheduler.close()
