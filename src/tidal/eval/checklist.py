"""The selection checklist: each threshold of `EvalSettings.checklist` as a pass/fail item, with
links to the traces that explain a failure.

Items (a null threshold leaves its item out):
- non-inferiority to a baseline eval: the lower 95% bound of the paired bootstrap difference
  (candidate − baseline, per-task scores over the tasks both ran) is above −margin;
- cost cap: mean cost per task at most the cap;
- format compliance floor: share of valid tool-call turns;
- pass^k floor, k = the number of epochs (reliability: every one of k tries passes);
- minimum pass rate;
- output speed: mean tokens/s per task at least the floor; mean time to first token per task at
  most the ceiling (n/a where not measured: a non-streaming endpoint);
- context use: the share of episodes that ended `context_exceeded` at most the ceiling;
- tool stability: the share of tool calls that ran and failed at most the ceiling, and the share
  of failures followed by a successful call in the same episode at least the floor.

A value that could not be computed (no price: cost "unknown"; no tool calls) makes its item n/a,
never a pass.
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
        detail = ("mean over scored episodes" if cost is not None else
                  f"unknown: no price applies to {summary.get('cost_unknown', 0)} episode(s); set prices in the "
                  "config or --price-in/--price-out")
        items.append(_item("cost per task", f"≤ {thresholds.cost_cap:g}", cost,
                           None if cost is None else cost <= thresholds.cost_cap, detail,
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
    items.extend(_speed_items(summary, scored, thresholds))
    items.extend(_stability_items(summary, scored, thresholds))
    return items


def _ci_text(entry: dict[str, Any] | None, unit: str, scale: float = 1.0) -> str:
    if not entry or not entry.get("ci"):
        return ""
    low, high = entry["ci"]
    return f"95% CI {scale * low:.3g}–{scale * high:.3g}{unit}"


def _speed_items(summary: dict[str, Any], scored: Sequence[dict[str, Any]], thresholds: Checklist) -> list[dict[str, Any]]:
    speed, items = summary.get("speed") or {}, []
    if thresholds.min_tokens_per_s is not None:
        entry = speed.get("tokens_per_s_task")
        value = entry["mean"] if entry else None
        slow = sorted((r for r in scored if r.get("tokens_per_s") is not None), key=lambda r: r["tokens_per_s"])
        items.append(_item("output speed (tokens/s)", f"≥ {thresholds.min_tokens_per_s:g}", value,
                           None if value is None else value >= thresholds.min_tokens_per_s,
                           f"mean per task, {_ci_text(entry, ' tokens/s')}" if entry else "no tokens generated",
                           [_link(r, f"{r['tokens_per_s']:.3g} tokens/s") for r in slow]))
    if thresholds.max_first_token_s is not None:
        entry = speed.get("first_token_s_task")
        value = entry["mean"] if entry else None
        late = sorted((r for r in scored if r.get("first_token_s") is not None), key=lambda r: -r["first_token_s"])
        items.append(_item("time to first token (s)", f"≤ {thresholds.max_first_token_s:g}", value,
                           None if value is None else value <= thresholds.max_first_token_s,
                           f"mean per task, {_ci_text(entry, ' s')}" if entry else
                           "not measured (a non-streaming endpoint reports no first-token time)",
                           [_link(r, f"{r['first_token_s']:.3g} s") for r in late]))
    if thresholds.max_context_exceeded_rate is not None:
        value = (summary.get("context") or {}).get("exceeded_rate")
        items.append(_item("context exceeded", f"≤ {thresholds.max_context_exceeded_rate:.0%}", value,
                           None if value is None else value <= thresholds.max_context_exceeded_rate,
                           f"most context read by one turn: p90 {(summary.get('context') or {}).get('max_tokens_p90')}"
                           " tokens", [_link(r, "context_exceeded") for r in scored if r["outcome"] == "context_exceeded"]))
    return items


def _stability_items(summary: dict[str, Any], scored: Sequence[dict[str, Any]],
                     thresholds: Checklist) -> list[dict[str, Any]]:
    tools, items = summary.get("tools") or {}, []
    failing = sorted((r for r in scored if r.get("tool_calls_failed")), key=lambda r: -int(r["tool_calls_failed"]))
    if thresholds.max_failed_call_rate is not None:
        entry = tools.get("failed_call_rate")
        value = entry["rate"] if entry else None
        items.append(_item("failed tool calls", f"≤ {thresholds.max_failed_call_rate:.0%}", value,
                           None if value is None else value <= thresholds.max_failed_call_rate,
                           f"of {entry['events']} calls that ran, {_ci_text(entry, '', 1)}" if entry else "no tool calls",
                           [_link(r, f"{r['tool_calls_failed']} failed call(s)") for r in failing]))
    if thresholds.min_recovery_after_failure is not None:
        entry = tools.get("recovery_after_failure")
        value = entry["rate"] if entry else None
        stuck = [r for r in failing if int(r.get("tool_failures_recovered") or 0) < int(r["tool_calls_failed"])]
        items.append(_item("recovery after a failed call", f"≥ {thresholds.min_recovery_after_failure:.0%}", value,
                           None if value is None else value >= thresholds.min_recovery_after_failure,
                           f"of {entry['events']} failures, {_ci_text(entry, '', 1)}" if entry else "no failed calls",
                           [_link(r, "a failure not followed by a successful call") for r in stuck]))
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
