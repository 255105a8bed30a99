"""Request batching: one worker thread owns the engine and serves queued requests in batches.

Used by `tidal serve` (one job per HTTP request) and by `LocalPolicy` (one job per agent turn, so
the turns of concurrent episodes share engine calls). The engine samples a whole batch with one
`SamplingParams` and one random generator, so a batch holds requests whose parameters match
exactly. The worker takes the oldest waiting request, then every other waiting one with the same
parameters within `max_batch` rows: no request waits behind a younger one of another kind, and
requests arriving while the engine is busy go together in the next call. A `gather_s` window (0
for the server) lets a call wait that long to fill, for agent turns arriving a few ms apart.

A request with a `seed` is always generated alone, as exactly the in-process call
`engine.generate(prompts, n, params)`, so it returns that call's completions (a shared batch would
share the random stream and change the padding). The queue is bounded (`max_queue`, `QueueFull`:
the server's 503); a request whose client went away is dropped when reached. Each job's result
carries its share (by rows) of its engine call's process CPU time. docs/design/serve.md, "Batching".
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from tidal.rollout.engine import EmbeddedEngine, SamplingParams
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
    batch_rows: Any  # .observe(rows per engine call)
    batch_requests: Any  # .observe(jobs per engine call)


@dataclass
class JobResult:
    completions: list[list[Completion]]  # per prompt, its n completions
    top_logprobs: TopLogprobs | None  # when the job asked for top_logprobs > 0
    cpu_s: float = 0.0  # this job's share (by rows) of the process CPU seconds of its engine call
    batch_jobs: int = 1  # jobs that shared the engine call


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

    def batch_key(self) -> tuple[object, ...] | None:
        """Jobs with equal keys may share an engine call; None (seeded) never shares."""
        p = self.params
        if p.seed is not None:
            return None
        return (self.n, p.temperature, p.top_p, p.max_new_tokens, tuple(p.stop), p.ignore_eos)


class Batcher:
    """Owns `engine` on one worker thread; `submit` queues a job, the worker runs batches of them."""

    def __init__(self, engine: EmbeddedEngine, max_batch: int, max_queue: int,
                 metrics: BatchMetrics | None = None, gather_s: float = 0.0) -> None:
        self.engine = engine
        self.max_batch = max_batch
        self.max_queue = max_queue
        self.metrics = metrics
        # How long the worker waits for more jobs before a call that is not full (0: it starts at
        # once). Agent episodes in step submit their turns a few ms apart.
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
        """Stop taking work, fail what still waits with ShuttingDown, and let the current batch end."""
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
        while True:
            with self._condition:
                while not self._queue and not self._closed:
                    self._condition.wait()
                if self._closed:
                    return
                deadline = time.monotonic() + self.gather_s
                while (not self._closed and sum(job.rows for job in self._queue) < self.max_batch
                       and time.monotonic() < deadline):
                    self._condition.wait(deadline - time.monotonic())
                batch = self._take()
                if self.metrics is not None:
                    self.metrics.queue_depth.set(len(self._queue))
            if batch:
                self._execute(batch)

    def _take(self) -> list[Job]:
        """The oldest live job plus every waiting job that may share its engine call (lock held)."""
        while self._queue and self._queue[0].cancelled:
            self._queue.popleft()
        if not self._queue:
            return []
        head = self._queue.popleft()
        batch, rows, key = [head], head.rows, head.batch_key()
        if key is None:
            return batch
        kept: deque[Job] = deque()
        for job in self._queue:
            if job.cancelled:
                continue
            if job.batch_key() == key and rows + job.rows <= self.max_batch:
                batch.append(job)
                rows += job.rows
            else:
                kept.append(job)
        self._queue = kept
        return batch

    def _execute(self, batch: list[Job]) -> None:
        started = time.perf_counter()
        prompts: list[list[int]] = []
        owners: list[tuple[Job, int]] = []  # engine prompt index -> (job, the job's prompt index)
        for job in batch:
            if self.metrics is not None:
                self.metrics.queue_wait.observe(started - job.enqueued_at)
            for index, prompt in enumerate(job.prompts):
                prompts.append(prompt)
                owners.append((job, index))
        if self.metrics is not None:
            self.metrics.batch_rows.observe(len(prompts) * batch[0].n)
            self.metrics.batch_requests.observe(len(batch))

        def dispatch(prompt: int, sample: int, token: int) -> None:
            job, index = owners[prompt]
            if job.on_token is not None and not job.cancelled:
                job.on_token(index, sample, token)

        streaming = any(job.on_token is not None for job in batch)
        cpu = time.process_time()
        try:
            results = self.engine.generate(prompts, n=batch[0].n, params=batch[0].params, on_token=dispatch if streaming else None)
            cpu = time.process_time() - cpu
        except Exception as error:  # every waiting client must hear of the failure
            logger.exception("engine.generate failed for a batch of %d request(s)", len(batch))
            for job in batch:
                job.on_done(error)
            return
        position = 0
        for job in batch:
            completions = results[position : position + len(job.prompts)]
            position += len(job.prompts)
            try:
                top = self._top_logprobs(completions, job) if job.top_logprobs else None
            except Exception as error:  # reported to this request's client only
                logger.exception("top_logprobs failed")
                job.on_done(error)
                continue
            job.on_done(JobResult(completions=completions, top_logprobs=top, cpu_s=cpu * len(job.prompts) / len(prompts),
                                  batch_jobs=len(batch)))

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
