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

import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tidal.errors import EvalError
from tidal.eval.settings import EvalSettings
from tidal.eval.sweep_report import PLOT, SWEEP, plot_svg
from tidal.storage.run import atomic_writer, dumps

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
        handle.write(plot_svg(points))
    views = [view_of(folder, settings) for folder in reversed(folders)]  # the longest context first
    write_eval_report(views, out / "report.html", title="Context-length sweep")
    return result
