"""Agreement statistics between model rewards and rule rewards, against hand-computed values."""

from __future__ import annotations

import pytest

from tidal.reward.agreement import (
    agreement,
    agreement_metrics,
    cohen_kappa,
    ranks,
    spearman,
)


def test_perfect_and_inverted_agreement() -> None:
    same = agreement([0.9, 0.1, 0.8, 0.2], [1.0, 0.0, 1.0, 0.0])
    assert same["pearson"] == pytest.approx(0.9899, abs=1e-4) and same["spearman"] == pytest.approx(0.8944, abs=1e-4)
    assert same["agreement"] == 1.0 and same["kappa"] == 1.0 and same["n"] == 4
    flipped = agreement([0.1, 0.9, 0.2, 0.8], [1.0, 0.0, 1.0, 0.0])
    assert flipped["agreement"] == 0.0 and flipped["kappa"] == -1.0 and flipped["pearson"] < -0.98


def test_kappa_matches_a_hand_computed_table() -> None:
    # 10 pairs: both pass 4, both fail 3, model-only 2, rule-only 1 -> po 0.7, pe 0.6*0.5+0.4*0.5 = 0.5
    model = [True] * 4 + [False] * 3 + [True] * 2 + [False]
    rule = [True] * 4 + [False] * 3 + [False] * 2 + [True]
    assert cohen_kappa(model, rule) == pytest.approx(0.4)


def test_ties_get_mean_ranks_and_constant_sides_give_none() -> None:
    assert ranks([3, 1, 3, 2]) == [3.5, 1.0, 3.5, 2.0]
    assert spearman([1, 2, 3], [5, 5, 5]) is None
    stats = agreement([1.0, 1.0], [1.0, 1.0])
    assert stats["pearson"] is None and stats["kappa"] is None and stats["agreement"] == 1.0


def test_metrics_pair_only_samples_with_both_rewards() -> None:
    components = [{"reward/task": 1.0, "reward/llm_judge": 0.9}, {"reward/task": 0.0, "reward/llm_judge": 0.2},
                  {"reward/task": 1.0}, {"reward/task": 0.0, "reward/llm_judge": 0.7}]
    metrics = agreement_metrics(components, ["llm_judge", "reward_model"])
    assert metrics["agreement/llm_judge/n"] == 3 and metrics["agreement/llm_judge/agreement"] == pytest.approx(2 / 3)
    assert not any(key.startswith("agreement/reward_model") for key in metrics)
