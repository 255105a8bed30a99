"""Metrics of an evaluation, from its results records (harness.py), with their uncertainty.

- outcomes: counts of every outcome (agent/records.py's taxonomy); infra and verifier errors are
  reported apart and left out of every rate (they say nothing about the model);
- pass rate with its 95% interval clustered by task (stats.clustered_interval; by the tasks'
  `group` when tasks share one): episodes of one task are correlated, identical at temperature 0,
  so the interval is never narrower than the one over tasks would be when repeats agree; also a
  cluster-robust standard error (compare.cluster_se) over tasks when there are several epochs;
- pass@k (unbiased, 1 − C(n−c,k)/C(n,k), Chen et al. 2021) for k = 1..epochs (k = 1 only at
  temperature 0), each with a task-clustered 95% interval (`clustered_mean_interval`), and pass^k
  (C(c,k)/C(n,k)) averaged over tasks;
- per domain: episodes, pass rate, the same task-clustered interval;
- distributions (mean, p50, p90, max) of steps, tokens, cost and latency, and the latency split
  Σ generation + Σ tool + Σ overhead;
- tool-call format compliance (valid turns / turns) and recovery (invalid turns followed by a
  valid one / invalid turns that had a next turn), over agent episodes only (an answer to a
  single-turn task calls no tool);
- success against the step budget: the share of episodes that passed within b steps, for each b.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np

from tidal.agent.records import AgentOutcome
from tidal.eval.speed import speed_summary
from tidal.eval.stats import clustered_interval, pass_at_k, pass_hat_k

APART = {AgentOutcome.INFRA_ERROR.value, AgentOutcome.VERIFIER_ERROR.value}
DISTRIBUTED = ("steps", "tokens_in", "tokens_out", "cost", "latency_s", "generation_s", "tool_s", "overhead_s")


def distribution(values: Sequence[float]) -> dict[str, float] | None:
    if not values:
        return None
    array = np.asarray(values, dtype=np.float64)
    return {"mean": float(array.mean()), "p50": float(np.percentile(array, 50)),
            "p90": float(np.percentile(array, 90)), "max": float(array.max()), "sum": float(array.sum())}


def _cluster_se(values: list[float], groups: list[str]) -> float | None:
    from tidal.eval.compare import cluster_se

    if len(set(groups)) < 2:
        return None
    value = cluster_se(values, groups)
    return value if math.isfinite(value) else None


def _rate(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Pass rate of scored records, with the interval clustered by their `group` (the task id
    unless tasks share a group)."""
    clusters: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for record in records:
        cell = clusters[str(record.get("group") or record["task_id"])]
        cell[0] += bool(record["passed"])
        cell[1] += 1
    interval = clustered_interval([c[0] for c in clusters.values()], [c[1] for c in clusters.values()])
    passed, n = sum(c[0] for c in clusters.values()), len(records)
    return {"n": n, "passed": passed, "pass_rate": passed / n if n else None, "ci": [interval.low, interval.high],
            "clusters": interval.clusters, "design_effect": interval.design_effect}


def clustered_mean_interval(estimates: dict[str, float], group_of: dict[str, str]) -> tuple[float, float]:
    """The 95% interval of the mean of per-task estimates in [0, 1] (pass@k), clustered by task
    group: the Wilson interval at n = the number of groups, each group's mean one draw. Its
    binomial variance p(1-p)/G bounds the variance of a mean of G values in [0, 1] with mean p,
    so it is valid for fractional estimates and stays finite at 0 and 1."""
    groups: dict[str, list[float]] = defaultdict(list)
    for task, value in estimates.items():
        groups[group_of.get(task, task)].append(value)
    means = [float(np.mean(values)) for values in groups.values()]
    interval = clustered_interval(means, [1] * len(means))
    return interval.low, interval.high


def summarize(records: Sequence[dict[str, Any]], epochs: int = 1, temperature: float | None = None) -> dict[str, Any]:
    """The metrics of one eval's records (one per task and epoch; see the module docstring).
    `temperature` 0 (greedy) reports pass@1 only: identical repeats say nothing about pass@k."""
    outcomes: dict[str, int] = defaultdict(int)
    for record in records:
        outcomes[record["outcome"]] += 1
    scored = [r for r in records if r["outcome"] not in APART]
    passes = [1.0 if r["passed"] else 0.0 for r in scored]
    summary: dict[str, Any] = {
        "episodes": len(records), "scored": len(scored), "outcomes": dict(sorted(outcomes.items())),
        "infra_errors": outcomes.get(AgentOutcome.INFRA_ERROR.value, 0),
        "verifier_errors": outcomes.get(AgentOutcome.VERIFIER_ERROR.value, 0),
        **_rate(scored),
    }
    summary["interval"] = {"method": "Wilson at the task-clustered effective sample size", "confidence": 0.95,
                           "clusters": summary["clusters"], "samples": len(scored),
                           "design_effect": summary["design_effect"]}
    by_task = [str(r["task_id"]) for r in scored]
    by_group = [str(r.get("group") or r["task_id"]) for r in scored]
    summary["cluster_se_task"] = _cluster_se(passes, by_task) if len(set(by_task)) < len(by_task) else None
    summary["cluster_se_group"] = _cluster_se(passes, by_group) if len(set(by_group)) < len(set(by_task)) else None

    per_task: dict[str, list[bool]] = defaultdict(list)
    group_of: dict[str, str] = {}
    for record in scored:
        per_task[record["task_id"]].append(bool(record["passed"]))
        group_of[record["task_id"]] = str(record.get("group") or record["task_id"])
    pass_k: dict[str, float] = {}
    pass_k_ci: dict[str, list[float]] = {}
    hat_k: dict[str, float] = {}
    greedy = temperature is not None and temperature == 0  # identical repeats: pass@k = pass@1
    for k in range(1, max(1, epochs) + 1):
        eligible = {t: v for t, v in per_task.items() if len(v) >= k}
        if eligible:
            if k == 1 or not greedy:
                estimates = {t: pass_at_k(len(v), sum(v), k) for t, v in eligible.items()}
                pass_k[str(k)] = float(np.mean(list(estimates.values())))
                pass_k_ci[str(k)] = list(clustered_mean_interval(estimates, group_of))
            hat_k[str(k)] = float(np.mean([pass_hat_k(len(v), sum(v), k) for v in eligible.values()]))
    summary["pass_at_k"], summary["pass_at_k_ci"], summary["pass_hat_k"] = pass_k, pass_k_ci, hat_k

    domains: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in scored:
        domains[record["domain"]].append(record)
    summary["domains"] = {d: _rate(rs) for d, rs in sorted(domains.items())}

    summary["distributions"] = {key: distribution([float(r.get(key) or 0.0) for r in scored if key != "cost"
                                                   or r.get("cost") is not None]) for key in DISTRIBUTED}
    episodes = [r for r in scored if r.get("kind", "episode") == "episode"]
    turns = sum(int(r.get("steps", 0)) for r in episodes)
    valid = sum(int(r.get("calls_valid", 0)) for r in episodes)
    followed = sum(int(r.get("failures_followed", 0)) for r in episodes)
    recovered = sum(int(r.get("recoveries", 0)) for r in episodes)
    summary["format_compliance"] = valid / turns if turns else None
    summary["recovery_rate"] = recovered / followed if followed else None
    summary["latency_split"] = {key: float(sum(float(r.get(key) or 0.0) for r in scored))
                                for key in ("generation_s", "tool_s", "overhead_s")}
    unpriced = sum(1 for r in scored if "cost" in r and r["cost"] is None)  # no price applied: unknown, not 0
    summary["cost_unknown"] = unpriced
    summary["cost_per_task"] = (float(np.mean([float(r.get("cost") or 0.0) for r in scored]))
                                if scored and not unpriced else None)
    summary.update(speed_summary(scored))
    budget = max([int(r.get("max_steps") or 0) for r in scored] + [int(r.get("steps", 0)) for r in scored] + [0])
    summary["success_by_steps"] = [
        [b, sum(1 for r in scored if r["passed"] and int(r.get("steps", 0)) <= b) / len(scored)]
        for b in range(1, budget + 1)] if scored else []
    return summary
