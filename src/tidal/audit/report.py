"""The audit's outputs: JSON (everything), a self-contained HTML report, the quarantine file.

The HTML report has the summary, then one section per check listing its findings (task, severity,
message), each linking to an anchor with the finding's evidence, and a table of every task's
verdict. Like the run report (eval/report.py) it is one file with inline CSS, no scripts (a
Content-Security-Policy forbids them), and every piece of text from the tasks is escaped: task
files and probe answers are hostile input.
"""

from __future__ import annotations

import html
import json
import os
from pathlib import Path
from typing import Any

from tidal.audit.checks import CHECKS
from tidal.audit.quarantine import write_quarantine
from tidal.audit.runner import AuditResult

CSS = """
body { margin:0; background:#f8fafc; color:#1f2937; font:14px/1.5 -apple-system, "Segoe UI", Roboto, Arial, sans-serif; }
main { max-width:1120px; margin:0 auto; padding:28px 24px 48px; }
h1 { font-size:24px; margin:0 0 4px; } h2 { font-size:17px; margin:0 0 10px; } h3 { font-size:14px; margin:14px 0 6px; }
section { background:#fff; border:1px solid #e5e7eb; border-radius:10px; padding:16px 20px; margin:0 0 16px; }
table { border-collapse:collapse; width:100%; } th, td { padding:6px 8px; border-bottom:1px solid #e5e7eb; text-align:left; vertical-align:top; }
th { color:#6b7280; font-size:12px; text-transform:uppercase; }
.quarantine { color:#cf222e; font-weight:600; } .warn { color:#9a6700; font-weight:600; } .ok, .info { color:#57606a; }
pre { background:#f3f4f6; padding:8px; border-radius:6px; overflow-x:auto; white-space:pre-wrap; word-break:break-word; font-size:12px; }
.sub { color:#6b7280; } a { color:#2f6fdf; }
"""
CSP = "default-src 'none'; style-src 'unsafe-inline'"


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _anchor(task_id: str, index: int) -> str:
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in task_id)
    return f"ev-{safe}-{index}"


def write_json(result: AuditResult, path: str | Path) -> None:
    _write(Path(path), json.dumps(result.to_dict(), indent=2, ensure_ascii=False, default=str) + "\n")


def annotations(result: AuditResult) -> dict[str, dict[str, Any]]:
    """Per task: verdict, and the difficulty estimate when the audit made one."""
    out: dict[str, dict[str, Any]] = {}
    for audit in result.audits:
        entry: dict[str, Any] = {"verdict": audit.verdict}
        if "difficulty_estimate" in audit.measurements:
            entry["difficulty_estimate"] = audit.measurements["difficulty_estimate"]
        out[audit.task_id] = entry
    return out


def write_quarantine_file(result: AuditResult, path: str | Path) -> None:
    write_quarantine(path, [(a.task_id, a.reasons()) for a in result.quarantined()], annotations(result), result.sources)


def render_html(result: AuditResult) -> str:
    summary = result.summary
    parts = [(f"<!doctype html><html lang=en><head><meta charset=utf-8>"
             f"<meta http-equiv=Content-Security-Policy content=\"{CSP}\"><title>tidal audit</title>"
             f"<style>{CSS}</style></head><body><main><h1>Task audit</h1>"
             f"<p class=sub>{_e(', '.join(result.sources))} · {summary['tasks']} tasks · {summary['seconds']} s · "
             f"checks: {_e(', '.join(result.checks))}</p>")]
    verdicts = summary["verdicts"]
    parts.append("<section><h2>Summary</h2><table><tr><th>verdict</th><th>tasks</th></tr>" + "".join(
        f"<tr><td class={v}>{v}</td><td>{verdicts[v]}</td></tr>" for v in ("ok", "warn", "quarantine")) + "</table>")
    parts.append("<h3>Tasks flagged per check</h3><table><tr><th>check</th><th>tasks</th><th>share of time</th></tr>"
                 + "".join(f"<tr><td><a href=\"#check-{_e(c.name)}\">{_e(c.name)}</a></td>"
                           f"<td>{summary['flagged_by_check'].get(c.name, 0)}</td>"
                           f"<td>{summary['time_share_by_check'].get(c.name, 0):.1%}</td></tr>"
                           for c in CHECKS if c.name in result.checks) + "</table></section>")
    evidence: list[str] = []
    for check in [c.name for c in CHECKS if c.name in result.checks]:
        rows = []
        for audit in result.audits:
            for index, finding in enumerate(audit.findings):
                if finding.check != check:
                    continue
                anchor = _anchor(audit.task_id, index)
                rows.append(f"<tr><td>{_e(audit.task_id)}<br><span class=sub>{_e(audit.where)}</span></td>"
                            f"<td class={finding.severity}>{finding.severity}</td><td>{_e(finding.message)} "
                            f"<a href=\"#{anchor}\">evidence</a></td></tr>")
                evidence.append(f"<div id=\"{anchor}\"><h3>{_e(audit.task_id)} · {_e(check)} · "
                                f"<span class={finding.severity}>{finding.severity}</span></h3>"
                                f"<p>{_e(finding.message)}</p><pre>{_e(json.dumps(finding.evidence, indent=2, default=str))}"
                                f"</pre><a href=\"#check-{_e(check)}\">back to {_e(check)}</a></div>")
        body = ("<table><tr><th>task</th><th>severity</th><th>finding</th></tr>" + "".join(rows) + "</table>"
                if rows else "<p class=sub>nothing found</p>")
        parts.append(f"<section id=\"check-{_e(check)}\"><h2>{_e(check)}</h2>{body}</section>")
    parts.append("<section><h2>Every task</h2><table><tr><th>task</th><th>split</th><th>verdict</th>"
                 "<th>checks flagged</th></tr>" + "".join(
                     f"<tr><td>{_e(a.task_id)}</td><td>{_e(a.split or '')}</td><td class={a.verdict}>{a.verdict}</td>"
                     f"<td>{_e(', '.join(sorted(a.flagged())))}</td></tr>" for a in result.audits) + "</table></section>")
    parts.append("<section><h2>Evidence</h2>" + ("".join(evidence) or "<p class=sub>none</p>") + "</section>")
    parts.append("</main></body></html>\n")
    return "".join(parts)


def write_html(result: AuditResult, path: str | Path) -> None:
    _write(Path(path), render_html(result))


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)
