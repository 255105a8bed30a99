"""`tidal eval --sweep context=1k,2k,4k`: the same eval once per context length, and the curve of
effectiveness against cost it gives.

    out/
      context-1024/   an eval folder (eval.json, results.jsonl, traces/, summary.json, report.html)
      context-2048/   ...
      sweep.json      one point per length: pass rate with its task-clustered 95% interval, scored
                      episodes, mean tokens (in + out) and cost per task, context_exceeded count
      sweep.svg       pass rate against context length (the plot file)
      report.html     every length side by side, with the sweep section (`sweep_section`)

Each point runs with `context.context_length` set to its length, capped by the model's own window,
so the window policy (agent/window.py: the configured overflow strategy, then `context_exceeded`)
decides what a shorter context costs. Lengths take `k` (x 1024) and `m` (x 1024²) suffixes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tidal.errors import EvalError
from tidal.eval.settings import EvalSettings
from tidal.storage.run import atomic_writer, dumps

SWEEP = "sweep.json"
PLOT = "sweep.svg"
_LENGTH = re.compile(r"^(\d+)([km]?)$")


def parse_sweep(spec: str) -> list[int]:
    """`context=1k,2k,4k` -> [1024, 2048, 4096]; EvalError saying what is wrong otherwise."""
    name, _, values = spec.partition("=")
    if name.strip() != "context" or not values.strip():
        raise EvalError(f"--sweep {spec!r}: write context=LENGTH,LENGTH,... (e.g. context=1k,2k,4k); "
                        "context is the only swept setting")
    lengths = []
    for value in values.split(","):
        match = _LENGTH.match(value.strip().lower())
        if not match:
            raise EvalError(f"--sweep: {value.strip()!r} is not a length (a number, optionally with k or m)")
        length = int(match.group(1)) * {"": 1, "k": 1024, "m": 1 << 20}[match.group(2)]
        if length < 64:
            raise EvalError(f"--sweep: {value.strip()!r} is under 64 tokens")
        lengths.append(length)
    return sorted(set(lengths))


def sweep_point(length: int, summary: dict[str, Any], records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One point of the curve from an eval's summary and records (infra and verifier errors left out)."""
    scored = [r for r in records if r.get("outcome") not in ("infra_error", "verifier_error")]
    per_task = len(scored) or 1
    return {
        "context_length": length, "pass_rate": summary.get("pass_rate"), "ci": summary.get("ci"),
        "scored": len(scored),
        "tokens_per_task": sum(float(r.get("tokens_in", 0)) + float(r.get("tokens_out", 0)) for r in scored) / per_task,
        "cost_per_task": _cost_per_task(scored, per_task),
        "context_exceeded": sum(r.get("outcome") == "context_exceeded" for r in scored),
    }


def _cost_per_task(scored: Sequence[dict[str, Any]], per_task: int) -> float | None:
    """Mean cost per task; None (unknown) when any scored episode has no price, never 0."""
    costs = [r.get("cost") for r in scored]
    if any(cost is None for cost in costs):
        return None
    return sum(float(cost) for cost in costs) / per_task


def run_sweep(lengths: Sequence[int], out: str | Path, settings: EvalSettings,
              evaluate: Callable[..., dict[str, Any]], **options: Any) -> dict[str, Any]:
    """Run `evaluate(out=..., settings=..., **options)` (harness.evaluate) once per length into
    `out/context-N`, then write sweep.json, sweep.svg and the combined report.html."""
    from tidal.eval.eval_report import write_eval_report
    from tidal.eval.harness import RESULTS, latest_records, read_results, view_of

    out = Path(out)
    points, folders = [], []
    for length in lengths:
        folder = out / f"context-{length}"
        context = settings.context.model_copy(update={"context_length": length})
        summary = evaluate(out=folder, settings=settings.model_copy(update={"context": context}), **options)
        points.append(sweep_point(length, summary, latest_records(read_results(folder / RESULTS))))
        folders.append(folder)
    result = {"sweep": "context", "points": points}
    with atomic_writer(out / SWEEP) as handle:
        handle.write(dumps(result, indent=2))
    with atomic_writer(out / PLOT) as handle:
        handle.write(_plot(points))
    views = [view_of(folder, settings) for folder in reversed(folders)]  # the longest context first
    write_eval_report(views, out / "report.html", title="Context-length sweep")
    return result


def _plot(points: list[dict[str, Any]]) -> str:
    from tidal.eval.report import PALETTE, _Line, _line_chart

    line = _Line("pass rate", PALETTE[0], [(float(p["context_length"]), float(p["pass_rate"]))
                                           for p in points if p["pass_rate"] is not None])
    if not line.points:  # nothing scored at any length: no curve to draw
        return ('<svg xmlns="http://www.w3.org/2000/svg" width="680" height="40"><text x="8" y="24">'
                'no scored episodes at any context length</text></svg>')
    svg = _line_chart([line], "Pass rate against context length (tokens)")
    return svg if svg.startswith("<svg") and "xmlns" in svg else svg.replace("<svg", '<svg xmlns="http://www.w3.org/2000/svg"', 1)


def _find(views: Sequence[Any]) -> Path | None:
    for view in views[:1]:
        for folder in (Path(view.folder), Path(view.folder).parent):
            if (folder / SWEEP).is_file():
                return folder / SWEEP
    return None


def _cost_cell(cost: float | None) -> str:
    return "unknown" if cost is None else f"{cost:.4g}"


def sweep_section(views: Sequence[Any]) -> str:
    """The report's "Context-length sweep" section: a table and the curve, when the candidate's
    folder (or the folder above it) holds a sweep.json; empty otherwise."""
    from tidal.eval.report import _e

    path = _find(views)
    if path is None:
        return ""
    try:
        points = json.loads(path.read_text(encoding="utf-8"))["points"]
    except (OSError, ValueError, KeyError):
        return ""
    rows = []
    for p in points:
        rate = "n/a" if p["pass_rate"] is None else f"{100 * p['pass_rate']:.1f}%"
        ci = "" if p["pass_rate"] is None or not p.get("ci") else f" [{100 * p['ci'][0]:.1f}%, {100 * p['ci'][1]:.1f}%]"
        rows.append(f"<tr><td>{int(p['context_length'])}</td><td>{_e(rate + ci)}</td><td>{int(p['scored'])}</td>"
                    f"<td>{p['tokens_per_task']:.0f}</td><td>{_cost_cell(p.get('cost_per_task'))}</td>"
                    f"<td>{int(p['context_exceeded'])}</td></tr>")
    return ("<section><h2>Context-length sweep</h2><p class='sub'>Pass rate (95% interval clustered by task) and "
            f"cost per task at each context length; the plot is also in {_e(PLOT)}.</p><table><tr><th>context "
            "tokens</th><th>pass rate</th><th>scored</th><th>tokens / task</th><th>cost / task</th>"
            "<th>context_exceeded</th></tr>" + "".join(rows) + "</table>" + _plot(points) + "</section>")
