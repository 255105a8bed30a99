import math

import pytest

from tidal.eval.stats import (
    PairedResult,
    mean_ci,
    paired_difference,
    pass_at_k,
    pass_hat_k,
    regularized_incomplete_beta,
    t_cdf,
    t_quantile,
    wilson_interval,
)

# -- Wilson --------------------------------------------------------------------------------------


def test_wilson_known_value() -> None:
    low, high = wilson_interval(8, 10)
    assert (round(low, 3), round(high, 3)) == (0.490, 0.943)


def test_wilson_edges() -> None:
    low, high = wilson_interval(0, 10)
    assert low == 0.0 and 0.25 < high < 0.35  # 0.2775 at 95%
    low, high = wilson_interval(10, 10)
    assert high == 1.0 and 0.65 < low < 0.75
    assert wilson_interval(0, 0) == (0.0, 1.0)
    narrow = wilson_interval(80, 100, confidence=0.5)
    wide = wilson_interval(80, 100, confidence=0.99)
    assert wide[0] < narrow[0] < 0.8 < narrow[1] < wide[1]
    with pytest.raises(ValueError):
        wilson_interval(11, 10)
    with pytest.raises(ValueError):
        wilson_interval(1, 10, confidence=1.0)


# -- t distribution ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("df", "expected"),
    [(1, 12.706), (2, 4.303), (5, 2.571), (10, 2.228), (30, 2.042), (1000, 1.962)],
)
def test_t_quantile_matches_tables(df: int, expected: float) -> None:
    assert t_quantile(0.975, df) == pytest.approx(expected, abs=5e-4)
    assert t_quantile(0.025, df) == pytest.approx(-expected, abs=5e-4)


def test_t_quantile_more_digits_and_limits() -> None:
    assert t_quantile(0.975, 1) == pytest.approx(12.7062047362, rel=1e-9)
    assert t_quantile(0.995, 1) == pytest.approx(63.6567411629, rel=1e-9)
    assert t_quantile(0.5, 7) == 0.0
    assert t_quantile(0.975, math.inf) == pytest.approx(1.959963985, rel=1e-9)
    # df = 1 is the Cauchy distribution: quantile tan(pi (p - 1/2)).
    assert t_quantile(0.9999, 1) == pytest.approx(math.tan(math.pi * 0.4999), rel=1e-9)
    with pytest.raises(ValueError):
        t_quantile(1.0, 3)
    with pytest.raises(ValueError):
        t_quantile(0.9, 0)


def test_t_cdf_closed_forms() -> None:
    for t in (-7.5, -1.3, -0.01, 0.0, 0.4, 2.0, 25.0):
        assert t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-13)
        assert t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)), abs=1e-13)
    # far tail keeps relative accuracy (no 1 - (1 - tiny) cancellation)
    assert t_cdf(-1e6, 1) == pytest.approx(1 / (math.pi * 1e6), rel=1e-6)
    for p in (1e-9, 0.01, 0.3, 0.77, 0.999):
        assert t_cdf(t_quantile(p, 3.5), 3.5) == pytest.approx(p, rel=1e-10)


def test_two_sided_p_value_known_case() -> None:
    assert 2 * (1 - t_cdf(2.0, 10)) == pytest.approx(0.0734, abs=5e-5)


def test_incomplete_beta_closed_forms() -> None:
    assert regularized_incomplete_beta(2, 3, 0.4) == pytest.approx(0.5248, abs=1e-13)
    for x in (0.0, 0.1, 0.5, 0.93, 1.0):
        assert regularized_incomplete_beta(1, 4.5, x) == pytest.approx(1 - (1 - x) ** 4.5, abs=1e-13)
        assert regularized_incomplete_beta(3.2, 1, x) == pytest.approx(x**3.2, abs=1e-13)
    assert regularized_incomplete_beta(0.5, 0.5, 0.5) == pytest.approx(0.5, abs=1e-13)


# -- mean_ci -------------------------------------------------------------------------------------


def test_mean_ci_by_hand() -> None:
    mean, low, high = mean_ci([1, 2, 3, 4])
    half = 3.182446305 * math.sqrt(5 / 3) / 2  # t(0.975, 3) * sd / sqrt(n)
    assert mean == 2.5
    assert (low, high) == (pytest.approx(2.5 - half, abs=1e-8), pytest.approx(2.5 + half, abs=1e-8))


def test_mean_ci_degenerate() -> None:
    assert mean_ci([0.7]) == (0.7, -math.inf, math.inf)
    assert mean_ci([0.5, 0.5, 0.5]) == (0.5, 0.5, 0.5)
    with pytest.raises(ValueError, match="no values"):
        mean_ci([])
    with pytest.raises(ValueError, match="NaN"):
        mean_ci([1.0, float("nan")])


# -- paired difference ---------------------------------------------------------------------------


def t4_cdf(t: float) -> float:
    """Closed form of Student's t CDF with 4 degrees of freedom, independent of the module."""
    return 0.5 + (3 / 8) * (t / math.sqrt(1 + t * t / 4)) * (1 - t * t / (12 * (1 + t * t / 4)))


def test_paired_difference_by_hand() -> None:
    before = [0.2, 0.4, 0.5, 0.7, 0.1]
    after = [0.5, 0.4, 0.9, 0.6, 0.4]
    # differences 0.3, 0, 0.4, -0.1, 0.3: mean 0.18, sample variance 0.188 / 4 = 0.047
    result = paired_difference(before, after)
    se = math.sqrt(0.047 / 5)
    half = 2.776445105 * se  # t(0.975, 4)
    assert isinstance(result, PairedResult)
    assert result.n == 5
    assert result.mean_before == pytest.approx(0.38)
    assert result.mean_after == pytest.approx(0.56)
    assert result.mean_diff == pytest.approx(0.18)
    assert result.ci_low == pytest.approx(0.18 - half, abs=1e-8)
    assert result.ci_high == pytest.approx(0.18 + half, abs=1e-8)
    t = 0.18 / se
    assert result.p_value == pytest.approx(2 * (1 - t4_cdf(t)), abs=1e-10)
    assert (result.wins, result.losses, result.ties) == (3, 1, 1)
    assert result.to_dict()["n"] == 5


def test_paired_difference_degenerate_cases() -> None:
    one = paired_difference([0.0], [1.0])
    assert (one.mean_diff, one.ci_low, one.ci_high, one.p_value) == (1.0, -math.inf, math.inf, 1.0)
    same = paired_difference([1, 0, 1], [1, 0, 1])
    assert (same.ci_low, same.ci_high, same.p_value, same.ties) == (0.0, 0.0, 1.0, 3)
    shifted = paired_difference([0.1, 0.2, 0.3], [0.3, 0.4, 0.5])  # equal up to rounding
    assert shifted.ci_low == shifted.ci_high == pytest.approx(0.2)
    assert shifted.p_value == 0.25  # exact sign test: 2 * 0.5^3
    assert not any(math.isnan(v) for v in (one.p_value, same.p_value, shifted.p_value))
    with pytest.raises(ValueError, match="pairs must match"):
        paired_difference([1, 2], [1])
    with pytest.raises(ValueError, match="no values"):
        paired_difference([], [])


# -- pass@k and pass^k ---------------------------------------------------------------------------


def test_pass_at_k_values() -> None:
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_at_k(10, 3, 5) == pytest.approx(1 - 21 / 252)
    assert pass_at_k(5, 3, 3) == 1.0  # only 2 wrong samples: any 3 include a right one
    assert pass_at_k(10, 0, 4) == 0.0
    assert pass_at_k(10, 10, 10) == 1.0
    product = 1 - math.prod(1 - 50 / i for i in range(200 - 13 + 1, 201))
    assert pass_at_k(200, 13, 50) == pytest.approx(product, rel=1e-12)
    with pytest.raises(ValueError, match="at least k samples"):
        pass_at_k(3, 1, 4)
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 0)


def test_pass_hat_k_values() -> None:
    assert pass_hat_k(10, 3, 2) == pytest.approx(3 / 45)
    assert pass_hat_k(10, 3, 1) == pytest.approx(pass_at_k(10, 3, 1))
    assert pass_hat_k(10, 1, 2) == 0.0
    assert pass_hat_k(4, 4, 4) == 1.0
    with pytest.raises(ValueError):
        pass_hat_k(2, 2, 3)
