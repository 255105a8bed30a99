"""The stability guard and the fault injector as step hooks (guard/, docs/design/guard.md): the
guard's verdict on each step becomes a rollback or pause request to the loop, a quarantine in the
mixer, a lower learning rate or a tighter staleness bound; every event goes to guard.jsonl and,
as a `guard` row, to metrics.jsonl (and so to the telemetry sinks).

What the guard decided outlives a rollback: after the loop restored a checkpoint, `after_restore`
excludes the quarantined tasks from the restored mixer again and sets the learning rate it chose,
and the detectors forget what they saw of the rolled-back steps.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

from tidal.guard import Guard, InjectedScorer, Injector, TaskStat, Verdict
from tidal.pipeline.loop import Pause, Rollback, StepContext
from tidal.pipeline.stages import LoopParts, ScoredBatch
from tidal.storage.run import RunFolder, read_jsonl
from tidal.storage.store import existing_run_store
from tidal.trainer.checkpoint import list_checkpoints
from tidal.types import Outcome

logger = logging.getLogger(__name__)
GUARD_LOG = "guard.jsonl"


def task_stats(batch: ScoredBatch | None) -> list[TaskStat]:
    """Per task of the batch: its domain (the config domain, as the mixer keys it), mean reward
    over its scored samples, and tampered samples."""
    stats = []
    for group in batch.groups if batch is not None else []:
        scored = [e.score.value for e in group.episodes if e.score is not None and e.score.outcome is not Outcome.INFRA_ERROR]
        tampered = sum(e.score is not None and e.score.outcome is Outcome.TAMPERED for e in group.episodes)
        stats.append(TaskStat(group.task.id, group.episodes[0].domain if group.episodes else group.task.domain,
                              sum(scored) / len(scored) if scored else 0.0, tampered))
    return stats


def set_lr_scale(trainer: Any, lr: float, scale: float) -> None:
    """The trainer's peak learning rate becomes `lr * scale`, the schedule kept (LambdaLR: the
    rate is base * lambda(epoch)); it is in the scheduler's state, so checkpoints keep it."""
    scheduler = getattr(trainer, "scheduler", None)
    if scheduler is None:
        logger.error("guard: lower_lr: this trainer has no scheduler to lower")
        return
    scheduler.base_lrs = [lr * scale for _ in scheduler.base_lrs]
    for group, base, factor in zip(trainer.optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas):
        group["lr"] = base * factor(scheduler.last_epoch)


class GuardHook:
    """Runs the guard after every step (and on every held-out evaluation) and carries out its
    verdict; with `injector`, injects its faults around the steps."""

    def __init__(self, guard: Guard, run: RunFolder, injector: Injector | None = None) -> None:
        self.guard, self.run, self.injector = guard, run, injector
        self.heldout_seen: dict[str, float] | None = None

    # -- the loop's calls -------------------------------------------------------------------------

    def before_step(self, parts: LoopParts, step: int) -> None:
        if self.injector is not None:
            self.injector.before_step(step, parts.trainer)

    def after_step(self, context: StepContext) -> Rollback | Pause | None:
        parts, step = context.parts, context.step
        if self.injector is not None:
            self.injector.after_step(step - 1, parts.trainer)
        verdict = self.guard.observe(step, context.metrics, task_stats(context.batch))
        heldout = parts.watch.heldout
        if heldout and heldout is not self.heldout_seen:  # HeldoutHook evaluated after this step
            self.heldout_seen = heldout
            more = self.guard.observe_heldout(step, dict(heldout))
            verdict = merge(verdict, more)
        return self.act(parts, verdict) if verdict.findings else None

    def after_restore(self, parts: LoopParts, step: int) -> None:
        self.guard.forget_after(step)
        for task_id in self.guard.quarantined:
            parts.mixer.exclude(task_id)
        if self.guard.lr_scale != 1.0:
            set_lr_scale(parts.trainer, parts.config.trainer.lr, self.guard.lr_scale)
        self.record({"event": "restored", "step": step, "quarantined": list(self.guard.quarantined),
                     "lr_scale": self.guard.lr_scale})

    # -- the verdict's actions --------------------------------------------------------------------

    def act(self, parts: LoopParts, verdict: Verdict) -> Rollback | Pause | None:
        step = verdict.step
        for row in self.guard.events(verdict):
            self.record({"step": step, **row})
        counts = Counter(f.detector for f in verdict.findings)
        parts.run.append_metrics({"phase": "guard", "step": step, "guard/events": len(verdict.findings),
                                  **{f"guard/{name}": n for name, n in counts.items()}})
        for task_id in verdict.quarantine:
            parts.mixer.exclude(task_id)
        if verdict.quarantine:
            self.record({"event": "quarantine", "step": step, "tasks": verdict.quarantine})
        if "lower_lr" in verdict.actions:
            set_lr_scale(parts.trainer, parts.config.trainer.lr, self.guard.lr_scale)
            self.record({"event": "lower_lr", "step": step, "lr_scale": self.guard.lr_scale,
                         "lr": parts.config.trainer.lr * self.guard.lr_scale})
        if "tighten_staleness" in verdict.actions:
            bound = parts.config.algorithm.max_staleness
            parts.config.algorithm.max_staleness = max(bound - 1, 0)  # read by the next batch source the loop opens
            self.record({"event": "tighten_staleness", "step": step, "max_staleness": parts.config.algorithm.max_staleness})
        if "pause" in verdict.actions:
            self.record({"event": "pause", "step": step, "reason": verdict.reason})
            return Pause(f"guard: {verdict.reason}")
        if verdict.rollback_before is not None:
            return self.roll_back(parts, verdict)
        return None

    def roll_back(self, parts: LoopParts, verdict: Verdict) -> Rollback | Pause:
        """A rollback to the newest checkpoint before the blamed step; a pause when none is left."""
        blamed = verdict.rollback_before
        assert blamed is not None
        steps = [int(p.name.removeprefix("step-")) for p in list_checkpoints(parts.run.checkpoints_dir / "rl")]
        good = [s for s in steps if s < blamed]
        if not good:
            reason = f"no RL checkpoint before step {blamed} is left (have {steps}); raise guard.keep_checkpoints"
            self.record({"event": "pause", "step": verdict.step, "reason": reason})
            return Pause(f"guard: {verdict.reason}; {reason}")
        to_step = max(good)
        store = existing_run_store(parts.run)
        voided = sum(s >= to_step for s in store.trained().values()) if store is not None else 0
        self.record({"event": "rollback", "step": verdict.step, "to_step": to_step, "blamed_step": blamed,
                     "voided_trajectories": voided, "reason": verdict.reason})
        return Rollback(f"guard: {verdict.reason}", to_step=to_step)

    def record(self, row: dict[str, Any]) -> None:
        self.run.append_jsonl(GUARD_LOG, row)

    def close(self) -> None:
        self.guard.close()


def merge(first: Verdict, second: Verdict) -> Verdict:
    """One verdict of two at the same step (the row's and the held-out evaluation's)."""
    before = [b for b in (first.rollback_before, second.rollback_before) if b is not None]
    return Verdict(first.step, first.findings + second.findings, first.actions | second.actions,
                   min(before) if before else None, first.quarantine + [t for t in second.quarantine if t not in first.quarantine])


def build_guard_hook(parts: LoopParts, heldout_before: dict[str, float]) -> GuardHook | None:
    """The guard hook of the run's config (None when the guard is off and nothing is injected);
    with `debug.inject`, the scorer is wrapped and the trainer's loss armed for the injector."""
    cfg = parts.config
    inject = cfg.debug.inject
    if not cfg.guard.enabled and not inject.any():
        return None
    guard = Guard(cfg.guard, heldout_before)
    if not cfg.guard.enabled:  # injection alone: faults, nothing watching them
        guard.detectors, guard.heldout = [], None
    run = parts.run
    injector = None
    if inject.any():
        path = run.path / GUARD_LOG
        fired = {row["fault"] for row in read_jsonl(path) if row.get("event") == "injected"} if path.exists() else set()
        injector = Injector(inject, fired, lambda fault, step: run.append_jsonl(GUARD_LOG, {"event": "injected", "fault": fault,
                                                                                           "step": step}))
        injector.poison(parts.mixer.tasks)
        parts.scorer = InjectedScorer(parts.scorer, injector)
        trainer = parts.trainer
        trainer.loss_fn = injector.wrap_loss(trainer.loss_fn)  # type: ignore[union-attr]
    return GuardHook(guard, run, injector)
