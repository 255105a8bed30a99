"""Adaptive domain weights: the shift towards moving domains, the bounds, and a resume that must match an uninterrupted run."""

from __future__ import annotations

import json
import logging
import math
import random

import pytest
from pydantic import ValidationError

from tidal.domains.adaptive import (
    AdaptiveDomainWeights,
    AdaptiveWeightsConfig,
    bounded_shares,
    slope,
)
from tidal.errors import CheckpointError, UnknownNameError


def config(**overrides: object) -> AdaptiveWeightsConfig:
    return AdaptiveWeightsConfig(**{"enabled": True, **overrides})


def feed(weights: AdaptiveDomainWeights, series: dict[str, list[float]], start: int = 0) -> list:
    changes = []
    for i in range(len(next(iter(series.values())))):
        changes += weights.update(start + 100 * i, {d: rates[i] for d, rates in series.items()})
    return changes


def test_slope_by_hand() -> None:
    assert slope([0.1, 0.2, 0.3, 0.4]) == pytest.approx(0.1)
    # x = 0, 1, 2 (mean 1), y = 0, 0.3, 0.3 (mean 0.2): (-1 * -0.2 + 0 + 1 * 0.1) / 2 = 0.15.
    assert slope([0.0, 0.3, 0.3]) == pytest.approx(0.15)
    assert slope([0.5]) == 0.0


def test_rising_domain_gains_weight_by_hand() -> None:
    weights = AdaptiveDomainWeights({"a": 1.0, "b": 1.0, "c": 1.0}, config(eta=20.0, window=4))
    assert weights.weights == pytest.approx({"a": 1 / 3, "b": 1 / 3, "c": 1 / 3})
    changes = feed(weights, {"a": [0.1, 0.2, 0.3, 0.4], "b": [0.5] * 4, "c": [0.5] * 4})
    # a's slope is 0.1 per evaluation -> exp(20 * 0.1) = 7.389056. Targets are 7.389/9.389 = 0.787
    # and 0.1065 twice. a is capped at max_weight 0.6, and b and c split the remaining 0.4.
    assert weights.weights == pytest.approx({"a": 0.6, "b": 0.2, "c": 0.2})
    # The slope is already 0.1 after the second evaluation (step 100). Later evaluations keep it
    # there, so they change nothing and log nothing.
    assert [(c.step, c.domain) for c in changes] == [(100, "a"), (100, "b"), (100, "c")]
    reason_a = changes[0].reason
    assert reason_a.startswith("improving") and "max_weight" in reason_a


def test_flat_domain_drops_to_min_weight_but_not_below() -> None:
    weights = AdaptiveDomainWeights(
        {"a": 1.0, "b": 1.0, "c": 1.0, "d": 1.0}, config(eta=100.0, min_weight=0.05, max_weight=0.6)
    )
    feed(weights, {"a": [0.0, 0.1, 0.2, 0.3], "b": [0.0, 0.05, 0.1, 0.15], "c": [0.4] * 4, "d": [0.7] * 4})
    # Targets are proportional to exp(10), exp(5), 1, 1: a is capped at 0.6, c and d are floored
    # at 0.05, and b takes the remaining 1 - 0.6 - 0.1 = 0.3.
    assert weights.weights == pytest.approx({"a": 0.6, "b": 0.3, "c": 0.05, "d": 0.05})
    assert min(weights.weights.values()) >= 0.05 - 1e-12


def test_regression_boost_by_hand() -> None:
    series = {"up": [0.2, 0.25, 0.3], "down": [0.6, 0.55, 0.5], "flat": [0.4] * 3}
    boosted = AdaptiveDomainWeights(
        {"up": 1.0, "down": 1.0, "flat": 1.0}, config(eta=10.0, regression_boost=2.0, min_weight=0.0, max_weight=1.0)
    )
    changes = feed(boosted, series)
    # The slopes are +0.05 and -0.05. The progress values are 0.05 for up and 2 * 0.05 = 0.1 for
    # down. The targets are proportional to e^0.5 = 1.648721, e^1 = 2.718282 and 1, which sum to
    # 5.367003.
    assert boosted.weights == pytest.approx({"up": 0.307196, "down": 0.506480, "flat": 0.186324}, abs=1e-6)
    down = [c for c in changes if c.domain == "down"][-1]
    assert down.reason.startswith("regressing") and "boosted x2" in down.reason
    plain = AdaptiveDomainWeights(
        {"up": 1.0, "down": 1.0, "flat": 1.0}, config(eta=10.0, regression_boost=1.0, min_weight=0.0, max_weight=1.0)
    )
    feed(plain, series)
    # Without the boost, falling and rising by the same amount count the same.
    assert plain.weights["down"] == pytest.approx(plain.weights["up"])


def test_weights_follow_the_window_not_the_whole_history() -> None:
    weights = AdaptiveDomainWeights({"a": 1.0, "b": 1.0}, config(window=3, min_weight=0.0, max_weight=1.0))
    feed(weights, {"a": [0.1, 0.3, 0.5], "b": [0.5] * 3})
    assert weights.weights["a"] > 0.6
    # a rose long ago and has been flat for the last 3 evaluations, so it is back to its base share.
    feed(weights, {"a": [0.5, 0.5, 0.5], "b": [0.5] * 3}, start=1000)
    assert weights.weights == pytest.approx({"a": 0.5, "b": 0.5})


def test_sums_to_one_and_respects_bounds_on_random_inputs() -> None:
    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(1, 8)
        low = rng.uniform(0, 1 / n)
        high = rng.uniform(max(low, 1 / n), 1)
        base = {f"d{i}": rng.uniform(0.01, 5) for i in range(n)}
        weights = AdaptiveDomainWeights(base, config(min_weight=low, max_weight=high, eta=rng.uniform(0, 200)))
        for step in range(rng.randint(1, 6)):
            weights.update(step, {d: rng.random() for d in base if rng.random() < 0.8})
            shares = weights.weights
            assert sum(shares.values()) == pytest.approx(1.0, abs=1e-9)
            assert all(low - 1e-9 <= w <= high + 1e-9 for w in shares.values())


def test_bounded_shares_by_hand() -> None:
    # Targets 0.7, 0.2 and 0.1 with bounds [0.15, 0.5]. a is capped at 0.5, which leaves 0.5 for b
    # and c in the ratio 2:1: b = 1/3 and c = 1/6 (scale 5/3), both inside the bounds.
    assert bounded_shares({"a": 0.7, "b": 0.2, "c": 0.1}, 0.15, 0.5) == pytest.approx(
        {"a": 0.5, "b": 1 / 3, "c": 1 / 6}
    )
    # With the floor raised to 0.2, c is at the floor and b = 1 - 0.5 - 0.2 = 0.3.
    assert bounded_shares({"a": 0.7, "b": 0.2, "c": 0.1}, 0.2, 0.5) == pytest.approx({"a": 0.5, "b": 0.3, "c": 0.2})
    # Bounds that force everything: low * n == 1.
    assert bounded_shares({"a": 0.9, "b": 0.1}, 0.5, 0.9) == {"a": 0.5, "b": 0.5}
    # A target that underflowed to 0 is at the floor.
    assert bounded_shares({"a": 1.0, "b": 0.0}, 0.1, 1.0) == pytest.approx({"a": 0.9, "b": 0.1})


def test_huge_eta_does_not_overflow() -> None:
    weights = AdaptiveDomainWeights({"a": 1.0, "b": 1.0, "c": 1.0}, config(eta=10_000.0))
    feed(weights, {"a": [0.0, 1.0], "b": [0.5, 0.5], "c": [0.5, 0.5]})
    assert weights.weights == pytest.approx({"a": 0.6, "b": 0.2, "c": 0.2})


def test_base_weights_are_bounded_from_the_start_and_zero_weight_domains_stay_out() -> None:
    weights = AdaptiveDomainWeights({"a": 9.0, "b": 1.0, "eval_only": 0.0}, config(min_weight=0.1, max_weight=0.6))
    assert weights.weights == pytest.approx({"a": 0.6, "b": 0.4, "eval_only": 0.0})
    feed(weights, {"a": [0.5, 0.5], "b": [0.5, 0.5], "eval_only": [0.0, 0.9]})
    assert weights.weights["eval_only"] == 0.0


def test_disabled_keeps_base_weights() -> None:
    weights = AdaptiveDomainWeights({"a": 3.0, "b": 1.0}, AdaptiveWeightsConfig())
    assert AdaptiveWeightsConfig().enabled is False
    assert feed(weights, {"a": [0.1, 0.5, 0.9], "b": [0.9, 0.5, 0.1]}) == []
    assert weights.weights == {"a": 0.75, "b": 0.25}


def test_every_change_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    weights = AdaptiveDomainWeights({"a": 1.0, "b": 1.0}, config(max_weight=0.9))
    with caplog.at_level(logging.INFO, logger="tidal.domains.adaptive"):
        changes = feed(weights, {"a": [0.1, 0.4], "b": [0.5, 0.5]})
    assert len(changes) == 2 and {c.step for c in changes} == {100}
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2
    assert any("domain 'a' weight 0.5000 ->" in m and "improving" in m for m in messages)


def test_invalid_inputs_raise_with_the_domain_named() -> None:
    with pytest.raises(ValueError, match="base weight of domain 'b' is -1.0"):
        AdaptiveDomainWeights({"a": 1.0, "b": -1.0}, config())
    with pytest.raises(ValueError, match="sum to 0.0"):
        AdaptiveDomainWeights({"a": 0.0, "b": 0.0}, config())
    with pytest.raises(ValueError, match=r"min_weight 0.3 \* 4 sampled domains"):
        AdaptiveDomainWeights({d: 1.0 for d in "abcd"}, config(min_weight=0.3, max_weight=0.6))
    with pytest.raises(ValueError, match=r"max_weight 0.2 \* 3 sampled domains"):
        AdaptiveDomainWeights({d: 1.0 for d in "abc"}, config(min_weight=0.1, max_weight=0.2))
    with pytest.raises(ValidationError, match="min_weight"):
        AdaptiveWeightsConfig(min_weight=0.5, max_weight=0.4)
    with pytest.raises(ValidationError):
        AdaptiveWeightsConfig(windw=3)
    weights = AdaptiveDomainWeights({"a": 1.0, "b": 1.0}, config())
    with pytest.raises(UnknownNameError, match="unknown domain 'c'"):
        weights.update(0, {"c": 0.5})
    with pytest.raises(ValueError, match="domain 'a' at step 7 is nan"):
        weights.update(7, {"a": math.nan})


def test_state_dict_json_round_trip_matches_uninterrupted_run() -> None:
    rng = random.Random(3)
    base = {"code": 2.0, "math": 1.0, "chat": 1.0}
    cfg = config(window=3, eta=30.0)
    evaluations = [{d: rng.random() for d in base} for _ in range(8)]
    uninterrupted = AdaptiveDomainWeights(base, cfg)
    first = AdaptiveDomainWeights(base, cfg)
    for step, heldout in enumerate(evaluations[:5]):
        uninterrupted.update(step, heldout)
        first.update(step, heldout)
    resumed = AdaptiveDomainWeights(base, cfg)
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    assert resumed.weights == uninterrupted.weights
    for step, heldout in enumerate(evaluations[5:], start=5):
        expected = uninterrupted.update(step, heldout)
        assert resumed.update(step, heldout) == expected
        assert resumed.weights == uninterrupted.weights
    # The state matters: a fresh object that sees only the last evaluation ends up elsewhere.
    fresh = AdaptiveDomainWeights(base, cfg)
    fresh.update(7, evaluations[7])
    assert fresh.weights != uninterrupted.weights
    with pytest.raises(CheckpointError, match="covers domains"):
        AdaptiveDomainWeights({"code": 1.0, "math": 1.0}, cfg).load_state_dict(first.state_dict())
