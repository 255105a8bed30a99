"""The selection checklist: each threshold of `EvalSettings.checklist` as a pass/fail item, with
links to the traces that explain a failure.

Items (a null threshold leaves its item out):
- non-inferiority to a baseline eval: the lower 95% bound of the paired bootstrap difference
  (candidate − baseline, per-task scores over the tasks both ran) is above −margin;
- cost cap: mean cost per task at most the cap;
- format compliance floor: share of valid tool-call turns;
- pass^k floor, k = the number of epochs (reliability: every one of k tries passes);
- minimum pass rate.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tidal.eval.settings import Checklist

MAX_LINKS = 8


def _item(name: str, threshold: str, value: float | None, passed: bool | None, detail: str,
          links: list[dict[str, Any]]) -> dict[str, Any]:
    return {"name": name, "threshold": threshold, "value": value, "passed": passed, "detail": detail,
            "links": links[:MAX_LINKS]}


def _link(record: dict[str, Any], note: str) -> dict[str, Any]:
    return {"task_id": record["task_id"], "epoch": record["epoch"], "trace": record.get("trace", ""), "note": note}


def evaluate_checklist(summary: dict[str, Any], records: Sequence[dict[str, Any]], thresholds: Checklist,
                       epochs: int, baseline: Sequence[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The checklist of one model's eval (see the module docstring)."""
    scored = [r for r in records if r["outcome"] not in ("infra_error", "verifier_error")]
    items: list[dict[str, Any]] = []
    if thresholds.non_inferiority_margin is not None:
        items.append(_non_inferiority(records, baseline, thresholds.non_inferiority_margin))
    if thresholds.cost_cap is not None:
        cost = summary.get("cost_per_task")
        costly = sorted(scored, key=lambda r: -float(r.get("cost") or 0.0))
        items.append(_item("cost per task", f"≤ {thresholds.cost_cap:g}", cost,
                           None if cost is None else cost <= thresholds.cost_cap, "mean over scored episodes",
                           [_link(r, f"cost {float(r.get('cost') or 0):.4g}") for r in costly]))
    if thresholds.format_compliance_floor is not None:
        value = summary.get("format_compliance")
        worst = sorted((r for r in scored if r.get("calls_invalid")), key=lambda r: -int(r["calls_invalid"]))
        items.append(_item("tool-call format compliance", f"≥ {thresholds.format_compliance_floor:.0%}", value,
                           None if value is None else value >= thresholds.format_compliance_floor,
                           f"recovery after a bad call: {_pct(summary.get('recovery_rate'))}",
                           [_link(r, f"{r['calls_invalid']} invalid turn(s)") for r in worst]))
    if thresholds.pass_hat_k_floor is not None:
        value = summary.get("pass_hat_k", {}).get(str(epochs))
        flaky = [r for r in scored if not r["passed"]]
        items.append(_item(f"pass^{epochs}", f"≥ {thresholds.pass_hat_k_floor:.0%}", value,
                           None if value is None else value >= thresholds.pass_hat_k_floor,
                           f"every one of {epochs} tries passes", [_link(r, r["outcome"]) for r in flaky]))
    if thresholds.min_pass_rate is not None:
        value = summary.get("pass_rate")
        items.append(_item("pass rate", f"≥ {thresholds.min_pass_rate:.0%}", value,
                           None if value is None else value >= thresholds.min_pass_rate, "task-clustered 95% CI "
                           + "–".join(_pct(v) for v in summary.get("ci", [])),
                           [_link(r, r["outcome"]) for r in scored if not r["passed"]]))
    return items


def _pct(value: Any) -> str:
    return "n/a" if value is None else f"{100 * float(value):.1f}%"


def _non_inferiority(records: Sequence[dict[str, Any]], baseline: Sequence[dict[str, Any]] | None,
                     margin: float) -> dict[str, Any]:
    name, threshold = "non-inferior to the baseline", f"Δ lower bound > −{margin:.0%}"
    if not baseline:
        return _item(name, threshold, None, None, "no baseline eval given (--baseline)", [])
    from tidal.eval.compare import paired_bootstrap, scores_from_records

    mine, theirs = scores_from_records("candidate", records), scores_from_records("baseline", baseline)
    shared = sorted(set(mine.scores) & set(theirs.scores))
    if not shared:
        return _item(name, threshold, None, None, "the baseline ran none of these tasks", [])
    diff, low, high = paired_bootstrap([theirs.scores[t] for t in shared], [mine.scores[t] for t in shared])
    worse = [t for t in shared if mine.scores[t] < theirs.scores[t]]
    links = [_link(r, "worse than the baseline") for r in records if r["task_id"] in worse and not r["passed"]]
    return _item(name, threshold, diff, low > -margin,
                 f"Δ {100 * diff:+.1f} pts, 95% CI {100 * low:+.1f} to {100 * high:+.1f}, {len(shared)} tasks", links)
