"""Per-domain reward normalisers, checked against values computed by hand, plus a resume that must match an uninterrupted run."""

from __future__ import annotations

import json
import math
import random

import pytest
from pydantic import ValidationError

from tidal.domains.normalize import NORMALISERS, NormaliserConfig, RewardNormaliser
from tidal.errors import CheckpointError, UnknownNameError

NAN = float("nan")
INF = float("inf")


def one(domain: str = "d", **config: object) -> RewardNormaliser:
    return RewardNormaliser({domain: NormaliserConfig(**config)})


def test_names_match_config_kinds() -> None:
    assert set(NORMALISERS) == {"none", "running", "per_reward", "rank"}


def test_none_is_identity_and_maps_non_finite_to_nan() -> None:
    out = one(kind="none").normalise("d", [0.5, -3.0, INF, NAN])
    assert out[:2] == [0.5, -3.0]
    assert math.isnan(out[2]) and math.isnan(out[3])


# ---- running -------------------------------------------------------------------------------


def test_running_welford_by_hand() -> None:
    norm = one(kind="running", min_count=2, eps=1e-12)
    # Batch 1 = [1, 3]: mean 2, population var ((1-2)^2 + (3-2)^2) / 2 = 1, std 1 -> [-1, 1].
    assert norm.normalise("d", [1.0, 3.0]) == pytest.approx([-1.0, 1.0])
    # Batch 2 = [5]: stream 1, 3, 5 -> mean 3, var (4 + 0 + 4) / 3 = 8/3, std 1.6329932
    # -> (5 - 3) / 1.6329932 = 1.2247449.
    assert norm.normalise("d", [5.0]) == pytest.approx([1.2247449])
    stats = norm.stats()
    assert stats["norm/d/mean"] == pytest.approx(3.0)
    assert stats["norm/d/std"] == pytest.approx(1.6329932)
    assert stats["norm/d/count"] == 3


def test_running_ema_by_hand() -> None:
    norm = one(kind="running", momentum=0.5, min_count=1, eps=1e-12)
    # rate = 1 - momentum = 0.5.
    # x=0: first reward sets mean 0, var 0.
    # x=2: delta 2, mean 0 + 0.5*2 = 1, var 0.5 * (0 + 0.5*4) = 1.
    # x=4: delta 3, mean 1 + 0.5*3 = 2.5, var 0.5 * (1 + 0.5*9) = 2.75, std 1.6583124.
    out = norm.normalise("d", [0.0, 2.0, 4.0])
    # (0 - 2.5) / 1.6583124 = -1.5075567, (2 - 2.5) / ... = -0.3015113, (4 - 2.5) / ... = 0.9045340.
    assert out == pytest.approx([-1.5075567, -0.3015113, 0.9045340])
    assert norm.stats()["norm/d/mean"] == pytest.approx(2.5)
    # Welford on the same stream would give mean 2: the EMA really is different.
    assert one(kind="running", min_count=1).normalise("d", [0.0, 2.0, 4.0])[1] == pytest.approx(0.0, abs=1e-6)


def test_running_first_batch_is_normalised_against_itself_not_by_zero_std() -> None:
    # min_count 1: the very first batch [0, 4] (mean 2, std 2) is scaled, not divided by 0.
    assert one(kind="running", min_count=1, eps=1e-12).normalise("d", [0.0, 4.0]) == pytest.approx([-1.0, 1.0])
    # A single first reward: std 0, (r - mean) = 0, so 0 and not a huge or NaN value.
    assert one(kind="running", min_count=1).normalise("d", [7.0]) == [0.0]


def test_running_below_min_count_only_centres() -> None:
    norm = one(kind="running", min_count=5, eps=1e-12)
    # 2 rewards seen < 5: centred only, (0 - 2, 4 - 2) = (-2, 2), not (-1, 1).
    assert norm.normalise("d", [0.0, 4.0]) == pytest.approx([-2.0, 2.0])
    # 5 rewards seen (0, 4, 2, 2, 4): mean 2.4, var (5.76 + 2.56 + 0.16 + 0.16 + 2.56) / 5 = 2.24,
    # std 1.4966630: now scaled. (2 - 2.4) / 1.4966630 = -0.2672612, (4 - 2.4) / ... = 1.0690450.
    assert norm.normalise("d", [2.0, 2.0, 4.0]) == pytest.approx([-0.2672612, -0.2672612, 1.0690450])


def test_running_clip() -> None:
    norm = one(kind="running", min_count=1, clip=1.5, eps=1e-12)
    # [0, 0, 0, 10]: mean 2.5, var (3 * 6.25 + 56.25) / 4 = 18.75, std 4.3301270.
    # 10 -> 7.5 / 4.3301270 = 1.7320508 clipped to 1.5; 0 -> -0.5773503 unclipped.
    assert norm.normalise("d", [0.0, 0.0, 0.0, 10.0]) == pytest.approx([-0.5773503] * 3 + [1.5])


def test_running_skips_non_finite_rewards() -> None:
    norm = one(kind="running", min_count=1, eps=1e-12)
    out = norm.normalise("d", [1.0, NAN, 3.0, INF, -INF])
    # Only 1 and 3 enter the statistics: mean 2, std 1.
    assert out[0] == pytest.approx(-1.0) and out[2] == pytest.approx(1.0)
    assert all(math.isnan(v) for v in (out[1], out[3], out[4]))
    assert norm.stats()["norm/d/count"] == 2
    assert norm.stats()["norm/d/mean"] == pytest.approx(2.0)


def test_domains_are_independent_and_unknown_domain_raises() -> None:
    norm = RewardNormaliser(
        {"code": NormaliserConfig(kind="running", min_count=1), "rm": NormaliserConfig(kind="running", min_count=1)}
    )
    norm.normalise("code", [0.0, 1.0])
    norm.normalise("rm", [-5.0, 5.0])
    assert norm.stats()["norm/code/mean"] == pytest.approx(0.5)
    assert norm.stats()["norm/rm/mean"] == pytest.approx(0.0)
    with pytest.raises(UnknownNameError, match="unknown domain 'math'.*code, rm"):
        norm.normalise("math", [1.0])


def test_config_bounds_and_extra_fields() -> None:
    with pytest.raises(ValidationError):
        NormaliserConfig(kind="running", momentum=1.0)
    with pytest.raises(ValidationError):
        NormaliserConfig(kind="zscore")
    with pytest.raises(ValidationError):
        NormaliserConfig(kind="running", windw=10)
    with pytest.raises(ValidationError):
        NormaliserConfig(kind="per_reward", component_weights={"a": NAN})


# ---- per_reward ----------------------------------------------------------------------------


def test_per_reward_by_hand() -> None:
    norm = one(kind="per_reward", min_count=1, eps=1e-12, component_weights={"a": 0.8, "b": 0.2})
    components = [{"a": 0.0, "b": 100.0}, {"a": 1.0, "b": 0.0}, {"a": 1.0, "b": 50.0, "debug": 9.0}]
    # a = [0, 1, 1]: mean 2/3, var (4/9 + 1/9 + 1/9) / 3 = 2/9, std 0.4714045
    #   -> z_a = [-1.4142136, 0.7071068, 0.7071068]
    # b = [100, 0, 50]: mean 50, var (2500 + 2500 + 0) / 3 = 5000/3, std 40.8248290
    #   -> z_b = [1.2247449, -1.2247449, 0]
    # 0.8 z_a + 0.2 z_b = [-1.1313708 + 0.2449490, 0.5656854 - 0.2449490, 0.5656854]
    # ("debug" has no weight and is ignored.)
    out = norm.normalise("d", [1.0, 1.0, 1.0], components)
    assert out == pytest.approx([-0.8864218, 0.3207364, 0.5656854])
    assert norm.stats()["norm/d/b/std"] == pytest.approx(40.8248290)


def test_per_reward_large_scale_component_does_not_dominate() -> None:
    rng = random.Random(0)
    components = [{"tests": rng.random(), "style": 100 * rng.random()} for _ in range(400)]
    weights = {"tests": 0.5, "style": 0.5}
    raw_ratio = _spread([c["style"] for c in components]) / _spread([c["tests"] for c in components])
    assert raw_ratio > 50  # on raw scales the style score would dominate a plain weighted sum

    norm = one(kind="per_reward", min_count=1, component_weights=weights)
    total = norm.normalise("d", [0.0] * len(components), components)
    # Contribution of each component to the normalised sum: drop one component by zero weight.
    only_tests = one(kind="per_reward", min_count=1, component_weights={"tests": 0.5, "style": 0.0})
    only_style = one(kind="per_reward", min_count=1, component_weights={"tests": 0.0, "style": 0.5})
    tests_part = only_tests.normalise("d", [0.0] * len(components), components)
    style_part = only_style.normalise("d", [0.0] * len(components), components)
    assert total == pytest.approx([t + s for t, s in zip(tests_part, style_part)])
    assert 0.8 < _spread(style_part) / _spread(tests_part) < 1.25


def _spread(values: list[float]) -> float:
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))


def test_per_reward_missing_component_names_domain_component_and_sample() -> None:
    norm = one("code", kind="per_reward", component_weights={"tests": 0.8, "style": 0.2})
    with pytest.raises(ValueError, match=r"domain 'code', sample 1: component 'style' is missing"):
        norm.normalise("code", [1.0, 1.0], [{"tests": 1.0, "style": 0.5}, {"tests": 0.0}])
    # Nothing was updated by the rejected batch.
    assert norm.stats() == {}


def test_per_reward_needs_components_and_weights() -> None:
    with pytest.raises(ValueError, match="pass each sample's `components`"):
        one(kind="per_reward", component_weights={"a": 1.0}).normalise("d", [1.0])
    with pytest.raises(ValueError, match="no component weights"):
        one(kind="per_reward").normalise("d", [1.0], [{"a": 1.0}])
    with pytest.raises(ValueError, match="2 rewards but 1 component"):
        one(kind="per_reward", component_weights={"a": 1.0}).normalise("d", [1.0, 2.0], [{"a": 1.0}])


def test_per_reward_call_weights_replace_config_and_non_finite_samples_are_skipped() -> None:
    norm = one(kind="per_reward", min_count=1, eps=1e-12, component_weights={"a": 1.0})
    components = [{"a": 0.0, "b": 0.0}, {"a": 2.0, "b": NAN}, {"a": 2.0, "b": 10.0}, {"a": 5.0, "b": 5.0}]
    out = norm.normalise("d", [1.0, 1.0, 1.0, NAN], components, weights={"b": 1.0})
    # Sample 1 (b is NaN) and sample 3 (reward NaN) are invalid: b stats from [0, 10] only,
    # mean 5, std 5 -> [-1, nan, 1, nan]. Component a is not weighted, so it has no statistics.
    assert out[0] == pytest.approx(-1.0) and out[2] == pytest.approx(1.0)
    assert math.isnan(out[1]) and math.isnan(out[3])
    assert set(norm.stats()) == {"norm/d/b/mean", "norm/d/b/std", "norm/d/b/count"}


# ---- rank ----------------------------------------------------------------------------------


def test_rank_ties_get_mid_rank() -> None:
    norm = one(kind="rank", window=4)
    # Window [1, 2, 2, 3]: 1 -> (0 + 0.5) / 4 = 0.125; 2 -> (1 + 0.5*2) / 4 = 0.5; 3 -> 3.5 / 4 = 0.875;
    # minus 0.5.
    assert norm.normalise("d", [1.0, 2.0, 2.0, 3.0]) == pytest.approx([-0.375, 0.0, 0.0, 0.375])
    # All equal: every sample sits at the middle.
    assert one(kind="rank").normalise("d", [4.0, 4.0, 4.0]) == [0.0, 0.0, 0.0]


def test_rank_window_evicts_oldest() -> None:
    norm = one(kind="rank", window=4)
    norm.normalise("d", [1.0, 2.0, 2.0, 3.0])
    # Window [2, 2, 3, 0] (1 evicted): 0 -> 0.5 / 4 - 0.5 = -0.375.
    assert norm.normalise("d", [0.0]) == pytest.approx([-0.375])
    # Window [2, 3, 0, 2.5] (one 2 evicted): 2.5 has 2 below -> 2.5 / 4 - 0.5 = 0.125.
    # Without eviction ([2, 2, 3, 0, 2.5]) it would be 3.5 / 5 - 0.5 = 0.2.
    assert norm.normalise("d", [2.5]) == pytest.approx([0.125])
    assert norm.stats() == {"norm/d/window": 4}


def test_rank_skips_non_finite() -> None:
    out = one(kind="rank").normalise("d", [NAN, 1.0, INF, 2.0])
    # Window [1, 2]: 1 -> 0.5 / 2 - 0.5 = -0.25, 2 -> 1.5 / 2 - 0.5 = 0.25.
    assert math.isnan(out[0]) and math.isnan(out[2])
    assert out[1] == pytest.approx(-0.25) and out[3] == pytest.approx(0.25)


# ---- resume --------------------------------------------------------------------------------

CONFIGS = {
    "code": NormaliserConfig(kind="running", min_count=3, clip=3.0),
    "rm": NormaliserConfig(kind="running", momentum=0.9, min_count=1),
    "multi": NormaliserConfig(kind="per_reward", min_count=2, component_weights={"tests": 0.8, "style": 0.2}),
    "chat": NormaliserConfig(kind="rank", window=5),
    "plain": NormaliserConfig(kind="none"),
}


def _batch(rng: random.Random, domain: str) -> tuple[list[float], list[dict[str, float]] | None]:
    rewards = [rng.uniform(-5, 5) for _ in range(4)]
    if domain != "multi":
        return rewards, None
    return rewards, [{"tests": rng.random(), "style": 100 * rng.random()} for _ in rewards]


def test_state_dict_json_round_trip_matches_uninterrupted_run() -> None:
    rng = random.Random(1)
    batches = [(domain, *_batch(rng, domain)) for _ in range(3) for domain in CONFIGS]
    uninterrupted = RewardNormaliser(CONFIGS)
    first = RewardNormaliser(CONFIGS)
    for domain, rewards, components in batches[:10]:
        uninterrupted.normalise(domain, rewards, components)
        first.normalise(domain, rewards, components)
    resumed = RewardNormaliser(CONFIGS)
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    assert resumed.stats() == uninterrupted.stats()
    for domain, rewards, components in batches[10:]:
        expected = uninterrupted.normalise(domain, rewards, components)
        assert resumed.normalise(domain, rewards, components) == expected
        # The state does matter: a fresh normaliser gives different values on stateful domains.
        if domain != "plain":
            assert RewardNormaliser(CONFIGS).normalise(domain, rewards, components) != expected


def test_load_state_dict_rejects_other_domains_or_kinds() -> None:
    state = RewardNormaliser(CONFIGS).state_dict()
    with pytest.raises(CheckpointError, match=r"covers domains .* but the config has"):
        RewardNormaliser({"code": CONFIGS["code"]}).load_state_dict(state)
    other = dict(CONFIGS, chat=NormaliserConfig(kind="running"))
    with pytest.raises(CheckpointError, match="domain 'chat' is of kind 'rank' but the config says 'running'"):
        RewardNormaliser(other).load_state_dict(state)
