"""Request batching: one worker thread owns the engine and drives its continuous batch.

Used by `tidal serve` (one job per HTTP request) and by `LocalPolicy` (one job per agent turn, so
the turns of concurrent episodes share engine steps). Every job joins the engine's running batch
whatever its parameters or seed: between two engine steps the worker moves the waiting jobs, oldest
first, into the engine while its unfinished rows stay within `max_batch`, and the engine's
scheduler admits them at its next step (rollout/scheduler.py). Each row samples with its own
parameters, and a seeded row from its own generator, so a seeded job returns exactly what the
in-process call `engine.generate(prompts, n, params)` returns, whatever else is running. A
`gather_s` window (0 for the server) lets an idle worker wait that long before its first step, for
agent turns arriving a few ms apart, so their prefills share a step.

The queue is bounded (`max_queue`, `QueueFull`: the server's 503); a job whose client went away is
dropped when reached, or aborted in the engine if already running. Each job's result carries its
share (by rows) of the process CPU time of the engine steps it ran in. docs/design/serve.md, "Batching".
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import torch

from tidal.rollout.engine import EmbeddedEngine, Request, RequestHandle, SamplingParams
from tidal.rollout.sampling import derived_seed
from tidal.types import Completion

logger = logging.getLogger(__name__)

# Per prompt, per sample, per generated token: the k most likely (token id, logprob), best first.
TopLogprobs = list[list[list[list[tuple[int, float]]]]]


class QueueFull(Exception):
    """The queue holds `max_queue` requests already; the client should retry later."""


class ShuttingDown(Exception):
    """The server is stopping and takes no more work."""


class BatchMetrics(Protocol):
    """Prometheus-style instruments the batcher reports to (serve's `ServeMetrics`)."""

    queue_depth: Any  # .set(waiting jobs)
    queue_wait: Any  # .observe(seconds a job waited)
    batch_rows: Any  # .observe(rows moved into the running batch together)
    batch_requests: Any  # .observe(jobs moved into the running batch together)


@dataclass
class JobResult:
    completions: list[list[Completion]]  # per prompt, its n completions
    top_logprobs: TopLogprobs | None  # when the job asked for top_logprobs > 0
    cpu_s: float = 0.0  # this job's share (by rows) of the process CPU seconds of the engine steps it ran in
    batch_jobs: int = 1  # the most jobs that shared an engine step with this one


@dataclass
class Job:
    """One request's work: `n` completions of each prompt, and where to send tokens and the result.

    `on_token(prompt, sample, token_id)` and `on_done(result or exception)` run on the worker
    thread; they must only hand the data over (e.g. `loop.call_soon_threadsafe`).
    """

    prompts: list[list[int]]
    n: int
    params: SamplingParams
    on_done: Callable[[JobResult | BaseException], None]
    on_token: Callable[[int, int, int], None] | None = None
    top_logprobs: int = 0
    cancelled: bool = False  # set by the server when the client disconnects
    enqueued_at: float = field(default_factory=time.perf_counter)

    @property
    def rows(self) -> int:
        return len(self.prompts) * self.n


@dataclass
class _Running:
    """A job inside the engine: its requests' handles and what it has cost so far."""

    job: Job
    handles: list[RequestHandle]
    cpu_s: float = 0.0
    batch_jobs: int = 1  # the most jobs that shared an engine step with it


class Batcher:
    """Owns `engine` on one worker thread; `submit` queues a job, the worker moves it into the
    engine's running batch and steps the engine until it is done."""

    def __init__(self, engine: EmbeddedEngine, max_batch: int, max_queue: int,
                 metrics: BatchMetrics | None = None, gather_s: float = 0.0) -> None:
        self.engine = engine
        self.max_batch = max_batch
        self.max_queue = max_queue
        self.metrics = metrics
        # How long an idle worker waits for more jobs before its first step (0: it starts at once).
        # Agent episodes in step submit their turns a few ms apart.
        self.gather_s = gather_s
        self._queue: deque[Job] = deque()
        self._condition = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="tidal-engine-batcher", daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> None:
        """Queue `job`; raises QueueFull when `max_queue` jobs wait already, ShuttingDown after close."""
        if job.rows > self.max_batch:
            raise ValueError(f"a job of {job.rows} rows exceeds max_batch={self.max_batch}")
        with self._condition:
            if self._closed:
                raise ShuttingDown("the server is shutting down")
            if len(self._queue) >= self.max_queue:
                raise QueueFull(f"{len(self._queue)} requests are waiting (max_queue={self.max_queue})")
            self._queue.append(job)
            if self.metrics is not None:
                self.metrics.queue_depth.set(len(self._queue))
            self._condition.notify()

    def depth(self) -> int:
        with self._condition:
            return len(self._queue)

    def close(self, timeout: float = 30.0) -> None:
        """Stop taking work, fail what still waits with ShuttingDown, and let the running jobs finish."""
        with self._condition:
            self._closed = True
            waiting = list(self._queue)
            self._queue.clear()
            self._condition.notify_all()
        for job in waiting:
            job.on_done(ShuttingDown("the server is shutting down"))
        self._thread.join(timeout)

    # ---------------------------------------------------------------- worker

    def _run(self) -> None:
        running: list[_Running] = []
        while True:
            with self._condition:
                while not self._queue and not running and not self._closed:
                    self._condition.wait()
                if self._closed and not running:
                    return
                if not running and self.gather_s:
                    deadline = time.monotonic() + self.gather_s
                    while (not self._closed and sum(job.rows for job in self._queue) < self.max_batch
                           and time.monotonic() < deadline):
                        self._condition.wait(deadline - time.monotonic())
                taken = self._take(sum(entry.job.rows for entry in running))
                if self.metrics is not None:
                    self.metrics.queue_depth.set(len(self._queue))
            running += self._start(taken)
            running = self._step(running)

    def _take(self, rows: int) -> list[Job]:
        """Waiting jobs, oldest first, while the engine's rows stay within `max_batch` (lock held;
        none once closed: the running jobs finish, the waiting ones were failed by `close`)."""
        taken: list[Job] = []
        if self._closed:
            return taken
        while self._queue:
            job = self._queue[0]
            if job.cancelled:
                self._queue.popleft()
                continue
            if rows + job.rows > self.max_batch:
                break
            taken.append(self._queue.popleft())
            rows += job.rows
        return taken

    def _start(self, jobs: list[Job]) -> list[_Running]:
        """Submit `jobs` to the engine: one request per prompt, as `engine.generate` makes them."""
        started, now = [], time.perf_counter()
        for job in jobs:
            if self.metrics is not None:
                self.metrics.queue_wait.observe(now - job.enqueued_at)
            try:
                handles = [self.engine.submit(request) for request in _requests(job)]
            except Exception as error:  # a bad request fails its own client only
                job.on_done(error)
                continue
            started.append(_Running(job, handles))
        if started and self.metrics is not None:
            self.metrics.batch_rows.observe(sum(entry.job.rows for entry in started))
            self.metrics.batch_requests.observe(len(started))
        return started

    def _step(self, running: list[_Running]) -> list[_Running]:
        """One engine step; finished jobs get their results; returns the jobs still running."""
        for entry in running:
            if entry.job.cancelled:
                self._abort(entry)
        running = [entry for entry in running if not entry.job.cancelled]
        if not running:
            return running
        cpu = time.process_time()
        try:
            self.engine.step()
        except Exception as error:  # every running client must hear of the failure
            logger.exception("engine.step failed with %d request(s) running", len(running))
            for entry in running:
                self._abort(entry)
                entry.job.on_done(error)
            return []
        cpu = time.process_time() - cpu
        rows = sum(entry.job.rows for entry in running)
        still = []
        for entry in running:
            entry.cpu_s += cpu * entry.job.rows / rows
            entry.batch_jobs = max(entry.batch_jobs, len(running))
            if all(handle.done for handle in entry.handles):
                self._finish(entry)
            else:
                still.append(entry)
        return still

    def _finish(self, entry: _Running) -> None:
        job = entry.job
        completions = [self.engine.complete(handle) for handle in entry.handles]
        try:
            top = self._top_logprobs(completions, job) if job.top_logprobs else None
        except Exception as error:  # reported to this request's client only
            logger.exception("top_logprobs failed")
            job.on_done(error)
            return
        job.on_done(JobResult(completions=completions, top_logprobs=top, cpu_s=entry.cpu_s, batch_jobs=entry.batch_jobs))

    def _abort(self, entry: _Running) -> None:
        for handle in entry.handles:
            self.engine.abort(handle)

    @torch.inference_mode()
    def _top_logprobs(self, completions: list[list[Completion]], job: Job) -> TopLogprobs:
        """The `job.top_logprobs` most likely tokens at each generated position.

        The engine returns only the sampled token's logprob, so these come from one teacher-forced
        forward pass over prompt + completion, with the sampler's convention (log_softmax of
        logits / temperature, temperature 1 when greedy, before top-p).
        """
        model, device = self.engine.model, self.engine.device
        temperature = job.params.temperature or 1.0
        out: TopLogprobs = []
        for group in completions:
            per_prompt = []
            for completion in group:
                if not completion.token_ids:
                    per_prompt.append([])
                    continue
                ids = torch.tensor([completion.prompt_ids + completion.token_ids], device=device)
                start = len(completion.prompt_ids) - 1
                logits = model(input_ids=ids).logits[0, start:-1].float()  # (T, V)
                values, indices = torch.log_softmax(logits / temperature, dim=-1).topk(job.top_logprobs, dim=-1)
                per_prompt.append(
                    [list(zip(row_ids, row_values)) for row_ids, row_values in zip(indices.tolist(), values.tolist())]
                )
            out.append(per_prompt)
        return out


def _requests(job: Job) -> list[Request]:
    """The engine requests of `job`, seeded per prompt exactly as `EmbeddedEngine.generate` seeds them."""
    params, requests = job.params, []
    for index, prompt in enumerate(job.prompts):
        seeded = params if params.seed is None else replace(params, seed=derived_seed(params.seed, index))
        on_token = None
        if job.on_token is not None:
            on_token = _stream(job, index)
        requests.append(Request(list(prompt), seeded, job.n, on_token))
    return requests


def _stream(job: Job, prompt: int) -> Callable[[int, int], None]:
    def on_token(sample: int, token: int) -> None:
        if job.on_token is not None and not job.cancelled:
            job.on_token(prompt, sample, token)

    return on_token
