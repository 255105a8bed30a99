"""Ratio control: how many batches may be in flight ahead of the trainer, moved by one from each
step's idle times, so rollout and training throughput stay matched (docs/design/loop.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


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
