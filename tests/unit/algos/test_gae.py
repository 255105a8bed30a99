"""GAE, token rewards, whitening and the clipped value loss against values computed by hand."""

from __future__ import annotations

import pytest
import torch

from tidal.algos.gae import (
    clipped_value_loss,
    explained_variance,
    gae,
    gae_advantages,
    token_rewards,
    whiten,
)

# One completion of 4 tokens, reward 1 at the end; the value model's values V_0..V_3.
REWARDS = torch.tensor([[0.0, 0.0, 0.0, 1.0]])
VALUES = torch.tensor([[0.5, 0.6, 0.4, 0.8]])
# gamma 1, lam 0.95, V after the last token = 0:
#   t=3: delta = 1 - 0.8 = 0.2;          A3 = 0.2
#   t=2: delta = 0.8 - 0.4 = 0.4;        A2 = 0.4 + 0.95 * 0.2 = 0.59
#   t=1: delta = 0.4 - 0.6 = -0.2;       A1 = -0.2 + 0.95 * 0.59 = 0.3605
#   t=0: delta = 0.6 - 0.5 = 0.1;        A0 = 0.1 + 0.95 * 0.3605 = 0.442475
ADVANTAGES = torch.tensor([[0.442475, 0.3605, 0.59, 0.2]])
RETURNS = ADVANTAGES + VALUES  # 0.942475, 0.9605, 0.99, 1.0


def test_gae_1x4_by_hand() -> None:
    advantages, returns = gae(REWARDS, VALUES, torch.ones(1, 4), gamma=1.0, lam=0.95)
    torch.testing.assert_close(advantages, ADVANTAGES)
    torch.testing.assert_close(returns, RETURNS)


def test_gae_skips_prompt_padding_and_gaps() -> None:
    """The same completion behind a prompt, with a non-trained position inside (tool output)
    and padding after it: the masked tokens get the same advantages, everything else 0."""
    mask = torch.tensor([[0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 0.0]])
    rewards = torch.tensor([[0.0, 0.0, 0.0, 0.0, 5.0, 0.0, 1.0, 0.0]])  # 5.0 is off the mask
    values = torch.tensor([[9.0, 9.0, 0.5, 0.6, 9.0, 0.4, 0.8, float("nan")]])
    advantages, returns = gae(rewards, values, mask, gamma=1.0, lam=0.95)
    on = mask[0] > 0
    torch.testing.assert_close(advantages[0, on], ADVANTAGES[0])
    torch.testing.assert_close(returns[0, on], RETURNS[0])
    assert (advantages[0, ~on] == 0).all() and (returns[0, ~on] == 0).all()


def test_gae_limits() -> None:
    """lam = 1: Monte Carlo returns (sum of the rewards to come, gamma-discounted), whatever the
    values; lam = 0: one-step TD targets r_t + gamma * V_{t+1}."""
    rewards = torch.tensor([[-0.1, -0.2, 0.0, 1.0]])
    _, returns = gae(rewards, VALUES, torch.ones(1, 4), gamma=1.0, lam=1.0)
    torch.testing.assert_close(returns, torch.tensor([[0.7, 0.8, 1.0, 1.0]]))
    _, returns = gae(rewards, VALUES, torch.ones(1, 4), gamma=0.5, lam=1.0)
    # 1 at t=3; 0 + 0.5 * 1 = 0.5; -0.2 + 0.25 = 0.05; -0.1 + 0.025 = -0.075
    torch.testing.assert_close(returns, torch.tensor([[-0.075, 0.05, 0.5, 1.0]]))
    _, returns = gae(rewards, VALUES, torch.ones(1, 4), gamma=1.0, lam=0.0)
    torch.testing.assert_close(returns, torch.tensor([[-0.1 + 0.6, -0.2 + 0.4, 0.8, 1.0]]))


def test_token_rewards_put_the_reward_on_the_last_token_and_subtract_the_kl() -> None:
    mask = torch.tensor([[0.0, 1.0, 1.0, 1.0], [0.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    rewards = torch.tensor([1.0, 0.5, 7.0])
    expected = torch.tensor([[0.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.5, 0.0], [0.0, 0.0, 0.0, 0.0]])
    torch.testing.assert_close(token_rewards(rewards, mask), expected)
    kl = torch.tensor([[9.0, 0.2, -0.1, 0.4], [9.0, 0.3, 0.3, 9.0], [9.0, 9.0, 9.0, 9.0]])
    expected_kl = expected - 0.5 * kl * mask  # the KL only on trained tokens
    torch.testing.assert_close(token_rewards(rewards, mask, kl, kl_coef=0.5), expected_kl)
    assert token_rewards(rewards, mask, kl, 0.5)[0].tolist() == pytest.approx([0.0, -0.1, 0.05, 0.8])


def test_the_estimator_is_token_rewards_then_gae_then_whitening() -> None:
    """`gae_advantages` (ADVANTAGES["gae"]): the sequence reward on the last trained token (minus
    the per-token KL), GAE, then whitened advantages; the returns are not whitened."""
    mask = torch.tensor([[0.0, 1.0, 1.0, 1.0], [0.0, 1.0, 1.0, 0.0]])
    values = torch.tensor([[0.0, 0.6, 0.4, 0.8], [0.0, 0.2, -0.3, 0.0]])
    rewards, kl = torch.tensor([1.0, 0.5]), torch.full((2, 4), 0.1)
    advantages, returns = gae_advantages(rewards, values, mask, gamma=1.0, lam=0.95, kl=kl, kl_coef=0.5)
    raw, expected_returns = gae(token_rewards(rewards, mask, kl, 0.5), values, mask, 1.0, 0.95)
    torch.testing.assert_close(advantages, whiten(raw, mask))
    torch.testing.assert_close(returns, expected_returns)
    # The 1x4 example above, without a KL: the returns computed by hand.
    _, plain = gae_advantages(rewards[:1], VALUES, torch.ones(1, 4), gamma=1.0, lam=0.95)
    torch.testing.assert_close(plain, RETURNS)


def test_whiten_over_the_masked_tokens_of_the_batch() -> None:
    values = torch.tensor([[1.0, 2.0, 100.0], [3.0, 4.0, 5.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    out = whiten(values, mask)
    # mean 3, population std sqrt((4 + 1 + 0 + 1 + 4) / 5) = sqrt(2)
    expected = torch.tensor([[-2.0, -1.0, 0.0], [0.0, 1.0, 2.0]]) / 2**0.5
    torch.testing.assert_close(out, expected)


def test_clipped_value_loss_by_hand() -> None:
    old = torch.zeros(1, 3)
    returns = torch.ones(1, 3)
    values = torch.tensor([[0.5, -0.5, 0.1]], requires_grad=True)
    loss = clipped_value_loss(values, old, returns, clip=0.2)
    # 0.5: unclipped (0.5 - 1)^2 = 0.25, clipped to 0.2: 0.64 -> the max, 0.32, and no gradient
    # -0.5: unclipped 2.25, clipped to -0.2: 1.44 -> 1.125, gradient (v - R) = -1.5
    # 0.1: inside the clip range: 0.5 * 0.81 = 0.405, gradient -0.9
    torch.testing.assert_close(loss, torch.tensor([[0.32, 1.125, 0.405]]))
    loss.sum().backward()
    torch.testing.assert_close(values.grad, torch.tensor([[0.0, -1.5, -0.9]]))


def test_explained_variance_by_hand() -> None:
    returns = torch.tensor([[1.0, 2.0, 3.0, 50.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    assert explained_variance(returns.clone(), returns, mask) == pytest.approx(1.0)
    assert explained_variance(torch.full((1, 4), 2.0), returns, mask) == pytest.approx(0.0)
    # V = 0, 2, 4: R - V = 1, 0, -1 varies as much as R (2/3 each): 0; half that residual: 0.75
    assert explained_variance(torch.tensor([[0.0, 2.0, 4.0, 0.0]]), returns, mask) == pytest.approx(0.0)
    assert explained_variance(torch.tensor([[0.5, 2.0, 3.5, 0.0]]), returns, mask) == pytest.approx(0.75)
    assert explained_variance(torch.zeros(1, 4), torch.ones(1, 4), torch.ones(1, 4)) == 0.0  # nothing to explain
