"""Where the loop's scored batches come from: a `BatchSource`. `InlineSource` makes each one in
the trainer's thread with the trainer's own engine, when the loop asks for it (on-policy: the
loop with `max_staleness: 0` and nothing to publish but a version number); `AsyncSource`
(pipeline/async_source.py) makes them ahead of the trainer on threads and rollout workers.
Both run the same stages (pipeline/stages.py), so batch `b` is the same from either at bound 0.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, Protocol

from tidal.pipeline.scheduler import RetryingScorer, retry_policy
from tidal.pipeline.stages import (
    LoopParts,
    Sampler,
    ScoredBatch,
    gate_groups,
    gate_metrics,
    score_groups,
    store_groups,
)
from tidal.rollout.protocol import ReportsMetrics
from tidal.storage.store import TrajectoryStore


class BatchSource(Protocol):
    max_staleness: int  # the most updates a trained sample's weights may lag the trainer's

    def next_batch(self, step: int) -> ScoredBatch:
        """Batch `step`, scored, gated and already in the store (so a crash never loses a
        trajectory that was trained on)."""
        ...

    def publish(self, version: int) -> None:
        """The trainer's weights after `version` updates are what later batches sample with."""
        ...

    def report(self, step: int, metrics: dict[str, Any]) -> dict[str, Any]:
        """The source's own metrics for step `step`, given the step's metrics so far."""
        ...

    def hold(self, priority: int, name: str) -> contextlib.AbstractContextManager[None]:
        """While held, no new rollout work starts (the held-out evaluation takes the engine)."""
        ...

    def close(self) -> None:
        """Stop and join what the source started."""
        ...


class InlineSource:
    """Sample, score, gate and store batch `step` in the caller's thread, with `parts.engine`
    (the trainer's model: publishing only bumps its version)."""

    def __init__(self, parts: LoopParts, store: TrajectoryStore, store_lock: threading.Lock) -> None:
        self.parts, self.store, self.store_lock = parts, store, store_lock
        self.max_staleness = 0  # each batch is sampled with the weights of the update before it
        self.scoring = RetryingScorer(parts.scorer, retry_policy(parts.config.pipeline))  # infra errors are scored again
        self.sampler = Sampler(parts.config, parts.run.name, parts.engine)

    def next_batch(self, step: int) -> ScoredBatch:
        parts = self.parts
        began = time.perf_counter()
        groups = self.sampler.sample(parts.draw_tasks(step), step)
        timings = {"generate_s": time.perf_counter() - began}
        score_groups(self.scoring, parts.domains, groups, timings)
        drops = gate_groups(parts, groups, step)
        with self.store_lock:
            store_groups(self.store, step, groups, timings)
        return ScoredBatch(step, groups, drops, timings, gate_metrics(parts, step))

    def publish(self, version: int) -> None:
        self.parts.sync_engine(version)

    def report(self, step: int, metrics: dict[str, Any]) -> dict[str, Any]:
        engine = self.parts.engine
        return {**self.scoring.metrics(), **(engine.run_metrics() if isinstance(engine, ReportsMetrics) else {})}

    def hold(self, priority: int, name: str) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()  # nothing runs beside the caller

    def close(self) -> None:
        pass


def open_source(parts: LoopParts, store: TrajectoryStore, store_lock: threading.Lock, start_step: int) -> BatchSource:
    """`pipeline.mode: sync` -> `InlineSource`; `async` -> `AsyncSource` on `pipeline.backend`."""
    if parts.config.pipeline.mode == "sync":
        return InlineSource(parts, store, store_lock)
    from tidal.pipeline.async_source import AsyncSource

    return AsyncSource(parts, store, store_lock, start_step)
