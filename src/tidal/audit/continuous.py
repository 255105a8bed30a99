"""Continuous audit during RL: `TaskWatch` reads each step's gated episodes per task and
quarantines a task on the fly when its signals cross a threshold (config `audit.watch`):

- **tamper rate**: the share of its samples the gate dropped as `tampered` reaches
  `max_tamper_rate`: the policy found a way at the harness;
- **short all-pass groups**: groups in which every sample passed with a very short answer (at
  most `short_answer_chars` and under half the reference answer's length, so tasks whose right
  answer is short never count) reach `max_short_pass_groups`: a trivial answer is rewarded;
- **reward vs held-out gap**: mean train reward minus the domain's latest held-out pass rate
  (`set_heldout`) exceeds `max_heldout_gap`: reward that does not transfer.

The rate and gap signals wait for `min_samples` samples. A quarantined task stays quarantined for
the run; the mixer skips it (its state keeps the list, so a resume does too). `metrics()` gives
the counts; every decision is logged with its numbers (docs/design/audit.md, "Continuous mode").
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from tidal.config.schema import WatchConfig
from tidal.types import Episode, Group, Outcome, Task

log = logging.getLogger(__name__)


@dataclass
class TaskSignals:
    """What the watch has seen of one task."""

    samples: int = 0
    tampered: int = 0
    scored: int = 0  # samples with a valid reward (not infra_error or tampered)
    reward_sum: float = 0.0
    short_pass_groups: int = 0

    @property
    def mean_reward(self) -> float:
        return self.reward_sum / self.scored if self.scored else 0.0


@dataclass
class Quarantine:
    """One on-the-fly decision."""

    task_id: str
    reason: str
    step: int


@dataclass
class TaskWatch:
    config: WatchConfig = field(default_factory=WatchConfig)
    signals: dict[str, TaskSignals] = field(default_factory=lambda: defaultdict(TaskSignals))
    quarantined: dict[str, Quarantine] = field(default_factory=dict)
    heldout: dict[str, float] = field(default_factory=dict)  # domain -> latest held-out pass rate

    def set_heldout(self, pass_rates: dict[str, float | None]) -> None:
        """The latest held-out pass rate per domain (from an evaluation)."""
        # A new dict swapped in whole: the async loop's sampler thread reads it while this runs.
        self.heldout = {**self.heldout, **{d: r for d, r in pass_rates.items() if r is not None}}

    def observe(self, groups: list[Group], step: int) -> list[Quarantine]:
        """Take in one step's gated groups; return the tasks quarantined now."""
        if not self.config.enabled:
            return []
        for group in groups:
            for episode in group.episodes:
                signals = self.signals[episode.task_id]
                signals.samples += 1
                score = episode.score
                if episode.drop_reason == "tampered" or (score is not None and score.outcome is Outcome.TAMPERED):
                    signals.tampered += 1
                elif score is not None and score.outcome is not Outcome.INFRA_ERROR:
                    signals.scored += 1
                    signals.reward_sum += score.value
            if self._short_all_pass(group.episodes, group.task):
                self.signals[group.task.id].short_pass_groups += 1
        tasks = {group.task.id: group.task for group in groups}
        new = []
        for task_id in tasks:
            if task_id in self.quarantined:
                continue
            reason = self._reason(task_id, tasks.get(task_id))
            if reason:
                decision = Quarantine(task_id, reason, step)
                self.quarantined[task_id] = decision
                new.append(decision)
                log.warning("continuous audit: task %s quarantined at step %d: %s", task_id, step, reason)
        return new

    def _short_all_pass(self, members: list[Episode], task: Task) -> bool:
        if any(e.score is None or e.score.outcome is not Outcome.PASSED for e in members):
            return False
        limit = self.config.short_answer_chars
        reference = len(task.reference.strip()) if task.reference else None
        return all(len(e.completion.text.strip()) <= limit and (reference is None or
                   len(e.completion.text.strip()) < reference / 2) for e in members)

    def _reason(self, task_id: str, task: Task | None) -> str:
        cfg, signals = self.config, self.signals[task_id]
        if signals.samples >= cfg.min_samples and signals.tampered / signals.samples >= cfg.max_tamper_rate:
            return f"tamper rate {signals.tampered}/{signals.samples} >= {cfg.max_tamper_rate:g}"
        if signals.short_pass_groups >= cfg.max_short_pass_groups:
            return f"{signals.short_pass_groups} groups passed entirely with very short answers"
        heldout = self.heldout.get(task.domain) if task is not None else None
        if heldout is not None and signals.scored >= cfg.min_samples and signals.mean_reward - heldout > cfg.max_heldout_gap:
            return (f"train reward {signals.mean_reward:.2f} exceeds the held-out pass rate of {task.domain} "  # type: ignore[union-attr]
                    f"({heldout:.2f}) by more than {cfg.max_heldout_gap:g}")
        return ""

    def state_dict(self) -> dict[str, Any]:
        """Everything the watch has counted, for the run's checkpoint (JSON-safe)."""
        return {
            "signals": {task: vars(signals).copy() for task, signals in self.signals.items()},
            "quarantined": {task: vars(q).copy() for task, q in self.quarantined.items()},
            "heldout": dict(self.heldout),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue counting where a checkpoint stopped (a resumed run keeps its evidence)."""
        self.signals = defaultdict(TaskSignals, {t: TaskSignals(**v) for t, v in state.get("signals", {}).items()})
        self.quarantined = {t: Quarantine(**v) for t, v in state.get("quarantined", {}).items()}
        self.heldout = dict(state.get("heldout", {}))

    def metrics(self) -> dict[str, Any]:
        """For the run's metrics: tasks quarantined so far, and the highest tamper rate seen (none
        when the watch is off)."""
        if not self.config.enabled:
            return {}
        rates = [s.tampered / s.samples for s in self.signals.values() if s.samples]
        return {"audit/quarantined": len(self.quarantined), "audit/max_tamper_rate": max(rates, default=0.0)}
