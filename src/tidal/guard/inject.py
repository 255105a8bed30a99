"""Fault injection (`debug.inject`), for the guard's tests and its demo: a learning-rate spike, a
NaN loss and a failing sandbox at given steps, each once per run (a rolled-back step redone does
not see it again: a transient fault), and a reward hack, a family of tasks whose verifier passes
any answer from a step on, which stays until those tasks are quarantined (a persistent exploit).

"Step k" is the update with 0-based index k: the one whose metrics row has `step` k + 1. The
pipeline calls `before_step(k)` before that step's batch is made and `after_step(k)` after its
update; `InjectedScorer` wraps the run's scorer.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

from tidal.config.guard import InjectConfig
from tidal.types import Outcome, Score, Task

logger = logging.getLogger(__name__)


class Injector:
    """The faults of `cfg`; `fired` names those already injected in this run (read back from
    guard.jsonl on a resume). `on_fire(fault, step)` records each one as it fires."""

    def __init__(self, cfg: InjectConfig, fired: set[str], on_fire: Callable[[str, int], None]) -> None:
        self.cfg, self.fired, self.on_fire = cfg, set(fired), on_fire
        self.step = -1  # the step being made
        self.poisoned: frozenset[str] = frozenset()
        self.nan_armed = False
        self.failing_left = 0  # steps the sandbox still fails, this one included (redone steps count too)
        self._spiked = False

    def poison(self, tasks_by_domain: dict[str, list[Task]]) -> None:
        """Choose the reward hack's tasks: the first `tasks` train tasks of its domain, by id."""
        hack = self.cfg.reward_hack
        if hack is not None:
            ids = sorted(t.id for t in tasks_by_domain.get(hack.domain, []))
            self.poisoned = frozenset(ids[: hack.tasks])
            logger.warning("debug.inject: reward hack on %s from step %d", sorted(self.poisoned), hack.step)

    def wrap_loss(self, loss_fn: Callable[..., Any]) -> Callable[..., Any]:
        """`loss_fn` with a NaN loss while armed (the trainer's policy loss)."""
        def loss(*args: Any, **kwargs: Any) -> Any:
            value, metrics = loss_fn(*args, **kwargs)
            return (value * math.nan, metrics) if self.nan_armed else (value, metrics)
        return loss

    def _fire(self, fault: str, step: int) -> bool:
        if fault in self.fired:
            return False
        self.fired.add(fault)
        logger.warning("debug.inject: %s at step %d", fault, step)
        self.on_fire(fault, step)
        return True

    def before_step(self, step: int, trainer: Any) -> None:
        cfg, self.step = self.cfg, step
        if cfg.lr_spike is not None and step == cfg.lr_spike.step and self._fire("lr_spike", step):
            for group in trainer.optimizer.param_groups:
                group["lr"] *= cfg.lr_spike.factor
            self._spiked = True
        if cfg.loss_nan is not None and step == cfg.loss_nan.step and self._fire("loss_nan", step):
            self.nan_armed = True
        if cfg.sandbox_failure is not None and step == cfg.sandbox_failure.step and self._fire("sandbox_failure", step):
            self.failing_left = cfg.sandbox_failure.steps

    def after_step(self, step: int, trainer: Any) -> None:
        self.nan_armed = False
        self.failing_left = max(self.failing_left - 1, 0)
        if self._spiked:  # the schedule's own rate again (LambdaLR: base * lambda(epoch))
            scheduler = trainer.scheduler
            for group, base, factor in zip(trainer.optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas):
                group["lr"] = base * factor(scheduler.last_epoch)
            self._spiked = False

    def score(self, task: Task) -> Score | None:
        """The injected score of an answer to `task` now, or None (score it for real)."""
        if self.failing_left > 0:
            return Score(0.0, Outcome.INFRA_ERROR, detail="debug.inject: sandbox failure")
        hack = self.cfg.reward_hack
        if hack is not None and self.step >= hack.step and task.id in self.poisoned:
            return Score(1.0, Outcome.PASSED, detail="debug.inject: reward hack (any answer passes)")
        return None


class InjectedScorer:
    """A scoring worker whose answers the injector may score first (a failing sandbox, a gamed
    verifier); the others go to `scorer`."""

    def __init__(self, scorer: Any, injector: Injector) -> None:
        self.scorer, self.injector = scorer, injector

    def score_many(self, items: list[tuple[Task, str | bytes]]) -> list[Score]:
        injected = [self.injector.score(task) for task, _ in items]
        real = [item for item, score in zip(items, injected) if score is None]
        scores = iter(self.scorer.score_many(real) if real else [])
        return [score if score is not None else next(scores) for score in injected]

    def __getattr__(self, name: str) -> Any:  # the rest of the scorer's interface (score, metrics, ...)
        return getattr(self.scorer, name)
