"""The rollout scheduler: prioritised, preemptible work on a set of workers, with retries and
health checks (docs/design/loop.md, "The scheduler").

Work comes as jobs (a training batch, an evaluation) made of chunks that one worker runs by
itself (`stages.plan_chunks`). Each worker's thread takes the best runnable chunk: highest job
priority (`EVAL_PRIORITY` above `TRAIN_PRIORITY`), then the lowest job `order` (batch `b` before
`b + 1`), then the highest chunk priority, then the oldest; one job's chunks spread over the free
workers. Higher-priority work preempts running preemptible chunks (their `cancel` is set; they
go back to their place and rerun from the start, generation being idempotent); `hold(priority)`
does the same for work outside the workers (the held-out evaluation). A chunk failing with a
retryable error runs again after an exponential backoff, up to `retries` times. Each worker is
health-checked after its first chunk, then every `health_every_s`, never during a chunk; one
that fails is replaced. The scheduler only orders and dispatches: what a chunk does, and what a
worker is, it does not know. `metrics()` gives its counters (`scheduler/...`).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from tidal.errors import PreemptedError, WorkerLostError

logger = logging.getLogger(__name__)

TRAIN_PRIORITY = 0
EVAL_PRIORITY = 1_000  # evaluation rollouts go before training rollouts
POLL_S = 0.2  # how often a waiting thread looks at the stop flag


@dataclass(frozen=True)
class RetryPolicy:
    """Which chunk failures are retried, how often, and after how long."""

    retries: int = 3
    backoff_s: float = 0.5
    max_backoff_s: float = 30.0
    retry_on: tuple[type[BaseException], ...] = (WorkerLostError,)

    def delay(self, attempt: int) -> float:
        """Seconds before retry number `attempt` (1, 2, ...): doubling from `backoff_s`, capped."""
        return min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1))


def retry_policy(pipeline: Any) -> RetryPolicy:
    """The run's policy from `pipeline.retries`, `retry_backoff_s` and `retry_max_backoff_s`:
    lost workers and timed-out weight fetches are retried."""
    from tidal.errors import WeightTimeoutError

    return RetryPolicy(pipeline.retries, pipeline.retry_backoff_s, pipeline.retry_max_backoff_s,
                       (WorkerLostError, WeightTimeoutError))


@dataclass
class Chunk:
    """One worker's share of a job: `run(worker)` returns its result; for a `preemptible` chunk,
    `run(worker, cancel)`, which raises `PreemptedError` soon after `cancel` (a `threading.Event`)
    is set."""

    run: Callable[..., Any]
    priority: int = 0  # within the job (e.g. its domain's priority): higher first
    label: str = ""
    preemptible: bool = False


class Job:
    """A submitted request: its chunks' results in chunk order once all are done, or its error."""

    def __init__(self, name: str, priority: int, order: int, chunks: list[Chunk]) -> None:
        self.name, self.priority, self.order, self.chunks = name, priority, order, chunks
        self.results: list[Any] = [None] * len(chunks)
        self.workers: list[int | None] = [None] * len(chunks)  # which worker ran each chunk
        self.remaining = len(chunks)
        self.started = False  # a chunk of it has been taken by a worker
        self.error: BaseException | None = None
        self.done = threading.Event()
        if not chunks:
            self.done.set()

    def wait(self, stop: threading.Event | None = None) -> list[Any] | None:
        """The results once every chunk is done; None if `stop` is set first. Raises the job's error."""
        while not self.done.wait(POLL_S):
            if stop is not None and stop.is_set():
                return None
        if self.error is not None:
            raise self.error
        return self.results


@dataclass(order=True)
class _Entry:
    key: tuple[int, int, int, int]  # (-job priority, job order, -chunk priority, submission sequence)
    job: Job = field(compare=False)
    index: int = field(compare=False)
    attempt: int = field(compare=False, default=0)
    not_before: float = field(compare=False, default=0.0)  # monotonic time before which it may not run


class Scheduler:
    """Runs jobs' chunks on `workers`, one thread per worker (see the module docstring)."""

    def __init__(
        self,
        workers: list[Any],
        retry: RetryPolicy | None = None,
        check: Callable[[int], None] | None = None,
        replace: Callable[[int], Any] | None = None,
        health_every_s: float = 0.0,
        name: str = "rollout",
    ) -> None:
        if not workers:
            raise ValueError("a scheduler needs at least one worker")
        self.workers, self.retry, self.check, self.replace = list(workers), retry or RetryPolicy(), check, replace
        self.name = name
        self._cond = threading.Condition()
        self._pending: list[_Entry] = []  # a heap
        self._seq = itertools.count()
        self._holds: Counter[int] = Counter()  # priority -> holders
        self._busy: list[Job | None] = [None] * len(workers)  # what each worker is running
        self._running: list[_Entry | None] = [None] * len(workers)  # and which of its chunks
        self._cancel = [threading.Event() for _ in workers]  # set to preempt a worker's running chunk
        self._checking: set[int] = set()  # workers being health-checked (they take no work meanwhile)
        self._suspect: set[int] = set()  # workers to check before they take more work
        self._lost: set[int] = set()  # workers that failed a check and could not be replaced
        self.health_every_s = health_every_s if check is not None else 0.0  # 0: only after a failed chunk
        began = time.monotonic()
        self._next_check = [began + self.health_every_s] * len(workers)  # when each is due again
        self._checked = [False] * len(workers)  # whether each slot's worker has been checked yet
        self._preempted: set[int] = set()  # ids of jobs preempted at least once (counted once per episode)
        self._closed = False
        self.counts: Counter[str] = Counter()
        self.busy_s = [0.0] * len(workers)
        self.preempted_work_s = 0.0  # seconds of preempted chunks' work, thrown away
        self._threads = [
            threading.Thread(target=self._work, args=(i,), name=f"tidal-{name}-{i}", daemon=True)
            for i in range(len(workers))
        ]
        if self.health_every_s > 0:
            self._threads.append(threading.Thread(target=self._monitor, name=f"tidal-{name}-health", daemon=True))
        for thread in self._threads:
            thread.start()

    # -- submitting ------------------------------------------------------------------------------

    def submit(self, name: str, priority: int, chunks: list[Chunk], order: int = 0) -> Job:
        """Queue a job of `chunks` at `priority` (higher first); among equal priorities, lower
        `order` first. Returns at once; `job.wait()` gives the results."""
        job = Job(name, priority, order, chunks)
        with self._cond:
            if self._closed:
                raise RuntimeError(f"{self.name} scheduler: closed; cannot run {name}")
            if not self._alive():
                raise WorkerLostError(f"{self.name} scheduler: no worker left to run {name}")
            for index, chunk in enumerate(chunks):
                heapq.heappush(self._pending, _Entry((-priority, order, -chunk.priority, next(self._seq)), job, index))
            self._preempt_running(priority, len(chunks) - self._free())
            self._note_preemption(priority)
            self._cond.notify_all()
        return job

    def run(self, name: str, priority: int, chunks: list[Chunk], order: int = 0,
            stop: threading.Event | None = None) -> list[Any] | None:
        """`submit` and wait: the results in chunk order, None if `stop` is set first."""
        return self.submit(name, priority, chunks, order).wait(stop)

    @contextmanager
    def hold(self, priority: int, name: str = "held work") -> Iterator[None]:
        """While inside, workers start no chunk below `priority`: work running outside the
        workers (an evaluation on the trainer's engine) goes before theirs. Running preemptible
        chunks below `priority` are preempted; the others finish."""
        with self._cond:
            self._holds[priority] += 1
            self._preempt_running(priority, len(self.workers))
            self._note_preemption(priority)
            self.counts["holds"] += 1
        logger.info("%s scheduler: %s holds the workers at priority %d", self.name, name, priority)
        try:
            yield
        finally:
            with self._cond:
                self._holds[priority] -= 1
                if not self._holds[priority]:
                    del self._holds[priority]
                self._cond.notify_all()

    def close(self) -> None:
        """Stop the threads (preempting the chunks they are running, or after the ones that are
        not preemptible); pending jobs fail."""
        with self._cond:
            self._closed = True
            for cancel in self._cancel:
                cancel.set()
            for entry in self._pending:
                self._fail(entry.job, RuntimeError(f"{self.name} scheduler closed before {entry.job.name} ran"))
            self._pending.clear()
            self._cond.notify_all()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join()

    def metrics(self) -> dict[str, float]:
        """Counters so far: chunks run, retries, preempted jobs, chunks stopped by preemption and
        the seconds of work they threw away, holds, health checks, failed checks, replaced workers,
        workers lost; and each worker's busy seconds."""
        with self._cond:
            out = {f"scheduler/{key}": float(self.counts[key]) for key in (
                "chunks", "retries", "preempted", "preempted_chunks", "holds", "health_checks", "health_failures",
                "replaced", "lost")}
            out["scheduler/preempted_work_s"] = round(self.preempted_work_s, 3)
            out.update({f"scheduler/busy_s/{i}": round(s, 3) for i, s in enumerate(self.busy_s)})
        return out

    # -- inside ------------------------------------------------------------------------------------

    def _alive(self) -> bool:
        return len(self._lost) < len(self.workers)

    def _floor(self) -> int | None:
        return max(self._holds) if self._holds else None

    def _free(self) -> int:
        """Workers that would take a chunk now (under the lock)."""
        return sum(1 for i in range(len(self.workers)) if self._busy[i] is None and i not in self._lost
                   and i not in self._checking and i not in self._suspect)

    def _preempt_running(self, priority: int, wanted: int) -> None:
        """Preempt up to `wanted` running preemptible chunks of jobs below `priority`: the lowest
        priority first, then the newest job (under the lock)."""
        if wanted <= 0:
            return
        candidates = []
        for i, entry in enumerate(self._running):
            if (entry is not None and entry.job.priority < priority and entry.job.chunks[entry.index].preemptible
                    and not self._cancel[i].is_set()):
                candidates.append((entry.job.priority, -entry.job.order, i))
        for _, _, i in sorted(candidates)[:wanted]:
            self._cancel[i].set()
            entry = self._running[i]
            assert entry is not None
            logger.info("%s scheduler: preempting %s chunk %d on worker %d for priority %d work",
                        self.name, entry.job.name, entry.index, i, priority)

    def _note_preemption(self, priority: int) -> None:
        """Count the started, unfinished jobs below `priority` that now wait for it (under the lock)."""
        waiting = {id(e.job): e.job for e in self._pending if e.job.started and e.job.priority < priority}
        waiting.update({id(e.job): e.job for i, e in enumerate(self._running)
                        if e is not None and e.job.priority < priority and self._cancel[i].is_set()})
        for key, job in waiting.items():
            if key not in self._preempted and not job.done.is_set():
                self._preempted.add(key)
                self.counts["preempted"] += 1
                logger.info("%s scheduler: %s (priority %d) preempted by priority %d work",
                            self.name, job.name, job.priority, priority)

    def _pick(self, now: float) -> _Entry | None:
        """The best runnable entry, removed from the heap; None if there is none (under the lock)."""
        floor = self._floor()
        deferred: list[_Entry] = []
        chosen = None
        while self._pending:
            entry = heapq.heappop(self._pending)
            if entry.job.done.is_set():  # failed meanwhile: its other chunks are dropped
                continue
            if entry.not_before > now or (floor is not None and entry.job.priority < floor):
                deferred.append(entry)
                continue
            chosen = entry
            break
        for entry in deferred:
            heapq.heappush(self._pending, entry)
        return chosen

    def _next_wake(self, now: float) -> float:
        waits = [e.not_before - now for e in self._pending if e.not_before > now]
        return max(0.01, min([POLL_S, *waits]))

    def _work(self, index: int) -> None:
        while True:
            with self._cond:
                while True:
                    if self._closed:
                        return
                    entry = None
                    if index not in self._lost and index not in self._checking and index not in self._suspect:
                        entry = self._pick(time.monotonic())
                    if entry is not None:
                        break
                    self._cond.wait(self._next_wake(time.monotonic()))
                job = entry.job
                job.started = True
                self._busy[index], self._running[index] = job, entry
                self._preempted.discard(id(job))  # running again: a later preemption counts anew
                worker = self.workers[index]
                cancel = self._cancel[index]
                cancel.clear()
            began = time.perf_counter()
            chunk = job.chunks[entry.index]
            try:
                result = chunk.run(worker, cancel) if chunk.preemptible else chunk.run(worker)
            except PreemptedError as error:
                if cancel.is_set():
                    self._requeue(index, entry, error, time.perf_counter() - began)
                else:  # not asked to stop: an error like any other
                    self._failed(index, entry, error)
            except BaseException as error:  # noqa: BLE001 - retried, or handed to the job's waiter
                self._failed(index, entry, error)
            else:
                with self._cond:
                    job.results[entry.index], job.workers[entry.index] = result, index
                    job.remaining -= 1
                    self.counts["chunks"] += 1
                    if job.remaining == 0 and not job.done.is_set():
                        job.done.set()
            finally:
                with self._cond:
                    self._busy[index], self._running[index] = None, None
                    self.busy_s[index] += time.perf_counter() - began
                    now = time.monotonic()
                    if not self._checked[index]:  # its first check comes after its first chunk
                        self._next_check[index] = min(self._next_check[index], now)
                    if self._due(index, now):  # checked now, before its next chunk
                        self._suspect.add(index)
                    self._cond.notify_all()
            if index in self._suspect:
                self._check_worker(index)

    def _requeue(self, index: int, entry: _Entry, error: PreemptedError, spent_s: float) -> None:
        """A preempted chunk goes back to its old place in the queue (same key: first of its job
        again), with no retry counted; once the scheduler is closed, its job fails instead."""
        with self._cond:
            if self._closed:
                self._fail(entry.job, RuntimeError(f"{self.name} scheduler closed while {entry.job.name} ran"))
                return
            self.counts["preempted_chunks"] += 1
            self.preempted_work_s += spent_s
            heapq.heappush(self._pending, entry)
            logger.info("%s scheduler: %s chunk %d preempted on worker %d after %.2f s (%s); queued again",
                        self.name, entry.job.name, entry.index, index, spent_s, error)

    def _failed(self, index: int, entry: _Entry, error: BaseException) -> None:
        retryable = isinstance(error, self.retry.retry_on)
        with self._cond:
            if retryable and entry.attempt < self.retry.retries and not self._closed:
                entry.attempt += 1
                delay = self.retry.delay(entry.attempt)
                entry.not_before = time.monotonic() + delay
                entry.key = (*entry.key[:3], next(self._seq))
                heapq.heappush(self._pending, entry)
                self.counts["retries"] += 1
                if self.check is not None:
                    self._suspect.add(index)
                logger.warning("%s scheduler: %s chunk %d failed on worker %d (%s); retry %d of %d in %.2f s",
                               self.name, entry.job.name, entry.index, index, error, entry.attempt,
                               self.retry.retries, delay)
                return
            if retryable:
                error = WorkerLostError(
                    f"{entry.job.name}: chunk {entry.index} failed {entry.attempt + 1} time(s), the last on worker "
                    f"{index}: {error} (pipeline.retries={self.retry.retries})"
                )
            self._fail(entry.job, error)

    def _fail(self, job: Job, error: BaseException) -> None:
        if not job.done.is_set():
            job.error = error
            job.done.set()

    def _check_worker(self, index: int) -> None:
        """Health-check worker `index` now (it takes no work meanwhile); replace it if it fails."""
        with self._cond:
            if index in self._checking or index in self._lost:  # the monitor and the worker's thread both may ask
                return
            self._checking.add(index)
            self._suspect.discard(index)
            self.counts["health_checks"] += 1
        try:
            assert self.check is not None
            self.check(index)
            healthy, why = True, ""
        except Exception as error:  # noqa: BLE001 - any failure of the check is a failed check
            healthy, why = False, f"{type(error).__name__}: {error}"
        replacement, lost = None, False
        if not healthy:
            logger.warning("%s scheduler: worker %d failed its health check: %s", self.name, index, why)
            if self.replace is not None:
                try:
                    replacement = self.replace(index)
                except Exception as error:  # noqa: BLE001 - a worker that cannot be replaced is lost
                    logger.error("%s scheduler: worker %d could not be replaced: %s", self.name, index, error)
                    lost = True
            else:
                lost = True
        with self._cond:
            self._checking.discard(index)
            self._checked[index] = replacement is None  # a replacement is checked after its first chunk
            self._next_check[index] = time.monotonic() + self.health_every_s
            if not healthy:
                self.counts["health_failures"] += 1
            if replacement is not None:
                self.workers[index] = replacement
                self.counts["replaced"] += 1
                logger.warning("%s scheduler: worker %d replaced", self.name, index)
            if lost:
                self._lost.add(index)
                self.counts["lost"] += 1
                if not self._alive():
                    gone = WorkerLostError(f"{self.name} scheduler: every worker failed its health check ({why})")
                    for entry in self._pending:
                        self._fail(entry.job, gone)
                    self._pending.clear()
            self._cond.notify_all()

    def _due(self, index: int, now: float) -> bool:
        """Whether worker `index` is due a periodic health check (under the lock)."""
        return self.health_every_s > 0 and not self._closed and index not in self._lost \
            and now >= self._next_check[index]

    def _monitor(self) -> None:
        """Check each idle worker once it is due (`_due`); a busy one is checked by its own thread
        after its chunk. Sleeps until the next idle worker is due, or a chunk ends."""
        while True:
            with self._cond:
                if self._closed:
                    return
                now = time.monotonic()
                idle = [i for i in range(len(self.workers))
                        if self._busy[i] is None and i not in self._lost and i not in self._checking]
                due = [i for i in idle if self._due(i, now)]
                if not due:
                    self._cond.wait(min([self.health_every_s, *(self._next_check[i] - now for i in idle)]))
                    continue
                for i in due:  # claimed before the lock is let go, so no chunk starts on them
                    self._suspect.add(i)
            for i in due:
                with self._cond:
                    if self._busy[i] is not None or i not in self._suspect:
                        continue
                self._check_worker(i)


class RetryingScorer:
    """A scoring worker whose infra errors are retried with backoff: answers whose score came
    back `infra_error` (a sandbox that could not start, a busy host) are scored again, and a
    scoring call that failed with a retryable error (a lost worker) is made again, up to
    `policy.retries` times each, `policy.delay(n)` apart. What still fails keeps its infra-error
    score, which the gate drops (never a silent 0). `counts` says how many retries were made."""

    def __init__(self, scorer: Any, policy: RetryPolicy, stop: threading.Event | None = None) -> None:
        self.scorer, self.policy, self.stop = scorer, policy, stop or threading.Event()
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()  # the async loop scores several batches at once

    def _count(self, what: str, n: int = 1) -> None:
        with self._lock:
            self.counts[what] += n

    def _call(self, items: list[Any]) -> list[Any]:
        for attempt in itertools.count(1):
            try:
                return self.scorer.score_many(items)
            except self.policy.retry_on as error:
                if attempt > self.policy.retries or self.stop.is_set():
                    raise
                self._count("calls")
                logger.warning("scoring %d answer(s) failed (%s); retry %d of %d", len(items), error, attempt,
                               self.policy.retries)
                self.stop.wait(self.policy.delay(attempt))
        raise AssertionError("unreachable")

    def score_many(self, items: list[Any]) -> list[Any]:
        from tidal.types import Outcome

        scores = self._call(items)
        for attempt in range(1, self.policy.retries + 1):
            again = [i for i, score in enumerate(scores) if score.outcome == Outcome.INFRA_ERROR]
            if not again or self.stop.is_set():
                break
            self._count("infra_scores", len(again))
            logger.warning("%d answer(s) scored as infra errors; scoring them again (retry %d of %d)",
                           len(again), attempt, self.policy.retries)
            if self.stop.wait(self.policy.delay(attempt)):
                break
            for i, score in zip(again, self._call([items[i] for i in again])):
                scores[i] = score
        return scores

    def metrics(self) -> dict[str, float]:
        return {"retries/infra_scores": float(self.counts["infra_scores"]),
                "retries/scoring_calls": float(self.counts["calls"])}
