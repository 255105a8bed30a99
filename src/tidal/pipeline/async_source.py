"""Batches made ahead of the trainer: sampler threads generate on rollout workers (`local`
threads with their own policy copy, or `ray` actors), a scorer thread scores, gates and stores,
and the loop's `next_batch` takes them in step order. Admission control bounds staleness: batch
`b` starts only once weights `b - max_staleness` are published, waiting rather than discarding;
ratio control (`RatioController`) moves the window of batches in flight from each step's idle
times. Batch `b` holds exactly the tasks, seeds and ids the in-thread source makes for step `b`.
The threads, the mixer, the watch, the store and the checkpoints stay in this process, so
exactly-once and resume do not depend on the backend (docs/design/loop.md, "Asynchronous mode").
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import torch

from tidal.errors import WorkerLostError
from tidal.pipeline.backends import Workers, get_backend
from tidal.pipeline.ratio import RatioController, ratio_bounds
from tidal.pipeline.scheduler import (
    TRAIN_PRIORITY,
    Chunk,
    RetryingScorer,
    Scheduler,
    retry_policy,
)
from tidal.pipeline.stages import (
    LoopParts,
    ScoredBatch,
    domain_priority,
    gate_groups,
    gate_metrics,
    plan_chunks,
    run_state,
    score_groups,
    store_groups,
)
from tidal.pipeline.weights import Publication, WeightChannel, canary_ids, publish
from tidal.rollout.protocol import ReportsMetrics
from tidal.storage.store import TrajectoryStore
from tidal.types import Group, Task

logger = logging.getLogger(__name__)

POLL_S = 0.2  # how often a waiting thread looks at the stop flag
PENDING_POLL_S = 0.01  # how often the scorer thread, waiting for a batch's scores with room for another, looks for it


@dataclass
class SampledBatch:
    """One step's generated, not yet scored, episodes, as the sampler hands them to the scorer."""

    step: int
    groups: list[Group]
    timings: dict[str, float]  # generate_s, sampler_idle_s
    mixer_state: dict[str, Any]  # the mixer right after drawing this batch's tasks
    worker: int = 0  # the rollout worker that generated it


@dataclass
class _Failure:
    """A pipeline thread died; the trainer re-raises its error."""

    error: BaseException


# An engine rate and the count it is a fraction of, for summing workers' counters (`engine/reuse_rate`
# is a fraction of the prompt tokens; `spec/tokens_per_pass` is weighted by the drafts, whose count
# is proportional to the verify passes at a fixed draft length).
RATE_WEIGHTS = {"engine/prefix_hit_rate": "engine/prompt_tokens", "engine/reuse_rate": "engine/prompt_tokens",
                "spec/acceptance_rate": "spec/drafted", "spec/tokens_per_pass": "spec/drafted"}


def sum_engine_metrics(per_worker: list[dict[str, float]]) -> dict[str, float]:
    """Several engines' `run_metrics` as one engine's: counts summed, each rate of `RATE_WEIGHTS`
    the mean of the workers' rates weighted by the count it is a fraction of (plain mean when every
    weight is 0)."""
    out: dict[str, float] = {}
    for name in sorted({name for metrics in per_worker for name in metrics}):
        having = [metrics for metrics in per_worker if name in metrics]
        if name not in RATE_WEIGHTS:
            out[name] = sum(metrics[name] for metrics in having)
            continue
        weights = [float(metrics.get(RATE_WEIGHTS[name], 0.0)) for metrics in having]
        total = sum(weights)
        out[name] = (sum(w * m[name] for w, m in zip(weights, having)) / total if total
                     else sum(m[name] for m in having) / len(having))
    return out


def _put(out: queue.Queue, item: Any, stop: threading.Event) -> float | None:
    """Queue `item`, waiting while `out` is full. Returns the seconds waited, None if stopped."""
    mark = time.perf_counter()
    while not stop.is_set():
        try:
            out.put(item, timeout=POLL_S)
            return time.perf_counter() - mark
        except queue.Full:
            continue
    return None


class _Window:
    """The batches in flight ahead of the trainer: batch `b` may start only while
    `b < taken + limit`, `taken` being the batches the trainer has taken. Without ratio control
    `limit` is max_staleness + 1, which admission reaches first (batch `b` needs version
    `b - max_staleness`, and the trainer has published no more versions than batches it took)."""

    def __init__(self, limit: int, taken: int) -> None:
        self.limit, self.taken = limit, taken
        self.changed = threading.Condition()

    def set_limit(self, limit: int) -> None:
        with self.changed:
            self.limit = limit
            self.changed.notify_all()

    def took(self, step: int) -> None:
        with self.changed:
            self.taken = step + 1
            self.changed.notify_all()

    def wait_for_room(self, step: int, stop: threading.Event) -> bool:
        """True once batch `step` may start; False if stopped first."""
        with self.changed:
            while not stop.is_set():
                if step < self.taken + self.limit:
                    return True
                self.changed.wait(POLL_S)
        return False


class _Steps:
    """The sampler threads' shared order: which batch is claimed next (claims, admission and task
    draws happen one thread at a time, under `claim`), and which is handed on next."""

    def __init__(self, start: int, end: int) -> None:
        self.next_claim, self.next_out, self.end = start, start, end
        self.claim = threading.Lock()
        self.turn = threading.Condition()

    def hand_on(self, batch: SampledBatch, out: queue.Queue, stop: threading.Event) -> bool:
        """Queues `batch` once every batch before it was handed on; False if stopped first."""
        with self.turn:
            while self.next_out != batch.step:
                if stop.is_set():
                    return False
                self.turn.wait(POLL_S)
        if _put(out, batch, stop) is None:  # outside the lock: the next batch's thread only waits for its turn
            return False
        with self.turn:
            self.next_out += 1
            self.turn.notify_all()
        return True


class _Sampler(threading.Thread):
    """One of the sampler threads (one per rollout worker): claims the next batch of [start, end)
    when free, has it generated within the staleness bound and the window, by the scheduler's
    rollout workers, and hands it on in step order."""

    def __init__(
        self, parts: LoopParts, index: int, scheduler: Scheduler, channel: WeightChannel,
        mixer_lock: threading.Lock, window: _Window, steps: _Steps, out: queue.Queue, stop: threading.Event,
    ) -> None:
        super().__init__(name=f"tidal-sampler-{index}", daemon=True)
        self.parts, self.index, self.scheduler = parts, index, scheduler
        self.channel, self.mixer_lock, self.window, self.steps = channel, mixer_lock, window, steps
        self.out, self.stop = out, stop

    def run(self) -> None:
        try:
            waited = 0.0  # to hand the previous batch on; counted in the next (that one is no longer ours)
            while True:
                batch = self._sample()
                if batch is None:
                    return
                batch.timings["sampler_idle_s"] += waited
                mark = time.perf_counter()
                if not self.steps.hand_on(batch, self.out, self.stop):
                    return
                waited = time.perf_counter() - mark
        except BaseException as error:  # noqa: BLE001 - passed on through the scorer to the trainer
            _put(self.out, _Failure(error), self.stop)

    def _sample(self) -> SampledBatch | None:
        """The next unclaimed batch, generated; None when there is none left or the run stops."""
        parts, cfg = self.parts, self.parts.config
        mark = time.perf_counter()
        with self.steps.claim:
            step = self.steps.next_claim
            if step >= self.steps.end:
                return None
            self.steps.next_claim += 1
            if not self.window.wait_for_room(step, self.stop):
                return None
            # Admission: wait until weights recent enough for batch `step` are published.
            need = step - cfg.algorithm.max_staleness
            publication = self.channel.wait_for(need, cfg.pipeline.weight_timeout_s, self.stop, POLL_S)
            if publication is None:
                return None
            timings = {"sampler_idle_s": time.perf_counter() - mark}
            with self.mixer_lock:
                tasks = parts.draw_tasks(step)
                mixer_state = copy.deepcopy(parts.mixer.state_dict())
        mark = time.perf_counter()
        generated = self._generate(tasks, step, publication)
        if generated is None:
            return None
        groups, workers = generated
        timings["generate_s"] = time.perf_counter() - mark
        timings["rollout_workers_used"] = float(len(set(workers)))
        return SampledBatch(step, groups, timings, mixer_state, workers[0])

    def _generate(self, tasks: list[Task], step: int, publication: Publication) -> tuple[list[Group], list[int]] | None:
        """Batch `step` with `publication`'s weights: its chunks (`stages.plan_chunks`) run on
        whichever rollout workers are free, at training priority, older batches first; the
        groups in task order, and the worker of each chunk. None if the run stops first."""
        cfg = self.parts.config
        priority = domain_priority(cfg)
        plan = plan_chunks(tasks, cfg.rollout.batch_prompts, priority)
        chunks = [
            Chunk(_chunk_sampler([tasks[i] for i in positions], step, publication, positions),
                  priority=max(priority(tasks[i]) for i in positions), label=f"batch {step} tasks {positions[0]}..",
                  preemptible=True)
            for positions in plan
        ]
        job = self.scheduler.submit(f"batch {step}", TRAIN_PRIORITY, chunks, order=step)
        results = job.wait(self.stop)
        if results is None:
            return None
        ordered = sorted((group for groups in results for group in groups), key=lambda group: group.position)
        return ordered, [w for w in job.workers if w is not None] or [0]


def _chunk_sampler(tasks: list[Task], step: int, publication: Publication, positions: list[int]) -> Any:
    """A chunk's work: `worker.sample` of these tasks at their positions in batch `step`, stopped
    (`PreemptedError`) once the scheduler sets `cancel`; the next try goes on from what it kept."""
    kept: dict[tuple[str, ...], Any] = {}  # across the chunk's tries (Sampler.sample)
    return lambda worker, cancel: worker.sample(tasks, step, publication, positions, cancel, kept)


class _Scoring(threading.Thread):
    """One batch's scores (`stages.score_groups`), on a thread of its own."""

    def __init__(self, parts: LoopParts, sampled: SampledBatch) -> None:
        super().__init__(name=f"tidal-scoring-{sampled.step}", daemon=True)
        self.parts, self.sampled = parts, sampled
        self.error: BaseException | None = None
        self.done = threading.Event()
        self.start()

    def run(self) -> None:
        try:
            score_groups(self.parts.scorer, self.parts.domains, self.sampled.groups, self.sampled.timings)
        except BaseException as error:  # noqa: BLE001 - the scorer thread hands it to the trainer
            self.error = error
        finally:
            self.done.set()


class _ScorerThread(threading.Thread):
    """Scores, gates and stores the sampler's batches in order and queues them for the trainer.

    Up to `pipeline.scoring_depth` batches are scored at once (`_Scoring`), so the next batch's
    answers start on the sandboxes that the last one's slowest answers leave free; gating, the
    watch, the curricula and the store take the batches one at a time, in step order."""

    def __init__(
        self, parts: LoopParts, mixer_lock: threading.Lock, store: TrajectoryStore, store_lock: threading.Lock,
        sampled: queue.Queue, out: queue.Queue, stop: threading.Event,
    ) -> None:
        super().__init__(name="tidal-scorer", daemon=True)
        self.parts, self.mixer, self.mixer_lock = parts, parts.mixer, mixer_lock
        self.store, self.store_lock, self.sampled, self.out, self.stop = store, store_lock, sampled, out, stop
        self.depth = parts.config.pipeline.scoring_depth

    def run(self) -> None:
        pending: deque[_Scoring] = deque()
        try:
            idle_since: float | None = time.perf_counter()  # when the last batch's scoring ended
            failure: _Failure | None = None  # the sampler's, handed on after the batches before it
            while not self.stop.is_set():
                if failure is None and len(pending) < self.depth:  # room: take the next batch, if any
                    try:
                        item = self.sampled.get(timeout=POLL_S) if not pending else self.sampled.get_nowait()
                    except queue.Empty:
                        item = None
                    if isinstance(item, _Failure):
                        failure = item
                    elif item is not None:
                        now = time.perf_counter()
                        item.timings["scorer_idle_s"] = now - idle_since if idle_since is not None else 0.0
                        idle_since = None
                        pending.append(_Scoring(self.parts, item))
                        continue
                if not pending:
                    if failure is not None:
                        _put(self.out, failure, self.stop)
                        return
                    continue
                room = failure is None and len(pending) < self.depth  # else nothing to look for meanwhile
                if not pending[0].done.wait(PENDING_POLL_S if room else POLL_S):
                    continue
                scoring = pending.popleft()
                if scoring.error is not None:
                    raise scoring.error
                if not pending:
                    idle_since = time.perf_counter()
                if _put(self.out, self._gate(scoring.sampled), self.stop) is None:
                    return
        except BaseException as error:  # noqa: BLE001 - handed to the trainer, which re-raises it
            _put(self.out, _Failure(error), self.stop)
        finally:
            # No scoring outlives this thread: the loop joins it before it closes the workers
            # (sandboxes, Ray actors) that a scoring still running would be calling.
            for scoring in pending:
                scoring.join()

    def _exclude(self, task_id: str) -> None:
        """The watch's quarantine, under the lock the sampler draws under: a draw never sees the
        excluded set change mid-way."""
        with self.mixer_lock:
            self.mixer.exclude(task_id)

    def _gate(self, sampled: SampledBatch) -> ScoredBatch:
        parts, step, timings = self.parts, sampled.step, sampled.timings
        drops = gate_groups(parts, sampled.groups, step, exclude=self._exclude)
        with self.store_lock:  # stored before it is queued: the trainer only sees stored samples
            store_groups(self.store, step, sampled.groups, timings)
        with self.mixer_lock:
            state = copy.deepcopy(run_state(parts))
            metrics = gate_metrics(parts, step)
        # The checkpoint after this batch: the mixer's cursor as the sampler left it after drawing
        # this batch (it may have drawn later ones since), with every quarantine up to this batch.
        state["mixer"] = {**sampled.mixer_state, "excluded": state["mixer"]["excluded"]}
        return ScoredBatch(step, sampled.groups, drops, timings, metrics, state, worker=sampled.worker)


def _next_batch(batches: queue.Queue, scorer: threading.Thread, step: int) -> ScoredBatch | _Failure:
    """The next item of the queue; raises instead of hanging if the scorer thread is gone."""
    while True:
        try:
            return batches.get(timeout=POLL_S)
        except queue.Empty:
            if not scorer.is_alive():
                try:  # it may have queued its last item just before it ended
                    return batches.get_nowait()
                except queue.Empty:
                    raise RuntimeError(f"async loop: the scorer thread ended without sending batch {step}") from None


class AsyncSource:
    """Batches from threads ahead of the trainer, on `pipeline.backend`'s workers (see the module
    docstring). Started by the constructor; `close` stops and joins everything it started."""

    def __init__(self, parts: LoopParts, store: TrajectoryStore, store_lock: threading.Lock, start_step: int) -> None:
        cfg, pipeline = parts.config, parts.config.pipeline
        self.parts, self.max_staleness = parts, cfg.algorithm.max_staleness
        mixer_lock = threading.Lock()
        parts.domains.lock = mixer_lock  # the mixer reads the curricula the scorer thread updates
        self.canary = canary_ids(parts.engine.tokenizer)
        self.channel = WeightChannel()
        lora = cfg.trainer.lora
        self.adapter_only = lora.enabled and lora.publish == "adapter"  # else merged weights (or the full ones)
        self.channel.publish(publish(parts.trainer.model, parts.engine.weight_version, self.canary, self.adapter_only))
        self.window = _Window(self.max_staleness + 1, start_step)  # without ratio control, admission always binds first
        self.controller = self._ratio_controller()
        self.workers: Workers = get_backend(pipeline.backend).start(parts, self.channel.latest)
        retry = retry_policy(pipeline)
        self.scheduler = Scheduler(self.workers.rollouts, retry, check=lambda i: self.scheduler.workers[i].check(),
                                   replace=self.workers.replace, health_every_s=pipeline.health_check_s)
        self.stop = threading.Event()
        self.scoring = RetryingScorer(self.workers.scorer, retry, self.stop)
        sampled: queue.Queue = queue.Queue(maxsize=1)  # one generated batch waits while the previous is scored
        self.batches: queue.Queue = queue.Queue(maxsize=pipeline.queue_size)
        steps = _Steps(start_step, cfg.trainer.steps)
        self.samplers = [
            _Sampler(parts, index, self.scheduler, self.channel, mixer_lock, self.window, steps, sampled, self.stop)
            for index in range(len(self.workers.rollouts))
        ]
        scoring_parts = dataclasses.replace(parts, scorer=self.scoring)
        self.scorer = _ScorerThread(scoring_parts, mixer_lock, store, store_lock, sampled, self.batches, self.stop)
        self.threads = torch.get_num_threads()
        trainer_threads = self.workers.trainer_threads or pipeline.trainer_threads  # the backend's split, else the config's
        if trainer_threads and parts.trainer.device.type == "cpu":
            torch.set_num_threads(trainer_threads)  # this thread's share of the cores while the loop runs
            logger.info("CPU threads: %d for the trainer while the loop runs (torch has %d)", trainer_threads, self.threads)
        for thread in [*self.samplers, self.scorer]:
            thread.start()
        self.depth = 0

    def _ratio_controller(self) -> RatioController | None:
        pipeline = self.parts.config.pipeline
        if not pipeline.ratio_control:
            return None
        lower, upper = ratio_bounds(pipeline, self.max_staleness)
        self.window.set_limit(upper)
        logger.info("ratio control: %d batches in flight ahead of the trainer, at most (bounds %d..%d)", upper, lower, upper)
        return RatioController(upper, lower, upper, pipeline.ratio_idle_fraction)

    def next_batch(self, step: int) -> ScoredBatch:
        began = time.perf_counter()
        self.depth = self.batches.qsize()
        item = _next_batch(self.batches, self.scorer, step)
        if isinstance(item, _Failure):
            raise item.error
        if item.step != step:
            raise RuntimeError(f"async loop: the trainer expected batch {step}, the scorer thread sent {item.step}")
        self.window.took(step)
        item.timings["trainer_idle_s"] = time.perf_counter() - began
        return item

    def publish(self, version: int) -> None:
        self.channel.publish(publish(self.parts.trainer.model, version, self.canary, self.adapter_only))
        self.parts.sync_engine(version)  # the trainer-shared engine (evaluation)

    def report(self, step: int, metrics: dict[str, Any]) -> dict[str, Any]:
        """The pipeline's metrics for step `step` (whose `metrics` hold its timings); ratio
        control takes its decision from them."""
        out: dict[str, Any] = {"queue_depth": self.depth}
        if self.controller is not None:
            full = self.depth >= self.parts.config.pipeline.queue_size
            why = self.controller.update(metrics["trainer_idle_s"], metrics["step_s"], metrics["sampler_idle_s"],
                                         metrics["generate_s"], buffer_full=full)
            if why is not None:
                logger.info("ratio control: step %d: %d -> %d batches in flight ahead of the trainer: %s",
                            step + 1, self.window.limit, self.controller.limit, why)
                self.window.set_limit(self.controller.limit)
            out["ratio/in_flight"] = self.controller.limit
        out.update({f"restarts/{kind}": n for kind, n in self.workers.restarts().items()})
        out.update(self.scheduler.metrics())
        out.update(self.scoring.metrics())
        out.update(self._engine_metrics())
        return out

    def _engine_metrics(self) -> dict[str, float]:
        """The rollout engines' counters (`engine/...`, `spec/...`), as the sync loop reports its
        engine's: with an HTTP engine its server's (every worker samples there); else summed over
        the rollout workers' own engines (`sum_engine_metrics`). A worker that does not answer
        (being replaced) is left out of this row rather than failing the step."""
        engine = self.parts.engine
        if self.parts.engine_holds_copy:  # the workers' server (http)
            return engine.run_metrics() if isinstance(engine, ReportsMetrics) else {}
        per_worker = []
        for index, worker in enumerate(list(self.scheduler.workers)):
            try:
                per_worker.append(worker.run_metrics())
            except WorkerLostError as error:
                logger.info("engine metrics: rollout worker %d did not answer: %s", index, error)
        return sum_engine_metrics(per_worker)

    def hold(self, priority: int, name: str) -> contextlib.AbstractContextManager[None]:
        return self.scheduler.hold(priority, name)

    def close(self) -> None:
        self.stop.set()
        for thread in [*self.samplers, self.scorer]:
            thread.join()
        self.scheduler.close()
        self.workers.close()
        torch.set_num_threads(self.threads)
