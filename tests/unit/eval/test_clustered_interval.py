"""Task-clustered intervals: never narrower than the one over tasks when repeats agree, and the
train summary's per-domain intervals use them too."""

from __future__ import annotations

import pytest

from tidal.eval.heldout import pass_rates
from tidal.eval.metrics import summarize
from tidal.eval.stats import clustered_interval, wilson_interval


def test_identical_repeats_give_the_interval_over_tasks() -> None:
    # The case: 1 of 5 tasks passes, 3 greedy epochs each -> 15 copies.
    interval = clustered_interval([3, 0, 0, 0, 0], [3] * 5)
    assert (interval.low, interval.high) == pytest.approx(wilson_interval(1, 5))
    assert (interval.low, interval.high) == pytest.approx((0.0362, 0.6245), abs=1e-4)
    assert interval.effective_n == pytest.approx(5.0) and interval.design_effect == pytest.approx(3.0)
    naive = wilson_interval(3, 15)  # the copies counted as independent
    assert naive == pytest.approx((0.0705, 0.4519), abs=1e-4)
    assert interval.high - interval.low > 1.5 * (naive[1] - naive[0])


def test_correlated_repeats_are_wider_than_sample_wilson() -> None:
    # Tasks differ a lot (mostly all-pass or all-fail) but not completely: between G and N.
    passed, samples = [4, 4, 0, 0, 3, 0, 4, 1], [4] * 8
    interval = clustered_interval(passed, samples)
    naive = wilson_interval(sum(passed), sum(samples))
    assert interval.rate == pytest.approx(16 / 32)
    assert interval.high - interval.low > naive[1] - naive[0]
    assert 8 < interval.effective_n < 32


def test_tasks_that_agree_leave_the_samples_independent() -> None:
    interval = clustered_interval([2, 2, 2], [4, 4, 4])  # no sign of clustering at all
    assert interval.effective_n == 12 and (interval.low, interval.high) == pytest.approx(wilson_interval(6, 12))
    nothing = clustered_interval([], [])
    assert nothing.rate is None and (nothing.low, nothing.high) == (0.0, 1.0)
    with pytest.raises(ValueError):
        clustered_interval([3], [2])


def _records(rates: dict[str, list[bool]], domain: str = "math") -> list[dict]:
    return [{"task_id": t, "epoch": e, "domain": domain, "outcome": "pass" if ok else "fail", "passed": ok}
            for t, passes in rates.items() for e, ok in enumerate(passes)]


def test_eval_summary_intervals_are_clustered_by_task() -> None:
    records = _records({"a": [True] * 3, "b": [False] * 3, "c": [False] * 3, "d": [False] * 3, "e": [False] * 3})
    summary = summarize(records, epochs=3)
    assert summary["pass_rate"] == pytest.approx(0.2) and summary["n"] == 15
    assert summary["ci"] == pytest.approx(list(wilson_interval(1, 5)))
    assert summary["domains"]["math"]["ci"] == pytest.approx(list(wilson_interval(1, 5)))
    assert summary["interval"]["clusters"] == 5 and summary["interval"]["design_effect"] == pytest.approx(3.0)
    assert summary["pass_at_k"]["3"] == summary["pass_hat_k"]["3"] == summary["pass_at_k"]["1"] == pytest.approx(0.2)


def test_train_summary_domains_are_clustered_by_task() -> None:
    # heldout records: 6 tasks of 4 samples, each all-pass or all-fail (a greedy eval).
    records = [{"task_id": f"t{i}", "domain": "math", "quarantined": False, "passed": 4 * (i < 2), "scored": 4,
                "pass_rate": float(i < 2)} for i in range(6)]
    rates = pass_rates(records)
    for name in ("math", "overall"):
        assert rates[name]["pass_rate"] == pytest.approx(1 / 3) and rates[name]["samples"] == 24
        assert (rates[name]["ci_low"], rates[name]["ci_high"]) == pytest.approx(wilson_interval(2, 6))
        naive = wilson_interval(8, 24)
        assert rates[name]["ci_high"] - rates[name]["ci_low"] > 1.5 * (naive[1] - naive[0])
        assert rates[name]["design_effect"] == pytest.approx(4.0)
