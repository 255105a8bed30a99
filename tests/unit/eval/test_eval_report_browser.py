"""report.html in headless Chromium at 800, 1200 and 1600 px: every table fits its card (wide ones
scroll inside it), first columns keep a readable width, nothing pushes the page wider than the
viewport, the headline is there, no console errors, and the screenshot is not blank."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from tidal.eval.harness import finish_eval
from tidal.eval.settings import Checklist, EvalSettings

MODEL = "openai:gpt-4o-mini@https://api.example.com/v1"
LONG = "terminal/fix-the-broken-build-in-a-deeply-nested-subdirectory-number-"
OUTCOMES = ["pass", "fail", "step_limit", "format_error", "timeout", "pass", "context_exceeded", "pass"]
MIN_FIRST_COLUMN_PX = 80

LAYOUT = """() => {
  const problems = [];
  const width = document.documentElement.clientWidth;
  if (document.documentElement.scrollWidth > width + 1)
    problems.push(`page ${document.documentElement.scrollWidth}px wide in a ${width}px viewport`);
  for (const table of document.querySelectorAll('table')) {
    const card = table.closest('section').getBoundingClientRect();
    const box = (table.closest('.scroll') || table).getBoundingClientRect();
    if (box.right > card.right + 1 || box.left < card.left - 1)
      problems.push(`a table's box [${box.left}, ${box.right}] leaves its card [${card.left}, ${card.right}]`);
    for (const row of table.rows) {
      const first = row.cells[0];
      if (first && first.getBoundingClientRect().width < MIN)
        problems.push(`first column ${first.getBoundingClientRect().width}px: "${first.textContent.slice(0, 40)}"`);
    }
  }
  for (const el of document.querySelectorAll('main *')) {
    if (el.closest('.scroll')) continue;  // scrolls inside its card
    const box = el.getBoundingClientRect();
    if (box.width && (box.right > width + 1 || box.left < -1))
      problems.push(`${el.tagName} [${box.left}, ${box.right}] outside the viewport`);
  }
  const fits = [...document.querySelectorAll('.scroll')].every(s => s.scrollWidth <= s.clientWidth + 1);
  return {problems: problems.slice(0, 20), fits};
}""".replace("MIN", str(MIN_FIRST_COLUMN_PX))

PIXELS = """async (url) => {
  const image = new Image();
  image.src = url;
  await image.decode();
  const canvas = document.createElement('canvas');
  canvas.width = image.width; canvas.height = image.height;
  const context = canvas.getContext('2d');
  context.drawImage(image, 0, 0);
  const data = context.getImageData(0, 0, image.width, image.height).data;
  const colors = new Set();
  let dark = 0;
  for (let i = 0; i < data.length; i += 4 * 7) {
    colors.add((data[i] << 16) | (data[i + 1] << 8) | data[i + 2]);
    if (data[i] + data[i + 1] + data[i + 2] < 300) dark++;
  }
  return {width: image.width, colors: colors.size, dark: dark / (data.length / 28)};
}"""


def _eval_folder(out: Path) -> Path:
    """An eval folder with long task ids, several outcomes and a failing checklist full of links."""
    tasks = [f"{LONG}{i}" for i in range(6)] + ["math/gsm8k-0001", "knowledge/capital-of-somewhere"]
    (out / "traces").mkdir(parents=True)
    records = []
    for epoch in range(2):
        for index, task in enumerate(tasks):
            outcome = OUTCOMES[(index + epoch) % len(OUTCOMES)]
            trace = f"traces/t{index}-e{epoch}.json"
            (out / trace).write_text("{}", encoding="utf-8")
            records.append({"task_id": task, "epoch": epoch, "model": MODEL, "kind": "episode",
                            "domain": task.split("/")[0], "group": task, "outcome": outcome,
                            "passed": outcome == "pass", "steps": 3, "calls_valid": 2, "calls_invalid": 1,
                            "recoveries": 1, "failures_followed": 1, "cost": 0.01, "max_steps": 5,
                            "tokens_in": 1000, "tokens_out": 100, "latency_s": 3.0, "generation_s": 2.0,
                            "tool_s": 0.5, "overhead_s": 0.5, "trace": trace, "detail": "why it ended"})
    (out / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    (out / "eval.json").write_text(json.dumps({"model": MODEL, "epochs": 2, "tasks": tasks, "settings": {}}),
                                   encoding="utf-8")
    settings = EvalSettings(checklist=Checklist(cost_cap=0.005, pass_hat_k_floor=0.5, min_pass_rate=0.5))
    finish_eval(out, settings)
    return out / "report.html"


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _eval_folder(tmp_path_factory.mktemp("eval") / "candidate")


@pytest.mark.parametrize("width", [800, 1200, 1600])
def test_report_layout_holds_at_width(report: Path, open_page: Any, width: int, tmp_path: Path) -> None:
    page = open_page(report.as_uri(), width=width)
    layout = page.evaluate(LAYOUT)
    assert layout["problems"] == []
    if width >= 1200:  # wide enough that no table needs its scroll bar
        assert layout["fits"]
    headline = page.inner_text("h1")
    assert headline == "Evaluation" and MODEL in page.inner_text("main h3")
    assert "Selection checklist" in page.inner_text("main")
    shot = tmp_path / f"report-{width}.png"
    page.screenshot(path=str(shot), full_page=True)
    blank = open_page("about:blank", width=width)
    url = "data:image/png;base64," + base64.b64encode(shot.read_bytes()).decode("ascii")
    pixels = blank.evaluate(PIXELS, url)
    assert pixels["width"] == width  # the page is no wider than the viewport
    assert pixels["colors"] > 20 and 0.002 < pixels["dark"] < 0.5  # text and charts drawn, not blank
    assert page.tidal_errors == [] and blank.tidal_errors == []


@pytest.mark.parametrize("width", [800, 1600])
def test_index_page_layout_holds_at_width(tmp_path: Path, open_page: Any, width: int) -> None:
    from tidal.eval.index import trend_of_folders
    from tidal.eval.index_report import write_index_outputs

    first = _eval_folder(tmp_path / "v1").parent
    second = tmp_path / "v2"
    second.mkdir()
    for name in ("eval.json", "results.jsonl"):
        (second / name).write_text((first / name).read_text(encoding="utf-8"), encoding="utf-8")
    paths = write_index_outputs(trend_of_folders([f"{first}:version-1", f"{second}:version-2"]), tmp_path / "index")
    page = open_page(paths["html"].as_uri(), width=width)
    layout = page.evaluate(LAYOUT)
    assert layout["problems"] == [] and page.inner_text("h1") == "Intelligence index"
    assert page.locator("svg circle").count() == 2 and "version-1 → version-2" in page.inner_text("main")
    assert page.tidal_errors == []
