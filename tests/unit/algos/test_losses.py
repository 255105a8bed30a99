"""Policy loss, KL and entropy against values computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from tidal.algos.losses import (
    LOSS_INPUTS,
    LOSSES,
    aggregate,
    entropy_from_logits,
    get_loss,
    kl_penalty,
    loss_denominator,
    ppo_clip_loss,
)
from tidal.errors import UnknownNameError

# Two sequences, three positions. Sequence 0 (advantage +1) trains positions 0-1 with ratios
# 1.5 and 0.9; sequence 1 (advantage -1) trains positions 0-2 with ratios 0.5, 1.1, 1.0.
RATIOS = torch.tensor([[1.5, 0.9, 1.0], [0.5, 1.1, 1.0]])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
ADVANTAGES = torch.tensor([1.0, -1.0])
OLD = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -1.5, -2.5]])
NEW = OLD + torch.log(RATIOS)
# With clip range [0.8, 1.28], per-token losses -min(r * A, clip(r) * A):
#   seq 0: r=1.5 -> -min(1.5, 1.28) = -1.28 (clipped high); r=0.9 -> -0.9
#   seq 1: r=0.5 -> -min(-0.5, -0.8) = 0.8 (clipped low); r=1.1 -> 1.1; r=1.0 -> 1.0
# Sum over the 5 tokens: -2.18 + 2.9 = 0.72.
TOKEN_LOSS = 0.72 / 5  # 0.144
SEQUENCE_LOSS = (-2.18 / 2 + 2.9 / 3) / 2  # -0.0616667
TOKEN_SUM_LOSS = 0.72 / (4 * 2)  # max_tokens 4, B 2: 0.09
# approx KL per token (r - 1) - ln r: 0.0945349, 0.0053605, 0.1931472, 0.0046898, 0.0
APPROX_KL = (0.0945349 + 0.0053605 + 0.1931472 + 0.0046898 + 0.0) / 5


@pytest.mark.parametrize(
    ("aggregation", "expected"),
    [("token", TOKEN_LOSS), ("sequence", SEQUENCE_LOSS), ("token_sum", TOKEN_SUM_LOSS)],
)
def test_ppo_clip_loss_by_hand(aggregation: str, expected: float) -> None:
    loss, metrics = ppo_clip_loss(NEW, OLD, ADVANTAGES, MASK, 0.2, 0.28, aggregation, max_tokens=4)
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert metrics["clip_low_frac"] == pytest.approx(1 / 5)
    assert metrics["clip_high_frac"] == pytest.approx(1 / 5)
    assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-6)  # (1.5+0.9+0.5+1.1+1.0)/5
    assert metrics["approx_kl"] == pytest.approx(APPROX_KL, abs=1e-6)


def test_aggregation_modes_weigh_long_sequences_differently() -> None:
    """Token mean lets the 3-token sequence weigh 3/5; sequence mean weighs both 1/2."""
    per_token = torch.tensor([[1.0, 1.0, 0.0], [4.0, 4.0, 4.0]])
    assert aggregate(per_token, MASK, "token").item() == pytest.approx((2 + 12) / 5)
    assert aggregate(per_token, MASK, "sequence").item() == pytest.approx((1 + 4) / 2)
    assert aggregate(per_token, MASK, "token_sum", max_tokens=3).item() == pytest.approx(14 / 6)


def test_clip_higher_is_asymmetric() -> None:
    """A positive-advantage token at ratio 1.25 still learns with clip_high 0.28, not with 0.2;
    a negative-advantage token at ratio 0.75 is clipped by clip_low 0.2 either way."""
    old = torch.zeros(1, 2)
    mask = torch.ones(1, 2)
    for clip_high, expect_grad in ((0.28, True), (0.2, False)):
        new = torch.log(torch.tensor([[1.25, 1.0]])).requires_grad_(True)
        loss, _ = ppo_clip_loss(new, old, torch.tensor([1.0]), mask, 0.2, clip_high)
        loss.backward()
        assert (new.grad[0, 0].abs() > 0).item() == expect_grad
        # d/dlogp of -r*A/2 at r=1 is -0.5: the unclipped token always learns
        assert new.grad[0, 1].item() == pytest.approx(-0.5)
    new = torch.log(torch.tensor([[0.75, 1.0]])).requires_grad_(True)
    loss, metrics = ppo_clip_loss(new, old, torch.tensor([-1.0]), mask, 0.2, 0.28)
    loss.backward()
    assert new.grad[0, 0].item() == 0.0
    assert metrics["clip_low_frac"] == pytest.approx(0.5)


def test_masked_positions_do_not_matter() -> None:
    """Padding may hold any value, even inf or NaN, without touching loss or gradient."""
    garbage_new = NEW.clone()
    garbage_new[0, 2] = float("inf")
    garbage_old = OLD.clone()
    garbage_old[0, 2] = float("nan")
    loss, metrics = ppo_clip_loss(garbage_new, garbage_old, ADVANTAGES, MASK, 0.2, 0.28)
    assert loss.item() == pytest.approx(TOKEN_LOSS, abs=1e-6)
    assert all(math.isfinite(v) for v in metrics.values())


@pytest.mark.parametrize("aggregation", ["token", "sequence", "token_sum"])
def test_micro_batches_with_the_whole_denominator_sum_to_the_whole_loss(aggregation: str) -> None:
    whole, _ = ppo_clip_loss(NEW, OLD, ADVANTAGES, MASK, 0.2, 0.28, aggregation, max_tokens=4)
    denominator = loss_denominator(MASK, aggregation)
    parts = [
        ppo_clip_loss(NEW[i : i + 1], OLD[i : i + 1], ADVANTAGES[i : i + 1], MASK[i : i + 1], 0.2, 0.28,
                      aggregation, max_tokens=4, denominator=denominator)[0]
        for i in range(2)
    ]
    assert (parts[0] + parts[1]).item() == pytest.approx(whole.item(), abs=1e-7)


def test_token_sum_needs_max_tokens() -> None:
    with pytest.raises(ValueError, match="max_tokens"):
        ppo_clip_loss(NEW, OLD, ADVANTAGES, MASK, aggregation="token_sum")


def test_kl_estimators_by_hand() -> None:
    logp = torch.tensor([[-1.0, -2.0]])
    ref = torch.tensor([[-1.5, -1.0]])
    torch.testing.assert_close(kl_penalty(logp, ref, "k1"), torch.tensor([[0.5, -1.0]]))
    # delta = ref - logp = -0.5, 1.0: e^-0.5 + 0.5 - 1 = 0.1065307; e^1 - 1 - 1 = 0.7182818
    torch.testing.assert_close(kl_penalty(logp, ref, "k3"), torch.tensor([[0.1065307, 0.7182818]]))
    assert kl_penalty(logp, logp, "k3").abs().max().item() == 0.0
    # k2 = (logp - ref)^2 / 2: 0.5^2 / 2 = 0.125; 1^2 / 2 = 0.5
    torch.testing.assert_close(kl_penalty(logp, ref, "k2"), torch.tensor([[0.125, 0.5]]))
    with pytest.raises(UnknownNameError, match="k2"):
        kl_penalty(logp, ref, "k4")  # type: ignore[arg-type]


def test_per_token_advantages_by_hand() -> None:
    """(B, T) advantages weigh each token by its own advantage; padding (here NaN) is ignored."""
    advantages = torch.tensor([[1.0, 2.0, float("nan")], [-1.0, 0.5, -2.0]])
    # seq 0: r=1.5, A=1 -> -1.28 (clipped high); r=0.9, A=2 -> -1.8
    # seq 1: r=0.5, A=-1 -> 0.8 (clipped low); r=1.1, A=0.5 -> -0.55; r=1.0, A=-2 -> 2.0
    new = NEW.clone().requires_grad_()
    loss, metrics = ppo_clip_loss(new, OLD, advantages, MASK, 0.2, 0.28)
    assert loss.item() == pytest.approx((-1.28 - 1.8 + 0.8 - 0.55 + 2.0) / 5, abs=1e-6)
    loss.backward()
    assert torch.isfinite(new.grad).all() and new.grad[0, 2] == 0.0
    assert metrics["clip_high_frac"] == pytest.approx(1 / 5) and metrics["clip_low_frac"] == pytest.approx(1 / 5)
    with pytest.raises(ValueError, match="advantages of shape"):
        ppo_clip_loss(NEW, OLD, advantages[:, :2], MASK)


@pytest.mark.parametrize("name", sorted(LOSSES))
@pytest.mark.parametrize("aggregation", ["token", "sequence"])
def test_per_token_advantages_constant_along_t_equal_the_sequence_path(name: str, aggregation: str) -> None:
    options = {key: {"prox_logprobs": OLD + 0.1, "is_cap": 2.0}[key] for key in LOSS_INPUTS.get(name, ())}
    results = []
    for advantages in (ADVANTAGES, ADVANTAGES.unsqueeze(-1).expand(2, 3)):
        new = NEW.clone().requires_grad_()
        loss, metrics = get_loss(name)(new, OLD, advantages, MASK, 0.2, 0.28, aggregation, **options)
        (grad,) = torch.autograd.grad(loss, new)
        results.append((loss, grad, metrics))
    (loss, grad, metrics), (token_loss, token_grad, token_metrics) = results
    assert token_loss.item() == pytest.approx(loss.item(), abs=1e-7)
    torch.testing.assert_close(token_grad, grad)
    assert token_metrics == pytest.approx(metrics)


def test_entropy_from_logits_by_hand() -> None:
    uniform = torch.zeros(1, 1, 4)
    halves = torch.log(torch.tensor([0.5, 0.25, 0.25])).view(1, 1, 3) + 7.0  # shift-invariant
    assert entropy_from_logits(uniform).item() == pytest.approx(1.3862944)  # ln 4
    assert entropy_from_logits(halves).item() == pytest.approx(1.0397208, abs=1e-6)  # 1.5 ln 2
    assert entropy_from_logits(torch.randn(2, 5, 7)).shape == (2, 5)


def test_unknown_loss_lists_known_names() -> None:
    assert get_loss("ppo_clip") is ppo_clip_loss
    with pytest.raises(UnknownNameError, match="ppo_clip"):
        get_loss("dpo")
