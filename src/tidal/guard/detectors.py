"""The guard's detectors: each reads one kind of signal from a step's metrics row (or the
held-out evaluation) and compares it with a baseline of its own recent values.

A baseline is the last `window` values the detector did not flag. Most detectors judge a value
against their median and MAD (median absolute deviation): it fires when it has moved from the
median, in the detector's direction, by more than `min_delta`, by more than `z` robust standard
deviations (1.4826 * MAD, the standard deviation of normal data) and, with a `ratio`, past `ratio`
times the median. The median and MAD ignore the one-off outliers that a mean and a standard
deviation chase, and a flat baseline (MAD 0) leaves `min_delta` and `ratio` to decide.

A domain's reward is a mean over the few tasks the step drew from it (`tasks/<domain>` in the row),
so its noise is known: for rewards in [0, 1] a mean over n tasks varies by at most
sqrt(p (1 - p) / n) around the pass rate p, whatever the tasks' own rates (the bound of a
binomial over tasks). The reward detectors compare the value with their window's pooled mean as
two proportions (p pooled over both, weighted by tasks, with half a success of prior so that a
flat 0 still has noise) and fire past `z` of that test's standard deviations; without task
counts they fall back to the median and MAD.

A regime change alerts once: the first flagged value of a run of flagged values makes the
finding, the next ones of the same run are part of that excursion, and after `settle` of them in a
row the baseline re-settles on the new level (the run becomes the baseline). A value back inside
the baseline ends the excursion; flagged values never enter a baseline, so a one-off fault does
not teach the detector that it is normal. `nonfinite` is an absolute check: any NaN or Inf, or an
update the trainer skipped.

Each finding names the step it blames: the first update whose result is suspect. A row's sampled
signals (reward, lengths, entropy, KL, gradient) come from the weights before its update, so a
change in them blames the update before (`lag` 1: `step - 1`); a data signal (a reward spike, a
tamper or infra-error rate) blames the row's own update, which trained on that data (`lag` 0).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from tidal.config.guard import DetectorConfig, GuardConfig

Direction = Literal["rise", "fall"]
Noise = Literal["robust", "binomial"]
MAD_TO_SIGMA = 1.4826
PRIOR_SUCCESSES = 0.5  # a reward baseline's prior: half a success in one task (Jeffreys)


@dataclass
class Finding:
    """One detector's verdict on one signal at one step."""

    detector: str
    key: str  # the metric, e.g. reward/math
    step: int  # the row's step (updates done)
    value: float
    baseline: float | None  # the median (or pooled mean) it was compared with (None: an absolute check)
    reason: str
    blamed_step: int  # the first update whose result is suspect (1-based, like `step`)
    domain: str | None = None


@dataclass(frozen=True)
class Observation:
    """One value a detector reads, with the number of tasks it is a mean over (None: not a mean
    over tasks, or not known)."""

    step: int
    value: float
    tasks: float | None = None


def robust_baseline(values: list[float]) -> tuple[float, float]:
    """(median, robust standard deviation) of `values`."""
    median = statistics.median(values)
    mad = statistics.median(abs(v - median) for v in values)
    return median, MAD_TO_SIGMA * mad


def _past_bounds(value: float, center: float, sigma: float, cfg: DetectorConfig, direction: Direction) -> bool:
    delta = value - center if direction == "rise" else center - value
    if delta <= cfg.min_delta or delta <= cfg.z * sigma:
        return False
    return cfg.ratio is None or (value > cfg.ratio * center if direction == "rise" else value < cfg.ratio * center)


def moved(value: float, history: list[float], cfg: DetectorConfig, direction: Direction) -> float | None:
    """The baseline median when `value` is an anomaly against `history` (the last `window` of it),
    else None; None too while the history is shorter than `warmup`."""
    if len(history) < cfg.warmup:
        return None
    median, sigma = robust_baseline(history[-cfg.window:])
    return median if _past_bounds(value, median, sigma, cfg, direction) else None


def binomial_baseline(window: list[Observation], now: Observation) -> tuple[float, float]:
    """(the window's pooled mean, the standard deviation of the difference between a mean over
    `now.tasks` tasks and it) for rewards in [0, 1]: the two-proportion test's
    sqrt(p (1 - p) (1 / tasks now + 1 / tasks in the window)), p pooled over the window and `now`
    with half a success of prior, so that a flat 0 keeps some noise and a high value widens it."""
    total = sum(o.tasks or 0.0 for o in window)
    successes = sum(o.value * (o.tasks or 0.0) for o in window)
    tasks = float(now.tasks or 0.0)
    p = (successes + now.value * tasks + PRIOR_SUCCESSES) / (total + tasks + 2 * PRIOR_SUCCESSES)
    return successes / total, math.sqrt(p * (1 - p) * (1 / tasks + 1 / total))


def moved_binomial(now: Observation, history: list[Observation], cfg: DetectorConfig,
                   direction: Direction) -> float | None:
    """`moved` for a mean over tasks: against the binomial noise of the tasks behind it (module
    docstring); the median and MAD when a task count is missing or a reward is outside [0, 1]."""
    if len(history) < cfg.warmup:
        return None
    window = history[-cfg.window:]
    counted = now.tasks and all(o.tasks for o in window)
    if not counted or not all(0.0 <= o.value <= 1.0 for o in [*window, now]):
        return moved(now.value, [o.value for o in history], cfg, direction)
    mean, sigma = binomial_baseline(window, now)
    return mean if _past_bounds(now.value, mean, sigma, cfg, direction) else None


Reader = Callable[[dict[str, Any]], dict[str, tuple[float, float | None]]]


@dataclass
class BaselineDetector:
    """A metric (or a family of metrics: one baseline per key) against its rolling baseline."""

    name: str
    cfg: DetectorConfig
    keys: Reader  # the row's values this detector reads: key -> (value, tasks behind it)
    direction: Direction
    lag: int
    what: str  # the signal, in words, for the reason
    noise: Noise = "robust"
    history: dict[str, list[Observation]] = field(default_factory=dict)
    excursion: dict[str, list[Observation]] = field(default_factory=dict)  # flagged values in a row, per key

    def observe(self, step: int, row: dict[str, Any]) -> list[Finding]:
        findings = []
        for key, (value, tasks) in self.keys(row).items():
            if not math.isfinite(value):
                continue  # nonfinite's business; a NaN would poison the median
            now = Observation(step, value, tasks)
            past = self.history.setdefault(key, [])
            if self.noise == "binomial":
                baseline = moved_binomial(now, past, self.cfg, self.direction)
            else:
                baseline = moved(value, [o.value for o in past], self.cfg, self.direction)
            if baseline is None:
                past.append(now)
                self.excursion[key] = []  # back inside the baseline: an excursion ended
                continue
            run = self.excursion.setdefault(key, [])
            run.append(now)
            if len(run) >= self.cfg.settle:  # a sustained shift: the new level is the baseline
                self.history[key], self.excursion[key] = list(run), []
            if len(run) > 1:
                continue  # the excursion's first value made the finding
            verb = "rose" if self.direction == "rise" else "fell"
            domain = key.split("/", 1)[1] if key.startswith("reward/") else None
            over = min(len(past), self.cfg.window)
            if self.noise == "binomial" and tasks:
                against = f"the mean of {baseline:.4g} over the last {over} steps ({tasks:g} tasks this step)"
            else:
                against = f"a median of {baseline:.4g} over the last {over} steps"
            reason = f"{self.what} {key} {verb} to {value:.4g} from {against}"
            findings.append(Finding(self.name, key, step, value, baseline, reason, max(step - self.lag, 1), domain))
        return findings

    def forget_after(self, step: int) -> None:
        """Drop the values of the steps after `step` (rolled back: they did not happen)."""
        for key, past in self.history.items():
            self.history[key] = [o for o in past if o.step <= step]
        for key, run in self.excursion.items():
            self.excursion[key] = [o for o in run if o.step <= step]


NONFINITE_KEYS = ("loss", "policy_loss", "grad_norm", "entropy", "kl", "approx_kl")


@dataclass
class NonfiniteDetector:
    """NaN or Inf in the update's numbers, or an update the trainer skipped (it skips a
    non-finite loss or gradient rather than apply it)."""

    name: str = "nonfinite"

    def observe(self, step: int, row: dict[str, Any]) -> list[Finding]:
        bad = [k for k in NONFINITE_KEYS if isinstance(row.get(k), float) and not math.isfinite(row[k])]
        if not bad and not row.get("skipped"):
            return []
        what = f"non-finite {', '.join(bad)}" if bad else "no finite gradient"
        reason = f"{what}; the trainer skipped {row.get('skipped', 0):g} update(s)"
        key = bad[0] if bad else "skipped"
        return [Finding(self.name, key, step, float(row.get(key, math.nan)), None, reason, max(step - 1, 1))]

    def forget_after(self, step: int) -> None:
        pass


@dataclass
class HeldoutDetector:
    """A domain's held-out pass rate against its best so far (the evaluation before RL included):
    a fall of more than `min_delta` blames the updates since that best evaluation."""

    cfg: DetectorConfig
    best: dict[str, tuple[int, float]] = field(default_factory=dict)  # domain -> (step, pass rate)
    name: str = "heldout_regression"

    def observe(self, step: int, rates: dict[str, float]) -> list[Finding]:
        findings = []
        for domain, rate in sorted(rates.items()):
            best_step, best = self.best.get(domain, (step, rate))
            if best - rate > self.cfg.min_delta:
                when = "before RL" if best_step == 0 else f"at step {best_step}"
                reason = f"held-out pass rate of {domain} fell to {rate:.3f} from its best {best:.3f} ({when})"
                findings.append(Finding(self.name, f"eval/{domain}", step, rate, best, reason, best_step + 1, domain))
            elif rate >= best:
                self.best[domain] = (step, rate)
        return findings

    def forget_after(self, step: int) -> None:
        self.best = {d: (s, r) for d, (s, r) in self.best.items() if s <= step}


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _one(key: str) -> Reader:
    def read(row: dict[str, Any]) -> dict[str, tuple[float, float | None]]:
        value = row.get(key)
        return {key: (float(value), None)} if _number(value) else {}  # type: ignore[arg-type]
    return read


def _entropy(row: dict[str, Any]) -> dict[str, tuple[float, float | None]]:
    """The sampler's entropy per generated token over every sample (`sampled_entropy`), else the
    trainer's over the trained tokens (`entropy`), which moves with which groups and lengths train."""
    return _one("sampled_entropy")(row) or _one("entropy")(row)


def _domain_rewards(row: dict[str, Any]) -> dict[str, tuple[float, float | None]]:
    """reward/<domain> -> (its mean, the tasks behind it: `tasks/<domain>`)."""
    found = {}
    for key, value in row.items():
        if key.startswith("reward/") and key != "reward/mean" and _number(value):
            tasks = row.get("tasks/" + key.split("/", 1)[1])
            found[key] = (float(value), float(tasks) if _number(tasks) and tasks > 0 else None)
    return found


# name -> (what it reads, direction, lag, the signal in words, its noise)
BASELINE_DETECTORS: dict[str, tuple[Reader, Direction, int, str, Noise]] = {
    "reward_collapse": (_domain_rewards, "fall", 1, "reward collapse:", "binomial"),
    "reward_spike": (_domain_rewards, "rise", 0, "reward spike (a hack until shown otherwise):", "binomial"),
    "entropy_collapse": (_entropy, "fall", 1, "entropy collapse:", "robust"),
    "entropy_explosion": (_entropy, "rise", 1, "entropy explosion:", "robust"),
    "kl_drift": (_one("kl"), "rise", 1, "KL to the reference drifting:", "robust"),
    "mismatch_kl": (_one("approx_kl"), "rise", 1, "sampler-trainer mismatch KL drifting:", "robust"),
    "grad_spike": (_one("grad_norm"), "rise", 1, "gradient-norm spike:", "robust"),
    "tamper_rate": (_one("rate/tampered"), "rise", 0, "tamper rate rising:", "robust"),
    "length_blowup": (_one("mean_completion_length"), "rise", 1, "response-length blow-up:", "robust"),
    "throughput_drop": (_one("tokens_per_s"), "fall", 0, "throughput drop:", "robust"),
    "infra_errors": (_one("rate/infra_error"), "rise", 0, "sandbox infra-error rate rising:", "robust"),
}


def build_detectors(cfg: GuardConfig) -> tuple[list[BaselineDetector | NonfiniteDetector], HeldoutDetector | None]:
    """The enabled detectors of the config: those over the metrics rows, and the held-out one."""
    enabled = cfg.detectors()
    rows: list[BaselineDetector | NonfiniteDetector] = [NonfiniteDetector()] if "nonfinite" in enabled else []
    for name, (keys, direction, lag, what, noise) in BASELINE_DETECTORS.items():
        if name in enabled:
            rows.append(BaselineDetector(name, enabled[name], keys, direction, lag, what, noise))
    heldout = HeldoutDetector(enabled["heldout_regression"]) if "heldout_regression" in enabled else None
    return rows, heldout
