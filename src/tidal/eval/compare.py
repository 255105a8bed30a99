"""Paired comparison of two evaluations on the same tasks: the statistics behind `tidal compare`.

Two models run on the same tasks are paired data: a task that is easy for one is usually easy for
the other, so per-task differences are far more sensitive than two pass rates compared as if
independent. Each task's per-epoch outcomes are averaged into a score in [0, 1]; then come the
mean difference (B - A) with a paired bootstrap interval, McNemar's test on the discordant tasks,
the minimum detectable difference (a non-significant result with a large MDD says "too few
tasks", not "no difference"), Holm's correction of the per-domain p-values, the flip table, and a
cluster-robust standard error when tasks share a group (variants of one problem are not
independent evidence). docs/design/eval.md, "Comparing two evals", has the details.

Infrastructure and verifier errors are not outcomes of the model: records whose outcome is
`infra_error` or `verifier_error` are left out before pairing, and tasks present in only one run
are reported, not compared.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np

from tidal.errors import TidalError

EXACT_BELOW = 25  # McNemar: exact binomial when fewer discordant pairs than this
PASS_OUTCOMES = {"pass", "passed"}
EXCLUDED_OUTCOMES = {"infra_error", "verifier_error"}  # not outcomes of the model


class CompareError(TidalError):
    """The runs cannot be compared (no shared tasks, unreadable results)."""


# ------------------------------------------------------------------------------------------ tests


def mcnemar(b: int, c: int) -> float:
    """Two-sided p-value of McNemar's test with b tasks solved only by A and c only by B."""
    if b < 0 or c < 0:
        raise ValueError(f"discordant counts must be >= 0, got b={b}, c={c}")
    n = b + c
    if n == 0:
        return 1.0
    if n < EXACT_BELOW:
        low = min(b, c)
        tail = sum(math.comb(n, i) for i in range(low + 1)) / 2**n
        return min(1.0, 2.0 * tail)
    statistic = (abs(b - c) - 1) ** 2 / n
    return math.erfc(math.sqrt(statistic / 2.0))  # chi-square with 1 df, upper tail


def paired_bootstrap(
    a: Sequence[float], b: Sequence[float], *, resamples: int = 10_000, seed: int = 0, confidence: float = 0.95
) -> tuple[float, float, float]:
    """(mean of b - a, low, high): percentile interval of the mean difference over tasks resampled
    with replacement (the same draw for both, which keeps the pairing)."""
    first, second = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if first.shape != second.shape or first.ndim != 1 or first.size == 0:
        raise ValueError(f"need two equally long, non-empty score lists, got {first.shape} and {second.shape}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    diff = second - first
    rng = np.random.default_rng(seed)
    means = np.empty(resamples)
    for start in range(0, resamples, 1000):  # bounded memory for many tasks
        count = min(1000, resamples - start)
        picks = rng.integers(0, diff.size, size=(count, diff.size))
        means[start:start + count] = diff[picks].mean(axis=1)
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(means, [tail, 1.0 - tail])
    return float(diff.mean()), float(low), float(high)


def holm(pvalues: dict[str, float]) -> dict[str, float]:
    """Holm-Bonferroni adjusted p-values (step-down, kept monotone, capped at 1)."""
    ordered = sorted(pvalues.items(), key=lambda item: item[1])
    m = len(ordered)
    adjusted: dict[str, float] = {}
    running = 0.0
    for rank, (name, p) in enumerate(ordered):
        running = max(running, min(1.0, (m - rank) * p))
        adjusted[name] = running
    return adjusted


def min_detectable_difference(n: int, discordance: float, alpha: float = 0.05, power: float = 0.8) -> float:
    """Smallest true difference in pass rate a two-sided paired test at `alpha` finds with `power`,
    for n tasks of which a share `discordance` disagree: (z_{1-a/2} + z_power) * sqrt(d / n).
    (The per-task difference is -1, 0 or 1; its variance is about the discordance when the effect
    is small.) With no observed discordance a floor of 1/n is used: one flip in n tasks."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    normal = NormalDist()
    z = normal.inv_cdf(1.0 - alpha / 2.0) + normal.inv_cdf(power)
    share = max(discordance, 1.0 / n)
    return min(1.0, z * math.sqrt(share / n))


def cluster_se(values: Sequence[float], groups: Sequence[str]) -> float:
    """Cluster-robust standard error of the mean of `values` when items in the same group are
    correlated: sqrt(G / (G - 1) * sum_g (sum_{i in g} (x_i - mean))^2) / n. Equals the usual
    (ddof=0, small-sample corrected) standard error when every item is its own group."""
    x = np.asarray(values, dtype=np.float64)
    if x.size != len(groups) or x.size == 0:
        raise ValueError(f"need one group per value, got {x.size} values and {len(groups)} groups")
    residual = x - x.mean()
    sums: dict[str, float] = defaultdict(float)
    for value, group in zip(residual, groups):
        sums[group] += float(value)
    g = len(sums)
    if g < 2:
        return math.inf
    return math.sqrt(g / (g - 1) * sum(s * s for s in sums.values())) / x.size


# ------------------------------------------------------------------------------------------ runs


@dataclass
class TaskScores:
    """Per-task scores of one evaluation: task id -> (score in [0, 1], domain, group)."""

    name: str
    scores: dict[str, float]
    domains: dict[str, str]
    groups: dict[str, str]
    excluded: int = 0  # infra-error records left out


def scores_from_records(name: str, records: Iterable[dict[str, Any]]) -> TaskScores:
    """Average the per-epoch outcomes of each task. Accepts harness records (`outcome`: pass, fail,
    ...; `passed`: bool) and held-out eval records (`pass_rate`)."""
    totals: dict[str, list[float]] = defaultdict(list)
    domains: dict[str, str] = {}
    groups: dict[str, str] = {}
    excluded = 0
    for at, record in enumerate(records):
        task = record.get("task_id")
        if not isinstance(task, str):
            raise CompareError(f"{name}: record {at} has no task_id")
        if "pass_rate" in record:
            if record["pass_rate"] is None:
                excluded += 1
                continue
            value = float(record["pass_rate"])
        elif "outcome" in record:
            if record["outcome"] in EXCLUDED_OUTCOMES:
                excluded += 1
                continue
            value = 1.0 if record["outcome"] in PASS_OUTCOMES else 0.0
        elif "passed" in record:
            value = 1.0 if record["passed"] else 0.0
        else:
            raise CompareError(f"{name}: record {at} ({task}) has none of outcome, passed, pass_rate")
        totals[task].append(value)
        domains[task] = str(record.get("domain", "all"))
        groups[task] = str(record.get("group") or task)
    return TaskScores(name, {t: sum(v) / len(v) for t, v in totals.items()}, domains, groups, excluded)


def load_scores(spec: str) -> TaskScores:
    """Scores from `RUN_DIR` (its results.jsonl), `RUN_DIR:TAG` (its eval/TAG.jsonl) or a JSONL file."""
    path, tag = Path(spec), None
    if not path.exists() and ":" in spec:
        head, _, tag = spec.rpartition(":")
        path = Path(head)
    if path.is_dir():
        path = path / "eval" / f"{tag}.jsonl" if tag else path / "results.jsonl"
    if not path.is_file():
        raise CompareError(f"{spec}: no results file at {path}")
    records = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as error:
                    raise CompareError(f"{path}:{number}: not JSON ({error.msg})") from error
    return scores_from_records(spec, records)


@dataclass
class DomainComparison:
    domain: str
    n: int
    mean_a: float
    mean_b: float
    diff: float
    ci_low: float
    ci_high: float
    only_a: int  # solved by A only (McNemar's b)
    only_b: int  # solved by B only (McNemar's c)
    p_value: float
    p_holm: float = 1.0
    mdd: float = 1.0
    se_clustered: float | None = None


@dataclass
class Comparison:
    a: str
    b: str
    domains: list[DomainComparison]
    overall: DomainComparison
    flips_to_b: list[str] = field(default_factory=list)  # failed in A, solved in B
    flips_to_a: list[str] = field(default_factory=list)
    only_in_a: list[str] = field(default_factory=list)
    only_in_b: list[str] = field(default_factory=list)
    excluded: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _compare(domain: str, tasks: list[str], a: TaskScores, b: TaskScores, seed: int, confidence: float) -> DomainComparison:
    first = [a.scores[t] for t in tasks]
    second = [b.scores[t] for t in tasks]
    diff, low, high = paired_bootstrap(first, second, seed=seed, confidence=confidence)
    only_a = sum(x >= 0.5 > y for x, y in zip(first, second))
    only_b = sum(y >= 0.5 > x for x, y in zip(first, second))
    groups = [a.groups.get(t, t) for t in tasks]
    clustered = cluster_se([y - x for x, y in zip(first, second)], groups) if len(set(groups)) < len(tasks) else None
    return DomainComparison(
        domain=domain, n=len(tasks), mean_a=float(np.mean(first)), mean_b=float(np.mean(second)), diff=diff,
        ci_low=low, ci_high=high, only_a=only_a, only_b=only_b, p_value=mcnemar(only_a, only_b),
        mdd=min_detectable_difference(len(tasks), (only_a + only_b) / len(tasks), alpha=1 - confidence),
        se_clustered=clustered,
    )


def compare(a: TaskScores, b: TaskScores, *, seed: int = 0, confidence: float = 0.95) -> Comparison:
    """Compare B against A on the tasks both have (see the module docstring)."""
    shared = sorted(set(a.scores) & set(b.scores))
    if not shared:
        raise CompareError(f"{a.name} and {b.name} share no tasks: nothing to compare")
    by_domain: dict[str, list[str]] = defaultdict(list)
    for task in shared:
        by_domain[a.domains.get(task, "all")].append(task)
    domains = [_compare(d, tasks, a, b, seed, confidence) for d, tasks in sorted(by_domain.items())]
    adjusted = holm({d.domain: d.p_value for d in domains})
    for entry in domains:
        entry.p_holm = adjusted[entry.domain]
    overall = _compare("all", shared, a, b, seed, confidence)
    overall.p_holm = overall.p_value
    return Comparison(
        a=a.name, b=b.name, domains=domains, overall=overall,
        flips_to_b=[t for t in shared if a.scores[t] < 0.5 <= b.scores[t]],
        flips_to_a=[t for t in shared if b.scores[t] < 0.5 <= a.scores[t]],
        only_in_a=sorted(set(a.scores) - set(b.scores)), only_in_b=sorted(set(b.scores) - set(a.scores)),
        excluded={a.name: a.excluded, b.name: b.excluded},
    )


def format_comparison(result: Comparison, flips: int = 20) -> str:
    """The plain-text report `tidal compare` prints."""
    lines = [f"B = {result.b}  vs  A = {result.a}", ""]
    header = f"{'domain':<12}{'n':>5}{'A':>8}{'B':>8}{'B-A':>8}  {'95% CI':<17}{'A only':>7}{'B only':>7}{'p':>8}{'p Holm':>8}{'MDD':>7}"
    lines.append(header)
    for entry in [*result.domains, result.overall]:
        lines.append(
            f"{entry.domain:<12}{entry.n:>5}{entry.mean_a:>8.3f}{entry.mean_b:>8.3f}{entry.diff:>+8.3f}  "
            f"[{entry.ci_low:+.3f}, {entry.ci_high:+.3f}]{entry.only_a:>7}{entry.only_b:>7}"
            f"{entry.p_value:>8.3f}{entry.p_holm:>8.3f}{entry.mdd:>7.3f}"
        )
    overall = result.overall
    verdict = "B better" if overall.ci_low > 0 else "A better" if overall.ci_high < 0 else "no detectable difference"
    lines += ["", f"overall: {verdict} (paired bootstrap; McNemar p={overall.p_value:.3g}; "
              f"this task count detects differences of about {overall.mdd:.3f} or more)"]
    for title, tasks in (("solved by B, not A", result.flips_to_b), ("solved by A, not B", result.flips_to_a)):
        shown = ", ".join(tasks[:flips]) + (f", ... ({len(tasks) - flips} more)" if len(tasks) > flips else "")
        lines.append(f"{title}: {len(tasks)}" + (f": {shown}" if tasks else ""))
    if result.only_in_a or result.only_in_b:
        lines.append(f"not compared (in one run only): {len(result.only_in_a)} in A, {len(result.only_in_b)} in B")
    if any(result.excluded.values()):
        lines.append(f"infra errors left out: {result.excluded}")
    return "\n".join(lines)
