"""The guard's detectors: each reads one kind of signal from a step's metrics row (or the
held-out evaluation) and compares it with a robust baseline of its own recent values.

A baseline is the median and the MAD (median absolute deviation) of the last `window` values the
detector did not flag; a value fires when it has moved from the median, in the detector's
direction, by more than `min_delta`, by more than `z` robust standard deviations
(1.4826 * MAD, the standard deviation of normal data) and, with a `ratio`, past `ratio` times the
median. The median and MAD ignore the one-off outliers that a mean and a standard deviation
chase, and a flat baseline (MAD 0) leaves `min_delta` and `ratio` to decide. `nonfinite` is an
absolute check: any NaN or Inf, or an update the trainer skipped.

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
MAD_TO_SIGMA = 1.4826


@dataclass
class Finding:
    """One detector's verdict on one signal at one step."""

    detector: str
    key: str  # the metric, e.g. reward/math
    step: int  # the row's step (updates done)
    value: float
    baseline: float | None  # the median it was compared with (None: an absolute check)
    reason: str
    blamed_step: int  # the first update whose result is suspect (1-based, like `step`)
    domain: str | None = None


def robust_baseline(values: list[float]) -> tuple[float, float]:
    """(median, robust standard deviation) of `values`."""
    median = statistics.median(values)
    mad = statistics.median(abs(v - median) for v in values)
    return median, MAD_TO_SIGMA * mad


def moved(value: float, history: list[float], cfg: DetectorConfig, direction: Direction) -> float | None:
    """The baseline median when `value` is an anomaly against `history` (the last `window` of it),
    else None; None too while the history is shorter than `warmup`."""
    if len(history) < cfg.warmup:
        return None
    median, sigma = robust_baseline(history[-cfg.window:])
    delta = value - median if direction == "rise" else median - value
    if delta <= cfg.min_delta or delta <= cfg.z * sigma:
        return None
    if cfg.ratio is not None and not (value > cfg.ratio * median if direction == "rise" else value < cfg.ratio * median):
        return None
    return median


@dataclass
class BaselineDetector:
    """A metric (or a family of metrics: one baseline per key) against its rolling baseline."""

    name: str
    cfg: DetectorConfig
    keys: Callable[[dict[str, Any]], dict[str, float]]  # the row's values this detector reads
    direction: Direction
    lag: int
    what: str  # the signal, in words, for the reason
    history: dict[str, list[tuple[int, float]]] = field(default_factory=dict)

    def observe(self, step: int, row: dict[str, Any]) -> list[Finding]:
        findings = []
        for key, value in self.keys(row).items():
            if not math.isfinite(value):
                continue  # nonfinite's business; a NaN would poison the median
            past = self.history.setdefault(key, [])
            median = moved(value, [v for _, v in past], self.cfg, self.direction)
            if median is None:
                past.append((step, value))
                continue
            verb = "rose" if self.direction == "rise" else "fell"
            domain = key.split("/", 1)[1] if key.startswith("reward/") else None
            reason = (f"{self.what} {key} {verb} to {value:.4g} from a median of {median:.4g} over the last "
                      f"{min(len(past), self.cfg.window)} steps")
            findings.append(Finding(self.name, key, step, value, median, reason, max(step - self.lag, 1), domain))
        return findings

    def forget_after(self, step: int) -> None:
        """Drop the values of the steps after `step` (rolled back: they did not happen)."""
        for key, past in self.history.items():
            self.history[key] = [(s, v) for s, v in past if s <= step]


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


def _one(key: str) -> Callable[[dict[str, Any]], dict[str, float]]:
    def read(row: dict[str, Any]) -> dict[str, float]:
        value = row.get(key)
        return {key: float(value)} if isinstance(value, (int, float)) and not isinstance(value, bool) else {}
    return read


def _domain_rewards(row: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in row.items() if k.startswith("reward/") and k != "reward/mean" and isinstance(v, (int, float))}


# name -> (what it reads, direction, lag, the signal in words)
BASELINE_DETECTORS: dict[str, tuple[Callable[[dict[str, Any]], dict[str, float]], Direction, int, str]] = {
    "reward_collapse": (_domain_rewards, "fall", 1, "reward collapse:"),
    "reward_spike": (_domain_rewards, "rise", 0, "reward spike (a hack until shown otherwise):"),
    "entropy_collapse": (_one("entropy"), "fall", 1, "entropy collapse:"),
    "entropy_explosion": (_one("entropy"), "rise", 1, "entropy explosion:"),
    "kl_drift": (_one("kl"), "rise", 1, "KL to the reference drifting:"),
    "mismatch_kl": (_one("approx_kl"), "rise", 1, "sampler-trainer mismatch KL drifting:"),
    "grad_spike": (_one("grad_norm"), "rise", 1, "gradient-norm spike:"),
    "tamper_rate": (_one("rate/tampered"), "rise", 0, "tamper rate rising:"),
    "length_blowup": (_one("mean_completion_length"), "rise", 1, "response-length blow-up:"),
    "throughput_drop": (_one("tokens_per_s"), "fall", 0, "throughput drop:"),
    "infra_errors": (_one("rate/infra_error"), "rise", 0, "sandbox infra-error rate rising:"),
}


def build_detectors(cfg: GuardConfig) -> tuple[list[BaselineDetector | NonfiniteDetector], HeldoutDetector | None]:
    """The enabled detectors of the config: those over the metrics rows, and the held-out one."""
    enabled = cfg.detectors()
    rows: list[BaselineDetector | NonfiniteDetector] = [NonfiniteDetector()] if "nonfinite" in enabled else []
    for name, (keys, direction, lag, what) in BASELINE_DETECTORS.items():
        if name in enabled:
            rows.append(BaselineDetector(name, enabled[name], keys, direction, lag, what))
    heldout = HeldoutDetector(enabled["heldout_regression"]) if "heldout_regression" in enabled else None
    return rows, heldout
