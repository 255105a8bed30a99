"""The asynchronous RL loop: generation, scoring and training overlap, with bounded staleness.

    sampler thread:  wait for admission -> draw tasks -> sample ----------------------> queue (1)
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

The sampler samples from its own copy of the policy (the trainer's model is the one the caller's
engine shares): the trainer publishes a snapshot of its weights after each update to a
`WeightChannel`, and the sampler applies the newest one *between* batches, on its own thread, so
it never generates while the weights change and the trainer never waits for it.

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
import queue
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch

from tidal.pipeline.loop import (
    LoopParts,
    StepCallback,
    sample_episodes,
    save_rl_checkpoint,
    score_and_gate,
    step_metrics,
)
from tidal.rollout.engine import EmbeddedEngine
from tidal.storage.store import TrajectoryStore, open_run_store
from tidal.trainer.logprobs import collate
from tidal.types import Episode, Task

POLL_S = 0.2  # how often a waiting thread looks at the stop flag


class StalenessError(RuntimeError):
    """A sample older than `algorithm.max_staleness` reached the trainer (a bug in admission control)."""


class WeightChannel:
    """The newest published weights, handed from the trainer thread to the sampler thread.

    `publish` (trainer) replaces the pending snapshot and returns at once; `apply` (sampler thread,
    between batches) loads the newest pending snapshot into its engine. Versions skipped in between
    are never loaded, which is fine: only the newest matters.
    """

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._pending: tuple[dict[str, torch.Tensor], int] | None = None

    def publish(self, model: torch.nn.Module, version: int) -> None:
        """Snapshot `model`'s weights as `version` (a copy: the trainer keeps updating its own)."""
        state = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
        with self._changed:
            self._pending = (state, version)
            self._changed.notify_all()

    def apply(self, engine: EmbeddedEngine) -> None:
        """Load the newest pending weights into `engine`, if any. Call only from the thread that
        generates with `engine`, between generations."""
        with self._changed:
            pending, self._pending = self._pending, None
        if pending is not None:
            engine.update_weights(pending[0], version=pending[1])

    def wait(self, timeout: float) -> None:
        """Block until something is published or `timeout` seconds pass."""
        with self._changed:
            if self._pending is None:
                self._changed.wait(timeout)


@dataclass
class SampledBatch:
    """One step's generated, not yet scored, episodes, as the sampler hands them to the scorer."""

    step: int
    tasks_by_id: dict[str, Task]
    episodes: list[Episode]
    timings: dict[str, float]  # generate_s, sampler_idle_s
    mixer_state: dict[str, Any]  # the mixer right after drawing this batch's tasks


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


class _Sampler(threading.Thread):
    """Generates `SampledBatch`es for steps [start, end) in order, within the staleness bound."""

    def __init__(
        self, parts: LoopParts, engine: EmbeddedEngine, channel: WeightChannel, mixer_lock: threading.Lock,
        out: queue.Queue, stop: threading.Event, start: int, end: int,
    ) -> None:
        super().__init__(name="tidal-sampler", daemon=True)
        # The loop's parts with the rollout engine in place of the trainer-shared one.
        self.parts = dataclasses.replace(parts, engine=engine)
        self.channel, self.mixer_lock, self.out, self.stop = channel, mixer_lock, out, stop
        self.first, self.end = start, end

    def run(self) -> None:
        try:
            waited = 0.0  # for room in the queue; counted in the next batch (this one is no longer ours)
            for step in range(self.first, self.end):
                batch = self._sample(step)
                if batch is None:
                    return
                batch.timings["sampler_idle_s"] += waited
                waited = _put(self.out, batch, self.stop)
                if waited is None:
                    return
        except BaseException as error:  # noqa: BLE001 - passed on through the scorer to the trainer
            _put(self.out, _Failure(error), self.stop)

    def _admit(self, step: int) -> bool:
        """Wait until the engine's weights are recent enough to generate batch `step`."""
        bound = self.parts.config.algorithm.max_staleness
        engine = self.parts.engine
        while not self.stop.is_set():
            self.channel.apply(engine)
            if step - engine.weight_version <= bound:
                return True
            self.channel.wait(POLL_S)
        return False

    def _sample(self, step: int) -> SampledBatch | None:
        parts, cfg = self.parts, self.parts.config
        mark = time.perf_counter()
        if not self._admit(step):
            return None
        timings = {"sampler_idle_s": time.perf_counter() - mark}
        with self.mixer_lock:
            tasks = parts.mixer.sample(parts.domains.tasks_to_draw() if parts.domains else cfg.tasks.tasks_per_step, step)
            mixer_state = copy.deepcopy(parts.mixer.state_dict())
        mark = time.perf_counter()
        episodes = sample_episodes(parts, tasks, step)
        timings["generate_s"] = time.perf_counter() - mark
        return SampledBatch(step, {task.id: task for task in tasks}, episodes, timings, mixer_state)


class _ScorerThread(threading.Thread):
    """Scores, gates and stores the sampler's batches in order and queues them for the trainer."""

    def __init__(
        self, parts: LoopParts, mixer_lock: threading.Lock, store: TrajectoryStore, store_lock: threading.Lock,
        sampled: queue.Queue, out: queue.Queue, stop: threading.Event,
    ) -> None:
        super().__init__(name="tidal-scorer", daemon=True)
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
        )


def rollout_engine(parts: LoopParts) -> EmbeddedEngine:
    """A second engine on a frozen copy of the trainer's model, at the trainer's weight version."""
    model = copy.deepcopy(parts.engine.model).eval().requires_grad_(False)
    engine = EmbeddedEngine(model, parts.engine.tokenizer, parts.engine.device, parts.engine.max_batch_rows)
    engine.weight_version = parts.engine.weight_version
    return engine


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
    """Train from `start_step` to `trainer.steps`, sampling and scoring in two background threads.
    Returns the number of steps taken now. Same run-folder artefacts as `run_rl`, plus the async
    metrics."""
    cfg = parts.config
    bound = cfg.algorithm.max_staleness
    store = open_run_store(parts.run, cfg.run.trajectory_store)  # an unwritable URL fails here, at once
    store.rollback(start_step)  # what the steps after the resumed checkpoint trained died with them
    store_lock = threading.Lock()
    mixer_lock = threading.Lock()
    if parts.domains is not None:
        parts.domains.lock = mixer_lock  # the mixer reads the curricula the scorer thread updates
    stop = threading.Event()
    sampled: queue.Queue = queue.Queue(maxsize=1)  # one generated batch waits while the previous is scored
    batches: queue.Queue = queue.Queue(maxsize=cfg.pipeline.queue_size)
    channel = WeightChannel()
    sampler = _Sampler(parts, rollout_engine(parts), channel, mixer_lock, sampled, stop, start_step, cfg.trainer.steps)
    scorer = _ScorerThread(parts, mixer_lock, store, store_lock, sampled, batches, stop)
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
            channel.publish(parts.trainer.model, version=step + 1)
            parts.engine.update_weights(None, version=step + 1)  # the trainer-shared engine (evaluation)
            timings["train_s"] = time.perf_counter() - mark
            timings["step_s"] = time.perf_counter() - began

            metrics = {"step": step + 1, "phase": "rl", **step_metrics(batch.episodes, batch.drops), **train_metrics, **timings}
            metrics["tokens_per_s"] = metrics["completion_tokens"] / max(timings["generate_s"], 1e-9)
            metrics["trained_samples"] = len(kept)
            metrics["queue_depth"] = depth
            metrics.update(staleness_metrics(kept, step))
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
        sampler.join()
        scorer.join()
    return taken
