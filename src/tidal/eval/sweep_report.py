"""The context-length sweep as the report shows it: the pass-rate curve (sweep.svg) and the
"Context-length sweep" section read back from a folder's sweep.json (eval/sweep.py writes both)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tidal.eval.report import PALETTE, _e, _Line, _line_chart

SWEEP = "sweep.json"
PLOT = "sweep.svg"


def plot_svg(points: list[dict[str, Any]]) -> str:
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
            "<th>context_exceeded</th></tr>" + "".join(rows) + "</table>" + plot_svg(points) + "</section>")
