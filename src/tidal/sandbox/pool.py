"""A pool of warm zygote sandboxes, shared by every batch and task, with a concurrency limit.

`SandboxPool(backend, size)` is itself a batch backend. With a `ZygoteBackend`, `run_batch` hands
each job to an idle zygote whose key matches (interpreter flags, harness files, preloaded modules)
and whose limits cover the job's, starting one while fewer than `size` are alive (else closing an
idle one of another key); other backends' batches run as their own `run_batch`, or not at all.
`run` is the backend's own single run. At most `size` jobs run at once, batched or single. A
zygote outlives the call that started it, so the next batch, of any task, finds pytest imported.
What stays per job is what `run_batch` guarantees; a zygote that died, hung, broke or was left
changed is replaced, and a job it could not vouch for comes back as None (the caller runs it
alone). Zygotes idle for `idle_s` are closed; `close` waits for running jobs and kills every
sandbox. Each zygote is opened by a thread of its own that lives as long as it does: bwrap's
`--die-with-parent` follows the thread that started it, not the process.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import os
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from tidal.errors import SandboxUnavailableError
from tidal.sandbox.base import (
    AfterRun,
    BatchBackend,
    BatchJob,
    SandboxBackend,
    SandboxResult,
)
from tidal.sandbox.batch import (
    FORKS_FILE,
    FORKS_SOURCE,
    Zygote,
    ZygoteBackend,
    ZygoteJob,
    batch_flags,
)
from tidal.types import Limits

log = logging.getLogger(__name__)

ZYGOTE_TIMEOUT_S = 3600.0  # a pool zygote's own CPU-seconds limit (its jobs set their own)
MEMORY_MB = 4096  # the least address space a pool zygote allows its jobs (more when a job asks for it)
PIDS = 256  # the least process limit a pool zygote allows its jobs
MAX_JOBS = 5000  # jobs after which a zygote is replaced by a fresh one
START_FAILURES = 3  # zygotes of one key that fail to start in a row before the pool stops trying...
START_PAUSE_S = 60.0  # ...for this long (its jobs come back as None and run alone)

Key = tuple[tuple[str, ...], str, tuple[str, ...]]  # interpreter flags, harness digest, preloaded modules


@dataclass
class PoolStats:
    """Counters for tests, benchmarks and logs."""

    started: int = 0  # zygotes started
    replaced: int = 0  # zygotes closed because they died, broke, were left changed or ran MAX_JOBS
    expired: int = 0  # zygotes closed after `idle_s` without a job
    evicted: int = 0  # idle zygotes closed to make room for one of another key
    jobs: int = 0  # jobs handed to zygotes
    unvouched: int = 0  # jobs that came back None
    templates: int = 0  # templates the zygotes were asked to start (zygote.py, "Templates")
    from_bases: int = 0  # of those, templates a base forked (zygote_forks.py, "base")
    peak_busy: int = 0  # the most jobs (batched or single) that ran at once


@dataclass(eq=False)
class _Entry:
    key: Key
    zygote: Zygote
    last_used: float = field(default_factory=time.monotonic)
    done: threading.Event = field(default_factory=threading.Event)  # set once closed: its thread exits
    template: str | None = None  # the key of the template its last templated job asked for


class SandboxPool:
    """Up to `size` warm zygote sandboxes of `backend` (default: one per CPU core), at most `size`
    jobs at a time. Thread-safe; a context manager. See the module docstring."""

    def __init__(
        self,
        backend: SandboxBackend,
        size: int | None = None,
        *,
        idle_s: float = 60.0,
        max_jobs: int = MAX_JOBS,
        memory_mb: int = MEMORY_MB,
        pids: int = PIDS,
    ) -> None:
        if size is not None and size < 1:
            raise ValueError(f"a sandbox pool needs at least one slot, not {size}")
        self.backend = backend
        # What the backend can do, decided once: keep zygotes warm, else run its own batches, else none.
        self._zygotes: ZygoteBackend | None = backend if isinstance(backend, ZygoteBackend) else None
        self._batches: BatchBackend | None = backend if isinstance(backend, BatchBackend) else None
        self.name = backend.name
        self.python = backend.python
        self.size = size or os.cpu_count() or 1
        self.idle_s, self.max_jobs = idle_s, max_jobs
        self.memory_mb, self.pids = memory_mb, pids
        self.stats = PoolStats()
        self._cond = threading.Condition()
        self._idle: list[_Entry] = []
        self._entries: list[_Entry] = []  # every live zygote, idle or busy (shared with the finalizer)
        self._alive = 0  # zygotes alive or starting
        self._busy = 0  # jobs running
        self._failures: dict[Key, tuple[int, float]] = {}  # failed starts in a row, time of the last
        self._closed = False
        self._finalizer = weakref.finalize(self, _close_all, self._entries)

    # ------------------------------------------------------------------ the backend interface

    def run(
        self,
        argv: list[str],
        files: dict[str, str | bytes],
        limits: Limits,
        env: dict[str, str] | None = None,
        after: AfterRun | None = None,
        *,
        harness_files: dict[str, str | bytes] | None = None,
        report_input: bytes | None = None,
    ) -> SandboxResult:
        """The backend's own `run` (a sandbox of its own), counted against the pool's limit."""
        with self._slot():
            return self.backend.run(argv, files, limits, env, after, harness_files=harness_files,
                                    report_input=report_input)

    def run_batch(
        self,
        jobs: Sequence[BatchJob],
        *,
        harness_files: dict[str, str | bytes] | None = None,
        preload: Sequence[str] = (),
    ) -> list[SandboxResult | None]:
        """See `BatchBackend`: one result per job, in order, None for a job no zygote could vouch
        for. The jobs run on up to `size` zygotes at once."""
        if not jobs:
            return []
        flags, _ = batch_flags(jobs, self.python)  # ValueError, as the backend's own run_batch
        if self._zygotes is None:  # no warm zygotes: the backend's batch, or none
            if self._batches is None:
                return [None] * len(jobs)
            with self._slot():
                return self._batches.run_batch(jobs, harness_files=harness_files, preload=preload)
        key: Key = (tuple(flags), _digest(harness_files or {}), tuple(preload))
        results: list[SandboxResult | None] = [None] * len(jobs)
        order = itertools.count()
        lock = threading.Lock()

        def work() -> None:
            while True:
                with lock:
                    index = next(order)
                if index >= len(jobs):
                    return
                results[index] = self._run_job(key, jobs[index], harness_files, preload)

        workers = [threading.Thread(target=work, name="tidal-pool-job", daemon=True)
                   for _ in range(min(self.size, len(jobs)) - 1)]
        for worker in workers:
            worker.start()
        work()
        for worker in workers:
            worker.join()
        return results

    # ------------------------------------------------------------------ lifecycle

    @property
    def alive(self) -> int:
        """Zygotes alive or starting."""
        with self._cond:
            return self._alive

    def zygote_pids(self) -> list[int]:
        """Host pids of the live zygote sandboxes (their bwrap processes)."""
        with self._cond:
            return [entry.zygote.pid for entry in self._entries]

    def close(self) -> None:
        """Wait for running jobs, then kill every zygote sandbox; later calls raise RuntimeError."""
        with self._cond:
            self._closed = True
            while self._busy:
                self._cond.wait()
            entries, self._idle = list(self._entries), []
            self._alive -= len(entries)
        for entry in entries:
            self._retire(entry)

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------ internals

    @contextmanager
    def _slot(self) -> Iterator[None]:
        with self._cond:
            while True:
                if self._closed:
                    raise RuntimeError("the sandbox pool is closed")
                if self._busy < self.size:
                    break
                self._cond.wait()
            self._take()
        try:
            yield
        finally:
            with self._cond:
                self._busy -= 1
                self._cond.notify_all()

    def _take(self) -> None:  # with the lock held
        self._busy += 1
        self.stats.peak_busy = max(self.stats.peak_busy, self._busy)

    def _run_job(self, key: Key, job: BatchJob, harness_files: dict[str, str | bytes] | None,
                 preload: Sequence[str]) -> SandboxResult | None:
        entry = self._lease(key, job, harness_files, preload)
        if entry is None:
            with self._cond:
                self.stats.unvouched += 1
            return None
        result = None
        templates, from_bases = entry.zygote.driver.templates, entry.zygote.driver.from_bases
        try:
            result = entry.zygote.run(job)
        finally:
            with self._cond:
                self.stats.templates += entry.zygote.driver.templates - templates
                self.stats.from_bases += entry.zygote.driver.from_bases - from_bases
            self._release(entry, vouched=result is not None)
        return result

    def _lease(self, key: Key, job: BatchJob, harness_files: dict[str, str | bytes] | None,
               preload: Sequence[str]) -> _Entry | None:
        """An idle zygote of `key` that fits `job`, or a new one; None when none can start. Counts
        as one running job until `_release`. Jobs of one template (one task's answers) go where it
        is: to an idle zygote that holds it, else to a new zygote while fewer than `size` are alive,
        else they wait for a busy one that holds it rather than make an idle one start it anew."""
        victim = None
        wanted = job.template.key if isinstance(job, ZygoteJob) and job.template is not None else None
        with self._cond:
            while True:
                if self._closed:
                    raise RuntimeError("the sandbox pool is closed")
                if self._busy < self.size:
                    fitting = [e for e in self._idle if e.key == key and e.zygote.fits(job)]
                    match = next((e for e in fitting if wanted is not None and e.template == wanted), None)
                    if match is None and fitting and (self._alive >= self.size or wanted is None):
                        held = wanted is not None and any(e.template == wanted and e not in self._idle
                                                          and e.key == key and e.zygote.fits(job) for e in self._entries)
                        match = None if held else min(fitting, key=lambda e: e.last_used)
                    if match is not None:
                        self._idle.remove(match)
                        self._take()
                        match.template = wanted or match.template
                        return match
                    failures, last = self._failures.get(key, (0, 0.0))
                    if failures >= START_FAILURES and time.monotonic() - last < START_PAUSE_S:
                        return None
                    if self._alive >= self.size and self._idle and not fitting:
                        victim = min(self._idle, key=lambda e: e.last_used)  # another key, or too small
                        self._idle.remove(victim)
                        self._alive -= 1
                        self.stats.evicted += 1
                    if self._alive < self.size:
                        self._alive += 1
                        self._take()
                        break
                self._cond.wait()
        if victim is not None:
            self._retire(victim)
        limits = Limits(timeout_s=ZYGOTE_TIMEOUT_S, memory_mb=max(job.limits.memory_mb, self.memory_mb),
                        pids=max(job.limits.pids, self.pids))
        try:
            entry = self._open(key, limits, harness_files, preload)
        except SandboxUnavailableError as error:
            log.warning("sandbox pool: a zygote did not start (%s); its job runs in a sandbox of its own", error)
            with self._cond:
                failures, _ = self._failures.get(key, (0, 0.0))
                self._failures[key] = (failures + 1, time.monotonic())
                self._alive -= 1
                self._busy -= 1
                self._cond.notify_all()
            return None
        entry.template = wanted
        with self._cond:
            self._failures.pop(key, None)
            self._entries.append(entry)
            self.stats.started += 1
        return entry

    def _release(self, entry: _Entry, vouched: bool) -> None:
        with self._cond:
            self._busy -= 1
            self.stats.jobs += 1
            self.stats.unvouched += not vouched
            keep = not self._closed and entry.zygote.usable and entry.zygote.jobs < self.max_jobs
            if keep:
                entry.last_used = time.monotonic()
                self._idle.append(entry)
            else:
                self._alive -= 1
                self.stats.replaced += not self._closed
            self._cond.notify_all()
        if not keep:
            self._retire(entry)

    def _retire(self, entry: _Entry) -> None:
        """Close a zygote that is in no list but `_entries` (the caller took it out of the rest)."""
        entry.zygote.close()
        entry.done.set()
        with self._cond:
            if entry in self._entries:
                self._entries.remove(entry)

    def _open(self, key: Key, limits: Limits, harness_files: dict[str, str | bytes] | None,
              preload: Sequence[str]) -> _Entry:
        """A new zygote, opened by a thread that then lives as long as it does and closes it once it
        has been idle for `idle_s`."""
        backend = self._zygotes
        assert backend is not None  # run_batch leases zygotes only from a backend that opens them
        opened: dict[str, Any] = {}
        ready = threading.Event()

        def keeper() -> None:
            try:
                zygote = backend.open_zygote(
                    list(key[0]), limits, harness_files={**(harness_files or {}), FORKS_FILE: FORKS_SOURCE},
                    preload=preload)
                opened["entry"] = entry = _Entry(key, zygote)
            except BaseException as error:  # handed to the thread that asked
                opened["error"] = error
                return
            finally:
                ready.set()
            while not entry.done.wait(timeout=max(0.05, min(self.idle_s / 2, 5.0))):
                self._expire(entry)

        threading.Thread(target=keeper, name="tidal-zygote", daemon=True).start()
        ready.wait()
        if "error" in opened:
            raise opened["error"]
        return opened["entry"]

    def _expire(self, entry: _Entry) -> None:
        with self._cond:
            idle = entry in self._idle and time.monotonic() - entry.last_used >= self.idle_s
            if idle:
                self._idle.remove(entry)
                self._alive -= 1
                self.stats.expired += 1
                self._cond.notify_all()
        if idle:
            self._retire(entry)


def _digest(files: dict[str, str | bytes]) -> str:
    digest = hashlib.sha256()
    for name in sorted(files):
        content = files[name]
        data = content.encode("utf-8") if isinstance(content, str) else content
        digest.update(f"{name}\0{len(data)}\0".encode() + data)
    return digest.hexdigest()


def _close_all(entries: list[_Entry]) -> None:
    """At garbage collection or interpreter exit: kill whatever zygotes are left."""
    for entry in list(entries):
        entry.zygote.close()
        entry.done.set()
