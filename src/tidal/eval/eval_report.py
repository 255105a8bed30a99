"""`report.html` of an evaluation: one self-contained file (inline CSS and SVG, no scripts).

Sections: the selection checklist of each model (pass/fail per threshold, with links into the
per-task traces that explain a failure); outcomes, with a sentence on what the interval means;
pass rate per domain with task-clustered intervals; the tasks an audit quarantined (skipped);
cost against pass rate; success against the step budget; the latency split (generation, tools,
overhead); distributions; every task's outcome per epoch, linked to its trace. Several evals
(the candidate and its baselines) share one report. Text from records is HTML-escaped and a
Content-Security-Policy forbids scripts, as in report.py, whose drawing helpers this reuses.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tidal.eval.index_report import index_section
from tidal.eval.report import (
    CSS,
    EXTRA_CSS,
    PALETTE,
    _e,
    _error_bar,
    _Frame,
    _legend,
    _Line,
    _line_chart,
    _nice_ticks,
    _tick_format,
    _title,
)
from tidal.eval.sweep_report import sweep_section
from tidal.storage.run import atomic_writer

SPLIT_COLORS = {"generation_s": "#4269d0", "tool_s": "#efb118", "overhead_s": "#9498a0"}
@dataclass
class EvalView:
    """One eval as the report shows it."""

    name: str
    folder: Path
    summary: dict[str, Any]
    records: list[dict[str, Any]]
    checklist: list[dict[str, Any]]
    index: dict[str, Any] | None = None  # index.compute_index of the records


def _pct(value: Any) -> str:
    return "n/a" if value is None else f"{100 * float(value):.1f}%"


def _num(value: Any) -> str:
    return "n/a" if value is None else f"{float(value):.4g}"


def _href(view: EvalView, trace: str, report_dir: Path) -> str:
    return _e(os.path.relpath(view.folder / trace, report_dir)) if trace else ""


NUMERIC_ITEMS = {"cost per task": "", "output speed (tokens/s)": " tokens/s", "time to first token (s)": " s"}


def _item_value(item: dict[str, Any]) -> str:
    """A checklist value as the report shows it: a missing cost is "unknown", never 0."""
    value, name = item["value"], item["name"]
    if value is None:
        return "unknown" if name == "cost per task" else "n/a"
    if name.startswith("non-inferior"):
        return f"{100 * value:+.1f} pts"
    if name in NUMERIC_ITEMS:
        return f"{_num(value)}{NUMERIC_ITEMS[name]}"
    return _pct(value)


def _cell(entry: dict[str, Any] | None, key: str, fmt: Any, missing: str = "not measured") -> str:
    """A mean or rate with its 95% interval, or `missing`."""
    if not entry or entry.get(key) is None:
        return f"<span class='na'>{_e(missing)}</span>"
    ci = entry.get("ci")
    interval = f" <span class='ci'>({fmt(ci[0])}–{fmt(ci[1])})</span>" if ci else ""
    return f"{fmt(entry[key])}{interval}"


def _speed_section(views: list[EvalView]) -> str:
    """Output speed, time to first token, context use, tool stability and cost per model."""
    rows = []
    for view in views:
        s = view.summary
        speed, tools, context = s.get("speed") or {}, s.get("tools") or {}, s.get("context") or {}
        cost = s.get("cost_per_task")
        cost_text = (_num(cost) if cost is not None else
                     f"unknown ({s.get('cost_unknown', 0)} episodes without a price)")
        rows.append(
            f"<tr><td>{_e(view.name)}</td>"
            f"<td>{_cell(speed.get('tokens_per_s_task'), 'mean', lambda v: f'{v:.3g}')}</td>"
            f"<td>{_cell(speed.get('tokens_per_s_step'), 'mean', lambda v: f'{v:.3g}')}</td>"
            f"<td>{_cell(speed.get('first_token_s_task'), 'mean', lambda v: f'{v:.3g} s')}</td>"
            f"<td>{_cell(speed.get('first_token_s_step'), 'mean', lambda v: f'{v:.3g} s')}</td>"
            f"<td>{_e(context.get('max_tokens_p90') if context.get('max_tokens_p90') is not None else 'n/a')}</td>"
            f"<td>{_cell(tools.get('failed_call_rate'), 'rate', _pct, 'no tool calls')}</td>"
            f"<td>{_cell(tools.get('recovery_after_failure'), 'rate', _pct, 'no failed calls')}</td>"
            f"<td>{_e(cost_text)}</td></tr>")
    return ("<section><h2>Speed, context, tool stability and cost</h2><p class='sub'>95% intervals: per task, a t "
            "interval over tasks (epochs averaged); per step, a bootstrap over tasks (B = 2000, seed 0) of the pooled "
            "mean of turns; rates, clustered by task. Time to first token is measured for local engines (queue and "
            "prefill); a non-streaming endpoint reports none. Failed calls: tool calls that ran and failed.</p>"
            "<div class='scroll'><table><tr><th>model</th><th>tokens/s per task</th><th>tokens/s per step</th>"
            "<th>first token per task</th><th>first token per step</th><th>context p90 (tokens)</th>"
            "<th>failed calls</th><th>recovery after failure</th><th>cost per task</th></tr>"
            + "".join(rows) + "</table></div></section>")


def _checklist_section(views: list[EvalView], report_dir: Path) -> str:
    parts = ["<section><h2>Selection checklist</h2>"]
    for view in views:
        verdicts = [item["passed"] for item in view.checklist]
        overall = "bad" if False in verdicts else "ok" if verdicts and all(verdicts) else "na"
        word = {"ok": "PASS", "bad": "FAIL", "na": "INCOMPLETE"}[overall]
        parts.append(f'<h3>{_e(view.name)}: <span class="{overall}">{word}</span></h3><div class="scroll"><table>'
                     "<tr><th>item</th><th>threshold</th><th>value</th><th>verdict</th><th>detail</th><th>traces</th></tr>")
        for item in view.checklist:
            mark = {True: '<span class="ok">pass</span>', False: '<span class="bad">fail</span>',
                    None: '<span class="na">n/a</span>'}[item["passed"]]
            links = " ".join(f'<a href="{_href(view, link["trace"], report_dir)}" title="{_e(link["note"])}">'
                             f'{_e(link["task_id"])}#{link["epoch"]}</a>' for link in item["links"])
            shown = _item_value(item)
            parts.append(f"<tr><td>{_e(item['name'])}</td><td>{_e(item['threshold'])}</td><td>{_e(shown)}</td>"
                         f"<td>{mark}</td><td>{_e(item['detail'])}</td><td class='links'>{links}</td></tr>")
        parts.append("</table></div>")
    parts.append("</section>")
    return "".join(parts)


def _outcomes_section(views: list[EvalView]) -> str:
    names = sorted({o for v in views for o in v.summary["outcomes"]})
    head = "".join(f"<th>{_e(n)}</th>" for n in names)
    rows = []
    for view in views:
        s = view.summary
        cells = "".join(f"<td>{s['outcomes'].get(n, 0)}</td>" for n in names)
        ci = "–".join(_pct(v) for v in s["ci"])
        hat = ", ".join(f"^{k} {_pct(v)}" for k, v in s["pass_hat_k"].items())
        ci_k = s.get("pass_at_k_ci", {})
        at = ", ".join(f"@{k} {_pct(v)}" + (f" ({'–'.join(_pct(b) for b in ci_k[k])})" if k in ci_k else "")
                       for k, v in s["pass_at_k"].items())
        se = s.get("cluster_se_group") or s.get("cluster_se_task")
        rows.append(f"<tr><td>{_e(view.name)}</td><td>{_pct(s['pass_rate'])} ({ci})</td>"
                    f"<td>{_e(at)}</td><td>{_e(hat)}</td><td>{_num(se)}</td>"
                    f"<td>{_pct(s['format_compliance'])}</td><td>{_pct(s['recovery_rate'])}</td>{cells}</tr>")
    notes = "".join(f"<p class='sub'>{_e(v.name)}: {_e(v.summary.get('interval_note', ''))}</p>" for v in views)
    return ("<section><h2>Outcomes</h2><p class='sub'>infra_error and verifier_error are reported apart and left "
            "out of every rate; every other outcome is the model's and counts as a failure unless it is pass.</p>"
            f"{notes}<div class='scroll'><table><tr><th>model</th><th>pass rate (95%, clustered by task)</th><th>pass@k</th>"
            f"<th>pass^k</th><th>cluster SE</th><th>format compliance</th><th>recovery</th>{head}</tr>"
            + "".join(rows) + "</table></div></section>")


def _domain_chart(views: list[EvalView]) -> str:
    domains = sorted({d for v in views for d in v.summary["domains"]})
    if not domains:
        return ""
    group = 30.0 * len(views) + 30
    frame = _Frame(max(420.0, 70 + group * len(domains)), 300, left=48, right=12, top=30, bottom=42)
    parts = [frame.open("pass rate per domain"), _title(frame, "Pass rate per domain (95%, clustered by task)")]
    parts.append(frame.y_grid([0.0, 0.25, 0.5, 0.75, 1.0], lambda v: f"{100 * v:.0f}%"))
    parts.append(frame.x_ticks([], str))
    for index, domain in enumerate(domains):
        start = frame.left + group * index + 15
        for column, view in enumerate(views):
            entry = view.summary["domains"].get(domain)
            if not entry or entry["pass_rate"] is None:
                continue
            x, color = start + 30 * column, PALETTE[column % len(PALETTE)]
            top = frame.y(entry["pass_rate"])
            parts.append(f'<rect x="{x:.1f}" y="{top:.1f}" width="24" height="{frame.y(0) - top:.1f}" fill="{color}">'
                         f"<title>{_e(view.name)} {_e(domain)}: {_pct(entry['pass_rate'])} of {entry['n']}</title></rect>")
            low, high = entry["ci"]
            parts.append(_error_bar(x + 12, frame.y(low), frame.y(high), "#374151", f"{domain}: {_pct(low)}–{_pct(high)}"))
        parts.append(f'<text x="{start + 15 * len(views):.1f}" y="{frame.height - frame.bottom + 16:.1f}" '
                     f'text-anchor="middle">{_e(domain[:12])}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _cost_chart(views: list[EvalView]) -> str:
    points = [(float(v.summary["cost_per_task"]), v) for v in views  # an unknown cost is not drawn at 0
              if v.summary["pass_rate"] is not None and v.summary.get("cost_per_task") is not None]
    if not points:
        return ""
    frame = _Frame(440, 280, left=52, right=16, top=30, bottom=36)
    ticks, step = _nice_ticks(0.0, max(c for c, _ in points) or 1.0, count=4)
    frame.x_range, frame.y_range = (ticks[0], ticks[-1]), (0.0, 1.0)
    parts = [frame.open("cost against pass rate"), _title(frame, "Cost per task vs pass rate")]
    parts.append(frame.y_grid([0.0, 0.25, 0.5, 0.75, 1.0], lambda v: f"{100 * v:.0f}%"))
    parts.append(frame.x_ticks(ticks, _tick_format(step, max(abs(t) for t in ticks))))
    for index, (cost, view) in enumerate(points):
        color, s = PALETTE[index % len(PALETTE)], view.summary
        low, high = s["ci"]
        parts.append(_error_bar(frame.x(cost), frame.y(low), frame.y(high), color, f"{view.name}: {_pct(low)}–{_pct(high)}"))
        parts.append(f'<circle cx="{frame.x(cost):.1f}" cy="{frame.y(s["pass_rate"]):.1f}" r="5" fill="{color}">'
                     f"<title>{_e(view.name)}: cost {cost:.4g}, pass {_pct(s['pass_rate'])}</title></circle>")
    parts.append("</svg>")
    return "".join(parts)


def _latency_chart(views: list[EvalView]) -> str:
    frame = _Frame(640, 50 + 34 * len(views), left=150, right=20, top=30, bottom=26)
    means = [{k: v.summary["latency_split"][k] / max(1, v.summary["scored"]) for k in SPLIT_COLORS} for v in views]
    largest = max([sum(m.values()) for m in means] + [1e-9])
    ticks, step = _nice_ticks(0.0, largest, count=4)
    frame.x_range = (0.0, ticks[-1])
    parts = [frame.open("latency split"), _title(frame, "Mean latency per episode: generation + tools + overhead (s)")]
    parts.append(frame.x_ticks(ticks, _tick_format(step, ticks[-1] or 1.0), grid=True))
    for row, (view, mean) in enumerate(zip(views, means)):
        y, x = frame.top + 34 * row + 6, frame.x(0.0)
        parts.append(f'<text x="{frame.left - 8:.1f}" y="{y + 14:.1f}" text-anchor="end">{_e(view.name[:22])}</text>')
        for key, color in SPLIT_COLORS.items():
            width = frame.x(mean[key]) - frame.x(0.0)
            parts.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{max(0.0, width):.1f}" height="20" fill="{color}">'
                         f"<title>{_e(view.name)} {key[:-2]}: {mean[key]:.3g} s</title></rect>")
            x += max(0.0, width)
    parts.append("</svg>")
    return "".join(parts) + _legend([(k[:-2], c) for k, c in SPLIT_COLORS.items()])


def _distribution_section(views: list[EvalView]) -> str:
    rows = []
    for view in views:
        for key, dist in view.summary["distributions"].items():
            if dist:
                rows.append(f"<tr><td>{_e(view.name)}</td><td>{_e(key)}</td>"
                            + "".join(f"<td>{dist[s]:.4g}</td>" for s in ("mean", "p50", "p90", "max", "sum")) + "</tr>")
    return ("<section><h2>Distributions (scored episodes)</h2><div class='scroll'><table><tr><th>model</th><th>metric</th><th>mean</th>"
            "<th>p50</th><th>p90</th><th>max</th><th>total</th></tr>" + "".join(rows) + "</table></div></section>")


def _quarantine_section(views: list[EvalView]) -> str:
    rows = [f"<tr><td>{_e(v.name)}</td><td>{_e(q['task_id'])}</td><td>{_e(q.get('domain', ''))}</td>"
            f"<td>{_e('; '.join(q.get('reasons', [])) or 'listed without a reason')}</td></tr>"
            for v in views for q in v.summary.get("quarantined", [])]
    if not rows:
        return ""
    return ("<section><h2>Quarantined tasks (skipped)</h2><p class='sub'>listed in the audit's quarantine file "
            "(--quarantine); not run and in no rate.</p><div class='scroll'><table><tr><th>model</th><th>task</th><th>domain</th>"
            "<th>reasons</th></tr>" + "".join(rows) + "</table></div></section>")


def _task_section(view: EvalView, report_dir: Path) -> str:
    by_task: dict[str, list[dict[str, Any]]] = {}
    for record in sorted(view.records, key=lambda r: (r["task_id"], r["epoch"])):
        by_task.setdefault(record["task_id"], []).append(record)
    rows = []
    for task_id, records in by_task.items():
        cells = " ".join(
            f'<a class="{"ok" if r["passed"] else "bad"}" href="{_href(view, r.get("trace", ""), report_dir)}" '
            f'title="{_e(r.get("detail", ""))}">{_e(r["outcome"])}#{r["epoch"]}</a>' for r in records)
        rows.append(f"<tr><td>{_e(task_id)}</td><td>{_e(records[0]['domain'])}</td><td class='links'>{cells}</td>"
                    f"<td>{sum(int(r.get('steps', 0)) for r in records) / len(records):.1f}</td></tr>")
    return (f"<section><h2>Tasks: {_e(view.name)}</h2><div class='scroll'><table><tr><th>task</th><th>domain</th><th>outcome per epoch "
            "(links to traces)</th><th>mean steps</th></tr>" + "".join(rows) + "</table></div></section>")


def render_eval_report(views: list[EvalView], report_dir: Path, title: str = "Evaluation") -> str:
    """The report's HTML for `views` (the first is the candidate), links relative to `report_dir`."""
    lines = [_Line(v.name, PALETTE[i % len(PALETTE)], [(float(b), float(p)) for b, p in v.summary["success_by_steps"]])
             for i, v in enumerate(views)]
    budget = _line_chart(lines, "Success within b steps (share of episodes)") if any(l.points for l in lines) else ""
    body = [
        f"<h1>{_e(title)}</h1><p class='sub'>{_e(', '.join(v.name for v in views))}</p>",
        _checklist_section(views, report_dir),
        _outcomes_section(views),
        index_section(views),
        _speed_section(views),
        "<section><h2>Pass rate and cost</h2>" + _domain_chart(views) + _cost_chart(views)
        + _legend([(v.name, PALETTE[i % len(PALETTE)]) for i, v in enumerate(views)]) + "</section>",
        f"<section><h2>Success against the step budget</h2>{budget}</section>",
        f"<section><h2>Latency</h2>{_latency_chart(views)}</section>",
        _distribution_section(views),
        _quarantine_section(views),
        sweep_section(views),  # the context-length sweep (eval/sweep.py), when the folder holds one
        *[_task_section(v, report_dir) for v in views],
    ]
    return ("<!doctype html><html><head><meta charset='utf-8'>"
            "<meta http-equiv='Content-Security-Policy' content=\"default-src 'none'; style-src 'unsafe-inline'; img-src data:\">"
            f"<title>{_e(title)}</title><style>{CSS}{EXTRA_CSS}</style></head><body><main>"
            + "".join(body) + "</main></body></html>")


def write_eval_report(views: list[EvalView], path: Path, title: str = "Evaluation") -> Path:
    with atomic_writer(path) as handle:
        handle.write(render_eval_report(views, path.parent, title))
    return path
