"""The off-policy losses of the async loop (decoupled PPO, truncated-IS policy gradient), by hand
and through the trainer."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from tidal.algos.losses import (
    LOSS_INPUTS,
    LOSSES,
    decoupled_ppo_loss,
    ppo_clip_loss,
    tis_pg_loss,
)
from tidal.config.schema import AlgorithmConfig, TrainerConfig
from tidal.trainer.trainer import Trainer

from .tiny import build_model, random_batch

MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
ADVANTAGES = torch.tensor([1.0, -1.0])
OLD = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -1.5, -2.5]])  # behaviour (sampler) logprobs
RATIOS = torch.tensor([[1.5, 0.9, 1.0], [0.5, 1.1, 1.0]])  # pi_theta / pi_prox
WEIGHTS = torch.tensor([[3.0, 0.5, 1.0], [1.0, 2.5, 1.2]])  # pi_prox / pi_behaviour, before truncation at 2


def test_decoupled_ppo_with_fresh_samples_is_ppo_clip() -> None:
    new = (OLD + torch.log(RATIOS)).requires_grad_()
    loss, _ = decoupled_ppo_loss(new, OLD, ADVANTAGES, MASK, prox_logprobs=OLD.clone())
    (grad,) = torch.autograd.grad(loss, new)
    new_too = (OLD + torch.log(RATIOS)).requires_grad_()
    reference, _ = ppo_clip_loss(new_too, OLD, ADVANTAGES, MASK)
    (reference_grad,) = torch.autograd.grad(reference, new_too)
    assert loss.item() == pytest.approx(reference.item())
    torch.testing.assert_close(grad, reference_grad)


def test_decoupled_ppo_by_hand() -> None:
    prox = OLD + torch.log(WEIGHTS)
    loss, metrics = decoupled_ppo_loss(prox + torch.log(RATIOS), OLD, ADVANTAGES, MASK, prox_logprobs=prox, is_cap=2.0)
    # Clipped surrogate around prox (range [0.8, 1.28]): -1.28, -0.9 | 0.8, 1.1, 1.0; weights
    # truncated at 2: 2, 0.5 | 1, 2, 1.2. Token mean over the 5 masked tokens.
    expected = (-1.28 * 2 - 0.9 * 0.5 + 0.8 * 1 + 1.1 * 2 + 1.0 * 1.2) / 5
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert metrics["is_truncated_frac"] == pytest.approx(2 / 5)
    assert metrics["is_weight_mean"] == pytest.approx((2 + 0.5 + 1 + 2 + 1.2) / 5)
    assert metrics["clip_high_frac"] == pytest.approx(1 / 5)


def test_tis_pg_gradient_is_the_truncated_weight_times_the_advantage() -> None:
    new = (OLD + torch.log(WEIGHTS)).requires_grad_()  # pi_theta / pi_behaviour = WEIGHTS
    loss, metrics = tis_pg_loss(new, OLD, ADVANTAGES, MASK, is_cap=2.0)
    (grad,) = torch.autograd.grad(loss, new)
    truncated = WEIGHTS.clamp(max=2.0)
    expected = -truncated * ADVANTAGES.unsqueeze(-1) * MASK / 5  # d loss / d log pi_theta, token mean
    torch.testing.assert_close(grad, expected)
    assert metrics["is_truncated_frac"] == pytest.approx(2 / 5)


def test_is_cap_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="is_cap"):
        tis_pg_loss(OLD, OLD, ADVANTAGES, MASK, is_cap=0.5)


def test_every_loss_declares_its_extra_inputs() -> None:
    assert set(LOSS_INPUTS) <= set(LOSSES)
    assert LOSS_INPUTS["decoupled_ppo"] == ("prox_logprobs", "is_cap")


def _update(loss: str, noise: float) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    model = build_model(seed=3, dtype=torch.float64)
    batch = random_batch(model, batch=6, seed=4, noise=noise)
    trainer = Trainer(
        copy.deepcopy(model), TrainerConfig(lr=1e-3, micro_batch_size=4, precision="fp32"),
        AlgorithmConfig(loss=loss, is_cap=1.5), "cpu", total_steps=5,
    )
    metrics = trainer.rl_step(batch)
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}, metrics


def test_trainer_decoupled_ppo_matches_ppo_clip_on_fresh_samples_and_reweights_stale_ones() -> None:
    fresh, fresh_metrics = _update("decoupled_ppo", noise=0.0)
    reference, _ = _update("ppo_clip", noise=0.0)
    for name in reference:
        torch.testing.assert_close(fresh[name], reference[name], atol=1e-10, rtol=1e-9)
    assert fresh_metrics["is_weight_mean"] == pytest.approx(1.0)

    stale, stale_metrics = _update("decoupled_ppo", noise=0.5)
    assert 0 < stale_metrics["is_truncated_frac"] < 1 and math.isfinite(stale_metrics["loss"])
    assert any(not torch.equal(stale[name], fresh[name]) for name in fresh)
    _, tis_metrics = _update("tis_pg", noise=0.5)
    assert tis_metrics["skipped"] == 0 and "is_weight_mean" in tis_metrics
