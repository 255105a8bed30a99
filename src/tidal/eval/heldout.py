"""Held-out evaluation of a policy: sample k answers per task, score them, and summarise pass rates
per domain, with the paired before/after comparison over the same tasks.

Outcomes are evaluation's one taxonomy (`AgentOutcome`): single answers are judged as the eval
harness judges them (answers.py), episodes by their acceptance tests, so `tidal eval` of the same
model on the same tasks gives the same per-task results. A task's pass rate is the fraction of its
scored samples whose outcome is `pass`. Infra and verifier errors are not counted as failures:
they are left out of the task's denominator and reported apart (a task with only those has no pass
rate). Per-domain intervals are clustered by task (stats.clustered_interval): a task's samples are
not independent draws. Tasks the audit quarantined (`quarantined` ids) are evaluated but reported
apart: they count in no domain's rate, only in a `quarantined` entry. A record's domain is the config domain the run drew the task for
(`metadata.config_domain`, e.g. `math_new` for a hand-written math set), else the task's own.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from tidal.agent.records import MODEL_OUTCOMES, AgentOutcome
from tidal.eval.answers import ScoreMany, context_window, judge, over_window
from tidal.eval.stats import clustered_interval, paired_difference
from tidal.models.io import render_prompt
from tidal.rollout.engine import SamplingParams
from tidal.rollout.protocol import RolloutEngine
from tidal.types import Task

CONFIG_DOMAIN_KEY = "config_domain"  # task.metadata: the config domain a run drew the task for


def _record(task: Task, judged: list[tuple[AgentOutcome, float]], completion_tokens: int, answers: list[str],
            seconds: float, quarantined: frozenset[str] | set[str]) -> dict[str, Any]:
    """One task's record from its samples' (outcome, reward)."""
    outcomes = Counter(outcome.value for outcome, _ in judged)
    valid = [value for outcome, value in judged if outcome in MODEL_OUTCOMES]
    passed = sum(outcome is AgentOutcome.PASS for outcome, _ in judged)
    return {
        "task_id": task.id,
        "domain": task.metadata.get(CONFIG_DOMAIN_KEY, task.domain),
        "quarantined": task.id in quarantined,
        "difficulty": task.difficulty,
        "samples": len(judged),
        "scored": len(valid),
        "passed": passed,
        "pass_rate": passed / len(valid) if valid else None,
        "mean_reward": sum(valid) / len(valid) if valid else None,
        "outcomes": dict(outcomes),
        "completion_tokens": completion_tokens,
        "answers": answers[:2],
        "seconds": seconds,
    }


def evaluate_policy(
    engine: RolloutEngine,
    tasks: Sequence[Task],
    score_many: ScoreMany,
    *,
    samples_per_task: int,
    temperature: float,
    top_p: float,
    max_new_tokens: int,
    stop: list[str],
    seed: int,
    batch_prompts: int = 64,
    on_progress: Callable[[int, int], None] | None = None,
    quarantined: frozenset[str] | set[str] = frozenset(),
    agent_backend: str = "bwrap",
    agent_concurrency: int = 8,
    agent_max_tokens: int = 2048,
) -> list[dict[str, Any]]:
    """One record per task (in task order): pass rate, mean reward, outcome counts and two sample
    answers. Multi-turn (agent) tasks run as episodes (`max_new_tokens` per turn, `agent_*`: the
    sandbox backend, episodes at once, context budget) and are judged by their acceptance tests."""
    from tidal.types import is_multi_turn

    by_id: dict[str, dict[str, Any]] = {}
    window = context_window(engine)
    single, prompts = [], []
    for task in tasks:
        if is_multi_turn(task):
            continue
        prompt = render_prompt(engine.tokenizer, task.messages())
        if over_window(len(prompt), window):  # judged as answers.answer_task judges it
            by_id[task.id] = _record(task, [(AgentOutcome.CONTEXT_EXCEEDED, 0.0)] * samples_per_task, 0, [], 0.0,
                                     quarantined)
        else:
            single.append(task)
            prompts.append(prompt)
    multi = [task for task in tasks if is_multi_turn(task)]
    for start in range(0, len(single), batch_prompts):
        chunk = single[start : start + batch_prompts]
        params = SamplingParams(
            temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens, stop=stop, seed=seed + start
        )
        began = time.perf_counter()
        groups = engine.generate(prompts[start : start + batch_prompts], samples_per_task, params)
        scores = score_many([(task, c.text) for task, group in zip(chunk, groups) for c in group])
        elapsed = time.perf_counter() - began
        for i, (task, group) in enumerate(zip(chunk, groups)):
            task_scores = scores[i * samples_per_task : (i + 1) * samples_per_task]
            judged = [(judge(s), s.value) for s in task_scores]
            by_id[task.id] = _record(task, judged, sum(len(c.token_ids) for c in group), [c.text for c in group],
                                     elapsed / len(chunk), quarantined)
        if on_progress:
            on_progress(len(by_id), len(tasks))
    if multi:
        from tidal.agent.sampling import sample_agent_results

        began = time.perf_counter()
        results = sample_agent_results(engine, multi, samples_per_task, temperature=temperature, top_p=top_p,
                                       stop=stop, max_new_tokens=max_new_tokens, max_tokens=agent_max_tokens,
                                       seed=seed, backend=agent_backend, concurrency=agent_concurrency)
        elapsed = time.perf_counter() - began
        for task, episodes in zip(multi, results):
            judged = [(r.outcome, r.reward if r.reward is not None else 0.0) for r in episodes]
            tokens = sum(int(r.totals()["tokens_out"]) for r in episodes)
            answers = [(r.steps[-1].text if r.steps else "") for r in episodes]
            by_id[task.id] = _record(task, judged, tokens, answers, elapsed / len(multi), quarantined)
        if on_progress:
            on_progress(len(by_id), len(tasks))
    return [by_id[task.id] for task in tasks]


def pass_rates(records: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per-domain and overall pass rate of one evaluation (the mean of its tasks' rates), with the
    task-clustered 95% interval of the pooled rate (equal to the mean when every sample of every
    task was scored); `design_effect` says how much the repeats of a task were worth less than
    independent samples (1: not at all; samples per task: identical repeats)."""
    out: dict[str, dict[str, Any]] = {}
    apart = [r for r in records if r.get("quarantined")]
    records = [r for r in records if not r.get("quarantined")]
    domains = sorted({r["domain"] for r in records})
    for name in [*domains, "overall", *(["quarantined"] if apart else [])]:
        pool = apart if name == "quarantined" else records
        rows = [r for r in pool if (name in ("overall", "quarantined") or r["domain"] == name) and r["pass_rate"] is not None]
        interval = clustered_interval([r["passed"] for r in rows], [r["scored"] for r in rows])
        out[name] = {
            "pass_rate": sum(r["pass_rate"] for r in rows) / len(rows) if rows else None,
            "tasks": len(rows),
            "samples": interval.samples,
            "ci_low": interval.low if rows else 0.0,
            "ci_high": interval.high if rows else 0.0,
            "design_effect": interval.design_effect,
        }
    return out


def compare(before: Sequence[dict[str, Any]], after: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Paired before/after comparison per domain and overall, over tasks scored in both runs."""
    after_by_id = {r["task_id"]: r for r in after}
    pairs = [
        (r, after_by_id[r["task_id"]])
        for r in before
        if r["task_id"] in after_by_id and not r.get("quarantined") and r["pass_rate"] is not None and after_by_id[r["task_id"]]["pass_rate"] is not None
    ]
    result: dict[str, Any] = {"domains": {}}
    domains = sorted({b["domain"] for b, _ in pairs})
    for name in [*domains, "overall"]:
        rows = [(b, a) for b, a in pairs if name == "overall" or b["domain"] == name]
        if not rows:
            result["overall"] = {"n": 0, "before": None, "after": None, "diff": None, "ci_low": None, "ci_high": None}
            continue
        paired = paired_difference([b["pass_rate"] for b, _ in rows], [a["pass_rate"] for _, a in rows])
        entry = {
            "n": paired.n,
            "before": paired.mean_before,
            "after": paired.mean_after,
            "diff": paired.mean_diff,
            "ci_low": paired.ci_low,
            "ci_high": paired.ci_high,
            "p_value": paired.p_value,
            "wins": paired.wins,
            "losses": paired.losses,
            "ties": paired.ties,
        }
        if name == "overall":
            result["overall"] = entry
        else:
            result["domains"][name] = entry
    return result
