"""The KL coefficient controller and the KL taken from the reward, by hand."""

from __future__ import annotations

import math

import pytest
import torch

from tidal.algos.kl import KLController, kl_adjusted_advantages


def test_adaptive_coefficient_moves_toward_the_target_by_hand() -> None:
    controller = KLController(0.1, target=0.05, horizon=1000)
    controller.update(0.1, num_sequences=100)  # KL twice the target: error clipped to +0.2
    assert controller.value == pytest.approx(0.1 * (1 + 0.2 * 100 / 1000))  # 0.102, up
    controller.update(0.055, num_sequences=100)  # error 0.1
    assert controller.value == pytest.approx(0.102 * 1.01)
    before = controller.value
    controller.update(0.0, num_sequences=100)  # below the target: error clipped to -0.2, down
    assert controller.value == pytest.approx(before * 0.98)
    controller.update(math.nan, num_sequences=100)  # a skipped step measures nothing
    assert controller.value == pytest.approx(before * 0.98)


def test_fixed_coefficient_and_state() -> None:
    fixed = KLController(0.3)
    fixed.update(10.0, 64)
    assert fixed.value == 0.3 and not fixed.adaptive
    moved = KLController(0.1, target=0.01, horizon=10)
    moved.update(1.0, 10)
    restored = KLController(0.1, target=0.01, horizon=10)
    restored.load_state_dict(moved.state_dict())
    assert restored.value == moved.value == pytest.approx(0.12)
    with pytest.raises(ValueError, match="starting coefficient"):
        KLController(0.0, target=0.1)


def test_kl_adjusted_advantages_by_hand() -> None:
    advantages = torch.tensor([1.0, -0.5])
    kl = torch.tensor([[9.0, 0.2, -0.4], [0.1, 0.3, 9.0]])  # 9.0 off the mask
    mask = torch.tensor([[0.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    out = kl_adjusted_advantages(advantages, kl, mask, coef=0.5)
    torch.testing.assert_close(out, torch.tensor([[0.0, 0.9, 1.2], [-0.55, -0.65, 0.0]]))
