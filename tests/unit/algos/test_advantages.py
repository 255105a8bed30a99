"""Advantage estimators against values computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from tidal.algos.advantages import ADVANTAGES, assign_advantages, get_advantage
from tidal.errors import UnknownNameError
from tidal.types import Completion, Episode, Outcome, Score

NAN = float("nan")

# Group 0: four valid rewards 1, 0, 1, 0 -> mean 0.5, population std 0.5.
# Group 1: three valid rewards 1, 0, 0.5 and one invalid (NaN) -> mean 0.5,
#          population std sqrt((0.25 + 0.25 + 0) / 3) = sqrt(1/6) = 0.4082483.
# Group 2: one valid reward: no baseline, all 0.
# Group 3: equal rewards: all 0.
REWARDS = torch.tensor(
    [
        [1.0, 0.0, 1.0, 0.0],
        [1.0, 0.0, 0.5, NAN],
        [1.0, NAN, NAN, NAN],
        [1.0, 1.0, 1.0, 1.0],
    ]
)
MASK = torch.tensor(
    [
        [True, True, True, True],
        [True, True, True, False],
        [True, False, False, False],
        [True, True, True, True],
    ]
)


def test_grpo_by_hand() -> None:
    expected = torch.tensor(
        [
            [1.0, -1.0, 1.0, -1.0],  # +-0.5 / 0.5
            [1.2247449, -1.2247449, 0.0, 0.0],  # +-0.5 / 0.4082483
            [0.0, 0.0, 0.0, 0.0],
            [0.0, 0.0, 0.0, 0.0],
        ]
    )
    torch.testing.assert_close(ADVANTAGES["grpo"](REWARDS, MASK), expected, atol=1e-5, rtol=0)


def test_dr_grpo_by_hand() -> None:
    expected = torch.tensor(
        [
            [0.5, -0.5, 0.5, -0.5],
            [0.5, -0.5, 0.0, 0.0],
            [0.0, 0.0, 0.0, 0.0],
            [0.0, 0.0, 0.0, 0.0],
        ]
    )
    torch.testing.assert_close(ADVANTAGES["dr_grpo"](REWARDS, MASK), expected)


def test_rloo_by_hand() -> None:
    # Group 0: 1 - (0 + 1 + 0)/3 = 2/3; 0 - (1 + 1 + 0)/3 = -2/3.
    # Group 1: 1 - (0 + 0.5)/2 = 0.75; 0 - (1 + 0.5)/2 = -0.75; 0.5 - (1 + 0)/2 = 0.
    expected = torch.tensor(
        [
            [2 / 3, -2 / 3, 2 / 3, -2 / 3],
            [0.75, -0.75, 0.0, 0.0],
            [0.0, 0.0, 0.0, 0.0],
            [0.0, 0.0, 0.0, 0.0],
        ]
    )
    torch.testing.assert_close(ADVANTAGES["rloo"](REWARDS, MASK), expected)


@pytest.mark.parametrize("name", sorted(ADVANTAGES))
def test_masked_samples_do_not_enter_the_baseline(name: str) -> None:
    """Changing an invalid sample's reward changes nothing; it always gets 0."""
    estimator = get_advantage(name)
    rewards = torch.tensor([[1.0, 0.0, 0.5, 0.0]])
    mask = torch.tensor([[True, True, True, False]])
    base = estimator(rewards, mask)
    other = estimator(torch.tensor([[1.0, 0.0, 0.5, 100.0]]), mask)
    torch.testing.assert_close(base, other)
    assert base[0, 3] == 0.0
    assert torch.isfinite(estimator(REWARDS, MASK)).all()


def test_unknown_estimator_lists_known_names() -> None:
    with pytest.raises(UnknownNameError) as info:
        get_advantage("ppo_gae_typo")
    assert "grpo" in str(info.value) and "rloo" in str(info.value)


def _episode(group: str, index: int, reward: float | None, outcome: Outcome = Outcome.PASSED) -> Episode:
    completion = Completion([1, 2], [3], [-0.5], "x", "stop", 0)
    score = None if reward is None else Score(reward, outcome)
    return Episode(f"{group}/{index}", "t", "math", group, completion, score=score)


def test_assign_advantages_groups_by_id_and_skips_invalid() -> None:
    episodes = [
        _episode("a", 0, 1.0),
        _episode("b", 0, 0.0),
        _episode("a", 1, 0.0),
        _episode("a", 2, 0.0, Outcome.INFRA_ERROR),  # never a 0 to train on
        _episode("b", 1, 1.0),
        _episode("b", 2, None),  # not scored
    ]
    assign_advantages(episodes, "dr_grpo")
    assert [e.advantage for e in episodes] == [0.5, -0.5, -0.5, 0.0, 0.5, 0.0]
    assert all(math.isfinite(e.advantage) for e in episodes)
