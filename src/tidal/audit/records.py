"""The records an audit produces: a `Finding` per problem, a `TaskAudit` per task, and the
summary of a whole audit.

A finding's `severity` decides the task's verdict: any `quarantine` finding quarantines the task,
else any `warn` makes it `warn`, else it is `ok` (`info` findings are reported, never acted on).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

Severity = Literal["info", "warn", "quarantine"]
Verdict = Literal["ok", "warn", "quarantine"]
SEVERITY_RANK: dict[str, int] = {"info": 0, "warn": 1, "quarantine": 2}


@dataclass
class Finding:
    """One problem one check found on one task. `evidence` is what a reader needs to verify it:
    the probe's answer and score, the mutant's diff, the leaked text, the duplicate's id."""

    check: str
    severity: Severity
    message: str
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"check": self.check, "severity": self.severity, "message": self.message, "evidence": self.evidence}


@dataclass
class TaskAudit:
    """Everything the audit found about one task (or one unreadable task record)."""

    task_id: str
    where: str  # FILE:LINE of the record
    split: str | None = None
    domain: str | None = None
    findings: list[Finding] = field(default_factory=list)
    measurements: dict[str, Any] = field(default_factory=dict)  # e.g. kill_rate, difficulty_estimate
    seconds: dict[str, float] = field(default_factory=dict)  # time spent per check

    @property
    def verdict(self) -> Verdict:
        worst = max((SEVERITY_RANK[f.severity] for f in self.findings), default=0)
        return "quarantine" if worst == 2 else "warn" if worst == 1 else "ok"

    def flagged(self) -> set[str]:
        """The checks with a warn or quarantine finding."""
        return {f.check for f in self.findings if f.severity != "info"}

    def reasons(self) -> list[str]:
        """`check: message` of each quarantine finding."""
        return [f"{f.check}: {f.message}" for f in self.findings if f.severity == "quarantine"]

    def to_dict(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "where": self.where,
            "split": self.split,
            "domain": self.domain,
            "verdict": self.verdict,
            "findings": [f.to_dict() for f in self.findings],
            "measurements": self.measurements,
            "seconds": {k: round(v, 4) for k, v in self.seconds.items()},
        }


def summarise(audits: list[TaskAudit], seconds: float) -> dict[str, Any]:
    """Counts per verdict and per check (tasks flagged), and where the time went."""
    verdicts = Counter(a.verdict for a in audits)
    by_check: Counter[str] = Counter()
    for audit in audits:
        by_check.update(audit.flagged())
    time_per_check: Counter[str] = Counter()
    for audit in audits:
        time_per_check.update(audit.seconds)
    total_check_time = sum(time_per_check.values()) or 1.0
    return {
        "tasks": len(audits),
        "verdicts": {v: verdicts.get(v, 0) for v in ("ok", "warn", "quarantine")},
        "flagged_by_check": dict(sorted(by_check.items())),
        "seconds": round(seconds, 3),
        "tasks_per_minute": round(60 * len(audits) / seconds, 2) if seconds > 0 else None,
        "time_share_by_check": {k: round(v / total_check_time, 4) for k, v in sorted(time_per_check.items())},
    }
