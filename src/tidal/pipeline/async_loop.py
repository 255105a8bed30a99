"""The asynchronous RL loop: generation, scoring and training overlap, with bounded staleness.

    sampler threads: wait for admission -> draw tasks -> sample -> (in step order) --> queue (1)
    scorer thread:   queue -> score (sandboxes) -> gate -> watch -> advantages -> store -> queue
    trainer (caller): queue -> update -> mark_trained -> publish weights -> checkpoint -> metrics

So while batch `b` is scored in sandboxes, batch `b + 1` is generated and batch `b - 1` trained.
Batch `b` is what the synchronous loop calls step `b` (same tasks from the mixer, same sampling
seed, same trajectory ids) and the trainer trains it at step `b`, after `b` updates. A batch
generated with weight version `v` is therefore `b - v` updates stale when trained. Admission
control keeps that at most `algorithm.max_staleness`: the sampler does not start batch `b` until
its engine holds version `b - max_staleness` or newer. It waits rather than discards, so no
sample is thrown away for being slow (which would bias training toward short, easy tasks). With
`max_staleness: 0` the loop is on-policy and trains on exactly what the synchronous loop trains on.

The generation and scoring work runs on a backend (`pipeline.backend`, `pipeline/backends/`):
`local` does it on the sampler and scorer threads, `ray` in Ray actors that these threads call.
Either way the threads, the mixer, the watch, the store and the checkpoints stay here, so
exactly-once and resume do not depend on the backend. With `pipeline.rollout_workers: N`, N sampler
threads each drive one rollout worker: the first free one claims the next batch (claims, admission
and task draws happen in step order, under one lock), generates it, and hands it on when every
earlier batch has been handed on, so the scorer and the trainer still see batches in step order.
Each rollout worker samples from its own
copy of the policy: after each update the trainer publishes its weights (versioned, checksummed,
with canary logprobs: `pipeline/weights.py`) to a `WeightChannel`; the sampler hands the newest
publication to the worker with the next batch, and the worker loads and verifies it *between*
batches, so it never generates while the weights change and the trainer never waits for it.

Ratio control (`pipeline.ratio_control`): a window bounds the batches in flight ahead of the
trainer (started by a sampler, not yet taken by the trainer), inside what the staleness bound and
the queues allow; `RatioController` moves it by one from each step's idle times, raising it when
the trainer waited for its batch and lowering it when the buffer was full or the samplers waited
while the trainer did not.

Off-policy correction: the loss's old logprobs are the sampler's (the behaviour policy's), so
PPO-clip's ratio pi_theta / pi_behaviour is the importance weight and its clip truncates it
(docs/design/loop.md, "Asynchronous mode").

Exactly once and resume work as in the synchronous loop: every batch is written to the store
before it is queued for the trainer, `mark_trained` follows each update, and checkpoints hold the
mixer and watch states *as of the checkpoint's step* (the sampler is ahead), so a resumed run
regenerates the batches after the checkpoint with the same tasks and ids.

No part this module wires knows about it; it reuses the synchronous loop's helpers.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import queue
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from tidal.pipeline.backends import Workers, get_backend
from tidal.pipeline.loop import (
    LoopParts,
    StepCallback,
    domain_priority,
    plan_chunks,
    save_rl_checkpoint,
    score_and_gate,
    step_metrics,
)
from tidal.pipeline.scheduler import (
    TRAIN_PRIORITY,
    Chunk,
    RetryingScorer,
    Scheduler,
    retry_policy,
)
from tidal.pipeline.weights import Publication, WeightChannel, canary_ids, publish
from tidal.storage.store import TrajectoryStore, open_run_store
from tidal.trainer.logprobs import collate
from tidal.types import Episode, Task

logger = logging.getLogger(__name__)

POLL_S = 0.2  # how often a waiting thread looks at the stop flag


class StalenessError(RuntimeError):
    """A sample older than `algorithm.max_staleness` reached the trainer (a bug in admission control)."""


@dataclass
class SampledBatch:
    """One step's generated, not yet scored, episodes, as the sampler hands them to the scorer."""

    step: int
    tasks_by_id: dict[str, Task]
    episodes: list[Episode]
    timings: dict[str, float]  # generate_s, sampler_idle_s
    mixer_state: dict[str, Any]  # the mixer right after drawing this batch's tasks
    worker: int = 0  # the rollout worker that generated it


@dataclass
class ScoredBatch:
    """One step's scored and gated episodes, as the scorer thread hands them to the trainer."""

    step: int
    episodes: list[Episode]
    drops: dict[str, int]
    timings: dict[str, float]  # generate_s, score_s, sampler_idle_s, scorer_idle_s
    mixer_state: dict[str, Any]  # the mixer after this batch: what a checkpoint at step + 1 saves
    watch_state: dict[str, Any] | None
    watch_metrics: dict[str, Any] = field(default_factory=dict)
    domains_state: dict[str, Any] | None = None  # the per-domain state after this batch
    domains_metrics: dict[str, float] = field(default_factory=dict)
    worker: int = 0  # the rollout worker that generated it


@dataclass
class _Failure:
    """A pipeline thread died; the trainer re-raises its error."""

    error: BaseException


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


class _LockedMixer:
    """The mixer as the scorer thread sees it: `exclude` (the watch's quarantines) under the lock
    the sampler holds while it draws, so a draw never sees the excluded set change mid-way."""

    def __init__(self, mixer: Any, lock: threading.Lock) -> None:
        self.mixer, self.lock = mixer, lock

    def exclude(self, task_id: str) -> None:
        with self.lock:
            self.mixer.exclude(task_id)


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
                tasks = parts.mixer.sample(parts.domains.tasks_to_draw() if parts.domains else cfg.tasks.tasks_per_step, step)
                mixer_state = copy.deepcopy(parts.mixer.state_dict())
        mark = time.perf_counter()
        generated = self._generate(tasks, step, publication)
        if generated is None:
            return None
        episodes, workers = generated
        timings["generate_s"] = time.perf_counter() - mark
        timings["rollout_workers_used"] = float(len(set(workers)))
        return SampledBatch(step, {task.id: task for task in tasks}, episodes, timings, mixer_state, workers[0])

    def _generate(self, tasks: list[Task], step: int, publication: Publication) -> tuple[list[Episode], list[int]] | None:
        """Batch `step` with `publication`'s weights: its chunks (`loop.plan_chunks`) run on
        whichever rollout workers are free, at training priority, older batches first; the
        episodes in task order, and the worker of each chunk. None if the run stops first."""
        cfg = self.parts.config
        priority = domain_priority(cfg)
        plan = plan_chunks(tasks, cfg.rollout.batch_prompts, priority)
        chunks = [
            Chunk(_chunk_sampler([tasks[i] for i in positions], step, publication, positions),
                  priority=max(priority(tasks[i]) for i in positions), label=f"batch {step} tasks {positions[0]}..")
            for positions in plan
        ]
        job = self.scheduler.submit(f"batch {step}", TRAIN_PRIORITY, chunks, order=step)
        results = job.wait(self.stop)
        if results is None:
            return None
        by_position: dict[int, list[Episode]] = {}
        for episodes in results:
            for episode in episodes:
                by_position.setdefault(int(episode.group_id.rsplit("/g", 1)[1]), []).append(episode)
        ordered = [episode for position in range(len(tasks)) for episode in by_position.get(position, [])]
        return ordered, [w for w in job.workers if w is not None] or [0]


def _chunk_sampler(tasks: list[Task], step: int, publication: Publication, positions: list[int]) -> Any:
    """A chunk's work: `worker.sample` of these tasks at their positions in batch `step`."""
    return lambda worker: worker.sample(tasks, step, publication, positions)


class _ScorerThread(threading.Thread):
    """Scores, gates and stores the sampler's batches in order and queues them for the trainer."""

    def __init__(
        self, parts: LoopParts, mixer_lock: threading.Lock, store: TrajectoryStore, store_lock: threading.Lock,
        sampled: queue.Queue, out: queue.Queue, stop: threading.Event,
    ) -> None:
        super().__init__(name="tidal-scorer", daemon=True)
        # `parts.scorer` is the backend's scoring worker (duck-typed: only `score_many` is used).
        self.parts = dataclasses.replace(parts, mixer=_LockedMixer(parts.mixer, mixer_lock))
        self.mixer, self.mixer_lock = parts.mixer, mixer_lock
        self.store, self.store_lock, self.sampled, self.out, self.stop = store, store_lock, sampled, out, stop

    def run(self) -> None:
        try:
            waited: float | None = 0.0  # for room in the trainer's queue; counted in the next batch
            mark = time.perf_counter()
            while not self.stop.is_set():
                try:
                    item = self.sampled.get(timeout=POLL_S)
                except queue.Empty:
                    continue
                if isinstance(item, _Failure):
                    _put(self.out, item, self.stop)
                    return
                item.timings["scorer_idle_s"] = waited + time.perf_counter() - mark
                batch = self._score(item)
                waited = _put(self.out, batch, self.stop)
                if waited is None:
                    return
                mark = time.perf_counter()
        except BaseException as error:  # noqa: BLE001 - handed to the trainer, which re-raises it
            _put(self.out, _Failure(error), self.stop)

    def _score(self, sampled: SampledBatch) -> ScoredBatch:
        parts, step, timings = self.parts, sampled.step, sampled.timings
        drops = score_and_gate(parts, sampled.episodes, sampled.tasks_by_id, step, timings)
        with self.store_lock:  # stored before it is queued: the trainer only sees stored samples
            self.store.write_episodes(step, sampled.episodes, sampled.tasks_by_id, timings)
        # The checkpoint after this batch: the mixer's cursor as the sampler left it after drawing
        # this batch (it may have drawn later ones since), with every quarantine up to this batch.
        mixer_state = sampled.mixer_state
        with self.mixer_lock:
            mixer_state["excluded"] = sorted(self.mixer.excluded)
        watch, domains = parts.watch, parts.domains
        domains_state = domains_metrics = None
        if domains is not None:
            with self.mixer_lock:
                domains_state, domains_metrics = copy.deepcopy(domains.state_dict()), domains.metrics(step + 1)
        return ScoredBatch(
            step, sampled.episodes, drops, timings,
            mixer_state=mixer_state,
            watch_state=copy.deepcopy(watch.state_dict()) if watch is not None else None,
            watch_metrics=watch.metrics() if watch is not None else {},
            domains_state=domains_state,
            domains_metrics=domains_metrics or {},
            worker=sampled.worker,
        )


@dataclass
class RatioController:
    """Moves the window of batches in flight ahead of the trainer (`limit`, within [lower, upper])
    by one, from one step's idle times at a time:

    - the trainer waited for its batch more than `idle_fraction` of its step: raise it, at once
      (a starved trainer is the costly case);
    - the trainer did not, and the buffer was full (the trainer found `queue_size` batches waiting)
      or the batch's sampler waited (admission, the window, room to hand on) more than
      `idle_fraction` of its time: lower it, after `patience` such steps in a row (one could be
      a hiccup).

    So the window settles at the smallest that keeps the trainer busy: full throughput with the
    freshest samples and the smallest buffer. Hand values in, a decision out: no clocks here."""

    limit: int
    lower: int
    upper: int
    idle_fraction: float = 0.1
    patience: int = 2
    _glut: int = 0  # steps in a row that asked to lower it

    def update(
        self, trainer_idle_s: float, step_s: float, sampler_idle_s: float, generate_s: float, buffer_full: bool
    ) -> str | None:
        """Takes one step's measures; returns why the limit changed, or None if it did not."""
        trainer_idle = trainer_idle_s > self.idle_fraction * max(step_s, 1e-9)
        sampler_idle = sampler_idle_s > self.idle_fraction * max(sampler_idle_s + generate_s, 1e-9)
        if trainer_idle:
            self._glut = 0
            if self.limit < self.upper:
                self.limit += 1
                return f"the trainer waited {trainer_idle_s:.2f} s of a {step_s:.2f} s step"
            return None
        self._glut = self._glut + 1 if buffer_full or sampler_idle else 0
        if self._glut >= self.patience and self.limit > self.lower:
            self._glut = 0
            self.limit -= 1
            why = "the buffer was full" if buffer_full else f"the samplers waited {sampler_idle_s:.2f} s"
            return f"{why} while the trainer did not wait, {self.patience} steps in a row"
        return None


def ratio_bounds(pipeline: Any, max_staleness: int) -> tuple[int, int]:
    """(lower, upper) of the in-flight window: never above what the staleness bound allows
    (max_staleness + 1: the batch the trainer is on and max_staleness ahead) nor what the queues
    hold (the trainer's queue, the batch being scored, the scorer's queue of one, one per rollout
    worker), never below 1, and within the configured bounds."""
    upper = min(max_staleness + 1, pipeline.queue_size + pipeline.rollout_workers + 2)
    if pipeline.ratio_max_in_flight is not None:
        upper = min(upper, pipeline.ratio_max_in_flight)
    return min(pipeline.ratio_min_in_flight, upper), upper


def staleness_metrics(kept: list[Episode], step: int) -> dict[str, float]:
    """`staleness/<k>`: trained samples made `k` updates before this one; `staleness_max`."""
    counts = Counter(step - e.completion.weight_version for e in kept)
    metrics: dict[str, float] = {f"staleness/{k}": n for k, n in sorted(counts.items())}
    metrics["staleness_max"] = max(counts, default=0)
    return metrics


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


def run_async_rl(parts: LoopParts, start_step: int = 0, on_step: StepCallback | None = None) -> int:
    """Train from `start_step` to `trainer.steps`, sampling and scoring in two background threads
    on `pipeline.backend`'s workers. Returns the number of steps taken now. Same run-folder
    artefacts as `run_rl`, plus the async metrics."""
    cfg = parts.config
    bound = cfg.algorithm.max_staleness
    store = open_run_store(parts.run, cfg.run.trajectory_store)  # an unwritable URL fails here, at once
    backend = get_backend(cfg.pipeline.backend)
    store.rollback(start_step)  # what the steps after the resumed checkpoint trained died with them
    store_lock = threading.Lock()
    mixer_lock = threading.Lock()
    if parts.domains is not None:
        parts.domains.lock = mixer_lock  # the mixer reads the curricula the scorer thread updates
    canary = canary_ids(parts.engine.tokenizer)
    channel = WeightChannel()
    channel.publish(publish(parts.trainer.model, parts.engine.weight_version, canary))
    controller = None
    window = _Window(bound + 1, start_step)  # without ratio control, admission always binds first
    if cfg.pipeline.ratio_control:
        lower, upper = ratio_bounds(cfg.pipeline, bound)
        controller = RatioController(upper, lower, upper, cfg.pipeline.ratio_idle_fraction)
        window.set_limit(upper)
        logger.info("ratio control: %d batches in flight ahead of the trainer, at most (bounds %d..%d)", upper, lower, upper)
    workers: Workers = backend.start(parts)
    pipeline = cfg.pipeline
    retry = retry_policy(pipeline)
    scheduler = Scheduler(workers.rollouts, retry, check=lambda i: scheduler.workers[i].check(),
                          replace=workers.replace, health_every_s=pipeline.health_check_s)
    parts.scheduler = scheduler
    stop = threading.Event()
    scoring = RetryingScorer(workers.scorer, retry, stop)
    sampled: queue.Queue = queue.Queue(maxsize=1)  # one generated batch waits while the previous is scored
    batches: queue.Queue = queue.Queue(maxsize=cfg.pipeline.queue_size)
    steps = _Steps(start_step, cfg.trainer.steps)
    samplers = [
        _Sampler(parts, index, scheduler, channel, mixer_lock, window, steps, sampled, stop)
        for index in range(len(workers.rollouts))
    ]
    scorer = _ScorerThread(dataclasses.replace(parts, scorer=scoring), mixer_lock, store, store_lock,
                           sampled, batches, stop)
    for sampler in samplers:
        sampler.start()
    scorer.start()
    taken = 0
    try:
        for step in range(start_step, cfg.trainer.steps):
            began = time.perf_counter()
            depth = batches.qsize()
            item = _next_batch(batches, scorer, step)
            if isinstance(item, _Failure):
                raise item.error
            batch: ScoredBatch = item
            if batch.step != step:
                raise RuntimeError(f"async loop: the trainer expected batch {step}, the scorer thread sent {batch.step}")
            window.took(step)
            timings = {**batch.timings, "trainer_idle_s": time.perf_counter() - began}

            kept = [e for e in batch.episodes if e.keep]
            stale = [e.id for e in kept if step - e.completion.weight_version > bound]
            if stale:
                raise StalenessError(
                    f"step {step}: {len(stale)} sample(s) older than algorithm.max_staleness={bound}, e.g. {stale[0]}"
                )
            mark = time.perf_counter()
            train_metrics: dict[str, float] = {}
            if kept:
                replay = parts.domains.replay_batch(parts.pad_id) if parts.domains is not None else None
                train_metrics = parts.trainer.rl_step(collate(kept, parts.pad_id, parts.trainer.device), replay=replay)
                with store_lock:
                    store.mark_trained([e.id for e in kept], step)
            timings["train_s"] = time.perf_counter() - mark
            mark = time.perf_counter()
            channel.publish(publish(parts.trainer.model, step + 1, canary))
            parts.engine.update_weights(None, version=step + 1)  # the trainer-shared engine (evaluation)
            timings["publish_s"] = time.perf_counter() - mark
            timings["step_s"] = time.perf_counter() - began

            metrics = {"step": step + 1, "phase": "rl", **step_metrics(batch.episodes, batch.drops), **train_metrics, **timings}
            metrics["tokens_per_s"] = metrics["completion_tokens"] / max(timings["generate_s"], 1e-9)
            metrics["trained_samples"] = len(kept)
            metrics["queue_depth"] = depth
            metrics["rollout_worker"] = batch.worker
            if controller is not None:
                why = controller.update(timings["trainer_idle_s"], timings["step_s"], timings["sampler_idle_s"],
                                        timings["generate_s"], buffer_full=depth >= cfg.pipeline.queue_size)
                if why is not None:
                    logger.info("ratio control: step %d: %d -> %d batches in flight ahead of the trainer: %s",
                                step + 1, window.limit, controller.limit, why)
                    window.set_limit(controller.limit)
                metrics["ratio/in_flight"] = controller.limit
            metrics.update(staleness_metrics(kept, step))
            metrics.update({f"restarts/{kind}": n for kind, n in workers.restarts().items()})
            metrics.update(scheduler.metrics())
            metrics.update(scoring.metrics())
            metrics.update(batch.watch_metrics)
            metrics.update(batch.domains_metrics)
            parts.run.append_metrics(metrics)
            taken += 1

            if (step + 1) % cfg.trainer.checkpoint_every == 0 or step + 1 == cfg.trainer.steps:
                save_rl_checkpoint(parts, step + 1, batch.mixer_state, batch.watch_state, batch.domains_state)
            if on_step:
                on_step(step + 1, metrics)
    finally:
        stop.set()
        for sampler in samplers:
            sampler.join()
        scorer.join()
        scheduler.close()
        parts.scheduler = None
        workers.close()
    return taken
