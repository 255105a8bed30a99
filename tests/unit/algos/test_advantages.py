"""Advantage estimators against values computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from tidal.algos.advantages import (
    ADVANTAGES,
    CRITIC_ADVANTAGES,
    GROUP_ADVANTAGES,
    assign_advantages,
    episode_reward,
    get_advantage,
    group_rewards,
    has_valid_reward,
    needs_critic,
)
from tidal.algos.gae import gae_advantages
from tidal.errors import UnknownNameError
from tidal.types import Completion, Episode, Group, Outcome, Score, Task, VerifierSpec

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


@pytest.mark.parametrize("name", sorted(GROUP_ADVANTAGES))
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


def test_reinforce_pp_by_hand() -> None:
    # Group-centred: g0 +-0.5 (4 valid), g1 +0.5, -0.5, 0 (3 valid), g2 0 (1 valid), g3 0 (4 valid).
    # Batch of 12 valid samples: mean 0, population variance (4 * 0.25 + 2 * 0.25) / 12 = 0.125,
    # std 0.3535534, so +-0.5 -> +-1.4142136 in every group (GRPO gives group 1 +-1.2247449).
    s = 0.5 / math.sqrt(0.125)
    expected = torch.tensor(
        [
            [s, -s, s, -s],
            [s, -s, 0.0, 0.0],
            [0.0, 0.0, 0.0, 0.0],
            [0.0, 0.0, 0.0, 0.0],
        ]
    )
    torch.testing.assert_close(ADVANTAGES["reinforce_pp"](REWARDS, MASK), expected, atol=1e-5, rtol=0)


def test_reinforce_pp_normalises_over_the_batch_not_the_group() -> None:
    """Scaling one group's rewards changes the other group's advantages (a shared std), and a
    group's spread is kept relative to the other's (GRPO would give both +-1)."""
    mask = torch.ones(2, 2, dtype=torch.bool)
    small = ADVANTAGES["reinforce_pp"](torch.tensor([[1.0, 0.0], [0.6, 0.4]]), mask)
    # Centred: +-0.5 and +-0.1; batch std sqrt((2 * 0.25 + 2 * 0.01) / 4) = sqrt(0.13).
    std = math.sqrt(0.13)
    torch.testing.assert_close(small, torch.tensor([[0.5, -0.5], [0.1, -0.1]]) / std, atol=1e-5, rtol=0)
    wider = ADVANTAGES["reinforce_pp"](torch.tensor([[1.0, 0.0], [0.7, 0.3]]), mask)
    assert wider[0, 0] < small[0, 0]
    torch.testing.assert_close(ADVANTAGES["grpo"](torch.tensor([[0.6, 0.4]]), mask[:1]), torch.tensor([[1.0, -1.0]]), atol=1e-4, rtol=0)


def test_gae_is_the_estimator_and_declares_its_critic() -> None:
    """`gae` is registered as the real per-token estimator, among those that need a value model;
    the loop's `assign_advantages` leaves its advantages to the update and sets nothing."""
    assert ADVANTAGES["gae"] is gae_advantages and set(CRITIC_ADVANTAGES) == {"gae"}
    assert needs_critic("gae") and not any(needs_critic(name) for name in GROUP_ADVANTAGES)
    assert set(ADVANTAGES) == set(GROUP_ADVANTAGES) | set(CRITIC_ADVANTAGES)
    with pytest.raises(UnknownNameError):
        needs_critic("ppo_gae_typo")
    episodes = [_episode("a", 0, 1.0), _episode("a", 1, 0.0)]
    for episode in episodes:
        episode.advantage = 7.0  # a value assign_advantages must not touch for gae
    assign_advantages([_group(0, episodes)], "gae")
    assert [e.advantage for e in episodes] == [7.0, 7.0]


def test_a_reward_set_on_the_episode_replaces_the_score() -> None:
    episodes = [_episode("a", 0, 1.0), _episode("a", 1, 0.0), _episode("a", 2, 0.0)]
    episodes[0].reward = 0.25  # e.g. normalised by the loop
    assert episode_reward(episodes[0]) == 0.25 and episode_reward(episodes[1]) == 0.0
    assign_advantages([_group(0, episodes)], "dr_grpo")
    # rewards 0.25, 0, 0: mean 1/12
    assert [e.advantage for e in episodes] == pytest.approx([0.25 - 1 / 12, -1 / 12, -1 / 12])
    episodes[1].reward = float("nan")
    assert not has_valid_reward(episodes[1])
    unscored = _episode("b", 0, None)
    unscored.reward = 1.0  # a reward without a score is not a verdict
    assert not has_valid_reward(unscored)


def test_unknown_estimator_lists_known_names() -> None:
    with pytest.raises(UnknownNameError) as info:
        get_advantage("ppo_gae_typo")
    for name in ("grpo", "rloo", "reinforce_pp", "gae"):
        assert name in str(info.value)


def _episode(group: str, index: int, reward: float | None, outcome: Outcome = Outcome.PASSED) -> Episode:
    completion = Completion([1, 2], [3], [-0.5], "x", "stop", 0)
    score = None if reward is None else Score(reward, outcome)
    return Episode(f"{group}/{index}", "t", "math", group, completion, score=score)


def _group(position: int, episodes: list[Episode]) -> Group:
    task = Task(id=f"t{position}", domain="math", prompt="1 + 1?", verifier=VerifierSpec(name="math", answer="2"))
    return Group(task, position, episodes)


def test_assign_advantages_within_each_group_and_skips_invalid() -> None:
    a = [_episode("a", 0, 1.0), _episode("a", 1, 0.0), _episode("a", 2, 0.0, Outcome.INFRA_ERROR)]  # never a 0 to train on
    b = [_episode("b", 0, 0.0), _episode("b", 1, 1.0), _episode("b", 2, None)]  # the last not scored
    assign_advantages([_group(0, a), _group(1, b)], "dr_grpo")
    assert [e.advantage for e in a] == [0.5, -0.5, 0.0]
    assert [e.advantage for e in b] == [-0.5, 0.5, 0.0]
    assert all(math.isfinite(e.advantage) for e in a + b)


def test_ragged_groups_are_padded_with_invalid_samples() -> None:
    """A group of 2 next to one of 4: the (G, n) rewards are padded with invalid samples, which
    change no baseline."""
    short = [_episode("s", 0, 1.0), _episode("s", 1, 0.0)]
    long = [_episode("l", i, r) for i, r in enumerate([1.0, 1.0, 0.0, 0.0])]
    rewards, mask = group_rewards([_group(0, short), _group(1, long)])
    assert rewards.tolist() == [[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0]]
    assert mask.tolist() == [[True, True, False, False], [True, True, True, True]]
    assign_advantages([_group(0, short), _group(1, long)], "grpo")
    assert [e.advantage for e in short] == pytest.approx([1.0, -1.0], abs=1e-5)
    assert [e.advantage for e in long] == pytest.approx([1.0, 1.0, -1.0, -1.0], abs=1e-5)
    assign_advantages([], "grpo")  # nothing to do
