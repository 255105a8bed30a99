"""Output speed, time to first token, context use and tool stability of an eval: the fields each
record carries (from its steps) and their summary with intervals over tasks.

Per record (harness.py):
- `step_speeds`: per model turn [tokens out, generation seconds, time to first token or None];
  `tokens_per_s` = Σ tokens out / Σ generation seconds of the episode; `first_token_s` = the mean
  time to first token over its turns that measured one (local engines: the wait for a batch slot
  and the prefill; a non-streaming endpoint measures none, and the report says "not measured");
- `max_context_tokens`: the most context tokens one turn read;
- `tool_calls`, `tool_calls_failed` (calls that ran and whose tool reported failure: a non-zero
  exit, a missing file), `tool_failures_recovered` (failures followed later in the same episode by
  a successful call).

Summary (`speed_summary`), over scored records: each speed figure per task (a task's epochs
averaged, then a seeded percentile bootstrap of the mean over tasks, which never reaches below 0 as
a t interval of times does: stats.positive_mean_ci) and per step (the pooled mean of turns with a
percentile bootstrap that resamples tasks, all their turns together, seeded); the failed-call rate
and the recovery rate pooled over calls and failures with the task-clustered Wilson interval
(stats.clustered_interval), like every rate tidal reports.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from tidal.eval.stats import clustered_interval, positive_mean_ci

BOOTSTRAP = 2000
SEED = 0


def step_fields(steps: Iterable[Any]) -> dict[str, Any]:
    """The speed, context and tool-stability fields of one episode's `StepRecord`s."""
    steps = list(steps)
    speeds = [[int(s.tokens_out), float(s.generation_s), s.first_token_s] for s in steps]
    calls = [call for s in steps for call in s.calls]
    recovered = sum(1 for at, call in enumerate(calls) if not call.ok and any(c.ok for c in calls[at + 1:]))
    return {**speed_fields(speeds), "max_context_tokens": max((int(s.tokens_in) for s in steps), default=0),
            "tool_calls": len(calls), "tool_calls_failed": sum(not c.ok for c in calls),
            "tool_failures_recovered": recovered}


def speed_fields(speeds: list[list[Any]]) -> dict[str, Any]:
    """`step_speeds`, `tokens_per_s` and `first_token_s` of turns given as [out, seconds, ttft]."""
    out = sum(s[0] for s in speeds)
    seconds = sum(s[1] for s in speeds)
    ttfts = [float(s[2]) for s in speeds if s[2] is not None]
    return {"step_speeds": speeds, "tokens_per_s": out / seconds if seconds > 0 and out else None,
            "first_token_s": sum(ttfts) / len(ttfts) if ttfts else None}


def _per_task(records: Sequence[Mapping[str, Any]], key: str) -> dict[str, float]:
    values: dict[str, list[float]] = defaultdict(list)
    for record in records:
        if record.get(key) is not None:
            values[str(record["task_id"])].append(float(record[key]))
    return {task: sum(v) / len(v) for task, v in values.items()}


def _task_interval(values: Mapping[str, float]) -> dict[str, Any] | None:
    if not values:
        return None
    mean, low, high = positive_mean_ci(list(values.values()), seed=SEED)
    finite = np.isfinite([low, high]).all()
    return {"mean": mean, "ci": [low, high] if finite else None, "tasks": len(values)}


def _step_interval(records: Sequence[Mapping[str, Any]], index: int) -> dict[str, Any] | None:
    """The pooled per-turn mean of tokens/s (index 0 over 1) or TTFT (index 2), bootstrapped by task."""
    by_task: dict[str, list[float]] = defaultdict(list)
    for record in records:
        for out, seconds, ttft in record.get("step_speeds") or []:
            if index == 2 and ttft is not None:
                by_task[str(record["task_id"])].append(float(ttft))
            elif index == 0 and seconds and seconds > 0 and out:
                by_task[str(record["task_id"])].append(out / seconds)
    if not by_task:
        return None
    sums = np.asarray([sum(v) for v in by_task.values()])
    counts = np.asarray([len(v) for v in by_task.values()], dtype=np.float64)
    mean = float(sums.sum() / counts.sum())
    draws = np.random.default_rng(SEED).integers(0, len(sums), size=(BOOTSTRAP, len(sums)))
    samples = sums[draws].sum(axis=1) / counts[draws].sum(axis=1)
    return {"mean": mean, "ci": [float(np.percentile(samples, 2.5)), float(np.percentile(samples, 97.5))],
            "steps": int(counts.sum()), "tasks": len(sums), "bootstrap": BOOTSTRAP, "seed": SEED}


def _pooled_rate(records: Sequence[Mapping[str, Any]], numerator: str, denominator: str) -> dict[str, Any] | None:
    hits: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for record in records:
        cell = hits[str(record.get("group") or record["task_id"])]
        cell[0] += int(record.get(numerator) or 0)
        cell[1] += int(record.get(denominator) or 0)
    cells = [c for c in hits.values() if c[1]]
    if not cells:
        return None
    rate = clustered_interval([c[0] for c in cells], [c[1] for c in cells])
    return {"rate": rate.rate, "ci": [rate.low, rate.high], "events": int(sum(c[1] for c in cells)),
            "clusters": rate.clusters}


def speed_summary(scored: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Speed, context and tool-stability figures of scored records (see the module docstring)."""
    context = [int(r["max_context_tokens"]) for r in scored if r.get("max_context_tokens")]
    return {
        "speed": {
            "tokens_per_s_task": _task_interval(_per_task(scored, "tokens_per_s")),
            "tokens_per_s_step": _step_interval(scored, 0),
            "first_token_s_task": _task_interval(_per_task(scored, "first_token_s")),
            "first_token_s_step": _step_interval(scored, 2),
        },
        "context": {"max_tokens_p50": float(np.percentile(context, 50)) if context else None,
                    "max_tokens_p90": float(np.percentile(context, 90)) if context else None,
                    "max_tokens": max(context) if context else None,
                    "exceeded_rate": (sum(r["outcome"] == "context_exceeded" for r in scored) / len(scored)
                                      if scored else None)},
        "tools": {"failed_call_rate": _pooled_rate(scored, "tool_calls_failed", "tool_calls"),
                  "recovery_after_failure": _pooled_rate(scored, "tool_failures_recovered", "tool_calls_failed")},
    }
