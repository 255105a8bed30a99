"""`audit_tasks`: stream task records, run the selected checks on each, collect verdicts.

Records are read one at a time (source.py) and handed to `jobs` worker threads, with at most
`2 * jobs` tasks in flight, so memory stays bounded by the per-task results (findings and a small
duplicate signature), not by the task files. A worker runs one task's checks in order; scoring
inside a check waits on sandbox subprocesses, so threads are enough to keep `jobs` sandboxes busy.
A check that raises is a `warn` finding naming the check and the error (an audit bug or a task the
check cannot handle), never the end of the audit.
"""

from __future__ import annotations

import logging
import sys
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tidal.audit.checks import Check, select_checks
from tidal.audit.context import AuditContext, Policy
from tidal.audit.records import TaskAudit, summarise
from tidal.audit.schema_check import record_findings
from tidal.audit.source import Record, input_problems, stream_records
from tidal.config.schema import AuditConfig
from tidal.errors import AuditInputError
from tidal.reward.registry import known_verifiers
from tidal.types import Task

log = logging.getLogger(__name__)


@dataclass
class AuditResult:
    """The verdicts of one audit, in input order, and its summary."""

    audits: list[TaskAudit]
    summary: dict[str, Any]
    checks: list[str]
    sources: list[str] = field(default_factory=list)

    def quarantined(self) -> list[TaskAudit]:
        return [a for a in self.audits if a.verdict == "quarantine"]

    def by_id(self) -> dict[str, TaskAudit]:
        return {a.task_id: a for a in self.audits}

    def to_dict(self) -> dict[str, Any]:
        return {"summary": self.summary, "checks": self.checks, "sources": self.sources,
                "tasks": [a.to_dict() for a in self.audits]}


def run_checks(task: Task, audit: TaskAudit, checks: list[Check], ctx: AuditContext) -> TaskAudit:
    """Run `checks` on one task, adding findings, measurements and time per check to `audit`."""
    for check in checks:
        began = time.perf_counter()
        try:
            audit.findings += check.function(task, ctx, audit.measurements)
        except Exception as error:  # noqa: BLE001 - one broken check must not end the audit of every task
            from tidal.audit.records import Finding

            log.warning("audit check %s failed on task %s: %s", check.name, task.id, error)
            audit.findings.append(Finding(check.name, "warn", f"the check could not run: {type(error).__name__}: {error}",
                                          {"traceback": traceback.format_exc()[-3000:]}))
        audit.seconds[check.name] = audit.seconds.get(check.name, 0.0) + time.perf_counter() - began
    return audit


def audit_tasks(
    paths: Iterable[str | Path],
    config: AuditConfig | None = None,
    *,
    checks: list[str] | None = None,
    cheap_only: bool = False,
    jobs: int = 1,
    backend: str = "bwrap",
    policy: Policy | None = None,
    progress: bool | None = None,
    on_audit: Callable[[TaskAudit], None] | None = None,
) -> AuditResult:
    """Audit every task record under `paths`. `checks` names the checks to run (default all;
    `difficulty` only with a `policy`); `progress` shows a bar (default: when stderr is a TTY).
    Raises `AuditInputError` when the input holds nothing to audit (a missing or unreadable path, a
    folder with no task file or task folder, files with no record) and `SandboxUnavailableError`
    up front when a scoring check needs a sandbox that cannot run."""
    paths = [str(p) for p in paths]
    problems = input_problems(paths) if paths else ["no task files or folders given"]
    if problems:
        raise AuditInputError(problems)
    chosen = select_checks(checks, cheap_only)
    if policy is None:
        chosen = [c for c in chosen if c.cost != "policy"]
    ctx = AuditContext(config or AuditConfig(), backend=backend, policy=policy)
    if any(c.cost == "scoring" for c in chosen):
        ctx.check_sandbox()
    ordered = [c for c in chosen if c.ordered]
    parallel = [c for c in chosen if not c.ordered]
    verifiers = known_verifiers()
    audits: list[TaskAudit] = []
    began = time.perf_counter()
    show = sys.stderr.isatty() if progress is None else progress

    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    bar = Progress(TextColumn("[bold]audit"), BarColumn(bar_width=24), MofNCompleteColumn(), TimeElapsedColumn(),
                   TextColumn("{task.fields[status]}"), disable=not show, transient=False)
    with bar, ThreadPoolExecutor(max_workers=max(1, jobs), thread_name_prefix="tidal-audit") as pool:
        progress_id = bar.add_task("audit", total=None, status="")
        pending: deque[tuple[TaskAudit, Future[TaskAudit] | None]] = deque()

        def finish(limit: int) -> None:
            while len(pending) > limit:
                audit, future = pending.popleft()
                if future is not None:
                    future.result()
                ctx.forget(audit.task_id)
                audits.append(audit)
                if on_audit:
                    on_audit(audit)
                quarantined = sum(a.verdict == "quarantine" for a in audits)
                bar.update(progress_id, completed=len(audits), status=f"{quarantined} quarantined")

        for record in stream_records(paths, verifiers):
            audit = _start(record)
            future = None
            if record.task is not None:
                run_checks(record.task, audit, ordered, ctx)
                future = pool.submit(run_checks, record.task, audit, parallel, ctx)
            pending.append((audit, future))
            finish(2 * max(1, jobs))
        finish(0)
    if not audits:
        raise AuditInputError([f"{', '.join(paths)}: no task records (the files are empty)"])
    names = [c.name for c in chosen]
    return AuditResult(audits, summarise(audits, time.perf_counter() - began), names, paths)


def _start(record: Record) -> TaskAudit:
    task = record.task
    audit = TaskAudit(record.task_id, record.where, task.split if task else None, task.domain if task else None)
    if task is None:
        audit.findings += record_findings(record.problems)
    return audit
