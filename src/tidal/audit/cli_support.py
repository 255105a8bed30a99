"""`tidal audit`: run the audit, write the requested outputs, and summarise on the terminal."""

from __future__ import annotations

from pathlib import Path

from tidal.audit.runner import AuditResult, audit_tasks
from tidal.config.schema import AuditConfig


def run_audit_command(
    paths: list[str], *, policy: str | None, json_out: Path | None, html_out: Path | None, quarantine_out: Path | None,
    jobs: int, checks: list[str] | None, cheap: bool, reference_runs: int | None, backend: str,
) -> tuple[AuditResult, list[str]]:
    """The audit's result and the lines to print (summary, then each non-ok task)."""
    config = AuditConfig() if reference_runs is None else AuditConfig(reference_runs=reference_runs)
    sampler = None
    if policy is not None:
        from tidal.audit.difficulty import load_policy

        sampler = load_policy(policy)
    result = audit_tasks(paths, config, checks=checks, cheap_only=cheap, jobs=jobs, backend=backend, policy=sampler)
    from tidal.audit.report import write_html, write_json, write_quarantine_file

    if json_out:
        write_json(result, json_out)
    if html_out:
        write_html(result, html_out)
    if quarantine_out:
        write_quarantine_file(result, quarantine_out)
    summary = result.summary
    verdicts = summary["verdicts"]
    lines = [(f"{summary['tasks']} tasks: {verdicts['ok']} ok, {verdicts['warn']} warn, "
             f"{verdicts['quarantine']} quarantine ({summary['seconds']:.1f} s, {summary['tasks_per_minute']} tasks/min)")]
    for audit in result.audits:
        if audit.verdict == "ok":
            continue
        lines.append(f"{audit.verdict:<10} {audit.task_id}  ({audit.where})")
        lines += [f"    {f.severity:<10} {f.check}: {f.message}" for f in audit.findings if f.severity != "info"]
    for label, path in (("json", json_out), ("html", html_out), ("quarantine", quarantine_out)):
        if path:
            lines.append(f"{label}: {path}")
    return result, lines
