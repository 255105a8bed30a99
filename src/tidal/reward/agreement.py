"""How far a model's rewards (an LLM judge, a reward model) agree with the rule rewards.

Where a domain composes both (`verifiers: [{name: task}, {name: llm_judge}]`), every scored sample
has the task verifier's value (`reward/task`) and the model's (`reward/<name>`). `agreement`
reports, over those pairs:
- `pearson` and `spearman` (rank, ties averaged) correlations; None when either side is constant;
- `agreement`: the share of samples both call passed (>= `threshold`) or both call failed;
- `kappa`: Cohen's kappa of those two pass/fail labels (agreement beyond chance; None when
  chance agreement is already 1, e.g. every label the same);
- `n`, the number of pairs.
A judge that drifts from the rules (rewarding confident wrong answers, say) shows here first:
the step metrics carry `agreement/<name>/...` for each model verifier of the step's samples.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any


def pearson(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    n = len(xs)
    if n < 2:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    if sxx <= 0 or syy <= 0:
        return None
    return max(-1.0, min(1.0, sxy / math.sqrt(sxx * syy)))


def ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks, ties given the mean of the ranks they span."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    result = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for position in range(start, end + 1):
            result[order[position]] = (start + end) / 2 + 1
        start = end + 1
    return result


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    return pearson(ranks(xs), ranks(ys))


def cohen_kappa(a: Sequence[bool], b: Sequence[bool]) -> float | None:
    n = len(a)
    if n == 0:
        return None
    observed = sum(x == y for x, y in zip(a, b)) / n
    pa, pb = sum(a) / n, sum(b) / n
    chance = pa * pb + (1 - pa) * (1 - pb)
    if chance >= 1:
        return None
    return (observed - chance) / (1 - chance)


def agreement(model: Sequence[float], rule: Sequence[float], threshold: float = 0.5) -> dict[str, Any]:
    """Agreement statistics of paired `model` and `rule` rewards (see the module docstring)."""
    if len(model) != len(rule):
        raise ValueError(f"{len(model)} model rewards but {len(rule)} rule rewards")
    passed_model = [m >= threshold for m in model]
    passed_rule = [r >= threshold for r in rule]
    n = len(model)
    return {
        "n": n,
        "pearson": pearson(model, rule),
        "spearman": spearman(model, rule),
        "agreement": sum(x == y for x, y in zip(passed_model, passed_rule)) / n if n else None,
        "kappa": cohen_kappa(passed_model, passed_rule),
    }


def agreement_metrics(components: Sequence[dict[str, float]], model_names: Sequence[str], threshold: float = 0.5,
                      rule: str = "task", prefix: str = "reward/") -> dict[str, float]:
    """`agreement/<name>/<statistic>` for each model verifier with paired values among the
    samples' score `components` (`reward/task` and `reward/<name>`); statistics that are None
    are left out, so a metrics line holds numbers only."""
    out: dict[str, float] = {}
    for name in model_names:
        pairs = [(c[prefix + name], c[prefix + rule]) for c in components if prefix + name in c and prefix + rule in c]
        if not pairs:
            continue
        stats = agreement([m for m, _ in pairs], [r for _, r in pairs], threshold)
        out.update({f"agreement/{name}/{key}": float(value) for key, value in stats.items() if value is not None})
    return out
