"""Adaptive domain weights: move the sampling share towards domains whose held-out pass rate is moving.

Optional and off by default. After each held-out evaluation the caller passes every domain's pass
rate to `update`. A domain's learning progress is the absolute least-squares slope of its last
`window` pass rates, multiplied by `regression_boost` when it regresses, so that it gets more
samples and can recover. The new shares are

    target_d = base_d * exp(eta * progress_d) / sum of the same over domains
    weight_d = clip(c * target_d, min_weight, max_weight), with c chosen so that the weights sum to 1

Unlike the learning-progress curricula it resembles (Matiisen et al., 2017), the weights are
recomputed from the base weights at every update, not compounded, so they cannot drift away from
the config, and the bounds are enforced exactly by water-filling, not by clipping and
renormalising. A domain of base weight 0 stays at 0 and does not count towards the bounds. Every
change is returned as a `WeightChange` and logged (docs/design/domains.md, "Adaptive weights").
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tidal.errors import CheckpointError, UnknownNameError

logger = logging.getLogger(__name__)

STATE_VERSION = 1
# Weight changes smaller than this are float noise from the water-filling, not worth a log line.
CHANGE_TOLERANCE = 1e-9


class AdaptiveWeightsConfig(BaseModel):
    """Bounds and rate of the adaptive domain weights. When `enabled` is false the base weights are used unchanged."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    enabled: bool = Field(False, description="shift the domain weights by held-out learning progress")
    min_weight: float = Field(0.05, ge=0, le=1, description="lowest share any sampled domain can get")
    max_weight: float = Field(0.6, gt=0, le=1, description="highest share any domain can get")
    eta: float = Field(
        20.0,
        ge=0,
        le=10_000,
        description="inverse temperature: weight ∝ base * exp(eta * progress), progress in pass rate per "
        "evaluation (eta 20 and a slope of 0.05 per evaluation give e times the base weight)",
    )
    window: int = Field(4, ge=2, le=1000, description="held-out evaluations per domain used to fit the slope")
    regression_boost: float = Field(
        2.0, ge=1, le=100, description="multiplier on the progress of a domain whose pass rate is falling"
    )

    @model_validator(mode="after")
    def _ordered_bounds(self) -> AdaptiveWeightsConfig:
        if self.min_weight > self.max_weight:
            raise ValueError(f"min_weight ({self.min_weight}) must be <= max_weight ({self.max_weight})")
        return self


@dataclass(frozen=True)
class WeightChange:
    """One domain's share changing at one update, and why."""

    step: int
    domain: str
    old: float
    new: float
    reason: str


def slope(values: list[float]) -> float:
    """Least-squares slope of `values` against 0, 1, 2, ..., in units per evaluation. Returns 0 for fewer than two values."""
    n = len(values)
    if n < 2:
        return 0.0
    x_mean = (n - 1) / 2
    y_mean = sum(values) / n
    numerator = sum((i - x_mean) * (y - y_mean) for i, y in enumerate(values))
    denominator = sum((i - x_mean) ** 2 for i in range(n))
    return numerator / denominator


def bounded_shares(target: Mapping[str, float], low: float, high: float) -> dict[str, float]:
    """Water-filling: w_d = clip(c * target_d, low, high), with c chosen so that the w_d sum to 1.

    The caller guarantees low * n <= 1 <= high * n. As a function of c the sum is continuous and
    piecewise linear, with breakpoints at low / t_d (domain d leaves the lower bound) and
    high / t_d (it reaches the upper bound). Interpolating between the two breakpoints around 1
    is therefore exact. A target of 0 (an exponential that underflowed) is the limit t -> 0+:
    such a domain stays at `low` unless the positive domains cannot absorb the rest even at
    `high`, and then the zero-target domains split the remainder equally.
    """
    names = list(target)
    positive = [d for d in names if target[d] > 0]
    zero = [d for d in names if target[d] <= 0]

    def total(c: float) -> float:
        return sum(min(max(c * target[d], low), high) for d in positive) + low * len(zero)

    points = sorted({0.0, *(low / target[d] for d in positive), *(high / target[d] for d in positive)})
    previous_c, previous_sum = points[0], total(points[0])
    if previous_sum >= 1.0:  # low * n == 1: every domain sits at the lower bound
        return {d: low for d in names}
    for point in points[1:]:
        point_sum = total(point)
        if point_sum >= 1.0:
            c = previous_c + (1.0 - previous_sum) * (point - previous_c) / (point_sum - previous_sum)
            return {d: min(max(c * target[d], low), high) for d in names}
        previous_c, previous_sum = point, point_sum
    # Even with every positive-target domain at `high` the sum is short of 1 (only float rounding
    # when no target is 0): the zero-target domains take the remainder.
    rest = (1.0 - high * len(positive)) / len(zero) if zero else low
    return {d: high if d in positive else rest for d in names}


class AdaptiveDomainWeights:
    """Sampling share of each domain, adapted from held-out pass rates. See the module docstring for the rule."""

    def __init__(self, base_weights: Mapping[str, float], config: AdaptiveWeightsConfig) -> None:
        if not base_weights:
            raise ValueError("adaptive domain weights need at least one domain")
        for domain, weight in base_weights.items():
            if not math.isfinite(weight) or weight < 0:
                raise ValueError(f"base weight of domain {domain!r} is {weight}; weights must be finite and >= 0")
        total = sum(base_weights.values())
        if total <= 0:
            raise ValueError(
                f"base weights of domains {sorted(base_weights)} sum to {total}; give at least one domain a positive weight"
            )
        self.config = config
        self.base = {d: w / total for d, w in base_weights.items()}
        self.active = [d for d, w in self.base.items() if w > 0]
        if config.enabled:
            n = len(self.active)
            if config.min_weight * n > 1 + CHANGE_TOLERANCE:
                raise ValueError(
                    f"min_weight {config.min_weight} * {n} sampled domains = {config.min_weight * n} > 1; "
                    f"lower min_weight to at most {1 / n:.4g}"
                )
            if config.max_weight * n < 1 - CHANGE_TOLERANCE:
                raise ValueError(
                    f"max_weight {config.max_weight} * {n} sampled domains = {config.max_weight * n} < 1; "
                    f"raise max_weight to at least {1 / n:.4g}"
                )
        self.history: dict[str, list[float]] = {d: [] for d in self.base}
        self._weights = self._compute({d: 0.0 for d in self.active}) if config.enabled else dict(self.base)
        if any(abs(self._weights[d] - self.base[d]) > CHANGE_TOLERANCE for d in self.base):
            logger.info("base domain weights %s bounded into [min_weight, max_weight]: %s", self.base, self._weights)

    @property
    def weights(self) -> dict[str, float]:
        """Current share of each domain. The shares sum to 1, and zero-base domains are included at 0."""
        return dict(self._weights)

    def slopes(self) -> dict[str, float]:
        """Signed slope of each domain's recent held-out pass rates, in units per evaluation."""
        return {d: slope(rates) for d, rates in self.history.items()}

    def _compute(self, slopes: Mapping[str, float]) -> dict[str, float]:
        cfg = self.config
        progress = {d: abs(s) * (cfg.regression_boost if s < 0 else 1.0) for d, s in slopes.items()}
        # Subtract the largest exponent before exponentiating, so a large eta cannot overflow.
        top = max(cfg.eta * p for p in progress.values())
        raw = {d: self.base[d] * math.exp(cfg.eta * progress[d] - top) for d in self.active}
        norm = sum(raw.values())
        shares = bounded_shares({d: r / norm for d, r in raw.items()}, cfg.min_weight, cfg.max_weight)
        return {d: shares.get(d, 0.0) for d in self.base}

    def update(self, step: int, heldout: Mapping[str, float]) -> list[WeightChange]:
        """Record the held-out pass rates from one evaluation at `step`, then recompute the weights.

        `heldout` maps each evaluated domain to its pass rate. A domain left out of this
        evaluation keeps its history. Returns one `WeightChange` per domain whose share moved, and
        an empty list when the weights are disabled.
        """
        for domain, rate in heldout.items():
            if domain not in self.history:
                raise UnknownNameError("domain", domain, list(self.history))
            if not math.isfinite(rate):
                raise ValueError(
                    f"held-out pass rate of domain {domain!r} at step {step} is {rate}; "
                    "leave a domain out of `heldout` when it was not evaluated"
                )
        if not self.config.enabled:
            return []
        for domain, rate in heldout.items():
            self.history[domain] = (self.history[domain] + [float(rate)])[-self.config.window :]
        slopes = self.slopes()
        new = self._compute({d: slopes[d] for d in self.active})
        changes: list[WeightChange] = []
        for domain in self.active:
            old = self._weights[domain]
            if abs(new[domain] - old) <= CHANGE_TOLERANCE:
                continue
            change = WeightChange(step, domain, old, new[domain], self._reason(slopes[domain], new[domain]))
            logger.info(
                "step %d: domain %r weight %.4f -> %.4f (%s)", step, domain, change.old, change.new, change.reason
            )
            changes.append(change)
        self._weights = new
        return changes

    def _reason(self, domain_slope: float, weight: float) -> str:
        trend = "improving" if domain_slope > 0 else "regressing" if domain_slope < 0 else "flat"
        reason = f"{trend}: held-out slope {domain_slope:+.4f} per evaluation"
        if domain_slope < 0:
            reason += f" (progress boosted x{self.config.regression_boost:g})"
        if abs(weight - self.config.min_weight) <= CHANGE_TOLERANCE:
            reason += "; held at min_weight"
        elif abs(weight - self.config.max_weight) <= CHANGE_TOLERANCE:
            reason += "; held at max_weight"
        return reason

    def state_dict(self) -> dict[str, Any]:
        """Held-out history and current weights, as plain JSON-serialisable data."""
        return {"version": STATE_VERSION, "history": {d: list(r) for d, r in self.history.items()}, "weights": self.weights}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore from `state_dict()` output. Raises CheckpointError if the domains differ from the base weights'."""
        if state.get("version") != STATE_VERSION:
            raise CheckpointError(f"adaptive weights state has version {state.get('version')!r}, expected {STATE_VERSION}")
        if set(state["history"]) != set(self.base) or set(state["weights"]) != set(self.base):
            raise CheckpointError(
                f"adaptive weights state covers domains {sorted(state['history'])} but the config has "
                f"{sorted(self.base)}; resume with the same domains, or start the weights afresh"
            )
        self.history = {d: [float(r) for r in rates][-self.config.window :] for d, rates in state["history"].items()}
        self._weights = {d: float(w) for d, w in state["weights"].items()}
