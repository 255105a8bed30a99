"""How the intelligence index is shown: a text table for the CLI, a trend plot (SVG, drawn with
report.py's helpers: no plotting library), an HTML page, and the index section of an eval report.

`tidal index` writes into its `--out` folder: `index.json` (the trend of index.py), `trend.svg`
(the index of each version with its interval, and each category's score), `index.html` (the table
and the plot). Text from folders and configs is HTML-escaped, as everywhere in the reports.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tidal.eval.report import (
    CSP,
    CSS,
    EXTRA_CSS,
    PALETTE,
    _e,
    _error_bar,
    _Frame,
    _legend,
    _segment,
    _title,
)
from tidal.storage.run import atomic_writer

INDEX_COLOR = "#1f2937"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}"


def _interval(ci: list[float] | None) -> str:
    return "n/a" if not ci else f"[{_pct(ci[0])}, {_pct(ci[1])}]"


def _signed(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:+.1f}"


def format_trend(result: dict[str, Any]) -> str:
    """The CLI's table: one row per version (index, interval, category scores), then the paired
    differences of consecutive versions. Scores in points (0-100)."""
    names = result["categories"]
    header = ["version", "index", f"{100 * result['confidence']:.0f}% CI", *names]
    rows = [[row["label"], _pct(row["index"]), _interval(row["ci"]),
             *[_pct(row["categories"][n]["score"]) for n in names]] for row in result["versions"]]
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(str(cell).ljust(w) for cell, w in zip(r, widths)) for r in [header, *rows]]
    for step in result["differences"]:
        lines.append(f"{step['from']} -> {step['to']}: {_signed(step['diff'])} pts, paired "
                     f"{_interval(step['ci'])} over {step['tasks']} tasks")
    kind = " (ids only: no taskset.json, task content not checked)" if result.get("task_set_kind") == "ids" else ""
    lines.append(f"task set {result['task_set'][:16]}{kind}; bootstrap B={result['bootstrap']}, seed {result['seed']}, "
                 "tasks resampled within category")
    for row in result["versions"]:
        if row["missing"] or row["unmapped"]:
            lines.append(f"{row['label']}: categories without tasks {row['missing']}; "
                         f"{len(row['unmapped'])} task(s) in no category")
    return "\n".join(lines)


def trend_svg(result: dict[str, Any], width: float = 680, height: float = 300) -> str:
    """The index of each version (with its interval) and each category's score, over the versions."""
    versions = result["versions"]
    frame = _Frame(width, height, left=48, right=16, top=30, bottom=40)
    frame.x_range = (-0.5, len(versions) - 0.5)
    frame.y_range = (0.0, 1.0)
    parts = [frame.open("intelligence index by version"), _title(frame, "Intelligence index by version (95% CI)")]
    parts.append(frame.y_grid([0.0, 0.25, 0.5, 0.75, 1.0], lambda v: f"{100 * v:.0f}"))
    base = frame.height - frame.bottom
    parts.append(_segment(frame.left, base, frame.width - frame.right, base, "#9ca3af"))
    for at, row in enumerate(versions):
        parts.append(f'<text x="{frame.x(at):.1f}" y="{base + 15:.1f}" text-anchor="middle">{_e(row["label"][:14])}</text>')
    for position, name in enumerate(result["categories"]):
        points = [(at, row["categories"][name]["score"]) for at, row in enumerate(versions)
                  if row["categories"][name]["score"] is not None]
        parts.append(_path(frame, points, PALETTE[position % len(PALETTE)], 1.2, name, dashed=True))
    points = [(at, row["index"]) for at, row in enumerate(versions) if row["index"] is not None]
    parts.append(_path(frame, points, INDEX_COLOR, 2.4, "index"))
    for at, row in enumerate(versions):
        if row["index"] is None:
            continue
        low, high = row["ci"]
        parts.append(_error_bar(frame.x(at), frame.y(low), frame.y(high), INDEX_COLOR,
                                f"{row['label']}: {_pct(row['index'])} {_interval(row['ci'])}"))
        parts.append(f'<circle cx="{frame.x(at):.1f}" cy="{frame.y(row["index"]):.1f}" r="4" fill="{INDEX_COLOR}">'
                     f"<title>{_e(row['label'])}: index {_pct(row['index'])}</title></circle>")
    parts.append("</svg>")
    return "".join(parts)


def _path(frame: _Frame, points: list[tuple[float, float]], color: str, stroke: float, label: str,
          dashed: bool = False) -> str:
    if not points:
        return ""
    d = " ".join(f"{'M' if i == 0 else 'L'}{frame.x(x):.1f},{frame.y(y):.1f}" for i, (x, y) in enumerate(points))
    dash = ' stroke-dasharray="4 3"' if dashed else ""
    return (f'<path d="{d}" fill="none" stroke="{color}" stroke-width="{stroke}"{dash}>'
            f"<title>{_e(label)}</title></path>")


def _legend_items(result: dict[str, Any]) -> list[tuple[str, str]]:
    return [("index", INDEX_COLOR), *[(n, PALETTE[i % len(PALETTE)]) for i, n in enumerate(result["categories"])]]


def _version_table(result: dict[str, Any]) -> str:
    names = result["categories"]
    head = "".join(f"<th>{_e(n)}</th>" for n in names)
    rows = []
    for row in result["versions"]:
        cells = "".join(f"<td class='num'>{_pct(row['categories'][n]['score'])}</td>" for n in names)
        rows.append(f"<tr><td>{_e(row['label'])}</td><td class='num'>{_pct(row['index'])}</td>"
                    f"<td class='num'>{_interval(row['ci'])}</td><td class='num'>{row['tasks']}</td>{cells}</tr>")
    diffs = "".join(f"<tr><td>{_e(s['from'])} → {_e(s['to'])}</td><td class='num'>{_signed(s['diff'])}</td>"
                    f"<td class='num'>{_interval(s['ci'])}</td><td class='num'>{s['tasks']}</td></tr>"
                    for s in result["differences"])
    table = (f"<div class='scroll'><table><tr><th>version</th><th>index</th><th>95% CI</th><th>tasks</th>{head}</tr>"
             + "".join(rows) + "</table></div>")
    if diffs:
        table += ("<h3>Paired difference between consecutive versions</h3><div class='scroll'><table><tr><th>versions"
                  "</th><th>Δ index (pts)</th><th>95% CI (paired by task)</th><th>tasks</th></tr>" + diffs
                  + "</table></div>")
    return table


def render_index_page(result: dict[str, Any]) -> str:
    """index.html: the version table, the paired differences and the trend plot."""

    note = (f"task set {_e(result['task_set'])}; bootstrap B = {result['bootstrap']}, seed {result['seed']}: tasks "
            "resampled with replacement within each category, all epochs of a task together. Scores in points (0–100).")
    body = (f"<h1>Intelligence index</h1><p class='sub'>{note}</p><section><h2>By version</h2>"
            f"{_version_table(result)}</section><section><h2>Trend</h2>{trend_svg(result)}"
            f"{_legend(_legend_items(result))}</section>")
    return (f"<!doctype html><html><head><meta charset='utf-8'><meta http-equiv='Content-Security-Policy' "
            f"content=\"{CSP}\"><title>Intelligence index</title><style>{CSS}{EXTRA_CSS}</style></head>"
            f"<body><main>{body}</main></body></html>")


def write_index_outputs(result: dict[str, Any], out: Path) -> dict[str, Path]:
    """index.json, trend.svg and index.html in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "index.json", "svg": out / "trend.svg", "html": out / "index.html"}
    texts = {"json": json.dumps(result, indent=2), "svg": trend_svg(result), "html": render_index_page(result)}
    for key, path in paths.items():
        with atomic_writer(path) as handle:
            handle.write(texts[key])
    return paths


def index_section(views: list[Any]) -> str:
    """The eval report's index section: per model, the category scores with their intervals and
    weights, and the weighted index with its interval (views without an index are skipped)."""
    shown = [v for v in views if getattr(v, "index", None)]
    if not shown:
        return ""
    names = list(shown[0].index["categories"])
    head = "".join(f"<th>{_e(n)}</th>" for n in names)
    rows = []
    for view in shown:
        index = view.index
        cells = "".join(
            f"<td class='num'>{_pct(c['score'])} {_interval(c['ci'])}<br><span class='ci'>w {c['weight']:.2f}, "
            f"{c['tasks']} tasks</span></td>" if c and c["tasks"] else "<td class='na'>no tasks</td>"
            for c in (index["categories"].get(n) for n in names))
        rows.append(f"<tr><td>{_e(view.name)}</td><td class='num'><b>{_pct(index['index'])}</b> "
                    f"{_interval(index['ci'])}</td>{cells}</tr>")
    first = shown[0].index
    notes = [(f"Scores in points (0–100). {100 * first['confidence']:.0f}% percentile bootstrap, B = "
              f"{first['bootstrap']}, seed {first['seed']}: tasks resampled within each category, all epochs of a "
              "task together.")]
    for view in shown:
        index = view.index
        extra = []
        if index["missing"]:
            extra.append(f"no tasks in {', '.join(index['missing'])} (weights renormalised over the rest)")
        if index["unmapped"]:
            extra.append(f"{len(index['unmapped'])} task(s) in no category")
        task_set = index.get("task_set") or "not recorded"
        notes.append(f"{view.name}: task set {task_set[:16]}" + (f"; {'; '.join(extra)}" if extra else ""))
    notes.extend(_baseline_differences(shown))
    note_html = "".join(f"<p class='sub'>{_e(n)}</p>" for n in notes)
    return (f"<section><h2>Intelligence index</h2>{note_html}<div class='scroll'><table><tr><th>model</th>"
            f"<th>index</th>{head}</tr>" + "".join(rows) + "</table></div></section>")


def _baseline_differences(views: list[Any]) -> list[str]:
    """The candidate's index against each baseline: the paired difference when both ran the same
    task set, else a sentence saying they are not comparable (and both hashes)."""
    from tidal.eval.index import IndexConfig, paired_index_difference

    candidate, lines = views[0], []
    config = IndexConfig.model_validate(candidate.index["config"]) if candidate.index.get("config") else IndexConfig()
    for baseline in views[1:]:
        mine, theirs = candidate.index.get("task_set"), baseline.index.get("task_set")
        if not mine or mine != theirs:
            lines.append(f"{candidate.name} vs {baseline.name}: not compared, the task sets differ "
                         f"({(mine or 'not recorded')[:16]} vs {(theirs or 'not recorded')[:16]})")
            continue
        step = paired_index_difference(baseline.records, candidate.records, config)
        lines.append(f"{candidate.name} − {baseline.name}: {_signed(step['diff'])} pts, paired 95% CI "
                     f"{_interval(step['ci'])} over {step['tasks']} tasks")
    return lines
