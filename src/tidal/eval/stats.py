"""Statistics for evaluation: binomial, task-clustered and t intervals, bootstrap intervals of
positive quantities, paired comparison, pass@k and pass^k.

`clustered_interval` is the interval of every pass rate tidal reports (eval summaries, train
summaries): samples of one task are not independent. `wilson_interval` is right only where they
are (one sample per task).

Only numpy and the standard library. The Student t distribution is computed here: its CDF from
the regularized incomplete beta function (a continued fraction), its quantile by bisection on
that CDF, so results match statistical tables to about 1e-12.

Degenerate inputs never produce a silent NaN. An empty sample raises ValueError. A single value
(or pair) carries no information about spread: its interval is unbounded, (-inf, inf), and a
paired p-value is 1.0. A sample without spread gets a zero-width interval; see `paired_difference`
for its p-value.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from statistics import NormalDist
from typing import Any

import numpy as np

_EPSILON = 1e-15
_TINY = 1e-300


def _check_confidence(confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")


# ------------------------------------------------------------------------------------------------
# Special functions


def _beta_continued_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of I_x(a, b) (without its front factor x^a (1-x)^b / (a B(a, b))),
    evaluated with the modified Lentz method. Converges fast for x < (a + 1) / (a + b + 2).

    I_x = front / (1 + d1 / (1 + d2 / (1 + ...))) with
    d_{2m}   =  m (b - m) x / ((a + 2m - 1)(a + 2m)),
    d_{2m+1} = -(a + m)(a + b + m) x / ((a + 2m)(a + 2m + 1)).
    """

    def guard(value: float) -> float:
        return value if abs(value) > _TINY else _TINY

    # Lentz: f = C * D products; start with the 1 + d1/(...) term.
    c = 1.0
    d = 1.0 / guard(1.0 - (a + b) * x / (a + 1.0))
    f = d
    for m in range(1, 10_000):
        even = m * (b - m) * x / ((a + 2 * m - 1.0) * (a + 2 * m))
        d = 1.0 / guard(1.0 + even * d)
        c = guard(1.0 + even / c)
        f *= c * d
        odd = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1.0))
        d = 1.0 / guard(1.0 + odd * d)
        c = guard(1.0 + odd / c)
        delta = c * d
        f *= delta
        if abs(delta - 1.0) < _EPSILON:
            return f
    raise ArithmeticError(f"incomplete beta did not converge for a={a}, b={b}, x={x}")


def regularized_incomplete_beta(a: float, b: float, x: float, y: float | None = None) -> float:
    """I_x(a, b) for a, b > 0 and x in [0, 1]. `y` may pass 1 - x computed without cancellation
    (e.g. t^2 / (df + t^2)), which keeps the upper tail accurate when x is close to 1."""
    if a <= 0 or b <= 0:
        raise ValueError(f"a and b must be > 0, got a={a}, b={b}")
    if y is None:
        y = 1.0 - x
    if not (0.0 <= x <= 1.0 and 0.0 <= y <= 1.0):
        raise ValueError(f"x must be in [0, 1], got {x}")
    if x == 0.0:
        return 0.0
    if y == 0.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log(y)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_continued_fraction(a, b, x) / a
    # Symmetry I_x(a, b) = 1 - I_y(b, a): the fraction converges fast on the other side.
    return 1.0 - math.exp(log_front) * _beta_continued_fraction(b, a, y) / b


def _t_upper_tail(t: float, df: float) -> float:
    """P(T > t) for t >= 0, accurate far into the tail."""
    if math.isinf(t):
        return 0.0
    t2 = t * t
    return 0.5 * regularized_incomplete_beta(df / 2.0, 0.5, df / (df + t2), t2 / (df + t2))


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with `df` > 0 degrees of freedom (df may be fractional)."""
    if not df > 0:
        raise ValueError(f"degrees of freedom must be > 0, got {df}")
    if math.isnan(t):
        raise ValueError("t is NaN")
    tail = _t_upper_tail(abs(t), df)
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The t with P(T <= t) = p, for p in (0, 1) and df > 0; df = inf gives the normal quantile."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p}")
    if not df > 0:
        raise ValueError(f"degrees of freedom must be > 0, got {df}")
    if math.isinf(df):
        return NormalDist().inv_cdf(p)
    if p == 0.5:
        return 0.0
    tail = min(p, 1.0 - p)
    # Bracket the root of P(T > t) = tail (decreasing in t), then Newton steps with the density,
    # falling back to bisection whenever a step would leave the bracket.
    low, high = 0.0, 1.0
    while _t_upper_tail(high, df) > tail:
        low, high = high, high * 2.0
        if math.isinf(high):
            raise ArithmeticError(f"t quantile out of range for p={p}, df={df}")
    value = 0.5 * (low + high)
    for _ in range(200):
        excess = _t_upper_tail(value, df) - tail
        if excess > 0:
            low = value
        else:
            high = value
        density = _t_density(value, df)
        guess = value + excess / density if density > 0 else math.nan
        if not low < guess < high:
            guess = 0.5 * (low + high)
        if abs(guess - value) <= 1e-15 * abs(guess) or guess in (low, high):
            value = guess
            break
        value = guess
    return value if p > 0.5 else -value


def _t_density(t: float, df: float) -> float:
    log_norm = math.lgamma((df + 1.0) / 2.0) - math.lgamma(df / 2.0) - 0.5 * math.log(df * math.pi)
    return math.exp(log_norm - (df + 1.0) / 2.0 * math.log1p(t * t / df))


# ------------------------------------------------------------------------------------------------
# Intervals


def wilson_interval(successes: float, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion successes/n.

    Unlike the normal (Wald) interval it stays inside [0, 1] and keeps its coverage near 0 and 1,
    where eval pass rates often sit. n = 0 returns (0.0, 1.0): nothing is known. `successes` may
    be fractional (a sum of partial scores), within [0, n].
    """
    _check_confidence(confidence)
    if n < 0 or not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n, got successes={successes}, n={n}")
    if n == 0:
        return 0.0, 1.0
    z = NormalDist().inv_cdf(0.5 + confidence / 2.0)
    p = successes / n
    z2 = z * z
    denominator = 1.0 + z2 / n
    center = (p + z2 / (2.0 * n)) / denominator
    half = z * math.sqrt(p * (1.0 - p) / n + z2 / (4.0 * n * n)) / denominator
    # At 0 or n successes the bound is exactly 0 or 1; the formula leaves rounding dust.
    low = 0.0 if successes == 0 else max(0.0, center - half)
    high = 1.0 if successes == n else min(1.0, center + half)
    return low, high


def _wilson_float(p: float, n: float, z: float) -> tuple[float, float]:
    """The Wilson score bounds of a proportion `p` observed over `n` (possibly fractional) samples."""
    z2 = z * z
    denominator = 1.0 + z2 / n
    center = (p + z2 / (2.0 * n)) / denominator
    half = z * math.sqrt(max(0.0, p * (1.0 - p) / n + z2 / (4.0 * n * n))) / denominator
    low = 0.0 if p <= 0.0 else max(0.0, center - half)
    high = 1.0 if p >= 1.0 else min(1.0, center + half)
    return low, high


@dataclass(frozen=True)
class ClusteredRate:
    """A pass rate over samples grouped in clusters (tasks), with its task-clustered interval."""

    rate: float | None  # pooled: successes / samples; None without samples
    low: float
    high: float
    clusters: int  # tasks
    samples: int
    effective_n: float  # samples / design effect, within [clusters, samples]
    design_effect: float  # samples / effective_n: 1 for independent samples, up to samples/clusters


def clustered_interval(successes: Sequence[float], samples: Sequence[int],
                       confidence: float = 0.95) -> ClusteredRate:
    """The Wilson interval of a pooled rate at the effective sample size of task-clustered samples.

    Cluster i (a task) has `successes[i]` of `samples[i]`. Repeats of one task are correlated (at
    temperature 0 identical), so counting them as independent draws overstates what was measured.
    The variance of the pooled rate p = sum(y) / sum(n) is estimated cluster-robustly, with the
    ratio estimator's residuals e_i = y_i - p n_i: var = sum(e_i^2) / sum(n)^2 (Cochran 1977,
    §6.4, without the small-sample factor G/(G-1), so that n_eff is exactly G below). The
    effective sample size p(1-p) / var, kept within [G, N] (a design effect 1 + (m-1) rho lies in
    [1, m] for a within-task correlation rho in [0, 1]), goes into the Wilson formula. Identical
    repeats give n_eff = G: exactly the Wilson interval over the G tasks; independent repeats give
    about N, the Wilson interval over samples. At p = 0 or 1 the variance says nothing about the
    correlation, and the conservative n_eff = G is used. No samples: rate None, interval (0, 1).
    """
    _check_confidence(confidence)
    y = np.asarray(successes, dtype=np.float64).reshape(-1)
    n = np.asarray(samples, dtype=np.float64).reshape(-1)
    if y.size != n.size:
        raise ValueError(f"{y.size} success counts for {n.size} sample counts: one each per cluster")
    if np.any(n < 0) or np.any(y < 0) or np.any(y > n):
        raise ValueError("need 0 <= successes <= samples in every cluster")
    keep = n > 0
    y, n = y[keep], n[keep]
    clusters, total = int(y.size), float(n.sum())
    if clusters == 0:
        return ClusteredRate(None, 0.0, 1.0, 0, 0, 0.0, 1.0)
    rate = float(y.sum() / total)
    variance = float(np.sum((y - rate * n) ** 2)) / total**2
    binomial = rate * (1.0 - rate)
    if binomial <= 0.0:
        effective = float(clusters)
    elif variance <= 1e-15 * binomial:
        effective = total
    else:
        effective = min(total, max(float(clusters), binomial / variance))
    z = NormalDist().inv_cdf(0.5 + confidence / 2.0)
    low, high = _wilson_float(rate, effective, z)
    return ClusteredRate(rate, low, high, clusters, int(total), effective, total / effective)


def _as_array(values: Sequence[float], name: str) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64).reshape(-1)
    if array.size == 0:
        raise ValueError(f"{name}: no values")
    if not np.all(np.isfinite(array)):
        positions = np.flatnonzero(~np.isfinite(array)).tolist()[:10]
        raise ValueError(f"{name}: holds NaN or infinite values at positions {positions}")
    return array


def _t_interval(mean: float, sd: float, n: int, confidence: float) -> tuple[float, float]:
    if n < 2:
        return -math.inf, math.inf
    if sd == 0.0:
        return mean, mean
    half = t_quantile(0.5 + confidence / 2.0, n - 1) * sd / math.sqrt(n)
    return mean - half, mean + half


def mean_ci(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high): the Student t interval mean ± t_{(1+c)/2, n-1} · sd / sqrt(n).

    One value gives (value, -inf, inf); values without spread give a zero-width interval.
    """
    _check_confidence(confidence)
    array = _as_array(values, "values")
    mean = float(array.mean())
    sd = float(array.std(ddof=1)) if array.size > 1 else 0.0
    low, high = _t_interval(mean, sd, int(array.size), confidence)
    return mean, low, high


def positive_mean_ci(values: Sequence[float], confidence: float = 0.95, draws: int = 2000,
                     seed: int = 0) -> tuple[float, float, float]:
    """(mean, low, high) of a quantity that is never negative (a time, a speed): the percentile
    bootstrap of the mean (`draws` resamples, seeded), which lies within the values' range, so
    never below 0, where the t interval of a small, skewed sample of times reaches below 0 (a
    time to first token of [-0.004, 0.049] s). Like any percentile bootstrap it is somewhat too
    narrow for a handful of values.

    One value gives (value, 0, inf); values without spread a zero-width interval; a negative value
    raises ValueError.
    """
    _check_confidence(confidence)
    array = _as_array(values, "values")
    if np.any(array < 0):
        raise ValueError(f"values: a positive quantity holds negative values at positions "
                         f"{np.flatnonzero(array < 0).tolist()[:10]}")
    mean = float(array.mean())
    if array.size < 2:
        return mean, 0.0, math.inf
    if float(array.min()) == float(array.max()):
        return mean, mean, mean
    picks = np.random.default_rng(seed).integers(0, array.size, size=(draws, array.size))
    means = array[picks].mean(axis=1)
    tail = (1.0 - confidence) / 2.0 * 100.0
    low, high = np.percentile(means, [tail, 100.0 - tail])
    return mean, float(low), float(high)


# ------------------------------------------------------------------------------------------------
# Paired comparison


@dataclass(frozen=True)
class PairedResult:
    """Before/after on the same items; `diff` = after - before, a win is after > before."""

    n: int
    mean_before: float
    mean_after: float
    mean_diff: float
    ci_low: float
    ci_high: float
    p_value: float  # two-sided
    wins: int
    losses: int
    ties: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def paired_difference(
    before: Sequence[float], after: Sequence[float], confidence: float = 0.95
) -> PairedResult:
    """Paired t interval and two-sided paired t-test of mean(after - before) over the same items.

    Pairing keeps the covariance between the two scores of an item, which makes the interval far
    narrower than comparing two independent means. Degenerate cases:
      - n = 1: interval (-inf, inf), p_value 1.0 (one pair says nothing about spread);
      - every difference 0: interval (0, 0), p_value 1.0;
      - every difference the same nonzero value: interval of zero width at it; the t statistic
        would be infinite, so the p-value is that of the exact two-sided sign test,
        min(1, 2 · 0.5^n), which is what n identical moves support.
    """
    _check_confidence(confidence)
    first = _as_array(before, "before")
    second = _as_array(after, "after")
    if first.size != second.size:
        raise ValueError(f"before has {first.size} values, after has {second.size}: pairs must match")
    diff = second - first
    n = int(diff.size)
    mean_diff = float(diff.mean())
    sd = float(diff.std(ddof=1)) if n > 1 else 0.0
    # Tiny spreads are rounding noise of equal differences (e.g. 0.1 - 0.3 vs 0.2 - 0.4).
    if sd <= 1e-12 * max(1.0, float(np.abs(diff).max())):
        sd = 0.0
    ci_low, ci_high = _t_interval(mean_diff, sd, n, confidence)
    if n < 2 or (sd == 0.0 and mean_diff == 0.0):
        p_value = 1.0
    elif sd == 0.0:
        p_value = min(1.0, 2.0 * 0.5**n)
    else:
        t_statistic = mean_diff / (sd / math.sqrt(n))
        p_value = min(1.0, 2.0 * _t_upper_tail(abs(t_statistic), n - 1))
    return PairedResult(
        n=n,
        mean_before=float(first.mean()),
        mean_after=float(second.mean()),
        mean_diff=mean_diff,
        ci_low=ci_low,
        ci_high=ci_high,
        p_value=p_value,
        wins=int(np.sum(diff > 0)),
        losses=int(np.sum(diff < 0)),
        ties=int(np.sum(diff == 0)),
    )


# ------------------------------------------------------------------------------------------------
# pass@k and pass^k


def _check_counts(n: int, c: int, k: int) -> None:
    for name, value in (("n", n), ("c", c), ("k", k)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"{name} must be an int, got {value!r}")
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got n={n}, c={c}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if k > n:
        raise ValueError(f"k={k} needs at least k samples per task, got n={n}")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct: 1 - C(n-c, k) / C(n, k) (Chen et al. 2021),
    the chance that at least one of k samples drawn without replacement is correct.
    1.0 when fewer than k samples are wrong. Raises ValueError when k > n."""
    _check_counts(n, c, k)
    n, c, k = int(n), int(c), int(k)
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_hat_k(n: int, c: int, k: int) -> float:
    """pass^k from n samples with c correct: C(c, k) / C(n, k) (Yao et al. 2024, tau-bench), the
    chance that all of k samples are correct, a reliability measure. pass^1 = pass@1.
    0.0 when fewer than k samples are correct. Raises ValueError when k > n."""
    _check_counts(n, c, k)
    n, c, k = int(n), int(c), int(k)
    if c < k:
        return 0.0
    return math.comb(c, k) / math.comb(n, k)
