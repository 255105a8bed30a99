"""Inline SVG line charts for the dashboard: one chart per metric group, a line per series, and
the guard's events drawn as vertical markers at their steps (a dashed red line with the event in
its tooltip). Drawn on the server, so the page needs no plotting library and no network."""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape
from typing import Any

from tidal.eval.report import PALETTE

WIDTH, HEIGHT = 460, 220
LEFT, RIGHT, TOP, BOTTOM = 52, 12, 26, 28
MARKER_COLOR = "#cf222e"

# (title, which metric keys belong to it): the dashboard's metric groups, in page order.
GROUPS: tuple[tuple[str, Any], ...] = (
    ("Reward by domain", lambda k: k.startswith("reward/")),
    ("Pass rate", lambda k: k == "pass_rate" or k.startswith("pass_rate/")),
    ("Entropy", lambda k: "entropy" in k and not k.endswith("_coef")),
    ("KL", lambda k: (k == "kl" or "kl" in k.split("/")[-1].split("_")) and not k.endswith("_coef")),
    ("Lengths (tokens)", lambda k: k in ("mean_completion_length",) or k.startswith(("sampled/length", "trained/length"))),
    ("Throughput (tokens/s)", lambda k: k == "tokens_per_s"),
    ("Idle and step times (s)", lambda k: k.endswith("_idle_s") or k in ("step_s", "generate_s", "train_s")),
    ("Drops by reason (samples)", lambda k: k.startswith("drop/")),
)


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def series(rows: Sequence[dict[str, Any]], keys: Sequence[str]) -> dict[str, list[tuple[float, float]]]:
    """(step, value) points of each key over `rows`; non-finite values are left out (a NaN is a
    guard event, drawn as a marker, not a point)."""
    out: dict[str, list[tuple[float, float]]] = {}
    for key in keys:
        points = [(float(r["step"]), v) for r in rows if (v := _finite(r.get(key))) is not None and "step" in r]
        if points:
            out[key] = points
    return out


def grouped(rows: Sequence[dict[str, Any]]) -> list[tuple[str, dict[str, list[tuple[float, float]]]]]:
    """The metric groups that have data in `rows`, each with its series."""
    keys = sorted({k for r in rows for k, v in r.items() if _finite(v) is not None})
    charts = []
    for title, belongs in GROUPS:
        found = series(rows, [k for k in keys if belongs(k)])
        if title.startswith("Drops"):
            found = {k: p for k, p in found.items() if any(y for _, y in p)} or found  # hide reasons never seen
        if found:
            charts.append((title, found))
    return charts


def line_chart(title: str, lines: dict[str, list[tuple[float, float]]], markers: Sequence[dict[str, Any]]) -> str:
    """One chart: `lines` (label -> points) and the guard `markers` (rows with a `step`)."""
    xs = [x for points in lines.values() for x, _ in points] + [float(m["step"]) for m in markers]
    ys = [y for points in lines.values() for _, y in points]
    x0, x1 = (min(xs), max(xs)) if xs else (0.0, 1.0)
    y0, y1 = (min(ys), max(ys)) if ys else (0.0, 1.0)
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    if y1 == y0:
        y0, y1 = y0 - (abs(y0) or 1) * 0.5, y1 + (abs(y1) or 1) * 0.5
    w, h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def px(x: float) -> float:
        return LEFT + (x - x0) / (x1 - x0) * w

    def py(y: float) -> float:
        return TOP + (1 - (y - y0) / (y1 - y0)) * h

    parts = [(f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" role="img" '
              f'aria-label="{escape(title)}" data-title="{escape(title)}">'),
             f'<rect x="{LEFT}" y="{TOP}" width="{w}" height="{h}" fill="#ffffff" stroke="#d0d7de"/>',
             f'<text class="title" x="{LEFT}" y="16">{escape(title)}</text>']
    for value in (y0, (y0 + y1) / 2, y1):
        parts.append(f'<text x="{LEFT - 4}" y="{py(value) + 4:.1f}" text-anchor="end">{value:.3g}</text>')
    for value in (x0, x1):
        parts.append(f'<text x="{px(value):.1f}" y="{HEIGHT - 10}" text-anchor="middle">{value:.0f}</text>')
    for marker in markers:
        x = px(float(marker["step"]))
        tip = escape(f"step {marker['step']}: {marker.get('event', '')} {marker.get('detector') or marker.get('fault') or ''} "
                     f"{marker.get('reason', '')}".strip())
        parts.append(f'<line class="guard-marker" x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{TOP + h}" '
                     f'stroke="{MARKER_COLOR}" stroke-width="2" stroke-dasharray="4 3"><title>{tip}</title></line>')
    for i, (label, points) in enumerate(sorted(lines.items())):
        color = PALETTE[i % len(PALETTE)]
        path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in points)
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{path}"><title>{escape(label)}</title></polyline>')
        for x, y in points:
            parts.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="2.5" fill="{color}"/>')
    parts.append("</svg>")
    legend = "".join(f'<span><i style="background:{PALETTE[i % len(PALETTE)]}"></i>{escape(label)}</span>'
                     for i, label in enumerate(sorted(lines)))
    return f'<figure class="plot">{"".join(parts)}<figcaption class="legend">{legend}</figcaption></figure>'
