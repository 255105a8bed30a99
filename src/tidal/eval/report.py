"""The HTML report of a run: one self-contained file (inline CSS and SVG, no scripts, no network).

Sections: run info; held-out pass rate before and after RL per domain with the paired difference
and its 95% CI; a bar chart of before/after and a plot of the differences; reward per domain over
RL steps; small multiples of the other metric series. Every piece of text from the summary or
the metrics (task ids, domain names, metric keys) is HTML-escaped, and a Content-Security-Policy
forbids scripts, so a hostile name cannot run code in a reader's browser.
"""

from __future__ import annotations

import html
import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Point = tuple[float, float]

PALETTE = ("#4269d0", "#efb118", "#ff725c", "#6cc5b0", "#3ca951", "#ff8ab7", "#a463f2", "#97bbf5", "#9c6b4e", "#9498a0")
BEFORE_COLOR, AFTER_COLOR, MEAN_COLOR = "#a3acb9", "#2f6fdf", "#1f2937"
UP_COLOR, DOWN_COLOR, FLAT_COLOR = "#1a7f37", "#cf222e", "#57606a"
MAX_POINTS = 800  # per line; longer series keep the min and max of each bucket, so spikes show
MAX_SMALL_CHARTS = 24
SKIPPED_SERIES = {"step", "time", "timestamp", "wall_time", "epoch"}

CSS = """
:root { --fg:#1f2937; --muted:#6b7280; --line:#e5e7eb; --bg:#f8fafc; --card:#ffffff; }
* { box-sizing: border-box; }
body { margin:0; background:var(--bg); color:var(--fg);
  font:14px/1.5 -apple-system, BlinkMacSystemFont, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
main { max-width:1120px; margin:0 auto; padding:28px 24px 48px; }
h1 { font-size:24px; margin:0 0 4px; font-weight:650; }
h2 { font-size:17px; margin:0 0 12px; font-weight:600; }
.sub { color:var(--muted); margin:0 0 20px; }
section { background:var(--card); border:1px solid var(--line); border-radius:10px; padding:18px 20px; margin:0 0 18px; }
.info { display:grid; grid-template-columns:repeat(auto-fill, minmax(170px, 1fr)); gap:10px 18px; margin:0; }
.info div { min-width:0; }
.info dt { color:var(--muted); font-size:12px; text-transform:uppercase; letter-spacing:.04em; }
.info dd { margin:0; font-weight:550; overflow-wrap:anywhere; }
table { border-collapse:collapse; width:100%; font-variant-numeric:tabular-nums; }
th, td { padding:7px 10px; text-align:right; border-bottom:1px solid var(--line); white-space:nowrap; }
th:first-child, td:first-child { text-align:left; white-space:normal; overflow-wrap:anywhere; }
th { color:var(--muted); font-weight:600; font-size:12px; text-transform:uppercase; letter-spacing:.03em; }
tbody tr:nth-child(even) { background:#fafbfc; }
tr.overall td { font-weight:650; border-top:2px solid var(--fg); background:#f3f6fb; }
.ci { color:var(--muted); font-size:12px; }
.up { color:#1a7f37; } .down { color:#cf222e; } .flat { color:#57606a; }
.note { color:var(--muted); font-size:12.5px; margin:10px 0 0; }
.charts { display:flex; flex-wrap:wrap; gap:18px; align-items:flex-start; }
.grid { display:grid; grid-template-columns:repeat(auto-fill, minmax(320px, 1fr)); gap:14px; }
.legend { display:flex; flex-wrap:wrap; gap:6px 16px; font-size:12.5px; margin:0 0 8px; }
.legend span { display:inline-flex; align-items:center; gap:6px; }
.legend i { display:inline-block; width:14px; height:3px; border-radius:2px; }
.empty { color:var(--muted); font-style:italic; margin:0; }
svg { display:block; height:auto; width:100%; }
svg text { font:11px -apple-system, BlinkMacSystemFont, "Segoe UI", Roboto, Arial, sans-serif; fill:#4b5563; }
svg .title { font-size:12.5px; font-weight:600; fill:#1f2937; }
footer { color:var(--muted); font-size:12px; text-align:center; margin-top:8px; }
"""
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"


# ------------------------------------------------------------------------------------------------
# Formatting


# The base CSS keeps cells on one line (nowrap) for the run report's numeric tables; the eval
# tables hold long task ids, sentences and link lists, so here cells wrap, the first column keeps a
# readable width, long tokens break anywhere, and a table wider than its card scrolls inside it
# (`.scroll`) instead of pushing the page wider than the viewport.
EXTRA_CSS = """
.scroll { overflow-x:auto; max-width:100%; margin:0 0 12px; }
table { border-collapse:collapse; width:100%; font-size:13px; table-layout:auto; }
th, td { border-bottom:1px solid var(--line); padding:4px 8px; text-align:left; vertical-align:top;
  white-space:normal; overflow-wrap:break-word; word-break:normal; }
th:first-child, td:first-child { min-width:11em; max-width:28em; overflow-wrap:anywhere; }
th { text-transform:none; letter-spacing:0; }
td.links { min-width:12em; overflow-wrap:anywhere; word-break:break-word; }
td.links a { display:inline-block; max-width:100%; overflow-wrap:anywhere; margin-right:6px; }
td.num { white-space:nowrap; text-align:right; }
.ok { color:#1a7f37; font-weight:600; } .bad { color:#cf222e; font-weight:600; } .na { color:#6b7280; }
.legend span { margin-right:14px; } .legend i { display:inline-block; width:10px; height:10px; margin-right:4px; }
h3 { overflow-wrap:anywhere; } .sub { overflow-wrap:anywhere; }
svg { max-width:100%; }
svg text { font-size:11px; fill:#374151; } svg text.title { font-size:13px; font-weight:600; }
"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _number(value: Any) -> float | None:
    """A float for a number (numpy scalars too; inf kept), None for anything else or NaN."""
    if isinstance(value, bool) or not (isinstance(value, (int, float)) or hasattr(value, "item")):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) else number


def _finite(value: Any) -> float | None:
    number = _number(value)
    return number if number is not None and math.isfinite(number) else None


def _percent(value: Any) -> str:
    number = _finite(value)
    return "—" if number is None else f"{100 * number:.1f}%"


def _points(value: Any) -> str:
    """A difference of rates in signed percentage points; ±inf as an unbounded end."""
    number = _number(value)
    if number is None:
        return "—"
    if math.isinf(number):
        return "+∞" if number > 0 else "−∞"
    return f"{100 * number:+.1f}".replace("-", "−")


def _pair(value: Any) -> tuple[float | None, float | None]:
    if isinstance(value, (list, tuple)) and len(value) == 2:
        return _number(value[0]), _number(value[1])
    return None, None


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m {secs:02d}s"
    return f"{minutes}m {secs:02d}s" if minutes else f"{secs}s"


def _info_label(key: str) -> str:
    return (key[:-2] if key.endswith("duration_s") else key).replace("_", " ")


def _info_value(key: str, value: Any) -> str:
    number = _finite(value)
    if key.endswith("duration_s") and number is not None:
        return _duration(number)
    if isinstance(value, float) and number is not None:
        return f"{value:.6g}"
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, ensure_ascii=False, default=str)
    return "—" if value is None else str(value)


def _tick_format(step: float, largest: float | None = None) -> Callable[[float], str]:
    """Labels with as many decimals as a tick step of 1, 2 or 5 × 10^k needs; scientific
    notation for very small or very large values (a learning rate, a token count)."""
    largest = abs(step) if largest is None else abs(largest)
    if largest >= 1e6 or largest < 1e-3:
        digits = max(1, min(6, math.floor(math.log10(largest)) - math.floor(math.log10(step)) + 1))

        def scientific(v: float) -> str:
            mantissa, exponent = f"{v:.{digits - 1}e}".split("e")
            return "0" if v == 0 else f"{mantissa}e{int(exponent)}".replace("-", "−")

        return scientific
    decimals = min(8, max(0, -math.floor(math.log10(step) + 1e-9)))
    return lambda v: f"{v:,.{decimals}f}".replace(",", "\u2009").replace("-", "−")


def _nice_ticks(low: float, high: float, count: int = 5) -> tuple[list[float], float]:
    """Round tick values covering [low, high] (steps of 1, 2 or 5 × 10^k) and the step."""
    if not high > low:
        spread = abs(low) * 0.1 or 1.0
        low, high = low - spread, high + spread
    raw = (high - low) / max(1, count)
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    first, last = math.floor(low / step + 1e-9), math.ceil(high / step - 1e-9)
    return [round(i * step, 12) + 0.0 for i in range(first, last + 1)], step  # + 0.0: no "-0"


# ------------------------------------------------------------------------------------------------
# SVG drawing


def _segment(x1: float, y1: float, x2: float, y2: float, stroke: str, extra: str = "") -> str:
    return f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" stroke="{stroke}"{extra}/>'


@dataclass
class _Frame:
    """A plot area inside an SVG of `width` × `height`, mapping data to pixels."""

    width: float
    height: float
    left: float
    right: float
    top: float
    bottom: float
    x_range: tuple[float, float] = (0.0, 1.0)
    y_range: tuple[float, float] = (0.0, 1.0)

    def x(self, value: float) -> float:
        low, high = self.x_range
        span = (high - low) or 1.0
        return self.left + (value - low) / span * (self.width - self.left - self.right)

    def y(self, value: float) -> float:
        low, high = self.y_range
        span = (high - low) or 1.0
        return self.height - self.bottom - (value - low) / span * (self.height - self.top - self.bottom)

    def open(self, label: str) -> str:
        return (
            f'<svg viewBox="0 0 {self.width:.0f} {self.height:.0f}" style="max-width:{self.width:.0f}px" '
            f'role="img" aria-label="{_e(label)}" xmlns="http://www.w3.org/2000/svg">'
        )

    def y_grid(self, ticks: list[float], fmt: Callable[[float], str]) -> str:
        parts = []
        for tick in ticks:
            y = self.y(tick)
            parts.append(
                _segment(self.left, y, self.width - self.right, y, "#eef0f3")
                + f'<text x="{self.left - 6:.1f}" y="{y + 3.5:.1f}" text-anchor="end">{_e(fmt(tick))}</text>'
            )
        return "".join(parts)

    def x_ticks(self, ticks: list[float], fmt: Callable[[float], str], grid: bool = False) -> str:
        parts, base = [], self.height - self.bottom
        for tick in ticks:
            x = self.x(tick)
            if grid:
                parts.append(_segment(x, self.top, x, base, "#eef0f3"))
            parts.append(f'<text x="{x:.1f}" y="{base + 15:.1f}" text-anchor="middle">{_e(fmt(tick))}</text>')
        parts.append(_segment(self.left, base, self.width - self.right, base, "#9ca3af"))
        return "".join(parts)


def _title(frame: _Frame, text: str) -> str:
    return f'<text class="title" x="{frame.left:.1f}" y="16">{_e(text)}</text>'


def _short(label: str, limit: int = 16) -> str:
    return label if len(label) <= limit else label[: limit - 1] + "…"


def _thin(points: list[Point]) -> list[Point]:
    """At most about MAX_POINTS points: the min and max of each bucket, in x order."""
    if len(points) <= MAX_POINTS:
        return points
    size = math.ceil(len(points) / (MAX_POINTS // 2))
    kept: list[Point] = []
    for start in range(0, len(points), size):
        bucket = points[start : start + size]
        low = min(bucket, key=lambda p: p[1])
        high = max(bucket, key=lambda p: p[1])
        kept.extend(sorted({low, high}))
    return kept


@dataclass
class _Line:
    label: str
    color: str
    points: list[Point]
    width: float = 1.8


def _line_chart(lines: list[_Line], title: str, width: float = 680, height: float = 280) -> str:
    """Lines over steps; points with the same x are drawn in input order."""
    drawn = [line for line in lines if line.points]
    xs = [p[0] for line in drawn for p in line.points]
    ys = [p[1] for line in drawn for p in line.points]
    frame = _Frame(width, height, left=52, right=14, top=28, bottom=34)
    x_ticks, x_step = _nice_ticks(min(xs), max(xs), count=6)
    y_ticks, y_step = _nice_ticks(min(ys), max(ys), count=4)
    frame.x_range = (min(xs), max(xs)) if max(xs) > min(xs) else (x_ticks[0], x_ticks[-1])
    frame.y_range = (y_ticks[0], y_ticks[-1])
    x_ticks = [t for t in x_ticks if frame.x_range[0] - 1e-9 <= t <= frame.x_range[1] + 1e-9] or x_ticks
    parts = [frame.open(title), _title(frame, title)]
    parts.append(frame.y_grid(y_ticks, _tick_format(y_step, max(abs(t) for t in y_ticks))))
    parts.append(frame.x_ticks(x_ticks, _tick_format(x_step, max(abs(t) for t in x_ticks))))
    parts.append(f'<text x="{width - frame.right:.1f}" y="{height - 3:.1f}" text-anchor="end">step</text>')
    for line in drawn:
        points = _thin(line.points)
        path = " ".join(f"{'M' if i == 0 else 'L'}{frame.x(x):.1f},{frame.y(y):.1f}" for i, (x, y) in enumerate(points))
        parts.append(
            f'<path d="{path}" fill="none" stroke="{line.color}" stroke-width="{line.width}" '
            f'stroke-linejoin="round" stroke-linecap="round"><title>{_e(line.label)}</title></path>'
        )
        if len(points) <= 40:
            for x, y in points:
                parts.append(
                    f'<circle cx="{frame.x(x):.1f}" cy="{frame.y(y):.1f}" r="2.6" fill="{line.color}">'
                    f"<title>{_e(line.label)} · step {x:g}: {y:.4g}</title></circle>"
                )
    parts.append("</svg>")
    return "".join(parts)


def _legend(items: list[tuple[str, str]]) -> str:
    spans = "".join(f'<span><i style="background:{color}"></i>{_e(label)}</span>' for label, color in items)
    return f'<div class="legend">{spans}</div>'


def _error_bar(x: float, y_low: float, y_high: float, color: str, tip: str) -> str:
    return (
        f'<g stroke-width="1.4"><title>{_e(tip)}</title>'
        + _segment(x, y_low, x, y_high, color)
        + _segment(x - 4, y_low, x + 4, y_low, color)
        + _segment(x - 4, y_high, x + 4, y_high, color)
        + "</g>"
    )


def _bar_chart(rows: list[tuple[str, Mapping[str, Any]]]) -> str:
    """Grouped bars of the pass rate before and after per domain, with 95% whiskers: on each bar
    when the summary gives `before_ci`/`after_ci`, otherwise on the after bar as before + the CI
    of the paired difference (so the whisker clears the before level exactly when Δ does)."""
    group = 74.0
    frame = _Frame(max(420.0, 70 + group * len(rows)), 300, left=48, right=12, top=30, bottom=42)
    ticks = [0.0, 0.25, 0.5, 0.75, 1.0]
    parts = [frame.open("pass rate before and after RL"), _title(frame, "Held-out pass rate")]
    parts.append(frame.y_grid(ticks, lambda v: f"{100 * v:.0f}%"))
    parts.append(frame.x_ticks([], str))

    def clamp(value: float) -> float:
        return frame.y(min(1.0, max(0.0, value)))

    for index, (name, entry) in enumerate(rows):
        center = frame.left + group * (index + 0.5)
        before, after = _finite(entry.get("before")), _finite(entry.get("after"))
        for offset, value, color, key in ((-15.0, before, BEFORE_COLOR, "before"), (15.0, after, AFTER_COLOR, "after")):
            if value is None:
                continue
            top = clamp(value)
            parts.append(
                f'<rect x="{center + offset - 13:.1f}" y="{top:.1f}" width="26" height="{frame.y(0) - top:.1f}" '
                f'fill="{color}" rx="2"><title>{_e(name)} {key}: {_percent(value)}</title></rect>'
            )
            low, high = _pair(entry.get(f"{key}_ci"))
            if low is not None and high is not None:
                tip = f"{name} {key} 95% CI: {_percent(low)} to {_percent(high)}"
                parts.append(_error_bar(center + offset, clamp(low), clamp(high), "#374151", tip))
        diff_low, diff_high = _number(entry.get("ci_low")), _number(entry.get("ci_high"))
        has_diff = before is not None and after is not None and diff_low is not None and diff_high is not None
        if entry.get("after_ci") is None and has_diff:
            span = f"{_percent(before + diff_low)} to {_percent(before + diff_high)}"
            tip = f"{name}: before + 95% CI of the difference, {span}"
            parts.append(_error_bar(center + 15.0, clamp(before + diff_low), clamp(before + diff_high), "#374151", tip))
        parts.append(
            f'<text x="{center:.1f}" y="{frame.height - frame.bottom + 16:.1f}" text-anchor="middle">'
            f"{_e(_short(name, 10))}<title>{_e(name)}</title></text>"
        )
    parts.append("</svg>")
    return "".join(parts)


def _forest_plot(rows: list[tuple[str, Mapping[str, Any]]]) -> str:
    """The paired difference per domain (dot) with its 95% CI (line) against zero."""
    row_height = 30.0
    label_width = 130.0
    frame = _Frame(440, 56 + row_height * len(rows), left=label_width, right=16, top=30, bottom=30)
    values = []
    for _, entry in rows:
        values += [v for v in (_finite(entry.get(k)) for k in ("diff", "ci_low", "ci_high")) if v is not None]
    extent = min(1.0, max([abs(v) for v in values] + [0.05]) * 1.1)
    ticks, step = _nice_ticks(-extent, extent, count=4)
    frame.x_range = (max(-1.0, ticks[0]), min(1.0, ticks[-1]))
    ticks = [t for t in ticks if frame.x_range[0] - 1e-9 <= t <= frame.x_range[1] + 1e-9]
    fmt = _tick_format(round(step * 100, 9))
    parts = [frame.open("paired difference after minus before"), _title(frame, "Δ after − before (points, 95% CI)")]
    parts.append(frame.x_ticks(ticks, lambda v: fmt(100 * v), grid=True))
    zero = frame.x(0.0)
    parts.append(_segment(zero, frame.top, zero, frame.height - frame.bottom, "#6b7280", ' stroke-dasharray="3 3"'))
    left_edge, right_edge = frame.x(frame.x_range[0]), frame.x(frame.x_range[1])
    for index, (name, entry) in enumerate(rows):
        y = frame.top + row_height * (index + 0.5)
        parts.append(
            f'<text x="{label_width - 8:.1f}" y="{y + 4:.1f}" text-anchor="end">'
            f"{_e(_short(name, 16))}<title>{_e(name)}</title></text>"
        )
        diff, low, high = _finite(entry.get("diff")), _number(entry.get("ci_low")), _number(entry.get("ci_high"))
        if diff is None:
            continue
        color = _direction_color(low, high)
        if low is not None and high is not None:
            x_low = max(left_edge, min(right_edge, frame.x(max(-2.0, low))))
            x_high = max(left_edge, min(right_edge, frame.x(min(2.0, high))))
            parts.append(_segment(x_low, y, x_high, y, color, ' stroke-width="2"'))
        tip = f"{name}: {_points(diff)} pts, 95% CI {_points(low)} to {_points(high)}"
        parts.append(
            f'<circle cx="{frame.x(diff):.1f}" cy="{y:.1f}" r="4.5" fill="{color}"><title>{_e(tip)}</title></circle>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _direction_color(low: float | None, high: float | None) -> str:
    if low is not None and low > 0:
        return UP_COLOR
    if high is not None and high < 0:
        return DOWN_COLOR
    return FLAT_COLOR


# ------------------------------------------------------------------------------------------------
# Sections


def _empty_section(title: str, message: str) -> str:
    return f'<section><h2>{_e(title)}</h2><p class="empty">{_e(message)}</p></section>'


def _run_section(summary: Mapping[str, Any]) -> str:
    run = summary.get("run")
    if not isinstance(run, Mapping) or not run:
        return ""
    items = "".join(
        f"<div><dt>{_e(_info_label(str(key)))}</dt><dd>{_e(_info_value(str(key), value))}</dd></div>"
        for key, value in run.items()
    )
    return f'<section><h2>Run</h2><dl class="info">{items}</dl></section>'


def _rate_cell(entry: Mapping[str, Any], key: str) -> str:
    text = _e(_percent(entry.get(key)))
    low, high = _pair(entry.get(f"{key}_ci"))
    if low is not None and high is not None:
        text += f' <span class="ci">[{_e(_percent(low))}, {_e(_percent(high))}]</span>'
    return f"<td>{text}</td>"


def _p_value(value: Any) -> str:
    number = _finite(value)
    if number is None:
        return "—"
    return "&lt;0.001" if number < 0.001 else f"{number:.3f}"


def _results_section(summary: Mapping[str, Any]) -> str:
    domains = summary.get("domains")
    domains = domains if isinstance(domains, Mapping) else {}
    rows = [(str(name), entry) for name, entry in domains.items() if isinstance(entry, Mapping)]
    overall = summary.get("overall")
    overall = overall if isinstance(overall, Mapping) else None
    if not rows and overall is None:
        return _empty_section("Held-out pass rate", "This summary holds no before/after evaluation.")
    table_rows = rows + ([("overall", overall)] if overall is not None else [])
    show_p = any("p_value" in entry for _, entry in table_rows)
    show_flips = any("wins" in entry for _, entry in table_rows)
    head = "<tr><th>Domain</th><th>Tasks</th><th>Before</th><th>After</th><th>Δ (pts)</th><th>95% CI of Δ</th>"
    head += "<th>p</th>" if show_p else ""
    head += '<th title="tasks that improved / got worse / did not change">up / down / same</th>' if show_flips else ""
    head += "</tr>"
    body = []
    for index, (name, entry) in enumerate(table_rows):
        low, high = _number(entry.get("ci_low")), _number(entry.get("ci_high"))
        direction = {UP_COLOR: "up", DOWN_COLOR: "down"}.get(_direction_color(low, high), "flat")
        n = _finite(entry.get("n"))
        cells = [
            f"<td>{_e(name)}</td>",
            f"<td>{'—' if n is None else f'{n:.0f}'}</td>",
            _rate_cell(entry, "before"),
            _rate_cell(entry, "after"),
            f'<td class="{direction}">{_e(_points(entry.get("diff")))}</td>',
            f'<td class="ci">{_e(_points(low))} to {_e(_points(high))}</td>',
        ]
        if show_p:
            cells.append(f"<td>{_p_value(entry.get('p_value'))}</td>")
        if show_flips:
            counts = [_finite(entry.get(key)) for key in ("wins", "losses", "ties")]
            cells.append(f"<td>{' / '.join('—' if c is None else f'{c:.0f}' for c in counts)}</td>")
        css = ' class="overall"' if overall is not None and index == len(table_rows) - 1 else ""
        body.append(f"<tr{css}>{''.join(cells)}</tr>")
    charts = _bar_chart(table_rows) + _forest_plot(table_rows)
    legend = _legend([("before RL", BEFORE_COLOR), ("after RL", AFTER_COLOR)])
    return (
        f"<section><h2>Held-out pass rate, before and after RL</h2>"
        f"<table><thead>{head}</thead><tbody>{''.join(body)}</tbody></table>"
        f'<p class="note">Δ = after − before in percentage points, paired over the same held-out tasks; '
        f'green: the 95% CI lies above zero, red: below zero, grey: it includes zero.</p>'
        f'<div style="margin-top:16px">{legend}<div class="charts">{charts}</div></div>'
        f'<p class="note">Whiskers on the bars: the 95% CI of each pass rate where given; otherwise, on the after '
        f"bar, the before rate plus the 95% CI of the paired difference.</p></section>"
    )


def _series(metrics: Sequence[Mapping[str, Any]]) -> dict[str, list[Point]]:
    """key -> (step, value) points, from rows that have a numeric step; sorted by step."""
    found: dict[str, list[Point]] = {}
    for row in metrics:
        if not isinstance(row, Mapping):
            continue
        step = _finite(row.get("step"))
        if step is None:
            continue
        for key, value in row.items():
            number = _finite(value)
            if number is not None and key != "step":
                found.setdefault(str(key), []).append((step, number))
    for points in found.values():
        points.sort(key=lambda p: p[0])
    return found


def _reward_section(series: dict[str, list[Point]]) -> str:
    domains = sorted(k for k in series if k.startswith("reward/") and k != "reward/mean")
    lines = [_Line(key.removeprefix("reward/"), PALETTE[i % len(PALETTE)], series[key]) for i, key in enumerate(domains)]
    if "reward/mean" in series:
        lines.append(_Line("mean", MEAN_COLOR, series["reward/mean"], width=2.8))
    if not lines:
        return _empty_section("Reward during RL", "No reward metrics were recorded.")
    legend = _legend([(line.label, line.color) for line in lines])
    return f"<section><h2>Reward during RL</h2>{legend}{_line_chart(lines, 'Mean reward per domain')}</section>"


def _other_section(series: dict[str, list[Point]], names: Sequence[str] | None) -> str:
    if names is None:
        names = [k for k in series if not k.startswith("reward/") and k not in SKIPPED_SERIES]
    present = [name for name in names if series.get(name)]
    if not present:
        return ""
    charts = [
        _line_chart([_Line(name, AFTER_COLOR, series[name])], name, width=340, height=190)
        for name in present[:MAX_SMALL_CHARTS]
    ]
    note = ""
    if len(present) > MAX_SMALL_CHARTS:
        note = f'<p class="note">{len(present) - MAX_SMALL_CHARTS} more series not drawn; pass `series=` to choose.</p>'
    return f'<section><h2>Training metrics</h2><div class="grid">{"".join(charts)}</div>{note}</section>'


# ------------------------------------------------------------------------------------------------
# Entry points


def render_report(
    summary: Mapping[str, Any], metrics: Sequence[Mapping[str, Any]], *, series: Sequence[str] | None = None
) -> str:
    """The report as an HTML string. `series` picks the small-multiple charts (default: every
    numeric metric except step and reward/*, in order of first appearance)."""
    run = summary.get("run") if isinstance(summary.get("run"), Mapping) else {}
    name = run.get("name") if isinstance(run, Mapping) else None
    title = f"tidal run report — {name}" if name else "tidal run report"
    subtitle = " · ".join(str(run[k]) for k in ("model",) if isinstance(run, Mapping) and run.get(k))
    points = _series(metrics)
    generated = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    body = [
        f"<h1>{_e(title)}</h1>",
        f'<p class="sub">{_e(subtitle) + " · " if subtitle else ""}generated {_e(generated)}</p>',
        _run_section(summary),
        _results_section(summary),
        _reward_section(points) if metrics else "",
        _other_section(points, series) if metrics else "",
    ]
    if not metrics:
        body.append(_empty_section("Training metrics", "No metrics were recorded for this run."))
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)}</title><style>{CSS}</style></head>"
        f"<body><main>{''.join(body)}"
        "<footer>tidal · a self-contained report: no scripts, no external resources</footer>"
        "</main></body></html>\n"
    )


def write_report(
    path: str | Path,
    summary: Mapping[str, Any],
    metrics: Sequence[Mapping[str, Any]],
    *,
    series: Sequence[str] | None = None,
) -> Path:
    """Render the report and write it to `path` (temp file + rename, so a reader never sees half)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.tmp")
    temp.write_text(render_report(summary, metrics, series=series), encoding="utf-8")
    temp.replace(path)
    return path
