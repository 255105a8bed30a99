"""Intervals of quantities that are never negative (times to first token, tokens per second) never
reach below 0: a t interval of a small, skewed sample of times does ([-0.004, 0.049] s for a time
to first token), the seeded bootstrap of `positive_mean_ci` stays within the values' range."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tidal.eval.speed import speed_summary
from tidal.eval.stats import mean_ci, positive_mean_ci

SKEWED_TTFT = [0.002, 0.003, 0.0025, 0.004, 0.09]  # seconds: one task waited for a batch slot


def test_a_skewed_sample_of_times_gets_an_interval_above_zero_around_its_mean() -> None:
    mean, t_low, _ = mean_ci(SKEWED_TTFT)
    assert t_low < 0  # the problem: a negative time
    same_mean, low, high = positive_mean_ci(SKEWED_TTFT)
    assert same_mean == pytest.approx(mean)
    assert min(SKEWED_TTFT) <= low < mean < high <= max(SKEWED_TTFT)
    assert positive_mean_ci(SKEWED_TTFT) == (same_mean, low, high)  # seeded: the same every time


def test_degenerate_and_invalid_samples() -> None:
    assert positive_mean_ci([0.3]) == (0.3, 0.0, math.inf)
    assert positive_mean_ci([0.25, 0.25, 0.25]) == (0.25, 0.25, 0.25)
    with pytest.raises(ValueError, match="negative values at positions \\[1\\]"):
        positive_mean_ci([0.1, -0.2])
    with pytest.raises(ValueError, match="no values"):
        positive_mean_ci([])


def test_it_covers_the_mean_of_a_skewed_population_about_as_asked() -> None:
    # Log-normal times, 30 tasks a sample: the interval holds the true mean in most samples.
    rng = np.random.default_rng(1)
    true_mean = math.exp(-4 + 1.0 ** 2 / 2)
    hits = 0
    for trial in range(200):
        sample = rng.lognormal(-4, 1.0, size=30)
        _, low, high = positive_mean_ci(sample.tolist(), draws=500, seed=trial)
        assert low >= 0
        hits += low <= true_mean <= high
    assert hits / 200 >= 0.85


def test_the_eval_speed_summary_reports_first_token_time_per_task_above_zero() -> None:
    records = [{"task_id": f"t{i}", "first_token_s": ttft, "tokens_per_s": 10.0 + i,
                "step_speeds": [[10, 1.0, ttft]], "outcome": "pass"} for i, ttft in enumerate(SKEWED_TTFT)]
    speed = speed_summary(records)["speed"]
    low, high = speed["first_token_s_task"]["ci"]
    assert 0 < low < speed["first_token_s_task"]["mean"] < high
    assert speed["tokens_per_s_task"]["ci"][0] > 0
