import math
import re
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from tidal.eval.report import MAX_POINTS, render_report, write_report

HOSTILE = "<script>alert(1)</script>"


def summary() -> dict[str, Any]:
    return {
        "run": {"name": "20250101-120000", "model": "tiny", "duration_s": 3723.4, "steps": 50, "tags": ["a", "b"]},
        "domains": {
            "code": {"before": 0.30, "after": 0.55, "diff": 0.25, "ci_low": 0.10, "ci_high": 0.40, "n": 60},
            "math": {"before": 0.60, "after": 0.58, "diff": -0.02, "ci_low": -0.15, "ci_high": 0.11, "n": 60},
            HOSTILE: {"before": 0.2, "after": 0.25, "diff": 0.05, "ci_low": -0.1, "ci_high": 0.2, "n": 10},
        },
        "overall": {"before": 0.40, "after": 0.49, "diff": 0.09, "ci_low": 0.02, "ci_high": 0.16, "n": 130, "p_value": 0.012},
    }


def metrics(steps: int = 30) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = [{"event": "start"}]  # no step: skipped
    for step in range(1, steps + 1):
        rows.append(
            {
                "step": step,
                "reward/code": 0.3 + step / 100,
                "reward/math": 0.5 + step / 200,
                "reward/mean": 0.4 + step / 150,
                "loss": 1.0 / step,
                "entropy": 2.0 - step / 50,
                "kept_fraction": 0.75,
            }
        )
    return rows


def svgs(text: str) -> list[str]:
    return re.findall(r"<svg.*?</svg>", text, flags=re.S)


class TagBalance(HTMLParser):
    VOID = {"meta", "br", "img", "input", "link", "hr"}  # HTML void elements; SVG ones self-close

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.attributes: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.attributes.update(name for name, _ in attrs)
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.attributes.update(name for name, _ in attrs)

    def handle_endtag(self, tag: str) -> None:
        assert self.stack and self.stack[-1] == tag, (tag, self.stack[-5:])
        self.stack.pop()


def test_report_with_metrics(tmp_path: Path) -> None:
    path = write_report(tmp_path / "out" / "report.html", summary(), metrics())
    text = path.read_text(encoding="utf-8")
    assert path.name == "report.html"
    assert text.startswith("<!DOCTYPE html>")
    assert "<svg" in text
    for name in ("code", "math", "overall", "20250101-120000", "1h 02m 03s"):
        assert name in text
    assert "+25.0" in text and "−2.0" in text  # differences in points
    assert "0.012" in text  # overall p-value
    assert "up / down / same" not in text  # no win/loss counts in this summary
    assert "Mean reward per domain" in text
    for series in ("loss", "entropy", "kept_fraction"):
        assert f">{series}</text>" in text
    assert len(svgs(text)) == 2 + 1 + 3  # bars, differences, reward, small multiples
    assert not list(tmp_path.glob("out/.*"))  # no temp file left behind


def test_report_is_self_contained_and_escaped(tmp_path: Path) -> None:
    data = summary()
    data["run"]["note"] = '"><img src=x onerror=alert(2)>'
    rows = metrics()
    rows[1][HOSTILE] = 1.0
    rows[2]["reward/" + HOSTILE] = 0.5
    text = render_report(data, rows)
    assert "<script" not in text.lower()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert "<img" not in text
    assert "Content-Security-Policy" in text
    assert "://" not in text.replace('xmlns="http://www.w3.org/2000/svg"', "")
    for svg in svgs(text):
        ET.fromstring(svg)  # every chart is well-formed XML, so escaping held in attributes too
    checker = TagBalance()
    checker.feed(text)
    assert checker.stack == []
    assert not {"src", "href"} & checker.attributes
    assert not [name for name in checker.attributes if name.startswith("on")]


def test_report_without_metrics(tmp_path: Path) -> None:
    text = write_report(tmp_path / "r.html", summary(), []).read_text()
    assert "No metrics were recorded" in text
    assert "code" in text and "overall" in text
    assert len(svgs(text)) == 2  # the before/after charts only


def test_report_with_empty_summary() -> None:
    text = render_report({}, [])
    assert "holds no before/after evaluation" in text
    assert "<table" not in text


def test_missing_and_unbounded_values_render() -> None:
    data = {
        "domains": {
            "tiny": {"before": 1.0, "after": 0.0, "diff": -1.0, "ci_low": -math.inf, "ci_high": math.inf, "n": 1},
            "odd": {"before": None, "after": "n/a", "diff": float("nan")},
        },
        "overall": {"before": 0.5, "after": 0.5, "diff": 0.0, "ci_low": 0.0, "ci_high": 0.0, "n": 2, "p_value": 1.0},
    }
    text = render_report(data, [{"step": 1, "reward/mean": 0.5}])
    assert "−∞ to +∞" in text
    assert "—" in text
    assert "nan" not in text.lower().replace("nan(", "")
    for svg in svgs(text):
        ET.fromstring(svg)


def test_rate_intervals_are_shown_when_given() -> None:
    data = summary()
    data["domains"]["code"]["before_ci"] = [0.2, 0.41]
    data["domains"]["code"]["after_ci"] = [0.43, 0.66]
    text = render_report(data, [])
    assert "[20.0%, 41.0%]" in text and "[43.0%, 66.0%]" in text
    assert "code after 95% CI: 43.0% to 66.0%" in text


def test_series_selection_and_long_series_are_thinned() -> None:
    rows = [{"step": s, "loss": math.sin(s / 50.0), "reward/mean": s / 5000, "entropy": 1.0} for s in range(5000)]
    rows[2500]["loss"] = 50.0  # a spike must survive thinning
    text = render_report({}, rows, series=["loss"])
    charts = svgs(text)
    assert len(charts) == 2  # reward + loss only
    loss_path = re.search(r'<path d="([^"]+)"', charts[1])
    assert loss_path is not None
    assert loss_path.group(1).count("L") <= MAX_POINTS + 2
    ys = [float(y) for y in re.findall(r"[ML][\d.]+,([\d.]+)", loss_path.group(1))]
    highest, second = sorted(ys)[:2]  # pixel y grows downwards
    assert highest < second - 50  # the lone spike survived thinning


def test_win_loss_counts_are_shown_when_given() -> None:
    data = summary()
    data["overall"].update(wins=30, losses=18, ties=82)
    text = render_report(data, [])
    assert "up / down / same" in text and "30 / 18 / 82" in text and "— / — / —" in text
