"""The guard: runs the detectors on each step's metrics row and on each held-out evaluation, and
turns their findings into one `Verdict` of actions (the pipeline carries them out: a rollback,
a pause, a lower learning rate, a tighter staleness bound, quarantined tasks). Pure: it reads
numbers and returns decisions, and remembers what it decided so that a rollback cannot undo it.
"""

from __future__ import annotations

import json
import logging
import threading
import urllib.request
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from tidal.config.guard import GuardConfig
from tidal.guard.detectors import Finding, build_detectors

logger = logging.getLogger(__name__)


@dataclass
class TaskStat:
    """What one task's group did in a step's batch: the quarantine action picks tasks by it."""

    task_id: str
    domain: str
    reward: float  # the mean over its scored samples
    tampered: int


@dataclass
class Verdict:
    """What the findings of one step ask for, merged: the actions of every detector that fired."""

    step: int
    findings: list[Finding] = field(default_factory=list)
    actions: set[str] = field(default_factory=set)
    rollback_before: int | None = None  # roll back to the newest checkpoint at a step below this
    quarantine: list[str] = field(default_factory=list)

    @property
    def reason(self) -> str:
        return "; ".join(f"{f.detector}: {f.reason}" for f in self.findings)


class Webhook:
    """POSTs events as JSON, each on a thread of its own with a timeout, so a slow or dead
    endpoint costs the loop nothing; a failure is logged."""

    def __init__(self, url: str, timeout_s: float) -> None:
        self.url, self.timeout_s = url, timeout_s
        self.threads: list[threading.Thread] = []

    def post(self, event: dict[str, Any]) -> None:
        thread = threading.Thread(target=self._send, args=(event,), daemon=True, name="guard-webhook")
        thread.start()
        self.threads = [t for t in self.threads if t.is_alive()] + [thread]

    def _send(self, event: dict[str, Any]) -> None:
        request = urllib.request.Request(self.url, data=json.dumps(event).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s):
                pass
        except Exception as error:  # any failure of the endpoint: logged, the run goes on
            logger.warning("guard webhook %s failed: %s", self.url, error)

    def close(self) -> None:
        for thread in self.threads:
            thread.join(self.timeout_s)


class Guard:
    """The detectors of `cfg` and what their findings do. `quarantined` and `lr_scale` are the
    decisions taken so far, which the pipeline applies again after a rollback."""

    def __init__(self, cfg: GuardConfig, heldout_before: dict[str, float] | None = None) -> None:
        self.cfg = cfg
        self.detectors, self.heldout = build_detectors(cfg)
        if self.heldout is not None:
            self.heldout.best = {d: (0, r) for d, r in (heldout_before or {}).items()}
        self.quarantined: list[str] = []
        self.lr_scale = 1.0
        self.rollbacks = 0
        self.webhook = Webhook(cfg.webhook_url, cfg.webhook_timeout_s) if cfg.webhook_url else None

    def observe(self, step: int, row: dict[str, Any], tasks: list[TaskStat]) -> Verdict:
        """The verdict on the metrics row of step `step` (updates done) and its batch's tasks
        (which count a domain's tasks, `tasks/<domain>`, when the row does not)."""
        counts = Counter(t.domain for t in tasks)
        row = {**{f"tasks/{domain}": n for domain, n in counts.items()}, **row}
        findings = [f for detector in self.detectors for f in detector.observe(step, row)]
        return self._verdict(step, findings, tasks)

    def observe_heldout(self, step: int, rates: dict[str, float]) -> Verdict:
        """The verdict on a held-out evaluation after step `step`: pass rate per domain."""
        findings = self.heldout.observe(step, rates) if self.heldout is not None else []
        return self._verdict(step, findings, [])

    def forget_after(self, step: int) -> None:
        """The run was rolled back to step `step`: what the detectors saw after it did not happen."""
        for detector in self.detectors:
            detector.forget_after(step)
        if self.heldout is not None:
            self.heldout.forget_after(step)

    def _verdict(self, step: int, findings: list[Finding], tasks: list[TaskStat]) -> Verdict:
        verdict = Verdict(step, findings)
        detectors = self.cfg.detectors()
        for finding in findings:
            actions = set(detectors[finding.detector].actions)
            verdict.actions |= actions
            if "rollback" in actions:
                blamed = finding.blamed_step
                verdict.rollback_before = blamed if verdict.rollback_before is None else min(verdict.rollback_before, blamed)
            if "quarantine" in actions:
                verdict.quarantine += [t for t in self._culprits(finding, tasks) if t not in verdict.quarantine]
        if "rollback" in verdict.actions:
            if self.rollbacks >= self.cfg.max_rollbacks:
                verdict.actions = (verdict.actions - {"rollback"}) | {"pause"}
                verdict.rollback_before = None
                logger.error("guard: %d rollbacks already (guard.max_rollbacks); pausing instead", self.rollbacks)
            else:
                self.rollbacks += 1
        if "pause" in verdict.actions:  # a pause stops the run as it is: nothing to roll back
            verdict.actions.discard("rollback")
            verdict.rollback_before = None
        self.quarantined += [t for t in verdict.quarantine if t not in self.quarantined]
        if "lower_lr" in verdict.actions:
            self.lr_scale *= self.cfg.lr_factor
        for finding in findings:
            logger.warning("guard at step %d: %s: %s -> %s", step, finding.detector, finding.reason,
                           ", ".join(sorted(detectors[finding.detector].actions)))
        return verdict

    def _culprits(self, finding: Finding, tasks: list[TaskStat]) -> list[str]:
        """The tasks behind a finding: a domain's reward spike, the tasks of that domain whose
        reward is above the baseline by more than `min_delta`; a tamper rate, those with tampered
        samples. Other detectors blame no task."""
        cfg = self.cfg.detectors()[finding.detector]
        if finding.detector == "reward_spike" and finding.baseline is not None:
            return [t.task_id for t in tasks if t.domain == finding.domain and t.reward - finding.baseline > cfg.min_delta]
        if finding.detector == "tamper_rate":
            return [t.task_id for t in tasks if t.tampered > 0]
        return []

    def events(self, verdict: Verdict) -> list[dict[str, Any]]:
        """guard.jsonl rows of a verdict, one per finding; alerts go to the webhook."""
        detectors = self.cfg.detectors()
        rows = []
        for finding in verdict.findings:
            actions = sorted(detectors[finding.detector].actions)
            if finding.detector in ("reward_spike", "tamper_rate") and verdict.quarantine and "quarantine" in actions:
                row = {"event": "detected", **asdict(finding), "actions": actions, "tasks": verdict.quarantine}
            else:
                row = {"event": "detected", **asdict(finding), "actions": actions}
            if "pause" in verdict.actions and "pause" not in actions:
                row["actions"] = [*actions, "pause"]  # guard.max_rollbacks turned its rollback into a pause
            rows.append(row)
            if self.webhook is not None and "alert" in actions:
                self.webhook.post(row)
        return rows

    def close(self) -> None:
        if self.webhook is not None:
            self.webhook.close()
