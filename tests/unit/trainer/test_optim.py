"""The trainer's AdamW: torch's fused kernel where it applies, the same steps as the default."""

from __future__ import annotations

import torch

from tidal.trainer.optim import adamw


def test_fused_adamw_steps_like_the_default_one() -> None:
    torch.manual_seed(0)
    start = [torch.randn(7, 5), torch.randn(5)]
    fused_params = [torch.nn.Parameter(t.clone()) for t in start]
    plain_params = [torch.nn.Parameter(t.clone()) for t in start]
    fused = adamw(fused_params, lr=1e-2, betas=(0.9, 0.99), weight_decay=0.1)
    plain = torch.optim.AdamW(plain_params, lr=1e-2, betas=(0.9, 0.99), weight_decay=0.1)
    assert fused.defaults["fused"] is True and not plain.defaults.get("fused")
    for step in range(5):
        grads = [torch.randn_like(t) for t in start]
        for params, optimizer in ((fused_params, fused), (plain_params, plain)):
            for p, g in zip(params, grads):
                p.grad = g.clone()
            optimizer.step()
    for a, b in zip(fused_params, plain_params):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-5, atol=1e-6)
    # Its state loads into a default AdamW and back (checkpoints stay portable).
    other = torch.optim.AdamW([torch.nn.Parameter(t.clone()) for t in start], lr=1e-2)
    other.load_state_dict(fused.state_dict())
    adamw([torch.nn.Parameter(t.clone()) for t in start], lr=1e-2).load_state_dict(plain.state_dict())


def test_no_parameters_get_the_default_optimizer_error() -> None:
    import pytest

    with pytest.raises(ValueError, match="empty parameter list"):
        adamw([], lr=1e-3)
